//! What CUDA graphs would save a step whose kernels are all issued eagerly: the line `predict`
//! and `search` print (and `predict --json`'s `cuda_graphs_advice`) where the host holds a
//! Megatron-LM or NeMo step up.

use stepcast::hardware::Cluster;
use stepcast::predict::cost::CostModel;
use stepcast::predict::{predict, PredictOptions};
use stepcast::workload::{Arch, CudaGraphScope as S, Layout, Rules};

/// What capturing the layers would do to a step.
#[derive(Debug, serde::Serialize)]
pub struct Advice {
    /// The scopes costed: the whole layer, or for dropless experts what a graph can replay.
    pub scopes: Vec<&'static str>,
    /// The eager step, s.
    #[serde(skip)]
    pub eager_s: f64,
    /// The step with them, s.
    pub step_time_s: f64,
    /// Time saved, s.
    pub saved_s: f64,
}

impl Advice {
    /// "the host issues {what}'s kernels one by one: capturing … would take it from … to …".
    pub fn describe(&self, what: &str) -> String {
        format!(
            "the host issues {what}'s kernels one by one: capturing {} (--cuda-graphs {}) would \
             take it from {} to {} s (−{:.1} %)",
            if self.scopes == ["layer"] {
                "whole layers".to_string()
            } else {
                self.scopes.join(", ")
            },
            self.scopes.join(","),
            seconds(self.eager_s),
            seconds(self.step_time_s),
            100.0 * self.saved_s / self.eager_s
        )
    }
}

/// Seconds to at least three decimals and three significant digits (0.440, 0.0724).
fn seconds(s: f64) -> String {
    let digits_before = if s.abs() > 0.0 && s.is_finite() {
        s.abs().log10().floor().clamp(-10.0, 10.0) as i64
    } else {
        0
    };
    let decimals = (2 - digits_before).clamp(3, 6) as usize;
    format!("{s:.decimals$}")
}

/// Smallest saving worth a line: 2 % of the step.
const SHARE: f64 = 0.02;

/// Where a Megatron-Core step issued eagerly (`eager_s`) would be at least 2 % shorter with its
/// layers in CUDA graphs: the widest capture the model allows (whole layers; for dropless
/// experts the attention, router and preprocessing, and any dense layers' MLP), costed the same
/// way. None under the paper's rules, for a framework other than Megatron-LM or NeMo
/// (torchtitan, Composer: no graphs to turn on), or when the host does not hold the step up.
pub fn advice(
    arch: &Arch,
    layout: &Layout,
    cluster: &Cluster,
    cost: &CostModel,
    framework: Option<&str>,
    eager_s: f64,
) -> anyhow::Result<Option<Advice>> {
    // Megatron-Core's switch: no other framework stepcast knows turns graphs on for training
    let megatron_core = matches!(framework, None | Some("megatron" | "nemo"));
    if !layout.cuda_graphs.is_empty() || layout.rules != Rules::Megatron || !megatron_core {
        return Ok(None);
    }
    let scopes = match &arch.moe {
        Some(m) if !matches!(layout.moe_capacity, Some((_, true))) => {
            let mut s = vec![S::Attn];
            if arch.dense_layers() > 0 {
                s.push(S::Mlp);
            }
            s.extend([S::MoeRouter, S::MoePreprocess]);
            s
        }
        _ => vec![S::Layer],
    };
    let mut graphed = layout.clone();
    graphed.cuda_graphs = scopes.clone();
    let with = predict(arch, &graphed, cluster, cost, PredictOptions::default())?;
    let step_with = with.metrics.step_time_s;
    let saved = eager_s - step_with;
    Ok((saved >= SHARE * eager_s).then(|| Advice {
        scopes: scopes.iter().map(|s| s.name()).collect(),
        eager_s,
        step_time_s: step_with,
        saved_s: saved,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::test_support::{dgx_h100, predicted, spec};
    use stepcast::workload::Schedule;

    #[test]
    fn advice_names_the_scopes_and_the_flag() {
        let layer = Advice {
            scopes: vec!["layer"],
            eager_s: 0.2,
            step_time_s: 0.15,
            saved_s: 0.05,
        };
        assert_eq!(
            layer.describe("this step"),
            "the host issues this step's kernels one by one: capturing whole layers \
             (--cuda-graphs layer) would take it from 0.200 to 0.150 s (−25.0 %)"
        );
        let parts = Advice {
            scopes: vec!["attn", "moe_router"],
            eager_s: 1.0,
            step_time_s: 0.9,
            saved_s: 0.1,
        };
        assert!(parts
            .describe("the best layout")
            .contains("capturing attn, moe_router (--cuda-graphs attn,moe_router) would take it"));
    }

    /// Llama 2 7B on tp 8 with sequences of 256 is host-bound (its kernels are shorter than
    /// their issue): graphs of whole layers are worth a line, with the graphed prediction's own
    /// step. Nothing is advised under the paper's rules, for torchtitan, where graphs are on
    /// already, or for a step the host does not hold up.
    #[test]
    fn graphs_are_advised_where_the_host_holds_a_megatron_step_up() {
        let cluster = dgx_h100();
        let cost = CostModel::new(&cluster, None);
        let mut short = spec(8, 1, 1, Schedule::OneFOneB);
        short.seq_len = Some(256);
        let (arch, layout, eager) = predicted("llama2-7b", short.clone());
        let eager_s = eager.metrics.step_time_s;
        let advised = |layout: &Layout, framework: Option<&str>| {
            advice(&arch, layout, &cluster, &cost, framework, eager_s).unwrap()
        };
        let a = advised(&layout, None).expect("a host-bound step");
        assert_eq!(a.scopes, ["layer"]);
        let mut graphed = short.clone();
        graphed.cuda_graphs = Some(vec![S::Layer]);
        let with = predicted("llama2-7b", graphed).2.metrics.step_time_s;
        assert_eq!((a.eager_s, a.step_time_s), (eager_s, with));
        assert!((a.saved_s - (eager_s - with)).abs() < 1e-12 && a.saved_s > SHARE * eager_s);
        assert!(advised(&layout, Some("nemo")).is_some());
        assert!(advised(&layout, Some("torchtitan")).is_none());
        let mut paper = layout.clone();
        paper.rules = Rules::Paper;
        assert!(advised(&paper, None).is_none());
        let mut on = layout.clone();
        on.cuda_graphs = vec![S::Attn];
        assert!(advised(&on, None).is_none());
        // long sequences: the device is the bottleneck, graphs save under 2 %
        let (arch, layout, eager) = predicted("llama2-7b", spec(8, 1, 1, Schedule::OneFOneB));
        let long = advice(
            &arch,
            &layout,
            &cluster,
            &cost,
            None,
            eager.metrics.step_time_s,
        );
        assert!(long.unwrap().is_none());
    }

    #[test]
    fn seconds_keep_three_significant_digits() {
        assert_eq!(super::seconds(0.44), "0.440");
        assert_eq!(super::seconds(0.07243), "0.0724");
        assert_eq!(super::seconds(22.9), "22.900");
        assert_eq!(super::seconds(1e-9), "0.000000");
        assert_eq!(super::seconds(0.0), "0.000");
    }
}

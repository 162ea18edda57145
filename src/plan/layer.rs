//! The repeated blocks of a model on one tensor-parallel rank, per micro-batch: a transformer
//! layer, the embedding and the head.
//!
//! Per layer, with b = micro-batch, s = the rank's share of the sequence (seq-len / cp),
//! d = hidden, h / g = query / key-value heads on the rank, hd = head size, f = MLP size on
//! the rank, t = tp: norm, QKV GEMM, RoPE,
//! attention (flash, or scores GEMM + scale-mask-softmax + context GEMM, the softmax as
//! PyTorch's kernels where Megatron's fused one refuses the shape), output GEMM, TP
//! all-reduce (or all-gather + reduce-scatter with sequence parallelism), residual add, norm,
//! MLP up GEMM, GELU or SwiGLU, MLP down GEMM, TP communication, residual add (Gemma 2 norms
//! the attention's and the MLP's outputs before each residual add). The backward
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
    let local = k(
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
    at_shares(vec![local], global, share)
}

/// The `local` calls counted at `share` of the layers and `global` at the rest (left out
/// where every layer is local).
fn at_shares(mut local: Vec<Call>, mut global: Call, share: f64) -> Vec<Call> {
    for call in &mut local {
        call.count = share;
    }
    if share < 1.0 {
        global.count = 1.0 - share;
        local.push(global);
    }
    local
}

/// A layer's flash attention when `share` of the layers attend within chunks of `c` tokens
/// (Llama 4's chunked attention) and the others globally: each chunk is a causal attention of
/// its own, so the ⌊s/c⌋ whole chunks of a sequence run as that many sequences of c tokens and
/// a shorter last one as one more call — the kernel's own shapes, as it runs them with a
/// chunked mask. Alternating layers are costed at their mean, as sliding windows are.
fn chunked_attention(
    global: Call,
    c: u64,
    share: f64,
    d: &Dims,
    mut k: impl FnMut(&'static str, OpKind, Option<Role>, Shape) -> Call,
) -> Vec<Call> {
    let mut shape = |label, batch, seq| {
        k(
            label,
            OpKind::FlashAttention,
            None,
            Shape::Attention(AttentionShape {
                batch,
                seq_q: seq,
                seq_kv: seq,
                heads: d.heads,
                kv_heads: d.kv_heads,
                head_dim: d.hd,
                causal: d.causal,
            }),
        )
    };
    let mut calls = vec![shape("chunked attention", d.b.saturating_mul(d.s / c), c)];
    if !d.s.is_multiple_of(c) {
        calls.push(shape("chunked attention (last chunk)", d.b, d.s % c));
    }
    at_shares(calls, global, share)
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
            let share = arch.local_attention_share();
            match arch.sliding_window.filter(|&w| w < d.s) {
                None => vec![global],
                Some(c) if arch.chunked_attention => chunked_attention(global, c, share, d, k),
                Some(w) => sliding_attention(global, w, share, d, k),
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
            if arch.attention_softcap {
                for (op, shape) in softcap(phase, d.scores()) {
                    calls.push(typed("scores softcap", op, d.act, None, shape));
                }
            }
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

/// Soft-capping, cap · tanh(x / cap), over the pointwise `shape`, as eager PyTorch runs it
/// (NeMo's Gemma 2 modules and Transformers' write it so): forward a divide, the tanh and a
/// multiply, one pass each; backward the multiply's and the divide's gradients, one pass each,
/// and the tanh's, which reads its saved output beside the gradient (3 tensors, as a residual
/// add moves).
fn softcap(phase: Phase, shape: Shape) -> [(OpKind, Shape); 3] {
    let tanh = match phase {
        Phase::Bwd => OpKind::ResidualAdd,
        _ => OpKind::Elementwise,
    };
    [
        (OpKind::Elementwise, shape),
        (tanh, shape),
        (OpKind::Elementwise, shape),
    ]
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
    // (OLMo 2 norms only the outputs: its attention and MLP read the residual stream)
    if arch.pre_norms {
        p.compute("input norm", norm_op, d.act, None, d.tok_sp(d.d));
    }
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
    if arch.post_norms {
        p.compute("attention output norm", norm_op, d.act, None, d.tok_sp(d.d));
    }
    p.compute(
        "residual add",
        OpKind::ResidualAdd,
        d.act,
        None,
        d.tok_sp(d.d),
    );
    let attention_end = p.calls.len();
    if arch.pre_norms {
        p.compute("post-attention norm", norm_op, d.act, None, d.tok_sp(d.d));
    }
    let moe_parts = match &arch.moe {
        Some(moe) if !dense => Some(experts(&mut p, arch, moe, d, act_op)),
        _ => {
            mlp(&mut p, d, d.ffn, up_width, act_op);
            None
        }
    };
    p.calls.extend(comm);
    if arch.post_norms {
        p.compute("mlp output norm", norm_op, d.act, None, d.tok_sp(d.d));
    }
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
    let small = tensors.saturating_sub(arch.layer_projections(dense));
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

/// The embedding lookup (and, with tp > 1, the all-reduce of its vocabulary-parallel output;
/// then Gemma's scaling by √hidden).
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
    let mut bwd = vec![b.call(
        "embedding",
        OpKind::Embedding,
        Phase::Bwd,
        d.act,
        None,
        shape,
        Class::Compute,
    )];
    // Gemma's √hidden normalizer: a pass over the embeddings, and its gradient's
    if arch.scaled_embeddings {
        for (phase, calls) in [(Phase::Fwd, &mut fwd), (Phase::Bwd, &mut bwd)] {
            let scale = b.call(
                "embedding scale",
                OpKind::Elementwise,
                phase,
                d.act,
                None,
                d.tok_sp(d.d),
                Class::Compute,
            );
            calls.push(scale);
        }
    }
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

/// Final norm, LM head (its logits soft-capped where the model caps them) and
/// vocabulary-parallel cross-entropy. The LM head is a
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
        // Megatron keeps the output layer out of the fp8 recipe: 16-bit under fp8
        calls.push(b.call(
            "lm head",
            OpKind::Gemm,
            phase,
            d.act,
            Some(Role::LmHead),
            gemm(d.tokens, d.vocab_rank, d.d, 1),
            Class::Compute,
        ));
        if arch.final_softcap {
            for (op, shape) in softcap(phase, d.tok(d.vocab_rank)) {
                calls.push(b.call(
                    "logits softcap",
                    op,
                    phase,
                    d.act,
                    None,
                    shape,
                    Class::Compute,
                ));
            }
        }
        calls.push(b.call(
            "cross-entropy",
            OpKind::CrossEntropy,
            phase,
            d.act,
            d.loss_role,
            d.tok(d.vocab_rank),
            Class::Compute,
        ));
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
            every: 1,
            offset: 0,
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
        // 8 groups do not split evenly over 3 nodes: the limit is not modelled, 8 random copies
        let uneven = 2.0 * (1.0 - (2.0f64 / 3.0).powi(8));
        assert!((remote_nodes(&moe(8, 4), 3) - uneven).abs() < 1e-12);
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

/// Whole layer passes written out by hand: every call's label, operator, phase, type and
/// shape, and what makes it special (count, run beside a kernel, overlapped, host wait), so
/// that a changed size, order, type or flag anywhere in a pass fails here.
#[cfg(test)]
mod by_hand_tests {
    use super::*;
    use crate::plan::by_hand::{lines, plan};
    use crate::plan::Plan;
    use crate::workload::ParallelSpec;

    /// Llama 3 8B on tp 2 with sequence parallelism, two 8,192-token sequences a micro-batch:
    /// tokens 16,384, 16 query and 4 key-value heads of 128 on the rank, MLP 7,168 a rank,
    /// norms and residuals on the 4,096-row shard, each TP collective 16,384 × 4,096 × 2 bytes.
    /// The backward reduce-scatters the input gradient and gathers the input again beside the
    /// GEMMs and accumulates its two norms' gradients in fp32.
    #[test]
    fn a_llama_layer_on_two_sequence_parallel_ranks() {
        let a = Arch::resolve("llama3-8b").unwrap();
        let p = plan(
            &a,
            ParallelSpec {
                tp: Some(2),
                dp: Some(4),
                micro_batch: Some(2),
                global_batch: Some(8),
                sequence_parallel: Some(true),
                ..Default::default()
            },
        );
        let tp = "134217728 B 1x2";
        let fwd = [
            "input norm: rmsnorm fwd bf16 2x4096x4096".to_string(),
            "qkv: gemm fwd bf16 (qkv) 16384x3072x4096".into(),
            "rope q: rope fwd bf16 2x8192x2048".into(),
            "rope k: rope fwd bf16 2x8192x512".into(),
            "attention: flash_attention fwd bf16 b2 8192x8192 h16/4 d128 causal".into(),
            "attention out: gemm fwd bf16 (attn_out) 16384x4096x2048".into(),
            format!("tp all-gather: all_gather none bf16 {tp}"),
            format!("tp reduce-scatter: reduce_scatter none bf16 {tp}"),
            "residual add: residual_add fwd bf16 2x4096x4096".into(),
            "post-attention norm: rmsnorm fwd bf16 2x4096x4096".into(),
            "mlp up: gemm fwd bf16 (mlp_up) 16384x14336x4096".into(),
            "activation: swiglu fwd bf16 2x8192x7168".into(),
            "mlp down: gemm fwd bf16 (mlp_down) 16384x4096x7168".into(),
            format!("tp all-gather: all_gather none bf16 {tp}"),
            format!("tp reduce-scatter: reduce_scatter none bf16 {tp}"),
            "residual add: residual_add fwd bf16 2x4096x4096".into(),
        ];
        assert_eq!(lines(&p, &p.layer.fwd), fwd);
        let comm = [
            format!("tp all-gather: all_gather none bf16 {tp}"),
            format!("tp reduce-scatter: reduce_scatter none bf16 {tp} beside"),
            format!("tp input re-gather: all_gather none bf16 {tp} beside"),
        ];
        let mut bwd: Vec<String> = Vec::new();
        for l in &fwd {
            if l.starts_with("tp reduce-scatter") {
                continue;
            }
            if l.starts_with("tp all-gather") {
                bwd.extend(comm.iter().cloned());
            } else {
                bwd.push(l.replace(" fwd ", " bwd "));
            }
        }
        bwd.push("gradient accumulation: residual_add bwd fp32 1x1x4096 x2".into());
        assert_eq!(lines(&p, &p.layer.bwd), bwd);
        assert!(p.layer.recompute.is_empty());
        // six tensors: two norms, QKV, the output projection, the MLP's up and down
        assert_eq!(p.layer.tensors, 6);
    }
    /// GPT-3 15B's layer with unfused attention (`AttentionImpl::Unfused`) on tp 4 without
    /// sequence parallelism, one 2,048-token sequence: 12 heads of 128 a rank, QKV 4,608
    /// wide, MLP 3,072 a rank, each all-reduce 2,048 × 6,144 × 2 bytes. Megatron's fused
    /// softmax takes 12 rows of 2,048 columns (4 rows a block); GPT-3 drops out the
    /// probabilities; the context goes back to [s, b, h·hd]; the backward reduces its four
    /// biases' gradients and accumulates eight small gradients (two norms' weights and biases,
    /// four biases) in fp32. Under the paper's rules: its tool's list, nothing more.
    #[test]
    fn a_gpt3_layer_with_unfused_attention_on_four_ranks() {
        let mut a = Arch::resolve("gpt3-15b").unwrap();
        a.attention = AttentionImpl::Unfused;
        let spec = |tp: u64, rules: Rules| ParallelSpec {
            tp: Some(tp),
            dp: Some(8 / tp),
            micro_batch: Some(1),
            global_batch: Some(8 / tp),
            seq_len: Some(2048),
            dtype: Some(Dtype::Bf16),
            rules: Some(rules),
            ..Default::default()
        };
        let ar = "tp all-reduce: all_reduce none bf16 25165824 B 1x4";
        let core = [
            "attention scores: gemm fwd bf16 (attn_scores) 2048x2048x128 batch 12",
            "scale-mask-softmax: scale_mask_softmax fwd bf16 b1 2048x2048 h12/12 d1 causal",
            "attention dropout: elementwise fwd bf16 12x2048x2048",
            "attention context: gemm fwd bf16 (attn_context) 2048x128x2048 batch 12",
            "context transpose: elementwise fwd bf16 1x2048x1536",
        ];
        let fwd = |core: &[&str], ar: &str| -> Vec<String> {
            let mut v = vec![
                "input norm: layernorm fwd bf16 1x2048x6144".to_string(),
                "qkv: gemm fwd bf16 (qkv) 2048x4608x6144".into(),
            ];
            v.extend(core.iter().map(|l| l.to_string()));
            v.extend([
                "attention out: gemm fwd bf16 (attn_out) 2048x6144x1536".to_string(),
                ar.into(),
                "residual add: residual_add fwd bf16 1x2048x6144".into(),
                "post-attention norm: layernorm fwd bf16 1x2048x6144".into(),
                "mlp up: gemm fwd bf16 (mlp_up) 2048x3072x6144".into(),
                "activation: gelu fwd bf16 1x2048x3072".into(),
                "mlp down: gemm fwd bf16 (mlp_down) 2048x6144x3072".into(),
                ar.into(),
                "residual add: residual_add fwd bf16 1x2048x6144".into(),
            ]);
            v
        };
        let bwd = |fwd: &[String]| -> Vec<String> {
            fwd.iter()
                .map(|l| match l.strip_prefix("tp all-reduce") {
                    Some(rest) => format!("tp all-reduce{rest} beside"),
                    None => l.replace(" fwd ", " bwd "),
                })
                .collect()
        };
        let megatron = plan(&a, spec(4, Rules::Megatron));
        assert_eq!(lines(&megatron, &megatron.layer.fwd), fwd(&core, ar));
        let mut expected = bwd(&fwd(&core, ar));
        for width in [4608, 6144, 3072, 6144] {
            expected.push(format!(
                "bias gradient: elementwise bwd bf16 1x2048x{width}"
            ));
        }
        expected.push("gradient accumulation: residual_add bwd fp32 1x1x6144 x8".into());
        assert_eq!(lines(&megatron, &megatron.layer.bwd), expected);
        assert_eq!(megatron.layer.tensors, 12);
        // the GPT-2 vocabulary padded to 512 (50,688), a quarter a rank, and the learned
        // positions (2,048 × 6,144, whole on every rank); the head's norm has a bias
        let table = 50688 / 4 * 6144;
        let e = &megatron.embedding;
        assert_eq!((e.params, e.tensors), (table + 2048 * 6144, 2));
        let h = &megatron.head;
        assert_eq!((h.params, h.tensors), (table + 2 * 6144, 3));

        let paper = plan(&a, spec(4, Rules::Paper));
        let paper_core = [core[0], core[1], core[3]];
        assert_eq!(lines(&paper, &paper.layer.fwd), fwd(&paper_core, ar));
        let paper_bwd = bwd(&fwd(&paper_core, ar))
            .into_iter()
            .map(|l| l.trim_end_matches(" beside").to_string());
        assert_eq!(
            lines(&paper, &paper.layer.bwd),
            paper_bwd.collect::<Vec<_>>()
        );

        // on tp 8, 6 rows of scores: no fused kernel takes them, PyTorch's five run
        let eight = plan(&a, spec(8, Rules::Megatron));
        let scores: Vec<String> = lines(&eight, &eight.layer.fwd)[3..8].to_vec();
        assert_eq!(
            scores,
            [
                "scores to fp32: elementwise fwd bf16 6x2048x2048",
                "scores scale: elementwise fwd fp32 6x2048x2048",
                "scores mask: fill_mask fwd fp32 b1 2048x2048 h6/6 d1",
                "softmax: softmax fwd fp32 b1 2048x2048 h6/6 d1",
                "probabilities to 16 bits: elementwise fwd bf16 6x2048x2048",
            ]
        );
    }

    /// The layout of the Gemma 2 and OLMo 2 tests: tp 2 with sequence parallelism, dp 4, one
    /// sequence a micro-batch and a step.
    fn one_sequence_on_two_sequence_parallel_ranks() -> ParallelSpec {
        ParallelSpec {
            tp: Some(2),
            dp: Some(4),
            micro_batch: Some(1),
            global_batch: Some(4),
            sequence_parallel: Some(true),
            ..Default::default()
        }
    }

    /// OLMo 2's block on the same layer: Gemma 2's output norms without the two before the
    /// attention and the MLP (their calls gone each way and from the recomputation, two norms'
    /// gradients fewer to accumulate), its query and key norms over the rank's 2,048 query and
    /// 512 key channels costed as per-head norms are, their weights one a channel of the whole
    /// projection: 32·128 + 8·128 instead of 2·128.
    #[test]
    fn olmo_2_norms_only_the_outputs() {
        let base = Arch::resolve("llama3-8b").unwrap();
        let spec = || ParallelSpec {
            recompute: Some(crate::workload::Recompute::Selective),
            recompute_modules: Some(vec![crate::workload::RecomputeModule::Layernorm]),
            ..one_sequence_on_two_sequence_parallel_ranks()
        };
        let post = Arch {
            post_norms: true,
            qk_norm: true,
            ..base.clone()
        };
        let olmo = Arch {
            pre_norms: false,
            qk_norm_span: crate::workload::QkNormSpan::Projection,
            ..post.clone()
        };
        let (p, q) = (plan(&post, spec()), plan(&olmo, spec()));
        let pre = |l: &String| l.starts_with("input norm") || l.starts_with("post-attention norm");
        for (with, without) in [
            (&p.layer.fwd, &q.layer.fwd),
            (&p.layer.bwd, &q.layer.bwd),
            (&p.layer.recompute, &q.layer.recompute),
        ] {
            let expected: Vec<String> = lines(&p, with)
                .into_iter()
                .filter(|l| !pre(l))
                .map(|l| l.replace("fp32 1x1x4096 x6", "fp32 1x1x4096 x4"))
                .collect();
            assert_eq!(lines(&q, without), expected);
        }
        assert!(lines(&p, &p.layer.recompute).iter().any(pre));
        assert!(
            lines(&q, &q.layer.fwd).contains(&"q norm: rmsnorm fwd bf16 1x8192x2048".to_string())
        );
        assert_eq!(
            (q.layer.tensors, q.layer.params),
            (
                p.layer.tensors - 2,
                p.layer.params - 2 * 4096 - 2 * 128 + 40 * 128
            )
        );
    }

    /// Gemma 2's parts on a Llama 3 8B layer (tp 2, sequence parallel, one 8,192-token
    /// sequence): a norm on the attention's and the MLP's outputs, after the reduce-scatter
    /// on the 4,096-row shard and before the residual add, each way (four norms' gradients
    /// accumulated); the logits soft-capped by three passes over the rank's 8,192 × 64,128
    /// logits between the LM head and the loss (backward: the tanh's reads its output too);
    /// the embeddings scaled by √hidden in one pass each way; an unfused attention's
    /// 16 × 8,192² scores a rank soft-capped likewise after the scores GEMM.
    #[test]
    fn gemma_2_norms_its_outputs_and_soft_caps_scores_and_logits() {
        let base = Arch::resolve("llama3-8b").unwrap();
        let spec = one_sequence_on_two_sequence_parallel_ranks;
        let gemma = Arch {
            post_norms: true,
            final_softcap: true,
            scaled_embeddings: true,
            ..base.clone()
        };
        let (p, q) = (plan(&base, spec()), plan(&gemma, spec()));
        for (pass, phase) in [(&p.layer.fwd, "fwd"), (&p.layer.bwd, "bwd")] {
            let mut expected = Vec::new();
            let mut scattered = 0;
            for l in lines(&p, pass) {
                let residual = l.starts_with("residual add");
                if residual {
                    let which = ["attention output norm", "mlp output norm"][scattered];
                    expected.push(format!("{which}: rmsnorm {phase} bf16 1x4096x4096"));
                    scattered += 1;
                }
                expected.push(l.replace(" x2", " x4"));
            }
            let pass = if phase == "fwd" {
                &q.layer.fwd
            } else {
                &q.layer.bwd
            };
            assert_eq!(lines(&q, pass), expected);
        }
        assert_eq!(
            (q.layer.tensors, q.layer.params),
            (8, p.layer.params + 2 * 4096)
        );
        let logits = "1x8192x64128";
        let head = |pass: &[Call], kinds: [&str; 3], phase: &str| {
            let mut l = lines(&p, pass);
            let loss = l.len() - 1;
            for kind in kinds.iter().rev() {
                l.insert(
                    loss,
                    format!("logits softcap: {kind} {phase} bf16 {logits}"),
                );
            }
            l
        };
        let pass = ["elementwise"; 3];
        let tanh = ["elementwise", "residual_add", "elementwise"];
        assert_eq!(lines(&q, &q.head.fwd), head(&p.head.fwd, pass, "fwd"));
        assert_eq!(lines(&q, &q.head.bwd), head(&p.head.bwd, tanh, "bwd"));
        // the embeddings scaled by √hidden after the all-reduce, on the 4,096-row shard
        for (plain, scaled, phase) in [
            (&p.embedding.fwd, &q.embedding.fwd, "fwd"),
            (&p.embedding.bwd, &q.embedding.bwd, "bwd"),
        ] {
            let mut expected = lines(&p, plain);
            expected.push(format!(
                "embedding scale: elementwise {phase} bf16 1x4096x4096"
            ));
            assert_eq!(lines(&q, scaled), expected);
        }

        let unfused = |softcap| Arch {
            attention: AttentionImpl::Unfused,
            attention_softcap: softcap,
            ..base.clone()
        };
        let (u, capped) = (plan(&unfused(false), spec()), plan(&unfused(true), spec()));
        for (phase, kinds) in [("fwd", pass), ("bwd", tanh)] {
            let (plain, with) = if phase == "fwd" {
                (core(&u, &u.layer.fwd), core(&capped, &capped.layer.fwd))
            } else {
                (core(&u, &u.layer.bwd), core(&capped, &capped.layer.bwd))
            };
            let mut expected = plain.clone();
            for kind in kinds.iter().rev() {
                expected.insert(
                    1,
                    format!("scores softcap: {kind} {phase} bf16 16x8192x8192"),
                );
            }
            assert!(plain[0].starts_with("attention scores"), "{plain:?}");
            assert_eq!(with, expected);
        }
    }

    /// The expert half of a Mixtral 8×7B layer over 8 expert-parallel ranks, one 4,096-token
    /// sequence, the busiest rank 1.5× the mean: 8,192 routed copies, 12,288 of them on the
    /// busiest expert (4,096 · 2 · 8 / 8 · 1.5), each all-to-all 12,288 tokens of 8 KiB and
    /// their fp32 probabilities, the token counts (8 experts × 8 ranks, int64) gathered first
    /// and read back before the dispatch. A layer at load 2 (a routing file's) is the same with
    /// 16,384. On 4 ranks two experts a rank: the received tokens sorted by expert and back.
    #[test]
    fn a_mixtral_layer_dispatches_its_busiest_experts_tokens() {
        let a = crate::workload::presets::mixtral_8x7b();
        let c = crate::hardware::dgx_h100_without_models();
        let spec = |ep: u64| ParallelSpec {
            ep: Some(ep),
            dp: Some(8),
            micro_batch: Some(1),
            global_batch: Some(8),
            moe_imbalance: Some(1.5),
            ..Default::default()
        };
        let mut layout = Layout::new(&spec(8), &a, &c).unwrap();
        layout.layer_loads = vec![1.5, 2.0];
        let p = Plan::new(&a, &layout, &c);
        let experts = |l: &[String]| -> Vec<String> {
            let from = l.iter().position(|l| l.starts_with("router:")).unwrap();
            l[from..l.len() - 1].to_vec()
        };
        let a2a = |tokens: u64| {
            let bytes = tokens * 4096 * 2;
            [
                format!("moe all-to-all (dispatch): all_to_all none bf16 {bytes} B 1x8"),
                format!(
                    "moe all-to-all (probabilities): all_to_all none bf16 {} B 1x8",
                    tokens * 4
                ),
            ]
        };
        let expected = |tokens: u64| -> Vec<String> {
            let [dispatch, probabilities] = a2a(tokens);
            vec![
                "router: gemm fwd bf16 4096x8x4096".to_string(),
                "router top-k: softmax fwd bf16 1x4096x8".into(),
                "moe token counts all-gather: all_gather none bf16 512 B 1x8".into(),
                "permute: elementwise fwd bf16 1x8192x4096".into(),
                format!("{dispatch} waits"),
                probabilities,
                format!("expert up: gemm fwd bf16 (mlp_up) {tokens}x28672x4096"),
                format!("expert activation: swiglu fwd bf16 1x{tokens}x14336"),
                format!("expert down: gemm fwd bf16 (mlp_down) {tokens}x4096x14336"),
                format!(
                    "moe all-to-all (combine): all_to_all none bf16 {} B 1x8",
                    tokens * 4096 * 2
                ),
                "unpermute: elementwise fwd bf16 1x8192x4096".into(),
            ]
        };
        assert_eq!(experts(&lines(&p, &p.layer.fwd)), expected(12288));
        // the backward reuses the counts: no gather, no wait
        let bwd: Vec<String> = expected(12288)
            .into_iter()
            .filter(|l| !l.starts_with("moe token counts"))
            .map(|l| l.trim_end_matches(" waits").replace(" fwd ", " bwd "))
            .collect();
        let b = lines(&p, &p.layer.bwd);
        assert_eq!(experts(&b[..b.len() - 1]), bwd);
        // the router's weight is accumulated apart, as the norms' are
        assert_eq!(
            b.last().unwrap(),
            "gradient accumulation: residual_add bwd fp32 1x1x4096 x3"
        );
        assert_eq!(p.loaded_layers.len(), 1);
        assert_eq!(p.loaded_layers[0].load, 2.0);
        let loaded = &p.loaded_layers[0].block;
        assert_eq!(experts(&lines(&p, &loaded.fwd)), expected(16384));

        let four = Plan::new(&a, &Layout::new(&spec(4), &a, &c).unwrap(), &c);
        let f = lines(&four, &four.layer.fwd);
        let from = f.iter().position(|l| l.starts_with("sort by")).unwrap();
        // 4,096 · 2 · 4 / 8 · 1.5 = 6,144 tokens an expert, two experts
        assert_eq!(
            f[from..from + 5],
            [
                "sort by local expert: elementwise fwd bf16 1x12288x4096",
                "expert up: gemm fwd bf16 (mlp_up) 6144x28672x4096 x2",
                "expert activation: swiglu fwd bf16 1x6144x14336 x2",
                "expert down: gemm fwd bf16 (mlp_down) 6144x4096x14336 x2",
                "unsort by local expert: elementwise fwd bf16 1x12288x4096",
            ]
        );
        assert!(f.contains(&"moe token counts all-gather: all_gather none bf16 256 B 1x4".into()));
    }

    /// Latent attention (DeepSeek-V3's ranks) on a Llama 2 7B-sized dense layer, one
    /// 4,096-token sequence, tp 1: the query through its 1,536-wide latent and norm up to 32
    /// heads of 128 + 64, keys and values from one 512-wide latent (plus the 64-wide RoPE key)
    /// up to 32 × (128 + 128), the core costed at heads of 160 (the mean of 192 and 128), the
    /// output projection from 32 × 128. Its backward accumulates four small gradients apart:
    /// the layer's two norms and the two latent norms (the five projections and the MLP's two
    /// are accumulated in their weight-gradient GEMMs).
    #[test]
    fn a_latent_attention_layer() {
        let latent = |mla: MlaSpec| {
            let mut spec = crate::workload::presets::preset("llama2-7b").unwrap();
            spec.mla = Some(mla);
            replicas(&spec.validate("latent").unwrap())
        };
        let p = latent(MlaSpec::deepseek_v3());
        let fwd = lines(&p, &p.layer.fwd);
        assert_eq!(
            fwd[..11],
            [
                "input norm: rmsnorm fwd bf16 1x4096x4096",
                "q down: gemm fwd bf16 (qkv) 4096x1536x4096",
                "q latent norm: rmsnorm fwd bf16 1x4096x1536",
                "q up: gemm fwd bf16 (qkv) 4096x6144x1536",
                "kv down: gemm fwd bf16 (qkv) 4096x576x4096",
                "kv latent norm: rmsnorm fwd bf16 1x4096x512",
                "kv up: gemm fwd bf16 (qkv) 4096x8192x512",
                "rope q: rope fwd bf16 1x4096x2048",
                "rope k: rope fwd bf16 1x4096x64",
                "attention: flash_attention fwd bf16 b1 4096x4096 h32/32 d160 causal",
                "attention out: gemm fwd bf16 (attn_out) 4096x4096x4096",
            ]
        );
        assert_eq!(
            lines(&p, &p.layer.bwd).last().unwrap(),
            "gradient accumulation: residual_add bwd fp32 1x1x4096 x4"
        );
        // without the query's latent: one query projection, and one latent norm: three
        let p = latent(MlaSpec {
            q_lora_rank: None,
            ..MlaSpec::deepseek_v3()
        });
        let fwd = lines(&p, &p.layer.fwd);
        assert_eq!(fwd[1], "q: gemm fwd bf16 (qkv) 4096x6144x4096");
        assert_eq!(fwd[2], "kv down: gemm fwd bf16 (qkv) 4096x576x4096");
        assert_eq!(
            lines(&p, &p.layer.bwd).last().unwrap(),
            "gradient accumulation: residual_add bwd fp32 1x1x4096 x3"
        );
    }

    /// Llama 3 8B's embedding, head and pipeline transfer on tp 2 with sequence parallelism
    /// and pp 2, one 8,192-token sequence: 64,128 vocabulary rows a rank (128,256 is a
    /// multiple of 128 · 2), each hidden state 8,192 × 4,096 × 2 bytes, a pipeline transfer
    /// its tp share. The LM head's input is gathered first; its backward reduce-scatters the
    /// input gradient and gathers the input again beside its GEMMs; without sequence
    /// parallelism it all-reduces the input gradient; under the paper's rules nothing. A fused
    /// cross-entropy carries its own role.
    #[test]
    fn the_embedding_head_and_pipeline_transfer_on_two_ranks() {
        let a = Arch::resolve("llama3-8b").unwrap();
        let spec = |sp: bool, rules: Rules, loss: CrossEntropy| ParallelSpec {
            tp: Some(2),
            pp: Some(2),
            dp: Some(2),
            micro_batch: Some(1),
            global_batch: Some(4),
            sequence_parallel: Some(sp),
            rules: Some(rules),
            dtype: Some(Dtype::Bf16),
            cross_entropy: Some(loss),
            ..Default::default()
        };
        let p = plan(&a, spec(true, Rules::Megatron, CrossEntropy::VocabParallel));
        let hidden = "67108864 B 1x2";
        assert_eq!(
            lines(&p, &p.embedding.fwd),
            [
                "embedding: embedding fwd bf16 1x8192 d4096 v64128".to_string(),
                format!("embedding all-reduce: all_reduce none bf16 {hidden}"),
            ]
        );
        assert_eq!(
            lines(&p, &p.embedding.bwd),
            ["embedding: embedding bwd bf16 1x8192 d4096 v64128"]
        );
        assert_eq!((p.embedding.params, p.embedding.tensors), (64128 * 4096, 1));
        assert_eq!(
            lines(&p, &p.head.fwd),
            [
                "final norm: rmsnorm fwd bf16 1x4096x4096".to_string(),
                format!("lm head all-gather: all_gather none bf16 {hidden}"),
                "lm head: gemm fwd bf16 (lm_head) 8192x64128x4096".into(),
                "cross-entropy: cross_entropy fwd bf16 1x8192x64128".into(),
            ]
        );
        assert_eq!(
            lines(&p, &p.head.bwd),
            [
                "final norm: rmsnorm bwd bf16 1x4096x4096".to_string(),
                format!("lm head reduce-scatter: reduce_scatter none bf16 {hidden} beside"),
                format!("lm head input re-gather: all_gather none bf16 {hidden} beside"),
                "lm head: gemm bwd bf16 (lm_head) 8192x64128x4096".into(),
                "cross-entropy: cross_entropy bwd bf16 1x8192x64128".into(),
            ]
        );
        assert_eq!((p.head.params, p.head.tensors), (4096 + 64128 * 4096, 2));
        let send = p.send.as_ref().unwrap();
        let Shape::Collective(sent) = p.queries[send.query as usize].shape else {
            panic!("a pipeline transfer is a collective")
        };
        assert_eq!(sent.bytes, 8192 * 4096 * 2 / 2);

        let whole = plan(&a, spec(false, Rules::Megatron, CrossEntropy::Fused));
        assert_eq!(
            lines(&whole, &whole.head.fwd)[1..],
            [
                "lm head: gemm fwd bf16 (lm_head) 8192x64128x4096",
                "cross-entropy: cross_entropy fwd bf16 (fused_cross_entropy) 1x8192x64128",
            ]
        );
        assert_eq!(
            lines(&whole, &whole.head.bwd)[1],
            format!("lm head all-reduce: all_reduce none bf16 {hidden} beside")
        );
        assert_eq!(
            lines(&whole, &whole.head.fwd)[0],
            "final norm: rmsnorm fwd bf16 1x8192x4096"
        );
        let paper = plan(&a, spec(false, Rules::Paper, CrossEntropy::VocabParallel));
        assert_eq!(paper.head.fwd.len(), 3);
        assert_eq!(paper.head.bwd.len(), 3);
    }

    /// The attention core of `p`'s layer pass: from the first call after the projections to
    /// the output projection.
    fn core(p: &Plan, calls: &[Call]) -> Vec<String> {
        let l = lines(p, calls);
        let from = l.iter().position(|l| l.starts_with("rope k")).unwrap() + 1;
        let to = l
            .iter()
            .position(|l| l.starts_with("attention out"))
            .unwrap();
        l[from..to].to_vec()
    }

    /// `arch` under `spec`, one sequence a micro-batch on tp 1 in bf16 unless it says.
    fn over(arch: &Arch, spec: ParallelSpec) -> Plan {
        let spec = ParallelSpec {
            tp: spec.tp.or(Some(1)),
            micro_batch: spec.micro_batch.or(Some(1)),
            dtype: spec.dtype.or(Some(Dtype::Bf16)),
            ..spec
        };
        plan(arch, spec)
    }

    fn llama_over(spec: ParallelSpec) -> Plan {
        over(&Arch::resolve("llama3-8b").unwrap(), spec)
    }

    /// `arch` on 8 data-parallel ranks of one GPU each.
    fn replicas(arch: &Arch) -> Plan {
        let spec = ParallelSpec {
            dp: Some(8),
            global_batch: Some(8),
            ..Default::default()
        };
        over(arch, spec)
    }

    /// Ring attention over 4 context-parallel ranks of an 8,192-token sequence: each rank's
    /// 2,048 queries attend causally to their own keys, then in 3 ring steps to half of
    /// 2,048 received ones while the next 2,048 × 2 × 8 × 128 × 2 bytes of keys and values
    /// travel (twice that with their gradients in the backward); the later steps' outputs are
    /// merged into the first's (forward) and their gradients added up (backward). By
    /// all-gather: the whole sequence's keys and values gathered (8,192 × 2 × 8 × 128 × 2
    /// bytes), one causal call over all of them, their gradients reduce-scattered.
    #[test]
    fn context_parallel_attention_by_ring_and_by_all_gather() {
        let ring = llama_over(ParallelSpec {
            cp: Some(4),
            dp: Some(2),
            global_batch: Some(2),
            ..Default::default()
        });
        assert_eq!(
            core(&ring, &ring.layer.fwd),
            [
                "attention (own chunks): flash_attention fwd bf16 b1 2048x2048 h32/8 d128 causal",
                "attention (ring step): flash_attention fwd bf16 b1 2048x1024 h32/8 d128 x3",
                "cp k/v exchange: send_recv none bf16 8388608 B 1x2 x3",
                "cp output rescale: elementwise fwd bf16 1x2048x4096",
                "cp output merge: residual_add fwd bf16 1x2048x4096 x3",
            ]
        );
        assert_eq!(
            core(&ring, &ring.layer.bwd),
            [
                "attention (own chunks): flash_attention bwd bf16 b1 2048x2048 h32/8 d128 causal",
                "attention (ring step): flash_attention bwd bf16 b1 2048x1024 h32/8 d128 x3",
                "cp k/v exchange: send_recv none bf16 16777216 B 1x2 x3",
                "cp query-gradient accumulation: residual_add bwd bf16 1x2048x4096 x3",
                "cp key/value-gradient accumulation: residual_add bwd bf16 1x2048x2048 x3",
            ]
        );
        let gathered = llama_over(ParallelSpec {
            cp: Some(4),
            cp_comm: Some(CpComm::AllGather),
            dp: Some(2),
            global_batch: Some(2),
            ..Default::default()
        });
        let kv = "cp k/v all-gather: all_gather none bf16 33554432 B 1x4";
        let attention =
            "attention (gathered k/v): flash_attention fwd bf16 b1 2048x8192 h32/8 d128";
        assert_eq!(
            core(&gathered, &gathered.layer.fwd),
            [kv.to_string(), format!("{attention} causal")]
        );
        assert_eq!(
            core(&gathered, &gathered.layer.bwd),
            [
                kv.to_string(),
                format!("{} causal", attention.replace(" fwd ", " bwd ")),
                "cp k/v gradient reduce-scatter: reduce_scatter none bf16 33554432 B 1x4".into(),
            ]
        );
    }

    /// Sliding-window attention on Llama 3 8B's shape, one 8,192-token sequence: a causal
    /// query sees min(i + 1, w) keys, w − w²/2s of them on average (960 for w = 1,024; 939 for
    /// w = 1,000, rounded up), run as ⌈s/w⌉ windows of w queries (8 and 9 sequences of the
    /// batch). Three layers in four local: each call at its share; every layer local: the
    /// window alone; a window as long as the sequence: global attention.
    #[test]
    fn sliding_window_attention_in_its_windows() {
        let with = |window: u64, every: Option<u64>| {
            let mut a = Arch::resolve("llama3-8b").unwrap();
            a.sliding_window = Some(window);
            a.global_attention_every = every;
            let p = replicas(&a);
            core(&p, &p.layer.fwd)
        };
        let global = "attention: flash_attention fwd bf16 b1 8192x8192 h32/8 d128 causal";
        assert_eq!(
            with(1024, Some(4)),
            [
                "sliding-window attention: flash_attention fwd bf16 b8 1024x960 h32/8 d128 x0.75"
                    .to_string(),
                format!("{global} x0.25"),
            ]
        );
        assert_eq!(
            with(1000, None),
            ["sliding-window attention: flash_attention fwd bf16 b9 1000x939 h32/8 d128"]
        );
        assert_eq!(with(8192, Some(2)), [global]);
    }

    /// Llama 4's chunked attention on Llama 3 8B's shape, one 8,192-token sequence: each
    /// 2,048-token chunk a causal attention of its own, 4 sequences of the batch; chunks of
    /// 3,000 leave a last one of 2,192 tokens, costed as a call of its own; a chunk as long as
    /// the sequence is global attention; the backward runs the same shapes.
    #[test]
    fn chunked_attention_in_its_chunks() {
        let with = |chunk: u64, every: Option<u64>| {
            let mut a = Arch::resolve("llama3-8b").unwrap();
            (a.sliding_window, a.chunked_attention) = (Some(chunk), true);
            a.global_attention_every = every;
            let p = replicas(&a);
            (core(&p, &p.layer.fwd), core(&p, &p.layer.bwd))
        };
        let global = "attention: flash_attention fwd bf16 b1 8192x8192 h32/8 d128 causal";
        let (fwd, bwd) = with(2048, Some(4));
        assert_eq!(
            fwd,
            [
                "chunked attention: flash_attention fwd bf16 b4 2048x2048 h32/8 d128 causal x0.75"
                    .to_string(),
                format!("{global} x0.25"),
            ]
        );
        assert_eq!(
            bwd[0],
            "chunked attention: flash_attention bwd bf16 b4 2048x2048 h32/8 d128 causal x0.75"
        );
        assert_eq!(
            with(3000, None).0,
            [
                "chunked attention: flash_attention fwd bf16 b2 3000x3000 h32/8 d128 causal",
                "chunked attention (last chunk): flash_attention fwd bf16 b1 2192x2192 h32/8 d128 \
                 causal"
            ]
        );
        assert_eq!(with(8192, Some(4)).0, [global]);
    }

    /// Under an fp8 recipe with sequence parallelism the forward all-gather carries the
    /// column-parallel GEMM's input cast to fp8 (8,192 × 4,096 × 1 bytes); the reduce-scatter
    /// and the backward's gradients stay 16-bit; the backward re-gathers the fp8 input.
    #[test]
    fn fp8_gathers_its_inputs_in_one_byte() {
        let p = llama_over(ParallelSpec {
            tp: Some(2),
            dp: Some(4),
            global_batch: Some(4),
            sequence_parallel: Some(true),
            dtype: Some(Dtype::Fp8),
            ..Default::default()
        });
        let tp = |calls: &[Call]| -> Vec<String> {
            lines(&p, calls)
                .into_iter()
                .filter(|l| l.starts_with("tp "))
                .collect()
        };
        let (half, full) = ("33554432 B 1x2", "67108864 B 1x2");
        let fwd = [
            format!("tp all-gather: all_gather none bf16 {half}"),
            format!("tp reduce-scatter: reduce_scatter none bf16 {full}"),
        ];
        assert_eq!(tp(&p.layer.fwd), [fwd.clone(), fwd].concat());
        let bwd = [
            format!("tp all-gather: all_gather none bf16 {full}"),
            format!("tp reduce-scatter: reduce_scatter none bf16 {full} beside"),
            format!("tp input re-gather: all_gather none bf16 {half} beside"),
        ];
        assert_eq!(tp(&p.layer.bwd), [bwd.clone(), bwd].concat());
    }

    /// FSDP (ZeRO-3) on 8 ranks: a Llama 3 8B layer's 218,112,000 parameters (QKV 4,096 ×
    /// 6,144, output 4,096², up 4,096 × 28,672, down 14,336 × 4,096, two norms) gathered in
    /// 16 bits before its forward and its backward, their fp32 gradients reduce-scattered
    /// after, all three beside the compute; in fp8 with fp8 parameter gathers, one byte each.
    #[test]
    fn fsdp_gathers_a_layers_weights_and_scatters_its_gradients() {
        let params: u64 = 4096 * 6144 + 4096 * 4096 + 4096 * 28672 + 14336 * 4096 + 2 * 4096;
        assert_eq!(params, 218_112_000);
        let fsdp = |dtype: Dtype, fp8_gather: bool| {
            llama_over(ParallelSpec {
                dp: Some(8),
                global_batch: Some(8),
                zero: Some(3),
                dtype: Some(dtype),
                grad_reduce_dtype: Some(Dtype::Fp32),
                fp8_param_gather: fp8_gather.then_some(true),
                ..Default::default()
            })
        };
        let p = fsdp(Dtype::Bf16, false);
        assert_eq!(p.layer.params, params);
        let gather = |bytes: u64| {
            format!("fsdp parameter collective: all_gather none bf16 {bytes} B 1x8 overlapped")
        };
        let scatter = format!(
            "fsdp parameter collective: reduce_scatter none bf16 {} B 1x8 overlapped",
            4 * params
        );
        assert_eq!(lines(&p, &p.layer.fwd).last().unwrap(), &gather(2 * params));
        let bwd = lines(&p, &p.layer.bwd);
        assert_eq!(bwd[bwd.len() - 2..], [gather(2 * params), scatter.clone()]);
        let fp8 = fsdp(Dtype::Fp8, true);
        assert_eq!(lines(&fp8, &fp8.layer.fwd).last().unwrap(), &gather(params));
        let bwd = lines(&fp8, &fp8.layer.bwd);
        assert_eq!(bwd[bwd.len() - 2..], [gather(params), scatter]);
    }

    /// A Mixtral-shaped layer (8 experts unless `experts` says, top 2, the busiest rank 1.5×
    /// the mean), one 4,096-token sequence, under `spec`: its forward's lines.
    fn mixture(experts: u64, spec: ParallelSpec) -> Vec<String> {
        let mut a = crate::workload::presets::mixtral_8x7b();
        if let Some(m) = a.moe.as_mut() {
            m.experts = experts;
        }
        let p = plan(
            &a,
            ParallelSpec {
                micro_batch: Some(1),
                moe_imbalance: Some(1.5),
                ..spec
            },
        );
        lines(&p, &p.layer.fwd)
    }

    /// The dispatchers' transfers. DeepEP over 16 ranks on two nodes: each token's 2 copies
    /// miss the other node with 1/4, so 0.75 remote copies a token, × 1.5 for the busiest
    /// rank, sent as the 2-node all-to-all's off-node half (× 2): 9,216 tokens of 8 KiB over
    /// the network, then 12,288 over NVLink (the combine in reverse); no token counts
    /// gathered, the host reads them back before the first transfer. The all-gather
    /// dispatcher gathers all 8 ranks' tokens and reduce-scatters them back. With the
    /// all-to-alls overlapped, each runs beside the compute.
    #[test]
    fn each_dispatcher_moves_the_tokens_its_way() {
        let deepep = mixture(
            16,
            ParallelSpec {
                ep: Some(16),
                dp: Some(16),
                global_batch: Some(16),
                moe_dispatcher: Some(Dispatcher::Deepep),
                ..Default::default()
            },
        );
        let network = |way: &str| {
            format!("moe network all-to-all ({way}): all_to_all none bf16 75497472 B 2x1")
        };
        let nvlink = |way: &str| {
            format!("moe nvlink all-to-all ({way}): all_to_all none bf16 100663296 B 1x8")
        };
        let transfers = |l: &[String]| -> Vec<String> {
            l.iter()
                .filter(|l| l.starts_with("moe "))
                .cloned()
                .collect()
        };
        assert_eq!(
            transfers(&deepep),
            [
                format!("{} waits", network("dispatch")),
                nvlink("dispatch"),
                nvlink("combine"),
                network("combine"),
            ]
        );
        let allgather = mixture(
            8,
            ParallelSpec {
                ep: Some(8),
                dp: Some(8),
                global_batch: Some(8),
                moe_dispatcher: Some(Dispatcher::Allgather),
                moe_a2a_overlap: Some(true),
                ..Default::default()
            },
        );
        let all = "268435456 B 1x8 overlapped";
        assert_eq!(
            transfers(&allgather),
            [
                format!("moe all-gather (dispatch): all_gather none bf16 {all} waits"),
                format!("moe reduce-scatter (combine): reduce_scatter none bf16 {all}"),
            ]
        );
    }

    /// Experts split over 2 expert-tensor-parallel ranks (tp 2 with sequence parallelism, ep
    /// 4): the 2,048-token shard's copies go over the all-to-all (6,144 × 8 KiB), the group
    /// gathers its two shards' routed tokens (12,288 × 8 KiB) before the experts and
    /// reduce-scatters their output after; token counts come from all 8 ranks (512 bytes).
    /// Each of the two local experts runs 6,144 tokens on a 7,168-wide half.
    #[test]
    fn expert_tensor_parallelism_gathers_the_groups_tokens() {
        let l = mixture(
            8,
            ParallelSpec {
                tp: Some(2),
                etp: Some(2),
                ep: Some(4),
                dp: Some(4),
                global_batch: Some(4),
                sequence_parallel: Some(true),
                ..Default::default()
            },
        );
        let from = l.iter().position(|l| l.starts_with("router:")).unwrap();
        let etp = "100663296 B 1x2";
        let a2a = "50331648 B 1x4";
        assert_eq!(
            l[from..l.len() - 3],
            [
                "router: gemm fwd bf16 2048x8x4096".to_string(),
                "router top-k: softmax fwd bf16 1x2048x8".into(),
                "moe token counts all-gather: all_gather none bf16 512 B 1x8".into(),
                "permute: elementwise fwd bf16 1x4096x4096".into(),
                format!("moe all-to-all (dispatch): all_to_all none bf16 {a2a} waits"),
                "moe all-to-all (probabilities): all_to_all none bf16 24576 B 1x4".into(),
                format!("moe etp all-gather: all_gather none bf16 {etp}"),
                "sort by local expert: elementwise fwd bf16 1x12288x4096".into(),
                "expert up: gemm fwd bf16 (mlp_up) 6144x14336x4096 x2".into(),
                "expert activation: swiglu fwd bf16 1x6144x7168 x2".into(),
                "expert down: gemm fwd bf16 (mlp_down) 6144x4096x7168 x2".into(),
                "unsort by local expert: elementwise fwd bf16 1x12288x4096".into(),
                format!("moe etp reduce-scatter: reduce_scatter none bf16 {etp}"),
                format!("moe all-to-all (combine): all_to_all none bf16 {a2a}"),
                "unpermute: elementwise fwd bf16 1x4096x4096".into(),
            ]
        );
    }

    /// With a capacity factor the host reads the kept count back before the permutation
    /// (its output's size); padded to capacity every size is known: no counts gathered,
    /// nothing read back.
    #[test]
    fn a_capacity_moves_or_removes_the_read_back() {
        let spec = |pad: bool| ParallelSpec {
            ep: Some(8),
            dp: Some(8),
            global_batch: Some(8),
            moe_capacity_factor: Some(1.0),
            moe_pad_to_capacity: Some(pad),
            ..Default::default()
        };
        let dropping = mixture(8, spec(false));
        let waits: Vec<&String> = dropping.iter().filter(|l| l.ends_with(" waits")).collect();
        assert_eq!(waits.len(), 1);
        assert!(waits[0].starts_with("permute: "), "{waits:?}");
        let padded = mixture(8, spec(true));
        assert!(!padded.iter().any(|l| l.ends_with(" waits")));
        assert!(!padded.iter().any(|l| l.starts_with("moe token counts")));
        assert!(dropping.iter().any(|l| l.starts_with("moe token counts")));
    }

    /// What selective recomputation rebuilds, by Megatron-Core's `--recompute-modules`:
    /// the attention core alone by default; each named module's forward calls, in order (an
    /// fp8 cast with the GEMM it feeds); in an expert layer `mlp`'s calls are the shared
    /// experts', `moe` every router, dispatch and expert call, `moe_act` the experts'
    /// activation; with latent attention `mla_up_proj` the up-projections and RoPE.
    #[test]
    fn selective_recomputation_rebuilds_the_modules_it_names() {
        use crate::workload::RecomputeModule as M;
        let labels =
            |p: &Plan| -> Vec<&'static str> { p.layer.recompute.iter().map(|c| c.label).collect() };
        let modules = |m: &[M]| ParallelSpec {
            dp: Some(8),
            global_batch: Some(8),
            recompute: Some(Recompute::Selective),
            recompute_modules: (!m.is_empty()).then(|| m.to_vec()),
            ..Default::default()
        };
        assert_eq!(labels(&llama_over(modules(&[]))), ["attention"]);
        assert_eq!(
            labels(&llama_over(modules(&[M::Layernorm, M::Mlp]))),
            [
                "input norm",
                "post-attention norm",
                "mlp up",
                "activation",
                "mlp down"
            ]
        );
        let fp8 = llama_over(ParallelSpec {
            dtype: Some(Dtype::Fp8),
            fp8_library: Some(Fp8Library::TransformerEngine),
            ..modules(&[M::Mlp])
        });
        assert_eq!(labels(&fp8), ["mlp up", "activation", FP8_CAST, "mlp down"]);

        let c = crate::hardware::dgx_h100_without_models();
        let mut shared = crate::workload::presets::mixtral_8x7b();
        if let Some(m) = shared.moe.as_mut() {
            m.shared_experts = 1;
        }
        let experts = |m: &[M]| {
            let spec = ParallelSpec {
                ep: Some(8),
                ..modules(m)
            };
            let p = Plan::new(&shared, &Layout::new(&spec, &shared, &c).unwrap(), &c);
            labels(&p)
        };
        assert_eq!(experts(&[M::MoeAct]), ["expert activation"]);
        assert_eq!(
            experts(&[M::SharedExperts]),
            ["mlp up", "activation", "mlp down"]
        );
        assert_eq!(
            experts(&[M::Moe]),
            [
                "router",
                "router top-k",
                "moe token counts all-gather",
                "permute",
                "moe all-to-all (dispatch)",
                "moe all-to-all (probabilities)",
                "expert up",
                "expert activation",
                "expert down",
                "moe all-to-all (combine)",
                "unpermute",
                "mlp up",
                "activation",
                "mlp down",
            ]
        );

        let mut spec = crate::workload::presets::preset("llama2-7b").unwrap();
        spec.mla = Some(MlaSpec::deepseek_v3());
        let latent = spec.validate("latent").unwrap();
        let spec = modules(&[M::MlaUpProj]);
        let p = Plan::new(&latent, &Layout::new(&spec, &latent, &c).unwrap(), &c);
        assert_eq!(labels(&p), ["q up", "kv up", "rope q", "rope k"]);
    }

    /// Per-head query and key norms (Qwen 3, OLMo 2) after the QKV GEMM; a QKV bias (Qwen
    /// 2) reduced in the backward; under the paper's rules RoPE on the queries only, as its
    /// tool lists it.
    #[test]
    fn query_key_norms_qkv_bias_and_the_papers_rope() {
        let mut a = Arch::resolve("llama3-8b").unwrap();
        a.qk_norm = true;
        a.qkv_bias = true;
        let spec = |rules: Rules| ParallelSpec {
            tp: Some(1),
            dp: Some(8),
            micro_batch: Some(1),
            global_batch: Some(8),
            dtype: Some(Dtype::Bf16),
            rules: Some(rules),
            ..Default::default()
        };
        let p = plan(&a, spec(Rules::Megatron));
        let fwd = lines(&p, &p.layer.fwd);
        assert_eq!(
            fwd[1..6],
            [
                "qkv: gemm fwd bf16 (qkv) 8192x6144x4096",
                "q norm: rmsnorm fwd bf16 1x8192x4096",
                "k norm: rmsnorm fwd bf16 1x8192x1024",
                "rope q: rope fwd bf16 1x8192x4096",
                "rope k: rope fwd bf16 1x8192x1024",
            ]
        );
        let bwd = lines(&p, &p.layer.bwd);
        // two norms, the QKV bias, the query and key norms: five small gradients
        assert_eq!(
            bwd[bwd.len() - 2..],
            [
                "bias gradient: elementwise bwd bf16 1x8192x6144",
                "gradient accumulation: residual_add bwd fp32 1x1x4096 x5",
            ]
        );
        let paper = plan(&a, spec(Rules::Paper));
        let fwd = lines(&paper, &paper.layer.fwd);
        assert_eq!(fwd[4], "rope q: rope fwd bf16 1x8192x4096");
        assert!(fwd[5].starts_with("attention: "), "{fwd:?}");
    }

    /// A multi-token-prediction module on tp 2 with sequence parallelism, one 8,192-token
    /// sequence: the embedding, two norms on the 4,096-row shard, the 2 × 4,096 → 4,096
    /// projection split over tp (2,048 columns a rank) and its output gathered, a layer, the
    /// head; the backward in reverse. Its own parameters: the layer's, the projection's
    /// 4,096 × 8,192 / 2, two norms of 4,096; three tensors more than the layer.
    #[test]
    fn a_multi_token_prediction_module() {
        let p = llama_over(ParallelSpec {
            tp: Some(2),
            dp: Some(4),
            global_batch: Some(4),
            sequence_parallel: Some(true),
            mtp_layers: Some(1),
            ..Default::default()
        });
        let mtp = p.mtp.as_ref().unwrap();
        let bridge = |phase: &str| -> Vec<String> {
            vec![
                format!("mtp embedding norm: rmsnorm {phase} bf16 1x4096x4096"),
                format!("mtp hidden norm: rmsnorm {phase} bf16 1x4096x4096"),
                format!("mtp projection: gemm {phase} bf16 8192x2048x8192"),
                "mtp gather: all_gather none bf16 67108864 B 1x2".into(),
            ]
        };
        let fwd = [
            lines(&p, &p.embedding.fwd),
            bridge("fwd"),
            lines(&p, &p.layer.fwd),
            lines(&p, &p.head.fwd),
        ]
        .concat();
        assert_eq!(lines(&p, &mtp.fwd), fwd);
        let bwd = [
            lines(&p, &p.head.bwd),
            lines(&p, &p.layer.bwd),
            bridge("bwd"),
            lines(&p, &p.embedding.bwd),
        ]
        .concat();
        assert_eq!(lines(&p, &mtp.bwd), bwd);
        assert_eq!(mtp.params, p.layer.params + 4096 * 8192 / 2 + 2 * 4096);
        assert_eq!(mtp.tensors, p.layer.tensors + 3);
    }

    /// torchao casts a GEMM's input and weight in the forward, only the input when the
    /// weights are gathered in fp8 already (torchtitan's `enable_fsdp_float8_all_gather`).
    #[test]
    fn torchao_leaves_fp8_weights_uncast() {
        let casts = |fp8_weights: bool| {
            let p = llama_over(ParallelSpec {
                dp: Some(8),
                global_batch: Some(8),
                dtype: Some(Dtype::Fp8),
                fp8_library: Some(Fp8Library::Torchao),
                fp8_param_gather: fp8_weights.then_some(true),
                ..Default::default()
            });
            lines(&p, &p.layer.fwd)
                .into_iter()
                .filter(|l| l.starts_with(FP8_CAST))
                .collect::<Vec<_>>()
        };
        // the output projection's input (8,192 tokens × 4,096) and weight (4,096 × 4,096)
        let input = format!("{FP8_CAST}: elementwise fwd bf16 1x8192x4096");
        let weight = format!("{FP8_CAST}: elementwise fwd bf16 1x4096x4096");
        let both = casts(false);
        assert_eq!(both.len(), 8);
        assert_eq!(both[2..4], [input.clone(), weight]);
        let inputs = casts(true);
        assert_eq!(inputs.len(), 4);
        assert_eq!(inputs[1], input);
    }

    /// A mixture's expert layer under Megatron-Core's `moe` graph scope (its input padded to
    /// a capacity, so nothing is read back): the router, dispatch, experts and combine
    /// captured in one graph after the eager attention block.
    #[test]
    fn the_moe_scope_captures_the_whole_expert_block() {
        let a = crate::workload::presets::mixtral_8x7b();
        let p = plan(
            &a,
            ParallelSpec {
                ep: Some(8),
                dp: Some(8),
                global_batch: Some(8),
                cuda_graphs: Some(vec![CudaGraphScope::Moe]),
                moe_capacity_factor: Some(1.0),
                moe_pad_to_capacity: Some(true),
                ..Default::default()
            },
        );
        let fwd = &p.layer.fwd;
        let start = fwd
            .iter()
            .position(|c| c.label == "post-attention norm")
            .unwrap();
        assert!(fwd[..start].iter().all(|c| c.issue == Issue::Eager));
        assert_eq!(fwd[start].issue, Issue::GraphLaunch);
        assert!(fwd[start + 1..].iter().all(|c| c.issue == Issue::InGraph));
    }

    /// A mixture's first dense layer runs the dense MLP of `ffn_hidden` (no router, no
    /// experts) and accumulates its two norms' gradients apart; shared experts on tp 2 are a
    /// dense MLP of half their width a rank.
    #[test]
    fn a_mixtures_dense_layer_and_its_shared_experts_split_over_tp() {
        let mut a = crate::workload::presets::mixtral_8x7b();
        if let Some(m) = a.moe.as_mut() {
            m.dense_layers = 1;
            m.shared_experts = 1;
        }
        let p = plan(
            &a,
            ParallelSpec {
                tp: Some(2),
                ep: Some(4),
                dp: Some(4),
                micro_batch: Some(1),
                global_batch: Some(4),
                ..Default::default()
            },
        );
        let dense = p.dense_layer.as_ref().unwrap();
        let fwd = lines(&p, &dense.fwd);
        assert!(!fwd.iter().any(|l| l.starts_with("router")), "{fwd:?}");
        let mlp = fwd.iter().position(|l| l.starts_with("mlp up")).unwrap();
        let half = [
            "mlp up: gemm fwd bf16 (mlp_up) 4096x14336x4096",
            "activation: swiglu fwd bf16 1x4096x7168",
            "mlp down: gemm fwd bf16 (mlp_down) 4096x4096x7168",
        ];
        assert_eq!(fwd[mlp..mlp + 3], half);
        assert_eq!(
            lines(&p, &dense.bwd).last().unwrap(),
            "gradient accumulation: residual_add bwd fp32 1x1x4096 x2"
        );
        // the expert layer's shared experts: 14,336 wide, 7,168 a rank, after the combine
        let fwd = lines(&p, &p.layer.fwd);
        let unpermute = fwd.iter().position(|l| l.starts_with("unpermute")).unwrap();
        assert_eq!(fwd[unpermute + 1..unpermute + 4], half);
        // two norms and the router accumulated apart; the shared experts in their GEMMs
        assert_eq!(
            lines(&p, &p.layer.bwd).last().unwrap(),
            "gradient accumulation: residual_add bwd fp32 1x1x4096 x3"
        );
    }

    /// DeepEP's two legs only where they run: on one node no network leg; with one expert
    /// rank a node (tp 8 and etp 8 over two nodes, beside the expert-tensor-parallel
    /// gathers) no NVLink leg; over 4 nodes of 8 (32 experts) a token's 2 copies miss a node
    /// with (3/4)², so 1.3125 remote nodes, × 1.5 for the busiest rank, × 4/3 as the 4-node
    /// all-to-all's off-node share: 10,752 tokens of 8 KiB. Without expert parallelism no
    /// token counts are gathered.
    #[test]
    fn deepep_runs_only_the_legs_its_ranks_span() {
        let transfers = |experts: u64, spec: ParallelSpec| -> Vec<String> {
            mixture(
                experts,
                ParallelSpec {
                    moe_dispatcher: Some(Dispatcher::Deepep),
                    ..spec
                },
            )
            .into_iter()
            .filter(|l| l.contains(" all-to-all ("))
            .map(|l| l.split(':').next().unwrap().to_string())
            .collect()
        };
        let experts_over = |ep: u64, dp: u64| ParallelSpec {
            ep: Some(ep),
            dp: Some(dp),
            global_batch: Some(dp),
            ..Default::default()
        };
        assert_eq!(
            transfers(8, experts_over(8, 8)),
            [
                "moe nvlink all-to-all (dispatch)",
                "moe nvlink all-to-all (combine)"
            ]
        );
        let wide = ParallelSpec {
            tp: Some(8),
            ..experts_over(2, 2)
        };
        assert_eq!(
            transfers(8, wide),
            [
                "moe network all-to-all (dispatch)",
                "moe network all-to-all (combine)"
            ]
        );
        let four = mixture(
            32,
            ParallelSpec {
                moe_dispatcher: Some(Dispatcher::Deepep),
                ..experts_over(32, 32)
            },
        );
        assert!(four.contains(
            &"moe network all-to-all (combine): all_to_all none bf16 88080384 B 4x1".to_string()
        ));
        let alone = mixture(8, experts_over(1, 8));
        assert!(!alone.iter().any(|l| l.starts_with("moe ")), "{alone:?}");
    }

    /// A mixture's dense layer without shared experts still accumulates only its two
    /// norms apart (its MLP's two projections in their GEMMs).
    #[test]
    fn a_dense_layer_without_shared_experts() {
        let mut a = crate::workload::presets::mixtral_8x7b();
        if let Some(m) = a.moe.as_mut() {
            m.dense_layers = 1;
        }
        let p = over(
            &a,
            ParallelSpec {
                ep: Some(8),
                dp: Some(8),
                global_batch: Some(8),
                ..Default::default()
            },
        );
        let dense = p.dense_layer.as_ref().unwrap();
        assert_eq!(
            lines(&p, &dense.bwd).last().unwrap(),
            "gradient accumulation: residual_add bwd fp32 1x1x4096 x2"
        );
    }

    /// Op-level checkpointing (torchtitan's policy) of an ungated MLP saves the up
    /// projection's output and recomputes the down projection (the 6th of six matmuls); on
    /// tp 2 with sequence parallelism it recomputes the all-gathers and saves what the
    /// reduce-scatters produced; with context parallelism it keeps the attention's inputs, so
    /// no key-value exchange reruns.
    #[test]
    fn op_level_checkpointing_saves_reduce_scatters_attention_and_every_other_matmul() {
        let labels = |a: &Arch, spec: ParallelSpec| -> Vec<&'static str> {
            let p = over(
                a,
                ParallelSpec {
                    recompute: Some(Recompute::SelectiveOp),
                    ..spec
                },
            );
            p.layer.recompute.iter().map(|c| c.label).collect()
        };
        let eight = ParallelSpec {
            dp: Some(8),
            global_batch: Some(8),
            ..Default::default()
        };
        let mut ungated = Arch::resolve("llama3-8b").unwrap();
        ungated.activation = crate::workload::Activation::Gelu;
        let mlp: Vec<&str> = labels(&ungated, eight.clone())
            .into_iter()
            .filter(|l| l.starts_with("mlp"))
            .collect();
        assert_eq!(mlp, ["mlp down"]);
        let llama = Arch::resolve("llama3-8b").unwrap();
        let sp = ParallelSpec {
            tp: Some(2),
            dp: Some(4),
            global_batch: Some(4),
            sequence_parallel: Some(true),
            ..Default::default()
        };
        let tp: Vec<&str> = labels(&llama, sp)
            .into_iter()
            .filter(|l| l.starts_with("tp ") || l.starts_with("attention"))
            .collect();
        assert_eq!(tp, ["attention out", "tp all-gather", "tp all-gather"]);
        let cp = ParallelSpec {
            cp: Some(2),
            dp: Some(4),
            global_batch: Some(4),
            ..Default::default()
        };
        let rebuilt = labels(&llama, cp);
        assert!(!rebuilt
            .iter()
            .any(|l| l.starts_with("cp k/v") || l.starts_with("attention (")));
        assert!(rebuilt.contains(&"cp output merge"), "{rebuilt:?}");
    }

    /// On one tensor-parallel rank neither the embedding nor a multi-token-prediction
    /// module communicates.
    #[test]
    fn one_rank_gathers_nothing() {
        let spec = ParallelSpec {
            dp: Some(8),
            global_batch: Some(8),
            mtp_layers: Some(1),
            ..Default::default()
        };
        let p = llama_over(spec.clone());
        assert_eq!(
            lines(&p, &p.embedding.fwd),
            ["embedding: embedding fwd bf16 1x8192 d4096 v128256"]
        );
        let mtp = p.mtp.as_ref().unwrap();
        assert!(!mtp.fwd.iter().any(|c| c.label == "mtp gather"));
        // a module of GPT-3 15B: its projection 2 × 6,144 → 6,144 whole, two layer norms
        // with their biases
        let gpt3 = over(&Arch::resolve("gpt3-15b").unwrap(), spec);
        let mtp = gpt3.mtp.as_ref().unwrap();
        let layer = &gpt3.layer;
        assert_eq!(
            (mtp.params, mtp.tensors),
            (
                layer.params + 2 * 6144 * 6144 + 4 * 6144,
                layer.tensors + 1 + 4
            )
        );
    }

    /// Token counts come from every rank of the expert and expert-tensor-parallel groups:
    /// with tp (and etp) 16 over two nodes and ep 2, 32 ranks on four nodes, 8 experts × 8
    /// bytes each.
    #[test]
    fn token_counts_come_from_ranks_on_every_node_they_span() {
        let l = mixture(
            8,
            ParallelSpec {
                tp: Some(16),
                ep: Some(2),
                dp: Some(2),
                global_batch: Some(2),
                ..Default::default()
            },
        );
        assert!(
            l.contains(&"moe token counts all-gather: all_gather none bf16 2048 B 4x8".to_string()),
            "{l:?}"
        );
    }
}

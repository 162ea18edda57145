//! Activation bytes one transformer layer stores for its backward, per micro-batch and GPU,
//! tensor by tensor, following Korthikanti et al. 2022 ("Reducing Activation Recomputation in
//! Large Transformer Models", §4): with 16-bit activations, 1-byte dropout masks, an unfused
//! attention and a 4·h GELU MLP the sum is s·b·h·(34 + 5·a·s/h), each tensor-parallel term
//! divided by t, the rest too under sequence parallelism. Flash attention, SwiGLU, grouped
//! key/value heads and no dropout change individual terms, named below; training in fp32 the
//! activations take 4 bytes an element (masks, token ids and the fp32 tensors keep theirs).

use serde::Serialize;

use crate::plan::megatron_fuses_softmax;
use crate::workload::{
    Activation, Arch, AttentionImpl, Elementwise, Layout, NormKind, Recompute, Rules,
};

/// One stored tensor.
#[derive(Debug, Clone, Serialize)]
pub struct Stored {
    pub what: &'static str,
    pub bytes: f64,
    /// Still needed after the input-gradient pass, by the weight-gradient pass (a GEMM input).
    pub for_weight_grad: bool,
}

/// What one layer keeps between its forward and its backward.
#[derive(Debug, Clone, Serialize)]
pub struct LayerActivations {
    pub stored: Vec<Stored>,
    /// Bytes one layer holds when the backward is split: the weight-gradient pass needs its
    /// GEMM inputs and the output gradients of its GEMMs.
    pub for_weight_grad: f64,
    /// The whole layer's intermediate tensors, which a full-recompute backward rebuilds one
    /// layer at a time.
    pub recompute_working: f64,
}

impl LayerActivations {
    pub fn total(&self) -> f64 {
        self.stored.iter().map(|s| s.bytes).sum()
    }
}

/// Elements of the hidden state of a micro-batch: s·b·h.
fn sbh(arch: &Arch, layout: &Layout) -> f64 {
    (layout.local_seq_len() * layout.micro_batch * arch.hidden) as f64
}

pub fn layer(arch: &Arch, layout: &Layout) -> LayerActivations {
    layer_at(arch, layout, layout.expert_load())
}

/// [`layer`] with the routed experts at router load `load` (a routing file's layer).
pub fn layer_at(arch: &Arch, layout: &Layout, load: f64) -> LayerActivations {
    let (s, b) = (layout.local_seq_len() as f64, layout.micro_batch as f64);
    let t = layout.tp as f64;
    let h = sbh(arch, layout);
    // replicated over the TP ranks unless sequence parallelism splits them
    let rep = if layout.sequence_parallel {
        1.0 / t
    } else {
        1.0
    };
    let heads = arch.heads as f64 / t;
    let kv_heads = (arch.kv_heads as f64 / t).max(1.0);
    let hd = arch.head_dim as f64;
    // bytes an activation element takes: 16 bits, or 4 training in fp32
    let e = layout.activation_dtype().bytes();
    let q = e * s * b * heads * hd;
    let kv = e * s * b * kv_heads * hd;
    let ffn = arch.ffn_hidden as f64 / t;
    let scores = heads * s * s * b; // elements of one rank's attention matrix
    let dropout = arch.dropout;
    let mut v = Vec::new();
    let mut add = |what, bytes: f64, w| {
        if bytes > 0.0 {
            v.push(Stored {
                what,
                bytes,
                for_weight_grad: w,
            })
        }
    };
    let full = layout.recompute == Recompute::Full;
    // an eager RMSNorm (`plan::layer::eager_kernels`) keeps what autograd needs of its
    // operations: the fp32 copy of its input (4 bytes) and the scaled output the weight
    // multiplies (e); its input (e, counted below as the norm's) is kept by nothing — 4 bytes
    // more than a fused norm either way (in fp32 the copy is the input itself)
    let eager = layout.elementwise == Elementwise::Eager;
    let eager_norm = if eager && arch.norm == NormKind::Rmsnorm {
        4.0 * h * rep
    } else {
        0.0
    };
    // without norms before them (OLMo 2), the attention and the MLP keep the residual stream
    // they read, once
    let pre_norm = if arch.pre_norms { e * h * rep } else { 0.0 };
    let pre_eager_norm = if arch.pre_norms { eager_norm } else { 0.0 };
    add("input norm input", pre_norm, false);
    if arch.pre_norms {
        add("QKV input (norm output)", e * h * rep, true);
    } else {
        add("QKV input (layer input)", e * h * rep, true);
    }
    add(
        "input norm fp32 copy and scaled output (eager)",
        pre_eager_norm,
        false,
    );
    match arch.attention {
        AttentionImpl::Unfused => {
            add("Q and K", q + kv, false);
            // soft-capped scores: the tanh keeps its output for its backward
            if arch.attention_softcap {
                add("soft-capped scores (tanh output)", e * scores, false);
            }
            // kept in fp32 where Megatron falls back to PyTorch's softmax (`plan::layer`)
            let torch_softmax = layout.rules == Rules::Megatron
                && !megatron_fuses_softmax(
                    layout.micro_batch,
                    arch.heads / layout.tp,
                    layout.local_seq_len(),
                    layout.activation_dtype(),
                );
            add(
                "softmax output",
                if torch_softmax { 4.0 } else { e } * scores,
                false,
            );
            if dropout {
                add("attention dropout mask", scores, false);
                add("attention dropout output", e * scores, false);
            }
            add("V", kv, false);
            add("attention output (out-projection input)", q, true);
        }
        AttentionImpl::Flash => {
            // FlashAttention keeps Q, K, V, its output and the fp32 log-sum-exp; dropout masks
            // are regenerated from the RNG state, not stored. Latent attention's values are
            // v_head_dim wide, and its latents are kept for the up-projections' backward
            let (qkv, out) = match &arch.mla {
                Some(m) => {
                    let v = e * s * b * heads * m.v_head_dim as f64;
                    let latents = m.q_lora_rank.unwrap_or(0) + m.kv_lora_rank;
                    add(
                        "query and key-value latents (norm and up-projection inputs)",
                        2.0 * e * s * b * latents as f64,
                        true,
                    );
                    (2.0 * q + v, v)
                }
                None => (q + 2.0 * kv, q),
            };
            add("Q, K and V", qkv, false);
            add("attention output (out-projection input)", out, true);
            add("softmax log-sum-exp (fp32)", 4.0 * s * b * heads, false);
        }
    }
    // Gemma 2's norms on the attention's and the MLP's outputs keep their inputs, as the
    // norms before them do
    let post_norm = if arch.post_norms { e * h * rep } else { 0.0 };
    let post_eager_norm = if arch.post_norms { eager_norm } else { 0.0 };
    add("attention output norm input", post_norm, false);
    add(
        "attention output norm fp32 copy and scaled output (eager)",
        post_eager_norm,
        false,
    );
    if dropout {
        add("attention-out dropout mask", h * rep, false);
    }
    add("post-attention norm input", pre_norm, false);
    if arch.pre_norms {
        add("MLP input (norm output)", e * h * rep, true);
    } else {
        add("MLP input (residual sum)", e * h * rep, true);
    }
    add(
        "post-attention norm fp32 copy and scaled output (eager)",
        pre_eager_norm,
        false,
    );
    // the MLP every token runs: the dense one, or the shared experts
    let ffn = match &arch.moe {
        None => ffn,
        Some(m) => m.shared_ffn() as f64 / t,
    };
    let gate = if arch.activation.is_gated() { 2.0 } else { 1.0 };
    // (an expert layer without shared experts has none of these: `add` keeps no empty entry)
    match arch.activation {
        Activation::Gelu => add("GELU input", e * s * b * ffn, false),
        Activation::SquaredRelu => add("squared-ReLU input", e * s * b * ffn, false),
        Activation::Swiglu => add("SwiGLU input (gate and up)", 2.0 * e * s * b * ffn, false),
        Activation::Geglu => add("GeGLU input (gate and up)", 2.0 * e * s * b * ffn, false),
    }
    add("MLP down input (activation output)", e * s * b * ffn, true);
    // run eagerly, the multiply keeps SiLU's output besides the up projection's
    if eager && arch.activation.is_gated() {
        add("SiLU output (eager)", e * s * b * ffn, false);
    }
    if let Some(m) = &arch.moe {
        // the busiest expert's share of the k routed copies of every token, after the
        // dispatcher gathered the expert-tensor-parallel group's tokens
        let etp = layout.etp as f64;
        let group_tokens = if layout.sequence_parallel {
            (s * etp / t).min(s)
        } else {
            s
        };
        let routed = group_tokens * b * m.top_k as f64 * load;
        let fe = m.expert_ffn as f64 / etp;
        add(
            "router probabilities (fp32)",
            4.0 * s * b * m.experts as f64 * rep,
            false,
        );
        add(
            "expert input (permuted tokens)",
            e * routed * arch.hidden as f64,
            true,
        );
        add("expert activation input", e * gate * routed * fe, false);
        add(
            "expert down input (activation output)",
            e * routed * fe,
            true,
        );
    }
    add("MLP output norm input", post_norm, false);
    add(
        "MLP output norm fp32 copy and scaled output (eager)",
        post_eager_norm,
        false,
    );
    if dropout {
        add("MLP dropout mask", h * rep, false);
    }
    // Transformer Engine keeps the fp8 casts of the GEMM inputs for the backward
    if layout.transformer_engine_fp8() {
        for s in v.iter_mut().filter(|s| s.for_weight_grad) {
            s.bytes /= 2.0;
        }
    }
    let recompute_working: f64 = v.iter().map(|s| s.bytes).sum();
    // output gradients the weight-gradient GEMMs read: of QKV, out-projection, MLP up, down
    let up_width = gate * ffn;
    let out_grads = e * s * b * (heads * hd + 2.0 * kv_heads * hd)
        + e * h * rep
        + e * s * b * up_width
        + e * h * rep;
    let gemm_inputs: f64 = v
        .iter()
        .filter(|s| s.for_weight_grad)
        .map(|s| s.bytes)
        .sum();
    let stored = match layout.recompute {
        Recompute::None => v,
        Recompute::Selective => v
            .into_iter()
            .filter(|s| !rebuilt(arch, layout, s.what))
            .collect(),
        Recompute::Full => vec![Stored {
            what: "layer input (checkpoint)",
            bytes: e * h * rep,
            for_weight_grad: false,
        }],
        Recompute::SelectiveOp => op_checkpointed(layout, h, [q, kv], s * b, heads, ffn, gate),
        // every other layer keeps all of it, the rest their input: half of each per layer
        Recompute::SelectiveLayer => v
            .into_iter()
            .map(|s| Stored {
                bytes: s.bytes / 2.0,
                ..s
            })
            .chain([Stored {
                what: "layer input (checkpoint, every other layer)",
                bytes: e / 2.0 * h * rep,
                for_weight_grad: false,
            }])
            .collect(),
    };
    // a backward that recomputes rebuilds one layer's intermediates at a time
    let rebuilds = full
        || matches!(
            layout.recompute,
            Recompute::SelectiveOp | Recompute::SelectiveLayer
        );
    let for_weight_grad = match layout.recompute {
        Recompute::Full => 0.0,
        // what the split backward holds of the layers that stored everything
        Recompute::SelectiveLayer => (gemm_inputs + out_grads) / 2.0,
        _ => gemm_inputs + out_grads,
    };
    LayerActivations {
        stored,
        for_weight_grad,
        recompute_working: if rebuilds { recompute_working } else { 0.0 },
    }
}

/// What op-level selective checkpointing keeps of a dense layer (see
/// `plan::layer::op_selective_recompute`): its input; the outputs of the 1st, 3rd, 5th and 7th
/// of its matrix multiplies — the query and value projections, the gated MLP's gate
/// projection and its down projection (an ungated MLP's up projection), a row-parallel
/// output at full width before its reduce-scatter; the attention kernel's output and fp32
/// log-sum-exp; the sequence-parallel reduce-scatters' outputs. `h`: elements of the micro-batch's
/// hidden state (s·b·h), `q` and `kv` the query's and one of key and value's bytes,
/// `tokens` the micro-batch's, `heads` and `ffn` the query heads and MLP width on this rank,
/// `gate` 2 for a gated MLP.
fn op_checkpointed(
    layout: &Layout,
    h: f64,
    [q, kv]: [f64; 2],
    tokens: f64,
    heads: f64,
    ffn: f64,
    gate: f64,
) -> Vec<Stored> {
    let sp_h = if layout.sequence_parallel {
        h / layout.tp as f64
    } else {
        h
    };
    let e = layout.activation_dtype().bytes();
    let mut kept = vec![
        ("layer input (checkpoint)", e * sp_h),
        ("query projection output (saved matmul)", q),
        ("value projection output (saved matmul)", kv),
        (
            "attention output and log-sum-exp (saved kernel)",
            q + 4.0 * tokens * heads,
        ),
    ];
    if gate > 1.0 {
        kept.push((
            "MLP gate projection output (saved matmul)",
            e * tokens * ffn,
        ));
        kept.push(("MLP down projection output (saved matmul)", e * h));
    } else {
        kept.push(("MLP up projection output (saved matmul)", e * tokens * ffn));
    }
    // (a layout with sequence parallelism has tp > 1)
    if layout.sequence_parallel {
        kept.push(("reduce-scatter outputs (saved collectives)", 2.0 * e * sp_h));
    }
    kept.into_iter()
        .map(|(what, bytes)| Stored {
            what,
            bytes,
            for_weight_grad: false,
        })
        .collect()
}

/// Whether selective recomputation rebuilds the tensor `what` instead of keeping it: each
/// module keeps its input and drops what it makes (Megatron-Core's `--recompute-modules`; a
/// dense MLP's tensors are the shared experts' in an expert layer).
fn rebuilt(arch: &Arch, layout: &Layout, what: &str) -> bool {
    use crate::workload::RecomputeModule as M;
    let modules: &[M] = match what {
        "soft-capped scores (tanh output)"
        | "softmax output"
        | "attention dropout mask"
        | "attention dropout output"
        | "softmax log-sum-exp (fp32)" => &[M::CoreAttn],
        "QKV input (norm output)"
        | "MLP input (norm output)"
        | "input norm fp32 copy and scaled output (eager)"
        | "post-attention norm fp32 copy and scaled output (eager)" => &[M::Layernorm],
        // (a layout names mla_up_proj only for a model with latent attention)
        "Q, K and V" => &[M::MlaUpProj],
        "GELU input"
        | "squared-ReLU input"
        | "SwiGLU input (gate and up)"
        | "GeGLU input (gate and up)"
        | "MLP down input (activation output)"
        | "SiLU output (eager)" => {
            if arch.moe.is_none() {
                &[M::Mlp]
            } else {
                &[M::SharedExperts, M::Moe]
            }
        }
        "expert down input (activation output)" => &[M::MoeAct, M::Moe],
        "router probabilities (fp32)"
        | "expert input (permuted tokens)"
        | "expert activation input" => &[M::Moe],
        _ => &[],
    };
    modules.iter().any(|&m| layout.recomputes(m))
}

/// Per micro-batch, what the rank with the embedding stores besides its layers: the token ids
/// (int64) and the embedding dropout mask.
pub fn embedding_extra(arch: &Arch, layout: &Layout) -> f64 {
    let rep = if layout.sequence_parallel {
        1.0 / layout.tp as f64
    } else {
        1.0
    };
    let tokens = (layout.local_seq_len() * layout.micro_batch) as f64;
    8.0 * tokens
        + if arch.dropout {
            sbh(arch, layout) * rep
        } else {
            0.0
        }
}

/// Per micro-batch, what the rank with the LM head stores: the final norm's and the head's
/// inputs and what the cross-entropy keeps for its backward — the fp32 logits (Megatron's
/// vocabulary-parallel one) or log-softmax (PyTorch's), or the 16-bit logits a fused one
/// overwrote with their gradient — and, where the logits are soft-capped, the tanh's output.
pub fn head_extra(arch: &Arch, layout: &Layout) -> f64 {
    let t = layout.tp as f64;
    let rep = if layout.sequence_parallel {
        1.0 / t
    } else {
        1.0
    };
    let tokens = (layout.local_seq_len() * layout.micro_batch) as f64;
    let e = layout.activation_dtype().bytes();
    let (loss_kept, _) = loss_bytes_per_logit(layout.cross_entropy, e);
    // soft-capped logits: the tanh keeps its output for its backward
    let kept = loss_kept + if arch.final_softcap { e } else { 0.0 };
    2.0 * e * sbh(arch, layout) * rep + kept * tokens * arch.padded_vocab(layout.tp) as f64 / t
}

/// Bytes a logit each loss keeps for its backward and holds beside them at its peak (see
/// `head_extra` and `head_transient`), the logits `e` bytes an element (in fp32 Megatron's
/// loss has no 16-bit logits to convert).
fn loss_bytes_per_logit(loss: crate::workload::CrossEntropy, e: f64) -> (f64, f64) {
    use crate::workload::CrossEntropy::*;
    match loss {
        VocabParallel => (4.0, if e < 4.0 { e } else { 0.0 }),
        Pytorch => (4.0, 8.0),
        Fused => (e, 0.0),
    }
}

/// What the loss holds besides what it keeps, at its peak: the 16-bit logits the LM head
/// produced while Megatron's loss converts them, the two fp32 gradients PyTorch's
/// cross-entropy holds at once in its backward, or nothing for a fused one, which works in
/// place on the 16-bit logits it keeps (`CrossEntropy`): transient.
pub fn head_transient(arch: &Arch, layout: &Layout) -> f64 {
    let tokens = (layout.local_seq_len() * layout.micro_batch) as f64;
    let (_, bytes) = loss_bytes_per_logit(layout.cross_entropy, layout.activation_dtype().bytes());
    bytes * tokens * arch.padded_vocab(layout.tp) as f64 / layout.tp as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{ArchSpec, ParallelSpec};

    use crate::hardware::dgx_h100_without_models as cluster;

    /// GPT-3 175B as Korthikanti et al. model it: unfused attention, dropout, GELU MLP of 4·h.
    fn gpt3_as_in_the_paper() -> Arch {
        let mut spec: ArchSpec = crate::workload::presets::preset("gpt3-175b").unwrap();
        spec.attention = AttentionImpl::Unfused;
        spec.dropout = true;
        spec.validate("gpt3").unwrap()
    }

    fn spec(tp: u64, sp: bool, recompute: Recompute) -> ParallelSpec {
        ParallelSpec {
            tp: Some(tp),
            pp: Some(8),
            dp: Some(1),
            micro_batch: Some(1),
            micro_batches: Some(8),
            sequence_parallel: Some(sp),
            recompute: Some(recompute),
            ..Default::default()
        }
    }

    fn layout(arch: &Arch, tp: u64, sp: bool, recompute: Recompute) -> Layout {
        Layout::new(&spec(tp, sp, recompute), arch, &cluster()).unwrap()
    }

    /// Recomputing the MLP frees its 4·h-wide activation input and output (Korthikanti's
    /// 8·sbh + 8·sbh of a GELU MLP; its input and dropout mask stay), and the norms their two
    /// outputs (2·sbh each); core_attn alone is the selective recomputation.
    #[test]
    fn recompute_modules_free_what_their_modules_make() {
        use crate::workload::RecomputeModule as M;
        let a = gpt3_as_in_the_paper();
        let sbh = 2048.0 * 12288.0;
        let with = |modules: Vec<M>| {
            let mut l = layout(&a, 1, false, Recompute::Selective);
            l.recompute_modules = Some(modules);
            layer(&a, &l).total()
        };
        let selective = layer(&a, &layout(&a, 1, false, Recompute::Selective)).total();
        assert_eq!(with(vec![M::CoreAttn]), selective);
        assert_eq!(with(vec![M::CoreAttn, M::Mlp]), selective - 16.0 * sbh);
        assert_eq!(with(vec![M::CoreAttn, M::Layernorm]), selective - 4.0 * sbh);
    }

    /// torchtitan's op-level checkpointing on Llama 3 8B (h 4096, 32 query and 8 key-value
    /// heads of 128, SwiGLU of 14,336): per token a layer keeps its input (2h), the query (2h)
    /// and value (2·1024) projections, the attention output (2h) and its log-sum-exp (4 bytes
    /// a head), the gate projection (2·14,336) and the down projection (2h): ≈ 62 KiB against
    /// Megatron's selective ≈ 136 KiB; the backward rebuilds one layer at a time.
    #[test]
    fn op_level_checkpointing_keeps_every_other_matmul_and_the_attention() {
        let a = Arch::resolve("llama3-8b").unwrap();
        let per_token = |r| {
            let lay = layout(&a, 1, false, r);
            let tokens = lay.local_seq_len() as f64;
            let l = layer(&a, &lay);
            (l.total() / tokens, l.recompute_working / tokens)
        };
        let (kept, working) = per_token(Recompute::SelectiveOp);
        let h = 4096.0;
        assert_eq!(
            kept,
            2.0 * h + 2.0 * h + 2.0 * 1024.0 + 2.0 * h + 4.0 * 32.0 + 2.0 * 14336.0 + 2.0 * h
        );
        let (selective, _) = per_token(Recompute::Selective);
        let (none, _) = per_token(Recompute::None);
        assert!(kept < 0.5 * selective, "{kept} {selective}");
        assert_eq!(working, none);
        // under tensor and sequence parallelism the matmul outputs split over t, the layer
        // input and the reduce-scatters' outputs by the sequence, and the down projection's
        // partial sums stay full width until their reduce-scatter
        let lay = layout(&a, 4, true, Recompute::SelectiveOp);
        let l = layer(&a, &lay);
        let t = 4.0;
        assert_eq!(
            l.total() / lay.local_seq_len() as f64,
            2.0 * h / t
                + (2.0 * h + 2.0 * 1024.0 + 2.0 * h + 4.0 * 32.0 + 2.0 * 14336.0) / t
                + 2.0 * h
                + 2.0 * 2.0 * h / t
        );
    }

    /// At the loss's backward Megatron's vocabulary-parallel cross-entropy holds the 16-bit
    /// logits beside the kept fp32 ones (2 bytes a token and vocabulary entry), PyTorch's two
    /// fp32 gradients (8), each rank its vocabulary share.
    #[test]
    fn pytorchs_cross_entropy_holds_two_fp32_gradients_of_the_logits() {
        use crate::workload::CrossEntropy;
        let a = Arch::resolve("llama3-8b").unwrap();
        let transient = |tp, ce| {
            let mut l = layout(&a, tp, tp > 1, Recompute::None);
            l.cross_entropy = ce;
            head_transient(&a, &l)
        };
        let entries = 8192.0 * 128256.0;
        assert_eq!(transient(1, CrossEntropy::VocabParallel), 2.0 * entries);
        assert_eq!(transient(1, CrossEntropy::Pytorch), 8.0 * entries);
        // (the vocabulary padded to a multiple of 128 · tp)
        let padded = 8192.0 * a.padded_vocab(8) as f64;
        assert_eq!(transient(8, CrossEntropy::Pytorch), 8.0 * padded / 8.0);
    }

    /// A fused cross-entropy writes the gradient over the 16-bit logits in place: it keeps
    /// those (2 bytes a token and vocabulary entry, not the 4 of fp32 logits) and holds nothing
    /// beside them.
    #[test]
    fn a_fused_cross_entropy_keeps_only_the_16_bit_logits() {
        use crate::workload::CrossEntropy;
        let a = Arch::resolve("llama3-8b").unwrap();
        let with = |ce| {
            let mut l = layout(&a, 2, true, Recompute::None);
            l.cross_entropy = ce;
            (head_extra(&a, &l), head_transient(&a, &l))
        };
        let logits = 8192.0 * a.padded_vocab(2) as f64 / 2.0;
        let (unfused, unfused_transient) = with(CrossEntropy::VocabParallel);
        let (fused, fused_transient) = with(CrossEntropy::Fused);
        assert_eq!(unfused - fused, 2.0 * logits);
        assert_eq!((unfused_transient, fused_transient), (2.0 * logits, 0.0));
    }

    #[test]
    fn korthikanti_table_2_exactly() {
        let a = gpt3_as_in_the_paper();
        let (s, b, h, heads) = (2048.0, 1.0, 12288.0, 96.0);
        let sbh = s * b * h;
        let attn = 5.0 * heads * s / h;
        let bytes = |tp, sp, r| layer(&a, &layout(&a, tp, sp, r)).total();
        // no parallelism: sbh(34 + 5as/h)
        assert_eq!(bytes(1, false, Recompute::None), sbh * (34.0 + attn));
        // tensor parallel: sbh(10 + 24/t + 5as/(ht))
        assert_eq!(
            bytes(8, false, Recompute::None),
            sbh * (10.0 + 24.0 / 8.0 + attn / 8.0)
        );
        // tensor + sequence parallel: sbh/t (34 + 5as/h)
        assert_eq!(bytes(8, true, Recompute::None), sbh / 8.0 * (34.0 + attn));
        // selective recompute: 34 sbh/t; tensor parallel alone sbh(10 + 24/t)
        assert_eq!(bytes(8, true, Recompute::Selective), 34.0 * sbh / 8.0);
        assert_eq!(
            bytes(8, false, Recompute::Selective),
            sbh * (10.0 + 24.0 / 8.0)
        );
        // full recompute keeps the layer input: 2 sbh (split by t under sequence parallelism)
        assert_eq!(bytes(8, false, Recompute::Full), 2.0 * sbh);
        assert_eq!(bytes(8, true, Recompute::Full), 2.0 * sbh / 8.0);
    }

    /// Training in fp32 every activation element takes 4 bytes: Korthikanti's 34·sbh of 16-bit
    /// tensors and 1-byte masks become 2·(34 − 2)·sbh + 2·sbh (the attention-out and MLP
    /// dropout masks keep their byte), the 5·a·s/h of scores 2·(4·a·s/h) + a·s/h (the
    /// softmax output and the dropout output double, the mask does not); the fp32 logits of
    /// the loss stay 4 bytes and need no 16-bit copy converted.
    #[test]
    fn fp32_training_stores_four_byte_activations() {
        let a = gpt3_as_in_the_paper();
        let (s, h, heads) = (2048.0, 12288.0, 96.0);
        let sbh = s * h;
        let with = |dtype| {
            let mut l = layout(&a, 1, false, Recompute::None);
            l.dtype = dtype;
            l
        };
        let fp32 = with(crate::ops::Dtype::Fp32);
        let scores = heads * s / h;
        assert_eq!(
            layer(&a, &fp32).total(),
            sbh * (2.0 * 32.0 + 2.0 + 2.0 * 4.0 * scores + scores)
        );
        let bf16 = with(crate::ops::Dtype::Bf16);
        assert_eq!(
            head_extra(&a, &fp32) - head_extra(&a, &bf16),
            2.0 * 2.0 * sbh
        );
        assert_eq!(head_transient(&a, &fp32), 0.0);
        assert!(head_transient(&a, &bf16) > 0.0);
    }

    #[test]
    fn megatron_theoretical_formula_under_its_assumptions() {
        // Megatron-LM's theoretical_memory_usage: sbh(18 + 4·ffn/h) per layer, selective
        // recompute and sequence parallelism, divided by t
        let a = gpt3_as_in_the_paper();
        let l = layout(&a, 8, true, Recompute::Selective);
        let sbh = 2048.0 * 12288.0;
        let ffn_over_h = 49152.0 / 12288.0;
        assert_eq!(layer(&a, &l).total(), sbh * (18.0 + 4.0 * ffn_over_h) / 8.0);
    }

    #[test]
    fn context_parallel_ranks_store_their_share_of_the_sequence() {
        // Megatron's per-layer sbh(18 + 4·ffn/h)/t (selective recompute, sequence parallel,
        // dropout masks) with each of cp ranks holding s/cp tokens: sbh(18 + 4·ffn/h)/(t·cp);
        // context parallelism needs fused attention, whose stored tensors under selective
        // recompute are the same 34 sbh/t
        let mut a = gpt3_as_in_the_paper();
        a.attention = AttentionImpl::Flash;
        let with_cp = |cp: u64| {
            let s = ParallelSpec {
                tp: Some(8),
                pp: Some(8),
                dp: Some(1),
                cp: Some(cp),
                micro_batch: Some(1),
                micro_batches: Some(8),
                seq_len: Some(16384),
                sequence_parallel: Some(true),
                recompute: Some(Recompute::Selective),
                ..Default::default()
            };
            Layout::new(&s, &a, &cluster()).unwrap()
        };
        let sbh = 16384.0 * 12288.0;
        for cp in [1u64, 2, 4, 8] {
            let stored = layer(&a, &with_cp(cp)).total();
            assert_eq!(
                stored,
                sbh * (18.0 + 4.0 * 4.0) / (8.0 * cp as f64),
                "cp {cp}"
            );
        }
        // and every term scales: cp 4 at 16k stores what cp 1 stores at 4k
        let mut short = with_cp(1);
        short.seq_len = 4096;
        assert_eq!(layer(&a, &with_cp(4)).total(), layer(&a, &short).total());
    }

    #[test]
    fn flash_attention_and_swiglu_change_the_named_terms() {
        let a = crate::workload::Arch::resolve("llama2-70b").unwrap();
        let l = layout(&a, 8, true, Recompute::None);
        let acts = layer(&a, &l);
        let (s, h) = (4096.0, 8192.0);
        let sbh = s * h;
        // norms 2+2, QKV and MLP inputs 2+2, all /t; Q and output 2·sbh/t each; K and V with
        // 8 of 64 heads; fp32 log-sum-exp 4·s·heads/t; SwiGLU input 4·s·ffn/t and its
        // output 2·s·ffn/t; no dropout masks
        let expected = (8.0 * sbh
            + 2.0 * sbh
            + 2.0 * sbh
            + 2.0 * 2.0 * s * 8.0 * 128.0
            + 4.0 * s * 64.0
            + 6.0 * s * 28672.0)
            / 8.0;
        assert!(
            (acts.total() - expected).abs() < 1.0,
            "{} {expected}",
            acts.total()
        );
    }

    /// Gemma 2's parts on Llama 2 70B (tp 8, sequence parallel, 4,096 tokens): the two norms
    /// on the attention's and MLP's outputs keep their 16-bit inputs (2·sbh/t each; eagerly,
    /// 4 more bytes an element each); an unfused attention's soft cap keeps the tanh's 16-bit
    /// output (8 heads × 4,096² a rank), which recomputing the attention core frees; soft-capped
    /// logits keep it too (4,096 × 32,768 / 8 a rank: the 32,000 words padded to a multiple
    /// of 128 · 8).
    #[test]
    fn gemma_2_parts_keep_their_inputs_and_tanh_outputs() {
        let a = crate::workload::Arch::resolve("llama2-70b").unwrap();
        let (s, h) = (4096.0, 8192.0);
        let stored = |arch: &Arch, recompute, elementwise| {
            let mut l = layout(arch, 8, true, recompute);
            l.elementwise = elementwise;
            layer(arch, &l).total()
        };
        // what `with` stores beyond `without`
        let gained = |with: &Arch, without: &Arch, recompute, elementwise| {
            stored(with, recompute, elementwise) - stored(without, recompute, elementwise)
        };
        let (fused, eager) = (Elementwise::Fused, Elementwise::Eager);
        let post = Arch {
            post_norms: true,
            ..a.clone()
        };
        let norm_input = 2.0 * s * h / 8.0;
        assert_eq!(gained(&post, &a, Recompute::None, fused), 2.0 * norm_input);
        assert_eq!(
            gained(&post, &a, Recompute::None, eager),
            2.0 * (norm_input + 4.0 * s * h / 8.0)
        );
        assert_eq!(gained(&post, &a, Recompute::Full, fused), 0.0);
        let unfused = |softcap| Arch {
            attention: AttentionImpl::Unfused,
            attention_softcap: softcap,
            ..a.clone()
        };
        let (capped, plain) = (unfused(true), unfused(false));
        let tanh = 2.0 * 8.0 * s * s;
        assert_eq!(gained(&capped, &plain, Recompute::None, fused), tanh);
        assert_eq!(gained(&capped, &plain, Recompute::Selective, fused), 0.0);
        let logits_capped = Arch {
            final_softcap: true,
            ..a.clone()
        };
        let l = layout(&a, 8, true, Recompute::None);
        let logits = s * 32768.0 / 8.0;
        assert_eq!(
            head_extra(&logits_capped, &l) - head_extra(&a, &l),
            2.0 * logits
        );
    }

    /// OLMo 2's block on Llama 2 70B (tp 8, sequence parallel, 4,096 tokens): without norms
    /// before the attention and the MLP, their inputs (2·sbh/t each) and, run eagerly, their
    /// fp32 copies and scaled outputs (4·sbh/t each) are not kept; the attention and the MLP
    /// keep the residual stream they read instead of a norm's output, the same bytes, which
    /// recomputing the norms no longer frees.
    #[test]
    fn olmo_2_keeps_no_inputs_of_norms_it_does_not_run() {
        let a = crate::workload::Arch::resolve("llama2-70b").unwrap();
        let (s, h) = (4096.0, 8192.0);
        let post = Arch {
            post_norms: true,
            ..a.clone()
        };
        let olmo = Arch {
            pre_norms: false,
            ..post.clone()
        };
        let stored = |arch: &Arch, recompute, elementwise| {
            let mut l = layout(arch, 8, true, recompute);
            l.elementwise = elementwise;
            l.recompute_modules = Some(vec![crate::workload::RecomputeModule::Layernorm]);
            layer(arch, &l).total()
        };
        let norm_input = 2.0 * s * h / 8.0;
        let eager_copies = 4.0 * s * h / 8.0;
        for (recompute, elementwise, saved) in [
            (Recompute::None, Elementwise::Fused, 2.0 * norm_input),
            (
                Recompute::None,
                Elementwise::Eager,
                2.0 * (norm_input + eager_copies),
            ),
            (Recompute::Full, Elementwise::Fused, 0.0),
        ] {
            assert_eq!(
                stored(&post, recompute, elementwise) - stored(&olmo, recompute, elementwise),
                saved,
                "{recompute:?} {elementwise:?}"
            );
        }
        // recomputing the norms: the pre-norm block keeps their inputs and rebuilds their
        // outputs; OLMo 2 keeps what its attention and MLP read, nothing to rebuild — the same
        assert_eq!(
            stored(&post, Recompute::Selective, Elementwise::Fused),
            stored(&olmo, Recompute::Selective, Elementwise::Fused)
        );
    }

    /// Run eagerly, each RMSNorm keeps its fp32 input copy and 16-bit scaled output (4 + 2
    /// bytes an element where a fused one keeps its 16-bit input, 2) and the gated MLP SiLU's
    /// output (2 bytes a row element of the MLP); recomputation frees them with the rest.
    #[test]
    fn eager_norms_and_activation_keep_their_intermediates() {
        let a = crate::workload::Arch::resolve("llama2-70b").unwrap();
        let with = |recompute, elementwise| {
            let mut l = layout(&a, 8, true, recompute);
            l.elementwise = elementwise;
            layer(&a, &l).total()
        };
        let (s, h, ffn) = (4096.0, 8192.0, 28672.0);
        let extra = (2.0 * 4.0 * s * h + 2.0 * s * ffn) / 8.0;
        let (fused, eager) = (Elementwise::Fused, Elementwise::Eager);
        let gained = with(Recompute::None, eager) - with(Recompute::None, fused);
        assert!((gained - extra).abs() < 1.0, "{gained} {extra}");
        assert_eq!(with(Recompute::Full, eager), with(Recompute::Full, fused));
        assert_eq!(
            with(Recompute::SelectiveOp, eager),
            with(Recompute::SelectiveOp, fused)
        );
    }

    /// Checkpointing every other layer stores, per layer, half of what a layer keeps without
    /// recomputation and half of a checkpointed layer's input.
    #[test]
    fn every_other_layer_stores_the_mean_of_both_kinds() {
        let a = crate::workload::Arch::resolve("llama2-70b").unwrap();
        let total = |r| layer(&a, &layout(&a, 8, true, r));
        let half = total(Recompute::SelectiveLayer);
        let mean = (total(Recompute::None).total() + total(Recompute::Full).total()) / 2.0;
        assert!((half.total() - mean).abs() < 1.0, "{} {mean}", half.total());
        assert_eq!(
            half.recompute_working,
            total(Recompute::Full).recompute_working
        );
    }

    /// Llama 3 8B's shape with DeepSeek-V3's latent attention (query rank 1,536, key-value
    /// rank 512, heads of 128 + 64 query/key and 128 value dimensions).
    fn latent_attention() -> Arch {
        let mut spec: ArchSpec = crate::workload::presets::preset("llama3-8b").unwrap();
        spec.kv_heads = Some(32);
        spec.mla = Some(crate::workload::MlaSpec::deepseek_v3());
        spec.validate("latent").unwrap()
    }

    /// Llama 3 8B's shape with a mixture of 16 experts of 1,024, the top 2 routed, and two
    /// shared experts (2,048 together) in every layer.
    fn experts() -> Arch {
        let mut spec: ArchSpec = crate::workload::presets::preset("llama3-8b").unwrap();
        spec.moe = Some(crate::workload::MoeSpec {
            experts: 16,
            top_k: 2,
            expert_ffn: 1024,
            shared_experts: 2,
            shared_ffn: None,
            dense_layers: 0,
            every: 1,
            offset: 0,
            groups: 0,
            topk_groups: 0,
        });
        spec.validate("experts").unwrap()
    }

    /// The names of what a layer stores.
    fn names(acts: &LayerActivations) -> Vec<&'static str> {
        acts.stored.iter().map(|s| s.what).collect()
    }

    /// The bytes of the stored tensor named `what` (which must be there).
    fn stored(acts: &LayerActivations, what: &str) -> f64 {
        let found = acts.stored.iter().find(|s| s.what == what);
        found
            .unwrap_or_else(|| panic!("no {what} in {:?}", acts.stored))
            .bytes
    }

    /// A micro-batch of b sequences stores b times what one sequence stores, term by term —
    /// what the layer keeps, what the split backward's weight-gradient pass holds, what a
    /// recomputing backward rebuilds, the embedding's and the head's extras — whatever the
    /// attention, MLP or recomputation (every other test takes one sequence a micro-batch).
    #[test]
    fn a_micro_batch_of_b_sequences_stores_b_times_one() {
        let archs = [
            gpt3_as_in_the_paper(),
            Arch::resolve("llama3-8b").unwrap(),
            crate::workload::presets::mixtral_8x7b(),
            latent_attention(),
        ];
        let modes = [
            Recompute::None,
            Recompute::Selective,
            Recompute::Full,
            Recompute::SelectiveOp,
            Recompute::SelectiveLayer,
        ];
        let mut layouts = Vec::new();
        for a in &archs {
            for recompute in modes {
                for kernels in [Elementwise::Fused, Elementwise::Eager] {
                    // op-level checkpointing is costed for torchtitan's Llama only
                    if let Ok(mut lay) = Layout::new(&spec(2, true, recompute), a, &cluster()) {
                        lay.elementwise = kernels;
                        layouts.push((a, lay));
                    }
                }
            }
        }
        assert_eq!(layouts.len(), 2 * (4 * 4 + 1));
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs();
        let extras = |a: &Arch, l: &Layout| {
            [
                embedding_extra(a, l),
                head_extra(a, l),
                head_transient(a, l),
            ]
        };
        for (a, mut lay) in layouts {
            let case = format!("{} {:?} {:?}", a.name, lay.recompute, lay.elementwise);
            let (one, one_extras) = (layer(a, &lay), extras(a, &lay));
            lay.micro_batch = 4;
            let four = layer(a, &lay);
            assert!(one.total() > 0.0, "{case}");
            assert_eq!(one.stored.len(), four.stored.len(), "{case}");
            for (x, y) in one.stored.iter().zip(&four.stored) {
                assert!(close(y.bytes, 4.0 * x.bytes), "{case}: {x:?} {y:?}");
            }
            let weight_grad = (four.for_weight_grad, one.for_weight_grad);
            assert!(close(weight_grad.0, 4.0 * weight_grad.1), "{case}");
            let working = (four.recompute_working, one.recompute_working);
            assert!(close(working.0, 4.0 * working.1), "{case}");
            for (x, y) in one_extras.iter().zip(extras(a, &lay)) {
                assert!(close(y, 4.0 * x), "{case}");
            }
        }
    }

    /// What the split backward's weight-gradient pass holds of the paper's GPT-3 layer, by
    /// hand: its four GEMMs' inputs (QKV and MLP inputs 2·sbh each, the out-projection's
    /// 2·sbh, the MLP down projection's 2·4·sbh: 14·sbh) and their output gradients (QKV's
    /// 2·3·sbh, the out-projection's 2·sbh, MLP up's 2·4·sbh, down's 2·sbh: 18·sbh), each
    /// split over t under tensor and sequence parallelism; half of it checkpointing every
    /// other layer, none under full recomputation; Transformer Engine's fp8 keeps the GEMM
    /// inputs as 1-byte casts. A backward rebuilds the whole layer where it recomputes one
    /// (full, every other layer), nothing otherwise.
    #[test]
    fn the_weight_gradient_pass_holds_the_gemm_inputs_and_output_gradients() {
        let a = gpt3_as_in_the_paper();
        let sbh = 2048.0 * 12288.0;
        let everything = sbh * (34.0 + 5.0 * 96.0 * 2048.0 / 12288.0);
        let at = |recompute| layer(&a, &layout(&a, 1, false, recompute));
        let none = at(Recompute::None);
        assert_eq!(
            (none.for_weight_grad, none.recompute_working),
            (32.0 * sbh, 0.0)
        );
        let every_other = at(Recompute::SelectiveLayer);
        assert_eq!(every_other.for_weight_grad, 16.0 * sbh);
        assert_eq!(every_other.recompute_working, everything);
        let full = at(Recompute::Full);
        assert_eq!(
            (full.for_weight_grad, full.recompute_working),
            (0.0, everything)
        );
        assert_eq!(at(Recompute::Selective).recompute_working, 0.0);
        // tensor and sequence parallel: every term split over t
        let split = layer(&a, &layout(&a, 8, true, Recompute::None));
        assert_eq!(split.for_weight_grad, 32.0 * sbh / 8.0);
        let mut fp8 = layout(&a, 1, false, Recompute::None);
        fp8.dtype = crate::ops::Dtype::Fp8;
        fp8.fp8_library = crate::workload::Fp8Library::TransformerEngine;
        let cast = layer(&a, &fp8);
        assert_eq!(cast.for_weight_grad, 25.0 * sbh);
        assert_eq!(cast.total(), everything - 7.0 * sbh);
    }

    /// Past 4,096 tokens, or on rows it cannot block, Megatron's fused softmax refuses the
    /// shape and PyTorch's keeps its output in fp32: 4 bytes a score where the fused kernel
    /// keeps 2 (the paper's rules model the fused kernel throughout).
    #[test]
    fn megatrons_softmax_fallback_keeps_fp32_scores() {
        let a = gpt3_as_in_the_paper();
        let at = |seq: u64, rules| {
            let mut l = layout(&a, 8, true, Recompute::None);
            (l.seq_len, l.rules) = (seq, rules);
            stored(&layer(&a, &l), "softmax output")
        };
        let scores = |seq: f64| 96.0 / 8.0 * seq * seq;
        assert_eq!(at(2048, Rules::Megatron), 2.0 * scores(2048.0));
        assert_eq!(at(8192, Rules::Megatron), 4.0 * scores(8192.0));
        assert_eq!(at(8192, Rules::Paper), 2.0 * scores(8192.0));
        // nor does it take 3 rows of scores (96 heads over tp 32, one sequence), whatever the
        // length: it runs 4 at a time
        let mut l = layout(&a, 32, true, Recompute::None);
        let scores = 96.0 / 32.0 * 2048.0 * 2048.0;
        assert_eq!(stored(&layer(&a, &l), "softmax output"), 4.0 * scores);
        l.micro_batch = 4;
        assert_eq!(stored(&layer(&a, &l), "softmax output"), 2.0 * 4.0 * scores);
    }

    /// Only tensors a layer keeps are listed: nothing of no bytes (no dropout masks without
    /// dropout, no eager intermediates with fused kernels).
    #[test]
    fn a_layer_lists_only_what_it_keeps() {
        let a = Arch::resolve("llama3-8b").unwrap();
        let acts = layer(&a, &layout(&a, 2, true, Recompute::None));
        for s in &acts.stored {
            assert!(s.bytes > 0.0, "{s:?}");
            assert!(
                !s.what.contains("dropout") && !s.what.contains("eager"),
                "{s:?}"
            );
        }
    }

    /// Latent attention keeps the query and key-value latents (the up-projections' inputs),
    /// queries and keys of 192 dimensions a head and values of 128, and an output as wide as
    /// the values: per token and rank of tp 2, 2·(1,536 + 512) + 2·16·(2·192 + 128) +
    /// 2·16·128 bytes.
    #[test]
    fn latent_attention_keeps_its_latents_and_value_wide_outputs() {
        let a = latent_attention();
        assert_eq!(a.head_dim, 192);
        let lay = layout(&a, 2, true, Recompute::None);
        let tokens = lay.local_seq_len() as f64;
        let acts = layer(&a, &lay);
        let per_token = |what| stored(&acts, what) / tokens;
        let latents = "query and key-value latents (norm and up-projection inputs)";
        assert_eq!(per_token(latents), 2.0 * 2.0 * (1536.0 + 512.0));
        assert_eq!(per_token("Q, K and V"), 2.0 * 16.0 * (2.0 * 192.0 + 128.0));
        let out = "attention output (out-projection input)";
        assert_eq!(per_token(out), 2.0 * 16.0 * 128.0);
    }

    /// Each MLP keeps its activation's input (two projections wide where gated) and the down
    /// projection's input: per token (two sequences a micro-batch) and rank of tp 2, 2·ffn/2
    /// bytes each, twice that for a gated input.
    #[test]
    fn each_mlp_activation_keeps_its_input_and_the_down_projections() {
        use crate::workload::Activation;
        let cases = [
            (Activation::Gelu, "GELU input", 1.0),
            (Activation::SquaredRelu, "squared-ReLU input", 1.0),
            (Activation::Swiglu, "SwiGLU input (gate and up)", 2.0),
            (Activation::Geglu, "GeGLU input (gate and up)", 2.0),
        ];
        for (activation, input, width) in cases {
            let mut spec: ArchSpec = crate::workload::presets::preset("llama3-8b").unwrap();
            spec.activation = activation;
            let a = spec.validate("llama3-8b").unwrap();
            let mut lay = layout(&a, 2, true, Recompute::None);
            lay.micro_batch = 2;
            let acts = layer(&a, &lay);
            let tokens = (lay.local_seq_len() * lay.micro_batch) as f64;
            let per_token = |what| stored(&acts, what) / tokens;
            let ffn = 14336.0 / 2.0;
            assert_eq!(per_token(input), width * 2.0 * ffn, "{activation:?}");
            let down = "MLP down input (activation output)";
            assert_eq!(per_token(down), 2.0 * ffn, "{activation:?}");
        }
    }

    /// A mixture-of-experts layer keeps, besides its shared experts' MLP, the router's fp32
    /// probabilities (split by the sequence under sequence parallelism) and, for the busiest
    /// expert's share of the k routed copies of the tokens its expert-tensor-parallel group
    /// gathered, the permuted inputs, the gated activation's input and the down projection's
    /// input. By hand: 16 experts, top 2 of 1,024 wide, 2 shared (2,048), tp 2 with sequence
    /// parallelism, a router load of 1.5.
    #[test]
    fn an_expert_layer_keeps_the_routers_and_the_busiest_experts_tensors() {
        let a = experts();
        let (h, t, load) = (4096.0, 2.0, 1.5);
        for (etp, sp) in [(1, true), (2, true), (1, false)] {
            let mut lay = layout(&a, 2, sp, Recompute::None);
            lay.etp = etp;
            let s = lay.local_seq_len() as f64;
            let acts = layer_at(&a, &lay, load);
            let case = format!("etp {etp}, sequence parallel {sp}");
            let per_token = |what| stored(&acts, what) / s;
            // the shared experts as one SwiGLU MLP of 2,048, split over tp
            let shared = 2048.0 / t;
            let swiglu = "SwiGLU input (gate and up)";
            assert_eq!(per_token(swiglu), 2.0 * 2.0 * shared, "{case}");
            let router = if sp { 4.0 * 16.0 / t } else { 4.0 * 16.0 };
            assert_eq!(per_token("router probabilities (fp32)"), router, "{case}");
            // tokens the group gathered: s·etp/t of the sequence-parallel shards, at most s
            let gathered = if sp { (etp as f64 / t).min(1.0) } else { 1.0 };
            let routed = gathered * 2.0 * load;
            let fe = 1024.0 / etp as f64;
            let input = "expert input (permuted tokens)";
            assert_eq!(per_token(input), 2.0 * routed * h, "{case}");
            let activation = "expert activation input";
            assert_eq!(per_token(activation), 2.0 * 2.0 * routed * fe, "{case}");
            let down = "expert down input (activation output)";
            assert_eq!(per_token(down), 2.0 * routed * fe, "{case}");
        }
    }

    /// Recomputing a mixture's modules drops what they make: `moe` the router's probabilities,
    /// the permuted tokens and every expert tensor (and the shared experts', which it runs
    /// too), `moe_act` only the experts' activation outputs; `mla_up_proj` latent attention's
    /// queries, keys and values, which the up-projections rebuild from the kept latents.
    #[test]
    fn recomputed_expert_and_latent_modules_drop_what_they_make() {
        use crate::workload::RecomputeModule as M;
        let with = |a: &Arch, modules: Vec<M>| {
            let mut l = layout(a, 2, true, Recompute::Selective);
            l.recompute_modules = Some(modules);
            names(&layer(a, &l))
        };
        let a = experts();
        let kept = with(&a, vec![M::CoreAttn]);
        let router = [
            "router probabilities (fp32)",
            "expert input (permuted tokens)",
            "expert activation input",
        ];
        let experts_make = ["expert down input (activation output)"];
        let shared = [
            "SwiGLU input (gate and up)",
            "MLP down input (activation output)",
        ];
        for what in router.iter().chain(&experts_make).chain(&shared) {
            assert!(kept.contains(what), "{what}");
        }
        let moe: Vec<&str> = [&router[..], &experts_make, &shared].concat();
        assert_eq!(with(&a, vec![M::CoreAttn, M::Moe]), without(&kept, &moe));
        assert_eq!(
            with(&a, vec![M::CoreAttn, M::MoeAct]),
            without(&kept, &experts_make)
        );
        let a = latent_attention();
        let kept = with(&a, vec![M::CoreAttn]);
        assert!(kept.contains(&"Q, K and V"));
        assert_eq!(
            with(&a, vec![M::CoreAttn, M::MlaUpProj]),
            without(&kept, &["Q, K and V"])
        );
    }

    /// `names` less those `dropped`, in order.
    fn without<'a>(names: &[&'a str], dropped: &[&str]) -> Vec<&'a str> {
        names
            .iter()
            .copied()
            .filter(|w| !dropped.contains(w))
            .collect()
    }

    /// Op-level checkpointing of an ungated MLP keeps its up projection's output in place of
    /// the gate's and the down projection's; without sequence parallelism there are no
    /// reduce-scatters whose outputs to keep. Per token of Llama 3 8B's shape with a GELU MLP
    /// on tp 2, no sequence parallelism: the layer input 2h, the query 2h/2 and value 2·1,024/2
    /// projections, the attention output 2h/2 and log-sum-exp 4·16, the up projection
    /// 2·14,336/2.
    #[test]
    fn op_level_checkpointing_of_an_ungated_mlp_keeps_the_up_projection() {
        let mut spec: ArchSpec = crate::workload::presets::preset("llama3-8b").unwrap();
        spec.activation = crate::workload::Activation::Gelu;
        let a = spec.validate("llama3-8b with GELU").unwrap();
        let lay = layout(&a, 2, false, Recompute::SelectiveOp);
        let acts = layer(&a, &lay);
        assert_eq!(
            names(&acts),
            [
                "layer input (checkpoint)",
                "query projection output (saved matmul)",
                "value projection output (saved matmul)",
                "attention output and log-sum-exp (saved kernel)",
                "MLP up projection output (saved matmul)",
            ]
        );
        let h = 4096.0;
        let per_token = acts.total() / lay.local_seq_len() as f64;
        let expected =
            2.0 * h + (2.0 * h + 2.0 * 1024.0 + 2.0 * h + 4.0 * 32.0 + 2.0 * 14336.0) / 2.0;
        assert_eq!(per_token, expected);
    }

    /// Besides its layers, the first rank keeps the token ids (8 bytes each) and, with
    /// dropout, the embedding's dropout mask (a byte an element, split by the sequence under
    /// sequence parallelism); the last keeps the final norm's and the head's 16-bit inputs and
    /// the vocabulary-parallel loss's fp32 logits of its vocabulary share. By hand for the
    /// paper's GPT-3 on tp 8 with sequence parallelism, and Llama 3 8B (no dropout) on tp 1.
    #[test]
    fn the_first_and_last_ranks_keep_the_tokens_and_the_logits() {
        let a = gpt3_as_in_the_paper();
        let lay = layout(&a, 8, true, Recompute::None);
        let (s, h, t) = (2048.0, 12288.0, 8.0);
        assert_eq!(embedding_extra(&a, &lay), 8.0 * s + s * h / t);
        let vocab = a.padded_vocab(8) as f64;
        assert_eq!(
            head_extra(&a, &lay),
            2.0 * 2.0 * s * h / t + 4.0 * s * vocab / t
        );
        let a = Arch::resolve("llama3-8b").unwrap();
        let lay = layout(&a, 1, false, Recompute::None);
        let (s, h) = (8192.0, 4096.0);
        assert_eq!(embedding_extra(&a, &lay), 8.0 * s);
        let vocab = a.padded_vocab(1) as f64;
        assert_eq!(head_extra(&a, &lay), 2.0 * 2.0 * s * h + 4.0 * s * vocab);
    }
}

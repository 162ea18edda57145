//! Architecture presets.
//!
//! `gpt-20b`, `llama-13b` and `llemma-7b` are the paper's evaluation models as its tool
//! decomposes them (`docs/method.md` §5: GPT-NeoX layers with a 4·hidden GELU MLP, biases, the GPT-2
//! vocabulary of 50,257); the GPT-3 variants are Lumos' Table 1 (head size 128, GPT-3 vocabulary);
//! Llama 2 and Llama 3 follow their public model cards (SwiGLU, RMSNorm, RoPE, GQA where used).

use super::arch::{
    Activation, ArchSpec, AttentionImpl, CausalBlocks, NormKind, Position, QkNormSpan,
};

#[allow(clippy::too_many_arguments)]
fn spec(
    name: &str,
    layers: u64,
    hidden: u64,
    heads: u64,
    kv_heads: u64,
    ffn: u64,
    vocab: u64,
    seq: u64,
    family: Family,
) -> ArchSpec {
    let (norm, activation, attention, position, bias) = match family {
        Family::NeoxFlash => (
            NormKind::Rmsnorm,
            Activation::Gelu,
            AttentionImpl::Flash,
            Position::Rope,
            true,
        ),
        Family::NeoxRms => (
            NormKind::Rmsnorm,
            Activation::Gelu,
            AttentionImpl::Unfused,
            Position::Rope,
            true,
        ),
        Family::NeoxLn => (
            NormKind::Layernorm,
            Activation::Gelu,
            AttentionImpl::Unfused,
            Position::Rope,
            true,
        ),
        Family::Gpt3 => (
            NormKind::Layernorm,
            Activation::Gelu,
            AttentionImpl::Flash,
            Position::Learned,
            true,
        ),
        Family::Llama => (
            NormKind::Rmsnorm,
            Activation::Swiglu,
            AttentionImpl::Flash,
            Position::Rope,
            false,
        ),
    };
    ArchSpec {
        name: name.to_string(),
        layers,
        hidden,
        heads,
        kv_heads: Some(kv_heads),
        head_dim: None,
        ffn_hidden: Some(ffn),
        vocab,
        vocab_divisible_by: None,
        norm,
        activation,
        tied_embeddings: false,
        attention,
        causal_blocks: CausalBlocks::Skipped,
        position,
        linear_bias: bias,
        qkv_bias: false,
        qk_norm: false,
        qk_norm_span: QkNormSpan::Head,
        pre_norms: true,
        post_norms: false,
        scaled_embeddings: false,
        attention_softcap: false,
        final_softcap: false,
        sliding_window: None,
        global_attention_every: None,
        chunked_attention: false,
        moe: None,
        mla: None,
        // the paper's tool counts two parameter vectors per norm ("2 norms of 2·dim")
        norm_bias: Some(matches!(
            family,
            Family::NeoxFlash | Family::NeoxRms | Family::NeoxLn | Family::Gpt3
        )),
        seq_len: Some(seq),
        // GPT-3 trained with 0.1 dropout (Brown et al. 2020, Megatron's GPT-3 recipes); the
        // others without
        dropout: matches!(family, Family::Gpt3),
    }
}

#[derive(Clone, Copy)]
enum Family {
    NeoxFlash,
    NeoxRms,
    NeoxLn,
    Gpt3,
    Llama,
}

const GPT2_VOCAB: u64 = 50257;

fn all() -> Vec<ArchSpec> {
    use Family::*;
    vec![
        spec(
            "gpt-20b",
            44,
            6144,
            64,
            64,
            4 * 6144,
            GPT2_VOCAB,
            2048,
            NeoxLn,
        ),
        spec(
            "llama-13b",
            40,
            5120,
            40,
            40,
            4 * 5120,
            GPT2_VOCAB,
            2048,
            NeoxRms,
        ),
        spec(
            "llemma-7b",
            32,
            4096,
            32,
            32,
            4 * 4096,
            GPT2_VOCAB,
            4096,
            NeoxFlash,
        ),
        spec("gpt3-15b", 48, 6144, 48, 48, 12288, GPT2_VOCAB, 2048, Gpt3),
        spec("gpt3-44b", 48, 12288, 96, 96, 24576, GPT2_VOCAB, 2048, Gpt3),
        spec(
            "gpt3-117b",
            96,
            12288,
            96,
            96,
            24576,
            GPT2_VOCAB,
            2048,
            Gpt3,
        ),
        spec(
            "gpt3-175b",
            96,
            12288,
            96,
            96,
            49152,
            GPT2_VOCAB,
            2048,
            Gpt3,
        ),
        spec("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096, Llama),
        spec("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096, Llama),
        spec("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096, Llama),
        spec("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, Llama),
        spec("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192, Llama),
        spec(
            "llama3-405b",
            126,
            16384,
            128,
            8,
            53248,
            128256,
            8192,
            Llama,
        ),
    ]
}

pub fn preset(name: &str) -> Option<ArchSpec> {
    let key = name.to_ascii_lowercase().replace(['_', '.'], "-");
    all().into_iter().find(|s| s.name == key)
}

pub fn names() -> Vec<String> {
    all().into_iter().map(|s| s.name).collect()
}

/// Mixtral 8×7B as mistralai/Mixtral-8x7B-v0.1's config.json gives it: for the tests of the
/// expert code.
#[cfg(test)]
pub(crate) fn mixtral_8x7b() -> crate::workload::Arch {
    let mut spec = preset("llama2-7b").expect("a preset");
    spec.name = "mixtral-8x7b".into();
    spec.kv_heads = Some(8);
    spec.ffn_hidden = Some(14336);
    spec.moe = Some(crate::workload::MoeSpec {
        experts: 8,
        top_k: 2,
        expert_ffn: 14336,
        shared_experts: 0,
        shared_ffn: None,
        dense_layers: 0,
        every: 1,
        offset: 0,
        groups: 0,
        topk_groups: 0,
    });
    spec.validate("mixtral").expect("a valid architecture")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_validates() {
        for s in all() {
            let name = s.name.clone();
            s.validate(&name).unwrap();
        }
    }

    #[test]
    fn lookup_is_forgiving_about_spelling() {
        assert!(preset("Llama2_7B").is_some());
        assert!(preset("GPT3-175B").is_some());
    }
}

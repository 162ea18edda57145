//! Reading a Hugging Face `config.json` into an `ArchSpec`: the LLaMA family and its
//! descendants (llama, mistral, qwen2, qwen3, phi3, olmo2, olmo3), Gemma (gemma, gemma2,
//! gemma3_text), Nemotron, MPT, StarCoder2, GPT-NeoX and GPT-2. `head_dim` is read when given,
//! never re-derived; the sequence length is a training length (4,096), not the context window.
//! Mixtures of experts: Mixtral, OLMoE, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2/V3 (with multi-head
//! latent attention), GLM-4.5 and GPT-OSS; others are refused.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;

use super::arch::{
    Activation, ArchSpec, AttentionImpl, CausalBlocks, MlaSpec, MoeSpec, NormKind, Position,
    QkNormSpan,
};
use crate::error::{Error, Result};

/// The sequence length a config.json model is costed at unless `--seq-len` says otherwise: a
/// training length, never the context window (`max_position_embeddings` is 131,072 for Llama
/// 3.1, which no pre-training step runs at).
pub const DEFAULT_SEQ_LEN: u64 = 4096;

/// Mixture-of-experts families read with their experts.
const MOE_TYPES: [&str; 9] = [
    "glm4_moe",
    "llama4_text",
    "mixtral",
    "olmoe",
    "qwen2_moe",
    "qwen3_moe",
    "deepseek_v2",
    "deepseek_v3",
    "gpt_oss",
];

/// Keys whose presence means the model is a mixture of experts.
const EXPERT_KEYS: [&str; 4] = [
    "num_local_experts",
    "num_experts",
    "n_routed_experts",
    "moe_intermediate_size",
];

pub fn from_config_json(path: &Path) -> Result<ArchSpec> {
    let text = crate::fsutil::read_to_string(path)?;
    from_config_str(path, &text)
}

/// Reads the text of a config.json that came from `path`.
pub fn from_config_str(path: &Path, text: &str) -> Result<ArchSpec> {
    let v: Value = serde_json::from_str(text).map_err(|e| {
        Error::bad_file(
            path,
            format!(
                "not valid JSON ({}): give the model's config.json as published",
                crate::fsutil::parse_message(&e)
            ),
        )
    })?;
    Config { v: &v, path }.spec()
}

/// What MPT's `attn_config` says of its attention.
struct MptAttention {
    kv_heads: Option<u64>,
    kernel: AttentionImpl,
    causal_blocks: CausalBlocks,
    position: Position,
    sliding_window: Option<u64>,
    /// The query and key norms' span, if any.
    qk_norm: Option<QkNormSpan>,
    dropout: bool,
}

/// A parsed config.json and where it came from, for messages.
struct Config<'a> {
    v: &'a Value,
    path: &'a Path,
}

impl Config<'_> {
    fn bad(&self, msg: String) -> Error {
        Error::bad_file(self.path, msg)
    }

    fn model_type(&self) -> Result<&str> {
        self.v
            .get("model_type")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                self.bad(
                    "no \"model_type\": give a Hugging Face config.json (it names its \
                     model_type) or describe the architecture in a YAML file"
                        .into(),
                )
            })
    }

    fn int(&self, key: &str) -> Result<u64> {
        match self.v.get(key) {
            Some(Value::Number(n)) if n.as_u64().is_some_and(|x| x > 0) => {
                Ok(n.as_u64().unwrap_or(1))
            }
            Some(other) => Err(self.bad(format!("\"{key}\" = {other} must be a positive integer"))),
            None => Err(self.bad(format!(
                "missing \"{key}\" (needed for model_type {}): add it from the model's \
                 published config",
                self.model_type().unwrap_or("?")
            ))),
        }
    }

    fn opt_int(&self, key: &str) -> Result<Option<u64>> {
        match self.v.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(_) => self.int(key).map(Some),
        }
    }

    fn flag(&self, key: &str, default: bool) -> bool {
        self.v.get(key).and_then(Value::as_bool).unwrap_or(default)
    }

    fn str(&self, keys: &[&str], default: &'static str) -> String {
        keys.iter()
            .find_map(|k| self.v.get(*k).and_then(Value::as_str))
            .unwrap_or(default)
            .to_string()
    }

    /// Whether a logit soft cap is on: a positive cap is, null is none, and an absent key
    /// is `default` (Transformers' Gemma 2 defaults are 50 and 30).
    fn softcap(&self, key: &str, default: bool) -> Result<bool> {
        match self.v.get(key) {
            None => Ok(default),
            Some(Value::Null) => Ok(false),
            Some(Value::Number(n)) if n.as_f64().is_some_and(|c| c > 0.0) => Ok(true),
            Some(other) => Err(self.bad(format!(
                "\"{key}\" = {other}: give the cap, a positive number, or null for none"
            ))),
        }
    }

    /// Every how many layers one attends to the whole sequence, as `layer_types` lists
    /// them (none without the list; refused unless every N-th layer is the full one).
    fn global_attention_every(&self) -> Result<Option<u64>> {
        let Some(types) = self.v.get("layer_types").and_then(Value::as_array) else {
            return Ok(None);
        };
        let global = |t: &Value| t.as_str() == Some("full_attention");
        let every = types.iter().position(global).map_or(0, |i| i as u64 + 1);
        let regular = every > 0
            && types
                .iter()
                .enumerate()
                .all(|(i, t)| global(t) == (i as u64 + 1).is_multiple_of(every));
        if !regular {
            return Err(self.bad(
                "layer_types: full-attention layers are read when every N-th layer is one \
                 (GPT-OSS and Gemma 2: every second, Gemma 3: every sixth); describe this \
                 model in a YAML file with sliding_window and global_attention_every"
                    .into(),
            ));
        }
        Ok(Some(every))
    }

    /// The layer numbers `key` lists (none where absent or null).
    fn layer_list(&self, key: &str) -> Result<Option<BTreeSet<u64>>> {
        let Some(v) = self.v.get(key).filter(|v| !v.is_null()) else {
            return Ok(None);
        };
        v.as_array()
            .and_then(|l| {
                l.iter()
                    .map(Value::as_u64)
                    .collect::<Option<BTreeSet<u64>>>()
            })
            .map(Some)
            .ok_or_else(|| self.bad(format!("{key}: give a list of layer numbers")))
    }

    /// Any non-zero dropout probability means masks are stored for the backward.
    fn dropout(&self, keys: &[&str], default: f64) -> bool {
        keys.iter()
            .map(|k| self.v.get(*k).and_then(Value::as_f64).unwrap_or(default))
            .any(|p| p > 0.0)
    }

    /// The model's name as the config gives it (`_name_or_path`), else its model_type — never
    /// the directory it happens to sit in.
    fn name(&self, model_type: &str) -> String {
        self.v
            .get("_name_or_path")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .unwrap_or_else(|| model_type.to_string())
    }

    /// The training length: 4,096 tokens, or the context window when shorter.
    fn seq_len(&self, window_key: &str) -> Result<u64> {
        Ok(self
            .opt_int(window_key)?
            .map_or(DEFAULT_SEQ_LEN, |w| w.min(DEFAULT_SEQ_LEN)))
    }

    /// A sliding window the config turns on.
    fn sliding_window(&self) -> Result<Option<u64>> {
        if !self.flag("use_sliding_window", true) {
            return Ok(None);
        }
        self.opt_int("sliding_window")
    }

    fn refuse_unmodelled(&self, model_type: &str) -> Result<()> {
        if MOE_TYPES.contains(&model_type) {
            return Ok(());
        }
        if let Some(key) = EXPERT_KEYS.iter().find(|k| {
            self.v
                .get(**k)
                .is_some_and(|x| !x.is_null() && x != 0 && x != 1)
        }) {
            return Err(self.bad(format!(
                "\"{key}\" = {}: {model_type} is a mixture of experts stepcast does not read \
                 from a config.json (it reads {}); describe it in a YAML architecture file with \
                 moe: {{experts, top_k, expert_ffn, …}}",
                self.v[*key],
                MOE_TYPES.join(", ")
            )));
        }
        if self.v.get("kv_lora_rank").is_some_and(|x| !x.is_null())
            && !model_type.starts_with("deepseek")
        {
            return Err(self.bad(
                "\"kv_lora_rank\": multi-head latent attention (DeepSeek) is not modelled; \
                 describe an equivalent dense attention in a YAML architecture file"
                    .into(),
            ));
        }
        Ok(())
    }

    fn spec(&self) -> Result<ArchSpec> {
        let model_type = self.model_type()?;
        self.refuse_unmodelled(model_type)?;
        let name = self.name(model_type);
        let spec = match model_type {
            "mixtral" | "olmoe" | "qwen2_moe" | "qwen3_moe" => self.experts(model_type, name)?,
            "deepseek_v2" | "deepseek_v3" => self.deepseek(name)?,
            "gpt_oss" => self.gpt_oss(name)?,
            "glm4_moe" => self.glm4_moe(name)?,
            "llama4_text" => self.llama4(name)?,
            "llama" | "mistral" | "qwen2" | "qwen3" | "phi3" => {
                self.llama_like(model_type, name)?
            }
            "gemma" | "gemma2" | "gemma3_text" => {
                let act = self.str(&["hidden_activation", "hidden_act"], "gelu_pytorch_tanh");
                if !act.starts_with("gelu") {
                    return Err(self.bad(format!(
                        "hidden_activation \"{act}\": Gemma configs are read as GeGLU MLPs; \
                         describe this model in a YAML architecture file instead"
                    )));
                }
                // Gemma 2 and 3 alternate sliding-window and global layers (every second one
                // global, every sixth) and norm the attention's and the MLP's outputs too;
                // Gemma 2 soft-caps its scores and logits (Transformers' defaults), Gemma 3
                // norms its queries and keys instead (its caps off unless the config sets them)
                let (gemma2, gemma3) = (model_type == "gemma2", model_type == "gemma3_text");
                let global_every = match self.global_attention_every()? {
                    None if gemma2 => Some(2),
                    None if gemma3 => Some(self.opt_int("sliding_window_pattern")?.unwrap_or(6)),
                    listed => listed,
                };
                let later = gemma2 || gemma3;
                ArchSpec {
                    activation: Activation::Geglu,
                    tied_embeddings: self.flag("tie_word_embeddings", true),
                    global_attention_every: global_every,
                    post_norms: later,
                    scaled_embeddings: true,
                    qk_norm: gemma3,
                    attention_softcap: later && self.softcap("attn_logit_softcapping", gemma2)?,
                    final_softcap: later && self.softcap("final_logit_softcapping", gemma2)?,
                    ..self.llama_like(model_type, name)?
                }
            }
            "gemma3" | "llama4" => {
                let family = if model_type == "gemma3" {
                    "Gemma 3"
                } else {
                    "Llama 4"
                };
                return Err(self.bad(format!(
                    "model_type \"{model_type}\" is {family} with its vision tower, which \
                     stepcast does not cost: give the config's \"text_config\" object as the \
                     config.json (its model_type is {model_type}_text) to cost the language model"
                )));
            }
            "nemotron" => {
                let act = self.str(&["hidden_act"], "relu2");
                if act != "relu2" {
                    return Err(self.bad(format!(
                        "hidden_act \"{act}\": Nemotron configs are read as squared-ReLU MLPs \
                         (relu2); describe this model in a YAML architecture file instead"
                    )));
                }
                ArchSpec {
                    activation: Activation::SquaredRelu,
                    // LayerNorm1P keeps a bias, as a LayerNorm does by default
                    norm: NormKind::Layernorm,
                    ..self.llama_like(model_type, name)?
                }
            }
            "mpt" => self.mpt(name)?,
            // OLMo 2 and 3 norm the attention's and the MLP's outputs only, and their queries
            // and keys over the whole projection; OLMo 3 windows three layers of four
            "olmo2" | "olmo3" => ArchSpec {
                pre_norms: false,
                post_norms: true,
                qk_norm: true,
                qk_norm_span: QkNormSpan::Projection,
                global_attention_every: self.global_attention_every()?,
                ..self.llama_like(model_type, name)?
            },
            "starcoder2" => {
                let act = self.str(&["hidden_act"], "gelu_pytorch_tanh");
                if !act.starts_with("gelu") {
                    return Err(self.bad(format!(
                        "hidden_act \"{act}\": StarCoder2 configs are read as GELU MLPs; \
                         describe this model in a YAML architecture file instead"
                    )));
                }
                // a LLaMA's attention (grouped heads, RoPE, a window on every layer) with
                // GPT-2's parts: biased LayerNorms and projections, a 4·hidden GELU MLP
                let bias = self.flag("use_bias", true);
                ArchSpec {
                    norm: NormKind::Layernorm,
                    activation: Activation::Gelu,
                    linear_bias: bias,
                    tied_embeddings: self.flag("tie_word_embeddings", true),
                    dropout: self.dropout(
                        &["attention_dropout", "residual_dropout", "embedding_dropout"],
                        0.0,
                    ),
                    ..self.llama_like(model_type, name)?
                }
            }
            "gpt_neox" => ArchSpec {
                name,
                layers: self.int("num_hidden_layers")?,
                hidden: self.int("hidden_size")?,
                heads: self.int("num_attention_heads")?,
                kv_heads: None,
                head_dim: None,
                ffn_hidden: Some(self.int("intermediate_size")?),
                vocab: self.int("vocab_size")?,
                vocab_divisible_by: None,
                norm: NormKind::Layernorm,
                activation: Activation::Gelu,
                tied_embeddings: self.flag("tie_word_embeddings", false),
                attention: AttentionImpl::Flash,
                causal_blocks: CausalBlocks::Skipped,
                position: Position::Rope,
                linear_bias: true,
                qkv_bias: false,
                qk_norm: false,
                qk_norm_span: QkNormSpan::Head,
                pre_norms: true,
                post_norms: false,
                scaled_embeddings: false,
                attention_softcap: false,
                final_softcap: false,
                norm_bias: None,
                seq_len: Some(self.seq_len("max_position_embeddings")?),
                sliding_window: None,
                global_attention_every: None,
                chunked_attention: false,
                dropout: self.dropout(&["attention_dropout", "hidden_dropout"], 0.0),
                moe: None,
                mla: None,
            },
            "gpt2" => {
                let hidden = self.int("n_embd")?;
                ArchSpec {
                    name,
                    layers: self.int("n_layer")?,
                    hidden,
                    heads: self.int("n_head")?,
                    kv_heads: None,
                    head_dim: None,
                    ffn_hidden: Some(self.opt_int("n_inner")?.unwrap_or(4 * hidden)),
                    vocab: self.int("vocab_size")?,
                    vocab_divisible_by: None,
                    norm: NormKind::Layernorm,
                    activation: Activation::Gelu,
                    tied_embeddings: self.flag("tie_word_embeddings", true),
                    attention: AttentionImpl::Flash,
                    causal_blocks: CausalBlocks::Skipped,
                    position: Position::Learned,
                    linear_bias: true,
                    qkv_bias: false,
                    qk_norm: false,
                    qk_norm_span: QkNormSpan::Head,
                    pre_norms: true,
                    post_norms: false,
                    scaled_embeddings: false,
                    attention_softcap: false,
                    final_softcap: false,
                    norm_bias: None,
                    seq_len: Some(self.seq_len("n_positions")?),
                    sliding_window: None,
                    global_attention_every: None,
                    chunked_attention: false,
                    dropout: self.dropout(&["attn_pdrop", "resid_pdrop", "embd_pdrop"], 0.1),
                    moe: None,
                    mla: None,
                }
            }
            other => {
                return Err(self.bad(format!(
                    "model_type \"{other}\" is not supported (llama, mistral, qwen2, qwen3, \
                     phi3, olmo2, olmo3, gemma, gemma2, gemma3_text, nemotron, mpt, starcoder2, \
                     gpt_neox, gpt2, and the mixtures {}); describe the architecture in a YAML \
                     file instead",
                    MOE_TYPES.join(", ")
                )))
            }
        };
        Ok(spec)
    }

    /// Mixtral, OLMoE and Qwen's MoE models: a LLaMA-like model whose MLPs are mixtures of
    /// experts, but for Qwen's dense layers (`mlp_only_layers`, `decoder_sparse_step`) where
    /// they form a pattern stepcast costs: dense first layers, then one layer of every N.
    fn experts(&self, model_type: &str, name: String) -> Result<ArchSpec> {
        // read as a LLaMA (SwiGLU required); the query and key norms and biases are set below
        let mut spec = self.llama_like("mistral", name)?;
        spec.qk_norm = model_type == "qwen3_moe";
        spec.qkv_bias = model_type == "qwen2_moe";
        // OLMoE norms its queries and keys over the whole projection, as OLMo 2
        if model_type == "olmoe" {
            (spec.qk_norm, spec.qk_norm_span) = (true, QkNormSpan::Projection);
        }
        // Qwen-MoE: layer i has experts unless listed in `mlp_only_layers`, and only where
        // (i + 1) is a multiple of `decoder_sparse_step`
        let layers = spec.layers;
        let step = self.opt_int("decoder_sparse_step")?.unwrap_or(1);
        let dense = self.layer_list("mlp_only_layers")?.unwrap_or_default();
        let pattern: Vec<bool> = (0..layers.min(crate::limits::MAX_LAYERS))
            .map(|i| (i + 1) % step == 0 && !dense.contains(&i))
            .collect();
        let Some((dense_layers, every, offset)) = MoeSpec::layers_from_pattern(&pattern) else {
            return Err(self.bad(format!(
                "decoder_sparse_step = {step}, mlp_only_layers = {dense:?}: the layers with \
                 experts must be every layer after some dense first ones, or one layer of every \
                 N; describe the model in YAML with moe.dense_layers, every and offset"
            )));
        };
        let (experts_key, ffn_key) = match model_type {
            "mixtral" => ("num_local_experts", "intermediate_size"),
            "olmoe" => ("num_experts", "intermediate_size"),
            _ => ("num_experts", "moe_intermediate_size"),
        };
        let shared = self.opt_int("shared_expert_intermediate_size")?;
        spec.moe = Some(MoeSpec {
            experts: self.int(experts_key)?,
            top_k: self.int("num_experts_per_tok")?,
            expert_ffn: self.int(ffn_key)?,
            shared_experts: shared.is_some() as u64,
            shared_ffn: shared,
            dense_layers,
            every,
            offset,
            groups: 0,
            topk_groups: 0,
        });
        Ok(spec)
    }

    /// GPT-OSS: a LLaMA-like model with biased attention projections, every layer a mixture
    /// of `num_local_experts` experts of `intermediate_size` (top `num_experts_per_tok`), and
    /// attention alternating between a `sliding_window` and the whole sequence as
    /// `layer_types` lists. Its attention sinks (one learned logit per head) and the clamp
    /// of its SwiGLU cost nothing measurable and are not modelled; the biases of the output
    /// projection, the experts and the router (0.04 % of the parameters) are not counted.
    fn gpt_oss(&self, name: String) -> Result<ArchSpec> {
        let mut spec = self.llama_like("mistral", name)?;
        spec.qkv_bias = self.flag("attention_bias", true);
        spec.linear_bias = false;
        spec.sliding_window = self.opt_int("sliding_window")?;
        spec.global_attention_every = self.global_attention_every()?;
        spec.moe = Some(MoeSpec {
            experts: self.int("num_local_experts")?,
            top_k: self.int("num_experts_per_tok")?,
            expert_ffn: self.int("intermediate_size")?,
            shared_experts: 0,
            shared_ffn: None,
            dense_layers: 0,
            every: 1,
            offset: 0,
            groups: 0,
            topk_groups: 0,
        });
        Ok(spec)
    }

    /// DeepSeek-V2 and V3: multi-head latent attention, the first `first_k_dense_replace`
    /// layers dense, the rest mixtures of `n_routed_experts` (top `num_experts_per_tok`) with
    /// `n_shared_experts` shared ones, every one of `moe_intermediate_size`. Multi-token
    /// prediction modules (`num_nextn_predict_layers`) are not part of the trained model counted
    /// here (DeepSeek-V3's 671 B excludes them).
    fn deepseek(&self, name: String) -> Result<ArchSpec> {
        let freq = self.opt_int("moe_layer_freq")?.unwrap_or(1);
        if freq != 1 {
            return Err(self.bad(format!(
                "moe_layer_freq = {freq}: dense layers between expert layers are not modelled; \
                 every layer after the first_k_dense_replace must be sparse"
            )));
        }
        let mut spec = self.llama_like("llama", name)?;
        let heads = spec.heads;
        spec.kv_heads = Some(heads);
        spec.head_dim = None;
        spec.moe = Some(self.deepseek_experts()?);
        spec.mla = Some(MlaSpec {
            q_lora_rank: self.opt_int("q_lora_rank")?,
            kv_lora_rank: self.int("kv_lora_rank")?,
            qk_nope_head_dim: self.int("qk_nope_head_dim")?,
            qk_rope_head_dim: self.int("qk_rope_head_dim")?,
            v_head_dim: self.int("v_head_dim")?,
        });
        Ok(spec)
    }

    /// DeepSeek's mixture as its config names it: `n_routed_experts` (top
    /// `num_experts_per_tok`) and `n_shared_experts`, every one of `moe_intermediate_size`,
    /// after `first_k_dense_replace` dense layers.
    fn deepseek_experts(&self) -> Result<MoeSpec> {
        Ok(MoeSpec {
            experts: self.int("n_routed_experts")?,
            top_k: self.int("num_experts_per_tok")?,
            expert_ffn: self.int("moe_intermediate_size")?,
            shared_experts: self.opt_int("n_shared_experts")?.unwrap_or(0),
            shared_ffn: None,
            dense_layers: self.opt_int("first_k_dense_replace")?.unwrap_or(0),
            every: 1,
            offset: 0,
            // group-limited routing (V2's group_limited_greedy, V3's noaux_tc over groups)
            groups: self.opt_int("n_group")?.unwrap_or(0),
            topk_groups: self.opt_int("topk_group")?.unwrap_or(0),
        })
    }

    /// Llama 4 (Scout, Maverick): a LLaMA with a mixture in every `interleave_moe_layer_step`-th
    /// layer (or the layers `moe_layers` lists) — one always-on shared expert beside the routed
    /// ones, all of `intermediate_size`; the other layers' dense MLP of `intermediate_size_mlp` —
    /// and chunked attention (`attention_chunk_size`) on its RoPE layers, the whole sequence on
    /// the NoPE ones (every `no_rope_layer_interval`-th, `no_rope_layers` 0, or `layer_types`'
    /// full_attention). Its query and key L2 norms have no weights and are not costed.
    fn llama4(&self, name: String) -> Result<ArchSpec> {
        let mut spec = self.llama_like("llama", name)?;
        let layers = spec.layers.min(crate::limits::MAX_LAYERS);
        spec.ffn_hidden = Some(self.int("intermediate_size_mlp")?);
        let step = self.opt_int("interleave_moe_layer_step")?.unwrap_or(1);
        let pattern: Vec<bool> = match self.layer_list("moe_layers")? {
            Some(listed) => (0..layers).map(|i| listed.contains(&i)).collect(),
            None => (0..layers).map(|i| (i + 1) % step == 0).collect(),
        };
        let Some((dense_layers, every, offset)) = MoeSpec::layers_from_pattern(&pattern) else {
            return Err(self.bad(format!(
                "interleave_moe_layer_step = {step} / moe_layers: the layers with experts must \
                 be one layer of every N; describe the model in YAML with moe.dense_layers, \
                 every and offset"
            )));
        };
        spec.moe = Some(MoeSpec {
            experts: self.int("num_local_experts")?,
            top_k: self.int("num_experts_per_tok")?,
            expert_ffn: self.int("intermediate_size")?,
            shared_experts: 1,
            shared_ffn: None,
            dense_layers,
            every,
            offset,
            groups: 0,
            topk_groups: 0,
        });
        if let Some(chunk) = self.opt_int("attention_chunk_size")? {
            (spec.sliding_window, spec.chunked_attention) = (Some(chunk), true);
            spec.global_attention_every = self.llama4_global_every(layers)?;
        }
        Ok(spec)
    }

    /// Every how many layers Llama 4 attends to the whole sequence (its NoPE layers): from
    /// `layer_types`, else `no_rope_layers` (1: RoPE and chunked, 0: NoPE and global), else
    /// every `no_rope_layer_interval`-th (default 4); none where every layer is chunked.
    fn llama4_global_every(&self, layers: u64) -> Result<Option<u64>> {
        if self.v.get("layer_types").is_some_and(Value::is_array) {
            return self.global_attention_every();
        }
        let listed = self
            .v
            .get("no_rope_layers")
            .and_then(Value::as_array)
            .filter(|l| !l.is_empty());
        let global: Vec<bool> = match listed {
            Some(l) => match l.iter().map(Value::as_u64).collect::<Option<Vec<u64>>>() {
                Some(marks) if marks.len() as u64 == layers && marks.iter().all(|&m| m <= 1) => {
                    marks.iter().map(|&m| m == 0).collect()
                }
                _ => {
                    return Err(self.bad(format!(
                        "no_rope_layers: give a 1 (RoPE, chunked attention) or 0 (NoPE, whole \
                         sequence) for each of the {layers} layers"
                    )))
                }
            },
            None => {
                let interval = self.opt_int("no_rope_layer_interval")?.unwrap_or(4);
                (0..layers).map(|i| (i + 1) % interval == 0).collect()
            }
        };
        let Some(first) = global.iter().position(|&g| g) else {
            return Ok(None);
        };
        let every = first as u64 + 1;
        if !(0..layers).all(|i| global[i as usize] == (i + 1).is_multiple_of(every)) {
            return Err(self.bad(
                "no_rope_layers: whole-sequence (NoPE) layers are read when every N-th layer is \
                 one; describe this model in a YAML file with sliding_window, \
                 chunked_attention and global_attention_every"
                    .into(),
            ));
        }
        Ok(Some(every))
    }

    /// GLM-4.5 (`glm4_moe`): DeepSeek-V3's mixture with grouped-query attention — biased
    /// query, key and value projections (`attention_bias`), per-head query and key norms
    /// (`use_qk_norm`). Its RoPE turns `partial_rotary_factor` of each head (half) and is
    /// costed over the whole head, a pass over Q and K slightly dearer than it is; its
    /// multi-token-prediction layers and the routers' score-correction biases are not counted,
    /// as for DeepSeek-V3.
    fn glm4_moe(&self, name: String) -> Result<ArchSpec> {
        let mut spec = self.llama_like("llama", name)?;
        spec.qk_norm = self.flag("use_qk_norm", false);
        spec.moe = Some(self.deepseek_experts()?);
        Ok(spec)
    }

    /// MosaicML's MPT, as llm-foundry's `MPTConfig` and Transformers' `MptConfig` write it:
    /// `d_model`, `n_heads`, `n_layers`, `expansion_ratio` (or `ffn_config.ffn_hidden_size`),
    /// and the `attn_config` / `ffn_config` objects. `no_bias` drops every bias, the norms'
    /// too (MPTModel removes each bias parameter it finds); ALiBi replaces the learned
    /// positions (no `wpe` is built beside it). Parts whose kernels stepcast does not cost are
    /// refused by name.
    fn mpt(&self, name: String) -> Result<ArchSpec> {
        for key in ["logit_scale", "block_overrides"] {
            if let Some(v) = self.v.get(key).filter(|v| !v.is_null()) {
                return self.not_costed(format!("\"{key}\" = {v}"));
            }
        }
        if let Some(f) = self
            .v
            .get("embedding_fraction")
            .filter(|v| !v.is_null() && v.as_f64() != Some(1.0))
        {
            return self.not_costed(format!(
                "\"embedding_fraction\" = {f} (a scaled embedding gradient)"
            ));
        }
        let d_model = self.int("d_model")?;
        let attn = self.mpt_attention(self.section("attn_config")?)?;
        let (activation, ffn_hidden) = self.mpt_mlp(self.section("ffn_config")?, d_model)?;
        let norm = match self.str(&["norm_type"], "low_precision_layernorm").as_str() {
            "layernorm" | "low_precision_layernorm" | "triton_layernorm" => NormKind::Layernorm,
            "rmsnorm" | "low_precision_rmsnorm" | "triton_rmsnorm" => NormKind::Rmsnorm,
            other => return self.not_costed(format!("\"norm_type\" = \"{other}\"")),
        };
        let bias = !self.flag("no_bias", false);
        Ok(ArchSpec {
            name,
            layers: self.int("n_layers")?,
            hidden: d_model,
            heads: self.int("n_heads")?,
            kv_heads: attn.kv_heads,
            head_dim: None,
            ffn_hidden: Some(ffn_hidden),
            vocab: self.int("vocab_size")?,
            vocab_divisible_by: None,
            norm,
            activation,
            // MPT's SharedEmbedding is its output layer too
            tied_embeddings: self.flag("tie_word_embeddings", true),
            attention: attn.kernel,
            causal_blocks: attn.causal_blocks,
            position: attn.position,
            linear_bias: bias,
            qkv_bias: false,
            qk_norm: attn.qk_norm.is_some(),
            qk_norm_span: attn.qk_norm.unwrap_or_default(),
            pre_norms: true,
            post_norms: false,
            scaled_embeddings: false,
            attention_softcap: false,
            final_softcap: self.softcap("final_logit_softcapping", false)?,
            norm_bias: Some(bias && norm == NormKind::Layernorm),
            seq_len: Some(self.seq_len("max_seq_len")?),
            sliding_window: attn.sliding_window,
            global_attention_every: None,
            chunked_attention: false,
            dropout: self.dropout(&["resid_pdrop", "emb_pdrop"], 0.0) || attn.dropout,
            moe: None,
            mla: None,
        })
    }

    /// MPT's `attn_config`: the heads' grouping, the kernel (`attn_impl`), the positions, the
    /// window, the query and key norms and the dropout.
    fn mpt_attention(&self, attn: &serde_json::Map<String, Value>) -> Result<MptAttention> {
        let on = |key| attn.get(key).and_then(Value::as_bool).unwrap_or(false);
        let kv_heads = match self
            .nested_text("attn_config", attn, "attn_type", "multihead_attention")?
            .as_str()
        {
            "multihead_attention" => None,
            "multiquery_attention" => Some(1),
            "grouped_query_attention" => Some(match attn.get("kv_n_heads") {
                None | Some(Value::Null) => 1, // MPTConfig's default
                Some(v) => v.as_u64().filter(|&n| n > 0).ok_or_else(|| {
                    self.bad(format!(
                        "\"attn_config.kv_n_heads\" = {v} must be a positive integer"
                    ))
                })?,
            }),
            other => return self.not_costed(format!("\"attn_config.attn_type\" = \"{other}\"")),
        };
        // Transformers' default is torch (the config.json of mosaicml/mpt-7b says so); the
        // training YAMLs of llm-foundry set flash
        let (kernel, causal_blocks) = match self
            .nested_text("attn_config", attn, "attn_impl", "torch")?
            .as_str()
        {
            "torch" => (AttentionImpl::Unfused, CausalBlocks::Skipped),
            "flash" => (AttentionImpl::Flash, CausalBlocks::Skipped),
            // handed ALiBi's bias tensor, the Triton kernel cannot skip the masked blocks
            "triton" => (AttentionImpl::Flash, CausalBlocks::Computed),
            other => return self.not_costed(format!("\"attn_config.attn_impl\" = \"{other}\"")),
        };
        if on("prefix_lm") {
            return self.not_costed("\"attn_config.prefix_lm\" = true".into());
        }
        if let Some(clip) = attn.get("clip_qkv").filter(|v| !v.is_null()) {
            return self.not_costed(format!(
                "\"attn_config.clip_qkv\" = {clip} (a clamp of Q, K and V)"
            ));
        }
        let position = if on("alibi") {
            Position::Alibi
        } else if on("rope") {
            Position::Rope
        } else if self.flag("learned_pos_emb", true) {
            Position::Learned
        } else {
            return self.not_costed(
                "a model with no positions (alibi, rope and learned_pos_emb off)".into(),
            );
        };
        let sliding_window = match attn.get("sliding_window_size") {
            None | Some(Value::Null) => None,
            Some(v) if v.as_i64() == Some(-1) => None,
            Some(v) => Some(v.as_u64().filter(|&w| w > 0).ok_or_else(|| {
                self.bad(format!(
                    "\"attn_config.sliding_window_size\" = {v}: give the window in tokens, or \
                     -1 for none"
                ))
            })?),
        };
        // qk_ln norms the whole query and key projections (its LayerNorm's biases, where
        // no_bias keeps them, are not counted), qk_gn each head
        let qk_norm = if on("qk_ln") {
            Some(QkNormSpan::Projection)
        } else if on("qk_gn") {
            Some(QkNormSpan::Head)
        } else {
            None
        };
        Ok(MptAttention {
            kv_heads,
            kernel,
            causal_blocks,
            position,
            sliding_window,
            qk_norm,
            dropout: attn
                .get("attn_pdrop")
                .and_then(Value::as_f64)
                .is_some_and(|p| p > 0.0),
        })
    }

    /// MPT's `ffn_config`: the MLP's kind and activation, and its width — `ffn_hidden_size`,
    /// else int(d_model · `expansion_ratio`) as llm-foundry sizes it.
    fn mpt_mlp(
        &self,
        ffn: &serde_json::Map<String, Value>,
        d_model: u64,
    ) -> Result<(Activation, u64)> {
        let act = match ffn.get("ffn_act_fn") {
            None | Some(Value::Null) => "gelu".to_string(),
            Some(Value::Object(f)) => {
                self.nested_text("ffn_config.ffn_act_fn", f, "name", "gelu")?
            }
            Some(other) => {
                return Err(self.bad(format!(
                    "\"ffn_config.ffn_act_fn\" = {other} must be an object such as \
                     {{\"name\": \"gelu\"}}"
                )))
            }
        };
        let activation = match (
            self.nested_text("ffn_config", ffn, "ffn_type", "mptmlp")?
                .as_str(),
            act.as_str(),
        ) {
            ("mptmlp", "gelu") => Activation::Gelu,
            ("mptglu", "silu") => Activation::Swiglu,
            ("mptglu", "gelu") => Activation::Geglu,
            (ffn_type @ ("mptmlp" | "mptglu"), act) => {
                return self.not_costed(format!(
                    "an {ffn_type} of \"{act}\" (ffn_config.ffn_act_fn)"
                ))
            }
            (ffn_type, _) => {
                return self.not_costed(format!("\"ffn_config.ffn_type\" = \"{ffn_type}\""))
            }
        };
        let width = match ffn.get("ffn_hidden_size").filter(|v| !v.is_null()) {
            Some(v) => v.as_u64().filter(|&n| n > 0).ok_or_else(|| {
                self.bad(format!(
                    "\"ffn_config.ffn_hidden_size\" = {v} must be a positive integer"
                ))
            })?,
            None => match self.v.get("expansion_ratio") {
                None | Some(Value::Null) => 4 * d_model,
                Some(r) => match r.as_f64().filter(|r| (0.01..=1e3).contains(r)) {
                    Some(r) => ((d_model as f64 * r) as u64).max(1),
                    None => {
                        return Err(self.bad(format!(
                            "\"expansion_ratio\" = {r}: give the MLP's width over d_model, a \
                             number between 0.01 and 1000 (MPT's is 4)"
                        )))
                    }
                },
            },
        };
        Ok((activation, width))
    }

    /// A setting whose kernels stepcast does not cost, refused with the way out.
    fn not_costed<T>(&self, what: String) -> Result<T> {
        Err(self.bad(format!(
            "{what} is not costed by stepcast; describe the nearest model it costs in a YAML \
             architecture file, or drop the setting"
        )))
    }

    /// A string setting of a nested object (`section`), or `default` when absent or null.
    fn nested_text(
        &self,
        section: &str,
        m: &serde_json::Map<String, Value>,
        key: &str,
        default: &str,
    ) -> Result<String> {
        match m.get(key) {
            None | Some(Value::Null) => Ok(default.to_string()),
            Some(Value::String(v)) => Ok(v.clone()),
            Some(other) => Err(self.bad(format!(
                "\"{section}.{key}\" = {other} must be a string: give it as MPTConfig names it"
            ))),
        }
    }

    /// A nested object of the config (`attn_config`), empty when absent.
    fn section(&self, key: &str) -> Result<&serde_json::Map<String, Value>> {
        static EMPTY: std::sync::OnceLock<serde_json::Map<String, Value>> =
            std::sync::OnceLock::new();
        match self.v.get(key) {
            None | Some(Value::Null) => Ok(EMPTY.get_or_init(serde_json::Map::new)),
            Some(Value::Object(m)) => Ok(m),
            Some(other) => Err(self.bad(format!(
                "\"{key}\" = {other} must be an object of settings, as the model's \
                 config.json gives it"
            ))),
        }
    }

    /// The LLaMA family and its descendants: gated SiLU MLP, RMSNorm, RoPE, grouped key/value
    /// heads, an explicit head_dim where the config gives one.
    fn llama_like(&self, model_type: &str, name: String) -> Result<ArchSpec> {
        let act = self.str(&["hidden_act"], "silu");
        let llama = matches!(
            model_type,
            "llama" | "mistral" | "qwen2" | "qwen3" | "phi3" | "olmo2" | "olmo3"
        );
        if llama && act != "silu" && act != "swish" {
            return Err(self.bad(format!(
                "hidden_act \"{act}\": LLaMA-family configs are read as SwiGLU (silu) MLPs; \
                 describe this model in a YAML architecture file instead"
            )));
        }
        let attention_bias = self.flag("attention_bias", false);
        Ok(ArchSpec {
            name,
            layers: self.int("num_hidden_layers")?,
            hidden: self.int("hidden_size")?,
            heads: self.int("num_attention_heads")?,
            kv_heads: self.opt_int("num_key_value_heads")?,
            head_dim: self.opt_int("head_dim")?,
            ffn_hidden: Some(self.int("intermediate_size")?),
            vocab: self.int("vocab_size")?,
            vocab_divisible_by: None,
            norm: NormKind::Rmsnorm,
            activation: Activation::Swiglu,
            tied_embeddings: self.flag("tie_word_embeddings", false),
            attention: AttentionImpl::Flash,
            causal_blocks: CausalBlocks::Skipped,
            position: Position::Rope,
            linear_bias: attention_bias && self.flag("mlp_bias", false),
            // Qwen2 always biases its query, key and value projections
            qkv_bias: model_type == "qwen2" || attention_bias,
            qk_norm: model_type == "qwen3",
            qk_norm_span: QkNormSpan::Head,
            pre_norms: true,
            post_norms: false,
            scaled_embeddings: false,
            attention_softcap: false,
            final_softcap: false,
            norm_bias: None,
            seq_len: Some(self.seq_len("max_position_embeddings")?),
            sliding_window: self.sliding_window()?,
            global_attention_every: None,
            chunked_attention: false,
            dropout: self.dropout(&["attention_dropout"], 0.0),
            moe: None,
            mla: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, text: &str) -> std::path::PathBuf {
        let p = dir.join("config.json");
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn reads_a_llama_config_with_gqa() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(
            dir.path(),
            r#"{"model_type":"llama","hidden_size":8192,"intermediate_size":28672,
                "num_attention_heads":64,"num_key_value_heads":8,"num_hidden_layers":80,
                "vocab_size":32000,"hidden_act":"silu","max_position_embeddings":4096,
                "_name_or_path":"meta-llama/Llama-2-70b-hf"}"#,
        );
        let a = from_config_json(&p).unwrap().validate("x").unwrap();
        assert_eq!((a.kv_heads, a.ffn_hidden, a.layers), (8, 28672, 80));
        assert_eq!(a.activation, Activation::Swiglu);
        assert_eq!(a.name, "meta-llama/Llama-2-70b-hf");
    }

    #[test]
    fn reads_gpt2_and_gpt_neox() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(
            dir.path(),
            r#"{"model_type":"gpt2","n_embd":768,"n_head":12,"n_layer":12,"vocab_size":50257,"n_inner":null}"#,
        );
        let a = from_config_json(&p).unwrap().validate("x").unwrap();
        assert_eq!((a.ffn_hidden, a.tied_embeddings), (3072, true));
        let p = write(
            dir.path(),
            r#"{"model_type":"gpt_neox","hidden_size":6144,"intermediate_size":24576,"num_attention_heads":64,"num_hidden_layers":44,"vocab_size":50432}"#,
        );
        let a = from_config_json(&p).unwrap().validate("x").unwrap();
        assert_eq!((a.norm, a.linear_bias), (NormKind::Layernorm, true));
    }

    /// Parses a published config.json (its cost-relevant fields as the model's Hugging Face
    /// repository publishes them) and checks the parameter count, to the parameter, against
    /// the one its checkpoint holds (`model.num_parameters()` in Transformers).
    fn published(text: &str, parameters: u64) -> crate::workload::Arch {
        published_less(text, parameters, 0)
    }

    /// As `published`, for a model with `omitted` parameters stepcast does not model (each
    /// caller says which): neither counted nor costed as kernels of their own.
    fn published_less(text: &str, parameters: u64, omitted: u64) -> crate::workload::Arch {
        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path(), text);
        let a = from_config_json(&p).unwrap().validate("x").unwrap();
        assert_eq!(a.total_params(), parameters - omitted, "{}", a.name);
        a
    }

    /// Llama 4's language models, their text_config as published, counted by hand (the
    /// model cards' 109B and 400B totals include the vision encoder): per layer the attention
    /// (5,120 × (2 · 5,120 + 2 · 1,024)), two norms, and a mixture — router (5,120 per
    /// expert), the shared expert and the routed ones, 3 · 5,120 · 8,192 each — or, in
    /// Maverick's even layers, a dense MLP of 3 · 5,120 · 16,384; the two vocabulary tables
    /// and the final norm.
    #[test]
    fn llama_4_scout_and_maverick() {
        let text = |experts: u64, step: u64| {
            format!(
                r#"{{"model_type":"llama4_text","hidden_size":5120,"intermediate_size":8192,
                    "intermediate_size_mlp":16384,"num_attention_heads":40,
                    "num_key_value_heads":8,"head_dim":128,"num_hidden_layers":48,
                    "vocab_size":202048,"max_position_embeddings":10485760,
                    "num_local_experts":{experts},"num_experts_per_tok":1,
                    "interleave_moe_layer_step":{step},"attention_chunk_size":8192,
                    "no_rope_layers":[],"use_qk_norm":true,"hidden_act":"silu",
                    "tie_word_embeddings":false,"attention_bias":false,"rope_theta":500000.0}}"#
            )
        };
        let attention = 5120 * (2 * 5120 + 2 * 1024) + 2 * 5120;
        let expert = 3 * 5120 * 8192;
        let moe_layer = |experts: u64| attention + 5120 * experts + (1 + experts) * expert;
        let dense_layer = attention + 3 * 5120 * 16384;
        let rest = 2 * 202_048 * 5120 + 5120;
        let scout = published(&text(16, 1), 48 * moe_layer(16) + rest);
        assert_eq!(scout.total_params(), 107_769_861_120);
        let maverick = published(&text(128, 2), 24 * moe_layer(128) + 24 * dense_layer + rest);
        assert_eq!(maverick.total_params(), 400_711_848_960);
        // experts in the odd layers; chunks of 8,192 tokens but on every fourth (NoPE) layer
        let m = maverick.moe.unwrap();
        assert_eq!(
            (m.dense_layers, m.every, m.offset, m.shared_ffn()),
            (0, 2, 1, 8192)
        );
        assert_eq!(maverick.ffn_hidden, 16384);
        let attention = |a: &crate::workload::Arch| {
            (
                a.sliding_window,
                a.chunked_attention,
                a.global_attention_every,
            )
        };
        assert_eq!(attention(&maverick), (Some(8192), true, Some(4)));
        // the same read from either list: moe_layers, no_rope_layers, layer_types
        let odd: Vec<String> = (0..48)
            .filter(|i| i % 2 == 1)
            .map(|i| i.to_string())
            .collect();
        let rope: Vec<&str> = (0..48)
            .map(|i| if i % 4 == 3 { "0" } else { "1" })
            .collect();
        let types: Vec<&str> = (0..48)
            .map(|i| match i % 4 {
                3 => r#""full_attention""#,
                _ => r#""chunked_attention""#,
            })
            .collect();
        let listed = |extra: String| {
            let t = text(128, 1).replace(r#""no_rope_layers":[],"#, &extra);
            from_config_str(Path::new("config.json"), &t).map(|spec| {
                let a = spec.validate("x").unwrap();
                (a.moe.map(|m| (m.every, m.offset)), attention(&a))
            })
        };
        let expected = (Some((2, 1)), (Some(8192), true, Some(4)));
        let moe_layers = format!(r#""moe_layers":[{}],"#, odd.join(","));
        assert_eq!(
            listed(format!(
                r#"{moe_layers}"no_rope_layers":[{}],"#,
                rope.join(",")
            ))
            .unwrap(),
            expected
        );
        assert_eq!(
            listed(format!(
                r#"{moe_layers}"layer_types":[{}],"#,
                types.join(",")
            ))
            .unwrap(),
            expected
        );
        // every layer chunked; no chunks at all
        let all: Vec<&str> = vec!["1"; 48];
        let chunked = listed(format!(r#""no_rope_layers":[{}],"#, all.join(","))).unwrap();
        assert_eq!(chunked.1, (Some(8192), true, None));
        let text_without = text(16, 1).replace(r#""attention_chunk_size":8192,"#, "");
        let a = from_config_str(Path::new("c.json"), &text_without).unwrap();
        assert_eq!((a.sliding_window, a.chunked_attention), (None, false));
        // irregular lists and the multimodal config are refused with the fix
        for (extra, says) in [
            (r#""moe_layers":[1,2],"#.to_string(), "one layer of every N"),
            (
                r#""moe_layers":"odd","#.to_string(),
                "list of layer numbers",
            ),
            (
                r#""no_rope_layers":[1,0],"#.to_string(),
                "each of the 48 layers",
            ),
            (
                format!(r#""no_rope_layers":[0,{}],"#, vec!["1"; 47].join(",")),
                "every N-th layer",
            ),
        ] {
            let e = listed(extra.clone()).unwrap_err().to_string();
            assert!(e.contains(says), "{extra}: {e}");
        }
        let e = from_config_str(Path::new("c.json"), r#"{"model_type":"llama4"}"#).unwrap_err();
        assert!(
            e.to_string().contains("Llama 4 with its vision tower")
                && e.to_string().contains("llama4_text"),
            "{e}"
        );
    }

    #[test]
    fn llama_3_1_8b() {
        let a = published(
            r#"{"_name_or_path":"meta-llama/Llama-3.1-8B","model_type":"llama",
                "hidden_size":4096,"intermediate_size":14336,"num_attention_heads":32,
                "num_key_value_heads":8,"num_hidden_layers":32,"vocab_size":128256,
                "max_position_embeddings":131072,"hidden_act":"silu","head_dim":128,
                "attention_bias":false,"mlp_bias":false,"tie_word_embeddings":false,
                "rope_theta":500000.0}"#,
            8_030_261_248,
        );
        // a training length, never the 131,072-token context window
        assert_eq!(a.seq_len, DEFAULT_SEQ_LEN);
        assert_eq!(a.name, "meta-llama/Llama-3.1-8B");
    }

    #[test]
    fn mistral_nemo_reads_head_dim_instead_of_deriving_it() {
        let a = published(
            r#"{"model_type":"mistral","hidden_size":5120,"intermediate_size":14336,
                "num_attention_heads":32,"num_key_value_heads":8,"head_dim":128,
                "num_hidden_layers":40,"vocab_size":131072,"max_position_embeddings":1024000,
                "sliding_window":null,"hidden_act":"silu","tie_word_embeddings":false}"#,
            12_247_782_400,
        );
        // 32 heads of 128 over a 5,120 hidden size, not 160
        assert_eq!((a.head_dim, a.heads * a.head_dim), (128, 4096));
        // no _name_or_path: named by its model_type, not by the directory
        assert_eq!(a.name, "mistral");
    }

    #[test]
    fn mistral_7b_keeps_its_sliding_window() {
        let a = published(
            r#"{"model_type":"mistral","hidden_size":4096,"intermediate_size":14336,
                "num_attention_heads":32,"num_key_value_heads":8,"num_hidden_layers":32,
                "vocab_size":32000,"max_position_embeddings":32768,"sliding_window":4096,
                "hidden_act":"silu","tie_word_embeddings":false}"#,
            7_241_732_096,
        );
        assert_eq!(a.sliding_window, Some(4096));
    }

    #[test]
    fn qwen2_5_7b_biases_its_qkv() {
        let a = published(
            r#"{"model_type":"qwen2","hidden_size":3584,"intermediate_size":18944,
                "num_attention_heads":28,"num_key_value_heads":4,"num_hidden_layers":28,
                "vocab_size":152064,"max_position_embeddings":131072,"sliding_window":131072,
                "use_sliding_window":false,"hidden_act":"silu","tie_word_embeddings":false}"#,
            7_615_616_512,
        );
        assert!(a.qkv_bias && !a.linear_bias && a.sliding_window.is_none());
    }

    #[test]
    fn qwen3_8b_norms_queries_and_keys() {
        let a = published(
            r#"{"model_type":"qwen3","hidden_size":4096,"intermediate_size":12288,
                "num_attention_heads":32,"num_key_value_heads":8,"head_dim":128,
                "num_hidden_layers":36,"vocab_size":151936,"max_position_embeddings":40960,
                "attention_bias":false,"use_sliding_window":false,"sliding_window":null,
                "hidden_act":"silu","tie_word_embeddings":false}"#,
            8_190_735_360,
        );
        assert!(a.qk_norm && !a.qkv_bias);
    }

    #[test]
    fn gemma_2_9b_is_geglu_with_tied_embeddings() {
        let a = published(
            r#"{"model_type":"gemma2","hidden_size":3584,"intermediate_size":14336,
                "num_attention_heads":16,"num_key_value_heads":8,"head_dim":256,
                "num_hidden_layers":42,"vocab_size":256000,"max_position_embeddings":8192,
                "hidden_activation":"gelu_pytorch_tanh","sliding_window":4096,
                "attn_logit_softcapping":50.0,"final_logit_softcapping":30.0}"#,
            9_241_705_984,
        );
        assert_eq!(a.activation, Activation::Geglu);
        assert!(a.tied_embeddings);
        // four norms a layer (the count above holds them), both logits soft-capped
        assert!(a.post_norms && a.attention_softcap && a.final_softcap);
        // local and global layers alternate
        assert_eq!(
            (a.sliding_window, a.local_attention_share()),
            (Some(4096), 0.5)
        );
    }

    /// Gemma 2 2B and 27B count their checkpoints' parameters too (four norms a layer each;
    /// the 27B's 32 heads of 128 do not tile its 4,608-wide hidden state).
    #[test]
    fn gemma_2_2b_and_27b() {
        let gemma_2 = |layers, hidden, heads, kv_heads, head_dim, ffn| {
            format!(
                r#"{{"model_type":"gemma2","hidden_size":{hidden},"intermediate_size":{ffn},
                    "num_attention_heads":{heads},"num_key_value_heads":{kv_heads},
                    "head_dim":{head_dim},"num_hidden_layers":{layers},"vocab_size":256000,
                    "sliding_window":4096}}"#
            )
        };
        published(&gemma_2(26, 2304, 8, 4, 256, 9216), 2_614_341_888);
        let big = published(&gemma_2(46, 4608, 32, 16, 128, 36864), 27_227_128_320);
        assert_eq!(big.head_dim * big.heads, 4096);
    }

    /// Gemma 2's caps are on unless the config nulls them (absent, Transformers' defaults
    /// apply); a cap of 0 or a string is refused by name; Gemma (1) has neither, nor the
    /// norms after the attention and the MLP.
    #[test]
    fn gemma_soft_caps_and_post_norms_as_transformers_reads_them() {
        let gemma = |model_type: &str, caps: &str| {
            let text = format!(
                r#"{{"model_type":"{model_type}","hidden_size":2048,"intermediate_size":16384,
                    "num_attention_heads":8,"num_key_value_heads":1,"head_dim":256,
                    "num_hidden_layers":18,"vocab_size":256000{caps}}}"#
            );
            from_config_str(Path::new("config.json"), &text)
        };
        let parts = |a: ArchSpec| (a.post_norms, a.attention_softcap, a.final_softcap);
        assert_eq!(parts(gemma("gemma2", "").unwrap()), (true, true, true));
        let nulled = r#","attn_logit_softcapping":null,"final_logit_softcapping":30.0"#;
        assert_eq!(parts(gemma("gemma2", nulled).unwrap()), (true, false, true));
        let nulled = r#","attn_logit_softcapping":50,"final_logit_softcapping":null"#;
        assert_eq!(parts(gemma("gemma2", nulled).unwrap()), (true, true, false));
        assert_eq!(parts(gemma("gemma", "").unwrap()), (false, false, false));
        // nor does Gemma (1) alternate windowed and global layers
        assert_eq!(gemma("gemma", "").unwrap().global_attention_every, None);
        assert_eq!(gemma("gemma2", "").unwrap().global_attention_every, Some(2));
        // every Gemma scales its embeddings by √hidden
        for model_type in ["gemma", "gemma2"] {
            assert!(gemma(model_type, "").unwrap().scaled_embeddings);
        }
        for bad in ["0", "-30.0", "\"30\""] {
            let e = gemma("gemma2", &format!(r#","final_logit_softcapping":{bad}"#))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("final_logit_softcapping") && e.contains("positive number"),
                "{e}"
            );
        }
    }

    /// OLMo 2 7B and 1B as Ai2 published them: no norms before the attention and the MLP, one
    /// after each, query and key norms over the whole projection (4,096 weights each in the
    /// 7B, not a head's 128), untied output layers. Counts as the checkpoints' tensors hold
    /// them (the model cards' 7.3B and 1.5B).
    #[test]
    fn olmo_2_7b_and_1b() {
        let config = |hidden, ffn, heads, layers| {
            format!(
                r#"{{"model_type":"olmo2","hidden_size":{hidden},"intermediate_size":{ffn},
                    "num_attention_heads":{heads},"num_key_value_heads":{heads},
                    "num_hidden_layers":{layers},"vocab_size":100352,
                    "max_position_embeddings":4096,"hidden_act":"silu","attention_bias":false,
                    "rms_norm_eps":1e-06,"rope_theta":500000,"tie_word_embeddings":false}}"#
            )
        };
        let a = published(&config(4096, 11008, 32, 32), 7_298_617_344);
        assert!(!a.pre_norms && a.post_norms && a.qk_norm);
        assert_eq!(a.qk_norm_span, QkNormSpan::Projection);
        assert_eq!(
            (a.norm, a.activation, a.sliding_window),
            (NormKind::Rmsnorm, Activation::Swiglu, None)
        );
        published(&config(2048, 8192, 16, 16), 1_484_916_736);
    }

    /// OLMo 3's `layer_types` (three windowed layers, then a global one) read as for GPT-OSS
    /// and Gemma; its blocks are OLMo 2's.
    #[test]
    fn olmo_3_windows_three_layers_of_four() {
        let dir = tempfile::tempdir().unwrap();
        let types: Vec<&str> = (1..=32)
            .map(|i| {
                if i % 4 == 0 {
                    r#""full_attention""#
                } else {
                    r#""sliding_attention""#
                }
            })
            .collect();
        let text = format!(
            r#"{{"model_type":"olmo3","hidden_size":4096,"intermediate_size":11008,
                "num_attention_heads":32,"num_key_value_heads":32,"num_hidden_layers":32,
                "vocab_size":100278,"sliding_window":4096,"layer_types":[{}]}}"#,
            types.join(",")
        );
        let a = from_config_json(&write(dir.path(), &text))
            .unwrap()
            .validate("x")
            .unwrap();
        assert_eq!(
            (a.sliding_window, a.global_attention_every),
            (Some(4096), Some(4))
        );
        assert!(!a.pre_norms && a.post_norms && a.qk_norm_span == QkNormSpan::Projection);
    }

    /// bigcode's StarCoder2 3B, 7B and 15B: biased LayerNorms and projections, a GELU MLP,
    /// grouped heads, a 4,096-token window on every layer and dropout in training; the 15B
    /// alone has its own output layer. Counts as the checkpoints' tensors hold them (the model
    /// cards' 3.03B, 7.17B and 15.96B).
    #[test]
    fn starcoder2_3b_7b_and_15b() {
        let config = |hidden, ffn, heads, kv, layers, tied| {
            format!(
                r#"{{"model_type":"starcoder2","hidden_size":{hidden},"intermediate_size":{ffn},
                    "num_attention_heads":{heads},"num_key_value_heads":{kv},
                    "num_hidden_layers":{layers},"vocab_size":49152,
                    "max_position_embeddings":16384,"sliding_window":4096,"use_bias":true,
                    "norm_type":"layer_norm","hidden_act":"gelu_pytorch_tanh","mlp_type":"default",
                    "attention_dropout":0.1,"residual_dropout":0.1,"embedding_dropout":0.1,
                    "tie_word_embeddings":{tied}}}"#
            )
        };
        published(&config(3072, 12288, 24, 2, 30, true), 3_030_371_328);
        published(&config(4608, 18432, 36, 4, 32, true), 7_173_923_840);
        let a = published(&config(6144, 24576, 48, 4, 40, false), 15_957_889_024);
        assert_eq!(
            (a.norm, a.norm_bias, a.activation),
            (NormKind::Layernorm, true, Activation::Gelu)
        );
        assert_eq!(
            (a.kv_heads, a.head_dim, a.sliding_window),
            (4, 128, Some(4096))
        );
        assert!(a.linear_bias && a.dropout && !a.tied_embeddings);
        assert_eq!(a.position, Position::Rope);
        let dir = tempfile::tempdir().unwrap();
        let read = |text: &str| from_config_json(&write(dir.path(), text)).unwrap();
        // Starcoder2Config ties the embeddings unless the config says not; any of its three
        // dropouts keeps masks
        let untold = config(3072, 12288, 24, 2, 30, true)
            .replace(r#""tie_word_embeddings":true"#, r#""use_cache":true"#);
        assert!(read(&untold).tied_embeddings);
        let residual_only = untold
            .replace(r#""attention_dropout":0.1"#, r#""attention_dropout":0.0"#)
            .replace(r#""embedding_dropout":0.1"#, r#""embedding_dropout":0.0"#);
        assert!(read(&residual_only).dropout);
        let none = residual_only.replace(r#""residual_dropout":0.1"#, r#""residual_dropout":0.0"#);
        assert!(!read(&none).dropout);
        let gated = config(3072, 12288, 24, 2, 30, true).replace("gelu_pytorch_tanh", "silu");
        let err = from_config_json(&write(dir.path(), &gated))
            .unwrap_err()
            .to_string();
        assert!(err.contains("hidden_act \"silu\""), "{err}");
    }

    /// mosaicml/mpt-7b's config.json as published (its Transformers-side fields, with
    /// `attn_impl` torch as the repository ships it). The count is the checkpoint's tensors
    /// (`wte` 50,432 × 4,096, 32 blocks of `Wqkv`, `out_proj`, `up_proj`, `down_proj` and two
    /// weight-only norms, `norm_f`; the model card's "6.7B"): `no_bias` removed the norms'
    /// biases too, and ALiBi built no `wpe` though `learned_pos_emb` is true.
    #[test]
    fn mpt_7b() {
        let a = published(MPT_7B, 6_649_286_656);
        assert_eq!(
            (a.position, a.norm, a.norm_bias),
            (Position::Alibi, NormKind::Layernorm, false)
        );
        assert_eq!(
            (a.activation, a.ffn_hidden, a.kv_heads),
            (Activation::Gelu, 16384, 32)
        );
        assert_eq!(
            (a.attention, a.seq_len, a.tied_embeddings),
            (AttentionImpl::Unfused, 2048, true)
        );
        assert!(!a.linear_bias && !a.dropout && !a.qk_norm);
    }

    const MPT_7B: &str = r#"{"architectures":["MPTForCausalLM"],"model_type":"mpt",
        "attn_config":{"alibi":true,"alibi_bias_max":8,"attn_impl":"torch","attn_pdrop":0,
            "attn_type":"multihead_attention","attn_uses_sequence_id":false,"clip_qkv":null,
            "prefix_lm":false,"qk_ln":false,"softmax_scale":null},
        "d_model":4096,"emb_pdrop":0,"embedding_fraction":1.0,"expansion_ratio":4,
        "learned_pos_emb":true,"logit_scale":null,"max_seq_len":2048,"n_heads":32,
        "n_layers":32,"no_bias":true,"norm_type":"low_precision_layernorm","resid_pdrop":0,
        "vocab_size":50432}"#;

    /// MPT under llm-foundry's training attention reads as the architecture file the
    /// published-run importer writes for MosaicML's MPT benchmarks (`scripts/import-runs.py`:
    /// FlashAttention-2 with ALiBi, weight-only LayerNorms, no biases, tied embeddings), so a
    /// user's config.json costs what the MPT rows were checked against; Triton's kernel,
    /// handed ALiBi's bias, computes the masked blocks.
    #[test]
    fn mpt_under_flash_is_the_importers_architecture() {
        let dir = tempfile::tempdir().unwrap();
        let read = |attn_impl: &str| {
            let text = MPT_7B.replace(
                r#""attn_impl":"torch""#,
                &format!(r#""attn_impl":"{attn_impl}""#),
            );
            from_config_json(&write(dir.path(), &text))
                .unwrap()
                .validate("x")
                .unwrap()
        };
        let yaml = "name: mpt\nlayers: 32\nhidden: 4096\nheads: 32\nkv_heads: 32\n\
                    ffn_hidden: 16384\nvocab: 50432\nnorm: layernorm\nactivation: gelu\n\
                    position: alibi\nlinear_bias: false\nnorm_bias: false\nseq_len: 2048\n\
                    attention: flash\ndropout: false\ntied_embeddings: true\n";
        let written = ArchSpec::parse_yaml(Path::new("mpt.yaml"), yaml)
            .unwrap()
            .validate("y")
            .unwrap();
        let flash = read("flash");
        assert_eq!(
            crate::workload::Arch {
                name: "mpt".into(),
                ..flash.clone()
            },
            written
        );
        assert_eq!(flash.causal_blocks, CausalBlocks::Skipped);
        let triton = read("triton");
        assert_eq!(
            (triton.attention, triton.causal_blocks),
            (AttentionImpl::Flash, CausalBlocks::Computed)
        );
    }

    /// llm-foundry's newer settings: grouped-query attention, RoPE, a gated MLP of a given
    /// width, RMSNorm, a sliding window, dropout — and the settings it has whose kernels
    /// stepcast does not cost, refused by name.
    #[test]
    fn mpt_reads_llm_foundry_settings_and_refuses_what_it_does_not_cost() {
        let dir = tempfile::tempdir().unwrap();
        let read = |text: &str| from_config_json(&write(dir.path(), text)).map(|s| s.validate("x"));
        let base = |attn: &str, ffn: &str, extra: &str| {
            format!(
                r#"{{"model_type":"mpt","d_model":2048,"n_heads":16,"n_layers":24,
                    "vocab_size":50368,"max_seq_len":8192,"attn_config":{{{attn}}},
                    "ffn_config":{{{ffn}}}{extra}}}"#
            )
        };
        let a = read(&base(
            r#""attn_type":"grouped_query_attention","kv_n_heads":4,"rope":true,
               "attn_impl":"flash","sliding_window_size":1024,"attn_pdrop":0.1"#,
            r#""ffn_type":"mptglu","ffn_act_fn":{"name":"silu"},"ffn_hidden_size":5632"#,
            r#","norm_type":"low_precision_rmsnorm","expansion_ratio":4"#,
        ))
        .unwrap()
        .unwrap();
        assert_eq!(
            (a.kv_heads, a.position, a.activation),
            (4, Position::Rope, Activation::Swiglu)
        );
        assert_eq!(
            (a.ffn_hidden, a.norm, a.sliding_window),
            (5632, NormKind::Rmsnorm, Some(1024))
        );
        assert_eq!(
            (a.seq_len, a.dropout, a.linear_bias, a.norm_bias),
            (4096, true, true, false)
        );
        // a fractional expansion ratio truncates as llm-foundry's int(d_model · ratio)
        let a = read(&base(
            r#""attn_type":"multiquery_attention""#,
            "",
            r#","expansion_ratio":2.6667"#,
        ))
        .unwrap()
        .unwrap();
        assert_eq!(
            (a.kv_heads, a.ffn_hidden, a.position),
            (1, 5461, Position::Learned)
        );
        assert!(
            a.norm_bias && a.linear_bias,
            "a LayerNorm keeps its bias unless no_bias"
        );
        assert_eq!((a.qk_norm, a.qk_norm_span), (false, QkNormSpan::Head));
        // no expansion_ratio: MPTConfig's 4; a window of -1: none
        let a = read(&base(r#""sliding_window_size":-1"#, "", ""))
            .unwrap()
            .unwrap();
        assert_eq!((a.ffn_hidden, a.sliding_window), (4 * 2048, None));
        // query and key norms: per head (qk_gn) or over the projections (qk_ln)
        for (key, span) in [
            ("qk_gn", QkNormSpan::Head),
            ("qk_ln", QkNormSpan::Projection),
        ] {
            let a = read(&base(
                &format!(r#""{key}":true"#),
                "",
                r#","embedding_fraction":null"#,
            ))
            .unwrap()
            .unwrap();
            assert_eq!((a.qk_norm, a.qk_norm_span), (true, span), "{key}");
        }
        for (attn, ffn, extra, named) in [
            (r#""clip_qkv":8"#, "", "", "attn_config.clip_qkv"),
            (r#""prefix_lm":true"#, "", "", "attn_config.prefix_lm"),
            (r#""attn_impl":"xformers""#, "", "", "attn_config.attn_impl"),
            (r#""attn_type":"cross""#, "", "", "attn_config.attn_type"),
            (
                r#""sliding_window_size":0"#,
                "",
                "",
                "attn_config.sliding_window_size",
            ),
            (
                r#""kv_n_heads":0,"attn_type":"grouped_query_attention""#,
                "",
                "",
                "kv_n_heads",
            ),
            ("", r#""ffn_type":"mb_moe""#, "", "ffn_config.ffn_type"),
            (
                "",
                r#""ffn_hidden_size":0"#,
                "",
                "ffn_config.ffn_hidden_size",
            ),
            ("", r#""ffn_act_fn":{"name":"relu"}"#, "", "ffn_act_fn"),
            ("", r#""ffn_act_fn":"gelu""#, "", "ffn_config.ffn_act_fn"),
            (
                "",
                "",
                r#","logit_scale":"inv_sqrt_d_model""#,
                "logit_scale",
            ),
            ("", "", r#","embedding_fraction":0.1"#, "embedding_fraction"),
            ("", "", r#","expansion_ratio":0"#, "expansion_ratio"),
            ("", "", r#","norm_type":"groupnorm""#, "norm_type"),
            ("", "", r#","learned_pos_emb":false"#, "no positions"),
            (
                "",
                "",
                r#","block_overrides":{"order":[]}"#,
                "block_overrides",
            ),
        ] {
            let err = read(&base(attn, ffn, extra)).unwrap_err().to_string();
            assert!(err.contains(named), "{attn} {ffn} {extra}: {err}");
            assert!(err.contains("config.json"), "{err}");
        }
        let err = read(
            r#"{"model_type":"mpt","d_model":64,"n_heads":4,"n_layers":2,
            "vocab_size":100,"attn_config":[1]}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("\"attn_config\" = [1] must be an object"),
            "{err}"
        );
    }

    /// Gemma 3 1B (google/gemma-3-1b-pt): four norms a layer and query/key norms, every
    /// sixth layer global (its `sliding_window_pattern`, or the `layer_types` newer configs
    /// list), 512-token windows, no soft caps; its multimodal siblings' configs are refused
    /// with the way to their text model.
    #[test]
    fn gemma_3_1b() {
        let config = |extra: &str| {
            format!(
                r#"{{"model_type":"gemma3_text","hidden_size":1152,"intermediate_size":6912,
                    "num_attention_heads":4,"num_key_value_heads":1,"head_dim":256,
                    "num_hidden_layers":26,"vocab_size":262144,"max_position_embeddings":32768,
                    "hidden_activation":"gelu_pytorch_tanh","sliding_window":512,
                    "attn_logit_softcapping":null,"final_logit_softcapping":null,
                    "query_pre_attn_scalar":256{extra}}}"#
            )
        };
        let a = published(&config(r#","sliding_window_pattern":6"#), 999_885_952);
        assert!(a.post_norms && a.qk_norm && a.tied_embeddings && a.scaled_embeddings);
        assert!(!a.attention_softcap && !a.final_softcap);
        assert_eq!(
            (a.sliding_window, a.global_attention_every),
            (Some(512), Some(6))
        );
        // the pattern read, and its default
        let every = |extra: &str| published(&config(extra), 999_885_952).global_attention_every;
        assert_eq!(every(r#","sliding_window_pattern":4"#), Some(4));
        assert_eq!(every(""), Some(6));
        // (the list, where a config has one, wins over the pattern)
        let listed = |every: usize| {
            let layer = |i: usize| match (i + 1) % every {
                0 => r#""full_attention""#,
                _ => r#""sliding_attention""#,
            };
            let types: Vec<&str> = (0..26).map(layer).collect();
            let types = format!(
                r#","sliding_window_pattern":6,"layer_types":[{}]"#,
                types.join(",")
            );
            published(&config(&types), 999_885_952).global_attention_every
        };
        assert_eq!((listed(6), listed(3)), (Some(6), Some(3)));
        let e = from_config_str(
            Path::new("config.json"),
            r#"{"model_type":"gemma3","text_config":{"hidden_size":2560}}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("text_config") && e.contains("gemma3_text"),
            "{e}"
        );
    }

    #[test]
    fn phi_3_mini() {
        published(
            r#"{"model_type":"phi3","hidden_size":3072,"intermediate_size":8192,
                "num_attention_heads":32,"num_key_value_heads":32,"num_hidden_layers":32,
                "vocab_size":32064,"max_position_embeddings":4096,"sliding_window":2047,
                "hidden_act":"silu","tie_word_embeddings":false}"#,
            3_821_079_552,
        );
    }

    #[test]
    fn gpt_neox_20b_and_gpt2() {
        published(
            r#"{"model_type":"gpt_neox","hidden_size":6144,"intermediate_size":24576,
                "num_attention_heads":64,"num_hidden_layers":44,"vocab_size":50432,
                "max_position_embeddings":2048,"tie_word_embeddings":false}"#,
            20_554_567_680,
        );
        // GPT-2 small: 124 M with its learned 1,024 positions
        let a = published(
            r#"{"model_type":"gpt2","n_embd":768,"n_head":12,"n_layer":12,"n_positions":1024,
                "vocab_size":50257,"n_inner":null,"activation_function":"gelu_new"}"#,
            124_439_808,
        );
        assert_eq!(a.seq_len, 1024);
    }

    #[test]
    fn nemotron_is_squared_relu_with_layernorm() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(
            dir.path(),
            r#"{"model_type":"nemotron","hidden_size":4096,"intermediate_size":16384,
                "num_attention_heads":48,"num_key_value_heads":8,"head_dim":128,
                "num_hidden_layers":32,"vocab_size":256000,"max_position_embeddings":4096,
                "hidden_act":"relu2","tie_word_embeddings":false}"#,
        );
        let a = from_config_json(&p).unwrap().validate("x").unwrap();
        assert_eq!(
            (a.activation, a.norm, a.ffn_hidden, a.head_dim),
            (Activation::SquaredRelu, NormKind::Layernorm, 16384, 128)
        );
    }

    #[test]
    fn mixtral_8x7b() {
        let a = published(
            r#"{"model_type":"mixtral","hidden_size":4096,"intermediate_size":14336,
                "num_attention_heads":32,"num_key_value_heads":8,"num_hidden_layers":32,
                "vocab_size":32000,"max_position_embeddings":32768,"sliding_window":null,
                "num_local_experts":8,"num_experts_per_tok":2,"hidden_act":"silu",
                "tie_word_embeddings":false,"router_aux_loss_coef":0.02}"#,
            46_702_792_704,
        );
        // 12.9 B active per token (Mistral AI's figure)
        let active = a.active_layer_params() * a.layers + 2 * a.vocab * a.hidden;
        assert!((active as f64 / 12.9e9 - 1.0).abs() < 0.005, "{active}");
    }

    /// openai/gpt-oss-120b and gpt-oss-20b from their published config.json fields: 116.8 B
    /// and 20.9 B parameters (OpenAI's model card), every second layer attending globally.
    #[test]
    fn gpt_oss_120b_and_20b() {
        // a layer's vectors stepcast leaves out: each expert's up (2 × 2,880) and down (2,880)
        // biases, the router's bias, the output projection's bias, the 64 heads' sinks
        let left_out = |layers: u64, experts: u64| layers * (experts * (3 * 2880 + 1) + 2880 + 64);
        let config = |layers: u64, experts: u64, types: &str| {
            format!(
                r#"{{"model_type":"gpt_oss","attention_bias":true,"head_dim":64,
                "hidden_act":"silu","hidden_size":2880,"intermediate_size":2880,
                "layer_types":[{types}],"max_position_embeddings":131072,
                "num_attention_heads":64,"num_experts_per_tok":4,"num_hidden_layers":{layers},
                "num_key_value_heads":8,"num_local_experts":{experts},"sliding_window":128,
                "swiglu_limit":7.0,"tie_word_embeddings":false,"vocab_size":201088,
                "experts_per_token":4,"router_aux_loss_coef":0.9,"rope_theta":150000}}"#
            )
        };
        let big = published_less(
            &config(
                36,
                128,
                r#""sliding_attention","full_attention","sliding_attention","full_attention","sliding_attention","full_attention","sliding_attention","full_attention","sliding_attention","full_attention","sliding_attention","full_attention","sliding_attention","full_attention","sliding_attention","full_attention","sliding_attention","full_attention","sliding_attention","full_attention","sliding_attention","full_attention","sliding_attention","full_attention","sliding_attention","full_attention","sliding_attention","full_attention","sliding_attention","full_attention","sliding_attention","full_attention","sliding_attention","full_attention","sliding_attention","full_attention""#,
            ),
            116_829_156_672,
            left_out(36, 128),
        );
        assert_eq!(
            (big.sliding_window, big.local_attention_share()),
            (Some(128), 0.5)
        );
        assert!(big.qkv_bias && big.moe.is_some_and(|m| m.top_k == 4));
        published_less(
            &config(
                24,
                32,
                r#""sliding_attention","full_attention","sliding_attention","full_attention","sliding_attention","full_attention","sliding_attention","full_attention","sliding_attention","full_attention","sliding_attention","full_attention","sliding_attention","full_attention","sliding_attention","full_attention","sliding_attention","full_attention","sliding_attention","full_attention","sliding_attention","full_attention","sliding_attention","full_attention""#,
            ),
            20_914_757_184,
            left_out(24, 32),
        );
        // a pattern stepcast cannot say as "every N-th layer" is refused with the way out
        let odd = config(
            3,
            32,
            r#""full_attention","sliding_attention","sliding_attention""#,
        );
        let e = from_config_str(Path::new("config.json"), &odd).unwrap_err();
        assert!(e.to_string().contains("global_attention_every"), "{e}");
    }

    #[test]
    fn qwen3_30b_a3b() {
        let a = published(
            r#"{"model_type":"qwen3_moe","hidden_size":2048,"intermediate_size":6144,
                "moe_intermediate_size":768,"num_attention_heads":32,"num_key_value_heads":4,
                "head_dim":128,"num_hidden_layers":48,"vocab_size":151936,
                "max_position_embeddings":40960,"num_experts":128,"num_experts_per_tok":8,
                "decoder_sparse_step":1,"mlp_only_layers":[],"norm_topk_prob":true,
                "use_sliding_window":false,"sliding_window":null,"hidden_act":"silu",
                "tie_word_embeddings":false}"#,
            30_532_122_624,
        );
        let active = a.active_layer_params() * a.layers + 2 * a.vocab * a.hidden;
        assert!((active as f64 / 3.3e9 - 1.0).abs() < 0.02, "{active}");
    }

    #[test]
    fn qwen1_5_moe_with_a_shared_expert() {
        let a = published_less(
            r#"{"model_type":"qwen2_moe","hidden_size":2048,"intermediate_size":5632,
                "moe_intermediate_size":1408,"shared_expert_intermediate_size":5632,
                "num_attention_heads":16,"num_key_value_heads":16,"num_hidden_layers":24,
                "vocab_size":151936,"max_position_embeddings":8192,"num_experts":60,
                "num_experts_per_tok":4,"decoder_sparse_step":1,"mlp_only_layers":[],
                "use_sliding_window":false,"hidden_act":"silu","tie_word_embeddings":false}"#,
            14_315_784_192,
            // the shared expert's gate (one 2,048 vector a layer)
            24 * 2048,
        );
        assert_eq!(a.moe.unwrap().shared_ffn(), 5632);
    }

    #[test]
    fn experts_and_latent_attention_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        for (text, needle) in [
            (
                r#"{"model_type":"jetmoe","hidden_size":2048,"num_experts":64}"#,
                "\"num_experts\" = 64: jetmoe is a mixture of experts stepcast does not read",
            ),
            (
                r#"{"model_type":"minicpm3","kv_lora_rank":256}"#,
                "multi-head latent attention",
            ),
            (
                r#"{"model_type":"deepseek_v2","moe_layer_freq":2}"#,
                "moe_layer_freq = 2",
            ),
        ] {
            let p = write(dir.path(), text);
            let e = from_config_json(&p).unwrap_err().to_string();
            assert!(e.contains(needle) && e.contains("config.json"), "{e}");
        }
    }

    /// allenai/OLMoE-1B-7B-0924: 64 experts of 1,024 on every layer (top 8), its queries and
    /// keys normed over the whole projection; 6,919,161,856 parameters as its checkpoint's
    /// tensors hold them (the model card's 6.9B), 1.3B of them active a token.
    #[test]
    fn olmoe_1b_7b() {
        let arch = published(
            r#"{"model_type":"olmoe","hidden_size":2048,"intermediate_size":1024,
                "num_attention_heads":16,"num_key_value_heads":16,"num_hidden_layers":16,
                "num_experts":64,"num_experts_per_tok":8,"vocab_size":50304,
                "max_position_embeddings":4096,"hidden_act":"silu","clip_qkv":null,
                "tie_word_embeddings":false,"norm_topk_prob":false}"#,
            6_919_161_856,
        );
        let moe = arch.moe.unwrap();
        assert_eq!((moe.experts, moe.top_k, moe.expert_ffn), (64, 8, 1024));
        assert_eq!(
            (arch.qk_norm, arch.qk_norm_span),
            (true, QkNormSpan::Projection)
        );
        let active = arch.active_layer_params() * 16 + 2 * arch.vocab * arch.hidden;
        assert!((active as f64 / 1.3e9 - 1.0).abs() < 0.03, "{active}");
    }

    /// zai-org/GLM-4.5-Air: 96 query heads of 128 over a 4,096-wide state (head_dim read),
    /// 8 key-value heads with biased projections, one dense layer, then 128 experts of 1,408
    /// (top 8) and a shared one. 106,852,245,504 parameters as its shapes give them (GLM's
    /// "106B total, 12B active", the layers'; the published checkpoint adds its multi-token-prediction layer
    /// and the routers' correction biases, which are not counted, as for DeepSeek-V3).
    #[test]
    fn glm_4_5_air() {
        let arch = published(
            r#"{"model_type":"glm4_moe","_name_or_path":"zai-org/GLM-4.5-Air",
                "attention_bias":true,"first_k_dense_replace":1,"head_dim":128,
                "hidden_act":"silu","hidden_size":4096,"intermediate_size":10944,
                "max_position_embeddings":131072,"moe_intermediate_size":1408,"n_group":1,
                "n_routed_experts":128,"n_shared_experts":1,"norm_topk_prob":true,
                "num_attention_heads":96,"num_experts_per_tok":8,"num_hidden_layers":46,
                "num_key_value_heads":8,"num_nextn_predict_layers":1,
                "partial_rotary_factor":0.5,"routed_scaling_factor":1.0,
                "tie_word_embeddings":false,"topk_group":1,"use_qk_norm":false,
                "vocab_size":151552}"#,
            106_852_245_504,
        );
        assert_eq!((arch.heads, arch.head_dim, arch.kv_heads), (96, 128, 8));
        assert!(arch.qkv_bias && !arch.linear_bias && !arch.qk_norm && arch.mla.is_none());
        let moe = arch.moe.unwrap();
        assert_eq!(
            (moe.experts, moe.top_k, moe.shared_experts, moe.dense_layers),
            (128, 8, 1, 1)
        );
        // 12.2 B active a token in its layers (the embedding and output layers add 1.2 B)
        let active = arch.dense_layer_params(1).0 + arch.active_layer_params() * 45;
        assert!((active as f64 / 12e9 - 1.0).abs() < 0.03, "{active}");
    }

    /// deepseek-ai/DeepSeek-V3's config.json (the fields that shape the cost): 671 B
    /// parameters without its multi-token-prediction module, as DeepSeek reports.
    const DEEPSEEK_V3: &str = r#"{"model_type":"deepseek_v3","_name_or_path":"deepseek-ai/DeepSeek-V3",
        "vocab_size":129280,"hidden_size":7168,"intermediate_size":18432,"moe_intermediate_size":2048,
        "num_hidden_layers":61,"num_attention_heads":128,"num_key_value_heads":128,
        "n_shared_experts":1,"n_routed_experts":256,"routed_scaling_factor":2.5,"kv_lora_rank":512,
        "q_lora_rank":1536,"qk_rope_head_dim":64,"v_head_dim":128,"qk_nope_head_dim":128,
        "topk_method":"noaux_tc","n_group":8,"topk_group":4,"num_experts_per_tok":8,
        "moe_layer_freq":1,"first_k_dense_replace":3,"norm_topk_prob":true,"scoring_func":"sigmoid",
        "hidden_act":"silu","max_position_embeddings":163840,"tie_word_embeddings":false,
        "num_nextn_predict_layers":1,"attention_bias":false,"rms_norm_eps":1e-06}"#;

    #[test]
    fn deepseek_v3_has_671_billion_parameters_with_latent_attention() {
        // 671,026,419,200 in the checkpoint without its multi-token-prediction layer, less the
        // routers' score-correction biases (256 a layer), which no gradient updates
        let arch = published_less(DEEPSEEK_V3, 671_026_419_200, 58 * 256);
        let mla = arch.mla.unwrap();
        assert_eq!(
            (mla.q_lora_rank, mla.kv_lora_rank, arch.head_dim),
            (Some(1536), 512, 192)
        );
        let moe = arch.moe.unwrap();
        assert_eq!((moe.experts, moe.top_k, moe.dense_layers), (256, 8, 3));
        // 37 B activated per token (DeepSeek's report)
        let active = arch.dense_layer_params(1).0 * 3
            + arch.active_layer_params() * 58
            + 2 * arch.vocab * arch.hidden;
        assert!((active as f64 / 37e9 - 1.0).abs() < 0.02, "{active}");
    }

    /// deepseek-ai/DeepSeek-V2-Lite: no query low-rank projection, 15.7 B parameters.
    #[test]
    fn deepseek_v2_lite_projects_queries_directly() {
        let text = r#"{"model_type":"deepseek_v2","vocab_size":102400,"hidden_size":2048,
            "intermediate_size":10944,"moe_intermediate_size":1408,"num_hidden_layers":27,
            "num_attention_heads":16,"num_key_value_heads":16,"n_shared_experts":2,
            "n_routed_experts":64,"kv_lora_rank":512,"q_lora_rank":null,"qk_rope_head_dim":64,
            "v_head_dim":128,"qk_nope_head_dim":128,"num_experts_per_tok":6,"moe_layer_freq":1,
            "first_k_dense_replace":1,"hidden_act":"silu","tie_word_embeddings":false}"#;
        let arch = published(text, 15_706_484_224);
        assert_eq!(arch.mla.unwrap().q_lora_rank, None);
    }

    /// A LLaMA-family config with `extra` keys added.
    fn llama_with(extra: &str) -> Result<ArchSpec> {
        from_config_str(
            Path::new("config.json"),
            &format!(
                r#"{{"model_type":"llama","hidden_size":1024,"intermediate_size":4096,
                    "num_attention_heads":16,"num_hidden_layers":4,"vocab_size":32000{extra}}}"#
            ),
        )
    }

    /// A size of zero, a negative or a fractional one is refused by name; one is read.
    #[test]
    fn sizes_must_be_positive_integers() {
        for bad in ["0", "-2", "1.5", "\"4\""] {
            let e = llama_with(&format!(r#","num_key_value_heads":{bad}"#)).unwrap_err();
            let e = e.to_string();
            assert!(
                e.contains(&format!(
                    "\"num_key_value_heads\" = {bad} must be a positive integer"
                )),
                "{e}"
            );
        }
        let a = llama_with(r#","num_key_value_heads":1"#).unwrap();
        assert_eq!(a.kv_heads, Some(1));
    }

    /// Dropout is on where any of a family's probabilities is above zero: LLaMA configs default
    /// to none, GPT-2's to 0.1, GPT-NeoX's to none.
    #[test]
    fn dropout_is_on_where_a_probability_is_above_zero() {
        let read = |text: &str| {
            from_config_str(Path::new("config.json"), text)
                .unwrap()
                .dropout
        };
        assert!(!llama_with("").unwrap().dropout);
        assert!(!llama_with(r#","attention_dropout":0.0"#).unwrap().dropout);
        assert!(llama_with(r#","attention_dropout":0.1"#).unwrap().dropout);
        let gpt2 = |pdrop: &str| {
            format!(
                r#"{{"model_type":"gpt2","n_embd":768,"n_head":12,"n_layer":12,
                    "vocab_size":50257{pdrop}}}"#
            )
        };
        assert!(read(&gpt2("")));
        let none = r#","attn_pdrop":0.0,"resid_pdrop":0.0,"embd_pdrop":0.0"#;
        assert!(!read(&gpt2(none)));
        assert!(read(&gpt2(r#","attn_pdrop":0.0,"resid_pdrop":0.0"#)));
        let neox = |dropout: &str| {
            format!(
                r#"{{"model_type":"gpt_neox","hidden_size":1024,"intermediate_size":4096,
                    "num_attention_heads":16,"num_hidden_layers":4,"vocab_size":50432{dropout}}}"#
            )
        };
        assert!(!read(&neox("")));
        assert!(read(&neox(r#","hidden_dropout":0.1"#)));
    }

    /// A dense model may carry expert keys that say "none" (null, 0 or 1 experts); more is
    /// a mixture of a family stepcast does not read, refused.
    #[test]
    fn expert_keys_that_say_none_leave_a_model_dense() {
        for none in [
            r#","num_experts":null"#,
            r#","num_local_experts":0"#,
            r#","num_local_experts":1"#,
            r#","moe_intermediate_size":null,"n_routed_experts":1"#,
        ] {
            let a = llama_with(none).unwrap();
            assert!(a.moe.is_none(), "{none}");
        }
        let e = llama_with(r#","num_local_experts":2"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"num_local_experts\" = 2: llama is a mixture"),
            "{e}"
        );
    }

    /// LLaMA-family configs are SwiGLU (silu or its other name, swish); the attention's bias
    /// biases Q, K and V, and every linear layer only with the MLP's bias too.
    #[test]
    fn llama_configs_are_swiglu_with_biases_as_flagged() {
        assert!(llama_with(r#","hidden_act":"swish""#).is_ok());
        let e = llama_with(r#","hidden_act":"gelu""#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("hidden_act \"gelu\""), "{e}");
        let biases = |extra: &str| {
            let a = llama_with(extra).unwrap();
            (a.qkv_bias, a.linear_bias)
        };
        assert_eq!(biases(""), (false, false));
        assert_eq!(biases(r#","attention_bias":true"#), (true, false));
        assert_eq!(biases(r#","mlp_bias":true"#), (false, false));
        assert_eq!(
            biases(r#","attention_bias":true,"mlp_bias":true"#),
            (true, true)
        );
    }

    /// Qwen's mixtures: every layer sparse, or refused (dense layers between sparse ones are
    /// not modelled); Qwen3's norm queries and keys, Qwen2's bias them, Mixtral does neither.
    #[test]
    fn qwen_mixtures_place_their_dense_layers() {
        let qwen = |model_type: &str, extra: &str| {
            from_config_str(
                Path::new("config.json"),
                &format!(
                    r#"{{"model_type":"{model_type}","hidden_size":1024,"intermediate_size":4096,
                        "moe_intermediate_size":512,"num_attention_heads":16,
                        "num_hidden_layers":4,"vocab_size":32000,"num_experts":8,
                        "num_experts_per_tok":2{extra}}}"#
                ),
            )
        };
        let norms = |a: ArchSpec| (a.qk_norm, a.qkv_bias);
        assert_eq!(norms(qwen("qwen3_moe", "").unwrap()), (true, false));
        assert_eq!(norms(qwen("qwen2_moe", "").unwrap()), (false, true));
        let mixtral = qwen("mixtral", r#","num_local_experts":8"#).unwrap();
        assert_eq!(norms(mixtral), (false, false));
        // dense layers: Qwen's test `(i + 1) % decoder_sparse_step == 0` puts experts in
        // layers 1 and 3 of 4; `mlp_only_layers` [0] keeps the first one dense
        let layers = |extra: &str| {
            let m = qwen("qwen3_moe", extra).unwrap().moe.unwrap();
            (m.dense_layers, m.every, m.offset)
        };
        assert_eq!(layers(r#","decoder_sparse_step":2"#), (0, 2, 1));
        assert_eq!(layers(r#","mlp_only_layers":[0]"#), (1, 1, 0));
        assert_eq!(
            layers(r#","decoder_sparse_step":2,"mlp_only_layers":[0,2]"#),
            (0, 2, 1)
        );
        // experts in layers 0, 2 and 3, in none, or a list that is not one
        for (dense, says) in [
            (r#","mlp_only_layers":[1]"#, "one layer of every N"),
            (r#","decoder_sparse_step":5"#, "one layer of every N"),
            (r#","decoder_sparse_step":0"#, "positive integer"),
            (r#","mlp_only_layers":["x"]"#, "list of layer numbers"),
        ] {
            let e = qwen("qwen3_moe", dense).unwrap_err().to_string();
            assert!(e.contains(says), "{dense}: {e}");
        }
        assert!(qwen(
            "qwen3_moe",
            r#","decoder_sparse_step":1,"mlp_only_layers":[]"#
        )
        .is_ok());
    }

    /// GPT-OSS's layer types must name a full-attention layer every N-th layer: a list of
    /// sliding layers only is refused, not read as "every 0th".
    #[test]
    fn gpt_oss_without_a_full_attention_layer_is_refused() {
        let text = r#"{"model_type":"gpt_oss","hidden_size":1024,"intermediate_size":1024,
            "num_attention_heads":16,"num_hidden_layers":2,"vocab_size":32000,
            "num_local_experts":8,"num_experts_per_tok":2,"sliding_window":128,
            "layer_types":["sliding_attention","sliding_attention"]}"#;
        let e = from_config_str(Path::new("config.json"), text).unwrap_err();
        assert!(e.to_string().contains("every N-th layer"), "{e}");
    }

    #[test]
    fn malformed_configs_name_the_file_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path(), "{ not json");
        assert!(from_config_json(&p)
            .unwrap_err()
            .to_string()
            .contains("not valid JSON"));
        let p = write(
            dir.path(),
            r#"{"model_type":"llama","num_hidden_layers":2,"hidden_size":"big"}"#,
        );
        let e = from_config_json(&p).unwrap_err().to_string();
        assert!(
            e.contains("config.json") && e.contains("\"hidden_size\""),
            "{e}"
        );
        let p = write(dir.path(), r#"{"model_type":"t5"}"#);
        assert!(from_config_json(&p)
            .unwrap_err()
            .to_string()
            .contains("not supported"));
    }
}

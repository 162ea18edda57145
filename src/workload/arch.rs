//! Model architectures: a raw `ArchSpec` (from a preset, a YAML file or a Hugging Face
//! `config.json`) checked once into an `Arch`.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::limits::{MAX_HEADS, MAX_LAYERS, MAX_SEQ_LEN, MAX_VOCAB, MAX_WIDTH};

/// Megatron-LM's and GPT-NeoX's `make_vocab_size_divisible_by`.
pub const DEFAULT_VOCAB_DIVISOR: u64 = 128;
/// The largest padding multiple taken (far past any framework's).
const MAX_VOCAB_DIVISOR: u64 = 1 << 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NormKind {
    Layernorm,
    Rmsnorm,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// GELU MLP: up (d → ffn), GELU, down.
    Gelu,
    /// Gated SiLU MLP: gate and up (d → 2·ffn, fused), SwiGLU, down.
    Swiglu,
    /// Gated GELU MLP (Gemma): as SwiGLU with GELU on the gate.
    Geglu,
    /// Squared-ReLU MLP (Nemotron-4, Primer): up, relu(x)², down; not gated.
    SquaredRelu,
}

impl Activation {
    /// A gated MLP projects up to 2·ffn (gate and up, fused) before the activation.
    pub fn is_gated(self) -> bool {
        matches!(self, Activation::Swiglu | Activation::Geglu)
    }

    /// Width of the MLP's up projection for an MLP of `ffn`.
    pub fn up_width(self, ffn: u64) -> u64 {
        if self.is_gated() {
            2 * ffn
        } else {
            ffn
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttentionImpl {
    /// FlashAttention / cuDNN fused attention.
    Flash,
    /// Q·Kᵀ batched GEMM, fused scale-mask-softmax, attention·V batched GEMM.
    Unfused,
}

/// What a query or key norm normalizes over.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QkNormSpan {
    /// Each head's head_dim channels (Qwen3, Gemma 3, Megatron-Core's `qk_layernorm`).
    #[default]
    Head,
    /// The whole query or key projection (OLMo 2: `q_norm` over heads·head_dim).
    Projection,
}

/// What a fused attention kernel does with the key blocks a causal mask hides.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CausalBlocks {
    /// Skipped: the kernel is told the mask is causal (FlashAttention's `causal=True`, cuDNN's
    /// and Transformer Engine's causal masks) and does half the square's work.
    #[default]
    Skipped,
    /// Computed and masked inside: the kernel is handed an explicit bias or mask tensor instead
    /// of a causal flag (PyTorch's scaled_dot_product_attention given an `attn_mask`;
    /// llm-foundry's Triton and torch attention given MPT's ALiBi bias), so it cannot know which
    /// blocks are empty and does the full square's work.
    Computed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Position {
    Rope,
    Learned,
    Alibi,
}

/// A mixture-of-experts MLP (every layer): a router picks `top_k` of `experts` per token, each
/// expert an MLP of `expert_ffn` (gated as the model's activation); `shared_experts` MLPs of
/// `expert_ffn` see every token (Qwen2-MoE: one of `shared_ffn`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoeSpec {
    pub experts: u64,
    pub top_k: u64,
    pub expert_ffn: u64,
    #[serde(default)]
    pub shared_experts: u64,
    /// Inner size of the shared experts together (default shared_experts · expert_ffn).
    #[serde(default)]
    pub shared_ffn: Option<u64>,
    /// The first layers keep a dense MLP of `ffn_hidden` (DeepSeek's `first_k_dense_replace`).
    #[serde(default)]
    pub dense_layers: u64,
    /// After them, experts in one layer of every `every` (default 1: in every layer), the
    /// others dense: Megatron's `--moe-layer-freq N`, Llama 4's `interleave_moe_layer_step`,
    /// Qwen-MoE's `decoder_sparse_step`.
    #[serde(default = "one")]
    pub every: u64,
    /// Which layer of each `every` has them, from 0 (Megatron's: 0; Llama 4's and Qwen's:
    /// `every` − 1).
    #[serde(default)]
    pub offset: u64,
    /// Group-limited routing (DeepSeek's `n_group`, `topk_group`): the experts in `groups`
    /// equal groups, each token's top-k taken from its best `topk_groups` groups (0: no limit).
    /// A hierarchical dispatcher sends a token once per node its groups lie on.
    #[serde(default)]
    pub groups: u64,
    #[serde(default)]
    pub topk_groups: u64,
}

/// Multi-head latent attention (DeepSeek-V2/V3): queries through an optional low-rank
/// projection (`q_lora_rank`), keys and values from one shared latent of `kv_lora_rank` plus a
/// decoupled RoPE key of `qk_rope_head_dim` every head shares; each head's query and key have
/// `qk_nope_head_dim + qk_rope_head_dim` dimensions, its value `v_head_dim`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MlaSpec {
    /// Rank of the query projection (none: queries projected directly from the hidden state).
    #[serde(default)]
    pub q_lora_rank: Option<u64>,
    pub kv_lora_rank: u64,
    pub qk_nope_head_dim: u64,
    pub qk_rope_head_dim: u64,
    pub v_head_dim: u64,
}

impl MlaSpec {
    /// Dimensions of each head's query and key.
    pub fn qk_head_dim(&self) -> u64 {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// DeepSeek-V3's latent attention (its published config): a query rank of 1,536, a
    /// key-value rank of 512, 128 + 64 query and key dimensions a head and 128 value ones.
    #[cfg(test)]
    pub(crate) fn deepseek_v3() -> MlaSpec {
        MlaSpec {
            q_lora_rank: Some(1536),
            kv_lora_rank: 512,
            qk_nope_head_dim: 128,
            qk_rope_head_dim: 64,
            v_head_dim: 128,
        }
    }
}

fn one() -> u64 {
    1
}

impl MoeSpec {
    /// Whether `layer` (from 0) routes its tokens to experts.
    pub fn has_experts(&self, layer: u64) -> bool {
        layer >= self.dense_layers && (layer - self.dense_layers) % self.every == self.offset
    }

    /// How many of the first `n` layers have experts.
    pub fn expert_layers_below(&self, n: u64) -> u64 {
        let first = self.dense_layers.saturating_add(self.offset);
        if n <= first {
            0
        } else {
            (n - first - 1) / self.every + 1
        }
    }

    /// The layers of a model of `layers` that have experts, for messages: "3 to 60",
    /// "1, 3, … 47".
    pub fn expert_layers_text(&self, layers: u64) -> String {
        let n = self.expert_layers_below(layers);
        let first = self.dense_layers.saturating_add(self.offset);
        let last = first + (n.max(1) - 1) * self.every;
        match (n, self.every) {
            (0, _) => "none".into(),
            (1, _) => first.to_string(),
            (_, 1) => format!("{first} to {last}"),
            (2, _) => format!("{first} and {last}"),
            _ => format!("{first}, {}, … {last}", first + self.every),
        }
    }

    /// The dense first layers and interleaving (`dense_layers`, `every`, `offset`) that put
    /// experts in exactly the layers `pattern` marks, as Megatron's `--moe-layer-freq` list
    /// gives them; `None` where no such pattern does (no expert layer, or uneven gaps).
    pub fn layers_from_pattern(pattern: &[bool]) -> Option<(u64, u64, u64)> {
        let experts: Vec<u64> = (0u64..)
            .zip(pattern)
            .filter(|e| *e.1)
            .map(|e| e.0)
            .collect();
        let (&first, &last) = (experts.first()?, experts.last()?);
        let layers = pattern.len() as u64;
        let every = match experts.get(1) {
            Some(&second) => second - first,
            None => layers - first,
        };
        let even = experts.windows(2).all(|w| w[1] - w[0] == every);
        if !even || last + every < layers {
            return None;
        }
        Some(if first < every {
            (0, every, first)
        } else {
            (first, every, 0)
        })
    }

    /// Inner size of all shared experts together.
    pub fn shared_ffn(&self) -> u64 {
        self.shared_ffn
            .unwrap_or(self.shared_experts * self.expert_ffn)
    }
}

/// An architecture as written by a user; `validate` turns it into an `Arch`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArchSpec {
    pub name: String,
    pub layers: u64,
    pub hidden: u64,
    pub heads: u64,
    /// Key/value heads (GQA); default = heads.
    #[serde(default)]
    pub kv_heads: Option<u64>,
    /// Size of each attention head; default hidden / heads. Given explicitly by models whose
    /// heads do not tile the hidden size (Mistral-NeMo: 32 × 128 over 5,120; Gemma 2).
    #[serde(default)]
    pub head_dim: Option<u64>,
    /// MLP inner size; default 4·hidden.
    #[serde(default)]
    pub ffn_hidden: Option<u64>,
    pub vocab: u64,
    /// The vocabulary is padded to a multiple of this times tp (Megatron's
    /// `--make-vocab-size-divisible-by`, default 128); 1 keeps it as given (Hugging Face and
    /// plain PyTorch models), so a head of 50,257 rows runs on odd, unaligned GEMMs.
    #[serde(default)]
    pub vocab_divisible_by: Option<u64>,
    pub norm: NormKind,
    pub activation: Activation,
    #[serde(default)]
    pub tied_embeddings: bool,
    #[serde(default = "default_attention")]
    pub attention: AttentionImpl,
    /// Whether fused attention skips the causally masked key blocks (default) or computes them.
    #[serde(default)]
    pub causal_blocks: CausalBlocks,
    #[serde(default = "default_position")]
    pub position: Position,
    /// Biases on the linear layers (GPT-2, GPT-NeoX); LLaMA has none.
    #[serde(default)]
    pub linear_bias: bool,
    /// A bias on the QKV projection only (Qwen2).
    #[serde(default)]
    pub qkv_bias: bool,
    /// An RMSNorm on the queries and keys (Qwen3 per head, OLMo 2 over the projection).
    #[serde(default)]
    pub qk_norm: bool,
    /// What the query and key norms normalize over: each head (default) or the whole
    /// projection (OLMo 2: one weight per query and key channel).
    #[serde(default)]
    pub qk_norm_span: QkNormSpan,
    /// A norm on the attention's and the MLP's inputs (every pre-norm model; default true);
    /// false with `post_norms` is OLMo 2's reordered block, norming only the outputs.
    #[serde(default = "default_pre_norms")]
    pub pre_norms: bool,
    /// A norm on the attention's and the MLP's outputs before each residual add (Gemma 2's
    /// and 3's post-attention and post-feed-forward norms: four norms a layer; OLMo 2's only
    /// two).
    #[serde(default)]
    pub post_norms: bool,
    /// Embeddings multiplied by √hidden before the first layer (Gemma's normalizer): one
    /// pass over them each way.
    #[serde(default)]
    pub scaled_embeddings: bool,
    /// Soft-capped attention scores, cap · tanh(scores / cap) (Gemma 2's
    /// `attn_logit_softcapping`): three more kernels on an unfused attention's scores.
    #[serde(default)]
    pub attention_softcap: bool,
    /// Soft-capped logits, cap · tanh(logits / cap) (Gemma 2's `final_logit_softcapping`):
    /// three more kernels on the LM head's logits, and the tanh's output kept.
    #[serde(default)]
    pub final_softcap: bool,
    /// A bias (shift) on each norm; default: LayerNorm has one, RMSNorm none.
    #[serde(default)]
    pub norm_bias: Option<bool>,
    /// Sequence length it is usually trained at.
    #[serde(default)]
    pub seq_len: Option<u64>,
    /// Sliding-window attention (Mistral 7B v0.1, Phi-3, Gemma 2's local layers): each query
    /// sees the last `sliding_window` tokens.
    #[serde(default)]
    pub sliding_window: Option<u64>,
    /// With a sliding window, every this-many-th layer attends to the whole sequence and the
    /// others to the window (Gemma 2: 2); none: every layer slides.
    #[serde(default)]
    pub global_attention_every: Option<u64>,
    /// The window is Llama 4's chunked attention (`attention_chunk_size`): the sequence cut
    /// into chunks of `sliding_window` tokens, each query seeing the keys of its own chunk up
    /// to itself, not the last `sliding_window` tokens.
    #[serde(default)]
    pub chunked_attention: bool,
    /// Dropout in training (GPT-3: 0.1 on attention and hidden states): its masks are stored
    /// activations (one byte per element).
    #[serde(default)]
    pub dropout: bool,
    /// A mixture of experts in place of every layer's MLP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<MoeSpec>,
    /// Multi-head latent attention in place of the QKV projection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mla: Option<MlaSpec>,
}

fn default_attention() -> AttentionImpl {
    AttentionImpl::Flash
}

fn default_pre_norms() -> bool {
    true
}

fn default_position() -> Position {
    Position::Rope
}

/// A checked architecture.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Arch {
    pub name: String,
    pub layers: u64,
    pub hidden: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub ffn_hidden: u64,
    pub vocab: u64,
    pub vocab_divisible_by: u64,
    pub qkv_bias: bool,
    pub qk_norm: bool,
    pub qk_norm_span: QkNormSpan,
    pub pre_norms: bool,
    pub post_norms: bool,
    pub scaled_embeddings: bool,
    pub attention_softcap: bool,
    pub final_softcap: bool,
    pub norm: NormKind,
    pub activation: Activation,
    pub tied_embeddings: bool,
    pub attention: AttentionImpl,
    pub causal_blocks: CausalBlocks,
    pub position: Position,
    pub linear_bias: bool,
    pub norm_bias: bool,
    pub seq_len: u64,
    pub sliding_window: Option<u64>,
    pub global_attention_every: Option<u64>,
    pub chunked_attention: bool,
    pub dropout: bool,
    pub moe: Option<MoeSpec>,
    pub mla: Option<MlaSpec>,
}

impl ArchSpec {
    /// Checks the numbers; `source` names the file or preset in messages.
    pub fn validate(self, source: &str) -> Result<Arch> {
        let bad = |msg: String| Error::Invalid(format!("{source}: {msg}"));
        for (field, v, max) in [
            ("layers", self.layers, MAX_LAYERS),
            ("hidden", self.hidden, MAX_WIDTH),
            ("heads", self.heads, MAX_HEADS),
            ("vocab", self.vocab, MAX_VOCAB),
            (
                "vocab_divisible_by",
                self.vocab_divisible_by.unwrap_or(1),
                MAX_VOCAB_DIVISOR,
            ),
            ("ffn_hidden", self.ffn_hidden.unwrap_or(1), MAX_WIDTH * 4),
            ("kv_heads", self.kv_heads.unwrap_or(1), MAX_HEADS),
            ("seq_len", self.seq_len.unwrap_or(1), MAX_SEQ_LEN),
            ("head_dim", self.head_dim.unwrap_or(1), MAX_WIDTH),
            (
                "sliding_window",
                self.sliding_window.unwrap_or(1),
                MAX_SEQ_LEN,
            ),
            (
                "global_attention_every",
                self.global_attention_every.unwrap_or(1),
                MAX_LAYERS,
            ),
        ] {
            if v == 0 {
                return Err(bad(format!("{field} must be at least 1")));
            }
            if v > max {
                return Err(bad(format!(
                    "{field} = {v} is beyond any trained model: give at most {max}"
                )));
            }
        }
        if self.head_dim.is_none() && !self.hidden.is_multiple_of(self.heads) {
            return Err(bad(format!(
                "hidden ({}) must be a multiple of heads ({}), or give head_dim",
                self.hidden, self.heads
            )));
        }
        if !self.pre_norms && !self.post_norms {
            return Err(bad(
                "pre_norms: false leaves the layer without norms: set post_norms: true (OLMo \
                 2's norms on the attention's and the MLP's outputs), or drop pre_norms"
                    .into(),
            ));
        }
        if self.chunked_attention && self.sliding_window.is_none() {
            return Err(bad(
                "chunked_attention: true needs the chunk's length: set sliding_window to it \
                 (Llama 4's attention_chunk_size), or drop chunked_attention"
                    .into(),
            ));
        }
        if self.qk_norm_span == QkNormSpan::Projection && !self.qk_norm {
            return Err(bad(
                "qk_norm_span: projection spans query and key norms the model has none of: \
                 set qk_norm: true, or drop qk_norm_span"
                    .into(),
            ));
        }
        let kv_heads = self.kv_heads.unwrap_or(self.heads);
        if !self.heads.is_multiple_of(kv_heads) {
            return Err(bad(format!(
                "heads ({}) must be a multiple of kv_heads ({kv_heads})",
                self.heads
            )));
        }
        let ffn_hidden = self.ffn_hidden.unwrap_or(4 * self.hidden);
        if let Some(m) = &self.moe {
            for (field, v, max) in [
                ("moe.experts", m.experts, 1 << 14),
                ("moe.top_k", m.top_k, m.experts),
                ("moe.expert_ffn", m.expert_ffn, MAX_WIDTH * 4),
            ] {
                if v == 0 || v > max {
                    return Err(bad(format!("{field} = {v}: give between 1 and {max}")));
                }
            }
            if m.every == 0 || m.every > self.layers || m.offset >= m.every {
                return Err(bad(format!(
                    "moe.every = {} / offset = {}: give every from 1 to the {} layers and an \
                     offset below it",
                    m.every, m.offset, self.layers
                )));
            }
            if m.expert_layers_below(self.layers) == 0 {
                return Err(bad(format!(
                    "moe.dense_layers = {} (offset {}) leaves no layer with experts of {}: give \
                     fewer dense layers, or drop moe:",
                    m.dense_layers, m.offset, self.layers
                )));
            }
            let limited = m.groups > 0 || m.topk_groups > 0;
            if limited
                && !(m.groups > 0
                    && m.experts.is_multiple_of(m.groups)
                    && (1..=m.groups).contains(&m.topk_groups)
                    && m.top_k <= m.topk_groups * (m.experts / m.groups))
            {
                return Err(bad(format!(
                    "moe.groups = {} / topk_groups = {}: give groups dividing the {} experts \
                     and topk_groups from 1 to groups, holding at least top_k = {} experts \
                     (or neither, for routing without a group limit)",
                    m.groups, m.topk_groups, m.experts, m.top_k
                )));
            }
            if m.shared_experts > 64 || m.shared_ffn.is_some_and(|f| f > MAX_WIDTH * 4) {
                return Err(bad(format!(
                    "moe.shared_experts = {} / shared_ffn = {:?}: give at most 64 shared \
                     experts of at most {} together",
                    m.shared_experts,
                    m.shared_ffn,
                    MAX_WIDTH * 4
                )));
            }
        }
        if let Some(m) = &self.mla {
            for (field, v) in [
                ("mla.q_lora_rank", m.q_lora_rank.unwrap_or(1)),
                ("mla.kv_lora_rank", m.kv_lora_rank),
                ("mla.qk_nope_head_dim", m.qk_nope_head_dim),
                ("mla.qk_rope_head_dim", m.qk_rope_head_dim),
                ("mla.v_head_dim", m.v_head_dim),
            ] {
                if v == 0 || v > MAX_WIDTH {
                    return Err(bad(format!(
                        "{field} = {v}: give between 1 and {MAX_WIDTH}"
                    )));
                }
            }
            if kv_heads != self.heads {
                return Err(bad(format!(
                    "latent attention gives every query head its own key and value: kv_heads \
                     ({kv_heads}) must equal heads ({})",
                    self.heads
                )));
            }
        }
        Ok(Arch {
            moe: self.moe,
            mla: self.mla,
            // with latent attention a head's query and key width (its value width is the MLA's)
            head_dim: match &self.mla {
                Some(m) => m.qk_head_dim(),
                None => self.head_dim.unwrap_or(self.hidden / self.heads),
            },
            qkv_bias: self.qkv_bias,
            qk_norm: self.qk_norm,
            qk_norm_span: self.qk_norm_span,
            pre_norms: self.pre_norms,
            post_norms: self.post_norms,
            scaled_embeddings: self.scaled_embeddings,
            attention_softcap: self.attention_softcap,
            final_softcap: self.final_softcap,
            kv_heads,
            ffn_hidden,
            seq_len: self.seq_len.unwrap_or(2048),
            sliding_window: self.sliding_window,
            global_attention_every: self.global_attention_every,
            chunked_attention: self.chunked_attention,
            name: self.name,
            layers: self.layers,
            hidden: self.hidden,
            heads: self.heads,
            vocab: self.vocab,
            vocab_divisible_by: self.vocab_divisible_by.unwrap_or(DEFAULT_VOCAB_DIVISOR),
            norm: self.norm,
            activation: self.activation,
            tied_embeddings: self.tied_embeddings,
            attention: self.attention,
            causal_blocks: self.causal_blocks,
            position: self.position,
            linear_bias: self.linear_bias,
            norm_bias: self.norm_bias.unwrap_or(self.norm == NormKind::Layernorm),
            dropout: self.dropout,
        })
    }
}

impl Arch {
    /// The share of layers that attend over the sliding window rather than the whole
    /// sequence (0 without a window).
    pub fn local_attention_share(&self) -> f64 {
        match (self.sliding_window, self.global_attention_every) {
            (None, _) => 0.0,
            (Some(_), None) => 1.0,
            (Some(_), Some(n)) => (n - 1) as f64 / n as f64,
        }
    }

    /// Vocabulary padded as Megatron and GPT-NeoX pad it: to a multiple of
    /// `vocab_divisible_by`·tp (128·tp unless the architecture says otherwise).
    pub fn padded_vocab(&self, tp: u64) -> u64 {
        let multiple = self.vocab_divisible_by * tp;
        self.vocab.div_ceil(multiple) * multiple
    }

    /// Parameters of one transformer layer with experts (the model's layers after its dense
    /// ones) on one tensor-parallel rank that every data-parallel replica holds, and their
    /// tensor count. Column- and row-parallel weights are split over tp; norms are replicated.
    /// With experts: the attention, the router (replicated) and the shared experts; the routed
    /// experts are `expert_params`.
    pub fn layer_params(&self, tp: u64) -> (u64, u64) {
        let (f, router, mlp_tensors) = match &self.moe {
            None => (self.ffn_hidden, 0, 2),
            Some(m) => (
                m.shared_ffn(),
                self.hidden * m.experts,
                2 * (m.shared_ffn() > 0) as u64 + 1,
            ),
        };
        self.params_with_mlp(tp, f, router, mlp_tensors)
    }

    /// A dense layer of a mixture of experts (DeepSeek's first layers): attention and an MLP of
    /// `ffn_hidden`, as `layer_params` counts them.
    pub fn dense_layer_params(&self, tp: u64) -> (u64, u64) {
        self.params_with_mlp(tp, self.ffn_hidden, 0, 2)
    }

    /// A layer's projections — the weight matrices Megatron accumulates into their fp32 main
    /// gradients inside the weight-gradient GEMM, unlike its other tensors (norms, biases, a
    /// mixture's router), which take a kernel each: QKV and output, or latent attention's
    /// (query down and up, or one query projection; key-value down and up; output), and the
    /// dense MLP's or shared experts' up and down. `dense`: a mixture's dense layer.
    pub fn layer_projections(&self, dense: bool) -> u64 {
        let attention = self
            .mla
            .map_or(2, |m| 4 + u64::from(m.q_lora_rank.is_some()));
        let mlp = match &self.moe {
            Some(m) if !dense => 2 * u64::from(m.shared_ffn() > 0),
            _ => 2,
        };
        attention + mlp
    }

    /// Layers with a dense MLP: all of a dense model's; a mixture's first `dense_layers` and
    /// those its interleaving leaves without experts.
    pub fn dense_layers(&self) -> u64 {
        self.dense_layers_in(0..self.layers)
    }

    /// Of the layers `range`, those with a dense MLP.
    pub fn dense_layers_in(&self, range: std::ops::Range<u64>) -> u64 {
        let routed = self.moe.map_or(0, |m| {
            m.expert_layers_below(range.end) - m.expert_layers_below(range.start)
        });
        range.end - range.start - routed
    }

    /// Whether `layer` (from 0) routes its tokens to experts.
    pub fn has_experts(&self, layer: u64) -> bool {
        self.moe.is_some_and(|m| m.has_experts(layer))
    }

    /// A layer's parameters on one rank with an MLP every token runs of `f` (the dense MLP or
    /// the shared experts; its `mlp_tensors` include the router's) and a router of `router`.
    fn params_with_mlp(&self, tp: u64, f: u64, router: u64, mlp_tensors: u64) -> (u64, u64) {
        let d = self.hidden;
        let up_out = self.activation.up_width(f);
        let bias = self.linear_bias as u64;
        let norm_tensors = 1 + self.norm_bias as u64;
        let norm = norm_tensors * d;
        let (attn_sharded, attn_replicated, attn_tensors) = self.attention_params();
        let sharded = attn_sharded
            + d * up_out + bias * up_out           // MLP up (and gate)
            + f * d; // MLP down

        // two norms a layer before the attention and the MLP, two more after them
        let norms = 2 * self.pre_norms as u64 + 2 * self.post_norms as u64;
        let replicated = norms * norm + bias * 2 * d + attn_replicated + router;
        let tensors = norms * norm_tensors + attn_tensors + mlp_tensors + 2 * bias;
        (sharded / tp + replicated, tensors)
    }

    /// The attention's parameters: split over tp, replicated on every tp rank, and tensors.
    fn attention_params(&self) -> (u64, u64, u64) {
        let d = self.hidden;
        if let Some(m) = &self.mla {
            let h = self.heads;
            let q_width = h * m.qk_head_dim();
            // down-projections and their norms are replicated (Megatron-Core's MLA)
            let (q_sharded, q_replicated, q_tensors) = match m.q_lora_rank {
                Some(r) => (r * q_width, d * r + r, 3),
                None => (d * q_width, 0, 1),
            };
            let kv_down = d * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank;
            let kv_up = m.kv_lora_rank * h * (m.qk_nope_head_dim + m.v_head_dim);
            let out = h * m.v_head_dim * d;
            return (
                q_sharded + kv_up + out,
                q_replicated + kv_down,
                q_tensors + 4,
            );
        }
        let qkv_out = (self.heads + 2 * self.kv_heads) * self.head_dim;
        let bias = self.linear_bias as u64;
        let qkv_bias = (self.linear_bias || self.qkv_bias) as u64;
        // QKV column-parallel, output row-parallel (its bias replicated); query and key
        // norms: one head_dim vector each per head, replicated, or one weight a channel
        let sharded = d * qkv_out + qkv_bias * qkv_out + self.heads * self.head_dim * d;
        let qk_width = match self.qk_norm_span {
            QkNormSpan::Head => 2 * self.head_dim,
            QkNormSpan::Projection => (self.heads + self.kv_heads) * self.head_dim,
        };
        let qk_norm = qk_width * self.qk_norm as u64;
        (
            sharded,
            qk_norm,
            2 + bias + qkv_bias + 2 * self.qk_norm as u64,
        )
    }

    /// The routed experts of one layer on one rank — experts / ep of them, each split over tp
    /// — and their tensor count (0 for a dense model).
    pub fn expert_params(&self, tp: u64, ep: u64) -> (u64, u64) {
        match &self.moe {
            None => (0, 0),
            Some(m) => {
                let (d, f) = (self.hidden, m.expert_ffn);
                let one = d * self.activation.up_width(f) + f * d;
                let local = m.experts / ep;
                (local * one / tp, 2 * local)
            }
        }
    }

    /// Parameters a token passes through in one layer (attention, router, shared and top-k
    /// experts): what "active parameters" counts.
    pub fn active_layer_params(&self) -> u64 {
        let (dense, _) = self.layer_params(1);
        match &self.moe {
            None => dense,
            Some(m) => dense + self.expert_params(1, m.experts).0 * m.top_k,
        }
    }

    /// Embedding table (or LM head) parameters on one rank: padded vocabulary over tp × hidden.
    pub fn vocab_params(&self, tp: u64) -> u64 {
        self.padded_vocab(tp) / tp * self.hidden
    }

    /// A learned position table (GPT-2, GPT-3): one vector per position trained at, held
    /// whole by every tensor-parallel rank of the first stage.
    pub fn position_params(&self) -> u64 {
        if self.position == Position::Learned {
            self.seq_len * self.hidden
        } else {
            0
        }
    }

    /// Parameters of the final norm.
    pub fn final_norm_params(&self) -> u64 {
        (1 + self.norm_bias as u64) * self.hidden
    }

    /// All parameters of the model (tp = 1), for reports.
    pub fn total_params(&self) -> u64 {
        let dense = self.dense_layers();
        let layer = self.layer_params(1).0 + self.expert_params(1, 1).0;
        let dense_layer = self.dense_layer_params(1).0;
        let final_norm = self.final_norm_params();
        let heads = if self.tied_embeddings { 1 } else { 2 };
        layer * (self.layers - dense)
            + dense_layer * dense
            + final_norm
            + heads * self.vocab * self.hidden
            + self.position_params()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama2_7b_has_6_7_billion_parameters() {
        // meta-llama/Llama-2-7b-hf holds 6,738,415,616
        assert_eq!(
            Arch::resolve("llama2-7b").unwrap().total_params(),
            6_738_415_616
        );
    }

    #[test]
    fn llama2_70b_uses_gqa() {
        let a = Arch::resolve("llama2-70b").unwrap();
        assert_eq!(a.kv_heads, 8);
        assert_eq!(a.total_params(), 68_976_648_192);
    }

    #[test]
    fn gpt3_175b_matches_its_name() {
        let p = Arch::resolve("gpt3-175b").unwrap().total_params() as f64;
        assert!((p - 175e9).abs() / 175e9 < 0.02, "{p}");
    }

    #[test]
    fn paper_presets_count_parameters_as_the_paper_does() {
        // predictions/llemma_7b_4_2_2_P_predicted.csv: 906,283,008 parameters per rank on a
        // 9-layer stage at tp 2
        // (the paper also splits the row-parallel biases over tp, which Megatron replicates:
        // 4,096 more here per layer, 0.004 %)
        let a = Arch::resolve("llemma-7b").unwrap();
        assert_eq!(a.layer_params(2).0 * 9, 906_283_008 + 9 * 4096);
        assert_eq!(a.layer_params(2).1, 12);
    }

    #[test]
    fn vocabulary_is_padded_to_128_tp() {
        let a = Arch::resolve("llemma-7b").unwrap();
        assert_eq!(a.padded_vocab(2) / 2, 25216);
        // unpadded, only to a multiple of tp (Megatron with --make-vocab-size-divisible-by 1)
        let gpt2 = Arch {
            vocab: 50257,
            vocab_divisible_by: 1,
            ..a
        };
        assert_eq!(gpt2.padded_vocab(1), 50257);
        assert_eq!(gpt2.padded_vocab(2) / 2, 25129);
    }

    /// Each number an architecture gives is taken up to its bound and refused at 0 and past
    /// it, naming the file and the field; what it leaves out is filled in as documented.
    #[test]
    fn an_architecture_is_taken_up_to_each_bound() {
        let llama = || crate::workload::presets::preset("llama2-7b").unwrap(); // 32 × 4096, 32 heads
        let check = |spec: ArchSpec| spec.validate("a.yaml").map_err(|e| e.to_string());
        let refuses = |r: Result<Arch, String>, field: &str| match r {
            Err(e) => assert!(e.contains("a.yaml: ") && e.contains(field), "{field}: {e}"),
            Ok(_) => panic!("{field} taken"),
        };
        type Set = fn(&mut ArchSpec, u64);
        let fields: [(&str, u64, Set); 8] = [
            ("layers ", MAX_LAYERS, |s, v| s.layers = v),
            ("hidden ", MAX_WIDTH, |s, v| s.hidden = v),
            ("vocab ", MAX_VOCAB, |s, v| s.vocab = v),
            ("vocab_divisible_by ", MAX_VOCAB_DIVISOR, |s, v| {
                s.vocab_divisible_by = Some(v)
            }),
            ("ffn_hidden ", MAX_WIDTH * 4, |s, v| s.ffn_hidden = Some(v)),
            ("seq_len ", MAX_SEQ_LEN, |s, v| s.seq_len = Some(v)),
            ("sliding_window ", MAX_SEQ_LEN, |s, v| {
                s.sliding_window = Some(v)
            }),
            ("global_attention_every ", MAX_LAYERS, |s, v| {
                (s.sliding_window, s.global_attention_every) = (Some(4096), Some(v))
            }),
        ];
        let with = |f: &dyn Fn(&mut ArchSpec)| {
            let mut spec = llama();
            f(&mut spec);
            check(spec)
        };
        for (field, max, set) in fields {
            for v in [0, max + 1] {
                refuses(with(&|s| set(s, v)), field);
            }
            with(&|s| set(s, max)).unwrap_or_else(|e| panic!("{field} = {max}: {e}"));
        }
        // heads: a multiple of kv_heads, dividing hidden unless head_dim is given
        refuses(with(&|s| s.kv_heads = Some(5)), "multiple of kv_heads (5)");
        refuses(with(&|s| s.heads = 30), "multiple of heads (30)");
        assert_eq!(
            with(&|s| (s.heads, s.kv_heads, s.head_dim) = (30, None, Some(128)))
                .unwrap()
                .head_dim,
            128
        );
        let filled = with(&|s| {
            (s.ffn_hidden, s.kv_heads, s.seq_len) = (None, None, None);
            (s.vocab_divisible_by, s.norm_bias) = (None, None);
        })
        .unwrap();
        assert_eq!(
            (filled.ffn_hidden, filled.kv_heads, filled.head_dim),
            (4 * 4096, 32, 128)
        );
        assert_eq!((filled.seq_len, filled.vocab_divisible_by), (2048, 128));
        assert!(!filled.norm_bias);
        assert!(
            with(&|s| (s.norm, s.norm_bias) = (NormKind::Layernorm, None))
                .unwrap()
                .norm_bias
        );
    }

    /// A mixture's and a latent attention's numbers, bounded as the model's own are.
    #[test]
    fn experts_and_latent_attention_are_taken_up_to_each_bound() {
        let mixtral = |f: fn(&mut MoeSpec)| {
            let mut spec = crate::workload::presets::preset("llama2-7b").unwrap();
            // 8 experts, top-2, an MLP of 14,336, no shared experts, no dense layer
            let mut moe = crate::workload::presets::mixtral_8x7b().moe.unwrap();
            f(&mut moe);
            spec.moe = Some(moe);
            spec.validate("m.yaml").map_err(|e| e.to_string())
        };
        let refused = |r: Result<Arch, String>| r.expect_err("refused");
        assert!(mixtral(|m| m.experts = 1 << 14).is_ok());
        assert!(refused(mixtral(|m| m.experts = 0)).contains("moe.experts = 0"));
        assert!(refused(mixtral(|m| m.experts = (1 << 14) + 1)).contains("moe.experts"));
        assert!(mixtral(|m| m.top_k = 8).is_ok());
        assert!(refused(mixtral(|m| m.top_k = 0)).contains("moe.top_k = 0"));
        assert!(refused(mixtral(|m| m.top_k = 9)).contains("moe.top_k = 9: give between 1 and 8"));
        assert!(mixtral(|m| m.expert_ffn = MAX_WIDTH * 4).is_ok());
        assert!(refused(mixtral(|m| m.expert_ffn = 0)).contains("moe.expert_ffn = 0"));
        let e = refused(mixtral(|m| m.expert_ffn = MAX_WIDTH * 4 + 1));
        assert!(
            e.contains(&format!("moe.expert_ffn = {}", MAX_WIDTH * 4 + 1)),
            "{e}"
        );
        assert!(mixtral(|m| m.dense_layers = 31).is_ok());
        assert!(refused(mixtral(|m| m.dense_layers = 32)).contains("leaves no layer"));
        assert!(refused(mixtral(|m| m.dense_layers = u64::MAX)).contains("leaves no layer"));
        // interleaving: every from 1 to the layers, the offset below it, some layer left
        assert!(mixtral(|m| (m.every, m.offset) = (32, 31)).is_ok());
        assert!(mixtral(|m| (m.dense_layers, m.every, m.offset) = (30, 2, 1)).is_ok());
        for (e, says) in [
            (mixtral(|m| m.every = 0), "moe.every = 0 / offset = 0"),
            (mixtral(|m| m.every = 33), "moe.every = 33 / offset = 0"),
            (
                mixtral(|m| (m.every, m.offset) = (2, 2)),
                "moe.every = 2 / offset = 2",
            ),
        ] {
            let e = refused(e);
            assert!(e.contains(says) && e.contains("offset below it"), "{e}");
        }
        let e = refused(mixtral(|m| {
            (m.dense_layers, m.every, m.offset) = (31, 2, 1)
        }));
        assert!(
            e.contains("moe.dense_layers = 31 (offset 1) leaves no layer"),
            "{e}"
        );
        // group-limited routing: groups dividing the experts, topk_groups in 1..=groups
        // holding top_k experts
        assert!(mixtral(|m| (m.groups, m.topk_groups) = (4, 1)).is_ok());
        for e in [
            mixtral(|m| (m.groups, m.topk_groups) = (3, 1)),
            mixtral(|m| (m.groups, m.topk_groups) = (4, 0)),
            mixtral(|m| (m.groups, m.topk_groups) = (4, 5)),
            mixtral(|m| (m.groups, m.topk_groups) = (0, 1)),
            mixtral(|m| (m.groups, m.topk_groups) = (8, 1)),
        ] {
            assert!(refused(e).contains("moe.groups"));
        }
        assert!(mixtral(|m| m.shared_experts = 64).is_ok());
        assert!(mixtral(|m| m.shared_ffn = Some(MAX_WIDTH * 4)).is_ok());
        assert!(refused(mixtral(|m| m.shared_experts = 65)).contains("moe.shared_experts = 65"));
        assert!(refused(mixtral(|m| m.shared_ffn = Some(MAX_WIDTH * 4 + 1))).contains("shared"));

        let latent = |f: &dyn Fn(&mut MlaSpec)| {
            let mut spec = crate::workload::presets::preset("llama2-7b").unwrap();
            let mut mla = MlaSpec::deepseek_v3();
            f(&mut mla);
            spec.mla = Some(mla);
            spec.validate("l.yaml").map_err(|e| e.to_string())
        };
        assert_eq!(latent(&|_| {}).unwrap().head_dim, 128 + 64);
        assert!(latent(&|m| m.q_lora_rank = None).is_ok());
        type Set = fn(&mut MlaSpec, u64);
        let fields: [(&str, Set); 5] = [
            ("mla.q_lora_rank", |m, v| m.q_lora_rank = Some(v)),
            ("mla.kv_lora_rank", |m, v| m.kv_lora_rank = v),
            ("mla.qk_nope_head_dim", |m, v| m.qk_nope_head_dim = v),
            ("mla.qk_rope_head_dim", |m, v| m.qk_rope_head_dim = v),
            ("mla.v_head_dim", |m, v| m.v_head_dim = v),
        ];
        for (field, set) in fields {
            for (v, ok) in [(0, false), (MAX_WIDTH, true), (MAX_WIDTH + 1, false)] {
                match latent(&|m| set(m, v)) {
                    Ok(_) => assert!(ok, "{field} = {v} taken"),
                    Err(e) => {
                        assert!(!ok, "{field} = {v}: {e}");
                        assert!(e.contains(&format!("{field} = {v}")), "{e}");
                    }
                }
            }
        }
        let mut grouped = crate::workload::presets::preset("llama2-7b").unwrap();
        (grouped.kv_heads, grouped.mla) = (Some(8), Some(MlaSpec::deepseek_v3()));
        let e = grouped.validate("l.yaml").unwrap_err().to_string();
        assert!(e.contains("kv_heads (8) must equal heads (32)"), "{e}");
    }

    /// Dense layers between expert ones: Megatron's `i % N == 0` and Llama 4's / Qwen's
    /// `(i + 1) % N == 0`, after dense first layers or not.
    #[test]
    fn interleaved_experts_are_placed_layer_by_layer() {
        let moe = |dense_layers, every, offset| MoeSpec {
            dense_layers,
            every,
            offset,
            ..crate::workload::presets::mixtral_8x7b().moe.unwrap()
        };
        let placed = |m: MoeSpec, n: u64| (0..n).filter(|&i| m.has_experts(i)).collect::<Vec<_>>();
        assert_eq!(placed(moe(0, 1, 0), 4), [0, 1, 2, 3]);
        assert_eq!(placed(moe(3, 1, 0), 6), [3, 4, 5]);
        assert_eq!(placed(moe(0, 2, 0), 6), [0, 2, 4]);
        assert_eq!(placed(moe(0, 2, 1), 6), [1, 3, 5]);
        assert_eq!(placed(moe(1, 3, 1), 9), [2, 5, 8]);
        for m in [
            moe(0, 1, 0),
            moe(3, 1, 0),
            moe(0, 2, 1),
            moe(1, 3, 1),
            moe(2, 4, 3),
        ] {
            for n in 0..12 {
                assert_eq!(
                    m.expert_layers_below(n),
                    placed(m, n).len() as u64,
                    "{m:?} {n}"
                );
            }
            // the pattern of 12 layers read back places them in the same layers
            let pattern: Vec<bool> = (0..12).map(|i| m.has_experts(i)).collect();
            let (d, e, o) = MoeSpec::layers_from_pattern(&pattern).unwrap();
            assert_eq!(placed(moe(d, e, o), 12), placed(m, 12), "{m:?}");
        }
        assert_eq!(moe(3, 1, 0).expert_layers_text(61), "3 to 60");
        assert_eq!(moe(0, 2, 1).expert_layers_text(48), "1, 3, … 47");
        assert_eq!(moe(0, 2, 1).expert_layers_text(4), "1 and 3");
        assert_eq!(moe(0, 4, 3).expert_layers_text(4), "3");
        assert_eq!(moe(4, 1, 0).expert_layers_text(4), "none");
        // none, uneven gaps, or a last stretch longer than the gap: no such pattern
        let marks = |s: &str| s.chars().map(|c| c == '1').collect::<Vec<_>>();
        assert_eq!(MoeSpec::layers_from_pattern(&marks("0000")), None);
        assert_eq!(MoeSpec::layers_from_pattern(&marks("1011")), None);
        assert_eq!(MoeSpec::layers_from_pattern(&marks("101000")), None);
        assert_eq!(
            MoeSpec::layers_from_pattern(&marks("0001")),
            Some((3, 1, 0))
        );
        assert_eq!(
            MoeSpec::layers_from_pattern(&marks("0010")),
            Some((2, 2, 0))
        );
        // one expert layer: the gap to the end is its period
        assert_eq!(
            MoeSpec::layers_from_pattern(&marks("0100")),
            Some((0, 3, 1))
        );

        // Mixtral 8x7B with every other MLP dense (of its 14,336): 16 layers of each
        let all_experts = crate::workload::presets::mixtral_8x7b();
        let half = Arch {
            moe: Some(moe(0, 2, 1)),
            ..all_experts.clone()
        };
        assert_eq!((half.dense_layers(), half.dense_layers_in(3..8)), (16, 2));
        assert!(!half.has_experts(0) && half.has_experts(1));
        let expert_layer = half.layer_params(1).0 + half.expert_params(1, 1).0;
        assert_eq!(
            all_experts.total_params() - half.total_params(),
            16 * (expert_layer - half.dense_layer_params(1).0)
        );
    }

    #[test]
    fn bad_architectures_say_what_to_fix() {
        let mut spec = crate::workload::presets::preset("llama2-7b").unwrap();
        spec.heads = 30;
        let e = spec.validate("x.yaml").unwrap_err().to_string();
        assert!(
            e.contains("x.yaml") && e.contains("multiple of heads (30)"),
            "{e}"
        );
        let e = Arch::resolve("llama9-1t").unwrap_err().to_string();
        assert!(
            e.contains("unknown model 'llama9-1t'") && e.contains("llama2-7b"),
            "{e}"
        );
    }
}

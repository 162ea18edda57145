//! Operators: what one measured or predicted kernel call is (kind, data type, phase, shape).
//!
//! Training and prediction both describe work in these terms, and `features` turns them into the
//! one feature vector both use.
//!
//! How the paper's per-layer operators map onto these kinds (so that one GEMM model serves any
//! architecture — SwiGLU, GQA, untied heads — not only GPT-NeoX's), with b = micro-batch,
//! l = sequence, d = hidden, h = heads, t = tensor-parallel degree, v = padded vocabulary:
//!
//! | paper op      | kind                       | shape                                         |
//! |---------------|----------------------------|-----------------------------------------------|
//! | linear1 (QKV) | gemm, role qkv             | m = b·l, k = d, n = 3d/t (GQA: (h+2·kv)·d/h/t) |
//! | linear2       | gemm, role attn_out        | m = b·l, k = d/t, n = d                        |
//! | linear3       | gemm, role mlp_up          | m = b·l, k = d, n = ffn/t (SwiGLU: 2·ffn/t)    |
//! | linear4       | gemm, role mlp_down        | m = b·l, k = ffn/t, n = d                      |
//! | linear_final  | gemm, role lm_head         | m = b·l, k = d, n = v/t                        |
//! | baddbmm       | gemm, role attn_scores     | batch = b·h/t, m = l, n = l, k = d/h           |
//! | bmm           | gemm, role attn_context    | batch = b·h/t, m = l, n = d/h, k = l           |
//! | flash_atten   | flash_attention            | batch b, seq l, heads h/t, head_dim d/h        |
//! | softmax, ScaledUpperTriangMaskedSoftmax, fillmask | softmax, scale_mask_softmax, fill_mask | attention scores [b, h/t, l, l] |
//! | RMSlayernorm, layernorm | rmsnorm, layernorm | tokens b·l, width d                            |
//! | gelu          | gelu                       | tokens b·l, width ffn/t                        |
//! | res_add       | residual_add               | tokens b·l, width d                            |
//! | RoPE          | rope                       | tokens b·l, width d/t (q heads on the rank)    |
//! | embedding     | embedding                  | tokens b·l, hidden d, vocab v/t                |
//! | parallel_cross_entropy | cross_entropy     | tokens b·l, width v/t                          |
//! | *Stage_optimizer | optimizer_step, role first/middle/last_stage | parameters and tensors on the rank |
//!
//! A GEMM's backward is its two GEMMs (data gradient and weight gradient) timed together, as
//! the paper's backward columns are.

pub mod features;
pub mod work;

use std::fmt;

use serde::{Deserialize, Serialize};

crate::named_enum!(
    /// Element type of the operator's tensors.
    pub enum Dtype {
        Fp32 => "fp32",
        Tf32 => "tf32",
        Fp16 => "fp16",
        Bf16 => "bf16",
        Fp8 => "fp8",
    }
);

impl Dtype {
    pub fn bytes(self) -> f64 {
        match self {
            Dtype::Fp32 | Dtype::Tf32 => 4.0,
            Dtype::Fp16 | Dtype::Bf16 => 2.0,
            Dtype::Fp8 => 1.0,
        }
    }

    /// fp16 or bf16: what Megatron's fused kernels (softmax, norms) take.
    pub fn is_16_bit(self) -> bool {
        matches!(self, Dtype::Fp16 | Dtype::Bf16)
    }

    /// Another type that runs on the same units at the same rate, used when a model for the
    /// exact type is missing (fp16 and bf16 share tensor-core throughput on A100/H100/MI300).
    pub fn twin(self) -> Option<Dtype> {
        match self {
            Dtype::Fp16 => Some(Dtype::Bf16),
            Dtype::Bf16 => Some(Dtype::Fp16),
            _ => None,
        }
    }
}

crate::named_enum!(
    /// Forward and backward are separate regression targets; collectives and the optimizer step
    /// have no direction.
    pub enum Phase {
        Fwd => "fwd",
        Bwd => "bwd",
        None => "none",
    }
);

crate::named_enum!(
    /// Every operator kind stepcast measures and predicts.
    pub enum OpKind {
        Gemm => "gemm",
        FlashAttention => "flash_attention",
        Softmax => "softmax",
        ScaleMaskSoftmax => "scale_mask_softmax",
        FillMask => "fill_mask",
        LayerNorm => "layernorm",
        RmsNorm => "rmsnorm",
        Gelu => "gelu",
        Swiglu => "swiglu",
        ResidualAdd => "residual_add",
        /// A memory-bound kernel that reads one tensor and writes one of the same size:
        /// copies, transposes, casts, dropout masks applied, bias-gradient reductions, zeroing.
        Elementwise => "elementwise",
        Rope => "rope",
        Embedding => "embedding",
        CrossEntropy => "cross_entropy",
        OptimizerStep => "optimizer_step",
        AllReduce => "all_reduce",
        AllGather => "all_gather",
        ReduceScatter => "reduce_scatter",
        AllToAll => "all_to_all",
        SendRecv => "send_recv",
    }
);

crate::named_enum!(
    /// Where in a model an operator call sits. Optional on a measurement; lets a per-role model
    /// win over the pooled one where it measures better.
    pub enum Role {
        Qkv => "qkv",
        AttnOut => "attn_out",
        MlpUp => "mlp_up",
        MlpDown => "mlp_down",
        LmHead => "lm_head",
        AttnScores => "attn_scores",
        AttnContext => "attn_context",
        FirstStage => "first_stage",
        MiddleStage => "middle_stage",
        LastStage => "last_stage",
        /// An attention call run by FlashAttention-2 rather than the kernel the pooled model
        /// measured (a dataset that timed FA2 itself trains a model of this role).
        FlashAttention2 => "flash_attention_2",
        /// Megatron's optimizer step: one fused multi-tensor Adam over the fp32 state, the
        /// same on every pipeline stage (what `bench collect` times with PyTorch's fused AdamW).
        FusedAdam => "fused_adam",
        /// A cross-entropy run as one fused kernel over the 16-bit logits (Transformer
        /// Engine's, `CrossEntropy::Fused`) rather than the unfused vocabulary-parallel one the
        /// pooled rows timed: no model of its own, so its roofline.
        FusedCrossEntropy => "fused_cross_entropy",
    }
);

impl Role {
    /// Whether the model pooled over every role of the kind may answer this role when it has
    /// no model of its own. Not a fused Adam step: the optimizer pool is the paper's GPT-NeoX
    /// per-stage steps, with a per-tensor host cost a fused kernel does not pay.
    pub fn falls_back_to_pool(self) -> bool {
        !matches!(self, Role::FusedAdam | Role::FusedCrossEntropy)
    }

    /// The role names another kernel than the pooled rows of its kind timed (FlashAttention-2
    /// beside cuDNN attention, a fused cross-entropy beside the unfused one): its rows train
    /// only their own model, since a pooled model would average two kernels of different speed.
    pub fn is_another_kernel(self) -> bool {
        matches!(self, Role::FlashAttention2 | Role::FusedCrossEntropy)
    }

    /// A GEMM of this role multiplies by weights: its backward computes weight gradients too.
    pub fn has_weights(self) -> bool {
        matches!(
            self,
            Role::Qkv | Role::AttnOut | Role::MlpUp | Role::MlpDown | Role::LmHead
        )
    }
}

/// The shape vocabulary an operator kind is described in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShapeFamily {
    Gemm,
    Attention,
    Tokens,
    Lookup,
    Collective,
    Optimizer,
}

impl ShapeFamily {
    /// Column names in dataset files, in order.
    pub fn columns(self) -> &'static [&'static str] {
        match self {
            ShapeFamily::Gemm => &["m", "n", "k", "batch"],
            ShapeFamily::Attention => &[
                "batch", "seq_q", "seq_kv", "heads", "kv_heads", "head_dim", "causal",
            ],
            ShapeFamily::Tokens => &["batch", "seq", "width"],
            ShapeFamily::Lookup => &["batch", "seq", "hidden", "vocab"],
            ShapeFamily::Collective => &["bytes", "ranks", "nodes", "gpus_per_node"],
            ShapeFamily::Optimizer => &["params", "tensors"],
        }
    }
}

impl OpKind {
    pub fn family(self) -> ShapeFamily {
        use OpKind::*;
        match self {
            Gemm => ShapeFamily::Gemm,
            FlashAttention | Softmax | ScaleMaskSoftmax | FillMask => ShapeFamily::Attention,
            LayerNorm | RmsNorm | Gelu | Swiglu | ResidualAdd | Elementwise | Rope
            | CrossEntropy => ShapeFamily::Tokens,
            Embedding => ShapeFamily::Lookup,
            AllReduce | AllGather | ReduceScatter | AllToAll | SendRecv => ShapeFamily::Collective,
            OptimizerStep => ShapeFamily::Optimizer,
        }
    }

    pub fn is_collective(self) -> bool {
        self.family() == ShapeFamily::Collective
    }

    /// The phases this kind is measured in.
    pub fn phases(self) -> &'static [Phase] {
        match self.family() {
            ShapeFamily::Collective | ShapeFamily::Optimizer => &[Phase::None],
            _ => &[Phase::Fwd, Phase::Bwd],
        }
    }
}

/// `Y[m,n] = X[m,k] · W[k,n]`, `batch` independent products (1 for a plain GEMM).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GemmShape {
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub batch: u64,
}

/// Attention over `heads` query heads of `head_dim` (on this rank), `kv_heads` key/value heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AttentionShape {
    pub batch: u64,
    pub seq_q: u64,
    pub seq_kv: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub causal: bool,
}

/// A pointwise or row-wise operator on `batch·seq` token rows of `width` elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TokenShape {
    pub batch: u64,
    pub seq: u64,
    pub width: u64,
}

/// An embedding lookup of `batch·seq` tokens into a `vocab × hidden` table (vocab on this rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LookupShape {
    pub batch: u64,
    pub seq: u64,
    pub hidden: u64,
    pub vocab: u64,
}

/// A collective over `ranks = nodes · gpus_per_node` GPUs. `bytes` follows nccl-tests: the full
/// buffer of an all-reduce, the gathered output of an all-gather, the input of a reduce-scatter,
/// each rank's send buffer of an all-to-all, the message of a send/recv.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CollectiveShape {
    pub bytes: u64,
    pub nodes: u64,
    pub gpus_per_node: u64,
}

impl CollectiveShape {
    pub fn ranks(&self) -> u64 {
        self.nodes.saturating_mul(self.gpus_per_node)
    }
}

/// One optimizer step over the parameters held by a rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OptimizerShape {
    pub params: u64,
    pub tensors: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Shape {
    Gemm(GemmShape),
    Attention(AttentionShape),
    Tokens(TokenShape),
    Lookup(LookupShape),
    Collective(CollectiveShape),
    Optimizer(OptimizerShape),
}

impl Shape {
    pub fn family(&self) -> ShapeFamily {
        match self {
            Shape::Gemm(_) => ShapeFamily::Gemm,
            Shape::Attention(_) => ShapeFamily::Attention,
            Shape::Tokens(_) => ShapeFamily::Tokens,
            Shape::Lookup(_) => ShapeFamily::Lookup,
            Shape::Collective(_) => ShapeFamily::Collective,
            Shape::Optimizer(_) => ShapeFamily::Optimizer,
        }
    }

    /// Values in the order of `ShapeFamily::columns`.
    pub fn values(&self) -> Vec<u64> {
        match *self {
            Shape::Gemm(s) => vec![s.m, s.n, s.k, s.batch],
            Shape::Attention(s) => vec![
                s.batch,
                s.seq_q,
                s.seq_kv,
                s.heads,
                s.kv_heads,
                s.head_dim,
                s.causal as u64,
            ],
            Shape::Tokens(s) => vec![s.batch, s.seq, s.width],
            Shape::Lookup(s) => vec![s.batch, s.seq, s.hidden, s.vocab],
            Shape::Collective(s) => vec![s.bytes, s.ranks(), s.nodes, s.gpus_per_node],
            Shape::Optimizer(s) => vec![s.params, s.tensors],
        }
    }

    /// Builds and checks a shape from values in column order.
    pub fn from_values(family: ShapeFamily, v: &[u64]) -> Result<Shape, String> {
        let cols = family.columns();
        if v.len() != cols.len() {
            return Err(format!(
                "expected {} shape values, got {}",
                cols.len(),
                v.len()
            ));
        }
        check_dims(cols, v)?;
        let shape = match family {
            ShapeFamily::Gemm => Shape::Gemm(GemmShape {
                m: v[0],
                n: v[1],
                k: v[2],
                batch: v[3],
            }),
            ShapeFamily::Attention => {
                if v[6] > 1 {
                    return Err(format!("causal must be 0 or 1, got {}", v[6]));
                }
                Shape::Attention(AttentionShape {
                    batch: v[0],
                    seq_q: v[1],
                    seq_kv: v[2],
                    heads: v[3],
                    kv_heads: v[4],
                    head_dim: v[5],
                    causal: v[6] == 1,
                })
            }
            ShapeFamily::Tokens => Shape::Tokens(TokenShape {
                batch: v[0],
                seq: v[1],
                width: v[2],
            }),
            ShapeFamily::Lookup => Shape::Lookup(LookupShape {
                batch: v[0],
                seq: v[1],
                hidden: v[2],
                vocab: v[3],
            }),
            ShapeFamily::Collective => {
                let s = CollectiveShape {
                    bytes: v[0],
                    nodes: v[2],
                    gpus_per_node: v[3],
                };
                if s.ranks() != v[1] {
                    return Err(format!(
                        "ranks = {} but nodes × gpus_per_node = {} × {} = {}",
                        v[1],
                        s.nodes,
                        s.gpus_per_node,
                        s.ranks()
                    ));
                }
                Shape::Collective(s)
            }
            ShapeFamily::Optimizer => Shape::Optimizer(OptimizerShape {
                params: v[0],
                tensors: v[1],
            }),
        };
        shape.validate()?;
        Ok(shape)
    }

    /// Every dimension must be at least 1 (a causal flag may be 0) and within the physical
    /// limits; heads must be a multiple of the key/value heads; a collective needs two ranks.
    pub fn validate(&self) -> Result<(), String> {
        check_dims(self.family().columns(), &self.values())?;
        match self {
            Shape::Attention(a) if a.heads % a.kv_heads != 0 => Err(format!(
                "heads ({}) must be a multiple of kv_heads ({})",
                a.heads, a.kv_heads
            )),
            Shape::Collective(c) if c.ranks() < 2 => {
                Err("a collective needs at least 2 ranks".to_string())
            }
            _ => Ok(()),
        }
    }

    pub fn gemm(&self) -> Option<&GemmShape> {
        match self {
            Shape::Gemm(s) => Some(s),
            _ => None,
        }
    }

    pub fn collective(&self) -> Option<&CollectiveShape> {
        match self {
            Shape::Collective(s) => Some(s),
            _ => None,
        }
    }
}

/// Each value at least 1 (a causal flag 0 or 1) and at most the physical limit of its column.
fn check_dims(cols: &[&str], values: &[u64]) -> Result<(), String> {
    use crate::limits::{MAX_COLLECTIVE_SPAN, MAX_SHAPE_DIM};
    for (name, &value) in cols.iter().zip(values) {
        let max = match *name {
            "causal" => continue,
            "nodes" | "gpus_per_node" | "ranks" => MAX_COLLECTIVE_SPAN,
            _ => MAX_SHAPE_DIM,
        };
        if value == 0 {
            return Err(format!("shape field {name} must be at least 1"));
        }
        if value > max {
            return Err(format!(
                "shape field {name} = {value} is beyond any real operator: at most {max}"
            ));
        }
    }
    Ok(())
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .family()
            .columns()
            .iter()
            .zip(self.values())
            .map(|(c, v)| format!("{c}={v}"))
            .collect();
        f.write_str(&parts.join(" "))
    }
}

/// One operator call to time or predict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OpQuery {
    pub op: OpKind,
    pub phase: Phase,
    pub dtype: Dtype,
    pub role: Option<Role>,
    pub shape: Shape,
}

impl fmt::Display for OpQuery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {}", self.op, self.phase, self.dtype)?;
        if let Some(role) = self.role {
            write!(f, " ({role})")?;
        }
        write!(f, " [{}]", self.shape)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for op in OpKind::ALL {
            assert_eq!(op.name().parse::<OpKind>().unwrap(), *op);
        }
        assert!("linear1".parse::<OpKind>().unwrap_err().contains("gemm"));
    }

    #[test]
    fn every_kind_has_a_family_with_columns() {
        for op in OpKind::ALL {
            assert!(!op.family().columns().is_empty());
            assert!(!op.phases().is_empty());
        }
    }

    #[test]
    fn shapes_round_trip_through_values() {
        let shapes = [
            Shape::Gemm(GemmShape {
                m: 8,
                n: 16,
                k: 32,
                batch: 1,
            }),
            Shape::Attention(AttentionShape {
                batch: 2,
                seq_q: 128,
                seq_kv: 128,
                heads: 8,
                kv_heads: 2,
                head_dim: 64,
                causal: true,
            }),
            Shape::Collective(CollectiveShape {
                bytes: 1024,
                nodes: 2,
                gpus_per_node: 4,
            }),
        ];
        for s in shapes {
            assert_eq!(Shape::from_values(s.family(), &s.values()).unwrap(), s);
        }
    }

    #[test]
    fn bad_shapes_are_rejected_with_the_field() {
        let e = Shape::from_values(ShapeFamily::Gemm, &[0, 1, 1, 1]).unwrap_err();
        assert!(e.contains("m must be"), "{e}");
        let e = Shape::from_values(ShapeFamily::Collective, &[8, 3, 2, 1]).unwrap_err();
        assert!(e.contains("ranks = 3"), "{e}");
        let e = Shape::from_values(ShapeFamily::Attention, &[1, 1, 1, 6, 4, 64, 0]).unwrap_err();
        assert!(e.contains("multiple of kv_heads"), "{e}");
    }

    /// Each column is taken from 1 to its physical limit and refused at 0 and past it, by name;
    /// the causal flag is 0 or 1; a row of the wrong length says how many values it needs.
    #[test]
    fn shape_values_are_taken_up_to_their_limit() {
        use crate::limits::{MAX_COLLECTIVE_SPAN, MAX_SHAPE_DIM};
        let ones = |family: ShapeFamily| vec![1u64; family.columns().len()];
        for family in [
            ShapeFamily::Gemm,
            ShapeFamily::Attention,
            ShapeFamily::Tokens,
            ShapeFamily::Lookup,
            ShapeFamily::Optimizer,
        ] {
            for (i, name) in family.columns().iter().enumerate() {
                if *name == "causal" {
                    continue;
                }
                let mut v = ones(family);
                // key/value heads at the limit need as many query heads (a multiple of them)
                if *name == "kv_heads" {
                    v[3] = MAX_SHAPE_DIM;
                }
                v[i] = MAX_SHAPE_DIM;
                assert!(
                    Shape::from_values(family, &v).is_ok(),
                    "{name} at its limit"
                );
                v[i] = MAX_SHAPE_DIM + 1;
                let e = Shape::from_values(family, &v).unwrap_err();
                let beyond = format!("{name} = {} is beyond any real operator", MAX_SHAPE_DIM + 1);
                assert!(e.contains(&beyond), "{e}");
                v[i] = 0;
                let e = Shape::from_values(family, &v).unwrap_err();
                assert_eq!(e, format!("shape field {name} must be at least 1"));
            }
            let short = Shape::from_values(family, &[1]).unwrap_err();
            let n = family.columns().len();
            assert_eq!(short, format!("expected {n} shape values, got 1"));
        }
        let attention = |causal: u64| {
            Shape::from_values(ShapeFamily::Attention, &[1, 1, 1, 1, 1, 1, causal])
                .map(|s| matches!(s, Shape::Attention(a) if a.causal))
        };
        assert_eq!(attention(0), Ok(false));
        assert_eq!(attention(1), Ok(true));
        assert_eq!(attention(2), Err("causal must be 0 or 1, got 2".into()));
        // a collective: bytes to the shape limit, its span to the collective limit, two ranks
        let collective = |bytes: u64, nodes: u64, per_node: u64| {
            Shape::from_values(
                ShapeFamily::Collective,
                &[bytes, nodes.saturating_mul(per_node), nodes, per_node],
            )
        };
        let span = MAX_COLLECTIVE_SPAN;
        assert!(collective(MAX_SHAPE_DIM, 1, 2).is_ok());
        assert!(collective(MAX_SHAPE_DIM + 1, 1, 2).is_err());
        assert!(collective(1, span / 2, 2).is_ok());
        assert!(collective(1, 1, span).is_ok());
        // past the limit, nodes or GPUs a node, the ranks they make are refused first
        for (nodes, per_node) in [(span + 1, 1), (1, span + 1)] {
            let e = collective(1, nodes, per_node).unwrap_err();
            assert!(e.contains(&format!("ranks = {}", span + 1)), "{e}");
        }
        let e = collective(1, 1, 1).unwrap_err();
        assert_eq!(e, "a collective needs at least 2 ranks");
    }

    /// What each kind is measured in and answered by.
    #[test]
    fn kinds_are_measured_in_their_phases() {
        let collectives = [
            OpKind::AllReduce,
            OpKind::AllGather,
            OpKind::ReduceScatter,
            OpKind::AllToAll,
            OpKind::SendRecv,
        ];
        for op in OpKind::ALL {
            let collective = collectives.contains(op);
            assert_eq!(op.is_collective(), collective, "{op}");
            let directionless = collective || *op == OpKind::OptimizerStep;
            let phases: &[Phase] = if directionless {
                &[Phase::None]
            } else {
                &[Phase::Fwd, Phase::Bwd]
            };
            assert_eq!(op.phases(), phases, "{op}");
        }
        assert_eq!(Dtype::Fp16.twin(), Some(Dtype::Bf16));
        assert_eq!(Dtype::Bf16.twin(), Some(Dtype::Fp16));
        for lone in [Dtype::Fp32, Dtype::Tf32, Dtype::Fp8] {
            assert_eq!(lone.twin(), None);
        }
        assert!(Role::Qkv.falls_back_to_pool() && Role::FlashAttention2.falls_back_to_pool());
        assert!(!Role::FusedAdam.falls_back_to_pool());
        assert!(!Role::FusedCrossEntropy.falls_back_to_pool());
        let gemm = Shape::from_values(ShapeFamily::Gemm, &[8, 16, 32, 1]).unwrap();
        assert_eq!(gemm.gemm().map(|g| (g.m, g.n, g.k)), Some((8, 16, 32)));
        assert!(gemm.collective().is_none());
        let ring = Shape::from_values(ShapeFamily::Collective, &[1024, 8, 1, 8]).unwrap();
        assert_eq!(ring.collective().map(|c| c.ranks()), Some(8));
        assert!(ring.gemm().is_none());
        assert_eq!(
            ring.to_string(),
            "bytes=1024 ranks=8 nodes=1 gpus_per_node=8"
        );
    }
}

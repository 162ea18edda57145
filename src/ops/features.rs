//! The one feature encoding shared by training and prediction.
//!
//! Each kind keeps its raw shape (as log2, which changes nothing for a tree but reads well in
//! coverage reports) and adds physical features: FLOPs, bytes, arithmetic intensity, and for
//! GEMMs and attention the tile and wave counts a kernel launch has on the GPU's SMs. Changing
//! anything here changes what saved models mean: bump `FEATURE_SCHEMA_VERSION`.

use super::work::{bus_bytes, work};
use super::{Dtype, OpKind, Phase, Shape, ShapeFamily};

/// Version of the feature encoding; a saved model records it and is refused if it differs.
pub const FEATURE_SCHEMA_VERSION: u32 = 1;

/// Most features any family has.
pub const MAX_FEATURES: usize = 16;

pub fn feature_names(family: ShapeFamily) -> &'static [&'static str] {
    match family {
        ShapeFamily::Gemm => &[
            "log2_m",
            "log2_n",
            "log2_k",
            "log2_batch",
            "log2_flops",
            "log2_bytes",
            "log2_intensity",
            "log2_tiles_128x128",
            "log2_waves_128x128",
            "wave_fill_128x128",
            "wave_fill_256x128",
            "m_mod_128",
            "n_mod_128",
            "k_mod_128",
        ],
        ShapeFamily::Attention => &[
            "log2_batch",
            "log2_seq_q",
            "log2_seq_kv",
            "log2_heads",
            "log2_kv_heads",
            "head_dim",
            "causal",
            "log2_flops",
            "log2_bytes",
            "log2_batch_heads",
            "log2_tiles_q128",
            "log2_waves_q128",
            "wave_fill_q128",
        ],
        ShapeFamily::Tokens => &[
            "log2_batch",
            "log2_seq",
            "log2_width",
            "log2_tokens",
            "log2_bytes",
            "log2_rows_per_sm",
            "width_mod_128",
        ],
        ShapeFamily::Lookup => &[
            "log2_batch",
            "log2_seq",
            "log2_hidden",
            "log2_vocab",
            "log2_tokens",
            "log2_gathered_bytes",
            "log2_table_bytes",
        ],
        ShapeFamily::Collective => &[
            "log2_bytes",
            "ranks",
            "nodes",
            "gpus_per_node",
            "log2_bus_bytes",
            "log2_bytes_per_rank",
            "crosses_nodes",
        ],
        ShapeFamily::Optimizer => &[
            "log2_params",
            "tensors",
            "log2_bytes",
            "log2_params_per_tensor",
        ],
    }
}

fn lg(x: f64) -> f64 {
    x.max(1.0).log2()
}

fn ceil_div(a: u64, b: u64) -> u64 {
    a.div_ceil(b)
}

/// Fraction of the last wave's SM slots a launch of `tiles` blocks fills, averaged over waves.
fn wave_fill(tiles: u64, sms: u64) -> (f64, f64) {
    let waves = ceil_div(tiles, sms).max(1);
    (waves as f64, tiles as f64 / (waves * sms) as f64)
}

/// Position of `log2_bytes` among a collective's features.
pub const COLLECTIVE_LOG2_BYTES: usize = 0;
/// Position of `causal` among an attention call's features.
pub const ATTENTION_CAUSAL: usize = 6;

/// Feature vector of one call, in the order of `feature_names(op.family())`.
pub fn features(op: OpKind, shape: &Shape, dtype: Dtype, sm_count: u32) -> Vec<f64> {
    let sms = sm_count.max(1) as u64;
    let w = work(op, Phase::Fwd, shape, dtype);
    match shape {
        Shape::Gemm(g) => {
            let tiles = g.batch * ceil_div(g.m, 128) * ceil_div(g.n, 128);
            let (waves, fill128) = wave_fill(tiles, sms);
            let (_, fill256) = wave_fill(g.batch * ceil_div(g.m, 256) * ceil_div(g.n, 128), sms);
            vec![
                lg(g.m as f64),
                lg(g.n as f64),
                lg(g.k as f64),
                lg(g.batch as f64),
                lg(w.flops),
                lg(w.bytes),
                (w.flops / w.bytes).log2(),
                lg(tiles as f64),
                lg(waves),
                fill128,
                fill256,
                (g.m % 128) as f64,
                (g.n % 128) as f64,
                (g.k % 128) as f64,
            ]
        }
        Shape::Attention(a) => {
            let tiles = a.batch * a.heads * ceil_div(a.seq_q, 128);
            let (waves, fill) = wave_fill(tiles, sms);
            vec![
                lg(a.batch as f64),
                lg(a.seq_q as f64),
                lg(a.seq_kv as f64),
                lg(a.heads as f64),
                lg(a.kv_heads as f64),
                a.head_dim as f64,
                a.causal as u8 as f64,
                lg(w.flops),
                lg(w.bytes),
                lg((a.batch * a.heads) as f64),
                lg(tiles as f64),
                lg(waves),
                fill,
            ]
        }
        Shape::Tokens(t) => {
            let tokens = (t.batch * t.seq) as f64;
            vec![
                lg(t.batch as f64),
                lg(t.seq as f64),
                lg(t.width as f64),
                lg(tokens),
                lg(w.bytes),
                lg(tokens / sms as f64),
                (t.width % 128) as f64,
            ]
        }
        Shape::Lookup(l) => {
            let tokens = (l.batch * l.seq) as f64;
            vec![
                lg(l.batch as f64),
                lg(l.seq as f64),
                lg(l.hidden as f64),
                lg(l.vocab as f64),
                lg(tokens),
                lg(tokens * l.hidden as f64 * dtype.bytes()),
                lg((l.vocab * l.hidden) as f64 * dtype.bytes()),
            ]
        }
        Shape::Collective(c) => vec![
            lg(c.bytes as f64),
            c.ranks() as f64,
            c.nodes as f64,
            c.gpus_per_node as f64,
            lg(bus_bytes(op, c)),
            lg(c.bytes as f64 / c.ranks() as f64),
            (c.nodes > 1) as u8 as f64,
        ],
        Shape::Optimizer(o) => vec![
            lg(o.params as f64),
            o.tensors as f64,
            lg(w.bytes),
            lg(o.params as f64 / o.tensors as f64),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{CollectiveShape, GemmShape, LookupShape, OptimizerShape, TokenShape};

    /// An A100's SMs.
    const A100_SMS: u32 = 108;

    #[test]
    fn named_positions_match_the_names() {
        assert_eq!(
            feature_names(ShapeFamily::Collective)[COLLECTIVE_LOG2_BYTES],
            "log2_bytes"
        );
        assert_eq!(
            feature_names(ShapeFamily::Attention)[ATTENTION_CAUSAL],
            "causal"
        );
    }

    #[test]
    fn feature_vectors_match_their_names() {
        let shapes = [
            (
                OpKind::Gemm,
                Shape::Gemm(GemmShape {
                    m: 4096,
                    n: 4096,
                    k: 4096,
                    batch: 1,
                }),
            ),
            (
                OpKind::RmsNorm,
                Shape::Tokens(TokenShape {
                    batch: 4,
                    seq: 2048,
                    width: 4096,
                }),
            ),
            (
                OpKind::Embedding,
                Shape::Lookup(LookupShape {
                    batch: 4,
                    seq: 2048,
                    hidden: 4096,
                    vocab: 25216,
                }),
            ),
            (
                OpKind::AllReduce,
                Shape::Collective(CollectiveShape {
                    bytes: 1 << 20,
                    nodes: 2,
                    gpus_per_node: 4,
                }),
            ),
            (
                OpKind::OptimizerStep,
                Shape::Optimizer(OptimizerShape {
                    params: 1 << 30,
                    tensors: 100,
                }),
            ),
        ];
        for (op, shape) in shapes {
            let f = features(op, &shape, Dtype::Fp16, A100_SMS);
            assert_eq!(f.len(), feature_names(shape.family()).len(), "{op}");
            assert!(f.len() <= MAX_FEATURES);
            assert!(f.iter().all(|x| x.is_finite()), "{op}: {f:?}");
        }
    }

    /// Every family's features worked by hand at a small shape on 7 SMs: what saved models
    /// read, so a change here shows before it silently changes what they mean.
    #[test]
    fn each_family_encodes_its_shape_by_hand() {
        use crate::ops::AttentionShape;
        let lg = f64::log2;
        let at = |op, shape, dtype| features(op, &shape, dtype, 7);
        // 2 · 3 · 2 = 12 tiles of 128² over 7 SMs: 2 waves, 12/14 full; 2 · 2 · 2 = 8 of 256×128
        let gemm = at(
            OpKind::Gemm,
            Shape::Gemm(GemmShape {
                m: 300,
                n: 200,
                k: 130,
                batch: 2,
            }),
            Dtype::Fp16,
        );
        let (flops, bytes) = (31_200_000.0, 500_000.0);
        let want = [
            lg(300.0),
            lg(200.0),
            lg(130.0),
            1.0,
            lg(flops),
            lg(bytes),
            lg(62.4),
            lg(12.0),
            1.0,
            12.0 / 14.0,
            8.0 / 14.0,
            44.0,
            72.0,
            2.0,
        ];
        for (i, (got, want)) in gemm.iter().zip(want).enumerate() {
            assert!((got - want).abs() < 1e-12, "gemm {i}: {got} {want}");
        }
        // 2 · 4 heads · 3 query tiles = 24 over 7 SMs: 4 waves, 24/28 full; causal halves flops
        let attention = at(
            OpKind::FlashAttention,
            Shape::Attention(AttentionShape {
                batch: 2,
                seq_q: 300,
                seq_kv: 300,
                heads: 4,
                kv_heads: 2,
                head_dim: 64,
                causal: true,
            }),
            Dtype::Bf16,
        );
        let want = [
            1.0,
            lg(300.0),
            lg(300.0),
            2.0,
            1.0,
            64.0,
            1.0,
            lg(92_160_000.0),
            lg(921_600.0),
            3.0,
            lg(24.0),
            2.0,
            24.0 / 28.0,
        ];
        for (i, (got, want)) in attention.iter().zip(want).enumerate() {
            assert!((got - want).abs() < 1e-12, "attention {i}: {got} {want}");
        }
        // 6 tokens of 130: fewer rows than SMs reads as log2 1 = 0
        let tokens = at(
            OpKind::RmsNorm,
            Shape::Tokens(TokenShape {
                batch: 2,
                seq: 3,
                width: 130,
            }),
            Dtype::Bf16,
        );
        assert_eq!(
            tokens,
            vec![1.0, lg(3.0), lg(130.0), lg(6.0), lg(3120.0), 0.0, 2.0]
        );
        let lookup = at(
            OpKind::Embedding,
            Shape::Lookup(LookupShape {
                batch: 2,
                seq: 3,
                hidden: 4,
                vocab: 10,
            }),
            Dtype::Fp32,
        );
        assert_eq!(
            lookup,
            vec![1.0, lg(3.0), 2.0, lg(10.0), lg(6.0), lg(96.0), lg(160.0)]
        );
        let collective = at(
            OpKind::AllGather,
            Shape::Collective(CollectiveShape {
                bytes: 800,
                nodes: 2,
                gpus_per_node: 2,
            }),
            Dtype::Bf16,
        );
        assert_eq!(
            collective,
            vec![lg(800.0), 4.0, 2.0, 2.0, lg(600.0), lg(200.0), 1.0]
        );
        let optimizer = at(
            OpKind::OptimizerStep,
            Shape::Optimizer(OptimizerShape {
                params: 1024,
                tensors: 4,
            }),
            Dtype::Fp32,
        );
        assert_eq!(optimizer, vec![10.0, 4.0, 15.0, 8.0]);
    }

    #[test]
    fn gemm_waves_follow_sm_count() {
        // 4096² output in 128² tiles = 1024 tiles; 108 SMs -> 10 waves, last one partly full
        let s = Shape::Gemm(GemmShape {
            m: 4096,
            n: 4096,
            k: 64,
            batch: 1,
        });
        let f = features(OpKind::Gemm, &s, Dtype::Fp16, A100_SMS);
        assert_eq!(f[7], 10.0);
        assert_eq!(f[8], 10f64.log2());
        assert!((f[9] - 1024.0 / 1080.0).abs() < 1e-12);
    }
}

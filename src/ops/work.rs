//! How much arithmetic and memory traffic an operator call does. Used by the roofline baseline,
//! by the physical features, and to normalise regression targets (time over roofline time).

use super::{CollectiveShape, Dtype, OpKind, Phase, Shape};

/// Floating-point operations and bytes moved through HBM by one call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Work {
    pub flops: f64,
    pub bytes: f64,
}

/// Bytes the Adam step streams per parameter in mixed precision: it reads the fp32 master
/// weight, both moments and the gradient, writes the three fp32 states back and the 16-bit
/// weight copy (4·4 + 3·4 + 2 ≈ 30, rounded to 32 for alignment and the fp32 gradient buffer).
/// Learned optimizer models predict their efficiency against this roofline, so it cannot
/// change without retraining them. Megatron plans the 16-bit copy as a kernel of its own
/// (`plan::stage`): there the 2 bytes are counted twice, inside the rounding.
pub const OPTIMIZER_BYTES_PER_PARAM: f64 = 32.0;

/// Work of one call. Backward factors: a GEMM's backward is two GEMMs of the same size; flash
/// attention's backward does 5 of the forward's 2 matmul-equivalents per tile (2.5×); pointwise
/// and row-wise backward passes read the output gradient and the saved input and write the input
/// gradient (3 tensors where the forward touches 2).
pub fn work(op: OpKind, phase: Phase, shape: &Shape, dtype: Dtype) -> Work {
    let d = dtype.bytes();
    let bwd = phase == Phase::Bwd;
    match (op, shape) {
        (_, Shape::Gemm(g)) => {
            let (m, n, k, b) = (g.m as f64, g.n as f64, g.k as f64, g.batch as f64);
            let fwd = Work {
                flops: 2.0 * b * m * n * k,
                bytes: d * b * (m * k + k * n + m * n),
            };
            if bwd {
                scale(fwd, 2.0, 2.0)
            } else {
                fwd
            }
        }
        (OpKind::FlashAttention, Shape::Attention(a)) => {
            let (b, sq, skv, h, kvh, hd) = (
                a.batch as f64,
                a.seq_q as f64,
                a.seq_kv as f64,
                a.heads as f64,
                a.kv_heads as f64,
                a.head_dim as f64,
            );
            let causal = if a.causal { 0.5 } else { 1.0 };
            let fwd = Work {
                flops: 4.0 * b * h * sq * skv * hd * causal,
                bytes: d * b * hd * (2.0 * h * sq + 2.0 * kvh * skv),
            };
            if bwd {
                scale(fwd, 2.5, 2.5)
            } else {
                fwd
            }
        }
        (_, Shape::Attention(a)) => {
            // softmax / scale-mask-softmax / fill-mask over the [b, h, sq, skv] score tensor
            let elems = (a.batch * a.heads * a.seq_q * a.seq_kv) as f64;
            let tensors = if bwd { 3.0 } else { 2.0 };
            Work {
                flops: 5.0 * elems,
                bytes: tensors * d * elems,
            }
        }
        (_, Shape::Tokens(t)) => {
            let elems = (t.batch * t.seq * t.width) as f64;
            let tensors = match (op, bwd) {
                (OpKind::Swiglu, false) => 3.0,
                (OpKind::Swiglu, true) => 5.0,
                (OpKind::ResidualAdd, _) => 3.0,
                (OpKind::Elementwise, _) => 2.0,
                (OpKind::Rope, _) => 2.0,
                (OpKind::CrossEntropy, false) => 3.0,
                (OpKind::CrossEntropy, true) => 2.0,
                (_, false) => 2.0,
                (_, true) => 3.0,
            };
            Work {
                flops: 8.0 * elems,
                bytes: tensors * d * elems,
            }
        }
        (_, Shape::Lookup(l)) => {
            let gathered = (l.batch * l.seq * l.hidden) as f64;
            let table = (l.vocab * l.hidden) as f64;
            Work {
                flops: if bwd { gathered } else { 0.0 },
                // backward clears the gradient table and scatters the token rows into it
                bytes: if bwd {
                    d * (2.0 * gathered + table)
                } else {
                    d * 2.0 * gathered
                },
            }
        }
        (_, Shape::Optimizer(o)) => Work {
            flops: 10.0 * o.params as f64,
            bytes: OPTIMIZER_BYTES_PER_PARAM * o.params as f64,
        },
        (_, Shape::Collective(c)) => Work {
            flops: 0.0,
            bytes: bus_bytes(op, c),
        },
    }
}

fn scale(w: Work, flops: f64, bytes: f64) -> Work {
    Work {
        flops: w.flops * flops,
        bytes: w.bytes * bytes,
    }
}

/// Bytes each rank sends over the slowest link in the bandwidth-optimal algorithm (ring), the
/// "bus bytes" of nccl-tests: 2(n−1)/n of the buffer for an all-reduce, (n−1)/n for all-gather,
/// reduce-scatter and all-to-all, the message for a send/recv.
pub fn bus_bytes(op: OpKind, c: &CollectiveShape) -> f64 {
    let n = c.ranks() as f64;
    let bytes = c.bytes as f64;
    match op {
        OpKind::AllReduce => 2.0 * (n - 1.0) / n * bytes,
        OpKind::AllGather | OpKind::ReduceScatter | OpKind::AllToAll => (n - 1.0) / n * bytes,
        _ => bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{AttentionShape, GemmShape};

    #[test]
    fn gemm_flops_and_backward() {
        let s = Shape::Gemm(GemmShape {
            m: 2,
            n: 3,
            k: 4,
            batch: 5,
        });
        let f = work(OpKind::Gemm, Phase::Fwd, &s, Dtype::Fp16);
        assert_eq!(f.flops, 2.0 * 2.0 * 3.0 * 4.0 * 5.0);
        assert_eq!(f.bytes, 2.0 * 5.0 * (8.0 + 12.0 + 6.0));
        let b = work(OpKind::Gemm, Phase::Bwd, &s, Dtype::Fp16);
        assert_eq!(b.flops, 2.0 * f.flops);
    }

    #[test]
    fn causal_attention_is_half_the_flops() {
        let mut a = AttentionShape {
            batch: 1,
            seq_q: 1024,
            seq_kv: 1024,
            heads: 8,
            kv_heads: 8,
            head_dim: 128,
            causal: false,
        };
        let full = work(
            OpKind::FlashAttention,
            Phase::Fwd,
            &Shape::Attention(a),
            Dtype::Bf16,
        );
        a.causal = true;
        let causal = work(
            OpKind::FlashAttention,
            Phase::Fwd,
            &Shape::Attention(a),
            Dtype::Bf16,
        );
        assert_eq!(causal.flops * 2.0, full.flops);
    }

    /// The roofline every learned model predicts its efficiency against: each kind's work
    /// worked by hand, both phases, so a change to any count shows here before it silently
    /// shifts every trained model's target.
    #[test]
    fn each_kind_counts_its_flops_and_bytes_by_hand() {
        use crate::ops::{LookupShape, OptimizerShape, TokenShape};
        let w = |op, phase, shape: &Shape, dtype| {
            let w = work(op, phase, shape, dtype);
            (w.flops, w.bytes)
        };
        let (fwd, bwd) = (Phase::Fwd, Phase::Bwd);
        // a GEMM's backward: twice the forward's flops and bytes
        let g = Shape::Gemm(GemmShape {
            m: 2,
            n: 3,
            k: 4,
            batch: 5,
        });
        assert_eq!(
            w(OpKind::Gemm, bwd, &g, Dtype::Fp8),
            (480.0, 2.0 * 5.0 * 26.0)
        );
        // flash attention over 4 query and 6 key heads' worth: q, o by h; k, v by the kv heads
        let a = AttentionShape {
            batch: 2,
            seq_q: 3,
            seq_kv: 5,
            heads: 4,
            kv_heads: 2,
            head_dim: 8,
            causal: false,
        };
        let flash = 4.0 * 2.0 * 4.0 * 3.0 * 5.0 * 8.0;
        let flash_bytes = 2.0 * 2.0 * 8.0 * (2.0 * 4.0 * 3.0 + 2.0 * 2.0 * 5.0);
        let attention = Shape::Attention(a);
        assert_eq!(
            w(OpKind::FlashAttention, fwd, &attention, Dtype::Bf16),
            (flash, flash_bytes)
        );
        assert_eq!(
            w(OpKind::FlashAttention, bwd, &attention, Dtype::Bf16),
            (2.5 * flash, 2.5 * flash_bytes)
        );
        // a softmax over the [b, h, sq, skv] scores: 5 flops an element, 2 tensors forward, 3 back
        let scores = 2.0 * 4.0 * 3.0 * 5.0;
        for op in [OpKind::Softmax, OpKind::ScaleMaskSoftmax, OpKind::FillMask] {
            assert_eq!(
                w(op, fwd, &attention, Dtype::Fp16),
                (5.0 * scores, 2.0 * 2.0 * scores)
            );
            assert_eq!(
                w(op, bwd, &attention, Dtype::Fp32),
                (5.0 * scores, 3.0 * 4.0 * scores)
            );
        }
        // token-wise kernels: 8 flops an element, the tensors each reads and writes
        let t = Shape::Tokens(TokenShape {
            batch: 2,
            seq: 3,
            width: 7,
        });
        let elems = 42.0;
        for (op, tensors_fwd, tensors_bwd) in [
            (OpKind::Swiglu, 3.0, 5.0),
            (OpKind::ResidualAdd, 3.0, 3.0),
            (OpKind::Elementwise, 2.0, 2.0),
            (OpKind::Rope, 2.0, 2.0),
            (OpKind::CrossEntropy, 3.0, 2.0),
            (OpKind::LayerNorm, 2.0, 3.0),
            (OpKind::RmsNorm, 2.0, 3.0),
            (OpKind::Gelu, 2.0, 3.0),
        ] {
            assert_eq!(
                w(op, fwd, &t, Dtype::Bf16),
                (8.0 * elems, tensors_fwd * 2.0 * elems),
                "{op:?} forward"
            );
            assert_eq!(
                w(op, bwd, &t, Dtype::Bf16),
                (8.0 * elems, tensors_bwd * 2.0 * elems),
                "{op:?} backward"
            );
        }
        // the embedding: forward gathers rows (read and write), backward also clears the table
        let l = Shape::Lookup(LookupShape {
            batch: 2,
            seq: 3,
            hidden: 4,
            vocab: 10,
        });
        assert_eq!(
            w(OpKind::Embedding, fwd, &l, Dtype::Bf16),
            (0.0, 2.0 * 2.0 * 24.0)
        );
        assert_eq!(
            w(OpKind::Embedding, bwd, &l, Dtype::Bf16),
            (24.0, 2.0 * (2.0 * 24.0 + 40.0))
        );
        let o = Shape::Optimizer(OptimizerShape {
            params: 1000,
            tensors: 3,
        });
        assert_eq!(
            w(OpKind::OptimizerStep, fwd, &o, Dtype::Fp32),
            (10_000.0, OPTIMIZER_BYTES_PER_PARAM * 1000.0)
        );
        // a collective moves its bus bytes and computes nothing
        let c = Shape::Collective(CollectiveShape {
            bytes: 800,
            nodes: 2,
            gpus_per_node: 2,
        });
        assert_eq!(w(OpKind::AllReduce, fwd, &c, Dtype::Bf16), (0.0, 1200.0));
        assert_eq!(w(OpKind::ReduceScatter, fwd, &c, Dtype::Bf16), (0.0, 600.0));
        assert_eq!(w(OpKind::AllToAll, fwd, &c, Dtype::Bf16), (0.0, 600.0));
        assert_eq!(w(OpKind::SendRecv, fwd, &c, Dtype::Bf16), (0.0, 800.0));
    }

    #[test]
    fn ring_bus_bytes() {
        let c = CollectiveShape {
            bytes: 800,
            nodes: 1,
            gpus_per_node: 8,
        };
        assert_eq!(bus_bytes(OpKind::AllReduce, &c), 1400.0);
        assert_eq!(bus_bytes(OpKind::AllGather, &c), 700.0);
        assert_eq!(bus_bytes(OpKind::SendRecv, &c), 800.0);
    }
}

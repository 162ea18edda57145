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

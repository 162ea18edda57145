//! Operand alignment: tensor-core GEMM kernels load their operands' rows as 16-byte vectors
//! (Ampere's `cp.async`, Hopper's TMA). A row whose length in bytes is not a multiple of 16 —
//! a 16-bit matrix with an odd inner dimension, such as GPT-2's unpadded vocabulary of 50,257
//! — sends cuBLAS to kernels that load narrower pieces and run well below the aligned ones.
//! The measured and learned GEMM data are all aligned, so the plan's misaligned calls are
//! slowed here, by the cluster file's `achievable.gemm_unaligned`.

use crate::ops::{Dtype, OpKind, OpQuery};

/// The vector width aligned kernels load, in bytes.
pub const VECTOR_BYTES: u64 = 16;

/// The speed a GEMM keeps, as a share of the aligned kernel's, when `unaligned` is the share
/// at 2-byte alignment (an odd 16-bit dimension), and the alignment its operands' rows allow
/// in bytes. Each halving of the vector from 16 bytes costs the same factor: 8 bytes keep
/// `unaligned^(1/3)`, 4 bytes `unaligned^(2/3)`, 2 bytes `unaligned`, 1 byte (an odd fp8
/// dimension) `unaligned^(4/3)`.
pub fn kept_share(unaligned: f64, aligned_bytes: u64) -> f64 {
    let halvings = (VECTOR_BYTES / aligned_bytes.clamp(1, VECTOR_BYTES)).ilog2();
    unaligned.powf(halvings as f64 / 3.0)
}

/// The largest power of two up to 16 that divides a row of `elements` of `dtype`, in bytes.
pub fn row_alignment_bytes(elements: u64, dtype: Dtype) -> u64 {
    let bytes = elements.saturating_mul(dtype.bytes() as u64).max(1);
    (1u64 << bytes.trailing_zeros()).min(VECTOR_BYTES)
}

/// For a tensor-core GEMM call whose operand rows are not 16-byte aligned: the alignment in
/// bytes and the share of the aligned speed it keeps. The rows that are loaded are n and k
/// long (Y[m, n] = X[m, k]·Wᵀ, and the backward's dY[m, n] and dW[n, k]); m only counts rows.
/// fp32 GEMMs (CUDA cores, no tensor-core loads) and aligned calls give `None`.
pub fn misaligned(q: &OpQuery, unaligned: f64) -> Option<(u64, f64)> {
    if q.op != OpKind::Gemm || q.dtype == Dtype::Fp32 {
        return None;
    }
    let g = q.shape.gemm()?;
    let bytes = row_alignment_bytes(g.n, q.dtype).min(row_alignment_bytes(g.k, q.dtype));
    (bytes < VECTOR_BYTES).then(|| (bytes, kept_share(unaligned, bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{GemmShape, Phase, Shape};

    fn head(n: u64, dtype: Dtype) -> OpQuery {
        OpQuery {
            op: OpKind::Gemm,
            phase: Phase::Fwd,
            dtype,
            role: None,
            shape: Shape::Gemm(GemmShape {
                m: 4096,
                n,
                k: 2048,
                batch: 1,
            }),
        }
    }

    #[test]
    fn gpt2s_vocabulary_split_over_tp_is_aligned_only_at_tp_2() {
        // vocab // tp rows per rank, as vTrain's model builds its head
        let share = |n| misaligned(&head(n, Dtype::Fp16), 0.5);
        assert_eq!(share(50257), Some((2, 0.5)));
        assert_eq!(share(25128), None);
        let (b4, s4) = share(12564).unwrap();
        assert_eq!(b4, 8);
        assert!((s4 - 0.5f64.powf(1.0 / 3.0)).abs() < 1e-12);
        let (b8, s8) = share(6282).unwrap();
        assert_eq!(b8, 4);
        assert!((s8 - 0.5f64.powf(2.0 / 3.0)).abs() < 1e-12);
        // Megatron's padding (a multiple of 128·tp) is aligned at every tp
        for tp in [1, 2, 4, 8] {
            assert_eq!(share(50257u64.div_ceil(128 * tp) * 128), None);
        }
    }

    #[test]
    fn the_share_falls_with_the_alignment_and_fp32_is_not_slowed() {
        let mut last = 1.0;
        for bytes in [16, 8, 4, 2, 1] {
            let s = kept_share(0.5, bytes);
            assert!(s <= last && s > 0.0, "{bytes}: {s}");
            last = s;
        }
        assert_eq!(kept_share(0.5, 16), 1.0);
        assert_eq!(misaligned(&head(50257, Dtype::Fp32), 0.5), None);
        assert_eq!(misaligned(&head(50257, Dtype::Fp8), 0.5).unwrap().0, 1);
        assert_eq!(misaligned(&head(50256, Dtype::Fp8), 0.5), None);
    }

    /// The inner dimension's rows count too (the head's backward loads the odd vocabulary as
    /// k), the narrower of the two decides, and only a tensor-core GEMM is slowed. One byte (an
    /// odd fp8 row) keeps 0.5^(4/3); a row wider than the vector is as aligned as 16 bytes.
    #[test]
    fn the_narrower_of_the_rows_decides_and_only_gemms_are_slowed() {
        let odd_k = |dtype: Dtype| {
            let mut q = head(4096, dtype);
            if let Shape::Gemm(g) = &mut q.shape {
                g.k = 50257;
            }
            q
        };
        assert_eq!(misaligned(&odd_k(Dtype::Bf16), 0.5), Some((2, 0.5)));
        // n 8-byte aligned (12,564 fp16 elements), k 2-byte: the 2 bytes decide
        let mut q = odd_k(Dtype::Fp16);
        if let Shape::Gemm(g) = &mut q.shape {
            g.n = 12564;
        }
        assert_eq!(misaligned(&q, 0.5), Some((2, 0.5)));
        let mut not_a_gemm = odd_k(Dtype::Bf16);
        not_a_gemm.op = OpKind::FlashAttention;
        assert_eq!(misaligned(&not_a_gemm, 0.5), None);
        assert!((kept_share(0.5, 1) - 0.5f64.powf(4.0 / 3.0)).abs() < 1e-12);
        assert_eq!(kept_share(0.5, 64), 1.0);
        assert_eq!(row_alignment_bytes(50257, Dtype::Fp8), 1);
        assert_eq!(row_alignment_bytes(0, Dtype::Bf16), 1);
    }
}

//! The roofline: how long a kernel would take at the GPU's peak FLOP/s or HBM bandwidth,
//! whichever binds — at the full peak (the physical bound learned models are checked against
//! and the scale their targets are normalised by) or derated to the fractions a cluster file
//! says real kernels reach, plus a launch cost (the fallback when no model measured a kernel).

use crate::hardware::{Efficiency, GpuSpec, NetworkSpec};
use crate::ops::work::{bus_bytes, work};
use crate::ops::{OpKind, OpQuery, Phase, Role};

/// Roofline time of a compute or memory operator at the GPU's peak, in microseconds; `None`
/// for collectives.
pub fn device_time_us(q: &OpQuery, gpu: &GpuSpec) -> Option<f64> {
    time_at(q, gpu, 1.0, 1.0)
}

/// The shortest a call can take on the device: its roofline at the best fractions of peak
/// kernels reach, and never under the shortest kernel (`None` for collectives).
pub fn floor_us(
    q: &OpQuery,
    gpu: &GpuSpec,
    achievable: &crate::hardware::Achievable,
) -> Option<f64> {
    time_at(q, gpu, achievable.compute_fraction(q), achievable.memory)
        .map(|t| t.max(achievable.min_kernel_us))
}

/// Where an attention call runs as FlashAttention-2 and the cluster file says how far below the
/// learned attention FA2 stays on its GPU: that fraction of dense peak and the call's roofline
/// time at it (the call cannot be faster).
pub fn flash_attention_2_floor_us(
    q: &OpQuery,
    gpu: &GpuSpec,
    achievable: &crate::hardware::Achievable,
) -> Option<(f64, f64)> {
    if q.op != OpKind::FlashAttention || q.role != Some(Role::FlashAttention2) {
        return None;
    }
    let fraction = match q.phase {
        Phase::Bwd => achievable.flash_attention_2_bwd,
        _ => achievable.flash_attention_2_fwd,
    }?;
    let at_fa2 = crate::hardware::Achievable {
        attention_fwd: fraction,
        attention_bwd: fraction,
        min_kernel_us: 0.0,
        ..*achievable
    };
    Some((fraction, floor_us(q, gpu, &at_fa2)?))
}

/// How much of a kernel's roofline is its arithmetic: 1 where its FLOPs at peak take at least
/// as long as its bytes at full bandwidth (compute-bound), else the ratio of the two (0 for a
/// kernel that only moves bytes, and for collectives). What sustained clocks slow: a
/// memory-bound kernel waits on HBM, whose clock does not drop with the SMs'.
pub fn compute_share(q: &OpQuery, gpu: &GpuSpec) -> f64 {
    match parts_at(q, gpu, 1.0, 1.0) {
        None => 0.0,
        Some((compute, memory)) if compute >= memory || memory <= 0.0 => 1.0,
        Some((compute, memory)) => compute / memory,
    }
}

/// Roofline time at the cluster's achievable fractions of peak, plus one kernel launch.
pub fn derated_time_us(q: &OpQuery, gpu: &GpuSpec, eff: &Efficiency) -> Option<f64> {
    time_at(q, gpu, eff.compute, eff.memory).map(|t| t + eff.kernel_launch_us)
}

fn time_at(q: &OpQuery, gpu: &GpuSpec, compute_fraction: f64, memory_fraction: f64) -> Option<f64> {
    parts_at(q, gpu, compute_fraction, memory_fraction)
        .map(|(compute, memory)| compute.max(memory) * 1e6)
}

/// A kernel's FLOPs at `compute_fraction` of peak and its bytes at `memory_fraction` of HBM
/// bandwidth, seconds each (`None` for collectives): the two sides of its roofline.
fn parts_at(
    q: &OpQuery,
    gpu: &GpuSpec,
    compute_fraction: f64,
    memory_fraction: f64,
) -> Option<(f64, f64)> {
    if q.op.is_collective() {
        return None;
    }
    let w = work(q.op, q.phase, &q.shape, q.dtype);
    Some((
        w.flops / (gpu.peak_flops(q.dtype) * compute_fraction),
        w.bytes / (gpu.hbm_bytes_per_s() * memory_fraction),
    ))
}

/// The analytic time of any call: a kernel at peak, a collective on the tiered network model
/// at full link bandwidth (`None` for a collective when no network is known).
pub fn ideal_time_us(q: &OpQuery, gpu: &GpuSpec, network: Option<&NetworkSpec>) -> Option<f64> {
    if let Some(t) = device_time_us(q, gpu) {
        return Some(t);
    }
    let c = q.shape.collective()?;
    Some(super::network::collective_time_us(q.op, c, network?, 1.0).0)
}

/// The scale a model's target is divided by when it learns "time over roofline": the device
/// roofline for kernels; for collectives the bus bytes at 1 GB/s (a size, since the network of
/// the target cluster is not part of a model).
pub fn work_scale_us(q: &OpQuery, gpu: &GpuSpec) -> f64 {
    match (device_time_us(q, gpu), q.shape.collective()) {
        (Some(t), _) => t.max(1e-6),
        (None, Some(c)) => (bus_bytes(q.op, c) / 1e9 * 1e6).max(1e-6),
        (None, None) => 1.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{Dtype, GemmShape, OpKind, Phase, Shape};

    #[test]
    fn big_gemm_is_compute_bound() {
        let h100 = GpuSpec::builtin("h100").unwrap();
        let q = OpQuery {
            op: OpKind::Gemm,
            phase: Phase::Fwd,
            dtype: Dtype::Bf16,
            role: None,
            shape: Shape::Gemm(GemmShape {
                m: 8192,
                n: 8192,
                k: 8192,
                batch: 1,
            }),
        };
        // 2·8192³ = 1.1e12 FLOP at 989.4 TFLOP/s = 1111 µs (NVIDIA measured 1,400 µs)
        let t = device_time_us(&q, &h100).unwrap();
        assert!((t - 1111.3).abs() < 1.0, "{t}");
        assert_eq!(compute_share(&q, &h100), 1.0);
    }

    /// A bf16 residual add over 8,192 tokens of 4,096: a memory-bound kernel.
    fn residual_add() -> OpQuery {
        OpQuery {
            op: OpKind::ResidualAdd,
            phase: Phase::Fwd,
            dtype: Dtype::Bf16,
            role: None,
            shape: Shape::Tokens(crate::ops::TokenShape {
                batch: 1,
                seq: 8192,
                width: 4096,
            }),
        }
    }

    /// A residual add does 8 FLOPs an element where it moves 6 bytes: on an H100 (989 TFLOP/s
    /// of bf16, 3.35 TB/s) its arithmetic is 8 / 6 · 3.35e12 / 989e12 ≈ 0.45 % of its roofline;
    /// a collective has none.
    #[test]
    fn a_memory_bound_kernel_is_mostly_a_wait_on_memory() {
        let h100 = GpuSpec::builtin("h100").unwrap();
        let add = residual_add();
        let share = compute_share(&add, &h100);
        let expected = 8.0 / 6.0 * h100.hbm_bytes_per_s() / h100.peak_flops(Dtype::Bf16);
        assert!((share - expected).abs() < 1e-12 && share < 0.01, "{share}");
        let reduce = OpQuery {
            op: OpKind::AllReduce,
            shape: Shape::Collective(crate::ops::CollectiveShape {
                bytes: 1 << 20,
                nodes: 1,
                gpus_per_node: 8,
            }),
            ..add
        };
        assert_eq!(compute_share(&reduce, &h100), 0.0);
    }

    /// Derated, a memory-bound kernel's bytes stream at the fraction of HBM bandwidth: half
    /// the bandwidth, twice the time; and the ideal time of any call is a kernel's roofline at
    /// peak or a collective's network model at full link bandwidth (none without a network).
    #[test]
    fn derating_scales_a_memory_bound_kernel_and_the_ideal_time_covers_collectives() {
        use crate::ops::CollectiveShape;
        let cluster = crate::hardware::dgx_h100_without_models();
        let h100 = &cluster.spec.gpu;
        let add = residual_add();
        let at_peak = device_time_us(&add, h100).unwrap();
        let half = time_at(&add, h100, 1.0, 0.5).unwrap();
        assert!(
            (half - 2.0 * at_peak).abs() < 1e-9 * half,
            "{half} {at_peak}"
        );
        assert_eq!(ideal_time_us(&add, h100, None), Some(at_peak));
        let collective = CollectiveShape {
            bytes: 1 << 28,
            nodes: 2,
            gpus_per_node: 8,
        };
        let reduce = OpQuery {
            op: OpKind::AllReduce,
            shape: Shape::Collective(collective),
            ..add
        };
        let net = &cluster.spec.network;
        let expected =
            super::super::network::collective_time_us(reduce.op, &collective, net, 1.0).0;
        assert!(expected > 0.0);
        assert_eq!(ideal_time_us(&reduce, h100, Some(net)), Some(expected));
        assert_eq!(ideal_time_us(&reduce, h100, None), None);
    }

    /// A FlashAttention-2 call's floor is its roofline at the cluster file's fraction for its
    /// phase — the backward's own — with no shortest-kernel floor under it (the fraction is
    /// the bound); other attention has none.
    #[test]
    fn flash_attention_2_s_floor_takes_its_phase_s_fraction() {
        use crate::hardware::Achievable;
        use crate::ops::AttentionShape;
        let h100 = GpuSpec::builtin("h100").unwrap();
        let achievable = Achievable {
            flash_attention_2_fwd: Some(0.4),
            flash_attention_2_bwd: Some(0.2),
            min_kernel_us: 1e6,
            ..Achievable::default()
        };
        let call = |phase: Phase, role: Option<Role>| OpQuery {
            op: OpKind::FlashAttention,
            phase,
            dtype: Dtype::Bf16,
            role,
            shape: Shape::Attention(AttentionShape {
                batch: 1,
                seq_q: 4096,
                seq_kv: 4096,
                heads: 32,
                kv_heads: 8,
                head_dim: 128,
                causal: true,
            }),
        };
        for (phase, fraction) in [(Phase::Fwd, 0.4), (Phase::Bwd, 0.2)] {
            let q = call(phase, Some(Role::FlashAttention2));
            let (f, floor) = flash_attention_2_floor_us(&q, &h100, &achievable).unwrap();
            let at_peak = device_time_us(&q, &h100).unwrap();
            assert_eq!(f, fraction);
            // compute-bound: the roofline at peak over the fraction, far under 1e6 µs
            assert!(
                (floor - at_peak / fraction).abs() < 1e-6 * floor,
                "{floor} {at_peak}"
            );
            assert!(floor < achievable.min_kernel_us);
            assert_eq!(
                flash_attention_2_floor_us(&call(phase, None), &h100, &achievable),
                None
            );
        }
    }
}

//! The analytic baseline: how long a call would take if it ran at the GPU's peak FLOP/s or HBM
//! bandwidth, whichever binds (and a collective at the α–β cost of its slowest link). Learned
//! models are judged against it, and it is the scale their targets are normalised by.

use crate::hardware::{GpuSpec, NetworkSpec};
use crate::ops::work::{bus_bytes, work};
use crate::ops::OpQuery;

/// Roofline time of a compute or memory operator, in microseconds; `None` for collectives.
pub fn device_time_us(q: &OpQuery, gpu: &GpuSpec) -> Option<f64> {
    if q.op.is_collective() {
        return None;
    }
    let w = work(q.op, q.phase, &q.shape, q.dtype);
    let compute = w.flops / gpu.peak_flops(q.dtype);
    let memory = w.bytes / gpu.hbm_bytes_per_s();
    Some(compute.max(memory) * 1e6)
}

/// α–β time of a collective over its slowest tier: the inter-node link shared by the group's
/// GPUs on a node when the group spans nodes, else the intra-node link. Ring algorithm, so the
/// latency term counts 2(n−1) steps for an all-reduce and n−1 for the others.
pub fn collective_time_us(q: &OpQuery, network: &NetworkSpec) -> Option<f64> {
    let c = q.shape.collective()?;
    let n = c.ranks() as f64;
    let (beta, alpha_us) = if c.nodes > 1 {
        (
            network
                .inter_node_bytes_per_s_per_gpu(c.gpus_per_node as u32)
                .min(network.intra_node_bytes_per_s()),
            network.inter_node.latency_us,
        )
    } else {
        (
            network.intra_node_bytes_per_s(),
            network.intra_node.latency_us,
        )
    };
    let steps = match q.op {
        crate::ops::OpKind::AllReduce => 2.0 * (n - 1.0),
        crate::ops::OpKind::SendRecv => 1.0,
        _ => n - 1.0,
    };
    Some(steps * alpha_us + bus_bytes(q.op, c) / beta * 1e6)
}

/// Roofline estimate of any call; collectives need the network.
pub fn roofline_time_us(q: &OpQuery, gpu: &GpuSpec, network: Option<&NetworkSpec>) -> Option<f64> {
    device_time_us(q, gpu).or_else(|| collective_time_us(q, network?))
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
    use crate::ops::{CollectiveShape, Dtype, GemmShape, OpKind, Phase, Shape};

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
    }

    #[test]
    fn collectives_use_the_slowest_tier() {
        let net = crate::hardware::NetworkSpec {
            intra_node: crate::hardware::IntraNodeTier {
                technology: "nvlink".into(),
                bandwidth_gb_per_s: 400.0,
                latency_us: 0.0,
            },
            inter_node: crate::hardware::InterNodeTier {
                technology: "ib".into(),
                nics_per_node: 8,
                bandwidth_gbit_per_s_per_nic: 400.0,
                latency_us: 0.0,
                topology: "fat-tree".into(),
            },
        };
        let mut q = OpQuery {
            op: OpKind::AllReduce,
            phase: Phase::None,
            dtype: Dtype::Bf16,
            role: None,
            shape: Shape::Collective(CollectiveShape {
                bytes: 1 << 30,
                nodes: 1,
                gpus_per_node: 8,
            }),
        };
        let intra = collective_time_us(&q, &net).unwrap();
        q.shape = Shape::Collective(CollectiveShape {
            bytes: 1 << 30,
            nodes: 2,
            gpus_per_node: 8,
        });
        let inter = collective_time_us(&q, &net).unwrap();
        assert!(inter > 7.0 * intra, "{intra} {inter}");
    }
}

//! A tiered analytic model of NCCL collectives (α–β per tier), for the layouts the learned
//! models never saw: more nodes than one node's `bench collect` covers, other GPU counts per
//! node. For each collective it costs the algorithms NCCL chooses between — a flat ring, a tree
//! across nodes, and a hierarchical schedule (reduce-scatter inside the node, one ring per GPU
//! rail across nodes, all-gather inside the node) — and takes the fastest, as NCCL's tuner does.

use crate::hardware::NetworkSpec;
use crate::ops::{CollectiveShape, OpKind};

/// Bandwidth (bytes/s) and latency (µs) of one tier.
#[derive(Debug, Clone, Copy)]
struct Tier {
    beta: f64,
    alpha_us: f64,
}

/// The fastest algorithm's time in microseconds, and its name.
pub fn collective_time_us(
    op: OpKind,
    c: &CollectiveShape,
    net: &NetworkSpec,
    efficiency: f64,
) -> (f64, &'static str) {
    let n = c.ranks() as f64;
    let (nodes, g) = (c.nodes as f64, c.gpus_per_node as f64);
    let bytes = c.bytes as f64;
    let intra = Tier {
        beta: net.intra_node_bytes_per_s() * efficiency,
        alpha_us: net.intra_node.latency_us,
    };
    // a group with g GPUs on a node can drive min(g, NICs) of the node's NICs
    let nic = net.inter_node.bandwidth_gbit_per_s_per_nic * 1e9 / 8.0 * efficiency;
    let nics = net.inter_node.nics_per_node as f64;
    let node_out = nic * g.min(nics);
    let inter = Tier {
        beta: node_out,
        alpha_us: net.inter_node.latency_us,
    };
    // one GPU's rail when each GPU of the node runs its own ring across nodes
    let rail = Tier {
        beta: node_out / g,
        alpha_us: net.inter_node.latency_us,
    };
    let multi = c.nodes > 1;
    // the ring crosses every node boundary, where all the node's NICs carry it
    let ring_beta = if multi {
        intra.beta.min(inter.beta)
    } else {
        intra.beta
    };
    let ring_alpha = if multi {
        inter.alpha_us
    } else {
        intra.alpha_us
    };
    let ring = |steps: f64, traffic: f64| steps * ring_alpha + traffic / ring_beta * 1e6;

    let mut options: Vec<(f64, &'static str)> = Vec::new();
    match op {
        OpKind::AllReduce => {
            options.push((ring(2.0 * (n - 1.0), 2.0 * (n - 1.0) / n * bytes), "ring"));
            if multi {
                // double binary tree across nodes, a chain inside each: log latency, the
                // ring's bandwidth term without its (n−1)/n discount
                let tree_alpha =
                    2.0 * nodes.log2().ceil() * inter.alpha_us + 2.0 * (g - 1.0) * intra.alpha_us;
                options.push((tree_alpha + 2.0 * bytes / ring_beta * 1e6, "tree"));
                if g > 1.0 {
                    let inside =
                        (g - 1.0) * intra.alpha_us + (g - 1.0) / g * bytes / intra.beta * 1e6;
                    let across = 2.0 * (nodes - 1.0) * rail.alpha_us
                        + 2.0 * (nodes - 1.0) / nodes * (bytes / g) / rail.beta * 1e6;
                    options.push((2.0 * inside + across, "hierarchical"));
                }
            }
        }
        OpKind::AllGather | OpKind::ReduceScatter => {
            options.push((ring(n - 1.0, (n - 1.0) / n * bytes), "ring"));
            if multi && g > 1.0 {
                let inside =
                    (g - 1.0) * intra.alpha_us + (g - 1.0) / g * (bytes / nodes) / intra.beta * 1e6;
                let across = (nodes - 1.0) * rail.alpha_us
                    + (nodes - 1.0) / nodes * (bytes / g) / rail.beta * 1e6;
                options.push((inside + across, "hierarchical"));
            }
        }
        OpKind::AllToAll => {
            // every rank sends (n−1)/n of its buffer; across nodes the node's NICs carry what
            // its g GPUs send off-node
            let off_node = if multi { (n - g) / n } else { 0.0 };
            let t_intra = (n - 1.0) * intra.alpha_us + (g - 1.0) / n * bytes / intra.beta * 1e6;
            let t_inter = if multi {
                off_node * bytes * g / inter.beta * 1e6
            } else {
                0.0
            };
            options.push((
                t_intra.max(t_inter) + if multi { inter.alpha_us } else { 0.0 },
                "pairwise",
            ));
        }
        _ => {
            let tier = if multi {
                Tier {
                    beta: nic,
                    alpha_us: inter.alpha_us,
                }
            } else {
                intra
            };
            options.push((tier.alpha_us + bytes / tier.beta * 1e6, "p2p"));
        }
    }
    options
        .into_iter()
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .expect("at least one algorithm")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::{InterNodeTier, IntraNodeTier};

    fn dgx() -> NetworkSpec {
        NetworkSpec {
            intra_node: IntraNodeTier {
                technology: "NVLink".into(),
                bandwidth_gb_per_s: 450.0,
                latency_us: 2.0,
            },
            inter_node: InterNodeTier {
                technology: "IB".into(),
                nics_per_node: 8,
                bandwidth_gbit_per_s_per_nic: 400.0,
                latency_us: 3.0,
                topology: "fat-tree".into(),
            },
        }
    }

    fn shape(bytes: u64, nodes: u64, gpn: u64) -> CollectiveShape {
        CollectiveShape {
            bytes,
            nodes,
            gpus_per_node: gpn,
        }
    }

    #[test]
    fn intra_node_all_reduce_is_ring_at_nvlink_speed() {
        let (t, algo) = collective_time_us(OpKind::AllReduce, &shape(1 << 30, 1, 8), &dgx(), 1.0);
        // 2·7/8 · 1 GiB at 450 GB/s ≈ 4.17 ms plus 14 hops of 2 µs
        assert_eq!(algo, "ring");
        assert!(
            (t - (2.0 * 7.0 / 8.0 * (1u64 << 30) as f64 / 450e9 * 1e6 + 28.0)).abs() < 1.0,
            "{t}"
        );
    }

    #[test]
    fn more_nodes_never_speed_a_collective_up() {
        for op in [
            OpKind::AllReduce,
            OpKind::AllGather,
            OpKind::ReduceScatter,
            OpKind::AllToAll,
        ] {
            let mut last = 0.0;
            for nodes in [1, 2, 4, 16, 64, 256] {
                let (t, _) = collective_time_us(op, &shape(256 << 20, nodes, 8), &dgx(), 0.85);
                assert!(t >= last * 0.999, "{op} {nodes}: {t} < {last}");
                last = t;
            }
        }
    }

    #[test]
    fn small_messages_are_latency_bound_and_pick_the_tree() {
        let (_, algo) = collective_time_us(OpKind::AllReduce, &shape(4096, 128, 8), &dgx(), 0.85);
        assert_eq!(algo, "tree");
    }
}

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
        with_nics(8)
    }

    /// A DGX's NVLink (450 GB/s, 2 µs) and `nics` NICs of 400 Gbit/s (50 GB/s, 3 µs).
    fn with_nics(nics: u32) -> NetworkSpec {
        NetworkSpec {
            intra_node: IntraNodeTier {
                technology: "NVLink".into(),
                bandwidth_gb_per_s: 450.0,
                latency_us: 2.0,
            },
            inter_node: InterNodeTier {
                technology: "IB".into(),
                nics_per_node: nics,
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

    /// `(op, bytes, nodes, GPUs a node, NICs a node, efficiency)`: its time and algorithm.
    fn time(
        op: OpKind,
        bytes: u64,
        (nodes, gpn): (u64, u64),
        nics: u32,
        eff: f64,
    ) -> (f64, &'static str) {
        collective_time_us(op, &shape(bytes, nodes, gpn), &with_nics(nics), eff)
    }

    fn close(t: f64, expected: f64) -> bool {
        (t / expected - 1.0).abs() < 1e-9
    }

    /// Worked by hand (1.6 GB, 2 nodes of 8 GPUs, 4 NICs: 200 GB/s out of a node, 25 GB/s a
    /// rail). Ring over 16 ranks: 2·15 hops of 3 µs + 2·15/16 · 1.6 GB at 200 GB/s = 15,090 µs.
    /// Tree: 2·1 hops across nodes and 2·7 inside + 2 · 1.6 GB / 200 GB/s = 16,034 µs.
    /// Hierarchical: twice inside the node, 7·2 µs + 7/8 · 1.6 GB at 450 GB/s = 3,125.1 µs, and
    /// across on one rail, 2·1·3 µs + 2·1/2 · 0.2 GB at 25 GB/s = 8,006 µs: 14,256.2 µs, the
    /// fastest. With two GPUs of a node in the group (4 nodes) they drive two NICs (100 GB/s):
    /// ring 42 + 28,000, tree 16 + 32,000, hierarchical 2·(2 + 1,777.8) + 18 + 24,000 µs.
    #[test]
    fn multi_node_all_reduce_takes_the_cheapest_of_three_schedules() {
        let (t, algo) = time(OpKind::AllReduce, 1_600_000_000, (2, 8), 4, 1.0);
        assert_eq!(algo, "hierarchical");
        assert!(close(t, 2.0 * (14.0 + 1.4e9 / 450e9 * 1e6) + 8006.0), "{t}");
        let (t, algo) = time(OpKind::AllReduce, 1_600_000_000, (4, 2), 8, 1.0);
        assert_eq!(algo, "hierarchical");
        assert!(
            close(t, 2.0 * (2.0 + 0.8e9 / 450e9 * 1e6) + 24_018.0),
            "{t}"
        );
        // four bytes across 128 nodes: the tree's 2·7 hops of 3 µs and 2·7 of 2 µs
        let (t, algo) = time(OpKind::AllReduce, 4096, (128, 8), 8, 1.0);
        assert_eq!(algo, "tree");
        assert!(close(t, 70.0 + 2.0 * 4096.0 / 400e9 * 1e6), "{t}");
        // one node's GPUs in a ring: the tree and hierarchy need more than one node
        let (t, algo) = time(OpKind::AllReduce, 4096, (1, 8), 8, 1.0);
        assert_eq!(algo, "ring");
        assert!(
            close(t, 28.0 + 2.0 * 7.0 / 8.0 * 4096.0 / 450e9 * 1e6),
            "{t}"
        );
    }

    /// The efficiency scales bandwidth, not latency: 8 GPUs' ring at half of 450 GB/s,
    /// 28 µs + 2·7/8 · 1.6 GB / 225 GB/s; across nodes, at half a NIC's.
    #[test]
    fn efficiency_slows_bandwidth_not_latency() {
        let (t, _) = time(OpKind::AllReduce, 1_600_000_000, (1, 8), 8, 0.5);
        assert!(close(t, 28.0 + 2.8e9 / 225e9 * 1e6), "{t}");
        // and the NICs': one GPU a node on 4 nodes gathers at half of 50 GB/s
        let (t, _) = time(OpKind::AllGather, 1_600_000_000, (4, 1), 8, 0.5);
        assert!(close(t, 9.0 + 1.2e9 / 25e9 * 1e6), "{t}");
    }

    /// 1.6 GB gathered over 4 nodes of 8 (8 NICs: 400 GB/s a node, 50 GB/s a rail). Ring:
    /// 31 hops of 3 µs + 31/32 · 1.6 GB at 400 GB/s = 3,968 µs. Hierarchical: inside, 7·2 µs +
    /// 7/8 of a node's 0.4 GB at 450 GB/s; across, 3·3 µs + 3/4 · 0.2 GB at 50 GB/s = 3,009 µs:
    /// 3,800.8 µs. A reduce-scatter moves the same bytes. On one node, the ring alone.
    #[test]
    fn all_gather_and_reduce_scatter_cost_alike() {
        for op in [OpKind::AllGather, OpKind::ReduceScatter] {
            let (t, algo) = time(op, 1_600_000_000, (4, 8), 8, 1.0);
            assert_eq!(algo, "hierarchical");
            assert!(close(t, 14.0 + 0.35e9 / 450e9 * 1e6 + 3009.0), "{op} {t}");
            // one GPU a node: no hierarchy, the ring at one NIC's 50 GB/s
            let (t, algo) = time(op, 1_600_000_000, (4, 1), 8, 1.0);
            assert_eq!(algo, "ring");
            assert!(close(t, 9.0 + 1.2e9 / 50e9 * 1e6), "{op} {t}");
            let (t, algo) = time(op, 1_600_000_000, (1, 8), 8, 1.0);
            assert_eq!(algo, "ring");
            assert!(close(t, 14.0 + 1.4e9 / 450e9 * 1e6), "{op} {t}");
        }
    }

    /// Each rank sends 7/8 of 1.6 GB to the others of one node: 7 hops of 2 µs + 1.4 GB at
    /// 450 GB/s. On 2 nodes of 8 half of it leaves the node: the 8 GPUs' 6.4 GB through
    /// 400 GB/s, 16 ms, outlasts the 15·2 µs + 7/16 · 1.6 GB on NVLink; plus one hop of 3 µs.
    #[test]
    fn all_to_all_is_bound_by_what_leaves_the_node() {
        let (t, algo) = time(OpKind::AllToAll, 1_600_000_000, (1, 8), 8, 1.0);
        assert_eq!(algo, "pairwise");
        assert!(close(t, 14.0 + 1.4e9 / 450e9 * 1e6), "{t}");
        let (t, _) = time(OpKind::AllToAll, 1_600_000_000, (2, 8), 8, 1.0);
        assert!(close(t, 16_003.0), "{t}");
        // with 2 NICs a node the NVLink side is never the bound across nodes either
        let (t, _) = time(OpKind::AllToAll, 1_600_000_000, (2, 8), 2, 1.0);
        assert!(close(t, 64_003.0), "{t}");
    }

    /// A pipeline transfer of 100 MB: NVLink's 2 µs + 222.2 µs inside a node, one NIC's
    /// 3 µs + 2 ms between two.
    #[test]
    fn point_to_point_uses_nvlink_or_one_nic() {
        let (t, algo) = time(OpKind::SendRecv, 100_000_000, (1, 2), 8, 1.0);
        assert_eq!(algo, "p2p");
        assert!(close(t, 2.0 + 1e8 / 450e9 * 1e6), "{t}");
        let (t, _) = time(OpKind::SendRecv, 100_000_000, (2, 1), 8, 1.0);
        assert!(close(t, 2003.0), "{t}");
    }
}

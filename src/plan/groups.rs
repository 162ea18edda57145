//! Process groups as NCCL sees them, with Megatron's rank order (tensor-parallel ranks
//! fastest, then context-parallel, then data-parallel, then pipeline): for each group, how many nodes it spans and
//! how many of its members share a node — what a collective's cost depends on.

use crate::workload::Layout;

/// (nodes, members per node) of each group a rank belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Groups {
    /// The tensor-parallel group.
    pub tp: (u64, u64),
    /// The group that reduces gradients (and shards a distributed optimizer): the
    /// data-parallel replicas times the context-parallel ranks.
    pub dp: (u64, u64),
    /// Neighbours on the context-parallel ring: on one node or two.
    pub cp_ring: (u64, u64),
    /// The context-parallel group (for the all-gather variant).
    pub cp: (u64, u64),
    /// The expert-parallel group (the token all-to-all).
    pub ep: (u64, u64),
    /// The expert-tensor-parallel group (gathers the routed tokens for the split experts).
    pub etp: (u64, u64),
    /// The ranks holding the same experts, which reduce their gradients together.
    pub expert_dp: (u64, u64),
    /// Neighbouring pipeline stages: on one node or two.
    pub pp: (u64, u64),
    /// The model-parallel ranks of one replica (tp · pp), over which the gradient norm is
    /// all-reduced.
    pub mp: (u64, u64),
}

impl Groups {
    /// The groups of `layout` on nodes of `gpus_per_node` GPUs.
    pub fn new(layout: &Layout, gpus_per_node: u64) -> Groups {
        let spread = |size: u64, stride: u64| -> (u64, u64) {
            // members `stride` ranks apart: how many share a node, over how many nodes
            let per_node = (gpus_per_node / stride).clamp(1, size);
            (size.div_ceil(per_node), per_node)
        };
        // neighbouring stages are tp·cp·dp ranks apart: on another node once that fills a node
        let replica = layout.tp * layout.cp * layout.dp;
        let pp = if replica >= gpus_per_node {
            (2, 1)
        } else {
            (1, 2)
        };
        let tp = spread(layout.tp, 1);
        // the ring's neighbours are tp ranks apart; its slowest hop leaves the node once the
        // ring spans more than one
        let cp = spread(layout.cp, layout.tp);
        let cp_ring = if cp.0 > 1 { (2, 1) } else { (1, 2) };
        // stages tp·cp·dp ranks apart: as many share a node as fit
        let stages_per_node = (gpus_per_node / replica.max(1)).clamp(1, layout.pp);
        let mp = (
            tp.0 * layout.pp.div_ceil(stages_per_node),
            tp.1 * stages_per_node,
        );
        Groups {
            tp,
            dp: spread(layout.grad_replicas(), layout.tp),
            cp_ring,
            cp,
            // Megatron-Core's order etp, cp, ep, dp: expert ranks etp·cp apart (tp·cp with the
            // default etp = tp)
            ep: spread(layout.ep, layout.etp * layout.cp),
            etp: spread(layout.etp, 1),
            expert_dp: spread(layout.expert_grad_replicas(), layout.etp * layout.ep),
            pp,
            mp,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Groups;
    use crate::workload::{Arch, Layout, ParallelSpec};

    fn groups(arch: &Arch, spec: ParallelSpec, gpus_per_node: u64) -> Groups {
        let c = crate::hardware::dgx_h100_without_models();
        Groups::new(&Layout::new(&spec, arch, &c).unwrap(), gpus_per_node)
    }

    /// Llama 3 8B on 64 GPUs of 8 a node: tp 2, cp 2, dp 4, pp 4. The tp pair shares a node;
    /// the cp pair is 2 ranks apart, on the same node (its ring never leaves it); the 8
    /// gradient replicas (dp × cp) 2 ranks apart, 4 a node over 2 nodes; a replica (16 ranks)
    /// fills two nodes, so neighbouring stages are on different nodes, and the model-parallel
    /// group (tp × pp: the gradient norm's) is a tp pair on each of 4 nodes. On one node with
    /// tp 1, dp 2, pp 4 the stages are 2 ranks apart: neighbours on a node, all four stages
    /// on it. With tp 8 a cp pair is a node apart: its ring and its gradient replicas cross
    /// nodes. On nodes of 4, tp 8 spans two; on pp 2 its model-parallel group spans four; on
    /// nodes of 8 a tp 8 replica (or tp 2 × cp 2 × dp 2) fills one, so the next stage is on
    /// the next node. Three replicas on tp 4 span two nodes.
    #[test]
    fn groups_follow_megatrons_rank_order() {
        let llama = Arch::resolve("llama3-8b").unwrap();
        let spec = |tp: u64, cp: u64, dp: u64, pp: u64| ParallelSpec {
            tp: Some(tp),
            cp: Some(cp),
            dp: Some(dp),
            pp: Some(pp),
            micro_batch: Some(1),
            global_batch: Some(dp * 4),
            ..Default::default()
        };
        let g = groups(&llama, spec(2, 2, 4, 4), 8);
        assert_eq!((g.tp, g.cp, g.cp_ring), ((1, 2), (1, 2), (1, 2)));
        assert_eq!((g.dp, g.pp, g.mp), ((2, 4), (2, 1), (4, 2)));

        let g = groups(&llama, spec(1, 1, 2, 4), 8);
        assert_eq!((g.tp, g.dp, g.pp, g.mp), ((1, 1), (1, 2), (1, 2), (1, 4)));

        let g = groups(&llama, spec(8, 2, 1, 1), 8);
        assert_eq!(
            (g.tp, g.cp, g.cp_ring, g.dp),
            ((1, 8), (2, 1), (2, 1), (2, 1))
        );

        let g = groups(&llama, spec(8, 1, 1, 2), 4);
        assert_eq!((g.tp, g.pp, g.mp), ((2, 4), (2, 1), (4, 4)));
        // a replica that just fills a node: the next stage is on the next node
        let g = groups(&llama, spec(8, 1, 1, 2), 8);
        assert_eq!((g.tp, g.pp, g.mp), ((1, 8), (2, 1), (2, 8)));
        // so does one of tp 2 × cp 2 × dp 2
        let g = groups(&llama, spec(2, 2, 2, 2), 8);
        assert_eq!((g.pp, g.mp), ((2, 1), (2, 2)));
        // 3 replicas 4 ranks apart, 2 a node: on 2 nodes
        let g = groups(&llama, spec(4, 1, 3, 1), 8);
        assert_eq!((g.tp, g.dp), ((1, 4), (2, 2)));
    }

    /// Mixtral on 32 GPUs of 8 a node, tp 2, dp 16, experts over 8 ranks unsplit (etp 1):
    /// the expert ranks are adjacent, a node's 8; the 2 · 16 / 8 = 4 ranks holding the same
    /// experts are 8 apart, one a node. With etp = tp = 2 and cp 2 on ep 4: expert ranks
    /// 4 apart, two a node over two nodes; the etp pair on a node; the 2 · 8 / 8 = 2 expert
    /// replicas 8 apart, on two nodes. On tp 1, dp 8, ep 2: 4 expert replicas 2 apart.
    #[test]
    fn expert_groups_follow_megatron_cores_order() {
        let mixtral = crate::workload::presets::mixtral_8x7b();
        let spec = |cp: u64, dp: u64, ep: u64, etp: u64| ParallelSpec {
            tp: Some(2),
            cp: Some(cp),
            dp: Some(dp),
            ep: Some(ep),
            etp: Some(etp),
            micro_batch: Some(1),
            global_batch: Some(dp),
            ..Default::default()
        };
        let g = groups(&mixtral, spec(1, 16, 8, 1), 8);
        assert_eq!((g.ep, g.etp, g.expert_dp), ((1, 8), (1, 1), (4, 1)));
        let g = groups(&mixtral, spec(2, 4, 4, 2), 8);
        assert_eq!((g.ep, g.etp, g.expert_dp), ((2, 2), (1, 2), (2, 1)));
        // tp 1, dp 8, ep 2: the 8 / 2 = 4 expert replicas 2 apart, all on the node
        let g = groups(
            &mixtral,
            ParallelSpec {
                tp: Some(1),
                ..spec(1, 8, 2, 1)
            },
            8,
        );
        assert_eq!((g.ep, g.etp, g.expert_dp), ((1, 2), (1, 1), (1, 4)));
    }
}

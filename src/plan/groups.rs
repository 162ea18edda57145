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

//! Process groups as NCCL sees them, with Megatron's rank order (tensor-parallel ranks
//! fastest, then data-parallel, then pipeline): for each group, how many nodes it spans and
//! how many of its members share a node — what a collective's cost depends on.

use crate::workload::Layout;

/// (nodes, members per node) of each group a rank belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Groups {
    /// The tensor-parallel group.
    pub tp: (u64, u64),
    /// The data-parallel group.
    pub dp: (u64, u64),
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
        // neighbouring stages are tp·dp ranks apart: on another node once that fills a node
        let pp = if layout.tp * layout.dp >= gpus_per_node {
            (2, 1)
        } else {
            (1, 2)
        };
        let tp = spread(layout.tp, 1);
        // stages tp·dp ranks apart: as many share a node as fit
        let stages_per_node = (gpus_per_node / (layout.tp * layout.dp).max(1)).clamp(1, layout.pp);
        let mp = (
            tp.0 * layout.pp.div_ceil(stages_per_node),
            tp.1 * stages_per_node,
        );
        Groups {
            tp,
            dp: spread(layout.dp, layout.tp),
            pp,
            mp,
        }
    }
}

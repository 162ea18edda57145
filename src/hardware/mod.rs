//! What the hardware can do: GPU peaks, interconnect tiers, whole clusters.

mod cluster;
#[cfg(test)]
pub(crate) use cluster::dgx_h100_without_models;
mod gpu;
mod network;

pub use cluster::{Cluster, ClusterSpec, Efficiency, MemoryOverheads, ModelsRef};
pub use gpu::{GpuSpec, PeakTflops};
pub use network::{InterNodeTier, IntraNodeTier, NetworkSpec};

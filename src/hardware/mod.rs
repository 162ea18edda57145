//! What the hardware can do: GPU peaks, interconnect tiers, whole clusters, the software they
//! run and how they fail.

mod cluster;
#[cfg(test)]
pub(crate) use cluster::dgx_h100_without_models;
mod fitted_range;
mod gpu;
mod network;
mod reliability;
mod runtime;
mod software;

pub use cluster::{Achievable, Cluster, ClusterSpec, Efficiency, MemoryOverheads, ModelsRef};
pub use fitted_range::{FittedRange, RunPoint};
pub use gpu::{GpuSpec, PeakTflops};
pub use network::{InterNodeTier, IntraNodeTier, NetworkSpec};
pub use reliability::{RecoveryLevel, Reliability, Storage};
pub use runtime::{
    framework_name, held_out_summary, spread, spreads_by_dtype, Calibration, Calibrations,
    FittedOn, Parameter, Runtime, MIN_RUNS_OF_A_TYPE, N_PARAMETERS, PARAMETERS,
};
pub use software::SoftwareStamp;

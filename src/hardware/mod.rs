//! What the hardware can do: GPU peaks and interconnect tiers.

mod gpu;
mod network;

pub use gpu::{GpuSpec, PeakTflops};
pub use network::{InterNodeTier, IntraNodeTier, NetworkSpec};

//! The device layer: what the harness needs from a GPU, as traits a CUDA backend, an AMD
//! (HIP/hipBLASLt/RCCL) backend or the mock test double implement.
//!
//! A `Device` prepares one operator call (allocates and fills its inputs, builds descriptors,
//! picks the algorithm once) and hands back a `Runnable` that the protocol runs: untimed warm-up
//! runs, then timed runs each bracketed by device events.

pub mod mock;
pub mod null;

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(not(feature = "cuda"))]
#[path = "disabled.rs"]
pub mod cuda;

use std::path::{Path, PathBuf};

use stepcast::dataset::SoftwareStamp;
use stepcast::hardware::GpuSpec;
use stepcast::ops::OpQuery;

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The point cannot be measured here (out of memory, unsupported type or shape); it is
    /// recorded as skipped with this reason and collection goes on.
    #[error("{0}")]
    Skip(String),
    /// The device itself failed; collection stops.
    #[error("{0}")]
    Fatal(String),
}

/// What the device is, for the dataset's stamp.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    pub gpu: GpuSpec,
    pub software: SoftwareStamp,
    /// GPUs on this node the collectives can use.
    pub gpus: u32,
    /// Whether the numbers are measurements (false only for the mock test double).
    pub real: bool,
    /// How a run is timed, as the dataset's meta.yaml states it.
    pub timer: String,
}

/// Clocks and thermals around one operator, from NVML.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Telemetry {
    pub sm_clock_mhz: u32,
    pub max_sm_clock_mhz: u32,
    pub temperature_c: u32,
    pub power_w: f64,
    /// NVML clock-event reasons (power cap, thermal, HW slowdown bits), 0 when none.
    pub throttle_reasons: u64,
}

/// NVML's clock-event reasons that mean the GPU slowed itself: software power cap (0x4),
/// hardware slowdown (0x8), software thermal (0x20), hardware thermal (0x40), power brake (0x80).
pub const THROTTLE_MASK: u64 = 0x4 | 0x8 | 0x20 | 0x40 | 0x80;

impl Telemetry {
    /// Clocks below 90 % of their maximum, or a throttle reason active.
    pub fn throttled(&self) -> bool {
        self.throttle_reasons & THROTTLE_MASK != 0
            || (self.max_sm_clock_mhz > 0
                && (self.sm_clock_mhz as f64) < 0.9 * self.max_sm_clock_mhz as f64)
    }
}

/// This process's place in a multi-node launch (one process per node).
#[derive(Debug, Clone)]
pub struct Launch {
    pub node: u64,
    pub nodes: u64,
    /// Directory on a shared file system where process 0 leaves the NCCL unique ids.
    pub rendezvous: PathBuf,
}

impl Launch {
    /// From Slurm (`SLURM_PROCID`, `SLURM_NTASKS`) or Open MPI / PMI (`OMPI_COMM_WORLD_RANK`,
    /// `OMPI_COMM_WORLD_SIZE`, `PMI_RANK`, `PMI_SIZE`); `None` for a single process.
    pub fn from_env(rendezvous: Option<&Path>) -> Result<Option<Launch>, String> {
        let var = |names: &[&str]| {
            names
                .iter()
                .find_map(|n| std::env::var(n).ok()?.parse::<u64>().ok())
        };
        let rank = var(&["SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"]);
        let size = var(&["SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"]);
        match (rank, size) {
            (Some(node), Some(nodes)) if nodes > 1 => {
                let rendezvous = rendezvous.ok_or(
                    "launched as several processes: give --rendezvous <directory on a shared file system>",
                )?;
                Ok(Some(Launch {
                    node,
                    nodes,
                    rendezvous: rendezvous.to_path_buf(),
                }))
            }
            _ => Ok(None),
        }
    }
}

/// One prepared operator call.
pub trait Runnable {
    /// Runs once without timing (warm-up).
    fn run(&mut self) -> Result<(), DeviceError>;
    /// Runs once bracketed by device events; returns the device time in microseconds. Inputs
    /// rotate between runs where one set would sit in L2 and flatter a small kernel.
    fn run_timed(&mut self) -> Result<f64, DeviceError>;
    /// Runs `n` times back to back, each run between two device events and nothing between the
    /// runs on the device, as kernels follow one another in a training step; returns each
    /// run's time in microseconds. A device that cannot queue them so times them one by one.
    fn run_timed_back_to_back(&mut self, n: u32) -> Result<Vec<f64>, DeviceError> {
        (0..n).map(|_| self.run_timed()).collect()
    }
}

pub trait Device {
    fn info(&self) -> DeviceInfo;
    /// Whether this device measures a kind of call (the rest go to another backend).
    fn handles(&self, q: &OpQuery) -> bool;
    /// Allocates and sets up one call; out of memory or an unsupported type is a `Skip`.
    fn prepare(&mut self, q: &OpQuery) -> Result<Box<dyn Runnable + '_>, DeviceError>;
    /// Runs a large GEMM for `ms` milliseconds so clocks and temperature reach steady state
    /// before the first timed operator of a group.
    fn saturate(&mut self, ms: u64) -> Result<(), DeviceError>;
    /// Current clocks and thermals, when the device can read them.
    fn telemetry(&mut self) -> Option<Telemetry>;
}

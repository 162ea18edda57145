//! stepcast's GPU microbenchmark harness (`stepcast bench collect`): times operators on one GPU
//! node with the sorted-median protocol and writes a stepcast dataset.
//!
//! - `plan`: which calls to time (a YAML plan, expanded through stepcast's own decomposition);
//! - `protocol`: warm-up runs, timed runs bracketed by events, sorted median, throttle flags;
//! - `device`: the GPU layer as traits — CUDA (cuBLASLt, NCCL, NVML; feature `cuda`) and a mock
//!   test double;
//! - `torch`: the node's own PyTorch for attention, norms, element-wise and the rest;
//! - `collect`: runs a plan into a dataset, appending and flushing each row, resumable;
//! - `drift`: compares this machine with the models it would predict with, and retrains.

pub mod collect;
pub mod device;
pub mod drift;
pub mod plan;
pub mod protocol;
pub mod torch;

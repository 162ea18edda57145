//! Analytic costs, from a GPU's and a network's specifications alone: the roofline of a
//! kernel (`roofline`), the slowdown of GEMMs whose operands are not 16-byte aligned
//! (`alignment`) and a tiered α–β model of NCCL collectives (`network`). Learned models
//! are measured against them, normalised by them, and fall back to them.

pub mod alignment;
pub mod network;
pub mod roofline;

//! stepcast predicts the time (and memory) of one training step of a distributed LLM before the
//! cluster is rented.
//!
//! The pipeline:
//! 1. `dataset`: measured operator timings (from `stepcast bench collect` or imported public
//!    data), one CSV per operator kind plus a metadata stamp;
//! 2. `ops`: the operator vocabulary and the one feature encoding training and prediction share;
//! 3. `regress`: per-(operator, phase) random forests and gradient-boosted trees on log time,
//!    exported to a compact flat-tree format for microsecond CPU prediction;
//! 4. `roofline`: the analytic baseline every learned model is compared with;
//! 5. `workload` and `predict`: a model under a parallel layout, decomposed into operator calls,
//!    each costed, composed into a step by `schedule` (the pipeline simulator); `memory`
//!    projects what each GPU holds.

pub mod analytic;
pub mod assets;
pub mod calibrate;
pub mod dataset;
pub mod error;
pub mod export;
pub mod fault;
pub mod fsutil;
pub mod hardware;
pub mod limits;
pub mod memory;
pub mod named;
pub mod ops;
pub mod plan;
pub mod predict;
pub mod progress;
pub mod provenance;
pub mod regress;
pub mod rng;
pub mod schedule;
pub mod search;
pub mod stats;
pub mod timing;
pub mod workload;

pub use error::{Error, Result};

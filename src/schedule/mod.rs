//! Event simulation of one training step on the pipeline ranks of one data-parallel replica
//! (the replicas run the same timeline).
//!
//! Each rank has a compute stream that runs its passes in the schedule's fixed order
//! (`order`), a pipeline stream for sends, and a data-parallel stream for gradient reduction
//! and parameter all-gathers. A forward waits for its input activations from the previous
//! virtual stage, a backward for the gradient from the next one (the last stage's backward for
//! its own forward), a weight-gradient pass for its backward. Sends block the sender unless
//! p2p overlap is on. Gradient buckets are reduced as the last micro-batch's backward completes
//! them (with `--overlap-grad-reduce`) or after the rank's last pass; every rank then waits for
//! the slowest (the optimizer's gradient-norm all-reduce spans the pipeline), steps its
//! optimizer and, unless it is overlapped with the next step's first forward, all-gathers its
//! parameters.
//!
//! With balanced stages and nothing overlapped, 1F1B here equals the paper's closed form
//! exactly (tested).

mod engine;
pub mod order;
pub mod trace;

use serde::Serialize;

use crate::predict::compose::{Breakdown, ClassTimes};
use crate::workload::{Overlap, Schedule};

pub use engine::simulate;

/// What a compute pass does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pass {
    Forward,
    /// Input gradients, plus the weight gradients unless the schedule splits them off.
    Backward,
    /// Weight gradients (zero-bubble schedules).
    WeightGrad,
}

/// One pass of one micro-batch on one virtual stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Task {
    pub stage: u32,
    pub pass: Pass,
    pub micro_batch: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SegmentKind {
    Embedding,
    Layer,
    Head,
}

/// A stretch of a pass, `repeat` times in a row (the layers of a chunk): what the timeline
/// draws, and which parameters' gradients it completes or which gathered weights it needs.
#[derive(Debug, Clone, Serialize)]
pub struct Segment {
    pub kind: SegmentKind,
    pub repeat: u64,
    /// One repetition, µs (exposed time: hidden TP communication excluded).
    pub us: f64,
    /// Of `us`, the recomputation a backward does first.
    pub recompute_us: f64,
    /// Parameters of one repetition.
    pub params: u64,
}

/// One pass of a virtual stage for one micro-batch.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PassWork {
    /// In execution order.
    pub segments: Vec<Segment>,
    /// Exposed time by class.
    pub parts: ClassTimes,
    /// Tensor-parallel communication hidden behind compute.
    pub hidden_tp_us: f64,
}

impl PassWork {
    pub fn us(&self) -> f64 {
        self.parts.total()
    }
}

/// A model chunk (virtual stage): where it runs and what each of its passes costs.
#[derive(Debug, Clone, Serialize)]
pub struct ChunkWork {
    pub rank: usize,
    /// Index of its first transformer layer in the model.
    pub first_layer: u64,
    pub fwd: PassWork,
    /// The backward; with a split schedule only its input-gradient part.
    pub bwd: PassWork,
    /// The weight-gradient part under a split schedule, else empty.
    pub wgrad: PassWork,
    /// Transfer of one micro-batch's activations to the next chunk (0: same rank or last).
    pub send_fwd_us: f64,
    /// Transfer of its input gradient to the previous chunk (0: same rank or first).
    pub send_bwd_us: f64,
}

impl ChunkWork {
    pub fn pass(&self, pass: Pass) -> &PassWork {
        match pass {
            Pass::Forward => &self.fwd,
            Pass::Backward => &self.bwd,
            Pass::WeightGrad => &self.wgrad,
        }
    }
}

/// Per-step work of a rank besides its passes.
#[derive(Debug, Clone, Serialize)]
pub struct RankWork {
    /// Data-parallel gradient reduction of all its parameters, µs.
    pub grad_sync_us: f64,
    /// Distributed-optimizer parameter all-gather, µs.
    pub param_gather_us: f64,
    pub optimizer_us: f64,
    /// Parameters on the rank (all chunks).
    pub params: u64,
    /// Elements per data-parallel bucket.
    pub bucket_elements: u64,
}

/// Everything the simulator needs for one step.
#[derive(Debug, Clone, Serialize)]
pub struct PipelineWork {
    pub schedule: Schedule,
    pub micro_batches: usize,
    /// Virtual stages in model order; chunk c of rank r is index c·pp + r.
    pub chunks: Vec<ChunkWork>,
    pub ranks: Vec<RankWork>,
    pub overlap: Overlap,
}

impl PipelineWork {
    pub fn pp(&self) -> usize {
        self.ranks.len()
    }

    pub fn vpp(&self) -> usize {
        self.chunks.len() / self.ranks.len().max(1)
    }
}

/// One pass as it ran.
#[derive(Debug, Clone, Serialize)]
pub struct TaskRun {
    pub task: Task,
    pub start_us: f64,
    pub end_us: f64,
    /// The send after it that held the compute stream (pipeline communication).
    pub blocking_send_us: f64,
    /// Time inside the pass spent waiting for gathered parameters.
    pub gather_wait_us: f64,
    /// Where it waited: (repetition index over the pass's segments, µs) before that repetition.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gather_waits: Vec<(u32, f64)>,
}

/// A span on a communication stream.
#[derive(Debug, Clone, Serialize)]
pub struct Span {
    pub name: String,
    pub start_us: f64,
    pub end_us: f64,
    /// Whether the compute stream waited for it.
    pub blocking: bool,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct RankTimeline {
    pub tasks: Vec<TaskRun>,
    /// Pipeline sends.
    pub sends: Vec<Span>,
    /// Data-parallel buckets (gradient reduction, parameter all-gather).
    pub data_parallel: Vec<Span>,
    pub optimizer: Option<Span>,
    /// End of the rank's last pass (and its blocking send).
    pub compute_end_us: f64,
    /// End of its gradient reduction.
    pub sync_end_us: f64,
    /// How the rank spent [0, its sync end]: busy by class, waiting as bubble.
    pub spent: Breakdown,
}

/// The simulated step.
#[derive(Debug, Clone, Serialize)]
pub struct Timeline {
    pub schedule: Schedule,
    pub step_us: f64,
    /// When the slowest rank's gradients were reduced: the optimizer starts here.
    pub barrier_us: f64,
    pub ranks: Vec<RankTimeline>,
    /// The step of the critical rank (the last to reach the barrier), then the optimizer phase
    /// of the rank that finishes last; the parts add up to the step.
    pub breakdown: Breakdown,
    pub critical_rank: usize,
}

impl Timeline {
    /// Bubble over busy pipeline time on the critical rank: (pp − 1)/m for balanced 1F1B.
    pub fn bubble_ratio(&self) -> f64 {
        bubble_ratio(&self.breakdown)
    }
}

/// Bubble over the busy pipeline time (compute, TP and PP communication).
pub fn bubble_ratio(b: &Breakdown) -> f64 {
    b.bubble / (b.compute + b.tp_comm + b.pp_comm).max(f64::MIN_POSITIVE)
}

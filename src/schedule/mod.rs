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
//! The simulator keeps no per-pass record: what a trace or a chart needs is handed to an
//! `Observer` as it happens (`trace` streams it to a file, `record` keeps it for a chart), and
//! the step's critical path is kept as a tape of provenance links only when asked for, to
//! attribute the step to its cost factors (`Timeline::critical_path`).
//!
//! With balanced stages and nothing overlapped, 1F1B here equals the paper's closed form
//! exactly (tested in `predict`).

#![warn(missing_docs)]

mod engine;
pub mod order;
pub mod record;
pub mod trace;

use serde::Serialize;

use crate::timing::{Attribution, Breakdown, ClassTimes};
use crate::workload::{Overlap, Schedule};

pub use engine::{simulate, simulate_with};

/// What a compute pass does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pass {
    /// Activations forward.
    Forward,
    /// Input gradients, plus the weight gradients unless the schedule splits them off.
    Backward,
    /// Weight gradients (zero-bubble schedules).
    WeightGrad,
}

impl Pass {
    /// The letter a timeline labels the pass with.
    pub fn letter(self) -> &'static str {
        match self {
            Pass::Forward => "F",
            Pass::Backward => "B",
            Pass::WeightGrad => "W",
        }
    }
}

/// One pass of one micro-batch on one virtual stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Task {
    /// The virtual stage (model chunk) it runs on.
    pub stage: u32,
    /// Which pass.
    pub pass: Pass,
    /// Which micro-batch.
    pub micro_batch: u32,
}

/// What a segment of a pass holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SegmentKind {
    /// The embedding (first chunk).
    Embedding,
    /// Transformer layers.
    Layer,
    /// Final norm, LM head and loss (last chunk).
    Head,
}

/// A stretch of a pass, `repeat` times in a row (the layers of a chunk): what the timeline
/// draws, and which parameters' gradients it completes or which gathered weights it needs.
#[derive(Debug, Clone, Serialize)]
pub struct Segment {
    /// What it holds.
    pub kind: SegmentKind,
    /// How many times in a row (the layers of a chunk).
    pub repeat: u64,
    /// One repetition, µs (exposed time: hidden TP communication excluded).
    pub us: f64,
    /// Of `us`, the recomputation a backward does first.
    pub recompute_us: f64,
    /// Host time to issue one repetition's kernels, µs.
    pub issue_us: f64,
    /// Parameters of one repetition.
    pub params: u64,
    /// Where one repetition's microseconds come from.
    #[serde(skip)]
    pub attribution: Attribution,
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
    /// Exposed µs of the pass.
    pub fn us(&self) -> f64 {
        self.parts.total()
    }

    /// Host time to issue all of the pass's kernels, µs.
    pub fn issue_us(&self) -> f64 {
        self.segments
            .iter()
            .map(|s| s.issue_us * s.repeat as f64)
            .sum()
    }

    /// The least time from the host starting to issue the pass to the device finishing it, µs:
    /// a kernel cannot start before it is issued, so for every point of the pass the host's
    /// time to issue what comes before it plus the device's time for what comes after bounds
    /// the pass from below. Between the ends of a pass this matters where device-heavy work
    /// follows host-bound work: the LM head and loss after a small model's layers run only once
    /// the host has issued those layers, so they cannot hide behind them. Within a run of
    /// identical repetitions the bound is linear, so it peaks at a segment boundary.
    pub fn issue_bound_us(&self) -> f64 {
        let mut host = 0.0;
        let mut device_after = self.us();
        let mut bound: f64 = 0.0;
        for s in &self.segments {
            bound = bound.max(host + device_after);
            host += s.issue_us * s.repeat as f64;
            device_after -= s.us * s.repeat as f64;
        }
        bound.max(host)
    }

    /// Repetitions over all segments.
    pub fn repetitions(&self) -> u64 {
        self.segments.iter().map(|s| s.repeat).sum()
    }

    /// Parameters whose gradients the pass completes (or whose weights it needs).
    pub fn params(&self) -> u64 {
        self.segments.iter().map(|s| s.params * s.repeat).sum()
    }

    /// Attribution of repetitions `from..to` (over all segments, in order).
    pub fn attribution(&self, from: u64, to: u64, into: &mut [f64]) {
        let mut first = 0;
        for seg in &self.segments {
            let (lo, hi) = (from.max(first), to.min(first + seg.repeat));
            if hi > lo {
                seg.attribution.accumulate(into, (hi - lo) as f64);
            }
            first += seg.repeat;
        }
    }
}

/// A model chunk (virtual stage): where it runs and what each of its passes costs.
#[derive(Debug, Clone, Serialize)]
pub struct ChunkWork {
    /// The pipeline rank it runs on.
    pub rank: usize,
    /// Index of its first transformer layer in the model.
    pub first_layer: u64,
    /// One micro-batch's forward.
    pub fwd: PassWork,
    /// The backward; with a split schedule only its input-gradient part.
    pub bwd: PassWork,
    /// The weight-gradient part under a split schedule, else empty.
    pub wgrad: PassWork,
    /// Transfer of one micro-batch's activations to the next chunk (0: same rank or last).
    pub send_fwd_us: f64,
    /// Transfer of its input gradient to the previous chunk (0: same rank or first).
    pub send_bwd_us: f64,
    /// Where one transfer's microseconds come from.
    #[serde(skip)]
    pub send_attribution: Attribution,
}

impl ChunkWork {
    /// The work of one pass.
    pub fn pass(&self, pass: Pass) -> &PassWork {
        match pass {
            Pass::Forward => &self.fwd,
            Pass::Backward => &self.bwd,
            Pass::WeightGrad => &self.wgrad,
        }
    }

    /// Transfer after a pass (none after a weight-gradient pass).
    pub fn send_us(&self, pass: Pass) -> f64 {
        match pass {
            Pass::Forward => self.send_fwd_us,
            Pass::Backward => self.send_bwd_us,
            Pass::WeightGrad => 0.0,
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
    /// The optimizer step, µs.
    pub optimizer_us: f64,
    /// Host time to issue the optimizer step's kernels, µs.
    pub optimizer_issue_us: f64,
    /// Parameters on the rank (all chunks).
    pub params: u64,
    /// Elements per data-parallel bucket.
    pub bucket_elements: u64,
    /// Where the gradient reduction's µs come from.
    #[serde(skip)]
    pub grad_sync_attribution: Attribution,
    /// Where the parameter all-gather's µs come from.
    #[serde(skip)]
    pub param_gather_attribution: Attribution,
    /// Where the optimizer step's µs come from.
    #[serde(skip)]
    pub optimizer_attribution: Attribution,
}

/// How the host (CPU) of each rank issues the kernels of a step.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Host {
    /// Host time to issue one kernel, µs (the device cannot start a pass before its first).
    pub launch_us: f64,
    /// The host waits for the device at every pipeline transfer (no issuing ahead).
    pub sync_per_transfer: bool,
    /// Host work per step outside the passes, µs, after the optimizer.
    pub step_overhead_us: f64,
}

/// Everything the simulator needs for one step.
#[derive(Debug, Clone, Serialize)]
pub struct PipelineWork {
    /// The order passes run in.
    pub schedule: Schedule,
    /// Micro-batches per step.
    pub micro_batches: usize,
    /// Virtual stages in model order, each naming its rank (round robin: chunk c of rank r is
    /// index c·pp + r; ZB-V's second chunk on rank r is 2·pp − 1 − r).
    pub chunks: Vec<ChunkWork>,
    /// Per pipeline rank, its per-step work.
    pub ranks: Vec<RankWork>,
    /// Which communication runs beside the compute.
    pub overlap: Overlap,
    /// How the host issues the kernels.
    pub host: Host,
    /// How many cost factors the attributions index (0: none kept).
    pub factors: usize,
    /// Each rank's pass order where it was fixed beforehand, as a framework fixes it before
    /// the step (ZB-V's, built on the nominal costs): moved copies of the work keep it, so an
    /// interval's recompositions run the same order. `None`: the schedule's order (ZB-V's
    /// built on this work's costs).
    #[serde(skip)]
    pub order: Option<std::sync::Arc<Vec<Vec<Task>>>>,
}

impl PipelineWork {
    /// Fixes ZB-V's order on this work's costs (see `order::zb_v`); other schedules' orders
    /// do not depend on costs.
    pub fn with_fixed_order(mut self) -> PipelineWork {
        if self.schedule == Schedule::ZbV {
            self.order = Some(std::sync::Arc::new(self.schedule_order()));
        }
        self
    }

    /// Each rank's pass order under the schedule: ZB-V's built on this work's pass times, the
    /// others' fixed by the schedule alone.
    pub fn schedule_order(&self) -> Vec<Vec<Task>> {
        let (p, m) = (self.pp(), self.micro_batches);
        match self.schedule {
            Schedule::ZbV => order::zb_v(p, m, |s, pass| self.chunks[s].pass(pass).us()),
            schedule => order::orders(schedule, p, self.vpp(), m),
        }
    }

    /// The same work with every duration's share of cost factor `factor` scaled by `k` (the
    /// classes of a pass are not kept apart: only the step time of the result is meaningful).
    pub fn moved(&self, factor: u32, k: f64) -> PipelineWork {
        let mut out = self.clone();
        let d = k - 1.0;
        for c in &mut out.chunks {
            for pass in [&mut c.fwd, &mut c.bwd, &mut c.wgrad] {
                let mut delta = 0.0;
                for s in &mut pass.segments {
                    let extra = d * s.attribution.of(factor);
                    s.us += extra;
                    delta += extra * s.repeat as f64;
                }
                pass.parts.compute += delta;
            }
            let extra = d * c.send_attribution.of(factor);
            if c.send_fwd_us > 0.0 {
                c.send_fwd_us += extra;
            }
            if c.send_bwd_us > 0.0 {
                c.send_bwd_us += extra;
            }
        }
        for r in &mut out.ranks {
            r.grad_sync_us += d * r.grad_sync_attribution.of(factor);
            r.param_gather_us += d * r.param_gather_attribution.of(factor);
            r.optimizer_us += d * r.optimizer_attribution.of(factor);
        }
        out
    }

    /// Passes the simulator runs.
    pub fn passes(&self) -> usize {
        let per = if self.schedule.splits_backward() {
            3
        } else {
            2
        };
        self.chunks.len() * self.micro_batches * per
    }

    /// Pipeline ranks.
    pub fn pp(&self) -> usize {
        self.ranks.len()
    }

    /// Model chunks per rank.
    pub fn vpp(&self) -> usize {
        self.chunks.len() / self.ranks.len().max(1)
    }
}

/// What a rank did, in summary.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RankSummary {
    /// End of the rank's last pass (and its blocking send).
    pub compute_end_us: f64,
    /// End of its gradient reduction.
    pub sync_end_us: f64,
    /// How the rank spent [0, its sync end]: busy by class, waiting as bubble.
    pub spent: Breakdown,
    /// Its optimizer step.
    pub optimizer_us: [f64; 2],
    /// Its exposed parameter all-gather after the optimizer (none when overlapped).
    pub param_gather_us: Option<[f64; 2]>,
}

/// The simulated step.
#[derive(Debug, Clone, Serialize)]
pub struct Timeline {
    /// The schedule simulated.
    pub schedule: Schedule,
    /// The step, µs: from the first pass to the last rank's optimizer (and exposed all-gather).
    pub step_us: f64,
    /// When the slowest rank's gradients were reduced: the optimizer starts here.
    pub barrier_us: f64,
    /// Per pipeline rank, what it did.
    pub ranks: Vec<RankSummary>,
    /// The step of the critical rank (the last to reach the barrier), then the optimizer phase
    /// of the rank that finishes last; the parts add up to the step.
    pub breakdown: Breakdown,
    /// The rank that reached the barrier last.
    pub critical_rank: usize,
    /// Per cost factor, the microseconds it contributes to the step's critical path: the
    /// step's first-order response to scaling that factor (kept when asked for).
    #[serde(skip)]
    pub critical_path: Option<Vec<f64>>,
}

impl Timeline {
    /// Bubble over busy pipeline time on the critical rank: (pp − 1)/m for balanced 1F1B.
    pub fn bubble_ratio(&self) -> f64 {
        self.breakdown.bubble_ratio()
    }

    /// How pipeline rank `r` of `work`'s step spent all of it, adding up to `step_us`: its
    /// passes and gradient reduction, waiting for the slowest rank, its optimizer (the excess
    /// host-bound where the host issues its kernels slower than they run) and exposed
    /// all-gather, waiting for the step's end, and the loop's per-step host work — counted as
    /// `breakdown` counts the step's.
    pub fn rank_breakdown(&self, work: &PipelineWork, r: usize) -> Breakdown {
        let rank = &self.ranks[r];
        let mut b = rank.spent;
        b.bubble += self.barrier_us - rank.sync_end_us;
        let [start, mut end] = rank.optimizer_us;
        let host_bound = (end - start - work.ranks[r].optimizer_us).max(0.0);
        b.optimizer += end - start - host_bound;
        b.host += host_bound;
        if let Some([from, to]) = rank.param_gather_us {
            b.dp_comm += to - from;
            end = end.max(to);
        }
        let overhead = work.host.step_overhead_us;
        b.host += overhead;
        b.bubble += self.step_us - overhead - end;
        b
    }
}

/// Something that happened during the simulated step, handed to an `Observer`.
#[derive(Debug, Clone, Copy)]
pub enum Event<'a> {
    /// A compute pass; `gather_waits` lists (repetition, µs) waits for gathered weights.
    Pass {
        /// The pipeline rank.
        rank: usize,
        /// The pass.
        task: Task,
        /// Start, µs.
        start_us: f64,
        /// End, µs.
        end_us: f64,
        /// Waits for gathered weights inside the pass: (repetition, µs).
        gather_waits: &'a [(u32, f64)],
    },
    /// A pipeline transfer after a pass.
    Send {
        /// The sending rank.
        rank: usize,
        /// The pass whose output is sent.
        task: Task,
        /// Start, µs.
        start_us: f64,
        /// End, µs.
        end_us: f64,
        /// Whether the sender's compute waited for it.
        blocking: bool,
    },
    /// A bucket of the parameter all-gather overlapped with the step's start.
    GatherBucket {
        /// The rank.
        rank: usize,
        /// The chunk of the rank (0 = its first).
        chunk: usize,
        /// The bucket, in gradient order.
        bucket: u64,
        /// Start, µs.
        start_us: f64,
        /// End, µs.
        end_us: f64,
    },
    /// A bucket of the gradient reduction.
    ReduceBucket {
        /// The rank.
        rank: usize,
        /// The chunk of the rank (0 = its first).
        chunk: usize,
        /// The bucket, in gradient order.
        bucket: u64,
        /// Start, µs.
        start_us: f64,
        /// End, µs.
        end_us: f64,
        /// Whether the compute waited for it (no overlap).
        blocking: bool,
    },
    /// A rank's optimizer step.
    Optimizer {
        /// The rank.
        rank: usize,
        /// Start, µs.
        start_us: f64,
        /// End, µs.
        end_us: f64,
    },
    /// The training loop's own host work that closes the step.
    StepOverhead {
        /// Start, µs.
        start_us: f64,
        /// End, µs.
        end_us: f64,
    },
    /// The parameter all-gather after the optimizer (not overlapped).
    ParamGather {
        /// The rank.
        rank: usize,
        /// Start, µs.
        start_us: f64,
        /// End, µs.
        end_us: f64,
    },
}

/// The communication streams of a rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Pipeline sends.
    Sends,
    /// Gradient reduction and parameter all-gathers.
    DataParallel,
}

/// An event on a communication stream, named as a timeline shows it.
#[derive(Debug, Clone)]
pub struct StreamEvent {
    /// The rank.
    pub rank: usize,
    /// The stream.
    pub stream: Stream,
    /// What the timeline calls it.
    pub name: String,
    /// Start, µs.
    pub start_us: f64,
    /// End, µs.
    pub end_us: f64,
    /// Whether the compute stream waited for it.
    pub blocking: bool,
}

impl Event<'_> {
    /// The event as a span on a communication stream (none for passes and the optimizer).
    pub fn on_stream(&self) -> Option<StreamEvent> {
        let (rank, stream, name, start_us, end_us, blocking) = match *self {
            Event::Pass { .. } | Event::Optimizer { .. } | Event::StepOverhead { .. } => {
                return None
            }
            Event::Send {
                rank,
                task,
                start_us,
                end_us,
                blocking,
            } => {
                let what = match task.pass {
                    Pass::Forward => "send activations",
                    _ => "send gradients",
                };
                let name = format!("{what} mb {}", task.micro_batch);
                (rank, Stream::Sends, name, start_us, end_us, blocking)
            }
            Event::GatherBucket {
                rank,
                chunk,
                bucket,
                start_us,
                end_us,
            } => {
                let name = format!("parameter all-gather chunk {chunk} bucket {bucket}");
                (rank, Stream::DataParallel, name, start_us, end_us, false)
            }
            Event::ReduceBucket {
                rank,
                chunk,
                bucket,
                start_us,
                end_us,
                blocking,
            } => {
                let name = format!("gradient reduce chunk {chunk} bucket {bucket}");
                (rank, Stream::DataParallel, name, start_us, end_us, blocking)
            }
            Event::ParamGather {
                rank,
                start_us,
                end_us,
            } => {
                let name = "parameter all-gather".to_string();
                (rank, Stream::DataParallel, name, start_us, end_us, true)
            }
        };
        Some(StreamEvent {
            rank,
            stream,
            name,
            start_us,
            end_us,
            blocking,
        })
    }
}

/// Receives the events of a simulated step as they happen.
pub trait Observer {
    /// Called for every event, in simulation order.
    fn event(&mut self, event: Event<'_>);
}

/// Observes nothing: a prediction that needs only the step.
pub struct Unobserved;

impl Observer for Unobserved {
    fn event(&mut self, _: Event<'_>) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attributed(factor: u32, us: f64) -> Attribution {
        let mut a = Attribution::default();
        a.add(factor, us);
        a
    }

    /// Two layers of 3 µs from factor 0, then a head of 5 µs from factor 1.
    fn layers_then_head() -> PassWork {
        let segment = |kind, repeat, us, factor| Segment {
            kind,
            repeat,
            us,
            recompute_us: 0.0,
            issue_us: 0.0,
            params: 0,
            attribution: attributed(factor, us),
        };
        PassWork {
            segments: vec![
                segment(SegmentKind::Layer, 2, 3.0, 0),
                segment(SegmentKind::Head, 1, 5.0, 1),
            ],
            parts: ClassTimes {
                compute: 11.0,
                ..Default::default()
            },
            hidden_tp_us: 0.0,
        }
    }

    #[test]
    fn a_range_of_repetitions_is_attributed_segment_by_segment() {
        let pass = layers_then_head();
        let of = |from, to| {
            let mut out = vec![0.0; 2];
            pass.attribution(from, to, &mut out);
            out
        };
        assert_eq!(of(0, 3), [6.0, 5.0]);
        assert_eq!(of(1, 3), [3.0, 5.0]);
        assert_eq!(of(2, 3), [0.0, 5.0]);
        assert_eq!(of(0, 1), [3.0, 0.0]);
        assert_eq!(of(2, 2), [0.0, 0.0]);
    }

    #[test]
    fn a_timeline_names_each_transfer_by_what_it_carries() {
        let send = |pass| Event::Send {
            rank: 1,
            task: Task {
                stage: 1,
                pass,
                micro_batch: 3,
            },
            start_us: 0.0,
            end_us: 1.0,
            blocking: true,
        };
        let name = |e: Event| e.on_stream().map(|s| (s.stream, s.name));
        assert_eq!(
            name(send(Pass::Forward)),
            Some((Stream::Sends, "send activations mb 3".to_string()))
        );
        assert_eq!(
            name(send(Pass::Backward)),
            Some((Stream::Sends, "send gradients mb 3".to_string()))
        );
        let reduce = Event::ReduceBucket {
            rank: 0,
            chunk: 1,
            bucket: 2,
            start_us: 0.0,
            end_us: 1.0,
            blocking: false,
        };
        assert_eq!(
            name(reduce),
            Some((
                Stream::DataParallel,
                "gradient reduce chunk 1 bucket 2".to_string()
            ))
        );
        let optimizer = Event::Optimizer {
            rank: 0,
            start_us: 0.0,
            end_us: 1.0,
        };
        assert_eq!(name(optimizer), None);
    }

    #[test]
    fn moving_a_factor_scales_its_share_of_every_duration() {
        let chunk = ChunkWork {
            rank: 0,
            first_layer: 0,
            fwd: layers_then_head(),
            bwd: layers_then_head(),
            wgrad: PassWork::default(),
            send_fwd_us: 2.0,
            send_bwd_us: 0.0,
            send_attribution: attributed(0, 2.0),
        };
        let rank = RankWork {
            grad_sync_us: 4.0,
            param_gather_us: 6.0,
            optimizer_us: 8.0,
            optimizer_issue_us: 0.0,
            params: 1,
            bucket_elements: 1,
            grad_sync_attribution: attributed(0, 4.0),
            param_gather_attribution: attributed(0, 3.0),
            optimizer_attribution: attributed(1, 8.0),
        };
        let work = PipelineWork {
            schedule: Schedule::OneFOneB,
            micro_batches: 1,
            chunks: vec![chunk],
            ranks: vec![rank],
            overlap: Overlap::default(),
            host: Host::default(),
            factors: 2,
            order: None,
        };
        // factor 0 half as slow again: its 3 µs layers take 4.5, the head keeps its 5
        let moved = work.moved(0, 1.5);
        let c = &moved.chunks[0];
        for pass in [&c.fwd, &c.bwd] {
            let us: Vec<f64> = pass.segments.iter().map(|s| s.us).collect();
            assert_eq!(us, [4.5, 5.0]);
            assert_eq!(pass.us(), 14.0);
        }
        // a transfer that does not happen stays away
        assert_eq!((c.send_fwd_us, c.send_bwd_us), (3.0, 0.0));
        let r = &moved.ranks[0];
        assert_eq!(
            (r.grad_sync_us, r.param_gather_us, r.optimizer_us),
            (6.0, 7.5, 8.0)
        );
        // factor 1: the head and the optimizer
        let moved = work.moved(1, 2.0);
        assert_eq!(moved.chunks[0].fwd.us(), 16.0);
        assert_eq!(moved.ranks[0].optimizer_us, 16.0);
        assert_eq!(moved.chunks[0].send_fwd_us, 2.0);
    }
}

//! Keeps what a chart of the simulated step draws: every pass, send and data-parallel bucket
//! of every rank. Only built when a chart is asked for; predictions keep no events.

use serde::Serialize;

use super::{Event, Observer, Stream, Task};

/// A pass as it ran.
#[derive(Debug, Clone, Serialize)]
pub struct PassRun {
    /// The pass.
    pub task: Task,
    /// Start, µs.
    pub start_us: f64,
    /// End, µs.
    pub end_us: f64,
}

/// A span on a communication stream.
#[derive(Debug, Clone, Serialize)]
pub struct StreamSpan {
    /// What the timeline calls it.
    pub name: String,
    /// Start, µs.
    pub start_us: f64,
    /// End, µs.
    pub end_us: f64,
    /// Whether the compute stream waited for it.
    pub blocking: bool,
}

/// One rank's events.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RankRecord {
    /// Compute passes in the order they ran.
    pub passes: Vec<PassRun>,
    /// Pipeline sends.
    pub sends: Vec<StreamSpan>,
    /// Data-parallel buckets (gradient reduction, parameter all-gather).
    pub data_parallel: Vec<StreamSpan>,
    /// The optimizer step (start, end), µs.
    pub optimizer: Option<(f64, f64)>,
}

/// Every rank's events.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Recorder {
    /// Per pipeline rank.
    pub ranks: Vec<RankRecord>,
    /// The training loop's own host work closing the step (start, end), µs, where it takes
    /// time: every rank waits for it.
    pub step_overhead: Option<(f64, f64)>,
}

impl Recorder {
    fn rank(&mut self, r: usize) -> &mut RankRecord {
        if self.ranks.len() <= r {
            self.ranks.resize_with(r + 1, RankRecord::default);
        }
        &mut self.ranks[r]
    }
}

impl Observer for Recorder {
    fn event(&mut self, event: Event<'_>) {
        match event {
            Event::Pass {
                rank,
                task,
                start_us,
                end_us,
                ..
            } => self.rank(rank).passes.push(PassRun {
                task,
                start_us,
                end_us,
            }),
            Event::Optimizer {
                rank,
                start_us,
                end_us,
            } => self.rank(rank).optimizer = Some((start_us, end_us)),
            Event::StepOverhead { start_us, end_us } => {
                self.step_overhead = Some((start_us, end_us))
            }
            other => {
                let Some(e) = other.on_stream() else { return };
                let span = StreamSpan {
                    name: e.name,
                    start_us: e.start_us,
                    end_us: e.end_us,
                    blocking: e.blocking,
                };
                let rank = self.rank(e.rank);
                match e.stream {
                    Stream::Sends => rank.sends.push(span),
                    Stream::DataParallel => rank.data_parallel.push(span),
                }
            }
        }
    }
}

//! Times the fixed per-rank orders of a schedule (see the module docs for the rules).
//!
//! Every time the engine computes is a `Moment`: the time and, when the critical path is kept,
//! the tape node that produced it — the moment it waited for plus a duration. Walking the tape
//! back from the step's end gives the critical path, and summing the attributions of its
//! durations says how much of the step each cost factor is.

use super::{Event, Observer, Pass, PipelineWork, RankSummary, Task, Timeline, Unobserved};
use crate::error::{Error, Result};
use crate::plan::Buckets;
use crate::timing::Breakdown;

/// A time and the tape node it came from.
#[derive(Debug, Clone, Copy)]
struct Moment {
    t: f64,
    node: u32,
}

/// The start of the step.
const ORIGIN: Moment = Moment { t: 0.0, node: NONE };
/// "Not yet": a dependency that has not happened.
const PENDING: Moment = Moment {
    t: f64::NAN,
    node: NONE,
};
const NONE: u32 = u32::MAX;

/// The later of two moments (the first on a tie).
fn later(a: Moment, b: Moment) -> Moment {
    if b.t > a.t {
        b
    } else {
        a
    }
}

/// What a tape node's duration was.
#[derive(Debug, Clone, Copy)]
enum Span {
    /// Repetitions `from..to` of a pass of a virtual stage.
    Pass {
        stage: u32,
        pass: Pass,
        from: u64,
        to: u64,
    },
    /// A pipeline transfer after a pass of a virtual stage.
    Send {
        stage: u32,
    },
    /// The first `elements` of a rank's parameter all-gather.
    Gather {
        rank: u32,
        elements: u64,
    },
    /// One gradient bucket of `elements` of a rank.
    Reduce {
        rank: u32,
        elements: u64,
    },
    Optimizer {
        rank: u32,
    },
    ParamGather {
        rank: u32,
    },
    /// Host time: issuing kernels the device waits for, or per-step host work.
    Host,
}

#[derive(Debug, Clone, Copy)]
struct Node {
    parent: u32,
    span: Span,
}

/// The provenance of every moment, when the critical path is wanted.
struct Tape {
    nodes: Vec<Node>,
}

struct Sim<'w> {
    work: &'w PipelineWork,
    tape: Option<Tape>,
}

impl Sim<'_> {
    /// `from` plus a span of `us`.
    fn after(&mut self, from: Moment, us: f64, span: Span) -> Moment {
        let node = match &mut self.tape {
            Some(tape) => {
                tape.nodes.push(Node {
                    parent: from.node,
                    span,
                });
                (tape.nodes.len() - 1) as u32
            }
            None => NONE,
        };
        Moment {
            t: from.t + us,
            node,
        }
    }

    /// Per cost factor, the microseconds on the path that ends at `end`.
    fn critical_path(&self, end: Moment) -> Option<Vec<f64>> {
        let tape = self.tape.as_ref()?;
        let w = self.work;
        let mut out = vec![0.0; w.factors];
        let mut node = end.node;
        while node != NONE {
            let n = tape.nodes[node as usize];
            let share = |elements: u64, params: u64| elements as f64 / params.max(1) as f64;
            match n.span {
                Span::Pass {
                    stage,
                    pass,
                    from,
                    to,
                } => w.chunks[stage as usize]
                    .pass(pass)
                    .attribution(from, to, &mut out),
                Span::Send { stage } => w.chunks[stage as usize]
                    .send_attribution
                    .accumulate(&mut out, 1.0),
                Span::Gather { rank, elements } => {
                    let r = &w.ranks[rank as usize];
                    r.param_gather_attribution
                        .accumulate(&mut out, share(elements, r.params));
                }
                Span::Reduce { rank, elements } => {
                    let r = &w.ranks[rank as usize];
                    r.grad_sync_attribution
                        .accumulate(&mut out, share(elements, r.params));
                }
                Span::Optimizer { rank } => w.ranks[rank as usize]
                    .optimizer_attribution
                    .accumulate(&mut out, 1.0),
                Span::ParamGather { rank } => w.ranks[rank as usize]
                    .param_gather_attribution
                    .accumulate(&mut out, 1.0),
                Span::Host => {}
            }
            node = n.parent;
        }
        Some(out)
    }
}

/// Simulates one step, observing nothing and keeping no critical path.
pub fn simulate(work: &PipelineWork) -> Result<Timeline> {
    simulate_with(work, &mut Unobserved, false)
}

/// Simulates one step, handing every event to `observer`; with `critical_path` the timeline
/// says how much of the step each cost factor of the work's attributions is. Generic over the
/// observer, so that the unobserved simulations of a search or an interval build no events.
pub fn simulate_with<O: Observer + ?Sized>(
    work: &PipelineWork,
    observer: &mut O,
    critical_path: bool,
) -> Result<Timeline> {
    let p = work.pp();
    let m = work.micro_batches;
    let n = work.chunks.len();
    if p == 0 || m == 0 || !n.is_multiple_of(p) {
        return Err(Error::Invalid(format!(
            "pipeline of {p} ranks, {n} chunks and {m} micro-batches cannot be simulated"
        )));
    }
    let mut sim = Sim {
        work,
        tape: critical_path.then(|| Tape { nodes: Vec::new() }),
    };
    // the first forward of each chunk waits for its gathered weights when the all-gather of
    // the distributed optimizer overlaps the step's start
    let (gates, gathers_end) = if work.overlap.param_gather {
        start_gathers(&mut sim, observer)
    } else {
        (Vec::new(), vec![ORIGIN; p])
    };
    let ranks = run_passes(&mut sim, observer, &gates)?;
    let mut summaries = Vec::with_capacity(p);
    let mut sync_ends = Vec::with_capacity(p);
    for (r, rank) in ranks.iter().enumerate() {
        let sync_end = reduce_gradients(&mut sim, observer, r, rank, gathers_end[r]);
        // a rank's last pass (and blocking send) ends its compute: what follows is reduction
        debug_assert_eq!(rank.compute_free.t, rank.cursor);
        let mut spent = rank.spent;
        spent.dp_comm += sync_end.t - rank.compute_free.t;
        summaries.push(RankSummary {
            compute_end_us: rank.compute_free.t,
            sync_end_us: sync_end.t,
            spent,
            ..Default::default()
        });
        sync_ends.push(sync_end);
    }
    let critical_rank = (0..p)
        .max_by(|&a, &b| sync_ends[a].t.total_cmp(&sync_ends[b].t))
        .unwrap_or(0);
    let barrier = sync_ends[critical_rank];
    // optimizer step after the barrier; the all-gather after it unless overlapped
    // (end, optimizer, host-bound optimizer, exposed gather)
    let mut last: Option<(Moment, f64, f64, f64)> = None;
    for (r, summary) in summaries.iter_mut().enumerate() {
        let w = &work.ranks[r];
        // the optimizer's kernels cannot run faster than the host issues them
        let opt_us = w.optimizer_us.max(w.optimizer_issue_us);
        let opt_end = sim.after(barrier, opt_us, Span::Optimizer { rank: r as u32 });
        summary.optimizer_us = [barrier.t, opt_end.t];
        observer.event(Event::Optimizer {
            rank: r,
            start_us: barrier.t,
            end_us: opt_end.t,
        });
        let gather = if work.overlap.param_gather {
            0.0
        } else {
            w.param_gather_us
        };
        let end = if gather > 0.0 {
            let end = sim.after(opt_end, gather, Span::ParamGather { rank: r as u32 });
            summary.param_gather_us = Some([opt_end.t, end.t]);
            observer.event(Event::ParamGather {
                rank: r,
                start_us: opt_end.t,
                end_us: end.t,
            });
            end
        } else {
            opt_end
        };
        let later_than_last = match last {
            Some((l, ..)) => end.t > l.t,
            None => true,
        };
        if later_than_last {
            last = Some((end, w.optimizer_us, opt_us - w.optimizer_us, gather));
        }
    }
    let (end, optimizer, optimizer_host, gather) = last.expect("at least one rank");
    let end = if end.t >= barrier.t { end } else { barrier };
    // the training loop's own host work closes the step
    let before = end.t;
    let end = sim.after(end, work.host.step_overhead_us, Span::Host);
    if end.t > before {
        observer.event(Event::StepOverhead {
            start_us: before,
            end_us: end.t,
        });
    }
    let mut breakdown = summaries[critical_rank].spent;
    breakdown.optimizer += optimizer;
    breakdown.host += optimizer_host + work.host.step_overhead_us;
    breakdown.dp_comm += gather;
    Ok(Timeline {
        schedule: work.schedule,
        step_us: end.t,
        barrier_us: barrier.t,
        ranks: summaries,
        breakdown,
        critical_rank,
        critical_path: sim.critical_path(end),
    })
}

/// A rank's state while its passes run.
struct RankState {
    /// When its compute stream is free.
    compute_free: Moment,
    /// When its host has issued everything so far.
    host_free: Moment,
    /// When its pipeline-send stream is free (p2p overlap).
    send_free: Moment,
    /// End of the last pass (and blocking send) accounted for.
    cursor: f64,
    spent: Breakdown,
    /// Per virtual stage of the rank, the start of its last gradient-completing pass.
    last_grad_start: Vec<Option<Moment>>,
}

/// When each pass's output reached the neighbouring stage, and when each pass ended: what the
/// passes of other stages wait for.
struct Handoffs {
    micro_batches: usize,
    stages: usize,
    fwd_out: Vec<Moment>,
    fwd_end: Vec<Moment>,
    bwd_out: Vec<Moment>,
    bwd_end: Vec<Moment>,
}

impl Handoffs {
    fn new(stages: usize, micro_batches: usize) -> Handoffs {
        let pending = || vec![PENDING; stages * micro_batches];
        Handoffs {
            micro_batches,
            stages,
            fwd_out: pending(),
            fwd_end: pending(),
            bwd_out: pending(),
            bwd_end: pending(),
        }
    }

    fn at(&self, stage: usize, micro_batch: usize) -> usize {
        stage * self.micro_batches + micro_batch
    }

    /// When a task's input is there (pending: not yet).
    fn ready(&self, task: Task) -> Moment {
        let (s, i) = (task.stage as usize, task.micro_batch as usize);
        match task.pass {
            Pass::Forward if s == 0 => ORIGIN,
            Pass::Forward => self.fwd_out[self.at(s - 1, i)],
            Pass::Backward if s + 1 == self.stages => self.fwd_end[self.at(s, i)],
            Pass::Backward => self.bwd_out[self.at(s + 1, i)],
            Pass::WeightGrad => self.bwd_end[self.at(s, i)],
        }
    }

    fn record(&mut self, task: Task, end: Moment, arrival: Moment) {
        let k = self.at(task.stage as usize, task.micro_batch as usize);
        match task.pass {
            Pass::Forward => (self.fwd_end[k], self.fwd_out[k]) = (end, arrival),
            Pass::Backward => (self.bwd_end[k], self.bwd_out[k]) = (end, arrival),
            Pass::WeightGrad => {}
        }
    }
}

/// Runs every rank's passes in the schedule's order.
fn run_passes<O: Observer + ?Sized>(
    sim: &mut Sim,
    observer: &mut O,
    gates: &[Vec<Moment>],
) -> Result<Vec<RankState>> {
    let work = sim.work;
    let (p, m, n) = (work.pp(), work.micro_batches, work.chunks.len());
    // a fixed order, else the schedule's
    let built;
    let orders: &[Vec<Task>] = match &work.order {
        Some(order) => order,
        None => {
            built = work.schedule_order();
            &built
        }
    };
    let mut handoffs = Handoffs::new(n, m);
    let mut next = vec![0usize; p];
    let mut ranks: Vec<RankState> = (0..p)
        .map(|_| RankState {
            compute_free: ORIGIN,
            host_free: ORIGIN,
            send_free: ORIGIN,
            cursor: 0.0,
            spent: Breakdown::default(),
            last_grad_start: vec![None; n],
        })
        .collect();
    let total: usize = orders.iter().map(Vec::len).sum();
    let mut done = 0;
    let mut waits = Vec::new();
    while done < total {
        let before = done;
        for r in 0..p {
            while let Some(&task) = orders[r].get(next[r]) {
                let ready = handoffs.ready(task);
                if ready.t.is_nan() {
                    break;
                }
                let (end, arrival) = run_task(
                    sim,
                    observer,
                    &mut ranks[r],
                    r,
                    task,
                    ready,
                    gates,
                    &mut waits,
                );
                handoffs.record(task, end, arrival);
                next[r] += 1;
                done += 1;
            }
        }
        if done == before {
            let stuck: Vec<String> = (0..p)
                .filter_map(|r| orders[r].get(next[r]).map(|t| format!("rank {r}: {t:?}")))
                .collect();
            return Err(Error::Invalid(format!(
                "the {} schedule deadlocked ({}): a bug in stepcast, please report it",
                work.schedule.name(),
                stuck.join("; ")
            )));
        }
    }
    Ok(ranks)
}

/// Runs one pass whose input is `ready` on rank `r`, and its send; returns when the pass ended
/// and when its output arrived.
#[allow(clippy::too_many_arguments)]
fn run_task<O: Observer + ?Sized>(
    sim: &mut Sim,
    observer: &mut O,
    rank: &mut RankState,
    r: usize,
    task: Task,
    ready: Moment,
    gates: &[Vec<Moment>],
    waits: &mut Vec<(u32, f64)>,
) -> (Moment, Moment) {
    let work = sim.work;
    let (s, i) = (task.stage as usize, task.micro_batch as usize);
    let device_ready = later(rank.compute_free, ready);
    // the host issues the pass's kernels; waiting for the device at pipeline transfers, it
    // starts only when the pass could run, else as soon as it has issued what came before
    let host_start = if work.host.sync_per_transfer {
        later(rank.host_free, device_ready)
    } else {
        rank.host_free
    };
    let chunk = &work.chunks[s];
    let pass = chunk.pass(task.pass);
    let first_issued = sim.after(
        host_start,
        work.host.launch_us.min(pass.issue_us()),
        Span::Host,
    );
    let start = later(device_ready, first_issued);
    waits.clear();
    let device_end = match gates.get(s) {
        Some(gates) if task.pass == Pass::Forward && i == 0 => {
            gated_forward(sim, s, start, gates, waits)
        }
        _ => {
            let span = Span::Pass {
                stage: task.stage,
                pass: task.pass,
                from: 0,
                to: pass.repetitions(),
            };
            sim.after(start, pass.us(), span)
        }
    };
    rank.host_free = sim.after(host_start, pass.issue_us(), Span::Host);
    // the device cannot finish before the host has issued the pass's last kernel, nor before
    // it has issued the work ahead of each device-heavy part (the bound covers both)
    let end = later(
        device_end,
        sim.after(host_start, pass.issue_bound_us(), Span::Host),
    );
    let host_bound = (start.t - device_ready.t) + (end.t - device_end.t);
    let send_us = chunk.send_us(task.pass);
    rank.compute_free = end;
    let arrival = if send_us <= 0.0 {
        end
    } else {
        let p2p = work.overlap.p2p;
        let from = if p2p { later(end, rank.send_free) } else { end };
        let arrival = sim.after(from, send_us, Span::Send { stage: task.stage });
        if p2p {
            rank.send_free = arrival;
        } else {
            rank.compute_free = arrival;
        }
        observer.event(Event::Send {
            rank: r,
            task,
            start_us: from.t,
            end_us: arrival.t,
            blocking: !p2p,
        });
        arrival
    };
    if task.pass == grad_pass(work) {
        rank.last_grad_start[s] = Some(start);
    }
    account(
        rank,
        chunk,
        task,
        [device_ready.t.max(rank.cursor), end.t],
        host_bound,
        send_us,
        waits,
        work.overlap.p2p,
    );
    observer.event(Event::Pass {
        rank: r,
        task,
        start_us: start.t,
        end_us: end.t,
        gather_waits: waits,
    });
    (end, arrival)
}

/// Adds a pass to how its rank spent the step: the gap before it could run as bubble, the
/// device waiting for the host as host time, its time by class, a blocking send as pipeline
/// communication, waits for weights as data-parallel.
#[allow(clippy::too_many_arguments)]
fn account(
    rank: &mut RankState,
    chunk: &super::ChunkWork,
    task: Task,
    [ready, end]: [f64; 2],
    host_bound: f64,
    send_us: f64,
    waits: &[(u32, f64)],
    p2p: bool,
) {
    let send = if p2p { 0.0 } else { send_us.max(0.0) };
    let parts = chunk.pass(task.pass).parts;
    let spent = &mut rank.spent;
    spent.bubble += (ready - rank.cursor).max(0.0);
    spent.host += host_bound + parts.host;
    spent.compute += parts.compute;
    spent.tp_comm += parts.tp_comm;
    spent.cp_comm += parts.cp_comm;
    spent.ep_comm += parts.ep_comm;
    spent.pp_comm += parts.pp_comm + send;
    spent.dp_comm += parts.dp_comm + waits.iter().map(|w| w.1).sum::<f64>();
    spent.optimizer += parts.optimizer;
    rank.cursor = end + send;
}

/// The pass that completes a chunk's gradients.
fn grad_pass(work: &PipelineWork) -> Pass {
    if work.schedule.splits_backward() {
        Pass::WeightGrad
    } else {
        Pass::Backward
    }
}

/// Starts every chunk's parameter all-gather at t = 0 on the data-parallel stream, first chunk
/// first, each chunk's buckets in forward order; returns per stage the moment each bucket (in
/// gradient order) is ready, and per rank when its data-parallel stream is free again.
fn start_gathers<O: Observer + ?Sized>(
    sim: &mut Sim,
    observer: &mut O,
) -> (Vec<Vec<Moment>>, Vec<Moment>) {
    let work = sim.work;
    let p = work.pp();
    let mut ready = vec![Vec::new(); work.chunks.len()];
    let mut free = Vec::with_capacity(p);
    for (r, w) in work.ranks.iter().enumerate() {
        let (mut t, mut elements) = (0.0, 0u64);
        for s in (r..work.chunks.len()).step_by(p) {
            let buckets = Buckets::new(work.chunks[s].fwd.params(), w.bucket_elements);
            let mut times = vec![ORIGIN; buckets.count() as usize];
            for k in (0..buckets.count()).rev() {
                let size = buckets.size_of(k);
                let us = w.param_gather_us * size as f64 / w.params.max(1) as f64;
                observer.event(Event::GatherBucket {
                    rank: r,
                    chunk: s / p,
                    bucket: k,
                    start_us: t,
                    end_us: t + us,
                });
                t += us;
                elements += size;
                let span = Span::Gather {
                    rank: r as u32,
                    elements,
                };
                times[k as usize] = sim.after(ORIGIN, t, span);
            }
            ready[s] = times;
        }
        free.push(sim.after(
            ORIGIN,
            t,
            Span::Gather {
                rank: r as u32,
                elements,
            },
        ));
    }
    (ready, free)
}

/// A first forward that needs each segment's weights gathered before it runs: returns its
/// end and fills `waits` with (repetition, µs) for every repetition that waited.
fn gated_forward(
    sim: &mut Sim,
    stage: usize,
    start: Moment,
    gates: &[Moment],
    waits: &mut Vec<(u32, f64)>,
) -> Moment {
    let work = sim.work;
    let chunk = &work.chunks[stage];
    let bucket = work.ranks[chunk.rank].bucket_elements.max(1);
    let total = chunk.fwd.params();
    let (mut t, mut seen, mut rep) = (start.t, 0u64, 0u32);
    // the last moment the pass waited for, and the repetition it resumed at
    let (mut from, mut from_rep) = (start, 0u64);
    for seg in &chunk.fwd.segments {
        for _ in 0..seg.repeat {
            seen += seg.params;
            // gradient order runs backwards through the model: this repetition's parameters
            // start at offset total − seen, in the bucket gathered last of those it spans
            let gate = gates
                .get(((total - seen.min(total)) / bucket) as usize)
                .copied()
                .unwrap_or(ORIGIN);
            if gate.t > t {
                waits.push((rep, gate.t - t));
                t = gate.t;
                (from, from_rep) = (gate, rep as u64);
            }
            t += seg.us;
            rep += 1;
        }
    }
    let span = Span::Pass {
        stage: stage as u32,
        pass: Pass::Forward,
        from: from_rep,
        to: rep as u64,
    };
    let end = sim.after(from, t - from.t, span);
    Moment { t, ..end }
}

/// Reduces a rank's gradient buckets on its data-parallel stream (free from `dp_free`): each
/// chunk's as its last gradient pass completes them with overlap, else all after the rank's
/// last pass. Returns when the rank's gradients are reduced.
fn reduce_gradients<O: Observer + ?Sized>(
    sim: &mut Sim,
    observer: &mut O,
    r: usize,
    rank: &RankState,
    dp_free: Moment,
) -> Moment {
    let work = sim.work;
    let w = &work.ranks[r];
    let grad_pass = grad_pass(work);
    // (ready, elements, chunk, bucket)
    let mut buckets: Vec<(Moment, u64, usize, u64)> = Vec::new();
    if w.grad_sync_us > 0.0 {
        for s in (r..work.chunks.len()).step_by(work.pp()) {
            let Some(last) = rank.last_grad_start[s] else {
                continue;
            };
            let pass = work.chunks[s].pass(grad_pass);
            let sizes = Buckets::new(pass.params(), w.bucket_elements);
            // walk the pass, noting when each bucket's last parameter is complete
            let (mut t, mut seen, mut k, mut filled, mut rep) = (last.t, 0u64, 0u64, 0u64, 0u64);
            for seg in &pass.segments {
                for _ in 0..seg.repeat {
                    t += seg.us;
                    seen += seg.params;
                    rep += 1;
                    while k < sizes.count() && seen >= filled + sizes.size_of(k) {
                        filled += sizes.size_of(k);
                        let span = Span::Pass {
                            stage: s as u32,
                            pass: grad_pass,
                            from: 0,
                            to: rep,
                        };
                        let ready = Moment {
                            t,
                            ..sim.after(last, t - last.t, span)
                        };
                        buckets.push((ready, sizes.size_of(k), s, k));
                        k += 1;
                    }
                }
            }
        }
    }
    let mut free = if work.overlap.grad_reduce {
        dp_free
    } else {
        later(dp_free, rank.compute_free)
    };
    buckets.sort_by(|a, b| a.0.t.total_cmp(&b.0.t));
    let mut sync_end = rank.compute_free;
    for (ready, elements, s, k) in buckets {
        let start = later(free, ready);
        let us = w.grad_sync_us * elements as f64 / w.params.max(1) as f64;
        let span = Span::Reduce {
            rank: r as u32,
            elements,
        };
        free = sim.after(start, us, span);
        observer.event(Event::ReduceBucket {
            rank: r,
            chunk: s / work.pp(),
            bucket: k,
            start_us: start.t,
            end_us: free.t,
            blocking: !work.overlap.grad_reduce,
        });
        sync_end = later(sync_end, free);
    }
    sync_end
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{ChunkWork, Host, PassWork, RankWork, Segment, SegmentKind};
    use crate::timing::{Attribution, ClassTimes};
    use crate::workload::{Overlap, Schedule};

    /// Five equal layers holding `params` parameters in all, attributed to factor `factor`.
    fn pass(us: f64, params: u64, factor: u32) -> PassWork {
        let mut attribution = Attribution::default();
        attribution.add(factor, us / 5.0);
        PassWork {
            segments: vec![Segment {
                kind: SegmentKind::Layer,
                repeat: 5,
                us: us / 5.0,
                recompute_us: 0.0,
                issue_us: 0.0,
                params: params / 5,
                attribution,
            }],
            parts: ClassTimes {
                compute: us,
                ..Default::default()
            },
            hidden_tp_us: 0.0,
        }
    }

    /// pp ranks × vpp chunks, a stage's forward `f`, input-gradient `b` and weight-gradient `w`
    /// split evenly over its chunks; `send` µs per transfer. Factors: 0 forward, 1 backward,
    /// 2 weight gradient, 3 sends.
    fn uniform(
        schedule: Schedule,
        p: usize,
        v: usize,
        m: usize,
        (f, b, w): (f64, f64, f64),
        send: f64,
    ) -> PipelineWork {
        let split = schedule.splits_backward();
        let n = p * v;
        let mut send_attribution = Attribution::default();
        send_attribution.add(3, send);
        let ranks = crate::workload::parallel::virtual_stage_ranks(p as u64, v as u64, schedule);
        let rank = |k: usize| ranks[k];
        // a transfer only between ranks (none between ZB-V's middle two chunks)
        let apart = |a: usize, b: usize| b < n && rank(a) != rank(b);
        let chunks = (0..n)
            .map(|k| ChunkWork {
                rank: rank(k),
                first_layer: k as u64,
                fwd: pass(f / v as f64, 100, 0),
                bwd: pass(
                    if split { b } else { b + w } / v as f64,
                    if split { 0 } else { 100 },
                    1,
                ),
                wgrad: if split {
                    pass(w / v as f64, 100, 2)
                } else {
                    PassWork::default()
                },
                send_fwd_us: if apart(k, k + 1) { send } else { 0.0 },
                send_bwd_us: if k > 0 && apart(k, k - 1) { send } else { 0.0 },
                send_attribution: send_attribution.clone(),
            })
            .collect();
        let ranks = (0..p)
            .map(|_| RankWork {
                grad_sync_us: 0.0,
                param_gather_us: 0.0,
                optimizer_us: 0.0,
                optimizer_issue_us: 0.0,
                params: 100 * v as u64,
                bucket_elements: 40,
                grad_sync_attribution: Attribution::default(),
                param_gather_attribution: Attribution::default(),
                optimizer_attribution: Attribution::default(),
            })
            .collect();
        PipelineWork {
            schedule,
            micro_batches: m,
            chunks,
            ranks,
            overlap: Overlap::default(),
            host: Default::default(),
            factors: 4,
            order: None,
        }
    }

    fn ratio(schedule: Schedule, v: usize) -> f64 {
        simulate(&uniform(schedule, 8, v, 32, (1.0, 1.0, 1.0), 0.0))
            .unwrap()
            .bubble_ratio()
    }

    /// A host-bound pass: `layers` µs of device time issued in `host` µs, then a head of
    /// `head` µs of device time issued in 1 µs.
    fn host_bound_forward(layers: f64, host: f64, head: f64) -> PassWork {
        let seg = |kind, repeat, us: f64, issue_us| Segment {
            kind,
            repeat,
            us,
            recompute_us: 0.0,
            issue_us,
            params: 0,
            attribution: Attribution::default(),
        };
        PassWork {
            segments: vec![
                seg(SegmentKind::Layer, 4, layers / 4.0, host / 4.0),
                seg(SegmentKind::Head, 1, head, 1.0),
            ],
            parts: ClassTimes {
                compute: layers + head,
                ..Default::default()
            },
            hidden_tp_us: 0.0,
        }
    }

    #[test]
    fn device_heavy_work_after_host_bound_work_is_not_hidden() {
        // the head cannot start before the host has issued the layers ahead of it
        let pass = host_bound_forward(40.0, 100.0, 30.0);
        assert_eq!(pass.issue_us(), 101.0);
        assert_eq!(pass.issue_bound_us(), 130.0);
        // device-bound passes and host-bound passes without a heavy tail keep their bound
        assert_eq!(
            host_bound_forward(200.0, 100.0, 30.0).issue_bound_us(),
            230.0
        );
        assert_eq!(host_bound_forward(40.0, 100.0, 0.5).issue_bound_us(), 101.0);
        // through the simulator: one rank, one micro-batch, a 10 µs launch
        let mut work = uniform(Schedule::OneFOneB, 1, 1, 1, (1.0, 1.0, 0.0), 0.0);
        work.chunks[0].fwd = pass;
        work.chunks[0].bwd = PassWork::default();
        work.host = Host {
            launch_us: 10.0,
            sync_per_transfer: true,
            step_overhead_us: 0.0,
        };
        let t = simulate(&work).unwrap();
        assert!((t.step_us - 130.0).abs() < 1e-9, "{}", t.step_us);
        // the device waits 10 µs for the first launch and 50 µs for the head's issue: host
        // time; it computes 70 µs
        let b = t.breakdown;
        assert!((b.host - 60.0).abs() < 1e-9 && b.compute == 70.0, "{b:?}");
    }

    #[test]
    fn a_passs_time_by_class_reaches_the_breakdown() {
        // one rank, one micro-batch: the forward's parts carry every class
        let mut work = uniform(Schedule::OneFOneB, 1, 1, 1, (28.0, 0.0, 0.0), 0.0);
        work.chunks[0].bwd = PassWork::default();
        work.chunks[0].fwd.parts = ClassTimes {
            compute: 1.0,
            tp_comm: 2.0,
            cp_comm: 3.0,
            ep_comm: 4.0,
            pp_comm: 5.0,
            dp_comm: 6.0,
            optimizer: 7.0,
            host: 8.0,
        };
        let b = simulate(&work).unwrap().breakdown;
        let expected = Breakdown {
            compute: 1.0,
            tp_comm: 2.0,
            cp_comm: 3.0,
            ep_comm: 4.0,
            pp_comm: 5.0,
            dp_comm: 6.0,
            optimizer: 7.0,
            bubble: 0.0,
            host: 8.0,
        };
        assert_eq!(b, expected);
    }

    #[test]
    fn bubbles_shrink_as_published() {
        // pp 8, m 32, F = B = W: 1F1B (pp − 1)/m; interleaved over 4 chunks a quarter of it;
        // ZB-H1 (pp − 1)(F + B − W) / m(F + B + W), a third
        let one = ratio(Schedule::OneFOneB, 1);
        assert!((one - 7.0 / 32.0).abs() < 1e-12, "{one}");
        let inter = ratio(Schedule::Interleaved, 4);
        assert!((inter - 7.0 / 128.0).abs() < 1e-12, "{inter}");
        let zb = ratio(Schedule::ZbH1, 1);
        assert!((zb - 7.0 / 96.0).abs() < 1e-12, "{zb}");
        assert_eq!(ratio(Schedule::Gpipe, 1), one);
    }

    /// ZB-V's order is built on the passes' own times: with input-gradient passes longer than
    /// the forward (as attention's are) it stays near ZB-H1, where an order built at equal times
    /// would leave ranks waiting — and well under 1F1B. (F, B, W a stage, pp 8, m 32.)
    #[test]
    fn zb_v_orders_its_passes_by_their_costs() {
        for ((f, b, w), zb_v_over, zb_h1_over) in [
            ((1.0, 1.5, 1.0), 9.25, 10.5),
            ((1.0, 1.2, 0.8), 9.4, 9.8),
            ((1.0, 2.0, 1.0), 16.5, 14.0),
        ] {
            let step = |schedule, v| {
                simulate(&uniform(schedule, 8, v, 32, (f, b, w), 0.0))
                    .unwrap()
                    .step_us
            };
            let ideal = 32.0 * (f + b + w);
            assert!((step(Schedule::ZbV, 2) - ideal - zb_v_over).abs() < 1e-9);
            assert!((step(Schedule::ZbH1, 1) - ideal - zb_h1_over).abs() < 1e-9);
            assert!(step(Schedule::OneFOneB, 1) - ideal > 20.0);
        }
    }

    /// ZB-V's order fixed on the nominal costs is the one the engine builds from them, and a
    /// moved copy of the work (an interval's recomposition) runs that same order.
    #[test]
    fn a_fixed_zb_v_order_survives_a_moved_copy() {
        let work = uniform(Schedule::ZbV, 4, 2, 8, (1.0, 1.5, 0.5), 0.1);
        let fixed = work.clone().with_fixed_order();
        let order = fixed.order.clone().expect("ZB-V fixes its order");
        assert_eq!(
            simulate(&fixed).unwrap().step_us,
            simulate(&work).unwrap().step_us
        );
        let moved = fixed.moved(1, 2.0);
        assert!(std::sync::Arc::ptr_eq(
            moved.order.as_ref().unwrap(),
            &order
        ));
        assert!(uniform(Schedule::ZbH1, 4, 1, 8, (1.0, 1.5, 0.5), 0.1)
            .with_fixed_order()
            .order
            .is_none());
    }

    /// ZB-V with equal forward, input- and weight-gradient passes: each rank's 3m passes plus
    /// at least the (pp − 1) half-stage forwards before the last rank starts — exactly that at
    /// pp 4, one chunk pass more at pp 2 and four at pp 8, what holding no more than 1F1B's
    /// first rank costs — against ZB-H1's (pp − 1) whole passes and 1F1B's 3(pp − 1).
    #[test]
    fn zb_v_comes_close_to_the_least_any_order_takes() {
        for (p, extra) in [(2usize, 1.0), (4, 1.5), (8, 5.5)] {
            for m in [2 * p, 4 * p] {
                let step = |schedule, v| {
                    simulate(&uniform(schedule, p, v, m, (1.0, 1.0, 1.0), 0.0))
                        .unwrap()
                        .step_us
                };
                let ideal = 3.0 * m as f64;
                assert_eq!(step(Schedule::ZbV, 2), ideal + extra, "pp {p}, m {m}");
                assert_eq!(step(Schedule::ZbH1, 1), ideal + (p - 1) as f64);
                assert_eq!(step(Schedule::OneFOneB, 1), ideal + 3.0 * (p - 1) as f64);
            }
        }
    }

    #[test]
    fn blocking_sends_count_as_pipeline_communication() {
        let t = simulate(&uniform(Schedule::OneFOneB, 4, 1, 8, (1.0, 1.0, 1.0), 0.25)).unwrap();
        let b = t.breakdown;
        assert!((b.total() - t.step_us).abs() < 1e-9);
        // rank 0 sends each forward's activations: 8 × 0.25
        assert_eq!(t.critical_rank, 0);
        assert!((b.pp_comm - 2.0).abs() < 1e-12, "{b:?}");
        let mut overlapped = uniform(Schedule::OneFOneB, 4, 1, 8, (1.0, 1.0, 1.0), 0.25);
        overlapped.overlap.p2p = true;
        let o = simulate(&overlapped).unwrap();
        assert!(o.step_us < t.step_us && o.breakdown.pp_comm == 0.0);
        // a chart shows which sends held their rank's compute
        for (p2p, blocking) in [(false, true), (true, false)] {
            let mut work = uniform(Schedule::OneFOneB, 4, 1, 8, (1.0, 1.0, 1.0), 0.25);
            work.overlap.p2p = p2p;
            let mut chart = crate::schedule::record::Recorder::default();
            simulate_with(&work, &mut chart, false).unwrap();
            let sends = &chart.ranks[0].sends;
            assert_eq!(sends.len(), 8);
            assert!(sends.iter().all(|s| s.blocking == blocking), "p2p {p2p}");
        }
    }

    /// pp 2, m 4, a stage's forward 1 µs and backward 2 µs, each rank reducing its gradients
    /// in `grad_sync_us`.
    fn reducing_in(grad_sync_us: f64) -> PipelineWork {
        let mut work = uniform(Schedule::OneFOneB, 2, 1, 4, (1.0, 1.0, 1.0), 0.0);
        for r in &mut work.ranks {
            r.grad_sync_us = grad_sync_us;
        }
        work
    }

    #[test]
    fn overlapped_gradient_reduction_hides_behind_the_last_backward() {
        let mut work = reducing_in(1.5);
        let exposed = simulate(&work).unwrap();
        work.overlap.grad_reduce = true;
        let hidden = simulate(&work).unwrap();
        // buckets of 40, 40 and 20 parameters (0.6, 0.6, 0.3 µs) complete 0.8, 1.6 and 2 µs
        // into rank 0's last 2 µs backward: reduced at −1.2…−0.6, −0.4…+0.2, +0.2…+0.5
        assert!(
            (exposed.breakdown.dp_comm - 1.5).abs() < 1e-9,
            "{:?}",
            exposed.breakdown
        );
        assert!(
            (hidden.breakdown.dp_comm - 0.5).abs() < 1e-9,
            "{:?}",
            hidden.breakdown
        );
        assert!((exposed.step_us - hidden.step_us - 1.0).abs() < 1e-9);
    }

    #[test]
    fn each_rank_says_when_its_compute_and_its_reduction_ended() {
        // pp 2, m 4, a stage's forward 1 µs and backward 2 µs: rank 0 computes for
        // (m + p − 1)(F + B) = 15 µs, rank 1's last backward ends one backward earlier
        let mut work = reducing_in(1.5);
        let t = simulate(&work).unwrap();
        let ends: Vec<[f64; 2]> = t
            .ranks
            .iter()
            .map(|r| [r.compute_end_us, r.sync_end_us])
            .collect();
        assert_eq!(ends, [[15.0, 16.5], [13.0, 14.5]]);
        assert_eq!((t.barrier_us, t.step_us), (16.5, 16.5));
        // overlapped, rank 0's buckets end 0.5 µs after its compute (see the test above)
        work.overlap.grad_reduce = true;
        let hidden = simulate(&work).unwrap();
        assert_eq!(hidden.ranks[0].compute_end_us, 15.0);
        assert!((hidden.ranks[0].sync_end_us - 15.5).abs() < 1e-9);
    }

    /// The events a test looks at, as tuples easy to compare.
    #[derive(Default)]
    struct Seen {
        /// The step's closing phases: (name, rank, start, end).
        closing: Vec<(&'static str, usize, f64, f64)>,
        /// The overlapped all-gather's buckets: (rank, chunk, bucket, start, end).
        gathers: Vec<(usize, usize, u64, f64, f64)>,
        /// What passes waited for those buckets: (rank, repetition, µs).
        waits: Vec<(usize, u32, f64)>,
        /// The gradient reduction's buckets: (rank, chunk, whether the compute waited).
        reductions: Vec<(usize, usize, bool)>,
    }

    impl Observer for Seen {
        fn event(&mut self, event: Event<'_>) {
            match event {
                Event::GatherBucket {
                    rank,
                    chunk,
                    bucket,
                    start_us,
                    end_us,
                } => self.gathers.push((rank, chunk, bucket, start_us, end_us)),
                Event::ReduceBucket {
                    rank,
                    chunk,
                    blocking,
                    ..
                } => self.reductions.push((rank, chunk, blocking)),
                Event::Pass {
                    rank, gather_waits, ..
                } => self
                    .waits
                    .extend(gather_waits.iter().map(|&(rep, us)| (rank, rep, us))),
                Event::Optimizer {
                    rank,
                    start_us,
                    end_us,
                } => self.closing.push(("optimizer", rank, start_us, end_us)),
                Event::ParamGather {
                    rank,
                    start_us,
                    end_us,
                } => self.closing.push(("gather", rank, start_us, end_us)),
                Event::StepOverhead { start_us, end_us } => {
                    self.closing.push(("host", 0, start_us, end_us))
                }
                _ => {}
            }
        }
    }

    #[test]
    fn the_step_closes_with_optimizer_gather_and_host_work_that_exist() {
        // one rank, one micro-batch of 1 + 1 µs: the barrier at 2 µs
        let mut work = uniform(Schedule::OneFOneB, 1, 1, 1, (1.0, 1.0, 0.0), 0.0);
        work.ranks[0].optimizer_us = 3.0;
        let mut seen = Seen::default();
        let bare = simulate_with(&work, &mut seen, false).unwrap();
        // no gather and no per-step host work: no event for them, nor a summary's gather
        assert_eq!(seen.closing, [("optimizer", 0, 2.0, 5.0)]);
        assert_eq!(bare.ranks[0].param_gather_us, None);
        assert_eq!(bare.step_us, 5.0);
        work.ranks[0].param_gather_us = 0.5;
        work.host.step_overhead_us = 4.0;
        let mut seen = Seen::default();
        let full = simulate_with(&work, &mut seen, false).unwrap();
        assert_eq!(
            seen.closing,
            [
                ("optimizer", 0, 2.0, 5.0),
                ("gather", 0, 5.0, 5.5),
                ("host", 0, 5.5, 9.5)
            ]
        );
        assert_eq!(full.ranks[0].param_gather_us, Some([5.0, 5.5]));
        assert_eq!(full.step_us, 9.5);
        let b = full.breakdown;
        assert_eq!((b.optimizer, b.dp_comm, b.host), (3.0, 0.5, 4.0));
    }

    #[test]
    fn an_overlapped_all_gather_holds_each_layer_until_its_bucket_is_there() {
        // one rank, five layers of 1 µs and 20 parameters; buckets of 40, 40 and 20 in
        // gradient order, gathered first layers first in 10 µs for all 100 parameters:
        // bucket 2 at [0, 2], 1 at [2, 6], 0 at [6, 10]
        let mut work = uniform(Schedule::OneFOneB, 1, 1, 1, (5.0, 2.0, 0.0), 0.0);
        work.overlap.param_gather = true;
        work.ranks[0].param_gather_us = 10.0;
        work.ranks[0].param_gather_attribution.add(3, 10.0);
        let mut seen = Seen::default();
        let t = simulate_with(&work, &mut seen, true).unwrap();
        assert_eq!(
            seen.gathers,
            [
                (0, 0, 2, 0.0, 2.0),
                (0, 0, 1, 2.0, 6.0),
                (0, 0, 0, 6.0, 10.0)
            ]
        );
        // layer 0 waits for bucket 2 (2 µs), layer 1 for bucket 1 (until 6), layer 2 does
        // not, layer 3 for bucket 0 (until 10): the forward ends at 12, the backward at 14
        assert_eq!(seen.waits, [(0, 0, 2.0), (0, 1, 3.0), (0, 3, 2.0)]);
        assert_eq!(t.step_us, 14.0);
        let b = t.breakdown;
        assert_eq!((b.compute, b.dp_comm), (7.0, 7.0));
        // on the critical path: the whole gather, the last two layers, the backward
        let path = t.critical_path.unwrap();
        for (f, want) in [2.0, 2.0, 0.0, 10.0].into_iter().enumerate() {
            assert!((path[f] - want).abs() < 1e-9, "factor {f}: {path:?}");
        }
        // nothing after the optimizer: the gather was overlapped
        assert_eq!(t.ranks[0].param_gather_us, None);
        // with two ranks of two chunks, each rank gathers its chunks in order
        // and reduces their gradients, waited for or not
        let mut two = uniform(Schedule::Interleaved, 2, 2, 4, (1.0, 1.0, 1.0), 0.0);
        two.overlap.param_gather = true;
        for r in &mut two.ranks {
            r.param_gather_us = 1.0;
            r.grad_sync_us = 1.0;
            r.bucket_elements = 50;
        }
        for overlapped in [false, true] {
            two.overlap.grad_reduce = overlapped;
            let mut seen = Seen::default();
            simulate_with(&two, &mut seen, false).unwrap();
            let mut chunks: Vec<(usize, usize)> = seen.gathers.iter().map(|e| (e.0, e.1)).collect();
            chunks.dedup();
            assert_eq!(chunks, [(0, 0), (0, 1), (1, 0), (1, 1)]);
            // two full buckets of each chunk's 100 parameters, and no empty third
            assert_eq!(seen.reductions.len(), 2 * 2 * 2);
            let mut reduced = seen.reductions.clone();
            reduced.sort_by_key(|e| (e.0, e.1));
            reduced.dedup();
            let waited = !overlapped;
            assert_eq!(
                reduced,
                [
                    (0, 0, waited),
                    (0, 1, waited),
                    (1, 0, waited),
                    (1, 1, waited)
                ]
            );
        }
    }

    #[test]
    fn the_rank_that_ends_the_step_gives_its_closing_phases() {
        // after the barrier rank 1 ends last, then both tie: the first rank gives the split
        let mut work = uniform(Schedule::OneFOneB, 2, 1, 2, (1.0, 1.0, 0.0), 0.0);
        let closing = |work: &PipelineWork| {
            let t = simulate(work).unwrap();
            (
                t.step_us - t.barrier_us,
                t.breakdown.optimizer,
                t.breakdown.dp_comm,
            )
        };
        for (r, (optimizer, gather)) in [(3.0, 1.0), (2.0, 2.5)].into_iter().enumerate() {
            work.ranks[r].optimizer_us = optimizer;
            work.ranks[r].param_gather_us = gather;
        }
        assert_eq!(closing(&work), (4.5, 2.0, 2.5));
        work.ranks[1].param_gather_us = 2.0;
        assert_eq!(closing(&work), (4.0, 3.0, 1.0));
    }

    #[test]
    fn a_pipeline_that_cannot_be_simulated_is_refused() {
        let ok = uniform(Schedule::OneFOneB, 2, 1, 4, (1.0, 1.0, 1.0), 0.0);
        assert!(simulate(&ok).is_ok());
        // no micro-batches
        let mut none = ok.clone();
        none.micro_batches = 0;
        // chunks that do not divide over the ranks
        let mut uneven = ok.clone();
        uneven.chunks.pop();
        // no ranks
        let mut empty = ok.clone();
        empty.ranks.clear();
        for work in [none, uneven, empty] {
            let err = simulate(&work).unwrap_err().to_string();
            assert!(err.contains("cannot be simulated"), "{err}");
        }
    }

    /// The critical path is the step's derivative: scaling a factor by 1 + ε moves the step by
    /// ε times its share of the path.
    #[test]
    fn critical_path_is_the_steps_response_to_each_factor() {
        for (schedule, v, p2p, reduce) in [
            (Schedule::OneFOneB, 1, false, None),
            (Schedule::OneFOneB, 1, true, None),
            (Schedule::Interleaved, 2, true, None),
            (Schedule::ZbH1, 1, false, None),
            (Schedule::Gpipe, 1, false, None),
            // a gradient reduction long enough to end the step, overlapped or after the passes
            (Schedule::OneFOneB, 1, false, Some(true)),
            (Schedule::OneFOneB, 1, false, Some(false)),
            (Schedule::ZbH1, 1, true, Some(true)),
        ] {
            let mut work = uniform(schedule, 4, v, 8, (1.0, 1.7, 0.6), 0.3);
            work.overlap.p2p = p2p;
            // factor 4: the gradient reduction
            work.factors = 5;
            if let Some(overlapped) = reduce {
                work.overlap.grad_reduce = overlapped;
                for r in &mut work.ranks {
                    r.grad_sync_us = 6.0;
                    r.grad_sync_attribution.add(4, 6.0);
                }
            }
            // unbalanced: rank 2 is slow
            for c in work.chunks.iter_mut().filter(|c| c.rank == 2) {
                for s in &mut c.fwd.segments {
                    s.us *= 1.3;
                    s.attribution = {
                        let mut a = Attribution::default();
                        a.add(0, s.us);
                        a
                    };
                }
                c.fwd.parts.compute *= 1.3;
            }
            let base = simulate_with(&work, &mut Unobserved, true).unwrap();
            let path = base.critical_path.clone().unwrap();
            // all of the step is on the path
            let on_path: f64 = path.iter().sum();
            assert!(
                (on_path - base.step_us).abs() < 1e-9,
                "{schedule:?}: {path:?} {}",
                base.step_us
            );
            for factor in 0..5u32 {
                let eps = 1e-6;
                let mut moved = work.clone();
                if factor == 4 {
                    for r in &mut moved.ranks {
                        r.grad_sync_us *= 1.0 + eps;
                    }
                }
                for c in &mut moved.chunks {
                    for pass in [&mut c.fwd, &mut c.bwd, &mut c.wgrad] {
                        for s in &mut pass.segments {
                            if s.attribution.iter().any(|(f, _)| f == factor) {
                                s.us *= 1.0 + eps;
                            }
                        }
                        let k = if pass
                            .segments
                            .iter()
                            .any(|s| s.attribution.iter().any(|(f, _)| f == factor))
                        {
                            1.0 + eps
                        } else {
                            1.0
                        };
                        pass.parts.compute *= k;
                    }
                    if factor == 3 {
                        c.send_fwd_us *= 1.0 + eps;
                        c.send_bwd_us *= 1.0 + eps;
                    }
                }
                let step = simulate(&moved).unwrap().step_us;
                let derivative = (step - base.step_us) / eps;
                assert!(
                    (derivative - path[factor as usize]).abs() < 1e-4 * base.step_us,
                    "{schedule:?} factor {factor}: {derivative} vs {}",
                    path[factor as usize]
                );
            }
        }
    }
}

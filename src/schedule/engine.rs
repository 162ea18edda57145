//! Times the fixed per-rank orders of a schedule (see the module docs for the rules).

use super::order::orders;
use super::{Pass, PipelineWork, RankTimeline, Span, TaskRun, Timeline};
use crate::error::{Error, Result};
use crate::predict::compose::Breakdown;

/// Simulates one step.
pub fn simulate(work: &PipelineWork) -> Result<Timeline> {
    let p = work.pp();
    let m = work.micro_batches;
    let n = work.chunks.len();
    if p == 0 || m == 0 || n % p != 0 {
        return Err(Error::Invalid(format!(
            "pipeline of {p} ranks, {n} chunks and {m} micro-batches cannot be simulated"
        )));
    }
    let orders = orders(work.schedule, p, work.vpp(), m);
    let at = |stage: usize, mb: usize| stage * m + mb;
    // when a pass ended, and when its output reached the neighbouring stage
    let mut fwd_end = vec![f64::NAN; n * m];
    let mut fwd_out = vec![f64::NAN; n * m];
    let mut bwd_end = vec![f64::NAN; n * m];
    let mut bwd_out = vec![f64::NAN; n * m];
    let mut compute_free = vec![0.0f64; p];
    let mut send_free = vec![0.0f64; p];
    let mut next = vec![0usize; p];
    let mut ranks: Vec<RankTimeline> = vec![RankTimeline::default(); p];
    // the first forward of each chunk waits for its gathered weights when the all-gather of
    // the distributed optimizer overlaps the step's start
    let (gathered, gathers_end) = if work.overlap.param_gather {
        start_gathers(work, &mut ranks)
    } else {
        (Vec::new(), vec![0.0; p])
    };

    let total: usize = orders.iter().map(Vec::len).sum();
    let mut done = 0;
    while done < total {
        let before = done;
        for r in 0..p {
            while let Some(&task) = orders[r].get(next[r]) {
                let s = task.stage as usize;
                let i = task.micro_batch as usize;
                let ready = match task.pass {
                    Pass::Forward if s == 0 => 0.0,
                    Pass::Forward => fwd_out[at(s - 1, i)],
                    Pass::Backward if s + 1 == n => fwd_end[at(s, i)],
                    Pass::Backward => bwd_out[at(s + 1, i)],
                    Pass::WeightGrad => bwd_end[at(s, i)],
                };
                if ready.is_nan() {
                    break;
                }
                let chunk = &work.chunks[s];
                let start = compute_free[r].max(ready);
                let (end, waits) = match (task.pass, gathered.get(s)) {
                    (Pass::Forward, Some(gates)) if i == 0 => gated_forward(work, s, start, gates),
                    _ => (start + chunk.pass(task.pass).us(), Vec::new()),
                };
                compute_free[r] = end;
                let send_us = match task.pass {
                    Pass::Forward => chunk.send_fwd_us,
                    Pass::Backward => chunk.send_bwd_us,
                    Pass::WeightGrad => 0.0,
                };
                let arrival = if send_us <= 0.0 {
                    end
                } else if work.overlap.p2p {
                    let from = end.max(send_free[r]);
                    send_free[r] = from + send_us;
                    ranks[r]
                        .sends
                        .push(send_span(task.pass, i, from, send_us, false));
                    from + send_us
                } else {
                    compute_free[r] = end + send_us;
                    ranks[r]
                        .sends
                        .push(send_span(task.pass, i, end, send_us, true));
                    end + send_us
                };
                match task.pass {
                    Pass::Forward => {
                        fwd_end[at(s, i)] = end;
                        fwd_out[at(s, i)] = arrival;
                    }
                    Pass::Backward => {
                        bwd_end[at(s, i)] = end;
                        bwd_out[at(s, i)] = arrival;
                    }
                    Pass::WeightGrad => {}
                }
                ranks[r].tasks.push(TaskRun {
                    task,
                    start_us: start,
                    end_us: end,
                    blocking_send_us: if work.overlap.p2p {
                        0.0
                    } else {
                        send_us.max(0.0)
                    },
                    gather_wait_us: waits.iter().map(|w| w.1).sum(),
                    gather_waits: waits,
                });
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

    for r in 0..p {
        ranks[r].compute_end_us = compute_free[r];
        reduce_gradients(work, r, &mut ranks[r], gathers_end[r]);
        account(work, &mut ranks[r]);
    }
    let critical_rank = (0..p)
        .max_by(|&a, &b| ranks[a].sync_end_us.total_cmp(&ranks[b].sync_end_us))
        .unwrap_or(0);
    let barrier = ranks[critical_rank].sync_end_us;
    // optimizer step after the barrier; the all-gather after it unless overlapped
    let mut last = (0.0f64, 0.0f64, 0.0f64); // (end, optimizer, exposed gather)
    for (r, rank) in ranks.iter_mut().enumerate() {
        let w = &work.ranks[r];
        let opt_end = barrier + w.optimizer_us;
        rank.optimizer = Some(Span {
            name: "optimizer step".into(),
            start_us: barrier,
            end_us: opt_end,
            blocking: true,
        });
        let gather = if work.overlap.param_gather {
            0.0
        } else {
            w.param_gather_us
        };
        if gather > 0.0 {
            rank.data_parallel.push(Span {
                name: "parameter all-gather".into(),
                start_us: opt_end,
                end_us: opt_end + gather,
                blocking: true,
            });
        }
        if opt_end + gather > last.0 {
            last = (opt_end + gather, w.optimizer_us, gather);
        }
    }
    let mut breakdown = ranks[critical_rank].spent;
    breakdown.optimizer += last.1;
    breakdown.dp_comm += last.2;
    Ok(Timeline {
        schedule: work.schedule,
        step_us: last.0.max(barrier),
        barrier_us: barrier,
        ranks,
        breakdown,
        critical_rank,
    })
}

fn send_span(pass: Pass, mb: usize, start: f64, us: f64, blocking: bool) -> Span {
    let what = match pass {
        Pass::Forward => "send activations",
        _ => "send gradients",
    };
    Span {
        name: format!("{what} mb {mb}"),
        start_us: start,
        end_us: start + us,
        blocking,
    }
}

/// Data-parallel buckets of one chunk in gradient order (head, last layer first, embedding):
/// element counts, Megatron's bucket size with a smaller last bucket.
fn chunk_buckets(chunk_params: u64, bucket: u64) -> Vec<u64> {
    let bucket = bucket.max(1);
    let mut out = vec![bucket; (chunk_params / bucket) as usize];
    if chunk_params % bucket > 0 {
        out.push(chunk_params % bucket);
    }
    out
}

fn chunk_params(work: &PipelineWork, stage: usize, pass: Pass) -> u64 {
    work.chunks[stage]
        .pass(pass)
        .segments
        .iter()
        .map(|s| s.params * s.repeat)
        .sum()
}

/// Starts every chunk's parameter all-gather at t = 0 on the data-parallel stream, first chunk
/// first, each chunk's buckets in forward order; returns per stage the time each bucket (in
/// gradient order) is ready, and per rank when its data-parallel stream is free again.
fn start_gathers(work: &PipelineWork, ranks: &mut [RankTimeline]) -> (Vec<Vec<f64>>, Vec<f64>) {
    let p = work.pp();
    let mut ready = vec![Vec::new(); work.chunks.len()];
    let mut free = vec![0.0; p];
    for (r, rank) in ranks.iter_mut().enumerate() {
        let w = &work.ranks[r];
        let mut t = 0.0;
        for s in (r..work.chunks.len()).step_by(p) {
            let buckets = chunk_buckets(chunk_params(work, s, Pass::Forward), w.bucket_elements);
            let mut times = vec![0.0; buckets.len()];
            for (k, &elements) in buckets.iter().enumerate().rev() {
                let us = w.param_gather_us * elements as f64 / w.params.max(1) as f64;
                rank.data_parallel.push(Span {
                    name: format!("parameter all-gather chunk {} bucket {k}", s / p),
                    start_us: t,
                    end_us: t + us,
                    blocking: false,
                });
                t += us;
                times[k] = t;
            }
            ready[s] = times;
        }
        free[r] = t;
    }
    (ready, free)
}

/// A first forward that needs each segment's weights gathered before it runs: returns its
/// end and, per repetition that waited (counted over all segments), how long.
fn gated_forward(
    work: &PipelineWork,
    stage: usize,
    start: f64,
    gates: &[f64],
) -> (f64, Vec<(u32, f64)>) {
    let chunk = &work.chunks[stage];
    let bucket = work.ranks[chunk.rank].bucket_elements.max(1);
    let total = chunk_params(work, stage, Pass::Forward);
    let (mut t, mut waits, mut seen, mut rep) = (start, Vec::new(), 0u64, 0u32);
    for seg in &chunk.fwd.segments {
        for _ in 0..seg.repeat {
            seen += seg.params;
            // gradient order runs backwards through the model: this repetition's parameters
            // start at offset total − seen, in the bucket gathered last of those it spans
            let gate = gates
                .get(((total - seen.min(total)) / bucket) as usize)
                .copied()
                .unwrap_or(0.0);
            if gate > t {
                waits.push((rep, gate - t));
                t = gate;
            }
            t += seg.us;
            rep += 1;
        }
    }
    (t, waits)
}

/// Reduces the rank's gradient buckets on its data-parallel stream (free from `dp_free`): each
/// chunk's as its last backward (weight-gradient pass when split) completes them with overlap,
/// else all after the rank's last pass.
fn reduce_gradients(work: &PipelineWork, r: usize, rank: &mut RankTimeline, dp_free: f64) {
    let w = &work.ranks[r];
    let grad_pass = if work.schedule.splits_backward() {
        Pass::WeightGrad
    } else {
        Pass::Backward
    };
    let mut buckets: Vec<(f64, f64, String)> = Vec::new(); // (ready, µs, name)
    if w.grad_sync_us > 0.0 {
        for s in (r..work.chunks.len()).step_by(work.pp()) {
            let Some(last) = rank
                .tasks
                .iter()
                .filter(|t| t.task.stage as usize == s && t.task.pass == grad_pass)
                .max_by(|a, b| a.end_us.total_cmp(&b.end_us))
            else {
                continue;
            };
            let sizes = chunk_buckets(chunk_params(work, s, grad_pass), w.bucket_elements);
            // walk the pass, noting when each bucket's last parameter is complete
            let mut t = last.start_us;
            let (mut seen, mut k, mut filled) = (0u64, 0usize, 0u64);
            for seg in &work.chunks[s].pass(grad_pass).segments {
                for _ in 0..seg.repeat {
                    t += seg.us;
                    seen += seg.params;
                    while k < sizes.len() && seen >= filled + sizes[k] {
                        filled += sizes[k];
                        let us = w.grad_sync_us * sizes[k] as f64 / w.params.max(1) as f64;
                        buckets.push((
                            t,
                            us,
                            format!("gradient reduce chunk {} bucket {k}", s / work.pp()),
                        ));
                        k += 1;
                    }
                }
            }
        }
    }
    let mut free = if work.overlap.grad_reduce {
        dp_free
    } else {
        dp_free.max(rank.compute_end_us)
    };
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    rank.sync_end_us = rank.compute_end_us;
    for (ready, us, name) in buckets {
        let start = free.max(ready);
        rank.data_parallel.push(Span {
            name,
            start_us: start,
            end_us: start + us,
            blocking: !work.overlap.grad_reduce,
        });
        free = start + us;
        rank.sync_end_us = rank.sync_end_us.max(free);
    }
}

/// How the rank spent [0, sync end]: its passes by class, blocking sends as pipeline
/// communication, waits for gathered weights and the exposed gradient reduction as data-parallel
/// communication, the rest as bubble.
fn account(work: &PipelineWork, rank: &mut RankTimeline) {
    let mut spent = Breakdown::default();
    let mut cursor = 0.0f64;
    for run in &rank.tasks {
        let send = run.blocking_send_us;
        spent.bubble += (run.start_us - cursor).max(0.0);
        let parts = work.chunks[run.task.stage as usize]
            .pass(run.task.pass)
            .parts;
        spent.compute += parts.compute;
        spent.tp_comm += parts.tp_comm;
        spent.pp_comm += parts.pp_comm + send;
        spent.dp_comm += parts.dp_comm + run.gather_wait_us;
        spent.optimizer += parts.optimizer;
        cursor = run.end_us + send;
    }
    spent.bubble += (rank.compute_end_us - cursor).max(0.0);
    spent.dp_comm += rank.sync_end_us - rank.compute_end_us;
    rank.spent = spent;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::predict::compose::ClassTimes;
    use crate::schedule::{ChunkWork, PassWork, RankWork, Segment, SegmentKind};
    use crate::workload::{Overlap, Schedule};

    /// Five equal layers holding `params` parameters in all.
    fn pass(us: f64, params: u64) -> PassWork {
        PassWork {
            segments: vec![Segment {
                kind: SegmentKind::Layer,
                repeat: 5,
                us: us / 5.0,
                recompute_us: 0.0,
                params: params / 5,
            }],
            parts: ClassTimes {
                compute: us,
                ..Default::default()
            },
            hidden_tp_us: 0.0,
        }
    }

    /// pp ranks × vpp chunks, a stage's forward `f`, input-gradient `b` and weight-gradient `w`
    /// split evenly over its chunks; `send` µs per transfer.
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
        let chunks = (0..n)
            .map(|k| ChunkWork {
                rank: k % p,
                first_layer: k as u64,
                fwd: pass(f / v as f64, 100),
                bwd: pass(
                    if split { b } else { b + w } / v as f64,
                    if split { 0 } else { 100 },
                ),
                wgrad: if split {
                    pass(w / v as f64, 100)
                } else {
                    PassWork::default()
                },
                send_fwd_us: if k + 1 < n { send } else { 0.0 },
                send_bwd_us: if k > 0 { send } else { 0.0 },
            })
            .collect();
        let ranks = (0..p)
            .map(|_| RankWork {
                grad_sync_us: 0.0,
                param_gather_us: 0.0,
                optimizer_us: 0.0,
                params: 100 * v as u64,
                bucket_elements: 40,
            })
            .collect();
        PipelineWork {
            schedule,
            micro_batches: m,
            chunks,
            ranks,
            overlap: Overlap {
                grad_reduce: false,
                param_gather: false,
                p2p: false,
                tp_fraction: 0.0,
            },
        }
    }

    fn ratio(schedule: Schedule, v: usize) -> f64 {
        simulate(&uniform(schedule, 8, v, 32, (1.0, 1.0, 1.0), 0.0))
            .unwrap()
            .bubble_ratio()
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
    }

    #[test]
    fn overlapped_gradient_reduction_hides_behind_the_last_backward() {
        let mut work = uniform(Schedule::OneFOneB, 2, 1, 4, (1.0, 1.0, 1.0), 0.0);
        for r in &mut work.ranks {
            r.grad_sync_us = 1.5;
        }
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
}

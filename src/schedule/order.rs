//! The order in which each pipeline rank runs its passes, per schedule. Every schedule here
//! is a fixed per-rank order (as the frameworks run them); the engine only times it.

use super::{Pass, Task};
use crate::workload::Schedule;

/// Per rank, the passes in the order the rank runs them. `ranks` = pp, `chunks` = model chunks
/// per rank (vpp), `micro_batches` per step; chunk c of rank r is virtual stage c·pp + r, but
/// under ZB-V, whose second chunk on rank r is virtual stage 2·pp − 1 − r.
pub fn orders(
    schedule: Schedule,
    ranks: usize,
    chunks: usize,
    micro_batches: usize,
) -> Vec<Vec<Task>> {
    if schedule == Schedule::ZbV {
        return zb_v(ranks, micro_batches, |_, _| 1.0);
    }
    (0..ranks)
        .map(|r| match schedule {
            Schedule::Gpipe => gpipe(r, micro_batches),
            Schedule::ClosedForm | Schedule::OneFOneB => one_f_one_b(r, ranks, micro_batches),
            Schedule::ZbH1 => zb_h1(r, ranks, micro_batches),
            Schedule::Interleaved => interleaved(r, ranks, chunks, micro_batches),
            Schedule::ZbV => unreachable!("built for all ranks at once above"),
        })
        .collect()
}

fn task(stage: usize, pass: Pass, micro_batch: usize) -> Task {
    Task {
        stage: stage as u32,
        pass,
        micro_batch: micro_batch as u32,
    }
}

/// All forwards, then all backwards, the last micro-batch first.
fn gpipe(r: usize, m: usize) -> Vec<Task> {
    (0..m)
        .map(|i| task(r, Pass::Forward, i))
        .chain((0..m).rev().map(|i| task(r, Pass::Backward, i)))
        .collect()
}

/// pp − r − 1 warm-up forwards, then forward/backward pairs, then the cool-down backwards.
fn one_f_one_b(r: usize, p: usize, m: usize) -> Vec<Task> {
    let warmup = (p - r - 1).min(m);
    let mut out: Vec<Task> = (0..warmup).map(|i| task(r, Pass::Forward, i)).collect();
    for j in 0..m - warmup {
        out.push(task(r, Pass::Forward, warmup + j));
        out.push(task(r, Pass::Backward, j));
    }
    out.extend((m - warmup..m).map(|j| task(r, Pass::Backward, j)));
    out
}

/// ZB-H1: 1F1B's forwards and input-gradient backwards (pp − r forwards in flight), with rank
/// r running each weight-gradient pass r micro-batches late. The late passes fill the bubbles
/// of the cool-down, so the bubble is (pp − 1)(F + B − W) instead of 1F1B's (pp − 1)(F + B + W)
/// (Qi et al. 2024), and rank r holds at most (pp − r) + r = pp micro-batches: the first
/// rank's 1F1B peak.
fn zb_h1(r: usize, p: usize, m: usize) -> Vec<Task> {
    let warmup = (p - r).min(m);
    let mut out: Vec<Task> = (0..warmup).map(|i| task(r, Pass::Forward, i)).collect();
    let mut next_w = 0;
    for j in 0..m {
        out.push(task(r, Pass::Backward, j));
        if warmup + j < m {
            out.push(task(r, Pass::Forward, warmup + j));
        }
        if j >= r {
            out.push(task(r, Pass::WeightGrad, next_w));
            next_w += 1;
        }
    }
    out.extend((next_w..m).map(|i| task(r, Pass::WeightGrad, i)));
    out
}

/// Megatron's interleaved 1F1B: micro-batches go through the chunks in groups of pp; the
/// warm-up is 2·(pp − r − 1) + (vpp − 1)·pp chunk-passes (all of them when m = pp).
fn interleaved(r: usize, p: usize, v: usize, m: usize) -> Vec<Task> {
    let total = m * v;
    let group = p * v;
    let chunk_fwd = |k: usize| (k % group) / p;
    let micro_batch = |k: usize| (k / group) * p + k % p;
    let fwd = |k: usize| task(chunk_fwd(k) * p + r, Pass::Forward, micro_batch(k));
    let bwd = |k: usize| {
        task(
            (v - 1 - chunk_fwd(k)) * p + r,
            Pass::Backward,
            micro_batch(k),
        )
    };
    let warmup = if m == p {
        total
    } else {
        (2 * (p - r - 1) + (v - 1) * p).min(total)
    };
    let mut out: Vec<Task> = (0..warmup).map(fwd).collect();
    for k in 0..total - warmup {
        out.push(fwd(warmup + k));
        out.push(bwd(k));
    }
    out.extend((total - warmup..total).map(bwd));
    out
}

/// ZB-V's order (Qi et al. 2024, §6), built the way the ZB paper's scheduler builds one: the
/// V's 2·pp stages simulated with each pass taking `cost(stage, pass)` (the engine's own
/// estimates; `orders` takes equal times), each rank starting, whenever it is free, the first
/// it can of — the input-gradient pass of its oldest ready micro-batch; a forward on its second
/// chunk; a forward on its first chunk while the activations it holds (from a forward to its
/// weight-gradient pass, a micro-batch taken in counted for both its chunks) stay within 2·pp
/// chunks', 1F1B's first rank's pp whole stages; a weight-gradient pass. The weight gradients
/// fill what would be bubbles, and no rank holds more than 1F1B's first. With equal passes the
/// step exceeds the ideal by the least any order allows (the pp − 1 chunk forwards before the
/// last rank starts) at pp 4, by one chunk pass more at pp 2 and four at pp 8 — the memory
/// bound's price. Not necessarily torchtitan's order, which PyTorch builds by hand.
pub fn zb_v(p: usize, m: usize, cost: impl Fn(usize, Pass) -> f64) -> Vec<Vec<Task>> {
    let mut v = VShape::new(p, m);
    // when each rank's running pass ends (∞: idle)
    let mut busy_until = vec![f64::INFINITY; p];
    // the ranks that may start a pass now: at first all; then those whose own pass ended or
    // whose neighbour's did (a pass waits only on the stages beside its own, which run on the
    // rank itself or the ranks beside it)
    let mut woken = vec![true; p];
    let mut t = 0.0;
    loop {
        for r in 0..p {
            if woken[r] && busy_until[r].is_infinite() {
                if let Some(end) = v.start(r, t, &cost) {
                    busy_until[r] = end;
                }
            }
            woken[r] = false;
        }
        // on to the next pass's end: its rank and the ranks beside it wake
        t = busy_until.iter().copied().fold(f64::INFINITY, f64::min);
        if t.is_infinite() {
            break;
        }
        for r in 0..p {
            if busy_until[r] <= t {
                busy_until[r] = f64::INFINITY;
                woken[r.saturating_sub(1)..(r + 2).min(p)].fill(true);
            }
        }
    }
    // every rank idle and none able to start: cannot happen before the last pass (each
    // micro-batch a rank took in can always finish); the engine reports an incomplete order
    debug_assert_eq!(v.left, 0, "the ZB-V order stalled at {t}");
    v.out
}

/// The state of ZB-V's V while its order is built.
struct VShape {
    p: usize,
    m: usize,
    /// Per stage and micro-batch (at s·m + i), when its forward / input gradient ends (∞: not
    /// started).
    fwd_end: Vec<f64>,
    bwd_end: Vec<f64>,
    /// Per stage, the next micro-batch of each pass (every stage takes them in order).
    next_f: Vec<usize>,
    next_b: Vec<usize>,
    next_w: Vec<usize>,
    /// Per rank, chunk activations held: forward run, weight gradient not yet.
    held: Vec<usize>,
    out: Vec<Vec<Task>>,
    /// Passes not yet placed.
    left: usize,
}

impl VShape {
    fn new(p: usize, m: usize) -> VShape {
        let n = 2 * p;
        VShape {
            p,
            m,
            fwd_end: vec![f64::INFINITY; n * m],
            bwd_end: vec![f64::INFINITY; n * m],
            next_f: vec![0; n],
            next_b: vec![0; n],
            next_w: vec![0; n],
            held: vec![0; p],
            out: vec![Vec::with_capacity(6 * m); p],
            left: 3 * n * m,
        }
    }

    /// Starts on rank `r` at `t` the first pass it can (see `zb_v`); returns when it ends.
    fn start(&mut self, r: usize, t: f64, cost: &impl Fn(usize, Pass) -> f64) -> Option<f64> {
        let (n, m) = (2 * self.p, self.m);
        let (first, second) = (r, n - 1 - r);
        let ended = |end: f64| end <= t;
        let input_gradient = [second, first]
            .into_iter()
            .filter(|&s| {
                let i = self.next_b[s];
                i < m
                    && ended(self.fwd_end[s * m + i])
                    && (s + 1 == n || ended(self.bwd_end[(s + 1) * m + i]))
            })
            .min_by_key(|&s| self.next_b[s]);
        let forward = |s: usize| {
            let i = self.next_f[s];
            i < m && (s == 0 || ended(self.fwd_end[(s - 1) * m + i]))
        };
        // room for a micro-batch on both chunks, those on the first but not yet the second
        // counted for both
        let room = self.held[r] + (self.next_f[first] - self.next_f[second]) + 2 <= n;
        let weight_gradient = [second, first]
            .into_iter()
            .filter(|&s| {
                self.next_w[s] < self.next_b[s] && ended(self.bwd_end[s * m + self.next_w[s]])
            })
            .min_by_key(|&s| self.next_w[s]);
        let (s, pass) = if let Some(s) = input_gradient {
            (s, Pass::Backward)
        } else if forward(second) {
            (second, Pass::Forward)
        } else if forward(first) && room {
            (first, Pass::Forward)
        } else if let Some(s) = weight_gradient {
            (s, Pass::WeightGrad)
        } else {
            return None;
        };
        let end = t + cost(s, pass).max(0.0);
        let next = match pass {
            Pass::Forward => {
                self.held[r] += 1;
                self.fwd_end[s * m + self.next_f[s]] = end;
                &mut self.next_f[s]
            }
            Pass::Backward => {
                self.bwd_end[s * m + self.next_b[s]] = end;
                &mut self.next_b[s]
            }
            Pass::WeightGrad => {
                self.held[r] -= 1;
                &mut self.next_w[s]
            }
        };
        self.out[r].push(task(s, pass, *next));
        *next += 1;
        self.left -= 1;
        Some(end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn names(tasks: &[Task]) -> String {
        tasks
            .iter()
            .map(|t| {
                let p = match t.pass {
                    Pass::Forward => "F",
                    Pass::Backward => "B",
                    Pass::WeightGrad => "W",
                };
                format!("{p}{}", t.micro_batch)
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// `names` with each pass's virtual stage: "F0s2" is micro-batch 0's forward on stage 2.
    fn staged(tasks: &[Task]) -> String {
        let with_stage: Vec<String> = tasks
            .iter()
            .zip(names(tasks).split(' '))
            .map(|(t, name)| format!("{name}s{}", t.stage))
            .collect();
        with_stage.join(" ")
    }

    #[test]
    fn one_f_one_b_warms_up_pp_minus_rank_minus_one() {
        let o = orders(Schedule::OneFOneB, 4, 1, 6);
        assert_eq!(names(&o[0]), "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
        assert_eq!(names(&o[3]), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
    }

    #[test]
    fn zb_h1_delays_weight_gradients_by_the_rank() {
        let o = orders(Schedule::ZbH1, 4, 1, 6);
        assert_eq!(
            names(&o[0]),
            "F0 F1 F2 F3 B0 F4 W0 B1 F5 W1 B2 W2 B3 W3 B4 W4 B5 W5"
        );
        assert_eq!(
            names(&o[3]),
            "F0 B0 F1 B1 F2 B2 F3 B3 F4 W0 B4 F5 W1 B5 W2 W3 W4 W5"
        );
    }

    #[test]
    fn interleaved_follows_megatron_chunk_order() {
        // pp 2, vpp 2, m 4: rank 0 warms up 2·1 + 1·2 = 4 chunk-passes
        let o = orders(Schedule::Interleaved, 2, 2, 4);
        assert_eq!(
            staged(&o[0]),
            "F0s0 F1s0 F0s2 F1s2 F2s0 B0s2 F3s0 B1s2 F2s2 B0s0 F3s2 B1s0 B2s2 B3s2 B2s0 B3s0"
        );
    }

    /// ZB-V on pp 2: rank 0 runs stages 0 and 3, rank 1 stages 1 and 2 (back to back, no
    /// transfer between them); rank 0 takes in two micro-batches (4 chunks' activations, 1F1B's
    /// first rank) before the first comes back to it, every input gradient runs as soon as it
    /// is ready and the weight gradients run where a rank would otherwise wait.
    #[test]
    fn zb_v_runs_the_v_and_fills_waits_with_weight_gradients() {
        let o = orders(Schedule::ZbV, 2, 2, 4);
        assert_eq!(
            staged(&o[0]),
            "F0s0 F1s0 F0s3 B0s3 F1s3 B1s3 B0s0 W0s3 B1s0 W0s0 F2s0 W1s3 W1s0 F2s3 B2s3 F3s0 \
             W2s3 B2s0 W2s0 F3s3 B3s3 W3s3 B3s0 W3s0"
        );
        assert_eq!(
            staged(&o[1]),
            "F0s1 F0s2 F1s1 F1s2 B0s2 B0s1 B1s2 B1s1 W0s2 W0s1 W1s2 F2s1 F2s2 W1s1 B2s2 B2s1 \
             F3s1 F3s2 W2s2 W2s1 B3s2 B3s1 W3s2 W3s1"
        );
    }

    proptest! {
        #[test]
        fn every_pass_runs_once_and_after_its_forward(
            p in 1usize..9, v in 1usize..5, groups in 1usize..5,
            schedule in prop::sample::select(vec![Schedule::Gpipe, Schedule::OneFOneB, Schedule::ZbH1, Schedule::Interleaved, Schedule::ZbV]),
        ) {
            let v = match schedule {
                Schedule::Interleaved => v,
                Schedule::ZbV => 2,
                _ => 1,
            };
            let m = groups * p;
            let o = orders(schedule, p, v, m);
            let passes = if schedule.splits_backward() { 3 } else { 2 };
            for (r, tasks) in o.iter().enumerate() {
                prop_assert_eq!(tasks.len(), m * v * passes);
                let mut seen = std::collections::HashSet::new();
                // ZB-V: activations held from a forward to its weight gradient, in chunks
                let mut held = 0usize;
                for t in tasks {
                    let s = t.stage as usize;
                    let rank = if schedule == Schedule::ZbV && s >= p { 2 * p - 1 - s } else { s % p };
                    prop_assert_eq!(rank, r);
                    match t.pass {
                        Pass::Forward => held += 1,
                        Pass::WeightGrad => held -= 1,
                        Pass::Backward => {}
                    }
                    if schedule == Schedule::ZbV {
                        prop_assert!(held <= 2 * p, "rank {} holds {} chunks", r, held);
                    }
                    prop_assert!(seen.insert(*t), "{:?} twice", t);
                    if t.pass != Pass::Forward {
                        let f = Task { pass: Pass::Forward, ..*t };
                        prop_assert!(seen.contains(&f), "{:?} before its forward", t);
                    }
                    if t.pass == Pass::WeightGrad {
                        let b = Task { pass: Pass::Backward, ..*t };
                        prop_assert!(seen.contains(&b));
                    }
                }
            }
        }
    }

    proptest! {
        /// Whatever the passes cost — zero included — and however few micro-batches, ZB-V's
        /// order runs every pass of both chunks of every rank once and never stalls (a stall
        /// is a debug assertion in `zb_v`).
        #[test]
        fn zb_v_finishes_at_any_costs(
            p in 1usize..9, m in 1usize..20,
            costs in prop::collection::vec(0.0f64..5.0, 48),
        ) {
            let cost = |s: usize, pass: Pass| costs[(3 * s + pass as usize) % costs.len()];
            let o = zb_v(p, m, cost);
            for (r, tasks) in o.iter().enumerate() {
                prop_assert_eq!(tasks.len(), 6 * m, "rank {}", r);
                let unique: std::collections::HashSet<_> = tasks.iter().collect();
                prop_assert_eq!(unique.len(), 6 * m);
            }
        }
    }

    #[test]
    fn gpipe_runs_every_forward_then_the_backwards_last_first() {
        let o = orders(Schedule::Gpipe, 2, 1, 3);
        for rank in &o {
            assert_eq!(names(rank), "F0 F1 F2 B2 B1 B0");
        }
        assert_eq!(o[1][0].stage, 1);
    }

    /// Fewer micro-batches than ranks: a rank's warm-up is capped at the micro-batches there
    /// are, so the first ranks run every forward before a backward (the property test only
    /// draws m ≥ pp).
    #[test]
    fn one_f_one_b_with_fewer_micro_batches_than_ranks_warms_up_all_of_them() {
        let o = orders(Schedule::OneFOneB, 4, 1, 2);
        assert_eq!(names(&o[0]), "F0 F1 B0 B1");
        assert_eq!(names(&o[2]), "F0 F1 B0 B1");
        assert_eq!(names(&o[3]), "F0 B0 F1 B1");
        let zb = orders(Schedule::ZbH1, 4, 1, 2);
        assert_eq!(names(&zb[0]), "F0 F1 B0 W0 B1 W1");
        assert_eq!(names(&zb[3]), "F0 B0 F1 B1 W0 W1");
    }

    /// As many micro-batches as ranks: Megatron warms up every chunk-pass on every rank
    /// (`all_warmup_microbatches`), the last rank too, where the general rule warms up 2.
    #[test]
    fn interleaved_with_one_micro_batch_per_rank_runs_every_forward_first() {
        let o = orders(Schedule::Interleaved, 2, 2, 2);
        assert_eq!(staged(&o[0]), "F0s0 F1s0 F0s2 F1s2 B0s2 B1s2 B0s0 B1s0");
        assert_eq!(staged(&o[1]), "F0s1 F1s1 F0s3 F1s3 B0s3 B1s3 B0s1 B1s1");
    }
}

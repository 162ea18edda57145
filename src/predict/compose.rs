//! Costing lists of calls and the paper's closed-form 1F1B step (Zhang et al. 2025, §III-D;
//! `docs/method.md` §4):
//!
//! ```text
//! step = (micro_batches − 1 + stages) · (max_s fwd_s + max_s bwd_s)
//!      + gradient sync of the first stage           (the others hide behind the backward)
//!      + max_s (optimizer_s + parameter all-gather_s)
//! ```
//!
//! `fwd_s` and `bwd_s` are one micro-batch's forward and backward on stage s, pipeline
//! send/recv included. The pipeline part is split into compute, TP and PP communication of the
//! slowest stages, run `micro_batches` times, and the bubble, `(stages − 1)` more slots.

use serde::Serialize;

use crate::hardware::Runtime;
use crate::ops::{OpKind, Role};
use crate::plan::{Call, Issue, Plan, QueryId};
use crate::timing::{Attribution, Breakdown, Class, ClassTimes};

/// What each of a plan's queries costs inside a step, and which cost factor (model) it counts
/// toward.
#[derive(Debug, Clone)]
pub struct QueryTimes {
    /// µs of one call of each query in a step: the isolated estimate, its arithmetic share
    /// slowed by the runtime's in-situ efficiency (collectives not at all), a FlashAttention-2
    /// call's whole time by its efficiency for them.
    pub us: Vec<f64>,
    /// Kernels one call of each query launches (a GEMM's backward is two).
    pub kernels: Vec<f64>,
    /// Each query's operator kind.
    pub ops: Vec<OpKind>,
    /// Ranks of each collective query (0 for kernels).
    pub ranks: Vec<f64>,
    /// The cost factor of each query.
    pub factor: Vec<u32>,
    /// How many factors there are.
    pub factors: usize,
    /// Whether costs keep their attribution to factors (the interval needs it, a search not).
    pub attribute: bool,
    /// The host, contention and per-step physics the step is composed under.
    pub runtime: Runtime,
}

impl QueryTimes {
    /// Times of `plan`'s queries from their isolated estimates `isolated_us` under `runtime`.
    pub fn new(
        plan: &Plan,
        isolated_us: &[f64],
        factor: Vec<u32>,
        factors: usize,
        attribute: bool,
        runtime: Runtime,
    ) -> QueryTimes {
        // sustained clocks slow a kernel's arithmetic, not its wait on HBM; FlashAttention-2
        // calls run at the runtime's efficiency for them besides
        let us = plan
            .compute_share
            .iter()
            .zip(isolated_us)
            .zip(&plan.queries)
            .map(|((&share, &t), q)| {
                let in_situ = t * (1.0 + share * (1.0 / runtime.in_situ_efficiency - 1.0));
                if q.role == Some(Role::FlashAttention2) {
                    in_situ / runtime.flash_attention_2_efficiency
                } else {
                    in_situ
                }
            })
            .collect();
        QueryTimes {
            us,
            kernels: plan.queries.iter().map(kernels_per_call).collect(),
            ops: plan.queries.iter().map(|q| q.op).collect(),
            ranks: plan
                .queries
                .iter()
                .map(|q| q.shape.collective().map_or(0.0, |c| c.ranks() as f64))
                .collect(),
            factor,
            factors,
            attribute,
            runtime,
        }
    }

    /// µs of one call of query `q`.
    pub fn of(&self, q: QueryId) -> f64 {
        self.us[q as usize]
    }
}

/// Kernels one call launches: a GEMM's backward runs two GEMMs (the gradients of both
/// operands), everything else one kernel.
fn kernels_per_call(q: &crate::ops::OpQuery) -> f64 {
    use crate::ops::Phase;
    if q.op == OpKind::Gemm && q.phase == Phase::Bwd {
        2.0
    } else {
        1.0
    }
}

/// What a list of calls costs, run one after another.
#[derive(Debug, Clone, Default)]
pub struct Cost {
    /// Exposed time by class.
    pub parts: ClassTimes,
    /// Tensor-parallel communication hidden behind compute.
    pub hidden_tp_us: f64,
    /// Host time to issue the calls' kernels.
    pub issue_us: f64,
    /// Where the exposed microseconds come from.
    pub attribution: Attribution,
    /// Each call's host and device time in order, kept only where the host waits for the
    /// device inside the list (empty otherwise: then only the sums matter).
    pub lanes: Vec<Lane>,
}

/// One call's time on the two lanes of a rank, for following them kernel by kernel.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lane {
    /// Host time to issue its kernels, µs.
    pub host_us: f64,
    /// Exposed device time on the compute stream, µs.
    pub device_us: f64,
    /// Kernels (and collectives) it issues: the device starts each as it is issued.
    pub kernels: f64,
    /// The host waits for the device to finish everything before it (`Call::host_waits`).
    pub waits: bool,
}

/// How long a run of repeated call sequences `lanes` takes per repetition, µs, when the host
/// waits for the device at each `waits` call: between two waits the device starts empty, so
/// it idles while the host issues the first kernels and each kernel starts only once issued
/// (a call of n kernels, each issued in h and run in d, ends at the latest of the device's
/// previous work + n·d, the first issue + n·d, and the last issue + d). `None` without a wait.
pub fn cycle_us(lanes: &[Lane]) -> Option<f64> {
    let first = lanes.iter().position(|l| l.waits)?;
    let (mut host, mut device) = (0.0_f64, 0.0_f64);
    for (i, l) in lanes[first..].iter().chain(&lanes[..first]).enumerate() {
        if l.waits && i > 0 {
            host = host.max(device);
            device = host;
        }
        let n = l.kernels.max(1.0);
        let (h, d) = (l.host_us / n, l.device_us / n);
        device = (device + l.device_us)
            .max(host + h + l.device_us)
            .max(host + l.host_us + d);
        host += l.host_us;
    }
    Some(host.max(device))
}

/// The cost of `share(call)` (0–1) of each call, each run as many times as its count and
/// multiplicity say. Calls marked `overlapped` run beside the compute and only their excess over
/// it counts (as data-parallel time, or expert-parallel for overlapped all-to-alls). A
/// tensor-parallel collective started beside a GEMM kernel hides behind it, and with
/// `tp_overlap` each sequence-parallel collective is pipelined with its GEMM (see
/// `tp_hidden`). A context-parallel ring exchange hides behind the attention step it runs
/// beside (the flash-attention call before it in the list: the ring steps and the exchanges
/// have the same count). Compute that shares the GPU with a collective
/// runs `runtime.contention` times slower for as long as they overlap.
pub fn cost<'a>(
    calls: impl Iterator<Item = (&'a Call, f64)>,
    times: &QueryTimes,
    share: &dyn Fn(&Call) -> f64,
    tp_overlap: bool,
) -> Cost {
    cost_keeping_lanes(calls, times, share, tp_overlap, false)
}

/// `cost`, keeping each call's `lanes` also where none of these calls waits (`keep`): for a
/// list that runs between waits in another.
pub fn cost_keeping_lanes<'a>(
    calls: impl Iterator<Item = (&'a Call, f64)>,
    times: &QueryTimes,
    share: &dyn Fn(&Call) -> f64,
    tp_overlap: bool,
    keep: bool,
) -> Cost {
    let calls: Vec<(&Call, f64)> = calls.collect();
    // the hot path (no TP overlap, nothing beside a kernel) allocates nothing more
    let tp_hidden_of = (tp_overlap || calls.iter().any(|(c, _)| c.beside_kernel))
        .then(|| tp_hidden(&calls, times, share, tp_overlap));
    // the latest flash-attention call's time: what a context-parallel exchange runs beside
    let mut last_attention = 0.0;
    let mut parts = ClassTimes::default();
    // collectives beside the compute: all of them, and the expert all-to-alls among them
    let (mut beside, mut beside_ep) = (0.0, 0.0);
    // communication hidden behind compute: all of it, and the tensor-parallel part
    let (mut hidden, mut hidden_tp) = (0.0, 0.0);
    let (mut a_compute, mut a_beside, mut a_other) = (
        Attribution::default(),
        Attribution::default(),
        Attribution::default(),
    );
    let mut issue_us = 0.0;
    let follow_lanes = keep || calls.iter().any(|(c, _)| c.host_waits);
    let mut lanes = Vec::new();
    for (i, &(call, n)) in calls.iter().enumerate() {
        let runs = call.count * n * share(call);
        let t = times.of(call.query) * runs;
        let op = times.ops[call.query as usize];
        let mut hid = tp_hidden_of.as_ref().map_or(0.0, |h| h[i]);
        hidden_tp += hid;
        if call.class == Class::Compute && op == OpKind::FlashAttention {
            last_attention = t;
        } else if call.class == Class::CpComm && !call.overlapped && op == OpKind::SendRecv {
            hid = t.min(last_attention);
        }
        let calls_made = times.kernels[call.query as usize] * runs;
        let launch = if op.is_collective() {
            times.runtime.collective_launch_us
        } else {
            times.runtime.launch_us
        };
        // a captured part costs the host one graph launch per run, as one eager operator
        let host_us = match call.issue {
            Issue::Eager => calls_made * launch,
            Issue::GraphLaunch => runs * times.runtime.launch_us,
            Issue::InGraph => 0.0,
        };
        issue_us += host_us;
        if follow_lanes {
            lanes.push(Lane {
                host_us,
                device_us: if call.overlapped { 0.0 } else { t - hid },
                kernels: calls_made,
                waits: call.host_waits,
            });
        }
        let exposed = if t > 0.0 { 1.0 - hid / t } else { 1.0 };
        if call.overlapped {
            beside += t;
            if call.class == Class::EpComm {
                beside_ep += t;
            }
        } else {
            parts.add(call.class, t - hid);
            hidden += hid;
        }
        if times.attribute {
            let f = times.factor[call.query as usize];
            match (call.overlapped, call.class) {
                (true, _) => a_beside.add(f, t),
                (false, Class::Compute) => a_compute.add(f, t),
                (false, _) => a_other.add(f, t * exposed),
            }
        }
    }
    // compute that shares the GPU with a collective beside it runs slower
    let shared = (hidden + beside).min(parts.compute);
    let slowdown = (times.runtime.contention - 1.0) * shared;
    parts.compute += slowdown;
    if times.attribute {
        a_compute.scale(parts.compute / (parts.compute - slowdown).max(f64::MIN_POSITIVE));
    }
    // what the compute cannot cover stays exposed, in proportion to what ran beside it
    let excess = (beside - parts.compute).max(0.0);
    let ep_share = if beside > 0.0 {
        beside_ep / beside
    } else {
        0.0
    };
    parts.ep_comm += excess * ep_share;
    parts.dp_comm += excess * (1.0 - ep_share);
    if times.attribute {
        a_other.add_scaled(if excess > 0.0 { &a_beside } else { &a_compute }, 1.0);
    }
    Cost {
        parts,
        hidden_tp_us: hidden_tp,
        issue_us,
        attribution: a_other,
        lanes,
    }
}

/// How much of each tensor-parallel collective hides behind a GEMM.
///
/// Always: a collective the backward starts asynchronously beside one kernel of the GEMM that
/// follows it (`Call::beside_kernel`: the column-parallel GEMM's input re-gather beside its
/// data-gradient kernel, the input gradient's reduce-scatter or all-reduce beside its
/// weight-gradient kernel) hides up to that kernel's time: hidden = min(comm, kernel). A
/// split backward (ZB-H1) keeps the collectives in its input-gradient pass, whose GEMMs run
/// one kernel each: they hide behind that one as much as unsplit.
///
/// With `tp_overlap` also the blocking ones, as Transformer Engine pipelines them
/// (userbuffers): the forward all-gather before a column-parallel GEMM (QKV, MLP up) is
/// exchanged chunk by chunk around the tp ranks while the GEMM of the chunk already there
/// runs; the reduce-scatter after a row-parallel GEMM (attention out, MLP down) sends each
/// chunk as soon as its GEMM is done; in the backward, the row-parallel GEMM's output-gradient
/// all-gather pipelines with its data-gradient kernel. Of a collective over n ranks, at most
/// the (n − 1)/n of the kernel that runs while chunks move can hide it: hidden = min(comm,
/// kernel · (n − 1)/n) (Transformer Engine's `*_dgrad` / `*_wgrad` overlap slots,
/// `transformer_engine/pytorch/module/layernorm_linear.py`). A blocking all-reduce (no
/// sequence parallelism) is not pipelined.
///
/// A call list runs in forward order in both passes (`plan::layer`): a layer's collectives
/// sit after its row-parallel GEMM, before the column-parallel one (the next layer's first,
/// past the list's end).
fn tp_hidden(
    calls: &[(&Call, f64)],
    times: &QueryTimes,
    share: &dyn Fn(&Call) -> f64,
    tp_overlap: bool,
) -> Vec<f64> {
    let t = |i: usize| {
        let (c, n) = calls[i];
        times.of(c.query) * c.count * n * share(c)
    };
    let op = |i: usize| times.ops[calls[i].0.query as usize];
    let launches = |i: usize| times.kernels[calls[i].0.query as usize];
    let is_gemm = |i: usize| calls[i].0.class == Class::Compute && op(i) == OpKind::Gemm;
    let gemms: Vec<usize> = (0..calls.len()).filter(|&i| is_gemm(i)).collect();
    let next_gemm = |i: usize| gemms.iter().find(|&&g| g > i).or(gemms.first()).copied();
    let previous_gemm = |i: usize| gemms.iter().rev().find(|&&g| g < i).copied();
    // one of the kernels a GEMM call runs in this share of it: a backward call is its data-
    // and weight-gradient kernels, of which a split backward's passes run one each
    let kernel = |g: usize| t(g) / (launches(g) * share(calls[g].0)).max(1.0);
    let mut out = vec![0.0; calls.len()];
    for (i, &(call, _)) in calls.iter().enumerate() {
        let ranks = times.ranks[call.query as usize];
        if call.class != Class::TpComm || call.overlapped || ranks <= 1.0 {
            continue;
        }
        if call.beside_kernel {
            if let Some(g) = next_gemm(i) {
                out[i] = t(i).min(kernel(g));
            }
            continue;
        }
        if !tp_overlap {
            continue;
        }
        let partner = match op(i) {
            // the backward's all-gather brings the output gradient of the GEMM before it
            OpKind::AllGather => match previous_gemm(i) {
                Some(g) if launches(g) > 1.0 => Some(g),
                _ => next_gemm(i),
            },
            OpKind::ReduceScatter => previous_gemm(i),
            _ => None,
        };
        if let Some(g) = partner {
            out[i] = t(i).min(kernel(g) * (ranks - 1.0) / ranks);
        }
    }
    out
}

/// All of every call.
pub fn whole(_: &Call) -> f64 {
    1.0
}

/// One stage's times: a micro-batch's forward and backward, and the per-step work.
#[derive(Debug, Clone, Serialize)]
pub struct StageTiming {
    /// Pipeline rank.
    pub index: usize,
    /// One micro-batch, µs.
    pub fwd_us: f64,
    /// One micro-batch's backward, µs.
    pub bwd_us: f64,
    /// The forward by class.
    pub fwd_parts: ClassTimes,
    /// The backward by class.
    pub bwd_parts: ClassTimes,
    /// Per step, µs.
    pub grad_sync_us: f64,
    /// Optimizer step per step, µs.
    pub optimizer_us: f64,
    /// Parameter all-gather per step, µs.
    pub param_gather_us: f64,
    /// Where the forward's, backward's, gradient reduction's and update's µs come from.
    #[serde(skip)]
    pub(super) attribution: [Attribution; 4],
}

/// A composed step.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    /// The step, µs.
    pub step_us: f64,
    /// What it spends its time on, µs.
    pub breakdown_us: Breakdown,
    /// Per pipeline rank, its times.
    pub stages: Vec<StageTiming>,
    /// Per cost factor, its µs on the step's critical path (when attributed).
    #[serde(skip)]
    pub critical_path: Option<Vec<f64>>,
}

/// The closed-form step time with cost factor `factor` scaled by `k` in every stage.
pub fn one_f_one_b_moved(stages: &[StageTiming], micro_batches: u64, factor: u32, k: f64) -> f64 {
    let d = k - 1.0;
    let moved = |s: &StageTiming, i: usize, us: f64| us + d * s.attribution[i].of(factor);
    let slowest =
        |f: &dyn Fn(&StageTiming) -> f64| stages.iter().map(f).fold(f64::NEG_INFINITY, f64::max);
    let fwd = slowest(&|s| moved(s, 0, s.fwd_us));
    let bwd = slowest(&|s| moved(s, 1, s.bwd_us));
    let update = slowest(&|s| moved(s, 3, s.optimizer_us + s.param_gather_us));
    let first_sync = moved(&stages[0], 2, stages[0].grad_sync_us);
    let (m, pp) = (micro_batches as f64, stages.len() as f64);
    (m - 1.0 + pp) * (fwd + bwd) + first_sync + update
}

/// The paper's 1F1B step from each stage's times (`pipeline::stage_timings`).
pub fn one_f_one_b(stages: Vec<StageTiming>, micro_batches: u64, times: &QueryTimes) -> Step {
    let slowest = |f: &dyn Fn(&StageTiming) -> f64| {
        stages
            .iter()
            .max_by(|a, b| f(a).total_cmp(&f(b)))
            .expect("at least one stage")
    };
    let f = slowest(&|s| s.fwd_us);
    let b = slowest(&|s| s.bwd_us);
    let slot = f.fwd_us + b.bwd_us;
    let m = micro_batches as f64;
    let pp = stages.len() as f64;
    let work = f.fwd_parts.scaled(m);
    let work_b = b.bwd_parts.scaled(m);
    let first_sync = stages[0].grad_sync_us;
    let update = slowest(&|s| s.optimizer_us + s.param_gather_us);
    let breakdown = Breakdown {
        compute: work.compute + work_b.compute,
        tp_comm: work.tp_comm + work_b.tp_comm,
        cp_comm: work.cp_comm + work_b.cp_comm,
        ep_comm: work.ep_comm + work_b.ep_comm,
        pp_comm: work.pp_comm + work_b.pp_comm,
        dp_comm: work.dp_comm + work_b.dp_comm + first_sync + update.param_gather_us,
        optimizer: work.optimizer + work_b.optimizer + update.optimizer_us,
        bubble: (pp - 1.0) * slot,
        host: work.host + work_b.host,
    };
    let critical_path = times.attribute.then(|| {
        let mut out = vec![0.0; times.factors];
        f.attribution[0].accumulate(&mut out, m - 1.0 + pp);
        b.attribution[1].accumulate(&mut out, m - 1.0 + pp);
        stages[0].attribution[2].accumulate(&mut out, 1.0);
        update.attribution[3].accumulate(&mut out, 1.0);
        out
    });
    Step {
        step_us: (m - 1.0 + pp) * slot + first_sync + update.optimizer_us + update.param_gather_us,
        breakdown_us: breakdown,
        critical_path,
        stages,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Query 0: a forward GEMM, 1: the same GEMM's backward (two kernels), 2: a reduce-scatter
    /// over 4 ranks; each call takes `us[q]`.
    fn times(us: [f64; 3]) -> QueryTimes {
        times_of(us, OpKind::ReduceScatter)
    }

    /// As `times`, query 2 a `collective` over 4 ranks.
    fn times_of(us: [f64; 3], collective: OpKind) -> QueryTimes {
        let mut t = times_with(&[
            (OpKind::Gemm, us[0]),
            (OpKind::Gemm, us[1]),
            (collective, us[2]),
        ]);
        t.kernels[1] = 2.0;
        t
    }

    /// Queries of these kinds, each call taking its µs in one kernel; collectives over 4 ranks.
    fn times_with(queries: &[(OpKind, f64)]) -> QueryTimes {
        let n = queries.len();
        QueryTimes {
            us: queries.iter().map(|q| q.1).collect(),
            kernels: vec![1.0; n],
            ops: queries.iter().map(|q| q.0).collect(),
            ranks: queries
                .iter()
                .map(|q| if q.0.is_collective() { 4.0 } else { 0.0 })
                .collect(),
            factor: vec![0; n],
            factors: 1,
            attribute: false,
            runtime: Runtime::isolated(),
        }
    }

    fn call(query: QueryId, class: Class) -> Call {
        Call {
            label: "test",
            query,
            count: 1.0,
            class,
            overlapped: false,
            beside_kernel: false,
            host_waits: false,
            issue: crate::plan::Issue::Eager,
        }
    }

    /// Eager calls cost the host each kernel's launch (a collective's own); a CUDA graph
    /// costs one launch per run of its first call, whatever it captures, and nothing after.
    #[test]
    fn a_graph_costs_the_host_one_launch_per_run() {
        let mut t = times([100.0, 300.0, 50.0]);
        t.runtime.launch_us = 10.0;
        t.runtime.collective_launch_us = 40.0;
        let gemm = |issue| Call {
            count: 3.0,
            issue,
            ..call(0, Class::Compute)
        };
        let backward = |issue| Call {
            issue,
            ..call(1, Class::Compute)
        };
        let rs = |issue| Call {
            issue,
            ..call(2, Class::TpComm)
        };
        let issue =
            |calls: &[Call]| cost(calls.iter().map(|c| (c, 1.0)), &t, &whole, false).issue_us;
        // 3 GEMMs + 2 backward kernels at 10 µs, a collective at 40 µs
        let eager = [gemm(Issue::Eager), backward(Issue::Eager), rs(Issue::Eager)];
        assert_eq!(issue(&eager), 30.0 + 20.0 + 40.0);
        // one graph from the GEMMs on: launched per run of its first call (3 of them)
        let graphed = [
            gemm(Issue::GraphLaunch),
            backward(Issue::InGraph),
            rs(Issue::InGraph),
        ];
        assert_eq!(issue(&graphed), 30.0);
        let graphed = [
            backward(Issue::GraphLaunch),
            rs(Issue::InGraph),
            gemm(Issue::Eager),
        ];
        assert_eq!(issue(&graphed), 10.0 + 30.0);
        // the device's time is the same either way
        let device = |calls: &[Call]| {
            cost(calls.iter().map(|c| (c, 1.0)), &t, &whole, false)
                .parts
                .total()
        };
        assert_eq!(device(&eager), device(&graphed));
    }

    #[test]
    fn a_backward_collective_pipelines_with_one_of_its_two_gemms() {
        let t = times([1000.0, 1000.0, 600.0]);
        let rs = call(2, Class::TpComm);
        let exposed = |gemm: QueryId| {
            let g = call(gemm, Class::Compute);
            cost([(&g, 1.0), (&rs, 1.0)].into_iter(), &t, &whole, true)
                .parts
                .tp_comm
        };
        // forward: 3/4 of the 1000 µs GEMM hides the 600 µs reduce-scatter
        assert_eq!(exposed(0), 0.0);
        // backward: only the 500 µs data-gradient kernel runs while chunks move
        assert!((exposed(1) - (600.0 - 500.0 * 0.75)).abs() < 1e-9);
        // without the overlap nothing hides
        let g = call(1, Class::Compute);
        let plain = cost([(&g, 1.0), (&rs, 1.0)].into_iter(), &t, &whole, false);
        assert_eq!(plain.parts.tp_comm, 600.0);
    }

    #[test]
    fn a_collective_started_beside_a_kernel_hides_behind_it_without_tp_overlap() {
        let t = times([1000.0, 1000.0, 600.0]);
        let mut rs = call(2, Class::TpComm);
        rs.beside_kernel = true;
        let g = call(1, Class::Compute);
        // one 500 µs kernel of the backward GEMM after it hides 500 of its 600 µs
        let before = cost([(&rs, 1.0), (&g, 1.0)].into_iter(), &t, &whole, false);
        assert!((before.parts.tp_comm - 100.0).abs() < 1e-9);
        assert!((before.hidden_tp_us - 500.0).abs() < 1e-9);
        // the last layer's goes beside the next layer's first GEMM: the list's first
        let after = cost([(&g, 1.0), (&rs, 1.0)].into_iter(), &t, &whole, false);
        assert!((after.parts.tp_comm - 100.0).abs() < 1e-9);
        // TP overlap changes nothing for it: the window is the whole kernel either way
        let on = cost([(&rs, 1.0), (&g, 1.0)].into_iter(), &t, &whole, true);
        assert!((on.parts.tp_comm - 100.0).abs() < 1e-9);
        // not started beside a kernel, it is exposed
        rs.beside_kernel = false;
        let off = cost([(&rs, 1.0), (&g, 1.0)].into_iter(), &t, &whole, false);
        assert_eq!(off.parts.tp_comm, 600.0);
    }

    #[test]
    fn the_backward_all_gather_pipelines_with_the_gemm_whose_gradient_it_gathers() {
        // backward GEMM (query 1) before a 600 µs all-gather, forward GEMM (query 0) after:
        // the backward's gather brings the output gradient of the GEMM before it
        let t = times_of([4000.0, 1000.0, 600.0], OpKind::AllGather);
        let (fwd, bwd, ag) = (
            call(0, Class::Compute),
            call(1, Class::Compute),
            call(2, Class::TpComm),
        );
        let c = cost(
            [(&bwd, 1.0), (&ag, 1.0), (&fwd, 1.0)].into_iter(),
            &t,
            &whole,
            true,
        );
        assert!((c.parts.tp_comm - (600.0 - 500.0 * 0.75)).abs() < 1e-9);
        // in the forward it feeds the GEMM after it
        let c = cost(
            [(&fwd, 1.0), (&ag, 1.0), (&fwd, 1.0)].into_iter(),
            &t,
            &whole,
            true,
        );
        assert_eq!(c.parts.tp_comm, 0.0);
    }

    fn lane(host_us: f64, device_us: f64, kernels: f64, waits: bool) -> Lane {
        Lane {
            host_us,
            device_us,
            kernels,
            waits,
        }
    }

    /// Issued ahead, a host-heavy call and a device-heavy one take 11 µs a repetition; with
    /// the host waiting before the host-heavy one the device idles while it is issued: 21.
    #[test]
    fn a_host_wait_stops_the_host_issuing_ahead() {
        assert_eq!(
            cycle_us(&[lane(10.0, 1.0, 1.0, false), lane(1.0, 10.0, 1.0, false)]),
            None
        );
        let waits = [lane(10.0, 1.0, 1.0, true), lane(1.0, 10.0, 1.0, false)];
        assert_eq!(cycle_us(&waits), Some(21.0));
        // the cycle starts at the wait wherever it is in the list
        let rotated = [lane(1.0, 10.0, 1.0, false), lane(10.0, 1.0, 1.0, true)];
        assert_eq!(cycle_us(&rotated), Some(21.0));
        // two waits: each stretch runs from empty (11 + 11)
        let two = [lane(10.0, 1.0, 1.0, true), lane(1.0, 10.0, 1.0, true)];
        assert_eq!(cycle_us(&two), Some(11.0 + 11.0));
    }

    /// A call of n kernels from an empty device: host-bound it ends a kernel after its last
    /// issue, device-bound n kernels after its first.
    #[test]
    fn a_calls_kernels_start_as_they_are_issued() {
        // 4 kernels issued in 5 µs each, run in 2: the last issued at 20, done at 22
        assert_eq!(cycle_us(&[lane(20.0, 8.0, 4.0, true)]), Some(22.0));
        // run in 10: the first issued at 5, then 40 µs of device
        assert_eq!(cycle_us(&[lane(20.0, 40.0, 4.0, true)]), Some(45.0));
    }

    /// After a wait, two host-bound calls: the second is issued only once the host has
    /// issued the first (10 + 10 µs), its kernel runs 1 µs after that.
    #[test]
    fn the_host_issues_one_call_after_another() {
        let host_bound = [lane(10.0, 1.0, 1.0, true), lane(10.0, 1.0, 1.0, false)];
        assert_eq!(cycle_us(&host_bound), Some(21.0));
    }

    /// The lanes are kept where a call waits for the device, or where the caller asks (a
    /// list that runs between another list's waits), and only there.
    #[test]
    fn lanes_are_kept_where_the_host_waits_or_where_asked() {
        let mut t = times([100.0, 300.0, 50.0]);
        t.runtime.launch_us = 10.0;
        let g = call(0, Class::Compute);
        let waiting = Call {
            host_waits: true,
            ..call(1, Class::Compute)
        };
        let lanes = |calls: &[&Call], keep: bool| {
            cost_keeping_lanes(calls.iter().map(|&c| (c, 1.0)), &t, &whole, false, keep).lanes
        };
        assert!(lanes(&[&g], false).is_empty());
        assert_eq!(
            lanes(&[&g, &waiting], false),
            [lane(10.0, 100.0, 1.0, false), lane(20.0, 300.0, 2.0, true)]
        );
        assert_eq!(lanes(&[&g], true), [lane(10.0, 100.0, 1.0, false)]);
    }

    /// A context-parallel ring exchange (send/recv) hides behind the latest attention step,
    /// not behind a GEMM; other context-parallel collectives, and pipeline sends, stay exposed.
    #[test]
    fn a_ring_exchange_hides_behind_the_attention_step_before_it() {
        use OpKind::{AllGather, FlashAttention, Gemm, SendRecv};
        let t = times_with(&[
            (FlashAttention, 200.0),
            (Gemm, 1000.0),
            (SendRecv, 300.0),
            (AllGather, 300.0),
        ]);
        let (attention, gemm) = (call(0, Class::Compute), call(1, Class::Compute));
        let exposed =
            |calls: &[&Call]| cost(calls.iter().map(|&c| (c, 1.0)), &t, &whole, false).parts;
        // 200 of the exchange's 300 µs run beside the attention step, after the GEMM too
        let ring = call(2, Class::CpComm);
        let parts = exposed(&[&attention, &gemm, &ring]);
        assert_eq!((parts.cp_comm, parts.compute), (100.0, 1200.0));
        // with no attention step before it, nothing hides it
        assert_eq!(exposed(&[&gemm, &ring]).cp_comm, 300.0);
        // a context-parallel all-gather is not a ring step
        let gather = call(3, Class::CpComm);
        assert_eq!(exposed(&[&attention, &gather]).cp_comm, 300.0);
        // nor is a pipeline send
        let send = call(2, Class::PpComm);
        assert_eq!(exposed(&[&attention, &send]).pp_comm, 300.0);
    }

    /// Collectives run beside the compute (overlapped): only what the compute cannot cover
    /// is exposed, split between expert and data-parallel time as they ran beside it; a
    /// collective's lane holds no device time. Each cost factor's exposed µs add up to the
    /// step: the collectives' where they outlast the compute, the compute's where it covers
    /// them.
    #[test]
    fn collectives_beside_the_compute_expose_only_their_excess() {
        use OpKind::{AllReduce, AllToAll, Gemm};
        let mut t = times_with(&[(Gemm, 1000.0), (AllReduce, 600.0), (AllToAll, 900.0)]);
        (t.factor, t.factors, t.attribute) = (vec![0, 1, 2], 3, true);
        let gemm = call(0, Class::Compute);
        let overlapped = |q, class| Call {
            overlapped: true,
            ..call(q, class)
        };
        let (reduce, all_to_all) = (overlapped(1, Class::DpComm), overlapped(2, Class::EpComm));
        let c = cost_keeping_lanes(
            [(&gemm, 1.0), (&reduce, 1.0), (&all_to_all, 1.0)].into_iter(),
            &t,
            &whole,
            false,
            true,
        );
        // 1,500 µs beside 1,000 of compute: 500 exposed, 0.6 of it the all-to-all's
        let p = c.parts;
        assert_eq!((p.compute, p.ep_comm, p.dp_comm), (1000.0, 300.0, 200.0));
        let device: Vec<f64> = c.lanes.iter().map(|l| l.device_us).collect();
        assert_eq!(device, [1000.0, 0.0, 0.0]);
        let by_factor: Vec<f64> = (0..3).map(|f| c.attribution.of(f)).collect();
        assert_eq!(by_factor, [0.0, 600.0, 900.0]);
        // the compute covers the all-reduce alone: nothing exposed, the step is the compute's
        let c = cost(
            [(&gemm, 1.0), (&reduce, 1.0)].into_iter(),
            &t,
            &whole,
            false,
        );
        assert_eq!((c.parts.dp_comm, c.parts.total()), (0.0, 1000.0));
        assert_eq!(c.attribution.of(0), 1000.0);
        assert_eq!(c.attribution.of(1), 0.0);
    }

    /// Compute sharing the GPU with a collective runs `contention` times slower while they
    /// overlap, which can let it cover the collective; the compute's attribution grows with it.
    #[test]
    fn contention_slows_the_compute_a_collective_runs_beside() {
        use OpKind::{AllReduce, Gemm, ReduceScatter};
        let mut t = times_with(&[(Gemm, 1000.0), (AllReduce, 1200.0), (ReduceScatter, 1500.0)]);
        (t.factor, t.factors, t.attribute) = (vec![0, 1, 2], 3, true);
        t.runtime.contention = 1.5;
        let gemm = call(0, Class::Compute);
        let reduce = Call {
            overlapped: true,
            ..call(1, Class::DpComm)
        };
        // all 1,000 µs of compute share the GPU: 1,500, which covers the 1,200 µs all-reduce
        let c = cost(
            [(&gemm, 1.0), (&reduce, 1.0)].into_iter(),
            &t,
            &whole,
            false,
        );
        assert_eq!((c.parts.compute, c.parts.dp_comm), (1500.0, 0.0));
        assert_eq!(c.attribution.of(0), 1500.0);
        // a tensor-parallel reduce-scatter started beside the kernel: 1,000 of its 1,500 µs
        // hide (and slow the kernel they share it with), a third of it stays exposed
        let rs = Call {
            beside_kernel: true,
            ..call(2, Class::TpComm)
        };
        let c = cost_keeping_lanes(
            [(&rs, 1.0), (&gemm, 1.0)].into_iter(),
            &t,
            &whole,
            false,
            true,
        );
        assert_eq!((c.parts.compute, c.parts.tp_comm), (1500.0, 500.0));
        assert_eq!(c.attribution.of(0), 1500.0);
        assert!((c.attribution.of(2) - 500.0).abs() < 1e-9);
        assert_eq!(c.lanes[0].device_us, 500.0);
        t.runtime.contention = 1.0;
        let c = cost([(&rs, 1.0), (&gemm, 1.0)].into_iter(), &t, &whole, false);
        assert_eq!((c.parts.compute, c.parts.tp_comm), (1000.0, 500.0));
        assert_eq!(c.attribution.of(0), 1000.0);
        assert!((c.attribution.of(2) - 500.0).abs() < 1e-9);
    }

    /// A collective started beside a kernel hides behind the next GEMM in the list — not a
    /// norm between them, not the GEMM before it — for as long as that GEMM runs in the step
    /// (its time × count × repetitions × share); an overlapped one (beside the whole compute)
    /// is not also hidden behind a kernel.
    #[test]
    fn a_collective_beside_a_kernel_pairs_with_the_next_gemm_at_its_whole_time() {
        use OpKind::{Gemm, ReduceScatter, RmsNorm};
        let t = times_with(&[
            (Gemm, 100.0),
            (Gemm, 1000.0),
            (RmsNorm, 50.0),
            (ReduceScatter, 600.0),
        ]);
        let (small, big, norm) = (
            call(0, Class::Compute),
            call(1, Class::Compute),
            call(2, Class::Compute),
        );
        let rs = Call {
            beside_kernel: true,
            ..call(3, Class::TpComm)
        };
        let exposed = |calls: &[(&Call, f64)], share: &dyn Fn(&Call) -> f64| {
            cost(calls.iter().copied(), &t, share, false).parts.tp_comm
        };
        let one = |c| (c, 1.0);
        assert_eq!(
            exposed(&[one(&small), one(&rs), one(&norm), one(&big)], &whole),
            0.0
        );
        // the 100 µs GEMM, 4 calls a layer, 2 layers, half of it in this share: 400 µs hide
        let counted = Call {
            count: 4.0,
            ..small.clone()
        };
        let half_the_small_gemm = |c: &Call| if c.query == 0 { 0.5 } else { 1.0 };
        let list = [one(&rs), (&counted, 2.0)];
        assert_eq!(exposed(&list, &half_the_small_gemm), 200.0);
        // a backward GEMM of two kernels (data and weight gradient), 2 × 150 µs, of which a
        // split backward's pass runs one: the collective hides behind that one, 150 µs
        let mut two_kernels = times_with(&[(Gemm, 300.0), (ReduceScatter, 600.0)]);
        two_kernels.kernels[0] = 2.0;
        let gemm = call(0, Class::Compute);
        let rs = Call {
            beside_kernel: true,
            ..call(1, Class::TpComm)
        };
        for (share, hidden) in [(1.0, 150.0), (0.5, 150.0), (0.0, 0.0)] {
            let of = |c: &Call| if c.query == 0 { share } else { 1.0 };
            let c = cost([one(&rs), one(&gemm)].into_iter(), &two_kernels, &of, false);
            assert_eq!(c.hidden_tp_us, hidden, "share {share}");
        }
        // run beside the whole compute instead, nothing of it hides behind one kernel
        let overlapped = Call {
            overlapped: true,
            ..rs.clone()
        };
        let c = cost([one(&overlapped), one(&big)].into_iter(), &t, &whole, false);
        assert_eq!((c.hidden_tp_us, c.parts.tp_comm), (0.0, 0.0));
    }

    /// With TP overlap a forward all-gather pipelines with the GEMM after it, the one it
    /// feeds, not with a forward GEMM before it: only a backward GEMM's output gradient is
    /// gathered after it.
    #[test]
    fn a_forward_all_gather_pipelines_with_the_gemm_it_feeds() {
        use OpKind::{AllGather, Gemm};
        let t = times_with(&[(Gemm, 100.0), (Gemm, 4000.0), (AllGather, 600.0)]);
        let (small, big, gather) = (
            call(0, Class::Compute),
            call(1, Class::Compute),
            call(2, Class::TpComm),
        );
        let c = cost(
            [(&small, 1.0), (&gather, 1.0), (&big, 1.0)].into_iter(),
            &t,
            &whole,
            true,
        );
        assert_eq!(c.parts.tp_comm, 0.0);
    }
}

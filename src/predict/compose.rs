//! Composition of per-call estimates into one step with the paper's 1F1B formula (method.md §4):
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

use super::decompose::{Class, Decomposition, OpCall};

/// Seconds (or µs, as the caller uses them) per class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ClassTimes {
    pub compute: f64,
    pub tp_comm: f64,
    pub pp_comm: f64,
    pub dp_comm: f64,
    pub optimizer: f64,
}

impl ClassTimes {
    pub fn plus(&self, o: &ClassTimes) -> ClassTimes {
        ClassTimes {
            compute: self.compute + o.compute,
            tp_comm: self.tp_comm + o.tp_comm,
            pp_comm: self.pp_comm + o.pp_comm,
            dp_comm: self.dp_comm + o.dp_comm,
            optimizer: self.optimizer + o.optimizer,
        }
    }

    fn add(&mut self, class: Class, t: f64) {
        match class {
            Class::Compute => self.compute += t,
            Class::TpComm => self.tp_comm += t,
            Class::PpComm => self.pp_comm += t,
            Class::DpComm => self.dp_comm += t,
            Class::Optimizer => self.optimizer += t,
        }
    }

    pub fn total(&self) -> f64 {
        self.compute + self.tp_comm + self.pp_comm + self.dp_comm + self.optimizer
    }

    pub fn scaled(&self, k: f64) -> ClassTimes {
        ClassTimes {
            compute: self.compute * k,
            tp_comm: self.tp_comm * k,
            pp_comm: self.pp_comm * k,
            dp_comm: self.dp_comm * k,
            optimizer: self.optimizer * k,
        }
    }
}

/// The step split into what it spends time on; the parts add up to the step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Breakdown {
    pub compute: f64,
    pub tp_comm: f64,
    pub pp_comm: f64,
    pub dp_comm: f64,
    pub optimizer: f64,
    pub bubble: f64,
}

impl Breakdown {
    pub fn total(&self) -> f64 {
        self.compute + self.tp_comm + self.pp_comm + self.dp_comm + self.optimizer + self.bubble
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct StageTiming {
    pub index: usize,
    /// One micro-batch, µs.
    pub fwd_us: f64,
    pub bwd_us: f64,
    pub fwd_parts: ClassTimes,
    pub bwd_parts: ClassTimes,
    /// Per step, µs.
    pub grad_sync_us: f64,
    pub optimizer_us: f64,
    pub param_gather_us: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Step {
    pub step_us: f64,
    pub breakdown_us: Breakdown,
    pub stages: Vec<StageTiming>,
}

/// Time of a list of calls run one after another, split by class. Calls marked `overlapped`
/// run beside the compute and only their excess over it counts (as data-parallel time).
pub fn serial_time(ops: &[OpCall], time_of: &dyn Fn(&OpCall) -> f64) -> ClassTimes {
    serial_share(ops, time_of, &|_| 1.0)
}

/// `serial_time` of the part `share(op)` (0–1) of each call: a backward's input-gradient or
/// weight-gradient half.
pub fn serial_share(
    ops: &[OpCall],
    time_of: &dyn Fn(&OpCall) -> f64,
    share: &dyn Fn(&OpCall) -> f64,
) -> ClassTimes {
    let mut parts = ClassTimes::default();
    let mut beside = 0.0;
    for op in ops {
        let t = time_of(op) * op.count * share(op);
        if op.overlapped {
            beside += t;
        } else {
            parts.add(op.class, t);
        }
    }
    parts.dp_comm += (beside - parts.compute).max(0.0);
    parts
}

/// Per-stage times of one micro-batch's forward and backward and of the per-step work.
pub fn stage_timings(d: &Decomposition, time_of: &dyn Fn(&OpCall) -> f64) -> Vec<StageTiming> {
    d.stages
        .iter()
        .map(|s| {
            let fwd = serial_time(&s.fwd, time_of);
            let bwd = serial_time(&s.bwd, time_of);
            let sync = serial_time(&s.grad_sync, time_of);
            let update = serial_time(&s.update, time_of);
            StageTiming {
                index: s.index,
                fwd_us: fwd.total(),
                bwd_us: bwd.total(),
                fwd_parts: fwd,
                bwd_parts: bwd,
                grad_sync_us: sync.total(),
                optimizer_us: update.optimizer,
                param_gather_us: update.dp_comm,
            }
        })
        .collect()
}

/// The paper's 1F1B step; `time_of` gives one call's time in µs.
pub fn one_f_one_b(
    d: &Decomposition,
    micro_batches: u64,
    time_of: &dyn Fn(&OpCall) -> f64,
) -> Step {
    let stages = stage_timings(d, time_of);
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
        pp_comm: work.pp_comm + work_b.pp_comm,
        dp_comm: work.dp_comm + work_b.dp_comm + first_sync + update.param_gather_us,
        optimizer: work.optimizer + work_b.optimizer + update.optimizer_us,
        bubble: (pp - 1.0) * slot,
    };
    Step {
        step_us: (m - 1.0 + pp) * slot + first_sync + update.optimizer_us + update.param_gather_us,
        breakdown_us: breakdown,
        stages,
    }
}

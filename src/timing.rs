//! The one vocabulary of time every layer shares: what a call's time counts as (`Class`), time
//! per class (`ClassTimes`), and a step split into what it spends time on (`Breakdown`). All in
//! microseconds unless a field's name says otherwise.

use serde::Serialize;

/// What a call's time counts as in the breakdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    Compute,
    TpComm,
    /// Context-parallel K/V exchange (ring attention).
    CpComm,
    /// Expert-parallel token all-to-all (mixture of experts).
    EpComm,
    PpComm,
    DpComm,
    Optimizer,
}

/// Time per class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ClassTimes {
    pub compute: f64,
    pub tp_comm: f64,
    pub cp_comm: f64,
    pub ep_comm: f64,
    pub pp_comm: f64,
    pub dp_comm: f64,
    pub optimizer: f64,
    /// The device idle while the host issues kernels it could not issue ahead: after a
    /// synchronisation inside a pass (see `plan::Call::host_waits`).
    pub host: f64,
}

impl ClassTimes {
    pub fn plus(&self, o: &ClassTimes) -> ClassTimes {
        ClassTimes {
            compute: self.compute + o.compute,
            tp_comm: self.tp_comm + o.tp_comm,
            cp_comm: self.cp_comm + o.cp_comm,
            ep_comm: self.ep_comm + o.ep_comm,
            pp_comm: self.pp_comm + o.pp_comm,
            dp_comm: self.dp_comm + o.dp_comm,
            optimizer: self.optimizer + o.optimizer,
            host: self.host + o.host,
        }
    }

    pub fn add(&mut self, class: Class, t: f64) {
        match class {
            Class::Compute => self.compute += t,
            Class::TpComm => self.tp_comm += t,
            Class::CpComm => self.cp_comm += t,
            Class::EpComm => self.ep_comm += t,
            Class::PpComm => self.pp_comm += t,
            Class::DpComm => self.dp_comm += t,
            Class::Optimizer => self.optimizer += t,
        }
    }

    pub fn total(&self) -> f64 {
        self.compute
            + self.tp_comm
            + self.cp_comm
            + self.ep_comm
            + self.pp_comm
            + self.dp_comm
            + self.optimizer
            + self.host
    }

    pub fn scaled(&self, k: f64) -> ClassTimes {
        ClassTimes {
            compute: self.compute * k,
            tp_comm: self.tp_comm * k,
            cp_comm: self.cp_comm * k,
            ep_comm: self.ep_comm * k,
            pp_comm: self.pp_comm * k,
            dp_comm: self.dp_comm * k,
            optimizer: self.optimizer * k,
            host: self.host * k,
        }
    }
}

/// A step split into what it spends time on; the parts add up to the step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Breakdown {
    pub compute: f64,
    pub tp_comm: f64,
    /// Context-parallel K/V exchange not hidden behind the attention chunks.
    pub cp_comm: f64,
    /// Expert-parallel token all-to-all.
    pub ep_comm: f64,
    pub pp_comm: f64,
    pub dp_comm: f64,
    pub optimizer: f64,
    pub bubble: f64,
    /// The device waiting for the host to issue kernels, and the host's per-step work.
    pub host: f64,
}

impl Breakdown {
    pub fn total(&self) -> f64 {
        self.compute
            + self.tp_comm
            + self.cp_comm
            + self.ep_comm
            + self.pp_comm
            + self.dp_comm
            + self.optimizer
            + self.bubble
            + self.host
    }

    pub fn scaled(&self, k: f64) -> Breakdown {
        Breakdown {
            compute: self.compute * k,
            tp_comm: self.tp_comm * k,
            cp_comm: self.cp_comm * k,
            ep_comm: self.ep_comm * k,
            pp_comm: self.pp_comm * k,
            dp_comm: self.dp_comm * k,
            optimizer: self.optimizer * k,
            bubble: self.bubble * k,
            host: self.host * k,
        }
    }

    /// Bubble over the busy pipeline time (compute, TP, CP and PP communication): (pp − 1)/m
    /// for balanced 1F1B.
    pub fn bubble_ratio(&self) -> f64 {
        self.bubble
            / (self.compute + self.tp_comm + self.cp_comm + self.ep_comm + self.pp_comm)
                .max(f64::MIN_POSITIVE)
    }
}

/// Where a duration's microseconds come from: (factor, µs) pairs over the cost factors the
/// caller chose (the predictor's are its models), so a composer can say how much of a step's
/// critical path each factor is, and the step's first-order response to scaling one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Attribution(Vec<(u32, f64)>);

impl Attribution {
    pub fn add(&mut self, factor: u32, us: f64) {
        if us == 0.0 {
            return;
        }
        match self.0.iter_mut().find(|(f, _)| *f == factor) {
            Some((_, t)) => *t += us,
            None => self.0.push((factor, us)),
        }
    }

    pub fn add_scaled(&mut self, other: &Attribution, k: f64) {
        for &(f, us) in &other.0 {
            self.add(f, us * k);
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (u32, f64)> + '_ {
        self.0.iter().copied()
    }

    /// Adds this attribution, scaled by `k`, into a dense per-factor vector.
    pub fn accumulate(&self, into: &mut [f64], k: f64) {
        for &(f, us) in &self.0 {
            if let Some(slot) = into.get_mut(f as usize) {
                *slot += us * k;
            }
        }
    }

    pub fn total(&self) -> f64 {
        self.0.iter().map(|(_, us)| us).sum()
    }

    /// Every factor's microseconds times `k`.
    pub fn scale(&mut self, k: f64) {
        for (_, us) in &mut self.0 {
            *us *= k;
        }
    }

    /// The microseconds of one factor.
    pub fn of(&self, factor: u32) -> f64 {
        self.0
            .iter()
            .find(|(f, _)| *f == factor)
            .map_or(0.0, |(_, us)| *us)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attribution_merges_factors() {
        let mut a = Attribution::default();
        a.add(3, 2.0);
        a.add(1, 1.0);
        a.add(3, 0.5);
        a.add(7, 0.0);
        let mut b = Attribution::default();
        b.add_scaled(&a, 2.0);
        let mut dense = vec![0.0; 4];
        b.accumulate(&mut dense, 1.0);
        assert_eq!(dense, vec![0.0, 2.0, 0.0, 5.0]);
        assert_eq!(a.total(), 3.5);
    }
}

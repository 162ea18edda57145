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

    /// Bubble over the busy pipeline time (compute, TP, CP, EP and PP communication):
    /// (pp − 1)/m for balanced 1F1B.
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

    /// Every class lands in its own field and every field is added, summed and scaled: the
    /// values are powers of two, so a field mixed up or dropped shows in the sum.
    #[test]
    fn class_times_keep_each_class_apart() {
        let classes = [
            Class::Compute,
            Class::TpComm,
            Class::CpComm,
            Class::EpComm,
            Class::PpComm,
            Class::DpComm,
            Class::Optimizer,
        ];
        let mut t = ClassTimes::default();
        for (i, class) in classes.into_iter().enumerate() {
            t.add(class, f64::from(1u32 << i));
        }
        t.host = 128.0;
        let fields = |t: &ClassTimes| {
            [
                t.compute,
                t.tp_comm,
                t.cp_comm,
                t.ep_comm,
                t.pp_comm,
                t.dp_comm,
                t.optimizer,
                t.host,
            ]
        };
        assert_eq!(fields(&t), [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0]);
        assert_eq!(t.total(), 255.0);
        // t + 3t = 4t field by field (no field of which the sum and the product agree)
        let four = t.plus(&t.scaled(3.0));
        assert_eq!(fields(&four), fields(&t.scaled(4.0)));
        assert_eq!(four.total(), 1020.0);
        assert_eq!(t.scaled(3.0).total(), 765.0);
    }

    #[test]
    fn a_breakdown_adds_scales_and_weighs_its_bubble() {
        let b = Breakdown {
            compute: 1.0,
            tp_comm: 2.0,
            cp_comm: 4.0,
            ep_comm: 8.0,
            pp_comm: 16.0,
            dp_comm: 32.0,
            optimizer: 64.0,
            bubble: 124.0,
            host: 256.0,
        };
        assert_eq!(b.total(), 507.0);
        let s = b.scaled(0.5);
        assert_eq!(s.total(), 253.5);
        assert_eq!((s.compute, s.bubble, s.host), (0.5, 62.0, 128.0));
        // the bubble over the busy pipeline time: compute and TP, CP, EP, PP communication
        assert_eq!(b.bubble_ratio(), 124.0 / 31.0);
        assert!(Breakdown::default().bubble_ratio() == 0.0);
    }

    #[test]
    fn attribution_scales_and_reads_one_factor() {
        let mut a = Attribution::default();
        a.add(2, 3.0);
        a.add(5, 1.0);
        a.scale(4.0);
        assert_eq!(a.of(2), 12.0);
        assert_eq!(a.of(5), 4.0);
        assert_eq!(a.of(9), 0.0);
        assert_eq!(a.iter().collect::<Vec<_>>(), vec![(2, 12.0), (5, 4.0)]);
        // a factor beyond the dense vector is left out, the rest scaled into it
        let mut dense = vec![1.0; 3];
        a.accumulate(&mut dense, 0.5);
        assert_eq!(dense, vec![1.0, 1.0, 7.0]);
    }

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

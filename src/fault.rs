//! The cost of failures over a whole training run (MoFa, Zhang et al. 2025, §3.4, eqs. 36–44):
//! the effective training time ratio (ETTR), the end-to-end wall time, and the checkpoint
//! interval that maximises ETTR.
//!
//! With S steps of T seconds, N nodes failing r times per node per second, a mean recovery of
//! u_b seconds (eq. 41: the shares of process-, pod- and job-level recoveries times their
//! durations), a checkpoint every I steps costing T_save seconds, and u_0 seconds to the first
//! step, the expected interruption per unit of run is
//!
//! ```text
//! ETTR = (1 − N·r·(u_b + I·T/2)) / (1 + T_save/(I·T))                               (eq. 40)
//! E2E  = S·T / ETTR + u_0
//! ```
//!
//! (each failure costs its recovery plus, on average, half a checkpoint interval of lost work).
//! Writing x = I·T, dETTR/dx = 0 gives x* = −T_save + √(T_save² + 2·T_save·(1 − N·r·u_b)/(N·r)),
//! Young's √(2·T_save·MTBF) to first order; the interval is x*/T rounded down and up, the better
//! of the two kept.

use serde::Serialize;

use crate::error::{Error, Result};
pub use crate::hardware::{RecoveryLevel, Reliability, Storage};

const DAY_S: f64 = 86_400.0;

/// Bytes of a checkpoint: 16-bit weights and the fp32 master weights and two Adam moments
/// (Megatron's and DeepSpeed's distributed checkpoints): 14 bytes per parameter.
pub fn checkpoint_bytes(params: u64) -> f64 {
    14.0 * params as f64
}

/// Everything eq. 40 needs.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct RunInputs {
    pub step_s: f64,
    pub steps: f64,
    pub nodes: f64,
    pub failures_per_node_per_day: f64,
    pub mean_recovery_s: f64,
    pub save_s: f64,
    pub first_start_s: f64,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct RunOutcome {
    /// Steps between checkpoints used.
    pub checkpoint_interval: u64,
    pub ettr: f64,
    /// Training alone: steps × step time.
    pub training_s: f64,
    /// Expected wall time of the whole run.
    pub end_to_end_s: f64,
    /// Expected failures over the run.
    pub failures: f64,
    /// The interval that maximises ETTR, and the ETTR there.
    pub optimal_interval: u64,
    pub optimal_ettr: f64,
}

impl RunInputs {
    /// Every input within its physical range (the messages name the input and the range).
    pub fn validate(&self) -> Result<()> {
        use crate::limits::check_range;
        let checks = [
            ("step time", self.step_s, 1e-6..=1e7, "s"),
            ("steps", self.steps, 1.0..=1e13, ""),
            ("nodes", self.nodes, 1.0..=1e6, ""),
            (
                "failures per node per day",
                self.failures_per_node_per_day,
                1e-7..=10.0,
                "",
            ),
            ("recovery time", self.mean_recovery_s, 0.0..=1e7, "s"),
            ("checkpoint save time", self.save_s, 0.0..=1e7, "s"),
            ("first start", self.first_start_s, 0.0..=1e7, "s"),
        ];
        for (name, v, range, unit) in checks {
            check_range("run", name, v, range, unit).map_err(Error::Invalid)?;
        }
        Ok(())
    }

    fn rate_per_s(&self) -> f64 {
        self.nodes * self.failures_per_node_per_day / DAY_S
    }

    /// Eq. 40 for a checkpoint every `interval` steps.
    pub fn ettr(&self, interval: u64) -> f64 {
        let x = interval.max(1) as f64 * self.step_s;
        (1.0 - self.rate_per_s() * (self.mean_recovery_s + x / 2.0)) / (1.0 + self.save_s / x)
    }

    /// The ETTR-maximising time between checkpoints, x* (seconds; the module's closed form).
    fn optimal_checkpoint_s(&self) -> f64 {
        let (lambda, c) = (self.rate_per_s(), self.save_s);
        let a = 1.0 - lambda * self.mean_recovery_s;
        -c + (c * c + 2.0 * c * a / lambda).sqrt()
    }

    /// The ETTR-maximising interval: the closed form rounded down and up, the better kept.
    pub fn optimal_interval(&self) -> u64 {
        let i = self.optimal_checkpoint_s() / self.step_s;
        let (lo, hi) = ((i.floor() as u64).max(1), (i.ceil() as u64).max(1));
        if self.ettr(hi) > self.ettr(lo) {
            hi
        } else {
            lo
        }
    }

    /// The run at `interval` steps between checkpoints (the optimal one when `None`).
    pub fn outcome(&self, interval: Option<u64>) -> Result<RunOutcome> {
        self.validate()?;
        // ETTR is concave in the interval: in a run shorter than the unconstrained optimum
        // the best is one checkpoint, at the end
        let optimal = self.optimal_interval().min(self.steps as u64).max(1);
        let interval = interval.unwrap_or(optimal);
        if interval == 0 || interval as f64 > self.steps {
            return Err(Error::Invalid(format!(
                "checkpoint interval {interval}: give between 1 and the run's {:.0} steps",
                self.steps
            )));
        }
        let ettr = self.ettr(interval);
        if ettr <= 0.0 {
            return Err(Error::Invalid(format!(
                "with {:.0} nodes failing {} times a day each, the run spends all its time \
                 recovering (ETTR ≤ 0 at a checkpoint every {interval} steps): fewer nodes, a \
                 lower failure rate or faster recovery",
                self.nodes, self.failures_per_node_per_day
            )));
        }
        let training = self.steps * self.step_s;
        let end_to_end = training / ettr + self.first_start_s;
        Ok(RunOutcome {
            checkpoint_interval: interval,
            ettr,
            training_s: training,
            end_to_end_s: end_to_end,
            failures: self.rate_per_s() * end_to_end,
            optimal_interval: optimal,
            optimal_ettr: self.ettr(optimal),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// MoFa Table 5, LLaMA2-70B on 128–1,024 GPUs of 8 per node: r_f 0.5 %, a checkpoint every
    /// 10 steps, and per column T_save, u_b, T_step, S → ETTR and T_E2E as published.
    #[test]
    fn reproduces_mofa_table_5() {
        let rows = [
            // gpus, T_save, u_b, T_step, S, ETTR %, T_E2E s
            (128.0, 4.19, 134.41, 27.83, 953_675.0, 98.49, 26_947_190.75),
            (256.0, 2.35, 147.72, 27.99, 476_838.0, 99.11, 13_465_926.21),
            (512.0, 1.59, 174.34, 28.33, 238_419.0, 99.32, 6_800_277.57),
            (1024.0, 0.95, 227.58, 28.83, 119_210.0, 99.39, 3_457_670.27),
        ];
        for (gpus, save, ub, step, steps, ettr, e2e) in rows {
            let run = RunInputs {
                step_s: step,
                steps,
                nodes: gpus / 8.0,
                failures_per_node_per_day: 0.005,
                mean_recovery_s: ub,
                save_s: save,
                first_start_s: 0.0,
            };
            let o = run.outcome(Some(10)).unwrap();
            assert!(
                (100.0 * o.ettr - ettr).abs() < 0.01,
                "{gpus}: {}",
                100.0 * o.ettr
            );
            // T_E2E = S·T_step / ETTR, to the 0.2 s MoFa's printed inputs allow
            assert!(
                (o.end_to_end_s - e2e).abs() < 0.2,
                "{gpus}: {}",
                o.end_to_end_s
            );
        }
    }

    /// A run shorter than the best interval checkpoints once, at its end, instead of refusing.
    #[test]
    fn a_short_run_checkpoints_at_its_end() {
        let run = RunInputs {
            step_s: 2.0,
            steps: 1000.0,
            nodes: 16.0,
            failures_per_node_per_day: 0.001,
            mean_recovery_s: 60.0,
            save_s: 30.0,
            first_start_s: 0.0,
        };
        assert!(run.optimal_interval() > 1000);
        let o = run.outcome(None).unwrap();
        assert_eq!((o.checkpoint_interval, o.optimal_interval), (1000, 1000));
        assert!(run.outcome(Some(1001)).is_err());
    }

    /// MoFa §5.4.1: u_b 60 s, T_save 2 s, 0.01 failures per node per day, 32 nodes: the best
    /// interval is 37 steps with ETTR 99.59 % (their step is the 28 s of Table 5).
    #[test]
    fn optimal_interval_as_in_mofa_figure_4() {
        let run = RunInputs {
            step_s: 28.0,
            steps: 1e5,
            nodes: 32.0,
            failures_per_node_per_day: 0.01,
            mean_recovery_s: 60.0,
            save_s: 2.0,
            first_start_s: 0.0,
        };
        let i = run.optimal_interval();
        assert_eq!(i, 37);
        assert!(
            (100.0 * run.ettr(i) - 99.59).abs() < 0.01,
            "{}",
            run.ettr(i)
        );
        // no integer interval does better
        for j in 1..200 {
            assert!(run.ettr(j) <= run.ettr(i) + 1e-15);
        }
    }

    /// The outcome's every field worked by hand at a small run: the first start added once,
    /// the failures expected over the whole wall time, the optimum's own ETTR beside the
    /// interval used, and a checkpoint's 14 bytes a parameter.
    #[test]
    fn an_outcome_adds_the_first_start_and_counts_failures_over_the_wall_time() {
        let run = RunInputs {
            step_s: 10.0,
            steps: 1000.0,
            nodes: 8.0,
            failures_per_node_per_day: 1.08,
            mean_recovery_s: 100.0,
            save_s: 20.0,
            first_start_s: 300.0,
        };
        // 8 · 1.08 / 86,400 = 1e-4 failures a second; every 10 steps: x = 100 s
        let ettr = (1.0 - 1e-4 * (100.0 + 50.0)) / (1.0 + 20.0 / 100.0);
        let o = run.outcome(Some(10)).unwrap();
        assert!((o.ettr - ettr).abs() < 1e-12, "{}", o.ettr);
        assert_eq!(o.training_s, 10_000.0);
        let wall = 10_000.0 / ettr + 300.0;
        assert!((o.end_to_end_s - wall).abs() < 1e-6, "{}", o.end_to_end_s);
        assert!((o.failures - 1e-4 * wall).abs() < 1e-9, "{}", o.failures);
        // the optimum: x* = −20 + √(400 + 2 · 20 · 0.99 / 1e-4) = 609.6 s, about 61 steps
        let x = -20.0 + (400.0f64 + 2.0 * 20.0 * 0.99 / 1e-4).sqrt();
        assert!((run.optimal_checkpoint_s() - x).abs() < 1e-9, "{x}");
        assert_eq!(o.optimal_interval, 61);
        assert_eq!(o.optimal_ettr, run.ettr(61));
        assert!(o.optimal_ettr > o.ettr);
        assert!(run.outcome(Some(0)).is_err());
        // every input checked before the outcome is worked out
        let zero_step = RunInputs { step_s: 0.0, ..run };
        let e = zero_step.outcome(Some(10)).unwrap_err().to_string();
        assert!(e.contains("step time = 0"), "{e}");
        assert_eq!(checkpoint_bytes(1_000_000), 14e6);
    }

    #[test]
    fn mean_recovery_weights_the_levels() {
        // 0.3·141 + 0.6·262 + 0.1·307
        assert!((Reliability::default().mean_recovery_s() - 230.2).abs() < 1e-9);
    }

    #[test]
    fn bad_inputs_say_what_is_wrong() {
        let r = Reliability {
            failures_per_node_per_day: 0.0,
            ..Default::default()
        };
        assert!(r
            .validate("c.yaml")
            .unwrap_err()
            .contains("must be positive"));
        let s = Storage {
            checkpoint_write_gb_per_s_per_node: -1.0,
            checkpoint_write_gb_per_s_max: None,
        };
        let e = s.validate("c.yaml").unwrap_err();
        assert!(
            e.contains("c.yaml") && e.contains("checkpoint_write_gb_per_s_per_node = -1"),
            "{e}"
        );
        let run = RunInputs {
            step_s: 10.0,
            steps: 10.0,
            nodes: 1e6,
            failures_per_node_per_day: 1.0,
            mean_recovery_s: 600.0,
            save_s: 1.0,
            first_start_s: 0.0,
        };
        assert!(run
            .outcome(None)
            .unwrap_err()
            .to_string()
            .contains("recovering"));
    }
}

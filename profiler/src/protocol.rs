//! The measurement protocol (`docs/method.md` §1): warm-up runs, then timed runs each bracketed by
//! device events (queued back to back where the device can), every raw sample kept, the summary the mean of the middle of the sorted
//! samples (5 of 10 by default), and the GPU's clocks read before and after to flag throttling.

use serde::{Deserialize, Serialize};

use crate::device::{Device, DeviceError, Runnable, Telemetry};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Protocol {
    pub warmup: u32,
    pub timed: u32,
    /// The summary averages this many middle samples of the sorted timed runs.
    pub keep: u32,
}

impl Default for Protocol {
    fn default() -> Self {
        Protocol {
            warmup: 10,
            timed: 10,
            keep: 5,
        }
    }
}

impl Protocol {
    pub fn validate(&self) -> Result<(), String> {
        if self.timed == 0 || self.keep == 0 || self.keep > self.timed {
            return Err(format!(
                "protocol: timed {}, keep {}: give timed ≥ 1 and 1 ≤ keep ≤ timed (the paper \
                 times 10 and keeps the middle 5)",
                self.timed, self.keep
            ));
        }
        if self.warmup > 10_000 || self.timed > 10_000 {
            return Err(format!(
                "protocol: warmup {}, timed {}: give at most 10000 runs each",
                self.warmup, self.timed
            ));
        }
        Ok(())
    }
}

/// One measured point.
#[derive(Debug, Clone, PartialEq)]
pub struct Timing {
    pub samples_us: Vec<f64>,
    pub summary_us: f64,
    pub throttled: bool,
    /// Clocks and temperature around the measurement, when known.
    pub note: String,
}

/// Runs the protocol on a prepared call.
pub fn measure(
    protocol: &Protocol,
    run: &mut dyn Runnable,
) -> Result<(Vec<f64>, f64), DeviceError> {
    for _ in 0..protocol.warmup {
        run.run()?;
    }
    let samples = run.run_timed_back_to_back(protocol.timed)?;
    if samples.len() != protocol.timed as usize {
        return Err(DeviceError::Fatal(format!(
            "the device returned {} times for {} timed runs",
            samples.len(),
            protocol.timed
        )));
    }
    if let Some(t) = samples.iter().find(|t| !(t.is_finite() && **t > 0.0)) {
        return Err(DeviceError::Skip(format!(
            "device reported a time of {t} µs"
        )));
    }
    let summary = stepcast::stats::sorted_median(&samples, protocol.keep as usize)
        .ok_or_else(|| DeviceError::Skip("no valid samples".into()))?;
    Ok((samples, summary))
}

/// Prepares and measures one call on a device, reading telemetry before and after.
pub fn measure_on(
    device: &mut dyn Device,
    protocol: &Protocol,
    q: &stepcast::ops::OpQuery,
) -> Result<Timing, DeviceError> {
    let before = device.telemetry();
    let (samples, summary) = {
        let mut run = device.prepare(q)?;
        measure(protocol, run.as_mut())?
    };
    let after = device.telemetry();
    Ok(Timing {
        samples_us: samples,
        summary_us: summary,
        throttled: [before, after].iter().flatten().any(Telemetry::throttled),
        note: telemetry_note(before, after),
    })
}

fn telemetry_note(before: Option<Telemetry>, after: Option<Telemetry>) -> String {
    match (before, after) {
        (Some(b), Some(a)) => format!(
            "sm {}→{} MHz (max {}), {}→{} °C, {:.0} W{}",
            b.sm_clock_mhz,
            a.sm_clock_mhz,
            a.max_sm_clock_mhz,
            b.temperature_c,
            a.temperature_c,
            a.power_w,
            if a.throttle_reasons & crate::device::THROTTLE_MASK != 0 {
                format!(", throttle reasons {:#x}", a.throttle_reasons)
            } else {
                String::new()
            }
        ),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Times from a list; counts untimed runs.
    struct Scripted {
        times: Vec<f64>,
        untimed: u32,
    }

    impl Runnable for Scripted {
        fn run(&mut self) -> Result<(), DeviceError> {
            self.untimed += 1;
            Ok(())
        }
        fn run_timed(&mut self) -> Result<f64, DeviceError> {
            Ok(self.times.remove(0))
        }
    }

    #[test]
    fn ten_warmups_then_mean_of_the_middle_five_of_ten() {
        let mut r = Scripted {
            times: vec![9.0, 1.0, 8.0, 2.0, 7.0, 3.0, 6.0, 4.0, 5.0, 100.0],
            untimed: 0,
        };
        let (samples, summary) = measure(&Protocol::default(), &mut r).unwrap();
        assert_eq!(r.untimed, 10);
        assert_eq!(samples.len(), 10);
        // sorted 1..9, 100: the middle five are 3,4,5,6,7
        assert_eq!(summary, 5.0);
    }

    /// A time that is not a finite positive number (not a number, none at all, an overflow)
    /// skips the point rather than entering the summary.
    #[test]
    fn a_bad_sample_skips_the_point() {
        let p = Protocol {
            warmup: 0,
            timed: 2,
            keep: 1,
        };
        for bad in [f64::NAN, 0.0, -1.0, f64::INFINITY] {
            let mut r = Scripted {
                times: vec![1.0, bad],
                untimed: 0,
            };
            let outcome = measure(&p, &mut r);
            assert!(
                matches!(outcome, Err(DeviceError::Skip(_))),
                "{bad}: {outcome:?}"
            );
        }
    }

    /// Queues its timed runs together, as the CUDA device does; `extra` runs too many.
    struct BackToBack {
        batches: Vec<u32>,
        extra: usize,
    }

    impl Runnable for BackToBack {
        fn run(&mut self) -> Result<(), DeviceError> {
            Ok(())
        }
        fn run_timed(&mut self) -> Result<f64, DeviceError> {
            unreachable!("the protocol asks for its timed runs together")
        }
        fn run_timed_back_to_back(&mut self, n: u32) -> Result<Vec<f64>, DeviceError> {
            self.batches.push(n);
            Ok((0..n as usize + self.extra)
                .map(|i| 10.0 + i as f64)
                .collect())
        }
    }

    #[test]
    fn the_timed_runs_are_asked_for_together_and_counted() {
        let mut r = BackToBack {
            batches: Vec::new(),
            extra: 0,
        };
        let (samples, summary) = measure(&Protocol::default(), &mut r).unwrap();
        assert_eq!(r.batches, vec![10]);
        assert_eq!(samples.len(), 10);
        assert_eq!(summary, 14.0); // 10..19 sorted: the five from the third, 12..16
        let mut wrong = BackToBack {
            batches: Vec::new(),
            extra: 1,
        };
        assert!(matches!(
            measure(&Protocol::default(), &mut wrong),
            Err(DeviceError::Fatal(_))
        ));
    }

    #[test]
    fn throttling_is_flagged_from_clocks_or_reasons() {
        let t = Telemetry {
            sm_clock_mhz: 1980,
            max_sm_clock_mhz: 1980,
            temperature_c: 60,
            power_w: 500.0,
            throttle_reasons: 0,
        };
        assert!(!t.throttled());
        assert!(Telemetry {
            sm_clock_mhz: 1500,
            ..t
        }
        .throttled());
        assert!(Telemetry {
            throttle_reasons: 0x20,
            ..t
        }
        .throttled());
        assert!(!Telemetry {
            throttle_reasons: 0x1,
            ..t
        }
        .throttled()); // GPU idle
    }

    /// Each bound at its edge: at least one timed run and one kept, no more kept than timed, at
    /// most 10,000 runs of either kind (none of warm-up is fine).
    #[test]
    fn protocol_checks_its_numbers() {
        let valid = |warmup, timed, keep| {
            Protocol {
                warmup,
                timed,
                keep,
            }
            .validate()
            .is_ok()
        };
        assert!(Protocol::default().validate().is_ok());
        for (warmup, timed, keep, ok) in [
            (1, 3, 5, false),
            (0, 1, 1, true),
            (0, 0, 1, false),
            (10, 10, 0, false),
            (10, 10, 10, true),
            (10, 10, 11, false),
            (10_000, 10_000, 5, true),
            (10_001, 10, 5, false),
            (10, 10_001, 5, false),
        ] {
            assert_eq!(valid(warmup, timed, keep), ok, "{warmup}, {timed}, {keep}");
        }
    }
}

//! The whole training run: its length (tokens or steps) and how the cluster fails and recovers,
//! from the cluster file's `reliability:` / `storage:` sections (MoFa's figures by default) and
//! flags; and `stepcast ettr`, the same arithmetic for a step time you already know.

use clap::Args;

use stepcast::fault::{Reliability, RunInputs, RunOutcome, Storage};
use stepcast::hardware::Cluster;
use stepcast::search::RunSpec;

/// How the cluster fails and recovers (for `predict`, `search` and `ettr`).
#[derive(Debug, Args)]
pub struct FaultArgs {
    /// Failures per node per day [the cluster file's with predict and search; MoFa's 0.005].
    #[arg(long, allow_negative_numbers = true)]
    pub failures_per_node_day: Option<f64>,
    /// Mean time to recover from one failure, seconds [the cluster file's recovery levels with
    /// predict and search; MoFa's 0.3·141 + 0.6·262 + 0.1·307 = 230.2 s].
    #[arg(long, allow_negative_numbers = true)]
    pub recovery_s: Option<f64>,
    /// Steps between checkpoints [the interval that maximises ETTR].
    #[arg(long, allow_negative_numbers = true)]
    pub checkpoint_interval: Option<u64>,
    /// From submission to the first step, seconds [the cluster file's with predict and search;
    /// 600].
    #[arg(long, allow_negative_numbers = true)]
    pub first_start_s: Option<f64>,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Tokens to train on: adds the run's ETTR, end-to-end time and checkpoint interval.
    #[arg(long, conflicts_with = "steps", allow_negative_numbers = true)]
    pub tokens: Option<f64>,
    /// Steps to train (instead of --tokens).
    #[arg(long, allow_negative_numbers = true)]
    pub steps: Option<f64>,
    /// Checkpoint write bandwidth per node, GB/s (gigabytes) [the cluster file's; else 2].
    #[arg(
        long,
        alias = "checkpoint-write-gbps-per-node",
        allow_negative_numbers = true
    )]
    pub checkpoint_write_gb_per_s_per_node: Option<f64>,
    #[command(flatten)]
    pub fault: FaultArgs,
}

fn positive(name: &str, v: f64) -> anyhow::Result<f64> {
    if v > 0.0 && v.is_finite() {
        Ok(v)
    } else {
        anyhow::bail!(stepcast::Error::Invalid(format!(
            "{name} = {v} must be positive"
        )))
    }
}

impl FaultArgs {
    /// Reliability and storage: flags over the cluster file over the defaults.
    pub fn resolve(&self, cluster: Option<&Cluster>) -> anyhow::Result<(Reliability, Storage)> {
        let spec = cluster.map(|c| &c.spec);
        let mut r = spec.and_then(|s| s.reliability.clone()).unwrap_or_default();
        let s = spec.and_then(|s| s.storage).unwrap_or_default();
        if let Some(f) = self.failures_per_node_day {
            if !(f > 0.0 && f.is_finite()) {
                anyhow::bail!(stepcast::Error::Invalid(format!(
                    "--failures-per-node-day {f}: give a positive rate (a run that never fails \
                     needs no checkpoints; use a small value such as 0.001)"
                )));
            }
            r.failures_per_node_per_day = f;
        }
        if let Some(u) = self.recovery_s {
            if !(u >= 0.0 && u.is_finite()) {
                anyhow::bail!(stepcast::Error::Invalid(format!(
                    "--recovery-s {u} must be zero or positive"
                )));
            }
            r.recovery = vec![stepcast::fault::RecoveryLevel {
                level: "all".into(),
                share: 1.0,
                seconds: u,
            }];
        }
        if let Some(f) = self.first_start_s {
            if !(f >= 0.0 && f.is_finite()) {
                anyhow::bail!(stepcast::Error::Invalid(format!(
                    "--first-start-s {f} must be zero or positive"
                )));
            }
            r.first_start_s = f;
        }
        r.validate("reliability")
            .map_err(stepcast::Error::Invalid)?;
        s.validate("storage").map_err(stepcast::Error::Invalid)?;
        Ok((r, s))
    }
}

impl RunArgs {
    /// The first run flag given, which without --tokens or --steps would change nothing.
    fn unused_flag(&self) -> Option<&'static str> {
        let f = &self.fault;
        [
            (
                self.checkpoint_write_gb_per_s_per_node.is_some(),
                "--checkpoint-write-gb-per-s-per-node",
            ),
            (f.failures_per_node_day.is_some(), "--failures-per-node-day"),
            (f.recovery_s.is_some(), "--recovery-s"),
            (f.checkpoint_interval.is_some(), "--checkpoint-interval"),
            (f.first_start_s.is_some(), "--first-start-s"),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag))
    }

    /// The run, when --tokens or --steps was given; steps become tokens through
    /// `tokens_per_step`.
    pub fn spec(&self, cluster: &Cluster, tokens_per_step: f64) -> anyhow::Result<Option<RunSpec>> {
        let tokens = match (self.tokens, self.steps) {
            (Some(t), _) => positive("--tokens", t)?,
            (None, Some(s)) => positive("--steps", s)? * tokens_per_step,
            (None, None) => {
                if let Some(flag) = self.unused_flag() {
                    anyhow::bail!(stepcast::Error::Invalid(format!(
                        "{flag} sizes the whole training run, which needs its length: add \
                         --tokens N or --steps N, or drop {flag}"
                    )));
                }
                return Ok(None);
            }
        };
        let (reliability, mut storage) = self.fault.resolve(Some(cluster))?;
        if let Some(b) = self.checkpoint_write_gb_per_s_per_node {
            storage.checkpoint_write_gb_per_s_per_node =
                positive("--checkpoint-write-gb-per-s-per-node", b)?;
            storage
                .validate("--checkpoint-write-gb-per-s-per-node")
                .map_err(stepcast::Error::Invalid)?;
        }
        Ok(Some(RunSpec {
            tokens,
            reliability,
            storage,
            checkpoint_interval: self.fault.checkpoint_interval,
        }))
    }
}

/// Days, hours or seconds, whichever reads best.
pub fn duration(s: f64) -> String {
    if s >= 2.0 * 86_400.0 {
        format!("{:.2} days", s / 86_400.0)
    } else if s >= 2.0 * 3600.0 {
        format!("{:.2} h", s / 3600.0)
    } else {
        format!("{s:.0} s")
    }
}

pub fn describe_run(o: &RunOutcome, steps: f64, save_s: f64) -> String {
    let interval = if o.checkpoint_interval == o.optimal_interval {
        format!("every {} steps (optimal)", o.checkpoint_interval)
    } else {
        format!(
            "every {} steps (optimal: {}, ETTR {:.2} %)",
            o.checkpoint_interval,
            o.optimal_interval,
            100.0 * o.optimal_ettr
        )
    };
    format!(
        "{steps:.0} steps, {} of training; ETTR {:.2} % with a checkpoint {interval} of {save_s:.1} s; \
         end to end {} with {:.1} failures expected",
        duration(o.training_s),
        100.0 * o.ettr,
        duration(o.end_to_end_s),
        o.failures
    )
}

#[derive(Debug, Args)]
pub struct EttrArgs {
    /// Seconds per training step.
    #[arg(long, allow_negative_numbers = true)]
    pub step_s: f64,
    /// Steps in the run.
    #[arg(long, allow_negative_numbers = true)]
    pub steps: f64,
    /// Nodes the job runs on.
    #[arg(long, allow_negative_numbers = true)]
    pub nodes: f64,
    /// Seconds to write one checkpoint.
    #[arg(long, allow_negative_numbers = true)]
    pub save_s: f64,
    #[command(flatten)]
    pub fault: FaultArgs,
    /// Print the inputs and the outcome as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run_ettr(args: EttrArgs) -> anyhow::Result<()> {
    let (r, _) = args.fault.resolve(None)?;
    let inputs = RunInputs {
        step_s: args.step_s,
        steps: args.steps,
        nodes: args.nodes,
        failures_per_node_per_day: r.failures_per_node_per_day,
        mean_recovery_s: r.mean_recovery_s(),
        save_s: args.save_s,
        first_start_s: r.first_start_s,
    };
    let o = inputs.outcome(args.fault.checkpoint_interval)?;
    if args.json {
        let doc = serde_json::json!({"inputs": inputs, "outcome": o});
        return super::stamp::print(&doc, Vec::new());
    }
    println!(
        "{} nodes × {} failures/day, mean recovery {:.2} s, checkpoint {:.2} s, step {:.3} s",
        args.nodes,
        inputs.failures_per_node_per_day,
        inputs.mean_recovery_s,
        args.save_s,
        args.step_s
    );
    println!("{}", describe_run(&o, args.steps, args.save_s));
    println!(
        "ETTR {:.4} %, end to end {:.2} s (training {:.2} s, first start {:.0} s)",
        100.0 * o.ettr,
        o.end_to_end_s,
        o.training_s,
        inputs.first_start_s
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::test_support::dgx_h100;

    fn no_faults() -> FaultArgs {
        FaultArgs {
            failures_per_node_day: None,
            recovery_s: None,
            checkpoint_interval: None,
            first_start_s: None,
        }
    }

    fn run(tokens: Option<f64>, steps: Option<f64>) -> RunArgs {
        RunArgs {
            tokens,
            steps,
            checkpoint_write_gb_per_s_per_node: None,
            fault: no_faults(),
        }
    }

    #[test]
    fn durations_read_in_seconds_hours_or_days() {
        assert_eq!(duration(7199.0), "7199 s");
        assert_eq!(duration(7200.0), "2.00 h");
        assert_eq!(duration(172_799.0), "48.00 h");
        assert_eq!(duration(172_800.0), "2.00 days");
    }

    #[test]
    fn a_run_is_described_with_its_interval_against_the_optimal_one() {
        let mut o = RunOutcome {
            checkpoint_interval: 500,
            ettr: 0.9512,
            training_s: 3.0 * 86_400.0,
            end_to_end_s: 3.2 * 86_400.0,
            failures: 4.25,
            optimal_interval: 500,
            optimal_ettr: 0.9512,
        };
        assert_eq!(
            describe_run(&o, 1e5, 12.34),
            "100000 steps, 3.00 days of training; ETTR 95.12 % with a checkpoint every 500 steps \
             (optimal) of 12.3 s; end to end 3.20 days with 4.2 failures expected"
        );
        o.checkpoint_interval = 100;
        assert!(describe_run(&o, 1e5, 12.34)
            .contains("every 100 steps (optimal: 500, ETTR 95.12 %) of 12.3 s"));
    }

    /// Flags over the cluster file over MoFa's defaults; each flag bounded.
    #[test]
    fn fault_flags_override_the_cluster_file() {
        let cluster = dgx_h100();
        let (r, s) = no_faults().resolve(Some(&cluster)).unwrap();
        assert_eq!(r, cluster.spec.reliability.clone().unwrap());
        assert_eq!(r.failures_per_node_per_day, 0.0038);
        assert_eq!(s, Storage::default());
        assert_eq!(no_faults().resolve(None).unwrap().0, Reliability::default());
        let given = FaultArgs {
            failures_per_node_day: Some(0.01),
            recovery_s: Some(0.0),
            checkpoint_interval: Some(7),
            first_start_s: Some(0.0),
        };
        let (r, _) = given.resolve(Some(&cluster)).unwrap();
        assert_eq!(r.failures_per_node_per_day, 0.01);
        assert_eq!(r.mean_recovery_s(), 0.0);
        assert_eq!(r.recovery.len(), 1);
        assert_eq!(r.first_start_s, 0.0);
        let refused = |f: FaultArgs| f.resolve(None).unwrap_err().to_string();
        for bad in [0.0, -1.0, f64::INFINITY] {
            let e = refused(FaultArgs {
                failures_per_node_day: Some(bad),
                ..no_faults()
            });
            assert!(e.contains("give a positive rate"), "{e}");
        }
        for bad in [-1.0, f64::NAN] {
            let e = refused(FaultArgs {
                recovery_s: Some(bad),
                ..no_faults()
            });
            assert!(e.contains("must be zero or positive"), "{e}");
            let e = refused(FaultArgs {
                first_start_s: Some(bad),
                ..no_faults()
            });
            assert!(e.contains("--first-start-s"), "{e}");
        }
    }

    /// --steps become tokens through the step's tokens; run flags without a run's length are
    /// refused by name.
    #[test]
    fn a_run_s_length_in_tokens_or_steps() {
        let cluster = dgx_h100();
        assert!(run(None, None).spec(&cluster, 1e6).unwrap().is_none());
        let by_steps = run(None, Some(100.0))
            .spec(&cluster, 4096.0)
            .unwrap()
            .unwrap();
        assert_eq!(by_steps.tokens, 409_600.0);
        let by_tokens = run(Some(1e9), None)
            .spec(&cluster, 4096.0)
            .unwrap()
            .unwrap();
        assert_eq!(by_tokens.tokens, 1e9);
        assert_eq!(
            by_tokens.reliability,
            cluster.spec.reliability.clone().unwrap()
        );
        assert_eq!(by_tokens.checkpoint_interval, None);
        for bad in [0.0, -5.0, f64::NAN] {
            let e = run(Some(bad), None)
                .spec(&cluster, 1.0)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("--tokens") && e.contains("must be positive"),
                "{e}"
            );
            let e = run(None, Some(bad))
                .spec(&cluster, 1.0)
                .unwrap_err()
                .to_string();
            assert!(e.contains("--steps"), "{e}");
        }
        let mut bandwidth = run(Some(1e9), None);
        bandwidth.checkpoint_write_gb_per_s_per_node = Some(5.0);
        let spec = bandwidth.spec(&cluster, 1.0).unwrap().unwrap();
        assert_eq!(spec.storage.checkpoint_write_gb_per_s_per_node, 5.0);
        bandwidth.checkpoint_write_gb_per_s_per_node = Some(0.0);
        assert!(bandwidth.spec(&cluster, 1.0).is_err());
        let given = |set: fn(&mut RunArgs)| {
            let mut a = run(None, None);
            set(&mut a);
            a
        };
        for (flag, args) in [
            (
                "--checkpoint-write-gb-per-s-per-node",
                given(|a| a.checkpoint_write_gb_per_s_per_node = Some(5.0)),
            ),
            (
                "--failures-per-node-day",
                given(|a| a.fault.failures_per_node_day = Some(0.1)),
            ),
            ("--recovery-s", given(|a| a.fault.recovery_s = Some(10.0))),
            (
                "--checkpoint-interval",
                given(|a| a.fault.checkpoint_interval = Some(10)),
            ),
            (
                "--first-start-s",
                given(|a| a.fault.first_start_s = Some(10.0)),
            ),
        ] {
            let e = args.spec(&cluster, 1.0).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("{flag} sizes the whole training run"))
                    && e.ends_with(&format!("or drop {flag}")),
                "{e}"
            );
        }
    }
}

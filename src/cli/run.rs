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

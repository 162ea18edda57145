//! `stepcast-bench`: the GPU harness behind `stepcast bench`, `stepcast models check` and
//! `stepcast retrain` (the `stepcast` CLI runs this binary, which sits beside it).
//!
//! It is a binary of its own because of the direction of dependencies: the harness uses the
//! core's dataset schema, operators, statistics and decomposition, while the core must never
//! link GPU code; `stepcast` finds `stepcast-bench` beside itself or on PATH.

use std::path::PathBuf;

use anyhow::Context;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use stepcast::dataset::Dataset;
use stepcast::hardware::Cluster;
use stepcast::ops::OpKind;
use stepcast::provenance::{digest, Input, Provenance};
use stepcast_profiler::collect::{collect, CollectOptions};
use stepcast_profiler::device::{self, mock::MockDevice, null::NullDevice, Device, Launch};
use stepcast_profiler::drift::{check, retrain, target_of, DriftReport};
use stepcast_profiler::plan::{PlanSpec, Target};
use stepcast_profiler::protocol::Protocol;
use stepcast_profiler::torch::TorchBackend;

#[derive(Debug, Parser)]
#[command(
    name = "stepcast-bench",
    version,
    about = "Time operators on one GPU node into a stepcast dataset"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum DeviceKind {
    /// cuBLASLt GEMMs and NCCL collectives in-process (needs the `cuda` build), PyTorch for the rest.
    Cuda,
    /// Everything through the node's PyTorch (GEMMs via torch.bmm); collectives are skipped.
    Torch,
    /// A TEST DOUBLE with synthetic timings (for trying the workflow; never publish its data).
    Mock,
}

#[derive(Debug, clap::Args)]
struct PlanArgs {
    /// Plan file (YAML); default: the built-in default plan.
    #[arg(long, conflicts_with = "quick")]
    plan: Option<PathBuf>,
    /// The built-in quick probe plan.
    #[arg(long)]
    quick: bool,
    /// Untimed runs before the timed ones (default: the plan's, 10).
    #[arg(long)]
    warmup: Option<u32>,
    /// Timed runs, each bracketed by device events (default: the plan's, 10).
    #[arg(long)]
    timed: Option<u32>,
    /// Middle samples of the sorted timed runs averaged into the summary (default: 5).
    #[arg(long)]
    keep: Option<u32>,
}

impl PlanArgs {
    fn spec(&self) -> anyhow::Result<PlanSpec> {
        let mut spec = match &self.plan {
            Some(p) => PlanSpec::load(p)?,
            None => PlanSpec::builtin(self.quick),
        };
        let p = &mut spec.protocol;
        *p = Protocol {
            warmup: self.warmup.unwrap_or(p.warmup),
            timed: self.timed.unwrap_or(p.timed),
            keep: self.keep.unwrap_or(p.keep),
        };
        spec.validate().map_err(stepcast::Error::Invalid)?;
        Ok(spec)
    }
}

#[derive(Debug, clap::Args)]
struct DeviceArgs {
    /// What times the operators: cuda, torch or mock.
    #[arg(long, value_enum, default_value = "cuda")]
    device: DeviceKind,
    /// GPUs to use, e.g. 0,1,2,3 (default: all).
    #[arg(long, value_delimiter = ',')]
    gpus: Option<Vec<usize>>,
    /// Python with the node's PyTorch.
    #[arg(long, default_value = "python3")]
    python: String,
    /// SDPA backend for attention: auto (flash, then cuDNN, then memory-efficient), flash,
    /// cudnn or efficient.
    #[arg(long, default_value = "auto")]
    attention_backend: String,
    /// Directory on a shared file system for NCCL ids when launched on several nodes.
    #[arg(long)]
    rendezvous: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// Mock device only: milliseconds each point takes (to exercise interruptions).
    #[arg(long, default_value_t = 0, hide = true)]
    mock_point_ms: u64,
    /// Mock device only: an operator kind made slower, e.g. gemm=1.3 (to exercise drift).
    #[arg(long, value_parser = mock_slowdown, hide = true)]
    mock_slowdown: Vec<(OpKind, f64)>,
}

/// What `--device` opened: the timing device, the PyTorch backend for the kernels only PyTorch
/// runs, and the multi-node launch it belongs to.
struct Opened {
    device: Box<dyn Device>,
    torch: Option<TorchBackend>,
    launch: Option<Launch>,
}

impl DeviceArgs {
    fn open(&self) -> anyhow::Result<Opened> {
        if let Some(gpus) = &self.gpus {
            let mut sorted = gpus.clone();
            sorted.sort_unstable();
            if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
                // two ranks on one GPU: NCCL refuses the communicator, a timing would be halved
                anyhow::bail!(stepcast::Error::Invalid(format!(
                    "--gpus lists GPU {} twice: give each GPU once",
                    w[0]
                )));
            }
        }
        let launch =
            Launch::from_env(self.rendezvous.as_deref()).map_err(stepcast::Error::Invalid)?;
        let torch = |gemms| TorchBackend {
            python: self.python.clone(),
            device: self
                .gpus
                .as_ref()
                .and_then(|g| g.first().copied())
                .unwrap_or(0),
            attention_backend: self.attention_backend.clone(),
            gemms,
            temp_root: None,
        };
        Ok(match self.device {
            DeviceKind::Cuda => {
                device::cuda::ensure_nccl_loadable();
                Opened {
                    device: device::cuda::open(self.gpus.clone(), launch.clone())?,
                    torch: Some(torch(false)),
                    launch,
                }
            }
            DeviceKind::Torch => Opened {
                device: Box::new(NullDevice::probe(&self.python, torch(true).device)?),
                torch: Some(torch(true)),
                launch: None,
            },
            DeviceKind::Mock => {
                let n = self.gpus.as_ref().map_or(8, |g| g.len() as u32);
                let mut mock = MockDevice::new(n);
                mock.point_delay = std::time::Duration::from_millis(self.mock_point_ms.min(10_000));
                mock.slowdown = self.mock_slowdown.clone();
                Opened {
                    device: Box::new(mock),
                    torch: None,
                    launch,
                }
            }
        })
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Time a plan's operators into a dataset directory (appended and flushed row by row).
    Collect {
        #[command(flatten)]
        plan: PlanArgs,
        #[command(flatten)]
        device: DeviceArgs,
        /// Dataset directory, e.g. datasets/h100-sxm/2026-11-22.
        #[arg(long)]
        out: PathBuf,
        /// Continue an interrupted collection in --out, skipping what it holds.
        #[arg(long)]
        resume: bool,
        /// With --resume, measure the skipped points again.
        #[arg(long)]
        retry_skipped: bool,
    },
    /// Print what a plan times and roughly how long it takes.
    Plan {
        #[command(flatten)]
        plan: PlanArgs,
        /// GPUs per node the plan is expanded for.
        #[arg(long, default_value_t = 8)]
        gpus: u32,
        /// Nodes the plan is expanded for (collectives spanning them).
        #[arg(long, default_value_t = 1)]
        nodes: u32,
        /// Whether the GPU has FP8 tensor cores.
        #[arg(long)]
        fp8: bool,
        /// Print the plan as JSON: the summary and every point.
        #[arg(long)]
        json: bool,
    },
    /// Compare this machine with the models of a cluster file: software stamp, and a probe
    /// measured against the models' collection at the same points (--previous) or the quick
    /// probe plan against the models' predictions. Exit code 3 when something drifted.
    Check {
        /// The cluster file whose models are checked, e.g. hardware-profiles/dgx-h100.yaml.
        #[arg(long)]
        cluster: PathBuf,
        #[command(flatten)]
        device: DeviceArgs,
        /// The dataset the models were trained from: the probe times a sample of its points
        /// (12 of each kind, phase and type, smallest to largest) with its protocol, each
        /// compared with the time it measured then, so the models' own error does not read as
        /// drift.
        #[arg(long)]
        previous: Option<PathBuf>,
        /// Drift (the median of measured / reference off by more than this many percent) that
        /// counts.
        #[arg(long, default_value_t = 10.0, value_parser = drift_threshold)]
        threshold: f64,
        /// Where the probe measurements go (default: a private temporary directory, removed).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Print the report as JSON, stamped with its inputs, instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Re-collect the operator kinds that drifted and retrain the cluster's models.
    Retrain {
        /// The cluster file whose models are retrained, e.g. hardware-profiles/dgx-h100.yaml.
        #[arg(long)]
        cluster: PathBuf,
        #[command(flatten)]
        device: DeviceArgs,
        #[command(flatten)]
        plan: PlanArgs,
        /// The dataset the current models were trained from (another is refused): the probe
        /// times a sample of its points against its times, rows of kinds that did not drift are
        /// carried over, and the drifted kinds are re-measured at its points, the coverage the
        /// models had (the plan then sets the protocol, and the points of a kind it holds no
        /// rows of).
        #[arg(long)]
        previous: Option<PathBuf>,
        /// New dataset directory.
        #[arg(long)]
        out: PathBuf,
        /// Drift (the median of measured / reference off by more than this many percent) that
        /// re-collects a kind.
        #[arg(long, default_value_t = 10.0, value_parser = drift_threshold)]
        threshold: f64,
    },
}

/// `--threshold`: a percentage the median of measured / reference may be off by, above 0 (a
/// threshold of 0 would drift on the timer's noise) and at most 1000.
fn drift_threshold(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 1000.0 => Ok(v),
        _ => Err(format!(
            "{s}: give a percentage above 0 and at most 1000, e.g. 10"
        )),
    }
}

/// `--mock-slowdown KIND=FACTOR`: the mock's times of one operator kind times 0.01 to 100.
fn mock_slowdown(s: &str) -> Result<(OpKind, f64), String> {
    let (kind, factor) = s
        .split_once('=')
        .ok_or_else(|| format!("{s}: give KIND=FACTOR, e.g. gemm=1.3"))?;
    let kind: OpKind = kind.parse()?;
    match factor.parse::<f64>() {
        Ok(f) if (0.01..=100.0).contains(&f) => Ok((kind, f)),
        _ => Err(format!(
            "{s}: give a factor from 0.01 to 100, e.g. gemm=1.3"
        )),
    }
}

fn main() {
    // a closed stdout (`stepcast bench plan | head`) ends the program quietly, as other
    // command-line tools do, instead of panicking in println!
    #[cfg(unix)]
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // the core's version and commit: the harness is built from the same checkout
    let version = format!(
        "{} (commit {})",
        stepcast::provenance::VERSION,
        stepcast::provenance::COMMIT
    );
    let matches = Cli::command().version(version).get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let result = run(cli);
    device::cuda::remove_nccl_shim();
    match result {
        Ok(code) => std::process::exit(code),
        Err(err) => {
            eprintln!("error: {err:#}");
            let user = err
                .chain()
                .any(|c| c.downcast_ref::<stepcast::Error>().is_some());
            std::process::exit(if user { 2 } else { 1 });
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Plan {
            plan,
            gpus,
            nodes,
            fp8,
            json,
        } => {
            let spec = plan.spec()?;
            let expanded = spec.expand(Target {
                gpus_per_node: gpus,
                nodes,
                fp8,
            })?;
            let gpu = stepcast::hardware::GpuSpec::builtin("h100").expect("in the catalogue");
            if json {
                let operators: Vec<_> = expanded
                    .summary(&gpu, 15.0)
                    .into_iter()
                    .map(|(kind, points, s)| {
                        serde_json::json!({"operator": kind.name(), "points": points, "estimated_s_h100": s})
                    })
                    .collect();
                let doc = serde_json::json!({
                    "plan": spec,
                    "gpus_per_node": gpus,
                    "nodes": nodes,
                    "fp8": fp8,
                    "operators": operators,
                    "estimated_s_h100": expanded.estimated_seconds(&gpu, 15.0),
                    "estimate_assumes": "runs at 60 % of the roofline, collectives at 300 GB/s, 15 ms of set-up per point",
                    "points": expanded.points,
                });
                let input = plan_input(&plan);
                println!("{}", stamped(&doc, vec![input])?);
                return Ok(0);
            }
            println!(
                "plan '{}': {} points ({} GPUs per node, {} nodes)",
                spec.name,
                expanded.points.len(),
                gpus,
                nodes
            );
            println!(
                "  {:<20} {:>6} {:>12}",
                "operator", "points", "est. s (H100)"
            );
            for (kind, n, secs) in expanded.summary(&gpu, 15.0) {
                println!("  {:<20} {n:>6} {secs:>12.0}", kind.name());
            }
            println!(
                "estimated time on an H100: {:.1} min (runs at 60 % of the roofline, collectives at \
                 300 GB/s, 15 ms of set-up per point)",
                expanded.estimated_seconds(&gpu, 15.0) / 60.0
            );
            if !fp8 && spec.dtypes.contains(&stepcast::ops::Dtype::Fp8) {
                println!(
                    "fp8 points are left out: give --fp8 to plan them as on a GPU with FP8 \
                     tensor cores (collect decides from the GPU it runs on)"
                );
            }
            Ok(0)
        }
        Command::Collect {
            plan,
            device,
            out,
            resume,
            retry_skipped,
        } => {
            let spec = plan.spec()?;
            let Opened {
                device: mut dev,
                torch,
                launch,
            } = device.open()?;
            let nodes = launch.as_ref().map_or(1, |l| l.nodes as u32);
            let expanded = spec.expand(target_of(dev.as_ref(), nodes))?;
            let info = dev.info();
            if !info.real {
                eprintln!("warning: the mock device is a test double: its timings are synthetic, never publish them");
            }
            eprintln!(
                "collecting plan '{}' ({} points) on {} × {} into {}",
                spec.name,
                expanded.points.len(),
                info.gpus,
                info.gpu.name,
                out.display()
            );
            let report = collect(
                &expanded,
                dev.as_mut(),
                torch.as_ref(),
                &CollectOptions {
                    out: out.clone(),
                    resume,
                    retry_skipped,
                    progress: !device.quiet,
                    launch,
                },
            )?;
            if report.repaired_bytes > 0 {
                println!(
                    "dropped a partial last row ({} bytes) left by the interruption",
                    report.repaired_bytes
                );
            }
            println!(
                "{} points measured, {} already in {}, {} skipped, {} with throttled clocks, in {:.0} s",
                report.measured,
                report.already_done,
                out.display(),
                report.skipped.iter().map(|(_, n)| n).sum::<usize>(),
                report.throttled,
                report.seconds
            );
            for (why, n) in &report.skipped {
                println!("  skipped {n} × {why}");
            }
            Ok(0)
        }
        Command::Check {
            cluster,
            device,
            previous,
            threshold,
            out,
            json,
        } => {
            let cluster = Cluster::load(&cluster)?;
            let previous = previous.as_deref().map(Dataset::load).transpose()?;
            let Opened {
                device: mut dev,
                torch,
                ..
            } = device.open()?;
            let report = check(
                &cluster,
                dev.as_mut(),
                torch.as_ref(),
                previous.as_ref(),
                out.as_deref(),
                threshold,
                !device.quiet,
            )?;
            if json {
                let mut inputs = vec![Input::new(
                    "cluster",
                    cluster.path.display().to_string(),
                    cluster.digest.clone(),
                )];
                if let Some(d) = &previous {
                    inputs.push(Input::new(
                        "previous dataset",
                        d.dir.display().to_string(),
                        Some(d.fingerprint.clone()),
                    ));
                }
                println!("{}", stamped(&report, inputs)?);
            } else {
                print_drift(&report);
            }
            Ok(if report.drifted_kinds().is_empty() {
                0
            } else {
                3
            })
        }
        Command::Retrain {
            cluster,
            device,
            plan,
            previous,
            out,
            threshold,
        } => {
            let cluster = Cluster::load(&cluster)?;
            let spec = plan.spec()?;
            let Opened {
                device: mut dev,
                torch,
                ..
            } = device.open()?;
            let r = retrain(
                &cluster,
                dev.as_mut(),
                torch.as_ref(),
                previous.as_deref(),
                &out,
                &spec,
                threshold,
                !device.quiet,
            )
            .context("retraining")?;
            print_drift(&r.drift);
            if previous.is_none() && !r.recollected.is_empty() {
                println!(
                    "no --previous dataset to carry the kinds that did not drift from: every \
                     kind is re-collected"
                );
            }
            if r.recollected.is_empty() {
                println!("nothing drifted past {threshold} %: the models are kept");
            } else {
                let kinds: Vec<&str> = r.recollected.iter().map(|k| k.name()).collect();
                let at = match (r.points_from_previous, r.points - r.points_from_previous) {
                    (0, plan) => format!("the plan's {plan} points"),
                    (previous, 0) => format!("the previous dataset's {previous} points"),
                    (previous, plan) => format!(
                        "the previous dataset's {previous} points and the plan's {plan} (kinds \
                         it holds no rows of)"
                    ),
                };
                let unmeasurable = match r.carried_unmeasurable {
                    0 => String::new(),
                    n => format!(
                        ", {n} of them of re-collected kinds not measured again here: another \
                         attention kernel than this run's, a point skipped now, or more GPUs, \
                         nodes or fp8 than this node has"
                    ),
                };
                println!(
                    "re-collected {} at {at} into {} ({} rows carried over{unmeasurable}), retrained {} (previous models kept in {})",
                    kinds.join(", "),
                    out.display(),
                    r.carried_rows,
                    r.models_dir.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
                    r.previous_models.as_ref().map(|p| p.display().to_string()).unwrap_or_default()
                );
            }
            Ok(0)
        }
    }
}

/// The plan a command used: its file, with a digest, or the built-in one.
fn plan_input(p: &PlanArgs) -> Input {
    match &p.plan {
        Some(path) => Input::new(
            "plan",
            path.display().to_string(),
            std::fs::read(path).ok().map(|b| digest(&b)),
        ),
        None if p.quick => Input::new("plan", "<built-in quick>", None),
        None => Input::new("plan", "<built-in default>", None),
    }
}

/// `value` as a JSON document stamped with this run's provenance (see `stepcast::provenance`).
fn stamped(value: &impl serde::Serialize, inputs: Vec<Input>) -> anyhow::Result<String> {
    let value = Provenance::of_this_run(inputs).stamp(serde_json::to_value(value)?);
    Ok(serde_json::to_string_pretty(&value)?)
}

fn print_drift(r: &DriftReport) {
    match &r.probe_dataset {
        Some(probe) => println!("models {} — probe measurements in {probe}", r.models),
        None => println!("models {} — probe measurements not kept", r.models),
    }
    match &r.previous_dataset {
        Some(previous) => {
            println!("probe: points of {previous}, each against the time it measured then")
        }
        None => println!(
            "probe: the quick plan against the models' predictions (they were trained from \
             dataset '{}': --previous <its directory> compares with its own times instead)",
            r.models_dataset
        ),
    }
    if r.software_changes.is_empty() {
        println!("software: same as the models' (where both are known)");
    }
    for (field, theirs, ours) in &r.software_changes {
        println!("software: {field} {theirs} → {ours}");
    }
    println!(
        "{:<22} {:>5} {:>7} {:>10} {:>14} {:>8}  drift",
        "operator", "phase", "probes", "against", "measured/ref", "MAPE %"
    );
    for k in &r.kinds {
        println!(
            "{:<22} {:>5} {:>7} {:>10} {:>14.3} {:>8.2}  {}",
            k.op.name(),
            k.phase.name(),
            k.points,
            k.against.name(),
            k.median_ratio,
            k.mape_percent,
            if k.drifted {
                format!("DRIFTED (> {} %)", r.threshold_percent)
            } else {
                String::new()
            }
        );
    }
    if r.unmodelled > 0 {
        println!(
            "{} probes have no learned model nor a row of the collection and were not compared",
            r.unmodelled
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every argument of every command, all the way down, without a `--help` line.
    fn arguments_without_help(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
        for arg in command.get_arguments() {
            let builtin = matches!(arg.get_id().as_str(), "help" | "version");
            if !builtin && arg.get_help().is_none() && arg.get_long_help().is_none() {
                missing.push(format!("{path} {}", arg.get_id()));
            }
        }
        for sub in command.get_subcommands() {
            arguments_without_help(sub, &format!("{path} {}", sub.get_name()), missing);
        }
    }

    /// `stepcast-bench check -h` (and `stepcast models check --help`, which shows it) lists
    /// every flag with a line saying what it is.
    #[test]
    fn every_argument_of_every_command_says_what_it_is() {
        let mut missing = Vec::new();
        arguments_without_help(&Cli::command(), "stepcast-bench", &mut missing);
        assert!(missing.is_empty(), "arguments without help: {missing:?}");
    }

    #[test]
    fn a_threshold_is_a_percentage_above_zero() {
        for ok in ["10", "0.5", "1000"] {
            assert_eq!(drift_threshold(ok), Ok(ok.parse().unwrap()));
        }
        for bad in ["0", "-5", "1000.5", "nan", "inf", "ten"] {
            let e = drift_threshold(bad).unwrap_err();
            assert!(e.contains("above 0 and at most 1000"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_mock_slowdown_is_a_kind_and_a_bounded_factor() {
        assert_eq!(mock_slowdown("gemm=1.3"), Ok((OpKind::Gemm, 1.3)));
        assert_eq!(mock_slowdown("rmsnorm=0.01"), Ok((OpKind::RmsNorm, 0.01)));
        for (bad, says) in [
            ("gemm", "KIND=FACTOR"),
            ("gemm=0", "from 0.01 to 100"),
            ("gemm=101", "from 0.01 to 100"),
            ("warp=2", "warp"),
        ] {
            let e = mock_slowdown(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}

//! `stepcast predict`: the job (flags or `--job`), the models, and what to write besides the
//! summary (JSON, a Perfetto trace, an SVG breakdown).

use std::path::{Path, PathBuf};

use clap::Args;

use super::layout::{describe, rules_name, JobArgs};
use super::output::{align_numbers, share, table};
use stepcast::export::{runs_as_costed_on, Framework};
use stepcast::plan::Issue;
use stepcast::predict::cost::CostModel;
use stepcast::predict::{predict, OperatorReport, PredictOptions, Prediction};

#[derive(Debug, Args)]
pub struct PredictArgs {
    #[command(flatten)]
    pub job: JobArgs,
    /// Models directory to use instead of the cluster file's.
    #[arg(long)]
    pub models: Option<PathBuf>,
    /// Fail instead of falling back to the roofline or an uncalibrated analytic estimate.
    #[arg(long)]
    pub strict: bool,
    /// Compose with the cluster's default runtime (raw physics), not the calibration fitted
    /// to measured runs.
    #[arg(long)]
    pub no_calibration: bool,
    /// Print the prediction as JSON.
    #[arg(long)]
    pub json: bool,
    /// Also list every operator call of the slowest stage.
    #[arg(long)]
    pub operators: bool,
    /// Write the simulated step as a Chrome/Perfetto trace (open in ui.perfetto.dev).
    #[arg(long, value_name = "FILE.json")]
    pub trace: Option<PathBuf>,
    /// Write an SVG chart of how each pipeline rank spends the step.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Write a self-contained HTML report (summary, breakdown, timeline, memory).
    #[arg(long, value_name = "FILE.html")]
    pub html: Option<PathBuf>,
    #[command(flatten)]
    pub run: super::run::RunArgs,
}

pub fn run(args: PredictArgs) -> anyhow::Result<()> {
    let job = args.job.resolve()?;
    if args.trace.is_some() && job.layout.schedule == stepcast::workload::Schedule::ClosedForm {
        anyhow::bail!(stepcast::Error::Invalid(
            "--trace needs a simulated schedule; the closed form has no timeline: add --schedule \
             1f1b (or gpipe, interleaved, zb-h1)"
                .into()
        ));
    }
    let cluster = &job.cluster;
    let models = super::layout::open_models(args.models.as_deref(), cluster)?;
    let mut inputs = job.inputs.clone();
    inputs.extend(models.as_ref().map(super::stamp::models));
    let models_dir = models.as_ref().map(|m| m.dir.clone());
    let cost = CostModel::new(cluster, models)
        .with_transfer(super::layout::open_transfer(cluster)?)
        .with_collectives(super::layout::open_collectives(cluster)?)
        .with_framework(job.framework.as_deref());
    let cost = if args.no_calibration {
        cost.uncalibrated()
    } else {
        cost
    };
    let prediction = predict(
        &job.arch,
        &job.layout,
        cluster,
        &cost,
        PredictOptions {
            strict: args.strict,
        },
    )?;
    let graphs = super::graphs::advice(
        &job.arch,
        &job.layout,
        cluster,
        &cost,
        job.framework.as_deref(),
        prediction.metrics.step_time_s,
    )?;
    let title = format!(
        "{} on {}: tp {} pp {} dp {}, {} micro-batches of {}",
        prediction.model,
        prediction.cluster,
        job.layout.tp,
        job.layout.pp,
        job.layout.dp,
        job.layout.micro_batches,
        job.layout.micro_batch
    );
    if let (Some(path), Some((work, _))) = (&args.trace, &prediction.timeline) {
        stepcast::fsutil::write_atomic_with(path, |w| {
            stepcast::schedule::trace::write_trace(w, work, &title).map(|_| ())
        })?;
    }
    if let Some(path) = &args.plot {
        let svg = super::plot::breakdown_svg(&prediction, &title);
        stepcast::fsutil::write_atomic(path, svg.as_bytes())?;
    }
    if let Some(path) = &args.html {
        let html = super::report::prediction_page(&prediction, &title)?;
        stepcast::fsutil::write_atomic(path, html.as_bytes())?;
    }
    let tokens_per_step = job.layout.tokens_per_step() as f64;
    let run = match args.run.spec(cluster, tokens_per_step)? {
        Some(spec) => Some(spec.outcome(
            &job.arch,
            &job.layout,
            cluster.spec.gpus_per_node as u64,
            prediction.metrics.step_time_s,
        )?),
        None => None,
    };
    let runs_on = runs_as_costed_on(
        &job.arch,
        &job.layout,
        job.cluster.spec.gpus_per_node as u64,
    );
    if args.json {
        let mut value = serde_json::to_value(&prediction)?;
        value["runs_as_costed_on"] = serde_json::to_value(&runs_on)?;
        if let Some((outcome, save_s)) = &run {
            value["run"] = serde_json::json!({"outcome": outcome, "checkpoint_save_s": save_s});
        }
        if let Some(g) = &graphs {
            value["cuda_graphs_advice"] = serde_json::to_value(g)?;
        }
        super::stamp::print(&value, inputs)?;
    } else {
        print_prediction(&prediction, &job, models_dir.as_deref(), args.operators);
        if let Some(g) = &graphs {
            println!("cuda graphs   {}", g.describe("this step"));
        }
        println!("frameworks    {}", describe_frameworks(&runs_on));
        if let Some((o, save_s)) = &run {
            let steps = (o.training_s / prediction.metrics.step_time_s).round();
            println!(
                "run           {}",
                super::run::describe_run(o, steps, *save_s)
            );
        }
        for (what, path) in [
            ("trace", &args.trace),
            ("plot", &args.plot),
            ("HTML report", &args.html),
        ] {
            if let Some(p) = path {
                println!("{what} written to {}", p.display());
            }
        }
    }
    Ok(())
}

/// The `frameworks` line: who runs the layout as costed, or that none of them does.
fn describe_frameworks(runs_on: &[Framework]) -> String {
    let names = |fs: &[Framework]| fs.iter().map(|f| f.name()).collect::<Vec<_>>().join(", ");
    if runs_on.is_empty() {
        format!(
            "none of {} runs this layout as costed (`stepcast export --format F` says why)",
            names(Framework::ALL)
        )
    } else {
        format!(
            "runs as costed on {} (`stepcast export --format F` writes its launch)",
            names(runs_on)
        )
    }
}

fn print_prediction(
    p: &Prediction,
    job: &super::layout::Job,
    models_dir: Option<&Path>,
    operators: bool,
) {
    let l = &p.layout;
    println!(
        "{} on {} ({}), {} rules",
        p.model,
        p.cluster,
        p.gpu,
        rules_name(l.rules)
    );
    println!("{}", describe(job));
    match models_dir {
        Some(d) if p.models_dir.is_some() => println!("models   {}", d.display()),
        Some(d) => println!(
            "models   none at {} — every kernel from the roofline",
            d.display()
        ),
        None => println!("models   none configured — every kernel from the roofline"),
    }
    if p.models_dir.is_none() {
        use stepcast::predict::cost::{ROOFLINE_BAND, ROOFLINE_MEDIAN};
        println!(
            "         (steps of published runs took {:.3}–{:.2} times what the roofline alone \
             predicted, {ROOFLINE_MEDIAN:.2} at the median: expect this one too fast)",
            ROOFLINE_BAND.0, ROOFLINE_BAND.1
        );
    }
    if p.layout.rules != stepcast::workload::Rules::Paper {
        println!(
            "{}",
            super::output::runtime_line(p.calibration.as_deref(), &p.runtime)
        );
        if let Some(line) = super::output::held_out_line(&p.calibration_held_out) {
            println!("{line}");
        }
    }
    println!();
    println!(
        "step time     {:.3} s   (80 % interval {:.3} – {:.3} s{})",
        p.metrics.step_time_s,
        p.interval_s[0],
        p.interval_s[1],
        match (
            p.interval_extrapolation_band,
            p.interval_runtime_sigma_log,
            &p.calibration,
        ) {
            (Some([low, high]), _, _) => format!(
                ": operator models and, as the step lies outside the calibrated runs, ×{low:.2}–\
                 ×{high:.2}: published steps outside their calibration's runs took that many \
                 times their prediction"
            ),
            (None, None, _) => ": operator models only".to_string(),
            (None, Some(_), Some(_)) => {
                ": operator models and the calibration's error on its runs".to_string()
            }
            (None, Some(_), None) => {
                ": operator models and the raw physics' error on measured runs".to_string()
            }
        }
    );
    println!(
        "throughput    {:.0} tokens/s, {:.0} per GPU",
        p.metrics.tokens_per_s, p.metrics.tokens_per_s_per_gpu
    );
    println!(
        "model FLOP/s  {:.1} TFLOP/s per GPU, MFU {:.1} %",
        p.metrics.model_tflops_per_gpu, p.metrics.mfu_percent
    );
    let b = &p.breakdown_s;
    let total = b.total().max(f64::MIN_POSITIVE);
    let part = |name: &str, v: f64| format!("{name} {:.3} s ({:.1} %)", v, 100.0 * v / total);
    println!(
        "breakdown     {}, {}, {}",
        part("compute", b.compute),
        part("TP comm", b.tp_comm),
        part("PP comm", b.pp_comm)
    );
    if b.ep_comm > 0.0 || l.ep > 1 {
        println!(
            "              {} (expert-parallel token all-to-all)",
            part("EP comm", b.ep_comm)
        );
    }
    if b.cp_comm > 0.0 || l.cp > 1 {
        println!(
            "              {} (K/V exchange of context parallelism not hidden behind attention)",
            part("CP comm", b.cp_comm)
        );
    }
    println!(
        "              {}, {}, {}",
        part("DP comm", b.dp_comm),
        part("optimizer", b.optimizer),
        part("bubble", b.bubble)
    );
    if b.host > 0.0 {
        println!(
            "              {} (the GPU waiting for the host to issue kernels, and per-step host work)",
            part("host", b.host)
        );
    }
    let o = &l.overlap;
    let overlapped: Vec<&str> = [
        (o.grad_reduce, "gradient reduction"),
        (o.param_gather, "parameter all-gather"),
        (o.p2p, "pipeline sends"),
        (o.tp, "TP communication (pipelined with its GEMMs)"),
    ]
    .iter()
    .filter(|(on, _)| *on)
    .map(|(_, name)| *name)
    .collect();
    println!(
        "pipeline      {}, bubble {:.1} % of busy time{}; overlapped: {}",
        p.schedule,
        100.0 * p.metrics.bubble_ratio,
        p.timeline
            .as_ref()
            .map(|(_, t)| format!(" (critical rank {})", t.critical_rank))
            .unwrap_or_default(),
        if p.timeline.is_none() {
            "— (the closed form adds the first stage's gradient sync in full)".to_string()
        } else if overlapped.is_empty() {
            "nothing".to_string()
        } else {
            overlapped.join(", ")
        }
    );
    let m = p.memory.peak();
    println!(
        "memory        {:.1} GiB of {:.0} GiB on rank {} ({}): weights {:.1}, gradients {:.1}, optimizer {:.1}, \
         activations {:.1} ({:.1} micro-batches in flight), transient {:.1}, overhead {:.1}; a run \
         would likely show {:.1}–{:.1} GiB",
        m.total_gib,
        p.memory.capacity_gib,
        m.rank,
        p.memory.verdict.name(),
        m.weights_gib,
        m.gradients_gib,
        m.optimizer_gib,
        m.activations_gib,
        m.in_flight,
        m.transient_gib,
        m.overhead_gib,
        p.memory.reported_peak_gib[0],
        p.memory.reported_peak_gib[1]
    );
    let sources: Vec<String> = p
        .sources_percent
        .iter()
        .map(|(k, v)| format!("{k} {}", share(*v)))
        .collect();
    println!("sources       {}", sources.join(", "));
    println!();
    let mut t = table(&[
        "stage",
        "role",
        "layers",
        "params/GPU",
        "fwd ms",
        "bwd ms",
        "grad sync ms",
        "optimizer ms",
        "all-gather ms",
        "memory GiB",
    ]);
    for (s, mem) in p.stages.iter().zip(&p.memory.ranks) {
        t.add_row(vec![
            s.index.to_string(),
            s.role.name().to_string(),
            s.layers.to_string(),
            format!("{:.1} M", s.params as f64 / 1e6),
            format!("{:.2}", s.fwd_ms),
            format!("{:.2}", s.bwd_ms),
            format!("{:.2}", s.grad_sync_ms),
            format!("{:.2}", s.optimizer_ms),
            format!("{:.2}", s.param_gather_ms),
            format!("{:.1} {}", mem.total_gib, mem.verdict.name()),
        ]);
    }
    align_numbers(&mut t, 2);
    // least needed first: all-gather, optimizer, grad sync, params/GPU, role
    let hidden = super::output::fit(&mut t, &[8, 7, 6, 3, 1]);
    println!("(fwd and bwd per micro-batch, recomputation included)");
    println!("{t}");
    if let Some(h) = hidden {
        println!("{h}");
    }
    if operators {
        let slowest = p
            .stages
            .iter()
            .max_by(|a, b| (a.fwd_ms + a.bwd_ms).total_cmp(&(b.fwd_ms + b.bwd_ms)))
            .expect("a stage");
        println!(
            "operators of stage {} (per micro-batch; sync and update per step):",
            slowest.index
        );
        let mut t = table(&[
            "list", "call", "query", "count", "µs each", "source", "note",
        ]);
        let mut add = |list: &str, ops: &[OperatorReport]| {
            for o in ops {
                t.add_row(vec![
                    list.to_string(),
                    o.label.to_string(),
                    o.query.clone(),
                    format!("{}", o.count),
                    format!("{:.1}", o.estimate.time_us),
                    o.estimate.source.name().to_string(),
                    operator_note(o),
                ]);
            }
        };
        add("fwd", &slowest.fwd);
        add("bwd", &slowest.bwd);
        add("sync", &slowest.grad_sync);
        add("update", &slowest.update);
        let hidden = super::output::fit(&mut t, &[6, 3]);
        println!("{t}");
        if let Some(h) = hidden {
            println!("{h}");
        }
    }
    if !p.out_of_coverage.is_empty() {
        println!("out of coverage ({} calls):", p.out_of_coverage.len());
        for o in &p.out_of_coverage {
            println!("  {o}");
        }
    }
    for w in &p.warnings {
        println!("warning: {w}");
    }
}

/// An operator's note: where its number came from, whether the host waits before it, and
/// whether a CUDA graph issues it.
fn operator_note(o: &OperatorReport) -> String {
    let wait = o
        .host_waits
        .then_some("the host waits for the device before issuing it (no issuing ahead)");
    let graph = match o.issue {
        Issue::Eager => None,
        Issue::GraphLaunch => Some("launches the CUDA graph of its part (one issue for all)"),
        Issue::InGraph => Some("in a CUDA graph (issued by its launch)"),
    };
    [o.estimate.note.as_deref(), wait, graph]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join("; ")
}

//! `stepcast export --format megatron|nemo|torchtitan`: a predicted layout (the job flags, or
//! the N-th best row of a search's JSON) as the launch script, recipe or job configuration of
//! a training framework (see `stepcast::export`).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use serde::Deserialize;

use super::layout::{describe, Job, JobArgs};
use super::named;
use stepcast::export::{export, Framework, Target};
use stepcast::hardware::Cluster;
use stepcast::ops::Dtype;
use stepcast::predict::cost::CostModel;
use stepcast::predict::{beyond_calibration, predict, PredictOptions};
use stepcast::workload::{
    Arch, AttentionKernel, CpComm, Layout, ParallelSpec, Partition, PipelineSplit, Recompute,
    Rules, Schedule,
};

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// The framework to export to.
    #[arg(long, value_parser = named::<Framework>())]
    pub format: Framework,
    #[command(flatten)]
    pub job: JobArgs,
    /// A search's --json output: export its --rank-th best layout, on the cluster and model it
    /// searched (instead of job flags).
    #[arg(long, value_name = "FILE.json")]
    pub from_search: Option<PathBuf>,
    /// Which of the search's predicted layouts, best first.
    #[arg(long, default_value_t = 1, requires = "from_search")]
    pub rank: usize,
    /// Models directory for the predicted step time in the header (default: the cluster's).
    #[arg(long)]
    pub models: Option<PathBuf>,
    /// Compose with the cluster's default runtime (raw physics), not the calibration fitted
    /// to measured runs.
    #[arg(long)]
    pub no_calibration: bool,
    /// Write the script / recipe / configuration to this file instead of standard output.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Print the export (text, notes, provenance) as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: ExportArgs) -> anyhow::Result<()> {
    let (job, searched) = match &args.from_search {
        Some(path) => {
            if args.job.job.is_some()
                || args.job.tp.is_some()
                || args.job.pp.is_some()
                || args.job.dp.is_some()
            {
                anyhow::bail!(stepcast::Error::Invalid(
                    "--from-search takes the layout from the search: drop --job, --tp, --pp and \
                     --dp (or drop --from-search and give the whole layout)"
                        .into()
                ));
            }
            let (job, searched) = from_search(path, args.rank, &args.job)?;
            (job, Some(searched))
        }
        None => (args.job.resolve_for(args.format)?, None),
    };
    // a row of a search is costed as the search costed it, where the export's flags are silent:
    // its models directory, its framework's calibration (set in `from_search`), its runtime
    let mut followed = Vec::new();
    let mut models_dir = args.models.clone();
    if let Some(dir) = searched.as_ref().and_then(|s| s.models.as_ref()) {
        if models_dir.is_none() {
            if !dir.is_dir() {
                anyhow::bail!(stepcast::Error::Invalid(format!(
                    "the search {} read models {}, which is not a directory here (a relative \
                     path is read from the working directory): give --models",
                    args.from_search.as_deref().unwrap_or(dir).display(),
                    dir.display()
                )));
            }
            followed.push(format!("its models {}", dir.display()));
            models_dir = Some(dir.clone());
        }
    }
    if let (Some(f), None, Some(_)) = (&job.framework, &args.job.framework, &searched) {
        followed.push(format!("--framework {f}"));
    }
    let models = super::layout::open_models(models_dir.as_deref(), &job.cluster)?;
    let models_fingerprint = models.as_ref().map(|m| m.fingerprint().to_string());
    let mut inputs = job.inputs.clone();
    inputs.extend(models.as_ref().map(super::stamp::models));
    let cost = CostModel::new(&job.cluster, models)
        .with_transfer(super::layout::open_transfer(&job.cluster)?)
        .with_collectives(super::layout::open_collectives(&job.cluster)?)
        .with_framework(job.framework.as_deref());
    let search_was_raw = searched.as_ref().is_some_and(Searched::was_raw);
    if search_was_raw && !args.no_calibration && cost.calibration_summary().is_some() {
        followed.push("the raw physics (it was not calibrated)".into());
    }
    let cost = if args.no_calibration || search_was_raw {
        cost.uncalibrated()
    } else {
        cost
    };
    if !followed.is_empty() {
        eprintln!(
            "note: the headline is costed as the search was: {}",
            followed.join(", ")
        );
    }
    let p = predict(
        &job.arch,
        &job.layout,
        &job.cluster,
        &cost,
        PredictOptions::default(),
    )?;
    let runtime = p
        .calibration
        .as_deref()
        .unwrap_or("the cluster's runtime defaults");
    let headline = format!(
        "{} on {}: {} — stepcast {} (commit {}) predicts {:.3} s per step ({:.3}–{:.3} s; {runtime})",
        job.arch.name,
        job.cluster.spec.name,
        describe(&job)
            .lines()
            .next()
            .unwrap_or_default()
            .trim_start_matches("layout   "),
        stepcast::provenance::VERSION,
        stepcast::provenance::COMMIT,
        p.metrics.step_time_s,
        p.interval_s[0],
        p.interval_s[1],
    );
    let launch = export(
        args.format,
        &Target {
            arch: &job.arch,
            layout: &job.layout,
            gpus_per_node: job.cluster.spec.gpus_per_node as u64,
            headline,
        },
    )?;
    if args.json {
        return super::stamp::print(&launch, inputs);
    }
    match &args.out {
        Some(path) => {
            stepcast::fsutil::write_atomic(path, launch.text.as_bytes())?;
            println!("{} written to {}", launch.file_name, path.display());
        }
        None => print!("{}", launch.text),
    }
    for note in &launch.notes {
        eprintln!("note: {note}");
    }
    if let Some(w) = beyond_calibration(&job.arch, &job.layout, &job.cluster, &cost) {
        eprintln!("warning: the predicted step in the headline lies {w}");
    }
    if let Some(why) = searched
        .as_ref()
        .and_then(|s| s.parted(&args, &p, models_fingerprint.as_deref()))
    {
        eprintln!("note: {why}");
    }
    Ok(())
}

/// The part of a search's JSON an export reads.
#[derive(Deserialize)]
struct SearchFile {
    provenance: Option<SearchProvenance>,
    rows: Vec<SearchRow>,
    /// How its steps were calibrated: `Some(None)` uncalibrated, `None` when the file does not
    /// say (an older stepcast wrote it).
    #[serde(default, deserialize_with = "present")]
    calibration: Option<Option<String>>,
}

/// A field that is there, `null` or not (`Some(None)` for `null`, `None` when absent).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

#[derive(Deserialize)]
struct SearchProvenance {
    inputs: Vec<SearchInput>,
    #[serde(default)]
    commit: Option<String>,
}

#[derive(Deserialize)]
struct SearchInput {
    role: String,
    name: String,
    #[serde(default)]
    digest: Option<String>,
}

/// How a search composed the step of the row exported: what the headline follows where the
/// export's flags are silent, and what explains a headline that still parts from it.
struct Searched {
    /// The step the search gave the row.
    step: Option<f64>,
    /// The models directory it read, when it was not built in; and their fingerprint then.
    models: Option<PathBuf>,
    models_fingerprint: Option<String>,
    /// Its calibration (`Some(None)`: uncalibrated; `None`: the file does not say).
    calibration: Option<Option<String>>,
    /// The stepcast commit that ran it.
    commit: Option<String>,
}

impl Searched {
    /// Whether the search composed its steps under no calibration.
    fn was_raw(&self) -> bool {
        matches!(self.calibration, Some(None))
    }

    /// Why the headline's step parts from the search's (none when they agree, to 1e-6).
    fn parted(
        &self,
        args: &ExportArgs,
        p: &stepcast::predict::Prediction,
        models_fingerprint: Option<&str>,
    ) -> Option<String> {
        let searched = self.step?;
        let step = p.metrics.step_time_s;
        if (step / searched - 1.0).abs() <= 1e-6 {
            return None;
        }
        let then_calibration = self.calibration.as_ref().map(Option::as_deref);
        let why = if args.models.is_some() || args.no_calibration || args.job.framework.is_some() {
            "this export's --models, --no-calibration or --framework part from the search's: \
             drop them to match"
                .to_string()
        } else if self.models_fingerprint.is_some()
            && self.models_fingerprint.as_deref() != models_fingerprint
        {
            format!(
                "the models changed since the search (fingerprint {}, now {}): run the search \
                 again",
                self.models_fingerprint.as_deref().unwrap_or_default(),
                models_fingerprint.unwrap_or("none")
            )
        } else if then_calibration.is_some_and(|c| c != p.calibration.as_deref()) {
            format!(
                "the calibration changed since the search ({}, now {}): run the search again",
                then_calibration.flatten().unwrap_or("none"),
                p.calibration.as_deref().unwrap_or("none")
            )
        } else if self
            .commit
            .as_deref()
            .is_some_and(|c| c != stepcast::provenance::COMMIT)
        {
            format!(
                "the search ran stepcast commit {}, this is {}: run the search again",
                self.commit.as_deref().unwrap_or_default(),
                stepcast::provenance::COMMIT
            )
        } else {
            "the search composed it with other inputs: run the search again".to_string()
        };
        Some(format!(
            "the search costed this layout at {searched:.3} s, the headline at {step:.3} s: {why}"
        ))
    }
}

#[derive(Deserialize)]
struct SearchRow {
    status: String,
    layout: serde_json::Value,
    #[serde(default)]
    step_time_s: Option<f64>,
}

/// A row's layout as a search wrote it: what `Layout::new` needs to rebuild it.
#[derive(Deserialize)]
struct RowLayout {
    tp: u64,
    pp: u64,
    dp: u64,
    #[serde(default = "one")]
    cp: u64,
    #[serde(default)]
    cp_comm: Option<CpComm>,
    #[serde(default)]
    attention_kernel: Option<AttentionKernel>,
    #[serde(default)]
    cross_entropy: Option<stepcast::workload::CrossEntropy>,
    #[serde(default)]
    elementwise: Option<stepcast::workload::Elementwise>,
    #[serde(default = "one")]
    ep: u64,
    #[serde(default)]
    moe_imbalance: Option<f64>,
    micro_batch: u64,
    global_batch: u64,
    seq_len: u64,
    sequence_parallel: bool,
    recompute: Recompute,
    partition: Partition,
    zero: u8,
    dtype: Dtype,
    /// (search rows written before it existed: the layout's default)
    #[serde(default)]
    grad_reduce_dtype: Option<Dtype>,
    #[serde(default)]
    fp8_param_gather: bool,
    #[serde(default)]
    fp8_library: Option<stepcast::workload::Fp8Library>,
    rules: Rules,
    dp_bucket_elements: u64,
    schedule: Schedule,
    vpp: u64,
    overlap: RowOverlap,
    #[serde(default)]
    pipeline_split: PipelineSplit,
    #[serde(default)]
    mtp_layers: u64,
    #[serde(default)]
    moe_capacity: Option<(f64, bool)>,
    #[serde(default)]
    etp: Option<u64>,
    #[serde(default)]
    pipeline_layout: Option<String>,
    #[serde(default)]
    recompute_modules: Option<Vec<stepcast::workload::RecomputeModule>>,
    #[serde(default)]
    cuda_graphs: Vec<stepcast::workload::CudaGraphScope>,
    #[serde(default)]
    moe_dispatcher: Option<stepcast::workload::Dispatcher>,
    #[serde(default)]
    routing_file: Option<std::path::PathBuf>,
}

fn one() -> u64 {
    1
}

#[derive(Deserialize)]
struct RowOverlap {
    grad_reduce: bool,
    param_gather: bool,
    p2p: bool,
    tp: bool,
    #[serde(default)]
    moe_a2a: bool,
}

/// The `rank`-th predicted layout of a search, on its cluster and model (or `--cluster` /
/// `--model` when given), checked to rebuild to exactly the layout the search costed, under
/// the search's `--framework` unless the flags name one; and how the search costed it.
fn from_search(
    path: &std::path::Path,
    rank: usize,
    flags: &JobArgs,
) -> anyhow::Result<(Job, Searched)> {
    let bad = |m: String| stepcast::Error::bad_file(path, m);
    let text = stepcast::fsutil::read_to_string(path)?;
    let file: SearchFile = serde_json::from_str(&text).map_err(|e| {
        bad(format!(
            "not a search's JSON ({}): write one with `stepcast search … --json FILE`",
            stepcast::fsutil::parse_message(&e)
        ))
    })?;
    let predicted: Vec<&SearchRow> = file
        .rows
        .iter()
        .filter(|r| r.status == "predicted")
        .collect();
    let row = rank
        .checked_sub(1)
        .and_then(|i| predicted.get(i))
        .ok_or_else(|| {
            bad(format!(
                "--rank {rank}: the search predicted {} layouts; give 1 to {}",
                predicted.len(),
                predicted.len().max(1)
            ))
        })?;
    let recorded = |role: &str| {
        file.provenance
            .as_ref()
            .and_then(|p| p.inputs.iter().find(|i| i.role == role))
    };
    let input = |role: &str| {
        recorded(role).map(|i| {
            // built-in inputs are recorded as `<built-in NAME>`
            i.name
                .strip_prefix("<built-in ")
                .and_then(|n| n.strip_suffix('>'))
                .unwrap_or(&i.name)
                .to_string()
        })
    };
    let cluster_name = flags
        .cluster
        .clone()
        .or_else(|| input("cluster").map(PathBuf::from))
        .ok_or_else(|| {
            bad("names no cluster (an older stepcast wrote it): give --cluster".into())
        })?;
    let model = flags
        .model
        .clone()
        .or_else(|| input("architecture"))
        .ok_or_else(|| bad("names no model (an older stepcast wrote it): give --model".into()))?;
    let r: RowLayout = serde_json::from_value(row.layout.clone()).map_err(|e| {
        bad(format!(
            "row {rank}'s layout is not one stepcast reads: {e}"
        ))
    })?;
    let spec = ParallelSpec {
        tp: Some(r.tp),
        pp: Some(r.pp),
        dp: Some(r.dp),
        cp: Some(r.cp),
        cp_comm: r.cp_comm,
        attention_kernel: r.attention_kernel,
        cross_entropy: r.cross_entropy,
        elementwise: r.elementwise,
        ep: Some(r.ep),
        etp: r.etp,
        moe_a2a_overlap: Some(r.overlap.moe_a2a),
        moe_imbalance: r.moe_imbalance,
        micro_batch: Some(r.micro_batch),
        global_batch: Some(r.global_batch),
        micro_batches: None,
        seq_len: Some(r.seq_len),
        sequence_parallel: Some(r.sequence_parallel),
        recompute: Some(r.recompute),
        partition: Some(r.partition),
        zero: Some(r.zero),
        dtype: Some(r.dtype),
        grad_reduce_dtype: r.grad_reduce_dtype,
        fp8_param_gather: Some(r.fp8_param_gather),
        fp8_library: r.fp8_library,
        rules: Some(r.rules),
        dp_bucket_elements: Some(r.dp_bucket_elements),
        schedule: Some(r.schedule),
        vpp: Some(r.vpp),
        overlap_grad_reduce: Some(r.overlap.grad_reduce),
        overlap_param_gather: Some(r.overlap.param_gather),
        overlap_p2p: Some(r.overlap.p2p),
        tp_comm_overlap: Some(r.overlap.tp),
        account_for_embedding_in_pipeline_split: Some(r.pipeline_split.embedding),
        account_for_loss_in_pipeline_split: Some(r.pipeline_split.loss),
        mtp_layers: Some(r.mtp_layers),
        moe_capacity_factor: r.moe_capacity.map(|(f, _)| f),
        moe_pad_to_capacity: r.moe_capacity.map(|(_, pad)| pad),
        pipeline_layout: r.pipeline_layout,
        recompute_modules: r.recompute_modules,
        cuda_graphs: (!r.cuda_graphs.is_empty()).then_some(r.cuda_graphs),
        moe_dispatcher: r.moe_dispatcher,
    };
    let cluster = Cluster::load(&cluster_name)?;
    let arch = Arch::resolve(&model)?;
    let mut layout = Layout::new(&spec, &arch, &cluster)
        .with_context(|| format!("rebuilding row {rank} of {}", path.display()))?;
    if let Some(file) = &r.routing_file {
        let routing = stepcast::workload::ExpertRouting::load(file)?;
        layout = layout.with_routing(&routing, &arch)?;
    }
    if serde_json::to_value(&layout)? != row.layout {
        anyhow::bail!(bad(format!(
            "row {rank} rebuilds to a different layout on {} with {model}: the search was made \
             with other inputs or another stepcast; run the search again",
            cluster_name.display()
        )));
    }
    let mut inputs = vec![
        super::stamp::file("search", path),
        super::stamp::cluster(&cluster),
        super::stamp::architecture(&model),
    ];
    let framework = flags.framework.clone().or_else(|| input("framework"));
    inputs.extend(framework.as_deref().map(super::stamp::framework));
    let job = Job {
        cluster,
        arch,
        layout,
        inputs,
        notes: Vec::new(),
        framework,
    };
    // the models as the search recorded them: a directory, or built in (`<built-in …>`)
    let models = recorded("models").filter(|m| !m.name.starts_with("<built-in "));
    let searched = Searched {
        step: row.step_time_s,
        models: models.map(|m| PathBuf::from(&m.name)),
        models_fingerprint: models.and_then(|m| m.digest.clone()),
        calibration: file.calibration.clone(),
        commit: file.provenance.as_ref().and_then(|p| p.commit.clone()),
    };
    Ok((job, searched))
}

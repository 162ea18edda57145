//! `stepcast predict`: flags, or a job file (`--job`) that flags override.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use serde::Deserialize;

use super::output::{align_numbers, table};
use stepcast::hardware::Cluster;
use stepcast::ops::Dtype;
use stepcast::predict::cost::CostModel;
use stepcast::predict::{predict, OperatorReport, PredictOptions, Prediction};
use stepcast::regress::ModelSet;
use stepcast::workload::{Arch, Layout, ParallelSpec, Partition, Recompute, Rules};

#[derive(Debug, Args)]
pub struct PredictArgs {
    /// Cluster file, e.g. hardware-profiles/perlmutter.yaml.
    #[arg(long)]
    pub cluster: Option<PathBuf>,
    /// Architecture: a preset (llemma-7b, llama2-70b, gpt3-175b, …), a YAML architecture file
    /// or a Hugging Face config.json.
    #[arg(long)]
    pub model: Option<String>,
    /// Job file holding cluster, model and parallel settings; flags override it.
    #[arg(long)]
    pub job: Option<PathBuf>,
    #[arg(long)]
    pub tp: Option<u64>,
    #[arg(long)]
    pub pp: Option<u64>,
    #[arg(long)]
    pub dp: Option<u64>,
    /// Sequences per micro-batch.
    #[arg(long)]
    pub micro_batch: Option<u64>,
    /// Sequences per step over all data-parallel replicas (or give --micro-batches).
    #[arg(long)]
    pub global_batch: Option<u64>,
    /// Micro-batches per step on each pipeline (gradient accumulation).
    #[arg(long)]
    pub micro_batches: Option<u64>,
    /// Sequence length (default: the architecture's).
    #[arg(long)]
    pub seq_len: Option<u64>,
    /// Megatron sequence parallelism (needs tp > 1).
    #[arg(long)]
    pub sequence_parallel: bool,
    #[arg(long, value_enum)]
    pub recompute: Option<Recompute>,
    #[arg(long, value_enum)]
    pub partition: Option<Partition>,
    /// Optimizer sharding over data parallelism: 0, 1 (distributed optimizer), 2, 3 (FSDP).
    #[arg(long)]
    pub zero: Option<u8>,
    /// Training data type: bf16, fp16 or fp8 (fp8 GEMMs, 16-bit elsewhere).
    #[arg(long)]
    pub dtype: Option<Dtype>,
    /// Composition rules: megatron (default) or paper (Zhang et al.'s tool).
    #[arg(long, value_enum)]
    pub rules: Option<Rules>,
    /// Elements per data-parallel gradient bucket.
    #[arg(long)]
    pub dp_bucket_elements: Option<u64>,
    /// Models directory to use instead of the cluster file's.
    #[arg(long)]
    pub models: Option<PathBuf>,
    /// Fail instead of falling back to the roofline or an uncalibrated analytic estimate.
    #[arg(long)]
    pub strict: bool,
    /// Print the prediction as JSON.
    #[arg(long)]
    pub json: bool,
    /// Also list every operator call of the slowest stage.
    #[arg(long)]
    pub operators: bool,
}

/// A job file: paths in it are relative to the file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JobFile {
    cluster: Option<PathBuf>,
    model: Option<String>,
    #[serde(default)]
    parallel: ParallelSpec,
}

pub fn run(args: PredictArgs) -> anyhow::Result<()> {
    let (job, job_dir) = match &args.job {
        Some(path) => {
            let job: JobFile = stepcast::fsutil::read_yaml(path)?;
            (
                job,
                path.parent().map(Path::to_path_buf).unwrap_or_default(),
            )
        }
        None => (
            JobFile {
                cluster: None,
                model: None,
                parallel: ParallelSpec::default(),
            },
            PathBuf::new(),
        ),
    };
    let cluster_path = args
        .cluster
        .clone()
        .or_else(|| job.cluster.as_ref().map(|p| job_dir.join(p)))
        .ok_or_else(|| {
            stepcast::Error::Invalid(
                "give a cluster file with --cluster (or cluster: in the job file)".into(),
            )
        })?;
    let model = args
        .model
        .clone()
        .or_else(|| {
            job.model.as_ref().map(|m| {
                let rel = job_dir.join(m);
                if rel.is_file() {
                    rel.display().to_string()
                } else {
                    m.clone()
                }
            })
        })
        .ok_or_else(|| {
            stepcast::Error::Invalid("give a model with --model (or model: in the job file)".into())
        })?;
    let flags = ParallelSpec {
        tp: args.tp,
        pp: args.pp,
        dp: args.dp,
        micro_batch: args.micro_batch,
        global_batch: args.global_batch,
        micro_batches: args.micro_batches,
        seq_len: args.seq_len,
        sequence_parallel: args.sequence_parallel.then_some(true),
        recompute: args.recompute,
        partition: args.partition,
        zero: args.zero,
        dtype: args.dtype,
        rules: args.rules,
        dp_bucket_elements: args.dp_bucket_elements,
    };
    let spec = job.parallel.overridden_by(flags);

    let cluster = Cluster::load(&cluster_path)?;
    let arch = Arch::resolve(&model)?;
    let layout = Layout::new(&spec, &arch, &cluster)?;
    let models_dir = args.models.clone().or_else(|| cluster.models_dir.clone());
    let models = match &models_dir {
        Some(dir)
            if dir
                .join(stepcast::regress::modelset::MANIFEST_FILE)
                .is_file() =>
        {
            Some(ModelSet::open(dir).with_context(|| format!("opening models {}", dir.display()))?)
        }
        Some(dir) if args.strict => {
            anyhow::bail!(stepcast::Error::MissingModel(format!(
                "{}: no trained models there (--strict)",
                dir.display()
            )))
        }
        _ => None,
    };
    let cost = CostModel::new(&cluster, models);
    let prediction = predict(
        &arch,
        &layout,
        &cluster,
        &cost,
        PredictOptions {
            strict: args.strict,
        },
    )?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&prediction)?);
    } else {
        print_prediction(&prediction, models_dir.as_deref(), args.operators);
    }
    Ok(())
}

fn print_prediction(p: &Prediction, models_dir: Option<&Path>, operators: bool) {
    let l = &p.layout;
    println!(
        "{} on {} ({}), {} rules",
        p.model,
        p.cluster,
        p.gpu,
        rules_name(l.rules)
    );
    println!(
        "layout   tp {} · pp {} · dp {} = {} GPUs; micro-batch {} × {} per step = global batch {} × {} tokens",
        l.tp, l.pp, l.dp, l.world, l.micro_batch, l.micro_batches, l.global_batch, l.seq_len
    );
    println!(
        "         {}, recompute {:?}, {:?} partition {:?}, ZeRO {}{}",
        l.dtype,
        l.recompute,
        l.partition,
        l.stage_layers,
        l.zero,
        if l.sequence_parallel {
            ", sequence parallel"
        } else {
            ""
        }
    );
    match models_dir {
        Some(d) if p.models_dir.is_some() => println!("models   {}", d.display()),
        Some(d) => println!(
            "models   none at {} — every kernel from the roofline",
            d.display()
        ),
        None => println!("models   none configured — every kernel from the roofline"),
    }
    println!();
    println!(
        "step time     {:.3} s   (80 % interval {:.3} – {:.3} s)",
        p.step_time_s, p.interval_s[0], p.interval_s[1]
    );
    println!(
        "throughput    {:.0} tokens/s, {:.0} per GPU",
        p.tokens_per_s, p.tokens_per_s_per_gpu
    );
    println!(
        "model FLOP/s  {:.1} TFLOP/s per GPU, MFU {:.1} %",
        p.model_tflops_per_gpu, p.mfu_percent
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
    println!(
        "              {}, {}, {}",
        part("DP comm", b.dp_comm),
        part("optimizer", b.optimizer),
        part("bubble", b.bubble)
    );
    let sources: Vec<String> = p
        .sources_percent
        .iter()
        .map(|(k, v)| format!("{k} {v:.1} %"))
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
    ]);
    for s in &p.stages {
        t.add_row(vec![
            s.index.to_string(),
            format!("{:?}", s.role).to_lowercase(),
            s.layers.to_string(),
            format!("{:.1} M", s.params as f64 / 1e6),
            format!("{:.2}", s.fwd_ms),
            format!("{:.2}", s.bwd_ms),
            format!("{:.2}", s.grad_sync_ms),
            format!("{:.2}", s.optimizer_ms),
            format!("{:.2}", s.param_gather_ms),
        ]);
    }
    align_numbers(&mut t, 2);
    println!("(fwd and bwd per micro-batch, recomputation included)");
    println!("{t}");
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
                    o.estimate.note.clone().unwrap_or_default(),
                ]);
            }
        };
        add("fwd", &slowest.fwd);
        add("bwd", &slowest.bwd);
        add("sync", &slowest.grad_sync);
        add("update", &slowest.update);
        println!("{t}");
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

fn rules_name(r: Rules) -> &'static str {
    match r {
        Rules::Megatron => "Megatron",
        Rules::Paper => "paper",
    }
}

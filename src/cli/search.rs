//! `stepcast search`: the best layouts of a model on N GPUs at a global batch.

use std::path::PathBuf;

use clap::Args;
use rayon::prelude::*;
use serde::Serialize;

use super::named;
use super::output::{align_numbers, table};
use super::run::{duration, RunArgs};
use stepcast::export::Framework;
use stepcast::hardware::Cluster;
use stepcast::ops::Dtype;
use stepcast::predict::cost::CostModel;
use stepcast::predict::{predict, PredictOptions, Prediction};
use stepcast::search::{
    search_watched, Objective, SearchReport, SearchRequest, SearchRow, SearchSpace, Status,
};
use stepcast::workload::{Arch, AttentionKernel, CpComm, ParallelSpec, Recompute, Rules, Schedule};

#[derive(Debug, Args)]
#[group(id = "size", required = true, multiple = false)]
pub struct SearchArgs {
    /// Cluster file (e.g. hardware-profiles/dgx-h100.yaml) or a built-in cluster by name:
    /// dgx-a100, dgx-a100-40gb, dgx-h100, dgx-h200, grand-teton-h100, mi300x, perlmutter, vista.
    #[arg(long)]
    pub cluster: PathBuf,
    /// Architecture: a preset, a YAML architecture file or a Hugging Face config.json.
    #[arg(long)]
    pub model: String,
    /// GPUs to lay the job out on.
    #[arg(long, allow_negative_numbers = true, group = "size")]
    pub gpus: Option<u64>,
    /// Nodes to lay the job out on, in place of --gpus: all their GPUs (the cluster file's
    /// gpus_per_node each), the cluster taken as that many nodes as `predict --nodes` takes it.
    #[arg(long, allow_negative_numbers = true, group = "size")]
    pub nodes: Option<i64>,
    /// Sequences per step.
    #[arg(long, allow_negative_numbers = true)]
    pub global_batch: u64,
    /// Sequence length (default: the architecture's).
    #[arg(long)]
    pub seq_len: Option<u64>,
    /// Training data type of every layout: bf16, fp16 or fp8 [default: bf16; fp16 under
    /// --rules paper].
    #[arg(long, value_parser = named::<Dtype>())]
    pub dtype: Option<Dtype>,
    /// Composition rules every layout is predicted under: megatron or paper (Zhang et al.'s
    /// tool).
    #[arg(long, value_parser = named::<Rules>(), default_value = "megatron")]
    pub rules: Rules,
    /// Tensor-parallel degrees to try, e.g. 1,2,4,8 [every divisor of --gpus].
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true)]
    pub tp: Option<Vec<u64>>,
    /// Pipeline degrees to try [every divisor of --gpus].
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true)]
    pub pp: Option<Vec<u64>>,
    /// Context-parallel degrees to try [1; and 2, 4, 8, 16 for sequences of 8,192 tokens or
    /// more].
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true)]
    pub cp: Option<Vec<u64>>,
    /// Expert-parallel degrees to try for a mixture of experts [every power of two dividing
    /// the experts].
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true)]
    pub ep: Option<Vec<u64>>,
    /// Expert-tensor-parallel degrees to try for a mixture of experts [tp, and 1].
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true)]
    pub etp: Option<Vec<u64>>,
    /// Router imbalance every layout is costed at (busiest expert's tokens over the mean).
    #[arg(long, allow_negative_numbers = true)]
    pub moe_imbalance: Option<f64>,
    /// Per-layer expert routing from a run (layer,expert,tokens CSV): each layout's load
    /// follows its ep.
    #[arg(long, value_name = "CSV")]
    pub moe_routing: Option<PathBuf>,
    /// How routed tokens reach their experts in every layout: alltoall, allgather, deepep or
    /// hybridep [default: alltoall].
    #[arg(long, value_parser = named::<stepcast::workload::Dispatcher>())]
    pub moe_dispatcher: Option<stepcast::workload::Dispatcher>,
    /// Expert all-to-alls beside the compute: the values to try (with ep > 1), e.g.
    /// false,true.
    #[arg(long, value_delimiter = ',', default_value = "false")]
    pub moe_a2a_overlap: Vec<bool>,
    /// Micro-batch sizes to try.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    pub micro_batch: Vec<u64>,
    /// Schedules to try.
    #[arg(
        long,
        value_parser = named::<Schedule>(),
        value_delimiter = ',',
        default_value = "1f1b,interleaved,zb-h1,zb-v"
    )]
    pub schedule: Vec<Schedule>,
    /// Largest number of chunks per rank for the interleaved schedule.
    #[arg(long, default_value_t = 64)]
    pub max_vpp: u64,
    /// Recomputations to try, comma-separated: none, selective, selective-op, selective-layer,
    /// full.
    #[arg(
        long,
        value_parser = named::<Recompute>(),
        value_delimiter = ',',
        default_value = "none,selective,full"
    )]
    pub recompute: Vec<Recompute>,
    /// Sequence parallelism settings to try (with tp > 1).
    #[arg(long, value_delimiter = ',', default_value = "false,true")]
    pub sequence_parallel: Vec<bool>,
    /// ZeRO stages to try (3 only without pipeline stages).
    #[arg(long, value_delimiter = ',', default_value = "0,1,2,3")]
    pub zero: Vec<u8>,
    /// Keep layouts within 10 % of the GPU's memory (AT-RISK).
    #[arg(long)]
    pub allow_at_risk: bool,
    /// Pipeline the tensor-parallel collectives with their GEMMs in every layout that has
    /// sequence parallelism (NeMo's and Megatron's --tp-comm-overlap).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    #[arg(value_parser = super::switch())]
    pub tp_comm_overlap: Option<bool>,
    /// Which kernel runs the attention in every layout: native (what the cluster's models
    /// learned) or flash-attention-2 (held to FA2's fraction of peak on Hopper) [default: native].
    #[arg(long, value_parser = super::named::<AttentionKernel>())]
    pub attention_kernel: Option<AttentionKernel>,
    /// How every layout's RMSNorm, rotary embedding and SiLU-and-multiply run: fused (Megatron,
    /// or PyTorch under torch.compile) or eager (PyTorch without it) [default: fused].
    #[arg(long, value_parser = super::named::<stepcast::workload::Elementwise>())]
    pub elementwise: Option<stepcast::workload::Elementwise>,
    /// Which loss every layout computes: vocab-parallel (Megatron's), pytorch (PyTorch's on
    /// fp32 logits) or fused (Transformer Engine's kernel over the 16-bit logits, as
    /// Megatron-Bridge's performance recipes run it) [default: vocab-parallel].
    #[arg(long, value_parser = super::named::<stepcast::workload::CrossEntropy>())]
    pub cross_entropy: Option<stepcast::workload::CrossEntropy>,
    /// Parts of each layer every layout captures in CUDA graphs (none, layer, or any of attn,
    /// mlp, moe, moe_router, moe_preprocess) [default: none].
    #[arg(
        long,
        value_parser = super::named::<stepcast::workload::CudaGraphScope>(),
        value_delimiter = ','
    )]
    pub cuda_graphs: Option<Vec<stepcast::workload::CudaGraphScope>>,
    /// Compose with the cluster's default runtime (raw physics), not the calibration fitted
    /// to measured runs.
    #[arg(long)]
    pub no_calibration: bool,
    /// The training framework (e.g. composer): the models' calibration fitted on that
    /// framework's runs is used where there is one.
    #[arg(long, value_parser = stepcast::hardware::framework_name)]
    pub framework: Option<String>,
    /// Only the layouts this framework runs as costed — megatron, nemo or torchtitan, what
    /// `stepcast export --format` takes — so the best one can be launched (its export
    /// command is printed beside its predict command).
    #[arg(long = "for", value_name = "FRAMEWORK", value_parser = named::<Framework>())]
    pub for_framework: Option<Framework>,
    /// Rank by step time, or by end-to-end run time (needs --tokens or --steps).
    #[arg(long, value_parser = named::<Objective>(), default_value = "step")]
    pub objective: Objective,
    #[command(flatten)]
    pub run: RunArgs,
    /// Rows in the table (their 80 % intervals are computed too).
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Write every layout (predicted and memory-pruned) as CSV.
    #[arg(long, value_name = "FILE.csv")]
    pub csv: Option<PathBuf>,
    /// Write the whole report as JSON.
    #[arg(long, value_name = "FILE.json")]
    pub json: Option<PathBuf>,
    /// Write a self-contained HTML report of the search and its best layout.
    #[arg(long, value_name = "FILE.html")]
    pub html: Option<PathBuf>,
    /// Models directory to use instead of the cluster file's.
    #[arg(long)]
    pub models: Option<PathBuf>,
}

/// One CSV line: the row flattened.
#[derive(Serialize)]
struct CsvRow<'a> {
    rank: usize,
    status: &'static str,
    tp: u64,
    cp: u64,
    ep: u64,
    etp: u64,
    moe_a2a_overlap: bool,
    pp: u64,
    dp: u64,
    micro_batch: u64,
    micro_batches: u64,
    vpp: u64,
    schedule: &'a str,
    recompute: &'static str,
    sequence_parallel: bool,
    zero: u8,
    step_s: Option<f64>,
    step_s_low: Option<f64>,
    step_s_high: Option<f64>,
    tokens_per_s_per_gpu: Option<f64>,
    mfu_percent: Option<f64>,
    bubble_ratio: Option<f64>,
    memory_peak_gib: f64,
    memory_headroom_gib: f64,
    ettr: Option<f64>,
    end_to_end_s: Option<f64>,
    checkpoint_interval: Option<u64>,
    checkpoint_save_s: Option<f64>,
}

/// The ep cell: the degree, with expert tensor parallelism other than tp and the all-to-all
/// overlap when set.
fn expert_cell(l: &stepcast::workload::Layout) -> String {
    let mut notes = Vec::new();
    if l.etp != l.tp {
        notes.push(format!("etp {}", l.etp));
    }
    if l.overlap.moe_a2a {
        notes.push("a2a overlap".to_string());
    }
    if notes.is_empty() {
        l.ep.to_string()
    } else {
        format!("{} ({})", l.ep, notes.join(", "))
    }
}

fn recompute_name(r: Recompute) -> &'static str {
    match r {
        Recompute::None => "none",
        Recompute::Selective => "selective",
        Recompute::SelectiveOp => "selective-op",
        Recompute::SelectiveLayer => "selective-layer",
        Recompute::Full => "full",
    }
}

fn status_name(s: Status) -> &'static str {
    match s {
        Status::Predicted => "predicted",
        Status::Oom => "oom",
        Status::AtRisk => "at-risk",
    }
}

fn write_csv(path: &std::path::Path, report: &SearchReport) -> anyhow::Result<()> {
    stepcast::fsutil::write_atomic_with(path, |w| {
        let mut out = csv::Writer::from_writer(w);
        for (i, r) in report.rows.iter().enumerate() {
            out.serialize(CsvRow {
                rank: i + 1,
                status: status_name(r.status),
                tp: r.layout.tp,
                cp: r.layout.cp,
                ep: r.layout.ep,
                etp: r.layout.etp,
                moe_a2a_overlap: r.layout.overlap.moe_a2a,
                pp: r.layout.pp,
                dp: r.layout.dp,
                micro_batch: r.layout.micro_batch,
                micro_batches: r.layout.micro_batches,
                vpp: r.layout.vpp,
                schedule: r.layout.schedule.name(),
                recompute: recompute_name(r.layout.recompute),
                sequence_parallel: r.layout.sequence_parallel,
                zero: r.layout.zero,
                step_s: r.step_s(),
                step_s_low: r.interval_s.map(|i| i[0]),
                step_s_high: r.interval_s.map(|i| i[1]),
                tokens_per_s_per_gpu: r.metrics.map(|m| m.tokens_per_s_per_gpu),
                mfu_percent: r.metrics.map(|m| m.mfu_percent),
                bubble_ratio: r.metrics.map(|m| m.bubble_ratio),
                memory_peak_gib: r.memory_peak_gib,
                memory_headroom_gib: r.memory_headroom_gib,
                ettr: r.run.map(|o| o.ettr),
                end_to_end_s: r.run.map(|o| o.end_to_end_s),
                checkpoint_interval: r.run.map(|o| o.checkpoint_interval),
                checkpoint_save_s: r.checkpoint_save_s,
            })
            .map_err(std::io::Error::other)?;
        }
        out.flush()
    })?;
    Ok(())
}

/// The `stepcast predict` line that reproduces a row.
pub fn predict_command(args: &SearchArgs, r: &SearchRow) -> String {
    let mut cmd = format!(
        "stepcast predict --cluster {}{} --model {} --tp {} --pp {} --dp {} --micro-batch {} --global-batch {}",
        shell_word(&args.cluster.display().to_string()),
        // the cluster as searched: more nodes than its file's must be given again
        args.nodes.map(|n| format!(" --nodes {n}")).unwrap_or_default(),
        shell_word(&args.model),
        r.layout.tp,
        r.layout.pp,
        r.layout.dp,
        r.layout.micro_batch,
        args.global_batch
    );
    if r.layout.cp > 1 {
        cmd += &format!(" --cp {}", r.layout.cp);
    }
    if r.layout.ep > 1 {
        cmd += &format!(" --ep {}", r.layout.ep);
    }
    if r.layout.etp != r.layout.tp {
        cmd += &format!(" --etp {}", r.layout.etp);
    }
    if r.layout.overlap.moe_a2a {
        cmd += " --moe-a2a-overlap";
    }
    if r.layout.ep > 1 && !r.layout.moe_dispatcher.is_alltoall() {
        cmd += &format!(" --moe-dispatcher {}", r.layout.moe_dispatcher);
    }
    if let Some(f) = args.moe_imbalance {
        cmd += &format!(" --moe-imbalance {f}");
    }
    if let Some(path) = &args.moe_routing {
        cmd += &format!(" --moe-routing {}", shell_word(&path.display().to_string()));
    }
    if r.layout.schedule == Schedule::Interleaved {
        cmd += &format!(" --vpp {}", r.layout.vpp);
    } else {
        cmd += &format!(" --schedule {}", r.layout.schedule.name());
    }
    cmd += &format!(
        " --recompute {} --zero {}",
        recompute_name(r.layout.recompute),
        r.layout.zero
    );
    if r.layout.sequence_parallel {
        cmd += " --sequence-parallel";
    }
    if let Some(s) = args.seq_len {
        cmd += &format!(" --seq-len {s}");
    }
    if let Some(d) = args.dtype {
        cmd += &format!(" --dtype {d}");
    }
    if args.rules == Rules::Paper {
        cmd += " --rules paper";
    }
    if args.tp_comm_overlap == Some(true) {
        cmd += " --tp-comm-overlap";
    }
    // what the layout was costed with beside Megatron's defaults (a framework's, --for)
    let l = &r.layout;
    if !l.cross_entropy.is_vocab_parallel() {
        cmd += &format!(" --cross-entropy {}", l.cross_entropy);
    }
    if l.attention_kernel != AttentionKernel::Native {
        cmd += &format!(" --attention-kernel {}", l.attention_kernel);
    }
    if !l.elementwise.is_fused() {
        cmd += &format!(" --elementwise {}", l.elementwise);
    }
    if !l.cuda_graphs.is_empty() {
        let names: Vec<&str> = l.cuda_graphs.iter().map(|s| s.name()).collect();
        cmd += &format!(" --cuda-graphs {}", names.join(","));
    }
    if l.cp > 1 && l.cp_comm != CpComm::P2p {
        cmd += &format!(" --cp-comm {}", l.cp_comm);
    }
    if l.dtype == Dtype::Fp8 && !l.fp8_library.is_transformer_engine() {
        cmd += &format!(" --fp8-library {}", l.fp8_library);
    }
    if let Some(f) = &args.framework {
        cmd += &format!(" --framework {f}");
    }
    // where the costs came from: the same models, and the raw physics if the search used it
    if let Some(dir) = &args.models {
        cmd += &format!(" --models {}", shell_word(&dir.display().to_string()));
    }
    if args.no_calibration {
        cmd += " --no-calibration";
    }
    cmd
}

/// A word as a POSIX shell reads it back: as is where every character is safe, else in single
/// quotes, so that a printed command with a path holding spaces or `$` runs as printed.
fn shell_word(word: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "_-./:=,@%+".contains(c);
    if !word.is_empty() && word.chars().all(safe) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

pub fn run(args: SearchArgs) -> anyhow::Result<()> {
    let cluster = Cluster::load(&args.cluster)?;
    // `--nodes` (as predict's) replaces the file's count and takes all their GPUs; clap asks
    // for it or `--gpus`, not both
    let (cluster, gpus) = match args.nodes {
        Some(nodes) => {
            let cluster = cluster.with_nodes(nodes)?;
            let gpus = cluster.total_gpus();
            (cluster, gpus)
        }
        None => (cluster, args.gpus.unwrap_or_default()),
    };
    let arch = Arch::resolve(&args.model)?;
    let seq = args.seq_len.unwrap_or(arch.seq_len);
    let run_spec = args.run.spec(&cluster, (args.global_batch * seq) as f64)?;
    if args.objective == Objective::E2e && run_spec.is_none() {
        anyhow::bail!(stepcast::Error::Invalid(
            "--objective e2e ranks by the whole run's time: give --tokens or --steps".into()
        ));
    }
    let models = super::layout::open_models(args.models.as_deref(), &cluster)?;
    let mut inputs = vec![
        super::stamp::cluster(&cluster),
        super::stamp::architecture(&args.model),
    ];
    inputs.extend(models.as_ref().map(super::stamp::models));
    inputs.extend(args.framework.as_deref().map(super::stamp::framework));
    let routing = match &args.moe_routing {
        Some(path) => {
            inputs.push(super::stamp::file("moe routing", path));
            Some(stepcast::workload::ExpertRouting::load(path)?)
        }
        None => None,
    };
    let cost = CostModel::new(&cluster, models)
        .with_transfer(super::layout::open_transfer(&cluster)?)
        .with_collectives(super::layout::open_collectives(&cluster)?)
        .with_framework(args.framework.as_deref());
    let cost = if args.no_calibration {
        cost.uncalibrated()
    } else {
        cost
    };
    let base = ParallelSpec {
        global_batch: Some(args.global_batch),
        seq_len: args.seq_len,
        dtype: args.dtype,
        rules: Some(args.rules),
        tp_comm_overlap: args.tp_comm_overlap,
        attention_kernel: args.attention_kernel,
        elementwise: args.elementwise,
        cross_entropy: args.cross_entropy,
        cuda_graphs: args.cuda_graphs.clone(),
        moe_imbalance: args.moe_imbalance,
        moe_dispatcher: args.moe_dispatcher,
        ..Default::default()
    };
    // searching for a framework export knows (--for, else --framework) costs what it runs
    // by default
    let framework = args
        .for_framework
        .or_else(|| args.framework.as_deref().and_then(|f| f.parse().ok()));
    let (base, implied) = match framework {
        Some(f) => {
            let defaults = f.implied(&base);
            let context_parallel = args
                .cp
                .as_ref()
                .map_or(seq >= 8192, |cps| cps.iter().any(|&c| c > 1));
            let note = super::layout::implied_note(f, &defaults, &base, context_parallel);
            (defaults.overridden_by(base), note)
        }
        None => (base, None),
    };
    let req = SearchRequest {
        arch: &arch,
        cluster: &cluster,
        gpus,
        base,
        space: SearchSpace {
            tp: args.tp.clone(),
            pp: args.pp.clone(),
            cp: args.cp.clone(),
            ep: args.ep.clone(),
            etp: args.etp.clone(),
            moe_a2a_overlap: args.moe_a2a_overlap.clone(),
            micro_batch: args.micro_batch.clone(),
            schedules: args.schedule.clone(),
            recompute: args.recompute.clone(),
            sequence_parallel: args.sequence_parallel.clone(),
            zero: args.zero.clone(),
            max_vpp: args.max_vpp,
        },
        allow_at_risk: args.allow_at_risk,
        objective: args.objective,
        run: run_spec,
        routing: routing.as_ref(),
        framework: args.for_framework,
    };
    let bar = super::output::Bar::new();
    let report = search_watched(&req, &cost, &bar);
    let mut report = report.inspect_err(|_| bar.finish())?;
    // the best rows again with their intervals (and the full prediction for the HTML page)
    let top: Vec<usize> = (0..report.rows.len())
        .filter(|&i| report.rows[i].status == Status::Predicted)
        .take(args.top.max(1))
        .collect();
    use stepcast::progress::Progress;
    bar.start("intervals of the best", top.len() as u64);
    let full: stepcast::Result<Vec<(usize, Prediction)>> = top
        .par_iter()
        .map(|&i| {
            let layout = &report.rows[i].layout;
            let p = predict(&arch, layout, &cluster, &cost, PredictOptions::default())?;
            bar.advance();
            Ok((i, p))
        })
        .collect();
    bar.finish();
    let full = full?;
    for (i, p) in &full {
        report.rows[*i].interval_s = Some(p.interval_s);
    }
    if let Some(path) = &args.csv {
        write_csv(path, &report)?;
    }
    if let Some(path) = &args.json {
        stepcast::fsutil::write_atomic(path, super::stamp::document(&report, inputs)?.as_bytes())?;
    }
    print_report(&args, gpus, &report, &arch, &cluster, implied.as_deref());
    if let (Some((i, best)), None) = (full.first(), &args.cuda_graphs) {
        let framework = args
            .for_framework
            .map(|f| f.name())
            .or(args.framework.as_deref());
        let layout = &report.rows[*i].layout;
        let step = best.metrics.step_time_s;
        if let Some(g) = super::graphs::advice(&arch, layout, &cluster, &cost, framework, step)? {
            println!("cuda graphs   {}", g.describe("the best layout"));
        }
    }
    if report.rows.is_empty() {
        let rules: Vec<String> = report
            .pruned
            .iter()
            .map(|(rule, n)| format!("{n} × {rule}"))
            .collect();
        let drop_for = report
            .framework
            .map(|f| format!(", or drop --for {f}"))
            .unwrap_or_default();
        anyhow::bail!(stepcast::Error::Invalid(format!(
            "no layout of {} on {} GPUs at global batch {} passed the rules ({}): use values \
             the rules allow, widen the search's lists (degrees, micro-batches, schedules, ZeRO \
             stages){drop_for}",
            arch.name,
            gpus,
            args.global_batch,
            rules.join("; ")
        )));
    }
    if report.predicted == 0 {
        let closest = report
            .rows
            .iter()
            .min_by(|a, b| a.memory_peak_gib.total_cmp(&b.memory_peak_gib))
            .map(|r| {
                format!(
                    "; the smallest needs {:.1} GiB (tp {} pp {} dp {}, micro-batch {}, recompute \
                     {}, ZeRO {})",
                    r.memory_peak_gib,
                    r.layout.tp,
                    r.layout.pp,
                    r.layout.dp,
                    r.layout.micro_batch,
                    recompute_name(r.layout.recompute),
                    r.layout.zero
                )
            })
            .unwrap_or_default();
        anyhow::bail!(stepcast::Error::Invalid(format!(
            "no layout of {} fits {} × {} ({:.0} GiB) at global batch {}{closest}: use more GPUs, \
             a smaller batch or --allow-at-risk",
            arch.name, gpus, cluster.spec.gpu.name, cluster.spec.gpu.memory_gib, args.global_batch
        )));
    }
    if let Some(path) = &args.html {
        let best = &full.first().expect("a predicted row").1;
        let command = report.best().map(|b| predict_command(&args, b));
        let page = super::report::SearchPage {
            title: format!(
                "Layout search: {} on {} GPUs, global batch {}",
                args.model, gpus, args.global_batch
            ),
            top: args.top,
            best_command: command.as_deref(),
        };
        let html = super::report::search_page(&page, &report, best)?;
        stepcast::fsutil::write_atomic(path, html.as_bytes())?;
        println!("HTML report written to {}", path.display());
    }
    Ok(())
}

/// `implied`: what the layouts were costed with as the framework searched for runs by default.
fn print_report(
    args: &SearchArgs,
    gpus: u64,
    report: &SearchReport,
    arch: &Arch,
    cluster: &Cluster,
    implied: Option<&str>,
) {
    println!(
        "{} on {} × {} ({}), global batch {} × {} tokens, ranked by {}",
        arch.name,
        gpus,
        cluster.spec.gpu.name,
        cluster.spec.name,
        args.global_batch,
        args.seq_len.unwrap_or(arch.seq_len),
        match args.objective {
            Objective::Step => "step time",
            Objective::E2e => "end-to-end run time",
        }
    );
    if let Some(f) = report.framework {
        println!("only layouts {f} runs as costed (what `stepcast export --format {f}` takes)");
    }
    if let Some(note) = implied {
        println!("{note}");
    }
    println!(
        "{} layouts enumerated, {} pruned by the rules, {} by memory, {} predicted in {:.2} s",
        report.enumerated,
        report.pruned.values().sum::<usize>(),
        report.pruned_memory,
        report.predicted,
        report.seconds
    );
    for (rule, n) in &report.pruned {
        println!("  pruned {n:>6} × {rule}");
    }
    if args.rules != Rules::Paper {
        println!(
            "{}",
            super::output::runtime_line(report.calibration.as_deref(), &report.runtime)
        );
        if let Some(line) = super::output::held_out_line(&report.calibration_held_out) {
            println!("{line}");
        }
    }
    if report.predicted == 0 {
        return;
    }
    let with_run = report.rows.first().is_some_and(|r| r.run.is_some());
    let mut header = vec![
        "#",
        "tp",
        "cp",
        "ep",
        "pp",
        "dp",
        "mb",
        "m",
        "vpp",
        "schedule",
        "recompute",
        "SP",
        "ZeRO",
        "step s (80 % interval)",
        "tok/s/GPU",
        "MFU %",
        "bubble %",
        "memory GiB (free)",
    ];
    if with_run {
        header.extend(["ETTR %", "end to end", "ckpt every"]);
    }
    let mut t = table(&header);
    for (i, r) in report
        .rows
        .iter()
        .filter(|r| r.status == Status::Predicted)
        .take(args.top.max(1))
        .enumerate()
    {
        let step = r.step_s().unwrap_or(f64::NAN);
        let interval = r
            .interval_s
            .map(|[lo, hi]| format!("{step:.3} ({lo:.3}–{hi:.3})"))
            .unwrap_or_else(|| format!("{step:.3}"));
        let mut cells = vec![
            (i + 1).to_string(),
            r.layout.tp.to_string(),
            r.layout.cp.to_string(),
            expert_cell(&r.layout),
            r.layout.pp.to_string(),
            r.layout.dp.to_string(),
            r.layout.micro_batch.to_string(),
            r.layout.micro_batches.to_string(),
            r.layout.vpp.to_string(),
            r.layout.schedule.name().to_string(),
            recompute_name(r.layout.recompute).to_string(),
            if r.layout.sequence_parallel {
                "yes"
            } else {
                "no"
            }
            .to_string(),
            r.layout.zero.to_string(),
            interval,
            format!(
                "{:.0}",
                r.metrics
                    .map(|m| m.tokens_per_s_per_gpu)
                    .unwrap_or(f64::NAN)
            ),
            format!(
                "{:.1}",
                r.metrics.map(|m| m.mfu_percent).unwrap_or(f64::NAN)
            ),
            format!(
                "{:.1}",
                100.0 * r.metrics.map(|m| m.bubble_ratio).unwrap_or(f64::NAN)
            ),
            format!("{:.1} ({:.1})", r.memory_peak_gib, r.memory_headroom_gib),
        ];
        if let Some(o) = r.run {
            cells.extend([
                format!("{:.2}", 100.0 * o.ettr),
                duration(o.end_to_end_s),
                o.checkpoint_interval.to_string(),
            ]);
        }
        t.add_row(cells);
    }
    align_numbers(&mut t, 1);
    // least needed first: cp when no row uses it, the run columns, free memory, bubble,
    // tokens/s, m, vpp, SP, rank
    let mut droppable: Vec<usize> = Vec::new();
    for (col, unused) in [
        (2, report.rows.iter().all(|r| r.layout.cp == 1)),
        (3, report.rows.iter().all(|r| r.layout.ep == 1)),
    ] {
        if unused {
            droppable.push(col);
        }
    }
    if with_run {
        droppable.extend([20, 19, 18]);
    }
    droppable.extend([17, 16, 14, 7, 8, 11, 0]);
    let hidden = super::output::fit(&mut t, &droppable);
    println!("{t}");
    if let Some(h) = hidden {
        println!("{h}");
    }
    if let Some(best) = report.best() {
        let predict = predict_command(args, best);
        println!("best: {predict}");
        if let Some(f) = report.framework {
            let export = predict.replacen(
                "stepcast predict",
                &format!("stepcast export --format {f}"),
                1,
            );
            println!("export: {export}");
        } else if report.best_runs_on.is_empty() {
            let all: Vec<&str> = Framework::ALL.iter().map(|f| f.name()).collect();
            println!(
                "note: none of {} runs the best layout as costed (`stepcast export` says why); \
                 --for FRAMEWORK ranks only the layouts one of them runs",
                all.join(", ")
            );
        } else {
            let on: Vec<&str> = report.best_runs_on.iter().map(|f| f.name()).collect();
            println!(
                "runs as costed on: {} (stepcast export --format …)",
                on.join(", ")
            );
        }
    }
    if let Some(w) = &report.beyond_calibration {
        println!("warning: the best layout lies {w}");
    }
    for (what, path) in [("CSV", &args.csv), ("JSON", &args.json)] {
        if let Some(p) = path {
            println!(
                "{what} of all {} layouts written to {}",
                report.rows.len(),
                p.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::shell_word;

    #[test]
    fn a_shell_word_is_quoted_only_where_a_shell_would_split_or_expand_it() {
        for plain in [
            "dgx-h100",
            "hardware-profiles/dgx-h100.yaml",
            "a_b.c:d=e,f@g%h+i",
        ] {
            assert_eq!(shell_word(plain), plain);
        }
        assert_eq!(shell_word("my models/x.yaml"), "'my models/x.yaml'");
        assert_eq!(shell_word("$HOME/m"), "'$HOME/m'");
        assert_eq!(shell_word("a*b"), "'a*b'");
        assert_eq!(shell_word("team's"), r"'team'\''s'");
        assert_eq!(shell_word(""), "''");
    }
}

//! Measured runs from torchtitan training logs and the job configuration they ran (`stepcast
//! runs import --format torchtitan`).
//!
//! torchtitan's rank 0 logs every `metrics.log_freq` steps one line, colored with terminal
//! escapes: `step: 20  loss:  6.4012  grad_norm: … memory: 38.51GiB(48.65%)  tps: 6,014
//! tflops: … mfu: …%`. Its `tps` is the tokens the rank's data-parallel batch held over the steps
//! since the last line, divided by their time and by the degrees that are not data-parallel
//! (tp · cp · pp; `MetricsProcessor.log` in torchtitan/components/metrics.py): tokens per second
//! per GPU. One step of the interval is then global batch · sequence / (GPUs · tps), and the
//! memory is PyTorch's peak reserved since the line before. The log does not print the layout:
//! it is read from the job's TOML, with the GPUs from the user where
//! `data_parallel_shard_degree = -1` takes what the others leave.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::megatron_log::{median_past_warmup, ImportOptions, ImportedRun};

/// What a torchtitan log says about its run: per logged line, the last step it covers, the
/// tokens per second per GPU over the steps since the line before, and the peak reserved
/// memory (GiB) if printed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TorchtitanLog {
    pub lines: Vec<(u64, f64, Option<f64>)>,
}

/// Reads a log's text: the training step lines (not evaluation or validation ones), any
/// launcher prefix and terminal colors ignored.
pub fn parse(text: &str) -> TorchtitanLog {
    let mut log = TorchtitanLog::default();
    for raw in text.lines() {
        let line = without_escapes(raw);
        if line.contains("evaluation:") || line.contains("validation") {
            continue;
        }
        let (Some(step), Some(tps)) = (number_after(&line, "step:"), number_after(&line, "tps:"))
        else {
            continue;
        };
        let memory = number_after(&line, "memory:").filter(|_| line.contains("GiB"));
        if step.fract() == 0.0 && step >= 1.0 && tps > 0.0 {
            log.lines.push((step as u64, tps, memory));
        }
    }
    log
}

/// `text` without ANSI escape sequences (`ESC [ … m`).
fn without_escapes(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // up to the sequence's final letter
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The number after the first `label` in `line` (thousands separators allowed, as torchtitan
/// prints `tps: 12,345`), at a word boundary: `step:` does not match `per_step:`.
fn number_after(line: &str, label: &str) -> Option<f64> {
    let at = line
        .match_indices(label)
        .find(|(i, _)| {
            line[..*i]
                .chars()
                .next_back()
                .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'))
        })?
        .0;
    let rest = line[at + label.len()..].trim_start();
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == ','))
        .unwrap_or(rest.len());
    rest[..end]
        .replace(',', "")
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite())
}

/// The sections of a torchtitan job configuration (TOML) a run's layout is read from, with
/// torchtitan's defaults (torchtitan/config/job_config.py) for what the file leaves out.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct JobConfig {
    model: ModelSection,
    training: TrainingSection,
    parallelism: ParallelismSection,
    activation_checkpoint: CheckpointSection,
    compile: CompileSection,
    /// float8 as older torchtitan switched it on (`[float8] enable_float8_linear`), before
    /// `[model] converters`
    float8: Float8Section,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Float8Section {
    enable_float8_linear: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ModelSection {
    name: Option<String>,
    flavor: Option<String>,
    converters: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(default)]
struct TrainingSection {
    local_batch_size: Option<u64>,
    /// (the name before `local_batch_size`)
    batch_size: Option<u64>,
    global_batch_size: i64,
    seq_len: u64,
    mixed_precision_param: String,
}

impl Default for TrainingSection {
    fn default() -> Self {
        TrainingSection {
            local_batch_size: None,
            batch_size: None,
            global_batch_size: -1,
            seq_len: 2048,
            mixed_precision_param: "bfloat16".into(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(default)]
struct ParallelismSection {
    data_parallel_replicate_degree: i64,
    data_parallel_shard_degree: i64,
    tensor_parallel_degree: i64,
    context_parallel_degree: i64,
    pipeline_parallel_degree: i64,
    pipeline_parallel_schedule: String,
    pipeline_parallel_microbatch_size: u64,
    pipeline_parallel_layers_per_stage: Option<u64>,
    pipeline_parallel_first_stage_less_layers: u64,
    pipeline_parallel_last_stage_less_layers: u64,
    context_parallel_rotate_method: String,
    enable_async_tensor_parallel: bool,
}

impl Default for ParallelismSection {
    fn default() -> Self {
        ParallelismSection {
            data_parallel_replicate_degree: 1,
            data_parallel_shard_degree: -1,
            tensor_parallel_degree: 1,
            context_parallel_degree: 1,
            pipeline_parallel_degree: 1,
            pipeline_parallel_schedule: "1F1B".into(),
            pipeline_parallel_microbatch_size: 1,
            pipeline_parallel_layers_per_stage: None,
            pipeline_parallel_first_stage_less_layers: 1,
            pipeline_parallel_last_stage_less_layers: 1,
            context_parallel_rotate_method: "allgather".into(),
            enable_async_tensor_parallel: false,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(default)]
struct CheckpointSection {
    mode: String,
    selective_ac_option: String,
}

impl Default for CheckpointSection {
    fn default() -> Self {
        CheckpointSection {
            mode: "selective".into(),
            selective_ac_option: "2".into(),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct CompileSection {
    enable: bool,
}

/// Reads a job configuration's text.
pub fn parse_config(text: &str) -> Result<JobConfig, String> {
    let not_one = |why: String| {
        format!(
            "not a torchtitan job configuration ({why}): give the TOML the run was launched \
             with (--job.config_file)"
        )
    };
    let table: toml::Table = toml::from_str(text).map_err(|e| not_one(e.message().into()))?;
    // torchtitan before its [parallelism] section kept the degrees under [training] and
    // [experimental]: read as absent, they would import another layout
    for section in ["training", "experimental"] {
        if let Some(key) = table
            .get(section)
            .and_then(toml::Value::as_table)
            .and_then(|t| t.keys().find(|k| k.ends_with("_degree")))
        {
            return Err(format!(
                "[{section}] {key}: an older torchtitan's configuration, which kept the parallel \
                 degrees there; move them under [parallelism] as torchtitan now reads them"
            ));
        }
    }
    JobConfig::deserialize(table).map_err(|e| not_one(e.message().into()))
}

/// A parallel degree as torchtitan takes it: 1 or more (-1 only where torchtitan fills it in).
fn degree(name: &str, value: i64) -> Result<u64, String> {
    u64::try_from(value)
        .ok()
        .filter(|&v| (1..=1 << 20).contains(&v))
        .ok_or_else(|| format!("[parallelism] {name} = {value}: give a degree of 1 or more"))
}

/// What a job configuration fixes of every run launched with it: the runs-CSV columns of its
/// layout, the GPUs, the tokens one step trains and the warm-up its logs' steps are read past.
/// Kept apart from the logs so that a refusal names the file at fault: the job's (or
/// `--gpus`'s, `--model`'s) here, a log's in [`import`].
#[derive(Debug, Clone)]
pub struct Job {
    columns: BTreeMap<&'static str, String>,
    gpus: u64,
    tokens: f64,
    warmup_iterations: u64,
}

/// The layout `config` runs on `gpus` GPUs. The model is the one the user named, else the
/// preset torchtitan's `[model]` name and flavor are (Llama 3's 8B, 70B and 405B); `layers` is
/// its layer count, for the pipeline's model chunks.
pub fn job(
    config: &JobConfig,
    gpus: u64,
    layers: impl FnOnce(&str) -> Result<u64, String>,
    options: &ImportOptions,
) -> Result<Job, String> {
    let p = &config.parallelism;
    let tp = degree("tensor_parallel_degree", p.tensor_parallel_degree)?;
    let cp = degree("context_parallel_degree", p.context_parallel_degree)?;
    let pp = degree("pipeline_parallel_degree", p.pipeline_parallel_degree)?;
    let replicate = degree(
        "data_parallel_replicate_degree",
        p.data_parallel_replicate_degree,
    )?;
    let model_parallel = [tp, cp, pp, replicate]
        .iter()
        .try_fold(1u64, |all, &d| all.checked_mul(d))
        .filter(|&all| all <= gpus)
        .ok_or_else(|| {
            format!(
                "tp {tp} · cp {cp} · pp {pp} · replicate {replicate} is more than the {gpus} \
                 GPUs given: give the GPUs the run used (--gpus)"
            )
        })?;
    let shard = match p.data_parallel_shard_degree {
        -1 if gpus.is_multiple_of(model_parallel) => gpus / model_parallel,
        -1 => {
            return Err(format!(
                "{gpus} GPUs do not divide over tp {tp} · cp {cp} · pp {pp} · replicate \
                 {replicate}: give the GPUs the run used (--gpus)"
            ))
        }
        n => degree("data_parallel_shard_degree", n)?,
    };
    if model_parallel.checked_mul(shard) != Some(gpus) {
        return Err(format!(
            "tp {tp} · cp {cp} · pp {pp} · replicate {replicate} · shard {shard} is {} GPUs, \
             not the {gpus} given: give the GPUs the run used (--gpus)",
            model_parallel as f64 * shard as f64
        ));
    }
    // FSDP shards over the shard degree; both at once (HSDP) is not a layout stepcast costs
    let (dp, zero) = match (replicate, shard) {
        (r, 1) => (r, 0),
        (1, s) => (s, 3),
        (r, s) => {
            return Err(format!(
                "replicate {r} × shard {s} is HSDP, which stepcast does not cost: import runs \
                 that replicate (DDP) or shard (FSDP) alone"
            ))
        }
    };
    let t = &config.training;
    let local = t.local_batch_size.or(t.batch_size).unwrap_or(8);
    if local == 0 {
        return Err(
            "[training] local_batch_size = 0: give the batch each data-parallel rank trains a \
             step (1 or more)"
                .into(),
        );
    }
    // both 1 or more: a product of 0 cannot be, an overflow is None
    let per_step = local.checked_mul(dp);
    let global_batch = match t.global_batch_size {
        g if g <= 0 => per_step.unwrap_or(0),
        g => g as u64,
    };
    if !per_step.is_some_and(|n| global_batch.is_multiple_of(n)) {
        return Err(format!(
            "[training] global_batch_size {global_batch} is not a multiple of local_batch_size \
             {local} × {dp} data-parallel ranks"
        ));
    }
    let micro_batch = if pp > 1 {
        p.pipeline_parallel_microbatch_size
    } else {
        local
    };
    if micro_batch == 0 || !local.is_multiple_of(micro_batch) {
        return Err(format!(
            "[parallelism] pipeline_parallel_microbatch_size {micro_batch} does not divide \
             local_batch_size {local}"
        ));
    }
    let seq_len = t.seq_len;
    if !(1..=1 << 24).contains(&seq_len) {
        return Err(format!(
            "[training] seq_len = {seq_len}: give the sequence the run trained on (1 to 16M)"
        ));
    }
    let float8 = config.float8.enable_float8_linear
        || config.model.converters.iter().any(|c| c.contains("float8"));
    let dtype = if float8 {
        "fp8"
    } else {
        match t.mixed_precision_param.as_str() {
            "bfloat16" => "bf16",
            "float32" => "fp32",
            other => {
                return Err(format!(
                    "[training] mixed_precision_param = \"{other}\": torchtitan trains in \
                     bfloat16 or float32"
                ))
            }
        }
    };
    if let Some(c) = config
        .model
        .converters
        .iter()
        .find(|c| !c.contains("float8"))
    {
        return Err(format!(
            "[model] converters holds \"{c}\", which stepcast does not cost (float8 only)"
        ));
    }
    let a = &config.activation_checkpoint;
    let recompute = match (a.mode.as_str(), a.selective_ac_option.as_str()) {
        ("none", _) => "none",
        ("full", _) => "full",
        ("selective", "op") => "selective-op",
        ("selective", "2") => "selective-layer",
        (mode, option) => {
            return Err(format!(
                "[activation_checkpoint] mode \"{mode}\" with selective_ac_option \
                 \"{option}\": stepcast costs none, full, and selective with \"op\" or \"2\" \
                 (every other layer)"
            ))
        }
    };
    let model = match (&options.model, &config.model.name, &config.model.flavor) {
        (Some(m), ..) => m.clone(),
        (None, Some(name), Some(flavor)) => crate::export::torchtitan_preset(name, flavor)
            .ok_or_else(|| {
                format!(
                    "[model] {name} {flavor} is not a preset stepcast has: give --model (a \
                     preset or an architecture file)"
                )
            })?
            .to_string(),
        _ => {
            return Err("[model] names no name and flavor: give --model".into());
        }
    };
    if pp > 1
        && (p.pipeline_parallel_first_stage_less_layers > 1
            || p.pipeline_parallel_last_stage_less_layers > 1)
    {
        return Err(
            "[parallelism] pipeline_parallel_first|last_stage_less_layers above 1: stepcast \
             counts the embedding and the output as one layer or none"
                .into(),
        );
    }
    let (schedule, vpp) = if pp > 1 {
        let (schedule, looped) = match p.pipeline_parallel_schedule.as_str() {
            "1F1B" => ("1f1b", false),
            "GPipe" => ("gpipe", false),
            "Interleaved1F1B" => ("interleaved", true),
            "ZBVZeroBubble" => ("zb-v", true),
            other => {
                return Err(format!(
                    "[parallelism] pipeline_parallel_schedule = \"{other}\": stepcast costs \
                     1F1B, GPipe, Interleaved1F1B and ZBVZeroBubble"
                ))
            }
        };
        let stages = match p.pipeline_parallel_layers_per_stage {
            Some(per) if per > 0 => {
                let places = layers(&model)?
                    + p.pipeline_parallel_first_stage_less_layers
                    + p.pipeline_parallel_last_stage_less_layers;
                places.div_ceil(per)
            }
            _ => pp * if looped { 2 } else { 1 },
        };
        if !stages.is_multiple_of(pp) {
            return Err(format!(
                "{stages} pipeline stages over pp {pp}: torchtitan refuses this configuration"
            ));
        }
        (schedule, stages / pp)
    } else {
        ("1f1b", 1)
    };
    let pipeline_split = super::megatron_log::pipeline_split_column(
        pp > 1 && p.pipeline_parallel_first_stage_less_layers == 1,
        pp > 1 && p.pipeline_parallel_last_stage_less_layers == 1,
    );

    let mut c: BTreeMap<&'static str, String> = BTreeMap::new();
    let mut put = |k: &'static str, v: String| {
        c.insert(k, v);
    };
    put("set", options.set.clone());
    put(
        "family",
        options
            .family
            .clone()
            .unwrap_or_else(|| super::megatron_log::family_of(&model)),
    );
    put(
        "label",
        format!(
            "{model} {gpus} GPUs tp{tp} pp{pp} cp{cp} dp{dp} mbs{micro_batch} gbs{global_batch} \
             {} torchtitan {}",
            dtype.to_uppercase(),
            if zero == 3 { "FSDP" } else { "DDP" }
        ),
    );
    put("cluster", options.cluster.clone());
    put("model", model);
    put("framework", "torchtitan".into());
    put("tp", tp.to_string());
    put("pp", pp.to_string());
    put("dp", dp.to_string());
    put("cp", cp.to_string());
    if cp > 1 {
        put(
            "cp_comm",
            match p.context_parallel_rotate_method.as_str() {
                "alltoall" => "p2p",
                _ => "all-gather",
            }
            .into(),
        );
    }
    put("pipeline_split", pipeline_split.into());
    put("micro_batch", micro_batch.to_string());
    put("global_batch", global_batch.to_string());
    put("seq_len", seq_len.to_string());
    put("dtype", dtype.into());
    if dtype == "fp8" {
        put("fp8_library", "torchao".into());
    }
    put("recompute", recompute.into());
    put("zero", zero.to_string());
    put("schedule", schedule.into());
    put("vpp", vpp.to_string());
    // torchtitan's tensor parallelism shards the norms over the sequence
    put("sequence_parallel", (tp > 1).to_string());
    let async_tp = p.enable_async_tensor_parallel && tp > 1;
    put("tp_comm_overlap", if async_tp { "1" } else { "0" }.into());
    // the gradient reduction's and the weight gathers' overlap: the layout's defaults for the
    // sharding (FSDP and DDP reduce in the backward; what predict costs for the same layout)
    put("grad_reduce_dtype", "fp32".into());
    put("attention_kernel", "flash-attention-2".into());
    put("cross_entropy", "pytorch".into());
    put(
        "elementwise",
        if config.compile.enable {
            "fused"
        } else {
            "eager"
        }
        .into(),
    );
    put("expressible", "true".into());
    Ok(Job {
        columns: c,
        gpus,
        tokens: global_batch as f64 * seq_len as f64,
        warmup_iterations: options.warmup_iterations,
    })
}

/// One log of a run of `job` as a runs-CSV row.
pub fn import(log: &TorchtitanLog, job: &Job) -> Result<ImportedRun, String> {
    // per logged line: the mean step over the interval, from tokens per second per GPU
    let intervals: Vec<(u64, f64)> = log
        .lines
        .iter()
        .map(|&(step, tps, _)| (step, 1e3 * job.tokens / (job.gpus as f64 * tps)))
        .collect();
    let (step_ms, intervals_used, iterations) =
        median_past_warmup(&intervals, job.warmup_iterations).ok_or_else(|| {
            format!(
                "no step line past step {} ({} logged in all, `step: N … tps: T`, which \
                 torchtitan's rank 0 prints every metrics.log_freq steps): train longer, or \
                 give a smaller --warmup-iterations",
                job.warmup_iterations,
                log.lines.len()
            )
        })?;
    // a step of 100 µs to a day, as a runs CSV takes it
    if !(0.1..=86_400_000.0).contains(&step_ms) {
        return Err(format!(
            "{:.3e} s a step is not a training step's time: check --gpus and the job's batch \
             and sequence against the log",
            step_ms / 1e3
        ));
    }
    let memory = log
        .lines
        .iter()
        .filter(|(step, ..)| *step > job.warmup_iterations)
        .filter_map(|(.., m)| *m)
        .reduce(f64::max);

    let mut c = job.columns.clone();
    c.insert("measured_step_s", format!("{}", step_ms / 1e3));
    if let Some(gib) = memory {
        c.insert("measured_memory_gib", format!("{gib:.3}"));
        c.insert("memory_scope", "allocator".into());
    }
    c.insert(
        "source",
        format!(
            "{} (tokens per second per GPU), steps {}–{}",
            super::megatron_log::intervals_phrase(intervals_used),
            iterations.0,
            iterations.1
        ),
    );
    Ok(ImportedRun {
        columns: c,
        arch: None,
        step_ms,
        intervals_used,
        iterations,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// rank 0's lines as torchtitan colors them (a launcher prefix, escapes around each field)
    fn line(step: u64, tps: &str, memory: &str) -> String {
        format!(
            "[rank0]:[titan] 2025-06-01 12:00:00,000 - root - INFO - \u{1b}[31mstep: {step:2}  \
             \u{1b}[32mloss:  6.4012  \u{1b}[38;2;180;60;0mgrad_norm:  1.2345  \
             \u{1b}[38;2;54;234;195mmemory: {memory}GiB(48.65%)  \u{1b}[34mtps: {tps}  \
             \u{1b}[36mtflops: 300.12  \u{1b}[35mmfu: 30.35%\u{1b}[39m"
        )
    }

    fn options(model: Option<&str>) -> ImportOptions {
        ImportOptions {
            set: "mine".into(),
            family: None,
            cluster: "dgx-h100".into(),
            model: model.map(str::to_string),
            warmup_iterations: 10,
        }
    }

    fn llama3_layers(model: &str) -> Result<u64, String> {
        crate::workload::Arch::resolve(model)
            .map(|a| a.layers)
            .map_err(|e| e.to_string())
    }

    /// A log of a run of `config` on `gpus` GPUs, as `runs import` reads the two.
    fn imported(
        log: &TorchtitanLog,
        config: &JobConfig,
        gpus: u64,
        layers: fn(&str) -> Result<u64, String>,
        options: &ImportOptions,
    ) -> Result<ImportedRun, String> {
        import(log, &job(config, gpus, layers, options)?)
    }

    /// Steps 1 and 10 (warm-up, the peak memory of step 10 above the rest), then 20 and 30 at
    /// 6,000 and 6,400 tokens per second per GPU.
    fn log() -> TorchtitanLog {
        let text = [
            line(1, "512", "30.00"),
            line(10, "5,900", "40.00"),
            "[rank0]: evaluation:  step: 20  loss: 6.1  memory: 50.00GiB(60%)  tps: 9,999".into(),
            line(20, "6,000", "38.51"),
            line(30, "6,400", "38.25"),
        ]
        .join("\n");
        parse(&text)
    }

    #[test]
    fn step_lines_are_read_through_their_colors_and_separators() {
        let log = log();
        assert_eq!(
            log.lines,
            [
                (1, 512.0, Some(30.0)),
                (10, 5900.0, Some(40.0)),
                (20, 6000.0, Some(38.51)),
                (30, 6400.0, Some(38.25)),
            ]
        );
        // a label inside another word is not the label
        assert_eq!(number_after("per_step: 3  step: 4", "step:"), Some(4.0));
        assert_eq!(number_after("tps: n/a", "tps:"), None);
        assert!(parse("step: 0  tps: 10").lines.is_empty());
        // a line of no throughput times no step (it would be an endless one)
        assert!(parse("step: 3  tps: 0").lines.is_empty());
    }

    /// Llama 3 8B's flavor on 8 GPUs, FSDP filling what tp leaves, torchtitan's defaults
    /// elsewhere: a step is global batch · sequence / (GPUs · tps), the median over the lines
    /// past the warm-up (2.731 s at 6,000 and 2.560 s at 6,400: 2.645 s), the memory their
    /// peak.
    #[test]
    fn a_job_and_its_log_make_the_row_torchtitan_ran() {
        let config = parse_config(
            "[model]\nname = \"llama3\"\nflavor = \"8B\"\n\n[training]\nlocal_batch_size = 4\n\
             seq_len = 8192\n\n[parallelism]\ntensor_parallel_degree = 2\n\n[compile]\n\
             enable = true\n",
        )
        .unwrap();
        let run = imported(&log(), &config, 8, llama3_layers, &options(None)).unwrap();
        let c = &run.columns;
        let want = [
            ("model", "llama3-8b"),
            ("family", "llama3-8b"),
            ("framework", "torchtitan"),
            ("tp", "2"),
            ("pp", "1"),
            ("dp", "4"),
            ("cp", "1"),
            ("zero", "3"),
            ("micro_batch", "4"),
            ("global_batch", "16"),
            ("seq_len", "8192"),
            ("dtype", "bf16"),
            ("recompute", "selective-layer"),
            ("sequence_parallel", "true"),
            ("elementwise", "fused"),
            ("attention_kernel", "flash-attention-2"),
            ("cross_entropy", "pytorch"),
            ("measured_memory_gib", "38.510"),
            ("memory_scope", "allocator"),
        ];
        for (k, v) in want {
            assert_eq!(c[k], v, "{k}");
        }
        let at = |tps: f64| 16.0 * 8192.0 / (8.0 * tps);
        let expected = (at(6000.0) + at(6400.0)) / 2.0;
        assert!((run.step_ms / 1e3 / expected - 1.0).abs() < 1e-12);
        assert_eq!((run.intervals_used, run.iterations), (2, (20, 30)));
        assert!(run.arch.is_none());
        // float8 as a converter, or as older torchtitan switched it on
        for toml in [
            "[model]\nconverters = [\"float8\"]\n",
            "[float8]\nenable_float8_linear = true\n",
        ] {
            let config = parse_config(toml).unwrap();
            let run = imported(
                &log(),
                &config,
                8,
                llama3_layers,
                &options(Some("llama3-8b")),
            );
            let c = run.unwrap().columns;
            assert_eq!((&c["dtype"][..], &c["fp8_library"][..]), ("fp8", "torchao"));
        }
    }

    /// The pipeline's chunks as torchtitan counts its stages (layers per stage over the layers
    /// and the ends' weights, or one or two a rank by the schedule), the ends' weights as the
    /// pipeline split, the context exchange by its rotation, and asynchronous tensor
    /// parallelism and sequence-parallel norms only where tensor parallelism runs.
    #[test]
    fn chunks_ends_context_exchange_and_async_tp_are_read_as_torchtitan_runs_them() {
        let columns = |toml: &str, gpus: u64| {
            let config = parse_config(toml).unwrap();
            let named = options(Some("llama3-8b"));
            imported(&log(), &config, gpus, llama3_layers, &named)
                .unwrap()
                .columns
        };
        let pipeline = "[parallelism]\npipeline_parallel_degree = 2\n";
        // (the job's TOML, its GPUs, the columns it imports as)
        type Case = (String, u64, &'static [(&'static str, &'static str)]);
        let cases: [Case; 8] = [
            // an interleaved schedule's default: two chunks a rank, the ends weighing a layer
            (
                format!("{pipeline}pipeline_parallel_schedule = \"Interleaved1F1B\"\n"),
                2,
                &[
                    ("schedule", "interleaved"),
                    ("vpp", "2"),
                    ("pipeline_split", "embedding+loss"),
                ],
            ),
            // 32 layers and ends of no weight, 8 a stage: 4 stages, 2 a rank
            (
                format!(
                    "{pipeline}pipeline_parallel_schedule = \"Interleaved1F1B\"\n\
                     pipeline_parallel_layers_per_stage = 8\n\
                     pipeline_parallel_first_stage_less_layers = 0\n\
                     pipeline_parallel_last_stage_less_layers = 0\n"
                ),
                2,
                &[("vpp", "2"), ("pipeline_split", "")],
            ),
            (
                format!("{pipeline}pipeline_parallel_last_stage_less_layers = 0\n"),
                2,
                &[("vpp", "1"), ("pipeline_split", "embedding")],
            ),
            // without a pipeline the ends' weights mean nothing
            (
                "[parallelism]\ntensor_parallel_degree = 2\n".into(),
                8,
                &[
                    ("pipeline_split", ""),
                    ("sequence_parallel", "true"),
                    ("tp_comm_overlap", "0"),
                ],
            ),
            // without tensor parallelism the norms are not sequence-parallel
            (
                "[training]\nlocal_batch_size = 1\n".into(),
                8,
                &[("sequence_parallel", "false")],
            ),
            (
                "[parallelism]\ntensor_parallel_degree = 2\nenable_async_tensor_parallel = true\n"
                    .into(),
                8,
                &[("tp_comm_overlap", "1")],
            ),
            (
                "[parallelism]\ncontext_parallel_degree = 2\n".into(),
                8,
                &[("cp", "2"), ("dp", "4"), ("cp_comm", "all-gather")],
            ),
            (
                "[parallelism]\ncontext_parallel_degree = 2\n\
                 context_parallel_rotate_method = \"alltoall\"\n"
                    .into(),
                8,
                &[("cp_comm", "p2p")],
            ),
        ];
        for (toml, gpus, want) in cases {
            let c = columns(&toml, gpus);
            for (k, v) in want {
                assert_eq!(c.get(*k).map(String::as_str), Some(*v), "{k}: {toml}");
            }
        }
        // asynchronous tensor parallelism without tensor parallelism overlaps nothing; no
        // context exchange without context parallelism
        let c = columns("[parallelism]\nenable_async_tensor_parallel = true\n", 8);
        assert_eq!(c["tp_comm_overlap"], "0");
        assert!(!c.contains_key("cp_comm"), "{c:?}");
    }

    /// What `stepcast export --format torchtitan` writes is read back as the layout it was
    /// made from: the pipeline's chunks, the micro-batches, the checkpointing, DDP.
    #[test]
    fn an_exported_job_is_imported_as_the_layout_it_came_from() {
        use crate::workload::{Layout, ParallelSpec, Recompute, Schedule};
        let cluster = crate::hardware::dgx_h100_without_models();
        let arch = crate::workload::Arch::resolve("llama3-8b").unwrap();
        for (schedule, vpp, zero, recompute) in [
            (Schedule::OneFOneB, 1, 3, Recompute::Full),
            (Schedule::Interleaved, 2, 0, Recompute::SelectiveOp),
            (Schedule::ZbV, 2, 3, Recompute::None),
        ] {
            let spec = ParallelSpec {
                tp: Some(2),
                pp: Some(2),
                dp: Some(2),
                micro_batch: Some(1),
                global_batch: Some(32),
                sequence_parallel: Some(true),
                schedule: Some(schedule),
                vpp: Some(vpp),
                zero: Some(zero),
                recompute: Some(recompute),
                ..crate::export::Framework::Torchtitan.implied(&ParallelSpec::default())
            };
            let layout = Layout::new(&spec, &arch, &cluster).unwrap();
            let target = crate::export::Target {
                arch: &arch,
                layout: &layout,
                gpus_per_node: 8,
                headline: "test".into(),
            };
            let toml = crate::export::export(crate::export::Framework::Torchtitan, &target)
                .unwrap()
                .text;
            let config = parse_config(&toml).unwrap();
            let run = imported(&log(), &config, 8, llama3_layers, &options(None)).unwrap();
            let c = &run.columns;
            let want = [
                ("tp", "2".to_string()),
                ("pp", "2".into()),
                ("dp", "2".into()),
                ("zero", zero.to_string()),
                ("micro_batch", "1".into()),
                ("global_batch", "32".into()),
                ("schedule", schedule.name().into()),
                ("vpp", vpp.to_string()),
                ("recompute", recompute.name().into()),
                ("pipeline_split", String::new()),
                ("elementwise", "eager".into()),
            ];
            for (k, v) in want {
                assert_eq!(c[k], v, "{schedule:?} {k}: {toml}");
            }
        }
    }

    /// What torchtitan runs but stepcast does not cost, or a configuration that does not add
    /// up, is refused with the field and the fix.
    #[test]
    fn what_cannot_be_costed_is_refused_naming_the_field() {
        let refused = |toml: &str, gpus: u64| {
            let config = match parse_config(toml) {
                Ok(config) => config,
                Err(e) => return e,
            };
            imported(
                &log(),
                &config,
                gpus,
                llama3_layers,
                &options(Some("llama3-8b")),
            )
            .unwrap_err()
        };
        let cases = [
            (
                "[parallelism]\ndata_parallel_replicate_degree = 2\n",
                8,
                "HSDP",
            ),
            (
                "[parallelism]\ntensor_parallel_degree = 3\n",
                8,
                "do not divide",
            ),
            (
                "[parallelism]\ndata_parallel_shard_degree = 2\n",
                8,
                "not the 8 given",
            ),
            (
                "[parallelism]\ntensor_parallel_degree = 0\n",
                8,
                "degree of 1 or more",
            ),
            ("[model]\nconverters = [\"mx\"]\n", 8, "\"mx\""),
            (
                "[activation_checkpoint]\nselective_ac_option = \"3\"\n",
                8,
                "\"3\"",
            ),
            (
                "[training]\nmixed_precision_param = \"float16\"\n",
                8,
                "float16",
            ),
            ("[training]\nseq_len = 0\n", 8, "seq_len = 0"),
            (
                "[parallelism]\npipeline_parallel_degree = 2\n\
                 pipeline_parallel_first_stage_less_layers = 2\n",
                2,
                "less_layers above 1",
            ),
            (
                "[parallelism]\npipeline_parallel_degree = 2\n\
                 pipeline_parallel_last_stage_less_layers = 2\n",
                2,
                "less_layers above 1",
            ),
            (
                "[parallelism]\npipeline_parallel_degree = 2\n\
                 pipeline_parallel_microbatch_size = 3\n",
                2,
                "pipeline_parallel_microbatch_size 3 does not divide local_batch_size 8",
            ),
            (
                "[training]\nlocal_batch_size = 0\n\n[parallelism]\npipeline_parallel_degree = 2\n",
                2,
                "local_batch_size = 0",
            ),
            (
                "[training]\ntensor_parallel_degree = 2\n",
                8,
                "[training] tensor_parallel_degree: an older torchtitan's",
            ),
            (
                "[experimental]\npipeline_parallel_degree = 2\n",
                8,
                "[experimental] pipeline_parallel_degree",
            ),
            (
                "[training]\nseq_len = 16777216\nlocal_batch_size = 1000000\n",
                8,
                "not a training step's",
            ),
            (
                "[parallelism]\ntensor_parallel_degree = 1048576\n\
                 pipeline_parallel_degree = 1048576\n",
                8,
                "more than the 8 GPUs",
            ),
            (
                "[training]\nglobal_batch_size = 12\nlocal_batch_size = 8\n",
                1,
                "multiple",
            ),
            (
                "[parallelism]\npipeline_parallel_degree = 2\n\
                 pipeline_parallel_layers_per_stage = 16\n",
                2,
                "3 pipeline stages over pp 2",
            ),
            // 32 layers and the embedding's weight of one, 8 a stage: 5 stages
            (
                "[parallelism]\npipeline_parallel_degree = 2\n\
                 pipeline_parallel_layers_per_stage = 8\n\
                 pipeline_parallel_last_stage_less_layers = 0\n",
                2,
                "5 pipeline stages over pp 2",
            ),
            (
                "[parallelism]\npipeline_parallel_degree = 2\n\
                 pipeline_parallel_schedule = \"DualPipeV\"\n",
                2,
                "DualPipeV",
            ),
        ];
        for (toml, gpus, want) in cases {
            let e = refused(toml, gpus);
            assert!(e.contains(want), "{toml}: {e}");
        }
        // without a pipeline its settings mean nothing: one chunk, 1F1B
        let config = parse_config(
            "[parallelism]\npipeline_parallel_first_stage_less_layers = 2\n\
             pipeline_parallel_last_stage_less_layers = 3\n\
             pipeline_parallel_layers_per_stage = 16\n\
             pipeline_parallel_schedule = \"DualPipeV\"\n",
        )
        .unwrap();
        let named = options(Some("llama3-8b"));
        let c = imported(&log(), &config, 8, llama3_layers, &named)
            .unwrap()
            .columns;
        assert_eq!((&c["vpp"][..], &c["schedule"][..]), ("1", "1f1b"));
        // no layers per stage: torchtitan's default chunks (one a rank for 1F1B)
        let config = parse_config(
            "[parallelism]\npipeline_parallel_degree = 2\n\
             pipeline_parallel_layers_per_stage = 0\n",
        )
        .unwrap();
        let c = imported(&log(), &config, 2, llama3_layers, &named)
            .unwrap()
            .columns;
        assert_eq!((&c["pp"][..], &c["vpp"][..]), ("2", "1"));
        let config = parse_config("[model]\nname = \"qwen3\"\nflavor = \"8B\"\n").unwrap();
        let e = imported(&log(), &config, 8, llama3_layers, &options(None)).unwrap_err();
        assert!(e.contains("qwen3 8B") && e.contains("--model"), "{e}");
        let e = imported(
            &parse(&line(5, "10", "1")),
            &config,
            8,
            llama3_layers,
            &options(Some("llama3-8b")),
        )
        .unwrap_err();
        assert!(e.contains("no step line past step 10"), "{e}");
        let e = parse_config("[training\n").unwrap_err();
        assert!(e.contains("not a torchtitan job configuration"), "{e}");
    }
}

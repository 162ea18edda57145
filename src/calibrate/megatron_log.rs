//! Measured runs from Megatron-LM training logs, so `stepcast calibrate` can be fitted to one's
//! own runs without writing the runs CSV by hand (`stepcast runs import`).
//!
//! What a job's output holds: rank 0 prints every argument once at start — a line
//! `------------------------ arguments ------------------------`, one `name ..... value` line
//! per argument (Megatron-LM's `_print_args`, after `validate_args` has filled the derived
//! ones: `world_size`, `data_parallel_size`, `padded_vocab_size`,
//! `virtual_pipeline_model_parallel_size`), then `-------------------- end of arguments
//! ---------------------`; every `log_interval` iterations a line with the mean time per
//! iteration over the interval (`iteration 20/ 100 | … | elapsed time per iteration (ms):
//! 1234.5 | …`, some versions `1234.5/1200.0`, the interval's and a running mean), printed by
//! the last rank; after the
//! first interval each reporting rank's memory (`[Rank 0] (after 10 iterations) memory (MB) |
//! allocated: … | max reserved: …`). From these a run is the layout and precision as `predict`
//! takes them, the architecture (unless the user names one), the median interval past the
//! warm-up and the largest peak reserved memory any rank reported. Megatron-Bridge (NeMo 2)
//! prints the same iteration lines but a configuration instead of the dump
//! (`args_of_bridge_config` reads it as the dump).

use std::collections::BTreeMap;

use crate::workload::{
    Activation, ArchSpec, AttentionImpl, CausalBlocks, MlaSpec, MoeSpec, NormKind, Position,
    QkNormSpan,
};

/// What a Megatron-LM log says about its run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MegatronLog {
    /// Every argument as printed (Python's `None` kept as the text `None`).
    pub args: BTreeMap<String, String>,
    /// Per logged interval: the last iteration it covers and its mean milliseconds per
    /// iteration; intervals that skipped an iteration or hit a NaN are left out.
    pub intervals: Vec<(u64, f64)>,
    /// The largest `max reserved` any rank reported, MiB.
    pub max_reserved_mib: Option<f64>,
    /// Megatron-DeepSpeed runs: the DeepSpeed engine's configuration as rank 0 prints it
    /// (`DeepSpeedEngine configuration:`, then `  zero_optimization_stage ...... 1` and the
    /// like) — what ran, where the arguments only say what the launch script asked for.
    pub deepspeed: BTreeMap<String, String>,
}

/// The label the iteration time follows on an iteration line.
const ELAPSED: &str = "elapsed time per iteration (ms):";

/// Reads a log's text (any launcher prefix before Megatron's own text is ignored).
pub fn parse(text: &str) -> MegatronLog {
    let mut log = MegatronLog::default();
    let (mut in_args, mut in_deepspeed, mut padded) = (false, false, None);
    for line in text.lines() {
        if line.contains("end of arguments") {
            in_args = false;
        } else if line.contains("-- arguments --") {
            in_args = true;
        } else if in_args {
            if let Some((name, value)) = argument(line) {
                log.args.insert(name, value);
            }
        } else if line.contains("DeepSpeedEngine configuration:") {
            in_deepspeed = true;
        } else if in_deepspeed && (line.contains("json = ") || line.contains("print_user_config")) {
            // the user's JSON follows the engine's own settings
            in_deepspeed = false;
        } else if in_deepspeed {
            if let Some((name, value)) = argument(line) {
                log.deepspeed.insert(name, value);
            }
        } else if let Some(size) = padded_vocab(line) {
            padded = Some(size);
        } else if let Some(interval) = interval(line) {
            log.intervals.push(interval);
        } else if let Some(mib) = max_reserved(line) {
            log.max_reserved_mib = Some(log.max_reserved_mib.map_or(mib, |m: f64| m.max(mib)));
        }
    }
    // versions that pad the vocabulary after printing the arguments say so on a line of their own
    if let Some(size) = padded {
        log.args
            .entry("padded_vocab_size".into())
            .or_insert_with(|| size.to_string());
    }
    log
}

/// `> padded vocab (size: 50257) with 175 dummy tokens (new size: 50432)`, which the tokenizer
/// prints: the new size.
fn padded_vocab(line: &str) -> Option<u64> {
    let label = "(new size:";
    if !line.contains("padded vocab (size:") {
        return None;
    }
    let at = line.find(label)?;
    let rest = line[at + label.len()..].trim_start();
    rest[..rest.find(')')?].trim().parse().ok()
}

/// `  name ........ value` (the dots pad the name to one width).
fn argument(line: &str) -> Option<(String, String)> {
    let dots = line.find(" ..")?;
    let name = line[..dots].split_whitespace().last()?;
    let valid = name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    let value = line[dots + 1..].trim_start_matches('.').trim();
    valid.then(|| (name.to_string(), value.to_string()))
}

/// The number at the start of `s` (after blanks), up to the first character that is not part
/// of one.
pub(crate) fn leading_number(s: &str) -> Option<f64> {
    let s = s.trim_start();
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E')))
        .unwrap_or(s.len());
    s[..end].parse().ok().filter(|v: &f64| v.is_finite())
}

/// The count after `label` on an iteration line (0 where the line does not print it).
fn count_after(line: &str, label: &str) -> u64 {
    line.find(label)
        .and_then(|at| leading_number(&line[at + label.len()..]))
        .map_or(0, |v| v as u64)
}

/// An iteration line: (its iteration, mean ms per iteration over the interval), or none where
/// it is not one or the interval skipped an iteration or hit a NaN.
fn interval(line: &str) -> Option<(u64, f64)> {
    let at = line.find(ELAPSED)?;
    let ms = leading_number(&line[at + ELAPSED.len()..])?;
    // the first "iteration" followed by its number ("iteration      20/     100 |")
    let iteration = line[..at]
        .match_indices("iteration")
        .find_map(|(i, word)| {
            let rest = line[i + word.len()..].trim_start();
            let digits = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            rest[..digits].parse::<u64>().ok()
        })?;
    let troubled = count_after(line, "number of skipped iterations:") > 0
        || count_after(line, "number of nan iterations:") > 0;
    (!troubled && ms > 0.0).then_some((iteration, ms))
}

/// A memory report's peak reserved memory (MiB): Megatron-LM's `memory (MB) | … | max
/// reserved: 61440.0` in MiB, or Megatron-Bridge's `memory (GB) | … |
/// mem-max-reserved-gigabytes: 64.4` in 10⁹ bytes (its `report_memory` divides by 1e9).
fn max_reserved(line: &str) -> Option<f64> {
    let (label, mib_per_unit) = if line.contains("memory (MB)") {
        ("max reserved:", 1.0)
    } else if line.contains("memory (GB)") {
        ("mem-max-reserved-gigabytes:", 1e9 / 1_048_576.0)
    } else {
        return None;
    };
    let at = line.find(label)?;
    leading_number(&line[at + label.len()..])
        .filter(|v| *v > 0.0)
        .map(|v| v * mib_per_unit)
}

/// The sections of a Megatron-Bridge (NeMo 2) configuration read as Megatron-LM's arguments,
/// in increasing precedence: `mixed_precision` is applied onto the model at setup, so its
/// precision settings win over the model's copies.
const BRIDGE_SECTIONS: [&str; 6] = [
    "model",
    "dataset",
    "train",
    "ddp",
    "comm_overlap",
    "mixed_precision",
];

/// A Megatron-Bridge configuration (the `ConfigContainer` YAML its `--dryrun` prints or
/// `logger.save_config_filepath` saves) as the argument dump Megatron-LM would print for the
/// same run, so `import` reads both alike. Bridge names a few settings otherwise: experts are
/// `num_moe_experts`, tied embeddings `share_embeddings_and_output_weights`, gradients reduced
/// in fp32 `grad_reduce_in_fp32`, a gated MLP `gated_linear_unit` (costed as SwiGLU whatever its
/// activation: the same kernels and traffic), grouped queries a `num_query_groups` below the
/// heads. The world size is not in it (the launcher decides it): `world_size` is given.
pub fn args_of_bridge_config(
    yaml: &str,
    world_size: u64,
) -> Result<BTreeMap<String, String>, String> {
    let root: serde_norway::Value =
        serde_norway::from_str(yaml).map_err(|e| format!("not YAML: {e}"))?;
    if root.get("model").and_then(|m| m.as_mapping()).is_none() {
        return Err(
            "no `model:` section: give the ConfigContainer YAML Megatron-Bridge prints \
                    with --dryrun or saves at logger.save_config_filepath"
                .into(),
        );
    }
    let mut args = BTreeMap::from([("world_size".to_string(), world_size.to_string())]);
    for section in BRIDGE_SECTIONS {
        let Some(map) = root.get(section).and_then(|v| v.as_mapping()) else {
            continue;
        };
        for (key, value) in map {
            let (Some(key), Some(value)) = (key.as_str(), python_repr(value)) else {
                continue;
            };
            args.insert(key.to_string(), value);
        }
    }
    megatron_core_names(&mut args);
    Ok(args)
}

/// Megatron-LM's names beside the Megatron-Core config fields' in `args`, for settings the two
/// name otherwise (Megatron-Bridge's and NeMo 2's configurations hold the config fields).
pub(crate) fn megatron_core_names(args: &mut BTreeMap<String, String>) {
    if let Some(n) = args.get("num_moe_experts").cloned() {
        args.insert("num_experts".into(), n);
    }
    if let Some(shared) = args.get("share_embeddings_and_output_weights") {
        let untie = if shared == "True" { "False" } else { "True" };
        args.insert("untie_embeddings_and_output_weights".into(), untie.into());
    }
    for (bridge, megatron) in [
        (
            "num_layers_in_first_pipeline_stage",
            "decoder_first_pipeline_num_layers",
        ),
        (
            "num_layers_in_last_pipeline_stage",
            "decoder_last_pipeline_num_layers",
        ),
    ] {
        if let Some(n) = args.get(bridge).cloned() {
            args.insert(megatron.into(), n);
        }
    }
    if let Some(fp32) = args.get("grad_reduce_in_fp32").cloned() {
        args.insert("accumulate_allreduce_grads_in_fp32".into(), fp32);
    }
    if args.get("gated_linear_unit").map(String::as_str) == Some("True") {
        args.insert("swiglu".into(), "True".into());
    }
    if args.get("num_query_groups") != args.get("num_attention_heads")
        && args.get("num_query_groups").is_some_and(|g| g != "None")
    {
        args.insert("group_query_attention".into(), "True".into());
    }
    if args.get("should_pad_vocab").map(String::as_str) == Some("False") {
        if let Some(v) = args.get("vocab_size").cloned() {
            args.insert("padded_vocab_size".into(), v);
        }
    }
}

/// A YAML value as Python prints it in Megatron-LM's argument dump (`True`, `None`, `[127,
/// 0]`, `['core_attn', 'mlp']`); none for an object (`_target_`), which no argument is.
pub(crate) fn python_repr(v: &serde_norway::Value) -> Option<String> {
    use serde_norway::Value;
    Some(match v {
        Value::Null => "None".into(),
        Value::Bool(b) => if *b { "True" } else { "False" }.into(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        Value::Sequence(items) => {
            let items: Option<Vec<String>> = items
                .iter()
                .map(|i| match i {
                    Value::String(s) => Some(format!("'{s}'")),
                    other => python_repr(other),
                })
                .collect();
            format!("[{}]", items?.join(", "))
        }
        Value::Mapping(_) | Value::Tagged(_) => return None,
    })
}

/// How one log becomes a run: the user's choices besides what the log says.
#[derive(Debug, Clone)]
pub struct ImportOptions {
    /// The source set the row is reported under.
    pub set: String,
    /// The model family (the cross-validation group); none: the model's name.
    pub family: Option<String>,
    /// The cluster, as the runs CSV names it (a built-in name or a path).
    pub cluster: String,
    /// A preset or architecture file to use instead of the architecture the arguments describe.
    pub model: Option<String>,
    /// Intervals ending at or before this iteration are warm-up, left out.
    pub warmup_iterations: u64,
}

/// One log as a runs-CSV row.
#[derive(Debug, Clone)]
pub struct ImportedRun {
    /// The row's columns by name (`COLUMNS`; empty where the layout's default holds).
    pub columns: BTreeMap<&'static str, String>,
    /// The architecture the arguments describe, to be written where the row's `model` points;
    /// none where the user named a model.
    pub arch: Option<ArchSpec>,
    /// Median milliseconds per iteration over the intervals used.
    pub step_ms: f64,
    /// How many logged intervals the median is taken over.
    pub intervals_used: usize,
    /// The first and last iteration of the intervals used.
    pub iterations: (u64, u64),
}

/// The columns a row is written with, in this order in a new runs CSV.
pub const COLUMNS: [&str; 43] = [
    "set",
    "family",
    "label",
    "cluster",
    "model",
    "framework",
    "tp",
    "pp",
    "dp",
    "cp",
    "ep",
    "etp",
    "moe_dispatcher",
    "moe_a2a_overlap",
    "pipeline_split",
    "pipeline_layout",
    "micro_batch",
    "global_batch",
    "seq_len",
    "dtype",
    "recompute",
    "recompute_modules",
    "zero",
    "schedule",
    "vpp",
    "sequence_parallel",
    "tp_comm_overlap",
    "overlap_grad_reduce",
    "overlap_param_gather",
    "grad_reduce_dtype",
    "fp8_param_gather",
    "cross_entropy",
    "cuda_graphs",
    "cp_comm",
    "attention_kernel",
    "elementwise",
    "fp8_library",
    "measured_step_s",
    "measured_memory_gib",
    "memory_scope",
    "expressible",
    "reason",
    "source",
];

/// The arguments, read as Megatron-LM printed them.
struct Args<'a>(&'a BTreeMap<String, String>);

impl Args<'_> {
    /// An argument's text; none where it is absent or Python's `None`.
    fn text(&self, name: &str) -> Option<&str> {
        self.0
            .get(name)
            .map(|v| v.trim())
            .filter(|v| !v.is_empty() && *v != "None")
    }

    fn flag(&self, name: &str) -> bool {
        self.text(name) == Some("True")
    }

    /// One `key=value` of a setting DeepSpeed prints as such (`zero_config .... stage=1
    /// overlap_comm=False offload_param=None …`).
    fn setting(&self, name: &str, key: &str) -> Option<&str> {
        self.text(name)?
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
    }

    /// A DeepSpeed precision switched on: `fp16_enabled ... True`, or the newer
    /// `bfloat16_config ... enabled=True …`.
    fn enabled(&self, precision: &str) -> bool {
        self.flag(&format!("{precision}_enabled"))
            || self.setting(&format!("{precision}_config"), "enabled") == Some("True")
    }

    /// A whole-number argument; an error names it where its text is not one.
    fn count(&self, name: &str) -> Result<Option<u64>, String> {
        self.text(name)
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|_| format!("argument {name} = {v:?} is not a whole number"))
            })
            .transpose()
    }

    fn required(&self, name: &str) -> Result<u64, String> {
        self.count(name)?.ok_or_else(|| {
            format!(
                "argument {name} is not in the log's argument dump (rank 0 prints every \
                 argument between `---- arguments ----` and `---- end of arguments ----` at \
                 start): give the job's whole output, or rank 0's with the last rank's"
            )
        })
    }

    fn float(&self, name: &str) -> Option<f64> {
        self.text(name).and_then(|v| v.parse().ok())
    }

    /// A Python list as printed (`['core_attn', 'mlp']`), its items unquoted.
    fn list(&self, name: &str) -> Vec<String> {
        self.text(name)
            .map(|v| {
                v.trim_matches(|c| c == '[' || c == ']')
                    .split(',')
                    .map(|s| s.trim().trim_matches('\'').trim_matches('"').to_string())
                    .filter(|s| !s.is_empty())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// The experts of a mixture, none for a dense model: Megatron-LM prints a number,
/// Megatron-DeepSpeed a list (`[1]` dense, `[64]` one count for every expert layer).
fn experts(a: &Args) -> Result<Option<u64>, String> {
    let Some(text) = a.text("num_experts") else {
        return Ok(None);
    };
    if !text.starts_with('[') {
        return a.count("num_experts");
    }
    let mut most = None;
    for item in a.list("num_experts") {
        let n = item
            .parse::<u64>()
            .map_err(|_| format!("argument num_experts = {text:?} is not a list of counts"))?;
        most = most.max(Some(n));
    }
    Ok(most.filter(|&n| n > 1))
}

/// The ZeRO stage a Megatron-DeepSpeed run ran: DeepSpeed's printed
/// `zero_optimization_stage`, else the `zero_stage` argument (`1.0` by default: it is declared
/// an int with a float default).
fn deepspeed_zero_stage(a: &Args, ds: &Args) -> Result<u64, String> {
    let (name, text) = match (ds.text("zero_optimization_stage"), a.text("zero_stage")) {
        (Some(t), _) => ("DeepSpeed's zero_optimization_stage", t),
        (None, Some(t)) => ("argument zero_stage", t),
        (None, None) => return Ok(0),
    };
    text.parse::<f64>()
        .ok()
        .filter(|z| z.fract() == 0.0 && (0.0..=3.0).contains(z))
        .map(|z| z as u64)
        .ok_or_else(|| format!("{name} = {text:?} is not a ZeRO stage (0, 1, 2 or 3)"))
}

fn yes(b: bool) -> String {
    if b { "true" } else { "false" }.into()
}

/// The run a parsed log describes. Errors name the argument and say what to do.
pub fn import(log: &MegatronLog, options: &ImportOptions) -> Result<ImportedRun, String> {
    import_noting(log, options, &[])
}

/// The run a parsed log describes, with `noted`, what its launcher's configuration says is not
/// costed, among the reasons the row is not expressible (after the arguments' own).
pub(crate) fn import_noting(
    log: &MegatronLog,
    options: &ImportOptions,
    noted: &[String],
) -> Result<ImportedRun, String> {
    let a = Args(&log.args);
    if log.args.is_empty() {
        return Err(
            "no argument dump found (the lines between `---- arguments ----` and \
                    `---- end of arguments ----` Megatron-LM's rank 0 prints at start): give \
                    the job's whole output, or rank 0's log with the last rank's"
                .into(),
        );
    }
    let tp = a.count("tensor_model_parallel_size")?.unwrap_or(1);
    let pp = a.count("pipeline_model_parallel_size")?.unwrap_or(1);
    let cp = a.count("context_parallel_size")?.unwrap_or(1);
    let world = a.required("world_size")?;
    // products of the user's numbers are checked: a log may say anything
    let model_parallel = tp
        .checked_mul(pp)
        .and_then(|x| x.checked_mul(cp))
        .unwrap_or(0);
    if world == 0 || model_parallel == 0 || world % model_parallel != 0 {
        return Err(format!(
            "world_size {world} is not a multiple of tensor × pipeline × context parallelism \
             ({tp} × {pp} × {cp}): is this one run's log?"
        ));
    }
    let dp = world / model_parallel;
    let micro_batch = a.required("micro_batch_size")?;
    let global_batch = a
        .count("global_batch_size")?
        .unwrap_or(micro_batch.saturating_mul(dp));
    let seq_len = a.required("seq_length")?;
    let layers = a.required("num_layers")?;

    let per_step = micro_batch.checked_mul(dp).unwrap_or(0);
    if per_step == 0 || global_batch % per_step != 0 {
        return Err(format!(
            "global_batch_size {global_batch} is not a multiple of micro_batch_size \
             {micro_batch} × data parallelism {dp}: is this one run's log?"
        ));
    }
    let (step_ms, intervals_used, iterations) = step_time(log, options.warmup_iterations)?;
    // a step from a microsecond to a day: anything else is not a training step's time
    crate::limits::check_range(
        "the logged iterations",
        "elapsed time per iteration",
        step_ms,
        1e-3..=8.64e7,
        "ms",
    )?;

    // Megatron-DeepSpeed: the DeepSpeed engine's own settings (ZeRO, precision) are what ran
    let ds = Args(&log.deepspeed);
    let deepspeed = a.flag("deepspeed") || !log.deepspeed.is_empty();
    let dtype = if a.text("fp8").is_some() {
        "fp8"
    } else if deepspeed && ds.enabled("bfloat16") {
        "bf16"
    } else if deepspeed && ds.enabled("fp16") {
        "fp16"
    } else if a.flag("bf16") {
        "bf16"
    } else if a.flag("fp16") {
        "fp16"
    } else {
        "fp32"
    };
    let vpp = match (
        a.count("virtual_pipeline_model_parallel_size")?,
        a.count("num_layers_per_virtual_pipeline_stage")?,
    ) {
        (Some(v), _) => v,
        // pp is at least 1: a zero world or model-parallel size is refused above
        (None, Some(per_chunk)) if per_chunk > 0 => layers / pp / per_chunk,
        _ => 1,
    };
    if vpp == 0 || pp.saturating_mul(vpp) > layers {
        return Err(format!(
            "{pp} pipeline stages of {vpp} virtual chunks each are more chunks than the \
             {layers} layers (arguments pipeline_model_parallel_size, \
             virtual_pipeline_model_parallel_size, num_layers): is this one run's log?"
        ));
    }
    let recompute = match a.text("recompute_granularity") {
        // Megatron-LM before 2022: --checkpoint-activations recomputed whole layers
        None if a.flag("checkpoint_activations") => "full",
        None => "none",
        Some("full") => "full",
        Some("selective") => "selective",
        Some(other) => {
            return Err(format!(
                "argument recompute_granularity = {other:?} is not full, selective or None"
            ))
        }
    };
    let modules = a.list("recompute_modules");
    // Megatron's selective default is the attention core, which `selective` alone means
    let recompute_modules = if recompute == "selective" && modules != ["core_attn"] {
        modules.join("+")
    } else {
        String::new()
    };
    let mut reason = Vec::new();
    if recompute == "full" {
        let per_chunk = layers / pp.saturating_mul(vpp).max(1);
        if let Some(n) = a.count("recompute_num_layers")?.filter(|&n| n < per_chunk) {
            if a.text("recompute_method") == Some("block") {
                reason.push(format!(
                    "full recompute of {n} of the {per_chunk} layers a chunk holds (block \
                     method) is not costed"
                ));
            }
        }
    }
    let experts = experts(&a)?;
    if deepspeed && experts.is_some() {
        return Err(
            "Megatron-DeepSpeed's mixtures of experts (an expert layer every expert_interval \
             layers, DeepSpeed-MoE's gating) are not costed: import Megatron-LM's or \
             Megatron-Bridge's"
                .into(),
        );
    }
    let zero = if deepspeed {
        deepspeed_zero_stage(&a, &ds)?
    } else {
        u64::from(a.flag("use_distributed_optimizer"))
    };
    if deepspeed {
        let offloaded = |what| ds.setting("zero_config", what).is_some_and(|v| v != "None");
        if offloaded("offload_optimizer") || offloaded("offload_param") || a.flag("cpu_optimizer") {
            reason.push("ZeRO offload to the host (CPU or NVMe) is not costed".to_string());
        }
        if let Some(n) = a.count("ds_sequence_parallel_size")?.filter(|&n| n > 1) {
            reason.push(format!(
                "DeepSpeed-Ulysses sequence parallelism (ds_sequence_parallel_size {n}) is not \
                 costed"
            ));
        }
    }
    let ep = a.count("expert_model_parallel_size")?.unwrap_or(1);
    let moe_dispatcher = match (experts, a.text("moe_token_dispatcher_type")) {
        (None, _) => "",
        (Some(_), Some("flex")) => match a.text("moe_flex_dispatcher_backend") {
            Some("hybridep") => "hybridep",
            _ => "deepep",
        },
        (Some(_), _) if a.flag("moe_enable_deepep") => "deepep",
        (Some(_), Some("allgather")) => "allgather",
        (Some(_), _) => "alltoall",
    };
    let grad_reduce_dtype = if let Some(t) = ds.text("communication_data_type") {
        match t.trim_start_matches("torch.") {
            "float32" | "fp32" => "fp32",
            "float16" | "fp16" => "fp16",
            "bfloat16" | "bf16" => "bf16",
            other => {
                return Err(format!(
                    "DeepSpeed's communication_data_type = {other:?} is not fp32, fp16 or bf16"
                ))
            }
        }
    } else if a.flag("grad_reduce_in_bf16") {
        "bf16"
    } else if a.flag("accumulate_allreduce_grads_in_fp32") {
        "fp32"
    } else if dtype == "fp16" {
        "fp16"
    } else if dtype == "fp32" {
        "fp32"
    } else {
        "bf16"
    };
    let cross_entropy = if a.flag("cross_entropy_loss_fusion")
        && a.text("cross_entropy_fusion_impl") == Some("te")
    {
        "fused"
    } else {
        ""
    };
    let pipeline_split = pipeline_split_column(
        a.flag("account_for_embedding_in_pipeline_split"),
        a.flag("account_for_loss_in_pipeline_split"),
    );
    // Megatron-Core takes one way to place the layers: uneven ends beside another is no run
    let beside = |other: &str| {
        format!(
            "arguments {other} and decoder_first|last_pipeline_num_layers together, which \
             Megatron-Core refuses: is this one run's log?"
        )
    };
    let pipeline_layout = match (
        a.text("pipeline_model_parallel_layout"),
        uneven_ends_layout(&a, layers, pp, vpp)?,
    ) {
        (Some(_), Some(_)) => return Err(beside("pipeline_model_parallel_layout")),
        (_, Some(_)) if !pipeline_split.is_empty() => {
            return Err(beside("account_for_…_in_pipeline_split"))
        }
        (layout, ends) => layout.map(str::to_string).or(ends),
    };
    let cp_comm = if cp > 1 {
        cp_comm_column(&a, &mut reason)
    } else {
        ""
    };
    for (flag, what) in [
        (
            "cpu_offloading",
            "activations and weights offloaded to the host",
        ),
        (
            "optimizer_cpu_offload",
            "the optimizer offloaded to the host",
        ),
        ("use_torch_fsdp2", "PyTorch FSDP2 under Megatron"),
        ("use_custom_fsdp", "Megatron-FSDP"),
        ("use_megatron_fsdp", "Megatron-FSDP"),
    ] {
        if a.flag(flag) {
            reason.push(format!("{what} ({flag}) is not costed"));
        }
    }
    if let Some(n) = a
        .count("num_distributed_optimizer_instances")?
        .filter(|&n| n > 1)
    {
        reason.push(format!(
            "{n} distributed-optimizer instances (num_distributed_optimizer_instances: the \
             optimizer sharded within each, the gradients all-reduced across them) are not \
             costed"
        ));
    }
    let graphed =
        a.flag("enable_cuda_graph") || a.text("cuda_graph_impl").is_some_and(|i| i != "none");
    let cuda_graphs = if graphed {
        let scope: Vec<String> = a
            .list("cuda_graph_scope")
            .into_iter()
            .filter(|s| s != "full")
            .collect();
        if scope.is_empty() {
            "layer".to_string()
        } else {
            scope.join("+")
        }
    } else {
        String::new()
    };

    // the model the user named, or the architecture the arguments describe, written beside
    // the CSV under its own name
    let (arch, model_name, model_column) = match &options.model {
        Some(m) => (None, m.clone(), m.clone()),
        None => {
            let arch = architecture(&a, layers, seq_len, deepspeed)?;
            // checked as predict will check it, so a row is never written for a model no
            // prediction can make
            arch.clone()
                .validate("the architecture the arguments describe")
                .map_err(|e| e.to_string())?;
            let (name, file) = (arch.name.clone(), format!("archs/{}.yaml", arch.name));
            (Some(arch), name, file)
        }
    };
    let family = options
        .family
        .clone()
        .unwrap_or_else(|| family_of(&model_name));

    reason.extend(noted.iter().cloned());
    let mut c: BTreeMap<&'static str, String> = BTreeMap::new();
    let mut put = |k: &'static str, v: String| {
        c.insert(k, v);
    };
    put("set", options.set.clone());
    put("family", family);
    put(
        "label",
        format!(
            "{model_name} {world} GPUs tp{tp} pp{pp} cp{cp} dp{dp}{} mbs{micro_batch} \
             gbs{global_batch} {}{}",
            experts.map(|_| format!(" ep{ep}")).unwrap_or_default(),
            dtype.to_uppercase(),
            if deepspeed {
                format!(" DeepSpeed ZeRO {zero}")
            } else {
                String::new()
            }
        ),
    );
    put("cluster", options.cluster.clone());
    put("model", model_column);
    put(
        "framework",
        if deepspeed { "deepspeed" } else { "megatron" }.into(),
    );
    put("tp", tp.to_string());
    put("pp", pp.to_string());
    put("dp", dp.to_string());
    put("cp", cp.to_string());
    if experts.is_some() {
        put("ep", ep.to_string());
        if let Some(etp) = a.count("expert_tensor_parallel_size")? {
            put("etp", etp.to_string());
        }
        put("moe_dispatcher", moe_dispatcher.into());
        put(
            "moe_a2a_overlap",
            yes(a.flag("overlap_moe_expert_parallel_comm")),
        );
    }
    put("pipeline_split", pipeline_split.into());
    if let Some(layout) = pipeline_layout {
        put("pipeline_layout", layout);
    }
    if !cp_comm.is_empty() {
        put("cp_comm", cp_comm.into());
    }
    put("micro_batch", micro_batch.to_string());
    put("global_batch", global_batch.to_string());
    put("seq_len", seq_len.to_string());
    put("dtype", dtype.into());
    put("recompute", recompute.into());
    put("recompute_modules", recompute_modules);
    put("zero", zero.to_string());
    put(
        "schedule",
        if vpp > 1 { "interleaved" } else { "1f1b" }.into(),
    );
    put("vpp", vpp.to_string());
    put("sequence_parallel", yes(a.flag("sequence_parallel")));
    put(
        "tp_comm_overlap",
        if a.flag("tp_comm_overlap") { "1" } else { "0" }.into(),
    );
    // DeepSpeed's ZeRO reduces gradients during the backward where `overlap_comm` says so;
    // its pipeline engine reduces them after the last micro-batch
    let overlap_grad_reduce = if deepspeed {
        pp == 1 && ds.setting("zero_config", "overlap_comm") == Some("True")
    } else {
        a.flag("overlap_grad_reduce")
    };
    put("overlap_grad_reduce", yes(overlap_grad_reduce));
    put("overlap_param_gather", yes(a.flag("overlap_param_gather")));
    put("grad_reduce_dtype", grad_reduce_dtype.into());
    put("fp8_param_gather", yes(a.flag("fp8_param_gather")));
    put("cross_entropy", cross_entropy.into());
    put("cuda_graphs", cuda_graphs);
    put("measured_step_s", format!("{}", step_ms / 1e3));
    if let Some(mib) = log.max_reserved_mib {
        put("measured_memory_gib", format!("{:.3}", mib / 1024.0));
        put("memory_scope", "allocator".into());
    }
    put("expressible", yes(reason.is_empty()));
    if !reason.is_empty() {
        put("reason", reason.join("; "));
    }
    put(
        "source",
        format!(
            "{}, iterations {}–{}{}",
            intervals_phrase(intervals_used),
            iterations.0,
            iterations.1,
            if reason.is_empty() {
                String::new()
            } else {
                format!(" (not expressible: {})", reason.join("; "))
            }
        ),
    );
    Ok(ImportedRun {
        columns: c,
        arch,
        step_ms,
        intervals_used,
        iterations,
    })
}

/// The runs CSV's `pipeline_split`: which of the embedding and the loss took a layer's place.
pub(crate) fn pipeline_split_column(embedding: bool, loss: bool) -> &'static str {
    match (embedding, loss) {
        (true, true) => "embedding+loss",
        (true, false) => "embedding",
        (false, true) => "loss",
        (false, false) => "",
    }
}

/// Megatron-Core's uneven ends (`decoder_first|last_pipeline_num_layers`, Megatron-Bridge's
/// `num_layers_in_first|last_pipeline_stage`) as the pipeline layout string that places the
/// same layers: the ends' layers on the first and last rank, the rest evenly over the ranks
/// between, each rank's layers evenly over its `vpp` chunks, chunk `v·pp + r` on rank r
/// (Megatron-Core's `get_transformer_layer_offset`). None where neither is set.
fn uneven_ends_layout(a: &Args, layers: u64, pp: u64, vpp: u64) -> Result<Option<String>, String> {
    let first = a.count("decoder_first_pipeline_num_layers")?;
    let last = a.count("decoder_last_pipeline_num_layers")?;
    if (first.is_none() && last.is_none()) || pp < 2 {
        return Ok(None);
    }
    let not_one_run = |why: String| {
        format!(
            "arguments decoder_first|last_pipeline_num_layers ({}, {}) over {pp} pipeline \
             ranks of {vpp} chunks and {layers} layers: {why}, which Megatron-Core refuses: is \
             this one run's log?",
            first.map_or("None".into(), |n| n.to_string()),
            last.map_or("None".into(), |n| n.to_string()),
        )
    };
    if first == Some(0) || last == Some(0) {
        return Err(not_one_run("an end of no layers".into()));
    }
    // the string spells pp · vpp ≤ layers chunks: bounded, as a log may say anything
    if layers > crate::limits::MAX_LAYERS {
        return Err(not_one_run(format!(
            "more than the {} layers a model may have",
            crate::limits::MAX_LAYERS
        )));
    }
    let ends = first.unwrap_or(0).checked_add(last.unwrap_or(0));
    let rest = ends
        .and_then(|ends| layers.checked_sub(ends))
        .ok_or_else(|| not_one_run("more layers at the ends than in the model".into()))?;
    let between = pp - u64::from(first.is_some()) - u64::from(last.is_some());
    let per_rank_between = match between {
        0 if rest == 0 => 0,
        0 => return Err(not_one_run(format!("{rest} layers on no rank"))),
        n if rest % n == 0 => rest / n,
        n => {
            return Err(not_one_run(format!(
                "{rest} layers do not split over {n} ranks"
            )))
        }
    };
    let on_rank = |r: u64| match (r, first, last) {
        (0, Some(f), _) => f,
        (r, _, Some(l)) if r == pp - 1 => l,
        _ => per_rank_between,
    };
    if let Some(r) = (0..pp).find(|&r| on_rank(r) % vpp != 0) {
        return Err(not_one_run(format!(
            "rank {r}'s {} layers do not split over its {vpp} chunks",
            on_rank(r)
        )));
    }
    let chunks = pp.saturating_mul(vpp);
    let layout: Vec<String> = (0..chunks)
        .map(|c| {
            let n = on_rank(c % pp) / vpp;
            format!(
                "{}{}{}",
                if c == 0 { "E" } else { "" },
                if n > 0 {
                    format!("t*{n}")
                } else {
                    String::new()
                },
                if c == chunks - 1 { "L" } else { "" }
            )
        })
        .collect();
    Ok(Some(layout.join("|")))
}

/// The runs CSV's `cp_comm` of Megatron-Core's `cp_comm_type` (one for all layers, or one per
/// layer): `p2p` (its default) or `all-gather`; an all-to-all exchange, or layers exchanging
/// differently, is not costed and says so in `reason`.
fn cp_comm_column(a: &Args, reason: &mut Vec<String>) -> &'static str {
    let mut kinds = a.list("cp_comm_type");
    kinds.sort();
    kinds.dedup();
    match kinds.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        [] | ["p2p"] => "p2p",
        ["all_gather"] => "all-gather",
        _ => {
            reason.push(format!(
                "the context-parallel exchange {} (cp_comm_type) is not costed: p2p or \
                 all_gather for every layer is",
                kinds.join(" and ")
            ));
            "p2p"
        }
    }
}

/// "median of 3 logged intervals", or "1 logged interval" where there is one.
pub fn intervals_phrase(n: usize) -> String {
    if n == 1 {
        "1 logged interval".into()
    } else {
        format!("median of {n} logged intervals")
    }
}

/// The median interval past the warm-up: (ms per iteration, intervals, first and last
/// iteration).
fn step_time(log: &MegatronLog, warmup: u64) -> Result<(f64, usize, (u64, u64)), String> {
    median_past_warmup(&log.intervals, warmup).ok_or_else(|| {
        format!(
            "no iteration line past iteration {warmup} ({} logged in all, `{ELAPSED} …`, \
             which Megatron-LM's last rank prints): give its log too, train longer, or give a \
             smaller --warmup-iterations",
            log.intervals.len()
        )
    })
}

/// The median of the logged intervals (last iteration, mean ms per iteration) that end past
/// the warm-up, how many there are, and the first and last iteration they end at; none where
/// no interval ends past it.
pub(crate) fn median_past_warmup(
    intervals: &[(u64, f64)],
    warmup: u64,
) -> Option<(f64, usize, (u64, u64))> {
    let mut kept: Vec<(u64, f64)> = intervals
        .iter()
        .copied()
        .filter(|&(iteration, _)| iteration > warmup)
        .collect();
    let first = kept.iter().map(|k| k.0).min()?;
    let last = kept.iter().map(|k| k.0).max()?;
    kept.sort_by(|x, y| x.1.total_cmp(&y.1));
    let n = kept.len();
    let median = if n % 2 == 1 {
        kept[n / 2].1
    } else {
        (kept[n / 2 - 1].1 + kept[n / 2].1) / 2.0
    };
    Some((median, n, (first, last)))
}

/// How often a layer attends to the whole sequence among sliding-window ones, as Megatron's
/// `window_attn_skip_freq` says: a number N, every N-th layer (1: every layer, no window at
/// all); a per-layer list (1 a window, 0 the whole sequence) that repeats N − 1 windows and
/// one whole layer, the same; a list of windows only, none (every layer slides). Another
/// pattern is not costed.
fn global_attention_every(a: &Args) -> Result<Option<u64>, String> {
    let Some(text) = a.text("window_attn_skip_freq") else {
        return Ok(None);
    };
    let refused = || {
        format!(
            "argument window_attn_skip_freq = {text:?} is not every N-th layer attending to \
             the whole sequence, which is what is costed: give the model with --model"
        )
    };
    if !text.starts_with('[') {
        return match a.count("window_attn_skip_freq")? {
            Some(0) => Err(refused()),
            every => Ok(every),
        };
    }
    let pattern = a.list("window_attn_skip_freq");
    let Some(period) = pattern.iter().position(|p| p == "0") else {
        return if pattern.iter().all(|p| p == "1") {
            Ok(None)
        } else {
            Err(refused())
        };
    };
    let n = period + 1;
    let repeats = pattern
        .iter()
        .enumerate()
        .all(|(i, p)| p == if (i + 1).is_multiple_of(n) { "0" } else { "1" });
    if repeats && pattern.len().is_multiple_of(n) {
        Ok(Some(n as u64))
    } else {
        Err(refused())
    }
}

/// A family name from a model name: what grouped cross-validation leaves out together.
pub(crate) fn family_of(model: &str) -> String {
    let file = model.rsplit('/').next().unwrap_or(model);
    file.trim_end_matches(".yaml")
        .trim_end_matches(".json")
        .to_string()
}

/// The architecture Megatron-LM's arguments describe, named by its dimensions (runs of one
/// model share the file and the family). Megatron-DeepSpeed names a few otherwise (grouped
/// queries as `num_key_value_heads`, rotary positions as `use_rotary_position_embeddings`,
/// FlashAttention as one of several `use_flash_attn_*` switches).
fn architecture(a: &Args, layers: u64, seq_len: u64, deepspeed: bool) -> Result<ArchSpec, String> {
    let hidden = a.required("hidden_size")?;
    let heads = a.required("num_attention_heads")?;
    let ffn = a.count("ffn_hidden_size")?;
    let (vocab, divisible) = match (a.count("padded_vocab_size")?, a.count("vocab_size")?) {
        (Some(v), _) => (v, Some(1)),
        (None, Some(v)) => (v, a.count("make_vocab_size_divisible_by")?),
        (None, None) => {
            return Err(
                "neither padded_vocab_size nor vocab_size is in the argument dump: \
                        give the model with --model"
                    .into(),
            )
        }
    };
    let kv_heads = if a.flag("group_query_attention") {
        a.count("num_query_groups")?
    } else {
        a.count("num_key_value_heads")?.filter(|&k| k < heads)
    };
    let head_dim = a
        .count("kv_channels")?
        .filter(|&d| d.checked_mul(heads) != Some(hidden));
    let activation = if a.flag("swiglu") {
        Activation::Swiglu
    } else if a.flag("squared_relu") {
        Activation::SquaredRelu
    } else {
        Activation::Gelu
    };
    // `RMSNorm` in Megatron-LM, `rmsnorm` in Megatron-DeepSpeed
    let norm = match a.text("normalization") {
        Some(n) if n.eq_ignore_ascii_case("rmsnorm") => NormKind::Rmsnorm,
        _ => NormKind::Layernorm,
    };
    let position = match a.text("position_embedding_type") {
        // versions without the argument: learned positions unless rotary ones were asked for
        None if a.flag("use_rotary_position_embeddings") => Position::Rope,
        None => Position::Learned,
        Some("learned_absolute") => Position::Learned,
        Some("rope") | Some("yarn") => Position::Rope,
        Some(other) => {
            return Err(format!(
                "argument position_embedding_type = {other:?} is not costed (rope, yarn or \
                 learned_absolute): give the model with --model"
            ))
        }
    };
    // Megatron-LM's local implementation runs the unfused softmax unless FlashAttention is
    // asked for; so does Megatron-DeepSpeed, which names no implementation before 2023
    let flash = [
        "use_flash_attn",
        "use_flash_attn_v1",
        "use_flash_attn_v2",
        "use_flash_attn_triton",
        "use_flash_attn_builder",
    ]
    .iter()
    .any(|f| a.flag(f));
    let local = match a.text("transformer_impl") {
        Some(i) => i == "local",
        None => deepspeed,
    };
    // Megatron-Core's `--attention-backend` (printed `AttnBackend.auto`) names the unfused
    // softmax outright: Transformer Engine's unfused attention, or Megatron's local one
    let backend = a
        .text("attention_backend")
        .map(|b| b.trim_start_matches("AttnBackend."));
    let unfused = matches!(backend, Some("unfused" | "local")) || (local && !flash);
    let dropout = a.float("hidden_dropout").unwrap_or(0.1) > 0.0
        || a.float("attention_dropout").unwrap_or(0.1) > 0.0;
    let moe = match experts(a)? {
        None => None,
        Some(experts) => {
            // a number N puts experts in every N-th layer (Megatron's `i % N == 0`), a list in
            // the layers it marks 1
            let freq = a.text("moe_layer_freq");
            let (dense_layers, every, offset) = match freq.filter(|t| !t.starts_with('[')) {
                Some(n) => match n.parse::<u64>() {
                    Ok(n) if n >= 1 => (0, n, 0),
                    _ => {
                        return Err(format!(
                            "argument moe_layer_freq = {n}: give a whole number of layers from \
                             1, or a list of 0 and 1 per layer"
                        ))
                    }
                },
                None if freq.is_none() => (0, 1, 0),
                None => {
                    let marks = a.list("moe_layer_freq");
                    if marks.len() as u64 != layers {
                        return Err(format!(
                            "argument moe_layer_freq marks {} layers, num_layers is {layers}: \
                             is this one run's log?",
                            marks.len()
                        ));
                    }
                    let pattern: Option<Vec<bool>> = marks
                        .iter()
                        .map(|f| match f.as_str() {
                            "0" => Some(false),
                            "1" => Some(true),
                            _ => None,
                        })
                        .collect();
                    pattern
                        .as_deref()
                        .and_then(MoeSpec::layers_from_pattern)
                        .ok_or_else(|| {
                            format!(
                                "argument moe_layer_freq = {:?} puts experts in layers no \
                                 pattern of dense first layers and then one layer of every N \
                                 gives, which is not costed: give the model with --model",
                                freq.unwrap_or_default()
                            )
                        })?
                }
            };
            let shared_ffn = a.count("moe_shared_expert_intermediate_size")?;
            Some(MoeSpec {
                experts,
                top_k: a.count("moe_router_topk")?.unwrap_or(2),
                expert_ffn: a
                    .count("moe_ffn_hidden_size")?
                    .or(ffn)
                    .unwrap_or(hidden.saturating_mul(4)),
                shared_experts: u64::from(shared_ffn.is_some()),
                shared_ffn,
                dense_layers,
                every,
                offset,
                groups: a.count("moe_router_num_groups")?.unwrap_or(0),
                topk_groups: a.count("moe_router_group_topk")?.unwrap_or(0),
            })
        }
    };
    let mla = if a.flag("multi_latent_attention") {
        Some(MlaSpec {
            q_lora_rank: a.count("q_lora_rank")?,
            kv_lora_rank: a.required("kv_lora_rank")?,
            qk_nope_head_dim: a.required("qk_head_dim")?,
            qk_rope_head_dim: a.required("qk_pos_emb_head_dim")?,
            v_head_dim: a.required("v_head_dim")?,
        })
    } else {
        None
    };
    // Megatron's window_size is (left, right) keys beside the query: left + 1 keys in all; a
    // left of -1 is no window
    let sliding_window = match a.text("window_size") {
        None => None,
        Some(w) => {
            let left = w
                .trim_start_matches(['(', '['])
                .split(',')
                .next()
                .and_then(|s| s.trim().parse::<i64>().ok())
                .filter(|&left| left >= -1)
                .ok_or_else(|| format!("argument window_size = {w:?} is not (left, right)"))?;
            u64::try_from(left).ok().map(|left| left + 1)
        }
    };
    let global_attention_every = match sliding_window {
        Some(_) => global_attention_every(a)?,
        None => None,
    };
    let mut name = format!(
        "megatron-l{layers}-h{hidden}-a{heads}{}-f{}-v{vocab}",
        kv_heads.map(|k| format!("g{k}")).unwrap_or_default(),
        ffn.unwrap_or(hidden.saturating_mul(4))
    );
    if let Some(m) = &moe {
        name += &format!("-e{}k{}x{}", m.experts, m.top_k, m.expert_ffn);
        // interleaved: experts in one layer of `every`, the `offset`-th
        if m.every > 1 {
            name += &format!("-i{}o{}", m.every, m.offset);
        }
    }
    if mla.is_some() {
        name += "-mla";
    }
    Ok(ArchSpec {
        name,
        layers,
        hidden,
        heads,
        kv_heads,
        head_dim,
        ffn_hidden: ffn,
        vocab,
        vocab_divisible_by: divisible,
        norm,
        activation,
        tied_embeddings: !a.flag("untie_embeddings_and_output_weights"),
        attention: if unfused {
            AttentionImpl::Unfused
        } else {
            AttentionImpl::Flash
        },
        causal_blocks: CausalBlocks::default(),
        position,
        // Megatron's linear layers carry biases unless --disable-bias-linear
        linear_bias: a.text("add_bias_linear").is_none_or(|v| v == "True"),
        qkv_bias: a.flag("add_qkv_bias"),
        qk_norm: a.flag("qk_layernorm"),
        qk_norm_span: QkNormSpan::Head,
        pre_norms: true,
        post_norms: false,
        scaled_embeddings: false,
        attention_softcap: false,
        final_softcap: false,
        norm_bias: None,
        seq_len: Some(seq_len),
        sliding_window,
        global_attention_every,
        chunked_attention: false,
        dropout,
        moe,
        mla,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A log as Megatron-LM writes it (Llama 3 8B, tp 2 · pp 2 · dp 4): a launcher's lines,
    /// the argument dump, iteration lines (the first with the warm-up's slow start, one that
    /// skipped an iteration) and two ranks' memory reports; `changed` arguments replace or join
    /// those printed.
    fn log(changed: &[(&str, &str)]) -> String {
        with_args(
            include_str!("../../tests/data/megatron/llama3-8b-tp2-pp2.log"),
            changed,
        )
    }

    /// A Megatron-DeepSpeed log (a GPT-2-style 1.3 B model, tp 2 · pp 2 · dp 2, fp16, full
    /// recompute, the argument `zero_stage` at its 1.0 default and DeepSpeed's configuration
    /// printing stage 1), `changed` arguments replaced or added.
    fn deepspeed_log(changed: &[(&str, &str)]) -> String {
        with_args(
            include_str!("../../tests/data/megatron/gpt-1.3b-deepspeed.log"),
            changed,
        )
    }

    /// `text` with `changed` arguments replacing those of the dump or joining it.
    fn with_args(text: &str, changed: &[(&str, &str)]) -> String {
        let mut text = text.to_string();
        for (name, value) in changed {
            let line = format!("  {name} {} {value}\n", ".".repeat(48 - name.len()));
            let start = format!("  {name} .");
            text = match text.find(&start) {
                Some(at) => {
                    let end = at + text[at..].find('\n').unwrap() + 1;
                    format!("{}{line}{}", &text[..at], &text[end..])
                }
                None => text.replacen(
                    "-------------------- end of arguments",
                    &format!("{line}-------------------- end of arguments"),
                    1,
                ),
            };
        }
        text
    }

    /// The options of an import into set `mine` on the DGX H100, 10 warm-up iterations.
    pub(crate) fn options() -> ImportOptions {
        ImportOptions {
            set: "mine".into(),
            family: None,
            cluster: "dgx-h100".into(),
            model: None,
            warmup_iterations: 10,
        }
    }

    #[test]
    fn the_dump_the_intervals_and_the_memory_are_read() {
        let l = parse(&log(&[]));
        assert_eq!(l.args["tensor_model_parallel_size"], "2");
        assert_eq!(l.args["fp8"], "None");
        // the interval with a skipped iteration is left out
        assert_eq!(
            l.intervals,
            vec![(10, 9000.0), (20, 2010.0), (30, 2000.0), (50, 1990.0)]
        );
        assert_eq!(l.max_reserved_mib, Some(65536.0));
    }

    #[test]
    fn a_run_is_its_layout_its_median_step_past_the_warmup_and_its_peak() {
        let run = import(&parse(&log(&[])), &options()).unwrap();
        let c = &run.columns;
        assert_eq!(
            (c["tp"].as_str(), c["pp"].as_str(), c["dp"].as_str()),
            ("2", "2", "4")
        );
        assert_eq!(c["dtype"], "bf16");
        assert_eq!(c["recompute"], "none");
        assert_eq!(c["zero"], "1");
        assert_eq!(c["schedule"], "1f1b");
        assert_eq!(c["sequence_parallel"], "true");
        assert_eq!(c["grad_reduce_dtype"], "fp32");
        // iterations 20, 30 and 50 (10 is warm-up): the median, 2.000 s
        assert_eq!(c["measured_step_s"], "2");
        assert_eq!(run.intervals_used, 3);
        assert_eq!(run.iterations, (20, 50));
        assert_eq!(
            c["source"],
            "median of 3 logged intervals, iterations 20–50"
        );
        assert_eq!(intervals_phrase(1), "1 logged interval");
        // of an even count, the mean of the middle two
        let even = MegatronLog {
            intervals: vec![(10, 9.0), (20, 2.0), (30, 4.0), (40, 1.0), (50, 3.0)],
            ..MegatronLog::default()
        };
        assert_eq!(step_time(&even, 10).unwrap(), (2.5, 4, (20, 50)));
        assert_eq!(c["measured_memory_gib"], "64.000");
        assert_eq!(c["memory_scope"], "allocator");
        let arch = run.arch.unwrap();
        assert_eq!(c["model"], format!("archs/{}.yaml", arch.name));
        assert_eq!(c["family"], arch.name);
        assert_eq!(
            (arch.layers, arch.hidden, arch.kv_heads),
            (32, 4096, Some(8))
        );
        assert_eq!((arch.vocab, arch.vocab_divisible_by), (128256, Some(1)));
        assert_eq!(arch.activation, Activation::Swiglu);
        assert!(!arch.linear_bias && !arch.tied_embeddings && !arch.dropout);
        // a valid architecture, the same one as the Llama 3 8B preset's dimensions
        let checked = arch.clone().validate("test").unwrap();
        let preset = crate::workload::Arch::resolve("llama3-8b").unwrap();
        assert_eq!(checked.total_params(), preset.total_params());
    }

    #[test]
    fn fp8_interleaving_recompute_and_the_loss_are_read_as_megatron_names_them() {
        let run = import(
            &parse(&log(&[
                ("fp8", "hybrid"),
                ("virtual_pipeline_model_parallel_size", "None"),
                ("num_layers_per_virtual_pipeline_stage", "8"),
                ("recompute_granularity", "selective"),
                ("recompute_modules", "['core_attn', 'mlp']"),
                ("cross_entropy_loss_fusion", "True"),
                ("cross_entropy_fusion_impl", "te"),
                ("account_for_loss_in_pipeline_split", "True"),
                ("tp_comm_overlap", "True"),
            ])),
            &options(),
        )
        .unwrap();
        let c = &run.columns;
        assert_eq!(c["dtype"], "fp8");
        assert_eq!(
            (c["vpp"].as_str(), c["schedule"].as_str()),
            ("2", "interleaved")
        );
        assert_eq!(c["recompute"], "selective");
        assert_eq!(c["recompute_modules"], "core_attn+mlp");
        assert_eq!(c["cross_entropy"], "fused");
        assert_eq!(c["pipeline_split"], "loss");
        assert_eq!(c["tp_comm_overlap"], "1");
        // the attention core alone is what `selective` means
        let plain = import(
            &parse(&log(&[
                ("recompute_granularity", "selective"),
                ("recompute_modules", "['core_attn']"),
            ])),
            &options(),
        )
        .unwrap();
        assert_eq!(plain.columns["recompute_modules"], "");
    }

    #[test]
    fn experts_and_their_dispatcher_are_read() {
        // Megatron prints the list it evaluates, a mark for each of the 32 layers
        let marks = |f: &dyn Fn(usize) -> bool| {
            let m: Vec<&str> = (0..32).map(|i| if f(i) { "1" } else { "0" }).collect();
            format!("[{}]", m.join(", "))
        };
        let run = import(
            &parse(&log(&[
                ("num_experts", "64"),
                ("moe_router_topk", "8"),
                ("moe_ffn_hidden_size", "1408"),
                ("moe_layer_freq", &marks(&|i| i > 0)),
                ("expert_model_parallel_size", "8"),
                ("expert_tensor_parallel_size", "1"),
                ("moe_token_dispatcher_type", "flex"),
                ("moe_flex_dispatcher_backend", "hybridep"),
            ])),
            &options(),
        )
        .unwrap();
        let c = &run.columns;
        assert_eq!((c["ep"].as_str(), c["etp"].as_str()), ("8", "1"));
        assert_eq!(c["moe_dispatcher"], "hybridep");
        let arch = run.arch.unwrap();
        assert!(arch.name.ends_with("-e64k8x1408"), "{}", arch.name);
        let moe = arch.moe.unwrap();
        assert_eq!((moe.experts, moe.top_k, moe.expert_ffn), (64, 8, 1408));
        assert_eq!((moe.dense_layers, moe.every, moe.offset), (1, 1, 0));
        let layers = |f: &str| {
            import(
                &parse(&log(&[("num_experts", "8"), ("moe_layer_freq", f)])),
                &options(),
            )
            .map(|r| {
                let m = r.arch.unwrap().moe.unwrap();
                (m.dense_layers, m.every, m.offset)
            })
        };
        // a list: dense and expert layers alternating either way, or after dense first ones
        assert_eq!(layers(&marks(&|i| i % 2 == 0)), Ok((0, 2, 0)));
        // named apart from the same model with experts in every layer
        let odd = import(
            &parse(&log(&[
                ("num_experts", "8"),
                ("moe_layer_freq", &marks(&|i| i % 2 == 1)),
            ])),
            &options(),
        )
        .unwrap();
        assert!(odd.arch.unwrap().name.ends_with("-e8k2x14336-i2o1"));
        assert_eq!(layers(&marks(&|i| i % 2 == 1)), Ok((0, 2, 1)));
        assert_eq!(layers(&marks(&|i| i >= 4 && i % 4 == 0)), Ok((4, 4, 0)));
        assert_eq!(layers(&marks(&|i| i == 31)), Ok((31, 1, 0)));
        // a number: experts in every N-th layer (Megatron's `i % N == 0`), every layer for 1
        assert_eq!(layers("1"), Ok((0, 1, 0)));
        assert_eq!(layers("2"), Ok((0, 2, 0)));
        // uneven gaps, a last stretch without experts, a short list, a bad number: refused
        for (freq, says) in [
            (marks(&|i| i % 3 != 0), "no pattern"),
            (marks(&|i| i < 16), "no pattern"),
            (marks(&|_| false), "no pattern"),
            (
                "[0, 1, 1, 1]".to_string(),
                "marks 4 layers, num_layers is 32",
            ),
            ("0".to_string(), "whole number"),
            ("two".to_string(), "whole number"),
        ] {
            let e = layers(&freq).unwrap_err();
            assert!(
                e.contains("moe_layer_freq") && e.contains(says),
                "{freq}: {e}"
            );
        }
    }

    /// Megatron's `window_attn_skip_freq`: every N-th layer attends to the whole sequence
    /// (`layer_number % N == 0`), so 1 is no window at all; a per-layer list (1 a window) that
    /// repeats N − 1 windows and a whole layer is the same; a window's left of -1 is none.
    #[test]
    fn sliding_windows_are_read_as_megatron_places_them() {
        let window = |changed: &[(&str, &str)]| {
            import(&parse(&log(changed)), &options()).map(|r| {
                let arch = r.arch.unwrap();
                (arch.sliding_window, arch.global_attention_every)
            })
        };
        let with = |skip: &'static str| {
            window(&[("window_size", "[127, 0]"), ("window_attn_skip_freq", skip)])
        };
        assert_eq!(with("2"), Ok((Some(128), Some(2))));
        assert_eq!(with("1"), Ok((Some(128), Some(1))));
        assert_eq!(with("None"), Ok((Some(128), None)));
        assert_eq!(with("[1, 0, 1, 0]"), Ok((Some(128), Some(2))));
        assert_eq!(with("[1, 1, 0, 1, 1, 0]"), Ok((Some(128), Some(3))));
        assert_eq!(with("[1, 1, 1, 1]"), Ok((Some(128), None)));
        for pattern in ["0", "[1, 0, 0, 1]", "[1, 0, 1]", "[0, 1]", "[1, x]"] {
            let e = with(pattern).unwrap_err();
            assert!(
                e.contains("window_attn_skip_freq") && e.contains("--model"),
                "{pattern}: {e}"
            );
        }
        // a whole-sequence window is none; the frequency is not read without a window
        assert_eq!(
            window(&[("window_size", "(-1, 0)"), ("window_attn_skip_freq", "x")]),
            Ok((None, None))
        );
        let e = window(&[("window_size", "(-2, 0)")]).unwrap_err();
        assert!(e.contains("window_size"), "{e}");
        // the Megatron-Bridge configuration's form, as GPT-OSS's recipes write it
        let a = window(&[("window_size", "[127, 0]"), ("window_attn_skip_freq", "2")]);
        assert_eq!(a, Ok((Some(128), Some(2))));
    }

    /// What the other logs do not set: latent attention with YaRN positions; a sliding window
    /// with a global layer every fourth, squared ReLU, both pipeline-split flags, CUDA graphs by
    /// scope and gradients reduced in bf16; a layout string; the all-gather dispatcher and
    /// DeepEP by its flag; fp16 and fp32 training's gradient types.
    #[test]
    fn latent_attention_windows_graphs_and_precisions_are_read() {
        let read = |changed: &[(&str, &str)]| import(&parse(&log(changed)), &options());
        let run = read(&[
            ("multi_latent_attention", "True"),
            ("num_query_groups", "32"),
            ("q_lora_rank", "1536"),
            ("kv_lora_rank", "512"),
            ("qk_head_dim", "128"),
            ("qk_pos_emb_head_dim", "64"),
            ("v_head_dim", "128"),
            ("position_embedding_type", "yarn"),
        ])
        .unwrap();
        let arch = run.arch.unwrap();
        let mla = arch.mla.unwrap();
        assert_eq!(
            (mla.q_lora_rank, mla.kv_lora_rank, mla.qk_nope_head_dim),
            (Some(1536), 512, 128)
        );
        assert_eq!((mla.qk_rope_head_dim, mla.v_head_dim), (64, 128));
        assert_eq!(arch.position, Position::Rope);
        assert!(arch.name.ends_with("-mla"), "{}", arch.name);

        let run = read(&[
            ("window_size", "(4095, 0)"),
            ("window_attn_skip_freq", "4"),
            ("swiglu", "False"),
            ("squared_relu", "True"),
            ("account_for_embedding_in_pipeline_split", "True"),
            ("account_for_loss_in_pipeline_split", "True"),
            ("enable_cuda_graph", "True"),
            ("cuda_graph_scope", "['attn', 'full']"),
            ("grad_reduce_in_bf16", "True"),
            ("accumulate_allreduce_grads_in_fp32", "False"),
        ])
        .unwrap();
        let c = &run.columns;
        assert_eq!(c["pipeline_split"], "embedding+loss");
        assert_eq!(c["cuda_graphs"], "attn");
        assert_eq!(c["grad_reduce_dtype"], "bf16");
        let arch = run.arch.unwrap();
        assert_eq!(arch.sliding_window, Some(4096));
        assert_eq!(arch.global_attention_every, Some(4));
        assert_eq!(arch.activation, Activation::SquaredRelu);
        // graphs with no scope are whole layers; one split flag alone names its side
        let run = read(&[
            ("cuda_graph_impl", "transformer_engine"),
            ("account_for_embedding_in_pipeline_split", "True"),
        ])
        .unwrap();
        assert_eq!(run.columns["cuda_graphs"], "layer");
        assert_eq!(run.columns["pipeline_split"], "embedding");

        let run = read(&[("pipeline_model_parallel_layout", "Et*15|t*16L")]).unwrap();
        assert_eq!(run.columns["pipeline_layout"], "Et*15|t*16L");
        for (changed, dispatcher) in [
            (
                &[("moe_token_dispatcher_type", "allgather")][..],
                "allgather",
            ),
            (&[("moe_enable_deepep", "True")][..], "deepep"),
            (&[("moe_token_dispatcher_type", "flex")][..], "deepep"),
        ] {
            let experts = [("num_experts", "8"), ("expert_model_parallel_size", "2")];
            let run = read(&[&experts[..], changed].concat()).unwrap();
            assert_eq!(run.columns["moe_dispatcher"], dispatcher, "{changed:?}");
        }
        for (flags, dtype, grads) in [
            (
                &[
                    ("bf16", "False"),
                    ("fp16", "True"),
                    ("accumulate_allreduce_grads_in_fp32", "False"),
                ][..],
                "fp16",
                "fp16",
            ),
            (
                &[
                    ("bf16", "False"),
                    ("accumulate_allreduce_grads_in_fp32", "False"),
                ][..],
                "fp32",
                "fp32",
            ),
            (
                &[("accumulate_allreduce_grads_in_fp32", "False")][..],
                "bf16",
                "bf16",
            ),
        ] {
            let run = read(flags).unwrap();
            let c = &run.columns;
            assert_eq!(
                (c["dtype"].as_str(), c["grad_reduce_dtype"].as_str()),
                (dtype, grads)
            );
        }

        for (changed, says) in [
            (
                ("recompute_granularity", "block"),
                "recompute_granularity = \"block\"",
            ),
            (
                ("position_embedding_type", "alibi"),
                "position_embedding_type = \"alibi\"",
            ),
            (("window_size", "wide"), "window_size = \"wide\""),
        ] {
            let e = read(&[changed]).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
    }

    #[test]
    fn a_named_model_replaces_the_arguments_architecture() {
        let mut o = options();
        o.model = Some("llama3-8b".into());
        let run = import(&parse(&log(&[])), &o).unwrap();
        assert!(run.arch.is_none());
        assert_eq!(run.columns["model"], "llama3-8b");
        assert_eq!(run.columns["family"], "llama3-8b");
    }

    #[test]
    fn partial_full_recompute_is_kept_but_not_expressible() {
        let run = import(
            &parse(&log(&[
                ("recompute_granularity", "full"),
                ("recompute_method", "block"),
                ("recompute_num_layers", "2"),
            ])),
            &options(),
        )
        .unwrap();
        assert_eq!(run.columns["expressible"], "false");
        assert!(run.columns["source"].contains("2 of the 16 layers"));
        // every layer of a chunk recomputed is the full recompute stepcast costs
        let whole = |method: &str| {
            let text = log(&[
                ("recompute_granularity", "full"),
                ("recompute_method", method),
                ("recompute_num_layers", "16"),
            ]);
            import(&parse(&text), &options()).unwrap().columns["expressible"].clone()
        };
        assert_eq!(whole("block"), "true");
        assert_eq!(whole("uniform"), "true");
    }

    /// LayerNorm where the log names it; dropout where either dropout is above zero.
    #[test]
    fn the_norm_and_dropout_are_read_as_named() {
        let arch = |changed: &[(&str, &str)]| {
            import(&parse(&log(changed)), &options())
                .unwrap()
                .arch
                .unwrap()
        };
        assert_eq!(arch(&[]).norm, NormKind::Rmsnorm);
        assert_eq!(
            arch(&[("normalization", "LayerNorm")]).norm,
            NormKind::Layernorm
        );
        assert!(!arch(&[]).dropout);
        for (hidden, attention) in [("0.1", "0.0"), ("0.0", "0.1")] {
            let a = arch(&[("hidden_dropout", hidden), ("attention_dropout", attention)]);
            assert!(a.dropout, "{hidden} {attention}");
        }
    }

    /// Older Megatron-LM gives the interleaving as layers per virtual stage; as many chunks as
    /// layers is the most a pipeline can hold.
    #[test]
    fn interleaving_is_read_from_layers_per_virtual_stage_too() {
        let vpp = |changed: &[(&str, &str)]| {
            import(&parse(&log(changed)), &options()).map(|r| r.columns["vpp"].clone())
        };
        assert_eq!(
            vpp(&[("num_layers_per_virtual_pipeline_stage", "4")]).unwrap(),
            "4"
        );
        assert_eq!(
            vpp(&[("num_layers_per_virtual_pipeline_stage", "0")]).unwrap(),
            "1"
        );
        assert_eq!(
            vpp(&[("virtual_pipeline_model_parallel_size", "16")]).unwrap(),
            "16"
        );
        let e = vpp(&[("virtual_pipeline_model_parallel_size", "17")]).unwrap_err();
        assert!(e.contains("more chunks than the 32 layers"), "{e}");
    }

    #[test]
    fn what_is_missing_is_named_with_the_fix() {
        let e = import(&parse("no megatron here\n"), &options()).unwrap_err();
        assert!(e.contains("argument dump") && e.contains("rank 0"), "{e}");
        let no_world = log(&[]).replace("  world_size .", "  xworld_size .");
        let e = import(&parse(&no_world), &options()).unwrap_err();
        assert!(e.contains("world_size"), "{e}");
        let mut o = options();
        o.warmup_iterations = 100;
        let e = import(&parse(&log(&[])), &o).unwrap_err();
        assert!(
            e.contains("past iteration 100") && e.contains("--warmup-iterations"),
            "{e}"
        );
        let e = import(&parse(&log(&[("world_size", "18")])), &options()).unwrap_err();
        assert!(e.contains("world_size 18"), "{e}");
        // nothing a log says panics or wraps
        for (name, value) in [
            ("world_size", "0"),
            ("tensor_model_parallel_size", "0"),
            ("tensor_model_parallel_size", "18446744073709551615"),
            ("micro_batch_size", "0"),
            ("micro_batch_size", "18446744073709551615"),
            (
                "virtual_pipeline_model_parallel_size",
                "18446744073709551615",
            ),
            ("world_size", "-4"),
            ("hidden_size", "18446744073709551615"),
            ("kv_channels", "18446744073709551615"),
        ] {
            assert!(
                import(&parse(&log(&[(name, value)])), &options()).is_err(),
                "{name} {value}"
            );
        }
        let e = import(&parse(&log(&[("global_batch_size", "6")])), &options()).unwrap_err();
        assert!(e.contains("global_batch_size 6"), "{e}");
        let absurd = log(&[])
            .replace("(ms): 2000.0", "(ms): 1e300")
            .replace("(ms): 2010.0", "(ms): 1e300");
        let e = import(&parse(&absurd), &options()).unwrap_err();
        assert!(e.contains("elapsed time per iteration"), "{e}");
    }

    /// Megatron-LM's argument dump of a `stepcast export --format megatron` launch, as its
    /// parser would fill it: each `--flag value…` as `flag value` (several values as a Python
    /// list), a bare switch as `True`, the two flags whose destination has another name
    /// (`--disable-bias-linear`, `--fp8-format`), and the world size torchrun gives.
    fn dump_of_launch(text: &str, world: u64) -> String {
        let tokens: Vec<&str> = text
            .lines()
            .filter(|l| l.trim_start().starts_with("--"))
            .flat_map(str::split_whitespace)
            .filter(|t| *t != "\\")
            .collect();
        let mut args = BTreeMap::from([("world_size".to_string(), world.to_string())]);
        let mut i = 0;
        while i < tokens.len() {
            let name = tokens[i].trim_start_matches("--").replace('-', "_");
            let values: Vec<&str> = tokens[i + 1..]
                .iter()
                .take_while(|t| !t.starts_with("--"))
                .copied()
                .collect();
            i += 1 + values.len();
            let value = match values.as_slice() {
                [] => "True".to_string(),
                [one] => one.to_string(),
                many => format!("{:?}", many).replace('"', "'"),
            };
            match name.as_str() {
                "disable_bias_linear" => args.insert("add_bias_linear".into(), "False".into()),
                "fp8_format" => args.insert("fp8".into(), value),
                _ => args.insert(name, value),
            };
        }
        let mut out = "------------------------ arguments ------------------------\n".to_string();
        for (k, v) in &args {
            out += &format!(
                "  {k} {} {v}\n",
                ".".repeat(48usize.saturating_sub(k.len()))
            );
        }
        out += "-------------------- end of arguments ---------------------\n";
        out += " iteration       20/     100 | elapsed time per iteration (ms): 1000.0 |\n";
        out
    }

    /// Megatron-Core's uneven ends (the first and last rank's layers set apart) are read as
    /// the layout string that places the same layers, over interleaved chunks too; ends that
    /// do not add up, or beside another way to split, are refused as Megatron-Core refuses
    /// them.
    #[test]
    fn uneven_ends_are_read_as_the_layout_that_places_them() {
        use crate::workload::{Layout, ParallelSpec};
        let read = |changed: &[(&str, &str)]| import(&parse(&log(changed)), &options());
        let layout = |changed: &[(&str, &str)]| {
            let run = read(changed).unwrap_or_else(|e| panic!("{changed:?}: {e}"));
            run.columns.get("pipeline_layout").cloned()
        };
        let first = "decoder_first_pipeline_num_layers";
        let last = "decoder_last_pipeline_num_layers";
        // the fixture: 32 layers on pp 2
        assert_eq!(layout(&[]), None);
        assert_eq!(layout(&[(first, "14")]).unwrap(), "Et*14|t*18L");
        assert_eq!(layout(&[(last, "14")]).unwrap(), "Et*18|t*14L");
        assert_eq!(
            layout(&[(first, "14"), (last, "18")]).unwrap(),
            "Et*14|t*18L"
        );
        // as many layers as a model may have are placed; more are refused (below)
        assert_eq!(
            layout(&[("num_layers", "16384"), (first, "8192")]).unwrap(),
            "Et*8192|t*8192L"
        );
        // pp 4 of 2 chunks each: 6 and 6 at the ends, 10 on each rank between
        let four = [
            ("pipeline_model_parallel_size", "4"),
            ("virtual_pipeline_model_parallel_size", "2"),
        ];
        assert_eq!(
            layout(&[&four[..], &[(first, "6"), (last, "6")]].concat()).unwrap(),
            "Et*3|t*5|t*5|t*3|t*3|t*5|t*5|t*3L"
        );
        // costed as that layout: the ranks hold 6, 10, 10 and 6 layers
        let row = read(&[&four[..], &[(first, "6"), (last, "6")]].concat()).unwrap();
        let spec = ParallelSpec {
            tp: Some(2),
            pp: Some(4),
            dp: Some(2),
            micro_batch: Some(1),
            global_batch: Some(64),
            sequence_parallel: Some(true),
            pipeline_layout: Some(row.columns["pipeline_layout"].clone()),
            ..Default::default()
        };
        let arch = crate::workload::Arch::resolve("llama3-8b").unwrap();
        let costed = Layout::new(&spec, &arch, &crate::hardware::dgx_h100_without_models());
        assert_eq!(costed.unwrap().stage_layers, [6, 10, 10, 6]);
        let two: &[(&str, &str)] = &[];
        for (pp, ends, want) in [
            (
                two,
                [(first, "14"), (last, "20")],
                "more layers at the ends",
            ),
            (two, [(first, "14"), (last, "17")], "1 layers on no rank"),
            (&four, [(first, "0"), (last, "8")], "an end of no layers"),
            (two, [(first, "32"), (last, "0")], "an end of no layers"),
            (
                &four,
                [(first, "7"), (last, "5")],
                "rank 0's 7 layers do not split over its 2",
            ),
            (
                &four,
                [(first, "5"), (last, "6")],
                "21 layers do not split over 2 ranks",
            ),
            (
                &[("num_layers", "1000000")],
                [(first, "14"), (last, "14")],
                "more than the 16384 layers",
            ),
        ] {
            let e = read(&[pp, &ends].concat()).unwrap_err();
            assert!(
                e.contains(want) && e.contains("is this one run's log"),
                "{e}"
            );
        }
        for beside in [
            ("pipeline_model_parallel_layout", "Et*16|t*16L"),
            ("account_for_loss_in_pipeline_split", "True"),
        ] {
            let e = read(&[(first, "14"), beside]).unwrap_err();
            assert!(e.contains(beside.0.split('_').next().unwrap()), "{e}");
            assert!(e.contains("which Megatron-Core refuses"), "{e}");
        }
    }

    /// The context-parallel exchange is read from `cp_comm_type` (one for all layers or one
    /// per layer); what stepcast does not cost — an all-to-all exchange, layers exchanging
    /// differently, offloading, Megatron's FSDP, several distributed-optimizer instances — is
    /// kept with its reason, not expressible.
    #[test]
    fn the_context_exchange_is_read_and_what_is_not_costed_is_named() {
        let read = |changed: &[(&str, &str)]| {
            let with_cp = [&[("context_parallel_size", "2")][..], changed].concat();
            import(&parse(&log(&with_cp)), &options()).unwrap().columns
        };
        assert_eq!(read(&[])["cp_comm"], "p2p");
        assert_eq!(
            read(&[("cp_comm_type", "['all_gather']")])["cp_comm"],
            "all-gather"
        );
        assert_eq!(
            read(&[("cp_comm_type", "all_gather")])["cp_comm"],
            "all-gather"
        );
        assert_eq!(
            read(&[("cp_comm_type", "['p2p', 'p2p']")])["expressible"],
            "true"
        );
        let plain = import(&parse(&log(&[])), &options()).unwrap().columns;
        assert!(!plain.contains_key("cp_comm"));
        for (changed, want) in [
            (("cp_comm_type", "['a2a']"), "exchange a2a (cp_comm_type)"),
            (("cp_comm_type", "['p2p', 'a2a+p2p']"), "a2a+p2p and p2p"),
            (("cpu_offloading", "True"), "(cpu_offloading) is not costed"),
            (("optimizer_cpu_offload", "True"), "(optimizer_cpu_offload)"),
            (("use_torch_fsdp2", "True"), "PyTorch FSDP2"),
            (("use_megatron_fsdp", "True"), "Megatron-FSDP"),
            (
                ("num_distributed_optimizer_instances", "2"),
                "2 distributed-optimizer",
            ),
        ] {
            let c = read(&[changed]);
            assert_eq!(c["expressible"], "false", "{changed:?}");
            assert!(c["reason"].contains(want), "{changed:?}: {}", c["reason"]);
        }
        let one = read(&[("num_distributed_optimizer_instances", "1")]);
        assert_eq!(one["expressible"], "true");
    }

    /// What `export --format megatron` writes, `runs import` reads back as the same layout
    /// and architecture: the two are each other's inverse on what both express.
    #[test]
    fn an_exported_launch_is_imported_as_the_layout_it_was_made_from() {
        use crate::export::{export, Framework, Target};
        use crate::workload::{Arch, Layout, ParallelSpec, Recompute};
        let cluster = crate::hardware::dgx_h100_without_models();
        let cases = [
            (
                "llama3-8b",
                ParallelSpec {
                    tp: Some(2),
                    pp: Some(2),
                    dp: Some(2),
                    vpp: Some(2),
                    dtype: Some(crate::ops::Dtype::Fp8),
                    recompute: Some(Recompute::Selective),
                    sequence_parallel: Some(true),
                    micro_batch: Some(1),
                    global_batch: Some(16),
                    ..Default::default()
                },
            ),
            (
                "llama2-70b",
                ParallelSpec {
                    tp: Some(4),
                    pp: Some(4),
                    dp: Some(4),
                    recompute: Some(Recompute::Full),
                    sequence_parallel: Some(true),
                    tp_comm_overlap: Some(true),
                    cross_entropy: Some(crate::workload::CrossEntropy::Fused),
                    micro_batch: Some(1),
                    global_batch: Some(64),
                    ..Default::default()
                },
            ),
            (
                concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/mixtral-8x7b.yaml"),
                ParallelSpec {
                    tp: Some(2),
                    pp: Some(4),
                    dp: Some(8),
                    ep: Some(8),
                    sequence_parallel: Some(true),
                    micro_batch: Some(1),
                    global_batch: Some(64),
                    ..Default::default()
                },
            ),
            // the GPT-NeoX split, [8, 9, 9, 6]: exported as uneven ends
            (
                "llama2-7b",
                ParallelSpec {
                    pp: Some(4),
                    dp: Some(2),
                    partition: Some(crate::workload::Partition::Neox),
                    micro_batch: Some(1),
                    global_batch: Some(16),
                    ..Default::default()
                },
            ),
            (
                "llama3-8b",
                ParallelSpec {
                    tp: Some(2),
                    cp: Some(2),
                    dp: Some(2),
                    cp_comm: Some(crate::workload::CpComm::AllGather),
                    sequence_parallel: Some(true),
                    micro_batch: Some(1),
                    global_batch: Some(16),
                    ..Default::default()
                },
            ),
        ];
        for (model, spec) in cases {
            let arch = Arch::resolve(model).unwrap();
            let layout = Layout::new(&spec, &arch, &cluster).unwrap();
            let launch = export(
                Framework::Megatron,
                &Target {
                    arch: &arch,
                    layout: &layout,
                    gpus_per_node: 8,
                    headline: "test".into(),
                },
            )
            .unwrap();
            let dump = dump_of_launch(&launch.text, layout.world);
            let mut o = options();
            o.warmup_iterations = 0;
            let run = import(&parse(&dump), &o).unwrap_or_else(|e| panic!("{model}: {e}"));
            let c = &run.columns;
            let want = [
                ("tp", layout.tp.to_string()),
                ("pp", layout.pp.to_string()),
                ("dp", layout.dp.to_string()),
                ("vpp", layout.vpp.to_string()),
                ("micro_batch", layout.micro_batch.to_string()),
                ("global_batch", spec.global_batch.unwrap().to_string()),
                ("seq_len", layout.seq_len.to_string()),
                ("dtype", layout.dtype.to_string()),
                ("recompute", layout.recompute.to_string()),
                ("sequence_parallel", yes(layout.sequence_parallel)),
                ("tp_comm_overlap", u8::from(layout.overlap.tp).to_string()),
                ("overlap_grad_reduce", yes(layout.overlap.grad_reduce)),
                ("overlap_param_gather", yes(layout.overlap.param_gather)),
                ("zero", layout.zero.to_string()),
            ];
            for (column, value) in want {
                assert_eq!(c[column], value, "{model}: {column}\n{dump}");
            }
            // the row's pipeline layout places the layers where the exported split did
            let split = Layout::new(
                &ParallelSpec {
                    partition: None,
                    pipeline_layout: c.get("pipeline_layout").cloned(),
                    ..spec.clone()
                },
                &arch,
                &cluster,
            )
            .unwrap();
            assert_eq!(split.stage_layers, layout.stage_layers, "{model}");
            let cp_comm = (layout.cp > 1).then(|| layout.cp_comm.to_string());
            assert_eq!(c.get("cp_comm"), cp_comm.as_ref(), "{model}");
            assert_eq!(
                c["cross_entropy"] == "fused",
                spec.cross_entropy.is_some(),
                "{model}"
            );
            let imported = run.arch.unwrap().validate("imported").unwrap();
            assert_eq!(
                (
                    imported.layers,
                    imported.hidden,
                    imported.heads,
                    imported.kv_heads
                ),
                (arch.layers, arch.hidden, arch.heads, arch.kv_heads),
                "{model}"
            );
            assert_eq!(imported.ffn_hidden, arch.ffn_hidden, "{model}");
            assert_eq!(imported.activation, arch.activation, "{model}");
            assert_eq!(imported.norm, arch.norm, "{model}");
            if let Some(moe) = arch.moe {
                let got = imported.moe.unwrap();
                assert_eq!(
                    (got.experts, got.top_k, got.expert_ffn),
                    (moe.experts, moe.top_k, moe.expert_ffn)
                );
                assert_eq!(c["ep"], layout.ep.to_string());
                assert_eq!(c["etp"], layout.etp.to_string());
                assert_eq!(c["moe_dispatcher"], layout.moe_dispatcher.to_string());
            }
        }
    }

    /// Megatron-Bridge's configuration of the fixture's run, read with the run's iteration
    /// lines, is the same row as Megatron-LM's argument dump of it.
    #[test]
    fn a_bridge_configuration_is_read_as_megatrons_arguments_of_the_same_run() {
        let config = include_str!("../../tests/data/megatron/llama3-8b-tp2-pp2.bridge.yaml");
        let megatron = parse(&log(&[]));
        let mut bridge = megatron.clone();
        bridge.args = args_of_bridge_config(config, 16).unwrap();
        let (a, b) = (
            import(&megatron, &options()).unwrap(),
            import(&bridge, &options()).unwrap(),
        );
        assert_eq!(a.columns, b.columns);
        assert_eq!(a.arch, b.arch);
        // what Bridge names otherwise
        let args = &bridge.args;
        assert_eq!(args["swiglu"], "True");
        assert_eq!(args["group_query_attention"], "True");
        assert_eq!(args["untie_embeddings_and_output_weights"], "True");
        assert_eq!(args["padded_vocab_size"], "128256");
        assert_eq!(args["recompute_modules"], "['core_attn']");
        assert_eq!(args["world_size"], "16");
        assert!(!args.contains_key("params_dtype"));
        // query groups as many as the heads, or none given, are not grouped-query attention
        for groups in ["32", "null"] {
            let config = config.replace(
                "num_query_groups: 8",
                &format!("num_query_groups: {groups}"),
            );
            let args = args_of_bridge_config(&config, 16).unwrap();
            assert!(!args.contains_key("group_query_attention"), "{groups}");
        }
        // Bridge's names of the uneven ends are Megatron's arguments of them
        let uneven = config.replace(
            "num_query_groups: 8",
            "num_query_groups: 8\n  num_layers_in_first_pipeline_stage: 14\n  \
             num_layers_in_last_pipeline_stage: null",
        );
        let args = args_of_bridge_config(&uneven, 16).unwrap();
        assert_eq!(args["decoder_first_pipeline_num_layers"], "14");
        assert_eq!(args["decoder_last_pipeline_num_layers"], "None");
        let mut run = megatron.clone();
        run.args = args;
        let c = import(&run, &options()).unwrap().columns;
        assert_eq!(c["pipeline_layout"], "Et*14|t*18L");
        // a file that is not one says so
        let e = args_of_bridge_config("train: {micro_batch_size: 1}\n", 8).unwrap_err();
        assert!(e.contains("model:") && e.contains("--dryrun"), "{e}");
        assert!(args_of_bridge_config(": : :", 8)
            .unwrap_err()
            .contains("not YAML"));
    }

    #[test]
    fn other_iteration_line_forms_are_read() {
        // a running mean after the interval's, a launcher's rank label before the text
        let line = "0: [2026-11-27] iteration      30/    100 | consumed samples: 3840 | \
                    elapsed time per iteration (ms): 1500.5/1600.0 | lm loss: 5.0 |";
        assert_eq!(interval(line), Some((30, 1500.5)));
        assert_eq!(
            argument("0:   tensor_model_parallel_size ........ 8"),
            Some(("tensor_model_parallel_size".into(), "8".into()))
        );
        // a logger's prefix with dashes and a rank, throughput after the time
        let line = "[20261127 10:00:00][rank-15/16][INFO ] [-----train.py:99] :  iteration \
                    40/ 100 | consumed samples: 5120 | elapsed time per iteration (ms): \
                    2010.5/2000.0 | throughput per GPU (TFLOP/s/GPU): 400.1/401.0 |";
        assert_eq!(interval(line), Some((40, 2010.5)));
        assert_eq!(interval("iterations are fun"), None);
        // an interval that hit a NaN, or timed nothing, is left out
        let nan = "iteration 50/ 100 | elapsed time per iteration (ms): 1990.0 | number of \
                   skipped iterations:   0 | number of nan iterations:   1 |";
        assert_eq!(interval(nan), None);
        assert_eq!(
            interval(&nan.replace("iterations:   1", "iterations:   0")),
            Some((50, 1990.0))
        );
        assert_eq!(
            interval("iteration 50/ 100 | elapsed time per iteration (ms): 0.0 |"),
            None
        );
        // a rank that reported no reserved memory says nothing about the peak
        assert_eq!(
            max_reserved("[Rank 0] memory (MB) | allocated: 0.0 | max reserved: 0.0"),
            None
        );
        // Megatron-Bridge's memory report, in 10⁹ bytes
        let bridge =
            "[Rank 3] (after 10 iterations) memory (GB) | mem-allocated-gigabytes: 20.0 | \
                      mem-max-reserved-gigabytes: 68.719 | mem-alloc-retires: 0";
        let mib = max_reserved(bridge).unwrap();
        assert!((mib - 68.719e9 / 1_048_576.0).abs() < 1e-6, "{mib}");
        // DeepSpeed's seconds are not Megatron's milliseconds
        assert_eq!(
            interval(" iteration 4/ 10 | elapsed time per iteration (s): 11.18 |"),
            None
        );
    }

    #[test]
    fn the_vocabulary_padded_after_the_dump_and_the_attention_backend_are_read() {
        // Megatron-LM of 2025 pads the vocabulary after printing the arguments and says so
        let text = log(&[]).replace(
            "  padded_vocab_size ............................... 128256\n",
            "",
        );
        let text = text.replace(
            "> building NullTokenizer tokenizer ...",
            "> building NullTokenizer tokenizer ...\n > padded vocab (size: 128256) with 256 \
             dummy tokens (new size: 128512)",
        );
        assert!(!text.contains("padded_vocab_size"));
        let arch = import(&parse(&text), &options()).unwrap().arch.unwrap();
        assert_eq!(arch.vocab, 128512);
        // the dump's own figure wins where it has one
        let both = log(&[]).replace(
            "> building NullTokenizer tokenizer ...",
            " > padded vocab (size: 5) with 123 dummy tokens (new size: 128)",
        );
        let arch = import(&parse(&both), &options()).unwrap().arch.unwrap();
        assert_eq!(arch.vocab, 128256);
        assert_eq!(
            padded_vocab("> padded vocab (size: 7) with 1 dummy tokens"),
            None
        );
        // Megatron-Core's attention backend: the unfused ones by name, the others fused
        for (backend, expected) in [
            ("AttnBackend.auto", AttentionImpl::Flash),
            ("AttnBackend.flash", AttentionImpl::Flash),
            ("AttnBackend.unfused", AttentionImpl::Unfused),
            ("AttnBackend.local", AttentionImpl::Unfused),
        ] {
            let text = log(&[("attention_backend", backend)]);
            let arch = import(&parse(&text), &options()).unwrap().arch.unwrap();
            assert_eq!(arch.attention, expected, "{backend}");
        }
    }

    #[test]
    fn a_megatron_deepspeed_run_is_read_with_deepspeeds_own_settings() {
        let run = import(&parse(&deepspeed_log(&[])), &options()).unwrap();
        let c = &run.columns;
        assert_eq!(c["framework"], "deepspeed");
        assert_eq!(c["zero"], "1");
        assert_eq!(
            (c["dtype"].as_str(), c["grad_reduce_dtype"].as_str()),
            ("fp16", "fp16")
        );
        assert_eq!(c["recompute"], "full");
        assert_eq!(
            (c["tp"].as_str(), c["pp"].as_str(), c["dp"].as_str()),
            ("2", "2", "2")
        );
        assert_eq!(c["measured_step_s"], "1");
        assert_eq!(c["measured_memory_gib"], "14.000");
        assert_eq!(c["expressible"], "true", "{}", c["source"]);
        assert!(
            c["label"].ends_with("FP16 DeepSpeed ZeRO 1"),
            "{}",
            c["label"]
        );
        // its pipeline engine reduces gradients after the last micro-batch; without a
        // pipeline ZeRO's `overlap_comm` reduces them during the backward
        assert_eq!(c["overlap_grad_reduce"], "false");
        let overlapped = deepspeed_log(&[
            ("pipeline_model_parallel_size", "1"),
            ("data_parallel_size", "4"),
        ])
        .replace("overlap_comm=False", "overlap_comm=True");
        let r = import(&parse(&overlapped), &options()).unwrap();
        assert_eq!(
            (
                r.columns["dp"].as_str(),
                r.columns["overlap_grad_reduce"].as_str()
            ),
            ("4", "true")
        );
        // under a pipeline the engine reduces after the last micro-batch whatever ZeRO says
        let piped = deepspeed_log(&[]).replace("overlap_comm=False", "overlap_comm=True");
        let r = import(&parse(&piped), &options()).unwrap();
        assert_eq!(r.columns["overlap_grad_reduce"], "false");
        // `num_experts [1]` is a dense model; the vocabulary is the tokenizer's padded size,
        // printed after the arguments; GPT-2's learned positions, LayerNorm, GELU, biases and
        // tied embeddings; the unfused softmax where no FlashAttention switch is on
        let arch = run.arch.unwrap();
        assert!(arch.moe.is_none());
        assert_eq!(arch.vocab, 50432);
        assert_eq!(
            (arch.position, arch.norm, arch.activation),
            (Position::Learned, NormKind::Layernorm, Activation::Gelu)
        );
        assert!(arch.tied_embeddings && arch.linear_bias && arch.dropout);
        assert_eq!(arch.attention, AttentionImpl::Unfused);
        assert_eq!(arch.name, "megatron-l24-h2048-a16-f8192-v50432");
    }

    /// DeepSpeed's engine settings end where it prints the user's JSON, on a line that says
    /// `json = ` or names `print_user_config` (versions print either or both); a dump line whose
    /// name is not an identifier is not an argument.
    #[test]
    fn deepspeeds_settings_end_at_the_users_json_and_only_names_are_arguments() {
        let text = |end: &str| {
            format!(
                "DeepSpeedEngine configuration:\n  zero_optimization_stage ...... 2\n{end}\n  \
                 fp16 ...... true\n"
            )
        };
        for end in ["  json = {", "[config.py:950:print_user_config] {"] {
            let l = parse(&text(end));
            assert_eq!(l.deepspeed.get("zero_optimization_stage").unwrap(), "2");
            assert!(
                !l.deepspeed.contains_key("fp16"),
                "{end}: {:?}",
                l.deepspeed
            );
        }
        let l = parse(
            "---- arguments ----\n  a-b ...... 1\n  tp ...... 2\n---- end of arguments ----\n",
        );
        assert_eq!(l.args, BTreeMap::from([("tp".into(), "2".into())]));
    }

    #[test]
    fn deepspeeds_printed_stage_wins_over_the_argument() {
        let stage =
            |text: String| import(&parse(&text), &options()).map(|r| r.columns["zero"].clone());
        let printed = deepspeed_log(&[]).replace(
            "zero_optimization_stage ...... 1",
            "zero_optimization_stage ...... 2",
        );
        assert_eq!(stage(printed).unwrap(), "2");
        // without DeepSpeed's configuration the argument says it (1.0: an int with a float
        // default)
        let without = |zero: &str| {
            deepspeed_log(&[("zero_stage", zero)])
                .lines()
                .filter(|l| !l.contains("[config.py"))
                .collect::<Vec<_>>()
                .join("\n")
        };
        assert_eq!(stage(without("1.0")).unwrap(), "1");
        assert_eq!(stage(without("3")).unwrap(), "3");
        let e = stage(without("1.5")).unwrap_err();
        assert!(e.contains("zero_stage") && e.contains("ZeRO stage"), "{e}");
        let e = stage(without("4")).unwrap_err();
        assert!(e.contains("\"4\""), "{e}");
    }

    #[test]
    fn what_deepspeed_runs_that_is_not_costed_is_named() {
        let run = |text: String| import(&parse(&text), &options());
        // bf16 as newer DeepSpeed prints it
        let bf16 = deepspeed_log(&[])
            .replace(
                "bfloat16_enabled ............. False",
                "bfloat16_config .............. enabled=True immediate_grad_update=False",
            )
            .replace(
                "fp16_enabled ................. True",
                "fp16_enabled ................. False",
            );
        assert_eq!(run(bf16).unwrap().columns["dtype"], "bf16");
        // the optimizer offloaded to the host, Ulysses sequence parallelism: kept, not
        // expressible
        let offload = deepspeed_log(&[]).replace(
            "offload_optimizer=None",
            "offload_optimizer=DeepSpeedZeroOffloadOptimizerConfig(device='cpu')",
        );
        let r = run(offload).unwrap();
        assert_eq!(r.columns["expressible"], "false");
        assert!(
            r.columns["source"].contains("offload"),
            "{}",
            r.columns["source"]
        );
        let r = run(deepspeed_log(&[("ds_sequence_parallel_size", "2")])).unwrap();
        assert_eq!(r.columns["expressible"], "false");
        assert!(r.columns["source"].contains("Ulysses"));
        let r = run(deepspeed_log(&[("ds_sequence_parallel_size", "1")])).unwrap();
        assert_eq!(r.columns["expressible"], "true");
        let r = run(deepspeed_log(&[("cpu_optimizer", "True")])).unwrap();
        assert!(r.columns["source"].contains("offload"));
        // neither 16-bit type enabled in DeepSpeed nor asked for: fp32
        let fp32 = deepspeed_log(&[("fp16", "False")]).replace(
            "fp16_enabled ................. True",
            "fp16_enabled ................. False",
        );
        assert_eq!(run(fp32).unwrap().columns["dtype"], "fp32");
        // DeepSpeed-MoE's mixtures are refused, a list that is not counts named
        let e = run(deepspeed_log(&[("num_experts", "[8]")])).unwrap_err();
        assert!(e.contains("Megatron-DeepSpeed's mixtures"), "{e}");
        let e = run(deepspeed_log(&[("num_experts", "[many]")])).unwrap_err();
        assert!(e.contains("num_experts"), "{e}");
    }

    #[test]
    fn megatron_deepspeeds_own_names_for_a_llama_are_read() {
        let text = deepspeed_log(&[
            ("num_key_value_heads", "4"),
            ("normalization", "rmsnorm"),
            ("swiglu", "True"),
            ("use_rotary_position_embeddings", "True"),
            ("add_bias_linear", "False"),
            ("untie_embeddings_and_output_weights", "True"),
            ("use_flash_attn_v2", "True"),
        ]);
        let arch = import(&parse(&text), &options()).unwrap().arch.unwrap();
        assert_eq!(arch.kv_heads, Some(4));
        assert_eq!(
            (arch.position, arch.norm, arch.activation),
            (Position::Rope, NormKind::Rmsnorm, Activation::Swiglu)
        );
        assert_eq!(arch.attention, AttentionImpl::Flash);
        assert!(!arch.tied_embeddings && !arch.linear_bias);
        // as many key-value heads as heads is plain multi-head attention
        let text = deepspeed_log(&[("num_key_value_heads", "16")]);
        let arch = import(&parse(&text), &options()).unwrap().arch.unwrap();
        assert_eq!(arch.kv_heads, None);
    }
}

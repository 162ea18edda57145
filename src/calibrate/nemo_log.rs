//! Measured runs from NeMo 2 training logs and the NeMo-Run task they ran (`stepcast runs
//! import --format nemo`).
//!
//! NeMo 2 trains Megatron-Core models under PyTorch Lightning. Its log prints no argument dump,
//! only the step times Lightning's progress callbacks print: NeMo's `ProgressPrinter`
//! (`Training epoch 0, iteration 20/100 | … | train_step_timing in s: 1.234 | …`, each metric
//! the mean over the `log_interval` steps since the line before) or its tqdm bar (`Epoch 0:
//! 100%|…| 100/100 [10:48<00:00, …, train_step_timing in s=3.13]`, the latest step's), where
//! `train_step_timing` is `TimingCallback`'s time of one global batch. The layout comes from the
//! task NeMo-Run saves beside the experiment, `<task>_config.yaml`: the recipe's configuration
//! as YAML, each object its `_target_` class and the arguments the recipe set. A model config
//! holds only what the recipe set, not its class's defaults (`Llama3Config8B`'s layers are in
//! NeMo's source, not in the file), so the architecture is the stepcast preset of that class or
//! the user's `--model`, and every size the file does set is checked against it.

use std::collections::BTreeMap;

use serde_norway::{Mapping, Value};

use super::megatron_log::{
    self, leading_number, median_past_warmup, python_repr, ImportOptions, ImportedRun, MegatronLog,
};
use crate::workload::Arch;

/// NeMo's model config classes that are a stepcast preset: the same sizes and layer kinds
/// (Llama 3.1 differs from Llama 3 only in RoPE scaling, which costs nothing more).
const MODEL_CLASSES: [(&str, &str); 9] = [
    ("Llama2Config7B", "llama2-7b"),
    ("Llama2Config13B", "llama2-13b"),
    ("Llama2Config70B", "llama2-70b"),
    ("Llama3Config8B", "llama3-8b"),
    ("Llama31Config8B", "llama3-8b"),
    ("Llama3Config70B", "llama3-70b"),
    ("Llama31Config70B", "llama3-70b"),
    ("Llama31Config405B", "llama3-405b"),
    ("GPTConfig175B", "gpt3-175b"),
];

/// Reads a NeMo 2 log's step lines (a tqdm bar's refreshes, which `\r` separates, included):
/// per step printed, its milliseconds; a step printed twice keeps its last line.
pub fn parse(text: &str) -> MegatronLog {
    let mut steps = BTreeMap::new();
    for line in text.split(['\n', '\r']) {
        if let Some((step, seconds)) = printer_line(line).or_else(|| bar_line(line)) {
            steps.insert(step, seconds * 1e3);
        }
    }
    MegatronLog {
        intervals: steps.into_iter().collect(),
        ..MegatronLog::default()
    }
}

/// `Training epoch 0, iteration 20/100 | … | train_step_timing in s: 1.234`: (20, 1.234).
fn printer_line(line: &str) -> Option<(u64, f64)> {
    const TIMING: &str = "train_step_timing in s:";
    let at = line.find(TIMING)?;
    let seconds = leading_number(&line[at + TIMING.len()..])?;
    let (_, after) = line.split_once("iteration ")?;
    let (step, _) = after.split_once('/')?;
    Some((step.trim().parse().ok()?, seconds)).filter(|_| seconds > 0.0)
}

/// `Epoch 0: 100%|██████████| 100/100 [10:48<00:00, …, train_step_timing in s=3.13]`: (100,
/// 3.13), the step the bar counts.
fn bar_line(line: &str) -> Option<(u64, f64)> {
    const TIMING: &str = "train_step_timing in s=";
    let at = line.find(TIMING)?;
    let seconds = leading_number(&line[at + TIMING.len()..])?;
    let (bar, _) = line.split_once(" [")?;
    let count = bar.split_whitespace().last()?;
    let (step, _) = count.split_once('/')?;
    Some((step.parse().ok()?, seconds)).filter(|_| seconds > 0.0)
}

/// A NeMo-Run task read as the run it launches.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// Its settings under Megatron-LM's argument names, as `megatron_log::import` reads them.
    pub args: BTreeMap<String, String>,
    /// The model it trained, as the runs CSV names it: a preset, or the user's `--model`.
    pub model: String,
    /// What in it is not costed (none: the run is expressible).
    pub reasons: Vec<String>,
}

/// The class an object of the configuration builds (`_target_`'s last part), if it is one.
fn class(v: &Value) -> Option<&str> {
    let target = v.get("_target_")?.as_str()?;
    Some(target.rsplit('.').next().unwrap_or(target))
}

/// The scalar settings of `map` (objects left out) written over `args`.
fn put_scalars(args: &mut BTreeMap<String, String>, map: Option<&Value>) {
    let Some(map) = map.and_then(Value::as_mapping) else {
        return;
    };
    for (key, value) in map {
        if let (Some(key), Some(value)) = (key.as_str(), python_repr(value)) {
            if key != "_target_" && key != "_partial_" {
                args.insert(key.to_string(), value);
            }
        }
    }
}

/// A setting that is a count (`devices: 8`), if it is one.
fn count(v: Option<&Value>) -> Option<u64> {
    v.and_then(Value::as_u64)
}

/// A setting that is true (`sequence_parallel: true`).
fn on(v: Option<&Value>) -> bool {
    v.and_then(Value::as_bool) == Some(true)
}

/// The objects a setting holds that build `class_name`: a lone object or a list's.
fn objects<'a>(v: Option<&'a Value>, class_name: &str) -> Vec<&'a Mapping> {
    let items: Vec<&Value> = match v {
        Some(Value::Sequence(items)) => items.iter().collect(),
        Some(one) => vec![one],
        None => vec![],
    };
    items
        .into_iter()
        .filter(|i| class(i) == Some(class_name))
        .filter_map(Value::as_mapping)
        .collect()
}

/// Reads NeMo-Run's `<task>_config.yaml` of a pre-training or fine-tuning task. `gpus` is the
/// user's `--gpus` (needed where `trainer.devices` is not a count, checked against it where it
/// is); `model` the user's `--model`, else the preset of the model config's class; `resolve`
/// loads a model by that name. Errors name the setting and say what to do.
pub fn task(
    yaml: &str,
    gpus: Option<u64>,
    model: Option<&str>,
    resolve: impl Fn(&str) -> Result<Arch, String>,
) -> Result<Task, String> {
    let root: Value = serde_norway::from_str(yaml).map_err(|e| format!("not YAML: {e}"))?;
    let Some(trainer) = root.get("trainer").filter(|t| t.is_mapping()) else {
        return Err(
            "no `trainer:` section: give the `<task>_config.yaml` NeMo-Run saves in the \
             experiment's `configs` folder (the pre-training task's configuration)"
                .into(),
        );
    };
    let strategy = trainer.get("strategy");
    match strategy.map(|s| class(s).unwrap_or("")) {
        Some("MegatronStrategy") => {}
        other => {
            return Err(format!(
                "trainer.strategy is {}, not MegatronStrategy: only Megatron-Core runs \
                 (NeMo's llm recipes) are imported",
                other.map_or("not set".into(), |c| format!("{c:?}"))
            ))
        }
    }
    let world = world_size(trainer, gpus)?;
    let mut args = BTreeMap::from([("world_size".to_string(), world.to_string())]);
    let model_config = root.get("model").and_then(|m| m.get("config"));
    // in increasing precedence: the data module's sequence is the one trained (the model's
    // `seq_length` is its longest), the strategy's parallelism is applied onto the model
    put_scalars(&mut args, model_config);
    put_scalars(&mut args, root.get("data"));
    put_scalars(&mut args, strategy);
    let ddp = strategy.and_then(|s| s.get("ddp"));
    put_scalars(&mut args, ddp);
    let optim_config = root.get("optim").and_then(|o| o.get("config"));
    put_scalars(&mut args, optim_config);
    let distributed_optimizer = on(optim_config.and_then(|c| c.get("use_distributed_optimizer")))
        || on(ddp.and_then(|d| d.get("use_distributed_optimizer")));
    args.insert(
        "use_distributed_optimizer".into(),
        python_bool(distributed_optimizer),
    );
    precision(&mut args, trainer)?;
    comm_overlap(&mut args, trainer, world, distributed_optimizer);
    megatron_log::megatron_core_names(&mut args);

    let mut reasons = Vec::new();
    if let Some(peft) = root.get("peft").filter(|p| p.is_mapping()) {
        reasons.push(format!(
            "parameter-efficient fine-tuning ({}: only the adapters train) is not costed",
            class(peft).unwrap_or("peft")
        ));
    }
    if ddp.and_then(Value::as_str) == Some("pytorch") {
        reasons.push(
            "PyTorch's DDP (trainer.strategy.ddp: pytorch) is not costed: Megatron-Core's is"
                .into(),
        );
    }
    let model = the_model(&mut args, model_config, model, resolve)?;
    let task = Task {
        args,
        model,
        reasons,
    };
    // the layout's faults are the file's, found before any log is read: a step of a
    // millisecond stands in for the log's
    let probe = MegatronLog {
        intervals: vec![(u64::MAX, 1.0)],
        ..MegatronLog::default()
    };
    let options = ImportOptions {
        set: String::new(),
        family: None,
        cluster: String::new(),
        model: None,
        warmup_iterations: 0,
    };
    import(&probe, &task, &options).map_err(|e| {
        e.replace(
            "is this one run's log?",
            "check the configuration is the one this run was launched with",
        )
    })?;
    Ok(task)
}

fn python_bool(b: bool) -> String {
    if b { "True" } else { "False" }.into()
}

/// The GPUs the run used: `trainer.devices` × `trainer.num_nodes`, or the user's `--gpus`
/// where the devices are not a count; the two must agree where both are given.
fn world_size(trainer: &Value, gpus: Option<u64>) -> Result<u64, String> {
    let devices = count(trainer.get("devices"));
    let nodes = match trainer.get("num_nodes") {
        None => Some(1),
        n => count(n),
    };
    let from_file = devices.zip(nodes).map(|(d, n)| d.checked_mul(n));
    match (from_file, gpus) {
        (Some(None), _) => Err(
            "trainer.devices × trainer.num_nodes overflows: is this one \
                                run's configuration?"
                .into(),
        ),
        (Some(Some(n)), Some(g)) if n != g => Err(format!(
            "trainer.devices × trainer.num_nodes is {n} GPUs, --gpus {g}: give the GPUs the \
             run used, or leave --gpus out"
        )),
        (Some(Some(n)), _) => {
            crate::limits::check_range("trainer", "devices × num_nodes", n as f64, 1.0..=1e6, "")?;
            Ok(n)
        }
        (None, Some(g)) => Ok(g),
        (None, None) => Err(format!(
            "trainer.devices ({}) × trainer.num_nodes ({}) is not a count of GPUs: give \
             --gpus N (the GPUs the run used)",
            value_text(trainer.get("devices")),
            value_text(trainer.get("num_nodes")),
        )),
    }
}

fn value_text(v: Option<&Value>) -> String {
    v.and_then(python_repr).unwrap_or_else(|| "not set".into())
}

/// The precision NeMo's `MegatronMixedPrecision` plugin sets onto the model, optimizer and
/// DDP configs (its `DtypeConfig` overrides theirs): bf16 or fp16, fp8 and its recipe,
/// gradients reduced in fp32 (its default) and fp8 weights gathered (not by default).
fn precision(args: &mut BTreeMap<String, String>, trainer: &Value) -> Result<(), String> {
    let plugins = objects(trainer.get("plugins"), "MegatronMixedPrecision");
    let [plugin] = plugins[..] else {
        return Err(format!(
            "trainer.plugins holds {} MegatronMixedPrecision plugins, not one: the run's \
             precision is not in the file (NeMo's recipes set one, as bf16_mixed())",
            plugins.len()
        ));
    };
    let setting = |name: &str| plugin.get(name).filter(|v| !v.is_null());
    let precision = setting("precision")
        .and_then(python_repr)
        .unwrap_or_default();
    let (bf16, fp16) = match precision.as_str() {
        "bf16" | "bf16-mixed" => (true, false),
        "16" | "fp16" | "16-mixed" | "fp16-mixed" => (false, true),
        "32" | "fp32" | "32-true" => (false, false),
        other => {
            return Err(format!(
                "trainer.plugins.precision {other:?} is not bf16-mixed, 16-mixed or 32"
            ))
        }
    };
    args.insert("bf16".into(), python_bool(bf16));
    args.insert("fp16".into(), python_bool(fp16));
    args.remove("fp8");
    if let Some(fp8) = setting("fp8").and_then(python_repr) {
        args.insert("fp8".into(), fp8);
        if let Some(recipe) = setting("fp8_recipe").and_then(python_repr) {
            args.insert("fp8_recipe".into(), recipe);
        }
    }
    let gather = setting("fp8_param_gather").or_else(|| setting("fp8_params"));
    args.insert("fp8_param_gather".into(), python_bool(on(gather)));
    let fp32_grads = setting("grad_reduce_in_fp32").is_none_or(|v| v.as_bool() == Some(true));
    args.insert("grad_reduce_in_fp32".into(), python_bool(fp32_grads));
    Ok(())
}

/// What NeMo's `MegatronCommOverlapCallback` turns on, where the trainer has one: TP overlap
/// where the callback asks for it and the layout allows it (tp > 1 with sequence parallelism);
/// with the distributed optimizer and more than one data-parallel rank, the gradient
/// reduce-scatter and parameter all-gather overlapped unless the callback says otherwise.
/// Without it NeMo sets up no userbuffers: TP communication is not overlapped.
fn comm_overlap(
    args: &mut BTreeMap<String, String>,
    trainer: &Value,
    world: u64,
    distributed_optimizer: bool,
) {
    // a degree of 0 is refused when the task is read as a run; here it only must not divide
    let degree = |name: &str| {
        args.get(name)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(1)
    };
    let model_parallel = degree("tensor_model_parallel_size")
        .saturating_mul(degree("pipeline_model_parallel_size"))
        .saturating_mul(degree("context_parallel_size"));
    let dp = world / model_parallel.max(1);
    let tp_allows = degree("tensor_model_parallel_size") > 1
        && args.get("sequence_parallel").map(String::as_str) == Some("True");
    let callbacks = objects(trainer.get("callbacks"), "MegatronCommOverlapCallback");
    let Some(callback) = callbacks.last() else {
        args.insert("tp_comm_overlap".into(), python_bool(false));
        return;
    };
    let asked = |name: &str| callback.get(name).and_then(Value::as_bool);
    args.insert(
        "tp_comm_overlap".into(),
        python_bool(asked("tp_comm_overlap") == Some(true) && tp_allows),
    );
    if distributed_optimizer {
        for name in ["overlap_grad_reduce", "overlap_param_gather"] {
            let overlapped = asked(name).unwrap_or(dp > 1);
            args.insert(name.into(), python_bool(overlapped));
        }
    }
}

/// The model the run trained (the user's, else the preset of the model config's class), its
/// sizes checked against those the configuration sets; its layers and experts written into
/// `args` where the configuration leaves them to the class.
fn the_model(
    args: &mut BTreeMap<String, String>,
    model_config: Option<&Value>,
    model: Option<&str>,
    resolve: impl Fn(&str) -> Result<Arch, String>,
) -> Result<String, String> {
    let class_name = model_config.and_then(class).unwrap_or("not set");
    let name = match model {
        Some(m) => m.to_string(),
        None => MODEL_CLASSES
            .iter()
            .find(|(c, _)| *c == class_name)
            .map(|(_, preset)| preset.to_string())
            .ok_or_else(|| {
                format!(
                    "model.config is {class_name:?}, which is no stepcast preset (the presets \
                     are NeMo's {}): give the model with --model PRESET|ARCH.yaml|config.json",
                    MODEL_CLASSES.map(|(c, _)| c).join(", ")
                )
            })?,
    };
    let arch = resolve(&name)?;
    let moe = arch.moe.as_ref();
    let sizes = [
        ("num_layers", Some(arch.layers)),
        ("hidden_size", Some(arch.hidden)),
        ("ffn_hidden_size", Some(arch.ffn_hidden)),
        ("num_attention_heads", Some(arch.heads)),
        ("num_query_groups", Some(arch.kv_heads)),
        ("kv_channels", Some(arch.head_dim)),
        ("num_moe_experts", moe.map(|m| m.experts)),
        ("moe_router_topk", moe.map(|m| m.top_k)),
        ("moe_ffn_hidden_size", moe.map(|m| m.expert_ffn)),
    ];
    for (field, size) in sizes {
        let Some(set) = model_config
            .and_then(|c| c.get(field))
            .filter(|v| !v.is_null())
        else {
            continue;
        };
        if set.as_u64() != size {
            return Err(format!(
                "model.config sets {field} {} where {name} has {}: the run trained another \
                 model — give it with --model (an architecture file of its sizes)",
                python_repr(set).unwrap_or_default(),
                size.map_or("none".into(), |s| s.to_string()),
            ));
        }
    }
    args.insert("num_layers".into(), arch.layers.to_string());
    if let Some(m) = moe {
        args.entry("num_experts".into())
            .or_insert_with(|| m.experts.to_string());
    }
    Ok(name)
}

/// One log of the task as a runs-CSV row (framework `nemo`): the median step past the warm-up.
pub fn import(
    log: &MegatronLog,
    task: &Task,
    options: &ImportOptions,
) -> Result<ImportedRun, String> {
    if median_past_warmup(&log.intervals, options.warmup_iterations).is_none() {
        return Err(format!(
            "no step line past iteration {} ({} in all: the `… | train_step_timing in s: …` \
             lines NeMo's ProgressPrinter prints, or its progress bar's `train_step_timing in \
             s=…`): give the job's whole output, train longer, or give a smaller \
             --warmup-iterations",
            options.warmup_iterations,
            log.intervals.len()
        ));
    }
    let run_log = MegatronLog {
        args: task.args.clone(),
        intervals: log.intervals.clone(),
        ..MegatronLog::default()
    };
    let options = ImportOptions {
        model: Some(task.model.clone()),
        ..options.clone()
    };
    let mut run = megatron_log::import_noting(&run_log, &options, &task.reasons)?;
    run.columns.insert("framework", "nemo".into());
    Ok(run)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calibrate::megatron_log::tests::options;

    /// A NeMo-Run task as `yaml.safe_dump` writes it (keys sorted, each object's `_target_`):
    /// NeMo's llama3_8b pre-training recipe on 2 nodes of 8 GPUs, tp 2 with sequence
    /// parallelism and TP overlap, cp 2, the distributed optimizer.
    const TASK: &str = "\
_partial_: true
_target_: nemo.collections.llm.api.pretrain
data:
  _target_: nemo.collections.llm.gpt.data.mock.MockDataModule
  global_batch_size: 128
  micro_batch_size: 1
  seq_length: 8192
log:
  _target_: nemo.lightning.nemo_logger.NeMoLogger
  name: llama3_8b
model:
  _target_: nemo.collections.llm.gpt.model.llama.LlamaModel
  config:
    _target_: nemo.collections.llm.gpt.model.llama.Llama3Config8B
optim:
  _target_: nemo.lightning.pytorch.optim.megatron.MegatronOptimizerModule
  config:
    _target_: megatron.core.optimizer.optimizer_config.OptimizerConfig
    bf16: true
    clip_grad: 1.0
    fp16: false
    lr: 0.0003
    optimizer: adam
    use_distributed_optimizer: true
trainer:
  _target_: nemo.lightning.pytorch.trainer.Trainer
  accelerator: gpu
  callbacks:
  - _target_: nemo.utils.exp_manager.TimingCallback
  - _target_: nemo.lightning.pytorch.callbacks.megatron_comm_overlap.MegatronCommOverlapCallback
    tp_comm_overlap: true
  devices: 8
  log_every_n_steps: 10
  max_steps: 50
  num_nodes: 2
  plugins:
    _target_: nemo.lightning.pytorch.plugins.mixed_precision.MegatronMixedPrecision
    autocast_enabled: false
    params_dtype:
      _call_: false
      _target_: torch.bfloat16
    precision: bf16-mixed
  strategy:
    _target_: nemo.lightning.pytorch.strategies.megatron_strategy.MegatronStrategy
    context_parallel_size: 2
    ddp:
      _target_: megatron.core.distributed.distributed_data_parallel_config.\
                 DistributedDataParallelConfig
      check_for_nan_in_grad: true
      grad_reduce_in_fp32: true
      overlap_grad_reduce: true
      overlap_param_gather: true
    pipeline_dtype: null
    pipeline_model_parallel_size: 1
    sequence_parallel: true
    tensor_model_parallel_size: 2
    virtual_pipeline_model_parallel_size: null
";

    /// `TASK` with `line` (indented as in the file) put in place of the line `old`.
    fn with(old: &str, line: &str) -> String {
        assert!(TASK.contains(old), "{old}");
        TASK.replacen(old, line, 1)
    }

    /// The log of a 50-step run printing every 10 steps (the 10th is warm-up), with a
    /// validation line between.
    fn log() -> String {
        let steps = [
            (10, "2.1"),
            (20, "1.25"),
            (30, "1.3"),
            (40, "1.2"),
            (50, "1.28"),
        ];
        let mut text = String::from("[NeMo I 2025-06-01 12:00:00 nemo_logger:145] Experiments\n");
        for (step, seconds) in steps {
            text += &format!(
                "Training epoch 0, iteration {step}/50 | lr: 1.499e-06 | global_batch_size: 128 \
                 | global_step: {step} | reduced_train_loss: 11.03 | train_step_timing in s: \
                 {seconds} | consumed_samples: {}\n",
                step * 128
            );
            if step == 30 {
                text += "Validation: iteration 1/32\n";
            }
        }
        text
    }

    fn resolve(model: &str) -> Result<Arch, String> {
        if model == "mixtral-8x7b" {
            return Ok(crate::workload::presets::mixtral_8x7b());
        }
        Arch::resolve(model).map_err(|e| e.to_string())
    }

    fn read(yaml: &str, gpus: Option<u64>, model: Option<&str>) -> Result<Task, String> {
        task(yaml, gpus, model, resolve)
    }

    /// The row of `log()` under the task `yaml`.
    fn row(yaml: &str) -> BTreeMap<&'static str, String> {
        let task = read(yaml, None, None).unwrap();
        import(&parse(&log()), &task, &options()).unwrap().columns
    }

    #[test]
    fn a_task_and_its_log_are_the_megatron_core_run_they_launch() {
        // the settings, not the objects' classes or fiddle's marks
        let task = read(TASK, None, None).unwrap();
        assert!(
            !task.args.keys().any(|k| k.starts_with('_')),
            "{:?}",
            task.args
        );
        let c = row(TASK);
        for (column, value) in [
            ("framework", "nemo"),
            ("model", "llama3-8b"),
            ("family", "llama3-8b"),
            ("tp", "2"),
            ("pp", "1"),
            ("cp", "2"),
            ("dp", "4"),
            ("cp_comm", "p2p"),
            ("micro_batch", "1"),
            ("global_batch", "128"),
            ("seq_len", "8192"),
            ("dtype", "bf16"),
            ("zero", "1"),
            ("schedule", "1f1b"),
            ("sequence_parallel", "true"),
            ("tp_comm_overlap", "1"),
            ("overlap_grad_reduce", "true"),
            ("overlap_param_gather", "true"),
            ("grad_reduce_dtype", "fp32"),
            ("fp8_param_gather", "false"),
            ("measured_step_s", "1.265"),
            ("expressible", "true"),
        ] {
            assert_eq!(c[column], value, "{column}");
        }
        assert!(c["source"].starts_with("median of 4 logged intervals, iterations 20–50"));
        assert!(!c.contains_key("reason") && !c.contains_key("measured_memory_gib"));
    }

    #[test]
    fn step_lines_are_read_from_the_printer_and_the_progress_bar() {
        // the bar redraws itself after `\r`: each step once, the last drawing kept
        let bar = |step: u64, s: &str| {
            format!(
                "\rEpoch 0: {}%|██▌       | {step}/50 [00:30<00:45, reduced_train_loss=10.9, \
                 global_step={}.00, consumed_samples={}.0, train_step_timing in s={s}]",
                step * 2,
                step - 1,
                step * 128
            )
        };
        let text = [
            bar(11, "9.9"),
            bar(11, "1.5"),
            bar(12, "1.6e+00"),
            bar(13, "0"),
        ]
        .concat();
        assert_eq!(parse(&text).intervals, vec![(11, 1500.0), (12, 1600.0)]);
        // a printer line without a step count, a NaN, 0 s or no time is no step
        let odd = "Training epoch 0, iteration 20/50 | train_step_timing in s: nan\n\
                   Training epoch 0, iteration 25/50 | train_step_timing in s: 0\n\
                   Training epoch 0 | train_step_timing in s: 1.2\n\
                   Training epoch 0, iteration 30/50 | reduced_train_loss: 1.1\n";
        assert_eq!(parse(odd).intervals, vec![]);
        assert_eq!(parse(&log()).intervals.len(), 5);
    }

    #[test]
    fn a_log_with_no_step_past_the_warm_up_is_refused() {
        let task = read(TASK, None, None).unwrap();
        let only_warmup = log().lines().take(2).collect::<Vec<_>>().join("\n");
        for text in [only_warmup.as_str(), "no step here"] {
            let e = import(&parse(text), &task, &options()).unwrap_err();
            assert!(
                e.contains("past iteration 10") && e.contains("train_step_timing in s"),
                "{e}"
            );
        }
    }

    #[test]
    fn tp_overlap_needs_the_callback_and_sequence_parallelism() {
        let no_sp = with(
            "    sequence_parallel: true",
            "    sequence_parallel: false",
        );
        assert_eq!(row(&no_sp)["tp_comm_overlap"], "0");
        let no_tp = with(
            "    tensor_model_parallel_size: 2",
            "    tensor_model_parallel_size: 1",
        );
        assert_eq!(row(&no_tp)["tp_comm_overlap"], "0");
        // a degree of 0 is the file's fault, not a division by zero
        let zero = with(
            "    tensor_model_parallel_size: 2",
            "    tensor_model_parallel_size: 0",
        );
        assert!(read(&zero, None, None)
            .unwrap_err()
            .contains("not a multiple"));
        let not_asked = with("    tp_comm_overlap: true", "    tp_comm_overlap: false");
        assert_eq!(row(&not_asked)["tp_comm_overlap"], "0");
        // without the callback the ddp section's own overlap holds
        let no_callback = with(
            "  - _target_: nemo.lightning.pytorch.callbacks.megatron_comm_overlap.\
             MegatronCommOverlapCallback\n    tp_comm_overlap: true\n",
            "",
        );
        let c = row(&no_callback);
        assert_eq!(c["tp_comm_overlap"], "0");
        assert_eq!(c["overlap_grad_reduce"], "true");
        let no_ddp_overlap = no_callback.replace("      overlap_grad_reduce: true\n", "");
        assert_eq!(row(&no_ddp_overlap)["overlap_grad_reduce"], "false");
    }

    #[test]
    fn the_callback_overlaps_data_parallel_communication_of_the_distributed_optimizer() {
        let quiet_ddp = TASK
            .replace("      overlap_grad_reduce: true\n", "")
            .replace("      overlap_param_gather: true\n", "");
        let c = row(&quiet_ddp);
        assert_eq!(c["overlap_grad_reduce"], "true");
        assert_eq!(c["overlap_param_gather"], "true");
        // the user's choice in the callback wins
        let kept = quiet_ddp.replace(
            "    tp_comm_overlap: true\n",
            "    overlap_param_gather: false\n    tp_comm_overlap: true\n",
        );
        assert_eq!(row(&kept)["overlap_param_gather"], "false");
        assert_eq!(row(&kept)["overlap_grad_reduce"], "true");
        // one data-parallel rank (16 GPUs of tp 2 × cp 2 × pp 4, 32 layers): nothing to overlap
        let one_rank = quiet_ddp
            .replace(
                "    pipeline_model_parallel_size: 1",
                "    pipeline_model_parallel_size: 4",
            )
            .replace("  global_batch_size: 128", "  global_batch_size: 8");
        let c = row(&one_rank);
        assert_eq!((c["dp"].as_str(), c["pp"].as_str()), ("1", "4"));
        assert_eq!(c["overlap_grad_reduce"], "false");
        // without the distributed optimizer the callback leaves the ddp section's settings
        let plain = quiet_ddp.replace(
            "    use_distributed_optimizer: true",
            "    use_distributed_optimizer: false",
        );
        let c = row(&plain);
        assert_eq!(
            (c["zero"].as_str(), c["overlap_grad_reduce"].as_str()),
            ("0", "false")
        );
    }

    #[test]
    fn the_precision_plugin_decides_the_precision() {
        let plugin_line = "    precision: bf16-mixed";
        let fp8 = with(
            plugin_line,
            "    fp8: hybrid\n    fp8_params: true\n    fp8_recipe: delayed\n    \
             precision: bf16-mixed",
        );
        let c = row(&fp8);
        assert_eq!(
            (c["dtype"].as_str(), c["fp8_param_gather"].as_str()),
            ("fp8", "true")
        );
        let fp16 = with(
            plugin_line,
            "    grad_reduce_in_fp32: false\n    precision: 16-mixed",
        );
        let c = row(&fp16);
        assert_eq!(
            (c["dtype"].as_str(), c["grad_reduce_dtype"].as_str()),
            ("fp16", "fp16")
        );
        // the plugin reduces gradients in fp32 unless told otherwise, whatever ddp says
        let bf16_grads = with(
            plugin_line,
            "    grad_reduce_in_fp32: false\n    precision: bf16-mixed",
        )
        .replace("      grad_reduce_in_fp32: true\n", "");
        assert_eq!(row(&bf16_grads)["grad_reduce_dtype"], "bf16");
        let ddp_says_bf16 = TASK.replace(
            "      grad_reduce_in_fp32: true\n",
            "      grad_reduce_in_fp32: false\n",
        );
        assert_eq!(row(&ddp_says_bf16)["grad_reduce_dtype"], "fp32");
        // a model config's fp8 is overridden by the plugin's (none)
        let model_fp8 = with(
            "    _target_: nemo.collections.llm.gpt.model.llama.Llama3Config8B",
            "    _target_: nemo.collections.llm.gpt.model.llama.Llama3Config8B\n    fp8: hybrid",
        );
        assert_eq!(row(&model_fp8)["dtype"], "bf16");
        let odd = with(plugin_line, "    precision: 64-true");
        let e = read(&odd, None, None).unwrap_err();
        assert!(e.contains("trainer.plugins.precision \"64-true\""), "{e}");
        let none = TASK.replace("MegatronMixedPrecision", "MixedPrecision");
        let e = read(&none, None, None).unwrap_err();
        assert!(e.contains("0 MegatronMixedPrecision plugins"), "{e}");
    }

    #[test]
    fn the_gpus_are_the_trainers_devices_on_its_nodes_or_given() {
        assert_eq!(read(TASK, None, None).unwrap().args["world_size"], "16");
        assert_eq!(read(TASK, Some(16), None).unwrap().args["world_size"], "16");
        let e = read(TASK, Some(8), None).unwrap_err();
        assert!(e.contains("is 16 GPUs, --gpus 8"), "{e}");
        let one_node = with("  num_nodes: 2\n", "");
        assert_eq!(read(&one_node, None, None).unwrap().args["world_size"], "8");
        let auto = with("  devices: 8", "  devices: auto");
        let e = read(&auto, None, None).unwrap_err();
        assert!(
            e.contains("trainer.devices (auto)") && e.contains("--gpus"),
            "{e}"
        );
        assert_eq!(
            read(&auto, Some(32), None).unwrap().args["world_size"],
            "32"
        );
        let huge = with("  devices: 8", "  devices: 18446744073709551615");
        assert!(read(&huge, None, None).unwrap_err().contains("overflows"));
        let many = with("  devices: 8", "  devices: 1000000");
        assert!(read(&many, None, None)
            .unwrap_err()
            .contains("devices × num_nodes"));
    }

    #[test]
    fn the_model_is_its_config_class_preset_or_the_users_and_its_sizes_are_checked() {
        for (class, preset) in MODEL_CLASSES {
            let yaml = TASK.replace("Llama3Config8B", class);
            assert_eq!(read(&yaml, None, None).unwrap().model, preset, "{class}");
        }
        let other = TASK.replace("Llama3Config8B", "MistralConfig7B");
        let e = read(&other, None, None).unwrap_err();
        assert!(
            e.contains("\"MistralConfig7B\"") && e.contains("--model"),
            "{e}"
        );
        assert_eq!(
            read(&other, None, Some("llama2-7b")).unwrap().model,
            "llama2-7b"
        );
        // sizes the recipe set must be the model's
        let class_line = "    _target_: nemo.collections.llm.gpt.model.llama.Llama3Config8B";
        let same = with(
            class_line,
            &format!(
                "{class_line}\n    num_layers: 32\n    num_query_groups: 8\n    seq_length: 4096"
            ),
        );
        assert_eq!(read(&same, None, None).unwrap().args["num_layers"], "32");
        for (set, field) in [
            ("num_layers: 40", "num_layers 40 where llama3-8b has 32"),
            (
                "hidden_size: 5120",
                "hidden_size 5120 where llama3-8b has 4096",
            ),
            (
                "num_moe_experts: 8",
                "num_moe_experts 8 where llama3-8b has none",
            ),
        ] {
            let yaml = with(class_line, &format!("{class_line}\n    {set}"));
            let e = read(&yaml, None, None).unwrap_err();
            assert!(e.contains(field) && e.contains("--model"), "{e}");
        }
        // a mixture's experts are written where the file leaves them to the class
        let mixtral = read(&other, None, Some("mixtral-8x7b")).unwrap();
        assert_eq!(mixtral.args["num_experts"], "8");
        assert_eq!(mixtral.args["num_layers"], "32");
    }

    /// NeMo's llama3_8b `pretrain_recipe` as NeMo-Run saves it before any change (its
    /// source's defaults: cp 2, one node of 8 GPUs, the distributed optimizer, bf16_mixed()).
    const LLAMA3_8B_RECIPE: &str = "\
_partial_: true
_target_: nemo.collections.llm.api.pretrain
data:
  _target_: nemo.collections.llm.gpt.data.mock.MockDataModule
  global_batch_size: 512
  micro_batch_size: 1
  seq_length: 8192
model:
  _target_: nemo.collections.llm.gpt.model.llama.LlamaModel
  config:
    _target_: nemo.collections.llm.gpt.model.llama.Llama3Config8B
optim:
  _target_: nemo.lightning.pytorch.optim.megatron.MegatronOptimizerModule
  config:
    _target_: megatron.core.optimizer.optimizer_config.OptimizerConfig
    bf16: true
    use_distributed_optimizer: true
trainer:
  _target_: nemo.lightning.pytorch.trainer.Trainer
  callbacks:
  - _target_: nemo.utils.exp_manager.TimingCallback
  devices: 8
  num_nodes: 1
  plugins:
    _target_: nemo.lightning.pytorch.plugins.mixed_precision.MegatronMixedPrecision
    grad_reduce_in_fp32: true
    precision: bf16-mixed
  strategy:
    _target_: nemo.lightning.pytorch.strategies.megatron_strategy.MegatronStrategy
    context_parallel_size: 2
    pipeline_model_parallel_size: 1
    sequence_parallel: false
    tensor_model_parallel_size: 1
";

    /// A Python value of an exported recipe as NeMo-Run's YAML holds it: a config object as a
    /// mapping of its class and arguments, NeMo's precision factories as the plugin they
    /// configure, a torch dtype as a callable reference.
    fn yaml_of(expr: &str) -> Value {
        let expr = expr.trim();
        let plugin = |precision: &str, fp32_grads: bool, fp8: bool| {
            let mut text = format!(
                "_target_: nemo.lightning.pytorch.plugins.mixed_precision.MegatronMixedPrecision\n\
                 precision: {precision}\ngrad_reduce_in_fp32: {fp32_grads}\n"
            );
            if fp8 {
                text += "fp8: hybrid\nfp8_recipe: delayed\nfp8_param_gather: true\n";
            }
            serde_norway::from_str(&text).unwrap()
        };
        match expr {
            "bf16_mixed()" => return plugin("bf16-mixed", true, false),
            "fp16_mixed()" => return plugin("16-mixed", false, false),
            "bf16_with_fp8_mixed()" => return plugin("bf16-mixed", true, true),
            _ => {}
        }
        if let Some(dtype) = expr.strip_prefix("torch.") {
            return serde_norway::from_str(&format!("{{_target_: torch.{dtype}, _call_: false}}"))
                .unwrap();
        }
        if let Some(args) = expr
            .strip_prefix("run.Config(")
            .and_then(|e| e.strip_suffix(')'))
        {
            let mut parts = args.split(", ");
            let mut map = Mapping::new();
            map.insert("_target_".into(), parts.next().unwrap().into());
            for part in parts {
                let (key, value) = part.split_once('=').unwrap();
                map.insert(key.into(), yaml_of(value));
            }
            return Value::Mapping(map);
        }
        let python = expr.replace("True", "true").replace("False", "false");
        serde_norway::from_str(&python.replace("None", "null")).unwrap()
    }

    /// The task NeMo-Run saves for the recipe `export --format nemo` wrote: its assignments and
    /// appended callbacks applied onto `LLAMA3_8B_RECIPE`.
    fn task_of_export(recipe_py: &str) -> String {
        let mut root: Value = serde_norway::from_str(LLAMA3_8B_RECIPE).unwrap();
        for line in recipe_py.lines() {
            if let Some(call) = line.strip_prefix("recipe = llm.llama3_8b.pretrain_recipe(") {
                for (key, field) in [
                    ("num_nodes=", "num_nodes"),
                    ("num_gpus_per_node=", "devices"),
                ] {
                    let at = call.find(key).unwrap() + key.len();
                    let n: u64 = call[at..]
                        .split([',', ')'])
                        .next()
                        .unwrap()
                        .parse()
                        .unwrap();
                    root["trainer"][field] = n.into();
                }
            } else if let Some(callback) = line
                .strip_prefix("recipe.trainer.callbacks.append(")
                .and_then(|c| c.strip_suffix(')'))
            {
                let Value::Sequence(callbacks) = &mut root["trainer"]["callbacks"] else {
                    panic!("no callbacks");
                };
                callbacks.push(yaml_of(callback));
            } else if let Some((path, value)) = line
                .strip_prefix("recipe.")
                .and_then(|l| l.split_once(" = "))
            {
                let mut at = &mut root;
                let keys: Vec<&str> = path.split('.').collect();
                for key in &keys[..keys.len() - 1] {
                    at = at
                        .as_mapping_mut()
                        .unwrap()
                        .entry((*key).into())
                        .or_insert(Value::Mapping(Mapping::new()));
                }
                at[keys[keys.len() - 1]] = yaml_of(value);
            }
        }
        serde_norway::to_string(&root).unwrap()
    }

    /// What `stepcast export --format nemo` writes, run as NeMo-Run saves it, is read back as
    /// the layout it was made from: degrees, schedule, precision, gradient reduction and
    /// overlap, recompute, the context exchange and uneven pipeline ends.
    #[test]
    fn an_exported_recipe_is_imported_as_the_layout_it_came_from() {
        use crate::ops::Dtype;
        use crate::workload::{CpComm, Layout, ParallelSpec, Recompute, Schedule};
        let cluster = crate::hardware::dgx_h100_without_models();
        let arch = Arch::resolve("llama3-8b").unwrap();
        let spec = |tp, pp, dp| ParallelSpec {
            tp: Some(tp),
            pp: Some(pp),
            dp: Some(dp),
            micro_batch: Some(1),
            global_batch: Some(64),
            ..ParallelSpec::default()
        };
        let layouts = [
            // TP overlap and bf16 gradients, the data-parallel overlap off: what the plugin
            // and the callback would otherwise turn around
            ParallelSpec {
                sequence_parallel: Some(true),
                tp_comm_overlap: Some(true),
                grad_reduce_dtype: Some(Dtype::Bf16),
                overlap_grad_reduce: Some(false),
                overlap_param_gather: Some(false),
                ..spec(2, 2, 4)
            },
            // interleaved, fp8 without fp8 weights, full recompute, the all-gather exchange
            ParallelSpec {
                dtype: Some(Dtype::Fp8),
                fp8_param_gather: Some(false),
                schedule: Some(Schedule::Interleaved),
                vpp: Some(2),
                cp: Some(2),
                cp_comm: Some(CpComm::AllGather),
                recompute: Some(Recompute::Full),
                ..spec(1, 4, 2)
            },
            // fp16 reduced in fp32, selective recompute, no distributed optimizer
            ParallelSpec {
                dtype: Some(Dtype::Fp16),
                grad_reduce_dtype: Some(Dtype::Fp32),
                sequence_parallel: Some(true),
                recompute: Some(Recompute::Selective),
                zero: Some(0),
                ..spec(4, 1, 2)
            },
            // uneven pipeline ends
            ParallelSpec {
                pipeline_layout: Some("Et*6|t*10|t*10|t*6L".into()),
                ..spec(1, 4, 2)
            },
        ];
        for spec in layouts {
            let layout = Layout::new(&spec, &arch, &cluster).unwrap();
            let target = crate::export::Target {
                arch: &arch,
                layout: &layout,
                gpus_per_node: 8,
                headline: "test".into(),
            };
            let recipe = crate::export::export(crate::export::Framework::Nemo, &target)
                .unwrap()
                .text;
            let yaml = task_of_export(&recipe);
            let task = read(&yaml, None, None).unwrap_or_else(|e| panic!("{e}: {yaml}"));
            let c = import(&parse(&log()), &task, &options()).unwrap().columns;
            let l = &layout;
            let yes = |b: bool| if b { "true" } else { "false" }.to_string();
            let want = [
                ("tp", l.tp.to_string()),
                ("pp", l.pp.to_string()),
                ("dp", l.dp.to_string()),
                ("cp", l.cp.to_string()),
                ("vpp", l.vpp.to_string()),
                ("schedule", l.schedule.name().to_string()),
                ("micro_batch", l.micro_batch.to_string()),
                ("global_batch", l.global_batch.to_string()),
                ("seq_len", l.seq_len.to_string()),
                ("dtype", l.dtype.name().to_string()),
                ("zero", l.zero.to_string()),
                ("recompute", l.recompute.name().to_string()),
                ("sequence_parallel", yes(l.sequence_parallel)),
                (
                    "tp_comm_overlap",
                    if l.overlap.tp { "1" } else { "0" }.to_string(),
                ),
                ("overlap_grad_reduce", yes(l.overlap.grad_reduce)),
                ("overlap_param_gather", yes(l.overlap.param_gather)),
                ("grad_reduce_dtype", l.grad_reduce_dtype.name().to_string()),
                ("fp8_param_gather", yes(l.fp8_param_gather)),
                (
                    "pipeline_layout",
                    l.pipeline_layout.clone().unwrap_or_default(),
                ),
            ];
            for (column, value) in want {
                let got = c.get(column).cloned().unwrap_or_default();
                assert_eq!(got, value, "{column}: {recipe}\n{yaml}");
            }
            if l.cp > 1 {
                assert_eq!(c["cp_comm"], "all-gather", "{recipe}");
            }
        }
    }

    #[test]
    fn what_is_not_a_megatron_core_pre_training_task_is_refused_or_kept_not_costed() {
        let e = read("a: [", None, None).unwrap_err();
        assert!(e.starts_with("not YAML"), "{e}");
        let e = read("_target_: nemo_run.Script\n", None, None).unwrap_err();
        assert!(
            e.contains("no `trainer:` section") && e.contains("_config.yaml"),
            "{e}"
        );
        let fsdp = TASK.replace(
            "megatron_strategy.MegatronStrategy",
            "fsdp2_strategy.FSDP2Strategy",
        );
        let e = read(&fsdp, None, None).unwrap_err();
        assert!(e.contains("trainer.strategy is \"FSDP2Strategy\""), "{e}");
        // a layout Megatron-Core refuses is the file's fault, found before a log is read
        let odd_batch = TASK.replace("  global_batch_size: 128", "  global_batch_size: 130");
        let e = read(&odd_batch, None, None).unwrap_err();
        assert!(
            e.contains("global_batch_size 130 is not a multiple")
                && e.contains("check the configuration is the one this run was launched with")
                && !e.contains("log"),
            "{e}"
        );
        let lora =
            format!("{TASK}peft:\n  _target_: nemo.collections.llm.peft.lora.LoRA\n  dim: 8\n");
        let c = row(&lora);
        assert_eq!(c["expressible"], "false");
        assert!(
            c["reason"].contains("(LoRA: only the adapters train)"),
            "{}",
            c["reason"]
        );
        assert!(
            c["source"].contains("(not expressible: parameter-efficient"),
            "{}",
            c["source"]
        );
        // a reason of the run itself is kept beside the task's
        let both = lora.replace(
            "    pipeline_dtype: null\n",
            "    pipeline_dtype: null\n    num_distributed_optimizer_instances: 2\n",
        );
        let c = row(&both);
        assert!(
            c["reason"].starts_with("2 distributed-optimizer instances")
                && c["reason"].contains("; parameter-efficient"),
            "{}",
            c["reason"]
        );
        assert_eq!(
            c["source"].matches("not expressible").count(),
            1,
            "{}",
            c["source"]
        );
        let torch_ddp = TASK.replace(
            "    ddp:\n      _target_: megatron.core.distributed.distributed_data_parallel_config.\
             DistributedDataParallelConfig\n",
            "    ddp: pytorch\n    ddp_unused:\n",
        );
        assert!(row(&torch_ddp)["reason"].contains("PyTorch's DDP"));
    }
}

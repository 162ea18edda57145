//! The runs CSV: measured training steps, one per row, that `stepcast calibrate` fits the
//! runtime to and evaluates against. Columns (header required, any order, extra columns
//! ignored):
//!
//! | column | meaning |
//! |---|---|
//! | `set` | where the row comes from (`vtrain`, `dgxc`, …): errors are reported per set |
//! | `family` | model family: grouped cross-validation leaves one family out at a time |
//! | `label` | a readable name of the run |
//! | `cluster` | cluster file or built-in cluster name |
//! | `model` | preset, or architecture file (YAML / config.json) relative to the CSV |
//! | `tp`, `pp`, `dp`, `micro_batch`, `global_batch`, `seq_len` | the layout |
//! | `dtype` (bf16, fp16, fp8, fp32), `recompute` (none, selective, full), `zero` (0–3) | |
//! | `schedule` (1f1b, interleaved, …), `vpp`, `sequence_parallel` (true/false) | |
//! | `tp_comm_overlap` | 0 (off) or 1 (on, as the framework implements it) |
//! | `measured_step_s` | the measured step time, seconds |
//! | `expressible` | `false` for rows stepcast cannot express (kept so counts are honest) |
//! | `reason` | why not |
//!
//! Optional: `framework`, `cp` (context-parallel degree, default 1), `cp_comm` (p2p or
//! all-gather, default p2p), `ep` (expert-parallel degree, default 1), `pipeline_split`
//! (`embedding`, `loss` or `embedding+loss`: what counts as a layer when the layers are split
//! over pipeline chunks, as Megatron's `--account-for-…-in-pipeline-split`; default neither),
//! `etp` (expert tensor parallelism, default tp), `moe_a2a_overlap` (true/false: expert
//! all-to-alls beside the compute), `pipeline_layout` (Megatron-Core's layout string, e.g.
//! `Et|(tt|)*30mL`: what each chunk holds), `recompute_modules` (Megatron-Core's selective
//! recompute modules joined by `+`, e.g. `mla_up_proj+mlp`), `moe_dispatcher` (alltoall,
//! allgather, deepep, hybridep), `attention_kernel` (native or flash-attention-2: the kernel that
//! ran the attention, default native), `grad_reduce_dtype` (fp32, bf16 or fp16: what the
//! data-parallel gradients were reduced in, default fp32 for bf16 and fp8 runs, fp16 for fp16),
//! `fp8_param_gather` (true/false: fp8 weights kept and gathered in fp8), `fp8_library`
//! (transformer-engine or torchao), `cross_entropy`
//! (vocab-parallel, pytorch or fused: which loss the framework runs), `elementwise` (fused or eager:
//! PyTorch model code run without torch.compile, default fused), `cuda_graphs` (the parts of
//! each layer captured in CUDA graphs joined by `+`, e.g. `attn+moe_router+moe_preprocess`, or
//! `layer`; default none),
//! `measured_memory_gib` and `memory_scope` (the peak memory the run reported, GiB, and what
//! it counts: `allocator`, PyTorch's peak reserved memory as torchtitan prints it, or `device`,
//! everything on the GPU as nvidia-smi shows it; compared with the memory projection),
//! `time_scope` (what `measured_step_s` times: `step`, the whole training step, the default, or
//! `forward_backward`, the forward and backward passes with their gradient reduction and
//! without the optimizer step or the loop's per-step work, as NeuSight's labels), `source`.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::ops::Dtype;
use crate::workload::{ParallelSpec, Recompute, Schedule};

/// One measured run.
#[derive(Debug, Clone)]
pub struct Run {
    /// Line in the CSV (header = 1).
    pub line: usize,
    /// Source set.
    pub set: String,
    /// Model family (the cross-validation group).
    pub family: String,
    /// Readable name.
    pub label: String,
    /// Cluster file or built-in name.
    pub cluster: PathBuf,
    /// Preset name or architecture path (resolved against the CSV's directory).
    pub model: String,
    /// The layout as flags would give it.
    pub spec: ParallelSpec,
    /// Measured step, seconds.
    pub measured_s: f64,
    /// Why stepcast cannot express it (none: it can).
    pub not_expressible: Option<String>,
    /// The training framework that ran it (`calibrate --framework` fits one framework's runs).
    pub framework: Option<String>,
    /// The peak memory the run reported, if it did.
    pub measured_memory: Option<MeasuredMemory>,
    /// What `measured_s` times.
    pub time_scope: TimeScope,
}

/// What a measured step time covers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeScope {
    /// The whole training step: passes, gradient reduction, optimizer, the loop's own work.
    #[default]
    Step,
    /// The forward and backward passes with their gradient reduction (until the optimizer
    /// would start): what a benchmark that times `loss.backward()` and skips the update sees.
    ForwardBackward,
}

/// A run's reported peak memory.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MeasuredMemory {
    /// GiB.
    pub gib: f64,
    /// What the figure counts.
    pub scope: MemoryScope,
}

/// What a reported peak memory counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MemoryScope {
    /// PyTorch's caching allocator's peak reserved memory (`torch.cuda.max_memory_reserved`,
    /// what torchtitan prints): the framework's tensors and the allocator's slack, not the CUDA
    /// context or the communicators' buffers.
    Allocator,
    /// Everything on the GPU (nvidia-smi's used memory).
    Device,
}

#[derive(Deserialize)]
struct Row {
    set: String,
    family: String,
    label: String,
    cluster: String,
    model: String,
    tp: u64,
    pp: u64,
    dp: u64,
    #[serde(default)]
    cp: Option<u64>,
    #[serde(default)]
    cp_comm: String,
    #[serde(default)]
    attention_kernel: String,
    #[serde(default)]
    cross_entropy: String,
    #[serde(default)]
    elementwise: String,
    #[serde(default)]
    ep: Option<u64>,
    #[serde(default)]
    pipeline_split: String,
    #[serde(default)]
    etp: Option<u64>,
    #[serde(default)]
    moe_a2a_overlap: String,
    #[serde(default)]
    pipeline_layout: String,
    #[serde(default)]
    recompute_modules: String,
    #[serde(default)]
    cuda_graphs: String,
    #[serde(default)]
    moe_dispatcher: String,
    #[serde(default)]
    grad_reduce_dtype: String,
    #[serde(default)]
    fp8_param_gather: String,
    #[serde(default)]
    fp8_library: String,
    #[serde(default)]
    framework: String,
    micro_batch: u64,
    global_batch: u64,
    seq_len: u64,
    // the layout's settings: a column left out or empty takes `predict`'s default
    #[serde(default)]
    dtype: String,
    #[serde(default)]
    recompute: String,
    #[serde(default)]
    zero: Option<u8>,
    #[serde(default)]
    schedule: String,
    #[serde(default)]
    vpp: Option<u64>,
    #[serde(default)]
    sequence_parallel: String,
    #[serde(default)]
    tp_comm_overlap: Option<f64>,
    #[serde(default)]
    overlap_grad_reduce: String,
    #[serde(default)]
    overlap_param_gather: String,
    measured_step_s: f64,
    /// Empty or left out: expressible.
    #[serde(default)]
    expressible: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    measured_memory_gib: Option<f64>,
    #[serde(default)]
    memory_scope: String,
    #[serde(default)]
    time_scope: String,
}

/// A column's value parsed, or none where it is empty (the layout's default then holds).
fn optional<T: std::str::FromStr>(column: &str, v: &str) -> std::result::Result<Option<T>, String>
where
    T::Err: std::fmt::Display,
{
    match v.trim() {
        "" => Ok(None),
        v => v.parse().map(Some).map_err(|e| format!("{column}: {e}")),
    }
}

/// A true/false column, or none where it is empty (the layout's default then holds).
fn optional_flag(column: &str, v: &str) -> std::result::Result<Option<bool>, String> {
    match v.trim() {
        "" => Ok(None),
        v => flag(column, v).map(Some),
    }
}

fn flag(field: &str, v: &str) -> std::result::Result<bool, String> {
    match v.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" => Ok(true),
        "false" | "0" | "no" | "" => Ok(false),
        other => Err(format!("{field} = {other:?}: give true or false")),
    }
}

impl Row {
    fn into_run(self, line: usize, dir: &Path) -> std::result::Result<Run, String> {
        let dtype: Option<Dtype> = optional("dtype", &self.dtype)?;
        let recompute: Option<Recompute> = optional("recompute", &self.recompute)?;
        let schedule: Option<Schedule> = optional("schedule", &self.schedule)?;
        // 100 µs to a day: a step is never shorter than a few kernels nor longer than a day
        if !(1e-4..=86_400.0).contains(&self.measured_step_s) {
            return Err(format!(
                "measured_step_s = {} is not a step's time: give the measured step in seconds \
                 (0.0001 to 86400)",
                self.measured_step_s
            ));
        }
        if let Some(v) = self.tp_comm_overlap.filter(|v| !(0.0..=1.0).contains(v)) {
            return Err(format!("tp_comm_overlap = {v}: give 0 (off) or 1 (on)"));
        }
        let expressible =
            self.expressible.trim().is_empty() || flag("expressible", &self.expressible)?;
        let not_expressible = (!expressible).then(|| {
            if self.reason.is_empty() {
                "marked not expressible".into()
            } else {
                self.reason.clone()
            }
        });
        let (split_embedding, split_loss) = match self.pipeline_split.trim() {
            "" => (false, false),
            "embedding" => (true, false),
            "loss" => (false, true),
            "embedding+loss" => (true, true),
            other => {
                return Err(format!(
                    "pipeline_split = {other:?}: give embedding, loss or embedding+loss (or \
                     leave it empty)"
                ))
            }
        };
        let recompute_modules = joined("recompute_modules", &self.recompute_modules)?;
        let cuda_graphs = joined("cuda_graphs", &self.cuda_graphs)?;
        let cp_comm = optional("cp_comm", &self.cp_comm)?;
        let attention_kernel = optional("attention_kernel", &self.attention_kernel)?;
        let cross_entropy = optional("cross_entropy", &self.cross_entropy)?;
        let elementwise = optional("elementwise", &self.elementwise)?;
        let model = if self.model.contains('/')
            || self.model.ends_with(".yaml")
            || self.model.ends_with(".json")
        {
            dir.join(&self.model).display().to_string()
        } else {
            self.model.clone()
        };
        let cluster = {
            let p = Path::new(&self.cluster);
            if p.components().count() > 1 || self.cluster.ends_with(".yaml") {
                dir.join(p)
            } else {
                p.to_path_buf()
            }
        };
        let measured_memory = match (self.measured_memory_gib, self.memory_scope.trim()) {
            (None, "") => None,
            (None, _) => {
                return Err(
                    "memory_scope is given without measured_memory_gib: give both or \
                            neither"
                        .into(),
                )
            }
            (Some(gib), scope) => {
                crate::limits::check_range(
                    "this row",
                    "measured_memory_gib",
                    gib,
                    0.01..=4096.0,
                    "GiB",
                )?;
                let scope = match scope {
                    "allocator" => MemoryScope::Allocator,
                    "device" => MemoryScope::Device,
                    other => {
                        return Err(format!(
                            "memory_scope = {other:?}: give allocator (PyTorch's peak reserved \
                             memory) or device (everything on the GPU, as nvidia-smi shows)"
                        ))
                    }
                };
                Some(MeasuredMemory { gib, scope })
            }
        };
        let time_scope = match self.time_scope.trim() {
            "" | "step" => TimeScope::Step,
            "forward_backward" => TimeScope::ForwardBackward,
            other => {
                return Err(format!(
                    "time_scope = {other:?}: give step (the whole training step) or \
                     forward_backward (the passes and gradient reduction, no optimizer step)"
                ))
            }
        };
        let on = self.tp_comm_overlap.map(|v| v > 0.0);
        let framework = match self.framework.trim() {
            "" => None,
            f => Some(crate::hardware::framework_name(f).map_err(|e| format!("framework: {e}"))?),
        };
        Ok(Run {
            framework,
            time_scope,
            line,
            set: self.set,
            family: self.family,
            label: self.label,
            cluster,
            model,
            spec: ParallelSpec {
                tp: Some(self.tp),
                pp: Some(self.pp),
                dp: Some(self.dp),
                cp: self.cp,
                cp_comm,
                attention_kernel,
                cross_entropy,
                elementwise,
                ep: self.ep.filter(|&e| e > 1),
                micro_batch: Some(self.micro_batch),
                global_batch: Some(self.global_batch),
                seq_len: Some(self.seq_len),
                sequence_parallel: optional_flag("sequence_parallel", &self.sequence_parallel)?,
                recompute,
                zero: self.zero,
                dtype,
                schedule,
                vpp: self.vpp.filter(|&v| v > 1),
                tp_comm_overlap: on,
                overlap_grad_reduce: optional_flag(
                    "overlap_grad_reduce",
                    &self.overlap_grad_reduce,
                )?,
                overlap_param_gather: optional_flag(
                    "overlap_param_gather",
                    &self.overlap_param_gather,
                )?,
                etp: self.etp,
                moe_a2a_overlap: Some(flag("moe_a2a_overlap", &self.moe_a2a_overlap)?),
                account_for_embedding_in_pipeline_split: Some(split_embedding),
                account_for_loss_in_pipeline_split: Some(split_loss),
                pipeline_layout: Some(self.pipeline_layout.trim().to_string())
                    .filter(|l| !l.is_empty()),
                recompute_modules,
                cuda_graphs,
                moe_dispatcher: optional("moe_dispatcher", &self.moe_dispatcher)?,
                fp8_param_gather: Some(flag("fp8_param_gather", &self.fp8_param_gather)?),
                fp8_library: optional("fp8_library", &self.fp8_library)?,
                grad_reduce_dtype: optional("grad_reduce_dtype", &self.grad_reduce_dtype)?,
                ..Default::default()
            },
            measured_s: self.measured_step_s,
            not_expressible,
            measured_memory,
        })
    }
}

/// Reads a runs CSV; a bad row is an error naming the file, line and field.
pub fn load(path: &Path) -> Result<Vec<Run>> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut reader = csv::ReaderBuilder::new().from_reader(bytes.as_slice());
    let mut runs = Vec::new();
    for (i, row) in reader.deserialize::<Row>().enumerate() {
        let line = i + 2;
        let row = row.map_err(|e| {
            Error::bad_file(
                path,
                format!(
                    "line {line}: {e}: see the runs CSV columns in the README (\"Calibration\")"
                ),
            )
        })?;
        let run = row
            .into_run(line, dir)
            .map_err(|e| Error::bad_file(path, format!("line {line}: {e}")))?;
        runs.push(run);
    }
    if runs.is_empty() {
        return Err(Error::bad_file(
            path,
            "holds no runs: give one measured step per row under the header",
        ));
    }
    Ok(runs)
}

/// A column of names joined by `+` (or spaces): `None` when empty; a name that does not
/// parse names the column.
fn joined<T: std::str::FromStr>(
    column: &str,
    value: &str,
) -> std::result::Result<Option<Vec<T>>, String>
where
    T::Err: std::fmt::Display,
{
    let names: Vec<&str> = value.split([' ', '+']).filter(|m| !m.is_empty()).collect();
    if names.is_empty() {
        return Ok(None);
    }
    names
        .into_iter()
        .map(|m| m.parse().map_err(|e| format!("{column}: {e}")))
        .collect::<std::result::Result<Vec<T>, String>>()
        .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str =
        "set,family,label,cluster,model,tp,pp,dp,micro_batch,global_batch,seq_len,\
        dtype,recompute,zero,schedule,vpp,sequence_parallel,tp_comm_overlap,measured_step_s,\
        expressible,reason\n";

    fn write(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runs.csv");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn reads_a_run_and_resolves_files_against_the_csv() {
        let (dir, path) = write(&format!(
            "{HEADER}s,f,a run,dgx-h100,archs/m.yaml,2,1,4,1,32,4096,bf16,none,1,1f1b,1,true,1,12.5,true,\n"
        ));
        let runs = load(&path).unwrap();
        assert_eq!(
            runs[0].model,
            dir.path().join("archs/m.yaml").display().to_string()
        );
        assert_eq!(runs[0].cluster, PathBuf::from("dgx-h100"));
        assert_eq!(runs[0].spec.tp_comm_overlap, Some(true));
        assert_eq!(runs[0].measured_s, 12.5);
        assert!(runs[0].not_expressible.is_none());
    }

    /// A user's runs need only the layout's degrees, batch, sequence and measured step: the
    /// layout's other settings left out (or empty) take `predict`'s defaults, and the run is
    /// expressible; a value given is still checked.
    #[test]
    fn the_layout_settings_are_optional_and_default_as_predict_does() {
        let minimal = "set,family,label,cluster,model,tp,pp,dp,micro_batch,global_batch,seq_len,\
                       measured_step_s\n";
        let (_d, path) = write(&format!(
            "{minimal}mine,llama3-8b,run,dgx-h100,llama3-8b,2,1,4,1,64,8192,7.9\n"
        ));
        let runs = load(&path).unwrap();
        let spec = &runs[0].spec;
        assert!(runs[0].not_expressible.is_none());
        assert_eq!(
            (
                spec.dtype,
                spec.recompute,
                spec.zero,
                spec.schedule,
                spec.vpp
            ),
            (None, None, None, None, None)
        );
        assert_eq!((spec.sequence_parallel, spec.tp_comm_overlap), (None, None));
        assert_eq!(
            (spec.tp, spec.micro_batch, spec.seq_len),
            (Some(2), Some(1), Some(8192))
        );
        // the same columns present but empty read the same
        let (_d, path) = write(&format!(
            "{HEADER}s,f,a,dgx-h100,llama2-7b,1,1,8,1,8,4096,,,,,,,,1.0,,\n"
        ));
        let run = &load(&path).unwrap()[0];
        assert!(run.not_expressible.is_none() && run.spec.recompute.is_none());
        assert!(run.spec.zero.is_none() && run.spec.tp_comm_overlap.is_none());
        assert!(run.spec.overlap_grad_reduce.is_none() && run.spec.overlap_param_gather.is_none());
        // a run launched without Megatron-LM's overlap flags says so
        let (_d, path) = with_column("overlap_grad_reduce", &["false", "true", ""]);
        let got: Vec<_> = load(&path)
            .unwrap()
            .iter()
            .map(|r| r.spec.overlap_grad_reduce)
            .collect();
        assert_eq!(got, [Some(false), Some(true), None]);
        // and a value given is checked, naming its column
        let (_d, path) = write(
            &format!("{minimal}s,f,a,dgx-h100,llama2-7b,1,1,8,1,8,4096,1.0\n")
                .replace("seq_len,", "seq_len,recompute,")
                .replace(",4096,", ",4096,sometimes,"),
        );
        let e = load(&path).unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("recompute"), "{e}");
    }

    /// Runs with an extra `column` after `model` holding each of `values`, one row each.
    fn with_column(column: &str, values: &[&str]) -> (tempfile::TempDir, PathBuf) {
        let header = HEADER.replace(",model,", &format!(",model,{column},"));
        let rows: String = values
            .iter()
            .map(|v| {
                format!("s,f,a,dgx-h100,llama2-7b,{v},1,1,8,1,8,4096,bf16,none,1,1f1b,1,false,0,1.0,true,\n")
            })
            .collect();
        write(&format!("{header}{rows}"))
    }

    /// A value out of its range names its column and the line, and says what to give (the
    /// step's time: `files_are_found_beside_the_csv_and_a_step_takes_time`); a run
    /// marked not expressible without a reason says so.
    #[test]
    fn values_out_of_range_are_refused_with_their_column() {
        let row = |overlap: &str, expressible: &str| {
            format!(
                "{HEADER}s,f,a,dgx-h100,llama2-7b,1,1,8,1,8,4096,bf16,none,1,1f1b,1,false,\
                 {overlap},1.0,{expressible},\n"
            )
        };
        for (text, needle) in [
            (
                row("2", "true"),
                "tp_comm_overlap = 2: give 0 (off) or 1 (on)",
            ),
            (
                row("0", "maybe"),
                "expressible = \"maybe\": give true or false",
            ),
        ] {
            let (_d, path) = write(&text);
            let e = load(&path).unwrap_err().to_string();
            assert!(e.contains("line 2") && e.contains(needle), "{e}");
        }
        let (_d, path) = with_column("pipeline_split", &["stage"]);
        let e = load(&path).unwrap_err().to_string();
        assert!(
            e.contains("pipeline_split = \"stage\": give embedding"),
            "{e}"
        );
        let (_d, path) = write(&row("0", "false"));
        let runs = load(&path).unwrap();
        assert_eq!(
            runs[0].not_expressible.as_deref(),
            Some("marked not expressible")
        );
    }

    #[test]
    fn the_elementwise_column_is_optional_and_checked() {
        use crate::workload::Elementwise;
        let (_d, path) = with_column("elementwise", &["eager", "fused", ""]);
        let runs = load(&path).unwrap();
        let got: Vec<_> = runs.iter().map(|r| r.spec.elementwise).collect();
        assert_eq!(
            got,
            [Some(Elementwise::Eager), Some(Elementwise::Fused), None]
        );
        let (_d, path) = with_column("elementwise", &["compiled"]);
        let e = load(&path).unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("elementwise"), "{e}");
    }

    /// `cuda_graphs` joins scopes by `+` (or spaces); empty is none; a bad one names the column.
    #[test]
    fn the_cuda_graphs_column_is_optional_and_checked() {
        use crate::workload::CudaGraphScope::{Attn, Layer, MoePreprocess, MoeRouter};
        let (_d, path) = with_column(
            "cuda_graphs",
            &["attn+moe_router+moe_preprocess", "layer", ""],
        );
        let got: Vec<_> = load(&path)
            .unwrap()
            .into_iter()
            .map(|r| r.spec.cuda_graphs)
            .collect();
        assert_eq!(
            got,
            [
                Some(vec![Attn, MoeRouter, MoePreprocess]),
                Some(vec![Layer]),
                None
            ]
        );
        let (_d, path) = with_column("cuda_graphs", &["full"]);
        let e = load(&path).unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("cuda_graphs"), "{e}");
    }

    #[test]
    fn the_attention_kernel_column_is_optional_and_checked() {
        use crate::workload::AttentionKernel;
        let (_d, path) = with_column("attention_kernel", &["flash-attention-2", ""]);
        let runs = load(&path).unwrap();
        assert_eq!(
            runs[0].spec.attention_kernel,
            Some(AttentionKernel::FlashAttention2)
        );
        assert_eq!(runs[1].spec.attention_kernel, None);
        let (_d, path) = with_column("attention_kernel", &["fa9"]);
        let e = load(&path).unwrap_err().to_string();
        assert!(
            e.contains("line 2") && e.contains("attention_kernel"),
            "{e}"
        );
    }

    #[test]
    fn the_framework_column_is_optional_and_checked() {
        let (_d, path) = with_column("framework", &["Composer", ""]);
        let runs = load(&path).unwrap();
        assert_eq!(runs[0].framework.as_deref(), Some("composer"));
        assert_eq!(runs[1].framework, None);
        let (_d, path) = with_column("framework", &["a b"]);
        let e = load(&path).unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("framework"), "{e}");
    }

    #[test]
    fn the_time_scope_column_is_optional_and_checked() {
        let (_d, path) = with_column("time_scope", &["forward_backward", "step", ""]);
        let runs = load(&path).unwrap();
        let scopes: Vec<TimeScope> = runs.iter().map(|r| r.time_scope).collect();
        assert_eq!(
            scopes,
            [TimeScope::ForwardBackward, TimeScope::Step, TimeScope::Step]
        );
        let (_d, path) = with_column("time_scope", &["fwd"]);
        let e = load(&path).unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("time_scope"), "{e}");
    }

    #[test]
    fn the_memory_columns_are_optional_paired_and_bounded() {
        let (_d, path) = with_column(
            "measured_memory_gib,memory_scope",
            &["82.4,allocator", "76,device", ","],
        );
        let runs = load(&path).unwrap();
        assert_eq!(
            runs[0].measured_memory,
            Some(MeasuredMemory {
                gib: 82.4,
                scope: MemoryScope::Allocator
            })
        );
        assert_eq!(runs[1].measured_memory.unwrap().scope, MemoryScope::Device);
        assert_eq!(runs[2].measured_memory, None);
        for (bad, names) in [
            ("82.4,nvml", "memory_scope"),
            (",device", "memory_scope"),
            ("-3,device", "measured_memory_gib"),
            ("1e9,allocator", "measured_memory_gib"),
        ] {
            let (_d, path) = with_column("measured_memory_gib,memory_scope", &[bad]);
            let e = load(&path).unwrap_err().to_string();
            assert!(e.contains("line 2") && e.contains(names), "{bad}: {e}");
        }
    }

    #[test]
    fn a_bad_row_names_its_line_and_field() {
        let (_d, path) = write(&format!(
            "{HEADER}s,f,a,dgx-h100,llama2-7b,1,1,8,1,8,4096,bf17,none,1,1f1b,1,false,0,1.0,true,\n"
        ));
        let e = load(&path).unwrap_err().to_string();
        assert!(
            e.contains("line 2") && e.contains("dtype") && e.contains("bf17"),
            "{e}"
        );
        let (_d, path) = write(&format!(
            "{HEADER}s,f,a,dgx-h100,llama2-7b,1,1,8,1,8,4096,bf16,none,1,1f1b,1,false,0,-1,true,\n"
        ));
        let e = load(&path).unwrap_err().to_string();
        assert!(
            e.contains("measured_step_s") && e.contains("seconds"),
            "{e}"
        );
        let (_d, path) = write(HEADER);
        assert!(load(&path).unwrap_err().to_string().contains("no runs"));
    }

    /// The optional Megatron-Core columns NVIDIA's MoE presets need: a layout string, recompute
    /// modules joined by +, the token dispatcher; a value they do not take names the column.
    #[test]
    fn reads_the_layout_string_recompute_modules_and_dispatcher() {
        use crate::workload::{Dispatcher, RecomputeModule};
        let header = HEADER.replace(
            "expressible,reason",
            "expressible,reason,pipeline_layout,recompute_modules,moe_dispatcher",
        );
        let row = |layout: &str, modules: &str, dispatcher: &str| {
            format!(
                "{header}s,f,a,dgx-h100,m.yaml,2,8,64,1,8192,4096,fp8,selective,1,interleaved,4,\
                 true,1,25.3,true,,{layout},{modules},{dispatcher}\n"
            )
        };
        let (_d, path) = write(&row("Et|(tt|)*30mL", "mla_up_proj+mlp", "hybridep"));
        let spec = &load(&path).unwrap()[0].spec;
        assert_eq!(spec.pipeline_layout.as_deref(), Some("Et|(tt|)*30mL"));
        assert_eq!(
            spec.recompute_modules,
            Some(vec![RecomputeModule::MlaUpProj, RecomputeModule::Mlp])
        );
        assert_eq!(spec.moe_dispatcher, Some(Dispatcher::Hybridep));
        let (_d, path) = write(&row("", "", ""));
        let spec = &load(&path).unwrap()[0].spec;
        assert!(spec.pipeline_layout.is_none() && spec.recompute_modules.is_none());
        assert!(spec.moe_dispatcher.is_none());
        for (layout, modules, dispatcher, says) in [
            ("", "mla+mlp", "", "recompute_modules"),
            ("", "", "nccl", "moe_dispatcher"),
        ] {
            let (_d, path) = write(&row(layout, modules, dispatcher));
            let e = load(&path).unwrap_err().to_string();
            assert!(e.contains("line 2") && e.contains(says), "{e}");
        }
    }

    /// Every layout column reaches the setting it names: a row with each set away from its
    /// default reads as that whole layout; ep and vpp of 1 and a TP overlap of 0 read as
    /// "none" and "off".
    #[test]
    fn every_layout_column_reaches_its_setting() {
        use crate::workload::Fp8Library;
        let header = "set,family,label,cluster,model,tp,pp,dp,cp,ep,etp,moe_a2a_overlap,\
                      pipeline_split,micro_batch,global_batch,seq_len,dtype,recompute,zero,\
                      schedule,vpp,sequence_parallel,tp_comm_overlap,overlap_grad_reduce,\
                      overlap_param_gather,grad_reduce_dtype,fp8_param_gather,fp8_library,\
                      measured_step_s\n";
        let (_d, path) = write(&format!(
            "{header}s,f,a,dgx-h100,m.yaml,2,4,16,2,8,2,true,embedding+loss,1,512,8192,fp8,\
             selective,1,interleaved,4,true,1,true,true,fp32,true,transformer-engine,9.5\n\
             s,f,b,dgx-h100,m.yaml,2,4,16,1,1,1,false,loss,1,512,8192,bf16,full,0,1f1b,1,\
             false,0,false,false,bf16,false,torchao,9.5\n"
        ));
        let runs = load(&path).unwrap();
        let expected = ParallelSpec {
            tp: Some(2),
            pp: Some(4),
            dp: Some(16),
            cp: Some(2),
            ep: Some(8),
            etp: Some(2),
            moe_a2a_overlap: Some(true),
            account_for_embedding_in_pipeline_split: Some(true),
            account_for_loss_in_pipeline_split: Some(true),
            micro_batch: Some(1),
            global_batch: Some(512),
            seq_len: Some(8192),
            dtype: Some(Dtype::Fp8),
            recompute: Some(Recompute::Selective),
            zero: Some(1),
            schedule: Some(Schedule::Interleaved),
            vpp: Some(4),
            sequence_parallel: Some(true),
            tp_comm_overlap: Some(true),
            overlap_grad_reduce: Some(true),
            overlap_param_gather: Some(true),
            grad_reduce_dtype: Some(Dtype::Fp32),
            fp8_param_gather: Some(true),
            fp8_library: Some(Fp8Library::TransformerEngine),
            ..Default::default()
        };
        assert_eq!(runs[0].spec, expected);
        let off = ParallelSpec {
            cp: Some(1),
            ep: None,
            etp: Some(1),
            moe_a2a_overlap: Some(false),
            account_for_embedding_in_pipeline_split: Some(false),
            dtype: Some(Dtype::Bf16),
            recompute: Some(Recompute::Full),
            zero: Some(0),
            schedule: Some(Schedule::OneFOneB),
            vpp: None,
            sequence_parallel: Some(false),
            tp_comm_overlap: Some(false),
            overlap_grad_reduce: Some(false),
            overlap_param_gather: Some(false),
            grad_reduce_dtype: Some(Dtype::Bf16),
            fp8_param_gather: Some(false),
            fp8_library: Some(Fp8Library::Torchao),
            ..expected
        };
        assert_eq!(runs[1].spec, off);
    }

    /// A model or cluster named by a path (a directory in it, or a file's extension) is found
    /// beside the CSV; a bare name is a preset or a shipped cluster. A measured step must be
    /// a positive time.
    #[test]
    fn files_are_found_beside_the_csv_and_a_step_takes_time() {
        let row = |cluster: &str, model: &str, step: &str| {
            format!(
                "{HEADER}s,f,a,{cluster},{model},1,1,8,1,8,4096,bf16,none,1,1f1b,1,false,0,{step},\
                 true,\n"
            )
        };
        for (cluster, model) in [
            ("h.yaml", "m.json"),
            ("profiles/h", "archs/m"),
            ("dgx-h100", "llama2-7b"),
        ] {
            let (dir, path) = write(&row(cluster, model, "1.0"));
            let run = &load(&path).unwrap()[0];
            let beside = |name: &str| !name.contains('-');
            let want_model = if beside(model) {
                dir.path().join(model).display().to_string()
            } else {
                model.to_string()
            };
            let want_cluster = if beside(cluster) {
                dir.path().join(cluster)
            } else {
                PathBuf::from(cluster)
            };
            assert_eq!((&run.model, &run.cluster), (&want_model, &want_cluster));
        }
        for step in ["0", "-1", "inf", "NaN", "1e300", "0.00001"] {
            let (_d, path) = write(&row("dgx-h100", "llama2-7b", step));
            let e = load(&path).unwrap_err().to_string();
            assert!(e.contains("is not a step's time"), "{step}: {e}");
        }
    }
}

//! A cluster file (`hardware-profiles/*.yaml`), mapped one-to-one onto `ClusterSpec`: the GPU,
//! how many per node and how many nodes, the interconnect tiers, which trained models to use,
//! the software stack, and the efficiencies the analytic fallbacks assume.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{GpuSpec, NetworkSpec};
use super::{Reliability, Runtime, SoftwareStamp, Storage};
use crate::error::{Error, Result};

/// Which trained models predict this cluster's operators.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelsRef {
    /// Models directory, relative to the cluster file.
    pub dir: PathBuf,
    /// Whether the models' NCCL timings were measured on this cluster's network (else the
    /// learned collectives are not used and the analytic model answers).
    #[serde(default)]
    pub collectives: bool,
    /// A models directory (relative to the cluster file) whose NCCL timings were measured on a
    /// node like this cluster's, answering the collectives when `dir`'s were taken on another
    /// network: a DGX A100 costs its kernels from Perlmutter's training measurements and its
    /// collectives from NVIDIA's nccl-tests on a DGX A100. Excludes `collectives: true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collectives_from: Option<PathBuf>,
    /// Models of other GPUs (directories relative to the cluster file, nearest first) that
    /// answer the kernels these models lack, scaled from their GPU to this one by the ratio of
    /// the two rooflines (HBM bandwidth for memory-bound kernels, peak for compute-bound ones).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub transfer_from: Vec<PathBuf>,
    /// Which kernels transfer (`layernorm`, or one phase: `layernorm.fwd`); only those whose
    /// transfer between two measured GPUs beats the roofline (the README's transfer table).
    /// Empty: every kernel. The backward/forward ratio of fused attention is always read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub transfer_kinds: Vec<String>,
    /// The cluster (by name) whose calibration this one composes under while it has none of
    /// its own — found in `dir`'s `calibration.yaml`, else beside the named cluster's own models
    /// (`Cluster::lender_calibrations`): a cluster with no published runs borrows the runtime
    /// fitted where runs were measured on the same SM and software (its parameters — the
    /// host's cost per kernel, sustained clocks, contention, per-step work — belong to them,
    /// not to the network or the memory). A calibration fitted for this cluster wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration_from: Option<String>,
}

impl ModelsRef {
    /// Whether a kernel of this kind and phase may come from a transfer.
    pub fn transfers(&self, q: &crate::ops::OpQuery) -> bool {
        self.transfer_kinds.is_empty()
            || self.transfer_kinds.iter().any(|k| match transfer_kind(k) {
                (op, Some(phase)) => op == q.op.name() && phase == q.phase.name(),
                (op, None) => op == q.op.name(),
            })
    }
}

/// A `transfer_kinds` entry split into its operator and, when given, its phase
/// (`layernorm.fwd`).
fn transfer_kind(k: &str) -> (&str, Option<&str>) {
    k.split_once('.').map_or((k, None), |(o, p)| (o, Some(p)))
}

/// What fraction of peak the analytic fallbacks assume a real kernel or transfer reaches.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Efficiency {
    /// Fraction of peak FLOP/s a large GEMM reaches.
    pub compute: f64,
    /// Fraction of HBM bandwidth a streaming kernel reaches.
    pub memory: f64,
    /// Fixed cost of one kernel launch, microseconds.
    pub kernel_launch_us: f64,
    /// Fraction of link bandwidth NCCL reaches on large messages.
    pub network: f64,
}

impl Default for Efficiency {
    /// Typical achieved fractions: ~70 % of dense peak for large GEMMs and ~80 % of HBM
    /// bandwidth for streaming kernels on A100/H100, ~85 % of line rate for NCCL rings.
    fn default() -> Self {
        Efficiency {
            compute: 0.7,
            memory: 0.8,
            kernel_launch_us: 4.0,
            network: 0.85,
        }
    }
}

/// The best fractions of peak a real kernel reaches on this GPU: no estimate may be faster
/// than its roofline at these fractions (a learned model extrapolating, or trained on suspect
/// data, is raised to this floor and flagged).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Achievable {
    /// Of dense peak, a 16-bit (or tf32 / fp32) GEMM.
    pub gemm: f64,
    /// Of dense fp8 peak, an fp8 GEMM.
    pub gemm_fp8: f64,
    /// Of dense peak, fused attention forward.
    pub attention_fwd: f64,
    /// Of dense peak, fused attention backward.
    pub attention_bwd: f64,
    /// Of HBM bandwidth, a streaming kernel.
    pub memory: f64,
    /// Shortest a kernel runs on the device, µs.
    pub min_kernel_us: f64,
    /// Of dense peak, FlashAttention-2's forward where it is slower than the attention the
    /// models learned (Hopper: FA2 does not use the warpgroup instructions): attention calls
    /// run as FlashAttention-2 (`--attention-kernel flash-attention-2`) are costed no faster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flash_attention_2_fwd: Option<f64>,
    /// The same for its backward.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flash_attention_2_bwd: Option<f64>,
    /// The share of the aligned speed a tensor-core GEMM keeps when its operands' rows are
    /// only 2-byte aligned (a 16-bit matrix with an odd dimension); see `analytic::alignment`.
    /// Default `GEMM_UNALIGNED`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemm_unaligned: Option<f64>,
}

/// What a GEMM on an odd 16-bit dimension keeps of the aligned speed when the cluster file
/// does not say: half. Karpathy measured nanoGPT (GPT-2 124M, A100, bf16) about 25 % faster
/// with the vocabulary padded from 50,257 to 50,304 (Feb 2023, "goes down a different kernel
/// path with much higher occupancy"); the head's three GEMMs are about a quarter of that
/// step, so unpadded they ran at about half speed.
pub const GEMM_UNALIGNED: f64 = 0.5;

impl Default for Achievable {
    /// Upper ends of what published kernels reach (cluster files state their GPU's, with
    /// sources): cuBLAS ≈ 0.9 of dense peak on the largest GEMMs, FlashAttention-2 ≈ 0.73
    /// forward and ≈ 0.6 backward on A100 (Dao 2023), STREAM-like kernels ≈ 0.9 of HBM.
    fn default() -> Self {
        Achievable {
            gemm: 0.9,
            gemm_fp8: 0.8,
            attention_fwd: 0.75,
            attention_bwd: 0.65,
            memory: 0.92,
            min_kernel_us: 2.0,
            flash_attention_2_fwd: None,
            flash_attention_2_bwd: None,
            gemm_unaligned: None,
        }
    }
}

impl Achievable {
    /// The fraction of dense peak an operator call's compute reaches at best.
    pub fn compute_fraction(&self, q: &crate::ops::OpQuery) -> f64 {
        use crate::ops::{Dtype, OpKind, Phase};
        match (q.op, q.phase, q.dtype) {
            (OpKind::FlashAttention, Phase::Bwd, _) => self.attention_bwd,
            (OpKind::FlashAttention, _, _) => self.attention_fwd,
            (_, _, Dtype::Fp8) => self.gemm_fp8,
            _ => self.gemm,
        }
    }

    /// See `gemm_unaligned`.
    pub fn gemm_unaligned(&self) -> f64 {
        self.gemm_unaligned.unwrap_or(GEMM_UNALIGNED)
    }
}

/// Memory the framework and communicators take on every GPU besides the model (issue-level
/// detail lives in the memory projection).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryOverheads {
    /// CUDA context, allocator fragmentation and framework buffers, GiB.
    pub framework_gib: f64,
    /// NCCL communicator buffers per process group, GiB.
    pub communicator_gib: f64,
}

impl Default for MemoryOverheads {
    fn default() -> Self {
        MemoryOverheads {
            framework_gib: 2.0,
            communicator_gib: 0.5,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub gpu: GpuSpec,
    pub gpus_per_node: u32,
    /// Nodes available to one job.
    pub nodes: u32,
    pub network: NetworkSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<ModelsRef>,
    #[serde(default)]
    pub software: SoftwareStamp,
    #[serde(default)]
    pub efficiency: Efficiency,
    #[serde(default)]
    pub memory: MemoryOverheads,
    /// The best fractions of peak kernels reach: the floor under every estimate.
    #[serde(default)]
    pub achievable: Achievable,
    /// How a training step differs from its kernels timed alone (defaults unless stated;
    /// a models directory's `calibration.yaml` takes precedence).
    #[serde(default)]
    pub runtime: Runtime,
    /// Failure rate and recovery times for run-time projections (default: MoFa's figures).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reliability: Option<Reliability>,
    /// Checkpoint write bandwidth (default: 2 GB/s per node, 100 GB/s in all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<Storage>,
}

/// A loaded cluster file with its models directory resolved.
#[derive(Debug, Clone)]
pub struct Cluster {
    pub path: PathBuf,
    pub spec: ClusterSpec,
    /// `models.dir` resolved against the file's directory.
    pub models_dir: Option<PathBuf>,
    /// For a built-in cluster, the built-in models its `models.dir` names.
    pub builtin_models: Option<&'static str>,
    /// `models.transfer_from` resolved against the file's directory (for a built-in cluster:
    /// the built-in models they name).
    pub transfer_dirs: Vec<PathBuf>,
    /// `models.collectives_from` resolved as `transfer_dirs` are.
    pub collectives_dir: Option<PathBuf>,
    /// A digest of the YAML it was read from (see `provenance::digest`).
    pub digest: Option<String>,
}

impl Cluster {
    /// A cluster file, or a built-in cluster by name (`dgx-h100`) when no such file exists.
    pub fn load(path: &Path) -> Result<Cluster> {
        if !path.is_file() {
            let name = path.to_string_lossy();
            if let Some(yaml) = crate::assets::cluster(&name) {
                return Self::builtin(&name, yaml);
            }
            return Err(Error::bad_file(
                path,
                format!(
                    "cluster file not found: give the path of one (e.g. \
                     hardware-profiles/dgx-h100.yaml) or a built-in cluster by name ({})",
                    crate::assets::cluster_names().join(", ")
                ),
            ));
        }
        let text = crate::fsutil::read_to_string(path)?;
        let spec = ClusterSpec::parse(path, &text)?;
        let base = path.parent().unwrap_or(Path::new("."));
        let models_dir = spec.models.as_ref().map(|m| lexical_join(base, &m.dir));
        let transfer_dirs = spec
            .models
            .iter()
            .flat_map(|m| &m.transfer_from)
            .map(|d| lexical_join(base, d))
            .collect();
        let collectives_dir = spec
            .models
            .as_ref()
            .and_then(|m| m.collectives_from.as_ref())
            .map(|d| lexical_join(base, d));
        Ok(Cluster {
            transfer_dirs,
            collectives_dir,
            path: path.to_path_buf(),
            spec,
            models_dir,
            builtin_models: None,
            digest: Some(crate::provenance::digest(text.as_bytes())),
        })
    }

    /// A built-in cluster: its models are the built-in ones its `models.dir` names.
    fn builtin(name: &str, yaml: &str) -> Result<Cluster> {
        let path = PathBuf::from(format!("<built-in {name}>"));
        let spec = ClusterSpec::parse(&path, yaml)?;
        let builtin_models = spec.models.as_ref().and_then(|m| {
            let set = m.dir.file_name()?.to_string_lossy().into_owned();
            crate::assets::MODELS
                .iter()
                .find(|(n, _)| *n == set)
                .map(|(n, _)| *n)
        });
        let builtin_dir = |d: &PathBuf| {
            let name = d.file_name()?.to_string_lossy().into_owned();
            crate::assets::models(&name)?;
            Some(PathBuf::from(format!("<built-in models/{name}>")))
        };
        let transfer_dirs = spec
            .models
            .iter()
            .flat_map(|m| &m.transfer_from)
            .filter_map(builtin_dir)
            .collect();
        let collectives_dir = spec
            .models
            .as_ref()
            .and_then(|m| m.collectives_from.as_ref())
            .and_then(builtin_dir);
        Ok(Cluster {
            transfer_dirs,
            collectives_dir,
            path,
            spec,
            models_dir: None,
            builtin_models,
            digest: Some(crate::provenance::digest(yaml.as_bytes())),
        })
    }

    /// The calibrations (`calibration.yaml`) beside the models of the cluster this file's
    /// `models.calibration_from` names — the file of that name beside this one, else the
    /// built-in cluster — so that a cluster of other models (an H200 beside the H100 whose
    /// runs were measured) can borrow the runtime fitted there. None: the file borrows
    /// nothing, or the lender's models hold no calibrations.
    pub fn lender_calibrations(&self) -> Result<Option<super::Calibrations>> {
        let Some(from) = self
            .spec
            .models
            .as_ref()
            .and_then(|m| m.calibration_from.as_ref())
        else {
            return Ok(None);
        };
        let beside = self
            .path
            .is_file()
            .then(|| self.path.with_file_name(format!("{from}.yaml")));
        let lender = match beside.filter(|p| p.is_file()) {
            Some(file) => Cluster::load(&file)?,
            None => match crate::assets::cluster(from) {
                Some(yaml) => Self::builtin(from, yaml)?,
                None => {
                    return Err(Error::Invalid(format!(
                        "no cluster '{from}' beside {} nor built in ({})",
                        self.path.display(),
                        crate::assets::cluster_names().join(", ")
                    )))
                }
            },
        };
        if let Some(name) = lender.builtin_models {
            return match crate::assets::calibration(name) {
                Some(yaml) => {
                    let path = PathBuf::from(format!("<built-in models/{name}>/calibration.yaml"));
                    super::Calibrations::parse(&path, yaml).map(Some)
                }
                None => Ok(None),
            };
        }
        let Some(path) = lender.models_dir.map(|d| d.join("calibration.yaml")) else {
            return Ok(None);
        };
        if !path.is_file() {
            return Ok(None);
        }
        let text = crate::fsutil::read_to_string(&path)?;
        super::Calibrations::parse(&path, &text).map(Some)
    }

    /// The same cluster with `nodes` nodes for this job (`--nodes`), checked as the file's
    /// count is.
    pub fn with_nodes(mut self, nodes: i64) -> Result<Cluster> {
        if !(1..=1_000_000).contains(&nodes) {
            return Err(Error::Invalid(format!(
                "--nodes {nodes}: give between 1 and 1000000 nodes (the job's share of {})",
                self.spec.name
            )));
        }
        self.spec.nodes = nodes as u32;
        Ok(self)
    }

    pub fn total_gpus(&self) -> u64 {
        self.spec.gpus_per_node as u64 * self.spec.nodes as u64
    }
}

/// The shipped DGX H100 cluster file without its models (so every kernel cost comes from the
/// roofline and every collective from the analytic model): the tests' cluster.
#[cfg(test)]
pub(crate) fn dgx_h100_without_models() -> Cluster {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut c = Cluster::load(&dir.join("hardware-profiles/dgx-h100.yaml")).expect("shipped");
    c.models_dir = None;
    c
}

/// `base/rel` with `..` and `.` resolved on the text (no file-system access), so messages show
/// `models/perlmutter`, not `hardware-profiles/../models/perlmutter`.
fn lexical_join(base: &Path, rel: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in base.join(rel).components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => match out.components().next_back() {
                Some(Component::Normal(_)) => {
                    out.pop();
                }
                Some(Component::RootDir) => {} // "/.." is "/"
                _ => out.push(".."),
            },
            other => out.push(other.as_os_str()),
        }
    }
    out
}

impl ClusterSpec {
    /// Parses and checks the text of a cluster file that came from `path`.
    pub fn parse(path: &Path, text: &str) -> Result<ClusterSpec> {
        let spec: ClusterSpec = crate::fsutil::parse_yaml(path, text).map_err(|e: Error| {
            e.hint("compare with hardware-profiles/dgx-h100.yaml, which sets every field")
        })?;
        spec.validate(&path.display().to_string())
            .map_err(Error::Invalid)?;
        Ok(spec)
    }

    /// Checks every number against its physical range; `what` names the file.
    pub fn validate(&self, what: &str) -> std::result::Result<(), String> {
        use crate::limits::check_range;
        self.gpu.validate(what)?;
        self.network.validate(what)?;
        check_range(
            what,
            "gpus_per_node",
            self.gpus_per_node as f64,
            1.0..=1024.0,
            "GPUs",
        )?;
        check_range(what, "nodes", self.nodes as f64, 1.0..=1_000_000.0, "nodes")?;
        let e = &self.efficiency;
        for (field, v) in [
            ("efficiency.compute", e.compute),
            ("efficiency.memory", e.memory),
            ("efficiency.network", e.network),
        ] {
            check_range(what, field, v, 0.01..=1.0, "of peak")?;
        }
        check_range(
            what,
            "efficiency.kernel_launch_us",
            e.kernel_launch_us,
            0.0..=10_000.0,
            "µs",
        )?;
        for (field, v) in [
            ("memory.framework_gib", self.memory.framework_gib),
            ("memory.communicator_gib", self.memory.communicator_gib),
        ] {
            check_range(what, field, v, 0.0..=10_000.0, "GiB")?;
        }
        if let Some(m) = &self.models {
            if m.collectives && m.collectives_from.is_some() {
                return Err(format!(
                    "{what}: models.collectives is true and models.collectives_from is set: \
                     both say where the collectives come from; keep one"
                ));
            }
            if let Some(from) = &m.calibration_from {
                // a name, not a path: the lender is the file of that name beside this one
                let name_like = !from.starts_with('.')
                    && from
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
                if from.trim().is_empty() || from == &self.name || !name_like {
                    return Err(format!(
                        "{what}: models.calibration_from is '{from}': give the name of another \
                         cluster (a file beside this one or a built-in cluster, e.g. dgx-a100) \
                         whose calibration this one borrows, or remove the line"
                    ));
                }
            }
            for k in &m.transfer_kinds {
                let (op, phase) = transfer_kind(k);
                let known_op = op.parse::<crate::ops::OpKind>().is_ok();
                let known_phase = phase.is_none_or(|p| p.parse::<crate::ops::Phase>().is_ok());
                if !known_op || !known_phase {
                    return Err(format!(
                        "{what}: models.transfer_kinds holds '{k}': give operator kinds \
                         (layernorm, rope, …), optionally with a phase (layernorm.fwd)"
                    ));
                }
            }
        }
        let a = &self.achievable;
        for (field, v) in [
            ("achievable.gemm", a.gemm),
            ("achievable.gemm_fp8", a.gemm_fp8),
            ("achievable.attention_fwd", a.attention_fwd),
            ("achievable.attention_bwd", a.attention_bwd),
            ("achievable.memory", a.memory),
        ] {
            check_range(what, field, v, 0.05..=1.0, "of peak")?;
        }
        for (field, v) in [
            ("achievable.flash_attention_2_fwd", a.flash_attention_2_fwd),
            ("achievable.flash_attention_2_bwd", a.flash_attention_2_bwd),
        ] {
            if let Some(v) = v {
                check_range(what, field, v, 0.05..=1.0, "of peak")?;
            }
        }
        if let Some(v) = a.gemm_unaligned {
            let unit = "of the aligned GEMM's speed";
            check_range(what, "achievable.gemm_unaligned", v, 0.05..=1.0, unit)?;
        }
        check_range(
            what,
            "achievable.min_kernel_us",
            a.min_kernel_us,
            0.0..=1000.0,
            "µs",
        )?;
        self.runtime.validate(what)?;
        if let Some(r) = &self.reliability {
            r.validate(&format!("{what}: reliability"))?;
        }
        if let Some(s) = &self.storage {
            s.validate(&format!("{what}: storage"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cluster borrows the calibration fitted for the cluster its file names from beside
    /// that cluster's own models: the DGX H200 (its own H200 models, never calibrated) the DGX
    /// H100's, from the file beside it or built in; a cluster that borrows nothing gets none.
    #[test]
    fn a_lender_is_found_beside_its_own_models() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        for h200 in [
            Cluster::load(&dir.join("hardware-profiles/dgx-h200.yaml")).expect("shipped"),
            Cluster::load(Path::new("dgx-h200")).expect("built in"),
        ] {
            let lent = h200.lender_calibrations().expect("readable").expect("some");
            assert!(lent.of("dgx-h100").is_some(), "{}", h200.path.display());
            assert!(lent.of("dgx-h200").is_none());
        }
        let h100 = Cluster::load(&dir.join("hardware-profiles/dgx-h100.yaml")).expect("shipped");
        assert!(h100.lender_calibrations().expect("readable").is_none());
        // a lender file beside the borrower wins over the built-in cluster of that name, and a
        // lender whose models hold no calibration lends nothing
        let tmp = tempfile::tempdir().unwrap();
        let text = std::fs::read_to_string(dir.join("hardware-profiles/dgx-h200.yaml")).unwrap();
        let models = dir.join("models");
        let text = text.replace("../models", &models.to_string_lossy());
        std::fs::write(tmp.path().join("borrower.yaml"), &text).unwrap();
        std::fs::write(
            tmp.path().join("dgx-h100.yaml"),
            text.replace("name: dgx-h200", "name: dgx-h100")
                .replace("  calibration_from: dgx-h100\n", ""),
        )
        .unwrap();
        let borrower = Cluster::load(&tmp.path().join("borrower.yaml")).unwrap();
        assert!(borrower.lender_calibrations().unwrap().is_none());
    }

    /// A call of `op`, `phase`, `dtype` (its shape matters to none of the rules below).
    fn call(op: &str, phase: &str, dtype: &str) -> crate::ops::OpQuery {
        use crate::ops::{OpQuery, Shape, TokenShape};
        OpQuery {
            op: op.parse().unwrap(),
            phase: phase.parse().unwrap(),
            dtype: dtype.parse().unwrap(),
            role: None,
            shape: Shape::Tokens(TokenShape {
                batch: 1,
                seq: 8,
                width: 8,
            }),
        }
    }

    /// `transfer_kinds` names kinds, or a kind's phase; none named: every kind transfers.
    #[test]
    fn transfer_kinds_select_kinds_and_phases() {
        let models = |kinds: &str| -> ModelsRef {
            serde_norway::from_str(&format!("dir: m\ntransfer_kinds: {kinds}")).unwrap()
        };
        let some = models("[layernorm.fwd, gelu]");
        for (op, phase, transfers) in [
            ("layernorm", "fwd", true),
            ("layernorm", "bwd", false),
            ("gelu", "bwd", true),
            ("rope", "fwd", false),
        ] {
            let q = call(op, phase, "bf16");
            assert_eq!(some.transfers(&q), transfers, "{op}.{phase}");
            assert!(models("[]").transfers(&q), "{op}.{phase}");
        }
    }

    /// Attention's fractions by phase whatever its type, then fp8's, then the GEMM's; the
    /// unaligned GEMM's penalty defaults to `GEMM_UNALIGNED`.
    #[test]
    fn each_call_reaches_its_own_fraction_of_peak() {
        let a = Achievable {
            gemm: 0.9,
            gemm_unaligned: Some(0.7),
            ..Achievable::default()
        };
        assert_eq!(
            [a.gemm_fp8, a.attention_fwd, a.attention_bwd],
            [0.8, 0.75, 0.65]
        );
        for (op, phase, dtype, fraction) in [
            ("flash_attention", "bwd", "fp8", a.attention_bwd),
            ("flash_attention", "fwd", "fp8", a.attention_fwd),
            ("gemm", "fwd", "fp8", a.gemm_fp8),
            ("gemm", "bwd", "bf16", a.gemm),
        ] {
            let q = call(op, phase, dtype);
            assert_eq!(a.compute_fraction(&q), fraction, "{op} {phase} {dtype}");
        }
        assert_eq!(a.gemm_unaligned(), 0.7);
        assert_eq!(Achievable::default().gemm_unaligned(), GEMM_UNALIGNED);
    }

    /// `--nodes` gives the job's share of the cluster, from 1 to a million nodes.
    #[test]
    fn a_job_takes_its_nodes_of_the_cluster() {
        let c = dgx_h100_without_models();
        assert_eq!(c.clone().with_nodes(4).unwrap().total_gpus(), 32);
        assert_eq!(c.clone().with_nodes(1).unwrap().total_gpus(), 8);
        for bad in [0, -1, 1_000_001] {
            let e = c.clone().with_nodes(bad).unwrap_err().to_string();
            assert!(e.contains(&format!("--nodes {bad}: give between 1")), "{e}");
        }
    }

    /// `calibration_from` names another cluster (not a path, not this one); `transfer_kinds`
    /// known kinds and phases.
    #[test]
    fn borrowed_calibrations_and_transfer_kinds_are_checked() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        let path = dir.join("hardware-profiles/dgx-h200.yaml");
        let text = std::fs::read_to_string(&path).unwrap();
        let lender = "  calibration_from: dgx-h100\n";
        assert!(text.contains(lender));
        let with = |line: &str| text.replace(lender, line);
        for from in ["../dgx-h100", "a/b", "dgx-h200", "' '", "dgx h100"] {
            let e = ClusterSpec::parse(&path, &with(&format!("  calibration_from: {from}\n")))
                .unwrap_err()
                .to_string();
            assert!(e.contains("models.calibration_from is"), "{from}: {e}");
        }
        assert!(ClusterSpec::parse(&path, &with("  calibration_from: dgx_a100.v2\n")).is_ok());
        let kinds = "  transfer_kinds: [";
        assert!(text.contains(kinds));
        for kind in ["layernorm.sideways", "warp", "warp.fwd"] {
            let listed = text.replace(kinds, &format!("{kinds}{kind}, "));
            let e = ClusterSpec::parse(&path, &listed).unwrap_err().to_string();
            assert!(e.contains(&format!("transfer_kinds holds '{kind}'")), "{e}");
        }
        let listed = text.replace(kinds, &format!("{kinds}rope.bwd, "));
        assert!(ClusterSpec::parse(&path, &listed).is_ok());
    }

    #[test]
    fn the_shipped_dgx_a100_takes_its_collectives_from_a_dgx_a100() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        let c = Cluster::load(&dir.join("hardware-profiles/dgx-a100.yaml")).expect("shipped");
        let want = dir.join("models/a100-aiconfigurator");
        assert_eq!(c.collectives_dir.as_deref(), Some(want.as_path()));
        let builtin = Cluster::load(Path::new("dgx-a100")).expect("built in");
        assert_eq!(
            builtin.collectives_dir,
            Some(PathBuf::from("<built-in models/a100-aiconfigurator>"))
        );
    }

    #[test]
    fn collectives_from_two_places_are_refused() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        let path = dir.join("hardware-profiles/dgx-a100.yaml");
        let text = std::fs::read_to_string(&path).unwrap();
        let both = text.replace(
            "  collectives_from: ../models/a100-aiconfigurator",
            "  collectives_from: ../models/a100-aiconfigurator\n  collectives: true",
        );
        assert_ne!(both, text);
        let e = ClusterSpec::parse(&path, &both).unwrap_err().to_string();
        assert!(
            e.contains("models.collectives is true and models.collectives_from is set"),
            "{e}"
        );
    }

    #[test]
    fn models_dir_is_resolved_against_the_file() {
        assert_eq!(
            lexical_join(
                Path::new("hardware-profiles"),
                Path::new("../models/perlmutter")
            ),
            PathBuf::from("models/perlmutter")
        );
        assert_eq!(
            lexical_join(Path::new("/a/b"), Path::new("../../../c")),
            PathBuf::from("/c")
        );
        assert_eq!(
            lexical_join(Path::new(""), Path::new("../m")),
            PathBuf::from("../m")
        );
    }

    #[test]
    fn every_shipped_cluster_file_loads_and_agrees_with_the_gpu_catalogue() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("hardware-profiles");
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let c = Cluster::load(&path).unwrap();
            if let Some(known) = GpuSpec::builtin(&c.spec.gpu.name) {
                let g = &c.spec.gpu;
                assert_eq!(g.sm_count, known.sm_count, "{}", path.display());
                assert_eq!(
                    g.peak_dense_tflops.bf16,
                    known.peak_dense_tflops.bf16,
                    "{}",
                    path.display()
                );
                assert_eq!(
                    g.hbm_bandwidth_gb_per_s,
                    known.hbm_bandwidth_gb_per_s,
                    "{}",
                    path.display()
                );
            }
        }
    }
}

//! How a training step differs from the sum of its kernels timed alone: the host that issues
//! the kernels, clocks under sustained load, compute slowed by communication beside it, and
//! per-step work outside the passes. A cluster file may state these (`runtime:`); otherwise
//! the defaults below hold; `stepcast calibrate` fits them, within their bounds, to measured
//! runs and writes them next to the models (`calibration.yaml`), which then take precedence.

use serde::{Deserialize, Serialize};

/// The in-situ physics of a training step (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Runtime {
    /// Host (CPU) time to issue one kernel from eager PyTorch — Python, dispatcher, autograd
    /// bookkeeping and the launch itself — µs. A kernel cannot start before it is issued.
    #[serde(default = "defaults::launch_us")]
    pub launch_us: f64,
    /// Host time to issue one collective through torch.distributed — Python, the process
    /// group's work object, the events and stream waits NCCL needs — µs.
    #[serde(default = "defaults::collective_launch_us")]
    pub collective_launch_us: f64,
    /// Speed of a kernel's arithmetic inside a training step relative to the same kernel
    /// benchmarked alone (sustained-load clocks), 0–1; applied to the arithmetic share of each
    /// kernel's roofline (`roofline::compute_share`), since HBM does not slow with the SMs.
    #[serde(default = "defaults::in_situ_efficiency")]
    pub in_situ_efficiency: f64,
    /// Speed of the FlashAttention-2 calls (`--attention-kernel flash-attention-2`: the
    /// flash-attn package, PyTorch SDPA's flash backend) inside a step relative to how they
    /// are costed, 0–1: the FSDP stacks' runs put their attention at 0.5–0.6 of the speed
    /// costed while the rest of their step ran near its own (`eval-real-runs.py`'s split),
    /// which one in-situ efficiency for every kernel cannot express. The cause is not known;
    /// 1 (as costed) unless a calibration's runs say otherwise.
    #[serde(default = "defaults::flash_attention_2_efficiency")]
    pub flash_attention_2_efficiency: f64,
    /// Slowdown of compute while a collective runs beside it (NCCL's SMs and HBM traffic):
    /// overlapped compute takes this many times longer.
    #[serde(default = "defaults::contention")]
    pub contention: f64,
    /// Host time per step outside the passes — data loading, the loss and gradient-norm
    /// synchronisations, zero-grad, the training loop itself — ms.
    #[serde(default = "defaults::step_overhead_ms")]
    pub step_overhead_ms: f64,
    /// Whether the host waits for the device at every pipeline transfer (Megatron's batched
    /// send/recv is followed by a device synchronisation), so it cannot issue ahead across
    /// pipeline passes.
    #[serde(default = "defaults::host_sync_per_transfer")]
    pub host_sync_per_transfer: bool,
}

/// The defaults: orders of magnitude from how eager PyTorch and NCCL behave, not fitted (see
/// `PARAMETERS` for each one's reasoning and bounds).
mod defaults {
    pub fn launch_us() -> f64 {
        20.0
    }
    pub fn collective_launch_us() -> f64 {
        40.0
    }
    pub fn in_situ_efficiency() -> f64 {
        0.95
    }
    pub fn flash_attention_2_efficiency() -> f64 {
        1.0
    }
    pub fn contention() -> f64 {
        1.1
    }
    pub fn step_overhead_ms() -> f64 {
        5.0
    }
    pub fn host_sync_per_transfer() -> bool {
        true
    }
}

impl Default for Runtime {
    fn default() -> Self {
        Runtime {
            launch_us: defaults::launch_us(),
            collective_launch_us: defaults::collective_launch_us(),
            in_situ_efficiency: defaults::in_situ_efficiency(),
            flash_attention_2_efficiency: defaults::flash_attention_2_efficiency(),
            contention: defaults::contention(),
            step_overhead_ms: defaults::step_overhead_ms(),
            host_sync_per_transfer: defaults::host_sync_per_transfer(),
        }
    }
}

/// One fitted parameter: its name in files, physical bounds, and why the default is what it is.
pub struct Parameter {
    /// Field name in `runtime:` and `calibration.yaml`.
    pub name: &'static str,
    /// Lowest physical value.
    pub min: f64,
    /// Highest physical value.
    pub max: f64,
    /// Unit as printed.
    pub unit: &'static str,
    /// Where the default comes from.
    pub why: &'static str,
}

/// How many continuous parameters a runtime has.
pub const N_PARAMETERS: usize = 6;

/// The continuous parameters `stepcast calibrate` may fit, in `Runtime::values` order.
pub const PARAMETERS: [Parameter; N_PARAMETERS] = [
    Parameter {
        name: "launch_us",
        min: 1.0,
        max: 80.0,
        unit: "µs",
        why: "eager PyTorch spends tens of microseconds of CPU per operator inside a model \
              (Python module calls and hooks, the dispatcher, autograd recording, \
              cudaLaunchKernel ≈ 3–5 µs alone); 20 µs is the order of magnitude",
    },
    Parameter {
        name: "collective_launch_us",
        min: 5.0,
        max: 400.0,
        unit: "µs",
        why: "a torch.distributed collective adds the process group's bookkeeping (work \
              object, CUDA events, stream waits) to the operator's: tens of µs",
    },
    Parameter {
        name: "in_situ_efficiency",
        min: 0.6,
        max: 1.0,
        unit: "",
        why: "microbenchmarks run short bursts at boost clocks; a step sustains power and \
              thermal load, so clocks settle lower — which slows a kernel's arithmetic, not \
              its wait on HBM",
    },
    Parameter {
        name: "contention",
        min: 1.0,
        max: 1.6,
        unit: "×",
        why: "NCCL kernels occupy SMs and HBM bandwidth while they overlap compute",
    },
    Parameter {
        name: "step_overhead_ms",
        min: 0.0,
        max: 50.0,
        unit: "ms",
        why: "the training loop's own host work per step (data loader, synchronisations, \
              logging, zero-grad); the device work of a step (optimizer, gradient norm, \
              zero-grad kernels) is costed in the plan, so what is left is a few host \
              round trips and the loop's bookkeeping: milliseconds to tens of them, at most \
              50 ms (a fit that wants more is using it for per-micro-batch time the plan \
              misses, and would charge it to every small step of another workload)",
    },
    Parameter {
        name: "flash_attention_2_efficiency",
        min: 0.4,
        max: 1.0,
        unit: "",
        why: "FlashAttention-2 calls in a step run no faster than costed; the FSDP stacks' \
              published runs put theirs at 0.5-0.6 of that speed (cause not known), so 1 \
              unless a calibration's runs say otherwise",
    },
];

impl Runtime {
    /// What an isolated-kernel composition assumes: free issue, benchmark speed, no
    /// contention, no per-step overhead (the paper's rules compose this way).
    pub fn isolated() -> Runtime {
        Runtime {
            launch_us: 0.0,
            collective_launch_us: 0.0,
            in_situ_efficiency: 1.0,
            flash_attention_2_efficiency: 1.0,
            contention: 1.0,
            step_overhead_ms: 0.0,
            host_sync_per_transfer: false,
        }
    }

    /// The continuous parameters in `PARAMETERS` order.
    pub fn values(&self) -> [f64; N_PARAMETERS] {
        [
            self.launch_us,
            self.collective_launch_us,
            self.in_situ_efficiency,
            self.contention,
            self.step_overhead_ms,
            self.flash_attention_2_efficiency,
        ]
    }

    /// This runtime with the continuous parameters replaced by `v` (in `PARAMETERS` order).
    pub fn with_values(&self, v: [f64; N_PARAMETERS]) -> Runtime {
        Runtime {
            launch_us: v[0],
            collective_launch_us: v[1],
            in_situ_efficiency: v[2],
            contention: v[3],
            step_overhead_ms: v[4],
            flash_attention_2_efficiency: v[5],
            ..*self
        }
    }

    /// Every value within its physical bounds; `what` names the file.
    pub fn validate(&self, what: &str) -> Result<(), String> {
        for (p, v) in PARAMETERS.iter().zip(self.values()) {
            crate::limits::check_range(
                what,
                &format!("runtime.{}", p.name),
                v,
                p.min..=p.max,
                p.unit,
            )?;
        }
        Ok(())
    }
}

/// A training framework's name as calibrations key it (`composer`, `megatron`, `torchtitan`):
/// lower case letters, digits, `.`, `_` and `-`, at most 40 characters.
pub fn framework_name(name: &str) -> Result<String, String> {
    let n = name.trim().to_ascii_lowercase();
    let ok = !n.is_empty()
        && n.len() <= 40
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(n)
    } else {
        Err(format!(
            "{name:?} is not a framework name: give letters, digits, '.', '_' or '-' (at most \
             40), e.g. composer"
        ))
    }
}

/// Runs of a training type a calibration needs before that type's predictions get a spread
/// of their own (fewer: the spread over all runs).
pub const MIN_RUNS_OF_A_TYPE: usize = 20;

/// The spread of each training type with `MIN_RUNS_OF_A_TYPE` runs or more among the
/// per-type errors `by_dtype` (the others take the spread over all runs).
pub fn spreads_by_dtype(
    by_dtype: &std::collections::BTreeMap<String, crate::stats::ErrorStats>,
) -> std::collections::BTreeMap<String, f64> {
    by_dtype
        .iter()
        .filter(|(_, s)| s.runs >= MIN_RUNS_OF_A_TYPE)
        .map(|(d, s)| (d.clone(), spread(s)))
        .collect()
}

/// The σ of ln(predicted / measured) of a normal spread with the same mean |error| as
/// `stats` (E|x| = σ·√(2/π)): what a calibration adds to a prediction's interval.
pub fn spread(stats: &crate::stats::ErrorStats) -> f64 {
    (std::f64::consts::PI / 2.0).sqrt() * (stats.mean_abs_percent / 100.0).ln_1p()
}

/// A models directory's `calibration.yaml`: per cluster that uses the models (and per
/// framework, where one was calibrated on its own runs), the runtime `stepcast calibrate`
/// fitted to its measured runs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Calibrations {
    /// One per cluster, by the cluster's name.
    pub clusters: Vec<Calibration>,
}

impl Calibrations {
    /// Reads and checks a calibration file's text (`path` names it in messages).
    pub fn parse(path: &std::path::Path, text: &str) -> crate::error::Result<Calibrations> {
        // a fitted file is refitted, not edited (also one fitted under wider bounds than today's)
        const REFIT: &str = "write it again with `stepcast calibrate`";
        let c: Calibrations = crate::fsutil::parse_yaml(path, text).map_err(|e| e.hint(REFIT))?;
        for one in &c.clusters {
            let what = format!("{} ({})", path.display(), one.cluster);
            let range = |r: &super::FittedRange| r.validate(&what);
            one.runtime
                .validate(&what)
                .and_then(|()| one.fitted_on.range.as_ref().map_or(Ok(()), range))
                .map_err(|m| {
                    crate::error::Error::Invalid(format!("{m} (a fitted file: {REFIT})"))
                })?;
        }
        Ok(c)
    }

    /// The calibration of the cluster named `name` for any framework, if it has one.
    pub fn of(&self, name: &str) -> Option<&Calibration> {
        self.clusters
            .iter()
            .find(|c| c.cluster == name && c.framework.is_none())
    }

    /// The calibration of the cluster named `name` fitted on `framework`'s runs alone, if any.
    pub fn of_framework(&self, name: &str, framework: &str) -> Option<&Calibration> {
        self.clusters
            .iter()
            .find(|c| c.cluster == name && c.framework.as_deref() == Some(framework))
    }

    /// These calibrations with `c` in place of its cluster's (for its framework, if any).
    pub fn with(mut self, c: Calibration) -> Calibrations {
        self.clusters
            .retain(|o| (&o.cluster, &o.framework) != (&c.cluster, &c.framework));
        self.clusters.push(c);
        self.clusters
            .sort_by(|a, b| (&a.cluster, &a.framework).cmp(&(&b.cluster, &b.framework)));
        self
    }
}

/// The runtime `stepcast calibrate` fitted for one cluster, on which runs, and how well it
/// predicts runs of families it was not fitted on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Calibration {
    /// The cluster's name (its file's `name:`).
    pub cluster: String,
    /// The framework whose runs alone it was fitted on (none: the runs of any framework);
    /// `predict --framework` picks it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub framework: Option<String>,
    /// The fitted runtime.
    pub runtime: Runtime,
    /// The runs it was fitted on.
    pub fitted_on: FittedOn,
    /// Error of the raw runtime on those runs.
    pub raw: crate::stats::ErrorStats,
    /// Error of the fitted runtime on the runs it was fitted on.
    pub in_sample: crate::stats::ErrorStats,
    /// Error when each family is predicted by a runtime fitted without it (none with one
    /// family).
    pub cross_validated: Option<crate::stats::ErrorStats>,
    /// The same per training type of the runs (bf16, fp8, …): a type with enough runs gives
    /// the interval of its predictions its own spread (empty in files written before).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub cross_validated_by_dtype: std::collections::BTreeMap<String, crate::stats::ErrorStats>,
    /// Its error on the runs of each source set on the cluster it was not fitted on (held out
    /// whole: other software, other kinds of model), by set: how far it carries beyond its own
    /// runs (empty in files written before it was recorded).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub held_out: std::collections::BTreeMap<String, crate::stats::ErrorStats>,
    /// Parameters that ended at a bound.
    #[serde(default)]
    pub at_bound: Vec<String>,
    /// The stepcast that fitted it (version and commit).
    pub stepcast: String,
    /// When (UTC date).
    pub created_at: String,
}

/// Which runs a calibration was fitted on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FittedOn {
    /// The runs file as given.
    pub file: String,
    /// Digest of the runs file.
    pub fingerprint: String,
    /// Runs predicted and fitted on.
    pub runs: usize,
    /// Runs per source set.
    pub sets: std::collections::BTreeMap<String, usize>,
    /// The model families (cross-validation groups).
    pub families: Vec<String>,
    /// The range the runs span; a prediction outside it says so (absent from files written
    /// before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range: Option<super::FittedRange>,
}

impl Calibration {
    /// A calibration of `cluster` fitted on one run, the defaults but for its launch cost: for
    /// tests of how calibrations are found and applied.
    #[cfg(test)]
    pub(crate) fn example(cluster: &str, launch_us: f64) -> Calibration {
        Calibration {
            cluster: cluster.into(),
            framework: None,
            runtime: Runtime {
                launch_us,
                ..Runtime::default()
            },
            fitted_on: FittedOn {
                file: "runs.csv".into(),
                fingerprint: "0".into(),
                runs: 1,
                sets: Default::default(),
                families: vec![],
                range: None,
            },
            raw: Default::default(),
            in_sample: Default::default(),
            cross_validated: None,
            cross_validated_by_dtype: Default::default(),
            held_out: Default::default(),
            at_bound: vec![],
            stepcast: "test".into(),
            created_at: "2026-11-24".into(),
        }
    }

    /// The fit's error on measured runs as the σ of ln(predicted / measured): cross-validated
    /// where it was, else in sample (a single family).
    pub fn sigma_log(&self) -> f64 {
        spread(self.cross_validated.as_ref().unwrap_or(&self.in_sample))
    }

    /// The spread of predictions in one training type: its own cross-validated error where
    /// at least `MIN_RUNS_OF_A_TYPE` of the runs were of it, else the fit's over all runs
    /// (DGX Cloud's FP8 runs are 3.4 % off, its BF16 ones 1.9 %: one σ for both would cover
    /// the one too little and the other too much).
    pub fn sigma_log_for(&self, dtype: &str) -> f64 {
        self.sigma_log_by_dtype()
            .get(dtype)
            .copied()
            .unwrap_or_else(|| self.sigma_log())
    }

    /// The training types with a spread of their own, and that spread.
    pub fn sigma_log_by_dtype(&self) -> std::collections::BTreeMap<String, f64> {
        spreads_by_dtype(&self.cross_validated_by_dtype)
    }

    /// The raw physics' (the cluster's default runtime's) error on the same runs, as σ.
    pub fn raw_sigma_log(&self) -> f64 {
        spread(&self.raw)
    }

    /// How far it carried to the runs it was not fitted on, one line: "on the runs of sets it
    /// was not fitted on: a x % (n runs), b y % (m runs) mean |error| (bias …)"; none without
    /// such runs.
    pub fn held_out_summary(&self) -> Option<String> {
        held_out_summary(&self.held_out)
    }

    /// How predictions say they are calibrated: "calibrated on N runs, cross-validated x %".
    pub fn summary(&self) -> String {
        let cv = match &self.cross_validated {
            Some(cv) => format!(
                "grouped cross-validation {:.1} % mean |error|, bias {:+.1} %",
                cv.mean_abs_percent, cv.bias_percent
            ),
            None => "one family: not cross-validated".into(),
        };
        let under = self
            .framework
            .as_ref()
            .map(|f| format!(" under {f}"))
            .unwrap_or_default();
        format!(
            "calibrated for {}{under} on {} measured runs ({cv})",
            self.cluster, self.fitted_on.runs
        )
    }
}

/// One line for a calibration's held-out sets (see `Calibration::held_out_summary`).
pub fn held_out_summary(
    held_out: &std::collections::BTreeMap<String, crate::stats::ErrorStats>,
) -> Option<String> {
    let sets: Vec<_> = held_out.iter().filter(|(_, e)| e.runs > 0).collect();
    let bias = |pick: fn(f64, f64) -> f64| {
        sets.iter()
            .map(|(_, e)| e.bias_percent)
            .reduce(pick)
            .unwrap_or_default()
    };
    let (low, high) = (bias(f64::min), bias(f64::max));
    (!sets.is_empty()).then(|| {
        let each: Vec<String> = sets
            .iter()
            .map(|(name, e)| {
                let runs = if e.runs == 1 { "run" } else { "runs" };
                format!("{name} {:.1} % ({} {runs})", e.mean_abs_percent, e.runs)
            })
            .collect();
        format!(
            "on the runs of sets it was not fitted on: {} mean |error| (bias {low:+.1} … \
             {high:+.1} %)",
            each.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_lie_within_their_bounds_and_round_trip() {
        let r = Runtime::default();
        r.validate("test").unwrap();
        assert_eq!(r.with_values(r.values()), r);
        // every value lands in its own field, and the discrete settings are kept
        let v = [2.0, 50.0, 0.8, 1.2, 7.0, 0.9];
        let moved = r.with_values(v);
        assert_eq!(moved.values(), v);
        assert_eq!(moved.host_sync_per_transfer, r.host_sync_per_transfer);
        let isolated = Runtime::isolated().with_values(v);
        assert_eq!(
            isolated.host_sync_per_transfer,
            Runtime::isolated().host_sync_per_transfer
        );
        let bad = r.with_values([0.0, 40.0, 1.0, 1.0, 0.0, 1.0]);
        assert!(bad
            .validate("x.yaml")
            .unwrap_err()
            .contains("runtime.launch_us"));
        let slow_attention = r.with_values([20.0, 40.0, 1.0, 1.0, 0.0, 0.2]);
        assert!(slow_attention
            .validate("x.yaml")
            .unwrap_err()
            .contains("runtime.flash_attention_2_efficiency"));
        // a file written before FlashAttention-2's efficiency was fitted costs it as it is
        let parsed: Runtime = serde_norway::from_str("contention: 1.3\n").unwrap();
        assert_eq!(parsed.contention, 1.3);
        assert_eq!(parsed.launch_us, r.launch_us);
        assert_eq!(parsed.flash_attention_2_efficiency, 1.0);
    }

    #[test]
    fn a_calibration_outside_todays_bounds_is_refused_with_the_fix() {
        // the shipped file with its first fit's per-step overhead where the old bound let it go
        let shipped = include_str!("../../models/h100-sxm/calibration.yaml");
        let at = shipped.find("step_overhead_ms: ").unwrap() + "step_overhead_ms: ".len();
        let end = at + shipped[at..].find('\n').unwrap();
        let text = format!("{}97.8{}", &shipped[..at], &shipped[end..]);
        assert!(Calibrations::parse(std::path::Path::new("m/calibration.yaml"), shipped).is_ok());
        let err = Calibrations::parse(std::path::Path::new("m/calibration.yaml"), &text)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("m/calibration.yaml (dgx-h100)")
                && err.contains("runtime.step_overhead_ms = 97.8")
                && err.contains("0 to 50 ms")
                && err.contains("stepcast calibrate"),
            "{err}"
        );
    }

    #[test]
    fn a_calibration_with_an_upside_down_range_is_refused_with_the_fix() {
        let shipped = include_str!("../../models/perlmutter/calibration.yaml");
        let gpus = "      gpus:\n      - 2\n      - 8\n";
        assert!(shipped.contains(gpus));
        let text = shipped.replacen(gpus, "      gpus:\n      - 8\n      - 2\n", 1);
        let err = Calibrations::parse(std::path::Path::new("m/calibration.yaml"), &text)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("m/calibration.yaml (dgx-a100): fitted_on.range.gpus = [8, 2]")
                && err.contains("stepcast calibrate"),
            "{err}"
        );
    }

    #[test]
    fn framework_names_are_checked_and_calibrations_are_kept_per_framework() {
        assert_eq!(framework_name(" Composer ").unwrap(), "composer");
        for bad in ["", "a b", "x/y", &"z".repeat(41)] {
            assert!(framework_name(bad).unwrap_err().contains("framework name"));
        }
        let entry = |framework: Option<&str>, launch_us| Calibration {
            framework: framework.map(String::from),
            ..Calibration::example("c", launch_us)
        };
        let c = Calibrations::default()
            .with(entry(None, 30.0))
            .with(entry(Some("composer"), 40.0))
            .with(entry(None, 35.0));
        assert_eq!(c.clusters.len(), 2);
        assert_eq!(c.of("c").unwrap().runtime.launch_us, 35.0);
        assert_eq!(
            c.of_framework("c", "composer").unwrap().runtime.launch_us,
            40.0
        );
        assert!(c.of_framework("c", "megatron").is_none());
        assert!(c
            .of_framework("c", "composer")
            .unwrap()
            .summary()
            .contains("c under composer"));
        // a file without frameworks reads as before
        let text = serde_norway::to_string(&c).unwrap();
        let back: Calibrations = serde_norway::from_str(&text).unwrap();
        assert_eq!(back, c);
        assert_eq!(text.matches("framework:").count(), 1);
    }

    /// The held-out sets read as one line, set by set with the biases' span; a calibration
    /// without any (fitted on every set it had, or written before they were recorded) has none.
    #[test]
    fn held_out_sets_are_summarised_and_optional() {
        let stats = |mean_abs_percent, bias_percent| crate::stats::ErrorStats {
            runs: 3,
            mean_abs_percent,
            max_abs_percent: mean_abs_percent,
            bias_percent,
        };
        let mut c = Calibration::example("c", 30.0);
        assert_eq!(c.held_out_summary(), None);
        assert!(!serde_norway::to_string(&c).unwrap().contains("held_out"));
        c.held_out.insert("mpt".into(), stats(19.6, -19.5));
        c.held_out.insert("automodel".into(), stats(7.5, 7.5));
        c.held_out
            .insert("empty".into(), crate::stats::ErrorStats::default());
        assert_eq!(
            c.held_out_summary().unwrap(),
            "on the runs of sets it was not fitted on: automodel 7.5 % (3 runs), mpt 19.6 % (3 \
             runs) mean |error| (bias -19.5 … +7.5 %)"
        );
        let back: Calibration =
            serde_norway::from_str(&serde_norway::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
        // the shipped files carry it
        let shipped = include_str!("../../models/perlmutter/calibration.yaml");
        let parsed = Calibrations::parse(std::path::Path::new("c.yaml"), shipped).unwrap();
        assert!(parsed.of("dgx-a100").unwrap().held_out.contains_key("mpt"));
    }
}

//! `stepcast calibrate`: the runtime's few physical parameters (`hardware::Runtime`) fitted to
//! measured training steps, bounded and cross-validated by model family, and the error on
//! those runs reported per source set, raw and calibrated side by side.
//!
//! Every run is planned and costed once (`Prepared`); a candidate runtime only recomposes the
//! step from the cached isolated estimates, so a fit over a thousand runs takes seconds.

pub mod fit;
pub mod megatron_log;
pub mod nemo_log;
pub mod runs;
pub mod torchtitan_log;

use std::collections::{BTreeMap, BTreeSet};

use rayon::prelude::*;
use serde::Serialize;

use crate::error::Result;
use crate::hardware::{Cluster, FittedRange, RunPoint, Runtime, PARAMETERS};
use crate::plan::Plan;
use crate::predict::compose::QueryTimes;
use crate::predict::cost::CostModel;
use crate::predict::{compose_step, estimate};
pub use crate::stats::ErrorStats;
use crate::workload::{Arch, Layout};
pub use fit::{fit, fit_holding, Fit};
pub use runs::Run;

/// A run planned and costed, ready to be recomposed under any runtime.
pub struct Prepared {
    /// Index of the run in the runs it came from.
    pub index: usize,
    plan: Plan,
    layout: Layout,
    isolated_us: Vec<f64>,
    /// Model FLOPs per step per GPU over the GPU's dense peak for the run's type, seconds: a
    /// step time's MFU is this over the step.
    peak_seconds: f64,
    /// The runtime of the run's cluster (its discrete settings are kept; a fit moves the
    /// continuous ones).
    pub base: Runtime,
    /// Measured step, seconds.
    pub measured_s: f64,
    /// What the measurement covers: the predicted time compared with it covers the same.
    time_scope: runs::TimeScope,
    /// The memory projection beside what the run reported.
    pub memory: MemoryOutcome,
    /// Weight of the run in a fit: every source set counts the same however many rows it
    /// has (set by `evaluate`).
    pub weight: f64,
    /// Where the run lies (GPUs, model size, sequence, parallelism, type): a calibration
    /// records the range of its runs.
    pub point: RunPoint,
}

impl Prepared {
    /// Plans and costs `run` on `cluster` with `cost`.
    pub fn new(index: usize, run: &Run, cluster: &Cluster, cost: &CostModel) -> Result<Prepared> {
        let arch = Arch::resolve(&run.model)?;
        let layout = Layout::new(&run.spec, &arch, cluster)?;
        let plan = Plan::new(&arch, &layout, cluster);
        let costed = estimate(&plan, cost, false, Runtime::isolated())?;
        let memory = MemoryOutcome::new(
            &crate::memory::project(&arch, &layout, cluster, &plan),
            crate::memory::overheads(&layout, cluster).1,
            run.measured_memory,
            run.time_scope,
        );
        let flops_per_gpu = plan.model_flops_per_step / layout.world as f64;
        let point = crate::predict::run_point(&arch, &layout, cluster);
        Ok(Prepared {
            index,
            peak_seconds: flops_per_gpu / cluster.spec.gpu.peak_flops(layout.dtype),
            isolated_us: costed.estimates.iter().map(|e| e.time_us).collect(),
            plan,
            layout,
            base: cost.runtime(),
            measured_s: run.measured_s,
            time_scope: run.time_scope,
            memory,
            weight: 1.0,
            point,
        })
    }

    /// The step, seconds, under `runtime` — or, for a run timed without its update
    /// (`time_scope` forward_backward), the step until the optimizer would start: the passes
    /// and the gradient reduction of the last rank to finish them.
    pub fn step_s(&self, runtime: &Runtime) -> f64 {
        let n = self.plan.queries.len();
        let times = QueryTimes::new(
            &self.plan,
            &self.isolated_us,
            vec![0; n],
            1,
            false,
            *runtime,
        );
        match (
            compose_step(&self.plan, &self.layout, &times),
            self.time_scope,
        ) {
            (Ok((_, Some((_, timeline)))), runs::TimeScope::ForwardBackward) => {
                timeline.barrier_us / 1e6
            }
            // the paper's closed form has no timeline: its optimizer is the step's last term
            (Ok((step, None)), runs::TimeScope::ForwardBackward) => {
                (step.step_us - step.breakdown_us.optimizer) / 1e6
            }
            (Ok((step, _)), runs::TimeScope::Step) => step.step_us / 1e6,
            (Err(_), _) => f64::NAN,
        }
    }

    /// Seconds of the step under `runtime` that its FlashAttention-2 calls take, as the step
    /// composes them (what halving their efficiency adds); none without such calls.
    pub fn flash_attention_2_s(&self, runtime: &Runtime) -> Option<f64> {
        use crate::ops::Role;
        self.plan
            .queries
            .iter()
            .any(|q| q.role == Some(Role::FlashAttention2))
            .then(|| {
                let halved = Runtime {
                    flash_attention_2_efficiency: runtime.flash_attention_2_efficiency / 2.0,
                    ..*runtime
                };
                self.step_s(&halved) - self.step_s(runtime)
            })
    }

    /// MFU, percent, of a step of `step_s`.
    pub fn mfu_percent(&self, step_s: f64) -> f64 {
        100.0 * self.peak_seconds / step_s
    }
}

/// A run's memory projection beside the peak it reported. Every run ran, so a projection
/// that says it does not fit (OOM) is wrong whether or not the run reported its memory.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct MemoryOutcome {
    /// The projection's fullest GPU, GiB, everything the run held counted (a run timed
    /// without its optimizer step: no optimizer states).
    pub projected_gib: f64,
    /// Its verdict.
    pub verdict: crate::memory::Verdict,
    /// The peak the run reported, GiB, and what it counts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub measured_gib: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope: Option<runs::MemoryScope>,
    /// The projection counted as the measurement counts (PyTorch's reserved memory holds
    /// neither the CUDA context nor NCCL's buffers: the communicators' share is taken off; the
    /// context, ≈ 0.5 GiB, stays in the framework's share), GiB.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comparable_gib: Option<f64>,
}

impl MemoryOutcome {
    /// `report` counted as the run ran: a run timed without its optimizer step never made the
    /// optimizer's states.
    fn new(
        report: &crate::memory::MemoryReport,
        communicators_gib: f64,
        measured: Option<runs::MeasuredMemory>,
        scope: runs::TimeScope,
    ) -> MemoryOutcome {
        let (projected_gib, verdict) = match scope {
            runs::TimeScope::Step => (report.peak().total_gib, report.verdict),
            runs::TimeScope::ForwardBackward => report.without_optimizer(),
        };
        MemoryOutcome {
            projected_gib,
            verdict,
            measured_gib: measured.map(|m| m.gib),
            scope: measured.map(|m| m.scope),
            comparable_gib: measured.map(|m| match m.scope {
                runs::MemoryScope::Allocator => projected_gib - communicators_gib,
                runs::MemoryScope::Device => projected_gib,
            }),
        }
    }
}

/// One run's outcome in an evaluation.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    /// Line in the runs CSV.
    pub line: usize,
    /// Source set.
    pub set: String,
    /// Model family.
    pub family: String,
    /// The run.
    pub label: String,
    /// Measured step, s.
    pub measured_s: f64,
    /// The training type it was predicted in (bf16, fp8, …): the interval's spread may be the
    /// type's own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
    /// What the measurement (and so each prediction beside it) covers, where not the step.
    #[serde(skip_serializing_if = "is_whole_step")]
    pub time_scope: runs::TimeScope,
    /// Predicted with the raw (default) runtime, s.
    pub raw_s: Option<f64>,
    /// Of that, the FlashAttention-2 calls, s (runs that make none: absent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub raw_flash_attention_2_s: Option<f64>,
    /// Predicted with the runtime fitted on every run (this one included), s.
    pub fitted_s: Option<f64>,
    /// Predicted with the runtime fitted without the run's family (a held-out set's run:
    /// with the runtime fitted on the others; under `--check`: the runtime `predict` uses
    /// now), s.
    pub cross_validated_s: Option<f64>,
    /// MFU of the raw and the cross-validated prediction, percent.
    pub mfu_percent: Option<[f64; 2]>,
    /// The memory projection beside what the run reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryOutcome>,
    /// Why the run was not predicted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_predicted: Option<String>,
    /// For a run of a set held out, where it lies outside the range of the runs fitted on
    /// (what a prediction of it would warn): its error there is an extrapolation's.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub beyond_fitted_runs: Vec<String>,
}

impl RunResult {
    /// The run's outcome with nothing predicted yet.
    fn of(run: &Run) -> RunResult {
        RunResult {
            line: run.line,
            set: run.set.clone(),
            family: run.family.clone(),
            label: run.label.clone(),
            measured_s: run.measured_s,
            dtype: None,
            time_scope: run.time_scope,
            raw_s: None,
            raw_flash_attention_2_s: None,
            fitted_s: None,
            cross_validated_s: None,
            mfu_percent: None,
            memory: None,
            not_predicted: None,
            beyond_fitted_runs: Vec::new(),
        }
    }
}

fn is_whole_step(scope: &runs::TimeScope) -> bool {
    *scope == runs::TimeScope::Step
}

/// Errors of one source set.
#[derive(Debug, Clone, Serialize)]
pub struct SetReport {
    /// Whether the runtime was fitted on it (else it is held out whole, and `cross_validated`
    /// is the fitted runtime's error on it).
    pub fitted: bool,
    /// Rows of the set among the runs.
    pub rows: usize,
    /// Rows stepcast can express.
    pub expressible: usize,
    /// Rows predicted.
    pub predicted: usize,
    /// Raw physics (the cluster's default runtime).
    pub raw: ErrorStats,
    /// Grouped cross-validation: each family predicted with a runtime fitted without it (a
    /// set not fitted on: predicted with the runtime fitted on the others).
    pub cross_validated: ErrorStats,
    /// Highest predicted MFU, raw and cross-validated, percent.
    pub max_mfu_percent: [f64; 2],
    /// Predicted runs the memory projection says do not fit (they ran: each is wrong).
    pub projected_oom: usize,
    /// The memory projection against the peaks the runs reported (in their scope).
    pub memory: ErrorStats,
    /// Predicted runs of a held-out set outside the range of the runs fitted on.
    pub beyond_fitted_runs: usize,
    /// Share of the set's runs whose cross-validated prediction lies within the calibration's
    /// part of the 80 % interval `predict` gives, exp(±1.28σ), percent: about 80 where the
    /// interval is honest (a lower bound: the operator models widen it a little more).
    pub inside_interval_percent: Option<f64>,
}

/// A parameter the fit put at a bound, held at its default instead and the others refitted:
/// whether the runs need the bound value or merely drift there.
#[derive(Debug, Clone, Serialize)]
pub struct HeldAtDefault {
    /// The parameter's name.
    pub parameter: &'static str,
    /// Its fitted value.
    pub fitted: f64,
    /// Its default, where the refit holds it.
    pub default: f64,
    /// The runtime refitted with the parameter at its default.
    pub refit: Runtime,
    /// In-sample error on the fit runs with it.
    pub in_sample: ErrorStats,
}

/// What `calibrate` found.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The runtime fitted on every predicted run.
    pub fitted: Fit,
    /// Each parameter at a bound, held at its default and the others refitted.
    pub held_at_default: Vec<HeldAtDefault>,
    /// The default (raw) runtime it started from.
    pub raw_runtime: Runtime,
    /// Per source set.
    pub sets: BTreeMap<String, SetReport>,
    /// Over every predicted run: raw, fitted in sample, cross-validated.
    pub overall: [ErrorStats; 3],
    /// The spread a calibration written from this fit adds to `predict`'s interval (σ of
    /// ln(predicted / measured); `hardware::spread` of the cross-validated error).
    pub interval_sigma_log: f64,
    /// The cross-validated error of the fit runs per training type: a type with
    /// `MIN_RUNS_OF_A_TYPE` runs or more gets its own spread in the interval.
    pub cross_validated_by_dtype: BTreeMap<String, ErrorStats>,
    /// The range of the runs fitted on (what a calibration written from this fit records).
    #[serde(skip)]
    pub fitted_range: Option<FittedRange>,
    /// Per run.
    pub runs: Vec<RunResult>,
}

/// Fits the runtime on the predicted runs of the sets in `fit_sets` (all sets when empty) and
/// cross-validates it by family; runs of other sets are predicted with the runtime fitted on
/// all fit runs (held out whole). `not_predicted` lists (run index, why) of runs that could not
/// be planned.
pub fn evaluate(
    runs: &[Run],
    prepared: &mut [Prepared],
    not_predicted: &[(usize, String)],
    fit_sets: &[String],
) -> Report {
    let fits = |set: &str| fit_sets.is_empty() || fit_sets.iter().any(|s| s == set);
    let mut per_set: BTreeMap<&str, usize> = BTreeMap::new();
    for p in prepared.iter() {
        *per_set.entry(runs[p.index].set.as_str()).or_default() += 1;
    }
    for p in prepared.iter_mut() {
        p.weight = 1.0 / per_set[runs[p.index].set.as_str()] as f64;
    }
    let prepared: &[Prepared] = prepared;
    let raw_runtime = prepared.first().map(|p| p.base).unwrap_or_default();
    let all: Vec<&Prepared> = prepared
        .iter()
        .filter(|p| fits(&runs[p.index].set))
        .collect();
    let fitted = fit(&all, raw_runtime);
    let fitted_range = FittedRange::of(&all.iter().map(|p| p.point.clone()).collect::<Vec<_>>());
    let in_sample = |r: &Runtime| ErrorStats::of(all.iter().map(|p| (p.step_s(r), p.measured_s)));
    let held_at_default = fitted
        .at_bound
        .par_iter()
        .filter_map(|name| {
            let i = PARAMETERS.iter().position(|p| p.name == *name)?;
            let refit = fit_holding(&all, raw_runtime, &[i]).runtime;
            Some(HeldAtDefault {
                parameter: PARAMETERS[i].name,
                fitted: fitted.runtime.values()[i],
                default: raw_runtime.values()[i],
                in_sample: in_sample(&refit),
                refit,
            })
        })
        .collect();
    let families: Vec<&str> = {
        let mut f: Vec<&str> = all.iter().map(|p| runs[p.index].family.as_str()).collect();
        f.sort();
        f.dedup();
        f
    };
    // each family predicted by a runtime fitted on the others (none if it is the only one)
    let held_out: BTreeMap<&str, Option<Runtime>> = families
        .par_iter()
        .map(|&fam| {
            let rest: Vec<&Prepared> = all
                .iter()
                .copied()
                .filter(|p| runs[p.index].family != fam)
                .collect();
            (
                fam,
                (!rest.is_empty()).then(|| fit(&rest, raw_runtime).runtime),
            )
        })
        .collect();
    let mut results: Vec<RunResult> = prepared
        .par_iter()
        .map(|p| {
            let run = &runs[p.index];
            let raw = p.step_s(&p.base);
            let cv = if fits(&run.set) {
                held_out[run.family.as_str()].map(|r| p.step_s(&r))
            } else {
                Some(p.step_s(&fitted.runtime))
            };
            RunResult {
                raw_s: Some(raw),
                raw_flash_attention_2_s: p.flash_attention_2_s(&p.base),
                fitted_s: Some(p.step_s(&fitted.runtime)),
                cross_validated_s: cv,
                mfu_percent: Some([
                    p.mfu_percent(raw),
                    cv.map_or(f64::NAN, |c| p.mfu_percent(c)),
                ]),
                memory: Some(p.memory),
                beyond_fitted_runs: match &fitted_range {
                    Some(range) if !fits(&run.set) => range.outside(&p.point),
                    _ => Vec::new(),
                },
                dtype: Some(p.point.dtype.clone()),
                ..RunResult::of(run)
            }
        })
        .collect();
    results.extend(unpredicted(runs, not_predicted));
    results.sort_by_key(|r| r.line);
    let fit_results = || results.iter().filter(|r| fits(&r.set));
    let overall = [
        ErrorStats::of(fit_results().filter_map(|r| Some((r.raw_s?, r.measured_s)))),
        ErrorStats::of(fit_results().filter_map(|r| Some((r.fitted_s?, r.measured_s)))),
        ErrorStats::of(fit_results().filter_map(|r| Some((r.cross_validated_s?, r.measured_s)))),
    ];
    // the spread a calibration written from this fit adds to predict's interval: over all
    // runs, and for a training type with enough runs its own
    let sigma = crate::hardware::spread(if overall[2].runs > 0 {
        &overall[2]
    } else {
        &overall[1]
    });
    let mut by_dtype: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for r in fit_results() {
        if let (Some(cv), Some(d)) = (r.cross_validated_s, &r.dtype) {
            by_dtype
                .entry(d.clone())
                .or_default()
                .push((cv, r.measured_s));
        }
    }
    let cross_validated_by_dtype: BTreeMap<String, ErrorStats> = by_dtype
        .into_iter()
        .map(|(d, pairs)| (d, ErrorStats::of(pairs.into_iter())))
        .collect();
    let own = crate::hardware::spreads_by_dtype(&cross_validated_by_dtype);
    let sigma_of = |r: &RunResult| {
        Some(
            r.dtype
                .as_ref()
                .and_then(|d| own.get(d))
                .copied()
                .unwrap_or(sigma),
        )
    };
    let sets = set_reports(runs, &results, &fits, &sigma_of);
    Report {
        sets,
        interval_sigma_log: sigma,
        cross_validated_by_dtype,
        fitted_range,
        fitted,
        held_at_default,
        raw_runtime,
        overall,
        runs: results,
    }
}

/// The runtime `predict` composes a run under now — its cluster's calibration, its
/// framework's, or the one the cluster file borrows, else the cluster's defaults — as a check
/// judges the run by.
#[derive(Debug, Clone, Serialize)]
pub struct Current {
    /// The runtime.
    pub runtime: Runtime,
    /// Its spread on measured runs as σ of ln(predicted / measured) (the calibration's
    /// cross-validated error), which `predict` puts into its interval; none for the defaults.
    pub sigma_log: Option<f64>,
    /// The spread of the training types with enough runs of their own, which `predict` puts
    /// into the interval of a step of that type instead.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub sigma_log_by_dtype: BTreeMap<String, f64>,
    /// How `predict` names it ("calibrated for C on N runs …"); for the defaults, why no
    /// calibration applies where it says ("no calibration under composer for C").
    pub summary: Option<String>,
    /// The source sets of the cluster's runs the calibration was fitted on: a run of one of
    /// them is judged in sample (none for a calibration borrowed from another cluster).
    pub fitted_sets: Vec<String>,
    /// The range of the runs it was fitted on: a run of another set outside it is an
    /// extrapolation (what `predict` warns).
    #[serde(skip)]
    pub range: Option<FittedRange>,
}

/// One runtime a check used, and on how many of the runs.
#[derive(Debug, Clone, Serialize)]
pub struct CheckedRuntime {
    /// The runtime and how predictions name it.
    #[serde(flatten)]
    pub current: Current,
    /// Runs composed under it.
    pub runs: usize,
}

/// What `calibrate --check` found: the runs predicted as `predict` would predict them now,
/// beside the raw physics; nothing fitted. A set's `cross_validated` and a run's
/// `cross_validated_s` hold the prediction under the current runtime; a set is `fitted` when
/// that runtime's calibration was fitted on runs of its name (its error is then in sample).
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// Always true: tells a check's JSON from a fit's.
    pub check: bool,
    /// The runtimes the runs were composed under.
    pub runtimes: Vec<CheckedRuntime>,
    /// Per source set.
    pub sets: BTreeMap<String, SetReport>,
    /// Over every predicted run: raw, and under the current runtime.
    pub overall: [ErrorStats; 2],
    /// Per run.
    pub runs: Vec<RunResult>,
}

/// Judges each prepared run under the runtime `current` gives it (what `predict` uses now)
/// beside the raw physics, and reports the error per set; nothing is fitted. `not_predicted`
/// lists (run index, why) of runs that could not be planned.
pub fn check<'c>(
    runs: &[Run],
    prepared: &[Prepared],
    not_predicted: &[(usize, String)],
    current: &(dyn Fn(&Prepared) -> &'c Current + Sync),
) -> Check {
    let judged: Vec<(RunResult, &Current)> = prepared
        .par_iter()
        .map(|p| {
            let run = &runs[p.index];
            let now = current(p);
            let raw = p.step_s(&p.base);
            let calibrated = p.step_s(&now.runtime);
            let in_sample = now.fitted_sets.contains(&run.set);
            let result = RunResult {
                raw_s: Some(raw),
                raw_flash_attention_2_s: p.flash_attention_2_s(&p.base),
                cross_validated_s: Some(calibrated),
                mfu_percent: Some([p.mfu_percent(raw), p.mfu_percent(calibrated)]),
                memory: Some(p.memory),
                beyond_fitted_runs: match &now.range {
                    Some(range) if !in_sample => range.outside(&p.point),
                    _ => Vec::new(),
                },
                dtype: Some(p.point.dtype.clone()),
                ..RunResult::of(run)
            };
            (result, now)
        })
        .collect();
    let mut runtimes: Vec<CheckedRuntime> = Vec::new();
    let mut sigma_of_line: BTreeMap<usize, Option<f64>> = BTreeMap::new();
    let mut in_sample: BTreeSet<String> = BTreeSet::new();
    for &(ref r, now) in &judged {
        let own = r
            .dtype
            .as_ref()
            .and_then(|d| now.sigma_log_by_dtype.get(d))
            .copied();
        sigma_of_line.insert(r.line, now.sigma_log.map(|all| own.unwrap_or(all)));
        if now.fitted_sets.contains(&r.set) {
            in_sample.insert(r.set.clone());
        }
        match runtimes
            .iter_mut()
            .find(|c| c.current.summary == now.summary && c.current.runtime == now.runtime)
        {
            Some(c) => c.runs += 1,
            None => runtimes.push(CheckedRuntime {
                current: now.clone(),
                runs: 1,
            }),
        }
    }
    let mut results: Vec<RunResult> = judged.into_iter().map(|(r, _)| r).collect();
    results.extend(unpredicted(runs, not_predicted));
    results.sort_by_key(|r| r.line);
    let predicted = || results.iter().filter(|r| r.raw_s.is_some());
    let overall = [
        ErrorStats::of(predicted().filter_map(|r| Some((r.raw_s?, r.measured_s)))),
        ErrorStats::of(predicted().filter_map(|r| Some((r.cross_validated_s?, r.measured_s)))),
    ];
    let sigma = |r: &RunResult| sigma_of_line.get(&r.line).copied().flatten();
    Check {
        check: true,
        runtimes,
        sets: set_reports(runs, &results, &|set| in_sample.contains(set), &sigma),
        overall,
        runs: results,
    }
}

/// The outcome of each run that could not be planned: (run index, why).
fn unpredicted<'a>(
    runs: &'a [Run],
    not_predicted: &'a [(usize, String)],
) -> impl Iterator<Item = RunResult> + 'a {
    not_predicted.iter().map(|(i, why)| RunResult {
        not_predicted: Some(why.clone()),
        ..RunResult::of(&runs[*i])
    })
}

/// Percent of `runs` whose cross-validated prediction's interval — the runtime's part of
/// `predict`'s, `predict::runtime_band`: exp(±1.28σ), σ each run's (`sigma`), widened to the
/// extrapolation band where the run lies beyond the runs fitted on — holds the measured step
/// (a run with neither is left out); none without any.
fn inside_interval(runs: &[&RunResult], sigma: &dyn Fn(&RunResult) -> Option<f64>) -> Option<f64> {
    let judged: Vec<(f64, (f64, f64))> = runs
        .iter()
        .filter_map(|r| {
            let band = crate::predict::runtime_band(sigma(r), !r.beyond_fitted_runs.is_empty())?;
            Some((r.measured_s / r.cross_validated_s?, band))
        })
        .filter(|(ratio, _)| ratio.is_finite())
        .collect();
    let inside = judged
        .iter()
        .filter(|&&(ratio, (low, high))| (low..=high).contains(&ratio))
        .count();
    (!judged.is_empty()).then(|| 100.0 * inside as f64 / judged.len() as f64)
}

fn set_reports(
    runs: &[Run],
    results: &[RunResult],
    fits: &dyn Fn(&str) -> bool,
    sigma: &dyn Fn(&RunResult) -> Option<f64>,
) -> BTreeMap<String, SetReport> {
    let mut sets = BTreeMap::new();
    for set in runs.iter().map(|r| r.set.as_str()) {
        if sets.contains_key(set) {
            continue;
        }
        let of_set: Vec<&RunResult> = results.iter().filter(|r| r.set == set).collect();
        let max_mfu = |k: usize| {
            of_set
                .iter()
                .filter_map(|r| r.mfu_percent.map(|m| m[k]))
                .filter(|m| m.is_finite())
                .fold(0.0f64, f64::max)
        };
        sets.insert(
            set.to_string(),
            SetReport {
                fitted: fits(set),
                rows: runs.iter().filter(|r| r.set == set).count(),
                expressible: runs
                    .iter()
                    .filter(|r| r.set == set && r.not_expressible.is_none())
                    .count(),
                predicted: of_set.iter().filter(|r| r.raw_s.is_some()).count(),
                raw: ErrorStats::of(of_set.iter().filter_map(|r| Some((r.raw_s?, r.measured_s)))),
                cross_validated: ErrorStats::of(
                    of_set
                        .iter()
                        .filter_map(|r| Some((r.cross_validated_s?, r.measured_s))),
                ),
                max_mfu_percent: [max_mfu(0), max_mfu(1)],
                projected_oom: of_set
                    .iter()
                    .filter(|r| {
                        r.memory
                            .is_some_and(|m| m.verdict == crate::memory::Verdict::Oom)
                    })
                    .count(),
                memory: ErrorStats::of(of_set.iter().filter_map(|r| {
                    let m = r.memory?;
                    Some((m.comparable_gib?, m.measured_gib?))
                })),
                beyond_fitted_runs: of_set
                    .iter()
                    .filter(|r| !r.beyond_fitted_runs.is_empty())
                    .count(),
                inside_interval_percent: inside_interval(&of_set, sigma),
            },
        );
    }
    sets
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{AttentionKernel, ParallelSpec, Schedule};

    /// A Llama 2 7B run of `spec` on the eight GPUs of the models-free DGX H100 (data
    /// parallel over what its tensor parallelism leaves), two micro-batches of one sequence of
    /// 1,024 tokens unless `spec` sets another length, measured at 1 s until
    /// `prepared_measured` says otherwise.
    fn llama_run(line: usize, set: &str, family: &str, spec: ParallelSpec) -> Run {
        let tp = spec.tp.unwrap_or(1);
        Run {
            line,
            set: set.into(),
            family: family.into(),
            label: format!("line {line}"),
            cluster: std::path::PathBuf::new(),
            model: "llama2-7b".into(),
            spec: ParallelSpec {
                dp: Some(8 / tp),
                micro_batch: Some(1),
                micro_batches: Some(2),
                seq_len: spec.seq_len.or(Some(1024)),
                ..spec
            },
            measured_s: 1.0,
            not_expressible: None,
            framework: None,
            measured_memory: None,
            time_scope: runs::TimeScope::Step,
        }
    }

    fn tp(tp: u64) -> ParallelSpec {
        ParallelSpec {
            tp: Some(tp),
            ..Default::default()
        }
    }

    fn flash_attention_2(spec: ParallelSpec) -> ParallelSpec {
        ParallelSpec {
            attention_kernel: Some(AttentionKernel::FlashAttention2),
            ..spec
        }
    }

    /// Runs of lines 2 and 3 in set `a`, families `f0` (tp 1) and `f1` (tp 2), and of line
    /// 4 in set `b`, family `g`: `b` with its attention run as FlashAttention-2.
    fn two_of_a_and_one_of_b(b: ParallelSpec) -> Vec<Run> {
        vec![
            llama_run(2, "a", "f0", tp(1)),
            llama_run(3, "a", "f1", tp(2)),
            llama_run(4, "b", "g", flash_attention_2(b)),
        ]
    }

    /// `run` prepared on the models-free DGX H100 as the `index`-th run.
    fn prepare(index: usize, run: &Run) -> Prepared {
        let cluster = crate::hardware::dgx_h100_without_models();
        Prepared::new(index, run, &cluster, &CostModel::new(&cluster, None)).unwrap()
    }

    fn prepared(run: &Run) -> Prepared {
        prepare(0, run)
    }

    /// `runs` prepared, each measured `slower` times its raw prediction (the run and its
    /// preparation both say so).
    fn prepared_measured(runs: &mut [Run], slower: f64) -> Vec<Prepared> {
        runs.iter_mut()
            .enumerate()
            .map(|(i, run)| {
                let mut p = prepare(i, run);
                p.measured_s = p.step_s(&p.base) * slower;
                run.measured_s = p.measured_s;
                p
            })
            .collect()
    }

    /// A run timed without its update stops where the last rank's gradient reduction ends:
    /// before the step, past half of it (Adam over 3.5 B parameters a GPU takes about a
    /// third of two micro-batches of 1,024 tokens). Under the closed form, which has no
    /// timeline, it is the step less its optimizer term exactly.
    #[test]
    fn a_run_timed_without_its_update_leaves_the_optimizer_out() {
        for schedule in [None, Some(Schedule::ClosedForm)] {
            let mut run = llama_run(2, "s", "f", ParallelSpec { schedule, ..tp(2) });
            let step = prepared(&run);
            run.time_scope = runs::TimeScope::ForwardBackward;
            let passes = prepared(&run);
            let runtime = step.base;
            let (step_s, passes_s) = (step.step_s(&runtime), passes.step_s(&runtime));
            assert!(step_s > 0.05 && step_s < 5.0, "{step_s}");
            assert!(
                passes_s < step_s && passes_s > 0.5 * step_s,
                "{schedule:?}: {passes_s} of {step_s}"
            );
            if schedule.is_some() {
                let n = step.plan.queries.len();
                let times =
                    QueryTimes::new(&step.plan, &step.isolated_us, vec![0; n], 1, false, runtime);
                let (composed, _) = compose_step(&step.plan, &step.layout, &times).unwrap();
                let optimizer_s = composed.breakdown_us.optimizer / 1e6;
                assert!(optimizer_s > 0.0);
                assert!((step_s - passes_s - optimizer_s).abs() < 1e-12 * step_s);
            }
        }
    }

    /// FlashAttention-2's share is what halving its efficiency adds: some of the step, not
    /// all of it; a step of native attention makes no such calls.
    #[test]
    fn flash_attention_2_s_share_is_what_halving_its_efficiency_adds() {
        let native = prepared(&llama_run(2, "s", "f", tp(1)));
        assert_eq!(native.flash_attention_2_s(&native.base), None);
        let fa2 = prepared(&llama_run(2, "s", "f", flash_attention_2(tp(1))));
        let step = fa2.step_s(&fa2.base);
        let share = fa2.flash_attention_2_s(&fa2.base).unwrap();
        assert!(
            share > 0.01 * step && share < 0.5 * step,
            "{share} of {step}"
        );
    }

    /// MFU is the model's FLOPs at the GPU's dense peak over the step: 100 % of a step as long
    /// as the peak would take, half of one twice as long; a real step lies below 100 %.
    #[test]
    fn mfu_is_the_peak_time_over_the_step() {
        let p = prepared(&llama_run(2, "s", "f", tp(1)));
        assert!((p.mfu_percent(p.peak_seconds) - 100.0).abs() < 1e-9);
        assert!((p.mfu_percent(2.0 * p.peak_seconds) - 50.0).abs() < 1e-9);
        let raw = p.mfu_percent(p.step_s(&p.base));
        assert!(raw > 10.0 && raw < 100.0, "{raw}");
    }

    /// The JSON names a run's time scope only where it is not the whole step.
    #[test]
    fn a_result_names_its_time_scope_only_when_not_the_step() {
        let mut r = run(1.0, Some(1.0));
        let json = serde_json::to_value(&r).unwrap();
        assert!(json.get("time_scope").is_none(), "{json}");
        r.time_scope = runs::TimeScope::ForwardBackward;
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["time_scope"], "forward_backward");
    }

    /// A memory measurement in the allocator's scope is compared without the communicators'
    /// buffers, one of the whole device with them; a run timed without its update is
    /// projected without the optimizer's states.
    #[test]
    fn memory_is_compared_in_the_measurement_s_scope() {
        let cluster = crate::hardware::dgx_h100_without_models();
        let mut run = llama_run(2, "s", "f", tp(2));
        let arch = Arch::resolve(&run.model).unwrap();
        let layout = Layout::new(&run.spec, &arch, &cluster).unwrap();
        let plan = Plan::new(&arch, &layout, &cluster);
        let report = crate::memory::project(&arch, &layout, &cluster, &plan);
        let communicators = crate::memory::overheads(&layout, &cluster).1;
        assert!(communicators > 0.0);
        let whole = report.peak().total_gib;
        for (scope, comparable) in [
            (runs::MemoryScope::Allocator, whole - communicators),
            (runs::MemoryScope::Device, whole),
        ] {
            run.measured_memory = Some(runs::MeasuredMemory { gib: 30.0, scope });
            let m = prepared(&run).memory;
            assert_eq!(m.projected_gib, whole);
            assert_eq!((m.measured_gib, m.scope), (Some(30.0), Some(scope)));
            assert!((m.comparable_gib.unwrap() - comparable).abs() < 1e-12);
        }
        run.time_scope = runs::TimeScope::ForwardBackward;
        run.measured_memory = None;
        let m = prepared(&run).memory;
        assert_eq!(m.projected_gib, report.without_optimizer().0);
        assert!(m.projected_gib < whole);
        assert_eq!((m.measured_gib, m.comparable_gib), (None, None));
    }

    /// `evaluate` with set `a` fitted (two families, a run of each, both 10 % slower than
    /// the raw physics) and set `b` held out (one run of FlashAttention-2, which they do not
    /// use, at a sequence eight times theirs), and a run of `a` that could not be planned.
    #[test]
    fn evaluate_fits_one_set_cross_validates_its_families_and_holds_the_other_out() {
        let mut runs = two_of_a_and_one_of_b(ParallelSpec {
            seq_len: Some(8192),
            ..tp(1)
        });
        let mut prepared = prepared_measured(&mut runs, 1.1);
        runs.push(Run {
            not_expressible: Some("not this one".into()),
            ..llama_run(5, "a", "f0", tp(1))
        });
        let not_predicted = [(3, "not this one".to_string())];
        let report = evaluate(&runs, &mut prepared, &not_predicted, &["a".to_string()]);
        // each set weighs the same whatever its rows
        let weights: Vec<f64> = prepared.iter().map(|p| p.weight).collect();
        assert_eq!(weights, [0.5, 0.5, 1.0]);
        let raw = prepared[0].base;
        assert_eq!(report.raw_runtime, raw);
        // fitted on a's two runs; each of its families predicted by a fit of the other
        assert_eq!(report.fitted.runs, 2);
        let fitted = report.fitted.runtime;
        let alone = |i: usize| fit(&[&prepared[i]], raw).runtime;
        let lines: Vec<usize> = report.runs.iter().map(|r| r.line).collect();
        assert_eq!(lines, [2, 3, 4, 5]);
        for (i, other) in [(0, 1), (1, 0)] {
            let (r, p) = (&report.runs[i], &prepared[i]);
            let cv = p.step_s(&alone(other));
            assert_eq!(r.cross_validated_s, Some(cv));
            assert_eq!(r.raw_s, Some(p.step_s(&raw)));
            assert_eq!(r.fitted_s, Some(p.step_s(&fitted)));
            assert_eq!(
                r.mfu_percent,
                Some([p.mfu_percent(p.step_s(&raw)), p.mfu_percent(cv)])
            );
            assert_eq!(r.raw_flash_attention_2_s, None);
            assert_eq!(r.dtype.as_deref(), Some("bf16"));
            assert!(r.beyond_fitted_runs.is_empty());
            assert_eq!(
                r.memory.map(|m| m.projected_gib),
                Some(p.memory.projected_gib)
            );
        }
        // the fit moved the runtime towards runs 10 % slower than the raw physics
        assert!(report.runs[0].fitted_s > report.runs[0].raw_s);
        // b held out: predicted with the runtime fitted on a, beyond a's sequences
        let held = &report.runs[2];
        assert_eq!(held.cross_validated_s, Some(prepared[2].step_s(&fitted)));
        assert_eq!(held.cross_validated_s, held.fitted_s);
        assert!(held.raw_flash_attention_2_s.is_some_and(|s| s > 0.0));
        // beyond the fitted runs' sequences, and the runs made no FlashAttention-2 calls
        assert_eq!(
            held.beyond_fitted_runs.len(),
            2,
            "{:?}",
            held.beyond_fitted_runs
        );
        let unplanned = &report.runs[3];
        assert_eq!(unplanned.not_predicted.as_deref(), Some("not this one"));
        assert_eq!((unplanned.raw_s, unplanned.memory.is_none()), (None, true));
        // the sets
        let (a, b) = (&report.sets["a"], &report.sets["b"]);
        assert!(a.fitted && !b.fitted);
        assert_eq!((a.rows, a.expressible, a.predicted), (3, 2, 2));
        assert_eq!((b.rows, b.expressible, b.predicted), (1, 1, 1));
        assert_eq!((a.beyond_fitted_runs, b.beyond_fitted_runs), (0, 1));
        assert!(
            (a.raw.bias_percent + 100.0 / 11.0).abs() < 1e-9,
            "{:?}",
            a.raw
        );
        assert_eq!(a.cross_validated.runs, 2);
        let max_raw_mfu = report.runs[..2]
            .iter()
            .map(|r| r.mfu_percent.unwrap()[0])
            .fold(0.0, f64::max);
        assert_eq!(a.max_mfu_percent[0], max_raw_mfu);
        // overall covers the fitted set only; the interval's spread is its CV error's
        assert_eq!(report.overall.map(|s| s.runs), [2, 2, 2]);
        assert_eq!(
            report.interval_sigma_log,
            crate::hardware::spread(&report.overall[2])
        );
        let by_dtype: Vec<(&String, usize)> = report
            .cross_validated_by_dtype
            .iter()
            .map(|(d, s)| (d, s.runs))
            .collect();
        assert_eq!(by_dtype, [(&"bf16".to_string(), 2)]);
        assert_eq!(report.fitted_range.map(|r| r.seq_len), Some([1024, 1024]));
        // every parameter the fit left at a bound is refitted at its default
        let held_names: Vec<&str> = report.held_at_default.iter().map(|h| h.parameter).collect();
        assert_eq!(held_names, report.fitted.at_bound);
        for h in &report.held_at_default {
            let i = PARAMETERS
                .iter()
                .position(|p| p.name == h.parameter)
                .unwrap();
            assert_eq!((h.fitted, h.default), (fitted.values()[i], raw.values()[i]));
            assert_eq!(h.refit.values()[i], raw.values()[i]);
        }
    }

    /// With one family among the fit runs there is nothing to cross-validate it with; with no
    /// set named every set is fitted.
    #[test]
    fn a_lone_family_has_no_cross_validation() {
        let mut runs = vec![llama_run(2, "a", "f", tp(1)), llama_run(3, "b", "f", tp(2))];
        let mut prepared = prepared_measured(&mut runs, 1.3);
        let report = evaluate(&runs, &mut prepared, &[], &[]);
        assert!(report.sets.values().all(|s| s.fitted));
        assert_eq!(report.fitted.runs, 2);
        assert!(report.runs.iter().all(|r| r.cross_validated_s.is_none()));
        assert_eq!(report.overall.map(|s| s.runs), [2, 2, 0]);
        // the interval's spread is then the in-sample error's
        assert!(report.overall[1].mean_abs_percent > 0.0);
        assert_eq!(
            report.interval_sigma_log,
            crate::hardware::spread(&report.overall[1])
        );
    }

    /// `check` composes each run under the runtime `predict` would use for it now, beside
    /// the raw physics: a set is in sample where that runtime was fitted on it, the spread of
    /// a run's training type stands in for the runtime's own, and only a run out of sample
    /// is judged against the fitted runs' range.
    #[test]
    fn check_judges_each_run_under_its_current_runtime() {
        let mut runs = two_of_a_and_one_of_b(tp(4));
        let mut prepared = prepared_measured(&mut runs, 1.0);
        let raw = prepared[0].base;
        let calibrated = Runtime {
            step_overhead_ms: raw.step_overhead_ms + 20.0,
            ..raw
        };
        // runs 5 % slower than calibrated: inside exp(±1.28 × 0.05), outside ±1.28 × 0.03
        for p in prepared.iter_mut() {
            p.measured_s = 1.05 * p.step_s(&calibrated);
            runs[p.index].measured_s = p.measured_s;
        }
        runs.push(llama_run(5, "b", "g", tp(8)));
        // run 2 reported 25 GiB where 20 are projected; run 4 is projected not to fit
        prepared[0].memory.measured_gib = Some(25.0);
        prepared[0].memory.comparable_gib = Some(20.0);
        prepared[2].memory.verdict = crate::memory::Verdict::Oom;
        // the calibration's range holds run 2's point only: run 3 lies beyond it in sample
        let range = FittedRange::of(&[prepared[0].point.clone()]);
        let fitted_on_a = Current {
            runtime: calibrated,
            sigma_log: Some(0.05),
            sigma_log_by_dtype: BTreeMap::from([("bf16".to_string(), 0.03)]),
            summary: Some("calibrated on a".into()),
            fitted_sets: vec!["a".into()],
            range: range.clone(),
        };
        // the same runtime named otherwise (borrowed by another cluster, say) and without a
        // spread: a runtime of its own in the check's list
        let borrowed = Current {
            sigma_log: None,
            sigma_log_by_dtype: BTreeMap::new(),
            summary: Some("borrowed".into()),
            fitted_sets: Vec::new(),
            ..fitted_on_a.clone()
        };
        let current = |p: &Prepared| {
            if runs[p.index].set == "a" {
                &fitted_on_a
            } else {
                &borrowed
            }
        };
        let checked = check(&runs, &prepared, &[(3, "no".into())], &current);
        assert!(checked.check);
        let counts: Vec<(Option<&str>, usize)> = checked
            .runtimes
            .iter()
            .map(|c| (c.current.summary.as_deref(), c.runs))
            .collect();
        assert_eq!(
            counts,
            [(Some("calibrated on a"), 2), (Some("borrowed"), 1)]
        );
        let lines: Vec<usize> = checked.runs.iter().map(|r| r.line).collect();
        assert_eq!(lines, [2, 3, 4, 5]);
        for (r, p) in checked.runs.iter().zip(&prepared) {
            let (raw_s, now_s) = (p.step_s(&raw), p.step_s(&calibrated));
            assert_eq!((r.raw_s, r.cross_validated_s), (Some(raw_s), Some(now_s)));
            assert_eq!(
                r.mfu_percent,
                Some([p.mfu_percent(raw_s), p.mfu_percent(now_s)])
            );
            assert_eq!(r.raw_flash_attention_2_s, p.flash_attention_2_s(&raw));
            assert_eq!(r.dtype.as_deref(), Some("bf16"));
            assert!(r.memory.is_some());
        }
        assert!(checked.runs[0].cross_validated_s > checked.runs[0].raw_s);
        // in sample: no run of a is judged against the range, though run 3 lies beyond it
        assert!(checked.runs[..2]
            .iter()
            .all(|r| r.beyond_fitted_runs.is_empty()));
        assert!(!checked.runs[2].beyond_fitted_runs.is_empty());
        assert!(checked.runs[2].raw_flash_attention_2_s.is_some());
        assert_eq!(checked.runs[3].not_predicted.as_deref(), Some("no"));
        let (a, b) = (&checked.sets["a"], &checked.sets["b"]);
        assert!(a.fitted && !b.fitted);
        assert_eq!((b.rows, b.predicted, b.beyond_fitted_runs), (2, 1, 1));
        assert_eq!((a.projected_oom, b.projected_oom), (0, 1));
        assert_eq!((a.memory.runs, b.memory.runs), (1, 0));
        assert!((a.memory.bias_percent + 20.0).abs() < 1e-9);
        // bf16's own spread, 0.03, not the calibration's 0.05: the runs lie outside
        assert_eq!(a.inside_interval_percent, Some(0.0));
        // no spread: run 4, beyond the range, is judged by the extrapolation band alone
        assert_eq!(b.inside_interval_percent, Some(100.0));
        assert!((a.cross_validated.bias_percent + 100.0 / 21.0).abs() < 1e-9);
        assert_eq!(checked.overall.map(|s| s.runs), [3, 3]);
    }

    fn run(measured_s: f64, cross_validated_s: Option<f64>) -> RunResult {
        RunResult {
            line: 2,
            set: "s".into(),
            family: "f".into(),
            label: "r".into(),
            measured_s,
            dtype: None,
            time_scope: runs::TimeScope::Step,
            raw_s: cross_validated_s,
            raw_flash_attention_2_s: None,
            fitted_s: cross_validated_s,
            cross_validated_s,
            mfu_percent: None,
            memory: None,
            not_predicted: None,
            beyond_fitted_runs: Vec::new(),
        }
    }

    #[test]
    fn the_interval_holds_the_runs_within_its_spread() {
        // σ 10 %: the band is exp(±0.128); 1.10 and 1/1.12 lie inside, 1.2 and 0.8 outside
        let runs = [
            run(1.0, Some(1.10)),
            run(1.0, Some(1.0 / 1.12)),
            run(1.0, Some(1.2)),
            run(1.0, Some(0.8)),
            run(1.0, None),
        ];
        let refs: Vec<&RunResult> = runs.iter().collect();
        assert_eq!(inside_interval(&refs, &|_| Some(0.1)), Some(50.0));
        assert_eq!(inside_interval(&refs[4..], &|_| Some(0.1)), None);
        // a run without a spread (composed under the defaults) is left out
        assert_eq!(
            inside_interval(&refs, &|r| (r.cross_validated_s != Some(1.2))
                .then_some(0.1)),
            Some(100.0 * 2.0 / 3.0)
        );
    }

    #[test]
    fn a_run_beyond_the_runs_fitted_on_is_judged_by_the_extrapolation_band() {
        // 30 % slower than predicted: outside exp(±1.28 × 0.02), inside the band once the
        // run lies beyond the fitted runs; 10 % faster stays outside either way
        let (low, high) = crate::predict::EXTRAPOLATION_BAND;
        assert!(low > 1.0 / 1.1 && high > 1.3);
        let mut slow = run(1.3, Some(1.0));
        let mut fast = run(1.0, Some(1.1));
        let spread = |_: &RunResult| Some(0.02);
        assert_eq!(inside_interval(&[&slow, &fast], &spread), Some(0.0));
        for r in [&mut slow, &mut fast] {
            r.beyond_fitted_runs = vec!["ep 8 (runs: at most 1)".into()];
        }
        assert_eq!(inside_interval(&[&slow, &fast], &spread), Some(50.0));
    }
}

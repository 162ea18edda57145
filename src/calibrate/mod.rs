//! `stepcast calibrate`: the runtime's few physical parameters (`hardware::Runtime`) fitted to
//! measured training steps, bounded and cross-validated by model family, and the error on
//! those runs reported per source set, raw and calibrated side by side.
//!
//! Every run is planned and costed once (`Prepared`); a candidate runtime only recomposes the
//! step from the cached isolated estimates, so a fit over a thousand runs takes seconds.

pub mod fit;
pub mod megatron_log;
pub mod runs;

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

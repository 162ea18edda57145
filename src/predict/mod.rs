//! `stepcast predict`: a model, a cluster and a parallel layout → the plan (`crate::plan`) → a
//! cost and its source per distinct operator query (`cost`) → one step (`compose` for the
//! paper's closed form, `pipeline` + `crate::schedule` for the simulated schedules), with a
//! breakdown, an 80 % interval from the per-model uncertainties along the step's critical path,
//! the step's metrics, and every call that lay outside what its model was trained on.

#![warn(missing_docs)]

pub mod compose;
pub mod cost;
pub mod metrics;
pub mod pipeline;

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::analytic::alignment;
use crate::error::{Error, Result};
use crate::hardware::{Cluster, RunPoint, Runtime};
use crate::plan::{Call, Plan, StageRole};
use crate::schedule::{simulate_with, PipelineWork, Timeline, Unobserved};
use crate::timing::{Breakdown, Class};
use crate::workload::{Arch, Layout, Rules, Schedule};
use compose::{one_f_one_b, QueryTimes, Step};
use cost::{CostModel, Estimate, Source};
pub use metrics::StepMetrics;

/// z of a two-sided 80 % interval.
pub const Z80: f64 = 1.2816;

/// Where a step lies outside the runs its calibration was fitted on, how published steps
/// compared with such predictions: percentiles of measured / predicted step time over the
/// held-out runs beyond their calibration's range (six sets, 176 runs, each set weighing the
/// same: `scripts/eval-real-runs.py`), the 7th and 93rd — the narrowest pair at which each
/// set, left out, falls inside the other five's band 80 % of the time on average (82 %; the
/// 10th and 90th, 0.95–1.40, held 73 %: a step beyond the runs is unlike any of them, so the
/// band must hold a set it never saw). A calibration's cross-validated error was measured
/// inside its runs' range; beyond it, this band replaces the runtime's ±1.28σ on each side
/// where it is wider — mostly upwards, as such steps mostly ran slower than predicted.
pub const EXTRAPOLATION_BAND: (f64, f64) = (0.94, 1.49);
/// The median of the same ratios.
pub const EXTRAPOLATION_MEDIAN: f64 = 1.06;

/// The runtime's part of a step's 80 % interval as low and high multipliers of the step:
/// exp(±1.28σ) of its spread on measured runs, widened to `EXTRAPOLATION_BAND` where the step
/// lies outside the runs its calibration was fitted on; none where neither applies.
pub fn runtime_band(sigma_log: Option<f64>, extrapolating: bool) -> Option<(f64, f64)> {
    let spread = sigma_log
        .filter(|s| *s > 0.0)
        .map(|s| ((-Z80 * s).exp(), (Z80 * s).exp()));
    match (spread, extrapolating) {
        (Some((low, high)), true) => Some((
            low.min(EXTRAPOLATION_BAND.0),
            high.max(EXTRAPOLATION_BAND.1),
        )),
        (None, true) => Some(EXTRAPOLATION_BAND),
        (spread, false) => spread,
    }
}

/// How a prediction may answer.
#[derive(Debug, Clone, Copy, Default)]
pub struct PredictOptions {
    /// Refuse estimates no trained model backs (roofline, uncalibrated analytic).
    pub strict: bool,
}

/// One distinct call of a stage with its estimate.
#[derive(Debug, Clone, Serialize)]
pub struct OperatorReport {
    /// What the call is in the model.
    pub label: &'static str,
    /// The operator query, as text.
    pub query: String,
    /// What its time counts as.
    pub class: Class,
    /// Calls per micro-batch (forward/backward lists) or per step (sync and update lists).
    pub count: f64,
    /// Its cost and where the number came from.
    pub estimate: Estimate,
    /// The host waits for the device before issuing it (`plan::Call::host_waits`).
    pub host_waits: bool,
    /// How the host issues it: one by one, or inside a CUDA graph (`plan::Issue`).
    #[serde(skip_serializing_if = "crate::plan::Issue::is_eager")]
    pub issue: crate::plan::Issue,
}

/// One pipeline rank's share of the step.
#[derive(Debug, Clone, Serialize)]
pub struct StageReport {
    /// Pipeline rank.
    pub index: usize,
    /// What it holds besides layers.
    pub role: StageRole,
    /// Transformer layers on the rank.
    pub layers: u64,
    /// Parameters on one GPU of the rank.
    pub params: u64,
    /// One micro-batch's forward, ms.
    pub fwd_ms: f64,
    /// One micro-batch's backward (recomputation included), ms.
    pub bwd_ms: f64,
    /// Gradient reduction per step, ms.
    pub grad_sync_ms: f64,
    /// Optimizer step per step, ms.
    pub optimizer_ms: f64,
    /// Parameter all-gather per step, ms.
    pub param_gather_ms: f64,
    /// The forward's calls.
    pub fwd: Vec<OperatorReport>,
    /// The backward's calls.
    pub bwd: Vec<OperatorReport>,
    /// The gradient reduction's calls.
    pub grad_sync: Vec<OperatorReport>,
    /// The optimizer step's and all-gather's calls.
    pub update: Vec<OperatorReport>,
}

/// A predicted step with everything that explains it.
#[derive(Debug, Clone, Serialize)]
pub struct Prediction {
    /// Cluster name.
    pub cluster: String,
    /// GPU name.
    pub gpu: String,
    /// Model name.
    pub model: String,
    /// Models directory used (none: roofline and analytic only).
    pub models_dir: Option<String>,
    /// The runtime the step was composed under (host, in-situ efficiency, contention, per-step
    /// overhead).
    pub runtime: Runtime,
    /// How that runtime was calibrated; none: the cluster's defaults (raw physics).
    pub calibration: Option<String>,
    /// The calibration's error on the runs of each source set it was not fitted on (held out
    /// whole): how far it carries to software unlike its own runs'.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub calibration_held_out: BTreeMap<String, crate::stats::ErrorStats>,
    /// The checked layout.
    pub layout: Layout,
    /// The step and what follows from it.
    #[serde(flatten)]
    pub metrics: StepMetrics,
    /// 80 % interval of the step time.
    pub interval_s: [f64; 2],
    /// How the interval was found.
    pub interval_method: IntervalMethod,
    /// The runtime's spread on measured runs (σ of ln(predicted / measured): the calibration's
    /// cross-validated error, or under `--no-calibration` the raw physics' on the same runs),
    /// included in the interval; none where no runs measured it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval_runtime_sigma_log: Option<f64>,
    /// Where the step lies outside the runs its calibration was fitted on, the runtime's part of
    /// the interval as low and high multipliers of the step: exp(±1.28σ) widened to the band
    /// held-out published runs beyond their calibration's range showed (`EXTRAPOLATION_BAND`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval_extrapolation_band: Option<[f64; 2]>,
    /// What the step spends its time on, seconds; the parts add up to the step.
    pub breakdown_s: Breakdown,
    /// The pipeline schedule the step was composed with.
    pub schedule: &'static str,
    /// Share of the summed operator time each source produced, in percent.
    pub sources_percent: BTreeMap<&'static str, f64>,
    /// Per pipeline rank, its share of the step.
    pub stages: Vec<StageReport>,
    /// What each GPU holds at its peak, and whether it fits.
    pub memory: crate::memory::MemoryReport,
    /// Calls whose features lay outside their model's training range.
    pub out_of_coverage: Vec<String>,
    /// What to be careful about.
    pub warnings: Vec<String>,
    /// What the simulator was given and what it found (none for the closed form): re-simulate
    /// it with an observer for a trace or a chart.
    #[serde(skip)]
    pub timeline: Option<(PipelineWork, Timeline)>,
}

/// Every distinct query of a plan costed once, with the cost factors (models) they count
/// toward and each factor's uncertainty.
pub struct Costed {
    /// One estimate per query of the plan.
    pub estimates: Vec<Estimate>,
    /// The queries' times and factors, for composing.
    pub times: QueryTimes,
    /// Standard deviation of ln(actual / predicted) of each factor.
    pub sigma_log: Vec<f64>,
    /// A factor's measured 80 % band of actual / predicted, where one replaces ±1.28σ (the
    /// roofline's: `cost::ROOFLINE_BAND`).
    pub band: Vec<Option<(f64, f64)>>,
}

/// The runtime steps under `rules` are composed under: the cost model's (calibrated or
/// default), or the isolated-kernel sum the paper's rules define.
pub fn runtime_for(rules: Rules, cost: &CostModel) -> Runtime {
    if rules == Rules::Paper {
        Runtime::isolated()
    } else {
        cost.runtime()
    }
}

/// How that runtime was calibrated (none: the cluster's defaults, or the paper's rules, which
/// compose no runtime of their own).
pub fn calibration_for(rules: Rules, cost: &CostModel) -> Option<String> {
    (rules != Rules::Paper)
        .then(|| cost.calibration_summary().map(str::to_string))
        .flatten()
}

/// The calibration's error on the sets it was not fitted on, where a calibration applies.
pub fn calibration_held_out_for(
    rules: Rules,
    cost: &CostModel,
) -> BTreeMap<String, crate::stats::ErrorStats> {
    if rules == Rules::Paper {
        BTreeMap::new()
    } else {
        cost.calibration_held_out().clone()
    }
}

/// Costs every query of `plan` and composes under `runtime`; with `attribute`, compositions
/// keep each factor's share.
pub fn estimate(
    plan: &Plan,
    cost: &CostModel,
    attribute: bool,
    runtime: Runtime,
) -> Result<Costed> {
    let estimates: Vec<Estimate> = plan
        .queries
        .iter()
        .map(|q| cost.estimate(q))
        .collect::<Result<_>>()?;
    let mut index: HashMap<&str, u32> = HashMap::new();
    let mut sigma_log: Vec<f64> = Vec::new();
    let mut band: Vec<Option<(f64, f64)>> = Vec::new();
    let factor: Vec<u32> = estimates
        .iter()
        .map(|e| {
            let f = *index.entry(e.model.as_str()).or_insert_with(|| {
                sigma_log.push(0.0);
                band.push(None);
                (sigma_log.len() - 1) as u32
            });
            sigma_log[f as usize] = sigma_log[f as usize].max(e.sigma_log);
            if e.source == Source::Roofline {
                band[f as usize] = Some(cost::ROOFLINE_BAND);
            }
            f
        })
        .collect();
    let isolated: Vec<f64> = estimates.iter().map(|e| e.time_us).collect();
    Ok(Costed {
        times: QueryTimes::new(plan, &isolated, factor, sigma_log.len(), attribute, runtime),
        estimates,
        sigma_log,
        band,
    })
}

/// One step composed with the layout's schedule: the paper's closed form, or the event
/// simulator (whose input and timeline come along).
pub fn compose_step(
    plan: &Plan,
    layout: &Layout,
    times: &QueryTimes,
) -> Result<(Step, Option<(PipelineWork, Timeline)>)> {
    let work = pipeline::pipeline_work(plan, layout, times);
    if layout.schedule == Schedule::ClosedForm {
        let stages = pipeline::stage_timings(&work);
        return Ok((one_f_one_b(stages, layout.micro_batches, times), None));
    }
    // the critical path is only needed where the interval will not recompose the step
    let keep_path = times.attribute && work.passes() * 2 * times.factors > EXACT_INTERVAL_PASSES;
    let timeline = simulate_with(&work, &mut Unobserved, keep_path)?;
    let step = Step {
        step_us: timeline.step_us,
        breakdown_us: timeline.breakdown,
        critical_path: timeline.critical_path.clone(),
        stages: pipeline::stage_timings(&work),
    };
    Ok((step, Some((work, timeline))))
}

/// Predicts one step of `arch` under `layout` on `cluster`.
pub fn predict(
    arch: &Arch,
    layout: &Layout,
    cluster: &Cluster,
    cost: &CostModel,
    options: PredictOptions,
) -> Result<Prediction> {
    let plan = Plan::new(arch, layout, cluster);
    let memory = crate::memory::project(arch, layout, cluster, &plan);
    let costed = estimate(&plan, cost, true, runtime_for(layout.rules, cost))?;
    if options.strict {
        refuse_unbacked(&plan, &costed.estimates)?;
    }
    let (step, timeline) = compose_step(&plan, layout, &costed.times)?;
    let (low, high, interval_method) =
        interval(&costed, layout, &step, timeline.as_ref().map(|(w, _)| w))?;
    let runtime_sigma_log = (layout.rules != Rules::Paper)
        .then(|| cost.runtime_sigma_log_for(layout.dtype.name()))
        .flatten();
    let beyond = beyond_calibration(arch, layout, cluster, cost);
    let extrapolating = beyond.is_some();
    let band = runtime_band(runtime_sigma_log, extrapolating);
    let (low, high) = with_runtime_spread(step.step_us, low, high, band);
    let b = step.breakdown_us;
    Ok(Prediction {
        cluster: cluster.spec.name.clone(),
        gpu: cluster.spec.gpu.name.clone(),
        model: arch.name.clone(),
        models_dir: cost.models().map(|m| m.dir.display().to_string()),
        runtime: runtime_for(layout.rules, cost),
        calibration: calibration_for(layout.rules, cost),
        calibration_held_out: calibration_held_out_for(layout.rules, cost),
        layout: layout.clone(),
        metrics: StepMetrics::new(step.step_us, &b, &plan, layout, cluster),
        interval_s: [low / 1e6, high / 1e6],
        interval_method,
        interval_runtime_sigma_log: runtime_sigma_log,
        interval_extrapolation_band: band
            .filter(|_| extrapolating)
            .map(|(low, high)| [low, high]),
        schedule: layout.schedule.name(),
        breakdown_s: b.scaled(1e-6),
        sources_percent: sources(&plan, layout, &costed.estimates),
        stages: stage_reports(&plan, &step, &costed.estimates),
        memory,
        out_of_coverage: out_of_coverage(&plan, &costed.estimates),
        warnings: warnings(&plan, layout, cluster, cost, &costed.estimates, beyond),
        timeline,
    })
}

/// Where a run of `arch` under `layout` on `cluster` lies in the dimensions a calibration's
/// fit depends on.
pub fn run_point(arch: &Arch, layout: &Layout, cluster: &Cluster) -> RunPoint {
    RunPoint {
        gpus: layout.world,
        nodes: layout
            .world
            .div_ceil(u64::from(cluster.spec.gpus_per_node).max(1)),
        params: arch.total_params(),
        seq_len: layout.seq_len,
        tp: layout.tp,
        pp: layout.pp,
        cp: layout.cp,
        ep: layout.ep,
        dtype: layout.dtype.to_string(),
        cuda_graphs: !layout.cuda_graphs.is_empty(),
        flash_attention_2: layout.attention_kernel
            == crate::workload::AttentionKernel::FlashAttention2,
    }
}

/// A warning where the prediction lies outside the runs its calibration was fitted on: the
/// fit's cross-validated error was measured on those runs, not on this one.
pub fn beyond_calibration(
    arch: &Arch,
    layout: &Layout,
    cluster: &Cluster,
    cost: &CostModel,
) -> Option<String> {
    if layout.rules == Rules::Paper {
        return None;
    }
    let outside = cost
        .calibration_range()?
        .outside(&run_point(arch, layout, cluster));
    (!outside.is_empty()).then(|| {
        format!(
            "outside the runs the runtime was calibrated on: {}; its cross-validated error \
             was measured on those runs, not on this one (`--no-calibration` shows the raw \
             physics)",
            outside.join(", ")
        )
    })
}

/// With `--strict`, an error naming every query no trained model backs.
fn refuse_unbacked(plan: &Plan, estimates: &[Estimate]) -> Result<()> {
    let mut missing: Vec<String> = plan
        .queries
        .iter()
        .zip(estimates)
        .filter(|(_, e)| {
            matches!(e.source, Source::Roofline | Source::Analytic) || e.floored_from_us.is_some()
        })
        .map(|(q, e)| {
            let why = if e.floored_from_us.is_some() {
                "raised to the physical floor"
            } else {
                e.source.name()
            };
            format!("{q} ({why})")
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    missing.sort();
    let shown = missing.len().min(5);
    let more = if missing.len() > shown {
        format!(
            "; and {} more (see `--operators` without --strict)",
            missing.len() - shown
        )
    } else {
        String::new()
    };
    Err(Error::MissingModel(format!(
        "--strict: no trained model for {} call(s): {}{more}: train models for them \
         (`stepcast bench collect`, `stepcast train`) or drop --strict",
        missing.len(),
        missing[..shown].join("; ")
    )))
}

/// Most passes the interval re-simulates in all (2 per model): beyond, it moves the models
/// along the step's critical path instead.
const EXACT_INTERVAL_PASSES: usize = 500_000;

/// How an interval was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum IntervalMethod {
    /// Every model moved by ±1.28σ and the step composed again.
    Recomposed,
    /// Every model moved by ±1.28σ along the step's critical path (first order: exact unless
    /// the move changes which path is critical); for steps with very many passes.
    CriticalPath,
}

/// 80 % interval of the step: the errors of one model are taken as fully correlated over all
/// its calls (a model that is 5 % slow is slow everywhere), different models as independent.
/// Each model is moved by ±1.28σ on its own — the step recomposed with only that model's
/// share of every duration scaled (closed form, or a re-simulation of the same schedule) —
/// and the step's moves are added in quadrature.
fn interval(
    costed: &Costed,
    layout: &Layout,
    step: &Step,
    work: Option<&PipelineWork>,
) -> Result<(f64, f64, IntervalMethod)> {
    // each factor's low and high multiplier: its measured band, or ±1.28σ
    let moving: Vec<(u32, [f64; 2])> = (0..costed.times.factors as u32)
        .zip(costed.sigma_log.iter().copied())
        .zip(costed.band.iter().copied())
        .filter_map(|((f, sigma), band)| match band {
            Some((low, high)) => Some((f, [low.min(1.0), high.max(1.0)])),
            None if sigma > 0.0 => Some((f, [(-Z80 * sigma).exp(), (Z80 * sigma).exp()])),
            None => None,
        })
        .collect();
    let exact = work.is_none_or(|w| w.passes() * 2 * moving.len() <= EXACT_INTERVAL_PASSES);
    let method = if exact {
        IntervalMethod::Recomposed
    } else {
        IntervalMethod::CriticalPath
    };
    let moved = |factor: u32, k: f64| -> Result<f64> {
        Ok(match (work, &step.critical_path) {
            (None, _) => compose::one_f_one_b_moved(&step.stages, layout.micro_batches, factor, k),
            (Some(w), _) if exact => crate::schedule::simulate(&w.moved(factor, k))?.step_us,
            (Some(_), Some(path)) => step.step_us + (k - 1.0) * path[factor as usize],
            (Some(_), None) => step.step_us,
        })
    };
    let (mut down, mut up) = (0.0f64, 0.0f64);
    for (factor, [low, high]) in moving {
        for (k, acc) in [(low, &mut down), (high, &mut up)] {
            *acc += (moved(factor, k)? - step.step_us).powi(2);
        }
    }
    Ok((step.step_us - down.sqrt(), step.step_us + up.sqrt(), method))
}

/// The operator models' interval widened by the runtime's part (`runtime_band`: its low and
/// high multipliers of the step): what the runtime leaves unexplained (host, overlap, clocks)
/// is independent of the operator models' errors, so the two 80 % half-widths add in
/// quadrature on each side — in log space, where both errors live (ln(actual / predicted)), so
/// the low end stays above zero however wide.
fn with_runtime_spread(step_us: f64, low: f64, high: f64, band: Option<(f64, f64)>) -> (f64, f64) {
    let Some((band_low, band_high)) = band else {
        return (low, high);
    };
    let down = (step_us / low.max(f64::MIN_POSITIVE)).ln().max(0.0);
    let up = (high / step_us).ln().max(0.0);
    let (spread_down, spread_up) = (
        -band_low.clamp(f64::MIN_POSITIVE, 1.0).ln(),
        band_high.max(1.0).ln(),
    );
    (
        step_us * (-down.hypot(spread_down)).exp(),
        step_us * up.hypot(spread_up).exp(),
    )
}

/// Every stage's forward and backward per micro-batch, and its per-step work.
fn stage_calls<'a>(plan: &'a Plan, s: &'a crate::plan::Stage) -> [(Vec<(&'a Call, f64)>, bool); 4] {
    [
        (plan.stage_fwd(s).collect(), true),
        (plan.stage_bwd(s).collect(), true),
        (s.grad_sync.iter().map(|c| (c, 1.0)).collect(), false),
        (s.update.iter().map(|c| (c, 1.0)).collect(), false),
    ]
}

/// Share of the summed operator time each source produced, in percent.
fn sources(plan: &Plan, layout: &Layout, estimates: &[Estimate]) -> BTreeMap<&'static str, f64> {
    let mut out: BTreeMap<&'static str, f64> = BTreeMap::new();
    let mut total = 0.0;
    for s in &plan.stages {
        for (calls, per_micro_batch) in stage_calls(plan, s) {
            let per = if per_micro_batch {
                layout.micro_batches as f64
            } else {
                1.0
            };
            for (call, n) in calls {
                let e = &estimates[call.query as usize];
                let t = e.time_us * call.count * n * per;
                *out.entry(e.source.name()).or_default() += t;
                total += t;
            }
        }
    }
    for v in out.values_mut() {
        *v *= 100.0 / total.max(f64::MIN_POSITIVE);
    }
    out
}

fn stage_reports(plan: &Plan, step: &Step, estimates: &[Estimate]) -> Vec<StageReport> {
    let report = |calls: Vec<(&Call, f64)>| -> Vec<OperatorReport> {
        calls
            .into_iter()
            .map(|(c, n)| OperatorReport {
                label: c.label,
                query: plan.query(c).to_string(),
                class: c.class,
                count: c.count * n,
                estimate: estimates[c.query as usize].clone(),
                host_waits: c.host_waits,
                issue: c.issue,
            })
            .collect()
    };
    plan.stages
        .iter()
        .zip(&step.stages)
        .map(|(s, t)| {
            let [fwd, bwd, grad_sync, update] = stage_calls(plan, s).map(|(c, _)| report(c));
            StageReport {
                index: s.index,
                role: s.role,
                layers: s.layers,
                params: s.params,
                fwd_ms: t.fwd_us / 1e3,
                bwd_ms: t.bwd_us / 1e3,
                grad_sync_ms: t.grad_sync_us / 1e3,
                optimizer_ms: t.optimizer_us / 1e3,
                param_gather_ms: t.param_gather_us / 1e3,
                fwd,
                bwd,
                grad_sync,
                update,
            }
        })
        .collect()
}

fn out_of_coverage(plan: &Plan, estimates: &[Estimate]) -> Vec<String> {
    let mut out: Vec<String> = plan
        .queries
        .iter()
        .zip(estimates)
        .filter(|(_, e)| !e.out_of_coverage.is_empty())
        .map(|(q, e)| {
            format!(
                "{q}: {} outside the training range of {}",
                e.out_of_coverage.join(", "),
                e.model
            )
        })
        .collect();
    out.sort();
    out
}

/// What a prediction cannot vouch for; `beyond` is `beyond_calibration`'s warning, found once
/// by `predict` (it also widens the interval).
fn warnings(
    plan: &Plan,
    layout: &Layout,
    cluster: &Cluster,
    cost: &CostModel,
    estimates: &[Estimate],
    beyond: Option<String>,
) -> Vec<String> {
    let mut out: Vec<String> = plan
        .queries
        .iter()
        .zip(estimates)
        .filter_map(|(q, e)| Some((q, e, e.floored_from_us?)))
        .map(|(q, e, predicted)| {
            format!(
                "{q}: {} predicts {predicted:.1} µs, faster than the GPU can run it (outside its \
                 training range, or suspect data); raised to the physical floor, {:.1} µs \
                 (+{:.0} %)",
                e.model,
                e.time_us,
                100.0 * (e.time_us / predicted - 1.0)
            )
        })
        .collect();
    out.sort();
    out.extend(unaligned_gemms(plan, cluster));
    if let Some(set) = cost.models() {
        let trained_on = &set.gpu().name;
        if trained_on != &cluster.spec.gpu.name {
            out.push(format!(
                "models in {} were measured on {trained_on}; the cluster has {}",
                set.dir.display(),
                cluster.spec.gpu.name
            ));
        }
    }
    if layout.tp > cluster.spec.gpus_per_node as u64 {
        out.push(format!(
            "tp = {} spans nodes ({} GPUs per node): its all-reduces cross the network",
            layout.tp, cluster.spec.gpus_per_node
        ));
    }
    out.extend(beyond);
    out
}

/// The GEMM shapes whose operand rows are not 16-byte aligned (see `analytic::alignment`), in
/// one line: the slowdown is the user's to avoid, usually by padding the vocabulary.
fn unaligned_gemms(plan: &Plan, cluster: &Cluster) -> Option<String> {
    let unaligned = cluster.spec.achievable.gemm_unaligned();
    let mut slowed: Vec<(String, u64)> = plan
        .queries
        .iter()
        .filter_map(|q| {
            alignment::misaligned(q, unaligned).map(|(bytes, _)| (q.to_string(), bytes))
        })
        .collect();
    if slowed.is_empty() {
        return None;
    }
    slowed.sort();
    let shown: Vec<String> = slowed
        .iter()
        .take(2)
        .map(|(q, bytes)| format!("{q}: {bytes}-byte"))
        .collect();
    let more = match slowed.len() {
        n if n > 2 => format!(" and {} more", n - 2),
        _ => String::new(),
    };
    Some(format!(
        "{} GEMM shape(s) have operand rows that are not a multiple of 16 bytes ({}{more}): \
         costed at {:.0} % of the aligned speed at 2-byte alignment (achievable.gemm_unaligned); \
         padding the dimension to a multiple of 16 bytes (the vocabulary: vocab_divisible_by) \
         avoids it",
        slowed.len(),
        shown.join("; "),
        100.0 * unaligned
    ))
}

#[cfg(test)]
mod tests;

//! Layout search: every tp × cp × pp × dp × micro-batch × chunks × schedule × recompute × sequence
//! parallelism × ZeRO stage of a model on N GPUs at a global batch. A candidate that cannot run
//! is skipped by the rule `Layout::new` names (heads divisible by tp, layers ≥ pp, the global
//! batch divisible by micro-batch × dp, …: one rulebook); one that runs but is never worth it by
//! MoFa's pruning rules (§4.1: tp within a node, at least pp micro-batches, no FSDP with
//! pipeline stages; for context parallelism, no context shard under 1,024 tokens); for a
//! search for one framework, by what that framework cannot run as costed (what `export`
//! refuses); then by memory. The survivors are predicted in parallel and ranked by step
//! time or by end-to-end run time.

use std::collections::BTreeMap;
use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::export::{export, Framework, Target};
use crate::fault::{checkpoint_bytes, Reliability, RunInputs, RunOutcome, Storage};
use crate::hardware::{Cluster, Runtime};
use crate::memory::{project, Verdict};
use crate::plan::Plan;
use crate::predict::cost::CostModel;
use crate::predict::{
    beyond_calibration, calibration_for, calibration_held_out_for, compose_step, estimate,
    runtime_for, StepMetrics,
};
use crate::workload::parallel::divisors;
use crate::workload::{Arch, ExpertRouting, Layout, ParallelSpec, Recompute, Rules, Schedule};

/// The values each dimension may take (`None`: every sensible value).
#[derive(Debug, Clone)]
pub struct SearchSpace {
    pub tp: Option<Vec<u64>>,
    pub pp: Option<Vec<u64>>,
    /// Context-parallel degrees (`None`: 1, and for sequences of 8,192 tokens or more also
    /// 2, 4, 8 and 16).
    pub cp: Option<Vec<u64>>,
    /// Expert-parallel degrees (`None`: 1 for a dense model; for a mixture of experts every
    /// power of two dividing the experts).
    pub ep: Option<Vec<u64>>,
    /// Expert-tensor-parallel degrees (`None`: tp, and for a mixture of experts also 1, whole
    /// experts on every rank, as NVIDIA's MoE recipes run).
    pub etp: Option<Vec<u64>>,
    /// Expert all-to-alls beside the compute or not (tried only with ep > 1).
    pub moe_a2a_overlap: Vec<bool>,
    pub micro_batch: Vec<u64>,
    pub schedules: Vec<Schedule>,
    pub recompute: Vec<Recompute>,
    pub sequence_parallel: Vec<bool>,
    pub zero: Vec<u8>,
    /// Largest number of chunks per rank for the interleaved schedule.
    pub max_vpp: u64,
}

impl SearchSpace {
    /// Checks every value the user listed, for `gpus` GPUs.
    pub fn validate(&self, gpus: u64) -> Result<()> {
        let bad = |m: String| Err(Error::Invalid(m));
        for (flag, values) in [
            ("--tp", &self.tp),
            ("--pp", &self.pp),
            ("--cp", &self.cp),
            ("--ep", &self.ep),
            ("--etp", &self.etp),
        ] {
            for &v in values.iter().flatten() {
                if v == 0 || !gpus.is_multiple_of(v) {
                    let all: Vec<String> = divisors(gpus).iter().map(u64::to_string).collect();
                    return bad(format!(
                        "{flag} {v} does not divide --gpus {gpus}: give divisors of {gpus} ({})",
                        all.join(", ")
                    ));
                }
            }
        }
        if let Some(&mb) = self
            .micro_batch
            .iter()
            .find(|&&m| m == 0 || m > crate::limits::MAX_MICRO_BATCH)
        {
            return bad(format!(
                "--micro-batch {mb}: give micro-batch sizes from 1 to {}",
                crate::limits::MAX_MICRO_BATCH
            ));
        }
        if let Some(&z) = self.zero.iter().find(|&&z| z > 3) {
            return bad(format!("--zero {z}: use 0, 1, 2 or 3"));
        }
        if self.max_vpp < 2 && self.schedules.contains(&Schedule::Interleaved) {
            return bad(format!(
                "--max-vpp {}: the interleaved schedule needs at least 2 chunks per rank; give \
                 --max-vpp 2 or more, or leave interleaved out of --schedule",
                self.max_vpp
            ));
        }
        for (flag, empty) in [
            ("--micro-batch", self.micro_batch.is_empty()),
            ("--schedule", self.schedules.is_empty()),
            ("--recompute", self.recompute.is_empty()),
            ("--sequence-parallel", self.sequence_parallel.is_empty()),
            ("--zero", self.zero.is_empty()),
            ("--moe-a2a-overlap", self.moe_a2a_overlap.is_empty()),
        ] {
            if empty {
                return bad(format!("{flag} lists nothing: give at least one value"));
            }
        }
        Ok(())
    }
}

impl Default for SearchSpace {
    fn default() -> Self {
        SearchSpace {
            tp: None,
            pp: None,
            cp: None,
            ep: None,
            etp: None,
            moe_a2a_overlap: vec![false],
            micro_batch: vec![1, 2, 4, 8],
            schedules: vec![
                Schedule::OneFOneB,
                Schedule::Interleaved,
                Schedule::ZbH1,
                Schedule::ZbV,
            ],
            recompute: vec![Recompute::None, Recompute::Selective, Recompute::Full],
            sequence_parallel: vec![false, true],
            zero: vec![0, 1, 2, 3],
            max_vpp: 64,
        }
    }
}

crate::named_enum!(
    /// What a search ranks by.
    pub enum Objective {
        /// Step time (the same as tokens/s: GPUs and batch are fixed).
        Step => "step",
        /// Expected end-to-end run time with failures and checkpoints.
        E2e => "e2e",
    }
);

/// The whole run, for end-to-end times.
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub tokens: f64,
    pub reliability: Reliability,
    pub storage: Storage,
    /// Steps between checkpoints (`None`: each layout's optimal interval).
    pub checkpoint_interval: Option<u64>,
}

impl RunSpec {
    /// The run under a layout with this step time.
    pub fn outcome(
        &self,
        arch: &Arch,
        layout: &Layout,
        gpus_per_node: u64,
        step_s: f64,
    ) -> Result<(RunOutcome, f64)> {
        let nodes = layout.world.div_ceil(gpus_per_node) as f64;
        // with a sharded optimizer every rank writes its part; otherwise one replica does
        let writers = if layout.zero >= 1 {
            nodes
        } else {
            (layout.tp * layout.pp).div_ceil(gpus_per_node) as f64
        };
        let save_s = self
            .storage
            .write_s(checkpoint_bytes(arch.total_params()), writers);
        let run = RunInputs {
            step_s,
            steps: (self.tokens / layout.tokens_per_step() as f64).ceil(),
            nodes,
            failures_per_node_per_day: self.reliability.failures_per_node_per_day,
            mean_recovery_s: self.reliability.mean_recovery_s(),
            save_s,
            first_start_s: self.reliability.first_start_s,
        };
        Ok((run.outcome(self.checkpoint_interval)?, save_s))
    }
}

/// A search: a model on some GPUs at a global batch, the space to explore and how to rank.
pub struct SearchRequest<'a> {
    pub arch: &'a Arch,
    pub cluster: &'a Cluster,
    pub gpus: u64,
    /// What every layout shares: the global batch, and optionally sequence length, data type,
    /// rules and the hidden fraction of tensor-parallel communication.
    pub base: ParallelSpec,
    pub space: SearchSpace,
    /// Keep layouts within 10 % of the GPU's memory (AT-RISK) instead of pruning them.
    pub allow_at_risk: bool,
    pub objective: Objective,
    pub run: Option<RunSpec>,
    /// Per-layer expert routing every layout is costed at (its loads follow each ep).
    pub routing: Option<&'a ExpertRouting>,
    /// Only the layouts this framework runs as costed (those `export` takes), so the best
    /// one can be launched.
    pub framework: Option<Framework>,
}

crate::named_enum!(
    /// What became of a layout that passed the rules.
    pub enum Status {
        /// Predicted.
        Predicted => "predicted",
        /// Pruned: the memory projection says it does not fit.
        Oom => "oom",
        /// Pruned: within 10 % of the GPU's memory.
        AtRisk => "at-risk",
    }
);

/// One layout that passed the rules.
#[derive(Debug, Clone, Serialize)]
pub struct SearchRow {
    pub layout: Layout,
    pub status: Status,
    pub memory_peak_gib: f64,
    pub memory_headroom_gib: f64,
    /// The step and its metrics (predicted rows only).
    #[serde(flatten)]
    pub metrics: Option<StepMetrics>,
    /// 80 % interval of the step, for the best rows only.
    pub interval_s: Option<[f64; 2]>,
    pub run: Option<RunOutcome>,
    pub checkpoint_save_s: Option<f64>,
}

impl SearchRow {
    /// The value ranked (lower is better).
    fn score(&self, objective: Objective) -> f64 {
        match (objective, &self.run, &self.metrics) {
            (Objective::E2e, Some(r), _) => r.end_to_end_s,
            (_, _, Some(m)) => m.step_time_s,
            _ => f64::INFINITY,
        }
    }

    pub fn step_s(&self) -> Option<f64> {
        self.metrics.map(|m| m.step_time_s)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct SearchReport {
    pub enumerated: usize,
    /// Layouts skipped before anything was computed, by the rule they break.
    pub pruned: BTreeMap<String, usize>,
    /// The framework every layout had to run on (`SearchRequest::framework`).
    #[serde(rename = "for", skip_serializing_if = "Option::is_none")]
    pub framework: Option<Framework>,
    /// The frameworks that run the best layout as costed (what `export` takes).
    pub best_runs_on: Vec<Framework>,
    /// Layouts the memory projection removed.
    pub pruned_memory: usize,
    pub predicted: usize,
    pub seconds: f64,
    /// Predicted rows best first, then the memory-pruned ones.
    pub rows: Vec<SearchRow>,
    /// The runtime every step was composed under (the isolated-kernel sum under the paper's
    /// rules), and how it was calibrated (none: the cluster's defaults).
    pub runtime: Runtime,
    pub calibration: Option<String>,
    /// That calibration's error on the sets it held out (see `Prediction`).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub calibration_held_out: std::collections::BTreeMap<String, crate::stats::ErrorStats>,
    /// Where the best layout lies outside the runs that calibration was fitted on, the
    /// prediction's warning saying so.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub beyond_calibration: Option<String>,
}

impl SearchReport {
    pub fn best(&self) -> Option<&SearchRow> {
        self.rows.first().filter(|r| r.status == Status::Predicted)
    }
}

/// Every combination of the space's values for the GPUs asked for, as raw specs.
fn enumerate(req: &SearchRequest) -> Vec<ParallelSpec> {
    let s = &req.space;
    let all = divisors(req.gpus);
    let tps = s.tp.clone().unwrap_or_else(|| all.clone());
    let pps = s.pp.clone().unwrap_or_else(|| all.clone());
    let seq_len = req.base.seq_len.unwrap_or(req.arch.seq_len);
    let cps = s.cp.clone().unwrap_or_else(|| {
        if seq_len >= 8192 {
            [1, 2, 4, 8, 16]
                .into_iter()
                .filter(|&c| req.gpus.is_multiple_of(c))
                .collect()
        } else {
            vec![1]
        }
    });
    let eps = s.ep.clone().unwrap_or_else(|| match &req.arch.moe {
        None => vec![1],
        Some(m) => (0..16)
            .map(|i| 1u64 << i)
            .take_while(|&e| e <= m.experts)
            .filter(|&e| m.experts.is_multiple_of(e))
            .collect(),
    });
    let mut out = Vec::new();
    for (&tp, &pp, &cp) in
        product(&tps, &pps).flat_map(|(tp, pp)| cps.iter().map(move |cp| (tp, pp, cp)))
    {
        let model_parallel = tp.checked_mul(pp).and_then(|x| x.checked_mul(cp));
        if model_parallel.is_none_or(|n| n == 0 || !req.gpus.is_multiple_of(n)) {
            continue;
        }
        let dp = req.gpus / (tp * pp * cp);
        // chunk counts the interleaved schedule can use here
        let vpps: Vec<u64> = if pp > 1 && req.arch.layers.is_multiple_of(pp) {
            divisors(req.arch.layers / pp)
                .into_iter()
                .filter(|&v| v >= 2 && v <= s.max_vpp)
                .collect()
        } else {
            Vec::new()
        };
        // whether ZB-V's V splits the layers here
        let v_shape = pp > 1 && req.arch.layers.is_multiple_of(2 * pp);
        let sps = s.sequence_parallel.iter().filter(|&&sp| !sp || tp > 1);
        for (&mb, &schedule) in product(&s.micro_batch, &s.schedules) {
            let chunks: &[u64] = match schedule {
                Schedule::Interleaved => &vpps,
                Schedule::ZbV if v_shape => &[2],
                Schedule::ZbV => &[],
                _ => &[1],
            };
            for ((&vpp, &recompute), &sp) in
                product(chunks, &s.recompute).flat_map(|vr| sps.clone().map(move |sp| (vr, sp)))
            {
                let etps: Vec<u64> = match (&req.arch.moe, &s.etp) {
                    (None, _) => vec![tp],
                    (Some(_), Some(list)) => list.clone(),
                    (Some(_), None) if tp > 1 => vec![tp, 1],
                    (Some(_), None) => vec![1],
                };
                let experts = product(&eps, &etps).flat_map(|(&ep, &etp)| {
                    let overlaps: &[bool] = if ep > 1 { &s.moe_a2a_overlap } else { &[false] };
                    overlaps.iter().map(move |&o| (ep, etp, o))
                });
                for (&zero, (ep, etp, overlap)) in s
                    .zero
                    .iter()
                    .flat_map(|z| experts.clone().map(move |e| (z, e)))
                {
                    out.push(ParallelSpec {
                        ep: (ep > 1).then_some(ep),
                        etp: (etp != tp).then_some(etp),
                        moe_a2a_overlap: overlap.then_some(true),
                        tp: Some(tp),
                        pp: Some(pp),
                        dp: Some(dp),
                        cp: Some(cp),
                        micro_batch: Some(mb),
                        vpp: Some(vpp),
                        schedule: Some(schedule),
                        recompute: Some(recompute),
                        sequence_parallel: Some(sp),
                        zero: Some(zero),
                        ..req.base.clone()
                    });
                }
            }
        }
    }
    out
}

/// Every pair of an element of `a` with one of `b`, `a` slowest.
fn product<'a, A, B>(a: &'a [A], b: &'a [B]) -> impl Iterator<Item = (&'a A, &'a B)> + Clone {
    a.iter().flat_map(move |x| b.iter().map(move |y| (x, y)))
}

/// MoFa's pruning rules (§4.1) beyond what a layout needs to run: layouts that run but are
/// never worth predicting. FSDP with pipeline stages is kept for torchtitan, which runs it (its
/// stages gather their parameters once a step, as the plan costs it).
fn not_worth_it(
    layout: &Layout,
    cluster: &Cluster,
    framework: Option<Framework>,
) -> Option<&'static str> {
    if layout.tp > cluster.spec.gpus_per_node as u64 {
        return Some("tp > GPUs per node");
    }
    if layout.etp > cluster.spec.gpus_per_node as u64 {
        return Some("etp > GPUs per node");
    }
    if layout.micro_batches < layout.pp {
        return Some("fewer micro-batches than pp");
    }
    if layout.zero == 3 && layout.pp > 1 && framework != Some(Framework::Torchtitan) {
        return Some("ZeRO-3 (FSDP) with pipeline stages");
    }
    if layout.cp > 1 && layout.local_seq_len() < 1024 {
        // the ring's per-step attention is too small to hide its K/V exchange
        return Some("context shard under 1,024 tokens");
    }
    None
}

/// Why `framework` cannot run `layout` as costed — `export`'s refusal, its problem without the
/// fix (the same for every layout it refuses on that ground) — or `None` when it can.
fn refused_by(framework: Framework, req: &SearchRequest, layout: &Layout) -> Option<String> {
    let target = Target {
        arch: req.arch,
        layout,
        gpus_per_node: req.cluster.spec.gpus_per_node as u64,
        headline: String::new(),
    };
    let why = export(framework, &target).err()?.to_string();
    let why = why
        .strip_prefix(&format!("{}: ", framework.name()))
        .unwrap_or(&why);
    let problem = why.split_once(": ").map_or(why, |(problem, _fix)| problem);
    Some(format!("{} cannot run it: {problem}", framework.name()))
}

/// The layout a candidate gives, or the rule that skips it: the rulebook's, MoFa's, or the
/// framework searched for's refusal.
fn candidate(req: &SearchRequest, spec: &ParallelSpec) -> std::result::Result<Layout, String> {
    let layout = Layout::new(spec, req.arch, req.cluster)
        .and_then(|l| match req.routing {
            Some(r) => l.with_routing(r, req.arch),
            None => Ok(l),
        })
        .map_err(|e| e.rule().to_string())?;
    if let Some(rule) = not_worth_it(&layout, req.cluster, req.framework) {
        return Err(rule.to_string());
    }
    match req.framework.and_then(|f| refused_by(f, req, &layout)) {
        Some(rule) => Err(rule),
        None => Ok(layout),
    }
}

/// Projects a layout's memory and, when it fits, predicts its step.
fn evaluate(req: &SearchRequest, cost: &CostModel, layout: Layout) -> Result<SearchRow> {
    let plan = Plan::new(req.arch, &layout, req.cluster);
    let memory = project(req.arch, &layout, req.cluster, &plan);
    let peak = memory.peak().total_gib;
    let status = match memory.verdict {
        Verdict::Oom => Status::Oom,
        Verdict::AtRisk if !req.allow_at_risk => Status::AtRisk,
        _ => Status::Predicted,
    };
    let mut row = SearchRow {
        layout,
        status,
        memory_peak_gib: peak,
        memory_headroom_gib: memory.capacity_gib - peak,
        metrics: None,
        interval_s: None,
        run: None,
        checkpoint_save_s: None,
    };
    if status != Status::Predicted {
        return Ok(row);
    }
    let costed = estimate(&plan, cost, false, runtime_for(row.layout.rules, cost))?;
    let (step, _) = compose_step(&plan, &row.layout, &costed.times)?;
    let metrics = StepMetrics::new(
        step.step_us,
        &step.breakdown_us,
        &plan,
        &row.layout,
        req.cluster,
    );
    if let Some(run) = &req.run {
        let gpn = req.cluster.spec.gpus_per_node as u64;
        let (outcome, save) = run.outcome(req.arch, &row.layout, gpn, metrics.step_time_s)?;
        row.run = Some(outcome);
        row.checkpoint_save_s = Some(save);
    }
    row.metrics = Some(metrics);
    Ok(row)
}

/// Enumerates, prunes, predicts in parallel and ranks.
pub fn search(req: &SearchRequest, cost: &CostModel) -> Result<SearchReport> {
    search_watched(req, cost, &crate::progress::Unwatched)
}

/// `search`, telling `progress` how many layouts survived pruning and each one predicted.
pub fn search_watched(
    req: &SearchRequest,
    cost: &CostModel,
    progress: &dyn crate::progress::Progress,
) -> Result<SearchReport> {
    let started = Instant::now();
    if req.gpus == 0 || req.base.global_batch.is_none_or(|b| b == 0) {
        return Err(Error::Invalid(
            "--gpus and --global-batch must be at least 1".into(),
        ));
    }
    let available = req.cluster.total_gpus();
    if req.gpus > available {
        return Err(Error::Invalid(format!(
            "{} GPUs asked for, but {} has {available}: lower --gpus or use a larger cluster file",
            req.gpus, req.cluster.spec.name
        )));
    }
    req.space.validate(req.gpus)?;
    // what every layout shares, checked once: a base no layout can run with fails here, not as
    // "nothing fits"
    if let Some(dtype) = req.base.dtype {
        if !req.cluster.spec.gpu.supports(dtype) {
            return Err(crate::error::LayoutError::DtypeUnsupported {
                gpu: req.cluster.spec.gpu.name.clone(),
                dtype: dtype.name(),
            }
            .into());
        }
    }
    // a routing file that does not fit the model fails here, not as every layout pruned
    if let Some(routing) = req.routing {
        let imbalance = req.base.moe_imbalance.unwrap_or(1.0);
        routing.model_loads(req.arch, imbalance, 1, None)?;
    }
    let candidates = enumerate(req);
    let mut pruned: BTreeMap<String, usize> = BTreeMap::new();
    let mut survivors = Vec::new();
    for spec in &candidates {
        match candidate(req, spec) {
            Ok(layout) => survivors.push(layout),
            Err(rule) => *pruned.entry(rule).or_default() += 1,
        }
    }
    progress.start("layouts", survivors.len() as u64);
    let mut rows: Vec<SearchRow> = survivors
        .into_par_iter()
        .map(|layout| {
            let row = evaluate(req, cost, layout);
            progress.advance();
            row
        })
        .collect::<Result<_>>()?;
    let predicted = rows
        .iter()
        .filter(|r| r.status == Status::Predicted)
        .count();
    let pruned_memory = rows.len() - predicted;
    rows.sort_by(|a, b| {
        (a.status != Status::Predicted)
            .cmp(&(b.status != Status::Predicted))
            .then(a.score(req.objective).total_cmp(&b.score(req.objective)))
            .then(a.memory_peak_gib.total_cmp(&b.memory_peak_gib))
    });
    // the rules every layout was costed under (the base spec's, as `Layout::new` reads them)
    let rules = req.base.rules.unwrap_or(Rules::Megatron);
    let best = rows.first().filter(|r| r.status == Status::Predicted);
    let beyond_calibration =
        best.and_then(|r| beyond_calibration(req.arch, &r.layout, req.cluster, cost));
    let best_runs_on = best.map_or_else(Vec::new, |r| {
        crate::export::runs_as_costed_on(req.arch, &r.layout, req.cluster.spec.gpus_per_node as u64)
    });
    Ok(SearchReport {
        enumerated: candidates.len(),
        pruned,
        pruned_memory,
        predicted,
        seconds: started.elapsed().as_secs_f64(),
        rows,
        framework: req.framework,
        best_runs_on,
        runtime: runtime_for(rules, cost),
        calibration: calibration_for(rules, cost),
        calibration_held_out: calibration_held_out_for(rules, cost),
        beyond_calibration,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::hardware::dgx_h100_without_models as cluster;

    fn request<'a>(arch: &'a Arch, c: &'a Cluster, gpus: u64, batch: u64) -> SearchRequest<'a> {
        SearchRequest {
            arch,
            cluster: c,
            gpus,
            base: ParallelSpec {
                global_batch: Some(batch),
                ..Default::default()
            },
            space: SearchSpace::default(),
            allow_at_risk: false,
            objective: Objective::Step,
            run: None,
            routing: None,
            framework: None,
        }
    }

    #[test]
    fn every_candidate_is_accounted_for_and_the_best_fits() {
        let c = cluster();
        let arch = Arch::resolve("llama2-13b").unwrap();
        let req = request(&arch, &c, 32, 64);
        let cost = CostModel::new(&c, None);
        let r = search(&req, &cost).unwrap();
        let pruned: usize = r.pruned.values().sum();
        assert_eq!(r.enumerated, pruned + r.rows.len());
        assert_eq!(r.rows.len(), r.predicted + r.pruned_memory);
        assert!(r.predicted > 100, "{}", r.predicted);
        let best = r.best().unwrap();
        assert!(best.memory_peak_gib <= 0.9 * 80.0);
        // a row's step is its metrics', and none where it was not predicted
        assert_eq!(best.step_s(), Some(best.metrics.unwrap().step_time_s));
        assert!(best.step_s().unwrap() > 0.1, "{:?}", best.step_s());
        let oom = r.rows.iter().find(|r| r.status != Status::Predicted);
        assert_eq!(oom.map(SearchRow::step_s), Some(None));
        // sorted: no predicted row is faster than the best
        for row in r.rows.iter().filter(|r| r.status == Status::Predicted) {
            assert!(row.step_s().unwrap() >= best.step_s().unwrap());
            let l = &row.layout;
            assert!(l.tp <= 8 && 64 % (l.micro_batch * l.dp) == 0);
            assert!(64 / (l.micro_batch * l.dp) >= l.pp);
        }
        // tp 16 and 32 break the model's split (40 heads) before MoFa's node rule is asked
        assert!(r
            .pruned
            .contains_key("heads, key/value heads or MLP size not divisible by tp"));
        let arch = Arch::resolve("llama2-7b").unwrap();
        let r = search(&request(&arch, &c, 32, 64), &cost).unwrap();
        assert!(
            r.pruned.contains_key("tp > GPUs per node"),
            "{:?}",
            r.pruned
        );
    }

    /// ZB-V is tried with its two chunks a rank wherever the layers split into 2·pp chunks
    /// and there is a pipeline: llama2-13b's 40 layers over pp 2, 4 and 5 but not 8 (16
    /// chunks), nor at pp 1.
    #[test]
    fn zb_v_is_tried_where_its_v_splits_the_layers() {
        let c = cluster();
        let arch = Arch::resolve("llama2-13b").unwrap();
        let mut req = request(&arch, &c, 40, 80);
        req.space.schedules = vec![Schedule::ZbV];
        req.space.tp = Some(vec![1]);
        req.space.pp = Some(vec![1, 2, 4, 5, 8]);
        // nothing is enumerated where the V cannot split the layers (it would only be refused)
        let mut enumerated: Vec<u64> = enumerate(&req).iter().map(|s| s.pp.unwrap()).collect();
        enumerated.sort_unstable();
        enumerated.dedup();
        assert_eq!(enumerated, [2, 4, 5]);
        let cost = CostModel::new(&c, None);
        let r = search(&req, &cost).unwrap();
        let mut pps: Vec<u64> = r.rows.iter().map(|r| r.layout.pp).collect();
        pps.sort_unstable();
        pps.dedup();
        assert_eq!(pps, [2, 4, 5]);
        assert!(r
            .rows
            .iter()
            .all(|r| r.layout.schedule == Schedule::ZbV && r.layout.vpp == 2));
    }

    #[test]
    fn a_search_for_a_framework_keeps_only_what_it_runs() {
        let c = cluster();
        let arch = Arch::resolve("llama2-13b").unwrap();
        let cost = CostModel::new(&c, None);
        let mut req = request(&arch, &c, 32, 64);
        let all = search(&req, &cost).unwrap();
        // unrestricted, the search ranks layouts Megatron-Core has no switch for, and says
        // which frameworks run its best
        assert!(all
            .rows
            .iter()
            .any(|r| r.layout.zero >= 2 || r.layout.schedule == Schedule::ZbH1));
        let exports = |framework: Framework, layout: &Layout| {
            let target = Target {
                arch: &arch,
                layout,
                gpus_per_node: 8,
                headline: String::new(),
            };
            export(framework, &target).is_ok()
        };
        let best = all.best().unwrap();
        for &framework in Framework::ALL {
            assert_eq!(
                exports(framework, &best.layout),
                all.best_runs_on.contains(&framework),
                "{framework}"
            );
        }
        for &framework in Framework::ALL {
            req.framework = Some(framework);
            let r = search(&req, &cost).unwrap();
            assert_eq!(r.framework, Some(framework));
            assert!(r.predicted > 0, "{framework}: {:?}", r.pruned);
            // its best runs on the framework searched for
            assert!(r.best_runs_on.contains(&framework), "{framework}");
            // every layout that passed the rules exports, and the refusals are counted
            for row in &r.rows {
                assert!(exports(framework, &row.layout), "{framework}: {row:?}");
            }
            let refused: usize = r
                .pruned
                .iter()
                .filter(|(rule, _)| rule.starts_with(&format!("{framework} cannot run it: ")))
                .map(|(_, n)| n)
                .sum();
            assert!(refused > 0, "{framework}: {:?}", r.pruned);
            assert_eq!(
                r.enumerated,
                r.pruned.values().sum::<usize>() + r.rows.len()
            );
        }
        // torchtitan runs FSDP with pipeline stages, which MoFa's rule prunes for the others
        let fsdp_pp =
            |r: &SearchReport| r.rows.iter().any(|r| r.layout.zero == 3 && r.layout.pp > 1);
        assert!(fsdp_pp(&search(&req, &cost).unwrap()));
        req.framework = Some(Framework::Megatron);
        assert!(!fsdp_pp(&search(&req, &cost).unwrap()));
    }

    #[test]
    fn long_sequences_explore_context_parallelism() {
        let c = cluster();
        let arch = Arch::resolve("llama2-7b").unwrap();
        let cost = CostModel::new(&c, None);
        let mut req = request(&arch, &c, 16, 16);
        req.base.seq_len = Some(32768);
        req.space.micro_batch = vec![1];
        req.space.zero = vec![1];
        req.space.schedules = vec![Schedule::OneFOneB];
        let r = search(&req, &cost).unwrap();
        // at 32k tokens layouts with cp > 1 are enumerated and predicted
        let best = r.best().unwrap();
        assert!(
            r.rows
                .iter()
                .any(|row| row.status == Status::Predicted && row.layout.cp > 1),
            "no cp > 1 predicted"
        );
        assert_eq!(best.layout.world, 16);
        // short sequences do not try it unless asked, and a shard under 1,024 tokens is pruned
        let mut req = request(&arch, &c, 16, 16);
        req.base.seq_len = Some(4096);
        req.space.cp = Some(vec![1, 8]);
        let r = search(&req, &cost).unwrap();
        assert!(r.pruned.contains_key("context shard under 1,024 tokens"));
        req.space.cp = None;
        let r = search(&req, &cost).unwrap();
        assert!(r.rows.iter().all(|row| row.layout.cp == 1));
    }

    #[test]
    fn a_mixture_explores_expert_layouts_at_its_routing() {
        let c = cluster();
        let arch = crate::workload::presets::mixtral_8x7b();
        let cost = CostModel::new(&c, None);
        let mut req = request(&arch, &c, 32, 64);
        req.space.micro_batch = vec![1];
        req.space.zero = vec![1];
        req.space.schedules = vec![Schedule::OneFOneB];
        req.space.recompute = vec![Recompute::None];
        req.space.moe_a2a_overlap = vec![false, true];
        let layouts = |r: &SearchReport| -> Vec<Layout> {
            r.rows
                .iter()
                .filter(|r| r.status == Status::Predicted)
                .map(|r| r.layout.clone())
                .collect()
        };
        let plain = layouts(&search(&req, &cost).unwrap());
        assert!(plain.iter().any(|l| l.ep == 8 && l.overlap.moe_a2a));
        assert!(plain.iter().any(|l| l.tp > 1 && l.etp == 1));
        assert!(plain.iter().any(|l| l.tp > 1 && l.etp == l.tp));
        assert!(plain.iter().all(|l| l.ep > 1 || !l.overlap.moe_a2a));
        // expert 0 gets 21 tokens in every layer, the others 13: 1.5 × the mean with one
        // expert per rank, nothing with all on one
        let mut csv = String::from("layer,expert,tokens\n");
        for l in 0..32 {
            for e in 0..8 {
                csv += &format!("{l},{e},{}\n", if e == 0 { 21 } else { 13 });
            }
        }
        let path = std::path::Path::new("r.csv");
        let routing = ExpertRouting::parse(path, csv.as_bytes()).unwrap();
        req.routing = Some(&routing);
        let routed = layouts(&search(&req, &cost).unwrap());
        // (more routed activations: some layouts no longer fit)
        assert!(!routed.is_empty() && routed.len() <= plain.len());
        for l in &routed {
            let expected = match l.ep {
                1 => 1.0,
                8 => 1.5,
                _ => continue,
            };
            assert!(l.layer_loads.iter().all(|&f| f == expected), "{l:?}");
        }
        // a file that does not fit the model fails the search, not every layout
        let short = ExpertRouting::parse(path, b"layer,imbalance\n0,1.2\n").unwrap();
        req.routing = Some(&short);
        assert!(search(&req, &cost).is_err());
    }

    #[test]
    fn a_model_that_fits_nowhere_is_reported() {
        let c = cluster();
        let arch = Arch::resolve("llama3-405b").unwrap();
        let req = request(&arch, &c, 8, 8);
        let r = search(&req, &CostModel::new(&c, None)).unwrap();
        assert_eq!(r.predicted, 0);
        assert!(r.best().is_none() && r.pruned_memory > 0);
    }

    /// Each value a user lists is checked: degrees must divide the GPUs, micro-batches lie in
    /// 1 ..= the limit, ZeRO stages 0–3, the interleaved schedule needs two chunks, and no
    /// dimension may list nothing.
    #[test]
    fn a_search_space_refuses_what_cannot_be_searched() {
        let ok = SearchSpace::default();
        assert!(ok.validate(8).is_ok());
        let refused = |space: SearchSpace, want: &str| {
            let e = space.validate(8).unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        };
        refused(
            SearchSpace {
                tp: Some(vec![3]),
                ..ok.clone()
            },
            "--tp 3 does not divide --gpus 8: give divisors of 8 (1, 2, 4, 8)",
        );
        refused(
            SearchSpace {
                etp: Some(vec![0]),
                ..ok.clone()
            },
            "--etp 0",
        );
        refused(
            SearchSpace {
                micro_batch: vec![0],
                ..ok.clone()
            },
            "--micro-batch 0",
        );
        let max = crate::limits::MAX_MICRO_BATCH;
        refused(
            SearchSpace {
                micro_batch: vec![1, max + 1],
                ..ok.clone()
            },
            &format!("--micro-batch {}", max + 1),
        );
        let at_limit = SearchSpace {
            micro_batch: vec![max],
            ..ok.clone()
        };
        assert!(at_limit.validate(8).is_ok());
        refused(
            SearchSpace {
                zero: vec![1, 4],
                ..ok.clone()
            },
            "--zero 4",
        );
        refused(
            SearchSpace {
                max_vpp: 1,
                ..ok.clone()
            },
            "--max-vpp 1",
        );
        // two chunks are enough; without the interleaved schedule any --max-vpp is
        for space in [
            SearchSpace {
                max_vpp: 2,
                ..ok.clone()
            },
            SearchSpace {
                max_vpp: 1,
                schedules: vec![Schedule::OneFOneB],
                ..ok.clone()
            },
        ] {
            assert!(space.validate(8).is_ok());
        }
        refused(
            SearchSpace {
                recompute: Vec::new(),
                ..ok.clone()
            },
            "--recompute lists nothing",
        );
        refused(
            SearchSpace {
                moe_a2a_overlap: Vec::new(),
                ..ok
            },
            "--moe-a2a-overlap lists nothing",
        );
    }

    /// A small space enumerated exactly: every tp · pp dividing the GPUs, chunk counts only
    /// for the interleaved schedule with pipeline stages (divisors of layers / pp from 2 to
    /// --max-vpp), sequence parallelism only with tp > 1.
    #[test]
    fn a_small_space_enumerates_exactly_its_layouts() {
        let c = cluster();
        let arch = Arch::resolve("llama2-7b").unwrap();
        let mut req = request(&arch, &c, 8, 64);
        req.space = SearchSpace {
            tp: Some(vec![1, 2]),
            pp: Some(vec![1, 2]),
            micro_batch: vec![1],
            schedules: vec![Schedule::OneFOneB, Schedule::Interleaved],
            recompute: vec![Recompute::None],
            zero: vec![1],
            max_vpp: 4,
            ..SearchSpace::default()
        };
        let mut got: Vec<(u64, u64, u64, u64, Schedule, bool)> = enumerate(&req)
            .iter()
            .map(|s| {
                let cp = s.cp.unwrap();
                assert_eq!(cp, 1, "4,096 tokens: no context parallelism");
                let (tp, pp, dp) = (s.tp.unwrap(), s.pp.unwrap(), s.dp.unwrap());
                assert_eq!(tp * pp * dp, 8);
                let sp = s.sequence_parallel.unwrap();
                // the base's global batch, the space's single values
                assert_eq!(s.global_batch, Some(64));
                assert_eq!(
                    (s.micro_batch, s.recompute, s.zero),
                    (Some(1), Some(Recompute::None), Some(1))
                );
                (tp, pp, dp, s.vpp.unwrap(), s.schedule.unwrap(), sp)
            })
            .collect();
        got.sort_by_key(|t| (t.0, t.1, t.3, t.4 as u8, t.5));
        use Schedule::{Interleaved as I, OneFOneB as O};
        assert_eq!(
            got,
            [
                (1, 1, 8, 1, O, false),
                (1, 2, 4, 1, O, false),
                (1, 2, 4, 2, I, false),
                (1, 2, 4, 4, I, false),
                (2, 1, 4, 1, O, false),
                (2, 1, 4, 1, O, true),
                (2, 2, 2, 1, O, false),
                (2, 2, 2, 1, O, true),
                (2, 2, 2, 2, I, false),
                (2, 2, 2, 2, I, true),
                (2, 2, 2, 4, I, false),
                (2, 2, 2, 4, I, true),
            ]
        );
        // 8,192 tokens: context-parallel degrees dividing the GPUs (16 does not), each with
        // the data parallelism left
        req.base.seq_len = Some(8192);
        req.space.tp = Some(vec![1]);
        req.space.pp = Some(vec![1]);
        let cp: Vec<(u64, u64)> = enumerate(&req)
            .iter()
            .map(|s| (s.cp.unwrap(), s.dp.unwrap()))
            .collect();
        assert_eq!(cp, [(1, 8), (2, 4), (4, 2), (8, 1)]);
        // degrees whose product does not divide the GPUs are not layouts
        req.base.seq_len = None;
        req.space.tp = Some(vec![4]);
        req.space.pp = Some(vec![4]);
        assert!(enumerate(&req).is_empty());
        // chunk counts divide the layers a stage holds: 32 layers over pp 8 are 4 a stage, so
        // 2 and 4 chunks, not 8, however many --max-vpp allows
        req.space.tp = Some(vec![1]);
        req.space.pp = Some(vec![8]);
        req.space.max_vpp = 8;
        let mut vpp: Vec<u64> = enumerate(&req).iter().map(|s| s.vpp.unwrap()).collect();
        vpp.sort();
        assert_eq!(vpp, [1, 2, 4]);
    }

    /// The refusals before anything is enumerated, each at its boundary: no GPUs, no global
    /// batch, more GPUs than the cluster has (all of them is fine), a data type the GPU lacks
    /// (one it has is fine).
    #[test]
    fn a_search_refuses_what_no_layout_can_run_at_the_boundary() {
        let node = cluster().with_nodes(1).unwrap();
        let arch = Arch::resolve("llama2-7b").unwrap();
        let cost = CostModel::new(&node, None);
        let tiny = SearchSpace {
            tp: Some(vec![8]),
            pp: Some(vec![1]),
            micro_batch: vec![1],
            schedules: vec![Schedule::OneFOneB],
            recompute: vec![Recompute::None],
            zero: vec![1],
            ..SearchSpace::default()
        };
        let asked = |gpus: u64, batch: Option<u64>| {
            let mut req = request(&arch, &node, gpus, 8);
            req.base.global_batch = batch;
            req.space = tiny.clone();
            search(&req, &cost)
                .map(|r| r.rows.len())
                .map_err(|e| e.to_string())
        };
        let at_least_one = "--gpus and --global-batch must be at least 1";
        assert_eq!(asked(0, Some(8)).unwrap_err(), at_least_one);
        assert_eq!(asked(8, Some(0)).unwrap_err(), at_least_one);
        assert_eq!(asked(8, None).unwrap_err(), at_least_one);
        // tp 8 with and without sequence parallelism
        assert_eq!(asked(8, Some(8)), Ok(2));
        let e = asked(9, Some(8)).unwrap_err();
        assert!(e.contains("9 GPUs asked for") && e.contains("has 8"), "{e}");
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut a100 = Cluster::load(&dir.join("hardware-profiles/dgx-a100.yaml")).unwrap();
        a100.models_dir = None;
        let cost = CostModel::new(&a100, None);
        let with = |dtype| {
            let mut req = request(&arch, &a100, 8, 8);
            req.base.dtype = Some(dtype);
            req.space = tiny.clone();
            search(&req, &cost)
                .map(|r| r.rows.len())
                .map_err(|e| e.to_string())
        };
        assert_eq!(with(crate::ops::Dtype::Bf16), Ok(2));
        let e = with(crate::ops::Dtype::Fp8).unwrap_err();
        assert!(e.contains("fp8"), "{e}");
    }

    /// A layout within 10 % of the GPU's memory is pruned as at risk, or predicted when asked
    /// to keep them; every row's headroom is the GPU's capacity less its peak; the counts add
    /// up by status.
    #[test]
    fn at_risk_layouts_are_pruned_or_kept_as_asked() {
        let c = cluster();
        let arch = Arch::resolve("llama2-13b").unwrap();
        let cost = CostModel::new(&c, None);
        let mut req = request(&arch, &c, 32, 64);
        let pruning = search(&req, &cost).unwrap();
        let count = |r: &SearchReport, status| r.rows.iter().filter(|r| r.status == status).count();
        let at_risk = count(&pruning, Status::AtRisk);
        assert!(at_risk > 0, "no layout at risk to test with");
        assert_eq!(pruning.predicted, count(&pruning, Status::Predicted));
        assert_eq!(
            pruning.pruned_memory,
            at_risk + count(&pruning, Status::Oom)
        );
        let capacity = pruning.rows[0].memory_headroom_gib + pruning.rows[0].memory_peak_gib;
        assert!((70.0..=80.0).contains(&capacity), "{capacity}");
        for row in &pruning.rows {
            let sum = row.memory_headroom_gib + row.memory_peak_gib;
            assert!((sum - capacity).abs() < 1e-9, "{sum} against {capacity}");
            assert_eq!(row.metrics.is_some(), row.status == Status::Predicted);
        }
        req.allow_at_risk = true;
        let keeping = search(&req, &cost).unwrap();
        assert_eq!(count(&keeping, Status::AtRisk), 0);
        assert_eq!(keeping.predicted, pruning.predicted + at_risk);
        assert_eq!(count(&keeping, Status::Oom), count(&pruning, Status::Oom));
    }

    /// A mixture's expert layouts: every power-of-two ep dividing the experts, etp both tp and
    /// 1 (whole experts) when tp > 1, the all-to-all overlap tried only where there is one.
    #[test]
    fn a_mixtures_expert_layouts_are_enumerated_exactly() {
        let c = cluster();
        let arch = crate::workload::presets::mixtral_8x7b();
        let mut req = request(&arch, &c, 8, 64);
        req.space = SearchSpace {
            tp: Some(vec![2]),
            pp: Some(vec![1]),
            micro_batch: vec![1],
            schedules: vec![Schedule::OneFOneB],
            recompute: vec![Recompute::None],
            sequence_parallel: vec![true],
            zero: vec![1],
            moe_a2a_overlap: vec![false, true],
            ..SearchSpace::default()
        };
        let mut got: Vec<(Option<u64>, Option<u64>, Option<bool>)> = enumerate(&req)
            .iter()
            .map(|s| (s.ep, s.etp, s.moe_a2a_overlap))
            .collect();
        got.sort();
        let mut want = vec![(None, None, None), (None, Some(1), None)];
        for ep in [2, 4, 8] {
            for etp in [None, Some(1)] {
                want.push((Some(ep), etp, None));
                want.push((Some(ep), etp, Some(true)));
            }
        }
        want.sort();
        assert_eq!(got, want);
        // tp 1: whole experts only
        req.space.tp = Some(vec![1]);
        req.space.sequence_parallel = vec![false];
        let whole = enumerate(&req);
        assert!(whole.iter().all(|s| s.etp.is_none()));
        // ep 1 once, ep 2, 4, 8 with and without the overlap
        assert_eq!(whole.len(), 7);
    }

    /// MoFa's pruning rules at their boundaries: tp and etp up to a node, as many
    /// micro-batches as stages, FSDP with stages for torchtitan only, context shards of at
    /// least 1,024 tokens.
    #[test]
    fn the_pruning_rules_hold_at_their_boundaries() {
        let c = cluster();
        let dense = Arch::resolve("llama2-7b").unwrap();
        let mixtral = crate::workload::presets::mixtral_8x7b();
        let layout = |arch: &Arch, s: ParallelSpec| {
            let s = ParallelSpec {
                micro_batch: Some(1),
                ..s
            };
            Layout::new(&s, arch, &c).unwrap()
        };
        let spec = |tp, pp, dp, batch| ParallelSpec {
            tp: Some(tp),
            pp: Some(pp),
            dp: Some(dp),
            global_batch: Some(batch),
            ..Default::default()
        };
        let why = |l: &Layout, f| not_worth_it(l, &c, f);
        assert_eq!(why(&layout(&dense, spec(8, 1, 1, 8)), None), None);
        assert_eq!(
            why(&layout(&dense, spec(16, 1, 1, 8)), None),
            Some("tp > GPUs per node")
        );
        let experts = ParallelSpec {
            ep: Some(1),
            etp: Some(8),
            ..spec(8, 1, 1, 8)
        };
        assert_eq!(why(&layout(&mixtral, experts), None), None);
        // as many micro-batches as stages, not fewer
        assert_eq!(why(&layout(&dense, spec(1, 4, 1, 4)), None), None);
        assert_eq!(
            why(&layout(&dense, spec(1, 4, 1, 2)), None),
            Some("fewer micro-batches than pp")
        );
        let sharded = |pp| ParallelSpec {
            zero: Some(3),
            ..spec(1, pp, 2, 8)
        };
        let fsdp_pp = layout(&dense, sharded(2));
        assert_eq!(
            why(&fsdp_pp, None),
            Some("ZeRO-3 (FSDP) with pipeline stages")
        );
        assert_eq!(
            why(&fsdp_pp, Some(Framework::Megatron)),
            why(&fsdp_pp, None)
        );
        assert_eq!(why(&fsdp_pp, Some(Framework::Torchtitan)), None);
        assert_eq!(why(&layout(&dense, sharded(1)), None), None);
        let zero1_pp = ParallelSpec {
            zero: Some(1),
            ..spec(1, 2, 2, 8)
        };
        assert_eq!(why(&layout(&dense, zero1_pp), None), None);
        // context shards: 2,048 tokens over 2 ranks is 1,024 each (kept), 1,024 is 512
        let context = |cp, seq| ParallelSpec {
            cp: Some(cp),
            seq_len: Some(seq),
            ..spec(1, 1, 1, 8)
        };
        assert_eq!(why(&layout(&dense, context(2, 2048)), None), None);
        assert_eq!(
            why(&layout(&dense, context(2, 1024)), None),
            Some("context shard under 1,024 tokens")
        );
        assert_eq!(why(&layout(&dense, context(1, 512)), None), None);
    }

    /// A run's checkpoint is written by every node when the optimizer state is sharded, by
    /// the nodes of one replica otherwise; its steps are the tokens over each step's.
    #[test]
    fn a_runs_checkpoint_writers_and_steps_follow_the_layout() {
        let c = cluster();
        let arch = Arch::resolve("llama2-7b").unwrap();
        let storage = Storage {
            checkpoint_write_gb_per_s_per_node: 2.0,
            checkpoint_write_gb_per_s_max: None,
        };
        let run = RunSpec {
            tokens: 1e9,
            reliability: Reliability::default(),
            storage,
            checkpoint_interval: Some(100),
        };
        let layout = |zero, tp, pp, dp| {
            let spec = ParallelSpec {
                tp: Some(tp),
                pp: Some(pp),
                dp: Some(dp),
                micro_batch: Some(1),
                global_batch: Some(64),
                zero: Some(zero),
                ..Default::default()
            };
            Layout::new(&spec, &arch, &c).unwrap()
        };
        let bytes = checkpoint_bytes(arch.total_params());
        let save = |zero, tp, pp, dp| {
            run.outcome(&arch, &layout(zero, tp, pp, dp), 8, 2.0)
                .unwrap()
                .1
        };
        // 32 GPUs on 4 nodes: sharded, the 4 write; replicated, a replica of 4 GPUs (1 node)
        assert_eq!(save(1, 2, 2, 8), storage.write_s(bytes, 4.0));
        assert_eq!(save(0, 2, 2, 8), storage.write_s(bytes, 1.0));
        // tp 8 · pp 2: a replica spans 2 nodes; tp 4 · pp 4 too (its 16 GPUs, not 4 + 4)
        assert_eq!(save(0, 8, 2, 2), storage.write_s(bytes, 2.0));
        assert_eq!(save(0, 4, 4, 2), storage.write_s(bytes, 2.0));
        // 10^9 tokens in steps of 64 × 4,096: 3,815 steps (rounded up) of 2 s
        let (outcome, _) = run.outcome(&arch, &layout(1, 2, 2, 8), 8, 2.0).unwrap();
        assert_eq!(outcome.training_s, 3815.0 * 2.0);
        assert_eq!(outcome.checkpoint_interval, 100);
    }

    #[test]
    fn end_to_end_objective_ranks_by_run_time() {
        let c = cluster();
        let arch = Arch::resolve("llama2-7b").unwrap();
        let mut req = request(&arch, &c, 16, 32);
        req.objective = Objective::E2e;
        req.run = Some(RunSpec {
            tokens: 1e11,
            reliability: Reliability::default(),
            storage: Storage::default(),
            checkpoint_interval: None,
        });
        let r = search(&req, &CostModel::new(&c, None)).unwrap();
        let e2e: Vec<f64> = r
            .rows
            .iter()
            .filter(|r| r.status == Status::Predicted)
            .map(|r| r.run.unwrap().end_to_end_s)
            .collect();
        assert!(e2e.windows(2).all(|w| w[0] <= w[1]));
        let best = r.best().unwrap().run.unwrap();
        assert!(best.ettr > 0.9 && best.ettr < 1.0 && best.checkpoint_interval >= 1);
    }
}

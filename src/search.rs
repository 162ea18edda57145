//! Layout search: every tp × pp × dp × micro-batch × chunks × schedule × recompute × sequence
//! parallelism × ZeRO stage of a model on N GPUs at a global batch, pruned by MoFa's rules
//! (§4.1: tp within a node, heads divisible by tp, layers ≥ pp, the global batch divisible by
//! micro-batch × dp, at least pp micro-batches) and then by memory, the survivors predicted in
//! parallel and ranked by step time or by end-to-end run time.

use std::collections::BTreeMap;
use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::fault::{checkpoint_bytes, Reliability, RunInputs, RunOutcome, Storage};
use crate::hardware::Cluster;
use crate::memory::{project, Verdict};
use crate::ops::Dtype;
use crate::predict::compose_step;
use crate::predict::cost::CostModel;
use crate::predict::decompose::{decompose, OpCall};
use crate::predict::estimate_calls;
use crate::workload::{Arch, Layout, ParallelSpec, Recompute, Rules, Schedule};

/// The values each dimension may take (`None`: every sensible value).
#[derive(Debug, Clone)]
pub struct SearchSpace {
    pub tp: Option<Vec<u64>>,
    pub pp: Option<Vec<u64>>,
    pub micro_batch: Vec<u64>,
    pub schedules: Vec<Schedule>,
    pub recompute: Vec<Recompute>,
    pub sequence_parallel: Vec<bool>,
    pub zero: Vec<u8>,
    /// Largest number of chunks per rank for the interleaved schedule.
    pub max_vpp: u64,
}

impl Default for SearchSpace {
    fn default() -> Self {
        SearchSpace {
            tp: None,
            pp: None,
            micro_batch: vec![1, 2, 4, 8],
            schedules: vec![Schedule::OneFOneB, Schedule::Interleaved, Schedule::ZbH1],
            recompute: vec![Recompute::None, Recompute::Selective, Recompute::Full],
            sequence_parallel: vec![false, true],
            zero: vec![0, 1, 2, 3],
            max_vpp: 64,
        }
    }
}

/// What a search ranks by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Objective {
    /// Step time (the same as tokens/s: GPUs and batch are fixed).
    Step,
    /// Expected end-to-end run time with failures and checkpoints.
    E2e,
}

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

pub struct SearchRequest<'a> {
    pub arch: &'a Arch,
    pub cluster: &'a Cluster,
    pub gpus: u64,
    pub global_batch: u64,
    pub seq_len: Option<u64>,
    pub dtype: Option<Dtype>,
    pub rules: Rules,
    /// Hidden fraction of tensor-parallel communication, for every layout.
    pub tp_comm_overlap: Option<f64>,
    pub space: SearchSpace,
    /// Keep layouts within 10 % of the GPU's memory (AT-RISK) instead of pruning them.
    pub allow_at_risk: bool,
    pub objective: Objective,
    pub run: Option<RunSpec>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Predicted,
    /// Pruned: the memory projection says it does not fit (or is at risk).
    Oom,
    AtRisk,
}

/// One layout that passed the structural rules.
#[derive(Debug, Clone, Serialize)]
pub struct SearchRow {
    pub tp: u64,
    pub pp: u64,
    pub dp: u64,
    pub micro_batch: u64,
    pub micro_batches: u64,
    pub vpp: u64,
    pub schedule: Schedule,
    pub recompute: Recompute,
    pub sequence_parallel: bool,
    pub zero: u8,
    pub status: Status,
    pub memory_peak_gib: f64,
    pub memory_headroom_gib: f64,
    pub step_s: Option<f64>,
    pub tokens_per_s_per_gpu: Option<f64>,
    pub mfu_percent: Option<f64>,
    pub bubble_ratio: Option<f64>,
    /// 80 % interval of the step, for the best rows only.
    pub interval_s: Option<[f64; 2]>,
    pub run: Option<RunOutcome>,
    pub checkpoint_save_s: Option<f64>,
}

impl SearchRow {
    /// The value ranked (lower is better).
    fn score(&self, objective: Objective) -> f64 {
        match (objective, &self.run) {
            (Objective::E2e, Some(r)) => r.end_to_end_s,
            _ => self.step_s.unwrap_or(f64::INFINITY),
        }
    }

    /// The layout as a spec, for predicting it again.
    pub fn spec(&self, base: &ParallelSpec) -> ParallelSpec {
        ParallelSpec {
            tp: Some(self.tp),
            pp: Some(self.pp),
            dp: Some(self.dp),
            micro_batch: Some(self.micro_batch),
            vpp: Some(self.vpp),
            schedule: Some(self.schedule),
            recompute: Some(self.recompute),
            sequence_parallel: Some(self.sequence_parallel),
            zero: Some(self.zero),
            ..base.clone()
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct SearchReport {
    pub enumerated: usize,
    /// Layouts the structural rules removed, by rule.
    pub pruned: BTreeMap<&'static str, usize>,
    /// Layouts the memory projection removed.
    pub pruned_memory: usize,
    pub predicted: usize,
    pub seconds: f64,
    /// Predicted rows best first, then the memory-pruned ones.
    pub rows: Vec<SearchRow>,
    /// The job every row shares (global batch, sequence, type, rules).
    #[serde(skip)]
    pub base: ParallelSpec,
}

impl SearchReport {
    pub fn best(&self) -> Option<&SearchRow> {
        self.rows.first().filter(|r| r.status == Status::Predicted)
    }
}

fn divisors(n: u64) -> Vec<u64> {
    (1..=n).filter(|d| n % d == 0).collect()
}

/// One candidate before checking.
struct Candidate {
    spec: ParallelSpec,
}

fn enumerate(req: &SearchRequest, base: &ParallelSpec) -> Vec<Candidate> {
    let s = &req.space;
    let all = divisors(req.gpus);
    let tps = s.tp.clone().unwrap_or_else(|| all.clone());
    let pps = s.pp.clone().unwrap_or_else(|| all.clone());
    let mut out = Vec::new();
    for &tp in &tps {
        for &pp in &pps {
            if tp * pp == 0 || req.gpus % (tp * pp) != 0 {
                continue;
            }
            let dp = req.gpus / (tp * pp);
            // chunk counts the interleaved schedule can use here
            let per_rank = req.arch.layers / pp.max(1);
            let vpps: Vec<u64> = if pp > 1 && req.arch.layers % pp == 0 {
                divisors(per_rank)
                    .into_iter()
                    .filter(|&v| v >= 2 && v <= s.max_vpp)
                    .collect()
            } else {
                Vec::new()
            };
            for &mb in &s.micro_batch {
                for &schedule in &s.schedules {
                    let chunks: Vec<u64> = match schedule {
                        Schedule::Interleaved => vpps.clone(),
                        _ => vec![1],
                    };
                    for &vpp in &chunks {
                        for &recompute in &s.recompute {
                            for &sp in &s.sequence_parallel {
                                if sp && tp == 1 {
                                    continue;
                                }
                                for &zero in &s.zero {
                                    out.push(Candidate {
                                        spec: ParallelSpec {
                                            tp: Some(tp),
                                            pp: Some(pp),
                                            dp: Some(dp),
                                            micro_batch: Some(mb),
                                            vpp: Some(vpp),
                                            schedule: Some(schedule),
                                            recompute: Some(recompute),
                                            sequence_parallel: Some(sp),
                                            zero: Some(zero),
                                            ..base.clone()
                                        },
                                    });
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// The rule a candidate breaks, checked in MoFa's order before anything is computed.
fn broken_rule(req: &SearchRequest, spec: &ParallelSpec) -> Option<&'static str> {
    let (tp, pp, dp, mb) = (
        spec.tp.unwrap_or(1),
        spec.pp.unwrap_or(1),
        spec.dp.unwrap_or(1),
        spec.micro_batch.unwrap_or(1),
    );
    let a = req.arch;
    if tp > req.cluster.spec.gpus_per_node as u64 {
        return Some("tp > GPUs per node");
    }
    if a.heads % tp != 0 || (a.kv_heads % tp != 0 && tp % a.kv_heads != 0) || a.ffn_hidden % tp != 0
    {
        return Some("heads, key/value heads or MLP size not divisible by tp");
    }
    if a.layers < pp {
        return Some("fewer layers than pp");
    }
    if req.global_batch % (mb * dp) != 0 {
        return Some("global batch not divisible by micro-batch × dp");
    }
    if req.global_batch / (mb * dp) < pp {
        return Some("fewer micro-batches than pp");
    }
    if spec.zero == Some(3) && pp > 1 {
        return Some("ZeRO-3 (FSDP) with pipeline stages");
    }
    // chunk counts are enumerated from the divisors of the layers per rank
    if spec.schedule == Some(Schedule::Interleaved) && (req.global_batch / (mb * dp)) % pp != 0 {
        return Some("interleaving needs layers divisible by pp·vpp and micro-batches by pp");
    }
    None
}

/// Projects a layout's memory and, when it fits, predicts its step. The rules above leave no
/// layout `Layout::new` refuses.
fn evaluate(req: &SearchRequest, cost: &CostModel, spec: &ParallelSpec) -> Result<SearchRow> {
    let layout = Layout::new(spec, req.arch, req.cluster)?;
    let mut d = decompose(req.arch, &layout, req.cluster);
    let memory = project(req.arch, &layout, req.cluster, &d);
    let peak = memory.peak().total_gib;
    let mut row = SearchRow {
        tp: layout.tp,
        pp: layout.pp,
        dp: layout.dp,
        micro_batch: layout.micro_batch,
        micro_batches: layout.micro_batches,
        vpp: layout.vpp,
        schedule: layout.schedule,
        recompute: layout.recompute,
        sequence_parallel: layout.sequence_parallel,
        zero: layout.zero,
        status: Status::Predicted,
        memory_peak_gib: peak,
        memory_headroom_gib: memory.capacity_gib - peak,
        step_s: None,
        tokens_per_s_per_gpu: None,
        mfu_percent: None,
        bubble_ratio: None,
        interval_s: None,
        run: None,
        checkpoint_save_s: None,
    };
    match memory.verdict {
        Verdict::Oom => {
            row.status = Status::Oom;
            return Ok(row);
        }
        Verdict::AtRisk if !req.allow_at_risk => {
            row.status = Status::AtRisk;
            return Ok(row);
        }
        _ => {}
    }
    let estimates = estimate_calls(&mut d, cost)?;
    let (step, _) = compose_step(&d, &layout, &|op: &OpCall| estimates[op.estimate].time_us)?;
    let step_s = step.step_us / 1e6;
    let flops_per_gpu = d.model_flops_per_step / layout.world as f64 / step_s;
    row.step_s = Some(step_s);
    row.tokens_per_s_per_gpu = Some(layout.tokens_per_step() as f64 / step_s / layout.world as f64);
    row.mfu_percent = Some(100.0 * flops_per_gpu / req.cluster.spec.gpu.peak_flops(layout.dtype));
    row.bubble_ratio = Some(crate::schedule::bubble_ratio(&step.breakdown_us));
    if let Some(run) = &req.run {
        let (outcome, save) = run.outcome(
            req.arch,
            &layout,
            req.cluster.spec.gpus_per_node as u64,
            step_s,
        )?;
        row.run = Some(outcome);
        row.checkpoint_save_s = Some(save);
    }
    Ok(row)
}

pub fn search(req: &SearchRequest, cost: &CostModel) -> Result<SearchReport> {
    let started = Instant::now();
    if req.gpus == 0 || req.global_batch == 0 {
        return Err(Error::Invalid(
            "--gpus and --global-batch must be at least 1".into(),
        ));
    }
    if let Some(f) = req.tp_comm_overlap {
        if !(0.0..=1.0).contains(&f) {
            return Err(Error::Invalid(format!(
                "tp-comm-overlap = {f}: give the fraction hidden, between 0 and 1"
            )));
        }
    }
    let available = req.cluster.total_gpus();
    if req.gpus > available {
        return Err(Error::Invalid(format!(
            "{} GPUs asked for, but {} has {available}: lower --gpus or use a larger cluster file",
            req.gpus, req.cluster.spec.name
        )));
    }
    let base = ParallelSpec {
        global_batch: Some(req.global_batch),
        seq_len: req.seq_len,
        dtype: req.dtype,
        rules: Some(req.rules),
        tp_comm_overlap: req.tp_comm_overlap,
        ..Default::default()
    };
    let candidates = enumerate(req, &base);
    let mut pruned: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut survivors = Vec::new();
    for c in &candidates {
        match broken_rule(req, &c.spec) {
            Some(rule) => *pruned.entry(rule).or_default() += 1,
            None => survivors.push(&c.spec),
        }
    }
    let mut rows: Vec<SearchRow> = survivors
        .par_iter()
        .map(|spec| evaluate(req, cost, spec))
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
    Ok(SearchReport {
        enumerated: candidates.len(),
        pruned,
        pruned_memory,
        predicted,
        seconds: started.elapsed().as_secs_f64(),
        rows,
        base,
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
            global_batch: batch,
            seq_len: None,
            dtype: None,
            rules: Rules::Megatron,
            tp_comm_overlap: None,
            space: SearchSpace::default(),
            allow_at_risk: false,
            objective: Objective::Step,
            run: None,
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
        // sorted: no predicted row is faster than the best
        for row in r.rows.iter().filter(|r| r.status == Status::Predicted) {
            assert!(row.step_s.unwrap() >= best.step_s.unwrap());
            assert!(row.tp <= 8 && 64 % (row.micro_batch * row.dp) == 0);
            assert!(64 / (row.micro_batch * row.dp) >= row.pp);
        }
        assert!(r.pruned.contains_key("tp > GPUs per node"));
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

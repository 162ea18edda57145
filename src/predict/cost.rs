//! The cost of one operator call, and where the number came from.
//!
//! In order: a learned model (exact key, the pooled model of the kind, or the fp16/bf16 twin);
//! a derivation from a learned model (a GEMM backward as its data-gradient and weight-gradient
//! GEMMs through the forward model, a flash-attention backward as 2.5× the forward, a causal
//! attention as half a full one); for collectives outside the measured layouts, the analytic
//! model scaled by a correction fitted on the measured ones; and last the cluster's derated
//! roofline. Every estimate carries its source, a log-space uncertainty and the features that
//! lay outside the training data.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use serde::Serialize;

use crate::analytic::{alignment, network, roofline};
use crate::error::Result;
use crate::hardware::{Calibration as FittedRuntime, Cluster, FittedRange, Runtime};
use crate::ops::features::{ATTENTION_CAUSAL, COLLECTIVE_LOG2_BYTES};
use crate::ops::{CollectiveShape, GemmShape, OpKind, OpQuery, Phase, Shape};
use crate::regress::{Match, ModelSet, TrainedModel};
use crate::stats::ErrorStats;

/// Where an estimate came from, most trusted first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// A trained model answered the call itself.
    Learned,
    /// Computed from a trained model of a related call.
    Derived,
    /// A trained model of another GPU, scaled to this one by the ratio of the two rooflines.
    Transferred,
    /// The analytic network model scaled by a correction fitted on measured layouts.
    CalibratedAnalytic,
    /// The analytic network model with the cluster's assumed efficiency.
    Analytic,
    /// The cluster's derated roofline: no model measured this operator.
    Roofline,
}

impl Source {
    /// The source as reports print it.
    pub fn name(self) -> &'static str {
        match self {
            Source::Learned => "learned",
            Source::Derived => "derived",
            Source::Transferred => "transferred",
            Source::CalibratedAnalytic => "calibrated analytic",
            Source::Analytic => "analytic",
            Source::Roofline => "roofline",
        }
    }
}

/// A call's cost and everything that says how far to trust it.
#[derive(Debug, Clone, Serialize)]
pub struct Estimate {
    /// µs of one call.
    pub time_us: f64,
    /// Standard deviation of ln(actual / predicted).
    pub sigma_log: f64,
    /// Where the number came from.
    pub source: Source,
    /// What produced the number; estimates from the same model share their errors.
    pub model: String,
    /// How it was derived, where that needs saying.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Features outside the training range of the model that answered.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub out_of_coverage: Vec<String>,
    /// Raised to the physical floor (roofline at the best achievable fraction of peak): the
    /// model predicted this many µs, faster than the GPU can run it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub floored_from_us: Option<f64>,
}

impl Estimate {
    /// Adds `note` after any note the estimate already carries.
    fn add_note(&mut self, note: String) {
        self.note = Some(match self.note.take() {
            Some(n) => format!("{n}; {note}"),
            None => note,
        });
    }
}

/// Where no model backs a kernel, how long steps ran against the roofline alone: the 10th and
/// 90th percentile of measured / predicted step time over the published runs of four NVIDIA
/// clusters predicted with their models removed and no calibration (1,901 runs, each cluster
/// weighing the same: `scripts/roofline-band.py`; median 1.27). The roofline factor's 80 %
/// band in `predict`'s interval: a little below 1 and far above it, as the kernels it derates
/// from peak rarely run faster and often much slower.
pub const ROOFLINE_BAND: (f64, f64) = (0.975, 1.80);
/// The median of the same ratios: how much too fast the roofline alone is, typically.
pub const ROOFLINE_MEDIAN: f64 = 1.27;
/// Uncertainty assumed for the analytic network model where no collective was measured.
const ANALYTIC_SIGMA: f64 = 0.3;
/// FlashAttention-2 backward does 2.5× the forward's matmul work (5 GEMMs to 2): the ratio
/// used when no GPU measured both phases.
const FLASH_BWD_OVER_FWD: f64 = 2.5;
/// Extra uncertainty of a model carried to another GPU (the A100 ↔ GH200 transfer table in
/// the README puts its error at this order).
const TRANSFER_SIGMA: f64 = 0.15;

#[derive(Debug, Clone)]
struct Calibration {
    factor: f64,
    sigma_log: f64,
    from: String,
}

/// The calibration `lookup` finds for `cluster` (by its own name first, then by the name its
/// file's `models.calibration_from` borrows), and whether it was borrowed.
fn calibration_of<'m>(
    cluster: &Cluster,
    lookup: impl Fn(&str) -> Option<&'m FittedRuntime>,
) -> Option<(&'m FittedRuntime, bool)> {
    let borrowed = || {
        let from = cluster.spec.models.as_ref()?.calibration_from.as_deref()?;
        lookup(from).map(|c| (c, true))
    };
    lookup(&cluster.spec.name)
        .map(|c| (c, false))
        .or_else(borrowed)
}

/// How a prediction says which calibration it is composed under; a borrowed one says so.
fn summary(c: &FittedRuntime, borrowed: bool, cluster: &Cluster) -> String {
    if borrowed {
        format!(
            "{}, borrowed by {} (its file's models.calibration_from)",
            c.summary(),
            cluster.spec.name
        )
    } else {
        c.summary()
    }
}

/// Costs operator calls on one cluster from its models, with fallbacks (see the module docs).
pub struct CostModel<'a> {
    cluster: &'a Cluster,
    models: Option<ModelSet>,
    /// Models of other GPUs for the kernels `models` lacks (nearest first).
    transfer: Vec<ModelSet>,
    /// Models of this cluster's network that answer the collectives instead of `models`'
    /// (`models.collectives_from`).
    collectives: Option<ModelSet>,
    runtime: Runtime,
    /// How the runtime was calibrated (none: the cluster's defaults).
    calibrated: Option<String>,
    /// The range of the runs the calibration was fitted on, where its file records it.
    calibrated_range: Option<FittedRange>,
    /// The source sets of this cluster's runs the calibration was fitted on (its file's
    /// `fitted_on.sets`; none when it is borrowed from another cluster's runs).
    calibrated_sets: Vec<String>,
    /// The calibration's error on the runs of the sets it was not fitted on, by set (its
    /// file's `held_out`): how far it carries to other software (kept when borrowed: those
    /// runs are the lender's).
    calibrated_held_out: BTreeMap<String, ErrorStats>,
    /// The composed runtime's spread on measured runs, as σ of ln(predicted / measured): the
    /// calibration's cross-validated error, or after `uncalibrated` the raw physics' error on
    /// the same runs; none where no runs measured it.
    runtime_sigma_log: Option<f64>,
    /// The calibration's spread per training type, where a type had enough runs of its own.
    runtime_sigma_by_dtype: BTreeMap<String, f64>,
    /// The raw physics' error on the runs of the calibration found, as σ.
    raw_sigma_log: Option<f64>,
    cache: Mutex<HashMap<OpQuery, Estimate>>,
    calibrations: Mutex<HashMap<(OpKind, bool), Option<Calibration>>>,
    /// The calibrations beside the models of the cluster `models.calibration_from` names,
    /// where this cluster's own models hold none to compose under.
    lent: Option<crate::hardware::Calibrations>,
}

impl<'a> CostModel<'a> {
    /// A cost model of `cluster` with these trained models (none: analytic only).
    pub fn new(cluster: &'a Cluster, models: Option<ModelSet>) -> Self {
        // a calibration fitted for this cluster takes precedence over the cluster's defaults;
        // without one, the calibration its file borrows (`models.calibration_from`), from these
        // models' calibrations or else from those beside the lender's own models
        let own = models.as_ref().map(|m| &m.calibrations);
        let mut found = own
            .and_then(|own| calibration_of(cluster, |name| own.of(name)))
            .map(|(c, borrowed)| (c.clone(), borrowed));
        let (mut lent, mut unreadable) = (None, None);
        if found.is_none() && own.is_some() {
            match cluster.lender_calibrations() {
                Ok(calibrations) => lent = calibrations,
                Err(e) => unreadable = Some(e.to_string()),
            }
            found = lent
                .as_ref()
                .and_then(|lent| calibration_of(cluster, |name| lent.of(name)))
                .map(|(c, borrowed)| (c.clone(), borrowed));
        }
        // a borrowed name no calibration holds (a typo, or models not calibrated yet) is
        // said, not silently replaced by the defaults
        let missing = || {
            let from = cluster.spec.models.as_ref()?.calibration_from.as_ref()?;
            let dir = models.as_ref()?.dir.display();
            Some(match &unreadable {
                Some(why) => format!(
                    "the cluster's defaults: its models.calibration_from names '{from}', whose \
                     calibration could not be read: {why}"
                ),
                None => format!(
                    "the cluster's defaults: its models.calibration_from names '{from}', which \
                     neither {dir}/calibration.yaml nor {from}'s models hold"
                ),
            })
        };
        let calibrated = missing();
        let mut cost = CostModel {
            lent,
            cluster,
            transfer: Vec::new(),
            collectives: None,
            runtime: cluster.spec.runtime,
            calibrated,
            calibrated_range: None,
            calibrated_sets: Vec::new(),
            calibrated_held_out: BTreeMap::new(),
            runtime_sigma_log: None,
            runtime_sigma_by_dtype: BTreeMap::new(),
            raw_sigma_log: None,
            models,
            cache: Mutex::new(HashMap::new()),
            calibrations: Mutex::new(HashMap::new()),
        };
        if let Some((c, borrowed)) = found {
            cost.compose_under(&c, borrowed);
        }
        cost
    }

    /// Composes under calibration `c` (borrowed from another cluster or not): its runtime, how
    /// predictions name it, the range of its runs and its spread on them.
    fn compose_under(&mut self, c: &FittedRuntime, borrowed: bool) {
        self.runtime = c.runtime;
        self.calibrated = Some(summary(c, borrowed, self.cluster));
        self.calibrated_range = c.fitted_on.range.clone();
        self.calibrated_sets = if borrowed {
            Vec::new()
        } else {
            c.fitted_on.sets.keys().cloned().collect()
        };
        self.calibrated_held_out = c.held_out.clone();
        self.runtime_sigma_log = Some(c.sigma_log());
        self.runtime_sigma_by_dtype = c.sigma_log_by_dtype();
        self.raw_sigma_log = Some(c.raw_sigma_log());
    }

    /// The trained models, if any.
    pub fn models(&self) -> Option<&ModelSet> {
        self.models.as_ref()
    }

    /// With models of other GPUs answering the kernels this cluster's models lack, nearest
    /// first (see `Source::Transferred`).
    pub fn with_transfer(mut self, sets: Vec<ModelSet>) -> Self {
        self.transfer = sets;
        self
    }

    /// With the collectives answered by `set`, whose NCCL timings were measured on this
    /// cluster's kind of node (`models.collectives_from`); none keeps `models`' own where the
    /// cluster file says they apply, else the analytic model.
    pub fn with_collectives(mut self, set: Option<ModelSet>) -> Self {
        self.collectives = set;
        self
    }

    /// The models whose NCCL timings apply to this cluster: `models.collectives_from`'s, else
    /// `models`' own where the cluster file says they were measured on its network.
    fn collective_models(&self) -> Option<&ModelSet> {
        let own = self
            .cluster
            .spec
            .models
            .as_ref()
            .is_some_and(|m| m.collectives);
        self.collectives
            .as_ref()
            .or_else(|| self.models.as_ref().filter(|_| own))
    }

    /// Composed under the calibration fitted on `framework`'s runs for this cluster, where its
    /// models have one; otherwise the cluster's calibration stays and the summary says so.
    pub fn with_framework(mut self, framework: Option<&str>) -> Self {
        let Some(framework) = framework else {
            return self;
        };
        let cluster = self.cluster;
        let lent = self.lent.as_ref();
        let found = self.models.as_ref().and_then(|m| {
            calibration_of(cluster, |name| {
                m.calibrations
                    .of_framework(name, framework)
                    .or_else(|| lent?.of_framework(name, framework))
            })
            .map(|(c, borrowed)| (c.clone(), borrowed))
        });
        match found {
            Some((c, borrowed)) => self.compose_under(&c, borrowed),
            None => {
                let why = format!(
                    "no calibration under {framework} for {}",
                    self.cluster.spec.name
                );
                self.calibrated = Some(match self.calibrated.take() {
                    Some(s) => format!("{s}; {why}"),
                    None => why,
                });
            }
        }
        self
    }

    /// The same costs composed under another runtime (no longer the calibrated one).
    pub fn with_runtime(mut self, runtime: Runtime) -> Self {
        self.runtime = runtime;
        self.calibrated = None;
        self.calibrated_range = None;
        self.calibrated_sets.clear();
        self.calibrated_held_out.clear();
        self.runtime_sigma_log = None;
        self.runtime_sigma_by_dtype.clear();
        self
    }

    /// The same costs composed under the cluster's default runtime, not its calibration.
    /// The interval then carries the raw physics' error on the calibration's runs instead.
    pub fn uncalibrated(self) -> Self {
        let runtime = self.cluster.spec.runtime;
        let raw = self.raw_sigma_log;
        let mut uncalibrated = self.with_runtime(runtime);
        uncalibrated.runtime_sigma_log = raw;
        uncalibrated
    }

    /// How the runtime was calibrated ("calibrated on N runs (…)"), or none for the defaults.
    pub fn calibration_summary(&self) -> Option<&str> {
        self.calibrated.as_deref()
    }

    /// The composed runtime's error on measured runs as σ of ln(predicted / measured) (the
    /// calibration's cross-validated error, or the raw physics' on the same runs; none where no
    /// runs measured it): the part of a step's uncertainty no operator model carries.
    pub fn runtime_sigma_log(&self) -> Option<f64> {
        self.runtime_sigma_log
    }

    /// The same for a step trained in `dtype` (its name: bf16, fp8, …): the calibration's
    /// spread on runs of that type where it had enough of them, else over all its runs.
    pub fn runtime_sigma_log_for(&self, dtype: &str) -> Option<f64> {
        self.runtime_sigma_log.map(|all| {
            self.runtime_sigma_by_dtype
                .get(dtype)
                .copied()
                .unwrap_or(all)
        })
    }

    /// The training types the calibration gives a spread of their own, and that spread.
    pub fn runtime_sigma_by_dtype(&self) -> &BTreeMap<String, f64> {
        &self.runtime_sigma_by_dtype
    }

    /// The range of the runs the runtime was calibrated on, where known.
    pub fn calibration_range(&self) -> Option<&FittedRange> {
        self.calibrated_range.as_ref()
    }

    /// The source sets of this cluster's runs the runtime was calibrated on (none for the
    /// defaults or a calibration borrowed from another cluster).
    pub fn calibration_sets(&self) -> &[String] {
        &self.calibrated_sets
    }

    /// The calibration's error on the runs of each set it was not fitted on (empty for the
    /// defaults, or a calibration fitted on every set it had).
    pub fn calibration_held_out(&self) -> &BTreeMap<String, ErrorStats> {
        &self.calibrated_held_out
    }

    /// The runtime steps are composed under (see `hardware::Runtime`).
    pub fn runtime(&self) -> Runtime {
        self.runtime
    }

    /// The cost of one call (cached: each query is costed once).
    pub fn estimate(&self, q: &OpQuery) -> Result<Estimate> {
        if let Some(e) = self.cache.lock().expect("not poisoned").get(q) {
            return Ok(e.clone());
        }
        let mut e = if q.op.is_collective() {
            self.collective(q)?
        } else {
            match self.learned(q)? {
                Some(e) => e,
                None => match self.transferred(q)? {
                    Some(e) => e,
                    None => self.roofline(q),
                },
            }
        };
        if !(e.time_us.is_finite() && e.time_us > 0.0) {
            let dir = self
                .models
                .as_ref()
                .map(|m| m.dir.display().to_string())
                .unwrap_or_else(|| self.cluster.path.display().to_string());
            return Err(crate::error::Error::Invalid(format!(
                "{dir}: {} gives {} µs for {q}, not a time: its models or inputs are corrupt; \
                 retrain with `stepcast train` or check the cluster file",
                e.model, e.time_us
            )));
        }
        let spec = &self.cluster.spec;
        let unaligned = spec.achievable.gemm_unaligned();
        if let Some((bytes, kept)) = alignment::misaligned(q, unaligned) {
            e.add_note(format!(
                "operand rows only {bytes}-byte aligned: {:.0} % of the aligned speed \
                 (achievable.gemm_unaligned {unaligned} at 2 bytes), {:.1} µs aligned",
                100.0 * kept,
                e.time_us
            ));
            e.time_us /= kept;
        }
        if let Some(floor) = roofline::floor_us(q, &spec.gpu, &spec.achievable) {
            if e.time_us < floor {
                let raised = format!(
                    "raised from {:.1} µs to the physical floor (roofline at the best achievable \
                     fraction of peak)",
                    e.time_us
                );
                e.add_note(raised);
                e.floored_from_us = Some(e.time_us);
                e.time_us = floor;
            }
        }
        if let Some((fraction, slower)) =
            roofline::flash_attention_2_floor_us(q, &spec.gpu, &spec.achievable)
        {
            if e.time_us < slower {
                let note = format!(
                    "FlashAttention-2: at most {:.0} % of dense peak on this GPU (achievable.\
                     flash_attention_2_{}), {:.1} µs as learned",
                    100.0 * fraction,
                    q.phase,
                    e.time_us
                );
                e.add_note(note);
                e.time_us = slower;
            }
        }
        self.cache
            .lock()
            .expect("not poisoned")
            .insert(*q, e.clone());
        Ok(e)
    }

    fn learned(&self, q: &OpQuery) -> Result<Option<Estimate>> {
        let Some(set) = &self.models else {
            return Ok(None);
        };
        if let Some((m, how)) = set.lookup(q)? {
            return Ok(Some(from_model(m, how, q)));
        }
        let fwd = OpQuery {
            phase: Phase::Fwd,
            ..*q
        };
        if q.phase != Phase::Bwd {
            return Ok(None);
        }
        let Some((m, how)) = set.lookup(&fwd)? else {
            return Ok(None);
        };
        let derived = match (q.op, q.shape) {
            (OpKind::Gemm, Shape::Gemm(g)) => {
                // dX[m,k] = dY[m,n]·Wᵀ and dW[k,n] = Xᵀ·dY[m,n], timed as forward GEMMs
                let dgrad = Shape::Gemm(GemmShape {
                    m: g.m,
                    n: g.k,
                    k: g.n,
                    batch: g.batch,
                });
                let wgrad = Shape::Gemm(GemmShape {
                    m: g.k,
                    n: g.n,
                    k: g.m,
                    batch: g.batch,
                });
                let a = from_model(
                    m,
                    how,
                    &OpQuery {
                        shape: dgrad,
                        ..fwd
                    },
                );
                let b = from_model(
                    m,
                    how,
                    &OpQuery {
                        shape: wgrad,
                        ..fwd
                    },
                );
                let mut e = combine(a, b);
                e.note = Some("data- plus weight-gradient GEMMs through the forward model".into());
                e
            }
            (OpKind::FlashAttention, _) => {
                let mut e = from_model(m, how, &fwd);
                match self.measured_bwd_ratio(q)? {
                    Some((ratio, gpu)) => {
                        e.time_us *= ratio;
                        e.note = Some(format!(
                            "{ratio:.2} × the learned forward: the backward/forward ratio {gpu} \
                             measured at this shape"
                        ));
                    }
                    None => {
                        e.time_us *= FLASH_BWD_OVER_FWD;
                        e.note = Some(
                            "2.5 × the learned forward (FlashAttention-2 backward/forward work; \
                             no measured ratio)"
                                .into(),
                        );
                    }
                }
                e
            }
            _ => return Ok(None),
        };
        Ok(Some(Estimate {
            source: Source::Derived,
            ..derived
        }))
    }

    /// The backward/forward time ratio of fused attention at `q`'s shape from the first
    /// transfer set that measured both phases and gives a physical ratio (the backward does
    /// 2.5× the forward's FLOPs at lower efficiency: 2–5).
    fn measured_bwd_ratio(&self, q: &OpQuery) -> Result<Option<(f64, String)>> {
        for set in &self.transfer {
            let fwd = OpQuery {
                phase: Phase::Fwd,
                ..*q
            };
            let (Some((mb, hb)), Some((mf, hf))) = (set.lookup(q)?, set.lookup(&fwd)?) else {
                continue;
            };
            let ratio = from_model(mb, hb, q).time_us / from_model(mf, hf, &fwd).time_us;
            if (2.0..=5.0).contains(&ratio) {
                return Ok(Some((ratio, set.gpu().name.clone())));
            }
        }
        Ok(None)
    }

    /// A kernel this cluster's models lack, from the first transfer set that has it: its time
    /// on that set's GPU times the ratio of the two GPUs' rooflines at this call.
    fn transferred(&self, q: &OpQuery) -> Result<Option<Estimate>> {
        let gpu = &self.cluster.spec.gpu;
        let allowed = self
            .cluster
            .spec
            .models
            .as_ref()
            .is_none_or(|m| m.transfers(q));
        if !allowed {
            return Ok(None);
        }
        for set in &self.transfer {
            let Some((m, how)) = set.lookup(q)? else {
                continue;
            };
            let (Some(here), Some(there)) = (
                roofline::device_time_us(q, gpu),
                roofline::device_time_us(q, set.gpu()),
            ) else {
                continue;
            };
            let mut e = from_model(m, how, q);
            e.time_us *= here / there.max(f64::MIN_POSITIVE);
            e.source = Source::Transferred;
            e.model = format!("{} on {}", m.key, set.gpu().name);
            let note = format!("transferred from {} by the roofline ratio", set.gpu().name);
            e.add_note(note);
            // a transfer is less certain than the model at home
            e.sigma_log = (e.sigma_log.powi(2) + TRANSFER_SIGMA.powi(2)).sqrt();
            return Ok(Some(e));
        }
        Ok(None)
    }

    fn roofline(&self, q: &OpQuery) -> Estimate {
        let spec = &self.cluster.spec;
        let eff = spec.efficiency;
        Estimate {
            time_us: roofline::derated_time_us(q, &spec.gpu, &eff).unwrap_or(eff.kernel_launch_us),
            // where one number is needed (a factor's band replaces it): the band's upper side
            sigma_log: ROOFLINE_BAND.1.ln() / super::Z80,
            source: Source::Roofline,
            model: "roofline".into(),
            note: Some(format!(
                "no model: {:.0} % of peak FLOP/s, {:.0} % of HBM bandwidth, {} µs launch",
                eff.compute * 100.0,
                eff.memory * 100.0,
                eff.kernel_launch_us
            )),
            out_of_coverage: Vec::new(),
            floored_from_us: None,
        }
    }

    fn collective(&self, q: &OpQuery) -> Result<Estimate> {
        let c = q.shape.collective().expect("collective shape");
        let spec = &self.cluster.spec;
        let (analytic, algorithm) =
            network::collective_time_us(q.op, c, &spec.network, spec.efficiency.network);
        if let Some(set) = self.collective_models() {
            if let Some((m, how)) = set.lookup(q)? {
                if covers(m, c) {
                    return Ok(from_model(m, how, q));
                }
            }
            if let Some(cal) = self.calibration(set, q, c.nodes > 1)? {
                return Ok(Estimate {
                    time_us: analytic * cal.factor,
                    sigma_log: cal.sigma_log,
                    source: Source::CalibratedAnalytic,
                    model: format!("calibrated {} ({})", q.op, tier_name(c.nodes > 1)),
                    note: Some(format!(
                        "{algorithm} × {:.3}, fitted on the measured {}",
                        cal.factor, cal.from
                    )),
                    out_of_coverage: Vec::new(),
                    floored_from_us: None,
                });
            }
        }
        Ok(Estimate {
            time_us: analytic,
            sigma_log: ANALYTIC_SIGMA,
            source: Source::Analytic,
            model: format!("analytic {}", tier_name(c.nodes > 1)),
            note: Some(format!(
                "{algorithm}, {:.0} % of link bandwidth (no measured layout to calibrate on)",
                spec.efficiency.network * 100.0
            )),
            out_of_coverage: Vec::new(),
            floored_from_us: None,
        })
    }

    /// Ratio of learned to analytic time over the measured layouts of one tier (single node or
    /// several), from the query's own collective if it was measured there, else from the first
    /// other collective that was.
    fn calibration(
        &self,
        set: &ModelSet,
        q: &OpQuery,
        multi_node: bool,
    ) -> Result<Option<Calibration>> {
        let key = (q.op, multi_node);
        if let Some(c) = self.calibrations.lock().expect("not poisoned").get(&key) {
            return Ok(c.clone());
        }
        let order = [
            q.op,
            OpKind::AllReduce,
            OpKind::AllGather,
            OpKind::ReduceScatter,
            OpKind::SendRecv,
            OpKind::AllToAll,
        ];
        let mut found = None;
        for op in order {
            let probe = OpQuery { op, ..*q };
            let Some((m, _)) = set.lookup(&probe)? else {
                continue;
            };
            if let Some(c) = fit(self.cluster, m, &probe, multi_node) {
                found = Some(c);
                break;
            }
        }
        self.calibrations
            .lock()
            .expect("not poisoned")
            .insert(key, found.clone());
        Ok(found)
    }
}

fn tier_name(multi_node: bool) -> &'static str {
    if multi_node {
        "across nodes"
    } else {
        "inside a node"
    }
}

/// Whether a learned collective model measured this layout and message size.
fn covers(m: &TrainedModel, c: &CollectiveShape) -> bool {
    if !m.layouts.contains(&[c.nodes, c.gpus_per_node]) {
        return false;
    }
    let bytes = (c.bytes as f64).max(1.0).log2();
    let [lo, hi] = m.feature_ranges[COLLECTIVE_LOG2_BYTES];
    bytes >= lo - 1e-9 && bytes <= hi + 1e-9
}

fn fit(
    cluster: &Cluster,
    m: &TrainedModel,
    probe: &OpQuery,
    multi_node: bool,
) -> Option<Calibration> {
    let spec = &cluster.spec;
    let mut logs = Vec::new();
    let mut used = Vec::new();
    let times = m.probe_times_us();
    for (c, learned) in m.probe_shapes().iter().zip(times.iter()) {
        if (c.nodes > 1) != multi_node {
            continue;
        }
        let layout = format!("{}×{}", c.nodes, c.gpus_per_node);
        if used.last() != Some(&layout) {
            used.push(layout);
        }
        let (analytic, _) =
            network::collective_time_us(probe.op, c, &spec.network, spec.efficiency.network);
        logs.push((learned / analytic).ln());
    }
    if logs.is_empty() {
        return None;
    }
    let mean = logs.iter().sum::<f64>() / logs.len() as f64;
    let var = logs.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / logs.len() as f64;
    Some(Calibration {
        factor: mean.exp(),
        sigma_log: (var + m.validation.sigma_log.powi(2)).sqrt(),
        from: format!("{} layouts {}", probe.op, used.join(", ")),
    })
}

/// A learned model's estimate of `q`, handling a causal query on a model trained only without
/// a mask (and back) by the 2:1 work ratio.
fn from_model(m: &TrainedModel, how: Match, q: &OpQuery) -> Estimate {
    let mut query = *q;
    let mut factor = 1.0;
    let mut notes = Vec::new();
    if let Shape::Attention(mut a) = q.shape {
        if q.op == OpKind::FlashAttention {
            let [lo, hi] = m.feature_ranges[ATTENTION_CAUSAL];
            let want = a.causal as u8 as f64;
            if want < lo || want > hi {
                a.causal = !a.causal;
                query.shape = Shape::Attention(a);
                factor = if q_causal(q) { 0.5 } else { 2.0 };
                notes.push(if q_causal(q) {
                    "causal as half the unmasked model's time"
                } else {
                    "unmasked as twice the causal model's time"
                });
            }
        }
    }
    let p = m.predict(&query);
    if how == Match::TwinDtype {
        notes.push("model of the twin 16-bit type");
    }
    if how == Match::PooledBeyondRoleRange {
        notes.push("pooled model of the kind: it covers the shape better than the role's");
    } else if q.role.is_some() && m.key.role.is_none() {
        notes.push("pooled model of the kind");
    }
    Estimate {
        time_us: p.time_us * factor,
        sigma_log: p.sigma_log,
        source: if factor == 1.0 {
            Source::Learned
        } else {
            Source::Derived
        },
        model: m.key.to_string(),
        note: (!notes.is_empty()).then(|| notes.join("; ")),
        out_of_coverage: p.out_of_coverage,
        floored_from_us: None,
    }
}

fn q_causal(q: &OpQuery) -> bool {
    matches!(q.shape, Shape::Attention(a) if a.causal)
}

/// Sum of two estimates of the same model (errors fully correlated).
fn combine(a: Estimate, b: Estimate) -> Estimate {
    let mut ooc = a.out_of_coverage;
    for f in b.out_of_coverage {
        if !ooc.contains(&f) {
            ooc.push(f);
        }
    }
    Estimate {
        time_us: a.time_us + b.time_us,
        sigma_log: a.sigma_log.max(b.sigma_log),
        out_of_coverage: ooc,
        ..a
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::dgx_h100_without_models;
    use crate::ops::{AttentionShape, Dtype, TokenShape};

    /// A cluster's own calibration wins over the one its file borrows, which stands in only
    /// when the cluster has none; a file that borrows nothing gets nothing.
    #[test]
    fn a_borrowed_calibration_stands_in_only_for_a_missing_one() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let perlmutter =
            Cluster::load(&dir.join("hardware-profiles/perlmutter.yaml")).expect("shipped");
        let (own, theirs) = (
            FittedRuntime::example("perlmutter", 30.0),
            FittedRuntime::example("dgx-a100", 50.0),
        );
        let both = |name: &str| [&own, &theirs].into_iter().find(|c| c.cluster == name);
        let (c, borrowed) = calibration_of(&perlmutter, both).unwrap();
        assert!(!borrowed && c.runtime.launch_us == 30.0);
        let only_theirs = |name: &str| Some(&theirs).filter(|c| c.cluster == name);
        let (c, borrowed) = calibration_of(&perlmutter, only_theirs).unwrap();
        assert!(borrowed && c.runtime.launch_us == 50.0);
        assert!(summary(c, borrowed, &perlmutter).contains("borrowed by perlmutter"));
        let h100 = Cluster::load(&dir.join("hardware-profiles/dgx-h100.yaml")).expect("shipped");
        assert!(calibration_of(&h100, only_theirs).is_none());
    }

    fn shipped(name: &str) -> ModelSet {
        ModelSet::builtin(name).expect("shipped models")
    }

    fn call(op: OpKind, phase: Phase, shape: Shape) -> OpQuery {
        OpQuery {
            op,
            phase,
            dtype: Dtype::Bf16,
            role: None,
            shape,
        }
    }

    fn gemm(m: u64, n: u64, k: u64) -> OpQuery {
        let shape = Shape::Gemm(GemmShape { m, n, k, batch: 1 });
        call(OpKind::Gemm, Phase::Fwd, shape)
    }

    /// What `models` answer for `q` by themselves (their model of its kind, nothing after).
    fn answered(models: &ModelSet, q: &OpQuery) -> Estimate {
        let (m, how) = models.lookup(q).unwrap().expect("a model of the kind");
        from_model(m, how, q)
    }

    /// A cost model composes under the calibration its models hold for the cluster — its
    /// runtime, the sets it was fitted on, its errors on the sets held out, its spread — and
    /// composed uncalibrated, under the cluster's defaults with the raw physics' spread and
    /// none of the rest.
    #[test]
    fn a_cost_model_composes_under_the_calibration_its_models_hold() {
        let c = dgx_h100_without_models();
        let models = shipped("h100-sxm");
        let fitted = models
            .calibrations
            .of(&c.spec.name)
            .expect("dgx-h100's")
            .clone();
        let cost = CostModel::new(&c, Some(models));
        assert_eq!(cost.runtime(), fitted.runtime);
        assert_ne!(fitted.runtime, c.spec.runtime);
        let sets: Vec<String> = fitted.fitted_on.sets.keys().cloned().collect();
        assert!(!sets.is_empty());
        assert_eq!(cost.calibration_sets(), sets.as_slice());
        assert!(!fitted.held_out.is_empty());
        assert_eq!(cost.calibration_held_out(), &fitted.held_out);
        assert_eq!(cost.runtime_sigma_log(), Some(fitted.sigma_log()));
        let raw = cost.uncalibrated();
        assert_eq!(raw.runtime(), c.spec.runtime);
        assert_eq!(raw.runtime_sigma_log(), Some(fitted.raw_sigma_log()));
        assert_eq!(raw.calibration_summary(), None);
        assert!(raw.calibration_sets().is_empty() && raw.calibration_held_out().is_empty());
    }

    /// A kernel the cluster's models lack comes from the first other GPU's models that have it
    /// (GH200 before A100 for an H100), times the ratio of the two GPUs' rooflines at the call,
    /// and less certain by `TRANSFER_SIGMA`; a kind the cluster file does not list for transfer
    /// (a layer norm's backward, for dgx-h100) stays on the roofline.
    #[test]
    fn a_kernel_the_models_lack_is_transferred_by_the_roofline_ratio() {
        let c = dgx_h100_without_models();
        let gh200 = shipped("vista");
        let cost = CostModel::new(&c, Some(shipped("h100-sxm")))
            .with_transfer(vec![shipped("vista"), shipped("perlmutter")]);
        let norm = |phase| {
            let rows = TokenShape {
                batch: 2,
                seq: 4096,
                width: 4096,
            };
            call(OpKind::LayerNorm, phase, Shape::Tokens(rows))
        };
        let fwd = norm(Phase::Fwd);
        let e = cost.estimate(&fwd).unwrap();
        let there = answered(&gh200, &fwd);
        let ratio = roofline::device_time_us(&fwd, &c.spec.gpu).unwrap()
            / roofline::device_time_us(&fwd, gh200.gpu()).unwrap();
        assert!((ratio - 1.0).abs() > 0.05, "{ratio}");
        assert_eq!(e.source, Source::Transferred);
        assert_eq!(e.model, format!("{} on {}", there.model, gh200.gpu().name));
        assert!(e.floored_from_us.is_none(), "{e:?}");
        assert!((e.time_us - there.time_us * ratio).abs() < 1e-9 * e.time_us);
        let sigma = (there.sigma_log.powi(2) + TRANSFER_SIGMA.powi(2)).sqrt();
        assert!((e.sigma_log - sigma).abs() < 1e-12, "{e:?}");
        let note = e.note.unwrap_or_default();
        assert!(note.contains("transferred from NVIDIA GH200"), "{note}");
        let bwd = cost.estimate(&norm(Phase::Bwd)).unwrap();
        assert_eq!(bwd.source, Source::Roofline);
    }

    /// Where this GPU's models time only a fused attention's forward, its backward is the
    /// learned forward times the backward/forward ratio the first other GPU measured at the same
    /// shape within 2–5 (a GPU whose ratio lies outside is passed over).
    #[test]
    fn an_attention_backward_takes_the_ratio_another_gpu_measured() {
        let c = dgx_h100_without_models();
        let a100 = shipped("perlmutter");
        let attention = AttentionShape {
            batch: 1,
            seq_q: 4096,
            seq_kv: 4096,
            heads: 32,
            kv_heads: 32,
            head_dim: 128,
            causal: true,
        };
        let bwd = call(
            OpKind::FlashAttention,
            Phase::Bwd,
            Shape::Attention(attention),
        );
        let fwd = OpQuery {
            phase: Phase::Fwd,
            ..bwd
        };
        let ratio = |set: &ModelSet| answered(set, &bwd).time_us / answered(set, &fwd).time_us;
        // the GH200 models, far beyond the sequences the paper measured, put this backward
        // faster than its forward: not physical, passed over
        let unphysical = ratio(&shipped("vista"));
        assert!(!(2.0..=5.0).contains(&unphysical), "{unphysical}");
        let measured = ratio(&a100);
        assert!((2.0..=5.0).contains(&measured), "{measured}");
        let cost = CostModel::new(&c, Some(shipped("h100-aiconfigurator")))
            .with_transfer(vec![shipped("vista"), shipped("perlmutter")]);
        let (e, forward) = (cost.estimate(&bwd).unwrap(), cost.estimate(&fwd).unwrap());
        assert_eq!(e.source, Source::Derived);
        assert!(e.floored_from_us.is_none() && forward.floored_from_us.is_none());
        assert!((e.time_us - measured * forward.time_us).abs() < 1e-9 * e.time_us);
        let note = e.note.unwrap_or_default();
        assert!(note.contains(&a100.gpu().name), "{note}");
    }

    fn collective(op: OpKind, bytes: u64, nodes: u64, gpus_per_node: u64) -> OpQuery {
        let shape = Shape::Collective(CollectiveShape {
            bytes,
            nodes,
            gpus_per_node,
        });
        OpQuery {
            dtype: Dtype::Fp16,
            ..call(op, Phase::None, shape)
        }
    }

    /// The analytic network model's time of a collective call on cluster `c`.
    fn analytic_us(c: &Cluster, q: &OpQuery) -> f64 {
        let shape = q.shape.collective().unwrap();
        network::collective_time_us(q.op, shape, &c.spec.network, c.spec.efficiency.network).0
    }

    /// Learned / analytic over a collective model's probes of the layouts of one tier: the
    /// geometric mean, the σ it carries (the ratios' spread and the model's own) and the
    /// layouts it was taken on, as a note lists them.
    fn tier_ratio(c: &Cluster, m: &TrainedModel, across_nodes: bool) -> (f64, f64, String) {
        let (mut logs, mut layouts) = (Vec::new(), Vec::<String>::new());
        let probes = m.probe_shapes();
        for (shape, learned) in probes.iter().zip(m.probe_times_us().iter()) {
            if (shape.nodes > 1) != across_nodes {
                continue;
            }
            let probe = collective(m.key.op, shape.bytes, shape.nodes, shape.gpus_per_node);
            logs.push((learned / analytic_us(c, &probe)).ln());
            let layout = format!("{}×{}", shape.nodes, shape.gpus_per_node);
            if !layouts.contains(&layout) {
                layouts.push(layout);
            }
        }
        let n = logs.len() as f64;
        let mean = logs.iter().sum::<f64>() / n;
        let var = logs.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / n;
        let sigma = (var + m.validation.sigma_log.powi(2)).sqrt();
        (mean.exp(), sigma, layouts.join(", "))
    }

    /// Collectives: a layout and size the node's NCCL timings measured is learned, up to both
    /// ends of the sizes measured; a larger message, or a kind not measured (send/recv), is the
    /// analytic model times the geometric mean of learned / analytic over the measured layouts
    /// of its tier (its own kind's, else all-reduce's); across nodes, with one node measured, the
    /// analytic model alone.
    #[test]
    fn collectives_beyond_the_measured_calls_scale_the_analytic_model_by_the_measured_ratio() {
        let c = dgx_h100_without_models();
        let nccl = shipped("h100-aiconfigurator");
        let cost = CostModel::new(&c, None).with_collectives(Some(shipped("h100-aiconfigurator")));
        let (all_reduce, _) = nccl
            .lookup(&collective(OpKind::AllReduce, 1 << 20, 1, 8))
            .unwrap()
            .unwrap();
        assert!(all_reduce.layouts.iter().all(|&[nodes, _]| nodes == 1));
        let [lo, hi] = all_reduce.feature_ranges[COLLECTIVE_LOG2_BYTES];
        for log2 in [lo, hi] {
            let q = collective(OpKind::AllReduce, log2.exp2() as u64, 1, 8);
            assert_eq!(cost.estimate(&q).unwrap().source, Source::Learned, "{q}");
        }
        let (factor, sigma, layouts) = tier_ratio(&c, all_reduce, false);
        assert!((factor - 1.0).abs() > 0.01, "{factor}");
        let larger = collective(OpKind::AllReduce, (hi + 2.0).exp2() as u64, 1, 8);
        let send = collective(OpKind::SendRecv, 1 << 24, 1, 2);
        for q in [larger, send] {
            let e = cost.estimate(&q).unwrap();
            assert_eq!(e.source, Source::CalibratedAnalytic, "{q}");
            assert_eq!(e.model, format!("calibrated {} (inside a node)", q.op));
            let time = analytic_us(&c, &q) * factor;
            assert!((e.time_us - time).abs() < 1e-9 * e.time_us, "{q}");
            assert!((e.sigma_log - sigma).abs() < 1e-12, "{q}");
            let from = format!("fitted on the measured all_reduce layouts {layouts}");
            assert!(e.note.unwrap_or_default().ends_with(&from), "{q}");
        }
        let across = cost
            .estimate(&collective(OpKind::AllReduce, 1 << 24, 2, 8))
            .unwrap();
        assert_eq!(across.source, Source::Analytic);
        assert_eq!(across.model, "analytic across nodes");
        assert_eq!(across.sigma_log, ANALYTIC_SIGMA);
        let inside = CostModel::new(&c, None).estimate(&send).unwrap();
        assert_eq!(
            (inside.source, inside.model.as_str()),
            (Source::Analytic, "analytic inside a node")
        );
        assert_eq!(inside.time_us, analytic_us(&c, &send));
    }

    /// Perlmutter's own NCCL timings span one to eight nodes: a message beyond the sizes
    /// measured takes the ratio of its own tier's layouts, inside a node or across nodes.
    #[test]
    fn each_tier_of_collectives_takes_the_ratio_of_its_own_layouts() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let c = Cluster::load(&dir.join("hardware-profiles/perlmutter.yaml")).expect("shipped");
        let models = shipped("perlmutter");
        let (all_reduce, _) = models
            .lookup(&collective(OpKind::AllReduce, 1 << 20, 1, 4))
            .unwrap()
            .unwrap();
        let hi = all_reduce.feature_ranges[COLLECTIVE_LOG2_BYTES][1];
        let cost = CostModel::new(&c, Some(shipped("perlmutter")));
        let mut factors = Vec::new();
        for (nodes, across_nodes, tier) in [(1, false, "inside a node"), (16, true, "across nodes")]
        {
            let q = collective(OpKind::AllReduce, (hi + 2.0).exp2() as u64, nodes, 4);
            let (factor, sigma, layouts) = tier_ratio(&c, all_reduce, across_nodes);
            let e = cost.estimate(&q).unwrap();
            assert_eq!(e.source, Source::CalibratedAnalytic, "{q}");
            assert_eq!(e.model, format!("calibrated all_reduce ({tier})"));
            let time = analytic_us(&c, &q) * factor;
            assert!((e.time_us - time).abs() < 1e-9 * e.time_us, "{q}");
            assert!((e.sigma_log - sigma).abs() < 1e-12, "{q}");
            let from = format!("fitted on the measured all_reduce layouts {layouts}");
            assert!(e.note.unwrap_or_default().ends_with(&from), "{q}");
            factors.push(factor);
        }
        assert!((factors[0] / factors[1] - 1.0).abs() > 0.01, "{factors:?}");
    }

    /// An estimate faster than the call's physical floor is raised to it and keeps what the
    /// model said; where no model answers, the roofline derated by the cluster's efficiencies,
    /// with the upper side of the roofline's measured band as its σ.
    #[test]
    fn an_estimate_below_the_physical_floor_is_raised_to_it() {
        let mut c = dgx_h100_without_models();
        let q = gemm(4096, 4096, 4096);
        let roofline = CostModel::new(&c, None).estimate(&q).unwrap();
        assert_eq!(roofline.source, Source::Roofline);
        let derated = roofline::derated_time_us(&q, &c.spec.gpu, &c.spec.efficiency).unwrap();
        assert_eq!(roofline.time_us, derated);
        assert_eq!(roofline.sigma_log, ROOFLINE_BAND.1.ln() / super::super::Z80);
        // no kernel shorter than a second
        c.spec.achievable.min_kernel_us = 1e6;
        let models = shipped("h100-sxm");
        let learned = answered(&models, &q).time_us;
        assert!(learned < 1e4, "{learned}");
        let e = CostModel::new(&c, Some(models)).estimate(&q).unwrap();
        assert_eq!((e.time_us, e.floored_from_us), (1e6, Some(learned)));
        assert!(e.note.unwrap_or_default().contains("physical floor"));
    }

    /// A GEMM whose operand rows are not 16-byte aligned keeps only part of the aligned speed
    /// (`achievable.gemm_unaligned`): the model's time divided by that share.
    #[test]
    fn an_unaligned_gemm_is_the_models_time_over_the_share_it_keeps() {
        let c = dgx_h100_without_models();
        let models = shipped("h100-sxm");
        let q = gemm(4096, 4095, 4096);
        let (_, kept) = alignment::misaligned(&q, c.spec.achievable.gemm_unaligned()).unwrap();
        assert!(kept < 0.9, "{kept}");
        let learned = answered(&models, &q).time_us;
        let e = CostModel::new(&c, Some(models)).estimate(&q).unwrap();
        assert!(e.floored_from_us.is_none());
        assert!(
            (e.time_us - learned / kept).abs() < 1e-9 * e.time_us,
            "{e:?}"
        );
    }

    /// A cost that is not a finite, positive time is an error naming where it came from, not
    /// a step: a GEMM at no FLOP/s takes forever, a call with no work and no launch nothing.
    #[test]
    fn a_cost_that_is_not_a_time_is_refused() {
        let mut c = dgx_h100_without_models();
        c.spec.efficiency.compute = 0.0;
        let forever = CostModel::new(&c, None).estimate(&gemm(4096, 4096, 4096));
        let why = forever.unwrap_err().to_string();
        assert!(why.contains("not a time"), "{why}");
        let mut c = dgx_h100_without_models();
        c.spec.efficiency.kernel_launch_us = 0.0;
        let nothing = CostModel::new(&c, None).estimate(&gemm(0, 0, 0));
        assert!(nothing.unwrap_err().to_string().contains("not a time"));
    }

    /// A fused attention model measured only unmasked answers a causal call with half the
    /// unmasked call's time (half the work), one measured only causal an unmasked call with
    /// twice the causal call's; both say so and count as derived, not learned.
    #[test]
    fn a_mask_the_model_did_not_measure_scales_by_the_work_it_skips() {
        let full = AttentionShape {
            batch: 2,
            seq_q: 2048,
            seq_kv: 2048,
            heads: 16,
            kv_heads: 16,
            head_dim: 128,
            causal: false,
        };
        let attention = |causal| {
            let shape = Shape::Attention(AttentionShape { causal, ..full });
            call(OpKind::FlashAttention, Phase::Fwd, shape)
        };
        // the paper's A100 flash-attn timings are unmasked, NVIDIA's H100 ones causal prefill
        let cases = [
            ("perlmutter", true, 0.5, "causal as half"),
            ("h100-aiconfigurator", false, 2.0, "unmasked as twice"),
        ];
        for (name, causal, factor, said) in cases {
            let set = shipped(name);
            let (asked, measured) = (attention(causal), attention(!causal));
            let (m, how) = set.lookup(&asked).unwrap().unwrap();
            let e = from_model(m, how, &asked);
            assert_eq!(e.source, Source::Derived, "{name}");
            let direct = m.predict(&measured).time_us;
            assert!(
                (e.time_us - factor * direct).abs() < 1e-9 * e.time_us,
                "{name}"
            );
            assert!(e.note.unwrap_or_default().contains(said), "{name}");
            let as_measured = from_model(m, how, &measured);
            assert_eq!(as_measured.source, Source::Learned, "{name}");
            assert_eq!(as_measured.time_us, direct, "{name}");
        }
    }

    /// An estimate says how its model answered: the twin 16-bit type's model, the kind's pooled
    /// model for a call with a role (and why, where the role has a model of its own); a call
    /// its own model answered says nothing.
    #[test]
    fn an_estimate_says_which_model_answered_and_why() {
        use crate::ops::Role;
        let gemm_as = |role, dtype, size| OpQuery {
            role,
            dtype,
            ..gemm(size, size, size)
        };
        // the paper's A100 GEMMs: fp16, with models of their own for some roles
        let a100 = shipped("perlmutter");
        let cases = [
            (None, Dtype::Fp16, 3072, Match::Exact, None),
            (Some(Role::AttnOut), Dtype::Fp16, 3072, Match::Exact, None),
            (
                Some(Role::AttnOut),
                Dtype::Bf16,
                3072,
                Match::TwinDtype,
                Some("model of the twin 16-bit type"),
            ),
            (
                Some(Role::AttnOut),
                Dtype::Fp16,
                1024,
                Match::PooledBeyondRoleRange,
                Some("pooled model of the kind: it covers the shape better than the role's"),
            ),
        ];
        for (role, dtype, size, expected, said) in cases {
            let q = gemm_as(role, dtype, size);
            let (m, how) = a100.lookup(&q).unwrap().unwrap();
            assert_eq!(how, expected, "{q}");
            let e = from_model(m, how, &q);
            assert_eq!(e.note.as_deref(), said, "{q}");
            assert_eq!(e.source, Source::Learned, "{q}");
        }
        // NVIDIA's H100 GEMMs: one model for every role
        let h100 = shipped("h100-aiconfigurator");
        let q = gemm_as(Some(Role::MlpUp), Dtype::Bf16, 4096);
        let (m, how) = h100.lookup(&q).unwrap().unwrap();
        assert_eq!((how, m.key.role), (Match::Pooled, None));
        let note = from_model(m, how, &q).note;
        assert_eq!(note.as_deref(), Some("pooled model of the kind"));
    }

    /// Two estimates of one model add their times; their errors are correlated, so the
    /// larger σ stands, and each feature outside the model's range is listed once.
    #[test]
    fn two_estimates_of_one_model_add_up_with_the_larger_uncertainty() {
        let estimate = |time_us, sigma_log, outside: &[&str]| Estimate {
            time_us,
            sigma_log,
            source: Source::Learned,
            model: "gemm fwd bf16".into(),
            note: None,
            out_of_coverage: outside.iter().map(|f| f.to_string()).collect(),
            floored_from_us: None,
        };
        let sum = combine(
            estimate(1.0, 0.1, &["m", "k"]),
            estimate(2.0, 0.2, &["k", "n"]),
        );
        assert_eq!((sum.time_us, sum.sigma_log), (3.0, 0.2));
        assert_eq!(sum.out_of_coverage, ["m", "k", "n"]);
        let sum = combine(estimate(2.0, 0.3, &[]), estimate(1.0, 0.2, &[]));
        assert_eq!((sum.time_us, sum.sigma_log), (3.0, 0.3));
    }
}

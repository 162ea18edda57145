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
}

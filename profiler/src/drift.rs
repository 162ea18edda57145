//! After a driver or library update: does this machine still time operators the way the models
//! it predicts with were trained? `check` compares the software stamps, re-measures a probe and
//! compares it: given the dataset the models were trained from, a sample of that collection's
//! own points, each against its own time then (drift alone); without it, the quick probe plan
//! against the models' prediction (drift plus the models' error at the probe's points).
//! `retrain` re-collects the operator kinds that drifted past a threshold, keeps the rows of the
//! others from the previous dataset, and retrains the cluster's models (the old directory is kept
//! beside the new one).

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use serde::Serialize;
use stepcast::dataset::{Dataset, Measurement, MeasurementWriter};
use stepcast::hardware::Cluster;
use stepcast::ops::{Dtype, OpKind, OpQuery, Phase, Shape};
use stepcast::predict::cost::{CostModel, Source};
use stepcast::regress::train::{train, TrainOptions};
use stepcast::regress::{Manifest, ModelSet};

use crate::collect::{collect, without_kernel_role, CollectOptions};
use crate::device::Device;
use crate::plan::{Plan, PlanPoint, PlanSpec, Target};
use crate::torch::TorchBackend;

/// What a probe's time is compared with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reference {
    /// The time the models' own collection measured at the same point, on the same kernel:
    /// only the machine differs.
    Collection,
    /// The models' prediction: the models' error at the probe's point reads as drift too.
    Models,
}

impl Reference {
    pub fn name(self) -> &'static str {
        match self {
            Reference::Collection => "collection",
            Reference::Models => "models",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct KindDrift {
    pub op: OpKind,
    pub phase: Phase,
    pub against: Reference,
    pub points: usize,
    /// Median of measured / reference (the collection's time at the point, or the models'
    /// prediction).
    pub median_ratio: f64,
    pub mape_percent: f64,
    pub drifted: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct DriftReport {
    pub models: String,
    pub threshold_percent: f64,
    /// (field, the models' value, this machine's value).
    pub software_changes: Vec<(String, String, String)>,
    pub kinds: Vec<KindDrift>,
    /// Probes no learned model answers and no row of the collection measured (not compared).
    pub unmodelled: usize,
    /// The name of the dataset the models were trained from (their manifest's).
    pub models_dataset: String,
    /// The dataset whose points were probed again (none: the quick probe plan's points).
    pub previous_dataset: Option<String>,
    /// Where the probe measurements were kept; none: a private directory, removed.
    pub probe_dataset: Option<String>,
}

impl DriftReport {
    pub fn drifted_kinds(&self) -> Vec<OpKind> {
        let mut k: Vec<OpKind> = self
            .kinds
            .iter()
            .filter(|d| d.drifted)
            .map(|d| d.op)
            .collect();
        k.sort();
        k.dedup();
        k
    }
}

pub fn target_of(device: &dyn Device, nodes: u32) -> Target {
    let info = device.info();
    Target {
        gpus_per_node: info.gpus,
        nodes,
        fp8: info.gpu.peak_dense_tflops.fp8.is_some(),
    }
}

/// Probe points a check takes from each (kind, phase, type) of the models' collection: spread
/// over its times, smallest to largest; some 30 groups make a probe of a few hundred points, as
/// long as the quick plan's.
pub const PROBES_PER_GROUP: usize = 12;

/// Re-measures a probe into `probe_dir` (none: a private temporary directory) and compares it.
/// With `previous`, the dataset the models were trained from, the probe is a sample of that
/// collection's own points timed with its protocol, each compared with the time it measured
/// then; without it, the quick probe plan, compared with the models' predictions.
pub fn check(
    cluster: &Cluster,
    device: &mut dyn Device,
    torch: Option<&TorchBackend>,
    previous: Option<&Dataset>,
    probe_dir: Option<&Path>,
    threshold_percent: f64,
    progress: bool,
) -> anyhow::Result<DriftReport> {
    let dir = cluster.models_dir.clone().ok_or_else(|| {
        stepcast::Error::Invalid(format!(
            "{}: names no models directory to check: give a cluster file whose models.dir \
             names the models trained on this node",
            cluster.path.display()
        ))
    })?;
    let models = ModelSet::open(&dir)?;
    let info = device.info();
    if models.gpu().name != info.gpu.name {
        anyhow::bail!(stepcast::Error::Invalid(format!(
            "{} were trained on {}; this node has {}: check them on such a node",
            dir.display(),
            models.gpu().name,
            info.gpu.name
        )));
    }
    if let Some(old) = previous {
        let theirs = models.dataset();
        if old.fingerprint != theirs.fingerprint {
            anyhow::bail!(stepcast::Error::Invalid(format!(
                "{}: is not the dataset {} were trained from ('{}', fingerprint {}; this one \
                 is '{}', {}): give that dataset to --previous, or check without it",
                old.dir.display(),
                dir.display(),
                theirs.name,
                theirs.fingerprint,
                old.meta.name,
                old.fingerprint
            )));
        }
    }
    if let Some(d) = probe_dir.filter(|d| d.join(stepcast::dataset::META_FILE).exists()) {
        // collect's advice (--resume) is not check's: each check measures the probe afresh
        anyhow::bail!(stepcast::Error::Invalid(format!(
            "{}: already holds a dataset: give --out a new directory",
            d.display()
        )));
    }
    let target = target_of(device, 1);
    let mut plan = PlanSpec::builtin(true).expand(target)?;
    if let Some(old) = previous {
        plan.points = probe_points(&old.rows, target, PROBES_PER_GROUP);
        if let Some(p) = &old.meta.protocol {
            let theirs = crate::protocol::Protocol {
                warmup: p.warmup_runs,
                timed: p.timed_runs,
                keep: p.kept_middle,
            };
            // a protocol this collector refuses (an imported dataset's) leaves the plan's
            if theirs.validate().is_ok() {
                plan.spec.protocol = theirs;
            }
        }
    }
    let kept = probe_dir.map(|d| d.display().to_string());
    let private;
    let probe_dir = match probe_dir {
        Some(d) => d.to_path_buf(),
        None => {
            private = tempfile::Builder::new()
                .prefix("stepcast-probe-")
                .tempdir()?;
            private.path().join("probe")
        }
    };
    collect(
        &plan,
        device,
        torch,
        &CollectOptions {
            out: probe_dir.clone(),
            resume: false,
            retry_skipped: false,
            progress,
            launch: None,
        },
    )?;
    let probe = Dataset::load(&probe_dir)?;
    let software_changes = models
        .dataset()
        .software
        .differences(&probe.meta.software)
        .into_iter()
        .map(|(f, a, b)| (f.to_string(), a, b))
        .collect();
    // the collection's time of each call, on the kernel that ran it
    let measured_then: BTreeMap<String, f64> = previous
        .map_or(&[][..], |d| &d.rows[..])
        .iter()
        .filter(|m| m.is_ok())
        .map(|m| (call_key(m), m.time_us))
        .collect();
    let models_dataset = models.dataset().name.clone();
    let cost = CostModel::new(cluster, Some(models));
    let mut ratios: BTreeMap<(OpKind, Phase, Reference), Vec<f64>> = BTreeMap::new();
    let mut unmodelled = 0;
    for m in probe.ok_rows() {
        if let Some(then) = measured_then.get(&call_key(m)) {
            ratios
                .entry((m.query.op, m.query.phase, Reference::Collection))
                .or_default()
                .push(m.time_us / then);
            continue;
        }
        let e = cost.estimate(&m.query)?;
        // an estimate raised to the physical floor is not the model's own answer
        if matches!(e.source, Source::Learned | Source::Derived) && e.floored_from_us.is_none() {
            ratios
                .entry((m.query.op, m.query.phase, Reference::Models))
                .or_default()
                .push(m.time_us / e.time_us);
        } else {
            unmodelled += 1;
        }
    }
    let kinds = ratios
        .into_iter()
        .map(|((op, phase, against), r)| {
            let median = stepcast::stats::percentile(&r, 50.0).unwrap_or(1.0);
            let mape =
                100.0 * r.iter().map(|x| (1.0 / x - 1.0).abs()).sum::<f64>() / r.len() as f64;
            KindDrift {
                op,
                phase,
                against,
                points: r.len(),
                median_ratio: median,
                mape_percent: mape,
                drifted: (median - 1.0).abs() * 100.0 > threshold_percent,
            }
        })
        .collect();
    Ok(DriftReport {
        models: dir.display().to_string(),
        threshold_percent,
        software_changes,
        kinds,
        unmodelled,
        models_dataset,
        previous_dataset: previous.map(|d| d.dir.display().to_string()),
        probe_dataset: kept,
    })
}

/// The points of the models' collection a check probes again: of each (kind, phase, type),
/// `per_group` of the points this node can run, evenly spread over the times the collection
/// measured (so the smallest and the largest calls are among them), each point once whichever
/// kernels timed it.
fn probe_points(old: &[Measurement], target: Target, per_group: usize) -> Vec<PlanPoint> {
    let mut groups: BTreeMap<(OpKind, Phase, Dtype), Vec<(f64, PlanPoint)>> = BTreeMap::new();
    for (m, p) in distinct_points(old.iter().filter(|m| m.is_ok()), target) {
        groups
            .entry((m.query.op, m.query.phase, m.query.dtype))
            .or_default()
            .push((m.time_us, p));
    }
    let mut points = Vec::new();
    for mut group in groups.into_values() {
        // a group holds at least one point
        group.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (n, k) = (group.len(), per_group.min(group.len()));
        if k == 1 {
            points.push(group[n / 2].1.clone());
            continue;
        }
        // the i-th of k, rounded: 0 and n - 1 at the ends
        points.extend((0..k).map(|i| group[(i * (n - 1) + (k - 1) / 2) / (k - 1)].1.clone()));
    }
    points
}

#[derive(Debug)]
pub struct RetrainReport {
    pub drift: DriftReport,
    pub recollected: Vec<OpKind>,
    /// Points re-measured, and how many of them were the previous dataset's own.
    pub points: usize,
    pub points_from_previous: usize,
    pub carried_rows: usize,
    /// Of the carried rows, those of re-collected kinds not measured again here (the other
    /// attention kernel's, a point skipped now, more GPUs or nodes than the node has, fp8
    /// without fp8 tensor cores): kept as they were measured.
    pub carried_unmeasurable: usize,
    pub models_dir: Option<PathBuf>,
    pub previous_models: Option<PathBuf>,
}

/// Re-collects the drifted kinds into `out` (at the previous dataset's points where it is given,
/// plus its rows of the others) and retrains the cluster's models from it.
#[allow(clippy::too_many_arguments)]
pub fn retrain(
    cluster: &Cluster,
    device: &mut dyn Device,
    torch: Option<&TorchBackend>,
    previous: Option<&Path>,
    out: &Path,
    plan: &PlanSpec,
    threshold_percent: f64,
    progress: bool,
) -> anyhow::Result<RetrainReport> {
    // read before the probe and the collection, which take long, so a wrong path fails first
    let old = previous.map(Dataset::load).transpose()?;
    // the probe only decides what to re-collect: a private directory, removed
    let drift = check(
        cluster,
        device,
        torch,
        old.as_ref(),
        None,
        threshold_percent,
        progress,
    )?;
    let drifted = drift.drifted_kinds();
    if drifted.is_empty() {
        return Ok(RetrainReport {
            drift,
            recollected: Vec::new(),
            points: 0,
            points_from_previous: 0,
            carried_rows: 0,
            carried_unmeasurable: 0,
            models_dir: None,
            previous_models: None,
        });
    }
    let target = target_of(device, 1);
    let full = plan.expand(target)?;
    // without the dataset the models came from the other kinds cannot be carried over: they are
    // re-collected too, or the new models would have none of them
    let mut recollect = drifted.clone();
    if old.is_none() {
        recollect.extend(full.points.iter().map(|p| p.query.op));
        recollect.sort();
        recollect.dedup();
    }
    let old_rows = old.as_ref().map_or(&[][..], |d| &d.rows[..]);
    let (points, points_from_previous) =
        recollection_points(full.points, old_rows, &recollect, target);
    if out.join(stepcast::dataset::META_FILE).exists() {
        // only an interrupted retrain's own re-collection is continued: carrying the previous
        // dataset's rows into a finished one again would hold each of them twice
        let held = Dataset::load(out)?;
        let wanted: HashSet<String> = points.iter().map(point_key).collect();
        let carried_before: HashSet<String> =
            old_rows.iter().filter(|m| m.is_ok()).map(row_key).collect();
        if let Some(m) = held.rows.iter().find(|m| {
            !wanted.contains(&point_key(&PlanPoint::of(m))) || carried_before.contains(&row_key(m))
        }) {
            anyhow::bail!(stepcast::Error::Invalid(format!(
                "{}: already holds a dataset with a row this retrain would not measure ({}: a \
                 finished retrain, or another collection): give a new --out",
                out.display(),
                m.query
            )));
        }
    }
    let subset = Plan {
        spec: full.spec.clone(),
        points,
    };
    let point_count = subset.points.len();
    collect(
        &subset,
        device,
        torch,
        &CollectOptions {
            out: out.to_path_buf(),
            resume: out.join(stepcast::dataset::META_FILE).exists(),
            retry_skipped: false,
            progress,
            launch: None,
        },
    )?;
    let (mut carried, mut carried_unmeasurable) = (0, 0);
    if let Some(old) = old {
        let measured = Dataset::load(out)?.rows;
        let mut writer = MeasurementWriter::new(out)?;
        for m in rows_to_carry(&old.rows, &measured, &recollect) {
            writer.append(m)?;
            carried += 1;
            carried_unmeasurable += recollect.contains(&m.query.op) as usize;
        }
        let mut meta = stepcast::dataset::DatasetMeta::load(out)?;
        let kinds: Vec<&str> = recollect.iter().map(|k| k.name()).collect();
        meta.source.description.push_str(&format!(
            "; {} re-measured at {points_from_previous} of the points of '{}' (collected {}){}; \
             its rows of the other kinds, and {carried_unmeasurable} of the re-measured kinds' \
             not measured again here (another attention kernel, a point skipped now or one this \
             node cannot run), carried over",
            kinds.join(", "),
            old.meta.name,
            old.meta.collected_at,
            match point_count - points_from_previous {
                0 => String::new(),
                n => format!(" and {n} of the plan's"),
            }
        ));
        meta.save(out)?;
    }
    let models_dir = cluster.models_dir.clone().expect("checked by check()");
    // models trained from some kinds of their dataset (`train --operators`) stay so
    let operators = ModelSet::load_manifest(&models_dir)
        .map(|m| m.operators)
        .unwrap_or_default();
    let mut dataset = Dataset::load(out)?;
    if !operators.is_empty() {
        dataset
            .rows
            .retain(|r| operators.iter().any(|o| o == r.query.op.name()));
    }
    let started = std::time::Instant::now();
    let outcome = train(&dataset, &TrainOptions::default(), &|| {});
    if outcome.models.is_empty() {
        // never swap an empty directory in for models that predict
        anyhow::bail!(stepcast::Error::Empty(format!(
            "{}: no operator group had enough rows to train; {} are kept as they are",
            out.display(),
            models_dir.display()
        )));
    }
    // train into a private staging directory beside the models (created exclusively, never one
    // that already exists), then swap it in
    let parent = models_dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let staging_dir = tempfile::Builder::new()
        .prefix(".stepcast-retrain-")
        .tempdir_in(parent)?;
    let staging = staging_dir.path().join("models");
    // the cluster file's network: a node's collection cannot see the fabric between nodes
    let manifest = Manifest {
        network: cluster.spec.network.clone().into(),
        operators,
        ..Manifest::of_training(&dataset, &outcome, 0, started.elapsed().as_secs_f64())
    };
    ModelSet::save(&staging, manifest, outcome.models)?;
    // the previous models are kept as <dir>.before-<date>, -2, -3, … on later retrains that day
    let kept = (1..)
        .map(|n| {
            let date = stepcast::fsutil::today_utc();
            let suffix = if n == 1 {
                format!("before-{date}")
            } else {
                format!("before-{date}-{n}")
            };
            models_dir.with_extension(suffix)
        })
        .find(|p| !p.exists())
        .expect("an unused name");
    if models_dir.exists() {
        std::fs::rename(&models_dir, &kept)?;
    }
    std::fs::rename(&staging, &models_dir)?;
    Ok(RetrainReport {
        drift,
        recollected: recollect,
        points: point_count,
        points_from_previous,
        carried_rows: carried,
        carried_unmeasurable,
        models_dir: Some(models_dir),
        previous_models: Some(kept),
    })
}

/// The points a retrain re-measures, and how many of them came from the previous dataset. With
/// the dataset the models were trained from, a re-collected kind is measured again at that
/// dataset's own points — the coverage its models were trained on; a plan smaller than the
/// collection (`--quick`'s 72 GEMMs against a collection's thousands) would otherwise leave the
/// new models a fraction of it — each once, but those this node cannot run (carried over as they
/// were). A kind the previous dataset holds no rows of, and every kind without one, is measured
/// at the plan's points.
fn recollection_points(
    plan: Vec<PlanPoint>,
    old: &[Measurement],
    recollect: &[OpKind],
    target: Target,
) -> (Vec<PlanPoint>, usize) {
    let of_kinds = old.iter().filter(|m| recollect.contains(&m.query.op));
    let from_previous: Vec<OpKind> = recollect
        .iter()
        .copied()
        .filter(|k| old.iter().any(|m| m.query.op == *k))
        .collect();
    let mut points: Vec<PlanPoint> = distinct_points(of_kinds, target).map(|(_, p)| p).collect();
    let taken = points.len();
    points.extend(
        plan.into_iter()
            .filter(|p| recollect.contains(&p.query.op) && !from_previous.contains(&p.query.op)),
    );
    (points, taken)
}

/// The points `rows` were measured at, each once whichever kernels timed it (a point names no
/// kernel: the backend run now decides which one times it), but those this node cannot run;
/// each with the first row measured there.
fn distinct_points<'a>(
    rows: impl IntoIterator<Item = &'a Measurement>,
    target: Target,
) -> impl Iterator<Item = (&'a Measurement, PlanPoint)> {
    let mut seen = HashSet::new();
    rows.into_iter().filter_map(move |m| {
        let p = PlanPoint {
            query: without_kernel_role(m.query),
            context: m.context,
        };
        (measurable_here(&p.query, target) && seen.insert(point_key(&p))).then_some((m, p))
    })
}

/// The previous dataset's rows a retrain keeps: every measured row of a kind it did not
/// re-collect, and of a re-collected kind each row this collection did not measure again on the
/// same kernel — a point this node cannot run, a row of the other attention kernel than the one
/// this run's backend chose — kept as it was measured rather than lost.
fn rows_to_carry<'a>(
    old: &'a [Measurement],
    measured: &[Measurement],
    recollect: &[OpKind],
) -> Vec<&'a Measurement> {
    let measured: HashSet<String> = measured
        .iter()
        .filter(|m| m.is_ok())
        .map(call_key)
        .collect();
    old.iter()
        .filter(|m| m.is_ok())
        .filter(|m| !recollect.contains(&m.query.op) || !measured.contains(&call_key(m)))
        .collect()
}

/// Whether this node can time the call: a collective over at most its nodes and GPUs, an fp8
/// call only with fp8 tensor cores.
fn measurable_here(q: &OpQuery, target: Target) -> bool {
    match &q.shape {
        Shape::Collective(c) => {
            c.nodes <= u64::from(target.nodes) && c.gpus_per_node <= u64::from(target.gpus_per_node)
        }
        _ => target.fp8 || q.dtype != Dtype::Fp8,
    }
}

/// A point's identity: its call (without the kernel a row names) and the layer it came from.
fn point_key(p: &PlanPoint) -> String {
    format!("{} {:?}", without_kernel_role(p.query), p.context)
}

/// A row's call, the kernel it names included, and the layer it came from.
fn call_key(m: &Measurement) -> String {
    format!("{} {:?}", m.query, m.context)
}

/// A row's identity down to its samples: a carried row is the previous dataset's own.
fn row_key(m: &Measurement) -> String {
    format!("{} {:?}", call_key(m), m.samples_us)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::mock::MockDevice;

    /// Trains models from a mock collection, then checks the same mock device against them.
    fn setup(dir: &Path) -> Cluster {
        let data = dir.join("data");
        let plan = quick_plan()
            .expand(Target {
                gpus_per_node: 4,
                nodes: 1,
                fp8: true,
            })
            .unwrap();
        collect(
            &plan,
            &mut MockDevice::new(4),
            None,
            &CollectOptions {
                out: data.clone(),
                resume: false,
                retry_skipped: false,
                progress: false,
                launch: None,
            },
        )
        .unwrap();
        let ds = Dataset::load(&data).unwrap();
        let outcome = train(&ds, &TrainOptions::default(), &|| {});
        let models = dir.join("models");
        let manifest = Manifest::of_training(&ds, &outcome, 0, 0.0);
        ModelSet::save(&models, manifest, outcome.models).unwrap();
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hardware-profiles/dgx-h100.yaml");
        let mut cluster = Cluster::load(&root).unwrap();
        cluster.models_dir = Some(models);
        cluster.spec.models.as_mut().unwrap().collectives = true;
        cluster
    }

    /// The quick probe plan, without the saturating warm-up.
    fn quick_plan() -> PlanSpec {
        let mut plan = PlanSpec::builtin(true);
        plan.saturate_ms = 0;
        plan
    }

    /// A mock node of `gpus` GPUs on which one kind runs `factor` times as long.
    fn mock(gpus: u32, kind: OpKind, factor: f64) -> MockDevice {
        let mut device = MockDevice::new(gpus);
        device.slowdown = vec![(kind, factor)];
        device
    }

    /// `check` at the 10 % threshold, without progress or a PyTorch path, the probe written to
    /// `out`.
    fn check_at_10(
        cluster: &Cluster,
        device: &mut MockDevice,
        previous: Option<&Dataset>,
        out: Option<&Path>,
    ) -> anyhow::Result<DriftReport> {
        check(cluster, device, None, previous, out, 10.0, false)
    }

    /// `retrain` at the 10 % threshold, without progress, from the `previous` dataset.
    fn retrain_from(
        cluster: &Cluster,
        device: &mut MockDevice,
        previous: &Path,
        out: &Path,
        plan: &PlanSpec,
    ) -> anyhow::Result<RetrainReport> {
        retrain(
            cluster,
            device,
            None,
            Some(previous),
            out,
            plan,
            10.0,
            false,
        )
    }

    /// Retrains `cluster` from `setup`'s data on a device whose GEMMs run 30 % slower, into
    /// `dir/new`; returns the report and that device.
    fn retrain_on_slower_gemms(cluster: &Cluster, dir: &Path) -> (RetrainReport, MockDevice) {
        let mut slower = mock(4, OpKind::Gemm, 1.3);
        let r = retrain_from(
            cluster,
            &mut slower,
            &dir.join("data"),
            &dir.join("new"),
            &quick_plan(),
        )
        .unwrap();
        (r, slower)
    }

    #[test]
    fn the_same_device_shows_no_drift_and_a_changed_one_does() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = setup(dir.path());
        let r = check_at_10(
            &cluster,
            &mut MockDevice::new(4),
            None,
            Some(&dir.path().join("probe1")),
        )
        .unwrap();
        assert!(!r.kinds.is_empty());
        assert!(r.drifted_kinds().is_empty(), "{:?}", r.kinds);
        // probes no learned model answers are counted, not compared
        assert!(r.unmodelled > 0);
        for k in &r.kinds {
            assert!(k.mape_percent < 3.0, "{k:?}");
        }
        // a "driver update" that makes every GEMM 30 % slower drifts the GEMM kinds only
        let mut slower = MockDevice::new(4);
        slower.slowdown = vec![(OpKind::Gemm, 1.3)];
        let r = check_at_10(
            &cluster,
            &mut slower,
            None,
            Some(&dir.path().join("probe2")),
        )
        .unwrap();
        assert_eq!(r.drifted_kinds(), vec![OpKind::Gemm]);
        let gemm = r.kinds.iter().find(|k| k.op == OpKind::Gemm).unwrap();
        assert!(
            (gemm.median_ratio - 1.3).abs() < 0.1,
            "{}",
            gemm.median_ratio
        );
        // |predicted − measured| / measured: 1 − 1 / 1.3 = 23.1 %
        assert!((gemm.mape_percent - 23.1).abs() < 2.0, "{gemm:?}");
    }

    /// Against the collection at its own points only the machine reads as drift: models that
    /// put attention at 1.5x what the collection measured (trained on its attention rows made
    /// slower, their manifest naming the collection) drift attention against their predictions
    /// and not against the collection; a node whose GEMMs run 1.3x longer drifts GEMMs by 1.3
    /// against it; the probe is timed with the collection's protocol.
    #[test]
    fn a_check_against_the_collection_reads_the_node_not_the_models() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = setup(dir.path());
        let data_dir = dir.path().join("data");
        let mut meta = stepcast::dataset::DatasetMeta::load(&data_dir).unwrap();
        let theirs = stepcast::dataset::Protocol {
            warmup_runs: 3,
            timed_runs: 6,
            kept_middle: 2,
            timer: "mock".into(),
        };
        meta.protocol = Some(theirs.clone());
        meta.save(&data_dir).unwrap();
        let data = Dataset::load(&data_dir).unwrap();
        let mut skewed = data.clone();
        for m in skewed
            .rows
            .iter_mut()
            .filter(|m| m.query.op == OpKind::FlashAttention)
        {
            m.time_us *= 1.5;
            m.samples_us.iter_mut().for_each(|s| *s *= 1.5);
        }
        let outcome = train(&skewed, &TrainOptions::default(), &|| {});
        let models = cluster.models_dir.clone().unwrap();
        std::fs::remove_dir_all(&models).unwrap();
        let manifest = Manifest::of_training(&data, &outcome, 0, 0.0);
        ModelSet::save(&models, manifest, outcome.models).unwrap();
        let probe = |device: &mut MockDevice, previous: Option<&Dataset>, name: &str| {
            let out = dir.path().join(name);
            check_at_10(&cluster, device, previous, Some(&out)).unwrap()
        };
        let against_models = probe(&mut MockDevice::new(4), None, "p1");
        assert_eq!(
            against_models.drifted_kinds(),
            vec![OpKind::FlashAttention],
            "{:?}",
            against_models.kinds
        );
        assert!(against_models
            .kinds
            .iter()
            .all(|k| k.against == Reference::Models));
        let same = probe(&mut MockDevice::new(4), Some(&data), "p2");
        assert!(same.drifted_kinds().is_empty(), "{:?}", same.kinds);
        assert_eq!(same.unmodelled, 0);
        assert_eq!(same.previous_dataset, Some(data_dir.display().to_string()));
        for k in &same.kinds {
            assert_eq!(k.against, Reference::Collection, "{k:?}");
            assert!((k.median_ratio - 1.0).abs() < 0.01, "{k:?}");
        }
        // every kind and phase the collection holds was probed
        let held: HashSet<(OpKind, Phase)> = data
            .ok_rows()
            .map(|m| (m.query.op, m.query.phase))
            .collect();
        let probed: HashSet<(OpKind, Phase)> = same.kinds.iter().map(|k| (k.op, k.phase)).collect();
        assert_eq!(probed, held);
        let kept = Dataset::load(&dir.path().join("p2")).unwrap();
        let used = kept.meta.protocol.unwrap();
        assert_eq!(
            (used.warmup_runs, used.timed_runs, used.kept_middle),
            (3, 6, 2)
        );
        let slower = probe(&mut mock(4, OpKind::Gemm, 1.3), Some(&data), "p3");
        assert_eq!(slower.drifted_kinds(), vec![OpKind::Gemm]);
        for k in slower.kinds.iter().filter(|k| k.op == OpKind::Gemm) {
            assert!((k.median_ratio - 1.3).abs() < 0.01, "{k:?}");
        }
    }

    /// The shipped H200 models and the collection they were trained from, as a user checks
    /// them (`--cluster hardware-profiles/dgx-h200.yaml --previous datasets/h200-sxm/2026-11-27`):
    /// the collection is theirs by fingerprint, the probe takes 12 points of each group with the
    /// collection's protocol, and each is compared with its row (on a mock: the times mean
    /// nothing, the plumbing does).
    #[test]
    fn the_shipped_h200_models_are_checked_against_their_own_collection() {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let cluster = Cluster::load(&repo.join("hardware-profiles/dgx-h200.yaml")).unwrap();
        let models = ModelSet::open(cluster.models_dir.as_ref().unwrap()).unwrap();
        let data = Dataset::load(&repo.join("datasets/h200-sxm/2026-11-27")).unwrap();
        assert_eq!(models.dataset().fingerprint, data.fingerprint);
        let mut device = MockDevice::new(1).with_gpu(models.gpu().clone());
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("probe");
        let r = check_at_10(&cluster, &mut device, Some(&data), Some(&out)).unwrap();
        let target = target_of(&device, 1);
        let points = probe_points(&data.rows, target, PROBES_PER_GROUP);
        let probe = Dataset::load(&out).unwrap();
        assert_eq!(probe.rows.len(), points.len());
        assert!(points.len() > 100 && points.len() < 500, "{}", points.len());
        let compared: usize = r.kinds.iter().map(|k| k.points).sum();
        assert_eq!(compared, probe.ok_rows().count());
        assert!(r.kinds.iter().all(|k| k.against == Reference::Collection));
        assert_eq!(r.unmodelled, 0);
        let p = probe.meta.protocol.unwrap();
        assert_eq!((p.warmup_runs, p.timed_runs, p.kept_middle), (10, 10, 5));
    }

    /// A check given a dataset the models were not trained from refuses it, naming both.
    #[test]
    fn a_check_refuses_a_collection_the_models_were_not_trained_from() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = setup(dir.path());
        let mut other = Dataset::load(&dir.path().join("data")).unwrap();
        other.fingerprint = "0123456789abcdef".into();
        let e = check_at_10(&cluster, &mut MockDevice::new(4), Some(&other), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("is not the dataset") && e.contains("0123456789abcdef"),
            "{e}"
        );
    }

    /// A check's probe points: of each kind, phase and type at most the number asked, the
    /// fastest and the slowest call among them, evenly spread between; a point two kernels
    /// timed once; none this node cannot run.
    #[test]
    fn probe_points_spread_over_each_group_of_the_collection() {
        let dir = tempfile::tempdir().unwrap();
        setup(dir.path());
        let data = Dataset::load(&dir.path().join("data")).unwrap();
        let mut rows = data.rows.clone();
        let attention = rows
            .iter()
            .find(|m| m.query.op == OpKind::FlashAttention && m.is_ok())
            .unwrap()
            .clone();
        rows.push(Measurement {
            query: OpQuery {
                role: Some(stepcast::ops::Role::FlashAttention2),
                ..attention.query
            },
            ..attention
        });
        let two = Target {
            gpus_per_node: 2,
            nodes: 1,
            fp8: false,
        };
        let points = probe_points(&rows, two, 3);
        let keys: HashSet<String> = points.iter().map(point_key).collect();
        assert_eq!(keys.len(), points.len());
        let mut groups: BTreeMap<(OpKind, Phase, Dtype), Vec<&Measurement>> = BTreeMap::new();
        for m in rows.iter().filter(|m| m.is_ok()) {
            groups
                .entry((m.query.op, m.query.phase, m.query.dtype))
                .or_default()
                .push(m);
        }
        let mut expected = 0;
        for ((op, phase, dtype), group) in groups {
            let here: Vec<&Measurement> = group
                .into_iter()
                .filter(|m| measurable_here(&m.query, two))
                .filter(|m| m.query.role != Some(stepcast::ops::Role::FlashAttention2))
                .collect();
            let chosen: Vec<&PlanPoint> = points
                .iter()
                .filter(|p| (p.query.op, p.query.phase, p.query.dtype) == (op, phase, dtype))
                .collect();
            assert_eq!(chosen.len(), here.len().min(3), "{op} {phase:?} {dtype:?}");
            expected += chosen.len();
            if here.len() >= 2 {
                let time = |p: &PlanPoint| {
                    here.iter()
                        .find(|m| point_key(&PlanPoint::of(m)) == point_key(p))
                        .unwrap()
                        .time_us
                };
                let times: Vec<f64> = chosen.iter().map(|p| time(p)).collect();
                let all: Vec<f64> = here.iter().map(|m| m.time_us).collect();
                let (lo, hi) = (
                    all.iter().copied().fold(f64::INFINITY, f64::min),
                    all.iter().copied().fold(0.0, f64::max),
                );
                assert!(
                    times.contains(&lo) && times.contains(&hi),
                    "{op}: {times:?}"
                );
            }
        }
        assert_eq!(points.len(), expected);
        assert!(points.iter().all(|p| measurable_here(&p.query, two)));
        // one a group: its middle call
        let one = probe_points(&rows, two, 1);
        let gemms: Vec<&PlanPoint> = one
            .iter()
            .filter(|p| p.query.op == OpKind::Gemm && p.query.phase == Phase::Fwd)
            .collect();
        assert_eq!(gemms.len(), 1);
        let mut times: Vec<(f64, String)> = rows
            .iter()
            .filter(|m| m.is_ok() && m.query.op == OpKind::Gemm && m.query.phase == Phase::Fwd)
            .filter(|m| measurable_here(&m.query, two))
            .map(|m| (m.time_us, point_key(&PlanPoint::of(m))))
            .collect();
        times.sort_by(|a, b| a.0.total_cmp(&b.0));
        assert_eq!(point_key(gemms[0]), times[times.len() / 2].1);
        assert!(points
            .iter()
            .all(|p| p.query.role.is_none() || !p.query.role.unwrap().is_another_kernel()));
    }

    #[test]
    fn retrain_recollects_what_drifted_and_replaces_the_models() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = setup(dir.path());
        let (r, mut slower) = retrain_on_slower_gemms(&cluster, dir.path());
        assert_eq!(r.recollected, vec![OpKind::Gemm]);
        assert!(r.carried_rows > 0);
        assert!(r
            .previous_models
            .as_ref()
            .unwrap()
            .join("manifest.json")
            .is_file());
        // the retrained models agree with the slower device
        let again = check_at_10(
            &cluster,
            &mut slower,
            None,
            Some(&dir.path().join("probe3")),
        )
        .unwrap();
        assert!(again.drifted_kinds().is_empty(), "{:?}", again.kinds);
        // a second retrain on the same day keeps both earlier sets, and no staging is left
        let mut faster = mock(4, OpKind::Gemm, 0.8);
        let second = retrain_from(
            &cluster,
            &mut faster,
            &dir.path().join("new"),
            &dir.path().join("newer"),
            &quick_plan(),
        )
        .unwrap();
        let (first_kept, second_kept) =
            (r.previous_models.unwrap(), second.previous_models.unwrap());
        let today = stepcast::fsutil::today_utc();
        assert!(
            first_kept.ends_with(format!("models.before-{today}")),
            "{first_kept:?}"
        );
        assert!(
            second_kept.ends_with(format!("models.before-{today}-2")),
            "{second_kept:?}"
        );
        // the network is the cluster file's: a node's collection cannot see it
        let manifest = ModelSet::load_manifest(cluster.models_dir.as_ref().unwrap()).unwrap();
        assert_eq!(manifest.network, cluster.spec.network.clone().into());
        assert!(
            first_kept.join("models.bin").is_file() && second_kept.join("models.bin").is_file()
        );
        let staging: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(".stepcast-retrain")
            })
            .collect();
        assert!(staging.is_empty(), "{staging:?}");
    }

    /// A plan smaller than the collection the models came from (`--quick` against a full
    /// collection) does not shrink them: the drifted kind is re-measured at the previous
    /// dataset's points, each once, at the new node's speed.
    #[test]
    fn retrain_remeasures_the_previous_datasets_points_whatever_the_plan() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = setup(dir.path());
        let old = Dataset::load(&dir.path().join("data")).unwrap();
        let gemm_points: HashSet<String> = old
            .rows
            .iter()
            .filter(|m| m.query.op == OpKind::Gemm)
            .map(|m| point_key(&PlanPoint::of(m)))
            .collect();
        let mut small = quick_plan();
        small.grid.as_mut().unwrap().configs = 1;
        small.presets = None;
        let smaller = small
            .expand(Target {
                gpus_per_node: 4,
                nodes: 1,
                fp8: true,
            })
            .unwrap();
        let plan_gemms = smaller
            .points
            .iter()
            .filter(|p| p.query.op == OpKind::Gemm)
            .count();
        assert!(plan_gemms < gemm_points.len(), "{plan_gemms}");
        let mut slower = mock(4, OpKind::Gemm, 1.3);
        let r = retrain_from(
            &cluster,
            &mut slower,
            &dir.path().join("data"),
            &dir.path().join("new"),
            &small,
        )
        .unwrap();
        assert_eq!(r.recollected, vec![OpKind::Gemm]);
        assert_eq!(
            (r.points, r.points_from_previous),
            (gemm_points.len(), gemm_points.len())
        );
        assert_eq!(r.carried_unmeasurable, 0);
        let new = Dataset::load(&dir.path().join("new")).unwrap();
        let new_gemms: Vec<_> = new
            .rows
            .iter()
            .filter(|m| m.query.op == OpKind::Gemm)
            .collect();
        assert_eq!(new_gemms.len(), gemm_points.len());
        let keys: HashSet<String> = new_gemms
            .iter()
            .map(|m| point_key(&PlanPoint::of(m)))
            .collect();
        assert_eq!(keys, gemm_points);
        // measured anew on the slower node: each 1.3 × the previous row at its point
        let before: BTreeMap<String, f64> = old
            .rows
            .iter()
            .filter(|m| m.query.op == OpKind::Gemm)
            .map(|m| (point_key(&PlanPoint::of(m)), m.time_us))
            .collect();
        for m in new_gemms {
            let ratio = m.time_us / before[&point_key(&PlanPoint::of(m))];
            assert!((ratio - 1.3).abs() < 0.15, "{}: {ratio}", m.query);
        }
    }

    /// What this node cannot run of a drifted kind — a collective over more GPUs than it has —
    /// is kept as it was measured, not dropped; the rest is re-measured; a resumed retrain
    /// refuses a directory holding rows it would not measure.
    #[test]
    fn retrain_carries_the_points_this_node_cannot_run() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = setup(dir.path());
        let old = Dataset::load(&dir.path().join("data")).unwrap();
        let ranks = |m: &stepcast::dataset::Measurement| match &m.query.shape {
            Shape::Collective(c) => c.ranks(),
            _ => 0,
        };
        let all_reduce: Vec<_> = old
            .rows
            .iter()
            .filter(|m| m.query.op == OpKind::AllReduce && m.is_ok())
            .collect();
        let wide = all_reduce.iter().filter(|m| ranks(m) > 2).count();
        assert!(
            wide > 0 && wide < all_reduce.len(),
            "{wide} of {}",
            all_reduce.len()
        );
        let mut two = mock(2, OpKind::AllReduce, 1.6);
        let r = retrain_from(
            &cluster,
            &mut two,
            &dir.path().join("data"),
            &dir.path().join("new"),
            &quick_plan(),
        )
        .unwrap();
        assert!(
            r.recollected.contains(&OpKind::AllReduce),
            "{:?}",
            r.recollected
        );
        let new = Dataset::load(&dir.path().join("new")).unwrap();
        let kept: Vec<_> = new
            .rows
            .iter()
            .filter(|m| m.query.op == OpKind::AllReduce && ranks(m) > 2)
            .collect();
        assert_eq!(kept.len(), wide);
        assert!(r.carried_unmeasurable >= wide, "{}", r.carried_unmeasurable);
        for m in kept {
            let was = all_reduce
                .iter()
                .find(|o| point_key(&PlanPoint::of(o)) == point_key(&PlanPoint::of(m)))
                .unwrap();
            assert_eq!(m.time_us, was.time_us, "{}", m.query);
        }
        let narrow = new
            .rows
            .iter()
            .filter(|m| m.query.op == OpKind::AllReduce && ranks(m) == 2)
            .count();
        assert_eq!(narrow, all_reduce.len() - wide);
        // the finished directory holds carried rows: a second retrain into it, from the models
        // trained on the first dataset (put back), is refused
        let models = cluster.models_dir.clone().unwrap();
        std::fs::remove_dir_all(&models).unwrap();
        std::fs::rename(r.previous_models.unwrap(), &models).unwrap();
        let mut slower_still = mock(2, OpKind::AllReduce, 2.6);
        let e = retrain_from(
            &cluster,
            &mut slower_still,
            &dir.path().join("data"),
            &dir.path().join("new"),
            &quick_plan(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("give a new --out"), "{e}");
    }

    /// Only an interrupted retrain's own collection is continued: a directory holding a row of
    /// a kind not re-measured, or a row carried over from the previous dataset, is refused; one
    /// holding only re-measured rows of the drifted kind is continued.
    #[test]
    fn a_retrain_continues_only_its_own_interrupted_collection() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = setup(dir.path());
        let data = dir.path().join("data");
        let old = Dataset::load(&data).unwrap();
        let first = |op| {
            old.rows
                .iter()
                .find(|m| m.query.op == op && m.is_ok())
                .unwrap()
        };
        let remeasured = |m: &Measurement| {
            let mut m = m.clone();
            m.time_us *= 1.3;
            m.samples_us.iter_mut().for_each(|t| *t *= 1.3);
            m
        };
        let seeded = |name: &str, rows: &[Measurement]| {
            let out = dir.path().join(name);
            std::fs::create_dir(&out).unwrap();
            std::fs::copy(data.join("meta.yaml"), out.join("meta.yaml")).unwrap();
            let mut writer = MeasurementWriter::new(&out).unwrap();
            for m in rows {
                writer.append(m).unwrap();
            }
            out
        };
        let retrain_into = |out: &Path| {
            retrain_from(
                &cluster,
                &mut mock(4, OpKind::Gemm, 1.3),
                &data,
                out,
                &quick_plan(),
            )
        };
        let other_kind = seeded("other", &[remeasured(first(OpKind::RmsNorm))]);
        let e = retrain_into(&other_kind).unwrap_err().to_string();
        assert!(
            e.contains("give a new --out") && e.contains("rmsnorm"),
            "{e}"
        );
        let carried = seeded("carried", &[first(OpKind::Gemm).clone()]);
        let e = retrain_into(&carried).unwrap_err().to_string();
        assert!(e.contains("give a new --out"), "{e}");
        let own = seeded("own", &[remeasured(first(OpKind::Gemm))]);
        let r = retrain_into(&own).unwrap();
        assert_eq!(r.recollected, vec![OpKind::Gemm]);
    }

    /// A dataset that timed each attention point on two kernels (cuDNN, and FlashAttention-2
    /// as role `flash_attention_2`) is re-measured once per point, on the kernel the backend
    /// runs now; the other kernel's rows are kept as they were, and so is every row of a kind
    /// not re-collected.
    #[test]
    fn a_retrain_measures_each_point_once_and_keeps_the_other_kernels_rows() {
        use stepcast::dataset::{LayerContext, Status};
        use stepcast::ops::{AttentionShape, Role};
        let row = |op, role, seq, time_us| Measurement {
            query: OpQuery {
                op,
                phase: Phase::Fwd,
                dtype: Dtype::Bf16,
                role,
                shape: match op {
                    OpKind::Gemm => Shape::Gemm(stepcast::ops::GemmShape {
                        m: seq,
                        n: 64,
                        k: 64,
                        batch: 1,
                    }),
                    _ => Shape::Attention(AttentionShape {
                        batch: 1,
                        seq_q: seq,
                        seq_kv: seq,
                        heads: 8,
                        kv_heads: 8,
                        head_dim: 128,
                        causal: true,
                    }),
                },
            },
            context: LayerContext::default(),
            time_us,
            samples_us: vec![time_us],
            status: Status::Ok,
            throttled: false,
            note: String::new(),
        };
        let fa2 = Some(Role::FlashAttention2);
        let old = vec![
            row(OpKind::FlashAttention, None, 1024, 10.0),
            row(OpKind::FlashAttention, fa2, 1024, 17.0),
            row(OpKind::FlashAttention, None, 2048, 30.0),
            row(OpKind::FlashAttention, fa2, 2048, 51.0),
            row(OpKind::Gemm, None, 4096, 5.0),
        ];
        let recollect = [OpKind::FlashAttention];
        let node = Target {
            gpus_per_node: 1,
            nodes: 1,
            fp8: true,
        };
        let (points, from_previous) = recollection_points(Vec::new(), &old, &recollect, node);
        assert_eq!(from_previous, 2);
        assert_eq!(points.len(), 2);
        assert!(points.iter().all(|p| p.query.role.is_none()));
        // the backend ran cuDNN: its rows replace the old cuDNN rows, FA2's and the GEMM stay
        let measured = vec![
            row(OpKind::FlashAttention, None, 1024, 15.0),
            row(OpKind::FlashAttention, None, 2048, 45.0),
        ];
        let kept: Vec<f64> = rows_to_carry(&old, &measured, &recollect)
            .iter()
            .map(|m| m.time_us)
            .collect();
        assert_eq!(kept, vec![17.0, 51.0, 5.0]);
        // a point measured but skipped now keeps its old row
        let mut skipped = measured.clone();
        skipped[1].status = Status::Skipped;
        let kept: Vec<f64> = rows_to_carry(&old, &skipped, &recollect)
            .iter()
            .map(|m| m.time_us)
            .collect();
        assert_eq!(kept, vec![17.0, 30.0, 51.0, 5.0]);
    }

    #[test]
    fn measurable_here_counts_gpus_nodes_and_fp8() {
        let node = Target {
            gpus_per_node: 8,
            nodes: 1,
            fp8: false,
        };
        let collective = |nodes, gpus_per_node| OpQuery {
            op: OpKind::AllReduce,
            phase: Phase::None,
            dtype: Dtype::Bf16,
            role: None,
            shape: Shape::Collective(stepcast::ops::CollectiveShape {
                bytes: 1 << 20,
                nodes,
                gpus_per_node,
            }),
        };
        assert!(measurable_here(&collective(1, 8), node));
        assert!(!measurable_here(&collective(1, 16), node));
        assert!(!measurable_here(&collective(2, 8), node));
        let gemm = |dtype| OpQuery {
            op: OpKind::Gemm,
            phase: Phase::Fwd,
            dtype,
            role: None,
            shape: Shape::Gemm(stepcast::ops::GemmShape {
                m: 64,
                n: 64,
                k: 64,
                batch: 1,
            }),
        };
        assert!(measurable_here(&gemm(Dtype::Bf16), node));
        assert!(!measurable_here(&gemm(Dtype::Fp8), node));
        assert!(measurable_here(
            &gemm(Dtype::Fp8),
            Target { fp8: true, ..node }
        ));
    }

    #[test]
    fn retrain_keeps_models_trained_from_some_kinds_to_those_kinds() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = setup(dir.path());
        // as `train --operators gemm` records it
        let models = cluster.models_dir.clone().unwrap();
        let path = models.join("manifest.json");
        let mut manifest: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        manifest["operators"] = serde_json::json!(["gemm"]);
        std::fs::write(&path, serde_json::to_string_pretty(&manifest).unwrap()).unwrap();
        retrain_on_slower_gemms(&cluster, dir.path());
        let after = ModelSet::load_manifest(&models).unwrap();
        assert_eq!(after.operators, vec!["gemm".to_string()]);
        assert!(!after.models.is_empty());
        assert!(
            after.models.iter().all(|m| m.key.op == OpKind::Gemm),
            "{:?}",
            after.models.iter().map(|m| m.key.op).collect::<Vec<_>>()
        );
    }
}

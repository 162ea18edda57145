//! After a driver or library update: does this machine still time operators the way the models
//! it predicts with were trained? `check` compares the software stamps, re-measures the quick
//! probe plan and compares every probe with the models' prediction; `retrain` re-collects the
//! operator kinds that drifted past a threshold, keeps the rows of the others from the previous
//! dataset, and retrains the cluster's models (the old directory is kept beside the new one).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;
use stepcast::dataset::{Dataset, MeasurementWriter};
use stepcast::hardware::Cluster;
use stepcast::ops::{OpKind, Phase};
use stepcast::predict::cost::{CostModel, Source};
use stepcast::regress::train::{train, TrainOptions};
use stepcast::regress::{Manifest, ModelSet};

use crate::collect::{collect, CollectOptions};
use crate::device::Device;
use crate::plan::{Plan, PlanSpec, Target};
use crate::torch::TorchBackend;

#[derive(Debug, Clone, Serialize)]
pub struct KindDrift {
    pub op: OpKind,
    pub phase: Phase,
    pub points: usize,
    /// Median of measured / predicted.
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
    /// Probes no learned model answers (not compared).
    pub unmodelled: usize,
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

/// Re-measures the quick probe plan into `probe_dir` (none: a private temporary directory) and
/// compares it with the cluster's models.
pub fn check(
    cluster: &Cluster,
    device: &mut dyn Device,
    torch: Option<&TorchBackend>,
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
    if let Some(d) = probe_dir.filter(|d| d.join(stepcast::dataset::META_FILE).exists()) {
        // collect's advice (--resume) is not check's: each check measures the probe afresh
        anyhow::bail!(stepcast::Error::Invalid(format!(
            "{}: already holds a dataset: give --out a new directory",
            d.display()
        )));
    }
    let plan = PlanSpec::builtin(true).expand(target_of(device, 1))?;
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
    let cost = CostModel::new(cluster, Some(models));
    let mut ratios: BTreeMap<(OpKind, Phase), Vec<f64>> = BTreeMap::new();
    let mut unmodelled = 0;
    for m in probe.ok_rows() {
        let e = cost.estimate(&m.query)?;
        // an estimate raised to the physical floor is not the model's own answer
        if matches!(e.source, Source::Learned | Source::Derived) && e.floored_from_us.is_none() {
            ratios
                .entry((m.query.op, m.query.phase))
                .or_default()
                .push(m.time_us / e.time_us);
        } else {
            unmodelled += 1;
        }
    }
    let kinds = ratios
        .into_iter()
        .map(|((op, phase), r)| {
            let median = stepcast::stats::percentile(&r, 50.0).unwrap_or(1.0);
            let mape =
                100.0 * r.iter().map(|x| (1.0 / x - 1.0).abs()).sum::<f64>() / r.len() as f64;
            KindDrift {
                op,
                phase,
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
        probe_dataset: kept,
    })
}

#[derive(Debug)]
pub struct RetrainReport {
    pub drift: DriftReport,
    pub recollected: Vec<OpKind>,
    pub carried_rows: usize,
    pub models_dir: Option<PathBuf>,
    pub previous_models: Option<PathBuf>,
}

/// Re-collects the drifted kinds into `out` (plus the previous dataset's rows of the others)
/// and retrains the cluster's models from it.
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
    // the probe only decides what to re-collect: a private directory, removed
    let drift = check(cluster, device, torch, None, threshold_percent, progress)?;
    let drifted = drift.drifted_kinds();
    if drifted.is_empty() {
        return Ok(RetrainReport {
            drift,
            recollected: Vec::new(),
            carried_rows: 0,
            models_dir: None,
            previous_models: None,
        });
    }
    // read before the collection, which takes long, so a wrong path fails first
    let old = previous.map(Dataset::load).transpose()?;
    let full = plan.expand(target_of(device, 1))?;
    // without the dataset the models came from the other kinds cannot be carried over: they are
    // re-collected too, or the new models would have none of them
    let mut recollect = drifted.clone();
    if old.is_none() {
        recollect.extend(full.points.iter().map(|p| p.query.op));
        recollect.sort();
        recollect.dedup();
    }
    if out.join(stepcast::dataset::META_FILE).exists() {
        // only an interrupted retrain's own re-collection is continued: carrying the other
        // kinds' rows into a finished one again would hold each of them twice
        let held = Dataset::load(out)?;
        if let Some(m) = held.rows.iter().find(|m| !recollect.contains(&m.query.op)) {
            anyhow::bail!(stepcast::Error::Invalid(format!(
                "{}: already holds a dataset with {} rows, a kind that did not drift now (a \
                 finished retrain, or another collection): give a new --out",
                out.display(),
                m.query.op
            )));
        }
    }
    let subset = Plan {
        spec: full.spec.clone(),
        points: full
            .points
            .into_iter()
            .filter(|p| recollect.contains(&p.query.op))
            .collect(),
    };
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
    let mut carried = 0;
    if let Some(old) = old {
        let mut writer = MeasurementWriter::new(out)?;
        for m in old
            .rows
            .iter()
            .filter(|m| m.is_ok() && !recollect.contains(&m.query.op))
        {
            writer.append(m)?;
            carried += 1;
        }
        let mut meta = stepcast::dataset::DatasetMeta::load(out)?;
        meta.source.description.push_str(&format!(
            "; rows of the kinds that did not drift carried over from '{}' (collected {})",
            old.meta.name, old.meta.collected_at
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
        carried_rows: carried,
        models_dir: Some(models_dir),
        previous_models: Some(kept),
    })
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

    /// Retrains `cluster` from `setup`'s data on a device whose GEMMs run 30 % slower, into
    /// `dir/new`; returns the report and that device.
    fn retrain_on_slower_gemms(cluster: &Cluster, dir: &Path) -> (RetrainReport, MockDevice) {
        let mut slower = MockDevice::new(4);
        slower.slowdown = vec![(OpKind::Gemm, 1.3)];
        let r = retrain(
            cluster,
            &mut slower,
            None,
            Some(&dir.join("data")),
            &dir.join("new"),
            &quick_plan(),
            10.0,
            false,
        )
        .unwrap();
        (r, slower)
    }

    #[test]
    fn the_same_device_shows_no_drift_and_a_changed_one_does() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = setup(dir.path());
        let r = check(
            &cluster,
            &mut MockDevice::new(4),
            None,
            Some(&dir.path().join("probe1")),
            10.0,
            false,
        )
        .unwrap();
        assert!(!r.kinds.is_empty());
        assert!(r.drifted_kinds().is_empty(), "{:?}", r.kinds);
        // a "driver update" that makes every GEMM 30 % slower drifts the GEMM kinds only
        let mut slower = MockDevice::new(4);
        slower.slowdown = vec![(OpKind::Gemm, 1.3)];
        let r = check(
            &cluster,
            &mut slower,
            None,
            Some(&dir.path().join("probe2")),
            10.0,
            false,
        )
        .unwrap();
        assert_eq!(r.drifted_kinds(), vec![OpKind::Gemm]);
        let gemm = r.kinds.iter().find(|k| k.op == OpKind::Gemm).unwrap();
        assert!(
            (gemm.median_ratio - 1.3).abs() < 0.1,
            "{}",
            gemm.median_ratio
        );
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
        let again = check(
            &cluster,
            &mut slower,
            None,
            Some(&dir.path().join("probe3")),
            10.0,
            false,
        )
        .unwrap();
        assert!(again.drifted_kinds().is_empty(), "{:?}", again.kinds);
        // a second retrain on the same day keeps both earlier sets, and no staging is left
        let mut faster = MockDevice::new(4);
        faster.slowdown = vec![(OpKind::Gemm, 0.8)];
        let second = retrain(
            &cluster,
            &mut faster,
            None,
            Some(&dir.path().join("new")),
            &dir.path().join("newer"),
            &quick_plan(),
            10.0,
            false,
        )
        .unwrap();
        let (first_kept, second_kept) =
            (r.previous_models.unwrap(), second.previous_models.unwrap());
        assert_ne!(first_kept, second_kept);
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

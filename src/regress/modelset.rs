//! A directory of trained models (`models/<cluster>/`): `models.bin` (every model, in one file,
//! what predictions read; see `bundle`) and `manifest.json` (what was trained from what, with
//! which errors: what people and `stepcast models show` read).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use super::bundle::{self, Reader, BUNDLE_FILE};
use super::model::{DatasetRef, ModelKey, TrainedModel, Validation, MODEL_FORMAT_VERSION};
use super::train::Outcome;
use crate::dataset::{Dataset, ReferenceError};
use crate::error::{Error, Result};
use crate::hardware::{Calibrations, GpuSpec, NetworkSpec};
use crate::ops::features::FEATURE_SCHEMA_VERSION;
use crate::ops::{OpQuery, Role};

/// The human-readable summary of a models directory.
pub const MANIFEST_FILE: &str = "manifest.json";

/// The runtime `stepcast calibrate` fitted for these models (optional).
pub const CALIBRATION_FILE: &str = "calibration.yaml";

/// One model, as the manifest lists it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ManifestEntry {
    /// Which calls it answers.
    pub key: ModelKey,
    /// Human-readable recipe, e.g. "boosting 300× depth 5 …".
    pub recipe: String,
    /// Roles it answers besides its own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub serves_roles: Vec<Role>,
    /// Rows it was trained on.
    pub training_rows: usize,
    /// Its validation error.
    pub validation: Validation,
    /// Nodes of its trees.
    pub nodes: usize,
    /// Bytes of its trees in `models.bin`.
    pub bytes: u64,
}

/// The file holding the models, as the manifest saw it written.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BundleRef {
    /// File name inside the directory.
    pub file: String,
    /// Its size.
    pub bytes: u64,
    /// Checksum of the whole file.
    pub checksum: u64,
}

/// What a models directory holds and where it came from.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    /// Version of the directory layout.
    pub format_version: u32,
    /// Version of the feature encoding.
    pub feature_schema_version: u32,
    /// The stepcast that trained it.
    pub stepcast_version: String,
    /// When (UTC date).
    pub created_at: String,
    /// Seed of the validation split and the trees.
    pub seed: u64,
    /// Wall time of the training.
    pub training_seconds: f64,
    /// The dataset trained from.
    pub dataset: DatasetRef,
    /// The GPU it was measured on.
    pub gpu: GpuSpec,
    /// GPUs per node of the measured system.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_per_node: Option<u32>,
    /// The network the collectives were measured on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkSpec>,
    /// Published errors of the data's own models, quoted beside ours.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reference_errors: Vec<ReferenceError>,
    /// Filled in by `ModelSet::save`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle: Option<BundleRef>,
    /// The operator kinds trained from the dataset (`train --operators`); empty: all of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub operators: Vec<String>,
    /// Every model.
    pub models: Vec<ManifestEntry>,
    /// Groups not trained, with the reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<(ModelKey, String)>,
}

impl Manifest {
    /// The manifest of the models `outcome` trained from `dataset` with `seed`, today, by this
    /// stepcast: the dataset's GPU, node, network and published errors; every kind trained
    /// (`operators` empty); `ModelSet::save` lists the models and the file holding them.
    pub fn of_training(
        dataset: &Dataset,
        outcome: &Outcome,
        seed: u64,
        training_seconds: f64,
    ) -> Manifest {
        Manifest {
            format_version: MODEL_FORMAT_VERSION,
            feature_schema_version: FEATURE_SCHEMA_VERSION,
            stepcast_version: env!("CARGO_PKG_VERSION").to_string(),
            created_at: crate::fsutil::today_utc(),
            seed,
            training_seconds,
            dataset: DatasetRef::of(dataset),
            gpu: dataset.meta.gpu.clone(),
            gpus_per_node: dataset.meta.gpus_per_node,
            network: dataset.meta.network.clone(),
            reference_errors: dataset.meta.reference_errors.clone(),
            bundle: None,
            operators: Vec::new(),
            models: Vec::new(),
            skipped: outcome.skipped.clone(),
        }
    }
}

/// How a query was matched to a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Match {
    /// The query's own key.
    Exact,
    /// The pooled model of the kind answered a query with a role.
    Pooled,
    /// The pooled model answered a query with a role whose own model exists but covers the
    /// query less (more of its features outside that model's training range).
    PooledBeyondRoleRange,
    /// A model of the twin data type (fp16 for bf16 or back) answered.
    TwinDtype,
}

/// An open models directory. Only the index is read when it opens; each model is read and
/// checked when a prediction first needs it.
#[derive(Debug)]
pub struct ModelSet {
    /// The directory.
    pub dir: PathBuf,
    /// The runtimes fitted to measured runs of the clusters that use these models.
    pub calibrations: Calibrations,
    reader: Reader,
    slots: BTreeMap<ModelKey, (usize, OnceLock<std::result::Result<TrainedModel, String>>)>,
}

/// The files of an earlier (per-model-file) format this tool wrote, named in `old`'s manifest:
/// plain names inside the directory that look like a model's, nothing else.
fn earlier_format_files(dir: &Path) -> Vec<PathBuf> {
    #[derive(Deserialize)]
    struct Old {
        models: Vec<OldEntry>,
    }
    #[derive(Deserialize)]
    struct OldEntry {
        file: String,
    }
    let Ok(old) = crate::fsutil::read_json::<Old>(&dir.join(MANIFEST_FILE)) else {
        return Vec::new();
    };
    // exactly the names an earlier stepcast gave its model files:
    // <op>.<phase>.<dtype>[.<role>].json, every part one of ours
    let ours = |name: &str| {
        let Some(stem) = name.strip_suffix(".json") else {
            return false;
        };
        let parts: Vec<&str> = stem.split('.').collect();
        let known = parts.len() >= 3
            && parts.len() <= 4
            && parts[0].parse::<crate::ops::OpKind>().is_ok()
            && parts[1].parse::<crate::ops::Phase>().is_ok()
            && parts[2].parse::<crate::ops::Dtype>().is_ok()
            && parts.get(3).is_none_or(|r| r.parse::<Role>().is_ok());
        known
    };
    old.models
        .into_iter()
        .filter(|e| ours(&e.file))
        .flat_map(|e| {
            let json = dir.join(&e.file);
            [json.with_extension("nodes"), json]
        })
        .filter(|p| p.symlink_metadata().is_ok_and(|m| m.is_file()))
        .collect()
}

impl ModelSet {
    /// Writes `models.bin` and then `manifest.json`, each atomically, and returns the manifest
    /// as written. Files of the earlier per-model format that the old manifest names are
    /// removed; nothing else in the directory is touched.
    pub fn save(dir: &Path, manifest: Manifest, models: Vec<TrainedModel>) -> Result<Manifest> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let _lock = crate::fsutil::DirLock::exclusive(dir)?;
        Self::save_locked(dir, manifest, models)
    }

    /// Rewrites a models directory in this version's `models.bin` layout: the same trees,
    /// validation and provenance, with what this version stores beside them (the collective
    /// probe table, so predictions need not evaluate it). Returns the manifest as written.
    pub fn repack(dir: &Path) -> Result<Manifest> {
        let _lock = crate::fsutil::DirLock::exclusive(dir)?;
        let manifest = Self::checked_manifest(dir)?;
        let set = Self::open(dir)?;
        let models = (0..set.reader.index.models.len())
            .map(|i| set.reader.model(i))
            .collect::<Result<Vec<_>>>()?;
        Self::save_locked(dir, manifest, models)
    }

    /// `save` with the directory already locked by the caller.
    fn save_locked(
        dir: &Path,
        mut manifest: Manifest,
        models: Vec<TrainedModel>,
    ) -> Result<Manifest> {
        // temporary files an earlier, killed training of ours left (nobody else writes here
        // while we hold the lock)
        for entry in std::fs::read_dir(dir)
            .map_err(|e| Error::io(dir, e))?
            .flatten()
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            let ours = [BUNDLE_FILE, MANIFEST_FILE]
                .iter()
                .any(|f| name.starts_with(&format!(".{f}.")) && name.ends_with(".tmp"));
            if ours && entry.file_type().is_ok_and(|t| t.is_file()) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        let stale = earlier_format_files(dir);
        let (bytes, index) = bundle::encode(&models)?;
        crate::fsutil::write_atomic(&dir.join(BUNDLE_FILE), &bytes)?;
        manifest.bundle = Some(BundleRef {
            file: BUNDLE_FILE.to_string(),
            bytes: bytes.len() as u64,
            checksum: bundle::checksum(&bytes),
        });
        manifest.models = models
            .iter()
            .zip(&index.models)
            .map(|(m, e)| ManifestEntry {
                key: m.key,
                recipe: m.recipe.to_string(),
                serves_roles: m.serves_roles.clone(),
                training_rows: m.training_rows,
                validation: m.validation,
                nodes: m.forest.node_count(),
                bytes: e.bytes,
            })
            .collect();
        manifest.models.sort_by_key(|e| e.key);
        let text = serde_json::to_string_pretty(&manifest)
            .map_err(|e| Error::bad_file(dir.join(MANIFEST_FILE), e.to_string()))?;
        crate::fsutil::write_atomic(&dir.join(MANIFEST_FILE), text.as_bytes())?;
        for path in stale {
            let _ = std::fs::remove_file(path);
        }
        Ok(manifest)
    }

    /// Opens a models directory and reads every model now (so a corrupt one fails here).
    pub fn load(dir: &Path) -> Result<ModelSet> {
        let set = Self::open(dir)?;
        for key in set.slots.keys() {
            set.try_get(key)?;
        }
        Ok(set)
    }

    /// Opens a models directory reading only the index of `models.bin`.
    pub fn open(dir: &Path) -> Result<ModelSet> {
        if !dir.is_dir() {
            return Err(Error::bad_file(
                dir,
                "models directory not found (train one with `stepcast train <dataset> --out <dir>`)",
            ));
        }
        let path = dir.join(BUNDLE_FILE);
        if !path.is_file() {
            if dir.join(MANIFEST_FILE).is_file() {
                // an earlier stepcast's directory says which version it is in its manifest
                Self::load_manifest(dir)?;
            }
            return Err(Error::bad_file(
                dir,
                format!(
                    "holds no {BUNDLE_FILE}: not a stepcast models directory (train one with \
                     `stepcast train <dataset> --out <dir>`)"
                ),
            ));
        }
        let calibration_path = dir.join(CALIBRATION_FILE);
        let calibration = if calibration_path.is_file() {
            let text = crate::fsutil::read_to_string(&calibration_path)?;
            Calibrations::parse(&calibration_path, &text)
                .map_err(|e| Error::Calibration(Box::new(e)))?
        } else {
            Calibrations::default()
        };
        Ok(Self::over(
            dir.to_path_buf(),
            Reader::open(&path)?,
            calibration,
        ))
    }

    /// A set whose models are read, each on first use, from `reader`.
    fn over(dir: PathBuf, reader: Reader, calibrations: Calibrations) -> ModelSet {
        let slots = reader
            .index
            .models
            .iter()
            .enumerate()
            .map(|(i, e)| (e.key, (i, OnceLock::new())))
            .collect();
        ModelSet {
            dir,
            calibrations,
            reader,
            slots,
        }
    }

    /// The built-in models of `models/<name>/` (see `assets`).
    pub fn builtin(name: &str) -> Result<ModelSet> {
        let bytes = crate::assets::models(name)
            .ok_or_else(|| Error::Invalid(format!("no built-in models named {name}")))?;
        let dir = PathBuf::from(format!("<built-in models/{name}>"));
        let reader = Reader::from_static(&dir.join(BUNDLE_FILE), bytes)?;
        let calibration = match crate::assets::calibration(name) {
            Some(text) => Calibrations::parse(&dir.join(CALIBRATION_FILE), text)?,
            None => Calibrations::default(),
        };
        Ok(Self::over(dir, reader, calibration))
    }

    /// See `bundle::Reader::fingerprint`.
    pub fn fingerprint(&self) -> &str {
        &self.reader.fingerprint
    }

    /// The GPU the models were trained on.
    pub fn gpu(&self) -> &GpuSpec {
        &self.reader.index.gpu
    }

    /// The dataset they were trained from.
    pub fn dataset(&self) -> &DatasetRef {
        &self.reader.index.dataset
    }

    /// The model of a key, read from the file on first use.
    pub fn try_get(&self, key: &ModelKey) -> Result<Option<&TrainedModel>> {
        let Some((i, slot)) = self.slots.get(key) else {
            return Ok(None);
        };
        let loaded = slot.get_or_init(|| self.reader.model(*i).map_err(|e| e.to_string()));
        match loaded {
            Ok(m) => Ok(Some(m)),
            Err(message) => Err(Error::Invalid(message.clone())),
        }
    }

    /// Reads and checks only the manifest.
    pub fn load_manifest(dir: &Path) -> Result<Manifest> {
        let path = dir.join(MANIFEST_FILE);
        if !dir.is_dir() {
            return Err(Error::bad_file(
                dir,
                "models directory not found (train one with `stepcast train <dataset> --out <dir>`)",
            ));
        }
        if !path.is_file() {
            return Err(Error::bad_file(
                dir,
                format!("no {MANIFEST_FILE}: not a stepcast models directory"),
            ));
        }
        let text = crate::fsutil::read_to_string(&path)?;
        super::model::check_versions(&path, &text)?;
        serde_json::from_str(&text)
            .map_err(|e| Error::bad_file(&path, crate::fsutil::parse_message(&e)))
    }

    /// The manifest, checked to describe the `models.bin` beside it (a training killed between
    /// writing the two leaves a manifest of the previous models).
    pub fn checked_manifest(dir: &Path) -> Result<Manifest> {
        let manifest = Self::load_manifest(dir)?;
        let bin = dir.join(BUNDLE_FILE);
        let bytes = std::fs::read(&bin).map_err(|e| Error::io(&bin, e))?;
        let described = manifest.bundle.as_ref().is_some_and(|b| {
            b.bytes == bytes.len() as u64 && b.checksum == bundle::checksum(&bytes)
        });
        if !described {
            return Err(Error::bad_file(
                dir.join(MANIFEST_FILE),
                format!(
                    "does not describe the {BUNDLE_FILE} beside it (a training was interrupted \
                     after writing the models): train again into this directory"
                ),
            ));
        }
        Ok(manifest)
    }

    /// Every model that could be read (all of them after a successful `load`).
    pub fn models(&self) -> impl Iterator<Item = &TrainedModel> {
        self.slots
            .keys()
            .filter_map(|k| self.try_get(k).ok().flatten())
    }

    /// The model of a key if it exists and can be read.
    pub fn get(&self, key: &ModelKey) -> Option<&TrainedModel> {
        self.try_get(key).ok().flatten()
    }

    /// The model that answers a query: the exact key, else the pooled model of the kind, else
    /// the same with the twin data type. A role that does not fall back to the pool
    /// (`Role::falls_back_to_pool`) takes the pooled model only where training found it
    /// serves that role, i.e. it was trained on that role's rows.
    ///
    /// Where both a role's own model and the pooled one exist, the role's model answers unless
    /// more of the query's features lie outside its training range than outside the pool's:
    /// beyond its range a model's trees stay at the range's edge, and a role's range is the
    /// narrower (on the A100 the attention-output model puts a 1024³ GEMM at 9.5 µs, 73 % of
    /// peak, where the pooled model, which saw m = 1024, says 19 µs and the smallest GEMMs
    /// measured reach 40–66 %).
    pub fn lookup(&self, q: &OpQuery) -> Result<Option<(&TrainedModel, Match)>> {
        let key = ModelKey::of(q);
        let twin = q.dtype.twin().map(|dtype| ModelKey { dtype, ..key });
        for (own_key, twin_type) in [(Some(key), false), (twin, true)] {
            let Some(own_key) = own_key else { continue };
            let own = self.try_get(&own_key)?;
            let pooled = match key.role {
                Some(role) => self
                    .try_get(&own_key.pooled())?
                    .filter(|m| role.falls_back_to_pool() || m.serves_roles.contains(&role)),
                None => None,
            };
            let how = |answered: Match| {
                if twin_type {
                    Match::TwinDtype
                } else {
                    answered
                }
            };
            // the pool's coverage is read only when the role's model falls short
            let pool_covers_better = |own: &TrainedModel, pool: &TrainedModel| {
                let outside = own.features_outside(q);
                outside > 0 && outside > pool.features_outside(q)
            };
            match (own, pooled) {
                (Some(own), Some(pool)) if pool_covers_better(own, pool) => {
                    return Ok(Some((pool, how(Match::PooledBeyondRoleRange))));
                }
                (Some(own), _) => return Ok(Some((own, how(Match::Exact)))),
                (None, Some(pool)) => return Ok(Some((pool, how(Match::Pooled)))),
                (None, None) => {}
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{Dtype, GemmShape, OpKind, Phase, Role, Shape};

    fn attn_out(dtype: Dtype, m: u64, n: u64, k: u64) -> OpQuery {
        OpQuery {
            op: OpKind::Gemm,
            phase: Phase::Fwd,
            dtype,
            role: Some(Role::AttnOut),
            shape: Shape::Gemm(GemmShape { m, n, k, batch: 1 }),
        }
    }

    /// A LayerNorm's and the pooled optimizer's models of the paper's A100 set, and a manifest
    /// for them as `train` fills it in before saving.
    fn two_models() -> (Manifest, Vec<TrainedModel>) {
        let set = ModelSet::builtin("perlmutter").unwrap();
        let key = |op, phase| ModelKey {
            op,
            phase,
            dtype: Dtype::Fp16,
            role: None,
        };
        // the optimizer's first: `save` lists the manifest by key
        let models: Vec<TrainedModel> = [
            key(OpKind::OptimizerStep, Phase::None),
            key(OpKind::LayerNorm, Phase::Fwd),
        ]
        .iter()
        .map(|k| set.get(k).unwrap().clone())
        .collect();
        let manifest = Manifest {
            format_version: super::super::model::MODEL_FORMAT_VERSION,
            feature_schema_version: crate::ops::features::FEATURE_SCHEMA_VERSION,
            stepcast_version: "test".into(),
            created_at: "2026-11-29".into(),
            seed: 7,
            training_seconds: 1.0,
            dataset: models[0].dataset.clone(),
            gpu: models[0].gpu.clone(),
            gpus_per_node: None,
            network: None,
            reference_errors: Vec::new(),
            bundle: None,
            operators: Vec::new(),
            models: Vec::new(),
            skipped: Vec::new(),
        };
        (manifest, models)
    }

    /// `save` writes the models and a manifest describing them; `open` and `load` give the same
    /// models back, `checked_manifest` the manifest; `repack` rewrites the same.
    #[test]
    fn saved_models_open_as_they_were_saved() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("models");
        let (manifest, models) = two_models();
        let written = ModelSet::save(&dir, manifest, models.clone()).unwrap();
        let keys: Vec<_> = written.models.iter().map(|e| e.key).collect();
        assert_eq!(keys, [models[1].key, models[0].key]);
        let optimizer = &written.models[1];
        assert_eq!(optimizer.serves_roles, models[0].serves_roles);
        assert!(!optimizer.serves_roles.is_empty());
        assert_eq!(optimizer.training_rows, models[0].training_rows);
        assert_eq!(optimizer.validation, models[0].validation);
        assert_eq!(optimizer.nodes, models[0].forest.node_count());
        assert_eq!(optimizer.recipe, models[0].recipe.to_string());
        let bytes = std::fs::read(dir.join(BUNDLE_FILE)).unwrap();
        let bundle = written.bundle.clone().unwrap();
        assert_eq!(bundle.file, BUNDLE_FILE);
        assert_eq!(bundle.bytes, bytes.len() as u64);
        assert_eq!(bundle.checksum, bundle::checksum(&bytes));
        let sizes: u64 = written.models.iter().map(|e| e.bytes).sum();
        assert!(sizes > 0 && sizes < bundle.bytes);

        let checked = ModelSet::checked_manifest(&dir).unwrap();
        assert_eq!(
            serde_json::to_value(&checked).unwrap(),
            serde_json::to_value(&written).unwrap()
        );
        let set = ModelSet::load(&dir).unwrap();
        assert_eq!(set.dir, dir);
        assert_eq!(set.models().count(), 2);
        for m in &models {
            assert_eq!(set.get(&m.key), Some(m));
        }
        assert_eq!(set.gpu(), &models[0].gpu);
        assert_eq!(set.dataset(), &models[0].dataset);
        assert_eq!(
            bundle::fingerprint(&bytes).as_deref(),
            Some(set.fingerprint())
        );
        assert_eq!(set.calibrations, Calibrations::default());

        let repacked = ModelSet::repack(&dir).unwrap();
        assert_eq!(std::fs::read(dir.join(BUNDLE_FILE)).unwrap(), bytes);
        assert_eq!(
            serde_json::to_value(&repacked).unwrap(),
            serde_json::to_value(&written).unwrap()
        );
    }

    /// What `save` removes: our own temporary files and the earlier format's model files its old
    /// manifest names — nothing else, not even a file of that name the old manifest does not name.
    #[test]
    fn saving_removes_only_what_stepcast_left() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let old = r#"{"models": [{"file": "layernorm.fwd.fp16.json"},
            {"file": "gemm.bwd.fp16.qkv.json"}, {"file": "notes.json"},
            {"file": "gemm.bwd.fp16.qkv.extra.json"}, {"file": "layernorm.fwd.fp16.nodes"},
            {"file": "sub/layernorm.bwd.fp16.json"}, {"file": "gemm.sideways.fp16.json"}]}"#;
        std::fs::write(dir.join(MANIFEST_FILE), old).unwrap();
        let ours = [
            "layernorm.fwd.fp16.json",
            "layernorm.fwd.fp16.nodes",
            "gemm.bwd.fp16.qkv.json",
            ".models.bin.1234.tmp",
            ".manifest.json.abcd.tmp",
        ];
        let theirs = [
            "notes.json",
            "gemm.bwd.fp16.qkv.extra.json",
            "gemm.sideways.fp16.json",
            "rmsnorm.fwd.fp16.json",
            ".models.bin.1234.tmp.keep",
            ".other.1234.tmp",
            "models.bin.tmp",
        ];
        for name in ours.iter().chain(&theirs) {
            std::fs::write(dir.join(name), "x").unwrap();
        }
        std::fs::create_dir(dir.join("sub")).unwrap();
        std::fs::write(dir.join("sub/layernorm.bwd.fp16.json"), "x").unwrap();
        let (manifest, models) = two_models();
        ModelSet::save(dir, manifest, models).unwrap();
        for name in ours {
            assert!(!dir.join(name).exists(), "{name} kept");
        }
        for name in theirs.iter().chain(&["sub/layernorm.bwd.fp16.json"]) {
            assert!(dir.join(name).exists(), "{name} removed");
        }
    }

    #[test]
    fn a_directory_being_written_is_not_written_twice() {
        let tmp = tempfile::tempdir().unwrap();
        let _writer = crate::fsutil::DirLock::exclusive(tmp.path()).unwrap();
        let (manifest, models) = two_models();
        let err = ModelSet::save(tmp.path(), manifest, models).unwrap_err();
        assert!(err.to_string().contains("another stepcast"), "{err}");
        assert!(!tmp.path().join(BUNDLE_FILE).exists());
    }

    /// A directory that is not one of ours, or whose files disagree, is refused with what to do.
    #[test]
    fn directories_that_are_not_models_are_refused_by_name() {
        let tmp = tempfile::tempdir().unwrap();
        let missing = tmp.path().join("nowhere");
        for err in [
            ModelSet::open(&missing).unwrap_err(),
            ModelSet::load_manifest(&missing).unwrap_err(),
        ] {
            let err = err.to_string();
            assert!(
                err.contains("nowhere") && err.contains("not found"),
                "{err}"
            );
        }
        let dir = tmp.path().join("models");
        std::fs::create_dir(&dir).unwrap();
        let err = ModelSet::open(&dir).unwrap_err().to_string();
        assert!(
            err.contains("holds no models.bin") && err.contains("stepcast train"),
            "{err}"
        );
        let err = ModelSet::load_manifest(&dir).unwrap_err().to_string();
        assert!(err.contains("no manifest.json"), "{err}");
        // an earlier version's directory: its manifest says which version it is
        let earlier = r#"{"format_version": 1, "feature_schema_version": 1, "models": []}"#;
        std::fs::write(dir.join(MANIFEST_FILE), earlier).unwrap();
        let err = ModelSet::open(&dir).unwrap_err();
        assert!(matches!(err, Error::SchemaVersion { .. }), "{err}");
        std::fs::write(dir.join(MANIFEST_FILE), "{").unwrap();
        assert!(ModelSet::load_manifest(&dir).is_err());

        // a manifest left from the models before the ones beside it
        let (manifest, models) = two_models();
        ModelSet::save(&dir, manifest.clone(), models.clone()).unwrap();
        let previous = std::fs::read(dir.join(MANIFEST_FILE)).unwrap();
        ModelSet::save(&dir, manifest, models[..1].to_vec()).unwrap();
        ModelSet::checked_manifest(&dir).unwrap();
        std::fs::write(dir.join(MANIFEST_FILE), previous).unwrap();
        let err = ModelSet::checked_manifest(&dir).unwrap_err().to_string();
        assert!(
            err.contains("does not describe") && err.contains("train again"),
            "{err}"
        );
        // one of the same size whose checksum differs
        let mut bin = std::fs::read(dir.join(BUNDLE_FILE)).unwrap();
        ModelSet::save(&dir, two_models().0, two_models().1[..1].to_vec()).unwrap();
        let last = bin.len() - 1;
        bin[last] ^= 1;
        std::fs::write(dir.join(BUNDLE_FILE), &bin).unwrap();
        assert!(ModelSet::checked_manifest(&dir).is_err());
        // `open` reads the index only: the damaged model is refused when read, and by `load`
        let set = ModelSet::open(&dir).unwrap();
        let key = set.slots.keys().next().copied().unwrap();
        assert!(set.try_get(&key).is_err());
        assert!(set.get(&key).is_none());
        assert_eq!(set.models().count(), 0);
        assert!(ModelSet::load(&dir).is_err());
    }

    /// A `calibration.yaml` beside the models is read with them, and checked.
    #[test]
    fn a_calibration_beside_the_models_is_read_and_checked() {
        let tmp = tempfile::tempdir().unwrap();
        let (manifest, models) = two_models();
        ModelSet::save(tmp.path(), manifest, models).unwrap();
        let text = crate::assets::calibration("perlmutter").unwrap();
        std::fs::write(tmp.path().join(CALIBRATION_FILE), text).unwrap();
        let set = ModelSet::open(tmp.path()).unwrap();
        assert!(set.calibrations.of("dgx-a100").is_some());
        assert_eq!(
            set.calibrations,
            ModelSet::builtin("perlmutter").unwrap().calibrations
        );
        std::fs::write(tmp.path().join(CALIBRATION_FILE), "clusters: 3\n").unwrap();
        let err = ModelSet::open(tmp.path()).unwrap_err().to_string();
        assert!(err.contains(CALIBRATION_FILE), "{err}");
        assert!(ModelSet::builtin("no-such-gpu").is_err());
    }

    /// Which model answers: the query's own key, the pooled model of its kind for a role
    /// without one (only a role the pool serves, for roles that do not fall back), or either of
    /// those in the twin data type.
    #[test]
    fn lookup_falls_back_to_the_pool_and_the_twin_type() {
        let set = ModelSet::builtin("perlmutter").unwrap();
        let optimizer = |role, dtype| OpQuery {
            op: OpKind::OptimizerStep,
            phase: Phase::None,
            dtype,
            role,
            shape: Shape::Optimizer(crate::ops::OptimizerShape {
                params: 50_000_000,
                tensors: 100,
            }),
        };
        let answer = |q: &OpQuery| {
            let (m, how) = set.lookup(q).unwrap().unwrap();
            (m.key.role, how)
        };
        let first = Some(Role::FirstStage);
        let middle = Some(Role::MiddleStage);
        for (role, dtype, answered) in [
            (first, Dtype::Fp16, (first, Match::Exact)),
            // the middle stage has no model of its own: the pool, trained on its rows
            (middle, Dtype::Fp16, (None, Match::Pooled)),
            (None, Dtype::Fp16, (None, Match::Exact)),
            (first, Dtype::Bf16, (first, Match::TwinDtype)),
            (middle, Dtype::Bf16, (None, Match::TwinDtype)),
        ] {
            assert_eq!(
                answer(&optimizer(role, dtype)),
                answered,
                "{role:?} {dtype}"
            );
        }
        // a fused Adam is another kernel: the pool, not trained on its rows, does not answer
        let fused = Some(Role::FusedAdam);
        assert!(!set
            .get(&ModelKey::of(&optimizer(None, Dtype::Fp16)))
            .unwrap()
            .serves_roles
            .contains(&Role::FusedAdam));
        assert!(set
            .lookup(&optimizer(fused, Dtype::Fp16))
            .unwrap()
            .is_none());
        // fp32 has no twin, and the A100 set no fp32 models
        assert!(set
            .lookup(&optimizer(first, Dtype::Fp32))
            .unwrap()
            .is_none());
    }

    #[test]
    fn a_role_model_answers_inside_its_range_and_the_pool_where_it_saw_more() {
        let set = ModelSet::builtin("perlmutter").unwrap();
        // a shape the paper measured for the attention output: the role's own model
        let inside = attn_out(Dtype::Fp16, 3072, 3072, 3072);
        let (m, how) = set.lookup(&inside).unwrap().unwrap();
        assert_eq!((m.key.role, how), (Some(Role::AttnOut), Match::Exact));
        assert_eq!(m.features_outside(&inside), 0);
        // 1024³ lies below every attention-output shape but among the pool's (attention GEMMs
        // of m = 1024): the pool answers, and no faster than the smallest GEMMs measured
        let small = attn_out(Dtype::Fp16, 1024, 1024, 1024);
        let own = set.get(&ModelKey::of(&small)).unwrap();
        let (m, how) = set.lookup(&small).unwrap().unwrap();
        assert_eq!((m.key.role, how), (None, Match::PooledBeyondRoleRange));
        assert!(m.features_outside(&small) < own.features_outside(&small));
        let efficiency = 2.0 * 1024f64.powi(3) / (m.predict(&small).time_us * 1e-6) / 312e12;
        assert!(efficiency < 0.66, "{efficiency}");
        // a shape beyond both models' ranges alike (8 features each): the role's own model
        let huge = attn_out(Dtype::Fp16, 1 << 20, 1 << 18, 1 << 18);
        let pool = set.get(&ModelKey::of(&huge).pooled()).unwrap();
        let (m, how) = set.lookup(&huge).unwrap().unwrap();
        assert_eq!((m.key.role, how), (Some(Role::AttnOut), Match::Exact));
        assert_eq!(m.features_outside(&huge), pool.features_outside(&huge));
        assert!(m.features_outside(&huge) > 0);
        // the same choice through the twin type (bf16 on fp16 models)
        let (m, how) = set
            .lookup(&attn_out(Dtype::Bf16, 1024, 1024, 1024))
            .unwrap()
            .unwrap();
        assert_eq!((m.key.role, how), (None, Match::TwinDtype));
    }

    /// A fused cross-entropy is another kernel than the unfused one the paper timed: the
    /// pooled cross-entropy model does not answer for it (its roofline does), while it still
    /// answers the unfused call.
    #[test]
    fn the_unfused_cross_entropy_model_does_not_answer_a_fused_one() {
        let set = ModelSet::builtin("perlmutter").unwrap();
        let ce = |role| OpQuery {
            op: OpKind::CrossEntropy,
            phase: Phase::Fwd,
            dtype: Dtype::Fp16,
            role,
            shape: Shape::Tokens(crate::ops::TokenShape {
                batch: 4,
                seq: 2048,
                width: 25216,
            }),
        };
        assert!(set.lookup(&ce(None)).unwrap().is_some());
        assert!(set
            .lookup(&ce(Some(Role::FusedCrossEntropy)))
            .unwrap()
            .is_none());
    }
}

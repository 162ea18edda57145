//! A directory of trained models (`models/<cluster>/`): `manifest.json` (what was trained from
//! what, with which errors) plus one JSON file per model.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use super::model::{DatasetRef, ModelKey, TrainedModel, Validation};
use crate::dataset::ReferenceError;
use crate::error::{Error, Result};
use crate::hardware::{GpuSpec, NetworkSpec};
use crate::ops::{OpQuery, Role};

pub const MANIFEST_FILE: &str = "manifest.json";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ManifestEntry {
    pub file: String,
    pub key: ModelKey,
    /// Human-readable recipe, e.g. "boosting 300× depth 5 …".
    pub recipe: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub serves_roles: Vec<Role>,
    pub training_rows: usize,
    pub validation: Validation,
    pub nodes: usize,
    pub bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub format_version: u32,
    pub feature_schema_version: u32,
    pub stepcast_version: String,
    pub created_at: String,
    pub seed: u64,
    pub training_seconds: f64,
    pub dataset: DatasetRef,
    pub gpu: GpuSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_per_node: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkSpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reference_errors: Vec<ReferenceError>,
    pub models: Vec<ManifestEntry>,
    /// Groups not trained, with the reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<(ModelKey, String)>,
}

/// How a query was matched to a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Match {
    Exact,
    /// The pooled model of the kind answered a query with a role.
    Pooled,
    /// A model of the twin data type (fp16 for bf16 or back) answered.
    TwinDtype,
}

/// A models directory. Models are read on first use, so a prediction that needs a dozen of a
/// cluster's forty models reads only those.
#[derive(Debug)]
pub struct ModelSet {
    pub dir: PathBuf,
    pub manifest: Manifest,
    slots: BTreeMap<ModelKey, OnceLock<std::result::Result<TrainedModel, String>>>,
}

impl ModelSet {
    /// Writes every model file (atomically), removes model files of an earlier training that
    /// the new one no longer has, and writes the manifest last.
    pub fn save(dir: &Path, mut manifest: Manifest, models: Vec<TrainedModel>) -> Result<ModelSet> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let old: Vec<String> = crate::fsutil::read_json::<Manifest>(&dir.join(MANIFEST_FILE))
            .map(|m| m.models.into_iter().map(|e| e.file).collect())
            .unwrap_or_default();
        manifest.models.clear();
        let mut slots = BTreeMap::new();
        for model in models {
            let file = model.key.file_name();
            let path = dir.join(&file);
            model.save(&path)?;
            let bytes = [path.clone(), path.with_extension("nodes")]
                .iter()
                .map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
                .sum();
            manifest.models.push(ManifestEntry {
                file,
                key: model.key,
                recipe: model.recipe.to_string(),
                serves_roles: model.serves_roles.clone(),
                training_rows: model.training_rows,
                validation: model.validation,
                nodes: model.forest.node_count(),
                bytes,
            });
            slots.insert(model.key, OnceLock::from(Ok(model)));
        }
        manifest.models.sort_by_key(|e| e.key);
        for stale in old {
            if !manifest.models.iter().any(|e| e.file == stale) {
                let path = dir.join(stale);
                let _ = std::fs::remove_file(path.with_extension("nodes"));
                let _ = std::fs::remove_file(path);
            }
        }
        let text = serde_json::to_string_pretty(&manifest)
            .map_err(|e| Error::bad_file(dir.join(MANIFEST_FILE), e.to_string()))?;
        crate::fsutil::write_atomic(&dir.join(MANIFEST_FILE), text.as_bytes())?;
        Ok(ModelSet {
            dir: dir.to_path_buf(),
            manifest,
            slots,
        })
    }

    /// Opens a models directory and reads every model now (so a corrupt file fails here).
    pub fn load(dir: &Path) -> Result<ModelSet> {
        let set = Self::open(dir)?;
        for key in set.slots.keys() {
            set.try_get(key)?;
        }
        Ok(set)
    }

    /// Opens a models directory reading only its manifest; models are read on first use.
    pub fn open(dir: &Path) -> Result<ModelSet> {
        let manifest = Self::load_manifest(dir)?;
        let slots = manifest
            .models
            .iter()
            .map(|e| (e.key, OnceLock::new()))
            .collect();
        Ok(ModelSet {
            dir: dir.to_path_buf(),
            manifest,
            slots,
        })
    }

    /// The model of a key, read from disk on first use.
    pub fn try_get(&self, key: &ModelKey) -> Result<Option<&TrainedModel>> {
        let Some(slot) = self.slots.get(key) else {
            return Ok(None);
        };
        let loaded = slot.get_or_init(|| {
            let entry = self
                .manifest
                .models
                .iter()
                .find(|e| e.key == *key)
                .expect("slots mirror the manifest");
            let path = self.dir.join(&entry.file);
            let model = TrainedModel::load(&path).map_err(|e| e.to_string())?;
            if model.key != entry.key {
                return Err(format!(
                    "{}: holds the model for {} but the manifest lists {}",
                    path.display(),
                    model.key,
                    entry.key
                ));
            }
            Ok(model)
        });
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
        serde_json::from_str(&text).map_err(|e| Error::bad_file(&path, e.to_string()))
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
    /// the same with the twin data type.
    pub fn lookup(&self, q: &OpQuery) -> Result<Option<(&TrainedModel, Match)>> {
        let key = ModelKey::of(q);
        let twin = q.dtype.twin().map(|dtype| ModelKey { dtype, ..key });
        let candidates = [
            Some((key, Match::Exact)),
            Some((key.pooled(), Match::Pooled)),
            twin.map(|t| (t, Match::TwinDtype)),
            twin.map(|t| (t.pooled(), Match::TwinDtype)),
        ];
        for (k, how) in candidates.into_iter().flatten() {
            if let Some(m) = self.try_get(&k)? {
                return Ok(Some((m, if k == key { Match::Exact } else { how })));
            }
        }
        Ok(None)
    }
}

//! A directory of trained models (`models/<cluster>/`): `manifest.json` (what was trained from
//! what, with which errors) plus one JSON file per model.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

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

#[derive(Debug)]
pub struct ModelSet {
    pub dir: PathBuf,
    pub manifest: Manifest,
    models: BTreeMap<ModelKey, TrainedModel>,
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
        let mut map = BTreeMap::new();
        for model in models {
            let file = model.key.file_name();
            let path = dir.join(&file);
            model.save(&path)?;
            let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
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
            map.insert(model.key, model);
        }
        manifest.models.sort_by_key(|e| e.key);
        for stale in old {
            if !manifest.models.iter().any(|e| e.file == stale) {
                let _ = std::fs::remove_file(dir.join(stale));
            }
        }
        let text = serde_json::to_string_pretty(&manifest)
            .map_err(|e| Error::bad_file(dir.join(MANIFEST_FILE), e.to_string()))?;
        crate::fsutil::write_atomic(&dir.join(MANIFEST_FILE), text.as_bytes())?;
        Ok(ModelSet {
            dir: dir.to_path_buf(),
            manifest,
            models: map,
        })
    }

    pub fn load(dir: &Path) -> Result<ModelSet> {
        let manifest = Self::load_manifest(dir)?;
        let mut models = BTreeMap::new();
        for entry in &manifest.models {
            let path = dir.join(&entry.file);
            let model = TrainedModel::load(&path)?;
            if model.key != entry.key {
                return Err(Error::bad_file(
                    &path,
                    format!(
                        "holds the model for {} but the manifest lists {}",
                        model.key, entry.key
                    ),
                ));
            }
            models.insert(model.key, model);
        }
        Ok(ModelSet {
            dir: dir.to_path_buf(),
            manifest,
            models,
        })
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
        super::model::check_versions(&path, &crate::fsutil::read_to_string(&path)?)?;
        crate::fsutil::read_json(&path)
    }

    pub fn models(&self) -> impl Iterator<Item = &TrainedModel> {
        self.models.values()
    }

    pub fn get(&self, key: &ModelKey) -> Option<&TrainedModel> {
        self.models.get(key)
    }

    /// The model that answers a query: the exact key, else the pooled model of the kind, else
    /// the same with the twin data type.
    pub fn lookup(&self, q: &OpQuery) -> Option<(&TrainedModel, Match)> {
        let key = ModelKey::of(q);
        let twin = q.dtype.twin().map(|dtype| ModelKey { dtype, ..key });
        let candidates = [
            Some((key, Match::Exact)),
            Some((key.pooled(), Match::Pooled)),
            twin.map(|t| (t, Match::TwinDtype)),
            twin.map(|t| (t.pooled(), Match::TwinDtype)),
        ];
        candidates.into_iter().flatten().find_map(|(k, how)| {
            self.models
                .get(&k)
                .map(|m| (m, if k == key { Match::Exact } else { how }))
        })
    }
}

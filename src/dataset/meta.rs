//! The stamp of one collection, kept once in `meta.yaml` beside its CSV files: which GPU and
//! software measured the rows, how, and where the data came from.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
pub use crate::hardware::SoftwareStamp;
use crate::hardware::{GpuSpec, NetworkSpec};
use crate::ops::{OpKind, Phase, Role};

/// Version of the dataset layout (columns and `meta.yaml`).
pub const DATASET_SCHEMA_VERSION: u32 = 1;

pub const META_FILE: &str = "meta.yaml";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetMeta {
    pub schema_version: u32,
    /// Short identifier, e.g. "perlmutter-a100-paper".
    pub name: String,
    /// When the measurements were taken (ISO date), as far as known.
    pub collected_at: String,
    pub gpu: GpuSpec,
    /// GPUs per node of the machine the collectives ran on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_per_node: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkSpec>,
    pub software: SoftwareStamp,
    pub source: Provenance,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Protocol>,
    /// The stepcast-bench that collected it (none for imported data). A collection measures
    /// each point once, so a point that appears twice is refused (two collectors wrote the
    /// directory at once); imported data may repeat a shape (repeated measurements).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collector: Option<String>,
    /// Errors published with the source data (e.g. the paper's cross-validated error per
    /// operator), shown beside ours by `stepcast eval`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reference_errors: Vec<ReferenceError>,
}

/// Where data came from, so a trained model can say it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provenance {
    pub description: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub license: Option<String>,
}

/// How each point was timed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Protocol {
    pub warmup_runs: u32,
    pub timed_runs: u32,
    /// The summary is the mean of this many middle samples of the sorted timed runs.
    pub kept_middle: u32,
    /// e.g. "CUDA events", "torch.profiler".
    pub timer: String,
}

/// A published error for one operator (and collective layout), in percent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReferenceError {
    /// The source's own name, e.g. "linear1".
    pub label: String,
    pub op: OpKind,
    pub phase: Phase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_per_node: Option<u64>,
    /// For collectives: the message sizes (bytes) the source's model was fitted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_range: Option<[u64; 2]>,
    /// The regressor the source chose, e.g. "rforest".
    pub regressor: String,
    pub mape_percent: f64,
}

impl DatasetMeta {
    pub fn load(dir: &Path) -> Result<DatasetMeta> {
        let path = dir.join(META_FILE);
        if !path.is_file() {
            return Err(Error::bad_file(
                dir,
                format!(
                    "not a dataset: no {META_FILE} here (a dataset directory holds {META_FILE} \
                     and one <op>.csv per operator; create one with `stepcast datasets import` \
                     or `stepcast bench collect`)"
                ),
            ));
        }
        let meta: DatasetMeta = crate::fsutil::read_yaml(&path)
            .map_err(|e| e.hint("see the README's Datasets section for the fields of meta.yaml"))?;
        if meta.schema_version != DATASET_SCHEMA_VERSION {
            return Err(Error::SchemaVersion {
                path,
                what: "dataset schema",
                found: meta.schema_version,
                expected: DATASET_SCHEMA_VERSION,
            });
        }
        meta.gpu
            .validate(&path.display().to_string())
            .map_err(Error::Invalid)?;
        if let Some(net) = &meta.network {
            net.validate(&path.display().to_string())
                .map_err(Error::Invalid)?;
        }
        Ok(meta)
    }

    pub fn save(&self, dir: &Path) -> Result<()> {
        let text = serde_norway::to_string(self)
            .map_err(|e| Error::bad_file(dir.join(META_FILE), e.to_string()))?;
        crate::fsutil::write_atomic(&dir.join(META_FILE), text.as_bytes())
    }
}

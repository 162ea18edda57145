//! Measured datasets: one directory per collection, holding `meta.yaml` (the stamp) and one
//! CSV file per operator kind (`gemm.csv`, `flash_attention.csv`, …) with one row per measured
//! (operator, phase, shape): every raw timed sample and the sorted-median summary.
//!
//! The CSV files are plain (comma-separated, header row, empty cells for unknowns) so that pandas
//! and polars read them as they are; `samples_us` holds the raw samples separated by `;`.

pub mod compare;
mod csvio;
pub mod import;
mod meta;

pub use csvio::{read_csv, MeasurementWriter, CSV_FIXED_COLUMNS};
pub use meta::{
    DatasetMeta, Protocol, Provenance, ReferenceError, SoftwareStamp, DATASET_SCHEMA_VERSION,
    META_FILE,
};

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::ops::OpQuery;

/// The layer a sampled shape came from, where it came from one (a model config at a tensor-
/// parallel degree). Lets evaluation hold out, say, the largest hidden size even for GEMM rows
/// whose own shape only says m, n, k.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LayerContext {
    pub batch: Option<u64>,
    pub seq: Option<u64>,
    pub hidden: Option<u64>,
    pub heads: Option<u64>,
    pub tp: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Status {
    /// Measured; `time_us` holds the summary.
    Ok,
    /// Could not be measured (out of memory, unsupported); the reason is in `note`.
    Skipped,
}

/// One measured point.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    pub query: OpQuery,
    pub context: LayerContext,
    /// Sorted-median summary of the timed samples, microseconds (NaN when skipped).
    pub time_us: f64,
    /// Every timed sample, microseconds; empty where the source kept only the summary.
    pub samples_us: Vec<f64>,
    pub status: Status,
    /// Clocks dropped or a throttle reason was active while this point was timed.
    pub throttled: bool,
    pub note: String,
}

impl Measurement {
    pub fn is_ok(&self) -> bool {
        self.status == Status::Ok
    }
}

/// A loaded dataset directory.
#[derive(Debug, Clone)]
pub struct Dataset {
    pub dir: PathBuf,
    pub meta: DatasetMeta,
    pub rows: Vec<Measurement>,
    /// SHA-256 (first 16 hex digits) of `meta.yaml` and every CSV file, in name order.
    pub fingerprint: String,
}

impl Dataset {
    /// Loads and checks every file of a dataset directory. A malformed row is an error that
    /// names its file and line; nothing is silently dropped.
    pub fn load(dir: &Path) -> Result<Dataset> {
        if !dir.is_dir() {
            return Err(Error::bad_file(
                dir,
                "dataset directory not found (give the directory that holds meta.yaml)",
            ));
        }
        let meta = DatasetMeta::load(dir)?;
        let csvs = csv_files(dir)?;
        if csvs.is_empty() {
            return Err(Error::Empty(format!(
                "{}: dataset has no <op>.csv files: collect some with `stepcast bench collect` \
                 or import a release with `stepcast datasets import`",
                dir.display()
            )));
        }
        let mut hasher = Sha256::new();
        hasher.update(fs::read(dir.join(META_FILE)).map_err(|e| Error::io(dir, e))?);
        let mut rows = Vec::new();
        for path in &csvs {
            let bytes = fs::read(path).map_err(|e| Error::io(path, e))?;
            hasher.update(path.file_name().unwrap().to_string_lossy().as_bytes());
            hasher.update(&bytes);
            let file_rows = read_csv(path, &bytes)?;
            if meta.collector.is_some() {
                refuse_repeats(path, &file_rows)?;
            }
            rows.extend(file_rows);
        }
        if !rows.iter().any(Measurement::is_ok) {
            return Err(Error::Empty(format!(
                "{}: dataset holds no measured rows: collect some with `stepcast bench collect` \
                 (or --resume it with --retry-skipped)",
                dir.display()
            )));
        }
        let digest = hasher.finalize();
        let fingerprint = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        Ok(Dataset {
            dir: dir.to_path_buf(),
            meta,
            rows,
            fingerprint,
        })
    }

    pub fn ok_rows(&self) -> impl Iterator<Item = &Measurement> {
        self.rows.iter().filter(|r| r.is_ok())
    }
}

/// A collection's rows each measure a different point: a repeat means two collectors wrote one
/// directory, and which of the two to keep is the user's choice.
fn refuse_repeats(path: &Path, rows: &[Measurement]) -> Result<()> {
    let mut seen: std::collections::HashMap<(OpQuery, LayerContext), usize> =
        std::collections::HashMap::new();
    for (i, r) in rows.iter().enumerate() {
        // line 1 is the header
        let line = i as u64 + 2;
        if let Some(first) = seen.insert((r.query, r.context), i) {
            return Err(Error::bad_row(
                path,
                line,
                format!(
                    "{} was already measured on line {}: two collectors wrote this directory at \
                     once; delete one of the two lines (or collect again into a new directory)",
                    r.query,
                    first + 2
                ),
            ));
        }
    }
    Ok(())
}

fn csv_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "csv") && p.is_file())
        .collect();
    files.sort();
    Ok(files)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ops::{Dtype, GemmShape, OpKind, Phase, Shape};

    /// A measured bf16 forward GEMM of m × 1024 × 1024 taking `us`.
    pub(crate) fn gemm(m: u64, us: f64) -> Measurement {
        Measurement {
            query: OpQuery {
                op: OpKind::Gemm,
                phase: Phase::Fwd,
                dtype: Dtype::Bf16,
                role: None,
                shape: Shape::Gemm(GemmShape {
                    m,
                    n: 1024,
                    k: 1024,
                    batch: 1,
                }),
            },
            context: Default::default(),
            time_us: us,
            samples_us: Vec::new(),
            status: Status::Ok,
            throttled: false,
            note: String::new(),
        }
    }

    #[test]
    fn a_point_measured_twice_is_refused_naming_both_lines() {
        let path = Path::new("gemm.csv");
        // one shape sampled from two layers is two points
        let tp2 = Measurement {
            context: LayerContext {
                tp: Some(2),
                ..Default::default()
            },
            ..gemm(1, 10.0)
        };
        let rows = [
            gemm(1, 10.0),
            gemm(2, 10.0),
            tp2,
            gemm(3, 10.0),
            gemm(2, 10.0),
        ];
        refuse_repeats(path, &rows[..4]).unwrap();
        let e = refuse_repeats(path, &rows).unwrap_err().to_string();
        assert!(e.starts_with("gemm.csv:6: "), "{e}");
        assert!(e.contains("already measured on line 3"), "{e}");
    }
}

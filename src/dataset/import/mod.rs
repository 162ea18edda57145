//! Importers that turn public measurement releases into stepcast datasets. They read the source
//! files in place (nothing is copied verbatim), convert units and shapes, and refuse malformed
//! rows with the file and line.

mod aiconfigurator;
mod estimate_train_time;

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::{Error, Result};

use super::{DatasetMeta, Measurement, MeasurementWriter};

crate::named_enum!(
    /// A public release stepcast can import.
    pub enum ImportFormat {
        /// The paper's own data (github.com/DebarghaG/estimate-train-time): a system directory
        /// with operator/ and nccl/, or the release root with --system Perlmutter|Vista.
        EstimateTrainTime => "estimate-train-time",
        /// NVIDIA aiconfigurator's perf database converted to CSV: gemm/, context_attention/,
        /// nccl/, systems/; pick the GPU with --system a100_sxm|h100_sxm|h200_sxm.
        Aiconfigurator => "aiconfigurator",
    }
);

#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// Which system of a multi-system release.
    pub system: Option<String>,
    /// aiconfigurator: which NCCL version's table (default: the newest).
    pub nccl_version: Option<String>,
}

/// What an import wrote and what it left out, and why.
#[derive(Debug, Default)]
pub struct ImportReport {
    pub rows_per_op: BTreeMap<String, usize>,
    /// (what, rows, reason) for every source row or file not imported.
    pub left_out: Vec<(String, usize, String)>,
    pub meta: Option<DatasetMeta>,
}

pub fn import(
    format: ImportFormat,
    source: &Path,
    out: &Path,
    options: &ImportOptions,
) -> Result<ImportReport> {
    if !source.is_dir() {
        return Err(Error::bad_file(
            source,
            "source directory not found: give the directory of the release (see \
             ../shared/reference-data or the release's repository)",
        ));
    }
    if out.join(super::META_FILE).exists() {
        return Err(Error::Invalid(format!(
            "{}: already holds a dataset; choose another --out or remove it first",
            out.display()
        )));
    }
    let (meta, rows, left_out) = match format {
        ImportFormat::EstimateTrainTime => estimate_train_time::read(source, options)?,
        ImportFormat::Aiconfigurator => aiconfigurator::read(source, options)?,
    };
    if rows.is_empty() {
        return Err(Error::Empty(format!(
            "{}: no rows found to import",
            source.display()
        )));
    }
    let mut writer = MeasurementWriter::new(out)?;
    let mut report = ImportReport {
        left_out,
        ..Default::default()
    };
    for row in &rows {
        writer.append(row)?;
        *report
            .rows_per_op
            .entry(row.query.op.name().to_string())
            .or_default() += 1;
    }
    meta.save(out)?;
    report.meta = Some(meta);
    Ok(report)
}

/// Picks the system sub-directory of a multi-system release.
fn system_dir(source: &Path, marker: &str, system: Option<&str>) -> Result<std::path::PathBuf> {
    if source.join(marker).exists() && system.is_none() {
        return Ok(source.to_path_buf());
    }
    let mut systems: Vec<String> = std::fs::read_dir(source)
        .map_err(|e| Error::io(source, e))?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join(marker).exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    systems.sort();
    match system {
        Some(s) if systems.iter().any(|x| x == s) => Ok(source.join(s)),
        Some(s) => Err(Error::Invalid(format!(
            "{}: no system '{s}' here (found: {})",
            source.display(),
            systems.join(", ")
        ))),
        None => Err(Error::Invalid(format!(
            "{}: holds several systems; pick one with --system ({})",
            source.display(),
            systems.join(", ")
        ))),
    }
}

/// A source file's records with their 1-based line numbers.
type Records = Vec<(u64, Vec<String>)>;

/// Reads a CSV source file into header and records.
fn read_source_csv(path: &Path) -> Result<(Vec<String>, Records)> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let mut reader = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .from_reader(bytes.as_slice());
    let header: Vec<String> = reader
        .headers()
        .map_err(|e| Error::bad_file(path, e.to_string()))?
        .iter()
        .map(str::to_string)
        .collect();
    let mut rows = Vec::new();
    for rec in reader.records() {
        let rec = rec.map_err(|e| {
            let line = e.position().map(|p| p.line()).unwrap_or(0);
            Error::bad_row(path, line, format!("malformed CSV row: {e}"))
        })?;
        let line = rec.position().map(|p| p.line()).unwrap_or(0);
        rows.push((line, rec.iter().map(str::to_string).collect()));
    }
    Ok((header, rows))
}

/// Column lookup that names the file and the missing column.
struct Columns<'a> {
    path: &'a Path,
    header: &'a [String],
}

impl<'a> Columns<'a> {
    fn index(&self, name: &str) -> Result<usize> {
        self.header.iter().position(|h| h == name).ok_or_else(|| {
            Error::bad_file(
                self.path,
                format!("missing column '{name}' (found: {})", self.header.join(",")),
            )
        })
    }
}

/// A positive number from a source cell.
fn number(path: &Path, line: u64, col: &str, text: &str) -> Result<f64> {
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(Error::bad_row(
            path,
            line,
            format!("{col} = '{text}' must be a positive number"),
        )),
    }
}

/// The largest integer a source cell may hold. No size, count or message of these releases comes
/// near it (aiconfigurator's largest message is 2^29 elements), and the product of two cells
/// stays far inside `u64`; wider products go through `product`.
const MAX_CELL: u64 = 1 << 31;

/// A positive integer of at most `MAX_CELL` (integral floats such as "4096.0" are fine).
fn integer(path: &Path, line: u64, col: &str, text: &str) -> Result<u64> {
    let v = number(path, line, col, text)?;
    if v.fract() != 0.0 || v > MAX_CELL as f64 {
        return Err(Error::bad_row(
            path,
            line,
            format!("{col} = '{text}' must be an integer from 1 to {MAX_CELL}"),
        ));
    }
    Ok(v as u64)
}

/// A measured time from a cell in units of `unit_us` µs (1000 for milliseconds), in µs: within
/// the range any kernel or collective takes (`limits::MIN_TIME_US`..=`MAX_TIME_US`).
fn time_us(path: &Path, line: u64, col: &str, text: &str, unit_us: f64) -> Result<f64> {
    use crate::limits::{MAX_TIME_US, MIN_TIME_US};
    let t = number(path, line, col, text)? * unit_us;
    if !(MIN_TIME_US..=MAX_TIME_US).contains(&t) {
        return Err(Error::bad_row(
            path,
            line,
            format!(
                "{col} = '{text}' is {t:e} µs: a measured time lies between {MIN_TIME_US} and \
                 {MAX_TIME_US:e} µs"
            ),
        ));
    }
    Ok(t)
}

/// The product of a row's values (a message's bytes over its ranks), refused where it
/// overflows rather than wrapped.
fn product(path: &Path, line: u64, what: &str, factors: &[u64]) -> Result<u64> {
    factors
        .iter()
        .try_fold(1u64, |acc, &f| acc.checked_mul(f))
        .ok_or_else(|| Error::bad_row(path, line, format!("{what} is beyond any real operator")))
}

/// A shape built from a row, each dimension within its physical limit (`Shape::validate`).
fn checked(path: &Path, line: u64, shape: crate::ops::Shape) -> Result<crate::ops::Shape> {
    shape
        .validate()
        .map_err(|m| Error::bad_row(path, line, m))?;
    Ok(shape)
}

fn measured(query: crate::ops::OpQuery, time_us: f64) -> Measurement {
    Measurement {
        query,
        context: Default::default(),
        time_us,
        samples_us: Vec::new(),
        status: super::Status::Ok,
        throttled: false,
        note: String::new(),
    }
}

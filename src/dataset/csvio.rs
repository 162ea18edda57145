//! Reading and appending measurement CSV files.
//!
//! Columns: `op, role, dtype, phase`, the shape columns of the operator's family, the layer
//! context `ctx_batch, ctx_seq, ctx_hidden, ctx_heads, ctx_tp`, then `time_us, n_samples,
//! samples_us, status, throttled, note`. Columns are found by name, so their order is free.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};

use super::{LayerContext, Measurement, Status};
use crate::error::{Error, Result};
use crate::ops::{Dtype, OpKind, OpQuery, Phase, Role, Shape, ShapeFamily};

/// Columns every file has besides the family's shape columns.
pub const CSV_FIXED_COLUMNS: &[&str] = &["op", "dtype", "phase", "time_us"];
const CONTEXT_COLUMNS: [&str; 5] = ["ctx_batch", "ctx_seq", "ctx_hidden", "ctx_heads", "ctx_tp"];

fn header(family: ShapeFamily) -> Vec<&'static str> {
    let mut h = vec!["op", "role", "dtype", "phase"];
    h.extend_from_slice(family.columns());
    h.extend_from_slice(&CONTEXT_COLUMNS);
    h.extend_from_slice(&[
        "time_us",
        "n_samples",
        "samples_us",
        "status",
        "throttled",
        "note",
    ]);
    h
}

/// Parses one CSV file (its bytes already read) into measurements.
pub fn read_csv(path: &Path, bytes: &[u8]) -> Result<Vec<Measurement>> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .trim(csv::Trim::All)
        .from_reader(bytes);
    let headers = reader
        .headers()
        .map_err(|e| Error::bad_file(path, format!("cannot read the header row: {e}")))?
        .clone();
    let index: HashMap<&str, usize> = headers.iter().enumerate().map(|(i, h)| (h, i)).collect();
    for col in CSV_FIXED_COLUMNS {
        if !index.contains_key(col) {
            return Err(Error::bad_file(
                path,
                format!(
                    "missing column '{col}' (found: {}; a measurement file needs {} and the \
                     shape columns of its operator)",
                    headers.iter().collect::<Vec<_>>().join(","),
                    CSV_FIXED_COLUMNS.join(", ")
                ),
            ));
        }
    }

    let mut rows = Vec::new();
    let mut family: Option<ShapeFamily> = None;
    for result in reader.records() {
        let record = result.map_err(|e| {
            let line = e.position().map(|p| p.line()).unwrap_or(0);
            Error::bad_row(path, line, format!("malformed CSV row: {}", e.kind_text()))
        })?;
        let line = record.position().map(|p| p.line()).unwrap_or(0);
        let row = parse_row(&record, &index, &mut family)
            .map_err(|message| Error::bad_row(path, line, message))?;
        rows.push(row);
    }
    Ok(rows)
}

trait KindText {
    fn kind_text(&self) -> String;
}

impl KindText for csv::Error {
    fn kind_text(&self) -> String {
        match self.kind() {
            csv::ErrorKind::UnequalLengths {
                expected_len, len, ..
            } => format!(
                "{len} fields where the header has {expected_len} (truncated or extra values?)"
            ),
            csv::ErrorKind::Utf8 { .. } => "not valid UTF-8".to_string(),
            _ => self.to_string(),
        }
    }
}

fn parse_row(
    record: &csv::StringRecord,
    index: &HashMap<&str, usize>,
    family: &mut Option<ShapeFamily>,
) -> std::result::Result<Measurement, String> {
    let get = |name: &str| index.get(name).and_then(|&i| record.get(i)).unwrap_or("");
    let op: OpKind = get("op").parse()?;
    let fam = op.family();
    match family {
        None => {
            for col in fam.columns() {
                if !index.contains_key(col) {
                    return Err(format!(
                        "operator {op} needs shape column '{col}' (its columns: {})",
                        fam.columns().join(", ")
                    ));
                }
            }
            *family = Some(fam);
        }
        Some(f) if *f != fam => {
            return Err(format!(
                "operator {op} does not belong in this file (its rows describe {:?} shapes)",
                f
            ))
        }
        _ => {}
    }
    let dtype: Dtype = get("dtype").parse()?;
    let phase: Phase = get("phase").parse()?;
    if !op.phases().contains(&phase) {
        return Err(format!(
            "phase '{phase}' is not valid for {op} (use {})",
            op.phases()
                .iter()
                .map(|p| p.name())
                .collect::<Vec<_>>()
                .join(" or ")
        ));
    }
    let role = match get("role") {
        "" => None,
        r => Some(r.parse::<Role>()?),
    };
    let mut values = Vec::new();
    for col in fam.columns() {
        values.push(parse_dim(col, get(col))?);
    }
    let shape = Shape::from_values(fam, &values)?;

    let mut context = LayerContext::default();
    for (slot, col) in [
        &mut context.batch,
        &mut context.seq,
        &mut context.hidden,
        &mut context.heads,
        &mut context.tp,
    ]
    .into_iter()
    .zip(CONTEXT_COLUMNS)
    {
        let text = get(col);
        if !text.is_empty() {
            *slot = Some(parse_dim(col, text)?);
        }
    }

    let status = match get("status") {
        "" | "ok" => Status::Ok,
        "skipped" => Status::Skipped,
        s => return Err(format!("status '{s}' must be ok or skipped")),
    };
    let samples_us: Vec<f64> = match get("samples_us") {
        "" => Vec::new(),
        s => s
            .split(';')
            .map(|v| parse_time("samples_us", v))
            .collect::<std::result::Result<_, _>>()?,
    };
    if let Some(n) = index.get("n_samples").and_then(|&i| record.get(i)) {
        if !n.is_empty() && !samples_us.is_empty() {
            let n: usize = n
                .parse()
                .map_err(|_| format!("n_samples '{n}' is not a count"))?;
            if n != samples_us.len() {
                return Err(format!(
                    "n_samples = {n} but samples_us holds {} values",
                    samples_us.len()
                ));
            }
        }
    }
    let time_us = match (&status, get("time_us")) {
        (Status::Skipped, "") => f64::NAN,
        (_, t) => parse_time("time_us", t)?,
    };
    let throttled = match get("throttled") {
        "" | "0" | "false" => false,
        "1" | "true" => true,
        s => return Err(format!("throttled '{s}' must be 0 or 1")),
    };
    Ok(Measurement {
        query: OpQuery {
            op,
            phase,
            dtype,
            role,
            shape,
        },
        context,
        time_us,
        samples_us,
        status,
        throttled,
        note: get("note").to_string(),
    })
}

/// Shape values are positive integers; an integral float ("4096.0", as pandas writes) is fine.
fn parse_dim(col: &str, text: &str) -> std::result::Result<u64, String> {
    if text.is_empty() {
        return Err(format!("{col} is empty"));
    }
    if let Ok(v) = text.parse::<u64>() {
        return Ok(v);
    }
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v < 9.0e15 => Ok(v as u64),
        _ => Err(format!("{col} = '{text}' is not a non-negative integer")),
    }
}

fn parse_time(col: &str, text: &str) -> std::result::Result<f64, String> {
    let v: f64 = text
        .parse()
        .map_err(|_| format!("{col} = '{text}' is not a number"))?;
    if !(crate::limits::MIN_TIME_US..=crate::limits::MAX_TIME_US).contains(&v) {
        return Err(format!(
            "{col} = {text}: a kernel or collective takes between {} and {} microseconds; \
             check the unit (times are in µs)",
            crate::limits::MIN_TIME_US,
            crate::limits::MAX_TIME_US
        ));
    }
    Ok(v)
}

fn format_row(m: &Measurement) -> Vec<String> {
    let q = &m.query;
    let opt = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_default();
    let mut row = vec![
        q.op.name().to_string(),
        q.role.map(|r| r.name().to_string()).unwrap_or_default(),
        q.dtype.name().to_string(),
        q.phase.name().to_string(),
    ];
    row.extend(q.shape.values().iter().map(u64::to_string));
    let c = &m.context;
    row.extend([c.batch, c.seq, c.hidden, c.heads, c.tp].map(opt));
    row.push(if m.time_us.is_finite() {
        format!("{}", m.time_us)
    } else {
        String::new()
    });
    row.push(m.samples_us.len().to_string());
    row.push(
        m.samples_us
            .iter()
            .map(|s| format!("{s}"))
            .collect::<Vec<_>>()
            .join(";"),
    );
    row.push(
        match m.status {
            Status::Ok => "ok",
            Status::Skipped => "skipped",
        }
        .to_string(),
    );
    row.push((m.throttled as u8).to_string());
    row.push(m.note.clone());
    row
}

/// Appends measurements to the per-operator CSV files of a dataset directory, one row at a time
/// and flushed at once, so an interrupted collection loses at most the row being measured.
pub struct MeasurementWriter {
    dir: PathBuf,
    files: HashMap<OpKind, csv::Writer<File>>,
}

impl MeasurementWriter {
    pub fn new(dir: &Path) -> Result<Self> {
        fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        Ok(MeasurementWriter {
            dir: dir.to_path_buf(),
            files: HashMap::new(),
        })
    }

    pub fn path_for(dir: &Path, op: OpKind) -> PathBuf {
        dir.join(format!("{}.csv", op.name()))
    }

    pub fn append(&mut self, m: &Measurement) -> Result<()> {
        let op = m.query.op;
        let path = Self::path_for(&self.dir, op);
        let writer = match self.files.entry(op) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(slot) => {
                let file = OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .map_err(|e| Error::io(&path, e))?;
                let empty = file.metadata().map_err(|e| Error::io(&path, e))?.len() == 0;
                let mut writer = csv::WriterBuilder::new().from_writer(file);
                if empty {
                    writer
                        .write_record(header(op.family()))
                        .map_err(|e| Error::bad_file(&path, e.to_string()))?;
                }
                slot.insert(writer)
            }
        };
        writer
            .write_record(format_row(m))
            .map_err(|e| Error::bad_file(&path, e.to_string()))?;
        // csv's flush also flushes the file, so the row is with the OS before we return
        writer.flush().map_err(|e| Error::io(&path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{GemmShape, TokenShape};

    fn gemm_row(m: u64, t: f64) -> Measurement {
        Measurement {
            query: OpQuery {
                op: OpKind::Gemm,
                phase: Phase::Fwd,
                dtype: Dtype::Bf16,
                role: Some(Role::Qkv),
                shape: Shape::Gemm(GemmShape {
                    m,
                    n: 128,
                    k: 256,
                    batch: 1,
                }),
            },
            context: LayerContext {
                batch: Some(2),
                seq: Some(m / 2),
                ..Default::default()
            },
            time_us: t,
            samples_us: vec![t, t * 1.1],
            status: Status::Ok,
            throttled: false,
            note: String::new(),
        }
    }

    #[test]
    fn append_then_read_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = MeasurementWriter::new(dir.path()).unwrap();
        let rows = [gemm_row(64, 10.5), gemm_row(128, 20.25)];
        for r in &rows {
            w.append(r).unwrap();
        }
        let skipped = Measurement {
            query: OpQuery {
                op: OpKind::RmsNorm,
                phase: Phase::Bwd,
                dtype: Dtype::Fp16,
                role: None,
                shape: Shape::Tokens(TokenShape {
                    batch: 1,
                    seq: 8,
                    width: 64,
                }),
            },
            context: LayerContext::default(),
            time_us: f64::NAN,
            samples_us: vec![],
            status: Status::Skipped,
            throttled: false,
            note: "out of memory, with, commas".into(),
        };
        w.append(&skipped).unwrap();
        drop(w);
        let path = MeasurementWriter::path_for(dir.path(), OpKind::Gemm);
        let back = read_csv(&path, &fs::read(&path).unwrap()).unwrap();
        assert_eq!(back, rows);
        let path = MeasurementWriter::path_for(dir.path(), OpKind::RmsNorm);
        let back = read_csv(&path, &fs::read(&path).unwrap()).unwrap();
        assert_eq!(back[0].status, Status::Skipped);
        assert_eq!(back[0].note, skipped.note);
    }

    fn read_err(text: &str) -> String {
        read_csv(Path::new("x.csv"), text.as_bytes())
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn malformed_rows_name_file_and_line() {
        let head = "op,dtype,phase,m,n,k,batch,time_us\n";
        let e = read_err(&format!("{head}gemm,fp16,fwd,1,2,3,1,NaN\n"));
        assert!(
            e.starts_with("x.csv:2:") && e.contains("time_us = NaN") && e.contains("µs"),
            "{e}"
        );
        let e = read_err(&format!(
            "{head}gemm,fp16,fwd,1,2,3,1,5\ngemm,fp16,fwd,1,2,3,1,-4\n"
        ));
        assert!(e.starts_with("x.csv:3:"), "{e}");
        let e = read_err(&format!("{head}gemm,fp16,fwd,1,2,3,1,0\n"));
        assert!(e.contains("time_us = 0") && e.contains("0.001"), "{e}");
        let e = read_err(&format!("{head}gemm,fp16,fwd,1,2\n"));
        assert!(e.starts_with("x.csv:2:") && e.contains("truncated"), "{e}");
        let e = read_err(&format!("{head}gemm,fp16,sideways,1,2,3,1,5\n"));
        assert!(e.contains("unknown phase"), "{e}");
        let e = read_err(&format!(
            "{head}gemm,fp16,fwd,18446744073709551615,2,3,1,5\n"
        ));
        assert!(
            e.contains("m = 18446744073709551615") && e.contains("at most"),
            "{e}"
        );
        let e = read_err(&format!("{head}gemm,fp16,fwd,1,2,3,1,1e300\n"));
        assert!(e.contains("time_us = 1e300"), "{e}");
        let e = read_err(&format!("{head}rmsnorm,fp16,fwd,1,2,3,1,5\n"));
        assert!(e.contains("needs shape column 'seq'"), "{e}");
        let e = read_err("op,dtype,phase,m\n");
        assert!(e.contains("missing column 'time_us'"), "{e}");
        let e = read_err(&format!("{head}gemm,fp16,fwd,1.5,2,3,1,5\n"));
        assert!(e.contains("m = '1.5'"), "{e}");
    }

    /// The columns beside the shape and the time: each bad value refused with its line, what
    /// it is and what it may be.
    #[test]
    fn malformed_status_samples_and_flags_are_refused_with_their_value() {
        let head = "op,dtype,phase,m,n,k,batch,time_us,n_samples,samples_us,status,throttled\n";
        for (row, says) in [
            (
                "gemm,fp16,fwd,1,2,3,1,5,,,done,",
                "status 'done' must be ok or skipped",
            ),
            (
                "gemm,fp16,fwd,1,2,3,1,5,3,4;5,,",
                "n_samples = 3 but samples_us holds 2 values",
            ),
            (
                "gemm,fp16,fwd,1,2,3,1,5,two,4;5,,",
                "n_samples 'two' is not a count",
            ),
            ("gemm,fp16,fwd,1,2,3,1,5,,4;-5,,", "samples_us = -5"),
            (
                "gemm,fp16,fwd,1,2,3,1,5,,,,maybe",
                "throttled 'maybe' must be 0 or 1",
            ),
            ("gemm,fp16,fwd,1,2,3,1,,,,,", "time_us"),
            (
                "gemm,fp16,none,1,2,3,1,5,,,,",
                "phase 'none' is not valid for gemm (use fwd or bwd)",
            ),
            ("gemm,fp8e5,fwd,1,2,3,1,5,,,,", "fp8e5"),
            (
                "gemm,fp16,fwd,1,2,3,1,5,,,,\nall_reduce,fp16,none,1,2,3,1,5,,,,",
                "operator all_reduce does not belong in this file",
            ),
        ] {
            let e = read_err(&format!("{head}{row}\n"));
            assert!(e.starts_with("x.csv:") && e.contains(says), "{row}: {e}");
        }
        let mut bytes = format!("{head}gemm,fp16,fwd,1,2,3,1,5,,,,\n").into_bytes();
        bytes[head.len() + "gemm,fp16,fwd,".len()] = 0xff;
        let e = read_csv(Path::new("x.csv"), &bytes)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("x.csv:2") && e.contains("not valid UTF-8"),
            "{e}"
        );
        // what is well formed: a skipped row without a time, samples counted, a throttled flag,
        // a count of samples not kept (a published summary's)
        let rows = read_csv(
            Path::new("x.csv"),
            format!(
                "{head}gemm,fp16,fwd,1,2,3,1,,,,skipped,\ngemm,fp16,bwd,1,2,3,1,5,2,4;6,ok,true\n\
                 gemm,fp16,bwd,1,2,3,2,5,10,,ok,\n"
            )
            .as_bytes(),
        )
        .unwrap();
        assert!(rows[0].status == Status::Skipped && rows[0].time_us.is_nan());
        assert_eq!(rows[1].samples_us, [4.0, 6.0]);
        assert!(rows[1].throttled && rows[1].status == Status::Ok);
        assert!(rows[2].samples_us.is_empty() && rows[2].time_us == 5.0);
    }

    #[test]
    fn integral_floats_are_accepted_as_dims() {
        let rows = read_csv(
            Path::new("x.csv"),
            b"op,dtype,phase,m,n,k,batch,time_us\ngemm,fp16,bwd,4096.0,2,3,1,5\n",
        )
        .unwrap();
        assert_eq!(rows[0].query.shape.gemm().unwrap().m, 4096);
    }
}

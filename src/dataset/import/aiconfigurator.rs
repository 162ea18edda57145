//! Importer for NVIDIA aiconfigurator's measured perf database (github.com/ai-dynamo/
//! aiconfigurator, Apache-2.0), as CSV: `gemm/<sys>_gemm_<framework>.csv` (bf16 and fp8 GEMMs,
//! Y[m,n] = X[m,k]·W[n,k]ᵀ), `context_attention/<sys>_context_attention_bf16_<framework>.csv`
//! (causal prefill attention, forward only), `nccl/<sys>_nccl-<version>.csv` (nccl-tests on one
//! node) and `systems/<sys>.yaml` (the node's link bandwidths). Latencies are milliseconds.
//! Everything here is forward-only inference data: it trains forward models and collectives.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{integer, measured, number, read_source_csv, Columns, ImportOptions};
use crate::dataset::{DatasetMeta, Measurement, Provenance, SoftwareStamp};
use crate::error::{Error, Result};
use crate::hardware::{GpuSpec, InterNodeTier, IntraNodeTier, NetworkSpec};
use crate::ops::{
    AttentionShape, CollectiveShape, Dtype, GemmShape, OpKind, OpQuery, Phase, Shape,
};

type LeftOut = Vec<(String, usize, String)>;

#[derive(Deserialize)]
struct SystemYaml {
    node: NodeYaml,
}

#[derive(Deserialize)]
struct NodeYaml {
    num_gpus_per_node: u32,
    /// Byte/s per GPU, one direction.
    inter_node_bw: f64,
    /// Byte/s per GPU, one direction.
    intra_node_bw: f64,
    /// Seconds.
    p2p_latency: f64,
}

pub(super) fn read(
    source: &Path,
    options: &ImportOptions,
) -> Result<(DatasetMeta, Vec<Measurement>, LeftOut)> {
    let systems_dir = source.join("systems");
    let mut systems: Vec<String> = list(&systems_dir, "yaml")?
        .iter()
        .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .collect();
    systems.sort();
    let system = match options.system.as_deref() {
        Some(s) if systems.iter().any(|x| x == s) => s.to_string(),
        Some(s) => {
            return Err(Error::Invalid(format!(
                "{}: no system '{s}' (found: {})",
                source.display(),
                systems.join(", ")
            )))
        }
        None => {
            return Err(Error::Invalid(format!(
                "{}: pick the GPU with --system ({})",
                source.display(),
                systems.join(", ")
            )))
        }
    };
    let gpu = GpuSpec::builtin(&system).ok_or_else(|| {
        Error::Invalid(format!(
            "system '{system}' has no GPU in stepcast's catalogue (known: a100_sxm, h100_sxm, h200_sxm)"
        ))
    })?;
    let yaml_path = systems_dir.join(format!("{system}.yaml"));
    let node: SystemYaml = crate::fsutil::read_yaml(&yaml_path)?;
    let node = node.node;
    let network = NetworkSpec {
        intra_node: IntraNodeTier {
            technology: "NVLink + NVSwitch".to_string(),
            bandwidth_gb_per_s: node.intra_node_bw / 1e9,
            latency_us: node.p2p_latency * 1e6,
        },
        inter_node: InterNodeTier {
            technology: "InfiniBand".to_string(),
            nics_per_node: node.num_gpus_per_node,
            bandwidth_gbit_per_s_per_nic: node.inter_node_bw * 8.0 / 1e9,
            latency_us: node.p2p_latency * 1e6,
            topology: "rail-optimized fat-tree".to_string(),
        },
    };

    let mut rows = Vec::new();
    let mut left_out = Vec::new();
    let mut framework = None;
    for path in files_of(&source.join("gemm"), &system)? {
        framework = framework.or_else(|| framework_of(&path));
        let mut gemms = read_gemm(&path)?;
        strip_fp8_input_quantization(&mut gemms);
        rows.extend(gemms);
    }
    for path in files_of(&source.join("context_attention"), &system)? {
        let (r, skipped) = read_attention(&path)?;
        rows.extend(r);
        if skipped > 0 {
            left_out.push((
                file_name(&path),
                skipped,
                "sliding-window attention (window_size > 0) has no stepcast shape".to_string(),
            ));
        }
    }
    let nccl_files = files_of(&source.join("nccl"), &system)?;
    let nccl_version = pick_nccl(&nccl_files, options.nccl_version.as_deref())?;
    for path in &nccl_files {
        let version = nccl_version_of(path);
        if Some(&version) != nccl_version.as_ref() {
            let (_, records) = read_source_csv(path)?;
            left_out.push((
                file_name(path),
                records.len(),
                format!(
                    "NCCL {version}: a dataset has one software stamp; imported {} (choose with --nccl-version)",
                    nccl_version.clone().unwrap_or_default()
                ),
            ));
            continue;
        }
        let (r, skipped) = read_nccl(path)?;
        rows.extend(r);
        if skipped > 0 {
            left_out.push((
                file_name(path),
                skipped,
                "int8 collectives (stepcast models fp16/bf16/fp8 traffic by bytes)".to_string(),
            ));
        }
    }

    let meta = DatasetMeta {
        schema_version: crate::dataset::DATASET_SCHEMA_VERSION,
        name: format!("{system}-aiconfigurator"),
        collected_at: "2026-08-21".to_string(),
        gpu,
        gpus_per_node: Some(node.num_gpus_per_node),
        network: Some(network),
        software: SoftwareStamp {
            framework: framework.clone(),
            nccl: nccl_version,
            attention_backend: Some(format!(
                "{} context attention (causal prefill)",
                framework.unwrap_or_else(|| "TensorRT-LLM".to_string())
            )),
            ..Default::default()
        },
        source: Provenance {
            description: format!(
                "NVIDIA aiconfigurator perf database, {system}: forward GEMM (fp8 without \
                 TensorRT-LLM's input quantization), prefill attention and single-node nccl-tests \
                 latencies"
            ),
            repository: Some("https://github.com/ai-dynamo/aiconfigurator".to_string()),
            commit: Some("095f58a51c4ca8e61b66ec108d86f223f8d559ce".to_string()),
            path: Some(format!(
                "aic-core/src/aiconfigurator_core/systems/data/{system}"
            )),
            license: Some("Apache-2.0".to_string()),
        },
        collector: None,
        protocol: None,
        reference_errors: Vec::new(),
    };
    Ok((meta, rows, left_out))
}

fn list(dir: &Path, ext: &str) -> Result<Vec<PathBuf>> {
    if !dir.is_dir() {
        return Err(Error::bad_file(
            dir,
            "missing: an aiconfigurator export has gemm/, context_attention/, nccl/ and systems/",
        ));
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    files.sort();
    Ok(files)
}

fn files_of(dir: &Path, system: &str) -> Result<Vec<PathBuf>> {
    Ok(list(dir, "csv")?
        .into_iter()
        .filter(|p| file_name(p).starts_with(&format!("{system}_")))
        .collect())
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// "TensorRT-LLM 1.3.0rc20" from "h100_sxm_gemm_trtllm-1.3.0rc20.csv".
fn framework_of(path: &Path) -> Option<String> {
    let stem = path.file_stem()?.to_string_lossy().into_owned();
    let version = stem.rsplit("trtllm-").next()?;
    (stem.contains("trtllm-")).then(|| format!("TensorRT-LLM {version}"))
}

fn nccl_version_of(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .and_then(|s| s.rsplit("nccl-").next().map(str::to_string))
        .unwrap_or_default()
}

fn version_key(v: &str) -> Vec<u64> {
    v.split('.').map(|p| p.parse().unwrap_or(0)).collect()
}

fn pick_nccl(files: &[PathBuf], wanted: Option<&str>) -> Result<Option<String>> {
    let mut versions: Vec<String> = files.iter().map(|p| nccl_version_of(p)).collect();
    versions.sort_by_key(|v| version_key(v));
    match wanted {
        None => Ok(versions.last().cloned()),
        Some(w) if versions.iter().any(|v| v == w) => Ok(Some(w.to_string())),
        Some(w) => Err(Error::Invalid(format!(
            "no NCCL {w} table for this system (found: {})",
            versions.join(", ")
        ))),
    }
}

fn read_gemm(path: &Path) -> Result<Vec<Measurement>> {
    let (header, records) = read_source_csv(path)?;
    let c = Columns {
        path,
        header: &header,
    };
    let (id, im, i_n, ik, il) = (
        c.index("gemm_dtype")?,
        c.index("m")?,
        c.index("n")?,
        c.index("k")?,
        c.index("latency_ms")?,
    );
    let mut out = Vec::new();
    for (line, rec) in &records {
        let cell = |i: usize| rec.get(i).map(String::as_str).unwrap_or("");
        let dtype = match cell(id) {
            "bfloat16" => Dtype::Bf16,
            "fp8" => Dtype::Fp8,
            "float16" => Dtype::Fp16,
            other => {
                return Err(Error::bad_row(
                    path,
                    *line,
                    format!("gemm_dtype '{other}' is not bfloat16, float16 or fp8"),
                ))
            }
        };
        let shape = Shape::Gemm(GemmShape {
            m: integer(path, *line, "m", cell(im))?,
            n: integer(path, *line, "n", cell(i_n))?,
            k: integer(path, *line, "k", cell(ik))?,
            batch: 1,
        });
        let time_us = number(path, *line, "latency_ms", cell(il))? * 1000.0;
        out.push(measured(
            OpQuery {
                op: OpKind::Gemm,
                phase: Phase::Fwd,
                dtype,
                role: None,
                shape,
            },
            time_us,
        ));
    }
    Ok(out)
}

/// TensorRT-LLM's fp8 `Linear` quantizes its bf16 input inside the timed call (a dynamic
/// per-tensor scale: an amax pass, then the cast), so an fp8 row is the GEMM plus a pass over
/// X[m,k] that training frameworks fuse into the norm before the GEMM or run as casts of their
/// own (costed in the plan). The pass is read off the data at each (m, k): at the narrowest n
/// the GEMM only streams X, which an fp8 GEMM reads in half the bf16 one's bytes, so the pass
/// is the fp8 row's time less half its bf16 twin's. Every fp8 row of that (m, k) loses it, and
/// none falls below half its bf16 twin (fp8's peak and bytes are twice and half bf16's). The
/// rows keep a note of what was taken off. Returns how many rows changed.
fn strip_fp8_input_quantization(rows: &mut [Measurement]) -> usize {
    use std::collections::HashMap;
    let key = |q: &OpQuery| match q.shape {
        Shape::Gemm(g) => Some((g.m, g.n, g.k)),
        _ => None,
    };
    let bf16: HashMap<(u64, u64, u64), f64> = rows
        .iter()
        .filter(|r| r.query.dtype == Dtype::Bf16)
        .filter_map(|r| key(&r.query).map(|k| (k, r.time_us)))
        .collect();
    // the pass of each (m, k), from its narrowest n with both types
    let mut narrowest: HashMap<(u64, u64), (u64, f64)> = HashMap::new();
    for r in rows.iter().filter(|r| r.query.dtype == Dtype::Fp8) {
        let Some((m, n, k)) = key(&r.query) else {
            continue;
        };
        let Some(twin) = bf16.get(&(m, n, k)) else {
            continue;
        };
        let pass = (r.time_us - twin / 2.0).max(0.0);
        let slot = narrowest.entry((m, k)).or_insert((n, pass));
        if n < slot.0 {
            *slot = (n, pass);
        }
    }
    let mut changed = 0;
    for r in rows.iter_mut().filter(|r| r.query.dtype == Dtype::Fp8) {
        let Some((m, n, k)) = key(&r.query) else {
            continue;
        };
        let (Some(twin), Some(&(_, pass))) = (bf16.get(&(m, n, k)), narrowest.get(&(m, k))) else {
            continue;
        };
        let gemm = (r.time_us - pass).max(twin / 2.0);
        if gemm < r.time_us {
            r.note = format!(
                "input quantization taken off: {:.1} µs measured, {:.1} µs of it the pass over X",
                r.time_us,
                r.time_us - gemm
            );
            r.time_us = gemm;
            changed += 1;
        }
    }
    changed
}

fn read_attention(path: &Path) -> Result<(Vec<Measurement>, usize)> {
    let (header, records) = read_source_csv(path)?;
    let c = Columns {
        path,
        header: &header,
    };
    let idx = [
        c.index("batch_size")?,
        c.index("seq_len")?,
        c.index("num_heads")?,
        c.index("num_key_value_heads")?,
        c.index("head_dim")?,
    ];
    let (iw, il) = (c.index("window_size")?, c.index("latency_ms")?);
    let mut out = Vec::new();
    let mut skipped = 0;
    for (line, rec) in &records {
        let cell = |i: usize| rec.get(i).map(String::as_str).unwrap_or("");
        if cell(iw) != "0" {
            skipped += 1;
            continue;
        }
        let names = [
            "batch_size",
            "seq_len",
            "num_heads",
            "num_key_value_heads",
            "head_dim",
        ];
        let mut v = [0u64; 5];
        for (slot, (i, name)) in v.iter_mut().zip(idx.iter().zip(names)) {
            *slot = integer(path, *line, name, cell(*i))?;
        }
        let shape = Shape::Attention(AttentionShape {
            batch: v[0],
            seq_q: v[1],
            seq_kv: v[1],
            heads: v[2],
            kv_heads: v[3],
            head_dim: v[4],
            causal: true,
        });
        shape
            .validate()
            .map_err(|m| Error::bad_row(path, *line, m))?;
        let time_us = number(path, *line, "latency_ms", cell(il))? * 1000.0;
        out.push(measured(
            OpQuery {
                op: OpKind::FlashAttention,
                phase: Phase::Fwd,
                dtype: Dtype::Bf16,
                role: None,
                shape,
            },
            time_us,
        ));
    }
    Ok((out, skipped))
}

/// nccl-tests rows: `message_elements` × element size is the size argument of the test, which
/// is the convention of `CollectiveShape::bytes`.
fn read_nccl(path: &Path) -> Result<(Vec<Measurement>, usize)> {
    let (header, records) = read_source_csv(path)?;
    let c = Columns {
        path,
        header: &header,
    };
    let (iop, idt, ing, iel, il) = (
        c.index("op_name")?,
        c.index("nccl_dtype")?,
        c.index("num_gpus")?,
        c.index("message_elements")?,
        c.index("latency_ms")?,
    );
    let mut out = Vec::new();
    let mut skipped = 0;
    for (line, rec) in &records {
        let cell = |i: usize| rec.get(i).map(String::as_str).unwrap_or("");
        let op = match cell(iop) {
            "all_reduce" => OpKind::AllReduce,
            "all_gather" => OpKind::AllGather,
            "reduce_scatter" => OpKind::ReduceScatter,
            "alltoall" => OpKind::AllToAll,
            other => {
                return Err(Error::bad_row(
                    path,
                    *line,
                    format!("op_name '{other}' is not a collective stepcast knows"),
                ))
            }
        };
        let element_bytes = match cell(idt) {
            "half" => 2,
            "int8" => {
                skipped += 1;
                continue;
            }
            other => {
                return Err(Error::bad_row(
                    path,
                    *line,
                    format!("nccl_dtype '{other}' is not half or int8"),
                ))
            }
        };
        let gpus = integer(path, *line, "num_gpus", cell(ing))?;
        let elements = integer(path, *line, "message_elements", cell(iel))?;
        let shape = Shape::Collective(CollectiveShape {
            bytes: elements * element_bytes,
            nodes: 1,
            gpus_per_node: gpus,
        });
        shape
            .validate()
            .map_err(|m| Error::bad_row(path, *line, m))?;
        let time_us = number(path, *line, "latency_ms", cell(il))? * 1000.0;
        out.push(measured(
            OpQuery {
                op,
                phase: Phase::None,
                dtype: Dtype::Fp16,
                role: None,
                shape,
            },
            time_us,
        ));
    }
    Ok((out, skipped))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newest_nccl_version_is_picked_numerically() {
        let files: Vec<PathBuf> = [
            "h100_sxm_nccl-2.23.csv",
            "h100_sxm_nccl-2.29.2.csv",
            "h100_sxm_nccl-2.27.3.csv",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        assert_eq!(pick_nccl(&files, None).unwrap().as_deref(), Some("2.29.2"));
        assert!(pick_nccl(&files, Some("2.1")).is_err());
    }

    fn gemm_row(dtype: Dtype, n: u64, time_us: f64) -> Measurement {
        let shape = Shape::Gemm(GemmShape {
            m: 8192,
            n,
            k: 4096,
            batch: 1,
        });
        let query = OpQuery {
            op: OpKind::Gemm,
            phase: Phase::Fwd,
            dtype,
            role: None,
            shape,
        };
        measured(query, time_us)
    }

    /// The pass over X is the narrowest fp8 row less half its bf16 twin; it comes off every
    /// fp8 row of the same (m, k), never below half the bf16 twin, and bf16 rows stay.
    #[test]
    fn the_input_quantization_comes_off_the_fp8_rows() {
        let mut rows = vec![
            gemm_row(Dtype::Bf16, 32, 27.0),
            gemm_row(Dtype::Fp8, 32, 106.0),
            gemm_row(Dtype::Bf16, 4096, 344.0),
            gemm_row(Dtype::Fp8, 4096, 282.0),
            gemm_row(Dtype::Bf16, 64, 28.0),
            gemm_row(Dtype::Fp8, 64, 100.0),
        ];
        assert_eq!(strip_fp8_input_quantization(&mut rows), 3);
        let pass = 106.0 - 27.0 / 2.0;
        assert_eq!(rows[1].time_us, 13.5);
        assert_eq!(rows[3].time_us, 282.0 - pass);
        assert_eq!(rows[5].time_us, 14.0, "floored at half its bf16 twin");
        assert_eq!((rows[0].time_us, rows[2].time_us), (27.0, 344.0));
        assert!(rows[3].note.contains("input quantization taken off"));
    }

    #[test]
    fn framework_from_file_name() {
        assert_eq!(
            framework_of(Path::new("h100_sxm_gemm_trtllm-1.3.0rc20.csv")).as_deref(),
            Some("TensorRT-LLM 1.3.0rc20")
        );
    }
}

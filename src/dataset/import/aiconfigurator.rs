//! Importer for NVIDIA aiconfigurator's measured perf database (github.com/ai-dynamo/
//! aiconfigurator, Apache-2.0), as CSV: `gemm/<sys>_gemm_<framework>.csv` (bf16 and fp8 GEMMs,
//! Y[m,n] = X[m,k]·W[n,k]ᵀ), `context_attention/<sys>_context_attention_bf16_<framework>.csv`
//! (causal prefill attention, forward only), `nccl/<sys>_nccl-<version>.csv` (nccl-tests on one
//! node) and `systems/<sys>.yaml` (the node's link bandwidths). Latencies are milliseconds.
//! Everything here is forward-only inference data: it trains forward models and collectives.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{checked, integer, measured, read_source_csv, time_us, Columns, ImportOptions};
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
        let shape = checked(
            path,
            *line,
            Shape::Gemm(GemmShape {
                m: integer(path, *line, "m", cell(im))?,
                n: integer(path, *line, "n", cell(i_n))?,
                k: integer(path, *line, "k", cell(ik))?,
                batch: 1,
            }),
        )?;
        let time_us = time_us(path, *line, "latency_ms", cell(il), 1000.0)?;
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
    // the pass of each (m, k), from its narrowest n with both types (its first row there)
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
        let shape = checked(
            path,
            *line,
            Shape::Attention(AttentionShape {
                batch: v[0],
                seq_q: v[1],
                seq_kv: v[1],
                heads: v[2],
                kv_heads: v[3],
                head_dim: v[4],
                causal: true,
            }),
        )?;
        let time_us = time_us(path, *line, "latency_ms", cell(il), 1000.0)?;
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
        let shape = checked(
            path,
            *line,
            Shape::Collective(CollectiveShape {
                // at most 2^31 elements (`integer`) of 2 bytes: fits
                bytes: elements * element_bytes,
                nodes: 1,
                gpus_per_node: gpus,
            }),
        )?;
        let time_us = time_us(path, *line, "latency_ms", cell(il), 1000.0)?;
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

    /// A small export in aiconfigurator's layout: the H100 node, three bf16 / fp8 GEMM pairs
    /// (the wider of one (m, k) listed first) and an fp16 GEMM, two attention rows (one
    /// sliding-window), two NCCL versions (the newer with an int8 row), and files of another
    /// system beside them.
    fn export() -> tempfile::TempDir {
        let tmp = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let path = tmp.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        write(
            "systems/h100_sxm.yaml",
            "node:\n  num_gpus_per_node: 8\n  inter_node_bw: 50000000000\n  \
             intra_node_bw: 450000000000\n  p2p_latency: 0.000002\n  pcie_bw: 1\n",
        );
        write("systems/gb200.yaml", "node: {}\n");
        write(
            "gemm/h100_sxm_gemm_trtllm-1.3.0rc20.csv",
            "framework,version,device,op_name,kernel_source,gemm_dtype,m,n,k,latency_ms\n\
             trtllm,1.3,h100,gemm,cublas,bfloat16,16,8192,4096,0.040\n\
             trtllm,1.3,h100,gemm,cublas,fp8,16,8192,4096,0.030\n\
             trtllm,1.3,h100,gemm,cublas,bfloat16,16,1024,4096,0.010\n\
             trtllm,1.3,h100,gemm,cublas,fp8,16,1024,4096,0.009\n\
             trtllm,1.3,h100,gemm,cublas,float16,32.0,64,64,0.0025\n\
             trtllm,1.3,h100,gemm,cublas,bfloat16,64,64,64,0.004\n\
             trtllm,1.3,h100,gemm,cublas,fp8,64,64,64,0.002\n",
        );
        write(
            "gemm/gb200_gemm_trtllm-1.3.0rc20.csv",
            "gemm_dtype,m,n,k,latency_ms\nbogus,1,1,1,1\n",
        );
        write(
            "context_attention/h100_sxm_context_attention_bf16_trtllm-1.3.0rc20.csv",
            "batch_size,seq_len,num_heads,num_key_value_heads,head_dim,window_size,latency_ms\n\
             2,4096,32,8,128,0,1.5\n\
             2,4096,32,8,128,128,0.4\n",
        );
        write(
            "nccl/h100_sxm_nccl-2.23.csv",
            "op_name,nccl_dtype,num_gpus,message_elements,latency_ms\n\
             all_reduce,half,8,1024,0.02\n",
        );
        write(
            "nccl/h100_sxm_nccl-2.27.3.csv",
            "nccl_dtype,num_gpus,message_elements,latency_ms,op_name\n\
             half,8,1048576,0.05,all_reduce\n\
             half,4,65536,0.01,alltoall\n\
             int8,8,1048576,0.03,all_reduce\n",
        );
        tmp
    }

    fn system(name: &str) -> ImportOptions {
        ImportOptions {
            system: Some(name.to_string()),
            nccl_version: None,
        }
    }

    fn query(r: &Measurement) -> (OpKind, Dtype, Shape) {
        (r.query.op, r.query.dtype, r.query.shape)
    }

    /// Every kind of file read into rows in µs, the node's bandwidths into the network, what
    /// was left out said with its count and reason.
    #[test]
    fn an_export_is_read_into_forward_rows_collectives_and_the_node() {
        let src = export();
        let (meta, rows, left_out) = read(src.path(), &system("h100_sxm")).unwrap();
        assert_eq!(meta.name, "h100_sxm-aiconfigurator");
        assert_eq!(meta.gpu, GpuSpec::builtin("h100_sxm").unwrap());
        assert_eq!(meta.gpus_per_node, Some(8));
        let net = meta.network.unwrap();
        assert_eq!(net.intra_node.bandwidth_gb_per_s, 450.0);
        assert!((net.intra_node.latency_us - 2.0).abs() < 1e-9);
        assert_eq!(net.inter_node.bandwidth_gbit_per_s_per_nic, 400.0);
        assert_eq!(net.inter_node.nics_per_node, 8);
        assert!((net.inter_node.latency_us - 2.0).abs() < 1e-9);
        assert_eq!(
            meta.software.framework.as_deref(),
            Some("TensorRT-LLM 1.3.0rc20")
        );
        assert_eq!(meta.software.nccl.as_deref(), Some("2.27.3"));
        assert_eq!(
            meta.software.attention_backend.as_deref(),
            Some("TensorRT-LLM 1.3.0rc20 context attention (causal prefill)")
        );
        assert!(rows.iter().all(|r| r.query.role.is_none()));
        assert!(rows.iter().all(|r| r.query.phase
            == if r.query.op.is_collective() {
                Phase::None
            } else {
                Phase::Fwd
            }));

        let gemm = |dtype, m, n, k| {
            (
                OpKind::Gemm,
                dtype,
                Shape::Gemm(GemmShape { m, n, k, batch: 1 }),
            )
        };
        let times: Vec<_> = rows.iter().map(|r| (query(r), r.time_us)).collect();
        let expected = [
            (gemm(Dtype::Bf16, 16, 8192, 4096), 40.0),
            // fp8: the input's pass at the narrowest n (9 − 10 / 2 = 4 µs, read below) taken off
            (gemm(Dtype::Fp8, 16, 8192, 4096), 26.0),
            (gemm(Dtype::Bf16, 16, 1024, 4096), 10.0),
            (gemm(Dtype::Fp8, 16, 1024, 4096), 5.0),
            (gemm(Dtype::Fp16, 32, 64, 64), 2.5),
            // at half its bf16 twin already: nothing to take off, no note
            (gemm(Dtype::Bf16, 64, 64, 64), 4.0),
            (gemm(Dtype::Fp8, 64, 64, 64), 2.0),
        ];
        for (i, (q, t)) in expected.iter().enumerate() {
            assert_eq!(times[i].0, *q);
            assert!((times[i].1 - t).abs() < 1e-9, "{:?}", times[i]);
        }
        assert!(rows[1].note.contains("taken off"), "{}", rows[1].note);
        assert!(rows[6].note.is_empty(), "{}", rows[6].note);
        let attention = Shape::Attention(AttentionShape {
            batch: 2,
            seq_q: 4096,
            seq_kv: 4096,
            heads: 32,
            kv_heads: 8,
            head_dim: 128,
            causal: true,
        });
        assert_eq!(times[7].0, (OpKind::FlashAttention, Dtype::Bf16, attention));
        assert!((times[7].1 - 1500.0).abs() < 1e-9);
        // the newer NCCL's fp16 rows: a message of elements × 2 bytes on one node
        let collective = |op, bytes, gpus| {
            let shape = Shape::Collective(CollectiveShape {
                bytes,
                nodes: 1,
                gpus_per_node: gpus,
            });
            (op, Dtype::Fp16, shape)
        };
        assert_eq!(times[8].0, collective(OpKind::AllReduce, 2 << 20, 8));
        assert!((times[8].1 - 50.0).abs() < 1e-9);
        assert_eq!(times[9].0, collective(OpKind::AllToAll, 2 << 16, 4));
        assert_eq!(rows.len(), 10);
        let left: Vec<(&str, usize)> = left_out.iter().map(|(f, n, _)| (f.as_str(), *n)).collect();
        assert_eq!(
            left,
            [
                ("h100_sxm_context_attention_bf16_trtllm-1.3.0rc20.csv", 1),
                ("h100_sxm_nccl-2.23.csv", 1),
                ("h100_sxm_nccl-2.27.3.csv", 1),
            ]
        );
        assert!(left_out[0].2.contains("sliding-window"));
        assert!(left_out[1].2.contains("--nccl-version") && left_out[1].2.contains("2.27.3"));
        assert!(left_out[2].2.contains("int8"));

        // the older NCCL table when asked for: the newer one is left out in its place
        let older = ImportOptions {
            nccl_version: Some("2.23".into()),
            ..system("h100_sxm")
        };
        let (meta, rows, left_out) = read(src.path(), &older).unwrap();
        assert_eq!(meta.software.nccl.as_deref(), Some("2.23"));
        assert_eq!(
            query(rows.last().unwrap()),
            collective(OpKind::AllReduce, 2048, 8)
        );
        // the older table has no int8 rows: nothing of it is left out
        let left: Vec<(&str, usize)> = left_out.iter().map(|(f, n, _)| (f.as_str(), *n)).collect();
        assert_eq!(
            left,
            [
                ("h100_sxm_context_attention_bf16_trtllm-1.3.0rc20.csv", 1),
                ("h100_sxm_nccl-2.27.3.csv", 3),
            ]
        );
        // without sliding windows, no attention file is left out
        let attention = "context_attention/h100_sxm_context_attention_bf16_trtllm-1.3.0rc20.csv";
        let text =
            "batch_size,seq_len,num_heads,num_key_value_heads,head_dim,window_size,latency_ms\n\
                    2,4096,32,8,128,0,1.5\n";
        std::fs::write(src.path().join(attention), text).unwrap();
        let (_, _, left_out) = read(src.path(), &older).unwrap();
        assert_eq!(left_out.len(), 1, "{left_out:?}");
    }

    /// Through `import`: a dataset written with its rows per operator.
    #[test]
    fn an_export_imports_as_a_dataset() {
        let src = export();
        let out = src.path().join("out");
        let report = super::super::import(
            super::super::ImportFormat::Aiconfigurator,
            src.path(),
            &out,
            &system("h100_sxm"),
        )
        .unwrap();
        let per_op: Vec<(&str, usize)> = report
            .rows_per_op
            .iter()
            .map(|(k, v)| (k.as_str(), *v))
            .collect();
        assert_eq!(
            per_op,
            [
                ("all_reduce", 1),
                ("all_to_all", 1),
                ("flash_attention", 1),
                ("gemm", 7)
            ]
        );
        // what the report says was left out: sliding windows, the other NCCL version, int8
        assert_eq!(report.left_out.len(), 3, "{:?}", report.left_out);
        assert_eq!(report.meta.unwrap().name, "h100_sxm-aiconfigurator");
        let dataset = crate::dataset::Dataset::load(&out).unwrap();
        assert_eq!(dataset.rows.len(), 10);
        assert_eq!(dataset.meta.name, "h100_sxm-aiconfigurator");
    }

    fn refused(src: &Path, options: &ImportOptions) -> String {
        read(src, options).map(|_| ()).unwrap_err().to_string()
    }

    #[test]
    fn the_system_must_be_named_and_known() {
        let src = export();
        let none = refused(src.path(), &ImportOptions::default());
        assert!(
            none.contains("pick the GPU with --system (gb200, h100_sxm)"),
            "{none}"
        );
        let other = refused(src.path(), &system("b300"));
        assert!(
            other.contains("no system 'b300' (found: gb200, h100_sxm)"),
            "{other}"
        );
        let foreign = refused(src.path(), &system("gb200"));
        assert!(
            foreign.contains("'gb200' has no GPU in stepcast's catalogue"),
            "{foreign}"
        );
        let version = ImportOptions {
            nccl_version: Some("2.1".into()),
            ..system("h100_sxm")
        };
        let v = refused(src.path(), &version);
        assert!(
            v.contains("no NCCL 2.1 table") && v.contains("2.23, 2.27.3"),
            "{v}"
        );
        std::fs::remove_dir_all(src.path().join("context_attention")).unwrap();
        let missing = refused(src.path(), &system("h100_sxm"));
        assert!(
            missing.contains("context_attention") && missing.contains("missing"),
            "{missing}"
        );
    }

    /// A malformed row is refused with its file, line and value; nothing wraps or goes out of
    /// the physical range.
    #[test]
    fn a_bad_row_is_refused_with_its_file_and_line() {
        let gemm = "gemm/h100_sxm_gemm_trtllm-1.3.0rc20.csv";
        let attention = "context_attention/h100_sxm_context_attention_bf16_trtllm-1.3.0rc20.csv";
        let nccl = "nccl/h100_sxm_nccl-2.27.3.csv";
        let cases = [
            (gemm, "gemm_dtype,m,n,k,latency_ms\nint4,16,16,16,0.01\n", "gemm_dtype 'int4'"),
            (gemm, "gemm_dtype,m,n,k,latency_ms\nfp8,16,16.5,16,0.01\n", "n = '16.5'"),
            (gemm, "gemm_dtype,m,n,k,latency_ms\nfp8,4294967296,1,16,0.01\n", "m = '4294967296' must be an integer from 1 to 2147483648"),
            (gemm, "gemm_dtype,m,n,k,latency_ms\nfp8,16,16,16,1e20\n", "latency_ms = '1e20'"),
            (gemm, "gemm_dtype,m,n,k,latency_ms\nfp8,16,16,16,1e-9\n", "latency_ms = '1e-9'"),
            (gemm, "gemm_dtype,m,n,latency_ms\nfp8,16,16,0.01\n", "missing column 'k'"),
            (attention, "batch_size,seq_len,num_heads,num_key_value_heads,head_dim,window_size,latency_ms\n1,128,6,4,64,0,0.1\n", "multiple of kv_heads"),
            (nccl, "op_name,nccl_dtype,num_gpus,message_elements,latency_ms\nbroadcast,half,8,4,0.1\n", "op_name 'broadcast'"),
            (nccl, "op_name,nccl_dtype,num_gpus,message_elements,latency_ms\nall_reduce,float,8,4,0.1\n", "nccl_dtype 'float'"),
            (nccl, "op_name,nccl_dtype,num_gpus,message_elements,latency_ms\nall_reduce,half,1,4,0.1\n", "at least 2 ranks"),
            (nccl, "op_name,nccl_dtype,num_gpus,message_elements,latency_ms\nall_reduce,half,2097152,4,0.1\n", "ranks = 2097152 is beyond any real operator"),
        ];
        for (file, text, says) in cases {
            let src = export();
            std::fs::write(src.path().join(file), text).unwrap();
            let err = refused(src.path(), &system("h100_sxm"));
            let name = Path::new(file).file_name().unwrap().to_string_lossy();
            assert!(err.contains(&*name) && err.contains(says), "{err}");
            if !says.starts_with("missing") {
                assert!(err.contains(&format!("{name}:2")), "{err}");
            }
        }
    }

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
        // a narrowest n measured twice: the first row's pass, as the file lists them
        let mut rows = vec![
            gemm_row(Dtype::Bf16, 32, 27.0),
            gemm_row(Dtype::Fp8, 32, 106.0),
            gemm_row(Dtype::Fp8, 32, 120.0),
            gemm_row(Dtype::Bf16, 4096, 344.0),
            gemm_row(Dtype::Fp8, 4096, 282.0),
        ];
        strip_fp8_input_quantization(&mut rows);
        assert_eq!(rows[4].time_us, 282.0 - pass);
    }

    #[test]
    fn framework_from_file_name() {
        assert_eq!(
            framework_of(Path::new("h100_sxm_gemm_trtllm-1.3.0rc20.csv")).as_deref(),
            Some("TensorRT-LLM 1.3.0rc20")
        );
    }
}

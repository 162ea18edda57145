//! Importer for the paper's own release (Zhang et al., arXiv 2509.22832; github.com/DebarghaG/
//! estimate-train-time, MIT): `<GPU>_<op>_fp16.csv` operator tables with forward (`F_dur(us)`)
//! and backward (`B_dur(us)`) times, `<GPU>_<collective>_fp16_<nodes>_<gpus>.csv` NCCL tables,
//! and `<GPU>.csv` with the authors' chosen regressor and cross-validated error per operator.
//!
//! Shapes follow the release's sampler (tensors [l, b, d], vocabulary 50,257 padded to a
//! multiple of 128·mp); see the table in `ops` for the mapping onto GEMM shapes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::{integer, measured, number, read_source_csv, system_dir, Columns, ImportOptions};
use crate::dataset::{
    DatasetMeta, Measurement, Protocol, Provenance, ReferenceError, SoftwareStamp,
};
use crate::error::{Error, Result};
use crate::hardware::{GpuSpec, InterNodeTier, IntraNodeTier, NetworkSpec};
use crate::ops::{
    AttentionShape, CollectiveShape, Dtype, GemmShape, LookupShape, OpKind, OpQuery,
    OptimizerShape, Phase, Role, Shape, TokenShape,
};

/// GPT-NeoX's GPT-2 vocabulary, as the sampler uses it.
const PAPER_VOCAB: u64 = 50257;

/// Vocabulary on one tensor-parallel rank: padded to a multiple of 128·mp, then split.
pub fn padded_vocab_per_rank(vocab: u64, tp: u64) -> u64 {
    vocab.div_ceil(128 * tp) * 128
}

type LeftOut = Vec<(String, usize, String)>;

pub(super) fn read(
    source: &Path,
    options: &ImportOptions,
) -> Result<(DatasetMeta, Vec<Measurement>, LeftOut)> {
    let dir = system_dir(source, "operator", options.system.as_deref())?;
    let system = dir
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let op_dir = dir.join("operator");
    let nccl_dir = dir.join("nccl");
    let gpu_name = find_gpu_name(&op_dir)?;
    let gpu = GpuSpec::builtin(&gpu_name).ok_or_else(|| {
        Error::Invalid(format!(
            "{}: GPU '{gpu_name}' is not in stepcast's GPU catalogue",
            op_dir.display()
        ))
    })?;

    let mut rows = Vec::new();
    let mut left_out = Vec::new();
    for path in sorted_files(&op_dir)? {
        let Some(label) = label_of(&path, &gpu_name) else {
            continue;
        };
        let label = label.trim_end_matches("_fp16");
        if label.is_empty() {
            continue; // <GPU>.csv: the reference errors, read below
        }
        match paper_op(label) {
            Some(op) => rows.extend(read_operator_file(&path, &op)?),
            None => {
                let (_, records) = read_source_csv(&path)?;
                left_out.push((
                    file_name(&path),
                    records.len(),
                    "older single-table optimizer timings, superseded by the per-stage tables"
                        .to_string(),
                ));
            }
        }
    }
    let mut ranges = HashMap::new();
    if nccl_dir.is_dir() {
        for path in sorted_files(&nccl_dir)? {
            let Some(label) = label_of(&path, &gpu_name) else {
                continue;
            };
            if label.is_empty() {
                continue;
            }
            let parts: Vec<&str> = label.split("_fp16").collect();
            let layout = parts.get(1).copied().unwrap_or("");
            if layout.is_empty() {
                let (_, records) = read_source_csv(&path)?;
                left_out.push((
                    file_name(&path),
                    records.len(),
                    "union of the per-layout files, which are imported instead".to_string(),
                ));
                continue;
            }
            let (file_rows, range) = read_nccl_file(&path, parts[0])?;
            ranges.insert((parts[0].to_string(), range.0, range.1), range.2);
            rows.extend(file_rows);
        }
    }

    let mut reference_errors =
        read_reference_errors(&op_dir.join(format!("{gpu_name}.csv")), &ranges)?;
    let nccl_ref = nccl_dir.join(format!("{gpu_name}.csv"));
    if nccl_ref.is_file() {
        reference_errors.extend(read_reference_errors(&nccl_ref, &ranges)?);
    }

    let (gpus_per_node, network) = system_network(&system);
    let meta = DatasetMeta {
        schema_version: crate::dataset::DATASET_SCHEMA_VERSION,
        name: format!("{}-estimate-train-time", system.to_lowercase()),
        collected_at: "2025-06-20".to_string(),
        gpu,
        gpus_per_node,
        network,
        software: SoftwareStamp {
            framework: Some("GPT-NeoX + DeepSpeed + Megatron-LM kernels".to_string()),
            attention_backend: Some("flash-attn 2 (flash_attn_func, non-causal)".to_string()),
            ..Default::default()
        },
        source: Provenance {
            description: format!(
                "Operator and NCCL timings of Zhang et al., arXiv 2509.22832 (HiPC 2025), \
                 measured on {system} (fp16, microseconds)"
            ),
            repository: Some("https://github.com/DebarghaG/estimate-train-time".to_string()),
            commit: Some("1ac4d5e441169983737f4f5c1c2c3b05b618307d".to_string()),
            path: Some(format!("src/estimate_train_time/data/regressors/{system}")),
            license: Some("MIT".to_string()),
        },
        collector: None,
        protocol: Some(Protocol {
            warmup_runs: 2,
            timed_runs: 10,
            kept_middle: 5,
            timer: "torch.profiler".to_string(),
        }),
        reference_errors,
    };
    Ok((meta, rows, left_out))
}

/// The two systems of the paper (as in hardware-profiles/). Perlmutter: 4 × A100-SXM4 per node,
/// each pair joined by four NVLink-3 links (300 GB/s per GPU and direction, 100 GB/s to one
/// peer), 4 × HPE Slingshot-11 NICs of 200 Gb/s per node on
/// a dragonfly (NERSC Perlmutter architecture docs). Vista: 1 × GH200 per node, one NDR
/// InfiniBand NIC (400 Gb/s) on a fat-tree (TACC Vista user guide); no GPU peers inside a node,
/// so the intra-node tier is the NVLink-C2C link to the Grace CPU (450 GB/s per direction).
fn system_network(system: &str) -> (Option<u32>, Option<NetworkSpec>) {
    match system.to_lowercase().as_str() {
        "perlmutter" => (
            Some(4),
            Some(NetworkSpec {
                intra_node: IntraNodeTier {
                    technology: "NVLink 3 (4 links per GPU pair)".to_string(),
                    bandwidth_gb_per_s: 300.0,
                    latency_us: 3.0,
                },
                inter_node: InterNodeTier {
                    technology: "HPE Slingshot 11".to_string(),
                    nics_per_node: 4,
                    bandwidth_gbit_per_s_per_nic: 200.0,
                    latency_us: 5.0,
                    topology: "dragonfly".to_string(),
                },
            }),
        ),
        "vista" => (
            Some(1),
            Some(NetworkSpec {
                intra_node: IntraNodeTier {
                    technology: "NVLink-C2C (single GPU per node)".to_string(),
                    bandwidth_gb_per_s: 450.0,
                    latency_us: 3.0,
                },
                inter_node: InterNodeTier {
                    technology: "InfiniBand NDR".to_string(),
                    nics_per_node: 1,
                    bandwidth_gbit_per_s_per_nic: 400.0,
                    latency_us: 3.0,
                    topology: "fat-tree".to_string(),
                },
            }),
        ),
        _ => (None, None),
    }
}

fn sorted_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "csv"))
        .collect();
    files.sort();
    Ok(files)
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The GPU prefix of the release's file names, from its reference file `<GPU>.csv`.
fn find_gpu_name(op_dir: &Path) -> Result<String> {
    sorted_files(op_dir)?
        .iter()
        .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .find(|stem| !stem.contains('_'))
        .ok_or_else(|| {
            Error::bad_file(
                op_dir,
                "no <GPU>.csv reference file: is this an estimate-train-time operator directory?",
            )
        })
}

/// "linear1_fp16" out of "<GPU>_linear1_fp16.csv"; "" for "<GPU>.csv".
fn label_of(path: &Path, gpu: &str) -> Option<String> {
    let stem = path.file_stem()?.to_string_lossy().into_owned();
    let rest = stem.strip_prefix(gpu)?;
    Some(rest.trim_start_matches('_').to_string())
}

#[derive(Debug, Clone, Copy)]
enum PaperOp {
    Linear(Role),
    AttnScores,
    AttnContext,
    FlashAttention,
    Softmax(OpKind),
    Norm(OpKind),
    Gelu,
    ResidualAdd,
    Rope,
    Embedding,
    CrossEntropy,
    StageOptimizer(Role),
}

fn paper_op(label: &str) -> Option<PaperOp> {
    Some(match label {
        "linear1" => PaperOp::Linear(Role::Qkv),
        "linear2" => PaperOp::Linear(Role::AttnOut),
        "linear3" => PaperOp::Linear(Role::MlpUp),
        "linear4" => PaperOp::Linear(Role::MlpDown),
        "linear_final" => PaperOp::Linear(Role::LmHead),
        "baddbmm" => PaperOp::AttnScores,
        "bmm" => PaperOp::AttnContext,
        "flash_atten" => PaperOp::FlashAttention,
        "softmax" => PaperOp::Softmax(OpKind::Softmax),
        "ScaledUpperTriangMaskedSoftmax" => PaperOp::Softmax(OpKind::ScaleMaskSoftmax),
        "fillmask" => PaperOp::Softmax(OpKind::FillMask),
        "RMSlayernorm" => PaperOp::Norm(OpKind::RmsNorm),
        "layernorm" => PaperOp::Norm(OpKind::LayerNorm),
        "gelu" => PaperOp::Gelu,
        "res_add" => PaperOp::ResidualAdd,
        "RoPE" => PaperOp::Rope,
        "embedding" => PaperOp::Embedding,
        "parallel_cross_entropy_128" => PaperOp::CrossEntropy,
        "firstStage_optimizer" => PaperOp::StageOptimizer(Role::FirstStage),
        "middleStage_optimizer" => PaperOp::StageOptimizer(Role::MiddleStage),
        "lastStage_optimizer" => PaperOp::StageOptimizer(Role::LastStage),
        _ => return None,
    })
}

/// (op kind, role) of a label used in the reference-error files.
fn kind_of(label: &str) -> Option<(OpKind, Option<Role>)> {
    Some(match paper_op(label)? {
        PaperOp::Linear(role) => (OpKind::Gemm, Some(role)),
        PaperOp::AttnScores => (OpKind::Gemm, Some(Role::AttnScores)),
        PaperOp::AttnContext => (OpKind::Gemm, Some(Role::AttnContext)),
        PaperOp::FlashAttention => (OpKind::FlashAttention, None),
        PaperOp::Softmax(k) | PaperOp::Norm(k) => (k, None),
        PaperOp::Gelu => (OpKind::Gelu, None),
        PaperOp::ResidualAdd => (OpKind::ResidualAdd, None),
        PaperOp::Rope => (OpKind::Rope, None),
        PaperOp::Embedding => (OpKind::Embedding, None),
        PaperOp::CrossEntropy => (OpKind::CrossEntropy, None),
        PaperOp::StageOptimizer(role) => (OpKind::OptimizerStep, Some(role)),
    })
}

/// Parameters of one GPT-NeoX stage as the paper's tool counts them: per layer two norms of
/// 2·d, QKV 3d(d+1)/mp, output d(d+1)/mp, MLP 4d(d+1)/mp and d(4d+1)/mp (12 tensors); the first
/// stage adds the embedding, the last the final norm and the LM head (padded vocabulary · d).
fn stage_parameters(role: Role, tp: u64, dim: u64, layers: u64) -> (u64, u64) {
    let (d, t) = (dim as f64, tp as f64);
    let per_layer = 4.0 * d
        + (3.0 * d * (d + 1.0) + d * (d + 1.0) + 4.0 * d * (d + 1.0) + d * (4.0 * d + 1.0)) / t;
    let vocab_table = (padded_vocab_per_rank(PAPER_VOCAB, tp) * dim) as f64;
    let (extra, extra_tensors) = match role {
        Role::FirstStage => (vocab_table, 1),
        Role::LastStage => (vocab_table + 2.0 * d, 3),
        _ => (0.0, 0),
    };
    (
        (per_layer * layers as f64 + extra).round() as u64,
        12 * layers + extra_tensors,
    )
}

fn read_operator_file(path: &Path, op: &PaperOp) -> Result<Vec<Measurement>> {
    let (header, records) = read_source_csv(path)?;
    let cols = Columns {
        path,
        header: &header,
    };
    let optimizer = matches!(op, PaperOp::StageOptimizer(_));
    let wanted: &[&str] = match op {
        PaperOp::Norm(_) | PaperOp::ResidualAdd => &["b", "l", "dim"],
        PaperOp::Softmax(OpKind::FillMask) => &["mp", "b", "h", "l"],
        PaperOp::Softmax(_) => &["mp", "b", "h", "l"],
        PaperOp::CrossEntropy => &["mp", "b", "l"],
        PaperOp::StageOptimizer(_) => &["mp", "dim", "encoders"],
        PaperOp::FlashAttention | PaperOp::Rope | PaperOp::AttnScores | PaperOp::AttnContext => {
            &["mp", "b", "h", "l", "dim"]
        }
        _ => &["mp", "b", "l", "dim"],
    };
    let idx: Vec<usize> = wanted
        .iter()
        .map(|c| cols.index(c))
        .collect::<Result<_>>()?;
    let time_cols: Vec<(Phase, usize)> = if optimizer {
        vec![(Phase::None, cols.index("dur(us)")?)]
    } else {
        vec![
            (Phase::Fwd, cols.index("F_dur(us)")?),
            (Phase::Bwd, cols.index("B_dur(us)")?),
        ]
    };

    let mut out = Vec::with_capacity(records.len() * time_cols.len());
    for (line, rec) in &records {
        let cell = |i: usize| rec.get(i).map(String::as_str).unwrap_or("");
        let mut v = HashMap::new();
        for (name, &i) in wanted.iter().zip(&idx) {
            v.insert(*name, integer(path, *line, name, cell(i))?);
        }
        let get = |k: &str| v.get(k).copied().unwrap_or(1);
        let (tp, b, l, dim, h) = (get("mp"), get("b"), get("l"), get("dim"), get("h"));
        let div = |a: u64, by: u64, what: &str| -> Result<u64> {
            if by == 0 || !a.is_multiple_of(by) {
                Err(Error::bad_row(
                    path,
                    *line,
                    format!("{what}: {a} is not divisible by {by}"),
                ))
            } else {
                Ok(a / by)
            }
        };
        let gemm = |m, n, k, batch| Shape::Gemm(GemmShape { m, n, k, batch });
        let (kind, role, shape) = match *op {
            PaperOp::Linear(role) => {
                let shape = match role {
                    Role::Qkv => gemm(b * l, div(3 * dim, tp, "3·dim / mp")?, dim, 1),
                    Role::AttnOut => gemm(b * l, dim, div(dim, tp, "dim / mp")?, 1),
                    Role::MlpUp => gemm(b * l, div(4 * dim, tp, "4·dim / mp")?, dim, 1),
                    Role::MlpDown => gemm(b * l, dim, div(4 * dim, tp, "4·dim / mp")?, 1),
                    _ => gemm(b * l, padded_vocab_per_rank(PAPER_VOCAB, tp), dim, 1),
                };
                (OpKind::Gemm, Some(role), shape)
            }
            PaperOp::AttnScores | PaperOp::AttnContext => {
                let heads = div(h, tp, "heads / mp")?;
                let hd = div(dim, h, "dim / heads")?;
                let (role, shape) = if matches!(op, PaperOp::AttnScores) {
                    (Role::AttnScores, gemm(l, l, hd, b * heads))
                } else {
                    (Role::AttnContext, gemm(l, hd, l, b * heads))
                };
                (OpKind::Gemm, Some(role), shape)
            }
            PaperOp::FlashAttention | PaperOp::Softmax(_) => {
                let heads = div(h, tp, "heads / mp")?;
                let (kind, head_dim, causal) = match *op {
                    PaperOp::FlashAttention => {
                        (OpKind::FlashAttention, div(dim, h, "dim / heads")?, false)
                    }
                    PaperOp::Softmax(k) => (k, 1, k == OpKind::ScaleMaskSoftmax),
                    _ => unreachable!(),
                };
                let shape = Shape::Attention(AttentionShape {
                    batch: b,
                    seq_q: l,
                    seq_kv: l,
                    heads,
                    kv_heads: heads,
                    head_dim,
                    causal,
                });
                (kind, None, shape)
            }
            PaperOp::Norm(kind) => (kind, None, tokens(b, l, dim)),
            PaperOp::ResidualAdd => (OpKind::ResidualAdd, None, tokens(b, l, dim)),
            PaperOp::Gelu => (
                OpKind::Gelu,
                None,
                tokens(b, l, div(4 * dim, tp, "4·dim / mp")?),
            ),
            PaperOp::Rope => (OpKind::Rope, None, tokens(b, l, div(dim, tp, "dim / mp")?)),
            PaperOp::CrossEntropy => (
                OpKind::CrossEntropy,
                None,
                tokens(b, l, padded_vocab_per_rank(PAPER_VOCAB, tp)),
            ),
            PaperOp::Embedding => (
                OpKind::Embedding,
                None,
                Shape::Lookup(LookupShape {
                    batch: b,
                    seq: l,
                    hidden: dim,
                    vocab: padded_vocab_per_rank(PAPER_VOCAB, tp),
                }),
            ),
            PaperOp::StageOptimizer(role) => {
                let (params, tensors) = stage_parameters(role, tp, dim, get("encoders"));
                (
                    OpKind::OptimizerStep,
                    Some(role),
                    Shape::Optimizer(OptimizerShape { params, tensors }),
                )
            }
        };
        let context = crate::dataset::LayerContext {
            batch: v.get("b").copied(),
            seq: v.get("l").copied(),
            hidden: v.get("dim").copied(),
            heads: v.get("h").copied(),
            tp: v.get("mp").copied(),
        };
        for &(phase, col) in &time_cols {
            let time = number(path, *line, &header[col], cell(col))?;
            let mut m = measured(
                OpQuery {
                    op: kind,
                    phase,
                    dtype: Dtype::Fp16,
                    role,
                    shape,
                },
                time,
            );
            m.context = context;
            out.push(m);
        }
    }
    Ok(out)
}

fn tokens(batch: u64, seq: u64, width: u64) -> Shape {
    Shape::Tokens(TokenShape { batch, seq, width })
}

type Range = (u64, u64, [u64; 2]);

/// One per-layout NCCL file. `shape` is the fp16 element count each rank passes to
/// torch.distributed: the buffer of an all-reduce, each rank's input of an all-gather (so the
/// gathered output is ranks × that), the message of a send/recv.
fn read_nccl_file(path: &Path, label: &str) -> Result<(Vec<Measurement>, Range)> {
    let op = match label {
        "allreduce" | "allreduce_large" => OpKind::AllReduce,
        "allgather_large" | "allgather" => OpKind::AllGather,
        "p2p" => OpKind::SendRecv,
        other => {
            return Err(Error::bad_file(
                path,
                format!("unknown collective '{other}' (expected allreduce, allgather, p2p)"),
            ))
        }
    };
    let (header, records) = read_source_csv(path)?;
    let cols = Columns {
        path,
        header: &header,
    };
    let (i_shape, i_nodes, i_gpn, i_dur) = (
        cols.index("shape")?,
        cols.index("nodes")?,
        cols.index("GPUsPerNode")?,
        cols.index("dur(us)")?,
    );
    let mut out = Vec::new();
    let (mut lo, mut hi, mut layout) = (u64::MAX, 0, (0, 0));
    for (line, rec) in &records {
        let cell = |i: usize| rec.get(i).map(String::as_str).unwrap_or("");
        let elems = integer(path, *line, "shape", cell(i_shape))?;
        let nodes = integer(path, *line, "nodes", cell(i_nodes))?;
        let gpn = integer(path, *line, "GPUsPerNode", cell(i_gpn))?;
        let time = number(path, *line, "dur(us)", cell(i_dur))?;
        let ranks = nodes * gpn;
        let bytes = match op {
            OpKind::AllGather => 2 * elems * ranks,
            _ => 2 * elems,
        };
        let shape = Shape::Collective(CollectiveShape {
            bytes,
            nodes,
            gpus_per_node: gpn,
        });
        shape
            .validate()
            .map_err(|m| Error::bad_row(path, *line, m))?;
        lo = lo.min(bytes);
        hi = hi.max(bytes);
        layout = (nodes, gpn);
        out.push(measured(
            OpQuery {
                op,
                phase: Phase::None,
                dtype: Dtype::Fp16,
                role: None,
                shape,
            },
            time,
        ));
    }
    Ok((out, (layout.0, layout.1, [lo, hi])))
}

fn read_reference_errors(
    path: &Path,
    ranges: &HashMap<(String, u64, u64), [u64; 2]>,
) -> Result<Vec<ReferenceError>> {
    let (header, records) = read_source_csv(path)?;
    let cols = Columns {
        path,
        header: &header,
    };
    let (i_fn, i_model, i_err) = (
        cols.index("Function")?,
        cols.index("Best_model")?,
        cols.index("Best_error%")?,
    );
    let i_prop = cols.index("Propagation").ok();
    let i_nodes = cols.index("Nodes").ok();
    let i_gpn = cols.index("GPUsPerNode").ok();
    let mut out = Vec::new();
    for (line, rec) in &records {
        let cell = |i: usize| rec.get(i).map(String::as_str).unwrap_or("");
        let label = cell(i_fn).to_string();
        let fraction: f64 = cell(i_err).parse().map_err(|_| {
            Error::bad_row(
                path,
                *line,
                format!("Best_error% = '{}' is not a number", cell(i_err)),
            )
        })?;
        let (op, role, phase, nodes, gpn, bytes_range) = if let Some(i) = i_prop {
            let Some((op, role)) = kind_of(&label) else {
                continue;
            };
            let phase = match cell(i) {
                "fwd" => Phase::Fwd,
                "bwd" => Phase::Bwd,
                _ => Phase::None,
            };
            (op, role, phase, None, None, None)
        } else {
            let op = match label.as_str() {
                "allreduce" | "allreduce_large" => OpKind::AllReduce,
                "p2p" => OpKind::SendRecv,
                _ => OpKind::AllGather,
            };
            let nodes = i_nodes
                .map(|i| integer(path, *line, "Nodes", cell(i)))
                .transpose()
                .unwrap_or(None);
            let gpn = i_gpn
                .map(|i| integer(path, *line, "GPUsPerNode", cell(i)))
                .transpose()
                .unwrap_or(None);
            let range = match (nodes, gpn) {
                (Some(n), Some(g)) => ranges.get(&(label.clone(), n, g)).copied(),
                // 0 × 0 is the authors' model over all layouts: the union of their ranges
                _ => ranges
                    .iter()
                    .filter(|((l, _, _), _)| *l == label)
                    .map(|(_, r)| *r)
                    .reduce(|a, b| [a[0].min(b[0]), a[1].max(b[1])]),
            };
            (op, None, Phase::None, nodes, gpn, range)
        };
        out.push(ReferenceError {
            label,
            op,
            phase,
            role,
            nodes,
            gpus_per_node: gpn,
            bytes_range,
            regressor: cell(i_model).to_string(),
            mape_percent: fraction * 100.0,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vocabulary_padding_matches_the_paper() {
        // Llemma example: mp = 2 -> 25,216 columns per rank (predictions/…_P_predicted.csv)
        assert_eq!(padded_vocab_per_rank(PAPER_VOCAB, 2), 25216);
        assert_eq!(padded_vocab_per_rank(PAPER_VOCAB, 1), 50304);
    }

    #[test]
    fn stage_parameters_match_the_paper_example() {
        // predictions/llemma_7b_4_2_2_P_predicted.csv lists the per-rank parameters of the
        // Llemma-7B stages at pp 4, mp 2 (8, 9, 9, 6 layers): 908,869,632 / 906,283,008 /
        // 707,481,600.
        assert_eq!(
            stage_parameters(Role::FirstStage, 2, 4096, 8).0,
            908_869_632
        );
        assert_eq!(
            stage_parameters(Role::MiddleStage, 2, 4096, 9).0,
            906_283_008
        );
        assert_eq!(stage_parameters(Role::LastStage, 2, 4096, 6).0, 707_481_600);
        assert_eq!(stage_parameters(Role::MiddleStage, 2, 4096, 9).1, 108);
    }
}

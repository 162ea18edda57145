//! Importer for the paper's own release (Zhang et al., arXiv 2509.22832; github.com/DebarghaG/
//! estimate-train-time, MIT): `<GPU>_<op>_fp16.csv` operator tables with forward (`F_dur(us)`)
//! and backward (`B_dur(us)`) times, `<GPU>_<collective>_fp16_<nodes>_<gpus>.csv` NCCL tables,
//! and `<GPU>.csv` with the authors' chosen regressor and cross-validated error per operator.
//!
//! Shapes follow the release's sampler (tensors [l, b, d], vocabulary 50,257 padded to a
//! multiple of 128·mp); see the table in `ops` for the mapping onto GEMM shapes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::{
    checked, integer, measured, product, read_source_csv, system_dir, time_us, Columns,
    ImportOptions,
};
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
        // cells are at most 2^31 (`integer`), so products of two fit in u64; the shape check
        // below bounds each dimension to what a real operator has
        let tokens_in = b * l;
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
                    Role::Qkv => gemm(tokens_in, div(3 * dim, tp, "3·dim / mp")?, dim, 1),
                    Role::AttnOut => gemm(tokens_in, dim, div(dim, tp, "dim / mp")?, 1),
                    Role::MlpUp => gemm(tokens_in, div(4 * dim, tp, "4·dim / mp")?, dim, 1),
                    Role::MlpDown => gemm(tokens_in, dim, div(4 * dim, tp, "4·dim / mp")?, 1),
                    _ => gemm(tokens_in, padded_vocab_per_rank(PAPER_VOCAB, tp), dim, 1),
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
        let shape = checked(path, *line, shape)?;
        for &(phase, col) in &time_cols {
            let time = time_us(path, *line, &header[col], cell(col), 1.0)?;
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
        let time = time_us(path, *line, "dur(us)", cell(i_dur), 1.0)?;
        let bytes = match op {
            OpKind::AllGather => {
                product(path, *line, "the gathered bytes", &[2, elems, nodes, gpn])?
            }
            _ => 2 * elems,
        };
        let shape = checked(
            path,
            *line,
            Shape::Collective(CollectiveShape {
                bytes,
                nodes,
                gpus_per_node: gpn,
            }),
        )?;
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
        // a fraction (0.05 for 5 %) of at most 100 (10,000 %), as the authors' files hold
        let fraction = cell(i_err)
            .parse::<f64>()
            .ok()
            .filter(|f| (0.0..=100.0).contains(f))
            .ok_or_else(|| {
                Error::bad_row(
                    path,
                    *line,
                    format!(
                        "Best_error% = '{}' must be an error fraction from 0 to 100",
                        cell(i_err)
                    ),
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

    const GPU: &str = "NVIDIAA100-SXM4-80GB";

    /// A release of the paper's layout for `system`: every operator table with one row (mp 2,
    /// b 4, l 1024, dim 2048, h 16, 2 encoders; forward 10 µs, backward 20 µs), the older
    /// single-table optimizer, NCCL files of each collective (the all-reduce's on two layouts)
    /// and the all-reduce's union file, and both reference-error files.
    fn release(system: &str) -> tempfile::TempDir {
        let tmp = tempfile::tempdir().unwrap();
        let op = tmp.path().join(system).join("operator");
        let nccl = tmp.path().join(system).join("nccl");
        std::fs::create_dir_all(&op).unwrap();
        std::fs::create_dir_all(&nccl).unwrap();
        let value = |col: &str| match col {
            "mp" => "2.0",
            "b" => "4",
            "l" => "1024",
            "dim" => "2048",
            "h" => "16",
            "encoders" => "2",
            "F_dur(us)" => "10",
            "B_dur(us)" => "20",
            _ => "30", // dur(us)
        };
        let table = |label: &str, cols: &[&str]| {
            let row: Vec<&str> = cols.iter().map(|c| value(c)).collect();
            let text = format!("{}\n{}\n", cols.join(","), row.join(","));
            std::fs::write(op.join(format!("{GPU}_{label}_fp16.csv")), text).unwrap();
        };
        fn timed<'a>(cols: &[&'a str]) -> Vec<&'a str> {
            [cols, &["F_dur(us)", "B_dur(us)"]].concat()
        }
        for label in [
            "linear1",
            "linear2",
            "linear3",
            "linear4",
            "linear_final",
            "gelu",
        ] {
            table(label, &timed(&["mp", "b", "l", "dim"]));
        }
        for label in ["baddbmm", "bmm", "flash_atten", "RoPE"] {
            table(label, &timed(&["mp", "b", "h", "l", "dim"]));
        }
        for label in ["softmax", "ScaledUpperTriangMaskedSoftmax", "fillmask"] {
            table(label, &timed(&["mp", "b", "h", "l"]));
        }
        for label in ["RMSlayernorm", "layernorm", "res_add"] {
            table(label, &timed(&["b", "l", "dim"]));
        }
        table("embedding", &timed(&["mp", "b", "l", "dim"]));
        table("parallel_cross_entropy_128", &timed(&["mp", "b", "l"]));
        for label in [
            "firstStage_optimizer",
            "middleStage_optimizer",
            "lastStage_optimizer",
            "optimizer",
        ] {
            table(label, &["mp", "dim", "encoders", "dur(us)"]);
        }
        std::fs::write(
            op.join(format!("{GPU}.csv")),
            "GPU,Function,Precision,Propagation,Best_model,Best_config,Best_error%\n\
             g,linear1,fp16,fwd,rforest,{},0.056\ng,gelu,fp16,bwd,xgb,{},0.5\n\
             g,optimizer,fp16,,rforest,{},0.1\n",
        )
        .unwrap();
        let collective = |name: &str, text: &str| {
            let text = format!("shape,nodes,GPUsPerNode,dur(us)\n{text}");
            std::fs::write(nccl.join(format!("{GPU}_{name}.csv")), text).unwrap();
        };
        collective("allreduce_fp16_1_4", "1024,1,4,12\n4096,1,4,20\n");
        collective("allreduce_fp16", "1024,1,4,12\n");
        collective("allreduce_fp16_2_4", "65536,2,4,90\n");
        collective("allgather_large_fp16_2_4", "1024,2,4,40\n");
        collective("p2p_fp16_2_1", "512,2,1,8\n");
        std::fs::write(
            nccl.join(format!("{GPU}.csv")),
            "GPU,Function,Precision,Nodes,GPUsPerNode,Best_model,Best_config,Best_error%\n\
             g,allreduce,fp16,1,4,rforest,{},0.25\ng,allreduce,fp16,0,0,rforest,{},0.3\n\
             g,p2p,fp16,2,1,rforest,{},0.2\n",
        )
        .unwrap();
        tmp
    }

    fn refused(src: &Path, options: &ImportOptions) -> String {
        read(src, options).map(|_| ()).unwrap_err().to_string()
    }

    fn perlmutter() -> ImportOptions {
        ImportOptions {
            system: Some("Perlmutter".into()),
            nccl_version: None,
        }
    }

    /// The paper's operators onto stepcast's shapes: its [l, b, d] tensors at mp 2 become the
    /// GEMMs, attention, token and lookup calls Megatron runs (vocabulary 50,257 padded to
    /// 25,216 columns a rank), its per-stage optimizer tables the stage's parameters.
    #[test]
    fn every_paper_operator_maps_onto_its_shape() {
        let src = release("Perlmutter");
        let (meta, rows, left_out) = read(src.path(), &perlmutter()).unwrap();
        let gemm = |m, n, k, batch| Shape::Gemm(GemmShape { m, n, k, batch });
        let attention = |head_dim, causal| {
            Shape::Attention(AttentionShape {
                batch: 4,
                seq_q: 1024,
                seq_kv: 1024,
                heads: 8,
                kv_heads: 8,
                head_dim,
                causal,
            })
        };
        let (first, _) = stage_parameters(Role::FirstStage, 2, 2048, 2);
        let (middle, tensors) = stage_parameters(Role::MiddleStage, 2, 2048, 2);
        let optimizer = |params, tensors| Shape::Optimizer(OptimizerShape { params, tensors });
        let vocab = 25216;
        let expected = [
            (OpKind::Gemm, Some(Role::Qkv), gemm(4096, 3072, 2048, 1)),
            (OpKind::Gemm, Some(Role::AttnOut), gemm(4096, 2048, 1024, 1)),
            (OpKind::Gemm, Some(Role::MlpUp), gemm(4096, 4096, 2048, 1)),
            (OpKind::Gemm, Some(Role::MlpDown), gemm(4096, 2048, 4096, 1)),
            (OpKind::Gemm, Some(Role::LmHead), gemm(4096, vocab, 2048, 1)),
            (OpKind::Gelu, None, tokens(4, 1024, 4096)),
            (
                OpKind::Gemm,
                Some(Role::AttnScores),
                gemm(1024, 1024, 128, 32),
            ),
            (
                OpKind::Gemm,
                Some(Role::AttnContext),
                gemm(1024, 128, 1024, 32),
            ),
            (OpKind::FlashAttention, None, attention(128, false)),
            (OpKind::Rope, None, tokens(4, 1024, 1024)),
            (OpKind::Softmax, None, attention(1, false)),
            (OpKind::ScaleMaskSoftmax, None, attention(1, true)),
            (OpKind::FillMask, None, attention(1, false)),
            (OpKind::RmsNorm, None, tokens(4, 1024, 2048)),
            (OpKind::LayerNorm, None, tokens(4, 1024, 2048)),
            (OpKind::ResidualAdd, None, tokens(4, 1024, 2048)),
            (
                OpKind::Embedding,
                None,
                Shape::Lookup(LookupShape {
                    batch: 4,
                    seq: 1024,
                    hidden: 2048,
                    vocab,
                }),
            ),
            (OpKind::CrossEntropy, None, tokens(4, 1024, vocab)),
        ];
        for (op, role, shape) in expected {
            let of: Vec<&Measurement> = rows
                .iter()
                .filter(|r| (r.query.op, r.query.role, r.query.shape) == (op, role, shape))
                .collect();
            let phases: Vec<(Phase, f64)> = of.iter().map(|r| (r.query.phase, r.time_us)).collect();
            assert_eq!(
                phases,
                [(Phase::Fwd, 10.0), (Phase::Bwd, 20.0)],
                "{op} {role:?} {shape}"
            );
            assert!(of.iter().all(|r| r.query.dtype == Dtype::Fp16));
            let c = of[0].context;
            assert_eq!((c.batch, c.seq), (Some(4), Some(1024)), "{op}");
        }
        let (last, last_tensors) = stage_parameters(Role::LastStage, 2, 2048, 2);
        assert_eq!(last_tensors, tensors + 3);
        for (role, params) in [
            (Role::FirstStage, first),
            (Role::MiddleStage, middle),
            (Role::LastStage, last),
        ] {
            let r = rows.iter().find(|r| r.query.role == Some(role)).unwrap();
            let extra = match role {
                Role::FirstStage => 1,
                Role::LastStage => 3,
                _ => 0,
            };
            assert_eq!(r.query.shape, optimizer(params, tensors + extra));
            assert_eq!((r.query.phase, r.time_us), (Phase::None, 30.0));
        }
        // collectives: 2 bytes an element; an all-gather's the gathered output over its ranks
        let collective = |op, bytes, nodes, gpus_per_node| {
            let shape = Shape::Collective(CollectiveShape {
                bytes,
                nodes,
                gpus_per_node,
            });
            rows.iter()
                .find(|r| r.query.op == op && r.query.shape == shape)
                .map(|r| r.time_us)
        };
        assert_eq!(collective(OpKind::AllReduce, 2048, 1, 4), Some(12.0));
        assert_eq!(collective(OpKind::AllReduce, 8192, 1, 4), Some(20.0));
        assert_eq!(collective(OpKind::AllGather, 2048 * 8, 2, 4), Some(40.0));
        assert_eq!(collective(OpKind::SendRecv, 1024, 2, 1), Some(8.0));
        assert_eq!(rows.len(), 18 * 2 + 3 + 5);
        let left: Vec<(&str, usize)> = left_out.iter().map(|(f, n, _)| (f.as_str(), *n)).collect();
        assert_eq!(
            left,
            [
                ("NVIDIAA100-SXM4-80GB_optimizer_fp16.csv", 1),
                ("NVIDIAA100-SXM4-80GB_allreduce_fp16.csv", 1),
            ]
        );

        // the reference errors: operators by phase, collectives by layout with the byte range
        // their files cover (0 × 0: the authors' model over every layout)
        assert_eq!(meta.name, "perlmutter-estimate-train-time");
        let software = &meta.software;
        assert!(software
            .framework
            .as_deref()
            .unwrap()
            .starts_with("GPT-NeoX"));
        let backend = software.attention_backend.as_deref().unwrap();
        assert!(backend.contains("flash-attn 2") && backend.contains("non-causal"));
        assert_eq!(meta.gpus_per_node, Some(4));
        assert_eq!(meta.network.unwrap().inter_node.topology, "dragonfly");
        let refs: Vec<_> = meta
            .reference_errors
            .iter()
            .map(|e| {
                (
                    e.label.as_str(),
                    e.op,
                    e.phase,
                    e.role,
                    e.nodes,
                    e.bytes_range,
                )
            })
            .collect();
        assert_eq!(
            refs,
            [
                (
                    "linear1",
                    OpKind::Gemm,
                    Phase::Fwd,
                    Some(Role::Qkv),
                    None,
                    None
                ),
                ("gelu", OpKind::Gelu, Phase::Bwd, None, None, None),
                (
                    "allreduce",
                    OpKind::AllReduce,
                    Phase::None,
                    None,
                    Some(1),
                    Some([2048, 8192])
                ),
                // the union of the 1 × 4 and 2 × 4 files' ranges
                (
                    "allreduce",
                    OpKind::AllReduce,
                    Phase::None,
                    None,
                    None,
                    Some([2048, 131072])
                ),
                (
                    "p2p",
                    OpKind::SendRecv,
                    Phase::None,
                    None,
                    Some(2),
                    Some([1024, 1024])
                ),
            ]
        );
        let percent: Vec<f64> = meta
            .reference_errors
            .iter()
            .map(|e| e.mape_percent)
            .collect();
        assert_eq!(percent.len(), 5);
        for (got, want) in percent.iter().zip([5.6, 50.0, 25.0, 30.0, 20.0]) {
            assert!((got - want).abs() < 1e-9, "{percent:?}");
        }
    }

    /// Vista's single GPU a node, and a release root holding both systems.
    #[test]
    fn a_release_root_needs_its_system_named() {
        let src = release("Vista");
        std::fs::create_dir_all(src.path().join("Perlmutter/operator")).unwrap();
        let err = refused(src.path(), &ImportOptions::default());
        assert!(
            err.contains("pick one with --system (Perlmutter, Vista)"),
            "{err}"
        );
        let named = |system: &str| ImportOptions {
            system: Some(system.into()),
            nccl_version: None,
        };
        let err = refused(src.path(), &named("Frontier"));
        assert!(
            err.contains("no system 'Frontier' here (found: Perlmutter, Vista)"),
            "{err}"
        );
        let vista = named("Vista");
        let (meta, _, _) = read(src.path(), &vista).unwrap();
        assert_eq!(meta.name, "vista-estimate-train-time");
        assert_eq!(meta.gpus_per_node, Some(1));
        assert_eq!(
            meta.network
                .unwrap()
                .inter_node
                .bandwidth_gbit_per_s_per_nic,
            400.0
        );
        // the system directory itself needs no --system
        let (meta, _, _) = read(&src.path().join("Vista"), &ImportOptions::default()).unwrap();
        assert_eq!(meta.name, "vista-estimate-train-time");
    }

    /// A malformed table, row or reference is refused with its file (and line); products of
    /// cells and times stay within physical ranges instead of wrapping.
    #[test]
    fn a_bad_release_is_refused_with_its_file_and_line() {
        let op = |name: &str| format!("Perlmutter/operator/{GPU}_{name}_fp16.csv");
        let cases = [
            (
                op("linear2"),
                "mp,b,l,dim,F_dur(us),B_dur(us)\n3,4,1024,2048,1,2\n",
                "dim / mp: 2048 is not divisible by 3",
            ),
            (
                op("bmm"),
                "mp,b,h,l,dim,F_dur(us),B_dur(us)\n2,4,16,1024,2050,1,2\n",
                "dim / heads: 2050 is not divisible by 16",
            ),
            (
                op("linear2"),
                "mp,b,l,dim,F_dur(us),B_dur(us)\n1,2147483648,2147483648,2048,1,2\n",
                "shape field m = 4611686018427387904 is beyond any real operator",
            ),
            (
                op("layernorm"),
                "b,l,dim,F_dur(us),B_dur(us)\n4,1024,2048,1,1e11\n",
                "B_dur(us) = '1e11'",
            ),
            (
                op("layernorm"),
                "b,l,dim,F_dur(us)\n4,1024,2048,1\n",
                "missing column 'B_dur(us)'",
            ),
            (
                format!("Perlmutter/nccl/{GPU}_broadcast_fp16_1_4.csv"),
                "shape,nodes,GPUsPerNode,dur(us)\n1,1,4,1\n",
                "unknown collective 'broadcast'",
            ),
            (
                format!("Perlmutter/nccl/{GPU}_allgather_fp16_2_4.csv"),
                "shape,nodes,GPUsPerNode,dur(us)\n2147483648,1048576,1048576,1\n",
                "the gathered bytes is beyond any real operator",
            ),
            (
                format!("Perlmutter/operator/{GPU}.csv"),
                "Function,Propagation,Best_model,Best_error%\nlinear1,fwd,rforest,-0.5\n",
                "Best_error% = '-0.5'",
            ),
            (
                format!("Perlmutter/operator/{GPU}.csv"),
                "Function,Propagation,Best_model,Best_error%\nlinear1,fwd,rforest,NaN\n",
                "Best_error% = 'NaN'",
            ),
        ];
        for (file, text, says) in cases {
            let src = release("Perlmutter");
            std::fs::write(src.path().join(&file), text).unwrap();
            let err = match read(src.path(), &perlmutter()) {
                Ok(_) => panic!("{file} read: {text}"),
                Err(e) => e.to_string(),
            };
            let name = Path::new(&file)
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned();
            assert!(err.contains(&name) && err.contains(says), "{err}");
        }
        let src = release("Perlmutter");
        std::fs::remove_file(src.path().join(format!("Perlmutter/operator/{GPU}.csv"))).unwrap();
        let err = refused(src.path(), &perlmutter());
        assert!(err.contains("no <GPU>.csv reference file"), "{err}");
        let src = release("Perlmutter");
        let dir = src.path().join("Perlmutter/operator");
        std::fs::rename(dir.join(format!("{GPU}.csv")), dir.join("TPUv9.csv")).unwrap();
        let err = refused(src.path(), &perlmutter());
        assert!(
            err.contains("GPU 'TPUv9' is not in stepcast's GPU catalogue"),
            "{err}"
        );
    }
}

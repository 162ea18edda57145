//! How long one operator query takes on the CPU: `cargo bench --bench predict [models-dir]`.
//! Loads a models directory (default: the shipped models/perlmutter), times model lookup +
//! feature computation + flat-forest prediction for representative queries of each kind, and
//! prints the median over repeated batches. Repeating one query lets the CPU's branch
//! predictor learn its path through every tree, which a prediction's single cold query never
//! has: the tree walk is branchless for that case, so these figures are a warm best case, and
//! whole-process timings (`scripts/bench-speed.sh`) are the ones that judge a change.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Instant;

use stepcast::ops::{
    AttentionShape, CollectiveShape, Dtype, GemmShape, LookupShape, OpKind, OpQuery, Phase, Role,
    Shape, TokenShape,
};
use stepcast::regress::ModelSet;

fn main() {
    let dir = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/perlmutter"));
    let set = match ModelSet::load(&dir) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cannot load {}: {e}", dir.display());
            std::process::exit(2);
        }
    };
    let q = |op, phase, role, shape| OpQuery {
        op,
        phase,
        dtype: Dtype::Fp16,
        role,
        shape,
    };
    let queries = [
        (
            "gemm qkv fwd",
            q(
                OpKind::Gemm,
                Phase::Fwd,
                Some(Role::Qkv),
                Shape::Gemm(GemmShape {
                    m: 16384,
                    n: 6144,
                    k: 4096,
                    batch: 1,
                }),
            ),
        ),
        (
            "gemm (pooled) bwd",
            q(
                OpKind::Gemm,
                Phase::Bwd,
                None,
                Shape::Gemm(GemmShape {
                    m: 16384,
                    n: 11008,
                    k: 4096,
                    batch: 1,
                }),
            ),
        ),
        (
            "flash_attention bwd",
            q(
                OpKind::FlashAttention,
                Phase::Bwd,
                None,
                Shape::Attention(AttentionShape {
                    batch: 4,
                    seq_q: 4096,
                    seq_kv: 4096,
                    heads: 16,
                    kv_heads: 16,
                    head_dim: 128,
                    causal: false,
                }),
            ),
        ),
        (
            "rmsnorm fwd",
            q(
                OpKind::RmsNorm,
                Phase::Fwd,
                None,
                Shape::Tokens(TokenShape {
                    batch: 4,
                    seq: 4096,
                    width: 4096,
                }),
            ),
        ),
        (
            "embedding fwd",
            q(
                OpKind::Embedding,
                Phase::Fwd,
                None,
                Shape::Lookup(LookupShape {
                    batch: 4,
                    seq: 4096,
                    hidden: 4096,
                    vocab: 25216,
                }),
            ),
        ),
        (
            "all_reduce",
            q(
                OpKind::AllReduce,
                Phase::None,
                None,
                Shape::Collective(CollectiveShape {
                    bytes: 134_217_728,
                    nodes: 1,
                    gpus_per_node: 2,
                }),
            ),
        ),
    ];
    println!("models: {}", dir.display());
    println!(
        "{:<22} {:>12} {:>12} {:>8}",
        "query", "median ns", "p90 ns", "trees"
    );
    for (name, query) in &queries {
        let Some((model, _)) = set.lookup(query).unwrap() else {
            println!("{name:<22} (no model)");
            continue;
        };
        const BATCH: usize = 1000;
        let mut per_query = Vec::new();
        for _ in 0..200 {
            let start = Instant::now();
            for _ in 0..BATCH {
                let (m, _) = set.lookup(black_box(query)).unwrap().unwrap();
                black_box(m.predict(black_box(query)));
            }
            per_query.push(start.elapsed().as_nanos() as f64 / BATCH as f64);
        }
        per_query.sort_by(f64::total_cmp);
        println!(
            "{name:<22} {:>12.0} {:>12.0} {:>8}",
            per_query[per_query.len() / 2],
            per_query[per_query.len() * 9 / 10],
            model.forest.tree_count()
        );
    }
}

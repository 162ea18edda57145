//! The prediction golden: ~30 `predict`, `memory` and `search` runs of the real binary over
//! every schedule, recompute mode, ZeRO stage, both rule sets and every shipped cluster file,
//! each reduced to the numbers a user reads (step time, interval, MFU, breakdown, per-stage
//! times, memory per rank, every distinct operator call with its time and source) and compared
//! with `tests/golden/<case>.json`.
//!
//! Numbers must agree to a relative 1e-6 (so a change of summation order passes, a change of
//! what is predicted does not); text and structure must agree exactly. A change that moves a
//! prediction shows here as a list of what moved, by how much.
//!
//! Regenerate after a deliberate change (and say in the commit which predictions moved and why):
//!
//! ```sh
//! STEPCAST_UPDATE_GOLDEN=1 cargo test --test golden
//! ```

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use common::{repo, stderr, stdout, stepcast};

/// Relative tolerance of a golden number.
const RELATIVE_TOLERANCE: f64 = 1e-6;
const REGENERATE: &str = "STEPCAST_UPDATE_GOLDEN=1 cargo test --test golden";

enum Kind {
    Predict,
    Memory,
    Search,
}

struct Case {
    name: &'static str,
    kind: Kind,
    args: &'static str,
}

const fn predict(name: &'static str, args: &'static str) -> Case {
    Case {
        name,
        kind: Kind::Predict,
        args,
    }
}

const CASES: &[Case] = &[
    // the paper's example under its own rules (closed form) and under Megatron's (1F1B)
    predict(
        "paper-llemma-7b-perlmutter",
        "--cluster perlmutter --model llemma-7b --tp 2 --pp 4 --dp 2 --micro-batch 4 --micro-batches 8 --rules paper",
    ),
    predict(
        "megatron-llemma-7b-perlmutter",
        "--cluster perlmutter --model llemma-7b --tp 2 --pp 4 --dp 2 --micro-batch 4 --micro-batches 8",
    ),
    predict(
        "paper-gpt-20b-perlmutter",
        "--cluster perlmutter --model gpt-20b --tp 4 --pp 4 --dp 2 --micro-batch 2 --micro-batches 16 --rules paper",
    ),
    predict(
        "paper-llama-13b-vista",
        "--cluster vista --model llama-13b --tp 1 --pp 8 --dp 4 --micro-batch 2 --micro-batches 16 --rules paper",
    ),
    predict(
        "paper-rules-1f1b-simulated",
        "--cluster perlmutter --model llemma-7b --tp 2 --pp 4 --dp 2 --micro-batch 4 --micro-batches 8 --rules paper --schedule 1f1b",
    ),
    predict(
        "megatron-closed-form",
        "--cluster dgx-h100 --model llama2-13b --tp 2 --pp 4 --dp 8 --micro-batch 2 --micro-batches 16 --schedule closed-form",
    ),
    // schedules on a real-sized layout
    predict(
        "gpt3-175b-1f1b",
        "--cluster dgx-h100 --model gpt3-175b --tp 8 --pp 8 --dp 16 --micro-batch 1 --micro-batches 32 --sequence-parallel",
    ),
    predict(
        "gpt3-175b-gpipe",
        "--cluster dgx-h100 --model gpt3-175b --tp 8 --pp 8 --dp 16 --micro-batch 1 --micro-batches 32 --sequence-parallel --schedule gpipe --recompute full",
    ),
    predict(
        "gpt3-175b-interleaved",
        "--cluster dgx-h100 --model gpt3-175b --tp 8 --pp 8 --dp 16 --micro-batch 1 --micro-batches 32 --sequence-parallel --vpp 4",
    ),
    predict(
        "gpt3-175b-zb-h1",
        "--cluster dgx-h100 --model gpt3-175b --tp 8 --pp 8 --dp 16 --micro-batch 1 --micro-batches 32 --sequence-parallel --schedule zb-h1",
    ),
    predict(
        "llama2-70b-nemo-fp8-interleaved",
        "--cluster dgx-h100 --model llama2-70b --tp 4 --pp 4 --dp 4 --vpp 20 --micro-batch 1 --global-batch 512 --sequence-parallel --dtype fp8",
    ),
    predict(
        "interleaved-all-warm-up",
        "--cluster dgx-h100 --model llama2-13b --tp 2 --pp 4 --dp 2 --vpp 2 --micro-batch 1 --micro-batches 4",
    ),
    // recompute modes
    predict(
        "llama2-13b-recompute-none",
        "--cluster dgx-h100 --model llama2-13b --tp 2 --pp 4 --dp 8 --micro-batch 2 --micro-batches 16 --recompute none",
    ),
    predict(
        "llama2-13b-recompute-selective",
        "--cluster dgx-h100 --model llama2-13b --tp 2 --pp 4 --dp 8 --micro-batch 2 --micro-batches 16 --recompute selective --sequence-parallel",
    ),
    predict(
        "llama2-13b-recompute-full-zb",
        "--cluster dgx-h100 --model llama2-13b --tp 2 --pp 4 --dp 8 --micro-batch 2 --micro-batches 16 --recompute full --schedule zb-h1",
    ),
    // ZeRO stages and overlap switches
    predict(
        "llama2-7b-zero0",
        "--cluster dgx-h100 --model llama2-7b --tp 1 --pp 2 --dp 16 --micro-batch 1 --global-batch 256 --zero 0",
    ),
    predict(
        "llama2-7b-zero2-no-overlap",
        "--cluster dgx-h100 --model llama2-7b --tp 1 --pp 2 --dp 16 --micro-batch 1 --global-batch 256 --zero 2 --overlap-grad-reduce false --overlap-param-gather false",
    ),
    predict(
        "llama2-7b-fsdp",
        "--cluster dgx-h100 --model llama2-7b --tp 1 --pp 1 --dp 64 --micro-batch 2 --global-batch 512 --zero 3",
    ),
    predict(
        "llama3-8b-tp-overlap-p2p",
        "--cluster dgx-h100 --model llama3-8b --tp 4 --pp 2 --dp 4 --micro-batch 1 --micro-batches 8 --sequence-parallel --tp-comm-overlap --overlap-p2p",
    ),
    predict(
        "tp-across-nodes",
        "--cluster dgx-h100 --model gpt3-175b --tp 16 --pp 4 --dp 2 --micro-batch 1 --micro-batches 8 --sequence-parallel --recompute full",
    ),
    // other clusters, types, partitions and options
    predict(
        "dgx-a100-llama3-8b",
        "--cluster dgx-a100 --model llama3-8b --tp 2 --pp 2 --dp 2 --micro-batch 1 --micro-batches 8 --seq-len 4096",
    ),
    predict(
        "dgx-a100-40gb-gpt3-15b-fp16",
        "--cluster dgx-a100-40gb --model gpt3-15b --tp 4 --pp 2 --dp 4 --micro-batch 2 --micro-batches 8 --dtype fp16 --recompute selective",
    ),
    predict(
        "mi300x-llama2-70b",
        "--cluster mi300x --model llama2-70b --tp 8 --pp 1 --dp 4 --micro-batch 1 --global-batch 64",
    ),
    predict(
        "vista-megatron-gpt3-44b",
        "--cluster vista --model gpt3-44b --tp 1 --pp 8 --dp 8 --micro-batch 1 --micro-batches 16 --recompute full",
    ),
    predict(
        "neox-partition-megatron-rules",
        "--cluster perlmutter --model llama-13b --tp 2 --pp 4 --dp 2 --micro-batch 2 --micro-batches 8 --partition neox",
    ),
    predict(
        "bucket-and-seq-len",
        "--cluster dgx-h100 --model llama2-7b --tp 2 --pp 1 --dp 8 --micro-batch 1 --micro-batches 4 --seq-len 8192 --dp-bucket-elements 10000000",
    ),
    // context parallelism (ring attention beside its K/V exchange) and a mixture of experts
    // with expert parallelism and a skewed router
    predict(
        "llama3-8b-cp4-32k",
        "--cluster dgx-h100 --model llama3-8b --tp 2 --cp 4 --dp 1 --micro-batch 1 --micro-batches 4 --seq-len 32768 --sequence-parallel",
    ),
    predict(
        "mixtral-ep8-imbalance",
        "--cluster dgx-h100 --nodes 8 --model tests/data/mixtral-8x7b.yaml --tp 2 --pp 4 --dp 8 --ep 8 --micro-batch 1 --global-batch 256 --sequence-parallel --moe-imbalance 1.3",
    ),
    predict(
        "oom-layout",
        "--cluster dgx-h100 --model llama3-70b --tp 1 --pp 1 --dp 8 --micro-batch 1 --micro-batches 4",
    ),
    Case {
        name: "memory-gpt3-175b-korthikanti",
        kind: Kind::Memory,
        args: "--cluster dgx-h100 --model gpt3-175b --tp 8 --pp 8 --dp 1 --micro-batch 1 --micro-batches 64 --sequence-parallel --recompute selective",
    },
    Case {
        name: "memory-llama2-70b-zb-h1",
        kind: Kind::Memory,
        args: "--cluster dgx-h100 --model llama2-70b --tp 4 --pp 8 --dp 2 --micro-batch 1 --micro-batches 16 --schedule zb-h1 --zero 1",
    },
    Case {
        name: "search-llama2-7b-32-gpus",
        kind: Kind::Search,
        args: "--cluster dgx-h100 --model llama2-7b --gpus 32 --global-batch 64 --micro-batch 1,2",
    },
    Case {
        name: "search-llemma-paper-rules",
        kind: Kind::Search,
        args: "--cluster perlmutter --model llemma-7b --gpus 16 --global-batch 64 --rules paper --micro-batch 1,4 --schedule 1f1b --pp 1,2,4",
    },
];

/// Turns the short `--cluster NAME` of a case into the shipped file's path.
fn argv(case: &Case) -> Vec<String> {
    let mut out = Vec::new();
    let mut words = case.args.split_whitespace();
    while let Some(w) = words.next() {
        out.push(w.to_string());
        if w == "--cluster" {
            let name = words.next().expect("a cluster name");
            out.push(repo(&format!("hardware-profiles/{name}.yaml")));
        }
    }
    out
}

fn run(case: &Case, dir: &Path) -> Value {
    let mut args: Vec<String> = argv(case);
    let command = match case.kind {
        Kind::Predict => "predict",
        Kind::Memory => "memory",
        Kind::Search => "search",
    };
    args.insert(0, command.to_string());
    let json_file = dir.join(format!("{}.json", case.name));
    match case.kind {
        Kind::Search => {
            args.push("--json".into());
            args.push(json_file.display().to_string());
        }
        _ => args.push("--json".into()),
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = stepcast(&refs);
    assert!(
        o.status.success(),
        "{}: stepcast {} failed: {}",
        case.name,
        case.args,
        stderr(&o)
    );
    let text = match case.kind {
        Kind::Search => std::fs::read_to_string(&json_file).unwrap(),
        _ => stdout(&o),
    };
    // paths in messages name the checkout; the golden does not
    let text = text.replace(env!("CARGO_MANIFEST_DIR"), "<repo>");
    let v: Value = serde_json::from_str(&text).unwrap();
    match case.kind {
        Kind::Predict => predict_summary(&v),
        Kind::Memory => memory_summary(&v),
        Kind::Search => search_summary(&v),
    }
}

fn pick(v: &Value, keys: &[&str]) -> Value {
    let mut m = Map::new();
    for k in keys {
        m.insert(k.to_string(), v[*k].clone());
    }
    Value::Object(m)
}

fn memory_summary(m: &Value) -> Value {
    json!({
        "capacity_gib": m["capacity_gib"],
        "verdict": m["verdict"],
        "peak_rank": m["peak_rank"],
        "layer_activations_gib": m["layer_activations_gib"],
        "ranks": m["ranks"].as_array().unwrap().iter().map(|r| pick(r, &[
            "rank", "params", "weights_gib", "gradients_gib", "optimizer_gib", "activations_gib",
            "in_flight", "transient_gib", "overhead_gib", "total_gib", "verdict",
        ])).collect::<Vec<_>>(),
    })
}

fn predict_summary(p: &Value) -> Value {
    // every distinct call once, with its time and source
    let mut calls = BTreeMap::new();
    for stage in p["stages"].as_array().unwrap() {
        for list in ["fwd", "bwd", "grad_sync", "update"] {
            for op in stage[list].as_array().unwrap() {
                let e = &op["estimate"];
                calls.insert(
                    op["query"].as_str().unwrap().to_string(),
                    json!({"us": e["time_us"], "source": e["source"], "model": e["model"]}),
                );
            }
        }
    }
    let stages: Vec<Value> = p["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let mut v = pick(
                s,
                &[
                    "index",
                    "role",
                    "layers",
                    "params",
                    "fwd_ms",
                    "bwd_ms",
                    "grad_sync_ms",
                    "optimizer_ms",
                    "param_gather_ms",
                ],
            );
            // the calls each stage makes, with how many per micro-batch or step
            for list in ["fwd", "bwd", "grad_sync", "update"] {
                let counts: Vec<Value> = s[list]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|op| json!([op["label"], op["query"], op["count"]]))
                    .collect();
                v[list] = Value::Array(counts);
            }
            v
        })
        .collect();
    json!({
        "model": p["model"],
        "cluster": p["cluster"],
        "schedule": p["schedule"],
        "step_time_s": p["step_time_s"],
        "interval_s": p["interval_s"],
        "tokens_per_s": p["tokens_per_s"],
        "model_tflops_per_gpu": p["model_tflops_per_gpu"],
        "mfu_percent": p["mfu_percent"],
        "bubble_ratio": p["bubble_ratio"],
        "breakdown_s": p["breakdown_s"],
        "sources_percent": p["sources_percent"],
        "stages": stages,
        "memory": memory_summary(&p["memory"]),
        "calls": calls,
        "out_of_coverage": p["out_of_coverage"].as_array().unwrap().len(),
        "warnings": p["warnings"],
    })
}

fn search_summary(r: &Value) -> Value {
    let rows: Vec<Value> = r["rows"]
        .as_array()
        .unwrap()
        .iter()
        .take(12)
        .map(|row| {
            let l = &row["layout"];
            json!({
                "tp": l["tp"], "pp": l["pp"], "dp": l["dp"], "micro_batch": l["micro_batch"],
                "micro_batches": l["micro_batches"], "vpp": l["vpp"], "schedule": l["schedule"],
                "recompute": l["recompute"], "sequence_parallel": l["sequence_parallel"],
                "zero": l["zero"], "status": row["status"], "step_s": row["step_time_s"],
                "interval_s": row["interval_s"], "mfu_percent": row["mfu_percent"],
                "bubble_ratio": row["bubble_ratio"], "memory_peak_gib": row["memory_peak_gib"],
            })
        })
        .collect();
    json!({
        "enumerated": r["enumerated"],
        "pruned": r["pruned"],
        "pruned_memory": r["pruned_memory"],
        "predicted": r["predicted"],
        "best_rows": rows,
    })
}

/// Whether two golden numbers agree.
fn within_tolerance(a: f64, b: f64) -> bool {
    (a - b).abs() <= RELATIVE_TOLERANCE * a.abs().max(b.abs()) + 1e-12
}

/// Puts `old`'s numbers back into `new` wherever they agree and the structure is the same.
fn keep_unmoved(old: &Value, new: &mut Value) {
    match (old, new) {
        (Value::Number(a), new @ Value::Number(_)) => {
            let b = new.as_f64().unwrap();
            if within_tolerance(a.as_f64().unwrap(), b) {
                *new = Value::Number(a.clone());
            }
        }
        (Value::Object(a), Value::Object(b)) => {
            for (k, vb) in b.iter_mut() {
                if let Some(va) = a.get(k) {
                    keep_unmoved(va, vb);
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (va, vb) in a.iter().zip(b.iter_mut()) {
                keep_unmoved(va, vb);
            }
        }
        _ => {}
    }
}

/// Every difference between `old` and `new`, as "path: old → new".
fn diff(path: &str, old: &Value, new: &Value, out: &mut Vec<String>) {
    match (old, new) {
        (Value::Number(a), Value::Number(b)) => {
            let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
            if !within_tolerance(a, b) {
                let rel = if a != 0.0 {
                    format!(" ({:+.4} %)", 100.0 * (b / a - 1.0))
                } else {
                    String::new()
                };
                out.push(format!("{path}: {a} → {b}{rel}"));
            }
        }
        (Value::Object(a), Value::Object(b)) => {
            for (k, va) in a {
                match b.get(k) {
                    Some(vb) => diff(&format!("{path}.{k}"), va, vb, out),
                    None => out.push(format!("{path}.{k}: removed (was {va})")),
                }
            }
            for (k, vb) in b {
                if !a.contains_key(k) {
                    out.push(format!("{path}.{k}: added ({vb})"));
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (va, vb)) in a.iter().zip(b).enumerate() {
                diff(&format!("{path}[{i}]"), va, vb, out);
            }
        }
        _ if old != new => out.push(format!("{path}: {old} → {new}")),
        _ => {}
    }
}

fn golden_dir() -> PathBuf {
    PathBuf::from(repo("tests/golden"))
}

#[test]
fn predictions_match_the_golden() {
    let update = std::env::var_os("STEPCAST_UPDATE_GOLDEN").is_some();
    let scratch = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for case in CASES {
        let summary = run(case, scratch.path());
        let file = golden_dir().join(format!("{}.json", case.name));
        let doc = json!({
            "_regenerate": REGENERATE,
            "command": format!("stepcast {} {}", match case.kind {
                Kind::Predict => "predict",
                Kind::Memory => "memory",
                Kind::Search => "search",
            }, case.args),
            "summary": summary,
        });
        if update {
            // a number within the tolerance keeps its old digits, so the file's diff shows
            // only what moved
            let mut doc = doc;
            if let Some(old) = std::fs::read_to_string(&file)
                .ok()
                .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            {
                keep_unmoved(&old["summary"], &mut doc["summary"]);
            }
            std::fs::create_dir_all(golden_dir()).unwrap();
            std::fs::write(&file, serde_json::to_string_pretty(&doc).unwrap() + "\n").unwrap();
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&file) else {
            failures.push(format!(
                "{}: no golden file {} (run {REGENERATE})",
                case.name,
                file.display()
            ));
            continue;
        };
        let old: Value = serde_json::from_str(&text).unwrap();
        let mut changes = Vec::new();
        diff("", &old["summary"], &summary, &mut changes);
        if !changes.is_empty() {
            let shown = changes.len().min(40);
            failures.push(format!(
                "{} ({} differences{}):\n  {}",
                case.name,
                changes.len(),
                if shown < changes.len() {
                    ", first 40"
                } else {
                    ""
                },
                changes[..shown].join("\n  ")
            ));
        }
    }
    // no golden file without a case
    if !update {
        for entry in std::fs::read_dir(golden_dir()).unwrap() {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            let stem = name.trim_end_matches(".json");
            if !CASES.iter().any(|c| c.name == stem) {
                failures.push(format!(
                    "tests/golden/{name}: no case produces it; delete it"
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "predictions moved; if deliberate, run `{REGENERATE}` and say in the commit which moved \
         and why:\n\n{}",
        failures.join("\n\n")
    );
}

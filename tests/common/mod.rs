//! Helpers for the end-to-end tests: run the real binary, and write small synthetic datasets
//! (roofline-shaped times with deterministic noise) so no test needs ../shared.

#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Llama 2 13B on 32 GPUs at global batch 64: a search with hundreds of layouts.
pub const LLAMA2_13B_ON_32: [&str; 6] = [
    "--model",
    "llama2-13b",
    "--gpus",
    "32",
    "--global-batch",
    "64",
];

pub fn stepcast(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_stepcast"))
        .args(args)
        .output()
        .expect("run stepcast")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A successful run's JSON output (the run must have succeeded).
pub fn json_of(o: &Output) -> serde_json::Value {
    assert!(o.status.success(), "{}", stderr(o));
    serde_json::from_slice(&o.stdout).expect("JSON on stdout")
}

/// A JSON file's contents (a manifest, a report).
pub fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A path inside the repository.
pub fn repo(path: &str) -> String {
    format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))
}

/// Asserts a user error: exit code 2 and every `needle` in stderr.
pub fn assert_user_error(o: &Output, needles: &[&str]) {
    let err = stderr(o);
    assert_eq!(
        o.status.code(),
        Some(2),
        "stderr: {err}\nstdout: {}",
        stdout(o)
    );
    for n in needles {
        assert!(err.contains(n), "stderr lacks '{n}': {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

pub const META: &str = "schema_version: 1
name: synthetic-a100
collected_at: 2026-01-01
gpu:
  name: NVIDIA A100-SXM4-80GB
  memory_gib: 80.0
  sm_count: 108
  hbm_bandwidth_gb_per_s: 2039.0
  l2_cache_mib: 40.0
  peak_dense_tflops: {fp32: 19.5, tf32: 156.0, fp16: 312.0, bf16: 312.0}
gpus_per_node: 4
software:
  driver: '550.54'
  cuda: '12.4'
  nccl: '2.21.5'
source:
  description: synthetic test data
";

/// Deterministic noise in [-amp, amp].
struct Noise(u64);
impl Noise {
    fn next(&mut self, amp: f64) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * amp
    }
}

/// A dataset with GEMMs (roles qkv and mlp_up), RMSNorm and all-reduce rows, fwd and bwd.
pub fn write_dataset(dir: &Path) {
    fs::create_dir_all(dir).unwrap();
    fs::write(dir.join("meta.yaml"), META).unwrap();
    let mut noise = Noise(42);
    let mut gemm = String::from(
        "op,role,dtype,phase,m,n,k,batch,ctx_batch,ctx_seq,ctx_hidden,ctx_tp,time_us,n_samples,samples_us\n",
    );
    for (role, widen) in [("qkv", 3), ("mlp_up", 4)] {
        for tp in [1u64, 2, 4] {
            for b in [1u64, 2, 4] {
                for seq in [512u64, 1024, 2048] {
                    for hidden in [1024u64, 2048, 3072, 4096] {
                        let (m, n, k) = (b * seq, widen * hidden / tp, hidden);
                        let flops = 2.0 * (m * n * k) as f64;
                        for (phase, factor) in [("fwd", 1.0), ("bwd", 2.0)] {
                            let t = 8.0 + factor * flops / 250e12 * 1e6 * (1.0 + noise.next(0.03));
                            let samples: Vec<String> = (0..3)
                                .map(|i| format!("{:.3}", t * (1.0 + 0.001 * i as f64)))
                                .collect();
                            gemm.push_str(&format!(
                                "gemm,{role},fp16,{phase},{m},{n},{k},1,{b},{seq},{hidden},{tp},{t:.3},3,{}\n",
                                samples.join(";")
                            ));
                        }
                    }
                }
            }
        }
    }
    fs::write(dir.join("gemm.csv"), gemm).unwrap();

    let mut norm = String::from("op,dtype,phase,batch,seq,width,time_us\n");
    for b in [1u64, 2, 4, 8] {
        for seq in [512u64, 1024, 2048, 4096] {
            for w in [1024u64, 2048, 4096, 8192] {
                let bytes = 4.0 * (b * seq * w) as f64;
                for (phase, f) in [("fwd", 1.0), ("bwd", 1.5)] {
                    let t = 4.0 + f * bytes / 1.6e12 * 1e6 * (1.0 + noise.next(0.02));
                    norm.push_str(&format!("rmsnorm,fp16,{phase},{b},{seq},{w},{t:.3}\n"));
                }
            }
        }
    }
    fs::write(dir.join("rmsnorm.csv"), norm).unwrap();

    let mut ar = String::from("op,dtype,phase,bytes,ranks,nodes,gpus_per_node,time_us\n");
    for (nodes, gpn, bw) in [(1u64, 2u64, 80e9), (1, 4, 150e9), (2, 4, 20e9)] {
        for i in 0..30u64 {
            let bytes = (1u64 << 20) * (1 + i * 17);
            let n = (nodes * gpn) as f64;
            let t = 15.0 + 2.0 * (n - 1.0) / n * bytes as f64 / bw * 1e6 * (1.0 + noise.next(0.02));
            ar.push_str(&format!(
                "all_reduce,fp16,none,{bytes},{},{nodes},{gpn},{t:.3}\n",
                nodes * gpn
            ));
        }
    }
    fs::write(dir.join("all_reduce.csv"), ar).unwrap();
}

/// A synthetic dataset in `dir/ds` and the models trained from it in `dir/models`.
pub fn trained_models(dir: &Path) -> (PathBuf, PathBuf) {
    let ds = dir.join("ds");
    let models = dir.join("models");
    write_dataset(&ds);
    let out = stepcast(&[
        "train",
        ds.to_str().unwrap(),
        "--out",
        models.to_str().unwrap(),
        "--quiet",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    (ds, models)
}

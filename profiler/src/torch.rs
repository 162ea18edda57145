//! The PyTorch backend: `scripts/bench_torch.py` (embedded in the binary) run on the node's own
//! Python, so attention is timed on the kernels a PyTorch/Megatron step runs (FlashAttention,
//! cuDNN or memory-efficient SDPA, chosen explicitly and recorded), and norms, element-wise,
//! embedding, cross-entropy and the fused AdamW step on PyTorch's own kernels.
//!
//! Why a script and not `tch` in-process: tch pins one libtorch version (2.13 for tch 0.26)
//! while a node has its own (2.11 on our H100 node), needs a C++ build against it, and exposes
//! neither SDPA backend selection nor CUDA events; the script costs nothing to build, uses the
//! node's torch as it is, and times with `torch.cuda.Event`. It returns raw samples; the summary
//! is computed by the same `sorted_median` as every other row.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use serde::Deserialize;
use serde_json::{json, Value};
use stepcast::ops::{OpKind, OpQuery};

use crate::plan::PlanPoint;
use crate::protocol::Protocol;

pub const SCRIPT: &str = include_str!("../scripts/bench_torch.py");

/// The timer the script uses, as a dataset's meta.yaml states it.
pub const TIMER: &str = "CUDA events (torch.cuda.Event) between the timed runs of a point, queued \
     back to back behind one GPU spin (torch.cuda._sleep): Python's dispatch is not timed and the \
     GPU does not idle between runs";

#[derive(Debug, Clone)]
pub struct TorchBackend {
    pub python: String,
    pub device: usize,
    /// auto, flash, cudnn or efficient.
    pub attention_backend: String,
    /// Also time GEMMs (torch.bmm) — when the CUDA build is not available.
    pub gemms: bool,
    /// Where the script's private directory is created (none: the system's temporary
    /// directory).
    pub temp_root: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct TorchVersions {
    pub torch: Option<String>,
    pub cuda: Option<String>,
    pub cudnn: Option<String>,
    pub gpu: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Measured {
        samples_us: Vec<f64>,
        backend: String,
        telemetry: String,
    },
    Skipped(String),
}

#[derive(Deserialize)]
struct Line {
    id: Option<usize>,
    versions: Option<TorchVersions>,
    samples_us: Option<Vec<f64>>,
    backend: Option<String>,
    telemetry: Option<String>,
    skip: Option<String>,
}

impl TorchBackend {
    pub fn handles(&self, q: &OpQuery) -> bool {
        !q.op.is_collective() && (q.op != OpKind::Gemm || self.gemms)
    }

    /// The request the script reads.
    pub fn request(&self, points: &[&PlanPoint], protocol: &Protocol, saturate_ms: u64) -> Value {
        let points: Vec<Value> = points
            .iter()
            .enumerate()
            .map(|(id, p)| {
                let q = &p.query;
                let shape: serde_json::Map<String, Value> = q
                    .shape
                    .family()
                    .columns()
                    .iter()
                    .zip(q.shape.values())
                    .map(|(c, v)| (c.to_string(), json!(v)))
                    .collect();
                json!({"id": id, "op": q.op.name(), "phase": q.phase.name(), "dtype": q.dtype.name(), "shape": shape})
            })
            .collect();
        json!({
            "protocol": protocol,
            "device": self.device,
            "saturate_ms": saturate_ms,
            "attention_backend": self.attention_backend,
            "points": points,
        })
    }

    /// Runs the script over `points`, calling `on` with each point's outcome as it arrives.
    /// Points the script never answered (it could not start, or died) are reported skipped.
    pub fn run(
        &self,
        points: &[&PlanPoint],
        protocol: &Protocol,
        saturate_ms: u64,
        on: &mut dyn FnMut(usize, Outcome) -> anyhow::Result<()>,
    ) -> anyhow::Result<Option<TorchVersions>> {
        // the script goes into a private directory (created exclusively, 0700, unpredictable
        // name) and Python runs isolated (-I: neither the script's directory nor the user's
        // environment on sys.path), so nothing planted beside it can be imported
        let mut builder = tempfile::Builder::new();
        builder.prefix("stepcast-bench-torch-");
        let dir = match &self.temp_root {
            Some(root) => builder.tempdir_in(root)?,
            None => builder.tempdir()?,
        };
        let script = dir.path().join("bench_torch.py");
        std::fs::write(&script, SCRIPT)?;
        let spawned = Command::new(&self.python)
            .arg("-I")
            .arg("-u")
            .arg(&script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                for i in 0..points.len() {
                    on(
                        i,
                        Outcome::Skipped(format!("cannot run {}: {e}", self.python)),
                    )?;
                }
                return Ok(None);
            }
        };
        let request = self.request(points, protocol, saturate_ms);
        {
            let mut stdin = child.stdin.take().expect("piped");
            // a script that exits at once (no torch) closes its end: not an error here
            let _ = stdin.write_all(request.to_string().as_bytes());
        }
        let stderr = child.stderr.take().expect("piped");
        let errors = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut text);
            text
        });
        let mut versions = None;
        let mut answered = vec![false; points.len()];
        for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
            let line = line?;
            let parsed: Line = serde_json::from_str(&line).map_err(|e| {
                anyhow::anyhow!("the PyTorch backend wrote an unreadable line ({e}): {line}")
            })?;
            if let Some(v) = parsed.versions {
                versions = Some(v);
                continue;
            }
            let Some(id) = parsed.id.filter(|&i| i < points.len()) else {
                anyhow::bail!("the PyTorch backend answered an unknown point: {line}");
            };
            answered[id] = true;
            let outcome = match (parsed.samples_us, parsed.skip) {
                (Some(samples_us), None) => Outcome::Measured {
                    samples_us,
                    backend: parsed.backend.unwrap_or_default(),
                    telemetry: parsed.telemetry.unwrap_or_default(),
                },
                (_, Some(reason)) => Outcome::Skipped(reason),
                _ => Outcome::Skipped("no samples".into()),
            };
            on(id, outcome)?;
        }
        let status = child.wait()?;
        let stderr_text = errors.join().unwrap_or_default();
        drop(dir);
        if answered.iter().any(|a| !a) {
            let tail: String = stderr_text
                .trim()
                .lines()
                .last()
                .unwrap_or("")
                .chars()
                .take(300)
                .collect();
            let reason = format!("PyTorch backend stopped ({status}): {tail}");
            for (i, done) in answered.iter().enumerate() {
                if !done {
                    on(i, Outcome::Skipped(reason.clone()))?;
                }
            }
        }
        Ok(versions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stepcast::dataset::LayerContext;
    use stepcast::ops::{Dtype, Phase, Shape, TokenShape};

    fn point() -> PlanPoint {
        PlanPoint {
            query: OpQuery {
                op: OpKind::RmsNorm,
                phase: Phase::Bwd,
                dtype: Dtype::Bf16,
                role: None,
                shape: Shape::Tokens(TokenShape {
                    batch: 2,
                    seq: 8,
                    width: 64,
                }),
            },
            context: LayerContext::default(),
        }
    }

    /// A backend whose private directory goes under `tmp` (tests never change TMPDIR, which
    /// other tests running beside them read).
    fn backend_in(python: &str, tmp: &std::path::Path) -> TorchBackend {
        TorchBackend {
            python: python.into(),
            device: 0,
            attention_backend: "auto".into(),
            gemms: false,
            temp_root: Some(tmp.to_path_buf()),
        }
    }

    fn backend(python: &str) -> TorchBackend {
        TorchBackend {
            temp_root: None,
            ..backend_in(python, std::path::Path::new("."))
        }
    }

    /// The backend times what the CUDA device does not: never collectives, GEMMs only when
    /// asked (the torch device, without cuBLASLt).
    #[test]
    fn the_backend_takes_kernels_and_gemms_only_when_asked() {
        let mut b = backend("python3");
        let mut q = point().query;
        assert!(b.handles(&q));
        for (op, without, with) in [
            (OpKind::Gemm, false, true),
            (OpKind::AllReduce, false, false),
        ] {
            q.op = op;
            b.gemms = false;
            assert_eq!(b.handles(&q), without, "{op}");
            b.gemms = true;
            assert_eq!(b.handles(&q), with, "{op}");
        }
    }

    #[test]
    fn the_request_names_every_shape_column() {
        let p = point();
        let r = backend("python3").request(&[&p], &Protocol::default(), 0);
        assert_eq!(
            r["points"][0]["shape"],
            json!({"batch": 2, "seq": 8, "width": 64})
        );
        assert_eq!(r["points"][0]["phase"], "bwd");
        assert_eq!(r["protocol"]["keep"], 5);
    }

    #[test]
    fn a_missing_python_skips_every_point_with_the_reason() {
        let p = point();
        let mut seen = Vec::new();
        let tmp = tempfile::tempdir().unwrap();
        backend_in("/no/such/python", tmp.path())
            .run(&[&p, &p], &Protocol::default(), 0, &mut |i, o| {
                seen.push((i, o));
                Ok(())
            })
            .unwrap();
        assert_eq!(seen.len(), 2);
        assert!(matches!(&seen[0].1, Outcome::Skipped(r) if r.contains("cannot run")));
    }

    /// A backend that answers a point it was not asked about, or writes what is not JSON, is
    /// an error (not a row); a stand-in Python (POSIX sh) writes each.
    #[cfg(unix)]
    #[test]
    fn an_answer_to_no_point_or_not_json_is_an_error() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let p = point();
        for (answer, says) in [
            (
                r#"{"id": 1, "samples_us": [1.0]}"#,
                "answered an unknown point",
            ),
            ("Traceback (most recent call last):", "unreadable line"),
        ] {
            let python = tmp.path().join("python");
            std::fs::write(
                &python,
                format!("#!/bin/sh\ncat >/dev/null\necho '{answer}'\n"),
            )
            .unwrap();
            std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o700)).unwrap();
            let e = backend_in(python.to_str().unwrap(), tmp.path())
                .run(&[&p], &Protocol::default(), 0, &mut |_, _| Ok(()))
                .unwrap_err()
                .to_string();
            assert!(e.contains(says), "{e}");
        }
    }

    /// Each point gets what the script answered for it: its samples, its own skip reason, or
    /// (never answered) why the script stopped; the versions line is read, not a point.
    #[cfg(unix)]
    #[test]
    fn every_point_gets_its_answer() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let python = tmp.path().join("python");
        let answers = [
            r#"{"versions": {"torch": "2.11.0", "gpu": "NVIDIA H100"}}"#,
            r#"{"id": 1, "skip": "out of memory"}"#,
            r#"{"id": 0, "samples_us": [3.0, 2.0], "backend": "torch", "telemetry": "sm 1980"}"#,
        ];
        let script = answers
            .iter()
            .map(|a| format!("echo '{a}'\n"))
            .collect::<String>();
        std::fs::write(
            &python,
            format!("#!/bin/sh\ncat >/dev/null\n{script}echo 'gone' >&2\nexit 3\n"),
        )
        .unwrap();
        std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o700)).unwrap();
        let p = point();
        let mut outcomes = vec![None; 3];
        let versions = backend_in(python.to_str().unwrap(), tmp.path())
            .run(&[&p, &p, &p], &Protocol::default(), 0, &mut |i, o| {
                outcomes[i] = Some(o);
                Ok(())
            })
            .unwrap()
            .unwrap();
        assert_eq!(versions.torch.as_deref(), Some("2.11.0"));
        assert_eq!(
            outcomes[0],
            Some(Outcome::Measured {
                samples_us: vec![3.0, 2.0],
                backend: "torch".into(),
                telemetry: "sm 1980".into(),
            })
        );
        assert_eq!(outcomes[1], Some(Outcome::Skipped("out of memory".into())));
        match &outcomes[2] {
            Some(Outcome::Skipped(why)) => {
                assert!(
                    why.contains("PyTorch backend stopped") && why.contains("gone"),
                    "{why}"
                )
            }
            other => panic!("{other:?}"),
        }
    }

    /// Files planted in the temporary directory are never imported: the script runs from a
    /// private directory, in isolated mode.
    #[test]
    fn modules_planted_in_the_temporary_directory_do_not_run() {
        let shared = tempfile::tempdir().unwrap();
        let marker = shared.path().join("planted-module-ran");
        for module in ["json.py", "torch.py", "sys.py", "os.py"] {
            std::fs::write(
                shared.path().join(module),
                format!(
                    "open({:?}, 'w').write('yes')\n",
                    marker.display().to_string()
                ),
            )
            .unwrap();
        }
        let p = point();
        let run = |python: &str| {
            backend_in(python, shared.path())
                .run(&[&p], &Protocol::default(), 0, &mut |_, _| Ok(()))
                .unwrap()
        };
        run("python3");
        assert!(
            !marker.exists(),
            "a module planted beside the script was imported"
        );
        // and nothing of ours is left behind
        let left: Vec<_> = std::fs::read_dir(shared.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("stepcast"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn a_python_without_torch_skips_with_the_scripts_message() {
        // the CI machine has python3 but no torch: the script's own message reaches the row
        match Command::new("python3")
            .args(["-c", "import torch"])
            .stderr(Stdio::null())
            .status()
        {
            Err(_) => return, // no python3 (a machine with only Rust): nothing to run
            Ok(s) if s.success() => return, // torch here would try to run the kernels
            Ok(_) => {}
        }
        let p = point();
        let mut reasons = Vec::new();
        let tmp = tempfile::tempdir().unwrap();
        backend_in("python3", tmp.path())
            .run(&[&p], &Protocol::default(), 0, &mut |_, o| {
                if let Outcome::Skipped(r) = o {
                    reasons.push(r);
                }
                Ok(())
            })
            .unwrap();
        assert!(
            reasons[0].contains("PyTorch is not importable") || reasons[0].contains("no CUDA"),
            "{reasons:?}"
        );
    }
}

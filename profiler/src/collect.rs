//! Runs a plan into a dataset directory: one row appended and flushed per point as it is
//! measured, a skipped row (with the reason) for a point that cannot be measured, `--resume`
//! continuing an interrupted collection without repeating or losing a row.

use std::collections::{HashMap, HashSet};
use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use stepcast::dataset::{
    Dataset, DatasetMeta, LayerContext, Measurement, MeasurementWriter, Protocol as MetaProtocol,
    Provenance, SoftwareStamp, Status, DATASET_SCHEMA_VERSION, META_FILE,
};
use stepcast::ops::{OpKind, OpQuery, Role};

use crate::device::{Device, DeviceError, Launch};
use crate::plan::{Plan, PlanPoint};
use crate::protocol::measure_on;
use crate::torch::{Outcome, TorchBackend};

#[derive(Debug, Clone)]
pub struct CollectOptions {
    pub out: PathBuf,
    pub resume: bool,
    /// On resume, measure again the points recorded as skipped.
    pub retry_skipped: bool,
    pub progress: bool,
    /// Several processes, one per node: process 0 measures and writes everything, the others
    /// only take part in the collectives process 0 announces in the rendezvous directory.
    pub launch: Option<Launch>,
}

#[derive(Debug, Default)]
pub struct CollectReport {
    pub measured: usize,
    pub skipped: Vec<(String, usize)>,
    pub already_done: usize,
    pub throttled: usize,
    pub seconds: f64,
    /// Bytes of a partial last row dropped on resume.
    pub repaired_bytes: u64,
}

impl CollectReport {
    /// Counts a row timed by the device or the backend: measured (and throttled) when it holds a
    /// time, skipped with its reason when its samples could not be kept.
    fn count(&mut self, m: &Measurement) {
        if m.is_ok() {
            self.measured += 1;
            self.throttled += usize::from(m.throttled);
        } else {
            self.skip(&m.note);
        }
    }

    fn skip(&mut self, reason: &str) {
        match self.skipped.iter_mut().find(|(r, _)| r == reason) {
            Some((_, n)) => *n += 1,
            None => self.skipped.push((reason.to_string(), 1)),
        }
    }
}

fn row(
    p: &PlanPoint,
    samples_us: Vec<f64>,
    keep: u32,
    throttled: bool,
    note: String,
) -> Measurement {
    // a sample the dataset reader would refuse (a kernel under the timer's resolution timed
    // as 0, a failed timer) skips the point instead of making the whole dataset unreadable
    let readable = stepcast::limits::MIN_TIME_US..=stepcast::limits::MAX_TIME_US;
    if let Some(bad) = samples_us.iter().find(|t| !readable.contains(t)) {
        return skipped_row(
            p,
            &format!(
                "a sample of {bad} µs, outside the {} to {} µs a time may be (below the \
                 timer's resolution, or a failed timer)",
                readable.start(),
                readable.end()
            ),
        );
    }
    // every sample is at least MIN_TIME_US (above), so a summary is positive
    match stepcast::stats::sorted_median(&samples_us, keep as usize) {
        Some(time_us) => Measurement {
            query: p.query,
            context: p.context,
            time_us,
            samples_us,
            status: Status::Ok,
            throttled,
            note,
        },
        _ => skipped_row(p, "no valid samples"),
    }
}

/// An attention call that PyTorch ran on its FlashAttention-2 kernels (SDPA's flash backend,
/// the first choice of `--attention-backend auto`) is recorded as role `flash_attention_2`, so
/// that `stepcast train` fits it apart from cuDNN's attention and `predict` uses it for calls run
/// as FA2 (`--attention-kernel flash-attention-2`).
fn kernel_role(mut q: OpQuery, backend: &str) -> OpQuery {
    if q.op == OpKind::FlashAttention && backend == "flash_attention" {
        q.role = Some(Role::FlashAttention2);
    }
    q
}

/// The plan's point a row answers: plans name no kernel, rows may (see [`kernel_role`]).
pub(crate) fn without_kernel_role(mut q: OpQuery) -> OpQuery {
    if q.role.is_some_and(Role::is_another_kernel) {
        q.role = None;
    }
    q
}

fn skipped_row(p: &PlanPoint, reason: &str) -> Measurement {
    Measurement {
        query: p.query,
        context: p.context,
        time_us: f64::NAN,
        samples_us: Vec::new(),
        status: Status::Skipped,
        throttled: false,
        note: reason.to_string(),
    }
}

/// Drops a partial last line (a row cut by a crash mid-write) from every CSV of `dir`,
/// however long that line is.
fn repair_tails(dir: &Path) -> anyhow::Result<u64> {
    let mut dropped = 0;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("csv") {
            continue;
        }
        let mut f = OpenOptions::new().read(true).write(true).open(&path)?;
        let len = f.metadata()?.len();
        let keep = end_of_last_line(&mut f, len)?;
        if keep < len {
            f.set_len(keep)?;
            dropped += len - keep;
        }
    }
    Ok(dropped)
}

/// Where the last complete line of a file of `len` bytes ends (0: none), reading backwards
/// in blocks.
fn end_of_last_line(f: &mut std::fs::File, len: u64) -> std::io::Result<u64> {
    const BLOCK: u64 = 64 << 10;
    let mut end = len;
    let mut buf = vec![0u8; BLOCK as usize];
    while end > 0 {
        let start = end.saturating_sub(BLOCK);
        let block = &mut buf[..(end - start) as usize];
        f.seek(SeekFrom::Start(start))?;
        f.read_exact(block)?;
        if end == len && block.last() == Some(&b'\n') {
            return Ok(len);
        }
        if let Some(i) = block.iter().rposition(|&b| b == b'\n') {
            return Ok(start + i as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

pub fn meta_for(plan: &Plan, info: &crate::device::DeviceInfo, name: String) -> DatasetMeta {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    DatasetMeta {
        schema_version: DATASET_SCHEMA_VERSION,
        name,
        collected_at: stepcast::fsutil::today_utc(),
        gpu: info.gpu.clone(),
        gpus_per_node: Some(info.gpus),
        network: None,
        software: info.software.clone(),
        source: Provenance {
            description: if info.real {
                format!(
                    "stepcast bench collect, plan '{}', on {}",
                    plan.spec.name,
                    host.trim()
                )
            } else {
                "MOCK DEVICE — synthetic test-double timings, not measurements".to_string()
            },
            repository: None,
            commit: None,
            path: None,
            license: None,
        },
        protocol: Some(MetaProtocol {
            warmup_runs: plan.spec.protocol.warmup,
            timed_runs: plan.spec.protocol.timed,
            kept_middle: plan.spec.protocol.keep,
            timer: info.timer.clone(),
        }),
        collector: Some(concat!("stepcast-bench ", env!("CARGO_PKG_VERSION")).to_string()),
        reference_errors: Vec::new(),
    }
}

/// Collects `plan` on `device` (and the PyTorch backend for what the device does not time).
pub fn collect(
    plan: &Plan,
    device: &mut dyn Device,
    torch: Option<&TorchBackend>,
    options: &CollectOptions,
) -> anyhow::Result<CollectReport> {
    let started = Instant::now();
    let mut report = CollectReport::default();
    let info = device.info();
    let out = &options.out;
    let follower = options.launch.as_ref().is_some_and(|l| l.node > 0);
    // one writer per dataset directory, for the whole collection
    let _lock = if follower {
        None
    } else {
        std::fs::create_dir_all(out)?;
        Some(stepcast::fsutil::DirLock::exclusive(out)?)
    };
    // a point is its call and the layer it came from: a retrain re-measures a collection's
    // points, where one call may come from two layers, each a row of its own
    let mut done: HashSet<(OpQuery, LayerContext)> = HashSet::new();
    let mut meta = if out.join(META_FILE).exists() && !follower {
        if !options.resume {
            anyhow::bail!(stepcast::Error::Invalid(format!(
                "{}: already holds a dataset; add --resume to continue it or give a new --out",
                out.display()
            )));
        }
        report.repaired_bytes = repair_tails(out)?;
        let existing = Dataset::load(out).or_else(|e| match e {
            stepcast::Error::Empty(_) => Ok(Dataset {
                dir: out.clone(),
                meta: DatasetMeta::load(out)?,
                rows: Vec::new(),
                fingerprint: String::new(),
            }),
            other => Err(other),
        })?;
        if existing.meta.gpu.name != info.gpu.name {
            anyhow::bail!(stepcast::Error::Invalid(format!(
                "{}: was collected on {}; this node has {}: resume it there or give a new --out",
                out.display(),
                existing.meta.gpu.name,
                info.gpu.name
            )));
        }
        for r in &existing.rows {
            if r.is_ok() || !options.retry_skipped {
                done.insert((without_kernel_role(r.query), r.context));
            }
        }
        existing.meta
    } else {
        let name = out
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "collection".into());
        meta_for(plan, &info, name)
    };
    let mut writer = None;
    if !follower {
        writer = Some(MeasurementWriter::new(out)?);
        meta.save(out)?;
    }

    let mut todo: Vec<&PlanPoint> = plan
        .points
        .iter()
        .filter(|p| !done.contains(&(without_kernel_role(p.query), p.context)))
        .collect();
    if let Some(launch) = &options.launch {
        todo = agree_on_collectives(plan, todo, launch)?;
    }
    report.already_done = plan.points.len() - todo.len();
    let by_torch =
        |p: &&&PlanPoint| torch.is_some_and(|t| t.handles(&p.query)) && !device.handles(&p.query);
    let (mut torch_points, mut device_points): (Vec<&PlanPoint>, Vec<&PlanPoint>) =
        todo.iter().copied().partition(|p| by_torch(&p));
    // collectives first: on several nodes every process must reach them together
    device_points.sort_by_key(|p| (!p.query.op.is_collective(), p.query.op));
    torch_points.sort_by_key(|p| p.query.op);

    let bar = if options.progress {
        ProgressBar::new(todo.len() as u64)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{msg:>22} [{bar:40}] {pos}/{len} points, {elapsed} (eta {eta})",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    let protocol = plan.spec.protocol;
    let mut last_kind = None;
    for p in device_points {
        if last_kind != Some(p.query.op) {
            bar.set_message(p.query.op.name());
            device
                .saturate(plan.spec.saturate_ms)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            last_kind = Some(p.query.op);
        }
        let m = match measure_on(device, &protocol, &p.query) {
            Ok(t) => {
                let m = row(p, t.samples_us, protocol.keep, t.throttled, t.note);
                report.count(&m);
                m
            }
            Err(DeviceError::Skip(reason)) => {
                report.skip(&reason);
                skipped_row(p, &reason)
            }
            Err(DeviceError::Fatal(reason)) => {
                bar.abandon();
                anyhow::bail!(
                    "device failed at {}: {reason}; {} rows are saved in {}, continue with --resume",
                    p.query,
                    report.measured,
                    out.display()
                );
            }
        };
        if let Some(w) = writer.as_mut() {
            w.append(&m)?;
        }
        bar.inc(1);
    }
    if let (Some(t), false) = (torch, torch_points.is_empty()) {
        bar.set_message("pytorch kernels");
        let versions = t.run(
            &torch_points,
            &protocol,
            plan.spec.saturate_ms,
            &mut |i, outcome| {
                let p = torch_points[i];
                let m = match outcome {
                    Outcome::Measured {
                        samples_us,
                        backend,
                        telemetry,
                    } => {
                        let note = [backend.as_str(), telemetry.as_str()]
                            .iter()
                            .filter(|s| !s.is_empty())
                            .copied()
                            .collect::<Vec<_>>()
                            .join("; ");
                        let mut m = row(p, samples_us, protocol.keep, false, note);
                        m.query = kernel_role(m.query, &backend);
                        report.count(&m);
                        m
                    }
                    Outcome::Skipped(reason) => {
                        report.skip(&reason);
                        skipped_row(p, &reason)
                    }
                };
                if let Some(w) = writer.as_mut() {
                    w.append(&m)?;
                }
                bar.inc(1);
                Ok(())
            },
        )?;
        if let Some(v) = versions {
            merge_versions(&mut meta.software, &v, &t.attention_backend);
            meta.save(out)?;
        }
    }
    bar.finish_and_clear();
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// File in the rendezvous directory listing the plan points (by index) process 0 will measure.
const ANNOUNCED: &str = "collectives-todo.json";

#[derive(Debug, Serialize, Deserialize)]
struct Announcement {
    plan_points: usize,
    collectives: Vec<usize>,
}

/// Makes every process of a multi-node launch run the same collectives in the same order:
/// process 0 (which alone knows what a resumed dataset holds) announces them, the others wait
/// for the announcement and run exactly those. Non-collective points stay with process 0.
fn agree_on_collectives<'p>(
    plan: &'p Plan,
    todo: Vec<&'p PlanPoint>,
    launch: &Launch,
) -> anyhow::Result<Vec<&'p PlanPoint>> {
    let path = launch.rendezvous.join(ANNOUNCED);
    if launch.node == 0 {
        let stale = std::fs::read_dir(&launch.rendezvous)
            .map(|d| d.count() > 0)
            .unwrap_or(false);
        if stale {
            anyhow::bail!(stepcast::Error::Invalid(format!(
                "{}: --rendezvous must be a new, empty directory for each launch (it holds files \
                 of an earlier one)",
                launch.rendezvous.display()
            )));
        }
        let index: HashMap<*const PlanPoint, usize> = plan
            .points
            .iter()
            .enumerate()
            .map(|(i, p)| (p as *const PlanPoint, i))
            .collect();
        let announcement = Announcement {
            plan_points: plan.points.len(),
            collectives: todo
                .iter()
                .filter(|p| p.query.op.is_collective())
                .map(|p| index[&(*p as *const PlanPoint)])
                .collect(),
        };
        stepcast::fsutil::write_atomic(&path, serde_json::to_string(&announcement)?.as_bytes())?;
        return Ok(todo);
    }
    let deadline = Instant::now() + Duration::from_secs(3600);
    let announcement: Announcement = loop {
        if let Ok(text) = std::fs::read_to_string(&path) {
            break serde_json::from_str(&text).with_context(|| {
                format!("{}: not an announcement of process 0", path.display())
            })?;
        }
        if Instant::now() > deadline {
            anyhow::bail!(
                "process 0 announced no collectives at {} within an hour",
                path.display()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    if announcement.plan_points != plan.points.len() {
        anyhow::bail!(stepcast::Error::Invalid(format!(
            "process 0 expanded a plan of {} points, this node {}: give every node the same \
             plan and GPU count",
            announcement.plan_points,
            plan.points.len()
        )));
    }
    announcement
        .collectives
        .iter()
        .map(|&i| {
            plan.points
                .get(i)
                .filter(|p| p.query.op.is_collective())
                .ok_or_else(|| anyhow::anyhow!("{}: point {i} is not a collective", path.display()))
        })
        .collect()
}

fn merge_versions(s: &mut SoftwareStamp, v: &crate::torch::TorchVersions, attention: &str) {
    s.torch = v.torch.clone().or(s.torch.take());
    s.cudnn = v.cudnn.clone().or(s.cudnn.take());
    if s.cuda.is_none() {
        s.cuda = v.cuda.clone();
    }
    s.attention_backend = Some(format!(
        "torch SDPA ({attention}; the backend that ran is in each row's note)"
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attention_run_by_flash_attention_2_is_recorded_as_that_kernel_and_still_resumes() {
        use stepcast::ops::{AttentionShape, Dtype, Phase, Shape};
        let q = OpQuery {
            op: OpKind::FlashAttention,
            phase: Phase::Fwd,
            dtype: Dtype::Bf16,
            role: None,
            shape: Shape::Attention(AttentionShape {
                batch: 1,
                seq_q: 8192,
                seq_kv: 8192,
                heads: 32,
                kv_heads: 32,
                head_dim: 128,
                causal: true,
            }),
        };
        let fa2 = kernel_role(q, "flash_attention");
        assert_eq!(fa2.role, Some(Role::FlashAttention2));
        assert_eq!(kernel_role(q, "cudnn_attention").role, None);
        assert_eq!(without_kernel_role(fa2), q);
        // other roles are the plan's own and stay
        let gemm = OpQuery {
            op: OpKind::Gemm,
            role: Some(Role::Qkv),
            ..q
        };
        assert_eq!(kernel_role(gemm, "flash_attention"), gemm);
        assert_eq!(without_kernel_role(gemm), gemm);
    }

    #[test]
    fn a_torn_row_longer_than_any_block_drops_only_itself() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gemm.csv");
        let kept = "op,dtype\ngemm,fp16\n";
        let torn = "x".repeat(3 << 20); // 3 MiB without a newline
        std::fs::write(&path, format!("{kept}{torn}")).unwrap();
        assert_eq!(repair_tails(dir.path()).unwrap(), torn.len() as u64);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), kept);
        // a whole file is left alone; a file of one partial line is emptied
        assert_eq!(repair_tails(dir.path()).unwrap(), 0);
        std::fs::write(&path, "no newline at all").unwrap();
        repair_tails(dir.path()).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "");
    }
    use crate::device::mock::MockDevice;
    use crate::plan::{PlanSpec, Target};
    use stepcast::ops::OpKind;

    fn quick_plan() -> Plan {
        let mut spec = PlanSpec::builtin(true);
        spec.protocol.warmup = 1;
        spec.saturate_ms = 0;
        spec.expand(Target {
            gpus_per_node: 4,
            nodes: 1,
            fp8: false,
        })
        .unwrap()
    }

    fn options(out: &Path) -> CollectOptions {
        CollectOptions {
            out: out.to_path_buf(),
            resume: false,
            retry_skipped: false,
            progress: false,
            launch: None,
        }
    }

    #[test]
    fn a_collection_writes_every_point_with_samples_and_a_mock_stamp() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("ds");
        let plan = quick_plan();
        let mut dev = MockDevice::new(4);
        let r = collect(&plan, &mut dev, None, &options(&out)).unwrap();
        assert_eq!(r.measured, plan.points.len());
        let ds = Dataset::load(&out).unwrap();
        assert_eq!(ds.rows.len(), plan.points.len());
        assert!(ds.rows.iter().all(|m| m.samples_us.len() == 10));
        assert!(ds.meta.source.description.contains("MOCK"));
        assert_eq!(ds.meta.protocol.as_ref().unwrap().kept_middle, 5);
        // a second collection into the same directory needs --resume
        let e = collect(&plan, &mut MockDevice::new(4), None, &options(&out)).unwrap_err();
        assert!(e.to_string().contains("--resume"), "{e}");
    }

    #[test]
    fn an_interrupted_collection_resumes_without_losing_or_repeating_rows() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("ds");
        let plan = quick_plan();
        let mut dev = MockDevice::new(4);
        dev.crash_after = Some(20);
        let e = collect(&plan, &mut dev, None, &options(&out)).unwrap_err();
        assert!(e.to_string().contains("--resume"), "{e}");
        let partial = Dataset::load(&out).unwrap().rows.len();
        assert_eq!(partial, 20);
        // a crash in the middle of writing a row leaves half a line: resume drops it
        let csv = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|x| x == "csv"))
            .unwrap();
        let mut f = OpenOptions::new().append(true).open(&csv).unwrap();
        std::io::Write::write_all(&mut f, b"all_reduce,,bf16,no").unwrap();
        let mut resumed = options(&out);
        resumed.resume = true;
        let r = collect(&plan, &mut MockDevice::new(4), None, &resumed).unwrap();
        assert_eq!(r.already_done, 20);
        assert!(r.repaired_bytes > 0);
        let rows = Dataset::load(&out).unwrap().rows;
        assert_eq!(rows.len(), plan.points.len());
        let unique: HashSet<OpQuery> = rows.iter().map(|m| m.query).collect();
        assert_eq!(unique.len(), rows.len());
    }

    #[test]
    fn failing_points_are_recorded_as_skipped_and_collection_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("ds");
        let plan = quick_plan();
        let mut dev = MockDevice::new(4);
        dev.unsupported = vec![OpKind::AllToAll];
        dev.oom_above_elements = 1 << 27;
        let r = collect(&plan, &mut dev, None, &options(&out)).unwrap();
        assert!(r.skipped.iter().any(|(why, _)| why == "out of memory"));
        let rows = Dataset::load(&out).unwrap().rows;
        assert_eq!(rows.len(), plan.points.len());
        let skipped: Vec<&Measurement> = rows.iter().filter(|m| !m.is_ok()).collect();
        assert!(!skipped.is_empty() && skipped.iter().all(|m| !m.note.is_empty()));
        let counted: usize = r.skipped.iter().map(|(_, n)| n).sum();
        assert_eq!(counted, skipped.len(), "{:?}", r.skipped);
        let oom = skipped
            .iter()
            .filter(|m| m.note.contains("out of memory"))
            .count();
        assert!(oom > 1);
        assert!(r.skipped.contains(&("out of memory".to_string(), oom)));
        // skipped points are not measured again on resume unless asked
        let mut again = options(&out);
        again.resume = true;
        let r = collect(&plan, &mut MockDevice::new(4), None, &again).unwrap();
        assert_eq!(r.measured, 0);
        again.retry_skipped = true;
        let r = collect(&plan, &mut MockDevice::new(4), None, &again).unwrap();
        assert_eq!(r.measured, skipped.len());
    }

    /// A node at its power cap flags every row it times, and the report counts them; the GPU
    /// is saturated once before each operator kind, not before each point.
    #[test]
    fn throttled_rows_are_flagged_and_counted_and_each_kind_is_saturated_once() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("ds");
        let plan = quick_plan();
        let mut dev = MockDevice::new(4);
        dev.power_capped = true;
        let r = collect(&plan, &mut dev, None, &options(&out)).unwrap();
        assert_eq!(r.throttled, plan.points.len());
        assert_eq!(r.measured, plan.points.len());
        let rows = Dataset::load(&out).unwrap().rows;
        assert!(rows.iter().all(|m| m.throttled && m.note.contains("0x4")));
        let kinds: HashSet<OpKind> = plan.points.iter().map(|p| p.query.op).collect();
        assert_eq!(dev.saturations, kinds.len());
        let calm = tempfile::tempdir().unwrap();
        let r = collect(&plan, &mut MockDevice::new(4), None, &options(calm.path())).unwrap();
        assert_eq!(r.throttled, 0);
    }

    /// One call from two layers is two points: an interrupted collection that timed it for
    /// the first layer times it for the second on resume.
    #[test]
    fn a_call_of_two_layers_is_resumed_as_two_points() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("ds");
        let mut plan = quick_plan();
        let first = plan.points[0].clone();
        let second = PlanPoint {
            context: LayerContext {
                hidden: Some(first.context.hidden.unwrap_or(1) * 2),
                ..first.context
            },
            ..first.clone()
        };
        plan.points = vec![first, second];
        let mut dev = MockDevice::new(4);
        dev.crash_after = Some(1);
        collect(&plan, &mut dev, None, &options(&out)).unwrap_err();
        assert_eq!(Dataset::load(&out).unwrap().rows.len(), 1);
        let mut resumed = options(&out);
        resumed.resume = true;
        let r = collect(&plan, &mut MockDevice::new(4), None, &resumed).unwrap();
        assert_eq!((r.already_done, r.measured), (1, 1));
        let rows = Dataset::load(&out).unwrap().rows;
        assert_eq!(rows.len(), 2);
        assert_ne!(rows[0].context, rows[1].context);
    }

    #[test]
    fn resuming_on_another_gpu_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("ds");
        let plan = quick_plan();
        collect(&plan, &mut MockDevice::new(4), None, &options(&out)).unwrap();
        let mut meta = DatasetMeta::load(&out).unwrap();
        meta.gpu.name = "NVIDIA A100-SXM4-80GB".into();
        meta.save(&out).unwrap();
        let mut o = options(&out);
        o.resume = true;
        let e = collect(&plan, &mut MockDevice::new(4), None, &o).unwrap_err();
        assert!(
            e.to_string().contains("was collected on NVIDIA A100"),
            "{e}"
        );
    }
}

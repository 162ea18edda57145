//! A simulated step as a Chrome / Perfetto trace (the JSON "Trace Event Format"): one process
//! per pipeline rank, one thread per stream (compute, pipeline sends, data-parallel, hidden
//! tensor-parallel communication), complete ("X") events in microseconds, each pass named with
//! its micro-batch and chunk and nested into its layers (a backward's layers into recompute and
//! backward).

use std::io::Write;

use serde::Serialize;
use serde_json::{json, Value};

use super::{Pass, PipelineWork, SegmentKind, Timeline};

const COMPUTE: u32 = 0;
const SENDS: u32 = 1;
const DATA_PARALLEL: u32 = 2;
const TENSOR_PARALLEL: u32 = 3;
/// Above this many per-layer slices, layers are drawn as one slice per run of layers.
const MAX_LAYER_SLICES: usize = 300_000;

#[derive(Serialize)]
struct Event {
    name: String,
    ph: &'static str,
    pid: usize,
    tid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    cat: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ts: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dur: Option<f64>,
    #[serde(skip_serializing_if = "Value::is_null")]
    args: Value,
}

fn slice(
    pid: usize,
    tid: u32,
    cat: &'static str,
    name: String,
    ts: f64,
    dur: f64,
    args: Value,
) -> Event {
    Event {
        name,
        ph: "X",
        pid,
        tid,
        cat: Some(cat),
        ts: Some(ts),
        dur: Some(dur.max(0.0)),
        args,
    }
}

fn meta(pid: usize, tid: u32, what: &str, name: String) -> Event {
    Event {
        name: what.to_string(),
        ph: "M",
        pid,
        tid,
        cat: None,
        ts: None,
        dur: None,
        args: json!({ "name": name }),
    }
}

/// Name of a pass as the timeline shows it.
pub fn pass_name(pass: Pass, micro_batch: u32, chunk: Option<usize>) -> String {
    let p = match pass {
        Pass::Forward => "F",
        Pass::Backward => "B",
        Pass::WeightGrad => "W",
    };
    match chunk {
        Some(c) => format!("{p} mb {micro_batch} chunk {c}"),
        None => format!("{p} mb {micro_batch}"),
    }
}

/// Writes the trace; `title` goes into the metadata.
pub fn write_trace(
    out: &mut dyn Write,
    work: &PipelineWork,
    timeline: &Timeline,
    title: &str,
) -> std::io::Result<()> {
    let p = work.pp();
    let chunks_per_rank = work.vpp();
    let layer_slices: usize = timeline
        .ranks
        .iter()
        .flat_map(|r| &r.tasks)
        .map(|t| {
            work.chunks[t.task.stage as usize]
                .pass(t.task.pass)
                .segments
                .iter()
                .map(|s| s.repeat as usize)
                .sum::<usize>()
        })
        .sum();
    let per_layer = layer_slices <= MAX_LAYER_SLICES;
    let mut events = Vec::new();
    for (r, rank) in timeline.ranks.iter().enumerate() {
        let layers: Vec<String> = (r..work.chunks.len())
            .step_by(p)
            .map(|s| {
                let c = &work.chunks[s];
                let n: u64 = c
                    .fwd
                    .segments
                    .iter()
                    .filter(|g| g.kind == SegmentKind::Layer)
                    .map(|g| g.repeat)
                    .sum();
                format!("{}–{}", c.first_layer, c.first_layer + n.max(1) - 1)
            })
            .collect();
        events.push(meta(
            r,
            0,
            "process_name",
            format!("pipeline rank {r} (layers {})", layers.join(", ")),
        ));
        events.push(Event {
            name: "process_sort_index".into(),
            ph: "M",
            pid: r,
            tid: 0,
            cat: None,
            ts: None,
            dur: None,
            args: json!({ "sort_index": r }),
        });
        for (tid, name) in [
            (COMPUTE, "compute"),
            (SENDS, "pipeline sends"),
            (DATA_PARALLEL, "data-parallel"),
            (TENSOR_PARALLEL, "tensor-parallel (overlapped)"),
        ] {
            events.push(meta(r, tid, "thread_name", name.to_string()));
        }
        for run in &rank.tasks {
            let s = run.task.stage as usize;
            let chunk = &work.chunks[s];
            let pass = chunk.pass(run.task.pass);
            let label = pass_name(
                run.task.pass,
                run.task.micro_batch,
                (chunks_per_rank > 1).then_some(s / p),
            );
            let cat = match run.task.pass {
                Pass::Forward => "forward",
                Pass::Backward => "backward",
                Pass::WeightGrad => "weight-gradient",
            };
            events.push(slice(
                r,
                COMPUTE,
                cat,
                label,
                run.start_us,
                run.end_us - run.start_us,
                json!({
                    "micro_batch": run.task.micro_batch,
                    "virtual_stage": s,
                    "compute_us": pass.parts.compute,
                    "tp_comm_us": pass.parts.tp_comm,
                    "dp_comm_us": pass.parts.dp_comm,
                    "waited_for_parameters_us": run.gather_wait_us,
                }),
            ));
            // children in order; a gated first forward waits before some repetitions
            let mut t = run.start_us;
            let mut rep = 0u32;
            let mut waits = run.gather_waits.iter().peekable();
            let mut wait_before = |rep: u32, t: &mut f64, events: &mut Vec<Event>| {
                while let Some(&&(at, us)) = waits.peek() {
                    if at != rep {
                        break;
                    }
                    events.push(slice(
                        r,
                        COMPUTE,
                        "wait",
                        "waiting for parameter all-gather".into(),
                        *t,
                        us,
                        Value::Null,
                    ));
                    *t += us;
                    waits.next();
                }
            };
            let mut layer = chunk.first_layer;
            let layer_count: u64 = pass
                .segments
                .iter()
                .filter(|g| g.kind == SegmentKind::Layer)
                .map(|g| g.repeat)
                .sum();
            let backwards = run.task.pass != Pass::Forward;
            for seg in &pass.segments {
                match seg.kind {
                    SegmentKind::Embedding | SegmentKind::Head => {
                        wait_before(rep, &mut t, &mut events);
                        let name = if seg.kind == SegmentKind::Embedding {
                            "embedding"
                        } else {
                            "final norm, LM head, loss"
                        };
                        events.push(slice(r, COMPUTE, cat, name.into(), t, seg.us, Value::Null));
                        t += seg.us;
                        rep += 1;
                    }
                    SegmentKind::Layer if per_layer => {
                        for j in 0..seg.repeat {
                            wait_before(rep, &mut t, &mut events);
                            rep += 1;
                            let index = if backwards {
                                chunk.first_layer + layer_count - 1 - j
                            } else {
                                layer + j
                            };
                            events.push(slice(
                                r,
                                COMPUTE,
                                cat,
                                format!("layer {index}"),
                                t,
                                seg.us,
                                Value::Null,
                            ));
                            if seg.recompute_us > 0.0 {
                                events.push(slice(
                                    r,
                                    COMPUTE,
                                    "recompute",
                                    "recompute forward".into(),
                                    t,
                                    seg.recompute_us,
                                    Value::Null,
                                ));
                                events.push(slice(
                                    r,
                                    COMPUTE,
                                    cat,
                                    "backward".into(),
                                    t + seg.recompute_us,
                                    seg.us - seg.recompute_us,
                                    Value::Null,
                                ));
                            }
                            t += seg.us;
                        }
                    }
                    SegmentKind::Layer => {
                        for j in 0..seg.repeat as u32 {
                            wait_before(rep + j, &mut t, &mut events);
                        }
                        rep += seg.repeat as u32;
                        let dur = seg.us * seg.repeat as f64;
                        events.push(slice(r, COMPUTE, cat, format!("{} layers", seg.repeat), t, dur, json!({"per_layer_us": seg.us, "recompute_per_layer_us": seg.recompute_us})));
                        t += dur;
                    }
                }
                if seg.kind == SegmentKind::Layer {
                    layer += seg.repeat;
                }
            }
            if pass.hidden_tp_us > 0.0 {
                events.push(slice(
                    r,
                    TENSOR_PARALLEL,
                    "tp-comm",
                    "tensor-parallel communication (hidden)".into(),
                    run.start_us,
                    pass.hidden_tp_us.min(run.end_us - run.start_us),
                    Value::Null,
                ));
            }
        }
        for (tid, cat, spans) in [
            (SENDS, "pp-comm", &rank.sends),
            (DATA_PARALLEL, "dp-comm", &rank.data_parallel),
        ] {
            for span in spans {
                events.push(slice(
                    r,
                    tid,
                    cat,
                    span.name.clone(),
                    span.start_us,
                    span.end_us - span.start_us,
                    json!({ "blocking": span.blocking }),
                ));
            }
        }
        if let Some(opt) = &rank.optimizer {
            events.push(slice(
                r,
                COMPUTE,
                "optimizer",
                opt.name.clone(),
                opt.start_us,
                opt.end_us - opt.start_us,
                Value::Null,
            ));
        }
    }
    let b = &timeline.breakdown;
    let doc = json!({
        "displayTimeUnit": "ms",
        "otherData": {
            "generator": concat!("stepcast ", env!("CARGO_PKG_VERSION")),
            "title": title,
            "schedule": timeline.schedule.name(),
            "step_ms": timeline.step_us / 1e3,
            "critical_rank": timeline.critical_rank,
            "bubble_ratio": timeline.bubble_ratio(),
            "breakdown_ms": {
                "compute": b.compute / 1e3, "tp_comm": b.tp_comm / 1e3, "pp_comm": b.pp_comm / 1e3,
                "dp_comm": b.dp_comm / 1e3, "optimizer": b.optimizer / 1e3, "bubble": b.bubble / 1e3,
            },
            "layers_drawn_individually": per_layer,
        },
        "traceEvents": events,
    });
    serde_json::to_writer(&mut *out, &doc)?;
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::predict::compose::ClassTimes;
    use crate::schedule::{simulate, ChunkWork, PassWork, RankWork, Segment};
    use crate::workload::{Overlap, Schedule};
    use std::collections::BTreeMap;

    fn pass(us: f64, recompute: f64) -> PassWork {
        PassWork {
            segments: vec![Segment {
                kind: SegmentKind::Layer,
                repeat: 3,
                us: us / 3.0,
                recompute_us: recompute,
                params: 30,
            }],
            parts: ClassTimes {
                compute: us,
                ..Default::default()
            },
            hidden_tp_us: 0.0,
        }
    }

    /// Checks what Perfetto's JSON importer needs: microsecond complete events with names,
    /// process and thread names, and slices on one thread either nested or disjoint.
    pub(crate) fn check_trace(doc: &serde_json::Value) -> usize {
        let events = doc["traceEvents"].as_array().expect("traceEvents array");
        let mut named = std::collections::HashSet::new();
        type Slices = Vec<(f64, f64, String)>;
        let mut by_thread: BTreeMap<(u64, u64), Slices> = BTreeMap::new();
        for e in events {
            let (pid, tid) = (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap());
            match e["ph"].as_str().unwrap() {
                "M" => {
                    if e["name"] == "thread_name" || e["name"] == "process_name" {
                        assert!(e["args"]["name"].as_str().is_some_and(|n| !n.is_empty()));
                        named.insert((e["name"].as_str().unwrap().to_string(), pid, tid));
                    }
                }
                "X" => {
                    let (ts, dur) = (e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap());
                    assert!(ts >= 0.0 && dur >= 0.0 && ts.is_finite());
                    let name = e["name"].as_str().unwrap().to_string();
                    assert!(!name.is_empty());
                    by_thread
                        .entry((pid, tid))
                        .or_default()
                        .push((ts, ts + dur, name));
                }
                other => panic!("unexpected phase {other}"),
            }
        }
        let mut slices = 0;
        for ((pid, tid), mut list) in by_thread {
            assert!(
                named.contains(&("process_name".to_string(), pid, 0)),
                "pid {pid} unnamed"
            );
            assert!(
                named.contains(&("thread_name".to_string(), pid, tid)),
                "tid {tid} unnamed"
            );
            list.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
            let mut open: Vec<(f64, f64, String)> = Vec::new();
            for s in list {
                while open.last().is_some_and(|o| s.0 >= o.1 - 1e-6) {
                    open.pop();
                }
                if let Some(o) = open.last() {
                    assert!(s.1 <= o.1 + 1e-6, "{:?} overlaps {:?} on {pid}/{tid}", s, o);
                }
                open.push(s);
                slices += 1;
            }
        }
        slices
    }

    #[test]
    fn a_trace_perfetto_can_read() {
        let p = 3;
        let chunks = (0..p)
            .map(|k| ChunkWork {
                rank: k,
                first_layer: 3 * k as u64,
                fwd: pass(3.0, 0.0),
                bwd: pass(9.0, 1.0),
                wgrad: PassWork::default(),
                send_fwd_us: if k + 1 < p { 0.5 } else { 0.0 },
                send_bwd_us: if k > 0 { 0.5 } else { 0.0 },
            })
            .collect();
        let ranks = (0..p)
            .map(|_| RankWork {
                grad_sync_us: 4.0,
                param_gather_us: 2.0,
                optimizer_us: 1.0,
                params: 90,
                bucket_elements: 40,
            })
            .collect();
        let work = PipelineWork {
            schedule: Schedule::OneFOneB,
            micro_batches: 4,
            chunks,
            ranks,
            overlap: Overlap {
                grad_reduce: true,
                param_gather: true,
                p2p: false,
                tp_fraction: 0.0,
            },
        };
        let timeline = simulate(&work).unwrap();
        let mut out = Vec::new();
        write_trace(&mut out, &work, &timeline, "test").unwrap();
        let doc: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let slices = check_trace(&doc);
        // per rank: 8 passes with 3 layers each, a backward's layers split in two
        assert!(slices > 3 * (4 * 4 + 4 * 9));
        let names: Vec<&str> = doc["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| e["name"].as_str())
            .collect();
        for mb in 0..4 {
            assert!(names.contains(&format!("F mb {mb}").as_str()));
            assert!(names.contains(&format!("B mb {mb}").as_str()));
        }
        for n in [
            "recompute forward",
            "layer 8",
            "optimizer step",
            "waiting for parameter all-gather",
        ] {
            assert!(names.contains(&n), "no {n}");
        }
        assert!(
            (doc["otherData"]["step_ms"].as_f64().unwrap() * 1e3 - timeline.step_us).abs() < 1e-9
        );
    }
}

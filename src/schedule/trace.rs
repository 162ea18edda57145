//! A simulated step as a Chrome / Perfetto trace (the JSON "Trace Event Format"): one process
//! per pipeline rank, one thread per stream (compute, pipeline sends, data-parallel, hidden
//! tensor-parallel communication), complete ("X") events in microseconds, each pass named with
//! its micro-batch and chunk and nested into its layers (a backward's layers into recompute and
//! backward).

use std::io::Write;

use serde::Serialize;
use serde_json::{json, Value};

use super::{simulate_with, Observer, Pass, PipelineWork, SegmentKind, Stream, Task, Timeline};

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

fn meta(pid: usize, tid: u32, what: &str, args: Value) -> Event {
    Event {
        name: what.to_string(),
        ph: "M",
        pid,
        tid,
        cat: None,
        ts: None,
        dur: None,
        args,
    }
}

/// Name of a pass as the timeline shows it.
pub fn pass_name(pass: Pass, micro_batch: u32, chunk: Option<usize>) -> String {
    match chunk {
        Some(c) => format!("{} mb {micro_batch} chunk {c}", pass.letter()),
        None => format!("{} mb {micro_batch}", pass.letter()),
    }
}

/// Simulates the step and streams it as a trace into `out` (events are written as the
/// simulator produces them; nothing is held); `title` goes into the metadata.
pub fn write_trace(
    out: &mut dyn Write,
    work: &PipelineWork,
    title: &str,
) -> std::io::Result<Timeline> {
    let mut w = TraceWriter {
        out,
        work,
        first: true,
        per_layer: layer_slices(work) <= MAX_LAYER_SLICES,
        error: None,
    };
    w.out
        .write_all(b"{\"displayTimeUnit\":\"ms\",\"traceEvents\":[")?;
    w.metadata();
    let timeline =
        simulate_with(work, &mut w, false).map_err(|e| std::io::Error::other(e.to_string()))?;
    if let Some(e) = w.error.take() {
        return Err(e);
    }
    let b = &timeline.breakdown;
    let other = json!({
        "generator": concat!("stepcast ", env!("CARGO_PKG_VERSION")),
        "title": title,
        "schedule": timeline.schedule.name(),
        "step_ms": timeline.step_us / 1e3,
        "critical_rank": timeline.critical_rank,
        "bubble_ratio": timeline.bubble_ratio(),
        "breakdown_ms": {
            "compute": b.compute / 1e3, "tp_comm": b.tp_comm / 1e3, "cp_comm": b.cp_comm / 1e3, "ep_comm": b.ep_comm / 1e3, "pp_comm": b.pp_comm / 1e3,
            "dp_comm": b.dp_comm / 1e3, "optimizer": b.optimizer / 1e3, "host": b.host / 1e3,
            "bubble": b.bubble / 1e3,
        },
        "layers_drawn_individually": w.per_layer,
    });
    let out = w.out;
    out.write_all(b"],\"otherData\":")?;
    serde_json::to_writer(&mut *out, &other)?;
    out.write_all(b"}")?;
    out.flush()?;
    Ok(timeline)
}

/// Per-layer slices the trace would hold: every repetition of every pass.
fn layer_slices(work: &PipelineWork) -> usize {
    work.chunks
        .iter()
        .map(|c| (c.fwd.repetitions() + c.bwd.repetitions() + c.wgrad.repetitions()) as usize)
        .sum::<usize>()
        .saturating_mul(work.micro_batches)
}

struct TraceWriter<'a> {
    out: &'a mut dyn Write,
    work: &'a PipelineWork,
    first: bool,
    per_layer: bool,
    /// The first write error (the simulator cannot be told to stop).
    error: Option<std::io::Error>,
}

impl TraceWriter<'_> {
    fn emit(&mut self, e: &Event) {
        if self.error.is_some() {
            return;
        }
        let sep: &[u8] = if self.first { b"" } else { b"," };
        self.first = false;
        let result = self
            .out
            .write_all(sep)
            .and_then(|_| serde_json::to_writer(&mut *self.out, e).map_err(std::io::Error::from));
        if let Err(e) = result {
            self.error = Some(e);
        }
    }

    /// Names and order of every rank and stream.
    fn metadata(&mut self) {
        let work = self.work;
        let p = work.pp();
        for r in 0..p {
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
            self.emit(&meta(
                r,
                0,
                "process_name",
                json!({ "name": format!("pipeline rank {r} (layers {})", layers.join(", ")) }),
            ));
            self.emit(&meta(
                r,
                0,
                "process_sort_index",
                json!({ "sort_index": r }),
            ));
            for (tid, name) in [
                (COMPUTE, "compute"),
                (SENDS, "pipeline sends"),
                (DATA_PARALLEL, "data-parallel"),
                (TENSOR_PARALLEL, "tensor-parallel (overlapped)"),
            ] {
                self.emit(&meta(r, tid, "thread_name", json!({ "name": name })));
            }
        }
    }

    /// A pass, nested into its layers (a backward's layers into recompute and backward),
    /// with the waits for gathered weights before the repetitions that waited.
    fn pass(&mut self, r: usize, task: Task, start: f64, end: f64, waits: &[(u32, f64)]) {
        let work = self.work;
        let s = task.stage as usize;
        let chunk = &work.chunks[s];
        let pass = chunk.pass(task.pass);
        let label = pass_name(
            task.pass,
            task.micro_batch,
            (work.vpp() > 1).then_some(s / work.pp()),
        );
        let cat = match task.pass {
            Pass::Forward => "forward",
            Pass::Backward => "backward",
            Pass::WeightGrad => "weight-gradient",
        };
        self.emit(&slice(
            r,
            COMPUTE,
            cat,
            label,
            start,
            end - start,
            json!({
                "micro_batch": task.micro_batch,
                "virtual_stage": s,
                "compute_us": pass.parts.compute,
                "tp_comm_us": pass.parts.tp_comm,
                "cp_comm_us": pass.parts.cp_comm,
                "ep_comm_us": pass.parts.ep_comm,
                "dp_comm_us": pass.parts.dp_comm,
                "waited_for_parameters_us": waits.iter().map(|w| w.1).sum::<f64>(),
            }),
        ));
        self.layers(r, task, start, waits, cat);
        if pass.hidden_tp_us > 0.0 {
            self.emit(&slice(
                r,
                TENSOR_PARALLEL,
                "tp-comm",
                "tensor-parallel communication (hidden)".into(),
                start,
                pass.hidden_tp_us.min(end - start),
                Value::Null,
            ));
        }
    }
    /// The slices inside a pass: its layers (or runs of layers), a backward's recompute, and
    /// the waits for gathered weights before the repetitions that waited.
    fn layers(
        &mut self,
        r: usize,
        task: Task,
        start: f64,
        waits: &[(u32, f64)],
        cat: &'static str,
    ) {
        let chunk = &self.work.chunks[task.stage as usize];
        let pass = chunk.pass(task.pass);
        let mut t = start;
        let mut rep = 0u32;
        let mut waits = waits.iter().peekable();
        let layer_count: u64 = pass
            .segments
            .iter()
            .filter(|g| g.kind == SegmentKind::Layer)
            .map(|g| g.repeat)
            .sum();
        let backwards = task.pass != Pass::Forward;
        let mut layer = chunk.first_layer;
        for seg in &pass.segments {
            let reps = if seg.kind == SegmentKind::Layer && !self.per_layer {
                1
            } else {
                seg.repeat
            };
            for j in 0..reps {
                // waits before the repetitions this slice covers
                let covers = if reps == seg.repeat {
                    1
                } else {
                    seg.repeat as u32
                };
                while let Some(&&(at, us)) = waits.peek() {
                    if at >= rep + covers {
                        break;
                    }
                    self.emit(&slice(
                        r,
                        COMPUTE,
                        "wait",
                        "waiting for parameter all-gather".into(),
                        t,
                        us,
                        Value::Null,
                    ));
                    t += us;
                    waits.next();
                }
                rep += covers;
                let (name, dur, args) = match seg.kind {
                    SegmentKind::Embedding => ("embedding".to_string(), seg.us, Value::Null),
                    SegmentKind::Head => {
                        ("final norm, LM head, loss".to_string(), seg.us, Value::Null)
                    }
                    SegmentKind::Layer if reps == seg.repeat => {
                        // a backward runs the chunk's layers last to first, over every
                        // segment of layers (a mixture's dense layers, then its expert ones)
                        let done = layer - chunk.first_layer + j;
                        let index = if backwards {
                            chunk.first_layer + layer_count - 1 - done
                        } else {
                            layer + j
                        };
                        (format!("layer {index}"), seg.us, Value::Null)
                    }
                    SegmentKind::Layer => (
                        format!("{} layers", seg.repeat),
                        seg.us * seg.repeat as f64,
                        json!({"per_layer_us": seg.us, "recompute_per_layer_us": seg.recompute_us}),
                    ),
                };
                self.emit(&slice(r, COMPUTE, cat, name, t, dur, args));
                if seg.kind == SegmentKind::Layer && reps == seg.repeat && seg.recompute_us > 0.0 {
                    self.emit(&slice(
                        r,
                        COMPUTE,
                        "recompute",
                        "recompute forward".into(),
                        t,
                        seg.recompute_us,
                        Value::Null,
                    ));
                    self.emit(&slice(
                        r,
                        COMPUTE,
                        cat,
                        "backward".into(),
                        t + seg.recompute_us,
                        seg.us - seg.recompute_us,
                        Value::Null,
                    ));
                }
                t += dur;
            }
            if seg.kind == SegmentKind::Layer {
                layer += seg.repeat;
            }
        }
    }
}

impl Observer for TraceWriter<'_> {
    fn event(&mut self, event: super::Event<'_>) {
        use super::Event as E;
        match event {
            E::Pass {
                rank,
                task,
                start_us,
                end_us,
                gather_waits,
            } => self.pass(rank, task, start_us, end_us, gather_waits),
            E::Optimizer {
                rank,
                start_us,
                end_us,
            } => self.emit(&slice(
                rank,
                COMPUTE,
                "optimizer",
                "optimizer step".into(),
                start_us,
                end_us - start_us,
                Value::Null,
            )),
            E::StepOverhead { start_us, end_us } => self.emit(&slice(
                0,
                COMPUTE,
                "host",
                "per-step host work".into(),
                start_us,
                end_us - start_us,
                Value::Null,
            )),
            other => {
                let Some(e) = other.on_stream() else { return };
                let (tid, cat) = match e.stream {
                    Stream::Sends => (SENDS, "pp-comm"),
                    Stream::DataParallel => (DATA_PARALLEL, "dp-comm"),
                };
                self.emit(&slice(
                    e.rank,
                    tid,
                    cat,
                    e.name,
                    e.start_us,
                    e.end_us - e.start_us,
                    json!({ "blocking": e.blocking }),
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{ChunkWork, PassWork, RankWork, Segment};
    use crate::timing::{Attribution, ClassTimes};
    use crate::workload::{Overlap, Schedule};
    use std::collections::BTreeMap;

    fn pass(us: f64, recompute: f64) -> PassWork {
        PassWork {
            segments: vec![Segment {
                kind: SegmentKind::Layer,
                repeat: 3,
                us: us / 3.0,
                recompute_us: recompute,
                issue_us: 0.0,
                params: 30,
                attribution: Attribution::default(),
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

    /// A rank's per-step work: gradient reduction, parameter all-gather, optimizer.
    fn rank_work() -> RankWork {
        RankWork {
            grad_sync_us: 4.0,
            param_gather_us: 2.0,
            optimizer_us: 1.0,
            optimizer_issue_us: 0.0,
            params: 90,
            bucket_elements: 40,
            grad_sync_attribution: Attribution::default(),
            param_gather_attribution: Attribution::default(),
            optimizer_attribution: Attribution::default(),
        }
    }

    fn segment(kind: SegmentKind, repeat: u64, us: f64, recompute_us: f64) -> Segment {
        Segment {
            kind,
            repeat,
            us,
            recompute_us,
            issue_us: 0.0,
            params: 10,
            attribution: Attribution::default(),
        }
    }

    /// Two ranks of two chunks: the first chunk opens with the embedding, the last closes
    /// with the head; three layers a chunk, a backward layer 4 µs of which 1.5 recompute.
    fn interleaved_work() -> PipelineWork {
        let chunks = (0..4)
            .map(|s: usize| {
                let (mut fwd, mut bwd) = if s == 2 {
                    // one dense layer before two with experts: two segments of layers
                    (
                        vec![
                            segment(SegmentKind::Layer, 1, 2.0, 0.0),
                            segment(SegmentKind::Layer, 2, 2.0, 0.0),
                        ],
                        vec![
                            segment(SegmentKind::Layer, 2, 4.0, 1.5),
                            segment(SegmentKind::Layer, 1, 4.0, 1.5),
                        ],
                    )
                } else {
                    (
                        vec![segment(SegmentKind::Layer, 3, 2.0, 0.0)],
                        vec![segment(SegmentKind::Layer, 3, 4.0, 1.5)],
                    )
                };
                if s == 0 {
                    fwd.insert(0, segment(SegmentKind::Embedding, 1, 1.0, 0.0));
                    bwd.push(segment(SegmentKind::Embedding, 1, 1.0, 0.0));
                }
                if s == 3 {
                    fwd.push(segment(SegmentKind::Head, 1, 5.0, 0.0));
                    bwd.insert(0, segment(SegmentKind::Head, 1, 5.0, 0.0));
                }
                let work = |segments: Vec<Segment>, hidden_tp_us| PassWork {
                    parts: ClassTimes {
                        compute: segments.iter().map(|g| g.us * g.repeat as f64).sum(),
                        ..Default::default()
                    },
                    segments,
                    hidden_tp_us,
                };
                // the second chunk's weight gradients deferred (zero-bubble style)
                let wgrad = if s == 1 {
                    work(vec![segment(SegmentKind::Layer, 3, 1.0, 0.0)], 0.0)
                } else {
                    PassWork::default()
                };
                ChunkWork {
                    rank: s % 2,
                    first_layer: 3 * s as u64,
                    fwd: work(fwd, 0.0),
                    bwd: work(bwd, 50.0),
                    wgrad,
                    send_fwd_us: 0.5,
                    send_bwd_us: 0.5,
                    send_attribution: Attribution::default(),
                }
            })
            .collect();
        PipelineWork {
            schedule: Schedule::Interleaved,
            micro_batches: 4,
            chunks,
            ranks: vec![rank_work(), rank_work()],
            overlap: Overlap::default(),
            host: Default::default(),
            factors: 0,
            order: None,
        }
    }

    /// The events `feed` makes a trace writer emit, per layer or per run of layers.
    fn emitted(
        work: &PipelineWork,
        per_layer: bool,
        feed: impl FnOnce(&mut TraceWriter<'_>),
    ) -> Vec<Value> {
        let mut out = Vec::new();
        let mut w = TraceWriter {
            out: &mut out,
            work,
            first: true,
            per_layer,
            error: None,
        };
        feed(&mut w);
        assert!(w.error.is_none());
        let text = format!("[{}]", String::from_utf8(out).unwrap());
        serde_json::from_str(&text).unwrap()
    }

    /// (name, start, duration) of each slice, in the order written.
    fn slices(events: &[Value]) -> Vec<(String, f64, f64)> {
        events
            .iter()
            .filter(|e| e["ph"] == "X")
            .map(|e| {
                let name = e["name"].as_str().unwrap().to_string();
                (name, e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap())
            })
            .collect()
    }

    fn named(name: &str, ts: f64, dur: f64) -> (String, f64, f64) {
        (name.to_string(), ts, dur)
    }

    /// The events of one pass of micro-batch 1 on `stage` (its rank: stage mod 2), written
    /// per layer or per run of layers.
    fn pass_events(
        work: &PipelineWork,
        per_layer: bool,
        (stage, pass): (u32, Pass),
        (start_us, end_us): (f64, f64),
        gather_waits: &[(u32, f64)],
    ) -> Vec<Value> {
        emitted(work, per_layer, |w| {
            let task = Task {
                stage,
                pass,
                micro_batch: 1,
            };
            w.event(crate::schedule::Event::Pass {
                rank: stage as usize % 2,
                task,
                start_us,
                end_us,
                gather_waits,
            })
        })
    }

    /// A backward pass's slices, exactly: its chunk in the name, its layers last to first,
    /// each split into recompute and backward, a wait for gathered weights before the
    /// repetition that waited, the embedding last, and the hidden TP communication clipped to
    /// the pass.
    #[test]
    fn a_backward_pass_is_drawn_layer_by_layer() {
        let work = interleaved_work();
        let backward = |per_layer| {
            let first = (0, Pass::Backward);
            pass_events(&work, per_layer, first, (100.0, 140.0), &[(1, 5.0)])
        };
        let events = backward(true);
        assert_eq!(
            slices(&events),
            [
                named("B mb 1 chunk 0", 100.0, 40.0),
                named("layer 2", 100.0, 4.0),
                named("recompute forward", 100.0, 1.5),
                named("backward", 101.5, 2.5),
                named("waiting for parameter all-gather", 104.0, 5.0),
                named("layer 1", 109.0, 4.0),
                named("recompute forward", 109.0, 1.5),
                named("backward", 110.5, 2.5),
                named("layer 0", 113.0, 4.0),
                named("recompute forward", 113.0, 1.5),
                named("backward", 114.5, 2.5),
                named("embedding", 117.0, 1.0),
                named("tensor-parallel communication (hidden)", 100.0, 40.0),
            ]
        );
        assert_eq!(events[0]["args"]["waited_for_parameters_us"], 5.0);
        assert_eq!(events[0]["args"]["virtual_stage"], 0);
        assert_eq!(events.last().unwrap()["tid"], TENSOR_PARALLEL);
        // above the slice limit a run of layers is one slice, the wait before it
        let events = backward(false);
        assert_eq!(
            slices(&events)[1..4],
            [
                named("waiting for parameter all-gather", 100.0, 5.0),
                named("3 layers", 105.0, 12.0),
                named("embedding", 117.0, 1.0),
            ]
        );
        assert_eq!(events[2]["args"]["per_layer_us"], 4.0);
        assert_eq!(events[2]["args"]["recompute_per_layer_us"], 1.5);
        // layers in two segments (a mixture's dense layer and its expert layers) are named
        // last to first across both: before, the second segment's were named again from the
        // chunk's last layer
        let events = pass_events(&work, true, (2, Pass::Backward), (0.0, 12.0), &[]);
        let layers: Vec<String> = slices(&events)
            .into_iter()
            .map(|s| s.0)
            .filter(|n| n.starts_with("layer"))
            .collect();
        assert_eq!(layers, ["layer 8", "layer 7", "layer 6"]);
    }

    /// A forward pass of the second chunk: the chunk and its layers counted from its first,
    /// the head after them; no hidden communication where there is none.
    #[test]
    fn a_forward_pass_names_its_chunk_and_layers() {
        let work = interleaved_work();
        let forward = |stage, start_us, end_us| {
            pass_events(&work, true, (stage, Pass::Forward), (start_us, end_us), &[])
        };
        let events = forward(2, 0.0, 6.0);
        assert_eq!(
            slices(&events),
            [
                named("F mb 1 chunk 1", 0.0, 6.0),
                named("layer 6", 0.0, 2.0),
                named("layer 7", 2.0, 2.0),
                named("layer 8", 4.0, 2.0),
            ]
        );
        let events = forward(3, 10.0, 21.0);
        assert_eq!(
            slices(&events),
            [
                named("F mb 1 chunk 1", 10.0, 11.0),
                named("layer 9", 10.0, 2.0),
                named("layer 10", 12.0, 2.0),
                named("layer 11", 14.0, 2.0),
                named("final norm, LM head, loss", 16.0, 5.0),
            ]
        );
        assert!(events.iter().all(|e| e["pid"] == 1 && e["tid"] == COMPUTE));
    }

    /// The ranks' names list their layers (the embedding and head not counted as layers);
    /// the optimizer, the step's host work and a stream's event last from start to end.
    #[test]
    fn ranks_are_named_by_their_layers_and_other_events_span_their_time() {
        let work = interleaved_work();
        // every repetition of every pass (the second chunk's weight gradients too), the
        // embedding and head as one each, for each of the 4 micro-batches
        assert_eq!(layer_slices(&work), 4 * (6 + 6 + 3 + 6 + 6 + 2 + 2));
        let events = emitted(&work, true, |w| w.metadata());
        let names: Vec<&str> = events
            .iter()
            .filter(|e| e["name"] == "process_name")
            .map(|e| e["args"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "pipeline rank 0 (layers 0–2, 6–8)",
                "pipeline rank 1 (layers 3–5, 9–11)"
            ]
        );
        let events = emitted(&work, true, |w| {
            use crate::schedule::Event as E;
            w.event(E::Optimizer {
                rank: 1,
                start_us: 30.0,
                end_us: 33.0,
            });
            w.event(E::StepOverhead {
                start_us: 40.0,
                end_us: 47.0,
            });
            w.event(E::Send {
                rank: 0,
                task: Task {
                    stage: 0,
                    pass: Pass::Forward,
                    micro_batch: 0,
                },
                start_us: 12.0,
                end_us: 12.5,
                blocking: true,
            });
        });
        let spans = slices(&events);
        assert_eq!(spans[0], named("optimizer step", 30.0, 3.0));
        assert_eq!(spans[1], named("per-step host work", 40.0, 7.0));
        assert_eq!((spans[2].1, spans[2].2), (12.0, 0.5));
        assert_eq!(
            (&events[2]["tid"], &events[2]["args"]["blocking"]),
            (&json!(SENDS), &json!(true))
        );
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
                send_attribution: Attribution::default(),
            })
            .collect();
        let ranks = (0..p).map(|_| rank_work()).collect();
        let work = PipelineWork {
            schedule: Schedule::OneFOneB,
            micro_batches: 4,
            chunks,
            ranks,
            overlap: Overlap {
                grad_reduce: true,
                param_gather: true,
                p2p: false,
                tp: false,
                moe_a2a: false,
            },
            host: Default::default(),
            factors: 0,
            order: None,
        };
        let mut out = Vec::new();
        let timeline = write_trace(&mut out, &work, "test").unwrap();
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

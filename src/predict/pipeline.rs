//! From a plan and per-query times to the pipeline simulator's input: each model chunk's passes
//! as segments (embedding, its layers, the head), the backward split into input- and
//! weight-gradient parts where the schedule asks for it, the hidden share of tensor-parallel
//! communication taken out, and every duration's attribution to cost factors.

use super::compose::{cost_keeping_lanes, cycle_us, whole, Cost, Lane, QueryTimes, StageTiming};
use crate::ops::{OpKind, Phase, Role};
use crate::plan::{Block, Call, Chunk, Plan};
use crate::schedule::{ChunkWork, Host, PassWork, PipelineWork, RankWork, Segment, SegmentKind};
use crate::timing::{Attribution, Class, ClassTimes};
use crate::workload::Layout;

/// Share of a backward call that computes input gradients (the rest: weight gradients). A
/// linear layer's backward is two GEMMs of equal FLOPs, dgrad and wgrad; the embedding's
/// backward is all weight gradient; FSDP's gradient reduce-scatter follows the weight
/// gradients; everything else (attention, norms, activations, TP collectives) is on the
/// input-gradient path.
fn input_grad_share(plan: &Plan, call: &Call) -> f64 {
    let q = plan.query(call);
    let weights = q.role.is_some_and(Role::has_weights);
    match q.op {
        OpKind::Gemm if q.phase == Phase::Bwd && weights => 0.5,
        OpKind::Embedding if q.phase == Phase::Bwd => 0.0,
        OpKind::ReduceScatter if call.overlapped => 0.0,
        _ => 1.0,
    }
}

/// Which part (0–1) of a call a pass computes.
type Share<'a> = dyn Fn(&Call) -> f64 + 'a;

/// Builds passes segment by segment.
struct Passes<'a> {
    times: &'a QueryTimes,
    tp_overlap: bool,
}

impl Passes<'_> {
    fn cost(&self, calls: &[Call], share: &dyn Fn(&Call) -> f64, keep_lanes: bool) -> Cost {
        cost_keeping_lanes(
            calls.iter().map(|c| (c, 1.0)),
            self.times,
            share,
            self.tp_overlap,
            keep_lanes,
        )
    }

    /// Appends `share` of each call of `calls` (after `recompute` in full), `repeat` times.
    #[allow(clippy::too_many_arguments)]
    fn segment(
        &self,
        pass: &mut PassWork,
        kind: SegmentKind,
        repeat: u64,
        calls: &[Call],
        recompute: &[Call],
        params: u64,
        share: &dyn Fn(&Call) -> f64,
    ) {
        if repeat == 0 {
            return;
        }
        let waits = recompute.iter().chain(calls).any(|c| c.host_waits);
        let rc = self.cost(recompute, &whole, waits);
        let own = self.cost(calls, share, waits);
        let mut parts = own.parts.plus(&rc.parts);
        let mut issue_us = own.issue_us + rc.issue_us;
        // where the host waits for the device inside a repetition, neither lane runs ahead
        // of the other across the wait: both take the waits' cycle (the recomputation first)
        let lanes: Vec<Lane> = rc.lanes.iter().chain(&own.lanes).copied().collect();
        if let Some(cycle) = cycle_us(&lanes) {
            let device: f64 = lanes.iter().map(|l| l.device_us).sum();
            let host: f64 = lanes.iter().map(|l| l.host_us).sum();
            parts.host += (cycle - device).max(0.0);
            issue_us += (cycle - host).max(0.0);
        }
        let mut attribution = own.attribution;
        attribution.add_scaled(&rc.attribution, 1.0);
        pass.segments.push(Segment {
            kind,
            repeat,
            us: parts.total(),
            recompute_us: rc.parts.total(),
            issue_us,
            params,
            attribution,
        });
        pass.parts = pass.parts.plus(&parts.scaled(repeat as f64));
        pass.hidden_tp_us += (own.hidden_tp_us + rc.hidden_tp_us) * repeat as f64;
    }
}

/// Which blocks a chunk runs, in model order (a mixture's dense layers come first; routed
/// layers at other loads than the layout's after those at it).
fn blocks<'p>(plan: &'p Plan, chunk: &Chunk) -> Vec<(SegmentKind, u64, &'p Block)> {
    let loaded = chunk
        .loaded
        .iter()
        .map(|&(i, n)| (SegmentKind::Layer, n, &plan.loaded_layers[i].block));
    let mut blocks = vec![
        (
            SegmentKind::Embedding,
            chunk.embedding as u64,
            &plan.embedding,
        ),
        (
            SegmentKind::Layer,
            chunk.dense_layers,
            plan.dense_layer.as_ref().unwrap_or(&plan.layer),
        ),
        (SegmentKind::Layer, chunk.layout_load_layers(), &plan.layer),
    ];
    blocks.extend(loaded);
    blocks.extend([
        (SegmentKind::Head, chunk.head as u64, &plan.head),
        // multi-token prediction after the head: its own layer, bridge and the shared head
        (
            SegmentKind::Head,
            chunk.mtp_layers,
            plan.mtp.as_ref().unwrap_or(&plan.head),
        ),
    ]);
    blocks
}

/// A chunk's forward: embedding, layers, head.
fn forward(b: &Passes, plan: &Plan, chunk: &Chunk) -> PassWork {
    let mut fwd = PassWork::default();
    for (kind, repeat, block) in blocks(plan, chunk) {
        b.segment(
            &mut fwd,
            kind,
            repeat,
            &block.fwd,
            &[],
            block.params,
            &whole,
        );
    }
    fwd
}

/// A chunk's backward in reverse model order: whole, or split into the input-gradient pass
/// and the weight-gradient pass.
fn backward(b: &Passes, plan: &Plan, chunk: &Chunk, split: bool) -> (PassWork, PassWork) {
    let input = |c: &Call| input_grad_share(plan, c);
    let weight = |c: &Call| 1.0 - input_grad_share(plan, c);
    let mut bwd = PassWork::default();
    let mut wgrad = PassWork::default();
    let passes: Vec<(&mut PassWork, &Share<'_>, bool)> = if split {
        vec![(&mut bwd, &input, false), (&mut wgrad, &weight, true)]
    } else {
        vec![(&mut bwd, &whole, true)]
    };
    for (pass, share, completes_gradients) in passes {
        let params = |p: u64| if completes_gradients { p } else { 0 };
        // the recomputed forward runs first in each layer, on the input-gradient path
        for (kind, repeat, block) in blocks(plan, chunk).into_iter().rev() {
            // (the embedding and the head recompute nothing; a multi-token-prediction module
            // recomputes its layer)
            let rc: &[Call] = if split && completes_gradients {
                &[]
            } else {
                &block.recompute
            };
            b.segment(
                pass,
                kind,
                repeat,
                &block.bwd,
                rc,
                params(block.params),
                share,
            );
        }
    }
    (bwd, wgrad)
}

/// The simulator's input for `plan` under `layout` with these query times.
pub fn pipeline_work(plan: &Plan, layout: &Layout, times: &QueryTimes) -> PipelineWork {
    let b = Passes {
        times,
        tp_overlap: layout.overlap.tp,
    };
    let split = layout.schedule.splits_backward();
    let (send_us, send_attribution) = match &plan.send {
        Some(send) => {
            let c = b.cost(std::slice::from_ref(send), &whole, false);
            (times.of(send.query), c.attribution)
        }
        None => (0.0, Attribution::default()),
    };
    let chunks = plan
        .chunks
        .iter()
        .map(|chunk| {
            let (bwd, wgrad) = backward(&b, plan, chunk, split);
            ChunkWork {
                rank: chunk.rank,
                first_layer: chunk.first_layer,
                fwd: forward(&b, plan, chunk),
                bwd,
                wgrad,
                send_fwd_us: if chunk.sends_fwd { send_us } else { 0.0 },
                send_bwd_us: if chunk.sends_bwd { send_us } else { 0.0 },
                send_attribution: send_attribution.clone(),
            }
        })
        .collect();
    let ranks = plan
        .stages
        .iter()
        .map(|s| {
            let sync = b.cost(&s.grad_sync, &whole, false);
            let of_class = |class: Class| {
                let calls: Vec<Call> = s
                    .update
                    .iter()
                    .filter(|c| c.class == class)
                    .cloned()
                    .collect();
                b.cost(&calls, &whole, false)
            };
            let optimizer = of_class(Class::Optimizer);
            let gather = of_class(Class::DpComm);
            RankWork {
                grad_sync_us: sync.parts.total(),
                param_gather_us: gather.parts.dp_comm,
                optimizer_us: optimizer.parts.optimizer,
                optimizer_issue_us: optimizer.issue_us + gather.issue_us,
                params: s.params,
                bucket_elements: layout.dp_bucket_elements,
                grad_sync_attribution: sync.attribution,
                param_gather_attribution: gather.attribution,
                optimizer_attribution: optimizer.attribution,
            }
        })
        .collect();
    PipelineWork {
        schedule: layout.schedule,
        micro_batches: layout.micro_batches as usize,
        chunks,
        ranks,
        overlap: layout.overlap,
        host: Host {
            launch_us: times.runtime.launch_us,
            sync_per_transfer: times.runtime.host_sync_per_transfer && plan.send.is_some(),
            step_overhead_us: times.runtime.step_overhead_ms * 1e3,
        },
        factors: if times.attribute { times.factors } else { 0 },
    }
}

/// Per-stage times: a rank's chunks' passes for one micro-batch (block by block, with the
/// layout's tensor-parallel overlap and the host's waits inside a repetition, the
/// weight-gradient pass of a split schedule in the backward) and their pipeline transfers,
/// and the rank's per-step work. The simulator runs these passes and the closed form takes
/// its slowest stages from them, so the per-stage report shows what either step is made of.
pub fn stage_timings(work: &PipelineWork) -> Vec<StageTiming> {
    work.ranks
        .iter()
        .enumerate()
        .map(|(index, rank)| {
            let (mut fwd, mut bwd) = (ClassTimes::default(), ClassTimes::default());
            let (mut fwd_from, mut bwd_from) = (Attribution::default(), Attribution::default());
            for chunk in work.chunks.iter().filter(|c| c.rank == index) {
                for (times, from, passes, sent) in [
                    (&mut fwd, &mut fwd_from, vec![&chunk.fwd], chunk.send_fwd_us),
                    (
                        &mut bwd,
                        &mut bwd_from,
                        vec![&chunk.bwd, &chunk.wgrad],
                        chunk.send_bwd_us,
                    ),
                ] {
                    for pass in passes {
                        *times = times.plus(&pass.parts);
                        for s in &pass.segments {
                            from.add_scaled(&s.attribution, s.repeat as f64);
                        }
                    }
                    if sent > 0.0 {
                        times.pp_comm += sent;
                        from.add_scaled(&chunk.send_attribution, 1.0);
                    }
                }
            }
            let mut update_from = rank.optimizer_attribution.clone();
            update_from.add_scaled(&rank.param_gather_attribution, 1.0);
            StageTiming {
                index,
                fwd_us: fwd.total(),
                bwd_us: bwd.total(),
                fwd_parts: fwd,
                bwd_parts: bwd,
                grad_sync_us: rank.grad_sync_us,
                optimizer_us: rank.optimizer_us,
                param_gather_us: rank.param_gather_us,
                attribution: [
                    fwd_from,
                    bwd_from,
                    rank.grad_sync_attribution.clone(),
                    update_from,
                ],
            }
        })
        .collect()
}

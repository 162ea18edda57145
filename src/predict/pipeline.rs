//! From a plan and per-query times to the pipeline simulator's input: each model chunk's passes
//! as segments (embedding, its layers, the head), the backward split into input- and
//! weight-gradient parts where the schedule asks for it, the hidden share of tensor-parallel
//! communication taken out, and every duration's attribution to cost factors; and from those
//! passes each stage's times, which the stage report shows and the closed form composes.

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
        order: None,
    }
    .with_fixed_order()
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
                let sends = (chunk.send_fwd_us, &chunk.send_attribution);
                add_passes(&mut fwd, &mut fwd_from, &[&chunk.fwd], sends);
                let sends = (chunk.send_bwd_us, &chunk.send_attribution);
                add_passes(&mut bwd, &mut bwd_from, &[&chunk.bwd, &chunk.wgrad], sends);
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

/// Adds passes' times and attributions (each segment as often as it repeats), and a
/// transfer's where the chunk sends one.
fn add_passes(
    times: &mut ClassTimes,
    from: &mut Attribution,
    passes: &[&PassWork],
    (sent_us, sent_from): (f64, &Attribution),
) {
    for pass in passes {
        *times = times.plus(&pass.parts);
        for s in &pass.segments {
            from.add_scaled(&s.attribution, s.repeat as f64);
        }
    }
    if sent_us > 0.0 {
        times.pp_comm += sent_us;
        from.add_scaled(sent_from, 1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::{dgx_h100_without_models as cluster, Runtime};
    use crate::ops::OpQuery;
    use crate::predict::compose::cost;
    use crate::workload::{Arch, ParallelSpec, Schedule};

    fn spec(tp: u64, pp: u64, dp: u64) -> ParallelSpec {
        ParallelSpec {
            tp: Some(tp),
            pp: Some(pp),
            dp: Some(dp),
            micro_batch: Some(1),
            micro_batches: Some(4),
            ..Default::default()
        }
    }

    fn planned(arch: &Arch, s: &ParallelSpec) -> (Plan, Layout) {
        let c = cluster();
        let layout = Layout::new(s, arch, &c).unwrap();
        (Plan::new(arch, &layout, &c), layout)
    }

    /// Query times from `us`, composed under `runtime`.
    fn timed(plan: &Plan, us: impl Fn(&OpQuery) -> f64, runtime: Runtime) -> QueryTimes {
        let t: Vec<f64> = plan.queries.iter().map(us).collect();
        QueryTimes::new(plan, &t, vec![0; t.len()], 1, false, runtime)
    }

    /// Collectives 1,000 µs, every other kernel 1 µs: communication no compute can cover.
    fn slow_collectives(q: &OpQuery) -> f64 {
        if q.op.is_collective() {
            1000.0
        } else {
            1.0
        }
    }

    fn segment(pass: &PassWork, kind: SegmentKind) -> &Segment {
        pass.segments.iter().find(|s| s.kind == kind).unwrap()
    }

    /// ZB-H1's weight-gradient pass holds half of each weighted GEMM's backward (its
    /// weight-gradient GEMM), the embedding's whole backward and FSDP's gradient
    /// reduce-scatter; the input-gradient pass everything else, the sequence-parallel
    /// reduce-scatter among it. Together they are the unsplit backward.
    #[test]
    fn a_split_backward_puts_weight_gradients_and_their_reduction_in_the_w_pass() {
        let arch = Arch::resolve("llama2-7b").unwrap();
        let split = |tp: u64| ParallelSpec {
            schedule: Some(Schedule::ZbH1),
            sequence_parallel: Some(tp > 1),
            zero: Some(3),
            ..spec(tp, 1, 4)
        };
        // and with attention's unfused score GEMMs, which have no weights
        let mut unfused = arch.clone();
        unfused.attention = crate::workload::AttentionImpl::Unfused;
        for (arch, tp) in [(&arch, 1), (&arch, 2), (&unfused, 1)] {
            let (plan, layout) = planned(arch, &split(tp));
            let times = timed(&plan, |_| 10.0, Runtime::isolated());
            the_passes_split_the_backward(&plan, &layout, &times);
        }
        // with the collectives too long to hide: the FSDP reduce-scatter's excess shows in W
        // alone, the TP reduce-scatters in B alone
        let (plan, layout) = planned(&arch, &split(2));
        let times = timed(&plan, slow_collectives, Runtime::isolated());
        let work = pipeline_work(&plan, &layout, &times);
        let w_pass = &work.chunks[0].wgrad.parts;
        let b_pass = &work.chunks[0].bwd.parts;
        assert_eq!(w_pass.tp_comm, 0.0, "{w_pass:?}");
        // (B's data-parallel time is FSDP's parameter all-gather)
        assert!(w_pass.dp_comm > 900.0, "{w_pass:?}");
        assert!(b_pass.tp_comm > 0.0, "{b_pass:?}");
    }

    /// The layer's W segment is its weight-gradient GEMMs (the FSDP reduce-scatter hiding
    /// beside them), B and W together the unsplit backward, and the embedding's backward W's.
    fn the_passes_split_the_backward(plan: &Plan, layout: &Layout, times: &QueryTimes) {
        let work = pipeline_work(plan, layout, times);
        let [chunk] = work.chunks.as_slice() else {
            panic!("one chunk")
        };
        let (b, w) = (
            segment(&chunk.bwd, SegmentKind::Layer),
            segment(&chunk.wgrad, SegmentKind::Layer),
        );
        // the layer's weight-gradient GEMMs, worked from its backward list: half of each
        // projection's (an unfused attention's score and context GEMMs multiply activations)
        let weighted = |c: &&Call| {
            let projection = matches!(c.label, "qkv" | "attention out" | "mlp up" | "mlp down");
            projection && plan.query(c).op == OpKind::Gemm
        };
        assert_eq!(plan.layer.bwd.iter().filter(weighted).count(), 4);
        let wgrad: f64 = plan
            .layer
            .bwd
            .iter()
            .filter(weighted)
            .map(|c| 0.5 * times.of(c.query) * c.count)
            .sum();
        assert!(wgrad > 0.0);
        // (the FSDP reduce-scatter, 10 µs, hides beside them)
        assert!((w.us - wgrad).abs() < 1e-9 * wgrad, "{} {wgrad}", w.us);
        // with the recomputation B runs first, the unsplit backward
        let unsplit = cost(
            plan.layer
                .recompute
                .iter()
                .chain(&plan.layer.bwd)
                .map(|c| (c, 1.0)),
            times,
            &whole,
            false,
        )
        .parts
        .total();
        assert!(
            (b.us + w.us - unsplit).abs() < 1e-9 * unsplit,
            "{} + {} vs {unsplit}",
            b.us,
            w.us
        );
        // the embedding's backward is all weight gradient
        assert_eq!(segment(&chunk.bwd, SegmentKind::Embedding).us, 0.0);
        assert!(segment(&chunk.wgrad, SegmentKind::Embedding).us > 0.0);
    }

    /// A runtime that takes `launch` µs to issue a kernel or a collective, isolated otherwise.
    fn launching(launch: f64) -> Runtime {
        Runtime {
            launch_us: launch,
            collective_launch_us: 2.0 * launch,
            ..Runtime::isolated()
        }
    }

    /// A backward segment issues its recomputation and its own calls, and hides the
    /// tensor-parallel communication of both, once per layer it repeats.
    #[test]
    fn a_segment_counts_its_recomputation_and_its_own_calls() {
        let arch = Arch::resolve("llama2-7b").unwrap();
        let s = ParallelSpec {
            sequence_parallel: Some(true),
            tp_comm_overlap: Some(true),
            recompute: Some(crate::workload::Recompute::Full),
            ..spec(2, 2, 2)
        };
        let (plan, layout) = planned(&arch, &s);
        let times = timed(&plan, |_| 10.0, launching(5.0));
        let work = pipeline_work(&plan, &layout, &times);
        let first = &work.chunks[0];
        let layer = segment(&first.bwd, SegmentKind::Layer);
        let of = |calls: &[Call]| cost(calls.iter().map(|c| (c, 1.0)), &times, &whole, true);
        let (own, rc) = (of(&plan.layer.bwd), of(&plan.layer.recompute));
        assert!(own.issue_us > 0.0 && rc.issue_us > 0.0);
        assert_eq!(layer.issue_us, own.issue_us + rc.issue_us);
        assert_eq!(layer.recompute_us, rc.parts.total());
        // the first stage's embedding holds no GEMM to hide a collective behind
        assert!(own.hidden_tp_us > 0.0 && rc.hidden_tp_us > 0.0);
        let layers = layer.repeat as f64;
        assert!(layers > 1.0);
        assert_eq!(
            first.bwd.hidden_tp_us,
            (own.hidden_tp_us + rc.hidden_tp_us) * layers
        );
    }

    /// Where the host waits for the device inside a layer (an expert layer's token counts),
    /// neither runs ahead: a host-bound layer takes the host's cycle, which both its time and
    /// its issue time then are, the device idle for the difference.
    #[test]
    fn a_host_bound_layer_that_waits_takes_the_hosts_cycle() {
        let arch = crate::workload::presets::mixtral_8x7b();
        let s = ParallelSpec {
            ep: Some(8),
            moe_imbalance: Some(1.0),
            ..spec(1, 1, 8)
        };
        let (plan, layout) = planned(&arch, &s);
        assert!(plan.layer.fwd.iter().any(|c| c.host_waits));
        let times = timed(&plan, |_| 1.0, launching(100.0));
        let work = pipeline_work(&plan, &layout, &times);
        let layer = segment(&work.chunks[0].fwd, SegmentKind::Layer);
        let alone = cost(
            plan.layer.fwd.iter().map(|c| (c, 1.0)),
            &times,
            &whole,
            false,
        );
        let device = alone.parts.total();
        assert!(layer.issue_us > alone.issue_us, "{layer:?}");
        assert!(layer.us > device + 1000.0, "{} {device}", layer.us);
        assert!(
            (layer.us - layer.issue_us).abs() < 1e-9 * layer.us,
            "{layer:?}"
        );
        let host = work.chunks[0].fwd.parts.host;
        assert!(
            (host - (layer.us - device) * layer.repeat as f64).abs() < 1e-9 * host,
            "{host}"
        );
    }

    /// A rank's per-step work: its optimizer's and parameter all-gather's host time, and the
    /// runtime's per-step overhead (ms to µs) and transfer synchronisation, the latter only
    /// where there are transfers.
    #[test]
    fn a_rank_issues_its_update_and_the_host_syncs_only_where_stages_send() {
        let arch = Arch::resolve("llama2-7b").unwrap();
        let s = ParallelSpec {
            zero: Some(1),
            ..spec(1, 2, 4)
        };
        let (plan, layout) = planned(&arch, &s);
        let runtime = Runtime {
            step_overhead_ms: 2.5,
            host_sync_per_transfer: true,
            ..launching(5.0)
        };
        let times = timed(&plan, |_| 10.0, runtime);
        let work = pipeline_work(&plan, &layout, &times);
        let update = &plan.stages[0].update;
        let issue = |class: Class| {
            let calls: Vec<&Call> = update.iter().filter(|c| c.class == class).collect();
            cost(calls.into_iter().map(|c| (c, 1.0)), &times, &whole, false).issue_us
        };
        let (optimizer, gather) = (issue(Class::Optimizer), issue(Class::DpComm));
        assert!(optimizer > 0.0 && gather > 0.0);
        assert_eq!(work.ranks[0].optimizer_issue_us, optimizer + gather);
        assert_eq!(work.host.step_overhead_us, 2500.0);
        assert!(work.host.sync_per_transfer);
        // one stage sends nothing, so the host never waits on a transfer
        let (plan, layout) = planned(&arch, &spec(1, 1, 8));
        let times = timed(&plan, |_| 10.0, runtime);
        assert!(!pipeline_work(&plan, &layout, &times).host.sync_per_transfer);
    }
}

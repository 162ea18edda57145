//! From a decomposition and per-call times to the pipeline simulator's input: each model chunk's
//! passes as segments (embedding, its layers, the head), the backward split into input- and
//! weight-gradient parts where the schedule asks for it, the hidden share of tensor-parallel
//! communication taken out.

use super::compose::{serial_share, ClassTimes};
use super::decompose::{Decomposition, OpCall};
use crate::ops::{OpKind, Phase, Role};
use crate::schedule::{ChunkWork, PassWork, PipelineWork, RankWork, Segment, SegmentKind};
use crate::workload::Layout;

/// Share of a backward call that computes input gradients (the rest: weight gradients). A
/// linear layer's backward is two GEMMs of equal FLOPs, dgrad and wgrad; the embedding's
/// backward is all weight gradient; FSDP's gradient reduce-scatter follows the weight
/// gradients; everything else (attention, norms, activations, TP collectives) is on the
/// input-gradient path.
fn input_grad_share(op: &OpCall) -> f64 {
    let weights = matches!(
        op.query.role,
        Some(Role::Qkv | Role::AttnOut | Role::MlpUp | Role::MlpDown | Role::LmHead)
    );
    match op.query.op {
        OpKind::Gemm if op.query.phase == Phase::Bwd && weights => 0.5,
        OpKind::Embedding if op.query.phase == Phase::Bwd => 0.0,
        OpKind::ReduceScatter if op.overlapped => 0.0,
        _ => 1.0,
    }
}

/// Exposed time (tensor-parallel communication reduced by the hidden fraction) and the hidden
/// part.
fn exposed(t: ClassTimes, tp_hidden: f64) -> (ClassTimes, f64) {
    let hidden = t.tp_comm * tp_hidden;
    (
        ClassTimes {
            tp_comm: t.tp_comm - hidden,
            ..t
        },
        hidden,
    )
}

/// Which part (0–1) of a call a pass computes.
type Share = dyn Fn(&OpCall) -> f64;

pub fn pipeline_work(
    d: &Decomposition,
    layout: &Layout,
    time_of: &dyn Fn(&OpCall) -> f64,
) -> PipelineWork {
    let parts = &d.parts;
    let split = layout.schedule.splits_backward();
    let hidden_tp = layout.overlap.tp_fraction;
    let placement = layout.virtual_stage_ranks();
    let n = placement.len();

    // one segment: `share` of each call of `ops` (after `recompute` in full), `repeat` times
    let segment = |pass: &mut PassWork,
                   kind: SegmentKind,
                   repeat: u64,
                   ops: &[OpCall],
                   recompute: &[OpCall],
                   params: u64,
                   share: &dyn Fn(&OpCall) -> f64| {
        if repeat == 0 {
            return;
        }
        let (rc, rc_hidden) = exposed(serial_share(recompute, time_of, &|_| 1.0), hidden_tp);
        let (t, hidden) = exposed(serial_share(ops, time_of, share), hidden_tp);
        let t = t.plus(&rc);
        pass.segments.push(Segment {
            kind,
            repeat,
            us: t.total(),
            recompute_us: rc.total(),
            params,
        });
        pass.parts = pass.parts.plus(&t.scaled(repeat as f64));
        pass.hidden_tp_us += (hidden + rc_hidden) * repeat as f64;
    };
    let all = |_: &OpCall| 1.0;
    let input = |op: &OpCall| input_grad_share(op);
    let weight = |op: &OpCall| 1.0 - input_grad_share(op);

    let mut chunks = Vec::with_capacity(n);
    let mut first_layer = 0;
    for (vs, &rank) in placement.iter().enumerate() {
        let layers = layout.chunk_layers(rank);
        let (embedding, head) = (vs == 0, vs + 1 == n);
        let mut fwd = PassWork::default();
        if embedding {
            segment(
                &mut fwd,
                SegmentKind::Embedding,
                1,
                &parts.embedding_fwd,
                &[],
                parts.embedding_params,
                &all,
            );
        }
        segment(
            &mut fwd,
            SegmentKind::Layer,
            layers,
            &parts.layer_fwd,
            &[],
            parts.layer_params,
            &all,
        );
        if head {
            segment(
                &mut fwd,
                SegmentKind::Head,
                1,
                &parts.head_fwd,
                &[],
                parts.head_params,
                &all,
            );
        }
        // the backward in reverse model order
        let mut bwd = PassWork::default();
        let mut wgrad = PassWork::default();
        let passes: Vec<(&mut PassWork, &Share, bool)> = if split {
            vec![(&mut bwd, &input, false), (&mut wgrad, &weight, true)]
        } else {
            vec![(&mut bwd, &all, true)]
        };
        for (pass, share, completes_gradients) in passes {
            let params = |p: u64| if completes_gradients { p } else { 0 };
            // the recomputed forward runs first in each layer, on the input-gradient path
            let recompute: &[OpCall] = if split && completes_gradients {
                &[]
            } else {
                &parts.layer_recompute
            };
            if head {
                segment(
                    pass,
                    SegmentKind::Head,
                    1,
                    &parts.head_bwd,
                    &[],
                    params(parts.head_params),
                    share,
                );
            }
            segment(
                pass,
                SegmentKind::Layer,
                layers,
                &parts.layer_bwd,
                recompute,
                params(parts.layer_params),
                share,
            );
            if embedding {
                segment(
                    pass,
                    SegmentKind::Embedding,
                    1,
                    &parts.embedding_bwd,
                    &[],
                    params(parts.embedding_params),
                    share,
                );
            }
        }
        let send = parts.send.as_ref().map_or(0.0, time_of);
        let other_rank = |k: usize| placement.get(k).is_some_and(|&r| r != rank);
        chunks.push(ChunkWork {
            rank,
            first_layer,
            fwd,
            bwd,
            wgrad,
            send_fwd_us: if other_rank(vs + 1) { send } else { 0.0 },
            send_bwd_us: if vs > 0 && other_rank(vs - 1) {
                send
            } else {
                0.0
            },
        });
        first_layer += layers;
    }
    let ranks = d
        .stages
        .iter()
        .map(|s| {
            let sync = serial_share(&s.grad_sync, time_of, &all);
            let update = serial_share(&s.update, time_of, &all);
            RankWork {
                grad_sync_us: sync.total(),
                param_gather_us: update.dp_comm,
                optimizer_us: update.optimizer,
                params: s.params,
                bucket_elements: layout.dp_bucket_elements,
            }
        })
        .collect();
    PipelineWork {
        schedule: layout.schedule,
        micro_batches: layout.micro_batches as usize,
        chunks,
        ranks,
        overlap: layout.overlap,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::predict::compose_step;
    use crate::predict::decompose::decompose;
    use crate::workload::{Arch, ParallelSpec, Recompute, Schedule};
    use proptest::prelude::*;

    use crate::hardware::dgx_h100_without_models as cluster;

    /// Deterministic made-up times: kernels 1–1000 µs by a hash of the query, collectives
    /// growing with their size; `send` µs for a pipeline transfer, and the first stage's extra
    /// backward and the last stage's extra forward set to `send` too, so that every stage's
    /// forward and backward (transfers included) take the same time.
    fn balanced_time(op: &OpCall, send: f64) -> f64 {
        use std::hash::{Hash, Hasher};
        match op.label {
            "pp send/recv" => send,
            "embedding" if op.query.phase == Phase::Bwd => send,
            "final norm" if op.query.phase == Phase::Fwd => send,
            "embedding" | "embedding all-reduce" | "final norm" | "lm head" | "cross-entropy" => {
                0.0
            }
            _ => match op.query.shape {
                crate::ops::Shape::Collective(c) => 5.0 + c.bytes as f64 / 2e5,
                _ => {
                    let mut h = std::collections::hash_map::DefaultHasher::new();
                    op.query.hash(&mut h);
                    1.0 + (h.finish() % 1000) as f64
                }
            },
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// With balanced stages and nothing overlapped the simulated 1F1B step is the paper's
        /// closed form, to rounding.
        #[test]
        fn balanced_one_f_one_b_equals_the_closed_form(
            model in prop::sample::select(vec!["llama2-7b", "llama2-13b", "gpt3-15b", "llama3-70b"]),
            tp in prop::sample::select(vec![1u64, 2, 4, 8]),
            pp in prop::sample::select(vec![1u64, 2, 4, 8]),
            dp in 1u64..5, mb in 1u64..3, m in 1u64..24,
            zero in 0u8..2,
            recompute in prop::sample::select(vec![Recompute::None, Recompute::Selective, Recompute::Full]),
            send in 0.0f64..500.0,
        ) {
            let c = cluster();
            let arch = Arch::resolve(model).unwrap();
            let spec = ParallelSpec {
                tp: Some(tp), pp: Some(pp), dp: Some(dp), micro_batch: Some(mb),
                micro_batches: Some(m), zero: Some(zero), recompute: Some(recompute),
                schedule: Some(Schedule::OneFOneB),
                overlap_grad_reduce: Some(false), overlap_param_gather: Some(false),
                overlap_p2p: Some(false),
                ..Default::default()
            };
            let Ok(mut layout) = Layout::new(&spec, &arch, &c) else { return Ok(()) };
            prop_assume!(arch.layers % pp == 0);
            let d = decompose(&arch, &layout, &c);
            let time_of = |op: &OpCall| balanced_time(op, send);
            let (simulated, timeline) = compose_step(&d, &layout, &time_of).unwrap();
            prop_assert!(timeline.is_some());
            layout.schedule = Schedule::ClosedForm;
            let (closed, _) = compose_step(&d, &layout, &time_of).unwrap();
            let rel = (simulated.step_us - closed.step_us).abs() / closed.step_us;
            prop_assert!(rel < 1e-9, "simulated {} closed form {}", simulated.step_us, closed.step_us);
            let (a, b) = (simulated.breakdown_us, closed.breakdown_us);
            prop_assert!((a.bubble - b.bubble).abs() < 1e-6 * closed.step_us, "{:?} {:?}", a, b);
            prop_assert!((a.total() - simulated.step_us).abs() < 1e-6 * closed.step_us);
        }
    }
}

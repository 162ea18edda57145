//! What a step time means for a run: throughput, model FLOP/s and MFU — computed in one place
//! for `predict` and `search`.

use serde::Serialize;

use crate::hardware::Cluster;
use crate::plan::Plan;
use crate::timing::Breakdown;
use crate::workload::Layout;

/// A step's time and what follows from it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StepMetrics {
    /// Seconds per step.
    pub step_time_s: f64,
    /// Tokens per step over all replicas.
    pub tokens_per_step: u64,
    /// Tokens per second over all GPUs.
    pub tokens_per_s: f64,
    /// Tokens per second per GPU.
    pub tokens_per_s_per_gpu: f64,
    /// Model FLOPs (no recomputation) per second per GPU, in TFLOP/s.
    pub model_tflops_per_gpu: f64,
    /// Model FLOP/s over the GPU's dense peak for the training type, in percent.
    pub mfu_percent: f64,
    /// Pipeline bubble over busy pipeline time ((pp − 1)/m for balanced 1F1B).
    pub bubble_ratio: f64,
}

impl StepMetrics {
    /// The metrics of a step of `step_us` with this breakdown.
    pub fn new(
        step_us: f64,
        breakdown_us: &Breakdown,
        plan: &Plan,
        layout: &Layout,
        cluster: &Cluster,
    ) -> StepMetrics {
        let step_s = step_us / 1e6;
        let tokens = layout.tokens_per_step();
        let flops_per_gpu = plan.model_flops_per_step / layout.world as f64 / step_s;
        StepMetrics {
            step_time_s: step_s,
            tokens_per_step: tokens,
            tokens_per_s: tokens as f64 / step_s,
            tokens_per_s_per_gpu: tokens as f64 / step_s / layout.world as f64,
            model_tflops_per_gpu: flops_per_gpu / 1e12,
            mfu_percent: 100.0 * flops_per_gpu / cluster.spec.gpu.peak_flops(layout.dtype),
            bubble_ratio: breakdown_us.bubble_ratio(),
        }
    }
}

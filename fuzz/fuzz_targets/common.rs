//! What every target checks once an input passed: a prediction is finite, positive and
//! physical.

#![allow(dead_code)]

use stepcast::hardware::Cluster;
use stepcast::predict::cost::CostModel;
use stepcast::predict::{predict, PredictOptions};
use stepcast::workload::{Arch, Layout, ParallelSpec};

/// The shipped DGX H100 cluster file, without models.
pub fn dgx_h100() -> Cluster {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../hardware-profiles/dgx-h100.yaml");
    let mut c = Cluster::load(std::path::Path::new(path)).expect("the shipped cluster file");
    c.models_dir = None;
    c
}

/// Predicts `arch` under `spec` on `cluster` (roofline and analytic costs); when the layout is
/// valid, the step must be finite and positive and the MFU below 100 %.
pub fn check(arch: &Arch, spec: &ParallelSpec, cluster: &Cluster) {
    let Ok(layout) = Layout::new(spec, arch, cluster) else {
        return;
    };
    let cost = CostModel::new(cluster, None);
    if let Ok(p) = predict(arch, &layout, cluster, &cost, PredictOptions::default()) {
        let m = p.metrics;
        assert!(m.step_time_s.is_finite() && m.step_time_s > 0.0, "{m:?}");
        assert!(m.mfu_percent.is_finite() && m.mfu_percent < 100.0, "{m:?}");
        assert!(p.interval_s[0] <= m.step_time_s && m.step_time_s <= p.interval_s[1]);
        assert!(p.memory.ranks.iter().all(|r| r.total_gib.is_finite()));
    }
}

/// A small model on whatever GPUs a cluster has.
pub fn predict_small(cluster: &Cluster) {
    let arch = Arch::resolve("llama2-7b").expect("preset");
    let gpus = cluster.total_gpus().min(8);
    let spec = ParallelSpec {
        dp: Some(gpus),
        micro_batch: Some(1),
        global_batch: Some(gpus * 4),
        seq_len: Some(1024),
        ..Default::default()
    };
    check(&arch, &spec, cluster);
}

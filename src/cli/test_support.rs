//! What the command modules' unit tests share: the DGX H100 file without its trained models
//! (every estimate roofline or analytic, so tests need no models and stay fast) and a layout
//! of eight micro-batches of one.

use std::path::Path;

use stepcast::hardware::Cluster;
use stepcast::predict::cost::CostModel;
use stepcast::predict::{predict, PredictOptions, Prediction};
use stepcast::workload::{Arch, Layout, ParallelSpec, Schedule};

/// The shipped DGX H100 cluster file with no models directory.
pub fn dgx_h100() -> Cluster {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cluster = Cluster::load(&dir.join("hardware-profiles/dgx-h100.yaml")).unwrap();
    cluster.models_dir = None;
    cluster
}

/// tp · pp · dp with eight micro-batches of one under `schedule`.
pub fn spec(tp: u64, pp: u64, dp: u64, schedule: Schedule) -> ParallelSpec {
    ParallelSpec {
        tp: Some(tp),
        pp: Some(pp),
        dp: Some(dp),
        micro_batch: Some(1),
        micro_batches: Some(8),
        schedule: Some(schedule),
        ..Default::default()
    }
}

/// `model` (a preset) under `spec`, checked, with the prediction on `dgx_h100()`.
pub fn predicted(model: &str, spec: ParallelSpec) -> (Arch, Layout, Prediction) {
    let cluster = dgx_h100();
    let arch = Arch::resolve(model).unwrap();
    let layout = Layout::new(&spec, &arch, &cluster).unwrap();
    let cost = CostModel::new(&cluster, None);
    let p = predict(&arch, &layout, &cluster, &cost, PredictOptions::default()).unwrap();
    (arch, layout, p)
}

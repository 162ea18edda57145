//! What the command modules' unit tests share: the DGX H100 file without its trained models
//! (every estimate roofline or analytic, so tests need no models and stay fast), a layout of
//! eight micro-batches of one, and a tiny model for host-bound steps.

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
    predicted_arch(Arch::resolve(model).unwrap(), spec)
}

/// Llama 2 7B shrunk to 4 layers of width 256: a model whose kernels are shorter than the
/// host takes to issue them.
pub fn tiny() -> Arch {
    let mut spec = stepcast::workload::presets::preset("llama2-7b").unwrap();
    spec.name = "tiny".into();
    (spec.layers, spec.hidden, spec.heads, spec.kv_heads) = (4, 256, 4, Some(4));
    spec.ffn_hidden = Some(1024);
    spec.validate("tiny").unwrap()
}

/// `arch` under `spec`, checked, with the prediction on `dgx_h100()`.
pub fn predicted_arch(arch: Arch, spec: ParallelSpec) -> (Arch, Layout, Prediction) {
    let cluster = dgx_h100();
    let layout = Layout::new(&spec, &arch, &cluster).unwrap();
    let cost = CostModel::new(&cluster, None);
    let p = predict(&arch, &layout, &cluster, &cost, PredictOptions::default()).unwrap();
    (arch, layout, p)
}

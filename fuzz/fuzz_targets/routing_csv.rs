//! An expert routing CSV: parsed and checked against a small mixture of experts, never a
//! panic; a file that fits the model predicts a step at the loads it gives.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use stepcast::predict::cost::CostModel;
use stepcast::predict::{predict, PredictOptions};
use stepcast::workload::{Arch, ArchSpec, ExpertRouting, Layout, ParallelSpec};

#[path = "common.rs"]
mod common;

/// Four layers, the first dense, of 8 experts with top-2 routing.
const MODEL: &str = "name: tiny-moe\nlayers: 4\nhidden: 512\nheads: 8\nffn_hidden: 1024\n\
                     vocab: 32000\nnorm: rmsnorm\nactivation: swiglu\nseq_len: 512\n\
                     moe: {experts: 8, top_k: 2, expert_ffn: 256, dense_layers: 1}\n";

fuzz_target!(|data: &[u8]| {
    let Ok(routing) = ExpertRouting::parse(Path::new("fuzz.csv"), data) else {
        return;
    };
    let arch: Arch = ArchSpec::parse_yaml(Path::new("m.yaml"), MODEL)
        .and_then(|s| s.validate("m.yaml"))
        .expect("the fuzz model");
    let cluster = common::dgx_h100();
    for ep in [1, 2, 8] {
        let spec = ParallelSpec {
            dp: Some(8),
            ep: Some(ep),
            micro_batch: Some(1),
            global_batch: Some(16),
            moe_capacity_factor: (ep == 2).then_some(1.25),
            ..Default::default()
        };
        let layout = Layout::new(&spec, &arch, &cluster).expect("a valid layout");
        let Ok(layout) = layout.with_routing(&routing, &arch) else {
            return;
        };
        // no rank gets more than experts / top-k times its share
        assert!(layout
            .layer_loads
            .iter()
            .all(|&f| f.is_finite() && (0.0..=4.0 + 1e-9).contains(&f)));
        let cost = CostModel::new(&cluster, None);
        let p = predict(&arch, &layout, &cluster, &cost, PredictOptions::default())
            .expect("a routed layout predicts");
        assert!(p.metrics.step_time_s.is_finite() && p.metrics.step_time_s > 0.0);
        assert!(p.metrics.mfu_percent < 100.0);
    }
});

//! A `stepcast bench` plan file: parsed and checked, never a panic; a plan that passes expands
//! into a bounded set of points.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use stepcast_profiler::plan::{PlanSpec, Target};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(spec) = PlanSpec::parse(Path::new("plan.yaml"), text) else {
        return;
    };
    let target = Target {
        gpus_per_node: 8,
        nodes: 2,
        fp8: true,
    };
    if let Ok(plan) = spec.expand(target) {
        assert!(plan.points.len() < 10_000_000);
    }
});

//! A YAML architecture file: parsed and checked, never a panic; an architecture that passes
//! predicts a step on 8 GPUs.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use stepcast::workload::{ArchSpec, ParallelSpec};

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(spec) = ArchSpec::parse_yaml(Path::new("fuzz.yaml"), text) else {
        return;
    };
    let Ok(arch) = spec.validate("fuzz.yaml") else {
        return;
    };
    let layout = ParallelSpec {
        dp: Some(8),
        micro_batch: Some(1),
        global_batch: Some(16),
        seq_len: Some(512),
        ..Default::default()
    };
    common::check(&arch, &layout, &common::dgx_h100());
});

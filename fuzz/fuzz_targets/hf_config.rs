//! A Hugging Face config.json: read, never a panic; a config that passes predicts a step.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use stepcast::workload::hf::from_config_str;
use stepcast::workload::ParallelSpec;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(spec) = from_config_str(Path::new("config.json"), text) else {
        return;
    };
    let Ok(arch) = spec.validate("config.json") else {
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

//! A cluster file: parsed and checked, never a panic; a file that passes predicts a step.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;
use stepcast::hardware::{Cluster, ClusterSpec};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(spec) = ClusterSpec::parse(Path::new("fuzz.yaml"), text) else {
        return;
    };
    let cluster = Cluster {
        path: "fuzz.yaml".into(),
        spec,
        models_dir: None,
        builtin_models: None,
        transfer_dirs: Vec::new(),
        collectives_dir: None,
        digest: None,
    };
    common::predict_small(&cluster);
});

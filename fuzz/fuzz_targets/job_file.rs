//! A job file's parallel section (YAML): every layout it can express is either refused with a
//! message or predicted — finite, positive, physical — on the DGX H100 cluster file.
#![no_main]

use std::path::Path;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use stepcast::hardware::Cluster;
use stepcast::workload::{Arch, ParallelSpec};

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    let cluster = CLUSTER.get_or_init(common::dgx_h100);
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // a model name on the first line, the parallel section after it
    let (model, rest) = text.split_once('\n').unwrap_or(("llama2-7b", text));
    let Ok(arch) = Arch::resolve(model.trim()) else {
        return;
    };
    let Ok(spec) = stepcast::fsutil::parse_yaml::<ParallelSpec>(Path::new("job.yaml"), rest) else {
        return;
    };
    // keep a single run short: huge step counts are refused by the limits, large ones are slow
    if spec.micro_batches.unwrap_or(0) > 4096 || spec.global_batch.unwrap_or(0) > 1 << 20 {
        return;
    }
    common::check(&arch, &spec, cluster);
});

//! A training log for `stepcast runs import` — Megatron-LM's output, or a Megatron-Bridge
//! configuration read beside it, NeMo 2's output and NeMo-Run task, or torchtitan's output and
//! job configuration: made into a runs-CSV row or refused with a message, never a panic; a row's
//! step is a finite, positive time.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stepcast::calibrate::megatron_log::{args_of_bridge_config, import, parse, ImportOptions};
use stepcast::calibrate::{nemo_log, torchtitan_log};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let options = ImportOptions {
        set: "fuzz".into(),
        family: None,
        cluster: "dgx-h100".into(),
        model: None,
        warmup_iterations: 0,
    };
    let mut log = parse(text);
    if let Ok(run) = import(&log, &options) {
        assert!(run.step_ms.is_finite() && run.step_ms > 0.0);
    }
    // the same text as a Bridge configuration, the log's intervals beside it
    if let Ok(args) = args_of_bridge_config(text, 8) {
        log.args = args;
        if let Ok(run) = import(&log, &options) {
            assert!(run.step_ms.is_finite() && run.step_ms > 0.0);
        }
    }
    // the same text as NeMo 2's log, and as its task configuration beside it
    let steps = nemo_log::parse(text);
    for gpus in [None, Some(8)] {
        let resolve = |m: &str| stepcast::workload::Arch::resolve(m).map_err(|e| e.to_string());
        let Ok(task) = nemo_log::task(text, gpus, None, resolve) else {
            continue;
        };
        if let Ok(run) = nemo_log::import(&steps, &task, &options) {
            assert!(run.step_ms.is_finite() && run.step_ms > 0.0);
        }
    }
    // the same text as torchtitan's log, and as its job configuration beside it
    let titan = torchtitan_log::parse(text);
    if let Ok(config) = torchtitan_log::parse_config(text) {
        for gpus in [1, 8, 1 << 20] {
            let Ok(job) = torchtitan_log::job(&config, gpus, |_| Ok(32), &options) else {
                continue;
            };
            if let Ok(run) = torchtitan_log::import(&titan, &job) {
                assert!(run.step_ms.is_finite() && run.step_ms > 0.0);
            }
        }
    }
});

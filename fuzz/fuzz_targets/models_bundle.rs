//! A models file (`models.bin`: header, index and trees): opened or refused, never a panic or a
//! hang; every model it yields predicts a finite, positive time or is refused.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use stepcast::ops::{GemmShape, OpKind, OpQuery, Phase, Shape};
use stepcast::regress::bundle::Reader;

fuzz_target!(|data: &[u8]| {
    let Ok(reader) = Reader::from_bytes(Path::new("models.bin"), data.to_vec()) else {
        return;
    };
    for i in 0..reader.index.models.len().min(64) {
        let Ok(model) = reader.model(i) else {
            continue;
        };
        let q = OpQuery {
            op: OpKind::Gemm,
            phase: Phase::Fwd,
            dtype: model.key.dtype,
            role: None,
            shape: Shape::Gemm(GemmShape {
                m: 4096,
                n: 4096,
                k: 4096,
                batch: 1,
            }),
        };
        if model.key.op == OpKind::Gemm {
            // a forest walk always ends; a corrupt one yields NaN, which the cost model refuses
            let _ = model.predict(&q);
        }
    }
});

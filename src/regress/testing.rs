//! Small in-memory datasets for the unit tests of training and evaluation.

use std::path::PathBuf;

use crate::dataset::{Dataset, DatasetMeta, LayerContext, Measurement, Status};
use crate::hardware::GpuSpec;
use crate::ops::{Dtype, GemmShape, OpKind, OpQuery, Phase, Role, Shape, TokenShape};

/// A dataset named (and in a directory named) `unit-test`, measured on `gpu`, holding `rows`.
pub fn dataset(gpu: &GpuSpec, rows: Vec<Measurement>) -> Dataset {
    // JSON is YAML: the GPU as it serialises
    let meta: DatasetMeta = serde_norway::from_str(&format!(
        "schema_version: 1\nname: unit-test\ncollected_at: 2026-11-29\ngpu: {}\n\
         software: {{}}\nsource: {{description: unit test}}\n",
        serde_json::to_string(gpu).unwrap()
    ))
    .unwrap();
    Dataset {
        dir: PathBuf::from("unit-test"),
        meta,
        rows,
        fingerprint: String::new(),
    }
}

/// A forward fp16 call of `op` over `batch` × `seq` tokens of `width`.
pub fn tokens(op: OpKind, batch: u64, seq: u64, width: u64) -> OpQuery {
    OpQuery {
        op,
        phase: Phase::Fwd,
        dtype: Dtype::Fp16,
        role: None,
        shape: Shape::Tokens(TokenShape { batch, seq, width }),
    }
}

/// A forward fp16 GEMM of `role` (none: role-less), m × n × k.
pub fn gemm(role: Option<Role>, m: u64, n: u64, k: u64) -> OpQuery {
    OpQuery {
        op: OpKind::Gemm,
        phase: Phase::Fwd,
        dtype: Dtype::Fp16,
        role,
        shape: Shape::Gemm(GemmShape { m, n, k, batch: 1 }),
    }
}

/// `query` measured at `time_us`, without samples or a layer context.
pub fn measured(query: OpQuery, time_us: f64) -> Measurement {
    Measurement {
        query,
        context: LayerContext::default(),
        time_us,
        samples_us: Vec::new(),
        status: Status::Ok,
        throttled: false,
        note: String::new(),
    }
}

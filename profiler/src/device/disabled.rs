//! Stand-in for the CUDA device in a build without the `cuda` feature.

use super::{Device, Launch};

/// Nothing to do: NCCL is only loaded by the CUDA build.
pub fn ensure_nccl_loadable() {}

/// Nothing to remove: only the CUDA build makes a library-path shim.
pub fn remove_nccl_shim() {}

/// Always fails: this binary was built without CUDA support.
pub fn open(_gpus: Option<Vec<usize>>, _launch: Option<Launch>) -> anyhow::Result<Box<dyn Device>> {
    anyhow::bail!(stepcast::Error::Invalid(
        "this stepcast-bench was built without the `cuda` feature: rebuild it with \
         `cargo build --release -p stepcast-profiler --features cuda` (no CUDA toolkit is needed \
         to build; the libraries are loaded at run time)"
            .to_string()
    ))
}

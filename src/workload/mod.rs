//! What is trained and how it is split: model architectures and parallel layouts.

pub mod arch;
pub mod hf;
pub mod parallel;
pub mod pipeline_layout;
pub mod presets;
mod resolve;
pub mod routing;

pub use arch::{
    Activation, Arch, ArchSpec, AttentionImpl, CausalBlocks, MlaSpec, MoeSpec, NormKind, Position,
    QkNormSpan, DEFAULT_VOCAB_DIVISOR,
};
pub use parallel::{
    default_grad_reduce_dtype, AttentionKernel, CpComm, CrossEntropy, CudaGraphScope, Dispatcher,
    Elementwise, Fp8Library, Layout, Overlap, ParallelSpec, Partition, PipelineSplit, Recompute,
    RecomputeModule, Rules, Schedule,
};
pub use routing::ExpertRouting;

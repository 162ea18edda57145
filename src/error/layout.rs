//! Why a layout cannot run, one variant per rule: `workload::Layout::new` returns these, `predict`
//! prints them (each message says what to change), and `search` counts the layouts it skips
//! by variant, so the rules live in one place.

use thiserror::Error;

use crate::limits::{MAX_BUCKET_ELEMENTS, MIN_BUCKET_ELEMENTS};

#[derive(Debug, Clone, PartialEq, Error)]
pub enum LayoutError {
    #[error("{what} must be at least 1")]
    Zero { what: &'static str },

    #[error("{what} = {value} is beyond what any run uses: give at most {max}")]
    TooLarge {
        what: &'static str,
        value: u64,
        max: u64,
    },

    #[error(
        "tp·cp·pp·dp = {tp}·{cp}·{pp}·{dp} = {world} GPUs, but {cluster} has {gpus} ({nodes} \
         nodes × {gpus_per_node}): lower dp (at most {max_dp}), or give --nodes, or use a larger \
         cluster"
    )]
    TooManyGpus {
        tp: u64,
        cp: u64,
        pp: u64,
        dp: u64,
        world: u64,
        cluster: String,
        gpus: u64,
        nodes: u32,
        gpus_per_node: u32,
        max_dp: u64,
    },

    #[error("{model}: attention heads ({heads}) are not divisible by tp = {tp}: use tp ∈ {{{divisors}}}")]
    HeadsNotDivisible {
        model: String,
        heads: u64,
        tp: u64,
        divisors: String,
    },

    #[error(
        "{model}: key/value heads ({kv_heads}) and tp = {tp} must divide one another: use tp ∈ \
         {{{divisors}}}"
    )]
    KvHeadsNotDivisible {
        model: String,
        kv_heads: u64,
        tp: u64,
        divisors: String,
    },

    #[error("{model}: ffn_hidden ({ffn}) is not divisible by tp = {tp}: use tp ∈ {{{divisors}}}")]
    FfnNotDivisible {
        model: String,
        ffn: u64,
        tp: u64,
        divisors: String,
    },

    #[error("{model}: {layers} layers cannot fill pp = {pp} stages: use pp ≤ {layers}")]
    TooFewLayers { model: String, layers: u64, pp: u64 },

    #[error(
        "the GPT-NeoX partition of {layers} layers over {pp} stages leaves a stage without \
         layers: use fewer stages or --partition uniform"
    )]
    NeoxLeavesEmptyStage { layers: u64, pp: u64 },

    #[error("give either a global batch or micro-batches per step, not both")]
    BatchGivenTwice,

    #[error("give a global batch (--global-batch) or micro-batches per step (--micro-batches)")]
    BatchMissing,

    #[error(
        "global batch {global_batch} is not divisible by micro-batch × dp = {micro_batch} × {dp} \
         = {per_step}: use a multiple of {per_step} (e.g. {example})"
    )]
    BatchNotDivisible {
        global_batch: u64,
        micro_batch: u64,
        dp: u64,
        per_step: u64,
        example: u64,
    },

    #[error("{gpu} has no {dtype} tensor cores: train in bf16 or fp16 there, or pick a GPU with {dtype} (H100 and later)")]
    DtypeUnsupported { gpu: String, dtype: &'static str },

    #[error("zero = {zero}: use 0, 1, 2 or 3")]
    ZeroStage { zero: u8 },

    #[error(
        "--grad-reduce-dtype fp8: gradients are reduced in fp32, bf16 or fp16; give one of those \
         (or leave it out: fp32 for bf16 and fp8 training, fp16 for fp16)"
    )]
    GradReduceFp8,

    #[error("sequence parallelism needs tp > 1: drop --sequence-parallel or raise tp")]
    SequenceParallelNeedsTp,

    #[error(
        "sequence parallelism splits each sequence's {tokens} tokens{per_cp} over tp = {tp} \
         (Megatron-Core requires the sequence to divide by the tensor-parallel size): use a \
         seq-len that is a multiple of {multiple}, or drop --sequence-parallel"
    )]
    SeqNotDivisibleByTp {
        tokens: u64,
        per_cp: String,
        tp: u64,
        multiple: u64,
    },

    #[error(
        "the interleaved schedule needs pp ≥ 2 and vpp ≥ 2 (got pp {pp}, vpp {vpp}): give --vpp, \
         or use --schedule 1f1b"
    )]
    InterleavedNeedsChunks { pp: u64, vpp: u64 },

    #[error(
        "the interleaved schedule runs micro-batches in groups of pp = {pp}: {micro_batches} \
         micro-batches per step is not a multiple; use {suggested}"
    )]
    MicroBatchesNotGroupsOfPp {
        pp: u64,
        micro_batches: u64,
        suggested: u64,
    },

    #[error("vpp = {vpp} needs the interleaved schedule, not {schedule}: drop --vpp or use --schedule interleaved")]
    ChunksNeedInterleaving { vpp: u64, schedule: &'static str },

    #[error(
        "the zb-v schedule runs two model chunks on every rank, in a V (rank r runs stages r and \
         2·pp − 1 − r): vpp = {vpp} is not 2; drop --vpp or give --vpp 2 (a pipeline layout: \
         2·pp chunks)"
    )]
    VShapeTwoChunks { vpp: u64 },

    #[error(
        "the {schedule} schedule places layers / (pp·vpp) layers in every chunk: drop \
         --partition neox"
    )]
    NeoxWithChunks { schedule: &'static str },

    #[error("{model}: {layers} layers do not split into pp·vpp = {pp}·{vpp} equal chunks: {hint}")]
    UnevenChunks {
        model: String,
        layers: u64,
        pp: u64,
        vpp: u64,
        hint: String,
    },

    #[error(
        "{model}: with the embedding and the loss counted as layers, {layers} layers over \
         {chunks} chunks leave a chunk without a transformer layer: use fewer chunks (pp·vpp)"
    )]
    EmptyChunk {
        model: String,
        layers: u64,
        chunks: u64,
    },

    #[error(
        "counting the embedding or loss as a layer is Megatron's uniform split: drop \
         --partition neox (or --rules paper)"
    )]
    PipelineSplitWithNeox,

    #[error("--recompute-modules: {why}")]
    RecomputeModules { why: String },

    #[error("--cuda-graphs: {why}")]
    CudaGraphs { why: String },

    #[error("{flag} sets how fp8 training runs, not {dtype}'s: add --dtype fp8 or drop it")]
    Fp8SettingNeedsFp8 {
        flag: &'static str,
        dtype: &'static str,
    },

    #[error("--recompute {granularity}: {why}")]
    TorchtitanRecompute {
        granularity: &'static str,
        why: String,
    },

    #[error("--pipeline-layout \"{layout}\": {message}")]
    PipelineLayout { layout: String, message: String },

    #[error(
        "--pipeline-layout places every layer itself: drop {flag} (the layout string says \
         where the embedding, the loss and each layer go)"
    )]
    PipelineLayoutWith { flag: &'static str },

    #[error(
        "--pipeline-layout has {chunks} chunks, which pp = {pp} × vpp = {vpp} cannot hold: give \
         pp · vpp chunks (vpp defaults to chunks / pp)"
    )]
    PipelineLayoutChunks { chunks: u64, pp: u64, vpp: u64 },

    #[error(
        "--pipeline-layout places {layout} multi-token-prediction modules (m), --mtp-layers \
         says {flag}: give the same number, or leave --mtp-layers out"
    )]
    PipelineLayoutMtp { layout: u64, flag: u64 },

    #[error(
        "--overlap-param-gather needs the distributed optimizer, or FSDP under a pipeline \
         (parameters gathered once a step: zero 1 or 2, or zero 3 with pp > 1; dp > 1, Megatron \
         rules): drop --overlap-param-gather, or use --zero 1 with dp > 1"
    )]
    ParamGatherNeedsDistributedOptimizer,

    #[error(
        "--tp-comm-overlap pipelines the sequence-parallel all-gathers and reduce-scatters with \
         their GEMMs (Transformer Engine userbuffers): add --sequence-parallel, or drop \
         --tp-comm-overlap"
    )]
    TpOverlapNeedsSequenceParallel,

    #[error(
        "context parallelism splits each sequence into 2·cp = {chunks} chunks (causal load \
         balancing): seq-len {seq_len} is not a multiple; use a seq-len that is, or cp ∈ \
         {{{divisors}}}"
    )]
    SeqNotDivisibleByCp {
        seq_len: u64,
        chunks: u64,
        divisors: String,
    },

    #[error(
        "context parallelism needs a fused (flash) attention: {model} uses unfused attention; \
         give attention: flash in its architecture, or drop --cp"
    )]
    CpNeedsFlashAttention { model: String },

    #[error("the paper's rules (GPT-NeoX + DeepSpeed) have no context parallelism: drop --cp or use --rules megatron")]
    CpUnderPaperRules,

    #[error(
        "the paper's rules cost its tool's operator list, fused: drop --elementwise eager or \
         use --rules megatron"
    )]
    EagerUnderPaperRules,

    #[error(
        "the paper's rules cost its tool's loss, the unfused one it timed: drop --cross-entropy \
         fused or use --rules megatron"
    )]
    FusedLossUnderPaperRules,

    #[error(
        "{model} has no experts: drop the expert settings (--ep, --etp, --moe-dispatcher, \
         --moe-imbalance, --moe-routing, --moe-capacity-factor, --moe-a2a-overlap), or give a \
         mixture-of-experts model"
    )]
    ExpertsOnDenseModel { model: String },

    #[error("the paper's rules have no mixture of experts: use --rules megatron")]
    ExpertsUnderPaperRules,

    #[error("FSDP (ZeRO-3) of routed experts is not modelled: use --zero 1 (Megatron's distributed optimizer)")]
    ExpertsWithFsdp,

    #[error(
        "ep = {ep} must divide the experts ({experts}) and the ranks it is carved from \
         (tp · cp · dp / etp = {replicas}; dp · cp with the default etp = tp): use an ep dividing \
         both"
    )]
    EpNotDivisible {
        ep: u64,
        experts: u64,
        replicas: u64,
    },

    #[error(
        "--moe-imbalance {value}: give the busiest expert's tokens over the mean, between 1 \
         (balanced) and {max} (experts / top-k: every token to the same experts)"
    )]
    Imbalance { value: f64, max: f64 },

    /// A routing file that does not fit the model.
    #[error("{}: {message}", .path.display())]
    Routing {
        path: std::path::PathBuf,
        message: String,
    },

    #[error(
        "--moe-imbalance {value} and a routing file both give the router's skew: keep one \
         (the file's per-layer counts, or one number for every layer)"
    )]
    RoutingWithImbalance { value: f64 },

    #[error(
        "moe-capacity-factor = {value}: give the expert capacity over the mean tokens per \
         expert, between 0.05 and {max} (experts / top-k; beyond it nothing is dropped)"
    )]
    Capacity { value: f64, max: f64 },

    #[error(
        "--moe-pad-to-capacity pads each expert's input to its capacity: give \
         --moe-capacity-factor too"
    )]
    PadWithoutCapacity,

    #[error(
        "etp = {etp} must divide the stage's tp · cp · dp ranks ({ranks}) and the expert MLP \
         size ({expert_ffn}): use an etp dividing both (tp is the default)"
    )]
    EtpNotDivisible {
        etp: u64,
        ranks: u64,
        expert_ffn: u64,
    },

    #[error(
        "{model} attends within a window of {window} tokens (sliding or chunked), shorter than \
         seq-len {seq_len}: windows under context parallelism (cp = {cp}) are not modelled; \
         use --cp 1, or --seq-len {window} or less"
    )]
    SlidingWindowWithCp {
        model: String,
        window: u64,
        seq_len: u64,
        cp: u64,
    },

    #[error(
        "dp-bucket-elements = {0}: give between {MIN_BUCKET_ELEMENTS} and {MAX_BUCKET_ELEMENTS} \
         elements per bucket (Megatron's default is 40,000,000)"
    )]
    BucketSize(u64),
}

impl LayoutError {
    /// The rule broken, in a few words: what `search` counts skipped layouts by.
    pub fn rule(&self) -> &'static str {
        use LayoutError::*;
        match self {
            Zero { .. } | TooLarge { .. } | BatchGivenTwice | BatchMissing | ZeroStage { .. } => {
                "input out of range"
            }
            TooManyGpus { .. } => "more GPUs than the cluster has",
            DtypeUnsupported { .. } => "data type the GPU does not have",
            GradReduceFp8 => "gradients reduced in fp8",
            HeadsNotDivisible { .. } | KvHeadsNotDivisible { .. } | FfnNotDivisible { .. } => {
                "heads, key/value heads or MLP size not divisible by tp"
            }
            TooFewLayers { .. } => "fewer layers than pp",
            NeoxLeavesEmptyStage { .. } => "GPT-NeoX partition leaves a stage empty",
            BatchNotDivisible { .. } => "global batch not divisible by micro-batch × dp",
            SequenceParallelNeedsTp => "sequence parallelism without tp",
            SeqNotDivisibleByTp { .. } => "seq-len not divisible by tp under sequence parallelism",
            InterleavedNeedsChunks { .. }
            | MicroBatchesNotGroupsOfPp { .. }
            | ChunksNeedInterleaving { .. }
            | VShapeTwoChunks { .. }
            | NeoxWithChunks { .. }
            | PipelineSplitWithNeox
            | UnevenChunks { .. }
            | EmptyChunk { .. } => {
                "interleaving needs layers divisible by pp·vpp and micro-batches by pp"
            }
            PipelineLayout { .. }
            | PipelineLayoutWith { .. }
            | PipelineLayoutChunks { .. }
            | PipelineLayoutMtp { .. } => "pipeline layout that does not fit",
            RecomputeModules { .. } => "recompute modules the model or rules cannot take",
            CudaGraphs { .. } => "CUDA graph scopes the model or rules cannot take",
            TorchtitanRecompute { .. } => {
                "torchtitan's selective recomputation the model cannot take"
            }
            Fp8SettingNeedsFp8 { .. } => "an fp8 setting without fp8 training",
            ParamGatherNeedsDistributedOptimizer => {
                "parameter-gather overlap without a distributed optimizer"
            }
            TpOverlapNeedsSequenceParallel => "TP overlap needs sequence parallelism",
            SeqNotDivisibleByCp { .. } => "seq-len not divisible by 2·cp",
            SlidingWindowWithCp { .. } => "sliding window under context parallelism",
            ExpertsOnDenseModel { .. }
            | ExpertsUnderPaperRules
            | ExpertsWithFsdp
            | Imbalance { .. }
            | Routing { .. }
            | RoutingWithImbalance { .. }
            | Capacity { .. }
            | PadWithoutCapacity
            | EtpNotDivisible { .. } => "expert settings the model or rules cannot take",
            EpNotDivisible { .. } => "ep not dividing the experts or dp·cp",
            CpNeedsFlashAttention { .. } | CpUnderPaperRules => {
                "context parallelism without fused attention or under the paper's rules"
            }
            EagerUnderPaperRules => "eager element-wise kernels under the paper's rules",
            FusedLossUnderPaperRules => "a fused cross-entropy under the paper's rules",
            BucketSize(_) => "bucket size out of range",
        }
    }
}

//! The parallel layout of a job — tensor (tp), context (cp), pipeline (pp) and data (dp)
//! parallel degrees,
//! micro-batching, recomputation, optimizer sharding — checked in exactly one place,
//! `Layout::new`, whose messages say what to change.

use serde::{Deserialize, Serialize};

use super::arch::Arch;
use super::pipeline_layout::PipelineLayout;
use super::routing::{load_under_capacity, ExpertRouting};
use crate::error::LayoutError;
use crate::hardware::Cluster;
use crate::limits::*;
use crate::ops::Dtype;

crate::named_enum!(
    /// Whose composition rules a prediction follows.
    pub enum Rules {
        /// Megatron-LM / Megatron-Core: uniform stages, RoPE on queries and keys, distributed
        /// optimizer (reduce-scatter + all-gather), no recompute unless asked.
        Megatron => "megatron",
        /// The paper's tool (GPT-NeoX + DeepSpeed): GPT-NeoX stage partition, full recompute,
        /// one RoPE call per layer, ZeRO-1 with all-reduced gradients, the full stage's
        /// optimizer step, a 1.26e9-element DP bucket, fp16.
        Paper => "paper",
    }
);

crate::named_enum!(
    /// What the backward recomputes instead of storing.
    pub enum Recompute {
        /// Nothing: every activation is stored.
        None => "none",
        /// The attention core (Korthikanti et al. 2022).
        Selective => "selective",
        /// PyTorch's op-level selective activation checkpointing as torchtitan applies it
        /// (`mode = "selective"`, `selective_ac_option = "op"`): a layer keeps its input, the
        /// attention kernel's outputs and every other matrix multiply's output (the 1st, 3rd, …
        /// of q, k, v, out, gate, up, down) and recomputes the rest in its backward.
        SelectiveOp => "selective-op",
        /// Every other layer's whole forward, the rest storing everything (torchtitan's
        /// layer-level selective checkpointing, `selective_ac_option = "2"`): per layer, half a
        /// full recomputation and the mean of what the two kinds of layer keep.
        SelectiveLayer => "selective-layer",
        /// Each layer's whole forward.
        Full => "full",
    }
);

crate::named_enum!(
    /// How a mixture's routed tokens reach their experts (Megatron-Core's token dispatchers).
    pub enum Dispatcher {
        /// NCCL all-to-all over the expert-parallel group, each of a token's k copies sent to
        /// its expert's rank (`--moe-token-dispatcher-type alltoall`; the default).
        Alltoall => "alltoall",
        /// Every rank all-gathers the expert group's tokens and keeps its experts' share; the
        /// outputs are reduce-scattered back (`allgather`).
        Allgather => "allgather",
        /// DeepEP's hierarchical dispatch (`flex`, backend deepep): a token crosses the
        /// network once per node its experts are on, then NVLink carries its copies.
        Deepep => "deepep",
        /// HybridEP's (`flex`, backend hybridep): the same traffic as DeepEP's.
        Hybridep => "hybridep",
    }
);

impl Fp8Library {
    /// The default, which layout records leave out.
    pub fn is_transformer_engine(&self) -> bool {
        *self == Fp8Library::TransformerEngine
    }
}

impl CrossEntropy {
    /// The default, which layout records leave out.
    pub fn is_vocab_parallel(&self) -> bool {
        *self == CrossEntropy::VocabParallel
    }
}

impl Elementwise {
    /// The default, which layout records leave out.
    pub fn is_fused(&self) -> bool {
        *self == Elementwise::Fused
    }
}

impl Dispatcher {
    /// The default, which layout records leave out.
    pub fn is_alltoall(&self) -> bool {
        *self == Dispatcher::Alltoall
    }
}

crate::named_enum!(
    /// A part of a layer selective recomputation rebuilds in the backward instead of keeping
    /// its outputs (Megatron-Core's `--recompute-modules`).
    pub enum RecomputeModule {
        /// The attention core (scores, softmax, context); the default.
        CoreAttn => "core_attn",
        /// The two norms (their outputs, the projections' inputs).
        Layernorm => "layernorm",
        /// Latent attention's up-projections and RoPE (their Q, K and V).
        MlaUpProj => "mla_up_proj",
        /// A dense layer's MLP (its activation's input and output).
        Mlp => "mlp",
        /// The routed experts' activation (its output).
        MoeAct => "moe_act",
        /// The shared experts' MLP.
        SharedExperts => "shared_experts",
        /// A mixture's whole expert block: router, dispatch, experts, combine, shared experts.
        Moe => "moe",
    }
);

crate::named_enum!(
    /// A part of each transformer layer captured in a CUDA graph (Megatron-Core's
    /// `--cuda-graph-scope`, NeMo's `cuda_graph_scope`): the host replays the part's kernels,
    /// collectives included, with one graph launch instead of issuing each.
    pub enum CudaGraphScope {
        /// Nothing captured: every kernel issued from eager PyTorch (the default; alone).
        None => "none",
        /// The whole layer, forward and backward (Megatron-Core's `--cuda-graph-impl local`):
        /// static shapes only, so a mixture's experts need a padded capacity.
        Layer => "layer",
        /// The attention block: input norm, projections, attention, output projection, its
        /// TP communication and the residual add (Transformer Engine's partial graphs).
        Attn => "attn",
        /// A dense layer's MLP block: its norm, MLP, TP communication and residual add.
        Mlp => "mlp",
        /// A mixture's whole expert block: static shapes only (a padded capacity).
        Moe => "moe",
        /// A mixture's norm, router and top-k, and its shared experts (which Megatron-Core
        /// computes there unless they overlap the dispatch).
        MoeRouter => "moe_router",
        /// The dispatcher's preprocessing up to the point where dropless routing reads the
        /// token counts back (their all-gather and the permutation); needs moe_router.
        MoePreprocess => "moe_preprocess",
    }
);

crate::named_enum!(
    /// How the micro-batches of a step flow through the pipeline stages.
    pub enum Schedule {
        /// The paper's closed form, (m − 1 + pp) · (slowest forward + slowest backward), not
        /// simulated (the default under the paper's rules).
        ClosedForm => "closed-form",
        /// All forwards, then all backwards (Huang et al. 2019).
        Gpipe => "gpipe",
        /// One-forward-one-backward (Narayanan et al. 2021; Megatron's default).
        OneFOneB => "1f1b",
        /// Megatron's interleaved 1F1B over vpp model chunks per rank.
        Interleaved => "interleaved",
        /// Zero-bubble ZB-H1 (Qi et al. 2024): the backward split into input and weight
        /// gradients, rank r running its weight gradients r micro-batches late.
        ZbH1 => "zb-h1",
        /// Zero-bubble ZB-V (Qi et al. 2024; torchtitan's `ZBVZeroBubble`): two model chunks a
        /// rank placed in a V (rank r runs virtual stages r and 2·pp − 1 − r), the backward
        /// split as in ZB-H1, the order built so that no rank holds more activations than
        /// 1F1B's first rank.
        ZbV => "zb-v",
    }
);

crate::named_enum!(
    /// Which library runs fp8 training: what it keeps of the weights and of the GEMM inputs.
    pub enum Fp8Library {
        /// NVIDIA's Transformer Engine (Megatron, NeMo): caches each weight's fp8 cast and its
        /// transpose across micro-batches (2 bytes beside the 16-bit weight, unless the weights
        /// are kept in fp8 themselves) and keeps the fp8 casts of the GEMM inputs for the
        /// backward (1 byte an element instead of 2).
        TransformerEngine => "transformer-engine",
        /// PyTorch's torchao float8 (torchtitan): casts weights and inputs to fp8 at each matmul
        /// and keeps the 16-bit inputs for the backward, where it casts them again.
        Torchao => "torchao",
    }
);

crate::named_enum!(
    /// Which cross-entropy turns the logits into the loss: what it holds at the loss's
    /// backward, the peak of the rank with the LM head.
    pub enum CrossEntropy {
        /// Megatron's vocabulary-parallel cross-entropy: it works on the fp32 logits in place
        /// and keeps them for the backward (4 bytes a token and vocabulary entry) beside the
        /// 16-bit logits they were converted from (2).
        VocabParallel => "vocab-parallel",
        /// PyTorch's `cross_entropy` on `logits.float()` (torchtitan, Composer, Hugging Face):
        /// it keeps the fp32 log-softmax output (4), and its backward holds the loss's
        /// gradient of that output and the log-softmax's gradient at once (4 + 4).
        Pytorch => "pytorch",
        /// Megatron-Core's fused cross-entropy in Transformer Engine's kernel
        /// (`--cross-entropy-loss-fusion --cross-entropy-fusion-impl te`; Megatron-Bridge's
        /// performance recipes): one pass finds each row's maximum and sum of exponentials, a
        /// second writes the loss and the gradient in place over the 16-bit logits, and the
        /// backward scales that gradient — three passes over 16-bit logits forward, two
        /// backward, costed at its roofline; it keeps the 16-bit logits only (2).
        Fused => "fused",
    }
);

crate::named_enum!(
    /// How context-parallel ranks share keys and values.
    pub enum CpComm {
        /// A ring: each of cp − 1 steps passes K and V to the neighbour while the attention of
        /// the chunk already there runs (Megatron `--cp-comm-type p2p`, its default;
        /// torchtitan's `alltoall` rotation).
        P2p => "p2p",
        /// All-gather the whole sequence's K and V before the attention, reduce-scatter their
        /// gradients after (Megatron `--cp-comm-type all_gather`; torchtitan's default
        /// `allgather` rotation): nothing hidden.
        AllGather => "all-gather",
    }
);

crate::named_enum!(
    /// How the model code's element-wise work — RMSNorm, rotary embedding, the gated MLP's
    /// activation — reaches the GPU.
    pub enum Elementwise {
        /// Fused kernels: Megatron-Core's and Transformer Engine's, or PyTorch model code under
        /// `torch.compile` (Inductor fuses each into one or two kernels).
        Fused => "fused",
        /// PyTorch model code run eagerly (torchtitan's default, `[compile] enable = false`):
        /// each PyTorch operation of its RMSNorm (cast to fp32, square, mean, rsqrt, scale,
        /// cast back, weight), of its complex-number rotary embedding and of its SiLU-and-multiply
        /// is a kernel of its own, a pass over memory, in fp32 where the code casts.
        Eager => "eager",
    }
);

crate::named_enum!(
    /// Which kernel runs the fused attention.
    pub enum AttentionKernel {
        /// The attention the cluster's models learned (NVIDIA's measured kernels on H100:
        /// cuDNN / Transformer Engine class; FlashAttention-2 on A100).
        Native => "native",
        /// FlashAttention-2 (flash-attn 2, PyTorch SDPA's flash backend): on Hopper it reaches
        /// about a third of peak (it does not use the warpgroup instructions), which the
        /// cluster file's `achievable.flash_attention_2_*` states; elsewhere as learned.
        FlashAttention2 => "flash-attention-2",
    }
);

impl Schedule {
    /// Whether the backward runs as separate input-gradient and weight-gradient passes.
    pub fn splits_backward(self) -> bool {
        matches!(self, Schedule::ZbH1 | Schedule::ZbV)
    }
}

/// Which communication runs beside the compute (by default nothing).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Overlap {
    /// Data-parallel gradient reduction bucket by bucket during the last backward
    /// (Megatron `--overlap-grad-reduce`).
    pub grad_reduce: bool,
    /// The distributed optimizer's parameter all-gather during the next step's first forward
    /// (Megatron `--overlap-param-gather`).
    pub param_gather: bool,
    /// Pipeline sends on their own stream instead of blocking the sender (Megatron
    /// `--overlap-p2p-communication`).
    pub p2p: bool,
    /// Tensor-parallel communication pipelined with the GEMMs beside it, as Transformer
    /// Engine's userbuffers do (Megatron / NeMo `--tp-comm-overlap`): how much hides is the
    /// composer's result.
    pub tp: bool,
    /// The expert all-to-alls beside the compute, only what it cannot cover exposed
    /// (Megatron-Core's `--overlap-moe-expert-parallel-comm`).
    pub moe_a2a: bool,
}

crate::named_enum!(
    /// How transformer layers are split over pipeline stages.
    pub enum Partition {
        /// layers / pp per stage (Megatron); a remainder goes to the middle stages.
        Uniform => "uniform",
        /// GPT-NeoX / DeepSpeed: layers + 5 blocks split uniformly, the first stage's two and
        /// the last stage's three non-transformer blocks counted as layers.
        Neox => "neox",
    }
);

/// A layout as a user writes it (CLI flags or a job file); unset options take defaults (tp,
/// pp, dp and micro-batch 1) or the rules' defaults.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParallelSpec {
    #[serde(default)]
    pub tp: Option<u64>,
    #[serde(default)]
    pub pp: Option<u64>,
    #[serde(default)]
    pub dp: Option<u64>,
    /// Context parallelism (Megatron-Core ring attention): each sequence split over cp ranks.
    #[serde(default)]
    pub cp: Option<u64>,
    /// How the context-parallel ranks exchange K and V (default p2p).
    #[serde(default)]
    pub cp_comm: Option<CpComm>,
    /// Which kernel runs the attention (default native: what the models learned).
    #[serde(default)]
    pub attention_kernel: Option<AttentionKernel>,
    /// Which cross-entropy computes the loss (default vocab-parallel, Megatron's).
    #[serde(default)]
    pub cross_entropy: Option<CrossEntropy>,
    /// How the norms, rotary embedding and gated activation run (default fused).
    #[serde(default)]
    pub elementwise: Option<Elementwise>,
    /// Expert parallelism: the routed experts split over ep ranks of the data-parallel group.
    #[serde(default)]
    pub ep: Option<u64>,
    /// Expert tensor parallelism: each expert's MLP split over etp ranks (Megatron's
    /// `--expert-tensor-parallel-size`; default tp).
    #[serde(default)]
    pub etp: Option<u64>,
    /// Router imbalance: tokens of the busiest expert over the mean (1 = perfectly balanced).
    #[serde(default)]
    pub moe_imbalance: Option<f64>,
    /// Expert capacity over the mean tokens per expert: tokens beyond it are dropped
    /// (Megatron's `--moe-expert-capacity-factor`; none: dropless).
    #[serde(default)]
    pub moe_capacity_factor: Option<f64>,
    /// Pad every expert's input to its capacity (Megatron's
    /// `--moe-pad-expert-input-to-capacity`).
    #[serde(default)]
    pub moe_pad_to_capacity: Option<bool>,
    /// Run the expert all-to-alls beside the compute (Megatron-Core's
    /// `--overlap-moe-expert-parallel-comm`, NeMo's moe_a2a_overlap).
    #[serde(default)]
    pub moe_a2a_overlap: Option<bool>,
    /// How routed tokens reach their experts (default alltoall).
    #[serde(default)]
    pub moe_dispatcher: Option<Dispatcher>,
    #[serde(default)]
    pub micro_batch: Option<u64>,
    /// Sequences per optimizer step over all data-parallel replicas.
    #[serde(default)]
    pub global_batch: Option<u64>,
    /// Micro-batches per step on each pipeline (gradient accumulation steps).
    #[serde(default)]
    pub micro_batches: Option<u64>,
    #[serde(default)]
    pub seq_len: Option<u64>,
    #[serde(default)]
    pub sequence_parallel: Option<bool>,
    #[serde(default)]
    pub recompute: Option<Recompute>,
    /// What selective recomputation rebuilds (Megatron-Core's `--recompute-modules`; default
    /// core_attn).
    #[serde(default)]
    pub recompute_modules: Option<Vec<RecomputeModule>>,
    /// The parts of each layer captured in CUDA graphs (default none: eager issue).
    #[serde(default)]
    pub cuda_graphs: Option<Vec<CudaGraphScope>>,
    #[serde(default)]
    pub partition: Option<Partition>,
    /// 0: replicated optimizer; 1: optimizer states sharded over dp (distributed optimizer);
    /// 2: and gradients; 3: and parameters (FSDP).
    #[serde(default)]
    pub zero: Option<u8>,
    #[serde(default)]
    pub dtype: Option<Dtype>,
    /// The type data-parallel gradients are reduced in (default: fp32 when training in bf16 or
    /// fp8, fp16 under fp16; see `Layout::grad_reduce_dtype`).
    #[serde(default)]
    pub grad_reduce_dtype: Option<Dtype>,
    /// Keep fp8 training's weights in fp8 and all-gather them in fp8 (Megatron's
    /// `--fp8-param-gather`, NeMo's `fp8_param_gather`, torchtitan's
    /// `enable_fsdp_float8_all_gather`); needs `dtype: fp8`.
    #[serde(default)]
    pub fp8_param_gather: Option<bool>,
    /// Which library runs fp8 training (default transformer-engine); needs `dtype: fp8`.
    #[serde(default)]
    pub fp8_library: Option<Fp8Library>,
    #[serde(default)]
    pub rules: Option<Rules>,
    /// Elements per data-parallel gradient bucket.
    #[serde(default)]
    pub dp_bucket_elements: Option<u64>,
    /// Pipeline schedule (default: 1f1b, interleaved when vpp > 1; closed-form under the
    /// paper's rules).
    #[serde(default)]
    pub schedule: Option<Schedule>,
    /// Model chunks per pipeline rank (virtual pipeline stages) for the interleaved schedule.
    #[serde(default)]
    pub vpp: Option<u64>,
    #[serde(default)]
    pub overlap_grad_reduce: Option<bool>,
    #[serde(default)]
    pub overlap_param_gather: Option<bool>,
    #[serde(default)]
    pub overlap_p2p: Option<bool>,
    /// Pipeline the tensor-parallel collectives with their GEMMs (needs sequence parallelism).
    #[serde(default)]
    pub tp_comm_overlap: Option<bool>,
    /// Count the embedding as a layer when splitting layers over pipeline chunks (Megatron's
    /// `--account-for-embedding-in-pipeline-split`).
    #[serde(default)]
    pub account_for_embedding_in_pipeline_split: Option<bool>,
    /// Count the loss as a layer when splitting layers over pipeline chunks (Megatron's
    /// `--account-for-loss-in-pipeline-split`).
    #[serde(default)]
    pub account_for_loss_in_pipeline_split: Option<bool>,
    /// Multi-token prediction modules trained beside the model (Megatron's
    /// `--mtp-num-layers`, DeepSeek-V3's one).
    #[serde(default)]
    pub mtp_layers: Option<u64>,
    /// What each model chunk holds, as Megatron-Core's `--pipeline-model-parallel-layout`
    /// string (`Et|(tt|)*30mL`); see [`PipelineLayout`].
    #[serde(default)]
    pub pipeline_layout: Option<String>,
}

/// Which of the embedding and the loss count as a transformer layer when Megatron splits the
/// layers over the pipeline's model chunks: each takes one layer's place, so the first chunk
/// holds one layer fewer and the last one fewer, and layers + 2 split evenly (how Llama 3.1
/// 405B's 126 layers fill 8 × 8 chunks in NVIDIA's recipe).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PipelineSplit {
    /// The embedding counts as a layer of the first chunk.
    pub embedding: bool,
    /// The loss (LM head and cross-entropy) counts as a layer of the last chunk.
    pub loss: bool,
}

impl PipelineSplit {
    /// Layer places the embedding and loss take.
    pub fn places(self) -> u64 {
        u64::from(self.embedding) + u64::from(self.loss)
    }
}

impl ParallelSpec {
    /// Fields set in `over` replace this spec's (flags over a job file).
    pub fn overridden_by(self, over: ParallelSpec) -> ParallelSpec {
        ParallelSpec {
            tp: over.tp.or(self.tp),
            pp: over.pp.or(self.pp),
            dp: over.dp.or(self.dp),
            cp: over.cp.or(self.cp),
            cp_comm: over.cp_comm.or(self.cp_comm),
            cross_entropy: over.cross_entropy.or(self.cross_entropy),
            elementwise: over.elementwise.or(self.elementwise),
            attention_kernel: over.attention_kernel.or(self.attention_kernel),
            ep: over.ep.or(self.ep),
            etp: over.etp.or(self.etp),
            moe_imbalance: over.moe_imbalance.or(self.moe_imbalance),
            moe_capacity_factor: over.moe_capacity_factor.or(self.moe_capacity_factor),
            moe_pad_to_capacity: over.moe_pad_to_capacity.or(self.moe_pad_to_capacity),
            moe_a2a_overlap: over.moe_a2a_overlap.or(self.moe_a2a_overlap),
            moe_dispatcher: over.moe_dispatcher.or(self.moe_dispatcher),
            micro_batch: over.micro_batch.or(self.micro_batch),
            global_batch: over.global_batch.or(self.global_batch),
            micro_batches: over.micro_batches.or(self.micro_batches),
            seq_len: over.seq_len.or(self.seq_len),
            sequence_parallel: over.sequence_parallel.or(self.sequence_parallel),
            recompute: over.recompute.or(self.recompute),
            recompute_modules: over.recompute_modules.or(self.recompute_modules),
            cuda_graphs: over.cuda_graphs.or(self.cuda_graphs),
            partition: over.partition.or(self.partition),
            zero: over.zero.or(self.zero),
            dtype: over.dtype.or(self.dtype),
            grad_reduce_dtype: over.grad_reduce_dtype.or(self.grad_reduce_dtype),
            fp8_param_gather: over.fp8_param_gather.or(self.fp8_param_gather),
            fp8_library: over.fp8_library.or(self.fp8_library),
            rules: over.rules.or(self.rules),
            dp_bucket_elements: over.dp_bucket_elements.or(self.dp_bucket_elements),
            schedule: over.schedule.or(self.schedule),
            vpp: over.vpp.or(self.vpp),
            overlap_grad_reduce: over.overlap_grad_reduce.or(self.overlap_grad_reduce),
            overlap_param_gather: over.overlap_param_gather.or(self.overlap_param_gather),
            overlap_p2p: over.overlap_p2p.or(self.overlap_p2p),
            tp_comm_overlap: over.tp_comm_overlap.or(self.tp_comm_overlap),
            account_for_embedding_in_pipeline_split: over
                .account_for_embedding_in_pipeline_split
                .or(self.account_for_embedding_in_pipeline_split),
            account_for_loss_in_pipeline_split: over
                .account_for_loss_in_pipeline_split
                .or(self.account_for_loss_in_pipeline_split),
            mtp_layers: over.mtp_layers.or(self.mtp_layers),
            pipeline_layout: over.pipeline_layout.or(self.pipeline_layout),
        }
    }
}

/// A checked layout.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Layout {
    pub tp: u64,
    pub pp: u64,
    pub dp: u64,
    /// Context-parallel degree: each sequence's tokens split over cp ranks, which exchange
    /// keys and values around a ring in the attention.
    pub cp: u64,
    /// How the context-parallel ranks exchange keys and values.
    pub cp_comm: CpComm,
    /// Which kernel runs the attention.
    pub attention_kernel: AttentionKernel,
    /// Which cross-entropy computes the loss.
    #[serde(skip_serializing_if = "CrossEntropy::is_vocab_parallel")]
    pub cross_entropy: CrossEntropy,
    /// How the norms, rotary embedding and gated activation run.
    #[serde(skip_serializing_if = "Elementwise::is_fused")]
    pub elementwise: Elementwise,
    /// Expert-parallel degree (1 for a dense model): each rank holds experts / ep experts.
    pub ep: u64,
    /// Expert-tensor-parallel degree: each expert's MLP is split over etp ranks (tp unless
    /// given; Megatron-Core folds etp · ep · expert-dp over the tp · cp · dp ranks).
    pub etp: u64,
    /// Tokens of the busiest expert over the mean; the slowest rank's expert work and
    /// all-to-all traffic scale with it.
    pub moe_imbalance: f64,
    /// Expert capacity over the mean tokens per expert (none: dropless), and whether every
    /// expert's input is padded to it.
    pub moe_capacity: Option<(f64, bool)>,
    /// How routed tokens reach their experts.
    #[serde(skip_serializing_if = "Dispatcher::is_alltoall")]
    pub moe_dispatcher: Dispatcher,
    /// Per transformer layer, the busiest expert-parallel rank's load from a routing file
    /// (empty: every layer at `expert_load()`); see [`Layout::with_routing`].
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub layer_loads: Vec<f64>,
    /// The routing file the loads came from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub routing_file: Option<std::path::PathBuf>,
    pub world: u64,
    pub micro_batch: u64,
    pub micro_batches: u64,
    pub global_batch: u64,
    pub seq_len: u64,
    pub sequence_parallel: bool,
    pub recompute: Recompute,
    /// What selective recomputation rebuilds when given (none: the attention core).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recompute_modules: Option<Vec<RecomputeModule>>,
    /// The parts of each layer captured in CUDA graphs, sorted (empty: none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cuda_graphs: Vec<CudaGraphScope>,
    pub partition: Partition,
    pub zero: u8,
    pub dtype: Dtype,
    /// What data-parallel gradients are reduced in (reduce-scatter or all-reduce, FSDP's
    /// included): bf16 training reduces fp32 gradients — Megatron-LM turns on
    /// `accumulate_allreduce_grads_in_fp32` for bf16, NeMo's `bf16_mixed` sets
    /// `grad_reduce_in_fp32`, torchtitan's FSDP reduces in `mixed_precision_reduce = float32`,
    /// Composer's `mixed_precision: DEFAULT` in fp32 — unless a framework reduces in 16 bits
    /// (Composer's `PURE`); fp16 training reduces fp16 gradients.
    pub grad_reduce_dtype: Dtype,
    /// fp8 training's weights kept and data-parallel-gathered in fp8 (see `ParallelSpec`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub fp8_param_gather: bool,
    /// Which library runs fp8 training (Transformer Engine unless training in fp8 says
    /// otherwise; see `Fp8Library`).
    #[serde(skip_serializing_if = "Fp8Library::is_transformer_engine")]
    pub fp8_library: Fp8Library,
    pub rules: Rules,
    pub dp_bucket_elements: u64,
    pub schedule: Schedule,
    /// Model chunks per pipeline rank (1 unless interleaved or ZB-V).
    pub vpp: u64,
    pub overlap: Overlap,
    /// Transformer layers on each pipeline stage (all of a rank's chunks together).
    pub stage_layers: Vec<u64>,
    /// Transformer layers in each model chunk (virtual stage), in model order.
    pub chunk_layers: Vec<u64>,
    /// Whether the embedding and the loss took a layer's place in the split.
    pub pipeline_split: PipelineSplit,
    /// Multi-token prediction modules, on the last pipeline stage: each an embedding of the
    /// next tokens, two norms and a projection, one transformer layer, and the shared head.
    pub mtp_layers: u64,
    /// Multi-token prediction modules in each model chunk (all in the last one unless a
    /// pipeline layout places them).
    pub chunk_mtp_layers: Vec<u64>,
    /// The pipeline layout string the chunks were read from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pipeline_layout: Option<String>,
}

impl Layout {
    /// Checks a layout against the model and the cluster: the one place the rules live.
    pub fn new(spec: &ParallelSpec, arch: &Arch, cluster: &Cluster) -> Result<Layout, LayoutError> {
        let (tp, pp, dp) = (
            degree("tp", spec.tp)?,
            degree("pp", spec.pp)?,
            degree("dp", spec.dp)?,
        );
        let micro_batch = bounded(
            "micro-batch",
            spec.micro_batch.unwrap_or(1),
            MAX_MICRO_BATCH,
        )?;
        let rules = spec.rules.unwrap_or(Rules::Megatron);
        let paper = rules == Rules::Paper;
        let cp = degree("cp", spec.cp)?;
        let world = check_world([tp, cp, pp, dp], cluster)?;
        check_model_split(arch, tp, pp)?;
        let micro_batches = micro_batches(spec, micro_batch, dp)?;
        let seq_len = bounded("seq-len", spec.seq_len.unwrap_or(arch.seq_len), MAX_SEQ_LEN)?;
        check_context_parallel(arch, rules, cp, seq_len)?;
        if paper && spec.elementwise == Some(Elementwise::Eager) {
            return Err(LayoutError::EagerUnderPaperRules);
        }
        if paper && spec.cross_entropy == Some(CrossEntropy::Fused) {
            return Err(LayoutError::FusedLossUnderPaperRules);
        }
        // (etp = tp on a dense model is no setting at all, as a search's rows record it)
        let etp = match spec.etp {
            Some(e) if arch.moe.is_none() && e != tp => {
                return Err(LayoutError::ExpertsOnDenseModel {
                    model: arch.name.clone(),
                })
            }
            Some(e) => degree("etp", Some(e))?,
            None => tp,
        };
        let (ep, moe_imbalance) = check_experts(spec, arch, rules, [tp, cp, dp], etp)?;
        let moe_capacity = check_capacity(spec, arch)?;
        let dense_dispatcher = spec
            .moe_dispatcher
            .is_some_and(|d| d != Dispatcher::Alltoall);
        if (spec.moe_a2a_overlap == Some(true) || dense_dispatcher) && arch.moe.is_none() {
            return Err(LayoutError::ExpertsOnDenseModel {
                model: arch.name.clone(),
            });
        }
        if let Some(window) = arch.sliding_window.filter(|&w| w < seq_len && cp > 1) {
            return Err(LayoutError::SlidingWindowWithCp {
                model: arch.name.clone(),
                window,
                seq_len,
                cp,
            });
        }
        bounded(
            "micro-batch × seq-len (tokens per micro-batch)",
            micro_batch * seq_len,
            MAX_MICRO_BATCH_TOKENS,
        )?;
        let (recompute, recompute_modules) = recompute_modules(spec, arch, rules)?;
        let cuda_graphs = cuda_graphs(spec, arch, rules, moe_capacity)?;
        let zero = spec.zero.unwrap_or(1);
        if zero > 3 {
            return Err(LayoutError::ZeroStage { zero });
        }
        let sequence_parallel = spec.sequence_parallel.unwrap_or(false);
        if sequence_parallel && tp == 1 {
            return Err(LayoutError::SequenceParallelNeedsTp);
        }
        // Megatron-Core scatters a [s, b, h] activation's first dimension over tp and asserts
        // it divides (a context-parallel rank holds s / cp of it)
        if sequence_parallel && !(seq_len / cp).is_multiple_of(tp) {
            // and 2·cp divides it too: lcm(2·cp, cp·tp)
            let multiple = match (cp, tp % 2) {
                (1, _) => tp,
                (_, 0) => cp * tp,
                _ => 2 * cp * tp,
            };
            return Err(LayoutError::SeqNotDivisibleByTp {
                tokens: seq_len / cp,
                per_cp: if cp == 1 {
                    String::new()
                } else {
                    format!(" (on each of cp = {cp} ranks)")
                },
                tp,
                multiple,
            });
        }
        let partition = spec.partition.unwrap_or(if paper {
            Partition::Neox
        } else {
            Partition::Uniform
        });
        let custom = match &spec.pipeline_layout {
            Some(text) => Some(custom_layout(spec, arch, text, pp)?),
            None => None,
        };
        let vpp_given = match &custom {
            Some(c) => Some(c.chunks.len() as u64 / pp),
            None => spec.vpp,
        };
        let (schedule, vpp) = schedule_and_chunks(spec, vpp_given, rules, pp, micro_batches)?;
        let pipeline_split = PipelineSplit {
            embedding: spec.account_for_embedding_in_pipeline_split == Some(true) && pp > 1,
            loss: spec.account_for_loss_in_pipeline_split == Some(true) && pp > 1,
        };
        let chunk_layers = match &custom {
            Some(c) => c.chunks.iter().map(|c| c.layers).collect(),
            None => chunk_layers(spec, arch, [pp, vpp], schedule, partition, pipeline_split)?,
        };
        let placement = virtual_stage_ranks(pp, vpp, schedule);
        let mut stage_layers = vec![0; pp as usize];
        for (&rank, &n) in placement.iter().zip(&chunk_layers) {
            stage_layers[rank] += n;
        }
        let overlap = overlap(
            spec,
            rules,
            [zero as u64, tp, dp * cp, pp],
            sequence_parallel,
            schedule,
        )?;
        let dp_bucket_elements = match spec.dp_bucket_elements {
            Some(b) if !(MIN_BUCKET_ELEMENTS..=MAX_BUCKET_ELEMENTS).contains(&b) => {
                return Err(LayoutError::BucketSize(b))
            }
            Some(b) => b,
            None if paper => 1_260_000_000,
            None => 40_000_000u64.max(1_000_000 * dp * cp),
        };
        // micro-batches ≤ 2^18, micro-batch ≤ 2^16, dp ≤ 2^20: the product fits in a u64
        let global_batch = bounded(
            "global batch (micro-batch × micro-batches × dp)",
            micro_batches * micro_batch * dp,
            MAX_GLOBAL_BATCH,
        )?;
        let dtype = spec
            .dtype
            .unwrap_or(if paper { Dtype::Fp16 } else { Dtype::Bf16 });
        // DeepSeek-V3 trains one; more than a few predict tokens too far ahead to help
        let mtp_layers = match spec.mtp_layers {
            None | Some(0) => custom.as_ref().map_or(0, PipelineLayout::mtp_layers),
            Some(n) => bounded("mtp-layers", n, 8)?,
        };
        if mtp_layers > 0 {
            bounded("multi-token-prediction modules (m)", mtp_layers, 8)?;
        }
        let chunk_mtp_layers = match &custom {
            Some(c) => c.chunks.iter().map(|c| c.mtp).collect(),
            None => {
                let mut v = vec![0; chunk_layers.len()];
                v[chunk_layers.len() - 1] = mtp_layers;
                v
            }
        };
        let grad_reduce_dtype = match spec.grad_reduce_dtype {
            Some(Dtype::Fp8) => return Err(LayoutError::GradReduceFp8),
            Some(d) => d,
            None => default_grad_reduce_dtype(dtype),
        };
        let fp8_param_gather = spec.fp8_param_gather.unwrap_or(false);
        if (fp8_param_gather || spec.fp8_library.is_some()) && dtype != Dtype::Fp8 {
            return Err(LayoutError::Fp8SettingNeedsFp8 {
                flag: if fp8_param_gather {
                    "--fp8-param-gather"
                } else {
                    "--fp8-library"
                },
                dtype: dtype.name(),
            });
        }
        if !cluster.spec.gpu.supports(dtype) {
            return Err(LayoutError::DtypeUnsupported {
                gpu: cluster.spec.gpu.name.clone(),
                dtype: dtype.name(),
            });
        }
        Ok(Layout {
            tp,
            pp,
            dp,
            cp,
            cp_comm: spec.cp_comm.unwrap_or(CpComm::P2p),
            cross_entropy: spec.cross_entropy.unwrap_or(CrossEntropy::VocabParallel),
            elementwise: spec.elementwise.unwrap_or(Elementwise::Fused),
            attention_kernel: spec.attention_kernel.unwrap_or(AttentionKernel::Native),
            ep,
            etp,
            moe_imbalance,
            moe_capacity,
            moe_dispatcher: spec.moe_dispatcher.unwrap_or(Dispatcher::Alltoall),
            layer_loads: Vec::new(),
            routing_file: None,
            world,
            micro_batch,
            micro_batches,
            global_batch,
            seq_len,
            sequence_parallel,
            recompute,
            recompute_modules,
            cuda_graphs,
            partition,
            zero,
            dtype,
            grad_reduce_dtype,
            fp8_param_gather,
            fp8_library: spec.fp8_library.unwrap_or(Fp8Library::TransformerEngine),
            rules,
            dp_bucket_elements,
            schedule,
            vpp,
            overlap,
            stage_layers,
            chunk_layers,
            pipeline_split,
            mtp_layers,
            chunk_mtp_layers,
            pipeline_layout: spec.pipeline_layout.clone(),
        })
    }

    /// The pipeline rank of each virtual stage (model chunk), in the order data flows through
    /// the model: round-robin, so rank r holds chunks r, r + pp, r + 2·pp, … — but under ZB-V
    /// rank r holds chunks r and 2·pp − 1 − r.
    pub fn virtual_stage_ranks(&self) -> Vec<usize> {
        virtual_stage_ranks(self.pp, self.vpp, self.schedule)
    }

    pub fn tokens_per_step(&self) -> u64 {
        self.global_batch * self.seq_len
    }

    /// Tokens the busiest expert computes, over the mean per expert: the router's imbalance,
    /// cut at the capacity when tokens are dropped, the capacity itself when padded to it.
    pub fn expert_load(&self) -> f64 {
        load_under_capacity(self.moe_imbalance, self.moe_capacity)
    }

    /// The layout with each layer's router load taken from a measured routing (a per-layer
    /// histogram of tokens per expert) instead of one imbalance for every layer.
    pub fn with_routing(
        mut self,
        routing: &ExpertRouting,
        arch: &Arch,
    ) -> Result<Layout, LayoutError> {
        self.layer_loads =
            routing.model_loads(arch, self.moe_imbalance, self.ep, self.moe_capacity)?;
        self.routing_file = Some(routing.path().to_path_buf());
        Ok(self)
    }

    /// The busiest expert-parallel rank's routed tokens over the mean in transformer layer
    /// `layer` (model order): the routing file's, else `expert_load()`.
    pub fn layer_load(&self, layer: u64) -> f64 {
        self.layer_loads
            .get(layer as usize)
            .copied()
            .unwrap_or_else(|| self.expert_load())
    }

    /// Whether the backward recomputes `module` (every module under full recomputation).
    pub fn recomputes(&self, module: RecomputeModule) -> bool {
        match self.recompute {
            Recompute::None | Recompute::SelectiveOp | Recompute::SelectiveLayer => false,
            Recompute::Full => true,
            Recompute::Selective => self
                .recompute_modules
                .as_ref()
                .map_or(module == RecomputeModule::CoreAttn, |m| m.contains(&module)),
        }
    }

    /// Ranks that hold the same parameters and reduce their gradients together (and over which
    /// a distributed optimizer shards): the data-parallel replicas times the context-parallel
    /// ranks, which see different tokens of the same sequences.
    pub fn grad_replicas(&self) -> u64 {
        self.dp * self.cp
    }

    /// Whether the parameters are sharded FSDP-style (ZeRO 3 over more than one replica).
    pub fn fsdp(&self) -> bool {
        self.zero >= 3 && self.grad_replicas() > 1
    }

    /// Whether FSDP gathers each layer's weights before its forward and its backward and
    /// reduce-scatters its gradients after, every micro-batch: without pipeline parallelism.
    /// Under it, PyTorch's pipelining stages (as torchtitan runs them) keep a stage's
    /// parameters gathered for the whole step (torchtitan turns `reshard_after_forward` off
    /// with pp > 1) and reduce-scatter its gradients once, in the last micro-batch's backward
    /// (the stage turns gradient sync on for the last backward only): one gather and one
    /// reduce-scatter a step, costed as the distributed optimizer's.
    pub fn fsdp_per_layer(&self) -> bool {
        self.fsdp() && self.pp == 1
    }

    /// Ranks that hold the same experts and reduce their gradients together (expert data
    /// parallelism): the tp · cp · dp ranks of a stage over etp · ep.
    pub fn expert_grad_replicas(&self) -> u64 {
        (self.tp * self.grad_replicas() / (self.etp * self.ep)).max(1)
    }

    /// Tokens of one sequence a rank holds: seq-len / cp.
    pub fn local_seq_len(&self) -> u64 {
        self.seq_len / self.cp
    }

    /// Whether Transformer Engine runs fp8 training: it caches fp8 weight casts and keeps the
    /// fp8 casts of GEMM inputs for the backward (`Fp8Library`).
    pub fn transformer_engine_fp8(&self) -> bool {
        self.dtype == Dtype::Fp8 && self.fp8_library == Fp8Library::TransformerEngine
    }

    /// The type the data-parallel parameter all-gathers (distributed optimizer, FSDP) carry:
    /// fp8 under `fp8_param_gather`, else the activations' 16 bits.
    pub fn param_gather_dtype(&self) -> Dtype {
        if self.fp8_param_gather {
            Dtype::Fp8
        } else {
            self.activation_dtype()
        }
    }

    /// What activations, gradients and every kernel but the GEMMs are held in: the training
    /// type, 16 bits (bf16) under an fp8 recipe, which runs only the GEMMs in fp8.
    pub fn activation_dtype(&self) -> Dtype {
        if self.dtype == Dtype::Fp8 {
            Dtype::Bf16
        } else {
            self.dtype
        }
    }
}

/// What gradients are reduced in unless told: fp32 when training in bf16 or fp8 (Megatron-LM,
/// NeMo's `bf16_mixed`, torchtitan, Composer's DEFAULT), fp16 under fp16.
pub fn default_grad_reduce_dtype(dtype: Dtype) -> Dtype {
    if dtype == Dtype::Fp16 {
        Dtype::Fp16
    } else {
        Dtype::Fp32
    }
}

/// A parallel degree: 1 when unset, at least 1, at most `MAX_DEGREE`.
fn degree(what: &'static str, v: Option<u64>) -> Result<u64, LayoutError> {
    bounded(what, v.unwrap_or(1), MAX_DEGREE)
}

fn bounded(what: &'static str, value: u64, max: u64) -> Result<u64, LayoutError> {
    match value {
        0 => Err(LayoutError::Zero { what }),
        v if v > max => Err(LayoutError::TooLarge {
            what,
            value: v,
            max,
        }),
        v => Ok(v),
    }
}

/// GPUs the layout needs, which the cluster must have.
fn check_world([tp, cp, pp, dp]: [u64; 4], cluster: &Cluster) -> Result<u64, LayoutError> {
    // each degree is at most 2^20: checked, a product past the limit is too large
    let world = [tp, cp, pp, dp]
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&w| w <= MAX_WORLD)
        .ok_or(LayoutError::TooLarge {
            what: "tp·cp·pp·dp (GPUs)",
            value: tp.saturating_mul(cp).saturating_mul(pp).saturating_mul(dp),
            max: MAX_WORLD,
        })?;
    let gpus = cluster.total_gpus();
    if world > gpus {
        return Err(LayoutError::TooManyGpus {
            tp,
            cp,
            pp,
            dp,
            world,
            cluster: cluster.spec.name.clone(),
            gpus,
            nodes: cluster.spec.nodes,
            gpus_per_node: cluster.spec.gpus_per_node,
            max_dp: (gpus / (tp * cp * pp)).max(1),
        });
    }
    Ok(world)
}

/// Context parallelism: Megatron-Core splits each sequence into 2·cp chunks (rank r holds
/// chunks r and 2·cp − 1 − r, so causal attention work is balanced), with fused attention.
fn check_context_parallel(
    arch: &Arch,
    rules: Rules,
    cp: u64,
    seq_len: u64,
) -> Result<(), LayoutError> {
    if cp == 1 {
        return Ok(());
    }
    if rules == Rules::Paper {
        return Err(LayoutError::CpUnderPaperRules);
    }
    if arch.attention != super::arch::AttentionImpl::Flash {
        return Err(LayoutError::CpNeedsFlashAttention {
            model: arch.name.clone(),
        });
    }
    if !seq_len.is_multiple_of(2 * cp) {
        return Err(LayoutError::SeqNotDivisibleByCp {
            seq_len,
            chunks: 2 * cp,
            divisors: divisors(seq_len / 2)
                .into_iter()
                .filter(|&d| d > 1 && d <= 64)
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    Ok(())
}

/// Expert parallelism and the router imbalance: ep divides the experts and the data-parallel
/// (× context-parallel) ranks it is carved from; the imbalance lies between 1 (balanced) and
/// experts / top-k (every token to the same k experts).
fn check_experts(
    spec: &ParallelSpec,
    arch: &Arch,
    rules: Rules,
    [tp, cp, dp]: [u64; 3],
    etp: u64,
) -> Result<(u64, f64), LayoutError> {
    let ep = degree("ep", spec.ep)?;
    // etp · ep · expert-dp fold over the stage's tp · cp · dp ranks
    let replicas = (tp * cp * dp) / etp;
    if !(tp * cp * dp).is_multiple_of(etp)
        || arch.moe.is_some_and(|m| !m.expert_ffn.is_multiple_of(etp))
    {
        return Err(LayoutError::EtpNotDivisible {
            etp,
            ranks: tp * cp * dp,
            expert_ffn: arch.moe.map_or(0, |m| m.expert_ffn),
        });
    }
    let Some(moe) = arch.moe else {
        // a balanced router (1, as a search's rows record it) is no setting at all
        if ep > 1 || spec.moe_imbalance.is_some_and(|f| f != 1.0) {
            return Err(LayoutError::ExpertsOnDenseModel {
                model: arch.name.clone(),
            });
        }
        return Ok((1, 1.0));
    };
    if rules == Rules::Paper {
        return Err(LayoutError::ExpertsUnderPaperRules);
    }
    if spec.zero == Some(3) {
        return Err(LayoutError::ExpertsWithFsdp);
    }
    if !moe.experts.is_multiple_of(ep) || !replicas.is_multiple_of(ep) {
        return Err(LayoutError::EpNotDivisible {
            ep,
            experts: moe.experts,
            replicas,
        });
    }
    let max = moe.experts as f64 / moe.top_k as f64;
    let f = spec.moe_imbalance.unwrap_or(1.0);
    if !(f.is_finite() && (1.0..=max).contains(&f)) {
        return Err(LayoutError::Imbalance { value: f, max });
    }
    Ok((ep, f))
}

/// The expert capacity factor and padding, checked: a mixture of experts only, between 0.05
/// and experts / top-k (beyond it nothing is ever dropped), padding only with a capacity.
fn check_capacity(spec: &ParallelSpec, arch: &Arch) -> Result<Option<(f64, bool)>, LayoutError> {
    let pad = spec.moe_pad_to_capacity == Some(true);
    let Some(factor) = spec.moe_capacity_factor else {
        return if pad {
            Err(LayoutError::PadWithoutCapacity)
        } else {
            Ok(None)
        };
    };
    let Some(moe) = arch.moe else {
        return Err(LayoutError::ExpertsOnDenseModel {
            model: arch.name.clone(),
        });
    };
    let max = moe.experts as f64 / moe.top_k as f64;
    if !(factor.is_finite() && (0.05..=max).contains(&factor)) {
        return Err(LayoutError::Capacity { value: factor, max });
    }
    Ok(Some((factor, pad)))
}

/// Heads, key/value heads and the MLP must split over tp; the layers must fill pp stages.
fn check_model_split(arch: &Arch, tp: u64, pp: u64) -> Result<(), LayoutError> {
    let model = || arch.name.clone();
    if !arch.heads.is_multiple_of(tp) {
        return Err(LayoutError::HeadsNotDivisible {
            model: model(),
            heads: arch.heads,
            tp,
            divisors: divisor_list(arch.heads, |_| true),
        });
    }
    if !arch.kv_heads.is_multiple_of(tp) && !tp.is_multiple_of(arch.kv_heads) {
        return Err(LayoutError::KvHeadsNotDivisible {
            model: model(),
            kv_heads: arch.kv_heads,
            tp,
            divisors: divisor_list(arch.heads, |d| {
                arch.kv_heads.is_multiple_of(d) || d % arch.kv_heads == 0
            }),
        });
    }
    if !arch.ffn_hidden.is_multiple_of(tp) {
        return Err(LayoutError::FfnNotDivisible {
            model: model(),
            ffn: arch.ffn_hidden,
            tp,
            divisors: divisor_list(arch.heads, |d| arch.ffn_hidden.is_multiple_of(d)),
        });
    }
    if arch.layers < pp {
        return Err(LayoutError::TooFewLayers {
            model: model(),
            layers: arch.layers,
            pp,
        });
    }
    Ok(())
}

/// Micro-batches per step on one pipeline, from the global batch or given directly.
fn micro_batches(spec: &ParallelSpec, micro_batch: u64, dp: u64) -> Result<u64, LayoutError> {
    let m = match (spec.global_batch, spec.micro_batches) {
        (Some(_), Some(_)) => return Err(LayoutError::BatchGivenTwice),
        (None, None) => return Err(LayoutError::BatchMissing),
        (None, Some(m)) => m,
        (Some(gb), None) => {
            // at least 1 (bounded); micro-batch ≤ 2^16 and dp ≤ 2^20: the product fits
            bounded("global batch", gb, MAX_GLOBAL_BATCH)?;
            let per_step = micro_batch * dp;
            if !gb.is_multiple_of(per_step) {
                return Err(LayoutError::BatchNotDivisible {
                    global_batch: gb,
                    micro_batch,
                    dp,
                    per_step,
                    example: (gb / per_step).max(1) * per_step,
                });
            }
            gb / per_step
        }
    };
    bounded("micro-batches per step", m, MAX_MICRO_BATCHES)
}

/// Where each of the pp·vpp model chunks runs: round robin (chunk k on rank k mod pp), or for
/// ZB-V in a V (the first pp chunks down the ranks, the last pp back up them, so the middle two
/// and the first and last share a rank).
pub(crate) fn virtual_stage_ranks(pp: u64, vpp: u64, schedule: Schedule) -> Vec<usize> {
    let (pp, n) = (pp as usize, (pp * vpp) as usize);
    (0..n)
        .map(|k| match schedule {
            Schedule::ZbV if k >= pp => 2 * pp - 1 - k,
            _ => k % pp,
        })
        .collect()
}

/// Transformer layers in each model chunk, in model order.
fn chunk_layers(
    spec: &ParallelSpec,
    arch: &Arch,
    [pp, vpp]: [u64; 2],
    schedule: Schedule,
    partition: Partition,
    split: PipelineSplit,
) -> Result<Vec<u64>, LayoutError> {
    if split.places() > 0 && partition == Partition::Neox {
        return Err(LayoutError::PipelineSplitWithNeox);
    }
    if vpp == 1 && split.places() == 0 {
        return partition_layers(arch.layers, pp, partition);
    }
    if spec.partition == Some(Partition::Neox) {
        return Err(LayoutError::NeoxWithChunks {
            schedule: schedule.name(),
        });
    }
    let chunks = pp * vpp;
    let places = arch.layers + split.places();
    if !places.is_multiple_of(chunks) {
        let accounted = arch.layers + 2;
        return Err(LayoutError::UnevenChunks {
            model: arch.name.clone(),
            layers: arch.layers,
            pp,
            vpp,
            hint: if schedule == Schedule::ZbV {
                if places.is_multiple_of(2) {
                    format!(
                        "the zb-v schedule runs 2 chunks a rank: use a pp that divides {}",
                        places / 2
                    )
                } else {
                    format!("the zb-v schedule needs 2·pp equal chunks, and {places} is odd")
                }
            } else if split.places() == 0
                && accounted.is_multiple_of(chunks)
                && accounted / chunks >= 2
            {
                format!(
                    "count the embedding and the loss as layers as Megatron can \
                     (--account-for-embedding-in-pipeline-split \
                     --account-for-loss-in-pipeline-split: ({} + 2) / {chunks} = {} per chunk), \
                     or {}",
                    arch.layers,
                    accounted / chunks,
                    chunks_hint(arch.layers, pp)
                )
            } else {
                chunks_hint(places, pp)
            },
        });
    }
    let per_chunk = places / chunks;
    let mut out = vec![per_chunk; chunks as usize];
    out[0] -= u64::from(split.embedding);
    out[chunks as usize - 1] -= u64::from(split.loss);
    if out.contains(&0) {
        return Err(LayoutError::EmptyChunk {
            model: arch.name.clone(),
            layers: arch.layers,
            chunks,
        });
    }
    Ok(out)
}

/// How `places` layer places can fill pp·vpp equal chunks: a vpp dividing places / pp, where
/// pp divides them at all; otherwise no vpp can, and pp must change.
fn chunks_hint(places: u64, pp: u64) -> String {
    if places.is_multiple_of(pp) {
        format!("use a vpp that divides {}", places / pp)
    } else {
        format!("no vpp splits {places} over pp = {pp}: use a pp that divides {places}")
    }
}

/// A pipeline layout string, checked against the model and the other pipeline settings: it
/// places every layer itself, so the split flags and the NeoX partition are refused beside
/// it; its chunks must fill pp ranks evenly (vpp = chunks / pp, or as given), and its
/// prediction modules must be the ones --mtp-layers asks for.
fn custom_layout(
    spec: &ParallelSpec,
    arch: &Arch,
    text: &str,
    pp: u64,
) -> Result<PipelineLayout, LayoutError> {
    for (set, flag) in [
        (
            spec.account_for_embedding_in_pipeline_split == Some(true),
            "--account-for-embedding-in-pipeline-split",
        ),
        (
            spec.account_for_loss_in_pipeline_split == Some(true),
            "--account-for-loss-in-pipeline-split",
        ),
        (spec.partition == Some(Partition::Neox), "--partition neox"),
    ] {
        if set {
            return Err(LayoutError::PipelineLayoutWith { flag });
        }
    }
    let layout = PipelineLayout::parse(text, arch.layers)?;
    let chunks = layout.chunks.len() as u64;
    if !chunks.is_multiple_of(pp) || spec.vpp.is_some_and(|v| v * pp != chunks) {
        return Err(LayoutError::PipelineLayoutChunks {
            chunks,
            pp,
            vpp: spec.vpp.unwrap_or(chunks / pp),
        });
    }
    if let Some(flag) = spec.mtp_layers.filter(|&n| n != layout.mtp_layers()) {
        return Err(LayoutError::PipelineLayoutMtp {
            layout: layout.mtp_layers(),
            flag,
        });
    }
    Ok(layout)
}

/// The recomputation and, for a selective one, its modules: modules imply selective
/// recomputation (another granularity beside them is refused), each must exist in the model,
/// and the paper's rules have none.
fn recompute_modules(
    spec: &ParallelSpec,
    arch: &Arch,
    rules: Rules,
) -> Result<(Recompute, Option<Vec<RecomputeModule>>), LayoutError> {
    let Some(given) = &spec.recompute_modules else {
        let default = if rules == Rules::Paper {
            Recompute::Full
        } else {
            Recompute::None
        };
        let recompute = spec.recompute.unwrap_or(default);
        // which matrix multiplies are every other one is known for a dense layer with its
        // query, key and value projections (torchtitan's Llama); not for latents or experts
        if recompute == Recompute::SelectiveOp {
            let other = if arch.mla.is_some() {
                Some("latent attention")
            } else if arch.moe.is_some() {
                Some("experts")
            } else if arch.attention != crate::workload::AttentionImpl::Flash {
                Some("unfused attention")
            } else {
                None
            };
            let why = match other {
                Some(what) => format!(
                    "costed for dense layers with query, key and value projections and a fused \
                     attention kernel (torchtitan's Llama), not for {}'s {what}: use \
                     --recompute selective (with --recompute-modules) or full",
                    arch.name
                ),
                None if rules == Rules::Paper => "the paper's rules recompute whole layers: use \
                                                  --rules megatron or --recompute full"
                    .into(),
                None => String::new(),
            };
            if !why.is_empty() {
                return Err(LayoutError::TorchtitanRecompute {
                    granularity: "selective-op",
                    why,
                });
            }
        }
        if recompute == Recompute::SelectiveLayer && rules == Rules::Paper {
            return Err(LayoutError::TorchtitanRecompute {
                granularity: "selective-layer",
                why: "the paper's rules recompute every layer: use --rules megatron or \
                      --recompute full"
                    .into(),
            });
        }
        return Ok((recompute, None));
    };
    let refuse = |why: String| Err(LayoutError::RecomputeModules { why });
    match spec.recompute {
        Some(r) if r != Recompute::Selective => {
            return refuse(format!(
                "modules are what --recompute selective rebuilds, not --recompute {r}: drop one"
            ))
        }
        _ => {}
    }
    if rules == Rules::Paper {
        return refuse("the paper's rules recompute whole layers: use --rules megatron".into());
    }
    if given.is_empty() {
        return refuse("give at least one module, e.g. core_attn".into());
    }
    let moe = arch.moe.as_ref();
    for &m in given {
        let missing = match m {
            RecomputeModule::MlaUpProj if arch.mla.is_none() => "latent attention",
            RecomputeModule::MoeAct | RecomputeModule::Moe if moe.is_none() => "experts",
            RecomputeModule::SharedExperts if moe.is_none_or(|m| m.shared_ffn() == 0) => {
                "shared experts"
            }
            RecomputeModule::Mlp if moe.is_some() && arch.dense_layers() == 0 => "a dense MLP",
            _ => continue,
        };
        return refuse(format!(
            "{m} needs {missing}, which {} has not: drop it",
            arch.name
        ));
    }
    let mut modules = given.clone();
    modules.sort();
    modules.dedup();
    Ok((Recompute::Selective, Some(modules)))
}

/// The parts of each layer captured in CUDA graphs, checked against the model: a scope needs
/// what it captures (a dense MLP, experts), `moe_preprocess` the router's graph it extends,
/// and a capture of the experts static shapes — dropless routing sizes the all-to-all and
/// the expert GEMMs from token counts it reads back to the host every micro-batch, which a
/// graph cannot replay (Megatron-Core's `moe` scope and its whole-layer graphs need static
/// shapes: NVIDIA's DeepSeek-V3 guide, its MoE CUDA-graph tests skip dropless `moe`).
fn cuda_graphs(
    spec: &ParallelSpec,
    arch: &Arch,
    rules: Rules,
    moe_capacity: Option<(f64, bool)>,
) -> Result<Vec<CudaGraphScope>, LayoutError> {
    let Some(given) = &spec.cuda_graphs else {
        return Ok(Vec::new());
    };
    let refuse = |why: String| Err(LayoutError::CudaGraphs { why });
    if given.is_empty() {
        return refuse("give at least one scope, e.g. attn, or none".into());
    }
    if given.contains(&CudaGraphScope::None) {
        if given.len() > 1 {
            return refuse("none captures nothing: give it alone".into());
        }
        return Ok(Vec::new());
    }
    if rules == Rules::Paper {
        return refuse(
            "the paper's rules cost its tool's eager GPT-NeoX step: use --rules megatron".into(),
        );
    }
    let mut scopes = given.clone();
    scopes.sort();
    scopes.dedup();
    let has = |s: CudaGraphScope| scopes.contains(&s);
    if has(CudaGraphScope::Layer) && scopes.len() > 1 {
        return refuse("layer captures the whole layer already: give it alone".into());
    }
    let moe = arch.moe.as_ref();
    for &s in &scopes {
        let missing = match s {
            CudaGraphScope::Moe | CudaGraphScope::MoeRouter | CudaGraphScope::MoePreprocess
                if moe.is_none() =>
            {
                "experts"
            }
            CudaGraphScope::Mlp if moe.is_some() && arch.dense_layers() == 0 => "a dense MLP",
            _ => continue,
        };
        return refuse(format!(
            "{s} captures {missing}, which {} has not: drop it",
            arch.name
        ));
    }
    if has(CudaGraphScope::MoePreprocess) && !has(CudaGraphScope::MoeRouter) {
        return refuse(
            "moe_preprocess extends the router's graph: give moe_router,moe_preprocess".into(),
        );
    }
    if has(CudaGraphScope::Moe) && has(CudaGraphScope::MoeRouter) {
        return refuse("moe captures the router and the preprocessing already: drop them".into());
    }
    let static_experts = matches!(moe_capacity, Some((_, true)));
    let whole_experts = has(CudaGraphScope::Moe) || (has(CudaGraphScope::Layer) && moe.is_some());
    if whole_experts && !static_experts {
        return refuse(format!(
            "{} is not padded to a capacity: dropless routing reads its token counts back to \
             the host every micro-batch, which a graph cannot replay; capture \
             attn,moe_router,moe_preprocess, or pad the experts' input (--moe-capacity-factor F \
             --moe-pad-to-capacity)",
            if has(CudaGraphScope::Moe) {
                "moe".to_string()
            } else {
                format!("layer on {}'s experts", arch.name)
            }
        ));
    }
    Ok(scopes)
}

/// Which communication runs beside the compute: the flags, else the rules' defaults.
fn overlap(
    spec: &ParallelSpec,
    rules: Rules,
    [zero, tp, dp, pp]: [u64; 4],
    sequence_parallel: bool,
    schedule: Schedule,
) -> Result<Overlap, LayoutError> {
    let megatron = rules == Rules::Megatron;
    // the parameters are gathered once a step: the distributed optimizer's, and FSDP's under
    // pipeline parallelism (see `Layout::fsdp_per_layer`)
    let distributed_optimizer =
        ((1..3).contains(&zero) || (zero >= 3 && pp > 1)) && dp > 1 && megatron;
    Ok(Overlap {
        grad_reduce: spec.overlap_grad_reduce.unwrap_or(megatron),
        param_gather: match spec.overlap_param_gather {
            Some(true) if !distributed_optimizer => {
                return Err(LayoutError::ParamGatherNeedsDistributedOptimizer)
            }
            Some(v) => v,
            None => distributed_optimizer,
        },
        p2p: spec
            .overlap_p2p
            .unwrap_or(megatron && schedule == Schedule::Interleaved),
        tp: match spec.tp_comm_overlap {
            Some(true) if tp > 1 && !sequence_parallel => {
                return Err(LayoutError::TpOverlapNeedsSequenceParallel)
            }
            Some(on) => on && tp > 1,
            None => false,
        },
        moe_a2a: spec.moe_a2a_overlap == Some(true),
    })
}

/// The schedule and the chunks per rank, checked against the layout.
fn schedule_and_chunks(
    spec: &ParallelSpec,
    vpp: Option<u64>,
    rules: Rules,
    pp: u64,
    micro_batches: u64,
) -> Result<(Schedule, u64), LayoutError> {
    let vpp_given = vpp;
    let vpp = bounded("vpp", vpp.unwrap_or(1), MAX_DEGREE)?;
    let schedule = spec.schedule.unwrap_or(match (rules, vpp) {
        (_, v) if v > 1 => Schedule::Interleaved,
        (Rules::Paper, _) => Schedule::ClosedForm,
        (Rules::Megatron, _) => Schedule::OneFOneB,
    });
    match schedule {
        Schedule::ZbV => match vpp_given {
            None | Some(2) => Ok((schedule, 2)),
            Some(vpp) => Err(LayoutError::VShapeTwoChunks { vpp }),
        },
        Schedule::Interleaved => {
            if pp < 2 || vpp < 2 {
                return Err(LayoutError::InterleavedNeedsChunks { pp, vpp });
            }
            if !micro_batches.is_multiple_of(pp) {
                return Err(LayoutError::MicroBatchesNotGroupsOfPp {
                    pp,
                    micro_batches,
                    suggested: micro_batches.div_ceil(pp) * pp,
                });
            }
            Ok((schedule, vpp))
        }
        _ if vpp > 1 => Err(LayoutError::ChunksNeedInterleaving {
            vpp,
            schedule: schedule.name(),
        }),
        _ => Ok((schedule, 1)),
    }
}

/// Divisors of `n` in increasing order (up to √n steps, so a huge head count cannot hang).
pub fn divisors(n: u64) -> Vec<u64> {
    let mut low = Vec::new();
    let mut high = Vec::new();
    let mut d = 1u64;
    while d.saturating_mul(d) <= n {
        if n.is_multiple_of(d) {
            low.push(d);
            if d != n / d {
                high.push(n / d);
            }
        }
        d += 1;
    }
    low.extend(high.into_iter().rev());
    low
}

/// Divisors of `n` as a list for a message.
fn divisor_list(n: u64, keep: impl Fn(u64) -> bool) -> String {
    divisors(n)
        .into_iter()
        .filter(|&d| keep(d))
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Transformer layers per pipeline stage.
pub fn partition_layers(layers: u64, pp: u64, rule: Partition) -> Result<Vec<u64>, LayoutError> {
    if pp == 0 || layers < pp {
        return Err(LayoutError::TooFewLayers {
            model: format!("{layers}-layer model"),
            layers,
            pp,
        });
    }
    match rule {
        Partition::Uniform => {
            let base = layers / pp;
            let extra = layers % pp;
            let mut out = vec![base; pp as usize];
            // the remainder (at most pp − 1) goes to the middle stages (the first holds the
            // embedding, the last the LM head), and one to the first if the middles are too few
            let order = (1..pp.saturating_sub(1) as usize).chain([0]);
            for stage in order.take(extra as usize) {
                out[stage] += 1;
            }
            Ok(out)
        }
        Partition::Neox => {
            if pp == 1 {
                return Ok(vec![layers]);
            }
            // DeepSpeed's partition_uniform over layers + 5 items, residual to the first parts
            let items = layers + 5;
            let (q, r) = (items / pp, items % pp);
            let mut out: Vec<i64> = (0..pp).map(|i| (q + (i < r) as u64) as i64).collect();
            out[0] -= 2;
            out[pp as usize - 1] -= 3;
            if out.iter().any(|&n| n < 1) {
                return Err(LayoutError::NeoxLeavesEmptyStage { layers, pp });
            }
            Ok(out.into_iter().map(|n| n as u64).collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn neox_partition_matches_the_paper() {
        // Llemma-7B, pp 4: 8, 9, 9, 6 (the paper's prediction file)
        assert_eq!(
            partition_layers(32, 4, Partition::Neox).unwrap(),
            vec![8, 9, 9, 6]
        );
        assert_eq!(
            partition_layers(44, 4, Partition::Neox).unwrap(),
            vec![11, 12, 12, 9]
        );
        // a stage of one layer runs; one of none is refused
        assert_eq!(partition_layers(4, 2, Partition::Neox).unwrap(), vec![3, 1]);
        assert_eq!(
            partition_layers(2, 2, Partition::Neox),
            Err(LayoutError::NeoxLeavesEmptyStage { layers: 2, pp: 2 })
        );
    }

    #[test]
    fn uniform_partition_spreads_the_remainder_over_middle_stages() {
        assert_eq!(
            partition_layers(32, 4, Partition::Uniform).unwrap(),
            vec![8; 4]
        );
        assert_eq!(
            partition_layers(34, 4, Partition::Uniform).unwrap(),
            vec![8, 9, 9, 8]
        );
        assert_eq!(
            partition_layers(5, 2, Partition::Uniform).unwrap(),
            vec![3, 2]
        );
        // more left over than middle stages: the first takes one, never the last
        assert_eq!(
            partition_layers(7, 4, Partition::Uniform).unwrap(),
            vec![2, 2, 2, 1]
        );
    }

    /// The GPUs, the model's divisibility and the batch: each refusal names the largest or
    /// nearest value that would run, and the values at the edge run.
    #[test]
    fn a_layout_that_does_not_fit_names_the_value_that_would() {
        let cluster = crate::hardware::dgx_h100_without_models()
            .with_nodes(2)
            .unwrap();
        let arch = Arch::resolve("llama3-8b").unwrap();
        let spec = |tp, pp, dp, global_batch| ParallelSpec {
            tp: Some(tp),
            pp: Some(pp),
            dp: Some(dp),
            global_batch: Some(global_batch),
            ..Default::default()
        };
        let new = |arch: &Arch, s: ParallelSpec| Layout::new(&s, arch, &cluster);
        // 16 GPUs: tp 2 · pp 2 · dp 4 fills them; dp 8 needs 32, and dp 4 is the most there is
        assert_eq!(new(&arch, spec(2, 2, 4, 8)).unwrap().world, 16);
        match new(&arch, spec(2, 2, 8, 8)) {
            Err(LayoutError::TooManyGpus {
                world: 32,
                gpus: 16,
                max_dp: 4,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        match new(&arch, spec(1, 3, 8, 8)) {
            Err(LayoutError::TooManyGpus { max_dp: 5, .. }) => {}
            other => panic!("{other:?}"),
        }
        // 24 heads in 6 key/value groups, an MLP of 6 × 2389: tp 4 splits the heads but not
        // the groups, tp 16 not the heads, tp 12 not the MLP
        let odd = Arch {
            heads: 24,
            kv_heads: 6,
            ffn_hidden: 14_334,
            layers: 3,
            ..arch.clone()
        };
        match new(&odd, spec(4, 1, 1, 1)) {
            Err(LayoutError::KvHeadsNotDivisible { divisors, .. }) => {
                assert_eq!(divisors, "1, 2, 3, 6, 12, 24")
            }
            other => panic!("{other:?}"),
        }
        match new(&odd, spec(16, 1, 1, 1)) {
            Err(LayoutError::HeadsNotDivisible { divisors, .. }) => {
                assert_eq!(divisors, "1, 2, 3, 4, 6, 8, 12, 24")
            }
            other => panic!("{other:?}"),
        }
        match new(&odd, spec(12, 1, 1, 1)) {
            Err(LayoutError::FfnNotDivisible { divisors, .. }) => {
                assert_eq!(divisors, "1, 2, 3, 6")
            }
            other => panic!("{other:?}"),
        }
        // as many stages as layers run; one more does not
        assert_eq!(new(&odd, spec(1, 3, 1, 3)).unwrap().stage_layers, [1, 1, 1]);
        assert_eq!(
            new(&odd, spec(1, 4, 1, 4)).unwrap_err(),
            LayoutError::TooFewLayers {
                model: odd.name.clone(),
                layers: 3,
                pp: 4
            }
        );
        // micro-batch 2 × dp 4 = 8 sequences in each round of micro-batches: 20 is not a
        // multiple, 16 is
        let batch = |global_batch| ParallelSpec {
            micro_batch: Some(2),
            ..spec(1, 1, 4, global_batch)
        };
        assert_eq!(new(&arch, batch(16)).unwrap().micro_batches, 2);
        assert_eq!(
            new(&arch, batch(20)).unwrap_err(),
            LayoutError::BatchNotDivisible {
                global_batch: 20,
                micro_batch: 2,
                dp: 4,
                per_step: 8,
                example: 16
            }
        );
        match new(&arch, batch(5)) {
            Err(LayoutError::BatchNotDivisible { example: 8, .. }) => {}
            other => panic!("{other:?}"),
        }
        // context parallelism cuts a sequence into 2·cp chunks: 4,224 tokens (2 × 2^6 · 3 · 11)
        // do not split into 10; the cp that would, up to 64, are the divisors of 2,112
        let cp = |cp, seq_len| ParallelSpec {
            cp: Some(cp),
            seq_len: Some(seq_len),
            ..spec(1, 1, 1, 1)
        };
        assert_eq!(new(&arch, cp(4, 4224)).unwrap().local_seq_len(), 1056);
        match new(&arch, cp(5, 4224)) {
            Err(LayoutError::SeqNotDivisibleByCp {
                seq_len: 4224,
                chunks: 10,
                divisors,
            }) => assert_eq!(
                divisors,
                "2, 3, 4, 6, 8, 11, 12, 16, 22, 24, 32, 33, 44, 48, 64"
            ),
            other => panic!("{other:?}"),
        }
        // 4,100 = 2 × 2 · 5² · 41 (whose doubling would offer 4, 8, 20 and 40 too)
        match new(&arch, cp(3, 4100)) {
            Err(LayoutError::SeqNotDivisibleByCp { divisors, .. }) => {
                assert_eq!(divisors, "2, 5, 10, 25, 41, 50")
            }
            other => panic!("{other:?}"),
        }
        // sequence parallelism splits a context-parallel rank's s / cp tokens over tp; the
        // multiple named also keeps 2·cp dividing the sequence
        let sp = |tp, cp, seq_len| ParallelSpec {
            cp: Some(cp),
            seq_len: Some(seq_len),
            sequence_parallel: Some(true),
            ..spec(tp, 1, 1, 1)
        };
        let refused_on = |arch: &Arch, tp, cp, seq_len| match new(arch, sp(tp, cp, seq_len)) {
            Err(LayoutError::SeqNotDivisibleByTp {
                tokens, multiple, ..
            }) => (tokens, multiple),
            other => panic!("tp {tp} cp {cp} seq {seq_len}: {other:?}"),
        };
        let refused = |tp, cp, seq_len| refused_on(&arch, tp, cp, seq_len);
        assert_eq!(refused(4, 1, 4098), (4098, 4));
        assert!(new(&arch, sp(4, 1, 4100)).is_ok());
        assert_eq!(refused(4, 2, 4100), (2050, 8));
        assert!(new(&arch, sp(4, 2, 4104)).is_ok());
        // an odd tp: 2·cp·tp; without sequence parallelism the same sequence runs
        let odd = Arch {
            heads: 30,
            kv_heads: 30,
            hidden: 3840,
            ffn_hidden: 10_230,
            ..arch.clone()
        };
        assert_eq!(refused_on(&odd, 3, 2, 4100), (2050, 12));
        assert!(new(&odd, sp(3, 2, 4104)).is_ok());
        let without = ParallelSpec {
            sequence_parallel: None,
            ..sp(4, 1, 4098)
        };
        assert!(new(&arch, without).is_ok());
    }

    /// Layers that do not fill pp·vpp chunks evenly: the refusal suggests counting the
    /// embedding and the loss as layers only where that evens them out (Llama 3.1 405B's 126
    /// layers + 2 in 8 × 8 chunks) and leaves each chunk two places or more; else a vpp.
    #[test]
    fn uneven_chunks_suggest_the_split_flags_only_where_they_would_even_them() {
        let arch = Arch::resolve("llama3-8b").unwrap();
        let spec = ParallelSpec::default();
        let chunks = |layers: u64, pp_vpp: [u64; 2], split: PipelineSplit| {
            let arch = Arch {
                layers,
                ..arch.clone()
            };
            chunk_layers(
                &spec,
                &arch,
                pp_vpp,
                Schedule::Interleaved,
                Partition::Uniform,
                split,
            )
        };
        let hint = |layers: u64, [pp, vpp]: [u64; 2], split: PipelineSplit| match chunks(
            layers,
            [pp, vpp],
            split,
        ) {
            Err(LayoutError::UnevenChunks { hint, .. }) => hint,
            other => panic!("{layers} layers, pp {pp} vpp {vpp}, {split:?}: {other:?}"),
        };
        let none = PipelineSplit::default();
        let flags = "--account-for-embedding-in-pipeline-split";
        // 126 + 2 = 128 places, 2 a chunk
        assert!(hint(126, [8, 8], none).contains(flags));
        // …and then a vpp only where pp divides the layers (126 over 8 ranks: none does)
        assert!(hint(126, [8, 8], none).ends_with("use a pp that divides 126"));
        assert!(hint(124, [4, 2], none).ends_with("use a vpp that divides 31"));
        // 6 + 2 = 8 places fill 8 chunks one each: a chunk of the embedding alone
        assert_eq!(hint(6, [2, 4], none), "use a vpp that divides 3");
        // 29 + 2 = 31 does not split into 8 either, nor 29 over 4 ranks at any vpp
        assert_eq!(
            hint(29, [4, 2], none),
            "no vpp splits 29 over pp = 4: use a pp that divides 29"
        );
        // the embedding already counted: 30 + 1 places over 8, the flags no help
        let embedding = PipelineSplit {
            embedding: true,
            loss: false,
        };
        assert_eq!(
            hint(30, [4, 2], embedding),
            "no vpp splits 31 over pp = 4: use a pp that divides 31"
        );
        assert_eq!(hint(35, [4, 2], embedding), "use a vpp that divides 9");
        // what does split evenly is split, the embedding's and the loss's places taken
        let both = PipelineSplit {
            embedding: true,
            loss: true,
        };
        assert_eq!(chunks(30, [4, 2], both).unwrap(), [3, 4, 4, 4, 4, 4, 4, 3]);
        assert!(matches!(
            chunks(6, [4, 2], both),
            Err(LayoutError::EmptyChunk { chunks: 8, .. })
        ));
    }

    /// Chunks per rank and the schedule go together: a vpp above 1 is the interleaved
    /// schedule (its default then), which needs pp and vpp of 2 or more and micro-batches in
    /// groups of pp; any other schedule takes one chunk per rank.
    #[test]
    fn chunks_per_rank_need_the_interleaved_schedule_and_it_needs_them() {
        use Schedule::*;
        let with = |schedule| ParallelSpec {
            schedule,
            ..Default::default()
        };
        let run = |schedule, vpp, pp, micro_batches| {
            schedule_and_chunks(&with(schedule), vpp, Rules::Megatron, pp, micro_batches)
        };
        assert_eq!(run(None, Some(2), 4, 8), Ok((Interleaved, 2)));
        assert_eq!(run(None, None, 4, 6), Ok((OneFOneB, 1)));
        let paper = schedule_and_chunks(&with(None), None, Rules::Paper, 4, 6);
        assert_eq!(paper, Ok((ClosedForm, 1)));
        for (pp, vpp) in [(1, 4), (4, 1)] {
            assert_eq!(
                run(Some(Interleaved), Some(vpp), pp, 8),
                Err(LayoutError::InterleavedNeedsChunks { pp, vpp })
            );
        }
        assert_eq!(
            run(None, Some(2), 4, 6),
            Err(LayoutError::MicroBatchesNotGroupsOfPp {
                pp: 4,
                micro_batches: 6,
                suggested: 8
            })
        );
        assert_eq!(
            run(Some(OneFOneB), Some(2), 4, 8),
            Err(LayoutError::ChunksNeedInterleaving {
                vpp: 2,
                schedule: "1f1b"
            })
        );
        assert_eq!(run(Some(Gpipe), Some(1), 4, 6), Ok((Gpipe, 1)));
    }

    /// ZB-V places two chunks a rank in a V: vpp is 2 whether given or not, any other is
    /// refused; the chunks need layers divisible by 2·pp, and a refusal names the pp that would
    /// split them.
    #[test]
    fn zb_v_places_two_chunks_a_rank_in_a_v() {
        let cluster = crate::hardware::dgx_h100_without_models();
        let arch = Arch::resolve("llama3-8b").unwrap();
        let spec = |pp, vpp| ParallelSpec {
            pp: Some(pp),
            dp: Some(8 / pp),
            vpp,
            schedule: Some(Schedule::ZbV),
            global_batch: Some(64),
            ..Default::default()
        };
        let l = Layout::new(&spec(4, None), &arch, &cluster).unwrap();
        assert_eq!((l.schedule, l.vpp), (Schedule::ZbV, 2));
        assert_eq!(l.virtual_stage_ranks(), [0, 1, 2, 3, 3, 2, 1, 0]);
        assert_eq!(l.stage_layers, [8, 8, 8, 8]);
        assert!(l.schedule.splits_backward());
        assert_eq!(
            Layout::new(&spec(4, Some(2)), &arch, &cluster).unwrap().vpp,
            2
        );
        assert_eq!(
            Layout::new(&spec(4, Some(4)), &arch, &cluster).unwrap_err(),
            LayoutError::VShapeTwoChunks { vpp: 4 }
        );
        // 32 layers over pp 8 · 2 chunks: 2 a chunk; 3 ranks cannot split 32 into 6 chunks
        let l = Layout::new(&spec(8, None), &arch, &cluster).unwrap();
        assert_eq!(
            l.virtual_stage_ranks(),
            [0, 1, 2, 3, 4, 5, 6, 7, 7, 6, 5, 4, 3, 2, 1, 0]
        );
        let three = ParallelSpec {
            dp: Some(2),
            ..spec(3, None)
        };
        match Layout::new(&three, &arch, &cluster) {
            Err(LayoutError::UnevenChunks { hint, .. }) => assert_eq!(
                hint,
                "the zb-v schedule runs 2 chunks a rank: use a pp that divides 16"
            ),
            other => panic!("{other:?}"),
        }
        let odd = Arch {
            layers: 31,
            ..arch.clone()
        };
        match Layout::new(&spec(4, None), &odd, &cluster) {
            Err(LayoutError::UnevenChunks { hint, .. }) => assert_eq!(
                hint,
                "the zb-v schedule needs 2·pp equal chunks, and 31 is odd"
            ),
            other => panic!("{other:?}"),
        }
    }

    /// An expert capacity lies between 0.05 and experts / top-k (Mixtral: 8 / 2), where every
    /// token already fits; padding needs one.
    #[test]
    fn an_expert_capacity_lies_below_experts_over_top_k() {
        let moe = crate::workload::presets::mixtral_8x7b();
        let capacity = |factor, pad| {
            let spec = ParallelSpec {
                moe_capacity_factor: factor,
                moe_pad_to_capacity: pad,
                ..Default::default()
            };
            check_capacity(&spec, &moe)
        };
        assert_eq!(capacity(Some(4.0), Some(true)), Ok(Some((4.0, true))));
        assert_eq!(capacity(Some(0.05), None), Ok(Some((0.05, false))));
        for value in [4.5, 0.04, f64::NAN] {
            match capacity(Some(value), None) {
                Err(LayoutError::Capacity { max, .. }) => assert_eq!(max, 4.0),
                other => panic!("{value}: {other:?}"),
            }
        }
        assert_eq!(capacity(None, None), Ok(None));
        assert_eq!(
            capacity(None, Some(true)),
            Err(LayoutError::PadWithoutCapacity)
        );
    }

    /// Expert parallelism folds over the stage's tp · cp · dp ranks: etp must divide both
    /// them and the expert MLP, ep both the experts and the replicas etp leaves.
    #[test]
    fn expert_settings_fit_the_ranks_and_the_model() {
        let moe = crate::workload::presets::mixtral_8x7b(); // 8 experts, top-2, MLP 14,336
        let dense = Arch::resolve("llama3-8b").unwrap();
        let spec = |ep, imbalance| ParallelSpec {
            ep,
            moe_imbalance: imbalance,
            ..Default::default()
        };
        let megatron = Rules::Megatron;
        // etp dividing the ranks but not the MLP, and the MLP but not the ranks
        assert_eq!(
            check_experts(&spec(None, None), &moe, megatron, [2, 2, 3], 3),
            Err(LayoutError::EtpNotDivisible {
                etp: 3,
                ranks: 12,
                expert_ffn: 14336
            })
        );
        assert_eq!(
            check_experts(&spec(None, None), &moe, megatron, [1, 1, 6], 4),
            Err(LayoutError::EtpNotDivisible {
                etp: 4,
                ranks: 6,
                expert_ffn: 14336
            })
        );
        // ep over the replicas etp leaves: 16 ranks / etp 2 = 8
        assert_eq!(
            check_experts(&spec(Some(8), Some(4.0)), &moe, megatron, [2, 1, 8], 2),
            Ok((8, 4.0))
        );
        assert_eq!(
            check_experts(&spec(Some(8), None), &moe, megatron, [2, 1, 4], 2),
            Err(LayoutError::EpNotDivisible {
                ep: 8,
                experts: 8,
                replicas: 4
            })
        );
        assert_eq!(
            check_experts(&spec(Some(3), None), &moe, megatron, [1, 1, 6], 1),
            Err(LayoutError::EpNotDivisible {
                ep: 3,
                experts: 8,
                replicas: 6
            })
        );
        assert_eq!(
            check_experts(&spec(Some(8), Some(4.5)), &moe, megatron, [1, 1, 8], 1),
            Err(LayoutError::Imbalance {
                value: 4.5,
                max: 4.0
            })
        );
        assert_eq!(
            check_experts(&spec(None, None), &moe, Rules::Paper, [1, 1, 8], 1),
            Err(LayoutError::ExpertsUnderPaperRules)
        );
        let fsdp = ParallelSpec {
            zero: Some(3),
            ..spec(None, None)
        };
        assert_eq!(
            check_experts(&fsdp, &moe, megatron, [1, 1, 8], 1),
            Err(LayoutError::ExpertsWithFsdp)
        );
        // a dense model takes a balanced router (a search's rows record 1) and nothing else
        assert_eq!(
            check_experts(&spec(None, Some(1.0)), &dense, megatron, [1, 1, 8], 1),
            Ok((1, 1.0))
        );
        for (ep, imbalance) in [(Some(2), None), (None, Some(1.5))] {
            assert_eq!(
                check_experts(&spec(ep, imbalance), &dense, megatron, [1, 1, 8], 1),
                Err(LayoutError::ExpertsOnDenseModel {
                    model: "llama3-8b".into()
                })
            );
        }
    }

    /// A pipeline layout places every layer itself: its chunks fill pp ranks evenly, vpp
    /// (given or chunks / pp) agrees, and the flags that would place layers too are refused.
    #[test]
    fn a_pipeline_layout_fills_pp_ranks_evenly() {
        let arch = Arch::resolve("llama3-8b").unwrap(); // 32 layers
        let eight = "Et*4|(t*4|)*6t*4L";
        let six = "Et*4|(t*6|)*4t*4L";
        let with_vpp = |vpp| ParallelSpec {
            vpp,
            ..Default::default()
        };
        let chunks = |r: Result<PipelineLayout, LayoutError>| r.unwrap().chunks.len();
        assert_eq!(
            chunks(custom_layout(&with_vpp(Some(2)), &arch, eight, 4)),
            8
        );
        assert_eq!(chunks(custom_layout(&with_vpp(None), &arch, eight, 2)), 8);
        assert_eq!(
            custom_layout(&with_vpp(Some(4)), &arch, eight, 4),
            Err(LayoutError::PipelineLayoutChunks {
                chunks: 8,
                pp: 4,
                vpp: 4
            })
        );
        assert_eq!(
            custom_layout(&with_vpp(None), &arch, six, 4),
            Err(LayoutError::PipelineLayoutChunks {
                chunks: 6,
                pp: 4,
                vpp: 1
            })
        );
        let neox = ParallelSpec {
            partition: Some(Partition::Neox),
            ..Default::default()
        };
        assert_eq!(
            custom_layout(&neox, &arch, eight, 4),
            Err(LayoutError::PipelineLayoutWith {
                flag: "--partition neox"
            })
        );
        let mtp = ParallelSpec {
            mtp_layers: Some(1),
            ..Default::default()
        };
        assert_eq!(
            custom_layout(&mtp, &arch, eight, 4),
            Err(LayoutError::PipelineLayoutMtp { layout: 0, flag: 1 })
        );
    }

    /// Torchtitan's every-other-matrix-multiply recomputation is costed for dense layers
    /// with fused attention, under Megatron's rules; the paper's recompute whole layers.
    #[test]
    fn selective_op_recomputation_needs_a_dense_fused_layer_and_megatron_rules() {
        let dense = Arch::resolve("llama3-8b").unwrap();
        let moe = crate::workload::presets::mixtral_8x7b();
        let spec = ParallelSpec {
            recompute: Some(Recompute::SelectiveOp),
            ..Default::default()
        };
        assert_eq!(
            recompute_modules(&spec, &dense, Rules::Megatron),
            Ok((Recompute::SelectiveOp, None))
        );
        let why = |arch: &Arch, rules| match recompute_modules(&spec, arch, rules) {
            Err(LayoutError::TorchtitanRecompute { granularity, why }) => {
                assert_eq!(granularity, "selective-op");
                why
            }
            other => panic!("{other:?}"),
        };
        assert!(why(&dense, Rules::Paper).contains("paper's rules"));
        assert!(why(&moe, Rules::Megatron).contains("experts"));
    }

    /// Recompute modules each need what they rebuild in the model, come sorted without
    /// repeats, and imply selective recomputation.
    #[test]
    fn recompute_modules_exist_in_the_model() {
        use RecomputeModule::*;
        let dense = Arch::resolve("llama3-8b").unwrap();
        let moe = crate::workload::presets::mixtral_8x7b(); // no shared experts, no dense layer
        let spec = |modules: &[RecomputeModule], recompute| ParallelSpec {
            recompute,
            recompute_modules: Some(modules.to_vec()),
            ..Default::default()
        };
        let why =
            |arch: &Arch, modules: &[RecomputeModule], recompute, rules| match recompute_modules(
                &spec(modules, recompute),
                arch,
                rules,
            ) {
                Err(LayoutError::RecomputeModules { why }) => why,
                other => panic!("{modules:?}: {other:?}"),
            };
        let megatron = Rules::Megatron;
        assert_eq!(
            recompute_modules(&spec(&[Mlp, CoreAttn, Mlp], None), &dense, megatron),
            Ok((Recompute::Selective, Some(vec![CoreAttn, Mlp])))
        );
        assert_eq!(
            recompute_modules(
                &spec(&[MoeAct, Layernorm], Some(Recompute::Selective)),
                &moe,
                megatron
            ),
            Ok((Recompute::Selective, Some(vec![Layernorm, MoeAct])))
        );
        // a mixture with dense layers between its expert ones has dense MLPs to recompute
        let mut interleaved = moe.clone();
        if let Some(m) = interleaved.moe.as_mut() {
            (m.every, m.offset) = (2, 1);
        }
        assert_eq!(
            recompute_modules(&spec(&[Mlp], None), &interleaved, megatron),
            Ok((Recompute::Selective, Some(vec![Mlp])))
        );
        for (arch, module, missing) in [
            (&dense, MlaUpProj, "latent attention"),
            (&dense, MoeAct, "experts"),
            (&dense, Moe, "experts"),
            (&dense, SharedExperts, "shared experts"),
            (&moe, SharedExperts, "shared experts"),
            (&moe, Mlp, "a dense MLP"),
        ] {
            let why = why(arch, &[CoreAttn, module], None, megatron);
            assert!(
                why.contains(&format!("needs {missing},")),
                "{module}: {why}"
            );
        }
        assert!(why(&dense, &[CoreAttn], Some(Recompute::Full), megatron).contains("drop one"));
        assert!(why(&dense, &[CoreAttn], None, Rules::Paper).contains("paper's rules"));
        assert!(why(&dense, &[], None, megatron).contains("at least one"));
    }

    /// The parameter all-gather overlaps by default where parameters are gathered once a
    /// step (the distributed optimizer; FSDP under a pipeline) across dp > 1 under
    /// Megatron's rules, and is refused elsewhere; p2p overlaps by default on Megatron's
    /// interleaved schedule; TP overlap needs sequence parallelism.
    #[test]
    fn overlap_defaults_follow_the_optimizer_and_the_schedule() {
        let none = ParallelSpec::default();
        let megatron = Rules::Megatron;
        let gathers = |rules, zero, dp, pp| {
            overlap(&none, rules, [zero, 1, dp, pp], false, Schedule::OneFOneB)
                .unwrap()
                .param_gather
        };
        assert!(gathers(megatron, 1, 8, 1));
        assert!(gathers(megatron, 2, 2, 1));
        assert!(gathers(megatron, 3, 8, 2));
        for (rules, zero, dp, pp) in [
            (megatron, 0, 8, 2),
            (megatron, 3, 8, 1),
            (megatron, 1, 1, 1),
            (megatron, 0, 1, 1),
            (Rules::Paper, 1, 8, 1),
        ] {
            assert!(
                !gathers(rules, zero, dp, pp),
                "{rules:?} zero {zero} dp {dp} pp {pp}"
            );
        }
        let asked = |on| ParallelSpec {
            overlap_param_gather: Some(on),
            ..Default::default()
        };
        let gather = |spec: &ParallelSpec, zero| {
            overlap(spec, megatron, [zero, 1, 8, 1], false, Schedule::OneFOneB)
                .map(|o| o.param_gather)
        };
        assert_eq!(gather(&asked(true), 1), Ok(true));
        assert_eq!(gather(&asked(false), 1), Ok(false));
        assert_eq!(
            gather(&asked(true), 0),
            Err(LayoutError::ParamGatherNeedsDistributedOptimizer)
        );
        let p2p = |rules, schedule| {
            overlap(&none, rules, [1, 1, 8, 2], false, schedule)
                .unwrap()
                .p2p
        };
        assert!(p2p(megatron, Schedule::Interleaved));
        assert!(!p2p(megatron, Schedule::OneFOneB));
        assert!(!p2p(Rules::Paper, Schedule::Interleaved));
        let tp_overlap = ParallelSpec {
            tp_comm_overlap: Some(true),
            ..Default::default()
        };
        let tp = |tp, sequence_parallel| {
            overlap(
                &tp_overlap,
                megatron,
                [1, tp, 8, 1],
                sequence_parallel,
                Schedule::OneFOneB,
            )
            .map(|o| o.tp)
        };
        assert_eq!(tp(2, true), Ok(true));
        assert_eq!(tp(1, false), Ok(false));
        assert_eq!(
            tp(2, false),
            Err(LayoutError::TpOverlapNeedsSequenceParallel)
        );
    }

    /// What `--cuda-graphs` refuses, and how it normalises what it takes.
    #[test]
    fn cuda_graph_scopes_are_checked_against_the_model() {
        use CudaGraphScope::*;
        let cluster = crate::hardware::dgx_h100_without_models();
        let dense = Arch::resolve("llama3-8b").unwrap();
        let moe = crate::workload::presets::mixtral_8x7b();
        let layout = |arch: &Arch, scopes: &[CudaGraphScope], extra: ParallelSpec| {
            let spec = ParallelSpec {
                dp: Some(8),
                ep: arch.moe.is_some().then_some(8),
                global_batch: Some(8),
                cuda_graphs: Some(scopes.to_vec()),
                ..extra
            };
            Layout::new(&spec, arch, &cluster)
        };
        let why = |r: Result<Layout, LayoutError>| match r {
            Err(LayoutError::CudaGraphs { why }) => why,
            other => panic!("{other:?}"),
        };
        let ok = |r: Result<Layout, LayoutError>| r.unwrap().cuda_graphs;
        let none = ParallelSpec::default;
        assert_eq!(ok(layout(&dense, &[Mlp, Attn, Attn], none())), [Attn, Mlp]);
        assert!(ok(layout(&dense, &[None], none())).is_empty());
        assert!(why(layout(&dense, &[None, Attn], none())).contains("alone"));
        assert!(why(layout(&dense, &[Layer, Attn], none())).contains("whole layer"));
        assert!(why(layout(&dense, &[MoeRouter], none())).contains("experts"));
        assert!(why(layout(&moe, &[Mlp], none())).contains("dense MLP"));
        let mut interleaved = moe.clone();
        if let Some(m) = interleaved.moe.as_mut() {
            (m.every, m.offset) = (2, 1);
        }
        assert_eq!(ok(layout(&interleaved, &[Mlp], none())), [Mlp]);
        assert!(why(layout(&moe, &[MoePreprocess], none())).contains("moe_router"));
        assert!(why(layout(&moe, &[Moe, MoeRouter], none())).contains("already"));
        // whole expert blocks need static shapes
        assert!(why(layout(&moe, &[Moe], none())).contains("capacity"));
        assert!(why(layout(&moe, &[Layer], none())).contains("capacity"));
        let padded = || ParallelSpec {
            moe_capacity_factor: Some(1.25),
            moe_pad_to_capacity: Some(true),
            ..Default::default()
        };
        assert_eq!(ok(layout(&moe, &[Layer], padded())), [Layer]);
        assert_eq!(
            ok(layout(&moe, &[Attn, MoeRouter, MoePreprocess], none())),
            [Attn, MoeRouter, MoePreprocess]
        );
        let paper = ParallelSpec {
            rules: Some(Rules::Paper),
            ..Default::default()
        };
        assert!(why(layout(&dense, &[Attn], paper)).contains("paper"));
    }

    proptest! {
        #[test]
        fn stages_sum_to_the_model(layers in 1u64..200, pp in 1u64..64) {
            for rule in [Partition::Uniform, Partition::Neox] {
                if let Ok(stages) = partition_layers(layers, pp, rule) {
                    prop_assert_eq!(stages.len() as u64, pp);
                    prop_assert_eq!(stages.iter().sum::<u64>(), layers);
                    prop_assert!(stages.iter().all(|&n| n >= 1));
                }
            }
            // uniform always works when layers >= pp
            prop_assert_eq!(partition_layers(layers, pp, Partition::Uniform).is_ok(), layers >= pp);
        }
    }
}

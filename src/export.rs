//! A predicted layout as the launch arguments or recipe a training framework takes, so the
//! layout that was costed is the layout that runs. What a framework cannot express exactly
//! (a schedule it lacks, a sharding stage it does not have) is refused with what to change,
//! never approximated silently; what the layout does not decide (data, tokenizer, learning
//! rate) is left to the framework's defaults and said so in the notes.

use std::fmt::Write;

use crate::error::{Error, Result};
use crate::ops::Dtype;
use crate::workload::{
    Activation, Arch, AttentionKernel, CpComm, CrossEntropy, CudaGraphScope, Dispatcher,
    Elementwise, Fp8Library, Layout, MoeSpec, NormKind, ParallelSpec, Partition, Position,
    QkNormSpan, Recompute, Rules, Schedule, DEFAULT_VOCAB_DIVISOR,
};

crate::named_enum!(
    /// The training framework a layout is exported to.
    pub enum Framework {
        /// Megatron-LM's `pretrain_gpt.py` (Megatron-Core), launched with torchrun.
        Megatron => "megatron",
        /// A NeMo 2.0 recipe (Python, NeMo-Run), Megatron-Core underneath.
        Nemo => "nemo",
        /// A torchtitan job configuration (TOML), launched with torchrun.
        Torchtitan => "torchtitan",
    }
);

impl Framework {
    /// What the framework runs unless told otherwise, among the choices stepcast costs: a
    /// layout given for it starts from these (its own settings win). Megatron-LM and NeMo
    /// run what a layout defaults to already; torchtitan runs PyTorch's cross-entropy on the
    /// fp32 logits, SDPA's flash backend (FlashAttention-2), context parallelism that
    /// all-gathers the keys and values, its model code eagerly (`[compile] enable = false`)
    /// unless `job` overlaps TP communication (async tensor parallelism needs `torch.compile`),
    /// and (training in fp8) torchao's float8.
    pub fn implied(self, job: &ParallelSpec) -> ParallelSpec {
        let dtype = job.dtype;
        match self {
            Framework::Megatron | Framework::Nemo => ParallelSpec::default(),
            Framework::Torchtitan => ParallelSpec {
                cross_entropy: Some(CrossEntropy::Pytorch),
                attention_kernel: Some(AttentionKernel::FlashAttention2),
                elementwise: Some(if job.tp_comm_overlap == Some(true) {
                    Elementwise::Fused
                } else {
                    Elementwise::Eager
                }),
                cp_comm: Some(CpComm::AllGather),
                fp8_library: (dtype == Some(Dtype::Fp8)).then_some(Fp8Library::Torchao),
                ..ParallelSpec::default()
            },
        }
    }
}

/// A layout as one framework takes it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Launch {
    /// The framework it is for.
    pub framework: Framework,
    /// The name to save `text` under (`launch.sh`, `recipe.py`, `job.toml`).
    pub file_name: &'static str,
    /// The script, recipe or configuration.
    pub text: String,
    /// What the user still decides, or where the framework differs in detail from what
    /// stepcast costed.
    pub notes: Vec<String>,
}

/// What an export is made from: the architecture, the checked layout and the node size.
pub struct Target<'a> {
    pub arch: &'a Arch,
    pub layout: &'a Layout,
    pub gpus_per_node: u64,
    /// The first line of the output: what was predicted (model, cluster, step time).
    pub headline: String,
}

/// The frameworks whose launch `export` writes for `layout`, as it was costed.
pub fn runs_as_costed_on(arch: &Arch, layout: &Layout, gpus_per_node: u64) -> Vec<Framework> {
    let target = Target {
        arch,
        layout,
        gpus_per_node,
        headline: String::new(),
    };
    Framework::ALL
        .iter()
        .copied()
        .filter(|&f| export(f, &target).is_ok())
        .collect()
}

/// `target` in `framework`'s terms, or why that framework cannot run it as costed.
pub fn export(framework: Framework, target: &Target) -> Result<Launch> {
    let l = target.layout;
    let refuse = |why: String| Err(Error::Invalid(format!("{}: {why}", framework.name())));
    if l.rules == Rules::Paper {
        return refuse(
            "the paper's rules describe GPT-NeoX with DeepSpeed (NeoX stage partition, \
             closed-form schedule): predict with --rules megatron and export that layout"
                .into(),
        );
    }
    // stepcast costs key/value heads replicated where tp is a multiple of them; no framework
    // here runs that
    let kv = target.arch.kv_heads;
    if !kv.is_multiple_of(l.tp) {
        let fits: Vec<String> = crate::workload::parallel::divisors(kv)
            .iter()
            .map(|d| d.to_string())
            .collect();
        let rule = match framework {
            Framework::Megatron | Framework::Nemo => format!(
                "Megatron-Core requires num_query_groups ({kv}) to be a multiple of \
                 tensor_model_parallel_size ({})",
                l.tp
            ),
            Framework::Torchtitan => format!(
                "torchtitan shards whole key/value heads over tp: {kv} do not split over tp = {}",
                l.tp
            ),
        };
        return refuse(format!(
            "{rule} (stepcast costs the heads replicated over tp; the framework does not \
             replicate them): predict with tp ∈ {{{}}}",
            fits.join(", ")
        ));
    }
    let (nodes, per_node) = nodes(l.world, target.gpus_per_node)?;
    match framework {
        Framework::Megatron => megatron(target, nodes, per_node),
        Framework::Nemo => nemo(target, nodes, per_node),
        Framework::Torchtitan => torchtitan(target, nodes, per_node),
    }
}

/// Nodes and processes per node for `world` GPUs on nodes of `gpus_per_node`.
fn nodes(world: u64, gpus_per_node: u64) -> Result<(u64, u64)> {
    if world <= gpus_per_node {
        return Ok((1, world));
    }
    if !world.is_multiple_of(gpus_per_node) {
        return Err(Error::Invalid(format!(
            "{world} GPUs do not fill whole nodes of {gpus_per_node}: choose tp · pp · dp as a \
             multiple of {gpus_per_node}"
        )));
    }
    Ok((world / gpus_per_node, gpus_per_node))
}

/// Stage sizes a Megatron-Core layout can state: all equal, or the first and / or last
/// different and the rest equal. `Some((first, last))` for the uneven ends (`None` = even).
fn uneven_ends(stages: &[u64]) -> Option<(Option<u64>, Option<u64>)> {
    let n = stages.len();
    if n <= 1 || stages.iter().all(|&s| s == stages[0]) {
        return Some((None, None));
    }
    let middle = &stages[1..n - 1];
    let common = middle.first().copied();
    if middle.iter().any(|&s| Some(s) != common) {
        return None;
    }
    let (first, last) = (stages[0], stages[n - 1]);
    match common {
        None => Some((Some(first), None)),
        Some(c) => Some(((first != c).then_some(first), (last != c).then_some(last))),
    }
}

/// Refuses what Megatron-Core (Megatron-LM and NeMo) has no switch for.
fn megatron_core_refusals(framework: Framework, l: &Layout) -> Result<()> {
    let refuse = |why: &str| Err(Error::Invalid(format!("{}: {why}", framework.name())));
    match l.schedule {
        Schedule::Gpipe => {
            return refuse(
                "Megatron-Core has no GPipe schedule: predict with --schedule 1f1b or \
                 interleaved and export that",
            )
        }
        Schedule::ZbH1 => {
            return refuse(
                "Megatron-Core has no ZB-H1 schedule (it lives in Sea AI Lab's zero-bubble fork): \
                 predict with --schedule 1f1b or interleaved and export that",
            )
        }
        Schedule::ZbV => {
            return refuse(
                "Megatron-Core has no ZB-V schedule (torchtitan runs it: --framework \
                 torchtitan): predict with --schedule 1f1b or interleaved and export that",
            )
        }
        _ => {}
    }
    if l.ep > 1 && l.tp > 1 && !l.sequence_parallel {
        return refuse(
            "Megatron-Core trains expert and tensor parallelism together only with sequence \
             parallelism (its ModelParallelConfig raises without it; newer releases warn that it \
             must be used): predict with --sequence-parallel",
        );
    }
    if l.zero >= 2 {
        return refuse(
            "Megatron-Core's distributed optimizer is ZeRO 1; its FSDP options change with every \
             release: predict with --zero 1 (or 0) and export that",
        );
    }
    if l.elementwise == Elementwise::Eager {
        return refuse(
            "Megatron-Core runs its norms, rotary embedding and activation as fused kernels, \
             never PyTorch's eager operations: predict with --elementwise fused",
        );
    }
    if uneven_ends(&l.stage_layers).is_none() {
        let fix = match l.partition {
            Partition::Neox => "predict with --partition uniform".to_string(),
            // the uniform split puts a remainder in the middle stages
            Partition::Uniform => format!(
                "predict with a pp that divides the {} layers, or give the split with \
                 --pipeline-layout",
                l.stage_layers.iter().sum::<u64>()
            ),
        };
        return refuse(&format!(
            "Megatron-Core sets only the first and last stage apart: stages of {:?} layers; \
             {fix}",
            l.stage_layers
        ));
    }
    Ok(())
}

/// Megatron-Core's `--moe-token-dispatcher-type` for a dispatcher.
fn dispatcher_type(d: Dispatcher) -> &'static str {
    match d {
        Dispatcher::Alltoall => "alltoall",
        Dispatcher::Allgather => "allgather",
        Dispatcher::Deepep | Dispatcher::Hybridep => "flex",
    }
}

/// The flex dispatcher's backend (`--moe-flex-dispatcher-backend`).
fn flex_backend(d: Dispatcher) -> Option<&'static str> {
    match d {
        Dispatcher::Deepep => Some("deepep"),
        Dispatcher::Hybridep => Some("hybridep"),
        _ => None,
    }
}

/// The `--vocab-size` under which Megatron's NullTokenizer builds the costed embedding: the
/// tokenizer adds its end-of-document token (`vocab_size + 1`) and Megatron pads that to a
/// multiple of `make-vocab-size-divisible-by`·tp, so a vocabulary already at that multiple
/// would grow by a whole multiple unless given one less.
fn null_tokenizer_vocab(a: &Arch, tp: u64) -> u64 {
    let padded = a.padded_vocab(tp);
    if a.vocab < padded {
        a.vocab
    } else {
        padded - 1
    }
}

fn megatron(t: &Target, nodes: u64, per_node: u64) -> Result<Launch> {
    let (a, l) = (t.arch, t.layout);
    megatron_core_refusals(Framework::Megatron, l)?;
    let mut args: Vec<String> = Vec::new();
    let mut arg = |s: String| args.push(s);
    arg(format!("--tensor-model-parallel-size {}", l.tp));
    arg(format!("--pipeline-model-parallel-size {}", l.pp));
    if let Some(m) = &a.moe {
        arg(format!(
            "--num-experts {} --moe-router-topk {} --moe-ffn-hidden-size {} \
             --expert-model-parallel-size {} --expert-tensor-parallel-size {} \
             --moe-token-dispatcher-type {} --moe-grouped-gemm",
            m.experts,
            m.top_k,
            m.expert_ffn,
            l.ep,
            l.etp,
            dispatcher_type(l.moe_dispatcher)
        ));
        if let Some(backend) = flex_backend(l.moe_dispatcher) {
            arg(format!("--moe-flex-dispatcher-backend {backend}"));
        }
        if m.topk_groups > 0 {
            arg(format!(
                "--moe-router-num-groups {} --moe-router-group-topk {}",
                m.groups, m.topk_groups
            ));
        }
        if m.shared_ffn() > 0 {
            arg(format!(
                "--moe-shared-expert-intermediate-size {}",
                m.shared_ffn()
            ));
        }
        if let Some((factor, pad)) = l.moe_capacity {
            arg(format!("--moe-expert-capacity-factor {factor}"));
            if pad {
                arg("--moe-pad-expert-input-to-capacity".into());
            }
        }
    }
    if l.cp > 1 {
        arg(format!("--context-parallel-size {}", l.cp));
        arg(format!(
            "--cp-comm-type {}",
            match l.cp_comm {
                CpComm::P2p => "p2p",
                CpComm::AllGather => "all_gather",
            }
        ));
    }
    let split = l.pipeline_split;
    if let Some(layout) = &l.pipeline_layout {
        // the layout string places every chunk itself (and implies vpp)
        arg(format!("--pipeline-model-parallel-layout \"{layout}\""));
    } else if l.vpp > 1 && split.places() > 0 {
        // the chunks are not all of one size: name their number, not their size
        arg(format!("--num-virtual-stages-per-pipeline-rank {}", l.vpp));
    } else if l.vpp > 1 {
        arg(format!(
            "--num-layers-per-virtual-pipeline-stage {}",
            a.layers / (l.pp * l.vpp)
        ));
    }
    if split.embedding {
        arg("--account-for-embedding-in-pipeline-split".into());
    }
    if split.loss {
        arg("--account-for-loss-in-pipeline-split".into());
    }
    match uneven_ends(&l.stage_layers) {
        Some((first, last)) if split.places() == 0 && l.pipeline_layout.is_none() => {
            if let Some(f) = first {
                arg(format!("--decoder-first-pipeline-num-layers {f}"));
            }
            if let Some(n) = last {
                arg(format!("--decoder-last-pipeline-num-layers {n}"));
            }
        }
        _ => {}
    }
    if l.sequence_parallel {
        arg("--sequence-parallel".into());
    }
    if l.cross_entropy == CrossEntropy::Fused {
        arg("--cross-entropy-loss-fusion --cross-entropy-fusion-impl te".into());
    }
    arg(format!("--micro-batch-size {}", l.micro_batch));
    arg(format!("--global-batch-size {}", l.global_batch));
    arg(format!("--seq-length {}", l.seq_len));
    arg(format!(
        "--max-position-embeddings {}",
        l.seq_len.max(a.seq_len)
    ));
    arg(format!("--num-layers {}", a.layers));
    arg(format!("--hidden-size {}", a.hidden));
    arg(format!("--ffn-hidden-size {}", a.ffn_hidden));
    arg(format!("--num-attention-heads {}", a.heads));
    if a.kv_heads != a.heads {
        arg(format!(
            "--group-query-attention --num-query-groups {}",
            a.kv_heads
        ));
    }
    match a.activation {
        Activation::Swiglu => arg("--swiglu".into()),
        Activation::SquaredRelu => arg("--squared-relu".into()),
        Activation::Gelu => {}
        Activation::Geglu => {
            return Err(Error::Invalid(
                "megatron: Megatron-LM's arguments have no GeGLU MLP (only --swiglu); set \
                 gated_linear_unit and a GELU activation in a Megatron-Core TransformerConfig"
                    .into(),
            ))
        }
    }
    if olmo_parts(a) {
        return Err(Error::Invalid(format!("megatron: {OLMO_PARTS}")));
    }
    if a.chunked_attention {
        return Err(Error::Invalid(format!("megatron: {CHUNKED}")));
    }
    if gemma_parts(a) {
        return Err(Error::Invalid(
            "megatron: Megatron-LM's arguments have no norms after the attention and MLP \
             outputs, logit soft-capping nor scaled embeddings (Gemma's): NeMo's Gemma layer \
             specs add them"
                .into(),
        ));
    }
    if let Some(m) = &a.mla {
        arg("--multi-latent-attention".into());
        if let Some(r) = m.q_lora_rank {
            arg(format!("--q-lora-rank {r}"));
        }
        arg(format!(
            "--kv-lora-rank {} --qk-head-dim {} --qk-pos-emb-head-dim {} --v-head-dim {}",
            m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim
        ));
    } else if a.head_dim * a.heads != a.hidden {
        arg(format!("--kv-channels {}", a.head_dim));
    }
    if l.mtp_layers > 0 {
        arg(format!("--mtp-num-layers {}", l.mtp_layers));
    }
    if let Some(m) = a.moe.filter(|_| a.dense_layers() > 0) {
        arg(format!(
            "--moe-layer-freq \"({})\"",
            moe_layer_freq(a.layers, &m)
        ));
    }
    if let Some(w) = a.sliding_window {
        arg(format!("--window-size {},0", w.saturating_sub(1)));
        if let Some(n) = a.global_attention_every {
            arg(format!("--window-attn-skip-freq {n}"));
        }
    }
    if a.qkv_bias && !a.linear_bias {
        arg("--add-qkv-bias".into());
    }
    if a.qk_norm {
        arg("--qk-layernorm".into());
    }
    if a.norm == NormKind::Rmsnorm {
        arg("--normalization RMSNorm".into());
    }
    arg(match a.position {
        Position::Rope => "--position-embedding-type rope".into(),
        Position::Learned => "--position-embedding-type learned_absolute".into(),
        Position::Alibi => {
            return Err(Error::Invalid(
                "megatron: Megatron-Core has no ALiBi position embedding".into(),
            ))
        }
    });
    if !a.tied_embeddings {
        arg("--untie-embeddings-and-output-weights".into());
    }
    if !a.linear_bias {
        arg("--disable-bias-linear".into());
    }
    if !a.dropout {
        arg("--attention-dropout 0 --hidden-dropout 0".into());
    }
    let vocab_size = null_tokenizer_vocab(a, l.tp);
    arg(format!(
        "--vocab-size {vocab_size} --tokenizer-type NullTokenizer"
    ));
    if a.vocab_divisible_by != DEFAULT_VOCAB_DIVISOR {
        arg(format!(
            "--make-vocab-size-divisible-by {}",
            a.vocab_divisible_by
        ));
    }
    match l.dtype {
        Dtype::Fp16 => arg("--fp16".into()),
        Dtype::Bf16 => arg("--bf16".into()),
        Dtype::Fp8 => {
            if l.fp8_library != Fp8Library::TransformerEngine {
                return Err(transformer_engine_only("megatron"));
            }
            arg("--bf16 --fp8-format hybrid".into())
        }
        Dtype::Fp32 | Dtype::Tf32 => {}
    }
    if l.fp8_param_gather {
        arg("--fp8-param-gather".into());
    }
    // bf16 training reduces fp32 gradients whatever the flags; fp16 only when asked
    if l.dtype == Dtype::Fp16 && l.grad_reduce_dtype == Dtype::Fp32 {
        arg("--accumulate-allreduce-grads-in-fp32".into());
    }
    match l.recompute {
        Recompute::None => {}
        Recompute::SelectiveOp | Recompute::SelectiveLayer => {
            return Err(no_torchtitan_checkpointing("megatron"))
        }
        Recompute::Selective => {
            arg("--recompute-granularity selective".into());
            if let Some(modules) = &l.recompute_modules {
                let names: Vec<&str> = modules.iter().map(|m| m.name()).collect();
                arg(format!("--recompute-modules {}", names.join(" ")));
            }
        }
        Recompute::Full => arg(
            "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"
                .into(),
        ),
    }
    if l.zero == 1 {
        arg("--use-distributed-optimizer".into());
    }
    if l.overlap.grad_reduce {
        arg("--overlap-grad-reduce".into());
    }
    if l.overlap.param_gather {
        arg("--overlap-param-gather".into());
    }
    if l.overlap.tp {
        arg("--tp-comm-overlap".into());
    }
    if l.overlap.moe_a2a {
        arg("--overlap-moe-expert-parallel-comm".into());
    }
    if let Some((implementation, scopes)) = cuda_graph_settings(&l.cuda_graphs) {
        // captured dropout needs Transformer Engine's graph-safe RNG tracker
        arg(format!(
            "--cuda-graph-impl {implementation} --te-rng-tracker"
        ));
        if !scopes.is_empty() {
            arg(format!("--cuda-graph-scope {}", scopes.join(" ")));
        }
    }
    arg(format!("--ddp-bucket-size {}", l.dp_bucket_elements));
    let mut text = String::new();
    let _ = writeln!(text, "#!/bin/sh\n# {}", t.headline);
    let _ = writeln!(
        text,
        "# Megatron-LM pretrain_gpt.py: run on every node with NODE_RANK, MASTER_ADDR set;\n\
         # add your --data-path, --tokenizer-*, --lr and --train-iters (or --mock-data)."
    );
    let _ = writeln!(text, "export CUDA_DEVICE_MAX_CONNECTIONS=1");
    let _ = writeln!(
        text,
        "torchrun --nnodes {nodes} --nproc-per-node {per_node} --node-rank \"${{NODE_RANK:-0}}\" \\\n    \
         --master-addr \"${{MASTER_ADDR:-localhost}}\" --master-port \"${{MASTER_PORT:-6000}}\" \\\n    \
         pretrain_gpt.py \\"
    );
    for (i, a) in args.iter().enumerate() {
        let end = if i + 1 == args.len() { "" } else { " \\" };
        let _ = writeln!(text, "    {a}{end}");
    }
    let mut notes = vec![format!(
        "--vocab-size {} with the NullTokenizer (which adds its end-of-document token) gives the \
         costed embedding of {} rows; with a real tokenizer Megatron pads its vocabulary to a \
         multiple of {} · tp",
        vocab_size,
        a.padded_vocab(l.tp),
        a.vocab_divisible_by
    )];
    if l.recompute == Recompute::Selective && l.recompute_modules.is_none() {
        notes.push(
            "selective recompute is costed as the attention core (Korthikanti et al.), which is \
             what Megatron's selective granularity recomputes"
                .into(),
        );
    }
    if l.activation_dtype() == Dtype::Bf16 && l.grad_reduce_dtype != Dtype::Fp32 {
        notes.push(format!(
            "Megatron-LM reduces bf16 training's gradients in fp32 whatever the flags (it turns \
             on --accumulate-allreduce-grads-in-fp32 for bf16): the run moves twice the \
             gradient bytes the prediction costed in {}",
            l.grad_reduce_dtype.name()
        ));
    }
    Ok(Launch {
        framework: Framework::Megatron,
        file_name: "launch.sh",
        text,
        notes,
    })
}

/// Megatron-Core's CUDA graph implementation and scopes for a layout's captured parts: whole
/// layers are its own (`local`) graphs, parts of a layer Transformer Engine's partial ones.
/// `None` without graphs.
fn cuda_graph_settings(scopes: &[CudaGraphScope]) -> Option<(&'static str, Vec<&'static str>)> {
    match scopes {
        [] => None,
        [CudaGraphScope::Layer] => Some(("local", Vec::new())),
        parts => Some((
            "transformer_engine",
            parts.iter().map(|s| s.name()).collect(),
        )),
    }
}

/// Whether `arch` has a part only Gemma's own layer specs build (NeMo's Gemma modules): norms
/// after the attention and MLP outputs, soft caps, embeddings scaled by √hidden.
fn gemma_parts(a: &Arch) -> bool {
    a.post_norms || a.attention_softcap || a.final_softcap || a.scaled_embeddings
}

/// Whether `arch` has OLMo 2's parts: norms only after the attention and the MLP, query and
/// key norms over the whole projection (Megatron-Core norms before, and per head).
fn olmo_parts(a: &Arch) -> bool {
    !a.pre_norms || (a.qk_norm && a.qk_norm_span == QkNormSpan::Projection)
}

const OLMO_PARTS: &str = "OLMo 2's blocks (norms only after the attention and the MLP, query \
     and key norms over the whole projection) are no Megatron-LM argument nor Megatron-Core \
     config field: train them with OLMo-core, or export a layout of a pre-norm model";

const CHUNKED: &str = "Llama 4's chunked attention is no window Megatron-LM's arguments or \
     Megatron-Core's config fields give (their window slides): export a model without \
     chunked_attention, or set the chunks in your own attention";

/// The NeMo 2.0 recipe closest to `arch`, and whether it is the same model.
fn nemo_recipe(arch: &Arch) -> (&'static str, bool) {
    const SAME: &[(&str, &str)] = &[
        ("llama2-7b", "llama2_7b"),
        ("llama3-8b", "llama3_8b"),
        ("llama3-70b", "llama3_70b"),
        ("llama3-405b", "llama31_405b"),
        ("gpt3-175b", "gpt3_175b"),
    ];
    match SAME.iter().find(|(n, _)| *n == arch.name) {
        Some((_, recipe)) => (recipe, true),
        None if arch.activation == Activation::Swiglu => ("llama3_8b", false),
        None => ("gpt3_175b", false),
    }
}

fn nemo(t: &Target, nodes: u64, per_node: u64) -> Result<Launch> {
    let (a, l) = (t.arch, t.layout);
    megatron_core_refusals(Framework::Nemo, l)?;
    if a.mla.is_some() {
        return Err(Error::Invalid(
            "nemo: latent-attention models come from NeMo's own DeepSeek recipes (their \
             configs are not set field by field here): export for megatron"
                .into(),
        ));
    }
    if a.position == Position::Alibi {
        return Err(Error::Invalid(
            "nemo: Megatron-Core has no ALiBi position embedding".into(),
        ));
    }
    if olmo_parts(a) {
        return Err(Error::Invalid(format!("nemo: {OLMO_PARTS}")));
    }
    if a.chunked_attention {
        return Err(Error::Invalid(format!("nemo: {CHUNKED}")));
    }
    if gemma_parts(a) {
        return Err(Error::Invalid(
            "nemo: the norms after the attention and MLP outputs, the logit soft caps and the \
             scaled embeddings are NeMo's Gemma layer specs, not fields set here: start from \
             NeMo's recipe for the model (llm.gemma_2b, gemma2_9b, gemma2_27b, …) and set \
             this layout's sizes"
                .into(),
        ));
    }
    let (recipe, same) = nemo_recipe(a);
    let mut text = String::new();
    let mut set = |key: &str, value: String| {
        let _ = writeln!(text, "recipe.{key} = {value}");
    };
    let py_bool = |b: bool| if b { "True" } else { "False" }.to_string();
    // strategy
    set(
        "trainer.strategy.tensor_model_parallel_size",
        l.tp.to_string(),
    );
    set(
        "trainer.strategy.pipeline_model_parallel_size",
        l.pp.to_string(),
    );
    set("trainer.strategy.context_parallel_size", l.cp.to_string());
    if a.moe.is_some() {
        set(
            "trainer.strategy.expert_model_parallel_size",
            l.ep.to_string(),
        );
        set(
            "trainer.strategy.expert_tensor_parallel_size",
            l.etp.to_string(),
        );
    }
    if l.cp > 1 {
        set(
            "model.config.cp_comm_type",
            match l.cp_comm {
                CpComm::P2p => "\"p2p\"",
                CpComm::AllGather => "\"all_gather\"",
            }
            .to_string(),
        );
    }
    set(
        "trainer.strategy.virtual_pipeline_model_parallel_size",
        if l.vpp > 1 {
            l.vpp.to_string()
        } else {
            "None".into()
        },
    );
    set(
        "trainer.strategy.sequence_parallel",
        py_bool(l.sequence_parallel),
    );
    if l.pp > 1 {
        let dtype = if l.dtype == Dtype::Fp16 {
            "float16"
        } else {
            "bfloat16"
        };
        set("trainer.strategy.pipeline_dtype", format!("torch.{dtype}"));
    }
    set(
        "trainer.strategy.ddp",
        format!(
            "run.Config(DistributedDataParallelConfig, grad_reduce_in_fp32={}, \
             overlap_grad_reduce={}, overlap_param_gather={}, use_distributed_optimizer={}, \
             bucket_size={})",
            py_bool(l.grad_reduce_dtype == Dtype::Fp32),
            py_bool(l.overlap.grad_reduce),
            py_bool(l.overlap.param_gather),
            py_bool(l.zero == 1),
            l.dp_bucket_elements
        ),
    );
    set(
        "optim.config.use_distributed_optimizer",
        py_bool(l.zero == 1),
    );
    // data
    set("data.micro_batch_size", l.micro_batch.to_string());
    set("data.global_batch_size", l.global_batch.to_string());
    set("data.seq_length", l.seq_len.to_string());
    // model
    set("model.config.seq_length", l.seq_len.to_string());
    set("model.config.num_layers", a.layers.to_string());
    set("model.config.hidden_size", a.hidden.to_string());
    set("model.config.ffn_hidden_size", a.ffn_hidden.to_string());
    set("model.config.num_attention_heads", a.heads.to_string());
    set("model.config.num_query_groups", a.kv_heads.to_string());
    if !same {
        for (key, value) in nemo_architecture(a) {
            set(&format!("model.config.{key}"), value);
        }
    }
    if l.mtp_layers > 0 {
        set("model.config.mtp_num_layers", l.mtp_layers.to_string());
    }
    if a.moe.is_some() && !l.moe_dispatcher.is_alltoall() {
        set(
            "model.config.moe_token_dispatcher_type",
            format!("\"{}\"", dispatcher_type(l.moe_dispatcher)),
        );
        if let Some(backend) = flex_backend(l.moe_dispatcher) {
            set(
                "model.config.moe_flex_dispatcher_backend",
                format!("\"{backend}\""),
            );
        }
    }
    if let Some((factor, pad)) = l.moe_capacity {
        set(
            "model.config.moe_expert_capacity_factor",
            factor.to_string(),
        );
        set(
            "model.config.moe_pad_expert_input_to_capacity",
            py_bool(pad),
        );
    }
    for (on, key) in [
        (
            l.pipeline_split.embedding,
            "account_for_embedding_in_pipeline_split",
        ),
        (l.pipeline_split.loss, "account_for_loss_in_pipeline_split"),
    ] {
        if on {
            set(&format!("model.config.{key}"), "True".into());
        }
    }
    if let Some(layout) = &l.pipeline_layout {
        set(
            "model.config.pipeline_model_parallel_layout",
            format!("\"{layout}\""),
        );
    }
    if let Some((first, last)) = uneven_ends(&l.stage_layers)
        .filter(|_| l.pipeline_split.places() == 0 && l.pipeline_layout.is_none())
    {
        if let Some(f) = first {
            set(
                "model.config.num_layers_in_first_pipeline_stage",
                f.to_string(),
            );
        }
        if let Some(n) = last {
            set(
                "model.config.num_layers_in_last_pipeline_stage",
                n.to_string(),
            );
        }
    }
    match l.recompute {
        Recompute::SelectiveOp | Recompute::SelectiveLayer => {
            return Err(no_torchtitan_checkpointing("nemo"))
        }
        Recompute::None => set("model.config.recompute_granularity", "None".into()),
        Recompute::Selective => {
            set("model.config.recompute_granularity", "\"selective\"".into());
            if let Some(modules) = &l.recompute_modules {
                let names: Vec<String> = modules.iter().map(|m| format!("\"{m}\"")).collect();
                set(
                    "model.config.recompute_modules",
                    format!("[{}]", names.join(", ")),
                );
            }
        }
        Recompute::Full => {
            set("model.config.recompute_granularity", "\"full\"".into());
            set("model.config.recompute_method", "\"uniform\"".into());
            set("model.config.recompute_num_layers", "1".into());
        }
    }
    if l.cross_entropy == CrossEntropy::Fused {
        set("model.config.cross_entropy_loss_fusion", "True".into());
        set("model.config.cross_entropy_fusion_impl", "\"te\"".into());
    }
    if let Some((implementation, scopes)) = cuda_graph_settings(&l.cuda_graphs) {
        set(
            "model.config.cuda_graph_impl",
            format!("\"{implementation}\""),
        );
        set("model.config.use_te_rng_tracker", "True".into());
        if !scopes.is_empty() {
            let names: Vec<String> = scopes.iter().map(|s| format!("\"{s}\"")).collect();
            set(
                "model.config.cuda_graph_scope",
                format!("[{}]", names.join(", ")),
            );
        }
    }
    match l.dtype {
        Dtype::Bf16 => set("trainer.plugins", "bf16_mixed()".into()),
        Dtype::Fp16 => set("trainer.plugins", "fp16_mixed()".into()),
        Dtype::Fp8 => {
            if l.fp8_library != Fp8Library::TransformerEngine {
                return Err(transformer_engine_only("nemo"));
            }
            set("trainer.plugins", "bf16_with_fp8_mixed()".into());
            // the plugin keeps fp8 weights unless told otherwise
            set(
                "trainer.plugins.fp8_param_gather",
                py_bool(l.fp8_param_gather),
            );
        }
        Dtype::Fp32 | Dtype::Tf32 => {
            return Err(Error::Invalid(
                "nemo: NeMo's recipes train in mixed precision: predict with --dtype bf16".into(),
            ))
        }
    }
    // the plugin's gradient reduction type is applied over the DDP config's (its DtypeConfig
    // overrides the model's, optimizer's and DDP's fields): bf16_mixed() reduces in fp32,
    // fp16_mixed() in fp16, whatever the DDP config says
    set(
        "trainer.plugins.grad_reduce_in_fp32",
        py_bool(l.grad_reduce_dtype == Dtype::Fp32),
    );
    if l.overlap.tp {
        // the callback also overlaps the distributed optimizer's data-parallel communication
        // in 128 Mi-element buckets unless told otherwise: told the layout's
        let _ = writeln!(
            text,
            "recipe.trainer.callbacks.append(run.Config(MegatronCommOverlapCallback, \
             tp_comm_overlap=True, overlap_grad_reduce={}, overlap_param_gather={}, \
             bucket_size={}))",
            py_bool(l.overlap.grad_reduce),
            py_bool(l.overlap.param_gather),
            l.dp_bucket_elements
        );
    }
    if l.overlap.moe_a2a {
        let _ = writeln!(
            text,
            "# predicted with the expert all-to-all overlapped: turn on Megatron-Core's \
             overlap_moe_expert_parallel_comm for this run"
        );
    }
    let mut out = String::new();
    let _ = writeln!(out, "# {}", t.headline);
    let _ = writeln!(
        out,
        "# NeMo 2.0 recipe: python recipe.py (inside the NeMo container; set data, tokenizer and\n\
         # schedule on the recipe as usual). Base recipe: llm.{recipe}."
    );
    let _ = writeln!(
        out,
        "import torch\nimport nemo_run as run\nfrom megatron.core.distributed import \
         DistributedDataParallelConfig\nfrom nemo.collections import llm\n\
         from nemo.collections.llm.recipes.precision.mixed_precision import (\n    \
         bf16_mixed, bf16_with_fp8_mixed, fp16_mixed)\n\
         from nemo.lightning.pytorch.callbacks.megatron_comm_overlap import \
         MegatronCommOverlapCallback"
    );
    if !same {
        // the activation function set on the base recipe's config
        out += "import torch.nn.functional as F\n";
        if a.activation == Activation::SquaredRelu {
            out += "from megatron.core.activations import squared_relu\n";
        }
    }
    out.push('\n');
    let _ = writeln!(
        out,
        "recipe = llm.{recipe}.pretrain_recipe(name=\"stepcast\", num_nodes={nodes}, \
         num_gpus_per_node={per_node})"
    );
    out += &text;
    let _ = writeln!(
        out,
        "\nif __name__ == \"__main__\":\n    run.run(recipe, executor=run.LocalExecutor(\
         ntasks_per_node={per_node}, launcher=\"torchrun\"))"
    );
    let mut notes = Vec::new();
    if !same {
        notes.push(format!(
            "NeMo has no recipe for {}: llm.{recipe} is the base, its sizes and architecture \
             set to the costed model's; its other settings (norm epsilon, RoPE base, \
             vocabulary from the tokenizer) stay the base recipe's",
            a.name
        ));
    }
    Ok(Launch {
        framework: Framework::Nemo,
        file_name: "recipe.py",
        text: out,
        notes,
    })
}

/// The Megatron-Core `GPTConfig` fields, beside the sizes, that make another model's NeMo
/// recipe the costed architecture: its norm, activation, position embedding, biases, head
/// width, tied embeddings, dropout, sliding window and experts. Without them a recipe based
/// on Llama 3 8B trains a dense Llama whatever the model was (a mixture of experts included).
fn nemo_architecture(a: &Arch) -> Vec<(&'static str, String)> {
    let py_bool = |b: bool| if b { "True" } else { "False" }.to_string();
    let (activation, gated) = match a.activation {
        Activation::Swiglu => ("F.silu", true),
        Activation::Geglu => ("F.gelu", true),
        Activation::Gelu => ("F.gelu", false),
        Activation::SquaredRelu => ("squared_relu", false),
    };
    let norm = match a.norm {
        NormKind::Rmsnorm => "RMSNorm",
        NormKind::Layernorm => "LayerNorm",
    };
    let position = match a.position {
        Position::Rope => "rope",
        // ALiBi is refused before
        Position::Learned | Position::Alibi => "learned_absolute",
    };
    // Megatron's default rate where the model trains with dropout (GPT-3's 0.1)
    let dropout = if a.dropout { "0.1" } else { "0.0" };
    let mut fields = vec![
        ("normalization", format!("\"{norm}\"")),
        ("activation_func", activation.to_string()),
        ("gated_linear_unit", py_bool(gated)),
        ("position_embedding_type", format!("\"{position}\"")),
        ("add_bias_linear", py_bool(a.linear_bias)),
        ("add_qkv_bias", py_bool(a.qkv_bias)),
        ("qk_layernorm", py_bool(a.qk_norm)),
        ("kv_channels", a.head_dim.to_string()),
        (
            "share_embeddings_and_output_weights",
            py_bool(a.tied_embeddings),
        ),
        ("hidden_dropout", dropout.into()),
        ("attention_dropout", dropout.into()),
    ];
    if let Some(w) = a.sliding_window {
        fields.push(("window_size", window_size(w)));
        if let Some(n) = a.global_attention_every {
            fields.push(("window_attn_skip_freq", n.to_string()));
        }
    }
    if let Some(m) = &a.moe {
        fields.extend([
            ("num_moe_experts", m.experts.to_string()),
            ("moe_router_topk", m.top_k.to_string()),
            ("moe_ffn_hidden_size", m.expert_ffn.to_string()),
            ("moe_grouped_gemm", "True".to_string()),
        ]);
        if m.shared_ffn() > 0 {
            fields.push((
                "moe_shared_expert_intermediate_size",
                m.shared_ffn().to_string(),
            ));
        }
        if a.dense_layers() > 0 {
            fields.push(("moe_layer_freq", moe_layer_freq(a.layers, m)));
        }
        if m.topk_groups > 0 {
            fields.push(("moe_router_num_groups", m.groups.to_string()));
            fields.push(("moe_router_group_topk", m.topk_groups.to_string()));
        }
    }
    fields
}

/// Megatron-Core's `window_size` for a window of `w` keys: (left, right) keys beside the
/// query, so `w` keys in all are the query's and the `w − 1` before it.
fn window_size(w: u64) -> String {
    format!("({}, 0)", w.saturating_sub(1))
}

/// Megatron-Core's `moe_layer_freq` pattern: the dense first layers, then the rest all with
/// experts, or a mark (1: experts) for every layer where they are interleaved.
fn moe_layer_freq(layers: u64, m: &MoeSpec) -> String {
    if m.every == 1 {
        return format!("[0]*{}+[1]*{}", m.dense_layers, layers - m.dense_layers);
    }
    let marks: Vec<&str> = (0..layers)
        .map(|i| if m.has_experts(i) { "1" } else { "0" })
        .collect();
    format!("[{}]", marks.join(","))
}

/// torchtitan's model name and flavor for `arch`, where it has one.
fn torchtitan_flavor(arch: &Arch) -> Option<(&'static str, &'static str)> {
    TORCHTITAN_FLAVORS
        .iter()
        .find(|(preset, ..)| *preset == arch.name)
        .map(|&(_, name, flavor)| (name, flavor))
}

/// The presets torchtitan has a flavor of: (preset, torchtitan's model name, flavor).
const TORCHTITAN_FLAVORS: [(&str, &str, &str); 3] = [
    ("llama3-8b", "llama3", "8B"),
    ("llama3-70b", "llama3", "70B"),
    ("llama3-405b", "llama3", "405B"),
];

/// The preset of a torchtitan `[model]` name and flavor, if stepcast has it.
pub fn torchtitan_preset(name: &str, flavor: &str) -> Option<&'static str> {
    TORCHTITAN_FLAVORS
        .iter()
        .find(|(_, n, f)| *n == name && *f == flavor)
        .map(|&(preset, ..)| preset)
}

fn torchtitan(t: &Target, nodes: u64, per_node: u64) -> Result<Launch> {
    let (a, l) = (t.arch, t.layout);
    let refuse = |why: &str| Err(Error::Invalid(format!("torchtitan: {why}")));
    if l.mtp_layers > 0 {
        return refuse("multi-token prediction is not a torchtitan option: export for megatron");
    }
    if l.recompute_modules.is_some() || l.pipeline_layout.is_some() {
        return refuse(
            "recompute modules and pipeline layout strings are Megatron-Core's: export for \
             megatron or nemo",
        );
    }
    if t.arch.moe.is_some() {
        return refuse(
            "torchtitan's mixture-of-experts models are its own (DeepSeek-V3, Llama 4) flavors: \
             export this layout for megatron or nemo",
        );
    }
    if l.cross_entropy == CrossEntropy::Fused {
        return refuse(
            "torchtitan's loss is PyTorch's cross-entropy, not Transformer Engine's fused \
             kernel: predict with --cross-entropy pytorch",
        );
    }
    if !l.cuda_graphs.is_empty() {
        return refuse(
            "torchtitan has no CUDA graph option for training: predict without --cuda-graphs",
        );
    }
    let schedule =
        match (l.schedule, l.vpp) {
            (Schedule::OneFOneB | Schedule::ClosedForm, _) => "1F1B",
            (Schedule::Interleaved, _) => "Interleaved1F1B",
            (Schedule::Gpipe, _) => "GPipe",
            (Schedule::ZbV, _) => "ZBVZeroBubble",
            (Schedule::ZbH1, _) => return refuse(
                "torchtitan's zero-bubble schedules (InterleavedZeroBubble, ZBVZeroBubble) are \
                 not ZB-H1: predict with --schedule zb-v, 1f1b or interleaved and export that",
            ),
        };
    let (replicate, shard) =
        match l.zero {
            0 => (l.dp, 1),
            3 => (1, l.dp),
            _ => return refuse(
                "torchtitan replicates (DDP, ZeRO 0) or shards everything (FSDP, ZeRO 3); it has \
                 no ZeRO 1 or 2: predict with --zero 3 or --zero 0 and export that",
            ),
        };
    if l.tp > 1 && !l.sequence_parallel {
        return refuse(
            "torchtitan's tensor parallelism always shards norms over the sequence: predict \
             with --sequence-parallel",
        );
    }
    let split = match (l.pp > 1).then(|| torchtitan_split(a.layers, l)) {
        None => None,
        Some(Some(split)) => Some(split),
        Some(None) => {
            return refuse(&format!(
                "torchtitan splits {} layers over {} model chunks with a remainder on the \
                 first chunks, the embedding and the output each taking a layer's place or \
                 none; the prediction put {:?} layers in them: predict with a pp·vpp that \
                 divides {} (or {} with --account-for-embedding-in-pipeline-split and \
                 --account-for-loss-in-pipeline-split, torchtitan's default) and \
                 --partition uniform",
                a.layers,
                l.chunk_layers.len(),
                l.chunk_layers,
                a.layers,
                a.layers + 2
            ))
        }
    };
    if l.overlap.tp && l.elementwise == Elementwise::Eager {
        return refuse(
            "torchtitan's TP communication overlap (async tensor parallelism) needs \
             torch.compile: predict with --elementwise fused, or without --tp-comm-overlap",
        );
    }
    let precision = match l.dtype {
        Dtype::Bf16 | Dtype::Fp8 => "bfloat16",
        Dtype::Fp32 | Dtype::Tf32 => "float32",
        Dtype::Fp16 => {
            return refuse("torchtitan trains in bf16 or fp32: predict with --dtype bf16")
        }
    };
    // with a pipeline the micro-batches are the pipeline's; without one they are gradient
    // accumulation steps
    let local = if l.pp > 1 {
        l.micro_batch * l.micro_batches
    } else {
        l.micro_batch
    };
    let mut out = String::new();
    let _ = writeln!(out, "# {}", t.headline);
    let _ = writeln!(
        out,
        "# torchtitan job config: torchrun --nnodes {nodes} --nproc-per-node {per_node} \
         -m torchtitan.train --job.config_file job.toml\n# (add your dataset, tokenizer and \
         optimizer sections)\n"
    );
    let mut notes = Vec::new();
    match torchtitan_flavor(a) {
        Some((name, flavor)) => {
            let _ = writeln!(out, "[model]\nname = \"{name}\"\nflavor = \"{flavor}\"");
            if l.dtype == Dtype::Fp8 {
                let _ = writeln!(out, "converters = [\"float8\"]");
                if l.fp8_library == Fp8Library::TransformerEngine {
                    notes.push(
                        "torchtitan's float8 is torchao's: the prediction costed Transformer \
                         Engine's memory (fp8 weight caches, fp8 GEMM inputs kept): predict \
                         with --fp8-library torchao"
                            .into(),
                    );
                }
            }
            out.push('\n');
            if l.fp8_param_gather {
                let _ = writeln!(out, "[float8]\nenable_fsdp_float8_all_gather = true\n");
            }
        }
        None => notes.push(format!(
            "torchtitan has no flavor of {}: add a [model] section naming one you defined \
             with its sizes",
            a.name
        )),
    }
    let _ = writeln!(
        out,
        "[training]\nlocal_batch_size = {local}\nglobal_batch_size = {}\nseq_len = {}\n\
         mixed_precision_param = \"{precision}\"\nmixed_precision_reduce = \"float32\"\n",
        l.global_batch, l.seq_len
    );
    let _ = writeln!(
        out,
        "[parallelism]\ndata_parallel_replicate_degree = {replicate}\n\
         data_parallel_shard_degree = {shard}\ntensor_parallel_degree = {}\n\
         context_parallel_degree = {}\npipeline_parallel_degree = {}",
        l.tp, l.cp, l.pp
    );
    if l.cp > 1 {
        let _ = writeln!(
            out,
            "context_parallel_rotate_method = \"{}\"",
            match l.cp_comm {
                CpComm::P2p => "alltoall",
                CpComm::AllGather => "allgather",
            }
        );
    }
    if let Some(split) = split {
        let _ = writeln!(
            out,
            "pipeline_parallel_schedule = \"{schedule}\"\npipeline_parallel_microbatch_size = {}\n\
             pipeline_parallel_layers_per_stage = {}\n\
             pipeline_parallel_first_stage_less_layers = {}\n\
             pipeline_parallel_last_stage_less_layers = {}",
            l.micro_batch, split.layers_per_stage, split.first_less, split.last_less
        );
    }
    let mode = match l.recompute {
        Recompute::None => "none",
        Recompute::Selective | Recompute::SelectiveOp | Recompute::SelectiveLayer => "selective",
        Recompute::Full => "full",
    };
    let _ = writeln!(
        out,
        "\n[compile]\nenable = {}",
        l.elementwise == Elementwise::Fused
    );
    let _ = writeln!(out, "\n[activation_checkpoint]\nmode = \"{mode}\"");
    match l.recompute {
        Recompute::Selective | Recompute::SelectiveOp => {
            let _ = writeln!(out, "selective_ac_option = \"op\"");
        }
        // every 2nd layer checkpointed whole
        Recompute::SelectiveLayer => {
            let _ = writeln!(out, "selective_ac_option = \"2\"");
        }
        Recompute::None | Recompute::Full => {}
    }
    if l.recompute == Recompute::Selective {
        notes.push(
            "torchtitan's selective checkpointing saves chosen ops' outputs; the prediction \
             costed Megatron's (the attention core recomputed), which stores more and \
             recomputes less: predict with --recompute selective-op for torchtitan's"
                .into(),
        );
    }
    if l.grad_reduce_dtype != Dtype::Fp32 {
        notes.push(format!(
            "torchtitan reduces gradients in float32 only: the run moves twice the gradient \
             bytes the prediction costed in {}",
            l.grad_reduce_dtype.name()
        ));
    }
    if l.overlap.tp {
        notes.push(
            "TP communication overlap is torchtitan's async tensor parallelism: add \
             [parallelism] enable_async_tensor_parallel = true"
                .into(),
        );
    }
    Ok(Launch {
        framework: Framework::Torchtitan,
        file_name: "job.toml",
        text: out,
        notes,
    })
}

/// How torchtitan is told to split the layers over a pipeline's model chunks: its stage count
/// is ceil((layers + first_less + last_less) / layers_per_stage), the embedding and the output
/// taking `first_less` and `last_less` layer places (both 1 unless set).
#[derive(Debug, PartialEq)]
struct TorchtitanSplit {
    layers_per_stage: u64,
    first_less: u64,
    last_less: u64,
}

/// The settings under which torchtitan (`pipeline_llm` and `generate_llm_fqn_per_model_part`
/// in torchtitan/distributed/pipeline_parallel.py) builds exactly the layout's model chunks —
/// as many, with the same layers each — or none. The embedding and the output take a layer's
/// place where the layout's split gave them one (Megatron's account-for flags, torchtitan's
/// default), none otherwise.
fn torchtitan_split(layers: u64, l: &Layout) -> Option<TorchtitanSplit> {
    let chunks = l.chunk_layers.len() as u64;
    let first_less = u64::from(l.pipeline_split.embedding);
    let last_less = u64::from(l.pipeline_split.loss);
    let places = layers + first_less + last_less;
    let layers_per_stage = places.div_ceil(chunks.max(1));
    if chunks < 2 || places.div_ceil(layers_per_stage) != chunks {
        return None;
    }
    // the first `extra` chunks take one place more; the end chunks give theirs to the
    // embedding and the output
    let (base, extra) = (places / chunks, places % chunks);
    let built: Vec<u64> = (0..chunks)
        .map(|i| {
            let own = base + u64::from(i < extra);
            let less = match i {
                0 => first_less,
                i if i == chunks - 1 => last_less,
                _ => 0,
            };
            own.saturating_sub(less)
        })
        .collect();
    (built == l.chunk_layers).then_some(TorchtitanSplit {
        layers_per_stage,
        first_less,
        last_less,
    })
}

/// Megatron-LM and NeMo run fp8 with Transformer Engine.
fn transformer_engine_only(target: &str) -> Error {
    Error::Invalid(format!(
        "{target}: Megatron-Core runs fp8 with Transformer Engine, not torchao: predict with \
         --fp8-library transformer-engine"
    ))
}

/// Megatron-LM and NeMo have neither of torchtitan's selective checkpointings (op-level, or
/// every other layer: Megatron's `--recompute-method block` recomputes a stage's first layers).
fn no_torchtitan_checkpointing(target: &str) -> Error {
    Error::Invalid(format!(
        "{target}: Megatron-Core has no op-level or every-other-layer selective checkpointing \
         (--recompute selective-op and selective-layer are torchtitan's): export --recompute \
         selective (the attention core, or --recompute-modules) or full"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::ParallelSpec;

    fn target(model: &str, spec: ParallelSpec) -> (Arch, Layout) {
        let c = crate::hardware::dgx_h100_without_models();
        let arch = Arch::resolve(model).unwrap();
        let layout = Layout::new(&spec, &arch, &c).unwrap();
        (arch, layout)
    }

    fn launch(f: Framework, arch: &Arch, layout: &Layout) -> Result<Launch> {
        export(
            f,
            &Target {
                arch,
                layout,
                gpus_per_node: 8,
                headline: "test".into(),
            },
        )
    }

    fn spec(tp: u64, pp: u64, dp: u64) -> ParallelSpec {
        ParallelSpec {
            tp: Some(tp),
            pp: Some(pp),
            dp: Some(dp),
            micro_batch: Some(2),
            global_batch: Some(256),
            ..Default::default()
        }
    }

    /// Key/value heads that tp does not divide — costed as replicated over tp — are refused by
    /// every framework, with the tp that divide them; tp dividing them is exported.
    #[test]
    fn key_value_heads_must_split_over_tp_in_every_framework() {
        let (mut arch, _) = target("llama3-8b", spec(1, 1, 8));
        arch.kv_heads = 4;
        let mut s = spec(8, 1, 1);
        s.sequence_parallel = Some(true);
        s.zero = Some(0);
        let replicated = Layout::new(&s, &arch, &crate::hardware::dgx_h100_without_models())
            .expect("stepcast costs tp 8 over 4 key/value heads");
        for (f, rule) in [
            (
                Framework::Megatron,
                "num_query_groups (4) to be a multiple of",
            ),
            (Framework::Nemo, "num_query_groups (4) to be a multiple of"),
            (Framework::Torchtitan, "4 do not split over tp = 8"),
        ] {
            let e = launch(f, &arch, &replicated).unwrap_err().to_string();
            assert!(e.starts_with(f.name()) && e.contains(rule), "{e}");
            assert!(e.contains("predict with tp ∈ {1, 2, 4}"), "{e}");
        }
        s.tp = Some(4);
        s.dp = Some(2);
        let split = Layout::new(&s, &arch, &crate::hardware::dgx_h100_without_models()).unwrap();
        for f in Framework::ALL {
            assert!(launch(*f, &arch, &split).is_ok(), "{f:?}");
        }
    }

    /// Expert and tensor parallelism together need sequence parallelism in Megatron-Core; with it,
    /// or with either degree at 1, the mixture exports.
    #[test]
    fn megatron_core_refuses_experts_and_tp_without_sequence_parallelism() {
        let arch = crate::workload::presets::mixtral_8x7b();
        let c = crate::hardware::dgx_h100_without_models()
            .with_nodes(2)
            .unwrap();
        let layout = |tp, ep, sp| {
            let s = ParallelSpec {
                ep: Some(ep),
                sequence_parallel: Some(sp),
                ..spec(tp, 1, 16 / tp)
            };
            Layout::new(&s, &arch, &c).unwrap()
        };
        for f in [Framework::Megatron, Framework::Nemo] {
            let e = launch(f, &arch, &layout(2, 4, false))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("--sequence-parallel") && e.starts_with(f.name()),
                "{e}"
            );
            for (tp, ep, sp) in [(2, 4, true), (1, 4, false), (2, 1, false)] {
                let l = layout(tp, ep, sp);
                assert!(
                    launch(f, &arch, &l).is_ok(),
                    "{f:?} tp {tp} ep {ep} sp {sp}"
                );
            }
        }
    }

    /// OLMo 2's reordered norms and whole-projection query/key norms are refused with their
    /// own reason (not Gemma's), each alone.
    #[test]
    fn chunked_attention_is_refused_where_no_field_says_it() {
        let (mut a, l) = target("llama3-8b", spec(2, 1, 4));
        (a.sliding_window, a.chunked_attention) = (Some(2048), true);
        for framework in [Framework::Megatron, Framework::Nemo] {
            let e = launch(framework, &a, &l).unwrap_err().to_string();
            assert!(
                e.contains("chunked attention") && e.contains("slides"),
                "{e}"
            );
        }
    }

    #[test]
    fn olmo_parts_are_refused_where_no_field_says_them() {
        let (base, l) = target("llama3-8b", spec(2, 1, 4));
        let parts: [fn(&mut Arch); 2] = [
            |a| (a.pre_norms, a.post_norms) = (false, true),
            |a| (a.qk_norm, a.qk_norm_span) = (true, QkNormSpan::Projection),
        ];
        for set in parts {
            let mut a = base.clone();
            set(&mut a);
            for framework in [Framework::Megatron, Framework::Nemo] {
                let e = launch(framework, &a, &l).unwrap_err().to_string();
                assert!(
                    e.contains("OLMo 2's blocks") && e.contains("OLMo-core"),
                    "{e}"
                );
            }
        }
        let mut per_head = base.clone();
        per_head.qk_norm = true;
        assert!(launch(Framework::Megatron, &per_head, &l).is_ok());
    }

    /// Gemma's norms after the attention and MLP outputs, soft caps and scaled embeddings are
    /// no Megatron-LM argument nor Megatron-Core config field: exporting them is refused, each
    /// alone.
    #[test]
    fn gemma_parts_are_refused_where_no_field_says_them() {
        let (base, l) = target("llama3-8b", spec(2, 1, 4));
        let parts: [fn(&mut Arch); 4] = [
            |a| a.post_norms = true,
            |a| a.attention_softcap = true,
            |a| a.final_softcap = true,
            |a| a.scaled_embeddings = true,
        ];
        for set in parts {
            let mut a = base.clone();
            set(&mut a);
            let e = launch(Framework::Megatron, &a, &l).unwrap_err().to_string();
            assert!(e.contains("soft-capping") && e.contains("Gemma's"), "{e}");
            let e = launch(Framework::Nemo, &a, &l).unwrap_err().to_string();
            assert!(e.contains("llm.gemma_2b"), "{e}");
        }
        assert!(launch(Framework::Megatron, &base, &l).is_ok());
        assert!(launch(Framework::Nemo, &base, &l).is_ok());
    }

    #[test]
    fn megatron_gets_every_degree_batch_and_size() {
        let mut s = spec(2, 4, 4);
        s.sequence_parallel = Some(true);
        s.recompute = Some(Recompute::Full);
        let (a, l) = target("llama2-70b", s);
        let text = launch(Framework::Megatron, &a, &l).unwrap().text;
        for want in [
            "--nnodes 4 --nproc-per-node 8",
            "--tensor-model-parallel-size 2",
            "--pipeline-model-parallel-size 4",
            "--sequence-parallel",
            "--micro-batch-size 2",
            "--global-batch-size 256",
            "--num-layers 80",
            "--hidden-size 8192",
            "--group-query-attention --num-query-groups 8",
            "--swiglu",
            "--normalization RMSNorm",
            "--recompute-granularity full",
            "--use-distributed-optimizer",
        ] {
            assert!(text.contains(want), "{want} missing:\n{text}");
        }
        // the last argument has no continuation
        assert!(!text.trim_end().ends_with('\\'));
        assert!(!text.contains("--make-vocab-size-divisible-by"), "{text}");
    }

    /// Whole layers are Megatron-Core's own graphs, parts Transformer Engine's, with their
    /// scopes; torchtitan has no CUDA graphs to export.
    #[test]
    fn cuda_graphs_export_as_megatron_core_sets_them() {
        use CudaGraphScope::{Attn, Layer, Mlp};
        let with = |scopes: &[CudaGraphScope]| {
            target(
                "llama3-8b",
                ParallelSpec {
                    cuda_graphs: Some(scopes.to_vec()),
                    ..spec(1, 1, 8)
                },
            )
        };
        let (a, l) = with(&[Mlp, Attn]);
        let text = launch(Framework::Megatron, &a, &l).unwrap().text;
        assert!(
            text.contains("--cuda-graph-impl transformer_engine --te-rng-tracker")
                && text.contains("--cuda-graph-scope attn mlp"),
            "{text}"
        );
        let nemo = launch(Framework::Nemo, &a, &l).unwrap().text;
        assert!(
            nemo.contains("recipe.model.config.cuda_graph_impl = \"transformer_engine\"")
                && nemo.contains("recipe.model.config.cuda_graph_scope = [\"attn\", \"mlp\"]")
                && nemo.contains("recipe.model.config.use_te_rng_tracker = True"),
            "{nemo}"
        );
        let (a, l) = with(&[Layer]);
        let text = launch(Framework::Megatron, &a, &l).unwrap().text;
        assert!(text.contains("--cuda-graph-impl local") && !text.contains("--cuda-graph-scope"));
        let e = launch(Framework::Torchtitan, &a, &l)
            .unwrap_err()
            .to_string();
        assert!(e.contains("CUDA graph"), "{e}");
        let (a, l) = target("llama3-8b", spec(1, 1, 8));
        let text = launch(Framework::Megatron, &a, &l).unwrap().text;
        assert!(!text.contains("cuda-graph"), "{text}");
    }

    /// Megatron's NullTokenizer counts `--vocab-size` + 1 tokens (its end-of-document id) and
    /// pads them to a multiple of the divisor · tp: the exported size must land on the costed
    /// rows, whether or not the vocabulary already sits on that multiple.
    #[test]
    fn the_null_tokenizers_vocabulary_pads_to_the_costed_rows() {
        let megatron_rows = |vocab_size: u64, divisor: u64, tp: u64| {
            (vocab_size + 1).div_ceil(divisor * tp) * divisor * tp
        };
        let (llama2, _) = target("llama2-7b", spec(1, 1, 8));
        for vocab in [1, 2, 127, 128, 129, 32000, 50257, 128256, 151936, 262144] {
            for divisor in [1, 64, 128] {
                for tp in [1, 2, 4, 8] {
                    let a = Arch {
                        vocab,
                        vocab_divisible_by: divisor,
                        ..llama2.clone()
                    };
                    let exported = null_tokenizer_vocab(&a, tp);
                    assert_eq!(
                        megatron_rows(exported, divisor, tp),
                        a.padded_vocab(tp),
                        "vocab {vocab}, divisor {divisor}, tp {tp}: exported {exported}"
                    );
                }
            }
        }
        // Llama 2's 32,000 tokens are a multiple of 128 and 256: one less at tp 1 and 2, as is
        // at tp 4 (padded to 32,256 either way)
        let text = |tp| {
            let (a, l) = target("llama2-7b", spec(tp, 1, 8 / tp));
            let out = launch(Framework::Megatron, &a, &l).unwrap();
            (out.text, out.notes.join("\n"))
        };
        let (one, note) = text(1);
        assert!(
            one.contains("--vocab-size 31999 --tokenizer-type NullTokenizer"),
            "{one}"
        );
        assert!(note.contains("costed embedding of 32000 rows"), "{note}");
        let (four, note) = text(4);
        assert!(
            four.contains("--vocab-size 32000 --tokenizer-type NullTokenizer"),
            "{four}"
        );
        assert!(note.contains("costed embedding of 32256 rows"), "{note}");
    }

    #[test]
    fn an_unpadded_vocabulary_is_exported_with_its_divisor() {
        let (a, l) = target("llama2-7b", spec(2, 1, 4));
        let a = Arch {
            vocab_divisible_by: 1,
            ..a
        };
        let out = launch(Framework::Megatron, &a, &l).unwrap();
        assert!(
            out.text.contains("--make-vocab-size-divisible-by 1"),
            "{}",
            out.text
        );
        assert!(
            out.notes.iter().any(|n| n.contains("a multiple of 1 · tp")),
            "{:?}",
            out.notes
        );
    }

    #[test]
    fn the_gradient_reduction_type_is_exported_or_its_difference_noted() {
        let with = |dtype, reduce, zero| {
            let s = ParallelSpec {
                dtype: Some(dtype),
                grad_reduce_dtype: reduce,
                sequence_parallel: Some(true),
                zero: Some(zero),
                ..spec(2, 1, 8)
            };
            target("llama2-7b", s)
        };
        // the defaults are each framework's own
        // NeMo's precision plugin sets its own type over the DDP config's: both are set
        let (a, l) = with(Dtype::Bf16, None, 1);
        let n = launch(Framework::Nemo, &a, &l).unwrap().text;
        assert!(n.contains("grad_reduce_in_fp32=True"), "{n}");
        assert!(
            n.contains(
                "recipe.trainer.plugins = bf16_mixed()\n\
                        recipe.trainer.plugins.grad_reduce_in_fp32 = True\n"
            ),
            "{n}"
        );
        let (a, l) = with(Dtype::Bf16, None, 3);
        let t = launch(Framework::Torchtitan, &a, &l).unwrap();
        assert!(t.text.contains("mixed_precision_reduce = \"float32\""));
        assert!(!t.notes.iter().any(|n| n.contains("twice the")));
        // bf16 reduction: NeMo can, Megatron-LM and torchtitan cannot (noted)
        let (a, l) = with(Dtype::Bf16, Some(Dtype::Bf16), 1);
        let n = launch(Framework::Nemo, &a, &l).unwrap().text;
        assert!(n.contains("grad_reduce_in_fp32=False"), "{n}");
        assert!(
            n.contains("recipe.trainer.plugins.grad_reduce_in_fp32 = False\n"),
            "{n}"
        );
        let noted = |f, zero| {
            let (a, l) = with(Dtype::Bf16, Some(Dtype::Bf16), zero);
            let notes = launch(f, &a, &l).unwrap().notes;
            notes.iter().any(|n| n.contains("twice the"))
        };
        assert!(noted(Framework::Megatron, 1) && noted(Framework::Torchtitan, 3));
        // fp16: 16-bit reduction unless asked
        let (a, l) = with(Dtype::Fp16, Some(Dtype::Fp32), 1);
        let m = launch(Framework::Megatron, &a, &l).unwrap().text;
        assert!(m.contains("--accumulate-allreduce-grads-in-fp32"), "{m}");
        let n = launch(Framework::Nemo, &a, &l).unwrap().text;
        assert!(n.contains("grad_reduce_in_fp32=True"), "{n}");
        assert!(
            n.contains(
                "recipe.trainer.plugins = fp16_mixed()\n\
                        recipe.trainer.plugins.grad_reduce_in_fp32 = True\n"
            ),
            "{n}"
        );
        let (a, l) = with(Dtype::Fp16, None, 1);
        let n = launch(Framework::Nemo, &a, &l).unwrap().text;
        assert!(n.contains("grad_reduce_in_fp32=False"), "{n}");
        assert!(
            n.contains("recipe.trainer.plugins.grad_reduce_in_fp32 = False\n"),
            "{n}"
        );
        let m = launch(Framework::Megatron, &a, &l).unwrap().text;
        assert!(!m.contains("--accumulate-allreduce-grads-in-fp32"), "{m}");
    }

    #[test]
    fn interleaving_becomes_layers_per_virtual_stage_or_chunks() {
        let mut s = spec(1, 4, 2);
        s.schedule = Some(Schedule::Interleaved);
        s.vpp = Some(2);
        let (a, l) = target("llama2-7b", s);
        let m = launch(Framework::Megatron, &a, &l).unwrap().text;
        assert!(
            m.contains("--num-layers-per-virtual-pipeline-stage 4"),
            "{m}"
        );
        let n = launch(Framework::Nemo, &a, &l).unwrap().text;
        assert!(
            n.contains("virtual_pipeline_model_parallel_size = 2"),
            "{n}"
        );
        assert!(n.contains("pipeline_dtype = torch.bfloat16"), "{n}");
    }

    #[test]
    fn torchtitan_maps_sharding_and_refuses_zero_1() {
        let (a, l) = target("llama3-8b", spec(1, 2, 4));
        let e = launch(Framework::Torchtitan, &a, &l)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--zero 3"), "{e}");
        let mut s = spec(1, 2, 4);
        s.zero = Some(3);
        let (a, l) = target("llama3-8b", s);
        let t = launch(Framework::Torchtitan, &a, &l).unwrap().text;
        assert!(t.contains("data_parallel_shard_degree = 4"), "{t}");
        assert!(t.contains("flavor = \"8B\""), "{t}");
        // 256 = 2 per micro-batch × 32 micro-batches × 4 replicas: local = 64 with a pipeline
        assert!(t.contains("local_batch_size = 64"), "{t}");
        assert!(t.contains("pipeline_parallel_microbatch_size = 2"), "{t}");
    }

    /// torchtitan's op-level checkpointing is what `--recompute selective-op` costs; Megatron's
    /// selective recomputation exported to torchtitan says it was costed otherwise; Megatron
    /// and NeMo have no op-level checkpointing and refuse it with the fix.
    #[test]
    fn op_level_checkpointing_is_torchtitans_alone() {
        let with_zero = |r, zero| {
            let s = ParallelSpec {
                zero: Some(zero),
                recompute: Some(r),
                ..spec(1, 1, 8)
            };
            target("llama3-8b", s)
        };
        let with = |r| with_zero(r, 3);
        let (a, l) = with(Recompute::SelectiveOp);
        let t = launch(Framework::Torchtitan, &a, &l).unwrap();
        assert!(t.text.contains("mode = \"selective\""), "{}", t.text);
        assert!(
            t.text.contains("selective_ac_option = \"op\""),
            "{}",
            t.text
        );
        assert!(
            !t.notes.iter().any(|n| n.contains("selective")),
            "{:?}",
            t.notes
        );
        let (a, l) = with_zero(Recompute::SelectiveOp, 1);
        for f in [Framework::Megatron, Framework::Nemo] {
            let e = launch(f, &a, &l).unwrap_err().to_string();
            assert!(
                e.contains("--recompute selective (the attention core"),
                "{e}"
            );
        }
        let (a, l) = with(Recompute::Selective);
        let t = launch(Framework::Torchtitan, &a, &l).unwrap();
        assert!(
            t.notes
                .iter()
                .any(|n| n.contains("--recompute selective-op")),
            "{:?}",
            t.notes
        );
    }

    /// Megatron and NeMo run fp8 with Transformer Engine and refuse torchao's; torchtitan's
    /// float8 is torchao's, and an export of Transformer Engine's costing says so; fp8
    /// parameter gather is written for each.
    #[test]
    fn the_fp8_library_and_parameter_gather_are_exported_or_refused() {
        use crate::workload::Fp8Library;
        let with = |library, gather, zero| {
            let s = ParallelSpec {
                dtype: Some(Dtype::Fp8),
                fp8_library: Some(library),
                fp8_param_gather: Some(gather),
                zero: Some(zero),
                ..spec(1, 1, 8)
            };
            target("llama3-8b", s)
        };
        let (a, l) = with(Fp8Library::Torchao, false, 1);
        for f in [Framework::Megatron, Framework::Nemo] {
            let e = launch(f, &a, &l).unwrap_err().to_string();
            assert!(e.contains("--fp8-library transformer-engine"), "{e}");
        }
        let (a, l) = with(Fp8Library::TransformerEngine, true, 1);
        let m = launch(Framework::Megatron, &a, &l).unwrap().text;
        assert!(m.contains("--fp8-param-gather"), "{m}");
        let n = launch(Framework::Nemo, &a, &l).unwrap().text;
        assert!(n.contains("fp8_param_gather = True"), "{n}");
        let (a, l) = with(Fp8Library::TransformerEngine, false, 3);
        let t = launch(Framework::Torchtitan, &a, &l).unwrap();
        assert!(
            t.notes.iter().any(|n| n.contains("--fp8-library torchao")),
            "{:?}",
            t.notes
        );
        let (a, l) = with(Fp8Library::Torchao, true, 3);
        let t = launch(Framework::Torchtitan, &a, &l).unwrap();
        assert!(
            t.text.contains("enable_fsdp_float8_all_gather = true"),
            "{}",
            t.text
        );
        assert!(!t.notes.iter().any(|n| n.contains("fp8")), "{:?}", t.notes);
    }

    #[test]
    fn what_a_framework_lacks_is_refused_with_the_fix() {
        let mut s = spec(1, 4, 2);
        s.schedule = Some(Schedule::ZbH1);
        let (a, l) = target("llama2-7b", s);
        for f in Framework::ALL {
            let e = launch(*f, &a, &l).unwrap_err().to_string();
            assert!(e.contains("--schedule"), "{f:?}: {e}");
        }
        // ZB-V: Megatron-Core has none; torchtitan runs it
        let mut s = spec(1, 4, 2);
        s.schedule = Some(Schedule::ZbV);
        let (a, l) = target("llama2-7b", s);
        for f in [Framework::Megatron, Framework::Nemo] {
            let e = launch(f, &a, &l).unwrap_err().to_string();
            assert!(
                e.contains("no ZB-V") && e.contains("--schedule"),
                "{f:?}: {e}"
            );
        }
        let mut s = spec(1, 1, 8);
        s.rules = Some(Rules::Paper);
        let (a, l) = target("llama2-7b", s);
        let e = launch(Framework::Megatron, &a, &l).unwrap_err().to_string();
        assert!(e.contains("--rules megatron"), "{e}");
        // a remainder in the middle stages (Megatron's uniform split of 80 layers on pp 6):
        // Megatron-Core sets only the ends apart, and another partition would not help
        let (a, l) = target("llama3-70b", spec(1, 6, 1));
        for f in [Framework::Megatron, Framework::Nemo] {
            let e = launch(f, &a, &l).unwrap_err().to_string();
            assert!(
                e.contains("stages of [13, 14, 14, 13, 13, 13] layers")
                    && e.contains("a pp that divides the 80 layers")
                    && !e.contains("--partition"),
                "{f:?}: {e}"
            );
        }
    }

    /// Transformer Engine's fused cross-entropy is a switch in Megatron-LM and NeMo and is
    /// refused for torchtitan, whose loss is PyTorch's; the default loss sets nothing.
    #[test]
    fn the_fused_cross_entropy_is_switched_on_or_refused() {
        let mut s = spec(2, 1, 4);
        s.cross_entropy = Some(CrossEntropy::Fused);
        let (a, l) = target("llama2-7b", s);
        let m = launch(Framework::Megatron, &a, &l).unwrap().text;
        assert!(
            m.contains("--cross-entropy-loss-fusion --cross-entropy-fusion-impl te"),
            "{m}"
        );
        let n = launch(Framework::Nemo, &a, &l).unwrap().text;
        assert!(
            n.contains("recipe.model.config.cross_entropy_loss_fusion = True")
                && n.contains("recipe.model.config.cross_entropy_fusion_impl = \"te\""),
            "{n}"
        );
        let e = launch(Framework::Torchtitan, &a, &l)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--cross-entropy pytorch"), "{e}");
        let (a, l) = target("llama2-7b", spec(2, 1, 4));
        for f in [Framework::Megatron, Framework::Nemo] {
            let text = launch(f, &a, &l).unwrap().text;
            assert!(
                !text.contains("cross_entropy") && !text.contains("cross-entropy"),
                "{text}"
            );
        }
    }

    /// NeMo's recipe sets, field by field, what a Megatron-LM launch passes as flags: a
    /// mixture's expert degrees, dispatcher and capacity, the selective recomputation's
    /// modules, uneven end stages or a layout string, fp16's plugin; full precision it refuses.
    #[test]
    fn nemo_sets_each_megatron_core_setting_as_its_config_field() {
        use crate::workload::{Dispatcher, RecomputeModule};
        let nemo = |model: &str, s: ParallelSpec| {
            let (a, l) = if model == "mixtral-8x7b" {
                let a = crate::workload::presets::mixtral_8x7b();
                let c = crate::hardware::dgx_h100_without_models();
                let l = Layout::new(&s, &a, &c).unwrap();
                (a, l)
            } else {
                target(model, s)
            };
            (launch(Framework::Nemo, &a, &l).map(|n| n.text), l)
        };
        let moe = |dispatcher| ParallelSpec {
            ep: Some(2),
            // Megatron-Core needs it where experts and tp meet
            sequence_parallel: Some(true),
            moe_dispatcher: Some(dispatcher),
            moe_capacity_factor: Some(1.25),
            moe_pad_to_capacity: Some(true),
            recompute_modules: Some(vec![RecomputeModule::CoreAttn, RecomputeModule::MoeAct]),
            ..spec(2, 1, 4)
        };
        let (text, l) = nemo("mixtral-8x7b", moe(Dispatcher::Allgather));
        let text = text.unwrap();
        for want in [
            "recipe.trainer.strategy.expert_model_parallel_size = 2\n".to_string(),
            format!(
                "recipe.trainer.strategy.expert_tensor_parallel_size = {}\n",
                l.etp
            ),
            "recipe.model.config.moe_token_dispatcher_type = \"allgather\"\n".into(),
            "recipe.model.config.moe_expert_capacity_factor = 1.25\n".into(),
            "recipe.model.config.moe_pad_expert_input_to_capacity = True\n".into(),
            "recipe.model.config.recompute_granularity = \"selective\"\n".into(),
            "recipe.model.config.recompute_modules = [\"core_attn\", \"moe_act\"]\n".into(),
        ] {
            assert!(text.contains(&want), "{want} missing:\n{text}");
        }
        assert!(!text.contains("moe_flex_dispatcher_backend"), "{text}");
        let (text, _) = nemo("mixtral-8x7b", moe(Dispatcher::Deepep));
        let text = text.unwrap();
        assert!(
            text.contains("moe_token_dispatcher_type = \"flex\"\n")
                && text.contains("moe_flex_dispatcher_backend = \"deepep\"\n"),
            "{text}"
        );
        // all-to-all is the default: nothing to set; a dense model has no expert degrees
        let (text, _) = nemo("mixtral-8x7b", moe(Dispatcher::Alltoall));
        assert!(!text.unwrap().contains("moe_token_dispatcher_type"));
        let (text, _) = nemo("llama2-7b", spec(2, 1, 4));
        let text = text.unwrap();
        assert!(
            !text.contains("expert_") && !text.contains("moe_"),
            "{text}"
        );
        assert!(text.contains("recompute_granularity = None\n"), "{text}");
        assert!(
            text.contains("recipe.trainer.plugins = bf16_mixed()\n"),
            "{text}"
        );

        // 32 layers on 3 stages: 11, 11, 10 — the last stage stated, the others even
        let (text, l) = nemo("llama2-7b", spec(1, 3, 2));
        assert_eq!(l.stage_layers, [11, 11, 10]);
        let text = text.unwrap();
        assert!(
            text.contains("recipe.model.config.num_layers_in_last_pipeline_stage = 10\n")
                && !text.contains("num_layers_in_first_pipeline_stage"),
            "{text}"
        );
        // the GPT-NeoX partition of 32 layers on 4 stages (the paper's 8, 9, 9, 6): both ends
        let neox = ParallelSpec {
            partition: Some(crate::workload::Partition::Neox),
            ..spec(1, 4, 2)
        };
        let (text, l) = nemo("llama2-7b", neox);
        assert_eq!(l.stage_layers, [8, 9, 9, 6]);
        let text = text.unwrap();
        assert!(
            text.contains("recipe.model.config.num_layers_in_first_pipeline_stage = 8\n")
                && text.contains("recipe.model.config.num_layers_in_last_pipeline_stage = 6\n"),
            "{text}"
        );
        // a layout string places the layers itself: no stage sizes beside it
        let layout = ParallelSpec {
            pipeline_layout: Some("Et*9|t*11|t*12L".into()),
            ..spec(1, 3, 2)
        };
        let (text, _) = nemo("llama2-7b", layout);
        let text = text.unwrap();
        assert!(
            text.contains(
                "recipe.model.config.pipeline_model_parallel_layout = \"Et*9|t*11|t*12L\""
            ) && !text.contains("pipeline_stage ="),
            "{text}"
        );

        let precision = |dtype| ParallelSpec {
            dtype: Some(dtype),
            ..spec(2, 2, 2)
        };
        let (text, _) = nemo("llama2-7b", precision(Dtype::Fp16));
        let text = text.unwrap();
        assert!(
            text.contains("recipe.trainer.plugins = fp16_mixed()\n")
                && text.contains("recipe.trainer.strategy.pipeline_dtype = torch.float16\n"),
            "{text}"
        );
        let (text, _) = nemo("llama2-7b", precision(Dtype::Fp32));
        let e = text.unwrap_err().to_string();
        assert!(e.contains("--dtype bf16"), "{e}");
    }

    /// What a torchtitan launch runs unless told otherwise; Megatron-LM and NeMo add nothing.
    #[test]
    fn each_framework_implies_its_own_defaults() {
        for f in [Framework::Megatron, Framework::Nemo] {
            assert_eq!(f.implied(&ParallelSpec::default()), ParallelSpec::default());
        }
        let fp8 = ParallelSpec {
            dtype: Some(Dtype::Fp8),
            ..Default::default()
        };
        let titan = Framework::Torchtitan.implied(&fp8);
        assert_eq!(titan.cross_entropy, Some(CrossEntropy::Pytorch));
        assert_eq!(
            titan.attention_kernel,
            Some(AttentionKernel::FlashAttention2)
        );
        assert_eq!(titan.elementwise, Some(Elementwise::Eager));
        assert_eq!(titan.cp_comm, Some(CpComm::AllGather));
        assert_eq!(titan.fp8_library, Some(Fp8Library::Torchao));
        // async tensor parallelism compiles the model; bf16 has no fp8 library
        let overlapped = ParallelSpec {
            tp_comm_overlap: Some(true),
            ..Default::default()
        };
        let titan = Framework::Torchtitan.implied(&overlapped);
        assert_eq!(titan.elementwise, Some(Elementwise::Fused));
        assert_eq!(titan.fp8_library, None);
    }

    /// Megatron-LM's arguments name what a layout and architecture switch on, and nothing
    /// that is off: each flag below is checked both ways.
    #[test]
    fn megatron_names_what_is_on_and_nothing_that_is_off() {
        let (a, l) = target("llama2-7b", spec(2, 1, 4));
        let out = launch(Framework::Megatron, &a, &l).unwrap();
        for want in [
            "--untie-embeddings-and-output-weights",
            "--disable-bias-linear",
            "--attention-dropout 0 --hidden-dropout 0",
        ] {
            assert!(out.text.contains(want), "{want}: {}", out.text);
        }
        for absent in [
            "--context-parallel-size",
            "virtual",
            "--mtp-num-layers",
            "pipeline-num-layers",
            "--moe-",
        ] {
            assert!(!out.text.contains(absent), "{absent}: {}", out.text);
        }
        assert!(
            !out.notes.iter().any(|n| n.contains("twice the")),
            "{:?}",
            out.notes
        );
        assert!(!out.notes.iter().any(|n| n.contains("attention core")));
        let text = launch(
            Framework::Megatron,
            &Arch {
                tied_embeddings: true,
                linear_bias: true,
                dropout: true,
                ..a.clone()
            },
            &l,
        )
        .unwrap()
        .text;
        for absent in ["--untie-", "--disable-bias-linear", "dropout"] {
            assert!(!text.contains(absent), "{absent}: {text}");
        }
        // selective recomputation of the attention core is noted; of named modules it is not
        let selective = |modules: Option<Vec<crate::workload::RecomputeModule>>| {
            let s = ParallelSpec {
                recompute: Some(Recompute::Selective),
                recompute_modules: modules,
                ..spec(2, 1, 4)
            };
            let (a, l) = target("llama2-7b", s);
            launch(Framework::Megatron, &a, &l).unwrap().notes
        };
        assert!(selective(None).iter().any(|n| n.contains("attention core")));
        let mlp = Some(vec![crate::workload::RecomputeModule::Mlp]);
        assert!(!selective(mlp).iter().any(|n| n.contains("attention core")));
        // the embedding counted as a layer: its flag only, neither stage sizes nor chunks
        let split = ParallelSpec {
            account_for_embedding_in_pipeline_split: Some(true),
            ..spec(1, 3, 2)
        };
        let (a, l) = target("llama2-7b", split.clone());
        assert_eq!(l.stage_layers, [10, 11, 11]);
        let text = launch(Framework::Megatron, &a, &l).unwrap().text;
        assert!(
            text.contains("--account-for-embedding-in-pipeline-split")
                && !text.contains("pipeline-num-layers")
                && !text.contains("virtual"),
            "{text}"
        );
        // with chunks it names their number; without the split their size
        let interleaved = |model, s: ParallelSpec, vpp| {
            let s = ParallelSpec {
                schedule: Some(Schedule::Interleaved),
                vpp: Some(vpp),
                ..s
            };
            let (a, l) = target(model, s);
            launch(Framework::Megatron, &a, &l).unwrap().text
        };
        // Llama 2 70B's 81 (the embedding counted) over 3 ranks of 9 chunks; 60 micro-batches
        let text = interleaved(
            "llama2-70b",
            ParallelSpec {
                global_batch: Some(240),
                ..split
            },
            9,
        );
        assert!(
            text.contains("--num-virtual-stages-per-pipeline-rank 9")
                && !text.contains("--num-layers-per-virtual-pipeline-stage"),
            "{text}"
        );
        let text = interleaved("llama2-7b", spec(1, 2, 4), 2);
        assert!(
            text.contains("--num-layers-per-virtual-pipeline-stage 8")
                && !text.contains("--num-virtual-stages-per-pipeline-rank"),
            "{text}"
        );
        let e = launch(
            Framework::Megatron,
            &a,
            &target(
                "llama2-7b",
                ParallelSpec {
                    schedule: Some(Schedule::Gpipe),
                    ..spec(1, 2, 4)
                },
            )
            .1,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("no GPipe schedule"), "{e}");
    }

    /// A mixture's optional arguments appear exactly where its architecture has them: routing
    /// groups, shared experts, dense first layers, a multi-token prediction module, and each
    /// flex dispatcher's backend.
    #[test]
    fn megatron_states_a_mixtures_optional_parts_only_where_it_has_them() {
        let mixtral = crate::workload::presets::mixtral_8x7b();
        let moe = |dispatcher, mtp| ParallelSpec {
            ep: Some(2),
            // Megatron-Core needs it where experts and tp meet
            sequence_parallel: Some(true),
            moe_dispatcher: Some(dispatcher),
            mtp_layers: mtp,
            ..spec(2, 1, 4)
        };
        let text = launch(
            Framework::Megatron,
            &mixtral,
            &layout_of(&mixtral, moe(Dispatcher::Alltoall, None)),
        )
        .unwrap()
        .text;
        for absent in [
            "--moe-router-num-groups",
            "--moe-shared-expert",
            "--moe-layer-freq",
            "--mtp-num-layers",
            "--moe-flex-dispatcher-backend",
        ] {
            assert!(!text.contains(absent), "{absent}: {text}");
        }
        let grouped = with_deepseek_style_experts(&mixtral);
        let text = launch(
            Framework::Megatron,
            &grouped,
            &layout_of(&grouped, moe(Dispatcher::Hybridep, Some(1))),
        )
        .unwrap()
        .text;
        for want in [
            "--moe-router-num-groups 4 --moe-router-group-topk 2",
            "--moe-shared-expert-intermediate-size 14336",
            "--moe-layer-freq \"([0]*2+[1]*30)\"",
            "--mtp-num-layers 1",
            "--moe-token-dispatcher-type flex",
            "--moe-flex-dispatcher-backend hybridep",
        ] {
            assert!(text.contains(want), "{want}: {text}");
        }
        // experts in every other layer, the odd ones (Llama 4's): a mark for each layer
        let odd = with_odd_layer_experts(&mixtral);
        let text = launch(
            Framework::Megatron,
            &odd,
            &layout_of(&odd, moe(Dispatcher::Alltoall, None)),
        )
        .unwrap()
        .text;
        assert!(
            text.contains(&format!("--moe-layer-freq \"({ODD_LAYER_MARKS})\"")),
            "{text}"
        );
    }

    /// A plain layout's NeMo recipe and torchtitan job name no context exchange, chunks or
    /// pipeline settings; each appears with what it needs.
    #[test]
    fn nemo_and_torchtitan_set_parallel_options_only_where_the_layout_has_them() {
        let nemo = |s: ParallelSpec| {
            let (a, l) = target("llama3-8b", s);
            launch(Framework::Nemo, &a, &l).unwrap().text
        };
        let plain = nemo(spec(2, 1, 4));
        assert!(
            !plain.contains("cp_comm_type")
                && !plain.contains("pipeline_dtype")
                && plain.contains("virtual_pipeline_model_parallel_size = None\n")
                && plain.contains("use_distributed_optimizer=True")
                && plain.contains("recipe.optim.config.use_distributed_optimizer = True\n"),
            "{plain}"
        );
        let unsharded = nemo(ParallelSpec {
            zero: Some(0),
            ..spec(2, 1, 4)
        });
        assert!(
            unsharded.contains("use_distributed_optimizer=False")
                && unsharded.contains("recipe.optim.config.use_distributed_optimizer = False\n"),
            "{unsharded}"
        );
        let chunked = nemo(ParallelSpec {
            schedule: Some(Schedule::Interleaved),
            vpp: Some(2),
            ..spec(1, 2, 4)
        });
        assert!(
            chunked.contains("virtual_pipeline_model_parallel_size = 2\n")
                && chunked.contains("pipeline_dtype = torch.bfloat16\n"),
            "{chunked}"
        );

        let titan = |model: &str, s: ParallelSpec| {
            let (a, l) = target(model, s);
            launch(Framework::Torchtitan, &a, &l).map(|t| t.text)
        };
        // ZeRO 0 replicates over dp; no pipeline: the micro-batch is the local batch
        let text = titan(
            "llama3-8b",
            ParallelSpec {
                zero: Some(0),
                sequence_parallel: Some(true),
                ..spec(2, 1, 4)
            },
        )
        .unwrap();
        for want in [
            "data_parallel_replicate_degree = 4\n",
            "data_parallel_shard_degree = 1\n",
            "local_batch_size = 2\n",
        ] {
            assert!(text.contains(want), "{want}: {text}");
        }
        assert!(
            !text.contains("context_parallel_rotate_method")
                && !text.contains("pipeline_parallel_schedule"),
            "{text}"
        );
        // a pipeline's local batch is all of its micro-batches (256 / 2 / 2 = 64 of 2)
        let text = titan(
            "llama3-8b",
            ParallelSpec {
                zero: Some(3),
                ..spec(1, 2, 2)
            },
        )
        .unwrap();
        assert!(
            text.contains("local_batch_size = 128\n")
                && text.contains("pipeline_parallel_layers_per_stage = 16")
                && text.contains("pipeline_parallel_first_stage_less_layers = 0\n")
                && text.contains("pipeline_parallel_last_stage_less_layers = 0\n"),
            "{text}"
        );
        for (model, flavor) in [("llama3-70b", "70B"), ("llama3-405b", "405B")] {
            let text = titan(
                model,
                ParallelSpec {
                    zero: Some(3),
                    ..spec(1, 1, 8)
                },
            )
            .unwrap();
            assert!(text.contains(&format!("flavor = \"{flavor}\"")), "{text}");
        }
        // TP without sequence parallelism, and async TP run eagerly, are refused; eager
        // kernels without the overlap, or the overlap compiled, are not
        let tp = |sp, overlap, elementwise| ParallelSpec {
            zero: Some(3),
            sequence_parallel: Some(sp),
            tp_comm_overlap: Some(overlap),
            elementwise: Some(elementwise),
            ..spec(2, 1, 4)
        };
        let e = titan("llama3-8b", tp(false, false, Elementwise::Fused))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--sequence-parallel"), "{e}");
        let e = titan("llama3-8b", tp(true, true, Elementwise::Eager))
            .unwrap_err()
            .to_string();
        assert!(e.contains("torch.compile"), "{e}");
        for (overlap, elementwise) in [(false, Elementwise::Eager), (true, Elementwise::Fused)] {
            assert!(titan("llama3-8b", tp(true, overlap, elementwise)).is_ok());
        }
    }

    /// `arch` (32 layers) with experts in its odd layers only, as Llama 4 Maverick places them.
    fn with_odd_layer_experts(arch: &Arch) -> Arch {
        let mut odd = arch.clone();
        odd.moe = odd.moe.map(|m| crate::workload::MoeSpec {
            every: 2,
            offset: 1,
            ..m
        });
        odd
    }

    /// Megatron's mark for each of those 32 layers.
    const ODD_LAYER_MARKS: &str =
        "[0,1,0,1,0,1,0,1,0,1,0,1,0,1,0,1,0,1,0,1,0,1,0,1,0,1,0,1,0,1,0,1]";

    /// `arch` with DeepSeek-style experts: one shared expert, two dense first layers, routing
    /// in 2 of 4 groups.
    fn with_deepseek_style_experts(arch: &Arch) -> Arch {
        let mut grouped = arch.clone();
        grouped.moe = grouped.moe.map(|m| crate::workload::MoeSpec {
            shared_experts: 1,
            dense_layers: 2,
            groups: 4,
            topk_groups: 2,
            ..m
        });
        grouped
    }

    /// The layout of `spec` for an architecture built in the test.
    fn layout_of(arch: &Arch, spec: ParallelSpec) -> Layout {
        Layout::new(&spec, arch, &crate::hardware::dgx_h100_without_models()).unwrap()
    }

    /// Every way an architecture differs from Llama's reaches Megatron-LM's arguments, or is
    /// refused where Megatron-LM has no argument for it.
    #[test]
    fn megatron_states_each_architecture_difference() {
        let (base, l) = target("llama2-7b", spec(2, 1, 4));
        let megatron = |a: &Arch| launch(Framework::Megatron, a, &l).map(|m| m.text);
        let text = megatron(&base).unwrap();
        for absent in [
            "--kv-channels",
            "--add-qkv-bias",
            "--qk-layernorm",
            "--squared-relu",
            "--window-size",
            "learned_absolute",
        ] {
            assert!(!text.contains(absent), "{absent}: {text}");
        }
        assert!(text.contains("--position-embedding-type rope"), "{text}");
        let text = megatron(&Arch {
            head_dim: 96,
            qkv_bias: true,
            qk_norm: true,
            position: Position::Learned,
            activation: Activation::SquaredRelu,
            sliding_window: Some(4096),
            global_attention_every: Some(2),
            ..base.clone()
        })
        .unwrap();
        for want in [
            "--kv-channels 96",
            "--add-qkv-bias",
            "--qk-layernorm",
            "--position-embedding-type learned_absolute",
            "--squared-relu",
            // Megatron-Core's window is the keys left of the query: the query's own is the 4096th
            "--window-size 4095,0",
            "--window-attn-skip-freq 2",
        ] {
            assert!(text.contains(want), "{want}: {text}");
        }
        assert!(!text.contains("--swiglu"), "{text}");
        // a window on every layer sets no skip frequency
        let text = megatron(&Arch {
            sliding_window: Some(4096),
            ..base.clone()
        })
        .unwrap();
        assert!(
            text.contains("--window-size 4095,0") && !text.contains("--window-attn-skip-freq"),
            "{text}"
        );
        let e = megatron(&Arch {
            activation: Activation::Geglu,
            ..base.clone()
        })
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("GeGLU") && e.contains("gated_linear_unit"),
            "{e}"
        );
        let e = megatron(&Arch {
            position: Position::Alibi,
            ..base.clone()
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("ALiBi"), "{e}");
        // full precision: neither --bf16 nor --fp16
        let (a, l) = target(
            "llama2-7b",
            ParallelSpec {
                dtype: Some(Dtype::Fp32),
                ..spec(2, 1, 4)
            },
        );
        let text = launch(Framework::Megatron, &a, &l).unwrap().text;
        assert!(
            !text.contains("--bf16") && !text.contains("--fp16"),
            "{text}"
        );
    }

    /// Megatron-LM takes uneven end stages as `--decoder-first/last-pipeline-num-layers`, an
    /// all-gather context exchange as its type, and a mixture's capacity and padding.
    #[test]
    fn megatron_states_uneven_stages_the_context_exchange_and_expert_capacity() {
        let (a, l) = target("llama2-7b", spec(1, 3, 2));
        assert_eq!(l.stage_layers, [11, 11, 10]);
        let text = launch(Framework::Megatron, &a, &l).unwrap().text;
        assert!(
            text.contains("--decoder-last-pipeline-num-layers 10")
                && !text.contains("--decoder-first-pipeline-num-layers"),
            "{text}"
        );
        let neox = ParallelSpec {
            partition: Some(crate::workload::Partition::Neox),
            ..spec(1, 4, 2)
        };
        let (a, l) = target("llama2-7b", neox);
        assert_eq!(l.stage_layers, [8, 9, 9, 6]);
        let text = launch(Framework::Megatron, &a, &l).unwrap().text;
        assert!(
            text.contains("--decoder-first-pipeline-num-layers 8")
                && text.contains("--decoder-last-pipeline-num-layers 6"),
            "{text}"
        );
        let (a, l) = target("llama2-7b", spec(2, 1, 4));
        let text = launch(Framework::Megatron, &a, &l).unwrap().text;
        assert!(!text.contains("pipeline-num-layers"), "{text}");
        for (comm, name) in [(CpComm::P2p, "p2p"), (CpComm::AllGather, "all_gather")] {
            let s = ParallelSpec {
                cp: Some(2),
                cp_comm: Some(comm),
                ..spec(2, 1, 2)
            };
            let (a, l) = target("llama2-7b", s);
            let text = launch(Framework::Megatron, &a, &l).unwrap().text;
            assert!(text.contains("--context-parallel-size 2"), "{text}");
            assert!(text.contains(&format!("--cp-comm-type {name}")), "{text}");
        }
        let mixtral = crate::workload::presets::mixtral_8x7b();
        let capacity = |pad| ParallelSpec {
            ep: Some(2),
            // Megatron-Core needs it where experts and tp meet
            sequence_parallel: Some(true),
            moe_capacity_factor: Some(1.25),
            moe_pad_to_capacity: Some(pad),
            ..spec(2, 1, 4)
        };
        let text = launch(
            Framework::Megatron,
            &mixtral,
            &layout_of(&mixtral, capacity(true)),
        )
        .unwrap()
        .text;
        assert!(
            text.contains("--moe-expert-capacity-factor 1.25")
                && text.contains("--moe-pad-expert-input-to-capacity"),
            "{text}"
        );
        let text = launch(
            Framework::Megatron,
            &mixtral,
            &layout_of(&mixtral, capacity(false)),
        )
        .unwrap()
        .text;
        assert!(
            text.contains("--moe-expert-capacity-factor 1.25")
                && !text.contains("--moe-pad-expert-input-to-capacity"),
            "{text}"
        );
    }

    /// A model NeMo has no recipe for is the base recipe's with every architecture field set:
    /// before, a mixture of experts exported on Llama 3 8B's recipe trained a dense Llama.
    #[test]
    fn nemo_sets_the_architecture_of_a_model_without_a_recipe() {
        let nemo = |a: &Arch, s: ParallelSpec| {
            launch(Framework::Nemo, a, &layout_of(a, s)).map(|n| (n.text, n.notes))
        };
        let field = |key: &str, value: &str| format!("recipe.model.config.{key} = {value}\n");
        let mixtral = crate::workload::presets::mixtral_8x7b();
        let moe = ParallelSpec {
            ep: Some(2),
            // Megatron-Core needs it where experts and tp meet
            sequence_parallel: Some(true),
            ..spec(2, 1, 4)
        };
        let (text, notes) = nemo(&mixtral, moe.clone()).unwrap();
        assert!(text.contains("llm.llama3_8b.pretrain_recipe"), "{text}");
        assert!(notes
            .iter()
            .any(|n| n.contains("no recipe for mixtral-8x7b") && n.contains("architecture set")));
        for want in [
            field("num_moe_experts", "8"),
            field("moe_router_topk", "2"),
            field("moe_ffn_hidden_size", "14336"),
            field("moe_grouped_gemm", "True"),
            field("normalization", "\"RMSNorm\""),
            field("activation_func", "F.silu"),
            field("gated_linear_unit", "True"),
            field("position_embedding_type", "\"rope\""),
            field("add_bias_linear", "False"),
            field("kv_channels", "128"),
            field("share_embeddings_and_output_weights", "False"),
            field("hidden_dropout", "0.0"),
            "import torch.nn.functional as F\n".into(),
        ] {
            assert!(text.contains(&want), "{want}: {text}");
        }
        for absent in [
            "moe_layer_freq",
            "moe_shared_expert",
            "moe_router_num_groups",
            "window_size",
            "squared_relu",
        ] {
            assert!(!text.contains(absent), "{absent}: {text}");
        }
        // DeepSeek-style experts: shared ones, dense first layers, routing groups
        let grouped = with_deepseek_style_experts(&mixtral);
        let (text, _) = nemo(&grouped, moe.clone()).unwrap();
        for want in [
            field("moe_shared_expert_intermediate_size", "14336"),
            field("moe_layer_freq", "[0]*2+[1]*30"),
            field("moe_router_num_groups", "4"),
            field("moe_router_group_topk", "2"),
        ] {
            assert!(text.contains(&want), "{want}: {text}");
        }
        let (text, _) = nemo(&with_odd_layer_experts(&mixtral), moe).unwrap();
        assert!(
            text.contains(&field("moe_layer_freq", ODD_LAYER_MARKS)),
            "{text}"
        );
        // a GELU model is GPT-3's recipe; GeGLU is its gated form, squared ReLU imported
        let (base, _) = target("llama2-7b", spec(2, 1, 4));
        let custom = |activation| Arch {
            name: "custom".into(),
            activation,
            norm: NormKind::Layernorm,
            position: Position::Learned,
            linear_bias: true,
            qk_norm: true,
            tied_embeddings: true,
            dropout: true,
            sliding_window: Some(1024),
            global_attention_every: Some(4),
            ..base.clone()
        };
        let (text, _) = nemo(&custom(Activation::Geglu), spec(2, 1, 4)).unwrap();
        for want in [
            field("activation_func", "F.gelu"),
            field("gated_linear_unit", "True"),
            field("normalization", "\"LayerNorm\""),
            field("position_embedding_type", "\"learned_absolute\""),
            field("add_bias_linear", "True"),
            field("qk_layernorm", "True"),
            field("share_embeddings_and_output_weights", "True"),
            field("attention_dropout", "0.1"),
            field("window_size", "(1023, 0)"),
            field("window_attn_skip_freq", "4"),
        ] {
            assert!(text.contains(&want), "{want}: {text}");
        }
        assert!(text.contains("llm.gpt3_175b.pretrain_recipe"), "{text}");
        let (text, _) = nemo(&custom(Activation::Gelu), spec(2, 1, 4)).unwrap();
        assert!(
            text.contains(&field("gated_linear_unit", "False")),
            "{text}"
        );
        let (text, _) = nemo(&custom(Activation::SquaredRelu), spec(2, 1, 4)).unwrap();
        assert!(
            text.contains(&field("activation_func", "squared_relu"))
                && text.contains("from megatron.core.activations import squared_relu\n"),
            "{text}"
        );
        // a model NeMo has a recipe for sets none of it
        let (text, notes) = nemo(&base, spec(2, 1, 4)).unwrap();
        assert!(notes.is_empty(), "{notes:?}");
        for absent in [
            "normalization",
            "activation_func",
            "import torch.nn.functional",
        ] {
            assert!(!text.contains(absent), "{absent}: {text}");
        }
        let e = nemo(
            &Arch {
                position: Position::Alibi,
                ..custom(Activation::Gelu)
            },
            spec(2, 1, 4),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("nemo") && e.contains("ALiBi"), "{e}");
        let e = nemo(
            &Arch {
                mla: Some(crate::workload::MlaSpec {
                    q_lora_rank: None,
                    kv_lora_rank: 512,
                    qk_nope_head_dim: 128,
                    qk_rope_head_dim: 64,
                    v_head_dim: 128,
                }),
                ..base.clone()
            },
            spec(2, 1, 4),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("latent-attention") && e.contains("megatron"),
            "{e}"
        );
    }

    /// NeMo's recipe carries the context exchange, multi-token prediction and the TP overlap
    /// callback a layout was predicted with.
    #[test]
    fn nemo_carries_the_context_exchange_prediction_modules_and_tp_overlap() {
        let nemo = |s: ParallelSpec| {
            let (a, l) = target("llama3-8b", s);
            launch(Framework::Nemo, &a, &l).unwrap().text
        };
        let text = nemo(ParallelSpec {
            cp: Some(2),
            cp_comm: Some(CpComm::AllGather),
            mtp_layers: Some(1),
            tp_comm_overlap: Some(true),
            sequence_parallel: Some(true),
            ..spec(2, 1, 2)
        });
        for want in [
            "recipe.model.config.cp_comm_type = \"all_gather\"\n",
            "recipe.model.config.mtp_num_layers = 1\n",
            // the callback told the layout's data-parallel overlap, not its own defaults
            "recipe.trainer.callbacks.append(run.Config(MegatronCommOverlapCallback, \
             tp_comm_overlap=True, overlap_grad_reduce=True, overlap_param_gather=True, \
             bucket_size=40000000))",
        ] {
            assert!(text.contains(want), "{want}: {text}");
        }
        let text = nemo(ParallelSpec {
            tp_comm_overlap: Some(true),
            sequence_parallel: Some(true),
            overlap_grad_reduce: Some(false),
            overlap_param_gather: Some(false),
            dp_bucket_elements: Some(1 << 27),
            ..spec(2, 1, 2)
        });
        assert!(
            text.contains(
                "tp_comm_overlap=True, overlap_grad_reduce=False, overlap_param_gather=False, \
                 bucket_size=134217728))"
            ),
            "{text}"
        );
        let text = nemo(ParallelSpec {
            cp: Some(2),
            ..spec(2, 1, 2)
        });
        assert!(
            text.contains("recipe.model.config.cp_comm_type = \"p2p\"\n")
                && !text.contains("mtp_num_layers")
                && !text.contains("MegatronCommOverlapCallback, tp_comm_overlap"),
            "{text}"
        );
    }

    /// torchtitan builds ceil((layers + first_less + last_less) / layers_per_stage) model chunks
    /// and, unless told, gives the embedding and the output a layer's place each: an even split
    /// is exported with both at 0 (the defaults made 34 / 8 = 5 chunks of Llama 3 8B's 32 layers
    /// on pp 4 and torchtitan raised), Megatron's account-for split with both at 1, torchtitan's
    /// remainder-first split as it is, and a split torchtitan cannot build is refused.
    #[test]
    fn torchtitan_builds_the_costed_pipeline_chunks_or_refuses() {
        let split = |model: &str, s: ParallelSpec| {
            let (a, l) = target(model, s);
            (torchtitan_split(a.layers, &l), a, l)
        };
        let tt = |layers_per_stage, first_less, last_less| {
            Some(TorchtitanSplit {
                layers_per_stage,
                first_less,
                last_less,
            })
        };
        assert_eq!(split("llama3-8b", spec(1, 4, 2)).0, tt(8, 0, 0));
        let accounted = ParallelSpec {
            account_for_embedding_in_pipeline_split: Some(true),
            account_for_loss_in_pipeline_split: Some(true),
            zero: Some(3),
            ..spec(1, 2, 4)
        };
        let (got, a, l) = split("llama3-70b", accounted);
        assert_eq!((got, &l.chunk_layers[..]), (tt(41, 1, 1), &[40, 40][..]));
        let text = launch(Framework::Torchtitan, &a, &l).unwrap().text;
        for want in [
            "pipeline_parallel_layers_per_stage = 41\n",
            "pipeline_parallel_first_stage_less_layers = 1\n",
            "pipeline_parallel_last_stage_less_layers = 1\n",
        ] {
            assert!(text.contains(want), "{want}: {text}");
        }
        // 80 layers on pp 3: Megatron's remainder lands where torchtitan's does
        let (got, _, l) = split("llama3-70b", spec(1, 3, 1));
        assert_eq!(
            (got, &l.chunk_layers[..]),
            (tt(27, 0, 0), &[27, 27, 26][..])
        );
        // torchtitan's own default split of 32 layers over 4 chunks (8, 9, 8, 7 and the
        // embedding and output) — not one Megatron's rules make, but exported as it is
        let (_, _, mut l) = split("llama3-8b", spec(1, 4, 2));
        l.chunk_layers = vec![8, 9, 8, 7];
        l.pipeline_split = crate::workload::PipelineSplit {
            embedding: true,
            loss: true,
        };
        assert_eq!(torchtitan_split(32, &l), tt(9, 1, 1));
        // on pp 6 Megatron puts the remainder in the middle, torchtitan on the first chunks
        let fsdp = ParallelSpec {
            zero: Some(3),
            ..spec(1, 6, 1)
        };
        let (got, a, mut l) = split("llama3-70b", fsdp);
        assert_eq!(
            (got, &l.chunk_layers[..]),
            (None, &[13, 14, 14, 13, 13, 13][..])
        );
        let refused = launch(Framework::Torchtitan, &a, &l)
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("[13, 14, 14, 13, 13, 13]")
                && refused.contains("a pp·vpp that divides 80 (or 82"),
            "{refused}"
        );
        // and a chunk count no layers_per_stage gives: 9 layers in 6 chunks takes 2 per chunk
        // at the least, and 2 makes 5 chunks
        l.pipeline_split = crate::workload::PipelineSplit::default();
        l.chunk_layers = vec![2, 2, 2, 1, 1, 1];
        assert_eq!(torchtitan_split(9, &l), None);
        l.chunk_layers = vec![9];
        assert_eq!(torchtitan_split(9, &l), None);
    }

    /// torchtitan takes GPipe, full precision and its ring rotation, and refuses what only
    /// Megatron-Core has.
    #[test]
    fn torchtitan_maps_its_schedule_precision_and_rotation_or_refuses() {
        let titan = |s: ParallelSpec| {
            let (a, l) = target("llama3-8b", ParallelSpec { zero: Some(3), ..s });
            launch(Framework::Torchtitan, &a, &l).map(|t| t.text)
        };
        let text = titan(ParallelSpec {
            schedule: Some(Schedule::Gpipe),
            dtype: Some(Dtype::Fp32),
            ..spec(1, 4, 2)
        })
        .unwrap();
        assert!(
            text.contains("pipeline_parallel_schedule = \"GPipe\"") && text.contains("\"float32\""),
            "{text}"
        );
        let text = titan(ParallelSpec {
            cp: Some(2),
            cp_comm: Some(CpComm::P2p),
            ..spec(1, 1, 4)
        })
        .unwrap();
        assert!(
            text.contains("context_parallel_rotate_method = \"alltoall\""),
            "{text}"
        );
        let e = titan(ParallelSpec {
            mtp_layers: Some(1),
            ..spec(1, 1, 8)
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("multi-token prediction"), "{e}");
        let e = titan(ParallelSpec {
            recompute: Some(Recompute::Selective),
            recompute_modules: Some(vec![crate::workload::RecomputeModule::CoreAttn]),
            ..spec(1, 1, 8)
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("recompute modules"), "{e}");
    }

    #[test]
    fn only_uneven_first_and_last_stages_are_expressible() {
        assert_eq!(uneven_ends(&[8, 8, 8]), Some((None, None)));
        assert_eq!(uneven_ends(&[8, 8]), Some((None, None)));
        assert_eq!(uneven_ends(&[7, 9]), Some((Some(7), None)));
        assert_eq!(uneven_ends(&[6, 8, 8, 10]), Some((Some(6), Some(10))));
        assert_eq!(uneven_ends(&[8, 8, 7]), Some((None, Some(7))));
        assert_eq!(uneven_ends(&[8, 7, 8, 9]), None);
        assert!(nodes(12, 8)
            .unwrap_err()
            .to_string()
            .contains("whole nodes"));
        assert_eq!(nodes(4, 8).unwrap(), (1, 4));
    }
}

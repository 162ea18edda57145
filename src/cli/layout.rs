//! The job every prediction command takes: a cluster, a model and a parallel layout, from
//! flags or a job file (`--job`) that flags override.

use std::path::{Path, PathBuf};

use clap::Args;

use super::named;
use serde::Deserialize;

use stepcast::export::Framework;
use stepcast::hardware::Cluster;
use stepcast::ops::Dtype;
use stepcast::workload::{
    Arch, AttentionImpl, AttentionKernel, CpComm, CrossEntropy, CudaGraphScope, Dispatcher,
    Elementwise, Fp8Library, Layout, ParallelSpec, Partition, Recompute, RecomputeModule, Rules,
    Schedule,
};

#[derive(Debug, Args)]
pub struct JobArgs {
    /// Cluster file (e.g. hardware-profiles/perlmutter.yaml) or a built-in cluster by name:
    /// dgx-a100, dgx-a100-40gb, dgx-h100, dgx-h200, grand-teton-h100, mi300x, perlmutter, vista.
    #[arg(long)]
    pub cluster: Option<PathBuf>,
    /// Architecture: a preset (llemma-7b, llama2-70b, gpt3-175b, …), a YAML architecture file
    /// or a Hugging Face config.json.
    #[arg(long)]
    pub model: Option<String>,
    /// Job file holding cluster, model and parallel settings; flags override it.
    #[arg(long)]
    pub job: Option<PathBuf>,
    /// Nodes the job may use, in place of the cluster file's count (e.g. the 8 nodes of a
    /// 64-GPU run on a larger machine).
    #[arg(long, allow_negative_numbers = true)]
    pub nodes: Option<i64>,
    /// Tensor parallelism: each layer's weight matrices split over tp GPUs, which all-reduce
    /// (or, with --sequence-parallel, all-gather and reduce-scatter) its activations [default: 1].
    #[arg(long, allow_negative_numbers = true)]
    pub tp: Option<u64>,
    /// Pipeline parallelism: the layers split into pp stages, each on its own GPUs, micro-batches
    /// passed from stage to stage [default: 1].
    #[arg(long, allow_negative_numbers = true)]
    pub pp: Option<u64>,
    /// Data parallelism: dp replicas of the model (tp·cp·pp GPUs each), each on its share of the
    /// global batch, reducing their gradients every step [default: 1].
    #[arg(long, allow_negative_numbers = true)]
    pub dp: Option<u64>,
    /// Context parallelism (Megatron-Core ring attention): each sequence split over cp ranks,
    /// keys and values passed around the ring beside the attention [default: 1].
    #[arg(long, allow_negative_numbers = true)]
    pub cp: Option<u64>,
    /// How context-parallel ranks exchange keys and values: p2p (a ring beside the attention,
    /// Megatron's default) or all-gather (torchtitan's default) [default: p2p].
    #[arg(long, value_parser = named::<CpComm>())]
    pub cp_comm: Option<CpComm>,
    /// Which kernel runs the attention: native (what the cluster's models learned) or
    /// flash-attention-2 (flash-attn 2, PyTorch SDPA's flash backend: on Hopper held to the
    /// cluster file's achievable.flash_attention_2_* fraction of peak) [default: native].
    #[arg(long, value_parser = named::<AttentionKernel>())]
    pub attention_kernel: Option<AttentionKernel>,
    /// Which cross-entropy computes the loss: vocab-parallel (Megatron's, in place on the
    /// fp32 logits), pytorch (PyTorch's cross_entropy on fp32 logits: torchtitan, Composer,
    /// Hugging Face; timed as the vocab-parallel one, its memory its own) or fused
    /// (Transformer Engine's kernel over the 16-bit logits, `--cross-entropy-loss-fusion
    /// --cross-entropy-fusion-impl te`: Megatron-Bridge's performance recipes; costed at its
    /// roofline) [default: vocab-parallel].
    #[arg(long, value_parser = named::<CrossEntropy>())]
    pub cross_entropy: Option<CrossEntropy>,
    /// How the model code's RMSNorm, rotary embedding and SiLU-and-multiply run: fused
    /// (Megatron-Core and Transformer Engine kernels, or PyTorch code under torch.compile) or
    /// eager (PyTorch code without torch.compile, torchtitan's default: each operation a
    /// kernel and a pass over memory, fp32 where the code casts) [default: fused].
    #[arg(long, value_parser = named::<Elementwise>())]
    pub elementwise: Option<Elementwise>,
    /// Expert parallelism for a mixture of experts: experts split over ep ranks of dp·cp.
    #[arg(long, allow_negative_numbers = true)]
    pub ep: Option<u64>,
    /// Expert tensor parallelism: each expert's MLP split over etp ranks (Megatron's
    /// --expert-tensor-parallel-size) [default: tp].
    #[arg(long, allow_negative_numbers = true)]
    pub etp: Option<u64>,
    /// Router imbalance: the busiest expert's tokens over the mean (1 = balanced) [default: 1].
    #[arg(long, allow_negative_numbers = true)]
    pub moe_imbalance: Option<f64>,
    /// Router load per layer from a run: a CSV of layer,expert,tokens (tokens each expert
    /// received) or layer,imbalance; the busiest expert-parallel rank's load follows for the
    /// layout's ep (see the README's "Expert routing file").
    #[arg(long, value_name = "CSV")]
    pub moe_routing: Option<PathBuf>,
    /// Expert capacity over the mean tokens per expert; tokens beyond it are dropped
    /// (Megatron's --moe-expert-capacity-factor) [default: dropless].
    #[arg(long, allow_negative_numbers = true)]
    pub moe_capacity_factor: Option<f64>,
    /// Pad every expert's input to its capacity (Megatron's
    /// --moe-pad-expert-input-to-capacity; needs --moe-capacity-factor).
    #[arg(long)]
    pub moe_pad_to_capacity: bool,
    /// Run the expert all-to-alls beside the compute (Megatron-Core's
    /// --overlap-moe-expert-parallel-comm, NeMo's moe_a2a_overlap) [default: false].
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    #[arg(value_parser = super::switch())]
    pub moe_a2a_overlap: Option<bool>,
    /// How routed tokens reach their experts: alltoall (NCCL, Megatron's default), allgather,
    /// deepep or hybridep (hierarchical: once per node over the network, then NVLink)
    /// [default: alltoall].
    #[arg(long, value_parser = named::<Dispatcher>())]
    pub moe_dispatcher: Option<Dispatcher>,
    /// Sequences per micro-batch.
    #[arg(long, allow_negative_numbers = true)]
    pub micro_batch: Option<u64>,
    /// Sequences per step over all data-parallel replicas (or give --micro-batches).
    #[arg(long, allow_negative_numbers = true)]
    pub global_batch: Option<u64>,
    /// Micro-batches per step on each pipeline (gradient accumulation).
    #[arg(long, allow_negative_numbers = true)]
    pub micro_batches: Option<u64>,
    /// Sequence length (default: the architecture's).
    #[arg(long, allow_negative_numbers = true)]
    pub seq_len: Option<u64>,
    /// Megatron sequence parallelism (needs tp > 1).
    #[arg(long)]
    pub sequence_parallel: bool,
    /// What the backward recomputes instead of storing: none, selective (the attention core),
    /// selective-op and selective-layer (torchtitan's) or full (each layer's forward) [default:
    /// none; full under --rules paper].
    #[arg(long, value_parser = named::<Recompute>())]
    pub recompute: Option<Recompute>,
    /// What selective recomputation rebuilds, Megatron-Core's --recompute-modules:
    /// core_attn, layernorm, mla_up_proj, mlp, moe_act, shared_experts, moe (implies
    /// --recompute selective) [default: core_attn].
    #[arg(long, value_parser = named::<RecomputeModule>(), value_delimiter = ',')]
    pub recompute_modules: Option<Vec<RecomputeModule>>,
    /// Parts of each layer captured in CUDA graphs, the host replaying each part with one
    /// graph launch instead of issuing its kernels (Megatron-Core's --cuda-graph-scope): none,
    /// layer (the whole layer, --cuda-graph-impl local), or any of attn, mlp, moe, moe_router,
    /// moe_preprocess (Transformer Engine's partial graphs) [default: none].
    #[arg(long, value_parser = named::<CudaGraphScope>(), value_delimiter = ',')]
    pub cuda_graphs: Option<Vec<CudaGraphScope>>,
    /// How the layers are split over pipeline stages: uniform (Megatron's) or neox (GPT-NeoX's:
    /// the layers and five other blocks split evenly, two of those on the first stage and three
    /// on the last) [default: uniform; neox under --rules paper].
    #[arg(long, value_parser = named::<Partition>())]
    pub partition: Option<Partition>,
    /// Optimizer sharding over data parallelism: 0, 1 (distributed optimizer), 2, 3 (FSDP).
    #[arg(long, allow_negative_numbers = true)]
    pub zero: Option<u8>,
    /// Training data type: bf16, fp16 or fp8 (fp8 GEMMs, 16-bit elsewhere).
    #[arg(long, value_parser = named::<Dtype>())]
    pub dtype: Option<Dtype>,
    /// Type the data-parallel gradients are reduced in: fp32, bf16 or fp16 [default: fp32 when
    /// training in bf16 or fp8 (Megatron, NeMo, torchtitan), fp16 under fp16]; bf16 for
    /// frameworks that reduce in 16 bits (Composer's FSDP `mixed_precision: PURE`).
    #[arg(long, value_parser = named::<Dtype>())]
    pub grad_reduce_dtype: Option<Dtype>,
    /// Keep fp8 training's weights in fp8 (with the transpose Transformer Engine keeps for the
    /// backward) and all-gather them over data parallelism in fp8: Megatron's
    /// --fp8-param-gather, NeMo's fp8_param_gather (its fp8 recipes' default), torchtitan's
    /// enable_fsdp_float8_all_gather [default: false].
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    #[arg(value_parser = super::switch())]
    pub fp8_param_gather: Option<bool>,
    /// Which library runs fp8 training: transformer-engine (Megatron, NeMo: fp8 weight caches,
    /// fp8 GEMM inputs kept for the backward) or torchao (torchtitan: 16-bit inputs kept)
    /// [default: transformer-engine].
    #[arg(long, value_parser = named::<Fp8Library>())]
    pub fp8_library: Option<Fp8Library>,
    /// Composition rules: megatron (default) or paper (Zhang et al.'s tool).
    #[arg(long, value_parser = named::<Rules>())]
    pub rules: Option<Rules>,
    /// Elements per data-parallel gradient bucket.
    #[arg(long, allow_negative_numbers = true)]
    pub dp_bucket_elements: Option<u64>,
    /// Pipeline schedule (default 1f1b; interleaved with --vpp; closed-form under paper rules).
    #[arg(long, value_parser = named::<Schedule>())]
    pub schedule: Option<Schedule>,
    /// Model chunks per pipeline rank: the interleaved schedule's N (2 or more), zb-v's 2.
    #[arg(long, allow_negative_numbers = true)]
    pub vpp: Option<u64>,
    /// Reduce gradients bucket by bucket during the last backward [default under Megatron
    /// rules: true, as NeMo's recipes and `export` set it; Megatron-LM's own flag is off unless
    /// given: say false for a run without it].
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    #[arg(value_parser = super::switch())]
    pub overlap_grad_reduce: Option<bool>,
    /// All-gather the distributed optimizer's parameters (FSDP's under a pipeline) during the
    /// first forward [default under Megatron rules: true with zero 1–2, or zero 3 with pp > 1,
    /// and dp > 1, as NeMo's recipes and `export` set it; Megatron-LM's own flag is off unless
    /// given].
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    #[arg(value_parser = super::switch())]
    pub overlap_param_gather: Option<bool>,
    /// Pipeline sends on their own stream instead of blocking the sender [default: true for
    /// the interleaved schedule].
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    #[arg(value_parser = super::switch())]
    pub overlap_p2p: Option<bool>,
    /// Pipeline the sequence-parallel all-gathers and reduce-scatters with their GEMMs, as
    /// NeMo's and Megatron's --tp-comm-overlap do (Transformer Engine userbuffers; needs
    /// --sequence-parallel): how much hides is simulated [default: false].
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    #[arg(value_parser = super::switch())]
    pub tp_comm_overlap: Option<bool>,
    /// Count the embedding as a layer when splitting the layers over pipeline chunks: the
    /// first chunk holds one layer fewer (Megatron's flag of the same name).
    #[arg(long)]
    pub account_for_embedding_in_pipeline_split: bool,
    /// Count the loss as a layer when splitting the layers over pipeline chunks: the last
    /// chunk holds one layer fewer (Megatron's flag of the same name).
    #[arg(long)]
    pub account_for_loss_in_pipeline_split: bool,
    /// Multi-token prediction modules trained beside the model, on the last pipeline stage
    /// (Megatron's --mtp-num-layers; DeepSeek-V3 trains one) [default: 0].
    #[arg(long, allow_negative_numbers = true)]
    pub mtp_layers: Option<u64>,
    /// What each pipeline chunk holds, as Megatron-Core's --pipeline-model-parallel-layout:
    /// E embedding, t layer, m multi-token prediction, L loss, | next chunk, X*N and (…)*N
    /// repeat (e.g. "Et|(tt|)*30mL"); vpp follows as chunks / pp.
    #[arg(
        long,
        visible_alias = "pipeline-model-parallel-layout",
        value_name = "LAYOUT"
    )]
    pub pipeline_layout: Option<String>,
    /// The training framework (e.g. composer): the models' calibration fitted on that
    /// framework's runs is used where there is one (`calibrate --framework`).
    #[arg(long, value_parser = stepcast::hardware::framework_name)]
    pub framework: Option<String>,
}

/// A job file: paths in it are relative to the file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct JobFile {
    cluster: Option<PathBuf>,
    /// Nodes the job may use (overrides the cluster file's count).
    nodes: Option<i64>,
    model: Option<String>,
    /// A routing CSV (tokens per expert per layer) for a mixture of experts.
    moe_routing: Option<PathBuf>,
    /// The training framework whose calibration applies (as --framework).
    framework: Option<String>,
    #[serde(default)]
    parallel: ParallelSpec,
}

/// A resolved job.
pub struct Job {
    pub cluster: Cluster,
    pub arch: Arch,
    pub layout: Layout,
    /// The job file, cluster and architecture it was read from (for JSON provenance).
    pub inputs: Vec<stepcast::provenance::Input>,
    /// What the user should know about how the job was read.
    pub notes: Vec<String>,
    /// The training framework whose calibration applies, if given.
    pub framework: Option<String>,
}

impl JobArgs {
    /// `resolve`, for a launch of `framework` when the job names none: the layout is costed
    /// as that framework runs it by default.
    pub fn resolve_for(&self, framework: Framework) -> anyhow::Result<Job> {
        self.resolve_with(Some(framework))
    }

    pub fn resolve(&self) -> anyhow::Result<Job> {
        self.resolve_with(None)
    }

    /// `fallback`: the framework when neither the flags nor the job file name one.
    fn resolve_with(&self, fallback: Option<Framework>) -> anyhow::Result<Job> {
        let (job, job_dir) = match &self.job {
            Some(path) => {
                let job: JobFile = stepcast::fsutil::read_yaml(path).map_err(|e| {
                    e.hint(
                        "a job file holds cluster:, model: and parallel: {tp, pp, dp, \
                         micro_batch, global_batch, …}; see the README's job file",
                    )
                })?;
                (
                    job,
                    path.parent().map(Path::to_path_buf).unwrap_or_default(),
                )
            }
            None => (JobFile::default(), PathBuf::new()),
        };
        let cluster_path = self
            .cluster
            .clone()
            .or_else(|| {
                job.cluster.as_ref().map(|p| {
                    // a file beside the job file, else a built-in cluster by name
                    let rel = job_dir.join(p);
                    if rel.is_file() || stepcast::assets::cluster(&p.to_string_lossy()).is_none() {
                        rel
                    } else {
                        p.clone()
                    }
                })
            })
            .ok_or_else(|| {
                stepcast::Error::Invalid(
                    "give a cluster file with --cluster (or cluster: in the job file)".into(),
                )
            })?;
        let model = self
            .model
            .clone()
            .or_else(|| {
                job.model.as_ref().map(|m| {
                    let rel = job_dir.join(m);
                    if rel.is_file() {
                        rel.display().to_string()
                    } else {
                        m.clone()
                    }
                })
            })
            .ok_or_else(|| {
                stepcast::Error::Invalid(
                    "give a model with --model (or model: in the job file)".into(),
                )
            })?;
        let flags = ParallelSpec {
            tp: self.tp,
            pp: self.pp,
            dp: self.dp,
            cp: self.cp,
            cp_comm: self.cp_comm,
            attention_kernel: self.attention_kernel,
            cross_entropy: self.cross_entropy,
            elementwise: self.elementwise,
            ep: self.ep,
            etp: self.etp,
            moe_imbalance: self.moe_imbalance,
            moe_capacity_factor: self.moe_capacity_factor,
            moe_pad_to_capacity: self.moe_pad_to_capacity.then_some(true),
            moe_a2a_overlap: self.moe_a2a_overlap,
            micro_batch: self.micro_batch,
            global_batch: self.global_batch,
            micro_batches: self.micro_batches,
            seq_len: self.seq_len,
            sequence_parallel: self.sequence_parallel.then_some(true),
            recompute: self.recompute,
            partition: self.partition,
            zero: self.zero,
            dtype: self.dtype,
            grad_reduce_dtype: self.grad_reduce_dtype,
            fp8_param_gather: self.fp8_param_gather,
            fp8_library: self.fp8_library,
            rules: self.rules,
            dp_bucket_elements: self.dp_bucket_elements,
            schedule: self.schedule,
            vpp: self.vpp,
            overlap_grad_reduce: self.overlap_grad_reduce,
            overlap_param_gather: self.overlap_param_gather,
            overlap_p2p: self.overlap_p2p,
            tp_comm_overlap: self.tp_comm_overlap,
            account_for_embedding_in_pipeline_split: self
                .account_for_embedding_in_pipeline_split
                .then_some(true),
            account_for_loss_in_pipeline_split: self
                .account_for_loss_in_pipeline_split
                .then_some(true),
            mtp_layers: self.mtp_layers,
            pipeline_layout: self.pipeline_layout.clone(),
            recompute_modules: self.recompute_modules.clone(),
            cuda_graphs: self.cuda_graphs.clone(),
            moe_dispatcher: self.moe_dispatcher,
        };
        let spec = job.parallel.overridden_by(flags);
        let framework = match (&self.framework, &job.framework) {
            (Some(f), _) => Some(f.clone()),
            (None, Some(f)) => Some(stepcast::hardware::framework_name(f).map_err(|e| {
                stepcast::Error::Invalid(format!(
                    "{}: framework: {e}",
                    self.job
                        .as_deref()
                        .unwrap_or(Path::new("job file"))
                        .display()
                ))
            })?),
            (None, None) => fallback.map(|f| f.name().to_string()),
        };
        // a framework export knows starts the layout from what it runs by default
        let implied = framework
            .as_deref()
            .and_then(|f| f.parse::<Framework>().ok())
            .map(|f| (f, f.implied(&spec)));
        let implied_note = implied
            .as_ref()
            .and_then(|(f, defaults)| implied_note(*f, defaults, &spec, spec.cp.unwrap_or(1) > 1));
        let spec = match &implied {
            Some((_, defaults)) => defaults.clone().overridden_by(spec),
            None => spec,
        };
        let mut cluster = Cluster::load(&cluster_path)?;
        if let Some(nodes) = self.nodes.or(job.nodes) {
            cluster = cluster.with_nodes(nodes)?;
        }
        let arch = Arch::resolve(&model)?;
        let mut layout = Layout::new(&spec, &arch, &cluster)?;
        let routing_path = self
            .moe_routing
            .clone()
            .or_else(|| job.moe_routing.as_ref().map(|p| job_dir.join(p)));
        if let Some(path) = &routing_path {
            let routing = stepcast::workload::ExpertRouting::load(path)?;
            layout = layout.with_routing(&routing, &arch)?;
        }
        let mut notes: Vec<String> = implied_note.into_iter().collect();
        if model.ends_with(".json") && spec.seq_len.is_none() {
            notes.push(format!(
                "seq-len {} is a training length, not the config's context window: give \
                 --seq-len for the length you train at",
                layout.seq_len
            ));
        }
        if arch.attention_softcap && arch.attention == AttentionImpl::Flash {
            notes.push(
                "the attention scores' soft cap runs inside the fused attention kernel and is \
                 not costed (unmeasured): give the model attention: unfused, as NeMo runs \
                 Gemma 2, to cost it as three passes over the scores"
                    .into(),
            );
        }
        let mut inputs: Vec<_> = self
            .job
            .iter()
            .map(|p| super::stamp::file("job", p))
            .collect();
        inputs.push(super::stamp::cluster(&cluster));
        inputs.push(super::stamp::architecture(&model));
        inputs.extend(
            routing_path
                .iter()
                .map(|p| super::stamp::file("moe routing", p)),
        );
        inputs.extend(framework.as_deref().map(super::stamp::framework));
        Ok(Job {
            cluster,
            arch,
            layout,
            inputs,
            notes,
            framework,
        })
    }
}

/// What a framework's defaults set that the job left open, as a note ("costed as torchtitan
/// runs by default: …"), or `None` when the job set all of it. `context_parallel`: the job
/// splits sequences (else the default exchange of keys and values is moot).
pub(super) fn implied_note(
    framework: Framework,
    defaults: &ParallelSpec,
    job: &ParallelSpec,
    context_parallel: bool,
) -> Option<String> {
    let mut used = Vec::new();
    if let (Some(ce), None) = (defaults.cross_entropy, job.cross_entropy) {
        used.push(format!("--cross-entropy {ce}"));
    }
    if let (Some(k), None) = (defaults.attention_kernel, job.attention_kernel) {
        used.push(format!("--attention-kernel {k}"));
    }
    if let (Some(e), None) = (defaults.elementwise, job.elementwise) {
        used.push(format!("--elementwise {e}"));
    }
    if let (Some(c), None, true) = (defaults.cp_comm, job.cp_comm, context_parallel) {
        used.push(format!("--cp-comm {c}"));
    }
    if let (Some(l), None) = (defaults.fp8_library, job.fp8_library) {
        used.push(format!("--fp8-library {l}"));
    }
    (!used.is_empty()).then(|| {
        format!(
            "costed as {framework} runs by default: {} (a flag of yours overrides each)",
            used.join(", ")
        )
    })
}

/// The models a prediction uses: `--models` or the cluster file's directory. A directory that
/// is named but holds no models is an error (a prediction from the roofline alone is only
/// made where no models directory is configured, and says so).
pub fn open_models(
    flag: Option<&Path>,
    cluster: &Cluster,
) -> anyhow::Result<Option<stepcast::regress::ModelSet>> {
    let (dir, named_by) = match (flag, &cluster.models_dir) {
        (Some(d), _) => (d, "--models".to_string()),
        (None, Some(d)) => (
            d.as_path(),
            format!("models.dir of {}", cluster.path.display()),
        ),
        (None, None) => {
            return match cluster.builtin_models {
                Some(name) => Ok(Some(stepcast::regress::ModelSet::builtin(name)?)),
                None => Ok(None),
            };
        }
    };
    let fix = || {
        format!(
            "train them with `stepcast train <dataset> --out {}`, give another with --models, \
             or remove `models:` from the cluster file to predict from the roofline alone",
            dir.display()
        )
    };
    opened(stepcast::regress::ModelSet::open(dir), dir, &named_by, fix).map(Some)
}

/// A models directory as opened, or its error with the advice that fits: `fix` (written only
/// on failure) for the models themselves, the calibration's own fix (in its message) for an
/// unusable `calibration.yaml`, which training the models again would not mend.
fn opened(
    set: stepcast::Result<stepcast::regress::ModelSet>,
    dir: &Path,
    named_by: &str,
    fix: impl FnOnce() -> String,
) -> anyhow::Result<stepcast::regress::ModelSet> {
    set.map_err(|e| {
        let context = match e {
            stepcast::Error::Calibration(_) => format!(
                "reading the calibration of models {} (named by {named_by})",
                dir.display()
            ),
            _ => format!(
                "opening models {} (named by {named_by}): {}",
                dir.display(),
                fix()
            ),
        };
        anyhow::Error::new(e).context(context)
    })
}

/// The models of other GPUs a cluster file names for the kernels its own models lack
/// (`models.transfer_from`), opened.
pub fn open_transfer(cluster: &Cluster) -> anyhow::Result<Vec<stepcast::regress::ModelSet>> {
    cluster
        .transfer_dirs
        .iter()
        .map(|d| {
            open_named(cluster, d, "transfer_from", || {
                "train them, or remove them from transfer_from".to_string()
            })
        })
        .collect()
}

/// The models a cluster file names for its collectives (`models.collectives_from`), opened.
pub fn open_collectives(cluster: &Cluster) -> anyhow::Result<Option<stepcast::regress::ModelSet>> {
    cluster
        .collectives_dir
        .as_deref()
        .map(|d| {
            open_named(cluster, d, "collectives_from", || {
                "train them from a `stepcast bench collect` of such a node, or remove \
                 collectives_from to cost the collectives from the analytic model"
                    .to_string()
            })
        })
        .transpose()
}

/// A models directory named by the cluster file's `models.<field>` (a built-in one for a
/// built-in cluster), opened.
fn open_named(
    cluster: &Cluster,
    dir: &Path,
    field: &str,
    fix: impl FnOnce() -> String,
) -> anyhow::Result<stepcast::regress::ModelSet> {
    let name = dir.to_string_lossy();
    let set = match name
        .strip_prefix("<built-in models/")
        .and_then(|n| n.strip_suffix('>'))
    {
        Some(builtin) => stepcast::regress::ModelSet::builtin(builtin),
        None => stepcast::regress::ModelSet::open(dir),
    };
    let named_by = format!("models.{field} of {}", cluster.path.display());
    opened(set, dir, &named_by, fix)
}

pub fn rules_name(r: Rules) -> &'static str {
    match r {
        Rules::Megatron => "Megatron",
        Rules::Paper => "paper",
    }
}

/// The two header lines every command prints for a job.
pub fn describe(job: &Job) -> String {
    let l = &job.layout;
    let chunks = if l.vpp > 1 {
        format!(", {} chunks per rank", l.vpp)
    } else {
        String::new()
    };
    // the degrees only some jobs have
    let mut extra = String::new();
    if l.cp > 1 {
        extra += &format!(" · cp {} ({})", l.cp, l.cp_comm);
    }
    if job.arch.moe.is_some() {
        extra += &match &l.routing_file {
            Some(file) => {
                let routed: Vec<f64> = (0u64..)
                    .zip(&l.layer_loads)
                    .filter(|(i, _)| job.arch.has_experts(*i))
                    .map(|(_, &f)| f)
                    .collect();
                let (low, high) = routed
                    .iter()
                    .fold((f64::MAX, 0.0f64), |(a, b), &f| (a.min(f), b.max(f)));
                let mean = routed.iter().sum::<f64>() / routed.len().max(1) as f64;
                format!(
                    " · ep {} (busiest rank's load {low:.2}–{high:.2}, mean {mean:.2}, from {})",
                    l.ep,
                    file.display()
                )
            }
            None => format!(" · ep {} (imbalance {})", l.ep, l.moe_imbalance),
        };
        if l.ep > 1 && !l.moe_dispatcher.is_alltoall() {
            extra += &format!(" over {}", l.moe_dispatcher);
        }
    }
    let notes: String = job
        .notes
        .iter()
        .map(|n| format!("\nnote     {n}"))
        .collect();
    let split = match (l.pipeline_split.embedding, l.pipeline_split.loss) {
        (true, true) => " (embedding and loss counted as layers)",
        (true, false) => " (embedding counted as a layer)",
        (false, true) => " (loss counted as a layer)",
        (false, false) => "",
    };
    let partition = match &l.pipeline_layout {
        Some(layout) => format!("pipeline layout \"{layout}\""),
        None => format!("{} partition{split}", l.partition),
    };
    let recompute = match &l.recompute_modules {
        Some(modules) => {
            let names: Vec<&str> = modules.iter().map(|m| m.name()).collect();
            format!("selective ({})", names.join(", "))
        }
        None => l.recompute.to_string(),
    };
    let fp8 = match (l.fp8_library, l.fp8_param_gather) {
        (Fp8Library::TransformerEngine, false) => "",
        (Fp8Library::TransformerEngine, true) => " (weights in fp8)",
        (Fp8Library::Torchao, false) => " (torchao)",
        (Fp8Library::Torchao, true) => " (torchao, weights gathered in fp8)",
    };
    // the gradient reduction type where it is not the training type's default
    let fp8 = if l.grad_reduce_dtype == stepcast::workload::default_grad_reduce_dtype(l.dtype) {
        fp8.to_string()
    } else {
        format!("{fp8}, gradients reduced in {}", l.grad_reduce_dtype)
    };
    let attention =
        fp8 + &match l.attention_kernel {
            AttentionKernel::Native => String::new(),
            kernel => format!(", attention by {kernel}"),
        } + match l.cross_entropy {
            CrossEntropy::VocabParallel => "",
            CrossEntropy::Pytorch => ", PyTorch's cross-entropy",
            CrossEntropy::Fused => ", fused cross-entropy",
        } + match l.elementwise {
            Elementwise::Fused => "",
            Elementwise::Eager => ", eager element-wise kernels",
        } + &cuda_graphs_note(&l.cuda_graphs);
    format!(
        "layout   tp {}{extra} · pp {} · dp {} = {}; micro-batch {} × {} per step = global batch {} × {} tokens\n\
         \x20        {}{attention}, recompute {recompute}, {partition} {:?}, ZeRO {}{}, schedule {}{chunks}{notes}",
        l.tp,
        l.pp,
        l.dp,
        super::output::count(l.world, "GPU", "GPUs"),
        l.micro_batch,
        l.micro_batches,
        l.global_batch,
        l.seq_len,
        l.dtype,
        l.stage_layers,
        l.zero,
        if l.sequence_parallel {
            ", sequence parallel"
        } else {
            ""
        },
        l.schedule.name(),
    )
}

/// The layout line's note on CUDA graphs ("" without).
fn cuda_graphs_note(scopes: &[CudaGraphScope]) -> String {
    if scopes.is_empty() {
        return String::new();
    }
    let names: Vec<&str> = scopes.iter().map(|s| s.name()).collect();
    format!(", CUDA graphs ({})", names.join(", "))
}

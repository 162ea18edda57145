//! The plan: a model under a parallel layout as the work each pipeline rank does — in one
//! representation that every composer, the memory projection and the reports read.
//!
//! A model is three repeated blocks (`layer`: one transformer layer; `embedding`; `head`: final
//! norm, LM head and loss), each the operator calls of one micro-batch's forward, backward and
//! recomputation on one tensor-parallel rank; a pipeline transfer (`send`); the model chunks
//! (virtual stages) in model order with the rank each runs on; and per pipeline rank
//! (`Stage`) the per-step work — data-parallel gradient reduction in buckets, the optimizer
//! step and, with a distributed optimizer, the parameter all-gather. A stage's forward and
//! backward are views over the blocks (`Plan::stage_fwd`, `Plan::stage_bwd`), never copies.
//!
//! Every distinct operator query is stored once (`Plan::queries`); calls refer to it by index,
//! so a prediction costs each query once and recomposes a step without hashing.

#![warn(missing_docs)]

mod buckets;
#[cfg(test)]
mod by_hand;
mod groups;
mod layer;
mod stage;

pub(crate) use layer::megatron_fuses_softmax;

use std::collections::HashMap;

use serde::Serialize;

pub use buckets::Buckets;
pub use groups::Groups;
pub use stage::StageRole;

use crate::hardware::Cluster;
use crate::ops::{CollectiveShape, Dtype, OpKind, OpQuery, Phase, Role, Shape};
use crate::timing::Class;
use crate::workload::{Arch, AttentionKernel, Layout, Rules};

/// Index of a query in `Plan::queries`.
pub type QueryId = u32;

/// `count` calls of one operator query.
#[derive(Debug, Clone, Serialize)]
pub struct Call {
    /// What the call is in the model ("qkv", "tp all-reduce", …).
    pub label: &'static str,
    /// The query it makes (an index into `Plan::queries`).
    pub query: QueryId,
    /// Calls per pass (or per step, for per-step work).
    pub count: f64,
    /// What its time counts as.
    pub class: Class,
    /// Runs on a communication stream beside the compute (FSDP parameter gathers): only the
    /// part longer than the compute is exposed.
    pub overlapped: bool,
    /// Started asynchronously before one kernel of the GEMM that follows it and waited for
    /// after it (Megatron's and Transformer Engine's column-parallel backward): up to that
    /// kernel's time hides it, with or without TP overlap (see `predict::compose::tp_hidden`).
    pub beside_kernel: bool,
    /// Before issuing this call the host waits for the device to finish everything issued
    /// so far: it needs a value the device computed (Megatron-Core's token dispatchers copy
    /// the tokens per expert to the host to size the all-to-all and the grouped GEMM). The
    /// host cannot run ahead across it, so the kernels after it start as the host issues them.
    pub host_waits: bool,
    /// How the host issues its kernels: one by one, or replayed inside a CUDA graph.
    #[serde(skip_serializing_if = "Issue::is_eager")]
    pub issue: Issue,
}

/// How the host issues a call's kernels.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Issue {
    /// Each kernel from eager PyTorch: the runtime's `launch_us` a kernel
    /// (`collective_launch_us` a collective).
    #[default]
    Eager,
    /// The first call of a part captured in a CUDA graph: the host replays the whole part
    /// with one graph launch, costed as one eager operator's issue (a Python call into the
    /// framework's graphed callable and one `cudaGraphLaunch`), once per block it runs in.
    GraphLaunch,
    /// Inside a captured part after its first call: the graph's launch issued it.
    InGraph,
}

impl Issue {
    /// The default, which plan records leave out.
    pub fn is_eager(&self) -> bool {
        *self == Issue::Eager
    }
}

/// A part of the model every rank that holds it runs once per micro-batch (per layer, for
/// the transformer layer).
#[derive(Debug, Clone, Serialize)]
pub struct Block {
    /// One micro-batch's forward.
    pub fwd: Vec<Call>,
    /// The backward, recomputation not included.
    pub bwd: Vec<Call>,
    /// What the backward recomputes first (empty without recomputation).
    pub recompute: Vec<Call>,
    /// Parameters on one rank that every data-parallel replica holds.
    pub params: u64,
    /// Parameter tensors (the optimizer's multi-tensor kernels launch per tensor).
    pub tensors: u64,
    /// Routed-expert parameters on one rank (reduced over the expert data-parallel group).
    pub expert_params: u64,
    /// Their tensors.
    pub expert_tensors: u64,
}

/// A mixture's layer whose router load differs from the layout's (a routing file's layers),
/// built once per distinct load.
#[derive(Debug, Clone, Serialize)]
pub struct LoadedLayer {
    /// The busiest expert-parallel rank's routed tokens over the mean, to 1 %.
    pub load: f64,
    /// The layer at that load.
    pub block: Block,
}

/// Routed layers that run a [`LoadedLayer`]: (its index in `Plan::loaded_layers`, layers).
pub type LoadedCounts = Vec<(usize, u64)>;

/// A model chunk (virtual stage): where it runs and what it holds.
#[derive(Debug, Clone, Serialize)]
pub struct Chunk {
    /// The pipeline rank it runs on.
    pub rank: usize,
    /// Index of its first transformer layer in the model.
    pub first_layer: u64,
    /// Transformer layers in the chunk.
    pub layers: u64,
    /// Of those, a mixture's dense layers (its first `dense_layers`; 0 for a dense model).
    pub dense_layers: u64,
    /// Of those, routed layers at another router load than the layout's.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub loaded: LoadedCounts,
    /// Multi-token-prediction modules it runs after the head (the last chunk's).
    pub mtp_layers: u64,
    /// Holds the embedding (the model's first chunk) / the head (its last).
    pub embedding: bool,
    /// Holds the head (the model's last chunk).
    pub head: bool,
    /// Sends its activations to the next chunk on another rank.
    pub sends_fwd: bool,
    /// Sends its input gradient to the previous chunk on another rank.
    pub sends_bwd: bool,
}

/// One pipeline rank: its share of the model and its per-step work.
#[derive(Debug, Clone, Serialize)]
pub struct Stage {
    /// Pipeline rank.
    pub index: usize,
    /// What it holds besides layers.
    pub role: StageRole,
    /// Transformer layers on the rank (all its chunks).
    pub layers: u64,
    /// Of those, a mixture's dense layers.
    pub dense_layers: u64,
    /// Of those, routed layers at another router load than the layout's.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub loaded: LoadedCounts,
    /// Multi-token-prediction modules on the rank.
    pub mtp_layers: u64,
    /// Parameters held by one GPU of the rank, routed experts not included.
    pub params: u64,
    /// Parameter tensors held.
    pub tensors: u64,
    /// Routed-expert parameters held by one GPU of the rank.
    pub expert_params: u64,
    /// Holds the embedding.
    pub embedding: bool,
    /// Holds the head.
    pub head: bool,
    /// Pipeline transfers per micro-batch leaving the rank, forward and backward.
    pub sends_fwd: u64,
    /// Pipeline transfers per micro-batch leaving the rank, backward.
    pub sends_bwd: u64,
    /// Per step: data-parallel gradient reduction.
    pub grad_sync: Vec<Call>,
    /// Per step: optimizer step and parameter all-gather.
    pub update: Vec<Call>,
}

/// A model under a layout, as the work of each rank.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    /// Every distinct operator query, each costed once.
    pub queries: Vec<OpQuery>,
    /// Each query's share of arithmetic in its roofline on the cluster's GPU
    /// (`roofline::compute_share`): how much sustained clocks slow it.
    #[serde(skip)]
    pub compute_share: Vec<f64>,
    /// The embedding lookup.
    pub embedding: Block,
    /// One transformer layer (with experts, in a mixture of experts).
    pub layer: Block,
    /// A mixture's dense layer (DeepSeek's first layers), when it has any.
    pub dense_layer: Option<Block>,
    /// A mixture's layer at each other router load a routing file gives (empty without one).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub loaded_layers: Vec<LoadedLayer>,
    /// Final norm, LM head and loss.
    pub head: Block,
    /// One multi-token-prediction module, when the layout trains any.
    pub mtp: Option<Block>,
    /// One activation (or gradient) transfer between neighbouring pipeline ranks.
    pub send: Option<Call>,
    /// Virtual stages in model order; chunk c of rank r is index c·pp + r.
    pub chunks: Vec<Chunk>,
    /// Per pipeline rank, its share of the model and per-step work.
    pub stages: Vec<Stage>,
    /// Parameters the rank's data-parallel buckets hold at most.
    pub bucket_elements: u64,
    /// Model FLOPs of one step (forward + backward, no recomputation; attention counted in
    /// full, as in Narayanan et al. 2021): the numerator of MFU.
    pub model_flops_per_step: f64,
}

/// `calls` each `times` times; none when `times` is 0: a block a stage does not run lists no
/// calls, since a composer reading the list would still stop the host at a listed host wait
/// and pair a collective started beside a kernel with a listed GEMM that never runs.
fn repeated(calls: &[Call], times: f64) -> impl Iterator<Item = (&Call, f64)> {
    calls[..if times > 0.0 { calls.len() } else { 0 }]
        .iter()
        .map(move |c| (c, times))
}

/// A part of an optional block (a mixture's dense layer, a multi-token-prediction module),
/// each call `times` times; nothing without the block.
fn optional<'a>(
    block: &'a Option<Block>,
    times: u64,
    part: impl Fn(&'a Block) -> &'a Vec<Call>,
) -> impl Iterator<Item = (&'a Call, f64)> + 'a {
    let calls: &[Call] = block.as_ref().map_or(&[], |b| part(b).as_slice());
    repeated(calls, times as f64)
}

/// `calls` once if `on`.
fn when(on: bool, calls: &[Call]) -> impl Iterator<Item = (&Call, f64)> {
    repeated(calls, f64::from(u8::from(on)))
}

impl Plan {
    /// Builds the plan of `arch` under `layout` on `cluster`.
    pub fn new(arch: &Arch, layout: &Layout, cluster: &Cluster) -> Plan {
        let groups = Groups::new(layout, cluster.spec.gpus_per_node as u64);
        let dims = layer::Dims::new(arch, layout, groups);
        let mut b = Builder {
            attention_role: (layout.attention_kernel == AttentionKernel::FlashAttention2)
                .then_some(Role::FlashAttention2),
            ..Builder::default()
        };
        let fsdp = layout.fsdp_per_layer();
        let embedding = layer::embedding_block(&mut b, arch, &dims);
        let layer_block = layer::layer_block(&mut b, arch, layout, &dims, fsdp, false);
        let dense_layer = (arch.moe.is_some() && arch.dense_layers() > 0)
            .then(|| layer::layer_block(&mut b, arch, layout, &dims, fsdp, true));
        let head = layer::head_block(&mut b, arch, &dims);
        let mtp = (layout.mtp_layers > 0)
            .then(|| layer::mtp_block(&mut b, arch, &dims, [&embedding, &layer_block, &head]));
        let send = (layout.pp > 1).then(|| {
            b.collective(
                "pp send/recv",
                OpKind::SendRecv,
                dims.send_bytes(),
                groups.pp,
                Class::PpComm,
            )
        });
        let mut chunks = stage::chunks(arch, layout);
        let loaded_layers = route_layers(&mut chunks, arch, layout, |load| {
            let dims = dims.at_load(load);
            layer::layer_block(&mut b, arch, layout, &dims, fsdp, false)
        });
        let blocks = stage::Blocks {
            embedding: &embedding,
            layer: &layer_block,
            dense_layer: dense_layer.as_ref(),
            head: &head,
            mtp: mtp.as_ref(),
        };
        let stages = stage::stages(&mut b, arch, layout, &chunks, &blocks, groups);
        let compute_share = b
            .queries
            .iter()
            .map(|q| crate::analytic::roofline::compute_share(q, &cluster.spec.gpu))
            .collect();
        Plan {
            compute_share,
            queries: b.queries,
            embedding,
            layer: layer_block,
            dense_layer,
            loaded_layers,
            head,
            mtp,
            send,
            chunks,
            stages,
            bucket_elements: layout.dp_bucket_elements,
            model_flops_per_step: model_flops(arch, layout),
        }
    }

    /// The query a call makes.
    pub fn query(&self, call: &Call) -> &OpQuery {
        &self.queries[call.query as usize]
    }

    /// Layers of `loaded` at their loads, each call of `part` of their block that many times.
    fn loaded<'a>(
        &'a self,
        loaded: &'a LoadedCounts,
        part: impl Fn(&'a Block) -> &'a Vec<Call> + 'a,
    ) -> impl Iterator<Item = (&'a Call, f64)> + 'a {
        loaded
            .iter()
            .flat_map(move |&(i, n)| repeated(part(&self.loaded_layers[i].block), n as f64))
    }

    /// One micro-batch's forward on a stage, all its chunks: each call with how many times
    /// it runs (its own count not included).
    pub fn stage_fwd<'a>(&'a self, s: &'a Stage) -> impl Iterator<Item = (&'a Call, f64)> + 'a {
        when(s.embedding, &self.embedding.fwd)
            .chain(optional(&self.dense_layer, s.dense_layers, |b| &b.fwd))
            .chain(repeated(&self.layer.fwd, s.layout_load_layers() as f64))
            .chain(self.loaded(&s.loaded, |b| &b.fwd))
            .chain(when(s.head, &self.head.fwd))
            .chain(optional(&self.mtp, s.mtp_layers, |b| &b.fwd))
            .chain(self.sends(s.sends_fwd))
    }

    /// One micro-batch's backward on a stage, recomputation included.
    pub fn stage_bwd<'a>(&'a self, s: &'a Stage) -> impl Iterator<Item = (&'a Call, f64)> + 'a {
        let experts = s.layout_load_layers() as f64;
        optional(&self.mtp, s.mtp_layers, |b| &b.bwd)
            .chain(optional(&self.mtp, s.mtp_layers, |b| &b.recompute))
            .chain(when(s.head, &self.head.bwd))
            .chain(repeated(&self.layer.bwd, experts))
            .chain(repeated(&self.layer.recompute, experts))
            .chain(self.loaded(&s.loaded, |b| &b.bwd))
            .chain(self.loaded(&s.loaded, |b| &b.recompute))
            .chain(optional(&self.dense_layer, s.dense_layers, |b| &b.bwd))
            .chain(optional(&self.dense_layer, s.dense_layers, |b| {
                &b.recompute
            }))
            .chain(when(s.embedding, &self.embedding.bwd))
            .chain(self.sends(s.sends_bwd))
    }

    fn sends(&self, n: u64) -> impl Iterator<Item = (&Call, f64)> {
        repeated(self.send.as_slice(), n as f64)
    }

    /// Pipeline ranks.
    pub fn pp(&self) -> usize {
        self.stages.len()
    }
}

/// Routed layers counted once per layer and load, for the plain layer's count.
fn loaded_layers(loaded: &LoadedCounts) -> u64 {
    loaded.iter().map(|&(_, n)| n).sum()
}

/// Adds `n` layers of loaded block `i` to `counts`.
fn count_loaded(counts: &mut LoadedCounts, i: usize, n: u64) {
    match counts.iter_mut().find(|(j, _)| *j == i) {
        Some((_, m)) => *m += n,
        None => counts.push((i, n)),
    }
}

impl Chunk {
    /// Routed (or dense-model) layers at the layout's load: `Plan::layer`'s.
    pub fn layout_load_layers(&self) -> u64 {
        self.layers - self.dense_layers - loaded_layers(&self.loaded)
    }
}

impl Stage {
    /// Routed (or dense-model) layers at the layout's load: `Plan::layer`'s.
    pub fn layout_load_layers(&self) -> u64 {
        self.layers - self.dense_layers - loaded_layers(&self.loaded)
    }
}

/// With a routing file's per-layer loads, each chunk's routed layers whose load (to 1 %)
/// differs from the layout's: one block per distinct load, built by `build`, the counts on
/// the chunks. Nothing without a routing file.
fn route_layers(
    chunks: &mut [Chunk],
    arch: &Arch,
    layout: &Layout,
    mut build: impl FnMut(f64) -> Block,
) -> Vec<LoadedLayer> {
    let mut loaded: Vec<LoadedLayer> = Vec::new();
    if layout.layer_loads.is_empty() {
        return loaded;
    }
    let to_percent = |f: f64| (f * 100.0).round() / 100.0;
    let plain = to_percent(layout.expert_load());
    for chunk in chunks {
        let layers = chunk.first_layer..chunk.first_layer + chunk.layers;
        for layer in layers.filter(|&l| arch.has_experts(l)) {
            let load = to_percent(layout.layer_load(layer));
            if load == plain {
                continue;
            }
            let i = match loaded.iter().position(|l| l.load == load) {
                Some(i) => i,
                None => {
                    loaded.push(LoadedLayer {
                        load,
                        block: build(load),
                    });
                    loaded.len() - 1
                }
            };
            count_loaded(&mut chunk.loaded, i, 1);
        }
    }
    loaded
}

/// Interns queries while the blocks are built.
#[derive(Default)]
struct Builder {
    index: HashMap<OpQuery, QueryId>,
    queries: Vec<OpQuery>,
    /// The role every fused-attention call takes: which kernel runs it (none: the kernel the
    /// models learned).
    attention_role: Option<Role>,
}

impl Builder {
    fn intern(&mut self, q: OpQuery) -> QueryId {
        *self.index.entry(q).or_insert_with(|| {
            self.queries.push(q);
            (self.queries.len() - 1) as QueryId
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn call(
        &mut self,
        label: &'static str,
        op: OpKind,
        phase: Phase,
        dtype: Dtype,
        role: Option<Role>,
        shape: Shape,
        class: Class,
    ) -> Call {
        let role = match op {
            OpKind::FlashAttention => role.or(self.attention_role),
            _ => role,
        };
        Call {
            label,
            query: self.intern(OpQuery {
                op,
                phase,
                dtype,
                role,
                shape,
            }),
            count: 1.0,
            class,
            overlapped: false,
            beside_kernel: false,
            host_waits: false,
            issue: Issue::Eager,
        }
    }

    /// A collective of `bytes` over a group spanning `(nodes, members per node)`.
    fn collective(
        &mut self,
        label: &'static str,
        op: OpKind,
        bytes: u64,
        (nodes, gpus_per_node): (u64, u64),
        class: Class,
    ) -> Call {
        let shape = Shape::Collective(CollectiveShape {
            bytes: bytes.max(1),
            nodes,
            gpus_per_node,
        });
        self.call(label, op, Phase::None, Dtype::Bf16, None, shape, class)
    }
}

/// Forward + backward matmul FLOPs of one step over the whole model: 3 × the forward (the
/// backward does twice the forward's work). A causal model's attention needs half the score
/// and context FLOPs (as MosaicML's and FlashAttention's accounting count it); the paper's
/// rules time attention without a mask and count it in full.
pub fn model_flops(arch: &Arch, layout: &Layout) -> f64 {
    let attention_share = if layout.rules == Rules::Paper {
        1.0
    } else {
        0.5
    };
    let (s, d) = (layout.seq_len as f64, arch.hidden as f64);
    let h = arch.heads as f64;
    // projections in, the score and context width of the core, the output projection's input
    let (projections, core, out) = match &arch.mla {
        Some(m) => {
            let q = h * m.qk_head_dim() as f64;
            let q_flops = match m.q_lora_rank {
                Some(r) => r as f64 * (d + q),
                None => d * q,
            };
            let kv = m.kv_lora_rank as f64;
            let kv_flops = d * (kv + m.qk_rope_head_dim as f64)
                + kv * h * (m.qk_nope_head_dim + m.v_head_dim) as f64;
            let core = h * (m.qk_head_dim() + m.v_head_dim) as f64 / 2.0;
            (
                2.0 * s * (q_flops + kv_flops),
                core,
                h * m.v_head_dim as f64,
            )
        }
        None => {
            let hd = (arch.heads * arch.head_dim) as f64;
            let kv = (arch.kv_heads * arch.head_dim) as f64;
            (2.0 * s * d * (hd + 2.0 * kv), hd, hd)
        }
    };
    // keys a query sees on average: half the sequence under a causal mask, in a sliding
    // window layer s·w − w²/2 over the sequence, in a chunked one half its own chunk's
    let global_keys = s * attention_share;
    let share = arch.local_attention_share();
    let keys = match arch.sliding_window.map(|w| w as f64).filter(|&w| w < s) {
        Some(c) if arch.chunked_attention => {
            let (whole, last) = ((s / c).floor(), s % c);
            let local = (whole * c * c + last * last) / s * attention_share;
            share * local + (1.0 - share) * global_keys
        }
        Some(w) => share * (w - w * w / (2.0 * s)) + (1.0 - share) * global_keys,
        None => global_keys,
    };
    let attention = projections
        + 4.0 * s * keys * core // scores and context
        + 2.0 * s * out * d; // output projection

    // the MLP work a token does: up (and gate) and down of `ffn`, and a router
    let mlp = |ffn: f64, router: f64| {
        let up = if arch.activation.is_gated() {
            2.0 * ffn
        } else {
            ffn
        };
        2.0 * s * d * up + 2.0 * s * ffn * d + router
    };
    let dense = mlp(arch.ffn_hidden as f64, 0.0);
    // a mixture's layers: its top-k experts, the shared experts and the router
    let sparse = arch.moe.map_or(dense, |m| {
        mlp(
            (m.top_k * m.expert_ffn + m.shared_ffn()) as f64,
            2.0 * s * d * m.experts as f64,
        )
    });
    let dense_layers = arch.dense_layers() as f64;
    let layers = arch.layers as f64;
    let per_model = attention * layers + dense * dense_layers + sparse * (layers - dense_layers);
    let head = 2.0 * s * d * arch.padded_vocab(1) as f64;
    // each multi-token-prediction module: its 2·hidden → hidden projection, one layer like the
    // model's last, and the head again
    let mtp = layout.mtp_layers as f64 * (2.0 * s * 2.0 * d * d + attention + sparse + head);
    3.0 * (per_model + head + mtp) * layout.global_batch as f64
}

#[cfg(test)]
mod tests {
    use super::by_hand::{lines, plan};
    use crate::workload::{Arch, ParallelSpec, Rules};

    /// Two sequences of 8,192 tokens a step, one on each of two data-parallel ranks.
    fn two_sequences(rules: Rules) -> ParallelSpec {
        ParallelSpec {
            tp: Some(1),
            dp: Some(2),
            micro_batch: Some(1),
            global_batch: Some(2),
            seq_len: Some(8192),
            rules: Some(rules),
            ..Default::default()
        }
    }

    /// A step's model FLOPs as 6 × tokens × the matmul parameters a token passes through
    /// (Llama 3 8B: 218,103,808 a layer, QKV 4,096 × 6,144, output 4,096², up 4,096 × 28,672,
    /// down 14,336 × 4,096; the head 4,096 × 128,256), plus the attention core's 3 × 4 × s ×
    /// keys × 4,096 a layer, a query seeing half the 8,192 keys under a causal mask and all
    /// of them under the paper's rules; × the global batch. Mixtral: the two experts a token
    /// runs and the router (4,096 × 8) instead of the dense MLP; sliding windows of 1,024:
    /// 960 keys a query.
    #[test]
    fn model_flops_count_what_a_token_passes_through() {
        let a = Arch::resolve("llama3-8b").unwrap();
        let s = 8192.0;
        let (layer, head) = (218_103_808.0, 4096.0 * 128_256.0);
        let core = |keys: f64| 32.0 * 3.0 * 4.0 * s * keys * 4096.0;
        let matmuls = 6.0 * s * (32.0 * layer + head);
        let flops = |p: &crate::plan::Plan| p.model_flops_per_step / 2.0;
        let megatron = plan(&a, two_sequences(Rules::Megatron));
        let close = |x: f64, y: f64| (x / y - 1.0).abs() < 1e-12;
        assert!(close(flops(&megatron), matmuls + core(4096.0)));
        let paper = plan(&a, two_sequences(Rules::Paper));
        assert!(close(flops(&paper), matmuls + core(8192.0)));

        let mixtral = crate::workload::presets::mixtral_8x7b();
        let p = plan(
            &mixtral,
            ParallelSpec {
                ep: Some(2),
                ..two_sequences(Rules::Megatron)
            },
        );
        // Mixtral's attention: 32 query and 8 key-value heads of 128, like Llama 3 8B's;
        // Llama 2's 32,000-entry vocabulary
        let attention = 4096.0 * 6144.0 + 4096.0 * 4096.0;
        let experts = 2.0 * (4096.0 * 28672.0 + 14336.0 * 4096.0) + 4096.0 * 8.0;
        let head = 4096.0 * 32000.0;
        let expected = 6.0 * s * (32.0 * (attention + experts) + head) + core(4096.0);
        assert!(close(flops(&p), expected), "{} {expected}", flops(&p));

        let mut windowed = a.clone();
        windowed.sliding_window = Some(1024);
        let p = plan(&windowed, two_sequences(Rules::Megatron));
        assert!(close(flops(&p), matmuls + core(960.0)));
    }

    /// The rest of the count, on Llama 3 8B's sizes at 8,192 tokens, one sequence (the step's
    /// two halved): latent attention (DeepSeek-V3's ranks) replaces the QKV projection's
    /// 25,165,824 parameters a token passes through with the query latent's 1,536 × (4,096 +
    /// 32 × 192) = 15,728,640 (4,096 × 6,144 without it) and the key-value latent's 4,096 ×
    /// (512 + 64) + 512 × 32 × (128 + 128) = 6,553,600; its core 32 heads of 192 score and 128
    /// context dimensions. Every fourth layer global, the others windows of 1,024: 3/4 × 960 +
    /// 1/4 × 4,096 = 1,744 keys a query; a window as long as the sequence is no window (all
    /// 8,192 keys under the paper's rules). Mixtral with one shared expert and two dense first
    /// layers: three experts' MLP a token on 30 layers, the dense MLP on 2. One
    /// multi-token-prediction module: its 8,192 × 4,096 projection, a layer and the head again.
    #[test]
    fn model_flops_of_latent_attention_windows_shared_experts_and_prediction() {
        use super::model_flops;
        use crate::workload::{Layout, MlaSpec};
        let llama = Arch::resolve("llama3-8b").unwrap();
        let c = crate::hardware::dgx_h100_without_models();
        let layout = |rules: Rules| Layout::new(&two_sequences(rules), &llama, &c).unwrap();
        let megatron = layout(Rules::Megatron);
        let s = 8192.0;
        let (qkv, out, mlp) = (25_165_824.0, 16_777_216.0, 176_160_768.0);
        let head = 4096.0 * 128_256.0;
        let core = |keys: f64, width: f64| 32.0 * 3.0 * 4.0 * s * keys * width;
        let per_sequence = |a: &Arch, l: &Layout| model_flops(a, l) / 2.0;
        let close = |x: f64, y: f64| (x / y - 1.0).abs() < 1e-12;

        let mut latent = llama.clone();
        latent.mla = Some(MlaSpec::deepseek_v3());
        let attention = 15_728_640.0 + 6_553_600.0 + out;
        let expected = 6.0 * s * (32.0 * (attention + mlp) + head) + core(4096.0, 32.0 * 160.0);
        assert!(close(per_sequence(&latent, &megatron), expected));
        latent.mla = Some(MlaSpec {
            q_lora_rank: None,
            ..MlaSpec::deepseek_v3()
        });
        let attention = 25_165_824.0 + 6_553_600.0 + out;
        let expected = 6.0 * s * (32.0 * (attention + mlp) + head) + core(4096.0, 32.0 * 160.0);
        assert!(close(per_sequence(&latent, &megatron), expected));

        let dense = 6.0 * s * (32.0 * (qkv + out + mlp) + head);
        let mut windowed = llama.clone();
        windowed.sliding_window = Some(1024);
        windowed.global_attention_every = Some(4);
        let expected = dense + core(1744.0, 4096.0);
        assert!(close(per_sequence(&windowed, &megatron), expected));
        // chunks of 3,000: two whole and one of 2,192, each query seeing half its chunk
        let mut chunked = windowed.clone();
        (chunked.sliding_window, chunked.chunked_attention) = (Some(3000), true);
        let keys = 0.75 * (2.0 * 3000.0 * 3000.0 + 2192.0 * 2192.0) / (2.0 * s) + 0.25 * 4096.0;
        assert!(close(
            per_sequence(&chunked, &megatron),
            dense + core(keys, 4096.0)
        ));
        windowed.sliding_window = Some(8192);
        let paper = layout(Rules::Paper);
        assert!(close(
            per_sequence(&windowed, &paper),
            dense + core(8192.0, 4096.0)
        ));

        let mut mixtral = crate::workload::presets::mixtral_8x7b();
        let m = mixtral.moe.as_mut().unwrap();
        (m.shared_experts, m.dense_layers) = (1, 2);
        let attention = 4096.0 * 6144.0 + out;
        let sparse = 3.0 * mlp + 4096.0 * 8.0;
        let matmuls = 32.0 * attention + 2.0 * mlp + 30.0 * sparse + 4096.0 * 32_000.0;
        let expected = 6.0 * s * matmuls + core(4096.0, 4096.0);
        assert!(close(per_sequence(&mixtral, &megatron), expected));

        let mut predicting = megatron.clone();
        predicting.mtp_layers = 1;
        let module = 8192.0 * 4096.0 + qkv + out + mlp + head;
        // the module's one layer's attention core: a 32nd of the model's
        let expected =
            dense + core(4096.0, 4096.0) + 6.0 * s * module + core(4096.0, 4096.0) / 32.0;
        assert!(close(per_sequence(&llama, &predicting), expected));
    }

    /// Under FlashAttention-2 (torchtitan's, MosaicML's) every fused-attention call, forward
    /// and backward, asks for that kernel's timing; nothing else changes its role.
    #[test]
    fn flash_attention_2_is_the_attention_calls_role_alone() {
        use crate::workload::AttentionKernel;
        let llama = Arch::resolve("llama3-8b").unwrap();
        let spec = |kernel: AttentionKernel| ParallelSpec {
            attention_kernel: Some(kernel),
            ..two_sequences(Rules::Megatron)
        };
        let flash2 = plan(&llama, spec(AttentionKernel::FlashAttention2));
        let native = plan(&llama, spec(AttentionKernel::Native));
        for (a, b) in [
            (&flash2.layer.fwd, &native.layer.fwd),
            (&flash2.layer.bwd, &native.layer.bwd),
        ] {
            let (a, b) = (lines(&flash2, a), lines(&native, b));
            let changed: Vec<(&String, &String)> =
                a.iter().zip(&b).filter(|(x, y)| x != y).collect();
            assert_eq!(a.len(), b.len());
            assert_eq!(changed.len(), 1, "{changed:?}");
            let (x, y) = changed[0];
            assert!(x.starts_with("attention: flash_attention "), "{x}");
            assert_eq!(*x, y.replace(" bf16 ", " bf16 (flash_attention_2) "));
        }
    }

    /// A plan written out (`plan --json`) names how a call is issued only where it is not
    /// the default, eager PyTorch.
    #[test]
    fn a_call_names_its_issue_only_when_graphed() {
        use super::Issue;
        let p = plan(
            &Arch::resolve("llama3-8b").unwrap(),
            two_sequences(Rules::Megatron),
        );
        let mut call = p.layer.fwd[0].clone();
        let json = |c: &super::Call| serde_json::to_value(c).unwrap();
        assert!(json(&call).get("issue").is_none());
        for (issue, name) in [
            (Issue::GraphLaunch, "graph_launch"),
            (Issue::InGraph, "in_graph"),
        ] {
            call.issue = issue;
            assert_eq!(json(&call)["issue"], name);
        }
    }

    /// Each call of a pass: its label, which call it is (its address in the plan's blocks),
    /// and how many times it runs.
    type Pass = Vec<(&'static str, *const super::Call, f64)>;

    fn pass<'a>(calls: impl Iterator<Item = (&'a super::Call, f64)>) -> Pass {
        calls.map(|(c, n)| (c.label, c as *const _, n)).collect()
    }

    /// `calls` each `n` times, as [`pass`] writes them.
    fn each(calls: &[super::Call], n: f64) -> Pass {
        calls.iter().map(|c| (c.label, c as *const _, n)).collect()
    }

    /// Llama 3 8B on two pipeline ranks, fully recomputed. The first rank's forward: the
    /// embedding, its 16 layers, one transfer to the next rank; the last rank's: its 16
    /// layers and the head. The backward runs them the other way, each layer's recomputation
    /// after the layers' backward calls (counts, not order of execution, matter to the
    /// composers), the last rank sending the input gradient back. On one rank: no transfer.
    #[test]
    fn a_stages_passes_run_its_blocks_in_model_order() {
        use crate::workload::Recompute;
        let llama = Arch::resolve("llama3-8b").unwrap();
        let spec = |pp: u64| ParallelSpec {
            tp: Some(1),
            pp: Some(pp),
            dp: Some(1),
            micro_batch: Some(1),
            global_batch: Some(8),
            recompute: Some(Recompute::Full),
            ..Default::default()
        };
        let p = plan(&llama, spec(2));
        assert_eq!(p.pp(), 2);
        assert!(!p.layer.recompute.is_empty());
        let send = std::slice::from_ref(p.send.as_ref().unwrap());
        let (first, last) = (&p.stages[0], &p.stages[1]);
        let fwd = [
            each(&p.embedding.fwd, 1.0),
            each(&p.layer.fwd, 16.0),
            each(send, 1.0),
        ];
        assert_eq!(pass(p.stage_fwd(first)), fwd.concat());
        let fwd = [each(&p.layer.fwd, 16.0), each(&p.head.fwd, 1.0)];
        assert_eq!(pass(p.stage_fwd(last)), fwd.concat());
        let bwd = [
            each(&p.head.bwd, 1.0),
            each(&p.layer.bwd, 16.0),
            each(&p.layer.recompute, 16.0),
            each(send, 1.0),
        ];
        assert_eq!(pass(p.stage_bwd(last)), bwd.concat());
        let bwd = [
            each(&p.layer.bwd, 16.0),
            each(&p.layer.recompute, 16.0),
            each(&p.embedding.bwd, 1.0),
        ];
        assert_eq!(pass(p.stage_bwd(first)), bwd.concat());

        let p = plan(&llama, spec(1));
        assert_eq!(p.pp(), 1);
        assert!(p.send.is_none());
        let fwd = [
            each(&p.embedding.fwd, 1.0),
            each(&p.layer.fwd, 32.0),
            each(&p.head.fwd, 1.0),
        ];
        assert_eq!(pass(p.stage_fwd(&p.stages[0])), fwd.concat());
    }

    /// Mixtral with a dense first layer and one prediction module on pp 2 with two chunks a
    /// rank (layers 0–7 and 16–23 on rank 0, 8–15 and 24–31 on rank 1), fully recomputed, its
    /// router 1.5× the mean but a routing file's loads: 3 on the dense layer 0 (no router:
    /// ignored), 2 on layers 1 and 2 (1.996 is 2 to 1 %) and 17, 1.504 on layer 3 (1.5 to 1 %:
    /// the plain layer), 2.5 on layers 9 and 20. Two loaded blocks, 2 then 2.5, in the order
    /// the chunks meet them: chunk 0 runs 2 of the first, chunk 1 one of the second, chunk 2
    /// one of each; rank 0 holds 3 of the first and 1 of the second and runs 16 − 1 dense − 4
    /// = 11 plain layers, rank 1 15. Rank 0 sends forward from both chunks and backward from
    /// its second; rank 1 forward from its first, backward from both.
    /// A mixture whose odd layers have experts (Llama 4's interleaving): each pipeline stage
    /// holds its own layers' dense MLPs, and a routing file's loads apply to the expert
    /// layers alone (its dense layers read 1, not a load of their own).
    #[test]
    fn interleaved_dense_layers_are_counted_where_they_fall() {
        use crate::workload::Layout;
        let mut a = crate::workload::presets::mixtral_8x7b();
        if let Some(m) = a.moe.as_mut() {
            (m.dense_layers, m.every, m.offset) = (3, 2, 1);
        }
        let spec = ParallelSpec {
            pp: Some(2),
            ep: Some(8),
            dp: Some(8),
            micro_batch: Some(1),
            global_batch: Some(16),
            moe_imbalance: Some(1.5),
            ..Default::default()
        };
        let c = crate::hardware::dgx_h100_without_models();
        let mut layout = Layout::new(&spec, &a, &c).unwrap();
        // experts in layers 4, 6, … 30: 6 of the first 16 layers and 8 of the last, the
        // other 10 and 8 dense
        let mut loads: Vec<f64> = (0..32)
            .map(|l| if a.has_experts(l) { 1.5 } else { 1.0 })
            .collect();
        (loads[4], loads[30]) = (2.0, 2.5);
        layout.layer_loads = loads;
        let p = super::Plan::new(&a, &layout, &c);
        let dense: Vec<u64> = p.chunks.iter().map(|c| c.dense_layers).collect();
        assert_eq!(dense, [10, 8]);
        let block_loads: Vec<f64> = p.loaded_layers.iter().map(|l| l.load).collect();
        assert_eq!(block_loads, [2.0, 2.5]);
        let loaded: Vec<_> = p.chunks.iter().map(|c| c.loaded.clone()).collect();
        assert_eq!(loaded, [vec![(0, 1)], vec![(1, 1)]]);
        let plain: Vec<u64> = p.stages.iter().map(|s| s.layout_load_layers()).collect();
        assert_eq!(plain, [5, 7]);
        let (layer, dense) = (&p.layer, p.dense_layer.as_ref().unwrap());
        let loaded = |i: usize| &p.loaded_layers[i].block;
        assert_eq!(
            p.stages[1].params,
            7 * layer.params + 8 * dense.params + loaded(1).params + p.head.params
        );
    }

    #[test]
    fn a_routing_files_loads_become_layers_of_their_own() {
        use crate::workload::{Layout, Recompute, Schedule};
        let mut a = crate::workload::presets::mixtral_8x7b();
        a.moe.as_mut().unwrap().dense_layers = 1;
        let spec = ParallelSpec {
            pp: Some(2),
            vpp: Some(2),
            schedule: Some(Schedule::Interleaved),
            ep: Some(8),
            dp: Some(8),
            micro_batch: Some(1),
            global_batch: Some(16),
            moe_imbalance: Some(1.5),
            mtp_layers: Some(1),
            recompute: Some(Recompute::Full),
            ..Default::default()
        };
        let c = crate::hardware::dgx_h100_without_models();
        let mut layout = Layout::new(&spec, &a, &c).unwrap();
        let mut loads = vec![1.5; 32];
        for (layer, load) in [(0, 3.0), (1, 2.0), (2, 1.996), (3, 1.504)] {
            loads[layer] = load;
        }
        for (layer, load) in [(9, 2.5), (17, 2.0), (20, 2.5)] {
            loads[layer] = load;
        }
        layout.layer_loads = loads;
        let p = super::Plan::new(&a, &layout, &c);

        let block_loads: Vec<f64> = p.loaded_layers.iter().map(|l| l.load).collect();
        assert_eq!(block_loads, [2.0, 2.5]);
        let chunks: Vec<_> = p
            .chunks
            .iter()
            .map(|c| (c.rank, c.loaded.clone()))
            .collect();
        assert_eq!(
            chunks,
            [
                (0, vec![(0, 2)]),
                (1, vec![(1, 1)]),
                (0, vec![(0, 1), (1, 1)]),
                (1, vec![])
            ]
        );
        let plain: Vec<u64> = p.chunks.iter().map(|c| c.layout_load_layers()).collect();
        assert_eq!(plain, [5, 7, 6, 8]);
        let (first, last) = (&p.stages[0], &p.stages[1]);
        assert_eq!(first.loaded, [(0, 3), (1, 1)]);
        assert_eq!(last.loaded, [(1, 1)]);
        assert_eq!(
            (first.layout_load_layers(), last.layout_load_layers()),
            (11, 15)
        );

        let dense = p.dense_layer.as_ref().unwrap();
        let mtp = p.mtp.as_ref().unwrap();
        let send = std::slice::from_ref(p.send.as_ref().unwrap());
        let [two, two_and_a_half] = [0, 1].map(|i| &p.loaded_layers[i].block);
        assert!(!dense.recompute.is_empty() && !mtp.recompute.is_empty());
        let fwd = [
            each(&p.embedding.fwd, 1.0),
            each(&dense.fwd, 1.0),
            each(&p.layer.fwd, 11.0),
            each(&two.fwd, 3.0),
            each(&two_and_a_half.fwd, 1.0),
            each(send, 2.0),
        ];
        assert_eq!(pass(p.stage_fwd(first)), fwd.concat());
        let fwd = [
            each(&p.layer.fwd, 15.0),
            each(&two_and_a_half.fwd, 1.0),
            each(&p.head.fwd, 1.0),
            each(&mtp.fwd, 1.0),
            each(send, 1.0),
        ];
        assert_eq!(pass(p.stage_fwd(last)), fwd.concat());
        let bwd = [
            each(&mtp.bwd, 1.0),
            each(&mtp.recompute, 1.0),
            each(&p.head.bwd, 1.0),
            each(&p.layer.bwd, 15.0),
            each(&p.layer.recompute, 15.0),
            each(&two_and_a_half.bwd, 1.0),
            each(&two_and_a_half.recompute, 1.0),
            each(send, 2.0),
        ];
        assert_eq!(pass(p.stage_bwd(last)), bwd.concat());
        let bwd = [
            each(&p.layer.bwd, 11.0),
            each(&p.layer.recompute, 11.0),
            each(&two.bwd, 3.0),
            each(&two_and_a_half.bwd, 1.0),
            each(&two.recompute, 3.0),
            each(&two_and_a_half.recompute, 1.0),
            each(&dense.bwd, 1.0),
            each(&dense.recompute, 1.0),
            each(&p.embedding.bwd, 1.0),
            each(send, 1.0),
        ];
        assert_eq!(pass(p.stage_bwd(first)), bwd.concat());
    }
}

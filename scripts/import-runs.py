#!/usr/bin/env python3
"""Converts the published end-to-end training runs under ../shared/reference-data into one
stepcast runs CSV (the input of `stepcast calibrate`; schema in the README, "Calibration"),
with an architecture file for every model that is not a preset. Nothing is copied verbatim:
each row is rebuilt from the source's columns, and the source file, commit and row are named.

Every row is written; rows stepcast cannot express say why (`expressible` false, `reason`).

Usage: import-runs.py REFERENCE_DATA_DIR OUT_DIR     (OUT_DIR must not exist)"""
import csv
import math
import re
import sys
from pathlib import Path

COLUMNS = ["set", "family", "label", "cluster", "model", "framework", "tp", "pp", "dp", "cp",
           "cp_comm", "attention_kernel", "cross_entropy", "elementwise", "ep", "etp", "moe_a2a_overlap", "moe_dispatcher", "pipeline_split",
           "pipeline_layout", "micro_batch", "global_batch", "seq_len", "dtype", "recompute",
           "recompute_modules", "zero", "schedule",
           "vpp", "sequence_parallel", "tp_comm_overlap", "overlap_grad_reduce", "grad_reduce_dtype",
           "fp8_param_gather",
           "fp8_library",
           "measured_step_s", "time_scope",
           "measured_memory_gib", "memory_scope", "expressible", "reason", "source"]


def num(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan


def present(x):
    return x == x and x is not None


class Out:
    def __init__(self, out):
        self.dir = out
        (out / "archs").mkdir(parents=True)
        self.rows = []
        self.archs = {}

    def arch(self, name, layers, hidden, heads, kv, ffn, vocab, norm, act, position, bias,
             norm_bias, seq, attention="flash", dropout=False, tied=False, extra=""):
        """An architecture file (relative to the runs CSV), written once per name."""
        text = (f"name: {name}\nlayers: {int(layers)}\nhidden: {int(hidden)}\nheads: {int(heads)}\n"
                f"kv_heads: {int(kv)}\nffn_hidden: {int(ffn)}\nvocab: {int(vocab)}\nnorm: {norm}\n"
                f"activation: {act}\nposition: {position}\nlinear_bias: {str(bias).lower()}\n"
                f"norm_bias: {str(norm_bias).lower()}\nseq_len: {int(seq)}\nattention: {attention}\n"
                f"dropout: {str(dropout).lower()}\ntied_embeddings: {str(tied).lower()}\n{extra}")
        prev = self.archs.get(name)
        assert prev is None or prev == text, f"two architectures named {name}"
        if prev is None:
            (self.dir / "archs" / f"{name}.yaml").write_text(text)
            self.archs[name] = text
        return f"archs/{name}.yaml"

    def add(self, **row):
        row.setdefault("expressible", "true" if not row.get("reason") else "false")
        row.setdefault("reason", "")
        for key in COLUMNS:
            row.setdefault(key, "")
        for key, value in list(row.items()):
            if isinstance(value, bool):
                row[key] = str(value).lower()
            elif (isinstance(value, float) and value.is_integer()
                  and key not in ("measured_step_s", "measured_memory_gib")):
                row[key] = int(value)
        self.rows.append(row)

    def write(self):
        with open(self.dir / "runs.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS)
            w.writeheader()
            for r in self.rows:
                w.writerow({k: r[k] for k in COLUMNS})


def vtrain(ref, out):
    """vTrain: Megatron-DeepSpeed GPT on one 8 × A100 node, full recompute, fp16 (assumed)."""
    src = ref / "vtrain-a100-single-node" / "ground_truth_single.csv"
    for i, row in enumerate(csv.reader(open(src, encoding="utf-8-sig"))):
        if i == 0:
            continue
        gpus, gb, mb, h, heads, layers, seq, tp, dp, pp, ms = row
        # GPT-2 style as vTrain's validation configs build it: 4·h GELU MLP, LayerNorm, learned
        # positions, biases, tied embeddings, dropout 0.1, Megatron's fused softmax attention.
        # The vocabulary as vTrain's model (src/model/gpt_model.py @ f8dda84) builds it:
        # GPT-2's 50,257 unpadded, vocab_size // tp rows per rank — odd at tp 1 (the head's
        # GEMMs unaligned), 25,128 at tp 2; written as 50,256 with no padding for tp > 1.
        vocab = 50257 // int(tp) * int(tp)
        name = f"vtrain-gpt-h{h}-l{layers}"
        arch = name + ("" if vocab == 50257 else f"-v{vocab}")
        model = out.arch(arch, layers, h, heads, heads, 4 * int(h), vocab, "layernorm", "gelu",
                         "learned", True, True, seq, attention="unfused", dropout=True, tied=True,
                         extra="vocab_divisible_by: 1\n")
        out.add(set="vtrain", family=f"gpt-h{h}", label=f"{name} {gpus} GPUs tp{tp} pp{pp} dp{dp} "
                f"mbs{mb} gbs{gb}", cluster="dgx-a100", model=model, framework="deepspeed",
                tp=tp, pp=pp, dp=dp, cp=1, micro_batch=mb, global_batch=gb, seq_len=seq,
                dtype="fp16", recompute="full", zero=0, schedule="1f1b", vpp=1,
                sequence_parallel=False, tp_comm_overlap=0,
                # vTrain's validation configs say use_gradient_bucket false; costing the
                # gradient all-reduce after the backward (overlap_grad_reduce false) fits its
                # steps worse (cross-validated 7.2 → 7.7 %), so it is left at the default
                measured_step_s=float(ms) / 1e3,
                source=f"vtrain ground_truth_single.csv row {i}")


def device_memory(text):
    """FlagPerf's memory column, 'used/total' GiB as its harness prints the device's memory
    (everything on the GPU): the used figure, or nothing where it is not stated."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*/\s*[0-9.]+\s*", text or "")
    return {"measured_memory_gib": float(m.group(1)), "memory_scope": "device"} if m else {}


def flagperf(ref, out):
    src = ref / "flagperf-nvidia-megatron" / "flagperf_runs.csv"
    for i, row in enumerate(csv.DictReader(open(src)), start=1):
        gpu, model = row["gpu"], row["model"]
        cluster = {"A100 (80GB)": "dgx-a100", "H100": "dgx-h100"}.get(gpu)
        reason = ""
        if cluster is None:
            reason = f"{gpu}: no cluster file (export variant with reduced NVLink, or not stated)"
        elif not model.startswith("Llama 3"):
            reason = f"{model}: dimensions not stated"
        elif row["precision"] not in ("bf16", "bf16+fp8"):
            reason = f"precision {row['precision']}"
        elif num(row["derived_step_time_s"]) != num(row["derived_step_time_s"]):
            reason = "no step time"
        elif int(row["n_gpus"]) > 64:
            reason = "marked reference only (GBS / tokens ambiguous)"
        fam = "llama3-8b" if "8B" in model else "llama3-70b"
        n, tp, pp = int(row["n_gpus"]), int(row["tp"] or 1), int(row["pp"] or 1)
        out.add(set="flagperf", family=fam, label=f"{model} {gpu} {n} GPUs tp{tp} pp{pp} dp{row['dp']} "
                f"{row['precision']}", cluster=cluster or "", model=fam, framework="megatron",
                # FlagPerf's Llama 3 script runs Megatron-Core with TE and flash-attn (SOURCE.md):
                # the flash-attn 2 package's kernels
                attention_kernel="flash-attention-2",
                tp=tp, pp=pp, dp=n // (tp * pp), cp=1, micro_batch=row["mbs"] or 1,
                global_batch=row["global_batch_size"], seq_len=row["seq_len"],
                dtype="fp8" if "fp8" in row["precision"] else "bf16", recompute="none", zero=1,
                schedule="1f1b", vpp=1, sequence_parallel=tp > 1, tp_comm_overlap=0,
                measured_step_s=num(row["derived_step_time_s"]), reason=reason,
                **device_memory(row["mem"]), source=f"flagperf_runs.csv row {i}")


# NVIDIA's performance recipes keep and reduce gradients in bf16: NeMo 2.0's performance mode
# and its performance scripts set `trainer.plugins.grad_reduce_in_fp32 = False` (its
# `bf16_mixed` default is True); read in NeMo's recipes, assumed for the NeMo 1.0 yamls of
# DGX Cloud's first versions and for Megatron-Bridge's tables, whose settings were not read
NVIDIA_PERFORMANCE_GRAD_REDUCE = "bf16"
# and their fp8 keeps the weights in fp8, gathered in fp8: NeMo 2.0's `bf16_with_fp8_mixed`
# sets `fp8_param_gather = True` (read in NeMo's recipes), DGX Cloud's v24.11 Llama 3.1
# `configure.sh` sets `fp8_params` with fp8 (its SOURCE.md); assumed for the other NeMo rows


def dgxc(ref, out):
    src = ref / "nvidia-dgxc-benchmarking-h100" / "dgxc_h100_step_times.csv"
    for i, row in enumerate(csv.DictReader(open(src)), start=1):
        model = row["model"]
        cp, vp = num(row["cp"]), num(row["vp"])
        tp, pp, n = int(row["tp"] or 1), int(row["pp"] or 1), int(row["n_gpus"])
        # Llama 3.1 is Llama 3's architecture (longer RoPE context only): one family with the
        # NeMo, FlagPerf and torchtitan rows of the same model, so the grouped cross-validation
        # holds the architecture out of every set at once
        fam = model.replace("llama3.1-", "llama3-")
        reason = ""
        if row["framework"].startswith("MaxText"):
            reason = "MaxText (JAX/XLA) with a custom remat policy: not modelled"
        cpv = int(cp) if present(cp) else 1
        swiglu = row["mlp"] == "swiglu"
        name = model.replace(".", "_")
        # Nemotron-4 uses squared-ReLU (not gated, costed as GELU) with LayerNorm; Llama 3.1
        # SwiGLU with RMSNorm
        act = "swiglu" if swiglu else "gelu"
        norm = "rmsnorm" if swiglu else "layernorm"
        arch = ""
        if not row["num_layers"] or not row["hidden_size"]:
            reason = reason or "model dimensions not stated"
        else:
            arch = out.arch(f"{name}-l{row['num_layers']}-s{row['seq_len']}", row["num_layers"],
                            row["hidden_size"], row["num_attention_heads"], row["num_query_groups"],
                            row["ffn_hidden_size"], row["vocab_size"] or 256000, norm, act, "rope",
                            False, norm == "layernorm", row["seq_len"])
        # TP communication overlap (userbuffers) is on for 70B / 15B in the v24.11 yamls; the
        # NeMo 2.0 perf scripts turn it on for every TP > 1 recipe
        overlap = tp > 1 and "8b" not in model
        dp = n // (tp * pp * cpv)
        out.add(set="dgxc", family=fam, label=f"{model} {row['precision']} {n} GPUs tp{tp} pp{pp} cp{cpv}"
                f"{' vp' + str(int(vp)) if present(vp) and vp > 1 else ''} dp{dp} mbs{row['mbs']} "
                f"gbs{row['gbs']} ({row['gsw_version']})", cluster="dgx-h100", model=arch,
                framework="megatron", tp=tp, pp=pp, dp=dp, cp=cpv, micro_batch=row["mbs"],
                global_batch=row["gbs"], seq_len=row["seq_len"],
                dtype="fp8" if row["precision"] == "FP8" else "bf16",
                recompute="selective" if row["recompute"].startswith("selective") else "none",
                zero=1, schedule="interleaved" if present(vp) and vp > 1 else "1f1b",
                vpp=int(vp) if present(vp) and vp > 1 else 1,
                sequence_parallel=tp > 1, tp_comm_overlap=1 if overlap else 0,
                grad_reduce_dtype=NVIDIA_PERFORMANCE_GRAD_REDUCE,
                fp8_param_gather=row["precision"] == "FP8",
                measured_step_s=float(row["step_time_s"]), reason=reason,
                source=f"dgxc_h100_step_times.csv row {i}")


NEMO_PRESETS = {"LLAMA2-7B": "llama2-7b", "LLAMA2-13B": "llama2-13b", "LLAMA2-70B": "llama2-70b",
                "LLAMA3-8B": "llama3-8b", "LLAMA3_8B": "llama3-8b", "LLAMA3-70B": "llama3-70b",
                "LLAMA3_70B": "llama3-70b", "LLAMA3.1_405B": "llama3-405b", "GPT3-175B": "gpt3-175b"}
MOE = ("Qwen3", "DeepSeek", "GPT OSS", "Nemotron_3", "Mixtral")
# mixtures of experts stepcast expresses, from their published Hugging Face config.json
# (Qwen/Qwen3-30B-A3B: every layer sparse, 128 experts, top-8, no shared expert, QK norm)
MOE_ARCHS = {"Qwen3_30B_a3B": dict(layers=48, hidden=2048, heads=32, kv=4, ffn=6144, vocab=151936,
                                   extra="head_dim: 128\nqk_norm: true\nmoe: {experts: 128, "
                                         "top_k: 8, expert_ffn: 768}\n"),
             # Qwen/Qwen3-235B-A22B: 94 layers, 128 experts of 1,536, top-8, QK norm
             "Qwen3_235B_a22B": dict(layers=94, hidden=4096, heads=64, kv=4, ffn=12288, vocab=151936,
                                     extra="head_dim: 128\nqk_norm: true\nmoe: {experts: 128, "
                                           "top_k: 8, expert_ffn: 1536}\n"),
             # openai/gpt-oss-120b: 128 experts of 2,880, top-4, every second layer global, the
             # others a 128-token window (attention sinks not modelled); a bias on every linear
             # layer, the experts' too, as Megatron-Bridge builds it (GPTOSSProvider
             # add_bias_linear: True; its resolved H100 configuration, scripts/performance/
             # dryrun_configs/gpt_oss/gpt_oss_120b_pretrain_h100_fp8_mx_v1.yaml at a9497c6)
             "GPT OSS 120B": dict(layers=36, hidden=2880, heads=64, kv=8, ffn=2880, vocab=201088,
                                  bias=True,
                                  extra="head_dim: 64\nsliding_window: 128\n"
                                        "global_attention_every: 2\nmoe: {experts: 128, "
                                        "top_k: 4, expert_ffn: 2880}\n"),
             # deepseek-ai/DeepSeek-V3: latent attention, 3 dense layers, 256 experts of 2,048,
             # top-8 from 4 of 8 groups, one shared expert
             "DeepSeekV3 (dropless)": dict(
                 layers=61, hidden=7168, heads=128, kv=128, ffn=18432, vocab=129280,
                 extra="mla: {q_lora_rank: 1536, kv_lora_rank: 512, qk_nope_head_dim: 128, "
                       "qk_rope_head_dim: 64, v_head_dim: 128}\nmoe: {experts: 256, top_k: 8, "
                       "expert_ffn: 2048, shared_experts: 1, dense_layers: 3, groups: 8, "
                       "topk_groups: 4}\n")}
# Megatron-Bridge's H100 presets (scripts/performance/configs/qwen): expert tensor parallelism 1,
# and for the 235B model the expert all-to-all overlapped and the embedding and loss counted as
# pipeline layers (qwen3_235b_a22b_pretrain_config)
# (the 30B preset dispatches with the flex dispatcher's HybridEP backend; the 235B one sets
# the NCCL all-to-all)
MOE_RECIPES = {"Qwen3_30B_a3B": dict(etp=1, a2a=False, split="", dispatcher="hybridep"),
               "Qwen3_235B_a22B": dict(etp=1, a2a=True, split="embedding+loss"),
               # (configs/gpt_oss): layernorm and expert activation recomputed
               "GPT OSS 120B": dict(etp=1, a2a=False, split="", recompute="layernorm+moe_act"),
               # (scripts/performance/configs/deepseek): the layer layout with the prediction
               # module beside the loss, MLA up-projections and dense MLPs recomputed, HybridEP
               "DeepSeekV3 (dropless)": dict(etp=1, a2a=False, split="",
                                             layout="Et|(tt|)*30mL", recompute="mla_up_proj+mlp",
                                             dispatcher="hybridep")}


def nemo(ref, out):
    src = ref / "nemo-megatron-bridge-perf-summary"
    dims = {}
    for row in csv.DictReader(open(src / "model_dims.csv")):
        for name in row["model_name_in_table"].split(" / "):
            dims[name.strip()] = row
    for i, row in enumerate(csv.DictReader(open(src / "perf_summary_rows.csv")), start=1):
        model = row["model"]
        if row["system"] != "DGX-H100":
            continue  # other GPUs: no cluster file, not counted
        vp, cp, ep, fsdp = num(row["vp"]), num(row["cp"]), num(row["ep"]), num(row["fsdp"])
        reason = ""
        if row["variant"] != "primary":
            reason = "alternative value in parentheses"
        elif "tokendrop" in model:
            # stepcast costs a capacity factor (--moe-capacity-factor), but the summary does
            # not state the one these runs used
            reason = "mixture of experts with token dropping at a capacity factor the summary " \
                     "does not state"
        elif model in MOE_ARCHS:
            pass
        elif any(m in model for m in MOE) or (present(ep) and ep > 1):
            reason = "mixture of experts of an architecture not modelled (Nemotron 3's hybrid " \
                     "Mamba layers) or not described"
        elif row["section"] != "pretrain":
            reason = f"{row['section']} {row['task']} (fine-tuning: not modelled)"
        elif model not in NEMO_PRESETS and model not in dims:
            reason = "architecture not described"
        if model in NEMO_PRESETS:
            arch = NEMO_PRESETS[model]
        elif model in MOE_ARCHS:
            m = MOE_ARCHS[model]
            arch = out.arch(re.sub(r"[^a-z0-9_]+", "_", model.lower()).strip("_"), m["layers"], m["hidden"], m["heads"], m["kv"], m["ffn"],
                            m["vocab"], "rmsnorm", "swiglu", "rope", m.get("bias", False), False,
                            row["seq_len"], extra=m["extra"])
        elif model in dims:
            d = dims[model]
            act = "swiglu" if d["gated_mlp"] == "true" else "gelu"
            norm = "rmsnorm" if d["normalization"] == "RMSNorm" else "layernorm"
            vocab = int(d["vocab_size"]) if d["vocab_size"] else 50257
            arch = out.arch(model.replace(".", "_"), d["num_layers"], d["hidden_size"],
                            d["num_attention_heads"], d["num_query_groups"], d["ffn_hidden_size"],
                            vocab, norm, act, "rope", False, norm == "layernorm", row["seq_len"])
        else:
            arch = ""
        tp, pp, n = int(row["tp"] or 1), int(row["pp"] or 1), int(row["n_gpus"])
        cpv = int(cp) if present(cp) else 1
        epv = int(ep) if present(ep) else 1
        dp = n // (tp * pp * cpv)
        precision = row["precision"] or "FP8"
        # Megatron-Bridge's Llama 3.1 405B recipe counts the embedding and the loss as layers
        # (account_for_{embedding,loss}_in_pipeline_split): 126 + 2 layers over pp·vp chunks
        split = "embedding+loss" if model == "LLAMA3.1_405B" else ""
        recipe = MOE_RECIPES.get(model, {})
        split = recipe.get("split", split)
        # the experts are held out of the calibration (a family it never saw): their own set;
        # so is NeMo 24.07's table (2024 software): 15 % slower than DGX Cloud's v24.11 at the
        # same Llama 3 8B layout, 7 % on average under one costing, where Megatron-Bridge's
        # tables (2025-26) agree with DGX Cloud's
        dense_set = "nemo-24.07" if row["container"] == "NeMo 24.07" else "nemo"
        # Megatron-Bridge's performance runs compute the loss with Transformer Engine's fused
        # cross-entropy: its resolved H100 benchmark configs set cross_entropy_loss_fusion true
        # and cross_entropy_fusion_impl te (NVIDIA-NeMo/Megatron-Bridge
        # scripts/performance/dryrun_configs/deepseek/deepseek_v3_pretrain_h100_fp8_sc_v1.yaml
        # at a9497c6; its performance recipes' _benchmark_common defaults cross_entropy_impl to
        # "te"); read at a later commit than the tables' oldest rows. NeMo 24.07's table
        # predates Megatron-Bridge: the unfused vocabulary-parallel loss, the default
        bridge = row["container"] != "NeMo 24.07"
        out.add(set="nemo-moe" if model in MOE_ARCHS else dense_set,
                family=arch if not arch.startswith("archs/") else model.lower(),
                label=f"{row['container']} {model} {n} GPUs tp{tp} pp{pp} cp{cpv}{' ep' + str(epv) if epv > 1 else ''}"
                f"{' vp' + str(int(vp)) if present(vp) and vp > 1 else ''} dp{dp} mbs{row['mbs']} "
                f"gbs{row['gbs']} {precision}", cluster="dgx-h100", model=arch, framework="megatron",
                tp=tp, pp=pp, dp=dp, cp=cpv, ep=epv, micro_batch=row["mbs"], global_batch=row["gbs"],
                seq_len=row["seq_len"], dtype="fp8" if precision.startswith("FP8") else "bf16",
                recompute="selective" if recipe.get("recompute") else "none",
                recompute_modules=recipe.get("recompute", ""),
                zero=3 if present(fsdp) and fsdp > 0 else 1,
                schedule="interleaved" if present(vp) and vp > 1 else "1f1b",
                vpp=int(vp) if present(vp) and vp > 1 else 1, pipeline_split=split,
                pipeline_layout=recipe.get("layout", ""),
                moe_dispatcher=recipe.get("dispatcher", ""),
                etp=recipe.get("etp", ""), moe_a2a_overlap=recipe.get("a2a", False),
                sequence_parallel=tp > 1, grad_reduce_dtype=NVIDIA_PERFORMANCE_GRAD_REDUCE,
                fp8_param_gather=precision.startswith("FP8"),
                tp_comm_overlap=1 if tp > 1 else 0, measured_step_s=num(row["derived_step_time_s"]),
                cross_entropy="fused" if bridge else "",
                reason=reason, source=f"perf_summary_rows.csv row {i}")


def torchtitan(ref, out):
    src = ref / "torchtitan-llama3-benchmarks" / "torchtitan_runs.csv"
    for i, row in enumerate(csv.DictReader(open(src)), start=1):
        gpu, model = row["gpu"], row["model"]
        reason = ""
        if gpu.startswith("H100"):
            # Grand Teton hosts: 96 GB HBM2e, 500 W
            cluster = "grand-teton-h100"
        elif gpu.startswith("A100"):
            cluster = "dgx-a100"
        elif gpu.startswith("H200"):
            # WhiteFiber hosts: 8 H200 SXM on NVLink, a 400 Gb/s ConnectX-7 NIC per GPU, as a
            # DGX H200 (NVLink 4 + NVSwitch on an HGX H200 board: the page does not say, an
            # assumption)
            cluster = "dgx-h200"
        else:
            cluster, reason = "", f"{gpu}: no cluster file"
        cp = int(row["cp"] or 1)
        if not reason and row["float8"] not in ("no", "yes", "tensorwise", "yes (FSDP float8 all-gather)"):
            reason = f"float8 {row['float8']} (row-wise scaling: not modelled)"
        name = model.replace(" ", "-").replace(".", "_").lower()
        arch = out.arch(f"torchtitan-{name}-s{row['seq_len']}", row["num_layers"], row["hidden_size"],
                        row["num_attention_heads"], row["num_kv_heads"], row["ffn_hidden_size"],
                        row["vocab_size"], "rmsnorm", "swiglu", "rope", False, False, row["seq_len"])
        fsdp, tp, pp = int(row["fsdp"]), int(row["tp"]), int(row["pp"])
        sched = row["pp_schedule"]
        ac = row["activation_checkpointing"]
        # torchtitan's "selective" is op-level at the benchmarks' tomls (selective_ac_option =
        # "op"); "selective layer" checkpoints every other layer whole (selective_ac_option =
        # "2", the layer-level choice its docs and tomls name)
        recompute = ("full" if ac.startswith("full") else "selective-layer" if ac.startswith("selective layer")
                     else "selective-op" if ac.startswith("selective") else "none")
        local = int(row["local_batch_size"])
        # with a pipeline the local batch is split into as many micro-batches as there are
        # pipeline ranks: the benchmarks' code (9dec370, Dec 2024) defaults
        # experimental.pipeline_parallel_microbatches to the pp degree (later torchtitan
        # defaults to micro-batches of 1 instead)
        if pp == 1:
            mb = local
        else:
            mb = local // pp if local % pp == 0 else 1
        vpp = 2 if "Interleaved" in sched else 1
        # torchtitan weighs the embedding and the output as one layer each when it splits the
        # layers over stages (generate_llm_fqn_per_model_part, input/output weight 1); where the
        # layers alone split evenly, or over pp stages only, stepcast's uniform split is the same
        split = "embedding+loss" if pp > 1 and int(row["num_layers"]) % (pp * vpp) else ""
        out.add(set="torchtitan", family=name.replace("llama-3_1-", "llama3-").replace("llama-3-", "llama3-"),
                label=f"{model} {gpu[:16]} {row['n_gpus']} GPUs fsdp{fsdp} tp{tp} pp{pp} cp{cp} "
                f"{row['precision']} compile {row['torch_compile']} asyncTP {row['async_tp']}",
                cluster=cluster, model=arch, framework="torchtitan", tp=tp, pp=pp, dp=fsdp, cp=cp,
                # torchtitan's default context_parallel_rotate_method
                cp_comm="all-gather",
                # its attention is PyTorch SDPA, whose flash backend is FlashAttention-2 (the
                # benchmark pages do not name the backend: an assumption)
                attention_kernel="flash-attention-2",
                # its loss is PyTorch's cross_entropy on the fp32 logits (train.py at 9dec370)
                cross_entropy="pytorch",
                # without torch.compile its model code runs eagerly: the tomls' norm_type
                # "rmsnorm" is PyTorch operations (models/norms.py), as are its RoPE and SwiGLU
                elementwise="fused" if row["torch_compile"].startswith("yes") else "eager",
                micro_batch=mb, global_batch=row["global_batch_size"], seq_len=row["seq_len"],
                dtype="bf16" if row["precision"] == "BF16" else "fp8", recompute=recompute, zero=3,
                # torchtitan's float8 is torchao's
                fp8_library="" if row["precision"] == "BF16" else "torchao",
                schedule="interleaved" if "Interleaved" in sched else "1f1b",
                vpp=vpp, pipeline_split=split, sequence_parallel=tp > 1,
                tp_comm_overlap=1 if row["async_tp"] == "yes" else 0,
                measured_step_s=float(row["derived_step_time_s"]), reason=reason,
                # torchtitan prints torch.cuda.max_memory_reserved: the caching allocator's peak
                **({"measured_memory_gib": num(row["memory_gib"]), "memory_scope": "allocator"}
                   if present(num(row["memory_gib"])) else {}),
                source=f"torchtitan_runs.csv row {i}")


def neusight(ref, out):
    import json
    src = ref / "neusight"
    for i, row in enumerate(csv.DictReader(open(src / "e2e_labels_h100.csv")), start=1):
        if row["mode"] != "train":
            continue
        model = row["model"]
        cfg = json.load(open(src / "model_configs" / f"{model}.json"))
        reason = ""
        if model in ("bert_large", "switchxl4"):
            reason = "not a decoder-only language model (encoder / mixture of experts)"
        par = row["parallel"]
        tp = 4 if par == "tp4" else 1
        pp = 4 if par.startswith("pp4") else 1
        dp = 4 if par == "dp4" else 1
        gb = int(row["global_batch"])
        # pp4_1: a four-stage pipeline with one micro-batch (the whole batch)
        mb = gb // dp if pp == 1 else gb
        layers = cfg.get("n_layer") or cfg.get("num_hidden_layers") or 0
        hidden = cfg.get("n_embd") or cfg.get("hidden_size") or 0
        heads = cfg.get("n_head") or cfg.get("num_attention_heads") or 0
        ffn = cfg.get("n_inner") or cfg.get("ffn_dim") or 4 * hidden
        vocab = cfg.get("vocab_size") or 50257
        arch = ""
        if not reason:
            arch = out.arch(f"neusight-{model}", layers, hidden, heads, heads, ffn, vocab,
                            "layernorm", "gelu", "learned", True, True, row["seq_len"],
                            attention="unfused", dropout=True, tied=True)
        out.add(set="neusight", family=model, label=f"{model} seq {row['seq_len']} batch {gb} {par} fp32",
                cluster="dgx-h100", model=arch, framework="pytorch", tp=tp, pp=pp, dp=dp, cp=1,
                micro_batch=mb, global_batch=gb, seq_len=row["seq_len"], dtype="fp32",
                recompute="none", zero=0, schedule="1f1b", vpp=1, sequence_parallel=False,
                tp_comm_overlap=0, measured_step_s=float(row["e2e_latency_ms"]) / 1e3, reason=reason,
                # NeuSight times forward + backward (collect_label_distributed.py; its SOURCE.md:
                # "optimizer step excluded"), so the prediction stops where the optimizer starts
                time_scope="forward_backward", source=f"e2e_labels_h100.csv row {i}")


def mpt(ref, out):
    src = ref / "mosaicml-llm-foundry-mpt-benchmarks"
    dims = {r["model"]: r for r in csv.DictReader(open(src / "mpt_model_dims.csv"))}
    clusters = {"a100_40gb": "dgx-a100-40gb", "a100_80gb": "dgx-a100", "h100_80gb": "dgx-h100"}
    for i, row in enumerate(csv.DictReader(open(src / "mpt_throughput.csv")), start=1):
        d = dims[row["model"]]
        seq = int(row["seq_len"])
        # the benchmark script runs attn_impl flash (flash-attn 2 with ALiBi slopes): causal
        # blocks skipped, the default
        arch = out.arch(f"mpt-{row['model']}-{seq}", d["n_layers"], d["d_model"], d["n_heads"],
                        d["n_heads"], int(d["expansion_ratio"]) * int(d["d_model"]), d["vocab_size"],
                        "layernorm", "gelu", "alibi", False, False, seq, tied=True)
        n = int(row["n_gpus"])
        zero = 3 if row["fsdp_sharding_strategy"] == "FULL_SHARD" else 2
        # from tokens/s (4–6 significant digits, and what MosaicML's MFU column is computed
        # from), never the CSV's derived_step_time_s: that divides by sequences/s, which the
        # README rounds to an integer — 1 for 1.75 (MPT-13b, 8k tokens, A100), 75 % off; 100 of
        # the 216 rows are off by more than 1 %
        measured = float(row["global_batch_size_tokens"]) / float(row["throughput_tok_per_s"])
        out.add(set="mpt", family=f"mpt-{row['model']}", label=f"MPT-{row['model']} {row['gpu']} {n} GPUs seq {seq} "
                f"mbs{row['micro_batch_size']} ga{row['grad_accum']} {row['precision']} "
                f"{row['fsdp_sharding_strategy']}{' ckpt' if row['activation_checkpointing'] == 'True' else ''}",
                cluster=clusters[row["gpu"]], model=arch, framework="composer", tp=1, pp=1, dp=n, cp=1,
                attention_kernel="flash-attention-2",
                micro_batch=row["micro_batch_size"], global_batch=int(row["micro_batch_size"]) *
                int(row["grad_accum"]) * n, seq_len=seq,
                dtype="fp8" if row["precision"] == "amp_fp8" else "bf16", recompute="full"
                if row["activation_checkpointing"] == "True" else "none", zero=zero, schedule="1f1b",
                vpp=1, sequence_parallel=False, tp_comm_overlap=0, measured_step_s=measured,
                # Composer's FSDP reduces gradients in fp32 under mixed_precision DEFAULT and in
                # bf16 under PURE (the table's mp_mode column)
                grad_reduce_dtype="bf16" if row["mp_mode"] == "PURE" else "fp32",
                source=f"mpt_throughput.csv row {i}")


def automodel(ref, out):
    src = ref / "nemo-automodel-h100-bf16" / "automodel_h100_bf16.csv"
    for i, row in enumerate(csv.DictReader(open(src)), start=1):
        model, section = row["Model"], row["section"]
        n, gbs, mbs = int(row["#GPUs"]), int(row["GBS"]), int(row["MBS"])
        tp, pp, cp = int(row["TP"]), int(row["PP"]), int(row["CP"])
        dp = n // (tp * pp * cp)
        layout = dict(cluster="dgx-h100", framework="automodel", tp=tp, pp=pp, dp=dp, cp=cp,
                      micro_batch=mbs, global_batch=gbs, seq_len=row["Seq Length"], dtype="bf16",
                      schedule="1f1b", vpp=1, sequence_parallel=False, tp_comm_overlap=0,
                      measured_step_s=float(row["Time per Global Step (s)"]),
                      source=f"automodel_h100_bf16.csv row {i}")
        label = (f"{model} {n} GPUs tp{tp} pp{pp} cp{cp} dp{dp} mbs{mbs} gbs{gbs} "
                 f"{section.split()[0]} ({row['first_seen']})")
        if not section.startswith("Pre-Training"):
            out.add(set="automodel", family=model.replace(" 2-node", "").lower().replace(" ", "-"),
                    label=label, recompute="none", zero=0, **layout,
                    reason="LoRA fine-tuning: the base weights are frozen (no weight gradients, "
                    "no optimizer over them); stepcast predicts pre-training")
            continue
        # the pre-training row's recipe (SOURCE.md: llama3_3/custom_llama3_1_70b_pretrain_
        # benchmark_8nodes.yaml): Llama 3.1 70B under FSDP2 resharding after the forward
        # (ZeRO 3) over the ranks the context-parallel pairs leave, every layer recomputed,
        # torch.compile, SDPA attention, PyTorch's context parallelism (its default rotation
        # all-gathers the keys and values; the flash backend is FlashAttention-2: an assumption,
        # as for torchtitan)
        assert int(row["FSDP"]) == dp, f"automodel row {i}: FSDP {row['FSDP']} is not {dp}"
        out.add(set="automodel", family="llama3-70b", label=label, model="llama3-70b",
                cp_comm="all-gather", attention_kernel="flash-attention-2", recompute="full",
                zero=3, **layout)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    ref, out_dir = Path(sys.argv[1]), Path(sys.argv[2])
    if not (ref / "vtrain-a100-single-node").is_dir():
        sys.exit(f"error: {ref} does not hold the reference data (vtrain-a100-single-node/ missing)")
    if out_dir.exists():
        sys.exit(f"error: {out_dir} exists: give a new directory")
    out = Out(out_dir)
    for importer in (vtrain, flagperf, dgxc, nemo, torchtitan, neusight, mpt, automodel):
        importer(ref, out)
    out.write()
    sets = {}
    for r in out.rows:
        s = sets.setdefault(r["set"], [0, 0])
        s[0] += 1
        s[1] += r["expressible"] == "true"
    for name, (rows, ok) in sets.items():
        print(f"{name:12} {rows:5d} rows, {ok:5d} expressible")
    print(f"wrote {out_dir / 'runs.csv'}")


if __name__ == "__main__":
    main()

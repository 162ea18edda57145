# /// script
# requires-python = ">=3.9"
# ///
"""Predicts the published end-to-end training runs that stepcast can express and reports the
error per source: NVIDIA's NeMo / Megatron-Bridge tables (DGX H100) and MosaicML's llm-foundry MPT
tables (A100 40/80 GB, H100; FSDP). Rows it cannot express are listed with the reason.

Usage: eval-real-runs.py STEPCAST_BINARY REFERENCE_DATA_DIR [--json OUT]"""
import csv
import json
import math
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

binary, ref = sys.argv[1], Path(sys.argv[2])
json_out = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
root = Path(__file__).resolve().parent.parent
profiles = root / "hardware-profiles"
work = Path(tempfile.mkdtemp(prefix="stepcast-real-runs-"))

PRESETS = {"LLAMA2-7B": "llama2-7b", "LLAMA2-13B": "llama2-13b", "LLAMA2-70B": "llama2-70b",
           "LLAMA3-8B": "llama3-8b", "LLAMA3_8B": "llama3-8b", "LLAMA3-70B": "llama3-70b",
           "LLAMA3_70B": "llama3-70b", "LLAMA3.1_405B": "llama3-405b", "GPT3-175B": "gpt3-175b"}
MOE = ("Qwen3", "DeepSeek", "GPT OSS", "Nemotron_3", "Mixtral")


def arch_file(name, layers, hidden, heads, kv, ffn, vocab, norm, act, position, bias, norm_bias, seq):
    path = work / f"{name}.yaml"
    path.write_text(
        f"name: {name}\nlayers: {layers}\nhidden: {hidden}\nheads: {heads}\nkv_heads: {kv}\n"
        f"ffn_hidden: {ffn}\nvocab: {vocab}\nnorm: {norm}\nactivation: {act}\nposition: {position}\n"
        f"linear_bias: {str(bias).lower()}\nnorm_bias: {str(norm_bias).lower()}\nseq_len: {seq}\n")
    return str(path)


def predict(cluster, model, **layout):
    args = [binary, "predict", "--cluster", str(profiles / cluster), "--model", model, "--json"]
    for key, value in layout.items():
        if value is True:
            args.append("--" + key.replace("_", "-"))
        elif value is not None and value is not False:
            args += ["--" + key.replace("_", "-"), str(value)]
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip())
    return json.loads(out.stdout)


def num(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan


def nemo():
    src = ref / "nemo-megatron-bridge-perf-summary"
    dims = {}
    for row in csv.DictReader(open(src / "model_dims.csv")):
        for name in row["model_name_in_table"].split(" / "):
            dims[name.strip()] = row
    rows, skipped = [], Counter()
    for row in csv.DictReader(open(src / "perf_summary_rows.csv")):
        if row["system"] != "DGX-H100":
            skipped["not an H100 system (no cluster file / models for B200, GB200, B300, GB300)"] += 1
            continue
        model = row["model"]
        vp, cp, ep, fsdp = num(row["vp"]), num(row["cp"]), num(row["ep"]), num(row["fsdp"])
        reason = None
        if row["variant"] != "primary":
            reason = "alternative value in parentheses (other quantization or layout)"
        elif any(m in model for m in MOE) or (ep == ep and ep > 1):
            reason = "mixture of experts (not modelled)"
        elif row["section"] in ("lora",) or row["task"] == "LoRA":
            reason = "LoRA fine-tuning (frozen weights, adapters: not modelled)"
        elif cp == cp and cp > 1:
            reason = "context parallelism (not modelled)"
        elif model not in PRESETS and model not in dims:
            reason = "architecture not described"
        if reason:
            skipped[reason] += 1
            continue
        if model in PRESETS:
            arch = PRESETS[model]
        else:
            d = dims[model]
            act = "swiglu" if d["gated_mlp"] == "true" else "gelu"
            norm = "rmsnorm" if d["normalization"] == "RMSNorm" else "layernorm"
            vocab = int(d["vocab_size"]) if d["vocab_size"] else 50257
            arch = arch_file(model.replace(".", "_"), d["num_layers"], d["hidden_size"], d["num_attention_heads"],
                             d["num_query_groups"], d["ffn_hidden_size"], vocab, norm, act, "rope", False,
                             norm == "layernorm", row["seq_len"])
        tp, pp = int(row["tp"]), int(row["pp"])
        n = int(row["n_gpus"])
        dp = n // (tp * pp)
        precision = row["precision"] or "FP8"
        rows.append(dict(source="nemo", label=f"{row['container']} {model} {row['section']} {n} GPUs tp{tp} pp{pp}"
                                          f"{' vp' + str(int(vp)) if vp == vp and vp > 1 else ''} dp{dp} "
                                          f"mbs{row['mbs']} gbs{row['gbs']} {precision}",
                         cluster="dgx-h100.yaml", model=arch, measured=float(row["derived_step_time_s"]),
                         layout=dict(tp=tp, pp=pp, dp=dp, micro_batch=row["mbs"], global_batch=row["gbs"],
                                     seq_len=row["seq_len"], dtype="fp8" if precision.startswith("FP8") else "bf16",
                                     sequence_parallel=tp > 1, zero=3 if fsdp == fsdp and fsdp > 0 else 1,
                                     vpp=int(vp) if vp == vp and vp > 1 else None)))
    return rows, skipped


def mosaic():
    src = ref / "mosaicml-llm-foundry-mpt-benchmarks"
    dims = {r["model"]: r for r in csv.DictReader(open(src / "mpt_model_dims.csv"))}
    clusters = {"a100_40gb": "dgx-a100-40gb.yaml", "a100_80gb": "dgx-a100.yaml", "h100_80gb": "dgx-h100.yaml"}
    rows, skipped = [], Counter()
    for row in csv.DictReader(open(src / "mpt_throughput.csv")):
        d = dims[row["model"]]
        seq = int(row["seq_len"])
        arch = arch_file(f"mpt-{row['model']}-{seq}", d["n_layers"], d["d_model"], d["n_heads"], d["n_heads"],
                         int(d["expansion_ratio"]) * int(d["d_model"]), d["vocab_size"], "layernorm", "gelu",
                         "alibi", False, False, seq)
        n = int(row["n_gpus"])
        zero = 3 if row["fsdp_sharding_strategy"] == "FULL_SHARD" else 2
        # the sequences/s column rounds to 0 for the longest sequences: use tokens/s there
        measured = num(row["derived_step_time_s"])
        if measured != measured:
            measured = float(row["global_batch_size_tokens"]) / float(row["throughput_tok_per_s"])
        rows.append(dict(source="mosaicml", label=f"MPT-{row['model']} {row['gpu']} {n} GPUs seq {seq} mbs{row['micro_batch_size']} "
                                              f"ga{row['grad_accum']} {row['precision']} {row['fsdp_sharding_strategy']}"
                                              f"{' ckpt' if row['activation_checkpointing'] == 'True' else ''}",
                         cluster=clusters[row["gpu"]], model=arch, measured=measured,
                         layout=dict(tp=1, pp=1, dp=n, micro_batch=row["micro_batch_size"],
                                     micro_batches=row["grad_accum"], seq_len=seq,
                                     dtype="fp8" if row["precision"] == "amp_fp8" else "bf16", zero=zero,
                                     recompute="full" if row["activation_checkpointing"] == "True" else "none")))
    return rows, skipped


results = []
for name, (rows, skipped) in (("NeMo / Megatron-Bridge, DGX H100", nemo()), ("MosaicML llm-foundry MPT", mosaic())):
    print(f"== {name}: {len(rows)} rows predicted, {sum(skipped.values())} out of scope")
    for reason, count in skipped.most_common():
        print(f"   out of scope: {count:3d} × {reason}")
    errors = []
    print(f"   {'run':92} {'measured s':>10} {'predicted s':>11} {'error':>7}  sources")
    for r in rows:
        try:
            p = predict(r["cluster"], r["model"], **r["layout"])
        except RuntimeError as e:
            print(f"   {r['label']:92} {r['measured']:10.3f}  not predicted: {e}")
            continue
        err = p["step_time_s"] / r["measured"] - 1
        errors.append(abs(err))
        sources = ", ".join(f"{k} {v:.0f}%" for k, v in sorted(p["sources_percent"].items(), key=lambda kv: -kv[1]))
        ooc = len(p["out_of_coverage"])
        print(f"   {r['label']:92} {r['measured']:10.3f} {p['step_time_s']:11.3f} {100 * err:+6.1f}%  {sources}"
              + (f"; {ooc} calls out of coverage" if ooc else ""))
        results.append(dict(r, predicted=p["step_time_s"], error=err, sources=p["sources_percent"], out_of_coverage=ooc))
    if errors:
        print(f"   mean |error| {100 * sum(errors) / len(errors):.1f} %, max {100 * max(errors):.1f} % over {len(errors)} runs")
    print()
if json_out:
    json.dump(results, open(json_out, "w"), indent=1)

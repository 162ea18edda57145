# /// script
# requires-python = ">=3.9"
# ///
"""Per-component comparison of stepcast's prediction of the paper's bundled example (Llemma-7B,
pp 4, tp 2, dp 2, micro-batch 4, 8 micro-batches, Perlmutter) with the paper tool's own breakdown
(estimate-train-time predictions/llemma_7b_4_2_2_P_predicted.csv, read from the reference data).

Usage: compare-paper-example.py STEPCAST_BINARY REFERENCE_DATA_DIR"""
import csv
import json
import subprocess
import sys
from pathlib import Path

binary, ref = sys.argv[1], Path(sys.argv[2])
root = Path(__file__).resolve().parent.parent
paper_csv = ref / "estimate-train-time-2509.22832/predictions/llemma_7b_4_2_2_P_predicted.csv"
paper = {}
for row in csv.DictReader(open(paper_csv)):
    value = row["predition(us)"]
    paper[row["module"]] = json.loads(value) if value.startswith("[") else float(value)

ours = json.loads(subprocess.run(
    [binary, "predict", "--cluster", str(root / "hardware-profiles/perlmutter.yaml"), "--model", "llemma-7b",
     "--tp", "2", "--pp", "4", "--dp", "2", "--micro-batch", "4", "--micro-batches", "8", "--rules", "paper", "--json"],
    check=True, capture_output=True, text=True).stdout)
stages = ours["stages"]
first, middle, last = stages[0], stages[1], stages[-1]


def op(stage, phase, label):
    return next(o["estimate"]["time_us"] for o in stage[phase] if o["label"] == label)


def p2p(stage, phase):
    return sum(o["estimate"]["time_us"] * o["count"] for o in stage[phase] if o["label"] == "pp send/recv")


rows = []
for paper_name, label, stage in [("embedding", "embedding", first), ("RMSlayernorm", "input norm", middle),
                                 ("linear1", "qkv", middle), ("RoPE", "rope q", middle), ("flash_atten", "attention", middle),
                                 ("linear2", "attention out", middle), ("linear3", "mlp up", middle), ("gelu", "activation", middle),
                                 ("linear4", "mlp down", middle), ("res_add", "residual add", middle),
                                 ("linear_final", "lm head", last), ("parallel_cross_entropy_128", "cross-entropy", last)]:
    for phase in ("fwd", "bwd"):
        rows.append((f"{paper_name} {phase}", paper[f"{paper_name}_{phase}"], op(stage, phase, label)))
rows.append(("pp_p2p", paper["pp_p2p"], op(middle, "fwd", "pp send/recv")))
rows.append(("mp_allreduce", paper["mp_allreduce"], op(middle, "fwd", "tp all-reduce")))
layers = middle["layers"]
rows.append(("encoder_fwd (one layer)", paper["encoder_fwd"], (middle["fwd_ms"] * 1e3 - p2p(middle, "fwd")) / layers))
rows.append(("encoder_bwd (one layer, with recompute)", paper["encoder_bwd"], (middle["bwd_ms"] * 1e3 - p2p(middle, "bwd")) / layers))
for i, s in enumerate((first, middle, last)):
    rows.append((f"stage_fwd[{i}] (no p2p)", paper["stage_fwd"][i], s["fwd_ms"] * 1e3 - p2p(s, "fwd")))
for i, s in enumerate((first, middle, last)):
    rows.append((f"stage_bwd[{i}] (no p2p)", paper["stage_bwd"][i], s["bwd_ms"] * 1e3 - p2p(s, "bwd")))
rows.append(("dp_allreduce (first stage)", paper["dp_allreduce"][0], first["grad_sync_ms"] * 1e3))
for i, s in enumerate((first, middle, last)):
    rows.append((f"dp_allgather[{i}]", paper["dp_allgather"][i], s["param_gather_ms"] * 1e3))
    rows.append((f"optimizer[{i}]", paper["optimizer"][i], s["optimizer_ms"] * 1e3))
rows.append(("step (all_F_all_B_max_optimizer)", paper["all_F_all_B_max_optimizer"], ours["step_time_s"] * 1e6))

print(f"{'component':42} {'paper µs':>14} {'stepcast µs':>14} {'diff':>8}")
for name, theirs, mine in rows:
    print(f"{name:42} {theirs:14.1f} {mine:14.1f} {100 * (mine / theirs - 1):+7.1f}%")
step_diff = ours["step_time_s"] * 1e6 / paper["all_F_all_B_max_optimizer"] - 1
print(f"step: paper {paper['all_F_all_B_max_optimizer'] / 1e6:.3f} s, stepcast {ours['step_time_s']:.3f} s "
      f"({100 * step_diff:+.1f} %, 80 % interval {ours['interval_s'][0]:.3f}–{ours['interval_s'][1]:.3f} s)")
sys.exit(0 if abs(step_diff) <= 0.03 else 1)

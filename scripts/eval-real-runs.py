#!/usr/bin/env python3
"""The accuracy gate on published end-to-end training runs (../shared/reference-data).

Imports every set (scripts/import-runs.py), then per cluster runs `stepcast calibrate` with the
sets the shipped calibration is fitted on (grouped cross-validation: each model family is
predicted by a runtime fitted without it; the other sets on the cluster are held out whole) and
reports per set: rows, expressible, predicted, raw (the cluster's default runtime) and
calibrated mean |error|, max and signed bias, and the highest predicted MFU. DGX Cloud is also
split into BF16 and FP8, DGX Cloud, NeMo and torchtitan into dense runs and
context-parallel ones (cp > 1), and NeMo into its two sources (the NeMo repository's 24.07 table,
Megatron-Bridge's 25.09-26.08 tables). MPT (MosaicML's Composer with FSDP) is also predicted by a
runtime fitted on Composer's runs alone (`calibrate --framework composer`, grouped
cross-validation within them), reported as "mpt (composer runtime)". A cluster with too few runs
to fit a runtime of its own (the DGX H200: torchtitan's two H200 rows) is predicted as `predict`
composes it now, under the calibration its cluster file borrows (`calibrate --check`), every
set held out.

For vTrain it also splits the error: per micro-batch and per step, per layer and outside the
layers, the floors no predictor monotone in work can beat, and how much is one bias per layer
shape (tensor-parallel degree, micro-batch size, width).

For the sets whose runs use FlashAttention-2 (MPT, torchtitan) it splits the raw error between
the attention and the rest: measured / raw fitted as f × rest + k × attention, the attention's
part of each raw step from calibrate's report (a diagnostic; nothing is fitted into a
prediction).

It also prints the layouts two sets measured for the same model family on the same cluster
("measured by two sets"): how far apart two software stacks put the same run; and, where a set
measured the same layout in bf16 and fp8 (DGX Cloud, FlagPerf H100), the step-time ratio
bf16 / fp8 measured, raw and calibrated per family: the fp8 costing, which no runtime tunes.
And the memory projection on runs that ran: per set, how many it says do not fit (each one
wrong), and its error on the peaks the runs reported (torchtitan's PyTorch reserved memory,
FlagPerf's device memory), each compared in its own scope.

Held-out runs beyond the range of the runs their calibration was fitted on (what predict warns
about) measure the band predict's interval spans there: measured / predicted over the held-out
sets with 5 or more such runs, each set weighing the same — its tails where each set, left out,
falls inside the other sets' band 80 % of the time on average (p10–p90 unless that holds less),
and its median — and each set left out in turn, how many of its runs the other sets' band holds.
The peaks runs reported measure, the same way, the band `memory` puts around a projected peak.

With --check THRESHOLDS.json it fails when the extrapolation band or its median is more than
0.05 from `EXTRAPOLATION_BAND` / `EXTRAPOLATION_MEDIAN` in src/predict/mod.rs (the reported-peak
band from `REPORTED_PEAK_BAND` / `_MEDIAN` in src/memory/mod.rs), when a set's
calibrated mean |error| is more than one point above its threshold (the file commits today's
figures), when a prediction's MFU exceeds its GPU's achievable fraction, when the memory
projection's mean |error| on reported peaks ("memory: SET") is more than one point above its
threshold, or when more runs that ran are projected OOM than the file allows ("projected OOM:
SET").

Its work directory (the imported runs and each calibration's report) is removed at the end;
--keep-work keeps it and prints where.

Usage: eval-real-runs.py STEPCAST REFERENCE_DATA [--json OUT] [--check THRESHOLDS] [--keep-work]"""
import csv
import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bands import band_in_code, honest_tail, left_out_coverage, pooled_band

ROOT = Path(__file__).resolve().parent.parent
# cluster file → the sets its shipped calibration is fitted on (the rest are held out)
CALIBRATIONS = {
    "dgx-a100": ["vtrain", "flagperf"],
    "dgx-a100-40gb": ["mpt"],
    # DGX Cloud's tables and Megatron-Bridge's (today's software); NeMo 24.07's table of 2024 is
    # held out (`nemo-24.07`: slower than both at the same layouts)
    "dgx-h100": ["dgxc", "nemo"],
    "grand-teton-h100": ["torchtitan"],
}
# (cluster file, framework) → the sets a framework's own calibration is fitted on: its runs
# alone, grouped cross-validation within them (`calibrate --framework`)
FRAMEWORK_CALIBRATIONS = {
    ("dgx-a100", "composer"): ["mpt"],
    ("dgx-a100-40gb", "composer"): ["mpt"],
    ("dgx-h100", "composer"): ["mpt"],
}
# clusters whose runs are too few to fit: predicted as `predict` composes them now (`calibrate
# --check`: the calibration their cluster file borrows), every set held out
CHECKED = ["dgx-h200"]
# the best fraction of dense peak a GEMM reaches per cluster (the cluster files' achievable:)
ACHIEVABLE_MFU = {"dgx-a100": 95.0, "dgx-a100-40gb": 95.0, "dgx-h100": 87.0, "dgx-h200": 88.0,
                  "grand-teton-h100": 87.0}


# z of a two-sided 80 % interval (as `predict` uses)
Z80 = 1.2816
# runs of a training type a calibration needs before it gives that type its own spread
# (`hardware::MIN_RUNS_OF_A_TYPE`)
MIN_RUNS_OF_A_TYPE = 20
# a set needs this many ratios to count in a measured band: held-out runs beyond its
# calibration's range (the extrapolation band), or reported peaks (the reported-peak band)
MIN_RUNS_IN_A_BAND = 5
# the extrapolation band in the code (low, median, high), which predict's interval uses
EXTRAPOLATION = band_in_code(ROOT / "src/predict/mod.rs", "EXTRAPOLATION_BAND",
                             "EXTRAPOLATION_MEDIAN")
# the band the memory projection's peak takes, from the peaks runs reported (low, median, high)
REPORTED_PEAK = band_in_code(ROOT / "src/memory/mod.rs", "REPORTED_PEAK_BAND", "REPORTED_PEAK_MEDIAN")


def spread(stats):
    """A calibration's error as the σ predict puts into its interval (`hardware::spread`)."""
    return math.sqrt(math.pi / 2) * math.log1p(stats["mean_abs_percent"] / 100)


def stats(errors):
    if not errors:
        return None
    return {"runs": len(errors), "mean_abs_percent": sum(abs(e) for e in errors) / len(errors),
            "max_abs_percent": max(abs(e) for e in errors), "bias_percent": sum(errors) / len(errors)}


def runtime_band(sigma, beyond):
    """The runtime's part of predict's 80 % interval as multipliers of the step
    (`predict::runtime_band`): exp(±1.28 σ), widened to the extrapolation band on each side
    where the run lies beyond the runs its calibration was fitted on; none without either."""
    spread = (math.exp(-Z80 * sigma), math.exp(Z80 * sigma)) if sigma else None
    if not beyond:
        return spread
    low, _, high = EXTRAPOLATION
    return (min(spread[0], low), max(spread[1], high)) if spread else (low, high)


def coverage(pred, sigma_of):
    """Share of runs whose calibrated prediction lies within the runtime's part of the 80 %
    interval predict gives (exp(±1.28 σ), σ the run's: its training type's where the
    calibration had enough runs of it, else over all; the extrapolation band where the run lies
    beyond the runs fitted on); the operator models' part, which widens it a little more, is
    left out: a lower bound on the interval's coverage."""
    cv = [(x, runtime_band(sigma_of(x), bool(x.get("beyond_fitted_runs"))))
          for x in pred if x.get("cross_validated_s")]
    cv = [(x, b) for x, b in cv if b is not None]
    if not cv:
        return None
    inside = sum(lo <= x["measured_s"] / x["cross_validated_s"] <= hi for x, (lo, hi) in cv)
    sigmas = {round(s, 6) for x, _ in cv if (s := sigma_of(x)) is not None}
    return {"runs": len(cv), "inside_percent": 100 * inside / len(cv), "sigma_log": sorted(sigmas),
            "beyond_fitted_runs": sum(bool(x.get("beyond_fitted_runs")) for x, _ in cv)}


def left_out_text(band):
    """How a measured band holds each set left out, as eval prints it."""
    return (f"each set left out, the other sets' band holds {band['left_out_coverage_percent']:.0f} % of its "
            f"runs on average ({band['nested_left_out_coverage_percent']:.0f} % with the tails too chosen "
            "without it) — " + ", ".join(
                f"{k} {v['inside_percent']:.0f} % ({v['runs']} runs, median {v['median']:.2f}, others "
                f"{v['others_band'][0]:.2f}–{v['others_band'][1]:.2f})" for k, v in band["sets"].items()))


def measured_band(ratios_by_set):
    """A band of measured / predicted from the sets with at least MIN_RUNS_IN_A_BAND ratios, each
    set weighing the same: its tails chosen so that each set, left out, falls inside the other
    sets' band 80 % of the time on average (`bands.honest_tail`: what the band must hold is a
    set it never saw), with the median; and, per set, that band of the others and how many of
    its ratios it holds — and the same for the pooled p10–p90, for comparison. The extrapolation
    band: steps beyond their calibration's fitted runs against their calibrated prediction; the
    reported-peak band: the memory runs reported against its projection."""
    sets = {k: sorted(v) for k, v in ratios_by_set.items() if len(v) >= MIN_RUNS_IN_A_BAND}
    if len(sets) < 2:
        return None
    tail = honest_tail(sets, 80.0)
    left_out = left_out_coverage(sets, tail)
    p10_p90 = left_out_coverage(sets, 0.1)
    mean = lambda cover: sum(c["inside_percent"] for c in cover.values()) / len(cover)  # noqa: E731

    def nested(name):
        """The set's runs inside the others' band at the tail the others alone choose: the
        coverage with the choice of tail left out too."""
        others = {k: v for k, v in sets.items() if k != name}
        low, _, high = pooled_band(others, honest_tail(others, 80.0))
        return 100 * sum(low <= r <= high for r in sets[name]) / len(sets[name])

    return {"tail": tail, "band": pooled_band(sets, tail),
            "sets": {k: {"runs": len(v), "median": v[len(v) // 2], **left_out[k], "ratios": v}
                     for k, v in sets.items()},
            "left_out_coverage_percent": mean(left_out),
            "nested_left_out_coverage_percent": sum(map(nested, sets)) / len(sets),
            "p10_p90": {"band": pooled_band(sets), "left_out_coverage_percent": mean(p10_p90)}}


def vtrain_layout(label):
    """(hidden, layers, GPUs, tp, pp, dp, micro-batch, global batch) of a vTrain run's label."""
    m = re.search(r"h(\d+)-l(\d+) (\d+) GPUs tp(\d+) pp(\d+) dp(\d+) mbs(\d+) gbs(\d+)", label)
    return tuple(map(int, m.groups()))


def vtrain_monotone_floor(rows):
    """How far vTrain's own measurements allow any predictor that never predicts less time for
    more work to come: a pair of runs on the same layout and GPUs where one does at least the
    other's work in every dimension (layers, micro-batch size, micro-batches) yet ran faster
    forces one of the two predictions off by at least tanh(log gap / 2). Returns, for pairs of
    the same model width and then for pairs across widths too (the wider model runs the same
    kernels, as many, each on larger operands: at least the narrower's work, the host's the
    same), the largest such gap as the smallest possible max |error| (%), how many ordered pairs
    violate, and the worst pair. Runs on either side of Megatron's fused-softmax test are not
    compared: with b·heads on a rank not a multiple of 4 (vTrain's 16 heads over tp 8 at one
    sequence) the softmax runs as five PyTorch kernels each way instead of one, more work than
    the sizes show."""
    def key(label, across_widths):
        h, layers, _, tp, pp, dp, mb, gb = vtrain_layout(label)
        fused_softmax = (16 // tp * mb) % 4 == 0
        work = (layers, mb, gb // (mb * dp))
        if across_widths:
            return (tp, pp, dp, fused_softmax), (h, *work)
        return (h, tp, pp, dp, fused_softmax), work

    def floor(across_widths):
        runs = [(*key(x["label"], across_widths), math.log(x["measured_s"]), x["label"]) for x in rows]
        worst, pairs, example = 0.0, 0, None
        for group, work, t, label in runs:
            for group2, work2, t2, label2 in runs:
                if group == group2 and work != work2 and all(a >= b for a, b in zip(work, work2)) \
                        and t < t2:
                    pairs += 1
                    if t2 - t > worst:
                        worst, example = t2 - t, (label, math.exp(t), label2, math.exp(t2))
        # both at the harmonic mean of the two times: off by (r - 1) / (r + 1) = tanh(gap / 2)
        return {"violating_pairs": pairs, "min_max_abs_percent": 100 * math.tanh(worst / 2),
                "worst_pair": example}

    return {**floor(False), "across_widths": floor(True)}


def vtrain_cells(rows):
    """How much of vTrain's error is one bias per layer shape. A cell is a tensor-parallel
    degree, micro-batch size and width: every kernel of a layer has the same shape across its
    runs (layers, pipeline and data parallelism, micro-batches vary). Returns the cells, the
    calibrated mean |error| left once each cell's own mean log error is taken off (what a
    predictor right on average in every cell would reach), and the cells with the largest
    mean error, signed (%)."""
    cells = {}
    for x in rows:
        if not x.get("cross_validated_s"):
            continue
        h, _, _, tp, _, _, mb, _ = vtrain_layout(x["label"])
        cells.setdefault((tp, mb, h), []).append(math.log(x["cross_validated_s"] / x["measured_s"]))
    left, means = [], {}
    for key, logs in cells.items():
        mean = sum(logs) / len(logs)
        means[key] = 100 * (math.exp(mean) - 1)
        left += [abs(100 * (math.exp(e - mean) - 1)) for e in logs]
    worst = sorted(means.items(), key=lambda kv: -abs(kv[1]))[:4]
    return {"cells": len(cells), "mean_abs_percent_within_cells": sum(left) / len(left) if left else None,
            "worst_cells": [{"tp": tp, "micro_batch": mb, "hidden": h, "mean_percent": m}
                            for (tp, mb, h), m in worst]}


def vtrain_decomposition(rows):
    """Where vTrain's error sits. Runs that differ only in their number of micro-batches m give
    a step time a + b·m: b the time of one more micro-batch, a what a step spends once (the
    optimizer, the gradient sync, the pipeline's fill and drain, per-step host work). Fitted
    through the fewest and most micro-batches of each group, measured and cross-validated.
    Returns, per tensor-parallel degree, the groups and the mean |error| of b (%), and for
    pp = 1 the median a measured and predicted (ms). The per-micro-batch time b of layouts that
    differ only in their number of layers splits in turn into c + d·L (L the layers a pipeline
    stage holds): d the time of one more layer, c what a micro-batch spends outside the layers
    (embedding, LM head, loss, batch loading) on the slowest stage; their medians per tensor-
    parallel degree, measured and predicted (ms), say which of the two carries the error."""
    groups = {}
    for x in rows:
        h, layers, _, tp, pp, dp, mb, gb = vtrain_layout(x["label"])
        groups.setdefault((h, layers, tp, pp, dp, mb), []).append((gb // (mb * dp), x))
    per_tp = {}
    for (h, layers, tp, pp, dp, mb), runs in groups.items():
        if len({n for n, _ in runs}) < 2:
            continue
        (n1, x1), (n2, x2) = min(runs, key=lambda r: r[0]), max(runs, key=lambda r: r[0])
        fit = {k: ((x2[k] - x1[k]) / (n2 - n1), x1[k] - n1 * (x2[k] - x1[k]) / (n2 - n1))
               for k in ("measured_s", "cross_validated_s")}
        (bm, am), (bp, ap) = fit["measured_s"], fit["cross_validated_s"]
        d = per_tp.setdefault(tp, {"groups": 0, "b_err": [], "a_meas": [], "a_pred": []})
        d["groups"] += 1
        d["b_err"].append(abs(100 * (bp / bm - 1)))
        d.setdefault("by_depth", {}).setdefault((h, pp, dp, mb), {})[layers // pp] = (bm, bp)
        if pp == 1:
            d["a_meas"].append(1e3 * am)
            d["a_pred"].append(1e3 * ap)
    median = lambda v: sorted(v)[len(v) // 2] if v else float("nan")  # noqa: E731

    def layer_split(by_depth):
        """Medians of (d, c) measured and predicted over the layouts measured at two depths or
        more, through the shallowest and the deepest (ms)."""
        d_meas, d_pred, c_meas, c_pred = [], [], [], []
        for depths in by_depth.values():
            if len(depths) < 2:
                continue
            (l1, (bm1, bp1)), (l2, (bm2, bp2)) = min(depths.items()), max(depths.items())
            for b1, b2, ds, cs in ((bm1, bm2, d_meas, c_meas), (bp1, bp2, d_pred, c_pred)):
                slope = (b2 - b1) / (l2 - l1)
                ds.append(1e3 * slope)
                cs.append(1e3 * (b1 - l1 * slope))
        return {"per_layer_median_ms": [median(d_meas), median(d_pred)],
                "outside_layers_median_ms": [median(c_meas), median(c_pred)]}

    return {tp: {"groups": d["groups"],
                 "per_micro_batch_mean_abs_percent": sum(d["b_err"]) / len(d["b_err"]),
                 "per_step_pp1_median_ms": [median(d["a_meas"]), median(d["a_pred"])],
                 **layer_split(d.get("by_depth", {}))}
            for tp, d in sorted(per_tp.items())}


def vtrain_composition(rows):
    """What vTrain's ground truth is made of. Each of its iteration times is exactly a per-step
    part plus the micro-batch count times a per-micro-batch part (no measured step lies that
    close to a line), and the per-micro-batch part is the same, to the microsecond, at every
    data-parallel degree: the rows compose a few hundred timings rather than measure 1,440
    steps. Returns the largest distance of a step from its group's line (%, groups measured at
    three micro-batch counts or more), the largest spread of the per-micro-batch part across
    data-parallel degrees (ms), how many per-micro-batch and per-step timings the rows hold,
    the calibrated error were either part predicted as measured (which part carries the
    error), and the per-step part at pp 1 and dp 1 against the parameters a GPU holds
    (least squares over the layouts: µs per million parameters and ms fixed, measured and
    predicted)."""
    groups = {}
    for x in rows:
        h, layers, _, tp, pp, dp, mb, gb = vtrain_layout(x["label"])
        groups.setdefault((h, layers, tp, pp, dp, mb), []).append((gb // (mb * dp), x))

    def line(points):
        """Least-squares intercept and slope of (n, t) points."""
        n = len(points)
        mx, my = sum(p[0] for p in points) / n, sum(p[1] for p in points) / n
        slope = sum((p[0] - mx) * (p[1] - my) for p in points) / sum((p[0] - mx) ** 2 for p in points)
        return my - slope * mx, slope

    residual, checked, lines = 0.0, 0, {}
    for key, runs in groups.items():
        if len({n for n, _ in runs}) < 2:
            continue
        measured = line([(n, x["measured_s"]) for n, x in runs])
        predicted = line([(n, x["cross_validated_s"]) for n, x in runs]) \
            if all(x.get("cross_validated_s") for _, x in runs) else None
        lines[key] = (measured, predicted, runs)
        if len(runs) >= 3:
            checked += 1
            a, b = measured
            residual = max(residual, *(abs(100 * (a + b * n - x["measured_s"]) / x["measured_s"])
                                       for n, x in runs))
    per_micro_batch, per_step = {}, {}
    for (h, layers, tp, pp, dp, mb), ((a, b), _, _) in lines.items():
        per_micro_batch.setdefault((h, layers, tp, pp, mb), []).append(b)
        per_step.setdefault((h, layers, tp, pp, dp), []).append(a)
    spread = max((max(v) - min(v) for v in per_micro_batch.values()), default=0.0)

    def swapped(which):
        """Calibrated errors (%) with the measured per-step (0) or per-micro-batch (1) part."""
        out = []
        for (m, p, runs) in lines.values():
            if p is None:
                continue
            part = [p[0], p[1]]
            part[which] = m[which]
            out += [100 * ((part[0] + part[1] * n) / x["measured_s"] - 1) for n, x in runs]
        return stats(out)

    def per_param(k):
        """Least squares of the pp 1, dp 1 per-step part (ms) on millions of parameters a GPU
        holds: (µs per million, ms fixed)."""
        points = []
        for (h, layers, tp, pp, dp, mb), (m, p, _) in lines.items():
            part = (m, p)[k]
            if pp == 1 and dp == 1 and part is not None:
                # GPT-2's layers, 50,257 words, 1,024 positions and final norm, split over tp
                params = (layers * (12 * h * h + 13 * h) + (50257 + 1024 + 2) * h) / tp
                points.append((params / 1e6, 1e3 * part[0]))
        if len({x for x, _ in points}) < 2:
            return None
        fixed, slope = line(points)
        return [1e3 * slope, fixed]

    return {"max_residual_percent": residual, "groups_checked": checked,
            "per_micro_batch_spread_across_dp_ms": 1e3 * spread,
            "per_micro_batch_timings": len(per_micro_batch), "per_step_timings": len(per_step),
            "with_measured_per_step": swapped(0), "with_measured_per_micro_batch": swapped(1),
            "per_step_dp1_us_per_million_params_and_ms": [per_param(0), per_param(1)]}


def memory(rows):
    """The memory projection on runs that ran: how many it says do not fit (each is wrong),
    and its error on the peaks the runs reported, each compared in its own scope (calibrate
    --json's `memory.comparable_gib`)."""
    mem = [x["memory"] for x in rows if x.get("memory")]
    reported = [100 * (m["comparable_gib"] / m["measured_gib"] - 1) for m in mem if m.get("measured_gib")]
    return {"projected_oom": sum(m["verdict"] == "OOM" for m in mem), "runs": len(mem),
            "reported": stats(reported)}


def fp8_speedups(rows):
    """The step-time ratio bf16 / fp8 of runs measured both ways with everything else equal
    (DGX Cloud's BF16 and FP8 tables, FlagPerf's bf16 and bf16+fp8 rows): a test of the fp8
    costing that no calibration can tune, since the runtime is the same on both sides. Per
    model family: pairs, and the mean speedup measured, raw and calibrated."""
    by_key = {}
    for x in rows:
        label = x["label"]
        fp8 = " FP8 " in label or label.endswith(" bf16+fp8")
        key = label.replace(" FP8 ", " X ").replace(" BF16 ", " X ").replace(" bf16+fp8", " X") \
            .replace(" bf16", " X")
        by_key.setdefault((x["family"], key), {})["fp8" if fp8 else "bf16"] = x
    out = {}
    for (family, _), pair in sorted(by_key.items()):
        cols = ("measured_s", "raw_s", "cross_validated_s")
        if len(pair) < 2 or not all(pair[p].get(c) for p in ("bf16", "fp8") for c in cols):
            continue
        d = out.setdefault(family, {"pairs": 0, "measured": 0.0, "raw": 0.0, "calibrated": 0.0})
        d["pairs"] += 1
        for k, col in (("measured", "measured_s"), ("raw", "raw_s"), ("calibrated", "cross_validated_s")):
            d[k] += pair["bf16"][col] / pair["fp8"][col]
    for d in out.values():
        for k in ("measured", "raw", "calibrated"):
            d[k] /= d["pairs"]
    return out


def cross_set_twins(runs_csv):
    """Layouts that two source sets measured on the same cluster for the same model family (an
    architecture across sets), batch, sequence, precision and recomputation: one set's software
    measured against another's, a spread no runtime fitted to both can remove. Returns per twin
    its description and each set's measured step times."""
    cols = ("tp", "pp", "cp", "dp", "ep", "micro_batch", "global_batch", "seq_len", "dtype",
            "recompute", "vpp", "sequence_parallel", "tp_comm_overlap")
    groups = {}
    for r in csv.DictReader(open(runs_csv)):
        if r["expressible"] != "true":
            continue
        key = (r["cluster"], r["family"]) + tuple(r[c] or "1" for c in cols)
        groups.setdefault(key, {}).setdefault(r["set"], []).append(float(r["measured_step_s"]))
    def describe(column, value):
        """A column as the layout line shows it: switches by name when on, defaults left out."""
        if column in ("sequence_parallel", "tp_comm_overlap"):
            return column if value in ("true", "1") else ""
        return "" if value == "1" else f"{column} {value}"
    twins = []
    for key, sets in groups.items():
        if len(sets) > 1:
            layout = " ".join(d for d in (describe(c, v) for c, v in zip(cols, key[2:])) if d)
            twins.append({"cluster": key[0], "family": key[1], "layout": layout, "measured_s": sets})
    return twins


def mosaic_mfu(ref, runs_csv, rows):
    """MPT runs' predicted MFU against the MFU MosaicML reports for the same run (its
    mpt_throughput.csv row, named in the runs CSV's source column): per [raw, calibrated], the
    runs more than 10 points above it, and the largest excess in points."""
    src = list(csv.DictReader(open(ref / "mosaicml-llm-foundry-mpt-benchmarks" / "mpt_throughput.csv")))
    runs = list(csv.DictReader(open(runs_csv)))
    over, excess, worst = [0, 0], [-math.inf, -math.inf], [None, None]
    for x in rows:
        source = runs[x["line"] - 2]["source"]
        reported = float(src[int(source.rsplit("row ", 1)[1]) - 1]["mfu_pct"])
        for k, predicted in enumerate(x.get("mfu_percent") or []):
            if predicted == predicted:
                over[k] += predicted > reported + 10
                if predicted - reported > excess[k]:
                    excess[k], worst[k] = predicted - reported, {
                        "label": x["label"], "reported_mfu_percent": reported,
                        "predicted_mfu_percent": predicted,
                        "error_percent": 100 * (x["cross_validated_s" if k else "raw_s"] / x["measured_s"] - 1)}
    return {"runs": len(rows), "over_reported_plus_10": over, "max_excess_points": excess,
            "largest_excess": worst}


def attention_split(rows):
    """How the raw error of a set whose runs use FlashAttention-2 splits between the attention
    and everything else: each run's raw step and the part of it its FA2 calls take (calibrate's
    `raw_flash_attention_2_s`: what halving their efficiency adds to the composed step), and
    measured / raw fitted as f × (the rest) + k × (attention) by least squares on the relative
    error. k says how much slower the attention ran than costed, f the rest; runs at long
    sequences (attention most of the step) pin k. Diagnostic only: nothing is fitted into a
    prediction."""
    points = [((x["raw_s"] - x["raw_flash_attention_2_s"]) / x["measured_s"],
               x["raw_flash_attention_2_s"] / x["measured_s"],
               x["raw_flash_attention_2_s"] / x["raw_s"], x["raw_s"] / x["measured_s"])
              for x in rows if x.get("raw_flash_attention_2_s")]
    if len(points) < 4 or max(x[2] for x in points) - min(x[2] for x in points) < 0.2:
        return None
    # least squares of f·n + k·a = 1 (the normal equations of two unknowns)
    snn = sum(n * n for n, a, _, _ in points)
    saa = sum(a * a for n, a, _, _ in points)
    sna = sum(n * a for n, a, _, _ in points)
    sn, sa = sum(n for n, *_ in points), sum(a for _, a, *_ in points)
    det = snn * saa - sna * sna
    f, k = (sn * saa - sa * sna) / det, (sa * snn - sn * sna) / det
    resid = [100 * (f * n + k * a - 1) for n, a, _, _ in points]
    return {"runs": len(points), "attention_share": [min(x[2] for x in points), max(x[2] for x in points)],
            "attention_factor": k, "rest_factor": f,
            "raw": stats([100 * (x[3] - 1) for x in points]),
            "refitted": {"mean_abs_percent": sum(map(abs, resid)) / len(resid),
                         "max_abs_percent": max(map(abs, resid))}}


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    binary, ref = sys.argv[1], Path(sys.argv[2])
    arg = lambda flag: sys.argv[sys.argv.index(flag) + 1] if flag in sys.argv else None  # noqa: E731
    json_out, thresholds = arg("--json"), arg("--check")
    if not (ref / "vtrain-a100-single-node").is_dir():
        sys.exit(f"error: reference data not found under {ref}")
    # the work directory (the imported runs, each calibration's report) is removed at the end
    # unless --keep-work asks to read it
    work = Path(tempfile.mkdtemp(prefix="stepcast-real-runs-"))
    try:
        evaluate(binary, ref, work, json_out, thresholds)
    finally:
        if "--keep-work" in sys.argv:
            print(f"work files kept in {work}")
        else:
            shutil.rmtree(work)


def evaluate(binary, ref, work, json_out, thresholds):
    beyond_ratios, reported_ratios = {}, {}
    subprocess.run([sys.executable, str(ROOT / "scripts/import-runs.py"), str(ref), str(work / "runs")],
                   check=True, capture_output=True)
    runs_csv = work / "runs" / "runs.csv"
    table = {}
    jobs = [(cluster, None, fit_sets) for cluster, fit_sets in CALIBRATIONS.items()]
    jobs += [(cluster, fw, fit_sets) for (cluster, fw), fit_sets in FRAMEWORK_CALIBRATIONS.items()]
    jobs += [(cluster, None, None) for cluster in CHECKED]
    for cluster, framework, fit_sets in jobs:
        report = work / f"{cluster}-{framework}.json"
        how = ["--check"] if fit_sets is None else ["--fit-sets", ",".join(fit_sets), "--dry-run"]
        out = subprocess.run([binary, "calibrate", str(runs_csv), "--cluster",
                              str(ROOT / "hardware-profiles" / f"{cluster}.yaml"), *how,
                              "--json", str(report)]
                             + (["--framework", framework] if framework else []),
                             capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"error: calibrating {cluster}: {out.stderr.strip()}")
        r = json.load(open(report))
        under = f" under {framework}" if framework else ""
        # the runtime's spread predict puts into its 80 % interval (`hardware::spread`); a
        # check's runs may be composed under several runtimes, each with its own
        # a training type with MIN_RUNS_OF_A_TYPE runs of its own gets its own spread
        if fit_sets is None:
            spreads = {c.get("sigma_log") for c in r["runtimes"]}
            by_dtype = [c.get("sigma_log_by_dtype") or {} for c in r["runtimes"]]
            by_dtype = by_dtype[0] if len(spreads) == 1 and len(by_dtype) == 1 else {}
        else:
            spreads = {r["interval_sigma_log"]}
            by_dtype = {d: spread(s) for d, s in r.get("cross_validated_by_dtype", {}).items()
                        if s["runs"] >= MIN_RUNS_OF_A_TYPE}
        sigma = spreads.pop() if len(spreads) == 1 else None

        def sigma_of(x, sigma=sigma, by_dtype=by_dtype):
            return None if sigma is None else by_dtype.get(x.get("dtype"), sigma)
        if fit_sets is None:
            print(f"== {cluster}: nothing fitted, as predict composes its runs now — "
                  + "; ".join(f"{c['runs']} runs: {c.get('summary') or 'the defaults'}"
                              for c in r["runtimes"]))
        else:
            fitted = r["fitted"]["runtime"]
            print(f"== {cluster}{under}: fitted on {', '.join(fit_sets)} — launch {fitted['launch_us']:.0f} µs, "
                  f"collective {fitted['collective_launch_us']:.0f} µs, in-situ {fitted['in_situ_efficiency']:.3f}, "
                  f"contention {fitted['contention']:.2f}, per-step {fitted['step_overhead_ms']:.0f} ms, "
                  f"FlashAttention-2 {fitted.get('flash_attention_2_efficiency', 1.0):.2f}"
                  + (f"; at a bound: {', '.join(r['fitted']['at_bound'])}" if r["fitted"]["at_bound"] else ""))
        groups = {}
        for name, s in r["sets"].items():
            groups[name + (f" ({framework} runtime)" if framework else "")] = (
                s, [x for x in r["runs"] if x["set"] == name])
        if "dgxc" in groups:
            s, rows = groups["dgxc"]
            for prec in ("BF16", "FP8"):
                sub = [x for x in rows if f" {prec} " in x["label"]]
                groups[f"dgxc {prec}"] = ({"fitted": s["fitted"], "rows": len(sub), "expressible": None}, sub)
        # dense runs and context-parallel ones (cp > 1) apart, where a set has both
        for name in ("dgxc", "nemo", "nemo-24.07", "torchtitan"):
            if name not in groups:
                continue
            s, rows = groups[name]
            cp = [x for x in rows if int((re.search(r" cp(\d+)", x["label"]) or [0, "1"])[1]) > 1]
            if cp:
                dense = [x for x in rows if x not in cp]
                groups[f"{name} dense"] = ({"fitted": s["fitted"], "rows": len(dense), "expressible": None}, dense)
                groups[f"{name} CP"] = ({"fitted": s["fitted"], "rows": len(cp), "expressible": None}, cp)
        for name, (s, rows) in groups.items():
            pred = [x for x in rows if x.get("raw_s")]
            raw = stats([100 * (x["raw_s"] / x["measured_s"] - 1) for x in pred])
            cal = stats([100 * (x["cross_validated_s"] / x["measured_s"] - 1) for x in pred
                         if x.get("cross_validated_s")])
            mfu = max([m for x in pred for m in (x.get("mfu_percent") or []) if m == m] or [0.0])
            table[f"{cluster} / {name}"] = {
                "cluster": cluster, "set": name, "fitted": s["fitted"], "rows": s["rows"],
                "expressible": s.get("expressible"), "predicted": len(pred), "raw": raw,
                "calibrated": cal, "max_mfu_percent": mfu,
                "achievable_mfu_percent": ACHIEVABLE_MFU[cluster], "memory": memory(pred),
                "interval_coverage": coverage(pred, sigma_of)}
            if framework is None and name in r["sets"]:
                reported_ratios[f"{cluster} / {name}"] = [
                    x["memory"]["measured_gib"] / x["memory"]["comparable_gib"]
                    for x in pred if (x.get("memory") or {}).get("measured_gib")]
            if not s["fitted"]:
                # held out: runs beyond the range of the runs fitted on are extrapolations
                beyond = [x for x in pred if x.get("beyond_fitted_runs")]
                if framework is None and name in r["sets"]:
                    beyond_ratios.setdefault(name, []).extend(
                        x["measured_s"] / x["cross_validated_s"] for x in beyond if x.get("cross_validated_s"))
                inside = [x for x in pred if not x.get("beyond_fitted_runs")]
                err = lambda xs: stats([100 * (x["cross_validated_s"] / x["measured_s"] - 1)
                                        for x in xs if x.get("cross_validated_s")])
                table[f"{cluster} / {name}"]["beyond_fitted_runs"] = {
                    "runs": len(beyond), "calibrated": err(beyond), "inside_calibrated": err(inside)}
            if name.startswith("mpt") and pred:
                table[f"{cluster} / {name}"]["mosaicml_mfu"] = mosaic_mfu(ref, runs_csv, pred)
            if name in ("mpt", "torchtitan", "flagperf") and framework is None:
                split = attention_split(pred)
                if split:
                    table[f"{cluster} / {name}"]["attention_split"] = split
            paired = fp8_speedups(pred) if name in ("dgxc", "flagperf") else {}
            if paired:
                table[f"{cluster} / {name}"]["fp8_speedup"] = paired
            if name == "vtrain" and pred:
                table[f"{cluster} / {name}"]["monotone_floor"] = vtrain_monotone_floor(pred)
                table[f"{cluster} / {name}"]["decomposition"] = vtrain_decomposition(pred)
                table[f"{cluster} / {name}"]["cells"] = vtrain_cells(pred)
                table[f"{cluster} / {name}"]["composition"] = vtrain_composition(pred)
    head = f"{'cluster / set':46} {'rows':>5} {'expr':>5} {'pred':>5}  {'raw mean':>8} {'max':>6} {'bias':>7}  " \
           f"{'cal mean':>8} {'max':>6} {'bias':>7}  {'max MFU':>7}"
    print(head)
    for key, t in table.items():
        def cells(s):
            return f"{s['mean_abs_percent']:7.1f}% {s['max_abs_percent']:5.1f}% {s['bias_percent']:+6.1f}%" \
                if s else f"{'–':>8} {'–':>6} {'–':>7}"
        label = key + ("" if t["fitted"] else " (held out)")
        print(f"{label:46} {t['rows']:5d} {t['expressible'] if t['expressible'] is not None else '':>5} "
              f"{t['predicted']:5d}  {cells(t['raw'])}  {cells(t['calibrated'])}  {t['max_mfu_percent']:6.0f}%")
    print("calibrated: grouped cross-validation for the sets fitted on (leave one model family out), "
          "the fitted runtime for held-out sets, and on " + ", ".join(CHECKED) + " the calibration "
          "predict composes under (its file borrows one); raw: the cluster's defaults")
    print("runs inside predict's 80 % interval (its runtime part, exp(±1.28 σ), σ from the fit's "
          "cross-validated error, or the extrapolation band where a run lies beyond the runs fitted "
          "on; about 80 % where the interval is honest):")
    for key, t in table.items():
        c = t.get("interval_coverage")
        if c:
            label = key + ("" if t["fitted"] else " (held out)")
            sigmas = ", ".join(f"{100 * s:.1f}" for s in c["sigma_log"])
            beyond = f"; {c['beyond_fitted_runs']} beyond the fitted runs: the band" if c["beyond_fitted_runs"] else ""
            print(f"  {label:55} {c['inside_percent']:4.0f} % of {c['runs']:4d} (σ {sigmas} %{beyond})")
    print("held-out runs beyond the range of the runs fitted on (GPUs, nodes, model size, sequence, "
          "parallel degrees, type: what predict warns about), calibrated mean |error| beyond / inside:")
    for key, t in table.items():
        b = t.get("beyond_fitted_runs")
        if b and b["runs"]:
            mean = lambda st: f"{st['mean_abs_percent']:.1f} %" if st else "–"
            print(f"  {key:44} {b['runs']:4d} of {t['predicted']:4d}: {mean(b['calibrated'])} / "
                  f"{mean(b['inside_calibrated'])}")
    extrapolation = measured_band(beyond_ratios)
    reported_peak = measured_band(reported_ratios)
    if extrapolation:
        low, median, high = extrapolation["band"]
        tail = 100 * extrapolation["tail"]
        p10_p90 = extrapolation["p10_p90"]
        print(f"  measured / predicted on those runs (sets with {MIN_RUNS_IN_A_BAND} or more, each weighing the same): "
              f"p{tail:g} {low:.3f}, median {median:.3f}, p{100 - tail:g} {high:.3f} (in the code, "
              f"EXTRAPOLATION_BAND and _MEDIAN: {EXTRAPOLATION[0]}, {EXTRAPOLATION[1]}, {EXTRAPOLATION[2]}), "
              f"the tails at which each set left out falls inside the other sets' band 80 % of the time "
              f"on average (p10–p90, {p10_p90['band'][0]:.3f}–{p10_p90['band'][2]:.3f}, would hold "
              f"{p10_p90['left_out_coverage_percent']:.0f} %); " + left_out_text(extrapolation))
    for key, t in table.items():
        m, f = t.get("mosaicml_mfu"), t.get("monotone_floor")
        if m:
            print(f"{key}: predicted MFU above MosaicML's reported + 10 points in {m['over_reported_plus_10'][0]} "
                  f"(raw) and {m['over_reported_plus_10'][1]} (calibrated) of {m['runs']} runs; largest excess "
                  f"{m['max_excess_points'][0]:.1f} / {m['max_excess_points'][1]:.1f} points"
                  + (f" (calibrated: {w['label']}, reported {w['reported_mfu_percent']:.1f} %, predicted "
                     f"{w['predicted_mfu_percent']:.1f} %, its step {w['error_percent']:+.1f} %)"
                     if (w := m["largest_excess"][1]) and m["over_reported_plus_10"][1] else ""))
        a = t.get("attention_split")
        if a:
            print(f"{key}: raw error split between FlashAttention-2 and the rest ({a['runs']} runs, "
                  f"attention {100 * a['attention_share'][0]:.0f}–{100 * a['attention_share'][1]:.0f} % of "
                  f"the step): measured / raw = {a['rest_factor']:.2f} × rest + {a['attention_factor']:.2f} × "
                  f"attention leaves {a['refitted']['mean_abs_percent']:.1f} % mean |error| (max "
                  f"{a['refitted']['max_abs_percent']:.1f}) where raw is {a['raw']['mean_abs_percent']:.1f} % "
                  f"(bias {a['raw']['bias_percent']:+.1f})")
        if t.get("decomposition"):
            print(f"{key}: step = per-step part + micro-batches × per-micro-batch part (calibrated) — "
                  + "; ".join(f"tp {tp}: per micro-batch {d['per_micro_batch_mean_abs_percent']:.1f} % "
                              f"off ({d['groups']} groups), per step at pp 1 "
                              f"{d['per_step_pp1_median_ms'][0]:.1f} ms measured / "
                              f"{d['per_step_pp1_median_ms'][1]:.1f} ms predicted (medians)"
                              for tp, d in t["decomposition"].items()))
            print(f"{key}: per micro-batch = outside the layers + layers per stage × per layer "
                  "(calibrated, medians, measured / predicted) — "
                  + "; ".join(f"tp {tp}: per layer {d['per_layer_median_ms'][0]:.2f} / "
                              f"{d['per_layer_median_ms'][1]:.2f} ms, outside the layers "
                              f"{d['outside_layers_median_ms'][0]:.1f} / "
                              f"{d['outside_layers_median_ms'][1]:.1f} ms"
                              for tp, d in t["decomposition"].items()))
        c = t.get("composition")
        if c:
            print(f"{key}: the rows compose timings — each step is a per-step part + micro-batches × a "
                  f"per-micro-batch part to within {c['max_residual_percent']:.4f} % ({c['groups_checked']} groups "
                  "measured at three micro-batch counts or more), the per-micro-batch part "
                  f"the same at every data-parallel degree (spread {c['per_micro_batch_spread_across_dp_ms']:.4f} "
                  f"ms): where the micro-batch count varies, {c['per_micro_batch_timings']} per-micro-batch and "
                  f"{c['per_step_timings']} per-step timings")
            mean = lambda st: f"{st['mean_abs_percent']:.1f} % (max {st['max_abs_percent']:.1f}, " \
                              f"bias {st['bias_percent']:+.1f})" if st else "–"  # noqa: E731
            print(f"{key}: calibrated mean |error| with the per-step part as measured "
                  f"{mean(c['with_measured_per_step'])}, with the per-micro-batch part as measured "
                  f"{mean(c['with_measured_per_micro_batch'])}")
            m, p = c["per_step_dp1_us_per_million_params_and_ms"]
            if m and p:
                print(f"{key}: per-step part at pp 1, dp 1 against the parameters a GPU holds — measured "
                      f"{m[0]:.1f} µs per million + {m[1]:.1f} ms, predicted {p[0]:.1f} µs per million + "
                      f"{p[1]:.1f} ms")
        c = t.get("cells")
        if c and c["mean_abs_percent_within_cells"] is not None:
            print(f"{key}: one bias per layer shape (tp, micro-batch size, width: {c['cells']} cells) "
                  f"carries most of the error — {c['mean_abs_percent_within_cells']:.1f} % mean |error| "
                  "left within the cells; largest cell biases "
                  + ", ".join(f"tp {w['tp']} mbs {w['micro_batch']} h {w['hidden']} {w['mean_percent']:+.1f} %"
                              for w in c["worst_cells"]))
        if t.get("fp8_speedup"):
            print(f"{key}: fp8 over bf16, same layout and software (step-time ratio, mean) — "
                  + "; ".join(f"{fam}: {d['measured']:.3f} measured, {d['raw']:.3f} raw, "
                              f"{d['calibrated']:.3f} calibrated ({d['pairs']} pairs)"
                              for fam, d in t["fp8_speedup"].items()))
        if f:
            print(f"{key}: {f['violating_pairs']} ordered pairs of runs where one does at least the other's "
                  f"work yet ran faster; no predictor monotone in work can keep its max |error| below "
                  f"{f['min_max_abs_percent']:.1f} %")
            a = f["across_widths"]
            if a["worst_pair"]:
                more, t_more, less, t_less = a["worst_pair"]
                print(f"{key}: across widths too (the wider model runs as many kernels, each on larger "
                      f"operands): {a['violating_pairs']} pairs, max |error| floor "
                      f"{a['min_max_abs_percent']:.1f} % (worst: {more} in {t_more:.3f} s against "
                      f"{less} in {t_less:.3f} s)")
    print("memory projection on runs that ran (projected OOM: each wrong; reported peaks compared in "
          "their scope: torchtitan's PyTorch reserved memory, FlagPerf's device memory):")
    for key, t in table.items():
        m = t["memory"]
        if m["projected_oom"] or m["reported"]:
            rep = m["reported"]
            print(f"  {key:44} projected OOM {m['projected_oom']:3d} of {m['runs']:4d}"
                  + (f"; {rep['runs']} reported a peak: {rep['mean_abs_percent']:.1f} % mean |error|, "
                     f"max {rep['max_abs_percent']:.1f} %, bias {rep['bias_percent']:+.1f} %" if rep else ""))
    if reported_peak:
        low, median, high = reported_peak["band"]
        tail = 100 * reported_peak["tail"]
        print(f"  reported / projected peak (sets with {MIN_RUNS_IN_A_BAND} or more reported, each weighing the "
              f"same): p{tail:g} {low:.3f}, median {median:.3f}, p{100 - tail:g} {high:.3f} (in the code, "
              f"REPORTED_PEAK_BAND and _MEDIAN: {REPORTED_PEAK[0]}, {REPORTED_PEAK[1]}, {REPORTED_PEAK[2]}); "
              + left_out_text(reported_peak))
    twins = cross_set_twins(runs_csv)
    for t in twins:
        spans = {k: (min(v), max(v)) for k, v in t["measured_s"].items()}
        means = {k: sum(v) / len(v) for k, v in t["measured_s"].items()}
        print(f"{t['cluster']}: {t['family']} ({t['layout']}) measured by two sets: "
              + "; ".join(f"{k} {a:.2f}–{b:.2f} s" for k, (a, b) in spans.items())
              + f" ({100 * (max(means.values()) / min(means.values()) - 1):.0f} % apart)")
    if json_out:
        json.dump({**table, "cross_set_twins": twins, "extrapolation_band": extrapolation,
                   "reported_peak_band": reported_peak}, open(json_out, "w"), indent=1)
    if thresholds:
        limits = json.load(open(thresholds))
        failed = []
        for key, limit in limits.items():
            # "memory: <set>" bounds the memory projection's mean |error| on reported peaks,
            # "projected OOM: <set>" the runs it says do not fit (no slack: a count)
            kind, _, name = key.rpartition(": ")
            t = table.get(name)
            if kind == "memory":
                rep = t and t["memory"]["reported"]
                if not rep:
                    failed.append(f"{key}: no reported peaks to compare (was {limit:.1f} %)")
                elif rep["mean_abs_percent"] > limit + 1.0:
                    failed.append(f"{key}: memory mean |error| {rep['mean_abs_percent']:.1f} % > "
                                  f"threshold {limit:.1f} % + 1")
                continue
            if kind == "projected OOM":
                if t is None or t["memory"]["projected_oom"] > limit:
                    failed.append(f"{key}: {t and t['memory']['projected_oom']} runs that ran projected "
                                  f"OOM > threshold {limit:.0f}")
                continue
            if t is None or t["calibrated"] is None:
                failed.append(f"{key}: no calibrated figure (was {limit:.1f} %)")
            elif t["calibrated"]["mean_abs_percent"] > limit + 1.0:
                failed.append(f"{key}: calibrated mean |error| {t['calibrated']['mean_abs_percent']:.1f} % "
                              f"> threshold {limit:.1f} % + 1")
        for key, t in table.items():
            if t["max_mfu_percent"] > t["achievable_mfu_percent"] + 1e-6:
                failed.append(f"{key}: a prediction's MFU {t['max_mfu_percent']:.1f} % exceeds the "
                              f"achievable {t['achievable_mfu_percent']:.0f} %")
        # the band predict's interval spans beyond the fitted runs must be the measured one
        if extrapolation is None:
            failed.append("extrapolation band: fewer than two held-out sets with runs beyond their "
                          "calibration's range")
        elif any(abs(m - c) > 0.05 for m, c in zip(extrapolation["band"], EXTRAPOLATION)):
            failed.append(f"extrapolation band: the code's {EXTRAPOLATION} (EXTRAPOLATION_BAND, _MEDIAN in "
                          f"src/predict/mod.rs) is not the measured "
                          f"{tuple(round(b, 3) for b in extrapolation['band'])}: set them to it")
        # and the band `memory` puts around a projected peak the measured one
        if reported_peak is None:
            failed.append("reported-peak band: fewer than two sets with 5 or more reported peaks")
        elif any(abs(m - c) > 0.05 for m, c in zip(reported_peak["band"], REPORTED_PEAK)):
            failed.append(f"reported-peak band: the code's {REPORTED_PEAK} (REPORTED_PEAK_BAND, _MEDIAN in "
                          f"src/memory/mod.rs) is not the measured "
                          f"{tuple(round(b, 3) for b in reported_peak['band'])}: set them to it")
        if failed:
            print("\nACCURACY GATE FAILED:\n  " + "\n  ".join(failed))
            sys.exit(1)
        print(f"\naccuracy gate passed ({len(limits)} thresholds, {thresholds})")


if __name__ == "__main__":
    main()

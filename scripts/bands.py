"""Bands of measured / predicted step time that `predict`'s interval spans where no fit's own
error applies — the roofline's (`scripts/roofline-band.py`) and the one beyond a calibration's
runs (`scripts/eval-real-runs.py`) — measured the same way: percentiles (the 10th, 50th and
90th, or a wider pair where a band must hold groups it was not measured on) over groups of
runs, each group weighing the same, and compared with the constants in the code."""

import re
import sys
from pathlib import Path


def weighted_quantile(weighted: list, p: float) -> float:
    """The value at cumulative weight p of sorted (value, weight) pairs whose weights sum to 1."""
    total = 0.0
    for value, weight in weighted:
        total += weight
        if total >= p - 1e-12:
            return value
    return weighted[-1][0]


def pooled_band(ratios_by_group: dict, tail: float = 0.1) -> tuple:
    """(p[tail], median, p[1 - tail]) of the ratios of every group, each group weighing the
    same: p10, median, p90 by default."""
    pooled = sorted((r, 1.0 / (len(v) * len(ratios_by_group)))
                    for v in ratios_by_group.values() for r in v)
    return tuple(weighted_quantile(pooled, p) for p in (tail, 0.5, 1.0 - tail))


def left_out_coverage(ratios_by_group: dict, tail: float) -> dict:
    """Each group left out in turn: the band of the others at `tail` and how many of its
    ratios it holds, percent."""
    out = {}
    for name, ratios in ratios_by_group.items():
        low, _, high = pooled_band({k: v for k, v in ratios_by_group.items() if k != name}, tail)
        inside = sum(low <= r <= high for r in ratios)
        out[name] = {"others_band": [low, high], "inside_percent": 100 * inside / len(ratios)}
    return out


def honest_tail(ratios_by_group: dict, target_percent: float) -> float:
    """The narrowest symmetric band's tail (0.10, 0.095, … 0: p10–p90 down to the whole range)
    whose left-out coverage — each group held by the band of the others, averaged over the
    groups — reaches `target_percent`: a band that claims 80 % holds 80 % of a group it never
    saw, which the pooled p10–p90 need not when groups differ."""
    tails = [round(0.1 - 0.005 * i, 3) for i in range(21)]
    for tail in tails:
        cover = left_out_coverage(ratios_by_group, tail)
        if sum(c["inside_percent"] for c in cover.values()) / len(cover) >= target_percent:
            return tail
    return tails[-1]


def band_in_code(source: Path, band: str, median: str) -> tuple:
    """(p10, median, p90) as the constants `band: (f64, f64)` and `median: f64` of a Rust source."""
    text = source.read_text()
    b = re.search(band + r": \(f64, f64\) = \(([0-9.]+), ([0-9.]+)\)", text)
    m = re.search(median + r": f64 = ([0-9.]+);", text)
    if not b or not m:
        sys.exit(f"error: {band} or {median} not found in {source}")
    return float(b.group(1)), float(m.group(1)), float(b.group(2))

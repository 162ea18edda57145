"""Bands of measured / predicted step time that `predict`'s interval spans where no fit's own
error applies — the roofline's (`scripts/roofline-band.py`) and the one beyond a calibration's
runs (`scripts/eval-real-runs.py`) — measured the same way: the 10th, 50th and 90th percentile
over groups of runs, each group weighing the same, and compared with the constants in the code."""

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


def pooled_band(ratios_by_group: dict) -> tuple:
    """(p10, median, p90) of the ratios of every group, each group weighing the same."""
    pooled = sorted((r, 1.0 / (len(v) * len(ratios_by_group)))
                    for v in ratios_by_group.values() for r in v)
    return tuple(weighted_quantile(pooled, p) for p in (0.1, 0.5, 0.9))


def band_in_code(source: Path, band: str, median: str) -> tuple:
    """(p10, median, p90) as the constants `band: (f64, f64)` and `median: f64` of a Rust source."""
    text = source.read_text()
    b = re.search(band + r": \(f64, f64\) = \(([0-9.]+), ([0-9.]+)\)", text)
    m = re.search(median + r": f64 = ([0-9.]+);", text)
    if not b or not m:
        sys.exit(f"error: {band} or {median} not found in {source}")
    return float(b.group(1)), float(m.group(1)), float(b.group(2))

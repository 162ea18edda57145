#!/usr/bin/env python3
"""How far the roofline alone is off on published runs: the band `ROOFLINE_BAND` of
src/predict/cost.rs comes from here.

    python3 -B scripts/roofline-band.py STEPCAST RUNS.csv [--check]

RUNS.csv is what `scripts/import-runs.py ../shared/reference-data OUT` writes (OUT/runs.csv, its
architectures beside it). For each NVIDIA cluster with published runs, a copy of its cluster file
without `models:` (every kernel from the roofline at the file's efficiencies, every collective
from the analytic network model, the cluster's default runtime: what a cluster nobody measured
gets) is written to a private temporary directory, its runs pointed at it, and `stepcast
calibrate --check` predicts them. Printed: per cluster and pooled (each cluster weighing the
same), the 10th, 50th and 90th percentile of measured / predicted step time. With --check, exit 1
where the pooled 10th or 90th percentile or the median is more than 0.05 from `ROOFLINE_BAND` or
`ROOFLINE_MEDIAN` in the code (the band `predict`'s interval gives the roofline, and the figure
it prints for a cluster without models, must be the ones the runs show).
"""

import csv
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from bands import band_in_code, pooled_band, weighted_quantile

CLUSTERS = ["dgx-h100", "dgx-a100", "dgx-a100-40gb", "grand-teton-h100"]


def without_models(text: str, name: str) -> str:
    """The cluster file with its `models:` section (and the comments inside it) left out."""
    out, skipping = [], False
    for line in text.split("\n"):
        if line.startswith("models:"):
            skipping = True
            continue
        if skipping and (line.startswith((" ", "#")) or line == ""):
            continue
        skipping = False
        out.append(line)
    return "\n".join(out).replace(f"name: {name}", f"name: {name}-roofline", 1)


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--check"]
    check = "--check" in sys.argv[1:]
    if len(args) != 2:
        sys.exit(__doc__)
    stepcast, runs_csv = args[0], Path(args[1]).resolve()
    repo = Path(__file__).resolve().parent.parent
    rows = list(csv.DictReader(open(runs_csv, newline="")))
    if not rows:
        sys.exit(f"error: {runs_csv} holds no runs")
    by_cluster = {}
    with tempfile.TemporaryDirectory(prefix="stepcast-roofline-") as tmp:
        tmp = Path(tmp)
        for name in CLUSTERS:
            cluster = tmp / f"{name}-roofline.yaml"
            cluster.write_text(without_models((repo / "hardware-profiles" / f"{name}.yaml").read_text(), name))
            mine = tmp / f"{name}-runs.csv"
            with open(mine, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=rows[0].keys())
                w.writeheader()
                for r in rows:
                    if r["cluster"] != name:
                        continue
                    r = dict(r, cluster=str(cluster))
                    if r["model"].startswith("archs/"):
                        r["model"] = str(runs_csv.parent / r["model"])
                    w.writerow(r)
            report = tmp / f"{name}.json"
            subprocess.run([stepcast, "calibrate", str(mine), "--cluster", str(cluster), "--check",
                            "--json", str(report)], check=True, stdout=subprocess.DEVNULL)
            ratios = sorted(r["measured_s"] / r["cross_validated_s"]
                            for r in json.load(open(report))["runs"] if r.get("cross_validated_s"))
            if not ratios:
                sys.exit(f"error: no run of {name} was predicted")
            mine_w = [(v, 1.0 / len(ratios)) for v in ratios]
            print(f"{name:18s} {len(ratios):5d} runs  measured / predicted: p10 "
                  f"{weighted_quantile(mine_w, 0.1):.3f}  median {weighted_quantile(mine_w, 0.5):.3f}  p90 "
                  f"{weighted_quantile(mine_w, 0.9):.3f}  (min {ratios[0]:.3f}, max {ratios[-1]:.3f})")
            by_cluster[name] = ratios
    measured = pooled_band(by_cluster)
    runs = sum(len(v) for v in by_cluster.values())
    print(f"{'pooled':18s} {runs:5d} runs  measured / predicted: p10 {measured[0]:.3f}  "
          f"median {measured[1]:.3f}  p90 {measured[2]:.3f}  (each cluster weighing the same)")
    if check:
        code = band_in_code(repo / "src/predict/cost.rs", "ROOFLINE_BAND", "ROOFLINE_MEDIAN")
        if any(abs(m - c) > 0.05 for m, c in zip(measured, code)):
            sys.exit(f"error: the roofline's band and median in src/predict/cost.rs, {code}, are not the "
                     f"measured {tuple(round(m, 3) for m in measured)}: set ROOFLINE_BAND and "
                     f"ROOFLINE_MEDIAN to them")
        print(f"the band and median in the code, {code}, are the measured ones (within 0.05)")


if __name__ == "__main__":
    main()

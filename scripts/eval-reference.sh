#!/usr/bin/env bash
# Accuracy and speed of stepcast's learned models on the public reference data (never copied into
# the repository): imports each release, trains a cluster from it (timed), and evaluates on the
# random 80/20 split and the two hold-out splits. Prints figures; fails loudly if the data is
# missing. Usage: scripts/eval-reference.sh [out-dir]   (STEPCAST_REFERENCE_DATA overrides the
# default ../shared/reference-data)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ref=${STEPCAST_REFERENCE_DATA:-$root/../shared/reference-data}
out=${1:-$(mktemp -d)}
bin=$root/target/release/stepcast

if [ ! -d "$ref/estimate-train-time-2509.22832" ] || [ ! -d "$ref/aiconfigurator-perf-db" ]; then
  echo "error: reference data not found under $ref (set STEPCAST_REFERENCE_DATA)" >&2
  exit 1
fi
[ -x "$bin" ] || cargo build --release --manifest-path "$root/Cargo.toml"

if [ -n "$(ls -A "$out" 2>/dev/null)" ]; then
  echo "error: $out is not empty; give a new directory" >&2
  exit 2
fi
mkdir -p "$out"
echo "== importing into $out"
"$bin" datasets import --format estimate-train-time "$ref/estimate-train-time-2509.22832" \
  --system Perlmutter --out "$out/ds-perlmutter" >/dev/null
"$bin" datasets import --format estimate-train-time "$ref/estimate-train-time-2509.22832" \
  --system Vista --out "$out/ds-vista" >/dev/null
"$bin" datasets import --format aiconfigurator "$ref/aiconfigurator-perf-db" \
  --system h100_sxm --out "$out/ds-h100" >/dev/null
"$bin" datasets import --format aiconfigurator "$ref/aiconfigurator-perf-db" \
  --system a100_sxm --out "$out/ds-a100" >/dev/null
"$bin" datasets import --format aiconfigurator "$ref/aiconfigurator-perf-db" \
  --system h200_sxm --out "$out/ds-h200" >/dev/null

for cluster in perlmutter vista h100 a100 h200; do
  echo
  echo "== $cluster: training (time of all models of the cluster)"
  start=$(date +%s%N)
  "$bin" train "$out/ds-$cluster" --out "$out/models-$cluster" --quiet | tail -n 1
  end=$(date +%s%N)
  echo "wall time: $(( (end - start) / 1000000 )) ms"
  for split in random holdout-largest-hidden holdout-longest-seq; do
    echo
    echo "== $cluster: eval --split $split"
    "$bin" eval "$out/models-$cluster" "$out/ds-$cluster" --split "$split"
    "$bin" eval "$out/models-$cluster" "$out/ds-$cluster" --split "$split" --json \
      > "$out/eval-$cluster-$split.json"
  done
done

# our own collection of one GPU: its GEMMs and attention trained as the shipped models are, and
# evaluated on a random 20 %; then NVIDIA's inference-kernel models of that GPU on it (no refit)
ours() {
  local name=$1 data=$2 nvidia=$3
  echo
  echo "== $name: GEMMs and attention trained from the committed collection ($data)"
  "$bin" train "$data" --operators gemm,flash_attention --out "$out/models-$name" --quiet | tail -n 1
  "$bin" eval "$out/models-$name" "$data" --split random
  echo
  echo "== the $name collection against NVIDIA's inference-kernel models (no refit)"
  "$bin" eval "$root/models/$nvidia" "$data" --split none
}
h100="$root/datasets/h100-sxm/2026-11-27-spin"
h200="$root/datasets/h200-sxm/2026-11-27"
ours h100-sxm "$h100" h100-aiconfigurator
ours h200-sxm "$h200" h200-aiconfigurator

echo
echo "== transfer between our two Hopper collections, every kind (no refit; the roofline's ratio)"
"$bin" train "$h100" --out "$out/models-h100-sxm-all" --quiet | tail -n 1
"$bin" train "$h200" --out "$out/models-h200-sxm-all" --quiet | tail -n 1
"$bin" eval "$out/models-h100-sxm-all" "$h200" --split none
"$bin" eval "$out/models-h200-sxm-all" "$h100" --split none

echo
echo "== shipped models reproduce from the data (same seed, same recipe choice)"
python3 "$root/scripts/compare-manifests.py" "$root/models/perlmutter/manifest.json" \
  "$out/models-perlmutter/manifest.json"
python3 "$root/scripts/compare-manifests.py" "$root/models/vista/manifest.json" \
  "$out/models-vista/manifest.json"
python3 "$root/scripts/compare-manifests.py" "$root/models/h100-aiconfigurator/manifest.json" \
  "$out/models-h100/manifest.json"
python3 "$root/scripts/compare-manifests.py" "$root/models/h100-sxm/manifest.json" \
  "$out/models-h100-sxm/manifest.json"
python3 "$root/scripts/compare-manifests.py" "$root/models/h200-sxm/manifest.json" \
  "$out/models-h200-sxm/manifest.json"
python3 "$root/scripts/compare-manifests.py" "$root/models/a100-aiconfigurator/manifest.json" \
  "$out/models-a100/manifest.json"
python3 "$root/scripts/compare-manifests.py" "$root/models/h200-aiconfigurator/manifest.json" \
  "$out/models-h200/manifest.json"

echo
echo "== the paper's bundled example (Llemma-7B, Perlmutter), component by component"
python3 "$root/scripts/compare-paper-example.py" "$bin" "$ref"

echo
echo "== published end-to-end runs: raw and calibrated (grouped cross-validation), the accuracy gate"
python3 "$root/scripts/eval-real-runs.py" "$bin" "$ref" --json "$out/real-runs.json" \
  --check "$root/scripts/real-runs-thresholds.json"

echo
echo "== the roofline alone on the same runs (models removed, no calibration): its band in predict's interval"
python3 "$root/scripts/import-runs.py" "$ref" "$out/runs" >/dev/null
python3 "$root/scripts/roofline-band.py" "$bin" "$out/runs/runs.csv" --check

echo
echo "== a warm predict, timed as a whole process (median of 30)"
python3 - "$bin" "$root" <<'PY'
import statistics, subprocess, sys, time
binary, root = sys.argv[1], sys.argv[2]
cmd = [binary, "predict", "--cluster", f"{root}/hardware-profiles/perlmutter.yaml", "--model", "llemma-7b",
       "--tp", "2", "--pp", "4", "--dp", "2", "--micro-batch", "4", "--micro-batches", "8"]
for _ in range(3):
    subprocess.run(cmd, check=True, capture_output=True)
times = []
for _ in range(30):
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    times.append((time.perf_counter() - start) * 1e3)
print(f"median {statistics.median(times):.1f} ms, min {min(times):.1f} ms, max {max(times):.1f} ms")
PY

echo
echo "== one operator query (µs)"
cargo bench --quiet --manifest-path "$root/Cargo.toml" --bench predict 2>/dev/null | tail -n 8

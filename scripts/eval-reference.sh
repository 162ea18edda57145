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

mkdir -p "$out"
echo "== importing into $out"
"$bin" datasets import --format estimate-train-time "$ref/estimate-train-time-2509.22832" \
  --system Perlmutter --out "$out/ds-perlmutter" >/dev/null
"$bin" datasets import --format estimate-train-time "$ref/estimate-train-time-2509.22832" \
  --system Vista --out "$out/ds-vista" >/dev/null
"$bin" datasets import --format aiconfigurator "$ref/aiconfigurator-perf-db" \
  --system h100_sxm --out "$out/ds-h100" >/dev/null

for cluster in perlmutter vista h100; do
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

echo
echo "== shipped models reproduce from the data (same seed, same recipe choice)"
for cluster in perlmutter vista; do
  python3 "$root/scripts/compare-manifests.py" "$root/models/$cluster/manifest.json" \
    "$out/models-$cluster/manifest.json"
done

echo
echo "== one operator query (µs)"
cargo bench --quiet --manifest-path "$root/Cargo.toml" --bench predict 2>/dev/null | tail -n 8

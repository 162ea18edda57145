#!/usr/bin/env bash
# Refits the calibrations shipped beside the models (models/*/calibration.yaml) from the public
# runs, as the README's "Shipped calibrations" lists them — after a change to the physics the
# runtime composes with, so predict applies parameters fitted under the model it runs.
#   scripts/calibrate-shipped.sh STEPCAST REFERENCE_DATA
# Writes each entry in place (calibrate replaces its cluster's and framework's entry); the runs
# are imported into a new temporary directory, removed afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -eq 2 ]] || { echo "usage: $0 STEPCAST REFERENCE_DATA" >&2; exit 2; }
stepcast=$(realpath "$1") ref=$2 repo=$PWD
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -B scripts/import-runs.py "$ref" "$work/runs" >/dev/null
fit() { # cluster, sets, [framework]
    local framework=()
    [[ $# -eq 3 ]] && framework=(--framework "$3")
    echo "== $1 ${3:-} on $2"
    # from the work directory, so the calibration records the runs as runs/runs.csv
    (cd "$work" && "$stepcast" calibrate runs/runs.csv --cluster "$repo/hardware-profiles/$1.yaml" \
        --fit-sets "$2" "${framework[@]}" | grep -E '^(all|fitted)')
}
fit dgx-a100 vtrain,flagperf
fit dgx-h100 dgxc,nemo
fit grand-teton-h100 torchtitan
fit dgx-a100 mpt composer
fit dgx-a100-40gb mpt composer
fit dgx-h100 mpt composer

#!/usr/bin/env bash
# Re-validates a GPU node's models after a driver (or CUDA/NCCL) update.
#
# Run it from a systemd timer (scripts/systemd/) or cron on one node of the cluster. It does
# nothing while the software stamp it saw last is unchanged; after an update it runs
# `stepcast models check` (software stamp + a probe: the models' dataset's own points against
# the times it measured, given that dataset, or else the quick probe against the models), and
# when the models drifted it either retrains them (STEPCAST_AUTO_RETRAIN=1) or says how to.
#
# Configuration (environment):
#   STEPCAST_CLUSTER       cluster file whose models to check (required)
#   STEPCAST_STATE_DIR     where the last-seen stamp and the reports go
#                          (default: ${XDG_STATE_HOME:-$HOME/.local/state}/stepcast)
#   STEPCAST_THRESHOLD     drift in percent that counts (default 10)
#   STEPCAST_AUTO_RETRAIN  1: on drift, run `stepcast retrain` into STEPCAST_DATASETS
#   STEPCAST_DATASETS      parent directory of new datasets (default: datasets/<gpu>/ under the
#                          current directory)
#   STEPCAST_PREVIOUS      dataset the current models came from: check probes its points, and a
#                          retrain keeps its rows of undrifted kinds (without it the check compares
#                          with the models and a retrain re-collects every kind). After a retrain
#                          this script ran, the new dataset (recorded in STATE_DIR/models-dataset)
#                          takes its place: remove that file when you retrain by hand.
#   STEPCAST               the stepcast executable (default: stepcast on PATH)
#   STEPCAST_EXTRA_ARGS    extra arguments for check and retrain (e.g. "--gpus 0,1,2,3")
#   NVIDIA_SMI             the nvidia-smi executable (default: nvidia-smi on PATH)
#
# Exit status: 0 nothing to do or no drift (the retrain's own probe included), 3 drift found and
# not retrained, 4 retrained,
# anything else an error (the stamp is not recorded, so the next run tries again).
set -euo pipefail

: "${STEPCAST_CLUSTER:?set STEPCAST_CLUSTER to the cluster file whose models to check}"
state_dir=${STEPCAST_STATE_DIR:-${XDG_STATE_HOME:-$HOME/.local/state}/stepcast}
threshold=${STEPCAST_THRESHOLD:-10}
stepcast=${STEPCAST:-stepcast}
smi=${NVIDIA_SMI:-nvidia-smi}
read -r -a extra <<<"${STEPCAST_EXTRA_ARGS:-}"

mkdir -p "$state_dir"
exec 9>"$state_dir/lock"
if ! flock -n 9; then
    echo "another check is running (lock $state_dir/lock)" >&2
    exit 0
fi

# The stamp: driver version and the CUDA version the driver supports, per GPU model.
stamp=$("$smi" --query-gpu=name,driver_version --format=csv,noheader | sort -u)
cuda=$("$smi" | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | sed -n 1p)
stamp="$stamp; CUDA $cuda"
last_file="$state_dir/last-stamp"
if [[ -f $last_file && "$(cat "$last_file")" == "$stamp" ]]; then
    exit 0
fi

# The dataset the models came from: this script's last retrain's, else STEPCAST_PREVIOUS.
models_dataset_file="$state_dir/models-dataset"
models_dataset=${STEPCAST_PREVIOUS:-}
[[ -f $models_dataset_file ]] && models_dataset=$(cat "$models_dataset_file")
previous=()
[[ -n $models_dataset ]] && previous=(--previous "$models_dataset")

day=$(date -u +%Y-%m-%d)
report="$state_dir/check-$day.json"
echo "software changed: '$(cat "$last_file" 2>/dev/null || echo none)' -> '$stamp'; checking the models"
set +e
"$stepcast" models check --cluster "$STEPCAST_CLUSTER" --threshold "$threshold" --json \
    --out "$state_dir/probe-$day-$$" "${previous[@]}" "${extra[@]}" >"$report"
code=$?
set -e
case $code in
0)
    echo "no drift past ${threshold}% (report: $report)"
    echo "$stamp" >"$last_file"
    exit 0
    ;;
3) ;;
*)
    echo "stepcast models check failed with exit status $code (report: $report)" >&2
    exit "$code"
    ;;
esac

if [[ ${STEPCAST_AUTO_RETRAIN:-0} != 1 ]]; then
    echo "the models drifted past ${threshold}% (report: $report); retrain with:"
    echo "  $stepcast retrain --cluster $STEPCAST_CLUSTER --threshold $threshold ${previous[*]} --out <new dataset dir>"
    exit 3
fi
gpu=$("$smi" --query-gpu=name --format=csv,noheader | sed -n 1p | tr 'A-Z ' 'a-z-')
out="${STEPCAST_DATASETS:-datasets/$gpu}/$day"
"$stepcast" retrain --cluster "$STEPCAST_CLUSTER" --threshold "$threshold" --out "$out" \
    "${previous[@]}" "${extra[@]}"
echo "$stamp" >"$last_file"
if [[ ! -f $out/meta.yaml ]]; then
    # retrain probes again first: nothing past the threshold this time, nothing written
    echo "the retrain's own probe found no drift past ${threshold}%: the models are kept"
    exit 0
fi
echo "$(cd "$out" && pwd)" >"$models_dataset_file"
echo "retrained from $out"
exit 4

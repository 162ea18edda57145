#!/usr/bin/env bash
# Kill tests: SIGKILL the `stepcast bench collect` wrapper, the `stepcast-bench` collector and
# `stepcast train` at random moments, N times each (default 20), then check that nothing was lost
# or duplicated and that no models directory is left in a state a prediction accepts but that
# mixes two trainings.
#
#   scripts/kill-tests.sh [N]        (builds the release binaries if needed; needs python3)
#
# Collections use the mock device (a test double) with a delay per point so that the kills land
# mid-collection; the reference is the same plan collected without interruption. Prints one line
# per check and a summary; exits 1 if any check failed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
n=${1:-20}
bin=$root/target/release/stepcast
bench=$root/target/release/stepcast-bench
[[ -x $bin && -x $bench ]] || cargo build --release --workspace --manifest-path "$root/Cargo.toml"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
check() { # check NAME COMMAND...: prints ok or FAILED
  if "${@:2}"; then echo "ok      $1"; else echo "FAILED  $1"; failed=1; fi
}

# a random delay in [lo, hi) seconds
pause() { python3 -c "import random, time; time.sleep(random.uniform($1, $2))"; }

echo "== reference: the quick plan collected without interruption"
"$bench" collect --device mock --quick --quiet --out "$work/reference" >/dev/null 2>&1
rows=$(python3 - "$work/reference" <<'PY'
import glob, sys
print(sum(sum(1 for _ in open(f)) - 1 for f in glob.glob(sys.argv[1] + "/*.csv")))
PY
)
echo "   $rows rows"

# compare DIR with the reference: same rows (in any order), each once
same_rows() {
  python3 - "$work/reference" "$1" <<'PY'
import collections, glob, os, sys
ref, got = sys.argv[1], sys.argv[2]
def rows(d):
    out = collections.Counter()
    for f in sorted(glob.glob(d + "/*.csv")):
        lines = open(f).read().splitlines()
        for line in lines[1:]:
            out[(os.path.basename(f), line)] += 1
    return out
a, b = rows(ref), rows(got)
lost = sum((a - b).values())
dup = sum(c - 1 for c in b.values() if c > 1)
extra = sum((b - a).values()) - dup
print(f"   rows: {sum(b.values())} of {sum(a.values())}, lost {lost}, duplicated {dup}, other {extra}")
sys.exit(0 if lost == 0 and dup == 0 and extra == 0 else 1)
PY
}

kill_collector() { # kill_collector NAME COMMAND...: N kills of the command, resuming each time
  local name=$1 out=$work/$1
  shift
  local first=1
  for ((i = 1; i <= n; i++)); do
    local resume=()
    [[ $first == 1 ]] || resume=(--resume)
    "$@" collect --device mock --quick --quiet --mock-point-ms 4 --out "$out" "${resume[@]}" \
      >/dev/null 2>&1 &
    local pid=$!
    pause 0.05 0.6
    kill -9 $pid 2>/dev/null || true
    wait $pid 2>/dev/null || true
    first=0
  done
  # the process is gone: no collector of ours is left writing
  "$@" collect --device mock --quick --quiet --out "$out" --resume >/dev/null 2>&1
  check "$name: $n SIGKILLs, then --resume completes without losing or repeating a row" same_rows "$out"
  check "$name: the dataset loads (no torn or repeated row)" \
    bash -c "'$bin' datasets show '$out' >/dev/null"
}

echo "== SIGKILL of the collector (stepcast-bench), $n times"
kill_collector collector "$bench"
echo "== SIGKILL of the wrapper (stepcast bench), $n times"
kill_collector wrapper "$bin" bench

echo "== two collectors on one directory"
"$bench" collect --device mock --quick --quiet --mock-point-ms 20 --out "$work/two" >/dev/null 2>&1 &
pid=$!
sleep 0.3
second=$("$bench" collect --device mock --quick --quiet --out "$work/two" --resume 2>&1 || true)
check "a second collector on the same --out is refused while the first runs" \
  grep -q "another stepcast" <<<"$second"
kill -9 $pid 2>/dev/null || true
wait $pid 2>/dev/null || true

echo "== SIGKILL of stepcast train, $n times"
models=$work/models
"$bin" train "$work/reference" --out "$models" --quiet >/dev/null
predict=("$bin" predict --cluster "$root/hardware-profiles/dgx-h100.yaml" --model llama2-7b
  --dp 8 --global-batch 64 --models "$models" --json)
mixed=0
refused=0
for ((i = 1; i <= n; i++)); do
  "$bin" train "$work/reference" --out "$models" --quiet --seed $i >/dev/null 2>&1 &
  pid=$!
  pause 0.05 3
  kill -9 $pid 2>/dev/null || true
  wait $pid 2>/dev/null || true
  # the models a prediction reads are always one complete training
  if ! "${predict[@]}" >/dev/null 2>"$work/err"; then
    refused=$((refused + 1))
    if ! grep -q "retrain\|train" "$work/err"; then mixed=$((mixed + 1)); fi
  fi
  # the summary says when it describes other models than the ones predictions read
  if "$bin" models show "$models" >/dev/null 2>"$work/err"; then :; else
    grep -q "interrupted" "$work/err" || mixed=$((mixed + 1))
  fi
done
echo "   predictions refused after a kill: $refused; mixed states accepted: $mixed"
check "train: no kill leaves models a prediction accepts in a mixed state" test $mixed -eq 0
check "train: every kill leaves models a prediction reads" test $refused -eq 0
"$bin" train "$work/reference" --out "$models" --quiet >/dev/null
left=$(find "$models" -name '.*.tmp' | wc -l)
check "train: the next training removes what killed ones left ($left temporary files)" test "$left" -eq 0
check "train: afterwards the summary describes the models" \
  bash -c "'$bin' models show '$models' >/dev/null"

if [[ $failed == 0 ]]; then echo "all kill tests passed ($n kills each)"; else exit 1; fi

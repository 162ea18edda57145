#!/usr/bin/env bash
# Runs every fuzz target of fuzz/ for RUNS executions (default 1,000,000) from its seeds and
# prints, per target, the executions done, the corpus it grew and the crashes found.
#
#   scripts/fuzz-all.sh [RUNS] [TARGET…]     (needs `cargo install cargo-fuzz`; stable Rust)
#
# Crashing inputs are kept under fuzz/artifacts/<target>/ (git-ignored) for `cargo fuzz run
# <target> <file>` to replay.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
runs=${1:-1000000}
shift || true
cd "$root/fuzz"
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(cluster_yaml arch_yaml hf_config job_file dataset_csv models_bundle plan_yaml routing_csv megatron_log)
cargo fuzz build -s none >/dev/null 2>&1 || cargo fuzz build -s none
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf '%-15s %12s %8s %8s %10s\n' target executions corpus crashes seconds
status=0
for t in "${targets[@]}"; do
  mkdir -p "$work/$t"
  cp seeds/$t/* "$work/$t/"
  start=$(date +%s)
  log=$work/$t.log
  if cargo fuzz run -s none "$t" "$work/$t" -- -runs="$runs" -timeout=20 -rss_limit_mb=4096 \
      -max_len=131072 -print_final_stats=1 >"$log" 2>&1; then crashed=0; else crashed=1; status=1; fi
  done_runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo "?")
  corpus=$(ls "$work/$t" | wc -l)
  printf '%-15s %12s %8s %8s %10s\n' "$t" "$done_runs" "$corpus" "$crashed" "$(( $(date +%s) - start ))"
  if [[ $crashed == 1 ]]; then tail -n 30 "$log"; fi
done
exit $status

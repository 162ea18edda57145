#!/usr/bin/env bash
# The speed figures of the README's "Speed" table: warm whole-process runs of the binaries
# given (default: target/release/stepcast), measured by hyperfine (apt-get install hyperfine
# or cargo install hyperfine), min / median / max.
#   scripts/bench-speed.sh [BINARY...]
# Several binaries are measured in the same run, so that their figures compare on one machine.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v hyperfine >/dev/null || { echo "hyperfine not found: apt-get install hyperfine" >&2; exit 2; }
command -v python3 >/dev/null || { echo "python3 not found" >&2; exit 2; }
bins=("$@")
[ ${#bins[@]} -gt 0 ] || bins=(target/release/stepcast)
paper="predict --cluster hardware-profiles/perlmutter.yaml --model llemma-7b --tp 2 --pp 4 --dp 2 --micro-batch 4 --micro-batches 8"
cases=(
  "paper example, --rules paper|$paper --rules paper|20|300"
  "Quick start (default rules)|$paper|20|300"
  "32,768 micro-batches|predict --cluster hardware-profiles/dgx-h100.yaml --model llama2-13b --tp 2 --pp 4 --dp 8 --micro-batch 1 --micro-batches 32768|3|30"
  "search, 10^4 layouts|search --cluster hardware-profiles/dgx-h100.yaml --model llama2-13b --gpus 960 --global-batch 3840 --micro-batch 1,2,4,8 --allow-at-risk --schedule 1f1b,interleaved,zb-h1,gpipe|1|5"
)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '%-32s %-40s %s\n' "case" "binary" "min / median / max"
for c in "${cases[@]}"; do
  IFS='|' read -r name args warm runs <<<"$c"
  cmds=()
  for b in "${bins[@]}"; do cmds+=("$b $args"); done
  hyperfine -N -w "$warm" -r "$runs" --export-json "$tmp/r.json" "${cmds[@]}" >/dev/null 2>&1 \
    || { echo "$name: a command failed: ${cmds[0]}" >&2; exit 1; }
  python3 - "$tmp/r.json" "$name" "${bins[@]}" <<'PY'
import json, sys
res = json.load(open(sys.argv[1]))["results"]
for r, b in zip(res, sys.argv[3:]):
    t = sorted(r["times"])
    unit, f = ("s", 1.0) if t[len(t) // 2] >= 1 else ("ms", 1e3)
    print(f"{sys.argv[2]:<32} {b:<40} {t[0]*f:.2f} / {t[len(t)//2]*f:.2f} / {t[-1]*f:.2f} {unit}")
PY
done

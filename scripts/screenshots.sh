#!/usr/bin/env bash
# Renders the HTML reports of three real commands in headless Chromium and keeps the screenshots
# under docs/screenshots/: a prediction that fits, one that does not (OOM), and a search.
#   scripts/screenshots.sh        (needs Chromium: apt-get install chromium)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/target/release/stepcast
[[ -x $bin ]] || cargo build --release --manifest-path "$root/Cargo.toml"
browser=${STEPCAST_CHROMIUM:-$(command -v chromium || command -v chromium-browser || command -v google-chrome)}
out=$root/docs/screenshots
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
h100=$root/hardware-profiles/dgx-h100.yaml
"$bin" predict --cluster "$h100" --model llama2-13b --tp 2 --pp 4 --dp 4 --micro-batch 1 \
  --micro-batches 8 --sequence-parallel --recompute selective --html "$work/predict-fits.html" >/dev/null
"$bin" predict --cluster "$h100" --model llama3-70b --tp 1 --pp 1 --dp 8 --micro-batch 1 \
  --micro-batches 4 --html "$work/predict-oom.html" >/dev/null
"$bin" search --cluster "$h100" --model llama2-7b --gpus 32 --global-batch 64 --top 8 \
  --html "$work/search.html" >/dev/null
for page in predict-fits predict-oom search; do
  "$browser" --headless=new --no-sandbox --disable-gpu --hide-scrollbars --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --user-data-dir="$work/profile" --window-size=1400,2600 \
    --screenshot="$out/$page.png" "file://$work/$page.html" >/dev/null 2>&1
  echo "docs/screenshots/$page.png"
done

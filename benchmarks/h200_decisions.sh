#!/usr/bin/env bash
# Issue 12's H200 check, one device call on 2 GPUs (kernelcamp sweep, one worker per GPU):
# warp_occupancy twice (same decisions both times? serving half-width per level), A/A (equivalent)
# and planted_slow (slower), each a named DVC experiment; results copied from each experiment's
# commit to reports/campaigns/decisions/<name>/, with the sweep log (per-experiment wall times).
#   bash benchmarks/h200_decisions.sh [OUT_DIR]
set -uo pipefail
out=${1:-/tmp/decisions-out}
mkdir -p "$out"
source benchmarks/device_env.sh || exit 1
stamp=$(date -u +%Y%m%dT%H%M%S)
names=(planted_slow aa warp_occupancy-r1 warp_occupancy-r2)  # the short ones first: one per GPU
for n in "${names[@]}"; do
  dvc exp run --queue -n "$n-$stamp" -S "experiment=${n%-r[12]}" || exit 1
done
start=$(date +%s)
timeout -s TERM "${SWEEP_TIMEOUT_S:-470}" python -m kernelcamp.cli sweep --gpus 0,1 --poll 15 2>&1 \
  | while IFS= read -r line; do echo "$(( $(date +%s) - start ))s $line"; done
echo "sweep ended after $(( $(date +%s) - start )) s"
dest=reports/campaigns/decisions
for n in "${names[@]}"; do
  python -m kernelcamp.cli campaign collect "$n-$stamp" "$dest/$n" || echo "collect: $n not finished"
  dvc queue logs "$n-$stamp" > "$dest/$n.log" 2>&1 || true
done
dvc exp show --json -A > "$dest/exp_show.json" 2>/dev/null || true
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv,noheader > "$dest/gpus.txt"
tar czf "$out/decisions.tgz" "$dest"

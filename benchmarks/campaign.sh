#!/usr/bin/env bash
# The warp-occupancy campaign (issue 6) on a GPU machine, from the repo root:
#   bash benchmarks/campaign.sh                       # every experiment below, in order
#   bash benchmarks/campaign.sh warp_occupancy aa     # some of them
# Each runs as `dvc exp run -S experiment=<name>`; its report, plots, metrics, params and lock are
# copied to reports/campaigns/warp_occupancy/<name>/. The embedded server is stopped at the end.
set -euo pipefail
exps=("$@")
[ ${#exps[@]} -gt 0 ] || exps=(warp_occupancy warp_occupancy_sm120 aa planted_slow warp_occupancy_v32)
dest=reports/campaigns/warp_occupancy
trap 'python stages/deploy.py --stop >/dev/null 2>&1 || true' EXIT
for e in "${exps[@]}"; do
  echo "== campaign: $e ($(date -u +%H:%M:%S))"
  start=$(date +%s)
  dvc exp run -S "experiment=$e"
  d="$dest/$e"
  rm -rf "$d" && mkdir -p "$d"
  cp -r reports/report.md reports/plots reports/*.json reports/*.csv params.yaml dvc.lock "$d"/
  echo "== campaign: $e done in $(( $(date +%s) - start )) s"
done

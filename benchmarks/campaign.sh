#!/usr/bin/env bash
# The warp-occupancy campaign (issue 6) on a GPU machine, from the repo root:
#   bash benchmarks/campaign.sh                         # every experiment below, one after another
#   bash benchmarks/campaign.sh warp_occupancy aa       # some of them
#   bash benchmarks/campaign.sh --gpus 0,1              # queued, one worker per GPU (kernelcamp sweep)
# Each experiment is `dvc exp run -n <name>-<UTC stamp> -S experiment=<name>` (a DVC experiment: its
# commit holds params.yaml, dvc.lock and every output); its report, plots, metrics, params and lock
# are also copied from that commit to reports/campaigns/warp_occupancy/<name>/ (kernelcamp.campaign;
# not via `dvc exp apply`, which would revert the copies made before it). Embedded servers are
# stopped at the end.
set -uo pipefail
gpus=""
if [ "${1:-}" = "--gpus" ]; then gpus=$2; shift 2; fi
exps=("$@")
[ ${#exps[@]} -gt 0 ] || exps=(warp_occupancy_v32 warp_occupancy warp_occupancy_sm120 aa planted_slow)  # longest first
dest=reports/campaigns/warp_occupancy
stamp=$(date -u +%Y%m%dT%H%M%S)
failed=0

collect() {  # copy experiment $1's results (DVC experiment $2) from its commit into the campaign folder
  python -m kernelcamp.cli campaign collect "$2" "$dest/$1"
}
stop_servers() {  # the workspace's embedded server (kernelcamp sweep stops its slots' servers itself)
  python -m stages.deploy --stop >/dev/null 2>&1
}
trap stop_servers EXIT

if [ -n "$gpus" ]; then
  for e in "${exps[@]}"; do dvc exp run --queue -n "$e-$stamp" -S "experiment=$e" || exit 1; done
  python -m kernelcamp.cli sweep --gpus "$gpus" --poll 30 || failed=1
  for e in "${exps[@]}"; do collect "$e" "$e-$stamp" || { echo "campaign: $e failed" >&2; failed=1; }; done
else
  for e in "${exps[@]}"; do
    echo "== campaign: $e ($(date -u +%H:%M:%S))"
    start=$(date +%s)
    if dvc exp run -n "$e-$stamp" -S "experiment=$e" && collect "$e" "$e-$stamp"; then :; else echo "campaign: $e failed" >&2; failed=1; fi
    echo "== campaign: $e done in $(($(date +%s) - start)) s"
  done
fi
exit $failed

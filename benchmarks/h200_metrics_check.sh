#!/usr/bin/env bash
# After the tolerance and metrics changes (issue 15), on the lent H200 from the repo root with .whl/:
#   bash benchmarks/h200_metrics_check.sh OUT
# the GPU suite, then the A/A experiment in the workspace (kernel A/B only), whose headline
# reports/metrics.json must carry GPU names (no cpu. prefix) and the decision `equivalent`.
set -uo pipefail
out=${1:?usage: h200_metrics_check.sh OUT}
mkdir -p "$out/r"
source benchmarks/device_env.sh || exit 1
export TRITON_CACHE_DIR=/tmp/triton-cache
trap 'tar czf "$out/metrics_check.tgz" -C "$out/r" .' EXIT
timeout 200 python -m pytest -m gpu -q -p no:cacheprovider 2>&1 | tee "$out/r/gpu_suite.log" | tail -3
start=$(date +%s)
timeout 240 dvc exp run -n aa-metrics -S experiment=aa > "$out/r/aa.log" 2>&1
echo "aa: exit $? after $(( $(date +%s) - start )) s"
cp reports/metrics.json reports/report.md dvc.lock params.yaml "$out/r/" 2>/dev/null
cat reports/metrics.json

#!/usr/bin/env bash
# Issue 12's H200 check of the cheaper streaming path, one device call from the repo root with .whl/
# and .probe/ carried (.probe/before: `git archive <old commit>` of this repo, see below):
#   bash benchmarks/h200_sse_check.sh OUT [NAME...]
# (the experiments run first, the probe after them)
# 1. benchmarks/serving_noise_probe.sh: the server of .probe/before (its own HTTP stack: h11, httptools
#    hidden) against this tree's (httptools + uvloop, spliced SSE frames, queued tokens in one chunk),
#    five runs each at concurrency 64, into reports/campaigns/decisions/serving_noise/sse_path/
#    (the second call's probe, with the engine process, was committed as serving_noise/engine_process/);
# 2. for each NAME (default: warp_occupancy-r1), one timed `dvc exp run -S experiment=<NAME without
#    -rN>` (NAME "default": no -S, params.yaml as it is) in a temporary copy (--temp: the workspace
#    stays as it is between runs), collected into reports/campaigns/decisions/h200_sse/<NAME>/, its
#    log (each line stamped with the seconds since the run started) and wall time beside it
#    (<NAME>.log, <NAME>.wall.json).
# SKIP_PROBE=1: no noise probe; CUPTI_PROBE=1: then benchmarks/cupti_probe.py (h200_sse/cupti_probe.*);
# GPU_SUITE=1: then `pytest -m gpu` (log in h200_sse/gpu_suite.log). SUB=NAME: NAME instead of h200_sse
# as the folder under reports/campaigns/decisions/.
# Everything lands in OUT/sse_check.tgz at exit, also when a step is cut by its timeout.
#   mkdir -p .probe/before && git archive f6218c3 | tar -x -C .probe/before
set -uo pipefail
out=${1:?usage: h200_sse_check.sh OUT [NAME...]}
shift
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(warp_occupancy-r1)
mkdir -p "$out"
source benchmarks/device_env.sh || exit 1
export TRITON_CACHE_DIR=/tmp/triton-cache
dest=reports/campaigns/decisions
sub=${SUB:-h200_sse}  # the folder under $dest for the experiments, logs and suite
mkdir -p "$dest/$sub"
trap 'tar czf "$out/sse_check.tgz" "$dest/serving_noise/sse_path" "$dest/$sub" 2>/dev/null' EXIT
for n in "${names[@]}"; do
  d="$dest/$sub/$n"
  set_args=()
  [ "$n" = default ] || set_args=(-S "experiment=${n%-r[0-9]}")
  start=$(date +%s.%N)
  # every line stamped with the seconds since the run started (where a run's wall time goes)
  timeout -s TERM "${EXP_TIMEOUT_S:-420}" dvc exp run --temp -n "$n" "${set_args[@]}" 2>&1 \
    | python3 -u -c 'import sys, time
t0 = time.time()
for line in sys.stdin:
    sys.stdout.write(f"{time.time() - t0:7.1f} {line}")
    sys.stdout.flush()' > "$d.log"
  rc=${PIPESTATUS[0]}
  end=$(date +%s.%N)
  python3 -c "import json,sys; print(json.dumps({'name': sys.argv[1], 'rc': int(sys.argv[2]), 'wall_s': round(float(sys.argv[4]) - float(sys.argv[3]), 1)}))" \
    "$n" "$rc" "$start" "$end" | tee "$d.wall.json"
  python -m kernelcamp.cli campaign collect "$n" "$d" > /dev/null 2>&1 || echo "collect: $n not finished"
  grep -h -A2 "^## Decision" "$d/report.md" 2>/dev/null | head -3
done
if [ -d .probe/before ] && [ -z "${SKIP_PROBE:-}" ]; then
  cp -r kernels .probe/before/  # the same kernel sources: the comparison is of the server only
  mkdir -p /tmp/noht && echo 'raise ImportError("hidden: the before server ran with h11")' > /tmp/noht/httptools.py
  grep -v "^  engine_process:" params.yaml > /tmp/before_params.yaml  # a key the older tree refuses
  BEFORE_PARAMS=/tmp/before_params.yaml BEFORE_PYTHONPATH=/tmp/noht timeout "${PROBE_TIMEOUT_S:-240}" bash benchmarks/serving_noise_probe.sh \
    "$dest/serving_noise/sse_path" .probe/before 2>&1 | tail -12
fi
if [ -n "${CUPTI_PROBE:-}" ]; then  # does a profile leave the server slower? (benchmarks/cupti_probe.py)
  timeout "${CUPTI_TIMEOUT_S:-240}" python benchmarks/cupti_probe.py "$dest/$sub/cupti_probe.json" --levels ${CUPTI_LEVELS:-1 64} 2>&1 \
    | tee "$dest/$sub/cupti_probe.log" | tail -8
fi
if [ -n "${GPU_SUITE:-}" ]; then  # the GPU test suite last, in what time is left
  timeout "${GPU_SUITE_TIMEOUT_S:-120}" python -m pytest -m gpu -q -p no:cacheprovider 2>&1 \
    | tee "$dest/$sub/gpu_suite.log" | tail -3
fi
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv,noheader > "$dest/$sub/gpus.txt"

#!/usr/bin/env bash
# device call (session 17): the whole GPU suite on branch qload (main 882368c + the qload patch: covers the
# refactored _ws_matches_reference tests and the qload kernel), then step "qload" on V4-Flash when it passed
set -uo pipefail
OUTD=${OUT:?}
rm -rf /tmp/kc; git clone -q -b qload .probe/repo.bundle /tmp/kc && cp -r .whl /tmp/kc/ && cd /tmp/kc || exit 1
git log --oneline -1 | tee "$OUTD/head.txt"; sha256sum kernels/sparse_mla_decode.py | tee -a "$OUTD/head.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv | tee -a "$OUTD/head.txt"
source benchmarks/device_env.sh > "$OUTD/env.log" 2>&1 || { cat "$OUTD/env.log"; exit 1; }
export TRITON_CACHE_DIR=/tmp/triton-cache
timeout ${SUITE:-170} python -m pytest -m gpu -q -p no:cacheprovider 2>&1 | tee "$OUTD/qload_gpu_suite.log" | tail -4
grep -q " passed" "$OUTD/qload_gpu_suite.log" && ! grep -q "failed\|error" "$OUTD/qload_gpu_suite.log" || { echo "GPU suite not passed: no step"; exit 1; }
SWEEP_TIMEOUT_S=${SWEEP:-250} bash benchmarks/kernel_speed_step.sh "$OUTD" qload v4 2>&1 | tee "$OUTD/step.log" | tail -25
ls -la "$OUTD"

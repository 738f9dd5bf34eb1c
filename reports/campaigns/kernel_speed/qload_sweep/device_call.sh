#!/usr/bin/env bash
# device call (session 16): step "qload" on V4-Flash from a bundle clone of branch qload: the V4 ws GPU tests
# first (reference, three slots, capture, replay), then the step through kernel_speed_step.sh when they passed
set -uo pipefail
OUTD=${OUT:?}
rm -rf /tmp/kc; git clone -q -b qload .probe/repo.bundle /tmp/kc && cp -r .whl /tmp/kc/ && cd /tmp/kc || exit 1
git log --oneline -1 | tee "$OUTD/head.txt"; sha256sum kernels/sparse_mla_decode.py | tee -a "$OUTD/head.txt"
source benchmarks/device_env.sh > "$OUTD/env.log" 2>&1 || { cat "$OUTD/env.log"; exit 1; }
export TRITON_CACHE_DIR=/tmp/triton-cache
timeout ${PRE:-110} python -m pytest -m gpu -q -p no:cacheprovider tests/test_kernel_gpu.py \
  -k "(v4_flash and (warp_specialized or replays or captures)) or three_staging" 2>&1 | tee "$OUTD/qload_gpu_tests.log" | tail -4
grep -q " passed" "$OUTD/qload_gpu_tests.log" && ! grep -q "failed\|error" "$OUTD/qload_gpu_tests.log" || { echo "V4 tests not passed: no step"; exit 1; }
SWEEP_TIMEOUT_S=${SWEEP:-250} bash benchmarks/kernel_speed_step.sh "$OUTD" qload v4 2>&1 | tee "$OUTD/step.log" | tail -25
ls -la "$OUTD"

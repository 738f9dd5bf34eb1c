#!/usr/bin/env bash
# device call (session 17): step "ostage" from a bundle clone of branch ostage: the step on V4-Flash
set -uo pipefail
OUTD=${OUT:?}
rm -rf /tmp/kc; git clone -q -b ostage .probe/repo.bundle /tmp/kc && cp -r .whl /tmp/kc/ && cd /tmp/kc || exit 1
git log --oneline -1 | tee "$OUTD/head.txt"; sha256sum kernels/sparse_mla_decode.py | tee -a "$OUTD/head.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv | tee -a "$OUTD/head.txt"
source benchmarks/device_env.sh > "$OUTD/env.log" 2>&1 || { cat "$OUTD/env.log"; exit 1; }
export TRITON_CACHE_DIR=/tmp/triton-cache
# (no separate GPU tests first: the device time left is too short. The step's verify stage checks the kernel against
# the torch reference, 40 cases and the capture check, after its benchmark; a failed verify leaves it undecided)
SWEEP_TIMEOUT_S=${SWEEP:-200} bash benchmarks/kernel_speed_step.sh "$OUTD" ostage v4 2>&1 | tee "$OUTD/step.log" | tail -30
ls -la "$OUTD"

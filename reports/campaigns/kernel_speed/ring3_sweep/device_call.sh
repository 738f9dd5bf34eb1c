#!/usr/bin/env bash
# device call (session 17): step "ring3" on V4-Flash from a bundle clone of branch ring3: the whole GPU suite first,
# per-kernel times of the ring3 kernel (kernel_breakdown.py, as candidates 17), then the step when the suite passed
set -uo pipefail
OUTD=${OUT:?}
rm -rf /tmp/kc; git clone -q -b ring3 .probe/repo.bundle /tmp/kc && cp -r .whl /tmp/kc/ && cd /tmp/kc || exit 1
git log --oneline -1 | tee "$OUTD/head.txt"; sha256sum kernels/sparse_mla_decode.py | tee -a "$OUTD/head.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv | tee -a "$OUTD/head.txt"
source benchmarks/device_env.sh > "$OUTD/env.log" 2>&1 || { cat "$OUTD/env.log"; exit 1; }
export TRITON_CACHE_DIR=/tmp/triton-cache
timeout ${SUITE:-150} python -m pytest -m gpu -q -p no:cacheprovider 2>&1 | tee "$OUTD/ring3_gpu_suite.log" | tail -4
grep -q " passed" "$OUTD/ring3_gpu_suite.log" && ! grep -q "failed\|error" "$OUTD/ring3_gpu_suite.log" || { echo "GPU suite not passed: no step"; exit 1; }
timeout 60 python benchmarks/kernel_breakdown.py /tmp/bd_ring3.json kernels.sparse_mla_decode \
  v4_flash:T32_H64_w12_s2_kauto_ws:128 v4_flash:T32_H64_w12_s2_k4_ws:16 v4_flash:T32_H64_w12_s2_kauto_ws:1 2>&1 \
  | grep -v -i warn | tee "$OUTD/bd_ring3.log" | tail -3
SWEEP_TIMEOUT_S=${SWEEP:-240} bash benchmarks/kernel_speed_step.sh "$OUTD" ring3 v4 2>&1 | tee "$OUTD/step.log" | tail -25
ls -la "$OUTD"

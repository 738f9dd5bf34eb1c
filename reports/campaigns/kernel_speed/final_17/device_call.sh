#!/usr/bin/env bash
# device call (session 16): the whole GPU suite (new: V4 s3 against the reference, V4 ws rows captured and
# replayed) and reports/kernel_bench re-measured on the kernel file that ships, from a bundle clone of main
set -uo pipefail
OUTD=${OUT:?}
rm -rf /tmp/kc; git clone -q -b main .probe/repo.bundle /tmp/kc && cp -r .whl /tmp/kc/ && cd /tmp/kc || exit 1
git log --oneline -1 | tee "$OUTD/head.txt"
sha256sum kernels/sparse_mla_decode.py | tee -a "$OUTD/head.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv | tee "$OUTD/gpu.txt"
SUITE_TIMEOUT_S=${SUITE:-170} BENCH_TIMEOUT_S=${BENCH:-200} timeout ${FINAL:-420} bash benchmarks/kernel_bench_final.sh "$OUTD" 2>&1 \
  | tee "$OUTD/final.log" | tail -30
ls -la "$OUTD"

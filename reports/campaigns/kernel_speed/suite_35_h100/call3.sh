#!/usr/bin/env bash
# session 35: on an H200, main's final re-measure (the GPU suite, then reports/kernel_bench/); on another GPU, the
# GPU suite only at main's head (the session-34/35 code changes run on a GPU; no H100 benchmark taken twice)
G=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $G"
case $G in
  *H200*) SUITE_TIMEOUT_S=110 BENCH_TIMEOUT_S=120 timeout 290 bash benchmarks/device_call.sh main final ;;
  *) SUITE_TIMEOUT_S=120 timeout 200 bash benchmarks/device_call.sh main suite ;;
esac

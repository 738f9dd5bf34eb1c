#!/usr/bin/env bash
# Kernel code candidates side by side on the lent H200 (issue 14), from the root of a clean export:
#   bash benchmarks/kernel_candidates_probe.sh OUT MODULE [MODULE ...]
# MODULE: a kernel module with the API of kernels.sparse_mla_decode (e.g. kernels.sparse_mla_decode and
# a candidate copied next to it); MODS_v32, MODS_v32_tp8, MODS_v4_flash (space-separated) narrow the
# modules run for one shape. For each shape, each module runs the same config list at B 1, 8, 32,
# 128 through benchmarks/bench_kernel.py (compiled in parallel first, every config checked against the
# torch reference, CUDA-graph replays, L2 flushed), then `pytest -m gpu tests/test_kernel_gpu.py` runs
# on the first module (the one the tree ships). Everything is tee'd under OUT and packed into
# OUT/probe.tar.gz at exit, so a cut run still returns what it measured.
set -u
OUT=${1:?usage: kernel_candidates_probe.sh OUT MODULE [MODULE ...]}
shift
mkdir -p "$OUT/w"
W="$OUT/w"
trap 'tar -czf "$OUT/probe.tar.gz" -C "$W" . 2>/dev/null' EXIT
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw --format=csv | tee "$W/gpu.txt"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee -a "$W/gpu.txt"
date -u +%FT%TZ | tee -a "$W/gpu.txt"
sha256sum kernels/*.py | tee -a "$W/gpu.txt"

V32=${V32:-T32_H64_w8_s2_kauto,T32_H64_w8_s3_kauto,T64_H64_w8_s2_kauto,T64_H64_w8_s3_kauto,T64_H32_w8_s2_kauto,T64_H32_w8_s3_kauto,T32_H32_w8_s3_kauto}
TP8=${TP8:-T64_H16_w8_s2_kauto,T64_H16_w8_s3_kauto,T32_H16_w4_s3_kauto,T32_H16_w8_s2_kauto,T128_H16_w8_s2_kauto,T64_H16_w4_s2_kauto,T32_H16_w4_s3_k4}
V4=${V4:-T32_H64_w8_s1_kauto,T32_H64_w8_s2_kauto,T64_H64_w8_s2_kauto,T32_H16_w4_s2_kauto}
for fam in v32 v32_tp8 v4_flash; do
  case $fam in v32) cfgs=$V32;; v32_tp8) cfgs=$TP8;; v4_flash) cfgs=$V4;; esac
  mods_var="MODS_$fam"
  for mod in ${!mods_var:-$@}; do
    name=${mod##*.}
    mkdir -p "$W/$name"
    timeout ${GRID_TIMEOUT:-75} python3 benchmarks/bench_kernel.py --module "$mod" --out "$W/$name/$fam" --families $fam \
      --batches 1,8,32,128 --configs "$cfgs" --no-ref --check --precompile-jobs 12 2>&1 \
      | tee "$W/$name/$fam.log" | grep -v "precompile" | tail -2
  done
done
timeout ${TEST_TIMEOUT:-120} python3 -m pytest -q -m gpu tests/test_kernel_gpu.py 2>&1 | tee "$W/gpu_tests.log" | tail -3

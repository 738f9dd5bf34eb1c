#!/usr/bin/env bash
# Kernel code candidates side by side on the lent H200 (issue 14), from the root of a clean export:
#   bash benchmarks/kernel_candidates_probe.sh OUT MODULE [MODULE ...]
# MODULE: a kernel module with the API of kernels.sparse_mla_decode (e.g. kernels.sparse_mla_decode
# and a candidate copied next to it); MODS_v32, MODS_v32_tp8, MODS_v4_flash (space-separated) narrow
# the modules run for one shape. For each shape, each module runs the same config list at B 1, 8, 32,
# 64, 128 (BATCHES; 64 since a table row chosen at 128 also runs 33-127: step "table4") through
# benchmarks/bench_kernel.py (compiled in parallel first, every config checked against the torch
# reference, CUDA-graph replays, L2 flushed), then `pytest -m gpu tests/test_kernel_gpu.py` runs on
# the first module (the one the tree ships). A family whose config list is set empty (e.g. TP8=) is
# skipped. With NCU_RUNS="FAMILY:CONFIG:B ..." each module is first profiled by Nsight Compute (when
# ncu is on the machine) at those points, one launch each (benchmarks/ncu_one_launch.py): the report,
# its details page and its per-SASS-instruction source page (CSV) under OUT/w/ncu/; NCU_MODS
# (space-separated) narrows the modules profiled.
# Everything is tee'd under OUT and packed into OUT/probe.tar.gz after every measurement and at exit, so a
# cut run still returns what it measured, even one killed outright (no trap runs then) or ended while an inner
# `timeout`, in its own process group, holds off the EXIT trap.
set -u
OUT=${1:?usage: kernel_candidates_probe.sh OUT MODULE [MODULE ...]}
shift
mkdir -p "$OUT/w"
W="$OUT/w"
pack() {  # OUT/probe.tar.gz from what OUT/w holds now, through a temporary name (a cut tar leaves the last one)
  tar -czf "$OUT/.probe.tar.gz.tmp" -C "$W" . 2>/dev/null  # exit 1 when a log grew while read: still complete
  [ -s "$OUT/.probe.tar.gz.tmp" ] && mv -f "$OUT/.probe.tar.gz.tmp" "$OUT/probe.tar.gz"
}
trap pack EXIT
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw --format=csv | tee "$W/gpu.txt"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee -a "$W/gpu.txt"
date -u +%FT%TZ | tee -a "$W/gpu.txt"
sha256sum kernels/*.py | tee -a "$W/gpu.txt"
pack

NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "${NCU_RUNS:-}" ]; then
  mkdir -p "$W/ncu"
  if [ -z "$NCU" ]; then
    echo "ncu: not found on this machine; NCU_RUNS skipped" | tee "$W/ncu/missing.txt"
  else
    "$NCU" --version | tee "$W/ncu/version.txt"
    for run in $NCU_RUNS; do
      IFS=: read -r fam cfg b <<<"$run"
      for mod in ${NCU_MODS:-$@}; do
        name=${mod##*.}_${fam}_${cfg}_B$b
        timeout ${NCU_TIMEOUT:-120} "$NCU" -f -o "$W/ncu/$name" -k regex:_sparse_mla_split_kernel --launch-skip 1 \
          --launch-count 1 --import-source yes --section SpeedOfLight --section WarpStateStats \
          --section SchedulerStats --section Occupancy --section ComputeWorkloadAnalysis \
          --section MemoryWorkloadAnalysis --section LaunchStats --section SourceCounters \
          python3 benchmarks/ncu_one_launch.py "$mod" "$fam" "$cfg" "$b" > "$W/ncu/$name.log" 2>&1
        "$NCU" --import "$W/ncu/$name.ncu-rep" --page details > "$W/ncu/$name.txt" 2>&1
        "$NCU" --import "$W/ncu/$name.ncu-rep" --page source --csv --print-source sass > "$W/ncu/$name.sass.csv" 2>&1
        grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Issue Slots Busy" \
          "$W/ncu/$name.txt" | sed "s/^/$name /" | head -8
        pack
      done
    done
  fi
fi

V32=${V32-T32_H64_w8_s2_kauto,T32_H64_w8_s3_kauto,T64_H64_w8_s2_kauto,T64_H64_w8_s3_kauto,T64_H32_w8_s2_kauto,T64_H32_w8_s3_kauto,T32_H32_w8_s3_kauto}
TP8=${TP8-T64_H16_w8_s2_kauto,T64_H16_w8_s3_kauto,T32_H16_w4_s3_kauto,T32_H16_w8_s2_kauto,T128_H16_w8_s2_kauto,T64_H16_w4_s2_kauto,T32_H16_w4_s3_k4}
V4=${V4-T32_H64_w8_s1_kauto,T32_H64_w8_s2_kauto,T64_H64_w8_s2_kauto,T32_H16_w4_s2_kauto}
for fam in v32 v32_tp8 v4_flash; do
  case $fam in v32) cfgs=$V32;; v32_tp8) cfgs=$TP8;; v4_flash) cfgs=$V4;; esac
  [ -z "$cfgs" ] && continue
  mods_var="MODS_$fam"
  for mod in ${!mods_var:-$@}; do
    name=${mod##*.}
    mkdir -p "$W/$name"
    timeout ${GRID_TIMEOUT:-75} python3 benchmarks/bench_kernel.py --module "$mod" --out "$W/$name/$fam" --families $fam \
      --batches "${BATCHES:-1,8,32,64,128}" --configs "$cfgs" --no-ref --check --precompile-jobs 12 2>&1 \
      | tee "$W/$name/$fam.log" | grep -v "precompile" | tail -2
    pack
  done
done
timeout ${TEST_TIMEOUT:-120} python3 -m pytest -q -m gpu tests/test_kernel_gpu.py 2>&1 | tee "$W/gpu_tests.log" | tail -3

#!/usr/bin/env bash
# device call: Nsight Compute of the warp-specialized kernel on V4-Flash B=128 (one launch) and per-kernel times
# of the V4 table's warp-specialized rows (kernel_breakdown.py), from a bundle clone of main
set -uo pipefail
OUTD=${OUT:?}
rm -rf /tmp/kc; git clone -q -b main .probe/repo.bundle /tmp/kc && cp -r .whl /tmp/kc/ && cd /tmp/kc || exit 1
git log --oneline -1 | tee "$OUTD/head.txt"
source benchmarks/device_env.sh > /dev/null 2>&1 || exit 1
export TRITON_CACHE_DIR=/tmp/triton-cache
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv; date -u +%FT%TZ; sha256sum kernels/sparse_mla_decode.py; } > "$OUTD/gpu.txt"
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU" | tee -a "$OUTD/gpu.txt"
timeout 100 python benchmarks/kernel_breakdown.py "$OUTD/bd_v4_ws.json" kernels.sparse_mla_decode \
  v4_flash:T32_H64_w12_s2_kauto_ws:128 v4_flash:T32_H64_w12_s2_kauto_ws:64 v4_flash:T32_H64_w12_s2_k4_ws:16 \
  v4_flash:T32_H64_w12_s2_kauto_ws:1 v32:T32_H64_w12_s2_kauto_ws:128 2>&1 | grep -v Warn | tee "$OUTD/bd.log" | tail -12
n=ncu_v4_ws_B128
timeout 150 "$NCU" -f -o /tmp/$n -k regex:_sparse_mla_ws_split_kernel --launch-skip 1 --launch-count 1 --import-source yes \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
  --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section LaunchStats --section SourceCounters \
  python benchmarks/ncu_one_launch.py kernels.sparse_mla_decode v4_flash T32_H64_w12_s2_kauto_ws 128 > "$OUTD/$n.log" 2>&1
"$NCU" --import /tmp/$n.ncu-rep --page details > "$OUTD/$n.txt" 2>&1
"$NCU" --import /tmp/$n.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > "$OUTD/$n.sass.csv.gz"
grep -E "Duration|Throughput|Achieved Occupancy|Issue Slots Busy|Eligible" "$OUTD/$n.txt" | head -14

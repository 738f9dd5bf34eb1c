#!/usr/bin/env bash
# One device call of the kernel-speed campaign (issue 14), run on the lent H200 from a clean export of
# a commit (the copied working tree may hold a helper's half-done edits):
#   git archive -o .probe/head.tar HEAD   # here; .probe/ is git-ignored and carried
#   bash benchmarks/kernel_speed_probe.sh OUT          # there, from the export's root
# 1. the config grid of each campaign shape (bench_kernel.py, compiled in parallel first), every
#    config checked against the torch reference; 2. Nsight Compute on the two slowest-per-FLOP shapes'
#    current best configs; 3. a serving-noise check: the same server and load, unpinned and with the
#    server and the load generator on disjoint CPU cores. Everything is tee'd under OUT and packed into
#    OUT/probe.tar.gz at exit, so a cut run still returns what it measured.
set -u
OUT=${1:?usage: kernel_speed_probe.sh OUT}
mkdir -p "$OUT/w"
W="$OUT/w"
trap 'tar -czf "$OUT/probe.tar.gz" -C "$W" . 2>/dev/null' EXIT
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw --format=csv | tee "$W/gpu.txt"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee -a "$W/gpu.txt"

V32="T16_H64_w8_s1_kauto,T16_H64_w8_s2_kauto,T16_H64_w8_s3_kauto,T32_H64_w8_s1_kauto,T32_H64_w8_s2_kauto,T32_H64_w8_s3_kauto"
V32="$V32,T32_H64_w8_s1_k2,T32_H64_w8_s2_k2,T16_H64_w8_s2_k2,T16_H64_w8_s2_k64,T32_H64_w8_s2_k64"
V32="$V32,T16_H32_w4_s2_kauto,T16_H32_w4_s3_kauto,T32_H32_w4_s2_kauto,T32_H32_w4_s3_kauto,T32_H32_w8_s2_kauto,T64_H32_w8_s2_kauto"
TP8=""
for t in 16 32 64; do for w in 4 8; do for s in 2 3 4; do TP8="$TP8,T${t}_H16_w${w}_s${s}_kauto"; done; done; done
TP8="${TP8#,},T32_H16_w4_s3_k4,T32_H16_w4_s3_k8,T32_H16_w4_s3_k16,T64_H16_w4_s3_k4,T64_H16_w4_s3_k8,T32_H16_w8_s2_k4,T32_H16_w8_s2_k8"
V4="T16_H64_w8_s1_kauto,T16_H64_w8_s2_kauto,T16_H64_w8_s3_kauto,T32_H64_w8_s1_kauto,T32_H64_w8_s2_kauto,T32_H64_w8_s3_kauto"
for t in 16 32; do for w in 4 8; do for s in 2 3; do V4="$V4,T${t}_H32_w${w}_s${s}_kauto"; done; done; done
V4="$V4,T16_H16_w4_s2_kauto,T16_H16_w4_s3_kauto,T32_H16_w4_s2_kauto,T32_H16_w4_s3_kauto,T64_H16_w4_s2_kauto,T64_H16_w4_s3_kauto"
V4="$V4,T32_H16_w8_s2_kauto,T32_H64_w8_s2_k2,T16_H32_w4_s2_k4"

for fam in v32 v32_tp8 v4_flash; do
  case $fam in v32) cfgs=$V32;; v32_tp8) cfgs=$TP8;; v4_flash) cfgs=$V4;; esac
  timeout $([ $fam = v32 ] && echo 130 || echo 110) python3 benchmarks/bench_kernel.py --out "$W/grid_$fam" --families $fam --batches 1,8,32,128 \
    --configs "$cfgs" --no-ref --check --precompile-jobs 12 2>&1 | tee "$W/grid_$fam.log" | grep -v "^\[.*precompile" | tail -3
done

cat > /tmp/one_launch.py <<'PY'
import sys
from kernelcamp.variant import Variant
from kernels import sparse_mla_decode as smd
sys.path.insert(0, "benchmarks")
from bench_kernel import FAMILIES, parse_config_label
fam, B, label = sys.argv[1], int(sys.argv[2]), sys.argv[3]
layout, H, topk = FAMILIES[fam]
x = smd.make_inputs(layout, B, H, topk, 64, 262144, "cuda")
k = smd.SparseMLADecode(Variant(label, (parse_config_label(label),)), check_indices=False)
for _ in range(3):
    k(x["q"], x["kv_cache"], x["indices"], layout, 64, x["sm_scale"])
import torch; torch.cuda.synchronize()
PY
for job in "v32 128 T32_H64_w8_s1_kauto" "v32_tp8 128 T32_H16_w8_s2_kauto"; do
  set -- $job
  timeout 45 ncu --clock-control none -k regex:sparse_mla_split -s 2 -c 1 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis --section LaunchStats \
    python3 /tmp/one_launch.py $1 $2 $3 > "$W/ncu_$1_$2_$3.txt" 2>&1
  grep -E "Duration|Throughput|Achieved Occupancy|Registers|Stall|Warp Cycles|Eligible|Issued" "$W/ncu_$1_$2_$3.txt" | head -30
done

if [ -d .whl ]; then
  timeout 100 bash benchmarks/serving_noise_probe.sh "$W" 2>&1 | tee "$W/serving_noise.log" | tail -20
fi

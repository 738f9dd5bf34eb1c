#!/usr/bin/env bash
# The session's last H200 call, from the repo root with .whl/ carried:
#   bash benchmarks/h200_final_check.sh OUT
# 1. the GPU suite after the layout move (issue 15: no behaviour change); 2. the V4-Flash step of the
# kernel-speed campaign as a queued DVC experiment (kernelcamp sweep), collected into
# reports/campaigns/kernel_speed/table_v4/; 3. reports/kernel_bench/ re-measured with the tuned
# tables' configs and the configs they replaced (bench_kernel.py). Packed into OUT/final.tgz at exit.
set -uo pipefail
out=${1:?usage: h200_final_check.sh OUT}
mkdir -p "$out"
source benchmarks/device_env.sh || exit 1
export TRITON_CACHE_DIR=/tmp/triton-cache
dest=reports/campaigns/kernel_speed
mkdir -p "$dest" reports/kernel_bench
trap 'tar czf "$out/final.tgz" "$dest/table_v4" "$dest/table_v4.log" "$dest/sweep_2.log" reports/kernel_bench/h200_gpu_suite.log reports/kernel_bench/kernel_bench.csv reports/kernel_bench/summary.md 2>/dev/null' EXIT
timeout 240 python -m pytest -m gpu -q -p no:cacheprovider 2>&1 | tee reports/kernel_bench/h200_gpu_suite.log | tail -4
stamp=$(date -u +%Y%m%dT%H%M%S)
dvc exp run --queue -n "ks-table_v4-$stamp" -S "experiment=kernel_speed_table_v4" || exit 1
start=$(date +%s)
timeout -s TERM "${SWEEP_TIMEOUT_S:-240}" python -m kernelcamp.cli sweep --gpus 0 --poll 10 2>&1 \
  | while IFS= read -r line; do echo "$(( $(date +%s) - start ))s $line"; done > "$dest/sweep_2.log"
tail -2 "$dest/sweep_2.log"
python -m kernelcamp.cli campaign collect "ks-table_v4-$stamp" "$dest/table_v4" || echo "collect: table_v4 not finished"
dvc queue logs "ks-table_v4-$stamp" > "$dest/table_v4.log" 2>&1 || true
grep -h -A1 "^## Decision" "$dest/table_v4/report.md" 2>/dev/null | tail -1
CFGS="T64_H32_w8_s3_kauto,T32_H64_w8_s3_kauto,T64_H16_w8_s2_kauto,T32_H16_w4_s2_kauto,T32_H64_w8_s1_kauto,T32_H16_w8_s2_kauto"
timeout 150 python benchmarks/bench_kernel.py --out reports/kernel_bench --batches 1,8,32,64,128 --configs "$CFGS" \
  --check --precompile-jobs 12 > /tmp/bench_final.log 2>&1
sed -n '/Best config per shape/,$p' reports/kernel_bench/summary.md | head -30

#!/usr/bin/env bash
# Issue 14's campaign steps on the lent H200, one device call, from the repo root with .whl/ carried:
#   bash benchmarks/kernel_speed_campaign.sh OUT
# 1. grid 2: 16-warp configs (Nsight Compute on grid 1's best V3.2 config: 2 warps per scheduler,
#    0.35 eligible per cycle, 38% of stall cycles on L1TEX scoreboard: latency-bound), merged with
#    grid 1 (reports/campaigns/kernel_speed/grid_1/) into the tuned_* batch tables
#    (benchmarks/make_tuned_tables.py); 2. each table against the config it replaces, as a queued DVC
#    experiment run by `kernelcamp sweep` (kernel A/B decision, interval, params and lock);
#    3. everything packed into OUT/kernel_speed.tgz.
# It replays the first steps at the commit they ran from (dd85e38): at a later commit it would overwrite the
# tables made since (each conf/variant/tuned_*.yaml names its grid; later steps run kernel_speed_step.sh).
set -uo pipefail
out=${1:?usage: kernel_speed_campaign.sh OUT}
mkdir -p "$out"
source benchmarks/device_env.sh || exit 1
export TRITON_CACHE_DIR=/tmp/triton-cache
dest=reports/campaigns/kernel_speed
trap 'tar czf "$out/kernel_speed.tgz" "$dest" conf/variant/tuned_*.yaml 2>/dev/null' EXIT
mkdir -p "$dest/grid_2"
V32="T16_H64_w16_s2_kauto,T16_H64_w16_s3_kauto,T32_H64_w16_s1_kauto,T32_H64_w16_s2_kauto,T32_H64_w16_s3_kauto"
V32="$V32,T16_H64_w16_s2_k64,T64_H32_w8_s3_kauto,T64_H32_w4_s2_kauto,T64_H32_w8_s2_k64"
V4="T16_H64_w16_s2_kauto,T16_H64_w16_s3_kauto,T32_H64_w16_s1_kauto,T32_H64_w16_s2_kauto,T32_H64_w16_s3_kauto"
for fam in v32 v4_flash; do
  cfgs=$V32; [ $fam = v4_flash ] && cfgs=$V4
  timeout 110 python benchmarks/bench_kernel.py --out /tmp/grid2_$fam --families $fam --batches 1,8,32,128 \
    --configs "$cfgs" --no-ref --check --precompile-jobs 12 > "$dest/grid_2/$fam.log" 2>&1
  cp /tmp/grid2_$fam/kernel_bench.csv "$dest/grid_2/$fam.csv"
  grep -E "B=(1|128) " "$dest/grid_2/$fam.log" | tail -12
done
python benchmarks/make_tuned_tables.py --grid $dest/grid_1/v32.csv $dest/grid_2/v32.csv --family v32 --name tuned_deepseek_v32
python benchmarks/make_tuned_tables.py --grid $dest/grid_1/v32_tp8.csv --family v32_tp8 --name tuned_deepseek_v32_tp8
python benchmarks/make_tuned_tables.py --grid $dest/grid_1/v4_flash.csv $dest/grid_2/v4_flash.csv --family v4_flash --name tuned_deepseek_v4_flash
git add -A && git commit -qm "kernel_speed: batch tables from grids 1 and 2" || exit 1
stamp=$(date -u +%Y%m%dT%H%M%S)
names=(table_v32 table_tp8 table_v4)
for n in "${names[@]}"; do
  dvc exp run --queue -n "ks-$n-$stamp" -S "experiment=kernel_speed_$n" || exit 1
done
start=$(date +%s)
timeout -s TERM "${SWEEP_TIMEOUT_S:-330}" python -m kernelcamp.cli sweep --gpus 0 --poll 10 2>&1 \
  | while IFS= read -r line; do echo "$(( $(date +%s) - start ))s $line"; done | tee "$dest/sweep.log"
echo "sweep ended after $(( $(date +%s) - start )) s"
for n in "${names[@]}"; do
  python -m kernelcamp.cli campaign collect "ks-$n-$stamp" "$dest/$n" || echo "collect: $n not finished"
  dvc queue logs "ks-$n-$stamp" > "$dest/$n.log" 2>&1 || true
  grep -h -i -E "decision|faster|slower|equivalent|inconclusive" "$dest/$n/report.md" 2>/dev/null | head -8
done

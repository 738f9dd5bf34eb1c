#!/usr/bin/env bash
# device call (session 20, candidates 18): where the H=16 warp-specialized kernel's tile time goes after step "p2".
# Per-kernel times (benchmarks/kernel_breakdown.py) of the shipped kernel and two ablations of it made by
# make_ablations.py: the consumer skips its math (cand16_prodonly: the two producers' time) and the producers skip
# their gathers, dequantization and stores (cand16_cononly: the consumer's time). From a bundle clone of main.
set -uo pipefail
OUTD=${OUT:?}
rm -rf /tmp/kc; git clone -q -b main .probe/repo.bundle /tmp/kc && cp -r .whl /tmp/kc/ && cd /tmp/kc || exit 1
source benchmarks/device_env.sh > /dev/null 2>&1 || exit 1
python3 reports/campaigns/kernel_speed/candidates_18/make_ablations.py || exit 1
export TRITON_CACHE_DIR=/tmp/triton-cache
{ git log --oneline -1; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv; date -u +%FT%TZ
  python -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; sha256sum kernels/*.py; } > "$OUTD/gpu.txt"
pts="v32_tp8:T64_H16_w12_s2_k1_ws:128 v32_tp8:T64_H16_w12_s2_kauto_ws:8"
for m in sparse_mla_decode cand16_prodonly cand16_cononly; do
  extra=""
  [ $m = sparse_mla_decode ] && extra="v32:T64_H16_w12_s2_kauto_ws:1"
  timeout ${BD:-60} python benchmarks/kernel_breakdown.py "/tmp/bd_$m.json" kernels.$m $pts $extra 2>&1 | grep -v -i warn \
    | sed "s/^/$m /" | tee -a "$OUTD/bd.log" | tail -3
done
ls -la "$OUTD"

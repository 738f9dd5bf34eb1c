#!/usr/bin/env bash
# device call (session 17, candidates 17): where the warp-specialized kernel's tile time goes. Per-kernel times
# (benchmarks/kernel_breakdown.py) of the shipped kernel and three ablations of it: the consumers skip their math
# (cand_prodonly: the producer's time), the producer skips its gathers and dequantization (cand_cononly: the
# consumers' time), the producer skips only V4's dequantization (cand_nodq). From a bundle clone of main
set -uo pipefail
OUTD=${OUT:?}
rm -rf /tmp/kc; git clone -q -b main .probe/repo.bundle /tmp/kc && cp -r .whl /tmp/kc/ && cd /tmp/kc || exit 1
cp reports/campaigns/kernel_speed/candidates_17/cand_*.py kernels/
source benchmarks/device_env.sh > /dev/null 2>&1 || exit 1
export TRITON_CACHE_DIR=/tmp/triton-cache
{ git log --oneline -1; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv; date -u +%FT%TZ
  python -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; sha256sum kernels/*.py; } > "$OUTD/gpu.txt"
for m in sparse_mla_decode cand_prodonly cand_cononly cand_nodq; do
  pts="v4_flash:T32_H64_w12_s2_kauto_ws:128 v4_flash:T32_H64_w12_s2_k4_ws:16 v4_flash:T32_H64_w12_s2_kauto_ws:1"
  [ $m = cand_nodq ] || pts="$pts v32:T32_H64_w12_s2_kauto_ws:128"
  timeout ${BD:-110} python benchmarks/kernel_breakdown.py "/tmp/bd_$m.json" kernels.$m $pts 2>&1 | grep -v -i warn \
    | tee -a "$OUTD/bd.log" | tail -4
done
timeout 60 python benchmarks/kernel_breakdown.py /tmp/bd_again.json kernels.sparse_mla_decode \
  v4_flash:T32_H64_w12_s2_kauto_ws:128 2>&1 | grep -v -i warn | sed 's/^/again /' | tee -a "$OUTD/bd.log" | tail -2
ls -la "$OUTD"

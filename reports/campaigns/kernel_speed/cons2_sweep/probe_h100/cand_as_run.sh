#!/usr/bin/env bash
# step "cons2" probe, run by device_call.sh's run: action in the clone of main (OUT set): the candidate branch's tree
# in a worktree, its w16 GPU tests, w12 against w16 side by side, the per-kernel split at B=1 and TP8 B=128
set -u
git worktree add -q /tmp/kc_c2 origin/cons2 2>&1 || git worktree add -q /tmp/kc_c2 cons2
cd /tmp/kc_c2 || exit 9
git log --oneline -1 | tee "$OUT/cand_head.txt"
sha256sum kernels/sparse_mla_decode.py | cut -c1-16 >> "$OUT/cand_head.txt"
export PYTHONPATH=/tmp/site:/tmp/kc_c2 TRITON_CACHE_DIR=/tmp/triton-cache-c2
echo "== gput $(date -u +%T)"
timeout 80 python -m pytest -m gpu -q -p no:cacheprovider tests/test_kernel_gpu.py -k w16 2>&1 | tee "$OUT/cand_gput.log" | tail -3
echo "== bench $(date -u +%T)"
timeout 100 python benchmarks/bench_kernel.py --families v32,v32_tp8 --batches 1,2,8,32,128 \
  --configs T64_H16_w12_s2_kauto_ws,T64_H16_w16_s2_kauto_ws --no-ref --check --precompile-jobs 8 --time-budget-s 70 \
  --out "$OUT/cand" 2>&1 | tee "$OUT/cand_bench.log" | tail -25
echo "== bd $(date -u +%T)"
timeout 40 python benchmarks/kernel_breakdown.py "$OUT/bd.json" kernels.sparse_mla_decode v32:T64_H16_w12_s2_k16_ws:1 \
  v32:T64_H16_w16_s2_k16_ws:1 v32_tp8:T64_H16_w12_s2_k1_ws:128 v32_tp8:T64_H16_w16_s2_k1_ws:128 2>&1 | tee "$OUT/bd.log" | tail -8
echo "== done $(date -u +%T)"

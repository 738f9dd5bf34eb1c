#!/usr/bin/env bash
# Candidates 18's breakdown, run inside device_call.sh's clone (its run: action), so that it shares a device call
# with other actions (this folder's device_call.sh makes a clone of its own instead):
#   bash benchmarks/device_call.sh main 'run:c18:BD=60+bash+reports/campaigns/kernel_speed/candidates_18/breakdown.sh' ...
# Writes kernels/cand16_{prodonly,cononly}.py (make_ablations.py) and prints benchmarks/kernel_breakdown.py's rows of
# the shipped kernel and the two ablations (the run: action keeps them in OUT/c18.log).
set -uo pipefail
python3 reports/campaigns/kernel_speed/candidates_18/make_ablations.py || exit 1
sha256sum kernels/*.py
pts="v32_tp8:T64_H16_w12_s2_k1_ws:128 v32_tp8:T64_H16_w12_s2_kauto_ws:8"
rc=0
for m in sparse_mla_decode cand16_prodonly cand16_cononly; do
  extra=""
  [ $m = sparse_mla_decode ] && extra="v32:T64_H16_w12_s2_kauto_ws:1"
  timeout "${BD:-60}" python benchmarks/kernel_breakdown.py "/tmp/bd_$m.json" "kernels.$m" $pts $extra 2>&1 \
    | grep -v -i warn | sed "s/^/$m /"
  r=${PIPESTATUS[0]}
  [ "$r" -eq 0 ] || rc=$r
done
exit "$rc"

#!/usr/bin/env bash
# Issue 14, campaign step "kscale", on the lent H200 in one device call, from a clone of this repo made
# from a bundle (the baseline's kernel_rev needs the git history; an archive has none):
#   git bundle create .probe/repo.bundle main             # here; .probe/ is git-ignored and carried
#   git clone -q .probe/repo.bundle /tmp/kc && cp -r .whl /tmp/kc/ && cd /tmp/kc \
#     && bash benchmarks/kernel_speed_kscale.sh OUT       # there
# Queues one DVC experiment per shape (conf/experiment/kernel_speed_kscale_{v32,tp8,v4}.yaml: the
# committed kernel and its grid_3 batch table against the kernel file and table of aaad5b0, through
# baseline.kernel_rev), runs them with `kernelcamp sweep` on GPU 0, collects each experiment's report,
# records, params and lock into reports/campaigns/kernel_speed/kscale_<shape>/ and packs that folder
# into OUT/kscale.tgz at exit, so a cut run still returns what finished.
set -uo pipefail
out=${1:?usage: kernel_speed_kscale.sh OUT}
mkdir -p "$out"
source benchmarks/device_env.sh || exit 1
export TRITON_CACHE_DIR=/tmp/triton-cache
dest=reports/campaigns/kernel_speed
trap 'tar czf "$out/kscale.tgz" $dest/kscale_* 2>/dev/null' EXIT
echo "repo at $(git rev-parse HEAD)"
stamp=$(date -u +%Y%m%dT%H%M%S)
names=(v32 tp8 v4)
for n in "${names[@]}"; do
  dvc exp run --queue -n "ks-kscale-$n-$stamp" -S "experiment=kernel_speed_kscale_$n" || exit 1
done
start=$(date +%s)
mkdir -p "$dest/kscale_sweep"
timeout -s TERM "${SWEEP_TIMEOUT_S:-420}" python -m kernelcamp.cli sweep --gpus 0 --poll 10 2>&1 \
  | while IFS= read -r line; do echo "$(( $(date +%s) - start ))s $line"; done | tee "$dest/kscale_sweep/sweep.log"
echo "sweep ended after $(( $(date +%s) - start )) s"
for n in "${names[@]}"; do
  python -m kernelcamp.cli campaign collect "ks-kscale-$n-$stamp" "$dest/kscale_$n" || echo "collect: $n not finished"
  dvc queue logs "ks-kscale-$n-$stamp" > "$dest/kscale_sweep/$n.log" 2>&1 || true
  grep -h -i -E "decision|faster|slower|equivalent|inconclusive" "$dest/kscale_$n/report.md" 2>/dev/null | head -6
done

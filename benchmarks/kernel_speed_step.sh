#!/usr/bin/env bash
# One kernel-speed campaign step (issue 14) on the lent H200 in one device call, from a clone of this repo
# made from a bundle (a baseline's kernel_rev needs the git history; an archive has none):
#   git bundle create .probe/repo.bundle main             # here; .probe/ is git-ignored and carried
#   git clone -q .probe/repo.bundle /tmp/kc && cp -r .whl /tmp/kc/ && cd /tmp/kc \
#     && bash benchmarks/kernel_speed_step.sh OUT STEP SHAPE [SHAPE ...]   # there
# Queues one DVC experiment per shape, `experiment=kernel_speed_<STEP>_<SHAPE>`
# (conf/experiment/kernel_speed_<STEP>_<SHAPE>.yaml), runs the queue with `kernelcamp sweep` on GPU 0,
# collects each experiment's report, records, params and lock into
# reports/campaigns/kernel_speed/<STEP>_<SHAPE>/ (the sweep's log in <STEP>_sweep/) and packs them
# into OUT/<STEP>.tgz at exit. SWEEP_TIMEOUT_S (default 270 per shape: one experiment took 181-188 s on a
# fresh machine and more than 230 s for TP8's seven-row table, step "splitd") bounds the sweep. The collection runs
# at exit too (bash's EXIT trap, also on the TERM of an outer `timeout`), so a cut run still returns the
# experiments that finished: step "splitd" lost a finished one when the call's timeout ended the script
# between the sweep and the collection. Give the device call's timeout SWEEP_TIMEOUT_S plus about 30 s per
# shape for the collection: a device call of at most 600 s holds one shape safely, two only with a smaller
# SWEEP_TIMEOUT_S. (kernel_speed_kscale.sh is the same run, written for step "kscale".)
set -uo pipefail
usage="usage: kernel_speed_step.sh OUT STEP SHAPE [SHAPE ...]"
[ $# -ge 3 ] || { echo "$usage" >&2; exit 2; }
out=$1
step=$2
shift 2
case $out in /*) ;; *) out=$PWD/$out ;; esac
cd "$(dirname "$0")/.." || exit 2  # the repo root: conf/, dvc.yaml
for n in "$@"; do
  if [ ! -f "conf/experiment/kernel_speed_${step}_$n.yaml" ]; then
    have=$(cd conf/experiment && ls kernel_speed_*.yaml 2>/dev/null | sed 's/^kernel_speed_//; s/\.yaml$//' | tr '\n' ' ')
    echo "error: conf/experiment/kernel_speed_${step}_$n.yaml not found; STEP_SHAPE pairs there: $have" >&2
    exit 2
  fi
done
mkdir -p "$out"
source benchmarks/device_env.sh || exit 1
export TRITON_CACHE_DIR=/tmp/triton-cache
dest=reports/campaigns/kernel_speed
stamp=$(date -u +%Y%m%dT%H%M%S)
queued=()
finish() {
  # every queued experiment that finished: its report, records, params and lock, and its queue log; then the pack
  trap - EXIT TERM INT
  for n in ${queued[@]+"${queued[@]}"}; do
    python -m kernelcamp.cli campaign collect "ks-$step-$n-$stamp" "$dest/${step}_$n" || echo "collect: $n not finished"
    dvc queue logs "ks-$step-$n-$stamp" > "$dest/${step}_sweep/$n.log" 2>&1 || true
    grep -h -i -E "decision|faster|slower|equivalent|inconclusive" "$dest/${step}_$n/report.md" 2>/dev/null | head -6
  done
  tar czf "$out/$step.tgz" $dest/${step}_* 2>/dev/null
}
on_signal() {
  # an outer timeout's TERM reaches this shell, not the sweep (its `timeout` runs in its own process group):
  # stop the sweep as its own timeout would, wait for it to stop its servers, then collect (finish, at exit)
  echo "kernel_speed_step.sh: stopped by a signal; stopping the sweep, collecting what finished" >&2
  if [ -n "${sweep_pid:-}" ]; then
    kill -TERM "$sweep_pid" 2>/dev/null
    wait "$sweep_pid" 2>/dev/null
  fi
  exit 143
}
trap finish EXIT
trap on_signal TERM INT
echo "repo at $(git rev-parse HEAD)"
mkdir -p "$dest/${step}_sweep"
for n in "$@"; do
  dvc exp run --queue -n "ks-$step-$n-$stamp" -S "experiment=kernel_speed_${step}_$n" || exit 1
  queued+=("$n")
done
start=$(date +%s)
# in the background with `wait`, so that a signal's trap runs at once (bash defers it past a foreground command)
timeout -s TERM "${SWEEP_TIMEOUT_S:-$((270 * $#))}" python -m kernelcamp.cli sweep --gpus 0 --poll 10 \
  > >(while IFS= read -r line; do echo "$(( $(date +%s) - start ))s $line"; done | tee "$dest/${step}_sweep/sweep.log") \
  2>&1 &
sweep_pid=$!
wait "$sweep_pid"
sweep_pid=
echo "sweep ended after $(( $(date +%s) - start )) s"

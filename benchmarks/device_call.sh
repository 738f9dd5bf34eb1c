#!/usr/bin/env bash
# One device call of the kernel-speed campaign (issue 14) on the lent H200: a clone of one branch, then its
# actions in the order given. Run from the root of the carried working tree, with .whl/ (the wheels of
# ../shared/tools/device-wheels.sh) and .probe/repo.bundle carried (both git-ignored):
#   git bundle create .probe/repo.bundle BRANCH main                                   # here, after each commit
#   bash benchmarks/device_call.sh BRANCH ACTION [ACTION ...]                          # there, OUT set
# ACTION:
#   suite                 the whole GPU suite (`pytest -m gpu`), SUITE_TIMEOUT_S (default 170) -> OUT/gpu_suite.log
#   step:STEP:SHAPE[,..]  a campaign step (benchmarks/kernel_speed_step.sh: one queued DVC experiment per shape,
#                         conf/experiment/kernel_speed_<STEP>_<SHAPE>.yaml), SWEEP_TIMEOUT_S -> OUT/<STEP>.tgz
#   final                 the GPU suite and reports/kernel_bench/ re-measured (benchmarks/kernel_bench_final.sh;
#                         SUITE_TIMEOUT_S, BENCH_TIMEOUT_S) -> OUT/final.tgz
#   bench:NAME:ARGS       benchmarks/bench_kernel.py ARGS (comma lists; spaces as '+', so no literal '+') --out NAME,
#                         BENCH_TIMEOUT_S (default 200) -> OUT/NAME.tgz (kernel_bench.csv, summary.md, the log; packed
#                         at exit too: an outer timeout's TERM stops the bench and returns what it had written)
#   run:NAME:CMD          any command (spaces as '+'), run by bash in the clone, RUN_TIMEOUT_S (default 120) ->
#                         OUT/NAME.log; $CARRIED is the carried tree (e.g. candidate files kept in .probe/)
# A bench or run NAME may not be one of the call's own files: call, head, env, gpu_suite, final, bench_final; no two
# actions may write one OUT file (a bench and a step of one name both write NAME.tgz).
# OUT/head.txt names the branch, its commit, the kernel file's sha256, the GPU, the versions and the date; the
# actions' output is tee'd into OUT/call.log. The clone is made from the bundle (a baseline's kernel_rev needs
# the git history; the carried tree's .git, when it has one, is not the branch). Each action has its own timeout,
# so give the device call's timeout their sum plus about 60 s (the clone, the wheels, the packing).
# Exit status: 2 on a bad argument, OUT unset, or a branch missing from the bundle (one `error:` line, before any
# action runs); 1 when the clone's setup (the wheels, benchmarks/device_env.sh) fails; else that of the last failed
# action.
set -uo pipefail
usage="usage: device_call.sh BRANCH ACTION [ACTION ...]  (ACTION: suite | step:STEP:SHAPE[,SHAPE] | final | bench:NAME:ARGS"
usage="$usage | run:NAME:CMD)"
[ $# -ge 2 ] || { echo "error: $usage" >&2; exit 2; }
[ -n "${OUT:-}" ] || { echo "error: OUT (the folder whose files come back) is not set" >&2; exit 2; }
out=$OUT
case $out in /*) ;; *) out=$PWD/$out ;; esac  # the actions run in the clone
branch=$1
shift
declare -A writes=()  # OUT's file -> the action that writes it: two actions writing one file lose the first's
for a in "$@"; do
  case $a in
    suite) file=gpu_suite.log ;;
    final) file=final.tgz ;;
    step:?*:?*) IFS=: read -r _ name _ <<< "$a"; file=$name.tgz ;;
    bench:?*:?* | run:?*:?*)
      IFS=: read -r kind name _ <<< "$a"
      case $name in
        call | head | env | gpu_suite | final | bench_final)
          echo "error: action '$a': the name '$name' is one of the call's own files; choose another" >&2
          exit 2
          ;;
      esac
      if [ "$kind" = bench ]; then file=$name.tgz; else file=$name.log; fi
      ;;
    *) echo "error: unknown action '$a'; $usage" >&2; exit 2 ;;
  esac
  if [ -n "${writes[$file]:-}" ]; then
    # a bench named as a step packed its folder into the step's OUT/<STEP>.tgz at exit, over the step's experiment
    # (step "h32", 2026-12-08)
    echo "error: actions '${writes[$file]}' and '$a' both write OUT/$file; give one of them another name" >&2
    exit 2
  fi
  writes[$file]=$a
done
[ -f .probe/repo.bundle ] || { echo "error: .probe/repo.bundle not carried; make it here with" \
  "'git bundle create .probe/repo.bundle $branch main' and carry .probe" >&2; exit 2; }
[ -d .whl ] || { echo "error: .whl/ not carried (../shared/tools/device-wheels.sh gathers it)" >&2; exit 2; }
mkdir -p "$out"
log=$out/call.log
kc=${KC_DIR:-/tmp/kc}  # the clone (KC_DIR: for the tests)
rm -rf "$kc" "$kc.bench"
git clone -q -b "$branch" .probe/repo.bundle "$kc" 2>/dev/null \
  || { echo "error: branch '$branch' is not in .probe/repo.bundle (git bundle list-heads .probe/repo.bundle)" >&2; exit 2; }
export CARRIED=$PWD
cp -r .whl "$kc/" && cd "$kc" || exit 1
{
  echo "branch $branch: $(git log --oneline -1)"
  sha256sum kernels/sparse_mla_decode.py
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  date -u +%FT%TZ
} | tee "$out/head.txt"
source benchmarks/device_env.sh > "$out/env.log" 2>&1 || { cat "$out/env.log"; exit 1; }
tail -2 "$out/env.log" | tee -a "$out/head.txt"
export TRITON_CACHE_DIR=/tmp/triton-cache
pack_benches() {  # each bench's folder into OUT/NAME.tgz: after the bench, and at exit (a cut call keeps its rows)
  local d
  for d in "$kc.bench"/*/; do
    [ -d "$d" ] && tar czf "$out/$(basename "$d").tgz" -C "$kc.bench" "$(basename "$d")"
  done
}
trap pack_benches EXIT
# an outer timeout's TERM reaches this shell only: stop the bench or run action going on (started in the background, so
# that the trap runs at once), then exit; the EXIT trap packs what the benches wrote
trap 'echo "device_call.sh: stopped by a signal" >&2; [ -n "${child:-}" ] && kill -TERM "$child" 2>/dev/null; exit 143' \
  TERM INT
rc=0
for a in "$@"; do
  t0=$(date +%s)
  echo "== $a ($(date -u +%T))" | tee -a "$log"
  case $a in
    suite)
      timeout "${SUITE_TIMEOUT_S:-170}" python -m pytest -m gpu -q -p no:cacheprovider 2>&1 \
        | tee "$out/gpu_suite.log" | tail -4 | tee -a "$log"
      r=${PIPESTATUS[0]}
      ;;
    step:*)
      IFS=: read -r _ step shapes <<< "$a"
      bash benchmarks/kernel_speed_step.sh "$out" "$step" ${shapes//,/ } 2>&1 | tee -a "$log" | tail -30
      r=${PIPESTATUS[0]}
      ;;
    final)
      bash benchmarks/kernel_bench_final.sh "$out" 2>&1 | tee -a "$log" | tail -30
      r=${PIPESTATUS[0]}
      ;;
    bench:*)
      IFS=: read -r _ name args <<< "$a"
      mkdir -p "$kc.bench/$name"
      read -r -a argv <<< "${args//+/ }"  # a word list, no glob expansion
      timeout "${BENCH_TIMEOUT_S:-200}" python benchmarks/bench_kernel.py "${argv[@]}" --out "$kc.bench/$name" \
        > "$kc.bench/$name/bench.log" 2>&1 &
      child=$!
      wait "$child"
      r=$?
      child=
      tail -5 "$kc.bench/$name/bench.log" | tee -a "$log"
      pack_benches
      ;;
    run:*)
      IFS=: read -r _ name cmd <<< "$a"
      timeout "${RUN_TIMEOUT_S:-120}" bash -c "${cmd//+/ }" > "$out/$name.log" 2>&1 &
      child=$!
      wait "$child"
      r=$?
      child=
      tail -5 "$out/$name.log" | tee -a "$log"
      ;;
  esac
  echo "== $a: exit $r after $(( $(date +%s) - t0 )) s" | tee -a "$log"
  [ "$r" -eq 0 ] || rc=$r
done
ls -la "$out" | tee -a "$log"
exit "$rc"

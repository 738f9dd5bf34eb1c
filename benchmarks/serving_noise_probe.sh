#!/usr/bin/env bash
# Serving-noise check (issue 12), on the lent H200 from the repo root with .whl/ carried:
#   bash benchmarks/serving_noise_probe.sh OUTDIR [BEFORE_TREE]
# One embedded server (this tree's params.yaml: variant and workload) loaded by this tree's
# `kernelcamp loadgen` at concurrency 64, five back-to-back runs (128 requests of 256 tokens each).
# With BEFORE_TREE (another checkout of this repo, carried to the device, e.g. made by
#   mkdir -p .probe/before && git archive <commit> | tar -x -C .probe/before && cp -r kernels .probe/before/
# and run with carry [".probe/before"]) the same five runs go first to a server started from that tree
# (its kernelcamp and its kernels/: copying this tree's kernels/ over keeps the comparison to the
# server; the summary warns when the kernel sources differ), then to one from this tree: one device
# call compares two servers. Each run is one line of OUTDIR/serving_noise.jsonl: the loadgen JSON row
# plus "tree" ("before" or "after"; "after" is this tree), "run", and the server's own statistics of
# the decode steps it recorded during that run (/v1/kernelcamp/info?since=<step index before it>;
# benchmarks/serving_noise_summary.py makes the line; times in ms, profiled steps left out):
#   server_decode_steps, server_decode_step_ms_{mean,p50,p90}  the step_ms of those steps (host wall time
#                                  of the model call: input copies, launch, the sync of .tolist())
#   server_decode_gpu_ms_{mean,p50,p90}, server_decode_gpu_ms_steps  GPU time of the graph replay (CUDA
#                                  events around it) over the steps that have it; step_ms - gpu_ms is host
#   server_decode_{load,launch,sync}_ms_{mean,p50,p90}  the host parts of step_ms, in order: building and
#                                  copying the inputs; from the first event to the replay's return (GPU
#                                  idle waiting for the launch, e.g. the model thread waiting for the GIL,
#                                  is inside gpu_ms, so a large launch_ms means that step's gpu_ms is not
#                                  all GPU work); .tolist() (waiting for the GPU, then for the GIL).
#                                  sync_ms - (gpu_ms - launch_ms) ~ the host's delay after the GPU is done
#   server_buckets                 padded graph batch -> {n (decode steps), step_ms_p50, gpu_ms_p50}
#   server_decode_period_ms_mean   wall time from the first to the last of them / (steps - 1)
#   server_decode_gap_ms_{mean,p50}  host time between consecutive decode steps (no prefill between)
#   server_decode_steps_after_prefill  decode steps that had prefills just before them
#   server_kernel_source_hash, server_variant_hash   what ran (the trees should differ in the server only)
# and the GPU as nvidia-smi sampled it every 100 ms during the run (nvidia-smi -i $SMI_GPU, default 0;
# raw samples in OUTDIR/smi_<tree>_<run>.csv; null where nvidia-smi or a field is missing):
#   sm_clock_mhz_{mean,min,max}, mem_clock_mhz_mean, power_w_mean   over the busy samples (no gpu_idle
#                                  reason: the run's idle start and end would set the minimum)
#   temp_c_max, smi_samples, smi_samples_busy
#   throttle_reasons (distinct clocks_throttle_reasons.active values), throttle_reason_names (NVML bits)
# A gpu_ms from the "before" tree is null when that tree did not record it. Printed: per run on stderr,
# tok/s, tpot p50, step p50, gpu p50, load p50, sync p50, launch p90, gap p50, mean and min SM clock,
# throttle reasons; at the end on stdout, per tree, the tok/s spread and the five runs' step p50, gpu
# p50, period and mean SM clock.
# step_ms is not the same quantity in both trees: before the model thread (commit "serve (issue 12)")
# it was timed on the event loop around the awaited step, so it includes the wait for the loop to
# resume the scheduler; after, it is the model step alone. The period is comparable across trees.
# BEFORE_PYTHONPATH (optional): folders put first on the before server's PYTHONPATH only, e.g. one
# whose httptools.py raises ImportError, so that uvicorn falls back to h11 as it did before httptools
# was a dependency; BEFORE_PARAMS (optional): the params file of the before server (one without
# the keys its tree does not know). Each server's info (at its start) is kept as OUTDIR/info_<tree>.json.
# The pinned mode (server and load generator on their own CPUs) is gone: on the H200 it did not
# change the spread (reports/campaigns/decisions/README.md, 2026-12-01).
set -u
W=${1:?usage: serving_noise_probe.sh OUTDIR [BEFORE_TREE]}
BEFORE=${2:-}
if [ -n "$BEFORE" ]; then
  [ -f "$BEFORE/kernelcamp/serve/server.py" ] || { echo "error: $BEFORE: not a checkout of this repo" >&2; exit 2; }
  BEFORE=$(cd "$BEFORE" && pwd)
fi
HERE=$PWD
mkdir -p "$W"
[ -e "$W/serving_noise.jsonl" ] && { echo "error: $W/serving_noise.jsonl exists: give a new OUTDIR" >&2; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PATH="/tmp/site/bin:$PATH"
PORT=8811
URL="http://127.0.0.1:$PORT"

step_index() {
  curl -sf "$URL/v1/kernelcamp/info?steps=0" \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["counts"]["step_index"])'
}

# The --query-gpu fields this nvidia-smi takes (newer drivers name the throttle reasons clocks_event_reasons;
# without either, the rest): nothing when nvidia-smi is missing or refuses them all.
SMI_GPU=${SMI_GPU:-0}
SMI_WANT=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active
SMI_FIELDS=
if command -v nvidia-smi >/dev/null 2>&1; then
  for f in "$SMI_WANT" "${SMI_WANT/clocks_throttle_reasons/clocks_event_reasons}" "${SMI_WANT%,*}"; do
    if nvidia-smi -i "$SMI_GPU" --query-gpu="$f" --format=csv,noheader,nounits >/dev/null 2>&1; then
      SMI_FIELDS=$f
      break
    fi
  done
fi
[ -n "$SMI_FIELDS" ] || echo "warning: no nvidia-smi samples (missing, or it refuses the fields): GPU fields are null" >&2

# smi_start FILE: sample the GPU every 100 ms into FILE in the background (its pid in SMI_PID, empty if none)
smi_start() {
  SMI_PID=
  if [ -z "$SMI_FIELDS" ]; then echo "# nvidia-smi: none" > "$1"; return 0; fi
  echo "# fields: $SMI_FIELDS" > "$1"
  nvidia-smi -i "$SMI_GPU" --query-gpu="$SMI_FIELDS" --format=csv,noheader,nounits -lms 100 >> "$1" 2>/dev/null &
  SMI_PID=$!
}
smi_stop() {
  if [ -n "$SMI_PID" ]; then kill "$SMI_PID" 2>/dev/null; wait "$SMI_PID" 2>/dev/null; fi
  SMI_PID=
}
SMI_PID=
trap smi_stop EXIT

# probe TREE LABEL: a fresh server from TREE, five load runs, one JSON line each
probe() {
  local tree=$1 label=$2 pid since r
  local pre= params="$HERE/params.yaml"
  [ "$label" = before ] && pre=${BEFORE_PYTHONPATH:+$BEFORE_PYTHONPATH:} && params=${BEFORE_PARAMS:-$params}
  (cd "$tree" && PYTHONPATH="$pre$tree:$PYTHONPATH" exec python3 -m kernelcamp.cli serve --params "$params" \
    --port $PORT --device cuda:0) > "$W/server_$label.log" 2>&1 &
  pid=$!
  for _ in $(seq 240); do curl -sf "$URL/health" >/dev/null && break; sleep 0.5; done
  if ! curl -sf "$URL/health" >/dev/null; then
    echo "error: the $label server ($tree) is not healthy after 120 s; see $W/server_$label.log" >&2
    kill $pid 2>/dev/null; wait $pid 2>/dev/null
    return 1
  fi
  curl -sf "$URL/v1/kernelcamp/info?steps=0" > "$W/info_$label.json"
  for r in 1 2 3 4 5; do
    since=$(step_index)
    smi_start "$W/smi_${label}_$r.csv"
    PYTHONPATH="$HERE:$PYTHONPATH" python3 -m kernelcamp.cli loadgen --url "$URL" --concurrency 64 \
      --num-requests 128 --max-tokens 256 --json 2>>"$W/loadgen_$label.log" | head -1 > "$W/.run.json"
    smi_stop
    curl -sf "$URL/v1/kernelcamp/info?since=$since" > "$W/.info.json"
    python3 "$HERE/benchmarks/serving_noise_summary.py" row "$label" "$r" "$W/.run.json" "$W/.info.json" \
      "$W/smi_${label}_$r.csv" >> "$W/serving_noise.jsonl"
  done
  kill $pid; wait $pid 2>/dev/null
  return 0
}

if [ -n "$BEFORE" ]; then probe "$BEFORE" before || exit 1; fi
probe "$HERE" after || exit 1
rm -f "$W/.run.json" "$W/.info.json"
python3 "$HERE/benchmarks/serving_noise_summary.py" summary "$W/serving_noise.jsonl"

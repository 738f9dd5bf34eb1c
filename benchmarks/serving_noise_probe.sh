#!/usr/bin/env bash
# Serving-noise check (issue 12), on the lent H200 from the repo root with .whl/ carried:
#   bash benchmarks/serving_noise_probe.sh OUTDIR
# One embedded server (params.yaml's variant and workload) loaded by `kernelcamp loadgen` at
# concurrency 64, five back-to-back runs; then the same with the server on CPUs 2-5 and the load
# generator on CPUs 8-11 (taskset). The output tok/s of each run goes to OUTDIR/serving_noise.jsonl;
# the spread between runs of one server is the noise that a serving A/B has to beat.
set -u
W=${1:?usage: serving_noise_probe.sh OUTDIR}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PATH="/tmp/site/bin:$PATH"
PORT=8811
for mode in unpinned pinned; do
  if [ $mode = pinned ]; then SRV="taskset -c 2-5"; GEN="taskset -c 8-11"; else SRV=""; GEN=""; fi
  $SRV python3 -m kernelcamp.cli serve --params params.yaml --port $PORT --device cuda:0 > "$W/server_$mode.log" 2>&1 &
  pid=$!
  for i in $(seq 120); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.5; done
  for r in 1 2 3 4 5; do
    $GEN python3 -m kernelcamp.cli loadgen --url "http://127.0.0.1:$PORT" --concurrency 64 --num-requests 128 \
      --max-tokens 256 --json 2>/dev/null | head -1 | sed "s/^{/{\"mode\": \"$mode\", \"run\": $r, /" \
      | tee -a "$W/serving_noise.jsonl" | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); print(d["mode"], d["run"], round(d.get("output_tok_s", 0)), "tok/s tpot p50", d.get("tpot_ms_p50"))'
  done
  kill $pid; wait $pid 2>/dev/null
done

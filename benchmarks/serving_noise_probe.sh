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
# the decode steps it recorded during that run (/v1/kernelcamp/info?since=<step index before it>):
#   server_decode_steps, server_decode_step_ms_{mean,p50,p90}  the step_ms of those steps
#   server_decode_period_ms_mean   wall time from the first to the last of them / (steps - 1)
#   server_kernel_source_hash, server_variant_hash   what ran (the trees should differ in the server only)
# step_ms is not the same quantity in both trees: before the model thread (commit "serve (issue 12)")
# it was timed on the event loop around the awaited step, so it includes the wait for the loop to
# resume the scheduler; after, it is the model step alone. The period is comparable across trees.
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

# probe TREE LABEL: a fresh server from TREE, five load runs, one JSON line each
probe() {
  local tree=$1 label=$2 pid since r
  (cd "$tree" && PYTHONPATH="$tree:$PYTHONPATH" exec python3 -m kernelcamp.cli serve --params "$HERE/params.yaml" \
    --port $PORT --device cuda:0) > "$W/server_$label.log" 2>&1 &
  pid=$!
  for _ in $(seq 240); do curl -sf "$URL/health" >/dev/null && break; sleep 0.5; done
  if ! curl -sf "$URL/health" >/dev/null; then
    echo "error: the $label server ($tree) is not healthy after 120 s; see $W/server_$label.log" >&2
    kill $pid 2>/dev/null; wait $pid 2>/dev/null
    return 1
  fi
  for r in 1 2 3 4 5; do
    since=$(step_index)
    PYTHONPATH="$HERE:$PYTHONPATH" python3 -m kernelcamp.cli loadgen --url "$URL" --concurrency 64 \
      --num-requests 128 --max-tokens 256 --json 2>>"$W/loadgen_$label.log" | head -1 > "$W/.run.json"
    curl -sf "$URL/v1/kernelcamp/info?since=$since" > "$W/.info.json"
    python3 - "$label" "$r" "$W/.run.json" "$W/.info.json" >> "$W/serving_noise.jsonl" <<'PY'
import json, statistics, sys
label, run, run_path, info_path = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
text = open(run_path).read().strip()
row = {"tree": label, "run": run, **(json.loads(text) if text else {"error": "loadgen wrote no JSON row"})}
try:
    info = json.load(open(info_path))
except ValueError:
    info = {}
dec = [s for s in info.get("steps", []) if s["kind"] == "decode" and not s.get("profiled")]
ms = sorted(s["step_ms"] for s in dec)
row["server_decode_steps"] = len(dec)
if len(ms) >= 2:
    q = statistics.quantiles(ms, n=10, method="inclusive")
    row.update(server_decode_step_ms_mean=round(statistics.fmean(ms), 4), server_decode_step_ms_p50=round(q[4], 4))
    row.update(server_decode_step_ms_p90=round(q[8], 4))
    row["server_decode_period_ms_mean"] = round((dec[-1]["t"] - dec[0]["t"]) * 1e3 / (len(dec) - 1), 4)
row["server_kernel_source_hash"] = info.get("kernel_source_hash")
row["server_variant_hash"] = info.get("variant_hash")
print(json.dumps(row))
print(label, run, round(row.get("output_tok_s", 0)), "tok/s, tpot p50", row.get("tpot_ms_p50"), "ms, server step p50",
      row.get("server_decode_step_ms_p50"), "ms, period", row.get("server_decode_period_ms_mean"), "ms",
      file=sys.stderr)
PY
  done
  kill $pid; wait $pid 2>/dev/null
  return 0
}

if [ -n "$BEFORE" ]; then probe "$BEFORE" before || exit 1; fi
probe "$HERE" after || exit 1
rm -f "$W/.run.json" "$W/.info.json"
python3 - "$W/serving_noise.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(x) for x in open(sys.argv[1]) if x.strip()]
for tree in ("before", "after"):
    got = [r for r in rows if r.get("tree") == tree and "output_tok_s" in r]
    if len(got) < 2:
        continue
    tok = [r["output_tok_s"] for r in got]
    per = [r.get("server_decode_period_ms_mean") for r in got]
    p50 = [r.get("server_decode_step_ms_p50") for r in got]
    m = statistics.fmean(tok)
    print(f"{tree}: output tok/s mean {m:.0f}, cv {100 * statistics.stdev(tok) / m:.1f}%, "
          f"range {100 * (max(tok) - min(tok)) / m:.1f}% over {len(tok)} runs; "
          f"server decode period ms {per}; step_ms p50 {p50}")
hashes = {r["tree"]: r.get("server_kernel_source_hash") for r in rows}
if len(set(hashes.values())) > 1:
    print(f"warning: the trees ran different kernel sources {hashes}: not a server-only comparison", file=sys.stderr)
PY

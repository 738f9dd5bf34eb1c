"""One JSON line per load run of ``serving_noise_probe.sh`` (issue 12), and the probe's closing summary.

    python benchmarks/serving_noise_summary.py row LABEL RUN LOADGEN_JSON INFO_JSON SMI_CSV  # a line on stdout
    python benchmarks/serving_noise_summary.py summary serving_noise.jsonl                   # per-tree spread

``row`` merges the loadgen JSON row, the server's step records of the run (``/v1/kernelcamp/info?since=I``,
fields in :meth:`kernelcamp.serve.server.Engine.stats`) and the ``nvidia-smi`` samples taken during the
run, and prints a one-line digest on stderr. A missing or unreadable input gives nulls, never an error:
a probe run on the GPU machine must not lose its other runs to one bad file.

The nvidia-smi file (written by the probe): a first line ``# fields: f1,f2,...`` naming the
``--query-gpu`` fields in order, then ``--format=csv,noheader,nounits`` lines. Without that line (no
nvidia-smi) or without samples, every GPU field is null.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

#: NVML clock event (throttle) reason bits, from the NVML API reference (nvmlClocksThrottleReasons,
#: R525; the same bits are nvmlClocksEventReasons in R550+). A bit not named here is kept as hex.
THROTTLE_BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


def spread(xs: list[float]) -> dict[str, float | None]:
    """``{"mean", "p50", "p90"}`` of ``xs`` (inclusive quantiles), rounded to 4 places; all None when empty."""
    if not xs:
        return {"mean": None, "p50": None, "p90": None}
    if len(xs) == 1:
        return {"mean": round(xs[0], 4), "p50": round(xs[0], 4), "p90": round(xs[0], 4)}
    q = statistics.quantiles(xs, n=10, method="inclusive")
    return {"mean": round(statistics.fmean(xs), 4), "p50": round(q[4], 4), "p90": round(q[8], 4)}


def decode_fields(info: dict[str, Any]) -> dict[str, Any]:
    """The server's view of one run from its info answer (``info["steps"]``: the run's step records).

    Decode steps not run under the profiler count. Times in ms. ``server_buckets``: padded graph batch
    -> ``{"n", "step_ms_p50", "gpu_ms_p50"}`` (keys are strings, JSON's). ``server_decode_gap_ms_*``:
    from the end of one decode step to the end of the next, less the later step's ``step_ms`` (host
    time between steps: scheduling, emitting tokens; ``t`` has 0.1 ms resolution), over consecutive
    records only (no prefill between). ``server_decode_steps_after_prefill``: decode steps whose
    record says prefills ran before them. ``server_decode_{gpu,load,launch,sync}_ms_*``: the step's
    split (see :meth:`kernelcamp.serve.model.DecoderModel.decode`), None for steps without them (a
    CPU for gpu and launch, or a server from before they were recorded). ``server_gc_ms_{sum,max}``: the
    records' ``gc_ms`` (every record, prefills too: collector pauses of the engine process);
    ``{engine,front}_gc_pause_ms_since_start`` and ``..._full_collections_since_start``: that process's
    collector since it started (from info's ``gc`` and ``front_gc``); None from a server without them."""
    dec = [s for s in info.get("steps") or [] if s.get("kind") == "decode" and not s.get("profiled")]
    out: dict[str, Any] = {"server_decode_steps": len(dec)}
    for key in ("step_ms", "gpu_ms", "load_ms", "launch_ms", "sync_ms"):
        vals = [float(s[key]) for s in dec if s.get(key) is not None]
        for stat, v in spread(vals).items():
            out[f"server_decode_{key[:-3]}_ms_{stat}"] = v
    out["server_decode_gpu_ms_steps"] = sum(1 for s in dec if s.get("gpu_ms") is not None)
    out["server_decode_period_ms_mean"] = (
        round((dec[-1]["t"] - dec[0]["t"]) * 1e3 / (len(dec) - 1), 4) if len(dec) >= 2 else None
    )
    gaps = [
        (b["t"] - a["t"]) * 1e3 - b["step_ms"]
        for a, b in zip(dec, dec[1:], strict=False)
        if b.get("index") == a.get("index", -2) + 1  # consecutive records: no prefill (or profiled step) between
    ]
    g = spread(gaps)
    out["server_decode_gap_ms_mean"], out["server_decode_gap_ms_p50"] = g["mean"], g["p50"]
    out["server_decode_steps_after_prefill"] = sum(1 for s in dec if s.get("prefills"))
    buckets: dict[str, Any] = {}
    for bucket in sorted({s.get("bucket") for s in dec if s.get("bucket") is not None}):
        mine = [s for s in dec if s.get("bucket") == bucket]
        gpu = [float(s["gpu_ms"]) for s in mine if s.get("gpu_ms") is not None]
        buckets[str(bucket)] = {
            "n": len(mine),
            "step_ms_p50": spread([float(s["step_ms"]) for s in mine])["p50"],
            "gpu_ms_p50": spread(gpu)["p50"],
        }
    out["server_buckets"] = buckets
    # the garbage collector's pauses (kernelcamp.serve.gcwatch): per record since the previous one, and
    # each process's total since its start (front: the HTTP front; None from a server without them)
    recs = info.get("steps") or []
    gcs = [float(s["gc_ms"]) for s in recs if s.get("gc_ms") is not None]
    out["server_gc_ms_sum"] = round(sum(gcs), 3) if gcs else None
    out["server_gc_ms_max"] = round(max(gcs), 3) if gcs else None
    for key, name in (("gc", "engine"), ("front_gc", "front")):
        snap = info.get(key) or {}
        out[f"{name}_gc_pause_ms_since_start"] = round(sum(snap["pause_ms"]), 3) if snap.get("pause_ms") else None
        out[f"{name}_gc_full_collections_since_start"] = (snap.get("collections") or [None] * 3)[2]
    out["server_kernel_source_hash"] = info.get("kernel_source_hash")
    out["server_variant_hash"] = info.get("variant_hash")
    return out


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # "[N/A]", "[Not Supported]", ""
        return None


def smi_fields(text: str | None) -> dict[str, Any]:
    """GPU clocks, power and temperature over the run from the probe's nvidia-smi file (see the module doc).

    ``sm_clock_mhz_{mean,min,max}``, ``mem_clock_mhz_mean`` and ``power_w_mean`` over the busy
    samples (those whose throttle reasons lack the gpu_idle bit: the run's idle start and end, at idle
    clocks, would otherwise set the minimum; all samples when the reasons were not sampled),
    ``temp_c_max`` over all, ``throttle_reasons`` (distinct raw values, as printed),
    ``throttle_reason_names`` (the NVML bits set in any of them), ``smi_samples``, ``smi_samples_busy``.
    None (or empty lists) for a field that was not queried, not supported (``[N/A]``) or never
    sampled; ``text`` None: no file."""
    names: list[str] = []
    rows: list[list[str]] = []
    for line in (text or "").splitlines():
        line = line.strip()
        if line.startswith("# fields:"):
            names = [f.strip() for f in line[len("# fields:") :].split(",")]
        elif line and not line.startswith("#") and names:
            cells = [c.strip() for c in line.split(",")]
            if len(cells) == len(names):
                rows.append(cells)

    def col(rows: list[list[str]], *fields: str) -> list[str]:
        for f in fields:
            if f in names:
                return [r[names.index(f)] for r in rows]
        return []

    def nums(rows: list[list[str]], field: str) -> list[float]:
        return [x for x in (_number(c) for c in col(rows, field)) if x is not None]

    reason_fields = ("clocks_throttle_reasons.active", "clocks_event_reasons.active")
    masks = [_mask(c) for c in col(rows, *reason_fields)]
    busy = [r for r, m in zip(rows, masks, strict=True) if not (m or 0) & 0x1] if masks else rows
    sm, mem, power = nums(busy, "clocks.sm"), nums(busy, "clocks.mem"), nums(busy, "power.draw")
    temp = nums(rows, "temperature.gpu")
    reasons = sorted({c for c in col(rows, *reason_fields) if c})
    bits = 0
    for m in masks:
        bits |= m or 0
    named = [THROTTLE_BITS.get(1 << i, hex(1 << i)) for i in range(bits.bit_length()) if bits >> i & 1]
    return {
        "sm_clock_mhz_mean": round(statistics.fmean(sm), 1) if sm else None,
        "sm_clock_mhz_min": min(sm) if sm else None,
        "sm_clock_mhz_max": max(sm) if sm else None,
        "mem_clock_mhz_mean": round(statistics.fmean(mem), 1) if mem else None,
        "power_w_mean": round(statistics.fmean(power), 2) if power else None,
        "temp_c_max": max(temp) if temp else None,
        "throttle_reasons": reasons,
        "throttle_reason_names": named,
        "smi_samples": len(rows),
        "smi_samples_busy": len(busy),
    }


def _mask(text: str) -> int | None:
    try:
        return int(text, 16)
    except ValueError:  # "[N/A]", "[Not Supported]", ""
        return None


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError):
        return None


def run_row(label: str, run: int, loadgen_text: str | None, info: dict[str, Any], smi_text: str | None) -> dict:
    """One run's JSON row: tree label, run number, the loadgen row, :func:`decode_fields`, :func:`smi_fields`."""
    text = (loadgen_text or "").strip()
    try:
        load = json.loads(text) if text else {"error": "loadgen wrote no JSON row"}
    except ValueError:
        load = {"error": "loadgen's row is not JSON"}
    return {"tree": label, "run": run, **load, **decode_fields(info), **smi_fields(smi_text)}


def run_line(row: dict[str, Any]) -> str:
    """The human digest of one run's row (the probe prints it on stderr)."""
    return (
        f"{row['tree']} {row['run']}: {round(row.get('output_tok_s') or 0)} tok/s, "
        f"tpot p50 {row.get('tpot_ms_p50')} ms, "
        f"step p50 {row.get('server_decode_step_ms_p50')} ms, gpu p50 {row.get('server_decode_gpu_ms_p50')} ms, "
        f"load p50 {row.get('server_decode_load_ms_p50')} ms, sync p50 {row.get('server_decode_sync_ms_p50')} ms, "
        f"launch p90 {row.get('server_decode_launch_ms_p90')} ms, gap p50 {row.get('server_decode_gap_ms_p50')} ms, "
        f"gc {row.get('server_gc_ms_sum')} ms (max {row.get('server_gc_ms_max')}), "
        f"SM clock mean {row.get('sm_clock_mhz_mean')} MHz (min {row.get('sm_clock_mhz_min')}), "
        f"throttle {','.join(row.get('throttle_reason_names') or []) or '-'}"
    )


def summary_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Per tree (the rows' ``tree``, or ``mode`` in the probe's older files, in order of appearance) with
    two or more completed runs: tok/s spread, and per run step p50, gpu p50, SM clock."""
    lines = []
    trees = list(dict.fromkeys(r.get("tree", r.get("mode")) for r in rows))
    for tree in trees:
        got = [r for r in rows if r.get("tree", r.get("mode")) == tree and "output_tok_s" in r]
        if len(got) < 2:
            continue
        tok = [r["output_tok_s"] for r in got]
        m = statistics.fmean(tok)
        lines.append(
            f"{tree}: output tok/s mean {m:.0f}, cv {100 * statistics.stdev(tok) / m:.1f}%, "
            f"range {100 * (max(tok) - min(tok)) / m:.1f}% over {len(tok)} runs; per run: "
            f"step_ms p50 {[r.get('server_decode_step_ms_p50') for r in got]}, "
            f"gpu_ms p50 {[r.get('server_decode_gpu_ms_p50') for r in got]}, "
            f"period ms {[r.get('server_decode_period_ms_mean') for r in got]}, "
            f"SM MHz mean {[r.get('sm_clock_mhz_mean') for r in got]}"
        )
    return lines


def main(argv: list[str]) -> int:
    """``row`` or ``summary`` (see the module doc); exit status 2 on a bad command line."""
    if len(argv) == 6 and argv[0] == "row":
        label, run, load_path, info_path, smi_path = argv[1:]
        if not run.isdigit():
            print(f"error: RUN {run!r}: expected a run number", file=sys.stderr)
            return 2
        try:
            info = json.loads(_read(info_path) or "")
        except ValueError:
            info = {}
        row = run_row(label, int(run), _read(load_path), info if isinstance(info, dict) else {}, _read(smi_path))
        print(json.dumps(row))
        print(run_line(row), file=sys.stderr)
        return 0
    if len(argv) == 2 and argv[0] == "summary":
        text = _read(argv[1])
        if text is None:
            print(f"error: {argv[1]}: cannot read it", file=sys.stderr)
            return 2
        rows = [json.loads(x) for x in text.splitlines() if x.strip()]
        lines = summary_lines(rows)
        if not lines:
            print(f"error: {argv[1]}: no tree with two or more completed runs", file=sys.stderr)
            return 1
        for line in lines:
            print(line)
        hashes = {r.get("tree"): r.get("server_kernel_source_hash") for r in rows if r.get("server_kernel_source_hash")}
        if len(set(hashes.values())) > 1:
            print(
                f"warning: the trees ran different kernel sources {hashes}: not a server-only comparison",
                file=sys.stderr,
            )
        return 0
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

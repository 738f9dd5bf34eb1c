"""Profiles for the benchmark stage: Kineto traces and the per-kernel time table.

The serving servers' decode steps are profiled when serving ran (:func:`server_profile`); otherwise a
few kernel launches per impl stand in (:func:`kernel_launch_profile`). Either way each impl gets one
gzipped chrome trace; a run with no profile gets a placeholder trace saying why.
"""

from __future__ import annotations

import gzip
import shutil
import tempfile
from pathlib import Path

from kernelcamp.io import atomic_path
from kernelcamp.kernel_bench import dot_dtype, launch_args, run_batch_sizes

#: Kernels per impl kept in the report's profile table.
TOP_KERNELS = 12

TABLE_COLS = (
    "impl",
    "source",
    "name",
    "calls",
    "device_time_us_total",
    "device_time_us_mean",
    "share_pct",
    "steps",
    "batch",
    "device",
    "time_kind",
    "mode",
)


def baseline_trace_path(trace: str | Path) -> Path:
    """``reports/trace.json.gz`` -> ``reports/trace.baseline.json.gz`` (the baseline's trace)."""
    trace = Path(trace)
    name = trace.name
    stem = name[: -len(".json.gz")] if name.endswith(".json.gz") else trace.stem
    return trace.with_name(f"{stem}.baseline.json.gz")


def placeholder_trace(path: Path, why: str) -> None:
    """An empty chrome trace saying why there is no profile (the declared output always exists)."""
    import json

    with atomic_path(path) as out, gzip.open(out, "wt") as f:
        json.dump({"traceEvents": [], "kernelcamp_note": why}, f)


def kernel_launch_profile(
    variants: dict, params: dict, device: str, traces: dict[str, Path]
) -> tuple[list[dict], dict]:
    """Fallback: torch.profiler (Kineto) of a few kernel launches per impl (one trace each); rows of
    the per-kernel table with ``source: kernel_launches``."""
    import time

    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprof

    from kernelcamp.serving.server import ANNOTATION_PREFIX, kernel_rows
    from kernelcamp.spec import import_kernel

    k = import_kernel(params["kernel"]["module"])

    B = run_batch_sizes(params, device)[-1]
    args = launch_args(params, device, B, seed=0)
    dot = dot_dtype(params, device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    steps = params["benchmark"]["profile"]["decode_steps"] if device == "cuda" else 1
    rows, meta = [], {}
    for name, v in variants.items():
        fn = k.SparseMLADecode(v, dot_dtype=dot)
        fn(*args, check_indices=False)  # compile / autotune outside the trace
        if device == "cuda":
            torch.cuda.synchronize()
        with tprof(activities=acts) as prof:
            t0 = time.perf_counter()
            for _ in range(steps):
                with torch.profiler.record_function(f"{ANNOTATION_PREFIX}impl={name}"):
                    fn(*args, check_indices=False)
            if device == "cuda":
                torch.cuda.synchronize()
            wall_us = (time.perf_counter() - t0) * 1e6
        with tempfile.TemporaryDirectory() as tmp:
            raw = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(raw))
            with atomic_path(traces[name]) as out, open(raw, "rb") as src, gzip.open(out, "wb") as dst:
                shutil.copyfileobj(src, dst)
        kr = kernel_rows(prof, device == "cuda", wall_us)
        kind = "device_kernel_time" if device == "cuda" else "cpu_op_self_time"
        meta[name] = {
            "source": "kernel_launches",
            "steps": steps,
            "batch_sizes": [B] * steps,
            "device": device,
            "time_kind": kind,
            "mode": "kernel launches (no server)",
            "kernel_rows": len(kr),
            "kernels": kr[:TOP_KERNELS],
            "trace_path": str(traces[name]),
            "share_pct_of": "the launches' wall time",
        }
        rows += [
            {
                "impl": name,
                "source": "kernel_launches",
                **r,
                "steps": steps,
                "batch": B,
                "device": device,
                "time_kind": kind,
                "mode": "kernel launches (no server)",
            }
            for r in kr[:40]
        ]
    return rows, meta


def server_profile(params: dict, deploy: dict, serving: dict, traces: dict[str, Path]) -> tuple[list[dict], dict, str]:
    """The decode-step profiles of the serving benchmark's servers -> (table rows, per impl meta,
    why not); rows empty (with why) when the servers cannot be profiled."""
    if not serving.get("levels"):
        return [], {}, f"serving not measured ({serving.get('skipped') or 'no levels'})"
    from kernelcamp.serving.bench import profile_decode_steps

    steps = int(params["benchmark"]["profile"].get("decode_steps") or 5)
    try:
        got = profile_decode_steps(params, deploy, {k_: str(v) for k_, v in traces.items()}, steps)
    except Exception as e:  # noqa: BLE001 - the kernel-launch profile stands in, with the reason
        return [], {}, f"profiling the servers failed: {type(e).__name__}: {e}"
    if got.get("skipped"):
        return [], {}, got["skipped"]
    rows, meta = [], {}
    for impl, r in got["impls"].items():
        if r.get("skipped") or not r.get("kernels"):
            meta[impl] = {"source": "server_decode_steps", "skipped": r.get("skipped") or "no rows"}
            continue
        batch = max(set(r["batch_sizes"]), key=r["batch_sizes"].count)
        meta[impl] = {
            "source": "server_decode_steps",
            **{k_: v for k_, v in r.items() if k_ not in ("kernels", "load_rows")},
            "kernels": r["kernels"][:TOP_KERNELS],
            "concurrency": got["concurrency"],
        }
        rows += [
            {
                "impl": impl,
                "source": "server_decode_steps",
                **{k_: row[k_] for k_ in ("name", "calls", "device_time_us_total", "device_time_us_mean")},
                "share_pct": row["share_pct"],
                "steps": r["steps"],
                "batch": batch,
                "device": r.get("device"),
                "time_kind": r.get("time_kind"),
                "mode": r.get("mode"),
            }
            for row in r["kernels"]
        ]
    if not any(m.get("kernels") for m in meta.values()):
        return [], meta, "; ".join(f"{i}: {m.get('skipped')}" for i, m in meta.items()) or "no profile rows"
    return rows, meta, ""

"""Profiles for the benchmark stage: Kineto traces and the per-kernel time table.

The serving servers' decode steps are profiled when serving ran (:func:`server_profile`); otherwise a
few kernel launches per impl stand in (:func:`kernel_launch_profile`). Either way each impl gets one
gzipped chrome trace; a run with no profile gets a placeholder trace saying why.
"""

from __future__ import annotations

import gzip
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from kernelcamp.bench.kernel import dot_dtype, impl_kernels, launch_args, run_batch_sizes
from kernelcamp.bench.serving import (
    _check_baseline,
    baseline_server,
    baseline_why_not,
    check_server,
    fetch_info,
    server_on_cpu,
    serving_plan,
)
from kernelcamp.io import atomic_path
from kernelcamp.loadgen import default_prompts, run_load
from kernelcamp.serve.client import INFO_PATH, PROFILE_PATH, request_profile

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

    from kernelcamp.serve.server import ANNOTATION_PREFIX, kernel_rows

    modules = impl_kernels(params, variants)  # the baseline's: the file at baseline.kernel_rev when set
    B = run_batch_sizes(params, device)[-1]
    args = launch_args(params, device, B, seed=0)
    dot = dot_dtype(params, device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    steps = params["benchmark"]["profile"]["decode_steps"] if device == "cuda" else 1
    rows, meta = [], {}
    for name, v in variants.items():
        fn = modules[name].SparseMLADecode(v, dot_dtype=dot)
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


def server_profile(
    params: dict, deploy: dict, serving: dict, traces: dict[str, Path], baseline: dict | None = None
) -> tuple[list[dict], dict, str]:
    """The decode-step profiles of the serving benchmark's servers -> (table rows, per impl meta,
    why not); rows empty (with why) when the servers cannot be profiled. ``baseline``: the serving
    benchmark's baseline server, still running (:func:`profile_decode_steps`)."""
    if not serving.get("levels"):
        return [], {}, f"serving not measured ({serving.get('skipped') or 'no levels'})"
    steps = int(params["benchmark"]["profile"].get("decode_steps") or 5)
    try:
        got = profile_decode_steps(params, deploy, {k_: str(v) for k_, v in traces.items()}, steps, baseline=baseline)
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


# ---- decode-step profiles of the serving servers ------------------------------------------------


def _profile_one(
    url: str,
    check: Any,
    concurrency: int,
    max_tokens: int,
    steps: int,
    trace_path: str,
    timeout_s: float,
) -> dict[str, Any]:
    """Load ``url`` at ``concurrency`` in a background thread and profile ``steps`` decode steps once
    the batch is full (or the wait gives up); on a GPU, a graph-replay profile without a single
    device kernel is retried with ``eager: true``."""
    import time

    info = fetch_info(url)
    check(info)
    max_running = int(((info or {}).get("config") or {}).get("max_running_requests") or concurrency)
    want = max(1, min(concurrency, max_running))
    load: dict[str, Any] = {}

    def _load() -> None:
        try:
            load["rows"] = run_load(
                url,
                [concurrency],
                prompts=default_prompts(),
                max_tokens=max_tokens,
                num_prompts_per_level=2 * concurrency,
                timeout_s=timeout_s,
                progress=False,
            )
        except Exception as e:  # noqa: BLE001 - reported with the profile
            load["error"] = f"{type(e).__name__}: {e}"

    th = threading.Thread(target=_load, name="kernelcamp-profile-load", daemon=True)
    th.start()
    t_end = time.monotonic() + 60
    running = 0
    while th.is_alive() and time.monotonic() < t_end:
        running = int((((fetch_info(url, steps=0) or {}).get("counts")) or {}).get("running") or 0)
        if running >= want:
            break
        time.sleep(0.05)
    out: dict[str, Any] = {"url": url, "running_when_armed": running, "batch_wanted": want}
    try:
        attempts = [False, True]
        for eager in attempts:
            # the server keeps the trace in its own folder; request_profile downloads it to trace_path
            status, res = request_profile(url, trace_path, steps=steps, eager=eager, timeout_s=60, http_timeout_s=120)
            if status != 200:
                out.update(skipped=f"{PROFILE_PATH} answered {status}: {(res.get('error') or {}).get('message')}")
                break
            out.pop("skipped", None)
            out.update(res)
            on_gpu = not str(res.get("device", "cpu")).startswith("cpu")
            if eager or not on_gpu or res.get("kernel_rows") or not th.is_alive():
                if on_gpu and not res.get("kernel_rows"):
                    out["note"] = "no device kernels in the profile (graph replay reported none)"
                break
            out["graph_replay_profile_had_no_kernels"] = True  # retried eagerly
    finally:
        th.join(timeout=timeout_s + 30)
    out["load_error"] = load.get("error")
    out["load_rows"] = [
        {k: v for k, v in row.items() if not isinstance(v, (dict, list))} for row in load.get("rows") or []
    ]
    check(fetch_info(url))
    return out


def profile_decode_steps(
    params: dict[str, Any],
    deploy_record: dict[str, Any],
    traces: dict[str, str | Path],
    steps: int = 5,
    root: str | Path | None = None,
    progress: bool = True,
    baseline: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Per-kernel tables of a few decode steps of the deployed candidate and (embedded deploys) the
    baseline, each under load at the highest serving level, via the server's profile endpoint.

    ``traces``: ``{impl: path}`` for the gzipped Kineto traces (written by the server; absolute
    paths). The baseline runs on ``baseline`` (the serving benchmark's baseline server, kept running
    by the caller) or else on a temporary server started here (:func:`baseline_server`); either way
    the profile comes after the serving windows, so they never include a profiled step. Returns
    ``{"impls": {impl: profile result | {"skipped": why}}, concurrency, max_tokens, steps}``, or
    ``{"skipped": why}`` when the candidate has no info endpoint (a foreign server)."""
    url = str(deploy_record.get("url") or "").rstrip("/")
    info = fetch_info(url)
    if info is None:
        return {"skipped": f"server at {url} has no {INFO_PATH} (a foreign server): no decode-step profile"}
    check_server(deploy_record, info)
    plan = serving_plan(params, server_on_cpu(info))
    c = int(max(plan["concurrency"]))
    max_tokens = max(int(plan["max_tokens"]), 4 * steps + 16)
    out: dict[str, Any] = {"concurrency": c, "max_tokens": max_tokens, "steps": steps, "impls": {}}

    def one(impl: str, u: str, check: Any) -> None:
        if progress:
            print(f"[profile {impl}] {steps} decode steps at concurrency {c} on {u}", file=sys.stderr, flush=True)
        out["impls"][impl] = _profile_one(
            u, check, c, max_tokens, steps, str(Path(traces[impl]).resolve()), plan["timeout_s"]
        )

    one("candidate", url, lambda i: check_server(deploy_record, i))
    why_not = baseline_why_not(params, deploy_record)
    if why_not:
        out["impls"]["baseline"] = {"skipped": why_not}
    elif baseline is not None:
        one("baseline", baseline["url"], lambda i: _check_baseline(baseline, i))
    else:
        with baseline_server(params, url, root) as b:
            one("baseline", b["url"], lambda i: _check_baseline(b, i))
    return out

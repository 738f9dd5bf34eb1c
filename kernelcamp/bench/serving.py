"""Serving benchmark: baseline and candidate served and loaded in the same run, interleaved
(used by stages/benchmark.py).

``serving_benchmark(params, deploy_record)`` refuses (``KernelcampError``) to measure a server whose
reported variant hash differs from the deploy record (or whose answering pid changed since the
deploy, for the embedded server), checked before and after every run, and one that ran a CUDA profile
(its info's ``cuda_profiled``: an earlier benchmark's decode-step profile leaves CUPTI attached and
every later step slower, :data:`kernelcamp.serve.client.CUDA_PROFILED_WHY`; the profile runs after
the serving windows, and a deploy restarts such a server instead of reusing it).

Baseline beside the candidate (DESIGN.md: "every benchmark measures baseline and candidate in the
same run, interleaved"): for ``deploy.kind: embedded`` a second, temporary embedded server runs the
baseline (``params`` with ``variant`` := ``baseline``; same server flags, workload, kernel: the working
tree's, which is why the run spec refuses ``baseline.kernel_rev`` while this measures the baseline) on the
candidate's port + ``benchmark.serving.baseline_port_offset`` (default 1, inside the sweep worker's
port range) with its own state file ``<state dir>/baseline-server.json`` (never the deploy state
file). It must be ready (health 200, one completion, its variant hash equal to the baseline's, the
pid we started) and is always stopped at the end (process group, port freed), also on an error,
KeyboardInterrupt or SIGTERM. ``command``/``ssh`` deploys serve a foreign server: the candidate alone
is measured, with ``baseline_measured: false`` and the reason.

Order and windows: a repeat runs every level (configured order; a level listed twice is refused,
:func:`check_serving_params`); at each level one round runs a short steady-state window against each
server, the first alternating round by round (baseline first in even rounds). A window
(:func:`kernelcamp.loadgen.run_window`) is closed-loop load at the level for ``warmup_s``
(not measured) + ``window_s`` (measured) seconds, then a drain, so neither server runs while the
other is measured (they share the GPU). One row per (impl, level, repeat): ``impl``, ``variant``,
``variant_hash``, ``repeat``, ``round``, ``position``, every loadgen metric with ``valid`` (and the
load generator's ``client_gc_ms``), and the server's garbage-collector pauses in the window
(:func:`gc_pauses`; the benchmark stage freezes its own heap before the first window, ``freeze_heap``). A/B
(``ab``, :func:`ab_summary`): pairs are (level, repeat); per level, the ratio candidate/baseline of
``steady_output_tok_s`` over its repeats; overall, over every (level, repeat) pair of the valid
levels, each level weighted equally, the noise taken within levels (:func:`kernelcamp.stats.stratified_ratio_ci`);
each with its interval, decision (faster / slower / equivalent / inconclusive; throughput: higher is
faster) and ``half_width``. A level with any failed or incomplete window of either impl
is excluded and marked.

Stopping (:class:`kernelcamp.stats.SequentialPlan`, Bonferroni over the planned looks): after every
repeat from ``min_repeats`` on, the overall interval is analysed at the per-look confidence; the
repeats stop when it decides, at ``repeats`` (the maximum), or at the first look after
``benchmark.serving.max_seconds`` seconds. ``ab.overall`` records ``n_repeats`` and ``stop_reason``.

Step model ``step_ms = a_ms + b_ms_per_req * batch`` per impl, fitted from that server's decode
steps during its own runs only (the info endpoint's ``since=<step index before the run>`` window).

CPU scaling: when the server runs on a CPU (its info says ``device: cpu``; or, for a server without
the info endpoint, when this machine has no GPU) the levels come from ``benchmark.serving.cpu``
(``{concurrency, max_tokens, warmup_s, window_s, repeats}``) or the flat keys ``cpu_concurrency`` /
``cpu_max_tokens`` / ``cpu_warmup_s`` / ``cpu_window_s`` / ``cpu_repeats``, else concurrency [4, 1],
max_tokens 16, a 0.25 + 1 s window and 2 repeats; on a CPU the repeats are fixed (min = max); the
result says ``scaled_for_cpu``.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from kernelcamp.errors import KernelcampError
from kernelcamp.hashes import params_variant_hash
from kernelcamp.io import repo_relative
from kernelcamp.loadgen import default_prompts, progress_line, run_window_sync
from kernelcamp.ports import baseline_port
from kernelcamp.provenance import device_info, git_info, now_utc
from kernelcamp.serve import gcwatch
from kernelcamp.serve.client import CUDA_PROFILED_WHY, INFO_PATH, auth_headers, client_url
from kernelcamp.signals import signals_deferred, signals_raise
from kernelcamp.stats import SequentialPlan, decision, fit_step_model

CPU_DEFAULT = {"concurrency": [4, 1], "max_tokens": 16, "warmup_s": 0.25, "window_s": 1.0, "repeats": 2}


#: How to recover in the workspace when the deployed server is gone or replaced: DVC cannot see a server
#: that stopped, or one that another deploy put on its port (a queued experiment's, run by `dvc queue start`, takes
#: the workspace's port: helper-59), so it considers the deploy stage up to date; force it (:func:`redeploy_advice`).
REDEPLOY = (
    "redeploy with `dvc repro -f -s deploy` (DVC cannot see that the server stopped, or that another deploy, such as "
    "a queued experiment's, replaced it), then run again"
)
#: The same inside a queued experiment's copy, where forcing a stage of the workspace would not reach this run:
#: its deploy record is not kept (``cache: false``), so the experiment queued again deploys again.
REDEPLOY_QUEUED = (
    "this queued experiment ran its deploy stage in its own copy of the workspace: queue it again to redeploy "
    "(`dvc exp run --queue` with the same -S options, then `dvc queue start`)"
)


def redeploy_advice() -> str:
    """How to recover when the deployed server is gone or replaced: :data:`REDEPLOY` in the workspace,
    :data:`REDEPLOY_QUEUED` in a queued experiment's copy (its root is not ``$DVC_ROOT``, the test
    ``kernelcamp.kernel_rev`` makes too)."""
    from kernelcamp.hashes import project_root
    from kernelcamp.provenance import dvc_root

    return REDEPLOY_QUEUED if project_root().resolve() != dvc_root() else REDEPLOY


def _fmt_ci(o: dict[str, Any]) -> str:
    if o.get("ratio") is None or o.get("ci_lo") is None:
        return "(no interval)"
    return f"{o['ratio']:.4f} [{o['ci_lo']:.4f}, {o['ci_hi']:.4f}], resolution +-{100 * o['half_width']:.1f}%"


def fetch_info(url: str, **query: Any) -> dict[str, Any] | None:
    """The server's info endpoint, or None when it has none (a foreign server)."""
    try:
        r = httpx.get(url.rstrip("/") + INFO_PATH, params=query or None, timeout=30, headers=auth_headers())
    except httpx.HTTPError as e:
        raise KernelcampError(f"server at {url} does not answer ({type(e).__name__}): {redeploy_advice()}") from e
    if r.status_code == 404:
        return None
    if r.status_code != 200:
        raise KernelcampError(f"server at {url}: {INFO_PATH} answered {r.status_code}")
    return r.json()


def check_server(deploy_record: dict[str, Any], info: dict[str, Any] | None) -> bool:
    """Raise unless the server runs what the deploy record says; returns whether the hash was checked."""
    url = deploy_record.get("url")
    want = deploy_record.get("variant_hash")
    if info is None:
        if deploy_record.get("kind") == "embedded":
            raise KernelcampError(f"server at {url} has no {INFO_PATH}: it is not the embedded server deployed")
        return False  # a foreign server: the deploy record's checksums are the evidence
    got = info.get("variant_hash")
    if got != want:
        raise KernelcampError(
            f"server at {url} runs variant hash {got}, but the deploy record says {want}: "
            f"refusing to measure it; {redeploy_advice()}"
        )
    if deploy_record.get("kind") == "embedded" and deploy_record.get("pid") and info.get("pid") != deploy_record["pid"]:
        raise KernelcampError(
            f"server at {url} is pid {info.get('pid')}, not the deployed pid {deploy_record['pid']}: "
            f"{redeploy_advice()}"
        )
    return True


def refuse_profiled(url: str, info: dict[str, Any] | None) -> None:
    """Raise ``KernelcampError`` (how to redeploy) when the server's info says ``cuda_profiled``: its steps
    are no longer the variant's (:data:`kernelcamp.serve.client.CUDA_PROFILED_WHY`)."""
    if info is not None and info.get("cuda_profiled"):
        raise KernelcampError(
            f"server at {url} (pid {info.get('pid')}) will not be timed: {CUDA_PROFILED_WHY} (an earlier "
            f"benchmark profiled it): {redeploy_advice()}"
        )


def require_deployed_server(deploy_record: dict[str, Any], timed: bool = False) -> None:
    """Fail fast, before any measuring, when the server of the deploy record is gone or replaced, or,
    with ``timed`` (the serving benchmark will time it), when it ran a CUDA profile (:func:`refuse_profiled`).

    Raises ``KernelcampError`` saying how to redeploy (:func:`redeploy_advice`).
    """
    url = deploy_record.get("url")
    if not url:
        raise KernelcampError(f"deploy record has no url: {redeploy_advice()}")
    info = fetch_info(url)
    check_server(deploy_record, info)
    if timed:
        refuse_profiled(url, info)


def check_serving_params(params: dict[str, Any]) -> None:
    """Refuse, before any measurement, serving levels and a repeat plan the A/B cannot use.

    ``benchmark.serving.concurrency`` and ``cpu_concurrency`` (when set): positive integers, none listed
    twice (pairs are matched by (level, repeat)); ``repeats`` (the maximum) >= 2, ``min_repeats`` in
    2..repeats, ``cpu_repeats`` >= 2, ``max_seconds`` > 0 or null, ``warmup_s`` >= 0, ``window_s`` > 0
    (and their ``cpu_`` forms). Raises ``KernelcampError`` with one line naming the key.
    """
    sv = (params.get("benchmark") or {}).get("serving") or {}
    for key in ("concurrency", "cpu_concurrency"):
        lv = sv.get(key)
        if lv is None:  # not given: serving_plan's default levels
            continue
        if (
            not isinstance(lv, list)
            or not lv
            or not all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in lv)
        ):
            raise KernelcampError(f"benchmark.serving.{key}={lv!r}: expected a non-empty list of positive integers")
        dup = [c for i, c in enumerate(lv) if c in lv[:i]]
        if dup:
            raise KernelcampError(
                f"benchmark.serving.{key}={lv!r}: level {dup[0]} is listed twice (pairs are matched by level and "
                "repeat; repeating a level is what benchmark.serving.repeats does)"
            )
    for key in ("repeats", "cpu_repeats"):
        v = sv.get(key, 2)
        if not isinstance(v, int) or isinstance(v, bool) or v < 2:
            raise KernelcampError(
                f"benchmark.serving.{key}={v!r}: expected an integer >= 2 (an interval needs 2 pairs)"
            )
    mx = sv.get("repeats", 2)
    mn = sv.get("min_repeats", mx)
    if not isinstance(mn, int) or isinstance(mn, bool) or not 2 <= mn <= mx:
        raise KernelcampError(
            f"benchmark.serving.min_repeats={mn!r}: expected an integer in 2..{mx} (benchmark.serving.repeats is "
            "the maximum)"
        )
    for key, gt0 in (
        ("max_seconds", True),
        ("warmup_s", False),
        ("window_s", True),
        ("cpu_warmup_s", False),
        ("cpu_window_s", True),
    ):
        v = sv.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or (gt0 and v == 0):
            raise KernelcampError(f"benchmark.serving.{key}={v!r}: expected seconds {'>' if gt0 else '>='} 0")


def serving_plan(params: dict[str, Any], on_cpu: bool) -> dict[str, Any]:
    """Levels, max_tokens, window (seconds), repeat plan and timeout from ``benchmark.serving`` (CPU-scaled).

    Raises ``KernelcampError`` as :func:`check_serving_params` does.
    """
    check_serving_params(params)
    sv = (params.get("benchmark") or {}).get("serving") or {}
    n_max = int(sv.get("repeats", 2))
    ms = sv.get("max_seconds")
    plan = {
        "concurrency": list(sv.get("concurrency") or [48, 64, 80, 96, 8, 1]),
        "max_tokens": int(sv.get("max_tokens") or 256),
        "warmup_s": float(sv.get("warmup_s", 5.0)),
        "window_s": float(sv.get("window_s", 15.0)),
        "repeats": n_max,
        "min_repeats": int(sv.get("min_repeats", n_max)),
        "max_seconds": None if ms is None else float(ms),
        "timeout_s": float(sv.get("timeout_s") or 300),
        "scaled_for_cpu": False,
    }
    if on_cpu:
        cpu = dict(CPU_DEFAULT)
        for flat, key in (
            ("cpu_concurrency", "concurrency"),
            ("cpu_max_tokens", "max_tokens"),
            ("cpu_warmup_s", "warmup_s"),
            ("cpu_window_s", "window_s"),
            ("cpu_repeats", "repeats"),
        ):
            if sv.get(flat) is not None:
                cpu[key] = sv[flat]
        cpu.update({k: v for k, v in (sv.get("cpu") or {}).items() if v is not None})
        plan.update(
            concurrency=list(cpu["concurrency"]),
            max_tokens=int(cpu["max_tokens"]),
            warmup_s=float(cpu["warmup_s"]),
            window_s=float(cpu["window_s"]),
            repeats=int(cpu["repeats"]),
            min_repeats=int(cpu["repeats"]),
            scaled_for_cpu=True,
        )
    return plan


def repeat_plan(plan: dict[str, Any], params: dict[str, Any]) -> SequentialPlan:
    """The sequential plan of the repeats: a look after every repeat from ``min_repeats`` to ``repeats``,
    confidence and threshold from ``report``, higher throughput is faster."""
    rep = params.get("report") or {}
    return SequentialPlan(
        min_rounds=plan["min_repeats"],
        max_rounds=plan["repeats"],
        look_every=1,
        max_seconds=plan["max_seconds"],
        confidence=float(rep.get("confidence", 0.95)),
        threshold=float(rep.get("threshold", 0.02)),
        higher_is_better=True,
        what="benchmark.serving (repeats)",
    )


def server_on_cpu(info: dict[str, Any] | None) -> bool:
    if info is not None and info.get("device"):
        return str(info["device"]).startswith("cpu")
    import torch

    return not torch.cuda.is_available()


def step_model_from_steps(steps: list[dict[str, Any]], min_steps: int = 5) -> dict[str, Any]:
    """Fit ``step_ms = a + b*batch`` to the per-batch-size medians of the decode steps.

    Single steps scatter (host scheduling, Python); the model describes the typical step at each
    batch size, so the fit runs over the medians of the batch sizes seen at least ``min_steps``
    times (transitional sizes while a level drains are left out, and listed), with the intercept held
    ``>= 0`` (:func:`kernelcamp.stats.fit_step_model`: ``intercept_clamped``). ``r2`` is that fit's;
    ``r2_all_steps`` is the same line judged against every single step. ``{"skipped": why}`` when
    fewer than 2 batch sizes qualify.
    """
    import numpy as np

    dec = [s for s in steps if s.get("kind") == "decode"]
    by: dict[str, dict[str, Any]] = {}
    for b in sorted({s["batch"] for s in dec}):
        v = [s["step_ms"] for s in dec if s["batch"] == b]
        by[str(b)] = {"n": len(v), "step_ms_median": float(np.median(v))}
    used = [int(b) for b, d in by.items() if d["n"] >= min_steps]
    if len(used) < 2:
        return {
            "skipped": f"{len(dec)} decode steps with fewer than 2 batch sizes seen >= {min_steps} times",
            "n_points": len(dec),
            "by_batch": by,
        }
    fit = fit_step_model(used, [by[str(b)]["step_ms_median"] for b in used])
    x = np.asarray([s["batch"] for s in dec], dtype=np.float64)
    y = np.asarray([s["step_ms"] for s in dec], dtype=np.float64)
    ss_tot = float(((y - y.mean()) ** 2).sum())
    ss_res = float(((y - (fit["a_ms"] + fit["b_ms_per_req"] * x)) ** 2).sum())
    if len(used) < 3:  # a line through two points fits exactly: its R^2 says nothing
        fit = {**fit, "r2": None, "r2_note": "2 batch sizes: a line fits them exactly, so R^2 is not reported"}
    return {
        **fit,
        "n_points": len(dec),
        "n_batch_sizes": len(used),
        "batch_sizes_fitted": used,
        "batch_sizes_left_out": [int(b) for b in by if int(b) not in used],
        "r2_all_steps": 1.0 - ss_res / ss_tot if ss_tot > 0 else None,
        "by_batch": by,
        "source": "medians of the server's per-step statistics per batch size (decode steps during the benchmark)",
    }


def attention_share(info: dict[str, Any] | None) -> dict[str, Any] | None:
    if not info:
        return None
    cal = (info.get("attention_share") or {}).get("calibration") or {}
    return {
        "live": info.get("attention_share_live"),
        "calibration": cal,
        "method": (info.get("attention_share") or {}).get("method"),
    }


# ---- baseline beside the candidate ---------------------------------------------------------------------
IMPLS = ("baseline", "candidate")
AB_METRIC = "steady_output_tok_s"
_SUM_KEYS = ("num_requests", "requests_ok", "requests_failed", "incomplete", "output_tokens")


def baseline_params(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with ``variant`` := ``params["baseline"]`` (same server flags, workload, kernel)."""
    return {**params, "variant": params["baseline"]}


def _free_baseline_port(params: dict[str, Any], host: str, port: int, root: str | Path | None) -> None:
    """Stop a baseline server left by a SIGKILLed benchmark, then wait for ``port`` to be free.

    Raises ``KernelcampError`` when another process holds it.
    """
    from kernelcamp.deploy.common import _wait_port_free, state_dir, stop_state
    from kernelcamp.deploy.embedded import BASELINE_STEM

    stop_state(state_dir(root) / f"{BASELINE_STEM}.json")
    cfg = dict(params.get("deploy") or {})
    if not _wait_port_free(port, host, float(cfg.get("port_free_timeout_s", 10.0))):
        raise KernelcampError(
            f"baseline server port {port} on {host} (candidate port + "
            f"benchmark.serving.baseline_port_offset) is held by another process: free it or set "
            "benchmark.serving.baseline_port_offset"
        )


def check_baseline_port(params: dict[str, Any], deploy_record: dict[str, Any], root: str | Path | None = None) -> None:
    """Before any measurement: the port the serving A/B will start the temporary baseline server on
    is free (a stale baseline server of this workspace is stopped first). A no-op when no baseline
    server will be started (serving off, a foreign deploy, measure_baseline false, no baseline).

    Raises ``KernelcampError`` when another process holds the port, or the offset is out of range.
    """
    sv = (params.get("benchmark") or {}).get("serving") or {}
    url = str(deploy_record.get("url") or "")
    if (
        not sv.get("enabled")
        or deploy_record.get("kind") != "embedded"
        or not sv.get("measure_baseline", True)
        or not params.get("baseline")
        or not url
    ):
        return
    u = urlsplit(url)
    _free_baseline_port(params, u.hostname or "127.0.0.1", baseline_port(u.port or 80, params), root)


@contextlib.contextmanager
def baseline_server(
    params: dict[str, Any], candidate_url: str, root: str | Path | None = None
) -> Iterator[dict[str, Any]]:
    """A temporary embedded server running the baseline variant beside the deployed candidate.

    Port :func:`baseline_port`, state ``<state dir>/baseline-server.json`` (never the deploy state
    file: the deployed candidate is untouched). A leftover baseline server from a killed run is
    stopped first. Ready means health 200, one completion, the reported variant hash equal to
    :func:`~kernelcamp.hashes.params_variant_hash` of :func:`baseline_params`, and the pid we
    started. Always stopped on exit (process group, port freed), also on KeyboardInterrupt/SIGTERM.
    Yields ``{url, port, pid, variant_name, variant_hash, seconds_to_ready, state_file, log}``.
    """
    from kernelcamp.deploy.common import _wait_port_free, kill_group, state_dir, stop_state, workspace
    from kernelcamp.deploy.embedded import BASELINE_STEM, start_embedded

    u = urlsplit(candidate_url)
    host, port = u.hostname or "127.0.0.1", baseline_port(u.port or 80, params)
    bparams = baseline_params(params)
    bhash = params_variant_hash(bparams)
    sdir = state_dir(root)
    sdir.mkdir(parents=True, exist_ok=True)
    spath = sdir / f"{BASELINE_STEM}.json"
    cfg = dict(params.get("deploy") or {})
    proc = None
    # SIGTERM raises KeyboardInterrupt here when nobody handles it yet, so the `finally` that stops the
    # baseline server runs; a handler already installed (the tracked stage raises on SIGTERM) is kept
    with signals_raise(
        (signal.SIGTERM,), only_if_default=True, exc=lambda s: KeyboardInterrupt(signal.Signals(s).name)
    ):
        try:
            _free_baseline_port(params, host, port, root)
            # die_with_caller: a SIGKILLed benchmark must not orphan its temporary baseline server
            proc, seconds, facts = start_embedded(
                bparams, host, port, bhash, sdir, BASELINE_STEM, cfg, die_with_caller=True
            )
            yield {
                "url": client_url(host, port),
                "port": port,
                "pid": proc.pid,
                "variant_name": str((params.get("baseline") or {}).get("name")),
                "variant_hash": bhash,
                "seconds_to_ready": round(seconds, 3),
                "server_info": facts.get("info"),
                "state_file": repo_relative(spath, workspace(root)),
                "log": repo_relative(sdir / f"{BASELINE_STEM}.log", workspace(root)),
            }
        finally:
            with signals_deferred():
                stop_state(spath, grace_s=10.0)
                if proc is not None:
                    if proc.poll() is None:
                        kill_group(proc.pid, proc.pid, grace_s=5.0)
                    try:
                        proc.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        pass
                    _wait_port_free(port, host, 10.0)


def _check_baseline(b: dict[str, Any], info: dict[str, Any] | None) -> None:
    if info is None or info.get("variant_hash") != b["variant_hash"] or info.get("pid") != b["pid"]:
        got = None if info is None else (info.get("variant_hash"), info.get("pid"))
        raise KernelcampError(
            f"baseline server at {b['url']} reports (hash, pid) {got}, expected "
            f"({b['variant_hash']}, {b['pid']}): refusing to measure it"
        )


# ---- A/B summary ---------------------------------------------------------------------------------------
def _agg(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """One impl at one level over its repeats: counts summed, other numbers averaged, valid = all."""
    if not rows:
        return None
    out: dict[str, Any] = {"n_repeats": len(rows), "valid": all(r["valid"] for r in rows)}
    for k, v in rows[0].items():
        if k in ("concurrency", "repeat", "round", "position", "level_index", "valid") or isinstance(v, bool):
            continue
        if k in _SUM_KEYS:
            out[k] = sum(r.get(k) or 0 for r in rows)
        elif isinstance(v, (int, float)) or v is None:
            vals = [r.get(k) for r in rows if isinstance(r.get(k), (int, float))]
            out[k] = sum(vals) / len(vals) if vals else None
    fails: dict[str, int] = {}
    for r in rows:
        for why, n in (r.get("failure_reasons") or {}).items():
            fails[why] = fails.get(why, 0) + n
    out["failure_reasons"] = fails
    return out


def throughput_decision(ratio: float, lo: float, hi: float, threshold: float) -> str:
    """:func:`kernelcamp.stats.decision` for a throughput ratio (higher is better): faster/slower swapped."""
    return decision(ratio, lo, hi, threshold, higher_is_better=True)


def ab_summary(
    rows: list[dict[str, Any]],
    levels: list[int],
    baseline_measured: bool,
    confidence: float = 0.95,
    threshold: float = 0.02,
    why_not: str | None = None,
    plan: SequentialPlan | None = None,
) -> dict[str, Any]:
    """Per level and overall ratio candidate/baseline of ``steady_output_tok_s`` with its interval and decision.

    Pairs are (level, repeat): the baseline and candidate windows of one repeat of one level. A level
    with any invalid window (either impl, any repeat) is excluded from every ratio and marked. The
    intervals are at ``plan.confidence_per_look`` (the sequential plan's Bonferroni level; without a
    plan, a single look at ``confidence``). Per level and overall: ``ratio``, ``ci_lo``, ``ci_hi``,
    ``half_width`` (ratio units), ``decision`` (faster / slower / equivalent / inconclusive, higher is
    faster; None without an interval), ``n_pairs`` and ``note``. The overall interval weighs each valid
    level (with 2 or more pairs) equally and takes its noise from the pairs' spread within their level
    (:func:`kernelcamp.stats.stratified_ratio_ci`; ``n_levels``, ``df``): pooling every pair into one
    t interval counted the real differences between levels (a kernel slowdown that shows at
    concurrency 96 and not at 1) as noise.
    """
    if plan is None:
        n = max([int(r.get("repeat", 0)) + 1 for r in rows] + [2])
        plan = SequentialPlan(n, n, 1, None, confidence, threshold, higher_is_better=True)
    per_level, strata = [], []
    for c in levels:
        lr = [r for r in rows if r["concurrency"] == c]
        by = {impl: [r for r in lr if r.get("impl") == impl] for impl in IMPLS}
        valid = bool(lr) and all(r["valid"] for r in lr)
        e: dict[str, Any] = {
            "concurrency": c,
            "valid": valid,
            **{impl: _agg(by[impl]) for impl in IMPLS},
            "ratio": None,
            "ci_lo": None,
            "ci_hi": None,
            "half_width": None,
            "decision": None,
            "n_pairs": 0,
            "note": None,
        }
        pairs = []
        for r in by["candidate"]:
            b = [x for x in by["baseline"] if x["repeat"] == r["repeat"]]
            if b and (b[0].get(AB_METRIC) or 0) > 0 and (r.get(AB_METRIC) or 0) > 0:
                pairs.append((b[0][AB_METRIC], r[AB_METRIC]))
        if not baseline_measured:
            e["note"] = f"baseline not measured: {why_not}"
        elif not valid:
            e["note"] = "excluded from ratios: invalid level (failed or incomplete requests)"
        elif len(pairs) >= 2:
            strata.append(([p[0] for p in pairs], [p[1] for p in pairs]))  # this level's share of the overall
            a = plan.analyse(*strata[-1])
            e.update({k: a[k] for k in ("ratio", "ci_lo", "ci_hi", "half_width", "decision", "confidence_per_look")})
            e["n_pairs"], e["threshold"] = len(pairs), threshold
        elif pairs:
            e.update(ratio=pairs[0][1] / pairs[0][0], n_pairs=1)
            e["note"] = "1 paired repeat: no confidence interval"
        else:
            e["note"] = "no paired windows with throughput"
        per_level.append(e)
    overall: dict[str, Any] = {
        "ratio": None,
        "ci_lo": None,
        "ci_hi": None,
        "half_width": None,
        "decision": None,
        "n_pairs": sum(len(b) for b, _ in strata),
        "n_levels": len(strata),
        "threshold": threshold,
        "confidence": confidence,
    }
    if not baseline_measured:
        overall.update(note=f"baseline not measured: {why_not}")
    elif strata:
        a = plan.analyse_strata(strata)
        overall.update(
            {k: a[k] for k in ("ratio", "ci_lo", "ci_hi", "half_width", "decision", "confidence_per_look", "df")},
            looks_planned=a["looks_planned"],
            note=(
                f"{len(strata)} valid level(s) weighted equally, the noise taken within levels "
                "(kernelcamp.stats.stratified_ratio_ci)"
            ),
        )
    else:
        overall.update(note="no valid level with 2 paired windows: an interval needs 2")
    return {
        "metric": AB_METRIC,
        "ratio_is": f"candidate / baseline {AB_METRIC} (steady-state window; higher is faster)",
        "baseline_measured": baseline_measured,
        "per_level": per_level,
        "overall": overall,
    }


# ---- the benchmark -------------------------------------------------------------------------------------
def baseline_why_not(params: dict[str, Any], deploy_record: dict[str, Any]) -> str | None:
    """Why no baseline server runs beside the deployed candidate (a foreign server, ``measure_baseline``
    false, no baseline section), or None when one does."""
    sv = (params.get("benchmark") or {}).get("serving") or {}
    if deploy_record.get("kind") != "embedded":
        return (
            f"deploy.kind={deploy_record.get('kind')} serves a foreign server: kernelcamp cannot start the "
            "baseline beside it, so only the candidate was measured"
        )
    if not sv.get("measure_baseline", True):
        return "benchmark.serving.measure_baseline is false"
    if not params.get("baseline"):
        return "params.yaml has no baseline section"
    return None


def gc_pauses(
    before: dict[str, Any] | None, after: dict[str, Any] | None, window_steps: list[dict[str, Any]]
) -> dict[str, float | None]:
    """A window's garbage-collector pauses on the server side (ms; :mod:`kernelcamp.serve.gcwatch`):
    ``server_gc_ms``, the engine's (the ``gc_ms`` of the window's step records), and ``front_gc_ms``,
    the HTTP front's (its info's ``front_gc`` after the window minus before). None where the server
    does not report it (a foreign server, a single-process server has no front)."""
    have = [s["gc_ms"] for s in window_steps if s.get("gc_ms") is not None]
    fb, fa = ((x or {}).get("front_gc") for x in (before, after))
    front = round(sum(fa["pause_ms"]) - sum(fb["pause_ms"]), 3) if fb and fa else None
    return {"server_gc_ms": round(sum(have), 3) if have else None, "front_gc_ms": front}


def serving_benchmark(
    params: dict[str, Any],
    deploy_record: dict[str, Any],
    progress: bool = True,
    root: str | Path | None = None,
    baseline: dict[str, Any] | None = None,
    freeze_heap: bool = False,
) -> dict[str, Any]:
    """Baseline and candidate served and loaded in the same run, interleaved; see the module docstring.

    ``freeze_heap``: freeze this process's heap before the first window
    (:func:`kernelcamp.serve.gcwatch.freeze_heap`; the result's ``client_gc_frozen``): for a process that
    runs the benchmark and exits (the benchmark stage), never for a long-lived one (a frozen object that
    later becomes cyclic garbage is never reclaimed).

    ``baseline``: a baseline server the caller started (:func:`baseline_server`'s dict) and stops
    after its own later use of it (the benchmark stage's decode-step profile: one start instead of
    two, about 15 s on the H200); None: one is started here and stopped at the end.
    Returns ``{levels (one row per impl x level x repeat), ab, step_model (candidate), step_models,
    baseline_measured, baseline, ...}`` (``baseline.stopped``: stopped here). Raises
    ``KernelcampError`` when the candidate's variant hash differs from ``deploy_record`` (before,
    during or after), the baseline server does not come up or reports another hash, or a server stops
    answering. A baseline server started here is stopped in every case.
    """
    url = str(deploy_record.get("url") or "").rstrip("/")
    if not url:
        raise KernelcampError(f"deploy record has no url: {redeploy_advice()}")
    info = fetch_info(url)
    hash_checked = check_server(deploy_record, info)
    refuse_profiled(url, info)
    plan = serving_plan(params, server_on_cpu(info))
    seq = repeat_plan(plan, params)
    rep = params.get("report") or {}
    why_not = baseline_why_not(params, deploy_record)
    measured_at = now_utc()
    levels = [int(c) for c in plan["concurrency"]]
    stop: dict[str, Any] = {}
    client_frozen: dict[str, Any] | None = None
    looks: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        if why_not:
            base = None
        elif baseline is not None:
            base = baseline
        else:
            base = stack.enter_context(baseline_server(params, url, root))
        targets: dict[str, dict[str, Any]] = {
            "candidate": {
                "url": url,
                "variant": deploy_record.get("variant_name") or (params.get("variant") or {}).get("name"),
                "variant_hash": deploy_record.get("variant_hash"),
                "check": lambda i: check_server(deploy_record, i),
            }
        }
        if base is not None:
            targets["baseline"] = {
                "url": base["url"],
                "variant": base["variant_name"],
                "variant_hash": base["variant_hash"],
                "check": lambda i: _check_baseline(base, i),
            }
        impls = [i for i in IMPLS if i in targets]
        if freeze_heap:  # the load generator's heap holds torch and the kernel benchmark's objects: a full
            # collection would stop every stream's reads (kernelcamp.serve.gcwatch)
            client_frozen = gcwatch.freeze_heap()
        rows: list[dict[str, Any]] = []
        steps: dict[str, list[dict[str, Any]]] = {i: [] for i in impls}
        last_info: dict[str, Any] | None = None
        rnd = 0
        t0 = time.monotonic()
        for r in range(seq.max_rounds):
            for li, c in enumerate(levels):
                order = impls if rnd % 2 == 0 else impls[::-1]
                for pos, impl in enumerate(order):
                    t = targets[impl]
                    before = fetch_info(t["url"])
                    t["check"](before)
                    start = ((before or {}).get("counts") or {}).get("step_index", 0)
                    row = run_window_sync(
                        t["url"],
                        c,
                        prompts=default_prompts(),
                        warmup_s=plan["warmup_s"],
                        window_s=plan["window_s"],
                        max_tokens=plan["max_tokens"],
                        timeout_s=plan["timeout_s"],
                    )
                    after = fetch_info(t["url"], since=start)
                    t["check"](after)
                    window_steps = [s for s in (after or {}).get("steps") or [] if s.get("index", 0) > start]
                    steps[impl] += window_steps  # only this run's steps: since the step counter before it
                    row.update(gc_pauses(before, after, window_steps))
                    if impl == "candidate":
                        last_info = after
                    row = {
                        "impl": impl,
                        "variant": t["variant"],
                        "variant_hash": t["variant_hash"],
                        "concurrency": row.pop("concurrency"),
                        "repeat": r,
                        "round": rnd,
                        "position": pos,
                        "level_index": li,
                        **row,
                    }
                    rows.append(row)
                    if progress:
                        print(
                            f"[{impl} {t['variant']} r{r}] {progress_line(row)}; steady "
                            f"{row['steady_output_tok_s'] or 0:.1f} tok/s in {plan['window_s']:g} s",
                            file=sys.stderr,
                            flush=True,
                        )
                rnd += 1
            n = r + 1
            if base is None:  # candidate only: nothing to decide; the minimum number of repeats
                if n >= seq.min_rounds:
                    stop = {"stop_reason": "no_baseline", "n_repeats": n}
                    break
                continue
            if n not in seq.looks:
                continue
            elapsed = time.monotonic() - t0
            o = ab_summary(rows, levels, True, seq.confidence, seq.threshold, None, seq)["overall"]
            # a CPU server's windows decide nothing (record.withhold_cpu_decisions): its repeats are fixed
            reason = seq.stop_reason(n, None if plan["scaled_for_cpu"] else o.get("decision"), elapsed)
            looks.append(
                {"n_repeats": n, "elapsed_s": round(elapsed, 3)}
                | {k: o.get(k) for k in ("ratio", "ci_lo", "ci_hi", "half_width", "decision")}
            )
            if progress:
                print(
                    f"[serving A/B] look {len(looks)}/{len(seq.looks)} after {n} repeats ({elapsed:.0f} s): "
                    + ("(a CPU server decides nothing)" if plan["scaled_for_cpu"] else str(o.get("decision")))
                    + f" {_fmt_ci(o)}"
                    + (f"; stop ({reason})" if reason else ""),
                    file=sys.stderr,
                    flush=True,
                )
            if reason:
                stop = {"stop_reason": reason, "n_repeats": n, "elapsed_s": round(elapsed, 3)}
                break
        step_models = {
            i: (step_model_from_steps(steps[i]) if steps[i] or i == "baseline" else {"skipped": "no info endpoint"})
            for i in impls
        }
        if "baseline" not in step_models:
            step_models["baseline"] = {"skipped": why_not}
        baseline_rec = None if base is None else {k: v for k, v in base.items() if k != "server_info"}
    if baseline_rec is not None:
        baseline_rec["stopped"] = baseline is None  # else its caller stops it (and says so)
    ab = ab_summary(
        rows,
        levels,
        base is not None,
        float(rep.get("confidence", 0.95)),
        float(rep.get("threshold", 0.02)),
        why_not,
        seq,
    )
    ab["overall"].update(stop, looks=looks, max_repeats=seq.max_rounds, min_repeats=seq.min_rounds)
    return {
        "levels": rows,
        "all_levels_valid": all(r["valid"] for r in rows),
        "baseline_measured": base is not None,
        "baseline_not_measured_reason": why_not,
        "baseline": baseline_rec,
        "ab": ab,
        "step_model": step_models["candidate"],
        "step_models": step_models,
        "attention_share": attention_share(last_info),
        "attention_impl": (last_info or {}).get("attention_impl"),
        "config_running": (last_info or {}).get("config_running"),
        "server_device": (last_info or {}).get("device"),
        "scaled_for_cpu": plan["scaled_for_cpu"],
        "plan": plan,
        "url": url,
        "variant_hash": deploy_record.get("variant_hash"),
        "hash_checked": hash_checked,
        "deploy_id": deploy_record.get("deploy_id"),
        "measured_at": measured_at,
        "client_gc_frozen": client_frozen,
        "provenance": {**git_info(), "client": device_info()},
    }

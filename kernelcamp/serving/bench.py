"""Serving benchmark: baseline and candidate served and loaded in the same run, interleaved
(used by stages/benchmark.py).

``serving_benchmark(params, deploy_record)`` refuses (``KernelcampError``) to measure a server whose
reported variant hash differs from the deploy record (or whose answering pid changed since the
deploy, for the embedded server), checked before and after every run.

Baseline beside the candidate (DESIGN.md: "every benchmark measures baseline and candidate in the
same run, interleaved"): for ``deploy.kind: embedded`` a second, temporary embedded server runs the
baseline (``params`` with ``variant`` := ``baseline``; same server flags, workload, kernel) on the
candidate's port + ``benchmark.serving.baseline_port_offset`` (default 1, inside the sweep worker's
port range) with its own state file ``<state dir>/baseline-server.json`` (never the deploy state
file). It must be ready (health 200, one completion, its variant hash equal to the baseline's, the
pid we started) and is always stopped at the end (process group, port freed), also on an error,
KeyboardInterrupt or SIGTERM. ``command``/``ssh`` deploys serve a foreign server: the candidate alone
is measured, with ``baseline_measured: false`` and the reason.

Order: for each level (configured order) and each of ``benchmark.serving.repeats`` repeats (default
2) one round runs the level against both servers, the first alternating round by round (baseline
first in even rounds). One row per (impl, level, repeat): ``impl``, ``variant``, ``variant_hash``,
``repeat``, ``round``, ``position`` and every loadgen metric with ``valid``. A/B (``ab``): per level,
ratio candidate/baseline of ``output_tok_s`` with a paired 95% CI over the repeats
(:func:`kernelcamp.stats.paired_ratio_ci`; one repeat: the ratio, CI null, and why); overall, the
same over all (level, repeat) pairs of the valid levels, with the decision (throughput: higher is
faster). A level with any failed or incomplete run of either impl is excluded and marked.

Step model ``step_ms = a_ms + b_ms_per_req * batch`` per impl, fitted from that server's decode
steps during its own runs only (the info endpoint's ``since=<step index before the run>`` window).

CPU scaling: when the server runs on a CPU (its info says ``device: cpu``; or, for a server without
the info endpoint, when this machine has no GPU) the levels come from ``benchmark.serving.cpu``
(``{concurrency, max_tokens, num_prompts_per_level}``) or the flat keys ``cpu_concurrency`` /
``cpu_max_tokens``, else concurrency [4, 1] and max_tokens 16; the result says ``scaled_for_cpu``.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from kernelcamp.errors import KernelcampError
from kernelcamp.provenance import device_info, git_info, now_utc
from kernelcamp.serving import INFO_PATH, params_variant_hash
from kernelcamp.serving.loadgen import default_prompts, progress_line, run_load
from kernelcamp.stats import decision, fit_step_model, paired_ratio_ci

CPU_DEFAULT = {"concurrency": [4, 1], "max_tokens": 16}


#: How to recover when the deployed server is gone or replaced: DVC cannot see a server that stopped,
#: so it considers the deploy stage up to date; force it.
REDEPLOY = "redeploy with `dvc repro -f -s deploy` (DVC cannot see that a server stopped), then run again"


def fetch_info(url: str, **query: Any) -> dict[str, Any] | None:
    """The server's info endpoint, or None when it has none (a foreign server)."""
    try:
        r = httpx.get(url.rstrip("/") + INFO_PATH, params=query or None, timeout=30)
    except httpx.HTTPError as e:
        raise KernelcampError(f"server at {url} does not answer ({type(e).__name__}): {REDEPLOY}") from e
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
            f"refusing to measure it; {REDEPLOY}"
        )
    if deploy_record.get("kind") == "embedded" and deploy_record.get("pid") and info.get("pid") != deploy_record["pid"]:
        raise KernelcampError(
            f"server at {url} is pid {info.get('pid')}, not the deployed pid {deploy_record['pid']}: {REDEPLOY}"
        )
    return True


def require_deployed_server(deploy_record: dict[str, Any]) -> None:
    """Fail fast, before any measuring, when the server of the deploy record is gone or replaced.

    Raises ``KernelcampError`` saying how to redeploy (``REDEPLOY``).
    """
    url = deploy_record.get("url")
    if not url:
        raise KernelcampError(f"deploy record has no url: {REDEPLOY}")
    check_server(deploy_record, fetch_info(url))


def serving_plan(params: dict[str, Any], on_cpu: bool) -> dict[str, Any]:
    """Levels, max_tokens, prompts per level and timeout from ``benchmark.serving`` (CPU-scaled)."""
    sv = (params.get("benchmark") or {}).get("serving") or {}
    plan = {
        "concurrency": list(sv.get("concurrency") or [48, 64, 80, 96, 8, 1]),
        "max_tokens": int(sv.get("max_tokens") or 256),
        "num_prompts_per_level": sv.get("num_prompts_per_level"),
        "timeout_s": float(sv.get("timeout_s") or 300),
        "scaled_for_cpu": False,
    }
    if on_cpu:
        cpu = dict(CPU_DEFAULT)
        if sv.get("cpu_concurrency"):
            cpu["concurrency"] = list(sv["cpu_concurrency"])
        if sv.get("cpu_max_tokens"):
            cpu["max_tokens"] = int(sv["cpu_max_tokens"])
        cpu.update({k: v for k, v in (sv.get("cpu") or {}).items() if v is not None})
        plan.update(concurrency=list(cpu["concurrency"]), max_tokens=int(cpu["max_tokens"]), scaled_for_cpu=True)
        if "num_prompts_per_level" in cpu:
            plan["num_prompts_per_level"] = cpu["num_prompts_per_level"]
    return plan


def server_on_cpu(info: dict[str, Any] | None) -> bool:
    if info is not None and info.get("device"):
        return str(info["device"]).startswith("cpu")
    import torch

    return not torch.cuda.is_available()


def step_model_from_steps(steps: list[dict[str, Any]], min_steps: int = 5) -> dict[str, Any]:
    """Fit ``step_ms = a + b*batch`` to the per-batch-size medians of the decode steps.

    Single steps scatter (host scheduling, Python); the model describes the typical step at each
    batch size, so the fit runs over the medians of the batch sizes seen at least ``min_steps``
    times (transitional sizes while a level drains are left out, and listed). ``r2`` is that fit's;
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
AB_METRIC = "output_tok_s"
BASELINE_STEM = "baseline-server"
_SUM_KEYS = ("num_requests", "requests_ok", "requests_failed", "incomplete", "output_tokens")


def baseline_params(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with ``variant`` := ``params["baseline"]`` (same server flags, workload, kernel)."""
    return {**params, "variant": params["baseline"]}


def baseline_port(candidate_port: int, params: dict[str, Any]) -> int:
    """The temporary baseline server's port: the candidate's + ``benchmark.serving.baseline_port_offset``
    (default 1; 1..PORT_STRIDE-1 so it stays inside this sweep worker's port range)."""
    from kernelcamp.sweep import PORT_STRIDE

    sv = (params.get("benchmark") or {}).get("serving") or {}
    off = int(sv.get("baseline_port_offset", 1))
    if not 1 <= off < PORT_STRIDE:
        raise KernelcampError(
            f"benchmark.serving.baseline_port_offset={off}: expected 1..{PORT_STRIDE - 1} "
            "(a sweep worker owns the candidate port + 0..9)"
        )
    return int(candidate_port) + off


def _free_baseline_port(params: dict[str, Any], host: str, port: int, root: str | Path | None) -> None:
    """Stop a baseline server left by a SIGKILLed benchmark, then wait for ``port`` to be free.

    Raises ``KernelcampError`` when another process holds it.
    """
    from kernelcamp.serving.deploy import _wait_port_free, state_dir, stop_state

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
def _signals_raise_if_default() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt in this block when nobody handles it yet (main thread only), so
    the ``finally`` that stops the baseline server runs; a handler already installed (the stage's
    tracked run raises on SIGTERM) is left alone."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) not in (
        signal.SIG_DFL,
        None,
    ):
        yield
        return

    def handler(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Block SIGTERM/SIGINT for the block (cleanup must not be cut short); delivered afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    sigs = {signal.SIGTERM, signal.SIGINT}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@contextlib.contextmanager
def baseline_server(
    params: dict[str, Any], candidate_url: str, root: str | Path | None = None
) -> Iterator[dict[str, Any]]:
    """A temporary embedded server running the baseline variant beside the deployed candidate.

    Port :func:`baseline_port`, state ``<state dir>/baseline-server.json`` (never the deploy state
    file: the deployed candidate is untouched). A leftover baseline server from a killed run is
    stopped first. Ready means health 200, one completion, the reported variant hash equal to
    :func:`~kernelcamp.serving.params_variant_hash` of :func:`baseline_params`, and the pid we
    started. Always stopped on exit (process group, port freed), also on KeyboardInterrupt/SIGTERM.
    Yields ``{url, port, pid, variant_name, variant_hash, seconds_to_ready, state_file, log}``.
    """
    from kernelcamp.serving.deploy import _wait_port_free, kill_group, start_embedded, state_dir, stop_state

    u = urlsplit(candidate_url)
    host, port = u.hostname or "127.0.0.1", baseline_port(u.port or 80, params)
    bparams = baseline_params(params)
    bhash = params_variant_hash(bparams)
    sdir = state_dir(root)
    sdir.mkdir(parents=True, exist_ok=True)
    spath = sdir / f"{BASELINE_STEM}.json"
    cfg = dict(params.get("deploy") or {})
    proc = None
    with _signals_raise_if_default():
        try:
            _free_baseline_port(params, host, port, root)
            proc, seconds, facts = start_embedded(bparams, host, port, bhash, sdir, BASELINE_STEM, cfg)
            yield {
                "url": f"http://{host}:{port}",
                "port": port,
                "pid": proc.pid,
                "variant_name": str((params.get("baseline") or {}).get("name")),
                "variant_hash": bhash,
                "seconds_to_ready": round(seconds, 3),
                "server_info": facts.get("info"),
                "state_file": str(spath),
                "log": str(sdir / f"{BASELINE_STEM}.log"),
            }
        finally:
            with _signals_deferred():
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
    """:func:`kernelcamp.stats.decision` for a throughput ratio (higher is better): the words swapped."""
    d = decision(ratio, lo, hi, threshold)
    return {"faster": "slower", "slower": "faster"}.get(d, d)


def ab_summary(
    rows: list[dict[str, Any]],
    levels: list[int],
    baseline_measured: bool,
    confidence: float = 0.95,
    threshold: float = 0.02,
    why_not: str | None = None,
) -> dict[str, Any]:
    """Per level and overall ratio candidate/baseline of ``output_tok_s`` with a paired CI.

    Pairs are (level, repeat): the baseline and candidate runs of one repeat of one level. A level
    with any invalid run (either impl, any repeat) is excluded from every ratio and marked.
    """
    per_level, pooled_b, pooled_c = [], [], []
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
            e.update(paired_ratio_ci([p[0] for p in pairs], [p[1] for p in pairs], confidence), n_pairs=len(pairs))
            e.pop("n_rounds", None)
        elif pairs:
            e.update(ratio=pairs[0][1] / pairs[0][0], n_pairs=1)
            e["note"] = "1 paired repeat: no confidence interval (set benchmark.serving.repeats >= 2)"
        else:
            e["note"] = "no paired runs with throughput"
        if baseline_measured and valid:
            pooled_b += [p[0] for p in pairs]
            pooled_c += [p[1] for p in pairs]
        per_level.append(e)
    overall: dict[str, Any] = {"ratio": None, "ci_lo": None, "ci_hi": None, "n_pairs": len(pooled_b)}
    if not baseline_measured:
        overall.update(decision=None, note=f"baseline not measured: {why_not}")
    elif len(pooled_b) >= 2:
        ci = paired_ratio_ci(pooled_b, pooled_c, confidence)
        overall.update(
            ratio=ci["ratio"],
            ci_lo=ci["ci_lo"],
            ci_hi=ci["ci_hi"],
            confidence=confidence,
            decision=throughput_decision(ci["ratio"], ci["ci_lo"], ci["ci_hi"], threshold),
            threshold=threshold,
            note="pooled over (level, repeat) pairs of the valid levels",
        )
    else:
        overall.update(decision=None, note=f"{len(pooled_b)} valid paired runs: a confidence interval needs 2")
    return {
        "metric": AB_METRIC,
        "ratio_is": "candidate / baseline output_tok_s (higher is faster)",
        "baseline_measured": baseline_measured,
        "per_level": per_level,
        "overall": overall,
    }


# ---- the benchmark -------------------------------------------------------------------------------------
def serving_benchmark(
    params: dict[str, Any], deploy_record: dict[str, Any], progress: bool = True, root: str | Path | None = None
) -> dict[str, Any]:
    """Baseline and candidate served and loaded in the same run, interleaved; see the module docstring.

    Returns ``{levels (one row per impl x level x repeat), ab, step_model (candidate), step_models,
    baseline_measured, baseline, ...}``. Raises ``KernelcampError`` when the candidate's variant hash
    differs from ``deploy_record`` (before, during or after), the baseline server does not come up
    or reports another hash, or a server stops answering. The baseline server is stopped in every case.
    """
    url = str(deploy_record.get("url") or "").rstrip("/")
    if not url:
        raise KernelcampError(f"deploy record has no url: {REDEPLOY}")
    info = fetch_info(url)
    hash_checked = check_server(deploy_record, info)
    plan = serving_plan(params, server_on_cpu(info))
    sv = (params.get("benchmark") or {}).get("serving") or {}
    repeats = int(sv.get("repeats", 2))
    if repeats < 1:
        raise KernelcampError(f"benchmark.serving.repeats={repeats}: expected >= 1")
    plan["repeats"] = repeats
    rep = params.get("report") or {}
    why_not = None
    if deploy_record.get("kind") != "embedded":
        why_not = (
            f"deploy.kind={deploy_record.get('kind')} serves a foreign server: kernelcamp cannot start the "
            "baseline beside it, so only the candidate was measured"
        )
    elif not sv.get("measure_baseline", True):
        why_not = "benchmark.serving.measure_baseline is false"
    elif not params.get("baseline"):
        why_not = "params.yaml has no baseline section"
    measured_at = now_utc()
    with contextlib.ExitStack() as stack:
        base = None if why_not else stack.enter_context(baseline_server(params, url, root))
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
        rows: list[dict[str, Any]] = []
        steps: dict[str, list[dict[str, Any]]] = {i: [] for i in impls}
        last_info: dict[str, Any] | None = None
        rnd = 0
        for li, c in enumerate(plan["concurrency"]):
            for r in range(repeats):
                order = impls if rnd % 2 == 0 else impls[::-1]
                for pos, impl in enumerate(order):
                    t = targets[impl]
                    before = fetch_info(t["url"])
                    t["check"](before)
                    start = ((before or {}).get("counts") or {}).get("step_index", 0)
                    (row,) = run_load(
                        t["url"],
                        [c],
                        prompts=default_prompts(),
                        max_tokens=plan["max_tokens"],
                        num_prompts_per_level=plan["num_prompts_per_level"],
                        timeout_s=plan["timeout_s"],
                        progress=False,
                    )
                    after = fetch_info(t["url"], since=start)
                    t["check"](after)
                    if after:  # only this run's steps: the window since the step counter before it
                        steps[impl] += [s for s in after.get("steps") or [] if s.get("index", 0) > start]
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
                        print(f"[{impl} {t['variant']} r{r}] {progress_line(row)}", file=sys.stderr, flush=True)
                rnd += 1
        step_models = {
            i: (step_model_from_steps(steps[i]) if steps[i] or i == "baseline" else {"skipped": "no info endpoint"})
            for i in impls
        }
        if "baseline" not in step_models:
            step_models["baseline"] = {"skipped": why_not}
        baseline_rec = None if base is None else {k: v for k, v in base.items() if k != "server_info"}
    if baseline_rec is not None:
        baseline_rec["stopped"] = True
    ab = ab_summary(
        rows,
        [int(c) for c in plan["concurrency"]],
        base is not None,
        float(rep.get("confidence", 0.95)),
        float(rep.get("threshold", 0.02)),
        why_not,
    )
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
        "provenance": {**git_info(), "client": device_info()},
    }


# ---- decode-step profiles ------------------------------------------------------------------------------
PROFILE_PATH = "/v1/kernelcamp/profile"


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
            r = httpx.post(
                url + PROFILE_PATH,
                json={"steps": steps, "trace_path": trace_path, "eager": eager, "timeout_s": 60},
                timeout=120,
            )
            if r.status_code != 200:
                msg = (
                    (r.json().get("error") or {}).get("message")
                    if r.headers.get("content-type", "").startswith("application/json")
                    else r.text[:300]
                )
                out.update(skipped=f"{PROFILE_PATH} answered {r.status_code}: {msg}")
                break
            res = r.json()
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
) -> dict[str, Any]:
    """Per-kernel tables of a few decode steps of the deployed candidate and (embedded deploys) the
    baseline, each under load at the highest serving level, via the server's profile endpoint.

    ``traces``: ``{impl: path}`` for the gzipped Kineto traces (written by the server; absolute
    paths). The baseline runs on a temporary server again (:func:`baseline_server`), started after
    the serving benchmark so the benchmark's own windows never include a profiled step. Returns
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
    sv = (params.get("benchmark") or {}).get("serving") or {}
    out: dict[str, Any] = {"concurrency": c, "max_tokens": max_tokens, "steps": steps, "impls": {}}

    def one(impl: str, u: str, check: Any) -> None:
        if progress:
            print(f"[profile {impl}] {steps} decode steps at concurrency {c} on {u}", file=sys.stderr, flush=True)
        out["impls"][impl] = _profile_one(
            u, check, c, max_tokens, steps, str(Path(traces[impl]).resolve()), plan["timeout_s"]
        )

    one("candidate", url, lambda i: check_server(deploy_record, i))
    why_not = None
    if deploy_record.get("kind") != "embedded":
        why_not = f"deploy.kind={deploy_record.get('kind')}: no baseline server beside a foreign server"
    elif not sv.get("measure_baseline", True):
        why_not = "benchmark.serving.measure_baseline is false"
    elif not params.get("baseline"):
        why_not = "params.yaml has no baseline section"
    if why_not:
        out["impls"]["baseline"] = {"skipped": why_not}
    else:
        with baseline_server(params, url, root) as b:
            one("baseline", b["url"], lambda i: _check_baseline(b, i))
    return out

"""Serving benchmark against the deployed server (used by stages/benchmark.py).

``serving_benchmark(params, deploy_record)`` refuses (``KernelcampError``) to measure a server whose
reported variant hash differs from the deploy record (or whose answering pid changed since the
deploy, for the embedded server), runs the concurrency levels of ``benchmark.serving`` with
:mod:`kernelcamp.serving.loadgen`, re-checks the hash afterwards, and fits the step model
``step_ms = a_ms + b_ms_per_req * batch`` from the decode steps the server recorded during the run.

CPU scaling: when the server runs on a CPU (its info says ``device: cpu``; or, for a server without
the info endpoint, when this machine has no GPU) the levels come from ``benchmark.serving.cpu``
(``{concurrency, max_tokens, num_prompts_per_level}``) or the flat keys ``cpu_concurrency`` /
``cpu_max_tokens``, else concurrency [4, 1] and max_tokens 16; the result says ``scaled_for_cpu``.
"""

from __future__ import annotations

from typing import Any

import httpx

from kernelcamp.errors import KernelcampError
from kernelcamp.provenance import device_info, git_info, now_utc
from kernelcamp.serving import INFO_PATH
from kernelcamp.serving.loadgen import default_prompts, run_load
from kernelcamp.stats import fit_step_model

CPU_DEFAULT = {"concurrency": [4, 1], "max_tokens": 16}


def fetch_info(url: str, **query: Any) -> dict[str, Any] | None:
    """The server's info endpoint, or None when it has none (a foreign server)."""
    try:
        r = httpx.get(url.rstrip("/") + INFO_PATH, params=query or None, timeout=30)
    except httpx.HTTPError as e:
        raise KernelcampError(f"server at {url} does not answer ({type(e).__name__}): run the deploy stage") from e
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
            "refusing to measure it; rerun the deploy stage"
        )
    if deploy_record.get("kind") == "embedded" and deploy_record.get("pid") and info.get("pid") != deploy_record["pid"]:
        raise KernelcampError(
            f"server at {url} is pid {info.get('pid')}, not the deployed pid {deploy_record['pid']}: "
            "rerun the deploy stage"
        )
    return True


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


def step_model_from_steps(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Fit a + b*batch over decode steps; per-batch medians beside it. ``{"skipped": why}`` when unfit."""
    dec = [s for s in steps if s.get("kind") == "decode"]
    if len({s["batch"] for s in dec}) < 2:
        return {"skipped": f"{len(dec)} decode steps with fewer than 2 distinct batch sizes", "n_points": len(dec)}
    fit = fit_step_model([s["batch"] for s in dec], [s["step_ms"] for s in dec])
    import numpy as np

    by = {}
    for b in sorted({s["batch"] for s in dec}):
        v = [s["step_ms"] for s in dec if s["batch"] == b]
        by[str(b)] = {"n": len(v), "step_ms_median": float(np.median(v))}
    return {**fit, "by_batch": by, "source": "server per-step statistics (decode steps during the benchmark)"}


def attention_share(info: dict[str, Any] | None) -> dict[str, Any] | None:
    if not info:
        return None
    cal = (info.get("attention_share") or {}).get("calibration") or {}
    return {
        "live": info.get("attention_share_live"),
        "calibration": cal,
        "method": (info.get("attention_share") or {}).get("method"),
    }


def serving_benchmark(params: dict[str, Any], deploy_record: dict[str, Any], progress: bool = True) -> dict[str, Any]:
    """Load the deployed server at each level; returns ``{levels, step_model, attention_share, ...}``.

    Raises ``KernelcampError`` when the server's variant hash differs from ``deploy_record`` (before
    or after the run) or the server does not answer.
    """
    url = str(deploy_record.get("url") or "").rstrip("/")
    if not url:
        raise KernelcampError("deploy record has no url: rerun the deploy stage")
    info = fetch_info(url)
    hash_checked = check_server(deploy_record, info)
    plan = serving_plan(params, server_on_cpu(info))
    start_index = ((info or {}).get("counts") or {}).get("step_index", 0)
    measured_at = now_utc()
    rows = run_load(
        url,
        plan["concurrency"],
        prompts=default_prompts(),
        max_tokens=plan["max_tokens"],
        num_prompts_per_level=plan["num_prompts_per_level"],
        timeout_s=plan["timeout_s"],
        progress=progress,
    )
    after = fetch_info(url, since=start_index)
    check_server(deploy_record, after)
    step_model = step_model_from_steps((after or {}).get("steps") or []) if after else {"skipped": "no info endpoint"}
    return {
        "levels": rows,
        "all_levels_valid": all(r["valid"] for r in rows),
        "step_model": step_model,
        "attention_share": attention_share(after),
        "attention_impl": (after or {}).get("attention_impl"),
        "config_running": (after or {}).get("config_running"),
        "server_device": (after or {}).get("device"),
        "scaled_for_cpu": plan["scaled_for_cpu"],
        "plan": plan,
        "url": url,
        "variant_hash": deploy_record.get("variant_hash"),
        "hash_checked": hash_checked,
        "deploy_id": deploy_record.get("deploy_id"),
        "measured_at": measured_at,
        "provenance": {**git_info(), "client": device_info()},
    }

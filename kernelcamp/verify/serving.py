"""Serving verify: greedy outputs at concurrency 1 and at the highest level must be identical.

The same fixed prompts (``verify.serving.num_prompts``, each ending in a unique word so every
expected output is distinct) are sent at concurrency 1 and at concurrency N (``verify.serving.
concurrency``, null: the highest benchmark level, CPU-scaled like the benchmark), ``max_tokens``
``verify.serving.max_tokens``. Per prompt the stream text at N is compared with its text at 1:

- ``swapped``: it equals the concurrency-1 output of another prompt (a stream carrying another
  request's tokens);
- ``mismatch``: it differs otherwise (corrupted), with the first differing word position;
- failed requests (http errors, timeouts, broken streams, zero tokens) at either level.

``passed`` is true only when every request at both levels is ok, no output differs, and the
concurrency-1 outputs are pairwise distinct (else a swap could not be seen; reported as such).
"""

from __future__ import annotations

import asyncio
from typing import Any

from kernelcamp.bench.serving import check_server, fetch_info, redeploy_advice, server_on_cpu, serving_plan
from kernelcamp.errors import KernelcampError
from kernelcamp.loadgen import default_prompts, run_level
from kernelcamp.provenance import now_utc


def _first_diff(a: str, b: str) -> int:
    wa, wb = a.split(), b.split()
    for i, (x, y) in enumerate(zip(wa, wb, strict=False)):
        if x != y:
            return i
    return min(len(wa), len(wb))


def compare_outputs(ref: list[str], got: list[str]) -> dict[str, Any]:
    """Per-prompt comparison of outputs at N (``got``) against concurrency 1 (``ref``)."""
    by_text: dict[str, list[int]] = {}
    for i, t in enumerate(ref):
        by_text.setdefault(t, []).append(i)
    swapped, mismatched = [], []
    for i, (r, g) in enumerate(zip(ref, got, strict=True)):
        if r == g:
            continue
        others = [j for j in by_text.get(g, []) if j != i]
        if others:
            swapped.append({"prompt": i, "carries_output_of": others[0]})
        else:
            mismatched.append({"prompt": i, "first_diff_word": _first_diff(r, g), "expected": r[:120], "got": g[:120]})
    return {"swapped": swapped, "mismatched": mismatched, "distinct_reference_outputs": len(by_text) == len(ref)}


def serving_verify(params: dict[str, Any], deploy_record: dict[str, Any]) -> dict[str, Any]:
    """Run both levels against the deployed server and compare; returns ``{passed, ...details}``.

    Raises ``KernelcampError`` when the server's variant hash differs from the deploy record.
    """
    url = str(deploy_record.get("url") or "").rstrip("/")
    if not url:
        raise KernelcampError(f"deploy record has no url: {redeploy_advice()}")
    info = fetch_info(url)
    check_server(deploy_record, info)
    vs = (params.get("verify") or {}).get("serving") or {}
    plan = serving_plan(params, server_on_cpu(info))
    conc = int(vs.get("concurrency") or max(plan["concurrency"]))
    n = int(vs.get("num_prompts") or 16)
    max_tokens = int(vs.get("max_tokens") or 32)
    prompts = default_prompts(n)

    async def both():
        ref_row, ref = await run_level(url, prompts, 1, max_tokens, n, plan["timeout_s"], collect_text=True)
        hi_row, hi = await run_level(url, prompts, conc, max_tokens, n, plan["timeout_s"], collect_text=True)
        return ref_row, ref, hi_row, hi

    ref_row, ref, hi_row, hi = asyncio.run(both())
    failed = {
        "concurrency_1": {i: r.status for i, r in enumerate(ref) if not r.ok},
        f"concurrency_{conc}": {i: r.status for i, r in enumerate(hi) if not r.ok},
    }
    cmp = compare_outputs([r.text for r in ref], [r.text for r in hi])
    n_failed = sum(len(v) for v in failed.values())
    passed = n_failed == 0 and not cmp["swapped"] and not cmp["mismatched"] and cmp["distinct_reference_outputs"]
    check_server(deploy_record, fetch_info(url))
    return {
        "passed": passed,
        "concurrency": [1, conc],
        "num_prompts": n,
        "max_tokens": max_tokens,
        "requests_failed": n_failed,
        "failed": failed,
        "num_swapped": len(cmp["swapped"]),
        "num_mismatched": len(cmp["mismatched"]),
        **cmp,
        "levels": [ref_row, hi_row],
        "variant_hash": deploy_record.get("variant_hash"),
        "deploy_id": deploy_record.get("deploy_id"),
        "measured_at": now_utc(),
    }


def check_serving(params: dict, deploy: dict) -> dict[str, Any]:
    """:func:`serving_verify` when ``verify.serving.enabled``, else why it was skipped."""
    if not params["verify"]["serving"].get("enabled"):
        return {"skipped": "verify.serving.enabled is false", "passed": None}
    print("[verify] serving outputs at concurrency 1 vs N", flush=True)
    return serving_verify(params, deploy)

"""Does a decode-step profile leave the embedded server slower? (issue 12; run on the lent GPU)

    python benchmarks/cupti_probe.py OUT.json [--params params.yaml] [--port 8790] [--levels 1 64]

For each setting of Kineto's ``TEARDOWN_CUPTI`` (unset: torch's default, and ``1``: cuptiFinalize at the
end of a profile; pytorch/pytorch#144455), a fresh ``kernelcamp serve`` (params.yaml's variant, server
flags and workload) is loaded in steady-state windows (:func:`kernelcamp.loadgen.run_window_sync`: 1 s
warm-up, 2 s measured, 256 tokens) at each level, three windows per level; then one decode-step profile
(:func:`kernelcamp.serve.client.request_profile`, 5 steps, under load at concurrency 8); then the same
windows again. Writes every window (``phase`` before/after, ``teardown_cupti``, level, ``steady_output_tok_s``,
``tpot_ms_p50``) and the server's ``cuda_profiled`` before and after to OUT.json, and prints the mean
after/before ratio per setting and level. Needs a GPU (a CPU server's profile has no CUDA activity).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from kernelcamp.deploy.common import wait_ready
from kernelcamp.errors import KernelcampError
from kernelcamp.loadgen import run_window_sync
from kernelcamp.serve.client import INFO_PATH, request_profile


def _windows(url: str, levels: list[int], phase: str, teardown: str) -> list[dict]:
    rows = []
    for _ in range(3):
        for c in levels:
            r = run_window_sync(url, c, warmup_s=1.0, window_s=2.0, max_tokens=256)
            row = {
                "teardown_cupti": teardown or "unset",
                "phase": phase,
                "concurrency": c,
                "steady_output_tok_s": r["steady_output_tok_s"],
                "tpot_ms_p50": r.get("tpot_ms_p50"),
                "valid": r["valid"],
            }
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--port", type=int, default=8790)
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 64])
    args = ap.parse_args()
    result: dict = {"windows": [], "servers": []}
    for teardown in ("", "1"):
        env = {k: v for k, v in os.environ.items() if k != "TEARDOWN_CUPTI"}
        if teardown:
            env["TEARDOWN_CUPTI"] = teardown
        url = f"http://127.0.0.1:{args.port}"
        cmd = [sys.executable, "-m", "kernelcamp.cli", "serve", "--params", args.params, "--port", str(args.port)]
        proc = subprocess.Popen(cmd, env=env, start_new_session=True)
        try:
            wait_ready(url, None, 300.0, 0.5, proc=proc)
            before = httpx.get(url + INFO_PATH, params={"steps": 0}, timeout=30).json().get("cuda_profiled")
            result["windows"] += _windows(url, args.levels, "before", teardown)
            load = threading.Thread(target=run_window_sync, args=(url, 8), kwargs={"warmup_s": 0.5, "window_s": 3.0})
            load.start()
            time.sleep(1.0)
            status, body = request_profile(url, None, steps=5, timeout_s=30)
            load.join()
            after = httpx.get(url + INFO_PATH, params={"steps": 0}, timeout=30).json().get("cuda_profiled")
            result["servers"].append(
                {
                    "teardown_cupti": teardown or "unset",
                    "profile_status": status,
                    "cuda_profiled_before": before,
                    "cuda_profiled_after": after,
                }
            )
            result["windows"] += _windows(url, args.levels, "after", teardown)
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        time.sleep(2.0)
    Path(args.out).write_text(json.dumps(result, indent=1))
    for s in result["servers"]:
        print(json.dumps(s))
        for c in args.levels:
            w = [r for r in result["windows"] if r["teardown_cupti"] == s["teardown_cupti"] and r["concurrency"] == c]
            b = statistics.mean(r["steady_output_tok_s"] for r in w if r["phase"] == "before")
            a = statistics.mean(r["steady_output_tok_s"] for r in w if r["phase"] == "after")
            print(
                f"TEARDOWN_CUPTI={s['teardown_cupti']} concurrency {c}: tok/s before {b:.0f}, "
                f"after the profile {a:.0f} (after/before {a / b:.3f})"
            )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KernelcampError as e:  # the server did not come up: one line (the server was stopped)
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)

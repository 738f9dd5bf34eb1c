"""How much the HTTP event loop slows the embedded server's decode steps, without a GPU (issue 12).

The real server's :class:`kernelcamp.serve.server.Engine` and FastAPI app (the one-process server,
``server.engine_process: false``: the model thread beside the HTTP event loop) run in a child process
around a stand-in model whose decode step releases the GIL like the real one's host path (one release
for the input copy, one for the launch) and then sleeps ``--gpu-ms`` with the GIL released (the GPU's
time). The parent loads it with ``kernelcamp loadgen``'s closed-loop window at ``--concurrency`` and
reads the engine's own counters. Because the stand-in step costs a known time, everything above it in
the decode-step period is time the model thread waited for the GIL held by the event loop's SSE work.

    python benchmarks/sse_path_probe.py [--gpu-ms 1.3] [--concurrency 64] [--window-s 4] [--repeats 3]

Prints one line per window: output tok/s (client, steady window), decode steps/s and the mean
step period (server), and the period over the stand-in's own step. A CPU measurement: it compares
two server trees on one machine, it is not a GPU figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class StandInModel:
    """Enough of :class:`kernelcamp.serve.model.DecoderModel` for the engine: pages, prefill and a
    decode step of fixed cost (GIL released while it "runs"), tokens = position mod a small vocab."""

    def __init__(self, gpu_ms: float, pages: int = 100000, page_size: int = 64):
        self.gpu_s = gpu_ms / 1e3
        self.free_pages = list(range(pages))
        self.page_size = page_size
        self.device = None
        self.cuda_graphs = False
        self.on_gpu = False
        self.attn_ms_last = float("nan")
        self.last_bucket = 0
        self.last_timing: dict[str, Any] = {}
        self.launcher = None
        self.calibration: dict[int, Any] = {}
        self.decode_calls = 0
        self.decode_wall_s = 0.0

        class _Cfg:
            vocab_size = 4096
            max_context_tokens = 4096

        self.cfg = _Cfg()
        self._pending: list[int] | None = None

    def describe(self) -> dict[str, Any]:
        return {"model": "sse_path_probe stand-in"}

    def alloc(self, num_tokens: int) -> list[int] | None:
        n = -(-num_tokens // self.page_size)
        if n > len(self.free_pages):
            return None
        out, self.free_pages = self.free_pages[:n], self.free_pages[n:]
        return out

    def free(self, pages: list[int]) -> None:
        self.free_pages.extend(pages)

    def prefill(self, prompt: list[int], pages: list[int]) -> int:
        time.sleep(0)
        return len(prompt) % 4096

    def launch(self, tokens: list[int], positions: list[int], pages: list[list[int]]) -> None:
        t0 = time.perf_counter()
        time.sleep(0)  # the input copy: one GIL release
        time.sleep(0)  # the graph replay
        self._pending = [(p + 1) % 4096 for p in positions]
        self._t0 = t0

    def collect(self) -> list[int]:
        time.sleep(self.gpu_s)  # waiting for the GPU, GIL released
        out, self._pending = self._pending, None
        self.last_bucket = len(out)
        self.last_timing = {"gpu_ms": self.gpu_s * 1e3}
        self.decode_calls += 1
        return out

    def decode(self, tokens: list[int], positions: list[int], pages: list[list[int]]) -> list[int]:
        self.launch(tokens, positions, pages)
        return self.collect()


def serve(port: int, gpu_ms: float, overlap: bool) -> None:
    import uvicorn

    from kernelcamp.serve.server import Engine, ServeState, make_app

    model = StandInModel(gpu_ms)
    state = ServeState(Engine(model, 256, overlap=overlap), None, "", "", {}, "cpu")
    app = make_app(state)

    @app.get("/probe/counts")
    async def counts():
        # the event loop runs on this (main) thread: its own CPU time, not the model thread's
        return {**state.engine.counts, "t": time.perf_counter(), "loop_cpu_s": time.thread_time()}

    prof_out = os.environ.get("SSE_PROBE_CPROFILE")
    if prof_out:  # the event loop's own time by function (cProfile sees the main thread only)
        import cProfile

        cProfile.runctx(
            "uvicorn.run(app, host='127.0.0.1', port=port, log_level='warning', access_log=False)",
            globals(),
            {"uvicorn": uvicorn, "app": app, "port": port},
            prof_out,
        )
    else:
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu-ms", type=float, default=1.3, help="the stand-in decode step's GPU time, ms (1.3)")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--warmup-s", type=float, default=2.0)
    ap.add_argument("--window-s", type=float, default=4.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--overlap", action="store_true", help="server.overlap_scheduling on")
    ap.add_argument("--json", action="store_true", help="one JSON object per window")
    ap.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve is not None:
        serve(args.serve, args.gpu_ms, args.overlap)
        return 0
    import httpx

    from kernelcamp.loadgen import run_window_sync
    from kernelcamp.serve.testing import free_port

    port = free_port()
    cmd = [sys.executable, __file__, "--serve", str(port), "--gpu-ms", str(args.gpu_ms)]
    if args.overlap:
        cmd.append("--overlap")
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        else:
            print("error: the probe server did not start", file=sys.stderr)
            return 1
        for i in range(args.repeats):
            c0 = httpx.get(url + "/probe/counts").json()
            row = run_window_sync(
                url, args.concurrency, warmup_s=args.warmup_s, window_s=args.window_s, max_tokens=args.max_tokens
            )
            c1 = httpx.get(url + "/probe/counts").json()
            steps = c1["decode_steps"] - c0["decode_steps"]
            dt = c1["t"] - c0["t"]
            period_ms = dt / steps * 1e3 if steps else float("nan")
            out = {
                "window": i,
                "concurrency": args.concurrency,
                "gpu_ms": args.gpu_ms,
                "overlap": args.overlap,
                "steady_output_tok_s": row["steady_output_tok_s"],
                "decode_steps_per_s": steps / dt,
                "step_period_ms": period_ms,
                "host_wait_ms": period_ms - args.gpu_ms,
                "tokens_per_step": (c1["tokens_generated"] - c0["tokens_generated"]) / steps if steps else None,
                "loop_cpu_us_per_token": (c1["loop_cpu_s"] - c0["loop_cpu_s"])
                / max(1, c1["tokens_generated"] - c0["tokens_generated"])
                * 1e6,
            }
            if args.json:
                print(json.dumps(out), flush=True)
            else:
                print(
                    f"window {i}: {out['steady_output_tok_s']:9.0f} tok/s (client)  {out['decode_steps_per_s']:7.1f} "
                    f"steps/s  period {period_ms:6.3f} ms = stand-in {args.gpu_ms} + host/GIL wait "
                    f"{out['host_wait_ms']:6.3f} ms  ({out['tokens_per_step']:.1f} tok/step), event loop "
                    f"{out['loop_cpu_us_per_token']:.1f} us CPU/token  [CPU figures]",
                    flush=True,
                )
    finally:
        proc.send_signal(2)
        proc.wait(timeout=20)
    return 0


if __name__ == "__main__":
    sys.exit(main())

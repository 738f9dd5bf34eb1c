"""How many streamed tokens per second the load generator sustains (target: >= 5,000 on 2 CPU cores).

A minimal raw-asyncio server (a separate process, pinned to one core) answers every completion at
once: the whole SSE stream of ``max_tokens`` one-token chunks (``kernelcamp_tokens: 1`` each, as the
embedded server sends them) in one write, so the figure is the client's own parsing and bookkeeping
rate. The load generator runs in this process, pinned to the other core, at each concurrency level.

    python benchmarks/bench_loadgen.py --out reports/serving_bench [--levels 64 8] [--max-tokens 256]

Writes ``<out>/loadgen.json`` (``loadgen_per_token_writes.json`` with ``--per-token-writes``: the server
writes every token's chunk separately, so the client also pays one read per token) and prints one
line per level.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kernelcamp.io import write_json_atomic  # noqa: E402
from kernelcamp.loadgen import default_prompts, run_load  # noqa: E402
from kernelcamp.provenance import git_info, now_utc  # noqa: E402
from kernelcamp.serve.testing import free_port  # noqa: E402


def _events(max_tokens: int) -> list[bytes]:
    ev = []
    for i in range(max_tokens):
        obj = {
            "id": "x",
            "object": "text_completion",
            "choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}],
            "kernelcamp_tokens": 1,
        }
        ev.append(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")
    fin = {
        "id": "x",
        "object": "text_completion",
        "choices": [{"index": 0, "text": "", "finish_reason": "length"}],
        "kernelcamp_tokens": 0,
    }
    ev.append(b"data: " + json.dumps(fin).encode() + b"\n\ndata: [DONE]\n\n")
    return [b"%x\r\n%s\r\n" % (len(e), e) for e in ev]  # one HTTP chunk per SSE event


def _serve(port: int, max_tokens: int, core: int | None, per_token: bool) -> None:
    if core is not None:
        os.sched_setaffinity(0, {core})
    chunks = _events(max_tokens)
    body = b"".join(chunks) + b"0\r\n\r\n"
    stream_head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    models = b'{"object":"list","data":[{"id":"m"}]}'
    models_resp = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(models),
        models,
    )

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                if length:
                    await reader.readexactly(length)
                if head.startswith(b"GET"):
                    writer.write(models_resp)
                elif per_token:  # one write (and usually one TCP segment) per token
                    writer.write(stream_head)
                    for c in chunks:
                        writer.write(c)
                        await writer.drain()
                        await asyncio.sleep(0)
                    writer.write(b"0\r\n\r\n")
                else:
                    writer.write(stream_head + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def main() -> None:
        srv = await asyncio.start_server(handle, "127.0.0.1", port, backlog=1024)
        async with srv:
            await srv.serve_forever()

    asyncio.run(main())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="reports/serving_bench")
    ap.add_argument("--levels", type=int, nargs="+", default=[64, 8])
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--requests-per-level", type=int, default=256)
    ap.add_argument(
        "--per-token-writes",
        action="store_true",
        help="the server writes each token's chunk separately (else the whole stream in one write)",
    )
    args = ap.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    server_core, client_core = (cores[1], cores[0]) if len(cores) >= 2 else (None, None)
    port = free_port()
    proc = mp.get_context("spawn").Process(
        target=_serve, args=(port, args.max_tokens, server_core, args.per_token_writes), daemon=True
    )
    proc.start()
    try:
        time.sleep(1.0)
        if client_core is not None:
            os.sched_setaffinity(0, {client_core})
        rows = run_load(
            f"http://127.0.0.1:{port}",
            args.levels,
            prompts=default_prompts(),
            max_tokens=args.max_tokens,
            num_prompts_per_level=args.requests_per_level,
            timeout_s=120,
            progress=True,
        )
    finally:
        proc.terminate()
        proc.join(5)
        os.sched_setaffinity(0, set(cores))
    result = {
        "what": "kernelcamp.serving.loadgen streamed tokens/s against a server that answers at once",
        "server_writes": "one write per token" if args.per_token_writes else "whole stream in one write",
        "label": f"CPU, this machine ({platform.node()}), {now_utc()[:10]}",
        "cores": {"available": len(cores), "client_core": client_core, "server_core": server_core},
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "measured_at": now_utc(),
        **git_info(ROOT),
        "levels": [
            {
                k: r[k]
                for k in (
                    "concurrency",
                    "num_requests",
                    "max_tokens",
                    "requests_ok",
                    "requests_failed",
                    "valid",
                    "output_tokens",
                    "wall_s",
                    "output_tok_s",
                )
            }
            for r in rows
        ],
        "min_output_tok_s": min(r["output_tok_s"] or 0 for r in rows),
        "target_tok_s": 5000,
    }
    result["meets_target"] = result["min_output_tok_s"] >= 5000
    out = Path(args.out) / ("loadgen_per_token_writes.json" if args.per_token_writes else "loadgen.json")
    write_json_atomic(out, result)
    print(
        f"loadgen: min {result['min_output_tok_s']:.0f} streamed tok/s over levels {args.levels} "
        f"({'meets' if result['meets_target'] else 'BELOW'} 5000) -> {out}"
    )
    return 0 if result["meets_target"] else 1


if __name__ == "__main__":
    sys.exit(main())

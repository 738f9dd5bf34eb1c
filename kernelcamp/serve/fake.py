"""The fixed-rate fake server (``kernelcamp serve --fake SPEC``): known timing and optional failure
modes, for tests of the load generator, deploy and the serving benchmark. The same request models,
error shapes, JSON-only POSTs and optional API key as the real server (:mod:`kernelcamp.serve.openai`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
import zlib
from dataclasses import dataclass, fields
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from kernelcamp.errors import KernelcampError
from kernelcamp.serve.client import INFO_PATH
from kernelcamp.serve.openai import (
    MODEL_NAME,
    ChatRequest,
    ClientGone,
    CompletionRequest,
    _add_completion_routes,
    _check_model,
    _client_gone,
    _error,
    _full,
    _openai_app,
    _stream_tokens,
    _unless_client_leaves,
)


# ---- the fixed-rate fake -----------------------------------------------------------------------------
@dataclass
class FakeSpec:
    """Fixed-rate fake server behaviour (all times in ms).

    A request for N tokens sleeps ``ttft_ms``, sends a chunk of ``chunk`` tokens, then every
    ``itl_ms * chunk`` another chunk, so: TTFT = ttft_ms, ITL per token = itl_ms, e2e = ttft_ms +
    (ceil(N/chunk) - 1) * chunk * itl_ms, TPOT = (e2e - ttft) / (N - 1). Failure modes act on every
    n-th request (1-based count of requests received; 0 = never): ``fail_every`` answers 500,
    ``hang_every`` never answers (a client timeout), ``empty_every`` streams zero tokens,
    ``broken_every`` drops the connection after half the tokens. ``swap``: when another request is in
    flight as the first token goes out, stream that request's tokens instead, all of them (a corrupted
    scheduler that mixed up two requests). ``usage_only``: chunks
    carry no ``kernelcamp_tokens`` (a foreign server; usage only in the final chunk if asked).
    Output tokens are a function of the prompt only (as greedy decoding would give).
    """

    ttft_ms: float = 0.0
    itl_ms: float = 0.0
    chunk: int = 1
    fail_every: int = 0
    hang_every: int = 0
    empty_every: int = 0
    broken_every: int = 0
    swap: bool = False
    usage_only: bool = False
    never_ready: bool = False
    variant_hash: str = "fake"
    cuda_profiled: bool = False  # what the info endpoint says (a server an earlier profile left slower)

    @classmethod
    def parse(cls, spec: str) -> FakeSpec:
        """``"ttft_ms=50,itl_ms=10,chunk=2"`` -> FakeSpec. Raises ``KernelcampError`` naming the key for an
        unknown key, a value that is not of the key's type, a negative or non-finite time, a negative
        count or ``chunk < 1``."""
        kw: dict[str, Any] = {}
        types = {f.name: f.type for f in fields(cls)}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            k, eq, v = (x.strip() for x in part.partition("="))
            if k not in types:
                raise KernelcampError(f"--fake: unknown key {k!r}; keys: {', '.join(types)}")
            if not eq:
                raise KernelcampError(f"--fake {k}: expected {k}=<value>")
            t = str(types[k].__name__ if isinstance(types[k], type) else types[k])
            if t == "bool":
                if v.lower() not in ("1", "true", "yes", "0", "false", "no"):
                    raise KernelcampError(f"--fake {k}={v!r}: expected true or false")
                kw[k] = v.lower() in ("1", "true", "yes")
            elif t == "str":
                kw[k] = v
            elif t == "float":
                try:
                    x = float(v)
                except ValueError:
                    raise KernelcampError(f"--fake {k}={v!r}: expected a number of milliseconds") from None
                if not math.isfinite(x) or x < 0:
                    raise KernelcampError(f"--fake {k}={v!r}: expected a finite number >= 0")
                kw[k] = x
            else:
                try:
                    n = int(v)
                except ValueError:
                    raise KernelcampError(f"--fake {k}={v!r}: expected an integer") from None
                low = 1 if k == "chunk" else 0
                if n < low:
                    raise KernelcampError(f"--fake {k}={v!r}: expected an integer >= {low}")
                kw[k] = n
        return cls(**kw)


def fake_tokens(prompt: str, n: int) -> list[int]:
    """The fake server's deterministic output ids for a prompt (distinct prompts -> distinct outputs)."""
    seed = zlib.crc32(prompt.encode())
    return [zlib.crc32(f"{seed}:{i}".encode()) % 50000 for i in range(n)]


def make_fake_app(spec: FakeSpec, api_key: str | None = None) -> FastAPI:
    """A server with known timing and optional failure modes (see :class:`FakeSpec`); the same request
    models, error shapes, JSON-only POSTs and optional API key as the real server."""
    from kernelcamp.serve.tokens import token_text

    if spec.chunk < 1 or spec.ttft_ms < 0 or spec.itl_ms < 0:
        raise KernelcampError(f"fake spec: chunk must be >= 1 and times >= 0 (got {spec})")
    app = _openai_app("kernelcamp fixed-rate fake", api_key)
    state = {"n": 0, "inflight": {}}

    @app.get("/health")
    async def health():
        return JSONResponse({"status": "starting"}, status_code=503) if spec.never_ready else {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": MODEL_NAME, "object": "model"}]}

    @app.get(INFO_PATH)
    async def info(steps: int = 256, since: int | None = None):
        return {
            "variant_name": "fake",
            "variant_hash": spec.variant_hash,
            "fake": spec.__dict__,
            "pid": os.getpid(),
            "attention_impl": "none",
            "device": "cpu",
            "cuda_profiled": spec.cuda_profiled,
            "steps": [],
            "counts": {"requests_total": state["n"]},
        }

    async def _complete(req: CompletionRequest | ChatRequest, chat: bool, request: Request):
        bad = _check_model(req)
        if bad is not None:
            return bad
        state["n"] += 1
        n_req = state["n"]
        prompt, max_tokens = req.text(), req.tokens_wanted()

        def every(k: int) -> bool:
            return k > 0 and n_req % k == 0

        if every(spec.fail_every):
            return _error("fake failure", 500)
        if every(spec.hang_every):  # never answer; give up once the client has gone
            while not await request.is_disconnected():
                await asyncio.sleep(0.05)
            return _error("client gone", 499)
        rid = f"fake-{n_req}"
        toks = [] if every(spec.empty_every) else fake_tokens(prompt, max_tokens)
        state["inflight"][rid] = toks
        broken = every(spec.broken_every)

        async def pieces():
            try:
                await asyncio.sleep(spec.ttft_ms / 1e3)
                t_next = time.perf_counter()
                src = toks
                if spec.swap:  # one other request's whole answer (picked per token, it came out mixed)
                    others = [v for k, v in state["inflight"].items() if k != rid and len(v) == len(toks)]
                    src = others[0] if others else toks
                for i in range(0, len(toks), spec.chunk):
                    if broken and i >= len(toks) // 2:
                        raise RuntimeError("fake broken stream")
                    part = src[i : i + spec.chunk]
                    yield "".join(token_text(t) for t in part), len(part)
                    t_next += spec.itl_ms * spec.chunk / 1e3
                    delay = t_next - time.perf_counter()
                    if i + spec.chunk < len(toks) and delay > 0:
                        await asyncio.sleep(delay)
            finally:
                state["inflight"].pop(rid, None)

        if req.stream:
            gen = _stream_tokens(
                rid, chat, len(prompt.split()), pieces(), req.include_usage(), counts=not spec.usage_only
            )
            return StreamingResponse(gen, media_type="text/event-stream")

        async def whole() -> tuple[str, int]:
            text, n = "", 0
            async with contextlib.aclosing(pieces()) as ps:
                async for t, k in ps:
                    text, n = text + t, n + k
            return text, n

        try:  # stop generating once the client has gone, as the real server does
            text, n = await _unless_client_leaves(request, whole())
        except ClientGone:
            return _client_gone()
        return _full(rid, chat, text, len(prompt.split()), n)

    _add_completion_routes(app, _complete)
    return app

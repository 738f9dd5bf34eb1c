"""Async load generator for any OpenAI-compatible endpoint, with DESIGN.md's serving metrics.

For each concurrency level C (in the configured order; default 48, 64, 80, 96, 8, 1), ``num_prompts``
streamed requests (default 2*C) from a fixed prompt set are sent by C concurrent workers, each
asking for ``max_tokens`` (default 256). Per request the client records the send time, the arrival
time and token count of every SSE chunk, and how the request ended.

Token counting per chunk (documented rule):
1. ``"kernelcamp_tokens": k`` in the chunk (kernelcamp's server and fake): k tokens.
2. otherwise a chunk whose text / delta content is non-empty counts 1, and when the server sends a
   final ``usage`` (we always ask with ``stream_options: {include_usage: true}``) whose
   ``completion_tokens`` differs, that total is apportioned evenly over the content chunks
   (each gets total / chunks; ITL gaps follow the same k).

A request is ok when the status is 200, the stream ends cleanly (``[DONE]`` or a finish_reason) and
it carried > 0 tokens. Failures (never counted toward throughput): ``http_<status>``, ``timeout``
(``timeout_s`` per request, total), ``broken_stream`` (connection dropped / no end marker),
``stream_error`` (an error event in the stream, ``data: {"error": ...}``, as vLLM sends when a request
fails after its stream began), ``zero_tokens``, ``error:<Type>``. Incomplete (not ok, not failed, also
kept out of throughput): a clean end with fewer than max_tokens tokens and finish_reason other than
"stop", or a request still running when the level deadline (``level_timeout_s``) cut it off. A level
with any failed or incomplete request has ``valid: false``.

Metrics per level (DESIGN.md, "Definitions"): requests_ok, requests_failed, incomplete, wall_s (first
send to last end), output_tok_s (tokens of ok requests / wall_s), per_request_tok_s (mean over ok of
tokens / e2e), ttft_ms, tpot_ms ((e2e - ttft)/(tokens - 1), requests with one token skipped),
itl_ms (a chunk carrying k tokens after a gap g contributes k gaps of g/k), e2e_ms (send to end of
stream); each latency as _p50/_p90/_p99 (numpy percentiles, linear) and _mean, over ok requests; with
failure_reasons (a count per reason) and failure_messages (the first message of each reason that has one: a
refusal's ``error.message``, a stream's error event), which the printed INVALID marks show too.

API key: every request (and the ``/v1/models`` lookup) sends ``Authorization: Bearer <key>`` when
``KERNELCAMP_API_KEY`` is set (:func:`kernelcamp.serve.client.auth_headers`), as a server started
with ``kernelcamp serve --api-key`` (or vLLM's / SGLang's ``--api-key``) requires.

Command line, ``kernelcamp loadgen``: load any OpenAI-compatible server and report vLLM ``bench serve``'s metrics.

    kernelcamp loadgen --url http://127.0.0.1:8765 --concurrency 1 8 32 --num-requests 64 --max-tokens 128
    kernelcamp loadgen --url http://127.0.0.1:8000 --concurrency 16 --chat --model my-model --json | jq .

For each concurrency level C (in the order given) ``--num-requests`` streamed requests (default 2*C)
from kernelcamp's fixed prompt set are sent by C concurrent workers, each asking for ``--max-tokens``
tokens at temperature 0, against ``/v1/completions`` (``/v1/chat/completions`` with ``--chat``). The
client, its token counting and its metrics are this module's (the benchmark stage's own):
:func:`run_level` and :func:`level_metrics`.

Metrics per level, as vLLM's ``bench serve`` reports them (its labels in the human output), with
DESIGN.md's names as keys in ``--json``: successful / failed / incomplete requests
(``requests_ok``, ``requests_failed``, ``incomplete``; a failed or incomplete request never counts
toward throughput, and marks the level ``valid: false``), benchmark duration (``wall_s``, s), request
throughput (``request_throughput``, ok requests / s), output token throughput (``output_tok_s``),
and TTFT, TPOT (first token excluded), ITL and end-to-end latency (``ttft_ms``, ``tpot_ms``,
``itl_ms``, ``e2e_ms``; vLLM's E2EL) as ``_mean``, ``_p50`` (vLLM's "Median"), ``_p90`` and ``_p99``,
all in ms.

Output: a progress bar per level on stderr (rich). Without ``--json``, one result block per level on
stdout as vLLM prints it. With ``--json``, one JSON object per level on stdout (JSON Lines, each
printed as its level ends, so ``jq`` or a pipe sees results while later levels run), and one summary
line per level on stderr.

Exit status: 0 when every level is valid; 1 when some level had a failed or incomplete request (its
results are still printed); 2 for bad input, as one ``error:`` line on stderr (no traceback): a URL
that is not ``http(s)://host[:port]``, a count that is not a positive integer, a server that cannot be
reached or refuses the API key, or a server that refuses every request of the first level with a
client error (:func:`refusal`; e.g. an unknown ``--model``, a ``--max-tokens`` past its limit): the
line gives the server's message, and that level is not printed; 130 on Ctrl-C. ``--model`` is not
checked against ``/v1/models`` beforehand: some servers (TGI, llama.cpp's) take any name.

``--url`` is the server's base URL; a trailing ``/v1`` is accepted and dropped; a password in it
(``http://user:password@host``, sent as basic auth) is shown as ``***`` in every line and record. ``--model``: the
model name sent (default: the first id of ``/v1/models``, else ``default``). ``--api-key``: sent as
``Authorization: Bearer`` (default ``$KERNELCAMP_API_KEY``; prefer the variable, a command line is
visible in ``ps``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import numpy as np

from kernelcamp.errors import KernelcampError, text_shown, url_shown
from kernelcamp.serve import gcwatch
from kernelcamp.serve.client import DEFAULT_PROMPT_WORDS, auth_headers

DEFAULT_LEVELS = (48, 64, 80, 96, 8, 1)
_WORDS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa quebec "
    "romeo sierra tango uniform victor whiskey xray yankee zulu"
).split()


def default_prompts(n: int = 64, words: int = DEFAULT_PROMPT_WORDS) -> list[str]:
    """A fixed, deterministic prompt set: ``n`` prompts of ``words`` words, each ending in a unique word."""
    out = []
    for i in range(n):
        body = [_WORDS[(i * 7 + j * 3) % len(_WORDS)] for j in range(words - 1)]
        out.append(" ".join(body + [f"request-{i:04d}"]))
    return out


@dataclass
class RequestResult:
    """One request's record. Times in seconds (perf_counter); ``chunks``: (arrival time, tokens)."""

    index: int
    # ok | incomplete | http_<code> | timeout | broken_stream | stream_error | zero_tokens | error:<T>
    status: str = "pending"
    start: float = 0.0
    end: float = 0.0
    chunks: list[tuple[float, float]] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    error: str | None = None  # a non-200 answer's or a stream error event's message (:func:`error_message`)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def failed(self) -> bool:
        return self.status not in ("ok", "incomplete", "pending")

    @property
    def tokens(self) -> float:
        return sum(k for _, k in self.chunks)

    @property
    def ttft_s(self) -> float | None:
        firsts = [t for t, k in self.chunks if k > 0]
        return firsts[0] - self.start if firsts else None

    @property
    def e2e_s(self) -> float:
        return self.end - self.start

    def itl_gaps_s(self) -> list[float]:
        """Per-token gaps: each chunk after the first carrying k tokens gives k gaps of (gap/k)."""
        tok = [(t, k) for t, k in self.chunks if k > 0]
        gaps: list[float] = []
        for (t0, _), (t1, k) in zip(tok, tok[1:], strict=False):
            n = max(1, int(round(k)))
            gaps.extend([(t1 - t0) / k] * n)
        return gaps


class BadChunk(ValueError):
    """A stream chunk that is JSON but not the OpenAI shape (an object whose ``choices`` is a list of
    objects, ``usage`` an object, ``kernelcamp_tokens`` a count): the request's status is ``broken_stream``."""


def _check_chunk(obj: Any) -> dict[str, Any]:
    """``obj`` if it has the shape :func:`_chunk_text`, :func:`_finish` and the token count read, else
    ``BadChunk`` (the text's own type is checked where it is read, once a chunk). A server that streamed
    ``data: [1, 2]`` or ``{"choices": 5}`` killed the worker task (an AttributeError outside the request's
    error handling), and the level stopped sending requests."""
    if not isinstance(obj, dict):
        raise BadChunk(f"a chunk is {type(obj).__name__}, not an object")
    ch = obj.get("choices")
    if ch is not None and (not isinstance(ch, list) or not all(isinstance(c, dict) for c in ch)):
        raise BadChunk("choices is not a list of objects")
    if ch and not isinstance(ch[0].get("delta") or {}, dict):
        raise BadChunk("choices[0].delta is not an object")
    if obj.get("usage") is not None and not isinstance(obj["usage"], dict):
        raise BadChunk("usage is not an object")
    k = obj.get("kernelcamp_tokens")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
        raise BadChunk("kernelcamp_tokens is not a count")
    return obj


def _chunk_text(obj: dict[str, Any]) -> str:
    ch = obj.get("choices") or []
    if not ch:
        return ""
    c = ch[0]
    if "text" in c:
        return c.get("text") or ""
    return ((c.get("delta") or {}).get("content")) or ""


def _finish(obj: dict[str, Any]) -> str | None:
    ch = obj.get("choices") or []
    return ch[0].get("finish_reason") if ch else None


async def run_request(
    session: aiohttp.ClientSession,
    url: str,
    payload: dict[str, Any],
    index: int,
    timeout_s: float,
    collect_text: bool = False,
    api_key: str | None = None,
) -> RequestResult:
    """POST one streamed request and record its chunks; never raises for a failed request.

    ``api_key``: sent as ``Authorization: Bearer``; None means ``$KERNELCAMP_API_KEY`` (if set)."""
    r = RequestResult(index)
    texts: list[str] = []
    state = {"usage_total": None, "done": False, "counted": True}

    async def _do() -> None:
        async with session.post(url, json=payload, headers=auth_headers(api_key)) as resp:
            if resp.status != 200:
                r.error = error_message(await resp.read())
                r.status = f"http_{resp.status}"
                return
            async for line in resp.content:
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    state["done"] = True
                    return
                obj = _check_chunk(json.loads(data))
                if "error" in obj:  # an error event mid-stream (vLLM's shape): the request failed
                    r.status, r.error = "stream_error", error_message(data)
                    return
                now = time.perf_counter()
                text = _chunk_text(obj)
                if not isinstance(text, str):
                    raise BadChunk("the chunk's text is not a string")
                if "kernelcamp_tokens" in obj:
                    k = obj["kernelcamp_tokens"]
                else:
                    state["counted"] = False
                    k = 1 if text else 0
                if obj.get("usage") and not obj.get("choices"):
                    state["usage_total"] = obj["usage"].get("completion_tokens")
                if k:
                    r.chunks.append((now, k))
                if collect_text and text:
                    texts.append(text)
                fr = _finish(obj)
                if fr:
                    r.finish_reason = fr

    r.start = time.perf_counter()
    try:
        await asyncio.wait_for(_do(), timeout_s)
    except asyncio.TimeoutError:
        r.status, r.end = "timeout", time.perf_counter()
        return r
    except (
        aiohttp.ClientPayloadError,
        aiohttp.ServerDisconnectedError,
        aiohttp.ClientOSError,
        ConnectionResetError,
        BadChunk,
    ):
        r.status, r.end = "broken_stream", time.perf_counter()
        return r
    except (aiohttp.ClientError, json.JSONDecodeError, OSError) as e:
        r.status, r.end = f"error:{type(e).__name__}", time.perf_counter()
        return r
    r.end = time.perf_counter()
    if r.status != "pending":  # non-200, or an error event
        return r
    r.text = "".join(texts)
    total = state["usage_total"]
    if not state["counted"] and total is not None and r.chunks and total != sum(k for _, k in r.chunks):
        per = total / len(r.chunks)
        r.chunks = [(t, per) for t, _ in r.chunks]
    if not state["done"] and r.finish_reason is None:
        r.status = "broken_stream"
    elif r.tokens <= 0:
        r.status = "zero_tokens"
    elif r.tokens < payload.get("max_tokens", 0) and r.finish_reason != "stop":
        r.status = "incomplete"
    else:
        r.status = "ok"
    return r


def endpoint(chat: bool) -> str:
    """The route a level's requests go to: ``/v1/chat/completions`` with ``chat``, else ``/v1/completions``."""
    return "/v1/chat/completions" if chat else "/v1/completions"


def error_message(body: bytes, limit: int = 300) -> str:
    """A refused request's reason from its answer ``body``: the OpenAI error's ``error.message`` (vLLM's
    older ``message``, FastAPI's ``detail``), else the body's text; one line of at most ``limit``
    characters, ``"(empty answer)"`` for an empty body."""
    text = body.decode("utf-8", "replace")
    try:
        obj = json.loads(text)
    except ValueError:
        obj = None
    if isinstance(obj, dict):
        err = obj.get("error")
        for v in (err.get("message") if isinstance(err, dict) else err, obj.get("message"), obj.get("detail")):
            if isinstance(v, str) and v.strip():
                text = v
                break
    text = " ".join(text.split())
    return (text[: limit - 3] + "...") if len(text) > limit else text or "(empty answer)"


#: Client errors that say nothing about the request's arguments: the server's time limit and its rate limit.
_LOAD_STATUSES = ("http_408", "http_429")


def refusal(results: Sequence[RequestResult]) -> RequestResult | None:
    """The first (lowest index) of ``results`` when the server refused every one of them with a client
    error (HTTP 4xx but 408 and 429, which are about load): the arguments every request carries (model,
    max_tokens, endpoint) are wrong, and the level measured nothing. None otherwise (also for no results)."""
    refused = [r for r in results if r.status.startswith("http_4") and r.status not in _LOAD_STATUSES]
    if not results or len(refused) != len(results):
        return None
    return min(refused, key=lambda r: r.index)


def refusal_advice(status: str, message: str | None) -> str:
    """What to fix when the server refused every request with ``status`` (``http_4xx``) and ``message``: the URL
    for a 404 that names no model and for 405 (no such route: ``--url`` is the base URL, without a path; an unknown
    model is a 404 too, OpenAI's ``model_not_found``), the key for 401 and 403, else the request's arguments."""
    if status == "http_405" or (status == "http_404" and "model" not in (message or "").lower()):
        return "check --url: the server's base URL (http://host:port, a trailing /v1 allowed), no other path"
    if status in ("http_401", "http_403"):
        return "check --api-key (or KERNELCAMP_API_KEY)"
    return "fix the loadgen option it names (--model, --max-tokens, --chat)"


def _pct(values: Sequence[float], prefix: str) -> dict[str, float | None]:
    if not values:
        return {f"{prefix}_p50": None, f"{prefix}_p90": None, f"{prefix}_p99": None, f"{prefix}_mean": None}
    a = np.asarray(values, dtype=float)
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {
        f"{prefix}_p50": float(p50),
        f"{prefix}_p90": float(p90),
        f"{prefix}_p99": float(p99),
        f"{prefix}_mean": float(a.mean()),
    }


def level_metrics(
    results: Sequence[RequestResult], concurrency: int, max_tokens: int, wall_s: float | None = None
) -> dict[str, Any]:
    """The DESIGN.md metrics of one level from its request records (see the module docstring)."""
    ok = [r for r in results if r.ok]
    failed = [r for r in results if r.failed]
    incomplete = [r for r in results if r.status in ("incomplete", "pending")]
    if wall_s is None:
        started = [r for r in results if r.start]
        wall_s = (max(r.end for r in started) - min(r.start for r in started)) if started else 0.0
    tokens = sum(r.tokens for r in ok)
    row: dict[str, Any] = {
        "concurrency": concurrency,
        "num_requests": len(results),
        "max_tokens": max_tokens,
        "requests_ok": len(ok),
        "requests_failed": len(failed),
        "incomplete": len(incomplete),
        "valid": not failed and not incomplete and bool(ok),
        "failure_reasons": dict(Counter(r.status for r in failed + incomplete)),
        # the first message of each reason that carries one (a refusal's error.message, a stream's error event)
        "failure_messages": {r.status: r.error for r in reversed(failed) if r.error},
        "wall_s": wall_s,
        "output_tokens": tokens,
        "output_tok_s": tokens / wall_s if wall_s > 0 else None,
        "per_request_tok_s": float(np.mean([r.tokens / r.e2e_s for r in ok if r.e2e_s > 0])) if ok else None,
    }
    row.update(_pct([r.ttft_s * 1e3 for r in ok if r.ttft_s is not None], "ttft_ms"))
    row.update(
        _pct(
            [(r.e2e_s - r.ttft_s) / (r.tokens - 1) * 1e3 for r in ok if r.tokens > 1 and r.ttft_s is not None],
            "tpot_ms",
        )
    )
    row.update(_pct([g * 1e3 for r in ok for g in r.itl_gaps_s()], "itl_ms"))
    row.update(_pct([r.e2e_s * 1e3 for r in ok], "e2e_ms"))
    return row


def make_payload(prompt: str, max_tokens: int, chat: bool, model: str, extra: dict[str, Any] | None) -> dict:
    p: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "stream": True,
        "temperature": 0.0,
        "stream_options": {"include_usage": True},
    }
    if chat:
        p["messages"] = [{"role": "user", "content": prompt}]
    else:
        p["prompt"] = prompt
    p.update(extra or {})
    return p


DEFAULT_MODEL = "default"
"""The model name sent when ``--model`` is not given and ``/v1/models`` lists none (or fails)."""


async def _model_id(session: aiohttp.ClientSession, base: str, api_key: str | None = None) -> str:
    try:
        async with session.get(
            base + "/v1/models", timeout=aiohttp.ClientTimeout(total=10), headers=auth_headers(api_key)
        ) as r:
            return listed_model(await r.json()) or DEFAULT_MODEL
    except Exception:  # noqa: BLE001 - a server without /v1/models gets a placeholder name
        return DEFAULT_MODEL


async def run_level(
    base_url: str,
    prompts: Sequence[str],
    concurrency: int,
    max_tokens: int = 256,
    num_requests: int | None = None,
    timeout_s: float = 300.0,
    chat: bool = False,
    model: str | None = None,
    extra_body: dict[str, Any] | None = None,
    collect_text: bool = False,
    level_timeout_s: float | None = None,
    api_key: str | None = None,
    on_result: Callable[[RequestResult], None] | None = None,
) -> tuple[dict[str, Any], list[RequestResult]]:
    """One concurrency level. Returns (metrics row, per-request records in prompt order).

    ``api_key``: see :func:`run_request`. ``on_result``: called with each request's record as it ends
    (in the event loop's thread; a progress bar advances on it)."""
    n = num_requests if num_requests is not None else 2 * concurrency
    path = endpoint(chat)
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        mid = model or await _model_id(session, base_url, api_key)
        results = [RequestResult(i) for i in range(n)]
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(n):
            queue.put_nowait(i)

        async def worker() -> None:
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                payload = make_payload(prompts[i % len(prompts)], max_tokens, chat, mid, extra_body)
                results[i] = await run_request(session, base_url + path, payload, i, timeout_s, collect_text, api_key)
                if on_result is not None:
                    on_result(results[i])

        tasks = [asyncio.create_task(worker()) for _ in range(min(concurrency, n))]
        t0 = time.perf_counter()
        done, pending = await asyncio.wait(tasks, timeout=level_timeout_s)
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        wall = max([r.end for r in results if r.end] + [t0]) - min([r.start for r in results if r.start] + [t0])
        for r in results:
            if r.status == "pending":
                r.start = r.start or t0
    row = level_metrics(results, concurrency, max_tokens, wall_s=wall)
    row["num_prompts"] = n
    return row, results


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


async def run_window(
    base_url: str,
    prompts: Sequence[str],
    concurrency: int,
    warmup_s: float,
    window_s: float,
    max_tokens: int = 256,
    timeout_s: float = 300.0,
    chat: bool = False,
    model: str | None = None,
    extra_body: dict[str, Any] | None = None,
    spread_phases: bool = True,
) -> tuple[dict[str, Any], list[RequestResult]]:
    """One steady-state window at ``concurrency``: closed-loop load, warm-up excluded.

    ``concurrency`` workers each send one streamed request after another (prompts cycled from
    ``prompts``) from t0 until ``t0 + warmup_s + window_s``; then no new request starts and the ones in
    flight run to their end (the drain, each bounded by ``timeout_s``), so the next window (of the
    other server, on the same GPU) starts from an idle server. Only ``[t0 + warmup_s, t0 + warmup_s +
    window_s]`` is measured: ``steady_output_tok_s`` = tokens (of requests that did not fail) whose
    chunk arrived inside it, over ``window_s``; ``window_mean_in_flight`` = time-averaged requests in
    flight in it (should be close to ``concurrency``). Latency percentiles (ttft/tpot/itl/e2e) are
    over the ok requests that started inside the window (all ok requests when none did: stated in
    ``latency_from``). Counts, ``valid`` and the DESIGN.md ``output_tok_s`` (ok tokens / wall, ramp and
    drain included) cover every request of the window, warm-up and drain included: any failed or
    incomplete request makes the window invalid. ``client_gc_ms``: pauses of this (the load
    generator's) process's garbage collector from t0 to the end of the drain, ms
    (:mod:`kernelcamp.serve.gcwatch`): while it collects, no chunk is read and no request sent.
    ``spread_phases``: each worker's first request is
    shortened so that the workers' phases are evenly spread (see the worker); the warm-up should
    cover the first prompts' prefill and about one spread request so that the window sees that state.
    Seconds throughout. Returns (row, records).
    """
    path = endpoint(chat)
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
    results: list[RequestResult] = []
    gcw = gcwatch.watch()
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        mid = model or await _model_id(session, base_url)
        gc0 = gcw.total_ms
        t0 = time.perf_counter()
        ws, we = t0 + warmup_s, t0 + warmup_s + window_s
        counter = iter(range(1 << 30))

        async def worker(j: int) -> None:
            # Spread phases: worker j's first request asks for (j + 1)/concurrency of max_tokens, so the
            # workers' later (full-length) requests end, and new ones prefill, spread in time rather than
            # in lock-step waves. The same for both sides. On the H200 (2026-12-01) it did not narrow the
            # window-to-window spread at concurrency 96 (about +-12%, against +-15% without): the decode
            # step time itself varied that much (reports/campaigns/decisions/README.md).
            n = max(1, -(-max_tokens * (j + 1) // concurrency)) if spread_phases else max_tokens
            while time.perf_counter() < we:
                i = next(counter)
                payload = make_payload(prompts[i % len(prompts)], n, chat, mid, extra_body)
                results.append(await run_request(session, base_url + path, payload, i, timeout_s))
                n = max_tokens

        await asyncio.gather(*(worker(j) for j in range(concurrency)))
        client_gc_ms = gcw.total_ms - gc0
    results.sort(key=lambda r: r.index)
    row = level_metrics(results, concurrency, max_tokens)
    counted = [r for r in results if not r.failed]
    steady_tokens = sum(k for r in counted for t, k in r.chunks if ws <= t <= we)
    in_window = [r for r in results if r.ok and ws <= r.start < we]
    if in_window:
        lat = level_metrics(in_window, concurrency, max_tokens)
        row.update({k: v for k, v in lat.items() if k.split("_")[0] in ("ttft", "tpot", "itl", "e2e")})
        row["per_request_tok_s"] = lat["per_request_tok_s"]
    row.update(
        num_prompts=len(results),
        warmup_s=warmup_s,
        window_s=window_s,
        steady_output_tokens=steady_tokens,
        steady_output_tok_s=steady_tokens / window_s if window_s > 0 else None,
        window_mean_in_flight=sum(_overlap(r.start, r.end, ws, we) for r in results) / window_s if window_s else None,
        latency_from="requests started in the window" if in_window else "all ok requests (none started in the window)",
        client_gc_ms=round(client_gc_ms, 3),
    )
    return row, results


def run_window_sync(base_url: str, concurrency: int, **kw: Any) -> dict[str, Any]:
    """Synchronous :func:`run_window` (its own event loop) with :func:`default_prompts`; the row only."""
    prompts = list(kw.pop("prompts", None) or default_prompts())
    row, _ = asyncio.run(run_window(base_url.rstrip("/"), prompts, int(concurrency), **kw))
    return row


def _messages(row: dict[str, Any]) -> str:
    """`` (http_400: max_tokens ...; stream_error: engine error ...)``: a level's failure messages, or ``""``."""
    msgs = row.get("failure_messages") or {}
    return " (" + "; ".join(f"{k}: {v}" for k, v in msgs.items()) + ")" if msgs else ""


def progress_line(row: dict[str, Any]) -> str:
    """One line per level: counts, throughput, p50 latencies, validity."""

    def f(v: Any, spec: str = ".1f") -> str:
        return "-" if v is None else format(v, spec)

    mark = "valid" if row["valid"] else f"INVALID {row['failure_reasons']}{_messages(row)}"
    return (
        f"concurrency {row['concurrency']:>3}: ok {row['requests_ok']}/{row['num_requests']} failed "
        f"{row['requests_failed']} incomplete {row['incomplete']} | {f(row['output_tok_s'])} tok/s, "
        f"{f(row['per_request_tok_s'])} tok/s/req, ttft p50 {f(row['ttft_ms_p50'])} ms, tpot p50 "
        f"{f(row['tpot_ms_p50'], '.2f')} ms, e2e p50 {f(row['e2e_ms_p50'])} ms, wall {f(row['wall_s'], '.2f')} s"
        f" [{mark}]"
    )


async def run_levels(
    base_url: str,
    levels: Sequence[int] = DEFAULT_LEVELS,
    prompts: Sequence[str] | None = None,
    max_tokens: int = 256,
    num_prompts_per_level: int | None = None,
    timeout_s: float = 300.0,
    chat: bool = False,
    progress: bool = True,
    **kw: Any,
) -> list[dict[str, Any]]:
    """All levels in the given order; one progress line per level on stderr."""
    prompts = list(prompts or default_prompts())
    rows = []
    for c in levels:
        row, _ = await run_level(base_url, prompts, int(c), max_tokens, num_prompts_per_level, timeout_s, chat, **kw)
        if progress:
            print(progress_line(row), file=sys.stderr, flush=True)
        rows.append(row)
    return rows


def run_load(base_url: str, levels: Sequence[int] = DEFAULT_LEVELS, **kw: Any) -> list[dict[str, Any]]:
    """Synchronous wrapper of :func:`run_levels` (its own event loop)."""
    return asyncio.run(run_levels(base_url.rstrip("/"), levels, **kw))


# ---- command line: kernelcamp loadgen ------------------------------------------------------------
def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{v} is not positive (expected an integer >= 1)")
    return v


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a positive, finite number of seconds")
    return v


def build_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``loadgen`` to ``sub`` (usage errors exit 2 with one ``error:`` line, as every command's)."""
    ap = sub.add_parser(
        "loadgen",
        description="Load any OpenAI-compatible server and report vLLM bench serve's metrics.",
    )
    ap.add_argument("--url", required=True, help="the server's base URL, http://host:port (a trailing /v1 is dropped)")
    ap.add_argument(
        "--concurrency",
        type=_positive_int,
        nargs="+",
        default=[1],
        metavar="N",
        help="concurrency levels, run in this order (default: 1)",
    )
    ap.add_argument(
        "--num-requests", type=_positive_int, default=None, metavar="N", help="requests per level (default: 2 x level)"
    )
    ap.add_argument("--max-tokens", type=_positive_int, default=256, metavar="N", help="tokens per request (256)")
    ap.add_argument(
        "--timeout-s", type=_positive_float, default=300.0, metavar="S", help="per-request time limit in s (300)"
    )
    ap.add_argument("--chat", action="store_true", help="use /v1/chat/completions instead of /v1/completions")
    ap.add_argument("--model", default=None, help="model name to send (default: the first of /v1/models)")
    ap.add_argument("--api-key", default=None, help="Bearer key (default: $KERNELCAMP_API_KEY)")
    ap.add_argument("--json", action="store_true", help="one JSON object per level on stdout (JSON Lines)")
    ap.set_defaults(main=main)
    return ap


def base_url(url: str) -> str:
    """``url`` as the load generator's base: ``http(s)://host[:port][/prefix]`` without a trailing ``/``
    or ``/v1``. Raises ``KernelcampError`` for another scheme, no host, a bad port, whitespace or a control
    character inside it; a password in it is never part of the message (:func:`kernelcamp.errors.url_shown`:
    neither the URL nor the parser's reason, which can quote a piece of it)."""
    shown = url_shown(url)
    secret = shown != url

    def bad(why: str) -> KernelcampError:
        return KernelcampError(f"--url {shown!r}: {why}")

    url = url.strip()
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        raise bad("holds whitespace or a control character; give the server's base URL alone")
    try:
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.netloc:
            raise bad("expected http://host:port or https://host:port")
        if u.hostname is None:
            raise ValueError("no host")
        u.port  # noqa: B018 - raises ValueError for a port outside 0..65535 or not a number
    except ValueError as e:  # e.g. "Invalid IPv6 URL" for http://[::1
        why = "not a valid URL (percent-encode a /, ?, # or @ in the password)" if secret else str(e)
        raise bad(why) from None
    if u.query or u.fragment:
        raise bad("give the server's base URL, without a query or fragment")
    path = u.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return f"{u.scheme}://{u.netloc}{path}"


def check_key_text(key: str | None) -> None:
    """``KernelcampError`` when the key sent (``key``, else ``$KERNELCAMP_API_KEY``) has whitespace around it or a
    character an HTTP header cannot carry (the client refused it in an error that printed the key). The message
    never shows the key."""
    from kernelcamp.serve.client import api_key

    k = api_key(key)
    if k and (k != k.strip() or any(not 32 < ord(ch) < 127 for ch in k)):
        where = "--api-key" if key is not None else "$KERNELCAMP_API_KEY"
        raise KernelcampError(
            f"{where}: has whitespace or a character other than printable ASCII, which an Authorization header "
            "cannot carry (a copy-paste's trailing space or newline?); pass the key exactly as issued"
        )


def probe_server(base: str, api_key: str | None, timeout_s: float = 10.0) -> str | None:
    """Check that ``base`` answers HTTP before any load (``GET /v1/models``); returns the first model id
    it lists, or None when it lists none (any HTTP answer but 401/403 counts as reachable).

    Raises ``KernelcampError`` when the server cannot be reached within ``timeout_s`` seconds, or
    refuses the API key (401/403)."""
    import httpx

    try:
        r = httpx.get(base + "/v1/models", headers=auth_headers(api_key), timeout=timeout_s)
    except (httpx.HTTPError, httpx.InvalidURL, ValueError) as e:  # ValueError: UnicodeError of a bad host (IDNA)
        why = " ".join(text_shown(str(e), base).split()) or type(e).__name__
        raise KernelcampError(f"cannot reach {url_shown(base)}: {why[:200]}") from None
    if r.status_code in (401, 403):
        raise KernelcampError(
            f"{url_shown(base)} refuses the request ({r.status_code}): "
            "pass its key with --api-key or $KERNELCAMP_API_KEY"
        )
    try:
        return listed_model(r.json())
    except ValueError:
        return None


def listed_model(models: Any) -> str | None:
    """The first model id of a ``/v1/models`` answer ``models`` (the parsed JSON), or None when it lists none: no
    ``data``, an empty list, or an id that is not a string with something besides whitespace (``"id": null`` had
    been sent as the model ``"None"``). Raises nothing."""
    try:
        mid = models["data"][0]["id"]
    except (KeyError, IndexError, TypeError):
        return None
    return mid if isinstance(mid, str) and mid.strip() else None


def json_row(row: dict[str, Any], url: str, model: str | None, chat: bool) -> dict[str, Any]:
    """One level's ``--json`` object: the loadgen metrics row plus ``request_throughput`` (ok requests
    per second of ``wall_s``; None when the level took no time), ``url``, ``model`` and ``endpoint``."""
    wall = row.get("wall_s") or 0.0
    return {
        "url": url,
        "endpoint": endpoint(chat),
        "model": model,
        **row,
        "request_throughput": row["requests_ok"] / wall if wall > 0 else None,
    }


def result_block(obj: dict[str, Any]) -> str:
    """A level's result as vLLM's ``bench serve`` prints it (its labels; Median = p50), plus the
    incomplete count and whether the level is valid."""

    def num(v: Any, spec: str = ".2f") -> str:
        return "-" if v is None else format(v, spec)

    def line(label: str, value: Any) -> str:
        return f"{label:<40} {value}"

    out = [
        "{s:{c}^50}".format(s=f" Serving Benchmark Result (concurrency {obj['concurrency']}) ", c="="),
        line("Endpoint:", obj["url"] + obj["endpoint"]),
        line("Maximum request concurrency:", obj["concurrency"]),
        line("Successful requests:", obj["requests_ok"]),
        line("Failed requests:", obj["requests_failed"]),
        line("Incomplete requests:", obj["incomplete"]),
        line("Benchmark duration (s):", num(obj["wall_s"])),
        line("Total generated tokens:", num(obj["output_tokens"], "g")),
        line("Request throughput (req/s):", num(obj["request_throughput"])),
        line("Output token throughput (tok/s):", num(obj["output_tok_s"])),
        line("Per-request output tok/s (mean):", num(obj["per_request_tok_s"])),
    ]
    for key, name, title in (
        ("ttft", "TTFT", "Time to First Token"),
        ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
        ("itl", "ITL", "Inter-token Latency"),
        ("e2e", "E2EL", "End-to-end Latency"),
    ):
        out.append("{s:{c}^50}".format(s=title, c="-"))
        for stat, label in (("mean", "Mean"), ("p50", "Median"), ("p90", "P90"), ("p99", "P99")):
            out.append(line(f"{label} {name} (ms):", num(obj[f"{key}_ms_{stat}"])))
    valid = "yes" if obj["valid"] else f"NO {obj['failure_reasons'] or 'no successful request'}{_messages(obj)}"
    out += [line("Valid level:", valid), "=" * 50]
    return "\n".join(out)


def _drop_bar(bar: Any) -> None:
    """Stop the rich ``Progress`` ``bar`` leaving nothing behind: erased from a terminal, and without the
    empty line ``Progress.stop`` ends it with elsewhere (its ``with`` block's exit then does nothing)."""
    bar.live.transient = True
    bar.live.stop()
    bar.disable = True


async def _run(args: argparse.Namespace, base: str, model: str | None) -> list[dict[str, Any]]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    prompts = default_prompts()
    rows = []
    console = Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    for level, c in enumerate(args.concurrency):
        n = args.num_requests if args.num_requests is not None else 2 * c
        with Progress(*columns, console=console) as bar:
            task = bar.add_task(f"concurrency {c}", total=n)
            row, results = await run_level(
                base,
                prompts,
                c,
                max_tokens=args.max_tokens,
                num_requests=n,
                timeout_s=args.timeout_s,
                chat=args.chat,
                model=model,
                api_key=args.api_key,
                on_result=lambda _r, task=task, bar=bar: bar.advance(task),
            )
            if level == 0 and (refused := refusal(results)) is not None:
                _drop_bar(bar)  # bad arguments, not a measurement: the error line is all that stays
                raise KernelcampError(
                    f"{url_shown(base)}{endpoint(args.chat)} refused all {n} requests at concurrency {c} "
                    f"(HTTP {refused.status.removeprefix('http_')}): {refused.error}; "
                    + refusal_advice(refused.status, refused.error)
                )
        obj = json_row(row, url_shown(base), model, args.chat)
        rows.append(obj)
        if args.json:
            print(json.dumps(obj), flush=True)
            print(progress_line(row), file=sys.stderr, flush=True)
        else:
            print(result_block(obj), flush=True)
    return rows


def main(args: argparse.Namespace) -> int:
    """``kernelcamp loadgen``: returns 0 (every level valid), 1 (some level invalid) or 2 (bad input,
    one ``error:`` line on stderr); 130 on Ctrl-C. See the module docstring."""
    try:
        base = base_url(args.url)
        if args.api_key is not None and not args.api_key.strip():
            raise KernelcampError("--api-key: empty; pass a key or leave the option out")
        check_key_text(args.api_key)
        listed = probe_server(base, args.api_key)
        model = args.model or listed or DEFAULT_MODEL  # the name every request sends, and the record's
        rows = asyncio.run(_run(args, base, model))
    except KernelcampError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        print("loadgen: interrupted", file=sys.stderr, flush=True)
        return 130
    return 0 if all(r["valid"] for r in rows) else 1


if __name__ == "__main__":  # `python -m kernelcamp.loadgen ...` is `kernelcamp loadgen ...`
    from kernelcamp.cli import main as _cli_main

    sys.exit(_cli_main(["loadgen", *sys.argv[1:]]))

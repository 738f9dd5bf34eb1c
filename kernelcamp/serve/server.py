"""``kernelcamp serve``: the embedded OpenAI-compatible decode server, and a fixed-rate fake for tests.

Endpoints: ``/v1/completions``, ``/v1/chat/completions`` (streamed as SSE or not, OpenAI shapes,
``usage`` counts, ``stream_options.include_usage``), ``/v1/models``, ``/health`` (200 once the model
is loaded and warmed up, 503 before), ``/v1/kernelcamp/info`` (variant name and hash, the config
the launcher actually ran, server flags, attention implementation, per-step statistics, attention
share, pid; ``?steps=N`` returns the last N step records, ``?since=I`` those with index > I),
``POST /v1/kernelcamp/profile`` (see :data:`PROFILE_PATH`: a torch.profiler / Kineto profile of the
next N decode steps the scheduler runs, with a per-kernel time table; the gzipped trace stays in the
server's own folder, ``--trace-dir`` or a private temporary one, and is downloaded by the id the
answer gives from ``GET /v1/kernelcamp/profile/traces/{id}``: a request never names a server path;
:func:`kernelcamp.serve.client.request_profile` does both steps).

Requests (both the real server and the fake): bodies are checked by pydantic models
(:class:`CompletionRequest`, :class:`ChatRequest`, :class:`ProfileRequest`) with strict types (``"stream":
"false"`` is refused, not truthy); every refusal is a 4xx with an OpenAI error object ``{"error":
{"message", "type", "param", "code"}}``, FastAPI's own validation errors included (400, not 422).
A POST whose ``Content-Type`` is not JSON is 415 (a cross-site ``text/plain`` request never runs);
a ``model`` other than :data:`MODEL_NAME` is 404 ``model_not_found``; chat content may be a string or
a list of text parts (joined by newlines; other part types are 400); a prompt that does not fit
``server.max_context_tokens`` with its ``max_tokens`` is 400 ``context_length_exceeded`` (never cut).
``--api-key KEY`` (or ``KERNELCAMP_API_KEY``): ``Authorization: Bearer KEY`` is required on
everything but ``/health`` (401 otherwise), as with vLLM's and SGLang's ``--api-key``.

Token accounting for clients: every streamed chunk carries ``"kernelcamp_tokens": k``, the number
of tokens whose text it holds: one while the event loop keeps up with the decode steps, all those
queued meanwhile when it fell behind (:meth:`Engine.token_batches`), so that the streaming work stays
one write per request per event-loop turn. Frames are spliced from a per-stream template
(``kernelcamp.serve.openai._Frames``); every chunk of a stream carries its one ``created`` time. The
HTTP parser and event loop (httptools and uvloop when installed) are reported in info as
``http_stack``. Decoding is greedy;
``temperature``/``top_p`` are accepted and ignored; generation always runs to ``max_tokens``
(finish_reason "length": the stand-in model has no end-of-sequence token).

Processes: with ``server.engine_process: true`` (the default) ``kernelcamp serve`` is two processes,
an HTTP front on the port and an engine process with the model, the scheduler and this module's app
on a private Unix socket (:mod:`kernelcamp.serve.front`): the model thread then shares its GIL with
an event loop that does one write per decode step, not the SSE writes of every token. With
``false`` it is one process, as described below; :func:`make_app` is that one-process app.

Scheduling (continuous batching, :class:`Engine`): one model thread (``kernelcamp-model``) admits
waiting requests up to ``server.max_running_requests`` (and while the page pool has room for prompt +
max_tokens), prefills each new one, then runs one decode step for every running request, and loops:
steps run back to back and never wait for the HTTP event loop, which only takes requests in and
writes the SSE events. Each step's tokens (those of every request in the batch) reach the event loop
in one ``call_soon_threadsafe`` callback, not one per token. Why: when the scheduler was an asyncio
task awaiting each step on a worker thread, the next step could start only once the event loop got
round to it, behind every pending SSE write (about 10,000 a second at concurrency 64 on an H200), so
the step rate could depend on the streaming load (issue 12's suspect for a 5% run-to-run spread in
tok/s; ``benchmarks/serving_noise_probe.sh`` compares two trees). The model thread still shares the GIL with
the event loop. With ``server.overlap_scheduling: true`` step i's tokens are handed over only once
step i+1 is launched: each turn collects step i (``DecoderModel.collect``: tokens appended, finishes
found), admits and prefills, launches step i+1 (``DecoderModel.launch``), then sends step i's tokens and
finishes; the event loop's SSE writes then run while the GPU computes step i+1, instead of taking the GIL
at the next step's first release, before its launch, with the GPU idle. A token reaches its client
later by the admission, prefills and launch of the next step; with no next step it is sent at once.
Profiled steps run launch and collect in a row, and no request is admitted (prefilled) between two of
them: the profiler runs from the first profiled step to the last, and its table is of decode steps.
The overlap is off by default: on the H200 (V4-Flash bt16_w4, concurrency 64,
reports/campaigns/decisions/README.md) it raised output throughput by 31% but the
step then waits on the event loop's work instead of the GPU (a faster kernel no longer shortens it),
and the run-to-run spread went from 5.6% to 10.1% (five runs each). Without it a step is decoded
(launch + collect) and its tokens are handed over at once. Step records' ``step_ms`` is the model
step alone, timed on the model thread from its launch to its collect's return (with overlap it
includes the hand-off in between, ``handoff_ms``); decode records also carry the GPU time of the step
(``gpu_ms``, CUDA events) and its padded ``bucket`` (fields: :meth:`Engine.stats`). Step i+1 is still
scheduled after step i's tokens are read (no future tokens, unlike SGLang's overlap scheduler);
``overlap_scheduling_active`` in info says whether the hand-off overlap is on.

    kernelcamp serve --params params.yaml [--host 127.0.0.1] [--port N] [--device cuda:0] [--api-key KEY]
                     [--trace-dir DIR]
    kernelcamp serve --fake ttft_ms=50,itl_ms=10,chunk=2 [--port N]     # fixed-rate fake (tests)
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse

from kernelcamp.errors import KernelcampError, out_of_memory
from kernelcamp.hashes import kernel_source_hash, server_flags, variant_hash
from kernelcamp.ports import HOST_FIX, bind_problem
from kernelcamp.serve import gcwatch
from kernelcamp.serve.client import API_KEY_ENV, INFO_PATH, PROFILE_PATH, TRACE_PATH, client_url, exposure_warning
from kernelcamp.serve.fake import FakeSpec, make_fake_app
from kernelcamp.serve.front import (
    ENGINE_KEEPALIVE_S,
    EngineLink,
    add_engine_routes,
    http_stack,
    make_front_app,
    queue_batches,
    watch_parent,
)
from kernelcamp.serve.openai import (
    BODY_TIMEOUT_S,
    ENGINE_BODY_FACTOR,
    MAX_BODY_BYTES,
    MAX_CONNECTIONS,
    MODEL_NAME,
    ChatRequest,
    CompletionRequest,
    ConnectionCap,
    ProfileRequest,
    _add_completion_routes,
    _check_model,
    _completion_response,
    _error,
    _openai_app,
)
from kernelcamp.serve.options import check_api_key, check_device, check_device_name, serve_parser

PROFILE_MAX_STEPS = 200
PROFILE_TABLE_ROWS = 60


# ---- the engine --------------------------------------------------------------------------------------
@dataclass
class _Req:
    prompt: list[int]
    max_tokens: int
    queue: asyncio.Queue  # of the event loop: token ids, then None (done) or an Exception
    pages: list[int] = field(default_factory=list)
    generated: list[int] = field(default_factory=list)  # written by the model thread only
    cancelled: bool = False  # set on the event loop (client gone), read by the model thread


@dataclass
class _Step:
    """A decode step launched on the model thread and not yet collected (see :meth:`Engine._launch`)."""

    batch: list[_Req]  # the running requests, in the order of the model's rows
    prof: Any  # the _Profile that ran it, or None
    prefills: int  # prefills run since the previous decode step
    t0: float  # perf_counter at the launch
    tokens: list[int] | None = None  # set when the step already ran whole (profiled, or no launch/collect)
    ms: float | None = None  # its step_ms, then


def _put_all(items: list[tuple[asyncio.Queue, Any]]) -> None:
    """Event loop: put one step's items (token, None or Exception) into their requests' queues."""
    for q, x in items:
        q.put_nowait(x)


def _settle(fut: asyncio.Future, result: Any, exc: BaseException | None) -> None:
    """Event loop: complete ``fut`` (once) with ``exc`` if given, else ``result``."""
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)


class Engine:
    """Continuous-batching scheduler over a :class:`kernelcamp.serve.model.DecoderModel`.

    Runs on its own thread (:meth:`start`; the model is touched by that thread only). The event loop
    submits (:meth:`submit`), reads (:meth:`tokens`, :meth:`stats`) and runs a function between two
    steps (:meth:`call`); ``_cv`` guards the state both sides touch (waiting, running, steps, counts)."""

    THREAD_NAME = "kernelcamp-model"

    def __init__(self, model: Any, max_running: int, history: int = 20000, overlap: bool = False):
        """``overlap`` (``server.overlap_scheduling``): hand step i's tokens to the event loop after
        launching step i+1 (module docstring); only for a model with ``launch`` and ``collect``."""
        self.model, self.max_running = model, max_running
        self.waiting: collections.deque[_Req] = collections.deque()
        self.running: list[_Req] = []
        self.steps: collections.deque[dict[str, Any]] = collections.deque(maxlen=history)
        self.step_index = 0
        self.counts = {
            "requests_total": 0,
            "requests_finished": 0,
            "requests_cancelled": 0,
            "tokens_generated": 0,
            "decode_steps": 0,
            "prefills": 0,
        }
        self._cv = threading.Condition()
        self._calls: list[tuple[Any, tuple, asyncio.Future]] = []  # (fn, args, future) for the model thread
        self._prefilling: list[_Req] = []  # admitted, being prefilled (model thread)
        self._prefills_since_decode = 0  # prefills run since the last decode step (model thread)
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._events: asyncio.AbstractEventLoop | None = None  # the loop whose queues get the tokens
        self._exc: Exception | None = None
        self.error: str | None = None
        self.profile: _Profile | None = None  # armed by the profile endpoint, run by the model thread
        # overlap: a model with launch/collect has its decode steps overlapped with the token hand-off
        self._split = (
            bool(overlap) and callable(getattr(model, "launch", None)) and callable(getattr(model, "collect", None))
        )
        self._unsent: list[tuple[asyncio.Queue, Any]] = []  # the collected step's queue items, not yet sent
        self.gc = gcwatch.watch()  # collector pauses in this process (step records' gc_ms)
        self._gc_seen_ms = self.gc.total_ms

    @property
    def overlap_active(self) -> bool:
        """True when decode steps are launched before the previous step's tokens are handed over."""
        return self._split

    def start(self) -> None:
        """Start the model thread; tokens go to queues of the running event loop."""
        self._events = asyncio.get_running_loop()
        self._stopping = False
        # step records count the collector's pauses from here: not the heap freeze's own collection at start
        self._gc_seen_ms = self.gc.total_ms
        self._thread = threading.Thread(target=self._thread_main, name=self.THREAD_NAME, daemon=True)
        self._thread.start()

    async def stop(self, timeout_s: float = 60.0) -> None:
        """Stop the model thread after the step in flight and join it (requests left get nothing more)."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                print(
                    f"kernelcamp serve: the model thread did not stop within {timeout_s:g} s (a step hangs?)",
                    file=sys.stderr,
                    flush=True,
                )

    def submit(self, prompt: list[int], max_tokens: int, queue: Any = None) -> _Req:
        """Event loop: queue a request for admission (its tokens arrive in ``r.queue``, see :meth:`tokens`).

        ``queue``: where its items go (anything with ``put_nowait``, called on the event loop; default
        a new ``asyncio.Queue``). Raises ``ValueError`` when prompt + max_tokens exceed the context.
        After an engine error the request fails at once (the error is in its queue)."""
        limit = self.model.cfg.max_context_tokens
        if len(prompt) + max_tokens > limit:
            raise ValueError(
                f"the prompt's {len(prompt)} tokens + max_tokens={max_tokens} exceed this server's context "
                f"of {limit} tokens (server.max_context_tokens): shorten the prompt or ask for fewer tokens"
            )
        r = _Req(prompt, max_tokens, asyncio.Queue() if queue is None else queue)
        with self._cv:
            self.counts["requests_total"] += 1
            if self._exc is not None:
                r.queue.put_nowait(self._exc)
            else:
                self.waiting.append(r)
                self._cv.notify()
        return r

    def call(self, fn: Any, *args: Any) -> asyncio.Future:
        """Event loop: run ``fn(*args)`` on the model thread between two steps; await the result."""
        fut = asyncio.get_running_loop().create_future()
        with self._cv:
            if self._exc is not None or self._stopping or self._thread is None or not self._thread.is_alive():
                why = f"engine error: {self.error}" if self.error else "the server is stopping or not started"
                fut.set_exception(RuntimeError(f"the model thread is not running ({why})"))
            else:
                self._calls.append((fn, args, fut))
                self._cv.notify()
        return fut

    # -- model thread -------------------------------------------------------------------------------
    def _thread_main(self) -> None:
        """Model thread. Each turn: collect decode step i (tokens appended, finishes detected), run the
        queued calls, admit and prefill, launch step i+1 and hand step i's tokens (and finishes) to the
        event loop: with overlap after that launch, so that the loop's SSE work runs while the GPU
        computes step i+1 (with no step to launch, at once); without it right after the collect."""
        step: _Step | None = None
        try:
            dev = getattr(self.model, "device", None)
            if dev is not None and dev.type == "cuda":  # Triton launches on the thread's current device
                import torch

                torch.cuda.set_device(dev)
            while True:
                if step is not None:
                    self._collect(step, self._unsent)
                    step = None
                    if not self._split:  # no overlap: step i's tokens go now, before anything else runs
                        self._flush()
                with self._cv:
                    calls, self._calls = self._calls, []
                    if self._stopping:
                        self._flush()
                        for _, _, fut in calls:
                            self._send(_settle, fut, None, RuntimeError("the server is stopping"))
                        return
                for fn, args, fut in calls:
                    try:
                        res, exc = fn(*args), None
                    except Exception as e:  # noqa: BLE001 - the caller gets it
                        res, exc = None, e
                    self._send(_settle, fut, res, exc)
                prof = self.profile
                if prof is None or prof.done or prof.prof is None:  # no prefills between profiled steps
                    self._admit()
                if self.running:
                    step = self._launch()
                self._flush()
                if step is not None:
                    continue
                with self._cv:
                    if not self._stopping and not self._calls:
                        self._cv.wait(0.005 if self.waiting else None)  # waiting for pages, or for anything
        except Exception as e:  # noqa: BLE001 - a broken engine fails every request, loudly
            self._flush()  # the last collected step's tokens and finishes first, as they came before the error
            self._fail(e)

    def _flush(self) -> None:
        """Model thread: hand the collected step's queue items (tokens, None) to the event loop, if any."""
        if self._unsent:
            out, self._unsent = self._unsent, []
            self._send(_put_all, out)

    def _send(self, fn: Any, *args: Any) -> None:
        """Model thread: run ``fn(*args)`` on the event loop (one callback per step, not per token)."""
        try:
            self._events.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass

    def _admit(self) -> None:
        """Model thread: admit waiting requests while there is room (``max_running``) and pages, and
        prefill them together: one ``model.prefill_many`` call for all admitted at this turn (a model
        without it: one ``prefill`` each). Each admitted request's first token goes to its queue.

        Why together: at high concurrency requests end, and new ones arrive, several per decode step;
        prefilled one by one (an eager forward each, milliseconds) they stalled the decode steps in
        waves whose phase against a measurement window moved the window's throughput (issue 12)."""
        group: list[_Req] = []
        with self._cv:
            if any(r.cancelled for r in self.waiting):
                # cancelled before admission (no pages yet): counted as cancelled too; these were dropped
                # uncounted, so requests_total outran finished + cancelled (CI, 2026-12-07)
                self.counts["requests_cancelled"] += sum(r.cancelled for r in self.waiting)
                self.waiting = collections.deque(r for r in self.waiting if not r.cancelled)
            while self.waiting and len(self.running) + len(group) < self.max_running and not self._stopping:
                r = self.waiting[0]
                pages = self.model.alloc(len(r.prompt) + r.max_tokens)
                if pages is None:
                    break
                r.pages = pages
                group.append(self.waiting.popleft())
            self._prefilling = list(group)
        if group:
            t0 = time.perf_counter()
            many = getattr(self.model, "prefill_many", None)
            if callable(many):
                toks = many([r.prompt for r in group], [r.pages for r in group])
            else:
                toks = [self.model.prefill(r.prompt, r.pages) for r in group]
            ms = (time.perf_counter() - t0) * 1e3
            out: list[tuple[asyncio.Queue, Any]] = []
            with self._cv:
                self._prefilling = []
                self._record(
                    "prefill", sum(len(r.prompt) for r in group), ms, float("nan"), extra={"requests": len(group)}
                )
                self.counts["prefills"] += len(group)
                self._prefills_since_decode += len(group)
                for r, tok in zip(group, toks, strict=True):
                    self._emit(r, tok, out)
                    if len(r.generated) >= r.max_tokens or r.cancelled:
                        self._finish(r)
                    else:
                        self.running.append(r)
            self._send(_put_all, out)
        with self._cv:
            for r in [r for r in self.running if r.cancelled]:
                self._finish(r)

    def _launch(self) -> _Step:
        """Model thread: launch one decode step for every running request (see :class:`_Step`).

        A profiled step (:class:`_Profile`) and a model without ``launch``/``collect`` run the whole
        step here (``model.decode``), so :meth:`_collect` only records it."""
        batch = list(self.running)
        toks = [r.generated[-1] for r in batch]
        pos = [len(r.prompt) + len(r.generated) - 1 for r in batch]
        pages = [r.pages for r in batch]
        prof = self.profile if self.profile is not None and not self.profile.done else None
        st = _Step(batch, prof, self._prefills_since_decode, time.perf_counter())
        self._prefills_since_decode = 0
        if prof is not None:
            st.tokens = prof.decode_step(self.model, toks, pos, pages)
        elif self._split:
            self.model.launch(toks, pos, pages)
        else:
            st.tokens = self.model.decode(toks, pos, pages)
        if st.tokens is not None:
            st.ms = (time.perf_counter() - st.t0) * 1e3
        return st

    def _collect(self, st: _Step, out: list[tuple[asyncio.Queue, Any]]) -> None:
        """Model thread: read the step's tokens, record it, append them to its requests (finishing the
        requests that reached max_tokens) and their queue items to ``out`` (sent by :meth:`_flush`)."""
        nxt = st.tokens if st.tokens is not None else self.model.collect()
        ms = st.ms if st.ms is not None else (time.perf_counter() - st.t0) * 1e3
        m = self.model
        timing = {**m.last_timing, "prefills": st.prefills}
        with self._cv:
            self._record("decode", len(st.batch), ms, m.attn_ms_last, m.last_bucket, st.prof is not None, timing)
            self.counts["decode_steps"] += 1
            for r, t in zip(st.batch, nxt, strict=True):
                self._emit(r, t, out)
                if len(r.generated) >= r.max_tokens:
                    self._finish(r)
        if st.prof is not None and st.prof.done:
            st.prof.resolve()

    def _fail(self, e: Exception) -> None:
        """Model thread, on an exception from a step: every request in the engine (and every later one) gets it."""
        with self._cv:
            self.error = f"{type(e).__name__}: {e}"
            self._exc = e
            reqs = list(self.running) + list(self.waiting) + list(self._prefilling)
            self.waiting.clear()
            calls, self._calls = self._calls, []
        self._send(_put_all, [(r.queue, e) for r in reqs])
        for _, _, fut in calls:
            self._send(_settle, fut, None, RuntimeError(f"engine error: {self.error}"))
        prof = self.profile
        if prof is not None and not prof.done:
            prof._stop_quietly()
            prof.error, prof.done = prof.error or f"engine error: {self.error}", True
        if prof is not None:
            prof.resolve()
        print(f"kernelcamp serve: engine error, every request fails: {self.error}", file=sys.stderr, flush=True)
        traceback.print_exception(e, file=sys.stderr)

    # -- model thread, with _cv held ----------------------------------------------------------------
    def _record(
        self,
        kind: str,
        batch: int,
        ms: float,
        attn_ms: float,
        bucket: int | None = None,
        profiled: bool = False,
        extra: dict[str, Any] | None = None,
    ) -> None:
        """Append one step record (see :meth:`stats`): times in ms (NaN or None: not measured); ``extra``'s
        keys are added to it, float values rounded like step_ms."""
        self.step_index += 1
        rec = {
            "index": self.step_index,
            "kind": kind,
            "batch": batch,
            "bucket": bucket,
            "step_ms": round(ms, 4),
            "attn_ms": None if attn_ms != attn_ms else round(attn_ms, 4),
            "t": round(time.time(), 4),
        }
        for k, v in (extra or {}).items():
            rec[k] = round(v, 4) if isinstance(v, float) else v
        gc_ms, self._gc_seen_ms = self.gc.total_ms - self._gc_seen_ms, self.gc.total_ms
        rec["gc_ms"] = round(gc_ms, 4)
        if profiled:  # ran under the profiler (slower than a plain step)
            rec["profiled"] = True
        self.steps.append(rec)

    def _emit(self, r: _Req, tok: int, out: list[tuple[asyncio.Queue, Any]]) -> None:
        r.generated.append(tok)
        self.counts["tokens_generated"] += 1
        out.append((r.queue, tok))
        if len(r.generated) >= r.max_tokens:
            out.append((r.queue, None))

    def _finish(self, r: _Req) -> None:
        if r in self.running:
            self.running.remove(r)
        self.model.free(r.pages)
        r.pages = []
        if r.cancelled:
            self.counts["requests_cancelled"] += 1
        else:
            self.counts["requests_finished"] += 1

    # -- event loop ---------------------------------------------------------------------------------
    async def tokens(self, r: _Req) -> AsyncIterator[int]:
        """Event loop: the request's tokens, one by one (see :meth:`token_batches`)."""
        async with contextlib.aclosing(self.token_batches(r)) as batches:
            async for batch in batches:
                for t in batch:
                    yield t

    async def token_batches(self, r: _Req) -> AsyncIterator[list[int]]:
        """Event loop: the request's tokens, each time all of those that have arrived (at least one;
        :func:`kernelcamp.serve.front.queue_batches`). Raises the engine's exception after the tokens
        that came before it. A request left early (client gone, an exception in the consumer) is
        marked cancelled; the model thread frees its pages."""
        try:
            async with contextlib.aclosing(queue_batches(r.queue)) as batches:
                async for batch in batches:
                    yield batch
        finally:
            self.cancel(r)

    def cancel(self, r: _Req) -> None:
        """Event loop: the client is gone; a request not yet done is dropped (the model thread frees
        its pages at its next step). A finished request is left as it is."""
        if len(r.generated) < r.max_tokens:
            r.cancelled = True
            with self._cv:
                self._cv.notify()

    def stats(self, steps: int = 256, since: int | None = None) -> dict[str, Any]:
        """Counts and step records for the info endpoint: the last ``steps`` records, or with ``since``
        every kept record whose index is above it (the newest ``history`` are kept).

        A record: ``index``, ``kind`` ("prefill" or "decode"), ``batch`` (requests; a prefill's prompt
        tokens), ``step_ms`` (host wall time of the model step on the model thread, ms: a prefill's call;
        a decode step from its launch to its collect's return, with ``server.overlap_scheduling`` the
        hand-off of the previous step's tokens to the event loop in between included, see
        ``handoff_ms``), ``attn_ms``
        (eager CPU steps only, else None), ``t`` (unix time at its end), ``profiled`` when under the
        profiler. A decode record also has ``bucket`` (padded graph batch; = batch when eager), the
        split of its step (:meth:`kernelcamp.serve.model.DecoderModel.collect`): ``gpu_ms`` (GPU time of
        the replay or eager forward, CUDA events; None on a CPU), host ``load_ms``, ``launch_ms`` (None
        on a CPU), ``sync_ms`` and ``handoff_ms`` (the part of sync_ms between launch and collect: with
        overlap, handing the previous step's tokens to the event loop while the GPU ran; without it, or
        for a profiled step, only the calls' own return and start), and ``prefills``
        (prefills the scheduler ran since the previous decode step: their time is in their own records,
        not in this step_ms, but in the gap before
        it). Prefill records have ``bucket`` None and ``requests``, the prompts prefilled together in that
        one forward (``batch`` is then their prompt tokens together). Every record has ``gc_ms``: the
        pauses of Python's garbage collector in this process since the previous record (in this step
        or in the gap before it; :mod:`kernelcamp.serve.gcwatch`), ms. The result's ``gc`` is
        :meth:`kernelcamp.serve.gcwatch.GcWatch.snapshot` of this process."""
        with self._cv:
            all_steps = list(self.steps)
            counts = {
                **self.counts,
                "running": len(self.running),
                "waiting": len(self.waiting),
                "free_pages": len(self.model.free_pages),
                "step_index": self.step_index,
            }
        recent = [s for s in all_steps if since is None or s["index"] > since]
        if since is None:
            recent = recent[-steps:] if steps > 0 else []
        dec = [s for s in all_steps[-2000:] if s["kind"] == "decode"]
        live = [s for s in dec if s["attn_ms"] is not None]
        share = (sum(s["attn_ms"] for s in live) / sum(s["step_ms"] for s in live)) if live else None
        return {
            "counts": counts,
            "recent_decode_step_ms_mean": (sum(s["step_ms"] for s in dec) / len(dec)) if dec else None,
            "attention_share_live": share,
            "steps": recent,
            "engine_error": self.error,
            "gc": self.gc.snapshot(),
        }


# ---- decode-step profiling ---------------------------------------------------------------------------
class _Profile:
    """A torch.profiler (Kineto) session around the next ``steps`` decode steps the scheduler runs.

    Armed on the event loop (the profile endpoint), run on the engine's model thread: the profiler
    starts before the first wrapped step and stops after the last, so only decode steps (and the
    scheduler's host work between them) are in it. CPU + CUDA activities on a GPU, CPU only
    otherwise. ``eager``: the wrapped steps run without CUDA-graph replay (the graphs stay captured
    and serve every other step). With replay, CUPTI reports each kernel of a graph launch as its own
    kernel record (correlated with the ``cudaGraphLaunch``), so the table lists the graph's kernels;
    if a CUDA/driver/torch combination ever reports none, the table says so (``kernel_rows: 0``)
    and ``eager`` gives a table that is always per kernel.
    """

    def __init__(
        self, steps: int, eager: bool, trace_path: Path | None, future: asyncio.Future, trace_id: str | None = None
    ):
        self.steps, self.eager, self.trace_path, self.future = steps, eager, trace_path, future
        self.trace_id = trace_id
        self.loop = future.get_loop()
        self.prof: Any = None
        self.batch_sizes: list[int] = []
        self.step_ms: list[float] = []
        self.mode: str | None = None
        self.done = False
        self.cancelled = False
        self.result: dict[str, Any] | None = None
        self.error: str | None = None

    # -- model thread -----------------------------------------------------------------------------
    def _start(self, model: Any) -> None:
        import torch
        from torch.profiler import ProfilerActivity

        acts = [ProfilerActivity.CPU]
        if getattr(model, "on_gpu", False):
            acts.append(ProfilerActivity.CUDA)
            torch.cuda.synchronize()
            # From here on this process's steps are slower (CUPTI stays attached after the profile):
            # the info endpoint says so, and a benchmark refuses to measure the server (CUDA_PROFILED_WHY).
            model.cuda_profiled = True
        self.prof = torch.profiler.profile(activities=acts, record_shapes=False)
        self.prof.start()

    def decode_step(self, model: Any, toks: list[int], pos: list[int], pages: list[list[int]]) -> list[int]:
        """One decode step under the profiler (runs on the model thread instead of ``model.decode``)."""
        if self.done:
            return model.decode(toks, pos, pages)
        import torch

        try:
            if self.prof is None:
                self._start(model)
            graphs = bool(getattr(model, "cuda_graphs", False))
            if self.mode is None:
                why = getattr(model, "graphs_disabled_reason", None)
                if graphs:
                    self.mode = "eager (cuda graphs off for the profiled steps)" if self.eager else "cuda_graph_replay"
                else:
                    self.mode = f"eager (no cuda graphs: {why})" if why else "eager"
            off = graphs and self.eager
            t0 = time.perf_counter()
            try:
                if off:
                    model.cuda_graphs = False
                with torch.profiler.record_function(f"{ANNOTATION_PREFIX}decode_step batch={len(toks)}"):
                    out = model.decode(toks, pos, pages)
                if getattr(model, "on_gpu", False):
                    torch.cuda.synchronize()
            finally:
                if off:
                    model.cuda_graphs = True
            self.step_ms.append((time.perf_counter() - t0) * 1e3)
            self.batch_sizes.append(len(toks))
            if len(self.batch_sizes) >= self.steps:
                self._finish(model)
            return out
        except Exception as e:  # noqa: BLE001 - the profile fails, serving goes on
            self.error = f"{type(e).__name__}: {e}"[:500]
            self._stop_quietly()
            self.done = True
            if not self.batch_sizes:  # the step itself has not run yet
                return model.decode(toks, pos, pages)
            raise

    def _stop_quietly(self) -> None:
        if self.prof is not None:
            try:
                self.prof.stop()
            except Exception:  # noqa: BLE001
                pass

    def stop_at_timeout(self, model: Any) -> bool:
        """Timeout (model thread, between two steps): end the profile; False when no step ran under it.

        With some steps done, stop and tabulate what ran. Deciding here, not on the event loop, means
        no step can start the profiler after the endpoint has given up on it."""
        ran = self.prof is not None
        if not self.done:
            try:
                if not self.batch_sizes:
                    raise RuntimeError("the profiler started but no step finished under it")
                self._finish(model)
            except Exception as e:  # noqa: BLE001
                self.error = self.error or f"{type(e).__name__}: {e}"[:500]
                self._stop_quietly()
        self.done = True
        return ran

    def _finish(self, model: Any) -> None:
        if getattr(model, "on_gpu", False):
            import torch

            torch.cuda.synchronize()
        self.prof.stop()
        on_gpu = bool(getattr(model, "on_gpu", False))
        rows = kernel_rows(self.prof, on_gpu, sum(self.step_ms) * 1e3)
        written = None
        if self.trace_path:
            written = Path(export_trace_gz(self.prof, str(self.trace_path)))
        self.result = {
            "steps": len(self.batch_sizes),
            "steps_requested": self.steps,
            "partial": len(self.batch_sizes) < self.steps,
            "batch_sizes": list(self.batch_sizes),
            "step_ms": [round(x, 4) for x in self.step_ms],
            "step_ms_total": round(sum(self.step_ms), 4),
            "mode": self.mode,
            "eager_requested": self.eager,
            "device": str(getattr(model, "device", "cpu")),
            "time_kind": "device_kernel_time" if on_gpu else "cpu_op_self_time",
            "rows_are": (
                "GPU activities (kernels, memcpy, memset) from CUPTI via Kineto; device time"
                if on_gpu
                else "CPU ops (no GPU here): Kineto CPU op self time, in the device_time columns"
            ),
            "share_pct_of": "the profiled steps' wall time (host timer around each step, synchronized)",
            "kernel_rows": len(rows),
            "kernels": rows[:PROFILE_TABLE_ROWS],
            "trace_id": self.trace_id if written else None,
            "trace_url": TRACE_PATH.format(trace_id=self.trace_id) if written else None,
            "trace_bytes": written.stat().st_size if written else None,
        }
        self.done = True

    # -- either thread -----------------------------------------------------------------------------
    def resolve(self) -> None:
        """Complete the endpoint's future with the result or the error (on its event loop, from any thread)."""
        exc = None if self.result is not None else RuntimeError(self.error or "profile ended without a result")
        try:
            self.loop.call_soon_threadsafe(_settle, self.future, self.result, exc)
        except RuntimeError:  # the event loop is closed: nobody waits any more
            pass


#: Prefix of the profiler ranges the server records around each profiled step.
ANNOTATION_PREFIX = "kernelcamp."


def kernel_rows(prof: Any, on_gpu: bool, step_us_total: float) -> list[dict[str, Any]]:
    """Per-kernel rows from a finished profiler, largest time first.

    GPU: the device activities (``device_type`` not CPU: kernels, memcpy, memset), each with its
    device time. CPU: the CPU ops with their self CPU time (self, so nested ops are not counted
    twice). ``share_pct``: of ``step_us_total`` (the profiled steps' wall time). Our own
    ``record_function`` ranges (``kernelcamp.*``) are annotations spanning the whole step, not
    kernels: Kineto reports them as GPU user annotations with a device time, so they are left out."""
    from torch.autograd import DeviceType

    rows = []
    for e in prof.key_averages():
        if str(e.key).startswith(ANNOTATION_PREFIX):
            continue
        if on_gpu:
            if getattr(e, "device_type", DeviceType.CPU) == DeviceType.CPU:
                continue
            t = float(getattr(e, "self_device_time_total", 0.0) or getattr(e, "device_time_total", 0.0) or 0.0)
        else:
            t = float(e.self_cpu_time_total or 0.0)
        if t <= 0:
            continue
        rows.append(
            {
                "name": e.key,
                "calls": int(e.count),
                "device_time_us_total": round(t, 3),
                "device_time_us_mean": round(t / max(int(e.count), 1), 3),
                "share_pct": round(100.0 * t / step_us_total, 3) if step_us_total > 0 else None,
            }
        )
    return sorted(rows, key=lambda r: -r["device_time_us_total"])


def export_trace_gz(prof: Any, path: str) -> str:
    """The profiler's chrome trace, gzipped, written atomically to ``path``; returns ``path``."""
    import gzip
    import shutil
    import tempfile

    from kernelcamp.io import atomic_path

    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(raw)
        with atomic_path(path) as out, open(raw, "rb") as src, gzip.open(out, "wb") as dst:
            shutil.copyfileobj(src, dst)
    return str(path)


class TraceStore:
    """The server's own folder of profile traces: ``<id>.json.gz``, the newest ``keep`` kept.

    ``folder`` None: a private temporary folder (0700) that the server removes when it stops. A
    request never names a path: it gets an id and downloads the bytes from :data:`TRACE_PATH`."""

    ID = re.compile(r"[0-9a-f]{32}")  # fullmatch: "$" would let a trailing newline through

    def __init__(self, folder: str | Path | None = None, keep: int = 8):
        self.owned = folder is None
        self.dir = Path(tempfile.mkdtemp(prefix="kernelcamp-traces-")) if folder is None else Path(folder)
        self.keep = keep

    def new(self) -> tuple[str, Path]:
        """A fresh (id, path) for the next trace; older traces beyond ``keep`` are removed."""
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        # only our own traces (<32 hex id>.json.gz): a --trace-dir shared with other files keeps them
        ours = [p for p in self.dir.glob("*.json.gz") if self.ID.fullmatch(p.name[: -len(".json.gz")])]
        old = sorted(ours, key=lambda p: p.stat().st_mtime)
        for p in old[: max(0, len(old) - self.keep + 1)]:
            p.unlink(missing_ok=True)
        tid = uuid.uuid4().hex
        return tid, self.dir / f"{tid}.json.gz"

    def path(self, trace_id: str) -> Path | None:
        """The file of trace ``trace_id``, or None (unknown id, or not an id at all)."""
        if not self.ID.fullmatch(trace_id):
            return None
        p = self.dir / f"{trace_id}.json.gz"
        return p if p.is_file() else None

    def close(self) -> None:
        """Remove the folder if the server created it."""
        if self.owned:
            shutil.rmtree(self.dir, ignore_errors=True)


# ---- the real app ------------------------------------------------------------------------------------
@dataclass
class ServeState:
    """Everything the info endpoint reports about what runs."""

    engine: Engine
    variant: Any
    variant_hash: str
    kernel_hash: str
    flags: dict[str, Any]
    device: str
    never_ready: bool = False
    gc_frozen: dict[str, Any] | None = None  # kernelcamp.serve.gcwatch.freeze_heap() at start; None: not frozen
    started_at: float = field(default_factory=time.time)
    http_stack: dict[str, str] = field(default_factory=http_stack)


def make_app(
    state: ServeState,
    api_key: str | None = None,
    trace_dir: str | Path | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    body_timeout_s: float = BODY_TIMEOUT_S,
) -> FastAPI:
    """The real server's FastAPI app around a constructed, warmed-up model (see :func:`build_state`).

    ``api_key``: require ``Authorization: Bearer <key>`` on everything but ``/health``. ``trace_dir``:
    where profile traces are kept (None: a private temporary folder removed at shutdown).
    ``max_body_bytes``: larger request bodies get 413 (:data:`kernelcamp.serve.openai.MAX_BODY_BYTES`);
    ``body_timeout_s``: a body not read whole that many seconds after its headers gets 408
    (``server.body_timeout_s``, :data:`kernelcamp.serve.openai.BODY_TIMEOUT_S`)."""
    traces = TraceStore(trace_dir)

    async def lifespan(app: FastAPI):
        state.engine.start()
        try:
            yield
        finally:
            await state.engine.stop()
            traces.close()

    app = _openai_app("kernelcamp decode server", api_key, lifespan, max_body_bytes, body_timeout_s)
    eng = state.engine
    vocab = eng.model.cfg.vocab_size

    @app.get("/health")
    async def health():
        if state.never_ready:
            return JSONResponse({"status": "starting"}, status_code=503)
        if eng.error:
            return JSONResponse({"status": "error", "error": eng.error}, status_code=500)
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": MODEL_NAME, "object": "model", "owned_by": "kernelcamp"}]}

    @app.get(INFO_PATH)
    async def info(steps: int = 256, since: int | None = None):
        from kernelcamp.serve.model import _jsonable

        m = eng.model
        return {
            "variant_name": state.variant.name,
            "variant_hash": state.variant_hash,
            "kernel_source_hash": state.kernel_hash,
            "variant": state.variant.as_dict(),
            "config_running": _jsonable(getattr(m.launcher, "last_config", None)),
            "server_flags": state.flags,
            "overlap_scheduling_active": eng.overlap_active,
            "http_stack": state.http_stack,
            "pid": os.getpid(),
            "started_at": state.started_at,
            "device": state.device,
            "cuda_profiled": bool(getattr(m, "cuda_profiled", False)),
            "gc_frozen_at_start": state.gc_frozen,
            **m.describe(),
            "attention_share": {
                "calibration": {str(k): v for k, v in m.calibration.items()},
                "method": "eager steps, attention timed against the whole step",
            },
            **eng.stats(steps, since),
        }

    @app.post(PROFILE_PATH)
    async def profile(req: ProfileRequest):
        """Profile the next N decode steps (torch.profiler / Kineto); see :class:`_Profile`.

        Body ``{"steps": 5, "eager": false, "trace": true, "timeout_s": 60}``. With ``trace`` the
        gzipped chrome trace is kept by the server (:class:`TraceStore`) and the answer names it
        (``trace_id``, ``trace_url``: ``GET`` it for the bytes). 409 while another profile runs; 504
        when no decode step ran within ``timeout_s`` (no load); a timeout after some steps returns
        what ran with ``partial: true``."""
        steps, eager, timeout = req.steps, req.eager, float(req.timeout_s)
        if eng.error:
            return _error(f"engine error: {eng.error}", 500)
        if eng.profile is not None and not eng.profile.done:
            return _error("a profile is already in progress on this server: wait for it and retry", 409)
        tid, tpath = traces.new() if req.trace else (None, None)
        fut = asyncio.get_running_loop().create_future()
        prof = _Profile(steps, eager, tpath, fut, tid)
        eng.profile = prof  # only the event loop sets or clears it; the model thread reads it
        try:
            return await _await_profile(prof, timeout)
        finally:
            if eng.profile is prof and prof.done:  # a caller gone mid-profile: the model thread still ends it
                eng.profile = None

    async def _await_profile(prof: _Profile, timeout: float):
        fut = prof.future
        try:
            res = await asyncio.wait_for(asyncio.shield(fut), timeout)
        except asyncio.TimeoutError:
            try:
                ran = await eng.call(prof.stop_at_timeout, eng.model)  # model thread: after any step in flight
            except Exception as e:  # noqa: BLE001
                return _error(f"profile failed: {e}", 500)
            if not ran:
                return _error(
                    f"no decode step ran within {timeout:g} s: the profile wraps the next {prof.steps} decode "
                    "steps the scheduler runs, so put load on the server (requests in flight) while it waits",
                    504,
                )
            prof.resolve()
            try:
                res = await fut
            except Exception as e:  # noqa: BLE001
                return _error(f"profile failed: {e}", 500)
        except Exception as e:  # noqa: BLE001
            return _error(f"profile failed: {e}", 500)
        return res

    @app.get(TRACE_PATH)
    async def trace(trace_id: str):
        """The gzipped chrome trace of a profile (``trace_id`` from the profile's answer)."""
        path = traces.path(trace_id)
        if path is None:
            return _error("no such trace on this server (only the newest few are kept)", 404, "trace_id")
        return FileResponse(path, media_type="application/gzip", filename=f"trace-{trace_id}.json.gz")

    async def _complete(req: CompletionRequest | ChatRequest, chat: bool, request: Request):
        from kernelcamp.serve.tokens import encode

        bad = _check_model(req)
        if bad is not None:
            return bad
        ids = encode(req.text(), vocab)
        try:
            r = eng.submit(ids, req.tokens_wanted())
        except ValueError as e:
            return _error(str(e), 400, "messages" if chat else "prompt", "context_length_exceeded")
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        return await _completion_response(rid, chat, req, len(r.prompt), eng.token_batches(r), request=request)

    _add_completion_routes(app, _complete)
    return app


def build_state(params: dict[str, Any], device: str, never_ready: bool = False) -> ServeState:
    """Parse the variant, build and warm up the model (graphs captured, attention share calibrated)."""
    import torch

    from kernelcamp.serve.model import DecoderModel, ModelConfig
    from kernelcamp.variant import parse_variant

    variant = parse_variant(params.get("variant") or {})
    server = params.get("server") or {}
    flags = server_flags(server)
    if device.startswith("cuda"):
        check_device(device)
        torch.cuda.set_device(torch.device(device))
    cfg = ModelConfig.from_params(params, device)
    model = DecoderModel(
        cfg,
        variant,
        params.get("kernel"),
        device,
        cuda_graphs=flags["cuda_graphs"],
        graph_batch_buckets=flags["graph_batch_buckets"],
    )
    model.warmup()
    sizes = [1, min(8, cfg.max_running_requests)] if not model.on_gpu else None
    model.calibrate(sizes)
    khash = kernel_source_hash(params.get("kernel"))
    return ServeState(
        Engine(model, cfg.max_running_requests, overlap=flags["overlap_scheduling"]),
        variant,
        variant_hash(variant, khash, flags),
        khash,
        flags,
        str(model.device),
        never_ready=never_ready,
    )


def freeze_served_heap(state: ServeState) -> ServeState:
    """``server.gc_freeze``: freeze the serving process's heap once its state is built (imports, model,
    captured graphs), so that no collection during serving walks it again (:mod:`kernelcamp.serve.gcwatch`);
    recorded in ``state.gc_frozen`` (info's ``gc_frozen_at_start``). For the process that serves
    (``kernelcamp serve``), not for a state built inside a longer-lived one (a test): a frozen object
    that later becomes cyclic garbage is never reclaimed. Returns ``state``."""
    if state.flags.get("gc_freeze"):
        state.gc_frozen = gcwatch.freeze_heap()
    return state


# ---- command line ------------------------------------------------------------------------------------


def _load_serve_params(path: str) -> dict[str, Any]:
    """``--params``: a readable YAML mapping, or a ``KernelcampError`` naming the option."""
    import yaml

    from kernelcamp.io import load_params

    p = Path(path)
    if p.is_dir():
        raise KernelcampError(f"--params {path}: is a folder, not a params.yaml file")
    try:
        return load_params(p)
    except KernelcampError as e:
        raise KernelcampError(f"--params {path}: {e}") from None
    except UnicodeDecodeError:
        raise KernelcampError(f"--params {path}: not a text file (not UTF-8): pass a params.yaml") from None
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        what = str(getattr(e, "problem", None) or type(e).__name__)
        raise KernelcampError(f"--params {path}: not valid YAML{at} ({what})") from None
    except OSError as e:
        raise KernelcampError(f"--params {path}: cannot read it ({e.strerror or e})") from None


def build_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``serve`` to ``sub`` (the subparsers of :func:`kernelcamp.cli.build_parser`): the options of
    :func:`kernelcamp.serve.options.serve_parser`, which the spec stage checks ``server.args`` against too."""
    ap = serve_parser(lambda **kw: sub.add_parser("serve", **kw))
    ap.set_defaults(main=main)
    return ap


def main(args: argparse.Namespace) -> int:
    """``kernelcamp serve``: run until SIGTERM/SIGINT. Binds 127.0.0.1 unless --host says otherwise.

    Every bad option (port outside 1..65535, an unknown --device, unreadable or broken --params, a bad
    --fake spec, a busy port) is one ``error: ...`` line on stderr and exit status 2, before any model
    is built. A host that is not loopback is bound as given, with a warning on stderr; the printed
    URL is one a client on this machine can use (``0.0.0.0`` -> ``127.0.0.1``)."""
    import uvicorn

    try:
        if args.port is not None and not 1 <= args.port <= 65535:
            raise KernelcampError(f"--port {args.port}: expected a port number 1..65535")
        check_device_name(args.device, "--device")
        if args.trace_dir is not None and Path(args.trace_dir).exists() and not Path(args.trace_dir).is_dir():
            raise KernelcampError(f"--trace-dir {args.trace_dir}: exists and is not a folder")
        engine_uds = getattr(args, "engine_uds", None)
        key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV)
        if engine_uds is not None:
            key = None  # the engine process answers only its front, over a socket in a private folder
        check_api_key(key, "--api-key" if args.api_key is not None else API_KEY_ENV)
        server: dict[str, Any] = {}
        link: EngineLink | None = None
        spec = FakeSpec.parse(args.fake) if args.fake is not None else None
        params: dict[str, Any] = {}
        if spec is None:
            params = _load_serve_params(args.params)
            server = params.get("server") or {}
            from kernelcamp.spec import ServerSpec, parse_section

            try:  # as strictly as the spec stage: "false" (a string) must not read as true
                parse_section(ServerSpec, server, "server")
            except KernelcampError as e:
                raise KernelcampError(f"{e} (in {args.params})") from None
        host = str(args.host or server.get("host") or "127.0.0.1")
        port = args.port if args.port is not None else server.get("port", 8765)
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise KernelcampError(f"server.port={port!r} in {args.params}: expected a port number 1..65535")
        if args.device is None:
            try:
                check_device_name(server.get("device"))
            except KernelcampError as e:
                raise KernelcampError(f"{e} (in {args.params})") from None
        # checked by parse_section above; the fake (no params) runs with the defaults
        body_timeout_s = float(server.get("body_timeout_s", BODY_TIMEOUT_S))
        max_connections = int(server.get("max_connections", MAX_CONNECTIONS))
        busy = None if engine_uds else _bind_error(host, port)  # before the model is built and any URL printed
        if busy:
            raise KernelcampError(f"cannot listen on {host}:{port}: {busy[0]}; {busy[1]}")
        if spec is not None:
            if args.never_ready:
                spec.never_ready = True
            app = make_fake_app(spec, api_key=key)
        else:
            device = args.device
            if device is None:
                import torch

                device = "cuda:0" if torch.cuda.is_available() else "cpu"
            check_device(device)  # here, not in the engine process: it would start, fail and say so in three lines
            if engine_uds is not None:
                state = freeze_served_heap(build_state(params, device, never_ready=args.never_ready))
                # the front's request holds the prompt it accepted and more (openai.ENGINE_BODY_FACTOR)
                app = make_app(state, None, args.trace_dir, ENGINE_BODY_FACTOR * MAX_BODY_BYTES)
                add_engine_routes(app, state.engine, state.engine.model.cfg.vocab_size)
                watch_parent(Path(engine_uds).parent)
            elif server_flags(server)["engine_process"]:
                argv = [sys.executable, "-m", "kernelcamp.cli", "serve", "--params", str(Path(args.params).resolve())]
                argv += ["--device", device, "--log-level", args.log_level]
                if args.trace_dir is not None:
                    argv += ["--trace-dir", str(Path(args.trace_dir).resolve())]
                if args.never_ready:
                    argv.append("--never-ready")
                link = EngineLink(argv)
                app = make_front_app(
                    link, key, gc_freeze=server_flags(server)["gc_freeze"], body_timeout_s=body_timeout_s
                )
            else:
                state = freeze_served_heap(build_state(params, device, never_ready=args.never_ready))
                app = make_app(state, key, args.trace_dir, body_timeout_s=body_timeout_s)
    except KernelcampError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    except (MemoryError, RuntimeError) as e:  # a cache too large for the machine: one line, not a traceback
        oom = out_of_memory(e)
        if oom is None:
            raise
        print(f"error: {oom}", file=sys.stderr, flush=True)
        return 2
    if engine_uds is not None:
        return _run_engine_process(app, engine_uds, args.log_level)
    warn = exposure_warning(host, port)
    if warn:
        print(warn, file=sys.stderr, flush=True)
    stack = http_stack()  # what the real server's info reports as http_stack
    # past this many open connections a request is answered 503 at once: uvicorn never times out a client
    # that has not finished its headers (openai.MAX_CONNECTIONS); uvicorn's own limit_concurrency would
    # answer plain text, the cap an OpenAI error
    capped = ConnectionCap(app, max_connections)
    config = uvicorn.Config(
        capped,
        host=host,
        port=port,
        log_level=args.log_level,
        access_log=False,
        timeout_graceful_shutdown=5,
        http=stack["http"],
        loop=stack["loop"],
    )
    srv = uvicorn.Server(config)
    capped.watch(srv.server_state)
    if link is not None:
        link.on_failure = lambda: setattr(srv, "should_exit", True)
        link.stopping = lambda: bool(srv.should_exit)
    print(f"kernelcamp serve: {client_url(host, port)} (bound to {host}) pid {os.getpid()}", flush=True)
    try:
        srv.run()
    except KeyboardInterrupt:
        pass
    if not srv.started:
        print(f"error: the server did not start on {host}:{port} (see the lines above)", file=sys.stderr, flush=True)
        return 1
    if link is not None and link.failed:
        print(f"error: {link.error} (its own lines above say why)", file=sys.stderr, flush=True)
        return 1
    return 0


def _run_engine_process(app: FastAPI, uds: str, log_level: str) -> int:
    """The engine process's uvicorn, on the Unix socket its front gave (kernelcamp.serve.front)."""
    import uvicorn

    stack = http_stack()
    config = uvicorn.Config(
        app,
        uds=uds,
        log_level=log_level,
        access_log=False,
        timeout_keep_alive=ENGINE_KEEPALIVE_S,
        timeout_graceful_shutdown=5,
        http=stack["http"],
        loop=stack["loop"],
    )
    srv = uvicorn.Server(config)
    print(f"kernelcamp serve: engine process pid {os.getpid()} on {uds}", flush=True)
    try:
        srv.run()
    except KeyboardInterrupt:
        pass
    return 0 if srv.started else 1


def _bind_error(host: str, port: int) -> tuple[str, str] | None:
    """Why ``host:port`` cannot be listened on now, or None: ``(reason, what to do)``. A host that does not resolve,
    or is no address of this machine, is the host's fault (the message blamed the port: "pass --port"); a port in
    use ("[Errno 98] Address already in use") or refused is the port's. The test is
    :func:`kernelcamp.ports.bind_problem`, which the deploy's checks of ``server.host`` use too."""
    problem = bind_problem(host, port)
    if problem is None:
        return None
    reason, host_at_fault = problem
    if host_at_fault:
        return reason, f"pass --host with {HOST_FIX}, not {host!r}"
    return reason, "pass --port, or stop the server holding it (`python -m stages.deploy --stop` for this workspace's)"


if __name__ == "__main__":  # `python -m kernelcamp.serve.server ...` is `kernelcamp serve ...`
    from kernelcamp.cli import main as _cli_main

    sys.exit(_cli_main(["serve", *sys.argv[1:]]))

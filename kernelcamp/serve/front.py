"""The embedded server as two processes (``server.engine_process: true``, the default): an HTTP front
process and an engine process.

Why (issue 12): in one process the model thread shares the GIL with the HTTP event loop, and every
streamed token costs that loop tens of microseconds (SSE frame, uvicorn send, task wake-ups). On the
H200 (V4-Flash, concurrency 64) the decode step's host part waited 0.8-3 ms for the GIL, more than the
GPU's 1.27 ms, and that wait moved by 10-25% from run to run: the serving A/B measured the HTTP loop's
noise. vLLM runs its API server and its EngineCore in separate processes for the same reason (the
``AsyncLLM`` / ``EngineCoreClient`` split of ``vllm/v1/engine``).

- The **engine process** is ``kernelcamp serve`` itself with ``--engine-uds PATH``: the model, the
  scheduler (:class:`kernelcamp.serve.server.Engine`) and the full app (info, profile, traces,
  health) on a Unix socket in a private folder (mode 0700; no API key there: only this user's
  processes can reach it), plus three internal routes (:func:`add_engine_routes`), which also want a
  secret the front passes in the engine's environment (``KERNELCAMP_ENGINE_TOKEN``): submit, cancel,
  and one long-lived stream of every request's tokens, one JSON line per event-loop turn (about one per decode step),
  so its event loop's work per step is one callback, one ``json.dumps`` and one write, whatever the
  number of requests.
- The **front process** (:func:`make_front_app`) listens on the public port. It spawns the engine
  process, streams the completions (SSE frames, one write per request per turn) from that one line
  per step, and forwards the other routes (health, models, info, profile, traces: an allow-list of
  exact paths, so no path that normalizes to an internal route gets through) to the engine process.
  Info says ``engine_process: true``; its ``pid`` is the front's (the process deploy started and
  stops), ``engine_pid`` the engine's, ``http_stack`` the front's.

Lifetimes: the front stops the engine process at shutdown (SIGTERM, then SIGKILL after 30 s); the
engine process exits when its parent is gone (it checks every second), and both are in one process
group, which deploy stops as a whole. Before the engine process answers its health, the front's
``/health`` is 503 ``starting``. If the engine process exits on its own (a failed build, a crash),
every request in flight fails with its exit status, the front prints one line saying so and stops
too, with exit status 1: to deploy the server is gone, as a one-process server would be, instead of
a port that answers 500 until a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import importlib.util
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from kernelcamp.serve import gcwatch
from kernelcamp.serve.client import INFO_PATH, PROFILE_PATH, TRACE_PATH
from kernelcamp.serve.openai import (
    BODY_TIMEOUT_S,
    ChatRequest,
    CompletionRequest,
    EngineError,
    _add_completion_routes,
    _check_model,
    _completion_response,
    _error,
    _openai_app,
    method_not_allowed,
)

INTERNAL = "/internal/v1"
ENGINE_TOKEN_ENV = "KERNELCAMP_ENGINE_TOKEN"  # the front gives its engine a fresh secret through this
ENGINE_TOKEN_HEADER = "x-kernelcamp-engine-token"
# The routes the front forwards to the engine (exact paths, or the prefix of the trace downloads);
# every other path is 404 at the front, whatever it would normalize to.
FORWARDED = ("/health", "/v1/models", INFO_PATH, PROFILE_PATH)
COMPLETION_PATHS = ("/v1/completions", "/v1/chat/completions")  # the front's own routes, POST only
FORWARDED_PREFIX = TRACE_PATH.split("{")[0]
ENGINE_STOP_GRACE_S = 30.0
ENGINE_DIR_PREFIX = "kernelcamp-engine-"  # the front's private socket folder, in the temporary folder
KEEPALIVE_S = 60.0  # the front's idle connections to the engine process close after this
ENGINE_KEEPALIVE_S = 3600  # the engine process's uvicorn keeps them open this long (> KEEPALIVE_S)


def http_stack() -> dict[str, str]:
    """The HTTP parser and event loop uvicorn runs the server with: ``{"http": "httptools" or "h11",
    "loop": "uvloop" or "asyncio", "uvicorn": version}``, the C ones when installed (uvicorn's own
    "auto" choice, made explicit by ``kernelcamp serve`` so that info reports what ran). The
    pure-Python ones cost the event loop more per streamed token (issue 12,
    ``benchmarks/sse_path_probe.py``)."""
    import uvicorn

    return {
        "http": "httptools" if importlib.util.find_spec("httptools") else "h11",
        "loop": "uvloop" if sys.platform != "win32" and importlib.util.find_spec("uvloop") else "asyncio",
        "uvicorn": uvicorn.__version__,
    }


async def queue_batches(q: Any, lists: bool = False) -> AsyncIterator[list[int]]:
    """A request's queue read in batches: each time every item that has arrived (at least one).

    Items: token ids (with ``lists``, lists of them), then None (done) or an Exception (raised after
    the tokens before it). One batch while the reader keeps up; when it falls behind, the tokens queued
    meanwhile come as one batch, so a stream costs one SSE chunk per event-loop turn rather than one
    per token (issue 12). vLLM's API server merges queued outputs the same way
    (``RequestOutputCollector`` in ``vllm/v1/engine/output_processor.py``)."""
    while True:
        batch: list[int] = []
        x = await q.get()
        while True:
            if x is None or isinstance(x, Exception):
                if batch:
                    yield batch
                if x is None:
                    return
                raise x
            if lists:
                batch.extend(x)
            else:
                batch.append(x)
            if q.empty():
                break
            x = q.get_nowait()
        yield batch


# ---- engine process: the internal routes ------------------------------------------------------------
class _Mux:
    """Engine process: the queue items (token, None = done, Exception) of every request, gathered on
    the event loop until the front's stream takes them, one line per turn."""

    def __init__(self) -> None:
        self.items: list[tuple[str, Any]] = []
        self.ready = asyncio.Event()

    def queue(self, rid: str) -> _MuxQueue:
        return _MuxQueue(rid, self)


class _MuxQueue:
    """The ``queue`` of one request in the engine process (see ``Engine.submit``)."""

    __slots__ = ("rid", "mux")

    def __init__(self, rid: str, mux: _Mux):
        self.rid, self.mux = rid, mux

    def put_nowait(self, x: Any) -> None:
        self.mux.items.append((self.rid, x))
        self.mux.ready.set()


def _step_line(items: list[tuple[str, Any]]) -> bytes:
    """One line of the token stream: ``{"tok": {rid: [ids]}, "end": [rid], "err": {rid: message}}``."""
    tok: dict[str, list[int]] = {}
    end: list[str] = []
    err: dict[str, str] = {}
    for rid, x in items:
        if x is None:
            end.append(rid)
        elif isinstance(x, BaseException):
            err[rid] = str(x) if str(x).startswith("engine error") else f"engine error: {x}"
        else:
            tok.setdefault(rid, []).append(x)
    return json.dumps({"tok": tok, "end": end, "err": err}, separators=(",", ":")).encode() + b"\n"


def add_engine_routes(app: FastAPI, engine: Any, vocab_size: int) -> None:
    """Engine process: the internal routes the front process uses (module docstring).

    ``POST {INTERNAL}/submit`` ``{"rid", "prompt", "max_tokens"}`` -> ``{"prompt_tokens"}``, or 400
    ``{"error"}`` (the context check of ``Engine.submit``); ``POST {INTERNAL}/cancel`` ``{"rid"}``;
    ``GET {INTERNAL}/steps``: the token stream (one reader: the front)."""
    from kernelcamp.serve.tokens import encode

    mux = _Mux()
    reqs: dict[str, Any] = {}
    token = os.environ.get(ENGINE_TOKEN_ENV, "")

    def _ours(request: Request) -> bool:
        """Only the front that spawned this engine knows its token (a secret from its environment)."""
        got = request.headers.get(ENGINE_TOKEN_HEADER, "")
        return bool(token) and hmac.compare_digest(got.encode(), token.encode())

    def _refused() -> JSONResponse:
        return JSONResponse({"error": "internal route: not for clients"}, status_code=404)

    @app.post(INTERNAL + "/submit")
    async def submit(body: dict[str, Any], request: Request):
        if not _ours(request):
            return _refused()
        rid, text, n = str(body["rid"]), str(body["prompt"]), int(body["max_tokens"])
        try:
            r = engine.submit(encode(text, vocab_size), n, queue=mux.queue(rid))
        except ValueError as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        reqs[rid] = r
        return {"prompt_tokens": len(r.prompt)}

    @app.post(INTERNAL + "/cancel")
    async def cancel(body: dict[str, Any], request: Request):
        if not _ours(request):
            return _refused()
        r = reqs.pop(str(body["rid"]), None)
        if r is not None:
            engine.cancel(r)
        return {"cancelled": r is not None}

    @app.get(INTERNAL + "/steps")
    async def steps(request: Request):
        if not _ours(request):
            return _refused()

        async def lines() -> AsyncIterator[bytes]:
            yield b"{}\n"  # the stream is open: the front may start taking requests
            while True:
                await mux.ready.wait()
                mux.ready.clear()
                items, mux.items = mux.items, []
                for rid, x in items:
                    if x is None or isinstance(x, BaseException):
                        reqs.pop(rid, None)
                yield _step_line(items)

        return StreamingResponse(lines(), media_type="application/x-ndjson")


def watch_parent(folder: str | Path | None = None, poll_s: float = 1.0) -> None:
    """Engine process: SIGTERM to itself once its parent (the front) is gone (a daemon thread), after
    removing ``folder`` (the front's private socket folder, which a killed front leaves behind)."""
    parent = os.getppid()

    def run() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        if folder is not None and Path(folder).name.startswith(ENGINE_DIR_PREFIX):
            shutil.rmtree(folder, ignore_errors=True)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=run, name="kernelcamp-parent-watch", daemon=True).start()


# ---- front process ----------------------------------------------------------------------------------
class EngineLink:
    """Front process: the engine process (spawned by :meth:`start`) and the token stream from it.

    ``argv``: the engine's ``kernelcamp serve`` command line without ``--engine-uds``."""

    def __init__(self, argv: list[str]):
        self.argv = list(argv)
        self.dir: Path | None = None
        self.uds = ""
        self.proc: subprocess.Popen | None = None
        self.queues: dict[str, asyncio.Queue] = {}
        self.error: str | None = None
        self.failed = False  # the engine process ended on its own: the front exits non-zero
        self.on_failure: Any = None  # called (on the event loop) to stop the front when that happens
        self.stopping: Any = None  # () -> bool: the front is already shutting down (then no failure)
        self.linked = False  # the token stream is open
        # server.gc_freeze: freeze this process's heap once linked (imports, client and connection made,
        # before /health says 200); what the freeze returned, for info (kernelcamp.serve.gcwatch)
        self.freeze_heap_when_linked = False
        self.gc_frozen: dict[str, Any] | None = None
        self._task: asyncio.Task | None = None
        self._pending: set[asyncio.Task] = set()  # cancel requests in flight
        self.token = ""
        self.client: Any = None

    def start(self) -> None:
        """Spawn the engine process (its output goes to ours) and the task that links to it."""
        import httpx

        self.dir = Path(tempfile.mkdtemp(prefix=ENGINE_DIR_PREFIX))  # mode 0700: ours alone
        self.uds = str(self.dir / "engine.sock")
        self.token = secrets.token_hex(16)
        env = {**os.environ, ENGINE_TOKEN_ENV: self.token}
        self.proc = subprocess.Popen([*self.argv, "--engine-uds", self.uds], env=env)
        # Idle connections are closed by this side (after KEEPALIVE_S), never by the engine's uvicorn
        # (ENGINE_KEEPALIVE_S): a request sent on a connection the server closes at that moment fails
        # (on the H200 one request in a concurrency-96 window did, 503, with uvicorn's 5 s default).
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None, keepalive_expiry=KEEPALIVE_S)
        self.client = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=self.uds, limits=limits),
            base_url="http://engine",
            timeout=None,
            headers={ENGINE_TOKEN_HEADER: self.token},
        )
        self._task = asyncio.get_running_loop().create_task(self._run())

    def exited(self) -> str | None:
        """The engine process's end, as a message (None while it runs)."""
        if self.proc is None or self.proc.poll() is None:
            return None
        return f"the engine process (pid {self.proc.pid}) exited with status {self.proc.returncode}"

    async def _run(self) -> None:
        """Wait for the engine's socket, then read its token stream until it ends; then fail everything."""
        import httpx

        why = "the engine process's token stream ended"
        ours = False  # the front is stopping it (vs. the engine ending on its own)
        try:
            while True:
                if self.exited():
                    why = self.exited()
                    return
                try:
                    async with self.client.stream("GET", INTERNAL + "/steps") as resp:
                        if resp.status_code != 200:
                            raise httpx.TransportError(f"status {resp.status_code}")
                        async for line in resp.aiter_lines():
                            if not line:
                                continue
                            if not self.linked:
                                self.linked = True
                                if self.freeze_heap_when_linked and self.gc_frozen is None:
                                    self.gc_frozen = gcwatch.freeze_heap()
                            self._deliver(json.loads(line))
                    why = self.exited() or why
                    return
                except (httpx.TransportError, OSError):
                    if self.linked:
                        why = self.exited() or "the engine process's token stream broke"
                        return
                    await asyncio.sleep(0.2)  # not listening yet: it is still loading the model
        except asyncio.CancelledError:
            why, ours = "the server is stopping", True
            raise
        finally:
            self.linked = False
            self.error = why
            for q in self.queues.values():
                q.put_nowait(EngineError(f"engine error: {why}"))
            if not ours and self.stopping is not None and self.stopping():
                ours = True  # both got the process group's SIGTERM, and the engine was quicker
            if not ours:  # the engine ended (or never started): the server as a whole stops, and says why
                self.failed = True
                print(
                    f"kernelcamp serve: {why}; the front stops too (the engine's own lines above say why)",
                    file=sys.stderr,
                    flush=True,
                )
                # after a moment, so that the failed requests' answers go out first; on_failure (set by
                # ``kernelcamp serve``: uvicorn's should_exit) stops the server so that its main returns 1,
                # where a SIGTERM would end the process with that signal's status
                stop = self.on_failure or (lambda: os.kill(os.getpid(), signal.SIGTERM))
                asyncio.get_running_loop().call_later(0.5, stop)

    def _deliver(self, msg: dict[str, Any]) -> None:
        queues = self.queues
        for rid, toks in msg.get("tok", {}).items():
            q = queues.get(rid)
            if q is not None:
                q.put_nowait(toks)
        for rid, text in msg.get("err", {}).items():
            q = queues.pop(rid, None)
            if q is not None:
                q.put_nowait(RuntimeError(text))
        for rid in msg.get("end", []):
            q = queues.pop(rid, None)
            if q is not None:
                q.put_nowait(None)

    async def submit(self, rid: str, prompt: str, max_tokens: int) -> tuple[asyncio.Queue, int]:
        """Queue a request in the engine; returns (its queue of token lists, its prompt tokens).

        Raises ``ValueError`` (the engine's context check) or ``RuntimeError`` (no engine)."""
        if self.error is not None or not self.linked:
            raise RuntimeError(self.error or "the engine process is still starting")
        q: asyncio.Queue = asyncio.Queue()
        self.queues[rid] = q  # before the engine can send its first token
        try:
            resp = await self.client.post(
                INTERNAL + "/submit", json={"rid": rid, "prompt": prompt, "max_tokens": max_tokens}
            )
        except Exception as e:
            self.queues.pop(rid, None)
            raise RuntimeError(f"engine error: {self.exited() or e}") from None
        if resp.status_code == 400:
            self.queues.pop(rid, None)
            raise ValueError(resp.json()["error"])
        if resp.status_code != 200:
            self.queues.pop(rid, None)
            raise RuntimeError(f"engine error: submit answered {resp.status_code}")
        return q, int(resp.json()["prompt_tokens"])

    async def batches(self, rid: str, q: asyncio.Queue) -> AsyncIterator[list[int]]:
        """The request's tokens, each time all that have arrived (:func:`queue_batches`); raises the
        engine's error after the tokens before it. Cancels the request in the engine when left early."""
        done = False
        try:
            async for batch in queue_batches(q, lists=True):
                yield batch
            done = True
        except Exception:
            done = True  # the engine's error: nothing to cancel
            raise
        finally:
            if not done and self.queues.pop(rid, None) is not None and self.linked:
                self._cancel_later(rid)

    def _cancel_later(self, rid: str) -> None:
        """Tell the engine to drop ``rid``, without waiting (this runs in a generator being closed, maybe
        cancelled by a shutdown); a failure (the engine gone meanwhile) is retrieved and dropped."""
        if self.stopping is not None and self.stopping():
            return  # the engine stops with us
        task = asyncio.get_running_loop().create_task(self.client.post(INTERNAL + "/cancel", json={"rid": rid}))
        self._pending.add(task)
        task.add_done_callback(lambda t: (self._pending.discard(t), t.cancelled() or t.exception()))

    async def forward(self, request: Request) -> Response:
        """Pass one request to the engine process's app as it came; its answer back."""
        if self.exited():
            return JSONResponse({"status": "error", "error": self.exited()}, status_code=500)
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "accept")}
        try:
            resp = await self.client.request(
                request.method,
                request.url.path,
                params=request.query_params,
                content=await request.body(),
                headers=headers,
            )
        except Exception:  # noqa: BLE001 - not listening yet (loading the model), or gone
            if self.exited():
                return JSONResponse({"status": "error", "error": self.exited()}, status_code=500)
            return JSONResponse({"status": "starting"}, status_code=503)
        keep = {k: v for k, v in resp.headers.items() if k.lower() in ("content-type", "content-disposition", "allow")}
        return Response(resp.content, status_code=resp.status_code, headers=keep)

    async def stop(self) -> None:
        """Stop the engine process (SIGTERM, then SIGKILL after ``ENGINE_STOP_GRACE_S``) and the link."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        if self.client is not None:
            await self.client.aclose()
        p = self.proc
        if p is not None and p.poll() is None:
            p.terminate()
            try:
                await asyncio.to_thread(p.wait, ENGINE_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                p.kill()
                await asyncio.to_thread(p.wait)
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)


def make_front_app(
    link: EngineLink, api_key: str | None = None, gc_freeze: bool = True, body_timeout_s: float = BODY_TIMEOUT_S
) -> FastAPI:
    """The front process's app (module docstring): completions streamed from ``link``, the rest forwarded.

    ``api_key`` is checked here (the engine process has none: only this process can reach it).
    ``gc_freeze`` (``server.gc_freeze``): freeze this process's heap once the link to the engine is open
    (:func:`kernelcamp.serve.gcwatch.freeze_heap`; before /health answers 200, after the imports and the
    client the link makes); info's ``front_gc`` is this process's collector
    (:meth:`kernelcamp.serve.gcwatch.GcWatch.snapshot`) and ``front_gc_frozen_at_start`` the freeze.
    ``body_timeout_s`` (``server.body_timeout_s``): a request body not read whole that many seconds
    after its headers gets 408 (:data:`kernelcamp.serve.openai.BODY_TIMEOUT_S`)."""
    gc = gcwatch.watch()
    link.freeze_heap_when_linked = gc_freeze

    async def lifespan(app: FastAPI):
        link.start()
        try:
            yield
        finally:
            await link.stop()

    app = _openai_app("kernelcamp decode server (front)", api_key, lifespan, body_timeout_s=body_timeout_s)
    stack = http_stack()

    async def _complete(req: CompletionRequest | ChatRequest, chat: bool, request: Request):
        bad = _check_model(req)
        if bad is not None:
            return bad
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        try:
            q, prompt_tokens = await link.submit(rid, req.text(), req.tokens_wanted())
        except ValueError as e:
            return _error(str(e), 400, "messages" if chat else "prompt", "context_length_exceeded")
        except RuntimeError as e:
            return _error(str(e), 503 if not link.error else 500)
        # the link's errors already say "engine error: ..."
        return await _completion_response(
            rid, chat, req, prompt_tokens, link.batches(rid, q), error_prefix="", request=request
        )

    _add_completion_routes(app, _complete)

    @app.get("/health")
    async def health(request: Request):
        # 200 only once the token stream is open too: the engine's own health can answer before the
        # front has linked to it, and a completion sent then would be refused (503)
        if link.exited():
            return JSONResponse({"status": "error", "error": link.exited()}, status_code=500)
        if not link.linked:
            return JSONResponse(
                {"status": "error", "error": link.error} if link.error else {"status": "starting"},
                status_code=500 if link.error else 503,
            )
        return await link.forward(request)

    @app.get(INFO_PATH)
    async def info(request: Request):
        resp = await link.forward(request)
        if resp.status_code != 200:
            return resp
        body = json.loads(resp.body)
        body.update(pid=os.getpid(), engine_pid=body.get("pid"), engine_process=True, http_stack=stack)
        body.update(front_gc=gc.snapshot(), front_gc_frozen_at_start=link.gc_frozen)
        return body

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    async def forward(path: str, request: Request):
        # any method, so that a wrong one is the 405 of the route it names: the front's own completion routes answer
        # it here; the engine's routes answer it there (its Allow header kept); before, GET /v1/completions was a
        # 404 and DELETE /v1/models said `Allow: GET, POST` (this route's methods)
        p = request.url.path
        if p in COMPLETION_PATHS:
            return method_not_allowed(request.method, p, "POST")
        if p in FORWARDED or (p.startswith(FORWARDED_PREFIX) and ".." not in p):
            return await link.forward(request)
        return _error(f"no route {p}", 404)

    return app

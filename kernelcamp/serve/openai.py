"""The OpenAI-compatible surface both servers share (the real one, :mod:`kernelcamp.serve.server`, and
the fixed-rate fake, :mod:`kernelcamp.serve.fake`): request models with strict types, OpenAI error
objects for every refusal (FastAPI's validation errors included, 400 not 422), JSON-only POSTs, the
optional API key, the completion routes and the streamed / full response shapes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Annotated, Any, Literal

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import (
    AfterValidator,
    AllowInfNan,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)
from starlette.exceptions import HTTPException as StarletteHTTPException

from kernelcamp.serve.client import TRACE_PATH

MODEL_NAME = "kernelcamp-decoder"


# ---- request models and OpenAI shapes ---------------------------------------------------------------
def _utf8(s: str) -> str:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"not valid Unicode (a lone surrogate at character {e.start})") from None
    return s


#: A string that is valid Unicode (JSON allows an unpaired ``\\ud800`` escape; UTF-8 does not).
Text = Annotated[StrictStr, AfterValidator(_utf8)]


#: The most tokens one request may ask for, before any context check (the fake server has no context:
#: without a bound, a max_tokens of 10**23 kept it generating until the client gave up).
MAX_TOKENS_LIMIT = 1 << 16
#: A strict float that is finite: NaN and infinities are refused (pydantic's StrictFloat takes them).
FiniteFloat = Annotated[float, Strict(), AllowInfNan(False)]


class _Open(BaseModel):
    """OpenAI request objects: known fields are type-checked strictly, unknown fields are ignored (as
    vLLM and SGLang do: clients send ``seed``, ``stop``, ``user`` ...)."""

    model_config = ConfigDict(extra="allow")


class StreamOptions(_Open):
    """``stream_options``: only ``include_usage`` has an effect."""

    include_usage: StrictBool = False


class TextPart(_Open):
    """One part of a message's content list; only ``{"type": "text", "text": ...}`` is taken."""

    type: StrictStr
    text: Text | None = None

    @model_validator(mode="after")
    def _text_only(self) -> TextPart:
        if self.type != "text":
            raise ValueError(f"content part type {self.type!r} is not supported: this server takes text parts only")
        if self.text is None:
            raise ValueError("a text content part needs a `text` string")
        return self


#: The message roles of OpenAI's Chat Completions API (its API reference, "Create chat completion": developer,
#: system, user, assistant, tool, and the deprecated function); any other role is a 400.
CHAT_ROLES = ("developer", "system", "user", "assistant", "tool", "function")


class ChatMessage(_Open):
    """A chat message; ``role`` one of :data:`CHAT_ROLES`; ``content`` is a string, a list of text parts (joined by
    newlines) or null."""

    role: Literal[CHAT_ROLES] = "user"  # type: ignore[valid-type]
    content: Text | list[TextPart] | None = None

    def text(self) -> str:
        """The content as one string."""
        if isinstance(self.content, list):
            return "\n".join(p.text or "" for p in self.content)
        return self.content or ""


class _Generate(_Open):
    model: Text | None = None
    max_tokens: StrictInt | None = Field(default=None, ge=1, le=MAX_TOKENS_LIMIT)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1, le=MAX_TOKENS_LIMIT)
    n: StrictInt = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    # OpenAI's ranges (API reference: temperature "between 0 and 2", top_p a probability mass); the server decodes
    # greedily whatever they are, but a value outside them is a client's error, refused as OpenAI refuses it
    temperature: FiniteFloat | StrictInt | None = Field(default=None, ge=0, le=2)
    top_p: FiniteFloat | StrictInt | None = Field(default=None, ge=0, le=1)
    # no log probabilities are computed: a request for them is refused, never answered with "logprobs": null
    logprobs: StrictBool | StrictInt | None = None
    top_logprobs: StrictInt | None = None

    @field_validator("n")
    @classmethod
    def _one(cls, v: int) -> int:
        if v != 1:
            raise ValueError("only n=1 is supported")
        return v

    @field_validator("logprobs", "top_logprobs")
    @classmethod
    def _no_logprobs(cls, v: bool | int | None) -> bool | int | None:
        if v is not None and v is not False:
            raise ValueError("log probabilities are not computed by this server; leave logprobs and top_logprobs out")
        return v

    def tokens_wanted(self) -> int:
        """``max_tokens``, else ``max_completion_tokens``, else 16."""
        return self.max_tokens or self.max_completion_tokens or 16

    def include_usage(self) -> bool:
        """Whether the stream ends with a usage chunk."""
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Generate):
    """``POST /v1/completions``: ``prompt`` is a string or a list holding exactly one string."""

    prompt: Text | list[Text]  # required, as in vLLM's server (OpenAI's legacy default is an end-of-text token)

    @field_validator("prompt")
    @classmethod
    def _single(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, list) and len(v) != 1:
            raise ValueError("a list must hold exactly one string (one completion per request)")
        return v

    def text(self) -> str:
        """The prompt text."""
        return self.prompt[0] if isinstance(self.prompt, list) else self.prompt


class ChatRequest(_Generate):
    """``POST /v1/chat/completions``: a non-empty ``messages`` list, rendered ``role: content`` per line."""

    messages: list[ChatMessage] = Field(min_length=1)

    def text(self) -> str:
        """The conversation as the prompt text."""
        return "\n".join(f"{m.role}: {m.text()}" for m in self.messages)


class ProfileRequest(BaseModel):
    """``POST /v1/kernelcamp/profile``. Unknown keys are refused: the server chooses where a trace is
    kept (a request naming a path, as ``trace_path`` once did, is a 400)."""

    model_config = ConfigDict(extra="forbid")

    steps: StrictInt = Field(default=5, ge=1, le=200)
    eager: StrictBool = False
    trace: StrictBool = True
    timeout_s: StrictFloat | StrictInt = Field(default=60, gt=0, le=3600)
    trace_path: Any = None  # refused below, with what to do instead

    @field_validator("trace_path")
    @classmethod
    def _no_server_path(cls, v: Any) -> None:
        if v is not None:
            raise ValueError(
                f'a request cannot choose where the server writes; send "trace": true and download the trace '
                f"from the answer's trace_url ({TRACE_PATH}; kernelcamp.serve.client.request_profile does both)"
            )
        return None


def _error(
    msg: str, status: int = 400, param: str | None = None, code: str | None = None, kind: str = ""
) -> JSONResponse:
    """An OpenAI-style error: ``{"error": {"message", "type", "param", "code"}}``."""
    kind = kind or ("invalid_request_error" if status < 500 else "server_error")
    msg = msg.encode("utf-8", "backslashreplace").decode("utf-8")  # never echo a lone surrogate
    return JSONResponse({"error": {"message": msg, "type": kind, "param": param, "code": code}}, status_code=status)


def _loc_name(loc: tuple) -> str:
    """``("body", "messages", 0, "content")`` -> ``messages[0].content``; pydantic's union-member tags
    (``function-after[...]``, ``list[TextPart]``, ``str``) are left out."""
    out = ""
    for x in loc:
        if x == "body" and not out:
            continue
        if isinstance(x, int):
            out += f"[{x}]"
            continue
        x = str(x)
        if "[" in x or "(" in x or x in ("str", "int", "float", "bool", "list", "dict", "none"):
            continue
        out += f".{x}" if out else x
    return out


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's request validation errors as a 400 in the OpenAI error shape (not 422).

    One message: the first of our own checks that failed (a ``ValueError`` in a validator), else the
    first error; it names the field (``param``) and never echoes the input."""
    errs = list(exc.errors()) or [{"loc": (), "msg": "invalid request", "type": "invalid"}]
    e = next((x for x in errs if x.get("type") == "value_error"), errs[0])
    loc = tuple(e.get("loc") or ())
    param = _loc_name(loc) or None
    if e.get("type") == "json_invalid":
        msg, param = f"the body is not valid JSON ({(e.get('ctx') or {}).get('error', 'parse error')})", None
    elif param is None and loc[:1] == ("body",):
        msg = "the request body must be a JSON object"
    else:
        msg = f"{param or 'request'}: {str(e.get('msg', 'invalid')).removeprefix('Value error, ')}"
    others = {_loc_name(tuple(x.get("loc") or ())) for x in errs} - {param or ""}
    if others:
        msg += f" (also: {', '.join(sorted(o or 'body' for o in others)[:5])})"
    return _error(msg, 400, param, str(e.get("type") or "invalid"))


def _is_json(content_type: str) -> bool:
    main = content_type.split(";", 1)[0].strip().lower()
    return main == "application/json" or (main.startswith("application/") and main.endswith("+json"))


#: Largest request body the servers read (bytes). The body is parsed on the event loop that streams
#: every other request's tokens: a 150 MB prompt held every stream for about 15 s (CPU, 2026-12-01).
#: 4 MiB holds about 500,000 eight-letter words; the embedded server's prompt tokens are words, and its
#: default context (server.max_context_tokens) is 2048 of them.
MAX_BODY_BYTES = 4 << 20
#: The engine process's limit, in MAX_BODY_BYTES: the front's request to it holds a prompt the front
#: accepted plus the request id, and httpx before 0.28 wrote JSON with ASCII escapes (a 4-byte UTF-8
#: character becomes a 12-byte surrogate pair).
ENGINE_BODY_FACTOR = 4
#: Seconds a request's body may take to arrive after its headers (``server.body_timeout_s``; 408 after
#: that): a client that sent headers and part of a body held its connection forever, and enough of them
#: starved /health and real requests. The benchmark's and deploy's bodies (a few kB on loopback) take
#: milliseconds; 30 s still lets a full MAX_BODY_BYTES body through a link of about 1.2 Mbit/s.
BODY_TIMEOUT_S = 30.0
#: Open connections past which each new request is answered 503 at once (``server.max_connections``,
#: :class:`ConnectionCap`). Uvicorn never times out a client that has not finished its headers
#: (its keep-alive timer starts only after a response), nor one whose response is in progress, so this
#: cap, not a timeout, keeps such clients from taking every file descriptor: with more of them than the
#: cap the server answers 503 to everyone until they leave (a proxy in front, e.g. nginx's
#: ``client_header_timeout``, is the fix for that). 256: 2.7x the benchmark's highest concurrency (96)
#: and server.max_running_requests (96); the front process holds about two descriptors per request
#: (the client's and one to its engine process), far below the usual limit of 1024.
MAX_CONNECTIONS = 256
#: Seconds a client refused at the connection cap is told to wait (``Retry-After``).
RETRY_AFTER_S = 1
#: Seconds between the cap's warnings in the server log (a burst of refusals had logged a line each).
CAP_LOG_EVERY_S = 10.0


class ConnectionCap:
    """ASGI middleware, outermost: ``server.max_connections`` (:data:`MAX_CONNECTIONS`) with an OpenAI
    error. A request is answered at once, before its body is read or the API key checked, 503 with
    ``Retry-After`` (:data:`RETRY_AFTER_S` s) and ``Connection: close``, when the server's open
    connections (its own included; clients that never finished their headers too) or the requests in
    progress (its own included) exceed ``max_connections``: ``max_connections`` clients are served,
    the next is refused. (Uvicorn's ``limit_concurrency``, which this replaces, answered plain text
    ``Service Unavailable`` and refused from ``max_connections`` connections on, its own included, so a
    cap of 1 refused every request.) Nothing queues past the cap. It counts from the uvicorn
    ``Server.server_state`` given to :meth:`watch`; before that it refuses nothing. The refusals are
    logged as one warning every :data:`CAP_LOG_EVERY_S` seconds at most, with their count."""

    def __init__(self, app: Any, max_connections: int = MAX_CONNECTIONS):
        self.app, self.limit = app, int(max_connections)
        self.state: Any = None
        self._refused, self._logged_at = 0, float("-inf")

    def watch(self, server_state: Any) -> None:
        """Count the ``connections`` and ``tasks`` of ``server_state`` (uvicorn's ``ServerState``)."""
        self.state = server_state

    def _full(self) -> JSONResponse:
        resp = _error(
            f"the server is at its connection limit ({self.limit} open connections, server.max_connections): "
            f"retry in {RETRY_AFTER_S} s, or raise server.max_connections",
            503,
            code="too_many_connections",
        )
        resp.headers["Retry-After"] = str(RETRY_AFTER_S)
        resp.headers["Connection"] = "close"  # frees the slot; the body, if any, is never read
        return resp

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        st = self.state
        if (
            scope["type"] == "http"
            and st is not None
            and (len(st.connections) > self.limit or len(st.tasks) > self.limit)
        ):
            self._refused += 1
            now = time.monotonic()
            if now - self._logged_at >= CAP_LOG_EVERY_S:
                logging.getLogger("uvicorn.error").warning(
                    "server.max_connections (%d) reached: answered 503 to %d request(s) since the last warning",
                    self.limit,
                    self._refused,
                )
                self._refused, self._logged_at = 0, now
            return await self._full()(scope, receive, send)
        await self.app(scope, receive, send)


class _Guard:
    """ASGI middleware: the API key (``Authorization: Bearer``) on every path but ``/health`` when a
    key is set, then 415 for a POST whose ``Content-Type`` is not JSON (a cross-site form or
    ``text/plain`` request never reaches a handler), then 413 for a body over ``max_body_bytes``
    (:data:`MAX_BODY_BYTES`), from its ``Content-Length`` or, for a chunked body, as soon as the bytes
    read pass the limit, and 408 (``Connection: close``) for a body not read whole within
    ``body_timeout_s`` seconds of its headers (:data:`BODY_TIMEOUT_S`); a body within both is read here
    and handed on whole."""

    def __init__(
        self,
        app: Any,
        api_key: str | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
        body_timeout_s: float = BODY_TIMEOUT_S,
    ):
        self.app, self.key = app, (api_key or "").encode() or None
        self.max_body = int(max_body_bytes)
        self.body_timeout_s = float(body_timeout_s)

    def _too_large(self) -> JSONResponse:
        return _error(f"request body over {self.max_body} bytes: send a shorter prompt", 413, code="request_too_large")

    def _too_slow(self) -> JSONResponse:
        resp = _error(
            f"the request body did not arrive within {self.body_timeout_s:g} s of its headers "
            "(server.body_timeout_s): send it whole",
            408,
            code="request_timeout",
        )
        resp.headers["Connection"] = "close"  # the rest of the body may still come: never read it as a request
        return resp

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1").lower(): v for k, v in scope.get("headers") or []}
            if self.key is not None and scope.get("path") != "/health":
                got = headers.get("authorization", b"")
                scheme, _, token = got.partition(b" ")
                if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self.key):
                    resp = _error(
                        "missing or wrong API key: send `Authorization: Bearer <key>`",
                        401,
                        code="invalid_api_key",
                    )
                    resp.headers["WWW-Authenticate"] = "Bearer"
                    return await resp(scope, receive, send)
            if scope.get("method") == "POST" and not _is_json(headers.get("content-type", b"").decode("latin-1")):
                ct = headers.get("content-type", b"").decode("latin-1") or "none"
                resp = _error(
                    f"Content-Type {ct!r}: send the body as application/json", 415, code="unsupported_media_type"
                )
                return await resp(scope, receive, send)
            if scope.get("method") == "POST":
                declared = headers.get("content-length", b"").strip()
                if declared.isdigit() and int(declared) > self.max_body:
                    return await self._too_large()(scope, receive, send)
                chunks: list[bytes] = []
                left: dict | None = None  # the message that ended the read early (the client left)
                size, more = 0, True
                with anyio.move_on_after(self.body_timeout_s) as late:
                    while more:
                        msg = await receive()
                        if msg["type"] != "http.request":
                            left = msg
                            break
                        chunks.append(msg.get("body", b""))
                        size += len(chunks[-1])
                        if size > self.max_body:
                            break
                        more = msg.get("more_body", False)
                if left is not None:  # let the app see it
                    return await self.app(scope, _replay([], left, receive), send)
                if late.cancelled_caught:
                    return await self._too_slow()(scope, receive, send)
                if size > self.max_body:
                    return await self._too_large()(scope, receive, send)
                return await self.app(scope, _replay(chunks, None, receive), send)
        await self.app(scope, receive, send)


def _replay(chunks: list[bytes], last: dict | None, receive: Any) -> Any:
    """An ASGI ``receive`` that gives the body already read (one message; or ``last``, a message that
    ended the read), then the real ``receive`` (so a streaming response still sees the disconnect)."""
    pending = [last if last is not None else {"type": "http.request", "body": b"".join(chunks), "more_body": False}]

    async def replay() -> dict:
        return pending.pop() if pending else await receive()

    return replay


def _openai_app(
    title: str,
    api_key: str | None,
    lifespan: Any = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    body_timeout_s: float = BODY_TIMEOUT_S,
) -> FastAPI:
    """A FastAPI app with the guard (API key, JSON-only POSTs, body size and deadline) and 400 validation
    errors."""
    app = FastAPI(title=title, lifespan=lifespan)
    app.add_middleware(_Guard, api_key=api_key, max_body_bytes=max_body_bytes, body_timeout_s=body_timeout_s)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    return app


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Starlette's own errors (unknown route 404, wrong method 405) in the OpenAI error shape too, with their
    headers: a 405 keeps its ``Allow`` (RFC 9110 section 15.5.6: a 405 response must list the allowed methods),
    and its message names them."""
    headers = dict(exc.headers or {})
    if exc.status_code == 405 and headers.get("Allow"):
        return method_not_allowed(request.method, request.url.path, headers["Allow"])
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    resp = _error(str(exc.detail), exc.status_code, code=code)
    resp.headers.update(headers)
    return resp


def method_not_allowed(method: str, path: str, allow: str) -> JSONResponse:
    """405 for ``method`` on ``path``, in the OpenAI error shape, with ``Allow: allow`` (e.g. ``"POST"``)."""
    resp = _error(f"{method} is not allowed on {path}: use {allow}", 405, code="method_not_allowed")
    resp.headers["Allow"] = allow
    return resp


def _check_model(req: _Generate) -> JSONResponse | None:
    if req.model is not None and req.model != MODEL_NAME:
        return _error(
            f"The model `{req.model}` does not exist: this server serves `{MODEL_NAME}` (GET /v1/models)",
            404,
            "model",
            "model_not_found",
        )
    return None


def _chunk(
    rid: str,
    chat: bool,
    text: str | None,
    k: int | None,
    finish: str | None,
    first: bool,
    created: int | None = None,
) -> dict[str, Any]:
    if chat:
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
        obj = "text_completion"
    created = int(time.time()) if created is None else created
    out = {"id": rid, "object": obj, "created": created, "model": MODEL_NAME, "choices": [choice]}
    if k is not None:
        out["kernelcamp_tokens"] = k
    return out


def _full(rid: str, chat: bool, text: str, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "finish_reason": "length", "logprobs": None}
        obj = "text_completion"
    return {
        "id": rid,
        "object": obj,
        "created": int(time.time()),
        "model": MODEL_NAME,
        "choices": [choice],
        "usage": _usage(prompt_tokens, completion_tokens),
    }


def _usage(p: int, c: int) -> dict[str, int]:
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class _Frames:
    """The SSE frames of one stream's text chunks, formatted once: per chunk only the text's JSON and
    the token count are spliced in (``json.dumps`` of a whole dict per token took about 1.3 of the
    8.8 s the streams spent in ``benchmarks/sse_path_probe.py``'s cProfile on a 2-core CPU: event-loop
    time the model thread waits for, issue 12). The bytes equal
    ``_sse(_chunk(rid, chat, text, k, None, False, created))``; every chunk of a stream carries the
    stream's one ``created`` time, as OpenAI's chunks of one completion do."""

    _TEXT, _K = "\u0000text", "\u0000k"  # sentinels: no id, model name or key holds a NUL

    def __init__(self, rid: str, chat: bool, counts: bool, created: int):
        whole = _sse(_chunk(rid, chat, self._TEXT, self._K if counts else None, None, False, created))
        head, rest = whole.split(json.dumps(self._TEXT).encode(), 1)
        if counts:
            mid, tail = rest.split(json.dumps(self._K).encode(), 1)
        else:
            mid, tail = rest, b""
        self.head, self.mid, self.tail, self.counts = head, mid, tail, counts

    def text(self, text: str, k: int) -> bytes:
        if self.counts:
            return b"".join((self.head, json.dumps(text).encode(), self.mid, str(k).encode(), self.tail))
        return b"".join((self.head, json.dumps(text).encode(), self.mid))


async def _stream_tokens(
    rid: str,
    chat: bool,
    prompt_tokens: int,
    pieces: AsyncIterator[tuple[str, int]],
    include_usage: bool,
    counts: bool = True,
) -> AsyncIterator[bytes]:
    """SSE body: one chunk per piece (text, tokens it holds), a finish chunk, optional usage, [DONE]. When
    ``pieces`` raises :class:`EngineError` (the engine process died mid-stream, or a model step failed the request:
    :func:`_completion_response` turns its other errors into one), an error event
    ``data: {"error": {...}}`` and [DONE] end it instead (vLLM's serving_completion.py does the same).

    ``counts``: put ``kernelcamp_tokens`` in every chunk (False imitates a foreign server). All chunks
    carry one ``created`` (unix seconds at the stream's start); the first chat chunk also carries the
    assistant role, the later ones are spliced from :class:`_Frames`."""
    created = int(time.time())
    frames = _Frames(rid, chat, counts, created)
    n, first = 0, True
    try:
        async for text, k in pieces:
            if first:
                yield _sse(_chunk(rid, chat, text, k if counts else None, None, True, created))
                first = False
            else:
                yield frames.text(text, k)
            n += k
    except EngineError as e:  # the engine failed after the 200 went out: say so in the stream, as vLLM does
        logging.getLogger("uvicorn.error").warning("request %s: %s", rid, e)
        yield _sse({"error": {"message": str(e), "type": "server_error", "param": None, "code": 500}})
        yield b"data: [DONE]\n\n"
        return
    yield _sse(_chunk(rid, chat, None if chat else "", 0 if counts else None, "length", first, created))
    if include_usage:
        yield _sse(
            {
                "id": rid,
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": created,
                "model": MODEL_NAME,
                "choices": [],
                "usage": _usage(prompt_tokens, n),
            }
        )
    yield b"data: [DONE]\n\n"


class EngineError(RuntimeError):
    """The engine failed a request after its answer began (its process exited, or its token stream broke)."""


class ClientGone(Exception):
    """The client closed its connection before its answer was ready (:func:`_unless_client_leaves`)."""


async def _until_disconnected(request: Request) -> None:
    """Return once the client of ``request`` has gone: the ASGI ``http.disconnect`` message, which a
    request whose body was read gets next (uvicorn sends it when the socket closes; Starlette's
    ``StreamingResponse`` waits for it the same way)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_client_leaves(request: Request | None, work: Coroutine[Any, Any, Any]) -> Any:
    """``await work``, unless the client of ``request`` disconnects first: then ``work`` is cancelled,
    which closes the token generators it was reading (so the engine drops the request, as it does a
    stream whose client left: ``requests_cancelled`` in info), and ``ClientGone`` is raised.

    Without a watch a non-streamed request was decoded to its end after its client left (ten of 2000
    tokens held the page pool for about 60 s on a 2-core CPU). ``request`` None: ``work`` alone."""
    if request is None:
        return await work
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_until_disconnected(request))
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when this handler is cancelled (a shutdown)
        gone.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task  # its generators' ``finally`` (the cancel in the engine) runs now
    if task.cancelled():
        raise ClientGone
    return task.result()


def _client_gone() -> JSONResponse:
    """The answer to a request whose client left (never read; 499 as nginx logs it)."""
    return _error("the client closed the connection before the completion was done", 499, code="client_gone")


async def _completion_response(
    rid: str,
    chat: bool,
    req: CompletionRequest | ChatRequest,
    prompt_tokens: int,
    batches: AsyncIterator[list[int]],
    error_prefix: str = "engine error: ",
    request: Request | None = None,
) -> Any:
    """The answer to a completion whose tokens arrive in ``batches`` (lists of token ids, each spelled
    by ``kernelcamp.serve.tokens.token_text``): SSE with one chunk per batch when ``req.stream``, else
    the full response once they all came, or a 500 naming the error (after ``error_prefix``); a stream whose
    ``batches`` fail ends with an error event naming it (:func:`_stream_tokens`).

    ``request``: a non-streamed completion whose client disconnects meanwhile is cancelled (the
    ``batches`` generator is closed; :func:`_unless_client_leaves`) and answered 499, which nobody
    reads. A stream's disconnect is seen by Starlette's ``StreamingResponse``, which closes it too."""
    from fastapi.responses import StreamingResponse

    from kernelcamp.serve.tokens import token_text

    if req.stream:

        async def pieces():
            try:
                async for batch in batches:
                    yield "".join([token_text(t) for t in batch]), len(batch)
            except EngineError:
                raise
            except Exception as e:  # the engine's failure of this request (a model step's error): the stream's error
                raise EngineError(f"{error_prefix}{e}") from e

        return StreamingResponse(
            _stream_tokens(rid, chat, prompt_tokens, pieces(), req.include_usage()), media_type="text/event-stream"
        )

    async def collect() -> list[int]:
        async with contextlib.aclosing(batches) as bs:
            return [t async for batch in bs for t in batch]

    try:
        toks = await _unless_client_leaves(request, collect())
    except ClientGone:
        return _client_gone()
    except Exception as e:  # noqa: BLE001
        return _error(f"{error_prefix}{e}", 500)
    return _full(rid, chat, "".join(token_text(t) for t in toks), prompt_tokens, len(toks))


def _add_completion_routes(app: FastAPI, complete: Any) -> None:
    """The two OpenAI completion routes, both served by ``complete(request model, chat=...)``."""

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        return await complete(req, chat=False, request=request)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatRequest, request: Request):
        return await complete(req, chat=True, request=request)

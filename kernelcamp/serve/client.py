"""What every client of a kernelcamp (or OpenAI-compatible) server shares: the API key, the URL a
client can use for a bind address, and fetching a decode-step profile with its trace.

API key: ``kernelcamp serve --api-key KEY`` (or ``KERNELCAMP_API_KEY`` in the server's environment)
makes the server require ``Authorization: Bearer KEY`` on everything but ``/health`` (as vLLM's and
SGLang's ``--api-key`` do). Clients here (the load generator, the deploy readiness probe,
:func:`request_profile`) send the key given to them, else ``KERNELCAMP_API_KEY`` from their own
environment. The key is deliberately not a params.yaml field: params.yaml and dvc.lock are
committed, and a key there would be published with them. The embedded deploy passes it to the
server it starts through the environment, never on the command line (visible in ``ps``).

Bind address vs URL: a server bound to a wildcard address (``0.0.0.0``, ``::``) is reached by a
client on the same machine through loopback; :func:`client_url` gives that URL, so a deploy record
never holds ``http://0.0.0.0:port``.

Nothing here imports torch or FastAPI.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Any

#: Environment variable holding the API key (server and clients).
API_KEY_ENV = "KERNELCAMP_API_KEY"
#: The decode-step profile endpoint and where its traces are downloaded from (``{trace_id}``).
INFO_PATH = "/v1/kernelcamp/info"
PROFILE_PATH = "/v1/kernelcamp/profile"
TRACE_PATH = "/v1/kernelcamp/profile/traces/{trace_id}"
#: Why a server whose info says ``cuda_profiled`` is never measured again nor reused by a deploy: a torch
#: profile with CUDA activity leaves CUPTI attached to the process (Kineto does not call cuptiFinalize
#: unless TEARDOWN_CUPTI=1: pytorch/pytorch#144455, 10-20% slower training in that report). On the H200
#: (2026-12-01) the candidate server a killed run had profiled, reused by the next run, took 0.09-0.24 ms
#: more per decode step at every batch size than a fresh one (0.965 against 0.839 ms at batch 1), and
#: that run's serving A/B said 0.85 at concurrency 1, where the kernels differ by 0.6%; a fresh server
#: lost 16% of its concurrency-1 throughput to one 5-step profile (benchmarks/cupti_probe.py).
CUDA_PROFILED_WHY = (
    "it ran a decode-step profile with CUDA activity, and CUPTI stays attached to a process after a torch "
    "profile (pytorch/pytorch#144455), so every later step is slower than the variant's"
)

#: Words (the embedded server's tokens) of each prompt the load generator sends by default
#: (``kernelcamp.loadgen.default_prompts``); ``kernelcamp.spec`` checks every ``max_tokens`` against
#: ``server.max_context_tokens`` with it. Here, not in the load generator, so that the spec reads it
#: without importing aiohttp and NumPy (about 0.3 s a stage).
DEFAULT_PROMPT_WORDS = 24


def api_key(explicit: str | None = None) -> str | None:
    """The key to use: ``explicit`` when given, else ``$KERNELCAMP_API_KEY``, else None (no auth)."""
    return explicit or os.environ.get(API_KEY_ENV) or None


def auth_headers(key: str | None = None) -> dict[str, str]:
    """``{"Authorization": "Bearer <key>"}`` for :func:`api_key`, or ``{}`` when there is no key."""
    k = api_key(key)
    return {"Authorization": f"Bearer {k}"} if k else {}


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a bind address or host name) is loopback only: 127.0.0.0/8, ::1, localhost."""
    h = host.strip("[]")
    if h.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def is_wildcard(host: str) -> bool:
    """Whether ``host`` is a wildcard bind address (``0.0.0.0``, ``::``, or empty)."""
    h = host.strip("[]")
    if not h:
        return True
    try:
        return ipaddress.ip_address(h).is_unspecified
    except ValueError:
        return False


def client_url(host: str, port: int) -> str:
    """The URL a client on this machine uses for a server bound to ``host:port``.

    Wildcards become loopback (``0.0.0.0`` -> ``127.0.0.1``, ``::`` -> ``[::1]``); IPv6 literals get
    brackets; any other host is kept as given."""
    h = host.strip("[]")
    if is_wildcard(h):
        h = "::1" if ":" in h else "127.0.0.1"
    try:
        if ipaddress.ip_address(h).version == 6:
            h = f"[{h}]"
    except ValueError:
        pass
    return f"http://{h}:{int(port)}"


def exposure_warning(host: str, port: int) -> str | None:
    """The warning to print when ``host`` is not loopback (reachable from other machines), else None."""
    if is_loopback(host):
        return None
    return f"warning: binding {host}:{port}, which is not loopback: other machines can reach this server" + (
        "" if api_key() else f" and it has no API key (pass --api-key or set {API_KEY_ENV})"
    )


def request_profile(
    url: str,
    trace_path: str | Path | None,
    steps: int = 5,
    eager: bool = False,
    timeout_s: float = 60.0,
    http_timeout_s: float = 120.0,
    key: str | None = None,
) -> tuple[int, dict[str, Any]]:
    """``POST /v1/kernelcamp/profile`` and, when ``trace_path`` is given, download the gzipped trace the
    server kept (``GET`` :data:`TRACE_PATH`) and write it atomically to ``trace_path`` on this machine.

    The server chooses where its traces live (a request never names a server-side path). Returns
    ``(status, body)``: on 200 the profile result with ``trace_path`` set to the local file (or None);
    otherwise the server's error object (``{"error": {"message": ...}}``); a failed download is a
    502-style ``(502, {"error": ...})`` so the caller reports it like any refusal."""
    import httpx

    from kernelcamp.io import atomic_path

    base = url.rstrip("/")
    body = {"steps": steps, "eager": eager, "timeout_s": timeout_s, "trace": trace_path is not None}
    r = httpx.post(base + PROFILE_PATH, json=body, timeout=http_timeout_s, headers=auth_headers(key))
    try:
        res = r.json()
    except ValueError:
        res = {"error": {"message": r.text[:300]}}
    if r.status_code != 200 or not isinstance(res, dict):
        return r.status_code, res if isinstance(res, dict) else {"error": {"message": str(res)[:300]}}
    res["trace_path"] = None
    if trace_path is not None:
        tid = res.get("trace_id")
        if not tid:
            return 502, {"error": {"message": "the profile answered without a trace_id"}}
        t = httpx.get(base + TRACE_PATH.format(trace_id=tid), timeout=http_timeout_s, headers=auth_headers(key))
        if t.status_code != 200:
            return 502, {"error": {"message": f"trace {tid}: GET answered {t.status_code}: {t.text[:200]}"}}
        with atomic_path(trace_path) as out:
            Path(out).write_bytes(t.content)
        res["trace_path"] = str(trace_path)
    return 200, res

"""``kernelcamp serve`` as two processes (``server.engine_process``, the default; issue 12): the front
streams what the engine process decodes, forwards the other routes, keeps the API key, reports both
pids, cancels a stream its client left, and neither process outlives the other."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
import yaml

from kernelcamp.io import load_params, pid_alive
from kernelcamp.serve.front import _step_line
from kernelcamp.serve.testing import free_port, post_and_leave

ROOT = Path(__file__).resolve().parents[1]
INFO = "/v1/kernelcamp/info"
KEY = "front-test-key"


def _params(tmp_path: Path, **server) -> Path:
    p = load_params(ROOT / "params.yaml")
    p["server"] = {**p["server"], "max_running_requests": 4, "max_context_tokens": 256, **server}
    out = tmp_path / "params.yaml"
    out.write_text(yaml.safe_dump(p))
    return out


class _Served:
    def __init__(self, params: Path, *extra: str, stderr: Path | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "kernelcamp.cli", "serve", "--params", str(params), "--port", str(self.port)]
        err = open(stderr, "w") if stderr is not None else None  # noqa: SIM115 - the child holds it
        self.proc = subprocess.Popen([*cmd, "--device", "cpu", *extra], cwd=ROOT, env={**os.environ}, stderr=err)
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert self.proc.poll() is None, f"kernelcamp serve exited with {self.proc.returncode}"
            assert time.monotonic() < deadline, "the server did not become healthy within 180 s"
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(40)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    s = _Served(_params(tmp_path_factory.mktemp("front")), "--api-key", KEY)
    yield s
    s.stop()


JSON_CT = {"content-type": "application/json"}


def _client(s: _Served) -> httpx.Client:
    return httpx.Client(base_url=s.url, timeout=60, headers={"Authorization": f"Bearer {KEY}"})


def test_step_lines_carry_tokens_ends_and_errors():
    line = _step_line([("a", 5), ("b", 7), ("a", 6), ("b", None), ("c", RuntimeError("boom"))])
    assert json.loads(line) == {"tok": {"a": [5, 6], "b": [7]}, "end": ["b"], "err": {"c": "engine error: boom"}}
    assert line.endswith(b"\n") and line.count(b"\n") == 1


def test_front_streams_what_the_engine_decodes_and_reports_both_processes(served):
    with _client(served) as c:
        whole = c.post("/v1/completions", json={"prompt": "two processes", "max_tokens": 12}).json()
        text, n = "", 0
        req = {"prompt": "two processes", "max_tokens": 12, "stream": True, "stream_options": {"include_usage": True}}
        with c.stream("POST", "/v1/completions", json=req) as s:
            assert s.status_code == 200
            for line in s.iter_lines():
                if line.startswith("data: {"):
                    o = json.loads(line[6:])
                    if o["choices"]:
                        text += o["choices"][0]["text"]
                        n += o.get("kernelcamp_tokens", 0)
                    else:
                        assert o["usage"]["completion_tokens"] == 12
        info = c.get(INFO, params={"steps": 0}).json()
    assert text == whole["choices"][0]["text"] and n == 12 and len(text.split()) == 12
    assert whole["usage"]["prompt_tokens"] == 2
    assert info["pid"] == served.proc.pid and info["engine_process"] is True
    assert info["engine_pid"] != info["pid"] and pid_alive(info["engine_pid"])
    assert info["server_flags"]["engine_process"] is True
    assert set(info["http_stack"]) == {"http", "loop", "uvicorn"}
    # server.gc_freeze (default true): both processes froze their heaps; each reports its collector
    assert info["server_flags"]["gc_freeze"] is True
    assert info["gc_frozen_at_start"]["frozen_objects"] > 1000 and info["gc"]["frozen_objects"] > 1000
    assert info["front_gc_frozen_at_start"]["frozen_objects"] > 1000 and info["front_gc"]["frozen_objects"] > 1000
    assert len(info["front_gc"]["collections"]) == 3
    # the front froze after its link's imports and never imports torch (kernelcamp.serve.tokens spells the
    # tokens): after two completions a full collection walks a few hundred objects, not the ~16,000 of
    # httpx (frozen too early) or the ~140,000 of torch (imported at the first completion)
    assert info["front_gc"]["unfrozen_objects"] < 5000, info["front_gc"]


def test_front_keeps_the_api_key_and_hides_the_internal_routes(served):
    with httpx.Client(base_url=served.url, timeout=30) as bare:
        assert bare.get("/health").status_code == 200
        assert bare.get(INFO).status_code == 401
        assert bare.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 401
    with _client(served) as c:
        assert c.get("/internal/v1/steps").status_code == 404
        assert c.post("/internal/v1/submit", json={"rid": "x", "prompt": "y", "max_tokens": 1}).status_code == 404
        assert c.get("/v1/models").json()["data"][0]["id"] == "kernelcamp-decoder"


def test_a_wrong_method_is_the_405_of_the_route_it_names(served):
    """At the front (the server's default: two processes), GET /v1/completions was a 404 "no route", POST /v1/models
    a 405 without its Allow header, and DELETE /v1/models said `Allow: GET, POST` (the forwarding route's)."""
    with _client(served) as c:
        for method, path, allow in [
            ("GET", "/v1/completions", "POST"),
            ("PUT", "/v1/chat/completions", "POST"),
            ("DELETE", "/v1/models", "GET"),
            ("POST", "/health", "GET"),
        ]:
            r = c.request(method, path, json={})
            assert r.status_code == 405 and r.headers.get("allow") == allow, (method, path, r.headers, r.text)
            assert r.json()["error"]["message"] == f"{method} is not allowed on {path}: use {allow}"


def test_front_passes_the_engines_refusals_through(served):
    with _client(served) as c:
        r = c.post("/v1/completions", json={"prompt": "w " * 200, "max_tokens": 100})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        r = c.post("/v1/kernelcamp/profile", json={"steps": 2, "timeout_s": 0.5})
        assert r.status_code == 504 and "no decode step" in r.json()["error"]["message"]


def test_the_body_limit_holds_at_the_front_and_a_prompt_it_took_reaches_the_engine(served):
    """413 at the front over the limit; a body of exactly the limit still reaches the engine, although the
    front's request to it is larger (the request id; and httpx before 0.28 wrote 4-byte characters as
    12-byte escapes): the engine's limit is ENGINE_BODY_FACTOR times the front's."""
    from kernelcamp.serve.openai import MAX_BODY_BYTES

    with _client(served) as c:
        r = c.post("/v1/completions", content=b'{"prompt": "' + b"x" * MAX_BODY_BYTES + b'"}', headers=JSON_CT)
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
        # a body of exactly the limit: one word (one prompt token) of 4-byte characters
        frame = json.dumps({"prompt": "", "max_tokens": 2}).encode()
        word = "\U0001f600" * ((MAX_BODY_BYTES - len(frame)) // 4)
        body = json.dumps({"prompt": word, "max_tokens": 2}, ensure_ascii=False).encode()
        assert MAX_BODY_BYTES - 4 < len(body) <= MAX_BODY_BYTES
        r = c.post("/v1/completions", content=body, headers=JSON_CT)
        assert r.status_code == 200, r.text[:300]
        assert r.json()["usage"]["prompt_tokens"] == 1


def test_a_stream_its_client_left_is_cancelled_in_the_engine(served):
    with _client(served) as c:
        before = c.get(INFO, params={"steps": 0}).json()["counts"]
        with c.stream("POST", "/v1/completions", json={"prompt": "leave", "max_tokens": 200, "stream": True}) as s:
            got = 0
            for line in s.iter_lines():
                got += line.startswith("data: {")
                if got == 3:
                    break
        deadline = time.monotonic() + 30
        while True:
            after = c.get(INFO, params={"steps": 0}).json()["counts"]
            if after["requests_cancelled"] > before["requests_cancelled"] and after["running"] == 0:
                break
            assert time.monotonic() < deadline, (before, after)
            time.sleep(0.05)
    assert after["free_pages"] == before["free_pages"]
    assert after["tokens_generated"] - before["tokens_generated"] < 200


def test_non_streamed_requests_whose_clients_left_are_cancelled_in_the_engine(served):
    """Before: the front waited for every token of a non-streamed completion (or chat) whose client had
    closed its socket 50 ms after sending, and the engine decoded it to its end (requests_finished +1,
    requests_cancelled +0); now the front cancels it in the engine, as it does a stream's."""
    auth = {"Authorization": f"Bearer {KEY}"}
    max_tokens = 250  # the fixture's context is 256 tokens; seconds of decoding at batch 4 on a 2-core CPU
    with _client(served) as c:
        before = c.get(INFO, params={"steps": 0}).json()["counts"]
        for i in range(2):
            body = {"prompt": f"left {i}", "max_tokens": max_tokens}
            post_and_leave(served.url, "/v1/completions", json.dumps(body).encode(), auth)
            chat = {"messages": [{"role": "user", "content": f"left {i}"}], "max_tokens": max_tokens}
            post_and_leave(served.url, "/v1/chat/completions", json.dumps(chat).encode(), auth)
        deadline = time.monotonic() + 60
        ended = ("requests_cancelled", "requests_finished")
        while True:  # until all 4 have ended: requests_total counts one before the engine has it (running 0)
            after = c.get(INFO, params={"steps": 0}).json()["counts"]
            if after["running"] == 0 and after["waiting"] == 0 and sum(after[k] - before[k] for k in ended) >= 4:
                break
            assert time.monotonic() < deadline, (before, after)
            time.sleep(0.05)
    assert after["requests_cancelled"] - before["requests_cancelled"] == 4, (before, after)
    assert after["requests_finished"] == before["requests_finished"], (before, after)
    assert after["free_pages"] == before["free_pages"], (before, after)
    assert after["tokens_generated"] - before["tokens_generated"] < 4 * max_tokens // 2, (before, after)


def _send_part(port: int, data: bytes) -> socket.socket:
    """A connection that sends ``data`` and then nothing (a slow or stalled client)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(data)
    return sock


def _read_to_close(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (30 s at most per read)."""
    out = b""
    with sock:
        while chunk := sock.recv(65536):
            out += chunk
    return out


def test_slow_bodies_time_out_and_connections_are_capped(tmp_path):
    """Before: 40 clients that sent their headers and part of a body (Content-Length 100, then only
    ``{"prompt":``) held their connections forever, and enough of them starved /health and real requests.
    Now (server.body_timeout_s, server.max_connections): each is answered 408 with an OpenAI error and
    closed once its body is late, /health answers meanwhile; and clients that never finish their headers
    (which uvicorn never times out) are capped: past max_connections a request is answered 503 at once,
    with an OpenAI error and Retry-After."""
    s = _Served(_params(tmp_path, body_timeout_s=1, max_connections=48))
    try:
        head = f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{s.port}\r\nContent-Type: application/json\r\n"
        slow = [_send_part(s.port, (head + "Content-Length: 100\r\n\r\n").encode() + b'{"prompt":') for _ in range(40)]
        assert httpx.get(s.url + "/health", timeout=30).status_code == 200
        for sock in slow:
            answer = _read_to_close(sock)
            status, _, rest = answer.partition(b"\r\n")
            assert status.startswith(b"HTTP/1.1 408"), answer[:300]
            err = json.loads(rest.partition(b"\r\n\r\n")[2])["error"]
            assert err["code"] == "request_timeout" and "body_timeout_s" in err["message"], err
        stalled = [_send_part(s.port, head.encode()) for _ in range(47)]  # headers never finished
        try:
            # 47 held connections and this one: 48, the cap, still served (with uvicorn's rule, which counted the
            # caller's own connection, 47 were the most served, and a cap of 1 refused every request)
            deadline = time.monotonic() + 30
            while (h := httpx.get(s.url + "/health", timeout=30)).status_code != 200:
                assert time.monotonic() < deadline, f"/health refused at 48 of 48 connections: {h.text}"
                time.sleep(0.1)
            stalled.append(_send_part(s.port, head.encode()))
            time.sleep(0.2)  # the server has accepted the 48th held connection
            for r in (
                httpx.get(s.url + "/health", timeout=30),
                httpx.post(s.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=30),
            ):  # an OpenAI error (uvicorn's limit_concurrency had answered plain text "Service Unavailable")
                assert r.status_code == 503 and r.headers.get("content-type") == "application/json", r.text
                assert r.headers["retry-after"] == "1" and r.headers["connection"] == "close", r.headers
                err = r.json()["error"]
                assert err["code"] == "too_many_connections" and err["type"] == "server_error", err
                assert "connection limit (48 open connections, server.max_connections)" in err["message"], err
        finally:
            for sock in stalled:
                sock.close()
        deadline = time.monotonic() + 30
        while httpx.get(s.url + "/health", timeout=30).status_code != 200:
            assert time.monotonic() < deadline, "/health not 200 again after the stalled clients left"
            time.sleep(0.1)
        with _client(s) as c:
            assert c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200
    finally:
        s.stop()


def test_neither_process_outlives_the_other(tmp_path):
    params = _params(tmp_path)
    # the front stopped: it stops its engine
    s = _Served(params)
    engine = httpx.get(s.url + INFO, params={"steps": 0}).json()["engine_pid"]
    s.stop()
    assert _gone(engine, 40), "the engine process outlived its front's SIGTERM"
    # the front killed (no shutdown of its own): the engine notices its parent is gone
    s = _Served(params)
    engine = httpx.get(s.url + INFO, params={"steps": 0}).json()["engine_pid"]
    before = set(Path(tempfile.gettempdir()).glob("kernelcamp-engine-*"))
    s.proc.send_signal(signal.SIGKILL)
    s.proc.wait(10)
    assert _gone(engine, 40), "the engine process outlived its killed front"
    left = set(Path(tempfile.gettempdir()).glob("kernelcamp-engine-*"))
    assert len(before - left) == 1, "the killed front's socket folder was left behind"
    # the engine gone: requests in flight fail with the reason, and the front stops too, status 1
    long_dir = tmp_path / "long"
    long_dir.mkdir()
    s = _Served(_params(long_dir, max_context_tokens=2048))
    try:
        engine = httpx.get(s.url + INFO, params={"steps": 0}).json()["engine_pid"]
        chunks: list[str] = []
        # long enough that the engine cannot finish it before the kill: with 240 tokens, on a busy 2-core
        # machine the whole answer had sometimes been sent (and [DONE]) by the time the 4th line was read
        req = {"prompt": "x", "max_tokens": 2000, "stream": True}
        with httpx.stream("POST", s.url + "/v1/completions", json=req, timeout=60) as r:
            for line in r.iter_lines():
                chunks.append(line)
                if len(chunks) == 4:
                    os.kill(engine, signal.SIGKILL)
        # the stream ends with an error event naming the reason, then [DONE], as vLLM's does (it had just broken
        # off: a client saw a dropped connection); loadgen counts it as stream_error, a failure
        data = [line[len("data: ") :] for line in chunks if line.startswith("data: ")]
        assert data[-1] == "[DONE]" and not any(
            json.loads(d).get("choices", [{}])[0].get("finish_reason") for d in data[:-2]
        )
        err = json.loads(data[-2])["error"]
        assert err["code"] == 500 and err["message"].startswith("engine error: the engine process"), err
        assert s.proc.wait(30) == 1
    finally:
        s.stop()


def test_an_engine_that_fails_to_build_stops_the_server_with_status_1(tmp_path):
    p = load_params(ROOT / "params.yaml")
    p["server"] = {**p["server"], "num_cache_tokens": 256, "cpu_cache_tokens": 256, "max_context_tokens": 2048}
    bad = tmp_path / "params.yaml"
    bad.write_text(yaml.safe_dump(p))
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "kernelcamp.cli",
        "serve",
        "--params",
        str(bad),
        "--port",
        str(port),
        "--device",
        "cpu",
    ]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert r.returncode == 1, r.stderr[-2000:]
    assert "the engine process" in r.stderr and "exited with status" in r.stderr


def test_one_process_when_asked(tmp_path):
    s = _Served(_params(tmp_path, engine_process=False))
    try:
        info = httpx.get(s.url + INFO, params={"steps": 0}).json()
        assert info["pid"] == s.proc.pid and "engine_pid" not in info
        assert info["server_flags"]["engine_process"] is False
        assert info["gc_frozen_at_start"]["frozen_objects"] > 1000  # server.gc_freeze in one process too
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "one", "max_tokens": 3}, timeout=30)
        assert len(r.json()["choices"][0]["text"].split()) == 3
    finally:
        s.stop()


def test_the_front_closes_idle_engine_connections_before_the_engine_would():
    # On the H200 one request of a concurrency-96 window got 503: the front reused a connection the
    # engine's uvicorn closed at that moment (its 5 s keep-alive, the same as httpx's default expiry).
    from kernelcamp.serve.front import ENGINE_KEEPALIVE_S, KEEPALIVE_S

    assert KEEPALIVE_S < ENGINE_KEEPALIVE_S


def test_the_internal_routes_cannot_be_reached_through_the_front(served):
    # A path that normalizes to /internal/v1/... reached the engine (httpx collapses "..": the front's
    # check saw the raw path); anyone could then cancel a request by its id or submit unread work.
    import http.client

    for method, path, body in [
        ("POST", "/v1/../internal/v1/cancel", '{"rid": "x"}'),
        ("POST", "/v1/../internal/v1/submit", '{"rid": "x", "prompt": "p", "max_tokens": 5}'),
        ("GET", "/v1/kernelcamp/profile/traces/../../../internal/v1/steps", None),
        ("GET", "/v1/../v1/models", None),
    ]:
        c = http.client.HTTPConnection("127.0.0.1", served.port, timeout=10)
        headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
        c.request(method, path, body=body, headers=headers)  # the path goes out as written
        r = c.getresponse()
        assert r.status == 404, (path, r.status, r.read()[:200])
        c.close()


def test_the_engines_internal_routes_answer_only_its_own_front(monkeypatch):
    # defence in depth: the engine's internal routes also want the secret its front gave it
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from kernelcamp.serve.front import ENGINE_TOKEN_ENV, ENGINE_TOKEN_HEADER, add_engine_routes

    class _Engine:
        submitted: list = []

        def submit(self, prompt, max_tokens, queue=None):
            self.submitted.append(prompt)
            return type("R", (), {"prompt": prompt})()

    monkeypatch.setenv(ENGINE_TOKEN_ENV, "s3cret")
    app = FastAPI()
    eng = _Engine()
    add_engine_routes(app, eng, 4096)
    body = {"rid": "r1", "prompt": "a b", "max_tokens": 3}
    with TestClient(app) as c:
        assert c.post("/internal/v1/submit", json=body).status_code == 404
        assert c.post("/internal/v1/submit", json=body, headers={ENGINE_TOKEN_HEADER: "wrong"}).status_code == 404
        assert c.post("/internal/v1/cancel", json={"rid": "r1"}).status_code == 404
        assert eng.submitted == []
        ok = c.post("/internal/v1/submit", json=body, headers={ENGINE_TOKEN_HEADER: "s3cret"})
        assert ok.status_code == 200 and ok.json() == {"prompt_tokens": 2} and len(eng.submitted) == 1


def test_sigterm_with_a_stream_in_flight_stops_cleanly(tmp_path):
    err = tmp_path / "stderr.log"
    s = _Served(_params(tmp_path), stderr=err)
    try:
        with httpx.stream(
            "POST", s.url + "/v1/completions", json={"prompt": "x", "max_tokens": 240, "stream": True}, timeout=60
        ) as r:
            assert r.status_code == 200
            n = 0
            for line in r.iter_lines():
                n += line.startswith("data: {")
                if n == 3:
                    s.proc.terminate()
                    break
        s.proc.wait(40)
    finally:
        s.stop()
    text = err.read_text()
    assert "Traceback" not in text and "never retrieved" not in text, text[-3000:]

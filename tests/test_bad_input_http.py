"""Bad input, one row each: HTTP requests to the real CPU server and the fixed-rate fake (a 4xx with an
OpenAI-style error object, never a 500, a stream or a silent acceptance), ``kernelcamp serve`` options
(one ``error:`` line on stderr, exit 2, no traceback), ssh deploy arguments that ssh would read as
options, the bind host, and the API key (server, load generator, deploy readiness probe)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from fastapi.testclient import TestClient

from kernelcamp.deploy import common
from kernelcamp.deploy import embedded as dep
from kernelcamp.deploy import ssh as dep_ssh
from kernelcamp.errors import KernelcampError
from kernelcamp.io import load_params
from kernelcamp.loadgen import run_load
from kernelcamp.serve.client import API_KEY_ENV, PROFILE_PATH, client_url
from kernelcamp.serve.fake import FakeSpec, make_fake_app
from kernelcamp.serve.openai import CHAT_ROLES, MODEL_NAME
from kernelcamp.serve.server import build_state, make_app
from kernelcamp.serve.testing import ServerThread, free_port

ROOT = Path(__file__).resolve().parents[1]
JSON = {"content-type": "application/json"}
COMP, CHAT = "/v1/completions", "/v1/chat/completions"


@pytest.fixture(autouse=True)
def _no_ambient_key(monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)


@pytest.fixture(scope="module")
def real():
    p = load_params(ROOT / "params.yaml")
    p["server"] = {**p["server"], "max_running_requests": 4}
    with TestClient(make_app(build_state(p, "cpu"))) as c:
        yield c


@pytest.fixture(scope="module")
def fake():
    with TestClient(make_fake_app(FakeSpec())) as c:
        yield c


def _chat(content, **kw):
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 2, **kw}


# (id, path, raw body (bytes) or JSON-able object, headers, status, error param, error code)
HTTP_ROWS = [
    ("body_null", COMP, b"null", JSON, 400, None, None),
    ("body_list", COMP, b"[1,2,3]", JSON, 400, None, None),
    ("body_string", COMP, b'"abc"', JSON, 400, None, None),
    ("body_not_json", COMP, b'{"prompt": ', JSON, 400, None, "json_invalid"),
    ("chat_body_null", CHAT, b"null", JSON, 400, None, None),
    ("text_plain", COMP, b'{"prompt": "x", "max_tokens": 2}', {"content-type": "text/plain"}, 415, None, None),
    ("no_content_type", COMP, b'{"prompt": "x", "max_tokens": 2}', {}, 415, None, None),
    ("form", COMP, b"prompt=x", {"content-type": "application/x-www-form-urlencoded"}, 415, None, None),
    (
        "stream_options_string",
        COMP,
        {"prompt": "x", "stream": True, "stream_options": "yes"},
        JSON,
        400,
        "stream_options",
        None,
    ),
    (
        "stream_options_list",
        COMP,
        {"prompt": "x", "stream": True, "stream_options": [1]},
        JSON,
        400,
        "stream_options",
        None,
    ),
    (
        "include_usage_string",
        COMP,
        {"prompt": "x", "stream": True, "stream_options": {"include_usage": "no"}},
        JSON,
        400,
        "stream_options.include_usage",
        None,
    ),
    ("messages_ints", CHAT, {"messages": [1, 2]}, JSON, 400, "messages[0]", None),
    ("messages_empty", CHAT, {"messages": []}, JSON, 400, "messages", None),
    ("messages_missing", CHAT, {"prompt": "x"}, JSON, 400, "messages", "missing"),
    ("lone_surrogate_prompt", COMP, b'{"prompt": "a \\ud800 b", "max_tokens": 2}', JSON, 400, "prompt", None),
    (
        "lone_surrogate_chat",
        CHAT,
        b'{"messages": [{"role": "user", "content": "\\udfff"}]}',
        JSON,
        400,
        "messages[0].content",
        None,
    ),
    ("wrong_model", COMP, {"prompt": "x", "model": "gpt-4o", "max_tokens": 2}, JSON, 404, "model", "model_not_found"),
    ("wrong_model_chat", CHAT, _chat("hi", model="llama"), JSON, 404, "model", "model_not_found"),
    ("stream_string_false", COMP, {"prompt": "x", "stream": "false", "max_tokens": 2}, JSON, 400, "stream", None),
    ("stream_int", CHAT, _chat("hi", stream=1), JSON, 400, "stream", None),
    (
        "image_part",
        CHAT,
        _chat([{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]),
        JSON,
        400,
        "messages[0].content[0]",
        None,
    ),
    ("part_without_text", CHAT, _chat([{"type": "text"}]), JSON, 400, "messages[0].content[0]", None),
    ("content_number", CHAT, _chat(5), JSON, 400, "messages[0].content", None),
    ("max_tokens_string", COMP, {"prompt": "x", "max_tokens": "5"}, JSON, 400, "max_tokens", None),
    ("max_tokens_zero", COMP, {"prompt": "x", "max_tokens": 0}, JSON, 400, "max_tokens", None),
    ("max_tokens_bool", COMP, {"prompt": "x", "max_tokens": True}, JSON, 400, "max_tokens", None),
    ("n_two", COMP, {"prompt": "x", "n": 2}, JSON, 400, "n", None),
    ("prompt_two_strings", COMP, {"prompt": ["a", "b"]}, JSON, 400, "prompt", None),
    ("prompt_number", COMP, {"prompt": 7}, JSON, 400, "prompt", None),
    # accepted before: a completion with no prompt generated from an empty one; sampling values outside OpenAI's
    # ranges, an unknown role and a request for log probabilities (answered with "logprobs": null) went through
    ("prompt_missing", COMP, {"max_tokens": 2}, JSON, 400, "prompt", "missing"),
    ("temperature_negative", COMP, {"prompt": "x", "temperature": -1}, JSON, 400, "temperature", None),
    ("temperature_above_2", CHAT, _chat("hi", temperature=2.5), JSON, 400, "temperature", None),
    ("top_p_above_1", COMP, {"prompt": "x", "top_p": 1.5}, JSON, 400, "top_p", None),
    ("unknown_role", CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}, JSON, 400, "messages[0].role", None),
    ("logprobs_completion", COMP, {"prompt": "x", "logprobs": 1}, JSON, 400, "logprobs", None),
    ("logprobs_zero", COMP, {"prompt": "x", "logprobs": 0}, JSON, 400, "logprobs", None),
    ("logprobs_chat", CHAT, _chat("hi", logprobs=True), JSON, 400, "logprobs", None),
    ("top_logprobs_chat", CHAT, _chat("hi", top_logprobs=2), JSON, 400, "top_logprobs", None),
]


def _send(c: TestClient, path: str, body, headers: dict):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return c.post(path, content=raw, headers=headers)


def _assert_openai_error(r, status: int, param: str | None, code: str | None) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json"), r.headers
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert err["message"] and isinstance(err["message"], str)
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    return err


@pytest.mark.parametrize("app", ["fake", "real"])
@pytest.mark.parametrize("row", HTTP_ROWS, ids=[r[0] for r in HTTP_ROWS])
def test_bad_request(request, app, row):
    _, path, body, headers, status, param, code = row
    c = request.getfixturevalue(app)
    _assert_openai_error(_send(c, path, body, headers), status, param, code)
    # the server still answers a good request afterwards (no broken engine, no stuck state)
    assert _send(c, COMP, {"prompt": "still here", "max_tokens": 2}, JSON).status_code == 200


@pytest.mark.parametrize("app", ["fake", "real"])
def test_the_values_next_to_the_refused_ones_pass(request, app):
    c = request.getfixturevalue(app)
    for path, body in [
        (COMP, {"prompt": "x", "max_tokens": 2, "temperature": 0, "top_p": 1, "logprobs": None}),
        (COMP, {"prompt": "x", "max_tokens": 2, "temperature": 2.0, "top_p": 0.0}),
        (CHAT, _chat("hi", logprobs=False, top_logprobs=None)),
        *[(CHAT, {"messages": [{"role": r, "content": "hi"}], "max_tokens": 2}) for r in CHAT_ROLES],
    ]:
        r = _send(c, path, body, JSON)
        assert r.status_code == 200, (body, r.text)


@pytest.mark.parametrize("app", ["fake", "real"])
def test_a_wrong_method_is_405_naming_the_allowed_one(request, app):
    """The 405 lost its ``Allow`` header (RFC 9110 requires it) and said only "Method Not Allowed"."""
    c = request.getfixturevalue(app)
    r = c.get(COMP)
    err = _assert_openai_error(r, 405, None, "method_not_allowed")
    assert r.headers["allow"] == "POST" and err["message"] == f"GET is not allowed on {COMP}: use POST"


def test_text_content_parts_are_joined_not_repr(fake, real):
    # A content-part list reached the model as its Python repr ("[{'type': 'text', ...}]").
    for c in (fake, real):
        parts = _send(
            c, CHAT, _chat([{"type": "text", "text": "a b"}, {"type": "text", "text": "c"}], max_tokens=4), JSON
        )
        joined = _send(c, CHAT, _chat("a b\nc", max_tokens=4), JSON)
        assert parts.status_code == joined.status_code == 200
        assert parts.json()["choices"][0]["message"] == joined.json()["choices"][0]["message"]
        assert parts.json()["usage"] == joined.json()["usage"]
    ok = _send(fake, COMP, {"prompt": "x", "max_tokens": 2, "model": MODEL_NAME, "seed": 1, "user": "u"}, JSON)
    assert ok.status_code == 200  # the right model name and unknown OpenAI fields are fine


@pytest.mark.slow  # > 9 s on 2 cores: `make test-slow` (CI runs both)
def test_prompt_beyond_context_is_refused_naming_the_limit(real):
    # It was cut to its last tokens silently (200, with a smaller prompt_tokens than was sent).
    words = " ".join(f"w{i}" for i in range(2100))
    err = _assert_openai_error(
        _send(real, COMP, {"prompt": words, "max_tokens": 4}, JSON), 400, "prompt", "context_length_exceeded"
    )
    assert "2048" in err["message"] and "server.max_context_tokens" in err["message"]
    err = _assert_openai_error(
        _send(real, CHAT, _chat("x", max_tokens=2048), JSON), 400, "messages", "context_length_exceeded"
    )
    assert _send(real, COMP, {"prompt": "x", "max_tokens": 2040}, JSON).status_code == 200  # 1 + 2040 fits


# ---- the profile endpoint: a request never names a server-side path ------------------------------------
def test_profile_text_plain_with_trace_path_never_runs(real, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    body = json.dumps({"steps": 2, "trace_path": str(victim), "timeout_s": 0.2}).encode()
    r = real.post(PROFILE_PATH, content=body, headers={"content-type": "text/plain"})
    _assert_openai_error(r, 415, None, None)
    r = real.post(PROFILE_PATH, content=body, headers=JSON)
    _assert_openai_error(r, 400, "trace_path", None)
    assert victim.read_text() == "precious"
    for bad in ({"steps": "2"}, {"eager": "false"}, {"timeout_s": 0}, {"steps": 10**6}, [1]):
        assert real.post(PROFILE_PATH, json=bad).status_code == 400, bad
    for tid in ("..%2F..%2Fetc%2Fpasswd", "0" * 32, "zz"):
        assert real.get(f"/v1/kernelcamp/profile/traces/{tid}").status_code == 404


# ---- the API key -----------------------------------------------------------------------------------------
def test_api_key_required_everywhere_but_health(tmp_path, monkeypatch):
    app = make_fake_app(FakeSpec(), api_key="s3cret")
    with TestClient(app) as c:
        assert c.get("/health").status_code == 200
        for path in ("/v1/models", "/v1/kernelcamp/info", "/openapi.json"):
            _assert_openai_error(c.get(path), 401, None, "invalid_api_key")
        body = {"prompt": "x", "max_tokens": 2}
        _assert_openai_error(c.post(COMP, json=body), 401, None, "invalid_api_key")
        for auth in ("Bearer wrong", "s3cret", "Basic s3cret", "Bearer "):
            _assert_openai_error(c.post(COMP, json=body, headers={"Authorization": auth}), 401, None, None)
        ok = {"Authorization": "Bearer s3cret"}
        assert c.post(COMP, json=body, headers=ok).status_code == 200
        assert c.get("/v1/models", headers=ok).status_code == 200
    # the load generator and the deploy readiness probe send the key from the environment
    with ServerThread(app) as url:
        rows = run_load(url, [2], max_tokens=3, num_prompts_per_level=2, timeout_s=10, progress=False)
        assert rows[0]["failure_reasons"] == {"http_401": 2}
        assert common.probe_ready(url, "fake")[1] == "completion 401"
        monkeypatch.setenv(API_KEY_ENV, "s3cret")
        rows = run_load(url, [2], max_tokens=3, num_prompts_per_level=2, timeout_s=10, progress=False)
        assert rows[0]["valid"] and rows[0]["requests_ok"] == 2
        ok, why, facts = common.probe_ready(url, "fake")
        assert ok and facts["hash_verified"], why


# ---- kernelcamp serve options: one line, exit 2 ------------------------------------------------------------
def _bad_params(tmp_path: Path, kind: str) -> str:
    p = tmp_path / f"{kind}.yaml"
    if kind == "broken":
        p.write_text("server:\n  port: [1, 2\nvariant: {\n")
    elif kind == "binary":
        p.write_bytes(bytes(range(256)) * 4)
    elif kind == "folder":
        p = tmp_path / "a_folder"
        p.mkdir()
    elif kind == "list":
        p.write_text("- 1\n- 2\n")
    elif kind == "good":
        return str(ROOT / "params.yaml")
    elif kind == "bad_port":
        params = load_params(ROOT / "params.yaml")
        params["server"]["port"] = "eighty"
        p.write_text(json.dumps(params))
    elif kind in ("overlap_string", "running_word"):
        # a string where true/false or an integer belongs: bool("false") would have turned overlap on
        params = load_params(ROOT / "params.yaml")
        key, value = ("overlap_scheduling", "false") if kind == "overlap_string" else ("max_running_requests", "abc")
        params["server"][key] = value
        p.write_text(json.dumps(params))
    elif kind == "huge_cache":
        # a page pool of 2**31 - 1 tokens (1.25 TB) on this CPU: torch's allocator's traceback (helper audit B-F4)
        params = load_params(ROOT / "params.yaml")
        params["server"].update(cpu_cache_tokens=2**31 - 1, engine_process=False)
        p.write_text(json.dumps(params))
    return str(p)


CLI_ROWS = [
    ("fake_ttft_abc", ["--fake", "ttft_ms=abc"], "ttft_ms"),
    ("fake_chunk_0", ["--fake", "chunk=0"], "chunk"),
    ("fake_itl_negative", ["--fake", "itl_ms=-5"], "itl_ms"),
    ("fake_itl_nan", ["--fake", "itl_ms=nan"], "itl_ms"),
    ("fake_bool_word", ["--fake", "swap=maybe"], "swap"),
    ("fake_no_value", ["--fake", "chunk"], "chunk"),
    ("fake_unknown_key", ["--fake", "speed=3"], "speed"),
    ("port_99999", ["--fake", "chunk=1", "--port", "99999"], "--port"),
    ("port_0", ["--fake", "chunk=1", "--port", "0"], "--port"),
    ("port_negative", ["--fake", "chunk=1", "--port", "-1"], "--port"),
    ("port_word", ["--fake", "chunk=1", "--port", "http"], "--port"),
    ("device_bogus", ["--params", "@good", "--device", "bogus"], "--device"),
    ("device_cuda_x", ["--params", "@good", "--device", "cuda:x"], "--device"),
    # a GPU this machine lacks: the front spawned its engine process, which failed in three lines, exit 1
    ("device_cuda_99", ["--params", "@good", "--device", "cuda:99"], "--device cuda:99"),
    ("params_broken_yaml", ["--params", "@broken"], "--params"),
    ("params_binary", ["--params", "@binary"], "--params"),
    ("params_folder", ["--params", "@folder"], "--params"),
    ("params_list", ["--params", "@list"], "--params"),
    ("params_missing", ["--params", "/nonexistent/params.yaml"], "--params"),
    ("params_port_word", ["--params", "@bad_port"], "server.port"),
    ("params_overlap_string", ["--params", "@overlap_string"], "server.overlap_scheduling"),
    ("params_running_word", ["--params", "@running_word"], "server.max_running_requests"),
    ("params_huge_cache", ["--params", "@huge_cache", "--device", "cpu"], "out of memory (tried to allocate"),
    # a host that is no address of this machine: the message blamed the port ("pass --port")
    ("host_unresolvable", ["--fake", "chunk=1", "--host", "no-such-host.invalid"], "pass --host"),
    ("host_not_ours", ["--fake", "chunk=1", "--host", "192.0.2.1"], "pass --host"),
    ("api_key_empty", ["--fake", "chunk=1", "--api-key", ""], "--api-key"),
    ("unknown_option", ["--fake", "chunk=1", "--bogus"], "--bogus"),
]


@pytest.mark.parametrize("row", CLI_ROWS, ids=[r[0] for r in CLI_ROWS])
def test_serve_bad_option_is_one_line_exit_2(row, tmp_path):
    _, argv, names = row
    if row[0] == "params_huge_cache" and Path("/proc/sys/vm/overcommit_memory").read_text().strip() == "1":
        pytest.skip("the kernel overcommits every allocation here: 1.25 TB would be granted, then OOM-killed")
    argv = [_bad_params(tmp_path, a[1:]) if a.startswith("@") else a for a in argv]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(API_KEY_ENV, None)
    p = subprocess.run(
        [sys.executable, "-m", "kernelcamp.cli", "serve", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(tmp_path),
        env=env,
    )
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    assert names in lines[0], lines[0]
    assert "Traceback" not in p.stderr + p.stdout and "http://" not in p.stdout


# ---- the bind host ----------------------------------------------------------------------------------------
def _listening(port: int) -> set[str]:
    """Local addresses (hex, as /proc/net/tcp writes them) in LISTEN on ``port``."""
    out = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(name).read_text().splitlines()[1:]
        except OSError:
            continue
        for ln in lines:
            f = ln.split()
            addr, p = f[1].rsplit(":", 1)
            if int(p, 16) == port and f[3] == "0A":
                out.add(addr)
    return out


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="Linux /proc/net/tcp needed")
def test_serve_binds_the_host_given_and_prints_a_usable_url():
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(API_KEY_ENV, None)
    cmd = [sys.executable, "-m", "kernelcamp.cli", "serve", "--fake", "chunk=1", "--host", "0.0.0.0", "--port"]
    proc = subprocess.Popen([*cmd, str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert f"http://127.0.0.1:{port} " in line and "0.0.0.0" in line, line
        deadline = time.monotonic() + 30
        while "00000000" not in _listening(port) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "00000000" in _listening(port), _listening(port)  # the wildcard, not 127.0.0.1 (0100007F)
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "warning: binding 0.0.0.0" in err and "not loopback" in err


@pytest.mark.parametrize(
    "host,url",
    [
        ("0.0.0.0", "http://127.0.0.1:80"),
        ("::", "http://[::1]:80"),
        ("127.0.0.1", "http://127.0.0.1:80"),
        ("::1", "http://[::1]:80"),
        ("10.1.2.3", "http://10.1.2.3:80"),
        ("gpu-box", "http://gpu-box:80"),
    ],
)
def test_client_url(host, url):
    assert client_url(host, 80) == url


def test_embedded_deploy_records_a_client_url_for_a_wildcard_host(tmp_path, monkeypatch, capsys):
    # `-S server.host=0.0.0.0` recorded http://0.0.0.0:port as the deploy's url.
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    seen = {}

    def fake_start(params, host, port, *a, **kw):
        seen["host"], seen["port"] = host, port
        return SimpleNamespace(pid=os.getpid()), 0.1, {"info": {}, "hash_verified": True}

    monkeypatch.setattr(dep, "start_embedded", fake_start)
    p = load_params(ROOT / "params.yaml")
    port = free_port()
    p["server"] = {**p["server"], "host": "0.0.0.0", "port": port}
    p["deploy"] = {"kind": "embedded", "port_free_timeout_s": 1}
    rec = dep.deploy_embedded(p, tmp_path)
    assert seen == {"host": "0.0.0.0", "port": port}  # the server is told to bind what was asked
    assert rec["url"] == f"http://127.0.0.1:{port}"
    assert "not loopback" in capsys.readouterr().err


# ---- ssh deploy: nothing reaches ssh as an option -----------------------------------------------------------
class _NoRunner:
    def run(self, cmd):
        raise AssertionError(f"ssh ran: {cmd}")

    def put(self, local, remote):
        raise AssertionError(f"scp ran: {local} -> {remote}")


SSH_ROWS = [
    ("host_proxycommand", {"host": "-oProxyCommand=touch /tmp/kernelcamp-pwned"}, "deploy.host"),
    ("user_option", {"user": "-oProxyCommand=touch /tmp/kernelcamp-pwned"}, "deploy.user"),
    ("remote_dir_option", {"remote_dir": "-rf"}, "deploy.remote_dir"),
    ("host_blank", {"host": "  "}, "deploy.host"),
    ("host_space", {"host": "a -oProxyCommand=x"}, "deploy.host"),
]


@pytest.mark.parametrize("row", SSH_ROWS, ids=[r[0] for r in SSH_ROWS])
def test_ssh_deploy_refuses_option_like_values(row, tmp_path, monkeypatch):
    _, over, key = row
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    p = load_params(ROOT / "params.yaml")
    p["deploy"] = {
        "kind": "ssh",
        "host": "gpu-box",
        "remote_dir": "/srv/k",
        "restart": "true",
        "url": "http://127.0.0.1:9",
        **over,
    }
    with pytest.raises(KernelcampError) as e:
        dep_ssh.deploy_ssh(p, tmp_path, runner=_NoRunner())
    assert str(e.value).startswith(key + "=") and "\n" not in str(e.value)
    with pytest.raises(KernelcampError, match=key.split(".")[1]):
        dep_ssh.SshRunner(p["deploy"]["host"], user=p["deploy"].get("user")).put("x", p["deploy"]["remote_dir"] + "/f")


def test_ssh_and_scp_end_options_before_the_destination(monkeypatch):
    argvs = []
    monkeypatch.setattr(
        dep_ssh.subprocess, "run", lambda argv, **kw: argvs.append(argv) or SimpleNamespace(returncode=0)
    )
    r = dep_ssh.SshRunner("gpu-box", user="me", options=["-o", "LogLevel=ERROR"])
    r.run("true")
    r.put("kernel.py", "/srv/k/kernel.py")
    ssh, scp = argvs
    assert ssh[ssh.index("--") + 1 :] == ["me@gpu-box", "true"]
    assert scp[scp.index("--") + 1 :] == ["kernel.py", "me@gpu-box:/srv/k/kernel.py"]
    assert "LogLevel=ERROR" in ssh[: ssh.index("--")]
    with pytest.raises(KernelcampError, match="remote_dir"):
        r.put("kernel.py", "-oProxyCommand=x")


# ---- found by review (2026-12-01) ----------------------------------------------------------------


@pytest.mark.parametrize(
    "body,param",
    [
        ({"prompt": "x", "max_tokens": 10**23}, "max_tokens"),
        ({"prompt": "x", "max_tokens": 2, "temperature": float("nan")}, "temperature"),
        ({"prompt": "x", "max_tokens": 2, "top_p": float("inf")}, "top_p"),
    ],
    ids=["huge-max-tokens", "nan-temperature", "inf-top-p"],
)
def test_review_bodies_are_400(body: dict, param: str) -> None:
    import json as _json

    from fastapi.testclient import TestClient

    from kernelcamp.serve.fake import FakeSpec, make_fake_app

    with TestClient(make_fake_app(FakeSpec(ttft_ms=1, itl_ms=1))) as c:
        # NaN/inf are not JSON: send them as Python's json writes them, as a careless client would
        r = c.post("/v1/completions", content=_json.dumps(body), headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert param in r.text


def test_trace_store_keeps_files_that_are_not_its_traces(tmp_path) -> None:
    from kernelcamp.serve.server import TraceStore

    for i in range(9):
        (tmp_path / f"user{i}.json.gz").write_bytes(b"mine")
    store = TraceStore(tmp_path, keep=2)
    for _ in range(4):
        store.new()[1].write_bytes(b"trace")
    assert len(list(tmp_path.glob("user*.json.gz"))) == 9
    assert store.path("0" * 32 + "\n") is None  # "$" let a trailing newline through


@pytest.mark.parametrize("key", ["", "  ", " k "])
def test_blank_or_padded_api_key_in_the_environment_is_refused(key: str, monkeypatch, capsys) -> None:
    from kernelcamp.cli import main

    monkeypatch.setenv("KERNELCAMP_API_KEY", key)
    assert main(["serve", "--fake", "ttft_ms=1", "--port", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: KERNELCAMP_API_KEY: empty or with surrounding spaces")


@pytest.mark.parametrize(
    "method,path,status",
    [("GET", "/nope", 404), ("POST", "/v1/kernelcamp/profile", 404), ("GET", "/v1/completions", 405)],
)
def test_routing_errors_are_openai_shaped(method: str, path: str, status: int) -> None:
    from fastapi.testclient import TestClient

    from kernelcamp.serve.fake import FakeSpec, make_fake_app

    with TestClient(make_fake_app(FakeSpec(ttft_ms=1, itl_ms=1))) as c:
        r = c.request(method, path, json={} if method == "POST" else None)
    assert r.status_code == status
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}  # was FastAPI's {"detail": ...}


# ---- body size: a huge body is refused before it is read whole -----------------------------------------
def test_a_body_over_the_limit_is_413_and_the_server_goes_on(real, fake):
    """Before: a 150 MB prompt was read and parsed on the event loop that streams every other request's
    tokens (about 15 s on this CPU), then refused. Now 413 from the declared length, before any read."""
    from kernelcamp.serve.openai import MAX_BODY_BYTES

    big = json.dumps({"prompt": "x" * MAX_BODY_BYTES, "max_tokens": 2}).encode()
    for c in (real, fake):
        err = _assert_openai_error(c.post(COMP, content=big, headers=JSON), 413, None, "request_too_large")
        assert str(MAX_BODY_BYTES) in err["message"]
        assert c.post(COMP, json={"prompt": "x", "max_tokens": 2}).status_code == 200


def test_a_chunked_body_over_the_limit_is_413_on_a_live_server():
    """No Content-Length (a chunked upload): refused once the bytes read pass the limit; with one, before
    the body is read; a body within it still reaches the handler whole, and the server answers the next
    request."""
    from kernelcamp.serve.openai import MAX_BODY_BYTES

    def chunks(total):
        yield b'{"prompt": "'
        sent = 0
        while sent < total:
            yield b"x" * 65536
            sent += 65536
        yield b'", "max_tokens": 2}'

    with ServerThread(make_fake_app(FakeSpec())) as url:
        r = httpx.post(url + COMP, content=chunks(MAX_BODY_BYTES + 65536), headers=JSON, timeout=60)
        _assert_openai_error(r, 413, None, "request_too_large")
        declared = b"".join(chunks(MAX_BODY_BYTES + 65536))  # with its Content-Length, through uvicorn
        _assert_openai_error(httpx.post(url + COMP, content=declared, headers=JSON, timeout=60), 413, None, None)
        r = httpx.post(url + COMP, content=chunks(1 << 20), headers=JSON, timeout=60)
        assert r.status_code == 200 and r.json()["choices"][0]["text"], r.text

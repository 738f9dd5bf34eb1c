"""The embedded server on loopback with the small CPU model: OpenAI endpoints, info, benchmark and
verify through the library functions the stages call."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from kernelcamp.bench.serving import serving_benchmark
from kernelcamp.errors import KernelcampError
from kernelcamp.hashes import params_variant_hash
from kernelcamp.io import load_params
from kernelcamp.loadgen import run_load
from kernelcamp.serve.model import encode, token_text
from kernelcamp.serve.server import build_state, make_app
from kernelcamp.serve.testing import ServerThread
from kernelcamp.verify.serving import serving_verify

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def params():
    p = load_params(ROOT / "params.yaml")
    p["server"] = {**p["server"], "max_running_requests": 8}
    return p


@pytest.fixture(scope="module")
def server(params):
    with ServerThread(make_app(build_state(params, "cpu"))) as url:
        yield url


def test_completion_and_chat(server):
    with httpx.Client(base_url=server, timeout=60) as c:
        assert c.get("/health").status_code == 200
        assert c.get("/v1/models").json()["data"][0]["id"]
        r = c.post("/v1/completions", json={"prompt": "hello world", "max_tokens": 5}).json()
        assert r["object"] == "text_completion" and r["usage"] == {
            "prompt_tokens": 2,
            "completion_tokens": 5,
            "total_tokens": 7,
        }
        assert len(r["choices"][0]["text"].split()) == 5
        again = c.post("/v1/completions", json={"prompt": "hello world", "max_tokens": 5}).json()
        assert again["choices"][0]["text"] == r["choices"][0]["text"]  # greedy: deterministic
        chat = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        body = chat.json()
        assert body["object"] == "chat.completion" and body["choices"][0]["message"]["role"] == "assistant"
        assert body["usage"]["completion_tokens"] == 3
        assert c.post("/v1/completions", json={"prompt": "x", "max_tokens": 0}).status_code == 400


@pytest.mark.parametrize("chat", [False, True])
def test_streamed(server, chat):
    path = "/v1/chat/completions" if chat else "/v1/completions"
    req = {"max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}}
    req.update({"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "hi"})
    chunks = []
    with httpx.Client(base_url=server, timeout=60) as c, c.stream("POST", path, json=req) as s:
        assert s.status_code == 200
        for line in s.iter_lines():
            if line.startswith("data: "):
                chunks.append(line[6:])
    assert chunks[-1] == "[DONE]"
    objs = [json.loads(x) for x in chunks[:-1]]
    assert sum(o.get("kernelcamp_tokens", 0) for o in objs) == 4
    assert objs[-1]["usage"]["completion_tokens"] == 4
    assert any(o["choices"] and o["choices"][0]["finish_reason"] == "length" for o in objs)
    text = "".join(
        (o["choices"][0].get("delta", {}).get("content") or "") if chat else o["choices"][0]["text"]
        for o in objs
        if o["choices"]
    )
    assert len(text.split()) == 4


def test_info_reports_hash_and_steps(server, params):
    with httpx.Client(base_url=server, timeout=60) as c:
        c.post("/v1/completions", json={"prompt": "a b c", "max_tokens": 3})
        info = c.get("/v1/kernelcamp/info").json()
    assert info["variant_hash"] == params_variant_hash(params)
    assert info["variant_name"] == params["variant"]["name"]
    assert info["attention_impl"] == "torch_reference_cpu"
    assert info["server_flags"]["max_running_requests"] == 8
    assert info["counts"]["decode_steps"] >= 2
    dec = [s for s in info["steps"] if s["kind"] == "decode"]
    assert dec and all(s["batch"] >= 1 and s["step_ms"] > 0 for s in dec)
    assert 0 < info["attention_share_live"] < 1
    assert info["attention_share"]["calibration"]


@pytest.mark.slow  # > 9 s on 2 cores: `make test-slow` (CI runs both)
def test_load_benchmark_and_verify(server, params):
    rows = run_load(server, [4, 1], max_tokens=6, num_prompts_per_level=8, timeout_s=60, progress=False)
    assert all(r["valid"] and r["requests_ok"] == 8 for r in rows)
    record = {"kind": "embedded", "url": server, "variant_hash": params_variant_hash(params), "deploy_id": "t"}
    res = serving_benchmark(params, record, progress=False)
    assert res["scaled_for_cpu"] and res["all_levels_valid"] and res["hash_checked"]
    assert set(res["step_model"]) >= {"a_ms", "b_ms_per_req", "r2", "n_points"}
    p = {**params, "verify": {"serving": {"concurrency": 4, "num_prompts": 8, "max_tokens": 6}}}
    v = serving_verify(p, record)
    assert v["passed"], v
    with pytest.raises(KernelcampError, match="refusing to measure"):
        serving_benchmark(params, {**record, "variant_hash": "0" * 16}, progress=False)


def test_tokenizer_documented_rules():
    assert encode("", 100) == [1]
    ids = encode("a b a", 100)
    assert ids[0] == ids[2] and all(1 <= i < 100 for i in ids)
    assert len({token_text(i) for i in range(5000)}) == 5000


def test_serve_on_a_busy_port_is_one_clear_line_before_any_url(capsys):
    # `kernelcamp serve --port <busy>` printed its URL, then uvicorn failed to bind and it exited 1.
    import socket

    from kernelcamp.cli import main

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        rc = main(["serve", "--fake", "ttft_ms=1,itl_ms=1", "--port", str(port)])
    cap = capsys.readouterr()
    assert rc == 2
    assert f"cannot listen on 127.0.0.1:{port}" in cap.err and "pass --port" in cap.err
    assert "http://" not in cap.out + cap.err, "no URL may be printed for a server that never listens"

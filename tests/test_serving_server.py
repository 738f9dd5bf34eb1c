"""The embedded server on loopback with the small CPU model: OpenAI endpoints, info, benchmark and
verify through the library functions the stages call; the scheduler's model thread (steps run while
the event loop is busy, a disconnected stream frees its pages, an engine error reaches every request)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from kernelcamp.bench.serving import serving_benchmark
from kernelcamp.errors import KernelcampError
from kernelcamp.hashes import params_variant_hash
from kernelcamp.io import load_params
from kernelcamp.loadgen import run_load
from kernelcamp.serve.server import build_state, make_app
from kernelcamp.serve.testing import ServerThread, post_and_leave
from kernelcamp.serve.tokens import encode, token_text
from kernelcamp.verify.serving import serving_verify

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def params():
    p = load_params(ROOT / "params.yaml")
    p["server"] = {**p["server"], "max_running_requests": 8}
    return p


INFO = "/v1/kernelcamp/info"


def _add_loop_blocker(app) -> None:
    """Test-only route: hold the server's event loop for ``seconds`` (as a burst of SSE writes would)."""

    @app.get("/test/block-event-loop")
    async def block(seconds: float):
        t0 = time.time()
        time.sleep(seconds)  # synchronous on purpose: nothing else runs on this event loop meanwhile
        return {"t0": t0, "t1": time.time()}


@pytest.fixture(scope="module")
def server(params):
    app = make_app(build_state(params, "cpu"))
    _add_loop_blocker(app)
    with ServerThread(app) as url:
        yield url


def _stream(url: str, prompt: str, max_tokens: int, out: list) -> None:
    """One streamed completion to the end; appends the number of tokens received (or the exception)."""
    try:
        n = 0
        with httpx.Client(base_url=url, timeout=60) as c:
            req = {"prompt": prompt, "max_tokens": max_tokens, "stream": True}
            with c.stream("POST", "/v1/completions", json=req) as s:
                for line in s.iter_lines():
                    if line.startswith("data: {"):
                        n += json.loads(line[6:]).get("kernelcamp_tokens", 0)
        out.append(n)
    except Exception as e:  # noqa: BLE001 - the test asserts on it
        out.append(e)


def _wait_counts(c: httpx.Client, ok, what: str, timeout_s: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        counts = c.get(INFO, params={"steps": 0}).json()["counts"]
        if ok(counts):
            return counts
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s; counts {counts}"
        time.sleep(0.02)


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


def test_step_records_state_kind_bucket_and_no_gpu_time_on_a_cpu(server):
    # Issue 12: the noise probe splits a decode step into GPU time and the rest, per padded bucket.
    with httpx.Client(base_url=server, timeout=60) as c:
        since = c.get(INFO, params={"steps": 0}).json()["counts"]["step_index"]
        c.post("/v1/completions", json={"prompt": "one lone request", "max_tokens": 4})
        steps = c.get(INFO, params={"since": since}).json()["steps"]
    assert [s["kind"] for s in steps] == ["prefill"] + ["decode"] * 3, steps
    assert steps[0]["bucket"] is None and "gpu_ms" not in steps[0]
    dec = steps[1:]
    assert [s["bucket"] for s in dec] == [s["batch"] for s in dec] == [1, 1, 1]  # eager on a CPU: no padding
    assert [s["gpu_ms"] for s in dec] == [None] * 3 and [s["launch_ms"] for s in dec] == [None] * 3
    assert all(0 < s["load_ms"] + s["sync_ms"] < s["step_ms"] for s in dec)  # host parts of the step, in it
    assert [s["prefills"] for s in dec] == [1, 0, 0]  # the prefill ran before the first decode step only
    assert all(s["step_ms"] > 0 for s in dec)


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


def test_decode_steps_run_while_the_event_loop_is_blocked(server):
    # Issue 12: the scheduler awaited every step on the HTTP event loop, so while the loop was busy
    # (SSE writes at high token rates) no step ran. Steps now run back to back on the model thread.
    done: list = []
    ths = [threading.Thread(target=_stream, args=(server, f"blocked {i}", 120, done)) for i in range(4)]
    for t in ths:
        t.start()
    with httpx.Client(base_url=server, timeout=60) as c:
        counts = _wait_counts(c, lambda k: k["running"] == 4, "4 requests running")
        since = counts["step_index"]
        w = c.get("/test/block-event-loop", params={"seconds": 0.4}).json()
        steps = c.get(INFO, params={"since": since}).json()["steps"]
    for t in ths:
        t.join(timeout=60)
    inside = [s for s in steps if s["kind"] == "decode" and w["t0"] < s["t"] < w["t1"]]
    assert len(inside) >= 3, (
        f"{len(inside)} decode steps ran during the {w['t1'] - w['t0']:.2f} s the event loop was blocked "
        f"(steps since index {since}: {[(s['index'], s['kind'], s['t']) for s in steps][:8]} ...)"
    )
    assert done == [120] * 4, done


def test_tokens_that_queued_while_the_event_loop_was_busy_leave_as_one_chunk(server):
    # Issue 12: one SSE chunk per token kept a busy event loop busy (and the model thread waiting for
    # the GIL); the tokens of the steps that ran meanwhile now go out together, counted in the chunk.
    chunks: list[tuple[int, str]] = []

    def stream() -> None:
        with httpx.Client(base_url=server, timeout=60) as c:
            req = {"prompt": "coalesce me", "max_tokens": 120, "stream": True}
            with c.stream("POST", "/v1/completions", json=req) as s:
                for line in s.iter_lines():
                    if line.startswith("data: {"):
                        o = json.loads(line[6:])
                        if o["choices"] and o.get("kernelcamp_tokens"):
                            chunks.append((o["kernelcamp_tokens"], o["choices"][0]["text"]))

    th = threading.Thread(target=stream)
    th.start()
    with httpx.Client(base_url=server, timeout=60) as c:
        _wait_counts(c, lambda k: k["running"] == 1, "the request running")
        c.get("/test/block-event-loop", params={"seconds": 0.4})
        th.join(timeout=60)
        whole = c.post("/v1/completions", json={"prompt": "coalesce me", "max_tokens": 120}).json()
    assert sum(k for k, _ in chunks) == 120
    assert max(k for k, _ in chunks) > 1, chunks[:10]
    assert all(len(t.split()) == k for k, t in chunks)
    assert "".join(t for _, t in chunks) == whole["choices"][0]["text"]


def test_info_reports_the_http_stack_it_runs(server):
    from kernelcamp.serve.server import http_stack

    with httpx.Client(base_url=server, timeout=60) as c:
        assert c.get(INFO, params={"steps": 0}).json()["http_stack"] == http_stack()


def test_a_disconnected_stream_frees_its_pages(server):
    with httpx.Client(base_url=server, timeout=60) as c:
        before = _wait_counts(c, lambda k: k["running"] == 0 and k["waiting"] == 0, "server idle")
        req = {"prompt": "cut short", "max_tokens": 1500, "stream": True}
        with c.stream("POST", "/v1/completions", json=req) as s:
            got = 0
            for line in s.iter_lines():
                got += line.startswith("data: {")
                if got == 3:
                    break  # leaving the block closes the connection mid-stream
        after = _wait_counts(
            c, lambda k: k["requests_cancelled"] > before["requests_cancelled"], "the request cancelled"
        )
        assert after["running"] == 0 and after["free_pages"] == before["free_pages"], (before, after)
        assert after["tokens_generated"] - before["tokens_generated"] < 1500


def test_non_streamed_requests_whose_clients_left_are_cancelled(server):
    """Before: a non-streamed completion (or chat) whose client closed its socket 50 ms after sending was
    decoded to its end (requests_finished +1, requests_cancelled +0, its pages held meanwhile); now the
    disconnect cancels it, as a streamed one's does."""
    max_tokens = 1500  # tens of seconds at batch 6 on a 2-core CPU: far longer than the wait for the cancel
    with httpx.Client(base_url=server, timeout=60) as c:
        before = _wait_counts(c, lambda k: k["running"] == 0 and k["waiting"] == 0, "server idle")
        for i in range(3):
            body = {"prompt": f"left {i}", "max_tokens": max_tokens}
            post_and_leave(server, "/v1/completions", json.dumps(body).encode())
            chat = {"messages": [{"role": "user", "content": f"left {i}"}], "max_tokens": max_tokens}
            post_and_leave(server, "/v1/chat/completions", json.dumps(chat).encode())
        after = _wait_counts(
            c,
            lambda k: k["requests_cancelled"] >= before["requests_cancelled"] + 6 and k["running"] == 0,
            "the six requests cancelled",
        )
    assert after["requests_finished"] == before["requests_finished"], (before, after)
    assert after["free_pages"] == before["free_pages"], (before, after)
    assert after["tokens_generated"] - before["tokens_generated"] < 6 * max_tokens // 2, (before, after)


def test_a_request_cancelled_while_it_waits_is_counted_as_cancelled():
    """A request whose client left before the engine admitted it was dropped from the waiting queue uncounted: the
    info endpoint's requests_total then stayed above requests_finished + requests_cancelled with nothing running or
    waiting (two cancellation tests failed in CI on 2026-12-07 reading it)."""
    from kernelcamp.serve.server import Engine

    class NoPages:  # admission never reaches the model: the request is cancelled first
        cfg = type("Cfg", (), {"max_context_tokens": 64})()

        def alloc(self, n):
            raise AssertionError("a cancelled request was admitted")

    engine = Engine(NoPages(), max_running=4)
    r = engine.submit([1, 2, 3], 8)
    engine.cancel(r)
    engine._admit()
    k = engine.counts
    assert (k["requests_total"], k["requests_cancelled"], k["requests_finished"]) == (1, 1, 0), k
    assert not engine.waiting and not engine.running


def test_an_engine_error_reaches_every_request_and_the_thread_ends(params):
    state = build_state({**params, "server": {**params["server"], "max_running_requests": 3}}, "cpu")
    model, go = state.engine.model, threading.Event()
    collect = model.collect  # the server runs a decode step as launch + collect; a GPU fault surfaces here

    def failing_collect(*a, **kw):
        if go.is_set():
            raise RuntimeError("planted decode failure")
        return collect(*a, **kw)

    model.collect = failing_collect
    threads_before = set(threading.enumerate())
    with ServerThread(make_app(state)) as url, httpx.Client(base_url=url, timeout=60) as c:
        streamed: list = []
        plain: list = []

        def post(i: int) -> None:
            plain.append(httpx.post(url + "/v1/completions", json={"prompt": f"p {i}", "max_tokens": 400}, timeout=60))

        def stream() -> None:
            req = {"prompt": "s", "max_tokens": 400, "stream": True}
            with httpx.stream("POST", url + "/v1/completions", json=req, timeout=60) as s:
                streamed.extend(line[len("data: ") :] for line in s.iter_lines() if line.startswith("data: "))

        ths = [threading.Thread(target=stream)]
        ths += [threading.Thread(target=post, args=(i,)) for i in range(4)]  # 3 run, 2 wait (max_running 3)
        for t in ths:
            t.start()
        _wait_counts(c, lambda k: k["running"] == 3 and k["waiting"] == 2, "3 running, 2 waiting")
        go.set()
        for t in ths:
            t.join(timeout=60)
        # the stream ends with an error event naming the failure, then [DONE] (it had broken off)
        assert streamed[-1] == "[DONE]" and "planted decode failure" in json.loads(streamed[-2])["error"]["message"]
        assert [r.status_code for r in plain] == [500] * 4
        assert all("planted decode failure" in r.json()["error"]["message"] for r in plain)
        health = c.get("/health")
        assert health.status_code == 500 and "planted decode failure" in health.json()["error"]
        assert "planted decode failure" in c.get(INFO).json()["engine_error"]
        # a request that arrives after the failure is refused at once, not left waiting forever
        late = c.post("/v1/completions", json={"prompt": "late", "max_tokens": 2}, timeout=10)
        assert late.status_code == 500 and "planted decode failure" in late.json()["error"]["message"]
    left = [t.name for t in set(threading.enumerate()) - threads_before if t.name.startswith("kernelcamp-model")]
    assert not left, f"model threads still running after shutdown: {left}"


def test_a_page_pool_smaller_than_one_full_context_is_refused_at_build(params):
    # server.num_cache_tokens below server.max_context_tokens: a request the context allows could never
    # get its pages and would wait forever; the server refuses the configuration before it serves
    server = {**params["server"], "num_cache_tokens": 256, "cpu_cache_tokens": 256, "max_context_tokens": 2048}
    with pytest.raises(KernelcampError, match=r"page pool of 256 tokens .* server\.max_context_tokens=2048 needs"):
        build_state({**params, "server": server}, "cpu")
    # a pool that holds one full-context request (plus the trash page) builds
    ok = {**server, "num_cache_tokens": 2048 + 64, "cpu_cache_tokens": 2048 + 64}
    assert build_state({**params, "server": ok}, "cpu") is not None


def test_overlap_scheduling_flag_reaches_the_engine_and_info(params):
    # server.overlap_scheduling: the embedded engine's hand-off overlap (off by default), in /info
    for flag in (False, True):
        state = build_state({**params, "server": {**params["server"], "overlap_scheduling": flag}}, "cpu")
        assert state.engine.overlap_active is flag
        with ServerThread(make_app(state)) as url:
            assert httpx.get(url + INFO, params={"steps": 0}).json()["overlap_scheduling_active"] is flag


def test_server_flags_refuse_strings_where_bools_or_ints_belong():
    from kernelcamp.hashes import server_flags

    assert server_flags({"overlap_scheduling": False})["overlap_scheduling"] is False
    for key, value in (("overlap_scheduling", "false"), ("cuda_graphs", "no"), ("max_running_requests", "8")):
        with pytest.raises(KernelcampError, match=f"server.{key} = "):
            server_flags({key: value})
    with pytest.raises(KernelcampError, match="graph_batch_buckets"):
        server_flags({"graph_batch_buckets": [1, "2"]})


@pytest.mark.parametrize("prefix", ["engine error: ", ""])
def test_a_stream_the_engine_fails_ends_with_an_error_event(prefix):
    """A model step's error (the in-process engine's exception, the engine process's per-request error line) broke
    the stream off after its first chunks; only a dead engine process gave the error event. Now every failure of a
    started stream ends it with ``data: {"error": ...}`` and ``[DONE]``, as vLLM's do."""
    import asyncio
    import json

    from kernelcamp.serve.openai import CompletionRequest, _completion_response

    async def batches():
        yield [1, 2]
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    async def body() -> list[str]:
        req = CompletionRequest(prompt="x", max_tokens=8, stream=True)
        resp = await _completion_response("r1", False, req, 1, batches(), error_prefix=prefix)
        return [(c if isinstance(c, bytes) else c.encode()).decode() async for c in resp.body_iterator]

    events = [e[len("data: ") :] for e in "".join(asyncio.run(body())).split("\n\n") if e]
    assert events[-1] == "[DONE]" and json.loads(events[0])["choices"][0]["text"]
    err = json.loads(events[-2])["error"]
    assert err["message"] == f"{prefix}CUDA error: an illegal memory access was encountered" and err["code"] == 500

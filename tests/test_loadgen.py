"""Load generator metrics against known right values: synthetic records (exact) and the fixed-rate
fake server (timing within tolerance), failures kept out of throughput, invalid levels marked."""

from __future__ import annotations

import pytest

from kernelcamp.loadgen import RequestResult, level_metrics, run_level, run_load
from kernelcamp.serve.fake import FakeSpec, make_fake_app
from kernelcamp.serve.testing import ServerThread


def _req(i, start, ttft, gap, tokens, chunk, status="ok"):
    r = RequestResult(i, status=status, start=start)
    t = start + ttft
    for done in range(0, tokens, chunk):
        r.chunks.append((t, min(chunk, tokens - done)))
        t += gap * chunk
    r.end = r.chunks[-1][0] if r.chunks else start + ttft
    return r


@pytest.mark.parametrize("chunk", [1, 2, 4])
def test_metrics_exact_on_synthetic_records(chunk):
    # 8 tokens: ttft 0.1 s, one chunk of `chunk` tokens every chunk*0.01 s.
    rs = [_req(i, start=float(i), ttft=0.1, gap=0.01, tokens=8, chunk=chunk) for i in range(3)]
    row = level_metrics(rs, concurrency=3, max_tokens=8, wall_s=2.0)
    e2e = 0.1 + (8 - chunk) * 0.01
    assert row["requests_ok"] == 3 and row["requests_failed"] == 0 and row["valid"]
    assert row["ttft_ms_p50"] == pytest.approx(100.0)
    assert row["itl_ms_mean"] == pytest.approx(10.0)
    assert row["itl_ms_p99"] == pytest.approx(10.0)
    assert row["e2e_ms_p50"] == pytest.approx(e2e * 1e3)
    assert row["tpot_ms_p50"] == pytest.approx((e2e - 0.1) / 7 * 1e3)
    assert row["output_tokens"] == 24 and row["output_tok_s"] == pytest.approx(12.0)
    assert row["per_request_tok_s"] == pytest.approx(8 / e2e)


def test_failures_excluded_from_throughput_and_level_invalid():
    rs = [_req(0, 0.0, 0.1, 0.01, 8, 1), _req(1, 0.0, 0.1, 0.01, 8, 1)]
    rs += [
        RequestResult(2, status="http_500", start=0.0, end=0.1),
        RequestResult(3, status="timeout", start=0, end=1),
        RequestResult(4, status="zero_tokens", start=0.0, end=0.2),
        RequestResult(5, status="incomplete", start=0),
    ]
    row = level_metrics(rs, concurrency=6, max_tokens=8, wall_s=1.0)
    assert (row["requests_ok"], row["requests_failed"], row["incomplete"]) == (2, 3, 1)
    assert row["valid"] is False
    assert row["output_tokens"] == 16 and row["output_tok_s"] == pytest.approx(16.0)
    assert row["failure_reasons"] == {"http_500": 1, "timeout": 1, "zero_tokens": 1, "incomplete": 1}


@pytest.mark.parametrize("chunk", [1, 3])
def test_fixed_rate_server_known_values(chunk):
    ttft, itl, n = 80.0, 15.0, 12
    with ServerThread(make_fake_app(FakeSpec(ttft_ms=ttft, itl_ms=itl, chunk=chunk))) as url:
        rows = run_load(url, [2], max_tokens=n, num_prompts_per_level=4, timeout_s=10, progress=False)
    row = rows[0]
    e2e = ttft + (n - chunk) * itl
    assert row["valid"] and row["requests_ok"] == 4 and row["output_tokens"] == 4 * n
    # Sleeps only ever overshoot; the upper slack covers scheduling noise of two event loops in one process.
    assert ttft - 1 <= row["ttft_ms_p50"] <= ttft + 25
    assert itl * 0.9 <= row["itl_ms_mean"] <= itl * 1.35
    assert e2e - 1 <= row["e2e_ms_p50"] <= e2e + 40
    tpot = (e2e - ttft) / (n - 1)
    assert tpot * 0.85 <= row["tpot_ms_p50"] <= tpot * 1.35
    assert row["output_tok_s"] == pytest.approx(row["output_tokens"] / row["wall_s"])
    assert row["wall_s"] >= 2 * e2e / 1e3  # 4 requests, 2 at a time


def test_foreign_server_usage_apportioned():
    # No per-chunk counts: 1 per content chunk, then the final usage (12) apportioned over 4 chunks.
    with ServerThread(make_fake_app(FakeSpec(ttft_ms=10, itl_ms=10, chunk=3, usage_only=True))) as url:
        rows = run_load(url, [1], max_tokens=12, num_prompts_per_level=2, timeout_s=10, progress=False)
    row = rows[0]
    assert row["valid"] and row["output_tokens"] == pytest.approx(24)
    assert 9 <= row["itl_ms_mean"] <= 14


def test_failures_timeouts_empty_broken_counted():
    spec = FakeSpec(ttft_ms=5, itl_ms=1, fail_every=3, empty_every=4, broken_every=5, hang_every=7)
    with ServerThread(make_fake_app(spec)) as url:
        import asyncio

        row, results = asyncio.run(run_level(url, ["p"], 1, max_tokens=6, num_requests=8, timeout_s=1.0))
    # Request numbers 1..8 in order (concurrency 1): 3, 6 -> 500; 4, 8 -> empty; 5 -> broken; 7 -> hang.
    assert [r.status for r in results] == [
        "ok",
        "ok",
        "http_500",
        "zero_tokens",
        "broken_stream",
        "http_500",
        "timeout",
        "zero_tokens",
    ]
    assert (row["requests_ok"], row["requests_failed"]) == (2, 6)
    assert row["valid"] is False
    assert row["output_tokens"] == 12
    assert row["output_tok_s"] == pytest.approx(12 / row["wall_s"])


@pytest.mark.parametrize(
    "chunk", ["[1, 2]", '"hello"', "null", '{"kernelcamp_tokens": "3"}', '{"choices": 5}', '{"choices": [{"text": 5}]}']
)
def test_a_stream_of_json_that_is_not_a_chunk_fails_the_request_not_the_worker(chunk):
    """`data: [1,2]` (or a chunk of another shape) raised AttributeError in the worker task: the level
    showed `pending` requests and its worker sent no more. Each such request is now broken_stream."""
    import asyncio

    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    app = FastAPI()

    @app.post("/v1/completions")
    async def complete():
        async def body():
            yield f"data: {chunk}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(body(), media_type="text/event-stream")

    with ServerThread(app) as url:
        row, results = asyncio.run(run_level(url, ["p"], 1, max_tokens=4, num_requests=3, timeout_s=5.0))
    assert [r.status for r in results] == ["broken_stream"] * 3  # every request sent and counted
    assert row["requests_failed"] == 3 and row["valid"] is False


def test_an_error_event_in_the_stream_fails_the_request_with_its_message():
    """vLLM ends a stream whose request failed after the 200 with ``data: {"error": ...}`` and ``[DONE]``: loadgen
    took that for a clean end (an incomplete request, its reason lost). It is now a failure, ``stream_error``."""
    import asyncio
    import json

    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    app = FastAPI()

    @app.post("/v1/completions")
    async def complete():
        async def body():
            yield b'data: {"choices": [{"index": 0, "text": "a", "finish_reason": null}]}\n\n'
            err = {"error": {"message": "engine error: gone", "type": "server_error", "param": None, "code": 500}}
            yield f"data: {json.dumps(err)}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(body(), media_type="text/event-stream")

    with ServerThread(app) as url:
        row, results = asyncio.run(run_level(url, ["p"], 1, max_tokens=4, num_requests=2, timeout_s=5.0))
    assert [(r.status, r.error) for r in results] == [("stream_error", "engine error: gone")] * 2
    assert row["requests_failed"] == 2 and row["failure_reasons"] == {"stream_error": 2} and row["valid"] is False
    # the reason's message reaches the record and the printed line (it had been kept on the request record only)
    from kernelcamp.loadgen import progress_line

    assert row["failure_messages"] == {"stream_error": "engine error: gone"}
    assert "INVALID {'stream_error': 2} (stream_error: engine error: gone)" in progress_line(row)


def test_a_malformed_url_is_one_line():
    from kernelcamp.errors import KernelcampError
    from kernelcamp.loadgen import base_url

    with pytest.raises(KernelcampError, match=r"--url 'http://\[::1': Invalid IPv6 URL"):
        base_url("http://[::1")

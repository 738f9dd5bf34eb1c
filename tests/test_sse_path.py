"""The embedded server's per-token streaming path (issue 12: the event loop's time per streamed token
is time the model thread waits for the GIL): SSE frames spliced from a per-stream template are the
same bytes as the dict-built ones, tokens queued while the event loop was busy leave as one chunk,
and info reports the HTTP parser and loop the server ran with."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest

from kernelcamp.serve.openai import _chunk, _Frames, _sse, _stream_tokens
from kernelcamp.serve.server import Engine, _Req, http_stack


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("counts", [True, False])
def test_spliced_frames_are_the_dict_built_bytes(chat, counts):
    f = _Frames("cmpl-0123456789abcdef", chat, counts, 1764547200)
    for text, k in [(" ba", 1), (' q"\\ é\n\u0000x </', 3), ("", 0), (" zu" * 40, 40)]:
        want = _sse(_chunk("cmpl-0123456789abcdef", chat, text, k if counts else None, None, False, 1764547200))
        assert f.text(text, k) == want


@pytest.mark.parametrize("chat", [False, True])
def test_a_stream_has_one_created_time_and_the_role_in_its_first_chunk_only(chat, monkeypatch):
    clock = iter(range(1000, 2000, 7))  # a clock that moves at every read
    monkeypatch.setattr("kernelcamp.serve.openai.time.time", lambda: next(clock))

    async def pieces():
        for p in [(" a", 1), (" b c", 2), (" d", 1)]:
            yield p

    async def body():
        return [x async for x in _stream_tokens("chatcmpl-x", chat, 5, pieces(), include_usage=True)]

    frames = asyncio.run(body())
    assert frames[-1] == b"data: [DONE]\n\n"
    objs = [json.loads(x[6:]) for x in frames[:-1]]
    assert {o["created"] for o in objs} == {1000}
    assert [o.get("kernelcamp_tokens") for o in objs[:4]] == [1, 2, 1, 0]
    assert objs[-1]["usage"]["completion_tokens"] == 4
    if chat:
        assert [o["choices"][0]["delta"].get("role") for o in objs[:4]] == ["assistant", None, None, None]


def _batches(items: list) -> tuple[list, BaseException | None]:
    eng = Engine(None, 1)

    async def run():
        r = _Req([1, 2], 10, asyncio.Queue())
        for x in items:
            r.queue.put_nowait(x)
        got = []
        try:
            async for b in eng.token_batches(r):
                got.append(b)
        except Exception as e:  # noqa: BLE001 - the test looks at it
            return got, e
        return got, None

    return asyncio.run(run())


def test_queued_tokens_come_as_one_batch_and_an_error_after_them():
    assert _batches([5, 6, 7, None]) == ([[5, 6, 7]], None)
    got, exc = _batches([5, 6, RuntimeError("step failed"), 9])
    assert got == [[5, 6]] and isinstance(exc, RuntimeError)
    assert _batches([None]) == ([], None)


def test_token_batches_follow_the_queue_as_it_fills():
    eng = Engine(None, 1)

    async def run():
        r = _Req([1], 4, asyncio.Queue())
        got = []
        gen = eng.token_batches(r)
        r.queue.put_nowait(1)
        got.append(await gen.__anext__())
        r.queue.put_nowait(2)
        r.queue.put_nowait(3)
        got.append(await gen.__anext__())
        r.queue.put_nowait(4)
        r.generated = [1, 2, 3, 4]  # as the model thread had written them
        r.queue.put_nowait(None)
        got.append(await gen.__anext__())
        with pytest.raises(StopAsyncIteration):
            await gen.__anext__()
        return got, r.cancelled

    got, cancelled = asyncio.run(run())
    assert got == [[1], [2, 3], [4]] and cancelled is False


def test_a_stream_left_early_marks_its_request_cancelled():
    eng = Engine(None, 1)

    async def run():
        r = _Req([1], 4, asyncio.Queue())
        r.queue.put_nowait(1)
        async with contextlib.aclosing(eng.tokens(r)) as toks:  # closing the outer closes the inner
            async for _ in toks:
                break
        return r.cancelled

    assert asyncio.run(run()) is True


def test_http_stack_names_what_is_installed():
    import importlib.util

    s = http_stack()
    assert s["http"] == ("httptools" if importlib.util.find_spec("httptools") else "h11")
    assert s["loop"] in ("uvloop", "asyncio") and s["uvicorn"]

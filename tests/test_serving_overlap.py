"""With ``server.overlap_scheduling`` the model thread hands step i's tokens to the event loop only after
launching step i+1 (issue 12), so the event loop's SSE work runs while the GPU computes; without it (the
default) right after step i. Either way the tokens, their per-request order and the finish events stay
those of plain ``decode`` steps. CPU model, no HTTP: the call order is recorded."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kernelcamp.errors import KernelcampError
from kernelcamp.io import load_params
from kernelcamp.serve.model import DecoderModel, ModelConfig
from kernelcamp.serve.server import Engine, _put_all
from kernelcamp.serve.tokens import encode
from kernelcamp.variant import parse_variant

ROOT = Path(__file__).resolve().parents[1]
MAX_RUNNING = 2


@pytest.fixture(scope="module")
def model() -> DecoderModel:
    p = load_params(ROOT / "params.yaml")
    p["server"] = {**p["server"], "max_running_requests": MAX_RUNNING}
    cfg = ModelConfig.from_params(p, "cpu")
    return DecoderModel(cfg, parse_variant(p["variant"]), p.get("kernel"), "cpu")


def _alone(model: DecoderModel, prompt: list[int], max_tokens: int) -> list[int]:
    """The request's tokens from plain prefill + ``decode`` steps at batch 1 (the reference)."""
    pages = model.alloc(len(prompt) + max_tokens)
    try:
        out = [model.prefill(prompt, pages)]
        while len(out) < max_tokens:
            out += model.decode([out[-1]], [len(prompt) + len(out) - 1], [pages])
        return out
    finally:
        model.free(pages)


def test_decode_is_launch_then_collect_and_misuse_is_refused(model):
    pages = model.alloc(8)
    try:
        ref = model.decode([5, 9], [2, 3], [pages, pages])
        timing = dict(model.last_timing)
        model.launch([5, 9], [2, 3], [pages, pages])
        with pytest.raises(KernelcampError, match="not collected"):
            model.launch([5], [2], [pages])
        assert model.collect() == ref
        with pytest.raises(KernelcampError, match="no decode step was launched"):
            model.collect()
    finally:
        model.free(pages)
    assert set(timing) == {"gpu_ms", "load_ms", "launch_ms", "sync_ms", "handoff_ms"}
    assert 0 <= timing["handoff_ms"] <= timing["sync_ms"] and model.last_bucket == 2


@pytest.mark.parametrize("overlap", [True, False])
def test_step_tokens_reach_the_event_loop_after_the_next_launch_only_with_overlap(model, overlap):
    prompts = [encode(f"overlap prompt {i} " + "w " * i, model.cfg.vocab_size) for i in range(4)]
    wanted = [3, 6, 1, 5]  # MAX_RUNNING=2: later requests are admitted (prefilled) between decode steps
    expected = [_alone(model, p, n) for p, n in zip(prompts, wanted, strict=True)]
    free_before = len(model.free_pages)

    log: list[tuple] = []
    launch, collect, prefill_many = model.launch, model.collect, model.prefill_many
    model.launch = lambda *a: (log.append(("launch",)), launch(*a))[1]
    model.collect = lambda: (out := collect(), log.append(("collect", out)))[0]
    model.prefill_many = lambda *a: (toks := prefill_many(*a), log.append(("prefill", toks)))[0]
    eng = Engine(model, MAX_RUNNING, overlap=overlap)
    assert eng.overlap_active is overlap
    send = eng._send

    def logged_send(fn, *args):
        if fn is _put_all:
            log.append(("send", [x for _, x in args[0]]))
        send(fn, *args)

    eng._send = logged_send

    async def run() -> list[list[int]]:
        eng.start()
        reqs = [eng.submit(p, n) for p, n in zip(prompts, wanted, strict=True)]

        async def read(r):
            return [t async for t in eng.tokens(r)]

        try:
            return await asyncio.wait_for(asyncio.gather(*(read(r) for r in reqs)), 60)
        finally:
            await eng.stop()

    try:
        got = asyncio.run(run())
    finally:
        del model.launch, model.collect, model.prefill_many
    assert got == expected  # same tokens per request, in order, each stream ended by its finish (None)
    assert eng.error is None and len(model.free_pages) == free_before

    kinds = [e[0] for e in log]
    # every prefill's first tokens (one per request admitted together) go at once, right after it
    for i, k in enumerate(kinds):
        if k == "prefill":
            assert kinds[i + 1] == "send" and [x for x in log[i + 1][1] if x is not None] == log[i][1], log[i : i + 2]
    decode_sends = [i for i, k in enumerate(kinds) if k == "send" and kinds[i - 1] != "prefill"]
    collects = [i for i, k in enumerate(kinds) if k == "collect"]
    launches = [i for i, k in enumerate(kinds) if k == "launch"]
    assert len(collects) == len(launches) == len(decode_sends) >= max(wanted) - 1, kinds
    for n, (c, s) in enumerate(zip(collects, decode_sends, strict=True)):
        nxt = launches[n + 1] if n + 1 < len(launches) else None
        if overlap:  # step n's tokens (and finishes) go after step n+1's launch when there is one
            assert c < s and (nxt is None or nxt < s) and (n + 1 == len(collects) or s < collects[n + 1]), kinds
        else:  # ... or right after step n, before step n+1 is launched
            assert c < s and (nxt is None or s < nxt), kinds
        assert [x for x in log[s][1] if x is not None] == log[c][1]
    assert kinds[collects[-1] + 1] == "send", "with no next step, the last step's tokens go at once"

    dec = [s for s in eng.stats(steps=1000)["steps"] if s["kind"] == "decode"]
    assert len(dec) == len(collects) and sum(s["prefills"] for s in dec) == 4  # every prefill before a step
    assert all(0 <= s["handoff_ms"] <= s["sync_ms"] and s["load_ms"] + s["sync_ms"] < s["step_ms"] for s in dec)


def test_with_overlap_a_failed_launch_still_delivers_the_collected_step_first(model):
    # The step collected before a failing launch: its tokens (and a request's finish) reach the
    # queues before the error, as when each step's tokens went out right after it.
    prompts = [encode(f"fail {i}", model.cfg.vocab_size) for i in range(2)]
    launch, calls = model.launch, [0]

    def failing_launch(*a):
        calls[0] += 1
        if calls[0] == 3:
            raise RuntimeError("planted launch failure")
        return launch(*a)

    model.launch = failing_launch
    eng = Engine(model, MAX_RUNNING, overlap=True)

    async def run():
        eng.start()
        reqs = [eng.submit(prompts[0], 3), eng.submit(prompts[1], 50)]
        got: list = []
        for r in reqs:
            toks: list = []
            try:
                async for t in eng.tokens(r):
                    toks.append(t)
            except RuntimeError as e:
                toks.append(str(e))
            got.append(toks)
        await eng.stop()
        return got

    try:
        short, long = asyncio.run(asyncio.wait_for(run(), 60))
    finally:
        del model.launch
    # prefill + 2 decode steps for both: the short request ends (3 tokens) at step 2, before the error
    assert short == _alone(model, prompts[0], 3)
    assert long[:3] == _alone(model, prompts[1], 3) and long[3:] == ["planted launch failure"]
    assert "planted launch failure" in eng.error

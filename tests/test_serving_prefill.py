"""Prefills admitted together run as one forward (``DecoderModel.prefill_many``, issue 12): the same
first tokens and the same cache contents as one prefill per prompt, and one prefill record per group.
Every prefill forward has a power-of-two row count in ``prefill_row_buckets`` (the attention kernel's
autotune key), and an autotune-list variant tunes them all at warm-up."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kernelcamp.io import load_params
from kernelcamp.serve.model import DecoderModel, ModelConfig
from kernelcamp.serve.server import Engine
from kernelcamp.serve.tokens import encode
from kernelcamp.variant import parse_variant

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model() -> DecoderModel:
    p = load_params(ROOT / "params.yaml")
    p["server"] = {**p["server"], "max_running_requests": 4}
    cfg = ModelConfig.from_params(p, "cpu")
    return DecoderModel(cfg, parse_variant(p["variant"]), p.get("kernel"), "cpu")


def _prompts(model: DecoderModel) -> list[list[int]]:
    return [encode("one " + "word " * n, model.cfg.vocab_size) for n in (0, 5, 17, 2)]


def test_prefill_many_is_one_prefill_per_prompt(model):
    prompts = _prompts(model)
    alone_pages = [model.alloc(len(p) + 4) for p in prompts]
    together_pages = [model.alloc(len(p) + 4) for p in prompts]
    try:
        # the reference: each prompt alone in a forward of its own rows, unpadded
        alone = [model._prefill_group([p], [pg], pad=False)[0] for p, pg in zip(prompts, alone_pages, strict=True)]
        together = model.prefill_many(prompts, together_pages)
        assert together == alone
        # the cache holds the same latents: the next decode step gives the same tokens from either
        pos = [len(p) for p in prompts]
        assert model.decode(together, pos, together_pages) == model.decode(alone, pos, alone_pages)
        with pytest.raises(ValueError, match="2 prompts but 1 page lists"):
            model.prefill_many(prompts[:2], together_pages[:1])
    finally:
        for pg in alone_pages + together_pages:
            model.free(pg)


def test_requests_admitted_together_share_one_prefill_record(model):
    prompts = _prompts(model)
    eng = Engine(model, 4)

    async def read(r) -> list[int]:
        return [t async for t in eng.tokens(r)]

    async def run():
        reqs = [eng.submit(p, 3) for p in prompts]  # all waiting before the model thread starts
        eng.start()
        try:
            return await asyncio.wait_for(asyncio.gather(*(read(r) for r in reqs)), 60)
        finally:
            await eng.stop()

    got = asyncio.run(run())
    assert [len(g) for g in got] == [3] * 4
    pre = [s for s in eng.stats(steps=100)["steps"] if s["kind"] == "prefill"]
    assert [s["requests"] for s in pre] == [4] and eng.counts["prefills"] == 4
    assert sum(s["batch"] for s in pre) == sum(len(p) for p in prompts)


def test_prefill_many_pads_its_rows_to_a_power_of_two(model, monkeypatch):
    # the attention kernel's autotune key is its row count: unpadded, an autotune-list variant would
    # re-tune at nearly every group of prompts
    seen: list[int] = []
    forward = model._forward
    monkeypatch.setattr(
        model, "_forward", lambda tok, pos, ptab, *a: (seen.append(tok.shape[0]), forward(tok, pos, ptab, *a))[1]
    )
    prompts = _prompts(model)
    pages = [model.alloc(len(p) + 4) for p in prompts]
    try:
        for k in (2, 3, 4):
            model.prefill_many(prompts[:k], pages[:k])
    finally:
        for pg in pages:
            model.free(pg)
    lengths = [sum(len(p) for p in prompts[:k]) for k in (2, 3, 4)]
    assert all(n >= max(16, m) and n & (n - 1) == 0 for n, m in zip(seen, lengths, strict=True)), (seen, lengths)


def _rows_seen(model, monkeypatch) -> list[int]:
    seen: list[int] = []
    forward = model._forward
    monkeypatch.setattr(
        model, "_forward", lambda tok, pos, ptab, *a: (seen.append(tok.shape[0]), forward(tok, pos, ptab, *a))[1]
    )
    return seen


def test_a_single_prefill_is_padded_too(model, monkeypatch):
    # before: one prompt ran unpadded, so every prompt length was a new autotune key
    seen = _rows_seen(model, monkeypatch)
    for n in (0, 5, 17, 40):
        prompt = encode("one " + "word " * n, model.cfg.vocab_size)
        pg = model.alloc(len(prompt) + 4)
        try:
            alone = model._prefill_group([prompt], [pg], pad=False)[0]
            seen.clear()
            assert model.prefill(prompt, pg) == alone
        finally:
            model.free(pg)
        assert seen and all(r in model.prefill_row_buckets for r in seen), (n, seen)


def test_a_large_group_is_split_into_capped_forwards(model, monkeypatch):
    cap = model.prefill_max_rows
    assert model.prefill_row_buckets[0] == 16 and model.prefill_row_buckets[-1] == cap
    assert cap >= model.cfg.max_context_tokens and cap // 2 < max(16, model.cfg.max_context_tokens)
    seen = _rows_seen(model, monkeypatch)
    long = encode("word " * (cap // 2 - 3), model.cfg.vocab_size)  # three of these do not fit one forward
    prompts = [long, long[:5], long, long]
    pages = [model.alloc(len(p) + 2) for p in prompts]
    try:
        alone = [model._prefill_group([p], [pg], pad=False)[0] for p, pg in zip(prompts, pages, strict=True)]
        seen.clear()
        assert model.prefill_many(prompts, pages) == alone
    finally:
        for pg in pages:
            model.free(pg)
    assert len(seen) == 2 and all(r <= cap and r in model.prefill_row_buckets for r in seen), (seen, cap)


def test_warmup_tunes_every_prefill_key_of_an_autotune_list(model, monkeypatch):
    """A launcher that autotunes sees every prefill row count at warm-up, before any request; one
    that does not is not run at them (no start-up time spent)."""

    class Recorder:
        def __init__(self, autotunes: bool):
            self.autotunes, self.rows = autotunes, []

        def __call__(self, q, cache, idx, layout, page_size, sm_scale):
            self.rows.append(q.shape[0])
            return model.backend.ref(q, cache, idx, layout, page_size, sm_scale, check_indices=False)

    for autotunes in (True, False):
        rec = Recorder(autotunes)
        monkeypatch.setattr(model, "launcher", rec)
        monkeypatch.setattr(model, "prefill_keys_tuned", [])
        model.warmup()
        tuned = sorted(set(rec.rows) & set(model.prefill_row_buckets))
        if autotunes:
            assert tuned == model.prefill_row_buckets and model.prefill_keys_tuned == tuned
            assert model.describe()["prefill_keys_tuned"] == tuned
        else:
            assert set(rec.rows) <= {1} and model.prefill_keys_tuned == []

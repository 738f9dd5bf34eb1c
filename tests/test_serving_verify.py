"""Serving verify against fake servers: a faithful one passes, a stream-swapping one is caught."""

from __future__ import annotations

from kernelcamp.serve.fake import FakeSpec, make_fake_app
from kernelcamp.serve.testing import ServerThread
from kernelcamp.verify.serving import compare_outputs, serving_verify

PARAMS = {
    "verify": {"serving": {"concurrency": 4, "num_prompts": 8, "max_tokens": 6}},
    "benchmark": {"serving": {"timeout_s": 10}},
}


def _verify(spec: FakeSpec) -> dict:
    with ServerThread(make_fake_app(spec)) as url:
        return serving_verify(PARAMS, {"kind": "command", "url": url, "variant_hash": spec.variant_hash})


def test_faithful_server_passes():
    res = _verify(FakeSpec(ttft_ms=5, itl_ms=5, variant_hash="h1"))
    assert res["passed"] and res["distinct_reference_outputs"] and res["requests_failed"] == 0


def test_swapped_streams_detected():
    res = _verify(FakeSpec(ttft_ms=5, itl_ms=5, swap=True, variant_hash="h1"))
    assert not res["passed"]
    assert res["num_swapped"] + res["num_mismatched"] > 0
    assert res["num_swapped"] > 0


def test_failures_fail_verify():
    res = _verify(FakeSpec(ttft_ms=1, itl_ms=1, fail_every=5, variant_hash="h1"))
    assert not res["passed"] and res["requests_failed"] > 0


def test_compare_outputs_classifies():
    cmp = compare_outputs(["a b", "c d", "e f"], ["a b", "e f", "e x"])
    assert cmp["swapped"] == [{"prompt": 1, "carries_output_of": 2}]
    assert cmp["mismatched"][0]["prompt"] == 2 and cmp["mismatched"][0]["first_diff_word"] == 1

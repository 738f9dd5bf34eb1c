"""Python's garbage collector in the serving processes (issue 12): its pauses are counted and reported
per step record, per serving window (engine, front, load generator), and the heap of each serving
process is frozen after warm-up unless ``server.gc_freeze`` is false (a flag in the variant hash)."""

from __future__ import annotations

import gc
from pathlib import Path

import httpx
import pytest

from kernelcamp.bench.serving import gc_pauses
from kernelcamp.errors import KernelcampError
from kernelcamp.hashes import server_flags
from kernelcamp.io import load_params
from kernelcamp.serve import gcwatch
from kernelcamp.serve.server import build_state, freeze_served_heap, make_app
from kernelcamp.serve.testing import ServerThread

ROOT = Path(__file__).resolve().parents[1]
INFO = "/v1/kernelcamp/info"


@pytest.fixture(autouse=True)
def _unfreeze():
    yield
    gc.unfreeze()  # this test process's heap back to the collector


@pytest.fixture(scope="module")
def params():
    p = load_params(ROOT / "params.yaml")
    p["server"] = {**p["server"], "max_running_requests": 4}
    return p


def test_the_watch_counts_a_full_collection_and_its_pause():
    w = gcwatch.watch()
    before = w.snapshot()
    gc.collect()
    after = w.snapshot()
    assert after["collections"][2] == before["collections"][2] + 1
    assert after["pause_ms"][2] > before["pause_ms"][2]
    assert after["max_pause_ms"] > 0 and w.total_ms == pytest.approx(sum(after["pause_ms"]), abs=0.01)


def test_freeze_heap_moves_the_live_objects_out_of_the_collectors_walk():
    assert gc.get_freeze_count() == 0
    assert gcwatch.watch().snapshot()["unfrozen_objects"] is None  # not counted (a walk of the whole heap)
    out = gcwatch.freeze_heap()
    assert out["frozen_objects"] == gc.get_freeze_count() > 1000
    assert out["freeze_ms"] > 0
    assert gcwatch.watch().snapshot()["unfrozen_objects"] < out["frozen_objects"]


def test_the_serving_benchmark_freezes_only_when_asked(monkeypatch):
    # the benchmark stage asks (its process exits after it); a caller inside a longer-lived process does not
    import inspect

    from kernelcamp.bench import record, serving

    assert inspect.signature(serving.serving_benchmark).parameters["freeze_heap"].default is False
    seen = {}
    monkeypatch.setattr(serving, "serving_benchmark", lambda *a, **kw: seen.update(kw) or {"ab": {}})
    record.serving_level({"benchmark": {"serving": {"enabled": True}}}, {"url": "http://127.0.0.1:1"})
    assert seen["freeze_heap"] is True


def test_gc_freeze_is_a_hashed_flag_on_by_default_and_strings_are_refused():
    assert server_flags({})["gc_freeze"] is True
    assert server_flags({"gc_freeze": False})["gc_freeze"] is False
    with pytest.raises(KernelcampError, match="server.gc_freeze = 'false'"):
        server_flags({"gc_freeze": "false"})
    with pytest.raises(KernelcampError, match="server.gc_freeze = null: expected true or false"):
        server_flags({"gc_freeze": None})  # YAML's null, named as written
    from kernelcamp.spec import ServerSpec, WorkloadSpec, parse_section

    full = load_params(ROOT / "params.yaml")  # every field, then one of them null
    for spec, section, key in ((ServerSpec, "server", "gc_freeze"), (WorkloadSpec, "workload", "num_heads")):
        with pytest.raises(KernelcampError, match=rf"{section}.{key} = null: expected"):
            parse_section(spec, {**full[section], key: None}, section)


@pytest.mark.parametrize("flag", [True, False])
def test_the_engine_freezes_its_heap_when_asked_and_reports_the_pauses_per_step(params, flag):
    state = build_state({**params, "server": {**params["server"], "gc_freeze": flag}}, "cpu")
    assert gc.get_freeze_count() == 0  # building a state never freezes the process it runs in (a test)
    assert freeze_served_heap(state) is state  # what `kernelcamp serve` does next
    assert (gc.get_freeze_count() > 0) is flag
    with ServerThread(make_app(state)) as url:
        with httpx.Client(base_url=url, timeout=60) as c:
            c.post("/v1/completions", json={"prompt": "a b", "max_tokens": 3})
            first = c.get(INFO, params={"steps": 64}).json()["steps"]
            if flag:  # the freeze's own full collection at start is not a pause of the first steps
                assert sum(s["gc_ms"] for s in first) < state.gc_frozen["freeze_ms"] / 2, first
            gc.collect()  # a collection between two steps: counted in the next record's gc_ms
            c.post("/v1/completions", json={"prompt": "c d", "max_tokens": 3})
            info = c.get(INFO, params={"steps": 64}).json()
    assert info["server_flags"]["gc_freeze"] is flag
    assert (info["gc_frozen_at_start"] is not None) is flag
    if flag:
        assert info["gc_frozen_at_start"]["frozen_objects"] > 1000
    assert all(s["gc_ms"] >= 0 for s in info["steps"])
    assert sum(s["gc_ms"] for s in info["steps"]) > 0
    assert info["gc"]["collections"][2] >= 1 and info["gc"]["enabled"] is True


def test_a_windows_gc_pauses_come_from_the_step_records_and_the_fronts_counters():
    before = {"front_gc": {"pause_ms": [1.0, 2.0, 3.0]}}
    after = {"front_gc": {"pause_ms": [1.5, 2.0, 80.0]}}
    steps = [{"gc_ms": 0.0}, {"gc_ms": 0.25}, {"gc_ms": 70.0}]
    assert gc_pauses(before, after, steps) == {"server_gc_ms": 70.25, "front_gc_ms": 77.5}
    # a foreign or single-process server: not reported, not zero
    assert gc_pauses({}, {}, [{"index": 1}]) == {"server_gc_ms": None, "front_gc_ms": None}

"""The decode-step profile endpoint on the CPU model server (Kineto CPU ops), its no-load timeout,
and the report's per-kernel table and attention share from a fixture."""

from __future__ import annotations

import copy
import gzip
import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from kernelcamp import report as kr
from kernelcamp.io import load_params
from kernelcamp.serve.client import PROFILE_PATH, request_profile
from kernelcamp.serve.server import build_state, make_app
from kernelcamp.serve.testing import ServerThread

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "report"


@pytest.fixture(scope="module")
def server():
    p = load_params(ROOT / "params.yaml")
    p["server"] = {**p["server"], "max_running_requests": 8}
    with ServerThread(make_app(build_state(p, "cpu"))) as url:
        yield url


def _load(url: str, n: int = 4, max_tokens: int = 40) -> None:
    with httpx.Client(timeout=120) as c:
        ths = [
            threading.Thread(
                target=c.post,
                args=(url + "/v1/completions",),
                kwargs={"json": {"prompt": f"p {i}", "max_tokens": max_tokens}},
            )
            for i in range(n)
        ]
        for t in ths:
            t.start()
        for t in ths:
            t.join()


def test_profile_under_load_returns_table_and_trace(server, tmp_path):
    # The client names its own local file; the server keeps the trace in its own folder and the
    # client downloads it by id (a request never names a server-side path).
    trace = tmp_path / "t.json.gz"
    got: dict = {}

    def ask():
        got["r"] = request_profile(server, trace, steps=3)

    th = threading.Thread(target=ask)
    th.start()
    time.sleep(0.3)  # armed before the load arrives
    _load(server)
    th.join()
    status, j = got["r"]
    assert status == 200, j
    assert len(j["trace_id"]) == 32 and j["trace_bytes"] == trace.stat().st_size
    assert j["steps"] == 3 and len(j["batch_sizes"]) == 3 and all(b >= 1 for b in j["batch_sizes"])
    assert j["device"] == "cpu" and j["time_kind"] == "cpu_op_self_time" and "CPU ops" in j["rows_are"]
    assert j["mode"].startswith("eager") and j["trace_path"] == str(trace)
    rows = j["kernels"]
    assert rows and {"name", "calls", "device_time_us_total", "device_time_us_mean", "share_pct"} <= set(rows[0])
    assert rows == sorted(rows, key=lambda x: -x["device_time_us_total"])
    assert any(x["name"].startswith("aten::") for x in rows)
    assert 0 < sum(x["share_pct"] for x in rows) <= 130  # of the steps' wall time
    events = json.load(gzip.open(trace))["traceEvents"]
    assert any("kernelcamp.decode_step" in str(e.get("name")) for e in events)
    steps = httpx.get(server + "/v1/kernelcamp/info", params={"steps": 2000}).json()["steps"]
    assert sum(1 for s in steps if s.get("profiled")) == 3


def test_profile_without_load_times_out_clearly(server, tmp_path):
    t0 = time.monotonic()
    r = httpx.post(server + PROFILE_PATH, json={"steps": 2, "timeout_s": 0.5}, timeout=30)
    assert r.status_code == 504 and "no decode step ran within 0.5 s" in r.json()["error"]["message"]
    assert time.monotonic() - t0 < 10
    assert httpx.post(server + PROFILE_PATH, json={"steps": 0}, timeout=30).status_code == 400
    # a request that names a server-side path is refused, relative or absolute, and nothing is written there
    for tp in ("rel.json.gz", str(tmp_path / "victim.txt")):
        r = httpx.post(server + PROFILE_PATH, json={"steps": 2, "trace_path": tp}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "trace_path"
    assert not (tmp_path / "victim.txt").exists()
    # a text/plain body (what a cross-site form or fetch can send) never runs
    r = httpx.post(
        server + PROFILE_PATH,
        content=json.dumps({"steps": 1, "timeout_s": 0.2}),
        headers={"content-type": "text/plain"},
        timeout=30,
    )
    assert r.status_code == 415
    assert httpx.get(server + "/v1/kernelcamp/profile/traces/../../etc/passwd", timeout=30).status_code == 404
    assert httpx.get(server + "/v1/kernelcamp/profile/traces/" + "0" * 32, timeout=30).status_code == 404
    # disarmed: the server still serves, and a later profile is not refused as "in progress"
    assert httpx.post(server + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=60).status_code == 200
    r = httpx.post(server + PROFILE_PATH, json={"steps": 1, "timeout_s": 0.2}, timeout=30)
    assert r.status_code == 504


def test_profile_timeout_after_some_steps_returns_them_as_partial(server):
    # The timeout is settled on the model thread between two steps: what ran is tabulated, and no
    # later step runs under the profiler.
    got: dict = {}

    def ask():
        got["r"] = httpx.post(server + PROFILE_PATH, json={"steps": 200, "timeout_s": 1.5, "trace": False}, timeout=60)

    th = threading.Thread(target=ask)
    th.start()
    time.sleep(0.3)  # armed before the load arrives
    _load(server, n=2, max_tokens=12)
    th.join()
    r = got["r"]
    assert r.status_code == 200, r.text
    j = r.json()
    assert j["partial"] and 1 <= j["steps"] < 200 and len(j["batch_sizes"]) == j["steps"] and j["trace_id"] is None
    since = httpx.get(server + "/v1/kernelcamp/info", params={"steps": 0}).json()["counts"]["step_index"]
    assert httpx.post(server + "/v1/completions", json={"prompt": "x", "max_tokens": 3}, timeout=60).status_code == 200
    later = httpx.get(server + "/v1/kernelcamp/info", params={"since": since}).json()["steps"]
    assert later and not any(s.get("profiled") for s in later)


def test_report_renders_kernel_table_and_attention_share():
    data = kr.load_inputs({n: FIX / f"{n}.json" for n in ("build", "deploy", "benchmark", "verify")})
    d = copy.deepcopy(data)
    rows = [
        {
            "name": f"kern_{i}",
            "calls": 5,
            "device_time_us_total": 100.0 - i,
            "device_time_us_mean": (100.0 - i) / 5,
            "share_pct": 5.0 - i / 10,
        }
        for i in range(15)
    ]
    meta = {
        "source": "server_decode_steps",
        "steps": 5,
        "batch_sizes": [96] * 5,
        "mode": "cuda_graph_replay",
        "device": "cuda:0",
        "time_kind": "device_kernel_time",
        "kernel_rows": 15,
        "kernels": rows,
        "step_ms_total": 2.0,
        "share_pct_of": "the profiled steps' wall time",
    }
    d["benchmark"]["profile"].update(
        source="server_decode_steps",
        what="decode steps",
        trace_baseline="reports/trace.baseline.json.gz",
        impls={"candidate": meta, "baseline": {**meta, "mode": "eager (cuda graphs off for the profiled steps)"}},
    )
    d["benchmark"]["serving"]["step_models"] = {
        "candidate": {**d["benchmark"]["serving"]["step_model"], "batch_sizes_fitted": [1, 4], "r2_all_steps": 0.5},
        "baseline": {"skipped": "not measured"},
    }
    md = kr.render_markdown(d, {}, 0.02)
    prof = md[md.index("## Profile") :]
    assert "| `kern_0` | 5 | 100.0 | 20.00 | 5.0% |" in prof and "`kern_11`" in prof and "`kern_12`" not in prof
    assert "**candidate**" in prof and "**baseline**" in prof and "cuda_graph_replay" in prof
    assert "trace.baseline.json.gz" in prof
    assert "Attention's measured share of a decode step (live" in md and "calibration; method:" in md
    assert "batch 1: 40.4%" in md
    assert "batch sizes fitted [1, 4]" in md and "- baseline: not fitted (not measured)" in md
    # the older fixture (no impls) still renders, naming the source
    assert "## Profile" in kr.render_markdown(data, {}, 0.02)


def test_kernel_rows_leave_out_the_step_annotation() -> None:
    """On the H200 the `kernelcamp.decode_step` range came out as a 'kernel' with 69% of step time."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from kernelcamp.serve.server import kernel_rows

    def ev(key, dev_us, dtype=DeviceType.CUDA):
        return SimpleNamespace(
            key=key,
            count=5,
            device_type=dtype,
            self_device_time_total=dev_us,
            device_time_total=dev_us,
            self_cpu_time_total=0.0,
        )

    prof = SimpleNamespace(
        key_averages=lambda: [
            ev("kernelcamp.decode_step batch=96", 11000.0),
            ev("_sparse_mla_split_kernel", 5000.0),
            ev("aten::mm", 9.0, DeviceType.CPU),
        ]
    )
    rows = kernel_rows(prof, on_gpu=True, step_us_total=16000.0)
    assert [r["name"] for r in rows] == ["_sparse_mla_split_kernel"]
    assert rows[0]["share_pct"] == 31.25


def test_report_has_one_serving_heading() -> None:
    data = kr.load_inputs({n: FIX / f"{n}.json" for n in ("build", "deploy", "benchmark", "verify")})
    md = kr.render_markdown(data, {}, 0.02)
    assert md.count("## Serving") == 1, "the serving section heading was written twice"

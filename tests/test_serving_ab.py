"""Serving A/B: the candidate (the small CPU model on loopback, as if deployed) and a temporary
baseline server started by the benchmark, interleaved per level; ratios with CIs; both step
models; the baseline server always stopped (also when the candidate dies mid-run or on an
interrupt); a foreign (command) deploy measures the candidate only."""

from __future__ import annotations

import copy
import os
import signal
import time
from pathlib import Path

import pytest

from kernelcamp.bench import serving as bench
from kernelcamp.bench.serving import baseline_params, serving_benchmark
from kernelcamp.deploy.common import _alive
from kernelcamp.errors import KernelcampError
from kernelcamp.hashes import params_variant_hash
from kernelcamp.io import load_params
from kernelcamp.serve.fake import FakeSpec, make_fake_app
from kernelcamp.serve.server import build_state, make_app
from kernelcamp.serve.testing import ServerThread, free_port_block, port_is_free
from kernelcamp.stats import DECISIONS

ROOT = Path(__file__).resolve().parents[1]


def _port_pair() -> int:
    """A free port whose successor (the baseline's) is free too, outside the ephemeral range."""
    return free_port_block(2)


@pytest.fixture(scope="module")
def params():
    p = load_params(ROOT / "params.yaml")
    p["server"] = {**p["server"], "max_running_requests": 8}
    p["benchmark"] = copy.deepcopy(p["benchmark"])
    p["benchmark"]["serving"].update(
        cpu_concurrency=[4, 1], cpu_max_tokens=6, cpu_warmup_s=0.2, cpu_window_s=0.8, cpu_repeats=2
    )
    p["deploy"] = {"kind": "embedded", "health_timeout_s": 90, "poll_interval_s": 0.2, "port_free_timeout_s": 2}
    assert params_variant_hash(baseline_params(p)) != params_variant_hash(p)
    return p


@pytest.fixture(scope="module")
def candidate_app(params):
    return make_app(build_state(params, "cpu"))


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return tmp_path


def _record(params, url):
    return {"kind": "embedded", "url": url, "variant_hash": params_variant_hash(params), "deploy_id": "t"}


def _spy_baseline(monkeypatch):
    from kernelcamp.deploy import embedded as dep

    seen = {}

    real = dep.start_embedded

    def spy(*a, **kw):
        proc, s, f = real(*a, **kw)
        seen["pid"], seen["port"] = proc.pid, a[2]
        return proc, s, f

    monkeypatch.setattr(dep, "start_embedded", spy)
    return seen


def _assert_stopped(seen, tmp_path):
    assert seen.get("pid") and not _alive(seen["pid"]), "baseline server still running"
    assert port_is_free(seen["port"]), "baseline port still held"
    assert not (tmp_path / ".kernelcamp" / "baseline-server.json").exists()


@pytest.mark.slow  # > 9 s on 2 cores: `make test-slow` (CI runs both)
def test_ab_interleaved_both_impls_ratios_step_models(params, candidate_app, env, monkeypatch, capsys):
    seen = _spy_baseline(monkeypatch)
    port = _port_pair()
    with ServerThread(candidate_app, port=port) as url:
        res = serving_benchmark(params, _record(params, url), progress=True, root=env)
    _assert_stopped(seen, env)
    # CPU servers decide nothing: each look's console line printed the interval's decision all the same
    looks = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[serving A/B] look")]
    assert res["scaled_for_cpu"] and looks, looks
    assert all("(a CPU server decides nothing)" in line for line in looks), looks
    assert seen["port"] == port + 1
    assert res["baseline_measured"] and res["baseline"]["stopped"]
    # the record keeps workspace paths relative, never this machine's
    assert res["baseline"]["state_file"] == ".kernelcamp/baseline-server.json"
    assert res["baseline"]["log"] == ".kernelcamp/baseline-server.log"
    rows = res["levels"]
    assert len(rows) == 2 * 2 * 2  # impls x levels x repeats
    for c in (4, 1):
        for impl in ("baseline", "candidate"):
            mine = [r for r in rows if r["concurrency"] == c and r["impl"] == impl]
            assert [r["repeat"] for r in mine] == [0, 1]
            assert all(r["valid"] and r["output_tok_s"] > 0 and r["variant_hash"] for r in mine)
            # a steady-state window: warm-up excluded, the window measured, load kept at the level
            assert all(r["steady_output_tok_s"] > 0 and r["window_s"] == 0.8 and r["warmup_s"] == 0.2 for r in mine)
            assert all(0.5 * c <= r["window_mean_in_flight"] <= c + 1e-6 for r in mine), mine
            # the collector's pauses of the load generator and the engine, per window (kernelcamp.serve.gcwatch)
            assert all(r["client_gc_ms"] >= 0 and r["server_gc_ms"] >= 0 for r in mine), mine
    assert {r["variant"] for r in rows if r["impl"] == "baseline"} == {params["baseline"]["name"]}
    bhash = params_variant_hash(baseline_params(params))
    assert {r["variant_hash"] for r in rows if r["impl"] == "baseline"} == {bhash}
    # interleaved: the first impl alternates round by round
    firsts = [r["impl"] for r in rows if r["position"] == 0]
    assert firsts == ["baseline", "candidate", "baseline", "candidate"]
    # a repeat runs every level in the configured order, then the next repeat (pairs: (level, repeat))
    assert [(r["concurrency"], r["repeat"]) for r in rows if r["position"] == 0] == [(4, 0), (1, 0), (4, 1), (1, 1)]
    ab = res["ab"]
    assert [e["concurrency"] for e in ab["per_level"]] == [4, 1]
    for e in ab["per_level"]:
        assert e["valid"] and e["n_pairs"] == 2 and e["ci_lo"] <= e["ratio"] <= e["ci_hi"]
        assert e["baseline"]["steady_output_tok_s"] > 0 and e["candidate"]["requests_ok"] > 0
        assert e["decision"] in DECISIONS and e["half_width"] == pytest.approx((e["ci_hi"] - e["ci_lo"]) / 2)
    o = ab["overall"]
    assert o["n_pairs"] == 4 and o["ci_lo"] <= o["ratio"] <= o["ci_hi"]
    assert o["decision"] in DECISIONS and o["half_width"] > 0
    # CPU: a fixed number of repeats (one look), stated with the reason the repeats stopped
    assert o["n_repeats"] == 2 and o["stop_reason"] in ("decided", "max_rounds") and len(o["looks"]) == 1
    for impl in ("baseline", "candidate"):
        sm = res["step_models"][impl]
        assert set(sm) >= {"a_ms", "b_ms_per_req", "r2", "n_points"}, (impl, sm)
    assert res["step_model"] == res["step_models"]["candidate"]
    _check_report(res, env)


def _check_report(serving, tmp_path):
    """The report renders both impls per level, the ratio with its CI, both step models and a plot."""
    import json

    from kernelcamp import report as kr

    fix = ROOT / "tests" / "fixtures" / "report"
    data = kr.load_inputs({n: fix / f"{n}.json" for n in ("build", "deploy", "benchmark", "verify")})
    data["benchmark"]["serving"] = json.loads(json.dumps(serving))
    plots = kr.make_plots(data, tmp_path / "plots")
    assert {"serving_throughput", "serving_ratio", "step_model"} <= set(plots)
    md = kr.render_markdown(data, plots, 0.02)
    assert "**Serving A/B:** **" in md and "| 4 | baseline | yes |" in md and "| 4 | candidate | yes |" in md
    assert "resolution: could detect \u00b1" in md and "2 repeats used of at most 2, stopped: " in md
    lv = serving["ab"]["per_level"][0]
    assert f"| 4 | {lv['ratio']:.4f} | [{lv['ci_lo']:.4f}, {lv['ci_hi']:.4f}]" in md  # per-level decision row
    assert "- baseline: `step_ms = " in md and "- candidate: `step_ms = " in md
    from kernelcamp.bench.record import serving_metrics

    keys = set(serving_metrics(serving, "cpu."))  # the detail, benchmark_metrics.json
    c = lv["concurrency"]
    assert {
        f"cpu.serving.c{c}.candidate.output_tok_s",
        f"cpu.serving.c{c}.baseline.output_tok_s",
        f"cpu.serving.c{c}.ab.ratio",
        "cpu.step_model.baseline.a_ms",
        "cpu.step_model.candidate.a_ms",
    } <= keys
    head = kr.headline_metrics(data, 0.02)  # the headline: metrics.json and MLflow
    assert {"cpu.serving.ratio", "cpu.serving.candidate.output_tok_s"} <= set(head)


def test_candidate_dies_mid_run_baseline_still_stopped(params, candidate_app, env, monkeypatch):
    seen = _spy_baseline(monkeypatch)
    port = _port_pair()
    server = ServerThread(candidate_app, port=port)
    real_load = bench.run_window_sync
    calls = {"n": 0}

    def dying_load(url, *a, **kw):
        calls["n"] += 1
        if calls["n"] == 2:  # the candidate's first run: its server goes away
            server.stop()
        return real_load(url, *a, **kw)

    monkeypatch.setattr(bench, "run_window_sync", dying_load)
    p = copy.deepcopy(params)
    p["benchmark"]["serving"].update(cpu_concurrency=[1])
    url = server.__enter__()
    try:
        with pytest.raises(KernelcampError, match="does not answer"):
            serving_benchmark(p, _record(p, url), progress=False, root=env)
    finally:
        server.stop()
    _assert_stopped(seen, env)


@pytest.mark.parametrize("how", ["keyboard_interrupt", "sigterm"])
def test_interrupt_stops_baseline(params, env, monkeypatch, how):
    seen = _spy_baseline(monkeypatch)
    port = _port_pair()

    def interrupted(*a, **kw):
        if how == "sigterm":  # the default SIGTERM action would kill pytest: the benchmark must turn it into
            os.kill(os.getpid(), signal.SIGTERM)  # an exception and still stop the baseline
            time.sleep(5)
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "run_window_sync", interrupted)
    fake = make_fake_app(FakeSpec(variant_hash=params_variant_hash(params)))
    with ServerThread(fake, port=port) as url, pytest.raises(KeyboardInterrupt):
        serving_benchmark(params, _record(params, url), progress=False, root=env)
    _assert_stopped(seen, env)


def test_command_deploy_measures_candidate_only(params, env):
    fake = make_fake_app(FakeSpec(itl_ms=1, variant_hash=params_variant_hash(params)))
    with ServerThread(fake) as url:
        res = serving_benchmark(params, {**_record(params, url), "kind": "command"}, progress=False, root=env)
    assert res["baseline_measured"] is False and "command" in res["baseline_not_measured_reason"]
    assert res["ab"]["baseline_measured"] is False and res["ab"]["overall"]["ratio"] is None
    assert {r["impl"] for r in res["levels"]} == {"candidate"} and len(res["levels"]) == 4
    assert all(e["ratio"] is None and "baseline not measured" in e["note"] for e in res["ab"]["per_level"])
    assert not (env / ".kernelcamp" / "baseline-server.json").exists()


@pytest.mark.parametrize("key", ["concurrency", "cpu_concurrency"])
def test_duplicate_levels_are_refused_naming_the_key(params, key):
    p = copy.deepcopy(params)
    p["benchmark"]["serving"][key] = [1, 4, 1]
    with pytest.raises(KernelcampError, match=rf"^benchmark\.serving\.{key}=\[1, 4, 1\]: level 1 is listed twice"):
        bench.check_serving_params(p)
    with pytest.raises(KernelcampError, match=key):
        bench.serving_plan(p, on_cpu=key.startswith("cpu"))


@pytest.mark.parametrize(
    "upd,needle",
    [
        ({"min_repeats": 1}, "benchmark.serving.min_repeats=1"),
        ({"repeats": 3, "min_repeats": 4}, "benchmark.serving.min_repeats=4"),
        ({"window_s": 0}, "benchmark.serving.window_s=0"),
        ({"max_seconds": -1}, "benchmark.serving.max_seconds=-1"),
    ],
)
def test_unusable_repeat_plans_are_refused(params, upd, needle):
    p = copy.deepcopy(params)
    p["benchmark"]["serving"].update(upd)
    with pytest.raises(KernelcampError, match=needle):
        bench.check_serving_params(p)


def test_gpu_plan_is_sequential_and_cpu_plan_fixed(params):
    gpu = bench.serving_plan(params, on_cpu=False)
    seq = bench.repeat_plan(gpu, params)
    sv = params["benchmark"]["serving"]
    assert (seq.min_rounds, seq.max_rounds, seq.higher_is_better) == (sv["min_repeats"], sv["repeats"], True)
    assert gpu["window_s"] == sv["window_s"] and gpu["warmup_s"] == sv["warmup_s"]
    cpu = bench.repeat_plan(bench.serving_plan(params, on_cpu=True), params)
    assert cpu.looks == [2]


def test_a_server_left_slower_by_a_cuda_profile_is_not_timed(params, env):
    """A server whose info says cuda_profiled (CUPTI attached by an earlier profile: every later step is
    slower) is refused before any window, and by the benchmark stage's first check, with how to redeploy;
    the verify stage's check (outputs, not times) still accepts it."""
    from kernelcamp.bench.serving import require_deployed_server

    fake = make_fake_app(FakeSpec(itl_ms=1, variant_hash=params_variant_hash(params), cuda_profiled=True))
    with ServerThread(fake) as url:
        rec = _record(params, url)
        with pytest.raises(KernelcampError, match=r"will not be timed: .*CUPTI.*pytorch/pytorch#144455.*redeploy"):
            serving_benchmark(params, rec, progress=False, root=env)
        with pytest.raises(KernelcampError, match="CUPTI"):
            require_deployed_server(rec, timed=True)
        require_deployed_server(rec)
    assert not (env / ".kernelcamp" / "baseline-server.json").exists()


def test_a_server_of_another_variant_is_refused_naming_a_replacing_deploy(monkeypatch):
    # after `dvc queue start`, the queued experiment's deploy had replaced the workspace's server on its port; the
    # workspace's next run was told only that DVC "cannot see that a server stopped", though none had (helper-59)
    from kernelcamp.errors import KernelcampError

    monkeypatch.setattr(bench, "redeploy_advice", lambda: bench.REDEPLOY)
    rec = {"kind": "embedded", "url": "http://127.0.0.1:18631", "variant_hash": "d201d0a9896a24db", "pid": 1}
    with pytest.raises(KernelcampError) as e:
        bench.check_server(rec, {"variant_hash": "cd8416da963446dc", "pid": 1})
    msg = str(e.value)
    assert "runs variant hash cd8416da963446dc, but the deploy record says d201d0a9896a24db" in msg
    assert "another deploy, such as a queued experiment's, replaced it" in msg and "dvc repro -f -s deploy" in msg

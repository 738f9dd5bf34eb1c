"""stages/benchmark.py: an interrupted run leaves the previous run's outputs together."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _stage():
    spec = importlib.util.spec_from_file_location("benchmark_stage", ROOT / "stages" / "benchmark.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_interrupt_after_profiling_keeps_the_previous_traces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A Ctrl-C after the profile rewrote reports/trace.json.gz while benchmark.json and the baseline's
    # trace stayed from the run before: the report linked a trace of another variant.
    stage = _stage()
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["benchmark"]["serving"]["enabled"] = False
    params["benchmark"]["profile"]["enabled"] = True
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    from kernelcamp.spec import parse_spec

    hashes = parse_spec(params).hashes()  # records of these params: the stage checks them first
    (tmp_path / "build.json").write_text(json.dumps(hashes))
    (tmp_path / "deploy.json").write_text(json.dumps(hashes))
    rep = tmp_path / "reports"
    rep.mkdir()
    old = {"trace.json.gz": b"previous candidate trace", "trace.baseline.json.gz": b"previous baseline trace"}
    for name, data in old.items():
        (rep / name).write_bytes(data)
    fake_kernel = {"batch": {}, "overall": {"ratio": 1.0, "ci_lo": 1.0, "ci_hi": 1.0}}
    import kernelcamp.bench.record

    monkeypatch.setattr(kernelcamp.bench.record, "kernel_level", lambda p, v, d: ([], fake_kernel))

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    import kernelcamp.provenance

    monkeypatch.setattr(kernelcamp.provenance, "device_info", interrupted)  # right after the profile
    outs = {
        "out": rep / "benchmark.json",
        "metrics": rep / "m.json",
        "latency-csv": rep / "l.csv",
        "summary-csv": rep / "s.csv",
        "serving-csv": rep / "sv.csv",
        "serving-summary-csv": rep / "svs.csv",
        "trace": rep / "trace.json.gz",
        "kernel-table": rep / "kt.csv",
    }
    argv = ["benchmark.py", "--params", str(tmp_path / "params.yaml"), "--build", str(tmp_path / "build.json")]
    argv += ["--deploy", str(tmp_path / "deploy.json")]
    for k, v in outs.items():
        argv += [f"--{k}", str(v)]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(KeyboardInterrupt):
        stage.main()
    for name, data in old.items():
        assert (rep / name).read_bytes() == data, f"{name} was replaced by the interrupted run"
    assert sorted(p.name for p in rep.iterdir()) == sorted(old), "no staging folder or partial output may remain"


def test_stale_staging_folders_of_runs_gone_are_removed_before_the_run(tmp_path: Path, monkeypatch) -> None:
    """A SIGKILL of the whole run mid-benchmark left an empty reports/.trace-staging-XXXX/, and the next successful run
    did not remove it. The stage removes the staging folders whose run is gone before it makes its own; a live run's
    stay (its process alive with the start time in the name, or, for the older name without one, another live dvc
    run holding the tree)."""
    import subprocess

    import kernelcamp.runlock
    from kernelcamp.io import pid_start_time
    from kernelcamp.spec import parse_spec

    stage = _stage()
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["benchmark"]["serving"]["enabled"] = False
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    hashes = parse_spec(params).hashes()
    (tmp_path / "build.json").write_text(json.dumps(hashes))
    (tmp_path / "deploy.json").write_text(json.dumps(hashes))
    rep = tmp_path / "reports"
    rep.mkdir()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        start = pid_start_time(live.pid)
        names = {
            "legacy": ".trace-staging-k3j_x9a1",  # the name before owners were in it: what the SIGKILL'd run left
            "gone": f".trace-staging-{int(gone.stdout)}-{start}-abc",
            "reused": f".trace-staging-{live.pid}-{start + 1}-abc",  # its pid, now another process's
            "live": f".trace-staging-{live.pid}-{start}-abc",
        }
        for name in names.values():
            (rep / name).mkdir()
        made: list[Path] = []

        def measured(args, spec, deploy, device, run_as, notes, variants, final_traces, staging) -> int:
            made.append(staging)
            assert staging.name.startswith(f".trace-staging-{os.getpid()}-{pid_start_time(os.getpid())}-")
            assert sorted(p.name for p in rep.iterdir()) == sorted([names["live"], staging.name])
            return 0

        monkeypatch.setattr(kernelcamp.runlock, "live_claim", lambda path: None)  # no other run holds the tree
        monkeypatch.setattr(stage, "measure_and_write", measured)
        monkeypatch.setattr(stage, "variants_to_run", lambda spec, build, device: ([], []))
        monkeypatch.setattr(stage, "check_kernel_params", lambda params, device: None)
        argv = ["benchmark.py", "--params", str(tmp_path / "params.yaml"), "--build", str(tmp_path / "build.json")]
        argv += ["--deploy", str(tmp_path / "deploy.json"), "--trace", str(rep / "trace.json.gz")]
        for k in ("out", "metrics", "latency-csv", "summary-csv", "serving-csv", "serving-summary-csv", "kernel-table"):
            argv += [f"--{k}", str(rep / f"{k}.out")]
        monkeypatch.setattr(sys, "argv", argv)
        assert stage.main() == 0 and made
        assert sorted(p.name for p in rep.iterdir()) == [names["live"]], "its own staging folder is removed at the end"
        # the older name tells no owner: kept while another live dvc run holds this tree
        (rep / names["legacy"]).mkdir()
        monkeypatch.setattr(kernelcamp.runlock, "live_claim", lambda path: {"owner_pid": live.pid})
        assert stage.remove_stale_staging(rep) == [] and (rep / names["legacy"]).is_dir()
    finally:
        live.kill()
        live.wait()
    assert stage.remove_stale_staging(rep) == [rep / names["live"]]  # its process is gone now


def test_benchmark_refuses_a_deploy_of_other_params(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """deploy.json from another variant (params.yaml rewritten mid-run) stops the stage before it
    measures anything, naming both hashes."""
    from kernelcamp.errors import KernelcampError
    from kernelcamp.spec import parse_spec

    stage = _stage()
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    hashes = parse_spec(params).hashes()
    (tmp_path / "build.json").write_text(json.dumps(hashes))
    (tmp_path / "deploy.json").write_text(json.dumps({**hashes, "variant_hash": "feedfacefeedface"}))
    import kernelcamp.bench.record

    monkeypatch.setattr(kernelcamp.bench.record, "kernel_level", lambda *a: pytest.fail("measured a foreign deploy"))
    argv = ["benchmark.py", "--params", str(tmp_path / "params.yaml"), "--build", str(tmp_path / "build.json")]
    argv += ["--deploy", str(tmp_path / "deploy.json")]
    for k in ("out", "metrics", "latency-csv", "summary-csv", "serving-csv", "serving-summary-csv", "trace"):
        argv += [f"--{k}", str(tmp_path / k)]
    argv += ["--kernel-table", str(tmp_path / "kt.csv")]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(KernelcampError, match="deploy.json has variant_hash feedfacefeedface but params.yaml gives"):
        stage.main()


def test_one_baseline_server_serves_the_windows_and_the_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The serving A/B and the decode-step profile after it use one baseline server, started once and
    stopped once (it was started twice: about 15 s of every H200 run), and the record says it stopped."""
    import contextlib

    stage = _stage()
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["benchmark"]["serving"]["enabled"] = True
    params["benchmark"]["profile"]["enabled"] = True
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    from kernelcamp.spec import parse_spec

    hashes = parse_spec(params).hashes()
    (tmp_path / "build.json").write_text(json.dumps(hashes))
    (tmp_path / "deploy.json").write_text(json.dumps({**hashes, "kind": "embedded", "url": "http://127.0.0.1:1"}))
    import kernelcamp.bench.record as record
    import kernelcamp.bench.serving as serving
    import kernelcamp.provenance

    events: list = []
    fake_base = {"url": "http://127.0.0.1:2", "variant_name": "b", "variant_hash": "h"}

    @contextlib.contextmanager
    def fake_baseline_server(params, url, root=None):
        events.append("start")
        try:
            yield fake_base
        finally:
            events.append("stop")

    sv_record = {"levels": [{"concurrency": 1}], "baseline": {"url": fake_base["url"], "stopped": False}}

    def fake_serving_level(params, deploy, baseline=None):
        events.append(("serving", baseline))
        return sv_record

    def fake_server_profile(params, deploy, serving_res, traces, baseline=None):
        events.append(("profile", baseline))
        return [], {}, "no rows (test)"

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(serving, "require_deployed_server", lambda d, timed=False: None)
    monkeypatch.setattr(serving, "check_baseline_port", lambda p, d: None)
    monkeypatch.setattr(serving, "baseline_server", fake_baseline_server)
    monkeypatch.setattr(record, "kernel_level", lambda p, v, d: ([], {"batch": {}, "overall": {}}))
    monkeypatch.setattr(record, "serving_level", fake_serving_level)
    monkeypatch.setattr(record, "server_profile", fake_server_profile)
    monkeypatch.setattr(record, "kernel_launch_profile", lambda *a, **k: ([], {}))
    monkeypatch.setattr(kernelcamp.provenance, "device_info", interrupted)  # stop before the outputs
    rep = tmp_path / "reports"
    rep.mkdir()
    argv = ["benchmark.py", "--params", str(tmp_path / "params.yaml"), "--build", str(tmp_path / "build.json")]
    argv += ["--deploy", str(tmp_path / "deploy.json")]
    for k in ("out", "metrics", "latency-csv", "summary-csv", "serving-csv", "serving-summary-csv", "trace"):
        argv += [f"--{k}", str(rep / f"{k}.out")]
    argv += ["--kernel-table", str(rep / "kt.csv")]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(KeyboardInterrupt):
        stage.main()
    assert events == ["start", ("serving", fake_base), ("profile", fake_base), "stop"], events
    assert sv_record["baseline"]["stopped"] is True


def test_a_cpu_run_records_no_decision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """A CPU run's report said inconclusive while benchmark.json (``kernel.overall.decision``, each
    batch size's), benchmark_metrics.json and MLflow (``cpu.kernel.ab.decision``) said faster or
    equivalent: the record of a CPU run holds no decision but inconclusive, wherever it is written."""
    from kernelcamp.spec import parse_spec
    from kernelcamp.stats import DECISION_CODES

    stage = _stage()
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["benchmark"]["serving"]["enabled"] = False
    params["benchmark"]["profile"]["enabled"] = False
    params["workload"]["cpu"]["batch_sizes"] = [1]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    hashes = parse_spec(params).hashes()
    (tmp_path / "build.json").write_text(json.dumps(hashes))
    (tmp_path / "deploy.json").write_text(json.dumps(hashes))
    import kernelcamp.bench.record
    import kernelcamp.stats

    # the candidate is 10x faster in every round, as a variant that changes the work done would be: the
    # interval alone says faster
    real = kernelcamp.bench.record.kernel_level

    def ten_times_faster(p, variants, device):
        from kernelcamp.bench import timing

        bench_cpu = timing.bench_cpu

        def fake(fn, replays, warmup):  # fn: lambda launcher=..., a=...: the launcher holds its variant
            launcher = fn.__defaults__[0]
            return [10.0 if launcher.variant.name == params["variant"]["name"] else 100.0] * replays

        monkeypatch.setattr(timing, "bench_cpu", fake)
        try:
            return real(p, variants, device)
        finally:
            monkeypatch.setattr(timing, "bench_cpu", bench_cpu)

    monkeypatch.setattr(kernelcamp.bench.record, "kernel_level", ten_times_faster)
    argv = ["benchmark.py", "--params", str(tmp_path / "params.yaml"), "--build", str(tmp_path / "build.json")]
    argv += ["--deploy", str(tmp_path / "deploy.json")]
    outs = {k: tmp_path / "reports" / k for k in ("out", "metrics", "latency-csv", "summary-csv", "serving-csv")}
    outs |= {"serving-summary-csv": tmp_path / "reports" / "svs.csv", "trace": tmp_path / "reports" / "t.json.gz"}
    outs["kernel-table"] = tmp_path / "reports" / "kt.csv"
    for k, v in outs.items():
        argv += [f"--{k}", str(v)]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert stage.main() in (0, None)
    rec = json.loads(outs["out"].read_text())
    o = rec["kernel"]["overall"]
    assert o["ci_hi"] < 0.9, o  # the interval alone would have said faster
    found = []

    def walk(x):
        if isinstance(x, dict):
            if "decision" in x and x["decision"] is not None:
                found.append(x["decision"])
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(rec["kernel"])
    assert found and set(found) == {"inconclusive"}, found
    assert o["stop_reason"] == "max_rounds", o["stop_reason"]
    m = json.loads(outs["metrics"].read_text())
    assert m["cpu"]["kernel"]["ab"]["decision"] == DECISION_CODES["inconclusive"]
    # nor does its console: each look printed the interval's decision ("faster") before the record withheld it
    out = capsys.readouterr()
    looks = [line for line in (out.out + out.err).splitlines() if " look " in line]
    assert looks and all("(a CPU run decides nothing)" in line and "faster" not in line for line in looks), looks


def test_serving_summary_gives_the_steady_figures_its_ratio_compares() -> None:
    """serving_summary.csv put the A/B ratio of steady tok/s beside each impl's whole-run output tok/s only (a level
    at 151 against 151 tok/s with a ratio of 0.959), and dvc.yaml's plot drew those: both now carry steady tok/s."""
    from kernelcamp.bench.record import serving_summary

    level = {
        "concurrency": 4,
        "baseline": {"output_tok_s": 151.2, "steady_output_tok_s": 160.0},
        "candidate": {"output_tok_s": 150.8, "steady_output_tok_s": 152.0},
        "ratio": 0.959,
        "ci_lo": 0.08,
        "ci_hi": 10.8,
        "decision": "inconclusive",
        "valid": True,
    }
    (row,) = serving_summary({"ab": {"per_level": [level]}}, "cpu")
    assert row["baseline_steady_output_tok_s"] == 160.0 and row["candidate_steady_output_tok_s"] == 152.0
    assert row["baseline_output_tok_s"] == 151.2 and row["ratio"] == 0.959
    empty = serving_summary({"skipped": "off"}, "cpu")[0]
    assert set(row) - {"half_width", "decision"} <= set(empty), "the skipped row has the same columns"
    plots = yaml.safe_load((ROOT / "dvc.yaml").read_text())["plots"]
    drawn = [
        c for p in plots for spec in p.values() for c in (spec.get("y") or {}).get("reports/serving_summary.csv", [])
    ]
    assert drawn and all(c in row for c in drawn) and all("steady" in c for c in drawn), drawn

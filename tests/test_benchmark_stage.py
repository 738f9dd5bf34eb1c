"""stages/benchmark.py: an interrupted run leaves the previous run's outputs together."""

from __future__ import annotations

import importlib.util
import json
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

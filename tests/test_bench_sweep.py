"""benchmarks/bench_sweep.py: the summary of the two halves, each run in its own call."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_sweep", ROOT / "benchmarks" / "bench_sweep.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _mode(out: Path, mode: str, gpus: list[str], wall: float, p50: float) -> None:
    rows = [
        {
            "variant": "bt16_w4",
            "mode": mode,
            "experiment": f"bt16_w4-{mode}",
            "batch": 1,
            "candidate_latency_us_p50": p50,
            "candidate_latency_us_p20": p50 - 0.5,
            "candidate_latency_us_p80": p50 + 0.5,
            "ab_ratio": 1.0,
        }
    ]
    rec = {
        "mode": mode,
        "gpus": gpus,
        "variants": {"bt16_w4": f"bt16_w4-{mode}"},
        "overrides": ["benchmark.kernel.rounds=5"],
        "started": "2026-11-29T20:00:00Z",
        "wall_s": wall,
        "rc": 0,
        "rows": rows,
        "git_commit": "abc",
        "provenance": {"gpu_name": "TEST GPU", "gpu_count": 2},
    }
    (out / f"mode-{mode}.json").write_text(json.dumps(rec))


def test_summary_from_two_separately_run_halves(tmp_path: Path) -> None:
    bench = _bench()
    _mode(tmp_path, "1gpu", ["0"], 200.0, 10.0)
    with pytest.raises(SystemExit, match="mode-1gpu.json and one mode-<N>gpu.json"):
        bench.summarize(tmp_path)
    _mode(tmp_path, "2gpu", ["0", "1"], 100.0, 12.0)
    assert bench.summarize(tmp_path) == 0
    md = (tmp_path / "summary.md").read_text()
    assert "Speed-up 2.00x (ideal 2x)" in md
    assert "TEST GPU: GPU(s) 0 for one worker, 0,1 for one worker per GPU" in md
    # 10 us [9.5, 10.5] against 12 us [11.5, 12.5]: +20 %, outside the noise
    assert "| bt16_w4 | 1 | 10.00 | 9.50-10.50 | 12.00 | 11.50-12.50 | +20.00 | no |" in md


def test_rows_read_the_benchmark_metrics_names_the_stage_writes():
    # bench_sweep reads each experiment's benchmark_metrics.json: the names must be the ones the
    # benchmark stage writes (kernelcamp.metrics), or every figure comes back empty
    from kernelcamp.bench.record import benchmark_metrics

    b = json.loads((ROOT / "tests" / "fixtures" / "report" / "benchmark.json").read_text())
    rows = _bench().mode_rows({"v": "exp"}, "one", {"exp": benchmark_metrics(b["kernel"], b["serving"], "cuda")})
    assert rows and all(r["candidate_latency_us_p50"] and r["ab_ratio"] for r in rows)
    assert sorted(r["batch"] for r in rows) == sorted(int(B) for B in b["kernel"]["batch"])

"""dvc.yaml: a stage depends on every params key its code reads, so a changed value reruns it."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_benchmark_stage_depends_on_the_report_keys_its_stopping_rule_reads():
    # 2026-12-05: `-S report.threshold=0.01` after a run at 0.05 skipped the benchmark stage, so benchmark.json kept
    # the 0.05 decisions (batch 1 "equivalent" with a CI of [0.9747, 1.0238]) beside MLflow's threshold 0.01
    params = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["benchmark"]["params"]
    src = (ROOT / "kernelcamp" / "bench" / "kernel.py").read_text()
    assert 'rep.get("threshold"' in src or 'rep["threshold"]' in src  # kernel_plan reads report.threshold
    for k in ("confidence", "threshold"):
        assert f"report.{k}" in params, f"benchmark stage lacks report.{k}"

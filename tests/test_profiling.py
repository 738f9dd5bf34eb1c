"""kernelcamp.bench.profile: the kernel-launch profile (the fallback when serving is not measured)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import yaml

from kernelcamp.bench.profile import kernel_launch_profile
from kernelcamp.compose import compose_text
from kernelcamp.variant import parse_variant

ROOT = Path(__file__).resolve().parents[1]


def test_kernel_launch_profile_lists_kernels_not_its_own_annotation(tmp_path: Path) -> None:
    # On the H200 the table's second row was `impl:baseline`, the profile's own record_function range,
    # with the same device time as the kernel it wrapped.
    params = yaml.safe_load(compose_text(ROOT, ["workload.cpu.batch_sizes=[1]"]))
    variants = {"baseline": parse_variant(params["variant"], "variant").restricted([0])}
    traces = {"baseline": tmp_path / "trace.baseline.json.gz"}
    rows, meta = kernel_launch_profile(variants, params, "cpu", traces)
    names = [r["name"] for r in rows]
    assert names, "the profile found nothing"
    assert not [n for n in names if n.startswith(("impl:", "kernelcamp."))], names
    assert meta["baseline"]["mode"] == "kernel launches (no server)"
    with gzip.open(traces["baseline"], "rt") as f:
        assert json.load(f)["traceEvents"], "the trace must hold the launches"

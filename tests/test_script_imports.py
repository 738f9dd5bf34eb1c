"""Importing a script of benchmarks/ or stages/ leaves the process environment as it was.

stages/build.py and benchmarks/ptx_same.py once dropped TRITON_INTERPRET at import, which switched the rest of a
CPU test session off the Triton interpreter (a later verify case then failed on CI); benchmarks/compile_figures.py
and benchmarks/bench_inspect.py did the same (and set TRITON_CACHE_DIR) until the fix of the kind. A script
changes the environment only when it runs as one (under ``if __name__ == "__main__"`` or in its main function).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted([*ROOT.glob("benchmarks/*.py"), *ROOT.glob("stages/*.py")])


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_importing_a_script_leaves_the_environment_alone(path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    before = dict(os.environ)
    spec = importlib.util.spec_from_file_location(f"script_import_{path.parent.name}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    changed = {
        k: (before.get(k), os.environ.get(k)) for k in {*before, *os.environ} if before.get(k) != os.environ.get(k)
    }
    assert not changed, changed


def test_the_scripts_were_found():
    names = {p.name for p in SCRIPTS}
    assert {"compile_figures.py", "bench_inspect.py", "ptx_same.py", "build.py"} <= names

"""benchmarks/kernel_breakdown.py refuses a bad point or module in one line (exit 2), on a machine without a GPU too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, pythonpath: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "kernel_breakdown.py"), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env=env,
    )


def test_bad_point_is_one_line(tmp_path):
    r = _run(str(tmp_path / "o.json"), "kernels.sparse_mla_decode", "v99:T64_H64_w8_s2_kauto:1")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "family 'v99'" in r.stderr and not (tmp_path / "o.json").exists()


def test_a_module_that_cannot_be_imported_is_one_line(tmp_path):
    (tmp_path / "broken_kernel.py").write_text("raise RuntimeError('boom at import')\n")
    for module, want in [
        ("broken_kernel", "cannot import it (RuntimeError: boom at import)"),
        ("kernels.no_such_kernel", "cannot import it (ModuleNotFoundError: "),
    ]:
        r = _run(str(tmp_path / "o.json"), module, "v32:T64_H64_w8_s2_kauto:1", pythonpath=str(tmp_path))
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert r.stderr.startswith(f"error: module {module!r}: ") and want in r.stderr, r.stderr
        assert not (tmp_path / "o.json").exists()

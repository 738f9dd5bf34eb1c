"""benchmarks/compile_figures.py refuses bad arguments in one line (exit 2) before it compiles anything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from nointerp import env_without_interpreter

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "compile_figures.py"), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def test_bad_module_config_and_shape_are_one_line_each():
    cases = [
        (["--module", "kernels.no_such_kernel"], "--module kernels.no_such_kernel: cannot import it"),
        (["--module", "kernelcamp.io"], "has no compile_specs"),
        (["--configs", "T32_H16_w4_s3,T32_H16_bad"], "--configs 'T32_H16_bad': expected T<BLOCK_T>_H<BLOCK_H>"),
        (["--shapes", "v32,v99"], "--shapes 'v32,v99': expected a comma list of ['v32', 'v4', 'v32_tp8']"),
        # a label that parses but that the kernel refuses; modules that are not importable names
        (["--shapes", "v32_tp8", "--configs", "T15_H16_w4_s3"], "--configs 'T15_H16_w4_s3': BLOCK_T=15"),
        (["--module", ""], "--module '': expected an absolute module name"),
        (["--module", ".foo"], "--module '.foo': expected an absolute module name"),
        (["--batch", "0"], "--batch 0: expected a batch size >= 1"),
    ]
    for args, want in cases:
        r = _run(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: ") and want in r.stderr, r.stderr
        assert r.stdout == ""  # nothing compiled, no table header


def test_a_module_that_raises_on_import_is_one_line(tmp_path):
    (tmp_path / "broken_kernel.py").write_text("raise RuntimeError('boom at import')\n")
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "compile_figures.py"), "--module", "broken_kernel"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "cannot import it (RuntimeError: boom at import)" in r.stderr


def test_batch_1_compiles_the_split_d_binary_a_small_batch_launches():
    # V3.2 at B=1 launches 2 column parts (resolve_split_d): its binary, not the one-part binary of batch 128
    # (the figures were fixed at batch 128, where no row's split-D binary is built)
    env = env_without_interpreter()
    rows = {}
    for b in ("1", "128"):
        r = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "compile_figures.py"), "--shapes", "v32"]
            + ["--configs", "T64_H64_w8_s1", "--batch", b],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=600,
            env=env,
        )
        assert r.returncode == 0 and f"launched at batch {b}" in r.stdout, r.stdout + r.stderr[-2000:]
        rows[b] = [line for line in r.stdout.splitlines() if line.startswith("| v32 |")][0].split("|")
    # sm90, Triton 3.6: 2 parts take 224 registers and no local memory, 1 part 255 and 56 bytes of spills
    regs, local = {b: int(row[3]) for b, row in rows.items()}, {b: int(row[4]) for b, row in rows.items()}
    assert regs["1"] < regs["128"] and local["1"] == 0 < local["128"], rows

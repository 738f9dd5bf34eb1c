"""Every command module still runs as ``python -m <module>`` (scripts and muscle memory from before
the one-cli move): it is the same as ``kernelcamp <command>``, never a silent no-op."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kernelcamp.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_python_dash_m_module_is_the_command(command):
    module = COMMANDS[command][0]
    r = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-800:]
    assert f"kernelcamp {command}" in r.stdout, r.stdout[:400]
    bad = subprocess.run(
        [sys.executable, "-m", module, "--no-such-option"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert bad.returncode == 2 and bad.stderr.startswith("error:"), bad.stderr[-400:]


def test_python_dash_m_kernelcamp_is_the_cli():
    """`python -m kernelcamp` failed with "No module named kernelcamp.__main__" (the README names the `kernelcamp`
    script, the Makefile `python -m kernelcamp.cli`): it is the same command line, named kernelcamp."""
    r = subprocess.run(
        [sys.executable, "-m", "kernelcamp", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr[-800:]
    assert r.stdout.startswith("usage: kernelcamp <command>"), r.stdout[:400]
    r = subprocess.run(
        [sys.executable, "-m", "kernelcamp", "compose", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and r.stdout.startswith("usage: kernelcamp compose"), (r.stdout[:400], r.stderr[-400:])
    bad = subprocess.run(
        [sys.executable, "-m", "kernelcamp", "nope"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert bad.returncode == 2 and bad.stderr.startswith("error: unknown command 'nope'"), bad.stderr[-400:]

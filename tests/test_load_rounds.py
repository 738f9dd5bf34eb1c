"""benchmarks/load_rounds.py: the split-K combine's global loads in serial rounds, from its cross-compiled SASS."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("load_rounds", ROOT / "benchmarks" / "load_rounds.py")
lr = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lr)


def _sass(*instrs: str) -> str:
    return "\n".join(f"        /*{16 * i:04x}*/                   {s} ;  /* 0x000 */" for i, s in enumerate(instrs))


def test_loads_issued_together_are_one_round_and_a_use_ends_it():
    sass = _sass(
        "@!P0 LDG.E.128 R4, desc[UR10][R14.64]",
        "@!P0 LDG.E.128 R8, desc[UR10][R28.64]",
        "LDG.E R17, desc[UR10][R36.64]",
        "MUFU.EX2 R27, R17",  # uses the third load: the round's end
        "FMUL R33, R27, R4",
        "EXIT",
    )
    assert lr.load_rounds(sass) == [3]


def test_a_load_after_a_use_or_at_a_pending_address_starts_a_new_round():
    sass = _sass(
        "LDG.E.128 R4, desc[UR10][R14.64]",
        "FMUL R20, R4, R5",  # waits for round 1
        "CS2R R4, SRZ",  # the masked load's `other` value: a write, not a read
        "@!P0 LDG.E.128 R4, desc[UR10][R22.64]",  # round 2, reusing the registers
        "LDG.E R30, desc[UR10][R4.64]",  # its address is round 2's value: round 3
        "STG.E desc[UR10][R2.64], R30",
        "EXIT",
        "LDG.E R40, desc[UR10][R2.64]",  # after EXIT: not read
    )
    assert lr.load_rounds(sass) == [1, 1, 1]
    assert lr.load_rounds(_sass("IADD3 R1, R2, R3, RZ", "EXIT")) == []
    # cp.async copies and their barrier are not register loads
    assert lr.load_rounds(_sass("LDGSTS.E [R237+0x2e000], desc[UR60][R36.64]", "LDGDEPBAR", "EXIT")) == []


def _run(*args: str) -> subprocess.CompletedProcess:
    # a subprocess without TRITON_INTERPRET: compiling needs the real JIT, and this session runs on the interpreter
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "load_rounds.py"), *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)


def _rows(stdout: str) -> dict[tuple[str, int], int]:
    rows = {}
    for line in stdout.splitlines():
        f = line.split()
        if f and f[0] in lr.SHAPES:
            rows[(f[0], int(f[1]))] = int(f[7])
    return rows


def test_the_combine_issues_its_partial_outputs_in_several_rounds_at_small_batch_sizes():
    # main's combine (the LSEs first, 4 warps): what step "combineload" measured, and left as it was
    r = _run("--shapes", "v32,v32_tp8", "--batches", "1,2,16", "--max-rounds", "1")
    assert r.returncode == 1 and r.stdout.rstrip().endswith("more than 1 round(s): 14"), r.stdout + r.stderr[-2000:]
    assert _rows(r.stdout) == {
        ("v32", 1): 7,
        ("v32", 2): 14,
        ("v32", 16): 1,
        ("v32_tp8", 1): 2,
        ("v32_tp8", 2): 2,
        ("v32_tp8", 16): 7,
    }, r.stdout
    assert _run("--shapes", "v32", "--batches", "16", "--max-rounds", "1").returncode == 0


def test_bad_input_is_one_error_line_and_exit_2(capsys):
    assert lr.main(["--shapes", "v5"]) == 2
    assert lr.main(["--batches", "0"]) == 2
    assert lr.main(["--batches", "x"]) == 2
    assert lr.main(["--arch", "80"]) == 2
    assert lr.main(["--rev", "no_such_commit_name"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 5 and all(line.startswith("error: ") for line in err), err
    assert err[4].startswith("error: --rev 'no_such_commit_name'")

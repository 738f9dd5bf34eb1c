"""benchmarks/load_rounds.py: the split-K combine's global loads in serial rounds, from its cross-compiled SASS."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from nointerp import env_without_interpreter

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


def test_reads_without_a_register_destination_pairs_and_a_predicated_exit():
    # a compare writes a predicate and a move to a uniform register writes UR: every R operand of theirs is a read
    for use in ("ISETP.GE.AND P0, PT, R4, UR12, PT", "FSETP.NEU.AND P1, PT, R4, -INF , PT", "R2UR UR6, R4"):
        sass = _sass("LDG.E R4, desc[UR10][R14.64]", use, "LDG.E R8, desc[UR10][R16.64]", "FADD R9, R8, R8", "EXIT")
        assert lr.load_rounds(sass) == [1, 1], use
    # a .64 operand reads a register pair: R3 is the high half of the address R2.64
    sass = _sass("LDG.E R3, desc[UR10][R20.64]", "LDG.E R6, desc[UR10][R2.64]", "FADD R7, R6, R6", "EXIT")
    assert lr.load_rounds(sass) == [1, 1]
    # so does a wide multiply-add's addend: R11 is the high half of R10
    sass = _sass("LDG.E R11, desc[UR10][R20.64]", "IMAD.WIDE.U32 R14, R20, 0x4, R10", "EXIT")
    assert lr.load_rounds(sass) == [1]
    sass = _sass("LDG.E R11, desc[UR10][R20.64]", "IMAD.WIDE.U32 R14, R20, 0x4, R10", "LDG.E R2, desc[UR10][R14.64]")
    assert lr.load_rounds(sass + "\n" + _sass("EXIT")) == [1, 1]
    # a predicated EXIT (threads past the end of a tile) is not the kernel's end
    sass = _sass("@P0 EXIT", "LDG.E R4, desc[UR10][R14.64]", "FADD R5, R4, R4", "EXIT")
    assert lr.load_rounds(sass) == [1]
    # cp.async copies and their barrier are not register loads
    assert lr.load_rounds(_sass("LDGSTS.E [R237+0x2e000], desc[UR60][R36.64]", "LDGDEPBAR", "EXIT")) == []


def _run(*args: str) -> subprocess.CompletedProcess:
    # a subprocess without TRITON_INTERPRET: compiling needs the real JIT, and this session runs on the interpreter
    env = env_without_interpreter()
    cmd = [sys.executable, str(ROOT / "benchmarks" / "load_rounds.py"), *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _rows(stdout: str) -> dict[tuple[str, int], int]:
    rows = {}
    for line in stdout.splitlines():
        f = line.split()
        if f and f[0] in lr.SHAPES:
            rows[(f[0], int(f[1]))] = int(f[7])
    return rows


def test_the_combine_issues_its_partial_outputs_in_several_rounds_at_small_batch_sizes():
    # main's combine (the LSEs first, 4 warps), as step "combineload" measured and left it. With Triton 3.6's ptxas
    # for sm90: 7 rounds at V3.2 B=1, 14 at B=2, 1 at B=16 (4 splits), 7 at TP8 B=16; the exact counts are
    # ptxas's schedule, so only their order of size is held here
    r = _run("--shapes", "v32,v32_tp8", "--batches", "1,2,16", "--max-rounds", "1")
    assert r.returncode == 1 and "more than 1 round(s)" in r.stdout, r.stdout + r.stderr[-2000:]
    rows = _rows(r.stdout)
    assert set(rows) == {(s, b) for s in ("v32", "v32_tp8") for b in (1, 2, 16)}, r.stdout
    assert rows[("v32", 1)] > 2 and rows[("v32", 2)] > 2 and rows[("v32_tp8", 16)] > 2, r.stdout
    assert rows[("v32", 16)] == 1, r.stdout
    assert _run("--shapes", "v32", "--batches", "16", "--max-rounds", "1").returncode == 0


def test_bad_input_is_one_error_line_and_exit_2(capsys):
    bad = (
        ["--shapes", "v5"],
        ["--batches", "0"],
        ["--batches", "x"],
        ["--batches", "1,,2"],
        ["--arch", "80"],
        ["--arch", "200"],  # LLVM aborts the process on an arch it does not know: refused before any compile
        ["--max-rounds", "0"],
        ["--module", "no_such.kernel"],
        ["--rev", "no_such_commit_name"],
    )
    for args in bad:
        assert lr.main(args) == 2, args
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == len(bad) and all(line.startswith("error: ") for line in err), err
    assert err[-1].startswith("error: --rev 'no_such_commit_name'") and err[-2].startswith("error: --module no_such")


def test_a_kernel_file_whose_combine_does_not_compile_is_one_line(monkeypatch, capsys):
    # e.g. an older kernel file whose specs lack BLOCK_D: one error line naming the launch, exit 2
    def broken(*a, **k):
        raise KeyError("BLOCK_D")

    monkeypatch.setattr(lr, "combine_rounds", broken)
    assert lr.main(["--shapes", "v32", "--batches", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: v32 B=1: the combine does not compile here (KeyError"), err

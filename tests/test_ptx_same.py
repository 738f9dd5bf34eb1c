"""benchmarks/ptx_same.py: the split-K kernel's PTX at two commits, compared per shape and config."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from nointerp import env_without_interpreter

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("ptx_same", ROOT / "benchmarks" / "ptx_same.py")
ps = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ps)

TWO_LOOPS = "33f2e525e54f8e8bd5ce508893678534ae6e1576"  # V3.2 and V4 in two jit functions (after step v4tiles)
ONE_LOOP = "13d27740ad7aef7ff1efe839df21128292a42fb8"  # the same code as one function with LAYOUT a constexpr
BEFORE_V4TILES = "c282413ffc8bd500b99478aaff1d6622824dcf6d"  # V4's 512-wide tile and P scratch


def _have(*revs: str) -> bool:
    return all(
        subprocess.run(["git", "cat-file", "-e", f"{r}^{{commit}}"], cwd=ROOT, capture_output=True).returncode == 0
        for r in revs
    )


def test_normalized_ptx_drops_line_info_comments_and_debug_sections():
    ptx = (
        '\t.file\t1 "a.py"\n\t.loc\t1 10 5\n\tadd.s32 \t%r1, %r2, %r3;   \n// a comment\n.section\t.debug_info\n{junk}'
    )
    assert ps.normalized_ptx(ptx) == "\tadd.s32 \t%r1, %r2, %r3;"
    # inlining-scope labels (referenced only by the debug sections) go; branch targets stay
    assert ps.normalized_ptx("$L__tmp3:\n$L__BB0_2:\n\tbra.uni \t$L__BB0_2;") == "$L__BB0_2:\n\tbra.uni \t$L__BB0_2;"


def test_bad_shape_config_arch_or_commit_is_one_error_line_and_exit_2(capsys):
    assert ps.main(["HEAD", "--shapes", "v5"]) == 2
    assert ps.main(["HEAD", "--configs", "T64_H64"]) == 2
    assert ps.main(["HEAD", "--arch", "0"]) == 2
    assert ps.main(["no_such_commit_name"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and all(line.startswith("error: ") for line in err), err
    assert err[0].startswith("error: --shapes 'v5'") and err[2].startswith("error: --arch 0")
    assert err[3].startswith("error: REV_A 'no_such_commit_name'")  # the CLI's name, not the pipeline's key


def _run(*args: str) -> subprocess.CompletedProcess:
    # a subprocess without TRITON_INTERPRET: compiling needs the real JIT, and this session runs on the interpreter
    env = env_without_interpreter()
    cmd = [sys.executable, str(ROOT / "benchmarks" / "ptx_same.py"), *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)


def test_importing_it_leaves_the_interpreter_setting_alone(monkeypatch):
    # its import once dropped TRITON_INTERPRET for the whole test session (a later verify case then failed)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    again = importlib.util.module_from_spec(importlib.util.spec_from_file_location("ptx_same_again", _spec.origin))
    again.__spec__.loader.exec_module(again)
    assert os.environ.get("TRITON_INTERPRET") == "1"


@pytest.mark.slow
def test_the_one_loop_refactor_compiles_to_the_same_ptx_and_v4tiles_does_not():
    if not _have(TWO_LOOPS, ONE_LOOP, BEFORE_V4TILES):
        pytest.skip("the commits compared are not in this clone's history (a shallow clone)")
    r = _run(TWO_LOOPS, ONE_LOOP, "--configs", "T64_H64_w8_s2_kauto,T32_H16_w4_s3_k4", "--shapes", "v32,v4")
    assert r.returncode == 0 and "0 of 4 differ" in r.stdout, r.stdout + r.stderr[-2000:]
    r = _run(BEFORE_V4TILES, TWO_LOOPS, "--configs", "T64_H64_w8_s3_kauto_b32", "--shapes", "v4")  # a row label
    assert r.returncode == 1 and "DIFFERS v4 T64_H64_w8_s3_kauto" in r.stdout, r.stdout + r.stderr[-2000:]
    # a config that does not compile for the arch (fp8 e4m3 needs sm89+) is one line and exit 2, not "differs"
    r = _run(TWO_LOOPS, ONE_LOOP, "--configs", "T32_H16_w4_s2_kauto", "--shapes", "v4", "--arch", "80")
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1 and "does not compile for sm80" in err[0], r.stderr[-2000:]


def test_a_pair_outside_the_launch_domain_is_skipped_on_both_sides_and_differs_on_one(monkeypatch, capsys):
    # it used to stop at the first refused pair (exit 2), so a shape list with num_stages 3 on V3.2 (a depth the
    # warp-specialized kernel refuses there) had to be run one shape at a time
    class Side:
        def __init__(self, refuses):
            self.refuses = refuses

        def compile_specs(self, layout, heads, topk, config, batch):
            if (heads, config.num_stages) in self.refuses:
                raise ValueError(f"config {config.config_label()}: needs H a multiple of 64, got H={heads}")
            return [f"ptx {layout} {heads} {config.config_label()}"]

    sides = iter([Side({(16, 2)}), Side({(16, 2), (128, 3)})])
    monkeypatch.setattr(ps, "_side", lambda rev, module: next(sides))
    monkeypatch.setattr(ps, "compile_spec", lambda spec, arch: type("K", (), {"asm": {"ptx": spec}})())
    rc = ps.main(["HEAD", "--shapes", "v32,v32_tp8", "--configs", "T32_H64_w12_s2_kauto_ws,T32_H64_w12_s3_kauto_ws"])
    out = capsys.readouterr().out.splitlines()
    assert rc == 1, out
    assert "same    v32 T32_H64_w12_s2_kauto_ws (sm90)" in out
    # refused by side B only: a difference, with B's reason
    assert any(
        ln.startswith("DIFFERS v32 T32_H64_w12_s3_kauto_ws (sm90; working tree refuses it: config") for ln in out
    )
    assert any(ln.startswith("skipped v32_tp8 T32_H64_w12_s2_kauto_ws (sm90): config") for ln in out), out
    assert out[-1] == "HEAD vs working tree: 1 of 3 differ, 1 skipped (refused by both)"
    # every pair refused by both sides: nothing compared is not a pass
    sides = iter([Side({(16, 2)}), Side({(16, 2)})])
    assert ps.main(["HEAD", "--shapes", "v32_tp8", "--configs", "T32_H64_w12_s2_kauto_ws"]) == 2
    assert capsys.readouterr().err.strip() == "error: both sides refuse every pair (1): nothing was compared"

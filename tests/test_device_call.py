"""benchmarks/device_call.sh: one device call's clone of a branch from the bundle, its actions in order, its checks.

No device: a throwaway git repo holds the script, a no-op device_env.sh and a bench_kernel.py stub that writes
its summary; its bundle is carried as on the device, and nvidia-smi is a stub on PATH.
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
from pathlib import Path

from stubbin import stub_env

ROOT = Path(__file__).resolve().parents[1]

BENCH_STUB = """import argparse, pathlib, sys
p = argparse.ArgumentParser()
p.add_argument("--out")
p.add_argument("--families")
p.add_argument("--fail", action="store_true")
p.add_argument("--hang", action="store_true")
a = p.parse_args()
pathlib.Path(a.out, "summary.md").write_text(f"families {a.families}\\n")
print("measured", a.families, flush=True)
if a.hang:
    import time
    time.sleep(60)
sys.exit(3 if a.fail else 0)
"""


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def _carried(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """The carried working tree: the script, .whl/ and a bundle of branch `b` of a repo with the stubs."""
    repo = tmp_path / "repo"
    (repo / "benchmarks").mkdir(parents=True)
    (repo / "kernels").mkdir()
    shutil.copy(ROOT / "benchmarks" / "device_call.sh", repo / "benchmarks")
    (repo / "benchmarks" / "device_env.sh").write_text("echo device env: stub\n")
    (repo / "benchmarks" / "bench_kernel.py").write_text(BENCH_STUB)
    (repo / "kernels" / "sparse_mla_decode.py").write_text("# kernel\n")
    _git(repo, "init", "-q", "-b", "b")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "stub tree")
    tree = tmp_path / "tree"
    (tree / "benchmarks").mkdir(parents=True)
    shutil.copy(ROOT / "benchmarks" / "device_call.sh", tree / "benchmarks")
    (tree / ".whl").mkdir()
    (tree / ".probe").mkdir()
    _git(repo, "bundle", "create", str(tree / ".probe" / "repo.bundle"), "b")
    python = shutil.which("python3")
    env = stub_env(
        tmp_path,
        {
            "nvidia-smi": "#!/usr/bin/env bash\necho 'NVIDIA H200, 580, 1980 MHz'\n",
            "python": f'#!/usr/bin/env bash\nexec {python} "$@"\n',
        },
        OUT=str(tmp_path / "out"),
        KC_DIR=str(tmp_path / "kc"),
    )
    return tree, env


def _run(tree: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    cmd = ["bash", "benchmarks/device_call.sh", *args]
    return subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=60)


def test_runs_the_actions_in_order_and_returns_their_files(tmp_path):
    tree, env = _carried(tmp_path)
    (tree / ".probe" / "cand.txt").write_text("candidate\n")
    r = _run(
        tree,
        env,
        "b",
        "bench:one:--families+v4_flash",
        "bench:two:--families+v32",
        "run:two:cat+$CARRIED/.probe/cand.txt",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    out = tmp_path / "out"
    head = (out / "head.txt").read_text()
    assert "branch b:" in head and "stub tree" in head and "NVIDIA H200" in head and "device env: stub" in head
    log = (out / "call.log").read_text()
    assert log.index("== bench:one") < log.index("== bench:two") and "bench:two:--families+v32: exit 0" in log
    assert (out / "two.log").read_text() == "candidate\n"  # a run: action, in the clone, with $CARRIED
    with tarfile.open(out / "one.tgz") as t:
        assert sorted(t.getnames()) == ["one", "one/bench.log", "one/summary.md"]
        assert t.extractfile("one/summary.md").read() == b"families v4_flash\n"


def test_a_failed_action_sets_the_exit_status_and_the_next_action_still_runs(tmp_path):
    tree, env = _carried(tmp_path)
    r = _run(tree, env, "b", "bench:bad:--families+v32+--fail", "bench:good:--families+v4_flash")
    assert r.returncode == 3, r.stdout + r.stderr
    log = (tmp_path / "out" / "call.log").read_text()
    assert "bench:bad:--families+v32+--fail: exit 3" in log and "bench:good:--families+v4_flash: exit 0" in log
    assert (tmp_path / "out" / "good.tgz").exists()


def test_a_call_cut_by_an_outer_timeout_still_returns_the_bench_rows_written(tmp_path):
    tree, env = _carried(tmp_path)
    cmd = ["timeout", "4", "bash", "benchmarks/device_call.sh", "b", "bench:cut:--families+v32+--hang", "suite"]
    r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 124, r.stdout + r.stderr  # ended by the timeout, mid-bench, well before the bench's 60 s
    assert "stopped by a signal" in r.stderr
    with tarfile.open(tmp_path / "out" / "cut.tgz") as t:
        assert t.extractfile("cut/summary.md").read() == b"families v32\n"


def test_a_relative_out_is_taken_from_where_the_call_starts(tmp_path):
    tree, env = _carried(tmp_path)
    r = _run(tree, {**env, "OUT": "rel_out"}, "b", "run:x:echo+hi")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tree / "rel_out" / "x.log").read_text() == "hi\n" and (tree / "rel_out" / "head.txt").exists()


def test_bad_input_is_one_error_line_and_nothing_runs(tmp_path):
    tree, env = _carried(tmp_path)
    for args, what in [
        (("b", "sweep"), "unknown action 'sweep'"),
        (("b", "step:only"), "unknown action 'step:only'"),
        (("b",), "error: usage: device_call.sh BRANCH ACTION"),
        (("nosuch", "suite"), "branch 'nosuch' is not in .probe/repo.bundle"),
        (("b", "run:head:true"), "the name 'head' is one of the call's own files"),
        # a bench named as a step packed its folder into OUT/h32.tgz at exit, over the step's experiment (2026-12-08)
        (("b", "bench:h32:--x", "step:h32:v32"), "actions 'bench:h32:--x' and 'step:h32:v32' both write OUT/h32.tgz"),
        (("b", "run:x:true", "run:x:false"), "actions 'run:x:true' and 'run:x:false' both write OUT/x.log"),
        (("b", "step:final:v32", "final"), "both write OUT/final.tgz"),
    ]:
        r = _run(tree, env, *args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert what in r.stderr, (args, r.stderr)
        assert not (tmp_path / "out" / "call.log").exists()
    no_out = {k: v for k, v in env.items() if k != "OUT"}
    r = _run(tree, no_out, "b", "suite")
    assert r.returncode == 2 and r.stderr.strip() == "error: OUT (the folder whose files come back) is not set"
    shutil.rmtree(tree / ".probe")
    r = _run(tree, env, "b", "suite")
    assert r.returncode == 2 and "error: .probe/repo.bundle not carried" in r.stderr

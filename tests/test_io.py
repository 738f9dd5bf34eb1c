"""Atomic outputs and stage process hygiene (kernelcamp.io)."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernelcamp.io import write_json_atomic, write_text_atomic

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import os, sys, time
sys.path.insert(0, {root!r})
from kernelcamp.io import stage_main
def main():
    open({pidfile!r}, "w").write(str(os.getpid()))
    time.sleep(60)
stage_main(main)
"""

PARENT = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", {child!r}])
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux-only")
def test_stage_dies_when_its_parent_is_killed(tmp_path: Path) -> None:
    """`kill` of `dvc exp run` left the benchmark stage running, orphaned (found by a new user)."""
    pidfile = tmp_path / "stage.pid"
    child = CHILD.format(root=str(ROOT), pidfile=str(pidfile))
    parent = subprocess.Popen([sys.executable, "-c", PARENT.format(child=child)])
    deadline = time.monotonic() + 30
    while not pidfile.exists() or not pidfile.read_text():
        assert time.monotonic() < deadline, "the stage did not start"
        time.sleep(0.1)
    stage_pid = int(pidfile.read_text())
    assert _alive(stage_pid)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while _alive(stage_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = _alive(stage_pid)
    if alive:
        os.kill(stage_pid, signal.SIGKILL)
    assert not alive, "the stage outlived the process that ran it"


def test_outputs_are_readable_by_others(tmp_path: Path) -> None:
    """mkstemp files are 0600; reports must be readable in a shared workspace (found by a new user)."""
    old = os.umask(0o022)
    try:
        write_json_atomic(tmp_path / "a.json", {"x": 1})
        write_text_atomic(tmp_path / "b.md", "x")
    finally:
        os.umask(old)
    for name in ("a.json", "b.md"):
        mode = stat.S_IMODE((tmp_path / name).stat().st_mode)
        assert mode == 0o644, oct(mode)


@pytest.mark.parametrize("code,sig", [(130, "SIGINT"), (143, "SIGTERM")])
def test_a_stage_stopped_by_a_signal_says_so_in_one_line(capsys, code, sig):
    """tracked_stage turns SIGINT/SIGTERM into SystemExit(128 + signal) after recording a KILLED run: the
    stage printed nothing, and the only line was DVC's `failed to run: ... exited with 130`."""
    from kernelcamp.io import stage_main

    def main():
        raise SystemExit(code)

    with pytest.raises(SystemExit) as e:
        stage_main(main)
    assert e.value.code == code
    err = capsys.readouterr().err.strip().splitlines()
    want = f"error: interrupted by {sig}: this stage's outputs are as they were before it ran; run the pipeline again"
    assert err == [want]


def test_an_atomic_write_never_replaces_a_device_fifo_or_folder(tmp_path: Path) -> None:
    """`kernelcamp compose -o /dev/null` renamed a regular file over the machine's /dev/null; any output path
    a user gives (compose, bench_kernel.py --out, ...) goes through atomic_path."""
    from kernelcamp.errors import KernelcampError

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target, kind in ((fifo, "not a regular file"), (tmp_path, "a folder")):
        with pytest.raises(KernelcampError, match=f"cannot write {target}: it is {kind}"):
            write_text_atomic(target, "x")
    assert fifo.is_fifo() and [p.name for p in tmp_path.iterdir()] == ["fifo"]  # no temporary file left
    (tmp_path / "real.yaml").write_text("old")
    (tmp_path / "link.yaml").symlink_to(tmp_path / "real.yaml")
    write_text_atomic(tmp_path / "link.yaml", "new")  # a link (DVC's cache link) is replaced, never written into
    assert (tmp_path / "real.yaml").read_text() == "old" and (tmp_path / "link.yaml").read_text() == "new"
    assert not (tmp_path / "link.yaml").is_symlink()


@pytest.mark.parametrize(
    "body,want_rc,want",
    [
        # a cache too large for the machine (10**12 tokens): torch's allocator's RuntimeError was a traceback
        ("import torch; torch.empty(2**62, dtype=torch.uint8)", 2, "error: out of memory (tried to allocate "
         "4611686018427387904 bytes): the run's shapes do not fit this machine; lower workload.num_cache_tokens"),
        ("raise MemoryError()", 2, "error: out of memory (MemoryError)"),
        ("raise RuntimeError('a bug')", 1, "RuntimeError: a bug"),  # any other error keeps its traceback
    ],
)  # fmt: skip
def test_an_allocation_the_machine_cannot_make_is_one_line(body: str, want_rc: int, want: str) -> None:
    code = f"from kernelcamp.io import stage_main\ndef main():\n    {body}\nstage_main(main)\n"
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == want_rc, r.stderr
    lines = r.stderr.strip().splitlines()
    if want_rc == 2:
        assert len(lines) == 1 and lines[0].startswith(want), r.stderr
    else:
        assert "Traceback" in r.stderr and lines[-1] == want, r.stderr


def test_a_gpu_out_of_memory_names_the_request() -> None:
    """CUDA's message says "Tried to allocate" (capital T): the size was left out (helper-52)."""
    from kernelcamp.errors import out_of_memory

    e = RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB")
    assert "(tried to allocate 2.00 GiB)" in str(out_of_memory(e))


def test_records_are_checked_against_dvc_lock_only_under_dvc(tmp_path, monkeypatch):
    """check_records_as_written: under DVC (DVC_STAGE set) a record that dvc.lock lists must hold its stage's bytes;
    a stage run by hand, a file the lock does not list and a folder output are not checked (helper-59)."""
    import hashlib

    import yaml

    from kernelcamp.errors import KernelcampError
    from kernelcamp.io import check_records_as_written

    monkeypatch.chdir(tmp_path)
    (tmp_path / "reports").mkdir()
    rec = tmp_path / "reports" / "benchmark.json"
    rec.write_text('{"ratio": 1.031}')
    other = tmp_path / "reports" / "other.json"
    other.write_text("{}")
    outs = [
        {"path": "reports/benchmark.json", "hash": "md5", "md5": hashlib.md5(rec.read_bytes()).hexdigest()},
        {"path": "reports/plots", "hash": "md5", "md5": "0c0fd0568796a9adbea19743dbfe3c24.dir"},
    ]
    (tmp_path / "dvc.lock").write_text(yaml.safe_dump({"schema": "2.0", "stages": {"benchmark": {"outs": outs}}}))
    monkeypatch.setenv("DVC_STAGE", "report")
    check_records_as_written(["reports/benchmark.json", "reports/other.json", "reports/plots"])  # as written
    rec.write_text('{"ratio": 0.5}')
    with pytest.raises(KernelcampError) as e:
        check_records_as_written([str(rec)])  # an absolute path names the same lock entry
    msg = str(e.value)
    assert msg.startswith("reports/benchmark.json is not what the benchmark stage wrote (md5 ") and "\n" not in msg
    assert "run `dvc repro -f -s benchmark`" in msg
    monkeypatch.delenv("DVC_STAGE")
    check_records_as_written(["reports/benchmark.json"])  # run by hand: DVC's lock says nothing about this run
    monkeypatch.setenv("DVC_STAGE", "report")
    (tmp_path / "dvc.lock").unlink()
    check_records_as_written(["reports/benchmark.json"])  # no lock yet

"""kernelcamp sweep: one DVC queue worker per GPU, each with its own GPU ids, port and MLflow run."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kernelcamp import cli, ports, sweep
from kernelcamp.errors import KernelcampError

ROOT = Path(__file__).resolve().parents[1]

STAGE = textwrap.dedent(
    """
    import json, os, sys, time
    sys.path.insert(0, os.environ["KC_ROOT"])
    import mlflow
    from kernelcamp.ports import worker_port
    import yaml
    x = yaml.safe_load(open("params.yaml"))["x"]
    time.sleep(2)  # long enough that the two workers overlap
    port = worker_port(8765)
    mlflow.set_tracking_uri("sqlite:///" + os.path.join(os.environ["DVC_ROOT"], "mlflow.db"))
    mlflow.set_experiment("sweep-test")
    with mlflow.start_run() as run:
        mlflow.log_param("x", x)
        mlflow.set_tags({"cuda_visible_devices": os.environ["CUDA_VISIBLE_DEVICES"], "port": port})
        run_id = run.info.run_id
    json.dump({"cvd": os.environ["CUDA_VISIBLE_DEVICES"], "port": port, "run_id": run_id, "x": x},
              open("out.json", "w"))
    """
)


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def _mini_dvc_repo(tmp_path: Path, stage_src: str, gitignore: str) -> Path:
    """A committed git + DVC repo with one stage ``rec`` (``python stage.py``, param ``x``)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@t")
    _git(repo, "config", "user.name", "t")
    subprocess.run(["dvc", "init", "-q"], cwd=repo, check=True)
    (repo / "params.yaml").write_text("x: 1\n")
    (repo / "stage.py").write_text(stage_src)
    (repo / "dvc.yaml").write_text(
        "stages:\n  rec:\n    cmd: python stage.py\n    deps: [stage.py]\n    params: [x]\n"
        "    metrics:\n      - out.json: {cache: false}\n"
    )
    (repo / ".gitignore").write_text(gitignore)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "init")
    return repo


def _sweep(repo: Path, gpus: str) -> subprocess.CompletedProcess:
    """`kernelcamp sweep --gpus GPUS` in ``repo`` (this tree's code), polling every second."""
    env = dict(os.environ, KC_ROOT=str(ROOT), PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "kernelcamp.cli", "sweep", "--gpus", gpus, "--poll", "1"]
    return subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.timeout(300)
@pytest.mark.slow  # an end-to-end DVC queue run: `make test-slow` (CI runs both)
def test_a_sweep_whose_experiment_failed_says_so_and_exits_1(tmp_path: Path) -> None:
    """A queued experiment failed at its benchmark stage; the sweep still printed "done" and exited 0, and only
    `dvc queue status` showed the failure."""
    if shutil.which("dvc") is None:
        pytest.skip("dvc is not installed")
    failing = STAGE.replace("time.sleep(2)", 'time.sleep(0)\nif x == 13: sys.exit("error: x is 13")')
    repo = _mini_dvc_repo(tmp_path, failing, "mlflow.db\n")
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{repo / 'mlflow.db'}")
    mlflow.set_experiment("sweep-test")
    for x, name in ((2, "fine"), (13, "broken")):
        subprocess.run(["dvc", "exp", "run", "--queue", "-q", "-S", f"x={x}", "-n", name], cwd=repo, check=True)
    out = _sweep(repo, "7")
    assert out.returncode == 1, out.stdout + out.stderr
    lines = [ln for ln in (out.stdout + out.stderr).splitlines() if "experiment(s) failed" in ln]
    assert len(lines) == 1 and "1 experiment(s) failed: broken;" in lines[0], out.stdout + out.stderr


@pytest.mark.timeout(300)
@pytest.mark.slow  # an end-to-end DVC queue run: `make test-slow` (CI runs both)
def test_two_workers_each_own_gpu_port_and_run(tmp_path: Path) -> None:
    if shutil.which("dvc") is None:
        pytest.skip("dvc is not installed")
    repo = _mini_dvc_repo(tmp_path, STAGE, "mlflow.db\n")
    # The tracking store is created once before the workers start (DESIGN.md, reliability contract).
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{repo / 'mlflow.db'}")
    mlflow.set_experiment("sweep-test")
    for x in (2, 3):
        subprocess.run(["dvc", "exp", "run", "--queue", "-q", "-S", f"x={x}"], cwd=repo, check=True)
    out = _sweep(repo, "7,9")
    assert out.returncode == 0, out.stdout + out.stderr
    shown = json.loads(
        subprocess.run(["dvc", "exp", "show", "--json"], cwd=repo, check=True, capture_output=True, text=True).stdout
    )
    results = [
        r["data"]["metrics"]["out.json"]["data"]
        for b in shown
        for e in (b.get("experiments") or [])
        for r in e["revs"]
        if r.get("data")
    ]
    assert sorted(r["x"] for r in results) == [2, 3]
    assert sorted(r["cvd"] for r in results) == ["7", "9"], "each worker sees only its own GPU"
    # each worker's server port differs, and none is the workspace's own (8765)
    # (slot = GPU index: 8765 + 10 * (7 + 1), 8765 + 10 * (9 + 1))
    assert sorted(r["port"] for r in results) == [8845, 8865]
    runs = mlflow.search_runs(experiment_names=["sweep-test"], output_format="list")
    assert {r.info.run_id for r in runs} == {r["run_id"] for r in results}
    by_run = {r.info.run_id: r for r in runs}
    for r in results:
        tags = by_run[r["run_id"]].data.tags
        assert tags["cuda_visible_devices"] == r["cvd"] and tags["port"] == str(r["port"])
        assert by_run[r["run_id"]].info.status == "FINISHED"


def test_two_sweeps_on_disjoint_gpus_get_disjoint_slots() -> None:
    # Slots were positions 0..N-1: `sweep --gpus 0` in one repo and `sweep --gpus 1,2` in another
    # both gave their first worker slot 0, hence the same server port.
    assert sweep.worker_slots(["0"]) == [0]
    assert sweep.worker_slots(["1", "2"]) == [1, 2]
    assert sweep.worker_slots(["GPU-8f2c", "GPU-11ab"]) == [0, 1], "non-index ids fall back to positions"


SLOW_STAGE = textwrap.dedent(
    """
    import os, time
    open(os.path.join(os.environ["DVC_ROOT"], "stage.pid"), "w").write(str(os.getpid()))
    time.sleep(300)
    open("out.json", "w").write("{}")
    """
)


def _alive(pid: int) -> bool:
    from kernelcamp.io import pid_alive

    return pid_alive(pid)


@pytest.mark.timeout(300)
@pytest.mark.slow  # an end-to-end DVC queue run: `make test-slow` (CI runs both)
def test_sigterm_stops_workers_their_experiment_and_slot_servers(tmp_path: Path) -> None:
    # On the H200 a `timeout` SIGTERM ended `kernelcamp sweep` but left its queue workers (own
    # sessions) running: they went on draining the queue, on the GPUs of the next measurement.
    # And with two queued, in the seconds of its warm shutdown the worker took the second, was then killed, and
    # `dvc queue status` kept that one "Running" for good, with no worker left to run it.
    if shutil.which("dvc") is None:
        pytest.skip("dvc is not installed")
    import signal
    import time

    repo = _mini_dvc_repo(tmp_path, SLOW_STAGE, "mlflow.db\nstage.pid\n.kernelcamp/\n")
    for x in (2, 3):
        subprocess.run(["dvc", "exp", "run", "--queue", "-q", "-S", f"x={x}"], cwd=repo, check=True)
    # a server that slot 7's deploy stage would have left (a kernelcamp command line, own session)
    server = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)", "kernelcamp-fake-server"], start_new_session=True
    )
    slot_dir = repo / ".kernelcamp" / "slot7"
    slot_dir.mkdir(parents=True)
    (slot_dir / "server.json").write_text(json.dumps({"pid": server.pid, "pgid": server.pid}))
    env = dict(os.environ, KC_ROOT=str(ROOT), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernelcamp.cli", "sweep", "--gpus", "7", "--poll", "1"],
        cwd=repo,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 200  # DVC's queue start-up is slow on a loaded 2-core machine
        while not (repo / "stage.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert (repo / "stage.pid").exists(), "the queued experiment's stage never started"
        stage_pid = int((repo / "stage.pid").read_text())
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 143, out
        assert "terminated (SIGTERM)" in out
        deadline = time.monotonic() + 20
        while _alive(stage_pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(stage_pid), "the running experiment must stop with the sweep"
        assert server.wait(timeout=20) is not None, "the slot's embedded server must be stopped"
        status = subprocess.run(["dvc", "queue", "status"], cwd=repo, capture_output=True, text=True, check=True)
        rows = [ln for ln in status.stdout.splitlines() if ln.strip() and not ln.startswith(("Task", "Worker"))]
        # no experiment is left "Running": each is failed or still queued
        assert rows and all(("Failed" in r) or ("Queued" in r) for r in rows), status.stdout + out
        # the experiments the sweep marked failed are named in its output, and are failed rows
        named = re.search(r"none of them finished\): ([^;]+);", out)
        assert named is None or set(named.group(1).split(", ")) <= {r.split()[1] for r in rows if "Failed" in r}, out
    finally:
        for p in (proc, server):
            if p.poll() is None:
                p.kill()
        if (repo / "stage.pid").exists() and _alive(int((repo / "stage.pid").read_text())):
            os.kill(int((repo / "stage.pid").read_text()), signal.SIGKILL)


def test_a_workers_log_is_read_from_where_this_sweep_started_it(tmp_path: Path) -> None:
    # the slot's log is appended to by every sweep: an earlier sweep's "ready." and "received" lines made a new
    # worker look ready (the next one started beside it: the broker's pidbox race) and as one that took an
    # experiment (not started again after a failed start), and named an earlier sweep's tasks as this one's
    log = tmp_path / "worker-slot0-gpu0.log"
    old = "[..] n ready.\n[..] Task dvc.repo.experiments.queue.tasks.run_exp[aaaa-1] received\n"
    log.write_text(old)

    class Alive:
        def poll(self):
            return None

    w = sweep.Worker(0, "0", "n", Alive(), log, log_start=len(old.encode()))
    assert not sweep.worker_ready(w) and not sweep.took_experiment(w) and sweep.received_task_ids(w) == set()
    with open(log, "a") as fh:
        fh.write("[..] n ready.\n[..] Task dvc.repo.experiments.queue.tasks.run_exp[bbbb-2] received\n")
    assert sweep.worker_ready(w) and sweep.took_experiment(w) and sweep.received_task_ids(w) == {"bbbb-2"}
    assert sweep.fail_orphaned_experiments(tmp_path, set()) == []  # nothing taken: no repo is opened


def test_worker_env_pins_one_gpu() -> None:
    env = sweep.worker_env({"CUDA_VISIBLE_DEVICES": "0,1,2"}, "2", 1)
    assert env["CUDA_VISIBLE_DEVICES"] == "2" and env[ports.SLOT_ENV] == "1"


def test_worker_port_offsets_by_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ports.SLOT_ENV, raising=False)
    assert ports.worker_port(8765) == 8765
    monkeypatch.setenv(ports.SLOT_ENV, "0")
    assert ports.worker_port(8765) == 8765 + ports.PORT_STRIDE, "slot 0 must not take the workspace's port"
    monkeypatch.setenv(ports.SLOT_ENV, "3")
    assert ports.worker_port(8765) == 8765 + 4 * ports.PORT_STRIDE
    monkeypatch.setenv(ports.SLOT_ENV, "x")
    with pytest.raises(KernelcampError, match="KERNELCAMP_WORKER_SLOT"):
        ports.worker_slot()


def test_sweep_refuses_no_gpu_and_repeated_gpu(tmp_path: Path) -> None:
    with pytest.raises(KernelcampError, match="no GPU"):
        sweep.run_sweep(tmp_path, [])
    with pytest.raises(KernelcampError, match="once"):
        sweep.run_sweep(tmp_path, ["0", "0"])
    with pytest.raises(KernelcampError, match="once"):  # one GPU, one slot: it was refused as held by itself
        sweep.run_sweep(tmp_path, ["0", "00"])


def test_embedded_deploy_state_is_per_worker_slot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kernelcamp.deploy.common import state_dir

    monkeypatch.delenv(ports.SLOT_ENV, raising=False)
    assert state_dir(tmp_path) == tmp_path / ".kernelcamp"
    monkeypatch.setenv(ports.SLOT_ENV, "0")
    assert state_dir(tmp_path) == tmp_path / ".kernelcamp" / "slot0", "a worker must not stop the workspace's server"
    monkeypatch.setenv(ports.SLOT_ENV, "1")
    assert state_dir(tmp_path) == tmp_path / ".kernelcamp" / "slot1", "workers must not stop each other's servers"


def test_sweep_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # `kernelcamp sweep --repo <not a DVC repo>` ended in a NotDvcRepoError traceback; `--gpus abc`
    # and `--poll -1` were accepted.
    (tmp_path / ".dvc").mkdir()
    cases = [
        (["--repo", str(tmp_path / "nope"), "--gpus", "0"], "not a DVC repo"),
        (["--repo", str(tmp_path), "--gpus", "abc"], "'abc' is not a GPU id"),
        (["--repo", str(tmp_path), "--gpus", "0", "--poll", "-1"], "--poll -1.0: must be a positive"),
        # nan passed `poll_s <= 0` and crashed in time.sleep after a worker had started; inf never polled
        (["--repo", str(tmp_path), "--gpus", "0", "--poll", "nan"], "--poll nan: must be a positive"),
        (["--repo", str(tmp_path), "--gpus", "0", "--poll", "inf"], "--poll inf: must be a positive"),
    ]
    for argv, needle in cases:
        assert cli.main(["sweep", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_sweep_refuses_an_empty_queue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sweep, "prepare_tracking_store", lambda root: None)
    monkeypatch.setattr(sweep, "queued_count", lambda root: 0)
    (tmp_path / ".dvc").mkdir()
    with pytest.raises(KernelcampError, match="nothing is queued"):
        sweep.run_sweep(tmp_path, ["0", "1"])


def test_a_refused_sweep_leaves_no_slot_lock_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`kernelcamp sweep --gpus 0` on an empty queue left .kernelcamp/slot0/sweep.lock (and the folders): a refused
    command leaves nothing behind. A lock file it did not make (an earlier sweep's) stays, as does the store."""
    calls: list[str] = []
    monkeypatch.setattr(sweep, "prepare_tracking_store", lambda root: calls.append("store"))
    monkeypatch.setattr(sweep, "queued_count", lambda root: 0)
    (tmp_path / ".dvc").mkdir()
    with pytest.raises(KernelcampError, match="nothing is queued"):
        sweep.run_sweep(tmp_path, ["0"])
    assert sorted(p.name for p in tmp_path.iterdir()) == [".dvc"]
    assert calls == [], "an empty queue is refused before the tracking store is created"
    earlier = tmp_path / ".kernelcamp" / "slot0" / "sweep.lock"
    earlier.parent.mkdir(parents=True)
    earlier.write_text("123\n")
    with pytest.raises(KernelcampError, match="nothing is queued"):
        sweep.run_sweep(tmp_path, ["0", "1"])
    assert sorted(
        p.relative_to(tmp_path / ".kernelcamp").as_posix() for p in (tmp_path / ".kernelcamp").rglob("*")
    ) == [
        "slot0",
        "slot0/sweep.lock",
    ]


def test_a_slot_lock_removed_under_a_starting_sweep_is_made_again(tmp_path: Path, monkeypatch) -> None:
    """A refused sweep removes the lock file it made, while it holds it. A sweep that opened that file just before
    got its lock once it was released, on a file no longer at the path: it must lock the file at the path instead,
    or a third sweep would make a new one and two sweeps would hold one slot."""
    import fcntl

    from kernelcamp.deploy.common import state_dir

    lock = state_dir(tmp_path, 0) / "sweep.lock"
    real, removed = fcntl.flock, []

    def flock(fd: int, op: int) -> None:
        if op & fcntl.LOCK_EX and not removed:  # between this sweep's open and its lock
            removed.append(os.fstat(fd).st_ino)
            lock.unlink()
        real(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    held = sweep.hold_slots(tmp_path, [0], ["0"])
    try:
        assert removed and lock.is_file() and lock.read_text() == f"{os.getpid()}\n"
    finally:
        held.close()


def test_a_second_sweep_on_a_held_gpu_is_refused_before_anything(tmp_path: Path, monkeypatch) -> None:
    """A second `kernelcamp sweep --gpus 0` while one ran: it found no worker of its own, stopped slot 0's server
    (the first sweep's, mid-experiment: that experiment failed at benchmark) and said done, exit 0."""
    calls: list[str] = []
    monkeypatch.setattr(sweep, "prepare_tracking_store", lambda root: calls.append("store"))
    monkeypatch.setattr(sweep, "queued_count", lambda root: 0)
    monkeypatch.setattr(sweep, "stop_slot_servers", lambda root, slots: calls.append("stop") or [])
    (tmp_path / ".dvc").mkdir()
    first = sweep.hold_slots(tmp_path, [0], ["0"])  # the running sweep (flock: any other open file conflicts)
    try:
        with pytest.raises(
            KernelcampError,
            match=rf"GPU 0 \(worker slot 0\) is in use by another kernelcamp sweep of "
            rf"this workspace \(pid {os.getpid()}\)",
        ):
            sweep.run_sweep(tmp_path, ["0", "1"])
        assert calls == [], "the refused sweep touched the store or the servers"
        with pytest.raises(KernelcampError, match="nothing is queued"):  # another GPU is free
            sweep.run_sweep(tmp_path, ["1"])
    finally:
        first.close()
    with pytest.raises(KernelcampError, match="nothing is queued"):  # released with the first sweep
        sweep.run_sweep(tmp_path, ["0", "1"])


def test_bare_kernelcamp_is_a_usage_error(capsys: pytest.CaptureFixture) -> None:
    assert cli.main([]) == 2
    err = capsys.readouterr().err
    assert "usage: kernelcamp <command>" in err
    assert err.strip().splitlines()[-1] == "error: no command given (see `kernelcamp --help`)"  # it had none
    assert cli.main(["--help"]) == 0
    assert "sweep" in capsys.readouterr().out
    assert cli.main(["--version"]) == 0  # an unknown command, before
    assert capsys.readouterr().out.startswith("kernelcamp ")


def test_help_into_a_closed_pipe_ends_quietly() -> None:
    """`kernelcamp --help | head -1` ended in a BrokenPipeError traceback."""
    import subprocess
    import sys

    code = "import sys; from kernelcamp import cli; sys.argv = ['kernelcamp', '--help']; cli.run()"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # the reader is gone before anything is written
    err = p.stderr.read().decode()
    p.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_sigterm_while_the_queue_is_counted_still_stops_the_sweep(tmp_path: Path, monkeypatch) -> None:
    # In CI the SIGTERM arrived while the progress line counted the queue: its `except Exception`
    # swallowed the termination and the sweep waited for its worker instead of stopping it.
    import signal

    (tmp_path / ".dvc").mkdir()
    monkeypatch.setattr(sweep, "prepare_tracking_store", lambda root: None)
    monkeypatch.setattr(sweep, "stop_slot_servers", lambda root, slots: [])
    calls = {"n": 0}

    def count(root: Path) -> int:
        calls["n"] += 1
        if calls["n"] == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # lands inside DVC's queue count
        if calls["n"] > 20:
            pytest.fail("the sweep went on polling after SIGTERM")
        return 1

    monkeypatch.setattr(sweep, "queued_count", count)
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    monkeypatch.setattr(
        sweep, "start_workers", lambda root, gpus, log_dir: [sweep.Worker(0, "0", "n", worker, tmp_path / "w.log")]
    )
    try:
        assert sweep.run_sweep(tmp_path, ["0"], poll_s=0.01, log=lambda m: None) == 143
        assert worker.poll() is not None, "the worker must be stopped"
    finally:
        if worker.poll() is None:
            worker.kill()


def _fake_sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, active) -> subprocess.Popen:
    """A sweep whose one worker never exits (a DVC queue worker hung in its shutdown), over a queue that is drained
    after the first count; ``active(n)`` gives the n-th count of running experiments."""
    (tmp_path / ".dvc").mkdir()
    monkeypatch.setattr(sweep, "prepare_tracking_store", lambda root: None)
    monkeypatch.setattr(sweep, "stop_slot_servers", lambda root, slots: [])
    counts = iter([1] + [0] * 100000)
    monkeypatch.setattr(sweep, "queued_count", lambda root: next(counts))
    calls = {"n": 0}

    def count_active(root: Path) -> int:
        calls["n"] += 1
        return active(calls["n"])

    monkeypatch.setattr(sweep, "active_count", count_active)
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    monkeypatch.setattr(
        sweep, "start_workers", lambda root, gpus, log_dir: [sweep.Worker(0, "0", "n", worker, tmp_path / "w.log")]
    )
    return worker


def test_a_worker_hung_after_the_queue_drained_is_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a CI run: one of two DVC queue workers logged "shutting down due to empty queue" and never exited; the sweep
    # waited for it until the test's 240 s timeout. Now it stops a worker still alive drain_grace_s after the queue
    # was seen drained, and the sweep succeeds (its experiments had finished)
    worker = _fake_sweep(tmp_path, monkeypatch, active=lambda n: 0)
    lines: list[str] = []
    try:
        assert sweep.run_sweep(tmp_path, ["0"], poll_s=0.01, log=lines.append, drain_grace_s=0.2) == 0
        assert worker.poll() is not None, "the hung worker must be stopped"
        assert any("have not exited" in m and "GPU(s) 0" in m for m in lines), lines
    finally:
        if worker.poll() is None:
            worker.kill()


def test_a_worker_with_a_running_experiment_is_not_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # nothing queued but an experiment still running: the grace period has not begun, whatever time passes
    seen = {"alive": []}

    def active(n: int) -> int:
        if n <= 40:
            seen["alive"].append(worker.poll() is None)
            return 1
        return 0

    worker = _fake_sweep(tmp_path, monkeypatch, active=active)
    try:
        assert sweep.run_sweep(tmp_path, ["0"], poll_s=0.01, log=lambda m: None, drain_grace_s=0.1) == 0
        assert len(seen["alive"]) == 40 and all(seen["alive"]), "stopped while an experiment ran"
        assert worker.poll() is not None
    finally:
        if worker.poll() is None:
            worker.kill()


def _scripted_spawn(monkeypatch: pytest.MonkeyPatch, scripts: dict[str, list[str]]) -> list[tuple[str, float]]:
    """Replace the worker start with Python scripts: ``scripts[gpu]`` lists, one per start of that GPU's worker, a
    script run with ``LOG`` (its log path) and ``NODE`` (its node name) defined; returns the (gpu, time) of each
    start."""
    import time

    starts: list[tuple[str, float]] = []

    def spawn(repo_root: Path, slot: int, gpu: str, node: str, log: Path) -> subprocess.Popen:
        starts.append((gpu, time.monotonic()))
        code = f"LOG = {str(log)!r}; NODE = {node!r}\n" + scripts[gpu][sum(g == gpu for g, _ in starts) - 1]
        return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)

    monkeypatch.setattr(sweep, "_spawn", spawn)
    return starts


READY = "import time; time.sleep({delay}); open(LOG, 'a').write(NODE + ' ready.\\n')\n"
TOOK = "open(LOG, 'a').write('Task dvc.repo.experiments.queue.tasks.run_exp[x] received\\n')\n"
FAIL_AT_START = (
    "open(LOG, 'a').write('ERROR: unexpected error - Expecting value: line 1 column 1 (char 0)\\n'); exit(255)"
)


def _queue(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, counts: list[int]) -> None:
    """A repo whose queue counts are ``counts`` in turn (the first: the sweep's start), then 0; nothing active."""
    (tmp_path / ".dvc").mkdir()
    monkeypatch.setattr(sweep, "prepare_tracking_store", lambda root: None)
    monkeypatch.setattr(sweep, "stop_slot_servers", lambda root, slots: [])
    it = iter(counts)
    monkeypatch.setattr(sweep, "queued_count", lambda root: next(it, 0))
    monkeypatch.setattr(sweep, "active_count", lambda root: 0)


def test_workers_start_one_at_a_time_each_once_the_one_before_is_ready(tmp_path, monkeypatch) -> None:
    # a CI run: two DVC queue workers started together, and one exited at once with DVC's "unexpected error -
    # Expecting value: line 1 column 1 (char 0)" (the filesystem broker's pidbox file written by both: dvc-task #73)
    starts = _scripted_spawn(
        monkeypatch, {"7": [READY.format(delay=0.5) + "time.sleep(1)"], "9": ["import time; time.sleep(1)"]}
    )
    workers = sweep.start_workers(tmp_path, ["7", "9"], tmp_path / "logs", ready_timeout_s=10, poll_s=0.05)
    try:
        assert [g for g, _ in starts] == ["7", "9"]
        assert starts[1][1] - starts[0][1] >= 0.5, "the second worker started before the first was ready"
    finally:
        sweep.stop_workers(workers, grace_s=1)
    # a worker that never says it is ready holds the next one back only ready_timeout_s
    starts.clear()
    workers = sweep.start_workers(tmp_path, ["7", "9"], tmp_path / "logs2", ready_timeout_s=0.3, poll_s=0.05)
    try:
        assert 0.3 <= starts[1][1] - starts[0][1] < 5
    finally:
        sweep.stop_workers(workers, grace_s=1)


def test_a_worker_that_fails_at_its_start_is_started_again(tmp_path, monkeypatch) -> None:
    _queue(monkeypatch, tmp_path, [1, 1, 1, 1])
    starts = _scripted_spawn(monkeypatch, {"9": [FAIL_AT_START, TOOK]})
    lines: list[str] = []
    assert sweep.run_sweep(tmp_path, ["9"], poll_s=0.05, log=lines.append) == 0
    assert [g for g, _ in starts] == ["9", "9"]
    assert any("exited with 255 before it took an experiment" in m and "(1 of 2)" in m for m in lines), lines


def test_a_worker_failed_at_its_start_after_the_others_drained_the_queue_is_a_warning(tmp_path, monkeypatch) -> None:
    # the CI run above: worker 9 failed at once, worker 7 ran both experiments and the queue was drained
    _queue(monkeypatch, tmp_path, [2])
    _scripted_spawn(monkeypatch, {"7": [READY.format(delay=0) + TOOK], "9": [FAIL_AT_START]})
    lines: list[str] = []
    assert sweep.run_sweep(tmp_path, ["7", "9"], poll_s=0.05, log=lines.append) == 0
    assert any(m.startswith("sweep: warning: the worker on GPU 9 exited with 255") for m in lines), lines


def test_a_worker_that_fails_at_every_start_fails_the_sweep(tmp_path, monkeypatch) -> None:
    _queue(monkeypatch, tmp_path, [1] * 1000)
    starts = _scripted_spawn(monkeypatch, {"9": [FAIL_AT_START] * 3})
    lines: list[str] = []
    assert sweep.run_sweep(tmp_path, ["9"], poll_s=0.05, log=lines.append) == 1
    assert len(starts) == 1 + sweep.START_RETRIES
    assert any(m.startswith("sweep: worker on GPU 9 exited with 255") for m in lines), lines


def test_a_start_stopped_part_way_stops_the_workers_it_started(tmp_path, monkeypatch) -> None:
    # the start now waits between workers: a worker that cannot be started (or Ctrl-C in the wait) must not leave
    # the ones already started holding their GPUs
    started: list[subprocess.Popen] = []

    def spawn(repo_root: Path, slot: int, gpu: str, node: str, log: Path) -> subprocess.Popen:
        if gpu == "9":
            raise OSError("dvc: not found")
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
        started.append(p)
        return p

    monkeypatch.setattr(sweep, "_spawn", spawn)
    try:
        with pytest.raises(OSError):
            sweep.start_workers(tmp_path, ["7", "9"], tmp_path / "logs", ready_timeout_s=0.1, poll_s=0.05)
        assert len(started) == 1 and started[0].poll() is not None, "the first worker was left running"
    finally:
        for p in started:
            if p.poll() is None:
                p.kill()

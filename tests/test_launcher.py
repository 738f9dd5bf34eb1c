"""kernelcamp sweep --launcher local|local-gpu|slurm: queued experiments as submitit jobs, each in its own
clone of a git remote, pushed back there, logged to an MLflow server, DVC-cached outputs to a DVC remote.

The end-to-end test (slow) runs a small Hydra + DVC repo, not the kernel pipeline: its one stage is
the pipeline's run bookkeeping only (params.yaml, ``kernelcamp.tracking.tracked_run``, a DVC-cached
output and a metric), so that six experiment runs, a killed one included, fit in a few minutes on 2
CPU cores. The pipeline's own stages are covered by tests/test_pipeline.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from kernelcamp import cli, launcher
from kernelcamp.errors import KernelcampError

ROOT = Path(__file__).resolve().parents[1]
needs_dvc = pytest.mark.skipif(shutil.which("dvc") is None, reason="dvc is not installed")

STAGE = textwrap.dedent(
    """
    import json, os, time
    import yaml
    from kernelcamp.tracking import tracked_run

    params = yaml.safe_load(open("params.yaml"))
    x = params["x"]
    ctl = os.environ["KC_TEST_DIR"]
    with tracked_run(params) as run:
        run.log_params({"x": x})
        open(os.path.join(ctl, f"started-{x}"), "w").write(str(os.getpid()))
        deadline = time.time() + 240  # the test holds this experiment here until it kills its job
        while os.path.exists(os.path.join(ctl, f"block-{x}")) and time.time() < deadline:
            time.sleep(0.2)
        open("blob.bin", "w").write(f"blob {x}\\n" * 100)
        json.dump({"x": x}, open("out.json", "w"))
    """
)


def _sh(cmd: list[str], cwd: Path, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    e = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    e.pop("DVC_ROOT", None)
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=e)
    if r.returncode != 0:
        raise AssertionError(f"{cmd} exited {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _hydra_repo(tmp_path: Path, with_remote: bool = True) -> Path:
    """A committed git + DVC repo composed by Hydra like the workspace (conf/launcher and conf/tracking
    are this tree's), with one stage ``rec``; ``origin`` a bare git remote in ``tmp_path``."""
    repo = tmp_path / "ws"
    (repo / "conf").mkdir(parents=True)
    for group in ("launcher", "tracking"):
        shutil.copytree(ROOT / "conf" / group, repo / "conf" / group)
    (repo / "conf/config.yaml").write_text(
        "defaults:\n  - _self_\n  - tracking: default\n  - launcher: local\n  - optional local: default\n\nx: 1\n"
    )
    (repo / "stage.py").write_text(STAGE)
    (repo / "dvc.yaml").write_text(
        "stages:\n  rec:\n    cmd: python stage.py\n    deps: [stage.py]\n    params: [x]\n"
        "    outs: [blob.bin]\n    metrics:\n      - out.json: {cache: false}\n"
    )
    (repo / ".gitignore").write_text("/conf/local/\n")
    _sh(["git", "init", "-q", "-b", "main"], repo)
    _sh(["git", "config", "user.email", "t@t"], repo)
    _sh(["git", "config", "user.name", "t"], repo)
    _sh(["dvc", "init", "-q"], repo)
    _sh(["dvc", "config", "hydra.enabled", "true"], repo)
    _sh([sys.executable, "-m", "kernelcamp.cli", "compose"], repo)
    if with_remote:
        _sh(["git", "init", "-q", "--bare", "-b", "main", str(tmp_path / "remote.git")], tmp_path)
        _sh(["git", "remote", "add", "origin", str(tmp_path / "remote.git")], repo)
        _sh(["dvc", "remote", "add", "-d", "store", str(tmp_path / "dvcstore")], repo)
    _sh(["git", "add", "-A"], repo)
    _sh(["git", "commit", "-qm", "init"], repo)
    if with_remote:
        _sh(["git", "push", "-q", "origin", "main"], repo)
    return repo


@contextlib.contextmanager
def mlflow_server(tmp_path: Path):
    """A local ``mlflow server`` (SQLite backend) on a free port; always stopped, with its children."""
    port = _free_port()
    log = open(tmp_path / "mlflow-server.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
         "--artifacts-destination", str(tmp_path / "mlartifacts"), "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(uri + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            assert proc.poll() is None, (tmp_path / "mlflow-server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "mlflow server did not come up in 180 s"
            time.sleep(0.5)
        yield uri
    finally:
        for sig, wait_s in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=wait_s)
                break
        log.close()


def _gone(pid: int, timeout: float) -> bool:
    """Whether process ``pid`` has exited (or is a zombie) within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.2)
    return False


def _sweep(repo: Path, uri: str, ctl: Path, out: Path) -> subprocess.Popen:
    # the jobs push DVC-cached outputs to .dvc/config's default remote (`store`): launcher.dvc_remote is null
    cmd = [
        sys.executable,
        "-m",
        "kernelcamp.cli",
        "sweep",
        "--launcher",
        "local",
        "--poll",
        "1",
        "-S",
        "launcher.concurrency=4",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": uri, "KC_TEST_DIR": str(ctl)}
    return subprocess.Popen(cmd, cwd=repo, env=env, stdout=open(out, "w"), stderr=subprocess.STDOUT)  # noqa: SIM115


@needs_dvc
@pytest.mark.slow  # about 3 minutes on 2 cores: a real mlflow server and six DVC experiment runs
@pytest.mark.timeout(600)
def test_local_launcher_jobs_land_on_the_remotes_and_a_killed_one_reruns(tmp_path: Path) -> None:
    pytest.importorskip("submitit")
    from mlflow.tracking import MlflowClient

    repo = _hydra_repo(tmp_path)
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    _sh(["dvc", "exp", "run", "--queue", "-S", "x=1,2,3,4", "-n", "exp"], repo)  # exp-1 .. exp-4
    (ctl / "block-4").write_text("")  # exp-4 waits in its stage until its job is killed
    with mlflow_server(tmp_path) as uri:
        first = tmp_path / "sweep1.log"
        proc = _sweep(repo, uri, ctl, first)
        try:
            deadline = time.monotonic() + 240
            job = None
            while time.monotonic() < deadline and proc.poll() is None:
                m = re.search(r"sweep: job (\d+): exp-4\n", first.read_text())
                if m and (ctl / "started-4").exists() and (ctl / "started-4").read_text():
                    job = int(m.group(1))
                    break
                time.sleep(0.5)
            assert job is not None, first.read_text()
            os.kill(job, signal.SIGINT)  # what submitit's LocalJob.cancel() does to a local job
            # the block stays until the kill has reached the stage: lifted at once, the stage could see it gone
            # and end its run FINISHED before the signal arrived (a race this test lost once in CI)
            assert _gone(int((ctl / "started-4").read_text()), timeout=60), "the killed job's stage still runs"
            (ctl / "block-4").unlink()
            assert proc.wait(timeout=240) == 1, first.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
        text = first.read_text()
        assert "sweep: 3 of 4 landed" in text and "exp-4 did not land" in text, text

        # the killed variant is still queued: the same command runs it again
        second = tmp_path / "sweep2.log"
        proc = _sweep(repo, uri, ctl, second)
        assert proc.wait(timeout=300) == 0, second.read_text()
        assert "sweep: 1 of 1 landed" in second.read_text(), second.read_text()

        client = MlflowClient(uri)
        exp = client.get_experiment_by_name("kernelcamp")
        runs = client.search_runs([exp.experiment_id], max_results=100)
    finished = sorted(r.info.run_name for r in runs if r.info.status == "FINISHED")
    assert finished == ["exp-1", "exp-2", "exp-3", "exp-4"], [(r.info.run_name, r.info.status) for r in runs]
    killed = [r for r in runs if r.info.status != "FINISHED"]
    assert [(r.info.run_name, r.info.status in ("KILLED", "FAILED")) for r in killed] == [("exp-4", True)]

    # a fresh clone of the git remote sees all four experiments
    fresh = tmp_path / "fresh"
    _sh(["git", "clone", "-q", str(tmp_path / "remote.git"), str(fresh)], tmp_path)
    _sh(["dvc", "exp", "pull", "origin"], fresh)
    shown = json.loads(_sh(["dvc", "exp", "show", "--json"], fresh).stdout)
    exps = {e["name"]: e["revs"][0]["data"] for b in shown for e in (b.get("experiments") or [])}
    assert sorted(exps) == ["exp-1", "exp-2", "exp-3", "exp-4"], shown
    for name, data in exps.items():
        x = int(name.split("-")[1])
        assert data["params"]["params.yaml"]["data"]["x"] == x
        assert data["metrics"]["out.json"]["data"] == {"x": x}
    # the DVC-cached output of each went to the DVC remote, and came back with `dvc exp pull`
    assert len([p for p in (tmp_path / "dvcstore").rglob("*") if p.is_file()]) == 4
    _sh(["dvc", "exp", "apply", "exp-3"], fresh)
    assert (fresh / "blob.bin").read_text().startswith("blob 3")
    # the sweep left nothing queued and no shipping refs on the remote
    assert "refs/kernelcamp" not in _sh(["git", "ls-remote", str(tmp_path / "remote.git")], tmp_path).stdout
    assert _sh(["dvc", "queue", "status"], repo).stdout.count("Queued") == 0


@needs_dvc
@pytest.mark.slow  # about a minute on 2 cores: a real mlflow server and one DVC experiment run
@pytest.mark.timeout(400)
def test_a_sigterm_to_the_sweep_ends_the_running_experiments_run_killed(tmp_path: Path) -> None:
    # the sweep cancels its local jobs with submitit's LocalJob.cancel(): SIGINT, and SIGKILL about a second
    # later; the running experiment must still end its MLflow run KILLED and stay queued (coverage of the cancel
    # path: this stage stops within that second, and the test passed before this session's changes too)
    pytest.importorskip("submitit")
    from mlflow.tracking import MlflowClient

    repo = _hydra_repo(tmp_path)
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    _sh(["dvc", "exp", "run", "--queue", "-S", "x=5", "-n", "held"], repo)
    (ctl / "block-5").write_text("")  # the experiment waits in its stage until the sweep is stopped
    with mlflow_server(tmp_path) as uri:
        out = tmp_path / "sweep.log"
        proc = _sweep(repo, uri, ctl, out)
        try:
            deadline = time.monotonic() + 240
            while not (ctl / "started-5").exists() and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.5)
            assert (ctl / "started-5").exists(), out.read_text()
            time.sleep(1)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=120) == 143, out.read_text()
        finally:
            (ctl / "block-5").unlink(missing_ok=True)
            if proc.poll() is None:
                proc.kill()
        client = MlflowClient(uri)
        exp = client.get_experiment_by_name("kernelcamp")
        runs = client.search_runs([exp.experiment_id], max_results=10)
    assert [(r.info.run_name, r.info.status) for r in runs] == [("held", "KILLED")], out.read_text()
    assert "held" in _sh(["dvc", "queue", "status"], repo).stdout  # still queued: the same command reruns it


# ------------------------------------------------------------------------------ fast: checks, plans


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Path:
    if shutil.which("dvc") is None:
        pytest.skip("dvc is not installed")
    return _hydra_repo(tmp_path_factory.mktemp("launcher"))


def _one_line_error(capsys, argv: list[str], needle: str, **env: str) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        for k, v in env.items():
            mp.setenv(k, v)
        try:
            rc = cli.main(["sweep", *argv])
        except SystemExit as e:  # argparse's usage errors (kernelcamp.cli.UsageParser)
            rc = e.code
        assert rc == 2, argv
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_bad_input_is_one_line_and_nothing_is_pushed(ws: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("submitit")
    server = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    r = ["--repo", str(ws)]
    cases = [
        (["--launcher", "nope"], "invalid choice: 'nope'", {}),
        ([*r, "--launcher", "local", "-S", "variant.num_warps=8"], "launcher.* and tracking.* settings only", {}),
        ([*r, "--launcher", "local", "-S", "launcher.concurrency=0"], "launcher.concurrency = 0: must be >= 1", {}),
        ([*r, "--launcher", "local", "-S", "launcher.git_remote=upstream"], "has no such git remote", {}),
        ([*r, "--launcher", "local", "-S", "launcher.dvc_remote=nas"], "'nas': not a remote of", {}),
        ([*r, "--launcher", "local"], "jobs need an MLflow server, not sqlite:///", {}),
        ([*r, "--launcher", "local"], "is unreachable", {"MLFLOW_TRACKING_URI": server}),
        ([*r, "--launcher", "slurm"], "sbatch is not on PATH", {"PATH": os.path.dirname(sys.executable)}),
        ([*r, "--launcher", "local-gpu", "--gpus", "GPU-1a2b"], "distinct GPU indices", {}),
        (["--repo", str(ws / "nope"), "--launcher", "local"], "not a DVC repo", {}),
        ([*r, "-S", "launcher.concurrency=2"], "-S is for the submitit launchers", {}),
    ]  # fmt: skip
    for argv, needle, env in cases:
        if "sbatch" in needle and shutil.which("sbatch", path=env["PATH"]):
            continue
        _one_line_error(capsys, argv, needle, **env)
    remote = ws.parent / "remote.git"
    assert (
        "refs/kernelcamp"
        not in subprocess.run(["git", "ls-remote", str(remote)], capture_output=True, text=True).stdout
    )
    assert not (ws / ".dvc/tmp/kernelcamp-jobs").exists(), "no job folder before every check passed"


def test_local_gpu_without_gpus_names_the_fix() -> None:
    spec = launcher.LauncherSpec(name="local-gpu")
    e = launcher.QueuedExperiment("a", "s" * 40, "b" * 40)
    with pytest.raises(KernelcampError, match="no GPU found"):
        launcher.plan_jobs(spec, [e], "url", "http://x", Path("/tmp"), gpus=[])


def test_jobs_split_the_queue_one_per_gpu_or_concurrency_or_experiment() -> None:
    exps = [launcher.QueuedExperiment(f"e{i}", "s" * 40, "b" * 40) for i in range(5)]
    kw = dict(git_url="url", tracking_uri="http://x", clone_root=Path("/tmp"))
    gpu = launcher.plan_jobs(launcher.LauncherSpec(name="local-gpu"), exps, gpus=["0", "3"], **kw)
    assert [(p.gpu, p.slot, [e.name for e in p.experiments]) for p in gpu] == [
        ("0", 0, ["e0", "e2", "e4"]),
        ("3", 3, ["e1", "e3"]),
    ], "one job per GPU, slot = GPU index (its server ports), experiments round robin"
    local = launcher.plan_jobs(launcher.LauncherSpec(name="local", concurrency=8), exps[:3], **kw)
    assert [len(p.experiments) for p in local] == [1, 1, 1] and [p.slot for p in local] == [0, 1, 2]
    slurm = launcher.plan_jobs(launcher.LauncherSpec(name="slurm", concurrency=2), exps, **kw)
    assert [len(p.experiments) for p in slurm] == [1] * 5 and all(p.slot is None for p in slurm)


def test_slurm_settings_reach_sbatch() -> None:
    submitit = pytest.importorskip("submitit")
    from submitit.slurm.slurm import _make_sbatch_string

    spec = launcher.LauncherSpec(
        name="slurm", partition="gpu", gpu_type="h100", gpus_per_job=1, timeout_min=90.5, concurrency=3,
        cpus_per_job=8, mem_gb=64, setup=["source ~/venv/bin/activate"],
    )  # fmt: skip
    params = launcher.slurm_parameters(spec, n_tasks=10)
    text = _make_sbatch_string(command="true", folder="/tmp/kc", map_count=10, **params)
    for line in (
        "#SBATCH --partition=gpu",
        "#SBATCH --gres=gpu:h100:1",
        "#SBATCH --time=91",
        "#SBATCH --array=0-9%3",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH --mem=64GB",
        "source ~/venv/bin/activate",
    ):
        assert line in text, (line, text)
    assert submitit.__version__


def test_launcher_settings_rerun_no_stage() -> None:
    # a launcher setting must never rerun a stage: no stage of dvc.yaml lists it (or all params)
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    for name, st in stages.items():
        for p in st.get("params") or []:
            key = p if isinstance(p, str) else next(iter(p))
            assert not str(key).startswith("launcher"), f"stage {name} depends on {key}"
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert params["launcher"]["name"] == "local"


@pytest.mark.parametrize("name", launcher.LAUNCHERS)
def test_every_launcher_file_parses(name: str) -> None:
    from kernelcamp.compose import compose_text
    from kernelcamp.spec import parse_section

    params = yaml.safe_load(compose_text(ROOT, [f"launcher={name}"]))
    spec = parse_section(launcher.LauncherSpec, params["launcher"], "launcher")
    assert spec.name == name


def _fake_server(state: Path) -> subprocess.Popen:
    """A live process that stop_state takes for a kernelcamp server (its command line names kernelcamp), with
    its state file at ``state``."""
    from kernelcamp.io import pid_start_time

    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "kernelcamp"], start_new_session=True)
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text(json.dumps({"pid": p.pid, "pgid": p.pid, "start_time": pid_start_time(p.pid)}))
    return p


def test_a_job_stops_its_experiments_servers_before_removing_the_clone(tmp_path: Path, monkeypatch) -> None:
    """A local launcher sweep left every experiment's embedded server holding its port: the deployed server
    outlives the pipeline on purpose, and the clone that held its state file was removed."""
    procs = []

    def fake_run(cmd, cwd, env):
        if "run" in cmd and "exp" in cmd:  # the experiment deploys: a server with its state in the clone's slot
            procs.append(_fake_server(Path(cwd) / ".kernelcamp" / "slot1" / "server.json"))
            procs.append(_fake_server(Path(cwd) / ".kernelcamp" / "slot1" / "baseline-server.json"))
        return 0

    monkeypatch.setattr(launcher, "_run", fake_run)
    plan = launcher.JobPlan("url", None, "http://x", str(tmp_path / "clones"), False, (), slot=1)
    exp = launcher.QueuedExperiment("e0", "s" * 40, "b" * 40)
    try:
        res = launcher.run_experiment(plan, exp, {launcher.SLOT_ENV: "1"})
        assert res["status"] == "landed" and len(procs) == 2
        for p in procs:
            assert p.wait(timeout=30) is not None  # stopped, not left running
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_cancelled_sweep_stops_what_its_killed_jobs_left(tmp_path: Path) -> None:
    """submitit kills a cancelled local job about a second after its SIGINT, before the job's own cleanup:
    the sweep then stops the servers left in the clones (workspace and slot state folders)."""
    procs = [
        _fake_server(tmp_path / "e0-1" / ".kernelcamp" / "slot0" / "server.json"),
        _fake_server(tmp_path / "e1-2" / ".kernelcamp" / "server.json"),
    ]
    try:
        assert launcher.stop_clone_servers(tmp_path) == 2
        assert all(p.wait(timeout=30) is not None for p in procs)
        assert launcher.stop_clone_servers(tmp_path) == 0
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_the_sweeps_bookkeeping_runs_whole_under_a_signal(monkeypatch) -> None:
    """A SIGTERM while the sweep removed queue entries and shipping refs ended it silently, refs left behind."""
    from kernelcamp.signals import Terminated, signals_raise

    done = []

    def fake_finish(*args):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)  # the rest of the bookkeeping
        done.append(args)
        return 0

    monkeypatch.setattr(launcher, "_finish", fake_finish)
    with pytest.raises(Terminated), signals_raise((signal.SIGTERM,)):
        launcher._finish_whole(1, 2)
    assert done == [(1, 2)]

"""kernelcamp.tracking: honest run status, stale runs closed, params never truncated, a fresh
SQLite store shared by 4 processes at once, an unreachable server in one line."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kernelcamp import conftags, tracking
from kernelcamp.errors import KernelcampError

ROOT = Path(__file__).resolve().parents[1]
PARAMS = {
    "variant": {"name": "bt16_w8", "BLOCK_T": 16, "BLOCK_H": 16, "num_warps": 8, "num_stages": 2, "num_splits": "auto"},
    "baseline": {"name": "bl", "configs": [{"BLOCK_T": 16, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2}]},
    "workload": {"batch_sizes": [1, 8], "sm_scale": None},
    "tracking": {"uri": None, "experiment": "test"},
}


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A fresh SQLite store in tmp_path, found the way stages find it ($DVC_ROOT)."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    return tmp_path


def _runs(root, experiment="test"):
    from mlflow.tracking import MlflowClient

    c = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    exp = c.get_experiment_by_name(experiment)
    return [] if exp is None else c.search_runs([exp.experiment_id], max_results=100)


def _py(code, root, **kw):
    env = {**os.environ, "DVC_ROOT": str(root), "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=root,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **kw,
    )


def test_default_store_is_under_dvc_root(store):
    assert tracking.tracking_uri(PARAMS) == f"sqlite:///{store / 'mlflow.db'}"
    assert tracking.tracking_uri({"tracking": {"uri": "http://x:5000"}}) == "http://x:5000"


def test_a_sqlite_store_in_a_missing_folder_is_refused_and_not_made(store, tmp_path):
    """`sqlite:////nonexistent/dir/m.db` silently created /nonexistent/dir (store_lock made the folder): a store
    given by tracking.uri or MLFLOW_TRACKING_URI names a folder that exists; only the default store's folder, the
    workspace, is made."""
    uri = f"sqlite:///{tmp_path / 'no' / 'dir' / 'm.db'}"
    with pytest.raises(KernelcampError) as e:
        tracking.ensure_store({**PARAMS, "tracking": {"uri": uri, "experiment": "test"}})
    assert str(e.value) == (
        f"tracking.uri = '{uri}': the folder {tmp_path / 'no' / 'dir'} does not exist, and SQLite makes no folders; "
        "create it first, give a store in a folder that exists, or leave tracking.uri null for $DVC_ROOT/mlflow.db"
    )
    with pytest.MonkeyPatch.context() as m:
        m.setenv("MLFLOW_TRACKING_URI", uri)
        with pytest.raises(KernelcampError, match=r"^MLFLOW_TRACKING_URI = '.*': the folder .* does not exist"):
            tracking.ensure_store(PARAMS)
    with pytest.raises(FileNotFoundError), tracking.store_lock(uri):  # nor does the lock beside a store
        pass
    assert not (tmp_path / "no").exists()
    uri, _ = tracking.ensure_store(PARAMS)  # the default: $DVC_ROOT/mlflow.db
    assert uri == f"sqlite:///{store / 'mlflow.db'}" and (store / "mlflow.db").is_file()


def test_finished_run_holds_params_metrics_tags(store):
    with tracking.tracked_run(PARAMS, tags=tracking.run_tags(PARAMS)) as run:
        run.log_params(PARAMS)
        run.log_series([("kernel.candidate.latency_us_p50", 10.0, 1), ("kernel.candidate.latency_us_p50", 12.0, 8)])
    (r,) = _runs(store)
    assert r.info.status == "FINISHED"
    assert r.data.params["variant.num_warps"] == "8"
    assert r.data.params["baseline.configs.0.num_warps"] == "4"
    assert r.data.params["workload.batch_sizes"] == "[1, 8]"
    assert r.data.params["workload.sm_scale"] == "null"
    assert r.data.tags["variant"] == "bt16_w8" and len(r.data.tags["variant_config_hash"]) == 16
    from kernelcamp.hashes import params_variant_hash

    assert r.data.tags["variant_hash"] == params_variant_hash(PARAMS), "the hash the deployed server reports"
    assert r.data.tags["kernelcamp.pid"] == str(os.getpid())
    assert "git_commit" in r.data.tags and "git_dirty" in r.data.tags


def test_failed_on_exception_with_error_text(store):
    with pytest.raises(RuntimeError):
        with tracking.tracked_run(PARAMS):
            raise RuntimeError("boom in the middle")
    (r,) = _runs(store)
    assert r.info.status == "FAILED"
    assert "boom in the middle" in r.data.tags["kernelcamp.error"]


def test_failed_on_nonzero_exit(store):
    with pytest.raises(SystemExit):
        with tracking.tracked_run(PARAMS):
            sys.exit(3)
    (r,) = _runs(store)
    assert r.info.status == "FAILED" and "exit status 3" in r.data.tags["kernelcamp.error"]


def test_killed_on_sigterm_in_subprocess(store):
    p = _py(
        f"""
        import time
        from kernelcamp import tracking
        with tracking.tracked_run({PARAMS!r}) as run:
            print(run.run_id, flush=True)
            time.sleep(60)
        """,
        store,
    )
    run_id = p.stdout.readline().strip()
    assert run_id, p.stderr.read()
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=60) == 128 + signal.SIGTERM
    (r,) = _runs(store)
    assert r.info.run_id == run_id and r.info.status == "KILLED"
    assert "SIGTERM" in r.data.tags["kernelcamp.error"]


def test_a_stage_killed_inside_its_tracked_run_leaves_one_killed_run(store):
    """Ctrl-C while the report stage's run was open: the run ended KILLED, and tracked_stage around it recorded a
    second run, FAILED "exit status 130" (helper-54). One run, KILLED, and the stage's one interrupted line."""
    (store / "params.yaml").write_text(json.dumps(PARAMS))
    p = _py(
        f"""
        import time
        from kernelcamp import tracking
        from kernelcamp.io import stage_main
        def main():
            with tracking.tracked_run({PARAMS!r}) as run:
                print(run.run_id, flush=True)
                time.sleep(60)
        stage_main(tracking.tracked_stage("report", check_store=False)(main))
        """,
        store,
    )
    run_id = p.stdout.readline().strip()
    assert run_id, p.stderr.read()
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=60) == 128 + signal.SIGINT
    err = p.stderr.read().strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: interrupted by SIGINT"), err
    (r,) = _runs(store)
    assert r.info.run_id == run_id and r.info.status == "KILLED" and "SIGINT" in r.data.tags["kernelcamp.error"]


class _SignalsInFinalizer:
    """An object whose ``__del__`` sends this process ``signum`` and runs on: the handler raises inside the
    finalizer, where Python prints "Exception ignored in ..." and drops the exception."""

    def __init__(self, signum):
        self.signum = signum

    def __del__(self):
        os.kill(os.getpid(), self.signum)
        total = 0
        for i in range(3):  # bytecode after the kill: the handler runs here
            total += i


def test_a_signal_dropped_in_a_finalizer_is_delivered_again(capfd):
    """A Ctrl-C that landed while Python ran a finalizer was printed as "Exception ignored ... Terminated" and
    lost: the stage finished normally (helper-55, 1 in 20). It is delivered again, at once, with one line."""
    from kernelcamp.signals import Terminated, signals_raise

    done = []
    t0 = time.monotonic()
    with pytest.raises(Terminated) as e, signals_raise():
        _SignalsInFinalizer(signal.SIGINT)  # dropped at once: its __del__ runs here
        time.sleep(30)  # the stage's work, waiting in a system call (a server, a child process)
        done.append("the work went on to its end")
    assert e.value.signum == signal.SIGINT and done == [] and time.monotonic() - t0 < 10
    err = capfd.readouterr().err
    assert "Exception ignored" not in err and "SIGINT arrived inside a finalizer; delivering it again" in err


def test_a_signal_dropped_just_before_the_block_ends_is_raised_at_its_end(monkeypatch):
    """The redelivery may come after the block's last statement: the block's end raises the signal then."""
    from kernelcamp.signals import SignalGuard, Terminated, signals_raise

    monkeypatch.setattr(SignalGuard, "REDELIVER_S", 30.0)
    with pytest.raises(Terminated) as e, signals_raise():
        _SignalsInFinalizer(signal.SIGTERM)
    assert e.value.signum == signal.SIGTERM


def test_a_dropped_signal_of_another_exception_type_is_delivered_again(monkeypatch):
    """signals_raise's ``exc`` may make an exception with no ``signum`` (KeyboardInterrupt): it is matched too."""
    from kernelcamp.signals import SignalGuard, signals_raise

    monkeypatch.setattr(SignalGuard, "REDELIVER_S", 30.0)
    with pytest.raises(KeyboardInterrupt), signals_raise((signal.SIGINT,), exc=lambda s: KeyboardInterrupt()):
        _SignalsInFinalizer(signal.SIGINT)


def test_a_run_whose_signal_was_dropped_in_a_finalizer_ends_killed(store, monkeypatch):
    """tracked_run checks for such a signal before it ends the run FINISHED."""
    from kernelcamp.signals import SignalGuard

    monkeypatch.setattr(SignalGuard, "REDELIVER_S", 30.0)
    with pytest.raises(SystemExit) as e, tracking.tracked_run(PARAMS):
        _SignalsInFinalizer(signal.SIGINT)
    assert e.value.code == 128 + signal.SIGINT
    (r,) = _runs(store)
    assert r.info.status == "KILLED" and "SIGINT" in r.data.tags["kernelcamp.error"]


def test_a_stage_whose_signal_was_dropped_in_a_finalizer_ends_killed(store, monkeypatch):
    """tracked_stage records such a signal, raised as its block ends, as a KILLED run and exits 128+signal."""
    from kernelcamp.signals import SignalGuard

    monkeypatch.setattr(SignalGuard, "REDELIVER_S", 30.0)
    (store / "params.yaml").write_text(json.dumps(PARAMS))
    monkeypatch.chdir(store)

    @tracking.tracked_stage("report", check_store=False)
    def stage():
        _SignalsInFinalizer(signal.SIGTERM)

    with pytest.raises(SystemExit) as e:
        stage()
    assert e.value.code == 128 + signal.SIGTERM
    (r,) = _runs(store)
    assert r.info.status == "KILLED" and "SIGTERM" in r.data.tags["kernelcamp.error"]


def _signal_after(monkeypatch, method, signum, when=lambda *a, **kw: True):
    """Have the first call of ``MlflowClient.<method>`` for which ``when`` holds send this process ``signum`` after
    it wrote (inside the store lock, so the signal is held until the write is done and delivered as the lock is
    released)."""
    from mlflow.tracking import MlflowClient

    original = getattr(MlflowClient, method)
    sent = []

    def wrapped(self, *a, **kw):
        out = original(self, *a, **kw)
        if not sent and when(*a, **kw):
            sent.append(signum)
            os.kill(os.getpid(), signum)
        return out

    monkeypatch.setattr(MlflowClient, method, wrapped)


def _report_stage(store, monkeypatch):
    """A report-like stage in this process: its tracked run logs params and ends FINISHED."""
    (store / "params.yaml").write_text(json.dumps(PARAMS))
    monkeypatch.chdir(store)

    @tracking.tracked_stage("report", check_store=False)
    def stage():
        with tracking.tracked_run(PARAMS) as run:
            run.log_params(PARAMS)

    return stage


def test_a_signal_as_the_run_is_created_leaves_one_killed_run(store, monkeypatch):
    """A Ctrl-C while the report created its MLflow run was delivered as start_run's write ended, before tracked_run
    held the run: the run stayed RUNNING, and tracked_stage recorded a second one, KILLED (helper-56, 5 of 14)."""
    stage = _report_stage(store, monkeypatch)
    _signal_after(monkeypatch, "create_run", signal.SIGINT)
    with pytest.raises(SystemExit) as e:
        stage()
    assert e.value.code == 128 + signal.SIGINT and not getattr(e.value, "kernelcamp_run_finished", False)
    (r,) = _runs(store)
    assert r.info.status == "KILLED" and "SIGINT" in r.data.tags["kernelcamp.error"]
    assert r.data.params.get("variant.name") == PARAMS["variant"]["name"]  # the run carries the stage's params
    # and the tags a search by stage or variant finds it with, as a run of record_stage_failure (helper-57)
    assert r.data.tags.get("kernelcamp.stage") == "report" and r.data.tags.get("variant") == "bt16_w8"


def test_the_outputs_and_the_finished_end_come_together(store, monkeypatch, capsys):
    """A signal between the report's replaced outputs and its run's FINISHED end left a KILLED run and the line
    "this stage's outputs are as they were before it ran" beside the new report.md (helper-57). The outputs are
    put in place with the end (Run.on_finish), signals held: one FINISHED run, and the line says they are written."""
    from kernelcamp.io import stage_main

    (store / "params.yaml").write_text(json.dumps(PARAMS))
    monkeypatch.chdir(store)
    done = []

    def put_in_place():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # Python would run the handler here
        done.append("report.md replaced")

    @tracking.tracked_stage("report", check_store=False)
    def stage():
        with tracking.tracked_run(PARAMS) as run:
            run.on_finish(put_in_place)

    with pytest.raises(SystemExit) as e:
        stage_main(stage)
    assert e.value.code == 128 + signal.SIGINT and done == ["report.md replaced"]
    (r,) = _runs(store)
    assert r.info.status == "FINISHED"
    assert "its outputs are written" in capsys.readouterr().err


def test_a_failed_output_step_ends_the_run_failed(store):
    """An error while the outputs are put in place ends the run FAILED with it (no FINISHED run without outputs)."""

    def put_in_place():
        raise OSError("disk full")

    with pytest.raises(OSError), tracking.tracked_run(PARAMS) as run:
        run.on_finish(put_in_place)
    (r,) = _runs(store)
    assert r.info.status == "FAILED" and "disk full" in r.data.tags["kernelcamp.error"]


def test_a_signal_as_the_run_ends_finished_adds_no_second_run(store, monkeypatch, capsys):
    """A Ctrl-C as the run ended FINISHED was delivered after that write: a second run, KILLED, and a line saying
    the outputs were as before, though the report had replaced them (helper-56). One FINISHED run, and a line that
    says the outputs are written."""
    from kernelcamp.io import stage_main

    stage = _report_stage(store, monkeypatch)
    _signal_after(monkeypatch, "set_terminated", signal.SIGTERM, lambda *a, **kw: kw.get("status") == "FINISHED")
    with pytest.raises(SystemExit) as e:
        stage_main(stage)
    assert e.value.code == 128 + signal.SIGTERM
    (r,) = _runs(store)
    assert r.info.status == "FINISHED"
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: interrupted by SIGTERM as this stage's MLflow run ended FINISHED: its outputs are written, but DVC "
        "does not record the stage as done; run the pipeline again"
    ]


def test_a_signal_as_the_run_ends_killed_adds_no_second_run(store, monkeypatch):
    """A second signal while the first one's KILLED end was written: still one run, KILLED."""
    stage = _report_stage(store, monkeypatch)
    _signal_after(monkeypatch, "log_batch", signal.SIGINT)
    _signal_after(monkeypatch, "set_terminated", signal.SIGINT, lambda *a, **kw: kw.get("status") == "KILLED")
    with pytest.raises(SystemExit) as e:
        stage()
    assert e.value.code == 128 + signal.SIGINT and not getattr(e.value, "kernelcamp_run_finished", False)
    (r,) = _runs(store)
    assert r.info.status == "KILLED"


def test_stale_running_run_is_closed(store):
    p = _py(
        f"""
        import os
        from kernelcamp import tracking
        run = tracking.start_run({PARAMS!r})
        print(run.run_id, flush=True)
        os._exit(0)   # like SIGKILL: MLflow would leave this run RUNNING forever
        """,
        store,
    )
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    (r,) = _runs(store)
    assert r.info.status == "RUNNING"
    tracking.ensure_store(PARAMS)
    (r,) = _runs(store)
    assert r.info.status == "KILLED"
    assert "is gone" in r.data.tags["kernelcamp.closed_reason"]


def test_a_run_whose_pid_went_to_another_process_is_closed(store):
    """Closing stale runs checked only that the owner's pid was alive: a pid reused by an unrelated process
    kept a dead run RUNNING. The run's pid_start tag tells the two apart."""
    from mlflow.tracking import MlflowClient

    run = tracking.start_run(PARAMS)  # owned by this (live) process
    client = MlflowClient(tracking.tracking_uri(PARAMS))
    tags = client.get_run(run.run_id).data.tags
    assert tags["kernelcamp.pid_start"].isdigit()
    # the same live pid, another start time: the process that made the run is gone, its pid reused
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        client.set_tag(run.run_id, "kernelcamp.pid", str(other.pid))
        tracking.ensure_store(PARAMS)
        assert client.get_run(run.run_id).info.status == "KILLED"
    finally:
        other.kill()
        other.wait()


def test_a_run_of_a_live_owner_stays_running(store):
    """The other side of the check above: a live owner with its own start time keeps its run."""
    from mlflow.tracking import MlflowClient

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        run = tracking.start_run(PARAMS)
        client = MlflowClient(tracking.tracking_uri(PARAMS))
        start = tracking.pid_start_time(other.pid)
        client.set_tag(run.run_id, "kernelcamp.pid", str(other.pid))
        client.set_tag(run.run_id, "kernelcamp.pid_start", str(start))
        tracking.ensure_store(PARAMS)
        assert client.get_run(run.run_id).info.status == "RUNNING"
    finally:
        other.kill()
        other.wait()


@pytest.mark.parametrize(
    "params", [{"env": {"K:1": "x", "K_1": "y"}}, {"env": {"a/../b": "1"}}, {"a.b": 1, "a": {"b": 2}}]
)
def test_params_that_would_clash_or_be_refused_in_mlflow_stop_before_logging(params):
    """``K:1`` and ``K_1`` both became ``K_1`` and one value was silently dropped; ``a/../b`` failed the
    report's run after everything was measured."""
    with pytest.raises(KernelcampError, match="cannot be logged to MLflow as it is"):
        tracking.flatten_params(params)


def test_overlong_param_goes_to_an_artifact_not_truncated(store):
    long_value = "x" * (tracking.MAX_PARAM_LEN + 10)
    with tracking.tracked_run(PARAMS) as run:
        run.log_params({**PARAMS, "note": long_value})
    (r,) = _runs(store)
    assert r.data.params["note"] == "<see params/note.json>"
    from mlflow.artifacts import download_artifacts

    path = download_artifacts(
        run_id=r.info.run_id, artifact_path="params/note.json", tracking_uri=f"sqlite:///{store / 'mlflow.db'}"
    )
    assert json.loads(Path(path).read_text())["value"] == long_value


def test_flatten_and_split_keep_every_value():
    flat = tracking.flatten_params({"a": {"b": [{"c": 1}, {"c": 2}], "d": [1, 2], "e": True, "bad key!": 1}})
    assert flat == {"a.b.0.c": "1", "a.b.1.c": "2", "a.d": "[1, 2]", "a.e": "true", "a.bad key_": "1"}
    params, arts = tracking.split_long_params({"k": "y" * 20}, max_len=10)
    assert params == {"k": "<see params/k.json>"} and json.loads(arts["k.json"])["value"] == "y" * 20


@pytest.mark.slow  # > 9 s on 2 cores: `make test-slow` (CI runs both)
def test_four_processes_on_a_fresh_store(store):
    code = f"""
        import sys
        from kernelcamp import tracking
        with tracking.tracked_run({PARAMS!r}, run_name="w" + sys.argv[1]) as run:
            run.log_params({PARAMS!r})
            run.log_series([("m", float(i), i) for i in range(50)])
        """
    env = {**os.environ, "DVC_ROOT": str(store), "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code), str(i)],
            cwd=store,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    results = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], [e[-2000:] for _, e in results]
    runs = _runs(store)
    assert sorted(r.info.run_name for r in runs) == ["w0", "w1", "w2", "w3"]
    assert all(r.info.status == "FINISHED" for r in runs)
    assert all(r.data.params["variant.num_warps"] == "8" for r in runs)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_server_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{_free_port()}")
    t0 = time.time()
    with pytest.raises(KernelcampError, match="unreachable") as e:
        tracking.ensure_store(PARAMS)
    assert "\n" not in str(e.value) and time.time() - t0 < 15


def test_tracked_stage_records_failure_and_unreachable_is_one_line(store):
    (store / "params.yaml").write_text(json.dumps(PARAMS))
    code = """
        from kernelcamp.errors import KernelcampError
        from kernelcamp.io import stage_main
        from kernelcamp.tracking import tracked_stage
        def main():
            raise KernelcampError("no config of variant 'x' fits target sm120")
        stage_main(tracked_stage("build")(main))
        """
    p = _py(code, store)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 2
    assert err.strip().splitlines() == ["error: no config of variant 'x' fits target sm120"]
    (r,) = _runs(store)
    assert r.info.status == "FAILED" and r.data.tags["kernelcamp.stage"] == "build"
    assert "fits target sm120" in r.data.tags["kernelcamp.error"]

    env_uri = f"http://127.0.0.1:{_free_port()}"
    p = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=store,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": env_uri},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = p.communicate(timeout=120)
    assert p.returncode == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "unreachable" in lines[0] and env_uri in lines[0], err


def test_a_failed_stage_records_the_params_it_started_with(store):
    """A stage's FAILED run carries the params the stage ran with: record_stage_failure re-read params.yaml when
    the stage failed, so a params.yaml rewritten meanwhile (a compose, another queued run's checkout) put another
    run's variant on this failure (helper audit, R1)."""
    (store / "params.yaml").write_text(json.dumps(PARAMS))
    other = {**PARAMS, "variant": {**PARAMS["variant"], "name": "someone_else", "num_warps": 4}}
    code = f"""
        import json
        from kernelcamp.errors import KernelcampError
        from kernelcamp.io import stage_main
        from kernelcamp.tracking import tracked_stage
        def main():
            open("params.yaml", "w").write(json.dumps({other!r}))
            raise KernelcampError("the benchmark failed")
        stage_main(tracked_stage("benchmark")(main))
        """
    p = _py(code, store)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 2, err
    (r,) = _runs(store)
    assert r.info.status == "FAILED" and r.data.tags["kernelcamp.stage"] == "benchmark"
    assert r.data.params["variant.name"] == "bt16_w8" and r.data.params["variant.num_warps"] == "8", r.data.params
    assert r.info.run_name != "someone_else"


def test_a_later_stage_records_the_params_its_run_claimed(store):
    """A refused second `dvc exp run` rewrites params.yaml before its first stage refuses it, and the running
    pipeline's next stage then stops (params.yaml changed during this run): its FAILED run carried the second
    run's variant (num_warps=1 beside a run that measured num_warps=16; helper-53). A stage of a pipeline run
    records the params the run claimed at its first stage (kernelcamp.runlock.run_params)."""
    (store / "params.yaml").write_text(json.dumps(PARAMS))
    other = {**PARAMS, "variant": {**PARAMS["variant"], "name": "someone_else", "num_warps": 4}}
    code = f"""
        import json, os
        import kernelcamp.runlock as rl
        from kernelcamp.errors import KernelcampError
        from kernelcamp.io import stage_main
        import kernelcamp.spec as sp
        from pathlib import Path
        from kernelcamp.tracking import tracked_stage
        sp.project_root = project_root = Path.cwd  # this tree: the claim is the test's, not the repo's
        rl.run_owner = lambda pid=None: os.getpid()  # this process stands for the run's dvc process
        rl.claim_run(project_root(), "spec", "a" * 64, params={PARAMS!r})  # the run's first stage
        open("params.yaml", "w").write(json.dumps({other!r}))  # the second `dvc exp run` rewrote it
        def main():
            rl.claim_run(project_root(), "verify", "b" * 64)  # what stage_spec does: refused, params changed
        stage_main(tracked_stage("verify")(main))
        """
    p = _py(code, store)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 2 and "params.yaml changed during this run" in err, err
    (r,) = _runs(store)
    assert r.info.status == "FAILED" and r.data.tags["kernelcamp.stage"] == "verify"
    assert r.data.params["variant.name"] == "bt16_w8" and r.data.params["variant.num_warps"] == "8", r.data.params
    assert r.data.tags["variant"] == "bt16_w8"  # the tags are the run's too


def test_a_stage_that_ends_after_params_changed_fails(store):
    """A benchmark stage that finished after a refused second `dvc exp run` had rewritten params.yaml exited 0, and
    DVC locked its benchmark.json (num_warps 16) with the new params (num_warps 1): `dvc status` then called it up
    to date (helper-54). The stage checks params.yaml at its end and fails, recording the run's params."""
    (store / "params.yaml").write_text(json.dumps(PARAMS))
    other = {**PARAMS, "variant": {**PARAMS["variant"], "num_warps": 4}}
    code = f"""
        import json, os
        import kernelcamp.runlock as rl
        from kernelcamp.io import read_params, sha256_text, stage_main
        import kernelcamp.spec as sp
        from pathlib import Path
        from kernelcamp.tracking import tracked_stage
        sp.project_root = project_root = Path.cwd  # this tree: the claim is the test's, not the repo's
        rl.run_owner = lambda pid=None: os.getpid()  # this process stands for the run's dvc process
        rl.claim_run(project_root(), "spec", sha256_text(read_params("params.yaml")[0]), params={PARAMS!r})
        def main():
            open("params.yaml", "w").write(json.dumps({other!r}))  # rewritten while the stage ran
            return 0
        stage_main(tracked_stage("benchmark")(main))
        """
    p = _py(code, store)
    out, err = p.communicate(timeout=120)
    lines = err.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, err
    assert lines[0].startswith("error: params.yaml changed while the benchmark stage ran (sha256 "), err
    (r,) = _runs(store)
    assert r.info.status == "FAILED" and r.data.tags["kernelcamp.stage"] == "benchmark"
    assert r.data.params["variant.num_warps"] == "8", r.data.params
    # unchanged: the stage succeeds (the claim's owner is this process; a stage run by hand checks nothing)
    (store / "params.yaml").write_text(json.dumps(PARAMS))
    code = code.replace("open(", "0 and open(")
    p = _py(code, store)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err


@pytest.mark.parametrize(
    "refusal", ["refuse_if_another_run(project_root(), 'params.yaml')", "claim_run(project_root(), 'spec', 'b' * 64)"]
)
def test_a_run_refused_for_another_run_records_no_mlflow_run(store, refusal):
    """A second `dvc exp run` refused while another ran left a FAILED MLflow run of stage spec under its own experiment
    name, with the running run's params (params.yaml is put back for that run before the refused one reads it): a
    record of a variant that never ran (helper-65). Refused either way (before params.yaml is read, or at the claim),
    it is one line, exit 2, and no run."""
    (store / "params.yaml").write_text(json.dumps(PARAMS))
    code = f"""
        import os
        import kernelcamp.runlock as rl
        from kernelcamp.runlock import claim_run, refuse_if_another_run
        from kernelcamp.io import stage_main
        import kernelcamp.spec as sp
        from pathlib import Path
        from kernelcamp.tracking import tracked_stage
        sp.project_root = project_root = Path.cwd
        # the running run: the test process stands for its dvc process
        rl.claim_run(project_root(), "benchmark", "a" * 64, owner=os.getppid(), params={PARAMS!r})
        rl.run_owner = lambda pid=None: os.getpid()  # this process stands for the refused run's dvc process
        def main():
            {refusal}
            return 0
        stage_main(tracked_stage("spec")(main))
        """
    p = _py(code, store)
    out, err = p.communicate(timeout=120)
    lines = err.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"error: another pipeline run (dvc pid {os.getpid()}, "), err
    assert _runs(store) == []


def test_a_broken_sqlite_store_is_one_line_that_says_what_to_do(store):
    """A truncated mlflow.db (a copy cut short, a full disk): the report stage printed a warning that it could not
    record its failure, then an error with SQLAlchemy's SQL text and link, and no advice (helper-53). One line now,
    naming the file and what to do with it."""
    tracking.ensure_store(PARAMS)
    db = store / "mlflow.db"
    db.write_bytes(db.read_bytes()[:8192])
    (store / "params.yaml").write_text(json.dumps(PARAMS))
    code = f"""
        from kernelcamp import tracking
        from kernelcamp.io import stage_main
        from kernelcamp.tracking import tracked_stage
        def main():
            tracking.ensure_store({PARAMS!r})  # what the report stage's tracked_run does first
        stage_main(tracked_stage("report", check_store=False)(main))
        """
    p = _py(code, store)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: the MLflow store mlflow.db is not a readable SQLite database ("), err
    assert "mv mlflow.db mlflow.db.broken" in lines[0] and "[SQL:" not in lines[0] and "sqlalche.me" not in lines[0]


def test_a_signal_during_a_store_write_arrives_after_it(store):
    """Ctrl-C during the report's MLflow logging raised inside an SQLite write: the open transaction then locked
    the run's KILLED end and the failure record ("database is locked" tracebacks, a run left RUNNING; helper-53).
    A signal during a write under the store lock is delivered when the write is done."""
    from kernelcamp.signals import Terminated, signals_raise

    uri = tracking.tracking_uri(PARAMS)
    done = []
    with pytest.raises(Terminated), signals_raise():
        with tracking.store_lock(uri):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # Python runs a handler at the next bytecode: it would have raised here
            done.append("write finished")
    assert done == ["write finished"]


def test_only_the_spec_stage_opens_the_store_on_entry(store):
    """Stages after spec neither import MLflow nor open the store when they succeed (2-6 s each before,
    issue 12's wall time); spec, the gate, creates it; a later stage's failure still records its run."""
    (store / "params.yaml").write_text(json.dumps(PARAMS))
    code = """
        import sys
        from kernelcamp.io import stage_main
        from kernelcamp.tracking import tracked_stage
        def main():
            print("mlflow" in sys.modules)
            return 0
        stage_main(tracked_stage(%r)(main))
        """
    p = _py(code % "build", store)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0 and out.strip() == "False", err
    assert not (store / "mlflow.db").exists()
    p = _py(code % "spec", store)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0 and out.strip() == "True", err
    assert (store / "mlflow.db").exists() and _runs(store) == []


def test_printed_store_names_no_path_of_this_machine(store, tmp_path_factory):
    """The report's line about the store goes into committed campaign logs: the workspace's SQLite file by
    its relative path (it printed the absolute one, a path of the machine that ran it)."""
    assert tracking.store_label(tracking.tracking_uri(PARAMS)) == "sqlite store mlflow.db in the workspace"
    elsewhere = f"sqlite:///{tmp_path_factory.mktemp('other') / 'mlflow.db'}"
    assert tracking.store_label(elsewhere) == elsewhere
    assert tracking.store_label("http://127.0.0.1:5000") == "http://127.0.0.1:5000"


def test_a_signal_during_a_deferred_block_is_delivered_once_after_it():
    """A SIGINT inside ``import mlflow`` left half-imported modules: the imports now run under
    signals_deferred. The signal must wait for the block's end, also when another thread sends it
    (the kernel may hand it to a thread that does not block it), and then reach the handler once."""
    import threading

    from kernelcamp.signals import Terminated, signals_deferred, signals_raise

    done = []
    with pytest.raises(Terminated) as e, signals_raise():
        with signals_deferred():
            t = threading.Thread(target=lambda: [os.kill(os.getpid(), signal.SIGINT) for _ in range(2)])
            t.start()
            t.join()
            time.sleep(0.2)  # the block's work (an import) goes on
            done.append(1)
        done.append(2)  # never reached: the signal comes as the block ends
    assert e.value.signum == signal.SIGINT and done == [1]


def test_the_mlflow_imports_are_not_cut_by_a_signal(monkeypatch, store):
    """The store's first open imports MLflow and SQLAlchemy under signals_deferred."""
    import contextlib

    from kernelcamp import signals

    entered = []

    @contextlib.contextmanager
    def spy():
        entered.append(1)
        yield

    monkeypatch.setattr(signals, "signals_deferred", spy)
    tracking._client(tracking.tracking_uri(PARAMS))
    assert entered == [1]


def test_a_conf_local_setting_shows_as_an_override(tmp_path: Path) -> None:
    """A git-ignored conf/local/default.yaml is composed into params.yaml but is in no versioned file: the
    `<section>_overrides` tag shows its settings (kernelcamp.conftags.conf_file_value composes the named file
    without it, unlike Hydra's composition)."""
    import shutil

    import yaml

    from kernelcamp.compose import compose_text
    from kernelcamp.tracking import run_tags

    root = Path(__file__).resolve().parents[1]
    shutil.copytree(root / "conf", tmp_path / "conf", ignore=shutil.ignore_patterns("local"))
    (tmp_path / ".dvc").mkdir()
    shutil.copy(root / ".dvc" / "config", tmp_path / ".dvc" / "config")  # Hydra composition on, as in the repo
    (tmp_path / "conf" / "local").mkdir()
    (tmp_path / "conf" / "local" / "default.yaml").write_text("# @package _global_\nserver:\n  port: 8799\n")
    params = yaml.safe_load(compose_text(tmp_path, []))
    assert params["server"]["port"] == 8799
    assert "port=8799" in run_tags(params)["server_overrides"]


def test_the_variant_tag_says_what_was_overridden() -> None:
    """`dvc exp run -S variant.num_warps=8` was tagged `variant=bt16_w4` alone: the name of a file that
    did not run as it stands. `<section>_overrides` lists what differs (variant, baseline, workload,
    server); every shipped file composes to ""."""
    import copy

    import yaml

    from kernelcamp.compose import compose_text
    from kernelcamp.conftags import conf_overrides
    from kernelcamp.tracking import run_tags

    root = Path(__file__).resolve().parents[1]
    for sec in ("variant", "baseline", "workload", "server"):
        for f in sorted((root / "conf" / sec).glob("*.yaml")):
            params = yaml.safe_load(compose_text(root, [f"{sec}={f.stem}"]))
            assert conf_overrides(params, sec) == "", (sec, f.stem)
    params = yaml.safe_load((root / "params.yaml").read_text())
    p = copy.deepcopy(params)
    p["variant"]["num_warps"] = 8
    p["baseline"]["extra_key"] = [1, 2]
    tags = run_tags(p)
    assert tags["variant"] == params["variant"]["name"] and tags["variant_overrides"] == "num_warps=8"
    assert tags["baseline_overrides"] == "extra_key=[1, 2]"
    # a float for the file's integer (a run the spec stage refuses) is an override: it showed as "", the file as it
    # stands (the int and the equal float compared equal)
    p["variant"]["num_warps"] = float(params["variant"]["num_warps"])
    assert run_tags(p)["variant_overrides"] == f"num_warps={float(params['variant']['num_warps'])}"
    p["variant"]["name"] = "mine"
    assert conf_overrides(p, "variant") == "(no conf/variant/mine.yaml)"
    # `-S workload.name=deepseek_v32` on the V4-Flash shape was tagged workload=deepseek_v32 alone
    p["workload"]["name"] = "deepseek_v32"
    t = run_tags(p)
    assert t["workload"] == "deepseek_v32" and 'layout="deepseek_v4"' in t["workload_overrides"], t
    p["server"]["name"] = "eager"  # cuda_graphs still on: the eager file says off
    assert "cuda_graphs=true" in run_tags(p)["server_overrides"]


def test_a_server_uri_with_a_password_is_reached_with_it_and_never_shown(monkeypatch):
    """``MLFLOW_TRACKING_URI=http://me:s3cret@host`` (MLflow's client sends the pair as basic auth): the
    reachability check read ``me:s3cret@host`` as a host name ("Name or service not known") and its error
    printed the password."""
    import base64

    from fastapi import FastAPI, Request, Response

    from kernelcamp.serve.testing import ServerThread

    want = "Basic " + base64.b64encode(b"me:s3cret").decode()
    app = FastAPI()

    @app.get("/health")
    async def health(request: Request):
        return Response("OK", status_code=200 if request.headers.get("authorization") == want else 401)

    with ServerThread(app) as url:
        with_password = url.replace("http://", "http://me:s3cret@")
        tracking.check_reachable(with_password)  # no error: the pair went as basic auth
        with pytest.raises(KernelcampError) as e:
            tracking.check_reachable(url.replace("http://", "http://me:wrong@"))
    assert "HTTP 401" in str(e.value) and "wrong" not in str(e.value) and "me:***@" in str(e.value)
    gone = f"http://me:s3cret@127.0.0.1:{_free_port()}"
    with pytest.raises(KernelcampError, match="unreachable") as e:
        tracking.check_reachable(gone)
    assert "s3cret" not in str(e.value) and "\n" not in str(e.value)
    assert tracking.store_label(gone) == gone.replace("s3cret", "***")


def test_a_name_too_long_for_a_file_has_no_conf_file() -> None:
    """conf_file_value looked the name up as a file: a 300-character name raised ENAMETOOLONG (helper audit B-F3)."""
    assert conftags.conf_file_value("variant", "v" * 300) is None


def test_run_tags_are_the_ones_the_run_kept_at_its_first_stage(tmp_path, monkeypatch):
    """A conf/ file edited during the report stage and put back before its check: the FINISHED run's variant_overrides
    was computed against the edited file (helper-68, C). run_tags takes the tags that read the tree's files from the
    run's claim (kept at its first stage) when the params are the run's, and computes them for other params."""
    import kernelcamp.runlock as rl
    import kernelcamp.spec as sp

    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    monkeypatch.setattr(sp, "project_root", lambda: tmp_path)
    monkeypatch.setattr(rl, "run_owner", lambda pid=None: os.getpid())
    params = json.loads(json.dumps(PARAMS))
    params["variant"] = {**params["variant"], "name": "bt16_w4"}  # conf/variant/bt16_w4.yaml has num_warps 4
    assert tracking.run_tags(params)["variant_overrides"] == "num_warps=8"  # no run: computed
    kept = {**conftags.tree_tags(params), "variant_overrides": "kept at the first stage"}
    rl.claim_run(tmp_path, "spec", "a" * 64, params=params, tree_tags=lambda: kept)
    tags = tracking.run_tags(params)
    assert {k: tags[k] for k in kept} == {k: "" if v is None else v for k, v in kept.items()}
    other = {**params, "variant": {**params["variant"], "num_warps": 2}}
    assert tracking.run_tags(other)["variant_overrides"] == "num_warps=2"  # not the run's params: computed


def test_a_measurement_logged_in_another_experiment_counts_as_logged(store):
    """A report-only rerun with another tracking.experiment logged the same measurement as new (measurement_reused
    False; helper-68): the runs that logged it are looked up in every experiment of the store."""
    same = {"measured_at": "2026-12-08T00:00:00Z", "deploy_id": "d1"}
    assert tracking.finished_runs_with(PARAMS, same) == []
    other = {**PARAMS, "tracking": {"uri": None, "experiment": "elsewhere"}}
    with tracking.tracked_run(other, tags=same) as run:
        pass
    with tracking.tracked_run(other, tags={**same, "deploy_id": "d2"}):
        pass
    assert tracking.finished_runs_with(PARAMS, same) == [run.run_id]

"""MLflow tracking: one run per pipeline run, honest run status, a store that survives concurrency.

Where runs go: ``MLFLOW_TRACKING_URI`` if set, else params ``tracking.uri``, else a SQLite store at
``$DVC_ROOT/mlflow.db`` (``kernelcamp.provenance.dvc_root()``: the real workspace, also for queued
experiments, which run in a temporary copy that is deleted afterwards). Artifacts of the SQLite
store go to ``$DVC_ROOT/mlartifacts/`` for the same reason. Open it with
``mlflow ui --backend-store-uri sqlite:///mlflow.db`` in the workspace.

Reliability (DESIGN.md, reliability contract):

* Several processes opening a fresh SQLite store at once can break it for good, so the store is
  created and migrated once under an exclusive ``fcntl`` lock on ``mlflow.db-lock``, and every
  write we make to a SQLite store takes the same lock (writes are short: runs log at the end).
* MLflow marks a crashed run FINISHED and leaves a killed one RUNNING. ``tracked_run`` ends a run
  FINISHED only when its block completes, FAILED on any exception or non-zero ``SystemExit`` (the
  error text in tag ``kernelcamp.error``), KILLED on SIGTERM/SIGINT (handlers installed for the
  block). Each run is tagged with the pid and host that own it; ``ensure_store`` closes RUNNING runs
  of this host whose process is gone (status KILLED, tag ``kernelcamp.closed_reason``).
* An unreachable tracking server is one ``KernelcampError`` line, checked before any work.

Metrics (logged by the report stage) are the run's headline (``kernelcamp.report.headline_metrics``,
the keys of reports/metrics.json: ``cpu.kernel.ratio``, ``serving.candidate.output_tok_s``) and the
benchmark's detail (the keys of reports/benchmark_metrics.json: per batch size and concurrency
level), all in the one naming scheme of ``kernelcamp.metrics``; the records go as artifacts
(``reports/``).

Params are the flattened dotted keys of params.yaml (``variant.configs.0.num_warps``); a list of
scalars stays one param (``workload.batch_sizes = [1, 8]``). A value longer than MLflow's limit is
never truncated: it goes to the artifact ``params/<key>.json`` and the param reads
``<see params/<key>.json>``.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import re
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from kernelcamp.conftags import tree_tags
from kernelcamp.errors import AnotherRunError, KernelcampError, text_shown, url_shown
from kernelcamp.io import pid_start_time, repo_relative, same_process
from kernelcamp.provenance import dvc_root
from kernelcamp.signals import Terminated, signals_deferred, signals_raise

MAX_PARAM_LEN = 6000  # mlflow.utils.validation.MAX_PARAM_VAL_LENGTH (MLflow 3.17)
MAX_TAG_LEN = 8000  # mlflow.utils.validation.MAX_TAG_VAL_LENGTH
MAX_KEY_LEN = 250  # mlflow.utils.validation.MAX_ENTITY_KEY_LENGTH
_BATCH = 100  # MLflow log_batch accepts at most 100 params / tags and 1000 metrics per call
_ILLEGAL = re.compile(r"[^A-Za-z0-9_\-. /]")
TAG_PREFIX = "kernelcamp."


# --------------------------------------------------------------------------------------------- store


def tracking_uri(params: Mapping[str, Any] | None = None) -> str:
    """``MLFLOW_TRACKING_URI``, else ``params["tracking"]["uri"]``, else ``sqlite:///$DVC_ROOT/mlflow.db``.

    Raises ``KernelcampError`` for a local store named by a relative path
    (:func:`kernelcamp.spec.check_tracking_uri`)."""
    from kernelcamp.spec import check_tracking_uri

    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        check_tracking_uri(env, "MLFLOW_TRACKING_URI")
        return env
    uri = ((params or {}).get("tracking") or {}).get("uri")
    if uri:
        check_tracking_uri(str(uri))  # before any store is opened (the spec stage opens it first)
        return str(uri)
    return f"sqlite:///{dvc_root() / 'mlflow.db'}"


def experiment_name(params: Mapping[str, Any] | None = None) -> str:
    return str(((params or {}).get("tracking") or {}).get("experiment") or "kernelcamp")


def _sqlite_path(uri: str) -> Path | None:
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri[len("sqlite:///") :])


def store_label(uri: str) -> str:
    """How a printed line names the store: a SQLite file in the workspace by its path relative to it
    (``sqlite store mlflow.db in the workspace``), so that no path of this machine reaches a log that is
    committed with a campaign's records; anything else by its URI, a password in it shown as ``***``
    (``MLFLOW_TRACKING_URI`` may hold one; ``tracking.uri`` may not: :mod:`kernelcamp.spec`)."""
    db = _sqlite_path(uri)
    if db is None:
        return url_shown(uri)
    rel = repo_relative(db, dvc_root())
    return f"sqlite store {rel} in the workspace" if not Path(rel).is_absolute() else uri


@contextlib.contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """Exclusive ``fcntl`` lock beside a SQLite store (``<db>-lock``); a no-op for servers. While it is held,
    SIGTERM/SIGINT wait for the block to end (:func:`kernelcamp.signals.signals_deferred`): a Ctrl-C inside a write
    left SQLite's transaction open in this process, so the KILLED end of the run and the failure record that
    followed met "database is locked" (tracebacks, and a run left RUNNING; helper-53)."""
    from kernelcamp.signals import signals_deferred

    db = _sqlite_path(uri)
    if db is None:
        yield
        return
    if db.parent == dvc_root():  # the default store's folder, the workspace; a store given names one that exists
        db.parent.mkdir(parents=True, exist_ok=True)  # (kernelcamp.spec.check_tracking_uri): never made elsewhere
    with open(str(db) + "-lock", "a+") as f:  # matches .gitignore's /mlflow.db-*
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)  # waiting for another process's write: a signal stops the wait
        try:
            with signals_deferred():
                yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def check_reachable(uri: str, timeout_s: float = 5.0) -> None:
    """For an http(s) store, GET ``<uri>/health`` within ``timeout_s`` seconds (a user and password in the
    URI go as basic auth, as MLflow's own client sends them); raise ``KernelcampError`` in one line, the
    password shown as ``***``, if it fails."""
    import httpx

    if not uri.startswith(("http://", "https://")):
        return
    try:
        r = httpx.get(uri.rstrip("/") + "/health", timeout=timeout_s)
        reason = f"HTTP {r.status_code} from /health" if r.status_code >= 400 else None
    except (httpx.HTTPError, httpx.InvalidURL, OSError, ValueError) as e:
        reason = text_shown(_one_line(e), uri) or type(e).__name__
    if reason is not None:
        raise KernelcampError(
            f"MLflow tracking server {url_shown(uri)} is unreachable ({reason}): start it, or unset "
            "MLFLOW_TRACKING_URI and tracking.uri to use the SQLite store in the workspace"
        )


def _client(uri: str):
    import logging

    from kernelcamp.signals import signals_deferred

    # An interrupt inside these imports left MLflow or SQLAlchemy half-imported in sys.modules, and the
    # stage's failure record then failed too (a SIGINT early in the report stage left no KILLED run):
    # the imports finish first, then the signal is handled (signals_deferred).
    with signals_deferred():
        from mlflow.tracking import MlflowClient

        if _sqlite_path(uri) is not None:
            import mlflow.store.tracking.sqlalchemy_store  # noqa: F401 - SQLAlchemy and alembic, imported whole

    # Store creation and migration log INFO lines on stderr; a stage's stderr is for its one error line.
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)

    return MlflowClient(tracking_uri=uri)


def ensure_store(params: Mapping[str, Any] | None = None) -> tuple[str, str]:
    """Create/migrate the store once (under the lock), get or create the experiment, close stale runs.

    The experiment carries MLflow's experiment kind tag ``mlflow.experimentKind`` =
    ``custom_model_development`` ("Machine learning": the runs table, not the GenAI overview), also
    one created before kernelcamp set it; a kind already set (chosen in the UI) is kept. MLflow 3.17's
    UI derives the kind from its own workflow switch instead (``?workflowType=machine_learning``, or
    the sidebar's toggle, remembered by the browser); older MLflow 3 UIs and servers read the tag.

    Returns ``(uri, experiment_id)``. Raises ``KernelcampError`` when the server is unreachable or
    the store cannot be opened.
    """
    kind_tag, training = "mlflow.experimentKind", "custom_model_development"  # MLflow UI's ExperimentKind
    uri = tracking_uri(params)
    check_reachable(uri)
    name = experiment_name(params)
    try:
        with store_lock(uri):
            client = _client(uri)
            exp = client.get_experiment_by_name(name)
            if exp is None:
                kwargs: dict[str, Any] = {"tags": {kind_tag: training}}
                db = _sqlite_path(uri)
                if db is not None:
                    kwargs["artifact_location"] = (db.parent / "mlartifacts").as_uri()
                try:
                    exp_id = client.create_experiment(name, **kwargs)
                except Exception:  # created meanwhile by another process on a server
                    exp = client.get_experiment_by_name(name)
                    if exp is None:
                        raise
                    exp_id = exp.experiment_id
            else:
                exp_id = exp.experiment_id
            if exp is not None and not exp.tags.get(kind_tag):
                with contextlib.suppress(Exception):  # how the UI opens it: never worth stopping a stage
                    client.set_experiment_tag(exp_id, kind_tag, training)
            close_stale_runs(client, exp_id)
    except KernelcampError:
        raise
    except Exception as e:
        err = KernelcampError(_store_error(uri, e))
        err.store_failed = True  # type: ignore[attr-defined] # tracked_stage records nothing in a store that failed
        raise err from e
    return uri, exp_id


def _store_error(uri: str, e: BaseException) -> str:
    """The one line for a store that would not open: a SQLite file that is no database (a truncated copy, a disk
    that filled up) says what to do with it; any other error is named without SQLAlchemy's SQL text and links."""
    db = _sqlite_path(uri)
    chain, cur = [], e
    while cur is not None and len(chain) < 10:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    broken = next(
        (
            str(c)
            for c in chain
            if type(c).__name__ == "DatabaseError" and ("malformed" in str(c) or "not a database" in str(c))
        ),
        None,
    )
    if db is not None and broken is not None:
        reason = broken.split("\n")[0].split("[SQL:")[0].strip().removeprefix("(sqlite3.DatabaseError) ")
        name = repo_relative(db, dvc_root())  # as store_label names it: no path of this machine in a log
        return (
            f"the MLflow store {name} is not a readable SQLite database ({reason}): move it aside (mv {name} "
            f"{name}.broken; the next run starts a new store) or restore it from a backup, or set tracking.uri to "
            "another store"
        )
    why = str(e).split("[SQL:")[0].split("(Background on this error")[0]
    return f"cannot open the MLflow store {url_shown(uri)}: {type(e).__name__}: {text_shown(_one_line(why), uri)}"


def close_stale_runs(client, experiment_id: str) -> list[str]:
    """Mark KILLED the RUNNING runs of this host whose owning process is gone (its pid dead, or alive with
    another start time than the run's ``kernelcamp.pid_start`` tag: a reused pid); return their ids."""
    host = socket.gethostname()
    closed = []
    runs = client.search_runs([experiment_id], filter_string="attributes.status = 'RUNNING'", max_results=1000)
    for run in runs:
        tags = run.data.tags
        if tags.get(TAG_PREFIX + "host") != host or not str(tags.get(TAG_PREFIX + "pid", "")).isdigit():
            continue
        pid = int(tags[TAG_PREFIX + "pid"])
        start = tags.get(TAG_PREFIX + "pid_start")
        if pid == os.getpid() or same_process(pid, int(start) if str(start).isdigit() else None):
            continue
        client.set_tag(run.info.run_id, TAG_PREFIX + "closed_reason", f"owning process {pid} on {host} is gone")
        client.set_terminated(run.info.run_id, status="KILLED")
        closed.append(run.info.run_id)
    return closed


def _one_line(e: BaseException | str) -> str:
    return " ".join(str(e).split())[:MAX_TAG_LEN]


# -------------------------------------------------------------------------------------------- params


def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Dotted keys of a nested mapping; dicts and lists of mappings recurse (list index as a key),
    lists of scalars stay one JSON value; None is ``null``. Illegal MLflow key characters become ``_``.

    Raises ``KernelcampError`` when two keys become one that way (``a:b`` and ``a_b``), or a key holds a
    ``..`` path part (MLflow refuses it): a param must never be dropped or fail the run after it measured.
    ``kernelcamp.spec`` refuses such keys in the free-form mapping ``server.env`` before any stage runs."""
    out: dict[str, str] = {}

    def put(key: str, value: str, given: str) -> None:
        if key in out or ".." in given.split("/"):
            raise KernelcampError(
                f"param key {given} cannot be logged to MLflow as it is (it holds '..', or it clashes with another "
                f"key as {key}): rename it in conf/"
            )
        out[key] = value

    for k, v in params.items():
        key = f"{prefix}{_ILLEGAL.sub('_', str(k))}"
        if isinstance(v, Mapping) or (isinstance(v, (list, tuple)) and any(isinstance(x, Mapping) for x in v)):
            sub = v if isinstance(v, Mapping) else {str(i): x for i, x in enumerate(v)}
            for kk, vv in flatten_params(sub, key + ".").items():
                put(kk, vv, kk)
        elif isinstance(v, (list, tuple)) or v is None or isinstance(v, bool):
            put(key, json.dumps(v), f"{prefix}{k}")
        else:
            put(key, str(v), f"{prefix}{k}")
    return out


def split_long_params(flat: Mapping[str, str], max_len: int = MAX_PARAM_LEN) -> tuple[dict[str, str], dict[str, str]]:
    """``(params, artifacts)``: over-long values (or keys) move to ``artifacts`` (relative path -> JSON
    text) and the param reads ``<see params/<key>.json>``. Nothing is truncated."""
    params: dict[str, str] = {}
    artifacts: dict[str, str] = {}
    for k, v in flat.items():
        if len(v) <= max_len and len(k) <= MAX_KEY_LEN:
            params[k] = v
            continue
        fname = f"{k}.json".replace("/", "_")
        artifacts[fname] = json.dumps({"key": k, "value": v}, indent=1)
        short = k if len(k) <= MAX_KEY_LEN else k[: MAX_KEY_LEN - 9] + "._long_"
        params[short] = f"<see params/{fname}>"
    return params, artifacts


# ---------------------------------------------------------------------------------------------- runs


#: The runs this process created and has not ended, by id (:func:`start_run` adds one inside the store lock, before
#: a signal held by the write is delivered; :meth:`Run.end` removes it): a signal that came as the run was created
#: left it RUNNING beside tracked_stage's own KILLED record (helper-56).
OPEN_RUNS: dict[str, Run] = {}
#: The runs this process ended, by id, and how (``FINISHED``, ``KILLED``, ``FAILED``).
ENDED_RUNS: dict[str, str] = {}


class Run:
    """An open MLflow run; every write takes the store lock (SQLite) and goes through ``log_batch``."""

    def __init__(self, uri: str, run_id: str):
        self.uri, self.run_id = uri, run_id
        self._client = _client(uri)
        self._artifact_dir: Path | None = None
        #: what :func:`tracked_run` does just before the FINISHED end, with it, signals held (:meth:`on_finish`)
        self.finish_steps: list[Callable[[], Any]] = []

    def on_finish(self, step: Callable[[], Any]) -> None:
        """Have :func:`tracked_run` run ``step`` (putting the stage's outputs in place) together with the run's
        FINISHED end, SIGTERM/SIGINT held until both are done: a signal between the report's replaced outputs and
        that end left a KILLED run and a line saying the outputs were as before (helper-57). An error in ``step``
        ends the run FAILED."""
        self.finish_steps.append(step)

    def _batch(self, metrics=(), params=(), tags=()) -> None:
        with store_lock(self.uri):
            self._client.log_batch(self.run_id, metrics=list(metrics), params=list(params), tags=list(tags))

    def log_params(self, params: Mapping[str, Any], max_len: int = MAX_PARAM_LEN) -> None:
        """Flatten ``params`` (params.yaml), move over-long values to ``params/`` artifacts, log the rest."""
        from mlflow.entities import Param

        flat, long = split_long_params(flatten_params(params), max_len)
        if long:
            with tempfile.TemporaryDirectory() as tmp:
                for name, text in long.items():
                    (Path(tmp) / name).write_text(text, encoding="utf-8")
                self.log_artifacts(tmp, "params")
        items = [Param(k, v) for k, v in flat.items()]
        for i in range(0, len(items), _BATCH):
            self._batch(params=items[i : i + _BATCH])

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(_ILLEGAL.sub("_", k), _one_line("" if v is None else v)) for k, v in tags.items()]
        for i in range(0, len(items), _BATCH):
            self._batch(tags=items[i : i + _BATCH])

    def log_metrics(self, metrics: Mapping[str, float | None], step: int = 0) -> None:
        """Log finite numbers; ``None`` / NaN are skipped (a missing figure is never logged as 0)."""
        self.log_series([(k, v, step) for k, v in metrics.items()])

    def log_series(self, points: list[tuple[str, float | None, int]]) -> None:
        """``(key, value, step)`` points, e.g. per batch size (step = batch) or concurrency."""
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        items = [
            Metric(_ILLEGAL.sub("_", k), float(v), ts, int(s))
            for k, v, s in points
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")
        ]
        for i in range(0, len(items), 1000):
            self._batch(metrics=items[i : i + 1000])

    def log_artifacts(self, local_dir: str | os.PathLike, artifact_path: str | None = None) -> None:
        with store_lock(self.uri):
            self._client.log_artifacts(self.run_id, str(local_dir), artifact_path)

    def end(self, status: str, error: str | None = None) -> None:
        with store_lock(self.uri):
            if error:
                self._client.set_tag(self.run_id, TAG_PREFIX + "error", _one_line(error))
            self._client.set_terminated(self.run_id, status=status)
            OPEN_RUNS.pop(self.run_id, None)  # before a signal held by the write is delivered
            ENDED_RUNS[self.run_id] = status


def start_run(
    params: Mapping[str, Any],
    run_name: str | None = None,
    tags: Mapping[str, Any] | None = None,
    start_time_ms: int | None = None,
) -> Run:
    """Create a RUNNING run in the configured store, tagged with its owner's pid and host.

    ``start_time_ms`` (ms since the epoch): when the pipeline run began (its first stage), so that the
    MLflow run's duration is the pipeline's, not only the report stage's; None: now."""
    from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME

    uri, exp_id = ensure_store(params)
    base = {
        TAG_PREFIX + "pid": str(os.getpid()),
        TAG_PREFIX + "pid_start": str(pid_start_time(os.getpid())),
        TAG_PREFIX + "host": socket.gethostname(),
    }
    name = run_name or os.environ.get("DVC_EXP_NAME") or ((params.get("variant") or {}).get("name")) or "run"
    with store_lock(uri):
        client = _client(uri)
        run = client.create_run(exp_id, start_time=start_time_ms, run_name=name, tags={**base, MLFLOW_RUN_NAME: name})
        r = OPEN_RUNS[run.info.run_id] = Run(uri, run.info.run_id)
    if tags:
        r.set_tags(tags)
    return r


def finished_runs_with(params: Mapping[str, Any], tags: Mapping[str, str], limit: int = 20) -> list[str]:
    """Ids of the FINISHED runs of every experiment of the store ``params`` name (their tracking section) whose tags
    hold every ``tags`` item, newest first, at most ``limit``; ``[]`` when a value is empty. The report asks it for
    runs that logged the same measurement (``measured_at`` and ``deploy_id``): a report-only rerun. Every experiment:
    a rerun with another ``tracking.experiment`` logged an earlier measurement as new (``measurement_reused`` False;
    helper-68). Raises ``KernelcampError`` when the store cannot be opened (:func:`ensure_store`)."""
    if not tags or not all(isinstance(v, str) and v for v in tags.values()):
        return []
    if any("'" in v for v in tags.values()):
        return []  # a value holding a quote: MLflow's filter grammar cannot say it
    quoted = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
    uri, _ = ensure_store(params)
    client = _client(uri)
    ids = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(
        ids, filter_string=f"attributes.status = 'FINISHED' and {quoted}", max_results=limit,
        order_by=["attributes.start_time DESC"],
    )  # fmt: skip
    return [r.info.run_id for r in runs]


@contextlib.contextmanager
def tracked_run(
    params: Mapping[str, Any],
    run_name: str | None = None,
    tags: Mapping[str, Any] | None = None,
    start_time_ms: int | None = None,
) -> Iterator[Run]:
    """A run that ends FINISHED only if the block completes (then its :meth:`Run.on_finish` steps run with that end,
    SIGTERM/SIGINT held until both are done); FAILED (with the error) on an exception or a non-zero ``SystemExit``;
    KILLED on SIGTERM/SIGINT, after which the process exits 128+signal."""
    run = start_run(params, run_name, tags, start_time_ms)

    def failed(e: BaseException) -> None:  # the run ends FAILED with the error, which a tracked_stage then records
        run.end("FAILED", f"{type(e).__name__}: {e}")
        e.kernelcamp_recorded = True  # type: ignore[attr-defined]

    with signals_raise() as guard:
        try:
            yield run
            guard.check()  # a signal Python dropped in a finalizer: KILLED, not FINISHED (helper-55)
        except Terminated as k:
            run.end("KILLED", f"killed by {k}")
            done = SystemExit(128 + k.signum)
            # recorded: a tracked_stage around it recorded a second, FAILED run "exit status 130" (helper-54)
            done.kernelcamp_recorded = True  # type: ignore[attr-defined]
            raise done from None
        except SystemExit as e:
            if e.code in (0, None):
                run.end("FINISHED")
            else:
                run.end("FAILED", f"exit status {e.code}")
                e.kernelcamp_recorded = True  # type: ignore[attr-defined]
            raise
        except BaseException as e:
            failed(e)
            raise
    # the outputs and the FINISHED end together: a signal comes before both (KILLED above) or after both
    with signals_deferred():
        try:
            for step in run.finish_steps:
                step()
        except BaseException as e:
            failed(e)
            raise
        run.end("FINISHED")


def _params_or_empty(params_path: str | os.PathLike) -> dict[str, Any]:
    """``params.yaml`` at ``params_path`` as a dict; ``{}`` where it is missing or unreadable."""
    from kernelcamp.io import load_params

    try:
        return load_params(params_path)
    except KernelcampError:
        return {}


def record_stage_failure(
    stage: str,
    error: BaseException | str,
    params_path: str | os.PathLike = "params.yaml",
    status: str = "FAILED",
    params: Mapping[str, Any] | None = None,
    run: Run | None = None,
) -> str | None:
    """Record a run with ``status`` for a stage that failed before the report could log the pipeline
    run: tags ``kernelcamp.stage`` and ``kernelcamp.error``, the params it ran with. ``params``: those
    params as the stage read them when it started (``tracked_stage`` passes them); None reads
    ``params_path`` now, which another run or a compose may have rewritten since. ``run``: end this open
    run of the stage with them instead of starting one (``tracked_stage``: a run a signal left open as it
    was created). Returns the run id; if the store itself cannot be reached, prints one warning line and
    returns None (the stage's own error stays the one that matters)."""
    try:
        params = dict(params) if params is not None else _params_or_empty(params_path)
        text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        tags = {TAG_PREFIX + "stage": stage, **run_tags(params)}
        if run is None:
            run = start_run(params, tags=tags)
        else:
            with contextlib.suppress(Exception):  # set already, or with other values: the run keeps those
                run.set_tags(tags)
        with contextlib.suppress(Exception):
            run.log_params(params)
        run.end(status, f"stage {stage}: {text}")
        return run.run_id
    except Exception as e:  # noqa: BLE001 - never mask the stage's error with a tracking one
        print(f"warning: could not record the {stage} failure in MLflow: {_one_line(e)}", file=sys.stderr)
        return None


class tracked_stage(contextlib.ContextDecorator):  # noqa: N801 - used like a function
    """Wrap a stage's ``main`` so a failure leaves a FAILED (or KILLED) MLflow run naming the stage.

        stage_main(tracked_stage("benchmark")(main))     # or:  with tracked_stage("build"): ...

    On entry it checks the tracking store: an unreachable server is one clear line before any work.
    Stage ``spec`` (the gate, first in every ``dvc repro``) also opens it (:func:`ensure_store`: a
    fresh SQLite store is created once, under the lock; stale runs are closed); the other stages do
    not, since importing MLflow and opening the store cost 2-6 s per stage (issue 12's wall time), and
    a failure opens it when it records. A ``KernelcampError`` or any other exception, a non-zero return
    or ``SystemExit``, SIGTERM or SIGINT records the failure, then the error propagates unchanged
    (``kernelcamp.io.stage_main`` prints it). ``kernelcamp.errors.AnotherRunError`` (refused because another run
    holds the workspace) records nothing: nothing of this run ran. ``check_store=False``: no check on entry.
    """

    #: The stage that opens the store on entry (see the class docstring).
    OPENS_STORE = "spec"

    def __init__(self, name: str, params_path: str | os.PathLike = "params.yaml", check_store: bool = True):
        self.name, self.params_path, self.check_store = name, params_path, check_store
        self._sig: contextlib.ExitStack | None = None
        self._params: dict[str, Any] | None = None  # params.yaml as it was on entry: what a failure records
        self._known: set[str] = set()  # the runs this process had opened or ended before the stage's block

    def _record(self, error: BaseException | str, status: str = "FAILED") -> None:
        """Record the failure: on the run this stage opened and never ended (a signal as it was created), else as a
        run of its own (:func:`record_stage_failure`)."""
        mine = [r for i, r in list(OPEN_RUNS.items()) if i not in self._known]
        for run in mine or [None]:
            record_stage_failure(self.name, error, self.params_path, status=status, params=self._params, run=run)

    def _ended_here(self) -> dict[str, str]:
        """The runs the stage's block opened and ended, by id, with their status."""
        return {i: status for i, status in list(ENDED_RUNS.items()) if i not in self._known}

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def inner(*a, **kw):
            with self._recreate_cm():
                rc = fn(*a, **kw)
                if rc not in (0, None):
                    self._record(f"exit status {rc}")
                else:  # outputs of the params the run started with, or no success for DVC to lock
                    from kernelcamp.runlock import check_params_unchanged
                    from kernelcamp.spec import project_root

                    check_params_unchanged(project_root(), self.name, self.params_path)
                return rc

        return inner

    def __enter__(self):
        # read once, on entry: a failure records these, not a params.yaml rewritten while the stage ran
        self._params = params = _params_or_empty(self.params_path)
        # and a later stage of a pipeline run records the params the run claimed at its first stage: a refused
        # second `dvc exp run` rewrites params.yaml first, and the FAILED run of the first one (stopped by the
        # change) named the second one's params (helper-53)
        from kernelcamp.runlock import run_params
        from kernelcamp.spec import project_root

        with contextlib.suppress(KernelcampError, OSError):
            self._params = run_params(project_root()) or params
        if self.check_store:
            if self.name == self.OPENS_STORE:
                ensure_store(params)
            else:
                check_reachable(tracking_uri(params))
        self._known = set(OPEN_RUNS) | set(ENDED_RUNS)
        self._sig = contextlib.ExitStack()
        self._sig.enter_context(signals_raise())
        return self

    def __exit__(self, exc_type, exc, tb):
        assert self._sig is not None
        try:
            self._sig.close()
        except Terminated as k:  # a signal Python dropped in a finalizer, raised as the block ends (helper-55)
            exc = exc if exc is not None else k
        if exc is None or getattr(exc, "kernelcamp_recorded", False) or getattr(exc, "store_failed", False):
            return False  # succeeded, a tracked_run inside already ended its run FAILED, or the store itself failed
        if isinstance(exc, AnotherRunError):
            return False  # refused for another run: nothing of this one ran, and params.yaml holds the other's
        if isinstance(exc, Terminated):
            ended = self._ended_here()
            done = SystemExit(128 + exc.signum)
            if ended:  # the signal came as the stage's run ended (held by the write): that end is its record
                done.kernelcamp_run_finished = "FINISHED" in ended.values()  # type: ignore[attr-defined]
            else:
                self._record(f"killed by {exc}", status="KILLED")
            raise done from None
        if isinstance(exc, SystemExit):
            if exc.code not in (0, None):
                self._record(f"exit status {exc.code}")
            return False
        self._record(exc)
        return False


# ---------------------------------------------------------------------------------------------- tags


def run_tags(params: Mapping[str, Any], extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Tags every run carries: git commit/dirty, DVC experiment, variant/baseline names, their
    overrides of the named conf file (:func:`conf_overrides`) and hashes, GPU/driver/torch/triton
    (from ``extra`` when a stage measured them, else this process). The tags that read the tree's files
    (:func:`tree_tags`) are the ones this pipeline run's first stage kept when ``params`` are the run's."""
    from kernelcamp.provenance import git_info
    from kernelcamp.runlock import run_tree_tags
    from kernelcamp.spec import project_root
    from kernelcamp.variant import parse_variant

    tags: dict[str, Any] = {}
    # the commit of the tree that ran (a queued experiment's copy), not the workspace's ($DVC_ROOT)
    g = git_info(project_root())
    if g["git_commit"] is None:
        g = git_info(dvc_root())
    tags["git_commit"] = g["git_commit"]
    tags["git_dirty"] = g["git_dirty"]
    tags["dvc_exp_name"] = os.environ.get("DVC_EXP_NAME") or ""
    for sec in ("variant", "baseline"):
        raw = params.get(sec)
        if isinstance(raw, Mapping):
            tags[f"{sec}"] = raw.get("name")
            with contextlib.suppress(KernelcampError):
                tags[f"{sec}_config_hash"] = parse_variant(raw, sec).config_hash()
    for k in ("target", "workload", "server"):
        if isinstance(params.get(k), Mapping):
            tags[k] = params[k].get("name")
    kept = None
    with contextlib.suppress(KernelcampError, OSError):
        kept = run_tree_tags(project_root(), params)
    tags.update(kept if kept is not None else tree_tags(params))
    for k, v in (extra or {}).items():
        tags[k] = v
    return {k: ("" if v is None else v) for k, v in tags.items()}

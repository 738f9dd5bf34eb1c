"""Queued sweeps with one DVC experiment worker per GPU.

``dvc queue start -j N`` starts N workers that all see every GPU, so two variants can land on one
GPU and spoil each other's timings. ``kernelcamp sweep`` starts the same DVC queue workers
(``dvc exp queue-worker``, what ``dvc queue start`` spawns; dvc/repo/experiments/queue/celery.py in
DVC 3.67) itself, one per GPU, each with only its GPU visible::

    dvc exp run --queue -S 'variant.num_warps=4,8' -S 'variant.num_stages=1,2'
    kernelcamp sweep                 # one worker per visible GPU; waits until the queue is drained
    kernelcamp sweep --gpus 0,1      # choose the GPUs
    kernelcamp sweep --launcher slurm -S launcher.partition=gpu   # submitit jobs instead: kernelcamp.launcher

Each worker's environment carries ``CUDA_VISIBLE_DEVICES=<its GPU>`` and
``KERNELCAMP_WORKER_SLOT=<slot>``, the slot being the GPU's index (:func:`worker_slots`); the
embedded server's port and its state folder are the slot's own (:func:`worker_port`,
``.kernelcamp/slotN``), so parallel workers never collide with each other, with the workspace's own
deployed server, or with the workers of another sweep on other GPUs of the same host. Runs go to
the one tracking store at ``$DVC_ROOT`` (created once, before any worker: kernelcamp.tracking).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelcamp.errors import KernelcampError
from kernelcamp.ports import SLOT_ENV
from kernelcamp.signals import Terminated, signals_raise

# how long a sweep waits for its workers to exit once the queue is drained before it stops them: DVC's queue worker
# idles on an empty queue for 10 s before its monitor shuts it down (the idle timeout of `dvc queue start`, per its
# review in treeverse/dvc.org pull request 3715), so a minute leaves it ample time
DRAIN_GRACE_S = 60.0
# DVC's queue workers share one filesystem broker (kombu's), and two starting at once can write its pidbox exchange
# file together and leave invalid JSON: the other worker then exits at once with "unexpected error - Expecting value:
# line 1 column 1 (char 0)" (dvc-task issue 73; DVC pull request 7903's review; a CI run of tests/test_sweep.py). So
# the sweep starts its workers one at a time, each once the one before has logged that it is ready (at most
# READY_TIMEOUT_S), and starts again, at most START_RETRIES times, a worker that exits with an error before it took
# any experiment while experiments are still queued
READY_TIMEOUT_S = 30.0
START_RETRIES = 2
#: The longest --poll, seconds: an hour (an infinite one would never print progress).
MAX_POLL_S = 3600.0
# the celery log line of an experiment a queue worker took: "Task dvc.repo.experiments.queue.tasks.run_exp[ID] received"
_RECEIVED_RE = re.compile(r"\.run_exp\[([0-9A-Za-z-]+)\] received")


def detect_gpus() -> list[str]:
    """GPU ids visible to this process: ``CUDA_VISIBLE_DEVICES`` if set, else ``nvidia-smi -L``.

    Returns an empty list on a machine without NVIDIA GPUs.
    """
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        return [v.strip() for v in vis.split(",") if v.strip() and v.strip() != "-1"]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return []
    if out.returncode != 0:
        return []
    return [str(i) for i, line in enumerate(out.stdout.splitlines()) if line.startswith("GPU ")]


@dataclass
class Worker:
    """One DVC queue worker process pinned to one GPU."""

    slot: int
    gpu: str
    node: str
    proc: subprocess.Popen
    log: Path
    restarts: int = 0
    # where this sweep's part of ``log`` starts: the file is appended to by every sweep on the same slot and GPU, and
    # an earlier sweep's lines ("ready.", "received") say nothing about this one's worker
    log_start: int = 0


def _node_name(repo_root: Path, slot: int, gpu: str) -> str:
    h = hashlib.sha256(str(repo_root).encode()).hexdigest()[:6]
    return f"kernelcamp-{h}-gpu{gpu}-slot{slot}@localhost"


def worker_slots(gpus: list[str]) -> list[int]:
    """The worker slot of each GPU in ``gpus``: the GPU's index itself when every id is an index.

    Keying the slot (hence the server port) by GPU index keeps two sweeps on disjoint GPUs of one
    host, e.g. ``--gpus 0`` in one repo and ``--gpus 1,2`` in another, off each other's ports. Ids
    that are not all non-negative integers (GPU UUIDs, MIG ids) get their position 0..N-1 instead.
    """
    if all(g.isdigit() for g in gpus):
        return [int(g) for g in gpus]
    return list(range(len(gpus)))


def worker_env(base: dict[str, str], gpu: str, slot: int) -> dict[str, str]:
    """The environment of the worker pinned to ``gpu``: only that GPU visible, its slot set."""
    env = dict(base)
    env["CUDA_VISIBLE_DEVICES"] = gpu
    env[SLOT_ENV] = str(slot)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def queued_count(repo_root: Path) -> int:
    """Number of experiments waiting in the DVC queue of the repo at ``repo_root``."""
    from dvc.repo import Repo

    with Repo(str(repo_root)) as repo:
        return sum(1 for _ in repo.experiments.celery_queue.iter_queued())


def active_count(repo_root: Path) -> int:
    """Number of queued experiments of the repo at ``repo_root`` that a worker has taken and not finished (DVC's
    own record of them: the filesystem broker's processed messages whose results are not ready; no worker is asked)."""
    from dvc.repo import Repo

    with Repo(str(repo_root)) as repo:
        return sum(1 for _ in repo.experiments.celery_queue.iter_active())


def _spawn(repo_root: Path, slot: int, gpu: str, node: str, log: Path) -> subprocess.Popen:
    """Start ``dvc exp queue-worker node`` pinned to ``gpu`` (its own process group), appending to ``log``."""
    fh = open(log, "ab")  # noqa: SIM115 - owned by the child process
    try:
        return subprocess.Popen(
            ["dvc", "exp", "queue-worker", node],
            cwd=repo_root,
            env=worker_env(dict(os.environ), gpu, slot),
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        fh.close()


def _log_text(w: Worker) -> str:
    """The part of the worker's log written since this sweep started it ("" where it cannot be read)."""
    try:
        with open(w.log, "rb") as fh:
            fh.seek(w.log_start)
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def worker_ready(w: Worker) -> bool:
    """Whether the worker has logged that it is ready (celery's ``<node> ready.`` line) or has exited."""
    return w.proc.poll() is not None or f"{w.node} ready." in _log_text(w)


def took_experiment(w: Worker) -> bool:
    """Whether the worker's log shows it received a task (celery's ``Task ...[id] received``): an experiment."""
    return "] received" in _log_text(w)


def received_task_ids(w: Worker) -> set[str]:
    """The celery task ids of the experiments (DVC's ``run_exp`` tasks) that the worker's log shows it took."""
    return set(_RECEIVED_RE.findall(_log_text(w)))


def fail_orphaned_experiments(repo_root: Path, task_ids: set[str]) -> list[str]:
    """Mark as failed each experiment that one of the stopped workers took (its celery task id in ``task_ids``) and
    that DVC still counts as running; return their names (the stash rev's first 7 characters where one has none).

    A worker stopped while it ran an experiment, or in the seconds of its warm shutdown in which it can still take
    the next one from the queue (tests/test_sweep.py on a CPU: SIGTERM in the first of two experiments, and
    ``dvc queue status`` kept the second "Running" with no worker left), leaves DVC's record of that task without a
    result, so the queue counts it as running for good (and a later sweep never sees the queue drained). DVC's own
    ``dvc queue kill`` marks such a task failed in celery's result backend once its process is gone and no live
    worker runs it (``_mark_inactive_tasks_failure``, dvc/repo/experiments/queue/celery.py in DVC 3.67); this does the
    same for this sweep's tasks only, so the running experiments of another sweep on other GPUs of the same repo are
    left alone. An experiment's process that outlived its worker (DVC starts it in a session of its own) is killed
    first (SIGKILL to its group). Call it only once the workers have exited.

    Raises whatever DVC raises when its repo or queue cannot be read.
    """
    if not task_ids:
        return []
    from celery.result import AsyncResult
    from dvc.repo import Repo
    from dvc.repo.experiments.queue.base import QueueEntry

    with Repo(str(repo_root)) as repo:
        queue = repo.experiments.celery_queue
        ours: dict[str, QueueEntry] = {}  # celery task id -> the experiment, for this sweep's tasks with no result
        for msg in queue.celery.iter_processed():
            task_id = msg.headers.get("id")
            if task_id not in task_ids or AsyncResult(task_id, app=queue.celery).ready():
                continue
            args, kwargs, _embed = msg.decode()
            ours[task_id] = QueueEntry.from_dict(kwargs.get("entry_dict", args[0] if args else {}))
        for entry in ours.values():
            # DVC starts an experiment's process in a session of its own, so it can outlive its worker's group
            with contextlib.suppress(ProcessLookupError):
                queue.proc.kill(entry.stash_rev, group=True)
        for task_id in ours:
            # no worker of this sweep is left to finish it: what `dvc queue kill` records for a task whose process
            # is gone and that no live worker runs (the task's result set to a failure in celery's result backend)
            if not AsyncResult(task_id, app=queue.celery).ready():
                queue.celery.backend.mark_as_failure(task_id, None)
    return sorted(e.name or e.stash_rev[:7] for e in ours.values())


def failed_experiments(repo_root: Path, task_ids: set[str]) -> list[str]:
    """Names (the stash rev's first 7 characters where one has none) of the experiments this sweep's workers took
    (their celery task ids in ``task_ids``) that DVC records as failed (``dvc queue status``: Failed; DVC 3.67's
    ``iter_failed``: done with no result). A sweep whose experiment failed said "done" and exited 0.

    Raises whatever DVC raises when its repo or queue cannot be read."""
    if not task_ids:
        return []
    from dvc.repo import Repo
    from dvc.repo.experiments.queue.base import QueueEntry

    with Repo(str(repo_root)) as repo:
        queue = repo.experiments.celery_queue
        ours: dict[str, str] = {}  # stash rev -> name, for this sweep's tasks
        for msg in queue.celery.iter_processed():
            if msg.headers.get("id") in task_ids:
                args, kwargs, _embed = msg.decode()
                e = QueueEntry.from_dict(kwargs.get("entry_dict", args[0] if args else {}))
                ours[e.stash_rev] = e.name or e.stash_rev[:7]
        return sorted(ours[r.entry.stash_rev] for r in queue.iter_failed() if r.entry.stash_rev in ours)


def start_workers(
    repo_root: Path, gpus: list[str], log_dir: Path, ready_timeout_s: float = READY_TIMEOUT_S, poll_s: float = 0.2
) -> list[Worker]:
    """Start one ``dvc exp queue-worker`` per GPU (new process group each), logging to ``log_dir``, one at a time:
    each once the one before is ready (:func:`worker_ready`) or ``ready_timeout_s`` has passed (READY_TIMEOUT_S).

    Whatever stops it part way (a worker that cannot be started, Ctrl-C or SIGTERM while it waits) stops the workers
    it has started before it propagates, so none is left holding a GPU."""
    log_dir.mkdir(parents=True, exist_ok=True)
    workers: list[Worker] = []
    try:
        for slot, gpu in zip(worker_slots(gpus), gpus, strict=True):
            if workers:
                deadline = time.monotonic() + ready_timeout_s
                while not worker_ready(workers[-1]) and time.monotonic() < deadline:
                    time.sleep(poll_s)
            node = _node_name(repo_root, slot, gpu)
            log = log_dir / f"worker-slot{slot}-gpu{gpu}.log"
            start = log.stat().st_size if log.exists() else 0
            workers.append(Worker(slot, gpu, node, _spawn(repo_root, slot, gpu, node, log), log, log_start=start))
    except BaseException:
        stop_workers(workers)
        raise
    return workers


def restart_worker(repo_root: Path, w: Worker) -> None:
    """Start ``w``'s worker again (same GPU, slot, node name and log), counting it in ``w.restarts``."""
    w.proc = _spawn(repo_root, w.slot, w.gpu, w.node, w.log)
    w.restarts += 1


def stop_workers(workers: list[Worker], grace_s: float = 10.0) -> None:
    """SIGTERM each worker's process group, then SIGKILL what is left after ``grace_s``."""
    for w in workers:
        if w.proc.poll() is None:
            try:
                os.killpg(w.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace_s
    for w in workers:
        try:
            w.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(w.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            w.proc.wait()


def prepare_tracking_store(repo_root: Path) -> None:
    """Create and migrate the MLflow store of ``repo_root`` once, before any worker starts.

    Raises ``KernelcampError`` when the store cannot be opened or its server is unreachable.
    """
    from kernelcamp import tracking
    from kernelcamp.io import load_params

    params_path = repo_root / "params.yaml"
    params = load_params(params_path) if params_path.exists() else {}
    old = os.environ.get("DVC_ROOT")
    os.environ["DVC_ROOT"] = str(repo_root)
    try:
        tracking.ensure_store(params)
    finally:
        if old is None:
            os.environ.pop("DVC_ROOT", None)
        else:
            os.environ["DVC_ROOT"] = old


def stop_slot_servers(repo_root: Path, slots: list[int]) -> list[int]:
    """Stop the embedded servers (deployed, and a benchmark's temporary baseline) that the workers in
    ``slots`` left running; returns the slots where one was running."""
    from kernelcamp.deploy.embedded import stop_servers

    return [slot for slot in slots if stop_servers(repo_root, slot)]


def _made_dirs(d: Path) -> list[Path]:
    """Create folder ``d`` and its missing parents; return those this call created, innermost first."""
    missing = [p for p in (d, *d.parents) if not p.exists()]
    d.mkdir(parents=True, exist_ok=True)
    return missing


def _lock_slot(path: Path) -> tuple[Any, bool | None]:
    """Open (creating it if need be) and ``flock`` the lock file ``path`` without waiting; return ``(file, made)``:
    ``made`` says whether this call created the file, None that another process holds the lock (the file is open,
    not locked, for its holder's pid).

    A refused sweep removes the lock file it made while it still holds it (:func:`hold_slots`); a sweep that opened
    the file just before then gets the lock of a file no longer at ``path``. So the lock counts only while ``path``
    is still the file locked: else the file at ``path`` is opened and locked again."""
    import fcntl

    while True:
        try:
            fd, made = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644), True
        except FileExistsError:
            try:
                fd, made = os.open(path, os.O_RDWR), False
            except FileNotFoundError:  # removed since: make it
                continue
        f = os.fdopen(fd, "r+")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return f, None
        except BaseException:
            f.close()
            raise
        try:
            same = os.path.samestat(os.fstat(f.fileno()), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            return f, made
        f.close()  # a refused sweep removed it under this one: lock the file at the path


class SlotHold(contextlib.ExitStack):
    """The slot locks :func:`hold_slots` holds (closing it releases them); ``made``: the lock files and folders it
    created, in the order :func:`release_refused` removes them."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[Path] = []


def hold_slots(repo_root: Path, slots: list[int], gpus: list[str]) -> SlotHold:
    """Lock each worker slot's server folder (``.kernelcamp/slotN/sweep.lock``, ``fcntl``, released when the
    returned stack closes or this process ends) for this sweep, writing its pid there.

    Raises ``KernelcampError`` naming the GPU, the slot and the holder's pid when another live sweep of this
    workspace holds one: its workers serve from that slot's port, and this sweep would stop their server. A refused
    sweep leaves nothing behind: the lock files and folders this call made are removed again when it raises, and by
    :func:`release_refused` on the returned stack when the sweep is refused after it.
    """
    from kernelcamp.deploy.common import state_dir

    stack = SlotHold()
    made = stack.made
    try:
        for slot, gpu in zip(slots, gpus, strict=True):
            d = state_dir(repo_root, slot)
            made[:0] = _made_dirs(d)
            f, mine = _lock_slot(d / "sweep.lock")
            stack.enter_context(f)
            if mine is None:
                f.seek(0)
                holder = f.read().strip() or "unknown"
                raise KernelcampError(
                    f"GPU {gpu} (worker slot {slot}) is in use by another kernelcamp sweep of this workspace (pid "
                    f"{holder}): wait for it to finish (experiments queued now are drained by it), or pass other "
                    "GPUs with --gpus"
                ) from None
            if mine:
                made.insert(0, d / "sweep.lock")
            f.truncate(0)
            f.write(f"{os.getpid()}\n")
            f.flush()
    except BaseException:
        release_refused(stack)
        raise
    return stack


def release_refused(held: SlotHold) -> None:
    """Release the slots :func:`hold_slots` took for a sweep that is refused, removing the lock files and folders
    it made (each lock file while it is still held; a folder only when empty): a refused command leaves nothing."""
    with held:
        for p in held.made:
            with contextlib.suppress(OSError):  # a folder something else has written to since: it stays
                p.unlink() if p.name == "sweep.lock" else p.rmdir()


def run_sweep(
    repo_root: Path, gpus: list[str], poll_s: float = 5.0, log=print, drain_grace_s: float = DRAIN_GRACE_S
) -> int:
    """Drain the DVC queue with one worker per GPU; return 0 if every worker exited cleanly (or failed at its start,
    before it took an experiment, and the others drained the queue: READY_TIMEOUT_S above) and no experiment this
    sweep ran failed (:func:`failed_experiments`, named in one line), else 1.

    When the queue is drained, or on Ctrl-C (exit 130) or SIGTERM (exit 143), the workers are stopped
    with their process groups (the running experiment's stages too) and the embedded servers of
    their slots are stopped, so nothing keeps a GPU or a port after the sweep. A worker still alive
    ``drain_grace_s`` seconds after the queue was seen drained (nothing queued, no experiment running) is
    stopped too, and counts as clean: DVC's queue worker can hang in its own shutdown (a CI run of
    tests/test_sweep.py: one of two workers logged "shutting down due to empty queue" and never exited,
    and the sweep waited for it until the test's 240 s timeout).

    Raises ``KernelcampError`` when ``gpus`` is empty, a GPU id repeats or is not an index or UUID,
    ``poll_s`` is not positive, or ``repo_root`` is not a DVC repo.
    """
    if not gpus:
        raise KernelcampError("no GPU found: pass --gpus 0,1 or, on a CPU-only machine, use `dvc queue start`")
    if len(set(gpus)) != len(gpus) or len(set(worker_slots(gpus))) != len(gpus):  # `0,00` is GPU 0 twice
        raise KernelcampError(f"--gpus {','.join(gpus)}: each GPU may appear once (one worker per GPU)")
    bad = [g for g in gpus if not (g.isdigit() or g.startswith(("GPU-", "MIG-")))]
    if bad:
        raise KernelcampError(
            f"--gpus: {', '.join(map(repr, bad))} is not a GPU id: give indices (0,1) or UUIDs (GPU-..., MIG-...) "
            "as CUDA_VISIBLE_DEVICES takes them (nvidia-smi -L lists them)"
        )
    if not 0 < poll_s <= MAX_POLL_S:  # nan passed `poll_s <= 0` and crashed time.sleep after a worker had started
        raise KernelcampError(f"--poll {poll_s}: must be a positive number of seconds, at most {MAX_POLL_S:g}")
    if not (repo_root / ".dvc").is_dir():
        raise KernelcampError(f"{repo_root}: not a DVC repo (no .dvc/): run from the workspace or pass --repo")
    # a slot (its port and server folder) belongs to one sweep: a second sweep on the same GPU stopped the first
    # one's server mid-experiment, then reported done; it is refused here, before any side effect
    held = hold_slots(repo_root, worker_slots(gpus), gpus)
    try:
        n = queued_count(repo_root)
        if n == 0:  # before the store is made: a refused sweep leaves nothing behind
            raise KernelcampError(
                "nothing is queued: queue experiments first, e.g. dvc exp run --queue -S 'variant.num_warps=4,8'"
            )
        # Create the tracking store once, before any worker (DESIGN.md: concurrent creation can break it).
        prepare_tracking_store(repo_root)
    except BaseException:
        release_refused(held)
        raise
    log(f"sweep: {n} queued experiment(s), {len(gpus)} worker(s) on GPU(s) {', '.join(gpus)}")
    log_dir = repo_root / ".dvc" / "tmp" / "kernelcamp-sweep"
    # SIGTERM raises Terminated (a BaseException, like KeyboardInterrupt, so that no `except Exception`
    # on the way, the progress line's queue count or DVC's own code, swallows it)
    sig = contextlib.ExitStack()
    sig.enter_context(signals_raise((signal.SIGTERM,)))
    workers: list[Worker] = []
    t0 = time.monotonic()
    interrupted = None
    idle_stopped: set[str] = set()  # GPUs whose worker was stopped after the queue drained
    drained_since = None
    try:
        workers = start_workers(repo_root, gpus, log_dir)
        while True:
            time.sleep(poll_s)
            drained = False
            queued = None
            try:
                queued = queued_count(repo_root)
                left = f"{queued} of {n} still queued, "
                drained = queued == 0 and active_count(repo_root) == 0
            except Exception:  # noqa: BLE001 - progress only: DVC may hold its queue lock right now
                left = ""
            for w in workers:
                rc = w.proc.poll()
                if rc not in (None, 0) and queued and not took_experiment(w) and w.restarts < START_RETRIES:
                    log(
                        f"sweep: the worker on GPU {w.gpu} exited with {rc} before it took an experiment (log: "
                        f"{w.log}); starting it again ({w.restarts + 1} of {START_RETRIES})"
                    )
                    restart_worker(repo_root, w)
            alive = [f"gpu{w.gpu}" for w in workers if w.proc.poll() is None]
            log(f"sweep: {time.monotonic() - t0:6.0f} s, {left}workers running: {', '.join(alive) or 'none'}")
            if not alive:
                break
            now = time.monotonic()
            drained_since = (drained_since or now) if drained else None
            if drained_since is not None and now - drained_since >= drain_grace_s:
                hung = [w for w in workers if w.proc.poll() is None]
                if hung:
                    idle_stopped = {w.gpu for w in hung}
                    log(
                        f"sweep: the queue has been drained for {drain_grace_s:.0f} s with no experiment running, "
                        f"but the worker(s) on GPU(s) {', '.join(sorted(idle_stopped))} have not exited (a DVC queue "
                        "worker can hang in its own shutdown); stopping them"
                    )
                break
    except KeyboardInterrupt:
        interrupted = ("interrupted", 130)
    except Terminated:
        interrupted = ("terminated (SIGTERM)", 143)
    finally:
        if interrupted:
            log(f"sweep: {interrupted[0]}, stopping workers and their experiments")
        stop_workers(workers)
        stopped = stop_slot_servers(repo_root, [w.slot for w in workers])
        if stopped:
            log(f"sweep: stopped the embedded servers of slot(s) {', '.join(map(str, stopped))}")
        taken = set().union(*(received_task_ids(w) for w in workers))
        try:
            orphaned = fail_orphaned_experiments(repo_root, taken)
        except Exception as e:  # noqa: BLE001 - the sweep's own exit status stands; the user is told what to check
            log(f"sweep: warning: could not check the queue for experiments left running ({e}); see `dvc queue status`")
        else:
            if orphaned:
                log(
                    f"sweep: marked {len(orphaned)} experiment(s) the stopped workers had taken as failed (none of "
                    f"them finished): {', '.join(orphaned)}; `dvc queue logs NAME` shows how far each got, and "
                    "`dvc exp run --queue` with its -S overrides queues it again"
                )
        sig.close()
        held.close()
    if interrupted:
        return interrupted[1]
    failed = [w for w in workers if w.proc.returncode != 0 and w.gpu not in idle_stopped]
    left_queued = None
    if failed:  # the queue is counted (a DVC repo opened) only where a worker failed
        try:
            left_queued = queued_count(repo_root)
        except Exception:  # noqa: BLE001 - unknown: a worker that failed at its start then counts as failed
            pass
    # a worker that failed at its start (no experiment taken) spoiled nothing once the others drained the queue
    bad = [w for w in failed if took_experiment(w) or left_queued != 0]
    for w in failed:
        if w in bad:
            log(f"sweep: worker on GPU {w.gpu} exited with {w.proc.returncode}; log: {w.log}")
        else:
            log(
                f"sweep: warning: the worker on GPU {w.gpu} exited with {w.proc.returncode} before it took an "
                f"experiment (log: {w.log}); the other workers drained the queue"
            )
    failed_exps: list[str] = []
    try:
        failed_exps = failed_experiments(repo_root, taken)  # the tasks the stopped workers took
    except Exception as e:  # noqa: BLE001 - the workers' own status stands; the user is told what to check
        log(f"sweep: warning: could not read which experiments failed ({e}); see `dvc queue status`")
    if failed_exps:
        log(
            f"sweep: {len(failed_exps)} experiment(s) failed: {', '.join(failed_exps)}; `dvc queue logs NAME` shows "
            "why (its `error:` line), and `dvc exp run --queue` with its -S overrides queues it again"
        )
    log(
        f"sweep: done in {time.monotonic() - t0:.0f} s; "
        "`dvc exp show` lists the results, `dvc queue status` any failures"
    )
    return 1 if bad or failed_exps else 0


def build_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``sweep`` to ``sub`` (the subparsers of :func:`kernelcamp.cli.build_parser`)."""
    p = sub.add_parser(
        "sweep",
        description="Run the queued DVC experiments (dvc exp run --queue ...) with one worker per GPU, "
        "each seeing only its own GPU and using its own server port.",
    )
    p.add_argument(
        "--gpus",
        default="auto",
        help="comma-separated GPU ids, or 'auto' (CUDA_VISIBLE_DEVICES or nvidia-smi) [default: auto]",
    )
    p.add_argument("--repo", default=".", help="the DVC repo [default: .]")
    p.add_argument("--poll", type=float, default=5.0, help="seconds between progress lines [default: 5]")
    p.add_argument(
        "--launcher",
        default="queue",
        choices=("queue", "local", "local-gpu", "slurm"),
        help="queue: DVC queue workers in this workspace, one per GPU (today's sweep); local, local-gpu, slurm: "
        "submitit jobs, each in its own clone of launcher.git_remote, pushing its experiment there and "
        "logging to the MLflow server (conf/launcher/, kernelcamp.launcher) [default: queue]",
    )
    p.add_argument(
        "-S",
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a launcher.* or tracking.* setting for this sweep, as dvc exp run -S takes it (submitit launchers)",
    )
    p.set_defaults(main=main)
    return p


def main(args: argparse.Namespace) -> int:
    """``kernelcamp sweep``: see the module docstring."""
    gpus = detect_gpus() if args.gpus == "auto" else [g.strip() for g in args.gpus.split(",") if g.strip()]
    try:
        if args.launcher != "queue":
            from kernelcamp.launcher import run_launcher_sweep

            return run_launcher_sweep(Path(args.repo).resolve(), args.launcher, args.overrides, gpus, poll_s=args.poll)
        if args.overrides:
            raise KernelcampError("-S is for the submitit launchers (--launcher local, local-gpu or slurm)")
        return run_sweep(Path(args.repo).resolve(), gpus, poll_s=args.poll)
    except KernelcampError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # `python -m kernelcamp.sweep ...` is `kernelcamp sweep ...`
    from kernelcamp.cli import main as _cli_main

    sys.exit(_cli_main(["sweep", *sys.argv[1:]]))

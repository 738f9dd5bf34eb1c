"""Sweeps beyond one machine: queued DVC experiments run as submitit jobs (local, local-gpu, slurm).

    dvc exp run --queue -S 'variant.num_warps=4,8'
    kernelcamp sweep --launcher local -S launcher.concurrency=4   # jobs on this machine, no GPU visible
    kernelcamp sweep --launcher local-gpu --gpus 0,1              # one job per GPU of this machine
    kernelcamp sweep --launcher slurm -S launcher.partition=gpu -S launcher.gpu_type=h100

``kernelcamp sweep`` without ``--launcher`` is unchanged (kernelcamp.sweep: DVC queue workers in this
workspace, one per GPU). With one, a sweep does, in order (nothing is pushed or submitted before
every check of step 1 passed):

1. Checks: the settings (``conf/launcher/<name>.yaml``, composed with conf/local and the ``-S``
   overrides as ``dvc exp run`` composes), the git remote ``launcher.git_remote`` (a remote of this
   workspace), the DVC remote ``launcher.dvc_remote`` (in the committed ``.dvc/config``, so every clone
   has it), the MLflow server (``MLFLOW_TRACKING_URI``, else ``tracking.uri``; http(s) only: jobs on
   other machines share no SQLite file), ``sbatch`` for slurm, and that something is queued. The
   MLflow experiment is created here, once, before any job.
2. Ships each queued experiment: the commit that ``dvc exp run --queue`` stashed (the baseline commit
   plus the composed params.yaml) is pushed to the git remote as ``refs/kernelcamp/queue/<name>``.
3. Submits the jobs: local, ``launcher.concurrency`` jobs; local-gpu, one job per GPU; each runs its
   share of the queue (round robin) one experiment after another. slurm: one array task per
   experiment, ``launcher.concurrency`` at once (``--array=0-N%C``); SLURM does the scheduling.
4. A job, per experiment (:func:`run_experiment`): clones the git remote into a folder of its own,
   checks out the baseline commit with the queued commit's files, runs ``dvc exp run --no-hydra -n
   <name>`` (params.yaml is already composed; recomposing would drop the ``-S`` overrides), then ``dvc
   exp push <git remote> <name>`` (``-r <dvc_remote>``, or ``--no-cache`` when none is set). The stages
   log to the MLflow server (``MLFLOW_TRACKING_URI`` is set for the job). SIGTERM or SIGINT to the job
   (``scancel``, a local cancel, Ctrl-C) sends SIGTERM to the experiment's process group, so the
   running stage ends its MLflow run KILLED (kernelcamp.tracking), and the job's other experiments
   are not started.
5. Waits, with a progress line; Ctrl-C or SIGTERM cancels the jobs. Then reads the git remote: an
   experiment landed when its ref there is new or changed since step 2. Landed experiments leave the
   local queue and are pulled into this workspace (``dvc exp show`` lists them); the
   ``refs/kernelcamp/queue/*`` refs are deleted; each experiment that did not land is named with its
   job's log and stays queued: the same command runs it again.

Not done here: a job's clone does not ``dvc pull`` DVC-tracked inputs (kernelcamp's pipeline has none;
every output is git-tracked with ``cache: false``).
"""

from __future__ import annotations

import contextlib
import math
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelcamp.errors import KernelcampError, url_shown
from kernelcamp.ports import SLOT_ENV
from kernelcamp.signals import Terminated, signals_deferred, signals_raise

#: ``--launcher`` choices besides today's default (``queue``: kernelcamp.sweep).
LAUNCHERS = ("local", "local-gpu", "slurm")
#: Where a sweep ships its queued experiments on the git remote (deleted when the sweep ends).
QUEUE_REF = "refs/kernelcamp/queue"
#: Seconds a stopped experiment's process group gets between SIGTERM and SIGKILL.
STOP_GRACE_S = 20.0
#: Slots (server ports: kernelcamp.ports) of slurm array tasks wrap at this many, keeping ports < 10k.
SLURM_SLOTS = 100


@dataclass(kw_only=True)
class LauncherSpec:
    """The ``launcher`` section (conf/launcher/local.yaml documents each key)."""

    name: str
    git_remote: str = "origin"
    dvc_remote: str | None = None
    folder: str = ".dvc/tmp/kernelcamp-jobs"
    clone_dir: str | None = None
    keep_clones: bool = False
    concurrency: int = field(default=2, metadata={"ge": 1})
    timeout_min: float = field(default=60.0, metadata={"gt": 0})
    partition: str | None = field(default=None, metadata={"nonempty": True, "no_dash": True})
    gpu_type: str | None = field(default=None, metadata={"nonempty": True, "no_dash": True})
    gpus_per_job: int = field(default=0, metadata={"ge": 0})
    cpus_per_job: int = field(default=2, metadata={"ge": 1})
    mem_gb: float | None = field(default=None, metadata={"gt": 0})
    setup: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class QueuedExperiment:
    """One entry of the DVC queue: its name, the stashed commit and the commit it branches from."""

    name: str
    stash_rev: str
    baseline_rev: str
    targets: tuple[str, ...] = ()
    force: bool = False

    @property
    def exp_ref(self) -> str:
        """The ref ``dvc exp push`` writes for it (``refs/exps/<baseline[:2]>/<baseline[2:]>/<name>``)."""
        return f"refs/exps/{self.baseline_rev[:2]}/{self.baseline_rev[2:]}/{self.name}"

    @property
    def queue_ref(self) -> str:
        """Where the sweep ships its stashed commit on the git remote."""
        return f"{QUEUE_REF}/{self.name}"


@dataclass(frozen=True)
class JobPlan:
    """What one job runs (pickled to it): its experiments, in order, and where everything goes."""

    git_url: str
    dvc_remote: str | None
    tracking_uri: str
    clone_root: str
    keep_clones: bool
    experiments: tuple[QueuedExperiment, ...]
    slot: int | None = None
    gpu: str | None = None


# ------------------------------------------------------------------------------------------- checks


def _git(cwd: str | Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if check and out.returncode != 0:
        msg = " ".join((out.stderr or out.stdout).split())
        raise KernelcampError(f"git {' '.join(args)} failed: {msg}")
    return out


def load_settings(repo_root: Path, name: str, overrides: Sequence[str] = ()) -> tuple[LauncherSpec, dict[str, Any]]:
    """The launcher settings and the composed params for ``--launcher name`` (``-S`` ``overrides``).

    Composes conf/ with ``launcher=<name>`` (conf/local and the overrides on top), as ``dvc exp run``
    would. Raises ``KernelcampError`` for an unknown launcher, an override outside ``launcher.*`` /
    ``tracking.*``, a composition error, or a bad value (one line naming the key).
    """
    import yaml

    from kernelcamp.compose import compose_text
    from kernelcamp.spec import parse_section

    if name not in LAUNCHERS:
        raise KernelcampError(f"--launcher {name!r}: choose one of queue, {', '.join(LAUNCHERS)}")
    bad = [o for o in overrides if not o.lstrip("+~").startswith(("launcher.", "tracking."))]
    if bad:
        raise KernelcampError(
            f"-S {bad[0]}: a sweep takes launcher.* and tracking.* settings only; "
            "set an experiment's params when you queue it (dvc exp run --queue -S ...)"
        )
    params = yaml.safe_load(compose_text(repo_root, [f"launcher={name}", *overrides]))
    spec = parse_section(LauncherSpec, params.get("launcher") or {}, "launcher")
    if spec.name != name:
        raise KernelcampError(f"launcher.name = {spec.name!r} but --launcher {name}: fix conf/launcher/{name}.yaml")
    return spec, params


def git_remote_url(repo_root: Path, remote: str) -> str:
    """The URL of git remote ``remote`` of the repo at ``repo_root`` (a local path made absolute).

    Raises ``KernelcampError`` when there is no such remote.
    """
    out = _git(repo_root, "remote", "get-url", remote, check=False)
    if out.returncode != 0:
        raise KernelcampError(
            f"launcher.git_remote = {remote!r}: {repo_root} has no such git remote; add one that every job "
            f"can reach (git remote add {remote} <url>) or pick another with -S launcher.git_remote=NAME"
        )
    url = out.stdout.strip()
    if "://" not in url and ":" not in url.split("/")[0] and not os.path.isabs(url):
        url = str((repo_root / url).resolve())  # a relative path means nothing inside a job's clone
    return url


def resolve_dvc_remote(repo_root: Path, remote: str | None) -> str | None:
    """The DVC remote the jobs push DVC-cached outputs to: ``remote``, else the default remote of the
    repo's ``.dvc/config`` (``core.remote``), else None (nothing cached is pushed).

    Only the repo-level file counts: ``.dvc/config.local`` and the user's global config do not reach
    a job's clone. Raises ``KernelcampError`` when ``remote`` is not a remote of that file.
    """
    from dvc.config import Config

    conf = Config(dvc_dir=str(repo_root / ".dvc"), validate=False).load_one("repo")
    remotes = conf.get("remote", {})
    if remote is None:
        default = conf.get("core", {}).get("remote")
        return default if default in remotes else None
    if remote not in remotes:
        known = ", ".join(sorted(remotes)) or "none"
        raise KernelcampError(
            f"launcher.dvc_remote = {remote!r}: not a remote of {repo_root}/.dvc/config (known: {known}); "
            f"add it there and commit it (dvc remote add {remote} <url>), or set launcher.dvc_remote=null"
        )
    return remote


def server_uri(params: Mapping[str, Any]) -> str:
    """The MLflow server the jobs log to: ``MLFLOW_TRACKING_URI``, else ``tracking.uri``; checked live.

    Creates the MLflow experiment once (kernelcamp.tracking.ensure_store). Raises ``KernelcampError``
    when it is not an http(s) server or does not answer.
    """
    from kernelcamp import tracking

    uri = tracking.tracking_uri(params)
    if not uri.startswith(("http://", "https://")):
        raise KernelcampError(
            f"jobs need an MLflow server, not {url_shown(uri)}: start one with a database backend (mlflow server "
            "--backend-store-uri sqlite:///PATH or postgresql://...) and set MLFLOW_TRACKING_URI or "
            "-S tracking.uri=http://HOST:PORT"
        )
    tracking.ensure_store(params)
    return uri


def queued_experiments(repo_root: Path) -> list[QueuedExperiment]:
    """The experiments waiting in the DVC queue of ``repo_root``, oldest first.

    ``targets`` and ``force`` come from the queued run's arguments (DVC's ``.dvc/tmp/repro.dat`` in the
    stashed commit).
    """
    from dvc.repo import Repo

    with Repo(str(repo_root)) as repo:
        entries = list(repo.experiments.celery_queue.iter_queued())
    out = []
    for e in entries:
        targets: tuple[str, ...] = ()
        force = False
        dat = subprocess.run(["git", "show", f"{e.stash_rev}:.dvc/tmp/repro.dat"], cwd=repo_root, capture_output=True)
        if dat.returncode == 0:
            with contextlib.suppress(Exception):  # written by DVC in this repo; absent: run the whole pipeline
                kwargs = pickle.loads(dat.stdout).get("kwargs", {})  # noqa: S301
                targets = tuple(kwargs.get("targets") or ())
                force = bool(kwargs.get("force"))
        out.append(QueuedExperiment(e.name or e.stash_rev[:7], e.stash_rev, e.baseline_rev, targets, force))
    return out


def remote_refs(git_url: str, pattern: str = "refs/exps/*") -> dict[str, str]:
    """``ref -> commit`` of the refs matching ``pattern`` on the git remote ``git_url``.

    Raises ``KernelcampError`` when the remote cannot be read.
    """
    out = _git(".", "ls-remote", git_url, pattern)
    refs = {}
    for line in out.stdout.splitlines():
        sha, _, ref = line.partition("\t")
        refs[ref.strip()] = sha.strip()
    return refs


def check_gpus(gpus: Sequence[str]) -> None:
    """Raise ``KernelcampError`` unless ``gpus`` (for local-gpu) are distinct GPU indices, at least one."""
    if not gpus:
        raise KernelcampError("--launcher local-gpu: no GPU found; pass --gpus 0,1 or use --launcher local")
    if not all(g.isdigit() for g in gpus) or len(set(gpus)) != len(gpus):
        raise KernelcampError(
            f"--gpus {','.join(gpus)}: local-gpu takes distinct GPU indices (0,1), as submitit's local executor does"
        )


# --------------------------------------------------------------------------------------------- plan


def plan_jobs(
    spec: LauncherSpec,
    experiments: Sequence[QueuedExperiment],
    git_url: str,
    tracking_uri: str,
    clone_root: Path,
    gpus: Sequence[str] = (),
) -> list[JobPlan]:
    """Split ``experiments`` into jobs: slurm, one each; local, ``spec.concurrency`` jobs; local-gpu, one
    job per GPU of ``gpus`` (slot = the GPU index). Local jobs take experiments round robin.

    Raises ``KernelcampError`` for local-gpu without GPUs, or with GPU ids that are not indices.
    """
    common = dict(
        git_url=git_url,
        dvc_remote=spec.dvc_remote,
        tracking_uri=tracking_uri,
        clone_root=str(clone_root),
        keep_clones=spec.keep_clones,
    )
    if spec.name == "slurm":
        return [JobPlan(**common, experiments=(e,)) for e in experiments]
    if spec.name == "local-gpu":
        check_gpus(gpus)
        slots = [(int(g), g) for g in gpus]
    else:
        slots = [(i, None) for i in range(spec.concurrency)]
    slots = slots[: len(experiments)]
    return [
        JobPlan(**common, experiments=tuple(experiments[i :: len(slots)]), slot=slot, gpu=gpu)
        for i, (slot, gpu) in enumerate(slots)
    ]


def slurm_parameters(spec: LauncherSpec, n_tasks: int) -> dict[str, Any]:
    """submitit ``SlurmExecutor`` parameters: one task per experiment, ``concurrency`` at once.

    ``gpu_type`` becomes ``--gres=gpu:<type>:<gpus_per_job>``; without it, ``--gpus-per-node``.
    """
    p: dict[str, Any] = {
        "job_name": "kernelcamp-sweep",
        "time": int(math.ceil(spec.timeout_min)),
        "nodes": 1,
        "ntasks_per_node": 1,
        "cpus_per_task": spec.cpus_per_job,
        "array_parallelism": min(spec.concurrency, max(1, n_tasks)),
        "setup": list(spec.setup),
    }
    if spec.partition:
        p["partition"] = spec.partition
    if spec.gpus_per_job:
        if spec.gpu_type:
            p["gres"] = f"gpu:{spec.gpu_type}:{spec.gpus_per_job}"
        else:
            p["gpus_per_node"] = spec.gpus_per_job
    if spec.mem_gb:
        p["mem"] = f"{int(math.ceil(spec.mem_gb))}GB"
    return p


# ---------------------------------------------------------------------------------------------- job


def _stop_group(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM ``proc``'s process group (its own session), then SIGKILL what is left after ``grace_s``."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _run(cmd: Sequence[str], cwd: str | Path, env: Mapping[str, str]) -> int:
    """Run ``cmd`` in a session of its own (its output goes to the job's log); stop it on a signal."""
    from kernelcamp.signals import pdeathsig_preexec

    print(f"+ {' '.join(cmd)}", flush=True)
    proc = subprocess.Popen(list(cmd), cwd=cwd, env=dict(env), start_new_session=True, preexec_fn=pdeathsig_preexec())
    try:
        return proc.wait()
    except BaseException:
        _stop_group(proc)
        raise


def _result(exp: QueuedExperiment, status: str, step: str | None, rc: int, clone: Path, t0: float) -> dict[str, Any]:
    return {
        "name": exp.name,
        "status": status,
        "step": step,
        "rc": rc,
        "clone": str(clone),
        "seconds": time.monotonic() - t0,
    }


def run_experiment(plan: JobPlan, exp: QueuedExperiment, env: Mapping[str, str]) -> dict[str, Any]:
    """Clone, check out, ``dvc exp run`` and ``dvc exp push`` one queued experiment (see the module doc).

    Returns ``{"name", "status": "landed" | "failed", "step", "rc", "clone", "seconds"}``; raises
    ``Terminated`` / ``KeyboardInterrupt`` after stopping the experiment when the job is signalled.
    """
    t0 = time.monotonic()
    clone = Path(plan.clone_root) / f"{exp.name}-{uuid.uuid4().hex[:8]}"
    clone.parent.mkdir(parents=True, exist_ok=True)
    dvc = [sys.executable, "-m", "dvc"]
    run = [*dvc, "exp", "run", "--no-hydra", "-n", exp.name, *(["-f"] if exp.force else []), *exp.targets]
    push = [*dvc, "exp", "push", plan.git_url, exp.name]
    push += ["-r", plan.dvc_remote] if plan.dvc_remote else ["--no-cache"]
    steps = [
        ("clone", ["git", "clone", "-q", "--no-checkout", plan.git_url, str(clone)], clone.parent),
        ("fetch", ["git", "fetch", "-q", "origin", f"{exp.queue_ref}:{exp.queue_ref}"], clone),
        ("checkout", ["git", "checkout", "-q", "--detach", exp.baseline_rev], clone),
        # the queued commit's files over the baseline (DVC's own queue arguments, .dvc/tmp, left out)
        (
            "restore",
            ["git", "restore", f"--source={exp.queue_ref}", "--staged", "--worktree", "--", ".", ":!.dvc/tmp"],
            clone,
        ),
        ("run", run, clone),
        ("push", push, clone),
    ]
    print(f"kernelcamp job: experiment {exp.name} in {clone}", flush=True)
    try:
        for step, cmd, cwd in steps:
            rc = _run(cmd, cwd, env)
            if rc != 0:
                print(f"kernelcamp job: experiment {exp.name}: {step} exited {rc}; clone kept: {clone}", flush=True)
                return _result(exp, "failed", step, rc, clone, t0)
    finally:
        stop_servers_in(clone)
    if not plan.keep_clones:
        shutil.rmtree(clone, ignore_errors=True)
    print(f"kernelcamp job: experiment {exp.name} landed in {time.monotonic() - t0:.0f} s", flush=True)
    return _result(exp, "landed", None, 0, clone, t0)


def stop_clone_servers(clone_root: Path) -> int:
    """:func:`stop_servers_in` every experiment clone under ``clone_root``; returns how many servers were
    running. For a local launcher's cancelled jobs: submitit kills a job about a second after its SIGINT,
    before the job's own :func:`stop_servers_in` is done."""
    return sum(stop_servers_in(state.parent) for state in sorted(clone_root.glob("*/.kernelcamp")))


def stop_servers_in(clone: Path) -> int:
    """Stop the embedded servers the experiment's deploy and serving benchmark left in ``clone`` (its
    ``.kernelcamp`` state folder and each sweep slot's in it); returns how many were running. The
    deployed server outlives the pipeline on purpose (a rerun reuses it), but the clone is removed next,
    and with it the only record of that server: each sweep left one server per experiment holding its
    port. A SIGTERM or SIGINT waits until the servers are stopped."""
    from kernelcamp.deploy.embedded import stop_servers

    state = clone / ".kernelcamp"
    if not state.is_dir():
        return 0
    slots = [int(d.name[4:]) for d in state.glob("slot*") if d.name[4:].isdigit()]
    with signals_deferred():
        return sum(stop_servers(clone, slot) for slot in [None, *slots])


def run_job(plan: JobPlan) -> list[dict[str, Any]]:
    """A submitit job: run ``plan``'s experiments in order (:func:`run_experiment`); one result each.

    SIGTERM and SIGINT (submitit itself only logs SIGTERM) stop the running experiment and end the
    job: the experiments not started yet stay queued in the workspace and are reported as not run.
    """
    env = dict(os.environ)
    env["MLFLOW_TRACKING_URI"] = plan.tracking_uri
    env.setdefault("PYTHONUNBUFFERED", "1")
    if plan.slot is not None:
        env[SLOT_ENV] = str(plan.slot)
    elif "SLURM_ARRAY_TASK_ID" in env:  # two array tasks on one node must not share server ports
        env[SLOT_ENV] = str(int(env["SLURM_ARRAY_TASK_ID"]) % SLURM_SLOTS)
    results: list[dict[str, Any]] = []
    with signals_raise((signal.SIGTERM, signal.SIGINT)):
        try:
            for exp in plan.experiments:
                results.append(run_experiment(plan, exp, env))
        except (Terminated, KeyboardInterrupt) as e:
            name = e.args[0] if isinstance(e, Terminated) else "SIGINT"
            print(f"kernelcamp job: {name}: stopped; its experiments not landed stay queued", flush=True)
            raise
    return results


# -------------------------------------------------------------------------------------------- sweep


def check_launcher_tools(name: str) -> None:
    """Raise ``KernelcampError`` when submitit is not installed, or (slurm) ``sbatch`` is not on PATH."""
    try:
        import submitit  # noqa: F401
    except ImportError:
        raise KernelcampError(f"--launcher {name} needs submitit: pip install submitit") from None
    if name == "slurm" and shutil.which("sbatch") is None:
        raise KernelcampError("--launcher slurm: sbatch is not on PATH; run the sweep on a SLURM login node")


def _executor(spec: LauncherSpec, folder: Path, n_tasks: int):
    import submitit

    if spec.name == "slurm":
        ex = submitit.SlurmExecutor(folder=folder)
        ex.update_parameters(**slurm_parameters(spec, n_tasks))
        return ex
    return submitit.LocalExecutor(folder=folder)


@contextlib.contextmanager
def _kernelcamp_on_path():
    """For the block, PYTHONPATH leads to this kernelcamp, so that jobs submitted meanwhile import it
    also where it is not installed (a checkout, the tests). A job's stages import their clone's own."""
    here = str(Path(__file__).resolve().parents[1])
    old = os.environ.get("PYTHONPATH")
    parts = [p for p in (old or "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([here, *[p for p in parts if p != here]])
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def run_launcher_sweep(
    repo_root: Path,
    name: str,
    overrides: Sequence[str] = (),
    gpus: Sequence[str] = (),
    poll_s: float = 5.0,
    log: Callable[[str], Any] = print,
) -> int:
    """Run the DVC queue of ``repo_root`` as submitit jobs of launcher ``name`` (see the module doc).

    Returns 0 when every queued experiment landed on the git remote, 1 when one did not (it stays
    queued), 130 on Ctrl-C and 143 on SIGTERM (the jobs cancelled first). Raises ``KernelcampError``
    (nothing pushed or submitted yet) for an unknown launcher, a bad setting, a missing git or DVC
    remote, no reachable MLflow server, no sbatch (slurm), no GPU (local-gpu) or an empty queue.
    """
    if poll_s <= 0:
        raise KernelcampError(f"--poll {poll_s}: must be a positive number of seconds")
    if not (repo_root / ".dvc").is_dir():
        raise KernelcampError(f"{repo_root}: not a DVC repo (no .dvc/): run from the workspace or pass --repo")
    spec, params = load_settings(repo_root, name, overrides)
    check_launcher_tools(name)
    if name == "local-gpu":
        check_gpus(gpus)
    git_url = git_remote_url(repo_root, spec.git_remote)
    spec.dvc_remote = resolve_dvc_remote(repo_root, spec.dvc_remote)
    before = remote_refs(git_url)  # also: the remote answers
    uri = server_uri(params)
    experiments = queued_experiments(repo_root)
    if not experiments:
        raise KernelcampError(
            "nothing is queued: queue experiments first, e.g. dvc exp run --queue -S 'variant.num_warps=4,8'"
        )
    folder = (repo_root / spec.folder).resolve()
    clone_root = Path(spec.clone_dir).expanduser().resolve() if spec.clone_dir else folder / "clones"
    plans = plan_jobs(spec, experiments, git_url, uri, clone_root, gpus)
    executor = _executor(spec, folder, len(plans))

    # ship the queued commits (a forced push: a rerun queues a new commit under the same name)
    refspecs = [f"+{e.stash_rev}:{e.queue_ref}" for e in experiments]
    _git(repo_root, "push", "-q", git_url, *refspecs)
    log(
        f"sweep: {len(experiments)} queued experiment(s) as {len(plans)} {name} job(s); git remote {git_url}, "
        f"MLflow {url_shown(uri)}, DVC remote {spec.dvc_remote or '(none)'}; job logs in {folder}"
    )
    sig = contextlib.ExitStack()
    sig.enter_context(signals_raise((signal.SIGTERM,)))
    jobs: list[Any] = []
    interrupted = None
    t0 = time.monotonic()
    try:
        try:
            with _kernelcamp_on_path():  # the jobs inherit this environment when they are submitted
                if spec.name == "slurm":
                    jobs = executor.map_array(run_job, plans)
                else:
                    for plan in plans:
                        executor.update_parameters(
                            timeout_min=spec.timeout_min * len(plan.experiments),
                            gpus_per_node=1 if plan.gpu is not None else 0,
                            visible_gpus=(int(plan.gpu),) if plan.gpu is not None else (),
                        )
                        jobs.append(executor.submit(run_job, plan))
        except Exception as e:  # sbatch refused (a bad partition or gres, ...): undo, then one line
            for j in jobs:
                with contextlib.suppress(Exception):
                    j.cancel()
            with contextlib.suppress(KernelcampError):
                _git(repo_root, "push", "-q", git_url, *[f":{x.queue_ref}" for x in experiments])
            raise KernelcampError(f"submitting the {name} jobs failed: {' '.join(str(e).split())[:500]}") from e
        for job, plan in zip(jobs, plans, strict=True):
            log(f"sweep: job {job.job_id}: {', '.join(e.name for e in plan.experiments)}")
        shown = (len(jobs), t0)  # a progress line when the count changes, else once a minute
        while not all(j.done() for j in jobs):
            time.sleep(poll_s)
            running = sum(1 for j in jobs if not j.done())
            if running != shown[0] or time.monotonic() - shown[1] >= 60:
                log(f"sweep: {time.monotonic() - t0:6.0f} s, {running} of {len(jobs)} job(s) running")
                shown = (running, time.monotonic())
    except KeyboardInterrupt:
        interrupted = ("interrupted", 130)
    except Terminated:
        interrupted = ("terminated (SIGTERM)", 143)
    finally:
        if interrupted:
            log(f"sweep: {interrupted[0]}, cancelling the jobs")
            for j in jobs:
                with contextlib.suppress(Exception):
                    j.cancel()
            deadline = time.monotonic() + STOP_GRACE_S + 15
            while jobs and not all(j.done() for j in jobs) and time.monotonic() < deadline:
                time.sleep(0.5)
            if name != "slurm":  # a job killed before its own cleanup left its clone's servers running
                stopped = stop_clone_servers(clone_root)
                if stopped:
                    log(f"sweep: stopped {stopped} embedded server(s) the cancelled jobs left in {clone_root}")
        sig.close()
    return _finish_whole(repo_root, spec, git_url, experiments, plans, jobs, before, interrupted, t0, log)


def _finish_whole(*args: Any) -> int:
    """:func:`_finish` (what landed: queue entries removed, experiments pulled, the shipping refs deleted),
    run whole, a SIGTERM or SIGINT held until it ends (:func:`kernelcamp.signals.signals_deferred`): one
    inside it ended the sweep with no summary and refs left on the remote."""
    with signals_deferred():
        return _finish(*args)


def _finish(repo_root, spec, git_url, experiments, plans, jobs, before, interrupted, t0, log) -> int:
    after = remote_refs(git_url)
    landed = [e for e in experiments if e.exp_ref in after and after[e.exp_ref] != before.get(e.exp_ref)]
    missing = [e for e in experiments if e not in landed]
    dvc = [sys.executable, "-m", "dvc"]
    if landed:
        names = [e.name for e in landed]
        cache = ["-r", spec.dvc_remote] if spec.dvc_remote else ["--no-cache"]
        for cmd in (["queue", "remove", *names], ["exp", "pull", "-f", *cache, git_url, *names]):
            out = subprocess.run([*dvc, *cmd], cwd=repo_root, capture_output=True, text=True)
            if out.returncode != 0:
                log(f"sweep: warning: dvc {' '.join(cmd[:2])} failed: {' '.join(out.stderr.split())[:300]}")
    with contextlib.suppress(KernelcampError):
        _git(repo_root, "push", "-q", git_url, *[f":{e.queue_ref}" for e in experiments])
    job_of = {e.name: j for j, p in zip(jobs, plans, strict=False) for e in p.experiments}
    for e in missing:
        j = job_of.get(e.name)
        where = f"; log: {j.paths.stdout}" if j is not None else ""
        log(f"sweep: {e.name} did not land (still queued: the same command runs it again){where}")
    log(
        f"sweep: {len(landed)} of {len(experiments)} landed in {time.monotonic() - t0:.0f} s; "
        "`dvc exp show` lists them, the MLflow server has their runs"
    )
    if interrupted:
        return interrupted[1]
    return 1 if missing else 0

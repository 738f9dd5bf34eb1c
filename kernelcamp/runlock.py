"""One pipeline run at a time per working tree, and params.yaml unchanged for the whole run.

DVC refuses a second ``dvc exp run`` in a workspace only after the second one has rewritten
params.yaml (seen with DVC 3.67), so the first run's later stages would measure one variant and
record another. Each stage therefore claims the run before any side effect:

* The owner of a run is the ``dvc`` process the stage descends from (:func:`run_owner`); a stage run
  by hand (no ``dvc`` ancestor) owns nothing and only gets the hash checks of
  :meth:`kernelcamp.spec.RunSpec.check_record`.
* The claim (``<tree>/.kernelcamp/run.json``, under an ``fcntl`` lock) records the owner's pid, the
  sha256 of params.yaml and the params themselves (what a failed stage records: :func:`run_params`), the
  first stage and the stage now running. A stage of the same owner finds the same sha256 or stops, naming
  both; a stage of another live owner stops before any side effect; a dead owner's claim is taken over.
* The claim also records the sha256 of every git-tracked file of the run's other inputs (:data:`RUN_INPUTS`: conf/,
  dvc.yaml, kernels/, the stages and kernelcamp/; for a workspace ``dvc exp run`` as DVC composes params.yaml), and a
  stage that finds one of them changed stops, naming it: DVC saves the experiment with the working tree as it is at
  the end, so a conf/ file edited during a run was saved beside a params.yaml it did not compose, and the MLflow tag
  ``variant_overrides`` was computed against the edited file (helper-66, F4). The MLflow tags read from those files
  are kept too (:func:`run_tree_tags`), for the record of a stage that fails after such an edit.
* The claim lives in the stage's own tree, and a second claim in the folder of the server the run
  deploys (``kernelcamp.deploy.common.state_dir``: ``$DVC_ROOT/.kernelcamp``, or a sweep worker's
  ``slotN``). A queued experiment (its own temporary copy) started while a workspace run goes on shares
  that server: its deploy stopped the workspace run's server mid-benchmark. So a run whose server
  folder another live run holds waits for that run to end (one line saying so), then claims it; for a
  workspace run both claims are one file. Sweep workers, each with its own slot, never wait on
  each other.
* A refused second ``dvc exp run`` deletes the first one's ``refs/exps/exec/EXEC_BASELINE`` as it tears down,
  which the first one's commit needs: a new claim starts :mod:`kernelcamp.expref`'s keeper of that ref.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from kernelcamp.errors import AnotherRunError, KernelcampError
from kernelcamp.io import pid_start_time, proc_stat, same_process, sha256_text, write_json_atomic, write_text_atomic

#: The run's inputs besides params.yaml, relative to the tree (:func:`inputs_sha256`): what the experiment commit
#: saves beside the run's records and what the stages read (conf/ through the overrides tags and build's targets;
#: the code; dvc.yaml's stage list).
RUN_INPUTS = ("conf", "dvc.yaml", "kernels", "kernelcamp", "stages")


def _input_files(root: Path) -> list[str]:
    """The files of :data:`RUN_INPUTS` that git tracks in the tree ``root`` (what an experiment commit saves: DVC
    leaves untracked files out, so a new untracked file in conf/ changes no record; a git-ignored one, conf/local,
    neither), or, where ``root`` is no git tree, every file there but ``conf/local``, ``__pycache__``, hidden entries
    and ``*.pyc``."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        r = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "--", *RUN_INPUTS], capture_output=True, timeout=60, check=True
        )
        return sorted({f for f in r.stdout.decode(errors="surrogateescape").split("\0") if f})
    out: list[str] = []
    for top in RUN_INPUTS:
        for dirpath, dirnames, filenames in os.walk(root / top) if (root / top).is_dir() else [(root, [], [top])]:
            rel = Path(dirpath).relative_to(root)
            dirnames[:] = [
                d
                for d in dirnames
                if d != "__pycache__" and not d.startswith(".") and (rel / d).as_posix() != "conf/local"
            ]
            out += [(rel / f).as_posix() for f in filenames if not f.startswith(".") and not f.endswith(".pyc")]
    return sorted(out)


def inputs_sha256(root: Path) -> dict[str, str]:
    """``{path: sha256}`` of the run's input files in the tree ``root`` (:func:`_input_files`; paths relative to it,
    POSIX); ``{}`` for a tree without them. A file that cannot be read (removed from the working tree) is left out,
    so it shows as changed."""
    import hashlib

    out: dict[str, str] = {}
    for f in _input_files(root):
        with contextlib.suppress(OSError):
            out[f] = hashlib.sha256((root / f).read_bytes()).hexdigest()
    return out


def _check_inputs(claim: dict[str, Any], root: Path, stage: str, when: str, since: str | None = None) -> None:
    """Raise ``KernelcampError`` naming the files of the run's inputs (:func:`inputs_sha256`) that differ from those
    the run claimed the tree with (``claim["inputs"]``; a claim without them, from an older run, checks nothing).
    ``when``: "during this run" or "while the <stage> stage ran"; ``since``: when they were taken (default: since the
    claim's first stage), for the message."""
    was = claim.get("inputs")
    if not isinstance(was, dict):
        return
    now = inputs_sha256(root)
    changed = sorted(k for k in was.keys() | now.keys() if was.get(k) != now.get(k))
    if changed:
        shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
        since = since or f"since stage {claim.get('stage')}"
        raise KernelcampError(
            f"{shown} changed {when} ({since}): DVC would lock this run's outputs, and "
            f"`dvc exp run` save its experiment, beside a file that did not make them, so the {stage} stage fails "
            "and writes none of its outputs; leave conf/, kernels/ and the code as they are while a run goes on, and "
            "rerun the pipeline once the edit is made (it runs the tree as it is then)"
        )


def _ppid_and_cmd(pid: int) -> tuple[int | None, list[str]]:
    try:
        ppid = int((proc_stat(pid) or [])[1])
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except (OSError, ValueError, IndexError):
        return None, []
    return ppid, cmd


def _owner_alive(claim: dict[str, Any]) -> bool:
    return same_process(claim.get("owner_pid"), claim.get("owner_start"))


def _is_dvc(cmd: list[str]) -> bool:
    head = cmd[:3]
    return any(os.path.basename(a) == "dvc" for a in head) or (len(cmd) > 2 and cmd[1:3] == ["-m", "dvc"])


def run_owner(pid: int | None = None) -> int | None:
    """pid of the nearest ancestor of ``pid`` (default: this process) that is a ``dvc`` command, or
    None (not under DVC, or no ``/proc``)."""
    cur = os.getppid() if pid is None else pid
    for _ in range(64):
        if not cur or cur == 1:
            return None
        ppid, cmd = _ppid_and_cmd(cur)
        if _is_dvc(cmd):
            return cur
        if ppid is None:
            return None
        cur = ppid
    return None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(str(path) + ".lock", "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def claim_path(root: Path) -> Path:
    return root / ".kernelcamp" / "run.json"


def _read_claim(path: Path) -> dict[str, Any] | None:
    """The claim at ``path``, or None (no file, or not a JSON object)."""
    try:
        cur = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return cur if isinstance(cur, dict) else None


def server_claim_path() -> Path:
    """The claim of the server folder this run deploys to (``state_dir()/run.json``; see the module docstring)."""
    from kernelcamp.deploy.common import state_dir

    return state_dir() / "run.json"


def _claim_paths(root: Path) -> list[Path]:
    """The tree's claim, then the server folder's when it is another file."""
    paths = [claim_path(root)]
    server = server_claim_path()
    if server.resolve() != paths[0].resolve():
        paths.append(server)
    return paths


def claim_run(
    root: Path,
    stage: str,
    params_sha256: str,
    owner: int | None = None,
    poll_s: float = 2.0,
    params: dict[str, Any] | None = None,
    params_text: str | None = None,
    tree_tags: Callable[[], dict[str, Any]] | None = None,
) -> dict[str, Any] | None:
    """Claim (or re-check) the run of the tree ``root`` for stage ``stage``, and the server folder it
    deploys to; see the module docstring. ``params``: the params.yaml mapping whose sha256 is
    ``params_sha256``, kept in a new claim (:func:`run_params`); ``params_text``: that file's text, kept too (what
    :func:`refuse_if_another_run` puts back); ``tree_tags``: called once for a new claim, its MLflow tags kept too
    (:func:`run_tree_tags`).

    Returns the tree's claim, or None when there is no ``dvc`` owner. Raises ``KernelcampError`` when
    another live ``dvc`` run holds the tree, or when params.yaml changed since an earlier stage of
    this run read it. Waits (polling every ``poll_s`` seconds) while another live run holds the server
    folder.
    """
    owner = run_owner() if owner is None else owner
    if owner is None:
        return None
    got = None
    for i, path in enumerate(_claim_paths(root)):
        said = False
        while (claim := _claim(path, root, stage, params_sha256, owner, i > 0, params, params_text, tree_tags)) is None:
            if not said:
                print(
                    f"[{stage}] waiting: another pipeline run uses this workspace's server ({path.parent}); this "
                    "run starts when it ends",
                    file=sys.stderr,
                    flush=True,
                )
                said = True
            time.sleep(poll_s)
        got = got or claim
    return got


def _claim(
    path: Path,
    root: Path,
    stage: str,
    params_sha256: str,
    owner: int,
    shared: bool = False,
    params: dict[str, Any] | None = None,
    params_text: str | None = None,
    tree_tags: Callable[[], dict[str, Any]] | None = None,
) -> dict[str, Any] | None:
    """Claim ``path`` for ``owner``. Another live owner's claim raises ``KernelcampError`` when it is a run
    of the same tree; a run of another tree (a queued experiment's copy) holding this server folder, also
    where it is the workspace's own claim file, makes it return None (the caller waits)."""
    with _locked(path):
        cur = _read_claim(path)
        composed = None  # the inputs as DVC composed params.yaml (a workspace run's claim from its start)
        if cur is not None and cur.get("provisional"):
            if cur.get("owner_pid") == owner:
                if not shared and cur.get("phase") == "starting" and isinstance(cur.get("inputs"), dict):
                    composed = cur["inputs"]
                cur = None  # this owner's claim from its start (claim_workspace_run) or its last run's end: made whole
            elif shared and cur.get("phase") == "saving":
                cur = None  # a workspace run that only saves its experiment no longer uses its server
        if cur is not None and _owner_alive(cur):
            if cur["owner_pid"] != owner:
                if shared or not _of_tree(cur, root):
                    return None  # the caller waits
                raise AnotherRunError(_held(cur, root))
            if cur.get("at_stage") != stage:  # the stage now running, for the messages of other commands
                cur["at_stage"] = stage
                write_json_atomic(path, cur)
            if shared:
                return cur  # this run's own: the tree's claim checks its params
            if cur.get("params_sha256") != params_sha256:
                raise KernelcampError(
                    f"params.yaml changed during this run (sha256 {str(cur.get('params_sha256'))[:12]} at stage "
                    f"{cur.get('stage')}, {params_sha256[:12]} now): something rewrote it while the run went on "
                    "(another `dvc exp run`, a `make params` or an edit); nothing of this stage was recorded, rerun "
                    "the pipeline"
                )
            _check_inputs(cur, root, stage, "during this run")
            return cur
        if composed is not None:  # edited between DVC's compose and this first stage: params.yaml is of the old files
            _check_inputs(
                {"inputs": composed}, root, stage, "during this run", "since `dvc exp run` composed params.yaml"
            )
        claim = {
            "owner_pid": owner,
            "owner_start": pid_start_time(owner),
            "params_sha256": params_sha256,
            "stage": stage,
            "at_stage": stage,
            "tree": str(root),
            # what a failed stage of this run records (run_params): the params it ran with, not a params.yaml that
            # another `dvc exp run` rewrote under it
            "params": params,
            "params_text": params_text,
            # the run's other inputs (conf/, the code), which a later stage finds unchanged or stops (_check_inputs),
            # and the MLflow tags read from them (the kernel's hash, the conf/ overrides), which a failed stage
            # records: the tree's claim only (a server folder's claim is never checked or read for them)
            "inputs": None if shared else composed if composed is not None else inputs_sha256(root),
            "tree_tags": tree_tags() if tree_tags is not None and not shared else None,
            "claimed_at_ms": int(time.time() * 1000),  # the run's start, for the MLflow run's duration
        }
        write_json_atomic(path, claim)
        if not shared:  # the tree's claim: a workspace experiment's baseline ref kept against a refused second run
            from kernelcamp.expref import start_keeper

            start_keeper(root, owner, params_text)
        return claim


def _of_tree(claim: dict[str, Any], root: Path) -> bool:
    """Whether ``claim`` is a run of the tree ``root`` (a claim without its tree, from an older run, counts as one),
    not one of another tree (a queued experiment's copy) that holds the same server folder."""
    return claim.get("tree") in (None, str(root))


def _held(cur: dict[str, Any], root: Path, put_back: bool = False) -> str:
    """The refusal of a second run of the tree ``root`` while the run of the claim ``cur`` goes on."""
    line = (
        f"another pipeline run (dvc pid {cur['owner_pid']}, {_stages(cur)}) is running in {root}: wait for it, or "
        "queue this one with `dvc exp run --queue`"
    )
    if put_back:
        line += (
            "; params.yaml, which this command rewrote before it was refused, is put back as that run's, so it goes on"
        )
    return line


def refuse_if_another_run(root: Path, params_path: str | os.PathLike, owner: int | None = None) -> None:
    """Before a stage reads params.yaml: raise ``KernelcampError`` when another live ``dvc`` run holds the tree
    ``root``, and first put back ``params_path`` as that run composed it (the claim's ``params_text``) where it
    differs. A second ``dvc exp run`` rewrites params.yaml before its first stage can refuse it; the first run's
    next stage then stopped on the changed file, so both runs were lost and params.yaml was left the refused one's
    (helper-59). A stage run by hand (no owner), no live claim, this owner's own claim, another tree's claim (the
    caller waits for it in :func:`claim_run`) and a claim without the text (an older run) leave the file as it is."""
    owner = run_owner() if owner is None else owner
    if owner is None:
        return
    path = claim_path(root)
    with _locked(path):
        cur = _read_claim(path)
        if cur is None or not _owner_alive(cur) or cur["owner_pid"] == owner or not _of_tree(cur, root):
            return
        text, put_back = cur.get("params_text"), False
        if isinstance(text, str) and sha256_text(text) == cur.get("params_sha256"):
            try:
                now = Path(params_path).read_text()
            except OSError:
                now = None
            if now != text:
                write_text_atomic(params_path, text)
                put_back = True
        raise AnotherRunError(_held(cur, root, put_back))


def claim_workspace_run(root: Path, pid: int) -> None:
    """Claim the tree ``root`` for the workspace ``dvc exp run`` of the process ``pid`` from its start, or raise
    :class:`kernelcamp.errors.AnotherRunError` when another live ``dvc`` run holds it: what
    ``hydra_plugins/kernelcamp_guard`` calls from inside every workspace ``dvc exp run`` as DVC composes its
    params.yaml, before DVC's setup of the run changes the working tree. The claim is provisional (no params, no
    stage, no keeper): the run's first stage makes it whole (:func:`claim_run`), and it lapses with the process.
    Before it, a second run started in the seconds between a first run's start and its first stage's claim passed
    this check; DVC's lock then refused it at the spec stage, its teardown deleted the first run's
    ``EXEC_BASELINE`` before the first run's keeper had read it, and the first run ran every stage, then saved no
    experiment ("'NoneType' object is not subscriptable", helper-66). params.yaml is not touched (DVC has not
    rewritten it yet)."""
    path = claim_path(root)
    with _locked(path):
        cur = _read_claim(path)
        if cur is not None and _owner_alive(cur) and cur.get("owner_pid") != pid and _of_tree(cur, root):
            raise AnotherRunError(_held(cur, root))
        if cur is None or not _owner_alive(cur):
            claim = _provisional(pid, pid_start_time(pid), str(root), int(time.time() * 1000), "starting")
            # the run's inputs as DVC composes params.yaml from them: its first stage stops on a file edited since
            # (the first stage took them only 7-10 s into the run, after opening MLflow; an edit 2 s into the spec
            # stage was saved beside a params.yaml composed from the file before it: helper-68)
            write_json_atomic(path, {**claim, "inputs": inputs_sha256(root)})


def _provisional(owner: int, owner_start: Any, tree: str, claimed_at_ms: Any, phase: str) -> dict[str, Any]:
    """A provisional claim of the tree ``tree`` by the ``dvc`` process ``owner``: ``phase`` "starting" (from the
    run's start to its first stage, :func:`claim_workspace_run`) or "saving" (from its last stage to its end,
    :func:`release_run`); no params, no stage (:func:`_stages` names the phase)."""
    return {
        "owner_pid": owner,
        "owner_start": owner_start,
        "provisional": True,
        "phase": phase,
        "params_sha256": None,
        "stage": None,
        "at_stage": None,
        "tree": tree,
        "claimed_at_ms": claimed_at_ms,
    }


def _stages(claim: dict[str, Any]) -> str:
    """``since stage spec, now at verify`` (``at stage spec`` while it is the first; ``starting`` before it)."""
    if claim.get("provisional"):
        if claim.get("phase") == "saving":
            return "saving its experiment, after its last stage"
        return "starting, before its first stage"
    first, now = claim.get("stage"), claim.get("at_stage") or claim.get("stage")
    return f"at stage {first}" if now == first else f"since stage {first}, now at {now}"


def _own_claim(root: Path, owner: int | None) -> dict[str, Any] | None:
    """The tree ``root``'s live claim when ``owner`` (default: this process's ``dvc`` owner) holds it, else None
    (no owner: a stage run by hand; no live claim; another owner's)."""
    owner = run_owner() if owner is None else owner
    if owner is None:
        return None
    cur = live_claim(claim_path(root))
    return cur if cur is not None and cur.get("owner_pid") == owner and not cur.get("provisional") else None


def run_params(root: Path, owner: int | None = None) -> dict[str, Any] | None:
    """The params this owner's run of the tree ``root`` claimed it with (its first stage's params.yaml), or None
    (no live claim of this owner, e.g. a stage run by hand, or a claim without them)."""
    cur = _own_claim(root, owner)
    return cur["params"] if cur is not None and isinstance(cur.get("params"), dict) else None


def run_tree_tags(root: Path, params: Mapping[str, Any], owner: int | None = None) -> dict[str, Any] | None:
    """The MLflow tags that read the tree's files (:func:`kernelcamp.conftags.tree_tags`) as this owner's run of the
    tree ``root`` kept them at its first stage, when ``params`` are the params that run claimed the tree with; else
    None (no live claim of this owner, other params, or a claim without them)."""
    cur = _own_claim(root, owner)
    if cur is None or cur.get("params") != dict(params) or not isinstance(cur.get("tree_tags"), dict):
        return None
    return cur["tree_tags"]


def check_params_unchanged(root: Path, stage: str, params_path: str | os.PathLike, owner: int | None = None) -> None:
    """At the end of stage ``stage``: raise ``KernelcampError`` when ``params_path`` (params.yaml) no longer has the
    sha256 this owner's run of the tree ``root`` claimed it with, or a file of the run's other inputs changed
    (:func:`inputs_sha256`; helper-66's F4). DVC locks a stage's outputs with the params it
    reads after the stage ends: a benchmark that finished after a refused second `dvc exp run` had rewritten
    params.yaml was locked with that run's num_warps beside a benchmark.json of its own (helper-54). A stage
    run by hand (no owner), or no live claim of this owner (the report stage released it), checks nothing."""
    from kernelcamp.io import read_params, sha256_text

    cur = _own_claim(root, owner)
    if cur is None:
        return
    now = sha256_text(read_params(params_path)[0])
    if now != cur.get("params_sha256"):
        raise KernelcampError(
            f"params.yaml changed while the {stage} stage ran (sha256 {str(cur.get('params_sha256'))[:12]} when this "
            f"run started, {now[:12]} now): something rewrote it (another `dvc exp run`, a `make params` or an edit), "
            "and DVC would lock this stage's outputs with params they were not made with; the stage fails instead, "
            "rerun the pipeline"
        )
    _check_inputs(cur, root, stage, f"while the {stage} stage ran")


def release_run(root: Path, owner: int | None = None) -> None:
    """End this owner's run (the last stage calls it): the server folder's claim is removed, and the tree's becomes
    a provisional one ("saving its experiment") that lapses with the owner's ``dvc`` process, so that the tree stays
    held while DVC locks the last stage's outputs and saves the experiment. When the release removed the tree's
    claim too, a second ``dvc exp run`` started in those seconds passed the guard, and its setup deleted the
    first run's dvc.lock and reports before the first was saved: saved without its report and metrics, with an
    earlier experiment's checksums in its dvc.lock (helper-66). Another owner's claim is left alone."""
    owner = run_owner() if owner is None else owner
    if owner is None:
        return
    tree = claim_path(root)
    for path in _claim_paths(root):
        with _locked(path):
            cur = _read_claim(path)
            if cur is None or cur.get("owner_pid") != owner:
                continue
            if path == tree:
                write_json_atomic(
                    path,
                    _provisional(owner, cur.get("owner_start"), cur.get("tree"), cur.get("claimed_at_ms"), "saving"),
                )
            else:
                path.unlink(missing_ok=True)


def live_claim(path: Path) -> dict[str, Any] | None:
    """The claim at ``path`` when its ``dvc`` owner is still running, else None (no claim, or a dead owner's)."""
    cur = _read_claim(path)
    return cur if cur is not None and _owner_alive(cur) else None


def refuse_during_run(root: Path, action: str, server: bool = False, override: str = "") -> None:
    """Raise ``KernelcampError`` when a live pipeline run holds the tree ``root`` (or, ``server=True``, the server
    folder it deploys to): ``action`` would change what that run measures or records (rewrite its params.yaml,
    stop its server). ``override``: the flag that does it anyway, named in the message. A stage of the run itself
    (the same ``dvc`` owner) is not refused."""
    paths = _claim_paths(root) if server else [claim_path(root)]
    mine = run_owner()
    for path in paths:
        cur = live_claim(path)
        # the tree's claim file is also the workspace server folder's: a queued experiment (its own copy of the
        # tree) holds it while it deploys there, but reads its own copy's params.yaml, not this tree's
        if cur is not None and cur.get("owner_pid") != mine and (server or _of_tree(cur, root)):
            raise KernelcampError(
                f"{action}: a pipeline run (dvc pid {cur['owner_pid']}, {_stages(cur)}, in "
                f"{cur.get('tree')}) is using this workspace{' and its server' if server else ''}; wait for it to "
                f"end{f', or pass {override} to do it anyway' if override else ''}"
            )


def run_started_ms(root: Path, owner: int | None = None) -> int | None:
    """When this owner's run claimed the tree (ms since the epoch), or None (no claim of this owner:
    a stage run by hand)."""
    owner = run_owner() if owner is None else owner
    if owner is None:
        return None
    cur = _read_claim(claim_path(root))
    return cur.get("claimed_at_ms") if cur is not None and cur.get("owner_pid") == owner else None

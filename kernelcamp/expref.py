"""Keep a workspace ``dvc exp run``'s baseline ref and params.yaml through a refused second run.

DVC (seen with 3.67) sets ``refs/exps/exec/EXEC_BASELINE`` (with ``EXEC_HEAD`` and ``EXEC_MERGE``) when a
``dvc exp run`` in the workspace starts, and deletes it in the run's teardown, also when that run failed. A
second ``dvc exp run`` started during a first one sets those refs again and, once it is refused (by
:func:`kernelcamp.runlock.refuse_if_another_run`, or by DVC's own lock on a stage output that the first run's
running stage reads), deletes them. The first run then ran every stage and logged its MLflow run, but its
commit reads ``EXEC_BASELINE`` (``dvc/repo/experiments/executor/base.py``, ``commit``) and fails with
"'NoneType' object is not subscriptable": no experiment is saved, and the MLflow run names one that does not
exist (helper-61).

The second run has also applied its stash before it is refused, which rewrites params.yaml; DVC's own lock
refuses it without any kernelcamp code running, so nothing put the file back, and the running stage stopped on
the changed file (helper-64).

So the first stage of a workspace experiment starts a keeper (:func:`start_keeper`), a detached process that
lives as long as the run's ``dvc`` process. It puts the ref back at the commit it had when the run claimed the
tree, whenever it is gone while a stage of the run is running, and params.yaml back as the run claimed it once a
second run has been seen (:func:`keep`). The run's own teardown comes after its last stage
and after its commit, which sets ``EXEC_BRANCH``: the keeper never restores the ref once ``EXEC_BRANCH`` was seen
or while no stage runs. A second run in the seconds between the first run's last stage and its commit is refused by
``hydra_plugins/kernelcamp_guard`` before its setup (the claim stays, "saving", until the first run's ``dvc`` process
ends: :func:`kernelcamp.runlock.release_run`).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from kernelcamp.io import pid_start_time, proc_stat, same_process, write_text_atomic

EXEC_BASELINE = "refs/exps/exec/EXEC_BASELINE"
EXEC_BRANCH = "refs/exps/exec/EXEC_BRANCH"
EXEC_MERGE = "refs/exps/exec/EXEC_MERGE"


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=False)


def exec_baseline(root: Path) -> str | None:
    """The commit ``refs/exps/exec/EXEC_BASELINE`` of the git repo at ``root`` names (40 hex digits), or None: no
    such ref (not a ``dvc exp run``, or not a git repo), or no ``git``."""
    try:
        r = _git(root, "rev-parse", "-q", "--verify", EXEC_BASELINE + "^{commit}")
    except OSError:
        return None
    out = r.stdout.strip()
    return out if r.returncode == 0 and len(out) == 40 else None


def _ref_present(git_dir: Path, ref: str) -> bool:
    """Whether ``ref`` exists in the repo whose common git folder is ``git_dir``, without a ``git`` process (the
    keeper asks ten times a second, beside a benchmark): a loose ref (what DVC writes; a symbolic ref is one too) or
    a line of ``packed-refs``."""
    if (git_dir / ref).exists():
        return True
    try:
        packed = (git_dir / "packed-refs").read_text()
    except OSError:
        return False
    return any(line.endswith(" " + ref) for line in packed.splitlines())


def _has_child(pid: int) -> bool:
    """Whether the process ``pid`` has a live child (a stage's command under the ``dvc`` process)."""
    for entry in os.scandir("/proc"):
        fields = proc_stat(entry.name) if entry.name.isdigit() else None
        if fields and len(fields) > 1 and fields[1] == str(pid) and fields[0] != "Z":
            return True
    return False


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def keep(
    root: Path, rev: str, owner: int, owner_start: int | None, params_text: str | None = None, poll_s: float = 0.1
) -> int:
    """Keep what a refused second ``dvc exp run`` takes from the run of the ``dvc`` process ``owner`` (started at
    ``owner_start``, :func:`kernelcamp.io.pid_start_time`) in the tree ``root``, until that run commits (``EXEC_BRANCH``
    seen) or ends, or the repo is gone; returns 0 then.

    * ``refs/exps/exec/EXEC_BASELINE``: put back at ``rev`` whenever it is gone while the run runs a stage.
    * ``params.yaml``: put back as ``params_text`` (the run's claim's text, :mod:`kernelcamp.runlock`; None: never)
      whenever it differs, once a second ``dvc exp run`` has been seen (``EXEC_MERGE`` changed: DVC sets it to the
      second run's stash and applies that stash, which rewrites params.yaml, before the second run is refused; or
      ``EXEC_BASELINE`` gone). DVC's own lock refuses the second run without any kernelcamp code running, and
      kernelcamp's refusal comes only once the second run's first stage has started (20 s on a loaded 2-core
      machine): either way the running stage found params.yaml changed and the first run was lost (helper-64). An
      edit by hand is left alone.

    Polls every ``poll_s`` seconds (a few ``stat`` and small reads; ``/proc`` is read only while the ref is gone)."""
    r = _git(root, "rev-parse", "--git-common-dir")  # where refs/ is, also for a linked worktree
    if r.returncode != 0:
        return 0
    git_dir = Path(r.stdout.strip())
    git_dir = git_dir if git_dir.is_absolute() else root / git_dir
    params_path = root / "params.yaml"
    merge0 = _read(git_dir / EXEC_MERGE)
    second_seen = False
    while same_process(owner, owner_start) and git_dir.is_dir():  # a queued run's copy is deleted at its end
        if _ref_present(git_dir, EXEC_BRANCH):
            return 0  # committed: what goes next is the run's own teardown
        baseline_gone = not _ref_present(git_dir, EXEC_BASELINE)
        merge = _read(git_dir / EXEC_MERGE)
        second_seen = second_seen or baseline_gone or (merge is not None and merge != merge0)
        if second_seen and params_text is not None and _read(params_path) not in (None, params_text):
            write_text_atomic(params_path, params_text)
            print(f"put params.yaml back as dvc pid {owner}'s run has it", file=sys.stderr, flush=True)
        if baseline_gone and _has_child(owner):
            # created only where absent (old value: none), so a ref DVC set meanwhile is left as it is
            _git(root, "update-ref", EXEC_BASELINE, rev, "0" * 40)
            print(f"kept {EXEC_BASELINE} at {rev[:12]} for dvc pid {owner}", file=sys.stderr, flush=True)
        time.sleep(poll_s)
    return 0


def start_keeper(root: Path, owner: int, params_text: str | None) -> int | None:
    """Start :func:`keep` for the workspace experiment of the ``dvc`` process ``owner`` in the tree ``root``, as a
    detached process (its own session, no inherited output, so DVC does not wait for it); ``params_text`` (the
    params.yaml text the run claimed the tree with) goes to it on its stdin, so the keeper needs no reader of
    :mod:`kernelcamp.runlock`'s claim (runlock starts it: importing runlock here is an import cycle). Returns its
    pid, or None where there is nothing to keep (no ``EXEC_BASELINE``: ``dvc repro``, or not a git repo)."""
    rev = exec_baseline(root)
    if rev is None:
        return None
    cmd = [sys.executable, "-m", "kernelcamp.expref", str(root), rev, str(owner), str(pid_start_time(owner) or "")]
    if params_text is not None:
        cmd.append("--params-stdin")
    p = subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE if params_text is not None else subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )
    if p.stdin is not None:
        try:
            p.stdin.write(params_text.encode())
            p.stdin.close()
        except OSError:  # the keeper ended at once (e.g. its owner is gone): nothing to keep
            pass
    return p.pid


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m kernelcamp.expref",
        description="Keep a workspace `dvc exp run`'s refs/exps/exec/EXEC_BASELINE and params.yaml through a "
        "refused second run (started by the run's first stage; see the module docstring).",
    )
    ap.add_argument("root", type=Path, help="the git work tree")
    ap.add_argument("rev", help="the commit EXEC_BASELINE named when the run claimed the tree")
    ap.add_argument("owner", type=int, help="pid of the run's dvc process")
    ap.add_argument("owner_start", nargs="?", default="", help="that process's start time (kernelcamp.io)")
    ap.add_argument(
        "--params-stdin",
        action="store_true",
        help="read the params.yaml text the run claimed the tree with from stdin (else params.yaml is never put back)",
    )
    a = ap.parse_args(argv)
    params_text = sys.stdin.read() if a.params_stdin else None
    return keep(a.root, a.rev, a.owner, int(a.owner_start) if a.owner_start else None, params_text)


if __name__ == "__main__":
    sys.exit(main())

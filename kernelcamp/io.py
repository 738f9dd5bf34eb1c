"""Atomic outputs, params.yaml access and the stage entry-point wrapper.

DVC does not clean up after a stage killed midway (DESIGN.md, reliability contract), so every
output goes to a temporary file in the same folder and is renamed into place; a crash leaves
either the old file or the new one, never half of one.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from kernelcamp.errors import KernelcampError, out_of_memory


def _umask() -> int:
    """The process umask, read without changing it where Linux allows (os.umask sets it)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only if the block succeeds.

    Raises whatever the block raises, after removing the temporary file; ``KernelcampError`` (before
    anything is written) when ``path`` is a folder, a device, a FIFO or a socket: the rename would replace
    it with a regular file (``kernelcamp compose -o /dev/null`` replaced the machine's /dev/null). A
    symbolic link is replaced, not written through (DVC's cache links must never be written into).
    """
    path = Path(path)
    if path.exists() and not path.is_symlink() and not path.is_file():
        kind = "a folder" if path.is_dir() else "not a regular file (a device, FIFO or socket)"
        raise KernelcampError(f"cannot write {path}: it is {kind}; give a file path")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        # mkstemp creates 0600; give the file the mode an ordinary open() would (0666 less umask).
        os.chmod(tmp_path, 0o666 & ~_umask())
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def repo_relative(path: str | os.PathLike, root: str | os.PathLike) -> str:
    """``path`` as a record keeps it: relative to ``root`` (posix, e.g. ``.kernelcamp/slot0/server.log``)
    when it lies under ``root``, else as given (a remote host's path), so that no path of this machine
    is committed with a run's records."""
    p, r = Path(path), Path(root)
    return (p.relative_to(r) if p.is_absolute() and p.is_relative_to(r) else p).as_posix()


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically. Non-finite floats become null."""
    write_text_atomic(path, json.dumps(_finite(obj), indent=2, sort_keys=False, default=str) + "\n")


def write_csv_atomic(path: str | os.PathLike, rows: Iterable[Mapping[str, Any]]) -> None:
    """Write a tidy table (one dict per row; the union of keys is the header) atomically."""
    rows = list(rows)
    header: list[str] = []
    for r in rows:
        header.extend(k for k in r if k not in header)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=header, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    write_text_atomic(path, buf.getvalue())


def _finite(obj: Any) -> Any:
    if isinstance(obj, float) and (obj != obj or obj in (float("inf"), float("-inf"))):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def read_json(path: str | os.PathLike, what: str) -> Any:
    """Read a JSON input of a stage; a missing or broken file is a ``KernelcampError`` naming ``what``."""
    path = Path(path)
    if not path.exists():
        raise KernelcampError(f"{what} not found at {path}: run the stage that writes it first (dvc repro)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise KernelcampError(f"{what} at {path} is not valid JSON ({e}): rerun the stage that writes it") from e


def check_records_as_written(paths: Iterable[str | os.PathLike], lock: str | os.PathLike = "dvc.lock") -> None:
    """Under DVC, each of ``paths`` that ``lock`` lists as an output of a stage must hold the bytes that stage wrote
    (the lock's md5, which DVC records as each stage ends): a record edited after its stage ran, then read by
    ``dvc repro -s <later stage>``, had its numbers published as measured (helper-59 set benchmark.json's ratio to
    0.5; the report, metrics.json and a FINISHED MLflow run said 0.5). A full ``dvc repro`` runs a stage whose
    outputs changed again, so only a single-stage run met such a file.

    DVC runs a stage's command in the stage's folder with ``DVC_STAGE`` set (``dvc.env``); ``lock`` is read there
    (a queued experiment's own copy: its ``DVC_ROOT`` names the workspace). Outside DVC (a stage run by hand), with
    no lock, and for a path the lock does not list (or lists as a folder) nothing is checked.

    Raises ``KernelcampError`` naming the file, the stage that wrote it and the command that writes it again."""
    if not os.environ.get("DVC_STAGE") or not Path(lock).is_file():
        return
    try:
        stages = (yaml.safe_load(Path(lock).read_text()) or {}).get("stages") or {}
    except (OSError, yaml.YAMLError):
        return  # DVC itself refuses a broken lock before it runs a stage
    written = {
        os.path.normpath(o["path"]): (name, o.get("md5"))
        for name, entry in stages.items()
        if isinstance(entry, dict)
        for o in entry.get("outs") or ()
        if isinstance(o, dict) and "path" in o
    }
    for p in paths:
        rel = os.path.normpath(os.path.relpath(p))
        stage, md5 = written.get(rel, (None, None))
        if not md5 or md5.endswith(".dir") or not Path(p).is_file():
            continue
        now = hashlib.md5(Path(p).read_bytes()).hexdigest()
        if now != md5:
            raise KernelcampError(
                f"{rel} is not what the {stage} stage wrote (md5 {now[:12]}, dvc.lock's {md5[:12]}): a record changed "
                f"after its stage ran is not used; run `dvc repro -f -s {stage}` to write it again, then this stage"
            )


def sha256_text(text: str) -> str:
    """Hex sha256 of ``text``'s UTF-8 bytes: params.yaml's hash, the run spec's and the run claim's."""
    return hashlib.sha256(text.encode()).hexdigest()


def read_params(path: str | os.PathLike = "params.yaml") -> tuple[str, Any]:
    """``(text, parsed YAML)`` of a params file. Raises ``KernelcampError`` (one line) when it is missing,
    not a file, unreadable, not UTF-8 or not YAML; the parsed value may be anything (callers check)."""
    path = Path(path)
    if not path.exists():
        raise KernelcampError(f"{path} not found: run `dvc exp run` (it composes conf/) or `make params`")
    if not path.is_file():
        raise KernelcampError(f"{path} is not a file: give the params.yaml that `dvc exp run` writes")
    try:
        text = path.read_text(encoding="utf-8")
        return text, yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        first = " ".join(str(e).split())[:200]
        raise KernelcampError(f"{path} is not readable YAML ({first}): regenerate it with `make params`") from None


def load_params(path: str | os.PathLike = "params.yaml") -> dict[str, Any]:
    """Load params.yaml (written by DVC's Hydra composition; never composed here).

    Raises ``KernelcampError`` when the file is missing, not a file, not readable YAML (:func:`read_params`)
    or not a mapping.
    """
    _, data = read_params(path)
    if not isinstance(data, dict):
        raise KernelcampError(f"{path} is not a mapping: regenerate it with `make params`")
    return data


def section(params: Mapping[str, Any], name: str) -> Any:
    """Return ``params[name]``; a missing section is a ``KernelcampError`` naming the conf group."""
    if name not in params:
        raise KernelcampError(f"params.yaml has no `{name}` section: check conf/config.yaml's defaults list")
    return params[name]


def proc_stat(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (``[state, ppid, pgrp, ...]``: field 3 of proc(5)
    is index 0), or None when the process is gone or the file unreadable. The name is cut at its last ``)``, since
    it may hold spaces and parentheses itself."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    head, sep, tail = text.rpartition(")")
    return tail.split() if sep else None


def pid_alive(pid: int | None) -> bool:
    """Whether process ``pid`` exists and is not a zombie (a zombie is dead for our purposes).

    A process of another user counts as alive (``kill(pid, 0)`` answers EPERM).
    """
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = proc_stat(pid)
    return not fields or fields[0] != "Z"


def pid_start_time(pid: int | None) -> int | None:
    """Process ``pid``'s start time (clock ticks after boot, ``/proc/<pid>/stat`` field 22), or None when
    it is gone or unreadable. With the pid it names one process: a pid the kernel reused after the
    recorded process died has another start time (proc(5))."""
    if not pid:
        return None
    fields = proc_stat(pid)
    try:
        return int(fields[19]) if fields else None
    except (ValueError, IndexError):
        return None


def same_process(pid: int | None, start_time: int | None) -> bool:
    """Whether the process a state file or record names (``pid`` and the :func:`pid_start_time` taken
    when it was started) is still that process: alive, and not a later process given the same pid.
    ``start_time`` None (a record written before start times were kept) checks only that it is alive;
    an unreadable start time counts as another process."""
    if not pid_alive(pid):
        return False
    return start_time is None or pid_start_time(pid) == start_time


def stage_main(fn: Callable[[], int | None]) -> None:
    """Run a stage's ``main``: a ``KernelcampError`` becomes one ``error:`` line and exit status 2, and so does an
    allocation the machine could not make (:func:`kernelcamp.errors.out_of_memory`).

    The stage dies with its parent (:func:`kernelcamp.signals.die_with_parent`)."""
    from kernelcamp.signals import Terminated, die_with_parent, signals_raise

    # Python's own handlers again after the block, in place of the one that ended a stage interrupted while it
    # imported (stages/), and for the block SIGTERM/SIGINT raise Terminated: with Python's defaults until the stage's
    # tracked_stage took over (about 10 ms), a SIGTERM ended the stage with no line and a SIGINT that landed in a
    # finalizer was dropped, and the stage exited 0 (helper-57). Both held until signals_raise is in force: in the
    # microseconds between the two, a signal met Python's defaults again (helper-58)
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        for s, default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL)):
            if getattr(signal.getsignal(s), "kernelcamp_stage_start", False):
                signal.signal(s, default)
        die_with_parent()
        with signals_raise():
            signal.pthread_sigmask(signal.SIG_SETMASK, held)  # a signal held above is raised here
            rc = fn()
    except Terminated as e:  # outside the stage's tracked_stage (which ends such a stage with SystemExit below)
        print(f"error: {INTERRUPTED.format(sig=signal.Signals(e.signum).name)}", file=sys.stderr)
        sys.exit(128 + e.signum)
    except KernelcampError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except (MemoryError, RuntimeError) as e:  # an allocation too large for the machine is bad input, not a bug
        oom = out_of_memory(e)
        if oom is None:
            raise
        print(f"error: {oom}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print(f"error: {INTERRUPTED.format(sig='SIGINT')}", file=sys.stderr)
        sys.exit(130)
    except SystemExit as e:  # kernelcamp.tracking.tracked_stage ends a signalled stage with 128 + signal
        names = {128 + signal.SIGINT: "SIGINT", 128 + signal.SIGTERM: "SIGTERM"}
        if e.code in names:
            line = INTERRUPTED_AFTER_RUN if getattr(e, "kernelcamp_run_finished", False) else INTERRUPTED
            print(f"error: {line.format(sig=names[e.code])}", file=sys.stderr)
        raise
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)  # not left held where the block failed before it
    sys.exit(rc or 0)


#: The one line a stage stopped by a signal prints (every output is written only when its stage succeeds).
INTERRUPTED = "interrupted by {sig}: this stage's outputs are as they were before it ran; run the pipeline again"
#: The line for a signal that came as the stage's MLflow run ended FINISHED (the report's outputs are then in place).
INTERRUPTED_AFTER_RUN = (
    "interrupted by {sig} as this stage's MLflow run ended FINISHED: its outputs are written, but DVC does not "
    "record the stage as done; run the pipeline again"
)

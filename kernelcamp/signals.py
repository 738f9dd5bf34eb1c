"""One signal scheme for every long-running piece: signals become exceptions, children die with us.

- :func:`signals_raise`: for a block, SIGTERM (and SIGINT, where asked) raise :class:`Terminated`, a
  ``BaseException`` like ``KeyboardInterrupt``, so no ``except Exception`` on the way swallows it and
  every ``finally`` (servers stopped, child process groups killed, the MLflow run closed) runs. Main
  thread only (Python runs handlers there); elsewhere a no-op. ``only_if_default``: leave a signal
  alone when someone already handles it (the stage's tracked run, which records KILLED).
- :func:`signals_deferred`: hold SIGTERM/SIGINT for a cleanup (or import) that must not be cut
  short; they are delivered when the block ends.
- :func:`die_with_parent` (in the process itself) and :func:`pdeathsig_preexec` (for a child we
  start): Linux sends the signal when the parent dies, also by SIGKILL, which no ``finally`` sees
  (``prctl(PR_SET_PDEATHSIG)``). No-ops where there is no prctl.

Users: ``kernelcamp.tracking.tracked_stage`` (SIGTERM/SIGINT -> a KILLED run), ``kernelcamp sweep``,
the serving benchmark's temporary baseline server, the compile child of ``kernelcamp.inspect``, and
every stage (``kernelcamp.io.stage_main``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any


class Terminated(BaseException):
    """A signal (``signum``) turned into an exception by :func:`signals_raise`."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def signals_raise(
    signals: Sequence[int] = (signal.SIGTERM, signal.SIGINT),
    only_if_default: bool = False,
    exc: Callable[[int], BaseException] = Terminated,
) -> Iterator[None]:
    """For the block, each of ``signals`` raises ``exc(signum)`` (default :class:`Terminated`).

    Main thread only; elsewhere a no-op. ``only_if_default``: a signal whose handler is not the
    default action is left as it is. The previous handlers are restored when the block ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: Any) -> None:
        raise exc(signum)

    old = {}
    for s in signals:
        if only_if_default and signal.getsignal(s) not in (signal.SIG_DFL, None):
            continue
        old[s] = signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGTERM/SIGINT for the block (a cleanup, or an import, that must not be cut short); each one
    that came is delivered once, to the handler in force before the block, when it ends.

    The main thread blocks them (``pthread_sigmask``), and their Python handlers are swapped for one
    that only notes them: a signal the kernel hands to another thread (which does not block it) still
    runs its Python handler in the main thread, at any bytecode of the block. A SIGINT inside
    ``import mlflow`` left half-initialised modules in ``sys.modules`` (the report stage's failure
    record then failed with "partially initialized module 'mlflow'"). Main thread only; elsewhere a no-op.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    sigs = (signal.SIGTERM, signal.SIGINT)
    pending: list[int] = []

    def note(signum: int, _frame: Any) -> None:
        pending.append(signum)

    old_handlers = {s: signal.signal(s, note) for s in sigs}
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, set(sigs))
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)  # a blocked one now runs `note`
        for s, h in old_handlers.items():
            signal.signal(s, h)
        for s in dict.fromkeys(pending):
            signal.raise_signal(s)


def die_with_parent(sig: int = signal.SIGTERM, parent_pid: int | None = None) -> None:
    """Have Linux send this process ``sig`` when its parent exits (``prctl(PR_SET_PDEATHSIG)``).

    When the parent is already gone (``parent_pid`` given: another parent now; else: re-parented to
    pid 1), ``sig`` is sent at once. DVC runs a stage as its child; when ``dvc exp run`` itself is
    terminated (``kill``, ``timeout``, a cancelled job), the stage would otherwise run on, orphaned,
    and write outputs nobody records. The setting is not inherited by children, so servers started on
    purpose to outlive the stage are unaffected. No-op where prctl is unavailable (not Linux)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(sig))  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    gone = os.getppid() != parent_pid if parent_pid is not None else os.getppid() == 1
    if gone:
        os.kill(os.getpid(), sig)


def pdeathsig_preexec(sig: int = signal.SIGTERM) -> Any:
    """A ``preexec_fn`` that has Linux send the child ``sig`` when its parent dies, even by SIGKILL
    (``prctl(PR_SET_PDEATHSIG)``; see :func:`die_with_parent`). libc's ``prctl`` is resolved here, in
    the parent: between fork and exec the child only makes the call (no import, no dlopen, which are
    not safe in a forked child of a threaded process). None where there is no prctl."""
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    sig = int(sig)
    return lambda: prctl(1, sig)  # 1 = PR_SET_PDEATHSIG

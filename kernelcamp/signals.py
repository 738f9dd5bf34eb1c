"""One signal scheme for every long-running piece: signals become exceptions, children die with us.

- :func:`signals_raise`: for a block, SIGTERM (and SIGINT, where asked) raise :class:`Terminated`, a
  ``BaseException`` like ``KeyboardInterrupt``, so no ``except Exception`` on the way swallows it and
  every ``finally`` (servers stopped, child process groups killed, the MLflow run closed) runs. A
  signal whose exception Python dropped (it landed in a ``__del__`` or GC callback) is delivered
  again (:class:`SignalGuard`). Main thread only (Python runs handlers there); elsewhere a no-op.
  ``only_if_default``: leave a signal alone when someone already handles it (the stage's tracked
  run, which records KILLED).
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


class SignalGuard:
    """What :func:`signals_raise` yields: :meth:`check` raises a signal whose exception Python dropped.

    A handler runs at whatever bytecode the main thread is at, also inside a finalizer (``__del__``, a
    weakref or garbage-collector callback). An exception raised there is not propagated: Python prints
    "Exception ignored in ..." (``sys.unraisablehook``) and goes on, so a Ctrl-C that landed there was
    lost and the stage finished normally (helper-55, 1 interrupt in 20). The guard notes such a signal
    as pending and has it sent again to the main thread from a timer thread (``signal.pthread_kill``)
    once the finalizer is over; :meth:`check`, and the block's normal end, raise one still pending."""

    #: seconds before a dropped signal is delivered again (the finalizer it landed in has returned by then)
    REDELIVER_S = 0.02

    def __init__(self, exc: Callable[[int], BaseException]):
        self._exc = exc
        self._raised: list[tuple[BaseException, int]] = []  # the handler's exceptions and their signals
        self._timer: threading.Timer | None = None
        self.pending: int | None = None  # a signal whose exception was dropped and not yet raised again

    def handler(self, signum: int, _frame: Any) -> None:
        self.pending = None  # delivered (again)
        err = self._exc(signum)
        self._raised[:] = [*self._raised[-7:], (err, signum)]
        raise err

    def unraisable(self, info: Any, previous: Callable[[Any], Any]) -> None:
        """``sys.unraisablehook`` for the block: one line for a dropped exception of :meth:`handler`, which
        is then delivered again; anything else goes to ``previous``."""
        signum = next((s for err, s in self._raised if err is info.exc_value), None)  # matched by identity
        if signum is None:
            previous(info)
            return
        self.pending = signum
        name = signal.Signals(signum).name
        print(f"kernelcamp: {name} arrived inside a finalizer; delivering it again", file=sys.stderr)
        # to the main thread itself: a system call it waits in (a sleep, a child's wait) ends with EINTR and the
        # handler runs; _thread.interrupt_main only sets the handler's flag, seen when that call returns
        main = threading.main_thread().ident
        self._timer = threading.Timer(self.REDELIVER_S, signal.pthread_kill, (main, signum))
        self._timer.daemon = True
        self._timer.start()

    def check(self) -> None:
        """Raise the exception of a signal that is still pending (see the class); else nothing."""
        if self.pending is not None:
            signum, self.pending = self.pending, None
            if self._timer is not None:
                self._timer.cancel()
            raise self._exc(signum)

    def stop(self) -> None:
        """Cancel a delivery not yet made (the block ends); :meth:`check` still raises the signal."""
        if self._timer is not None:
            self._timer.cancel()


@contextlib.contextmanager
def signals_raise(
    signals: Sequence[int] = (signal.SIGTERM, signal.SIGINT),
    only_if_default: bool = False,
    exc: Callable[[int], BaseException] = Terminated,
) -> Iterator[SignalGuard]:
    """For the block, each of ``signals`` raises ``exc(signum)`` (default :class:`Terminated`).

    Yields a :class:`SignalGuard`: a signal whose exception Python dropped (it landed in a finalizer) is
    delivered again, and raised at the latest when the block ends normally; :meth:`SignalGuard.check`
    raises it earlier, where a caller must know before it records success. Main thread only; elsewhere a
    no-op (the guard then never holds a signal). ``only_if_default``: a signal whose handler is not the
    default action is left as it is. The previous handlers are restored when the block ends."""
    guard = SignalGuard(exc)
    if threading.current_thread() is not threading.main_thread():
        yield guard
        return

    old = {}
    for s in signals:
        if only_if_default and signal.getsignal(s) not in (signal.SIG_DFL, None):
            continue
        old[s] = signal.signal(s, guard.handler)
    previous_hook = sys.unraisablehook
    if old:
        sys.unraisablehook = lambda info: guard.unraisable(info, previous_hook)
    try:
        yield guard
        guard.check()
    finally:
        guard.stop()
        if old:
            sys.unraisablehook = previous_hook
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

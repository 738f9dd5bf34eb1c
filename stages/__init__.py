"""The pipeline's stages, each run by DVC as ``python -m stages.<name>`` (``dvc.yaml``).

While a stage started that way imports its modules (torch, matplotlib, MLflow: about 1.5 s on a CPU), SIGINT and
SIGTERM end it at once, with one line and exit status 128 + signal: it has written nothing yet. Before, a Ctrl-C
there gave a ``KeyboardInterrupt`` traceback (inside ``import matplotlib`` an ``ImportError``, recorded as a FAILED
run), a SIGTERM ended it with no line, and a signal that landed in a garbage-collector callback was dropped, so the
stage went on and exited 0 (helper-56). When the stage's work begins, ``kernelcamp.io.stage_main`` raises the two
signals as ``Terminated`` for it and puts Python's own handlers back after it. A signal the stage was started
ignoring (a shell's ``&``) stays ignored.
"""

import os
import signal
import sys


def _interrupted_while_starting(signum: int, _frame: object) -> None:
    """Exit at once with 128 + ``signum`` and one line; no exception, so nothing can catch or drop it."""
    name = signal.Signals(signum).name
    line = f"error: interrupted by {name} while the stage started: it wrote nothing; run the pipeline again\n"
    os.write(2, line.encode())
    os._exit(128 + signum)


_interrupted_while_starting.kernelcamp_stage_start = True  # type: ignore[attr-defined]  # stage_main looks for it

# `python -m stages.<name>`: Python imports this package while it finds the module, with sys.argv[0] "-m"; a test or
# another program importing a stage module keeps its own handlers
if sys.argv[:1] == ["-m"]:
    for _s in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(_s) is not signal.SIG_IGN:
            signal.signal(_s, _interrupted_while_starting)

"""Python's cyclic garbage collector in a serving process: its pauses counted, its heap frozen after warm-up.

A full (generation 2) collection walks every tracked object of the process and holds the GIL while it
does: with torch, Triton and the server's modules imported, about 200,000 objects, that took 75-137 ms
on the 2-core CI machine (2026-12-02: ``gc.collect(2)`` in a process that imported them, and the
servers' own freeze collections). During a serving window it stops the model
step (engine process), the SSE writes (front) or the load generator's reads (client) for that long,
which would show up as one slow window among steady ones (issue 12). ``gc.freeze()`` moves every object
alive at that moment into the permanent generation, which later collections skip: the objects of the
imports, the model and the captured graphs are never walked again, and a full collection costs what
the objects made since then cost. SGLang does the same (``freeze_gc``, and ``configure_gc_warning``
which logs a long collection, in ``sglang/srt/utils``), and vLLM after server init and warm-up
(``freeze_gc_heap`` in ``vllm/utils/gc_utils.py``). The collector stays enabled, so reference cycles
made later are still reclaimed. Source of ``gc.callbacks`` and ``gc.freeze``: the Python ``gc`` module
documentation (3.11, 3.12).

Measured on the H200 (2026-12-02, reports/campaigns/decisions/README.md, last section): with the heaps
frozen, a serving window of about 3.4 s at concurrency 96 had 0.1-1.5 ms of pauses in the engine,
35-53 ms in the front and 32-46 ms in the load generator (young collections), varying by about 0.3%
of a window between windows: not the source of the 3-11% window-to-window spread of throughput.
"""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

__all__ = ["GcWatch", "freeze_heap", "watch"]


class GcWatch:
    """Collections and pause time of the collector in this process, per generation (``gc.callbacks``).

    One instance per process (:func:`watch`). The callback runs in whichever thread triggered the
    collection, with the GIL held, so every other Python thread of the process waited that long.
    Times in ms (``time.perf_counter``)."""

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.pause_ms = [0.0, 0.0, 0.0]
        self.max_pause_ms = 0.0
        self.total_ms = 0.0  # every generation; read by the engine per step record
        self._t0: float | None = None
        self._installed = False
        self._lock = threading.Lock()

    def install(self) -> GcWatch:
        """Register the callback (once); returns self."""
        with self._lock:
            if not self._installed:
                gc.callbacks.append(self._callback)
                self._installed = True
        return self

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        if self._t0 is None:
            return
        ms = (time.perf_counter() - self._t0) * 1e3
        self._t0 = None
        g = int(info.get("generation", 2))
        g = g if 0 <= g <= 2 else 2
        self.collections[g] += 1
        self.pause_ms[g] += ms
        self.total_ms += ms
        self.max_pause_ms = max(self.max_pause_ms, ms)

    def snapshot(self) -> dict[str, Any]:
        """JSON-ready: ``collections`` and ``pause_ms`` (lists indexed by generation 0..2, since
        :meth:`install`), ``max_pause_ms``, ``frozen_objects`` (``gc.get_freeze_count()``: objects in the
        permanent generation; 0 unless this server or a library froze the heap), ``unfrozen_objects``
        (``len(gc.get_objects())``: the tracked objects a full collection walks now; counted only once
        something is frozen, None before: counting walks them, about 1 ms per 10,000, and an unfrozen
        heap with torch holds about 200,000) and ``enabled`` (``gc.isenabled()``)."""
        return {
            "collections": list(self.collections),
            "pause_ms": [round(x, 3) for x in self.pause_ms],
            "max_pause_ms": round(self.max_pause_ms, 3),
            "frozen_objects": gc.get_freeze_count(),
            "unfrozen_objects": len(gc.get_objects()) if gc.get_freeze_count() else None,
            "enabled": gc.isenabled(),
        }


_WATCH = GcWatch()


def watch() -> GcWatch:
    """This process's :class:`GcWatch`, installed."""
    return _WATCH.install()


def freeze_heap() -> dict[str, Any]:
    """Collect the garbage there is, then freeze every object left (module docstring): call it once the
    process is warmed up (model built, graphs captured), before it serves. Returns ``{"frozen_objects":
    n, "freeze_ms": t}`` (the one full collection it runs, and the freeze, in ms)."""
    t0 = time.perf_counter()
    gc.collect()
    gc.freeze()
    return {"frozen_objects": gc.get_freeze_count(), "freeze_ms": round((time.perf_counter() - t0) * 1e3, 3)}

"""Kernel timing: CUDA-graph replays with the L2 cache flushed before every call, and A/B rounds.

Method (``bench_graph``). After ``warmup`` eager calls (compiles, autotuning), two CUDA graphs are
captured on a side stream:

- the *kernel graph*: ``calls_per_graph`` times (L2 flush, then ``fn()``);
- the *flush graph*: the same flushes alone.

A flush zeroes a buffer of at least twice the L2 size (``torch.cuda.get_device_properties().
L2_cache_size``; 64 MiB floor), which evicts whatever ``fn`` left in L2, so each call starts cold
as it would between decode steps. Each sample replays the kernel graph, then the flush graph, each
bracketed by CUDA events on the stream, and is ``(t_kernel_graph - t_flush_graph) /
calls_per_graph``: the flushes and the graph launch overhead cancel, leaving the per-call device
time without CPU launch overhead (what a server replaying its own decode graph pays).
``triton.testing.do_bench_cudagraph`` is not used: it does not flush L2 between replays
(DESIGN.md, known traps).

``interleaved_rounds`` alternates the order of the implementations every round (ABBA...), so clock
or thermal drift hits both equally, and returns one tidy row per (round, implementation) with the
provenance of the device (GPU name, SM clock, driver, torch and Triton versions).

Without CUDA, the GPU functions raise ``KernelcampError``; ``bench_cpu`` times with
``time.perf_counter`` and its results must be labelled ``device="cpu"`` (they are interpreter
timings, not kernel timings).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from kernelcamp.errors import KernelcampError
from kernelcamp.provenance import device_info, now_utc

MIN_FLUSH_BYTES = 64 << 20


def _require_cuda(what: str) -> Any:
    import torch

    if not torch.cuda.is_available():
        raise KernelcampError(f"{what} needs a CUDA GPU and none is visible; on a CPU use bench_cpu (labelled cpu)")
    return torch


def flush_bytes(device: Any = None) -> int:
    """Size of the L2 flush buffer: 2 x the L2 cache, at least 64 MiB."""
    torch = _require_cuda("flush_bytes")
    props = torch.cuda.get_device_properties(device if device is not None else torch.cuda.current_device())
    return max(2 * int(getattr(props, "L2_cache_size", 0) or 0), MIN_FLUSH_BYTES)


class GraphTimer:
    """Captured kernel and flush graphs for one callable; ``sample(n)`` returns n per-call times (us).

    ``fn`` takes no arguments and must be capturable (no host syncs, no compiles once warmed).
    """

    def __init__(self, fn: Callable[[], Any], *, calls_per_graph: int = 8, warmup: int = 5, flush_l2: bool = True):
        torch = _require_cuda("GraphTimer")
        if calls_per_graph < 1:
            raise KernelcampError(f"calls_per_graph={calls_per_graph}: must be >= 1")
        self.calls = calls_per_graph
        self.flush_l2 = flush_l2
        for _ in range(max(warmup, 1)):
            fn()
        torch.cuda.synchronize()
        self._flush_buf = torch.empty(flush_bytes(), dtype=torch.int8, device="cuda") if flush_l2 else None
        self._stream = torch.cuda.Stream()
        self.graph = self._capture(lambda: (self._flush(), fn()))
        self.flush_graph = self._capture(self._flush) if flush_l2 else None

    def _flush(self) -> None:
        if self._flush_buf is not None:
            self._flush_buf.zero_()

    def _capture(self, body: Callable[[], Any]) -> Any:
        import torch

        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=self._stream):
            for _ in range(self.calls):
                body()
        torch.cuda.synchronize()
        return g

    def _time(self, graph: Any) -> float:
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self._stream):
            start.record()
            graph.replay()
            end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1000.0  # ms -> us

    def sample(self, replays: int) -> list[float]:
        """``replays`` samples of the per-call time in microseconds (flush time subtracted)."""
        out = []
        for _ in range(replays):
            t = self._time(self.graph)
            if self.flush_graph is not None:
                t -= self._time(self.flush_graph)
            out.append(max(t, 0.0) / self.calls)
        return out


def bench_graph(
    fn: Callable[[], Any], *, replays: int = 20, warmup: int = 5, flush_l2: bool = True, calls_per_graph: int = 8
) -> list[float]:
    """Per-call device time of ``fn`` in microseconds, ``replays`` samples (method: module docstring).

    Raises ``KernelcampError`` without CUDA.
    """
    return GraphTimer(fn, calls_per_graph=calls_per_graph, warmup=warmup, flush_l2=flush_l2).sample(replays)


def summarize(samples_us: list[float]) -> dict[str, float]:
    """``{"latency_us_p20", "latency_us_p50", "latency_us_p80"}`` of the samples (linear interpolation)."""
    if not samples_us:
        raise KernelcampError("summarize: no samples")
    p20, p50, p80 = np.percentile(np.asarray(samples_us, dtype=float), [20, 50, 80])
    return {"latency_us_p20": float(p20), "latency_us_p50": float(p50), "latency_us_p80": float(p80)}


def round_order(names: list[str], round_index: int) -> list[str]:
    """Order of the implementations in a round: as given on even rounds, reversed on odd ones."""
    return list(names) if round_index % 2 == 0 else list(reversed(names))


def interleaved_rounds(
    impls: dict[str, Callable[[], Any]],
    *,
    rounds: int,
    replays_per_round: int,
    warmup: int = 5,
    flush_l2: bool = True,
    calls_per_graph: int = 8,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Paired, interleaved A/B(/C...) timing.

    Returns tidy rows ``{round, impl, position, latency_us, replays, measured_at, **device_info()}``
    where ``latency_us`` is the median of that round's replays and ``position`` the slot the
    implementation ran in (0 first). Raises ``KernelcampError`` without CUDA or with < 1 impl.
    """
    _require_cuda("interleaved_rounds")
    if not impls:
        raise KernelcampError("interleaved_rounds: no implementations given")
    prov = device_info()
    timers = {}
    for name, fn in impls.items():
        if progress:
            progress(f"capturing {name}")
        timers[name] = GraphTimer(fn, calls_per_graph=calls_per_graph, warmup=warmup, flush_l2=flush_l2)
    rows = []
    for r in range(rounds):
        for pos, name in enumerate(round_order(list(impls), r)):
            med = statistics.median(timers[name].sample(replays_per_round))
            rows.append(
                {
                    "round": r,
                    "impl": name,
                    "position": pos,
                    "latency_us": med,
                    "replays": replays_per_round,
                    "measured_at": now_utc(),
                    **prov,
                }
            )
        if progress:
            progress(
                f"round {r + 1}/{rounds}: "
                + ", ".join(f"{x['impl']} {x['latency_us']:.2f} us" for x in rows[-len(impls) :])
            )
    return rows


def bench_cpu(fn: Callable[[], Any], replays: int = 5, warmup: int = 1) -> list[float]:
    """Wall-clock microseconds per call with ``time.perf_counter`` (CPU / interpreter runs only;
    label results ``device="cpu"``)."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(replays):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    return out

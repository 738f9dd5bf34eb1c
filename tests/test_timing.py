"""CPU tests of the timing helpers (the GPU paths are in tests/test_kernel_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from kernelcamp.bench import timing
from kernelcamp.errors import KernelcampError


def test_summarize_percentiles():
    s = timing.summarize([float(x) for x in range(1, 101)])
    assert s == pytest.approx({"latency_us_p20": 20.8, "latency_us_p50": 50.5, "latency_us_p80": 80.2})
    with pytest.raises(KernelcampError):
        timing.summarize([])


def test_round_order_alternates():
    names = ["baseline", "candidate"]
    assert timing.round_order(names, 0) == names
    assert timing.round_order(names, 1) == names[::-1]
    assert timing.round_order(names, 2) == names
    # across an even number of rounds every impl is first equally often
    firsts = [timing.round_order(["a", "b", "c"], r)[0] for r in range(4)]
    assert firsts.count("a") == firsts.count("c") == 2


def test_bench_cpu_measures_wall_time():
    import time

    samples = timing.bench_cpu(lambda: time.sleep(0.002), replays=3)
    assert len(samples) == 3 and all(s >= 1500 for s in samples)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_gpu_timing_without_cuda_raises_clear_error():
    with pytest.raises(KernelcampError, match="CUDA"):
        timing.bench_graph(lambda: None)
    with pytest.raises(KernelcampError, match="CUDA"):
        timing.interleaved_rounds({"a": lambda: None}, rounds=2, replays_per_round=2)

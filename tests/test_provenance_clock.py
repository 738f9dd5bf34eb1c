"""kernelcamp.provenance.ClockSampler: the SM clock during a measurement, not one idle reading."""

from __future__ import annotations

import itertools
import time

import pytest

from kernelcamp import provenance
from kernelcamp.report import _clock


def test_sampler_reads_the_clock_while_the_block_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    # One reading taken after the rounds showed 345 MHz on the H200: the idle clock, not the one the
    # rounds ran at. The sampler reads throughout the block.
    readings = itertools.chain(["1980", "1965", "1980"], itertools.repeat("345"))
    calls = []

    def fake_smi(query: str, index: int) -> str:
        calls.append((query, index))
        return next(readings)

    monkeypatch.setattr(provenance, "_nvidia_smi", fake_smi)
    with provenance.ClockSampler(3, interval_s=0.01) as s:
        while len(s.samples) < 3:
            time.sleep(0.005)
    got = s.summary()
    assert calls[0] == ("clocks.sm", 3)
    assert got["sm_clock_mhz_max"] == 1980 and got["samples"] >= 3
    assert "/ 1980 (" in _clock({"kernel": {"sm_clock_during_rounds": got}})


def test_sampler_without_nvidia_smi_is_empty_and_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(provenance, "_nvidia_smi", lambda q, i: None)
    with provenance.ClockSampler(0, interval_s=0.01) as s:
        time.sleep(0.05)
    assert s.summary() == {}
    assert _clock({"kernel": {"sm_clock_during_rounds": {}}}) is None


def test_smi_index_follows_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    assert provenance.smi_index(1) == 5
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert provenance.smi_index(1) == 1

"""kernelcamp.stats: A/A comes out inconclusive, a planted slowdown comes out slower, step model."""

import numpy as np
import pytest

from kernelcamp.errors import KernelcampError
from kernelcamp.stats import decision, fit_step_model, paired_ratio_ci


def _rounds(n, rng, base=100.0, drift=0.05, noise=0.01):
    """Per-round latencies with a shared drift (clocks) and independent noise per impl."""
    shared = base * (1 + drift * np.sin(np.arange(n) / 3.0))
    return shared, lambda: shared * (1 + noise * rng.standard_normal(n))


@pytest.mark.parametrize("seed", range(20))
def test_aa_is_inconclusive(seed):
    rng = np.random.default_rng(seed)
    _, draw = _rounds(30, rng)
    a, b = draw(), draw()
    r = paired_ratio_ci(a, b)
    # A planted-equal pair must not be called faster or slower at a 2% threshold.
    assert decision(r["ratio"], r["ci_lo"], r["ci_hi"], 0.02) == "inconclusive"
    assert r["n_rounds"] == 30


def test_planted_slowdown_is_slower_with_ci_clear_of_one():
    rng = np.random.default_rng(0)
    _, draw = _rounds(30, rng)
    base, cand = draw(), draw() * 1.10
    r = paired_ratio_ci(base, cand)
    assert r["ci_lo"] > 1.0
    assert r["ci_lo"] < 1.10 < r["ci_hi"]
    assert decision(r["ratio"], r["ci_lo"], r["ci_hi"], 0.02) == "slower"
    # Swapped, it is faster.
    r2 = paired_ratio_ci(cand, base)
    assert r2["ci_hi"] < 1.0
    assert decision(r2["ratio"], r2["ci_lo"], r2["ci_hi"], 0.02) == "faster"


def test_small_real_difference_below_threshold_is_inconclusive():
    # 1% faster with a tight interval: real, but under the 2% threshold.
    assert decision(0.99, 0.985, 0.995, 0.02) == "inconclusive"
    assert decision(0.97, 0.96, 0.98, 0.02) == "faster"
    assert decision(0.97, 0.90, 1.01, 0.02) == "inconclusive"


def test_pairing_cancels_shared_drift():
    # Huge shared drift, tiny paired noise: the paired interval must stay narrow.
    rng = np.random.default_rng(1)
    shared = 100 * (1 + 0.5 * rng.random(20))
    r = paired_ratio_ci(shared * (1 + 0.001 * rng.standard_normal(20)), shared * 1.05)
    assert r["ci_hi"] - r["ci_lo"] < 0.01


def test_deterministic_and_validates():
    a, b = [1.0, 2.0, 3.0], [1.1, 2.1, 3.3]
    assert paired_ratio_ci(a, b) == paired_ratio_ci(a, b)
    with pytest.raises(KernelcampError):
        paired_ratio_ci([1.0], [1.0])
    with pytest.raises(KernelcampError):
        paired_ratio_ci([1.0, 2.0], [1.0])
    with pytest.raises(KernelcampError):
        paired_ratio_ci([1.0, 0.0], [1.0, 1.0])


def test_step_model_recovers_story_coefficients():
    batch = np.array([1, 8, 16, 32, 48, 64, 80, 96], dtype=float)
    rng = np.random.default_rng(2)
    step = 18.0 + 1.05 * batch + 0.05 * rng.standard_normal(batch.size)
    m = fit_step_model(batch, step)
    assert m["a_ms"] == pytest.approx(18.0, abs=0.2)
    assert m["b_ms_per_req"] == pytest.approx(1.05, abs=0.01)
    assert m["r2"] > 0.999
    with pytest.raises(KernelcampError):
        fit_step_model([4, 4], [1.0, 2.0])

"""A/B statistics for interleaved rounds and the decode step-time model.

Method (paired_ratio_ci): each round times the baseline and the candidate back to back (order
alternating), so one round gives one paired observation ``d_i = log(candidate_i / baseline_i)``;
drifts that hit both (clocks, temperature, a noisy neighbour) cancel in the difference. The
interval is Student's t on the mean of the ``d_i`` (n - 1 degrees of freedom), mapped back with
``exp``: ``ratio = exp(mean d)`` is the geometric mean of the per-round ratios, and ``[lo, hi]`` is
its two-sided ``confidence`` interval. The t interval is exact for normal log ratios and a standard
approximation otherwise; it needs no random numbers, so the same rounds always give the same
interval. Per-round figures should be a robust statistic of the round (the median of its replays).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats as _st

from kernelcamp.errors import KernelcampError

DECISIONS = ("faster", "slower", "inconclusive")


def paired_ratio_ci(
    baseline_per_round: Sequence[float], candidate_per_round: Sequence[float], confidence: float = 0.95
) -> dict[str, float | int]:
    """Ratio candidate/baseline of paired rounds with its confidence interval.

    Args: per-round latencies (any unit, both the same, > 0), one pair per round, at least 2 rounds.
    Returns ``{"ratio", "ci_lo", "ci_hi", "n_rounds", "confidence"}``. With zero spread in the log
    ratios the interval collapses to the ratio.
    Raises ``KernelcampError`` for unequal lengths, fewer than 2 rounds or a non-positive value.
    """
    b = np.asarray(baseline_per_round, dtype=np.float64)
    c = np.asarray(candidate_per_round, dtype=np.float64)
    if b.shape != c.shape or b.ndim != 1:
        raise KernelcampError(f"paired rounds need equal-length lists, got {b.shape} and {c.shape}")
    n = int(b.size)
    if n < 2:
        raise KernelcampError(f"a confidence interval needs at least 2 paired rounds, got {n}")
    if not (np.all(b > 0) and np.all(c > 0) and np.all(np.isfinite(b)) and np.all(np.isfinite(c))):
        raise KernelcampError("per-round figures must be finite and > 0")
    if not 0 < confidence < 1:
        raise KernelcampError(f"confidence must be in (0, 1), got {confidence}")
    d = np.log(c) - np.log(b)
    mean = float(d.mean())
    sem = float(d.std(ddof=1) / math.sqrt(n))
    half = float(_st.t.ppf(0.5 + confidence / 2, n - 1)) * sem
    return {
        "ratio": math.exp(mean),
        "ci_lo": math.exp(mean - half),
        "ci_hi": math.exp(mean + half),
        "n_rounds": n,
        "confidence": confidence,
    }


def decision(ratio: float, lo: float, hi: float, threshold: float) -> str:
    """``"faster"``, ``"slower"`` or ``"inconclusive"`` for a latency ratio candidate/baseline.

    Faster: the whole interval is below 1 and the ratio is below ``1 - threshold``. Slower: the
    whole interval is above 1 and the ratio is above ``1 + threshold``. Anything else is
    inconclusive (an interval that straddles 1, or a real difference smaller than the threshold).
    For throughput ratios (higher is better) swap the words.
    """
    if hi < 1.0 and ratio < 1.0 - threshold:
        return "faster"
    if lo > 1.0 and ratio > 1.0 + threshold:
        return "slower"
    return "inconclusive"


def fit_step_model(batch: Sequence[float], step_ms: Sequence[float]) -> dict[str, float | int]:
    """Least-squares fit of ``step_ms = a_ms + b_ms_per_req * batch``.

    Returns ``{"a_ms", "b_ms_per_req", "r2", "n_points"}``; r2 is 1.0 for a perfect fit (and when
    all step times are equal and fitted exactly). Raises ``KernelcampError`` with fewer than 2
    distinct batch sizes.
    """
    x = np.asarray(batch, dtype=np.float64)
    y = np.asarray(step_ms, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise KernelcampError(f"step model needs equal-length lists, got {x.shape} and {y.shape}")
    if np.unique(x).size < 2:
        raise KernelcampError(f"step model needs at least 2 distinct batch sizes, got {sorted(set(x.tolist()))}")
    b, a = np.polyfit(x, y, 1)
    pred = a + b * x
    ss_res = float(((y - pred) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res < 1e-12 else 0.0)
    return {"a_ms": float(a), "b_ms_per_req": float(b), "r2": r2, "n_points": int(x.size)}

"""A/B statistics for interleaved rounds, the four-outcome decision, sequential stopping, and the
decode step-time model.

Method (paired_ratio_ci): each round times the baseline and the candidate back to back (order
alternating), so one round gives one paired observation ``d_i = log(candidate_i / baseline_i)``;
drifts that hit both (clocks, temperature, a noisy neighbour) cancel in the difference. The
interval is Student's t on the mean of the ``d_i`` (n - 1 degrees of freedom), mapped back with
``exp``: ``ratio = exp(mean d)`` is the geometric mean of the per-round ratios, and ``[lo, hi]`` is
its two-sided ``confidence`` interval. The t interval is exact for normal log ratios and a standard
approximation otherwise; it needs no random numbers, so the same rounds always give the same
interval. Per-round figures should be a robust statistic of the round (the median of its replays).

Decision (:func:`decision`), for a latency ratio candidate/baseline and a practical threshold t
(``report.threshold``), four outcomes from the interval alone:

* ``faster``: the whole interval below ``1 - t``;
* ``slower``: the whole interval above ``1 + t``;
* ``equivalent``: the whole interval inside ``[1 - t, 1 + t]``. With a ``1 - a`` two-sided interval
  this is the two one-sided tests (TOST) procedure at level ``a / 2`` (Schuirmann 1987; Lakens,
  "Equivalence Tests: A Practical Primer for t Tests, Correlations, and Meta-Analyses", Social
  Psychological and Personality Science 8(4), 2017);
* ``inconclusive``: anything else (the interval too wide to say, or straddling a margin).

With a ``1 - a`` interval each claim is wrong with probability at most ``a / 2``: ``faster`` or
``slower`` when the true ratio lies within the threshold (in particular in an A/A run), and
``equivalent`` when it lies outside. ``half_width = (ci_hi - ci_lo) / 2`` is the run's resolution
(in ratio units: 0.012 means it could detect about +-1.2%); every report states it beside the decision.

Sequential stopping (:class:`SequentialPlan`): rounds are analysed at planned looks (after
``min_rounds``, then every ``look_every`` rounds, and at ``max_rounds``; K looks in all); the run stops
at the first look whose decision is faster, slower or equivalent, at ``max_rounds``, or at the
first look after ``max_seconds``. Every look uses the interval at confidence ``1 - a / K``
(``a = 1 - confidence``): a Bonferroni split of the error over the planned looks, so by the union
bound the interval holds at every look at once with probability >= ``1 - a`` and each wrong claim
keeps its rate <= ``a / 2`` whatever look the run stops at (a conservative alpha spending; Jennison &
Turnbull, "Group Sequential Methods with Applications to Clinical Trials", Chapman & Hall/CRC 2000,
ch. 2 and 7, on repeated confidence intervals). A run stopped by ``max_seconds`` stops at a look,
so it spends no more than planned. :func:`simulate_sequential` checks the rates
(tests/test_stats.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as _st

from kernelcamp.errors import KernelcampError

DECISIONS = ("faster", "slower", "equivalent", "inconclusive")
#: Numeric codes for metrics files and MLflow (numbers only there; the words go in tags and reports).
#: faster, inconclusive and slower keep the codes they had under the three-outcome rule (-1, 0, 1), so
#: a committed record's 0 still means inconclusive; equivalent, new, is 2. Not an ordinal scale.
DECISION_CODES = {"faster": -1, "inconclusive": 0, "slower": 1, "equivalent": 2}
#: Why a sequential run stopped.
STOP_REASONS = ("decided", "max_rounds", "max_seconds")


def paired_ratio_ci(
    baseline_per_round: Sequence[float], candidate_per_round: Sequence[float], confidence: float = 0.95
) -> dict[str, float | int]:
    """Ratio candidate/baseline of paired rounds with its confidence interval.

    Args: per-round latencies (any unit, both the same, > 0), one pair per round, at least 2 rounds.
    Returns ``{"ratio", "ci_lo", "ci_hi", "half_width", "n_rounds", "confidence"}`` (``half_width``
    = (ci_hi - ci_lo) / 2, ratio units). With zero spread in the log ratios the interval collapses to
    the ratio.
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
    return _log_t_interval(float(d.mean()), float(d.std(ddof=1) / math.sqrt(n)), n - 1, confidence, n_rounds=n)


def _log_t_interval(mean: float, sem: float, dof: float, confidence: float, **extra: float | int) -> dict:
    """Student's t interval of a mean log ratio, mapped back with ``exp``: ``ratio``, ``ci_lo``,
    ``ci_hi``, ``half_width`` (ratio units), ``confidence`` and ``extra``."""
    half = float(_st.t.ppf(0.5 + confidence / 2, dof)) * sem
    lo, hi = math.exp(mean - half), math.exp(mean + half)
    return {
        "ratio": math.exp(mean),
        "ci_lo": lo,
        "ci_hi": hi,
        "half_width": (hi - lo) / 2,
        **extra,
        "confidence": confidence,
    }


def stratified_ratio_ci(
    strata: Sequence[tuple[Sequence[float], Sequence[float]]], confidence: float = 0.95
) -> dict[str, float | int]:
    """Ratio candidate/baseline over paired observations in strata (serving levels), each stratum
    weighted equally, with its confidence interval.

    Args: one ``(baseline, candidate)`` pair of equal-length lists (figures > 0) per stratum, at least
    2 pairs in each. With ``d_ij = log(candidate_ij / baseline_ij)`` for pair j of stratum i (of L),
    the estimate is the mean of the strata means, ``m = (1/L) sum_i mean_j d_ij``, so ``ratio =
    exp(m)`` is the geometric mean of the per-stratum geometric-mean ratios (for strata of equal size,
    the same figure as pooling every pair). The noise is the spread of each pair around its own
    stratum's mean, pooled over the strata: ``s^2 = sum_ij (d_ij - mean_i)^2 / sum_i (n_i - 1)``, and
    ``var(m) = s^2 (1/L^2) sum_i 1/n_i``, Student's t with ``sum_i (n_i - 1)`` degrees of freedom: the
    analysis of a randomized block design with the strata as blocks (Montgomery, "Design and Analysis
    of Experiments", 8th ed., Wiley 2013, ch. 4). So the differences *between* strata (a kernel
    slowdown that shows at concurrency 96 and not at 1) are not counted as noise, which they are when
    every pair is pooled into one t interval. The degrees of freedom are exact when the strata are
    equally noisy; on the H200 they are not (window-to-window CV 1-18% per level), and the seeded
    simulations in tests/test_stats.py check the error rates with levels whose noise differs ninefold.
    Per-stratum variances with Welch-Satterthwaite degrees of freedom were tried first: one noisy level
    pulled the degrees of freedom to about 3, and at three repeats that interval was wider than pooling
    (median +-6.6% against +-5.5% in the simulation of H200-like noise). With a single stratum it is
    :func:`paired_ratio_ci`.

    Returns :func:`paired_ratio_ci`'s keys (``n_rounds``: pairs in all) plus ``n_strata`` and ``df``.
    Raises ``KernelcampError`` for no strata, a stratum with unequal lengths or fewer than 2 pairs, a
    non-positive figure, or a confidence outside (0, 1).
    """
    if not strata:
        raise KernelcampError("a stratified interval needs at least one stratum")
    if not 0 < confidence < 1:
        raise KernelcampError(f"confidence must be in (0, 1), got {confidence}")
    means, ss, ns = [], 0.0, []
    for i, (base, cand) in enumerate(strata):
        b = np.asarray(base, dtype=np.float64)
        c = np.asarray(cand, dtype=np.float64)
        if b.shape != c.shape or b.ndim != 1:
            raise KernelcampError(f"stratum {i}: paired figures need equal-length lists, got {b.shape} and {c.shape}")
        if b.size < 2:
            raise KernelcampError(f"stratum {i}: an interval needs at least 2 pairs per stratum, got {b.size}")
        if not (np.all(b > 0) and np.all(c > 0) and np.all(np.isfinite(b)) and np.all(np.isfinite(c))):
            raise KernelcampError(f"stratum {i}: figures must be finite and > 0")
        d = np.log(c) - np.log(b)
        means.append(float(d.mean()))
        ss += float(((d - d.mean()) ** 2).sum())
        ns.append(int(d.size))
    big_l = len(strata)
    df = sum(n - 1 for n in ns)
    sem = math.sqrt(ss / df * sum(1.0 / n for n in ns)) / big_l
    return _log_t_interval(sum(means) / big_l, sem, df, confidence, n_rounds=sum(ns), n_strata=big_l, df=df)


def decision(ratio: float, lo: float, hi: float, threshold: float, higher_is_better: bool = False) -> str:
    """One of :data:`DECISIONS` for a ratio candidate/baseline with its interval ``[lo, hi]``.

    Latency (``higher_is_better`` false): ``faster`` when ``hi < 1 - threshold``, ``slower`` when
    ``lo > 1 + threshold``, ``equivalent`` when ``1 - threshold <= lo`` and ``hi <= 1 + threshold``
    (TOST, module docstring), else ``inconclusive``. Throughput (higher is better): the words
    faster/slower swapped. ``ratio`` is checked to lie in the interval, not otherwise used.
    Raises ``KernelcampError`` for a negative threshold or a ratio outside ``[lo, hi]``.
    """
    if threshold < 0:
        raise KernelcampError(f"report.threshold={threshold}: expected >= 0")
    if not lo <= ratio <= hi:
        raise KernelcampError(f"ratio {ratio} outside its interval [{lo}, {hi}]")
    if hi < 1.0 - threshold:
        d = "faster"
    elif lo > 1.0 + threshold:
        d = "slower"
    elif lo >= 1.0 - threshold and hi <= 1.0 + threshold:
        d = "equivalent"
    else:
        d = "inconclusive"
    if higher_is_better:
        d = {"faster": "slower", "slower": "faster"}.get(d, d)
    return d


def resolution_text(half_width: float | None) -> str:
    """``"resolution: could detect +-1.2%"`` for a half-width in ratio units (``"n/a"`` for None)."""
    return "resolution: n/a" if half_width is None else f"resolution: could detect \u00b1{100 * half_width:.1f}%"


@dataclass(frozen=True)
class SequentialPlan:
    """Planned looks of a sequential A/B (module docstring: Bonferroni over the looks).

    ``min_rounds`` >= 2 and <= ``max_rounds``; ``look_every`` >= 1 (rounds between looks);
    ``max_seconds`` (None: no time budget) is checked at each look; ``confidence`` is the overall
    level (``report.confidence``), ``threshold`` the practical margin (``report.threshold``).
    Raises ``KernelcampError`` for an unusable plan, naming ``what`` (the params prefix).
    """

    min_rounds: int
    max_rounds: int
    look_every: int = 1
    max_seconds: float | None = None
    confidence: float = 0.95
    threshold: float = 0.02
    higher_is_better: bool = False
    what: str = "rounds"

    def __post_init__(self) -> None:
        if not (isinstance(self.max_rounds, int) and self.max_rounds >= 2):
            raise KernelcampError(f"{self.what}: maximum rounds {self.max_rounds!r}: expected an integer >= 2")
        if not (isinstance(self.min_rounds, int) and 2 <= self.min_rounds <= self.max_rounds):
            raise KernelcampError(
                f"{self.what}: minimum rounds {self.min_rounds!r}: expected an integer in 2..{self.max_rounds}"
            )
        if not (isinstance(self.look_every, int) and self.look_every >= 1):
            raise KernelcampError(f"{self.what}: look_every {self.look_every!r}: expected an integer >= 1")
        if self.max_seconds is not None and not self.max_seconds > 0:
            raise KernelcampError(f"{self.what}: max_seconds {self.max_seconds!r}: expected > 0 or null")
        if not 0 < self.confidence < 1:
            raise KernelcampError(f"report.confidence={self.confidence}: expected in (0, 1)")
        if self.threshold < 0:
            raise KernelcampError(f"report.threshold={self.threshold}: expected >= 0")

    @property
    def looks(self) -> list[int]:
        """Round counts at which the rounds are analysed (ascending, the last is ``max_rounds``)."""
        return sorted(set(range(self.min_rounds, self.max_rounds, self.look_every)) | {self.max_rounds})

    @property
    def confidence_per_look(self) -> float:
        """``1 - (1 - confidence) / K`` for K planned looks (Bonferroni)."""
        return 1.0 - (1.0 - self.confidence) / len(self.looks)

    def analyse(self, baseline: Sequence[float], candidate: Sequence[float]) -> dict:
        """The paired interval at the per-look confidence and its decision, with the plan's figures.

        Returns :func:`paired_ratio_ci`'s keys (``confidence`` := the overall level) plus
        ``confidence_per_look``, ``looks_planned``, ``threshold``, ``decision``. Raises what
        :func:`paired_ratio_ci` raises.
        """
        return self._decide(paired_ratio_ci(baseline, candidate, self.confidence_per_look))

    def analyse_strata(self, strata: Sequence[tuple[Sequence[float], Sequence[float]]]) -> dict:
        """:meth:`analyse` for paired figures in strata (:func:`stratified_ratio_ci`, each stratum
        weighted equally) at the per-look confidence. Raises what :func:`stratified_ratio_ci` raises."""
        return self._decide(stratified_ratio_ci(strata, self.confidence_per_look))

    def _decide(self, ci: dict) -> dict:
        return {
            **ci,
            "confidence": self.confidence,
            "confidence_per_look": self.confidence_per_look,
            "looks_planned": len(self.looks),
            "max_rounds": self.max_rounds,
            "threshold": self.threshold,
            "decision": decision(ci["ratio"], ci["ci_lo"], ci["ci_hi"], self.threshold, self.higher_is_better),
        }

    def stop_reason(self, n_rounds: int, decided: str | None, elapsed_s: float) -> str | None:
        """Why to stop after ``n_rounds`` (one of :data:`STOP_REASONS`), or None to go on.

        Only at a planned look: ``decided`` (``decided`` is faster/slower/equivalent), else
        ``max_rounds``, else ``max_seconds`` once ``elapsed_s`` (seconds of rounds so far) reaches it.
        """
        if n_rounds not in self.looks:
            return None
        if decided in ("faster", "slower", "equivalent"):
            return "decided"
        if n_rounds >= self.max_rounds:
            return "max_rounds"
        if self.max_seconds is not None and elapsed_s >= self.max_seconds:
            return "max_seconds"
        return None


def simulate_sequential(
    plan: SequentialPlan, true_ratio: float, noise: float, n_sims: int = 2000, seed: int = 0
) -> dict[str, float]:
    """Monte Carlo of :class:`SequentialPlan` (no time budget): outcome rates and mean rounds used.

    Each simulated round draws baseline and candidate figures ``x * exp(noise * z)`` with independent
    standard normal ``z`` per impl (``noise``: per-impl, per-round relative noise, e.g. 0.03 for 3%;
    a drift shared by both cancels in the paired ratio, so none is drawn) and the candidate scaled by
    ``true_ratio``. Seeded (numpy ``default_rng(seed)``): the same arguments give the same rates.
    Returns ``{decision: rate for each of DECISIONS, "mean_rounds": ..., "n_sims": ...}``.
    """
    rng = np.random.default_rng(seed)
    n = plan.max_rounds
    d = math.log(true_ratio) + noise * (rng.standard_normal((n_sims, n)) - rng.standard_normal((n_sims, n)))
    out = np.full(n_sims, "", dtype=object)
    used = np.zeros(n_sims)
    q = plan.confidence_per_look
    t_thr = math.log1p(-plan.threshold) if plan.threshold < 1 else -math.inf
    u_thr = math.log1p(plan.threshold)
    cs, cs2 = np.cumsum(d, axis=1), np.cumsum(d * d, axis=1)
    for k in plan.looks:
        open_ = out == ""
        if not open_.any():
            break
        m = cs[:, k - 1] / k
        var = np.maximum(cs2[:, k - 1] - k * m * m, 0.0) / (k - 1)
        h = float(_st.t.ppf(0.5 + q / 2, k - 1)) * np.sqrt(var / k)
        lo, hi = m - h, m + h
        dec = np.where(
            hi < t_thr,
            "faster",
            np.where(lo > u_thr, "slower", np.where((lo >= t_thr) & (hi <= u_thr), "equivalent", "")),
        )
        if plan.higher_is_better:
            dec = np.where(dec == "faster", "slower", np.where(dec == "slower", "faster", dec))
        if k == plan.max_rounds:
            dec = np.where(dec == "", "inconclusive", dec)
        stop = open_ & (dec != "")
        out[stop] = dec[stop]
        used[stop] = k
    rates = {x: float(np.mean(out == x)) for x in DECISIONS}
    return {**rates, "mean_rounds": float(used.mean()), "n_sims": n_sims}


def fit_step_model(batch: Sequence[float], step_ms: Sequence[float]) -> dict[str, float | int | bool]:
    """Least-squares fit of ``step_ms = a_ms + b_ms_per_req * batch`` with the intercept held ``a_ms >= 0``.

    Args: batch sizes (requests) and step times (ms), equal-length 1-D sequences. A decode step at
    batch 0 cannot take negative time, yet noisy points (a CPU run's few levels) can pull the
    unconstrained line's intercept below zero. The fit is non-negative least squares on the intercept:
    the unconstrained line when its intercept is >= 0; otherwise the constrained optimum lies on the
    boundary ``a = 0`` (a convex quadratic with one linear inequality, the one-constraint case of the
    active-set NNLS method of Lawson & Hanson, "Solving Least Squares Problems", Prentice-Hall 1974,
    ch. 23), so the line is refitted through the origin, ``b = sum(x*y) / sum(x*x)``, and
    ``intercept_clamped`` is True. The slope is not constrained.

    Returns ``{"a_ms", "b_ms_per_req", "r2", "n_points", "intercept_clamped"}``; r2 is of the line
    returned (1.0 for a perfect fit, and when all step times are equal and fitted exactly; it can be
    below 0 for a clamped line that fits worse than the mean). Raises ``KernelcampError`` with unequal
    lengths or fewer than 2 distinct batch sizes.
    """
    x = np.asarray(batch, dtype=np.float64)
    y = np.asarray(step_ms, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise KernelcampError(f"step model needs equal-length lists, got {x.shape} and {y.shape}")
    if np.unique(x).size < 2:
        raise KernelcampError(f"step model needs at least 2 distinct batch sizes, got {sorted(set(x.tolist()))}")
    b, a = np.polyfit(x, y, 1)
    clamped = bool(a < 0)
    if clamped:
        a, b = 0.0, float((x * y).sum() / (x * x).sum())
    pred = a + b * x
    ss_res = float(((y - pred) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res < 1e-12 else 0.0)
    return {"a_ms": float(a), "b_ms_per_req": float(b), "r2": r2, "n_points": int(x.size), "intercept_clamped": clamped}

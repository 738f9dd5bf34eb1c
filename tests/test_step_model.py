"""The serving step model: a + b*batch fitted to per-batch-size medians of the server's decode steps."""

from __future__ import annotations

import numpy as np

from kernelcamp.bench.serving import step_model_from_steps


def _steps(rng: np.random.Generator) -> list[dict]:
    steps = []
    for b in (1, 8, 48, 64, 96):  # steady batch sizes of the levels: many steps each
        for _ in range(200):
            # step time = 1.0 + 0.05 * batch, with symmetric per-step jitter (host scheduling)
            steps.append({"kind": "decode", "batch": b, "step_ms": 1.0 + 0.05 * b + rng.uniform(-1.5, 1.5)})
    steps.append({"kind": "decode", "batch": 63, "step_ms": 30.0})  # a transitional size while a level drains
    steps.append({"kind": "prefill", "batch": 4, "step_ms": 50.0})
    return steps


def test_fit_uses_medians_so_jitter_does_not_hide_the_line() -> None:
    fit = step_model_from_steps(_steps(np.random.default_rng(0)))
    assert abs(fit["a_ms"] - 1.0) < 0.2 and abs(fit["b_ms_per_req"] - 0.05) < 0.004
    # Jitter of +-1.5 ms on single steps gives a low R^2 over all steps; the model itself is linear.
    assert fit["r2"] > 0.99 and fit["r2_all_steps"] < fit["r2"]
    assert fit["batch_sizes_fitted"] == [1, 8, 48, 64, 96] and fit["batch_sizes_left_out"] == [63]
    assert fit["n_points"] == 1001


def test_fewer_than_two_steady_batch_sizes_is_skipped_with_reason() -> None:
    fit = step_model_from_steps([{"kind": "decode", "batch": 4, "step_ms": 1.0}] * 10)
    assert "skipped" in fit and "fewer than 2" in fit["skipped"]


def test_two_batch_sizes_give_no_r2() -> None:
    """A CPU run (levels 1 and 4) reported R^2 1.0000 for a line through two points."""
    steps = [{"kind": "decode", "batch": b, "step_ms": 1.0 + b} for b in (1, 4) for _ in range(10)]
    fit = step_model_from_steps(steps)
    assert fit["r2"] is None and "2 batch sizes" in fit["r2_note"]
    assert abs(fit["a_ms"] - 1.0) < 1e-9 and abs(fit["b_ms_per_req"] - 1.0) < 1e-9

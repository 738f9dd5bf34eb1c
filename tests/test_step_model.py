"""The serving step model: a + b*batch fitted to per-batch-size medians of the server's decode steps."""

from __future__ import annotations

from pathlib import Path

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


def test_negative_intercept_is_held_at_zero_and_the_plot_stays_above_zero(monkeypatch, tmp_path) -> None:
    """A CPU run's step model printed a negative intercept and drew the line below zero."""
    from kernelcamp import report as kr
    from kernelcamp.stats import fit_step_model

    batch, step_ms = [1, 4, 8], [0.5, 4.5, 8.6]
    assert np.polyfit(batch, step_ms, 1)[1] < 0  # the unconstrained least-squares intercept: -0.45 ms
    fit = fit_step_model(batch, step_ms)
    assert fit["a_ms"] == 0.0 and fit["intercept_clamped"] is True
    x, y = np.asarray(batch, float), np.asarray(step_ms, float)
    assert fit["b_ms_per_req"] == (x * y).sum() / (x * x).sum()  # least squares through the origin
    assert fit_step_model([1, 8, 16], [19.0, 26.5, 35.0])["intercept_clamped"] is False

    steps = [
        {"kind": "decode", "batch": b, "step_ms": s} for b, s in zip(batch, step_ms, strict=True) for _ in range(6)
    ]
    sm = step_model_from_steps(steps)
    assert sm["a_ms"] == 0.0
    fix = kr.load_inputs(
        {
            n: Path(__file__).parent / "fixtures" / "report" / f"{n}.json"
            for n in ("build", "deploy", "benchmark", "verify")
        }
    )
    fix["benchmark"]["serving"]["step_models"] = {"candidate": sm, "baseline": sm}
    drawn = {}
    save = kr._save_plot

    def spy(fig, ax, out_dir, name, made, legend_fontsize=None):
        drawn[name] = ([min(line.get_ydata()) for line in ax.get_lines()], ax.get_ylim())
        save(fig, ax, out_dir, name, made, legend_fontsize)

    monkeypatch.setattr(kr, "_save_plot", spy)
    kr.make_plots(fix, tmp_path)
    lows, ylim = drawn["step_model"]
    assert lows and min(lows) >= 0 and ylim[0] == 0
    md = "\n".join(kr.serving_markdown(fix["benchmark"]["serving"], {}, "plots", 0.02))
    assert "`step_ms = 0.000 + " in md and "intercept held at 0" in md

"""Flat serving figures for the benchmark stage's metrics file and its per-concurrency CSV."""

from __future__ import annotations

from typing import Any

from kernelcamp.stats import DECISION_CODES


def serving_metrics(serving: dict) -> dict:
    """Flat, numeric serving figures for benchmark_metrics.json (units in the names); None left out.

    The A/B ratios are of ``steady_output_tok_s`` (tokens inside the measured steady-state window /
    window seconds, kernelcamp.serving.loadgen.run_window), which is what the serving A/B pairs;
    ``output_tok_s`` (DESIGN.md: ok tokens / wall, ramp and drain included) is reported per impl."""
    m: dict[str, Any] = {}
    ab = serving.get("ab") or {}
    if "baseline_measured" in serving:
        m["serving_baseline_measured"] = int(bool(serving["baseline_measured"]))
    for e in ab.get("per_level") or []:
        c = e["concurrency"]
        m[f"serving_c{c}_valid"] = int(bool(e.get("valid")))
        for impl in ("baseline", "candidate"):
            a = e.get(impl) or {}
            for f in (
                "steady_output_tok_s",
                "output_tok_s",
                "per_request_tok_s",
                "ttft_ms_p50",
                "tpot_ms_p50",
                "e2e_ms_p50",
            ):
                m[f"serving_c{c}_{f}_{impl}"] = a.get(f)
        m[f"serving_c{c}_ratio_steady_output_tok_s"] = e.get("ratio")
        m[f"serving_c{c}_ratio_steady_output_tok_s_ci_lo"] = e.get("ci_lo")
        m[f"serving_c{c}_ratio_steady_output_tok_s_ci_hi"] = e.get("ci_hi")
        m[f"serving_c{c}_ratio_half_width"] = e.get("half_width")
        m[f"serving_c{c}_decision_code"] = DECISION_CODES.get(e.get("decision"))
    o = ab.get("overall") or {}
    m["serving_ratio_steady_output_tok_s"] = o.get("ratio")
    m["serving_ratio_steady_output_tok_s_ci_lo"] = o.get("ci_lo")
    m["serving_ratio_steady_output_tok_s_ci_hi"] = o.get("ci_hi")
    m["serving_ratio_half_width"] = o.get("half_width")
    m["serving_repeats_used"] = o.get("n_repeats")
    m["serving_decision_code"] = DECISION_CODES.get(o.get("decision"))  # kernelcamp.stats.DECISION_CODES
    for impl, sm in (serving.get("step_models") or {}).items():
        for f in ("a_ms", "b_ms_per_req", "r2"):
            m[f"serving_step_{f}_{impl}"] = (sm or {}).get(f)
    return {k_: v for k_, v in m.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def serving_summary(serving: dict, device: str) -> list[dict]:
    """Wide rows per concurrency (ascending): both impls' output tok/s, the ratio and its CI."""
    out = []
    for e in sorted((serving.get("ab") or {}).get("per_level") or [], key=lambda e: e["concurrency"]):
        out.append(
            {
                "concurrency": e["concurrency"],
                "baseline_output_tok_s": (e.get("baseline") or {}).get("output_tok_s"),
                "candidate_output_tok_s": (e.get("candidate") or {}).get("output_tok_s"),
                "ratio": e.get("ratio"),
                "ci_lo": e.get("ci_lo"),
                "ci_hi": e.get("ci_hi"),
                "half_width": e.get("half_width"),
                "decision": e.get("decision"),
                "valid": e.get("valid"),
                "device": device,
            }
        )
    return out or [
        {
            "concurrency": None,
            "baseline_output_tok_s": None,
            "candidate_output_tok_s": None,
            "ratio": None,
            "ci_lo": None,
            "ci_hi": None,
            "valid": None,
            "device": device,
            "skipped": serving.get("skipped") or "no A/B levels",
        }
    ]

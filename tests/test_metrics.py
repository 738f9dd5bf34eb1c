"""The metrics split (issue 15): a small headline reports/metrics.json is the only DVC metrics file,
the detail files are plain outputs; the headline's figures and the levels they are taken at."""

import copy
from pathlib import Path

import pytest
import yaml

from kernelcamp import metrics as km
from kernelcamp import report as kr

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "report"
DETAIL = ("reports/benchmark_metrics.json", "reports/build_metrics.json", "reports/verify.json")


def _data():
    return kr.load_inputs({n: FIX / f"{n}.json" for n in ("build", "deploy", "benchmark", "verify")})


def _outs(st, kind):
    return {
        next(iter(o)) if isinstance(o, dict) else o: (next(iter(o.values())) if isinstance(o, dict) else {})
        for o in st.get(kind) or []
    }


def test_the_headline_is_the_only_dvc_metrics_file_and_the_detail_are_plain_outs():
    """`dvc exp show --only-changed` was 111 columns: every figure of three metrics files."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    metrics = {name: _outs(st, "metrics") for name, st in stages.items() if st.get("metrics")}
    assert list(metrics) == ["report"] and list(metrics["report"]) == ["reports/metrics.json"]
    assert metrics["report"]["reports/metrics.json"] == {"cache": False, "persist": True}
    assert "--metrics reports/metrics.json" in " ".join(stages["report"]["cmd"].split())
    outs = {p: o for st in stages.values() for p, o in _outs(st, "outs").items()}
    for path in DETAIL:
        assert outs.get(path) == {"cache": False, "persist": True}, path


def test_headline_takes_the_largest_batch_and_the_highest_valid_level():
    d = copy.deepcopy(_data())
    bench = d["benchmark"]
    m = kr.headline_metrics(d, 0.02)
    b_max = max(bench["kernel"]["batch"], key=int)
    assert m["cpu.kernel.candidate.batch"] == int(b_max)
    assert m["cpu.kernel.candidate.latency_us_p50"] == bench["kernel"]["batch"][b_max]["candidate"]["latency_us_p50"]
    top = max(bench["serving"]["levels"], key=lambda lv: lv["concurrency"])
    assert m["cpu.serving.candidate.concurrency"] == top["concurrency"]
    assert m["cpu.serving.candidate.output_tok_s"] == top["output_tok_s"]
    # the highest level went invalid: the headline falls back to the highest valid one, never the invalid figure
    top.update(valid=False, requests_failed=1)
    m2 = kr.headline_metrics(d, 0.02)
    below = max((lv for lv in bench["serving"]["levels"] if lv is not top), key=lambda lv: lv["concurrency"])
    assert m2["cpu.serving.candidate.concurrency"] == below["concurrency"]
    assert m2["cpu.serving.candidate.output_tok_s"] == below["output_tok_s"] != top["output_tok_s"]
    assert m["verify.passed"] == 1 and m["cpu.kernel.decision"] == 0  # CPU timings decide nothing


def test_headline_on_a_gpu_carries_both_decisions_intervals_and_resolutions():
    d = copy.deepcopy(_data())
    b = d["benchmark"]
    b.update(device="cuda", gpu="NVIDIA H200")
    b["serving"]["attention_impl"] = "triton"  # a GPU server runs the variant's kernel
    b["serving"]["scaled_for_cpu"] = False  # and its plan was a GPU's
    b["kernel"]["overall"] = {"ratio": 1.10, "ci_lo": 1.09, "ci_hi": 1.11, "n_rounds": 10, "confidence": 0.95}
    fig = {"output_tok_s": 100.0, "steady_output_tok_s": 100.0, "requests_ok": 8, "requests_failed": 0}
    lv = {"concurrency": 4, "valid": True, "baseline": dict(fig), "candidate": dict(fig), "n_pairs": 3}
    over = {"ratio": 0.9, "ci_lo": 0.85, "ci_hi": 0.95, "half_width": 0.05, "decision": "slower", "threshold": 0.02}
    b["serving"]["ab"] = {"per_level": [lv], "overall": over}
    m = kr.headline_metrics(d, 0.02)
    assert not any(k.startswith("cpu.") for k in m)
    assert (m["kernel.decision"], m["kernel.ratio"], m["kernel.resolution"]) == (1, 1.10, pytest.approx(0.01))
    assert (m["serving.decision"], m["serving.ratio"], m["serving.ci_lo"], m["serving.ci_hi"]) == (1, 0.9, 0.85, 0.95)
    assert m["serving.resolution"] == 0.05 and m["serving.candidate.output_tok_s"] == 100.0


def test_nest_and_flatten_are_inverse_and_refuse_keys_off_the_scheme():
    flat = {"cpu.kernel.ratio": 1.0, "cpu.kernel.b8.ab.ci_lo": 0.9, "verify.passed": 1, "build.candidate.n_fit": 2}
    assert km.flatten(km.nest(flat)) == flat
    assert km.nest({"kernel.ratio": None, "verify.passed": float("nan")}) == {}  # a missing figure is left out
    for bad in ("kernel_cpu.ratio", "serving_cpu_c1_output_tok_s_candidate", "cpu.verify.passed", "Kernel.ratio"):
        with pytest.raises(ValueError, match="naming scheme"):
            km.nest({bad: 1.0})


def test_detail_files_use_the_scheme_with_cpu_timings_under_cpu():
    import stages.build as sb
    from kernelcamp.bench.record import benchmark_metrics

    d = _data()
    bench = km.flatten(benchmark_metrics(d["benchmark"]["kernel"], d["benchmark"]["serving"], "cpu"))
    build = km.flatten(sb.metrics(d["build"]))
    for k in [*bench, *build]:
        assert km.KEY_RE.fullmatch(k), k
    assert bench["device.is_gpu"] == 0 and "cpu.kernel.b1.baseline.latency_us_p50" in bench
    assert not [k for k in bench if k.split(".")[0] in km.TIMED_GROUPS]  # no CPU timing under a GPU name
    assert build["build.candidate.sm120.n_fit"] == d["build"]["roles"]["variant"]["targets"]["sm120"]["n_fit"]
    assert build["build.baseline.sm120.n_pruned"] == len(d["build"]["roles"]["baseline"]["targets"]["sm120"]["pruned"])
    gpu_served = {**d["benchmark"]["serving"], "scaled_for_cpu": False}  # a GPU machine's own server
    gpu = km.flatten(benchmark_metrics(d["benchmark"]["kernel"], gpu_served, "cuda"))
    assert {k.removeprefix("cpu.") for k in bench} == set(gpu) and gpu["device.is_gpu"] == 1

"""Report from fixture records (a real CPU run of 2026-11-29): markdown, plots, MLflow figures,
CPU labelling, invalid serving levels, and the report stage's all-or-nothing behaviour."""

import copy
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kernelcamp import report as kr
from kernelcamp.bench.record import benchmark_metrics
from kernelcamp.errors import KernelcampError
from kernelcamp.metrics import flatten

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "report"


def _data():
    return kr.load_inputs({n: FIX / f"{n}.json" for n in ("build", "deploy", "benchmark", "verify")})


def _as_gpu(data, slowdown=1.0):
    """The fixture turned into a GPU-looking record with a planted candidate slowdown."""
    d = copy.deepcopy(data)
    b = d["benchmark"]
    b.update(device="cuda", gpu="NVIDIA H200")
    b["serving"]["attention_impl"] = "triton"  # a GPU server runs the variant's kernel
    b["serving"]["scaled_for_cpu"] = False  # and its plan was a GPU's
    b["kernel"]["overall"] = {
        "ratio": slowdown,
        "ci_lo": slowdown - 0.01,
        "ci_hi": slowdown + 0.01,
        "n_rounds": 60,
        "confidence": 0.95,
    }
    return d


def test_recorded_sequential_decision_is_reported_with_resolution_rounds_and_stop_reason():
    d = _as_gpu(_data(), 1.10)
    o = d["benchmark"]["kernel"]["overall"]
    o.update(
        decision="slower",
        threshold=0.02,
        half_width=0.01,
        n_rounds=10,
        max_rounds=60,
        stop_reason="decided",
        confidence_per_look=1 - 0.05 / 11,
    )
    h = kr.headline(d, 0.02)
    assert (h["decision"], h["n_rounds"], h["stop_reason"]) == ("slower", 10, "decided")
    md = kr.render_markdown(d, {}, 0.02)
    assert "**slower**: latency ratio candidate/baseline 1.1000, 99.55% CI [1.0900, 1.1100]" in md
    assert "resolution: could detect \u00b11.0%; 10 rounds used of at most 60, stopped: decided" in md
    m = kr.headline_metrics(d, 0.02)
    assert m["kernel.decision"] == 1 and m["kernel.resolution"] == 0.01
    detail = flatten(benchmark_metrics(d["benchmark"]["kernel"], d["benchmark"]["serving"], "cuda"))
    assert detail["kernel.ab.rounds_used"] == 10 and detail["kernel.ab.stopped_early"] == 1
    # a report at another threshold than the run stopped at recomputes from the interval
    assert kr.headline(d, 0.2)["decision"] == "equivalent"


def test_serving_per_level_decisions_in_report_and_plot(tmp_path):
    d = _as_gpu(_data(), 1.0)
    sv = d["benchmark"]["serving"]
    fig = {"output_tok_s": 100.0, "steady_output_tok_s": 90.0, "requests_ok": 8, "requests_failed": 0}
    lv = [
        {"concurrency": 4, "ratio": 1.10, "ci_lo": 1.05, "ci_hi": 1.15, "half_width": 0.05, "decision": "faster"},
        {"concurrency": 1, "ratio": 1.0, "ci_lo": 0.99, "ci_hi": 1.01, "half_width": 0.01, "decision": "equivalent"},
    ]
    for e in lv:
        e.update(valid=True, n_pairs=3, baseline=dict(fig), candidate=dict(fig), threshold=0.02)
    sv["ab"] = {"metric": "steady_output_tok_s", "per_level": lv, "overall": {"ratio": None}}
    plots = kr.make_plots(d, tmp_path / "plots")
    assert "serving_ratio" in plots and (tmp_path / "plots" / plots["serving_ratio"]).stat().st_size > 1000
    md = kr.render_markdown(d, plots, 0.02)
    assert "| concurrency | ratio cand./base. (steady tok/s) | CI | decision | resolution | pairs |" in md
    assert "| 4 | 1.1000 | [1.0500, 1.1500]" in md and "| faster | +-5.0% | 3 |" in md
    assert "| equivalent | +-1.0% | 3 |" in md and "![serving ratio per level]" in md
    # the level table gives each impl's steady tok/s beside its whole-run output tok/s and says which one the ratio
    # compares (it put the steady ratio beside the whole-run figures alone)
    assert "| output tok/s | steady tok/s |" in md and "ratio cand./base. (steady tok/s) | CI |" in md
    assert "| 8 / 0 / 0 | 100 | 90 |" in md and "the geometric mean of the repeats' paired" in md
    # the multiplicity note counts this run's detail decisions (it said "8 batch sizes" whatever ran)
    n_batch = len(d["benchmark"]["kernel"]["batch"])
    assert f"with {n_batch} batch sizes and 2 serving levels here" in md
    assert f"up to about {n_batch + 2} times as often" in md
    detail = flatten(benchmark_metrics(d["benchmark"]["kernel"], sv, "cuda"))
    codes = {c: detail[f"serving.c{c}.ab.decision"] for c in (4, 1)}
    assert codes == {4: -1, 1: 2}  # faster, equivalent


def _serving_ab(d, levels_threshold):
    fig = {"output_tok_s": 100.0, "steady_output_tok_s": 100.0, "requests_ok": 8, "requests_failed": 0}
    lv = [{"concurrency": 4, "ratio": 0.908, "ci_lo": 0.6788, "ci_hi": 1.2145, "half_width": 0.268}]
    lv[0].update(valid=True, n_pairs=2, baseline=dict(fig), candidate=dict(fig), decision="inconclusive")
    if levels_threshold is not None:
        lv[0]["threshold"] = levels_threshold
    o = {"ratio": 0.95, "ci_lo": 0.8, "ci_hi": 1.1, "half_width": 0.15, "decision": "inconclusive", "threshold": 0.02}
    d["benchmark"]["serving"]["ab"] = {"metric": "steady_output_tok_s", "per_level": lv, "overall": {**o, "n_pairs": 2}}
    return d


@pytest.mark.parametrize("levels_threshold", [None, 0.02])
def test_serving_levels_are_decided_at_the_reports_threshold(tmp_path, monkeypatch, levels_threshold):
    """`-S report.threshold=0.5`: the headline said equivalent at 50%, while the per-level table kept the
    benchmark's 2% decision (its levels recorded no threshold, taken as "made at this one") and the plot's
    title, dashed lines and labels stayed at 2%."""
    d = _serving_ab(_as_gpu(_data(), 1.0), levels_threshold)
    seen = {}
    real = kr._save_plot

    def spy(fig, ax, out_dir, name, *a, **kw):
        seen[name] = (ax.get_title(), [t.get_text() for t in ax.texts], sorted(ln.get_ydata()[0] for ln in ax.lines))
        return real(fig, ax, out_dir, name, *a, **kw)

    monkeypatch.setattr(kr, "_save_plot", spy)
    plots = kr.make_plots(d, tmp_path / "plots", 0.5)
    title, labels, ys = seen["serving_ratio"]
    assert "threshold 50.0%" in title and labels == ["equivalent"]
    assert {0.5, 1.5} <= set(ys) and not {0.98, 1.02} & set(ys)  # the dashed lines at 1 -+ 50%
    md = kr.render_markdown(d, plots, 0.5)
    assert "| 4 | 0.9080 | [0.6788, 1.2145]" in md and "| equivalent | +-26.8% | 2 |" in md
    assert "**Serving A/B:** **equivalent**" in md
    assert kr.headline_metrics(d, 0.5)["serving.decision"] == 2
    # at the benchmark's own threshold the recorded decision stands
    assert "| inconclusive | +-26.8% | 2 |" in kr.render_markdown(d, plots, 0.02)


def test_a_serving_ab_whose_servers_ran_no_variant_kernel_decides_nothing(tmp_path):
    """On a CPU both servers run the torch reference attention (the variants differ only in kernel
    configs): a serving interval there measured noise, and the report called it equivalent or faster."""
    d = _serving_ab(_data(), 0.02)
    assert d["benchmark"]["serving"]["attention_impl"] == "torch_reference_cpu"
    for e in (d["benchmark"]["serving"]["ab"]["per_level"][0], d["benchmark"]["serving"]["ab"]["overall"]):
        e.update(ratio=1.0, ci_lo=0.99, ci_hi=1.01, half_width=0.01, decision="equivalent")
    md = kr.render_markdown(d, kr.make_plots(d, tmp_path / "plots", 0.02), 0.02)
    assert (
        "**Serving A/B:** **inconclusive** (both servers ran the torch_reference_cpu attention, not the "
        "variants' kernels)" in md
    )
    assert "| 4 | 1.0000 | [0.9900, 1.0100]" in md and "| inconclusive | +-1.0% | 2 |" in md
    assert kr.headline_metrics(d, 0.02)["cpu.serving.decision"] == 0


def test_cpu_report_is_labelled_and_complete(tmp_path):
    data = _data()
    plots = kr.make_plots(data, tmp_path / "plots")
    assert set(plots) == {"kernel_latency", "serving_throughput", "step_model"}
    assert all((tmp_path / "plots" / f).stat().st_size > 1000 for f in plots.values())
    md = kr.render_markdown(data, plots, 0.02)
    assert "**CPU run.**" in md and "(CPU interpreter timings decide nothing" in md
    assert "**inconclusive**" in md and "95.00% CI [" in md and "threshold 2.0%" in md
    assert "resolution: could detect \u00b1" in md and "6 rounds used" in md
    assert "PRUNED on sm120" in md  # the story's BLOCK_T=32 configs, named loudly
    # the title names each side's config, so that `-S variant.num_warps=8` shows there too
    assert md.startswith("# kernelcamp report: bt16_w8 [T16_H16_w8_s2_kauto] vs story_autotune [3 configs]\n")
    for needle in ("deploy id (benchmark)", "measured_at", "kernel source hash", "step_ms = ", "Attention's measured"):
        assert needle in md, needle
    # whether the deploy started the candidate's server or reused a running one (helper audit R8)
    assert "| candidate server | started by this run's deploy, running since 2026-11-29T" in md
    # what ran, from the record: the interpreter's fp16 dots at a small shape, not the params' GPU settings (R6)
    assert "Measured: deepseek_v4 (H 16, top-k 64, page size 64, cache tokens 512), the kernel's dots in fp16, " in md
    from stages.report import measured_tags

    tags = measured_tags(data["benchmark"])
    assert tags["measured_dot_dtype"] == "fp16" and tags["measured_rounds"] == "6"
    assert tags["measured_serving_plan"].startswith("max_tokens=8 "), tags
    keys = set(kr.headline_metrics(data, 0.02))
    assert "cpu.kernel.ratio" in keys and "cpu.serving.candidate.output_tok_s" in keys
    assert not any(k.startswith(("kernel.", "serving.", "step_model.")) for k in keys)  # CPU timings: cpu.*
    detail = flatten(benchmark_metrics(data["benchmark"]["kernel"], data["benchmark"]["serving"], "cpu"))
    assert "cpu.step_model.candidate.a_ms" in detail and detail["device.is_gpu"] == 0
    assert not any(k.startswith(("kernel.", "serving.", "step_model.")) for k in detail)


def test_a_cpu_servers_figures_are_cpu_figures_on_a_gpu_machine_too(tmp_path):
    """`-S server.device=cpu` on a GPU machine: the serving figures (a CPU server's tok/s) were named as GPU
    figures (`serving.*`, no `cpu.`) beside the GPU's kernel figures, and the serving plots lacked "(CPU)"."""
    d = _as_gpu(_data(), 1.0)
    b = d["benchmark"]
    b["serving"]["scaled_for_cpu"] = True  # the serving plan saw a server on a CPU
    keys = set(kr.headline_metrics(d, 0.02))
    assert "kernel.ratio" in keys and "cpu.serving.candidate.output_tok_s" in keys, sorted(keys)
    assert not any(k.startswith(("serving.", "step_model.", "cpu.kernel.")) for k in keys), sorted(keys)
    detail = flatten(benchmark_metrics(b["kernel"], b["serving"], "cuda"))
    assert detail["device.is_gpu"] == 1 and any(k.startswith("kernel.") for k in detail)
    assert "cpu.step_model.candidate.a_ms" in detail
    assert not any(k.startswith(("serving.", "step_model.", "cpu.kernel.")) for k in detail), sorted(detail)
    b["serving"]["scaled_for_cpu"] = False  # a GPU server: GPU names
    assert "serving.candidate.output_tok_s" in set(kr.headline_metrics(d, 0.02))


@pytest.mark.parametrize(
    "ratio,expect", [(1.10, "slower"), (0.90, "faster"), (1.005, "equivalent"), (1.02, "inconclusive")]
)
def test_decision_from_the_interval_and_threshold(ratio, expect):
    d = _as_gpu(_data(), ratio)
    assert kr.headline(d, 0.02)["decision"] == expect
    md = kr.render_markdown(d, {}, 0.02)
    assert f"**{expect}**" in md and "CPU run" not in md
    assert kr.headline_metrics(d, 0.02)["kernel.ratio"] == ratio
    detail = flatten(benchmark_metrics(d["benchmark"]["kernel"], d["benchmark"]["serving"], "cuda"))
    for b in d["benchmark"]["kernel"]["batch"]:  # per batch size: its own key
        assert (
            detail[f"kernel.b{b}.candidate.latency_us_p50"]
            == d["benchmark"]["kernel"]["batch"][b]["candidate"]["latency_us_p50"]
        )


def test_invalid_serving_level_is_never_a_plain_number():
    d = _data()
    lv = d["benchmark"]["serving"]["levels"][-1]
    lv.update(valid=False, requests_failed=2)
    md = kr.render_markdown(d, {}, 0.02)
    assert "INVALID" in md and "~~" in md
    m = kr.headline_metrics(d, 0.02)  # the headline throughput comes from a valid level only
    assert m["cpu.serving.candidate.concurrency"] != lv["concurrency"]
    assert m["cpu.serving.candidate.output_tok_s"] != lv["output_tok_s"]


def test_missing_or_broken_inputs_are_one_clear_error(tmp_path):
    for n in ("build", "deploy", "verify"):
        shutil.copy(FIX / f"{n}.json", tmp_path / f"{n}.json")
    paths = {n: tmp_path / f"{n}.json" for n in ("build", "deploy", "benchmark", "verify")}
    with pytest.raises(KernelcampError, match="benchmark record not found"):
        kr.load_inputs(paths)
    (tmp_path / "benchmark.json").write_text(json.dumps({"measured_at": "x"}))
    with pytest.raises(KernelcampError, match="lacks"):
        kr.load_inputs(paths)


@pytest.mark.parametrize(
    "edit, want",
    [
        (lambda d: d.update(kernel="x"), 'kernel is "x", expected an object'),
        (lambda d: d["kernel"].update(overall=None), "kernel.overall is null, expected an object"),
        (lambda d: d["kernel"].update(batch=[1, 2]), "kernel.batch is [1, 2], expected an object"),
        (lambda d: d.update(serving="x"), 'serving is "x", expected an object'),
        (lambda d: d["variants"].update(candidate=None), "variants.candidate is null, expected an object"),
        (lambda d: d["serving"].update(ab="x"), 'serving.ab is "x", expected an object'),
        # accepted before: a report of no serving levels, and a FINISHED run
        (lambda d: d["serving"].update(levels=None), "serving.levels is null, expected an array"),
    ],
)
def test_a_benchmark_record_edited_by_hand_is_one_line(tmp_path, edit, want):
    """A benchmark.json that is valid JSON with a container of another type: the report gave a traceback
    (AttributeError, IndexError, TypeError) or, for serving.levels = null, a report of no serving levels (helper-53).
    load_inputs names the path, the value and what the stage writes there."""
    for n in ("build", "deploy", "benchmark", "verify"):
        shutil.copy(FIX / f"{n}.json", tmp_path / f"{n}.json")
    rec = json.loads((FIX / "benchmark.json").read_text())
    edit(rec)
    (tmp_path / "benchmark.json").write_text(json.dumps(rec))
    paths = {n: tmp_path / f"{n}.json" for n in ("build", "deploy", "benchmark", "verify")}
    with pytest.raises(KernelcampError) as e:
        kr.load_inputs(paths)
    msg = str(e.value)
    assert want in msg and "\n" not in msg and msg.startswith(f"benchmark record at {paths['benchmark']}: "), msg
    assert msg.endswith("rerun `dvc repro benchmark` instead of editing it")


def test_every_committed_record_has_the_shapes_the_report_checks():
    """The shape check refuses no record a stage wrote: the campaigns' committed GPU and CPU records all pass it."""
    checked = 0
    for d in sorted((ROOT / "reports" / "campaigns").glob("*/*/")):
        for name in ("benchmark", "build"):
            p = d / f"{name}.json"
            if p.exists():
                kr._check_shape(name, p, json.loads(p.read_text()))
                checked += 1
    assert checked >= 100  # 112 when written (the campaigns' records of issues 5-14)


def test_an_error_deeper_in_the_records_is_one_line_naming_them():
    """What load_inputs does not check (a value's type deeper down: kernel.overall.ratio = "fast" gave "ValueError:
    Unknown format code 'f'") is one KernelcampError from the rendering, naming the records and where."""
    data = _data()
    data["benchmark"]["kernel"]["overall"]["ratio"] = "fast"
    paths = {"benchmark": "reports/benchmark.json", "verify": "reports/verify.json"}
    with pytest.raises(KernelcampError) as e, kr.reading_records(paths):
        kr.render_markdown(data, {}, 0.02, "plots")
    msg = str(e.value)
    assert msg.startswith("the stage records (reports/benchmark.json, reports/verify.json) are not as their stages")
    assert "ValueError: " in msg and "(at report.py:" in msg and "rerun the pipeline (dvc exp run)" in msg, msg
    with pytest.raises(KernelcampError, match="^as it was$"), kr.reading_records(paths):  # passes unchanged
        raise KernelcampError("as it was")
    with pytest.raises(ZeroDivisionError), kr.reading_records(paths):  # not a record's contents: a bug, raised
        _ = 1 / 0


def test_report_stage_refuses_a_record_its_rendering_cannot_read(tmp_path):
    """The stage: one line, exit 2, no report.md, no metrics.json, no FINISHED run."""
    r = _stage(tmp_path, {}, edit=lambda d: d["kernel"]["overall"].update(ratio="fast"))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the stage records (reports/build.json"), r.stderr
    assert not (tmp_path / "reports" / "report.md").exists() and not (tmp_path / "reports" / "metrics.json").exists()
    from mlflow.tracking import MlflowClient

    c = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = c.get_experiment_by_name("kernelcamp")
    runs = c.search_runs([exp.experiment_id]) if exp else []
    assert all(x.info.status == "FAILED" for x in runs), [x.info.status for x in runs]


def test_report_stage_refuses_a_record_edited_after_its_stage(tmp_path):
    """helper-59 set benchmark.json's overall ratio and interval to 0.5 [0.49, 0.51] and ran `dvc repro -s report`:
    the report, metrics.json and a FINISHED MLflow run said 0.5, where the rounds in the same file gave 1.031. Under
    DVC the record's bytes must be those its stage wrote (dvc.lock): one line naming the file, the stage and the
    command, exit 2, nothing written, no FINISHED run."""

    def edit(d):
        d["kernel"]["overall"].update(ratio=0.5, ci_lo=0.49, ci_hi=0.51)

    r = _stage(tmp_path, {"DVC_STAGE": "report"}, edit=edit, lock=True)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error: reports/benchmark.json is not what the benchmark stage wrote"), lines[0]
    assert "dvc repro -f -s benchmark" in lines[0]
    assert not (tmp_path / "reports" / "report.md").exists() and not (tmp_path / "reports" / "metrics.json").exists()
    from mlflow.tracking import MlflowClient

    c = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = c.get_experiment_by_name("kernelcamp")
    runs = c.search_runs([exp.experiment_id]) if exp else []
    assert all(x.info.status == "FAILED" for x in runs), [x.info.status for x in runs]


def _stamp(path, params, keys, **override):
    """Give a fixture record the run spec's hashes of ``params`` and the params its stage (the file's
    name) read: what the report checks it against."""
    from kernelcamp.spec import parse_spec

    rec = json.loads(path.read_text())
    spec = parse_spec(params)
    rec.update({k: spec.hashes()[k] for k in keys}, stage_params=spec.stage_params(path.stem))
    rec.update(override)
    path.write_text(json.dumps(rec))


def _env(tmp_path, env_extra):
    env = {**os.environ, "DVC_ROOT": str(tmp_path), "PYTHONPATH": str(ROOT), **env_extra}
    if "MLFLOW_TRACKING_URI" not in env_extra:
        env.pop("MLFLOW_TRACKING_URI", None)
    return env


def _artifact_paths(client, run_id, path="reports"):
    out = set()
    for a in client.list_artifacts(run_id, path):
        out |= _artifact_paths(client, run_id, a.path) if a.is_dir else {a.path}
    return out


def _stage(tmp_path, env_extra, override=None, edit=None, lock=False):
    """Run the report stage on the fixture records, stamped for this params.yaml; ``override``: top-level values of a
    record (by record name), ``edit``: a function that edits the stamped benchmark record in place; ``lock``: a
    dvc.lock naming each record as its stage wrote it (before ``edit``), as DVC leaves it."""
    from kernelcamp.spec import BUILD_KEYS, DEPLOY_KEYS, MEASURE_KEYS

    rep = tmp_path / "reports"
    rep.mkdir()
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    keys = {"build": BUILD_KEYS, "deploy": DEPLOY_KEYS, "benchmark": MEASURE_KEYS, "verify": MEASURE_KEYS}
    for n in ("build", "deploy", "benchmark", "verify"):
        shutil.copy(FIX / f"{n}.json", rep / f"{n}.json")
        _stamp(rep / f"{n}.json", params, keys[n], **(override or {}).get(n, {}))
    if lock:
        md5 = {n: hashlib.md5((rep / f"{n}.json").read_bytes()).hexdigest() for n in keys}
        stages = {n: {"cmd": "x", "outs": [{"path": f"reports/{n}.json", "hash": "md5", "md5": md5[n]}]} for n in keys}
        (tmp_path / "dvc.lock").write_text(yaml.safe_dump({"schema": "2.0", "stages": stages}))
    if edit is not None:
        rec = json.loads((rep / "benchmark.json").read_text())
        edit(rec)
        (rep / "benchmark.json").write_text(json.dumps(rec))
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    env = _env(tmp_path, env_extra)
    cmd = [sys.executable, "-m", "stages.report", "--params", "params.yaml"]
    for n in ("build", "deploy", "benchmark", "verify"):
        cmd += [f"--{n}", f"reports/{n}.json"]
    cmd += ["--out", "reports/report.md", "--plots", "reports/plots", "--metrics", "reports/metrics.json"]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # > 9 s on 2 cores: `make test-slow` (CI runs both)
def test_report_stage_writes_report_and_one_finished_run(tmp_path):
    r = _stage(tmp_path, {})
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "reports" / "report.md").exists() and (tmp_path / "reports" / "plots").is_dir()
    from mlflow.tracking import MlflowClient

    c = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = c.search_runs([c.get_experiment_by_name("kernelcamp").experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.tags["decision"] == "inconclusive" and run.data.tags["device"] == "cpu"
    # the commit that measured (benchmark.json's), not the tree the report ran in (this checkout's): R2
    fixture = json.loads((FIX / "benchmark.json").read_text())
    assert run.data.tags["git_commit"] == fixture["git_commit"] and run.data.tags["git_dirty"] == "True"
    assert run.data.tags["report_git_commit"] not in ("", fixture["git_commit"])
    assert run.data.params["variant.name"] == yaml.safe_load((ROOT / "params.yaml").read_text())["variant"]["name"]
    arts = {a.path for a in c.list_artifacts(run.info.run_id, "reports")}
    assert "reports/report.md" in arts and "reports/benchmark.json" in arts
    # the headline DVC lists, written with the report (nested JSON: DVC shows the dotted keys)
    written = flatten(json.loads((tmp_path / "reports" / "metrics.json").read_text()))
    assert written == kr.headline_metrics(
        kr.load_inputs({n: tmp_path / "reports" / f"{n}.json" for n in kr.REQUIRED}), 0.02
    )
    assert "reports/metrics.json" in arts
    # one naming scheme: the MLflow run logs the keys DVC shows (same values) and the benchmark's
    # detail under the names of benchmark_metrics.json, nothing else, and every key follows the scheme
    from kernelcamp.metrics import KEY_RE

    bench = json.loads((tmp_path / "reports" / "benchmark.json").read_text())
    detail = flatten(benchmark_metrics(bench["kernel"], bench["serving"], bench["device"]))
    assert set(written) <= set(run.data.metrics) and {run.data.metrics[k] for k in written} == set(written.values())
    want = set(written) | set(detail)
    assert set(run.data.metrics) == want, sorted(set(run.data.metrics) ^ want)
    assert all(KEY_RE.match(k) for k in run.data.metrics), sorted(run.data.metrics)
    assert any(".b1." in k and k.endswith("latency_us_p50") for k in run.data.metrics)  # per-batch detail
    # MLflow's compare view matches artifacts by path: a second run in the same workspace (reports/ now
    # holding the first run's report.md, plots/ and metrics.json) logs the same paths
    r2 = subprocess.run(r.args, cwd=tmp_path, env=_env(tmp_path, {}), capture_output=True, text=True, timeout=300)
    assert r2.returncode == 0, r2.stderr
    first, second = sorted(c.search_runs([run.info.experiment_id]), key=lambda x: x.info.start_time)
    # the rerun logged the same measurement again: it says so (helper audit R4)
    assert first.data.tags["measurement_reused"] == "False" and first.data.tags["measurement_logged_by"] == ""
    assert second.data.tags["measurement_reused"] == "True"
    assert second.data.tags["measurement_logged_by"] == first.info.run_id
    assert "**Measurement reused.**" in (tmp_path / "reports" / "report.md").read_text()
    paths = [_artifact_paths(c, x.info.run_id) for x in (first, second)]
    plots = {f"reports/plots/{p.name}" for p in (tmp_path / "reports" / "plots").iterdir()}
    assert plots and {"reports/report.md", "reports/metrics.json"} | plots <= paths[0]
    assert paths[0] == paths[1] and not [p for p in paths[1] if "/." in p]


def test_a_report_of_records_made_with_other_params_is_refused(tmp_path):
    """`make params` (or an edit) then `dvc repro -f -s report`: the report logged cpu_rounds 7 and batch
    sizes [2, 4] beside metrics measured with 3 rounds at [1, 2]; the hashes leave those keys out."""
    from kernelcamp.spec import parse_spec

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    was = parse_spec(params).stage_params("benchmark")
    was["benchmark"]["kernel"]["cpu_rounds"] = params["benchmark"]["kernel"]["cpu_rounds"] + 4
    r = _stage(tmp_path, {}, override={"benchmark": {"stage_params": was}})
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    want = "error: benchmark.json was made with benchmark.kernel.cpu_rounds = "
    assert len(lines) == 1 and lines[0].startswith(want), r.stderr
    assert "rerun the pipeline" in lines[0]
    assert not (tmp_path / "reports" / "report.md").exists() and not (tmp_path / "reports" / "metrics.json").exists()
    from mlflow.tracking import MlflowClient

    c = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = c.get_experiment_by_name("kernelcamp")
    runs = c.search_runs([exp.experiment_id]) if exp else []
    assert all(x.info.status == "FAILED" for x in runs), [x.info.status for x in runs]  # a failure, no result


def test_a_candidate_that_failed_verify_gets_no_decision(tmp_path):
    """verify.json says the candidate's output was wrong (the verify stage failed, then `dvc repro -s report`):
    the report rendered "faster" and logged a FINISHED run for a kernel that computes the wrong thing (helper audit
    R5). It refuses, one line, and writes nothing."""
    r = _stage(tmp_path, {}, override={"verify": {"passed": False, "kernel_passed": False, "kernel_cases_failed": 3}})
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: verify.json: the candidate failed verify"), r.stderr
    assert "kernel" in lines[0] and "verify_details.json" in lines[0]
    assert not (tmp_path / "reports" / "report.md").exists() and not (tmp_path / "reports" / "metrics.json").exists()


def test_report_stage_unreachable_server_leaves_nothing(tmp_path):
    r = _stage(tmp_path, {"MLFLOW_TRACKING_URI": "http://127.0.0.1:9"})
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "unreachable" in lines[0], r.stderr
    assert not (tmp_path / "reports" / "report.md").exists()
    assert not (tmp_path / "reports" / "plots").exists()
    assert not (tmp_path / "reports" / "metrics.json").exists()


@pytest.mark.slow  # > 9 s on 2 cores: `make test-slow` (CI runs both)
def test_report_refuses_a_measurement_of_other_params(tmp_path):
    """A second `dvc exp run` rewrote params.yaml under the first: the FINISHED run recorded
    num_warps=2 while the server it measured ran num_warps=16. The report now checks every record's
    hash against the params it logs, and logs nothing on a mismatch."""
    r = _stage(tmp_path, {}, override={"benchmark": {"variant_hash": "0123456789abcdef"}})
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "benchmark.json has variant_hash 0123456789abcdef but params.yaml gives" in lines[0]
    assert not (tmp_path / "reports" / "report.md").exists()
    assert not (tmp_path / "reports" / "metrics.json").exists()  # a failed report writes no headline either
    from mlflow.tracking import MlflowClient

    c = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = c.search_runs([c.get_experiment_by_name("kernelcamp").experiment_id])
    assert [r.info.status for r in runs] == ["FAILED"]  # the failure is recorded, no FINISHED run


def test_cpu_timings_decide_nothing_even_with_an_interval_clear_of_one():
    """A new user's CPU run said `slower` for num_warps, which the interpreter ignores."""
    d = copy.deepcopy(_data())
    assert kr.is_cpu(d["benchmark"])
    d["benchmark"]["kernel"]["overall"].update(ratio=1.035, ci_lo=1.025, ci_hi=1.05)
    h = kr.headline(d, 0.02)
    assert h["decision"] == "inconclusive" and h["cpu"]
    md = kr.render_markdown(d, {}, 0.02)
    assert "**inconclusive** (CPU interpreter timings decide nothing" in md
    gpu = copy.deepcopy(d)
    gpu["benchmark"]["device"] = "cuda"
    assert kr.headline(gpu, 0.02)["decision"] == "slower"


def test_booleans_read_as_words():
    assert kr._f(True) == "yes" and kr._f(False) == "no" and kr._f(None) == "n/a" and kr._f(0.5) == "0.5"


def _artifact_paths(client, run_id, path="reports"):
    out = set()
    for a in client.list_artifacts(run_id, path):
        out |= _artifact_paths(client, run_id, a.path) if a.is_dir else {a.path}
    return out


def test_table_rows_the_run_left_unmeasured_are_listed_under_the_config_lists():
    d = _data()
    line = (
        "row T32_H16_w4_s3_k2 runs B>=33 with 2 splits at each, measured at B=128 only: B=33-64 (half of B=128 or "
        "less) is not measured"
    )
    d["benchmark"]["variants"]["candidate"]["unmeasured_rows"] = [line]
    md = kr.render_markdown(d, {}, 0.02)
    assert f"  - not measured by this run: {line}" in md
    assert md.count("not measured by this run") == 1  # the baseline's record has none (older records lack the key)

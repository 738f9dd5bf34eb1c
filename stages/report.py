"""Stage report: reports/report.md with PNG plots, and the pipeline's one MLflow run.

    python -m stages.report --params params.yaml --build reports/build.json --deploy reports/deploy.json \
        --benchmark reports/benchmark.json --verify reports/verify.json --out reports/report.md \
        --plots reports/plots --metrics reports/metrics.json

Order, so that nothing is half-written and no run is FINISHED with half its figures: check every
input (a candidate whose verify.json does not say passed is refused: no decision for a wrong kernel)
-> check the tracking store (tracked_stage) -> render report and plots into a temporary folder
-> open the MLflow run, log params (flattened params.yaml), metrics, tags and artifacts (reports/
plus the rendered files) -> move the report, plots and headline metrics into place -> end the run
FINISHED. Any failure after the run opened ends it FAILED with the error; SIGTERM/SIGINT end it KILLED.

``--metrics`` (reports/metrics.json) is the headline (``kernelcamp.report.headline_metrics``): the
only metrics file DVC lists (``dvc exp show``); the MLflow run logs these keys and the benchmark's
detail (benchmark_metrics.json's keys). It is written only
when the report succeeds (renamed into place with the report), so it never disagrees with report.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

from kernelcamp import report as kr
from kernelcamp import tracking
from kernelcamp.bench.record import benchmark_metrics
from kernelcamp.errors import KernelcampError
from kernelcamp.io import check_records_as_written, stage_main, write_json_atomic
from kernelcamp.metrics import flatten, nest
from kernelcamp.runlock import release_run, run_started_ms
from kernelcamp.spec import BUILD_KEYS, DEPLOY_KEYS, MEASURE_KEYS, before_outputs, project_root, stage_spec


def _replace_dir(src: Path, dst: Path) -> None:
    """Put folder ``src`` at ``dst``, replacing what was there (old folder moved aside, then removed)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    old = None
    if dst.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{dst.name}.old.", dir=dst.parent))
        os.replace(dst, old / dst.name)
    shutil.move(str(src), str(dst))
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for a in ("params", "build", "deploy", "benchmark", "verify", "out", "plots", "metrics"):
        ap.add_argument(f"--{a}", required=True)
    args = ap.parse_args()
    spec = stage_spec("report", args.params)
    params = spec.raw
    threshold = spec.report.threshold
    paths = {k: getattr(args, k) for k in ("build", "deploy", "benchmark", "verify")}
    check_records_as_written(paths.values())
    data = kr.load_inputs(paths)
    # Log nothing that disagrees with the params logged beside it (one line naming both hashes).
    spec.check_record("build.json", data["build"], BUILD_KEYS)
    spec.check_record("deploy.json", data["deploy"], DEPLOY_KEYS)
    for name in ("benchmark", "verify"):  # these ran the baseline too (its kernel: baseline.kernel_rev)
        spec.check_record(f"{name}.json", data[name], MEASURE_KEYS)
    for name in ("build", "deploy", "benchmark", "verify"):  # and every other param each stage read
        spec.check_stage_params(f"{name}.json", data[name], name)
    # a wrong kernel's speed decides nothing: the verify stage failed on it (`dvc repro -s report` runs anyway)
    if data["verify"].get("passed") is not True:
        failed = [k for k in ("kernel", "capture", "serving") if data["verify"].get(f"{k}_passed") is False]
        raise KernelcampError(
            f"{Path(args.verify).name}: the candidate failed verify ({', '.join(failed) or 'passed is not true'}; "
            f"the failing cases are in {Path(args.verify).with_name('verify_details.json')}): a kernel with wrong "
            "output gets no decision; fix it and rerun the pipeline"
        )
    out, plots_dst, metrics_dst = Path(args.out), Path(args.plots), Path(args.metrics)
    bench = data["benchmark"]
    with kr.reading_records(paths):  # a record edited by hand: one line, not a traceback (helper-53)
        head = kr.headline(data, threshold)
        head_metrics = kr.headline_metrics(data, threshold)
        measured = measured_tags(bench)
        roofline_target = (bench["kernel"].get("roofline") or {}).get("target")
        # the benchmark's detail (benchmark_metrics.json's keys), recomputed from the checked record
        detail = flatten(benchmark_metrics(bench["kernel"], bench["serving"], bench["device"]))
    tags = tracking.run_tags(
        params,
        {
            "stage": "report",
            "device": bench.get("device"),
            "gpu": bench.get("gpu") or "none (cpu)",
            # the conf/target whose peaks the roofline_pct metrics are against: the GPU that ran (None: not computed)
            "roofline_target": roofline_target,
            "driver": bench.get("driver"),
            "torch": bench.get("torch"),
            "triton": bench.get("triton"),
            # the run spec's, which every record was checked against above
            "variant_hash": spec.variant_hash,
            "baseline_hash": spec.baseline_hash,
            "variant_config_hash": spec.variant.config_hash(),
            "baseline_config_hash": spec.baseline.config_hash() if spec.baseline else None,
            "kernel_module": spec.kernel.module,
            "kernel_source_hash": spec.kernel_source_hash,
            "baseline_kernel_rev": spec.hashes()["baseline_kernel_rev"],
            "baseline_kernel_source_hash": spec.baseline_kernel_source_hash,
            "deploy_id": bench.get("deploy_id"),
            # where it served: server.port is the configured port, the deploy may have taken a fallback
            "server_url": data["deploy"].get("url"),
            "measured_at": bench.get("measured_at"),
            "decision": head["decision"],
            "run_as_target": bench.get("run_as_target"),
            # what the benchmark measured: params hold both the GPU's and the CPU's lists (workload.batch_sizes,
            # workload.cpu.batch_sizes, benchmark.serving.concurrency / cpu_concurrency), and a CPU run ran the latter
            **measured,
        },
    )
    # git_commit/git_dirty: the tree that measured (benchmark.json's, what report.md shows), not the one the report
    # runs in: a report-only rerun after a commit logged the new commit beside the old measurement (helper audit R2)
    tags["report_git_commit"], tags["report_git_dirty"] = tags["git_commit"], tags["git_dirty"]
    for k in ("git_commit", "git_dirty"):
        tags[k] = "" if bench.get(k) is None else bench[k]
    # a report-only rerun (`dvc repro -f -s report`, a changed report threshold) logs the same measurement again:
    # the run says so, and names the runs that logged it first (helper audit R4)
    same = {"measured_at": str(bench.get("measured_at") or ""), "deploy_id": str(bench.get("deploy_id") or "")}
    earlier = tracking.finished_runs_with(params, same)
    tags["measurement_reused"] = bool(earlier)
    tags["measurement_logged_by"] = ",".join(earlier[:5])
    with tempfile.TemporaryDirectory(prefix=".report.", dir=out.parent) as tmp:
        tmp = Path(tmp)
        with kr.reading_records(paths):
            plots = kr.make_plots(data, tmp / "plots", threshold)
            rel = os.path.relpath(plots_dst, out.parent)
            text = kr.render_markdown(data, plots, threshold, rel)
            if earlier:
                title, _, rest = text.partition("\n")
                text = f"{title}\n\n{kr.reused_note(bench, earlier)}\n{rest}"
        (tmp / out.name).write_text(text, encoding="utf-8")
        write_json_atomic(tmp / metrics_dst.name, nest(head_metrics))
        store = tracking.store_label(tracking.tracking_uri(params))
        print(f"[report] rendered {out.name} and {len(plots)} plot(s); logging to {store}", flush=True)
        before_outputs("report", args.params)  # before the run is logged FINISHED and the outputs put in place
        # the MLflow run spans the pipeline run (from its first stage's claim), not only this stage
        with tracking.tracked_run(spec.raw, tags=tags, start_time_ms=run_started_ms(project_root())) as run:
            run.log_params(params)
            # the headline (metrics.json's keys) and the benchmark's detail, one naming scheme: MLflow's compare view
            # plots them
            run.log_metrics({**detail, **head_metrics})
            inputs = tmp / "inputs"
            inputs.mkdir()
            mine = {out.name, metrics_dst.name}  # this stage's outputs: the new ones are logged, not the last run's
            for p in Path(args.benchmark).parent.iterdir():  # the stage records beside benchmark.json
                if p.is_file() and not p.name.startswith(".") and p.name not in mine:
                    shutil.copy2(p, inputs / p.name)
            run.log_artifacts(inputs, "reports")
            run.log_artifacts(tmp / "plots", "reports/plots")
            run.log_artifacts(_only(tmp, *mine), "reports")

            def put_in_place() -> None:  # with the run's FINISHED end, signals held (Run.on_finish)
                _replace_dir(tmp / "plots", plots_dst)
                os.replace(tmp / metrics_dst.name, metrics_dst)
                os.replace(tmp / out.name, out)

            run.on_finish(put_in_place)
            run_id = run.run_id
    release_run(project_root())
    print(
        f"[report] {head['decision']}: ratio {head['ratio']:.4f} [{head['ci_lo']:.4f}, {head['ci_hi']:.4f}]"
        f"{' (CPU interpreter timings decide nothing)' if head['cpu'] else ''}; wrote {out}; MLflow run {run_id}",
        flush=True,
    )
    return 0


#: benchmark.json's kernel shape keys in the ``measured_kernel_shape`` tag, and their names there.
SHAPE_TAG_KEYS = (
    ("num_heads", "H"),
    ("topk", "topk"),
    ("page_size", "page_size"),
    ("num_cache_tokens", "num_cache_tokens"),
)


def measured_tags(bench: dict) -> dict[str, str]:
    """The tags that name what ``bench`` (benchmark.json) measured, read from its records: ``measured_batch_sizes``
    (the kernel A/B's batch sizes, ascending, comma-separated), ``measured_kernel_shape`` (its shape,
    ``deepseek_v32 H=16 topk=2048 page_size=64 num_cache_tokens=262144``), ``measured_concurrency`` (the serving
    A/B's concurrency levels; "" when it was skipped), ``measured_dot_dtype`` and ``measured_rounds`` (the kernel
    A/B's) and ``measured_serving_plan`` (``max_tokens=8 warmup_s=1.0 ...``; "" when skipped). (The serving shapes
    follow the server's device, which may differ from the kernel benchmark's: no tag names a params section for
    both.)"""
    levels = sorted({int(lv["concurrency"]) for lv in (bench.get("serving") or {}).get("levels") or []})
    shape = bench["kernel"].get("shape") or {}
    plan = (bench.get("serving") or {}).get("plan") or {}
    return {
        "measured_batch_sizes": ",".join(str(b) for b in sorted(int(b) for b in bench["kernel"]["batch"])),
        "measured_kernel_shape": " ".join(
            [str(shape.get("layout", "?"))] + [f"{name}={shape[k]}" for k, name in SHAPE_TAG_KEYS if k in shape]
        ),
        "measured_concurrency": ",".join(str(c) for c in levels),
        # the dots' dtype and the rounds that ran: a CPU run's are not kernel.dot_dtype's and benchmark.kernel.rounds'
        "measured_dot_dtype": str(bench["kernel"].get("dot_dtype") or ""),
        "measured_rounds": str((bench["kernel"].get("overall") or {}).get("n_rounds") or ""),
        # the serving load that ran (the CPU-scaled plan on a CPU: benchmark.serving.cpu_*), "" when it was skipped
        "measured_serving_plan": " ".join(f"{k}={plan[k]}" for k in SERVING_PLAN_TAG_KEYS if plan.get(k) is not None)
        if levels
        else "",
    }


#: benchmark.json's serving plan keys in the ``measured_serving_plan`` tag.
SERVING_PLAN_TAG_KEYS = ("max_tokens", "warmup_s", "window_s", "repeats", "timeout_s")


def _only(folder: Path, *names: str) -> Path:
    """A folder holding just ``folder/<name>`` of each name (log_artifacts takes folders)."""
    sub = folder / ".one"
    sub.mkdir(exist_ok=True)
    for name in names:
        shutil.copy2(folder / name, sub / name)
    return sub


if __name__ == "__main__":
    stage_main(tracking.tracked_stage("report")(main))

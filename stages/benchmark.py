"""Stage benchmark: baseline vs candidate, kernel level (interleaved rounds per batch size) and
serving level (kernelcamp.serving.bench), plus a profiler trace and a per-kernel time table.

    python stages/benchmark.py --params params.yaml --build reports/build.json --deploy reports/deploy.json \
        --out reports/benchmark.json --metrics reports/benchmark_metrics.json \
        --latency-csv reports/kernel_latency.csv --summary-csv reports/kernel_summary.csv \
        --serving-csv reports/serving.csv --trace reports/trace.json.gz --kernel-table reports/kernel_table.csv

On a GPU: CUDA-graph replays with L2 flushed (kernelcamp.timing), workload shapes, bf16 dots.
Without one: TRITON_INTERPRET=1 at ``workload.cpu`` shapes, fp16 dots, a few perf_counter rounds;
every row says ``device=cpu`` and the report never shows them as GPU figures. Triton's autotuner
needs a GPU driver, so on a CPU a list variant runs its first config (named in ``configs_ran``).
Every result carries measured_at, host, GPU and the deploy id it measured.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernelcamp.errors import KernelcampError  # noqa: E402
from kernelcamp.io import (  # noqa: E402
    read_json,
    stage_main,
    write_csv_atomic,
    write_json_atomic,
)
from kernelcamp.kernel_bench import check_kernel_params, decision_metrics, kept_configs, kernel_level  # noqa: E402
from kernelcamp.profiling import (  # noqa: E402
    TABLE_COLS,
    baseline_trace_path,
    kernel_launch_profile,
    placeholder_trace,
    server_profile,
)
from kernelcamp.serving.summary import serving_metrics, serving_summary  # noqa: E402
from kernelcamp.spec import BUILD_KEYS, DEPLOY_KEYS, stage_spec  # noqa: E402
from kernelcamp.tracking import tracked_stage  # noqa: E402

#: Prefix of the folder (beside the outputs) where a run's traces wait until every output is ready.
STAGING_PREFIX = ".trace-staging-"


def log(msg: str) -> None:
    print(f"[benchmark] {msg}", flush=True)


def deploy_id(deploy: dict) -> str:
    """The deploy record's own id, else a hash of the record (names exactly what was measured).
    (Copied in stages/verify.py rather than imported, so that verify does not depend on this script.)"""
    import hashlib
    import json

    return str(deploy.get("deploy_id") or hashlib.sha256(json.dumps(deploy, sort_keys=True).encode()).hexdigest()[:16])


def serving_level(params: dict, deploy: dict) -> dict:
    sv = params["benchmark"]["serving"]
    if not sv.get("enabled"):
        return {"skipped": "benchmark.serving.enabled is false", "levels": []}
    if importlib.util.find_spec("kernelcamp.serving.bench") is None:
        return {"skipped": "kernelcamp.serving.bench is not in this tree yet", "levels": []}
    from kernelcamp.serving.bench import serving_benchmark

    log(
        "serving benchmark: baseline and candidate interleaved per level (the baseline on a temporary server "
        "beside the deployed candidate; embedded deploys only)"
    )
    res = serving_benchmark(params, deploy, progress=True)
    o = (res.get("ab") or {}).get("overall") or {}
    if res.get("baseline_measured") and o.get("ratio") is not None:
        log(
            f"serving output tok/s candidate/baseline {o['ratio']:.3f} [{o['ci_lo']:.3f}, {o['ci_hi']:.3f}] "
            f"over {o['n_pairs']} paired runs: {o.get('decision')}"
        )
    elif not res.get("baseline_measured"):
        log(f"serving: candidate only ({res.get('baseline_not_measured_reason')})")
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for a in (
        "params",
        "build",
        "deploy",
        "out",
        "metrics",
        "latency-csv",
        "summary-csv",
        "serving-csv",
        "serving-summary-csv",
        "trace",
        "kernel-table",
    ):
        ap.add_argument(f"--{a}", required=True)
    args = ap.parse_args()
    spec = stage_spec("benchmark", args.params)
    if spec.baseline is None:
        raise KernelcampError("params.yaml has no `baseline` section: every benchmark measures one beside the variant")
    params = spec.raw
    build = read_json(args.build, "build record")
    deploy = read_json(args.deploy, "deploy record")
    # measure only what these params describe (a stale or foreign record stops here, naming both hashes)
    spec.check_record("build.json", build, BUILD_KEYS)
    spec.check_record("deploy.json", deploy, DEPLOY_KEYS)
    if params["benchmark"]["serving"].get("enabled") and importlib.util.find_spec("kernelcamp.serving.bench"):
        from kernelcamp.serving.bench import require_deployed_server

        require_deployed_server(deploy)  # before the kernel rounds: a stopped server is found now

    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernel module imports triton.jit
        log("no GPU: Triton interpreter at workload.cpu shapes, fp16 dots; timings are labelled device=cpu")
    check_kernel_params(params, device)
    if params["benchmark"]["serving"].get("enabled") and importlib.util.find_spec("kernelcamp.serving.bench"):
        from kernelcamp.serving.bench import check_baseline_port, check_serving_params

        check_serving_params(params)  # duplicate levels, unusable repeat plans: before the kernel rounds
        check_baseline_port(params, deploy)  # before the kernel rounds, not after them
    run_as = spec.benchmark.run_as_target
    variants, notes = {}, {}
    for name, sec in (("baseline", "baseline"), ("candidate", "variant")):
        v = spec.baseline if sec == "baseline" else spec.variant
        full, full_hash = [c.label() for c in v.configs], v.config_hash()
        if run_as:
            keep = kept_configs(build, sec, run_as, len(v.configs))
            if not keep:
                raise KernelcampError(f"{sec} {v.name!r}: no config fits {run_as} (build.json), nothing would run")
            v = v.restricted(keep)
        if device == "cpu" and not v.single:
            v = v.restricted([0])  # Triton's autotuner needs a GPU driver
        notes[name] = {
            "name": params[sec]["name"],
            "config_hash": full_hash,  # the variant's, as build.json and the MLflow tags give it
            "config_hash_ran": v.config_hash(),  # of configs_ran (differs when some were dropped)
            "configs": full,
            "configs_ran": [c.label() for c in v.configs],
            "config_list": (f"as {run_as} would run it (configs it prunes dropped)" if run_as else "every config")
            + ("; CPU: first config only, no autotune" if device == "cpu" and len(full) > 1 else ""),
        }
        variants[name] = v
        log(f"{name} {notes[name]['name']}: runs {notes[name]['configs_ran']} ({notes[name]['config_list']})")
    # Traces are written to a staging folder and moved into place with the other outputs at the end,
    # so an interrupted run leaves the previous run's traces beside the previous run's records.
    final_traces = {"candidate": Path(args.trace), "baseline": baseline_trace_path(args.trace)}
    final_traces["candidate"].parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=final_traces["candidate"].parent))
    try:
        return _measure_and_write(args, spec, deploy, device, run_as, notes, variants, final_traces, staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _measure_and_write(args, spec, deploy, device, run_as, notes, variants, final_traces, staging) -> int:
    """The rest of :func:`main`: kernel rounds, serving A/B, profile, then every output at once."""
    from kernelcamp.provenance import device_info, git_info, now_utc

    params = spec.raw

    traces = {impl: staging / p.name for impl, p in final_traces.items()}
    rows, kernel = kernel_level(params, variants, device)
    serving = serving_level(params, deploy)
    table: list[dict] = []
    prof_meta: dict = {}
    prof_source, prof_why = None, "benchmark.profile.enabled is false"
    if params["benchmark"]["profile"]["enabled"]:
        table, prof_meta, prof_why = server_profile(params, deploy, serving, traces)
        prof_source = "server_decode_steps"
        if not table:
            log(f"decode-step profile not taken ({prof_why}): profiling kernel launches instead")
            table, prof_meta = kernel_launch_profile(variants, params, device, traces)
            prof_source = "kernel_launches"
        else:
            log(
                "decode-step profile: "
                + ", ".join(
                    f"{i} {m.get('steps')} steps ({m.get('mode')})" for i, m in prof_meta.items() if m.get("kernels")
                )
            )
    for impl, path in traces.items():
        if not path.exists() or not (prof_meta.get(impl) or {}).get("kernels"):
            placeholder_trace(path, f"no {impl} profile: {(prof_meta.get(impl) or {}).get('skipped') or prof_why}")
    info = device_info()
    prov = {
        "measured_at": now_utc(),
        "host": info["host"],
        "device": device,
        "gpu": info.get("gpu_name"),
        "deploy_id": deploy_id(deploy),
        **git_info(),
        **info,
        **spec.hashes(),  # what was measured, checked by the report against the params it logs
    }
    record = {
        **prov,
        "run_as_target": run_as,
        "variants": notes,
        "kernel": kernel,
        "serving": serving,
        "profile": {
            "trace": args.trace,
            "trace_baseline": str(final_traces["baseline"]),
            "kernel_table": args.kernel_table,
            "source": prof_source,
            "what": {
                "server_decode_steps": "decode steps of the serving servers under load at the highest level "
                "(POST /v1/kernelcamp/profile, torch.profiler/Kineto)",
                "kernel_launches": "kernel launches of each impl outside any server (fallback)",
                None: "not profiled",
            }[prof_source],
            "fallback_reason": prof_why if prof_source == "kernel_launches" else None,
            "impls": prof_meta,
        },
        "timing": "cuda_graph_l2_flushed" if device == "cuda" else "cpu_interpreter_perf_counter",
    }
    summary = [
        {
            "batch": int(b),
            "device": device,
            **{
                f"{n}_latency_us_{q}": r[n][f"latency_us_{q}"]
                for n in ("baseline", "candidate")
                for q in ("p20", "p50", "p80")
            },
            **{f"ab_{x}": (r["ab"] or {}).get(x) for x in ("ratio", "ci_lo", "ci_hi")},
        }
        for b, r in kernel["batch"].items()
    ]
    # CPU figures live under their own names (kernel_cpu, serving_cpu_*, as in MLflow), so that
    # `dvc metrics diff` / `dvc exp show` never put interpreter timings beside GPU ones.
    ns = "kernel" if device == "cuda" else "kernel_cpu"
    metrics = {
        "device_is_gpu": int(device == "cuda"),
        ns: {
            "ratio": kernel["overall"]["ratio"],
            "ratio_ci_lo": kernel["overall"]["ci_lo"],
            "ratio_ci_hi": kernel["overall"]["ci_hi"],
            **decision_metrics(kernel["overall"]),
            **{f"b{s['batch']}": {k_: v for k_, v in s.items() if k_ not in ("batch", "device")} for s in summary},
        },
    }
    sm_ns = "step_model" if device == "cuda" else "step_model_cpu"
    if serving.get("step_model"):
        metrics[sm_ns] = {k_: serving["step_model"].get(k_) for k_ in ("a_ms", "b_ms_per_req", "r2")}
    sv_metrics = serving_metrics(serving)
    if device != "cuda":
        sv_metrics = {k_.replace("serving_", "serving_cpu_", 1): v for k_, v in sv_metrics.items()}
    metrics.update(sv_metrics)
    for impl, m in prof_meta.items():
        if m.get("trace_path"):
            m["trace_path"] = str(final_traces[impl])
    for impl, path in traces.items():
        os.replace(path, final_traces[impl])  # same folder: an atomic rename each
    write_csv_atomic(args.latency_csv, rows)
    write_csv_atomic(args.summary_csv, summary)
    write_csv_atomic(
        args.serving_csv,
        [{**lv, "device": device} for lv in serving.get("levels", [])]
        or [{"concurrency": None, "device": device, "skipped": serving.get("skipped")}],
    )
    write_csv_atomic(
        args.serving_summary_csv,
        serving_summary(serving, device),
    )
    write_csv_atomic(
        args.kernel_table,
        [{c: r.get(c) for c in TABLE_COLS} for r in table] or [{**dict.fromkeys(TABLE_COLS), "skipped": prof_why}],
    )
    write_json_atomic(args.metrics, metrics)
    write_json_atomic(args.out, record)
    log(
        f"overall ratio candidate/baseline {metrics[ns]['ratio']:.3f} "
        f"[{metrics[ns]['ratio_ci_lo']:.3f}, {metrics[ns]['ratio_ci_hi']:.3f}] on {device}; wrote {args.out}"
    )
    return 0


if __name__ == "__main__":
    stage_main(tracked_stage("benchmark")(main))

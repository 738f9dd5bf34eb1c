"""The benchmark stage's record: which configs run, the measuring, and every output written at once.

:func:`variants_to_run` and :func:`measure_and_write` are the body of ``stages/benchmark.py``;
:func:`serving_metrics` and :func:`serving_summary` flatten the serving figures for the metrics file
and the per-concurrency CSV.
"""

from __future__ import annotations

import os
from typing import Any

from kernelcamp.bench.kernel import decision_metrics, kept_configs, kernel_level
from kernelcamp.bench.profile import TABLE_COLS, kernel_launch_profile, placeholder_trace, server_profile
from kernelcamp.errors import KernelcampError
from kernelcamp.io import write_csv_atomic, write_json_atomic
from kernelcamp.stats import DECISION_CODES


def log(msg: str) -> None:
    print(f"[benchmark] {msg}", flush=True)


def serving_metrics(serving: dict) -> dict:
    """Flat, numeric serving figures for benchmark_metrics.json (units in the names); None left out.

    The A/B ratios are of ``steady_output_tok_s`` (tokens inside the measured steady-state window /
    window seconds, kernelcamp.loadgen.run_window), which is what the serving A/B pairs;
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


def variants_to_run(spec, build: dict, device: str) -> tuple[dict, dict]:
    """{impl: Variant as it will run} and {impl: notes} for baseline and candidate: the configs the
    ``benchmark.run_as_target`` would prune dropped (build.json), the first config only on a CPU
    (Triton's autotuner needs a GPU driver; a batch table runs whole). Raises ``KernelcampError`` when
    nothing would run, or when the target would drop a row of a batch table."""
    params = spec.raw
    run_as = spec.benchmark.run_as_target
    variants, notes = {}, {}
    for name, sec in (("baseline", "baseline"), ("candidate", "variant")):
        v = spec.baseline if sec == "baseline" else spec.variant
        full, full_hash = [c.label() for c in v.configs], v.config_hash()
        if run_as:
            keep = kept_configs(build, sec, run_as, len(v.configs))
            if not keep:
                raise KernelcampError(f"{sec} {v.name!r}: no config fits {run_as} (build.json), nothing would run")
            if v.is_table and len(keep) < len(v.configs):
                raise KernelcampError(
                    f"{sec} {v.name!r}: batch-table row(s) {sorted(set(range(len(v.configs))) - set(keep))} do not "
                    f"fit {run_as} (build.json); a table runs every row at its batch sizes: change those rows"
                )
            v = v.restricted(keep)
        cpu_first_only = device == "cpu" and not v.single and not v.is_table
        if cpu_first_only:
            v = v.restricted([0])  # Triton's autotuner needs a GPU driver (a batch table needs none)
        notes[name] = {
            "name": params[sec]["name"],
            "config_hash": full_hash,  # the variant's, as build.json and the MLflow tags give it
            "config_hash_ran": v.config_hash(),  # of configs_ran (differs when some were dropped)
            "configs": full,
            "configs_ran": [c.label() for c in v.configs],
            "config_list": (f"as {run_as} would run it (configs it prunes dropped)" if run_as else "every config")
            + ("; CPU: first config only, no autotune" if cpu_first_only else "")
            + ("; batch table: each batch size runs its row" if v.is_table else ""),
        }
        variants[name] = v
        log(f"{name} {notes[name]['name']}: runs {notes[name]['configs_ran']} ({notes[name]['config_list']})")
    return variants, notes


def serving_level(params: dict, deploy: dict) -> dict:
    """The serving A/B (:func:`kernelcamp.bench.serving.serving_benchmark`), or why it was skipped."""
    sv = params["benchmark"]["serving"]
    if not sv.get("enabled"):
        return {"skipped": "benchmark.serving.enabled is false", "levels": []}
    from kernelcamp.bench.serving import serving_benchmark

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


def measure_and_write(args, spec, deploy, device, run_as, notes, variants, final_traces, staging) -> int:
    """The benchmark stage's work after its checks: kernel rounds, serving A/B, profile, then every
    output at once (``args``: the stage's parsed paths; traces staged in ``staging`` and renamed into
    ``final_traces`` with the other outputs, so an interrupted run leaves the previous run's set)."""
    from kernelcamp.provenance import deploy_id, device_info, git_info, now_utc

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

"""The benchmark stage's record: which configs run, the measuring, and every output written at once.

:func:`variants_to_run` and :func:`measure_and_write` are the body of ``stages/benchmark.py``;
:func:`benchmark_metrics` (:func:`kernel_metrics`, :func:`serving_metrics`) gives the detail figures
of benchmark_metrics.json in the one naming scheme (:mod:`kernelcamp.metrics`), and
:func:`serving_summary` the per-concurrency CSV.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from kernelcamp.bench.kernel import decision_metrics, kept_configs, kernel_level, run_batch_sizes
from kernelcamp.bench.profile import TABLE_COLS, kernel_launch_profile, placeholder_trace, server_profile
from kernelcamp.errors import KernelcampError
from kernelcamp.io import write_csv_atomic, write_json_atomic
from kernelcamp.metrics import is_number, nest, serving_prefix, timed_prefix
from kernelcamp.spec import before_outputs
from kernelcamp.stats import DECISION_CODES


def log(msg: str) -> None:
    print(f"[benchmark] {msg}", flush=True)


def serving_metrics(serving: dict, prefix: str = "") -> dict[str, float | int]:
    """Flat, numeric serving figures for benchmark_metrics.json, keys of :mod:`kernelcamp.metrics`
    (``prefix``: ``"cpu."`` on a CPU); figures the record lacks are left out.

    ``{p}serving.c<C>.<impl>.<figure>`` per level and impl, ``{p}serving.c<C>.valid`` (0: a failed or
    incomplete request), ``{p}serving.c<C>.ab.{ratio,ci_lo,ci_hi,resolution,decision}`` and overall
    ``{p}serving.ab.{ratio,ci_lo,ci_hi,resolution,repeats_used,decision}`` (decision codes of
    ``kernelcamp.stats.DECISION_CODES``; resolution = the interval's half-width, ratio units),
    ``{p}serving.baseline_measured``, and ``{p}step_model.<impl>.{a_ms,b_ms_per_req,r2}``. The A/B
    ratios are of ``steady_output_tok_s`` (tokens inside the measured steady-state window / window
    seconds, kernelcamp.loadgen.run_window), which is what the serving A/B pairs; ``output_tok_s``
    (DESIGN.md: ok tokens / wall, ramp and drain included) is reported per impl."""
    p = f"{prefix}serving."
    m: dict[str, Any] = {}
    ab = serving.get("ab") or {}
    if "baseline_measured" in serving:
        m[f"{p}baseline_measured"] = int(bool(serving["baseline_measured"]))
    for e in ab.get("per_level") or []:
        c = f"{p}c{e['concurrency']}."
        m[f"{c}valid"] = int(bool(e.get("valid")))
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
                m[f"{c}{impl}.{f}"] = a.get(f)
        m[f"{c}ab.ratio"] = e.get("ratio")
        m[f"{c}ab.ci_lo"] = e.get("ci_lo")
        m[f"{c}ab.ci_hi"] = e.get("ci_hi")
        m[f"{c}ab.resolution"] = e.get("half_width")
        m[f"{c}ab.decision"] = DECISION_CODES.get(e.get("decision"))
    o = ab.get("overall") or {}
    m[f"{p}ab.ratio"] = o.get("ratio")
    m[f"{p}ab.ci_lo"] = o.get("ci_lo")
    m[f"{p}ab.ci_hi"] = o.get("ci_hi")
    m[f"{p}ab.resolution"] = o.get("half_width")
    m[f"{p}ab.repeats_used"] = o.get("n_repeats")
    m[f"{p}ab.decision"] = DECISION_CODES.get(o.get("decision"))
    sms = dict(serving.get("step_models") or {})
    if "candidate" not in sms and serving.get("step_model"):
        sms["candidate"] = serving["step_model"]  # an older record's single model is the candidate's
    for impl, sm in sms.items():
        for f in ("a_ms", "b_ms_per_req", "r2"):
            m[f"{prefix}step_model.{impl}.{f}"] = (sm or {}).get(f)
    return {k_: v for k_, v in m.items() if is_number(v)}


def kernel_metrics(kernel: dict, prefix: str = "") -> dict[str, float | int]:
    """Flat, numeric kernel figures for benchmark_metrics.json, keys of :mod:`kernelcamp.metrics`
    (``prefix``: ``"cpu."`` on a CPU); figures the record lacks are left out.

    ``{p}kernel.ab.{ratio,ci_lo,ci_hi,decision,resolution,rounds_used,stopped_early}``: the overall A/B
    as the rounds stopped on it (latency candidate/baseline; on a CPU always inconclusive:
    :func:`withhold_cpu_decisions`); per batch size B
    ``{p}kernel.b<B>.<impl>.{latency_us_p20,latency_us_p50,latency_us_p80,tflops,gbps,roofline_pct}``
    and ``{p}kernel.b<B>.ab.{ratio,ci_lo,ci_hi}``."""
    p = f"{prefix}kernel."
    o = kernel["overall"]
    dm = decision_metrics(o)
    m: dict[str, Any] = {
        f"{p}ab.ratio": o.get("ratio"),
        f"{p}ab.ci_lo": o.get("ci_lo"),
        f"{p}ab.ci_hi": o.get("ci_hi"),
        f"{p}ab.decision": dm.get("decision_code"),
        f"{p}ab.resolution": dm.get("half_width"),
        f"{p}ab.rounds_used": dm.get("rounds_used"),
        f"{p}ab.stopped_early": dm.get("stopped_early"),
    }
    for b, r in kernel["batch"].items():
        for impl in ("baseline", "candidate"):
            for f in ("latency_us_p20", "latency_us_p50", "latency_us_p80", "tflops", "gbps", "roofline_pct"):
                m[f"{p}b{int(b)}.{impl}.{f}"] = (r.get(impl) or {}).get(f)
        for f in ("ratio", "ci_lo", "ci_hi"):
            m[f"{p}b{int(b)}.ab.{f}"] = (r.get("ab") or {}).get(f)
    return {k_: v for k_, v in m.items() if is_number(v)}


def benchmark_metrics(kernel: dict, serving: dict, device: str) -> dict[str, Any]:
    """benchmark_metrics.json: ``device.is_gpu``, :func:`kernel_metrics` and :func:`serving_metrics`,
    nested (DVC and MLflow read the dotted keys); timed figures carry ``cpu.`` on a CPU, so they are
    never put beside GPU ones (DESIGN.md). Raises ``ValueError`` on a key off the naming scheme."""
    p = timed_prefix(device)
    sp = serving_prefix(device, serving)  # a CPU server's figures are CPU figures, whatever ran the benchmark
    return nest({"device.is_gpu": int(device == "cuda"), **kernel_metrics(kernel, p), **serving_metrics(serving, sp)})


def serving_summary(serving: dict, device: str) -> list[dict]:
    """Wide rows per concurrency (ascending): both impls' output tok/s (the whole run, DESIGN.md) and steady tok/s
    (the measured window), means over the repeats, and the ratio with its CI: the geometric mean of the repeats'
    paired candidate/baseline ratios of steady tok/s (``kernelcamp.bench.serving.ab_summary``), not a ratio of the
    columns beside it."""
    out = []
    for e in sorted((serving.get("ab") or {}).get("per_level") or [], key=lambda e: e["concurrency"]):
        out.append(
            {
                "concurrency": e["concurrency"],
                "baseline_output_tok_s": (e.get("baseline") or {}).get("output_tok_s"),
                "candidate_output_tok_s": (e.get("candidate") or {}).get("output_tok_s"),
                "baseline_steady_output_tok_s": (e.get("baseline") or {}).get("steady_output_tok_s"),
                "candidate_steady_output_tok_s": (e.get("candidate") or {}).get("steady_output_tok_s"),
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
            "baseline_steady_output_tok_s": None,
            "candidate_steady_output_tok_s": None,
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
    (Triton's autotuner needs a GPU driver; a batch table runs whole). The notes' ``unmeasured_rows``
    name the batch-table rows this run's batch sizes leave unmeasured (``Variant.coverage``). Raises
    ``KernelcampError`` when nothing would run, or when the target would drop a row of a batch table."""
    params = spec.raw
    run_as = spec.benchmark.run_as_target
    sizes = run_batch_sizes(params, device)
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
            "config_list": (
                "the first config only (CPU: no autotune)" + (f" of those {run_as} keeps" if run_as else "")
                if cpu_first_only
                else f"as {run_as} would run it (configs it prunes dropped)"
                if run_as
                else "every config"
            )
            + ("; batch table: each batch size runs its row" if v.is_table else ""),
            # rows of a batch table that this run's batch sizes leave (partly) unmeasured (Variant.coverage)
            "unmeasured_rows": v.coverage(sizes),
        }
        variants[name] = v
        log(f"{name} {notes[name]['name']}: runs {notes[name]['configs_ran']} ({notes[name]['config_list']})")
        for line in notes[name]["unmeasured_rows"]:
            log(f"{name}: not measured: {line}")
    return variants, notes


def kernel_notes(spec) -> dict:
    """{impl: {kernel_rev, kernel_source_hash}}: the kernel file each side runs, per the run spec; the
    baseline's ``kernel_rev`` is ``baseline.kernel_rev`` as a full sha (None: the working tree's file)."""
    h = spec.hashes()
    return {
        "baseline": {"kernel_rev": h["baseline_kernel_rev"], "kernel_source_hash": h["baseline_kernel_source_hash"]},
        "candidate": {"kernel_rev": None, "kernel_source_hash": h["kernel_source_hash"]},
    }


CPU_NO_DECISION = (
    "a CPU run decides nothing: in the Triton interpreter the launch parameters have no effect, so its "
    "intervals test the pipeline, not the variant"
)


def withhold_cpu_decisions(section: Any) -> Any:
    """Set every ``decision`` in a kernel or serving record of a CPU run to ``inconclusive``, in place.

    The report's headline of a CPU run is always inconclusive (``kernelcamp.report.CPU_DECISION_NOTE``);
    the record, its metrics (``cpu.kernel.ab.decision``) and MLflow said faster or equivalent beside
    it. Every mapping holding a ``decision`` (the overall A/B, each batch size's and each level's, each
    look) gets ``inconclusive`` and ``decision_note`` (:data:`CPU_NO_DECISION`); the intervals stay.
    Returns ``section``.
    """
    if isinstance(section, dict):
        if section.get("decision") is not None:
            section["decision"] = "inconclusive"
            section["decision_note"] = CPU_NO_DECISION
        for v in section.values():
            withhold_cpu_decisions(v)
    elif isinstance(section, list):
        for v in section:
            withhold_cpu_decisions(v)
    return section


def check_kernels_ran(kernel: dict, notes: dict) -> None:
    """Raise ``KernelcampError`` when a side's kernel rounds ran another kernel source than its notes
    (the run spec) name: the record would misstate what was measured (e.g. the kernel file edited
    during the run). A kernel summary without ``kernels`` (nothing to compare) passes."""
    for impl, ran in (kernel.get("kernels") or {}).items():
        want = (notes.get(impl) or {}).get("kernel_source_hash")
        if ran.get("source_hash") != want:
            raise KernelcampError(
                f"the {impl}'s kernel rounds ran kernel source {ran.get('source_hash')} ({ran.get('module')}) but "
                f"params.yaml gives {want}: the kernel file changed during the run; rerun the pipeline"
            )


def serving_level(params: dict, deploy: dict, baseline: dict | None = None) -> dict:
    """The serving A/B (:func:`kernelcamp.bench.serving.serving_benchmark`, on ``baseline`` when given),
    or why it was skipped."""
    sv = params["benchmark"]["serving"]
    if not sv.get("enabled"):
        return {"skipped": "benchmark.serving.enabled is false", "levels": []}
    from kernelcamp.bench.serving import serving_benchmark

    log(
        "serving benchmark: baseline and candidate interleaved per level (the baseline on a temporary server "
        "beside the deployed candidate; embedded deploys only)"
    )
    res = serving_benchmark(params, deploy, progress=True, baseline=baseline, freeze_heap=True)  # a stage process
    o = (res.get("ab") or {}).get("overall") or {}
    if res.get("baseline_measured") and o.get("ratio") is not None:
        log(
            f"serving steady tok/s candidate/baseline {o['ratio']:.3f} [{o['ci_lo']:.3f}, {o['ci_hi']:.3f}] "
            f"over {o['n_pairs']} paired windows at {o.get('n_levels')} levels: "
            + ("inconclusive (a CPU server decides nothing)" if res.get("scaled_for_cpu") else str(o.get("decision")))
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
    for impl, k in kernel_notes(spec).items():  # each side's kernel file, beside its configs
        notes[impl].update(k)
        if k["kernel_rev"]:
            log(f"{impl} runs {spec.kernel.module}'s file at commit {k['kernel_rev']} (baseline.kernel_rev)")
    rows, kernel = kernel_level(params, variants, device)
    check_kernels_ran(kernel, notes)
    if device != "cuda":
        withhold_cpu_decisions(kernel)
    profile_on = bool(params["benchmark"]["profile"]["enabled"])
    table: list[dict] = []
    prof_meta: dict = {}
    prof_source, prof_why = None, "benchmark.profile.enabled is false"
    shared = None
    with contextlib.ExitStack() as stack:
        # One baseline server for the serving windows and, after them, its decode-step profile (one
        # start instead of two); stopped when this block ends, also on an error or a signal.
        if params["benchmark"]["serving"].get("enabled"):
            from kernelcamp.bench.serving import baseline_server, baseline_why_not

            if baseline_why_not(params, deploy) is None:
                shared = stack.enter_context(baseline_server(params, str(deploy["url"]).rstrip("/")))
        serving = serving_level(params, deploy, shared)
        if profile_on:
            table, prof_meta, prof_why = server_profile(params, deploy, serving, traces, shared)
    if device != "cuda" or serving.get("scaled_for_cpu"):
        withhold_cpu_decisions(serving)  # a CPU benchmark, or a server on a CPU, decides nothing
    if shared is not None and serving.get("baseline"):
        serving["baseline"]["stopped"] = True  # as the block above ended
    if profile_on:
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
        "stage_params": spec.stage_params("benchmark"),
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
    # CPU figures live under their own names (cpu.kernel.*, cpu.serving.*: kernelcamp.metrics), so that
    # no metrics file, DVC table or MLflow run puts interpreter timings beside GPU ones.
    metrics = benchmark_metrics(kernel, serving, device)
    for impl, m in prof_meta.items():
        if m.get("trace_path"):
            m["trace_path"] = str(final_traces[impl])
    before_outputs("benchmark", args.params)
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
    o = kernel["overall"]
    log(
        f"overall ratio candidate/baseline {o['ratio']:.3f} [{o['ci_lo']:.3f}, {o['ci_hi']:.3f}] on {device}; "
        f"wrote {args.out}"
    )
    return 0

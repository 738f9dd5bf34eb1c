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
import gzip
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernelcamp.errors import KernelcampError  # noqa: E402
from kernelcamp.io import (  # noqa: E402
    atomic_path,
    load_params,
    read_json,
    section,
    stage_main,
    write_csv_atomic,
    write_json_atomic,
)
from kernelcamp.tracking import tracked_stage  # noqa: E402


def log(msg: str) -> None:
    print(f"[benchmark] {msg}", flush=True)


def deploy_id(deploy: dict) -> str:
    """The deploy record's own id, else a hash of the record (names exactly what was measured).
    (Copied in stages/verify.py rather than imported, so that verify does not depend on this script.)"""
    import hashlib
    import json

    return str(deploy.get("deploy_id") or hashlib.sha256(json.dumps(deploy, sort_keys=True).encode()).hexdigest()[:16])


def kept_configs(build: dict, sec: str, target: str, n_configs: int) -> list[int]:
    """Indices of ``sec``'s configs that ``target`` keeps per build.json's rows (all kernels fit)."""
    rows = (build.get(sec) or {}).get("rows") if isinstance(build.get(sec), dict) else None
    if rows is None:
        rows = [r for r in build.get("rows", []) if (r.get("role") or r.get("section") or r.get("variant")) == sec]
    mine = [r for r in rows if r.get("target") == target]
    if not mine:
        raise KernelcampError(
            f"build.json has no rows of {sec} for target {target}: build inspects run_as_target, "
            "rerun `dvc repro build`"
        )
    return [
        i
        for i in range(n_configs)
        if (rs := [r for r in mine if r.get("config_index") == i]) and all(r.get("fits") for r in rs)
    ]


def run_shape(params: dict, device: str) -> dict:
    """The workload's shape, with its ``cpu`` block applied when there is no GPU."""
    wl = params["workload"]
    return wl if device == "cuda" else {**wl, **wl["cpu"]}


def run_batch_sizes(params: dict, device: str) -> list[int]:
    """benchmark.kernel.batch_sizes on a GPU, workload.cpu.batch_sizes without one."""
    return (
        params["benchmark"]["kernel"]["batch_sizes"] if device == "cuda" else params["workload"]["cpu"]["batch_sizes"]
    )


def dot_dtype(params: dict, device: str) -> str:
    """kernel.dot_dtype on a GPU; fp16 in the interpreter (it cannot do bf16 dots: DESIGN.md)."""
    return params["kernel"].get("dot_dtype", "bf16") if device == "cuda" else "fp16"


def launch_args(params: dict, device: str, B: int, seed: int) -> tuple:
    """Deterministic inputs for batch size ``B``, as the launcher's positional arguments."""
    from kernels import sparse_mla_decode as k

    shape = run_shape(params, device)
    inp = k.make_inputs(
        params["workload"]["layout"],
        B,
        shape["num_heads"],
        shape["topk"],
        shape["page_size"],
        shape["num_cache_tokens"],
        device,
        seed=seed,
    )
    return (inp["q"], inp["kv_cache"], inp["indices"], inp["layout"], inp["page_size"], inp["sm_scale"])


def kernel_level(params: dict, variants: dict, device: str) -> tuple[list[dict], dict]:
    from kernelcamp import timing
    from kernelcamp.stats import paired_ratio_ci
    from kernels import sparse_mla_decode as k

    wl, bk, tgt = params["workload"], params["benchmark"]["kernel"], params["target"]
    shape, dot = run_shape(params, device), dot_dtype(params, device)
    launchers = {name: k.SparseMLADecode(v, dot_dtype=dot) for name, v in variants.items()}
    rows, per_batch = [], {}
    batch_sizes = run_batch_sizes(params, device)
    for bi, B in enumerate(batch_sizes):
        log(f"batch {B} ({bi + 1}/{len(batch_sizes)}): H={shape['num_heads']} topk={shape['topk']} on {device}")
        args = launch_args(params, device, B, seed=bi)
        impls = {name: (lambda fn=fn, a=args: fn(*a, check_indices=False)) for name, fn in launchers.items()}
        if device == "cuda":
            got = timing.interleaved_rounds(
                impls, rounds=bk["rounds"], replays_per_round=bk["replays_per_round"], warmup=bk["warmup"], progress=log
            )
        else:
            got = []
            for r in range(bk["cpu_rounds"]):
                for pos, name in enumerate(timing.round_order(list(impls), r)):
                    us = timing.bench_cpu(impls[name], replays=bk["cpu_replays_per_round"], warmup=int(r == 0))
                    got.append({"round": r, "impl": name, "position": pos, "latency_us": sorted(us)[len(us) // 2]})
                log(
                    f"round {r + 1}/{bk['cpu_rounds']}: "
                    + ", ".join(f"{g['impl']} {g['latency_us']:.0f} us" for g in got[-2:])
                )
        res: dict[str, Any] = {}
        for name in launchers:
            lat = [g["latency_us"] for g in got if g["impl"] == name]
            s = timing.summarize(lat)
            t = s["latency_us_p50"] * 1e-6
            fl = k.flops(wl["layout"], B, shape["num_heads"], shape["topk"])
            by = k.bytes_moved(wl["layout"], B, shape["num_heads"], shape["topk"])
            gpu = device == "cuda"
            res[name] = {
                **s,
                "tflops": fl / t / 1e12,
                "gbps": by / t / 1e9,
                "roofline_pct": 100 * max(by / (tgt["peak_gbps"] * 1e9), fl / (tgt["peak_bf16_tflops"] * 1e12)) / t
                if gpu
                else None,
                "config_ran": launchers[name].last_config.label() if launchers[name].last_config else None,
            }
        base = [g["latency_us"] for g in got if g["impl"] == "baseline"]
        cand = [g["latency_us"] for g in got if g["impl"] == "candidate"]
        res["ab"] = paired_ratio_ci(base, cand, params["report"]["confidence"]) if len(base) > 1 else None
        per_batch[str(B)] = res
        for g in got:
            rows.append(
                {
                    "batch": B,
                    "round": g["round"],
                    "impl": g["impl"],
                    "position": g["position"],
                    "latency_us": g["latency_us"],
                    "device": device,
                    "config": res[g["impl"]]["config_ran"],
                    "timing": "cuda_graph_l2_flushed" if device == "cuda" else "cpu_interpreter_perf_counter",
                }
            )
    # Overall A/B: every (batch, round) pair pooled (each batch size weighs by its rounds).
    base = [r["latency_us"] for r in rows if r["impl"] == "baseline"]
    cand = [r["latency_us"] for r in rows if r["impl"] == "candidate"]
    overall = paired_ratio_ci(base, cand, params["report"]["confidence"])
    return rows, {
        "batch": per_batch,
        "overall": overall,
        "dot_dtype": dot,
        "shape": {k_: shape[k_] for k_ in ("num_heads", "topk", "page_size", "num_cache_tokens")}
        | {"layout": wl["layout"]},
    }


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


def serving_metrics(serving: dict) -> dict:
    """Flat, numeric serving figures for benchmark_metrics.json (units in the names); None left out."""
    m: dict[str, Any] = {}
    ab = serving.get("ab") or {}
    if "baseline_measured" in serving:
        m["serving_baseline_measured"] = int(bool(serving["baseline_measured"]))
    for e in ab.get("per_level") or []:
        c = e["concurrency"]
        m[f"serving_c{c}_valid"] = int(bool(e.get("valid")))
        for impl in ("baseline", "candidate"):
            a = e.get(impl) or {}
            for f in ("output_tok_s", "per_request_tok_s", "ttft_ms_p50", "tpot_ms_p50", "e2e_ms_p50"):
                m[f"serving_c{c}_{f}_{impl}"] = a.get(f)
        m[f"serving_c{c}_ratio_output_tok_s"] = e.get("ratio")
        m[f"serving_c{c}_ratio_output_tok_s_ci_lo"] = e.get("ci_lo")
        m[f"serving_c{c}_ratio_output_tok_s_ci_hi"] = e.get("ci_hi")
    o = ab.get("overall") or {}
    m["serving_ratio_output_tok_s"] = o.get("ratio")
    m["serving_ratio_output_tok_s_ci_lo"] = o.get("ci_lo")
    m["serving_ratio_output_tok_s_ci_hi"] = o.get("ci_hi")
    if o.get("decision"):
        m["serving_decision_code"] = {"faster": -1, "inconclusive": 0, "slower": 1}[o["decision"]]  # as kernel_*
    for impl, sm in (serving.get("step_models") or {}).items():
        for f in ("a_ms", "b_ms_per_req", "r2"):
            m[f"serving_step_{f}_{impl}"] = (sm or {}).get(f)
    return {k_: v for k_, v in m.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


TABLE_COLS = (
    "impl",
    "source",
    "name",
    "calls",
    "device_time_us_total",
    "device_time_us_mean",
    "share_pct",
    "steps",
    "batch",
    "device",
    "time_kind",
    "mode",
)


def baseline_trace_path(trace: str | Path) -> Path:
    """``reports/trace.json.gz`` -> ``reports/trace.baseline.json.gz`` (the baseline's trace)."""
    trace = Path(trace)
    name = trace.name
    stem = name[: -len(".json.gz")] if name.endswith(".json.gz") else trace.stem
    return trace.with_name(f"{stem}.baseline.json.gz")


def placeholder_trace(path: Path, why: str) -> None:
    """An empty chrome trace saying why there is no profile (the declared output always exists)."""
    import json

    with atomic_path(path) as out, gzip.open(out, "wt") as f:
        json.dump({"traceEvents": [], "kernelcamp_note": why}, f)


def profile(variants: dict, params: dict, device: str, traces: dict[str, Path]) -> tuple[list[dict], dict]:
    """Fallback: torch.profiler (Kineto) of a few kernel launches per impl (one trace each); rows of
    the per-kernel table with ``source: kernel_launches``."""
    import time

    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprof

    from kernelcamp.serving.server import kernel_rows
    from kernels import sparse_mla_decode as k

    B = run_batch_sizes(params, device)[-1]
    args = launch_args(params, device, B, seed=0)
    dot = dot_dtype(params, device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    steps = params["benchmark"]["profile"]["decode_steps"] if device == "cuda" else 1
    rows, meta = [], {}
    for name, v in variants.items():
        fn = k.SparseMLADecode(v, dot_dtype=dot)
        fn(*args, check_indices=False)  # compile / autotune outside the trace
        if device == "cuda":
            torch.cuda.synchronize()
        with tprof(activities=acts) as prof:
            t0 = time.perf_counter()
            for _ in range(steps):
                with torch.profiler.record_function(f"impl:{name}"):
                    fn(*args, check_indices=False)
            if device == "cuda":
                torch.cuda.synchronize()
            wall_us = (time.perf_counter() - t0) * 1e6
        with tempfile.TemporaryDirectory() as tmp:
            raw = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(raw))
            with atomic_path(traces[name]) as out, open(raw, "rb") as src, gzip.open(out, "wb") as dst:
                shutil.copyfileobj(src, dst)
        kr = kernel_rows(prof, device == "cuda", wall_us)
        kind = "device_kernel_time" if device == "cuda" else "cpu_op_self_time"
        meta[name] = {
            "source": "kernel_launches",
            "steps": steps,
            "batch_sizes": [B] * steps,
            "device": device,
            "time_kind": kind,
            "mode": "kernel launches (no server)",
            "kernel_rows": len(kr),
            "kernels": kr[:TOP_KERNELS],
            "trace_path": str(traces[name]),
            "share_pct_of": "the launches' wall time",
        }
        rows += [
            {
                "impl": name,
                "source": "kernel_launches",
                **r,
                "steps": steps,
                "batch": B,
                "device": device,
                "time_kind": kind,
                "mode": "kernel launches (no server)",
            }
            for r in kr[:40]
        ]
    return rows, meta


TOP_KERNELS = 12


def server_profile(params: dict, deploy: dict, serving: dict, traces: dict[str, Path]) -> tuple[list[dict], dict, str]:
    """The decode-step profiles of the serving benchmark's servers -> (table rows, per impl meta,
    why not); rows empty (with why) when the servers cannot be profiled."""
    if not serving.get("levels"):
        return [], {}, f"serving not measured ({serving.get('skipped') or 'no levels'})"
    from kernelcamp.serving.bench import profile_decode_steps

    steps = int(params["benchmark"]["profile"].get("decode_steps") or 5)
    try:
        got = profile_decode_steps(params, deploy, {k_: str(v) for k_, v in traces.items()}, steps)
    except Exception as e:  # noqa: BLE001 - the kernel-launch profile stands in, with the reason
        return [], {}, f"profiling the servers failed: {type(e).__name__}: {e}"
    if got.get("skipped"):
        return [], {}, got["skipped"]
    rows, meta = [], {}
    for impl, r in got["impls"].items():
        if r.get("skipped") or not r.get("kernels"):
            meta[impl] = {"source": "server_decode_steps", "skipped": r.get("skipped") or "no rows"}
            continue
        batch = max(set(r["batch_sizes"]), key=r["batch_sizes"].count)
        meta[impl] = {
            "source": "server_decode_steps",
            **{k_: v for k_, v in r.items() if k_ not in ("kernels", "load_rows")},
            "kernels": r["kernels"][:TOP_KERNELS],
            "concurrency": got["concurrency"],
        }
        rows += [
            {
                "impl": impl,
                "source": "server_decode_steps",
                **{k_: row[k_] for k_ in ("name", "calls", "device_time_us_total", "device_time_us_mean")},
                "share_pct": row["share_pct"],
                "steps": r["steps"],
                "batch": batch,
                "device": r.get("device"),
                "time_kind": r.get("time_kind"),
                "mode": r.get("mode"),
            }
            for row in r["kernels"]
        ]
    if not any(m.get("kernels") for m in meta.values()):
        return [], meta, "; ".join(f"{i}: {m.get('skipped')}" for i, m in meta.items()) or "no profile rows"
    return rows, meta, ""


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
    params = load_params(args.params)
    for s in ("variant", "baseline", "workload", "target", "kernel", "benchmark", "report"):
        section(params, s)
    build = read_json(args.build, "build record")
    deploy = read_json(args.deploy, "deploy record")
    if params["benchmark"]["serving"].get("enabled") and importlib.util.find_spec("kernelcamp.serving.bench"):
        from kernelcamp.serving.bench import require_deployed_server

        require_deployed_server(deploy)  # before the kernel rounds: a stopped server is found now

    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernel module imports triton.jit
        log("no GPU: Triton interpreter at workload.cpu shapes, fp16 dots; timings are labelled device=cpu")
    from kernelcamp.provenance import device_info, git_info, now_utc
    from kernelcamp.variant import parse_variant

    if importlib.util.find_spec("kernels.sparse_mla_decode") is None:
        raise KernelcampError("kernels/sparse_mla_decode.py is missing: nothing to benchmark")
    from kernels.sparse_mla_decode import kernel_source_hash

    run_as = params["benchmark"].get("run_as_target")
    variants, notes = {}, {}
    for name, sec in (("baseline", "baseline"), ("candidate", "variant")):
        v = parse_variant(params[sec], sec)
        full = [c.label() for c in v.configs]
        if run_as:
            keep = kept_configs(build, sec, run_as, len(v.configs))
            if not keep:
                raise KernelcampError(f"{sec} {v.name!r}: no config fits {run_as} (build.json), nothing would run")
            v = v.restricted(keep)
        if device == "cpu" and not v.single:
            v = v.restricted([0])  # Triton's autotuner needs a GPU driver
        notes[name] = {
            "name": params[sec]["name"],
            "config_hash": parse_variant(params[sec], sec).config_hash(),
            "configs": full,
            "configs_ran": [c.label() for c in v.configs],
            "config_list": (f"as {run_as} would run it (configs it prunes dropped)" if run_as else "every config")
            + ("; CPU: first config only, no autotune" if device == "cpu" and len(full) > 1 else ""),
        }
        variants[name] = v
        log(f"{name} {notes[name]['name']}: runs {notes[name]['configs_ran']} ({notes[name]['config_list']})")
    rows, kernel = kernel_level(params, variants, device)
    serving = serving_level(params, deploy)
    traces = {"candidate": Path(args.trace), "baseline": baseline_trace_path(args.trace)}
    table: list[dict] = []
    prof_meta: dict = {}
    prof_source, prof_why = None, "benchmark.profile.enabled is false"
    if params["benchmark"]["profile"]["enabled"]:
        table, prof_meta, prof_why = server_profile(params, deploy, serving, traces)
        prof_source = "server_decode_steps"
        if not table:
            log(f"decode-step profile not taken ({prof_why}): profiling kernel launches instead")
            table, prof_meta = profile(variants, params, device, traces)
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
        "kernel_source_hash": kernel_source_hash(),
        **git_info(),
        **info,
    }
    record = {
        **prov,
        "run_as_target": run_as,
        "variants": notes,
        "kernel": kernel,
        "serving": serving,
        "profile": {
            "trace": args.trace,
            "trace_baseline": str(traces["baseline"]),
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

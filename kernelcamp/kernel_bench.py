"""The kernel-level measurement of the benchmark stage: interleaved A/B rounds per batch size.

The shapes, batch sizes, dot dtype and inputs of a run come from one helper each, shared by the
rounds here and by the kernel-launch profile (kernelcamp.profiling).
"""

from __future__ import annotations

from typing import Any

from kernelcamp.errors import KernelcampError


def _log(msg: str) -> None:
    print(f"[benchmark] {msg}", flush=True)


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


def check_kernel_params(params: dict, device: str) -> None:
    """Refuse, before any measurement, what the kernel rounds cannot use.

    Checks the keys the run on ``device`` reads: ``benchmark.kernel.rounds`` (GPU) or ``cpu_rounds``
    (CPU) >= 2 (a paired ratio's interval needs two rounds), ``replays_per_round`` /
    ``cpu_replays_per_round`` >= 1, ``warmup`` >= 0, and the batch sizes (``benchmark.kernel.
    batch_sizes`` on a GPU, ``workload.cpu.batch_sizes`` on a CPU) a non-empty list of positive
    integers. Raises ``KernelcampError`` naming the key and its value.
    """
    bk = params["benchmark"]["kernel"]
    gpu = device == "cuda"
    rounds_key, replays_key = ("rounds", "replays_per_round") if gpu else ("cpu_rounds", "cpu_replays_per_round")
    checks = [(rounds_key, 2), (replays_key, 1)] + ([("warmup", 0)] if gpu else [])
    for key, least in checks:
        val = bk.get(key)
        if not isinstance(val, int) or isinstance(val, bool) or val < least:
            raise KernelcampError(f"benchmark.kernel.{key}={val!r}: expected an integer >= {least}")
    where = "benchmark.kernel.batch_sizes" if gpu else "workload.cpu.batch_sizes"
    sizes = run_batch_sizes(params, device)
    if not isinstance(sizes, list) or not sizes or not all(isinstance(b, int) and b > 0 for b in sizes):
        raise KernelcampError(f"{where}={sizes!r}: expected a non-empty list of positive integers")


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
    from kernelcamp.spec import import_kernel

    k = import_kernel(params["kernel"]["module"])

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


def kernel_level(params: dict, variants: dict, device: str, log=_log) -> tuple[list[dict], dict]:
    """The kernel-level A/B: interleaved baseline/candidate rounds at every batch size.

    ``variants``: ``{"baseline": Variant, "candidate": Variant}``. On ``device == "cuda"``: CUDA-graph
    replays with L2 flushed before each (kernelcamp.timing), ``benchmark.kernel.rounds`` rounds of
    ``replays_per_round`` at the workload's shapes; otherwise the interpreter at ``workload.cpu``
    shapes, timed with perf_counter and labelled ``cpu_interpreter_perf_counter``. Returns
    ``(rows, summary)``: one row per (batch, round, impl) with ``latency_us`` (microseconds), and per
    batch size each impl's percentiles, TFLOP/s, GB/s, % of roofline (GPU only: peaks from
    ``params.target``) and the paired ratio candidate/baseline with its CI (``report.confidence``),
    plus the ratio over every round pooled, and on a GPU the SM clock sampled while the rounds ran
    (``sm_clock_during_rounds``: min/p50/max MHz, kernelcamp.provenance.ClockSampler).
    Raises what the kernel launcher raises on bad input (``ValueError``) or an unlaunchable config
    (Triton's ``OutOfResources``).
    """
    import torch

    from kernelcamp import timing
    from kernelcamp.provenance import ClockSampler, smi_index
    from kernelcamp.spec import import_kernel
    from kernelcamp.stats import paired_ratio_ci

    k = import_kernel(params["kernel"]["module"])

    wl, bk, tgt = params["workload"], params["benchmark"]["kernel"], params["target"]
    shape, dot = run_shape(params, device), dot_dtype(params, device)
    launchers = {name: k.SparseMLADecode(v, dot_dtype=dot) for name, v in variants.items()}
    rows, per_batch = [], {}
    batch_sizes = run_batch_sizes(params, device)
    # the SM clock while the rounds run (one sampler across every batch size's rounds)
    clocks = ClockSampler(smi_index(torch.cuda.current_device())) if device == "cuda" else None
    for bi, B in enumerate(batch_sizes):
        log(f"batch {B} ({bi + 1}/{len(batch_sizes)}): H={shape['num_heads']} topk={shape['topk']} on {device}")
        args = launch_args(params, device, B, seed=bi)
        impls = {name: (lambda fn=fn, a=args: fn(*a, check_indices=False)) for name, fn in launchers.items()}
        if device == "cuda":
            with clocks:
                got = timing.interleaved_rounds(
                    impls,
                    rounds=bk["rounds"],
                    replays_per_round=bk["replays_per_round"],
                    warmup=bk["warmup"],
                    progress=log,
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
        "sm_clock_during_rounds": clocks.summary() if clocks is not None else {},
        "shape": {k_: shape[k_] for k_ in ("num_heads", "topk", "page_size", "num_cache_tokens")}
        | {"layout": wl["layout"]},
    }

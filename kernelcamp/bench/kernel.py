"""The kernel-level measurement of the benchmark stage: interleaved A/B rounds per batch size.

The shapes, batch sizes, dot dtype and inputs of a run come from one helper each, shared by the
rounds here and by the kernel-launch profile (kernelcamp.bench.profile). Each side launches its own
kernel module (:func:`kernelcamp.spec.kernel_for`): the candidate the working tree's, the baseline
the file at ``baseline.kernel_rev`` when set; inputs, flops and bytes come from the working tree's.
"""

from __future__ import annotations

from typing import Any

from kernelcamp.errors import KernelcampError
from kernelcamp.stats import SequentialPlan


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

    Checks the keys the run on ``device`` reads: on a GPU ``benchmark.kernel.rounds`` (the maximum)
    >= 2, ``min_rounds`` in 2..rounds (default: rounds), ``look_every`` >= 1 (default 1),
    ``max_seconds`` > 0 or null, ``replays_per_round`` >= 1, ``warmup`` >= 0; on a CPU ``cpu_rounds``
    >= 2 (a paired ratio's interval needs two rounds) and ``cpu_replays_per_round`` >= 1; and the
    batch sizes (``benchmark.kernel.batch_sizes`` on a GPU, ``workload.cpu.batch_sizes`` on a CPU) a
    non-empty list of distinct positive integers. Raises ``KernelcampError`` naming the key and its value.
    """
    bk = params["benchmark"]["kernel"]
    gpu = device == "cuda"
    rounds_key, replays_key = ("rounds", "replays_per_round") if gpu else ("cpu_rounds", "cpu_replays_per_round")
    checks = [(rounds_key, 2), (replays_key, 1)] + ([("warmup", 0)] if gpu else [])
    for key, least in checks:
        val = bk.get(key)
        if not isinstance(val, int) or isinstance(val, bool) or val < least:
            raise KernelcampError(f"benchmark.kernel.{key}={val!r}: expected an integer >= {least}")
    if gpu:
        mn, ev, ms = bk.get("min_rounds", bk["rounds"]), bk.get("look_every", 1), bk.get("max_seconds")
        if not isinstance(mn, int) or isinstance(mn, bool) or not 2 <= mn <= bk["rounds"]:
            raise KernelcampError(
                f"benchmark.kernel.min_rounds={mn!r}: expected an integer in 2..{bk['rounds']} "
                "(benchmark.kernel.rounds is the maximum)"
            )
        if not isinstance(ev, int) or isinstance(ev, bool) or ev < 1:
            raise KernelcampError(f"benchmark.kernel.look_every={ev!r}: expected an integer >= 1")
        if ms is not None and (isinstance(ms, bool) or not isinstance(ms, (int, float)) or ms <= 0):
            raise KernelcampError(f"benchmark.kernel.max_seconds={ms!r}: expected a number of seconds > 0, or null")
    where = "benchmark.kernel.batch_sizes" if gpu else "workload.cpu.batch_sizes"
    sizes = run_batch_sizes(params, device)
    if not isinstance(sizes, list) or not sizes or not all(isinstance(b, int) and b > 0 for b in sizes):
        raise KernelcampError(f"{where}={sizes!r}: expected a non-empty list of positive integers")
    dup = sorted({b for b in sizes if sizes.count(b) > 1})
    if dup:
        raise KernelcampError(f"{where}={sizes!r}: batch size {dup[0]} appears more than once")
    kernel_plan(params, device)
    if not gpu:
        _check_cpu_configs(params, sizes)


def _check_cpu_configs(params: dict, sizes: list[int]) -> None:
    """Refuse a CPU run whose variant or baseline would launch a warp-specialized config at one of the CPU batch
    sizes: that kernel is Gluon, which has no interpreter, and runs on an sm90 GPU only (the launcher refused it at
    the first launch with a ValueError traceback, after the deploy). Raises ``KernelcampError``."""
    from kernelcamp.variant import parse_variant

    for sec in ("variant", "baseline"):
        if not isinstance(params.get(sec), dict):
            continue
        v = parse_variant(params[sec], sec)
        rows = [(c, "") for c in v.configs] if not (v.single or v.is_table) else []
        rows += [(v.config_for_batch(b), f" (its row for B={b})") for b in sizes] if not rows else []
        for c, which in rows:
            if getattr(c, "warp_specialize", False):
                raise KernelcampError(
                    f"{sec} {v.name!r}: {c.label()}{which} is warp-specialized, which runs on an sm90 GPU only (Gluon "
                    "has no interpreter), and this run has no GPU: give the CPU run Triton configs"
                )


def kernel_plan(params: dict, device: str) -> SequentialPlan:
    """The sequential plan of the kernel rounds (kernelcamp.stats.SequentialPlan).

    GPU: ``benchmark.kernel.min_rounds`` .. ``rounds`` (the maximum), a look every ``look_every``
    rounds, stopping at the first look after ``max_seconds`` of rounds. CPU (interpreter timings decide
    nothing): a fixed ``cpu_rounds`` (one look). Confidence and threshold from ``report``.
    Raises ``KernelcampError`` for an unusable plan.
    """
    bk, rep = params["benchmark"]["kernel"], params.get("report") or {}
    common = {"confidence": float(rep.get("confidence", 0.95)), "threshold": float(rep.get("threshold", 0.02))}
    if device == "cuda":
        ms = bk.get("max_seconds")
        return SequentialPlan(
            min_rounds=bk.get("min_rounds", bk["rounds"]),
            max_rounds=bk["rounds"],
            look_every=bk.get("look_every", 1),
            max_seconds=None if ms is None else float(ms),
            what="benchmark.kernel",
            **common,
        )
    return SequentialPlan(bk["cpu_rounds"], bk["cpu_rounds"], 1, None, what="benchmark.kernel.cpu_rounds", **common)


def run_shape(params: dict, device: str) -> dict:
    """The workload's shape, with its ``cpu`` block applied when there is no GPU."""
    wl = params["workload"]
    return wl if device == "cuda" else {**wl, **wl["cpu"]}


def run_batch_sizes(params: dict, device: str) -> list[int]:
    """benchmark.kernel.batch_sizes on a GPU, workload.cpu.batch_sizes without one."""
    return (
        params["benchmark"]["kernel"]["batch_sizes"] if device == "cuda" else params["workload"]["cpu"]["batch_sizes"]
    )


def _splits_ran(module: Any, cfg: Any, B: int, shape: dict, num_sms: int | None) -> int | None:
    """The split-K factor ``module`` launched ``cfg`` with at batch ``B`` (its ``resolve_num_splits``, as its
    launcher calls it), or None where the module has no such function, no config ran or the SM count is unknown."""
    resolve = getattr(module, "resolve_num_splits", None)
    if resolve is None or cfg is None or num_sms is None or not hasattr(cfg, "num_splits"):
        return None
    return int(resolve(cfg.num_splits, B, shape["num_heads"], shape["topk"], cfg.BLOCK_H, cfg.BLOCK_T, num_sms))


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
    """The kernel-level A/B: interleaved baseline/candidate rounds over every batch size, stopped
    sequentially (:func:`kernel_plan`, :class:`kernelcamp.stats.SequentialPlan`).

    ``variants``: ``{"baseline": Variant, "candidate": Variant}``. One round times every batch size,
    baseline and candidate back to back (the order of the whole round reversed every other round:
    kernelcamp.bench.timing.round_order). On ``device == "cuda"``: CUDA-graph replays with L2 flushed
    before each (kernelcamp.bench.timing.GraphTimer, one per batch size and impl, captured before the
    first round), ``replays_per_round`` per round, the round's figure the median; otherwise the
    interpreter at ``workload.cpu`` shapes, timed with perf_counter and labelled
    ``cpu_interpreter_perf_counter``. At each planned look the overall figure is analysed: per round
    the geometric mean over batch sizes of each impl's latency (every batch size weighs the same),
    paired candidate/baseline; the rounds stop when it decides (faster, slower, equivalent at the
    per-look confidence), at ``benchmark.kernel.rounds``, or at the first look after
    ``benchmark.kernel.max_seconds`` seconds of rounds.

    Returns ``(rows, summary)``: one row per (batch, round, impl) with ``latency_us`` (microseconds),
    and per batch size each impl's percentiles, TFLOP/s, GB/s, % of roofline (GPU only: the peaks of
    the GPU that ran, ``params.target``'s only when its ``gpu`` is that GPU, else the ``conf/target``
    file naming it, else none: :func:`kernelcamp.targets.peaks_for_gpu`; ``roofline`` says which) and
    ``ab`` (the paired ratio candidate/baseline at the per-look confidence, its decision and
    ``half_width``); ``overall`` (the same for the geometric-mean figure, plus
    ``n_rounds``, ``stop_reason``, ``elapsed_s`` and ``looks``: one entry per look taken); ``plan``;
    ``kernels`` (per impl, the kernel module its launcher came from:
    :func:`kernelcamp.kernel_rev.module_source`);
    and on a GPU the SM clock sampled while the rounds ran (``sm_clock_during_rounds``: min/p50/max MHz,
    kernelcamp.provenance.ClockSampler). Raises what the kernel launcher raises on bad input
    (``ValueError``) or an unlaunchable config (Triton's ``OutOfResources``), ``KernelcampError`` for
    an unusable plan.
    """
    import contextlib
    import statistics
    import time

    import torch

    from kernelcamp.bench import timing
    from kernelcamp.kernel_rev import module_source
    from kernelcamp.provenance import ClockSampler, smi_index
    from kernelcamp.spec import import_kernel
    from kernelcamp.targets import roofline_pct

    k = import_kernel(params["kernel"]["module"])

    wl, bk, tgt = params["workload"], params["benchmark"]["kernel"], params["target"]
    shape, dot = run_shape(params, device), dot_dtype(params, device)
    gpu = device == "cuda"
    plan = kernel_plan(params, device)
    roofline = roofline_basis(tgt, torch.cuda.get_device_name() if gpu else None)
    peaks = roofline if roofline.get("target") else None
    if gpu and peaks is None:
        log(f"roofline % not computed: {roofline['why']}")
    modules = impl_kernels(params, variants)
    launchers = {name: modules[name].SparseMLADecode(v, dot_dtype=dot) for name, v in variants.items()}
    batch_sizes = run_batch_sizes(params, device)
    # the SM count the launchers resolve "auto" splits with (the kernel module's _num_sms: the GPU's, or its
    # default on a CPU)
    num_sms = (
        torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        if gpu
        else getattr(k, "DEFAULT_NUM_SMS", None)
    )
    log(
        f"batch sizes {batch_sizes}: H={shape['num_heads']} topk={shape['topk']} on {device}; rounds "
        f"{plan.min_rounds}..{plan.max_rounds}, looks at {plan.looks} (each at {plan.confidence_per_look:.2%}"
        f" confidence), time budget {f'{plan.max_seconds} s' if plan.max_seconds else 'none'}"
    )
    calls, configs = {}, {}
    for bi, B in enumerate(batch_sizes):
        args = launch_args(params, device, B, seed=bi)
        for name, fn in launchers.items():
            calls[(B, name)] = lambda fn=fn, a=args: fn(*a, check_indices=False)
    if gpu:
        timers = {}
        for (B, name), fn in calls.items():
            log(f"capturing {name} at batch {B}")
            timers[(B, name)] = timing.GraphTimer(fn, warmup=bk["warmup"])
            configs[(B, name)] = launchers[name].last_config

        def sample(key: tuple, r: int) -> float:
            return statistics.median(timers[key].sample(bk["replays_per_round"]))
    else:

        def sample(key: tuple, r: int) -> float:
            us = timing.bench_cpu(calls[key], replays=bk["cpu_replays_per_round"], warmup=int(r == 0))
            configs[key] = launchers[key[1]].last_config
            return sorted(us)[len(us) // 2]

    # the SM clock while the rounds run
    clocks = ClockSampler(smi_index(torch.cuda.current_device())) if gpu else None
    got: list[dict] = []
    looks: list[dict] = []
    overall: dict = {}
    keys = list(calls)
    t0 = time.perf_counter()
    with clocks if clocks is not None else contextlib.nullcontext():
        r = 0
        while True:
            pos: dict[int, int] = {}
            for B, name in timing.round_order(keys, r):
                p = pos[B] = pos.get(B, -1) + 1
                got.append({"batch": B, "round": r, "impl": name, "position": p, "latency_us": sample((B, name), r)})
            r += 1
            geo = _geomeans(got, batch_sizes)
            log(f"round {r}/{plan.max_rounds}: geometric-mean latency candidate/baseline {geo[1][-1] / geo[0][-1]:.4f}")
            if r not in plan.looks:
                continue
            elapsed = time.perf_counter() - t0
            overall = plan.analyse(*geo)
            # a CPU run's interval decides nothing (withhold_cpu_decisions): it runs its fixed cpu_rounds
            reason = plan.stop_reason(r, overall["decision"] if gpu else None, elapsed)
            looks.append({k_: overall[k_] for k_ in ("n_rounds", "ratio", "ci_lo", "ci_hi", "half_width", "decision")})
            looks[-1]["elapsed_s"] = round(elapsed, 3)
            log(
                f"look {len(looks)}/{len(plan.looks)} after {r} rounds ({elapsed:.1f} s): ratio {overall['ratio']:.4f} "
                f"[{overall['ci_lo']:.4f}, {overall['ci_hi']:.4f}] ({overall['confidence_per_look']:.2%} CI), "
                f"resolution +-{100 * overall['half_width']:.2f}%: "
                + (overall["decision"] if gpu else "(a CPU run decides nothing)")
                + (f"; stop ({reason})" if reason else "")
            )
            if reason:
                overall.update(stop_reason=reason, elapsed_s=round(elapsed, 3))
                break
    fl_by = {
        B: (
            k.flops(wl["layout"], B, shape["num_heads"], shape["topk"]),
            k.bytes_moved(wl["layout"], B, shape["num_heads"], shape["topk"]),
        )
        for B in batch_sizes
    }
    rows, per_batch = [], {}
    for B in batch_sizes:
        res: dict[str, Any] = {}
        fl, by = fl_by[B]
        for name in launchers:
            s = timing.summarize([g["latency_us"] for g in got if g["impl"] == name and g["batch"] == B])
            t = s["latency_us_p50"] * 1e-6
            cfg = configs.get((B, name))
            splits = _splits_ran(modules[name], cfg, B, shape, num_sms)
            res[name] = {
                **s,
                "tflops": fl / t / 1e12,
                "gbps": by / t / 1e9,
                "roofline_pct": roofline_pct(by, fl, t, peaks) if peaks else None,
                "config_ran": cfg.label() if cfg else None,
                # split-K as launched: "auto" resolves from B and the SM count of the GPU that ran (or
                # benchmark.run_as_target's), so the label alone did not say how many splits ran (helper audit R7)
                "num_splits_ran": splits,
                "num_sms": num_sms if splits is not None else None,
            }
        base = [g["latency_us"] for g in got if g["impl"] == "baseline" and g["batch"] == B]
        cand = [g["latency_us"] for g in got if g["impl"] == "candidate" and g["batch"] == B]
        res["ab"] = plan.analyse(base, cand)
        per_batch[str(B)] = res
    for g in got:
        rows.append(
            {
                **g,
                "device": device,
                "config": per_batch[str(g["batch"])][g["impl"]]["config_ran"],
                "timing": "cuda_graph_l2_flushed" if gpu else "cpu_interpreter_perf_counter",
            }
        )
    overall |= {
        "looks": looks,
        "what": "per round, the geometric mean over batch sizes of each impl's latency; paired candidate/baseline",
    }
    return rows, {
        "batch": per_batch,
        "overall": overall,
        "plan": {
            "min_rounds": plan.min_rounds,
            "max_rounds": plan.max_rounds,
            "look_every": plan.look_every,
            "max_seconds": plan.max_seconds,
            "looks": plan.looks,
            "confidence": plan.confidence,
            "confidence_per_look": plan.confidence_per_look,
            "threshold": plan.threshold,
            "method": "Bonferroni over the planned looks (kernelcamp.stats)",
        },
        "dot_dtype": dot,
        "kernels": {name: module_source(modules[name]) for name in launchers},
        "sm_clock_during_rounds": clocks.summary() if clocks is not None else {},
        "roofline": roofline,
        "shape": {k_: shape[k_] for k_ in ("num_heads", "topk", "page_size", "num_cache_tokens")}
        | {"layout": wl["layout"]},
    }


def roofline_basis(target: dict, gpu_name: str | None) -> dict:
    """What the roofline % of a run on the GPU ``gpu_name`` is measured against (``None``: a CPU run).

    ``target`` is params.yaml's ``target`` section. Returns :func:`kernelcamp.targets.peaks_for_gpu`'s
    mapping (``gpu``, ``target``, ``peak_gbps`` in GB/s, ``peak_bf16_tflops`` in TFLOP/s, their sources)
    plus ``params_target`` and ``params_target_gpu`` (the GPU params.yaml's target describes); when no
    target states this GPU's peaks (or on a CPU), ``target`` is ``None`` and ``why`` says what is missing.
    """
    from kernelcamp.targets import peaks_for_gpu

    described = {"params_target": target.get("name"), "params_target_gpu": target.get("gpu")}
    if gpu_name is None:
        return {"gpu": None, "target": None, "why": "a CPU run has no roofline", **described}
    peaks = peaks_for_gpu(gpu_name, target)
    if peaks is None:
        return {
            "gpu": gpu_name,
            "target": None,
            "why": f"no conf/target/*.yaml has gpu: {gpu_name} with peak_gbps and peak_bf16_tflops (add one, "
            "with the datasheet's or a measured figure and its source)",
            **described,
        }
    return {**peaks, **described}


def impl_kernels(params: dict, variants: dict) -> dict:
    """{impl: the kernel module it launches} for the impls of ``variants`` (:func:`kernelcamp.spec.kernel_for`)."""
    from kernelcamp.spec import kernel_for

    return {name: kernel_for(params, name) for name in variants}


def _geomeans(got: list[dict], batch_sizes: list[int]) -> tuple[list[float], list[float]]:
    """Per complete round, the geometric mean over ``batch_sizes`` of each impl's latency:
    ``(baseline per round, candidate per round)``."""
    import math

    out = []
    for impl in ("baseline", "candidate"):
        by_round: dict[int, list[float]] = {}
        for g in got:
            if g["impl"] == impl:
                by_round.setdefault(g["round"], []).append(math.log(g["latency_us"]))
        out.append([math.exp(sum(v) / len(v)) for _, v in sorted(by_round.items()) if len(v) == len(batch_sizes)])
    return out[0], out[1]


def decision_metrics(ab: dict) -> dict:
    """Flat numeric figures of a sequential A/B result for a metrics file: ``decision_code``
    (kernelcamp.stats.DECISION_CODES), ``half_width`` (ratio units), ``rounds_used``, and
    ``stopped_early`` (1 when the decision stopped the rounds before their maximum). None left out."""
    from kernelcamp.stats import DECISION_CODES

    m = {
        "decision_code": DECISION_CODES.get(ab.get("decision")),
        "half_width": ab.get("half_width"),
        "rounds_used": ab.get("n_rounds"),
        # decided before the maximum (a run decided at its last look did not stop early)
        "stopped_early": None
        if "stop_reason" not in ab
        else int(ab["stop_reason"] == "decided" and ab.get("n_rounds", 0) < ab.get("max_rounds", float("inf"))),
    }
    return {k: v for k, v in m.items() if v is not None}

"""Which configs of a variant fit a target: compile figures (:mod:`kernelcamp.inspect.compile`)
against the target's per-block limits and occupancy (:mod:`kernelcamp.targets`), per config x kernel
x target; and the kernel module whose ``compile_specs`` name the kernels of a config.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kernelcamp.errors import KernelcampError
from kernelcamp.inspect.compile import FIGURES, Progress, SpecsFor, check_target_env, compile_many, short_error
from kernelcamp.targets import Target, block_limit, occupancy
from kernelcamp.variant import LaunchConfig, Variant

# ----------------------------------------------------------------------------------------------
# Configs x kernels x targets


def _fit(fig: dict, target: Target, config_is_list: bool, num_warps: int) -> tuple[bool, str | None]:
    """Whether one kernel of a config can launch on ``target``, and why not: the per-block limits of
    ``kernelcamp.targets.block_limit`` (threads, registers per thread and per block, shared memory)."""
    if fig["error"]:
        return False, f"does not compile for {target.name}: {fig['error']}"
    shared, static, regs = fig["shared_bytes"], fig.get("static_shared_bytes") or 0, fig["registers"]
    limit = target.shared_bytes_per_block
    consequence = (
        "Triton's autotuner would drop it silently" if config_is_list else "the launch would fail with OutOfResources"
    )
    if shared is not None and shared > limit:
        return False, (f"needs {shared} B shared memory, {target.name} allows {limit} B per block: {consequence}")
    if shared is not None and shared + static > limit:
        return False, (
            f"needs {shared} B dynamic + {static} B static shared memory, {target.name} allows {limit} B "
            "per block: Triton's check passes but the driver refuses the launch"
        )
    why = block_limit(target, regs, None if shared is None else shared + static, num_warps)
    if why:
        return False, why
    return True, None  # a figure that could not be read is named in `unreadable`, not guessed


def _specs_at(specs_for: SpecsFor, cfg: LaunchConfig, target: Target) -> Any:
    """``specs_for(cfg, target=target)`` where it takes the target (its binaries can depend on the SM count,
    :func:`specs_for_workload`), else ``specs_for(cfg)``. ``ValueError`` when a spec names the archs it compiles
    for (``archs``) and the target's is not one: it is never compiled there (the warp-specialized kernel's
    wgmma aborted LLVM for sm120, taking the whole compile child down)."""
    try:
        takes_target = "target" in inspect.signature(specs_for).parameters
    except (TypeError, ValueError):  # a callable without a signature
        takes_target = False
    specs = list(specs_for(cfg, target=target) if takes_target else specs_for(cfg))
    for s in specs:
        archs = getattr(s, "archs", None)
        if archs and target.arch not in archs:
            only = ", ".join(f"sm{a}" for a in archs)
            raise ValueError(f"kernel {s.name} compiles for {only} only, not sm{target.arch}")
    return specs


def inspect_configs(
    configs: Sequence[LaunchConfig],
    targets: Sequence[Target],
    specs_for: SpecsFor,
    *,
    is_list: bool | None = None,
    use_cache: bool = True,
    cache_root: Path | None = None,
    progress: Progress | None = None,
    strict: bool = False,
) -> list[dict]:
    """One row per (target, config, kernel) with the figures, occupancy and fit.

    ``specs_for(config)`` returns the kernels of one config (e.g. ``compile_specs`` bound to a
    shape). A config whose specs cannot be built or whose kernel does not compile gets rows with
    ``error`` and ``fits: False`` naming it; with ``strict`` that raises ``KernelcampError`` instead.
    Raises ``KernelcampError`` for ``TRITON_OVERRIDE_ARCH`` set to another arch (``check_target_env``)
    and as ``compile_many`` does. Figures are in bytes (per block for shared memory, per thread for
    stack, local memory and spills) and registers per thread. Row keys: target, arch, config_index,
    config (label), the launch fields, kernel, the figures, ctas_per_sm, warps_per_sm, limited_by,
    fits, reason, error, unreadable, compile_s, cached.
    """
    for target in targets:  # before any work: an environment that retargets the compile is one line
        check_target_env(target.arch)
    is_list = len(configs) > 1 if is_list is None else is_list
    built: list[tuple[Target, int, LaunchConfig, list | str]] = []  # specs, or why they cannot be built
    for target in targets:
        for i, cfg in enumerate(configs):
            try:
                built.append((target, i, cfg, list(_specs_at(specs_for, cfg, target))))
            except Exception as e:  # noqa: BLE001 - the kernel module rejects the config
                msg = f"config {cfg.label()} cannot be built: {short_error(e)}"
                if strict:
                    raise KernelcampError(msg) from e
                built.append((target, i, cfg, msg))
    jobs = [(spec, t.arch) for t, _, _, specs in built if not isinstance(specs, str) for spec in specs]
    if progress:
        progress(f"inspecting {len(jobs)} kernel compile(s) for {', '.join(t.name for t in targets)}")
    figs = iter(compile_many(jobs, use_cache=use_cache, root=cache_root))
    rows: list[dict] = []
    for target, i, cfg, specs in built:
        base = {"target": target.name, "arch": target.arch, "config_index": i, "config": cfg.label(), **cfg.as_dict()}
        if isinstance(specs, str):
            rows.append(
                {
                    **base,
                    "kernel": None,
                    **dict.fromkeys(FIGURES),
                    "ctas_per_sm": 0,
                    "warps_per_sm": 0,
                    "limited_by": None,
                    "fits": False,
                    "reason": specs,
                    "error": specs,
                    "unreadable": dict.fromkeys(FIGURES, "not built"),
                    "compile_s": 0.0,
                    "cached": False,
                }
            )
            continue
        for spec in specs:
            fig = next(figs)
            if progress:
                took = "cached" if fig["cached"] else f"compiled in {fig['compile_s']:.2f} s"
                failed = f": ERROR {fig['error']}" if fig["error"] else ""
                progress(f"{target.name}  {cfg.label()}  {spec.name}  {took}{failed}")
            fits, reason = _fit(fig, target, is_list, spec.num_warps)
            if fig["error"]:
                reason = f"config {cfg.label()} kernel {spec.name}: {reason}"
                if strict:
                    raise KernelcampError(reason)
            elif reason:
                reason = f"kernel {spec.name} {reason}"
            shared = fig["shared_bytes"]
            if shared is not None and fig.get("static_shared_bytes"):
                shared += fig["static_shared_bytes"]
            occ = (
                occupancy(target, fig["registers"], shared, spec.num_warps)
                if not fig["error"]
                else {"ctas_per_sm": 0, "warps_per_sm": 0, "limited_by": None}
            )
            rows.append(
                {
                    **base,
                    "kernel": spec.name,
                    "kernel_num_warps": spec.num_warps,
                    **{k: fig[k] for k in FIGURES},
                    **occ,
                    "fits": fits,
                    "reason": reason,
                    "error": fig["error"],
                    "unreadable": fig["unreadable"],
                    "compile_s": fig["compile_s"],
                    "cached": fig["cached"],
                }
            )
    return rows


def config_fits(rows: Sequence[dict], target: str, config_index: int) -> bool:
    """A config fits a target when it has rows there and all its kernels fit."""
    mine = [r for r in rows if r["target"] == target and r["config_index"] == config_index]
    return bool(mine) and all(r["fits"] for r in mine)


def summarize(variant: Variant, rows: Sequence[dict], target: str) -> dict:
    """Per target: ``n_configs``, ``n_fit``, ``pruned`` [{config, reason}], ``will_run``.

    ``will_run``: a single-config variant runs its config if it fits (else None); a batch table runs
    every row at its batch sizes, so it runs only if every row fits (else None); an autotune list is
    "chosen by autotune among the fitting configs" (named), known only at run time on the GPU.
    """
    labels = [c.label() for c in variant.configs]
    fit = [i for i in range(len(labels)) if config_fits(rows, target, i)]
    pruned = []
    for i, label in enumerate(labels):
        if i in fit:
            continue
        reasons = [r["reason"] for r in rows if r["target"] == target and r["config_index"] == i and r["reason"]]
        pruned.append({"config_index": i, "config": label, "reason": "; ".join(reasons) or "no rows"})
    if not fit:
        will_run = None
    elif getattr(variant, "is_table", False):
        if len(fit) < len(labels):
            will_run = None  # a batch table runs every row (each at its batch sizes): one that does not fit fails
        else:
            will_run = {
                "mode": "table",
                "configs": labels,
                "note": "batch table: the row for each batch size, chosen on the host (no autotune benchmarking; "
                "safe under CUDA-graph capture)",
            }
    elif not variant.is_list:
        will_run = {
            "mode": "single",
            "configs": [labels[0]],
            "note": "one config: no autotune benchmarking (safe under CUDA-graph capture)",
        }
    else:
        will_run = {
            "mode": "autotune",
            "configs": [labels[i] for i in fit],
            "note": f"chosen by autotune among the {len(fit)} fitting config(s) at run time on the GPU",
        }
    return {
        "target": target,
        "n_configs": len(labels),
        "n_fit": len(fit),
        "fit": [labels[i] for i in fit],
        "pruned": pruned,
        "will_run": will_run,
    }


# ----------------------------------------------------------------------------------------------
# The kernel module


def kernel_module(kernel: Mapping[str, Any] | str = "kernels.sparse_mla_decode") -> Any:
    """Import the kernel module named by a params ``kernel`` section (``module``) or a dotted name."""
    name = kernel if isinstance(kernel, str) else kernel.get("module", "kernels.sparse_mla_decode")
    from kernelcamp.spec import import_kernel

    # From this working tree, never $DVC_ROOT's: a queued experiment runs in a temporary copy, and the
    # workspace's kernel may have been edited after it was queued.
    return check_compile_specs(import_kernel(name))


def check_compile_specs(module: Any) -> Any:
    """``module`` itself; ``KernelcampError`` when it has no ``compile_specs`` (the build needs it)."""
    if not hasattr(module, "compile_specs"):
        raise KernelcampError(
            f"kernel module {module.__name__!r} has no compile_specs(layout, num_heads, topk, config, ...)"
        )
    return module


def specs_for_workload(
    module: Any, workload: Mapping[str, Any], dot_dtype: str = "bf16", variant: Variant | None = None
) -> SpecsFor:
    """``(config, target=None) -> module.compile_specs(layout, num_heads, topk, config, dot_dtype)`` at the
    workload's shape. With ``variant`` a single config or a batch table, and where the module's
    ``compile_specs`` takes them, it also asks for ``all_split_d`` (the split kernel once per split-D part count
    the config launches: V3.2's small batch sizes run other binaries than the large ones,
    ``kernels.sparse_mla_decode.resolve_split_d``), the row's ``min_batch`` (after the previous row's
    ``max_batch``) and the target's ``num_sms``, so that each split-kernel binary a row launches there is
    checked, and no other. An autotune list launches one part: its configs get the one binary, as does
    everything when ``variant`` is None or the module predates these arguments (a ``kernel_rev`` file).
    ``KernelcampError`` when the workload lacks layout, num_heads or topk."""
    for f in ("layout", "num_heads", "topk"):
        if f not in workload:
            raise KernelcampError(f"workload lacks {f!r}: see conf/workload/deepseek_v4_flash.yaml")
    layout, heads, topk = workload["layout"], int(workload["num_heads"]), int(workload["topk"])
    takes = inspect.signature(module.compile_specs).parameters
    per_row = variant is not None and (variant.single or variant.is_table) and "all_split_d" in takes
    first: dict[LaunchConfig, int] = {}
    if per_row and variant.is_table:
        lo = 1
        for c in variant.configs:
            first.setdefault(c, lo)
            lo = (c.max_batch or lo) + 1

    def specs(cfg: LaunchConfig, target: Target | None = None) -> Any:
        extra: dict[str, Any] = {}
        if per_row:
            extra["all_split_d"] = True
            if "min_batch" in takes:
                extra["min_batch"] = first.get(cfg, 1)
            if "num_sms" in takes and target is not None:
                extra["num_sms"] = target.num_sms
        return module.compile_specs(layout, heads, topk, cfg, dot_dtype=dot_dtype, **extra)

    return specs


def module_source_hash(module: Any) -> str | None:
    fn = getattr(module, "kernel_source_hash", None)
    return fn() if callable(fn) else None

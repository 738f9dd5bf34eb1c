"""Compile inspection: what every config of a variant costs on a target GPU, from any machine.

Each kernel of each config is compiled for the target arch with Triton's own compiler
(``triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget("cuda", arch, 32),
options={"num_warps", "num_stages"})``; cross-compiling needs no GPU). Figures and where they come
from (never from Triton's cache JSON, whose fields move between versions):

- ``shared_bytes``: ``compiled.metadata.shared``, the dynamic shared memory per block that Triton
  compares with the device's opt-in limit before launching (``CompiledKernel._init_handles``) and
  that makes its autotuner drop a config (``OutOfResources``) without a word.
- ``registers`` (per thread), ``stack_bytes`` (per-thread stack frame), ``static_shared_bytes``:
  ``cuobjdump --dump-resource-usage`` on the cubin (``REG``, ``STACK``, ``SHARED``); cuobjdump ships
  in Triton's wheel (``triton/backends/nvidia/bin``).
- ``spill_bytes``: per-thread local memory, ``STACK + LOCAL`` of the same dump. Triton kernels have
  no local arrays or recursion, so local memory holds only register spills; this is the figure
  Triton reads after loading a kernel as ``n_spills`` (``CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES / 4``),
  here in bytes. (ptxas's "spill stores" is traffic, not footprint, and is not in the cubin.)
- ``ctas_per_sm``, ``warps_per_sm``, ``limited_by``: ``kernelcamp.targets.occupancy``.

A figure that a tool cannot give is ``None`` and named in the row's ``unreadable`` with the reason.

ptxas: Triton 3.6 picks ``ptxas-blackwell`` itself for arch >= 100 (``get_ptxas`` in
``triton/backends/nvidia/compiler.py``, env ``TRITON_PTXAS_BLACKWELL_PATH``), and only that ptxas
accepts the PTX version it emits for sm120 (DESIGN.md, known traps). Versions without that knob use
``TRITON_PTXAS_PATH`` for every arch, so for arch >= 100 both variables point at the wheel's
``ptxas-blackwell`` during the compile (unless the user set them) and are restored afterwards.

Compiles are cached on disk (``cache_dir()``), keyed by the kernel's source hash (the
JITFunction's source and Triton's dependency hash of the functions it calls), signature,
constexprs, attrs, num_warps, num_stages, target arch and Triton version; a warm inspection does
not call ``triton.compile``.

Under ``TRITON_INTERPRET=1`` ``@triton.jit`` yields interpreter functions; the inspector compiles
a fresh ``JITFunction`` of the same Python function (kernels that call other ``@triton.jit``
helpers cannot be inspected in that mode).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import importlib
import inspect as pyinspect
import io
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from kernelcamp.errors import KernelcampError
from kernelcamp.targets import Target, load_target, occupancy
from kernelcamp.variant import LaunchConfig, Variant

FIGURES = ("shared_bytes", "registers", "spill_bytes", "stack_bytes", "static_shared_bytes")
CACHE_VERSION = 1


class KernelSpecLike(Protocol):
    """One kernel to compile: what ``kernels.<module>.compile_specs`` returns (``attrs`` optional)."""

    name: str
    fn: Any  # a @triton.jit JITFunction
    signature: dict[str, str]
    constexprs: dict[str, Any]
    num_warps: int
    num_stages: int


SpecsFor = Callable[[LaunchConfig], Sequence[KernelSpecLike]]
Progress = Callable[[str], None]


# ----------------------------------------------------------------------------------------------
# Tools, keys and the disk cache


def triton_version() -> str:
    import triton

    return triton.__version__


def tool_path(name: str) -> Path:
    """A CUDA tool shipped in Triton's wheel (``cuobjdump``, ``ptxas``, ``ptxas-blackwell``)."""
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name


@contextlib.contextmanager
def ptxas_for(arch: int) -> Iterator[None]:
    """For arch >= 100, point Triton at the wheel's ``ptxas-blackwell`` (see module docstring);
    restore the environment afterwards. No effect below 100 or when the binary is absent."""
    blackwell = tool_path("ptxas-blackwell")
    if arch < 100 or not blackwell.exists():
        yield
        return
    keys = ("TRITON_PTXAS_BLACKWELL_PATH", "TRITON_PTXAS_PATH")
    saved = {k: os.environ.get(k) for k in keys}
    try:
        for k in keys:
            if not saved[k]:
                os.environ[k] = str(blackwell)
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


_JIT_COPIES: dict[int, Any] = {}


def as_jit(fn: Any) -> Any:
    """The ``JITFunction`` to compile: ``fn`` itself, or a JITFunction of an interpreter function's
    Python function (``TRITON_INTERPRET=1``)."""
    from triton.runtime.jit import JITFunction

    if isinstance(fn, JITFunction):
        return fn
    raw = getattr(fn, "fn", None)
    if callable(raw):
        if id(fn) not in _JIT_COPIES:
            _JIT_COPIES[id(fn)] = (fn, JITFunction(raw))
        return _JIT_COPIES[id(fn)][1]
    raise KernelcampError(f"{fn!r} is not a @triton.jit function")


def source_hash(fn: Any) -> str:
    """sha256 (hex) of a kernel's source and of the file that defines it (so an edited helper in the
    same module changes it too). The same in interpreter mode and out of it."""
    jit = as_jit(fn)
    h = hashlib.sha256(jit.src.encode())
    raw = getattr(jit, "fn", None)
    with contextlib.suppress(OSError, TypeError):
        h.update(Path(pyinspect.getsourcefile(raw)).read_bytes())
    return h.hexdigest()


def _jsonable(v: Any) -> Any:
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return repr(v)


def compile_key(spec: KernelSpecLike, arch: int) -> str:
    """Disk-cache key (sha256 hex) of one kernel compile for one arch."""
    payload = {
        "v": CACHE_VERSION,
        "source": source_hash(spec.fn),
        "name": spec.name,
        "signature": _jsonable(dict(spec.signature)),
        "constexprs": _jsonable(dict(spec.constexprs)),
        "attrs": _jsonable(dict(getattr(spec, "attrs", None) or {})),
        "num_warps": spec.num_warps,
        "num_stages": spec.num_stages,
        "arch": arch,
        "triton": triton_version(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def cache_dir() -> Path:
    """``$KERNELCAMP_CACHE_DIR`` or ``<DVC_ROOT or cwd>/.kernelcamp_cache/inspect`` (git-ignored)."""
    from kernelcamp.provenance import dvc_root

    env = os.environ.get("KERNELCAMP_CACHE_DIR")
    return Path(env) if env else dvc_root() / ".kernelcamp_cache" / "inspect"


def _cache_read(key: str, root: Path) -> dict | None:
    path = root / f"{key}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _cache_write(key: str, root: Path, figures: dict, cubin: bytes | None) -> None:
    from kernelcamp.io import write_json_atomic

    try:
        if cubin is not None:
            (root / "cubin").mkdir(parents=True, exist_ok=True)
            (root / "cubin" / f"{key}.cubin").write_bytes(cubin)
        write_json_atomic(root / f"{key}.json", figures)
    except OSError as e:  # a read-only cache never fails an inspection
        print(f"warning: cannot write the inspect cache at {root}: {e}", file=sys.stderr)


# ----------------------------------------------------------------------------------------------
# One compile


_RESOURCE_RE = re.compile(r"Function\s+(\S+):\s*\n\s*(.*)")


def parse_resource_usage(text: str, kernel: str) -> dict[str, int]:
    """``{"REG": .., "STACK": .., "SHARED": .., "LOCAL": ..}`` of ``kernel`` from
    ``cuobjdump --dump-resource-usage`` output. Raises ``ValueError`` when it is not there."""
    for name, fields in _RESOURCE_RE.findall(text):
        if name == kernel:
            return {k: int(v) for k, v in re.findall(r"([A-Z]+(?:\[\d+\])?):(\d+)", fields)}
    raise ValueError(f"no resource line for function {kernel!r} in cuobjdump output")


def read_cubin(cubin: bytes, kernel: str) -> tuple[dict[str, int | None], dict[str, str]]:
    """Registers, stack, spill and static shared bytes of ``kernel`` in ``cubin`` via cuobjdump.

    Returns ``(figures, unreadable)``; a figure that cannot be read is ``None`` with its reason.
    """
    names = ("registers", "stack_bytes", "spill_bytes", "static_shared_bytes")
    tool = tool_path("cuobjdump")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "kernel.cubin"
            path.write_bytes(cubin)
            out = subprocess.run(
                [str(tool), "--dump-resource-usage", str(path)], capture_output=True, text=True, timeout=60
            )
        if out.returncode != 0:
            raise RuntimeError(f"cuobjdump exit {out.returncode}: {out.stderr.strip()[:200]}")
        usage = parse_resource_usage(out.stdout, kernel)
    except (OSError, subprocess.SubprocessError, RuntimeError, ValueError) as e:
        return dict.fromkeys(names), dict.fromkeys(names, f"cuobjdump ({tool}) failed: {e}")
    figures: dict[str, int | None] = {
        "registers": usage.get("REG"),
        "stack_bytes": usage.get("STACK"),
        "spill_bytes": usage["STACK"] + usage.get("LOCAL", 0) if "STACK" in usage else None,
        "static_shared_bytes": usage.get("SHARED"),
    }
    return figures, {k: "not in cuobjdump's resource line" for k, v in figures.items() if v is None}


def _short_error(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("^")]
    # Triton's CompilationError puts the source excerpt first and the message last.
    msg = lines[-1] if lines else text
    return f"{type(e).__name__}: {msg}"[:400]


def _compile_one(spec: KernelSpecLike, arch: int) -> tuple[dict, bytes | None]:
    """Compile in this process; figures (without ``cached``) and the cubin."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    t0 = time.perf_counter()
    cubin = None
    figures: dict[str, Any] = dict.fromkeys(FIGURES)
    unreadable: dict[str, str] = {}
    error = None
    try:
        src = ASTSource(as_jit(spec.fn), dict(spec.signature), dict(spec.constexprs), getattr(spec, "attrs", None))
        # Triton prints the whole PTX to stdout when ptxas fails; keep that out of our output.
        with ptxas_for(arch), contextlib.redirect_stdout(io.StringIO()):
            compiled = triton.compile(
                src,
                target=GPUTarget("cuda", arch, 32),
                options={"num_warps": spec.num_warps, "num_stages": spec.num_stages},
            )
    except Exception as e:  # noqa: BLE001 - any compiler failure becomes a row error
        error = _short_error(e)
        unreadable = dict.fromkeys(FIGURES, "did not compile")
    else:
        shared = getattr(compiled.metadata, "shared", None)
        figures["shared_bytes"] = int(shared) if shared is not None else None
        if shared is None:
            unreadable["shared_bytes"] = "compiled.metadata has no `shared` on this Triton version"
        cubin = compiled.asm.get("cubin")
        if cubin is None:
            unreadable.update(dict.fromkeys(FIGURES[1:], "the compiled kernel has no cubin"))
        else:
            name = getattr(compiled.metadata, "name", None) or spec.fn.__name__
            cub_figures, cub_unreadable = read_cubin(cubin, name)
            figures.update(cub_figures)
            unreadable.update(cub_unreadable)
    result = {
        **figures,
        "unreadable": unreadable,
        "error": error,
        "compile_s": round(time.perf_counter() - t0, 3),
        "triton": triton_version(),
        "arch": arch,
    }
    return result, cubin


def _interpreted(fn: Any) -> bool:
    from triton.runtime.jit import JITFunction

    return not isinstance(fn, JITFunction)


def _compile_in_child(jobs: Sequence[tuple[KernelSpecLike, int]]) -> list[tuple[dict, bytes | None]]:
    """Compile in a child Python without ``TRITON_INTERPRET`` (interpreter mode replaces Triton's own
    ``@jit`` helpers such as ``tl.cdiv`` with interpreter functions, which the compiler cannot call).
    The child imports each kernel by module and name, so kernels must live at module level."""
    payload = []
    for spec, arch in jobs:
        raw = getattr(as_jit(spec.fn), "fn", None)
        payload.append(
            {
                "module": raw.__module__,
                "qualname": raw.__qualname__,
                "name": spec.name,
                "signature": dict(spec.signature),
                "constexprs": dict(spec.constexprs),
                "attrs": getattr(spec, "attrs", None),
                "num_warps": spec.num_warps,
                "num_stages": spec.num_stages,
                "arch": arch,
            }
        )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    with tempfile.TemporaryDirectory() as tmp:
        inp, out = Path(tmp) / "jobs.pkl", Path(tmp) / "figures.json"
        inp.write_bytes(pickle.dumps(payload))
        code = f"from kernelcamp.inspect import _child_main; _child_main({str(inp)!r}, {str(out)!r})"
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        if r.returncode != 0 or not out.exists():
            tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
            raise KernelcampError(f"the compile subprocess (run without TRITON_INTERPRET) failed: {tail}")
        results = json.loads(out.read_text())
    return [(fig, base64.b64decode(cubin) if cubin else None) for fig, cubin in results]


def _child_main(jobs_path: str, out_path: str) -> None:
    """Entry point of ``_compile_in_child``'s subprocess."""
    from types import SimpleNamespace

    results = []
    for job in pickle.loads(Path(jobs_path).read_bytes()):
        fn = importlib.import_module(job.pop("module"))
        for part in job.pop("qualname").split("."):
            fn = getattr(fn, part)
        arch = job.pop("arch")
        fig, cubin = _compile_one(SimpleNamespace(fn=fn, **job), arch)
        results.append([fig, base64.b64encode(cubin).decode() if cubin else None])
    Path(out_path).write_text(json.dumps(results))


def compile_many(
    jobs: Sequence[tuple[KernelSpecLike, int]], use_cache: bool = True, root: Path | None = None
) -> list[dict]:
    """Figures of each ``(spec, arch)`` job, from the disk cache or compiled (identical jobs once).

    Each result has the ``FIGURES``, ``unreadable`` ({figure: reason}), ``error`` (None, or why it did
    not compile), ``compile_s`` (of the compile that made the figures) and ``cached``. Never raises
    for a compile error: the caller names the config.
    """
    root = cache_dir() if root is None else root
    keys = [compile_key(spec, arch) for spec, arch in jobs]
    found: dict[str, dict] = {}
    todo: dict[str, tuple[KernelSpecLike, int]] = {}
    for key, job in zip(keys, jobs, strict=True):
        if key in found or key in todo:
            continue
        hit = _cache_read(key, root) if use_cache else None
        if hit is not None:
            found[key] = {**hit, "cached": True}
        else:
            todo[key] = job
    if todo:
        items = list(todo.items())
        if any(_interpreted(spec.fn) for _, (spec, _a) in items):
            compiled = _compile_in_child([job for _, job in items])
        else:
            compiled = [_compile_one(*job) for _, job in items]
        for (key, _job), (fig, cubin) in zip(items, compiled, strict=True):
            if use_cache and not (fig["unreadable"] and fig["error"] is None):  # never cache a tool failure
                _cache_write(key, root, fig, cubin)
            found[key] = {**fig, "cached": False}
    seen: set[str] = set()
    out = []
    for key in keys:  # a job repeated in one call is compiled once; its repeats read as cached
        out.append(found[key] if key not in seen else {**found[key], "cached": True})
        seen.add(key)
    return out


def compile_figures(spec: KernelSpecLike, arch: int, use_cache: bool = True, root: Path | None = None) -> dict:
    """Figures of one kernel for ``arch`` (see ``compile_many``)."""
    return compile_many([(spec, arch)], use_cache=use_cache, root=root)[0]


# ----------------------------------------------------------------------------------------------
# Configs x kernels x targets


def _fit(fig: dict, target: Target, config_is_list: bool) -> tuple[bool, str | None]:
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
    if regs is not None and regs > target.max_registers_per_thread:
        return False, f"needs {regs} registers per thread, {target.name} allows {target.max_registers_per_thread}"
    return True, None  # a figure that could not be read is named in `unreadable`, not guessed


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
    Row keys: target, arch, config_index, config (label), the launch fields, kernel, the figures,
    ctas_per_sm, warps_per_sm, limited_by, fits, reason, error, unreadable, compile_s, cached.
    """
    is_list = len(configs) > 1 if is_list is None else is_list
    built: list[tuple[Target, int, LaunchConfig, list | str]] = []  # specs, or why they cannot be built
    for target in targets:
        for i, cfg in enumerate(configs):
            try:
                built.append((target, i, cfg, list(specs_for(cfg))))
            except Exception as e:  # noqa: BLE001 - the kernel module rejects the config
                msg = f"config {cfg.label()} cannot be built: {_short_error(e)}"
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
            fits, reason = _fit(fig, target, is_list)
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

    ``will_run``: a single-config variant runs its config if it fits (else None); a list is
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
    module = import_kernel(name)
    if not hasattr(module, "compile_specs"):
        raise KernelcampError(f"kernel module {name!r} has no compile_specs(layout, num_heads, topk, config, ...)")
    return module


def specs_for_workload(module: Any, workload: Mapping[str, Any], dot_dtype: str = "bf16") -> SpecsFor:
    """``config -> module.compile_specs(layout, num_heads, topk, config, dot_dtype)`` at the workload's
    full shape (compile cost and figures do not depend on the batch size)."""
    for f in ("layout", "num_heads", "topk"):
        if f not in workload:
            raise KernelcampError(f"workload lacks {f!r}: see conf/workload/deepseek_v4_flash.yaml")
    layout, heads, topk = workload["layout"], int(workload["num_heads"]), int(workload["topk"])
    return lambda cfg: module.compile_specs(layout, heads, topk, cfg, dot_dtype=dot_dtype)


def module_source_hash(module: Any) -> str | None:
    fn = getattr(module, "kernel_source_hash", None)
    return fn() if callable(fn) else None


# ----------------------------------------------------------------------------------------------
# Live readout on a GPU


def live_figures_from_jit(fn: Any) -> list[dict]:
    """Registers and spill bytes of every kernel the JIT has compiled for ``fn`` on this GPU,
    as the driver reports them after loading (``CompiledKernel.n_regs``, ``n_spills * 4``).

    Rows: device, name, num_warps, num_stages, shared_bytes, registers, spill_bytes, constexprs.
    """
    rows = []
    for device, entry in getattr(as_jit(fn), "device_caches", {}).items():
        cache = entry[0] if isinstance(entry, tuple) else entry
        for kernel in getattr(cache, "values", dict)():
            if getattr(kernel, "n_regs", None) is None:
                kernel._init_handles()
            md = kernel.metadata
            rows.append(
                {
                    "device": device,
                    "name": md.name,
                    "num_warps": md.num_warps,
                    "num_stages": md.num_stages,
                    "shared_bytes": md.shared,
                    "registers": kernel.n_regs,
                    "spill_bytes": kernel.n_spills * 4,
                    "constexprs": {str(k): v for k, v in getattr(kernel.src, "constants", {}).items()},
                }
            )
    return rows


def live_figures(spec: KernelSpecLike, device: int = 0) -> dict:
    """Compile ``spec`` for the local GPU, load it there and read what the driver reports:
    ``{"arch", "shared_bytes", "registers", "spill_bytes"}``. Needs a CUDA GPU."""
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if not torch.cuda.is_available():
        raise KernelcampError("live figures need a CUDA GPU")
    major, minor = torch.cuda.get_device_capability(device)
    arch = major * 10 + minor
    src = ASTSource(as_jit(spec.fn), dict(spec.signature), dict(spec.constexprs), getattr(spec, "attrs", None))
    with ptxas_for(arch), torch.cuda.device(device):
        compiled = triton.compile(
            src,
            target=GPUTarget("cuda", arch, 32),
            options={"num_warps": spec.num_warps, "num_stages": spec.num_stages},
        )
        compiled._init_handles()
    return {
        "arch": arch,
        "shared_bytes": compiled.metadata.shared,
        "registers": compiled.n_regs,
        "spill_bytes": compiled.n_spills * 4,
    }


def compare_live(cross: Mapping[str, Any], live: Mapping[str, Any]) -> list[str]:
    """Mismatches (empty when equal) between cross-compiled and live figures."""
    return [
        f"{k}: cross-compiled {cross.get(k)} != live {live.get(k)}"
        for k in ("shared_bytes", "registers", "spill_bytes")
        if cross.get(k) != live.get(k)
    ]


# ----------------------------------------------------------------------------------------------
# Command line


def _load_yaml(path: Path) -> dict:
    from omegaconf import OmegaConf

    if not path.exists():
        choices = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise KernelcampError(f"no {path.parent.name} named {path.stem!r}: choose one of {choices}")
    return OmegaConf.to_container(OmegaConf.load(path), resolve=True)


def render_table(rows: Sequence[dict], summaries: Sequence[dict], file: Any = None) -> None:
    """Readable table (rich) with dead configs highlighted, then each target's summary."""
    from rich.console import Console
    from rich.table import Table

    console = Console(file=file or sys.stdout, width=160)
    table = Table(title="compile inspection", header_style="bold")
    for col in (
        "target",
        "config",
        "kernel",
        "shared B",
        "regs",
        "spill B",
        "stack B",
        "CTAs/SM",
        "warps/SM",
        "limited by",
        "fits",
        "compile",
    ):
        table.add_column(col, justify="right" if col not in ("target", "config", "kernel", "limited by") else "left")

    def cell(r: dict, k: str) -> str:
        v = r.get(k)
        return "?" if v is None and k in r.get("unreadable", {}) else ("" if v is None else str(v))

    for r in rows:
        style = None if r["fits"] else "bold red"
        table.add_row(
            r["target"],
            r["config"],
            str(r["kernel"]),
            cell(r, "shared_bytes"),
            cell(r, "registers"),
            cell(r, "spill_bytes"),
            cell(r, "stack_bytes"),
            str(r["ctas_per_sm"]),
            str(r["warps_per_sm"]),
            str(r["limited_by"] or ""),
            "yes" if r["fits"] else "NO",
            "cached" if r["cached"] else f"{r['compile_s']:.2f} s",
            style=style,
        )
    console.print(table)
    for s in summaries:
        run = s["will_run"]
        what = "nothing fits" if run is None else f"{run['mode']}: {', '.join(run['configs'])}"
        console.print(
            f"[bold]{s['target']}[/bold]: {s['n_fit']}/{s['n_configs']} configs fit; will run: {what}",
            style=None if run else "bold red",
        )


def announce_pruned(summaries: Sequence[dict], file: Any = None) -> None:
    """One loud stderr line per config a target prunes."""
    for s in summaries:
        for p in s["pruned"]:
            print(f"PRUNED on {s['target']}: {p['config']}: {p['reason']}", file=file or sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kernelcamp inspect",
        description="Compile every config of a variant for target GPUs (no GPU needed) and report shared memory, "
        "registers, spills and occupancy, and which configs a target would prune.",
        epilog="examples:\n  kernelcamp inspect --variant story_autotune --target sm120 --target sm90\n"
        "  kernelcamp inspect --params params.yaml --target sm120 --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--variant", help="a file name in conf/variant/ (default: the params.yaml `variant` with --params)")
    p.add_argument(
        "--target",
        action="append",
        default=[],
        help="a file name in conf/target/ or `auto`; repeat for several (default: params.yaml's target)",
    )
    p.add_argument("--workload", help="a file name in conf/workload/ (default: params.yaml's, else deepseek_v4_flash)")
    p.add_argument("--kernel", help="a file name in conf/kernel/ (default: params.yaml's, else sparse_mla_decode)")
    p.add_argument("--params", help="read variant/target/workload/kernel sections from this params.yaml")
    p.add_argument("--json", action="store_true", help="print JSON (rows and per-target summaries) on stdout")
    p.add_argument("--no-cache", action="store_true", help="compile even when the disk cache has the figures")
    p.add_argument("--quiet", action="store_true", help="no per-compile progress on stderr")
    return p


def cli_main(argv: Sequence[str] | None = None) -> int:
    """``kernelcamp inspect``: returns 0, or 1 when some target has no fitting config, 2 on errors."""
    from kernelcamp.io import load_params
    from kernelcamp.targets import conf_dir
    from kernelcamp.variant import parse_variant

    args = build_parser().parse_args(argv)
    if "triton" not in sys.modules:  # interpreter mode (read at triton's import) cannot cross-compile
        os.environ.pop("TRITON_INTERPRET", None)
    try:
        params = load_params(args.params) if args.params else {}
        conf = conf_dir()

        def group(name: str, chosen: str | None, default: str | None) -> Any:
            if chosen:
                return _load_yaml(conf / name / f"{chosen}.yaml")
            if name in params:
                return params[name]
            if default is None:
                raise KernelcampError(f"give --{name} (a file in conf/{name}/) or --params params.yaml")
            return _load_yaml(conf / name / f"{default}.yaml")

        variant = parse_variant(group("variant", args.variant, None))
        workload = group("workload", args.workload, "deepseek_v4_flash")
        kernel = group("kernel", args.kernel, "sparse_mla_decode")
        targets = (
            [load_target(t) for t in args.target]
            if args.target
            else [load_target(params["target"])]
            if "target" in params
            else [load_target("sm90")]
        )
        module = kernel_module(kernel)
        specs_for = specs_for_workload(module, workload, kernel.get("dot_dtype", "bf16"))
        progress = None if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
        rows = inspect_configs(
            variant.configs, targets, specs_for, is_list=variant.is_list, use_cache=not args.no_cache, progress=progress
        )
    except KernelcampError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    summaries = [summarize(variant, rows, t.name) for t in targets]
    announce_pruned(summaries)
    if args.json:
        out = {
            "variant": variant.name,
            "config_hash": variant.config_hash(),
            "workload": workload.get("name"),
            "kernel_source_hash": module_source_hash(module),
            "triton": triton_version(),
            "targets": [t.as_dict() for t in targets],
            "summaries": summaries,
            "rows": rows,
        }
        print(json.dumps(out, indent=2, default=str))
    else:
        render_table(rows, summaries)
    return 0 if all(s["n_fit"] for s in summaries) else 1

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
  in Triton's wheel (``triton/backends/nvidia/bin``). ``local_bytes`` = ``STACK + LOCAL``: the
  per-thread local memory the driver reports after loading (``CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES``,
  which Triton calls ``n_spills`` and reads in units of 4 bytes).
- ``spill_bytes`` / ``spill_load_bytes``: ptxas's "bytes spill stores" / "bytes spill loads" for the
  kernel, read from the ``ptxas -v`` log of the very ptxas run that produced the cubin (Triton runs
  ptxas with ``-v`` and prints the log under ``TRITON_DUMP_PTXAS_LOG=1``; the compile child sets it
  and ``TRITON_ALWAYS_COMPILE=1`` so the log is never skipped by Triton's own cache). ptxas reports
  the stack frame and the spills separately ("32 bytes stack frame, 0 bytes spill stores"): a
  ``tl.sin`` needs a stack frame without spilling, so the two are never added. The log's stack
  frame and register count must equal cuobjdump's, else the spill figures are ``unreadable``.
- ``ctas_per_sm``, ``warps_per_sm``, ``limited_by`` and the per-block limits of ``fits``:
  ``kernelcamp.targets.occupancy`` and ``kernelcamp.targets.block_limit`` (CUDA Occupancy
  Calculator).

A figure that a tool cannot give is ``None`` and named in the row's ``unreadable`` with the reason.

ptxas: Triton 3.6 picks ``ptxas-blackwell`` itself for arch >= 100 (``get_ptxas`` in
``triton/backends/nvidia/compiler.py``, env ``TRITON_PTXAS_BLACKWELL_PATH``), and only that ptxas
accepts the PTX version it emits for sm120 (DESIGN.md, known traps). Versions without that knob use
``TRITON_PTXAS_PATH`` for every arch, so for arch >= 100 both variables point at the wheel's
``ptxas-blackwell`` during the compile (unless the user set them) and are restored afterwards.

Compiles run in a child process (``_compile_in_child``), never in the caller: Triton's compiler
runs in C++ for as long as a pass takes (minutes for ``num_stages=100000``), and Python runs a
signal handler only between bytecodes, so an in-process compile would hold off SIGTERM/SIGINT. The
child has its own process group and dies with its parent (``PR_SET_PDEATHSIG``); the parent waits
for it interruptibly and, on any exception (the ``KeyboardInterrupt`` of SIGINT, the exception
``kernelcamp.tracking.tracked_stage`` raises on SIGTERM) or on a SIGTERM it would otherwise die of,
kills the child's whole group (ptxas included) before the signal takes its course. Kernels must
therefore be importable by module and name (defined at module level, not in ``__main__``).

Compiles are cached on disk (``cache_dir()``), keyed (``compile_keys``) by Triton's own cache key
of the compile (``triton.runtime.cache.get_cache_key``: Triton's build, the kernel's
``JITFunction.cache_key`` which hashes the source of every ``@triton.jit`` function it reaches in
any module and the constexpr globals it reads, signature, constexprs, attrs, the backend (ptxas
version and arch) and the parsed options), the environment variables that change what Triton
compiles (Triton's ``get_cache_invalidating_env_vars``), the ptxas binary, the kernel name,
num_warps, num_stages, target arch and Triton version. Only clean results are cached: a compile
error or a figure a tool could not read is compiled again next time. ``TRITON_OVERRIDE_ARCH`` set
to another arch than the target's is refused (it would silently compile for that arch). A warm
inspection does not call ``triton.compile``.

Under ``TRITON_INTERPRET=1`` (read when triton is imported) ``@triton.jit`` yields interpreter
functions, whose dependencies Triton cannot hash; the keys are then computed in a child started
without ``TRITON_INTERPRET`` too.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import importlib
import io
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from kernelcamp.errors import KernelcampError
from kernelcamp.signals import Terminated, die_with_parent, signals_raise
from kernelcamp.variant import LaunchConfig

FIGURES = (
    "shared_bytes",
    "registers",
    "spill_bytes",
    "spill_load_bytes",
    "stack_bytes",
    "local_bytes",
    "static_shared_bytes",
)
CACHE_VERSION = 2  # 2: spill_bytes is ptxas's spill stores (was STACK + LOCAL); keys hash dependencies and env
CHILD_KILL_GRACE_S = 2.0  # seconds a killed compile child gets to exit after SIGKILL before we stop waiting


class KernelSpecLike(Protocol):
    """One kernel to compile: what ``kernels.<module>.compile_specs`` returns. Optional: ``attrs``; ``options``
    (compile options over ``num_warps`` / ``num_stages``: :func:`compile_options`); ``archs`` (the archs it
    compiles for; the inspector prunes others unbuilt, ``kernelcamp.inspect.fit``)."""

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
    """``triton.__version__`` of this process."""
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


def check_target_env(arch: int) -> None:
    """Refuse an environment that would make Triton compile for another arch than ``arch``.

    ``TRITON_OVERRIDE_ARCH`` (Triton's ``knobs.runtime.override_arch``) replaces the target's arch
    in the compile options, so ``inspect --target sm90`` with ``TRITON_OVERRIDE_ARCH=sm80`` would
    report sm80 figures as sm90's. Raises ``KernelcampError`` (one line naming the variable) unless
    it is unset, empty or equal to ``sm<arch>``.
    """
    value = os.environ.get("TRITON_OVERRIDE_ARCH", "").strip()
    if value and value != f"sm{arch}":
        raise KernelcampError(
            f"TRITON_OVERRIDE_ARCH={value} would make Triton compile for {value}, not the target sm{arch}: "
            "unset TRITON_OVERRIDE_ARCH (the target's arch comes from --target / params.yaml's target)"
        )


_ENV_PREFIXES = ("TRITON_", "MLIR_", "LLVM_", "NVPTX_", "AMDGCN_", "DISABLE_", "USE_", "ALLOW_")
_ENV_NOT_COMPILE = ("TRITON_CACHE_DIR", "TRITON_HOME", "TRITON_INTERPRET", "TRITON_DUMP_DIR", "TRITON_PRINT_AUTOTUNING")


def compile_env() -> dict[str, str]:
    """The environment variables set now that change what Triton compiles, with their values.

    Source: Triton's own list, ``triton._C.libtriton.get_cache_invalidating_env_vars()`` (Triton
    3.x; the variables it folds into its cache key, e.g. ``TRITON_DEFAULT_FP_FUSION``,
    ``TRITON_OVERRIDE_ARCH``, ``DISABLE_LLVM_OPT``). A Triton without that function falls back to
    every set variable whose name starts with one of Triton's prefixes (over-inclusive on purpose).
    """
    try:
        from triton._C.libtriton import get_cache_invalidating_env_vars
    except ImportError:
        return {
            k: v for k, v in sorted(os.environ.items()) if k.startswith(_ENV_PREFIXES) and k not in _ENV_NOT_COMPILE
        }
    return {str(k): str(v) for k, v in sorted(get_cache_invalidating_env_vars().items())}


_JIT_COPIES: dict[int, Any] = {}


def as_jit(fn: Any) -> Any:
    """The ``JITFunction`` to compile: ``fn`` itself, or a JITFunction of an interpreter function's
    Python function (``TRITON_INTERPRET=1``). Raises ``KernelcampError`` for anything else."""
    from triton.runtime.jit import JITFunction

    if isinstance(fn, JITFunction):
        return fn
    raw = getattr(fn, "fn", None)
    if callable(raw):
        if id(fn) not in _JIT_COPIES:
            _JIT_COPIES[id(fn)] = (fn, JITFunction(raw))
        return _JIT_COPIES[id(fn)][1]
    raise KernelcampError(f"{fn!r} is not a @triton.jit function")


def _jsonable(v: Any) -> Any:
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return repr(v)


def _key_in_process(spec: KernelSpecLike, arch: int) -> str:
    """``compile_key`` computed here; needs a Triton imported without ``TRITON_INTERPRET``."""
    import triton
    from triton.backends.compiler import GPUTarget

    payload: dict[str, Any] = {
        "v": CACHE_VERSION,
        "name": spec.name,
        "signature": _jsonable(dict(spec.signature)),
        "constexprs": _jsonable(dict(spec.constexprs)),
        "attrs": _jsonable(dict(getattr(spec, "attrs", None) or {})),
        "num_warps": spec.num_warps,
        "num_stages": spec.num_stages,
        "arch": arch,
        "triton": triton.__version__,
    }
    if getattr(spec, "options", None):  # only then: the keys of every other spec stay as they were
        payload["options"] = _jsonable(compile_options(spec))
    with ptxas_for(arch):
        env = compile_env()
        payload["env"] = env
        fn = as_jit(spec.fn)
        src = _source(spec)
        try:  # Triton's own key of this compile (3.x): build, sources reached, backend, options, env
            from triton.backends.nvidia.compiler import get_ptxas
            from triton.compiler.compiler import make_backend
            from triton.runtime.cache import get_cache_key

            backend = make_backend(GPUTarget("cuda", arch, 32))
            options = backend.parse_options(dict(compile_options(spec), **src.parse_options()))
            payload["triton_key"] = hashlib.sha256(get_cache_key(src, backend, options, env).encode()).hexdigest()
            payload["ptxas"] = str(get_ptxas(arch).path)
        except ImportError:  # another Triton layout: the dependency hash and the version still key it
            payload["source"] = fn.cache_key
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def compile_keys(jobs: Sequence[tuple[KernelSpecLike, int]]) -> list[str | None]:
    """Disk-cache key (sha256 hex) of each ``(spec, arch)`` compile, ``None`` where it cannot be
    computed (that compile is then never cached; its error shows when it is compiled).

    The key covers every input that changes the compiled kernel: the source of the kernel and of
    every ``@triton.jit`` function it reaches in any module (Triton's ``JITFunction.cache_key``,
    through ``get_cache_key``), Triton's build (``triton_key``), the compile-affecting environment
    (``compile_env``), the ptxas binary and version, signature, constexprs, attrs, num_warps,
    num_stages and arch. Under ``TRITON_INTERPRET`` the keys are computed in a child process
    without it (interpreter functions have no dependency hash); that raises ``KernelcampError``
    when a kernel cannot be imported there or the child fails as a whole.
    """
    if any(_interpreted(spec.fn) for spec, _ in jobs):
        return _run_child("keys", jobs)
    keys: list[str | None] = []
    for spec, arch in jobs:
        try:
            keys.append(_key_in_process(spec, arch))
        except KernelcampError:
            raise
        except Exception:  # noqa: BLE001 - e.g. an unsupported global: the compile will name it
            keys.append(None)
    return keys


def compile_key(spec: KernelSpecLike, arch: int) -> str | None:
    """Disk-cache key (sha256 hex) of one kernel compile for one arch (see ``compile_keys``)."""
    return compile_keys([(spec, arch)])[0]


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


def parse_ptxas_log(text: str, kernel: str) -> dict[str, int]:
    """``{"stack_bytes", "spill_bytes", "spill_load_bytes", "registers"}`` of ``kernel`` from a
    ``ptxas -v`` log (bytes per thread; registers per thread when ptxas printed them).

    ptxas prints, per function: ``Function properties for <name>`` then ``N bytes stack frame, S
    bytes spill stores, L bytes spill loads``, and for an entry function ``Used R registers``.
    ``spill_bytes`` is ptxas's "spill stores". Raises ``ValueError`` when the kernel is not there.
    """
    props = re.search(
        rf"Function properties for {re.escape(kernel)}\s*\n\s*(\d+) bytes stack frame, (\d+) bytes spill stores, "
        r"(\d+) bytes spill loads",
        text,
    )
    if not props:
        raise ValueError(f"no 'Function properties for {kernel}' in the ptxas log")
    out = {
        "stack_bytes": int(props.group(1)),
        "spill_bytes": int(props.group(2)),
        "spill_load_bytes": int(props.group(3)),
    }
    used = re.search(r"Used (\d+) registers", text[props.end() :])
    if used:
        out["registers"] = int(used.group(1))
    return out


def cuobjdump(cubin: bytes, option: str, timeout: float = 60) -> str:
    """stdout of the wheel's ``cuobjdump <option>`` (e.g. ``--dump-resource-usage``, ``--dump-sass``) on ``cubin``.
    Raises ``RuntimeError`` on a non-zero exit (with its stderr), ``OSError`` / ``subprocess.SubprocessError``
    when it cannot run or times out."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        out = subprocess.run(
            [str(tool_path("cuobjdump")), option, str(path)], capture_output=True, text=True, timeout=timeout
        )
    if out.returncode != 0:
        raise RuntimeError(f"cuobjdump exit {out.returncode}: {out.stderr.strip()[:200]}")
    return out.stdout


def read_cubin(cubin: bytes, kernel: str) -> tuple[dict[str, int | None], dict[str, str]]:
    """Registers, stack, local and static shared bytes of ``kernel`` in ``cubin`` via cuobjdump.

    Returns ``(figures, unreadable)``; a figure that cannot be read is ``None`` with its reason.
    """
    names = ("registers", "stack_bytes", "local_bytes", "static_shared_bytes")
    try:
        usage = parse_resource_usage(cuobjdump(cubin, "--dump-resource-usage"), kernel)
    except (OSError, subprocess.SubprocessError, RuntimeError, ValueError) as e:
        return dict.fromkeys(names), dict.fromkeys(names, f"cuobjdump ({tool_path('cuobjdump')}) failed: {e}")
    figures: dict[str, int | None] = {
        "registers": usage.get("REG"),
        "stack_bytes": usage.get("STACK"),
        "local_bytes": usage["STACK"] + usage.get("LOCAL", 0) if "STACK" in usage else None,
        "static_shared_bytes": usage.get("SHARED"),
    }
    return figures, {k: "not in cuobjdump's resource line" for k, v in figures.items() if v is None}


def _spills(log: str, kernel: str, figures: Mapping[str, Any]) -> tuple[dict[str, int | None], dict[str, str]]:
    """Spill stores/loads from the ptxas log, checked against the cubin's registers and stack."""
    names = ("spill_bytes", "spill_load_bytes")
    try:
        got = parse_ptxas_log(log, kernel)
    except ValueError as e:
        return dict.fromkeys(names), dict.fromkeys(names, f"ptxas -v log: {e}")
    for k in ("registers", "stack_bytes"):
        if k in got and figures.get(k) is not None and got[k] != figures[k]:
            why = f"the ptxas log's {k} ({got[k]}) differs from the cubin's ({figures[k]}): not this cubin's log"
            return dict.fromkeys(names), dict.fromkeys(names, why)
    return {k: got[k] for k in names}, {}


def short_error(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("^")]
    # Triton's CompilationError puts the source excerpt first and the message last.
    msg = lines[-1] if lines else text
    return f"{type(e).__name__}: {msg}"[:400]


def compile_spec(spec: KernelSpecLike, arch: int) -> Any:
    """``triton.compile`` of ``spec`` for ``sm<arch>`` in this process, with the ptxas that ``arch`` needs
    (``ptxas_for``): the inspector's compile child, ``benchmarks/compile_figures.py`` and
    ``benchmarks/ptx_same.py``. The process must have imported triton without ``TRITON_INTERPRET`` (the
    inspector compiles in a child process for that reason). Returns Triton's compiled kernel (``.asm``:
    ``ptx``, ``cubin``, ...; ``.metadata``); raises what Triton raises when it does not compile."""
    import triton
    from triton.backends.compiler import GPUTarget

    with ptxas_for(arch):
        return triton.compile(_source(spec), target=GPUTarget("cuda", arch, 32), options=compile_options(spec))


def compile_options(spec: KernelSpecLike) -> dict[str, Any]:
    """The ``triton.compile`` options of ``spec``: ``num_warps`` and ``num_stages``, then what its optional
    ``options`` mapping sets (e.g. a Gluon warp-specialized kernel's ``num_warps`` 4 and ``maxnreg``)."""
    return {"num_warps": spec.num_warps, "num_stages": spec.num_stages, **dict(getattr(spec, "options", None) or {})}


def _source(spec: KernelSpecLike) -> Any:
    """The ASTSource of ``spec``: Gluon's for a ``@gluon.jit`` kernel, Triton's otherwise."""
    from triton.compiler import ASTSource

    fn = as_jit(spec.fn)
    cls = ASTSource
    if getattr(fn, "is_gluon", lambda: False)():
        from triton.experimental.gluon._runtime import GluonASTSource

        cls = GluonASTSource
    return cls(fn, dict(spec.signature), dict(spec.constexprs), getattr(spec, "attrs", None))


def _compile_one(spec: KernelSpecLike, arch: int) -> tuple[dict, bytes | None]:
    """Compile in this process (the compile child); figures (without ``cached``) and the cubin.

    Spill figures need the ptxas log: run with ``TRITON_DUMP_PTXAS_LOG=1`` and
    ``TRITON_ALWAYS_COMPILE=1`` (``_child_main`` sets both)."""
    t0 = time.perf_counter()
    cubin = None
    figures: dict[str, Any] = dict.fromkeys(FIGURES)
    unreadable: dict[str, str] = {}
    error = None
    log = io.StringIO()
    try:
        check_target_env(arch)
        # Triton prints the whole PTX to stdout when ptxas fails, and the ptxas -v log: keep both here.
        with contextlib.redirect_stdout(log):
            compiled = compile_spec(spec, arch)
    except Exception as e:  # noqa: BLE001 - any compiler failure becomes a row error
        error = short_error(e)
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
            spill_figures, spill_unreadable = _spills(log.getvalue(), name, figures)
            figures.update(spill_figures)
            unreadable.update(spill_unreadable)
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


def _locate(spec: KernelSpecLike) -> tuple[str, str]:
    """Module and qualified name by which a child process imports ``spec.fn``; ``KernelcampError``
    when it cannot (defined in ``__main__`` or inside a function)."""
    raw = getattr(as_jit(spec.fn), "fn", None)
    module, qualname = getattr(raw, "__module__", None), getattr(raw, "__qualname__", "")
    if not module or module == "__main__" or "<locals>" in qualname:
        raise KernelcampError(
            f"kernel {spec.name} ({module}.{qualname}) cannot be imported by a compile subprocess: "
            "define the @triton.jit function at module level in an importable module"
        )
    return module, qualname


def _job_payload(spec: KernelSpecLike, arch: int) -> dict:
    module, qualname = _locate(spec)
    return {
        "module": module,
        "qualname": qualname,
        "name": spec.name,
        "signature": dict(spec.signature),
        "constexprs": dict(spec.constexprs),
        "attrs": getattr(spec, "attrs", None),
        "num_warps": spec.num_warps,
        "num_stages": spec.num_stages,
        "options": dict(getattr(spec, "options", None) or {}),
        "arch": arch,
    }


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's process group (the child and what it started, e.g. ptxas) and reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=CHILD_KILL_GRACE_S)


def _wait_child(cmd: list[str], env: dict[str, str], stderr: Any) -> int:
    """Run ``cmd`` in its own process group and wait for it; return its exit status.

    The wait is interruptible: an exception raised by a signal handler (``KeyboardInterrupt``,
    ``tracked_stage``'s SIGTERM exception) propagates after the child's group is killed. Where
    SIGTERM has its default action (a plain ``kernelcamp inspect``), it is caught for the wait, the
    child's group is killed, and the signal is delivered again so the process still dies of it.
    """
    proc = subprocess.Popen(
        cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True
    )
    # ours to take only where SIGTERM has its default action (a tracked stage's own Terminated passes through)
    take_term = threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) in (
        signal.SIG_DFL,
        None,
    )
    try:
        with signals_raise((signal.SIGTERM,), only_if_default=True):
            return proc.wait()
    except Terminated:
        if not take_term:
            raise
        _kill_group(proc)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        raise  # not reached: the default action ends the process
    finally:
        if proc.poll() is None:
            _kill_group(proc)


def _run_child(mode: str, jobs: Sequence[tuple[KernelSpecLike, int]]) -> list:
    """Run ``_child_main`` in a Python without ``TRITON_INTERPRET``: ``mode`` ``"keys"`` returns
    ``compile_keys``' list, ``"compile"`` the ``(figures, cubin)`` of each job."""
    payload = {"mode": mode, "jobs": [_job_payload(spec, arch) for spec, arch in jobs]}
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    with tempfile.TemporaryDirectory(prefix="kernelcamp-inspect-") as tmp:
        inp, out, err = Path(tmp) / "jobs.pkl", Path(tmp) / "result.json", Path(tmp) / "stderr.txt"
        inp.write_bytes(pickle.dumps(payload))
        code = (
            "from kernelcamp.inspect.compile import _child_main; "
            f"_child_main({str(inp)!r}, {str(out)!r}, {os.getpid()})"
        )
        with open(err, "wb") as errf:
            rc = _wait_child([sys.executable, "-c", code], env, errf)
        if rc != 0 or not out.exists():
            lines = err.read_text(errors="replace").strip().splitlines()
            tail = lines[-1] if lines else (f"killed by {signal.Signals(-rc).name}" if rc < 0 else "no output")
            raise KernelcampError(f"the compile subprocess ({mode}, run without TRITON_INTERPRET) failed: {tail}")
        results = json.loads(out.read_text())
    if mode == "keys":
        return results
    return [(fig, base64.b64decode(cubin) if cubin else None) for fig, cubin in results]


def _compile_in_child(jobs: Sequence[tuple[KernelSpecLike, int]]) -> list[tuple[dict, bytes | None]]:
    """Compile each ``(spec, arch)`` in a child process (see the module docstring: signals, and
    interpreter mode replacing Triton's own ``@jit`` helpers such as ``tl.cdiv``). The child imports
    each kernel by module and name. Raises ``KernelcampError`` when the child fails as a whole."""
    return _run_child("compile", jobs)


def _child_main(jobs_path: str, out_path: str, parent_pid: int | None = None) -> None:
    """Entry point of ``_run_child``'s subprocess."""
    from types import SimpleNamespace

    die_with_parent(signal.SIGKILL, parent_pid)  # SIGKILL when the parent dies (or is already gone)
    request = pickle.loads(Path(jobs_path).read_bytes())
    if request["mode"] == "compile":  # the ptxas -v log of every compile (spill figures); not in the key
        os.environ["TRITON_ALWAYS_COMPILE"] = "1"
        os.environ["TRITON_DUMP_PTXAS_LOG"] = "1"
    results: list = []
    for job in request["jobs"]:
        fn = importlib.import_module(job.pop("module"))
        for part in job.pop("qualname").split("."):
            fn = getattr(fn, part)
        arch = job.pop("arch")
        spec = SimpleNamespace(fn=fn, **job)
        if request["mode"] == "keys":
            try:
                results.append(_key_in_process(spec, arch))
            except Exception:  # noqa: BLE001 - the compile names the problem
                results.append(None)
        else:
            fig, cubin = _compile_one(spec, arch)
            results.append([fig, base64.b64encode(cubin).decode() if cubin else None])
    tmp = Path(out_path).with_suffix(".tmp")
    tmp.write_text(json.dumps(results))
    tmp.replace(out_path)


def compile_many(
    jobs: Sequence[tuple[KernelSpecLike, int]], use_cache: bool = True, root: Path | None = None
) -> list[dict]:
    """Figures of each ``(spec, arch)`` job, from the disk cache or compiled (identical jobs once).

    Each result has the ``FIGURES``, ``unreadable`` ({figure: reason}), ``error`` (None, or why it did
    not compile), ``compile_s`` (of the compile that made the figures) and ``cached``. A compile error
    is never raised: the caller names the config. Raises ``KernelcampError`` for an environment that
    retargets the compile (``check_target_env``), a kernel a child process cannot import, or a
    compile subprocess that fails as a whole. Compiles run in a child process (``_compile_in_child``);
    only results without error and without unreadable figures are written to the cache.
    """
    for arch in sorted({arch for _, arch in jobs}):
        check_target_env(arch)
    root = cache_dir() if root is None else root
    keys = compile_keys(jobs)
    found: dict[Any, dict] = {}
    todo: dict[Any, tuple[KernelSpecLike, int]] = {}
    ids = [key if key is not None else ("uncached", i) for i, key in enumerate(keys)]
    for ident, job in zip(ids, jobs, strict=True):
        if ident in found or ident in todo:
            continue
        hit = _cache_read(ident, root) if use_cache and isinstance(ident, str) else None
        if hit is not None:
            found[ident] = {**hit, "cached": True}
        else:
            todo[ident] = job
    if todo:
        items = list(todo.items())
        compiled = _compile_in_child([job for _, job in items])
        for (ident, _job), (fig, cubin) in zip(items, compiled, strict=True):
            clean = fig["error"] is None and not fig["unreadable"]
            if use_cache and clean and isinstance(ident, str):  # never cache an error or a tool failure
                _cache_write(ident, root, fig, cubin)
            found[ident] = {**fig, "cached": False}
    seen: set = set()
    out = []
    for ident in ids:  # a job repeated in one call is compiled once; its repeats read as cached
        out.append(found[ident] if ident not in seen else {**found[ident], "cached": True})
        seen.add(ident)
    return out


def compile_figures(spec: KernelSpecLike, arch: int, use_cache: bool = True, root: Path | None = None) -> dict:
    """Figures of one kernel for ``arch`` (see ``compile_many``)."""
    return compile_many([(spec, arch)], use_cache=use_cache, root=root)[0]


# ----------------------------------------------------------------------------------------------
# Live readout on a GPU


def live_figures_from_jit(fn: Any) -> list[dict]:
    """Registers and local memory of every kernel the JIT has compiled for ``fn`` on this GPU,
    as the driver reports them after loading (``CompiledKernel.n_regs``; ``n_spills * 4``, which is
    ``CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES``: the stack frame, not ptxas's spill stores).

    Rows: device, name, num_warps, num_stages, shared_bytes, registers, local_bytes (bytes per
    thread), constexprs.
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
                    "local_bytes": kernel.n_spills * 4,
                    "constexprs": {str(k): v for k, v in getattr(kernel.src, "constants", {}).items()},
                }
            )
    return rows


def live_figures(spec: KernelSpecLike, device: int = 0) -> dict:
    """Compile ``spec`` for the local GPU, load it there and read what the driver reports:
    ``{"arch", "shared_bytes", "registers", "local_bytes"}`` (bytes per block / registers per thread
    / local memory bytes per thread, ``n_spills * 4``). Raises ``KernelcampError`` without a CUDA GPU."""
    import torch
    import triton
    from triton.backends.compiler import GPUTarget

    if not torch.cuda.is_available():
        raise KernelcampError("live figures need a CUDA GPU")
    major, minor = torch.cuda.get_device_capability(device)
    arch = major * 10 + minor
    with ptxas_for(arch), torch.cuda.device(device):
        compiled = triton.compile(_source(spec), target=GPUTarget("cuda", arch, 32), options=compile_options(spec))
        compiled._init_handles()
    return {
        "arch": arch,
        "shared_bytes": compiled.metadata.shared,
        "registers": compiled.n_regs,
        "local_bytes": compiled.n_spills * 4,
    }


def compare_live(cross: Mapping[str, Any], live: Mapping[str, Any]) -> list[str]:
    """Mismatches (empty when equal) between cross-compiled and live figures (shared memory,
    registers, local memory: the figures the driver reports)."""
    return [
        f"{k}: cross-compiled {cross.get(k)} != live {live.get(k)}"
        for k in ("shared_bytes", "registers", "local_bytes")
        if cross.get(k) != live.get(k)
    ]

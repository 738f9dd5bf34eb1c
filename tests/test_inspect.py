"""Compile inspection (kernelcamp.inspect, kernelcamp.targets) on a CPU: cross-compiles for sm90/sm120.

The resource table is asserted against an independent compile in this file (triton.compile +
cuobjdump, parsed here), never against typed-in numbers. Compiles are cached in a session-wide
directory so each kernel is compiled by the inspector once per session.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl
from nointerp import env_without_interpreter

from kernelcamp import cli
from kernelcamp.errors import KernelcampError
from kernelcamp.inspect import cli as ki_cli
from kernelcamp.inspect import compile as kc
from kernelcamp.inspect import fit as kf
from kernelcamp.targets import load_target, occupancy, resolve_target
from kernelcamp.variant import LaunchConfig, Variant, parse_variant

ROOT = Path(__file__).resolve().parents[1]
V4_FLASH = {"layout": "deepseek_v4", "num_heads": 64, "topk": 512}  # conf/workload/deepseek_v4_flash.yaml


def _kernel_module():
    try:
        import kernels.sparse_mla_decode as m
    except ImportError as e:  # pragma: no cover - the kernel lives in this repo
        pytest.skip(f"kernels.sparse_mla_decode not importable: {e}")
    if not hasattr(m, "compile_specs"):
        pytest.skip("kernels.sparse_mla_decode has no compile_specs yet")
    return m


# A tiny kernel with a tl.dot (so shared memory > 0), through the same KernelSpec-shaped interface.
@triton.jit
def _tiny_dot(a_ptr, b_ptr, c_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    a = tl.load(a_ptr + offs[:, None] * BLOCK + offs[None, :])
    b = tl.load(b_ptr + offs[:, None] * BLOCK + offs[None, :])
    tl.store(c_ptr + offs[:, None] * BLOCK + offs[None, :], tl.dot(a, b))


# tl.sin needs a 32-byte stack frame but spills nothing (ptxas: "32 bytes stack frame, 0 bytes spill stores").
@triton.jit
def _sin_kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.sin(tl.load(x_ptr + offs)))


@dataclasses.dataclass(frozen=True)
class TinySpec:
    name: str
    fn: object
    signature: dict
    constexprs: dict
    num_warps: int
    num_stages: int
    attrs: dict = dataclasses.field(default_factory=dict)


def tiny_specs(cfg: LaunchConfig) -> list[TinySpec]:
    sig = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", "BLOCK": "constexpr"}
    return [TinySpec("tiny_dot", _tiny_dot, sig, {"BLOCK": cfg.BLOCK_T}, cfg.num_warps, cfg.num_stages)]


def sin_specs(cfg: LaunchConfig) -> list[TinySpec]:
    sig = {"x_ptr": "*fp32", "y_ptr": "*fp32", "BLOCK": "constexpr"}
    return [TinySpec("sin", _sin_kernel, sig, {"BLOCK": 128}, cfg.num_warps, cfg.num_stages)]


@pytest.fixture(scope="session")
def cache_root(tmp_path_factory) -> Path:
    return tmp_path_factory.getbasetemp() / "kernelcamp_inspect_cache"


@pytest.fixture(scope="session")
def story():
    return _story()


def in_child(expr: str, **env_extra: str):
    """Evaluate ``expr`` (with this module imported as ``T``) in a Python started without
    TRITON_INTERPRET: the kernel's compile_specs refuses interpreter mode, where Triton's own @jit
    helpers cannot be compiled (conftest sets it for CPU sessions). Returns its JSON value."""
    env = env_without_interpreter(**env_extra, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    code = f"import json, test_inspect as T\nprint('@@JSON@@' + json.dumps({expr}, default=str))"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.split("@@JSON@@", 1)[1])


def _story():
    return parse_variant(ki_cli._load_yaml(ROOT / "conf" / "variant" / "story_autotune.yaml"))


def child_story_rows(cache_root: str, forbid_compile: bool = False) -> list[dict]:
    if forbid_compile:

        def boom(*a, **k):
            raise AssertionError("triton.compile called on a warm inspection")

        triton.compile = boom
        kc._compile_in_child = boom  # compiles run in a child process, where the patch above cannot reach
    m = _kernel_module()
    targets = [load_target("sm120"), load_target("sm90")]
    specs_for = kf.specs_for_workload(m, V4_FLASH)
    return kf.inspect_configs(_story().configs, targets, specs_for, is_list=True, cache_root=Path(cache_root))


def child_fresh(triton_cache: str) -> list[dict]:
    m = _kernel_module()
    out = []
    for target in ("sm120", "sm90"):
        for i, cfg in enumerate(_story().configs):
            for spec in m.compile_specs(**V4_FLASH, config=cfg):
                fig = fresh_figures(spec, load_target(target).arch, Path(triton_cache))
                out.append({"target": target, "config_index": i, "kernel": spec.name, **fig})
    return out


def child_bad_config(cache_root: str) -> dict:
    m = _kernel_module()
    bad = LaunchConfig(BLOCK_T=8, BLOCK_H=16, num_warps=4, num_stages=2)  # bypasses parse_config's >= 16 check

    def specs_for(cfg):  # the real kernel with BLOCK_T forced to the config's value, past compile_specs' check
        specs = m.compile_specs(**V4_FLASH, config=dataclasses.replace(cfg, BLOCK_T=16))
        return [dataclasses.replace(s, constexprs={**s.constexprs, "BLOCK_T": cfg.BLOCK_T}) for s in specs]

    t = load_target("sm120")
    rows = kf.inspect_configs([bad], [t], specs_for, cache_root=Path(cache_root))
    try:
        kf.inspect_configs([bad], [t], specs_for, cache_root=Path(cache_root), use_cache=False, strict=True)
        strict = None
    except KernelcampError as e:
        strict = str(e)
    direct = kf.inspect_configs([bad], [t], kf.specs_for_workload(m, V4_FLASH), cache_root=Path(cache_root))
    summary = kf.summarize(Variant("bad", (bad,)), rows, "sm120")
    return {"label": bad.label(), "rows": rows, "strict": strict, "direct": direct, "summary": summary}


@pytest.fixture(scope="session")
def story_rows(cache_root):
    _kernel_module()
    return in_child(f"T.child_story_rows({str(cache_root)!r})")


def fresh_figures(spec, arch: int, triton_cache: Path) -> dict:
    """Independent of kernelcamp.inspect: compile with an empty Triton cache, read the cubin here."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    env = {"TRITON_CACHE_DIR": str(triton_cache)}
    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    if arch >= 100:
        env["TRITON_PTXAS_BLACKWELL_PATH"] = str(bin_dir / "ptxas-blackwell")
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        k = triton.compile(
            ASTSource(spec.fn, spec.signature, spec.constexprs, getattr(spec, "attrs", None)),
            target=GPUTarget("cuda", arch, 32),
            options={"num_warps": spec.num_warps, "num_stages": spec.num_stages},
        )
    finally:
        for key, v in old.items():
            os.environ.pop(key) if v is None else os.environ.__setitem__(key, v)
    cubin = triton_cache / f"{k.metadata.name}_{arch}.cubin"
    cubin.write_bytes(k.asm["cubin"])
    out = subprocess.run(
        [str(bin_dir / "cuobjdump"), "--dump-resource-usage", str(cubin)], capture_output=True, text=True, check=True
    ).stdout
    line = out[out.index(f"Function {k.metadata.name}:") :].splitlines()[1]
    usage = {a: int(b) for a, b in re.findall(r"(\w+):(\d+)", line)}
    return {
        "shared_bytes": k.metadata.shared,
        "registers": usage["REG"],
        "stack_bytes": usage["STACK"],
        "local_bytes": usage["STACK"] + usage["LOCAL"],
        **ptxas_verbose(k.asm["ptx"], k.metadata.name, arch, triton_cache),
    }


def ptxas_verbose(ptx: str, name: str, arch: int, tmp: Path) -> dict:
    """Independent of kernelcamp.inspect: run the wheel's ptxas -v on the PTX (for the PTX's own
    .target) and read the kernel's "bytes spill stores" / "bytes spill loads" / "bytes stack frame"."""
    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    ptxas = bin_dir / ("ptxas-blackwell" if arch >= 100 else "ptxas")
    gpu = re.search(r"^\.target\s+(\w+)", ptx, re.M).group(1)
    src = tmp / f"{name}_{arch}.ptx"
    src.write_text(ptx)
    log = subprocess.run(
        [str(ptxas), "-lineinfo", "-v", f"--gpu-name={gpu}", str(src), "-o", str(src.with_suffix(".o"))],
        capture_output=True,
        text=True,
        check=True,
    ).stderr
    m = re.search(
        rf"Function properties for {name}\n\s*(\d+) bytes stack frame, (\d+) bytes spill stores, "
        r"(\d+) bytes spill loads",
        log,
    )
    assert m, log
    return {"stack_bytes": int(m.group(1)), "spill_bytes": int(m.group(2)), "spill_load_bytes": int(m.group(3))}


# ----------------------------------------------------------------------------------------------
# The DESIGN.md story on the DeepSeek-V4-Flash shape


@pytest.mark.slow  # > 9 s on 2 cores: `make test-slow` (CI runs both)
def test_story_table_equals_fresh_compile(story, story_rows, tmp_path):
    fresh = in_child(f"T.child_fresh({str(tmp_path)!r})")
    assert len(story_rows) == len(fresh) == 2 * 2 * len(story.configs)  # split-K + combine, 2 targets
    for r in story_rows:
        assert r["error"] is None and r["unreadable"] == {}, r
        (f,) = [
            f
            for f in fresh
            if (f["target"], f["config_index"], f["kernel"]) == (r["target"], r["config_index"], r["kernel"])
        ]
        assert {k: r[k] for k in f} == f, (r["target"], r["config"], r["kernel"])
        assert r["registers"] > 0


@pytest.mark.parametrize("target", ["sm120", "sm90"])
def test_story_fits_against_target_limit(story, story_rows, target):
    t = load_target(target)
    rows = [r for r in story_rows if r["target"] == target]
    for r in rows:
        need = r["shared_bytes"] + (r["static_shared_bytes"] or 0)
        expect = need <= t.shared_bytes_per_block and r["registers"] <= t.max_registers_per_thread
        assert r["fits"] == expect, r
        assert r["fits"] == (r["ctas_per_sm"] > 0)
        if r["shared_bytes"] > t.shared_bytes_per_block:
            assert (
                f"needs {r['shared_bytes']} B shared memory, {target} allows {t.shared_bytes_per_block}" in r["reason"]
            )
            assert "autotuner would drop it silently" in r["reason"]
    s = kf.summarize(story, story_rows, target)
    fitting = [c.label() for i, c in enumerate(story.configs) if all(r["fits"] for r in rows if r["config_index"] == i)]
    assert s["fit"] == fitting and s["n_fit"] == len(fitting) and s["n_configs"] == 3
    assert [p["config"] for p in s["pruned"]] == [c.label() for c in story.configs if c.label() not in fitting]
    if fitting:
        assert s["will_run"]["mode"] == "autotune" and s["will_run"]["configs"] == fitting
    print(
        f"\n{target}: fit {fitting}; " + "; ".join(f"{r['config']} {r['kernel']} {r['shared_bytes']} B" for r in rows)
    )


def test_config_fit_is_all_its_kernels(story_rows):
    for r in story_rows:
        same = [x for x in story_rows if x["target"] == r["target"] and x["config_index"] == r["config_index"]]
        assert kf.config_fits(story_rows, r["target"], r["config_index"]) == all(x["fits"] for x in same)


def test_warm_inspection_does_not_compile(story_rows, cache_root):
    warm = in_child(f"T.child_story_rows({str(cache_root)!r}, forbid_compile=True)")
    assert all(r["cached"] for r in warm)
    drop = ("cached", "compile_s")
    assert [{k: v for k, v in r.items() if k not in drop} for r in warm] == [
        {k: v for k, v in r.items() if k not in drop} for r in story_rows
    ]


# ----------------------------------------------------------------------------------------------
# Configs that do not compile


def test_uncompilable_config_is_named_not_a_traceback(cache_root):
    _kernel_module()
    got = in_child(f"T.child_bad_config({str(cache_root)!r})")
    label = got["label"]
    failed = [r for r in got["rows"] if r["error"]]
    assert failed and not any(r["fits"] for r in got["rows"])
    assert label in failed[0]["reason"] and "\n" not in failed[0]["reason"]
    assert got["summary"]["will_run"] is None and got["summary"]["pruned"][0]["config"] == label
    assert got["strict"] and label in got["strict"]
    # compile_specs itself rejecting the config is a row error naming it too
    assert got["direct"][0]["error"] and label in got["direct"][0]["reason"] and not got["direct"][0]["fits"]


@pytest.mark.slow  # > 9 s on 2 cores: `make test-slow` (CI runs both)
def test_tiny_kernel_dot_below_16_fails_cleanly(tmp_path):
    # under TRITON_INTERPRET the inspector computes keys and compiles in child processes by module and name
    rows = kf.inspect_configs([LaunchConfig(8, 16, 4, 1)], [load_target("sm90")], tiny_specs, cache_root=tmp_path)
    assert rows[0]["error"].startswith("CompilationError") and "T8_H16_w4_s1" in rows[0]["reason"]
    again = kf.inspect_configs([LaunchConfig(8, 16, 4, 1)], [load_target("sm90")], tiny_specs, cache_root=tmp_path)
    assert again[0]["error"] and not again[0]["cached"], "a compile error was served from the cache"
    ok = kf.inspect_configs([LaunchConfig(32, 16, 4, 1)], [load_target("sm90")], tiny_specs, cache_root=tmp_path)
    assert ok[0]["fits"] and ok[0]["shared_bytes"] > 0 and ok[0]["registers"] > 0


@pytest.mark.parametrize("num_warps", [64, 1024])
def test_more_than_1024_threads_never_fits(tmp_path, num_warps):
    """num_warps=64 is 2048 threads per block: no arch launches it, whatever its shared memory."""
    cfg = LaunchConfig(16, 16, num_warps, 1)
    rows = kf.inspect_configs([cfg], [load_target("sm90")], sin_specs, cache_root=tmp_path)
    (r,) = rows
    assert not r["fits"] and r["ctas_per_sm"] == 0 and r["limited_by"] == "does_not_fit"
    assert f"{num_warps * 32} threads per block, sm90 allows 1024" in r["reason"], r


def test_spill_bytes_are_ptxas_spill_stores_not_the_stack_frame(tmp_path):
    """tl.sin: ptxas says "32 bytes stack frame, 0 bytes spill stores"; the row says the same."""
    rows = kf.inspect_configs(
        [LaunchConfig(16, 16, 4, 1)], [load_target("sm90"), load_target("sm120")], sin_specs, cache_root=tmp_path
    )
    for r in rows:
        assert r["error"] is None and r["unreadable"] == {}, r
        assert (r["stack_bytes"], r["spill_bytes"], r["spill_load_bytes"], r["local_bytes"]) == (32, 0, 0, 32), r
    fresh = in_child(f"T.child_fresh_sin({str(tmp_path / 'fresh')!r})")
    for r, f in zip(rows, fresh, strict=True):
        assert {k: r[k] for k in f} == f


def child_fresh_sin(triton_cache: str) -> list[dict]:
    Path(triton_cache).mkdir(parents=True, exist_ok=True)
    (s,) = sin_specs(LaunchConfig(16, 16, 4, 1))
    return [fresh_figures(s, arch, Path(triton_cache)) for arch in (90, 120)]


def test_parse_ptxas_log():
    log = (
        "ptxas info    : Compiling entry function 'k' for 'sm_90a'\n"
        "ptxas info    : Function properties for helper\n"
        "    8 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads\n"
        "ptxas info    : Function properties for k\n"
        "    40 bytes stack frame, 24 bytes spill stores, 16 bytes spill loads\n"
        "ptxas info    : Used 255 registers, used 1 barriers, 40 bytes cumulative stack size\n"
    )
    got = kc.parse_ptxas_log(log, "k")
    assert got == {"stack_bytes": 40, "spill_bytes": 24, "spill_load_bytes": 16, "registers": 255}
    with pytest.raises(ValueError):
        kc.parse_ptxas_log(log, "other")


# ----------------------------------------------------------------------------------------------
# Disk cache


def test_cache_key_covers_config_arch_and_source():
    (s,) = tiny_specs(LaunchConfig(32, 16, 4, 1))
    jobs = [
        (s, 90),
        (s, 120),
        (dataclasses.replace(s, num_warps=8), 90),
        (dataclasses.replace(s, constexprs={"BLOCK": 64}), 90),
        (tiny_specs(LaunchConfig(32, 16, 4, 1))[0], 90),
    ]
    keys = kc.compile_keys(jobs)
    assert None not in keys and len(set(keys[:4])) == 4 and keys[4] == keys[0]


# A kernel whose @triton.jit helper lives in another module (written per test into tmp_path).
HELPER_V1 = """
import triton
import triton.language as tl


@triton.jit
def helper(x):
    return x * 2.0
"""
HELPER_V2 = HELPER_V1.replace("return x * 2.0", "return tl.sin(x)")  # needs a 32-byte stack frame
KERNEL_SRC = """
import triton
import triton.language as tl

from {helper} import helper


@triton.jit
def kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, helper(tl.load(x_ptr + offs)))
"""


def test_cache_key_covers_a_helper_in_another_module(tmp_path, monkeypatch):
    """Editing a @triton.jit helper the kernel calls from another module must miss a warm cache."""
    import importlib

    tag = tmp_path.name.replace("-", "_")
    helper, kernel = f"kc_helper_{tag}", f"kc_kernel_{tag}"
    (tmp_path / f"{helper}.py").write_text(HELPER_V1)
    (tmp_path / f"{kernel}.py").write_text(KERNEL_SRC.format(helper=helper))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")  # the child processes must read the edited file
    fn = importlib.import_module(kernel).kernel
    sig = {"x_ptr": "*fp32", "y_ptr": "*fp32", "BLOCK": "constexpr"}
    spec = TinySpec("kernel", fn, sig, {"BLOCK": 128}, 4, 1)
    cache = tmp_path / "cache"
    first = kc.compile_figures(spec, 90, root=cache)
    assert first["error"] is None and not first["cached"] and first["stack_bytes"] == 0, first
    assert kc.compile_figures(spec, 90, root=cache)["cached"]
    (tmp_path / f"{helper}.py").write_text(HELPER_V2)
    edited = kc.compile_figures(spec, 90, root=cache)
    assert not edited["cached"], "a warm cache returned the figures of the old helper"
    assert edited["stack_bytes"] == 32, edited


@pytest.mark.slow  # > 9 s on 2 cores: `make test-slow` (CI runs both)
def test_cache_key_covers_compile_env_and_triton_version(monkeypatch, tmp_path):
    (s,) = sin_specs(LaunchConfig(16, 16, 4, 1))
    base = kc.compile_key(s, 90)
    cold = kc.compile_figures(s, 90, root=tmp_path)
    assert not cold["cached"] and kc.compile_figures(s, 90, root=tmp_path)["cached"]
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")  # in Triton's get_cache_invalidating_env_vars
    assert kc.compile_key(s, 90) != base
    assert not kc.compile_figures(s, 90, root=tmp_path)["cached"], "old figures served with fp fusion off"
    monkeypatch.delenv("TRITON_DEFAULT_FP_FUSION")
    assert kc.compile_key(s, 90) == base
    assert in_child("T.child_key_with_triton_version('9.9.9')") != in_child("T.child_key_with_triton_version(None)")


def child_key_with_triton_version(version: str | None) -> str:
    (s,) = sin_specs(LaunchConfig(16, 16, 4, 1))
    if version:
        triton.__version__ = version
    return kc.compile_key(s, 90)


@pytest.mark.slow  # > 9 s on 2 cores: `make test-slow` (CI runs both)
def test_override_arch_is_refused_in_one_line_and_errors_are_never_cached(monkeypatch, tmp_path):
    (s,) = sin_specs(LaunchConfig(16, 16, 4, 1))
    monkeypatch.setenv("TRITON_OVERRIDE_ARCH", "sm80")
    with pytest.raises(KernelcampError) as e:
        kf.inspect_configs([LaunchConfig(16, 16, 4, 1)], [load_target("sm90")], sin_specs, cache_root=tmp_path)
    assert "TRITON_OVERRIDE_ARCH=sm80" in str(e.value) and "\n" not in str(e.value)
    r = run_cli("--variant", "story_autotune", "--target", "sm90", cache_root=tmp_path, TRITON_OVERRIDE_ARCH="sm80")
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1 and "TRITON_OVERRIDE_ARCH=sm80" in err[0], r.stderr
    monkeypatch.setenv("TRITON_OVERRIDE_ARCH", "sm90")  # the target's own arch changes nothing
    assert kc.compile_figures(s, 90, root=tmp_path)["error"] is None
    monkeypatch.delenv("TRITON_OVERRIDE_ARCH")
    fig = kc.compile_figures(s, 90, root=tmp_path)
    assert fig["error"] is None and fig["registers"] > 0
    assert not list(tmp_path.glob("*.json")) or all(
        json.loads(p.read_text())["error"] is None for p in tmp_path.glob("*.json")
    )


def test_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("KERNELCAMP_CACHE_DIR", str(tmp_path))
    assert kc.cache_dir() == tmp_path
    monkeypatch.delenv("KERNELCAMP_CACHE_DIR")
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    assert kc.cache_dir() == tmp_path.resolve() / ".kernelcamp_cache" / "inspect"


def test_ptxas_for_restores_environment(monkeypatch):
    monkeypatch.delenv("TRITON_PTXAS_BLACKWELL_PATH", raising=False)
    monkeypatch.setenv("TRITON_PTXAS_PATH", "/custom/ptxas")
    with kc.ptxas_for(120):
        assert os.environ["TRITON_PTXAS_BLACKWELL_PATH"].endswith("ptxas-blackwell")
        assert os.environ["TRITON_PTXAS_PATH"] == "/custom/ptxas"  # a user's choice is kept
    assert "TRITON_PTXAS_BLACKWELL_PATH" not in os.environ and os.environ["TRITON_PTXAS_PATH"] == "/custom/ptxas"
    with kc.ptxas_for(90):
        assert "TRITON_PTXAS_BLACKWELL_PATH" not in os.environ


def test_unreadable_figures_are_named(tmp_path):
    usage = "Resource usage:\n Function k:\n  REG:40 SHARED:0 LOCAL:0\n"
    assert kc.parse_resource_usage(usage, "k") == {"REG": 40, "SHARED": 0, "LOCAL": 0}
    with pytest.raises(ValueError):
        kc.parse_resource_usage(usage, "other")
    figs, unreadable = kc.read_cubin(b"not a cubin", "k")
    assert figs["registers"] is None and "cuobjdump" in unreadable["registers"]


# ----------------------------------------------------------------------------------------------
# Signals: SIGTERM / SIGINT stop a long compile at once and leave no compile process behind

SLOW_STUB = """
import os
import time
from pathlib import Path
from types import SimpleNamespace

import triton
import triton.language as tl


@triton.jit
def stub_kernel(x_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs) + 1.0)


def specs(cfg):
    sig = {"x_ptr": "*fp32", "BLOCK": "constexpr"}
    return [SimpleNamespace(name="stub", fn=stub_kernel, signature=sig, constexprs={"BLOCK": 128},
                            num_warps=cfg.num_warps, num_stages=cfg.num_stages)]


if os.environ.get("KC_PARENT_PID") not in (None, str(os.getpid())):  # a compile child: a compile that hangs
    Path(os.environ["KC_CHILD_PIDFILE"]).write_text(str(os.getpid()))
    time.sleep(600)
"""

SIGNAL_PARENT = """
import os
import sys

os.environ["KC_PARENT_PID"] = str(os.getpid())
from pathlib import Path

from kernelcamp.inspect import fit as kf
from kernelcamp.targets import load_target
from kernelcamp.variant import LaunchConfig

kind, mode = sys.argv[1], sys.argv[2]


def run():
    if kind == "real":  # DeepSeek-V4-Flash split-K kernel with num_stages=100000: minutes in Triton's C++ passes
        import kernels.sparse_mla_decode as m

        cfg = LaunchConfig(16, 16, 4, 100000)
        specs_for = lambda c: m.compile_specs("deepseek_v4", 64, 512, c)[:1]
    else:
        import slow_stub

        cfg, specs_for = LaunchConfig(16, 16, 4, 1), slow_stub.specs
    kf.inspect_configs([cfg], [load_target("sm90")], specs_for, use_cache=False, cache_root=Path("cache"))
    print("finished", flush=True)


if mode == "stage":
    from kernelcamp.tracking import tracked_stage

    with tracked_stage("build", check_store=False):
        run()
else:
    run()
"""


def _marked(marker: str) -> set[int]:
    """Pids of live processes whose environment carries ``KC_SIGTEST=<marker>``."""
    found = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if f"KC_SIGTEST={marker}".encode() in (d / "environ").read_bytes().split(b"\0"):
                    found.add(int(d.name))
            except OSError:
                continue
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize(
    ("kind", "mode", "sig", "codes"),
    [
        ("stub", "stage", signal.SIGTERM, {143}),  # tracked_stage: KILLED, exit 128 + 15
        ("stub", "plain", signal.SIGTERM, {-signal.SIGTERM}),  # default action: dies of the signal
        ("stub", "plain", signal.SIGINT, {-signal.SIGINT, 130}),  # KeyboardInterrupt
        ("real", "stage", signal.SIGTERM, {143}),
    ],
)
def test_signal_stops_a_long_compile_and_its_child(tmp_path, kind, mode, sig, codes):
    if kind == "real":
        _kernel_module()
    (tmp_path / "slow_stub.py").write_text(SLOW_STUB)
    (tmp_path / "parent.py").write_text(SIGNAL_PARENT)
    marker = f"{os.getpid()}-{tmp_path.name}"
    pidfile = tmp_path / "child.pid"
    env = env_without_interpreter(
        PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]),
        KC_SIGTEST=marker,
        KC_CHILD_PIDFILE=str(pidfile),
        DVC_ROOT=str(tmp_path),
        MLFLOW_TRACKING_URI="http://127.0.0.1:9",  # the KILLED record fails fast; the signal path is what counts
    )
    # SIGINT and SIGQUIT at their default action in the parent: a suite started as a background job of a
    # shell without job control inherits them ignored, and Python then installs no KeyboardInterrupt handler
    parent = subprocess.Popen(
        [sys.executable, "parent.py", kind, mode],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL) for s in (signal.SIGINT, signal.SIGQUIT)],
    )
    try:
        # stub: until the compile child hangs; real: until the compile is under way, in a child or
        # (as before the fix) in the parent itself
        deadline = time.monotonic() + (120 if kind == "stub" else 20)
        while time.monotonic() < deadline and parent.poll() is None:
            started = pidfile.exists() if kind == "stub" else bool(_marked(marker) - {parent.pid})
            if started:
                break
            time.sleep(0.2)
        assert parent.poll() is None, parent.communicate()
        if kind == "stub":
            assert time.monotonic() < deadline, "the compile child never started"
        else:
            time.sleep(3)  # into Triton's passes
        t0 = time.monotonic()
        parent.send_signal(sig)
        try:
            out, err = parent.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the parent ignored {sig.name} for 30 s")
        took = time.monotonic() - t0
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
    assert took < 10, f"the parent took {took:.1f} s to stop after {sig.name}"
    assert parent.returncode in codes, (parent.returncode, err.decode()[-2000:])
    assert b"finished" not in out
    time.sleep(0.5)
    assert not _marked(marker), f"compile processes survived the parent: {_marked(marker)}"


# ----------------------------------------------------------------------------------------------
# Targets and occupancy


def test_load_target_named_mapping_and_errors():
    t = load_target("sm120")
    assert (t.arch, t.shared_bytes_per_block) == (120, 101376)  # DESIGN.md: sm120 99 KB (101376 B)
    assert load_target(t.as_dict()) == t
    with pytest.raises(KernelcampError, match="lacks"):
        load_target({"name": "x", "arch": 90})
    with pytest.raises(KernelcampError, match="unknown target"):
        load_target("sm999")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_auto_target_on_cpu_is_a_clear_error():
    with pytest.raises(KernelcampError, match="no CUDA GPU"):
        resolve_target("auto")
    with pytest.raises(KernelcampError, match="no CUDA GPU"):
        load_target({"name": "auto", "arch": "auto"})


def test_occupancy_limits():
    t = load_target("sm90")  # 64K registers, 64 warps, 32 CTAs, 233472 B shared per SM
    # 240 regs/thread -> 7680 per warp (256-register units) -> 8 warps -> 2 CTAs of 4 warps
    assert occupancy(t, 240, 0, 4) == {"ctas_per_sm": 2, "warps_per_sm": 8, "limited_by": "registers"}
    # 32 regs, 4 warps: 16 CTAs by warps (64/4), 32 by CTAs, 16 by registers (64K/1024/4): first on a tie
    assert occupancy(t, 32, 0, 4)["ctas_per_sm"] == 16
    # shared memory: (100000 + 1024 reserved) rounded to 128 B -> 2 per 233472 B
    assert occupancy(t, 32, 100000, 4) == {"ctas_per_sm": 2, "warps_per_sm": 8, "limited_by": "shared_memory"}
    assert occupancy(t, 32, t.shared_bytes_per_block + 1, 4)["limited_by"] == "does_not_fit"
    assert occupancy(t, 16, None, 1)["limited_by"] == "ctas"


# ----------------------------------------------------------------------------------------------
# CLI


def run_cli(*args: str, cache_root: Path, **env_extra: str) -> subprocess.CompletedProcess:
    env = env_without_interpreter(KERNELCAMP_CACHE_DIR=str(cache_root), PYTHONPATH=str(ROOT), **env_extra)
    cmd = [sys.executable, "-m", "kernelcamp.cli", "inspect", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)


def test_cli_json_and_pruned_lines(story_rows, cache_root):
    r = run_cli("--variant", "story_autotune", "--target", "sm120", "--target", "sm90", "--json", cache_root=cache_root)
    data = json.loads(r.stdout)
    assert r.returncode == 0 and data["variant"] == "story_autotune" and data["kernel_source_hash"]
    assert len(data["rows"]) == len(story_rows) and all(row["cached"] for row in data["rows"])
    for s in data["summaries"]:
        for p in s["pruned"]:
            assert f"PRUNED on {s['target']}: {p['config']}" in r.stderr
    r = run_cli("--variant", "story_autotune", "--target", "sm120", "--quiet", cache_root=cache_root)
    assert r.returncode == 0 and "sm120" in r.stdout and "configs fit" in r.stdout, r.stderr


def test_cli_bad_target_is_one_line(capsys):
    assert cli.main(["inspect", "--variant", "story_autotune", "--target", "sm999"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: unknown target")


def _params_with(tmp_path, **sections):
    import copy

    import yaml

    p = copy.deepcopy(yaml.safe_load((Path(__file__).resolve().parents[1] / "params.yaml").read_text()))
    for key, value in sections.items():
        sec, _, field = key.partition("__")
        p[sec][field] = value
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(p))
    return str(path)


@pytest.mark.parametrize(
    "make,needle",
    [
        (lambda d: str(Path(__file__).resolve().parents[1] / "README.md"), "is not readable YAML"),
        (lambda d: str(d), "is not a file"),
        (lambda d: _params_with(d, workload__num_heads="abc"), "workload.num_heads = 'abc': expected an integer"),
        (lambda d: _params_with(d, workload__num_heads=None), "workload.num_heads = null: expected an integer"),
        (lambda d: _params_with(d, workload__topk=-5), "workload.topk = -5: must be >= 1"),
        (lambda d: _params_with(d, workload__layout="v9"), "workload.layout = 'v9': expected one of"),
        (lambda d: _params_with(d, kernel__dot_dtype="int4"), "kernel.dot_dtype = 'int4': expected one of"),
    ],
)
def test_cli_bad_params_are_one_line_not_a_traceback_or_a_prune(capsys, tmp_path, make, needle):
    """`inspect --params README.md` (or a folder, or a non-integer head count) raised a traceback; a bad
    dot_dtype or layout was reported as every config PRUNED on sm90 (exit 1); topk -5 passed."""
    assert cli.main(["inspect", "--params", make(tmp_path), "--target", "sm90", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and needle in err[0], err


def test_cli_a_group_choice_is_a_file_name_not_a_path(capsys):
    """`inspect --variant ../../etc/passwd` said "no etc named 'passwd': choose one of []"."""
    assert cli.main(["inspect", "--variant", "../../etc/passwd", "--target", "sm90", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--variant '../../etc/passwd': give the name of a file of conf/variant/" in err[0], err
    assert "bt16_w4" in err[0]


def test_cli_takes_the_params_target_only_as_its_conf_file(capsys, tmp_path):
    """`inspect --params` loaded the params' target section as given: a `target.shared_bytes_per_block` edit
    pruned (or kept) configs under sm90's name, as the run spec now refuses."""
    path = _params_with(tmp_path, target__shared_bytes_per_block=1024)
    assert cli.main(["inspect", "--params", path, "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "target.shared_bytes_per_block = 1024 but conf/target/sm90.yaml says" in err[0], err


def test_cli_composes_a_group_file_with_its_own_defaults(capsys, monkeypatch):
    # conf/workload/deepseek_v32_tp8.yaml is deepseek_v32 (its defaults list) with 16 heads: read as a bare YAML
    # file it lacked the layout, and `kernelcamp inspect --workload deepseek_v32_tp8` stopped with "workload lacks
    # 'layout'". The CLI now composes a chosen file as DVC composes params.yaml (Hydra)
    from kernelcamp.targets import conf_dir

    wl = ki_cli._load_group(conf_dir(), "workload", "deepseek_v32_tp8")
    assert (wl["name"], wl["layout"], wl["num_heads"], wl["topk"]) == ("deepseek_v32_tp8", "deepseek_v32", 16, 2048)
    base = ki_cli._load_group(conf_dir(), "baseline", "bt16_w4")  # a baseline file has a defaults list too
    assert base["name"] == "bt16_w4" and base["BLOCK_T"] == 16
    with pytest.raises(KernelcampError, match=r"no workload named 'nope': choose one of \[.*'deepseek_v32_tp8'"):
        ki_cli._load_group(conf_dir(), "workload", "nope")
    # through the CLI (the compiles stubbed out: the specs are built for the composed workload, then nothing runs)
    asked = []
    monkeypatch.setattr(
        ki_cli, "inspect_configs", lambda configs, targets, specs_for, **kw: asked.append(configs) or []
    )
    rc = cli.main(["inspect", "--variant", "bt16_w4", "--workload", "deepseek_v32_tp8", "--target", "sm90", "--quiet"])
    err = capsys.readouterr().err
    assert "lacks" not in err and asked and rc in (0, 1), err
    # a choice file that composes no section of its group is one line, not a traceback
    bad = conf_dir() / "workload" / "zz_global_only.yaml"
    bad.write_text("# @package _global_\nfoo: 1\n")
    try:
        with pytest.raises(KernelcampError, match=r"zz_global_only"):  # Hydra refuses it first: one line
            ki_cli._load_group(conf_dir(), "workload", "zz_global_only")
    finally:
        bad.unlink()


def test_inspect_help_says_a_conf_local_file_applies(capsys):
    # the composition reads conf/local/ as `dvc exp run` does; a user who did not expect it learns it from --help
    with pytest.raises(SystemExit):
        cli.main(["inspect", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "conf/local/" in out and "`defaults` list" in out


# ----------------------------------------------------------------------------------------------
# Live readout on the GPU (H200, sm90): the loaded kernel's figures equal the cross-compiled ones


@pytest.mark.gpu
def test_live_figures_equal_cross_compiled(story, tmp_path):
    m = _kernel_module()
    major, minor = torch.cuda.get_device_capability()
    arch = major * 10 + minor
    for cfg in story.configs:
        for spec in m.compile_specs(**V4_FLASH, config=cfg):
            cross = kc.compile_figures(spec, arch, root=tmp_path)
            live = kc.live_figures(spec)
            assert kc.compare_live(cross, live) == [], (cfg.label(), spec.name)


@pytest.mark.gpu
def test_live_figures_from_jit_after_launch(tmp_path):
    a = torch.randn(32, 32, device="cuda", dtype=torch.float16)
    c = torch.empty(32, 32, device="cuda", dtype=torch.float32)
    _tiny_dot[(1,)](a, a, c, BLOCK=32, num_warps=4, num_stages=1)
    torch.cuda.synchronize()
    live = [r for r in kc.live_figures_from_jit(_tiny_dot) if r["num_warps"] == 4]
    assert live
    major, minor = torch.cuda.get_device_capability()
    (spec,) = tiny_specs(LaunchConfig(32, 16, 4, 1))
    # a real launch specializes pointer alignment (16-byte divisibility) like compile_specs' attrs
    spec_attrs = dataclasses.replace(spec, attrs={(i,): [["tt.divisibility", 16]] for i in range(3)})
    cross = kc.compile_figures(spec_attrs, major * 10 + minor, root=tmp_path)
    assert kc.compare_live(cross, live[0]) == []


@pytest.mark.gpu
@pytest.mark.parametrize("layout,H,topk,B,label", [("deepseek_v32", 128, 2048, 4, "T64_H64_w8_s2_kauto")])
def test_the_launched_binary_is_the_inspected_one(layout, H, topk, B, label):
    """The cubin a real launch compiled (the JIT cache) is byte for byte the one compile_specs'
    split-kernel spec compiles to for this GPU: what the build stage inspects is what runs."""
    import hashlib

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    m = _kernel_module()
    cfg = LaunchConfig.from_label(label)
    x = m.make_inputs(layout, B, H, topk, 64, 1 << 16, "cuda")
    m.SparseMLADecode(Variant("t", (cfg,)))(x["q"], x["kv_cache"], x["indices"], layout, 64, x["sm_scale"])
    torch.cuda.synchronize()
    fn = m._sparse_mla_split_kernel
    launched = [
        k.asm["cubin"]
        for c in fn.device_caches.values()
        for k in (c[0] if isinstance(c, tuple) else c).values()
        if k.metadata.num_warps == cfg.num_warps and k.metadata.num_stages == cfg.num_stages
    ]
    major, minor = torch.cuda.get_device_capability()
    arch = major * 10 + minor
    spec = m.compile_specs(layout, H, topk, cfg, batch=B)[0]
    src = ASTSource(kc.as_jit(spec.fn), dict(spec.signature), dict(spec.constexprs), spec.attrs)
    with kc.ptxas_for(arch):
        inspected = triton.compile(
            src,
            target=GPUTarget("cuda", arch, 32),
            options={"num_warps": spec.num_warps, "num_stages": spec.num_stages},
        ).asm["cubin"]
    sha = [hashlib.sha256(b).hexdigest()[:16] for b in launched]
    assert hashlib.sha256(inspected).hexdigest()[:16] in sha, (sha, hashlib.sha256(inspected).hexdigest()[:16])


# ----------------------------------------------------------------------------------------------
# compile_specs specializes every argument as a launch does (what is inspected is what runs)


def launch_specialization_mismatches(layout: str, H: int, topk: int, B: int, label: str) -> list[str]:
    """Run the launcher with its two @jit kernels replaced by recorders, feed each recorded argument to
    Triton's own launch-time specialization (``native_specialize_impl``, what the jit binder calls) and
    compare with ``compile_specs``' signature, constexprs and attrs. Needs a Python without
    TRITON_INTERPRET (see :func:`in_child`); runs on the CPU (nothing is compiled or launched)."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    import kernels.sparse_mla_decode as m

    calls: dict[str, tuple] = {}

    class Recorder:
        def __init__(self, name, fn):
            self.name, self.fn = name, fn

        def __getitem__(self, grid):
            return lambda *args, **kw: calls.setdefault(self.name, (self.fn, args, kw))

    real = {"sparse_mla_split": m._sparse_mla_split_kernel, "sparse_mla_combine": m._sparse_mla_combine_kernel}
    x = m.make_inputs(layout, B, H, topk, 64, 4096, "cpu")
    cfg = LaunchConfig.from_label(label)
    try:
        m._sparse_mla_split_kernel = Recorder("sparse_mla_split", real["sparse_mla_split"])
        m._sparse_mla_combine_kernel = Recorder("sparse_mla_combine", real["sparse_mla_combine"])
        m.SparseMLADecode(Variant("t", (cfg,)))(x["q"], x["kv_cache"], x["indices"], layout, 64, x["sm_scale"])
    finally:
        m._sparse_mla_split_kernel = real["sparse_mla_split"]
        m._sparse_mla_combine_kernel = real["sparse_mla_combine"]
    specs = {s.name: s for s in m.compile_specs(layout, H, topk, cfg, batch=B)}
    bad = []
    for name, (fn, args, kw) in calls.items():
        spec, dns = specs[name], set(getattr(fn, "do_not_specialize", []) or [])
        # the constexprs and launch options the launch passed by keyword (SPLIT_D among them: the split-D binary
        # a small batch runs is another binary) against the spec's
        for a, v in kw.items():
            want = {"num_warps": spec.num_warps, "num_stages": spec.num_stages}.get(a, spec.constexprs.get(a, "absent"))
            if want != v:
                bad.append(f"{name}.{a}: launch {v!r}, compile_specs {want!r}")
        dns = {fn.arg_names[a] if isinstance(a, int) else a for a in dns}
        for i, (a, v) in enumerate(zip(fn.arg_names, args, strict=False)):  # constexprs come as kwargs
            kind, attr = native_specialize_impl(BaseBackend, v, False, a not in dns, True)
            want_sig = "constexpr" if kind == "constexpr" else kind
            got_sig = spec.signature[a]
            got_attr = "D" if [["tt.divisibility", 16]] == (spec.attrs or {}).get((i,)) else ""
            if got_sig != want_sig or (kind != "constexpr" and (attr or "") != got_attr):
                bad.append(
                    f"{name}.{a}={v if not hasattr(v, 'shape') else 'tensor'}: launch ({kind}, {attr!r}), "
                    f"compile_specs ({got_sig}, {got_attr!r})"
                )
    assert "sparse_mla_split" in calls
    return bad


@pytest.mark.parametrize(
    "layout,H,topk,B,label",
    [
        ("deepseek_v32", 128, 2048, 1, "T64_H64_w8_s2_kauto"),  # 32 splits: the combine runs; 2 split-D parts
        ("deepseek_v32", 16, 2048, 1, "T64_H16_w8_s2_kauto"),  # TP8 B=1: 4 split-D parts, the mma v2 path
        ("deepseek_v4", 64, 100, 2, "T32_H16_w4_s2_kauto"),  # top-k 100: stride_ib not a multiple of 16
    ],
)
def test_compile_specs_specialize_like_a_launch(layout, H, topk, B, label):
    bad = in_child(f"T.launch_specialization_mismatches({layout!r}, {H}, {topk}, {B}, {label!r})")
    assert bad == []


def test_specs_for_workload_asks_for_every_split_d_binary_where_the_module_can_name_them():
    # the build stage inspected each V3.2 row at one batch size: the split-D binaries small batches launch went
    # unchecked. A single config or a table row gets all_split_d, its row's min_batch and the target's SM count
    # where the module's compile_specs takes them; an autotune list (it launches one part), no variant, or an
    # older module (a kernel_rev file, a candidate) is called as before
    seen = []

    class Old:
        @staticmethod
        def compile_specs(layout, num_heads, topk, config, dot_dtype="bf16", batch=64):
            seen.append(("old",))
            return []

    class New:
        @staticmethod
        def compile_specs(
            layout, num_heads, topk, config, dot_dtype="bf16", all_split_d=False, min_batch=1, num_sms=132
        ):
            seen.append(("new", all_split_d, min_batch, num_sms))
            return []

    wl = {"layout": "deepseek_v32", "num_heads": 128, "topk": 2048}
    cfg = LaunchConfig(64, 64, 8, 1, "auto")
    single = Variant("s", (cfg,))
    sm120 = load_target("sm120")
    kf.specs_for_workload(Old, wl, variant=single)(cfg)
    kf.specs_for_workload(New, wl)(cfg)  # no variant
    kf.specs_for_workload(New, wl, variant=single)(cfg)
    kf.specs_for_workload(New, wl, variant=single)(cfg, target=sm120)
    autotune = Variant("a", (cfg, LaunchConfig(64, 64, 8, 2, "auto")), (), is_list=True)
    assert not autotune.is_table
    kf.specs_for_workload(New, wl, variant=autotune)(cfg)
    assert seen == [
        ("old",),
        ("new", False, 1, 132),
        ("new", True, 1, 132),
        ("new", True, 1, sm120.num_sms),
        ("new", False, 1, 132),
    ]
    # a batch table: each row's range starts after the previous row's max_batch, so a row is asked only for the
    # binaries of its own batch sizes (the B >= 97 row of V3.2's table never runs B=1's two column parts)
    rows = (
        LaunchConfig(64, 64, 8, 1, "auto", max_batch=16),
        LaunchConfig(64, 64, 8, 2, 2, max_batch=32),
        LaunchConfig(64, 64, 8, 2, "auto"),
    )
    table = Variant("t", rows, (), is_list=True)
    assert table.is_table
    seen.clear()
    specs_for = kf.specs_for_workload(New, wl, variant=table)
    for c in rows:
        specs_for(c)
    assert seen == [("new", True, 1, 132), ("new", True, 17, 132), ("new", True, 33, 132)]
    # inspect_configs hands each target to a specs_for that takes it
    seen.clear()
    kf.inspect_configs([cfg], [sm120], kf.specs_for_workload(New, wl, variant=single))
    assert seen == [("new", True, 1, sm120.num_sms)]

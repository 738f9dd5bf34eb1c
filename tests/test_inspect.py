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
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from kernelcamp import inspect as ki
from kernelcamp.errors import KernelcampError
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
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(env_extra, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    code = f"import json, test_inspect as T\nprint('@@JSON@@' + json.dumps({expr}, default=str))"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.split("@@JSON@@", 1)[1])


def _story():
    return parse_variant(ki._load_yaml(ROOT / "conf" / "variant" / "story_autotune.yaml"))


def child_story_rows(cache_root: str, forbid_compile: bool = False) -> list[dict]:
    if forbid_compile:

        def boom(*a, **k):
            raise AssertionError("triton.compile called on a warm inspection")

        triton.compile = boom
    m = _kernel_module()
    targets = [load_target("sm120"), load_target("sm90")]
    specs_for = ki.specs_for_workload(m, V4_FLASH)
    return ki.inspect_configs(_story().configs, targets, specs_for, is_list=True, cache_root=Path(cache_root))


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
    rows = ki.inspect_configs([bad], [t], specs_for, cache_root=Path(cache_root))
    try:
        ki.inspect_configs([bad], [t], specs_for, cache_root=Path(cache_root), use_cache=False, strict=True)
        strict = None
    except KernelcampError as e:
        strict = str(e)
    direct = ki.inspect_configs([bad], [t], ki.specs_for_workload(m, V4_FLASH), cache_root=Path(cache_root))
    summary = ki.summarize(Variant("bad", (bad,)), rows, "sm120")
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
        "spill_bytes": usage["STACK"] + usage["LOCAL"],
    }


# ----------------------------------------------------------------------------------------------
# The DESIGN.md story on the DeepSeek-V4-Flash shape


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
    s = ki.summarize(story, story_rows, target)
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
        assert ki.config_fits(story_rows, r["target"], r["config_index"]) == all(x["fits"] for x in same)


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


def test_tiny_kernel_dot_below_16_fails_cleanly(tmp_path):
    # in-process: under TRITON_INTERPRET the inspector compiles in a child process by module and name
    rows = ki.inspect_configs([LaunchConfig(8, 16, 4, 1)], [load_target("sm90")], tiny_specs, cache_root=tmp_path)
    assert rows[0]["error"].startswith("CompilationError") and "T8_H16_w4_s1" in rows[0]["reason"]
    ok = ki.inspect_configs([LaunchConfig(32, 16, 4, 1)], [load_target("sm90")], tiny_specs, cache_root=tmp_path)
    assert ok[0]["fits"] and ok[0]["shared_bytes"] > 0 and ok[0]["registers"] > 0


# ----------------------------------------------------------------------------------------------
# Disk cache


def test_cache_key_covers_config_arch_and_source():
    (s,) = tiny_specs(LaunchConfig(32, 16, 4, 1))
    keys = {
        ki.compile_key(s, 90),
        ki.compile_key(s, 120),
        ki.compile_key(dataclasses.replace(s, num_warps=8), 90),
        ki.compile_key(dataclasses.replace(s, constexprs={"BLOCK": 64}), 90),
    }
    assert len(keys) == 4
    assert ki.compile_key(s, 90) == ki.compile_key(tiny_specs(LaunchConfig(32, 16, 4, 1))[0], 90)


def test_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("KERNELCAMP_CACHE_DIR", str(tmp_path))
    assert ki.cache_dir() == tmp_path
    monkeypatch.delenv("KERNELCAMP_CACHE_DIR")
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    assert ki.cache_dir() == tmp_path.resolve() / ".kernelcamp_cache" / "inspect"


def test_ptxas_for_restores_environment(monkeypatch):
    monkeypatch.delenv("TRITON_PTXAS_BLACKWELL_PATH", raising=False)
    monkeypatch.setenv("TRITON_PTXAS_PATH", "/custom/ptxas")
    with ki.ptxas_for(120):
        assert os.environ["TRITON_PTXAS_BLACKWELL_PATH"].endswith("ptxas-blackwell")
        assert os.environ["TRITON_PTXAS_PATH"] == "/custom/ptxas"  # a user's choice is kept
    assert "TRITON_PTXAS_BLACKWELL_PATH" not in os.environ and os.environ["TRITON_PTXAS_PATH"] == "/custom/ptxas"
    with ki.ptxas_for(90):
        assert "TRITON_PTXAS_BLACKWELL_PATH" not in os.environ


def test_unreadable_figures_are_named(tmp_path):
    usage = "Resource usage:\n Function k:\n  REG:40 SHARED:0 LOCAL:0\n"
    assert ki.parse_resource_usage(usage, "k") == {"REG": 40, "SHARED": 0, "LOCAL": 0}
    with pytest.raises(ValueError):
        ki.parse_resource_usage(usage, "other")
    figs, unreadable = ki.read_cubin(b"not a cubin", "k")
    assert figs["registers"] is None and "cuobjdump" in unreadable["registers"]


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


def run_cli(*args: str, cache_root: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(KERNELCAMP_CACHE_DIR=str(cache_root), PYTHONPATH=str(ROOT))
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
    assert ki.cli_main(["--variant", "story_autotune", "--target", "sm999"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: unknown target")


# ----------------------------------------------------------------------------------------------
# Live readout on the GPU (H200, sm90): the loaded kernel's figures equal the cross-compiled ones


@pytest.mark.gpu
def test_live_figures_equal_cross_compiled(story, tmp_path):
    m = _kernel_module()
    major, minor = torch.cuda.get_device_capability()
    arch = major * 10 + minor
    for cfg in story.configs:
        for spec in m.compile_specs(**V4_FLASH, config=cfg):
            cross = ki.compile_figures(spec, arch, root=tmp_path)
            live = ki.live_figures(spec)
            assert ki.compare_live(cross, live) == [], (cfg.label(), spec.name)


@pytest.mark.gpu
def test_live_figures_from_jit_after_launch(tmp_path):
    a = torch.randn(32, 32, device="cuda", dtype=torch.float16)
    c = torch.empty(32, 32, device="cuda", dtype=torch.float32)
    _tiny_dot[(1,)](a, a, c, BLOCK=32, num_warps=4, num_stages=1)
    torch.cuda.synchronize()
    live = [r for r in ki.live_figures_from_jit(_tiny_dot) if r["num_warps"] == 4]
    assert live
    major, minor = torch.cuda.get_device_capability()
    (spec,) = tiny_specs(LaunchConfig(32, 16, 4, 1))
    # a real launch specializes pointer alignment (16-byte divisibility) like compile_specs' attrs
    spec_attrs = dataclasses.replace(spec, attrs={(i,): [["tt.divisibility", 16]] for i in range(3)})
    cross = ki.compile_figures(spec_attrs, major * 10 + minor, root=tmp_path)
    assert ki.compare_live(cross, live[0]) == []

"""The warp-specialized split kernel (Gluon, sm90; V3.2 and V4) on the CPU: its config, the launcher's refusals,
and its cross-compiled sm90 binary (kernels/sparse_mla_decode.py, campaign steps "ws" and "wsv4"). Its numerics run
on the GPU (tests/test_kernel_gpu.py): Gluon has no interpreter. The compile figures pinned below (shared-memory
bytes, copy and wgmma counts) are Triton 3.6.0's (.ci/constraints.txt): a Triton upgrade may move them; re-measure
them then, with benchmarks/KERNEL_TUNING.md's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from nointerp import ROOT, env_without_interpreter

from kernelcamp.errors import KernelcampError
from kernelcamp.variant import LaunchConfig, Variant, parse_config, parse_variant
from kernels import sparse_mla_decode as smd

WS = LaunchConfig(32, 64, 12, 2, "auto", warp_specialize=True)


def test_label_round_trip_and_dict():
    assert WS.label() == "T32_H64_w12_s2_kauto_ws"
    assert LaunchConfig.from_label("T32_H64_w12_s2_kauto_ws") == WS
    assert LaunchConfig.from_label("T32_H64_w12_s2_k4_ws").num_splits == 4
    assert WS.as_dict()["warp_specialize"] is True
    # a Triton config's dict (and so its hash) does not change
    assert "warp_specialize" not in LaunchConfig(32, 64, 8, 2, "auto").as_dict()
    with pytest.raises(ValueError, match=r"\[_ws\]"):
        LaunchConfig.from_label("T32_H64_w12_s2_kauto_wx")


def test_yaml_row_parses_and_twelve_warps_need_the_flag():
    row = {"BLOCK_T": 32, "BLOCK_H": 64, "num_warps": 12, "num_stages": 2, "warp_specialize": True, "max_batch": 8}
    assert parse_config(row, "variant.configs.0", in_list=True) == LaunchConfig(
        32, 64, 12, 2, "auto", max_batch=8, warp_specialize=True
    )
    with pytest.raises(KernelcampError, match="num_warps = 12: must be a power of two"):
        parse_config({**row, "warp_specialize": False}, "variant.configs.0", in_list=True)
    with pytest.raises(KernelcampError, match="warp_specialize = 'yes': expected true or false"):
        parse_config({**row, "warp_specialize": "yes"}, "variant.configs.0", in_list=True)
    last = {k: v for k, v in row.items() if k != "max_batch"}
    table = parse_variant(
        {
            "name": "t",
            "configs": [{"max_batch": 2, "BLOCK_T": 64, "BLOCK_H": 64, "num_warps": 8, "num_stages": 1}, last],
        }
    )
    assert table.config_for_batch(64).warp_specialize and not table.config_for_batch(1).warp_specialize


@pytest.mark.parametrize("label", ["T64_H64_w12_s2_kauto_ws", "T32_H64_w8_s2_kauto_ws", "T32_H64_w12_s4_kauto_ws"])
def test_other_tile_sizes_are_refused_with_the_one_that_runs(label):
    with pytest.raises(ValueError, match="T32_H64_w12_s2_k<splits>_ws"):
        smd.SparseMLADecode(Variant("ws", (LaunchConfig.from_label(label),)))


def test_three_staging_slots_run_on_v4_only():
    # V4's staging ring fits a third slot (226,424 B of shared memory); V3.2's would need 243,576 B: refused in one
    # line at launch and when the build stage asks for its compile specs, never an out-of-resources compile
    s3 = LaunchConfig.from_label("T32_H64_w12_s3_kauto_ws")
    assert smd.launch_domain(s3, "deepseek_v4", 64, 64) is None
    why = smd.launch_domain(s3, "deepseek_v32", 128, 64)
    assert "runs num_stages 2 on deepseek_v32, got 3" in why and "\n" not in why
    x = _v32()
    k = smd.SparseMLADecode(Variant("ws", (s3,)), check_indices=False)
    with pytest.raises(ValueError, match="runs num_stages 2 on deepseek_v32, got 3"):
        k(x["q"], x["kv_cache"], x["indices"], x["layout"], x["page_size"], x["sm_scale"])
    with pytest.raises(ValueError, match="T32_H64_w12_s3_kauto_ws: runs num_stages 2 on deepseek_v32, got 3"):
        smd.compile_specs("deepseek_v32", 128, 2048, s3)
    # the refusal names the ring, whatever else the shape breaks (H=16 is outside the launch domain too)
    with pytest.raises(ValueError, match="runs num_stages 2 on deepseek_v32, got 3"):
        smd.compile_specs("deepseek_v32", 16, 2048, s3)


@pytest.mark.parametrize("stages", [1, 4])
def test_a_ring_depth_no_layout_runs_names_the_ones_that_do(stages):
    """The num_stages refusal once said "on deepseek_v4 only, not deepseek_v4" for s1 / s4 on V4 (reachable through
    ``launch_domain`` from verify and the benchmark's ``runs_on``, which skip ``_check_config``)."""
    c = LaunchConfig(32, 64, 12, stages, "auto", warp_specialize=True)
    assert smd.launch_domain(c, "deepseek_v4", 64, 64) == (
        f"runs num_stages 2 or 3 on deepseek_v4, got {stages} (the staging ring depths that fit shared memory and "
        "are tested); use _s2_"
    )
    assert "on deepseek_v32, got" in smd.launch_domain(c, "deepseek_v32", 128, 64)


def test_autotune_list_and_fp16_are_refused():
    with pytest.raises(ValueError, match="autotune list cannot hold a warp-specialized config"):
        smd.SparseMLADecode(Variant("l", (LaunchConfig(32, 64, 8, 2, "auto"), WS)))
    x = _v32()
    with pytest.raises(ValueError, match="runs bf16 only"):  # at launch: a table's other rows may run fp16
        smd.SparseMLADecode(Variant("ws", (WS,)), dot_dtype="fp16", check_indices=False)(
            x["q"], x["kv_cache"], x["indices"], x["layout"], x["page_size"], x["sm_scale"]
        )


def _v32(B=2, H=128, page_size=64, layout="deepseek_v32", topk=64):
    return smd.make_inputs(layout, B, H, topk, page_size, 1024, "cpu")


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"layout": "deepseek_v4", "H": 64, "page_size": 1}, "page size of at least 2 for deepseek_v4, got 1"),
        ({"layout": "deepseek_v4", "H": 32}, "H a multiple of 64"),
        ({"H": 16}, "H a multiple of 64"),
        ({}, "Triton interpreter" if os.environ.get("TRITON_INTERPRET") else "sm90"),
        ({"layout": "deepseek_v4", "H": 64}, "Triton interpreter" if os.environ.get("TRITON_INTERPRET") else "sm90"),
    ],
)
def test_launch_refusals_are_one_line(kw, match):
    x = _v32(**kw)
    k = smd.SparseMLADecode(Variant("ws", (WS,)), check_indices=False)
    with pytest.raises(ValueError, match=match) as e:
        k(x["q"], x["kv_cache"], x["indices"], x["layout"], x["page_size"], x["sm_scale"])
    assert "\n" not in str(e.value) and "warp-specialized" in str(e.value)


WS16 = LaunchConfig.from_label("T64_H16_w12_s2_kauto_ws")


def test_h16_kernel_runs_v32_at_a_multiple_of_16_heads_only():
    # step "ws16": the H=16 warp-specialized kernel's config, its launch domain and its one-line refusals
    assert WS16.label() == "T64_H16_w12_s2_kauto_ws" and WS16.warp_specialize
    smd.SparseMLADecode(Variant("ws16", (WS16,)))  # the config is accepted
    assert smd.launch_domain(WS16, "deepseek_v32", 16, 64) is None
    assert smd.launch_domain(WS16, "deepseek_v32", 128, 64) is None
    assert "needs H a multiple of 16, got H=24" in smd.launch_domain(WS16, "deepseek_v32", 24, 64)
    assert "runs deepseek_v32 only" in smd.launch_domain(WS16, "deepseek_v4", 64, 64)
    # its 32-head form (candidate "h32"): the same kernel, a head tile of 32
    h32 = LaunchConfig.from_label("T64_H32_w12_s2_k32_ws")
    smd.SparseMLADecode(Variant("h32", (h32,)))
    assert smd._ws_kernel(h32, 0) == (smd._sparse_mla_ws16_split_kernel, {"NSTAGE": 2, "HB": 32})
    assert smd.launch_domain(h32, "deepseek_v32", 128, 64) is None
    assert "needs H a multiple of 32, got H=16" in smd.launch_domain(h32, "deepseek_v32", 16, 64)
    assert "runs deepseek_v32 only" in smd.launch_domain(h32, "deepseek_v4", 64, 64)
    with pytest.raises(ValueError, match="T64_H16_w12_s2_kauto_ws: runs deepseek_v32 only"):
        smd.compile_specs("deepseek_v4", 64, 512, WS16)
    for label in ("T32_H16_w12_s2_kauto_ws", "T64_H64_w12_s2_kauto_ws", "T64_H8_w12_s2_kauto_ws"):
        with pytest.raises(ValueError, match="T64_H16_w12_s2_k<splits>_ws"):
            smd.SparseMLADecode(Variant("ws", (LaunchConfig.from_label(label),)))
    # a third staging slot does not fit (V3.2's rows): refused at launch, as the H=64 kernel's on V3.2
    s3 = LaunchConfig.from_label("T64_H16_w12_s3_kauto_ws")
    assert "runs num_stages 2 on deepseek_v32, got 3" in smd.launch_domain(s3, "deepseek_v32", 16, 64)
    x = _v32(H=16)
    k = smd.SparseMLADecode(Variant("ws16", (WS16,)), check_indices=False)
    with pytest.raises(ValueError, match="Triton interpreter" if os.environ.get("TRITON_INTERPRET") else "sm90"):
        k(x["q"], x["kv_cache"], x["indices"], x["layout"], x["page_size"], x["sm_scale"])


def _h16_refusals(x, triton_match):
    """The one-line refusal of ``x`` by the H=16 warp-specialized kernel (on a CPU it always refuses: no sm90 GPU),
    after checking that a Triton H=16 config (mma v2, fp16 products) refuses it with ``triton_match``."""
    t = smd.SparseMLADecode(Variant("t", (LaunchConfig(32, 16, 4, 2, "auto"),)))
    with pytest.raises(ValueError, match=triton_match):
        t(x["q"], x["kv_cache"], x["indices"], x["layout"], x["page_size"], x["sm_scale"])
    k = smd.SparseMLADecode(Variant("ws16", (WS16,)))
    with pytest.raises(ValueError) as e:
        k(x["q"], x["kv_cache"], x["indices"], x["layout"], x["page_size"], x["sm_scale"])
    return str(e.value)


def test_h16_kernel_is_not_refused_for_q_outside_fp16():
    # the H=16 kernel multiplies in bf16: the fp16 range check of q (for the Triton H=16 configs, mma v2) must not
    # refuse its input; it had, as every BLOCK_H < 64 config counted as an fp16 one. A Triton H=16 config still
    # refuses it, in one line
    x = _v32(H=16)
    x["q"][0, 0, 0] = 1e5
    why = _h16_refusals(x, "q: .*fp16")
    assert "fp16" not in why and "warp-specialized" in why


def test_h16_kernel_is_not_refused_for_group_scales_outside_fp16():
    # the other half of the same fix: a cache row's group scale of 65504 or more refuses a Triton H=16 config (it
    # multiplies P by the scale in fp16), not the H=16 warp-specialized kernel
    x = _v32(H=16)
    tok = int(x["indices"][0, 0])
    ps = x["page_size"]
    row = (tok // ps) * 656 * ps + (tok % ps) * 656  # V3.2: 656-byte rows, the four fp32 scales at bytes 512-527
    x["kv_cache"].view(-1).view(torch.float32)[(row + 512) // 4] = 1e5
    why = _h16_refusals(x, "kv_cache: .*group scale of 100000")
    assert "scale" not in why and "warp-specialized" in why


def test_page_size_must_be_a_power_of_two():
    x = smd.make_inputs("deepseek_v32", 1, 64, 32, 48, 96, "cpu")
    k = smd.SparseMLADecode(Variant("ws", (WS,)), check_indices=False)
    with pytest.raises(ValueError, match="power-of-two page size, got 48"):
        k(x["q"], x["kv_cache"], x["indices"], x["layout"], 48, x["sm_scale"])


def _json_in_child(code: str):
    """The JSON value ``code`` prints last, run in a Python without TRITON_INTERPRET (compiling needs the real JIT)."""
    r = subprocess.run(
        [sys.executable, "-c", code],
        env=env_without_interpreter(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


_WS_SM90 = r"""
import json, re, sys
from kernelcamp.inspect.compile import compile_spec, read_cubin
from kernelcamp.variant import LaunchConfig
from kernels.sparse_mla_decode import compile_specs
layout, H, topk, stages = LAYOUT, HEADS, TOPK, STAGES
cfg = LaunchConfig(32, 64, 12, stages, "auto", warp_specialize=True)
specs = compile_specs(layout, H, topk, cfg, batch=128, all_split_d=True)
k = compile_spec(specs[0], 90)
ptx = k.asm["ptx"]
copies = re.findall(r"cp\.async\.(\w+)\.shared\.global\s.*,\s*(0x[0-9a-f]+)", ptx)
print(json.dumps({
    "names": [s.name for s in specs], "num_warps": specs[0].num_warps, "options": specs[0].options,
    "shared": k.metadata.shared, "warps": k.metadata.num_warps,
    "cubin": read_cubin(k.asm["cubin"], k.metadata.name)[0],
    "setmaxnreg": sorted(set(re.findall(r"setmaxnreg\.(\w+)\.sync\.aligned\.u32\s+(\d+)", ptx))),
    "wgmma": ptx.count("wgmma.mma_async"), "cp_async": ptx.count("cp.async.cg.shared.global"),
    "copy_bytes": sorted({int(n, 16) for _, n in copies}), "copies": len(copies),
    "st_global_16B": len(re.findall(r"st\.global\.v4\.b32", ptx)),
    "bar_sync": len(re.findall(r"\bbar\.sync\b|barrier\.sync", ptx)),
    # the first 16-byte global load (a q row's) after the first named barrier, the partitions' start: q is loaded by
    # a partition, not by the whole CTA before the partitions start (steps "qload", V4, and "qload16")
    "q_in_partition": ptx.find("barrier.sync") < ptx.find("ld.global.v4.b32"),
}))
"""


def _ws_sm90(layout, heads, topk, stages=2, tile=(32, 64)):
    """The figures of _WS_SM90 for a warp-specialized config of ``tile`` (BLOCK_T, BLOCK_H; the H=16 kernel's: 64 and
    16 or 32) at ``heads`` and ``topk``."""
    code = _WS_SM90.replace("LAYOUT, HEADS, TOPK, STAGES", f"{layout!r}, {heads}, {topk}, {stages}")
    return _json_in_child(
        code.replace("LaunchConfig(32, 64, 12, stages", f"LaunchConfig({tile[0]}, {tile[1]}, 12, stages")
    )


def test_cross_compiles_for_sm90_one_program_per_sm_without_spills():
    f = _ws_sm90("deepseek_v32", 128, 2048)
    assert f["names"] == ["sparse_mla_split_ws", "sparse_mla_combine"]
    # the program is 12 warps (the occupancy figures'); it compiles as a 4-warp default partition + 2 workers
    assert f["num_warps"] == 12 and f["warps"] == 12 and f["options"] == {"num_warps": 4, "maxnreg": 168}
    # 168 registers x 384 threads fit the SM's 65,536 once; 222,584 B of shared memory fit the H200's 232,448
    assert f["cubin"]["registers"] == 168 and f["cubin"]["local_bytes"] == 0
    assert f["shared"] + f["cubin"]["static_shared_bytes"] <= 232448
    # warp-specialized for real: the partitions' register budgets, wgmma and the producer's cp.async gathers
    assert ["dec", "120"] in f["setmaxnreg"] and ["dec", "192"] in f["setmaxnreg"]
    assert f["wgmma"] > 0 and f["cp_async"] > 0
    # every gather is a 16-byte copy: 4 + 4 fp8, 2 rope and 1 scale copies a thread, in the prologue and the loop
    assert f["copy_bytes"] == [16] and f["copies"] == 22
    # step "ostage32": a one-split bf16 output goes out through shared memory in 16-byte row stores, 16 a thread in
    # each consumer (none before: 4-byte stores straight from the wgmma accumulator layout)
    assert f["st_global_16B"] == 32
    # step "sload": the producer reads each tile's scales back in its fp8 rows' threads, with no exchange through
    # shared memory (35 barriers before, when each half's group scales went through shared memory to those threads)
    assert f["bar_sync"] == 28
    assert not f["q_in_partition"]  # the H=64 V3.2 kernel's default partition loads q before the partitions start


def test_v4_cross_compiles_for_sm90_with_16_byte_gathers():
    # V4's 584-byte tokens: with its page term written 584 << page_shift, Triton proved the data rows 8-byte
    # aligned only, and every fp8 gather was an 8-byte cp.async.ca (34 copies against 20 16-byte ones now)
    f = _ws_sm90("deepseek_v4", 64, 512)
    assert f["names"] == ["sparse_mla_split_ws", "sparse_mla_combine"] and f["warps"] == 12
    assert f["cubin"]["registers"] == 168 and f["cubin"]["local_bytes"] == 0
    # no rope tiles of their own (V4's rope is in dims 448-511): 205,688 B against V3.2's 222,584 (step "qload":
    # its consumers load their q halves themselves, 16 B more than when the default partition loaded q)
    assert f["shared"] == 205688
    # step "ostage": a one-split bf16 output goes out through shared memory in 16-byte row stores, 16 a thread in
    # each consumer (none before: 4-byte stores straight from the wgmma accumulator layout)
    assert f["st_global_16B"] == 32
    assert f["bar_sync"] == 31  # step "sload": 34 before (one exchange of scale words a half tile)
    assert f["q_in_partition"]  # step "qload": each consumer loads its own q half
    assert ["dec", "120"] in f["setmaxnreg"] and ["dec", "192"] in f["setmaxnreg"]
    # 4 + 4 fp8 and 2 rope 16-byte copies a thread, and the 8-byte scale row, in the prologue and the loop;
    # the V3.2 kernel's rope QK dot is gone (36 wgmma against 40)
    assert f["copy_bytes"] == [8, 16] and f["cp_async"] == 20 and f["copies"] == 22
    assert f["wgmma"] == 36
    # num_stages 3: a third staging slot (20,736 B more), the gathers two tiles ahead, still one program per SM
    f3 = _ws_sm90("deepseek_v4", 64, 512, stages=3)
    assert f3["shared"] == 226424 and f3["shared"] + f3["cubin"]["static_shared_bytes"] <= 232448
    assert f3["cubin"]["registers"] == 168 and f3["cubin"]["local_bytes"] == 0
    assert f3["copies"] == 33  # two prologue gathers and the loop's, 11 copies each


def test_h16_kernel_cross_compiles_for_sm90_one_program_per_sm_without_spills():
    f = _ws_sm90("deepseek_v32", 16, 2048, tile=(64, 16))
    assert f["names"] == ["sparse_mla_split_ws16", "sparse_mla_combine"] and f["warps"] == 12
    assert f["cubin"]["registers"] == 168 and f["cubin"]["local_bytes"] == 0
    # q 18 KB, the K ring 2 x 72 KB (64-token slots), a 20.5 KB staging slot for each of the two producers, P^T 2 KB:
    # one program per SM; a second staging slot for each producer (2 x 20,992 B) would not fit
    assert f["shared"] == 210216
    assert f["shared"] + f["cubin"]["static_shared_bytes"] + 2 * 20992 > 232448
    # step "p2": two producer warpgroups at 120 registers, the consumer (the default partition) at 256
    assert ["dec", "120"] in f["setmaxnreg"] and ["inc", "256"] in f["setmaxnreg"]
    # V3.2's gathers, 16-byte copies, 11 a thread a tile: each producer's first tile before its loop and its next one
    # in the loop, refilled before the tile is dequantized (step "p2"); the consumer's 36 QK wgmma (576 dims in K steps
    # of 16) and 32 P.V (two halves of 4 M tiles of 64 columns x 4 K steps of 16 tokens)
    assert f["copy_bytes"] == [16] and f["copies"] == 44
    assert f["wgmma"] == 36 + 32
    # step "qload16": the consumer loads q while the producers gather their first tiles (the whole CTA loaded it before
    # the partitions started), its stores then a barrier of its own: 27 barriers against 26
    assert f["q_in_partition"] and f["bar_sync"] == 27


def test_the_inspector_compiles_it_in_its_child_with_its_options(tmp_path):
    # the build stage compiles in a child process from a payload of the spec: without the spec's options
    # (num_warps 4, maxnreg) there, Gluon saw num_warps 12 and refused ("num_warps must be a power of 2"), and
    # the stage pruned every warp-specialized row as not compiling for sm90
    code = (
        "import json; from pathlib import Path\n"
        "from kernelcamp.inspect.compile import compile_figures\n"
        "from kernelcamp.variant import LaunchConfig\n"
        "from kernels.sparse_mla_decode import compile_specs\n"
        "cfg = LaunchConfig(32, 64, 12, 2, 'auto', warp_specialize=True)\n"
        "spec = compile_specs('deepseek_v32', 128, 2048, cfg, batch=128)[0]\n"
        f"print(json.dumps(compile_figures(spec, 90, use_cache=False, root=Path({str(tmp_path)!r}))))\n"
    )
    fig = _json_in_child(code)
    assert fig["error"] is None, fig["error"]
    assert fig["registers"] == 168 and fig["shared_bytes"] == 222584


def test_the_inspector_prunes_it_on_sm120_without_compiling(tmp_path):
    # compiled for sm120, its wgmma aborted LLVM inside the compile child and failed the whole build stage;
    # now the sm120 row is pruned with the reason, and sm90 fits one program per SM
    code = (
        "import json; from pathlib import Path\n"
        "from kernelcamp.inspect import fit\n"
        "from kernelcamp.targets import load_target\n"
        "from kernelcamp.variant import LaunchConfig\n"
        "from kernels import sparse_mla_decode as m\n"
        "cfg = LaunchConfig(32, 64, 12, 2, 'auto', warp_specialize=True)\n"
        "specs_for = lambda c: m.compile_specs('deepseek_v32', 128, 2048, c, batch=128)\n"
        "rows = fit.inspect_configs([cfg], [load_target('sm90'), load_target('sm120')], specs_for,\n"
        f"                          cache_root=Path({str(tmp_path)!r}))\n"
        "print(json.dumps([[r['target'], r['kernel'], r['fits'], r['reason'], r['ctas_per_sm']] for r in rows]))\n"
    )
    rows = _json_in_child(code)
    sm90 = [x for x in rows if x[0] == "sm90" and x[1] == "sparse_mla_split_ws"]
    sm120 = [x for x in rows if x[0] == "sm120"]
    assert sm90 and sm90[0][2] is True and sm90[0][4] == 1
    assert sm120 and all(x[2] is False for x in sm120)
    assert "compiles for sm90 only, not sm120" in sm120[0][3]


def _verify_params(shapes):
    from pathlib import Path

    import yaml

    params = yaml.safe_load((Path(__file__).resolve().parents[1] / "params.yaml").read_text())
    params["workload"] = {**params["workload"], "layout": "deepseek_v32", "num_heads": 128, "topk": 2048}
    params["verify"]["kernel"]["cpu_shapes"] = shapes
    return params


def test_verify_skips_shapes_outside_its_domain_and_fails_a_config_never_run():
    # step "ws" failed its first verify on the H200: the generic shapes' H=16 cases ran the warp-specialized rows,
    # which refuse H=16 by design. Such a case is recorded as skipped with the reason; the Triton row and the table
    # (its B=1 row is Triton) still run there; a config with no shape in its domain fails, never passes unrun
    from kernelcamp.verify.kernel import check_kernel

    table = Variant("t", (LaunchConfig(16, 16, 4, 2, "auto", max_batch=1), WS))
    cases = check_kernel(_verify_params([[1, 16, 32]]), {"candidate": table}, "cpu", "fp16")
    by = {c["config"]: c for c in cases if "B" in c}
    assert by[table.configs[0].label()]["passed"] and "skipped" not in by[table.configs[0].label()]
    assert by["table"]["passed"] and "skipped" not in by["table"]
    assert "needs H a multiple of 64, got H=16" in by[WS.label()]["skipped"]
    never = [c for c in cases if "B" not in c]
    assert len(never) == 1 and never[0]["config"] == WS.label() and never[0]["passed"] is False


def test_verify_runs_it_inside_its_domain():
    # at H=64 it is run (here on the CPU, where the launcher refuses it: a failed case, not a skipped one)
    from kernelcamp.verify.kernel import check_kernel

    cases = check_kernel(_verify_params([[2, 64, 17]]), {"candidate": Variant("ws", (WS,))}, "cpu", "fp16")
    ws = [c for c in cases if c["config"] == WS.label() and "B" in c]
    assert len(ws) == 1 and ws[0]["passed"] is False and "skipped" not in ws[0]
    assert "warp-specialized" in ws[0]["error"]


def test_h32_head_tile_cross_compiles_for_sm90_one_program_per_sm_without_spills():
    # candidate "h32": the H=16 kernel at 32 heads a program (HB 32): q 36 KB and P^T 4 KB, 20,736 B more than at 16
    # heads, still one program per SM within the H200's 232,448 B; the consumer's two [256, 32] fp32 accumulators
    # (128 registers a thread) fit its 256 with no spills; the same wgmma count (N 32 instead of 16)
    f = _ws_sm90("deepseek_v32", 128, 2048, tile=(64, 32))
    assert f["names"] == ["sparse_mla_split_ws16", "sparse_mla_combine"] and f["warps"] == 12
    assert f["cubin"]["registers"] == 168 and f["cubin"]["local_bytes"] == 0
    assert f["shared"] == 210216 + 20736
    assert f["shared"] + f["cubin"]["static_shared_bytes"] <= 232448
    assert ["inc", "256"] in f["setmaxnreg"] and f["wgmma"] == 36 + 32 and f["copies"] == 44

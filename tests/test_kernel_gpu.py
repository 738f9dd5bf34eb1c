"""GPU tests of the sparse MLA decode kernel: full shapes on the bf16 path, capture safety, timing.

Run on the device: ``pytest -m gpu tests/test_kernel_gpu.py``. Error criterion and tolerances as in
tests/test_kernel.py (torch's own bf16 error as the yardstick).
"""

from __future__ import annotations

import pytest
import torch

from kernelcamp.errors import KernelcampError
from kernelcamp.variant import LaunchConfig, Variant
from kernelcamp.verify.tolerance import failure_message, judge_output
from kernels import sparse_mla_decode as smd

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

FULL = {
    "v32": ("deepseek_v32", 128, 2048),
    "v32_tp8": ("deepseek_v32", 16, 2048),
    "v4_flash": ("deepseek_v4", 64, 512),
}
CONFIGS = [LaunchConfig(16, 16, 4, 2, "auto"), LaunchConfig(32, 32, 8, 2, 1), LaunchConfig(16, 64, 8, 1, 4)]
STORY = (LaunchConfig(16, 16, 4, 2, "auto"), LaunchConfig(32, 16, 4, 2, "auto"), LaunchConfig(32, 16, 8, 2, "auto"))


def _args(inp):
    return inp["q"], inp["kv_cache"], inp["indices"], inp["layout"], inp["page_size"], inp["sm_scale"]


def _assert_close(inp, out, lse):
    """The shared tolerance rule (kernelcamp.verify.tolerance, as the verify stage judges)."""
    refs = smd.sparse_mla_decode_ref(*_args(inp))
    lows = smd.sparse_mla_decode_ref(*_args(inp), compute_dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    res = judge_output(out, lse, refs, lows, truncating=False)
    assert res["passed"], failure_message(res)


@pytest.fixture(scope="module")
def inputs():
    out = {}
    for fam, (layout, H, topk) in FULL.items():
        inp = smd.make_inputs(layout, 8, H, topk, 64, 65536, "cuda", seed=1, empty_fraction=0.05)
        inp["indices"][3] = -1  # an all-empty row
        out[fam] = inp
    return out


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.label())
@pytest.mark.parametrize("fam", list(FULL))
def test_full_shapes_bf16_match_reference(inputs, fam, config):
    inp = inputs[fam]
    k = smd.SparseMLADecode(Variant("t", (config,)))
    out, lse = k(*_args(inp))
    assert k.last_config == config
    assert torch.all(out[3] == 0) and torch.all(lse[3] == float("-inf"))
    _assert_close(inp, out, lse)


def test_b1_page256_and_splits_agree():
    inp = smd.make_inputs("deepseek_v32", 1, 128, 2048, 256, 8192, "cuda", seed=4)
    outs = []
    for splits in (1, 4, "auto"):
        out, lse = smd.SparseMLADecode(Variant("t", (LaunchConfig(16, 32, 4, 2, splits),)))(*_args(inp))
        _assert_close(inp, out, lse)
        outs.append(lse)
    torch.testing.assert_close(outs[0], outs[1], atol=1e-4, rtol=1e-5)


def test_autotune_list_records_config_and_benchmarks_once(inputs):
    inp = inputs["v4_flash"]
    k = smd.SparseMLADecode(Variant("story", STORY, ("B",), is_list=True))
    out, lse = k(*_args(inp))
    assert k.last_config in STORY
    assert k.autotune_bench_runs == len(STORY)
    _assert_close(inp, out, lse)
    k(*_args(inp))
    assert k.autotune_bench_runs == len(STORY)  # cached for this key


def test_timing_harness_sanity(inputs):
    from kernelcamp.bench import timing

    inp = inputs["v4_flash"]
    k = smd.SparseMLADecode(Variant("t", (CONFIGS[0],)), check_indices=False)

    def fn():
        return k(*_args(inp))

    flushed = timing.summarize(timing.bench_graph(fn, replays=10))
    warm = timing.summarize(timing.bench_graph(fn, replays=10, flush_l2=False))
    assert 0 < flushed["latency_us_p20"] <= flushed["latency_us_p50"] <= flushed["latency_us_p80"] < 10_000
    assert flushed["latency_us_p50"] >= 0.8 * warm["latency_us_p50"]  # a cold L2 is never much faster
    k2 = smd.SparseMLADecode(Variant("t2", (CONFIGS[1],)), check_indices=False)
    rows = timing.interleaved_rounds({"a": fn, "b": lambda: k2(*_args(inp))}, rounds=4, replays_per_round=3)
    assert len(rows) == 8 and {r["impl"] for r in rows} == {"a", "b"}
    assert [r["impl"] for r in rows[:4]] == ["a", "b", "b", "a"]
    assert all(r["gpu_name"] and r["triton"] and r["latency_us"] > 0 for r in rows)


def test_capture_single_config_warmed_passes(inputs):
    from kernelcamp.verify.capture import check_capture_safety

    inp = inputs["v32"]
    k = smd.SparseMLADecode(Variant("bt16_w8", (LaunchConfig(16, 16, 8, 2, "auto"),)))
    rep = check_capture_safety(k, inp, warmup_inputs=inp)
    assert rep["captured"] and rep["replay_matches_eager"] and rep["max_abs_diff"] == 0
    assert rep["compiles_during_capture"] == 0 and rep["autotune_runs_during_capture"] == 0


def test_capture_autotune_warmed_passes(inputs):
    from kernelcamp.verify.capture import check_capture_safety

    inp = inputs["v4_flash"]
    k = smd.SparseMLADecode(Variant("story", STORY, ("B",), is_list=True))
    rep = check_capture_safety(k, inp, warmup_inputs=inp)
    assert rep["replay_matches_eager"] and rep["autotune_runs_during_capture"] == 0


def test_batch_table_captures_each_batch_size_with_its_row(inputs):
    # a server captures one graph per batch bucket: each capture runs its own row, warmed, with no
    # autotuning and the same result as an eager launch and as the reference
    from kernelcamp.verify.capture import check_capture_safety

    inp = inputs["v4_flash"]
    small, large = LaunchConfig(32, 16, 4, 2, "auto", max_batch=2), LaunchConfig(32, 64, 8, 1, "auto")
    k = smd.SparseMLADecode(Variant("tbl", (small, large), (), is_list=True))
    for B, want in ((2, small), (8, large)):
        x = {**inp, "q": inp["q"][:B], "indices": inp["indices"][:B]}
        rep = check_capture_safety(k, x, warmup_inputs=x)
        assert rep["replay_matches_eager"] and rep["autotune_runs_during_capture"] == 0
        assert rep["compiles_during_capture"] == 0 and k.last_config == want
        _assert_close(x, *k(*_args(x)))


def test_capture_autotune_cold_is_caught(inputs):
    # last: a failed capture is the one test here that leaves the CUDA context doing extra work
    from kernelcamp.verify.capture import check_capture_safety

    inp = inputs["v4_flash"]
    k = smd.SparseMLADecode(Variant("story", STORY, ("B",), is_list=True))
    warm = {**inp, "q": inp["q"][:2], "indices": inp["indices"][:2]}  # warmed at B=2, captured at B=8
    with pytest.raises(KernelcampError, match="autotune benchmark"):
        check_capture_safety(k, inp, warmup_inputs=warm)


WS = LaunchConfig.from_label("T32_H64_w12_s2_kauto_ws")
WS16 = LaunchConfig.from_label("T64_H16_w12_s2_kauto_ws")


def _ws_matches_reference(fam, page_size, splits, num_stages, seed, heads=64, topk=None):
    """The warp-specialized kernel at B=8 (an all-empty row 3, 5% empty slots) against the torch reference: the
    config it ran, zeros and -inf LSE on the empty row, the shared tolerance elsewhere. ``heads`` 16: the H=16
    kernel (its config T64_H16_w12_...); ``topk`` replaces the shape's."""
    layout, H, full_topk = FULL[fam]
    topk = topk or full_topk
    inp = smd.make_inputs(layout, 8, H, topk, page_size, 65536, "cuda", seed=seed, empty_fraction=0.05)
    inp["indices"][3] = -1
    block_t = 64 if heads in (16, 32) else 32
    cfg = LaunchConfig(block_t, heads, 12, num_stages, splits, warp_specialize=True)
    k = smd.SparseMLADecode(Variant(f"ws_s{num_stages}", (cfg,)))
    out, lse = k(*_args(inp))
    assert k.last_config == cfg
    assert torch.all(out[3] == 0) and torch.all(lse[3] == float("-inf"))
    _assert_close(inp, out, lse)


@pytest.mark.parametrize(
    "fam, page_size",
    [("v32", 64), ("v32", 256), ("v4_flash", 64), ("v4_flash", 256), ("v4_flash", 2)],
)
@pytest.mark.parametrize("splits", ["auto", 1, 3])
def test_warp_specialized_kernel_matches_reference(fam, page_size, splits):
    # V3.2 and V4-Flash, an all-empty row, 5% empty slots, uneven splits (V3.2: 64 tiles over 3, 22, 22, 20; V4:
    # 16 over 3, 6, 6, 4) and one split (the kernel stores the final output itself); pages 256 and 2 exercise the
    # run-time page shift (V4's smallest page, where its page term is 1168 << 0)
    _ws_matches_reference(fam, page_size, splits, num_stages=2, seed=2)


@pytest.mark.parametrize("page_size", [64, 256, 1])
@pytest.mark.parametrize("splits", ["auto", 1, 3])
@pytest.mark.parametrize("topk", [2048, 2016, 100])
def test_h16_warp_specialized_kernel_matches_reference(page_size, splits, topk):
    # the H=16 kernel (V3.2 at TP8: tokens on wgmma's M, a ring slot two producer tiles): top-k 2016 ends on a
    # half slot (63 tiles: producer 1's last tile, the 64th, has -1 indices and stores zeros, masked by the consumer),
    # 100 on a partial tile; 3 splits of 2048 are 11, 11 and 10 slots; pages 256 and 1 exercise the run-time page shift
    _ws_matches_reference("v32_tp8", page_size, splits, num_stages=2, seed=4, heads=16, topk=topk)


@pytest.mark.parametrize("page_size", [64, 1])
@pytest.mark.parametrize("splits", ["auto", 1, 3])
@pytest.mark.parametrize("topk", [2048, 2016, 100])
def test_h32_head_tile_matches_reference(page_size, splits, topk):
    # candidate "h32": the H=16 kernel with 32 heads a program (wgmma's N 32, q 36 KB, P^T 4 KB), for V3.2's
    # smallest batches; H=128 is 4 head tiles a request, top-k 2016 ends on a half slot, 100 on a partial tile
    _ws_matches_reference("v32", page_size, splits, num_stages=2, seed=5, heads=32, topk=topk)


@pytest.mark.parametrize("B, H", [(5, 16), (2, 128)])
def test_h16_kernel_with_empty_splits_and_several_head_tiles_matches_reference(B, H):
    # (added after a review; first run on the GPU in step "p2"'s device call, 2026-12-03) B=5 at TP8's H=16: auto
    # splits are 132 // 5 = 26 over 32 slots, 2 slots a split, so 10 splits get no token (an empty partial, LSE -inf);
    # H=128: 8 head tiles a request (pid_h up to 7), 8 splits at B=2
    inp = smd.make_inputs("deepseek_v32", B, H, 2048, 64, 65536, "cuda", seed=6, empty_fraction=0.05)
    k = smd.SparseMLADecode(Variant("ws16", (WS16,)))
    out, lse = k(*_args(inp))
    assert k.last_config == WS16
    _assert_close(inp, out, lse)


@pytest.mark.parametrize("page_size", [64, 2])
@pytest.mark.parametrize("splits", ["auto", 3])
def test_v4_flash_three_staging_slots_match_reference(page_size, splits):
    # (named v4_flash so that `-k v4_flash` selects it: step fullqk's device call filtered on that and left it out)
    # num_stages 3 (V4 only): with 3 splits (6, 6, 4 tiles a program) the producer gathers two tiles ahead through
    # the three-slot ring; auto (16 splits at B=8, one tile a program) covers a ring the loop never fills
    _ws_matches_reference("v4_flash", page_size, splits, num_stages=3, seed=3)


@pytest.mark.parametrize("fam", ["v32", "v4_flash"])
def test_warp_specialized_row_of_a_table_captures(fam):
    # a batch table whose large-batch row is warp-specialized: captured per batch size, no compile in the replay
    # (verify's capture check runs one batch size, where the V4-Flash table runs a Triton row)
    layout, H, topk = FULL[fam]
    table = Variant(
        "t",
        (LaunchConfig(64, 64, 8, 1, "auto", max_batch=2), LaunchConfig(32, 64, 12, 2, "auto", warp_specialize=True)),
    )
    k = smd.SparseMLADecode(table, check_indices=False)
    for B in (2, 16):
        inp = smd.make_inputs(layout, B, H, topk, 64, 65536, "cuda", seed=B)
        k(*_args(inp))
        torch.cuda.synchronize()
        before = k.compile_count
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out, lse = k(*_args(inp))
        g.replay()
        torch.cuda.synchronize()
        assert k.compile_count == before
        assert k.last_config.warp_specialize == (B > 2)
        _assert_close(inp, out, lse)


@pytest.mark.parametrize(
    "fam, config",
    [("v32", LaunchConfig(64, 64, 8, 1, "auto")), ("v32", WS), ("v4_flash", WS), ("v32_tp8", WS16)],
    ids=lambda x: x if isinstance(x, str) else x.label(),
)  # the V3.2 table's B=1 row (split-D 2, 32 splits), the warp-specialized rows of both tables and the H=16 kernel
# at B=4
def test_graph_replays_over_new_q_give_each_new_result(fam, config):
    # a server replays one graph per batch bucket over new inputs written in place: each replay's combine must
    # read that replay's partial outputs, never those the previous one left (written for campaign step "pdl",
    # whose combine started while the split kernel ran; reports/campaigns/kernel_speed/pdl_sweep/)
    layout, H, topk = FULL[fam]
    B = 1 if not config.warp_specialize else 4
    inp = smd.make_inputs(layout, B, H, topk, 64, 65536, "cuda", seed=5)
    k = smd.SparseMLADecode(Variant("replay", (config,)), check_indices=False)
    k(*_args(inp))
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out, lse = k(*_args(inp))
    gen = torch.Generator(device="cuda").manual_seed(7)
    for _ in range(4):
        inp["q"].copy_(torch.randn(inp["q"].shape, generator=gen, device="cuda", dtype=torch.bfloat16))
        g.replay()
        torch.cuda.synchronize()
        _assert_close(inp, out, lse)
        eager_out, eager_lse = k(*_args(inp))
        assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse)


def test_kernel_rounds_measure_the_roofline_against_the_gpu_that_ran():
    """The benchmark stage's roofline % uses the peaks of the GPU in this machine (2026-12-05: an H100 was measured
    against the H200's peaks of params.yaml's target sm90): benchmark.json's ``kernel.roofline`` names it."""
    from pathlib import Path

    import yaml

    from kernelcamp.bench.kernel import kernel_level
    from kernelcamp.bench.record import variants_to_run
    from kernelcamp.spec import parse_spec
    from kernelcamp.targets import peaks_for_gpu

    p = yaml.safe_load((Path(__file__).resolve().parents[1] / "params.yaml").read_text())
    p["benchmark"]["serving"]["enabled"] = False
    p["benchmark"]["run_as_target"] = None  # no build.json here
    p["benchmark"]["kernel"].update(rounds=2, min_rounds=2, look_every=2, replays_per_round=2, warmup=1)
    p["benchmark"]["kernel"]["batch_sizes"] = [8]
    p["workload"].update(batch_sizes=[8], num_cache_tokens=8192)
    spec = parse_spec(p)
    variants, _ = variants_to_run(spec, {}, "cuda")
    _, kernel = kernel_level(spec.raw, variants, "cuda", log=lambda m: None)
    roof, name = kernel["roofline"], torch.cuda.get_device_name()
    assert roof["gpu"] == name and roof["params_target_gpu"] == p["target"]["gpu"]
    peaks = peaks_for_gpu(name)
    pct = kernel["batch"]["8"]["candidate"]["roofline_pct"]
    if peaks is None:  # a GPU no conf/target file names: no roofline, and the reason
        assert roof["target"] is None and pct is None and name in roof["why"]
    else:
        assert roof["peak_gbps"] == peaks["peak_gbps"] and 0 < pct < 100

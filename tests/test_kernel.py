"""CPU tests of the sparse MLA decode kernel (TRITON_INTERPRET=1, fp16 dot operands) and its reference.

The interpreter multiplies raw bits for bf16 ``tl.dot`` (DESIGN.md, known traps), so the kernel runs
with ``dot_dtype="fp16"`` here (fp8 e4m3 -> fp16 is exact); the bf16 path is tested on the GPU
(tests/test_kernel_gpu.py). Shapes are small: d_qk is fixed by the layout, so the interpreter's
cost is in B, H and topk.
"""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys

import pytest
import torch
from nointerp import env_without_interpreter

from kernelcamp.variant import LaunchConfig, Variant
from kernelcamp.verify.tolerance import failure_message, judge_output
from kernels import sparse_mla_decode as smd

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
DOT = "bf16" if ON_GPU else "fp16"
LOWP = torch.bfloat16 if ON_GPU else torch.float16


def _launch(inp: dict, config: LaunchConfig, dot: str = DOT) -> tuple[torch.Tensor, torch.Tensor]:
    k = smd.SparseMLADecode(Variant("t", (config,)), dot_dtype=dot)
    out, lse = k(inp["q"], inp["kv_cache"], inp["indices"], inp["layout"], inp["page_size"], inp["sm_scale"])
    assert k.last_config == config
    return out, lse


def _assert_close(inp: dict, out: torch.Tensor, lse: torch.Tensor) -> None:
    """The shared tolerance rule (kernelcamp.verify.tolerance, as the verify stage judges); the
    interpreter rounds bf16 by truncation."""
    args = (inp["q"], inp["kv_cache"], inp["indices"], inp["layout"], inp["page_size"], inp["sm_scale"])
    refs = smd.sparse_mla_decode_ref(*args)
    lows = smd.sparse_mla_decode_ref(*args, compute_dtype=LOWP)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    res = judge_output(out, lse, refs, lows, truncating=not ON_GPU)
    assert res["passed"], failure_message(res)


# layout, B, H, topk, page_size, config, empty_fraction; cost grows with H * topk * B
CASES = [
    ("deepseek_v32", 2, 16, 40, 64, LaunchConfig(16, 16, 4, 2, 1), 0.0),  # topk not a multiple of BLOCK_T
    ("deepseek_v32", 3, 16, 64, 256, LaunchConfig(32, 16, 4, 2, "auto"), 0.25),  # -1 slots, page 256
    ("deepseek_v32", 1, 128, 24, 64, LaunchConfig(16, 64, 8, 2, 2), 0.0),  # H 128, B 1
    ("deepseek_v32", 1, 48, 20, 64, LaunchConfig(16, 32, 4, 2, 2), 0.1),  # BLOCK_H does not divide H=48
    ("deepseek_v4", 2, 16, 40, 64, LaunchConfig(16, 16, 4, 2, 3), 0.2),
    ("deepseek_v4", 1, 16, 50, 256, LaunchConfig(16, 32, 4, 2, 1), 0.0),  # BLOCK_H > H: masked heads
    ("deepseek_v4", 1, 64, 32, 64, LaunchConfig(16, 32, 4, 2, "auto"), 0.0),  # H 64
    ("deepseek_v4", 2, 64, 40, 64, LaunchConfig(16, 64, 8, 2, 2), 0.1),  # the wgmma tile (BLOCK_H 64)
    ("deepseek_v4", 1, 16, 10, 3, LaunchConfig(16, 16, 4, 2, 2), 0.0),  # an odd page size (8-byte aligned rows)
    # few rows: the combine splits each row's d_v over programs (_combine_block_d: 16 and 32 rows -> 64 wide)
    ("deepseek_v32", 1, 16, 48, 64, LaunchConfig(16, 16, 4, 2, 3), 0.0),
    ("deepseek_v4", 1, 32, 48, 64, LaunchConfig(16, 16, 4, 2, "auto"), 0.0),
]


@pytest.mark.parametrize("layout,B,H,topk,page_size,config,empty", CASES, ids=lambda v: str(v))
def test_kernel_matches_reference(layout, B, H, topk, page_size, config, empty):
    n_tok = 2 * page_size if page_size == 256 else 4 * page_size
    inp = smd.make_inputs(layout, B, H, topk, page_size, n_tok, DEVICE, seed=B + H + topk, empty_fraction=empty)
    assert bool((inp["indices"] == n_tok - 1).any(dim=1).all() if empty == 0 else True)  # last token of last page
    out, lse = _launch(inp, config)
    _assert_close(inp, out, lse)


@pytest.mark.parametrize("layout", ["deepseek_v32", "deepseek_v4"])
def test_all_empty_row_gives_zeros_and_minus_inf(layout):
    inp = smd.make_inputs(layout, 3, 16, 40, 64, 256, DEVICE, seed=1)
    inp["indices"][1] = -1
    for splits in (1, 3):
        out, lse = _launch(inp, LaunchConfig(16, 16, 4, 2, splits))
        assert torch.all(out[1] == 0) and torch.all(lse[1] == float("-inf"))
        ref_out, ref_lse = smd.sparse_mla_decode_ref(inp["q"], inp["kv_cache"], inp["indices"], layout, 64)
        assert torch.all(ref_out[1] == 0) and torch.all(ref_lse[1] == float("-inf"))
        _assert_close(inp, out, lse)


def test_last_token_of_last_page_dominates():
    # a row whose only valid slot is the cache's last token: out must be that token's V row exactly
    layout, ps, n_tok = "deepseek_v4", 64, 128
    inp = smd.make_inputs(layout, 1, 16, 32, ps, n_tok, DEVICE, seed=3)
    inp["indices"][:] = -1
    inp["indices"][0, 17] = n_tok - 1
    out, lse = _launch(inp, LaunchConfig(16, 16, 4, 2, 2))
    v = smd.dequantize_kv_cache(inp["kv_cache"], layout, ps)[n_tok - 1, :512]
    torch.testing.assert_close(out[0].float(), v.expand(16, -1).to(torch.bfloat16).float(), atol=0, rtol=0)
    _assert_close(inp, out, lse)


def test_sm_scale_is_applied():
    inp = smd.make_inputs("deepseek_v32", 1, 16, 32, 64, 128, DEVICE, seed=5)
    inp["sm_scale"] = 0.3
    out, lse = _launch(inp, LaunchConfig(16, 16, 4, 2, 1))
    _assert_close(inp, out, lse)


@pytest.mark.parametrize(
    "layout,page_size", [("deepseek_v32", 64), ("deepseek_v32", 256), ("deepseek_v4", 64), ("deepseek_v4", 256)]
)
def test_quantize_roundtrip_and_byte_layout(layout, page_size):
    lay = smd.LAYOUTS[layout]
    g = torch.Generator().manual_seed(0)
    latent = (torch.randn(2 * page_size, lay.d_qk, generator=g) * 3).to(torch.bfloat16)
    kv = smd.quantize_kv_cache(latent, layout, page_size)
    assert kv.dtype == torch.uint8 and kv.shape == (2, page_size * lay.token_bytes)
    deq = smd.dequantize_kv_cache(kv, layout, page_size)
    x = latent.float()
    assert torch.equal(deq[:, lay.fp8_dims :], x[:, lay.fp8_dims :])  # rope stored as bf16, exact
    nope = x[:, : lay.fp8_dims].unflatten(1, (lay.num_groups, lay.group_size))
    step = nope.abs().amax(-1, keepdim=True) / 448 * (2 if lay.scale_kind == "ue8m0" else 1)
    err = (deq[:, : lay.fp8_dims].unflatten(1, (lay.num_groups, lay.group_size)) - nope).abs()
    assert bool((err <= nope.abs() * 2.0**-4 + step * 2.0**-9 + 1e-30).all())  # e4m3: 3 mantissa bits
    # byte positions: token t of page 1
    t, page = 5, kv[1]
    if lay.scale_kind == "fp32":
        row = page[t * 656 : (t + 1) * 656]
        scales = row[512:528].clone().view(torch.float32)
        torch.testing.assert_close(scales, nope[page_size + t].abs().amax(-1) / 448)
        assert torch.equal(row[528:656].clone().view(torch.bfloat16), latent[page_size + t, 512:])
    else:
        data = page[t * 576 : (t + 1) * 576]
        srow = page[page_size * 576 + t * 8 : page_size * 576 + (t + 1) * 8]
        assert int(srow[7]) == 0  # pad byte
        e = srow[:7].long()
        assert bool(((2.0 ** (e - 127).float()) * 448 >= nope[page_size + t].abs().amax(-1)).all())
        assert torch.equal(data[448:576].clone().view(torch.bfloat16), latent[page_size + t, 448:])


def test_make_inputs_is_deterministic_and_distinct():
    a = smd.make_inputs("deepseek_v4", 2, 16, 64, 64, 256, "cpu", seed=7, empty_fraction=0.0)
    b = smd.make_inputs("deepseek_v4", 2, 16, 64, 64, 256, "cpu", seed=7, empty_fraction=0.0)
    assert torch.equal(a["indices"], b["indices"]) and torch.equal(a["kv_cache"], b["kv_cache"])
    for row in a["indices"]:
        assert len(set(row.tolist())) == 64 and 255 in row.tolist()
    assert set(a) == {"q", "kv_cache", "indices", "sm_scale", "layout", "page_size"}
    assert a["sm_scale"] == pytest.approx(1 / math.sqrt(512))


def test_flops_and_bytes():
    assert smd.flops("deepseek_v32", 128, 128, 2048) == 2 * 128 * (576 + 512) * 2048 * 128
    assert smd.bytes_moved("deepseek_v4", 2, 64, 512) == 584 * 512 * 2 + 2 * 2 * 64 * 512 + 4 * 2 * 512 + (
        2 * 2 * 64 * 512 + 4 * 2 * 64
    )


def test_combine_splits_columns_only_when_rows_leave_sms_idle():
    # 132 SMs, d_v 512: the halving stops when twice the programs would not fit two per SM
    # (COMBINE_PROGRAMS_PER_SM), or at 64 wide; V3.2 B=1 (128 rows) takes 256-wide slices
    rows = (1, 16, 33, 64, 66, 67, 128, 132, 133, 4096)
    assert smd.COMBINE_PROGRAMS_PER_SM == 2
    assert [smd._combine_block_d(r, 512, 132) for r in rows] == [64, 64, 64, 128, 128, 256, 256, 256, 512, 512]


def test_split_d_rule():
    # V3.2 only; doubled while twice the programs fit the SMs, at most 4 parts of 128 columns
    assert [smd.resolve_split_d(0, p, 132) for p in (1, 33, 34, 64, 66, 67, 128)] == [4, 4, 2, 2, 2, 1, 1]
    assert smd.resolve_split_d(1, 1, 132) == 1  # V4 keeps its columns together


def test_split_d_is_capped_at_the_four_groups(monkeypatch):
    # a SPLIT_D_MAX of 8 launched SPLIT_D=8: 4 // 8 = 0 groups per part, an output of garbage without a word;
    # 3 gave 4 parts. The parts are a power of two of at most V3.2's four 128-column groups
    monkeypatch.setattr(smd, "SPLIT_D_MAX", 8)
    assert smd.resolve_split_d(0, 1, 132) == 4
    monkeypatch.setattr(smd, "SPLIT_D_MAX", 3)
    assert smd.resolve_split_d(0, 1, 132) == 2


def test_split_d_batches_name_each_binary_a_config_launches():
    # {parts: the smallest batch size launching them}, over a row's range: one part included where it runs
    L = LaunchConfig
    assert smd._split_d_batches(0, L(64, 64, 8, 1, "auto", max_batch=16), 128, 2048) == {2: 1, 1: 2}
    assert smd._split_d_batches(0, L(64, 16, 8, 3, "auto", max_batch=8), 16, 2048) == {4: 1, 2: 2, 1: 3}
    assert smd._split_d_batches(0, L(64, 16, 8, 2, "auto", max_batch=1), 16, 2048) == {4: 1}  # never one part
    assert smd._split_d_batches(0, L(32, 16, 4, 3, 2), 16, 2048) == {4: 1, 2: 17, 1: 34}  # 2 splits
    assert smd._split_d_batches(0, L(32, 16, 4, 3, 2, max_batch=8), 16, 2048) == {4: 1}
    assert smd._split_d_batches(1, L(32, 16, 4, 2, "auto", max_batch=2), 64, 512) == {1: 1}  # V4: one part
    # a table row's range starts after the previous row's bound: TP8's B <= 8 row runs B 2-8, never 4 parts
    assert smd._split_d_batches(0, L(64, 16, 8, 3, "auto", max_batch=8), 16, 2048, min_batch=2) == {2: 2, 1: 3}
    assert smd._split_d_batches(0, L(32, 16, 4, 3, 2), 16, 2048, min_batch=97) == {1: 97}
    # the SM count matters: V3.2's B 17-32 row (2 splits) runs 2 parts from B=17 to 23 on 188 SMs, none on 132
    row = L(64, 64, 8, 2, 2, max_batch=32)
    assert smd._split_d_batches(0, row, 128, 2048, 132, min_batch=17) == {1: 17}
    assert smd._split_d_batches(0, row, 128, 2048, 188, min_batch=17) == {2: 17, 1: 24}


_SPLIT_D_SPECS = """
import json
from kernelcamp.variant import LaunchConfig as L
from kernels.sparse_mla_decode import compile_specs
def names(*a, **k):
    return [[s.name, s.constexprs.get("SPLIT_D")] for s in compile_specs(*a, **k)]
print(json.dumps([
    names("deepseek_v32", 128, 2048, L(64, 64, 8, 1, "auto", max_batch=16), all_split_d=True),
    names("deepseek_v32", 16, 2048, L(64, 16, 8, 3, "auto", max_batch=8), all_split_d=True),
    names("deepseek_v32", 16, 2048, L(64, 16, 8, 3, "auto", max_batch=8), all_split_d=True, min_batch=2),
    names("deepseek_v32", 16, 2048, L(64, 16, 8, 2, "auto", max_batch=1), all_split_d=True),
    names("deepseek_v32", 128, 2048, L(64, 64, 8, 2, 2, max_batch=32), all_split_d=True, min_batch=17, num_sms=188),
    names("deepseek_v32", 128, 2048, L(64, 64, 8, 1, "auto", max_batch=16)),
    names("deepseek_v4", 64, 512, L(32, 16, 4, 2, "auto", max_batch=2), all_split_d=True),
]))
"""


def test_compile_specs_name_every_split_d_binary_for_the_inspector():
    # the build stage inspected each row at batch 64 only, the one-part binary: V3.2's B <= 16 row runs 2 parts
    # at B=1 (224 registers, no spills, where the inspected binary showed 255 and spills) and TP8's B=1 row never
    # runs the inspected binary at all (4 parts). all_split_d lists the split kernel once per part count the row
    # launches in its range (min_batch to max_batch, on num_sms SMs), then the combine
    r = _without_interpreter(_SPLIT_D_SPECS)
    assert r.returncode == 0, r.stderr[-2000:]
    v32_b16, tp8_b8, tp8_b8_from2, tp8_b1, v32_b32_sm120, plain, v4 = json.loads(r.stdout.strip().splitlines()[-1])
    split, comb = ["sparse_mla_split", 1], ["sparse_mla_combine", None]
    d2, d4 = ["sparse_mla_split_d2", 2], ["sparse_mla_split_d4", 4]
    assert v32_b16 == [split, d2, comb]
    assert tp8_b8 == [split, d2, d4, comb]
    assert tp8_b8_from2 == [split, d2, comb]  # as the table's B 2-8 row: no 4 parts
    assert tp8_b1 == [d4, comb]  # the B=1 row runs only the 4-part binary
    assert v32_b32_sm120 == [split, d2, comb]  # on 188 SMs B 17-23 leave half of them idle
    assert plain == [split, comb] and v4 == [split, comb]


@pytest.mark.parametrize(
    "config", [LaunchConfig(16, 16, 4, 2, 1), LaunchConfig(16, 16, 4, 2, 4), LaunchConfig(16, 64, 4, 2, 3)]
)
@pytest.mark.parametrize("split_d_max", [1, 2, 4])
def test_v32_split_d_parts_give_the_same_output(config, split_d_max, monkeypatch):
    # each part computes the same scores and softmax and stores its own columns (part 0 the LSE); BLOCK_H 16 is
    # the mma v2 path (fp16 groups, scales on P), 64 the wgmma one; one split writes the output directly
    monkeypatch.setattr(smd, "SPLIT_D_MAX", split_d_max)
    inp = smd.make_inputs("deepseek_v32", 2, 16, 40, 64, 256, DEVICE, seed=11, empty_fraction=0.2)
    inp["indices"][1] = -1  # an all-empty row: zeros and -inf in every part
    n = smd.resolve_num_splits(config.num_splits, 2, 16, 40, config.BLOCK_H, config.BLOCK_T)
    assert smd.resolve_split_d(0, 2 * smd.triton.cdiv(16, config.BLOCK_H) * n) == split_d_max
    out, lse = _launch(inp, config)
    assert torch.all(out[1] == 0) and torch.all(lse[1] == float("-inf"))
    _assert_close(inp, out, lse)
    monkeypatch.setattr(smd, "SPLIT_D_MAX", 1)
    out1, lse1 = _launch(inp, config)
    torch.testing.assert_close(out.float(), out1.float(), atol=0, rtol=0)
    torch.testing.assert_close(lse, lse1, atol=0, rtol=0)


def test_auto_splits_rule():
    # one program per SM at small batch, 1 split once the grid fills the GPU
    assert smd.resolve_num_splits("auto", 1, 128, 2048, 16, 16, 132) == 16
    assert smd.resolve_num_splits("auto", 128, 128, 2048, 16, 16, 132) == 1
    assert smd.resolve_num_splits("auto", 1, 64, 512, 16, 16, 132) == 32  # capped at 32 tiles / AUTO_MAX_SPLITS
    assert smd.resolve_num_splits("auto", 1, 64, 64, 16, 16, 132) == 4  # never more splits than tiles
    assert smd.resolve_num_splits(100, 1, 16, 40, 16, 16) == 3  # never more splits than tiles


def _inp():
    return smd.make_inputs("deepseek_v32", 2, 16, 32, 64, 128, DEVICE, seed=2)


BAD = [
    ("q", lambda d: d.update(q=d["q"].float())),
    ("q", lambda d: d.update(q=d["q"][:, :, :512])),
    ("q", lambda d: d.update(q=d["q"].transpose(1, 2).contiguous().transpose(1, 2))),
    ("kv_cache", lambda d: d.update(kv_cache=d["kv_cache"][:, :-8])),
    ("kv_cache", lambda d: d.update(kv_cache=d["kv_cache"].view(torch.int8))),
    ("indices", lambda d: d.update(indices=d["indices"].long())),
    ("indices", lambda d: d.update(indices=d["indices"][:1])),
    ("indices", lambda d: d["indices"].__setitem__((0, 3), 128)),  # == num_pages * page_size
    ("indices", lambda d: d["indices"].__setitem__((1, 0), -2)),
    ("layout", lambda d: d.update(layout="deepseek_v3")),
    ("page_size", lambda d: d.update(page_size=32)),
]


@pytest.mark.parametrize("name,mutate", BAD, ids=[f"{n}-{i}" for i, (n, _) in enumerate(BAD)])
def test_bad_input_raises_value_error_naming_it(name, mutate):
    d = _inp()
    mutate(d)
    k = smd.SparseMLADecode(Variant("t", (LaunchConfig(16, 16, 4, 2, 1),)), dot_dtype=DOT)
    with pytest.raises(ValueError, match=name):
        k(d["q"], d["kv_cache"], d["indices"], d["layout"], d["page_size"], d["sm_scale"])
    if name != "layout":
        with pytest.raises(ValueError, match=name):
            smd.sparse_mla_decode_ref(d["q"], d["kv_cache"], d["indices"], d["layout"], d["page_size"])


def test_q_beyond_fp16_is_refused_where_a_config_multiplies_q_in_fp16():
    # V3.2 configs with BLOCK_H < 64 take q's groups in fp16 (module docstring): a q of 70144 would become inf
    inp = smd.make_inputs("deepseek_v32", 1, 16, 16, 64, 128, DEVICE, seed=3)
    inp["q"][0, 3, 7] = 70144.0  # exact in bf16
    args = (inp["q"], inp["kv_cache"], inp["indices"], inp["layout"], inp["page_size"], inp["sm_scale"])
    fp16_cfg = LaunchConfig(16, 16, 4, 2, 1)
    with pytest.raises(
        ValueError, match=r"q: \|q\| reaches 70144, .*BLOCK_H < 64 multiplies q's fp8-group dims in fp16"
    ):
        smd.SparseMLADecode(Variant("t", (fp16_cfg,)))(*args)
    smd.SparseMLADecode(Variant("t", (fp16_cfg,)), check_indices=False)(*args)  # unchecked: the caller's choice
    inp["q"][0, 3, 7] = 6.0e4
    smd.SparseMLADecode(Variant("t", (fp16_cfg,)))(*args)  # within fp16: runs
    inp["q"][0, 3, 520] = 70144.0  # a rope dim: the rope dot stays in the dot dtype (bf16 here)
    smd.SparseMLADecode(Variant("t", (fp16_cfg,)))(*args)
    # dot_dtype fp16 multiplies every dim of q in fp16, whatever the config
    with pytest.raises(ValueError, match=r'q: \|q\| reaches 70144, but dot_dtype="fp16" multiplies q in fp16'):
        smd.SparseMLADecode(Variant("t", (LaunchConfig(16, 64, 4, 2, 1),)), dot_dtype="fp16")(*args)
    inp["q"][0, 3, 520] = float("inf")  # non-finite passes, as on the bf16 path (the output is non-finite anyway)
    smd.SparseMLADecode(Variant("t", (fp16_cfg,)))(*args)


def test_a_cache_beyond_fp16_is_refused_where_dot_dtype_fp16_multiplies_it():
    # the interpreter's dot_dtype="fp16" multiplies the dequantized rows in fp16: a V4 group at 2^17 times its
    # fp8 values (up to 448) would become inf without a word, where a q of the same size was refused
    inp = smd.make_inputs("deepseek_v4", 1, 16, 16, 64, 128, DEVICE, seed=3)
    latent = torch.zeros(128, 512)
    latent[inp["indices"][0, 5].item(), :64] = 1.0e5
    inp["kv_cache"] = smd.quantize_kv_cache(latent.to(torch.bfloat16).to(DEVICE), "deepseek_v4", 64)
    args = (inp["q"], inp["kv_cache"], inp["indices"], inp["layout"], inp["page_size"], inp["sm_scale"])
    cfg = Variant("t", (LaunchConfig(16, 16, 4, 2, 1),))
    with pytest.raises(
        ValueError, match=r'kv_cache: a row that indices name dequantizes to \|value\| .*dot_dtype="fp16"'
    ):
        smd.SparseMLADecode(cfg, dot_dtype="fp16")(*args)
    inp["indices"][0, 5] = -1  # no index names the row: runs
    smd.SparseMLADecode(cfg, dot_dtype="fp16")(*args)


def test_a_group_scale_beyond_fp16_is_refused_where_a_config_scales_p_in_fp16():
    # V3.2 configs with BLOCK_H < 64 multiply P (<= 1) by each token's group scale in fp16 (module docstring):
    # a scale of 1e5 with fp8 values of 0.5 (a value of 5e4, within fp16) made p * scale inf and the output
    # non-finite without a word, where a BLOCK_H >= 64 config returns the right output
    inp = smd.make_inputs("deepseek_v32", 1, 16, 16, 64, 128, DEVICE, seed=3)
    tok = inp["indices"][0, 5].item()
    rows = inp["kv_cache"].view(-1, 656)  # V3.2 tokens are contiguous 656-byte rows
    rows[tok, :128] = 0x30  # e4m3 0.5
    rows[tok, 512:516] = torch.tensor([1.0e5], dtype=torch.float32).view(torch.uint8).to(rows.device)
    args = (inp["q"], inp["kv_cache"], inp["indices"], inp["layout"], inp["page_size"], inp["sm_scale"])
    fp16_cfg = Variant("t", (LaunchConfig(16, 16, 4, 2, 1),))
    with pytest.raises(ValueError, match=r"kv_cache: a row that indices name has a group scale of 100000, but a V3.2"):
        smd.SparseMLADecode(fp16_cfg, dot_dtype="fp16")(*args)
    out, _ = smd.SparseMLADecode(fp16_cfg, dot_dtype="fp16", check_indices=False)(*args)  # unchecked: what it guards
    assert not torch.isfinite(out.float()).all()
    ref, _ = smd.sparse_mla_decode_ref(*args)
    out64, _ = smd.SparseMLADecode(Variant("t", (LaunchConfig(16, 64, 4, 2, 1),)), dot_dtype="fp16")(*args)
    assert torch.isfinite(ref).all() and torch.isfinite(out64.float()).all()
    inp["indices"][0, 5] = -1  # no index names the row: runs
    smd.SparseMLADecode(fp16_cfg, dot_dtype="fp16")(*args)


@pytest.mark.parametrize(
    "field,config",
    [
        ("BLOCK_T", LaunchConfig(8, 16, 4, 2, 1)),
        ("BLOCK_H", LaunchConfig(16, 24, 4, 2, 1)),
        ("num_splits", LaunchConfig(16, 16, 4, 2, 0)),
    ],
)
def test_bad_config_raises_value_error(field, config):
    with pytest.raises(ValueError, match=field):
        smd.SparseMLADecode(Variant("t", (config,)))
    with pytest.raises(ValueError, match="dot_dtype"):
        smd.SparseMLADecode(Variant("t", (LaunchConfig(16, 16, 4, 2, 1),)), dot_dtype="fp8")


def test_list_variant_wraps_autotuner_and_single_does_not():
    single = smd.SparseMLADecode(Variant("s", (LaunchConfig(16, 16, 4, 2, 1),)))
    assert single._tuner is None
    cfgs = (LaunchConfig(16, 16, 4, 2, "auto"), LaunchConfig(32, 16, 8, 2, 2))
    lst = smd.SparseMLADecode(Variant("l", cfgs, ("B", "topk"), is_list=True))
    assert lst._tuner is not None and list(lst._tuner.keys) == ["B", "topk"]
    assert [c.kwargs["BLOCK_T"] for c in lst._tuner.configs] == [16, 32]


_SPECS = """
import json
from kernelcamp.variant import LaunchConfig
from kernels.sparse_mla_decode import compile_specs
specs = compile_specs("deepseek_v4", 64, 512, LaunchConfig(32, 16, 8, 2, "auto"))
print(json.dumps([{"name": s.name, "num_warps": s.num_warps, "num_stages": s.num_stages,
                   "constexprs": {k: v for k, v in s.constexprs.items() if isinstance(v, (int, str))},
                   "signature": s.signature} for s in specs]))
"""


def _without_interpreter(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a Python without TRITON_INTERPRET (under it nothing can be compiled)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = env_without_interpreter()
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True, timeout=300)


def test_compile_specs_cover_every_argument():
    r = _without_interpreter(_SPECS)
    assert r.returncode == 0, r.stderr[-2000:]
    specs = json.loads(r.stdout.strip().splitlines()[-1])
    assert [s["name"] for s in specs] == ["sparse_mla_split", "sparse_mla_combine"]
    split = specs[0]
    assert (split["num_warps"], split["num_stages"]) == (8, 2)
    assert split["constexprs"]["BLOCK_T"] == 32 and split["constexprs"]["LAYOUT"] == 1
    assert all(split["signature"][k] == "constexpr" for k in split["constexprs"])
    assert split["signature"]["q_ptr"] == "*bf16" and split["signature"]["kv_u8_ptr"] == "*u8"


@pytest.mark.skipif(not os.environ.get("TRITON_INTERPRET"), reason="checks the interpreter-mode error")
def test_compile_specs_under_interpreter_say_what_to_do():
    with pytest.raises(RuntimeError, match="without TRITON_INTERPRET"):
        smd.compile_specs("deepseek_v4", 64, 512, LaunchConfig(16, 16, 4, 2, "auto"))


def test_kernel_source_hash():
    h = smd.kernel_source_hash()
    assert len(h) == 64 and h == smd.kernel_source_hash()


_CROSS = """
import sys, triton
from triton.compiler import ASTSource
from triton.backends.compiler import GPUTarget
from kernelcamp.variant import LaunchConfig
from kernels.sparse_mla_decode import compile_specs
for arch in (90, 120):
    for spec in compile_specs("deepseek_v4", 64, 512, LaunchConfig(16, 16, 4, 2, "auto")):
        k = triton.compile(ASTSource(spec.fn, spec.signature, spec.constexprs, spec.attrs),
                           target=GPUTarget("cuda", arch, 32),
                           options={"num_warps": spec.num_warps, "num_stages": spec.num_stages})
        print(arch, spec.name, k.metadata.shared)
"""


def test_cross_compiles_for_sm90_and_sm120():
    r = _without_interpreter(_CROSS)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.split("\n")
    assert any(line.startswith("120 sparse_mla_split") for line in lines)
    shared = int(next(line for line in lines if line.startswith("90 sparse_mla_split")).split()[-1])
    assert 0 < shared <= 232448


_V4_PTX = """
import json, re, triton
from triton.compiler import ASTSource
from triton.backends.compiler import GPUTarget
from kernelcamp.variant import LaunchConfig
from kernels.sparse_mla_decode import compile_specs
out = {}
for cfg in (LaunchConfig(64, 64, 8, 2, "auto"), LaunchConfig(32, 16, 4, 2, "auto")):
    spec = compile_specs("deepseek_v4", 64, 512, cfg, batch=128)[0]
    k = triton.compile(ASTSource(spec.fn, spec.signature, spec.constexprs, spec.attrs),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": cfg.num_warps, "num_stages": 2})
    ptx = k.asm["ptx"]
    out[cfg.config_label()] = {
        "byte_loads": len(re.findall(r"ld\\.global[^ \\t]*\\.[ub]8", ptx)),
        "cp_async_4b": len(re.findall(r"cp\\.async\\.ca\\.shared\\.global [^;]*, 0x4,", ptx)),
    }
print(json.dumps(out))
"""


def test_v4_scale_bytes_are_prefetched_words_not_byte_loads():
    # step "v4tiles": a token's 8 ue8m0 bytes are two int32 words, cp.async prefetched at num_stages 2; one
    # byte load per group stayed synchronous (the top stall in Nsight Compute, candidates_10/), and before
    # the step the BLOCK_H 64 rows prefetched nothing at all (the P scratch's barriers)
    r = _without_interpreter(_V4_PTX)
    assert r.returncode == 0, r.stderr[-2000:]
    figs = json.loads(r.stdout.strip().splitlines()[-1])
    for label, f in figs.items():
        assert f["byte_loads"] == 0, (label, f)
        assert f["cp_async_4b"] >= 2, (label, f)


_V4_ODD_PAGE_PTX = """
import re, triton
from triton.compiler import ASTSource
from triton.backends.compiler import GPUTarget
from kernelcamp.variant import LaunchConfig
from kernels.sparse_mla_decode import compile_specs
for ps in (64, 3):
    spec = compile_specs("deepseek_v4", 64, 512, LaunchConfig(32, 16, 4, 2, "auto"), batch=8, page_size=ps)[0]
    k = triton.compile(ASTSource(spec.fn, spec.signature, spec.constexprs, spec.attrs),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 2})
    print(ps, len(re.findall(r"cp\\.async\\.cg\\.shared\\.global [^;]*, 0x10,", k.asm["ptx"])))
"""


def test_v4_gathers_claim_16_byte_alignment_only_for_even_page_sizes():
    # a V4 page is page_size * 584 bytes: after an odd page its rows start 8 bytes off a 16-byte boundary,
    # and the gathers' 16-byte cp.async copies (from a multiple_of(..., 16) hint) would be misaligned there
    r = _without_interpreter(_V4_ODD_PAGE_PTX)
    assert r.returncode == 0, r.stderr[-2000:]
    copies = dict(line.split() for line in r.stdout.strip().splitlines()[-2:])
    assert int(copies["64"]) > 0 and int(copies["3"]) == 0, copies


_TP8_PTX = """
import json, re
from kernelcamp.inspect.compile import compile_spec
from kernelcamp.variant import LaunchConfig
from kernels.sparse_mla_decode import compile_specs
spec = compile_specs("deepseek_v32", 16, 2048, LaunchConfig(32, 16, 4, 3, 4), batch=128)[0]
ptx = compile_spec(spec, 90).asm["ptx"]  # the inspector's compile: the spec's own warps and stages
print(json.dumps({
    "sync_16b_loads": len(re.findall(r"ld\\.global[^ \\t]*\\.v4\\.b32", ptx)),
    "mma_dtypes": sorted(set(re.findall(r"mma\\.sync\\.aligned\\.m16n8k16\\.row\\.col\\.f32\\.(\\w+)\\.", ptx))),
    "fp8_to_f16x2": len(re.findall(r"cvt\\.rn\\.f16x2\\.e4m3x2", ptx)),
}))
"""


@functools.lru_cache(maxsize=1)
def _tp8_ptx() -> dict:
    """Figures of the sm90 PTX of TP8's B=128 row (T32_H16_w4_s3, mma v2), cross-compiled once per session."""
    r = _without_interpreter(_TP8_PTX)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_v32_mma_v2_fp8_gathers_are_prefetched_not_synchronous():
    # TP8's B=128 row (T32_H16_w4_s3, mma v2): the fp8 group tiles fed both dots from one register tile,
    # so Triton's pipeliner left their loads synchronous (8 16-byte ld.global per thread per tile, the top
    # stall in Nsight Compute); each dot now has its own load and both are cp.async. The only 16-byte
    # synchronous global loads left are the q tile's, before the loop: 16 x 576 bf16 / 128 threads / 16 B = 9.
    assert _tp8_ptx()["sync_16b_loads"] == 16 * 576 * 2 // 128 // 16


def test_v32_mma_v2_fp8_groups_enter_the_dots_as_fp16():
    # TP8's rows (mma v2): the fp8 groups are converted to fp16 (exact, two per instruction) and the scales
    # applied to the dot results, instead of fp8 -> fp32 -> x scale -> bf16 per value; the rope dot stays bf16.
    # Per thread and tile: 32 tokens x 512 values x 2 loads / 128 threads / 2 per conversion = 128.
    ptx = _tp8_ptx()
    assert ptx["mma_dtypes"] == ["bf16", "f16"], ptx["mma_dtypes"]
    assert ptx["fp8_to_f16x2"] >= 32 * 512 * 2 // 128 // 2, ptx["fp8_to_f16x2"]


def test_batch_table_runs_the_row_for_each_batch_size_without_autotuning():
    # a batch table picks its row on the host from B (CUDA-graph safe: no autotuner, no benchmarking)
    small = LaunchConfig(16, 16, 4, 2, 2, max_batch=1)
    large = LaunchConfig(32, 16, 4, 1, 1)
    k = smd.SparseMLADecode(Variant("tbl", (small, large), (), is_list=True), dot_dtype=DOT)
    assert k._tuner is None
    for B, want in ((1, small), (2, large)):
        inp = smd.make_inputs("deepseek_v4", B, 16, 64, 64, 256, DEVICE, seed=B)
        out, lse = k(inp["q"], inp["kv_cache"], inp["indices"], inp["layout"], inp["page_size"], inp["sm_scale"])
        assert k.last_config == want
        _assert_close(inp, out, lse)
    assert k.autotune_bench_runs == 0

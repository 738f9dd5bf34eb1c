"""Sparse MLA decode over a paged fp8 KV cache (DeepSeek-V3.2 and DeepSeek-V4 layouts), in Triton.

What it computes. For each decode query (B requests, H query heads, one latent KV head shared by all
heads, MLA), attend over the ``topk`` cache tokens named by an int32 index row (-1 = empty slot,
masked) with an explicit softmax scale::

    s[b, h, t] = sm_scale * q[b, h, :] . K[idx[b, t], :]          (K = the dequantized latent, d_qk)
    out[b, h]  = sum_t softmax_t(s[b, h, :]) * K[idx[b, t], :d_v]  (V = the first d_v latent values)
    lse[b, h]  = log(sum_t exp(s[b, h, t]))                       (natural log, fp32)

Output bf16 ``[B, H, d_v]`` and fp32 ``[B, H]``. A row whose slots are all -1 returns an output of
zeros and ``lse = -inf`` (kernel and reference agree; the combine never divides by zero).

Cache layouts (DESIGN.md, "The first kernel"; both as DeepSeek's inference code stores them), one
uint8 tensor ``[num_pages, page_size * token_bytes]``:

- ``deepseek_v32`` (656 B/token, d_qk 576, d_v 512): bytes 0-511 are 512 fp8 e4m3 latent values,
  512-527 four fp32 scales (one per 128 values, value = fp8 * scale), 528-655 64 bf16 rope values.
  Tokens are contiguous rows in a page.
- ``deepseek_v4`` (584 B/token, d_qk = d_v = 512): per token a 576-byte data row (448 fp8 e4m3 +
  64 bf16 rope) and an 8-byte scale row (7 ue8m0 exponents, one per 64 values, value =
  fp8 * 2^(e-127), + 1 pad byte); within a page all data rows come first, then all scale rows.
  The quantizer never writes e = 0 (it would decode to the denormal 2^-127; the kernel flushes it
  to 0).

Kernel design: split-K over the top-k range. Grid ``(B, cdiv(H, BLOCK_H), num_splits)``; a program loads a
``BLOCK_H x d_qk`` query tile, walks its share of the top-k slots in ``BLOCK_T`` tiles, gathers the fp8 rows
by index (page = idx // page_size), dequantizes them with the layout's scales into the dot dtype, computes
``q . k^T`` with ``tl.dot`` (fp32 accumulate), runs an online softmax in base 2 (``sm_scale * log2(e)`` folded
into one multiply) and accumulates ``p . v`` where v is the same dequantized tile (MLA shares the latent
between K and V). Both layouts run one loop in ``_sparse_mla_split_kernel`` (``LAYOUT`` a constexpr), in
column tiles. V3.2 works in its four 128-wide fp8 groups: each group is dequantized with its fp32 scale into
its own ``[BLOCK_T, 128]`` dot-dtype tile (fp8 -> fp32 exact, one fp32 multiply, one rounding), the four group
dots and the 64-wide rope dot chain into one score accumulator, and one bf16 P feeds four ``[BLOCK_H, 128]``
output accumulators. An earlier version applied the scales to the scores and to P instead (five score
accumulators, four scaled copies of P); it spilled at BLOCK_T = 64 and ran V3.2 B=128 in 587 us where this one
takes 403 us on the H200 (reports/campaigns/kernel_speed/candidates_1/README.md, the "kscale" file). Wgmma
configs (``BLOCK_H >= 64``: V3.2's whole table) run that loop. At ``BLOCK_H < 64`` (mma v2: TP8's H=16) two
things differ in V3.2's loop:

- the P.V dots take a second load of the same fp8 bytes: one register tile feeding both dots wants two
  dot-operand layouts, and Triton's pipeliner then leaves its load synchronous (Triton 3.6,
  lib/Dialect/TritonGPU/Transforms/Pipeliner/AssignLatencies.cpp, ``canHaveSharedEncoding``); with one
  dot per load both become cp.async prefetches (step "fp8prefetch": TP8 B=128 186.6 -> 154.8 us);
- the fp8 groups enter the dots as fp16, exact and one conversion per two values, and the group
  scales go to the results instead: ``s += sc_g * (q_g . k8_g)`` with q's groups in fp16, and
  ``out_g += (p * sc_g) . k8_g`` with the scaled P in fp16 (the dequantization was the largest part of
  the instructions once the gathers were prefetched; step "fp16k": 154.2 -> 133.0 us). Both operands
  are rounded less than the bf16 path's (fp16 keeps 10 mantissa bits, bf16 7), but q's values must
  lie within fp16's range (|q| < 65504; below 6.1e-5 they lose precision as subnormals), and so must
  ``p * sc_g``: a group scale of 65504 or more would make it inf (the launcher refuses such a cache row
  when checks are on, ``_check_scales_fit_fp16``), and with cache scales below about 1e-5 (group maxima
  below ~0.005) P.V loses precision (8% relative error at 1e-5 of the usual magnitudes on the
  interpreter, 0.5% at 1e-3).

V4 runs the same loop in its own column tiles: three 128-wide tiles of two 64-value fp8 groups (each half
scaled by its ue8m0 exponent; a power-of-two scale only moves the exponent, so the bf16 dequantization is
exact), the seventh fp8 group (64) and the 64 bf16 rope values; V4's V is all five tiles (d_v = d_qk = 512). A
token's 8 scale bytes are loaded as two int32 words: 4-byte loads can be cp.async prefetches, while a first
version of these tiles that loaded one byte per group kept them synchronous, its top stall in Nsight Compute.
Before campaign step "v4tiles" V4 built one 512-wide tile from a ``[BLOCK_T, 8, 64]`` load and, at
``BLOCK_H >= 64``, passed P and alpha through a per-program global scratch: Triton lays out every warp along M
for a dot whose result reaches another dot (Triton 3.6, AccelerateMatmul.cpp, ``warpsPerTileV3``: "Contains a
chained dot" -> warps ``[num_warps, 1]``), so at ``BLOCK_H = 64`` with 8 warps both warpgroups compute the
whole ``q . k^T`` tile, and the scratch gave that dot warps ``[4, 2]`` (step "pscratch": V4-Flash B=128 68.3
-> 60.0 us). On the column tiles the scratch made every T64_H64 config slower (1.02-1.22x; its CTA barriers
stop the gathers' prefetch; V3.2 lost 10% to it for the same reason), so both layouts now keep the duplicated
QK dot at ``BLOCK_H = 64``; the column tiles without it ran V4-Flash B=128 in 56.2 against 60.8 us on the H200
(reports/campaigns/kernel_speed/candidates_10/README.md). At ``BLOCK_H < 64`` V4 keeps one load per fp8 tile
for both dots and the bf16 dequantization (V3.2's mma v2 changes above were not tried on V4).

With one split the kernel writes the final bf16 output and LSE itself; with more it writes fp32 partial
outputs and base-2 partial LSEs and ``_sparse_mla_combine_kernel`` merges them by LSE rescale, one program per
(b, h) row and column slice (rows split by column only while twice as many programs still fit two per SM:
``_combine_block_d``).

Split-D (V3.2): where a launch's grid leaves at least half the SMs idle (B=1: 64 programs at H=128, 32 at TP8's
H=16), the grid's second axis also splits V's 512 columns into ``SPLIT_D`` parts of 128-column groups
(``resolve_split_d``). Every part computes the same scores, softmax and LSE (the same instructions on the same
inputs); each accumulates P.V for its groups only, on its own load of those groups (as the mma v2 path's
second load), and stores its columns; part 0 stores the LSE. A program's partial-output store, 28% of the
stall samples of V3.2 B=1 in Nsight Compute (reports/campaigns/kernel_speed/candidates_10/), halves. At one
part the binary is the same as without the split (benchmarks/ptx_same.py).

Warp-specialized kernel (a config with ``warp_specialize``: ``T32_H64_w12_s2_k<splits>_ws``; Gluon, sm90 only,
``_sparse_mla_ws_split_kernel``, written for V3.2 and since run on V4 too): the same grid with BLOCK_H 64, the same
outputs and the same combine, but a program's 12 warps take roles instead of running one tile at a time. A producer
warpgroup gathers each 32-token tile's fp8 rows, scales and rope values with cp.async into a two-deep staging ring
(num_stages; V4 may take three; the next tile's indices loaded an iteration ahead), dequantizes them (fp8 -> fp32
times the group scale -> bf16, as ``_dequant_group``) into a two-deep ring of wgmma-ready K tiles and signals an
mbarrier. Two consumer warpgroups split QK's 576 dims (0-255 with the rope, 256-511), add their partial scores
through shared memory (both get the same scores), run the online softmax, and each accumulates P.V for its 256 of
V's 512 columns with wgmma, then release the K tile. The plain kernel's two warpgroups both compute the whole QK
tile at BLOCK_H 64 (above). H200: V3.2 B=128 261.4 us (279 TFLOPS) against 404.1 us for the Triton table's row, B=1
16.1 against 15.7 (reports/campaigns/kernel_speed/candidates_14/). V4 (``LAYOUT`` 1) runs the same partitions on its
own rows: the producer gathers data bytes 0-255 and 256-511, the 64 rope values and the 8-byte scale row,
dequantizes groups 0-3 and 4-6 with their ue8m0 exponents and writes the rope into K's dims 448-511 (V4 has no rope
tile of its own: its d_qk is 512, and its V is all 512 dims); the consumers split QK at dim 256 as on V3.2, without
V3.2's rope dot. Later campaign steps (reports/campaigns/kernel_speed/README.md): V4's consumers load their own q
halves while the producer gathers the first tile ("qload"); a one-split output leaves through the consumer's idle
half of the K ring in 16-byte row stores ("ostage", "ostage32"); the producer reads each tile's scales in the threads
of the fp8 rows they scale ("sload"). Dequantizing 8 values a thread, a row a warp, so that the producer's K-ring
stores meet no bank conflicts, was equivalent on both shapes and was not taken ("kst"). H200, final benchmark 20:
V3.2 B=128 241.5 us (302 TFLOPS), V4-Flash B=128 36.8 us (35% of roofline). It needs H a multiple of 64, a
power-of-two page size (V4: at least 2) and an sm90 GPU; Gluon has no interpreter, so the CPU tests cover it by
cross-compiling only.

H=16 warp-specialized kernel (``T64_H16_w12_s2_k<splits>_ws``, V3.2 only, H a multiple of 16: DeepSeek-V3.2 at TP8;
``_sparse_mla_ws16_split_kernel``, campaign step "ws16"): wgmma's M is 64 rows, so with 16 heads a program puts
tokens on M instead of heads. Its consumer computes S^T = K q^T ([64 tokens, 16 heads], all 576 dims), the online
softmax over tokens, and O^T += V^T P^T for all of V's columns (V^T the K tile read transposed, P^T through a 2 KB
shared buffer). H200 (grid 9, reports/campaigns/kernel_speed/grid_9/), with two consumers (each the whole S^T, a half
of V's columns) and one producer filling each 64-token ring slot with two 32-token tiles: TP8 B=128 113.8 us with one
split against 127.5 us for the Triton table's row, B=64 63.6 (2 splits) against 70.8, B=32 37.2 (4) against 42.2. The
producer looked like the limit (about 1.75 us a tile, the V4-Flash producer's own; gathering two tiles ahead made it
slower, step "ahead"), so step "p2" gave the kernel one consumer and two producers (``_ws16_producer``), each the
V3.2 producer above for every other tile, a half of each slot, with its own staging slot refilled before it
dequantizes: faster, 0.80x (H200, reports/campaigns/kernel_speed/p2_sweep/; final benchmark 21: TP8 B=128 90.2 us,
1,969 GB/s). The TP8 table runs it from B=5 on (grids 10 and 11, step "table10"), and V3.2's at B=1 (8 head groups,
step "b1h16"). A split is a whole number of slots; 210,216 B of shared memory, one program per SM. It also runs 32
heads a program (``T64_H32_w12_s2_k<splits>_ws``, the ``HB`` constexpr, wgmma's N; candidate step "h32", prepared,
not yet measured on a GPU): V3.2 B=1 as 4 head tiles x 32 one-slot splits instead of 8 x 16 two-slot ones, 230,952 B
of shared memory (q and P^T twice as large), no spills (sm90 cross-compile, CPU).

The dot operand dtype is selectable: "bf16" on a GPU; "fp16" for the Triton interpreter, which
multiplies raw bits for bf16 ``tl.dot`` (DESIGN.md, known traps; fp8 e4m3 converts to fp16 exactly).

File order (STYLE.md): layouts -> autotune config helpers -> @triton.jit kernels -> the Gluon kernel -> launcher ->
quantizer, dequantizer, torch reference -> inputs, flops/bytes, compile specs.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

if TYPE_CHECKING:  # the kernel file imports only torch and triton at run time (DESIGN.md layout)
    from kernelcamp.variant import LaunchConfig, Variant

# --------------------------------------------------------------------------------------------------
# Layouts


@dataclass(frozen=True)
class CacheLayout:
    """One fp8 KV-cache layout. Sizes in values (d_*) and bytes (*_bytes).

    ``fp8_dims`` fp8 values per token, scaled in groups of ``group_size``; ``rope_dims`` bf16 values
    after them; ``d_qk = fp8_dims + rope_dims``; V is the first ``d_v`` latent values.
    ``data_bytes`` is the row stride of the per-token data inside a page; ``scale_row_bytes`` > 0
    means the scales live in separate rows after all data rows of the page (V4).
    """

    name: str
    code: int  # LAYOUT constexpr of the kernel
    d_qk: int
    d_v: int
    fp8_dims: int
    rope_dims: int
    group_size: int
    num_groups: int
    scale_kind: str  # "fp32" (value = fp8 * scale) or "ue8m0" (value = fp8 * 2^(e-127))
    token_bytes: int
    data_bytes: int
    scale_offset: int  # V3.2: byte offset of the fp32 scales inside the token row
    rope_offset: int  # byte offset of the bf16 rope values inside the data row
    scale_row_bytes: int = 0


LAYOUTS: dict[str, CacheLayout] = {
    "deepseek_v32": CacheLayout(
        name="deepseek_v32",
        code=0,
        d_qk=576,
        d_v=512,
        fp8_dims=512,
        rope_dims=64,
        group_size=128,
        num_groups=4,
        scale_kind="fp32",
        token_bytes=656,
        data_bytes=656,
        scale_offset=512,
        rope_offset=528,
    ),
    "deepseek_v4": CacheLayout(
        name="deepseek_v4",
        code=1,
        d_qk=512,
        d_v=512,
        fp8_dims=448,
        rope_dims=64,
        group_size=64,
        num_groups=7,
        scale_kind="ue8m0",
        token_bytes=584,
        data_bytes=576,
        scale_offset=0,
        rope_offset=448,
        scale_row_bytes=8,
    ),
}

FP8_MAX = 448.0  # largest finite float8_e4m3fn
F16_MAX = 65504.0  # largest finite float16 (IEEE 754 binary16)
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453

# num_splits="auto": split the top-k range until the grid has about one program per SM, keeping at
# least AUTO_MIN_TILES BLOCK_T tiles per split and at most AUTO_MAX_SPLITS splits (bounded partial
# buffers). Rule: splits = clamp(num_sms // (B * cdiv(H, BLOCK_H)), 1, min(AUTO_MAX_SPLITS,
# tiles // AUTO_MIN_TILES)). Measured on the H200 (reports/kernel_bench/, commit 971a9ff): V4-Flash
# B=1 T16_H16_w4_s2 with 32 splits (1 tile each) 11.4 us vs 18.9 us with 8 (the old cap of 4 tiles
# per split), so AUTO_MIN_TILES is 1. At B >= 32 the rule gives 1-4 splits (not swept further).
AUTO_MIN_TILES = 1
AUTO_MAX_SPLITS = 32
DEFAULT_NUM_SMS = 132  # H200; used only when no GPU is present (interpreter runs)

# Split-K combine: one program per (b, h) row and column slice of d_v. With at most as many rows as SMs
# (B=1 at H=16, 64 or 128; B=8 at H=16) the rows are also split by column, halving the slice while twice the
# programs still fit COMBINE_PROGRAMS_PER_SM per SM and the slice stays >= COMBINE_MIN_BLOCK_D wide
# (_combine_block_d). H200, 2026-12-01 (reports/campaigns/kernel_speed/candidates_4/ and candidates_5/): the
# combine was 2.6-4.1 us of a B=1 call, and the split at one program per SM cut TP8 B=1 from 12.9 to 11.1 us;
# 2026-12-02 (candidates_8/): two programs per SM cut V3.2 B=1 (128 rows: 256 programs of 256 columns instead
# of 128 of 512) from 17.5 to 16.4 us, four per SM gave 17.0; no other table row moved by more than 1.4%.
COMBINE_SPLIT_D = True
COMBINE_MIN_BLOCK_D = 64
COMBINE_PROGRAMS_PER_SM = 2

# Split-D of the split kernel (V3.2 only): while a launch's grid has at most half as many programs as SMs, the
# programs also split V's 512 columns in two (up to SPLIT_D_MAX parts of 128-column groups): twice the programs,
# each accumulating, and storing, half the output columns (resolve_split_d). At B=1 V3.2 runs 64 programs
# (H=128, BLOCK_H 64, 32 splits) on 132 SMs, and Nsight Compute put 28% of a program's stall samples in storing
# its 128 KB of partial outputs (reports/campaigns/kernel_speed/candidates_10/). Every part computes the same
# scores and softmax. Launches through the autotuner (a config list) keep one part.
SPLIT_D_MAX = 4


def get_layout(layout: str) -> CacheLayout:
    """The ``CacheLayout`` named ``layout``; ``ValueError`` naming the known layouts otherwise."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}: expected one of {sorted(LAYOUTS)}")
    return LAYOUTS[layout]


# --------------------------------------------------------------------------------------------------
# Autotune configs and split choice


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return DEFAULT_NUM_SMS


def resolve_num_splits(
    num_splits: int | str, B: int, H: int, topk: int, BLOCK_H: int, BLOCK_T: int, num_sms: int = DEFAULT_NUM_SMS
) -> int:
    """Splits actually launched for a config's ``num_splits`` (an int, or "auto": see AUTO_* above).

    An explicit value is capped at the number of BLOCK_T tiles. Each split takes ``cdiv(tiles, splits)``
    tiles, so the last splits can still get none (e.g. 5 tiles over 4 splits: 2, 2, 1, 0; 32 tiles over 24:
    8 empty): such a program writes an empty partial (LSE -inf), which the combine weighs 0.
    """
    tiles = max(1, triton.cdiv(topk, BLOCK_T))
    if num_splits == "auto":
        ctas = B * triton.cdiv(H, BLOCK_H)
        cap = max(1, min(AUTO_MAX_SPLITS, tiles // AUTO_MIN_TILES))
        return max(1, min(num_sms // max(ctas, 1), cap))
    return max(1, min(int(num_splits), tiles))


def resolve_split_d(layout_code: int, programs: int, num_sms: int = DEFAULT_NUM_SMS) -> int:
    """Parts of V's columns per (b, head block, split) for a launch of ``programs`` programs (SPLIT_D_MAX above):
    1 for V4 (``layout_code`` 1); for V3.2 doubled while twice the programs still fit ``num_sms`` and the part
    stays at least one 128-column group (at most 4 parts, whatever SPLIT_D_MAX says: the kernel splits V3.2's
    four groups). E.g. 132 SMs: 64 programs -> 2, 32 -> 4, 128 -> 1."""
    parts = 1
    while layout_code == 0 and 2 * parts <= min(SPLIT_D_MAX, 4) and 2 * programs * parts <= num_sms:
        parts *= 2
    return parts


def _launch_grid(
    layout_code: int, config: LaunchConfig, B: int, num_heads: int, topk: int, num_sms: int = DEFAULT_NUM_SMS
) -> tuple[int, int, int]:
    """``(splits, programs before split-D, split-D parts)`` of the split kernel launched for ``config`` at batch
    size ``B``: the one place the launcher, ``compile_specs`` and ``_split_d_batches`` resolve them."""
    n = resolve_num_splits(config.num_splits, B, num_heads, topk, config.BLOCK_H, config.BLOCK_T, num_sms)
    programs = B * triton.cdiv(num_heads, config.BLOCK_H) * n
    return n, programs, resolve_split_d(layout_code, programs, num_sms)


def _split_d_batches(
    layout_code: int,
    config: LaunchConfig,
    num_heads: int,
    topk: int,
    num_sms: int = DEFAULT_NUM_SMS,
    min_batch: int = 1,
) -> dict[int, int]:
    """``{split-D parts: the smallest batch size that launches them}`` over the batch sizes ``min_batch`` to
    ``config.max_batch`` (a table row's range: from the previous row's bound + 1; unbounded without a
    ``max_batch``) on ``num_sms`` SMs: every split-kernel binary the config launches there, one part included
    (V4: only that). The walk stops at the first batch size whose launch fills half the SMs: from there on
    every launch has one part."""
    found: dict[int, int] = {}
    b = max(1, min_batch)
    while b <= (config.max_batch or 1 << 30):
        _, programs, parts = _launch_grid(layout_code, config, b, num_heads, topk, num_sms)
        found.setdefault(parts, b)
        if 2 * programs > num_sms:
            break
        b += 1
    return found


def _splits_code(num_splits: int | str) -> int:
    return 0 if num_splits == "auto" else int(num_splits)


def _triton_config(c: LaunchConfig) -> triton.Config:
    return triton.Config(
        {"BLOCK_T": c.BLOCK_T, "BLOCK_H": c.BLOCK_H, "SPLITS": _splits_code(c.num_splits)},
        num_warps=c.num_warps,
        num_stages=c.num_stages,
    )


# --------------------------------------------------------------------------------------------------
# Kernels


@triton.jit
def _store_rows(out_ptr, part_out_ptr, bh, part, col0, o, mask_h, n_splits, D: tl.constexpr, W: tl.constexpr):
    # one W-wide column slice [col0, col0 + W) of the final (bf16) or partial (fp32) output rows
    offs = col0 + tl.arange(0, W)
    if n_splits == 1:
        tl.store(out_ptr + bh[:, None] * D + offs[None, :], o.to(out_ptr.dtype.element_ty), mask=mask_h[:, None])
    else:
        tl.store(part_out_ptr + part[:, None] * D + offs[None, :], o, mask=mask_h[:, None])


@triton.jit
def _dequant_group(bits, scale, DOT_DTYPE: tl.constexpr):
    # [BLOCK_T, G] uint8 bits of fp8 e4m3 and the [BLOCK_T] fp32 group scale of each token ->
    # fp8 * scale in the dot dtype (exact fp8 -> fp32, one fp32 multiply, one rounding)
    return (bits.to(tl.float8e4nv, bitcast=True).to(tl.float32) * scale[:, None]).to(DOT_DTYPE)


@triton.jit
def _fp8_to_f16(bits):
    # [BLOCK_T, G] uint8 bits of fp8 e4m3 -> fp16, exact (cvt.rn.f16x2.e4m3x2: two values per instruction)
    return bits.to(tl.float8e4nv, bitcast=True).to(tl.float16)


@triton.jit
def _ue8m0(word, k: tl.constexpr):
    # byte k (little-endian) of int32 words of ue8m0 exponents -> fp32 2^(e-127); e = 0 gives 0.0
    return (((word >> (8 * k)) & 255) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _v4_pair(rows, sa, sb, j: tl.constexpr, valid, DOT_DTYPE: tl.constexpr):
    # V4 fp8 groups 2j and 2j + 1 of BLOCK_T rows with their [BLOCK_T] fp32 scales sa, sb -> [BLOCK_T, 128] dot
    # dtype; exact in bf16 (a power-of-two scale changes only the exponent)
    offs = tl.arange(0, 128)
    bits = tl.load(rows + j * 128 + offs[None, :], mask=valid[:, None], other=0)
    scale = tl.where(offs[None, :] < 64, sa[:, None], sb[:, None])
    return (bits.to(tl.float8e4nv, bitcast=True).to(tl.float32) * scale).to(DOT_DTYPE)


@triton.jit
def _pv_group(p, alpha, acc, rows, sc_ptr, g0, j: tl.constexpr, valid, BLOCK_H: tl.constexpr, DOT_DTYPE: tl.constexpr):
    # a V3.2 split-D part's P.V for its fp8 group g0 + j (128 values; rows: [BLOCK_T, 128] byte pointers of group 0,
    # sc_ptr: [BLOCK_T] pointers of the group scales): its own load of the group's bytes and scales (a second
    # load of what the QK tiles loaded: L1/L2 hits), then acc * alpha + P.V; at BLOCK_H < 64 (mma v2) the fp8
    # values enter the dot as exact fp16 with the scale on P, else dequantized with it
    bits = tl.load(rows + (g0 + j) * 128, mask=valid[:, None], other=0, eviction_policy="evict_last")
    scale = tl.load(sc_ptr + g0 + j, mask=valid, other=0.0, eviction_policy="evict_last")
    if BLOCK_H < 64:
        return tl.dot((p * scale[None, :]).to(tl.float16), _fp8_to_f16(bits), acc * alpha[:, None])
    else:
        return tl.dot(p.to(DOT_DTYPE), _dequant_group(bits, scale, DOT_DTYPE), acc * alpha[:, None])


# Sizes are not specialized (B == 1, max_splits == 1 would each compile another binary): one binary per
# config, layout and split-D part count (resolve_split_d; at most three, the small batch sizes' only) keeps
# warm-up short; compile_specs(..., all_split_d=True) names each one the config can launch, for the inspector.
@triton.jit(do_not_specialize=["B", "H", "topk", "max_splits"])
def _sparse_mla_split_kernel(
    # pointers
    q_ptr,
    kv_u8_ptr,
    kv_bf16_ptr,
    kv_f32_ptr,
    idx_ptr,
    out_ptr,
    lse_ptr,
    part_out_ptr,
    part_lse_ptr,
    # sizes
    B,
    H,
    topk,
    max_splits,
    sm_scale_log2,
    # strides (elements)
    stride_qb,
    stride_qh,
    stride_ib,
    # meta-parameters
    LAYOUT: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
    SPLITS: tl.constexpr,
    SPLIT_D: tl.constexpr,
):
    # SPLITS is the requested split count (0 = auto); the launched count is the grid's third axis. SPLIT_D > 1
    # (V3.2 only, resolve_split_d): the grid's second axis also splits V's 512 columns into SPLIT_D parts, and
    # a program accumulates and stores only its part (every part computes the same scores, softmax and LSE).
    pid_b = tl.program_id(0)
    if SPLIT_D == 1:
        pid_h = tl.program_id(1)
    else:
        pid_h = tl.program_id(1) // SPLIT_D
        pid_d = tl.program_id(1) % SPLIT_D
    pid_s = tl.program_id(2)
    n_splits = tl.num_programs(2)

    offs_h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < H
    q_row_ptrs = q_ptr + pid_b.to(tl.int64) * stride_qb + offs_h[:, None] * stride_qh
    # Both layouts (LAYOUT 0: V3.2, 1: V4) in one loop, in column tiles: every
    # tile is dequantized into its own dot-dtype [BLOCK_T, width] tile, the QK dots of all tiles chain into
    # one score accumulator, and one P feeds one [BLOCK_H, width] output accumulator per tile of V.
    #   V3.2: four 128-wide fp8 groups, each times its fp32 scale (_dequant_group), acc0-acc3; the 64 bf16
    #         rope values take part in QK only.
    #   V4:   three 128-wide tiles of two 64-value fp8 groups (each half times its ue8m0 scale, _v4_pair),
    #         the seventh fp8 group and the 64 rope values as two 64-wide tiles; V is all five, acc0-acc4.
    # Column tiles, not one 512-wide tile: at BLOCK_H <= 32 (mma v2) the 512-wide tile's loop was 1629
    # SASS instructions against 1227 (V3.2 T64_H16_w8, compile-time figures, benchmarks/KERNEL_TUNING.md).
    # V3.2 at BLOCK_H < 64 (mma v2) takes its fp8 groups as exact fp16 with the scales on the results, and a
    # second load of the groups for P.V (module docstring); V4 keeps one load and the bf16 dequantization.
    G: tl.constexpr = 128
    E: tl.constexpr = 64
    offs_g = tl.arange(0, G)
    offs_e = tl.arange(0, E)
    if LAYOUT == 0:
        PAGE_BYTES: tl.constexpr = PAGE_SIZE * 656
        if BLOCK_H < 64:
            QG_DTYPE: tl.constexpr = tl.float16  # mma v2: fp8 groups as exact fp16, scales on scores and P
        else:
            QG_DTYPE: tl.constexpr = DOT_DTYPE
        q0 = tl.load(q_row_ptrs + offs_g[None, :], mask=mask_h[:, None], other=0.0).to(QG_DTYPE)
        q1 = tl.load(q_row_ptrs + G + offs_g[None, :], mask=mask_h[:, None], other=0.0).to(QG_DTYPE)
        q2 = tl.load(q_row_ptrs + 2 * G + offs_g[None, :], mask=mask_h[:, None], other=0.0).to(QG_DTYPE)
        q3 = tl.load(q_row_ptrs + 3 * G + offs_g[None, :], mask=mask_h[:, None], other=0.0).to(QG_DTYPE)
        q_rope = tl.load(q_row_ptrs + 4 * G + offs_e[None, :], mask=mask_h[:, None], other=0.0).to(DOT_DTYPE)
    else:
        PAGE_BYTES: tl.constexpr = PAGE_SIZE * 584
        q0 = tl.load(q_row_ptrs + offs_g[None, :], mask=mask_h[:, None], other=0.0).to(DOT_DTYPE)
        q1 = tl.load(q_row_ptrs + G + offs_g[None, :], mask=mask_h[:, None], other=0.0).to(DOT_DTYPE)
        q2 = tl.load(q_row_ptrs + 2 * G + offs_g[None, :], mask=mask_h[:, None], other=0.0).to(DOT_DTYPE)
        q3 = tl.load(q_row_ptrs + 3 * G + offs_e[None, :], mask=mask_h[:, None], other=0.0).to(DOT_DTYPE)
        q4 = tl.load(q_row_ptrs + 3 * G + E + offs_e[None, :], mask=mask_h[:, None], other=0.0).to(DOT_DTYPE)

    tiles_per_split = tl.cdiv(tl.cdiv(topk, BLOCK_T), n_splits)
    t_start = pid_s * tiles_per_split * BLOCK_T
    t_end = tl.minimum(t_start + tiles_per_split * BLOCK_T, topk)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc0 = tl.zeros([BLOCK_H, G], tl.float32)
    acc1 = tl.zeros([BLOCK_H, G], tl.float32)
    acc2 = tl.zeros([BLOCK_H, G], tl.float32)
    if LAYOUT == 0:
        acc3 = tl.zeros([BLOCK_H, G], tl.float32)
    else:
        acc3 = tl.zeros([BLOCK_H, E], tl.float32)
        acc4 = tl.zeros([BLOCK_H, E], tl.float32)
    for t0 in range(t_start, t_end, BLOCK_T):
        offs_t = t0 + tl.arange(0, BLOCK_T)
        idx = tl.load(idx_ptr + pid_b.to(tl.int64) * stride_ib + offs_t, mask=offs_t < t_end, other=-1)
        valid = idx >= 0
        tok = tl.where(valid, idx, 0).to(tl.int64)
        if LAYOUT == 0:
            row_base = tl.multiple_of((tok // PAGE_SIZE) * PAGE_BYTES + (tok % PAGE_SIZE) * 656, 16)
            rows = kv_u8_ptr + row_base[:, None] + offs_g[None, :]
            sc_ptr = kv_f32_ptr + (row_base + 512) // 4
            sc0 = tl.load(sc_ptr, mask=valid, other=0.0)
            sc1 = tl.load(sc_ptr + 1, mask=valid, other=0.0)
            sc2 = tl.load(sc_ptr + 2, mask=valid, other=0.0)
            sc3 = tl.load(sc_ptr + 3, mask=valid, other=0.0)
            k_rope = tl.load(
                kv_bf16_ptr + (row_base[:, None] + 528) // 2 + offs_e[None, :], mask=valid[:, None], other=0.0
            ).to(DOT_DTYPE)
            if BLOCK_H < 64:
                # mma v2: each group's fp8 values as fp16 (exact, one conversion per two values), its dot
                # with the fp16 q group scaled per token afterwards: s = q_rope.k_rope + sum_g sc_g * (q_g.k8_g)
                k0 = _fp8_to_f16(tl.load(rows, mask=valid[:, None], other=0))
                k1 = _fp8_to_f16(tl.load(rows + G, mask=valid[:, None], other=0))
                k2 = _fp8_to_f16(tl.load(rows + 2 * G, mask=valid[:, None], other=0))
                k3 = _fp8_to_f16(tl.load(rows + 3 * G, mask=valid[:, None], other=0))
                qk = tl.dot(q_rope, tl.trans(k_rope))
                qk += tl.dot(q0, tl.trans(k0)) * sc0[None, :]
                qk += tl.dot(q1, tl.trans(k1)) * sc1[None, :]
                qk += tl.dot(q2, tl.trans(k2)) * sc2[None, :]
                qk += tl.dot(q3, tl.trans(k3)) * sc3[None, :]
            else:
                k0 = _dequant_group(tl.load(rows, mask=valid[:, None], other=0), sc0, DOT_DTYPE)
                k1 = _dequant_group(tl.load(rows + G, mask=valid[:, None], other=0), sc1, DOT_DTYPE)
                k2 = _dequant_group(tl.load(rows + 2 * G, mask=valid[:, None], other=0), sc2, DOT_DTYPE)
                k3 = _dequant_group(tl.load(rows + 3 * G, mask=valid[:, None], other=0), sc3, DOT_DTYPE)
                # one accumulator chain: the group scales are already in k0..k3
                qk = tl.dot(q_rope, tl.trans(k_rope))
                qk = tl.dot(q0, tl.trans(k0), qk)
                qk = tl.dot(q1, tl.trans(k1), qk)
                qk = tl.dot(q2, tl.trans(k2), qk)
                qk = tl.dot(q3, tl.trans(k3), qk)
        else:
            page_base = (tok // PAGE_SIZE) * PAGE_BYTES
            row = tok % PAGE_SIZE
            if PAGE_SIZE % 2 == 0:
                row_base = tl.multiple_of(page_base + row * 576, 16)
            else:  # a page of 584-byte tokens is 8 bytes off a 16-byte boundary after an odd page
                row_base = tl.multiple_of(page_base + row * 576, 8)
            rows = kv_u8_ptr + row_base[:, None]
            # the row's 8 scale bytes as two int32 words (4-byte loads: cp.async-able, where byte loads were not)
            sw_ptrs = kv_f32_ptr + (page_base + PAGE_SIZE * 576 + row * 8) // 4
            w0 = tl.load(sw_ptrs, mask=valid, other=0.0).to(tl.int32, bitcast=True)
            w1 = tl.load(sw_ptrs + 1, mask=valid, other=0.0).to(tl.int32, bitcast=True)
            k0 = _v4_pair(rows, _ue8m0(w0, 0), _ue8m0(w0, 1), 0, valid, DOT_DTYPE)
            k1 = _v4_pair(rows, _ue8m0(w0, 2), _ue8m0(w0, 3), 1, valid, DOT_DTYPE)
            k2 = _v4_pair(rows, _ue8m0(w1, 0), _ue8m0(w1, 1), 2, valid, DOT_DTYPE)
            b6 = tl.load(rows + 3 * G + offs_e[None, :], mask=valid[:, None], other=0)
            k3 = (b6.to(tl.float8e4nv, bitcast=True).to(tl.float32) * _ue8m0(w1, 2)[:, None]).to(DOT_DTYPE)
            k4 = tl.load(kv_bf16_ptr + (row_base[:, None] + 448) // 2 + offs_e[None, :], mask=valid[:, None], other=0.0)
            k4 = k4.to(DOT_DTYPE)
            qk = tl.dot(q4, tl.trans(k4))
            qk = tl.dot(q0, tl.trans(k0), qk)
            qk = tl.dot(q1, tl.trans(k1), qk)
            qk = tl.dot(q2, tl.trans(k2), qk)
            qk = tl.dot(q3, tl.trans(k3), qk)
        s = tl.where(valid[None, :], qk * sm_scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # all masked so far: keep p = 0, no NaN
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if LAYOUT == 0 and SPLIT_D > 1:
            # this program's 4 / SPLIT_D groups of V on their own loads (a second load of the same bytes, L1/L2
            # hits, as at BLOCK_H < 64 below) and their own scale loads: group pid_d * NV + j into acc_j
            NV: tl.constexpr = 4 // SPLIT_D
            g0 = pid_d * NV
            acc0 = _pv_group(p, alpha, acc0, rows, sc_ptr, g0, 0, valid, BLOCK_H, DOT_DTYPE)
            if NV == 2:
                acc1 = _pv_group(p, alpha, acc1, rows, sc_ptr, g0, 1, valid, BLOCK_H, DOT_DTYPE)
        elif LAYOUT == 0 and BLOCK_H < 64:
            # P.V on its own load of the fp8 bytes (a second load of the same bytes, L1/L2 hits). One register
            # tile feeding both dots needs two dot-operand layouts, and Triton's pipeliner (AssignLatencies.cpp,
            # canHaveSharedEncoding) then leaves the load out: the fp8 gathers were synchronous LDGs, the top
            # stall of TP8 at B=128 in Nsight Compute. With one dot per load both copies become cp.async
            # (LDGSTS) prefetched num_stages - 1 tiles ahead. The eviction hint differs from the first load's
            # only so that CSE cannot merge the two. The group scale is folded into P: out_g += (p * sc_g).k8_g
            v0 = _fp8_to_f16(tl.load(rows, mask=valid[:, None], other=0, eviction_policy="evict_last"))
            v1 = _fp8_to_f16(tl.load(rows + G, mask=valid[:, None], other=0, eviction_policy="evict_last"))
            v2 = _fp8_to_f16(tl.load(rows + 2 * G, mask=valid[:, None], other=0, eviction_policy="evict_last"))
            v3 = _fp8_to_f16(tl.load(rows + 3 * G, mask=valid[:, None], other=0, eviction_policy="evict_last"))
            acc0 = tl.dot((p * sc0[None, :]).to(tl.float16), v0, acc0 * alpha[:, None])
            acc1 = tl.dot((p * sc1[None, :]).to(tl.float16), v1, acc1 * alpha[:, None])
            acc2 = tl.dot((p * sc2[None, :]).to(tl.float16), v2, acc2 * alpha[:, None])
            acc3 = tl.dot((p * sc3[None, :]).to(tl.float16), v3, acc3 * alpha[:, None])
        else:
            pb = p.to(DOT_DTYPE)
            acc0 = tl.dot(pb, k0, acc0 * alpha[:, None])
            acc1 = tl.dot(pb, k1, acc1 * alpha[:, None])
            acc2 = tl.dot(pb, k2, acc2 * alpha[:, None])
            acc3 = tl.dot(pb, k3, acc3 * alpha[:, None])
            if LAYOUT == 1:
                acc4 = tl.dot(pb, k4, acc4 * alpha[:, None])
        m_i = m_new

    has = l_i > 0.0
    inv_l = 1.0 / tl.where(has, l_i, 1.0)
    lse2 = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    bh = pid_b.to(tl.int64) * H + offs_h
    part = bh * max_splits + pid_s
    if LAYOUT == 0 and SPLIT_D > 1:
        # this program's columns of the rows; part 0 stores the LSE that every part computed alike
        NVG: tl.constexpr = (4 // SPLIT_D) * G
        c0 = pid_d * NVG
        _store_rows(out_ptr, part_out_ptr, bh, part, c0, acc0 * inv_l[:, None], mask_h, n_splits, 512, G)
        if SPLIT_D == 2:
            _store_rows(out_ptr, part_out_ptr, bh, part, c0 + G, acc1 * inv_l[:, None], mask_h, n_splits, 512, G)
        mask_lse = mask_h & (pid_d == 0)
    else:
        _store_rows(out_ptr, part_out_ptr, bh, part, 0, acc0 * inv_l[:, None], mask_h, n_splits, 512, G)
        _store_rows(out_ptr, part_out_ptr, bh, part, G, acc1 * inv_l[:, None], mask_h, n_splits, 512, G)
        _store_rows(out_ptr, part_out_ptr, bh, part, 2 * G, acc2 * inv_l[:, None], mask_h, n_splits, 512, G)
        if LAYOUT == 0:
            _store_rows(out_ptr, part_out_ptr, bh, part, 3 * G, acc3 * inv_l[:, None], mask_h, n_splits, 512, G)
        else:
            _store_rows(out_ptr, part_out_ptr, bh, part, 3 * G, acc3 * inv_l[:, None], mask_h, n_splits, 512, E)
            _store_rows(out_ptr, part_out_ptr, bh, part, 3 * G + E, acc4 * inv_l[:, None], mask_h, n_splits, 512, E)
        mask_lse = mask_h
    if n_splits == 1:
        tl.store(lse_ptr + bh, lse2 * 0.6931471805599453, mask=mask_lse)
    else:
        tl.store(part_lse_ptr + part, lse2, mask=mask_lse)


@triton.jit
def _sparse_mla_combine_kernel(
    # pointers
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    lse_ptr,
    # sizes
    n_splits,
    max_splits,
    # meta-parameters
    D_V: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # one program per (b, h) row and BLOCK_D-wide column slice: merge the partial outputs by their
    # base-2 LSEs (each slice recomputes the row's weights; slice 0 stores the LSE)
    bh = tl.program_id(0).to(tl.int64)
    pid_d = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_s = offs_s < n_splits
    lse_s = tl.load(part_lse_ptr + bh * max_splits + offs_s, mask=mask_s, other=float("-inf"))
    lse_max = tl.max(lse_s, 0)
    lse_safe = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    w = tl.exp2(lse_s - lse_safe)
    w_sum = tl.sum(w, 0)
    o_s = tl.load(
        part_out_ptr + (bh * max_splits + offs_s)[:, None] * D_V + offs_d[None, :], mask=mask_s[:, None], other=0.0
    )
    acc = tl.sum(o_s * w[:, None], 0)
    has = w_sum > 0.0
    o = acc / tl.where(has, w_sum, 1.0)
    tl.store(out_ptr + bh * D_V + offs_d, o.to(out_ptr.dtype.element_ty))
    if pid_d == 0:
        lse = tl.where(has, (lse_safe + tl.log2(tl.where(has, w_sum, 1.0))) * 0.6931471805599453, float("-inf"))
        tl.store(lse_ptr + bh, lse)


# --------------------------------------------------------------------------------------------------
# Warp-specialized split kernel, V3.2 and V4 (Gluon, sm90): a config with warp_specialize runs it (module docstring).
# Its partitions take their arguments as four tuples, and V4's a fifth, qargs = (q_ptr, stride_qb, stride_qh) (Gluon
# passes a worker only values and shared-memory descriptors, no constexprs: the tile sizes are the module constants
# WS_*, the page size a run-time log2, page_shift, and the layout and a consumer's or producer's half are fixed by thin
# wrappers, _ws_producer_v32 / _v4, _ws_consumer_lo / _hi / _lo_v4 / _hi_v4 and the H=16 kernel's _ws16_producer_0 /
# _1):
#   ptrs = (kv_u8_ptr, kv_bf16_ptr, kv_f32_ptr, idx_ptr, out_ptr, lse_ptr, part_out_ptr, part_lse_ptr)
#   smem = (q_lo, q_hi, q_rope, k_lo, k_hi, k_rope, st_lo, st_hi, st_rope, st_sc, s_x)
#   bars = (k_ready, k_empty, s_bar)
#   ints = (pid_b, pid_h, pid_s, n_splits, H, max_splits, stride_ib, page_shift, t_start, t_end, n_tiles)

WS_BLOCK_T = gl.constexpr(32)  # tokens per tile
WS_BLOCK_H = gl.constexpr(64)  # heads per program (one wgmma M)
WS_NBUF = gl.constexpr(2)  # depth of the K-tile ring (bf16, wgmma-ready)
WS_NSTAGE = gl.constexpr(2)  # depth of the cp.async staging ring (raw fp8 rows): LaunchConfig.num_stages
# V4 may run a third staging slot (num_stages 3: 226,424 B of shared memory); V3.2's would need 243,576 B
# (a V3.2 slot is 32 tokens x 656 B = 20,992 B)
WS_NSTAGES = {"deepseek_v32": (2,), "deepseek_v4": (2, 3)}
# the H=16 kernel (_sparse_mla_ws16_split_kernel, V3.2 only: DeepSeek-V3.2 at TP8): wgmma's M is 64 rows, so its
# consumer swaps the operands and puts tokens on M: S^T [64 tokens, 16 heads] = K q^T, O^T [d_v, 16] = V^T P^T. A
# ring slot holds two producer tiles (WS16_BLOCK_T = 2 x WS_BLOCK_T tokens), one from each of its two producers
# (_ws16_producer, step "p2")
WS16_BLOCK_T = gl.constexpr(64)
WS16_BLOCK_H = gl.constexpr(16)
# the head tiles the kernel runs: 16 (TP8), or 32 for V3.2's smallest batches (candidate "h32": B=1 as 4 head
# tiles x 32 one-slot splits instead of 8 x 16 two-slot ones), wgmma's N; a head tile is the kernel's HB constexpr
WS16_HEADS = (16, 32)
WS_NUM_WARPS = 12  # three warpgroups: LaunchConfig.num_warps (the H=64 kernel two consumers + one producer, the
# H=16 kernel one consumer + two producers)
# registers: 12 warps x 32 threads x maxnreg 168 = 64,512 of the SM's 65,536; setmaxnreg gives the H=64 kernel's
# consumer worker WS_REGS_CONSUMER and its producer WS_REGS_PRODUCER, the default partition (a consumer) the rest,
# 3 x 168 - 192 - 120 = 192; the H=16 kernel's two producers WS_REGS_PRODUCER each, its consumer (the default
# partition) 3 x 168 - 2 x 120 = 264, capped at setmaxnreg's largest, 256. With 208 / 88 the H=64 kernel's producer
# spilled and V3.2 B=128 took 361.7 against 316.9 us (H200, reports/campaigns/kernel_speed/candidates_14/).
WS_MAXNREG = 168
WS_REGS_CONSUMER = gl.constexpr(192)
WS_REGS_PRODUCER = gl.constexpr(120)
# the producer warpgroup's register layouts: [T, 256] fp8 bytes (16 B a thread), [T, 64] bf16 rope, [T, 4] fp32
# scales (V3.2), [T, 2] scale words (V4)
WS_GAT = gl.constexpr(gl.BlockedLayout([1, 16], [2, 16], [4, 1], [1, 0]))
WS_ROPE = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0]))
# a warpgroup's [R, C] 16-bit rows, 8 values (16 B) a thread, whole rows a warp: the q loads and ostage's output
# stores (the same layout as WS_ROPE); WS_SMEM16: the 128-byte-swizzled shared layout of wgmma's bf16 operands
WS_ROWS16 = WS_ROPE
WS_SMEM16 = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2))
WS_SCALE4 = gl.constexpr(gl.BlockedLayout([1, 4], [32, 1], [4, 1], [1, 0]))
WS_SCALE2 = gl.constexpr(gl.BlockedLayout([1, 2], [32, 1], [4, 1], [1, 0]))
# the same scales read back from shared memory for the dequantization, each row's in the threads that hold its fp8
# bytes (WS_GAT's rows: 2 a warp, 16 threads a row): a row's scale then reaches WS_GAT's row slice with no exchange
# (step "sload": the exchanges through shared memory had cost the producer's loop 3 of its 7 barriers a tile on V4
# and 7 of 10 on V3.2)
WS_SCALE4_ROWS = gl.constexpr(gl.BlockedLayout([1, 4], [2, 16], [4, 1], [1, 0]))
WS_SCALE2_ROWS = gl.constexpr(gl.BlockedLayout([1, 2], [2, 16], [4, 1], [1, 0]))


@gluon.jit
def _ws_tile_idx(idx_ptr, ints, tile, layout: gl.constexpr):
    # tile `tile`'s WS_BLOCK_T top-k indices in SliceLayout(1, layout); -1 past t_end and for tile >= n_tiles
    pid_b, pid_h, pid_s, n_splits, H, max_splits, stride_ib, page_shift, t_start, t_end, n_tiles = ints
    offs_t = t_start + tile * WS_BLOCK_T + gl.arange(0, WS_BLOCK_T, layout=gl.SliceLayout(1, layout))
    ok = (offs_t < t_end) & (tile < n_tiles)
    return gl.load(idx_ptr + pid_b.to(gl.int64) * stride_ib + offs_t, mask=ok, other=-1)


@gluon.jit
def _ws_row_base(idx, page_shift, extra: gl.constexpr, LAYOUT: gl.constexpr):
    # byte offset of each token's data row (+ extra) in the paged cache of 2^page_shift tokens a page (shifts:
    # a division by a run-time page size cost the producer spills); 0 for an empty slot. V3.2: 656-byte rows;
    # V4: 576-byte data rows in pages of 584-byte tokens. The terms are written so that Triton's alignment analysis
    # proves each row 16-byte aligned (656 = 16 * 41, 576 = 16 * 36, and a V4 page 1168 = 16 * 73 bytes a token pair,
    # page_shift >= 1): the cp.async gathers are then 16-byte copies (a V4 page term of 584 << page_shift gave 8)
    tok = gl.where(idx >= 0, idx, 0).to(gl.int64)
    page = tok >> page_shift
    if LAYOUT == 0:
        base = page * (656 << page_shift) + (tok - (page << page_shift)) * 656 + extra
    else:
        base = page * (1168 << (page_shift - 1)) + (tok - (page << page_shift)) * 576 + extra
    return gl.multiple_of(base, 16)


@gluon.jit
def _ws_v4_scale_base(idx, page_shift):
    # byte offset of each V4 token's 8-byte scale row, after the page's 2^page_shift data rows; 0 for an empty slot
    tok = gl.where(idx >= 0, idx, 0).to(gl.int64)
    page = tok >> page_shift
    return page * (1168 << (page_shift - 1)) + (576 << page_shift) + (tok - (page << page_shift)) * 8


@gluon.jit
def _ws_issue_gather(ptrs, smem, page_shift, idx_g, idx_r, idx_s, stage, LAYOUT: gl.constexpr):
    # cp.async of one tile's rows into staging slot `stage` (its indices in the WS_GAT, WS_ROPE and WS_SCALE4 /
    # WS_SCALE2 layouts; an index of -1 copies nothing and leaves zeros), one commit group. Both layouts stage data
    # bytes 0-255 and 256-511 (V4: its fp8 groups 4-6 and the first 64 rope bytes, which the dequantization
    # leaves), the 64 bf16 rope values and the scales (V3.2: four fp32; V4: its 8-byte scale row as two words)
    kv_u8_ptr, kv_bf16_ptr, kv_f32_ptr, idx_ptr, out_ptr, lse_ptr, part_out_ptr, part_lse_ptr = ptrs
    q_lo, q_hi, q_rope, k_lo, k_hi, k_rope, st_lo, st_hi, st_rope, st_sc, s_x = smem
    offs_c = gl.arange(0, 256, layout=gl.SliceLayout(0, WS_GAT))
    ptr = kv_u8_ptr + _ws_row_base(idx_g, page_shift, 0, LAYOUT)[:, None] + offs_c[None, :]
    async_copy.async_copy_global_to_shared(st_lo.index(stage), ptr, mask=(idx_g >= 0)[:, None])
    async_copy.async_copy_global_to_shared(st_hi.index(stage), ptr + 256, mask=(idx_g >= 0)[:, None])
    offs_e = gl.arange(0, 64, layout=gl.SliceLayout(0, WS_ROPE))
    rope_at: gl.constexpr = 528 if LAYOUT == 0 else 448  # the rope's byte offset in the data row
    rope_ptr = kv_bf16_ptr + _ws_row_base(idx_r, page_shift, rope_at, LAYOUT)[:, None] // 2 + offs_e[None, :]
    async_copy.async_copy_global_to_shared(st_rope.index(stage), rope_ptr, mask=(idx_r >= 0)[:, None])
    if LAYOUT == 0:
        offs_4 = gl.arange(0, 4, layout=gl.SliceLayout(0, WS_SCALE4))
        sc_ptr = kv_f32_ptr + _ws_row_base(idx_s, page_shift, 512, LAYOUT)[:, None] // 4 + offs_4[None, :]
    else:
        offs_2 = gl.arange(0, 2, layout=gl.SliceLayout(0, WS_SCALE2))
        sc_ptr = kv_f32_ptr + _ws_v4_scale_base(idx_s, page_shift)[:, None] // 4 + offs_2[None, :]
    async_copy.async_copy_global_to_shared(st_sc.index(stage), sc_ptr, mask=(idx_s >= 0)[:, None])
    async_copy.commit_group()


@gluon.jit
def _ws_dequant_half(bits, sc, g: gl.constexpr):
    # V3.2: [T, 256] fp8 bytes of groups g and g + 1 (WS_GAT) and the [T, 4] fp32 group scales (WS_SCALE4_ROWS) ->
    # [T, 256] bf16, value = fp8 * scale (exact fp8 -> fp32, one multiply, one rounding, as _dequant_group)
    offs_4 = gl.arange(0, 4, layout=gl.SliceLayout(0, WS_SCALE4_ROWS))
    sa = gl.convert_layout(gl.sum(gl.where(offs_4[None, :] == g, sc, 0.0), axis=1), gl.SliceLayout(1, WS_GAT))
    sb = gl.convert_layout(gl.sum(gl.where(offs_4[None, :] == g + 1, sc, 0.0), axis=1), gl.SliceLayout(1, WS_GAT))
    offs_c = gl.arange(0, 256, layout=gl.SliceLayout(0, WS_GAT))
    scale = gl.where(offs_c[None, :] < 128, sa[:, None], sb[:, None])
    return (bits.to(gl.float8e4nv, bitcast=True).to(gl.float32) * scale).to(gl.bfloat16)


@gluon.jit
def _ws_dequant_v4(bits, sc, w: gl.constexpr):
    # V4: [T, 256] fp8 bytes of groups 4w ... 4w + 3 (WS_GAT) and the [T, 2] scale words (WS_SCALE2_ROWS, fp32 bits of
    # four ue8m0 exponents each, little-endian) -> [T, 256] bf16, value = fp8 * 2^(e - 127), exact (a power-of-two
    # scale moves only the exponent); e = 0 gives 0 (as _ue8m0). Word 1's fourth byte is the pad: its columns
    # (192-255 of w = 1) are rope bytes, left to the caller
    offs_2 = gl.arange(0, 2, layout=gl.SliceLayout(0, WS_SCALE2_ROWS))
    words = gl.sum(gl.where(offs_2[None, :] == w, sc.to(gl.int32, bitcast=True), 0), axis=1)
    words = gl.convert_layout(words, gl.SliceLayout(1, WS_GAT))
    offs_c = gl.arange(0, 256, layout=gl.SliceLayout(0, WS_GAT))
    e = (words[:, None] >> (8 * (offs_c // 64))[None, :]) & 255
    scale = (e << 23).to(gl.float32, bitcast=True)
    return (bits.to(gl.float8e4nv, bitcast=True).to(gl.float32) * scale).to(gl.bfloat16)


@gluon.jit
def _ws_scale_idx(idx_ptr, ints, tile, LAYOUT: gl.constexpr):
    # tile `tile`'s indices in the scale gather's layout (V3.2: [T, 4] fp32 scales; V4: [T, 2] words)
    if LAYOUT == 0:
        return _ws_tile_idx(idx_ptr, ints, tile, WS_SCALE4)
    else:
        return _ws_tile_idx(idx_ptr, ints, tile, WS_SCALE2)


@gluon.jit
def _ws_producer(ptrs, smem, bars, ints, sm_scale_log2, LAYOUT: gl.constexpr):
    # the producer warpgroup: gathers (NSTAGE - 1 tiles ahead, their indices one more iteration ahead) and
    # the dequantization of each tile into the K-tile ring, signalled on k_ready once the ring slot is free
    kv_u8_ptr, kv_bf16_ptr, kv_f32_ptr, idx_ptr, out_ptr, lse_ptr, part_out_ptr, part_lse_ptr = ptrs
    q_lo, q_hi, q_rope, k_lo, k_hi, k_rope, st_lo, st_hi, st_rope, st_sc, s_x = smem
    k_ready, k_empty, s_bar = bars
    pid_b, pid_h, pid_s, n_splits, H, max_splits, stride_ib, page_shift, t_start, t_end, n_tiles = ints
    NSTAGE: gl.constexpr = st_lo.shape[0]  # the staging ring's depth (the config's num_stages)
    for j in gl.static_range(NSTAGE - 1):
        ig = _ws_tile_idx(idx_ptr, ints, j, WS_GAT)
        ir = _ws_tile_idx(idx_ptr, ints, j, WS_ROPE)
        isc = _ws_scale_idx(idx_ptr, ints, j, LAYOUT)
        _ws_issue_gather(ptrs, smem, page_shift, ig, ir, isc, j, LAYOUT)
    # the indices of the next tile to gather, loaded an iteration early: off the issue path (Nsight Compute had
    # the producer waiting on them when they were loaded just before the copies they address)
    ig = _ws_tile_idx(idx_ptr, ints, NSTAGE - 1, WS_GAT)
    ir = _ws_tile_idx(idx_ptr, ints, NSTAGE - 1, WS_ROPE)
    isc = _ws_scale_idx(idx_ptr, ints, NSTAGE - 1, LAYOUT)
    for i in range(n_tiles):
        _ws_issue_gather(ptrs, smem, page_shift, ig, ir, isc, (i + NSTAGE - 1) % NSTAGE, LAYOUT)
        ig = _ws_tile_idx(idx_ptr, ints, i + NSTAGE, WS_GAT)
        ir = _ws_tile_idx(idx_ptr, ints, i + NSTAGE, WS_ROPE)
        isc = _ws_scale_idx(idx_ptr, ints, i + NSTAGE, LAYOUT)
        async_copy.wait_group(NSTAGE - 1)
        gl.thread_barrier()  # every producer thread's copies of tile i have landed
        stage = i % NSTAGE
        slot = i % WS_NBUF
        if LAYOUT == 0:
            sc = st_sc.index(stage).load(WS_SCALE4_ROWS)
            lo = _ws_dequant_half(st_lo.index(stage).load(WS_GAT), sc, 0)
            hi = _ws_dequant_half(st_hi.index(stage).load(WS_GAT), sc, 2)
            rope = st_rope.index(stage).load(WS_ROPE)
            mbarrier.wait(k_empty.index(slot), ((i // WS_NBUF) & 1) ^ 1)
            k_lo.index(slot).store(lo)
            k_hi.index(slot).store(hi)
            k_rope.index(slot).store(rope)
        else:
            # V4's K tile: dims 0-255 (groups 0-3) and 256-511 (groups 4-6, then the rope in columns 192-255,
            # written over the rope bytes the dequantization decoded there: after a barrier, as other threads
            # stored those)
            sc = st_sc.index(stage).load(WS_SCALE2_ROWS)
            lo = _ws_dequant_v4(st_lo.index(stage).load(WS_GAT), sc, 0)
            hi = _ws_dequant_v4(st_hi.index(stage).load(WS_GAT), sc, 1)
            rope = st_rope.index(stage).load(WS_ROPE)
            mbarrier.wait(k_empty.index(slot), ((i // WS_NBUF) & 1) ^ 1)
            k_lo.index(slot).store(lo)
            k_hi.index(slot).store(hi)
            gl.thread_barrier()
            k_hi.index(slot).slice(192, 64, dim=1).store(rope)
        fence_async_shared()  # the generic-proxy stores before the consumers' wgmma (async proxy) reads
        gl.thread_barrier()  # all stores (and reads of this staging slot) done before the one-thread arrive
        mbarrier.arrive(k_ready.index(slot), count=1)


@gluon.jit
def _ws_producer_v32(ptrs, smem, bars, ints, sm_scale_log2):
    _ws_producer(ptrs, smem, bars, ints, sm_scale_log2, 0)


@gluon.jit
def _ws_producer_v4(ptrs, smem, bars, ints, sm_scale_log2, qargs):
    _ws_producer(ptrs, smem, bars, ints, sm_scale_log2, 1)


@gluon.jit
def _ws16_producer(ptrs, smem, bars, ints, sm_scale_log2, HALF: gl.constexpr):
    # one of the H=16 kernel's two producer warpgroups (_sparse_mla_ws16_split_kernel; step "p2"): V3.2's tiles,
    # gathered, dequantized and stored as _ws_producer's, this producer's being tiles 2j + HALF, the rows
    # HALF * 32 ... + 31 of ring slot j (a slot is wgmma's M of 64 tokens: one tile of each producer). It waits for the
    # slot, stores its half and arrives on k_ready, which counts both producers. Its own staging slot HALF holds one
    # tile: the staged bytes are read into registers and the slot refilled with the producer's next tile before it
    # dequantizes (one gather in flight while it works, two for the pair). A tile past n_tiles has -1 indices: its
    # gathers copy nothing and it stores zeros, masked by the consumer
    kv_u8_ptr, kv_bf16_ptr, kv_f32_ptr, idx_ptr, out_ptr, lse_ptr, part_out_ptr, part_lse_ptr = ptrs
    q_lo, q_hi, q_rope, k_lo, k_hi, k_rope, st_lo, st_hi, st_rope, st_sc, s_x = smem
    k_ready, k_empty, s_bar = bars
    pid_b, pid_h, pid_s, n_splits, H, max_splits, stride_ib, page_shift, t_start, t_end, n_tiles = ints
    ig = _ws_tile_idx(idx_ptr, ints, HALF, WS_GAT)
    ir = _ws_tile_idx(idx_ptr, ints, HALF, WS_ROPE)
    isc = _ws_tile_idx(idx_ptr, ints, HALF, WS_SCALE4)
    _ws_issue_gather(ptrs, smem, page_shift, ig, ir, isc, HALF, 0)
    ig = _ws_tile_idx(idx_ptr, ints, 2 + HALF, WS_GAT)
    ir = _ws_tile_idx(idx_ptr, ints, 2 + HALF, WS_ROPE)
    isc = _ws_tile_idx(idx_ptr, ints, 2 + HALF, WS_SCALE4)
    for j in range(gl.cdiv(n_tiles, 2)):
        slot = j % WS_NBUF
        async_copy.wait_group(0)
        gl.thread_barrier()  # every thread's copies of this producer's tile have landed
        sc = st_sc.index(HALF).load(WS_SCALE4_ROWS)
        bits_lo = st_lo.index(HALF).load(WS_GAT)
        bits_hi = st_hi.index(HALF).load(WS_GAT)
        rope = st_rope.index(HALF).load(WS_ROPE)
        gl.thread_barrier()  # every thread's reads of the staging slot are done before its refill
        _ws_issue_gather(ptrs, smem, page_shift, ig, ir, isc, HALF, 0)
        ig = _ws_tile_idx(idx_ptr, ints, 2 * j + 4 + HALF, WS_GAT)
        ir = _ws_tile_idx(idx_ptr, ints, 2 * j + 4 + HALF, WS_ROPE)
        isc = _ws_tile_idx(idx_ptr, ints, 2 * j + 4 + HALF, WS_SCALE4)
        lo = _ws_dequant_half(bits_lo, sc, 0)
        hi = _ws_dequant_half(bits_hi, sc, 2)
        mbarrier.wait(k_empty.index(slot), ((j // WS_NBUF) & 1) ^ 1)
        k_lo.index(slot).slice(HALF * WS_BLOCK_T, WS_BLOCK_T, dim=0).store(lo)
        k_hi.index(slot).slice(HALF * WS_BLOCK_T, WS_BLOCK_T, dim=0).store(hi)
        k_rope.index(slot).slice(HALF * WS_BLOCK_T, WS_BLOCK_T, dim=0).store(rope)
        fence_async_shared()  # the generic-proxy stores before the consumer's wgmma (async proxy) reads
        gl.thread_barrier()  # all stores done before the one-thread arrive
        mbarrier.arrive(k_ready.index(slot), count=1)


@gluon.jit
def _ws16_producer_0(ptrs, smem, bars, ints, sm_scale_log2, qargs):
    _ws16_producer(ptrs, smem, bars, ints, sm_scale_log2, 0)


@gluon.jit
def _ws16_producer_1(ptrs, smem, bars, ints, sm_scale_log2, qargs):
    _ws16_producer(ptrs, smem, bars, ints, sm_scale_log2, 1)


@gluon.jit
def _ws_consumer(
    ptrs,
    smem,
    bars,
    ints,
    sm_scale_log2,
    qargs,
    HALF: gl.constexpr,
    ROPE: gl.constexpr,
    LOAD_Q: gl.constexpr,
):
    # a consumer warpgroup: its share of QK (HALF 0: dims 0-255, with V3.2's rope tile where ROPE; 1: dims
    # 256-511, V4's rope among them), the other share added through shared memory (a + b == b + a: both consumers
    # get the same scores and softmax), then P.V for V's columns HALF * 256 ... + 255; HALF 0 also stores the LSE.
    # LOAD_Q (V4, step "qload"): the consumer loads its own half of the q tile into shared memory (qargs = q_ptr,
    # stride_qb, stride_qh), while the producer already gathers the first tile, instead of the default partition
    # loading all of q before the partitions start. A one-split bf16 output goes out through shared memory in
    # 16-byte row stores (steps "ostage", V4, and "ostage32", V3.2: the epilogue below)
    kv_u8_ptr, kv_bf16_ptr, kv_f32_ptr, idx_ptr, out_ptr, lse_ptr, part_out_ptr, part_lse_ptr = ptrs
    q_lo, q_hi, q_rope, k_lo, k_hi, k_rope, st_lo, st_hi, st_rope, st_sc, s_x = smem
    k_ready, k_empty, s_bar = bars
    pid_b, pid_h, pid_s, n_splits, H, max_splits, stride_ib, page_shift, t_start, t_end, n_tiles = ints
    if LOAD_Q:
        q_ptr, stride_qb, stride_qh = qargs
        offs_qh = pid_h * WS_BLOCK_H + gl.arange(0, WS_BLOCK_H, layout=gl.SliceLayout(1, WS_ROWS16))
        offs_qc = HALF * 256 + gl.arange(0, 256, layout=gl.SliceLayout(0, WS_ROWS16))
        q_half = gl.load(q_ptr + pid_b.to(gl.int64) * stride_qb + offs_qh[:, None] * stride_qh + offs_qc[None, :])
        if HALF == 0:
            q_lo.store(q_half)
        else:
            q_hi.store(q_half)
        fence_async_shared()  # the generic-proxy stores before this warpgroup's wgmma (async proxy) reads
        gl.thread_barrier()  # every warp's share of the q half stored before any warp's first wgmma
    qk_l: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, WS_BLOCK_T, 16]
    )
    pv_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    p_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=pv_l, k_width=2)
    m_i = gl.full([WS_BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(1, qk_l))
    l_i = gl.zeros([WS_BLOCK_H], gl.float32, layout=gl.SliceLayout(1, qk_l))
    acc = gl.zeros([WS_BLOCK_H, 256], gl.float32, layout=pv_l)
    zero_qk = gl.zeros([WS_BLOCK_H, WS_BLOCK_T], gl.float32, layout=qk_l)
    for i in range(n_tiles):
        slot = i % WS_NBUF
        offs_t = t_start + i * WS_BLOCK_T + gl.arange(0, WS_BLOCK_T, layout=gl.SliceLayout(0, qk_l))
        idx = gl.load(idx_ptr + pid_b.to(gl.int64) * stride_ib + offs_t, mask=offs_t < t_end, other=-1)
        mbarrier.wait(k_ready.index(slot), (i // WS_NBUF) & 1)
        if HALF == 0:
            part = warpgroup_mma(q_lo, k_lo.index(slot).permute((1, 0)), zero_qk, use_acc=False, is_async=True)
            if ROPE:
                part = warpgroup_mma(q_rope, k_rope.index(slot).permute((1, 0)), part, is_async=True)
        else:
            part = warpgroup_mma(q_hi, k_hi.index(slot).permute((1, 0)), zero_qk, use_acc=False, is_async=True)
        part = warpgroup_mma_wait(0, deps=(part,))
        s_x.index(HALF * 2 + i % 2).store(part)
        gl.thread_barrier()  # the whole partial is in shared memory before the one-thread arrive
        mbarrier.arrive(s_bar.index(HALF), count=1)
        mbarrier.wait(s_bar.index(1 - HALF), i & 1)
        qk = part + s_x.index((1 - HALF) * 2 + i % 2).load(qk_l)
        s = gl.where((idx >= 0)[None, :], qk * sm_scale_log2, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)  # all masked so far: keep p = 0, no NaN
        alpha = gl.exp2(m_i - m_safe)
        p = gl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, pv_l))[:, None]
        p_op = gl.convert_layout(p.to(gl.bfloat16), p_l)
        if HALF == 0:
            acc = warpgroup_mma(p_op, k_lo.index(slot), acc)
        else:
            acc = warpgroup_mma(p_op, k_hi.index(slot), acc)
        gl.thread_barrier()  # every warp's wgmma reads of the tile are done before the one-thread arrive
        mbarrier.arrive(k_empty.index(slot), count=1)

    has = l_i > 0.0
    o = acc * gl.convert_layout(1.0 / gl.where(has, l_i, 1.0), gl.SliceLayout(1, pv_l))[:, None]
    bh = pid_b.to(gl.int64) * H + pid_h * WS_BLOCK_H + gl.arange(0, WS_BLOCK_H, layout=gl.SliceLayout(1, pv_l))
    cols = HALF * 256 + gl.arange(0, 256, layout=gl.SliceLayout(0, pv_l))
    if n_splits == 1:
        # steps "ostage" (V4) and "ostage32" (V3.2): the bf16 output goes out through shared memory, in 16-byte row
        # stores. It is staged in this consumer's half of the K ring (k_lo / k_hi, 2 x [32, 256] bf16 = 32 KB, as
        # [64, 256] bf16): only this consumer reads that half, the producer has written its last tile, and this
        # consumer's last P.V has finished (synchronous wgmma, then the barrier above), so nothing else touches it.
        # Stored straight from the wgmma accumulator layout, a warp's store instruction wrote 16 bytes (4 a thread) to
        # each of 8 rows, half of each 32-byte sector: Nsight Compute (candidates 16, V4-Flash B=128) put 390 of the
        # high consumer's 1,520 stall samples in that epilogue, nearly all of them throttled stores (stall_lg)
        if HALF == 0:
            o_st = k_lo._reinterpret(gl.bfloat16, [WS_BLOCK_H, 256], WS_SMEM16)
        else:
            o_st = k_hi._reinterpret(gl.bfloat16, [WS_BLOCK_H, 256], WS_SMEM16)
        o_st.store(o.to(gl.bfloat16))
        gl.thread_barrier()  # every warp's rows are in shared memory before any warp reads others' back
        rows_l: gl.constexpr = gl.SliceLayout(1, WS_ROWS16)
        bh_o = pid_b.to(gl.int64) * H + pid_h * WS_BLOCK_H + gl.arange(0, WS_BLOCK_H, layout=rows_l)
        cols_o = HALF * 256 + gl.arange(0, 256, layout=gl.SliceLayout(0, WS_ROWS16))
        gl.store(out_ptr + bh_o[:, None] * 512 + cols_o[None, :], o_st.load(WS_ROWS16))
    else:
        gl.store(part_out_ptr + (bh * max_splits + pid_s)[:, None] * 512 + cols[None, :], o)
    if HALF == 0:
        lse2 = gl.where(has, m_i + gl.log2(gl.where(has, l_i, 1.0)), float("-inf"))
        bh_s = pid_b.to(gl.int64) * H + pid_h * WS_BLOCK_H + gl.arange(0, WS_BLOCK_H, layout=gl.SliceLayout(1, qk_l))
        if n_splits == 1:
            gl.store(lse_ptr + bh_s, lse2 * 0.6931471805599453)
        else:
            gl.store(part_lse_ptr + bh_s * max_splits + pid_s, lse2)


@gluon.jit
def _ws_consumer_lo(ptrs, smem, bars, ints, sm_scale_log2):
    _ws_consumer(ptrs, smem, bars, ints, sm_scale_log2, 0, 0, 1, 0)


@gluon.jit
def _ws_consumer_hi(ptrs, smem, bars, ints, sm_scale_log2):
    _ws_consumer(ptrs, smem, bars, ints, sm_scale_log2, 0, 1, 0, 0)


@gluon.jit
def _ws_consumer_lo_v4(ptrs, smem, bars, ints, sm_scale_log2, qargs):
    _ws_consumer(ptrs, smem, bars, ints, sm_scale_log2, qargs, 0, 0, 1)


@gluon.jit
def _ws_consumer_hi_v4(ptrs, smem, bars, ints, sm_scale_log2, qargs):
    _ws_consumer(ptrs, smem, bars, ints, sm_scale_log2, qargs, 1, 0, 1)


@gluon.jit
def _ws_q_v32_store(q_ptr, pid_b, pid_h, stride_qb, stride_qh, q_lo, q_hi, q_rope, BLOCK_H: gl.constexpr):
    # V3.2's q tile [BLOCK_H, 576] bf16 (heads pid_h * BLOCK_H ...) stored into the shared-memory buffers q_lo, q_hi
    # (dims 0-255, 256-511) and q_rope (the 64 rope dims) by one warpgroup (the H=16 kernel's consumer)
    offs_h = pid_h * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, WS_ROWS16))
    qrow = q_ptr + pid_b.to(gl.int64) * stride_qb + offs_h[:, None] * stride_qh
    offs_c = gl.arange(0, 256, layout=gl.SliceLayout(0, WS_ROWS16))
    offs_e = gl.arange(0, 64, layout=gl.SliceLayout(0, WS_ROWS16))
    q_lo.store(gl.load(qrow + offs_c[None, :]))
    q_hi.store(gl.load(qrow + 256 + offs_c[None, :]))
    q_rope.store(gl.load(qrow + 512 + offs_e[None, :]))


@gluon.jit
def _ws_q_v32(q_ptr, pid_b, pid_h, stride_qb, stride_qh, BLOCK_H: gl.constexpr):
    # V3.2's q tile [BLOCK_H, 576] bf16 (heads pid_h * BLOCK_H ...) into shared memory, as wgmma operands: dims 0-255,
    # 256-511 and the 64 rope dims (the H=64 kernel's, loaded by the whole CTA before its partitions start)
    offs_h = pid_h * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, WS_ROWS16))
    qrow = q_ptr + pid_b.to(gl.int64) * stride_qb + offs_h[:, None] * stride_qh
    offs_c = gl.arange(0, 256, layout=gl.SliceLayout(0, WS_ROWS16))
    offs_e = gl.arange(0, 64, layout=gl.SliceLayout(0, WS_ROWS16))
    q_lo = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, 256], WS_SMEM16, gl.load(qrow + offs_c[None, :]))
    q_hi = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, 256], WS_SMEM16, gl.load(qrow + 256 + offs_c[None, :]))
    q_rope = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, 64], WS_SMEM16, gl.load(qrow + 512 + offs_e[None, :]))
    return q_lo, q_hi, q_rope


@gluon.jit
def _ws_split(topk, pid_s, n_splits, SPLIT_T: gl.constexpr):
    # split pid_s's top-k slots [t_start, t_end), a whole number of SPLIT_T-token units (the H=64 kernel's tile, the
    # H=16 kernel's 64-token ring slot), and its count of the producer's WS_BLOCK_T tiles
    units = gl.cdiv(gl.cdiv(topk, SPLIT_T), n_splits)
    t_start = pid_s * units * SPLIT_T
    t_end = gl.minimum(t_start + units * SPLIT_T, topk)
    return t_start, t_end, gl.maximum(gl.cdiv(t_end - t_start, WS_BLOCK_T), 0)


@gluon.jit
def _ws_rings(BLOCK_T: gl.constexpr, NSTAGE: gl.constexpr, LAYOUT: gl.constexpr):
    # the shared-memory rings of both warp-specialized kernels: the K-tile ring (WS_NBUF slots of BLOCK_T tokens: dims
    # 0-255, 256-511 and V3.2's rope; V4 has no rope tile, k_rope stands for k_hi there, never read) and the raw-row
    # staging ring (NSTAGE slots of one WS_BLOCK_T tile: fp8 dims 0-255 and 256-511, the bf16 rope, the scales: V3.2's
    # four fp32, V4's 8-byte scale row as two 4-byte words, fp32 bits taken apart as int32)
    k_lo = gl.allocate_shared_memory(gl.bfloat16, [WS_NBUF, BLOCK_T, 256], WS_SMEM16)
    k_hi = gl.allocate_shared_memory(gl.bfloat16, [WS_NBUF, BLOCK_T, 256], WS_SMEM16)
    if LAYOUT == 0:
        k_rope = gl.allocate_shared_memory(gl.bfloat16, [WS_NBUF, BLOCK_T, 64], WS_SMEM16)
    else:
        k_rope = k_hi
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    st_lo = gl.allocate_shared_memory(gl.uint8, [NSTAGE, WS_BLOCK_T, 256], flat)
    st_hi = gl.allocate_shared_memory(gl.uint8, [NSTAGE, WS_BLOCK_T, 256], flat)
    st_rope = gl.allocate_shared_memory(gl.bfloat16, [NSTAGE, WS_BLOCK_T, 64], flat)
    if LAYOUT == 0:
        st_sc = gl.allocate_shared_memory(gl.float32, [NSTAGE, WS_BLOCK_T, 4], flat)
    else:
        st_sc = gl.allocate_shared_memory(gl.float32, [NSTAGE, WS_BLOCK_T, 2], flat)
    return k_lo, k_hi, k_rope, st_lo, st_hi, st_rope, st_sc


@gluon.jit
def _ws16_consumer(ptrs, smem, bars, ints, sm_scale_log2, qargs):
    # the H=16 kernel's consumer warpgroup (the default partition), per ring slot of WS16_BLOCK_T tokens: S^T = K q^T
    # ([64 tokens, 16 heads], all 576 dims), the online softmax over tokens (axis 0), P^T through shared memory
    # (wgmma's B operand), then O^T += V^T P^T for all 512 of V's columns as two [256, 16] fp32 accumulators (V^T: the
    # K tile's two column halves read transposed); it stores the output and the LSE. Step "p2": one consumer, as the
    # H=16 QK is a quarter of the H=64 kernel's; its two producers fill the ring. Step "qload16" (as "qload" for V4's
    # consumers): it loads the q tile into shared memory itself (qargs = q_ptr, stride_qb, stride_qh) while the
    # producers already gather their first tiles, instead of the whole CTA loading q before the partitions start
    kv_u8_ptr, kv_bf16_ptr, kv_f32_ptr, idx_ptr, out_ptr, lse_ptr, part_out_ptr, part_lse_ptr = ptrs
    q_lo, q_hi, q_rope, k_lo, k_hi, k_rope, st_lo, st_hi, st_rope, st_sc, s_x = smem
    k_ready, k_empty, s_bar = bars
    pid_b, pid_h, pid_s, n_splits, H, max_splits, stride_ib, page_shift, t_start, t_end, n_tiles = ints
    q_ptr, stride_qb, stride_qh = qargs
    HB: gl.constexpr = q_lo.shape[0]  # heads a program: WS16_BLOCK_H, or 32 (candidate "h32")
    _ws_q_v32_store(q_ptr, pid_b, pid_h, stride_qb, stride_qh, q_lo, q_hi, q_rope, HB)
    fence_async_shared()  # the generic-proxy stores before this warpgroup's wgmma (async proxy) reads
    gl.thread_barrier()  # every warp's share of q stored before any warp's first wgmma
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HB, 16])
    m_i = gl.full([HB], float("-inf"), gl.float32, layout=gl.SliceLayout(0, acc_l))
    # step "lsum16": the softmax denominator is kept as this thread's own partial sums, l_acc [64 tokens, 16 heads] in
    # the S^T layout (8 values a thread), and summed over the tokens once, after the loop. Tokens are on wgmma's M
    # here, so a sum over them crosses lanes (3 shuffle rounds) and warps (shared memory and a barrier): the per-slot
    # gl.sum(p, 0) it replaces was one of the loop's two such reductions (Nsight Compute at TP8 B=128, H100: about a
    # quarter of the consumer's stall samples in their shuffle, add and max chains). The same sum: every thread scales
    # its partial sums by the same alpha, the per-head factor of the (still reduced) running max
    l_acc = gl.zeros([WS16_BLOCK_T, HB], gl.float32, layout=acc_l)
    acc_lo = gl.zeros([256, HB], gl.float32, layout=acc_l)
    acc_hi = gl.zeros([256, HB], gl.float32, layout=acc_l)
    zero_s = gl.zeros([WS16_BLOCK_T, HB], gl.float32, layout=acc_l)
    p_s = s_x.index(0)
    for j in range(gl.cdiv(n_tiles, 2)):
        slot = j % WS_NBUF
        offs_t = t_start + j * WS16_BLOCK_T + gl.arange(0, WS16_BLOCK_T, layout=gl.SliceLayout(1, acc_l))
        idx = gl.load(idx_ptr + pid_b.to(gl.int64) * stride_ib + offs_t, mask=offs_t < t_end, other=-1)
        mbarrier.wait(k_ready.index(slot), (j // WS_NBUF) & 1)
        st = warpgroup_mma(k_lo.index(slot), q_lo.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        st = warpgroup_mma(k_hi.index(slot), q_hi.permute((1, 0)), st, is_async=True)
        st = warpgroup_mma(k_rope.index(slot), q_rope.permute((1, 0)), st, is_async=True)
        st = warpgroup_mma_wait(0, deps=(st,))
        s = gl.where((idx >= 0)[:, None], st * sm_scale_log2, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 0))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)  # all masked so far: keep p = 0, no NaN
        alpha = gl.exp2(m_i - m_safe)
        p = gl.exp2(s - m_safe[None, :])
        l_acc = l_acc * alpha[None, :] + p
        m_i = m_new
        acc_lo = acc_lo * alpha[None, :]
        acc_hi = acc_hi * alpha[None, :]
        p_s.store(p.to(gl.bfloat16))
        fence_async_shared()  # the generic-proxy stores before this warpgroup's wgmma (async proxy) reads
        gl.thread_barrier()  # every warp's rows of P^T are stored before the wgmma reads them all
        acc_lo = warpgroup_mma(k_lo.index(slot).permute((1, 0)), p_s, acc_lo, is_async=True)
        acc_hi = warpgroup_mma(k_hi.index(slot).permute((1, 0)), p_s, acc_hi, is_async=True)
        acc_lo, acc_hi = warpgroup_mma_wait(0, deps=(acc_lo, acc_hi))
        gl.thread_barrier()  # every warp's wgmma reads of the tile (and of P^T) are done before the one-thread arrive
        mbarrier.arrive(k_empty.index(slot), count=1)

    l_i = gl.sum(l_acc, 0)
    has = l_i > 0.0
    inv_l = (1.0 / gl.where(has, l_i, 1.0))[None, :]
    # O^T [256 columns, HB heads] a half, stored from the accumulator layout (a conversion to whole-column rows would
    # need 16 KB of scratch a half at 16 heads, and the kernel has 21,208 B left of the 232,448 a program may use, 472 B
    # at 32)
    bh = pid_b.to(gl.int64) * H + pid_h * HB + gl.arange(0, HB, layout=gl.SliceLayout(0, acc_l))
    cols = gl.arange(0, 256, layout=gl.SliceLayout(1, acc_l))
    if n_splits == 1:
        gl.store(out_ptr + bh[None, :] * 512 + cols[:, None], (acc_lo * inv_l).to(gl.bfloat16))
        gl.store(out_ptr + bh[None, :] * 512 + 256 + cols[:, None], (acc_hi * inv_l).to(gl.bfloat16))
    else:
        base = part_out_ptr + (bh * max_splits + pid_s)[None, :] * 512 + cols[:, None]
        gl.store(base, acc_lo * inv_l)
        gl.store(base + 256, acc_hi * inv_l)
    lse2 = gl.where(has, m_i + gl.log2(gl.where(has, l_i, 1.0)), float("-inf"))
    if n_splits == 1:
        gl.store(lse_ptr + bh, lse2 * 0.6931471805599453)
    else:
        gl.store(part_lse_ptr + bh * max_splits + pid_s, lse2)


@gluon.jit(do_not_specialize=["B", "H", "topk", "max_splits", "page_shift"])
def _sparse_mla_ws16_split_kernel(
    # pointers
    q_ptr,
    kv_u8_ptr,
    kv_bf16_ptr,
    kv_f32_ptr,
    idx_ptr,
    out_ptr,
    lse_ptr,
    part_out_ptr,
    part_lse_ptr,
    # sizes
    B,
    H,
    topk,
    max_splits,
    page_shift,
    sm_scale_log2,
    # strides (elements)
    stride_qb,
    stride_qh,
    stride_ib,
    NSTAGE: gl.constexpr,
    HB: gl.constexpr = WS16_BLOCK_H,
):
    # V3.2 (d_qk 576) at H a multiple of HB (16, or 32: WS16_HEADS); grid (B, H / HB, splits), a split a whole number of
    # WS16_BLOCK_T slots; launched as _sparse_mla_ws_split_kernel (num_warps=4, maxnreg=WS_MAXNREG), the same
    # outputs. Shared memory: q 18 KB, the K ring 2 x 72 KB, the staging ring 2 x 20.5 KB (a slot a producer), P^T
    # 2 KB
    pid_b = gl.program_id(0)
    pid_h = gl.program_id(1)
    pid_s = gl.program_id(2)
    n_splits = gl.num_programs(2)

    # the q tile's shared memory, filled by the consumer (step "qload16")
    q_lo = gl.allocate_shared_memory(gl.bfloat16, [HB, 256], WS_SMEM16)
    q_hi = gl.allocate_shared_memory(gl.bfloat16, [HB, 256], WS_SMEM16)
    q_rope = gl.allocate_shared_memory(gl.bfloat16, [HB, 64], WS_SMEM16)
    # a K-ring slot holds WS16_BLOCK_T tokens, two producer tiles; a staging slot one tile (a slot a producer)
    k_lo, k_hi, k_rope, st_lo, st_hi, st_rope, st_sc = _ws_rings(WS16_BLOCK_T, NSTAGE, 0)
    # P^T [64 tokens, HB heads] bf16, the consumer's (wgmma's B operand: [K, N], N contiguous; its rows 2 * HB bytes)
    p_l: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=2 * HB, element_bitwidth=16, rank=2)
    s_x = gl.allocate_shared_memory(gl.bfloat16, [1, WS16_BLOCK_T, HB], p_l)
    k_ready = gl.allocate_shared_memory(gl.int64, [WS_NBUF, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [WS_NBUF, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(WS_NBUF):
        mbarrier.init(k_ready.index(i), count=2)  # both producers fill a K slot, a half each
        mbarrier.init(k_empty.index(i), count=1)  # the consumer releases it
    fence_async_shared()

    t_start, t_end, n_tiles = _ws_split(topk, pid_s, n_splits, WS16_BLOCK_T)  # a split: whole ring slots
    ptrs = (kv_u8_ptr, kv_bf16_ptr, kv_f32_ptr, idx_ptr, out_ptr, lse_ptr, part_out_ptr, part_lse_ptr)
    smem = (q_lo, q_hi, q_rope, k_lo, k_hi, k_rope, st_lo, st_hi, st_rope, st_sc, s_x)
    bars = (k_ready, k_empty, k_ready)  # no score exchange: s_bar is never used
    ints = (pid_b, pid_h, pid_s, n_splits, H, max_splits, stride_ib, page_shift, t_start, t_end, n_tiles)
    args = (ptrs, smem, bars, ints, sm_scale_log2, (q_ptr, stride_qb, stride_qh))
    gl.warp_specialize(
        [(_ws16_consumer, args), (_ws16_producer_0, args), (_ws16_producer_1, args)],
        [4, 4],
        [WS_REGS_PRODUCER, WS_REGS_PRODUCER],
    )


@gluon.jit(do_not_specialize=["B", "H", "topk", "max_splits", "page_shift"])
def _sparse_mla_ws_split_kernel(
    # pointers
    q_ptr,
    kv_u8_ptr,
    kv_bf16_ptr,
    kv_f32_ptr,
    idx_ptr,
    out_ptr,
    lse_ptr,
    part_out_ptr,
    part_lse_ptr,
    # sizes
    B,
    H,
    topk,
    max_splits,
    page_shift,
    sm_scale_log2,
    # strides (elements)
    stride_qb,
    stride_qh,
    stride_ib,
    LAYOUT: gl.constexpr,
    NSTAGE: gl.constexpr,
):
    # LAYOUT 0 (V3.2, d_qk 576) or 1 (V4, d_qk 512), H a multiple of WS_BLOCK_H, NSTAGE staging slots (WS_NSTAGES);
    # grid (B, H / WS_BLOCK_H, splits);
    # launched with num_warps=4 (the default partition; the two workers add 8) and maxnreg=WS_MAXNREG. Outputs as
    # _sparse_mla_split_kernel's at one split-D part.
    pid_b = gl.program_id(0)
    pid_h = gl.program_id(1)
    pid_s = gl.program_id(2)
    n_splits = gl.num_programs(2)

    # the q tile [64, d_qk] bf16 into shared memory (wgmma A operands): V3.2's by the default warpgroup here, V4's by
    # its consumers (LOAD_Q). V4 has no q_rope / k_rope: their names stand for q_hi / k_hi there, never read (V4's
    # rope is dims 448-511)
    if LAYOUT == 0:
        q_lo, q_hi, q_rope = _ws_q_v32(q_ptr, pid_b, pid_h, stride_qb, stride_qh, WS_BLOCK_H)
    else:
        q_lo = gl.allocate_shared_memory(gl.bfloat16, [WS_BLOCK_H, 256], WS_SMEM16)
        q_hi = gl.allocate_shared_memory(gl.bfloat16, [WS_BLOCK_H, 256], WS_SMEM16)
        q_rope = q_hi
    # the K-tile ring and the raw-row staging ring
    k_lo, k_hi, k_rope, st_lo, st_hi, st_rope, st_sc = _ws_rings(WS_BLOCK_T, NSTAGE, LAYOUT)
    # the partial-score exchange [consumer * 2 + tile parity]: 32-byte units XOR-swizzled over 4 rows, so a warp's
    # eight rows of an accumulator fragment store in 2 wavefronts, not 8 (unswizzled, 128-byte rows all land on the
    # same banks: 4x the ideal wavefronts in Nsight Compute, and B=128 316.9 against 261.4 us; candidates_14/)
    s_x = gl.allocate_shared_memory(gl.float32, [4, WS_BLOCK_H, WS_BLOCK_T], gl.SwizzledSharedLayout(8, 1, 4, [1, 0]))
    k_ready = gl.allocate_shared_memory(gl.int64, [WS_NBUF, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [WS_NBUF, 1], mbarrier.MBarrierLayout())
    s_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(WS_NBUF):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)  # both consumers release a K tile
    mbarrier.init(s_bar.index(0), count=1)
    mbarrier.init(s_bar.index(1), count=1)
    fence_async_shared()

    t_start, t_end, n_tiles = _ws_split(topk, pid_s, n_splits, WS_BLOCK_T)
    ptrs = (kv_u8_ptr, kv_bf16_ptr, kv_f32_ptr, idx_ptr, out_ptr, lse_ptr, part_out_ptr, part_lse_ptr)
    smem = (q_lo, q_hi, q_rope, k_lo, k_hi, k_rope, st_lo, st_hi, st_rope, st_sc, s_x)
    bars = (k_ready, k_empty, s_bar)
    ints = (pid_b, pid_h, pid_s, n_splits, H, max_splits, stride_ib, page_shift, t_start, t_end, n_tiles)
    if LAYOUT == 0:
        args = (ptrs, smem, bars, ints, sm_scale_log2)
        gl.warp_specialize(
            [(_ws_consumer_lo, args), (_ws_consumer_hi, args), (_ws_producer_v32, args)],
            [4, 4],
            [WS_REGS_CONSUMER, WS_REGS_PRODUCER],
        )
    else:
        args = (ptrs, smem, bars, ints, sm_scale_log2, (q_ptr, stride_qb, stride_qh))
        gl.warp_specialize(
            [(_ws_consumer_lo_v4, args), (_ws_consumer_hi_v4, args), (_ws_producer_v4, args)],
            [4, 4],
            [WS_REGS_CONSUMER, WS_REGS_PRODUCER],
        )


# --------------------------------------------------------------------------------------------------
# Launcher

_DOT_DTYPES = {"bf16": tl.bfloat16, "fp16": tl.float16}


def _jit_cache_size(fn: Any) -> int:
    """Compiled binaries held by a JITFunction (0 under the interpreter, which has no cache)."""
    caches = getattr(fn, "device_caches", None)
    if not caches:
        return 0
    return sum(len(c[0]) for c in caches.values())


def _check_inputs(
    q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, layout: str, page_size: int, check_indices: bool
) -> CacheLayout:
    """Validate shapes, dtypes, strides and (optionally) index range; ``ValueError`` naming the culprit."""
    lay = get_layout(layout)
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size={page_size!r}: expected a positive int (64 or 256)")
    if not isinstance(q, torch.Tensor) or q.dtype != torch.bfloat16:
        raise ValueError(f"q: expected a bfloat16 tensor [B, H, {lay.d_qk}], got {getattr(q, 'dtype', type(q))}")
    if q.dim() != 3 or q.shape[2] != lay.d_qk:
        raise ValueError(f"q: expected shape [B, H, {lay.d_qk}] for layout {layout}, got {list(q.shape)}")
    if q.stride(2) != 1:
        raise ValueError(f"q: expected the last dim contiguous (stride 1), got strides {q.stride()}")
    if not isinstance(kv_cache, torch.Tensor) or kv_cache.dtype != torch.uint8:
        raise ValueError(f"kv_cache: expected a uint8 tensor, got {getattr(kv_cache, 'dtype', type(kv_cache))}")
    row = page_size * lay.token_bytes
    if kv_cache.dim() != 2 or kv_cache.shape[1] != row:
        raise ValueError(
            f"kv_cache: expected shape [num_pages, page_size*token_bytes = {row}] for layout {layout}, "
            f"page_size {page_size}, got {list(kv_cache.shape)}"
        )
    if not kv_cache.is_contiguous():
        raise ValueError(f"kv_cache: expected a contiguous tensor, got strides {kv_cache.stride()}")
    if not isinstance(indices, torch.Tensor) or indices.dtype != torch.int32:
        raise ValueError(f"indices: expected an int32 tensor [B, topk], got {getattr(indices, 'dtype', type(indices))}")
    if indices.dim() != 2 or indices.shape[0] != q.shape[0]:
        raise ValueError(f"indices: expected shape [B={q.shape[0]}, topk], got {list(indices.shape)}")
    if indices.shape[1] < 1 or q.shape[0] < 1 or q.shape[1] < 1:
        raise ValueError(f"q/indices: B, H and topk must be >= 1, got q {list(q.shape)}, indices {list(indices.shape)}")
    if indices.stride(1) != 1:
        raise ValueError(f"indices: expected the last dim contiguous (stride 1), got strides {indices.stride()}")
    if not (q.device == kv_cache.device == indices.device):
        raise ValueError(
            f"q, kv_cache, indices: expected one device, got {q.device}, {kv_cache.device}, {indices.device}"
        )
    if check_indices and indices.numel():
        n_tok = kv_cache.shape[0] * page_size
        lo, hi = int(indices.min()), int(indices.max())  # device sync
        if lo < -1 or hi >= n_tok:
            raise ValueError(
                f"indices: expected values in [-1, {n_tok - 1}] (num_pages*page_size - 1), got min {lo}, max {hi}"
            )
    return lay


@dataclass
class SparseMLADecode:
    """Launcher for one variant: ``SparseMLADecode(variant)(q, kv_cache, indices, layout, page_size)``.

    A single-config variant launches its config directly (never autotunes, so it is safe under CUDA-
    graph capture once compiled). A batch table (``variant.is_table``: rows with ``max_batch``)
    launches the row ``variant.config_for_batch(B)`` chosen on the host from the batch size, also
    without autotuning, so each captured batch size runs its own tuned config. A list variant wraps
    the split kernel in ``triton.autotune`` keyed on the variant's ``autotune_key`` (kernel args
    ``B``, ``H``, ``topk``); the first call per key benchmarks every config. ``last_config`` is the
    config that ran on the last call.

    Counters for the capture check: ``compile_count`` (compiled binaries of the two kernels,
    process-wide: the kernels are module-level), ``autotune_bench_runs`` (configs benchmarked by this
    launcher's autotuner), ``launches``.

    ``check_indices`` (default True): check every index is in ``[-1, num_pages*page_size)`` before
    launching, and that q's finite values fit fp16 where the path multiplies them in fp16
    (``_check_q_fits_fp16``: ``dot_dtype="fp16"``, or a V3.2 Triton config with ``BLOCK_H < 64``); with
    ``dot_dtype="fp16"`` also the dequantized rows the indices name (``_check_cache_fits_fp16``), and with a
    V3.2 Triton config with ``BLOCK_H < 64`` their group scales (``_check_scales_fit_fp16``). It costs
    a device sync (a min/max reduction and a copy to host, ~10-20 us) and is skipped automatically
    while a CUDA graph is being captured (a sync is illegal there); pass ``check_indices=False`` on hot
    paths whose inputs are trusted.

    ``dot_dtype`` is the dot operand dtype of the wgmma configs and of V4; a V3.2 Triton config with
    ``BLOCK_H < 64`` (mma v2; not the H=16 warp-specialized kernel, which runs bf16) multiplies its fp8 groups in
    fp16 whatever it is, so q's first 512 dims must lie
    within fp16's range there (|q| < 65504; module docstring), and so must the group scales of the rows it
    reads (P times a scale is taken in fp16): ``ValueError`` naming q or kv_cache otherwise, when checks are on.
    """

    variant: Variant
    dot_dtype: str = "bf16"
    check_indices: bool = True
    last_config: LaunchConfig | None = field(default=None, init=False)
    autotune_bench_runs: int = field(default=0, init=False)
    launches: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.dot_dtype not in _DOT_DTYPES:
            raise ValueError(f"dot_dtype={self.dot_dtype!r}: expected one of {sorted(_DOT_DTYPES)}")
        configs = getattr(self.variant, "configs", None)
        if not configs or not hasattr(self.variant, "single"):
            raise ValueError(
                "variant: expected a variant (kernelcamp.variant.Variant or any object with .configs, .single "
                "and .autotune_key) with at least one config"
            )
        for c in self.variant.configs:
            _check_config(c)
        ws = [c.label() for c in self.variant.configs if getattr(c, "warp_specialize", False)]
        if ws and not self.variant.single and not getattr(self.variant, "is_table", False):
            raise ValueError(
                f"variant: an autotune list cannot hold a warp-specialized config ({ws[0]}): Triton's autotuner "
                "times the Triton kernel only; use it as a single config or a batch-table row"
            )
        self._by_key = {
            (c.BLOCK_T, c.BLOCK_H, _splits_code(c.num_splits), c.num_warps, c.num_stages): c
            for c in self.variant.configs
        }
        self._tuner = None
        self._table = bool(getattr(self.variant, "is_table", False))
        if not self.variant.single and not self._table:
            key = list(self.variant.autotune_key) or ["B"]
            self._tuner = triton.autotune(configs=[_triton_config(c) for c in self.variant.configs], key=key)(
                _sparse_mla_split_kernel
            )
            bench = self._tuner._bench

            def counted_bench(*args: Any, **kwargs: Any) -> Any:
                self.autotune_bench_runs += 1
                return bench(*args, **kwargs)

            self._tuner._bench = counted_bench

    @property
    def autotunes(self) -> bool:
        """Whether a call can autotune (a list variant): its first call per key times every config."""
        return self._tuner is not None

    @property
    def compile_count(self) -> int:
        return (
            _jit_cache_size(_sparse_mla_split_kernel)
            + _jit_cache_size(_sparse_mla_combine_kernel)
            + _jit_cache_size(_sparse_mla_ws_split_kernel)
            + _jit_cache_size(_sparse_mla_ws16_split_kernel)
        )

    def _config_of(self, tc: triton.Config) -> LaunchConfig:
        kw = tc.kwargs
        return self._by_key[(kw["BLOCK_T"], kw["BLOCK_H"], kw["SPLITS"], tc.num_warps, tc.num_stages)]

    def __call__(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        indices: torch.Tensor,
        layout: str,
        page_size: int,
        sm_scale: float | None = None,
        check_indices: bool | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns ``(out bf16 [B, H, d_v], lse fp32 [B, H])``. Raises ``ValueError`` on bad input."""
        check = self.check_indices if check_indices is None else check_indices
        if check and q.is_cuda and torch.cuda.is_current_stream_capturing():
            check = False
        lay = _check_inputs(q, kv_cache, indices, layout, page_size, check)
        B, H, _ = q.shape
        topk = indices.shape[1]
        scale = 1.0 / math.sqrt(lay.d_qk) if sm_scale is None else float(sm_scale)
        num_sms = _num_sms(q.device)
        # a single config or a batch-table row is chosen here, on the host, from B alone (no autotuning:
        # safe under CUDA-graph capture); an autotune list lets Triton's autotuner choose below
        chosen = self.variant.config_for_batch(B) if self._table else self.variant.configs[0]
        candidates = self.variant.configs if self._tuner is not None else (chosen,)
        if check:
            _check_q_fits_fp16(q, lay, self.dot_dtype, candidates)
            _check_scales_fit_fp16(kv_cache, indices, lay, page_size, candidates)
            if self.dot_dtype == "fp16":
                _check_cache_fits_fp16(kv_cache, indices, layout, page_size)
        max_splits = max(
            resolve_num_splits(c.num_splits, B, H, topk, c.BLOCK_H, c.BLOCK_T, num_sms) for c in candidates
        )
        out = torch.empty((B, H, lay.d_v), dtype=torch.bfloat16, device=q.device)
        lse = torch.empty((B, H), dtype=torch.float32, device=q.device)
        if max_splits > 1:
            part_out = torch.empty((B, H, max_splits, lay.d_v), dtype=torch.float32, device=q.device)
            part_lse = torch.empty((B, H, max_splits), dtype=torch.float32, device=q.device)
        else:
            part_out, part_lse = out, lse  # never written: one split stores the final result directly

        def grid(meta: dict[str, Any]) -> tuple[int, int, int]:
            req = "auto" if meta["SPLITS"] == 0 else meta["SPLITS"]
            n = resolve_num_splits(req, B, H, topk, meta["BLOCK_H"], meta["BLOCK_T"], num_sms)
            return (B, triton.cdiv(H, meta["BLOCK_H"]) * meta["SPLIT_D"], n)

        args = (
            q,
            kv_cache,
            kv_cache.view(torch.bfloat16),
            kv_cache.view(torch.float32),
            indices,
            out,
            lse,
            part_out,
            part_lse,
            B,
            H,
            topk,
            max_splits,
            scale * LOG2E,
            q.stride(0),
            q.stride(1),
            indices.stride(0),
        )
        meta = {"LAYOUT": lay.code, "PAGE_SIZE": page_size, "DOT_DTYPE": _DOT_DTYPES[self.dot_dtype]}
        if self._tuner is None and getattr(chosen, "warp_specialize", False):
            cfg = chosen
            if self.dot_dtype != "bf16":
                raise ValueError(
                    f"dot_dtype={self.dot_dtype!r}: the warp-specialized kernel ({cfg.label()}) runs bf16 only"
                )
            _check_ws_launch(q, lay, page_size, chosen)
            n = resolve_num_splits(cfg.num_splits, B, H, topk, cfg.BLOCK_H, cfg.BLOCK_T, num_sms)
            kernel, consts = _ws_kernel(cfg, lay.code)
            kernel[(B, H // cfg.BLOCK_H, n)](
                *args[:13],
                page_size.bit_length() - 1,
                *args[13:],
                **consts,
                num_warps=4,
                maxnreg=WS_MAXNREG,
            )
        elif self._tuner is None:
            cfg = chosen
            split_d = _launch_grid(lay.code, cfg, B, H, topk, num_sms)[2]
            _sparse_mla_split_kernel[grid](
                *args,
                **meta,
                **_triton_config(cfg).kwargs,
                SPLIT_D=split_d,
                num_warps=cfg.num_warps,
                num_stages=cfg.num_stages,
            )
        else:
            self._tuner[grid](*args, **meta, SPLIT_D=1)  # one part: the grid is the config's, chosen by timing
            cfg = self._config_of(self._tuner.best_config)
        self.last_config = cfg
        self.launches += 1
        n_splits = resolve_num_splits(cfg.num_splits, B, H, topk, cfg.BLOCK_H, cfg.BLOCK_T, num_sms)
        if n_splits > 1:
            block_d = _combine_block_d(B * H, lay.d_v, num_sms)
            _sparse_mla_combine_kernel[(B * H, lay.d_v // block_d)](
                part_out,
                part_lse,
                out,
                lse,
                n_splits,
                max_splits,
                D_V=lay.d_v,
                BLOCK_S=_block_s(n_splits),
                BLOCK_D=block_d,
                num_warps=4,
            )
        return out, lse


def _ws_kernel(config: LaunchConfig, layout_code: int) -> tuple[Any, dict[str, int]]:
    """The warp-specialized kernel that runs ``config`` and its constexprs: the H=16 one for
    ``T64_H16_w12_s2_k<splits>_ws`` and ``T64_H32_...`` (V3.2 only, ``launch_domain``; ``HB`` its head tile), else the
    H=64 one."""
    if _is_ws16(config):
        return _sparse_mla_ws16_split_kernel, {"NSTAGE": config.num_stages, "HB": config.BLOCK_H}
    return _sparse_mla_ws_split_kernel, {"LAYOUT": layout_code, "NSTAGE": config.num_stages}


def launch_domain(config: LaunchConfig, layout: str, num_heads: int, page_size: int) -> str | None:
    """Why ``config`` cannot run this shape (one line), or None when it can: a Triton config runs every shape; the
    warp-specialized kernel needs ``num_heads`` a multiple of its head tile (64; the H=16 kernel: 16 or 32,
    and deepseek_v32 only), a power-of-two page size (deepseek_v4:
    at least 2, so that its 584-byte tokens leave each page's 576-byte data rows 16-byte aligned) and a
    ``num_stages`` of ``WS_NSTAGES[layout]``. The device is not part of it (``_check_ws_launch``). The verify stage
    judges a config only at the shapes of its domain (``kernelcamp.verify.kernel``)."""
    if not getattr(config, "warp_specialize", False):
        return None
    lay = get_layout(layout)
    if _is_ws16(config) and layout != "deepseek_v32":
        return f"runs deepseek_v32 only (its K tile is V3.2's), got {layout}; use a Triton config"
    if num_heads % config.BLOCK_H:
        return f"needs H a multiple of {config.BLOCK_H}, got H={num_heads}; use a Triton config"
    if page_size & (page_size - 1):
        return f"needs a power-of-two page size, got {page_size}; use a Triton config"
    if lay.scale_row_bytes and page_size < 2:
        return f"needs a page size of at least 2 for {layout}, got {page_size}; use a Triton config"
    return _ws_nstage_reason(config.num_stages, layout)


def _ws_nstage_reason(num_stages: int, layout: str) -> str | None:
    """Why the warp-specialized kernel cannot run ``num_stages`` staging slots on ``layout`` (one line), or None:
    the depths of ``WS_NSTAGES``, those that fit the SM's shared memory and are tested (one deeper exceeds it)."""
    allowed = WS_NSTAGES[layout]
    if num_stages in allowed:
        return None
    return (
        f"runs num_stages {' or '.join(map(str, allowed))} on {layout}, got {num_stages} (the staging ring depths "
        f"that fit shared memory and are tested); use _s{int(WS_NSTAGE)}_"
    )


def _check_ws_launch(q: torch.Tensor, lay: CacheLayout, page_size: int, config: LaunchConfig) -> None:
    """``ValueError`` (one line) unless the warp-specialized kernel can run this call: its shapes
    (``launch_domain``), and q on an sm90 GPU outside the Triton interpreter (Gluon compiles Hopper's wgmma,
    mbarrier and setmaxnreg; it has no interpreter)."""
    where = f"config {config.label()} (warp-specialized)"
    why = launch_domain(config, lay.name, q.shape[1], page_size)
    if why:
        raise ValueError(f"{where}: {why}")
    if not isinstance(_sparse_mla_split_kernel, triton.runtime.JITFunction):
        raise ValueError(f"{where}: Gluon kernels do not run in the Triton interpreter (TRITON_INTERPRET=1)")
    if not q.is_cuda or torch.cuda.get_device_capability(q.device)[0] != 9:
        cap = torch.cuda.get_device_capability(q.device) if q.is_cuda else None
        raise ValueError(f"{where}: needs an sm90 (Hopper) GPU, got device {q.device} (capability {cap})")


def _fp16_groups(c: LaunchConfig) -> bool:
    """Whether ``c`` multiplies V3.2's fp8 groups in fp16 (a Triton config with ``BLOCK_H < 64``, mma v2; the H=16
    warp-specialized kernel multiplies in bf16)."""
    return c.BLOCK_H < 64 and not getattr(c, "warp_specialize", False)


def _finite_abs_max(t: torch.Tensor) -> float:
    """The largest finite |value| of ``t`` (0.0 when none is finite; non-finite values are left to the
    output, as on the bf16 path). Costs a device sync."""
    a = t.abs()
    return float(torch.where(torch.isfinite(a), a, torch.zeros((), dtype=a.dtype, device=a.device)).max())


def _check_q_fits_fp16(q: torch.Tensor, lay: CacheLayout, dot_dtype: str, configs: Any) -> None:
    """``ValueError`` naming q when a finite value of q that the chosen path multiplies in fp16 reaches
    ``F16_MAX`` (it would become inf there): every dim with ``dot_dtype="fp16"``; V3.2's 512 fp8-group dims
    with a ``BLOCK_H < 64`` config (module docstring). Non-finite values pass, as on the bf16 path (the
    output is non-finite either way). Costs a device sync."""
    if dot_dtype == "fp16":
        dims, why = q, 'dot_dtype="fp16" multiplies q in fp16'
    elif lay.code == 0 and any(_fp16_groups(c) for c in configs):
        dims, why = q[..., : lay.fp8_dims], "a V3.2 config with BLOCK_H < 64 multiplies q's fp8-group dims in fp16"
    else:
        return
    q_max = _finite_abs_max(dims)
    if q_max >= F16_MAX:
        raise ValueError(
            f"q: |q| reaches {q_max:g}, but {why} (|q| < {F16_MAX:g}); use bf16 and BLOCK_H >= 64 configs for this "
            "input, or scale q down and sm_scale up by the same factor"
        )


def _check_cache_fits_fp16(kv_cache: torch.Tensor, indices: torch.Tensor, layout: str, page_size: int) -> None:
    """``ValueError`` naming kv_cache when a finite dequantized value of a row that ``indices`` names reaches
    ``F16_MAX``: ``dot_dtype="fp16"`` (the interpreter's) multiplies the dequantized rows in fp16, where it
    would become inf. Only the referenced rows are read (``dequantize_rows``); costs a device sync."""
    tok = indices[indices >= 0]
    if tok.numel() == 0:
        return
    v_max = _finite_abs_max(dequantize_rows(kv_cache, tok, layout, page_size))
    if v_max >= F16_MAX:
        raise ValueError(
            f'kv_cache: a row that indices name dequantizes to |value| {v_max:g}, but dot_dtype="fp16" multiplies '
            f'the cache in fp16 (|value| < {F16_MAX:g}); use dot_dtype="bf16" on a GPU, or a cache of smaller values'
        )


def _check_scales_fit_fp16(
    kv_cache: torch.Tensor, indices: torch.Tensor, lay: CacheLayout, page_size: int, configs: Any
) -> None:
    """``ValueError`` naming kv_cache when a V3.2 config with ``BLOCK_H < 64`` would multiply P by a group scale
    that reaches ``F16_MAX``: those configs take ``p * sc_g`` in fp16 (p <= 1; module docstring), where such a
    scale becomes inf and the output non-finite, although every value fits (fp8 values below 1 times the
    scale). Only the scales of the rows that ``indices`` names are read; non-finite scales pass (the output is
    non-finite on every path). Costs a device sync."""
    if lay.code != 0 or not any(_fp16_groups(c) for c in configs):
        return
    tok = indices[indices >= 0]
    if tok.numel() == 0:
        return
    s_max = _finite_abs_max(_row_parts(kv_cache, tok, lay, page_size)[1])
    if s_max >= F16_MAX:
        raise ValueError(
            f"kv_cache: a row that indices name has a group scale of {s_max:g}, but a V3.2 config with BLOCK_H < 64 "
            f"multiplies P by the group scales in fp16 (scale < {F16_MAX:g}); use BLOCK_H >= 64 configs for this cache"
        )


def _combine_block_d(rows: int, d_v: int, num_sms: int = DEFAULT_NUM_SMS) -> int:
    """Column slice of one combine program for ``rows`` (b, h) rows (COMBINE_SPLIT_D above): ``d_v`` halved
    while ``2 * rows * (d_v / slice)`` programs still fit ``COMBINE_PROGRAMS_PER_SM * num_sms`` and the half is
    >= COMBINE_MIN_BLOCK_D. E.g. 132 SMs, d_v 512: 16 rows -> 64 (128 programs), 64 rows -> 128 (256), 128 rows
    -> 256 (256), 512 rows -> 512."""
    block = d_v
    cap = COMBINE_PROGRAMS_PER_SM * num_sms
    while COMBINE_SPLIT_D and 2 * rows * (d_v // block) <= cap and block // 2 >= COMBINE_MIN_BLOCK_D:
        block //= 2
    return block


def _block_s(n_splits: int) -> int:
    return max(2, triton.next_power_of_2(n_splits))


def _is_ws16(c: LaunchConfig) -> bool:
    """Whether ``c`` is the H=16 warp-specialized kernel's config (``T64_H16_w12_s2_k<splits>_ws``, or its 32-head
    form ``T64_H32_...``: ``WS16_HEADS``)."""
    return getattr(c, "warp_specialize", False) and c.BLOCK_T == int(WS16_BLOCK_T) and c.BLOCK_H in WS16_HEADS


def _check_config(c: LaunchConfig) -> None:
    if getattr(c, "warp_specialize", False):
        ws = (int(WS_BLOCK_T), int(WS_BLOCK_H), WS_NUM_WARPS)
        ws16 = (int(WS16_BLOCK_T), int(WS16_BLOCK_H), WS_NUM_WARPS)
        ws16s = [(ws16[0], h, ws16[2]) for h in WS16_HEADS]
        stages = sorted({n for v in WS_NSTAGES.values() for n in v})
        if (c.BLOCK_T, c.BLOCK_H, c.num_warps) not in (ws, *ws16s) or c.num_stages not in stages:
            raise ValueError(
                f"config {c.label()}: the warp-specialized kernel runs BLOCK_T {ws[0]}, BLOCK_H {ws[1]}, "
                f"num_warps {ws[2]}, num_stages {' or '.join(map(str, stages))} only "
                f"(T{ws[0]}_H{ws[1]}_w{ws[2]}_s{int(WS_NSTAGE)}_k<splits>_ws; s3 on deepseek_v4 only), or "
                f"its H=16 form on deepseek_v32 (T{ws16[0]}_H{ws16[1]}_w{ws16[2]}_s{int(WS_NSTAGE)}_k<splits>_ws, "
                f"or BLOCK_H {' or '.join(str(h) for h in WS16_HEADS[1:])})"
            )
    else:
        for name in ("BLOCK_T", "BLOCK_H"):
            v = getattr(c, name)
            if not isinstance(v, int) or v < 16 or v & (v - 1):
                raise ValueError(f"{name}={v!r}: expected a power of two >= 16 (tensor-core dot dimensions)")
        if not isinstance(c.num_warps, int) or c.num_warps < 1 or c.num_warps & (c.num_warps - 1):
            raise ValueError(f"num_warps={c.num_warps!r}: expected a power of two >= 1")
        if not isinstance(c.num_stages, int) or c.num_stages < 1:
            raise ValueError(f"num_stages={c.num_stages!r}: expected an int >= 1")
    if c.num_splits != "auto" and (not isinstance(c.num_splits, int) or c.num_splits < 1):
        raise ValueError(f"num_splits={c.num_splits!r}: expected an int >= 1 or 'auto'")


# --------------------------------------------------------------------------------------------------
# Quantizer, dequantizer, torch reference


def _check_pages(num_tokens: int, page_size: int, what: str) -> int:
    if page_size < 1 or num_tokens % page_size:
        raise ValueError(f"{what}: num_tokens={num_tokens} must be a multiple of page_size={page_size}")
    return num_tokens // page_size


def quantize_kv_cache(latent: torch.Tensor, layout: str, page_size: int) -> torch.Tensor:
    """Build a paged fp8 cache from bf16 latents.

    latent: ``[num_tokens, d_qk]`` bf16, num_tokens a multiple of page_size. Returns uint8
    ``[num_pages, page_size * token_bytes]`` in ``layout`` (module docstring). V3.2 scales are
    ``amax / 448`` per 128 values (1 for an all-zero group); V4 scales are the power of two
    ``2^ceil(log2(amax / 448))`` per 64 values, exponent clamped to [1, 254]. fp8 values saturate at
    +-448; rope values are stored as bf16 unchanged.
    """
    lay = get_layout(layout)
    if latent.dim() != 2 or latent.shape[1] != lay.d_qk:
        raise ValueError(f"latent: expected shape [num_tokens, {lay.d_qk}], got {list(latent.shape)}")
    n = latent.shape[0]
    num_pages = _check_pages(n, page_size, "latent")
    x = latent.float()
    nope = x[:, : lay.fp8_dims].reshape(n, lay.num_groups, lay.group_size)
    amax = nope.abs().amax(dim=2, keepdim=True)
    if lay.scale_kind == "fp32":
        scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
        scale_bytes = scale.reshape(n, lay.num_groups).contiguous().view(torch.uint8)
    else:
        e = torch.ceil(torch.log2(torch.clamp(amax, min=1e-30) / FP8_MAX)) + 127
        e = torch.clamp(e, 1, 254)
        scale = torch.exp2(e - 127)
        scale_bytes = e.reshape(n, lay.num_groups).to(torch.uint8)
    fp8 = torch.clamp(nope / scale, -FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).reshape(n, lay.fp8_dims)
    rope = latent[:, lay.fp8_dims :].to(torch.bfloat16).contiguous().view(torch.uint8)
    fp8_bytes = fp8.view(torch.uint8)
    if lay.scale_kind == "fp32":
        rows = torch.cat([fp8_bytes, scale_bytes, rope], dim=1)  # [n, 656]
        return rows.reshape(num_pages, page_size * lay.token_bytes).contiguous()
    data = torch.cat([fp8_bytes, rope], dim=1).reshape(num_pages, page_size * lay.data_bytes)
    pad = torch.zeros((n, lay.scale_row_bytes - lay.num_groups), dtype=torch.uint8, device=latent.device)
    scales = torch.cat([scale_bytes, pad], dim=1).reshape(num_pages, page_size * lay.scale_row_bytes)
    return torch.cat([data, scales], dim=1).contiguous()


def _row_parts(
    kv_cache: torch.Tensor, tokens: torch.Tensor, lay: CacheLayout, page_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The parts of the cache rows of the global token ids ``tokens`` (any shape, all valid), gathering only
    those rows: fp8 values as fp32 ``[*tokens.shape, fp8_dims]``, group scales as fp32 ``[..., num_groups]``
    (V4's ue8m0 exponents decoded, e = 0 as 0.0) and rope values as bf16 ``[..., rope_dims]``."""
    tokens = tokens.long()
    num_pages = kv_cache.shape[0]
    if lay.scale_row_bytes == 0:
        rows = kv_cache.reshape(num_pages * page_size, lay.token_bytes)[tokens]
        fp8 = rows[..., : lay.fp8_dims].contiguous().view(torch.float8_e4m3fn).float()
        scale = rows[..., lay.scale_offset : lay.scale_offset + 4 * lay.num_groups].contiguous().view(torch.float32)
        rope = rows[..., lay.rope_offset : lay.rope_offset + 2 * lay.rope_dims].contiguous().view(torch.bfloat16)
    else:
        page, row = tokens // page_size, tokens % page_size
        data = kv_cache[:, : page_size * lay.data_bytes].unflatten(1, (page_size, lay.data_bytes))[page, row]
        srow = kv_cache[:, page_size * lay.data_bytes :].unflatten(1, (page_size, lay.scale_row_bytes))[page, row]
        fp8 = data[..., : lay.fp8_dims].contiguous().view(torch.float8_e4m3fn).float()
        e = srow[..., : lay.num_groups].to(torch.int32)
        scale = torch.where(e > 0, torch.exp2((e - 127).float()), torch.zeros_like(e, dtype=torch.float32))
        rope = data[..., lay.rope_offset : lay.rope_offset + 2 * lay.rope_dims].contiguous().view(torch.bfloat16)
    return fp8, scale, rope


def dequantize_rows(kv_cache: torch.Tensor, tokens: torch.Tensor, layout: str, page_size: int) -> torch.Tensor:
    """Dequantize the cache rows of the global token ids ``tokens`` (any shape, all valid) to fp32
    ``[*tokens.shape, d_qk]``. Gathers only those rows (cheap for a top-k of a large cache)."""
    lay = get_layout(layout)
    fp8, scale, rope = _row_parts(kv_cache, tokens, lay, page_size)
    nope = (fp8.unflatten(-1, (lay.num_groups, lay.group_size)) * scale.unsqueeze(-1)).flatten(-2)
    return torch.cat([nope, rope.float()], dim=-1)


def dequantize_kv_cache(kv_cache: torch.Tensor, layout: str, page_size: int) -> torch.Tensor:
    """The whole cache as fp32 ``[num_pages * page_size, d_qk]`` (token id order)."""
    get_layout(layout)
    n = kv_cache.shape[0] * page_size
    return dequantize_rows(kv_cache, torch.arange(n, device=kv_cache.device), layout, page_size)


def sparse_mla_decode_ref(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    layout: str,
    page_size: int,
    sm_scale: float | None = None,
    check_indices: bool = True,
    compute_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference: dequantize the gathered rows, masked softmax with an explicit scale, weighted sum.

    Returns ``(out [B, H, d_v], lse [B, H])`` in fp32 (natural-log LSE of the scaled scores). An
    all-empty row gives zeros and ``lse = -inf``. ``compute_dtype`` other than fp32 rounds q, the
    dequantized rows, the scores' softmax weights and the products to that dtype (the "torch's own
    error in the same precision" yardstick of the tests); the result is still returned in fp32.
    ``check_indices=False`` skips the range check (it syncs; a captured graph needs it off).
    """
    lay = _check_inputs(q, kv_cache, indices, layout, page_size, check_indices)
    scale = 1.0 / math.sqrt(lay.d_qk) if sm_scale is None else float(sm_scale)
    valid = indices >= 0
    tokens = torch.where(valid, indices, torch.zeros_like(indices))
    kv = dequantize_rows(kv_cache, tokens, layout, page_size).to(compute_dtype)  # [B, topk, d_qk]
    s = torch.einsum("bhd,btd->bht", q.to(compute_dtype), kv).float() * scale
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    lse_safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    p = torch.exp(s - lse_safe[..., None]).to(compute_dtype)
    out = torch.einsum("bht,btd->bhd", p, kv[..., : lay.d_v]).float()
    return out, lse


# --------------------------------------------------------------------------------------------------
# Inputs, flops and bytes, compile specs


def make_inputs(
    layout: str,
    B: int,
    H: int,
    topk: int,
    page_size: int,
    num_cache_tokens: int,
    device: str | torch.device,
    seed: int = 0,
    empty_fraction: float = 0.0,
) -> dict[str, Any]:
    """Deterministic inputs: ``{q, kv_cache, indices, sm_scale, layout, page_size}``.

    Latents are N(0, 1) bf16 with a per-(token, 64-value group) magnitude in [2^-3, 2^3] so that the
    scales differ; q is N(0, 1) bf16. Each index row holds ``topk`` distinct token ids, including
    the last token of the last page; ``empty_fraction`` of the slots (random positions) are -1.
    """
    lay = get_layout(layout)
    if topk > num_cache_tokens:
        raise ValueError(f"topk={topk}: must be <= num_cache_tokens={num_cache_tokens} (distinct indices)")
    _check_pages(num_cache_tokens, page_size, "num_cache_tokens")
    g = torch.Generator().manual_seed(seed)
    latent = torch.randn(num_cache_tokens, lay.d_qk, generator=g)
    mag = torch.exp2(torch.randint(-3, 4, (num_cache_tokens, lay.d_qk // 64), generator=g).float())
    latent = (latent.unflatten(1, (-1, 64)) * mag[..., None]).flatten(1).to(torch.bfloat16)
    q = torch.randn(B, H, lay.d_qk, generator=g).to(torch.bfloat16)
    last = num_cache_tokens - 1
    rows = []
    for _ in range(B):
        ids = torch.randperm(last, generator=g)[: topk - 1]
        ids = torch.cat([ids, torch.tensor([last])])
        rows.append(ids[torch.randperm(topk, generator=g)])
    indices = torch.stack(rows).to(torch.int32)
    if empty_fraction > 0:
        drop = torch.rand(B, topk, generator=g) < empty_fraction
        indices = torch.where(drop, torch.full_like(indices, -1), indices)
    return {
        "q": q.to(device),
        "kv_cache": quantize_kv_cache(latent.to(device), layout, page_size),
        "indices": indices.to(device),
        "sm_scale": 1.0 / math.sqrt(lay.d_qk),
        "layout": layout,
        "page_size": page_size,
    }


def flops(layout: str, B: int, H: int, topk: int) -> float:
    """Useful flops per call: 2 * H * (d_qk + d_v) * topk * B (DESIGN.md, definitions)."""
    lay = get_layout(layout)
    return 2.0 * H * (lay.d_qk + lay.d_v) * topk * B


def bytes_moved(layout: str, B: int, H: int, topk: int) -> float:
    """Bytes per call: gathered KV rows + q (bf16) + indices (int32) + out (bf16) + lse (fp32)."""
    lay = get_layout(layout)
    kv = lay.token_bytes * topk * B
    q = 2.0 * B * H * lay.d_qk
    idx = 4.0 * B * topk
    out = 2.0 * B * H * lay.d_v + 4.0 * B * H
    return kv + q + idx + out


@dataclass(frozen=True)
class KernelSpec:
    """What ``triton.compile(ASTSource(fn, signature, constexprs, attrs), target, options)`` needs.

    ``constexprs`` is keyed by argument name (Triton 3.6's ASTSource maps names to indices);
    ``attrs`` marks the pointer arguments 16-byte aligned as a real launch does (optional for
    ASTSource, but registers can differ without it). ``num_warps`` is the warps of a launched program (the
    occupancy figures'); ``options`` are compile options that differ from ``{"num_warps", "num_stages"}``: the
    warp-specialized kernel compiles with ``num_warps`` 4 (its default partition; the workers add 8) and
    ``maxnreg``, for sm90 only (``archs``: Hopper's wgmma; LLVM aborts on it for sm120).
    """

    name: str
    fn: Any
    signature: dict[str, str]
    constexprs: dict[str, Any]
    num_warps: int
    num_stages: int
    attrs: dict[tuple[int, ...], list] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    archs: tuple[int, ...] = ()  # the archs it compiles for (the inspector skips others); () for any


def _compilable(kernel: Any) -> Any:
    """The ``JITFunction`` that ``triton.compile`` needs, or ``RuntimeError`` under the interpreter.

    With ``TRITON_INTERPRET=1`` set when triton is imported, every ``@triton.jit`` function (Triton's
    own ``tl.cdiv``, ``tl.max``, ... included) is an interpreter function and cannot be compiled:
    cross-compile in a process started without ``TRITON_INTERPRET`` (e.g. a subprocess in tests).
    """
    if not isinstance(kernel, triton.runtime.JITFunction):
        raise RuntimeError(
            "compile_specs: Triton runs in interpreter mode (TRITON_INTERPRET=1 when triton was imported); "
            "cross-compile in a process started without TRITON_INTERPRET"
        )
    return kernel


def _spec(
    name: str,
    fn: Any,
    types: dict[str, str],
    constexprs: dict[str, Any],
    num_warps: int,
    num_stages: int,
    int_values: dict[str, int] | None = None,
) -> KernelSpec:
    # Specialized as a launch specializes them (triton/runtime/jit.py binder; the rule is
    # triton/backends/compiler.py BaseBackend.get_int_specialization): every pointer 16-byte aligned
    # (torch allocations are), and each int argument in ``int_values`` (its launch value) that is not
    # in do_not_specialize: 1 becomes the constexpr 1, a multiple of 16 gets tt.divisibility 16.
    # Without the ints, the q load compiled to 144 2-byte loads instead of 18 16-byte ones.
    constexprs = dict(constexprs)
    for a, v in (int_values or {}).items():
        if v == 1:
            constexprs[a] = 1
    sig = {a: ("constexpr" if a in constexprs else types[a]) for a in fn.arg_names}
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, a in enumerate(fn.arg_names)
        if sig[a].startswith("*") or (sig[a] == "i32" and a in (int_values or {}) and int_values[a] % 16 == 0)
    }
    return KernelSpec(name, fn, sig, constexprs, num_warps, num_stages, attrs)


def compile_specs(
    layout: str,
    num_heads: int,
    topk: int,
    config: LaunchConfig,
    dot_dtype: str = "bf16",
    batch: int = 64,
    page_size: int = 64,
    all_split_d: bool = False,
    min_batch: int = 1,
    num_sms: int = DEFAULT_NUM_SMS,
) -> list[KernelSpec]:
    """The split-K kernel and the combine kernel as compiled for ``config`` at this shape.

    ``num_splits="auto"``, the split-D parts (``resolve_split_d``) and the combine's slices are resolved for
    ``batch`` on a grid of ``num_sms`` SMs (default an H200's 132); the combine spec is returned even when that
    resolves to one split (then it does not run). With ``all_split_d`` (the compile inspector's choice, for a
    single config or a batch-table row; an autotune list launches one part) the split kernel comes once for each
    split-D part count the config launches at batch sizes ``min_batch`` to its ``max_batch``
    (``_split_d_batches``; named ``sparse_mla_split`` for one part, ``sparse_mla_split_d2`` / ``_d4``), followed
    by the combine at ``batch``: a row for small batch sizes runs those binaries, not the one at ``batch``. The
    combine's own specialization still follows ``batch`` only. ``ValueError`` for a config or dot dtype the
    kernel refuses.
    """
    lay = get_layout(layout)
    _check_config(config)
    why = _ws_nstage_reason(config.num_stages, layout) if getattr(config, "warp_specialize", False) else None
    if _is_ws16(config) and layout != "deepseek_v32":
        why = launch_domain(config, layout, config.BLOCK_H, 2)
    if why:  # the shapes a ws config runs are the launcher's to judge; a ring that cannot compile is refused here
        raise ValueError(f"config {config.label()}: {why}")
    if dot_dtype not in _DOT_DTYPES:
        raise ValueError(f"dot_dtype={dot_dtype!r}: expected one of {sorted(_DOT_DTYPES)}")
    fn = _compilable(_sparse_mla_split_kernel)
    ws = getattr(config, "warp_specialize", False)
    n, _, split_d = _launch_grid(lay.code, config, batch, num_heads, topk, num_sms)
    split_types = {
        "q_ptr": "*bf16",
        "kv_u8_ptr": "*u8",
        "kv_bf16_ptr": "*bf16",
        "kv_f32_ptr": "*fp32",
        "idx_ptr": "*i32",
        "out_ptr": "*bf16",
        "lse_ptr": "*fp32",
        "part_out_ptr": "*fp32",
        "part_lse_ptr": "*fp32",
        "B": "i32",
        "H": "i32",
        "topk": "i32",
        "max_splits": "i32",
        "sm_scale_log2": "fp32",
        "stride_qb": "i32",
        "stride_qh": "i32",
        "stride_ib": "i32",
    }
    split_const = {
        "LAYOUT": lay.code,
        "PAGE_SIZE": page_size,
        "DOT_DTYPE": _DOT_DTYPES[dot_dtype],
        "BLOCK_T": config.BLOCK_T,
        "BLOCK_H": config.BLOCK_H,
        "SPLITS": _splits_code(config.num_splits),
    }
    comb_types = {
        "part_out_ptr": "*fp32",
        "part_lse_ptr": "*fp32",
        "out_ptr": "*bf16",
        "lse_ptr": "*fp32",
        "n_splits": "i32",
        "max_splits": "i32",
    }
    comb_const = {
        "D_V": lay.d_v,
        "BLOCK_S": _block_s(n),
        "BLOCK_D": _combine_block_d(batch * num_heads, lay.d_v, num_sms),
    }
    # the launch values of the specialized ints, for contiguous q [B, H, d_qk] and indices [B, topk]
    # (B, H, topk and max_splits are do_not_specialize in the split kernel)
    strides = {"stride_qb": num_heads * lay.d_qk, "stride_qh": lay.d_qk, "stride_ib": topk}
    if ws:  # one binary at every batch size (no split-D); the page size is a run-time argument there
        ws_kernel, ws_consts = _ws_kernel(config, lay.code)
        ws_spec = _spec(
            "sparse_mla_split_ws16" if _is_ws16(config) else "sparse_mla_split_ws",
            _compilable(ws_kernel),
            {**split_types, "page_shift": "i32"},
            ws_consts,
            WS_NUM_WARPS,
            config.num_stages,
            strides,
        )
        specs = [replace(ws_spec, options={"num_warps": 4, "maxnreg": WS_MAXNREG}, archs=(90,))]
    else:
        parts = [split_d]  # the binary at ``batch``; with all_split_d, those of the row's whole batch range
        if all_split_d:
            parts = sorted(_split_d_batches(lay.code, config, num_heads, topk, num_sms, min_batch)) or parts
        specs = [
            _spec(
                "sparse_mla_split" if d == 1 or not all_split_d else f"sparse_mla_split_d{d}",
                fn,
                split_types,
                {**split_const, "SPLIT_D": d},
                config.num_warps,
                config.num_stages,
                strides,
            )
            for d in parts
        ]
    specs.append(
        _spec(
            "sparse_mla_combine",
            _compilable(_sparse_mla_combine_kernel),
            comb_types,
            comb_const,
            4,
            1,
            {"n_splits": n, "max_splits": n},
        )
    )
    return specs


def kernel_source_hash() -> str:
    """sha256 (hex) of this module's source file."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()

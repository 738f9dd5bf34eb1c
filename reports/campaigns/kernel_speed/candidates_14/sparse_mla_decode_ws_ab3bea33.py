"""Warp-specialized V3.2 sparse MLA decode split kernel in Gluon (sm90): a campaign candidate (issue 14).

Not the shipped kernel: ``kernels/sparse_mla_decode.py`` is. This file asks one question on the H200: does
splitting a program's warps into roles (one warpgroup gathers and dequantizes the fp8 rows while two
warpgroups run the wgmma dots and the softmax) take V3.2 B=128 past the plain-Triton kernel's one-tile-at-a-
time chain (Nsight Compute: latency-bound at one 8-warp CTA per SM, reports/campaigns/kernel_speed/)?

Layout and outputs are the shipped kernel's (DeepSeek-V3.2 656-byte fp8 rows, ``LAYOUT`` 0 only; H a multiple
of 64): the same grid ``(B, H / 64, splits)``, the same final bf16 output + natural-log LSE with one split, the
same fp32 partial outputs + base-2 partial LSEs with more, merged by the shipped combine kernel.

One program (12 warps):

- producer warpgroup (worker): per ``BLOCK_T`` tile, cp.async gathers of the 512 fp8 values, the 4 fp32 group
  scales and the 64 bf16 rope values of each token into an ``NSTAGE``-deep staging ring (issued
  ``NSTAGE - 1`` tiles ahead), then the dequantization (fp8 -> fp32, times the group scale, -> bf16) into an
  ``NBUF``-deep ring of wgmma-ready K tiles (columns 0-255, 256-511, rope), signalled by an mbarrier;
- two consumer warpgroups (the default partition and a worker): each computes the whole ``q . k^T`` tile
  (64 heads x BLOCK_T, three wgmma calls over K = 576 from shared memory), the online softmax in base 2, and
  P.V for its own 256 of V's 512 columns (P from registers, V the K tile's columns in shared memory); both
  release the K tile through a second mbarrier (count 2).

Shared memory at BLOCK_T 32, NBUF 2, NSTAGE 2: q 72 KiB + K tiles 2 x 36 + staging 2 x 20.5 = 185 KiB.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

BLOCK_H = 64
ROW_BYTES = 656  # V3.2: 512 fp8 + 4 fp32 scales + 64 bf16 rope
# registers per thread of the worker partitions (setmaxnreg); the default partition gets what maxnreg leaves
REGS_CONSUMER = gl.constexpr(192)
# tile sizes: module constants, not kernel arguments (Triton 3.6's warp_specialize turns the constexprs of a
# partition's argument tuple into tensors); a candidate with other sizes is a copy of this file
PAGE_SIZE = gl.constexpr(64)
BLOCK_T = gl.constexpr(32)
NBUF = gl.constexpr(2)
NSTAGE = gl.constexpr(2)
# 1: the two consumers split the QK dot's 576 dims and add their partial scores through shared memory (32 KiB);
# 0: each computes the whole QK tile (as the shipped kernel's two warpgroups do at BLOCK_H 64)
SPLIT_QK = gl.constexpr(1)
# 1: the staging ring's rows XOR-swizzled in 16-byte units (cp.async writes and the producer's reads); 0: flat
SWIZZLE_STAGING = gl.constexpr(0)
# the producer warpgroup's register layouts: [T, 256] fp8 bytes (16 B a thread), [T, 64] bf16 rope, [T, 4] fp32 scales
GAT = gl.constexpr(gl.BlockedLayout([1, 16], [2, 16], [4, 1], [1, 0]))
ROPE = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0]))
SCALE = gl.constexpr(gl.BlockedLayout([1, 4], [32, 1], [4, 1], [1, 0]))
REGS_PRODUCER = gl.constexpr(120)


@gluon.jit
def _tile_idx(idx_ptr, pid_b, stride_ib, t_start, t_end, tile, n_tiles, layout: gl.constexpr):
    # tile `tile`'s BLOCK_T top-k indices in SliceLayout(1, layout); -1 past t_end and for tile >= n_tiles
    offs_t = t_start + tile * BLOCK_T + gl.arange(0, BLOCK_T, layout=gl.SliceLayout(1, layout))
    return gl.load(
        idx_ptr + pid_b.to(gl.int64) * stride_ib + offs_t, mask=(offs_t < t_end) & (tile < n_tiles), other=-1
    )


@gluon.jit
def _row_base(idx, extra: gl.constexpr):
    # byte offset of each token's row (+ extra) in the paged cache; 0 for an empty slot
    PAGE_BYTES: gl.constexpr = PAGE_SIZE * 656
    tok = gl.where(idx >= 0, idx, 0).to(gl.int64)
    return gl.multiple_of((tok // PAGE_SIZE) * PAGE_BYTES + (tok % PAGE_SIZE) * 656 + extra, 16)


@gluon.jit
def _issue_gather(kv_u8_ptr, kv_bf16_ptr, kv_f32_ptr, st_lo, st_hi, st_rope, st_sc, idx_g, idx_r, idx_s, stage):
    # cp.async of one tile's rows (its indices in the GAT, ROPE and SCALE layouts; -1 = nothing to copy, zeros)
    # into staging slot `stage`, one commit group
    base = _row_base(idx_g, 0)
    offs_c = gl.arange(0, 256, layout=gl.SliceLayout(0, GAT))
    ptr = kv_u8_ptr + base[:, None] + offs_c[None, :]
    valid = (idx_g >= 0)[:, None]
    async_copy.async_copy_global_to_shared(st_lo.index(stage), ptr, mask=valid)
    async_copy.async_copy_global_to_shared(st_hi.index(stage), ptr + 256, mask=valid)
    offs_e = gl.arange(0, 64, layout=gl.SliceLayout(0, ROPE))
    rope_ptr = kv_bf16_ptr + _row_base(idx_r, 528)[:, None] // 2 + offs_e[None, :]
    async_copy.async_copy_global_to_shared(st_rope.index(stage), rope_ptr, mask=(idx_r >= 0)[:, None])
    offs_4 = gl.arange(0, 4, layout=gl.SliceLayout(0, SCALE))
    sc_ptr = kv_f32_ptr + _row_base(idx_s, 512)[:, None] // 4 + offs_4[None, :]
    async_copy.async_copy_global_to_shared(st_sc.index(stage), sc_ptr, mask=(idx_s >= 0)[:, None])
    async_copy.commit_group()


@gluon.jit
def _dequant_half(bits, sc, g: gl.constexpr, layout: gl.constexpr, sl: gl.constexpr):
    # [T, 256] fp8 bytes of groups g, g + 1 and the [T, 4] fp32 scales -> [T, 256] bf16 (value = fp8 * scale)
    offs_4 = gl.arange(0, 4, layout=gl.SliceLayout(0, sl))
    sa = gl.sum(gl.where(offs_4[None, :] == g, sc, 0.0), axis=1)
    sb = gl.sum(gl.where(offs_4[None, :] == g + 1, sc, 0.0), axis=1)
    sa = gl.convert_layout(sa, gl.SliceLayout(1, layout))
    sb = gl.convert_layout(sb, gl.SliceLayout(1, layout))
    offs_c = gl.arange(0, 256, layout=gl.SliceLayout(0, layout))
    scale = gl.where(offs_c[None, :] < 128, sa[:, None], sb[:, None])
    return (bits.to(gl.float8e4nv, bitcast=True).to(gl.float32) * scale).to(gl.bfloat16)


@gluon.jit
def _producer(
    kv_u8_ptr,
    kv_bf16_ptr,
    kv_f32_ptr,
    idx_ptr,
    q_lo,
    q_hi,
    q_rope,
    k_lo,
    k_hi,
    k_rope,
    st_lo,
    st_hi,
    st_rope,
    st_sc,
    k_ready,
    k_empty,
    s_x,
    s_bar,
    out_ptr,
    lse_ptr,
    part_out_ptr,
    part_lse_ptr,
    pid_b,
    pid_h,
    pid_s,
    n_splits,
    H,
    max_splits,
    sm_scale_log2,
    stride_ib,
    t_start,
    t_end,
    n_tiles,
):
    dq: gl.constexpr = GAT
    rl: gl.constexpr = ROPE
    sl: gl.constexpr = SCALE
    for j in gl.static_range(NSTAGE - 1):
        _issue_gather(
            kv_u8_ptr,
            kv_bf16_ptr,
            kv_f32_ptr,
            st_lo,
            st_hi,
            st_rope,
            st_sc,
            _tile_idx(idx_ptr, pid_b, stride_ib, t_start, t_end, j, n_tiles, GAT),
            _tile_idx(idx_ptr, pid_b, stride_ib, t_start, t_end, j, n_tiles, ROPE),
            _tile_idx(idx_ptr, pid_b, stride_ib, t_start, t_end, j, n_tiles, SCALE),
            j % NSTAGE,
        )
    # the indices of the next tile to gather are loaded one iteration ahead (their latency off the issue path)
    ig = _tile_idx(idx_ptr, pid_b, stride_ib, t_start, t_end, NSTAGE - 1, n_tiles, GAT)
    ir = _tile_idx(idx_ptr, pid_b, stride_ib, t_start, t_end, NSTAGE - 1, n_tiles, ROPE)
    isc = _tile_idx(idx_ptr, pid_b, stride_ib, t_start, t_end, NSTAGE - 1, n_tiles, SCALE)
    for i in range(n_tiles):
        _issue_gather(
            kv_u8_ptr, kv_bf16_ptr, kv_f32_ptr, st_lo, st_hi, st_rope, st_sc, ig, ir, isc, (i + NSTAGE - 1) % NSTAGE
        )
        ig = _tile_idx(idx_ptr, pid_b, stride_ib, t_start, t_end, i + NSTAGE, n_tiles, GAT)
        ir = _tile_idx(idx_ptr, pid_b, stride_ib, t_start, t_end, i + NSTAGE, n_tiles, ROPE)
        isc = _tile_idx(idx_ptr, pid_b, stride_ib, t_start, t_end, i + NSTAGE, n_tiles, SCALE)
        async_copy.wait_group(NSTAGE - 1)
        gl.thread_barrier()  # every producer thread's copies of tile i have landed
        stage = i % NSTAGE
        slot = i % NBUF
        sc = st_sc.index(stage).load(sl)
        lo = _dequant_half(st_lo.index(stage).load(dq), sc, 0, dq, sl)
        hi = _dequant_half(st_hi.index(stage).load(dq), sc, 2, dq, sl)
        rope = st_rope.index(stage).load(rl)
        mbarrier.wait(k_empty.index(slot), ((i // NBUF) & 1) ^ 1)
        k_lo.index(slot).store(lo)
        k_hi.index(slot).store(hi)
        k_rope.index(slot).store(rope)
        fence_async_shared()
        gl.thread_barrier()  # all stores done (and every read of this staging slot) before the one-thread arrive
        mbarrier.arrive(k_ready.index(slot), count=1)


@gluon.jit
def _consumer(
    kv_u8_ptr,
    kv_bf16_ptr,
    kv_f32_ptr,
    idx_ptr,
    q_lo,
    q_hi,
    q_rope,
    k_lo,
    k_hi,
    k_rope,
    st_lo,
    st_hi,
    st_rope,
    st_sc,
    k_ready,
    k_empty,
    s_x,
    s_bar,
    out_ptr,
    lse_ptr,
    part_out_ptr,
    part_lse_ptr,
    pid_b,
    pid_h,
    pid_s,
    n_splits,
    H,
    max_splits,
    sm_scale_log2,
    stride_ib,
    t_start,
    t_end,
    n_tiles,
    HALF: gl.constexpr,
):
    qk_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_T, 16])
    pv_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    p_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=pv_l, k_width=2)
    m_i = gl.full([64], float("-inf"), gl.float32, layout=gl.SliceLayout(1, qk_l))
    l_i = gl.zeros([64], gl.float32, layout=gl.SliceLayout(1, qk_l))
    acc = gl.zeros([64, 256], gl.float32, layout=pv_l)
    zero_qk = gl.zeros([64, BLOCK_T], gl.float32, layout=qk_l)
    for i in range(n_tiles):
        slot = i % NBUF
        offs_t = t_start + i * BLOCK_T + gl.arange(0, BLOCK_T, layout=gl.SliceLayout(0, qk_l))
        idx = gl.load(idx_ptr + pid_b.to(gl.int64) * stride_ib + offs_t, mask=offs_t < t_end, other=-1)
        valid = idx >= 0
        mbarrier.wait(k_ready.index(slot), (i // NBUF) & 1)
        if SPLIT_QK:
            # each consumer takes its share of the 576 dims (lo + rope, or hi), and the two partial scores are
            # added through shared memory (a + b == b + a: both get the same scores, hence the same softmax)
            if HALF == 0:
                part = warpgroup_mma(q_lo, k_lo.index(slot).permute((1, 0)), zero_qk, use_acc=False, is_async=True)
                part = warpgroup_mma(q_rope, k_rope.index(slot).permute((1, 0)), part, is_async=True)
            else:
                part = warpgroup_mma(q_hi, k_hi.index(slot).permute((1, 0)), zero_qk, use_acc=False, is_async=True)
            part = warpgroup_mma_wait(0, deps=(part,))
            s_x.index(HALF * 2 + i % 2).store(part)
            gl.thread_barrier()  # the whole partial is in shared memory before the one-thread arrive
            mbarrier.arrive(s_bar.index(HALF), count=1)
            mbarrier.wait(s_bar.index(1 - HALF), i & 1)
            qk = part + s_x.index((1 - HALF) * 2 + i % 2).load(qk_l)
        else:
            qk = warpgroup_mma(q_lo, k_lo.index(slot).permute((1, 0)), zero_qk, use_acc=False, is_async=True)
            qk = warpgroup_mma(q_hi, k_hi.index(slot).permute((1, 0)), qk, is_async=True)
            qk = warpgroup_mma(q_rope, k_rope.index(slot).permute((1, 0)), qk, is_async=True)
            qk = warpgroup_mma_wait(0, deps=(qk,))
        s = gl.where(valid[None, :], qk * sm_scale_log2, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
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
    inv_l = 1.0 / gl.where(has, l_i, 1.0)
    o = acc * gl.convert_layout(inv_l, gl.SliceLayout(1, pv_l))[:, None]
    rows = pid_h * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, pv_l))
    cols = HALF * 256 + gl.arange(0, 256, layout=gl.SliceLayout(0, pv_l))
    bh = pid_b.to(gl.int64) * H + rows
    part = bh * max_splits + pid_s
    if n_splits == 1:
        gl.store(out_ptr + bh[:, None] * 512 + cols[None, :], o.to(gl.bfloat16))
    else:
        gl.store(part_out_ptr + part[:, None] * 512 + cols[None, :], o)
    if HALF == 0:
        lse2 = gl.where(has, m_i + gl.log2(gl.where(has, l_i, 1.0)), float("-inf"))
        rows_s = pid_h * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, qk_l))
        bh_s = pid_b.to(gl.int64) * H + rows_s
        if n_splits == 1:
            gl.store(lse_ptr + bh_s, lse2 * 0.6931471805599453)
        else:
            gl.store(part_lse_ptr + bh_s * max_splits + pid_s, lse2)


@gluon.jit
def _consumer_lo(
    kv_u8_ptr,
    kv_bf16_ptr,
    kv_f32_ptr,
    idx_ptr,
    q_lo,
    q_hi,
    q_rope,
    k_lo,
    k_hi,
    k_rope,
    st_lo,
    st_hi,
    st_rope,
    st_sc,
    k_ready,
    k_empty,
    s_x,
    s_bar,
    out_ptr,
    lse_ptr,
    part_out_ptr,
    part_lse_ptr,
    pid_b,
    pid_h,
    pid_s,
    n_splits,
    H,
    max_splits,
    sm_scale_log2,
    stride_ib,
    t_start,
    t_end,
    n_tiles,
):
    _consumer(
        kv_u8_ptr,
        kv_bf16_ptr,
        kv_f32_ptr,
        idx_ptr,
        q_lo,
        q_hi,
        q_rope,
        k_lo,
        k_hi,
        k_rope,
        st_lo,
        st_hi,
        st_rope,
        st_sc,
        k_ready,
        k_empty,
        s_x,
        s_bar,
        out_ptr,
        lse_ptr,
        part_out_ptr,
        part_lse_ptr,
        pid_b,
        pid_h,
        pid_s,
        n_splits,
        H,
        max_splits,
        sm_scale_log2,
        stride_ib,
        t_start,
        t_end,
        n_tiles,
        0,
    )


@gluon.jit
def _consumer_hi(
    kv_u8_ptr,
    kv_bf16_ptr,
    kv_f32_ptr,
    idx_ptr,
    q_lo,
    q_hi,
    q_rope,
    k_lo,
    k_hi,
    k_rope,
    st_lo,
    st_hi,
    st_rope,
    st_sc,
    k_ready,
    k_empty,
    s_x,
    s_bar,
    out_ptr,
    lse_ptr,
    part_out_ptr,
    part_lse_ptr,
    pid_b,
    pid_h,
    pid_s,
    n_splits,
    H,
    max_splits,
    sm_scale_log2,
    stride_ib,
    t_start,
    t_end,
    n_tiles,
):
    _consumer(
        kv_u8_ptr,
        kv_bf16_ptr,
        kv_f32_ptr,
        idx_ptr,
        q_lo,
        q_hi,
        q_rope,
        k_lo,
        k_hi,
        k_rope,
        st_lo,
        st_hi,
        st_rope,
        st_sc,
        k_ready,
        k_empty,
        s_x,
        s_bar,
        out_ptr,
        lse_ptr,
        part_out_ptr,
        part_lse_ptr,
        pid_b,
        pid_h,
        pid_s,
        n_splits,
        H,
        max_splits,
        sm_scale_log2,
        stride_ib,
        t_start,
        t_end,
        n_tiles,
        1,
    )


@gluon.jit(do_not_specialize=["B", "H", "topk", "max_splits"])
def sparse_mla_ws_split_kernel(
    q_ptr,
    kv_u8_ptr,
    kv_bf16_ptr,
    kv_f32_ptr,
    idx_ptr,
    out_ptr,
    lse_ptr,
    part_out_ptr,
    part_lse_ptr,
    B,
    H,
    topk,
    max_splits,
    sm_scale_log2,
    stride_qb,
    stride_qh,
    stride_ib,
):
    pid_b = gl.program_id(0)
    pid_h = gl.program_id(1)
    pid_s = gl.program_id(2)
    n_splits = gl.num_programs(2)

    # q tile [64, 576] bf16 into shared memory (three wgmma A operands), by the default warpgroup
    ql: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    lat: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    offs_h = pid_h * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, ql))
    qrow = q_ptr + pid_b.to(gl.int64) * stride_qb + offs_h[:, None] * stride_qh
    offs_c = gl.arange(0, 256, layout=gl.SliceLayout(0, ql))
    offs_e = gl.arange(0, 64, layout=gl.SliceLayout(0, ql))
    q_lo = gl.allocate_shared_memory(gl.bfloat16, [64, 256], lat, gl.load(qrow + offs_c[None, :]))
    q_hi = gl.allocate_shared_memory(gl.bfloat16, [64, 256], lat, gl.load(qrow + 256 + offs_c[None, :]))
    q_rope = gl.allocate_shared_memory(gl.bfloat16, [64, 64], lat, gl.load(qrow + 512 + offs_e[None, :]))

    k_lo = gl.allocate_shared_memory(gl.bfloat16, [NBUF, BLOCK_T, 256], lat)
    k_hi = gl.allocate_shared_memory(gl.bfloat16, [NBUF, BLOCK_T, 256], lat)
    k_rope = gl.allocate_shared_memory(gl.bfloat16, [NBUF, BLOCK_T, 64], lat)
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    if SWIZZLE_STAGING:
        st_lo = gl.allocate_shared_memory(gl.uint8, [NSTAGE, BLOCK_T, 256], gl.SwizzledSharedLayout(16, 1, 8, [1, 0]))
        st_hi = gl.allocate_shared_memory(gl.uint8, [NSTAGE, BLOCK_T, 256], gl.SwizzledSharedLayout(16, 1, 8, [1, 0]))
        st_rope = gl.allocate_shared_memory(gl.bfloat16, [NSTAGE, BLOCK_T, 64], gl.SwizzledSharedLayout(8, 1, 8, [1, 0]))
    else:
        st_lo = gl.allocate_shared_memory(gl.uint8, [NSTAGE, BLOCK_T, 256], flat)
        st_hi = gl.allocate_shared_memory(gl.uint8, [NSTAGE, BLOCK_T, 256], flat)
        st_rope = gl.allocate_shared_memory(gl.bfloat16, [NSTAGE, BLOCK_T, 64], flat)
    st_sc = gl.allocate_shared_memory(gl.float32, [NSTAGE, BLOCK_T, 4], flat)
    k_ready = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NBUF):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)
    if SPLIT_QK:
        # [consumer * 2 + tile parity]; 32-byte units XOR-swizzled over 4 rows: a warp's eight rows of a wgmma
        # accumulator fragment then store in 2 wavefronts, not 8 (row stride 128 B: every row on the same banks)
        xs_l: gl.constexpr = gl.SwizzledSharedLayout(8, 1, 4, [1, 0])
        s_x = gl.allocate_shared_memory(gl.float32, [4, 64, BLOCK_T], xs_l)
    else:
        s_x = gl.allocate_shared_memory(gl.float32, [1, 1], flat)  # unused
    s_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(s_bar.index(0), count=1)
    mbarrier.init(s_bar.index(1), count=1)
    fence_async_shared()

    tiles_per_split = gl.cdiv(gl.cdiv(topk, BLOCK_T), n_splits)
    t_start = pid_s * tiles_per_split * BLOCK_T
    t_end = gl.minimum(t_start + tiles_per_split * BLOCK_T, topk)
    n_tiles = gl.maximum(gl.cdiv(t_end - t_start, BLOCK_T), 0)

    args = (
        kv_u8_ptr,
        kv_bf16_ptr,
        kv_f32_ptr,
        idx_ptr,
        q_lo,
        q_hi,
        q_rope,
        k_lo,
        k_hi,
        k_rope,
        st_lo,
        st_hi,
        st_rope,
        st_sc,
        k_ready,
        k_empty,
        s_x,
        s_bar,
        out_ptr,
        lse_ptr,
        part_out_ptr,
        part_lse_ptr,
        pid_b,
        pid_h,
        pid_s,
        n_splits,
        H,
        max_splits,
        sm_scale_log2,
        stride_ib,
        t_start,
        t_end,
        n_tiles,
    )
    gl.warp_specialize(
        [(_consumer_lo, args), (_consumer_hi, args), (_producer, args)], [4, 4], [REGS_CONSUMER, REGS_PRODUCER]
    )


def resolve_splits(num_splits: int | str, B: int, H: int, topk: int, num_sms: int) -> int:
    """Split count for this kernel's tiles (``BLOCK_H`` 64, ``BLOCK_T``): the shipped kernel's rule
    (``kernels.sparse_mla_decode.resolve_num_splits``) with these tile sizes."""
    from kernels import sparse_mla_decode as smd

    return smd.resolve_num_splits(num_splits, B, H, topk, BLOCK_H, BLOCK_T.value, num_sms)


def sparse_mla_decode_ws(q, kv_cache, indices, page_size: int, sm_scale: float, num_splits: int | str = "auto"):  # noqa: ANN001, ANN201 - torch tensors; a probe launcher, not the product's
    """V3.2 decode through the warp-specialized split kernel and the shipped combine kernel.

    q bf16 [B, H, 576] (H a multiple of 64), kv_cache uint8 [num_pages, page_size * 656] (page_size must be
    this file's PAGE_SIZE), indices int32 [B, topk] (-1 = empty slot). Returns ``(out bf16 [B, H, 512], lse fp32
    [B, H])`` (natural-log LSE), like ``kernels.sparse_mla_decode.SparseMLADecode``. ``ValueError`` on a shape this
    candidate does not cover. No input checks beyond those (a probe).
    """
    import torch

    from kernels import sparse_mla_decode as smd

    B, H, d = q.shape
    topk = indices.shape[1]
    if d != 576 or H % BLOCK_H or page_size != PAGE_SIZE.value:
        raise ValueError(f"sparse_mla_decode_ws: V3.2 only, H % 64 == 0, page_size {PAGE_SIZE.value}; got {q.shape}")
    num_sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    n = resolve_splits(num_splits, B, H, topk, num_sms)
    out = torch.empty((B, H, 512), dtype=torch.bfloat16, device=q.device)
    lse = torch.empty((B, H), dtype=torch.float32, device=q.device)
    if n > 1:
        part_out = torch.empty((B, H, n, 512), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((B, H, n), dtype=torch.float32, device=q.device)
    else:
        part_out, part_lse = out, lse
    sparse_mla_ws_split_kernel[(B, H // BLOCK_H, n)](
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
        n,
        sm_scale * smd.LOG2E,
        q.stride(0),
        q.stride(1),
        indices.stride(0),
        num_warps=4,
        maxnreg=MAXNREG,
    )
    if n > 1:
        block_d = smd._combine_block_d(B * H, 512, num_sms)
        smd._sparse_mla_combine_kernel[(B * H, 512 // block_d)](
            part_out, part_lse, out, lse, n, n, D_V=512, BLOCK_S=smd._block_s(n), BLOCK_D=block_d, num_warps=4
        )
    return out, lse


# 12 warps x 32 threads x 168 = 64,512 of the SM's 65,536 registers: one CTA per SM, and setmaxnreg moves them
# between the partitions (REGS_* above; the default partition gets 3 x 168 - the workers')
MAXNREG = 168

"""The sparse MLA decode attention the embedded server calls, and its paged fp8 KV-cache writer.

``load_backend()`` imports the kernel module named by params.yaml's ``kernel.module``
(``kernels/sparse_mla_decode.py``: ``LAYOUTS``, ``quantize_kv_cache``, ``sparse_mla_decode_ref``,
``SparseMLADecode``, ``kernel_source_hash``). Until that module exists (or where it cannot be
imported) the torch fallback below stands in; it implements the same two cache layouts as
DESIGN.md describes them, so the server's cache bytes are real either way. The info endpoint says
which one runs (``attention_source``).

Writing one decode token into a page uses ``quantize_kv_cache(rows, layout, page_size=1)`` (one
token per "page": the token's full byte row) and scatters the row's bytes to the token's slot:

- deepseek_v32: tokens are contiguous 656-byte rows in a page.
- deepseek_v4: the 576 data bytes go to ``slot*576`` and the 8 scale bytes to
  ``page_size*576 + slot*8`` (all data rows first, then all scale rows).

:func:`check_writer` compares that scatter with ``quantize_kv_cache`` of a whole page at model
start, so a layout change in the kernel module fails loudly instead of corrupting the cache.
Indices are flat token ids into the pool: ``page * page_size + slot`` (-1 = empty slot).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from kernelcamp.errors import KernelcampError

FP8_MAX = 448.0


@dataclass(frozen=True)
class Layout:
    """A cache layout (fallback): sizes in elements and bytes per token."""

    name: str
    d_qk: int
    d_v: int
    token_bytes: int


FALLBACK_LAYOUTS = {
    "deepseek_v32": Layout("deepseek_v32", 576, 512, 656),
    "deepseek_v4": Layout("deepseek_v4", 512, 512, 584),
}
# (data bytes, scale bytes) per token for layouts whose page keeps data rows before scale rows.
SPLIT_ROWS = {"deepseek_v4": (576, 8)}


def _name(layout: Any) -> str:
    """Layouts are passed by name (the kernel module's API); a layout object is accepted too."""
    n = layout if isinstance(layout, str) else getattr(layout, "name", None)
    if n in FALLBACK_LAYOUTS:
        return n
    raise KernelcampError(f"unknown cache layout {layout!r}: expected one of {sorted(FALLBACK_LAYOUTS)}")


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8).reshape(t.shape[0], -1)


def fallback_quantize_kv_cache(latent: torch.Tensor, layout: Any, page_size: int) -> torch.Tensor:
    """latent [N, d_qk] (bf16/fp32) -> uint8 [ceil(N/page_size), page_size*token_bytes] (torch only)."""
    name = _name(layout)
    x = latent.float()
    n = x.shape[0]
    if name == "deepseek_v32":
        nope, rope = x[:, :512].reshape(n, 4, 128), x[:, 512:576]
        amax = nope.abs().amax(-1)
        scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))  # [n, 4] fp32
        q = (nope / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).reshape(n, 512)
        rows = torch.cat([_bytes(q), _bytes(scale), _bytes(rope.to(torch.bfloat16))], 1)  # [n, 656]
        data, scales = rows, None
    else:
        nope, rope = x[:, :448].reshape(n, 7, 64), x[:, 448:512]
        amax = nope.abs().amax(-1).clamp_min(1e-30)
        e = torch.ceil(torch.log2(amax / FP8_MAX)).clamp(-126, 127)  # stored e+127 in [1, 254]
        q = (nope / torch.exp2(e)[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).reshape(n, 448)
        data = torch.cat([_bytes(q), _bytes(rope.to(torch.bfloat16))], 1)  # [n, 576]
        scales = torch.cat([(e + 127).to(torch.uint8), torch.zeros(n, 1, dtype=torch.uint8, device=x.device)], 1)
    pages = math.ceil(n / page_size)
    pad = pages * page_size - n
    if pad:
        data = torch.cat([data, data.new_zeros(pad, data.shape[1])])
        scales = None if scales is None else torch.cat([scales, scales.new_zeros(pad, 8)])
    if scales is None:
        return data.reshape(pages, -1)
    return torch.cat([data.reshape(pages, -1), scales.reshape(pages, -1)], 1)


def dequantize_tokens(kv_cache: torch.Tensor, idx: torch.Tensor, layout: Any, page_size: int) -> torch.Tensor:
    """Gather and dequantize tokens: flat ids ``idx`` (any shape, >= 0) -> fp32 [..., d_qk]."""
    name = _name(layout)
    page, slot = idx // page_size, idx % page_size
    flat = kv_cache.reshape(kv_cache.shape[0], -1)
    if name == "deepseek_v32":
        rows = flat.reshape(flat.shape[0], page_size, 656)[page, slot]  # [..., 656]
        q = rows[..., :512].contiguous().view(torch.float8_e4m3fn).float().reshape(*idx.shape, 4, 128)
        scale = rows[..., 512:528].contiguous().view(torch.float32)  # [..., 4]
        rope = rows[..., 528:656].contiguous().view(torch.bfloat16).float()
        return torch.cat([(q * scale[..., None]).reshape(*idx.shape, 512), rope], -1)
    data = flat[:, : page_size * 576].reshape(flat.shape[0], page_size, 576)[page, slot]
    sc = flat[:, page_size * 576 :].reshape(flat.shape[0], page_size, 8)[page, slot][..., :7]
    q = data[..., :448].contiguous().view(torch.float8_e4m3fn).float().reshape(*idx.shape, 7, 64)
    scale = torch.exp2(sc.float() - 127.0)
    rope = data[..., 448:576].contiguous().view(torch.bfloat16).float()
    return torch.cat([(q * scale[..., None]).reshape(*idx.shape, 448), rope], -1)


def fallback_sparse_mla_decode_ref(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    layout: Any,
    page_size: int,
    sm_scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B,H,d_qk], indices [B,topk] int32 (-1 empty) -> (out fp32 [B,H,d_v], lse fp32 [B,H])."""
    lay = FALLBACK_LAYOUTS[_name(layout)]
    d_qk, d_v = lay.d_qk, lay.d_v
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(d_qk)
    valid = indices >= 0
    kv = dequantize_tokens(kv_cache, indices.clamp_min(0).long(), layout, page_size)  # [B, topk, d_qk]
    s = torch.einsum("bhd,btd->bht", q.float(), kv) * scale
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    out = torch.einsum("bht,btd->bhd", p, kv[..., :d_v])
    return out, lse


def _fallback_ref(q, kv_cache, indices, layout, page_size, sm_scale=None, check_indices=False):
    return fallback_sparse_mla_decode_ref(q, kv_cache, indices, layout, page_size, sm_scale)


def load_backend(kernel: dict[str, Any] | None) -> SimpleNamespace:
    """The kernel module (``source="kernel_module"``) or the torch fallback (``source="fallback"``)."""
    from kernelcamp.spec import import_kernel

    module = (kernel or {}).get("module", "kernels.sparse_mla_decode")
    try:
        mod = import_kernel(module)  # from this tree (the server runs in the tree it was deployed from)
        return SimpleNamespace(
            source="kernel_module",
            module=module,
            LAYOUTS=mod.LAYOUTS,
            quantize_kv_cache=mod.quantize_kv_cache,
            ref=mod.sparse_mla_decode_ref,
            SparseMLADecode=mod.SparseMLADecode,
            error=None,
        )
    except (KernelcampError, AttributeError) as e:
        return SimpleNamespace(
            source="fallback",
            module=module,
            LAYOUTS=FALLBACK_LAYOUTS,
            quantize_kv_cache=fallback_quantize_kv_cache,
            ref=_fallback_ref,
            SparseMLADecode=None,
            error=f"{type(e).__name__}: {e}",
        )


class CacheWriter:
    """Writes decode tokens' latents into a paged cache: ``write(cache, latent [N, d_qk], slots [N] int64)``.

    ``slots`` are flat token ids (page*page_size + slot). Uses only tensor ops (CUDA-graph safe when
    ``quantize`` is).
    """

    def __init__(self, quantize, layout: Any, page_size: int):
        """``layout``: a layout object of the backend (``.name``, ``.d_qk``, ``.token_bytes``)."""
        self.quantize, self.layout, self.page_size = quantize, layout, page_size
        self.name = _name(layout)
        self.token_bytes = layout.token_bytes

    def byte_index(self, slots: torch.Tensor) -> torch.Tensor:
        """[N, token_bytes] int64 offsets into the flattened cache for the tokens at ``slots``."""
        p = self.page_size
        page, slot = slots // p, slots % p
        page_bytes = p * self.token_bytes
        if self.name in SPLIT_ROWS:
            d, s = SPLIT_ROWS[self.name]
            ar_d = torch.arange(d, device=slots.device)
            ar_s = torch.arange(s, device=slots.device)
            data = page[:, None] * page_bytes + slot[:, None] * d + ar_d
            scale = page[:, None] * page_bytes + p * d + slot[:, None] * s + ar_s
            return torch.cat([data, scale], 1)
        ar = torch.arange(self.token_bytes, device=slots.device)
        return page[:, None] * page_bytes + slot[:, None] * self.token_bytes + ar

    def write(self, cache: torch.Tensor, latent: torch.Tensor, slots: torch.Tensor) -> None:
        rows = self.quantize(latent, self.name, 1).reshape(latent.shape[0], self.token_bytes)
        cache.view(-1).index_copy_(0, self.byte_index(slots).reshape(-1), rows.reshape(-1))


def check_writer(writer: CacheWriter, device: torch.device | str = "cpu") -> None:
    """Raise ``KernelcampError`` unless token-by-token writes reproduce ``quantize_kv_cache`` of a page."""
    p = writer.page_size
    g = torch.Generator(device="cpu").manual_seed(1)
    latent = torch.randn(p, writer.layout.d_qk, generator=g).to(device=device, dtype=torch.bfloat16)
    want = writer.quantize(latent, writer.name, p).reshape(-1)
    cache = torch.zeros(1, p * writer.token_bytes, dtype=torch.uint8, device=device)
    writer.write(cache, latent, torch.arange(p, device=device))
    if not torch.equal(cache.reshape(-1), want):
        raise KernelcampError(
            f"cache writer for layout {writer.name} does not reproduce quantize_kv_cache of a "
            "whole page: the layout in the kernel module changed; update kernelcamp/serving/"
            "attention.py SPLIT_ROWS"
        )

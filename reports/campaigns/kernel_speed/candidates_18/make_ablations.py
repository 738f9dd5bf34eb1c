"""Write the two ablations of the H=16 warp-specialized kernel (step "p2") that candidates 18 times.

    python reports/campaigns/kernel_speed/candidates_18/make_ablations.py [KERNEL_FILE] [OUT_DIR]

KERNEL_FILE defaults to kernels/sparse_mla_decode.py, OUT_DIR to kernels/. Writes ``cand16_prodonly.py`` (the
consumer keeps the ring's barrier protocol, waits on k_ready and arrives on k_empty, and skips everything else: the
index loads, S^T, the softmax, P^T and P.V: it times the two producers) and ``cand16_cononly.py`` (the producers keep
the protocol, wait on k_empty and arrive on k_ready, and skip their gathers, dequantization and stores: it times the
consumer on whatever the K ring holds). Each is the kernel file with one text replacement; their outputs are wrong by
design, only their times mean anything (as candidates 17's for the H=64 kernel). Raises SystemExit when the text to
replace is not in the file (the kernel changed: the replacement must be written again).
"""

from __future__ import annotations

import sys
from pathlib import Path

src_path = Path(sys.argv[1] if len(sys.argv) > 1 else "kernels/sparse_mla_decode.py")
out_dir = Path(sys.argv[2] if len(sys.argv) > 2 else "kernels")
src = src_path.read_text()


def between(text: str, start: str, end: str) -> str:
    """The text from ``start`` up to (not including) ``end``, both required, ``end`` after ``start``."""
    a = text.find(start)
    b = text.find(end, a)
    if a < 0 or b < 0:
        raise SystemExit(f"error: {start!r} ... {end!r} not found in {src_path}")
    return text[a:b]


# the consumer's per-slot math, from the index load to the P.V wait, in _ws16_consumer
con_body = between(
    src,
    "        offs_t = t_start + j * WS16_BLOCK_T + gl.arange(0, WS16_BLOCK_T, layout=gl.SliceLayout(1, acc_l))",
    "        gl.thread_barrier()  # every warp's wgmma reads of the tile (and of P^T) are done",
)
prodonly = src.replace(con_body, "        mbarrier.wait(k_ready.index(slot), (j // WS_NBUF) & 1)\n", 1)

# the producers' work, from their first index load to the end of their loop, in _ws16_producer
prod_body = between(
    src,
    "    ig = _ws_tile_idx(idx_ptr, ints, HALF, WS_GAT)\n    ir = _ws_tile_idx(idx_ptr, ints, HALF, WS_ROPE)",
    "\n\n@gluon.jit\ndef _ws16_producer_0(",
)
cononly = src.replace(
    prod_body,
    "    for j in range(gl.cdiv(n_tiles, 2)):\n"
    "        slot = j % WS_NBUF\n"
    "        mbarrier.wait(k_empty.index(slot), ((j // WS_NBUF) & 1) ^ 1)\n"
    "        fence_async_shared()\n"
    "        gl.thread_barrier()\n"
    "        mbarrier.arrive(k_ready.index(slot), count=1)",
    1,
)
for name, text in (("cand16_prodonly.py", prodonly), ("cand16_cononly.py", cononly)):
    if text == src:
        raise SystemExit(f"error: {name}: nothing replaced")
    (out_dir / name).write_text(text)
    print(f"wrote {out_dir / name}")

"""Probe: the warp-specialized Gluon candidate (kernels/sparse_mla_decode_ws.py) against the shipped V3.2 table.

    python benchmarks/ws_probe.py OUT_DIR MODULE [B ...]

MODULE: a candidate module with ``sparse_mla_decode_ws`` (e.g. kernels.sparse_mla_decode_ws), or ``shipped`` for
the shipped kernel's V3.2 table (conf/variant/tuned_deepseek_v32.yaml).

For each batch size (default 1 2 8 32 64 96 128) at V3.2 (H=128, top-k 2048, bench_kernel.py's inputs: 262,144
cache tokens, page 64): the candidate's output against the torch reference (max |error| of out and LSE, printed
next to the shipped kernel's), then both timed as bench_kernel.py times (CUDA-graph replays, L2 flushed, p50 of
``--replays``). Writes OUT_DIR/ws_probe.csv (one row per batch size and implementation) and prints one line per row.
Needs a CUDA GPU (sm90).
"""

from __future__ import annotations

import csv
import functools
import importlib
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import yaml  # noqa: E402

from kernelcamp.bench.timing import bench_graph, summarize  # noqa: E402
from kernelcamp.variant import parse_variant  # noqa: E402
from kernels import sparse_mla_decode as smd  # noqa: E402

LAYOUT, H, TOPK, PAGE, TOKENS = "deepseek_v32", 128, 2048, 64, 262144


def main(argv: list[str]) -> int:
    out_dir = Path(argv[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    module = argv[1]
    batches = [int(b) for b in argv[2:]] or [1, 2, 8, 32, 64, 96, 128]
    if module == "shipped":
        table = parse_variant(yaml.safe_load(Path("conf/variant/tuned_deepseek_v32.yaml").read_text()))
        shipped = smd.SparseMLADecode(table, check_indices=False)
    else:
        ws = importlib.import_module(module)
    rows = []
    for B in batches:
        x = smd.make_inputs(LAYOUT, B, H, TOPK, PAGE, TOKENS, "cuda", empty_fraction=0.05 if B == 2 else 0.0)
        q, kv, idx, sc = x["q"], x["kv_cache"], x["indices"], x["sm_scale"]
        ro, rl = smd.sparse_mla_decode_ref(q, kv, idx, LAYOUT, PAGE, sc, check_indices=False)
        if module == "shipped":
            fn = functools.partial(shipped, q, kv, idx, LAYOUT, PAGE, sc)
        else:
            fn = functools.partial(ws.sparse_mla_decode_ws, q, kv, idx, PAGE, sc)
        for name in (module,):
            row = {"B": B, "impl": name}
            try:
                o, lse = fn()
                torch.cuda.synchronize()
                row["max_abs_err_out"] = float((o.float() - ro).abs().max())
                fin = torch.isfinite(rl)
                row["max_abs_err_lse"] = float((lse[fin] - rl[fin]).abs().max()) if fin.any() else 0.0
                row["lse_inf_match"] = bool(torch.equal(torch.isinf(lse), torch.isinf(rl)))
                s = summarize(bench_graph(fn, replays=20, warmup=2, calls_per_graph=4))
                row.update(s)
                row["tflops"] = smd.flops(LAYOUT, B, H, TOPK) / (s["latency_us_p50"] * 1e-6) / 1e12
            except Exception as e:  # noqa: BLE001 - a candidate that fails is a result
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
                traceback.print_exc()
                torch.cuda.synchronize()
            rows.append(row)
            print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
        with (out_dir / "ws_probe.csv").open("w", newline="") as f:
            keys = sorted({k for r in rows for k in r}, key=lambda k: (k not in ("B", "impl"), k))
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

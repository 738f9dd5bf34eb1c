"""Two launches of a warp-specialized candidate at V3.2 (bench_kernel.py's inputs), for Nsight Compute:

    ncu -k regex:ws_split --launch-skip 1 --launch-count 1 ... python benchmarks/ws_one_launch.py MODULE B
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from kernels import sparse_mla_decode as smd  # noqa: E402

if __name__ == "__main__":
    mod = importlib.import_module(sys.argv[1])
    x = smd.make_inputs("deepseek_v32", int(sys.argv[2]), 128, 2048, 64, 262144, "cuda")
    for _ in range(2):
        mod.sparse_mla_decode_ws(x["q"], x["kv_cache"], x["indices"], 64, x["sm_scale"])
    torch.cuda.synchronize()

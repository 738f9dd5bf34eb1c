"""One profiled launch of a kernel module's split-K kernel, for Nsight Compute (issue 14):

    ncu -k regex:_sparse_mla_split_kernel --launch-skip 1 --launch-count 1 [sections] -o REPORT
        python benchmarks/ncu_one_launch.py MODULE FAMILY CONFIG_LABEL B   (one command line)

MODULE: a kernel module with the API of kernels.sparse_mla_decode; FAMILY: a bench_kernel family
(v32, v32_tp8, v4_flash); CONFIG_LABEL: e.g. T64_H64_w8_s2_kauto. The same inputs as
benchmarks/bench_kernel.py (make_inputs, its cache size and page size) are launched twice: the first
launch compiles, the second is the one to profile (hence --launch-skip 1). Needs a CUDA GPU.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.bench_kernel import FAMILIES  # noqa: E402
from kernelcamp.variant import LaunchConfig, Variant  # noqa: E402

# bench_kernel.py's --num-cache-tokens and --page-size defaults: the cache the grid figures come from
NUM_CACHE_TOKENS, PAGE_SIZE = 262144, 64


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    module, fam, label, b = argv
    mod = importlib.import_module(module)
    layout, H, topk = FAMILIES[fam]
    cfg = LaunchConfig.from_label(label)
    x = mod.make_inputs(layout, int(b), H, topk, PAGE_SIZE, NUM_CACHE_TOKENS, "cuda")
    launcher = mod.SparseMLADecode(Variant(label, (cfg,)), check_indices=False)
    for _ in range(2):
        launcher(x["q"], x["kv_cache"], x["indices"], layout, PAGE_SIZE, x["sm_scale"])
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

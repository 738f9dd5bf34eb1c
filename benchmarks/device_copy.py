"""Measure the GPU's device-to-device copy bandwidth: the figure conf/target files use as ``peak_gbps`` where a
measured one is given (sm90.yaml's 4,250 GB/s on the lent H200, DESIGN.md).

    python benchmarks/device_copy.py [--gib 4] [--iters 20] [--out copy.json]

A ``torch.Tensor.copy_`` of ``--gib`` GiB between two device buffers, timed with CUDA events after a warm-up; the
bandwidth counts both the bytes read and the bytes written (2 x size / time), in GB/s (1e9 B/s). Prints the GPU's
name (``torch.cuda.get_device_name``, what conf/target's ``gpu`` must equal), the median and the best of the
iterations, and writes them with the versions and the date as JSON to ``--out`` when given. Exit 2 without a CUDA
GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gib", type=float, default=4.0, help="size of each buffer in GiB (default 4)")
    p.add_argument("--iters", type=int, default=20, help="timed copies (default 20)")
    p.add_argument("--out", default="", help="write the figures as JSON here too")
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("error: device_copy.py needs a CUDA GPU (none visible)", file=sys.stderr)
        return 2
    if args.gib <= 0 or args.iters < 1:
        print("error: --gib must be > 0 and --iters >= 1", file=sys.stderr)
        return 2
    n = int(args.gib * 2**30)
    src = torch.empty(n, dtype=torch.uint8, device="cuda").fill_(1)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    gbps = []
    for _ in range(args.iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        gbps.append(2 * n / (a.elapsed_time(b) * 1e-3) / 1e9)
    res = {
        "gpu": torch.cuda.get_device_name(),
        "bytes_per_buffer": n,
        "iters": args.iters,
        "copy_gbps_read_plus_write_median": round(statistics.median(gbps), 1),
        "copy_gbps_read_plus_write_best": round(max(gbps), 1),
        "torch": torch.__version__,
        "measured_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    print(json.dumps(res))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

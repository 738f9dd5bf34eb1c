"""Where one decode call's time goes: per-kernel device time and the launch gaps (issue 14, B=1 latency).

    python benchmarks/kernel_breakdown.py OUT.json MODULE FAMILY:CONFIG:B [FAMILY:CONFIG:B ...]

MODULE: a kernel module with the API of kernels.sparse_mla_decode (e.g. kernels.sparse_mla_decode);
FAMILY: a bench_kernel family (v32, v32_tp8, v4_flash); CONFIG: a config label, e.g.
T64_H64_w8_s2_kauto. For each point the same inputs as benchmarks/bench_kernel.py are built, the call
is captured in a CUDA graph after an L2 flush (as kernelcamp.bench.timing does), and ``replays``
replays are profiled with the torch profiler (CUDA activity). Reported per point, in microseconds
(median over replays): each kernel's device duration, ``gap_us`` (from the end of the split kernel to
the start of the combine: negative when the two overlap, as with programmatic dependent launch) and
``span_us`` (from the start of the split kernel to the end of the last kernel). The profiler's clock
is CUPTI's; the span is a device interval, not the benchmark's event-timed per-call figure. Needs a
CUDA GPU; writes OUT.json and prints one line per point.
"""

from __future__ import annotations

import importlib
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.bench_kernel import FAMILIES  # noqa: E402
from kernelcamp.bench.timing import GraphTimer  # noqa: E402
from kernelcamp.variant import LaunchConfig, Variant  # noqa: E402

NUM_CACHE_TOKENS, PAGE_SIZE = 262144, 64  # bench_kernel.py's defaults


def point(mod, fam: str, label: str, B: int, replays: int = 20) -> dict:  # noqa: ANN001 - a kernel module
    """One point: ``{family, config, B, replays, split_us, combine_us, gap_us, span_us}`` (microseconds,
    medians over ``replays`` CUDA-graph replays; ``combine_us`` and ``gap_us`` only when the config runs
    more than one split). Raises what the launcher raises on bad input; needs CUDA (``main`` checks)."""
    layout, H, topk = FAMILIES[fam]
    x = mod.make_inputs(layout, B, H, topk, PAGE_SIZE, NUM_CACHE_TOKENS, "cuda")
    launcher = mod.SparseMLADecode(Variant(label, (LaunchConfig.from_label(label),)), check_indices=False)
    # the benchmark's own graph: one L2 flush, then the call (kernelcamp.bench.timing.GraphTimer); the timer
    # stays referenced while its graph replays (the graph writes into the timer's flush buffer)
    timer = GraphTimer(
        lambda: launcher(x["q"], x["kv_cache"], x["indices"], layout, PAGE_SIZE, x["sm_scale"]),
        calls_per_graph=1,
        warmup=3,
    )
    g = timer.graph
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            g.replay()
        torch.cuda.synchronize()
    kern = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and "_sparse_mla" in e.name]
    kern.sort(key=lambda e: e.time_range.start)
    split = [e for e in kern if "split" in e.name]
    comb = [e for e in kern if "combine" in e.name]
    out = {"family": fam, "config": label, "B": B, "replays": len(split)}
    out["split_us"] = statistics.median(e.time_range.elapsed_us() for e in split)
    if comb and len(comb) == len(split):
        out["combine_us"] = statistics.median(e.time_range.elapsed_us() for e in comb)
        out["gap_us"] = statistics.median(
            c.time_range.start - s.time_range.end for s, c in zip(split, comb, strict=True)
        )
        out["span_us"] = statistics.median(
            c.time_range.end - s.time_range.start for s, c in zip(split, comb, strict=True)
        )
    else:
        out["span_us"] = out["split_us"]
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    dest, module, points = argv[0], argv[1], argv[2:]
    parsed = []
    for p in points:  # every point checked before the first is measured
        fam, _, rest = p.partition(":")
        label, _, b = rest.partition(":")
        try:
            if fam not in FAMILIES:
                raise ValueError(f"family {fam!r}: expected one of {list(FAMILIES)}")
            LaunchConfig.from_label(label)
            parsed.append((fam, label, int(b)))
        except ValueError as e:
            print(
                f"error: point {p!r}: {e} (expected FAMILY:CONFIG:B, e.g. v32:T64_H64_w8_s2_kauto:1)", file=sys.stderr
            )
            return 2
    try:  # the module is checked before the GPU, so that a bad name is refused on any machine
        mod = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - ImportError, or the module's own error at import (a SyntaxError, ...)
        print(f"error: module {module!r}: cannot import it ({type(e).__name__}: {e})", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: kernel_breakdown.py needs a CUDA GPU (none visible)", file=sys.stderr)
        return 2
    rows = []
    for fam, label, b in parsed:
        r = point(mod, fam, label, b)
        r["module"] = module
        rows.append(r)
        print(json.dumps(r), flush=True)
        Path(dest).write_text(json.dumps(rows, indent=1) + "\n")  # after every point: a cut run keeps its rows
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

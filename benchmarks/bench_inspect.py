"""Benchmark: inspect the story's 3 configs for 2 targets (sm120, sm90) cold and warm.

    python benchmarks/bench_inspect.py [--out reports/inspect_bench]

Cold = empty kernelcamp cache and empty Triton cache (TRITON_CACHE_DIR in a fresh temp dir, set
before triton is imported); warm = the same inspection again (no triton.compile). Targets (issue 3):
cold < 30 s, warm < 2 s. Writes results.md and results.json with the machine, Triton version, date.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Run as a script: a fresh temp folder, its Triton cache and the real JIT (interpreter mode cannot compile), set
# before triton is imported. An import (a test) leaves the process environment alone: dropping
# TRITON_INTERPRET there switched the rest of a test session off the interpreter (stages/build.py once did).
TMP = Path(tempfile.mkdtemp(prefix="bench_inspect_")) if __name__ == "__main__" else None
if TMP is not None:
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ["TRITON_CACHE_DIR"] = str(TMP / "triton")
sys.path.insert(0, str(ROOT))

from kernelcamp.inspect import cli as ki  # noqa: E402 - its namespace has what this script uses
from kernelcamp.io import write_json_atomic, write_text_atomic  # noqa: E402
from kernelcamp.provenance import now_utc  # noqa: E402
from kernelcamp.targets import load_target  # noqa: E402
from kernelcamp.variant import parse_variant  # noqa: E402


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "reports" / "inspect_bench"))
    args = ap.parse_args()
    t0 = time.perf_counter()
    module = ki.kernel_module("kernels.sparse_mla_decode")
    import_s = time.perf_counter() - t0
    variant = parse_variant(ki._load_yaml(ROOT / "conf" / "variant" / "story_autotune.yaml"))
    workload = ki._load_yaml(ROOT / "conf" / "workload" / "deepseek_v4_flash.yaml")
    specs_for = ki.specs_for_workload(module, workload)
    targets = [load_target("sm120"), load_target("sm90")]
    cache = TMP / "kernelcamp"
    runs = {}
    for phase in ("cold", "warm"):
        t = time.perf_counter()
        rows = ki.inspect_configs(variant.configs, targets, specs_for, is_list=True, cache_root=cache)
        runs[phase] = {"seconds": round(time.perf_counter() - t, 3), "compiles": sum(not r["cached"] for r in rows)}
    result = {
        "what": "kernelcamp.inspect.inspect_configs: story_autotune (3 configs x 2 kernels) for sm120 + sm90",
        "machine": f"CPU only: {_cpu()}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "triton": ki.triton_version(),
        "date": now_utc(),
        "workload": workload["name"],
        "import_s": round(import_s, 3),
        **{f"{k}_s": v["seconds"] for k, v in runs.items()},
        **{f"{k}_compiles": v["compiles"] for k, v in runs.items()},
        "targets_s": {"cold": 30, "warm": 2},
        "rows": [
            {
                k: r[k]
                for k in (
                    "target",
                    "config",
                    "kernel",
                    "shared_bytes",
                    "registers",
                    "spill_bytes",
                    "stack_bytes",
                    "ctas_per_sm",
                    "warps_per_sm",
                    "limited_by",
                    "fits",
                )
            }
            for r in rows
        ],
    }
    out = Path(args.out)
    write_json_atomic(out / "results.json", result)
    lines = [
        "# Compile inspection benchmark (CPU)",
        "",
        f"{result['what']}; workload {result['workload']}.",
        f"Machine: {result['machine']}; Python {result['python']}; Triton {result['triton']}; {result['date']}.",
        "Cold: empty kernelcamp cache and empty Triton cache. Warm: the same call again (no triton.compile).",
        "",
        "| phase | seconds | compiles | target |",
        "|---|---|---|---|",
        f"| cold | {result['cold_s']} | {result['cold_compiles']} | < 30 s |",
        f"| warm | {result['warm_s']} | {result['warm_compiles']} | < 2 s |",
        "",
        f"Importing the kernel module (torch, triton): {result['import_s']} s, not counted above.",
        "",
        "| target | config | kernel | shared B | regs | spill B | stack B | CTAs/SM | warps/SM | limited by | fits |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *["| " + " | ".join(str(r[k]) for k in result["rows"][0]) + " |" for r in result["rows"]],
        "",
    ]
    write_text_atomic(out / "results.md", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()

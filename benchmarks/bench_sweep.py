"""Sweep scaling (issue 7): the same queued sweep on one GPU, then on several, one worker per GPU.

    python benchmarks/bench_sweep.py --gpus 0,1 --out /tmp/sweep_bench
    python benchmarks/bench_sweep.py --gpus 0,1 --variants bt16_w4,bt16_w8 -S benchmark.kernel.rounds=5 --out DIR

Queues one experiment per variant (``dvc exp run --queue -S variant=<v>`` plus the light overrides
below), drains the queue with ``kernelcamp sweep --gpus <first GPU>`` and times it, queues the same
experiments again and drains them with ``kernelcamp sweep --gpus <all>``. Writes ``<out>/sweep.csv``
(one row per variant, mode and batch size: the candidate's kernel latency p50 and the A/B ratio)
and ``<out>/summary.md`` (wall times, speed-up, per-variant differences between the two modes
against the run-to-run noise of the interleaved rounds). Run from a DVC repo on a GPU machine.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kernelcamp.provenance import device_info, git_info, now_utc  # noqa: E402

# Kernel level only, a few batch sizes: the sweep's cost is then mostly each experiment's own
# start-up (compiles, server start), which is what parallel workers save.
LIGHT = [
    "benchmark.serving.enabled=false",
    "verify.serving.enabled=false",
    "benchmark.profile.enabled=false",
    "server.cuda_graphs=false",
    "benchmark.kernel.rounds=5",
    "workload.batch_sizes=[1,96]",
]


def queue(variants: list[str], tag: str, overrides: list[str]) -> dict[str, str]:
    names = {}
    for v in variants:
        name = f"{v}-{tag}"
        cmd = ["dvc", "exp", "run", "--queue", "-n", name, "-S", f"variant={v}"]
        for o in overrides:
            cmd += ["-S", o]
        subprocess.run(cmd, check=True, cwd=ROOT)
        names[v] = name
    return names


def sweep(gpus: list[str]) -> tuple[float, int]:
    t0 = time.monotonic()
    rc = subprocess.run(
        [sys.executable, "-m", "kernelcamp.cli", "sweep", "--gpus", ",".join(gpus), "--poll", "15"], cwd=ROOT
    ).returncode
    return time.monotonic() - t0, rc


def exp_metrics() -> dict[str, dict]:
    shown = json.loads(
        subprocess.run(["dvc", "exp", "show", "--json"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    )
    out = {}
    for b in shown:
        for e in b.get("experiments") or []:
            for r in e.get("revs") or []:
                data = (r.get("data") or {}).get("metrics") or {}
                m = (data.get("reports/benchmark_metrics.json") or {}).get("data")
                if r.get("name") and m:
                    out[r["name"]] = m
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", required=True, help="comma list of GPU ids; the first alone is the one-GPU run")
    ap.add_argument("--variants", default="bt16_w4,bt16_w8,tuned_deepseek_v4_flash,planted_slow")
    ap.add_argument("-S", dest="overrides", action="append", default=[], help="extra -S override (repeatable)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    gpus = [g for g in args.gpus.split(",") if g]
    variants = [v for v in args.variants.split(",") if v]
    overrides = LIGHT + args.overrides
    stamp = time.strftime("%H%M%S")
    runs = {}
    for mode, use in (("1gpu", gpus[:1]), (f"{len(gpus)}gpu", gpus)):
        names = queue(variants, f"{mode}-{stamp}", overrides)
        wall, rc = sweep(use)
        runs[mode] = {"names": names, "wall_s": wall, "rc": rc, "gpus": use}
        print(f"[bench_sweep] {mode}: {len(variants)} experiments in {wall:.1f} s (rc {rc})", flush=True)
    metrics = exp_metrics()
    rows = []
    for mode, r in runs.items():
        for v, name in r["names"].items():
            m = (metrics.get(name) or {}).get("kernel") or {}
            for key, fig in m.items():
                if key.startswith("b") and key[1:].isdigit() and isinstance(fig, dict):
                    rows.append(
                        {
                            "variant": v,
                            "mode": mode,
                            "experiment": name,
                            "batch": int(key[1:]),
                            "candidate_latency_us_p50": fig.get("candidate_latency_us_p50"),
                            "candidate_latency_us_p20": fig.get("candidate_latency_us_p20"),
                            "candidate_latency_us_p80": fig.get("candidate_latency_us_p80"),
                            "ab_ratio": fig.get("ab_ratio"),
                        }
                    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "sweep.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["variant"])
        w.writeheader()
        w.writerows(rows)
    info = device_info()
    modes = list(runs)
    one, many = runs[modes[0]], runs[modes[1]]
    lines = [
        "# Sweep scaling: one worker per GPU (kernelcamp sweep)",
        "",
        f"{len(gpus)} x {info.get('gpu_name')}, driver {info.get('driver')}, torch {info.get('torch')}, "
        f"Triton {info.get('triton')}; {now_utc()}; git {git_info(ROOT).get('git_commit')}.",
        f"Variants: {', '.join(variants)}; overrides: {' '.join(overrides)}.",
        "",
        "| mode | GPUs | experiments | wall s | exit |",
        "|---|---|---|---|---|",
        *(
            f"| {m} | {','.join(r['gpus'])} | {len(r['names'])} | {r['wall_s']:.1f} | {r['rc']} |"
            for m, r in runs.items()
        ),
        "",
        f"Speed-up {one['wall_s'] / many['wall_s']:.2f}x (ideal {len(gpus)}x).",
        "",
        "| variant | batch | p50 us (1 GPU) | p20-p80 (1 GPU) | p50 us (all GPUs) | p20-p80 (all GPUs) "
        "| diff % | within noise |",
        "|---|---|---|---|---|---|---|---|",
    ]
    by = {(r["variant"], r["mode"], r["batch"]): r for r in rows}
    for v in variants:
        for b in sorted({r["batch"] for r in rows if r["variant"] == v}):
            a, c = by.get((v, modes[0], b)), by.get((v, modes[1], b))
            if not a or not c or a["candidate_latency_us_p50"] is None or c["candidate_latency_us_p50"] is None:
                lines.append(f"| {v} | {b} | missing | | | | | |")
                continue
            diff = 100 * (c["candidate_latency_us_p50"] / a["candidate_latency_us_p50"] - 1)
            # noise: each run's own p20-p80 spread of the interleaved rounds; overlap means within noise
            overlap = (
                a["candidate_latency_us_p20"] <= c["candidate_latency_us_p80"]
                and c["candidate_latency_us_p20"] <= a["candidate_latency_us_p80"]
            )
            lines.append(
                f"| {v} | {b} | {a['candidate_latency_us_p50']:.2f} | {a['candidate_latency_us_p20']:.2f}-"
                f"{a['candidate_latency_us_p80']:.2f} | {c['candidate_latency_us_p50']:.2f} | "
                f"{c['candidate_latency_us_p20']:.2f}-{c['candidate_latency_us_p80']:.2f} | {diff:+.2f} | "
                f"{'yes' if overlap else 'no'} |"
            )
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    (out / "runs.json").write_text(json.dumps({"runs": runs, "provenance": info}, indent=2, default=str))
    print("\n".join(lines))
    return 0 if all(r["rc"] == 0 for r in runs.values()) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())

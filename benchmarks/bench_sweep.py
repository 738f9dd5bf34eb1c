"""Sweep scaling (issue 7): the same queued sweep on one GPU, then on several, one worker per GPU.

    python benchmarks/bench_sweep.py --gpus 0,1 --out /tmp/sweep_bench
    python benchmarks/bench_sweep.py --gpus 0,1 --variants bt16_w4,bt16_w8 -S benchmark.kernel.rounds=5 --out DIR
    python benchmarks/bench_sweep.py --gpus 0 --modes one --out DIR     # the halves one at a time,
    python benchmarks/bench_sweep.py --gpus 0,1 --modes all --out DIR   # e.g. in two device calls

Queues one experiment per variant (``dvc exp run --queue -S variant=<v>`` plus the light overrides
below), drains the queue with ``kernelcamp sweep --gpus <first GPU>`` and times it, queues the same
experiments again and drains them with ``kernelcamp sweep --gpus <all>``. Each half writes
``<out>/mode-<N>gpu.json`` (wall time, exit code, provenance, per-variant rows); once both exist it
writes ``<out>/sweep.csv``
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
    """{experiment name: its reports/benchmark_metrics.json}, read from each experiment's commit (the
    file is a plain output, not a DVC metric: ``dvc exp show`` lists only the headline)."""
    from kernelcamp.campaign import exp_ref

    shown = json.loads(
        subprocess.run(["dvc", "exp", "show", "--json"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    )
    names = {r["name"] for b in shown for e in b.get("experiments") or [] for r in e.get("revs") or [] if r.get("name")}
    out = {}
    for name in sorted(names):
        r = subprocess.run(
            ["git", "show", f"{exp_ref(ROOT, name)}:reports/benchmark_metrics.json"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        if r.returncode == 0:
            out[name] = json.loads(r.stdout)
    return out


def mode_rows(variants: dict[str, str], mode: str, metrics: dict[str, dict]) -> list[dict]:
    """One row per (variant, batch size) of one mode's experiments: the candidate's kernel figures."""
    rows = []
    for v, name in variants.items():
        m = (metrics.get(name) or {}).get("kernel") or {}
        for key, fig in m.items():  # kernelcamp.metrics names: kernel.b<B>.candidate.latency_us_p50, ...
            if key.startswith("b") and key[1:].isdigit() and isinstance(fig, dict):
                cand, ab = fig.get("candidate") or {}, fig.get("ab") or {}
                rows.append(
                    {
                        "variant": v,
                        "mode": mode,
                        "experiment": name,
                        "batch": int(key[1:]),
                        "candidate_latency_us_p50": cand.get("latency_us_p50"),
                        "candidate_latency_us_p20": cand.get("latency_us_p20"),
                        "candidate_latency_us_p80": cand.get("latency_us_p80"),
                        "ab_ratio": ab.get("ratio"),
                    }
                )
    return rows


def summarize(out: Path) -> int:
    """Write ``sweep.csv`` and ``summary.md`` in ``out`` from its ``mode-1gpu.json`` and ``mode-<N>gpu.json``.

    Raises ``SystemExit`` naming the missing file when either mode has not been run into ``out``.
    """
    found = sorted(out.glob("mode-*gpu.json"), key=lambda p: int(p.stem[5:-3]))
    if len(found) < 2 or found[0].stem != "mode-1gpu":
        raise SystemExit(f"{out}: need mode-1gpu.json and one mode-<N>gpu.json (run --modes one and --modes all)")
    done = [json.loads(p.read_text()) for p in (found[0], found[-1])]
    one, many = done
    variants = list(one["variants"])
    rows = one["rows"] + many["rows"]
    with open(out / "sweep.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["variant"])
        w.writeheader()
        w.writerows(rows)
    info = one["provenance"]
    modes = [one["mode"], many["mode"]]
    lines = [
        "# Sweep scaling: one worker per GPU (kernelcamp sweep)",
        "",
        f"{info.get('gpu_name')}: GPU(s) {','.join(one['gpus'])} for one worker, {','.join(many['gpus'])} for one "
        f"worker per GPU; driver {info.get('driver')}, torch {info.get('torch')}, Triton {info.get('triton')}; "
        f"git {one.get('git_commit')}.",
        f"Variants: {', '.join(variants)}; overrides: {' '.join(one['overrides'])}.",
        "",
        "| mode | GPUs | experiments | started (UTC) | wall s | exit |",
        "|---|---|---|---|---|---|",
        *(
            f"| {r['mode']} | {','.join(r['gpus'])} | {len(r['variants'])} | {r['started']} | {r['wall_s']:.1f} "
            f"| {r['rc']} |"
            for r in done
        ),
        "",
        f"Speed-up {one['wall_s'] / many['wall_s']:.2f}x (ideal {len(many['gpus'])}x).",
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
    print("\n".join(lines))
    return 0 if all(r["rc"] == 0 for r in done) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", help="comma list of GPU ids; the first alone is the one-GPU run")
    ap.add_argument("--variants", default="bt16_w4,bt16_w8,tuned_deepseek_v4_flash,planted_slow")
    ap.add_argument("-S", dest="overrides", action="append", default=[], help="extra -S override (repeatable)")
    ap.add_argument(
        "--modes",
        choices=["both", "one", "all"],
        default="both",
        help="one: the sweep on the first GPU only; all: on every GPU; both: one, then all [default: both]. "
        "Each writes <out>/mode-<N>gpu.json; the summary is written once both exist.",
    )
    ap.add_argument("--summarize", action="store_true", help="only (re)write the summary from <out>/mode-*.json")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.summarize:
        return summarize(out)
    if not args.gpus:
        ap.error("--gpus is required to run a sweep")
    gpus = [g for g in args.gpus.split(",") if g]
    variants = [v for v in args.variants.split(",") if v]
    overrides = LIGHT + args.overrides
    stamp = time.strftime("%H%M%S")
    plan = {"one": [gpus[:1]], "all": [gpus], "both": [gpus[:1], gpus]}[args.modes]
    rc_all = 0
    for use in plan:
        mode = f"{len(use)}gpu"
        names = queue(variants, f"{mode}-{stamp}", overrides)
        started = now_utc()
        wall, rc = sweep(use)
        rc_all |= rc
        print(f"[bench_sweep] {mode}: {len(variants)} experiments in {wall:.1f} s (rc {rc})", flush=True)
        record = {
            "mode": mode,
            "gpus": use,
            "variants": names,
            "overrides": overrides,
            "started": started,
            "wall_s": wall,
            "rc": rc,
            "rows": mode_rows(names, mode, exp_metrics()),
            "git_commit": git_info(ROOT).get("git_commit"),
            "provenance": {**device_info(), "gpu_count": len(gpus)},
        }
        (out / f"mode-{mode}.json").write_text(json.dumps(record, indent=2, default=str))
    if len(list(out.glob("mode-*gpu.json"))) >= 2 and (out / "mode-1gpu.json").exists():
        return summarize(out) | rc_all
    return rc_all


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())

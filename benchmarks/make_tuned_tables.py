"""Write a tuned batch-table variant (conf/variant/<name>.yaml) from a bench_kernel.py grid.

    python benchmarks/make_tuned_tables.py --grid reports/campaigns/kernel_speed/grid_1/v32.csv \\
        --family v32 --name tuned_deepseek_v32 [--out conf/variant]

For each batch size the grid measured, the config with the lowest median latency wins (rows with an
error or without a latency are skipped). The table's rows are those winners in batch order, each
with ``max_batch`` = its batch size, the last row (largest batch) without it; neighbouring rows with
the same config merge (the larger bound stays), and a table of one row is written as a single
config. A batch between two measured sizes runs the row of the next larger measured size. The file's
header comment names the grid, its GPU, versions, date and commit, and the measured latency of every
row, so the table can be traced to the run that made it.

A row with an explicit split count launches ``B * cdiv(H, BLOCK_H) * splits`` programs, so the count that
won at its measured batch size can leave most SMs idle at a batch half that size, which the row also runs
(grid_4's TP8 B=128 winner, 2 splits, ran B=64 in 99.4 us where 4 splits took 71.5 us:
reports/campaigns/kernel_speed/README.md, step "table4"). Each such row whose range reaches half its
measured batch size or less is named in a ``warning:`` line on stderr (``Variant.coverage``, as the
benchmark's report names them); the table is still written. """

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernelcamp.variant import parse_variant  # noqa: E402

LAUNCH = ("BLOCK_T", "BLOCK_H", "num_warps", "num_stages")


def _splits(label: str) -> int | str:
    k = label.rsplit("_k", 1)[1]
    return "auto" if k == "auto" else int(k)


def best_per_batch(rows: list[dict[str, str]], family: str) -> list[dict[str, Any]]:
    """The fastest config per batch size of ``family``: ``[{B, config, p50_us, row}]`` sorted by B.

    Raises ``ValueError`` when the grid has no timed row of ``family``.
    """
    timed = [r for r in rows if r.get("family") == family and r.get("impl") == "triton" and r.get("latency_us_p50")]
    timed = [r for r in timed if not r.get("error") and math.isfinite(float(r["latency_us_p50"]))]
    if not timed:
        raise ValueError(f"no timed triton rows of family {family!r} in the grid")
    best: dict[int, dict[str, str]] = {}
    for r in timed:
        B = int(r["B"])
        if B not in best or float(r["latency_us_p50"]) < float(best[B]["latency_us_p50"]):
            best[B] = r
    return [
        {"B": B, "config": best[B]["config"], "p50_us": float(best[B]["latency_us_p50"]), "row": best[B]}
        for B in sorted(best)
    ]


def table_rows(winners: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The batch table's config rows from the per-batch winners (see the module docstring)."""
    rows: list[dict[str, Any]] = []
    for w in winners:
        r = w["row"]
        cfg = {k: int(r[k]) for k in LAUNCH}
        cfg["num_splits"] = _splits(w["config"])
        if rows and {k: v for k, v in rows[-1].items() if k != "max_batch"} == cfg:
            rows[-1]["max_batch"] = w["B"]
        else:
            rows.append({"max_batch": w["B"], **cfg})
    del rows[-1]["max_batch"]
    return rows


def stretched_rows(winners: list[dict[str, Any]]) -> list[str]:
    """What the grid leaves unmeasured of the table it makes: ``Variant.coverage`` of the table made from
    ``winners`` (as :func:`best_per_batch` returns them) at the grid's batch sizes. One line per row whose
    explicit split count also runs batch sizes at or below half the smallest measured one in its range (a
    table of one row, a single config, included)."""
    rows = table_rows(winners)
    table = parse_variant(
        {"name": "grid_table", **rows[0]} if len(rows) == 1 else {"name": "grid_table", "configs": rows}
    )
    return table.coverage([w["B"] for w in winners])


def render(name: str, family: str, grids: list[Path], winners: list[dict[str, Any]], rows: list[dict[str, Any]]) -> str:
    """The variant file's text: a provenance comment, then the yaml."""
    r0 = winners[0]["row"]
    head = [
        f"# Batch table for {family} ({r0['layout']}, H={r0['H']}, top-k {r0['topk']}), made by",
        "# benchmarks/make_tuned_tables.py from " + " + ".join(g.as_posix() for g in grids) + ":",
        "# the fastest grid config at each measured batch size (p50, CUDA-graph replays, L2 flushed).",
        f"# Measured {r0.get('measured_at', '?')[:10]} on {r0.get('gpu_name', '?')}, driver {r0.get('driver', '?')}, "
        f"torch {r0.get('torch', '?')}, Triton {r0.get('triton', '?')},",
        f"# kernel source {r0.get('kernel_source_hash', '?')}.",
    ]
    head += [f"#   B={w['B']}: {w['config']} {w['p50_us']:.1f} us" for w in winners]
    head.append("# A batch between two measured sizes runs the row of the next larger one (max_batch).")
    doc = {"name": name, **rows[0]} if len(rows) == 1 else {"name": name, "configs": rows}  # one row: a single config
    body = yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=120)
    return "\n".join(head) + "\n" + body


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grid", required=True, nargs="+", help="kernel_bench.csv file(s) from bench_kernel.py")
    p.add_argument("--family", required=True, help="bench_kernel family (v32, v32_tp8, v4_flash)")
    p.add_argument("--name", required=True, help="variant name (the file is <out>/<name>.yaml)")
    p.add_argument("--out", default="conf/variant", help="folder for the variant file (conf/variant)")
    a = p.parse_args(argv)
    rows: list[dict[str, str]] = []
    try:
        for g in a.grid:
            with open(g, newline="") as f:
                rows += list(csv.DictReader(f))
        winners = best_per_batch(rows, a.family)
        warnings = stretched_rows(winners)
        text = render(a.name, a.family, [Path(g) for g in a.grid], winners, table_rows(winners))
    except OSError as e:
        print(f"error: --grid: {e}", file=sys.stderr)
        return 2
    except (KeyError, IndexError, ValueError) as e:  # a missing column, a label without _k<splits>, a bad number
        what = f"column {e} missing" if isinstance(e, KeyError) else str(e) or type(e).__name__
        print(f"error: --grid {' '.join(a.grid)}: not a bench_kernel.py grid ({what})", file=sys.stderr)
        return 2
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr)
    out = Path(a.out) / f"{a.name}.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out}: " + ", ".join(f"B={w['B']} {w['config']} {w['p50_us']:.1f} us" for w in winners))
    return 0


if __name__ == "__main__":
    sys.exit(main())

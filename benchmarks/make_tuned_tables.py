"""Write a tuned batch-table variant (conf/variant/<name>.yaml) from bench_kernel.py grids.

    python benchmarks/make_tuned_tables.py --grid reports/campaigns/kernel_speed/grid_5/v32.csv \\
        --family v32 --name tuned_deepseek_v32 --tolerance 0.02 [--out conf/variant]

(the committed tables: each table's header names its grid and tolerance; step "table5" in
reports/campaigns/kernel_speed/README.md). For each batch size the grids measured, the config with the
lowest median latency wins (rows with an error or without a latency are skipped; a config measured at one
batch size in several --grid files counts with its lowest p50). The table's rows are those winners in
batch order, each with ``max_batch`` = its batch size, the last row (largest batch) without it;
neighbouring rows with the same config merge (the larger bound stays), and a table of one row is written
as a single config. A batch between two measured sizes runs the row of the next larger measured size.

``--tolerance 0.02`` keeps, at a batch size, the config of the next larger row where the grid measured it
within 2% of the fastest there (``keep_within``), so that differences the grid cannot resolve do not add
rows (one run's single measurements differ by up to ~6% at B=1 and by 1-2% elsewhere: grid_5/README.md).
The file's header comment names the grids, their GPU, versions, date and kernel hash, the tolerance, and
the measured latency of every choice (and of the fastest config where another was kept), so the table can
be traced to the run that made it.

A row with an explicit split count launches ``B * cdiv(H, BLOCK_H) * splits`` programs, so the count that
won at its measured batch size can leave most SMs idle at a batch half that size, which the row also runs
(grid_4's TP8 B=128 winner, 2 splits, ran B=64 in 99.4 us where 4 splits took 71.5 us:
reports/campaigns/kernel_speed/README.md, step "table4"). Each such row whose range reaches half its
measured batch size or less is named in a ``warning:`` line on stderr (``Variant.coverage``, as the
benchmark's report names them); the table is still written. Bad input (an unreadable or foreign grid, a
family it lacks, a tolerance outside [0, 1), an --out that cannot be written) is one ``error:`` line and
exit status 2, and no file is written.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernelcamp.cli import UsageParser  # noqa: E402
from kernelcamp.errors import KernelcampError  # noqa: E402
from kernelcamp.variant import LaunchConfig, parse_variant  # noqa: E402

LAUNCH = ("BLOCK_T", "BLOCK_H", "num_warps", "num_stages")


def _splits(label: str) -> int | str:
    return LaunchConfig.from_label(label).num_splits


def _families(rows: list[dict[str, str]]) -> list[str]:
    """The families of the grid's Triton rows, sorted ("?" for a row without one)."""
    return sorted({r.get("family") or "?" for r in rows if r.get("impl") == "triton"})


def _timed_rows(rows: list[dict[str, str]], family: str) -> list[dict[str, str]]:
    """The Triton rows of ``family`` with a finite p50 and no error, in grid order: the rows that can win."""
    timed = [r for r in rows if r.get("family") == family and r.get("impl") == "triton" and r.get("latency_us_p50")]
    return [r for r in timed if not r.get("error") and math.isfinite(float(r["latency_us_p50"]))]


def _check_tolerance(tolerance: float) -> None:
    """``ValueError`` unless ``tolerance`` is a fraction in [0, 1) (1 would be 100%; nan and inf are refused)."""
    if not 0.0 <= tolerance < 1.0:
        raise ValueError(f"tolerance {tolerance!r}: expected a fraction in [0, 1) (e.g. 0.02 for 2%)")


def best_per_batch(rows: list[dict[str, str]], family: str) -> list[dict[str, Any]]:
    """The fastest config per batch size of ``family``: ``[{B, config, p50_us, row}]`` sorted by B.

    Raises ``ValueError`` when the grid has no timed row of ``family``.
    """
    timed = _timed_rows(rows, family)
    if not timed:
        raise ValueError(f"no timed triton rows of family {family!r} in the grid (families there: {_families(rows)})")
    best: dict[int, dict[str, str]] = {}
    for r in timed:
        B = int(r["B"])
        if B not in best or float(r["latency_us_p50"]) < float(best[B]["latency_us_p50"]):
            best[B] = r
    return [
        {"B": B, "config": best[B]["config"], "p50_us": float(best[B]["latency_us_p50"]), "row": best[B]}
        for B in sorted(best)
    ]


def keep_within(
    rows: list[dict[str, str]], family: str, winners: list[dict[str, Any]], tolerance: float
) -> list[dict[str, Any]]:
    """The per-batch choices with the next larger row's config kept where it is within ``tolerance`` of the fastest.

    ``winners`` as :func:`best_per_batch` returns them; ``tolerance`` a fraction (0.02: 2%). From the largest
    measured batch size down, a batch size keeps the config chosen for the next larger one when the grid measured
    that config there at most ``(1 + tolerance)`` times the fastest p50; otherwise its own fastest config is
    chosen. Each choice carries its own p50 and, under ``fastest``, the winner it replaced (the same entry when it
    is the winner). With ``tolerance`` 0 the choices are the winners, ties included. One run's single
    measurements differ by 1-2% between neighbouring configs that a repeat cannot tell apart (and by up to ~6%
    at B=1: the same config 15.7 and 16.7 us in two runs of 2026-12-02,
    reports/campaigns/kernel_speed/grid_5/README.md), so a table made at 0 adds rows on such differences.

    Raises ``ValueError`` for a ``tolerance`` outside [0, 1) (1 would be 100%).
    """
    _check_tolerance(tolerance)
    if tolerance == 0.0:
        return [{**w, "fastest": w} for w in winners]
    p50: dict[tuple[int, str], tuple[float, dict[str, str]]] = {}
    for r in _timed_rows(rows, family):
        us = float(r["latency_us_p50"])
        key = (int(r["B"]), r["config"])
        if key not in p50 or us < p50[key][0]:
            p50[key] = (us, r)
    chosen: list[dict[str, Any]] = []
    for w in reversed(winners):
        keep = chosen[0]["config"] if chosen else None
        if keep is not None and (w["B"], keep) in p50 and p50[(w["B"], keep)][0] <= (1.0 + tolerance) * w["p50_us"]:
            us, row = p50[(w["B"], keep)]
            chosen.insert(0, {"B": w["B"], "config": keep, "p50_us": us, "row": row, "fastest": w})
        else:
            chosen.insert(0, {**w, "fastest": w})
    return chosen


def table_rows(winners: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The batch table's config rows from the per-batch winners (see the module docstring)."""
    rows: list[dict[str, Any]] = []
    for w in winners:
        r = w["row"]
        cfg: dict[str, Any] = {k: int(r[k]) for k in LAUNCH}
        cfg["num_splits"] = _splits(w["config"])
        if LaunchConfig.from_label(w["config"]).warp_specialize:  # the warp-specialized kernel's row (its label: _ws)
            cfg["warp_specialize"] = True
        if rows and {k: v for k, v in rows[-1].items() if k != "max_batch"} == cfg:
            rows[-1]["max_batch"] = w["B"]
        else:
            rows.append({"max_batch": w["B"], **cfg})
    del rows[-1]["max_batch"]
    return rows


def stretched_rows(winners: list[dict[str, Any]], rows: list[dict[str, Any]] | None = None) -> list[str]:
    """What the grid leaves unmeasured of the table it makes: ``Variant.coverage`` of the table made from
    ``winners`` (the per-batch choices, as :func:`best_per_batch` or :func:`keep_within` return them) at the
    grid's batch sizes. One line per row whose explicit split count also runs batch sizes at or below half the
    smallest measured one in its range (a table of one row, a single config, included). ``rows``: the table,
    where the caller already has ``table_rows(winners)`` (it is computed from ``winners`` otherwise)."""
    if rows is None:
        rows = table_rows(winners)
    table = parse_variant(
        {"name": "grid_table", **rows[0]} if len(rows) == 1 else {"name": "grid_table", "configs": rows}
    )
    return table.coverage([w["B"] for w in winners])


def _field(row: dict[str, str], key: str) -> str:
    """A provenance field of a grid row, "?" where the row lacks it (a short or old CSV row)."""
    return row.get(key) or "?"


def _tolerance(text: str) -> float:
    """argparse type of --tolerance: a fraction in [0, 1)."""
    try:
        value = float(text)
        _check_tolerance(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a fraction in [0, 1), e.g. 0.02 for 2%") from None
    return value


def render(
    name: str,
    family: str,
    grids: list[Path],
    winners: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    tolerance: float = 0.0,
) -> str:
    """The variant file's text: a provenance comment (each batch size's choice; the fastest config too where
    ``--tolerance`` kept another), then the yaml."""
    r0 = winners[0]["row"]
    head = [
        f"# Batch table for {family} ({r0['layout']}, H={r0['H']}, top-k {r0['topk']}), made by",
        "# benchmarks/make_tuned_tables.py from " + " + ".join(g.as_posix() for g in grids) + ":",
        "# the fastest grid config at each measured batch size (p50, CUDA-graph replays, L2 flushed)"
        + (
            f",\n# or the next larger row's config where it is within {100 * tolerance:g}% of the fastest there "
            f"(--tolerance {tolerance:g})."
            if tolerance
            else "."
        ),
    ]
    # each run the winners came from (several grids: several runs, each named with the batch sizes it decided)
    runs: dict[tuple[str, ...], list[int]] = {}
    for w in winners:
        r = w["row"]
        key = tuple(
            _field(r, k) for k in ("measured_at", "gpu_name", "driver", "torch", "triton", "kernel_source_hash")
        )
        runs.setdefault((key[0][:10], *key[1:]), []).append(w["B"])
    for (date, gpu, driver, torch_v, triton_v, kernel), batches in runs.items():
        where = "" if len(runs) == 1 else f"(B={', '.join(map(str, batches))}) "
        head.append(f"# Measured {where}{date} on {gpu}, driver {driver}, torch {torch_v}, Triton {triton_v},")
        head.append(f"# kernel source {kernel}.")
    for w in winners:
        line = f"#   B={w['B']}: {w['config']} {w['p50_us']:.1f} us"
        f = w.get("fastest", w)
        if f["config"] != w["config"]:
            line += f" (kept within the tolerance; fastest {f['config']} {f['p50_us']:.1f} us)"
        head.append(line)
    head.append("# A batch between two measured sizes runs the row of the next larger one (max_batch).")
    doc = {"name": name, **rows[0]} if len(rows) == 1 else {"name": name, "configs": rows}  # one row: a single config
    body = yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=120)
    return "\n".join(head) + "\n" + body


def main(argv: list[str] | None = None) -> int:
    p = UsageParser(
        prog="make_tuned_tables.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--grid",
        required=True,
        nargs="+",
        help="bench_kernel.py CSV file(s) (its kernel_bench.csv; the campaign's grids are grid_<n>/<family>.csv)",
    )
    p.add_argument("--family", required=True, help="bench_kernel family (v32, v32_tp8, v4_flash)")
    p.add_argument("--name", required=True, help="variant name (the file is <out>/<name>.yaml)")
    p.add_argument("--out", default="conf/variant", help="folder for the variant file (conf/variant)")
    p.add_argument(
        "--tolerance",
        type=_tolerance,
        default=0.0,
        metavar="FRACTION",
        help="keep the next larger row's config at a batch size where the grid measured it within this fraction "
        "of the fastest there, in [0, 1): 0.02 is 2%% (default 0: the fastest everywhere)",
    )
    a = p.parse_args(argv)
    rows: list[dict[str, str]] = []
    try:
        for g in a.grid:
            with open(g, newline="") as f:
                rows += list(csv.DictReader(f))
        have = _families(rows)
        if have and a.family not in have:
            print(f"error: --family {a.family}: the grid has no rows of it (families there: {have})", file=sys.stderr)
            return 2
        winners = keep_within(rows, a.family, best_per_batch(rows, a.family), a.tolerance)
        table = table_rows(winners)
        warnings = stretched_rows(winners, table)
        text = render(a.name, a.family, [Path(g) for g in a.grid], winners, table, a.tolerance)
    except OSError as e:
        print(f"error: --grid: {e}", file=sys.stderr)
        return 2
    # a missing column, a label without _k<splits>, a bad number, a config the variant rules refuse, a broken CSV
    except (KeyError, IndexError, ValueError, TypeError, KernelcampError, csv.Error) as e:
        what = f"column {e} missing" if isinstance(e, KeyError) else str(e) or type(e).__name__
        print(f"error: --grid {' '.join(a.grid)}: not a usable bench_kernel.py grid ({what})", file=sys.stderr)
        return 2
    out = Path(a.out) / f"{a.name}.yaml"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text(text)
        tmp.replace(out)
    except OSError as e:
        print(f"error: --out {a.out}: cannot write {out} ({e.strerror or e})", file=sys.stderr)
        return 2
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr)
    print(f"wrote {out}: " + ", ".join(f"B={w['B']} {w['config']} {w['p50_us']:.1f} us" for w in winners))
    return 0


if __name__ == "__main__":
    sys.exit(main())

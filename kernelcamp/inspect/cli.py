"""``kernelcamp inspect``: compile every config of a variant for target GPUs and print what each costs.

The command line of :mod:`kernelcamp.inspect.fit` (which configs fit) over
:mod:`kernelcamp.inspect.compile` (the figures): a table (rich) with dead configs highlighted, or
``--json``; one loud ``PRUNED on <target>: ...`` line on stderr per config a target would prune.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kernelcamp.errors import KernelcampError
from kernelcamp.inspect.compile import triton_version
from kernelcamp.inspect.fit import inspect_configs, kernel_module, module_source_hash, specs_for_workload, summarize
from kernelcamp.targets import check_target_section, load_target

# ----------------------------------------------------------------------------------------------
# Command line


def _load_yaml(path: Path) -> dict:
    from omegaconf import OmegaConf

    if not path.exists():
        choices = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise KernelcampError(f"no {path.parent.name} named {path.stem!r}: choose one of {choices}")
    return OmegaConf.to_container(OmegaConf.load(path), resolve=True)


def _load_group(conf: Path, group: str, choice: str) -> dict:
    """The ``group`` section of the params.yaml that ``dvc exp run -S {group}={choice}`` would compose
    (``kernelcamp.compose``: DVC's own Hydra call, so a file's ``defaults`` list applies, e.g.
    conf/workload/deepseek_v32_tp8.yaml on deepseek_v32, and so does a git-ignored conf/local/ file).
    ``KernelcampError``: a missing file (naming the choices), a composition Hydra refuses, or a file that
    composes no ``group`` section (e.g. one written as ``@package _global_``)."""
    import yaml

    from kernelcamp.compose import compose_text
    from kernelcamp.variant import NAME_RE

    if not NAME_RE.fullmatch(choice):  # `--variant ../../etc/passwd` read as "no etc named 'passwd'"
        choices = sorted(p.stem for p in (conf / group).glob("*.yaml"))
        raise KernelcampError(f"--{group} {choice!r}: give the name of a file of conf/{group}/ (one of {choices})")
    _load_yaml(conf / group / f"{choice}.yaml")  # a missing file: the one-line error with the choices
    section = (yaml.safe_load(compose_text(conf.parent, [f"{group}={choice}"])) or {}).get(group)
    if not isinstance(section, dict):
        raise KernelcampError(f"conf/{group}/{choice}.yaml composes no `{group}` section: is it `@package _global_`?")
    return section


def render_table(rows: Sequence[dict], summaries: Sequence[dict], file: Any = None) -> None:
    """Readable table (rich) with dead configs highlighted, then each target's summary."""
    from rich.console import Console
    from rich.table import Table

    console = Console(file=file or sys.stdout, width=160)
    table = Table(title="compile inspection", header_style="bold")
    for col in (
        "target",
        "config",
        "kernel",
        "shared B",
        "regs",
        "spill B",
        "stack B",
        "CTAs/SM",
        "warps/SM",
        "limited by",
        "fits",
        "compile",
    ):
        table.add_column(col, justify="right" if col not in ("target", "config", "kernel", "limited by") else "left")

    def cell(r: dict, k: str) -> str:
        v = r.get(k)
        return "?" if v is None and k in r.get("unreadable", {}) else ("" if v is None else str(v))

    for r in rows:
        style = None if r["fits"] else "bold red"
        table.add_row(
            r["target"],
            r["config"],
            str(r["kernel"]),
            cell(r, "shared_bytes"),
            cell(r, "registers"),
            cell(r, "spill_bytes"),
            cell(r, "stack_bytes"),
            str(r["ctas_per_sm"]),
            str(r["warps_per_sm"]),
            str(r["limited_by"] or ""),
            "yes" if r["fits"] else "NO",
            "cached" if r["cached"] else f"{r['compile_s']:.2f} s",
            style=style,
        )
    console.print(table)
    for s in summaries:
        run = s["will_run"]
        what = "nothing fits" if run is None else f"{run['mode']}: {', '.join(run['configs'])}"
        console.print(
            f"[bold]{s['target']}[/bold]: {s['n_fit']}/{s['n_configs']} configs fit; will run: {what}",
            style=None if run else "bold red",
        )


def announce_pruned(summaries: Sequence[dict], file: Any = None) -> None:
    """One loud stderr line per config a target prunes."""
    for s in summaries:
        for p in s["pruned"]:
            print(f"PRUNED on {s['target']}: {p['config']}: {p['reason']}", file=file or sys.stderr)


def build_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``inspect`` to ``sub`` (the subparsers of :func:`kernelcamp.cli.build_parser`)."""
    p = sub.add_parser(
        "inspect",
        description="Compile every config of a variant for target GPUs (no GPU needed) and report shared memory, "
        "registers, spills and occupancy, and which configs a target would prune.",
        epilog="--variant, --workload and --kernel compose their file with Hydra as `dvc exp run` does: a file's "
        "`defaults` list applies,\nand so does a git-ignored conf/local/ file (local settings shared by every run).\n\n"
        "examples:\n  kernelcamp inspect --variant story_autotune --target sm120 --target sm90\n"
        "  kernelcamp inspect --params params.yaml --target sm120 --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--variant", help="a file name in conf/variant/ (default: the params.yaml `variant` with --params)")
    p.add_argument(
        "--target",
        action="append",
        default=[],
        help="a file name in conf/target/ or `auto`; repeat for several (default: params.yaml's target)",
    )
    p.add_argument("--workload", help="a file name in conf/workload/ (default: params.yaml's, else deepseek_v4_flash)")
    p.add_argument("--kernel", help="a file name in conf/kernel/ (default: params.yaml's, else sparse_mla_decode)")
    p.add_argument("--params", help="read variant/target/workload/kernel sections from this params.yaml")
    p.add_argument("--json", action="store_true", help="print JSON (rows and per-target summaries) on stdout")
    p.add_argument("--no-cache", action="store_true", help="compile even when the disk cache has the figures")
    p.add_argument("--quiet", action="store_true", help="no per-compile progress on stderr")
    p.set_defaults(main=main)
    return p


def main(args: argparse.Namespace) -> int:
    """``kernelcamp inspect``: returns 0, or 1 when some target has no fitting config, 2 on errors."""
    from kernelcamp.io import load_params
    from kernelcamp.spec import KernelSpec, WorkloadSpec, check_workload, parse_section
    from kernelcamp.targets import conf_dir
    from kernelcamp.variant import parse_variant

    if "triton" not in sys.modules:  # interpreter mode (read at triton's import) cannot cross-compile
        os.environ.pop("TRITON_INTERPRET", None)
    try:
        params = load_params(args.params) if args.params else {}
        conf = conf_dir()

        def group(name: str, chosen: str | None, default: str | None) -> Any:
            if chosen:
                return _load_group(conf, name, chosen)
            if name in params:
                return params[name]
            if default is None:
                raise KernelcampError(f"give --{name} (a file in conf/{name}/) or --params params.yaml")
            return _load_group(conf, name, default)

        variant = parse_variant(group("variant", args.variant, None))
        workload = group("workload", args.workload, "deepseek_v4_flash")
        kernel = group("kernel", args.kernel, "sparse_mla_decode")
        # checked as a run's spec checks them (a bad dot_dtype or layout read as every config pruned, a
        # non-integer head count a traceback)
        check_workload(parse_section(WorkloadSpec, workload, "workload"))
        parse_section(KernelSpec, kernel, "kernel")
        targets = (
            [load_target(t) for t in args.target]
            if args.target
            else [check_target_section(params["target"])]  # one conf/target file, as a run's spec checks it
            if "target" in params
            else [load_target("sm90")]
        )
        module = kernel_module(kernel)
        specs_for = specs_for_workload(module, workload, kernel.get("dot_dtype", "bf16"), variant)
        progress = None if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
        rows = inspect_configs(
            variant.configs,
            targets,
            specs_for,
            is_list=variant.is_list and not variant.is_table,
            use_cache=not args.no_cache,
            progress=progress,
        )
    except KernelcampError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    summaries = [summarize(variant, rows, t.name) for t in targets]
    announce_pruned(summaries)
    if args.json:
        out = {
            "variant": variant.name,
            "config_hash": variant.config_hash(),
            "workload": workload.get("name"),
            "kernel_source_hash": module_source_hash(module),
            "triton": triton_version(),
            "targets": [t.as_dict() for t in targets],
            "summaries": summaries,
            "rows": rows,
        }
        print(json.dumps(out, indent=2, default=str))
    else:
        render_table(rows, summaries)
    return 0 if all(s["n_fit"] for s in summaries) else 1


if __name__ == "__main__":  # `python -m kernelcamp.inspect.cli ...` is `kernelcamp inspect ...`
    from kernelcamp.cli import main as _cli_main

    sys.exit(_cli_main(["inspect", *sys.argv[1:]]))

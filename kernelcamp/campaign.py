"""Copy a finished DVC experiment's results out of its commit, without touching the workspace.

``benchmarks/campaign.sh`` keeps a readable copy of each experiment under
``reports/campaigns/<campaign>/<name>/``. The copy is taken from the experiment's own commit
(``refs/exps/<baseline[:2]>/<baseline[2:]>/<exp name>``, DVC 3's layout of experiment refs), not from
the workspace after ``dvc exp apply``: an apply replaces the workspace's tracked files, so it would
revert copies made earlier in the same campaign whenever the campaign folder is itself git-tracked.

    kernelcamp campaign collect warp_occupancy-20261129T200851 reports/campaigns/warp_occupancy/warp_occupancy
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from kernelcamp.errors import KernelcampError

#: What a campaign copy holds: the report, its plots and tables, the metrics and the params and
#: lock that made them (paths in the experiment's commit; ``reports/`` is dropped in the copy).
COPIED_SUFFIXES = (".json", ".csv", ".md")


def exp_ref(repo_root: Path, exp_name: str) -> str:
    """The git ref of DVC experiment ``exp_name`` in the repo at ``repo_root``.

    ``exp_name`` is a name (matched literally, never as a glob) or a full ref ``refs/exps/...``, which
    tells apart experiments of one name on several baselines. Raises ``KernelcampError`` when no
    experiment of that name exists, or when several baselines each have one (name the ref itself then).
    """
    if exp_name.startswith("refs/exps/"):
        ok = subprocess.run(
            ["git", "show-ref", "--verify", "-q", exp_name], cwd=repo_root, capture_output=True, text=True
        )
        if ok.returncode != 0:
            raise KernelcampError(f"no DVC experiment ref {exp_name!r}: `git for-each-ref refs/exps` lists them")
        return exp_name
    if any(c in exp_name for c in "*?[]\\/") or not exp_name.strip():
        raise KernelcampError(
            f"experiment name {exp_name!r}: give the name as `dvc exp list -A` shows it (no wildcards), "
            "or its full ref refs/exps/..."
        )
    out = subprocess.run(
        ["git", "for-each-ref", "--format=%(refname)", f"refs/exps/*/*/{exp_name}"],
        cwd=repo_root,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise KernelcampError(f"{repo_root}: not a git repo ({out.stderr.strip()})")
    refs = out.stdout.split()
    if not refs:
        raise KernelcampError(f"no DVC experiment named {exp_name!r}: `dvc exp list -A` lists the names")
    if len(refs) > 1:
        raise KernelcampError(f"{len(refs)} experiments are named {exp_name!r} (one per baseline): {', '.join(refs)}")
    return refs[0]


def _not_collected(folder: Path) -> str | None:
    """The first entry of ``folder`` that a collect does not write (anything but params.yaml, dvc.lock, top-level
    ``COPIED_SUFFIXES`` files and files in ``plots/``), relative to it; None when there is none."""
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder)
        top = len(rel.parts) == 1
        if p.is_dir() and top and rel.name == "plots":
            continue
        if p.is_file() and (
            (top and (rel.name in ("params.yaml", "dvc.lock") or rel.name.endswith(COPIED_SUFFIXES)))
            or (len(rel.parts) == 2 and rel.parts[0] == "plots")
        ):
            continue
        return rel.as_posix() + ("/" if p.is_dir() else "")
    return None


def collect(repo_root: Path, exp_name: str, dest: Path) -> list[str]:
    """Replace ``dest`` with experiment ``exp_name``'s params.yaml, dvc.lock and report files.

    Takes ``params.yaml``, ``dvc.lock`` and, from ``reports/`` (top level only), every ``.json``,
    ``.csv`` and ``.md`` file and the ``plots/`` folder, straight from the experiment's commit. The
    new copy is assembled beside ``dest`` and swapped in, so a failure leaves the old copy whole.
    Returns the copied paths, relative to ``dest``.

    Raises ``KernelcampError`` when the experiment does not exist or its commit lacks ``dvc.lock``, or when
    ``dest`` is a file, names no folder of its own (``.``, ``/``), or holds anything a collect does not write
    (a subfolder other than ``plots/``, a file of another kind): it would be deleted with the old copy.
    """
    ref = exp_ref(repo_root, exp_name)
    ls = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", ref], cwd=repo_root, capture_output=True, text=True, check=True
    ).stdout.split()
    wanted = [p for p in ls if p in ("params.yaml", "dvc.lock")]
    wanted += [
        p
        for p in ls
        if p.startswith("reports/")
        and (p.count("/") == 1 and p.endswith(COPIED_SUFFIXES) or p.startswith("reports/plots/"))
    ]
    if "dvc.lock" not in wanted:
        raise KernelcampError(f"experiment {exp_name!r} ({ref}) has no dvc.lock: did it finish?")
    archive = subprocess.run(["git", "archive", "--format=tar", ref, *wanted], cwd=repo_root, capture_output=True)
    if archive.returncode != 0:
        raise KernelcampError(f"git archive {ref}: {archive.stderr.decode(errors='replace').strip()}")
    given, dest = str(dest), Path(dest).resolve()
    if any(p.is_relative_to(dest) for p in (Path.cwd().resolve(), Path(repo_root).resolve())):
        # `collect EXP .` would have moved this folder (or the repo holding it) aside to make room
        raise KernelcampError(
            f"campaign folder {given!r} holds this folder or the repo: name a folder of its own, e.g. "
            "reports/campaigns/<name>"
        )
    if dest.exists() and not dest.is_dir():
        raise KernelcampError(f"campaign folder {given!r} is a file: name a folder (it is replaced whole)")
    if dest.is_dir() and (foreign := _not_collected(dest)):
        # `collect EXP reports/campaigns` (for reports/campaigns/<name>) had deleted every campaign's records
        raise KernelcampError(
            f"campaign folder {given!r} holds {foreign!r}, which no collect writes: it would be replaced whole; name "
            "a folder of its own, e.g. reports/campaigns/<name>, or empty this one first"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # a folder's usual mode, not mkdtemp's 0700
    copied = []
    try:
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            for m in tar.getmembers():
                if not m.isfile():
                    continue
                rel = m.name.removeprefix("reports/")
                target = tmp / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(m).read())
                target.chmod(0o644)
                copied.append(rel)
        old = dest.with_name(f".{dest.name}.old")
        if dest.exists():
            shutil.rmtree(old, ignore_errors=True)
            dest.rename(old)
        tmp.rename(dest)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return sorted(copied)


def build_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``campaign`` (with its one subcommand, ``collect``) to ``sub``."""
    p = sub.add_parser("campaign", description=__doc__.splitlines()[0])
    inner = p.add_subparsers(dest="cmd", metavar="<subcommand>", required=True)
    c = inner.add_parser("collect", help="copy an experiment's params, lock and reports from its commit into DEST")
    c.add_argument(
        "experiment",
        help="the DVC experiment's name (dvc exp list -A --name-only), or its full ref refs/exps/... where "
        "one name is on several baselines",
    )
    c.add_argument(
        "dest",
        help="the folder to (re)write, e.g. reports/campaigns/warp_occupancy/warp_occupancy; refused when it holds "
        "anything a collect does not write",
    )
    c.add_argument("--repo", default=".", help="the DVC repo [default: .]")
    p.set_defaults(main=main)
    return p


def main(args: argparse.Namespace) -> int:
    """``kernelcamp campaign collect EXP DEST``: see the module docstring."""
    try:
        copied = collect(Path(args.repo).resolve(), args.experiment, Path(args.dest))
    except KernelcampError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"collected {args.experiment}: {len(copied)} files into {args.dest}")
    return 0


if __name__ == "__main__":  # `python -m kernelcamp.campaign ...` is `kernelcamp campaign ...`
    from kernelcamp.cli import main as _cli_main

    sys.exit(_cli_main(["campaign", *sys.argv[1:]]))

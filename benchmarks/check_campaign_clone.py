"""Check a committed campaign the way a newcomer would: in a fresh clone, with DVC alone.

    python benchmarks/check_campaign_clone.py                 # clone this repo into a temp folder
    python benchmarks/check_campaign_clone.py --repo URL --out reports/campaigns/warp_occupancy/clone_check.txt

For every commit on the current branch whose subject starts ``campaign result: <experiment>``:
``dvc exp show -n N --json`` (in the clone) must list it with the params of the committed copy
``reports/campaigns/<campaign>/<experiment>/params.yaml``, and after ``git checkout <commit>``,
``dvc status`` must report the pipeline up to date against that commit's ``dvc.lock`` (every output
is git-tracked, so no DVC remote is needed). Experiments pushed as git refs (``refs/exps``) are
pulled too, with ``dvc exp pull -A --no-cache origin``, and listed when there are any.
Exits 1 when any check fails.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PREFIX = "campaign result: "


def sh(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", default=str(ROOT), help="the repo to clone [default: this one]")
    ap.add_argument("--campaign", default="warp_occupancy", help="folder under reports/campaigns/")
    ap.add_argument("--out", help="also write the log here")
    args = ap.parse_args()
    lines: list[str] = []

    def say(msg: str) -> None:
        print(msg, flush=True)
        lines.append(msg)

    failed = 0
    with tempfile.TemporaryDirectory(prefix="kc-clone-") as tmp:
        clone = Path(tmp) / "clone"
        r = sh(["git", "clone", "-q", args.repo, str(clone)], Path(tmp))
        if r.returncode != 0:
            print(f"error: git clone {args.repo}: {r.stderr.strip()}", file=sys.stderr)
            return 2
        head = sh(["git", "rev-parse", "--short", "HEAD"], clone).stdout.strip()
        say(f"clone of {Path(args.repo).name} at {head}; dvc {sh(['dvc', '--version'], clone).stdout.strip()}")
        log = sh(["git", "log", "--first-parent", "--format=%H %s"], clone).stdout.splitlines()
        results = [(ln.split(" ", 1)[0], ln.split(" ", 1)[1]) for ln in log if ln.split(" ", 1)[1].startswith(PREFIX)]
        if not results:
            say(f"FAIL: no commit whose subject starts {PREFIX!r} on this branch")
            return 1
        depth = max(i for i, ln in enumerate(log) if ln.split(" ", 1)[1].startswith(PREFIX)) + 1
        shown = json.loads(sh(["dvc", "exp", "show", "-n", str(depth), "--json"], clone).stdout or "[]")
        rows = {b.get("rev"): b for b in shown}
        for sha, subject in results:
            exp = subject[len(PREFIX) :].split(" ", 1)[0]
            copy = clone / "reports" / "campaigns" / args.campaign / exp / "params.yaml"
            row = rows.get(sha)
            params = (((row or {}).get("data") or {}).get("params") or {}).get("params.yaml", {}).get("data")
            want = yaml.safe_load(copy.read_text()) if copy.exists() else None
            listed = row is not None and params is not None and params == want
            sh(["git", "checkout", "-q", "--detach", sha], clone)
            status = sh(["dvc", "status"], clone)
            # the spec stage (the params gate) is always_changed by design: it is the one line allowed
            rest = [ln.strip() for ln in status.stdout.splitlines() if ln.strip() not in ("spec:", "always changed")]
            clean = status.returncode == 0 and ("up to date" in status.stdout or not rest)
            ok = listed and clean
            failed += not ok
            say(
                f"{'ok  ' if ok else 'FAIL'} {sha[:7]} {exp}: dvc exp show lists it with the committed params: "
                f"{'yes' if listed else 'no' if want is not None else f'no copy at {copy.relative_to(clone)}'}; "
                f"dvc status: {status.stdout.strip().splitlines()[-1] if clean else status.stdout + status.stderr}"
            )
        sh(["git", "checkout", "-q", "-"], clone)
        pulled = sh(["dvc", "exp", "pull", "-A", "--no-cache", "origin"], clone)
        names = sh(["dvc", "exp", "list", "-A", "--name-only"], clone).stdout.split()
        say(
            f"refs/exps pulled from origin: {', '.join(names) if names else 'none'}"
            + ("" if pulled.returncode == 0 else f" (dvc exp pull: {pulled.stderr.strip().splitlines()[-1:]})")
        )
    say(f"{len(results) - failed} of {len(results)} campaign result commits pass")
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Record check: every MLflow run's params, tags and stage records agree with its experiment's commit.

    python benchmarks/check_records.py [--out reports/record_check/result.md] [--keep]

In a fresh clone of this repo's HEAD (a temporary folder), it queues two experiments
(``-S variant.num_warps=8`` and ``=2``), then edits the workspace's kernel file (a comment line, as
a user editing after queuing would), runs the queue (one worker), and then runs one more experiment
in the edited workspace. For every MLflow run of the clone's store it checks, against the commit of
the DVC experiment it names (``dvc_exp_name`` tag):

* param ``variant.num_warps`` == that commit's params.yaml;
* tag ``kernel_source_hash`` == build.json's == benchmark.json's == sha256 of that commit's kernel
  file (the queued runs: the file as queued, not the workspace's edited one);
* tag ``variant_hash`` == benchmark.json's == verify.json's == deploy.json's.

Prints one line per run and writes a markdown table to ``--out``; exits 1 when any check fails.
Runs on a CPU (about 5 minutes on 2 cores): the stages use the interpreter and a CPU server.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNEL = "kernels/sparse_mla_decode.py"


def sh(cmd: list[str], cwd: Path, check: bool = True, timeout: float = 1800) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise SystemExit(f"error: {' '.join(cmd)} failed ({r.returncode}): {(r.stderr or r.stdout)[-2000:]}")
    return r


def show(rev: str, path: str, cwd: Path) -> str:
    return sh(["git", "show", f"{rev}:{path}"], cwd).stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "reports" / "record_check" / "result.md"))
    ap.add_argument("--keep", action="store_true", help="keep the temporary clone (its path is printed)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kc-record-check-"))
    repo = tmp / "repo"
    sh(["git", "clone", "-q", str(ROOT), str(repo)], tmp)
    env_port = ["-S", f"server.port={20000 + os.getpid() % 5000}"]  # never the workspace's own server
    t0 = time.time()
    for name, warps in (("queued-w8", 8), ("queued-w2", 2)):
        sh(["dvc", "exp", "run", "--queue", "-n", name, *env_port, "-S", f"variant.num_warps={warps}"], repo)
    kfile = repo / KERNEL
    kfile.write_text(kfile.read_text() + "\n# edited in the workspace after queuing\n")
    sh(["dvc", "queue", "start"], repo)
    while True:
        st = sh(["dvc", "queue", "status"], repo, check=False).stdout
        if not any(w in st for w in ("Queued", "Running")):
            break
        time.sleep(5)
    print(f"queue done in {time.time() - t0:.0f} s:\n{st}", flush=True)
    sh(["dvc", "exp", "run", "-n", "workspace-edited", *env_port, "-S", "variant.num_warps=4"], repo)
    sh(["python", "-m", "stages.deploy", "--stop"], repo, check=False)
    shown = json.loads(sh(["dvc", "exp", "show", "--json", "-A"], repo).stdout or "[]")
    revs = {}
    for base in shown:
        for e in base.get("experiments") or []:
            for r in e.get("revs") or []:
                if r.get("name"):
                    revs[r["name"]] = r["rev"]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    exp = client.get_experiment_by_name("kernelcamp")
    runs = client.search_runs([exp.experiment_id]) if exp else []
    lines, failed = [], 0
    seen = set()
    for run in runs:
        tags, params = run.data.tags, run.data.params
        name = tags.get("dvc_exp_name") or ""
        if run.info.status != "FINISHED" or name not in revs:
            lines.append(f"| {name or '?'} | {run.info.status} | - | - | - | skipped (not a finished experiment) |")
            continue
        seen.add(name)
        rev = revs[name]
        p = __import__("yaml").safe_load(show(rev, "params.yaml", repo))
        build = json.loads(show(rev, "reports/build.json", repo))
        bench = json.loads(show(rev, "reports/benchmark.json", repo))
        verify = json.loads(show(rev, "reports/verify.json", repo))
        deploy = json.loads(show(rev, "reports/deploy.json", repo))
        ksha = hashlib.sha256(show(rev, KERNEL, repo).encode()).hexdigest()
        checks = {
            "num_warps": params.get("variant.num_warps") == str(p["variant"]["num_warps"]),
            "kernel_source_hash": tags.get("kernel_source_hash")
            == build.get("kernel_source_hash")
            == bench.get("kernel_source_hash")
            == ksha,
            "variant_hash": tags.get("variant_hash")
            == bench.get("variant_hash")
            == verify.get("variant_hash")
            == deploy.get("variant_hash"),
        }
        ok = all(checks.values())
        failed += not ok
        verdict = "ok" if ok else "FAIL: " + ", ".join(k for k, v in checks.items() if not v)
        lines.append(
            f"| {name} | {run.info.status} | {params.get('variant.num_warps')} | {ksha[:12]} | "
            f"{tags.get('variant_hash')} | {verdict} |"
        )
    missing = sorted(set(("queued-w8", "queued-w2", "workspace-edited")) - seen)
    failed += len(missing)
    text = (
        f"# Record check ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit "
        f"{sh(['git', 'rev-parse', '--short', 'HEAD'], ROOT).stdout.strip()}, {os.uname().nodename}, CPU)\n\n"
        "Two experiments queued, the workspace kernel edited after queuing, the queue run, one more experiment in "
        "the edited workspace (`python benchmarks/check_records.py`).\n\n"
        "| experiment | MLflow status | variant.num_warps | kernel sha256 (commit) | variant_hash | checks |\n"
        "|---|---|---|---|---|---|\n" + "\n".join(lines) + "\n"
    )
    if missing:
        text += f"\nMissing a FINISHED run: {', '.join(missing)}\n"
    text += f"\n{'PASS' if not failed else f'FAIL ({failed})'}\n"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)
    if args.keep:
        print(f"clone kept at {repo}")
    else:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

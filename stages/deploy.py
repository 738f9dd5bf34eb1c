"""DVC stage `deploy`: make the target server run the variant with the server flag set, and prove it.

    python -m stages.deploy --params params.yaml --out reports/deploy.json

Reads params sections deploy, server, variant, kernel, workload. Targets (deploy.kind): embedded
(kernelcamp's own server on 127.0.0.1, previous one stopped, state in $DVC_ROOT/.kernelcamp/),
command (your launch command, kernel file copied to deploy.kernel_dest), ssh (files copied to
host:remote_dir, sha256 compared on both sides, restart run there). Ready = /health 200 + one real
completion + the server's variant hash matches (kernelcamp.deploy.embedded).

Writes (atomically) one JSON record: deploy_id, kind, url, variant_name, variant_hash,
kernel_source_hash, kernel_module, files [{path, sha256_local, sha256_remote}], checksums_match,
flags, seconds_to_healthy, pid, reused, hash_verified, server_info, timestamp, provenance; for the
embedded server also port, configured_port and port_note (a busy configured port moves it to a free
one of its range, and says why). A repeated
deploy of the same variant hash and flags against a live matching server is a no-op (reused: true).
Exits 2 with one line when the server cannot be made ready (nothing left running).

    python -m stages.deploy --stop     # stop the embedded server this workspace started
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kernelcamp.deploy import deploy, stop
from kernelcamp.io import stage_main, write_json_atomic
from kernelcamp.provenance import git_info
from kernelcamp.runlock import refuse_during_run
from kernelcamp.spec import DEPLOY_KEYS, before_outputs, project_root, stage_spec
from kernelcamp.tracking import tracked_stage


def summary_line(rec: dict) -> str:
    """One human line for the log."""
    what = "reused" if rec["reused"] else f"ready in {rec['seconds_to_healthy']} s"
    sums = "checksums match" if rec["checksums_match"] else "CHECKSUMS DIFFER"
    hashed = {True: "hash verified", False: "hash NOT verified", None: "hash not reported"}[rec.get("hash_verified")]
    return (
        f"deploy {rec['kind']}: {rec['variant_name']} ({rec['variant_hash']}) at {rec['url']}: {what}, {sums}, {hashed}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--out", default="reports/deploy.json")
    ap.add_argument("--stop", action="store_true", help="stop the server(s) this workspace started and exit")
    ap.add_argument(
        "--force", action="store_true", help="with --stop: stop it even while a pipeline run is measuring on it"
    )
    args = ap.parse_args()

    if args.stop:
        if not args.force:  # `make clean-server` under a live run stopped the server mid-benchmark
            refuse_during_run(project_root(), "not stopping the server", server=True, override="--force")
        stopped = stop()
        print(
            "stopped the workspace's server" if stopped else "no server of this workspace was running", file=sys.stderr
        )
        return 0
    spec = stage_spec("deploy", args.params)
    try:
        rec = deploy(spec.raw)
        # the server must run what these params describe: its reported hash was checked against the one
        # deploy derived; that one must be the run spec's
        spec.check_record("the deployed server", rec, DEPLOY_KEYS)
        rec["kernel_module"] = spec.kernel.module
        rec["stage_params"] = spec.stage_params("deploy")  # what the report checks against the params it logs
        rec["provenance"] = git_info(project_root())
        before_outputs("deploy", args.params)
    except BaseException:
        # deploy() replaces the last deploy's server, so the workspace's deploy.json may name a server that no longer
        # runs: a deploy stopped by a conf/ edit left this run's server up beside the last run's record, and the next
        # run skipped deploy (nothing it depends on had changed) and refused to measure (helper-68). Without the
        # record DVC deploys again on the next run.
        Path(args.out).unlink(missing_ok=True)
        raise
    write_json_atomic(args.out, rec)
    print(summary_line(rec), file=sys.stderr)
    return 0


if __name__ == "__main__":
    # --stop is no pipeline stage: a refusal (a live run measuring on the server) is no deploy failure to record
    stage_main(main if "--stop" in sys.argv[1:] else tracked_stage("deploy")(main))

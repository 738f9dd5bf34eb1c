"""Stage benchmark: baseline vs candidate, kernel level (interleaved rounds per batch size) and
serving level (kernelcamp.bench.serving), plus a profiler trace and a per-kernel time table.

    python -m stages.benchmark --params params.yaml --build reports/build.json --deploy reports/deploy.json \
        --out reports/benchmark.json --metrics reports/benchmark_metrics.json \
        --latency-csv reports/kernel_latency.csv --summary-csv reports/kernel_summary.csv \
        --serving-csv reports/serving.csv --trace reports/trace.json.gz --kernel-table reports/kernel_table.csv

On a GPU: CUDA-graph replays with L2 flushed (kernelcamp.bench.timing), workload shapes, bf16 dots.
Without one: TRITON_INTERPRET=1 at ``workload.cpu`` shapes, fp16 dots, a few perf_counter rounds;
every row says ``device=cpu`` and the report never shows them as GPU figures. Triton's autotuner
needs a GPU driver, so on a CPU a list variant runs its first config (named in ``configs_ran``).
Every result carries measured_at, host, GPU and the deploy id it measured. The work is
:mod:`kernelcamp.bench.record`'s; this script checks its inputs and hands them over.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import tempfile
from pathlib import Path

from kernelcamp.bench.kernel import check_kernel_params
from kernelcamp.bench.profile import baseline_trace_path
from kernelcamp.bench.record import log, measure_and_write, variants_to_run
from kernelcamp.errors import KernelcampError
from kernelcamp.io import check_records_as_written, pid_start_time, read_json, same_process, stage_main
from kernelcamp.spec import BUILD_KEYS, DEPLOY_KEYS, stage_spec
from kernelcamp.tracking import tracked_stage

#: Prefix of the folder (beside the outputs) where a run's traces wait until every output is ready.
STAGING_PREFIX = ".trace-staging-"
PATHS = (
    "params",
    "build",
    "deploy",
    "out",
    "metrics",
    "latency-csv",
    "summary-csv",
    "serving-csv",
    "serving-summary-csv",
    "trace",
    "kernel-table",
)


def make_staging(folder: Path) -> Path:
    """A new staging folder in ``folder`` named for this process, ``.trace-staging-<pid>-<start time>-XXXX``
    (:func:`kernelcamp.io.pid_start_time`), so that a later run can tell whether its owner still runs."""
    me = os.getpid()
    return Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{me}-{pid_start_time(me)}-", dir=folder))


def remove_stale_staging(folder: Path) -> list[Path]:
    """Remove the staging folders in ``folder`` that no live run owns; return them. A SIGKILL'd run (the whole
    ``dvc exp run``) leaves its folder behind, and no later run removed it. One named by :func:`make_staging` is
    stale when its process is gone (:func:`kernelcamp.io.same_process`, as :mod:`kernelcamp.runlock` tells a live
    run); one of the older name (``.trace-staging-XXXX``, no owner in it) when no other live ``dvc`` run holds this
    tree (:func:`kernelcamp.runlock.live_claim`)."""
    from kernelcamp.runlock import claim_path, live_claim, run_owner
    from kernelcamp.spec import project_root

    named = re.compile(rf"{re.escape(STAGING_PREFIX)}(\d+)-(\d+|None)-.+")
    claim = live_claim(claim_path(project_root()))
    others = claim is not None and claim.get("owner_pid") != run_owner()
    removed = []
    for d in sorted(folder.glob(STAGING_PREFIX + "*")):
        m = named.fullmatch(d.name)
        alive = same_process(int(m[1]), int(m[2]) if m[2].isdigit() else None) if m else others
        if d.is_dir() and not d.is_symlink() and not alive:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for a in PATHS:
        ap.add_argument(f"--{a}", required=True)
    args = ap.parse_args()
    spec = stage_spec("benchmark", args.params)
    if spec.baseline is None:
        raise KernelcampError("params.yaml has no `baseline` section: every benchmark measures one beside the variant")
    params = spec.raw
    check_records_as_written([args.build, args.deploy])
    build = read_json(args.build, "build record")
    deploy = read_json(args.deploy, "deploy record")
    # measure only what these params describe (a stale or foreign record stops here, naming both hashes)
    spec.check_record("build.json", build, BUILD_KEYS)
    spec.check_record("deploy.json", deploy, DEPLOY_KEYS)
    serving = bool(params["benchmark"]["serving"].get("enabled"))
    if serving:
        from kernelcamp.bench.serving import require_deployed_server

        require_deployed_server(deploy, timed=True)  # before the kernel rounds: a stopped or profiled server

    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernel module imports triton.jit
        log("no GPU: Triton interpreter at workload.cpu shapes, fp16 dots; timings are labelled device=cpu")
    check_kernel_params(params, device)
    if serving:
        from kernelcamp.bench.serving import check_baseline_port, check_serving_params

        check_serving_params(params)  # duplicate levels, unusable repeat plans: before the kernel rounds
        check_baseline_port(params, deploy)  # before the kernel rounds, not after them
    variants, notes = variants_to_run(spec, build, device)
    # Traces are written to a staging folder and moved into place with the other outputs at the end,
    # so an interrupted run leaves the previous run's traces beside the previous run's records.
    final_traces = {"candidate": Path(args.trace), "baseline": baseline_trace_path(args.trace)}
    final_traces["candidate"].parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(final_traces["candidate"].parent)
    staging = make_staging(final_traces["candidate"].parent)
    try:
        run_as = spec.benchmark.run_as_target
        return measure_and_write(args, spec, deploy, device, run_as, notes, variants, final_traces, staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


if __name__ == "__main__":
    stage_main(tracked_stage("benchmark")(main))

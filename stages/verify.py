"""Stage verify: kernel vs the fp32 torch reference, CUDA-graph capture safety, serving 1 vs N.

    python -m stages.verify --params params.yaml --deploy reports/deploy.json \
        --out reports/verify.json --details reports/verify_details.json

The checks and their pass rules are :mod:`kernelcamp.verify`'s: :func:`~kernelcamp.verify.kernel.check_kernel`
(every config of both sides vs the reference), :func:`~kernelcamp.verify.kernel.check_capture`,
:func:`~kernelcamp.verify.serving.check_serving`. Writes both files, then, when any check failed, exits 2
with one `error:` line naming the failed checks (a failed verification is a result: its record says
`passed: false` and verify_details.json holds the failing cases).
"""

from __future__ import annotations

import argparse
import os

from kernelcamp.errors import KernelcampError
from kernelcamp.io import check_records_as_written, read_json, stage_main, write_json_atomic
from kernelcamp.spec import DEPLOY_KEYS, before_outputs, stage_spec
from kernelcamp.tracking import tracked_stage
from kernelcamp.verify.kernel import check_capture, check_kernel, log
from kernelcamp.verify.serving import check_serving


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for a in ("params", "deploy", "out", "details"):
        ap.add_argument(f"--{a}", required=True)
    args = ap.parse_args()
    spec = stage_spec("verify", args.params)
    if spec.baseline is None:
        raise KernelcampError("params.yaml has no `baseline` section: verify checks both sides")
    params = spec.raw
    check_records_as_written([args.deploy])
    deploy = read_json(args.deploy, "deploy record")
    spec.check_record("deploy.json", deploy, DEPLOY_KEYS)  # verify only what these params describe
    if params["verify"]["serving"].get("enabled"):
        from kernelcamp.bench.serving import require_deployed_server

        require_deployed_server(deploy)  # before any work: a stopped server is found now, not at the end

    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        log("no GPU: Triton interpreter, fp16 dots, verify.kernel.cpu_shapes")
    from kernelcamp.provenance import deploy_id, device_info, now_utc

    variants = {"candidate": spec.variant, "baseline": spec.baseline}
    dot = params["kernel"].get("dot_dtype", "bf16") if device == "cuda" else "fp16"
    cases = check_kernel(params, variants, device, dot)
    capture = check_capture(params, variants, device)
    serving = check_serving(params, deploy)
    info = device_info()
    checks = {
        "kernel": all(c["passed"] for c in cases),
        "capture": capture.get("passed"),
        "serving": serving.get("passed"),
    }
    passed = all(v is not False for v in checks.values())
    record = {
        "passed": passed,
        "kernel_passed": checks["kernel"],
        "kernel_cases": len(cases),
        "kernel_cases_failed": sum(not c["passed"] for c in cases),
        "kernel_cases_skipped": sum(bool(c.get("skipped")) for c in cases),
        "capture_passed": checks["capture"],
        "serving_passed": checks["serving"],
        "skipped": {k_: v.get("skipped") for k_, v in (("capture", capture), ("serving", serving)) if v.get("skipped")},
        "measured_at": now_utc(),
        "host": info["host"],
        "device": device,
        "gpu": info.get("gpu_name"),
        "deploy_id": deploy_id(deploy),
        **spec.hashes(),  # what was verified, checked by the report against the params it logs
        "stage_params": spec.stage_params("verify"),
    }
    before_outputs("verify", args.params)
    write_json_atomic(
        args.details, {**record, "provenance": info, "cases": cases, "capture": capture, "serving": serving}
    )
    write_json_atomic(args.out, record)
    if not passed:
        failed = [k_ for k_, v in checks.items() if v is False]
        raise KernelcampError(f"verify failed: {', '.join(failed)} (details in {args.details})")
    log(
        f"passed: {len(cases)} kernel cases on {device}; "
        + "; ".join(f"{k_} skipped: {v}" for k_, v in record["skipped"].items())
    )
    return 0


if __name__ == "__main__":
    stage_main(tracked_stage("verify")(main))

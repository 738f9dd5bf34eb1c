"""Stage verify: kernel vs the fp32 torch reference, CUDA-graph capture safety, serving 1 vs N.

    python stages/verify.py --params params.yaml --deploy reports/deploy.json \
        --out reports/verify.json --details reports/verify_details.json

Kernel: every config of the candidate and the baseline, each launched as a single config (and, on
a GPU, each list variant through its autotuner too), over ``verify.kernel.shapes`` (``cpu_shapes``
with TRITON_INTERPRET=1 and fp16 dots without a GPU) on the workload's layout, with
``empty_slot_fraction`` of the slots -1. Pass: ``max|out - ref| <= max(3 * e_torch, 0.01 *
max(1, max|ref|))`` where ``e_torch`` is torch's own error computing the reference in the dot dtype
(the yardstick of STYLE.md), and ``max|lse - lse_ref| <= 0.01`` (both -inf on all-empty rows).
Capture: ``kernelcamp.capture.check_capture_safety`` on each variant's launcher, warmed at the same
shape (a warmed server); skipped with the reason on a CPU. Serving: ``kernelcamp.serving.check.
serving_verify`` when enabled and present. Writes both files, then exits 1 when any check failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernelcamp.errors import KernelcampError  # noqa: E402
from kernelcamp.io import read_json, stage_main, write_json_atomic  # noqa: E402
from kernelcamp.spec import DEPLOY_KEYS, stage_spec  # noqa: E402
from kernelcamp.tracking import tracked_stage  # noqa: E402

LSE_ATOL = 0.01


def log(msg: str) -> None:
    print(f"[verify] {msg}", flush=True)


def _err(a, b) -> float:
    import torch

    a, b = a.float(), b.float()
    both_inf = torch.isinf(a) & torch.isinf(b) & (torch.sign(a) == torch.sign(b))
    d = torch.where(both_inf, torch.zeros_like(a), (a - b).abs())
    return float(torch.nan_to_num(d, nan=float("inf")).max()) if d.numel() else 0.0


def deploy_id(deploy: dict) -> str:
    """The deploy record's own id, else a hash of the record (as stages/benchmark.py)."""
    import hashlib
    import json

    return str(deploy.get("deploy_id") or hashlib.sha256(json.dumps(deploy, sort_keys=True).encode()).hexdigest()[:16])


def check_kernel(params: dict, variants: dict, device: str, dot: str) -> list[dict]:
    import torch

    from kernelcamp.spec import import_kernel
    from kernelcamp.variant import Variant

    k = import_kernel(params["kernel"]["module"])

    wl, vk = params["workload"], params["verify"]["kernel"]
    shapes = vk["shapes"] if device == "cuda" else vk["cpu_shapes"]
    ps = wl["page_size"] if device == "cuda" else wl["cpu"]["page_size"]
    cdt = torch.bfloat16 if dot == "bf16" else torch.float16
    cases = []
    for B, H, topk in shapes:
        n_tok = ps * -(-max(2 * topk, ps) // ps)
        inp = k.make_inputs(
            wl["layout"], B, H, topk, ps, n_tok, device, seed=B * 1000 + topk, empty_fraction=vk["empty_slot_fraction"]
        )
        args = (inp["q"], inp["kv_cache"], inp["indices"], inp["layout"], inp["page_size"], inp["sm_scale"])
        ref, ref_lse = k.sparse_mla_decode_ref(*args)
        e_torch = _err(k.sparse_mla_decode_ref(*args, compute_dtype=cdt)[0], ref)
        tol = max(3 * e_torch, 0.01 * max(1.0, float(ref.abs().max())))
        for name, v in variants.items():
            runs = [(c.label(), Variant(v.name, (c,))) for c in v.configs]
            if device == "cuda" and not v.single:
                runs.append(("autotune", v))
            for label, vv in runs:
                case = {
                    "impl": name,
                    "variant": v.name,
                    "config": label,
                    "B": B,
                    "H": H,
                    "topk": topk,
                    "layout": wl["layout"],
                    "dot_dtype": dot,
                    "tol": tol,
                    "e_torch": e_torch,
                }
                try:
                    out, lse = k.SparseMLADecode(vv, dot_dtype=dot)(*args)
                    case.update(max_abs_err=_err(out, ref), lse_max_abs_err=_err(lse, ref_lse))
                    case["passed"] = case["max_abs_err"] <= tol and case["lse_max_abs_err"] <= LSE_ATOL
                except Exception as e:  # noqa: BLE001 - a launch failure is a failed case, named
                    case.update(passed=False, error=f"{type(e).__name__}: {e}")
                cases.append(case)
                log(
                    f"{name} {label} B={B} H={H} topk={topk}: "
                    + ("ok" if case["passed"] else "FAILED " + str(case.get("error") or case))
                )
    return cases


def check_capture(params: dict, variants: dict, device: str) -> dict[str, Any]:
    if device != "cuda":
        return {"skipped": "no GPU: CUDA-graph capture needs one", "passed": None}
    from kernelcamp.capture import check_capture_safety
    from kernelcamp.spec import import_kernel

    k = import_kernel(params["kernel"]["module"])

    wl = params["workload"]
    inp = k.make_inputs(wl["layout"], 8, wl["num_heads"], wl["topk"], wl["page_size"], wl["num_cache_tokens"], "cuda")
    res: dict[str, Any] = {}
    for name, v in variants.items():
        launcher = k.SparseMLADecode(v, dot_dtype=params["kernel"].get("dot_dtype", "bf16"))
        try:
            res[name] = {**check_capture_safety(launcher, inp, warmup_inputs=inp), "passed": True}
        except KernelcampError as e:
            res[name] = {"passed": False, "error": str(e)}
        log(f"capture {name}: " + ("ok" if res[name]["passed"] else "FAILED " + res[name]["error"]))
    return {"passed": all(r["passed"] for r in res.values()), "impls": res}


def check_serving(params: dict, deploy: dict) -> dict[str, Any]:
    if not params["verify"]["serving"].get("enabled"):
        return {"skipped": "verify.serving.enabled is false", "passed": None}
    if importlib.util.find_spec("kernelcamp.serving.check") is None:
        return {"skipped": "kernelcamp.serving.check is not in this tree yet", "passed": None}
    from kernelcamp.serving.check import serving_verify

    log("serving outputs at concurrency 1 vs N")
    return serving_verify(params, deploy)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for a in ("params", "deploy", "out", "details"):
        ap.add_argument(f"--{a}", required=True)
    args = ap.parse_args()
    spec = stage_spec("verify", args.params)
    if spec.baseline is None:
        raise KernelcampError("params.yaml has no `baseline` section: verify checks both sides")
    params = spec.raw
    deploy = read_json(args.deploy, "deploy record")
    spec.check_record("deploy.json", deploy, DEPLOY_KEYS)  # verify only what these params describe
    if params["verify"]["serving"].get("enabled") and importlib.util.find_spec("kernelcamp.serving.bench"):
        from kernelcamp.serving.bench import require_deployed_server

        require_deployed_server(deploy)  # before any work: a stopped server is found now, not at the end

    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        log("no GPU: Triton interpreter, fp16 dots, verify.kernel.cpu_shapes")
    from kernelcamp.provenance import device_info, now_utc

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
        "capture_passed": checks["capture"],
        "serving_passed": checks["serving"],
        "skipped": {k_: v.get("skipped") for k_, v in (("capture", capture), ("serving", serving)) if v.get("skipped")},
        "measured_at": now_utc(),
        "host": info["host"],
        "device": device,
        "gpu": info.get("gpu_name"),
        "deploy_id": deploy_id(deploy),
        **spec.hashes(),  # what was verified, checked by the report against the params it logs
    }
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

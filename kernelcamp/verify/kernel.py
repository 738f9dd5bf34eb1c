"""The verify stage's kernel checks: every config vs the fp32 torch reference, and CUDA-graph capture.

Kernel: every config of the candidate and the baseline, each launched as a single config (and, on
a GPU, each autotune list through its autotuner too; on any device, each batch table as a whole,
which runs the row chosen for the case's B), over ``verify.kernel.shapes`` (``cpu_shapes``
with TRITON_INTERPRET=1 and fp16 dots without a GPU) on the workload's layout, with
``empty_slot_fraction`` of the slots -1. Pass: the tolerance rule the kernel tests use too
(:mod:`kernelcamp.verify.tolerance`): per tensor, the kernel's error beyond its own result rounding
is within atol + 2 x torch's own error computing the reference in the dot dtype (the yardstick of
STYLE.md), and non-finite values (-inf LSE of all-empty rows) sit where the reference has them.
Capture: :func:`kernelcamp.verify.capture.check_capture_safety` on each variant's launcher, warmed at
the same shape (a warmed server); skipped with the reason on a CPU.

A config is judged only at the shapes of its launch domain (the kernel module's ``launch_domain``: the
warp-specialized kernel needs H a multiple of its head tile, 64 or 16, ...): a case outside it is recorded with
``skipped`` and the reason, and a config with no case inside it fails.

Each side launches its own kernel module (:func:`kernelcamp.spec.kernel_for`: the baseline the file at
``baseline.kernel_rev`` when set); inputs and the reference come from the working tree's.
"""

from __future__ import annotations

from typing import Any

from kernelcamp.errors import KernelcampError
from kernelcamp.verify.tolerance import failure_message, judge_output


def log(msg: str) -> None:
    print(f"[verify] {msg}", flush=True)


def check_kernel(params: dict, variants: dict, device: str, dot: str) -> list[dict]:
    import torch

    from kernelcamp.spec import import_kernel, kernel_for
    from kernelcamp.variant import Variant

    k = import_kernel(params["kernel"]["module"])
    modules = {name: kernel_for(params, name) for name in variants}

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
        refs = k.sparse_mla_decode_ref(*args)
        lows = k.sparse_mla_decode_ref(*args, compute_dtype=cdt)
        for name, v in variants.items():
            runs = [(c.label(), Variant(v.name, (c,))) for c in v.configs]
            if v.is_table:
                runs.append(("table", v))  # the row chosen for this B, as the server launches it
            elif device == "cuda" and not v.single:
                runs.append(("autotune", v))
            domain = getattr(modules[name], "launch_domain", None)  # None: an older kernel file runs every shape
            for label, vv in runs:
                cfg = vv.config_for_batch(B) if label == "table" else (vv.configs[0] if vv.single else None)
                why = domain(cfg, wl["layout"], H, ps) if domain and cfg is not None else None
                case = {
                    "impl": name,
                    "variant": v.name,
                    "config": label,
                    "B": B,
                    "H": H,
                    "topk": topk,
                    "layout": wl["layout"],
                    "dot_dtype": dot,
                }
                if why:
                    # outside the config's launch domain (the warp-specialized kernel's H, layout or page size):
                    # not run, recorded; a config with no case in its domain fails below
                    case.update(passed=True, skipped=f"{cfg.label()}: {why}")
                    cases.append(case)
                    log(f"{name} {label} B={B} H={H} topk={topk}: skipped ({why})")
                    continue
                try:
                    out, lse = modules[name].SparseMLADecode(vv, dot_dtype=dot)(*args)
                    res = judge_output(out, lse, refs, lows, truncating=device != "cuda")
                    case.update(
                        max_abs_err=res["out"]["max_abs_err"],
                        lse_max_abs_err=res["lse"]["max_abs_err"],
                        e_torch=res["out"]["torch_err"],
                        out_excess=res["out"]["excess"],
                        out_allowed=res["out"]["allowed"],
                        lse_excess=res["lse"]["excess"],
                        lse_allowed=res["lse"]["allowed"],
                        passed=res["passed"],
                    )
                    if not res["passed"]:
                        case["error"] = failure_message(res)
                except Exception as e:  # noqa: BLE001 - a launch failure is a failed case, named
                    case.update(passed=False, error=f"{type(e).__name__}: {e}")
                cases.append(case)
                log(
                    f"{name} {label} B={B} H={H} topk={topk}: "
                    + ("ok" if case["passed"] else "FAILED " + str(case.get("error") or case))
                )
    for name, v in variants.items():  # a config that ran at no shape was not verified: that fails
        for c in v.configs:
            ran = [x for x in cases if x["impl"] == name and x["config"] == c.label() and not x.get("skipped")]
            if not ran:
                cases.append(
                    {
                        "impl": name,
                        "variant": v.name,
                        "config": c.label(),
                        "layout": wl["layout"],
                        "dot_dtype": dot,
                        "passed": False,
                        "error": f"no verify shape is in the config's launch domain ({', '.join(map(str, shapes))})",
                    }
                )
                log(f"{name} {c.label()}: FAILED: no verify shape is in its launch domain")
    return cases


def check_capture(params: dict, variants: dict, device: str) -> dict[str, Any]:
    if device != "cuda":
        return {"skipped": "no GPU: CUDA-graph capture needs one", "passed": None}
    from kernelcamp.spec import import_kernel, kernel_for
    from kernelcamp.verify.capture import check_capture_safety

    k = import_kernel(params["kernel"]["module"])
    modules = {name: kernel_for(params, name) for name in variants}

    wl = params["workload"]
    inp = k.make_inputs(wl["layout"], 8, wl["num_heads"], wl["topk"], wl["page_size"], wl["num_cache_tokens"], "cuda")
    res: dict[str, Any] = {}
    for name, v in variants.items():
        launcher = modules[name].SparseMLADecode(v, dot_dtype=params["kernel"].get("dot_dtype", "bf16"))
        try:
            res[name] = {**check_capture_safety(launcher, inp, warmup_inputs=inp), "passed": True}
        except KernelcampError as e:
            res[name] = {"passed": False, "error": str(e)}
        log(f"capture {name}: " + ("ok" if res[name]["passed"] else "FAILED " + res[name]["error"]))
    return {"passed": all(r["passed"] for r in res.values()), "impls": res}

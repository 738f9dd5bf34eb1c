"""The one tolerance rule for the kernel's output, shared by the verify stage and the tests.

The kernel's error is judged against torch's own error in the dot precision (the yardstick of
STYLE.md)::

    max(|got - ref| - rtol * |ref|)  <=  atol + 2 * max|ref_lowp - ref|

per tensor (``out`` and ``lse``), where ``ref`` is the fp32 torch reference and ``ref_lowp`` the same
reference with q, the dequantized rows and the softmax weights in the dot dtype (returned in fp32).
The max-norms are compared, not element by element (rounding errors of the same size fall on
different elements); ``rtol`` removes the rounding of the kernel's own result dtype, which
``ref_lowp`` does not have; ``atol`` covers rows whose terms cancel to ~0. Non-finite values must sit
where the reference has them (an all-empty row: out 0, lse -inf).

``out`` is bf16 (8 significant bits): rounded to nearest on a GPU, off by <= 2^-8 relative; the
Triton 3.6 interpreter converts fp32 -> bf16 by truncation (measured: kernel with fp32 dots == the
reference truncated), off by <= 2^-7 relative. ``lse`` is fp32.
"""

from __future__ import annotations

from typing import Any

#: tensor -> (atol, rtol with round-to-nearest (GPU), rtol with truncation (interpreter), reason)
TOLERANCES: dict[str, tuple[float, float, float, str]] = {
    "out": (1e-3, 2.0**-8, 2.0**-7, "bf16 output rounding (round to nearest on a GPU, truncation in the interpreter)"),
    "lse": (1e-3, 1e-5, 1e-5, "fp32 LSE; the scores' dot-operand rounding is measured by ref_lowp"),
}


def judge(name: str, got: Any, ref: Any, low: Any, truncating: bool) -> dict[str, Any]:
    """Judge one tensor by the rule above.

    got: the kernel's tensor (any float dtype, e.g. bf16 ``[B, H, d_v]`` or fp32 ``[B, H]``); ref,
    low: the fp32 and dot-precision references of the same shape. truncating: the result dtype was
    rounded by truncation (the Triton interpreter) rather than to nearest.

    Returns ``{passed, excess, allowed, torch_err, max_abs_err, nonfinite_match}``; ``passed`` is
    False when the non-finite pattern differs or ``excess > allowed``. Raises ``KeyError`` for a
    tensor name not in ``TOLERANCES``.
    """
    import torch

    atol, rtol_nearest, rtol_trunc, _ = TOLERANCES[name]
    rtol = rtol_trunc if truncating else rtol_nearest
    g, r, lo = got.float(), ref.float(), low.float()
    finite = torch.isfinite(r)
    match = bool(torch.equal(torch.isfinite(g), finite))
    g, r, lo = g[finite], r[finite], lo[finite]
    if g.numel():
        excess = float(((g - r).abs() - rtol * r.abs()).max())
        torch_err = float((lo - r).abs().max())
        max_abs = float((g - r).abs().max())
    else:
        excess = torch_err = max_abs = 0.0
    allowed = atol + 2.0 * torch_err
    return {
        "passed": match and excess <= allowed,
        "excess": excess,
        "allowed": allowed,
        "torch_err": torch_err,
        "max_abs_err": max_abs,
        "nonfinite_match": match,
    }


def judge_output(out: Any, lse: Any, refs: tuple[Any, Any], lows: tuple[Any, Any], truncating: bool) -> dict[str, Any]:
    """Judge a kernel's ``(out, lse)`` against ``refs = (ref_out, ref_lse)`` and ``lows`` (dot precision).

    Returns ``{"passed": both passed, "out": judge(...), "lse": judge(...)}``.
    """
    res = {
        name: judge(name, g, r, lo, truncating)
        for name, g, r, lo in zip(("out", "lse"), (out, lse), refs, lows, strict=True)
    }
    return {"passed": res["out"]["passed"] and res["lse"]["passed"], **res}


def failure_message(res: dict[str, Any]) -> str:
    """One line naming the tensors that failed ``judge_output`` and by how much ('' when it passed)."""
    bad = []
    for name in ("out", "lse"):
        j = res[name]
        if not j["nonfinite_match"]:
            bad.append(f"{name}: non-finite pattern differs from the reference")
        elif not j["passed"]:
            bad.append(
                f"{name}: error {j['excess']:.3e} > allowed {j['allowed']:.3e} "
                f"(2 x torch's {j['torch_err']:.3e} + atol)"
            )
    return "; ".join(bad)

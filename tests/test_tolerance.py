"""The one tolerance rule (kernelcamp.verify.tolerance): what passes and what fails, on made-up tensors."""

from __future__ import annotations

import torch

from kernelcamp.verify.tolerance import TOLERANCES, failure_message, judge, judge_output


def _pair(n: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ref = torch.randn(n, generator=g) * 4
    low = ref + 1e-3 * torch.randn(n, generator=g)  # torch's own dot-precision error ~1e-3
    return ref, low


def test_result_rounding_passes_and_an_error_beyond_torchs_fails():
    ref, low = _pair()
    assert judge("out", ref.to(torch.bfloat16), ref, low, truncating=False)["passed"]  # bf16 rounding only
    torch_err = float((low - ref).abs().max())
    off = ref.clone()
    off[7] += 1e-3 + 2 * torch_err + 0.05  # beyond atol + 2 x torch's error (and bf16's relative rounding)
    j = judge("out", off, ref, low, truncating=False)
    assert not j["passed"] and j["excess"] > j["allowed"]


def test_truncation_is_allowed_in_the_interpreter_only():
    ref = torch.full((8,), 1.0 + 2.0**-7 * 0.99)
    low = ref.clone()
    trunc = torch.full((8,), 1.0)  # what truncation to 8 significant bits gives: off by ~2^-7 relative
    atol = TOLERANCES["out"][0]
    big = (ref * 256).clone()
    assert judge("out", trunc * 256, big, big, truncating=True)["passed"]
    assert not judge("out", trunc * 256, big, big, truncating=False)["passed"]
    assert atol < 2.0**-7 * 256  # the case is decided by rtol, not by atol
    assert judge("out", trunc, ref, low, truncating=True)["passed"]


def test_non_finite_values_must_sit_where_the_reference_has_them():
    ref_lse = torch.tensor([1.0, float("-inf"), 3.0])
    good = judge_output(torch.zeros(3), ref_lse.clone(), (torch.zeros(3), ref_lse), (torch.zeros(3), ref_lse), False)
    assert good["passed"] and failure_message(good) == ""
    bad_lse = torch.tensor([1.0, 0.0, 3.0])  # an empty row must give -inf, not 0
    bad = judge_output(torch.zeros(3), bad_lse, (torch.zeros(3), ref_lse), (torch.zeros(3), ref_lse), False)
    assert not bad["passed"] and failure_message(bad) == "lse: non-finite pattern differs from the reference"

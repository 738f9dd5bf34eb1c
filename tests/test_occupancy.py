"""Occupancy and per-block limits (kernelcamp.targets) against the CUDA Occupancy Calculator's method.

Source of the method: the CUDA toolkit's ``cuda_occupancy.h`` (``cudaOccMaxActiveBlocksPerMultiprocessor``,
the programmatic CUDA Occupancy Calculator, the same method as the calculator spreadsheet's "GPU
Data" sheet) and the CUDA C++ Programming Guide's "Technical Specifications per Compute Capability":

- threads per block <= 1024; registers per thread <= 255;
- registers: per warp = ceil(regs * 32 / 256) * 256 (a thread's count rounded up to a multiple of 8);
  the register file is split over 4 sub-partitions: warps by registers = floor(65536 / 4 / per_warp) * 4;
  a block needs per_warp * ceil(warps / 4) * 4 <= 65536 registers;
- shared memory per block = ceil((shared + 1024 reserved) / 128) * 128 (1 KB reserved per block from
  compute capability 8.0), CTAs = floor(shared per SM / that); a block fits when that is <= the
  opt-in per-block limit + 1024;
- CTAs by warps = floor(max warps per SM / warps per block); CTAs <= max CTAs per SM.

Limits of the targets (conf/target/*.yaml, Programming Guide): sm80 167936 B shared per SM, 166912 B
opt-in per block, 64 warps, 32 CTAs; sm90 233472 B per SM, 232448 B per block, 64 warps, 32 CTAs;
sm120 102400 B per SM, 101376 B per block, 48 warps, 32 CTAs; 64K registers per SM on all three.
Every expected value below is worked out by hand in its comment, not computed by the code under test.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kernelcamp.targets import OCCUPANCY_FIELDS, block_limit, load_target, occupancy

ROOT = Path(__file__).resolve().parents[1]

# (target, registers per thread, shared bytes per block, num_warps) -> (ctas_per_sm, warps_per_sm, limited_by)
CALCULATOR_CASES = [
    # sm80, 200 regs, 1 warp: 200*32 = 6400 per warp (already a multiple of 256); per sub-partition
    # 16384 // 6400 = 2 warps -> 8 warps per SM -> 8 CTAs (a plain 65536 // 6400 = 10 would say 10).
    # Shared: 0 + 1024 reserved = 1024 -> 167936 // 1024 = 164. Warps: 64 // 1 = 64. CTAs: 32.
    ("sm80", 200, 0, 1, (8, 8, "registers")),
    # sm80, 37 regs -> 40 (1280 per warp): 16384 // 1280 = 12 -> 48 warps -> 48 // 8 = 6 CTAs.
    # Shared 41472 + 1024 = 42496 (= 332 * 128) -> 167936 // 42496 = 3 (without the reserved 1 KB:
    # 167936 // 41472 = 4). Warps 64 // 8 = 8. -> 3 CTAs, 24 warps, shared memory.
    ("sm80", 37, 41472, 8, (3, 24, "shared_memory")),
    # sm90, 128 regs (4096 per warp): 16384 // 4096 = 4 -> 16 warps -> 4 CTAs of 4 warps.
    # Shared 100000 + 1024 = 101024 -> rounded to 128: 790 * 128 = 101120 -> 233472 // 101120 = 2.
    ("sm90", 128, 100000, 4, (2, 8, "shared_memory")),
    # sm90, 1024 threads (32 warps), 64 regs (2048 per warp): block 2048 * 32 = 65536 <= 65536 fits;
    # 16384 // 2048 = 8 -> 32 warps -> 1 CTA. Warps 64 // 32 = 2. Shared 1024 -> 228.
    ("sm90", 64, 0, 32, (1, 32, "registers")),
    # sm90, 24 regs (768 per warp), 1 warp: 16384 // 768 = 21 -> 84 warps -> 84 CTAs; warps 64;
    # CTAs 32 -> the CTA limit: 32 CTAs, 32 warps.
    ("sm90", 24, 0, 1, (32, 32, "ctas")),
    # sm120, 255 regs -> 256 (8192 per warp), 8 warps: block 8192 * 8 = 65536 fits; 16384 // 8192 = 2
    # -> 8 warps -> 1 CTA. Warps 48 // 8 = 6.
    ("sm120", 255, 0, 8, (1, 8, "registers")),
    # sm120, 32 regs (1024 per warp), 4 warps: 16 per sub-partition -> 64 warps -> 16 CTAs; shared
    # 16384 + 1024 = 17408 (= 136 * 128) -> 102400 // 17408 = 5; warps 48 // 4 = 12 -> 5 CTAs, 20 warps.
    ("sm120", 32, 16384, 4, (5, 20, "shared_memory")),
    # sm120, 40 regs (1280 per warp), 2 warps: 16384 // 1280 = 12 -> 48 warps -> 24 CTAs; warps
    # 48 // 2 = 24 too (tie: registers is named first); shared 1024 -> 100; CTAs 32.
    ("sm120", 40, 0, 2, (24, 48, "registers")),
    # sm120, the whole opt-in 101376 B: 101376 + 1024 = 102400 -> exactly 1 CTA per 102400 B SM.
    ("sm120", 32, 101376, 4, (1, 4, "shared_memory")),
]


@pytest.mark.parametrize(("target", "regs", "shared", "warps", "expected"), CALCULATOR_CASES)
def test_occupancy_follows_the_calculator(target, regs, shared, warps, expected):
    """ctas_per_sm, warps_per_sm and limited_by equal the CUDA Occupancy Calculator's, worked out by hand."""
    got = occupancy(load_target(target), regs, shared, warps)
    assert (got["ctas_per_sm"], got["warps_per_sm"], got["limited_by"]) == expected
    assert block_limit(load_target(target), regs, shared, warps) is None


# (target, registers per thread, shared bytes, num_warps, words the reason must carry)
NEVER_FITS = [
    ("sm90", 32, 0, 64, "2048 threads per block, sm90 allows 1024"),  # 64 warps = 2048 threads
    ("sm90", 32, 0, 1024, "32768 threads per block, sm90 allows 1024"),
    ("sm120", 32, 0, 64, "2048 threads per block, sm120 allows 1024"),
    ("sm80", 256, 0, 4, "256 registers per thread, sm80 allows 255"),
    # 255 -> 8192 per warp x 16 warps = 131072 registers per block > 65536
    ("sm120", 255, 0, 16, "131072 registers per block"),
    # 130 -> 136 (4352 per warp) x 15 warps rounded up to 16 = 69632 > 65536 (hardware check)
    ("sm90", 130, 0, 15, "69632 registers per block"),
    ("sm120", 32, 101377, 4, "needs 101377 B shared memory, sm120 allows 101376 B per block"),
]


@pytest.mark.parametrize(("target", "regs", "shared", "warps", "words"), NEVER_FITS)
def test_config_beyond_a_per_block_limit_never_fits(target, regs, shared, warps, words):
    t = load_target(target)
    why = block_limit(t, regs, shared, warps)
    assert why is not None and words in why and "\n" not in why
    assert occupancy(t, regs, shared, warps) == {"ctas_per_sm": 0, "warps_per_sm": 0, "limited_by": "does_not_fit"}


def test_conf_targets_carry_the_calculator_fields():
    """Every named target states the calculator's constants itself (not only through defaults)."""
    for path in sorted((ROOT / "conf" / "target").glob("*.yaml")):
        raw = yaml.safe_load(path.read_text())
        if raw.get("arch") == "auto":
            continue
        missing = [f for f in OCCUPANCY_FIELDS if f not in raw]
        assert not missing, f"{path.name} lacks {missing}"
        t = load_target(path.stem)
        assert t.max_threads_per_block == 1024 and t.max_registers_per_block == 65536, path.name


def test_bad_calculator_field_is_one_line():
    from kernelcamp.errors import KernelcampError

    raw = load_target("sm90").as_dict()
    with pytest.raises(KernelcampError, match="register_alloc_unit = 0"):
        load_target({**raw, "register_alloc_unit": 0})

"""Does a kernel change change the compiled code? The sm90 PTX of the split-K kernel at one git commit
against another (or the working tree), per shape and config, cross-compiled without a GPU.

    env -u TRITON_INTERPRET python benchmarks/ptx_same.py REV_A [REV_B] [--configs T64_H64_w8_s2_kauto,...]
        [--shapes v32,v32_tp8,v4] [--arch 90] [--module kernels.sparse_mla_decode] [--batch 128]

REV_B defaults to the working tree's file. The default configs are Triton ones only (a revision from before the
warp-specialized kernel has none): pass ``--configs T32_H64_w12_s2_kauto_ws,...`` to compare that kernel too.
Each side's file is imported as ``baseline.kernel_rev`` imports it (``kernelcamp.kernel_rev``: written once into
the repo's git-ignored ``.kernelcamp/kernel_revs/``), compiled for each (shape, config) through its own
``compile_specs``, and
its PTX compared with line information, comments, debug sections and debug-only labels left out (a moved
line or a renamed local leaves the code the same; a changed parameter list does not, since the binary
differs). A pair that a side's ``compile_specs`` refuses with a ValueError (e.g. the warp-specialized kernel at
num_stages 3 on V3.2) is "skipped" when both sides refuse it and differs when one does. Exit status 0 when every
compared pair is identical, 1 when any differs (one line each), 2 on bad input, a failed compile or when both sides
refuse every pair (one ``error:`` line).

What it is for: a refactor of ``@triton.jit`` code (e.g. the V3.2 and V4 loops made one function, campaign
step "v4tiles" in reports/campaigns/kernel_speed/README.md) whose PTX is identical at every config runs
the same instructions on the GPU, so it needs no GPU A/B; a differing PTX does.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
if __name__ == "__main__":
    # compiling needs the real JIT: drop the interpreter before triton is imported (only when run as a
    # script: an importer, e.g. a test session on the interpreter, keeps its environment)
    os.environ.pop("TRITON_INTERPRET", None)


from kernelcamp.errors import KernelcampError  # noqa: E402
from kernelcamp.inspect.compile import compile_spec  # noqa: E402
from kernelcamp.kernel_rev import import_kernel_rev  # noqa: E402
from kernelcamp.variant import LaunchConfig  # noqa: E402

SHAPES = {"v32": ("deepseek_v32", 128, 2048), "v32_tp8": ("deepseek_v32", 16, 2048), "v4": ("deepseek_v4", 64, 512)}
CONFIGS = "T64_H64_w8_s2_kauto,T64_H64_w8_s1_kauto,T32_H16_w4_s3_k4,T64_H32_w8_s2_kauto,T32_H16_w4_s2_kauto"
# The batch size the specs are built for: the split kernel's binary depends on it only through its split-D parts
# (kernels.sparse_mla_decode.resolve_split_d: V3.2 launches that leave half the SMs idle, e.g. B=1); at 128 every
# shape runs one part. --batch 1 compares the small-batch binaries.
BATCH = 128


def normalized_ptx(ptx: str) -> str:
    """``ptx`` without ``.loc`` / ``.file`` lines, ``//`` comments, the DWARF sections after the code and
    the ``$L__tmp<n>:`` labels that only those sections reference (inlining scopes: folding a jit helper
    into its caller renumbers and moves them, not an instruction)."""
    cut = ptx.find(".section\t.debug")
    body = ptx if cut < 0 else ptx[:cut]
    keep = [
        ln
        for ln in body.splitlines()
        if not ln.strip().startswith((".loc", ".file", "//")) and not re.fullmatch(r"\$L__tmp\d+:", ln.strip())
    ]
    return "\n".join(re.sub(r"\s+$", "", ln) for ln in keep)


class Refused(Exception):
    """A revision's ``compile_specs`` refuses a (shape, config) pair with a ValueError, before any compiling (e.g. the
    warp-specialized kernel at num_stages 3 on V3.2: a depth its shared memory does not hold)."""


def split_kernel_ptx(module, shape: str, config: LaunchConfig, arch: int, batch: int = BATCH) -> str:
    """The normalized PTX of ``module``'s split-K kernel for ``shape`` and ``config`` at ``batch``, for ``sm<arch>``.
    Raises ``Refused`` (its first line the module's reason) when ``compile_specs`` refuses the pair; a compile that
    fails raises what the compiler raised."""
    layout, heads, topk = SHAPES[shape]
    try:
        spec = module.compile_specs(layout, heads, topk, config, batch=batch)[0]
    except ValueError as e:
        raise Refused(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__) from e
    return normalized_ptx(compile_spec(spec, arch).asm["ptx"])


def _side(rev: str | None, module: str):
    if rev is None:
        import importlib

        return importlib.import_module(module)
    return import_kernel_rev(module, rev, root=ROOT, cache_root=ROOT)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("rev_a", help="git commit of side A (a name or sha this repo knows)")
    p.add_argument("rev_b", nargs="?", help="git commit of side B (default: the working tree's file)")
    p.add_argument("--configs", default=CONFIGS, help=f"comma-separated config labels (default {CONFIGS})")
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    p.add_argument("--arch", type=int, default=90, help="compute capability to compile for (default 90)")
    p.add_argument("--module", default="kernels.sparse_mla_decode", help="the kernel module (default that one)")
    p.add_argument(
        "--batch", type=int, default=BATCH, help=f"batch size the binaries are built for (default {BATCH}; 1: split-D)"
    )
    a = p.parse_args(argv)
    names = [a.rev_a, a.rev_b or "working tree"]
    try:
        # a batch-table row's label (..._k8_b32, as reports print it) names the same launch config
        configs = [LaunchConfig.from_label(re.sub(r"_b\d+$", "", c.strip())) for c in a.configs.split(",") if c.strip()]
        if not configs:
            raise KernelcampError(f"--configs {a.configs!r}: no config label")
        shapes = [s.strip() for s in a.shapes.split(",") if s.strip()]
        if not shapes or any(s not in SHAPES for s in shapes):
            raise KernelcampError(f"--shapes {a.shapes!r}: expected a comma-separated list of {', '.join(SHAPES)}")
        if a.batch < 1:
            raise KernelcampError(f"--batch {a.batch}: expected a batch size >= 1")
        if a.arch < 80:
            raise KernelcampError(f"--arch {a.arch}: expected a compute capability >= 80 (e.g. 90 for sm90)")
        sides = []
        for which, rev in (("REV_A", a.rev_a), ("REV_B", a.rev_b)):
            try:
                sides.append(_side(rev, a.module))
            except KernelcampError as e:  # kernel_rev's message names the pipeline's key; here it is a CLI argument
                raise KernelcampError(f"{which} {str(e).removeprefix('baseline.kernel_rev = ')}") from e
    except (KernelcampError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    differ = skipped = 0
    for shape in shapes:
        for c in configs:
            ptx: list[str | None] = []
            refused = []
            for name, m in zip(names, sides, strict=True):
                try:
                    ptx.append(split_kernel_ptx(m, shape, c, a.arch, a.batch))
                except Refused as e:  # outside the launch domain there: compared as "no binary"
                    ptx.append(None)
                    refused.append(f"{name} refuses it: {e}")
                except Exception as e:  # noqa: BLE001 - a config that does not compile there is one line, exit 2
                    root = e
                    while root.__cause__ is not None:  # Triton's CompilationError wraps the reason
                        root = root.__cause__
                    why = next((ln.strip() for ln in str(root).splitlines() if ln.strip()), "")
                    print(
                        f"error: {name}: {shape} {c.config_label()} does not compile for sm{a.arch}: "
                        f"{type(root).__name__}: {why[:200]}",
                        file=sys.stderr,
                    )
                    return 2
            if ptx[0] is None and ptx[1] is None:  # refused on both sides: nothing to compare, not a difference
                skipped += 1
                print(f"skipped {shape} {c.config_label()} (sm{a.arch}): {refused[0].split(': ', 1)[1]}")
                continue
            same = ptx[0] == ptx[1]
            differ += not same
            why = f"; {refused[0]}" if refused else ""
            print(f"{'same   ' if same else 'DIFFERS'} {shape} {c.config_label()} (sm{a.arch}{why})")
    compared = len(shapes) * len(configs) - skipped
    if not compared:
        print(f"error: both sides refuse every pair ({skipped}): nothing was compared", file=sys.stderr)
        return 2
    tail = f", {skipped} skipped (refused by both)" if skipped else ""
    print(f"{names[0]} vs {names[1]}: {differ} of {compared} differ{tail}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())

"""How many serial rounds of global loads does the split-K combine wait through? Its sm90 SASS per batch table row,
cross-compiled without a GPU.

    env -u TRITON_INTERPRET python benchmarks/load_rounds.py [--rev REV] [--shapes v32,v32_tp8,v4]
        [--batches 1,2,4,8,16,24,32,48,64,96,128] [--arch 90] [--max-rounds N]

For each shape's tuned batch table (``conf/variant/tuned_*.yaml``) and each batch size whose row launches more than
one split, the combine binary that launch runs (``compile_specs(..., batch=B)``: its ``BLOCK_S`` splits by
``BLOCK_D`` columns and warps) is compiled, its SASS read with the ``cuobjdump`` of Triton's wheel, and the loads
counted in rounds (:func:`load_rounds`). One line per launch: shape, batch size, row, splits, tile, warps, rounds and
the loads of each round. ``--rev`` takes the kernel file at a git commit instead of the working tree's (imported as
``baseline.kernel_rev`` imports it). Exit status 0; 1 when ``--max-rounds`` is given and a launch waits through more
rounds; 2 on bad input (one ``error:`` line).

What it found, and what that was worth: ptxas issues a combine program's partial outputs a few at a time, each batch
after the one before was used (7 rounds at V3.2 B=1, 14 at B=2, with the LSEs loaded first and 4 warps). Campaign
step "combineload" (reports/campaigns/kernel_speed/combineload_sweep/README.md) brought every table row to one round,
and the combine did not get faster: the other programs on an SM hide one program's round trips. A count of rounds is
a fact about the schedule, not a prediction of time; measure before acting on one.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
if __name__ == "__main__":
    # compiling needs the real JIT: drop the interpreter before triton is imported (only when run as a script)
    os.environ.pop("TRITON_INTERPRET", None)

from kernelcamp.errors import KernelcampError  # noqa: E402

SHAPES = {
    "v32": ("deepseek_v32", 128, 2048, "tuned_deepseek_v32"),
    "v32_tp8": ("deepseek_v32", 16, 2048, "tuned_deepseek_v32_tp8"),
    "v4": ("deepseek_v4", 64, 512, "tuned_deepseek_v4_flash"),
}
BATCHES = "1,2,4,8,16,24,32,48,64,96,128"  # grid 5's batch sizes, which the tables were made from

_INSTR = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(.*?)\s*;")
_PRED = re.compile(r"^@!?U?P[T0-9]+\s+")
_REG = re.compile(r"\bR(\d+)\b")


def _width(opcode: str) -> int:
    """32-bit registers written by a global load ``opcode`` (``LDG.E.128`` 4, ``.64`` 2, else 1)."""
    return 4 if ".128" in opcode else 2 if ".64" in opcode else 1


def load_rounds(sass: str) -> list[int]:
    """The global loads of straight-line SASS in serial rounds: a list with the number of loads issued in each.

    ``sass`` is ``cuobjdump -sass`` text of one kernel. The instructions are read in order until the first ``EXIT``
    (branches are not followed: for a kernel without loops, such as the combine). ``LDG*`` loads (not ``LDGSTS``,
    the cp.async copies, whose waits are barriers) write their destination registers (4 for ``.128``, 2 for
    ``.64``); a round ends at the first instruction that reads a register a load of the round has not yet
    delivered, or a load whose address does: the warp waits there for the round's loads (one memory round trip).
    An instruction that overwrites a pending register (the ``other=`` value of a masked load set before it) is not
    a read. An approximation of the schedule ptxas chose: it assumes the loads of one round return together.
    Returns ``[]`` when there are no global loads.
    """
    rounds: list[int] = []
    pending: set[int] = set()
    issued = 0
    for line in sass.splitlines():
        m = _INSTR.match(line)
        if not m:
            continue
        ins = _PRED.sub("", m.group(1))
        opcode = ins.split()[0]
        regs = [int(r) for r in _REG.findall(ins[len(opcode) :])]
        if opcode.startswith("EXIT"):
            break
        is_load = opcode.startswith("LDG") and not opcode.startswith(("LDGSTS", "LDGDEPBAR"))
        stores = opcode.startswith(("ST", "RED", "ATOM"))
        reads = regs if stores else regs[1:]
        if pending and any(r in pending for r in reads):
            rounds.append(issued)
            pending.clear()
            issued = 0
        if is_load and regs:
            pending.update(range(regs[0], regs[0] + _width(opcode)))
            issued += 1
        elif regs and not stores:
            pending.discard(regs[0])
    if issued:
        rounds.append(issued)
    return rounds


def sass_of(cubin: bytes) -> str:
    """``cuobjdump -sass`` of ``cubin`` with the ``cuobjdump`` of Triton's wheel. Raises ``KernelcampError`` when it
    fails."""
    from kernelcamp.inspect.compile import tool_path

    tool = tool_path("cuobjdump")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        out = subprocess.run([str(tool), "-sass", str(path)], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise KernelcampError(f"cuobjdump ({tool}) exit {out.returncode}: {out.stderr.strip()[:200]}")
    return out.stdout


def combine_rounds(module, shape: str, batch: int, arch: int) -> dict | None:
    """The combine launched by ``shape``'s tuned table at ``batch``, compiled by ``module`` for ``sm<arch>``: a dict
    of the row, splits, tile, warps and :func:`load_rounds`; ``None`` when the row launches one split (no combine)."""
    import yaml

    from kernelcamp.inspect.compile import compile_spec
    from kernelcamp.variant import parse_variant

    layout, heads, topk, table = SHAPES[shape]
    variant = parse_variant(yaml.safe_load((ROOT / "conf" / "variant" / f"{table}.yaml").read_text()))
    config = variant.config_for_batch(batch)
    spec = module.compile_specs(layout, heads, topk, config, batch=batch)[-1]
    splits = spec.constexprs.get("n_splits")  # specialized only at 1 (then it does not run)
    block_s, block_d = spec.constexprs["BLOCK_S"], spec.constexprs["BLOCK_D"]
    if splits == 1:
        return None
    rounds = load_rounds(sass_of(compile_spec(spec, arch).asm["cubin"]))
    return {"row": config.label(), "block_s": block_s, "block_d": block_d, "warps": spec.num_warps, "rounds": rounds}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rev", help="git commit of the kernel file (default: the working tree's)")
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    p.add_argument("--batches", default=BATCHES, help=f"comma-separated batch sizes (default {BATCHES})")
    p.add_argument("--arch", type=int, default=90, help="compute capability to compile for (default 90)")
    p.add_argument("--max-rounds", type=int, help="exit 1 when a launch waits through more rounds than this")
    p.add_argument("--module", default="kernels.sparse_mla_decode", help="the kernel module (default that one)")
    a = p.parse_args(argv)
    try:
        shapes = [s.strip() for s in a.shapes.split(",") if s.strip()]
        if not shapes or any(s not in SHAPES for s in shapes):
            raise KernelcampError(f"--shapes {a.shapes!r}: expected a comma-separated list of {', '.join(SHAPES)}")
        try:
            batches = [int(b) for b in a.batches.split(",") if b.strip()]
        except ValueError:
            batches = []
        if not batches or min(batches) < 1:
            raise KernelcampError(f"--batches {a.batches!r}: expected comma-separated batch sizes >= 1")
        if a.arch < 89:
            raise KernelcampError(f"--arch {a.arch}: expected a compute capability >= 89 (fp8 e4m3; e.g. 90)")
        if a.rev is None:
            import importlib

            module = importlib.import_module(a.module)
        else:
            from kernelcamp.kernel_rev import import_kernel_rev

            try:
                module = import_kernel_rev(a.module, a.rev, root=ROOT, cache_root=ROOT)
            except KernelcampError as e:
                raise KernelcampError(f"--rev {str(e).removeprefix('baseline.kernel_rev = ')}") from e
    except KernelcampError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"# combine load rounds, sm{a.arch}, kernel file at {a.rev or 'the working tree'}")
    print("shape    B    row                        tile (S x D)  warps  rounds  loads per round")
    worst = 0
    for shape in shapes:
        for b in batches:
            r = combine_rounds(module, shape, b, a.arch)
            if r is None:
                continue
            n = len(r["rounds"])
            worst = max(worst, n)
            tile = f"{r['block_s']} x {r['block_d']}"
            print(f"{shape:<8} {b:<4} {r['row']:<26} {tile:<13} {r['warps']:<6} {n:<7} {r['rounds']}")
    if a.max_rounds is not None and worst > a.max_rounds:
        print(f"more than {a.max_rounds} round(s): {worst}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How many serial rounds of global loads does the split-K combine wait through? Its SASS per batch table row,
cross-compiled without a GPU (sm90 by default).

    env -u TRITON_INTERPRET python benchmarks/load_rounds.py [--rev REV] [--shapes v32,v32_tp8,v4]
        [--batches 1,2,4,8,16,24,32,48,64,96,128] [--arch 90] [--max-rounds N] [--module kernels.sparse_mla_decode]

For each shape's tuned batch table (``conf/variant/tuned_*.yaml``) and each batch size whose row launches more than
one split, the combine binary that launch runs (``compile_specs(..., batch=B)``) is compiled, its SASS read with the
``cuobjdump`` of Triton's wheel, and its loads counted in rounds (:func:`load_rounds`). One line per launch: shape,
batch size, row, tile (``BLOCK_S`` split slots by ``BLOCK_D`` columns), warps, rounds and the loads of each round.
``--rev`` takes the kernel file at a git commit instead of the working tree's (imported as ``baseline.kernel_rev``
imports it). Exit status 0; 1 when ``--max-rounds`` is given and a launch waits through more rounds; 2 on bad input
or a kernel file whose combine does not compile here (one ``error:`` line).

What it found, and what that was worth: ptxas issues a combine program's partial outputs a few at a time, each batch
after the one before was used (on sm90 with Triton 3.6, the LSEs loaded first and 4 warps: 7 rounds at V3.2 B=1, 14
at B=2). Campaign step "combineload" (reports/campaigns/kernel_speed/combineload_sweep/README.md) loaded the partials
first and ran 8 warps, one round at every table row. The two changes went together, so their effects are not
separated: the combine got faster where the rounds fell from 14 to 1 (V3.2 B=2, 4.95 to 4.27 us), not at all where
they fell from 7 to 1 (TP8 B=16), and slower at V3.2 B=1 and at V4-Flash B=1 (2.51 to 4.03 us). A count of rounds is a
fact about the schedule, not a prediction of time; measure before acting on one.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import sys
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
ARCHES = (89, 90, 100, 120)  # compute capabilities to cross-compile for (fp8 e4m3 needs sm89+; conf/target/)

_INSTR = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(.*?)\s*;")
_PRED = re.compile(r"^@!?U?P[T0-9]+\s+")
_REG = re.compile(r"\bR(\d+)(\.64)?\b")
_DEST = re.compile(r"^R(\d+)\b")


def _width(opcode: str) -> int:
    """32-bit registers written by the destination of ``opcode``: 4 for a ``.128`` load, 2 for a ``.64`` load, a
    ``.WIDE`` multiply-add or ``CS2R`` (a 64-bit register pair), else 1."""
    if ".128" in opcode:
        return 4
    return 2 if ".64" in opcode or ".WIDE" in opcode or opcode.startswith("CS2R") else 1


def _operands(ins: str, opcode: str) -> tuple[list[int], list[int]]:
    """``(written, read)`` 32-bit registers of one instruction (predicate stripped). The first operand is the
    destination when it is an ``R`` register and the instruction is not a store or reduction (``ST*``, ``RED``);
    otherwise (a predicate, a uniform register, none) every ``R`` operand is read. A ``.64`` operand reads a register
    pair, as does the 64-bit addend (last operand) of a ``.WIDE`` multiply-add."""
    ops = [o.strip() for o in ins[len(opcode) :].split(",")]
    written: list[int] = []
    if ops and not opcode.startswith(("ST", "RED")) and (m := _DEST.match(ops[0])):
        written = list(range(int(m.group(1)), int(m.group(1)) + _width(opcode)))
        ops = ops[1:]
    read: list[int] = []
    for i, op in enumerate(ops):
        for reg, pair in _REG.findall(op):
            wide = pair or (".WIDE" in opcode and i == len(ops) - 1)
            read.extend((int(reg), int(reg) + 1) if wide else (int(reg),))
    return written, read


def load_rounds(sass: str) -> list[int]:
    """The global loads of straight-line SASS in serial rounds: a list with the number of loads issued in each.

    ``sass`` is ``cuobjdump -sass`` text of one kernel. The instructions are read in order until the first
    unpredicated ``EXIT`` (branches are not followed: for a kernel without loops, such as the combine). ``LDG*``
    loads (not ``LDGSTS``, the cp.async copies, whose waits are barriers) write their destination registers; a round
    ends at the first instruction that reads a register a load of the round has not yet delivered (a load whose
    address does, too): the warp waits there for the round's loads, one memory round trip. An instruction that only
    overwrites a pending register (the ``other=`` value of a masked load set before it) does not end a round.
    Registers are read as :func:`_operands` parses them. An approximation of the schedule ptxas chose: it assumes
    the loads of one round return together, and it says nothing of how long a round takes (other warps on the SM
    overlap it). Returns ``[]`` when there are no global loads.
    """
    rounds: list[int] = []
    pending: set[int] = set()
    issued = 0
    for line in sass.splitlines():
        m = _INSTR.match(line)
        if not m:
            continue
        predicated = bool(_PRED.match(m.group(1)))
        ins = _PRED.sub("", m.group(1))
        opcode = ins.split()[0]
        if opcode.startswith("EXIT"):
            if predicated:
                continue
            break
        written, read = _operands(ins, opcode)
        if pending and any(r in pending for r in read):
            rounds.append(issued)
            pending.clear()
            issued = 0
        if opcode.startswith("LDG") and not opcode.startswith(("LDGSTS", "LDGDEPBAR")) and written:
            pending.update(written)
            issued += 1
        else:
            pending.difference_update(written)
    if issued:
        rounds.append(issued)
    return rounds


@functools.cache
def _table(name: str):  # noqa: ANN202 - a kernelcamp.variant.Variant, imported late
    """The batch table ``conf/variant/<name>.yaml``, parsed once per process."""
    import yaml

    from kernelcamp.variant import parse_variant

    return parse_variant(yaml.safe_load((ROOT / "conf" / "variant" / f"{name}.yaml").read_text()))


def combine_rounds(module, shape: str, batch: int, arch: int) -> dict | None:
    """The combine launched by ``shape``'s tuned table at ``batch``, compiled by ``module`` for ``sm<arch>``: a dict
    of the row, tile (``block_s``, ``block_d``), warps and :func:`load_rounds`; ``None`` when the row launches one split
    (no combine). Raises what the module's ``compile_specs`` or Triton raises."""
    from kernelcamp.inspect.compile import compile_spec, cuobjdump

    layout, heads, topk, table = SHAPES[shape]
    config = _table(table).config_for_batch(batch)
    spec = module.compile_specs(layout, heads, topk, config, batch=batch)[-1]
    splits = spec.constexprs.get("n_splits")  # specialized only at 1 (then it does not run)
    block_s, block_d = spec.constexprs["BLOCK_S"], spec.constexprs["BLOCK_D"]
    if splits == 1:
        return None
    rounds = load_rounds(cuobjdump(compile_spec(spec, arch).asm["cubin"], "--dump-sass", timeout=120))
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
            batches = [int(b) for b in a.batches.split(",")]
        except ValueError:
            batches = []
        if not batches or min(batches) < 1:
            raise KernelcampError(f"--batches {a.batches!r}: expected comma-separated batch sizes >= 1")
        if a.arch not in ARCHES:
            raise KernelcampError(
                f"--arch {a.arch}: expected one of {', '.join(map(str, ARCHES))} (fp8 e4m3 needs sm89+)"
            )
        if a.max_rounds is not None and a.max_rounds < 1:
            raise KernelcampError(f"--max-rounds {a.max_rounds}: expected a number of rounds >= 1")
        if a.rev is None:
            import importlib

            try:
                module = importlib.import_module(a.module)
            except ImportError as e:
                raise KernelcampError(f"--module {a.module}: cannot import it ({e})") from None
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
            try:
                r = combine_rounds(module, shape, b, a.arch)
            except Exception as e:  # noqa: BLE001 - an older kernel file's specs, a compile error: one line, exit 2
                why = str(e).strip().splitlines()[-1][:200] if str(e).strip() else ""
                print(
                    f"error: {shape} B={b}: the combine does not compile here ({type(e).__name__}: {why})",
                    file=sys.stderr,
                )
                return 2
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

"""Compile-time figures of the split-K kernel for sm90 (cross-compiled, no GPU): registers, spills,
shared bytes and SASS instruction counts (whole kernel and the main loop body).

    env -u TRITON_INTERPRET python benchmarks/compile_figures.py [--arch 90] [--dump DIR] [--module MOD]
        [--configs T32_H16_w4_s3,...] [--shapes v32,v4,v32_tp8] [--batch 128]

``--module``: a kernel module with the API of kernels.sparse_mla_decode (default that one), e.g. a
candidate copied next to it. A module that does not import or lacks ``compile_specs``, a config label
that does not parse or that the kernel refuses, or an unknown shape is one ``error:`` line and exit
status 2, before any compile.

``--batch``: the batch size the split kernel is built for (default 128). It changes the binary only through V3.2's
split-D parts (``resolve_split_d``: a launch that leaves at least half the SMs idle splits V's columns, into as many
parts as the programs allow), which depend on the config, the batch size and H: ``--batch B`` gives the binary a
launch at B runs (e.g. ``T64_H64_w8_s1`` at B=1: 2 parts on ``v32``, 4 on ``v32_tp8``; at B=2: 1 part on ``v32``).

"local B" is the per-thread local memory of the cubin (cuobjdump STACK + LOCAL, what the driver
reports as the local size; kernelcamp.inspect's ``local_bytes``), not ptxas's "spill stores".

The "loop" count is the number of SASS instructions between the first and last instruction of the
largest backward branch (the top-k tile loop); a proxy only, not a timing.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
if __name__ == "__main__":  # cross-compiling needs the real JIT; an import (a test) leaves the environment alone
    os.environ.pop("TRITON_INTERPRET", None)


from kernelcamp.inspect.compile import compile_spec, cuobjdump, read_cubin  # noqa: E402
from kernelcamp.variant import LaunchConfig  # noqa: E402

CONFIGS = ["T32_H64_w8_s1", "T16_H64_w8_s1", "T32_H16_w8_s2", "T16_H16_w4_s2"]
SHAPES = [("v32", "deepseek_v32", 128, 2048), ("v4", "deepseek_v4", 64, 512), ("v32_tp8", "deepseek_v32", 16, 2048)]


def parse(label: str) -> LaunchConfig:
    """``T32_H64_w8_s1`` (a label without the split) -> its config with num_splits "auto"."""
    return LaunchConfig.from_label(f"{label}_kauto")


def sass_counts(cubin: bytes) -> tuple[int, int, str]:
    text = cuobjdump(cubin, "--dump-sass")
    ins = re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", text)
    addr = [int(a, 16) for a, _ in ins]
    total = len(ins)
    best = 0
    for a, body in ins:
        m = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))", body)
        tgt = None
        lab = re.search(r"\.L_x_(\d+)", body)
        if m and m.group(1):
            tgt = int(m.group(1), 16)
        elif lab:
            lm = re.search(rf"\.L_x_{lab.group(1)}:\s*\n\s*/\*([0-9a-f]+)\*/", text)
            if lm:
                tgt = int(lm.group(1), 16)
        src = int(a, 16)
        if tgt is not None and tgt < src:
            n = sum(1 for x in addr if tgt <= x <= src)
            best = max(best, n)
    return total, best, text


def check_args(module: str, configs: str, shapes: str, batch: int = 128) -> tuple[object, list[str], list[str]]:
    """(the module's ``compile_specs``, config labels, shape names) from the command line, before any
    compile; ``ValueError`` naming the bad one and what is expected."""
    if batch < 1:
        raise ValueError(f"--batch {batch}: expected a batch size >= 1")
    hint = "give e.g. kernels.sparse_mla_decode"
    if not module.strip() or module.startswith("."):
        raise ValueError(f"--module {module!r}: expected an absolute module name; {hint}")
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - ImportError, or the module's own error (a SyntaxError, ...)
        raise ValueError(f"--module {module}: cannot import it ({type(e).__name__}: {e}); {hint}") from None
    if not callable(getattr(mod, "compile_specs", None)):
        raise ValueError(f"--module {module}: has no compile_specs (the API of kernels.sparse_mla_decode)")
    known = [fam for fam, *_ in SHAPES]
    names = [x.strip() for x in shapes.split(",") if x.strip()]
    bad = [x for x in names if x not in known]
    if bad or not names:
        raise ValueError(f"--shapes {shapes!r}: expected a comma list of {known}")
    labels = [x.strip() for x in configs.split(",") if x.strip()]
    if not labels:
        raise ValueError("--configs: empty; give labels like T32_H16_w4_s3")
    for label in labels:
        form = "T<BLOCK_T>_H<BLOCK_H>_w<warps>_s<stages> (no split), e.g. T32_H16_w4_s3"
        try:
            cfg = parse(label)
        except ValueError:
            raise ValueError(f"--configs {label!r}: expected {form}") from None
        for fam, layout, H, topk in SHAPES:
            if fam in names:
                try:  # the kernel's own config check (powers of two, warps, stages), without compiling
                    mod.compile_specs(layout, H, topk, cfg, batch=batch)
                except ValueError as e:
                    raise ValueError(f"--configs {label!r}: {e}") from None
    return mod.compile_specs, labels, names


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", type=int, default=90, help="target compute capability, e.g. 90 (sm90) or 120")
    ap.add_argument("--dump", default=None, help="folder for each compile's SASS and TTGIR")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma list of labels like T32_H16_w4_s3")
    ap.add_argument("--shapes", default="v32,v4,v32_tp8", help="comma list of v32, v4, v32_tp8")
    ap.add_argument("--module", default="kernels.sparse_mla_decode", help="kernel module with compile_specs")
    ap.add_argument("--batch", type=int, default=128, help="batch size the split kernel is built for (default 128)")
    a = ap.parse_args()
    try:
        compile_specs, labels, shapes = check_args(a.module, a.configs, a.shapes, a.batch)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"sm{a.arch}, the split kernel as launched at batch {a.batch}\n")
    print("| shape | config | regs | local B | shared B | SASS total | SASS loop |")
    print("|---|---|---|---|---|---|---|")
    for fam, layout, H, topk in SHAPES:
        if fam not in shapes:
            continue
        for label in labels:
            cfg = parse(label)
            spec = compile_specs(layout, H, topk, cfg, batch=a.batch)[0]
            try:
                k = compile_spec(spec, a.arch)
            except Exception as e:  # noqa: BLE001
                print(f"| {fam} | {label} | error: {str(e).strip().splitlines()[-1][:100]} |")
                continue
            cubin = k.asm["cubin"]
            fig, _ = read_cubin(cubin, k.metadata.name)
            total, loop, text = sass_counts(cubin)
            if a.dump:
                Path(a.dump).mkdir(parents=True, exist_ok=True)
                (Path(a.dump) / f"{fam}_{label}.sass").write_text(text)
                (Path(a.dump) / f"{fam}_{label}.ttgir").write_text(k.asm["ttgir"])
            row = [fam, label, fig["registers"], fig["local_bytes"], k.metadata.shared, total, loop]
            print("| " + " | ".join(str(x) for x in row) + " |", flush=True)


if __name__ == "__main__":
    main()

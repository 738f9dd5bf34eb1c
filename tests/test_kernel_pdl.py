"""Programmatic dependent launch between the split kernel and the combine (kernels/sparse_mla_decode.py, module
docstring; campaign step "pdl"), on the CPU: the binaries as the inspector and the launcher build them for sm90
and sm120, and the launcher's choice. The GPU side (replays that must read fresh partial outputs) is in
tests/test_kernel_gpu.py.
"""

from __future__ import annotations

import json
import subprocess
import sys

import torch
from nointerp import ROOT, env_without_interpreter

from kernels import sparse_mla_decode as smd

_PDL_PTX = r"""
import json
from kernelcamp.inspect.compile import compile_spec
from kernelcamp.variant import LaunchConfig
from kernels.sparse_mla_decode import compile_specs
rows = []
for cfg, arch in [(LaunchConfig(64, 64, 8, 1, "auto"), 90), (LaunchConfig(32, 16, 4, 3, 8), 120),
                  (LaunchConfig(32, 64, 12, 2, "auto", warp_specialize=True), 90)]:
    for sp in compile_specs("deepseek_v32", 128, 2048, cfg, batch=1, all_split_d=True):
        k = compile_spec(sp, arch)
        ptx = k.asm["ptx"]
        rows.append({"name": sp.name, "arch": arch, "options": sp.options, "launch_pdl": k.metadata.launch_pdl,
                     "trigger": ptx.count("griddepcontrol.launch_dependents"),
                     "wait": ptx.count("griddepcontrol.wait")})
print(json.dumps(rows))
"""


def test_split_kernels_trigger_and_the_combine_waits_as_compiled_for_sm90_and_sm120():
    r = subprocess.run(
        [sys.executable, "-c", _PDL_PTX],
        env=env_without_interpreter(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads(r.stdout.strip().splitlines()[-1])
    split = [x for x in rows if x["name"].startswith("sparse_mla_split")]
    comb = [x for x in rows if x["name"] == "sparse_mla_combine"]
    # B=1 at H=128: the Triton row launches split-D 2 (and 1 elsewhere in its range), the ws kernel one binary
    assert {x["name"] for x in split} >= {"sparse_mla_split_d2", "sparse_mla_split_ws"}
    assert len(comb) == 3
    # every split kernel lets the combine launch early, once, and waits for nothing itself
    assert all(x["trigger"] == 1 and x["wait"] == 0 and not x["launch_pdl"] for x in split), split
    # the combine is built with the launch attribute and waits before its first load
    assert all(x["wait"] == 1 and x["trigger"] == 0 and x["launch_pdl"] for x in comb), comb
    assert all(x["options"] == {"launch_pdl": True} for x in comb)


def test_no_pdl_off_a_gpu_or_in_the_interpreter():
    # the CPU suite runs the kernels in the interpreter on CPU tensors (tests/test_kernel.py: the launches there pass
    # PDL off): griddepcontrol has no meaning there
    assert smd._use_pdl(torch.device("cpu")) is False

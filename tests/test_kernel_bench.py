"""Checks the benchmark stage makes before any measurement (kernelcamp.bench.kernel, serving.bench)."""

from __future__ import annotations

import copy
import socket
from pathlib import Path

import pytest

from kernelcamp.bench.kernel import check_kernel_params
from kernelcamp.bench.serving import check_baseline_port
from kernelcamp.errors import KernelcampError
from kernelcamp.io import load_params
from kernelcamp.serve.testing import free_port

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def params() -> dict:
    return load_params(ROOT / "params.yaml")


@pytest.mark.parametrize(
    "device,path,value,needle",
    [
        ("cpu", ("benchmark", "kernel", "cpu_rounds"), 0, "benchmark.kernel.cpu_rounds=0: expected an integer >= 2"),
        ("cuda", ("benchmark", "kernel", "rounds"), 1, "benchmark.kernel.rounds=1"),
        ("cuda", ("benchmark", "kernel", "replays_per_round"), 0, "benchmark.kernel.replays_per_round=0"),
        ("cpu", ("workload", "cpu", "batch_sizes"), [], "workload.cpu.batch_sizes=[]: expected a non-empty list"),
        ("cuda", ("benchmark", "kernel", "batch_sizes"), [1, -8], "benchmark.kernel.batch_sizes=[1, -8]"),
        ("cuda", ("benchmark", "kernel", "min_rounds"), 1, "benchmark.kernel.min_rounds=1"),
        ("cuda", ("benchmark", "kernel", "min_rounds"), 61, "benchmark.kernel.min_rounds=61"),
        ("cuda", ("benchmark", "kernel", "look_every"), 0, "benchmark.kernel.look_every=0"),
        ("cuda", ("benchmark", "kernel", "max_seconds"), 0, "benchmark.kernel.max_seconds=0"),
        ("cuda", ("benchmark", "kernel", "batch_sizes"), [8, 1, 8], "batch size 8 appears more than once"),
    ],
)
def test_unusable_round_counts_and_batch_sizes_are_refused(params, device, path, value, needle):
    # `-S benchmark.kernel.cpu_rounds=0` built and deployed, then failed with "summarize: no samples".
    p = copy.deepcopy(params)
    d = p
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value
    with pytest.raises(KernelcampError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        check_kernel_params(p, device)


def test_defaults_pass(params):
    check_kernel_params(params, "cpu")
    check_kernel_params(params, "cuda")


def test_a_cpu_run_of_a_warp_specialized_config_is_refused_before_the_rounds(params):
    """`-S +variant.warp_specialize=true ...` on a CPU built and deployed, then the first launch raised a ValueError
    ("dot_dtype='fp16': the warp-specialized kernel ... runs bf16 only") with a 30-line traceback."""
    p = copy.deepcopy(params)
    ws = {"BLOCK_T": 32, "BLOCK_H": 64, "num_warps": 12, "num_stages": 2, "num_splits": "auto", "warp_specialize": True}
    p["variant"] = {"name": "ws", **ws}
    with pytest.raises(
        KernelcampError, match=r"variant 'ws': T32_H64_w12_s2_kauto_ws \(its row for B=1\) is warp-spec"
    ):
        check_kernel_params(p, "cpu")
    check_kernel_params(p, "cuda")  # a GPU runs it
    # a table whose CPU batch sizes choose only Triton rows passes; the baseline is checked too
    triton = {"BLOCK_T": 16, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2, "num_splits": "auto"}
    p["variant"] = {"name": "t", "configs": [{"max_batch": 4, **triton}, ws]}
    p["workload"]["cpu"]["batch_sizes"] = [1, 3]
    check_kernel_params(p, "cpu")
    p["baseline"] = {"name": "bws", "configs": [{"max_batch": 1, **triton}, ws]}
    with pytest.raises(KernelcampError, match=r"baseline 'bws': .*\(its row for B=3\)"):
        check_kernel_params(p, "cpu")


def test_busy_baseline_port_is_found_before_the_rounds(params, tmp_path):
    # A held baseline port was reported only after every kernel round had run.
    port = free_port()
    p = copy.deepcopy(params)
    p["benchmark"]["serving"] = {**p["benchmark"]["serving"], "enabled": True, "baseline_port_offset": 1}
    p["deploy"] = {**(p.get("deploy") or {}), "port_free_timeout_s": 0.5}
    record = {"kind": "embedded", "url": f"http://127.0.0.1:{port - 1}"}
    with socket.socket() as held:
        held.bind(("127.0.0.1", port))
        held.listen(1)
        with pytest.raises(KernelcampError, match=f"baseline server port {port} on 127.0.0.1"):
            check_baseline_port(p, record, tmp_path)
    check_baseline_port(p, record, tmp_path)  # free again: passes
    check_baseline_port(p, {"kind": "command", "url": record["url"]}, tmp_path)  # no baseline server there


def test_kernel_plan_gpu_sequential_cpu_fixed(params):
    from kernelcamp.bench.kernel import decision_metrics, kernel_plan

    bk = params["benchmark"]["kernel"]
    g = kernel_plan(params, "cuda")
    assert (g.min_rounds, g.max_rounds, g.look_every, g.max_seconds) == (
        bk["min_rounds"],
        bk["rounds"],
        bk["look_every"],
        bk["max_seconds"],
    )
    assert g.threshold == params["report"]["threshold"] and g.confidence == params["report"]["confidence"]
    assert kernel_plan(params, "cpu").looks == [bk["cpu_rounds"]]
    m = decision_metrics(
        {"decision": "equivalent", "half_width": 0.004, "n_rounds": 15, "max_rounds": 60, "stop_reason": "decided"}
    )
    assert m == {"decision_code": 2, "half_width": 0.004, "rounds_used": 15, "stopped_early": 1}
    # decided at the last look: not early (it said 1)
    last = decision_metrics({"decision": "slower", "n_rounds": 60, "max_rounds": 60, "stop_reason": "decided"})
    assert last["stopped_early"] == 0 and last["decision_code"] == 1
    # inconclusive keeps the code it had under the three-outcome rule
    assert decision_metrics({"decision": "inconclusive"})["decision_code"] == 0

"""The roofline % is measured against the peaks of the GPU that ran, never another GPU's of the same arch.

The fault (2026-12-05): the lent machine was an H100 (sm90) while conf/target/sm90.yaml, params.yaml's target and
bench_kernel.py's default all carried the H200's peaks (4,250 GB/s measured copy); the step reports and the kernel
summary gave the H100's roofline % against them, about 29% low (4,250 against the H100's 3,033 GB/s), beside a
header that named the H100.
"""

from __future__ import annotations

import csv
import importlib.util
import types
from pathlib import Path

import pytest

from kernelcamp.bench.kernel import roofline_basis
from kernelcamp.report import roofline_note
from kernelcamp.targets import load_target, peaks_for_gpu, resolve_target

ROOT = Path(__file__).resolve().parents[1]
H100 = "NVIDIA H100 80GB HBM3"  # torch.cuda.get_device_name() on the lent H100 (device_head.txt, 2026-12-05)
H200 = "NVIDIA H200"
_spec = importlib.util.spec_from_file_location("bench_kernel", ROOT / "benchmarks" / "bench_kernel.py")
bk = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bk)


def test_each_gpu_gets_its_own_peaks_whatever_target_the_params_name():
    sm90 = load_target("sm90").as_dict()  # params.yaml's target section: the H200
    assert peaks_for_gpu(H200, sm90)["peak_gbps"] == 4250
    got = peaks_for_gpu(H100, sm90)
    assert (got["target"], got["peak_gbps"], got["peak_bf16_tflops"]) == ("sm90_h100", 3033.0, 989.0)
    assert "measured device copy on the lent H100" in got["peak_gbps_source"]
    assert peaks_for_gpu("NVIDIA H100 PCIe", sm90) is None  # another H100 (2.0 TB/s): no borrowed peaks
    assert peaks_for_gpu(None, sm90) is None


def test_roofline_basis_records_the_gpu_that_ran_and_what_params_described():
    sm90 = load_target("sm90").as_dict()
    b = roofline_basis(sm90, H100)
    assert b["target"] == "sm90_h100" and b["peak_gbps"] == 3033.0
    assert (b["params_target"], b["params_target_gpu"]) == ("sm90", H200)
    note = roofline_note(b)
    assert note.startswith(f"Roofline %: against the peaks of {H100}, the GPU that ran (conf/target `sm90_h100`")
    assert "3,033 GB/s" in note and f"params.yaml's target `sm90` describes {H200}" in note
    assert "describes" not in roofline_note(roofline_basis(sm90, H200))  # the params' own GPU: nothing to say
    unknown = roofline_basis(sm90, "NVIDIA GH200 480GB")
    assert unknown["target"] is None and "no conf/target/*.yaml has gpu: NVIDIA GH200 480GB" in unknown["why"]
    assert roofline_note(unknown).startswith("Roofline %: not computed on NVIDIA GH200 480GB")
    assert roofline_basis(sm90, None)["target"] is None  # a CPU run


def _fake_gpu(monkeypatch, name: str) -> None:
    import torch

    props = types.SimpleNamespace(
        name=name,
        major=9,
        minor=0,
        multi_processor_count=132,
        shared_memory_per_block_optin=232448,
        shared_memory_per_multiprocessor=233472,
        regs_per_multiprocessor=65536,
        max_threads_per_multi_processor=2048,
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i=0: props)


def test_target_auto_on_an_h100_does_not_borrow_the_h200s_peaks(monkeypatch):
    _fake_gpu(monkeypatch, H100)
    t = resolve_target("auto")
    assert (t.gpu, t.peak_gbps) == (H100, 3033)
    _fake_gpu(monkeypatch, "NVIDIA H100 NVL")  # sm90, no file names it: the limits, and no peaks
    t = resolve_target("auto")
    assert t.num_sms == 132 and t.peak_gbps is None and t.peak_bf16_tflops is None


def test_bench_target_must_name_the_gpu_measured():
    label, t = bk.roofline_target("auto", H100)
    assert label == "conf/target/sm90_h100.yaml" and t["peak_gbps"] == 3033.0
    with pytest.raises(ValueError, match=r"describes NVIDIA H200, but the GPU measured is NVIDIA H100 80GB HBM3"):
        bk.roofline_target("conf/target/sm90.yaml", H100)
    with pytest.raises(ValueError, match=r"--target auto: no conf/target/\*\.yaml has gpu: NVIDIA H100 NVL"):
        bk.roofline_target("auto", "NVIDIA H100 NVL")
    assert bk.roofline_target("conf/target/sm90.yaml", H200)[1]["peak_gbps"] == 4250


def test_resummarize_recomputes_an_h100_csvs_roofline_against_the_h100(tmp_path):
    # final 22's case: an H100's rows whose roofline % was taken against the H200's 4,250 GB/s
    us = 91.09  # TP8 B=128, the H100's p50 (final_22/kernel_bench.csv)
    wrong = bk.roofline_pct("deepseek_v32", 128, 16, 2048, us, {"peak_gbps": 4250, "peak_bf16_tflops": 989})
    row = {
        "family": "v32_tp8",
        "layout": "deepseek_v32",
        "H": 16,
        "topk": 2048,
        "B": 128,
        "impl": "triton",
        "config": "T64_H16_w12_s2_kauto_ws",
        "num_splits": 1,
        "latency_us_p50": us,
        "latency_us_p20": us,
        "latency_us_p80": us,
        "tflops": 1.0,
        "gbps": bk.gbps("deepseek_v32", 128, 16, 2048, us),
        "roofline_pct": wrong,
        "gpu_name": H100,
    }
    with (tmp_path / "kernel_bench.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        w.writeheader()
        w.writerow(row)
    (tmp_path / "summary.md").write_text(
        f"# h\n\nGPU {H100}.\n\nTiming: 10 replays; roofline against conf/target/sm90.yaml.\n\n"
        "## Best config per shape\nold\n"
    )
    assert bk.main(["--out", str(tmp_path), "--resummarize"]) == 0
    right = bk.roofline_pct("deepseek_v32", 128, 16, 2048, us, {"peak_gbps": 3033, "peak_bf16_tflops": 989})
    assert right == pytest.approx(wrong * 4250 / 3033)
    md = (tmp_path / "summary.md").read_text()
    assert f"roofline against conf/target/sm90_h100.yaml ({H100}: 3,033 GB/s, 989 TFLOP/s bf16)." in md
    assert f"| {right:.1f} |" in md and f"| {wrong:.1f} |" not in md
    (got,) = bk.read_rows(tmp_path / "kernel_bench.csv")
    assert got["roofline_pct"] == pytest.approx(right)
    assert f"The targets are set for the {H200}; these rows were timed on {H100}" in md


def test_an_h200_summary_has_no_other_gpu_note():
    row = {"family": "v4_flash", "layout": "deepseek_v4", "H": 64, "topk": 512, "B": 1, "impl": "triton"}
    row |= {"config": "T32_H16_w4_s2_kauto", "num_splits": 16, "latency_us_p50": 9.0, "latency_us_p20": 9.0}
    row |= {"latency_us_p80": 9.0, "tflops": 1.0, "gbps": 1.0, "roofline_pct": 1.0}
    md = "\n".join(bk.summary_body([{**row, "gpu_name": H200}]))
    assert "The targets are set for" not in md and "v4_flash B=1: 9.00 us" in md


def test_device_copy_without_a_gpu_is_one_line_and_exit_2(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the script measures")
    _s = importlib.util.spec_from_file_location("device_copy", ROOT / "benchmarks" / "device_copy.py")
    dc = importlib.util.module_from_spec(_s)
    _s.loader.exec_module(dc)
    assert dc.main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: device_copy.py needs a CUDA GPU (none visible)"]

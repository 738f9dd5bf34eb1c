"""benchmarks/bench_kernel.py's summary: targets judged on what a batch table runs, re-rendered without a GPU."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_kernel", ROOT / "benchmarks" / "bench_kernel.py")
bk = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bk)

# a table that does not change (a step baseline): B <= 1 T32_H16_w4_s2, ..., else T64_H64_w8_s3 (the shipped V4 table
# moves with the campaign: its rows once broke these tests when step wsv4 remade it)
TABLE = ROOT / "conf" / "baseline" / "tuned_deepseek_v4_flash_v4tiles.yaml"


def _row(B: int, label: str, us: float) -> dict:
    return {
        "family": "v4_flash",
        "layout": "deepseek_v4",
        "H": 64,
        "topk": 512,
        "B": B,
        "impl": "triton",
        "config": label,
        "num_splits": 1,
        "latency_us_p50": us,
        "latency_us_p20": us,
        "latency_us_p80": us,
        "tflops": 1000.0 / us,
        "gbps": 10000.0 / us,
        "roofline_pct": 1000.0 / us,
        "gpu_name": "NVIDIA H200",
    }


ROWS = [
    _row(1, "T32_H16_w4_s2_kauto", 10.0),
    _row(128, "T64_H64_w8_s3_kauto", 50.0),  # the table's B=128 row
    _row(128, "T64_H64_w8_s1_kauto", 10.0),  # faster, but no row of the table: 100% of roofline
]


def test_targets_are_judged_on_the_tables_own_row_not_the_fastest_config():
    without = "\n".join(bk.summary_body(ROWS))
    assert "v4_flash B=128: roofline_pct 100.0 (T64_H64_w8_s1_kauto) (target >= 50): met" in without
    tables = bk.load_tables(f"v4_flash={TABLE.relative_to(ROOT)}")
    md = "\n".join(bk.summary_body(ROWS, tables))
    assert "Judged on the table's own row at that batch size for v4_flash, on the fastest measured" in md
    assert "v4_flash B=128: roofline_pct 20.0 (T64_H64_w8_s3_kauto) (target >= 50): NOT met" in md
    assert (
        "| v4_flash | tuned_deepseek_v4_flash_v4tiles | 128 | T64_H64_w8_s3_kauto | 50.00 | 20.0 | 200 | 20.0 | 10.00 |"
        in md
    )
    assert "| v4_flash | tuned_deepseek_v4_flash_v4tiles | 1 | T32_H16_w4_s2_kauto | 10.00 |" in md


def test_resummarize_keeps_the_header_and_remakes_the_rest(tmp_path):
    with (tmp_path / "kernel_bench.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(ROWS[0]))
        w.writeheader()
        w.writerows(ROWS)
    (tmp_path / "summary.md").write_text(
        "# Sparse MLA decode kernel benchmark\n\nGPU X, measured then.\n\n## Best config per shape\nold\n"
    )
    rc = bk.main(["--out", str(tmp_path), "--resummarize", "--tables", f"v4_flash={TABLE}"])
    assert rc == 0
    md = (tmp_path / "summary.md").read_text()
    assert md.startswith("# Sparse MLA decode kernel benchmark\n\nGPU X, measured then.\n\n## Best config per shape")
    # the roofline % recomputed against the peaks of the GPU that timed the rows (the H200's, conf/target/sm90.yaml)
    pct = bk.roofline_pct("deepseek_v4", 128, 64, 512, 50.0, {"peak_gbps": 4250, "peak_bf16_tflops": 989})
    assert "old" not in md and f"roofline_pct {pct:.1f} (T64_H64_w8_s3_kauto)" in md


def test_bad_tables_entry_is_one_line_and_exit_2(tmp_path, capsys):
    assert bk.main(["--out", str(tmp_path), "--resummarize", "--tables", "v5=conf/variant/x.yaml"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "expected FAMILY=PATH with FAMILY one of" in err[0]
    list_variant = ROOT / "conf" / "variant" / "story_autotune.yaml"  # an autotune list
    assert bk.main(["--out", str(tmp_path), "--resummarize", "--tables", f"v32={list_variant}"]) == 2
    assert "is not a batch table" in capsys.readouterr().err
    assert bk.main(["--out", str(tmp_path), "--resummarize"]) == 2  # nothing to re-render
    assert "no " in capsys.readouterr().err


def test_clock_line_gives_the_clock_while_timed_not_only_the_idle_reading():
    prov = {"sm_clock_mhz": 345, "max_sm_clock_mhz": 1980}
    rows = [{**r, "sm_clock_mhz": 345, "sm_clock_mhz_timed": c} for r, c in zip(ROWS, (1980, 1965, 1755), strict=True)]
    rows.append({"impl": "torch_ref", "sm_clock_mhz": 345, "sm_clock_mhz_timed": None})  # the reference is not sampled
    assert bk.clock_text(rows, prov) == (
        "1755 / 1965 / 1980 MHz while timed (min / median / max of the rows), 345 MHz idle before the run (max 1980)"
    )
    assert bk.clock_text(ROWS, prov) == "345 MHz idle before the run (max 1980)"  # no sample read: says only that


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_run_records_the_clock_while_timed(tmp_path):
    args = ["--out", str(tmp_path), "--families", "v4_flash", "--batches", "8", "--configs", "T32_H16_w4_s2_kauto"]
    assert (
        bk.main([*args, "--no-ref", "--replays", "3", "--num-cache-tokens", "4096", "--tables", f"v4_flash={TABLE}"])
        == 0
    )
    (row,) = bk.read_rows(tmp_path / "kernel_bench.csv")
    assert row["latency_us_p50"] > 0 and "sm_clock_mhz" in row
    if row["sm_clock_mhz_timed"] is not None:  # None only where nvidia-smi gives no reading
        assert 0 < row["sm_clock_mhz_timed"] <= 5000
    md = (tmp_path / "summary.md").read_text()
    assert "idle before the run" in md and "## Each table's own row" in md


def test_a_table_row_not_measured_or_failed_is_said_so_in_every_target_line():
    tables = bk.load_tables(f"v4_flash={TABLE}")
    rows = [ROWS[2], {**ROWS[0], "config": "T64_H64_w8_s1_kauto"}]  # neither table row measured
    rows.append({**ROWS[1], "latency_us_p50": None, "error": "OutOfResources: shared memory"})  # B=128 row failed
    md = "\n".join(bk.summary_body(rows, tables))
    assert "- v4_flash B=1: not measured (T32_H16_w4_s2_kauto) (target <= 12 us): NOT met" in md
    assert "- v4_flash B=128: roofline_pct failed (target >= 50): NOT met" in md
    assert "| T64_H64_w8_s3_kauto | failed (below) | - | - | - |" in md


@pytest.mark.parametrize(
    ("csv_text", "needle"),
    [
        ("", "not a kernel_bench.csv"),
        ("a,b\n1,2\n", "not a kernel_bench.csv"),
        ("family,impl,config,B,latency_us_p50\n", "no rows"),
        ("family,impl,config,B,latency_us_p50\nv4_flash,triton,T32_H16_w4_s2_kauto,1,10.0\nv4_flash,tri", "line 3"),
    ],
)
def test_resummarize_refuses_a_bad_csv_and_leaves_the_summary(tmp_path, capsys, csv_text, needle):
    (tmp_path / "kernel_bench.csv").write_text(csv_text)
    (tmp_path / "summary.md").write_text("# h\n\n## Best config per shape\nkept\n")
    assert bk.main(["--out", str(tmp_path), "--resummarize"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert (tmp_path / "summary.md").read_text().endswith("kept\n")


def test_a_tables_entry_that_is_not_a_variant_file_is_one_line(tmp_path, capsys):
    for bad in ("README.md", "conf/target/sm90.yaml"):
        assert bk.main(["--out", str(tmp_path), "--resummarize", "--tables", f"v32={bad}"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"'v32={bad}'" in err[0] and "is not a variant file" in err[0], err
    assert bk.main(["--out", str(tmp_path), "--resummarize", "--tables", f"v32={TABLE},v32={TABLE}"]) == 2
    assert "a second table for v32" in capsys.readouterr().err


def test_a_warp_specialized_config_is_timed_only_where_its_kernel_runs():
    # kernel_bench_final.sh times every table's configs on every family: the V3.2 table's _ws rows would be
    # error rows on TP8 (H=16), where the launcher refuses them; V4-Flash (H=64) runs them since the kernel has
    # V4's layout, at a power-of-two page size
    ws = bk.LaunchConfig.from_label("T32_H64_w12_s2_kauto_ws")
    assert bk.runs_on(ws, "v32") and not bk.runs_on(ws, "v32_tp8") and bk.runs_on(ws, "v4_flash")
    assert not bk.runs_on(ws, "v32", page_size=48) and not bk.runs_on(ws, "v4_flash", page_size=1)
    t64 = bk.LaunchConfig.from_label("T64_H64_w8_s2_kauto")
    assert bk.runs_on(t64, "v4_flash") and not bk.runs_on(t64, "v32_tp8")

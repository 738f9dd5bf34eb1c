"""benchmarks/make_tuned_tables.py: grid CSV rows -> a batch-table variant that parses and picks the winners."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from kernelcamp.variant import parse_variant

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("make_tuned_tables", ROOT / "benchmarks" / "make_tuned_tables.py")
mtt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mtt)


def _row(B: int, label: str, us: float, **kw: str) -> dict[str, str]:
    t, h, w, s = label.split("_")[:4]
    base = {"family": "v32", "impl": "triton", "layout": "deepseek_v32", "H": "128", "topk": "2048", "B": str(B)}
    cfg = {"BLOCK_T": t[1:], "BLOCK_H": h[1:], "num_warps": w[1:], "num_stages": s[1:]}
    return {**base, **cfg, "config": label, "latency_us_p50": str(us), **kw}


def test_fastest_per_batch_merged_into_a_table_that_parses(tmp_path):
    rows = [
        _row(1, "T64_H32_w8_s2_kauto", 19.0),
        _row(1, "T32_H64_w8_s1_kauto", 21.0),
        _row(8, "T32_H64_w8_s3_kauto", 52.0),
        _row(8, "T64_H32_w8_s2_kauto", 50.0, error="OutOfResources"),  # an error row never wins
        _row(32, "T32_H64_w8_s3_kauto", 160.0),
        _row(128, "T32_H64_w8_s3_kauto", 600.0),
        _row(128, "T32_H64_w8_s1_k2", 640.0),
        _row(128, "T16_H16_w4_s2_kauto", 1.0, family="v32_tp8"),  # another family is ignored
    ]
    winners = mtt.best_per_batch(rows, "v32")
    assert [(w["B"], w["config"]) for w in winners] == [
        (1, "T64_H32_w8_s2_kauto"),
        (8, "T32_H64_w8_s3_kauto"),
        (32, "T32_H64_w8_s3_kauto"),
        (128, "T32_H64_w8_s3_kauto"),
    ]
    table = mtt.table_rows(winners)
    assert table == [
        {"max_batch": 1, "BLOCK_T": 64, "BLOCK_H": 32, "num_warps": 8, "num_stages": 2, "num_splits": "auto"},
        {"BLOCK_T": 32, "BLOCK_H": 64, "num_warps": 8, "num_stages": 3, "num_splits": "auto"},
    ]
    v = parse_variant(yaml.safe_load(mtt.render("t", "v32", [Path("g.csv")], winners, table)))
    assert v.is_table and v.config_for_batch(1).BLOCK_H == 32 and v.config_for_batch(2).BLOCK_H == 64


def test_a_warp_specialized_winner_is_a_warp_specialized_row():
    # bench_kernel.py's label of the warp-specialized kernel ends in _ws; its row carries warp_specialize (a
    # split count parsed from "..._kauto_ws" was "auto_ws" before)
    rows = [
        _row(1, "T64_H64_w8_s1_kauto", 15.7),
        _row(1, "T32_H64_w12_s2_kauto_ws", 16.1),
        _row(128, "T64_H64_w8_s2_kauto", 404.0),
        _row(128, "T32_H64_w12_s2_k2_ws", 261.0),
    ]
    table = mtt.table_rows(mtt.best_per_batch(rows, "v32"))
    assert table[1] == {
        "BLOCK_T": 32,
        "BLOCK_H": 64,
        "num_warps": 12,
        "num_stages": 2,
        "num_splits": 2,
        "warp_specialize": True,
    }
    assert "warp_specialize" not in table[0]
    v = parse_variant({"name": "t", "configs": table})
    assert v.config_for_batch(128).warp_specialize and not v.config_for_batch(1).warp_specialize


def test_one_winner_everywhere_is_written_as_a_single_config():
    rows = [_row(b, "T64_H16_w8_s2_k8", 10.0 * b) for b in (1, 8, 128)]
    winners = mtt.best_per_batch(rows, "v32")
    doc = yaml.safe_load(mtt.render("t", "v32", [Path("g.csv")], winners, mtt.table_rows(winners)))
    v = parse_variant(doc)
    assert "configs" not in doc and v.single and v.configs[0].num_splits == 8


def test_the_committed_tuned_tables_are_what_the_committed_grids_make(tmp_path):
    d = "reports/campaigns/kernel_speed"
    # grid_5 (step "table5"): eleven batch sizes on the kernel file of 8a4651a, a larger row's config kept within 2%
    # of the fastest (the TP8 table since step "table10" with grid_10's and grid_11's rows of step "p2"'s H=16 kernel
    # from B=8 on; before it, *_tp8_ws16 and *_tp8_p2, with grid_9's rows of step "ws16"'s kernel from B=32 on); grid_7
    # (step "ws") and grid_8 (step "wsv4") the same for V3.2 and V4-Flash with the warp-specialized kernel's configs
    # (V3.2's since step "b1h16" with final_21's B=1 row, the H=16 kernel; before it *_v32_table10, grid_7 alone;
    # both since step "table12" with grid_12's B=1-4 rows, the baselines *_tp8_table10 and *_v32_b1h16 before it;
    # V3.2's since step "h32b" with the H100 benches of steps h32 and h32b, B=2-4 on the 32-head tile, the baseline
    # *_v32_qload16 before it);
    # the tables before them are the steps' baselines (conf/baseline/*_grid3, *_grid4, *_v4tiles at tolerance 0; the
    # V4 table of step table5, *_table5, pinned to its kernel_rev; the TP8 table of step table5 again as
    # *_tp8_sload, pinned to main's kernel file before step ws16), each made from its own grid
    jobs = [
        (
            "v32",
            "tuned_deepseek_v32",
            [
                f"{d}/grid_7/v32.csv",
                f"{d}/final_21/kernel_bench.csv",
                f"{d}/grid_12/v32.csv",
                f"{d}/h32_sweep/kernel_bench.csv",
                f"{d}/h32b_sweep/bench/kernel_bench.csv",
            ],
            "0.02",
            "conf/variant",
        ),
        (
            "v32",
            "tuned_deepseek_v32_qload16",
            [f"{d}/grid_7/v32.csv", f"{d}/final_21/kernel_bench.csv", f"{d}/grid_12/v32.csv"],
            "0.02",
            "conf/baseline",
        ),
        (
            "v32",
            "tuned_deepseek_v32_b1h16",
            [f"{d}/grid_7/v32.csv", f"{d}/final_21/kernel_bench.csv"],
            "0.02",
            "conf/baseline",
        ),
        ("v32", "tuned_deepseek_v32_table10", [f"{d}/grid_7/v32.csv"], "0.02", "conf/baseline"),
        (
            "v32_tp8",
            "tuned_deepseek_v32_tp8",
            [f"{d}/grid_{n}/v32_tp8.csv" for n in (5, 10, 11, 12)],
            "0.02",
            "conf/variant",
        ),
        (
            "v32_tp8",
            "tuned_deepseek_v32_tp8_table10",
            [f"{d}/grid_5/v32_tp8.csv", f"{d}/grid_10/v32_tp8.csv", f"{d}/grid_11/v32_tp8.csv"],
            "0.02",
            "conf/baseline",
        ),
        (
            "v32_tp8",
            "tuned_deepseek_v32_tp8_p2",
            [f"{d}/grid_5/v32_tp8.csv", f"{d}/grid_9/v32_tp8.csv"],
            "0.02",
            "conf/baseline",
        ),
        ("v32_tp8", "tuned_deepseek_v32_tp8_sload", [f"{d}/grid_5/v32_tp8.csv"], "0.02", "conf/baseline"),
        (
            "v32_tp8",
            "tuned_deepseek_v32_tp8_ws16",
            [f"{d}/grid_5/v32_tp8.csv", f"{d}/grid_9/v32_tp8.csv"],
            "0.02",
            "conf/baseline",
        ),
        ("v4_flash", "tuned_deepseek_v4_flash", [f"{d}/grid_8/v4_flash.csv"], "0.02", "conf/variant"),
        ("v4_flash", "tuned_deepseek_v4_flash_table5", [f"{d}/grid_5/v4_flash.csv"], "0.02", "conf/baseline"),
        ("v32", "tuned_deepseek_v32_grid3", [f"{d}/grid_3/v32.csv"], "0", "conf/baseline"),
        (
            "v32_tp8",
            "tuned_deepseek_v32_tp8_grid4",
            [f"{d}/grid_4/v32_tp8.csv", f"{d}/grid_4/final_bench_0446.csv"],
            "0",
            "conf/baseline",
        ),
        (
            "v4_flash",
            "tuned_deepseek_v4_flash_v4tiles",
            [f"{d}/candidates_10/call2/cand_v4p3_v4_flash.csv"],
            "0",
            "conf/baseline",
        ),
    ]
    for fam, name, grids, tol, where in jobs:
        args = ["--grid", *[str(ROOT / g) for g in grids], "--family", fam, "--name", name, "--out", str(tmp_path)]
        assert mtt.main([*args, "--tolerance", tol]) == 0
        made = yaml.safe_load((tmp_path / f"{name}.yaml").read_text())
        committed = yaml.safe_load((ROOT / where / f"{name}.yaml").read_text())
        committed.pop("kernel_rev", None)  # a baseline's pin to the kernel file it ran on, not a grid figure
        assert made == committed, name


def test_tolerance_keeps_the_larger_rows_config_only_within_it():
    rows = [
        _row(1, "T64_H64_w8_s1_kauto", 15.7),
        _row(1, "T64_H64_w8_s2_kauto", 16.0),  # 1.9% slower: kept at 0.02 (the B=8 row's config)
        _row(8, "T64_H64_w8_s2_kauto", 38.0),
        _row(32, "T64_H64_w8_s2_kauto", 120.0),  # 5% slower than the winner: not kept
        _row(32, "T64_H64_w8_s2_k2", 114.3),
        _row(128, "T64_H64_w8_s2_kauto", 403.0),
        _row(128, "T64_H64_w8_s2_k2", 450.0),
    ]
    winners = mtt.best_per_batch(rows, "v32")
    assert mtt.keep_within(rows, "v32", winners, 0.0) == [{**w, "fastest": w} for w in winners]
    kept = mtt.keep_within(rows, "v32", winners, 0.02)
    assert [(c["B"], c["config"], c["p50_us"]) for c in kept] == [
        (1, "T64_H64_w8_s2_kauto", 16.0),
        (8, "T64_H64_w8_s2_kauto", 38.0),
        (32, "T64_H64_w8_s2_k2", 114.3),
        (128, "T64_H64_w8_s2_kauto", 403.0),
    ]
    assert kept[0]["fastest"]["config"] == "T64_H64_w8_s1_kauto"
    # the B=8 row's config was kept at B=1: one row serves B <= 8
    assert mtt.table_rows(kept)[0] == {
        "max_batch": 8,
        "BLOCK_T": 64,
        "BLOCK_H": 64,
        "num_warps": 8,
        "num_stages": 2,
        "num_splits": "auto",
    }
    text = mtt.render("t", "v32", [Path("g.csv")], kept, mtt.table_rows(kept), 0.02)
    assert "B=1: T64_H64_w8_s2_kauto 16.0 us (kept within the tolerance; fastest T64_H64_w8_s1_kauto 15.7 us)" in text
    # a config the grid did not measure at a batch size is never kept there
    only = [_row(1, "T64_H64_w8_s1_kauto", 15.7), _row(8, "T64_H64_w8_s2_kauto", 38.0)]
    assert [c["config"] for c in mtt.keep_within(only, "v32", mtt.best_per_batch(only, "v32"), 0.5)] == [
        "T64_H64_w8_s1_kauto",
        "T64_H64_w8_s2_kauto",
    ]


@pytest.mark.parametrize("bad", ["-0.1", "1", "2", "inf", "nan", "abc"])
def test_a_tolerance_outside_0_1_is_one_error_line(tmp_path, capsys, bad):
    # 2 meant as 2% would silently be 200% (TP8 B=1 then ran 2 splits at 88 us where the fastest took 11)
    grid = tmp_path / "g.csv"
    grid.write_text("family,impl,B,config,latency_us_p50\n")
    args = ["--grid", str(grid), "--family", "v32", "--name", "t", "--out", str(tmp_path), f"--tolerance={bad}"]
    with pytest.raises(SystemExit) as e:
        mtt.main(args)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: argument --tolerance: ") and "[0, 1)" in err[0], err
    assert not (tmp_path / "t.yaml").exists()


def test_a_tie_at_tolerance_0_is_the_fastest_and_the_header_says_what_was_kept():
    rows = [
        _row(1, "T64_H64_w8_s1_kauto", 10.0),
        _row(1, "T64_H64_w8_s2_kauto", 10.0),
        _row(8, "T64_H64_w8_s2_kauto", 30.0),
    ]
    winners = mtt.best_per_batch(rows, "v32")
    assert mtt.keep_within(rows, "v32", winners, 0.0) == [{**w, "fastest": w} for w in winners]
    assert "kept within" not in mtt.render("t", "v32", [Path("g.csv")], winners, mtt.table_rows(winners))
    text = mtt.render("t", "v32", [Path("g.csv")], winners, mtt.table_rows(winners), 0.02)
    assert "or the next larger row's config where it is within 2% of the fastest there (--tolerance 0.02)." in text


def test_foreign_grids_and_an_unwritable_out_are_one_error_line_each(tmp_path, capsys):
    import csv

    def write(name, rows):
        path = tmp_path / name
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        return path

    good = write("good.csv", [_row(1, "T64_H64_w8_s1_kauto", 10.0, measured_at="2026-12-02T07:05:23Z")])
    cases = [
        # a block size the variant rules refuse (a KernelcampError, once a traceback)
        (["--grid", str(write("b48.csv", [_row(1, "T48_H64_w8_s1_kauto", 10.0)]))], "error: --grid"),
        # a family the grid lacks names the families it has
        (
            ["--grid", str(good), "--family", "v4_flash"],
            "error: --family v4_flash: the grid has no rows of it (families there: ['v32'])",
        ),
        # --out is a file (once a FileExistsError traceback)
        (["--grid", str(good), "--out", str(good)], f"error: --out {good}: cannot write"),
    ]
    for extra, want in cases:
        args = ["--family", "v32", "--name", "t", "--out", str(tmp_path / "out"), *extra]
        assert mtt.main(args) == 2, extra
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and want in err[0], err
    assert not (tmp_path / "out").exists()
    # a grid row without provenance columns (an old or short CSV) renders "?" instead of failing
    assert (
        mtt.main(
            [
                "--grid",
                str(write("bare.csv", [_row(1, "T64_H64_w8_s1_kauto", 10.0)])),
                "--family",
                "v32",
                "--name",
                "t",
                "--out",
                str(tmp_path / "out"),
            ]
        )
        == 0
    )
    assert "# Measured ? on ?" in (tmp_path / "out" / "t.yaml").read_text()


def test_winners_from_two_runs_name_each_run_with_its_batch_sizes():
    # a table made from two grids (grid 5's Triton rows and grid 9's H=16 warp-specialized ones): the header had
    # named only the first winner's run, so grid 9's rows read as measured on 2026-12-02 with grid 5's kernel
    old = {"measured_at": "2026-12-02T10:00:00Z", "gpu_name": "H200", "kernel_source_hash": "aaaa"}
    new = {"measured_at": "2026-12-03T11:27:46Z", "gpu_name": "H200", "kernel_source_hash": "bbbb"}
    rows = [
        _row(1, "T64_H16_w8_s2_kauto", 11.1, **old),
        _row(16, "T32_H16_w4_s3_k16", 27.0, **old),
        _row(128, "T32_H16_w4_s3_k2", 127.5, **new),
        _row(128, "T64_H16_w12_s2_k1_ws", 113.8, **new),
    ]
    winners = mtt.best_per_batch(rows, "v32")
    text = mtt.render("t", "v32", [Path("a.csv"), Path("b.csv")], winners, mtt.table_rows(winners))
    assert "# Measured (B=1, 16) 2026-12-02 on H200" in text and "# kernel source aaaa." in text
    assert "# Measured (B=128) 2026-12-03 on H200" in text and "# kernel source bbbb." in text
    # one run: the line as before, without the batch sizes
    one = mtt.render("t", "v32", [Path("a.csv")], winners[:2], mtt.table_rows(winners[:2]))
    assert "# Measured 2026-12-02 on H200" in one and one.count("# Measured") == 1

"""A batch-table variant through the pipeline's own logic: build's fit summary, the configs the
benchmark runs (whole on a CPU too: no autotuner), run_as_target never dropping a row, verify's
cases and the report's title."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from kernelcamp.bench import record
from kernelcamp.errors import KernelcampError
from kernelcamp.inspect import fit as kf
from kernelcamp.report import _who
from kernelcamp.variant import parse_variant

TABLE = parse_variant(
    {
        "name": "tbl",
        "configs": [
            {"max_batch": 1, "BLOCK_T": 32, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2},
            {"BLOCK_T": 32, "BLOCK_H": 64, "num_warps": 8, "num_stages": 1},
        ],
    }
)
LIST = parse_variant(
    {
        "name": "lst",
        "configs": [
            {"BLOCK_T": 16, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2},
            {"BLOCK_T": 32, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2},
        ],
    }
)


def _rows(fits: list[bool], target: str = "sm120") -> list[dict]:
    return [
        {"target": target, "config_index": i, "fits": f, "reason": None if f else "needs 131072 B shared memory"}
        for i, f in enumerate(fits)
    ]


def test_a_table_runs_only_when_every_row_fits():
    ok = kf.summarize(TABLE, _rows([True, True]), "sm120")
    assert ok["will_run"]["mode"] == "table" and ok["will_run"]["configs"] == [c.label() for c in TABLE.configs]
    # an autotune list would run the fitting config; a table's other batch sizes would fail to launch
    assert kf.summarize(LIST, _rows([True, False]), "sm120")["will_run"]["mode"] == "autotune"
    bad = kf.summarize(TABLE, _rows([True, False]), "sm120")
    assert bad["will_run"] is None and bad["pruned"][0]["config"] == TABLE.configs[1].label()


def _spec(variant, run_as=None, sizes=(1, 8)):
    raw = {
        "variant": {"name": variant.name},
        "baseline": {"name": LIST.name},
        "benchmark": {"kernel": {"batch_sizes": list(sizes)}},
        "workload": {"cpu": {"batch_sizes": list(sizes)}},
    }
    return SimpleNamespace(raw=raw, variant=variant, baseline=LIST, benchmark=SimpleNamespace(run_as_target=run_as))


def test_the_benchmark_runs_the_whole_table_on_a_cpu():
    variants, notes = record.variants_to_run(_spec(TABLE), {}, "cpu")
    assert variants["candidate"].configs == TABLE.configs and variants["candidate"].is_table
    assert "first config only" not in notes["candidate"]["config_list"]
    assert "batch table" in notes["candidate"]["config_list"]
    # an autotune list still runs its first config only on a CPU (no driver for the autotuner)
    assert len(variants["baseline"].configs) == 1 and "first config only" in notes["baseline"]["config_list"]
    assert "every config" not in notes["baseline"]["config_list"]  # it said "every config; CPU: first config only"
    assert _who(notes["candidate"]) == "tbl [table of 2]" and _who(notes["baseline"]) == "lst [2 configs]"


def test_the_benchmark_names_table_rows_its_batch_sizes_leave_unmeasured():
    # step "table4": the TP8 table's last row (2 splits, measured at B=128) ran B=64 1.39x slower than the
    # row it replaced, and neither the grid nor the experiment had measured B=64
    tp8 = parse_variant(
        {
            "name": "tp8",
            "configs": [
                {"max_batch": 8, "BLOCK_T": 64, "BLOCK_H": 16, "num_warps": 8, "num_stages": 2},
                {"max_batch": 32, "BLOCK_T": 32, "BLOCK_H": 16, "num_warps": 4, "num_stages": 3, "num_splits": 8},
                {"max_batch": 48, "BLOCK_T": 32, "BLOCK_H": 16, "num_warps": 4, "num_stages": 3, "num_splits": 4},
                {"BLOCK_T": 32, "BLOCK_H": 16, "num_warps": 4, "num_stages": 3, "num_splits": 2},
            ],
        }
    )
    assert tp8.coverage([1, 8, 32, 128]) == [
        "row T32_H16_w4_s3_k8_b32 runs B=9-32 with 8 splits at each, measured at B=32 only: B=9-16 (half of B=32 "
        "or less) is not measured",
        "row T32_H16_w4_s3_k4_b48 runs B=33-48, none of them measured",
        "row T32_H16_w4_s3_k2 runs B>=49 with 2 splits at each, measured at B=128 only: B=49-64 (half of B=128 or "
        "less) is not measured",
    ]
    # exactly half is the table4 case (B=64 on the row measured at 128); duplicates and order do not matter
    last = parse_variant(
        {"name": "t", "configs": [{**tp8.configs[0].as_dict(), "max_batch": 63}, tp8.configs[3].as_dict()]}
    )
    assert last.coverage([128, 1, 32, 32]) == [
        "row T32_H16_w4_s3_k2 runs B>=64 with 2 splits at each, measured at B=128 only: B=64 (half of B=128 or "
        "less) is not measured"
    ]
    assert tp8.coverage([1, 8, 15, 32, 40, 63, 128]) == []
    assert TABLE.coverage([1]) == ["row T32_H64_w8_s1_kauto runs B>=2, none of them measured"]
    assert LIST.coverage([1]) == [] and TABLE.coverage([1, 2]) == []  # "auto" splits adapt to B
    _, notes = record.variants_to_run(_spec(tp8, sizes=(1, 8, 32, 128)), {}, "cpu")
    assert notes["candidate"]["unmeasured_rows"] == tp8.coverage([1, 8, 32, 128])
    assert notes["baseline"]["unmeasured_rows"] == []


def test_run_as_target_never_drops_a_row_of_a_table():
    build = {
        "variant": {"rows": _rows([True, False], "sm120")},
        "baseline": {"rows": _rows([True, True], "sm120")},
    }
    with pytest.raises(KernelcampError, match=r"batch-table row\(s\) \[1\] do not fit sm120"):
        record.variants_to_run(_spec(TABLE, run_as="sm120"), build, "cpu")


def test_verify_checks_each_row_and_the_table_as_the_server_launches_it():
    import yaml

    from kernelcamp.verify.kernel import check_kernel

    params = yaml.safe_load((Path(__file__).resolve().parents[1] / "params.yaml").read_text())
    params["workload"] = {**params["workload"], "layout": "deepseek_v4", "num_heads": 64, "topk": 512}
    params["verify"]["kernel"]["cpu_shapes"] = [[1, 16, 32], [2, 16, 32]]
    cases = check_kernel(params, {"candidate": TABLE}, "cpu", "fp16")
    assert [c["config"] for c in cases] == [
        TABLE.configs[0].label(),
        TABLE.configs[1].label(),
        "table",
        TABLE.configs[0].label(),
        TABLE.configs[1].label(),
        "table",
    ]
    assert all(c["passed"] for c in cases), [c for c in cases if not c["passed"]]

"""benchmarks/serving_noise_summary.py: the noise probe's per-run line from step records and nvidia-smi samples."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _summary():
    spec = importlib.util.spec_from_file_location(
        "serving_noise_summary", ROOT / "benchmarks" / "serving_noise_summary.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _dec(index, batch, bucket, step_ms, gpu_ms, t, prefills=0, launch_ms=0.05, load_ms=0.5, **kw):
    return {
        "index": index,
        "kind": "decode",
        "batch": batch,
        "bucket": bucket,
        "step_ms": step_ms,
        "attn_ms": None,
        "gpu_ms": gpu_ms,
        "load_ms": load_ms,
        "launch_ms": launch_ms,
        "sync_ms": step_ms - load_ms - launch_ms,
        "prefills": prefills,
        "t": t,
        **kw,
    }


INFO = {
    "kernel_source_hash": "k1",
    "variant_hash": "v1",
    "steps": [
        {"index": 10, "kind": "prefill", "batch": 5, "bucket": None, "step_ms": 3.0, "attn_ms": None, "t": 100.0},
        _dec(11, 60, 64, 10.0, 8.0, 100.011, prefills=1),
        _dec(12, 64, 64, 12.0, 8.5, 100.024, load_ms=0.7),  # gap 13 - 12 = 1.0 ms
        _dec(13, 30, 32, 6.0, 4.0, 100.0315, launch_ms=2.0),  # gap 7.5 - 6 = 1.5 ms
        _dec(14, 30, 32, 50.0, 4.0, 100.09, profiled=True),  # under the profiler: left out
        _dec(15, 31, 32, 8.0, 4.2, 100.1),  # not consecutive with 13 (14 between): no gap
    ],
}

SMI = """# fields: timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active
2026/12/01 10:00:00.000, 1980, 2619, 650.50, 55, 0x0000000000000000
2026/12/01 10:00:00.100, 1755, 2619, 700.00, 58, 0x0000000000000004
2026/12/01 10:00:00.200, [N/A], 2619, [N/A], 57, 0x0000000000000001
2026/12/01 10:00:00.300, 345, 2619, 80.00, 60, 0x0000000000000001
a line cut short by the kill, 1900
"""


def test_decode_fields_split_step_and_gpu_time_per_bucket():
    f = _summary().decode_fields(INFO)
    assert f["server_decode_steps"] == 4 and f["server_decode_gpu_ms_steps"] == 4
    assert (f["server_decode_step_ms_mean"], f["server_decode_step_ms_p50"]) == (9.0, 9.0)
    assert f["server_decode_step_ms_p90"] == pytest.approx(11.4)  # inclusive: 10 + 0.7 * (12 - 10)
    assert f["server_decode_gpu_ms_mean"] == pytest.approx(6.175)
    assert f["server_decode_gpu_ms_p50"] == pytest.approx(6.1)
    assert f["server_decode_gpu_ms_p90"] == pytest.approx(8.35)
    assert f["server_decode_launch_ms_p50"] == pytest.approx(0.05)
    assert f["server_decode_load_ms_p90"] == pytest.approx(0.64)  # [0.5, 0.5, 0.5, 0.7]: 0.5 + 0.7 * 0.2
    assert f["server_decode_sync_ms_mean"] == pytest.approx((9.45 + 11.25 + 3.5 + 7.45) / 4)
    assert f["server_buckets"] == {
        "32": {"n": 2, "step_ms_p50": 7.0, "gpu_ms_p50": pytest.approx(4.1)},
        "64": {"n": 2, "step_ms_p50": 11.0, "gpu_ms_p50": pytest.approx(8.25)},
    }
    assert f["server_decode_period_ms_mean"] == pytest.approx((100.1 - 100.011) * 1e3 / 3, abs=1e-3)
    assert f["server_decode_gap_ms_mean"] == pytest.approx(1.25, abs=1e-3)
    assert f["server_decode_steps_after_prefill"] == 1
    assert (f["server_kernel_source_hash"], f["server_variant_hash"]) == ("k1", "v1")


def test_a_server_without_gpu_times_gives_nulls_not_zeros():
    # a CPU server, or the "before" tree of a comparison, from before gpu_ms was recorded
    new = ("gpu_ms", "load_ms", "launch_ms", "sync_ms", "prefills")
    old = {"steps": [{k: v for k, v in s.items() if k not in new} for s in INFO["steps"]]}
    f = _summary().decode_fields(old)
    assert f["server_decode_step_ms_p50"] == 9.0
    assert f["server_decode_gpu_ms_p50"] is None and f["server_decode_gpu_ms_steps"] == 0
    assert f["server_decode_sync_ms_p50"] is None
    assert f["server_buckets"]["64"] == {"n": 2, "step_ms_p50": 11.0, "gpu_ms_p50": None}
    assert _summary().decode_fields({})["server_decode_step_ms_p50"] is None


def test_smi_fields_from_samples_skip_unsupported_values_and_name_throttle_bits():
    g = _summary().smi_fields(SMI)
    assert (g["smi_samples"], g["smi_samples_busy"]) == (4, 2)  # the short line is dropped
    # clocks and power over the busy samples (no gpu_idle bit), temperature over all
    assert (g["sm_clock_mhz_mean"], g["sm_clock_mhz_min"], g["sm_clock_mhz_max"]) == (1867.5, 1755.0, 1980.0)
    assert (g["mem_clock_mhz_mean"], g["power_w_mean"], g["temp_c_max"]) == (2619.0, 675.25, 60.0)
    assert g["throttle_reasons"] == ["0x0000000000000000", "0x0000000000000001", "0x0000000000000004"]
    assert g["throttle_reason_names"] == ["gpu_idle", "sw_power_cap"]
    # a newer driver's name for the field, and a query without it
    newer = _summary().smi_fields(SMI.replace("clocks_throttle_reasons", "clocks_event_reasons"))
    assert newer["throttle_reason_names"] == ["gpu_idle", "sw_power_cap"]
    without = "# fields: timestamp,clocks.sm\n2026/12/01 10:00:00.000, 1410\n2026/12/01 10:00:00.100, 345\n"
    w = _summary().smi_fields(without)  # no reasons: every sample counts
    assert (w["sm_clock_mhz_mean"], w["sm_clock_mhz_min"], w["smi_samples_busy"]) == (877.5, 345.0, 2)
    assert w["power_w_mean"] is None and w["throttle_reasons"] == []


@pytest.mark.parametrize("text", [None, "", "# nvidia-smi: none\n", "1980, 2619\n"])  # the last: no fields line
def test_no_nvidia_smi_gives_nulls(text):
    g = _summary().smi_fields(text)
    assert g["smi_samples"] == 0
    assert [g[k] for k in ("sm_clock_mhz_mean", "sm_clock_mhz_min", "power_w_mean", "temp_c_max")] == [None] * 4
    assert g["throttle_reasons"] == [] and g["throttle_reason_names"] == []


def test_row_command_writes_the_json_line_and_the_digest(tmp_path, capsys):
    mod = _summary()
    (tmp_path / "run.json").write_text(json.dumps({"output_tok_s": 5000.0, "tpot_ms_p50": 12.5}) + "\n")
    (tmp_path / "info.json").write_text(json.dumps(INFO))
    (tmp_path / "smi.csv").write_text(SMI)
    paths = [str(tmp_path / n) for n in ("run.json", "info.json", "smi.csv")]
    assert mod.main(["row", "after", "2", *paths]) == 0
    out, err = capsys.readouterr()
    row = json.loads(out)
    assert (row["tree"], row["run"], row["output_tok_s"]) == ("after", 2, 5000.0)
    assert row["server_decode_gpu_ms_p50"] == pytest.approx(6.1) and row["sm_clock_mhz_mean"] == 1867.5
    assert "step p50 9.0 ms, gpu p50 6.1 ms" in err and "SM clock mean 1867.5 MHz" in err
    # no smi file (nvidia-smi missing), a broken info answer, no loadgen row: a line of nulls, not a failure
    (tmp_path / "info.json").write_text("curl wrote nothing useful")
    (tmp_path / "run.json").write_text("")
    assert mod.main(["row", "after", "3", paths[0], paths[1], str(tmp_path / "absent.csv")]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["error"] == "loadgen wrote no JSON row" and row["server_decode_steps"] == 0
    assert row["server_decode_gpu_ms_p50"] is None and row["sm_clock_mhz_mean"] is None


def test_summary_lists_each_runs_step_gpu_and_clock():
    rows = [
        {"tree": "after", "run": r, "output_tok_s": tok, "server_decode_step_ms_p50": s, "server_decode_gpu_ms_p50": g}
        | {"sm_clock_mhz_mean": c}
        for r, tok, s, g, c in [(1, 5000.0, 9.0, 8.0, 1980.0), (2, 4000.0, 11.0, 9.9, 1700.0)]
    ]
    (line,) = _summary().summary_lines(rows)
    assert line.startswith("after: output tok/s mean 4500, cv 15.7%, range 22.2% over 2 runs")
    assert (
        "step_ms p50 [9.0, 11.0]" in line and "gpu_ms p50 [8.0, 9.9]" in line and "SM MHz mean [1980.0, 1700.0]" in line
    )


def test_summary_groups_by_any_label_and_refuses_to_be_silent(tmp_path, capsys):
    m = _summary()
    rows = [{"mode": "pinned", "output_tok_s": v} for v in (100.0, 110.0)] + [{"tree": "x", "output_tok_s": 90.0}]
    f = tmp_path / "noise.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert m.main(["summary", str(f)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("pinned: output tok/s mean 105, cv 6.7%") and "x:" not in out  # one run of x: no line
    assert m.main(["summary", str(tmp_path / "missing.jsonl")]) == 2
    f.write_text(json.dumps({"tree": "after", "output_tok_s": 1.0}) + "\n")
    assert m.main(["summary", str(f)]) == 1
    assert m.main(["row", "before", "x", "a", "b", "c"]) == 2


def test_gc_pauses_of_the_engine_and_the_front_are_summed_and_kept():
    m = _summary()
    steps = [_dec(1, 8, 8, 1.0, 0.8, 10.0, gc_ms=0.0), _dec(2, 8, 8, 80.0, 0.8, 10.1, gc_ms=74.5)]
    steps.append({"index": 3, "kind": "prefill", "batch": 5, "step_ms": 3.0, "t": 10.2, "gc_ms": 0.5})
    info = {"steps": steps, "gc": {"pause_ms": [1.0, 2.0, 75.0], "collections": [9, 3, 1]}}
    info["front_gc"] = {"pause_ms": [0.5, 0.0, 0.0], "collections": [4, 0, 0]}
    out = m.decode_fields(info)
    assert out["server_gc_ms_sum"] == 75.0 and out["server_gc_ms_max"] == 74.5
    assert out["engine_gc_pause_ms_since_start"] == 78.0 and out["engine_gc_full_collections_since_start"] == 1
    assert out["front_gc_pause_ms_since_start"] == 0.5 and out["front_gc_full_collections_since_start"] == 0
    # a server from before the collector was watched: nulls, not zeros
    old = m.decode_fields({"steps": [_dec(1, 8, 8, 1.0, 0.8, 10.0)]})
    assert old["server_gc_ms_sum"] is None and old["engine_gc_pause_ms_since_start"] is None
    assert old["front_gc_full_collections_since_start"] is None

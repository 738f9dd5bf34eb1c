"""dvc.yaml: a stage depends on every params key its code reads, so a changed value reruns it."""

from __future__ import annotations

from pathlib import Path

import yaml
from param_reads import ParamReads

ROOT = Path(__file__).resolve().parents[1]


def test_benchmark_stage_depends_on_the_report_keys_its_stopping_rule_reads():
    # 2026-12-05: `-S report.threshold=0.01` after a run at 0.05 skipped the benchmark stage, so benchmark.json kept
    # the 0.05 decisions (batch 1 "equivalent" with a CI of [0.9747, 1.0238]) beside MLflow's threshold 0.01
    params = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["benchmark"]["params"]
    src = (ROOT / "kernelcamp" / "bench" / "kernel.py").read_text()
    assert 'rep.get("threshold"' in src or 'rep["threshold"]' in src  # kernel_plan reads report.threshold
    for k in ("confidence", "threshold"):
        assert f"report.{k}" in params, f"benchmark stage lacks report.{k}"


def _covered(key: str, params: list[str]) -> bool:
    return any(key == p or key.startswith(p + ".") or p.startswith(key + ".") for p in params)


def test_verify_reruns_for_every_key_its_serving_plan_reads():
    # 2026-12-05: `-S benchmark.serving.cpu_concurrency=[1,4]` after a run at [1,2] skipped verify ("didn't change"):
    # verify_details.json kept concurrency [1, 2] beside MLflow's [1, 4], and the report accepted it
    from kernelcamp.bench.serving import serving_plan

    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    src = (ROOT / "kernelcamp" / "verify" / "serving.py").read_text()
    assert "serving_plan(params" in src  # the verify stage's serving check plans its levels with it
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    for on_cpu in (True, False):
        seen: set[str] = set()
        serving_plan(ParamReads(params, seen), on_cpu)
        leaves = {k for k in seen if not any(o.startswith(k + ".") for o in seen)}
        for stage in ("verify", "benchmark"):
            missing = sorted(k for k in leaves if not _covered(k, stages[stage]["params"]))
            assert not missing, f"{stage} stage reads {missing} (serving_plan) but dvc.yaml does not rerun it for them"


def test_stages_whose_record_names_the_baselines_kernel_rerun_when_it_moves():
    # a `baseline.kernel_rev` branch moved: build and benchmark reran (spec.json -> build.json), verify was skipped,
    # and the report refused verify.json's old baseline_hash with advice (rerun the pipeline) that changed nothing
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]

    def upstream(stage: str) -> set[str]:
        deps = {d for d in stages[stage].get("deps") or [] if d.startswith("reports/")}
        out = set(deps)
        for name, st in stages.items():
            outs = {next(iter(o)) if isinstance(o, dict) else o for o in st.get("outs") or []}
            if outs & deps:
                out |= upstream(name)
        return out

    for stage in ("build", "benchmark", "verify"):  # their records carry baseline_hash / baseline_kernel_source_hash
        assert "reports/spec.json" in upstream(stage), f"{stage} does not rerun when the baseline's kernel moves"


def test_stages_that_read_conf_target_files_by_name_depend_on_them():
    # an edited conf/target/sm120.yaml (build.also_targets: [sm120]) skipped build: build.json kept sm120's old
    # pruned configs and the report accepted it (the params hold only the name)
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    for stage in ("build", "benchmark"):  # also_targets / run_as_target; peaks_for_gpu
        assert "conf/target" in stages[stage]["deps"], stage


def test_make_exps_drops_every_folder_dependency_column_and_no_param_or_metric():
    # `make exps` promised to drop exactly the dependency hashes, but its pattern missed the report stage's
    # `kernelcamp` folder column (helper-59). DVC names a dependency column by its path and drops the columns whose
    # name the pattern matches from the start (re.match, dvc.commands.experiments.show)
    import re

    make = (ROOT / "Makefile").read_text()
    pattern = re.search(r"^EXPS_DROP \?= (.*)$", make, re.M).group(1).replace("$$", "$")
    deps = {d for s in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"].values() for d in s.get("deps", [])}
    assert {"kernels", "kernelcamp"} <= deps
    for d in deps:
        assert re.match(pattern, d), f"make exps keeps the dependency column {d!r}"
    for col in ("Experiment", "Created", "cpu.kernel.ratio", "variant.num_warps", "kernel_latency_us"):
        assert not re.match(pattern, col), f"make exps drops {col!r}"

"""End to end: the real pipeline with `dvc exp run` in a temporary git+DVC copy of this tree.

CPU-only by design (cross-compiled build, interpreter verify, CPU-labelled timings, embedded server
on the CPU): about 3-4 minutes on 2 cores. Skipped, with the reason, while a stage script or a
module the stages import is not in the tree.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
NEEDED = [
    "stages/build.py",
    "stages/deploy.py",
    "stages/benchmark.py",
    "stages/verify.py",
    "stages/report.py",
    "kernels/sparse_mla_decode.py",
    "kernelcamp/bench/timing.py",
    "kernelcamp/inspect/compile.py",
    "kernelcamp/verify/capture.py",
]
missing = [p for p in NEEDED if not (ROOT / p).exists()]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(missing), reason=f"pipeline incomplete, missing: {missing}"),
    pytest.mark.skipif(shutil.which("dvc") is None, reason="dvc is not installed"),
]
IGNORE = shutil.ignore_patterns(
    ".git",
    "cache",
    "tmp",
    "mlflow.db*",
    "mlartifacts",
    "__pycache__",
    ".kernelcamp",
    ".kernelcamp_cache",
    "reports",
    "dvc.lock",
    ".pytest_cache",
    ".ruff_cache",
    ".whl",
    ".venv",
    "*.egg-info",
)


def sh(cmd, cwd, check=True, timeout=900, **env):
    e = {**os.environ, **env}
    e.pop("MLFLOW_TRACKING_URI", None)
    e.pop("DVC_ROOT", None)
    r = subprocess.run(cmd, cwd=cwd, shell=True, capture_output=True, text=True, timeout=timeout, env=e)
    if check and r.returncode != 0:
        raise AssertionError(f"`{cmd}` exited {r.returncode}\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}")
    return r


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    d = tmp_path_factory.mktemp("pipeline") / "ws"
    shutil.copytree(ROOT, d, ignore=IGNORE)
    tiny = (d / "conf/target/sm90.yaml").read_text().replace("name: sm90", "name: tiny")
    (d / "conf/target/tiny.yaml").write_text(
        tiny.replace("shared_bytes_per_block: 232448", "shared_bytes_per_block: 2048")
    )
    with socket.socket() as s:  # a port of its own: never collide with a server the workspace runs
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = (d / "conf/server/default.yaml").read_text()
    (d / "conf/server/default.yaml").write_text(server.replace("port: 8765", f"port: {port}"))
    sh(f"{sys.executable} -m kernelcamp.cli compose", d)
    sh("git init -q && git add -A && git -c user.email=t@t -c user.name=t commit -qm init", d)
    yield d
    if (d / "stages/deploy.py").exists():  # leave no server behind
        sh(f"{sys.executable} -m stages.deploy --stop", d, check=False, timeout=120)


def _runs(d):
    from mlflow.tracking import MlflowClient

    c = MlflowClient(f"sqlite:///{d / 'mlflow.db'}")
    exp = c.get_experiment_by_name("kernelcamp")
    return [] if exp is None else c.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"])


def _snapshot(d):
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in (d / "reports").rglob("*") if p.is_file()}


def _changed(before, after):
    """The reports/ files a failed run added, removed or rewrote, one line each (a dict diff of whole files
    names none of them in its tail; CI shows only the tail)."""
    return [
        f"{k}: {'added' if k not in before else 'removed' if k not in after else 'rewritten'}"
        for k in sorted(set(before) | set(after))
        if before.get(k) != after.get(k)
    ]


def _assert_unchanged(repo, before, r):
    changed = _changed(before, _snapshot(repo))
    assert not changed, f"{changed}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}"


def test_exp_run_shows_in_dvc_and_mlflow(repo):
    r = sh("dvc exp run -S variant.num_warps=8", repo)
    assert "Running stage 'report'" in r.stdout
    shown = json.loads(sh("dvc exp show --json", repo).stdout)
    exps = [e for row in shown for e in (row.get("experiments") or [])]
    names = [e["name"] for e in exps]
    assert exps, f"dvc exp show lists no experiment: {shown}"
    data = exps[0]["revs"][0]["data"]
    assert data["params"]["params.yaml"]["data"]["variant"]["num_warps"] == 8
    (run,) = _runs(repo)
    assert run.info.status == "FINISHED"
    assert run.data.params["variant.num_warps"] == "8"
    tags = run.data.tags
    for t in (
        "git_commit",
        "git_dirty",
        "variant",
        "variant_hash",
        "variant_config_hash",
        "baseline",
        "baseline_hash",
        "kernel_source_hash",
        "gpu",
        "torch",
        "triton",
        "deploy_id",
        "server_url",
        "decision",
        "kernelcamp.pid",
        "kernelcamp.host",
    ):
        assert tags.get(t) not in (None, ""), t
    assert tags["dvc_exp_name"] in names
    # a clean commit run with -S: the lock, params.yaml and the outputs DVC stages (git add) are the run's
    assert tags["git_dirty"] == "False", tags["git_dirty"]
    assert json.loads((repo / "reports/benchmark.json").read_text())["git_dirty"] is False
    # one name, one meaning: the MLflow tag is the hash the deployed server reports
    deploy = json.loads((repo / "reports/deploy.json").read_text())
    assert tags["variant_hash"] == deploy["variant_hash"]
    assert tags["server_url"] == deploy["url"]  # server.port is the configured one; a fallback shows here
    assert tags["device"] == "cpu" and tags["gpu"] == "none (cpu)"
    # what ran: params hold the GPU's batch sizes and levels beside the CPU's, and a CPU run measures the CPU's
    p = yaml.safe_load((repo / "params.yaml").read_text())
    cpu = p["workload"]["cpu"]
    assert tags["measured_kernel_shape"] == (
        f"{p['workload']['layout']} H={cpu['num_heads']} topk={cpu['topk']} page_size={cpu['page_size']} "
        f"num_cache_tokens={cpu['num_cache_tokens']}"
    )
    assert tags["measured_batch_sizes"] == ",".join(map(str, sorted(p["workload"]["cpu"]["batch_sizes"])))
    assert tags["measured_batch_sizes"] != ",".join(map(str, sorted(p["workload"]["batch_sizes"])))
    assert tags["measured_concurrency"] == ",".join(map(str, sorted(p["benchmark"]["serving"]["cpu_concurrency"])))
    bench = json.loads((repo / "reports/benchmark.json").read_text())
    assert bench["device"] == "cpu" and bench["measured_at"] and bench["deploy_id"]
    # no roofline on a CPU, and the record says so (on a GPU: the conf/target naming that GPU, tests/test_kernel_gpu.py)
    assert tags["roofline_target"] == "" and bench["kernel"]["roofline"]["why"] == "a CPU run has no roofline"
    assert "CPU run" in (repo / "reports/report.md").read_text()
    # CPU figures have CPU names in every metrics file (never beside GPU ones in `dvc metrics diff`)
    from kernelcamp.metrics import KEY_RE, TIMED_GROUPS, flatten

    m = json.loads((repo / "reports/benchmark_metrics.json").read_text())
    assert m["device"]["is_gpu"] == 0 and "kernel" in m["cpu"] and not set(TIMED_GROUPS) & set(m)
    # the headline is the one metrics file DVC lists; the MLflow run logs its keys and the benchmark's
    # detail (benchmark_metrics.json's keys), nothing else, all in the one naming scheme
    head = flatten(json.loads((repo / "reports/metrics.json").read_text()))
    assert "cpu.kernel.ratio" in head and all(KEY_RE.fullmatch(k) for k in head)
    assert set(run.data.metrics) == set(head) | set(flatten(m))
    assert {run.data.metrics[k] for k in head} == set(head.values())
    # a CPU run decides nothing: MLflow said faster or equivalent beside the tag's inconclusive
    from kernelcamp.stats import DECISION_CODES

    assert tags["decision"] == "inconclusive"
    assert run.data.metrics["cpu.kernel.ab.decision"] == DECISION_CODES["inconclusive"]
    assert bench["kernel"]["overall"]["decision"] == "inconclusive"
    shown_metrics = data["metrics"]
    assert list(shown_metrics) == ["reports/metrics.json"], list(shown_metrics)


def test_second_repro_reruns_nothing(repo):
    r = sh("dvc repro", repo)
    # only the params gate runs (always_changed); its unchanged output reruns nothing after it
    ran = [ln for ln in r.stdout.splitlines() if ln.startswith("Running stage")]
    assert ran == ["Running stage 'spec':"], r.stdout
    assert "Stage 'benchmark' didn't change, skipping" in r.stdout, r.stdout


def test_changed_back_param_is_measured_again_not_restored(repo):
    first = json.loads((repo / "reports/benchmark.json").read_text())["measured_at"]
    sh("dvc exp run -S benchmark.kernel.cpu_rounds=2", repo)
    r = sh("dvc exp run -S benchmark.kernel.cpu_rounds=3", repo)  # back to the first run's params
    assert "Running stage 'benchmark'" in r.stdout and "is cached - skipping run" not in r.stdout, r.stdout
    again = json.loads((repo / "reports/benchmark.json").read_text())["measured_at"]
    assert again != first
    assert len(_runs(repo)) == 3


def test_make_exps_fits_in_20_columns(repo):
    """`dvc exp show --only-changed` was 111 columns (85 metrics, 24 dependency hashes) on two CPU
    experiments; `make exps` shows the changed params and headline metrics only."""
    shown = json.loads(sh("dvc exp show --json", repo).stdout)
    if len([e for row in shown for e in (row.get("experiments") or [])]) < 2:  # run alone: make a second one
        sh("dvc exp run -S variant.num_warps=2", repo)
    md = sh("make -s exps EXPS_ARGS=--md", repo).stdout
    header = next(ln for ln in md.splitlines() if ln.startswith("|"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    assert len(cols) <= 20, cols
    assert "Experiment" in cols and "variant.num_warps" in cols and "cpu.kernel.ratio" in cols, cols
    assert not [c for c in cols if "/" in c or c == "kernels"], cols  # no dependency-hash column
    wide = sh("dvc exp show --only-changed --md", repo).stdout
    print(f"make exps: {len(cols)} columns; dvc exp show --only-changed: {wide.splitlines()[0].count('|') - 1}")


@pytest.mark.parametrize(
    "override,needle",
    [
        ("variant=no_such_variant", "Could not find 'variant/no_such_variant'"),
        ("variant.num_wraps=8", "num_wraps"),
    ],
    ids=["unknown-variant", "misspelled-key"],
)
def test_bad_override_is_one_clear_line_and_writes_nothing(repo, override, needle):
    before, params = _snapshot(repo), (repo / "params.yaml").read_bytes()
    r = sh(f"dvc exp run -S {override}", repo, check=False)
    assert r.returncode != 0
    first = [ln for ln in (r.stderr + r.stdout).splitlines() if ln.startswith("ERROR")]
    assert first and needle in first[0], r.stderr
    _assert_unchanged(repo, before, r)
    assert (repo / "params.yaml").read_bytes() == params


def test_a_float_where_an_int_goes_stops_the_run_instead_of_skipping_it(repo):
    """`-S variant.num_warps=4.0` skipped every stage (DVC compares 4.0 == 4) and the experiment
    recorded num_warps=4.0 beside old results; the spec stage (always run) refuses it."""
    before = _snapshot(repo)
    r = sh("dvc exp run -S variant.num_warps=4.0", repo, check=False)
    assert r.returncode != 0
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert errors == ["error: variant.num_warps = 4.0: expected an integer >= 1"], r.stderr
    _assert_unchanged(repo, before, r)
    sh("python -m kernelcamp.cli compose", repo)


def test_target_with_no_fitting_config_is_one_clear_line(repo):
    before = _snapshot(repo)
    r = sh("dvc exp run -S target=tiny", repo, check=False)
    assert r.returncode != 0
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "fits tiny" in errors[0], r.stderr
    assert "Running stage 'benchmark'" not in r.stdout
    # a failed build writes nothing: every output, build.json included, is the last finished run's
    _assert_unchanged(repo, before, r)
    sh("python -m kernelcamp.cli compose", repo)  # back to the default composition for the next test


def test_unreachable_tracking_server_is_one_clear_line(repo):
    before = _snapshot(repo)
    r = sh("dvc exp run -S tracking.uri=http://127.0.0.1:9", repo, check=False)
    assert r.returncode != 0
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "unreachable" in errors[0], r.stderr
    _assert_unchanged(repo, before, r)
    sh("python -m kernelcamp.cli compose", repo)

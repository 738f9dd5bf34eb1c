"""The run spec (kernelcamp.spec), the run claim (kernelcamp.runlock) and what makes records match
what ran: the stage's own kernel, the configured kernel module, no foreign measurement recorded,
bad params refused by the first stage, nothing left behind by a killed stage."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kernelcamp.errors import KernelcampError
from kernelcamp.runlock import claim_run, release_run
from kernelcamp.spec import check_kernel_module, parse_spec

ROOT = Path(__file__).resolve().parents[1]
PARAMS = yaml.safe_load((ROOT / "params.yaml").read_text())


def _copy_tree(dst: Path) -> Path:
    """A queued experiment's temporary copy of the repo: the code, conf and params only."""
    for d in ("kernelcamp", "kernels", "stages", "conf"):
        shutil.copytree(ROOT / d, dst / d, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "dvc.yaml", dst / "dvc.yaml")  # each stage records the params it reruns for
    shutil.copy(ROOT / "params.yaml", dst / "params.yaml")
    return dst


# ------------------------------------------------------------------ the stage's own tree and kernel


def test_a_queued_experiment_builds_its_own_kernel_not_the_workspaces(tmp_path: Path) -> None:
    """`dvc exp run --queue`, then the workspace kernel edited: build.json reported the edited file's
    hash, because the inspector put $DVC_ROOT (the workspace) first on sys.path."""
    copy_root = _copy_tree(tmp_path / "exp-copy")
    kfile = copy_root / "kernels" / "sparse_mla_decode.py"
    kfile.write_text(kfile.read_text() + "\n# the queued commit's kernel\n")
    code = textwrap.dedent(
        """
        import sys, json
        sys.path.insert(0, sys.argv[1])
        from kernelcamp.inspect.fit import kernel_module
        from kernelcamp.hashes import kernel_source_hash
        m = kernel_module({"module": "kernels.sparse_mla_decode"})
        print(json.dumps({"file": m.__file__, "hash": m.kernel_source_hash(),
                          "serving_hash": kernel_source_hash({"module": "kernels.sparse_mla_decode"})}))
        """
    )
    env = {**os.environ, "DVC_ROOT": str(ROOT), "TRITON_INTERPRET": "1"}
    r = subprocess.run(
        [sys.executable, "-c", code, str(copy_root)], cwd=copy_root, env=env, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    import hashlib

    want = hashlib.sha256(kfile.read_bytes()).hexdigest()
    assert Path(got["file"]).resolve() == kfile.resolve()
    assert got["hash"] == want and got["serving_hash"] == want


def test_the_spec_stage_hashes_its_own_trees_kernel(tmp_path: Path) -> None:
    copy_root = _copy_tree(tmp_path / "exp-copy")
    kfile = copy_root / "kernels" / "sparse_mla_decode.py"
    kfile.write_text(kfile.read_text() + "\n# edited\n")
    env = {**os.environ, "DVC_ROOT": str(ROOT)}
    r = subprocess.run(
        [sys.executable, "-m", "stages.spec", "--out", "reports/spec.json"],
        cwd=copy_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    import hashlib

    rec = json.loads((copy_root / "reports" / "spec.json").read_text())
    assert rec["kernel_source_hash"] == hashlib.sha256(kfile.read_bytes()).hexdigest()
    assert rec["kernel_source_hash"] != parse_spec(PARAMS).kernel_source_hash


def test_the_spec_stage_claims_the_run_with_its_params(tmp_path: Path) -> None:
    """The spec stage, first of every pipeline run, claimed the run without its params (it called claim_run itself):
    a later stage stopped by a rewritten params.yaml still recorded the rewritten params (helper-54, after the fix
    of helper-53's fault tested only through claim_run). Run under a process named dvc, as DVC runs it."""
    import yaml

    copy_root = _copy_tree(tmp_path / "exp-copy")
    fake = tmp_path / "bin" / "dvc"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/bash\n{sys.executable} -m stages.spec --out reports/spec.json\n")
    fake.chmod(0o755)
    env = {**os.environ, "DVC_ROOT": str(copy_root)}
    env.pop("MLFLOW_TRACKING_URI", None)
    r = subprocess.run([str(fake)], cwd=copy_root, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    claim = json.loads((copy_root / ".kernelcamp" / "run.json").read_text())
    assert claim["stage"] == claim["at_stage"] == "spec"
    assert claim["params"] == yaml.safe_load((copy_root / "params.yaml").read_text())


def _spec_stage_with(tmp_path: Path, copy_root: Path, body: str) -> subprocess.CompletedProcess[str]:
    """Run the spec stage of the tree ``copy_root`` as DVC runs it (under a process named dvc), with ``body`` (Python
    statements; ``spec`` is the parsed run spec; ``Path``, ``json`` and ``tree_tags`` are imported) run after the
    run's claim, just before the stage's outputs."""
    hook = tmp_path / "run_spec_stage.py"
    head = textwrap.dedent(
        """
        import json, sys
        sys.argv[1:] = ["--out", "reports/spec.json"]
        import stages.spec as st
        from pathlib import Path
        from kernelcamp.conftags import tree_tags
        from kernelcamp.io import stage_main
        from kernelcamp.tracking import tracked_stage
        summary = st.spec_summary
        def after_the_claim(spec):
        """
    )
    tail = '    return summary(spec)\nst.spec_summary = after_the_claim\nstage_main(tracked_stage("spec")(st.main))\n'
    hook.write_text(head + textwrap.indent(textwrap.dedent(body).strip("\n"), "    ") + "\n" + tail)
    fake = tmp_path / "bin" / "dvc"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/bash\n{sys.executable} {hook}\n")
    fake.chmod(0o755)
    env = {**os.environ, "DVC_ROOT": str(copy_root), "PYTHONPATH": str(copy_root)}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run([str(fake)], cwd=copy_root, env=env, capture_output=True, text=True, timeout=120)


def test_a_stage_stopped_by_a_rewritten_params_yaml_writes_nothing(tmp_path: Path) -> None:
    """A stage that found params.yaml rewritten (a refused second `dvc exp run`) failed only after it had written its
    outputs, over the last finished run's records, against the README's "a stage writes only when it succeeds"
    (helper-64). The spec stage, run as DVC runs it, with params.yaml rewritten after its claim: exit 2, one line,
    and the earlier spec.json left as it was."""
    copy_root = _copy_tree(tmp_path / "exp-copy")
    (copy_root / "reports").mkdir()
    earlier = copy_root / "reports" / "spec.json"
    earlier.write_text('{"the": "last finished run"}\n')
    # after the claim, as a second run's stash would land
    r = _spec_stage_with(tmp_path, copy_root, 'open("params.yaml", "a").write("# the second run\'s params\\n")')
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("error: params.yaml changed while the spec stage ran"), r.stderr
    assert earlier.read_text() == '{"the": "last finished run"}\n'


@pytest.mark.parametrize(
    "edited", ["conf/variant/bt16_w4.yaml", "kernels/sparse_mla_decode.py", "conf/variant/a_new_variant.yaml"]
)
def test_a_stage_that_finds_conf_or_code_edited_during_its_run_writes_nothing(tmp_path: Path, edited: str) -> None:
    """A conf/ file edited while a run went on was saved in the experiment beside a params.yaml it did not compose,
    and the MLflow tag variant_overrides was computed against the edited file (helper-66, F4). The run's inputs
    (conf/, dvc.yaml, kernels/, the code) are claimed with their sha256 at the first stage; a stage that finds one
    changed (edited, added or removed; this copy is no git tree, so every file counts) fails in one line naming it
    and writes nothing. conf/local (git-ignored, never saved) is not an input."""
    copy_root = _copy_tree(tmp_path / "exp-copy")
    (copy_root / "reports").mkdir()
    earlier = copy_root / "reports" / "spec.json"
    earlier.write_text('{"the": "last finished run"}\n')
    r = _spec_stage_with(  # after the claim: the user edits the tree while the run goes on
        tmp_path,
        copy_root,
        f"""
        Path("conf/local").mkdir(parents=True, exist_ok=True)
        Path("conf/local/default.yaml").write_text("# the machine's own settings: not an input\\n")
        open({edited!r}, "a").write("# edited during the run\\n")
        """,
    )
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith(f"error: {edited} changed while the spec stage ran (since stage spec): "), r.stderr
    assert earlier.read_text() == '{"the": "last finished run"}\n'


def test_a_stage_stopped_by_an_edit_records_the_tags_its_run_started_with(tmp_path: Path) -> None:
    """The FAILED MLflow run of a stage stopped by a conf/ or kernel edit computed its variant_overrides against the
    edited conf/ file and its variant_hash from the edited kernel: a record of something that never ran. The first
    stage keeps those tags in the run's claim (kernelcamp.conftags.tree_tags), and a failure records them."""
    from mlflow.tracking import MlflowClient

    copy_root = _copy_tree(tmp_path / "exp-copy")
    r = _spec_stage_with(
        tmp_path,
        copy_root,
        """
        before = tree_tags(dict(spec.raw))
        v = Path("conf/variant/bt16_w4.yaml")
        v.write_text(v.read_text().replace("num_warps: 4", "num_warps: 8"))
        open("kernels/sparse_mla_decode.py", "a").write("# edited during the run\\n")
        print(json.dumps({"before": before, "edited": tree_tags(dict(spec.raw))}))
        """,
    )
    assert r.returncode == 2 and "changed while the spec stage ran" in r.stderr, r.stderr
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    before, edited = seen["before"], seen["edited"]
    assert before["variant_overrides"] == "" and edited["variant_overrides"] == "num_warps=4"
    assert before["variant_hash"] != edited["variant_hash"]
    client = MlflowClient(f"sqlite:///{copy_root / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("kernelcamp").experiment_id])
    assert run.info.status == "FAILED" and run.data.tags["kernelcamp.stage"] == "spec"
    assert {k: run.data.tags[k] for k in before} == before


def _tree_of(root: Path, files: dict[str, str]) -> str:
    """Write ``files`` ({path: text}) and a params.yaml under ``root``; the sha256 a run claims that file with."""
    from kernelcamp.io import sha256_text

    for rel, text in {**files, "params.yaml": "variant: {}\n"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return sha256_text("variant: {}\n")


@pytest.mark.usefixtures("workspace_run")
def test_inputs_edited_during_a_run_stop_the_next_stage(tmp_path: Path) -> None:
    """The claim keeps the sha256 of the run's inputs; the next stage of the run stops on an edited, added or removed
    file (naming it), not on conf/local, caches or hidden files; an older claim without them checks nothing."""
    from kernelcamp.runlock import check_params_unchanged, inputs_sha256

    sha = _tree_of(
        tmp_path, {"conf/variant/v.yaml": "num_warps: 4\n", "kernels/k.py": "x = 1\n", "dvc.yaml": "stages: {}\n"}
    )
    assert sorted(inputs_sha256(tmp_path)) == ["conf/variant/v.yaml", "dvc.yaml", "kernels/k.py"]
    claim_run(tmp_path, "spec", sha, owner=os.getpid())
    for ignored in ("conf/local/default.yaml", "kernels/__pycache__/k.pyc", "kernels/.k.py.swp", "README.md"):
        (tmp_path / ignored).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / ignored).write_text("not an input\n")
    assert claim_run(tmp_path, "build", sha, owner=os.getpid())["stage"] == "spec"
    (tmp_path / "conf" / "variant" / "v.yaml").write_text("num_warps: 8\n")
    with pytest.raises(KernelcampError, match=r"^conf/variant/v.yaml changed during this run \(since stage spec\)"):
        claim_run(tmp_path, "deploy", sha, owner=os.getpid())
    (tmp_path / "conf" / "variant" / "v.yaml").write_text("num_warps: 4\n")  # put back: the run goes on
    claim_run(tmp_path, "deploy", sha, owner=os.getpid())
    (tmp_path / "kernels" / "k.py").unlink()
    (tmp_path / "conf" / "variant" / "w.yaml").write_text("num_warps: 2\n")
    with pytest.raises(KernelcampError, match=r"^conf/variant/w.yaml, kernels/k.py changed while the verify stage"):
        check_params_unchanged(tmp_path, "verify", tmp_path / "params.yaml", owner=os.getpid())
    path = tmp_path / ".kernelcamp" / "run.json"
    claim = json.loads(path.read_text())
    del claim["inputs"]  # a claim of an older run
    path.write_text(json.dumps(claim))
    claim_run(tmp_path, "report", sha, owner=os.getpid())


@pytest.mark.usefixtures("workspace_run")
def test_an_edit_between_dvcs_compose_and_the_first_stage_stops_it(tmp_path: Path) -> None:
    """The first stage took the inputs' sha256 7-10 s into a run, after opening MLflow: a conf/ edit 2 s into the
    spec stage was saved beside a params.yaml composed from the file before it, its MLflow run FINISHED with
    variant_overrides against the edited file (helper-68). A workspace run's claim from its start (made as DVC
    composes params.yaml) takes them, and its first stage stops on a file changed since; unchanged, it goes on."""
    from kernelcamp.io import sha256_text
    from kernelcamp.runlock import claim_workspace_run

    sha = _tree_of(tmp_path, {"conf/variant/v.yaml": "num_stages: 2\n"})
    claim_workspace_run(tmp_path, os.getpid())
    (tmp_path / "conf" / "variant" / "v.yaml").write_text("num_stages: 3\n")
    with pytest.raises(
        KernelcampError,
        match=r"^conf/variant/v.yaml changed during this run \(since `dvc exp run` composed params.yaml\)",
    ):
        claim_run(tmp_path, "spec", sha, owner=os.getpid())
    (tmp_path / "conf" / "variant" / "v.yaml").write_text("num_stages: 2\n")  # as composed: the run goes on
    claim = claim_run(tmp_path, "spec", sha, owner=os.getpid())
    assert claim["stage"] == "spec" and not claim.get("provisional")
    assert claim["inputs"] == {"conf/variant/v.yaml": sha256_text("num_stages: 2\n")}


@pytest.mark.usefixtures("workspace_run")
def test_in_a_git_tree_the_inputs_are_the_tracked_files(tmp_path: Path) -> None:
    """DVC saves tracked files only: a new untracked file in conf/ (helper-68's zz_new.yaml) changes no record and
    stopped the run; in a git tree the inputs are the files git tracks, so a tracked file edited or removed (`git rm`)
    stops the next stage, an untracked or git-ignored one does not."""
    from kernelcamp.runlock import check_params_unchanged, inputs_sha256

    sha = _tree_of(
        tmp_path,
        {
            "conf/variant/v.yaml": "num_warps: 4\n",
            "conf/variant/w.yaml": "num_warps: 2\n",
            ".gitignore": "/conf/local/\n",
        },
    )
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "tree"], check=True)
    assert sorted(inputs_sha256(tmp_path)) == ["conf/variant/v.yaml", "conf/variant/w.yaml"]
    claim_run(tmp_path, "spec", sha, owner=os.getpid())
    (tmp_path / "conf" / "variant" / "new.yaml").write_text("num_warps: 8\n")  # untracked: not saved
    (tmp_path / "conf" / "local").mkdir()
    (tmp_path / "conf" / "local" / "default.yaml").write_text("server: {port: 8791}\n")  # git-ignored
    check_params_unchanged(tmp_path, "build", tmp_path / "params.yaml", owner=os.getpid())
    subprocess.run([*git, "rm", "-q", "conf/variant/w.yaml"], check=True)
    with pytest.raises(KernelcampError, match=r"^conf/variant/w.yaml changed while the deploy stage ran"):
        check_params_unchanged(tmp_path, "deploy", tmp_path / "params.yaml", owner=os.getpid())
    subprocess.run([*git, "add", "conf/variant/new.yaml"], check=True)  # tracked now: the commit would save it
    with pytest.raises(KernelcampError, match=r"^conf/variant/new.yaml, conf/variant/w.yaml changed during this run"):
        claim_run(tmp_path, "verify", sha, owner=os.getpid())


def _output_writes_before_the_check(path: Path) -> list[str]:
    """The output writes of ``path`` (a stage file) that come, in source order, before the first
    ``before_outputs(...)`` call of the function that writes a stage's outputs (``main``, or the benchmark's
    ``measure_and_write``): ``write_*_atomic(dst, ...)``, ``os.replace(src, dst)``, ``_replace_dir(src, dst)``, a
    destination under the function's own ``tmp`` folder left out."""
    import ast

    def name(f: ast.expr) -> str:
        return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""

    def root(e: ast.expr) -> str:
        while isinstance(e, (ast.BinOp, ast.Attribute, ast.Subscript, ast.Call)):
            e = e.left if isinstance(e, ast.BinOp) else e.func if isinstance(e, ast.Call) else e.value
        return e.id if isinstance(e, ast.Name) else ""

    dst_arg = {"write_json_atomic": 0, "write_csv_atomic": 0, "write_text_atomic": 0, "replace": 1, "_replace_dir": 1}
    early = []
    for fn in ast.parse(path.read_text()).body:
        if not isinstance(fn, ast.FunctionDef) or fn.name not in ("main", "measure_and_write"):
            continue
        calls = sorted((c for c in ast.walk(fn) if isinstance(c, ast.Call)), key=lambda c: (c.lineno, c.col_offset))
        check = min((c.lineno for c in calls if name(c.func) == "before_outputs"), default=None)
        for c in calls:
            i = dst_arg.get(name(c.func))
            if i is None or len(c.args) <= i or root(c.args[i]) == "tmp":
                continue
            if check is None or c.lineno < check:
                early.append(f"{path.name}:{c.lineno} {fn.name}: {ast.unparse(c)[:60]}")
    return early


def test_every_stage_checks_params_yaml_before_its_first_output(tmp_path: Path) -> None:
    """The whole kind of the fault above: each stage's output writes come after its before_outputs check (spec,
    build, deploy, verify and report in stages/, the benchmark's in kernelcamp.bench.record)."""
    files = [ROOT / "stages" / f"{s}.py" for s in ("spec", "build", "deploy", "verify", "report")]
    files.append(ROOT / "kernelcamp" / "bench" / "record.py")
    early = [w for f in files for w in _output_writes_before_the_check(f)]
    assert not early, early
    # the walk finds writes where there are some: a stage's write moved above its check is named
    src = (ROOT / "stages" / "build.py").read_text().replace('    before_outputs("build", args.params)\n', "", 1)
    (tmp_path / "build.py").write_text(src)
    assert len(_output_writes_before_the_check(tmp_path / "build.py")) == 2


@pytest.mark.parametrize("module", ["os", "kernelcamp.variant", "kernels", "kernels.no_such_kernel", "kernels.a.b"])
def test_a_kernel_module_outside_kernels_is_refused(module: str) -> None:
    # kernels/ is every stage's DVC dependency; a module elsewhere could change with `dvc status` clean
    with pytest.raises(KernelcampError, match=r"kernel\.module"):
        check_kernel_module(module)


def test_the_working_trees_kernel_file_is_checked_as_the_baselines_is(tmp_path: Path) -> None:
    """`-S kernel.module=kernels.__init__` passed spec and failed only in build ("has no compile_specs(...)"): spec
    checks the working tree's kernel file with the check baseline.kernel_rev's file gets (kernel_rev.check_kernel_api),
    a file that does not parse too."""
    src = (ROOT / "kernels" / "sparse_mla_decode.py").read_text()
    assert "\ndef compile_specs(" in src
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "ok.py").write_text(src)
    (tmp_path / "kernels" / "nospecs.py").write_text(src.replace("\ndef compile_specs(", "\ndef compile_specs_v0("))
    (tmp_path / "kernels" / "broken.py").write_text("def (:\n")
    for module, msg in [
        ("nospecs", r"^kernel\.module = 'kernels\.nospecs': kernels/nospecs\.py defines no compile_specs, which build"),
        ("broken", r"^kernel\.module = 'kernels\.broken': kernels/broken\.py is not valid Python \(invalid syntax"),
    ]:
        with pytest.raises(KernelcampError, match=msg):
            parse_spec(_with(PARAMS, "kernel.module", f"kernels.{module}"), root=tmp_path)
    assert parse_spec(_with(PARAMS, "kernel.module", "kernels.ok"), root=tmp_path).kernel_file.name == "ok.py"


def test_no_code_imports_the_shipped_kernel_by_name() -> None:
    """verify and the kernel benchmark imported kernels.sparse_mla_decode directly, so
    `-S kernel.module=kernels.alt` (a kernel that writes half the heads) passed verify 8/8."""
    pat = re.compile(r"from kernels import|from kernels\.\w+ import|import kernels\.|find_spec\(\"kernels\.")
    offenders = [
        f"{p.relative_to(ROOT)}:{i}"
        for d in ("kernelcamp", "stages")
        for p in sorted((ROOT / d).rglob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pat.search(line)
    ]
    assert not offenders, f"import the configured kernel (kernelcamp.spec.import_kernel) instead: {offenders}"


def test_every_stage_that_runs_the_kernel_depends_on_the_kernels_folder() -> None:
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    for name in ("build", "deploy", "benchmark", "verify"):
        assert "kernels" in stages[name]["deps"], name
        assert "kernelcamp/spec.py" in stages[name]["deps"], name


def test_the_configured_kernel_module_is_the_one_benchmarked(tmp_path: Path) -> None:
    """kernel_bench.launch_args takes the configured module (a copy with a marker stands in for kernels.alt)."""
    copy_root = _copy_tree(tmp_path / "t")
    src = (copy_root / "kernels" / "sparse_mla_decode.py").read_text()
    (copy_root / "kernels" / "alt.py").write_text(src + "\nMARKER = 'alt'\n")
    code = textwrap.dedent(
        """
        import sys, yaml
        sys.path.insert(0, sys.argv[1])
        from kernelcamp.bench import kernel as kernel_bench
        from kernelcamp.spec import import_kernel
        p = yaml.safe_load(open("params.yaml"))
        p["kernel"]["module"] = "kernels.alt"
        kernel_bench.launch_args(p, "cpu", 1, seed=0)
        print(sys.modules["kernels.alt"].MARKER, "kernels.sparse_mla_decode" in sys.modules)
        """
    )
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, "-c", code, str(copy_root)], cwd=copy_root, env=env, capture_output=True)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert r.stdout.decode().split()[-2:] == ["alt", "False"]


# --------------------------------------------------------------------------------- the run claim


@pytest.fixture
def workspace_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``tmp_path`` as a workspace run's tree: DVC_ROOT is the tree, so its two claims are one file."""
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    return tmp_path


@pytest.mark.usefixtures("workspace_run")
def test_a_second_run_in_the_workspace_is_refused(tmp_path: Path) -> None:
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        claim_run(tmp_path, "build", "a" * 64, owner=other.pid)
        with pytest.raises(KernelcampError, match=f"another pipeline run \\(dvc pid {other.pid}"):
            claim_run(tmp_path, "spec", "a" * 64, owner=os.getpid())
    finally:
        other.kill()
        other.wait()
    # its owner is gone: the claim is taken over
    assert claim_run(tmp_path, "spec", "b" * 64, owner=os.getpid())["owner_pid"] == os.getpid()


@pytest.mark.usefixtures("workspace_run")
def test_messages_name_the_stage_a_run_is_at(tmp_path: Path) -> None:
    """`make params` and `stages.deploy --stop` refused a run "at stage spec" while it was in verify: the claim
    recorded its first stage only (helper-53). It keeps the first stage and the one now running, and the run's
    params (kernelcamp.runlock.run_params)."""
    from kernelcamp.runlock import refuse_during_run, run_params

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        claim_run(tmp_path, "spec", "a" * 64, owner=other.pid, params={"variant": {"num_warps": 16}})
        with pytest.raises(KernelcampError, match=r"\(dvc pid \d+, at stage spec, in "):
            refuse_during_run(tmp_path, "make params")
        assert claim_run(tmp_path, "verify", "a" * 64, owner=other.pid)["stage"] == "spec"
        with pytest.raises(KernelcampError, match=r"\(dvc pid \d+, since stage spec, now at verify, in "):
            refuse_during_run(tmp_path, "make params")
        with pytest.raises(
            KernelcampError, match=r"another pipeline run \(dvc pid \d+, since stage spec, now at verify\)"
        ):
            claim_run(tmp_path, "spec", "b" * 64, owner=os.getpid())
        assert run_params(tmp_path, owner=other.pid) == {"variant": {"num_warps": 16}}
        assert run_params(tmp_path, owner=os.getpid()) is None  # not this owner's run
    finally:
        other.kill()
        other.wait()
    assert run_params(tmp_path, owner=other.pid) is None  # its owner is gone


@pytest.mark.usefixtures("workspace_run")
def test_params_rewritten_during_a_run_stop_the_next_stage(tmp_path: Path) -> None:
    claim_run(tmp_path, "deploy", "a" * 64, owner=os.getpid())
    assert claim_run(tmp_path, "benchmark", "a" * 64, owner=os.getpid())["stage"] == "deploy"
    with pytest.raises(KernelcampError, match="params.yaml changed during this run"):
        claim_run(tmp_path, "report", "c" * 64, owner=os.getpid())
    release_run(tmp_path, owner=os.getpid())
    assert json.loads((tmp_path / ".kernelcamp" / "run.json").read_text())["phase"] == "saving"


@pytest.mark.usefixtures("workspace_run")
def test_a_stage_run_by_hand_claims_nothing(tmp_path: Path) -> None:
    # pytest is no dvc process: owner None, no claim file
    assert claim_run(tmp_path, "build", "a" * 64) is None
    assert not (tmp_path / ".kernelcamp" / "run.json").exists()


def test_check_record_names_both_hashes() -> None:
    spec = parse_spec(PARAMS)
    spec.check_record("deploy.json", spec.hashes())
    with pytest.raises(
        KernelcampError, match=f"variant_hash 1111111111111111 but params.yaml gives {spec.variant_hash}"
    ):
        spec.check_record("deploy.json", {**spec.hashes(), "variant_hash": "1111111111111111"})
    two = copy.deepcopy(PARAMS)
    two["variant"]["num_warps"] = 2
    assert parse_spec(two).variant_hash != spec.variant_hash


# ------------------------------------------------------------------------------------ bad params

BAD = [
    # (key path, value, what the one line must say)
    ("server.port", 70000, r"server\.port = 70000: must be <= 65535"),
    ("server.port", 0, r"server\.port = 0: must be >= 1"),
    ("report.threshold", "abc", r"report\.threshold = 'abc': expected a number"),
    ("benchmark.serving.cpu_concurrency", [0], r"benchmark\.serving\.cpu_concurrency\.0 = 0: must be >= 1"),
    ("benchmark.serving.concurrency", [8, 8], r"benchmark\.serving\.concurrency = \[8, 8\]: 8 appears twice"),
    ("workload.cpu.num_cache_tokens", 0, r"workload\.cpu\.num_cache_tokens = 0: must be >= 1"),
    ("server.max_running_requests", 0, r"server\.max_running_requests = 0: must be >= 1"),
    ("benchmark.serving.cpu_max_tokens", -1, r"benchmark\.serving\.cpu_max_tokens = -1: must be >= 1"),
    ("verify.serving.num_prompts", 0, r"verify\.serving\.num_prompts = 0: must be >= 1"),
    ("variant.num_warps", 4.0, r"variant\.num_warps = 4\.0: expected an integer"),
    ("variant.num_warps", 64, r"variant\.num_warps = 64: 2048 threads per block is beyond sm90's 1024"),
    ("variant.num_stages", 100000, r"variant\.num_stages = 100000: must be <= 64"),
    # tiles beyond the workload's shape: the build's compile of BLOCK_T 4096 ran 14 minutes without an end (helper-59)
    ("variant.BLOCK_T", 4096, r"variant\.BLOCK_T = 4096: larger than the workload's 512 top-k tokens .*at most 512"),
    ("variant.BLOCK_H", 4096, r"variant\.BLOCK_H = 4096: larger than the workload's 64 heads .*at most 64"),
    ("variant.BLOCK_H", 128, r"variant\.BLOCK_H = 128: .*use at most 64"),
    ("server.cuda_graphs", "yes", r"server\.cuda_graphs = 'yes': expected true or false"),
    ("benchmark.kernel.rounds", 1, r"benchmark\.kernel\.rounds = 1: must be >= 2"),
    ("benchmark.kernel.batch_sizes", [], r"benchmark\.kernel\.batch_sizes is empty"),
    (
        "verify.kernel.cpu_shapes",
        [[1, 16]],
        r"verify\.kernel\.cpu_shapes = \[\[1, 16\]\]: each shape is \[B, H, topk\]",
    ),
    ("verify.kernel.empty_slot_fraction", 1.5, r"verify\.kernel\.empty_slot_fraction = 1\.5: must be < 1"),
    ("report.confidence", 95, r"report\.confidence = 95\.0: must be < 1"),
    ("workload.layout", "deepseek_v5", r"workload\.layout = 'deepseek_v5': expected one of"),
    ("kernel.module", "os", r"kernel\.module = 'os': a kernel module is a file of kernels/"),
    ("kernel.dot_dtype", "fp64", r"kernel\.dot_dtype = 'fp64': expected one of \['bf16', 'fp16'\]"),
    ("server.max_context_tokens", 1, r"server\.max_context_tokens = 1: must be >= 2"),
    ("server.nmae", "x", r"server\.nmae is not a known key; did you mean server\.name\?"),
    ("deploy.health_timeout_s", -5, r"deploy\.health_timeout_s = -5\.0: must be > 0"),
    # a minimum above its maximum was found only by the benchmark stage, after build and deploy ran
    ("benchmark.kernel.min_rounds", 100, r"benchmark\.kernel\.min_rounds = 100: must be <= benchmark\.kernel\.rounds"),
    ("benchmark.serving.min_repeats", 9, r"benchmark\.serving\.min_repeats = 9: must be <= benchmark\.serving\.rep"),
    ("benchmark.kernel.max_seconds", 0, r"benchmark\.kernel\.max_seconds = 0\.0: must be > 0"),
    # values the spec passed that failed, injected or misled later (twenty-first session's review):
    # an env key reached the ssh restart line unquoted (`X=1; touch /tmp/p; Y` ran `touch`), crashed
    # Popen (`A=B`), or became an MLflow key that failed the report (`a/../b`) or dropped a value (`K:1`)
    ("server.env", {"X=1; touch /tmp/p; Y": "v"}, r"server\.env key 'X=1; touch /tmp/p; Y': an environment"),
    ("server.env", {"A=B": "1"}, r"server\.env key 'A=B'"),
    ("server.env", {"a/../b": "1"}, r"server\.env key 'a/\.\./b'"),
    ("server.env", {"K:1": "x"}, r"server\.env key 'K:1'"),
    ("server.env", {"NUL": "a\0b"}, r"server\.env\.NUL = 'a\\x00b': holds a control character"),
    ("server.env", {"FLAG": True}, r"server\.env\.FLAG = true: give a string or a number; quote a flag"),
    ("server.env", {"FLAG": None}, r"server\.env\.FLAG = null: give a string or a number"),
    ("server.args", ["--port", "9"], r"server\.args\.0 = '--port': the deploy sets --port itself"),
    ("server.args", ["--host=0.0.0.0"], r"server\.args\.0 = '--host=0\.0\.0\.0': the deploy sets --host itself"),
    # the embedded server's command line: these passed spec and failed only at deploy, after the deploy had
    # stopped the running server (kernelcamp.serve.options is the one check of what `kernelcamp serve` takes)
    ("server.device", "bogus", r"server\.device = 'bogus': expected cpu, cuda or cuda:N, or null"),
    ("server.device", "cuda:x", r"server\.device = 'cuda:x': expected cpu, cuda or cuda:N"),
    ("server.args", ["--workers=4"], r"server\.args = \['--workers=4'\]: kernelcamp serve would refuse them \(unrec"),
    ("server.args", ["--log-level", "loud"], r"invalid choice: 'loud'.*; it takes --trace-dir, --fake"),
    ("server.args", ["--help"], r"server\.args = \['--help'\]: kernelcamp serve would refuse them"),
    ("server.args", ["--engine-uds", "/tmp/s"], r"server\.args\.0 \(--engine-uds\): an internal option"),
    ("server.args", ["--api-key=s3cret"], r"server\.args\.0 \(--api-key\): a key in server\.args .*KERNELCAMP_API_KEY"),
    # a host the deploy cannot listen on crashed it with socket.gaierror (a traceback), or read as a port held
    ("server.host", "127.0.0.1; touch /tmp/x", r"server\.host = '127\.0\.0\.1; touch /tmp/x': does not resolve"),
    ("server.host", "192.0.2.1", r"server\.host = '192\.0\.2\.1': not an address of this machine"),
    # names reach report headings (a forged `# Decision` line), plot labels (mathtext crashed) and files
    ("variant.name", "evil\n\n# Decision: **faster**", r"variant\.name = 'evil\\n.*a name is letters, digits"),
    ("variant.name", "cost$\\frac$", r"variant\.name = 'cost\$\\\\frac\$': a name is letters"),
    ("server.name", "a b", r"server\.name = 'a b': a name is letters"),
    # a 300-character name passed, then the report's conf lookup failed with ENAMETOOLONG (helper audit B-F3)
    ("variant.name", "v" * 300, r"variant\.name = 'v{40}'\.\.\. \(300 characters\): a name is at most 100"),
    # no upper bound: 10**12 tokens reached the allocator's traceback (helper audit B-F4); indices are int32
    ("workload.num_cache_tokens", 10**12, r"workload\.num_cache_tokens = 1000000000000: must be <= 2147483647"),
    ("server.cpu_cache_tokens", 2**31, r"server\.cpu_cache_tokens = 2147483648: must be <= 2147483647"),
    ("workload.name", "x|y", r"workload\.name = 'x\|y': a name is letters"),
    ("tracking.experiment", "a\nb", r"tracking\.experiment = 'a\\nb': holds a control character"),
    # a target name was read as a path (`/tmp/x` -> /tmp/x.yaml) and unknown ones failed only in build
    ("build.also_targets", ["/tmp/evil"], r"build\.also_targets\.0 = '/tmp/evil': not a target of conf/target/"),
    ("build.also_targets", ["../../dvc"], r"build\.also_targets\.0 = '\.\./\.\./dvc': not a target"),
    ("benchmark.run_as_target", "sm99", r"benchmark\.run_as_target = 'sm99': not a target of conf/target/"),
    # ports past 65535 crashed the baseline port check with OverflowError; offsets past 9 failed in benchmark
    ("server.port", 65535, r"server\.port = 65535: this run may use ports up to 65544 .* use at most 65526"),
    ("benchmark.serving.baseline_port_offset", 50, r"baseline_port_offset = 50: must be <= 9"),
    # every request failed with HTTP 400 after a deploy that succeeded
    ("benchmark.serving.max_tokens", 4096, r"benchmark\.serving\.max_tokens = 4096: with the 24-token prompts"),
    ("benchmark.serving.cpu_max_tokens", 2030, r"cpu_max_tokens = 2030: .* use at most 2024"),
    ("verify.serving.max_tokens", 2048, r"verify\.serving\.max_tokens = 2048"),
    # past server.max_connections the embedded server answers 503: a level above it could never run
    ("benchmark.serving.concurrency", [8, 250], r"concurrency = \[8, 250\]: a level of 250 needs server\.max_conn"),
    ("server.max_connections", 100, r"benchmark\.serving\.concurrency = .*needs server\.max_connections >= 104"),
    # time.sleep(1e308) raises OverflowError at the first failed readiness probe
    ("deploy.poll_interval_s", 1e308, r"deploy\.poll_interval_s = 1e\+308: must be <= 604800"),
    ("benchmark.serving.window_s", 1e9, r"benchmark\.serving\.window_s = 1000000000\.0: must be <= 604800"),
    # a relative store resolved in a queued experiment's temporary copy, deleted after the run
    ("tracking.uri", "sqlite:///mlflow.db", r"tracking\.uri = 'sqlite:///mlflow\.db': a relative store path"),
    # MLflow 3's file store refuses to open ("maintenance mode"): spec passed it and the store failed after it
    ("tracking.uri", "mlruns", r"tracking\.uri = 'mlruns': MLflow's file store .* sqlite:////absolute/path"),
    ("tracking.uri", "file:./mlruns", r"tracking\.uri = 'file:\./mlruns': MLflow's file store"),
    ("tracking.uri", "file:///abs/mlruns", r"tracking\.uri = 'file:///abs/mlruns': MLflow's file store"),
    ("tracking.uri", "/abs/mlflow.db", r"tracking\.uri = '/abs/mlflow\.db': MLflow's file store"),
    ("tracking.uri", "sqlite://mlflow.db", r"a SQLite store is sqlite:////absolute/path/mlflow\.db"),
    ("server.env", {"FOO": "a\nb"}, r"server\.env\.FOO = 'a\\nb': holds a control character"),
    # shapes the kernel's make_inputs refused only in the benchmark stage, with a traceback
    ("workload.cpu.topk", 1024, r"workload\.cpu\.topk = 1024: must be <= workload\.cpu\.num_cache_tokens \(512\)"),
    ("workload.cpu.num_cache_tokens", 500, r"workload\.cpu\.num_cache_tokens = 500: must be a multiple of"),
    ("workload.num_cache_tokens", 1000, r"workload\.num_cache_tokens = 1000: must be a multiple of workload\.page"),
    ("workload.topk", 10**9, r"workload\.topk = 1000000000: must be <= workload\.num_cache_tokens"),
    # the target section was loaded as given: `-S target.name=sm120` labelled sm90's limits and figures sm120,
    # `target.gpu` put the H200's peaks under another GPU's name, typos and impossible limits passed
    ("target.name", "sm120", r"target\.gpu = 'NVIDIA H200' but conf/target/sm120\.yaml says .*: choose a whole target"),
    ("target.name", "a b", r"target\.name = 'a b': not a file of conf/target/ .*add conf/target/<name>\.yaml"),
    ("target.gpu", "NVIDIA H100 80GB HBM3", r"target\.gpu = 'NVIDIA H100 80GB HBM3' but conf/target/sm90\.yaml says"),
    ("target.num_smss", 10, r"target\.num_smss: not a field of conf/target/sm90\.yaml"),
    ("target.num_sms", 0, r"target\.num_sms = 0 but conf/target/sm90\.yaml says 132"),
    ("target.arch", 3, r"target\.arch = 3 but conf/target/sm90\.yaml says 90"),
    ("target.arch", 90.0, r"target\.arch = 90\.0 but conf/target/sm90\.yaml says 90"),  # an integer written 90.0
    ("target.peak_gbps", 9999, r"target\.peak_gbps = 9999 but conf/target/sm90\.yaml says 4250"),
    ("target.max_ctas_per_sm", True, r"target\.max_ctas_per_sm = True but conf/target/sm90\.yaml says 32"),
    ("target", "sm999", r"unknown target 'sm999': choose one of"),
    # `~report.threshold` said "see conf/report/": report has no group folder, it is in conf/config.yaml
    ("report", {"confidence": 0.95}, r"report\.threshold is missing: set it in conf/ \(see conf/config\.yaml\)"),
    ("verify", {"serving": {}}, r"verify\.kernel is missing: set it in conf/ \(see conf/verify/\)"),
    ("variant.num_warps", None, r"variant\.num_warps = null: expected an integer >= 1"),  # said `= None`
    # a pattern ending in `$` matches before a trailing newline: these passed with re.match
    ("variant.name", "bt16_w4\n", r"variant\.name = 'bt16_w4\\n': a name is letters"),
    ("baseline.name", "x\n", r"baseline\.name = 'x\\n': a name is letters"),
    ("server.env", {"FOO\n": "1"}, r"server\.env key 'FOO\\n'"),
    ("kernel.module", "kernels.sparse_mla_decode\n", r"kernel\.module = 'kernels\.sparse_mla_decode\\n'"),
    # a file of kernels/ without the kernel API passed spec, was locked in dvc.lock and failed only in build
    (
        "kernel.module",
        "kernels.__init__",
        r"^kernel\.module = 'kernels\.__init__': kernels/__init__\.py defines no SparseMLADecode, which build, "
        r"benchmark and verify call on the kernel; name a kernel file of kernels/ that defines SparseMLADecode, "
        r"compile_specs, e\.g\. kernels\.sparse_mla_decode$",
    ),
    # a password in a URL setting went into params.yaml, dvc.lock, MLflow's params and deploy.json
    ("tracking.uri", "http://me:s3cret@mlflow:5000", r"tracking\.uri = 'http://me:\*\*\*@mlflow:5000': holds a pass"),
    (
        "deploy",
        {"kind": "command", "url": "http://me:s3cret@gpu:8000", "kernel_dest": "/k", "launch": "x"},
        r"deploy\.url = 'http://me:\*\*\*@gpu:8000': holds a password.*\$KERNELCAMP_API_KEY",
    ),
    # a / in the password: urlsplit ends the user information there, and the URL passed as one without a password
    ("tracking.uri", "http://me:s3cret/x@mlflow:5000", r"tracking\.uri = 'http://me:\*\*\*@mlflow:5000': holds a pass"),
]

GOOD = [
    ("server.env", {"NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": 4, "_X1": 0.5}),
    ("server.args", ["--log-level", "info"]),
    ("server.args", ["--never-ready", "--trace-dir=/tmp/traces"]),
    ("server.device", "cpu"),
    ("server.device", "cuda:1"),  # whether this machine has it is the deploy's check (it imports torch)
    ("server.host", "localhost"),
    ("server.port", 65526),
    ("benchmark.serving.baseline_port_offset", 9),
    ("benchmark.serving.max_tokens", 2024),
    ("build.also_targets", ["sm90", "sm120"]),
    ("tracking.uri", "sqlite:////tmp/mlflow.db"),  # a folder that exists (one that does not is refused)
    ("tracking.uri", "http://mlflow.example:5000"),
    ("tracking.uri", "http://me@mlflow.example:5000"),  # a user name alone is no secret
    ("variant.name", "bt16_w4.v2+try-1"),
    ("variant.BLOCK_T", 512),  # the GPU workload's top-k (the CPU's is 64: the larger shape bounds the tile)
    ("variant.BLOCK_H", 64),
    ("deploy", {"kind": "command", "url": "u", "kernel_dest": "/k", "launch": "cd /x &&\n  ./serve\t--a"}),
    ("target", "sm120"),  # a name: the file is read
    ("target", yaml.safe_load((ROOT / "conf" / "target" / "sm90_h100.yaml").read_text())),
    ("target", {"name": "sm90", "peak_gbps": 4250}),  # keys left out take the file's values
]


@pytest.mark.parametrize("key,value", GOOD, ids=[f"{k}={v!r}" for k, v in GOOD])
def test_values_next_to_the_refused_ones_pass(key: str, value) -> None:
    """Each check refuses its kind and no more: the neighbouring good values parse."""
    parse_spec(_with(PARAMS, key, value))


def test_a_relative_store_is_refused_before_any_store_is_opened(tmp_path: Path, monkeypatch) -> None:
    """The spec stage opens the store (tracked_stage) before it parses the spec: `-S tracking.uri=sqlite:///x/y.db`
    created x/y.db in the workspace and failed with MLflow's own error. The store's URI is checked where it is
    read, for MLFLOW_TRACKING_URI too."""
    from kernelcamp import tracking

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    p = _with(PARAMS, "tracking.uri", "sqlite:///rel/x.db")
    with pytest.raises(KernelcampError, match=r"tracking\.uri = 'sqlite:///rel/x\.db': a relative store path"):
        tracking.ensure_store(p)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "mlruns")
    with pytest.raises(KernelcampError, match=r"MLFLOW_TRACKING_URI = 'mlruns': MLflow's file store"):
        tracking.tracking_uri(PARAMS)
    # with MLflow's own opt-out the file store opens: then only its path must be absolute
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    with pytest.raises(KernelcampError, match=r"MLFLOW_TRACKING_URI = 'mlruns': a relative store path"):
        tracking.tracking_uri(PARAMS)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "file:///abs/mlruns")
    assert tracking.tracking_uri(PARAMS) == "file:///abs/mlruns"
    assert list(tmp_path.iterdir()) == []


def test_a_store_inside_the_pipelines_outputs_is_refused(tmp_path: Path, monkeypatch) -> None:
    """`-S "tracking.uri='sqlite:////<workspace>/reports/x.db'"` ran: the report stage logs every file of reports/ as
    an artifact, so the live x.db and x.db-lock were copied mid-write into the run, and reports/mlartifacts/ and x.db
    showed up beside the committed outputs. Refused for this tree's output folders and the workspace's ($DVC_ROOT),
    by way of a symlink too, for MLFLOW_TRACKING_URI and a file store; a store beside them passes."""
    from kernelcamp import tracking

    ws = tmp_path / "ws"
    (ws / "results").mkdir(parents=True)
    (ws / "dvc.yaml").write_text("stages:\n  s:\n    cmd: x\n    outs:\n      - results/a.json\n      - top.json\n")
    monkeypatch.setenv("DVC_ROOT", str(ws))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "link").symlink_to(ROOT / "reports")
    for uri, folder in [
        (f"sqlite:///{ROOT}/reports/x.db", "reports"),
        (f"sqlite:///{ROOT}/reports/plots/x.db", "reports"),
        (f"sqlite:///{tmp_path}/link/x.db", "reports"),
        (f"sqlite:///{ws}/results/m.db", "results"),
    ]:
        with pytest.raises(KernelcampError) as e:
            parse_spec(_with(PARAMS, "tracking.uri", uri))
        assert re.fullmatch(
            rf"tracking\.uri = '{re.escape(uri)}': the store would be inside {folder}/, an output folder of the "
            r"pipeline \(dvc\.yaml\), whose files the report stage logs as artifacts .*; put the store outside the "
            rf"outputs, e\.g\. sqlite:///{re.escape(str(ws))}/mlflow\.db, or leave tracking\.uri null for "
            r"\$DVC_ROOT/mlflow\.db",
            str(e.value),
        ), str(e.value)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{ws}/results/m.db")
    with pytest.raises(KernelcampError, match=r"^MLFLOW_TRACKING_URI = '.*': the store would be inside results/"):
        tracking.tracking_uri(PARAMS)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file://{ROOT}/reports/mlruns")
    with pytest.raises(KernelcampError, match=r"^MLFLOW_TRACKING_URI = '.*': the store would be inside reports/"):
        tracking.tracking_uri(PARAMS)
    # a SQLite store's artifacts go to mlartifacts/ beside it: that folder must not be an output either
    (ws / "dvc.yaml").write_text("stages:\n  s:\n    cmd: x\n    outs:\n      - mlartifacts/a.json\n")
    with pytest.raises(KernelcampError, match=r"its artifacts \(mlartifacts/ beside it\) would be inside mlartifacts/"):
        parse_spec(_with(PARAMS, "tracking.uri", f"sqlite:///{ws}/m.db"))
    parse_spec(_with(PARAMS, "tracking.uri", f"sqlite:///{ws}/results/m.db"))  # not an output folder now
    # beside the outputs: the workspace's top level (the default store's place), another folder
    for ok in (f"sqlite:///{ROOT}/mlflow.db", f"sqlite:///{ROOT}/reports.db", f"sqlite:///{tmp_path}/m.db"):
        parse_spec(_with(PARAMS, "tracking.uri", ok))
    assert sorted(p.name for p in ws.iterdir()) == ["dvc.yaml", "results"]


def test_a_local_conf_without_its_header_names_the_header() -> None:
    """A conf/local/default.yaml without `# @package _global_` gave "unknown section 'local'" and no fix."""
    with pytest.raises(KernelcampError, match=r"conf/local/default\.yaml needs `# @package _global_`"):
        parse_spec({**PARAMS, "local": {"server": {"port": 9000}}})


def test_a_max_tokens_check_is_the_embedded_servers_only() -> None:
    """Another server's context is its own: with deploy.kind command a long max_tokens passes."""
    p = _with(PARAMS, "deploy", {"kind": "command", "url": "u", "kernel_dest": "/k", "launch": "x"})
    parse_spec(_with(p, "benchmark.serving.max_tokens", 100000))


def test_a_sweep_workers_ports_are_bounded_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sweep slot 2 serves at server.port + 30: its range must fit under 65535 as well."""
    monkeypatch.setenv("KERNELCAMP_WORKER_SLOT", "2")
    with pytest.raises(KernelcampError, match=r"server\.port = 65500: .*up to 65539 .*worker's base port"):
        parse_spec(_with(PARAMS, "server.port", 65500))


def _with(params: dict, key: str, value) -> dict:
    p = copy.deepcopy(params)
    *path, last = key.split(".")
    node = p
    for k in path:
        node = node[k]
    node[last] = value
    return p


@pytest.mark.parametrize("key,value,msg", BAD, ids=[f"{k}={v!r}" for k, v, _ in BAD])
def test_bad_params_are_one_line_naming_the_key(key: str, value, msg: str) -> None:
    with pytest.raises(KernelcampError) as e:
        parse_spec(_with(PARAMS, key, value))
    assert re.search(msg, str(e.value)), str(e.value)
    assert "\n" not in str(e.value)
    assert "s3cret" not in str(e.value)


def test_a_foreign_servers_args_and_host_are_its_own() -> None:
    """server.args of a command or ssh server reach it as $KERNELCAMP_SERVER_ARGS: its own options, not
    `kernelcamp serve`'s; server.host, server.device are the embedded server's alone. The options the deploy
    sets itself are refused for every kind."""
    p = _with(PARAMS, "deploy", {"kind": "command", "url": "http://gpu:8000", "kernel_dest": "/k", "launch": "x"})
    p["server"].update(args=["--workers=4", "--api-key=k"], host="192.0.2.1", device="bogus")
    parse_spec(p)
    p["server"]["args"] = ["--port=9"]
    with pytest.raises(KernelcampError, match=r"server\.args\.0 = '--port=9': the deploy sets --port itself"):
        parse_spec(p)


@pytest.mark.parametrize(
    "key,value", [("deploy.host", "-oProxyCommand=touch /tmp/x"), ("deploy.user", "-oX"), ("deploy.remote_dir", "-r")]
)
def test_ssh_fields_that_would_reach_ssh_as_options_are_refused(key: str, value: str) -> None:
    p = _with(PARAMS, "deploy", {"kind": "ssh", "host": "gpu1", "remote_dir": "/srv/k", "restart": "r", "url": "u"})
    with pytest.raises(KernelcampError, match=re.escape(f"{key} = {value!r}: must not start with '-'")):
        parse_spec(_with(p, key, value))


@pytest.mark.parametrize("value", ["~/kernelcamp", "/srv/k dir", "/srv/$(touch x)", "/srv/k;rm", "/srv/`id`"])
def test_a_remote_dir_the_shell_and_scp_would_read_apart_is_refused(value: str) -> None:
    """``~/k`` quoted for the remote shell made a folder named ``~`` while scp expanded it; spaces and shell
    characters reach scp's legacy protocol unquoted."""
    p = _with(PARAMS, "deploy", {"kind": "ssh", "host": "gpu1", "remote_dir": value, "restart": "r", "url": "u"})
    with pytest.raises(KernelcampError, match=r"deploy\.remote_dir = .*: use a path of letters, digits"):
        parse_spec(p)


def test_a_null_ssh_port_means_22(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``deploy.port: null`` passed the spec, then ``int(None)`` crashed the ssh deploy."""
    from kernelcamp.deploy import ssh

    seen = {}

    class Runner(ssh.SshRunner):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            seen["port"] = self.port
            raise KernelcampError("stop here")

    p = _with(PARAMS, "deploy", {"kind": "ssh", "host": "gpu1", "port": None, "remote_dir": "/srv/k", "restart": "r"})
    p["deploy"]["url"] = "http://127.0.0.1:9"
    spec = parse_spec(p)
    monkeypatch.setattr(ssh, "SshRunner", Runner)
    with pytest.raises(KernelcampError, match="stop here"):
        ssh.deploy_ssh(spec.raw, tmp_path)
    assert seen["port"] == 22


def test_a_target_name_never_leaves_conf_target(tmp_path: Path) -> None:
    """``load_target("/tmp/x")`` read /tmp/x.yaml: ``conf/target/`` joined with an absolute path is that path."""
    from kernelcamp.targets import load_target

    (tmp_path / "evil.yaml").write_text((ROOT / "conf" / "target" / "sm90.yaml").read_text())
    for name in (str(tmp_path / "evil"), "../target/sm90", "sm90/../sm90"):
        with pytest.raises(KernelcampError, match=r"unknown target .*: choose one of"):
            load_target(name)
    assert load_target("sm90").name == "sm90"


def test_the_spec_stage_refuses_bad_params_before_writing_anything(run_spec_stage) -> None:
    """`-S variant.num_warps=4.0` skipped every stage (DVC compares 4.0 == 4) and recorded nothing;
    the spec stage always runs and stops with one line, exit 2, its output untouched."""
    r, out = run_spec_stage(_with(PARAMS, "variant.num_warps", 4.0))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert lines == ["error: variant.num_warps = 4.0: expected an integer >= 1"]
    assert out.read_text() == "previous\n"


@pytest.mark.parametrize("content", [b"a: [1, 2\n", b"\x00\xff\xfe binary", None])
def test_unreadable_params_files_are_one_line(tmp_path: Path, content: bytes | None) -> None:
    from kernelcamp.spec import load_spec

    path = tmp_path / "params.yaml"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    with pytest.raises(KernelcampError) as e:
        load_spec(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)


def test_spec_stage_is_the_gate_of_the_pipeline() -> None:
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert list(stages)[0] == "spec" and stages["spec"]["always_changed"] is True
    assert "reports/spec.json" in stages["build"]["deps"]  # so it runs first


# ------------------------------------------------------------------------ nothing left behind


def test_every_stage_output_survives_a_failed_rerun() -> None:
    """A failed build deleted the last good build.json (DVC removes non-persist outputs before it
    runs a stage) while the README says reports/ keeps the last finished run's outputs."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    for name, st in stages.items():
        for kind in ("outs", "metrics"):
            for out in st.get(kind) or []:
                path, opts = next(iter(out.items())) if isinstance(out, dict) else (out, {})
                assert (opts or {}).get("persist") is True, f"{name}: {path} is not persist"


def test_stage_temporaries_are_ignored_by_git(tmp_path: Path) -> None:
    names = ["reports/.report.abc123/report.md", "reports/.build.json.x1y2.tmp", "reports/.plots.old.zz/a.png"]
    r = subprocess.run(["git", "check-ignore", "--no-index", *names], cwd=ROOT, capture_output=True, text=True)
    assert r.stdout.split() == names


def test_a_server_tied_to_its_caller_dies_with_it_even_on_sigkill(tmp_path: Path) -> None:
    """kill -9 of benchmark orphaned the temporary baseline server (parent pid 1)."""
    pidfile = tmp_path / "child.pid"
    code = textwrap.dedent(
        f"""
        import subprocess, sys, time
        from kernelcamp.signals import pdeathsig_preexec
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], preexec_fn=pdeathsig_preexec(),
                             start_new_session=True)
        open({str(pidfile)!r}, "w").write(str(p.pid))
        time.sleep(120)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    deadline = time.time() + 30
    while not (pidfile.exists() and pidfile.read_text()) and time.time() < deadline:
        time.sleep(0.05)
    child = int(pidfile.read_text())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    from kernelcamp.io import pid_alive

    deadline = time.time() + 10
    while pid_alive(child) and time.time() < deadline:
        time.sleep(0.05)
    alive = pid_alive(child)
    if alive:
        os.kill(child, signal.SIGKILL)
    assert not alive, "the child outlived its SIGKILLed parent"


CONF = ROOT / "conf"
_OPTIONS = [
    f"{g.name}={p.stem}"
    for g in sorted(CONF.iterdir())
    if g.is_dir() and g.name not in ("local",)
    for p in sorted(g.glob("*.yaml"))
    if f"{g.name}={p.stem}" not in ("target=auto", "deploy=command", "deploy=ssh")  # a GPU / ??? values
]


@pytest.mark.parametrize("override", _OPTIONS)
def test_every_config_file_and_experiment_passes_the_run_spec(override: str) -> None:
    from kernelcamp.compose import compose_text

    raw = yaml.safe_load(compose_text(ROOT, [override]))
    if raw["baseline"].get("kernel_rev"):  # refused with the serving A/B's baseline server (tests/test_kernel_rev.py)
        raw["benchmark"]["serving"]["enabled"] = False
    spec = parse_spec(raw)
    assert spec.variant_hash and spec.kernel_file.is_file()


def test_a_deploy_with_required_values_unset_names_them() -> None:
    from kernelcamp.compose import compose_text

    with pytest.raises(KernelcampError, match=r"deploy\.kernel_dest is required \(\?\?\? in conf/\)"):
        parse_spec(yaml.safe_load(compose_text(ROOT, ["deploy=command"])))


def test_the_benchmarks_baseline_server_is_tied_to_the_stage(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The flag was lost once in a rewrite of serving/bench.py while the README promised it."""
    import kernelcamp.bench.serving as sb
    import kernelcamp.deploy.embedded as sd

    seen = {}

    def fake_start(*a, die_with_caller=False, **k):
        seen["die_with_caller"] = die_with_caller
        raise KeyboardInterrupt  # stop right there

    monkeypatch.setattr(sd, "start_embedded", fake_start)
    monkeypatch.setattr(sb, "_free_baseline_port", lambda *a, **k: None)
    with pytest.raises(KeyboardInterrupt), sb.baseline_server(copy.deepcopy(PARAMS), "http://127.0.0.1:8765", tmp_path):
        pass
    assert seen == {"die_with_caller": True}


def test_a_null_time_budget_means_none() -> None:
    # the benchmark documents null as "no time budget"; the spec refused it as "expected a number"
    spec = parse_spec(_with(_with(PARAMS, "benchmark.kernel.max_seconds", None), "benchmark.serving.max_seconds", None))
    assert spec.benchmark.kernel.max_seconds is None and spec.benchmark.serving.max_seconds is None


def test_build_records_are_checked_for_the_baseline_and_target_too() -> None:
    spec = parse_spec(PARAMS)
    other = parse_spec(_with(PARAMS, "baseline", {**PARAMS["variant"], "name": "other"}))
    from kernelcamp.spec import BUILD_KEYS

    assert {"baseline_config_hash", "target"} <= set(BUILD_KEYS)
    with pytest.raises(KernelcampError, match="build.json has baseline_config_hash"):
        spec.check_record("build.json", other.hashes(), BUILD_KEYS)


@pytest.mark.usefixtures("workspace_run")
def test_a_reused_pid_is_not_taken_for_the_runs_owner(tmp_path: Path) -> None:
    """The claim named only a pid: a new process given the dead owner's pid looked like a live run."""
    claim_run(tmp_path, "build", "a" * 64, owner=os.getpid())
    path = tmp_path / ".kernelcamp" / "run.json"
    stale = json.loads(path.read_text())
    stale["owner_start"] -= 1  # the same pid, started at another time: another process
    path.write_text(json.dumps(stale))
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert claim_run(tmp_path, "spec", "b" * 64, owner=other.pid)["owner_pid"] == other.pid
    finally:
        other.kill()
        other.wait()


def test_a_queued_run_waits_for_the_workspace_run_that_holds_its_server(tmp_path: Path, monkeypatch) -> None:
    """`dvc queue start` during a workspace run: the queued experiment (its own temporary copy, so its own
    tree claim) deployed to the workspace's server folder and stopped the workspace run's server in the
    middle of its serving A/B. It now waits for that run to end, then claims the server folder."""
    import threading

    ws, copy = tmp_path / "ws", tmp_path / "copy"
    monkeypatch.setenv("DVC_ROOT", str(ws))
    workspace_owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    queued_owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        claim_run(ws, "benchmark", "a" * 64, owner=workspace_owner.pid)
        done: list = []
        t = threading.Thread(target=lambda: done.append(claim_run(copy, "spec", "b" * 64, queued_owner.pid, 0.05)))
        t.start()
        t.join(1.0)
        assert t.is_alive() and not done, "the queued run went on while the workspace run held its server"
        assert json.loads((ws / ".kernelcamp" / "run.json").read_text())["owner_pid"] == workspace_owner.pid
        release_run(ws, owner=workspace_owner.pid)  # the workspace run's report stage
        t.join(5.0)
        assert done and done[0]["owner_pid"] == queued_owner.pid
        server = json.loads((ws / ".kernelcamp" / "run.json").read_text())
        assert server["owner_pid"] == queued_owner.pid and server["tree"] == str(copy)
        release_run(copy, owner=queued_owner.pid)  # the server claim removed, the copy's own kept while it saves
        assert not (ws / ".kernelcamp" / "run.json").exists()
        assert json.loads((copy / ".kernelcamp" / "run.json").read_text())["phase"] == "saving"
        # a workspace run's stages re-check its own claim: one file, no wait
        claim_run(ws, "spec", "c" * 64, owner=workspace_owner.pid)
        assert claim_run(ws, "build", "c" * 64, owner=workspace_owner.pid)["stage"] == "spec"
        release_run(ws, owner=workspace_owner.pid)
        # the other order: a queued experiment holds the server, then a workspace run starts: it waits too (it
        # was refused as "another pipeline run ... is running in <the workspace>", a run of another tree)
        claim_run(copy, "deploy", "b" * 64, owner=queued_owner.pid)
        done.clear()
        t = threading.Thread(target=lambda: done.append(claim_run(ws, "spec", "c" * 64, workspace_owner.pid, 0.05)))
        t.start()
        t.join(1.0)
        assert t.is_alive() and not done, "the workspace run went on while a queued run held its server"
        release_run(copy, owner=queued_owner.pid)
        t.join(5.0)
        assert done and done[0]["owner_pid"] == workspace_owner.pid
    finally:
        for p in (workspace_owner, queued_owner):
            p.kill()
            p.wait()


@pytest.mark.usefixtures("workspace_run")
def test_the_mlflow_run_spans_the_pipeline_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The report opened the run at the end, so its duration was the report stage's logging only."""
    from kernelcamp import tracking
    from kernelcamp.runlock import run_started_ms

    claim = claim_run(tmp_path, "spec", "a" * 64, owner=os.getpid())
    assert run_started_ms(tmp_path, owner=os.getpid()) == claim["claimed_at_ms"]
    assert run_started_ms(tmp_path, owner=os.getpid() + 1) is None
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    started = claim["claimed_at_ms"] - 120_000  # two minutes before now
    with tracking.tracked_run({}, run_name="t", start_time_ms=started) as run:
        rid = run.run_id
    info = tracking._client(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(rid).info
    assert info.start_time == started and info.end_time - info.start_time >= 120_000


def test_a_gpu_server_never_serves_the_reference_in_place_of_a_broken_kernel() -> None:
    """A kernel module that failed to import made a GPU server run the torch reference under the
    variant's hash: a benchmark would then compare the reference with itself."""
    from types import SimpleNamespace

    from kernelcamp.serve.model import attention_impl

    broken = SimpleNamespace(module="kernels.alt", SparseMLADecode=None, error="SyntaxError: invalid syntax")
    with pytest.raises(KernelcampError, match=r"kernel module 'kernels.alt' did not load \(SyntaxError"):
        attention_impl(True, broken)
    assert attention_impl(False, broken) == "torch_reference_cpu"
    assert attention_impl(True, SimpleNamespace(SparseMLADecode=object)) == "triton"


def test_stage_params_are_dvc_yamls_keys_and_differences_name_the_deepest_key() -> None:
    """What each stage records (``stage_params``) is what dvc.yaml reruns it for; the report names the
    first key whose value a record was made with and this run's params do not give."""
    from kernelcamp.spec import first_difference

    spec = parse_spec(PARAMS)
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    for stage in ("build", "deploy", "benchmark", "verify"):
        assert list(spec.stage_params(stage)) == dvc[stage]["params"]
    b = spec.stage_params("benchmark")
    assert b["report.threshold"] == PARAMS["report"]["threshold"] and b["benchmark"] == PARAMS["benchmark"]
    assert first_difference({"a": {"b": [1, 2]}}, {"a": {"b": [1, 2.0]}}) is None  # JSON: 2 == 2.0
    assert first_difference({"a": {"b": [1, 2]}}, {"a": {"b": [1, 3]}}) == ("a.b.1", 2, 3)
    assert first_difference({"a": 1}, {"a": True}) == ("a", 1, True)
    assert first_difference({"a": 1}, {}) == ("a", 1, None)
    rec = {"stage_params": {**b, "report.threshold": 0.5}}
    with pytest.raises(KernelcampError, match=r"^x\.json was made with report\.threshold = 0\.5 but params\.yaml"):
        spec.check_stage_params("x.json", rec, "benchmark")
    with pytest.raises(KernelcampError, match=r"x\.json does not record the params it ran with"):
        spec.check_stage_params("x.json", {}, "benchmark")
    spec.check_stage_params("x.json", {"stage_params": json.loads(json.dumps(b))}, "benchmark")


def test_a_live_runs_server_and_params_are_left_alone(tmp_path: Path, monkeypatch, capsys) -> None:
    """`make clean-server` (stages.deploy --stop) during a pipeline run stopped the server mid-benchmark, and
    `kernelcamp compose` (`make params`) rewrote the run's params.yaml, whose next stage then blamed "another
    `dvc exp run`" (helper audit B-F1, B-F2). Both refuse in one line while a live run holds the workspace;
    --stop --force stops it anyway."""
    import stages.deploy as deploy_stage
    from kernelcamp import cli

    ws = tmp_path / "ws"
    (ws / ".dvc").mkdir(parents=True)
    (ws / ".dvc" / "config").write_text((ROOT / ".dvc" / "config").read_text())
    (ws / "conf").symlink_to(ROOT / "conf")
    (ws / "params.yaml").write_text("x: 1\n")
    monkeypatch.setenv("DVC_ROOT", str(ws))
    stopped: list = []
    monkeypatch.setattr(deploy_stage, "stop", lambda: stopped.append(1) or True)
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        claim_run(ws, "benchmark", "a" * 64, owner=owner.pid)
        monkeypatch.setattr(sys, "argv", ["deploy", "--stop"])
        with pytest.raises(KernelcampError, match=f"not stopping the server: a pipeline run \\(dvc pid {owner.pid}, at "
                           "stage benchmark.*or pass --force"):  # fmt: skip
            deploy_stage.main()
        assert not stopped
        assert cli.main(["compose", "--root", str(ws)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: not writing {ws}/params.yaml: a pipeline run"), err
        assert (ws / "params.yaml").read_text() == "x: 1\n"
        # another output file is no run's input; --force stops the server
        assert cli.main(["compose", "--root", str(ws), "-o", "other.yaml"]) == 0
        monkeypatch.setattr(sys, "argv", ["deploy", "--stop", "--force"])
        assert deploy_stage.main() == 0 and stopped == [1]
    finally:
        owner.kill()
        owner.wait()
    # a queued experiment (its own copy of the tree) holds the workspace's server folder, whose claim file is the
    # workspace's: the server is refused, but the workspace's params.yaml is not that run's (helper-52)
    queued = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        claim_run(tmp_path / "copy", "deploy", "b" * 64, owner=queued.pid)
        monkeypatch.setattr(sys, "argv", ["deploy", "--stop"])
        with pytest.raises(KernelcampError, match="not stopping the server"):
            deploy_stage.main()
        assert cli.main(["compose", "--root", str(ws)]) == 0
    finally:
        queued.kill()
        queued.wait()
    (ws / "params.yaml").write_text("x: 1\n")
    # the run is over (its owner gone): both go ahead
    stopped.clear()
    monkeypatch.setattr(sys, "argv", ["deploy", "--stop"])
    assert deploy_stage.main() == 0 and stopped == [1]
    assert cli.main(["compose", "--root", str(ws)]) == 0 and (ws / "params.yaml").read_text() != "x: 1\n"


def test_compose_check_names_a_missing_file(tmp_path: Path, capsys) -> None:
    from kernelcamp import cli

    assert cli.main(["compose", "--root", str(ROOT), "--check", "-o", str(tmp_path / "none.yaml")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not exist" in err[0] and "differs" not in err[0], err


def test_a_refused_stop_records_no_failed_deploy(tmp_path: Path, monkeypatch) -> None:
    """`make clean-server` refused under a live run ran inside the deploy stage's failure recording: the store got a
    FAILED "deploy" run with the live run's params, as if its deploy had failed while it benchmarked (helper-52)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    env = {**os.environ, "DVC_ROOT": str(ws), "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    monkeypatch.setenv("DVC_ROOT", str(ws))
    try:
        claim_run(ws, "benchmark", "a" * 64, owner=owner.pid)
        r = subprocess.run(
            [sys.executable, "-m", "stages.deploy", "--stop"], cwd=ROOT, env=env, capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
    finally:
        owner.kill()
        owner.wait()
    assert r.returncode == 2 and r.stderr.strip().startswith("error: not stopping the server"), r.stderr
    assert not (ws / "mlflow.db").exists(), "the refusal opened the tracking store"


def test_a_tile_bound_names_a_batch_table_row_and_starts_at_16() -> None:
    """The bound names the row of a list or table (baseline.configs.N), and is never below the smallest tile (16),
    whatever the heads: a workload of 8 heads still takes BLOCK_H 16, not 32."""
    p = copy.deepcopy(PARAMS)
    p["baseline"]["configs"][1]["BLOCK_T"] = 1024
    with pytest.raises(KernelcampError, match=r"^baseline\.configs\.1\.BLOCK_T = 1024: .*use at most 512$"):
        parse_spec(p)
    p = _with(_with(PARAMS, "workload.num_heads", 8), "workload.cpu.num_heads", 8)
    parse_spec(_with(p, "variant.BLOCK_H", 16))
    with pytest.raises(KernelcampError, match=r"variant\.BLOCK_H = 32: larger than the workload's 8 heads"):
        parse_spec(_with(p, "variant.BLOCK_H", 32))


@pytest.mark.usefixtures("workspace_run")
def test_a_refused_second_run_puts_the_first_runs_params_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second `dvc exp run -S ...` rewrites params.yaml before its first stage can refuse it: the first run's next
    stage stopped on the changed file, both runs were lost and params.yaml was left the refused one's (helper-59).
    The refusal now comes before params.yaml is read, even where the second run's values do not parse, and puts the
    first run's file back."""
    from kernelcamp import runlock
    from kernelcamp import spec as spec_mod
    from kernelcamp.io import sha256_text
    from kernelcamp.runlock import refuse_if_another_run

    first = (ROOT / "params.yaml").read_text()
    second = first.replace("num_warps: 4", "num_warps: 3", 1)  # the refused run's: not even a valid value
    assert second != first
    params = tmp_path / "params.yaml"
    params.write_text(second)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        claim_run(tmp_path, "benchmark", sha256_text(first), owner=other.pid, params_text=first)
        monkeypatch.setattr(runlock, "run_owner", lambda pid=None: os.getpid())
        monkeypatch.setattr(spec_mod, "project_root", lambda: tmp_path)
        with pytest.raises(KernelcampError) as e:
            spec_mod.stage_spec("spec", params)
        assert str(e.value).startswith(f"another pipeline run (dvc pid {other.pid}, at stage benchmark)"), e.value
        assert str(e.value).endswith(
            "params.yaml, which this command rewrote before it was refused, is put back as that run's, so it goes on"
        )
        assert params.read_text() == first
        with pytest.raises(KernelcampError) as e:  # as the first run composed it: nothing to put back
            refuse_if_another_run(tmp_path, params, owner=os.getpid())
        assert "put back" not in str(e.value)
    finally:
        other.kill()
        other.wait()
    params.write_text(second)
    refuse_if_another_run(tmp_path, params, owner=os.getpid())  # its owner is gone: nothing refused, nothing written
    assert params.read_text() == second


_TOY_STAGE = """
import sys, time
from pathlib import Path
from kernelcamp.io import sha256_text
from kernelcamp.runlock import claim_run, refuse_if_another_run, release_run
root = Path.cwd()
when, mark = (sys.argv[3], sys.argv[4]) if len(sys.argv) > 4 else (None, None)
if when == "before":  # a run's first seconds, before its claim: say so in the file mark, then wait 8 s
    Path(mark).touch()
    time.sleep(8)
refuse_if_another_run(root, "params.yaml")
text = Path("params.yaml").read_text()
claim_run(root, sys.argv[1], sha256_text(text), params_text=text)
time.sleep(float(sys.argv[2]))
if Path("params.yaml").read_text() != text:  # what every kernelcamp stage checks at its end
    sys.exit("params.yaml changed while the stage ran")
Path(f"out_{sys.argv[1]}.txt").write_text(text)
if when == "release":  # the last stage, as the report stage: the run released, then 6 s before DVC saves it
    release_run(root)
    Path(mark).touch()
    time.sleep(6)
"""

_TOY_DVC = """
stages:
  a:
    cmd: python3 stage.py a 0
    deps: [stage.py]
    params: [x]
    outs: [out_a.txt]
  b:
    cmd: python3 stage.py b 12
    deps: [stage.py{b_deps}]
    outs: [out_b.txt]
"""


def _claim_of(path: Path, owner: int) -> dict:
    """The claim at ``path`` when ``owner`` holds it, else {}."""
    cur = json.loads(path.read_text())
    return cur if cur.get("owner_pid") == owner else {}


def _toy_dvc_repo(root: Path, env: dict[str, str], dvc_yaml: str, hydra: bool = False) -> Callable[..., Any]:
    """A committed git + DVC repo in ``root`` of the toy stages (``_TOY_STAGE``, ``dvc_yaml``, params.yaml ``x: 1``);
    ``hydra``: params.yaml composed from ``conf/config.yaml`` by ``dvc exp run``, with this checkout's
    hydra_plugins. Returns ``sh(*cmd)``: a command run in ``root`` with ``env``, its output captured."""

    def sh(*cmd: str) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=120)

    (root / "stage.py").write_text(_TOY_STAGE)
    (root / "dvc.yaml").write_text(dvc_yaml)
    (root / "params.yaml").write_text("x: 1\n")
    (root / ".gitignore").write_text(".kernelcamp/\n__pycache__/\n")
    setup = [
        ("git", "init", "-q"),
        ("git", "config", "user.email", "t@kernelcamp"),
        ("git", "config", "user.name", "t"),
        (sys.executable, "-m", "dvc", "init", "-q"),
        (sys.executable, "-m", "dvc", "config", "core.analytics", "false"),
    ]
    if hydra:
        (root / "conf").mkdir()
        (root / "conf" / "config.yaml").write_text("x: 1\n")
        shutil.copytree(ROOT / "hydra_plugins", root / "hydra_plugins", ignore=shutil.ignore_patterns("__pycache__"))
        setup.append((sys.executable, "-m", "dvc", "config", "hydra.enabled", "true"))
    for cmd in [*setup, ("git", "add", "-A"), ("git", "commit", "-qm", "toy")]:
        r = sh(*cmd)
        assert r.returncode == 0, (cmd, r.stderr)
    return sh


@contextlib.contextmanager
def _run_at_stage(root: Path, env: dict[str, str], stage: str | Path, *args: str) -> Iterator[subprocess.Popen]:
    """``dvc exp run ARGS`` started in the toy repo ``root``, yielded once its own claim (not one an earlier run
    left) is at ``stage`` (a Path: once that file exists); killed at the end of the block if still running."""
    first = subprocess.Popen(
        [sys.executable, "-m", "dvc", "exp", "run", *args],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        claim = root / ".kernelcamp" / "run.json"
        deadline = time.monotonic() + 90
        while not (
            stage.exists()
            if isinstance(stage, Path)
            else claim.exists() and _claim_of(claim, first.pid).get("at_stage") == stage
        ):
            assert first.poll() is None and time.monotonic() < deadline, f"the first run did not reach stage {stage}"
            time.sleep(0.2)
        yield first
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("b_deps", "refusal"),
    # the keeper may put params.yaml back before the second run's stage a starts: DVC then skips that stage and its
    # lock refuses the second run at stage b
    [("", ("another pipeline run", "is busy")), (", out_a.txt", ("is busy",))],
    ids=["refused_by_kernelcamp", "refused_by_dvc_lock"],
)
def test_a_refused_second_exp_run_leaves_the_first_runs_experiment(
    tmp_path: Path, b_deps: str, refusal: tuple[str, ...]
) -> None:
    """A second `dvc exp run` during a run is refused by its first stage, and DVC's teardown of that refused run
    deletes refs/exps/exec/EXEC_BASELINE, which the first run's commit reads: the first run ran every stage and
    logged its MLflow run, then failed with "'NoneType' object is not subscriptable" and saved no experiment
    (helper-61, DVC 3.67). DVC's own lock refuses a second run whose first stage writes what the first run's running
    stage reads (spec.json during build and verify), with the same teardown, and its rewrite of params.yaml stayed:
    the running stage then failed on the changed file (helper-64). The first run's claim now starts a keeper
    (kernelcamp.expref) of that ref and of params.yaml, which leaves no ref behind once the run has ended."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("DVC_ROOT", None)
    sh = _toy_dvc_repo(tmp_path, env, _TOY_DVC.format(b_deps=b_deps))
    with _run_at_stage(tmp_path, env, "b", "-n", "first") as first:
        second = sh(sys.executable, "-m", "dvc", "exp", "run", "-S", "x=2", "-n", "second")
        assert second.returncode != 0
        assert any(r in second.stdout + second.stderr for r in refusal), second.stdout + second.stderr
        out, _ = first.communicate(timeout=120)
    assert first.returncode == 0, out[-3000:]
    refs = sh("git", "for-each-ref", "--format=%(refname)", "refs/exps").stdout.split()
    assert [r.rsplit("/", 1)[-1] for r in refs if "/exec/" not in r] == ["first"], refs
    assert (tmp_path / "out_b.txt").read_text() == "x: 1\n"
    assert (tmp_path / "params.yaml").read_text() == "x: 1\n"
    time.sleep(0.5)  # the keeper's last poll: it must not put the ref back after the run's own teardown
    assert sh("git", "rev-parse", "-q", "--verify", "refs/exps/exec/EXEC_BASELINE").returncode != 0


@pytest.mark.parametrize(
    ("argv", "refused"),
    [
        (["/usr/bin/dvc", "exp", "run"], True),
        (["/x/dvc/__main__.py", "exp", "run", "-S", "variant.num_warps=8", "-n", "w8"], True),
        (["/usr/bin/dvc", "exp", "run", "--queue", "-S", "variant.num_warps=8"], False),
        (["/usr/bin/dvc", "exp", "run", "--temp"], False),
        (["/usr/bin/dvc", "exp", "run", "--help"], False),
        (["/usr/bin/dvc", "queue", "start"], False),
        (["/usr/bin/dvc", "repro"], False),
        (["/x/kernelcamp/cli.py", "compose"], False),
        ([], False),
    ],
)
def test_the_guard_acts_only_in_a_workspace_exp_run(argv: list[str], refused: bool) -> None:
    """hydra_plugins/kernelcamp_guard refuses only `dvc exp run` in the workspace: a queued or --temp run runs in a
    copy, and Hydra imports the module in every process that composes the conf (make params, tests)."""
    from hydra_plugins.kernelcamp_guard import workspace_exp_run

    assert workspace_exp_run(argv) is refused


def test_claim_workspace_run_claims_from_the_start_and_refuses_only_another_live_run(tmp_path: Path) -> None:
    """runlock.claim_workspace_run (the guard's, as a workspace `dvc exp run` composes params.yaml): a run it lets
    through holds the tree from then on, provisionally, and its first stage's claim_run makes that claim whole (the
    same owner: not "params.yaml changed"); a second run is refused both before and after that first stage; a dead
    owner's claim is taken over. Without the provisional claim a second run in a first run's first seconds passed
    (helper-66)."""
    from kernelcamp.errors import AnotherRunError
    from kernelcamp.runlock import claim_path, claim_workspace_run, run_params

    path = claim_path(tmp_path)
    run = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # the first run's dvc process
    try:
        claim_workspace_run(tmp_path, run.pid)  # no claim: it claims the tree
        cur = json.loads(path.read_text())
        assert cur["owner_pid"] == run.pid and cur["provisional"] and cur["params_sha256"] is None
        starting = f"another pipeline run \\(dvc pid {run.pid}, starting, before its first stage\\)"
        with pytest.raises(AnotherRunError, match=starting):
            claim_workspace_run(tmp_path, os.getpid())
        claim_run(tmp_path, "spec", "a" * 64, owner=run.pid)  # its first stage
        cur = json.loads(path.read_text())
        assert cur["stage"] == "spec" and cur["params_sha256"] == "a" * 64 and not cur.get("provisional")
        claim_workspace_run(tmp_path, run.pid)  # the run itself: its whole claim stays
        assert json.loads(path.read_text()) == cur
        with pytest.raises(AnotherRunError, match=f"another pipeline run \\(dvc pid {run.pid}, at stage spec\\)"):
            claim_workspace_run(tmp_path, os.getpid())
        # its last stage releases it: the tree stays claimed while DVC saves the experiment, with no params to check
        release_run(tmp_path, owner=run.pid)
        cur = json.loads(path.read_text())
        assert cur["owner_pid"] == run.pid and cur["provisional"] and cur["phase"] == "saving"
        assert run_params(tmp_path, owner=run.pid) is None
        with pytest.raises(AnotherRunError, match=f"dvc pid {run.pid}, saving its experiment"):
            claim_workspace_run(tmp_path, os.getpid())
        claim_run(tmp_path, "spec", "b" * 64, owner=run.pid)  # the same dvc process's next run (a queue worker)
        assert json.loads(path.read_text())["params_sha256"] == "b" * 64
    finally:
        run.kill()
        run.wait()
    me = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        claim_workspace_run(tmp_path, me.pid)  # its owner is gone: taken over
        assert json.loads(path.read_text())["owner_pid"] == me.pid
    finally:
        me.kill()
        me.wait()
    assert not (tmp_path / "params.yaml").exists()  # params.yaml is not touched


_TOY_DVC_GIT_OUTS = """
stages:
  a:
    cmd: python3 stage.py a 0
    deps: [stage.py]
    params: [x]
    outs: [{out_a.txt: {cache: false, persist: true}}]
  b:
    cmd: python3 stage.py b 12
    deps: [stage.py, out_a.txt]
    outs: [{out_b.txt: {cache: false, persist: true}}]
"""


def _installed_env(tmp_path: Path) -> dict[str, str]:
    """The environment of the guard's toy-repo tests: kernelcamp importable as an install makes it (a folder beside
    ``tmp_path`` on PYTHONPATH), without this checkout's hydra_plugins on the path; no DVC_ROOT."""
    site = tmp_path.parent / f"{tmp_path.name}-site"
    site.mkdir()
    (site / "kernelcamp").symlink_to(ROOT / "kernelcamp")
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("DVC_ROOT", None)
    return env


def _assert_first_saved_second_refused(
    sh: Callable[..., Any],
    first: subprocess.Popen,
    out: str,
    second: subprocess.CompletedProcess,
    refusal: str,
    earlier: tuple[str, ...] = (),
) -> str:
    """The toy repo's first run (params ``x: 3``) saved as experiment "first" (the only one besides ``earlier``),
    its out_b.txt and params.yaml committed; the second run refused in one line starting with ``refusal``. Returns
    the first experiment's ref."""
    assert first.returncode == 0, out[-3000:]
    refs = sh("git", "for-each-ref", "--format=%(refname)", "refs/exps").stdout.split()
    saved = [r.rsplit("/", 1)[-1] for r in refs if "/exec/" not in r]
    assert [n for n in saved if n not in earlier] == ["first"], refs
    (ref,) = [r for r in refs if r.endswith("/first")]
    assert sh("git", "show", f"{ref}:out_b.txt").stdout == sh("git", "show", f"{ref}:params.yaml").stdout == "x: 3\n"
    lines = [ln for ln in (second.stdout + second.stderr).splitlines() if ln.strip()]
    assert second.returncode != 0 and len(lines) == 1 and lines[0].startswith(refusal), lines
    return ref


@pytest.mark.slow
def test_a_second_workspace_exp_run_is_refused_before_dvc_touches_the_tree(tmp_path: Path) -> None:
    """Where dvc.lock and the stage outputs are git-tracked but not committed yet (a fresh clone's first runs), a
    second `dvc exp run` during a run deleted them in its setup (a forced checkout of HEAD, then its stash applied,
    which conflicted), before any stage of it ran; the first run failed ("dependency ... does not exist") and saved
    nothing (helper-65, DVC 3.67, in the project). hydra_plugins/kernelcamp_guard refuses it as DVC composes its
    params.yaml, before that setup: one line, and the first run goes on and is saved with its params. This toy did
    not reproduce the loss itself; without the guard its second run gets through that setup to DVC's lock on
    out_a.txt, and this test fails on the refusal's line."""
    env = _installed_env(tmp_path)
    sh = _toy_dvc_repo(tmp_path, env, _TOY_DVC_GIT_OUTS, hydra=True)
    # an earlier experiment leaves its outputs in the workspace, untracked: the second run's stash holds them, and
    # its apply after the forced checkout conflicts with the copies there
    r = sh(sys.executable, "-m", "dvc", "exp", "run", "-n", "zero")
    assert r.returncode == 0, r.stdout + r.stderr
    with _run_at_stage(tmp_path, env, "b", "-S", "x=3", "-n", "first") as first:  # params.yaml not HEAD's
        second = sh(sys.executable, "-m", "dvc", "exp", "run", "-S", "x=2", "-n", "second")
        assert second.returncode != 0
        out, _ = first.communicate(timeout=120)
    _assert_first_saved_second_refused(sh, first, out, second, "ERROR: another pipeline run (dvc pid ", ("zero",))
    assert (tmp_path / "out_a.txt").read_text() == (tmp_path / "out_b.txt").read_text() == "x: 3\n"
    assert (tmp_path / "params.yaml").read_text() == "x: 3\n"


@pytest.mark.slow
def test_a_second_workspace_exp_run_in_a_first_runs_first_seconds_is_refused(tmp_path: Path) -> None:
    """A second `dvc exp run` started after a first one but before the first one's first stage claimed the tree passed
    the guard; DVC's lock refused it at its spec stage, and its teardown deleted EXEC_BASELINE before the first run's
    keeper had read it: the first run ran every stage, then saved no experiment ("'NoneType' object is not
    subscriptable", helper-66, in the project on this CPU). The guard now claims the tree for a run from its start
    (runlock.claim_workspace_run), so the second run is refused there in one line and the first is saved. Here the
    first run's stage a waits 8 s before its claim: that window."""
    env = _installed_env(tmp_path)
    mark = tmp_path.parent / f"{tmp_path.name}-a-started"
    sh = _toy_dvc_repo(
        tmp_path, env, _TOY_DVC_GIT_OUTS.replace("stage.py a 0", f"stage.py a 0 before {mark}"), hydra=True
    )
    with _run_at_stage(tmp_path, env, mark, "-S", "x=3", "-n", "first") as first:  # stage a started, not claimed
        second = sh(sys.executable, "-m", "dvc", "exp", "run", "-S", "x=2", "-n", "second")
        out, _ = first.communicate(timeout=120)
    _assert_first_saved_second_refused(
        sh, first, out, second, f"ERROR: another pipeline run (dvc pid {first.pid}, starting, before its first"
    )


@pytest.mark.slow
def test_a_second_workspace_exp_run_after_the_last_stage_is_refused_until_the_first_is_saved(tmp_path: Path) -> None:
    """The report stage released the run's claim before DVC locked its outputs and saved the experiment, so a second
    `dvc exp run` started in that time passed the guard: its setup deleted the first run's dvc.lock and reports,
    and the first run was saved without report.md and metrics.json, its dvc.lock giving an earlier experiment's
    checksums, while the second one logged an MLflow run for an experiment that was never saved (helper-66). The
    release now leaves the claim as "saving" until the run's dvc process ends (runlock.release_run): the second run
    is refused in one line and the first is saved whole. Here the last stage releases, then waits 6 s. This toy did
    not reproduce the corruption itself: without the change its first run was saved and the second stopped on DVC's
    lock at stage a (four lines), so this test fails on the missing refusal line."""
    env = _installed_env(tmp_path)
    mark = tmp_path.parent / f"{tmp_path.name}-released"
    toy = _TOY_DVC_GIT_OUTS.replace("stage.py b 12", f"stage.py b 0 release {mark}")
    sh = _toy_dvc_repo(tmp_path, env, toy, hydra=True)
    with _run_at_stage(tmp_path, env, mark, "-S", "x=3", "-n", "first") as first:  # its last stage released
        second = sh(sys.executable, "-m", "dvc", "exp", "run", "-S", "x=2", "-n", "second")
        out, _ = first.communicate(timeout=120)
    ref = _assert_first_saved_second_refused(
        sh, first, out, second, f"ERROR: another pipeline run (dvc pid {first.pid}, saving its experiment"
    )
    assert "out_b.txt" in sh("git", "show", f"{ref}:dvc.lock").stdout


def test_the_keeper_puts_the_baseline_ref_back_only_while_a_stage_runs(tmp_path: Path) -> None:
    """kernelcamp.expref.keep: the ref deleted while the owner runs a stage (a child) comes back at the claimed
    commit; deleted while no stage runs, it stays gone; once EXEC_BRANCH is seen (the run committed) the keeper ends.
    A packed ref counts as present."""
    from kernelcamp.expref import EXEC_BASELINE, EXEC_BRANCH, _ref_present

    def git(*a: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(tmp_path), *a], capture_output=True, text=True, check=False)

    git("init", "-q")
    git("-c", "user.email=t@k", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "c")
    rev = git("rev-parse", "HEAD").stdout.strip()
    git("update-ref", EXEC_BASELINE, rev)
    git("pack-refs", "--all")
    assert not (tmp_path / ".git" / EXEC_BASELINE).exists() and _ref_present(tmp_path / ".git", EXEC_BASELINE)
    # the owner: a shell that runs a "stage" (a child) once the file go exists
    wait_then_stage = (
        "import os, subprocess, sys, time\n"
        "while not os.path.exists(sys.argv[1]):\n    time.sleep(0.05)\n"
        "subprocess.run(['sleep', '60'])\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", wait_then_stage, str(tmp_path / "go")])
    keeper = subprocess.Popen(
        [sys.executable, "-m", "kernelcamp.expref", str(tmp_path), rev, str(owner.pid)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        git("update-ref", "-d", EXEC_BASELINE)
        time.sleep(1.5)
        assert git("rev-parse", "-q", "--verify", EXEC_BASELINE).returncode != 0  # no stage runs: left gone
        (tmp_path / "go").touch()
        deadline = time.monotonic() + 10
        while git("rev-parse", "-q", "--verify", EXEC_BASELINE).stdout.strip() != rev:
            assert time.monotonic() < deadline, "the keeper did not put the ref back"
            time.sleep(0.1)
        git("symbolic-ref", EXEC_BRANCH, "refs/exps/aa/bb/first")
        assert keeper.wait(timeout=10) == 0
        git("update-ref", "-d", EXEC_BASELINE)
        time.sleep(0.5)
        assert git("rev-parse", "-q", "--verify", EXEC_BASELINE).returncode != 0
    finally:
        subprocess.run(["pkill", "-P", str(owner.pid)], check=False)  # its "stage"
        for p in (keeper, owner):
            if p.poll() is None:
                p.kill()
                p.wait()

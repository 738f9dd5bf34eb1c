"""``baseline.kernel_rev``: the baseline runs the kernel file of a git commit, the candidate the working tree's.

Parsing in the run spec (good revs resolved to the full sha, bad ones refused with one line and no side
effect), the hashes that tell two revs apart, the loader (a module of its own per commit, the file
content-addressed under ``.kernelcamp/kernel_revs``, importable by the build's compile subprocess), and
the kernel A/B running two different kernel sources, in a temporary git copy of this tree.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from kernelcamp.errors import KernelcampError
from kernelcamp.spec import parse_spec

ROOT = Path(__file__).resolve().parents[1]
PARAMS = yaml.safe_load((ROOT / "params.yaml").read_text())
KFILE = "kernels/sparse_mla_decode.py"
GIT = ["git", "-c", "user.email=t@t", "-c", "user.name=t", "-c", "commit.gpgsign=false"]

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run([*GIT, *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def _commit(cwd: Path, msg: str) -> str:
    _git(cwd, "add", "-A")
    _git(cwd, "commit", "-qm", msg)
    return _git(cwd, "rev-parse", "HEAD")


def _params(**baseline) -> dict:
    """The committed params with the serving A/B off (its baseline server cannot take a kernel rev)."""
    p = copy.deepcopy(PARAMS)
    p["benchmark"]["serving"]["enabled"] = False
    p["baseline"].update(baseline)
    return p


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> dict:
    """A git repo: a commit without the kernel, one with it (tagged), one with it edited, one whose
    kernel imports another module of kernels/; the working tree's kernel edited again, uncommitted."""
    ws = tmp_path_factory.mktemp("kernel_rev") / "ws"
    (ws / "kernels").mkdir(parents=True)
    _git(ws, "init", "-q")
    (ws / "README").write_text("no kernel yet\n")
    shas = {"before": _commit(ws, "no kernel")}
    src = (ROOT / KFILE).read_bytes()
    (ws / KFILE).write_bytes(src)
    shas["first"] = _commit(ws, "kernel")
    _git(ws, "tag", "kernel-v1")
    (ws / KFILE).write_bytes(src + b"\n# second\n")
    shas["second"] = _commit(ws, "kernel edited")
    (ws / KFILE).write_bytes(src + b"\nfrom kernels.common import helper  # noqa\n")
    shas["sibling"] = _commit(ws, "kernel importing a sibling")
    (ws / KFILE).write_bytes(src.replace(b"class SparseMLADecode:", b"class SparseMLADecoder:"))
    shas["renamed"] = _commit(ws, "kernel whose launcher has another name")
    (ws / KFILE).write_bytes(src + b"\n# working tree\n")
    return {"ws": ws, "shas": shas, "blobs": {"first": src, "second": src + b"\n# second\n"}}


@pytest.fixture(autouse=True)
def _workspace_is_the_repo(repo: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    # $DVC_ROOT names the workspace whose .kernelcamp/ holds the cache (and whose git a full sha may come from)
    monkeypatch.setenv("DVC_ROOT", str(repo["ws"]))


def _sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


# ------------------------------------------------------------------------------------------ parsing


@pytest.mark.parametrize("rev_of", ["sha", "short", "tag"])
def test_a_rev_is_resolved_to_the_full_sha_and_the_files_hash(repo: dict, rev_of: str) -> None:
    sha = repo["shas"]["first"]
    rev = {"sha": sha, "short": sha[:9], "tag": "kernel-v1"}[rev_of]
    spec = parse_spec(_params(kernel_rev=rev), root=repo["ws"])
    h = spec.hashes()
    assert spec.baseline.kernel_rev == sha and h["baseline_kernel_rev"] == sha
    assert spec.raw["baseline"]["kernel_rev"] == sha, "records keep the commit, never the name given"
    assert h["baseline_kernel_source_hash"] == _sha256(repo["blobs"]["first"])
    assert h["kernel_source_hash"] == _sha256((repo["ws"] / KFILE).read_bytes()), "the candidate: the working tree's"
    assert h["baseline_kernel_source_hash"] != h["kernel_source_hash"]
    assert not (repo["ws"] / ".kernelcamp").exists(), "parsing writes nothing"


def test_the_baselines_hashes_change_with_the_rev_and_the_candidates_do_not(repo: dict) -> None:
    none = parse_spec(_params(kernel_rev=None), root=repo["ws"]).hashes()
    first = parse_spec(_params(kernel_rev=repo["shas"]["first"]), root=repo["ws"]).hashes()
    second = parse_spec(_params(kernel_rev=repo["shas"]["second"]), root=repo["ws"]).hashes()
    for key in ("baseline_hash", "baseline_config_hash", "baseline_kernel_source_hash", "baseline_kernel_rev"):
        assert len({str(none[key]), str(first[key]), str(second[key])}) == 3, key
    for key in ("variant_hash", "variant_config_hash", "kernel_source_hash"):
        assert none[key] == first[key] == second[key], key
    assert none["baseline_kernel_source_hash"] == none["kernel_source_hash"], "no rev: the working tree's kernel"
    # a null kernel_rev hashes as before the key existed (records of earlier runs stay comparable)
    p = _params()
    del p["baseline"]["kernel_rev"]
    assert parse_spec(p, root=repo["ws"]).hashes()["baseline_hash"] == none["baseline_hash"]


BAD_REVS = [
    # (kernel_rev, what the one line must say)
    ("nope", r"^baseline\.kernel_rev = 'nope': git rev-parse finds no commit of that name in .*full sha$"),
    ("0" * 40, r"^baseline\.kernel_rev = '0{40}': git rev-parse finds no commit"),
    ("before", r"^baseline\.kernel_rev = '[0-9a-f]{40}' \(commit [0-9a-f]{12}\): kernels/sparse_mla_decode\.py does "
     r"not exist at that commit .*git log --oneline -- kernels/sparse_mla_decode\.py`$"),
    ("sibling", r"^baseline\.kernel_rev = '[0-9a-f]{40}' \(commit [0-9a-f]{12}\): kernels/sparse_mla_decode\.py "
     r"there imports kernels\.common, which would come from the working tree"),
    ("renamed", r"^baseline\.kernel_rev = '[0-9a-f]{40}' \(commit [0-9a-f]{12}\): kernels/sparse_mla_decode\.py "
     r"there defines no SparseMLADecode, which build, benchmark and verify call"),
    ("-ofoo", r"^baseline\.kernel_rev = '-ofoo': expected a git commit"),
    ("HEAD HEAD", r"^baseline\.kernel_rev = 'HEAD HEAD': expected a git commit"),
    ("", r"^baseline\.kernel_rev = '': expected a git commit"),
    (1234567, r"^baseline\.kernel_rev = 1234567: expected a git commit as a string"),
]  # fmt: skip


@pytest.mark.parametrize("rev,msg", BAD_REVS, ids=[str(r) for r, _ in BAD_REVS])
def test_bad_revs_are_one_line_naming_the_key(repo: dict, rev, msg: str) -> None:
    rev = repo["shas"].get(rev, rev) if isinstance(rev, str) else rev
    with pytest.raises(KernelcampError) as e:
        parse_spec(_params(kernel_rev=rev), root=repo["ws"])
    assert re.search(msg, str(e.value)), str(e.value)
    assert "\n" not in str(e.value)
    assert not (repo["ws"] / ".kernelcamp").exists(), "a refused rev leaves nothing behind"


def test_kernel_rev_is_baseline_only(repo: dict) -> None:
    p = _params()
    p["variant"]["kernel_rev"] = repo["shas"]["first"]
    with pytest.raises(KernelcampError, match=r"^variant\.kernel_rev = '[0-9a-f]{40}': kernel_rev is baseline-only"):
        parse_spec(p, root=repo["ws"])
    p["variant"]["kernel_rev"] = None  # null is no rev: allowed (the serving A/B hands the baseline over as variant)
    assert parse_spec(p, root=repo["ws"]).variant.kernel_rev is None


def test_a_rev_with_the_serving_ab_measuring_the_baseline_is_refused(repo: dict) -> None:
    """The embedded baseline server loads kernel.module from the working tree: it would serve the wrong kernel."""
    p = _params(kernel_rev=repo["shas"]["first"])
    p["benchmark"]["serving"]["enabled"] = True
    with pytest.raises(KernelcampError) as e:
        parse_spec(p, root=repo["ws"])
    assert re.match(r"baseline\.kernel_rev = '[0-9a-f]{40}' with benchmark\.serving\.enabled: .*", str(e.value))
    assert "-S benchmark.serving.enabled=false" in str(e.value) and "\n" not in str(e.value)
    p["benchmark"]["serving"]["measure_baseline"] = False  # serving the candidate only is fine
    assert parse_spec(p, root=repo["ws"]).baseline_kernel is not None


def test_a_bad_rev_is_named_before_the_serving_check(repo: dict) -> None:
    """A rev that names no commit is the first fault to fix: refused as such even with the serving A/B on
    (it had been refused for the serving A/B first, and only after that fix for the rev itself)."""
    p = _params(kernel_rev="no-such-rev")
    p["benchmark"]["serving"]["enabled"] = True
    with pytest.raises(KernelcampError, match=r"^baseline\.kernel_rev = 'no-such-rev': git rev-parse finds no commit"):
        parse_spec(p, root=repo["ws"])


def test_a_tree_outside_git_is_refused(tmp_path: Path) -> None:
    (tmp_path / "kernels").mkdir()
    shutil.copy(ROOT / KFILE, tmp_path / KFILE)
    with pytest.raises(KernelcampError, match=r"^baseline\.kernel_rev = 'HEAD': .* is not in a git repository"):
        parse_spec(_params(kernel_rev="HEAD"), root=tmp_path)


def test_the_spec_stage_refuses_a_bad_rev_with_exit_2_and_writes_nothing(tmp_path: Path, run_spec_stage) -> None:
    r, out = run_spec_stage(_params(kernel_rev="no-such-rev-anywhere"))
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("error: baseline.kernel_rev = 'no-such-rev-anywhere': "), line
    assert out.read_text() == "previous\n"
    assert not (tmp_path / ".kernelcamp" / "kernel_revs").exists()


# ------------------------------------------------------------------------------------------- loading


def test_the_rev_is_imported_as_a_module_of_its_own(repo: dict, tmp_path: Path) -> None:
    from kernelcamp.kernel_rev import import_kernel_rev
    from kernelcamp.spec import import_kernel

    sha = repo["shas"]["second"]
    m = import_kernel_rev("kernels.sparse_mla_decode", "kernel-v1~0", root=repo["ws"], cache_root=tmp_path)
    first = repo["shas"]["first"]
    assert m.__name__ == f"kcrev_{first}_sparse_mla_decode"
    path = tmp_path / ".kernelcamp" / "kernel_revs" / f"{m.__name__}.py"
    assert Path(m.__file__).resolve() == path.resolve() and path.read_bytes() == repo["blobs"]["first"]
    assert m.kernel_source_hash() == _sha256(repo["blobs"]["first"])
    m2 = import_kernel_rev("kernels.sparse_mla_decode", sha, root=repo["ws"], cache_root=tmp_path)
    assert m2 is not m and m2.kernel_source_hash() == _sha256(repo["blobs"]["second"])
    assert import_kernel_rev("kernels.sparse_mla_decode", first, root=repo["ws"], cache_root=tmp_path) is m
    wt = import_kernel("kernels.sparse_mla_decode")
    # the @triton.jit functions are the module's own (Triton keys its compiles by their source)
    assert m._sparse_mla_split_kernel is not wt._sparse_mla_split_kernel
    assert m.SparseMLADecode is not wt.SparseMLADecode and m2.SparseMLADecode is not m.SparseMLADecode


def test_the_cached_file_is_rewritten_when_its_bytes_differ_and_nothing_else_is_left(
    repo: dict, tmp_path: Path
) -> None:
    from kernelcamp.kernel_rev import materialize, resolve_kernel_rev

    kr = resolve_kernel_rev(repo["shas"]["first"], "kernels.sparse_mla_decode", repo["ws"])
    path = materialize(kr, tmp_path)
    assert path.read_bytes() == repo["blobs"]["first"]
    path.write_bytes(b"half a file")  # e.g. an older kernelcamp's crash
    assert materialize(kr, tmp_path) == path and path.read_bytes() == repo["blobs"]["first"]
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name], "no temporary file left behind"


def test_the_builds_compile_subprocess_can_import_the_revs_kernel(repo: dict, tmp_path: Path) -> None:
    """The build compiles in a child process that imports each kernel by module name and qualified name
    (kernelcamp.inspect.compile); under TRITON_INTERPRET the cache keys are computed in such a child too."""
    from types import SimpleNamespace

    from kernelcamp.inspect.compile import compile_keys
    from kernelcamp.kernel_rev import import_kernel_rev

    m = import_kernel_rev("kernels.sparse_mla_decode", repo["shas"]["second"], root=repo["ws"], cache_root=tmp_path)
    fn = m._sparse_mla_combine_kernel
    assert fn.fn.__module__ == m.__name__, "the @jit function is the rev module's own"
    # a kernel the child cannot import fails the whole child (KernelcampError)
    spec = SimpleNamespace(name="combine", fn=fn, signature={}, constexprs={}, num_warps=4, num_stages=1)
    (key,) = compile_keys([(spec, 90)])
    assert re.fullmatch(r"[0-9a-f]{64}", key)


# ------------------------------------------------------------------------------- the kernel A/B itself

COUNTER = """
SOURCE = {source!r}
CALLS = []
_kc_call = SparseMLADecode.__call__


def _kc_counted(self, *args, **kwargs):
    CALLS.append(1)
    return _kc_call(self, *args, **kwargs)


SparseMLADecode.__call__ = _kc_counted
"""


def test_the_kernel_ab_runs_the_commits_kernel_against_the_working_trees(tmp_path: Path) -> None:
    """A temporary git copy of this tree: the kernel committed with a launch counter marked "committed",
    then edited in the working tree (marked "working"). The benchmark's kernel rounds (interpreter, tiny
    shape) must launch each side's own kernel and record each file's hash, the baseline's at the rev."""
    ws = tmp_path / "ws"
    for d in ("kernelcamp", "kernels", "stages", "conf"):
        shutil.copytree(ROOT / d, ws / d, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "dvc.yaml", ws / "dvc.yaml")  # each stage records the params it reruns for
    shutil.copy(ROOT / "params.yaml", ws / "params.yaml")
    kfile = ws / KFILE
    src = kfile.read_text()
    kfile.write_text(src + COUNTER.format(source="committed"))
    _git(ws, "init", "-q")
    sha = _commit(ws, "the baseline's kernel")
    committed = kfile.read_bytes()
    kfile.write_text(src + COUNTER.format(source="working"))
    code = textwrap.dedent(
        """
        import json, sys, yaml
        sys.path.insert(0, sys.argv[1])
        from kernelcamp.bench.kernel import kernel_level
        from kernelcamp.bench.record import check_kernels_ran, kernel_notes, variants_to_run
        from kernelcamp.spec import parse_spec
        p = yaml.safe_load(open("params.yaml"))
        p["baseline"]["kernel_rev"] = "HEAD"
        p["benchmark"]["serving"]["enabled"] = False
        p["benchmark"]["kernel"]["cpu_rounds"] = 2
        p["workload"]["cpu"].update(batch_sizes=[1], topk=32, num_cache_tokens=128)
        spec = parse_spec(p)
        variants, notes = variants_to_run(spec, {}, "cpu")
        for impl, k in kernel_notes(spec).items():
            notes[impl].update(k)
        rows, kernel = kernel_level(spec.raw, variants, "cpu", log=lambda m: None)
        check_kernels_ran(kernel, notes)
        ran = {n: sys.modules[k["module"]] for n, k in kernel["kernels"].items()}
        print(json.dumps({
            "kernels": kernel["kernels"], "notes": notes, "hashes": spec.hashes(),
            "source": {n: m.SOURCE for n, m in ran.items()}, "calls": {n: len(m.CALLS) for n, m in ran.items()},
            "splits": {n: [kernel["batch"]["1"][n][k] for k in ("config_ran", "num_splits_ran", "num_sms")]
                       for n in ("baseline", "candidate")},
            "configs": {n: [c.num_splits for c in v.configs] for n, v in (("baseline", spec.baseline),
                        ("candidate", spec.variant))},
        }))
        """
    )
    env = {**os.environ, "TRITON_INTERPRET": "1", "DVC_ROOT": str(ws)}
    r = subprocess.run(
        [sys.executable, "-c", code, str(ws)], cwd=ws, env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    base, cand = got["kernels"]["baseline"], got["kernels"]["candidate"]
    assert base["kernel_rev"] == sha and base["module"] == f"kcrev_{sha}_sparse_mla_decode"
    assert base["source_hash"] == _sha256(committed) == got["hashes"]["baseline_kernel_source_hash"]
    assert cand["kernel_rev"] is None and cand["module"] == "kernels.sparse_mla_decode"
    assert cand["source_hash"] == _sha256(kfile.read_bytes()) == got["hashes"]["kernel_source_hash"]
    assert got["source"] == {"baseline": "committed", "candidate": "working"}
    assert got["calls"]["baseline"] > 0 and got["calls"]["candidate"] > 0, "each side launched its own kernel"
    assert got["notes"]["baseline"]["kernel_rev"] == sha and got["notes"]["candidate"]["kernel_rev"] is None
    assert got["notes"]["baseline"]["kernel_source_hash"] == base["source_hash"]
    assert (ws / ".kernelcamp" / "kernel_revs" / f"{base['module']}.py").read_bytes() == committed
    # split-K as launched ("auto" resolved with the launcher's SM count: the default 132 on a CPU), recorded per
    # batch size beside the config's label, which says only "kauto" (helper audit R7)
    from kernels.sparse_mla_decode import DEFAULT_NUM_SMS, resolve_num_splits

    heads = yaml.safe_load((ROOT / "params.yaml").read_text())["workload"]["cpu"]["num_heads"]
    for n, (label, splits, sms) in got["splits"].items():
        assert label and sms == DEFAULT_NUM_SMS, got["splits"]
        ns = got["configs"][n][0]
        bt, bh = (int(x[1:]) for x in label.split("_")[:2])  # T<BLOCK_T>_H<BLOCK_H>_...
        assert splits == resolve_num_splits(ns, 1, heads, 32, bh, bt), (n, label, splits)


def test_a_kernel_that_ran_another_source_than_the_params_say_is_not_recorded() -> None:
    from kernelcamp.bench.record import check_kernels_ran

    notes = {"baseline": {"kernel_source_hash": "a" * 64}, "candidate": {"kernel_source_hash": "b" * 64}}
    check_kernels_ran(
        {"kernels": {"baseline": {"source_hash": "a" * 64}, "candidate": {"source_hash": "b" * 64}}}, notes
    )
    with pytest.raises(KernelcampError, match="the baseline's kernel rounds ran kernel source " + "c" * 64):
        check_kernels_ran({"kernels": {"baseline": {"source_hash": "c" * 64, "module": "m"}}}, notes)


@pytest.mark.slow  # compiles for sm90 in a subprocess (> 9 s on 2 cores): `make test-slow`
def test_the_build_compiles_the_baselines_kernel_at_the_rev(tmp_path: Path) -> None:
    """stages/build.py in a temporary git copy: the baseline's kernel module is the rev's file, and
    build.json records its rev and source hash beside the candidate's (the working tree's)."""
    ws = tmp_path / "ws"
    for d in ("kernelcamp", "kernels", "stages", "conf"):
        shutil.copytree(ROOT / d, ws / d, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "dvc.yaml", ws / "dvc.yaml")  # each stage records the params it reruns for
    kfile = ws / KFILE
    _git(ws, "init", "-q")
    sha = _commit(ws, "the baseline's kernel")
    committed = kfile.read_bytes()
    kfile.write_bytes(committed + b"\n# working tree\n")
    params = _params()
    params["variant"] = yaml.safe_load((ROOT / "conf/variant/bt16_w4.yaml").read_text())
    params["baseline"] = {**params["variant"], "kernel_rev": sha[:10]}  # only the kernel code differs
    params["build"] = {"also_targets": []}
    (ws / "params.yaml").write_text(yaml.safe_dump(params))
    env = {**os.environ, "DVC_ROOT": str(ws), "KERNELCAMP_CACHE_DIR": str(tmp_path / "inspect")}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run(
        [sys.executable, "-m", "stages.build", "--out", "reports/build.json", "--metrics", "reports/m.json"],
        cwd=ws,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads((ws / "reports" / "build.json").read_text())
    assert rep["baseline_kernel_rev"] == sha and rep["baseline_kernel_source_hash"] == _sha256(committed)
    assert rep["kernel_source_hash"] == _sha256(kfile.read_bytes()) != rep["baseline_kernel_source_hash"]
    roles = rep["roles"]
    assert (roles["baseline"]["kernel_rev"], roles["baseline"]["kernel_source_hash"]) == (sha, _sha256(committed))
    assert (roles["variant"]["kernel_rev"], roles["variant"]["kernel_source_hash"]) == (None, rep["kernel_source_hash"])
    assert roles["baseline"]["kernel_module"] == f"kcrev_{sha}_sparse_mla_decode", "compiled from the rev's file"
    assert {row["role"] for row in rep["rows"] if row["fits"] and not row["error"]} == {"variant", "baseline"}


def test_every_baseline_file_takes_the_override_and_no_variant_does() -> None:
    """`dvc exp run -S baseline.kernel_rev=<sha>`: Hydra refuses a key the composed section lacks, so the
    default (null) lives in conf/config.yaml, under every baseline file."""
    from kernelcamp.compose import compose_text

    for f in sorted((ROOT / "conf" / "baseline").glob("*.yaml")):
        raw = yaml.safe_load(compose_text(ROOT, [f"baseline={f.stem}", "baseline.kernel_rev=abc123"]))
        assert raw["baseline"]["kernel_rev"] == "abc123", f.name
    assert yaml.safe_load(compose_text(ROOT, []))["baseline"]["kernel_rev"] is None
    with pytest.raises(KernelcampError, match="variant.kernel_rev"):
        compose_text(ROOT, ["variant.kernel_rev=abc123"])


def test_the_report_names_each_sides_kernel_rev_and_source_hash() -> None:
    import kernelcamp.report as kr

    fix = ROOT / "tests" / "fixtures" / "report"
    data = {n: json.loads((fix / f"{n}.json").read_text()) for n in ("build", "deploy", "benchmark", "verify")}
    sha, base, cand = "a" * 40, "b" * 64, "c" * 64
    bench = data["benchmark"]
    bench["variants"]["baseline"].update(kernel_rev=sha, kernel_source_hash=base)
    bench["variants"]["candidate"].update(kernel_rev=None, kernel_source_hash=cand)
    bench.update(baseline_kernel_rev=sha, baseline_kernel_source_hash=base, kernel_source_hash=cand)
    md = kr.render_markdown(data, {}, 0.02)
    assert md.splitlines()[0].endswith(f"vs story_autotune [3 configs] @ kernel {sha[:12]}")
    lines = {ln.split("`")[1]: ln for ln in md.splitlines() if ln.startswith(("- baseline `", "- candidate `"))}
    assert lines["story_autotune"].endswith(f"; kernel at commit {sha} (source sha256 {base[:16]})")
    assert lines["bt16_w8"].endswith(f"; the working tree's kernel (source sha256 {cand[:16]})")
    assert f"| baseline kernel rev (null: the working tree's file) | {sha} |" in md
    assert f"| baseline kernel source hash | {base} |" in md
    assert f"| kernel source hash (candidate: the working tree's file) | {cand} |" in md


def test_a_name_in_a_queued_experiments_copy_says_to_queue_the_full_sha(repo: dict, tmp_path: Path) -> None:
    # DVC runs a queued experiment in a copy of the repo without the workspace's branches and tags
    copy = tmp_path / "copy"
    (copy / "kernels").mkdir(parents=True)
    _git(copy, "init", "-q")
    (copy / KFILE).write_bytes((repo["ws"] / KFILE).read_bytes())
    _commit(copy, "the experiment's commit")
    with pytest.raises(KernelcampError) as e:
        parse_spec(_params(kernel_rev="kernel-v1"), root=copy)  # a tag of the workspace ($DVC_ROOT)
    msg = str(e.value)
    assert "queued experiment" in msg and "git rev-parse kernel-v1" in msg and "\n" not in msg, msg
    # its full sha is found in the workspace
    spec = parse_spec(_params(kernel_rev=repo["shas"]["first"]), root=copy)
    assert spec.baseline.kernel_rev == repo["shas"]["first"]

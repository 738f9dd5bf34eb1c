"""``git_dirty``: what a record says about whether the run's source was the commit's."""

from __future__ import annotations

import subprocess
from pathlib import Path

from kernelcamp.provenance import git_info, pipeline_outputs

DVC_YAML = """
stages:
  bench:
    cmd: python bench.py
    outs:
      - reports/bench.json:
          persist: true
      - reports/plots
    metrics:
      - reports/metrics.json:
          cache: false
"""


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "ws"
    (repo / "src").mkdir(parents=True)
    (repo / "dvc.yaml").write_text(DVC_YAML)
    (repo / "params.yaml").write_text("a: 1\n")
    (repo / "src" / "kernel.py").write_text("x = 1\n")
    _git(repo, "init", "-q")
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "add", "-A")
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "c")
    return repo


def test_pipeline_outputs_are_read_from_dvc_yaml(tmp_path: Path) -> None:
    assert pipeline_outputs(_repo(tmp_path)) == {"reports/bench.json", "reports/plots", "reports/metrics.json"}
    assert pipeline_outputs(tmp_path / "nowhere") == set()


def test_a_runs_own_staged_outputs_are_not_dirty(tmp_path: Path) -> None:
    """``dvc exp run`` stages dvc.lock and the outputs it writes (`A  dvc.lock`, `A  reports/...`) while the
    pipeline runs: every run in a fresh clone was recorded git_dirty true."""
    repo = _repo(tmp_path)
    assert git_info(repo) == {"git_commit": git_info(repo)["git_commit"], "git_dirty": False}
    (repo / "reports" / "plots").mkdir(parents=True)
    for name in ("dvc.lock", "reports/bench.json", "reports/metrics.json", "reports/plots/a.png"):
        (repo / name).write_text("out\n")
    (repo / "params.yaml").write_text("a: 2\n")  # composed by -S: recorded in full as params
    _git(repo, "add", "-A")
    assert git_info(repo)["git_dirty"] is False


def test_a_changed_or_staged_source_is_dirty(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    (repo / "src" / "kernel.py").write_text("x = 2\n")
    assert git_info(repo)["git_dirty"] is True
    _git(repo, "checkout", "--", "src/kernel.py")
    (repo / "src" / "new.py").write_text("y = 1\n")
    assert git_info(repo)["git_dirty"] is False  # untracked: not part of any record
    _git(repo, "add", "src/new.py")
    assert git_info(repo)["git_dirty"] is True


def test_an_untracked_file_a_stage_depends_on_is_dirty(tmp_path: Path) -> None:
    """A new kernel file in kernels/ that a run imported but nobody committed: git_dirty said false, though the code
    that ran is in no commit (helper audit R2). An untracked file under a stage's deps now counts; one elsewhere and
    a stage's outputs do not."""
    repo = _repo(tmp_path)
    (repo / "dvc.yaml").write_text(
        DVC_YAML.replace("    cmd: python bench.py\n", "    cmd: python bench.py\n    deps: [src]\n")
    )
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam", "deps")
    (repo / "notes.txt").write_text("not a dependency\n")
    (repo / "reports").mkdir()
    (repo / "reports" / "bench.json").write_text("{}\n")
    assert git_info(repo)["git_dirty"] is False
    (repo / "src" / "new_kernel.py").write_text("y = 1\n")
    assert git_info(repo)["git_dirty"] is True
    (repo / ".gitignore").write_text("__pycache__/\n")
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "add", ".gitignore")
    (repo / "src" / "new_kernel.py").unlink()
    (repo / "src" / "__pycache__").mkdir()
    (repo / "src" / "__pycache__" / "kernel.pyc").write_bytes(b"x")
    assert git_info(repo)["git_dirty"] is True  # .gitignore is staged: a tracked change
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "ignore")
    assert git_info(repo)["git_dirty"] is False  # ignored files never count

"""kernelcamp.campaign: copies of finished experiments are taken from their commits."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kernelcamp import campaign
from kernelcamp.errors import KernelcampError


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.email=t@t", "-c", "user.name=t", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def _exp(repo: Path, base: str, name: str, decision: str) -> None:
    """An experiment commit on ``base`` under DVC 3's ref layout, holding its params, lock and reports."""
    _git(repo, "checkout", "-q", "--detach", base)
    (repo / "params.yaml").write_text(f"experiment: {name}\n")
    (repo / "dvc.lock").write_text(f"schema: '2.0'\n# {name}\n")
    (repo / "reports" / "plots").mkdir(parents=True, exist_ok=True)
    (repo / "reports" / "report.md").write_text(f"# {name}: {decision}\n")
    (repo / "reports" / "benchmark_metrics.json").write_text('{"ratio": 1.8}\n')
    (repo / "reports" / "plots" / "kernel_latency.png").write_bytes(b"\x89PNG")
    (repo / "reports" / "trace.json.gz").write_bytes(b"\x1f\x8b")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", f"dvc: commit experiment {name}")
    sha = _git(repo, "rev-parse", "HEAD")
    _git(repo, "update-ref", f"refs/exps/{base[:2]}/{base[2:]}/{name}", sha)
    _git(repo, "checkout", "-q", "main")


def test_collected_copies_survive_each_other_and_leave_the_workspace_alone(tmp_path: Path) -> None:
    # The campaign script took each copy from the workspace after `dvc exp apply`; an apply reverts
    # the workspace's tracked files, so on the H200 the copies of warp_occupancy, its sm120 run and
    # aa, made earlier in the loop, came back as the committed old ones.
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    dest = repo / "reports" / "campaigns" / "c"
    (dest / "a").mkdir(parents=True)
    (dest / "a" / "report.md").write_text("old a\n")
    (repo / "params.yaml").write_text("experiment: null\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    base = _git(repo, "rev-parse", "HEAD")
    _exp(repo, base, "a-1", "slower")
    _exp(repo, base, "b-1", "inconclusive")
    copied = campaign.collect(repo, "a-1", dest / "a")
    campaign.collect(repo, "b-1", dest / "b")
    assert (dest / "a" / "report.md").read_text() == "# a-1: slower\n", "the first copy must not be reverted"
    assert (dest / "b" / "report.md").read_text() == "# b-1: inconclusive\n"
    assert copied == ["benchmark_metrics.json", "dvc.lock", "params.yaml", "plots/kernel_latency.png", "report.md"]
    assert (repo / "params.yaml").read_text() == "experiment: null\n", "the workspace must stay as it was"
    assert not list(dest.parent.glob(".*")), "no temporary folder may be left beside the copies"


def test_unknown_experiment_is_one_clear_error(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    with pytest.raises(KernelcampError, match="no DVC experiment named 'nope'"):
        campaign.collect(repo, "nope", tmp_path / "out")
    assert not (tmp_path / "out").exists()

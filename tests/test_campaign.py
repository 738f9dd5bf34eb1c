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


def _repo_with(tmp_path: Path, names: list[str], bases: int = 1) -> tuple[Path, list[str]]:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    out = []
    for i in range(bases):
        (repo / "params.yaml").write_text(f"experiment: null\nbase: {i}\n")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-qm", f"base {i}")
        base = _git(repo, "rev-parse", "HEAD")
        for n in names:
            _exp(repo, base, n, f"decision {i}")
        out.append(base)
    return repo, out


def test_a_destination_holding_the_repo_or_a_file_is_refused(tmp_path: Path, monkeypatch) -> None:
    """`collect EXP .` raised a traceback (an empty name) for `/` and would have moved the current folder aside;
    a file was replaced and `.afile.old` left beside it."""
    repo, _ = _repo_with(tmp_path, ["a-1"])
    monkeypatch.chdir(repo)
    for dest in (".", "/", str(repo), "reports/.."):
        with pytest.raises(KernelcampError, match="holds this folder or the repo"):
            campaign.collect(repo, "a-1", Path(dest))
    (tmp_path / "afile").write_text("hi\n")
    with pytest.raises(KernelcampError, match="is a file"):
        campaign.collect(repo, "a-1", tmp_path / "afile")
    assert (tmp_path / "afile").read_text() == "hi\n" and not list(tmp_path.glob(".afile*"))
    assert (repo / "params.yaml").exists()


def test_an_experiment_name_is_literal_and_a_full_ref_picks_one_of_several(tmp_path: Path) -> None:
    """`collect 'r?'` collected r2 (the name was a glob); a name reused on two baselines could not be collected,
    though the message said to name the ref."""
    repo, bases = _repo_with(tmp_path, ["r2"], bases=2)
    for pattern in ("r?", "[r]2", "*"):
        with pytest.raises(KernelcampError, match="no wildcards"):
            campaign.collect(repo, pattern, tmp_path / "out")
    with pytest.raises(KernelcampError, match="2 experiments are named 'r2'"):
        campaign.collect(repo, "r2", tmp_path / "out")
    ref = f"refs/exps/{bases[0][:2]}/{bases[0][2:]}/r2"
    campaign.collect(repo, ref, tmp_path / "out")
    assert (tmp_path / "out" / "report.md").read_text() == "# r2: decision 0\n"
    with pytest.raises(KernelcampError, match="no DVC experiment ref"):
        campaign.collect(repo, ref + "x", tmp_path / "out2")


def test_a_destination_holding_other_files_is_refused_and_kept(tmp_path: Path) -> None:
    """`collect EXP reports/campaigns` (a slip for reports/campaigns/<name>) deleted every campaign's records, exit
    0, and left the folder at mode 0700. A folder holding anything a collect does not write is now refused, whole;
    an earlier copy is replaced, with a folder's usual mode."""
    import stat

    repo, _ = _repo_with(tmp_path, ["a-1"])
    campaigns = repo / "reports" / "campaigns"
    (campaigns / "kernel_speed").mkdir(parents=True)
    (campaigns / "kernel_speed" / "report.md").write_text("keep\n")
    notes = tmp_path / "scratch"
    notes.mkdir()
    (notes / "notes.txt").write_text("keep\n")
    for dest, foreign in ((campaigns, "kernel_speed/"), (notes, "notes.txt")):
        with pytest.raises(KernelcampError, match=f"holds '{foreign}', which no collect writes"):
            campaign.collect(repo, "a-1", dest)
    assert (campaigns / "kernel_speed" / "report.md").read_text() == "keep\n" and (notes / "notes.txt").exists()
    copy = campaigns / "a"
    campaign.collect(repo, "a-1", copy)
    campaign.collect(repo, "a-1", copy)  # a copy of its own is replaced
    assert (copy / "report.md").read_text() == "# a-1: decision 0\n"
    assert stat.S_IMODE(copy.stat().st_mode) & 0o055 == 0o055, oct(copy.stat().st_mode)

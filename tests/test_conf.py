"""conf/: every config file and experiment composes, variants parse, params.yaml is up to date."""

from pathlib import Path

import pytest
import yaml

from kernelcamp.compose import compose_text
from kernelcamp.errors import KernelcampError
from kernelcamp.variant import parse_variant

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name not in ("local", "experiment"))
OPTIONS = [(g, p.stem) for g in GROUPS for p in sorted((CONF / g).glob("*.yaml"))]
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
REQUIRED = ["variant", "baseline", "target", "workload", "server", "deploy", "benchmark", "verify", "tracking"]


def _compose(*overrides):
    return yaml.safe_load(compose_text(ROOT, list(overrides)))


def test_committed_params_yaml_is_the_composition_of_conf():
    committed = (ROOT / "params.yaml").read_text(encoding="utf-8")
    assert committed == compose_text(ROOT, []), "params.yaml is stale: run `make params` and commit it"


def test_groups_named_as_design_says():
    for g in REQUIRED + ["kernel", "experiment"]:
        assert (CONF / g).is_dir(), g


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_config_file_composes(group, option):
    params = _compose(f"{group}={option}")
    for section in REQUIRED:
        assert section in params, section
    if group in ("variant", "baseline"):
        v = parse_variant(params[group], group)
        assert v.name == option, "a variant's name is its conf file name (DESIGN.md)"
    if group == "deploy":
        assert params["deploy"]["kind"] == option  # ??? values stay missing until the user sets them
    if group == "target" and option != "auto":
        assert params["target"]["name"] == option


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_composes(name):
    params = _compose(f"experiment={name}")
    parse_variant(params["variant"], "variant")
    parse_variant(params["baseline"], "baseline")


def test_experiment_files_are_global_packages_with_a_command():
    for name in EXPERIMENTS:
        text = (CONF / "experiment" / f"{name}.yaml").read_text()
        assert text.startswith("# @package _global_"), name
        assert f"dvc exp run -S experiment={name}" in text, f"{name}: header comment must give the command"


def test_default_variants_parse_and_override_like_a_user_expects():
    params = _compose("variant.num_warps=4")
    assert parse_variant(params["variant"]).configs[0].num_warps == 4
    assert params["benchmark"]["kernel"]["batch_sizes"] == params["workload"]["batch_sizes"]


def test_misspelled_key_is_rejected():
    with pytest.raises(KernelcampError, match="num_wraps"):
        compose_text(ROOT, ["variant.num_wraps=8"])


def test_unknown_variant_name_is_rejected():
    with pytest.raises(KernelcampError, match="no_such_variant"):
        compose_text(ROOT, ["variant=no_such_variant"])


@pytest.mark.parametrize(
    "argv,needle",
    [
        # OmegaConf's TypeError ("list indices must be integers or slices, not str") ended in a traceback
        (["variant=story_autotune", "~variant.configs.0"], "TypeError: list indices must be integers"),
        (["-o", "reports"], "is a folder"),  # IsADirectoryError traceback
        (["-o", "no/such/folder/p.yaml"], "which does not exist"),  # created the folders
        (["-o", "fifo"], "is not a regular file"),  # `-o /dev/null` replaced the device with a regular file
        (["-o", "link"], "is a symbolic link"),  # the link became a regular file, its target untouched
    ],
)
def test_compose_bad_input_is_one_line_and_writes_nothing(argv, needle, capsys, tmp_path):
    from kernelcamp import cli

    before = sorted(p.name for p in ROOT.iterdir())
    import os

    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "target.yaml").write_text("x: 1\n")
    (tmp_path / "link").symlink_to(tmp_path / "target.yaml")
    args = [a if a != "reports" else str(tmp_path) for a in argv]
    if "-o" in argv and argv[1].startswith("no/"):
        args[1] = str(tmp_path / "no" / "such" / "folder" / "p.yaml")
    if argv[-1] in ("fifo", "link"):
        args[1] = str(tmp_path / argv[-1])
    params = (ROOT / "params.yaml").read_bytes()
    assert cli.main(["compose", *args, "--root", str(ROOT)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and needle in err[0], err
    assert (ROOT / "params.yaml").read_bytes() == params and sorted(p.name for p in ROOT.iterdir()) == before
    assert not (tmp_path / "no").exists()
    assert (tmp_path / "fifo").is_fifo() and (tmp_path / "link").is_symlink()
    assert (tmp_path / "target.yaml").read_text() == "x: 1\n"


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["compose", "--root", "@file"], "--root @file is not a folder"),  # NotADirectoryError traceback
        (["compose", "--root", "@missing"], "--root @missing is not a folder"),  # blamed .dvc/config's Hydra setting
        (["compose", "--root", "@empty"], "holds no .dvc/"),
        (["inspect", "--variant", "v" * 300], "File name too long"),  # OSError traceback (ENAMETOOLONG)
        (["campaign", "collect", "--repo", "@file", "exp", "@empty/out"], "@file: Not a directory"),
    ],
)
def test_paths_the_system_refuses_are_one_line(argv, needle, capsys, tmp_path):
    """Paths given on the command line that the file system refuses (a file for a folder, a name over 255 bytes)
    ended in tracebacks (helper audit): every command now says which path, in one line, exit 2."""
    from kernelcamp import cli

    (tmp_path / "file").write_text("x\n")
    (tmp_path / "empty").mkdir()
    sub = {"@file": tmp_path / "file", "@missing": tmp_path / "missing", "@empty": tmp_path / "empty"}

    def fill(a: str) -> str:
        for k, v in sub.items():
            a = a.replace(k, str(v))
        return a

    assert cli.main([fill(a) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and fill(needle) in err[0], err
    assert len(err[0]) < 400, err  # a long path is shortened


def test_a_command_started_with_stdout_closed_ends_without_a_traceback():
    """`kernelcamp compose --check >&-`: Python's sys.stdout is None, and the console script's final flush raised
    AttributeError (helper audit: loadgen with stdout closed)."""
    import os
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "kernelcamp.cli", "compose", "--root", str(ROOT), "--check"],
        stderr=subprocess.PIPE, text=True, timeout=120, preexec_fn=lambda: os.close(1),
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr


def test_an_unknown_option_points_to_the_commands_help(capsys):
    """`kernelcamp inspect --bogus` pointed to `kernelcamp --help`, which does not list inspect's options."""
    from kernelcamp import cli

    with pytest.raises(SystemExit) as e:
        cli.main(["inspect", "--bogus"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: unrecognized arguments: --bogus (see `kernelcamp inspect --help`)"], err


def test_a_program_not_installed_is_not_blamed_on_the_paths(capsys, monkeypatch):
    """A command that runs git or dvc where it is not installed: FileNotFoundError names the program, and the line
    said "check the paths given" (helper-52)."""
    from kernelcamp import cli, compose

    def no_git(args):
        raise FileNotFoundError(2, "No such file or directory", "git")

    monkeypatch.setattr(compose, "main", no_git)
    assert cli.main(["compose"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: git: No such file or directory; a path given, or a program not installed"], err

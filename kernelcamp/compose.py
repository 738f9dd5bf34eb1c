"""Compose conf/ into params.yaml exactly as ``dvc exp run`` does.

DVC 3.67 (``dvc/repo/experiments/queue/base.py: _update_params``) composes with
``dvc.utils.hydra.compose_and_dump(path, config_dir, config_module, config_name, plugins_path,
overrides)``, taking the arguments from the ``[hydra]`` section of ``.dvc/config`` (config_dir
defaults to ``conf`` and config_name to ``config``, both relative to the repo root). This module
calls that same function with the same arguments, so ``make params`` and ``dvc exp run`` can never
disagree. ``dvc repro`` does not recompose (DESIGN.md, known traps): run ``make params`` after
editing conf/ and commit params.yaml.

    kernelcamp compose                      # rewrite params.yaml from conf/'s defaults
    kernelcamp compose --check              # exit 1 when params.yaml differs
    kernelcamp compose -o /tmp/p.yaml variant=bt16_w4 variant.num_warps=8
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from kernelcamp.errors import KernelcampError


def hydra_settings(root: str | os.PathLike) -> dict[str, str | None]:
    """The ``[hydra]`` settings DVC uses for the repo at ``root`` (absolute paths, DVC's defaults).

    Raises ``KernelcampError`` when Hydra composition is not enabled in ``.dvc/config``.
    """
    from dvc.config import Config

    root = Path(root).resolve()
    cfg = Config(dvc_dir=str(root / ".dvc"), validate=True).get("hydra", {})
    if not cfg.get("enabled", False):
        raise KernelcampError(f"{root}/.dvc/config does not enable Hydra: run `dvc config hydra.enabled true`")
    module = cfg.get("config_module")
    return {
        "config_dir": None if module else str(root / cfg.get("config_dir", "conf")),
        "config_module": module,
        "config_name": cfg.get("config_name", "config"),
        "plugins_path": str(root / cfg.get("plugins_path", "")),
    }


def compose_text(root: str | os.PathLike = ".", overrides: list[str] | None = None) -> str:
    """params.yaml text that ``dvc exp run -S <overrides>`` would write for the repo at ``root``.

    Raises ``KernelcampError`` with Hydra's message when composition fails (unknown group option,
    misspelled key, an override OmegaConf cannot apply such as deleting a list item, ...).
    """
    from dvc.utils.hydra import compose_and_dump
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    s = hydra_settings(root)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "params.yaml"
        GlobalHydra.instance().clear()
        try:
            compose_and_dump(
                out, s["config_dir"], s["config_module"], s["config_name"], s["plugins_path"], list(overrides or [])
            )
        except (HydraException, OmegaConfBaseException) as e:
            msg = " ".join(str(e).split())
            raise KernelcampError(f"cannot compose conf/ with {list(overrides or [])}: {msg}") from e
        except (TypeError, ValueError, KeyError, IndexError) as e:
            # what OmegaConf raises for an override it cannot apply, e.g. `~variant.configs.0` (a list item:
            # "list indices must be integers or slices, not str")
            msg = " ".join(str(e).split())
            raise KernelcampError(
                f"cannot compose conf/ with {list(overrides or [])}: {type(e).__name__}: {msg} (`~` and `+` take keys "
                "of a mapping; to change a list, give the whole list, e.g. -S 'variant.configs=[...]')"
            ) from e
        finally:
            GlobalHydra.instance().clear()
        return out.read_text(encoding="utf-8")


def build_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``compose`` to ``sub`` (the subparsers of :func:`kernelcamp.cli.build_parser`)."""
    ap = sub.add_parser("compose", description=__doc__.split("\n\n")[0])
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, as `dvc exp run -S` takes them")
    ap.add_argument("--root", default=".", help="repo root (holds .dvc/config)")
    ap.add_argument("-o", "--out", default="params.yaml", help="output path, relative to --root")
    ap.add_argument("--check", action="store_true", help="do not write; exit 1 when the file differs")
    ap.set_defaults(main=main)
    return ap


def main(args: argparse.Namespace) -> int:
    """``kernelcamp compose``: see the module docstring."""
    root = Path(args.root)
    if not root.is_dir() or not (root / ".dvc").is_dir():
        what = "is not a folder" if not root.is_dir() else "holds no .dvc/ (not a DVC repo)"
        print(f"error: --root {args.root} {what}: give the repo root, which holds .dvc/config", file=sys.stderr)
        return 2
    try:
        text = compose_text(args.root, args.overrides)
    except KernelcampError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    path = root / args.out
    if args.check:
        if not path.is_file():
            print(
                f"error: {path} does not exist: run `make params` (or `kernelcamp compose`) to write it",
                file=sys.stderr,
            )
            return 1
        if path.read_text(encoding="utf-8") != text:
            print(
                f"error: {path} differs from the composition of conf/: run `make params` and commit it", file=sys.stderr
            )
            return 1
        print(f"{path} matches conf/")
        return 0
    from kernelcamp.io import write_text_atomic
    from kernelcamp.runlock import refuse_during_run

    if path.resolve() == (root / "params.yaml").resolve():
        try:  # the run's later stages would read these params and stop, or a failure record them
            refuse_during_run(root.resolve(), f"not writing {path}")
        except KernelcampError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2

    # the file is replaced by a rename: write_text_atomic refuses a folder, device, FIFO or socket; a symlink
    # given here would be replaced (not written through), and a missing folder would be created
    what = None
    if path.is_symlink():
        what = "is a symbolic link (give the file it points to)"
    elif not path.parent.is_dir():
        what = f"is in {path.parent}, which does not exist"
    if what:
        print(f"error: -o {args.out}: {path} {what}; give a file path in an existing folder", file=sys.stderr)
        return 2
    try:
        write_text_atomic(path, text)
    except KernelcampError as e:  # a folder, a device, a FIFO or a socket at the path
        print(f"error: -o {args.out}: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: cannot write {path}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(f"wrote {path} from conf/ ({len(args.overrides)} override(s))")
    return 0


if __name__ == "__main__":  # `python -m kernelcamp.compose ...` is `kernelcamp compose ...`
    from kernelcamp.cli import main as _cli_main

    sys.exit(_cli_main(["compose", *sys.argv[1:]]))

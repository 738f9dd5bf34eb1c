"""kernelcamp's refusal of a second workspace ``dvc exp run``, before DVC touches the working tree.

DVC composes params.yaml with Hydra at the start of every ``dvc exp run`` (``.dvc/config``: ``hydra.enabled``), and
first lets Hydra scan for plugins in the repo's root (``hydra.plugins_path``, default the root;
``dvc/utils/hydra.py``: ``load_hydra_plugins``). Hydra imports every module of the ``hydra_plugins`` namespace package
it finds there (``hydra/core/plugins.py``), so this module runs inside the ``dvc`` process, while DVC queues the
experiment (``BaseStashQueue._stash_exp``) and before it runs it. A workspace run's setup then checks out ``HEAD`` by
force (``WorkspaceExecutor.init_git``): during another run that deleted the running run's new, uncommitted
``dvc.lock`` and ``reports/*.json``, and the running run failed and saved nothing (helper-65, DVC 3.67). Raising here
ends the second ``dvc exp run`` there: DVC resets what it stashed and puts the workspace back
(``_stash_exp``'s ``finally``), and prints the line.

Only ``dvc exp run`` in the workspace is refused (``--queue`` and ``--temp`` run elsewhere), only while another live
``dvc`` run holds this tree; a run it lets through claims the tree from then on, before its first stage does
(:func:`kernelcamp.runlock.claim_workspace_run`), so that a second run started in those first seconds is refused too.
Anywhere else (``make params``, a test composing the conf) importing this module does nothing. It defines no Hydra
plugin.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def workspace_exp_run(argv: list[str]) -> bool:
    """Whether ``argv`` (a ``dvc`` process's ``sys.argv``) is ``dvc exp run`` in the workspace: neither ``--queue``
    nor ``--temp`` (nor ``--help``)."""
    if not argv or not Path(argv[0]).name.startswith(("dvc", "__main__")):
        return False
    words = [a for a in argv[1:] if not a.startswith("-")]
    flags = {a.split("=", 1)[0] for a in argv[1:] if a.startswith("-")}
    return words[:2] == ["exp", "run"] and not flags & {"--queue", "--temp", "-h", "--help"}


def _guard() -> None:
    if not workspace_exp_run(sys.argv) or "dvc" not in sys.modules:
        return
    try:
        from dvc.exceptions import DvcException
        from dvc.repo import Repo

        from kernelcamp.errors import AnotherRunError
        from kernelcamp.runlock import claim_workspace_run
    except ImportError:  # kernelcamp not importable here: the stages' own refusal still stands
        return
    try:  # the repo DVC runs in, as DVC finds it (this file may be another checkout's, first on sys.path)
        claim_workspace_run(Path(Repo.find_root()), os.getpid())
    except AnotherRunError as e:
        raise DvcException(str(e)) from None


_guard()

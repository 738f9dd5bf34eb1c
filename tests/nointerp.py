"""The environment of a subprocess that must compile for real: this test session runs Triton on the interpreter
(``TRITON_INTERPRET=1``, set by conftest.py without a GPU), and under it no kernel can be cross-compiled.

``env_without_interpreter(**extra)`` is a copy of ``os.environ`` without ``TRITON_INTERPRET``, with the repository
root first on ``PYTHONPATH`` (so ``kernels`` and ``kernelcamp`` import from this tree), then ``extra`` (which may
set ``PYTHONPATH`` itself).
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def env_without_interpreter(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env

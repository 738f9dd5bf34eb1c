"""Stub executables on PATH for tests that run the device shell scripts (benchmarks/*.sh) without a device.

``stub_env(tmp_path, {"dvc": "#!/usr/bin/env bash\\n..."})`` writes each script as an executable file in
``tmp_path/bin`` and returns a copy of ``os.environ`` whose PATH starts with that folder, so the script under
test finds the stubs before the real ``dvc``, ``python``, ``git``, ``nvidia-smi`` and so on. Extra keyword
arguments are added to the environment (for example a file the stubs write their pids to).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def stub_env(tmp_path: Path, stubs: dict[str, str], **extra: str) -> dict[str, str]:
    """Write ``stubs`` (name -> script text) as executables in ``tmp_path/bin``; the environment with them first."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name, text in stubs.items():
        (bin_ / name).write_text(text)
        (bin_ / name).chmod((bin_ / name).stat().st_mode | stat.S_IEXEC)
    return {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", **extra}

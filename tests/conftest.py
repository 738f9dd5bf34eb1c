"""Test setup: without a CUDA GPU, run Triton kernels through the interpreter.

TRITON_INTERPRET must be set before triton is first imported, hence at conftest import time.
"""

import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture
def run_spec_stage(tmp_path):
    """``run(params) -> (CompletedProcess, out)``: ``python -m stages.spec`` of this tree on ``params``
    written to ``tmp_path/params.yaml``, with ``tmp_path`` as its workspace ($DVC_ROOT, no MLflow URI)
    and its output ``out`` = ``reports/spec.json`` already holding ``"previous\\n"`` (so a test can
    check that a refusal leaves it untouched)."""
    import subprocess

    import yaml

    def run(params):
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
        out = tmp_path / "reports" / "spec.json"
        out.parent.mkdir(exist_ok=True)
        out.write_text("previous\n")
        env = {**os.environ, "DVC_ROOT": str(tmp_path), "PYTHONPATH": str(ROOT)}  # the stage from this tree
        env.pop("MLFLOW_TRACKING_URI", None)
        r = subprocess.run(
            [sys.executable, "-m", "stages.spec", "--params", "params.yaml", "--out", str(out)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        return r, out

    return run

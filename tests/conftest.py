"""Test setup: without a CUDA GPU, run Triton kernels through the interpreter.

TRITON_INTERPRET must be set before triton is first imported, hence at conftest import time.
"""

import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

"""kernelcamp: reproducible optimization campaigns for GPU kernels.

The library the DVC stages (``stages/``) call: variant parsing, compile inspection, timing,
serving, load generation, statistics and tracking. Nothing here runs at import.
"""

__version__ = "0.1.0"

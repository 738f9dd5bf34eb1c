"""Which ports this workspace's servers use: the deployed server's, a sweep worker's, the baseline's.

A ``kernelcamp sweep`` worker in slot N (``KERNELCAMP_WORKER_SLOT``) owns the ports ``server.port +
PORT_STRIDE * (N + 1)`` and the ``PORT_STRIDE - 1`` above it; the workspace itself owns ``server.port``
and the ports above it. The serving benchmark's temporary baseline server sits at the candidate's port
plus ``benchmark.serving.baseline_port_offset``, inside the same range. Nothing here starts a process.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from kernelcamp.errors import KernelcampError

SLOT_ENV = "KERNELCAMP_WORKER_SLOT"
#: Ports of parallel workers are spaced by this much: server.port + PORT_STRIDE * slot.
PORT_STRIDE = 10


def worker_slot() -> int:
    """This process's sweep worker slot (0 when not run by ``kernelcamp sweep``).

    Raises ``KernelcampError`` when ``KERNELCAMP_WORKER_SLOT`` is set but not a non-negative integer.
    """
    raw = os.environ.get(SLOT_ENV, "0").strip() or "0"
    if not raw.isdigit():
        raise KernelcampError(f"{SLOT_ENV}={raw!r}: expected a non-negative integer (set by kernelcamp sweep)")
    return int(raw)


def in_sweep() -> bool:
    """Whether this process runs under a ``kernelcamp sweep`` worker (``KERNELCAMP_WORKER_SLOT`` set)."""
    return SLOT_ENV in os.environ


def worker_port(base_port: int) -> int:
    """The port this process's embedded server uses.

    Outside a sweep, ``base_port``; in sweep slot N, ``base_port + PORT_STRIDE * (N + 1)``, so that no
    worker, slot 0 included, collides with the workspace's own deployed server on ``base_port``.
    """
    return int(base_port) + (PORT_STRIDE * (worker_slot() + 1) if in_sweep() else 0)


def baseline_port(candidate_port: int, params: dict[str, Any]) -> int:
    """The temporary baseline server's port: the candidate's + ``benchmark.serving.baseline_port_offset``
    (default 1; 1..PORT_STRIDE-1 so it stays inside this sweep worker's port range)."""
    sv = (params.get("benchmark") or {}).get("serving") or {}
    off = int(sv.get("baseline_port_offset", 1))
    if not 1 <= off < PORT_STRIDE:
        raise KernelcampError(
            f"benchmark.serving.baseline_port_offset={off}: expected 1..{PORT_STRIDE - 1} "
            "(a sweep worker owns the candidate port + 0..9)"
        )
    return int(candidate_port) + off


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when nothing accepts connections on host:port and the port can be bound."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        if s.connect_ex((host, port)) == 0:
            return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True

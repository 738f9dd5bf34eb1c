"""Which ports this workspace's servers use: the deployed server's, a sweep worker's, the baseline's.

A ``kernelcamp sweep`` worker in slot N (``KERNELCAMP_WORKER_SLOT``) owns the ports ``server.port +
PORT_STRIDE * (N + 1)`` and the ``PORT_STRIDE - 1`` above it; the workspace itself owns ``server.port``
and the ports above it. The serving benchmark's temporary baseline server sits at the candidate's port
plus ``benchmark.serving.baseline_port_offset``, inside the same range. Nothing here starts a process.
"""

from __future__ import annotations

import errno
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


#: What to listen on instead of a host this machine cannot listen on (:func:`bind_problem`): the one wording of
#: ``kernelcamp serve --host``'s message and of the ``server.host`` checks (spec stage, deploy, :func:`check_host`).
HOST_FIX = "an address of this machine (127.0.0.1 for this machine only)"


def _addresses(host: str, port: int) -> list[tuple[Any, ...]]:
    """``(family, type, proto, sockaddr)`` of each address ``host`` resolves to (``socket.getaddrinfo``, IPv4 or
    IPv6 as it gives them), without repeats. Raises ``OSError`` (``socket.gaierror``) for a name that does not
    resolve, ``UnicodeError`` or ``ValueError`` for one that cannot be a name."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys((family, kind, proto, addr) for family, kind, proto, _, addr in infos))


def bind_problem(host: str, port: int) -> tuple[str, bool] | None:
    """Why this machine cannot listen on ``host:port`` now, or None: ``(reason, host_at_fault)``.

    Each address ``host`` resolves to is bound as uvicorn's server binds it (asyncio's ``create_server``:
    ``SO_REUSEADDR``, so TIME_WAIT is no obstacle; ``IPV6_V6ONLY`` on IPv6), in the family getaddrinfo gives. The
    host is at fault (``host_at_fault`` true) when it does not resolve, or when every address fails with
    EADDRNOTAVAIL: none is an address of this machine (asyncio skips such an address while another binds). The
    port is at fault when a bind fails otherwise (EADDRINUSE: in use; EACCES: a privileged port). ``reason``
    says which, in the system's own words too. Port 0 checks the host alone."""
    try:
        addresses = _addresses(host, port)
    except (OSError, UnicodeError, ValueError) as e:
        return f"does not resolve to an address ({e})", True
    not_here: OSError | None = None
    bound = 0
    for family, kind, proto, addr in addresses:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                s.bind(addr)
            except OSError as e:
                if e.errno != errno.EADDRNOTAVAIL:
                    return str(e), False
                not_here = e
                continue
            bound += 1
    if not bound:
        return f"not an address of this machine ({not_here})", True
    return None


def host_problem(host: str) -> str | None:
    """Why this machine cannot listen on ``host`` at all (it does not resolve, or is no address of this machine),
    or None (:func:`bind_problem` on port 0)."""
    problem = bind_problem(host, 0)
    return problem[0] if problem is not None and problem[1] else None


def check_host(host: str, where: str = "server.host") -> None:
    """Raise ``KernelcampError`` (one line naming ``where``) when this machine cannot listen on ``host``
    (:func:`host_problem`): the spec stage's and the embedded deploy's check of ``server.host``."""
    why = host_problem(host)
    if why is not None:
        raise KernelcampError(f"{where} = {host!r}: {why}; set it to {HOST_FIX}")


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when nothing accepts connections on ``host:port`` and the port can be bound there (IPv4 or IPv6: every
    address ``host`` resolves to, in its own family).

    Raises ``KernelcampError`` (:func:`check_host`) when the host is at fault: a port is never "held" on a host
    that does not resolve or is no address of this machine."""
    check_host(host)
    for family, kind, proto, addr in _addresses(host, port):
        with socket.socket(family, kind, proto) as s:
            s.settimeout(0.5)
            if s.connect_ex(addr) == 0:
                return False
    return bind_problem(host, port) is None

"""Deploy: make a server run the variant with the server flag set, and prove it.

``deploy(params)`` dispatches on ``deploy.kind``:

- ``embedded``: kernelcamp's own server on this machine. The previous one (state file
  ``$DVC_ROOT/.kernelcamp/server.json``: pid, process group, port, hash) is stopped (SIGTERM to its
  process group, SIGKILL after 15 s), then ``kernelcamp serve`` starts detached (new session, log
  ``.kernelcamp/server.log``) with the exact params it was deployed with
  (``.kernelcamp/server-params.yaml``) on ``server.port``, or, when a process this deploy did not
  start holds that port, on the next free port of :func:`fallback_ports` (one line on stderr says
  which and why; the record's ``url`` and ``port`` carry it, ``configured_port`` and ``port_note``
  say why). Everything after the deploy reads the port from the record's ``url``, never from params.
- ``command``: your own server. The variant's kernel file is copied to ``kernel_dest``, ``stop``
  (if given) runs, then ``launch`` runs detached through the shell with the flag set as
  environment (:func:`flag_env`).
- ``ssh``: the kernel file and ``variant.json`` are copied to ``host:remote_dir`` (scp), sha256 is
  compared on both sides (remote: ``sha256sum``), ``restart`` runs there (``cd remote_dir``, the
  flag set exported), then ``url`` is polled.

Ready (DESIGN.md, reliability contract) means: ``/health`` 200 AND one real completion succeeds AND
the variant hash on ``/v1/kernelcamp/info`` matches (and, for the embedded server, the pid it
reports is the process we started, so a stale process still answering on the port never passes).
A server without the info endpoint (command/ssh targets running a foreign server) is recorded with
``hash_verified: false``. A server that is not ready within ``health_timeout_s`` is killed (its
process group), its port freed, and a one-line ``KernelcampError`` raised.

A deploy whose state file shows the same variant hash and flags, against a live server that passes
the ready check, is a no-op (``reused: true``).

``server.host``: the embedded server binds exactly that address; the recorded ``url`` is one a client
on this machine can use (a wildcard such as ``0.0.0.0`` is recorded as ``http://127.0.0.1:port``), and
a host that is not loopback gets a warning on stderr. API key: with ``KERNELCAMP_API_KEY`` set, the
embedded server inherits it from the environment (never on its command line) and requires it, and
the readiness probe sends it; a command/ssh server must be started with the same key by its own
launch/restart line. ssh: host, user and remote_dir may not start with ``-`` (ssh would take them as
options), and ``--`` ends ssh's and scp's options before the destination.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from kernelcamp.errors import KernelcampError


class DeployKind(Protocol):
    """One deploy kind (``deploy.kind``): a module of this package with these two functions."""

    def deploy(self, params: dict[str, Any], root: str | Path | None = None) -> dict[str, Any]:
        """Make the server run ``params``' variant with its server flags; the deploy record."""

    def stop(self, root: str | Path | None = None) -> bool:
        """Stop the server this workspace started this way; True if one was running."""


#: ``deploy.kind`` -> the module that deploys it (imported on use).
KINDS = {
    "embedded": "kernelcamp.deploy.embedded",
    "command": "kernelcamp.deploy.command",
    "ssh": "kernelcamp.deploy.ssh",
}


def deploy_kind(kind: Any) -> DeployKind:
    """The module of deploy kind ``kind``; ``KernelcampError`` naming the choices for another."""
    import importlib

    if kind not in KINDS:
        raise KernelcampError(f"deploy.kind={kind!r}: choose one of {sorted(KINDS)} (conf/deploy/)")
    return importlib.import_module(KINDS[kind])  # type: ignore[return-value]


def deploy(params: dict[str, Any], root: str | Path | None = None) -> dict[str, Any]:
    """Deploy per ``params['deploy']['kind']``; returns the record written to reports/deploy.json."""
    return deploy_kind((params.get("deploy") or {}).get("kind")).deploy(params, root)


def stop(root: str | Path | None = None) -> bool:
    """Stop every server this workspace started (embedded and command kinds); True if one was running."""
    stopped = False
    for kind in KINDS:
        stopped |= deploy_kind(kind).stop(root)
    return stopped

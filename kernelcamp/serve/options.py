"""The options of ``kernelcamp serve``, and the checks of the ``server`` params that become them.

The embedded deploy runs ``kernelcamp serve --params P --host <server.host> --port <server.port>
[--device <server.device>] <server.args...>``. What that command accepts is written down once, here:
:func:`serve_parser` builds its parser (``kernelcamp serve`` itself, :mod:`kernelcamp.serve.server`),
and :func:`check_serve_settings` checks ``server.host``, ``server.device`` and ``server.args`` with the
same parser and the same device pattern, for the spec stage (:mod:`kernelcamp.spec`) and for the
embedded deploy before it stops a running server (:mod:`kernelcamp.deploy.embedded`), so that the checks
and the server cannot drift apart: a value the spec passes is one the server takes.

Nothing here imports torch or fastapi (the spec stage imports this module); :func:`check_device`
imports torch only for a CUDA device.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from typing import Any

from kernelcamp.errors import KernelcampError
from kernelcamp.ports import check_host
from kernelcamp.serve.client import API_KEY_ENV

#: The devices ``--device`` (and ``server.device``) take.
DEVICE_RE = re.compile(r"^(cpu|cuda(:\d+)?)$")
DEVICE_FORMS = "cpu, cuda or cuda:N"
#: Options the deploy sets itself from ``server.host``, ``server.port``, ``server.device`` and the params file:
#: ``server.args`` giving them would serve somewhere other than what the records say.
DEPLOY_SETS = ("--params", "--host", "--port", "--device")
#: Options the parser takes that ``server.args`` may not give, and why.
NOT_IN_ARGS = {
    "--engine-uds": "an internal option (the server's own engine process)",
    "--api-key": (
        f"a key in server.args is kept in params.yaml, dvc.lock and MLflow's params; set ${API_KEY_ENV} instead, "
        "which the deployed server inherits and the deploy's readiness check sends"
    ),
}


def serve_parser(make: Callable[..., argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """The ``kernelcamp serve`` parser: ``make(**kwargs)`` creates it (``kernelcamp serve``: the ``serve``
    subparser; :func:`check_server_args`: a parser that raises instead of exiting), then the options are added.
    No abbreviations: ``server.args`` reach it after the deploy's own ``--host``/``--port``, and ``"--po"`` must
    not pass as ``--port``. The caller sets ``main``."""
    ap = make(
        description="The embedded OpenAI-compatible decode server (kernelcamp serve), and a fixed-rate fake for tests.",
        allow_abbrev=False,
    )
    ap.add_argument("--params", default="params.yaml", help="params.yaml (variant, workload, server, kernel)")
    ap.add_argument("--host", default=None, help="bind address (default: server.host, else 127.0.0.1)")
    ap.add_argument("--port", type=int, default=None, help="port (default: server.port, else 8765)")
    ap.add_argument("--device", default=None, help="cuda:N or cpu (default: cuda:0 when a GPU is present)")
    ap.add_argument(
        "--api-key",
        default=None,
        help=f"require `Authorization: Bearer KEY` on everything but /health (default: ${API_KEY_ENV}, else none)",
    )
    ap.add_argument(
        "--trace-dir",
        default=None,
        help="where profile traces are kept (default: a private temporary folder removed at exit)",
    )
    ap.add_argument(
        "--fake",
        default=None,
        metavar="SPEC",
        help="serve the fixed-rate fake instead of the model, e.g. ttft_ms=50,itl_ms=10,chunk=2 "
        "(keys: kernelcamp.serve.fake.FakeSpec)",
    )
    ap.add_argument("--never-ready", action="store_true", help="test aid: /health answers 503 forever")
    ap.add_argument(
        "--log-level",
        default="warning",
        choices=("critical", "error", "warning", "info", "debug", "trace"),
        help="uvicorn's log level (default: warning)",
    )
    # internal: run as the engine process of a front process (kernelcamp.serve.front), on this socket
    ap.add_argument("--engine-uds", default=None, help=argparse.SUPPRESS)
    return ap


def _named(where: str, value: Any) -> str:
    """``--device cuda:9`` for a command-line option, ``server.device = 'cuda:9'`` for a params key."""
    return f"{where} {value}" if where.startswith("--") else f"{where} = {value!r}"


def check_device_name(device: str | None, where: str = "server.device") -> None:
    """Raise ``KernelcampError`` when ``device`` is not one :data:`DEVICE_RE` takes (None: the server's default)."""
    if device is not None and not DEVICE_RE.fullmatch(str(device)):
        default = "" if where.startswith("--") else ", or null for cuda:0 when a GPU is present, else cpu"
        raise KernelcampError(f"{_named(where, device)}: expected {DEVICE_FORMS}{default}")


def check_device(device: str, where: str = "--device") -> None:
    """Raise ``KernelcampError`` when ``device`` is not a device :data:`DEVICE_RE` takes, or is a CUDA device this
    machine does not have (torch is imported for a CUDA device only)."""
    check_device_name(device, where)
    if not device.startswith("cuda"):
        return
    import torch

    fix = f"use {where} cpu" if where.startswith("--") else f"set {where} to cpu"
    if not torch.cuda.is_available():
        raise KernelcampError(f"{_named(where, device)}: no CUDA GPU here; {fix}")
    index = int(device.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        raise KernelcampError(
            f"{_named(where, device)}: this machine has {torch.cuda.device_count()} CUDA GPU(s), cuda:0 to "
            f"cuda:{torch.cuda.device_count() - 1}"
        )


def check_api_key(key: str | None, where: str = API_KEY_ENV) -> None:
    """Raise ``KernelcampError`` when ``key`` (``--api-key``, or ``$KERNELCAMP_API_KEY`` that the deployed server
    inherits) is empty or has surrounding spaces: no request could match it. None: no key."""
    if key is not None and (not key.strip() or key != key.strip()):
        raise KernelcampError(
            f"{where}: empty or with surrounding spaces (no request could match it); give a key, or leave it unset"
        )


class _Refused(Exception):
    """What the checking parser raises where ``kernelcamp serve``'s would print a line and exit."""


class _CheckingParser(argparse.ArgumentParser):
    def error(self, message: str):  # noqa: D102 - argparse's hook
        raise _Refused(message)

    def exit(self, status: int = 0, message: str | None = None):  # noqa: D102 - argparse's hook (-h prints help)
        raise _Refused("-h/--help prints the help and exits")


def check_server_args(args: Sequence[str], where: str = "server.args", embedded: bool = True) -> None:
    """Raise ``KernelcampError`` (one line naming ``where``) unless ``kernelcamp serve`` takes ``args`` after the
    options the deploy gives it: none of :data:`DEPLOY_SETS` nor :data:`NOT_IN_ARGS`, and every one an option of
    :func:`serve_parser` with a value it takes (e.g. ``--workers=4`` is refused: the server would exit with a
    usage error at deploy, after the running server was stopped). ``embedded`` false (a ``command`` or ``ssh``
    server, which gets ``server.args`` as ``$KERNELCAMP_SERVER_ARGS`` for options of its own): only
    :data:`DEPLOY_SETS` are refused."""
    for i, arg in enumerate(args):
        name = str(arg).split("=", 1)[0]
        if name in DEPLOY_SETS:
            raise KernelcampError(
                f"{where}.{i} = {arg!r}: the deploy sets {name} itself; use "
                "server.host, server.port or server.device, so that the records name where it served"
            )
        if embedded and name in NOT_IN_ARGS:
            raise KernelcampError(f"{where}.{i} ({name}): {NOT_IN_ARGS[name]}")  # its value may be a secret
    if not embedded:
        return
    parser = serve_parser(lambda **kw: _CheckingParser(prog="kernelcamp serve", **kw))
    try:
        parser.parse_args([str(a) for a in args])
    except _Refused as e:
        takes = [
            a.option_strings[-1]
            for a in parser._actions
            if a.option_strings
            and a.help != argparse.SUPPRESS
            and a.option_strings[-1] not in (*DEPLOY_SETS, *NOT_IN_ARGS, "--help")
        ]
        raise KernelcampError(
            f"{where} = {list(args)!r}: kernelcamp serve would refuse them ({e}); it takes {', '.join(takes)} "
            "(see `kernelcamp serve --help`)"
        ) from None


def check_serve_settings(host: str, device: str | None, args: Sequence[str]) -> None:
    """The embedded server's settings that the deploy passes to ``kernelcamp serve`` on its command line:
    ``server.host`` is an address this machine can listen on (:func:`kernelcamp.ports.check_host`),
    ``server.device`` a device name it takes (:func:`check_device_name`; whether this machine has that GPU is
    :func:`check_device`'s, which needs torch), ``server.args`` options it takes (:func:`check_server_args`).
    Raises ``KernelcampError`` naming the key."""
    check_host(host)
    check_device_name(device)
    check_server_args(args)

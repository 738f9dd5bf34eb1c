"""What a server runs, as one hash both sides of a deploy share.

:func:`variant_hash` is what the server reports on ``/v1/kernelcamp/info`` and what ``deploy``
records and ``benchmark`` checks, so a server running something else can never pass for the deployed
variant (DESIGN.md, "is the new config really live?"). The kernel file's path and hash come from one
function each (:func:`kernel_path`, :func:`kernel_source_hash`), so build, deploy, the server and the
report agree. Nothing here imports torch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kernelcamp.errors import KernelcampError, as_written
from kernelcamp.variant import Variant, parse_variant

# Server flags that change what the server computes or how it schedules: they enter the variant
# hash. host/port are where it listens, not what it runs, so they are left out.
SERVER_FLAG_KEYS = (
    "name",
    "cuda_graphs",
    "graph_batch_buckets",
    "max_running_requests",
    "overlap_scheduling",
    "engine_process",
    "gc_freeze",
    "env",
    "args",
)


def _flag(server: Mapping[str, Any], key: str, default: Any, kind: type) -> Any:
    v = server.get(key, default)
    if isinstance(v, bool) != (kind is bool) or not isinstance(v, kind):  # bool("false") is True
        want = "true or false" if kind is bool else "an integer"
        raise KernelcampError(f"server.{key} = {as_written(v)}: expected {want}")
    return v


def server_flags(server: Mapping[str, Any] | None) -> dict[str, Any]:
    """The hashed part of params.yaml's ``server`` section, with defaults filled in (JSON-ready).

    Raises ``KernelcampError`` for a flag of the wrong type (a string where true/false or an integer
    belongs): read loosely, ``overlap_scheduling: "false"`` would have run with overlap on."""
    server = dict(server or {})
    buckets = server.get("graph_batch_buckets") or [1, 2, 4, 8, 16, 32, 64, 96]
    if not isinstance(buckets, list) or any(isinstance(b, bool) or not isinstance(b, int) for b in buckets):
        raise KernelcampError(f"server.graph_batch_buckets = {buckets!r}: expected a list of integers")
    flags = {
        "name": server.get("name", "default"),
        "cuda_graphs": _flag(server, "cuda_graphs", True, bool),
        "graph_batch_buckets": list(buckets),
        "max_running_requests": _flag(server, "max_running_requests", 96, int),
        "overlap_scheduling": _flag(server, "overlap_scheduling", False, bool),
        "engine_process": _flag(server, "engine_process", True, bool),
        "gc_freeze": _flag(server, "gc_freeze", True, bool),
        "env": {str(k): str(v) for k, v in sorted((server.get("env") or {}).items())},
        "args": [str(a) for a in server.get("args") or []],
    }
    return flags


def project_root() -> Path:
    """The working tree this code runs from (the repo, or a queued experiment's temporary copy)."""
    return Path(__file__).resolve().parents[1]


def dvc_stage(stage: str, root: Path | None = None) -> dict[str, Any]:
    """Stage ``stage`` of the ``dvc.yaml`` of the tree ``root`` (default: the one beside this code, a queued
    experiment's copy included, else the current directory's), as a mapping (``cmd``, ``deps``, ``params``...).
    Raises ``KernelcampError`` when dvc.yaml is unreadable or has no such stage."""
    import yaml

    path = (root or project_root()) / "dvc.yaml"
    if root is None and not path.exists():
        path = Path.cwd() / "dvc.yaml"
    try:
        st = yaml.safe_load(path.read_text())["stages"][stage]
        if not isinstance(st, Mapping):
            raise TypeError(f"stage {stage!r} is not a mapping")
    except (OSError, KeyError, TypeError, yaml.YAMLError) as e:
        raise KernelcampError(f"{path}: no stage {stage!r} with its params ({e}); restore dvc.yaml from git") from e
    return dict(st)


def kernel_path(module: str, root: Path | None = None) -> Path:
    """File of kernel module ``module`` (``kernels.<name>``) in the tree ``root`` (default: this one)."""
    return (root or project_root()) / (module.replace(".", "/") + ".py")


def kernel_module_path(kernel: Mapping[str, Any] | None, root: str | Path | None = None) -> Path:
    """Path of the kernel's module file (``kernel.module``, e.g. ``kernels.sparse_mla_decode``)."""
    return kernel_path(
        (kernel or {}).get("module", "kernels.sparse_mla_decode"), Path(root) if root is not None else None
    )


def kernel_source_hash(kernel: Mapping[str, Any] | None = None, root: str | Path | None = None) -> str:
    """sha256 (hex) of the kernel module's source file, or ``"absent"`` when there is no file.

    The file's bytes, as the kernel module's own ``kernel_source_hash()`` and
    :class:`kernelcamp.spec.RunSpec` hash them, so build, deploy, the server and the report agree
    (without importing torch here).
    """
    path = kernel_module_path(kernel, root)
    if not path.exists():
        return "absent"
    return hashlib.sha256(path.read_bytes()).hexdigest()


def variant_hash(variant: Variant, kernel_source_hash: str, flags: Mapping[str, Any] | None = None) -> str:
    """The hash a server reports for what it runs: variant configs + kernel source + server flags.

    ``variant``: the parsed variant (its name is included: a renamed variant is another row in the
    reports). ``kernel_source_hash``: :func:`kernel_source_hash`. ``flags``: :func:`server_flags`
    output (None: no flags). Returns 16 hex characters.
    """
    payload = json.dumps(
        {
            "variant": variant.as_dict(),
            "kernel": kernel_source_hash,
            "flags": dict(flags) if flags is not None else None,
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def params_variant_hash(params: Mapping[str, Any], root: str | Path | None = None) -> str:
    """:func:`variant_hash` of params.yaml's ``variant``, ``kernel`` and ``server`` sections."""
    if "variant" not in params:
        raise KernelcampError("params.yaml has no `variant` section: check conf/config.yaml's defaults list")
    v = parse_variant(params["variant"])
    return variant_hash(v, kernel_source_hash(params.get("kernel"), root), server_flags(params.get("server")))

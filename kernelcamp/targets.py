"""Target GPUs: their limits (from a params.yaml ``target`` section or ``conf/target/<name>.yaml``),
the GPU in this machine (``auto``), and the occupancy a kernel reaches on them.

Sources of the figures:

- Per-block and per-SM limits: CUDA C++ Programming Guide, "Technical Specifications per Compute
  Capability" (each ``conf/target/*.yaml`` names its row); DESIGN.md lists them too.
- Occupancy: the CUDA Occupancy Calculator (``cudaOccupancyMaxActiveBlocksPerMultiprocessor`` and
  the spreadsheet shipped with the CUDA toolkit, "GPU Data" sheet): registers are allocated per
  warp in units of 256 (register allocation unit size 256, allocation granularity "warp", for
  compute capability 5.0 to 12.0); shared memory is allocated per block in units of 128 B, and
  since compute capability 8.0 the driver reserves 1 KB of shared memory per block
  (Programming Guide, "Shared Memory" for 8.x/9.0: "1 KB of shared memory is reserved for system
  use"), which counts against the per-SM capacity but not against the opt-in per-block limit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kernelcamp.errors import KernelcampError

LIMIT_FIELDS = (
    "arch",
    "num_sms",
    "shared_bytes_per_block",
    "shared_bytes_per_sm",
    "shared_bytes_reserved_per_block",
    "registers_per_sm",
    "max_registers_per_thread",
    "max_warps_per_sm",
    "max_ctas_per_sm",
)
REGISTER_ALLOC_UNIT = 256  # registers per warp allocation unit (CUDA Occupancy Calculator, cc 5.0-12.0)
SHARED_ALLOC_UNIT = 128  # bytes (CUDA Occupancy Calculator, "shared memory allocation unit size", cc >= 8.0)
WARP_SIZE = 32


@dataclass(frozen=True)
class Target:
    """One target GPU's limits. Units: bytes, registers (32-bit), warps, CTAs (thread blocks).

    ``shared_bytes_per_block`` is the opt-in maximum of dynamic shared memory per block (what
    Triton compares a kernel's ``metadata.shared`` against before it launches or autotunes it).
    """

    name: str
    arch: int
    num_sms: int
    shared_bytes_per_block: int
    shared_bytes_per_sm: int
    shared_bytes_reserved_per_block: int
    registers_per_sm: int
    max_registers_per_thread: int
    max_warps_per_sm: int
    max_ctas_per_sm: int
    gpu: str | None = None
    peak_gbps: float | None = None
    peak_bf16_tflops: float | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(d.pop("extra"))
        return d


def conf_dir() -> Path:
    """``conf/`` of the workspace: ``$DVC_ROOT/conf`` or ``./conf`` when present, else the one beside
    the installed package."""
    from kernelcamp.provenance import dvc_root

    here = dvc_root() / "conf"
    return here if here.is_dir() else Path(__file__).resolve().parents[1] / "conf"


def named_targets() -> list[str]:
    """Names of the target files in ``conf/target/`` (``auto`` included)."""
    return sorted(p.stem for p in (conf_dir() / "target").glob("*.yaml"))


def _read_target_file(name: str) -> dict[str, Any]:
    path = conf_dir() / "target" / f"{name}.yaml"
    if not path.exists():
        raise KernelcampError(f"unknown target {name!r}: no {path}; choose one of {named_targets()}")
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise KernelcampError(f"{path} is not a mapping")
    return data


def load_target(name_or_mapping: str | Mapping[str, Any]) -> Target:
    """A ``Target`` from a params.yaml ``target`` section, or from ``conf/target/<name>.yaml`` by name.

    ``"auto"`` (or a section with ``arch: auto``) reads the GPU in this machine (``resolve_target``).
    Raises ``KernelcampError`` for an unknown name or a missing/non-integer limit.
    """
    if isinstance(name_or_mapping, str):
        if name_or_mapping == "auto":
            return resolve_target("auto")
        raw: Mapping[str, Any] = _read_target_file(name_or_mapping)
    elif isinstance(name_or_mapping, Mapping):
        raw = name_or_mapping
    else:
        raise KernelcampError(f"target must be a name or a mapping, got {type(name_or_mapping).__name__}")
    if raw.get("arch") == "auto":
        return resolve_target("auto")
    name = str(raw.get("name") or f"sm{raw.get('arch')}")
    missing = [f for f in LIMIT_FIELDS if f not in raw]
    if missing:
        raise KernelcampError(f"target {name!r} lacks {missing}: see conf/target/sm90.yaml for the fields and sources")
    limits: dict[str, int] = {}
    for f in LIMIT_FIELDS:
        v = raw[f]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise KernelcampError(f"target {name!r}: {f} = {v!r}, expected a non-negative integer")
        limits[f] = v
    known = {"name", "gpu", "peak_gbps", "peak_bf16_tflops", *LIMIT_FIELDS}
    return Target(
        name=name,
        gpu=raw.get("gpu"),
        peak_gbps=raw.get("peak_gbps"),
        peak_bf16_tflops=raw.get("peak_bf16_tflops"),
        extra={k: v for k, v in raw.items() if k not in known},
        **limits,
    )


def resolve_target(name: str = "auto", device_index: int = 0) -> Target:
    """The GPU in this machine as a ``Target`` (``name`` must be ``"auto"``; a named target is loaded).

    Arch, SM count, opt-in shared memory per block (``sharedMemPerBlockOptin``), shared memory per
    SM, registers per SM and max threads per SM come from ``torch.cuda.get_device_properties``
    where this torch exposes them; the rest (and peaks) from the named target with the same arch.
    Raises ``KernelcampError`` on a machine without a CUDA GPU, or for an arch with no named target
    when torch cannot report a limit.
    """
    if name != "auto":
        return load_target(name)
    try:
        import torch
    except ImportError as e:  # pragma: no cover - torch is a dependency
        raise KernelcampError("target auto needs torch to read the local GPU") from e
    if not torch.cuda.is_available():
        named = [t for t in named_targets() if t != "auto"]
        raise KernelcampError(f"target auto: no CUDA GPU on this machine; pick a named target instead (one of {named})")
    p = torch.cuda.get_device_properties(device_index)
    arch = p.major * 10 + p.minor
    base: dict[str, Any] = {}
    for cand in named_targets():
        if cand == "auto":
            continue
        data = _read_target_file(cand)
        if data.get("arch") == arch:
            base = dict(data)
            break
    read = {
        "num_sms": getattr(p, "multi_processor_count", None),
        "shared_bytes_per_block": getattr(p, "shared_memory_per_block_optin", None),
        "shared_bytes_per_sm": getattr(p, "shared_memory_per_multiprocessor", None),
        "registers_per_sm": getattr(p, "regs_per_multiprocessor", None),
    }
    threads = getattr(p, "max_threads_per_multi_processor", None)
    if threads:
        read["max_warps_per_sm"] = threads // WARP_SIZE
    base.update({k: v for k, v in read.items() if v})
    base["arch"] = arch
    base["name"] = f"auto:sm{arch}"
    base["gpu"] = p.name
    base.setdefault("shared_bytes_reserved_per_block", 1024 if arch >= 80 else 0)
    base.setdefault("max_registers_per_thread", 255)
    missing = [f for f in LIMIT_FIELDS if f not in base]
    if missing:
        raise KernelcampError(
            f"target auto: {p.name} (sm{arch}) has no conf/target file and torch does not report {missing}; "
            "add conf/target/sm{arch}.yaml with the Programming Guide's limits"
        )
    return load_target(base)


def occupancy(target: Target, registers_per_thread: int | None, shared_bytes: int | None, num_warps: int) -> dict:
    """Resident CTAs and warps per SM for a kernel on ``target``, and what limits them.

    ``registers_per_thread``: from the cubin; ``shared_bytes``: dynamic shared memory per block
    (Triton's ``metadata.shared``); ``num_warps``: warps per CTA. A figure that is ``None`` (could not
    be read) is left out of the limits. Returns ``{"ctas_per_sm", "warps_per_sm", "limited_by"}``;
    ``limited_by`` is one of ``registers``, ``shared_memory``, ``warps``, ``ctas`` (the first in that
    order on a tie), or ``does_not_fit`` with 0 CTAs when one block exceeds a per-block limit.

    Method (CUDA Occupancy Calculator): registers per warp = ceil(regs * 32 / 256) * 256, warps by
    registers = floor(registers_per_sm / that), CTAs = floor(warps / num_warps); shared memory per
    CTA = ceil((shared + reserved) / 128) * 128, CTAs = floor(shared_bytes_per_sm / that).
    """
    if num_warps < 1:
        raise KernelcampError(f"num_warps = {num_warps}: must be >= 1")
    limits: dict[str, int] = {}
    if registers_per_thread is not None:
        if registers_per_thread > target.max_registers_per_thread:
            return {"ctas_per_sm": 0, "warps_per_sm": 0, "limited_by": "does_not_fit"}
        per_warp = math.ceil(registers_per_thread * WARP_SIZE / REGISTER_ALLOC_UNIT) * REGISTER_ALLOC_UNIT
        limits["registers"] = (target.registers_per_sm // per_warp) // num_warps if per_warp else target.max_ctas_per_sm
    if shared_bytes is not None:
        if shared_bytes > target.shared_bytes_per_block:
            return {"ctas_per_sm": 0, "warps_per_sm": 0, "limited_by": "does_not_fit"}
        per_cta = shared_bytes + target.shared_bytes_reserved_per_block
        per_cta = math.ceil(per_cta / SHARED_ALLOC_UNIT) * SHARED_ALLOC_UNIT
        limits["shared_memory"] = target.shared_bytes_per_sm // per_cta if per_cta else target.max_ctas_per_sm
    limits["warps"] = target.max_warps_per_sm // num_warps
    limits["ctas"] = target.max_ctas_per_sm
    limited_by = min(limits, key=lambda k: limits[k])  # dict order: registers, shared_memory, warps, ctas
    ctas = limits[limited_by]
    return {"ctas_per_sm": ctas, "warps_per_sm": ctas * num_warps, "limited_by": limited_by}

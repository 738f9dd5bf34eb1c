"""Target GPUs: their limits (from a params.yaml ``target`` section or ``conf/target/<name>.yaml``),
the GPU in this machine (``auto``), and the occupancy a kernel reaches on them.

Sources of the figures:

- Per-block and per-SM limits: CUDA C++ Programming Guide, "Technical Specifications per Compute
  Capability" (each ``conf/target/*.yaml`` names its row); DESIGN.md lists them too. On every
  supported arch (8.0 to 12.0) a block has at most 1024 threads and 64K registers.
- Occupancy: the CUDA Occupancy Calculator as the CUDA toolkit implements it in ``cuda_occupancy.h``
  (``cudaOccMaxActiveBlocksPerMultiprocessor``; the same method as the calculator spreadsheet's "GPU
  Data" sheet and ``cudaOccupancyMaxActiveBlocksPerMultiprocessor``):

  * registers are allocated per warp in units of 256 (``cudaOccRegAllocationGranularity``), i.e. a
    thread's count is rounded up to a multiple of 8; the SM's register file is split over 4
    sub-partitions (``cudaOccSubPartitionsPerMultiprocessor``) and a warp's registers come from one
    of them, so warps by registers = floor(registers_per_sm / 4 / per_warp) * 4; a block needs
    per_warp * (its warps rounded up to a multiple of 4) <= 65536 registers (the hardware check);
  * shared memory is allocated per block in units of 128 B (``cudaOccSMemAllocationGranularity``),
    and since compute capability 8.0 the driver reserves 1 KB per block
    (``reservedSharedMemPerBlock``; Programming Guide, "Shared Memory": "1 KB of shared memory is
    reserved for system use"), which counts against the per-SM capacity and is added to the opt-in
    per-block limit;
  * warps per SM and blocks (CTAs) per SM are capped by the arch's maxima; a block of more than
    ``max_threads_per_block`` threads never launches.
"""

from __future__ import annotations

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
# Occupancy-calculator constants a target may state (conf/target/*.yaml all do); the defaults are the
# values cuda_occupancy.h gives for every supported arch (compute capability 8.0 to 12.0).
OCCUPANCY_FIELDS: dict[str, int] = {
    "max_threads_per_block": 1024,  # threads (Programming Guide, technical specifications)
    "max_registers_per_block": 65536,  # 32-bit registers (Programming Guide; cudaOccDeviceProp.regsPerBlock)
    "register_alloc_unit": 256,  # registers per warp allocation unit (cudaOccRegAllocationGranularity)
    "sub_partitions_per_sm": 4,  # register file partitions (cudaOccSubPartitionsPerMultiprocessor)
    "shared_alloc_unit": 128,  # bytes (cudaOccSMemAllocationGranularity, cc >= 8.0)
}
REGISTER_ALLOC_UNIT = OCCUPANCY_FIELDS["register_alloc_unit"]
SHARED_ALLOC_UNIT = OCCUPANCY_FIELDS["shared_alloc_unit"]
WARP_SIZE = 32


@dataclass(frozen=True)
class Target:
    """One target GPU's limits. Units: bytes, registers (32-bit), threads, warps, CTAs (thread blocks).

    ``shared_bytes_per_block`` is the opt-in maximum of dynamic shared memory per block (what
    Triton compares a kernel's ``metadata.shared`` against before it launches or autotunes it).
    The ``OCCUPANCY_FIELDS`` (threads and registers per block, allocation units, sub-partitions)
    default to the calculator's values for compute capability 8.0 to 12.0.
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
    max_threads_per_block: int = OCCUPANCY_FIELDS["max_threads_per_block"]
    max_registers_per_block: int = OCCUPANCY_FIELDS["max_registers_per_block"]
    register_alloc_unit: int = OCCUPANCY_FIELDS["register_alloc_unit"]
    sub_partitions_per_sm: int = OCCUPANCY_FIELDS["sub_partitions_per_sm"]
    shared_alloc_unit: int = OCCUPANCY_FIELDS["shared_alloc_unit"]
    gpu: str | None = None
    peak_gbps: float | None = None
    peak_bf16_tflops: float | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(d.pop("extra"))
        return d


def conf_dir() -> Path:
    """``conf/`` of the working tree this code runs from (a queued experiment's temporary copy
    included: never ``$DVC_ROOT``'s, which may have changed since it was queued), else ``./conf``."""
    here = Path(__file__).resolve().parents[1] / "conf"
    return here if here.is_dir() else Path.cwd() / "conf"


def named_targets() -> list[str]:
    """Names of the target files in ``conf/target/`` (``auto`` included)."""
    return sorted(p.stem for p in (conf_dir() / "target").glob("*.yaml"))


def _read_target_file(name: str) -> dict[str, Any]:
    """``conf/target/<name>.yaml`` as a mapping; ``KernelcampError`` for a name that is not one of
    :func:`named_targets` (a path such as ``../x`` or ``/tmp/x`` never leaves ``conf/target/``)."""
    if name not in named_targets():
        raise KernelcampError(f"unknown target {name!r}: choose one of {named_targets()} (files of conf/target/)")
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
    ``OCCUPANCY_FIELDS`` a section leaves out take their defaults (older params.yaml files lack them).
    Raises ``KernelcampError`` for an unknown name, a missing/non-integer limit, or a zero allocation
    unit, sub-partition count or per-block maximum.
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
    for f, default in OCCUPANCY_FIELDS.items():
        v = raw.get(f, default)
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise KernelcampError(f"target {name!r}: {f} = {v!r}, expected a positive integer (default {default})")
        limits[f] = v
    known = {"name", "gpu", "peak_gbps", "peak_bf16_tflops", *LIMIT_FIELDS, *OCCUPANCY_FIELDS}
    return Target(
        name=name,
        gpu=raw.get("gpu"),
        peak_gbps=raw.get("peak_gbps"),
        peak_bf16_tflops=raw.get("peak_bf16_tflops"),
        extra={k: v for k, v in raw.items() if k not in known},
        **limits,
    )


def roofline_pct(bytes_moved: float, flops: float, seconds: float, peaks: Mapping[str, Any]) -> float:
    """Percent of the roofline a kernel reached: the time its bytes need at ``peaks["peak_gbps"]`` (GB/s)
    or its FLOPs at ``peaks["peak_bf16_tflops"]`` (TFLOP/s), whichever is longer, over ``seconds``.
    ``peaks``: :func:`peaks_for_gpu`'s mapping (the GPU that ran) or a target's. The one formula of the
    benchmark stage and ``benchmarks/bench_kernel.py``."""
    t_bw = bytes_moved / (float(peaks["peak_gbps"]) * 1e9)
    t_fl = flops / (float(peaks["peak_bf16_tflops"]) * 1e12)
    return 100.0 * max(t_bw, t_fl) / seconds


def _same_value(a: Any, b: Any) -> bool:
    """``a == b`` with types, ``b`` being the file's value: ``True`` is not ``1``, and where the file has an
    integer the params need one (``arch: 90.0`` is refused, as every integer written ``4.0`` is); where the
    file has a float, an equal integer passes."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(b, float) and isinstance(a, (int, float)):
        return float(a) == b
    return type(a) is type(b) and a == b


def check_target_section(raw: Any, where: str = "target") -> Target:
    """The ``Target`` of a params.yaml ``target`` section, checked to be exactly one ``conf/target`` file.

    ``raw`` is a name (``"sm90"``, ``"auto"``) or the mapping ``compose`` copies from
    ``conf/target/<name>.yaml``. A mapping must name a file (``name``) and may hold only that file's
    keys with that file's values; a key it leaves out takes the file's value. So a record's target
    label, limits and roofline peaks are always one file's: ``-S target.name=sm120`` over sm90's limits,
    ``-S target.gpu=...`` over another GPU's peaks, a typo such as ``target.num_smss`` or a changed
    limit are refused with one line, never recorded. To describe another GPU, add
    ``conf/target/<name>.yaml`` (``sm90.yaml`` shows the fields and sources) and set ``target=<name>``.

    Raises ``KernelcampError`` naming the key, its value, the file's value and what to do.
    """
    if isinstance(raw, str) or raw is None:
        return load_target(raw if raw is not None else "")
    if not isinstance(raw, Mapping):
        raise KernelcampError(f"{where} must be a target name or a conf/target mapping, got {type(raw).__name__}")
    name = raw.get("name")
    known = named_targets()
    if not isinstance(name, str) or name not in known:
        raise KernelcampError(
            f"{where}.name = {name!r}: not a file of conf/target/ (one of {known}); to describe another GPU add "
            "conf/target/<name>.yaml (sm90.yaml shows the fields and their sources) and set target=<name>"
        )
    file = _read_target_file(name)
    hint = (
        f"the {where} section is conf/target/{name}.yaml as it stands: choose a whole target with "
        "`-S target=<name>`, or add conf/target/<name>.yaml for another GPU"
    )
    for key, value in raw.items():
        if key not in file:
            raise KernelcampError(f"{where}.{key}: not a field of conf/target/{name}.yaml ({sorted(file)}); {hint}")
        if not _same_value(value, file[key]):
            raise KernelcampError(f"{where}.{key} = {value!r} but conf/target/{name}.yaml says {file[key]!r}: {hint}")
    return load_target(file)  # the file as read above (load_target(name) would read it again)


def peaks_for_gpu(gpu_name: str | None, target: Target | Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """The roofline peaks of the GPU named ``gpu_name`` (``torch.cuda.get_device_name``, e.g.
    ``"NVIDIA H100 80GB HBM3"``), or ``None`` when no target states both peaks for that GPU.

    Peaks belong to one GPU model, not to an arch: an H100 and an H200 are both sm90 with the same
    limits, but 3.35 against 4.8 TB/s (their datasheets). So the peaks are ``target``'s own only
    when its ``gpu`` is exactly ``gpu_name``; else those of the ``conf/target/*.yaml`` file whose
    ``gpu`` is exactly ``gpu_name`` (the first by name). A roofline against another GPU's peaks is
    never returned.

    Returns ``{"gpu": gpu_name, "target": <target name>, "peak_gbps": GB/s, "peak_bf16_tflops":
    TFLOP/s, "peak_gbps_source": str | None, "peak_bf16_tflops_source": str | None}``.
    """
    if not gpu_name:
        return None
    candidates: list[Mapping[str, Any]] = []
    if target is not None:
        candidates.append(target.as_dict() if isinstance(target, Target) else target)
    candidates += [_read_target_file(n) for n in named_targets() if n != "auto"]
    for raw in candidates:
        if raw.get("gpu") == gpu_name and raw.get("peak_gbps") and raw.get("peak_bf16_tflops"):
            return {
                "gpu": gpu_name,
                "target": str(raw.get("name") or f"sm{raw.get('arch')}"),
                "peak_gbps": float(raw["peak_gbps"]),
                "peak_bf16_tflops": float(raw["peak_bf16_tflops"]),
                "peak_gbps_source": raw.get("peak_gbps_source"),
                "peak_bf16_tflops_source": raw.get("peak_bf16_tflops_source"),
            }
    return None


def resolve_target(name: str = "auto", device_index: int = 0) -> Target:
    """The GPU in this machine as a ``Target`` (``name`` must be ``"auto"``; a named target is loaded).

    Arch, SM count, opt-in shared memory per block (``sharedMemPerBlockOptin``), shared memory per
    SM, registers per SM and max threads per SM come from ``torch.cuda.get_device_properties``
    where this torch exposes them; the rest from a named target with the same arch (the one whose ``gpu``
    is this GPU's name first), the peaks only from a target naming this GPU (:func:`peaks_for_gpu`): on
    a GPU no target names, the returned target has no peaks.
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
    # the limits come from a file of the same arch (the one naming this GPU first); the peaks only from a
    # file naming this GPU: another GPU of the arch has other peaks (an H200's are not an H100's)
    same_arch = [d for d in (_read_target_file(n) for n in named_targets() if n != "auto") if d.get("arch") == arch]
    same_arch.sort(key=lambda d: d.get("gpu") != p.name)
    base: dict[str, Any] = dict(same_arch[0]) if same_arch else {}
    if base.get("gpu") != p.name:
        for k in ("peak_gbps", "peak_gbps_source", "peak_bf16_tflops", "peak_bf16_tflops_source"):
            base.pop(k, None)
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


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def block_limit(
    target: Target, registers_per_thread: int | None, shared_bytes: int | None, num_warps: int
) -> str | None:
    """Why one block of this kernel cannot be resident on ``target`` at all, or ``None`` when it can.

    Checks, in order (CUDA Occupancy Calculator, ``cuda_occupancy.h``): threads per block
    (``num_warps * 32`` against ``max_threads_per_block``), registers per thread
    (``max_registers_per_thread``), registers per block (per-warp allocation times the warps rounded
    up to the sub-partition count, against ``max_registers_per_block``), shared memory per block
    (``shared_bytes`` plus the reserved 1 KB, rounded to the allocation unit, against the opt-in
    limit plus the reserved 1 KB). Units: registers (32-bit), bytes, warps. A ``None`` figure (not
    read) is not checked. Raises ``KernelcampError`` when ``num_warps < 1``.
    """
    if num_warps < 1:
        raise KernelcampError(f"num_warps = {num_warps}: must be >= 1")
    threads = num_warps * WARP_SIZE
    if threads > target.max_threads_per_block:
        return (
            f"num_warps={num_warps} is {threads} threads per block, {target.name} allows "
            f"{target.max_threads_per_block}: the launch would fail"
        )
    if registers_per_thread is not None:
        if registers_per_thread > target.max_registers_per_thread:
            return (
                f"needs {registers_per_thread} registers per thread, {target.name} allows "
                f"{target.max_registers_per_thread}"
            )
        per_warp = _round_up(registers_per_thread * WARP_SIZE, target.register_alloc_unit)
        per_block = per_warp * _round_up(num_warps, target.sub_partitions_per_sm)
        if per_block > target.max_registers_per_block:
            return (
                f"needs {per_block} registers per block ({registers_per_thread} per thread, {per_warp} per warp "
                f"allocated, {num_warps} warps), {target.name} allows {target.max_registers_per_block}"
            )
    if shared_bytes is not None:
        allocated = _round_up(shared_bytes + target.shared_bytes_reserved_per_block, target.shared_alloc_unit)
        if allocated > target.shared_bytes_per_block + target.shared_bytes_reserved_per_block:
            limit = target.shared_bytes_per_block
            return f"needs {shared_bytes} B shared memory, {target.name} allows {limit} B per block"
    return None


def occupancy(target: Target, registers_per_thread: int | None, shared_bytes: int | None, num_warps: int) -> dict:
    """Resident CTAs and warps per SM for a kernel on ``target``, and what limits them.

    ``registers_per_thread``: from the cubin; ``shared_bytes``: shared memory per block in bytes
    (Triton's dynamic ``metadata.shared`` plus any static shared memory); ``num_warps``: warps per
    CTA. A figure that is ``None`` (could not be read) is left out of the limits. Returns
    ``{"ctas_per_sm", "warps_per_sm", "limited_by"}``; ``limited_by`` is one of ``registers``,
    ``shared_memory``, ``warps``, ``ctas`` (the first in that order on a tie), or ``does_not_fit``
    with 0 CTAs when one block exceeds a per-block limit (``block_limit`` says which).
    Raises ``KernelcampError`` when ``num_warps < 1``.

    Method (CUDA Occupancy Calculator, ``cuda_occupancy.h`` ``cudaOccMaxActiveBlocksPerMultiprocessor``):
    registers per warp = ceil(regs * 32 / 256) * 256; warps by registers = floor(registers_per_sm /
    4 sub-partitions / that) * 4, CTAs = floor(warps / num_warps); shared memory per CTA =
    ceil((shared + 1024 reserved) / 128) * 128, CTAs = floor(shared_bytes_per_sm / that); CTAs by
    warps = floor(max_warps_per_sm / num_warps); CTAs by the arch's max_ctas_per_sm. The result is
    the smallest of these.
    """
    if block_limit(target, registers_per_thread, shared_bytes, num_warps) is not None:
        return {"ctas_per_sm": 0, "warps_per_sm": 0, "limited_by": "does_not_fit"}
    limits: dict[str, int] = {}
    if registers_per_thread is not None:
        per_warp = _round_up(registers_per_thread * WARP_SIZE, target.register_alloc_unit)
        if per_warp:
            parts = target.sub_partitions_per_sm
            warps_by_registers = (target.registers_per_sm // parts // per_warp) * parts
            limits["registers"] = warps_by_registers // num_warps
        else:  # a kernel without registers is not limited by them
            limits["registers"] = target.max_ctas_per_sm
    if shared_bytes is not None:
        per_cta = _round_up(shared_bytes + target.shared_bytes_reserved_per_block, target.shared_alloc_unit)
        limits["shared_memory"] = target.shared_bytes_per_sm // per_cta if per_cta else target.max_ctas_per_sm
    limits["warps"] = target.max_warps_per_sm // num_warps
    limits["ctas"] = target.max_ctas_per_sm
    limited_by = min(limits, key=lambda k: limits[k])  # dict order: registers, shared_memory, warps, ctas
    ctas = limits[limited_by]
    return {"ctas_per_sm": ctas, "warps_per_sm": ctas * num_warps, "limited_by": limited_by}

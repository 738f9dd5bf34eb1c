"""Variants: one launch config, or an autotune list, parsed from a params.yaml section.

A variant is either a single config with the launch fields at its top level::

    name: bt16_w8
    BLOCK_T: 16
    BLOCK_H: 16
    num_warps: 8
    num_stages: 2
    num_splits: auto

or an autotune list::

    name: story_autotune
    autotune_key: [B]
    configs:
      - {BLOCK_T: 16, BLOCK_H: 16, num_warps: 4, num_stages: 2, num_splits: auto}

Mixing the two (a top-level launch field on a list variant, e.g. ``-S +variant.num_warps=8``) or a
key the kernel does not take is rejected with a message that says what to write instead
(DESIGN.md: an override is never silently ignored).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from kernelcamp.errors import KernelcampError

LAUNCH_FIELDS = ("BLOCK_T", "BLOCK_H", "num_warps", "num_stages", "num_splits")
AUTOTUNE_KEYS = ("B", "H", "topk")
_META_FIELDS = ("name",)


@dataclass(frozen=True)
class LaunchConfig:
    """One launch config of the sparse MLA decode kernel.

    BLOCK_T: cache tokens per tile (>= 16: tensor-core dot dimension). BLOCK_H: query heads per
    program (>= 16). num_warps, num_stages: Triton launch options. num_splits: split-K factor over
    the top-k range, an int >= 1 or "auto" (chosen from the batch size and SM count at launch).
    """

    BLOCK_T: int
    BLOCK_H: int
    num_warps: int
    num_stages: int
    num_splits: int | str = "auto"

    def label(self) -> str:
        """Short human label, e.g. ``T16_H16_w8_s2_kauto``."""
        return f"T{self.BLOCK_T}_H{self.BLOCK_H}_w{self.num_warps}_s{self.num_stages}_k{self.num_splits}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Variant:
    """A named variant: its configs (one means no autotuning) and the autotune key."""

    name: str
    configs: tuple[LaunchConfig, ...]
    autotune_key: tuple[str, ...] = ()
    is_list: bool = False

    @property
    def single(self) -> bool:
        return len(self.configs) == 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "configs": [c.as_dict() for c in self.configs],
            "autotune_key": list(self.autotune_key),
        }

    def config_hash(self) -> str:
        """sha256 (16 hex) of the configs and autotune key, independent of the name."""
        payload = json.dumps(
            {"configs": [c.as_dict() for c in self.configs], "key": list(self.autotune_key)}, sort_keys=True
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def restricted(self, keep: list[int]) -> Variant:
        """The same variant with only the configs at indices ``keep`` (e.g. those a target keeps)."""
        if not keep:
            raise KernelcampError(f"variant {self.name!r}: no config left to run")
        return Variant(self.name, tuple(self.configs[i] for i in keep), self.autotune_key, self.is_list)


def _check_int(where: str, field: str, value: Any, lo: int, pow2: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise KernelcampError(f"{where}.{field} = {value!r}: expected an integer >= {lo}")
    if value < lo:
        raise KernelcampError(
            f"{where}.{field} = {value}: must be >= {lo}"
            + (" (tensor-core dot dimensions need at least 16)" if field.startswith("BLOCK") else "")
        )
    if pow2 and value & (value - 1):
        raise KernelcampError(f"{where}.{field} = {value}: must be a power of two (e.g. {lo}, {2 * lo}, {4 * lo})")
    return value


def parse_config(raw: Mapping[str, Any], where: str) -> LaunchConfig:
    """Validate one config mapping. Raises ``KernelcampError`` naming the field and what to write."""
    unknown = sorted(set(raw) - set(LAUNCH_FIELDS))
    if unknown:
        raise KernelcampError(f"{where}: unknown key(s) {unknown}; the kernel takes {list(LAUNCH_FIELDS)}")
    missing = [f for f in LAUNCH_FIELDS[:4] if f not in raw]
    if missing:
        raise KernelcampError(
            f"{where}: missing {missing}; a config needs {list(LAUNCH_FIELDS[:4])} (num_splits defaults to auto)"
        )
    splits = raw.get("num_splits", "auto")
    if splits != "auto":
        splits = _check_int(where, "num_splits", splits, 1)
    return LaunchConfig(
        BLOCK_T=_check_int(where, "BLOCK_T", raw["BLOCK_T"], 16, pow2=True),
        BLOCK_H=_check_int(where, "BLOCK_H", raw["BLOCK_H"], 16, pow2=True),
        num_warps=_check_int(where, "num_warps", raw["num_warps"], 1, pow2=True),
        num_stages=_check_int(where, "num_stages", raw["num_stages"], 1),
        num_splits=splits,
    )


def parse_variant(raw: Mapping[str, Any], section: str = "variant") -> Variant:
    """Parse the ``variant`` (or ``baseline``) section of params.yaml.

    Raises ``KernelcampError`` for a missing name, a top-level launch field on a list variant, an
    unknown key, a bad value, or an autotune key the kernel does not know.
    """
    if not isinstance(raw, Mapping):
        raise KernelcampError(f"{section} must be a mapping, got {type(raw).__name__}")
    name = raw.get("name")
    if not name or not isinstance(name, str):
        raise KernelcampError(f"{section}.name is missing: every file in conf/{section}/ sets name: <file name>")
    if "configs" in raw:
        top = sorted(set(raw) & set(LAUNCH_FIELDS))
        if top:
            f = top[0]
            raise KernelcampError(
                f"{section} {name!r} mixes top-level launch fields ({', '.join(top)}) with an autotune list "
                f"(configs): a single-config variant takes -S {section}.{f}=..., a list variant "
                f"(e.g. -S {section}=story_autotune) takes -S '{section}.configs.0.{f}=...'"
            )
        unknown = sorted(set(raw) - {"name", "configs", "autotune_key"})
        if unknown:
            raise KernelcampError(
                f"{section} {name!r}: unknown key(s) {unknown}; a list variant has name, configs, autotune_key"
            )
        configs = raw["configs"]
        if not configs:
            raise KernelcampError(f"{section} {name!r}: configs is empty; give at least one config")
        parsed = tuple(parse_config(c, f"{section}.configs.{i}") for i, c in enumerate(configs))
        key = tuple(raw.get("autotune_key") or ("B",))
        bad = [k for k in key if k not in AUTOTUNE_KEYS]
        if bad:
            raise KernelcampError(
                f"{section}.autotune_key {bad}: the kernel's autotune key may use {list(AUTOTUNE_KEYS)}"
            )
        return Variant(name, parsed, key, is_list=True)
    if "autotune_key" in raw:
        raise KernelcampError(
            f"{section} {name!r} is a single config, so autotune_key does not apply: remove it, "
            f"or give a list under {section}.configs"
        )
    body = {k: v for k, v in raw.items() if k not in _META_FIELDS}
    return Variant(name, (parse_config(body, section),), (), is_list=False)

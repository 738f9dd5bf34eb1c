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

or a batch table: a list whose configs carry ``max_batch`` (every row but the last, strictly
increasing; the last row, without it, takes every larger batch). The launcher runs the first row with
``B <= max_batch``: chosen on the host from the batch size, with no autotuning, so it is safe under
CUDA-graph capture (a captured graph has one batch size)::

    name: tuned_deepseek_v32
    configs:
      - {max_batch: 8, BLOCK_T: 16, BLOCK_H: 64, num_warps: 8, num_stages: 2, num_splits: auto}
      - {BLOCK_T: 32, BLOCK_H: 64, num_warps: 8, num_stages: 2, num_splits: 2}

A config with ``warp_specialize: true`` runs a warp-specialized split kernel (Gluon, sm90 only;
kernels/sparse_mla_decode.py) instead of the Triton one: its tile sizes are that kernel's (BLOCK_T 32, BLOCK_H 64 on
the V3.2 and V4 layouts; BLOCK_T 64, BLOCK_H 16 for V3.2 at 16 heads a program, the H=16 kernel; num_stages 2: the
depth of its cp.async staging ring, 3 allowed on V4) and ``num_warps`` is the program's 12 warps (two consumer
warpgroups and a producer warpgroup); its label ends in ``_ws``.

Mixing the two (a top-level launch field on a list variant, e.g. ``-S +variant.num_warps=8``) or a
key the kernel does not take is rejected with a message that says what to write instead
(DESIGN.md: an override is never silently ignored).

The baseline (any of the three shapes) may also set ``kernel_rev``: a git commit whose file of
``kernel.module`` it runs instead of the working tree's (``-S baseline.kernel_rev=<sha>``;
:mod:`kernelcamp.kernel_rev`); null (the default, conf/config.yaml) runs the working tree's. It is
baseline-only: the candidate always runs the working tree's kernel, so a non-null ``variant.kernel_rev``
is refused. Parsed here as the string given; the run spec (:mod:`kernelcamp.spec`) resolves it to the
full commit sha, which is what :meth:`Variant.as_dict` and :meth:`Variant.config_hash` then carry.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from kernelcamp.errors import KernelcampError, as_written

#: A name that reaches a report heading, a plot label, an MLflow param and a file name (a variant's, a
#: workload's, a server flag set's): letters, digits and ``_ . + -``, as conf/'s file names are.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


#: The longest name: it becomes a file name (``conf/<group>/<name>.yaml``, a campaign folder), which most file
#: systems cap at 255 bytes, and an MLflow run name; a 300-character variant name passed the spec and then
#: failed the report's file lookup (ENAMETOOLONG).
NAME_MAX_CHARS = 100


def check_name(where: str, name: str) -> None:
    """Raise ``KernelcampError`` naming ``where`` when ``name`` is not a :data:`NAME_RE` name of at most
    :data:`NAME_MAX_CHARS` characters."""
    if not NAME_RE.fullmatch(name):
        raise KernelcampError(
            f"{where} = {name!r}: a name is letters, digits and _ . + - (it names files, report headings "
            "and MLflow params); rename it"
        )
    if len(name) > NAME_MAX_CHARS:
        raise KernelcampError(
            f"{where} = {name[:40]!r}... ({len(name)} characters): a name is at most {NAME_MAX_CHARS} characters "
            "(it names files); shorten it"
        )


LAUNCH_FIELDS = ("BLOCK_T", "BLOCK_H", "num_warps", "num_stages", "num_splits", "warp_specialize")
AUTOTUNE_KEYS = ("B", "H", "topk")
_META_FIELDS = ("name", "kernel_rev")


@dataclass(frozen=True)
class LaunchConfig:
    """One launch config of the sparse MLA decode kernel.

    BLOCK_T: cache tokens per tile (>= 16: tensor-core dot dimension). BLOCK_H: query heads per
    program (>= 16). num_warps, num_stages: Triton launch options. num_splits: split-K factor over
    the top-k range, an int >= 1 or "auto" (chosen from the batch size and SM count at launch).
    warp_specialize: run the warp-specialized split kernel (module docstring); False for the Triton one.
    """

    BLOCK_T: int
    BLOCK_H: int
    num_warps: int
    num_stages: int
    num_splits: int | str = "auto"
    max_batch: int | None = None  # batch-table row: runs for B <= max_batch (None: not a table row / last row)
    warp_specialize: bool = False

    def label(self) -> str:
        """Short human label, e.g. ``T16_H16_w8_s2_kauto`` (a batch-table row: ``..._kauto_b8``)."""
        base = self.config_label()
        return base if self.max_batch is None else f"{base}_b{self.max_batch}"

    def config_label(self) -> str:
        """The label of the launch config alone, without a batch-table row's bound: ``T16_H16_w8_s2_kauto``
        for a row ``..._kauto_b8`` too (what :meth:`from_label` and ``bench_kernel.py --configs`` take); a
        warp-specialized config ends in ``_ws`` (``T32_H64_w12_s2_kauto_ws``)."""
        base = f"T{self.BLOCK_T}_H{self.BLOCK_H}_w{self.num_warps}_s{self.num_stages}_k{self.num_splits}"
        return f"{base}_ws" if self.warp_specialize else base

    @classmethod
    def from_label(cls, label: str) -> LaunchConfig:
        """The config of a :meth:`label` without a batch-table bound: ``T16_H16_w4_s2_kauto`` ->
        ``LaunchConfig(16, 16, 4, 2, "auto")``, ``T32_H64_w12_s2_kauto_ws`` -> the same with
        ``warp_specialize=True``. Raises ``ValueError`` (one line, with the expected form) for anything else."""
        parts = label.strip().split("_")
        ws = len(parts) == 6 and parts[5] == "ws"
        if ws:
            parts = parts[:5]
        try:
            if len(parts) != 5 or [p[0] for p in parts] != ["T", "H", "w", "s", "k"]:
                raise ValueError
            splits = parts[4][1:]
            return cls(
                int(parts[0][1:]),
                int(parts[1][1:]),
                int(parts[2][1:]),
                int(parts[3][1:]),
                "auto" if splits == "auto" else int(splits),
                warp_specialize=ws,
            )
        except ValueError:
            raise ValueError(
                f"config {label!r}: expected T<BLOCK_T>_H<BLOCK_H>_w<warps>_s<stages>_k<splits|auto>[_ws], "
                "e.g. T16_H16_w4_s2_kauto"
            ) from None

    def as_dict(self) -> dict[str, Any]:
        """The fields as a dict; ``max_batch`` only when set and ``warp_specialize`` only when true (so configs
        without them hash as before)."""
        d = asdict(self)
        if d["max_batch"] is None:
            del d["max_batch"]
        if not d["warp_specialize"]:
            del d["warp_specialize"]
        return d


@dataclass(frozen=True)
class Variant:
    """A named variant: its configs (one means no autotuning) and the autotune key.

    ``kernel_rev`` (baseline only): the git commit whose kernel file the variant runs, None for the
    working tree's (see the module docstring).
    """

    name: str
    configs: tuple[LaunchConfig, ...]
    autotune_key: tuple[str, ...] = ()
    is_list: bool = False
    kernel_rev: str | None = None

    @property
    def single(self) -> bool:
        return len(self.configs) == 1

    @property
    def is_table(self) -> bool:
        """A batch table (configs chosen by batch size on the host, never autotuned)."""
        return len(self.configs) > 1 and self.configs[0].max_batch is not None

    def config_for_batch(self, B: int) -> LaunchConfig:
        """The table row that runs batch size ``B`` (the first with ``B <= max_batch``, else the last).

        For a single config it is that config. Raises ``KernelcampError`` for an autotune list (the
        autotuner chooses there, not the batch size).
        """
        if self.single:
            return self.configs[0]
        if not self.is_table:
            raise KernelcampError(f"variant {self.name!r} is an autotune list, not a batch table")
        for c in self.configs[:-1]:
            if B <= c.max_batch:
                return c
        return self.configs[-1]

    def coverage(self, batch_sizes: list[int]) -> list[str]:
        """What a run at ``batch_sizes`` leaves unmeasured of a batch table (or of a single config, a table
        of one row): one line per row whose batch range holds none of them, or whose explicit split count
        (``num_splits`` an int) also runs batch sizes at or below half the smallest measured one in its
        range (the split count fixes ``B * heads * splits`` programs, so a count that fills the SMs at B can
        leave half of them idle at B/2: the TP8 table of step "table4" ran B=64 on its B=128 row 1.39x slower
        than before, reports/campaigns/kernel_speed/README.md). The last row's open range above the largest
        measured size is not counted. ``[]`` for an autotune list (its autotuner chooses per batch size) or
        when every row is covered."""
        if not (self.is_table or self.single):
            return []
        sizes = sorted({int(b) for b in batch_sizes if int(b) >= 1})
        out, lo = [], 1
        for i, c in enumerate(self.configs):
            hi = c.max_batch if i < len(self.configs) - 1 else None
            span = f"B={lo}" if hi == lo else f"B={lo}-{hi}" if hi is not None else f"B>={lo}"
            measured = [b for b in sizes if b >= lo and (hi is None or b <= hi)]
            if not measured:
                out.append(f"row {c.label()} runs {span}, none of them measured")
            elif not isinstance(c.num_splits, str) and lo <= measured[0] // 2:
                at = ", ".join(map(str, measured))
                half = measured[0] // 2
                low = f"B={lo}" if half == lo else f"B={lo}-{half}"
                out.append(
                    f"row {c.label()} runs {span} with {c.num_splits} splits at each, measured at B={at} only: "
                    f"{low} (half of B={measured[0]} or less) is not measured"
                )
            if hi is not None:
                lo = hi + 1
        return out

    def as_dict(self) -> dict[str, Any]:
        """Name, configs and autotune key; ``kernel_rev`` only when set (so variants without it hash as before)."""
        d: dict[str, Any] = {
            "name": self.name,
            "configs": [c.as_dict() for c in self.configs],
            "autotune_key": list(self.autotune_key),
        }
        if self.kernel_rev is not None:
            d["kernel_rev"] = self.kernel_rev
        return d

    def config_hash(self) -> str:
        """sha256 (16 hex) of the configs, autotune key and ``kernel_rev`` (when set), independent of the name."""
        payload: dict[str, Any] = {"configs": [c.as_dict() for c in self.configs], "key": list(self.autotune_key)}
        if self.kernel_rev is not None:
            payload["kernel_rev"] = self.kernel_rev
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]

    def restricted(self, keep: list[int]) -> Variant:
        """The same variant with only the configs at indices ``keep`` (e.g. those a target keeps)."""
        if not keep:
            raise KernelcampError(f"variant {self.name!r}: no config left to run")
        return replace(self, configs=tuple(self.configs[i] for i in keep))


def _check_int(where: str, field: str, value: Any, lo: int, pow2: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise KernelcampError(f"{where}.{field} = {as_written(value)}: expected an integer >= {lo}")
    if value < lo:
        raise KernelcampError(
            f"{where}.{field} = {value}: must be >= {lo}"
            + (" (tensor-core dot dimensions need at least 16)" if field.startswith("BLOCK") else "")
        )
    if pow2 and value & (value - 1):
        raise KernelcampError(f"{where}.{field} = {value}: must be a power of two (e.g. {lo}, {2 * lo}, {4 * lo})")
    return value


def parse_config(raw: Mapping[str, Any], where: str, in_list: bool = False) -> LaunchConfig:
    """Validate one config mapping. Raises ``KernelcampError`` naming the field and what to write.

    ``max_batch`` (a batch-table row's bound) is accepted only in a list (``in_list``).
    """
    allowed = LAUNCH_FIELDS + (("max_batch",) if in_list else ())
    unknown = sorted(set(raw) - set(allowed))
    if unknown:
        hint = (
            "" if in_list or "max_batch" not in unknown else " (max_batch belongs to a row of a batch table: configs)"
        )
        raise KernelcampError(f"{where}: unknown key(s) {unknown}; the kernel takes {list(allowed)}{hint}")
    ws = raw.get("warp_specialize", False)
    if not isinstance(ws, bool):
        raise KernelcampError(f"{where}.warp_specialize = {as_written(ws)}: expected true or false")
    missing = [f for f in LAUNCH_FIELDS[:4] if f not in raw]
    if missing:
        raise KernelcampError(
            f"{where}: missing {missing}; a config needs {list(LAUNCH_FIELDS[:4])} "
            "(num_splits defaults to auto, warp_specialize to false)"
        )
    splits = raw.get("num_splits", "auto")
    if splits != "auto":
        splits = _check_int(where, "num_splits", splits, 1)
    return LaunchConfig(
        BLOCK_T=_check_int(where, "BLOCK_T", raw["BLOCK_T"], 16, pow2=True),
        BLOCK_H=_check_int(where, "BLOCK_H", raw["BLOCK_H"], 16, pow2=True),
        # a warp-specialized program's warps are its three warpgroups (12), not a power of two
        num_warps=_check_int(where, "num_warps", raw["num_warps"], 1, pow2=not ws),
        num_stages=_check_int(where, "num_stages", raw["num_stages"], 1),
        num_splits=splits,
        max_batch=None if raw.get("max_batch") is None else _check_int(where, "max_batch", raw["max_batch"], 1),
        warp_specialize=ws,
    )


def _batch_table(name: str, rows: tuple[LaunchConfig, ...], raw: Mapping[str, Any], section: str) -> Variant:
    """Check a batch table's rows (see the module docstring) and return it as a variant."""
    if "autotune_key" in raw:
        raise KernelcampError(
            f"{section} {name!r} is a batch table (its configs set max_batch), so autotune_key does not apply: "
            "remove it, or remove max_batch from every config for an autotune list"
        )
    if len(rows) < 2:
        raise KernelcampError(
            f"{section} {name!r}: a batch table needs at least two rows; for one config drop max_batch"
        )
    for i, c in enumerate(rows[:-1]):
        if c.max_batch is None:
            raise KernelcampError(
                f"{section}.configs.{i}.max_batch is missing: in a batch table every row but the last sets max_batch"
            )
        if i and c.max_batch <= rows[i - 1].max_batch:
            raise KernelcampError(
                f"{section}.configs.{i}.max_batch = {c.max_batch}: must be larger than the row before "
                f"({rows[i - 1].max_batch}); rows go from small batches to large"
            )
    if rows[-1].max_batch is not None:
        raise KernelcampError(
            f"{section}.configs.{len(rows) - 1}.max_batch = {rows[-1].max_batch}: the last row of a batch table "
            "takes every larger batch, so it has no max_batch: remove it"
        )
    return Variant(name, rows, (), is_list=True)


def parse_variant(raw: Mapping[str, Any], section: str = "variant") -> Variant:
    """Parse the ``variant`` (or ``baseline``) section of params.yaml.

    Raises ``KernelcampError`` for a missing name or one outside ``NAME_RE``, a top-level launch field on a
    list variant, an unknown key, a bad value, an autotune key the kernel does not know, or a ``kernel_rev`` that is
    not a string or is set outside the baseline (see the module docstring).
    """
    if not isinstance(raw, Mapping):
        raise KernelcampError(f"{section} must be a mapping, got {type(raw).__name__}")
    name = raw.get("name")
    if not name or not isinstance(name, str):
        raise KernelcampError(f"{section}.name is missing: every file in conf/{section}/ sets name: <file name>")
    check_name(f"{section}.name", name)
    rev = _kernel_rev(raw, section)
    v = _parse_body(raw, section, name)
    return v if rev is None else replace(v, kernel_rev=rev)


def _kernel_rev(raw: Mapping[str, Any], section: str) -> str | None:
    """``kernel_rev`` as given (None when absent or null); refused on any section but the baseline."""
    rev = raw.get("kernel_rev")
    if rev is None:
        return None
    if section != "baseline":
        raise KernelcampError(
            f"{section}.kernel_rev = {as_written(rev)}: kernel_rev is baseline-only (the candidate always runs the "
            "working tree's kernel); set -S baseline.kernel_rev=<commit> instead"
        )
    if not isinstance(rev, str):
        raise KernelcampError(
            f"{section}.kernel_rev = {as_written(rev)}: expected a git commit as a string, e.g. its full 40-hex sha "
            "(YAML read this one as a number: quote it)"
        )
    return rev


def _parse_body(raw: Mapping[str, Any], section: str, name: str) -> Variant:
    """:func:`parse_variant` without ``kernel_rev``: one config, an autotune list or a batch table."""
    if "configs" in raw:
        top = sorted(set(raw) & set(LAUNCH_FIELDS))
        if top:
            f = top[0]
            raise KernelcampError(
                f"{section} {name!r} mixes top-level launch fields ({', '.join(top)}) with an autotune list "
                f"(configs): a single-config variant takes -S {section}.{f}=..., a list variant "
                f"(e.g. -S {section}=story_autotune) takes -S '{section}.configs.0.{f}=...'"
            )
        unknown = sorted(set(raw) - {"name", "configs", "autotune_key", "kernel_rev"})
        if unknown:
            raise KernelcampError(
                f"{section} {name!r}: unknown key(s) {unknown}; a list variant has name, configs, autotune_key"
            )
        configs = raw["configs"]
        if not configs:
            raise KernelcampError(f"{section} {name!r}: configs is empty; give at least one config")
        parsed = tuple(parse_config(c, f"{section}.configs.{i}", in_list=True) for i, c in enumerate(configs))
        if any(c.max_batch is not None for c in parsed):
            return _batch_table(name, parsed, raw, section)
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

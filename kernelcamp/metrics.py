"""The one naming scheme of metrics: DVC's metrics files and MLflow's metric keys use the same keys.

A key is a dotted path of snake_case segments::

    [cpu.]<group>[.<level>][.<impl>].<figure>

* ``group``: ``kernel``, ``serving``, ``step_model`` (figures timed on the device), ``verify``,
  ``build``, ``device`` (not timings).
* ``cpu.``: every timed figure (``kernel``, ``serving``, ``step_model``) measured on a CPU (Triton
  interpreter, embedded server on the CPU) starts with ``cpu.``, so that a CPU timing never sits in
  the column of a GPU one (DESIGN.md); the MLflow tag ``device`` says the same. Figures that are not
  timings (``verify.passed``, ``build.*``, ``device.is_gpu``) never take the prefix.
* ``level``: ``b<batch size>`` (kernel) or ``c<concurrency>`` (serving).
* ``impl``: ``baseline``, ``candidate``, or ``ab`` (the A/B result as the benchmark recorded it).
* ``figure``: DESIGN.md's name with its unit in it (``latency_us_p50``, ``output_tok_s``).

In a JSON file the keys are nested objects, ``{"kernel": {"ratio": 1.0}}``, which DVC shows as
``kernel.ratio``; MLflow gets the flat key. Decisions are numbers there
(``kernelcamp.stats.DECISION_CODES``: faster -1, inconclusive 0, slower 1, equivalent 2); the word
is the MLflow tag ``decision`` and is in the report.

The headline, ``reports/metrics.json`` (the only file ``dvc exp show`` lists) and the MLflow run's
metrics, is :func:`kernelcamp.report.headline_metrics`; the detail stays in plain outputs
(``reports/benchmark_metrics.json``, ``reports/build_metrics.json``, the stage records), with the same
names.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

#: Groups of figures timed on the device: these take the ``cpu.`` prefix on a CPU.
TIMED_GROUPS = ("kernel", "serving", "step_model")
#: Groups of figures that are not timings: never prefixed.
UNTIMED_GROUPS = ("verify", "build", "device")
_SEG = r"[a-z0-9][a-z0-9_]*"
#: Every metric key, in every metrics file and in MLflow, matches this.
KEY_RE = re.compile(rf"^(?:(?:cpu\.)?(?:{'|'.join(TIMED_GROUPS)})|(?:{'|'.join(UNTIMED_GROUPS)}))(?:\.{_SEG})+$")


def timed_prefix(device: str | None) -> str:
    """``""`` for figures timed on a GPU (``device == "cuda"``), ``"cpu."`` for anything else."""
    return "" if device == "cuda" else "cpu."


def serving_prefix(device: str | None, serving: Mapping[str, Any] | None) -> str:
    """:func:`timed_prefix` for serving figures: ``"cpu."`` also when the benchmark ran on a GPU machine but
    the server it measured ran on a CPU (``serving.scaled_for_cpu``, e.g. ``-S server.device=cpu``): its
    tok/s are a CPU server's, and were logged beside GPU figures under GPU names."""
    return "cpu." if (serving or {}).get("scaled_for_cpu") else timed_prefix(device)


def is_number(v: Any) -> bool:
    """A finite int or float that is not a bool (what a metric value may be)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")


def flatten(nested: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (how DVC names nested metrics)."""
    out: dict[str, Any] = {}
    for k, v in nested.items():
        if isinstance(v, Mapping):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    """``{"a.b": 1}`` -> ``{"a": {"b": 1}}``; values that are not finite numbers are left out.

    Raises ``ValueError`` when a key breaks the scheme (:data:`KEY_RE`) or is both a figure and a
    prefix of another key (``kernel.ratio`` beside ``kernel.ratio.x``).
    """
    out: dict[str, Any] = {}
    for key, v in flat.items():
        check_key(key)
        if not is_number(v):
            continue
        *path, leaf = key.split(".")
        node = out
        for seg in path:
            node = node.setdefault(seg, {})
            if not isinstance(node, dict):
                raise ValueError(f"metric key {key!r}: {seg!r} is already a figure")
        if isinstance(node.get(leaf), dict):
            raise ValueError(f"metric key {key!r} is also a prefix of other keys")
        node[leaf] = int(v) if isinstance(v, int) else float(v)
    return out


def segment(name: str) -> str:
    """A name (a target, a role) as one key segment: lower case, anything but ``[a-z0-9_]`` as ``_``."""
    seg = re.sub(r"[^a-z0-9_]", "_", str(name).lower())
    return seg if seg[:1].isalnum() else f"x{seg}"


def check_key(key: str) -> str:
    """Return ``key``; raise ``ValueError`` naming it when it does not follow the scheme."""
    if not KEY_RE.fullmatch(key):
        raise ValueError(f"metric key {key!r} does not follow the naming scheme (kernelcamp.metrics.KEY_RE)")
    return key

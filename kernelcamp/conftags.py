"""The MLflow tags a run takes from the conf/ files and the kernel source, besides params.yaml (:func:`tree_tags`).

``<section>_overrides`` says how a run's ``variant`` (``baseline``, ``workload``, ``server``) differs from the conf/
file its ``name`` names (:func:`conf_overrides`); ``variant_hash`` and ``baseline_hash`` hash the kernel source. A
pipeline run's first stage keeps them in its claim (:mod:`kernelcamp.runlock`), so that the record of a stage that
fails later, after one of those files was edited, is of what ran. Kept apart from :mod:`kernelcamp.tracking`, which
uses them, so that :func:`kernelcamp.spec.stage_spec` can compute them without importing MLflow's side; with them
:func:`differences`, which :func:`conf_overrides` and :mod:`kernelcamp.spec` both use.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from kernelcamp.errors import KernelcampError


def differences(mine: Any, theirs: Any, where: str = "", exact: bool = False) -> list[tuple[str, Any, Any]]:
    """Every dotted key (sorted; list items by index) where the JSON-like values ``mine`` and ``theirs``
    differ, with both values (``None`` for a key one side lacks). An int and the equal float are
    equal, as in JSON, unless ``exact`` (``4.0`` is then not ``4``: a conf's integer field refuses it); a bool
    is not an int."""
    if isinstance(mine, Mapping) and isinstance(theirs, Mapping):
        out = []
        for k in sorted(set(mine) | set(theirs), key=str):
            out += differences(mine.get(k), theirs.get(k), f"{where}.{k}" if where else str(k), exact)
        return out
    if isinstance(mine, list) and isinstance(theirs, list) and len(mine) == len(theirs):
        return [
            d
            for i, (a, b) in enumerate(zip(mine, theirs, strict=True))
            for d in differences(a, b, f"{where}.{i}", exact)
        ]
    same = mine == theirs and isinstance(mine, bool) == isinstance(theirs, bool)
    if exact:
        same = same and isinstance(mine, float) == isinstance(theirs, float)
    return [] if same else [(where, mine, theirs)]


def _deployed_hash(params: Mapping[str, Any]) -> str | None:
    """``kernelcamp.hashes.params_variant_hash`` of ``params`` (None where it cannot be computed)."""
    try:
        from kernelcamp.hashes import params_variant_hash

        return params_variant_hash(params)
    except (KernelcampError, ImportError, OSError):
        return None


#: Sections whose ``name`` is a tag and whose ``<section>_overrides`` tag says what ``-S`` changed from
#: the file of that name (:func:`conf_overrides`).
OVERRIDE_TAGS = ("variant", "baseline", "workload", "server")
#: The longest ``<section>_overrides`` tag (MLflow keeps 8,000 characters of a tag value).
OVERRIDES_TAG_CHARS = 1000


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` merged into ``base`` as Hydra merges a defaults list: mappings key by key, the rest replaced."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


def conf_file_value(section: str, name: str) -> dict[str, Any] | None:
    """What ``conf/<section>/<name>.yaml`` composes to, its defaults list merged first (an entry of
    the same group, ``deepseek_v32``, or another group's file at this package, ``/variant/x@_here_``,
    as the shipped files write them), or ``None`` when there is no such file.

    Deliberately not Hydra's composition (``kernelcamp.compose``, as ``kernelcamp inspect`` uses): that also
    applies the git-ignored ``conf/local/default.yaml``, whose settings are not in any versioned file and so must
    show in :func:`conf_overrides`' tags. ``tests/test_tracking.py`` checks this against Hydra for every shipped
    variant, baseline, workload and server file."""
    import yaml

    from kernelcamp.targets import conf_dir

    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.+-]+", name):
        return None
    path = conf_dir() / section / f"{name}.yaml"
    try:
        if not path.is_file():
            return None
    except OSError:  # a name too long for a file name (ENAMETOOLONG): no such file
        return None
    data = yaml.safe_load(path.read_text()) or {}
    out: dict[str, Any] = {}
    for d in data.pop("defaults", None) or []:
        m = re.fullmatch(r"(?:/([A-Za-z0-9_]+)/)?([A-Za-z0-9_.+-]+)(?:@_here_)?", d) if isinstance(d, str) else None
        if m and m.group(2) != "_self_":
            out = _deep_merge(out, conf_file_value(m.group(1) or section, m.group(2)) or {})
    return _deep_merge(out, data)


def conf_overrides(params: Mapping[str, Any], section: str) -> str:
    """The ``<section>`` tag's companion (variant, baseline, workload, server): how ``params[section]``
    differs from the conf file
    its ``name`` names, as ``key=value`` items (``num_warps=8``, ``configs.0.BLOCK_T=32``; a key the
    file lacks shows as added, one it has and params lack as ``key=null``), ``""`` when it is that
    file as it stands, ``"(no conf/<section>/<name>.yaml)"`` when no file has that name. A run of
    ``-S variant.num_warps=8`` was tagged ``variant=bt16_w4`` alone, the name of a file that did not run. A value
    is compared with its type: ``-S variant.num_warps=4.0`` (refused: not an integer) shows as ``num_warps=4.0``
    beside a file's 4, where it showed as ``""``."""
    raw = params.get(section)
    if not isinstance(raw, Mapping):
        return ""
    name = raw.get("name")
    file = conf_file_value(section, name)
    if file is None:
        return f"(no conf/{section}/{name}.yaml)"
    items = [f"{k}={json.dumps(mine, default=str)}" for k, mine, _ in differences(dict(raw), file, exact=True)]
    text = ", ".join(items)
    return text if len(text) <= OVERRIDES_TAG_CHARS else text[: OVERRIDES_TAG_CHARS - 3] + "..."


def tree_tags(params: Mapping[str, Any]) -> dict[str, Any]:
    """The tags of :func:`kernelcamp.tracking.run_tags` that read files of the tree besides params.yaml:
    ``variant_hash`` and ``baseline_hash`` (they hash the kernel source) and the ``<section>_overrides`` of
    :data:`OVERRIDE_TAGS` (against the conf/ files). A pipeline run's first stage keeps them in its claim
    (:func:`kernelcamp.runlock.run_tree_tags`), so that a stage that fails later, after the kernel or a conf/ file was
    edited (:func:`kernelcamp.runlock.inputs_sha256`), records those the run started with, not the edited files'."""
    tags: dict[str, Any] = {}
    for sec in ("variant", "baseline"):
        raw = params.get(sec)
        if isinstance(raw, Mapping):
            # the hash a server reports for it (configs, kernel source, server flags): one name, one meaning, as in
            # deploy.json and /v1/kernelcamp/info
            tags[f"{sec}_hash"] = _deployed_hash({**params, "variant": raw})
    for k in OVERRIDE_TAGS:  # "" when the named file ran as it stands (the target always does: kernelcamp.spec)
        tags[f"{k}_overrides"] = conf_overrides(params, k)
    return tags

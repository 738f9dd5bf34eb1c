"""The run spec: params.yaml parsed once per stage into typed, range-checked sections.

Every stage calls :func:`load_spec` first. It reads params.yaml (written by DVC's Hydra composition;
never composed here), checks every key's type and range against the dataclasses below (one
``KernelcampError`` line naming the key and what to write instead), parses the variant and the
baseline (:mod:`kernelcamp.variant`), and derives what every record must agree on:

* ``kernel_module``: the configured kernel (``kernel.module``), imported from *this* working tree
  (:func:`import_kernel`): a queued experiment runs in a temporary copy of the repo, and its stages
  must build, benchmark, verify and serve that copy's kernel, never the workspace's (``$DVC_ROOT``).
* ``variant_hash`` / ``baseline_hash``: :func:`kernelcamp.hashes.variant_hash` of each side (configs,
  kernel source, server flags): what the deployed server reports, what deploy, benchmark and verify
  record, and what the report checks before it logs anything (:meth:`RunSpec.check_record`).
* ``baseline.kernel_rev`` (optional): the git commit whose file of ``kernel.module`` the baseline
  runs (:mod:`kernelcamp.kernel_rev`), resolved here to the full sha (read-only git; refused with one
  line when git cannot resolve it or the file is not there). The sha replaces what was given in
  ``RunSpec.raw`` and in the baseline's configs hash, and the file's sha256 is the baseline's kernel
  source hash (``baseline_kernel_source_hash``; the working tree's when no rev is set): so
  ``baseline_hash`` and ``baseline_config_hash`` change with the rev, and every record names it.
  The candidate always runs the working tree's kernel. The serving A/B's baseline server cannot
  load another kernel file, so a rev with ``benchmark.serving`` measuring the baseline is refused.

The dataclasses are the schema: a field's type is checked strictly (an int field refuses ``4.0``
and ``true``; a float field takes an int), ``meta`` gives its range. Unknown keys are refused with
the closest known key named. The raw mapping stays available as ``RunSpec.raw`` for the library
functions that take params sections.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import json
import re
import sys
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kernelcamp.conftags import differences, tree_tags
from kernelcamp.errors import KernelcampError, as_written, url_shown
from kernelcamp.hashes import dvc_stage, kernel_path, kernel_source_hash, project_root, server_flags, variant_hash
from kernelcamp.io import sha256_text
from kernelcamp.kernel_rev import (
    REQUIRED_NAMES,
    KernelRev,
    check_kernel_api,
    import_kernel_rev,
    parse_kernel,
    resolve_kernel_rev,
)
from kernelcamp.ports import PORT_STRIDE, worker_port
from kernelcamp.variant import Variant, check_name, parse_variant

#: The kernel package every kernel module lives in; the DVC stages depend on the whole folder.
KERNEL_PACKAGE = "kernels"
_MODULE_RE = re.compile(rf"^{KERNEL_PACKAGE}\.[A-Za-z_][A-Za-z0-9_]*$")
#: A ``server.env`` key: a POSIX shell variable name, since it is exported on the ssh command line and
#: becomes an MLflow param key (where ``:`` or ``/`` would be rewritten or refused).
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: The longest time any ``*_s`` / ``max_seconds`` key may give: a week. Larger values overflow
#: ``time.sleep`` and ``threading`` timeouts (``OverflowError`` at 1e308) long after ``spec`` passed them.
MAX_SECONDS = 7 * 24 * 3600.0
#: Connections beside a serving level's own that the embedded server must accept while a level runs:
#: the benchmark's /info and /health probes and the clock sampler's. ``server.max_connections`` must
#: leave this much room above the highest concurrency level.
CONNECTION_HEADROOM = 8
#: Where a URL setting's secret goes instead of the URL (``url`` fields of the schema below): an environment
#: variable, which no record keeps. MLflow reads ``MLFLOW_TRACKING_USERNAME`` / ``_PASSWORD`` for a server
#: behind basic auth (MLflow's documentation, "Authentication with Username and Password",
#: https://mlflow.org/docs/3.5.0/self-hosting/security/basic-http-auth).
_SECRET_HOME = {
    "tracking.uri": "set $MLFLOW_TRACKING_USERNAME and $MLFLOW_TRACKING_PASSWORD instead",
    "deploy.url": "the server's key goes in $KERNELCAMP_API_KEY, which every request sends as a bearer token",
}
#: What build.json records of the run spec (and the later stages check it against): build depends on
#: the variant's configs and the kernel, not on the server flags that the deployed variant hash covers.
BUILD_KEYS = (
    "variant_config_hash",
    "baseline_config_hash",
    "target",
    "kernel_module",
    "kernel_source_hash",
    "baseline_kernel_rev",
    "baseline_kernel_source_hash",
)
#: What deploy.json, benchmark.json and verify.json are checked against.
DEPLOY_KEYS = ("variant_hash", "kernel_source_hash")
#: What the report checks benchmark.json and verify.json against: they ran the baseline too.
MEASURE_KEYS = (*DEPLOY_KEYS, "baseline_hash", "baseline_kernel_source_hash")


def _f(default: Any = dataclasses.MISSING, **meta: Any) -> Any:
    """A dataclass field with range metadata: ge, gt, le, lt, choices, pow2, unique, nonempty, name
    (``kernelcamp.variant.check_name``), multiline (a shell command: newlines and tabs allowed; every other
    string refuses control characters), url (no password in it: params.yaml, dvc.lock, MLflow's params and
    the records would all keep it)."""
    if isinstance(default, (list, dict)):
        value = default
        return field(default_factory=lambda: type(value)(value), metadata=meta)
    return field(default=default, metadata=meta)


# ------------------------------------------------------------------------------------------ schema


@dataclass(kw_only=True)
class KernelSpec:
    name: str = _f(name=True)
    module: str = _f()
    dot_dtype: str = _f("bf16", choices=("bf16", "fp16"))


#: The most cache tokens a run may name: top-k indices are int32 (the kernel's ``indices`` argument, as DeepSeek's
#: sparse attention passes them), so a cache row beyond 2**31 - 1 cannot be addressed.
MAX_CACHE_TOKENS = 2**31 - 1


@dataclass(kw_only=True)
class CpuModelSpec:
    num_layers: int = _f(ge=1, le=64)
    hidden_size: int = _f(ge=16)
    mlp_size: int = _f(ge=16)
    vocab_size: int = _f(ge=2)


@dataclass(kw_only=True)
class CpuWorkloadSpec:
    num_heads: int = _f(ge=1)
    topk: int = _f(ge=1)
    page_size: int = _f(ge=1)
    num_cache_tokens: int = _f(ge=1, le=MAX_CACHE_TOKENS)
    batch_sizes: list[int] = _f(ge=1, unique=True, nonempty=True)
    model: CpuModelSpec = _f()


@dataclass(kw_only=True)
class ModelSpec:
    num_layers: int = _f(ge=1, le=128)
    hidden_size: int = _f(ge=16)
    vocab_size: int = _f(ge=2)
    mlp_size: int = _f(ge=16)
    seed: int = _f(0, ge=0)
    greedy_margin: float = _f(8.0, ge=0)


@dataclass(kw_only=True)
class WorkloadSpec:
    name: str = _f(name=True)
    layout: str = _f(choices=("deepseek_v32", "deepseek_v4"))
    num_heads: int = _f(ge=1)
    topk: int = _f(ge=1)
    page_size: int = _f(ge=1)
    num_cache_tokens: int = _f(ge=1, le=MAX_CACHE_TOKENS)
    batch_sizes: list[int] = _f(ge=1, unique=True, nonempty=True)
    cpu: CpuWorkloadSpec = _f()
    model: ModelSpec = _f()
    sm_scale: float | None = _f(None, gt=0)


@dataclass(kw_only=True)
class ServerSpec:
    name: str = _f("default", name=True)
    host: str = _f("127.0.0.1", nonempty=True)
    port: int = _f(8765, ge=1, le=65535)
    cuda_graphs: bool = _f(True)
    graph_batch_buckets: list[int] = _f([1, 2, 4, 8, 16, 32, 64, 96], ge=1, unique=True, nonempty=True)
    max_running_requests: int = _f(96, ge=1)
    overlap_scheduling: bool = _f(False)
    engine_process: bool = _f(True)
    gc_freeze: bool = _f(True)
    max_context_tokens: int = _f(2048, ge=2)
    num_cache_tokens: int | None = _f(None, ge=1, le=MAX_CACHE_TOKENS)
    cpu_cache_tokens: int = _f(16384, ge=1, le=MAX_CACHE_TOKENS)
    device: str | None = _f(None)
    max_connections: int = _f(256, ge=1)  # kernelcamp.serve.openai.MAX_CONNECTIONS
    body_timeout_s: float = _f(30.0, gt=0, le=MAX_SECONDS)  # kernelcamp.serve.openai.BODY_TIMEOUT_S
    env: dict[str, Any] = _f({})
    args: list[str] = _f([])


@dataclass(kw_only=True)
class KernelBenchSpec:
    rounds: int = _f(ge=2)  # the maximum (kernelcamp.stats.SequentialPlan)
    min_rounds: int = _f(ge=2)
    look_every: int = _f(ge=1)
    max_seconds: float | None = _f(gt=0, le=MAX_SECONDS)  # null: no time budget
    replays_per_round: int = _f(ge=1)
    warmup: int = _f(ge=0)
    cpu_rounds: int = _f(ge=2)
    cpu_replays_per_round: int = _f(ge=1)
    batch_sizes: list[int] = _f(ge=1, unique=True, nonempty=True)


@dataclass(kw_only=True)
class ServingBenchSpec:
    enabled: bool = _f(True)
    concurrency: list[int] = _f(ge=1, unique=True, nonempty=True)
    max_tokens: int = _f(ge=1)
    timeout_s: float = _f(gt=0, le=MAX_SECONDS)
    measure_baseline: bool = _f(True)
    baseline_port_offset: int = _f(1, ge=1, le=PORT_STRIDE - 1)  # inside the worker's ports (kernelcamp.ports)
    warmup_s: float = _f(ge=0, le=MAX_SECONDS)
    window_s: float = _f(gt=0, le=MAX_SECONDS)
    repeats: int = _f(ge=2)  # the maximum
    min_repeats: int = _f(ge=2)
    max_seconds: float | None = _f(gt=0, le=MAX_SECONDS)  # null: no time budget
    cpu_concurrency: list[int] = _f(ge=1, unique=True, nonempty=True)
    cpu_max_tokens: int = _f(ge=1)
    cpu_warmup_s: float = _f(ge=0, le=MAX_SECONDS)
    cpu_window_s: float = _f(gt=0, le=MAX_SECONDS)
    cpu_repeats: int = _f(ge=2)


@dataclass(kw_only=True)
class ProfileSpec:
    enabled: bool = _f(True)
    decode_steps: int = _f(5, ge=1, le=1000)


@dataclass(kw_only=True)
class BenchmarkSpec:
    kernel: KernelBenchSpec = _f()
    serving: ServingBenchSpec = _f()
    profile: ProfileSpec = _f()
    run_as_target: str | None = _f(None)


@dataclass(kw_only=True)
class KernelVerifySpec:
    shapes: list[list[int]] = _f(ge=1, nonempty=True, triple=True)
    cpu_shapes: list[list[int]] = _f(ge=1, nonempty=True, triple=True)
    empty_slot_fraction: float = _f(0.1, ge=0, lt=1)


@dataclass(kw_only=True)
class ServingVerifySpec:
    enabled: bool = _f(True)
    concurrency: int | None = _f(None, ge=1)
    num_prompts: int = _f(ge=1)
    max_tokens: int = _f(ge=1)


@dataclass(kw_only=True)
class VerifySpec:
    kernel: KernelVerifySpec = _f()
    serving: ServingVerifySpec = _f()


@dataclass(kw_only=True)
class ReportSpec:
    threshold: float = _f(gt=0, lt=1)
    confidence: float = _f(gt=0.5, lt=1)


@dataclass(kw_only=True)
class TrackingSpec:
    uri: str | None = _f(None, url=True)
    experiment: str = _f("kernelcamp", nonempty=True)


@dataclass(kw_only=True)
class BuildSpec:
    also_targets: list[str] = _f([])


@dataclass(kw_only=True)
class DeploySpec:
    kind: str = _f(choices=("embedded", "command", "ssh"))
    health_timeout_s: float = _f(600.0, gt=0, le=MAX_SECONDS)
    poll_interval_s: float = _f(0.5, gt=0, le=MAX_SECONDS)
    port_free_timeout_s: float = _f(10.0, ge=0, le=MAX_SECONDS)
    # command
    url: str | None = _f(None, nonempty=True, url=True)
    kernel_dest: str | None = _f(None)
    launch: str | None = _f(None, multiline=True)
    stop: str | None = _f(None, multiline=True)
    # ssh
    host: str | None = _f(None, no_dash=True, nonempty=True)
    port: int | None = _f(None, ge=1, le=65535)
    user: str | None = _f(None, no_dash=True, nonempty=True)
    identity_file: str | None = _f(None)
    ssh_options: list[str] = _f([])
    remote_dir: str | None = _f(None, no_dash=True)
    restart: str | None = _f(None, multiline=True)


#: Sections parsed into the dataclasses above (variant, baseline and target have their own parsers).
SECTIONS: dict[str, type] = {
    "kernel": KernelSpec,
    "workload": WorkloadSpec,
    "server": ServerSpec,
    "deploy": DeploySpec,
    "benchmark": BenchmarkSpec,
    "verify": VerifySpec,
    "report": ReportSpec,
    "tracking": TrackingSpec,
    "build": BuildSpec,
}


# ---------------------------------------------------------------------------------------- checking


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(_type_name(a) for a in args) + " or null"
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        return "a mapping"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(tp, tp.__name__)


def _check_value(where: str, value: Any, tp: Any, meta: Mapping[str, Any]) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return _check_value(where, value, inner, meta)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, where)
    if origin is list:
        if not isinstance(value, list):
            raise KernelcampError(f"{where} = {as_written(value)}: expected {_type_name(tp)} (e.g. [1, 8])")
        if meta.get("nonempty") and not value:
            raise KernelcampError(f"{where} is empty: give at least one value")
        (inner,) = typing.get_args(tp)
        item_meta = {k: v for k, v in meta.items() if k not in ("unique", "nonempty", "triple")}
        out = [_check_value(f"{where}.{i}", v, inner, item_meta) for i, v in enumerate(value)]
        if meta.get("triple") and any(len(v) != 3 for v in out):
            raise KernelcampError(f"{where} = {as_written(value)}: each shape is [B, H, topk]")
        if meta.get("unique"):
            seen = [v for i, v in enumerate(out) if v in out[:i]]
            if seen:
                raise KernelcampError(f"{where} = {as_written(value)}: {seen[0]} appears twice; give each value once")
        return out
    if origin is dict:
        if not isinstance(value, Mapping):
            raise KernelcampError(f"{where} = {as_written(value)}: expected a mapping")
        return dict(value)
    ok = (
        (tp is bool and isinstance(value, bool))
        or (tp is int and isinstance(value, int) and not isinstance(value, bool))
        or (tp is float and isinstance(value, (int, float)) and not isinstance(value, bool))
        or (tp is str and isinstance(value, str))
    )
    if not ok:
        hint = " (write it without a decimal point)" if tp is int and isinstance(value, float) else ""
        raise KernelcampError(f"{where} = {as_written(value)}: expected {_type_name(tp)}{hint}")
    if tp is float:
        value = float(value)
        if value != value or value in (float("inf"), float("-inf")):
            raise KernelcampError(f"{where} = {as_written(value)}: expected a finite number")
    if "choices" in meta and value not in meta["choices"]:
        raise KernelcampError(f"{where} = {as_written(value)}: expected one of {list(meta['choices'])}")
    if tp is str:
        if meta.get("nonempty") and not value.strip():
            raise KernelcampError(f"{where} is empty: give a value")
        if meta.get("no_dash") and value.startswith("-"):
            raise KernelcampError(f"{where} = {value!r}: must not start with '-' (it would reach ssh as an option)")
        if meta.get("name"):
            check_name(where, value)
        if meta.get("url") and url_shown(value) != value:
            raise KernelcampError(
                f"{where} = {url_shown(value)!r}: holds a password, which params.yaml, dvc.lock, MLflow and the "
                f"records would keep; {_SECRET_HOME.get(where, 'leave it out of the URL')}"
            )
        _check_control_chars(where, value, "\n\t" if meta.get("multiline") else "")
        return value
    for key, test, words in (
        ("ge", lambda v, b: v >= b, ">="),
        ("gt", lambda v, b: v > b, ">"),
        ("le", lambda v, b: v <= b, "<="),
        ("lt", lambda v, b: v < b, "<"),
    ):
        if key in meta and not test(value, meta[key]):
            raise KernelcampError(f"{where} = {as_written(value)}: must be {words} {meta[key]}")
    if meta.get("pow2") and value & (value - 1):
        raise KernelcampError(f"{where} = {value}: must be a power of two")
    return value


def _check_control_chars(where: str, value: Any, allowed: str = "") -> None:
    """Raise ``KernelcampError`` naming ``where`` when ``str(value)`` holds a control character (below 32,
    or DEL) other than those in ``allowed``."""
    bad = [c for c in str(value) if (ord(c) < 32 or ord(c) == 127) and c not in allowed]
    if bad:
        raise KernelcampError(f"{where} = {value!r}: holds a control character ({bad[0]!r}); remove it")


def _conf_home(where: str) -> str:
    """Where a params section is written in conf/: its group folder (``conf/verify/``), or conf/config.yaml
    for a section that has none (``report``: the error said "see conf/report/", which does not exist)."""
    from kernelcamp.targets import conf_dir

    section = where.split(".")[0]
    return f"conf/{section}/" if (conf_dir() / section).is_dir() else "conf/config.yaml"


def _build(cls: type, raw: Any, where: str) -> Any:
    """Instantiate dataclass ``cls`` from mapping ``raw``, checking every field (see module docstring)."""
    if not isinstance(raw, Mapping):
        raise KernelcampError(f"{where} = {as_written(raw)}: expected a mapping (see {_conf_home(where)})")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = [k for k in raw if k not in fields]
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), list(fields), n=1)
        hint = f"; did you mean {where}.{close[0]}?" if close else f"; known keys: {', '.join(fields)}"
        raise KernelcampError(f"{where}.{unknown[0]} is not a known key{hint}")
    kwargs = {}
    for name, f in fields.items():
        key = f"{where}.{name}"
        if name not in raw:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                if typing.get_origin(hints[name]) in (typing.Union, types.UnionType):
                    kwargs[name] = None
                    continue
                raise KernelcampError(f"{key} is missing: set it in conf/ (see {_conf_home(where)})")
            continue
        if raw[name] == "???":
            raise KernelcampError(f"{key} is required (??? in conf/): set it, e.g. -S {key}=...")
        kwargs[name] = _check_value(key, raw[name], hints[name], f.metadata)
    return cls(**kwargs)


def parse_section(cls: type, raw: Any, where: str) -> Any:
    """Check mapping ``raw`` against dataclass ``cls`` as every params section is checked (types strictly,
    ``meta`` ranges, unknown keys refused with the closest one named); ``where`` names it in messages.

    Raises ``KernelcampError`` (one line naming the key) on any bad value."""
    return _build(cls, raw, where)


# ------------------------------------------------------------------------------------------ kernel


def check_kernel_module(module: str, root: Path | None = None) -> Path:
    """Check ``kernel.module`` names a file of this tree's ``kernels/`` folder; return its path.

    Raises ``KernelcampError`` for another package (the DVC stages depend on ``kernels/`` only, so
    a kernel elsewhere could change without any stage rerunning) or a missing file.
    """
    if not isinstance(module, str) or not _MODULE_RE.fullmatch(module):
        raise KernelcampError(
            f"kernel.module = {module!r}: a kernel module is a file of kernels/, named kernels.<file> "
            "(e.g. kernels.sparse_mla_decode), so that the DVC stages depend on it"
        )
    path = kernel_path(module, root)
    if not path.is_file():
        raise KernelcampError(f"kernel.module = {module!r}: {path} does not exist")
    return path


def check_kernel_file(module: str, root: Path | None = None) -> Path:
    """:func:`check_kernel_module`, then the check ``baseline.kernel_rev``'s file gets
    (:func:`kernelcamp.kernel_rev.check_kernel_api`): the file parses and defines what build, benchmark and verify
    call. ``-S kernel.module=kernels.__init__`` passed spec, was locked in dvc.lock and failed only in build. Returns
    the file's path; raises ``KernelcampError`` naming ``kernel.module``."""
    path = check_kernel_module(module, root)
    where, default = f"kernel.module = {module!r}: {module.replace('.', '/')}.py", "kernels.sparse_mla_decode"
    tree = parse_kernel(path.read_bytes(), where)
    api = ", ".join(REQUIRED_NAMES)
    check_kernel_api(tree, where, "the kernel", f"name a kernel file of kernels/ that defines {api}, e.g. {default}")
    return path


def import_kernel(module: str) -> types.ModuleType:
    """Import kernel module ``module`` from this working tree, never from another copy of the repo.

    A queued experiment runs in a temporary copy while the package may be installed (editable) from
    the workspace, and ``$DVC_ROOT`` names the workspace: both would hand the stage the workspace's
    kernel, edited after queuing. This puts this tree first on ``sys.path`` and checks the imported
    file. Raises ``KernelcampError`` when the module is not a file of this tree's ``kernels/``, fails
    to import, or was imported from elsewhere.
    """
    path = check_kernel_module(module)
    root = str(project_root())
    if sys.path[:1] != [root]:
        sys.path.insert(0, root)
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any import failure of a user kernel is one line
        raise KernelcampError(f"cannot import kernel module {module!r}: {type(e).__name__}: {e}") from e
    got = Path(getattr(mod, "__file__", "") or "").resolve()
    if got != path.resolve():
        raise KernelcampError(
            f"kernel module {module!r} was imported from {got}, not from this tree ({path}): "
            "run the stage from the repo it belongs to"
        )
    return mod


IMPLS = ("candidate", "baseline")


def kernel_for(params: Mapping[str, Any], impl: str) -> types.ModuleType:
    """The kernel module side ``impl`` runs, from params.yaml's ``kernel`` and ``baseline`` sections.

    ``impl``: ``"candidate"`` (or ``"variant"``, the build's name for it): the working tree's
    (:func:`import_kernel`); ``"baseline"``: the file at ``baseline.kernel_rev`` when it is set
    (:func:`kernelcamp.kernel_rev.import_kernel_rev`, a module of its own), else the working tree's.
    Raises ``KernelcampError`` as those do, ``ValueError`` for another ``impl``.
    """
    if impl not in (*IMPLS, "variant"):
        raise ValueError(f"impl {impl!r}: expected one of {IMPLS}")
    module = params["kernel"]["module"]
    rev = (params.get("baseline") or {}).get("kernel_rev") if impl == "baseline" else None
    return import_kernel(module) if rev is None else import_kernel_rev(module, rev)


# ---------------------------------------------------------------------------------------- run spec


@dataclass(kw_only=True)
class RunSpec:
    """params.yaml, parsed and checked once. Sections are typed dataclasses; ``raw`` is the mapping."""

    path: Path
    raw: dict[str, Any]
    params_sha256: str
    variant: Variant
    baseline: Variant | None
    target: Any
    kernel: KernelSpec
    workload: WorkloadSpec
    server: ServerSpec
    deploy: DeploySpec
    benchmark: BenchmarkSpec
    verify: VerifySpec
    report: ReportSpec
    tracking: TrackingSpec
    build: BuildSpec
    kernel_file: Path
    kernel_source_hash: str
    variant_hash: str
    baseline_hash: str | None
    baseline_kernel: KernelRev | None = None  # baseline.kernel_rev, resolved (None: the working tree's kernel)
    root: Path | None = None  # the working tree (None: this one, project_root())

    @property
    def baseline_kernel_source_hash(self) -> str | None:
        """sha256 of the kernel file the baseline runs: the file at ``baseline.kernel_rev``, else the working tree's."""
        if self.baseline is None:
            return None
        return self.baseline_kernel.source_hash if self.baseline_kernel else self.kernel_source_hash

    def kernel_module(self, role: str = "candidate") -> types.ModuleType:
        """The kernel module ``role`` runs: ``"candidate"``/``"variant"``: this tree's (:func:`import_kernel`);
        ``"baseline"``: the file at ``baseline.kernel_rev`` when set (:mod:`kernelcamp.kernel_rev`)."""
        if role == "baseline" and self.baseline_kernel is not None:
            return import_kernel_rev(self.kernel.module, self.baseline_kernel.sha, root=self.root)
        return kernel_for(self.raw, role)

    def hashes(self) -> dict[str, Any]:
        """What the records carry so that the report can check them against the params it logs.

        ``variant_hash`` / ``baseline_hash`` cover the server flags (deploy, benchmark, verify);
        ``variant_config_hash`` and the kernel's module and source hash are what build depends on.
        ``kernel_source_hash`` is the candidate's (the working tree's file); ``baseline_kernel_rev`` the
        full sha of ``baseline.kernel_rev`` (None: the baseline runs the working tree's file too) and
        ``baseline_kernel_source_hash`` the sha256 of the file the baseline runs.
        """
        return {
            "variant_hash": self.variant_hash,
            "baseline_hash": self.baseline_hash,
            "variant_config_hash": self.variant.config_hash(),
            "baseline_config_hash": self.baseline.config_hash() if self.baseline else None,
            "target": self.target.name,
            "kernel_module": self.kernel.module,
            "kernel_source_hash": self.kernel_source_hash,
            "baseline_kernel_rev": self.baseline_kernel.sha if self.baseline_kernel else None,
            "baseline_kernel_source_hash": self.baseline_kernel_source_hash,
        }

    def stage_params(self, stage: str) -> dict[str, Any]:
        """The params a stage depends on, as this run gives them: :func:`stage_params` of ``self.raw``."""
        return stage_params(self.raw, stage)

    def check_stage_params(self, what: str, record: Mapping[str, Any], stage: str) -> None:
        """Raise ``KernelcampError`` naming the first key whose value ``record`` (written by ``stage``)
        was made with that this run's params do not give. The hashes leave out most of what a stage
        reads (``benchmark.kernel.cpu_rounds``, ``workload.cpu.batch_sizes``, ``verify.*``): a forced
        report-only rerun after params changed logged params beside metrics measured with others."""
        theirs = record.get("stage_params")
        if not isinstance(theirs, Mapping):
            raise KernelcampError(
                f"{what} does not record the params it ran with (stage_params; written by an older kernelcamp): "
                "rerun the pipeline (dvc exp run)"
            )
        diff = first_difference(self.stage_params(stage), theirs)
        if diff is not None:
            key, mine, was = diff
            raise KernelcampError(
                f"{what} was made with {key} = {dumps(was)} but params.yaml gives {dumps(mine)}: its figures are not "
                f"of the params this run records (params.yaml changed since the {stage} stage ran); rerun the "
                "pipeline (dvc exp run, or dvc repro) instead of forcing a later stage"
            )

    def check_record(self, what: str, record: Mapping[str, Any], keys: tuple[str, ...] = ("variant_hash",)) -> None:
        """Raise ``KernelcampError`` naming both values when ``record`` (e.g. deploy.json) disagrees
        with this spec on any of ``keys`` (a key the record lacks counts as a disagreement)."""
        mine = self.hashes()
        for key in keys:
            theirs = record.get(key)
            if theirs != mine[key]:
                raise KernelcampError(
                    f"{what} has {key} {theirs} but params.yaml gives {mine[key]}: it measured something other "
                    "than the params this run records (params.yaml changed during the run, or a stage is stale); "
                    "rerun the pipeline (dvc exp run)"
                )


def stage_param_keys(stage: str) -> list[str]:
    """The ``params`` keys of ``stage`` in the ``dvc.yaml`` beside this code (a queued experiment's copy
    included), e.g. ``["variant", "benchmark", "report.threshold"]``: what DVC reruns the stage for.
    Raises ``KernelcampError`` when dvc.yaml is unreadable or has no such stage (:func:`dvc_stage`)."""
    return [k for k in dvc_stage(stage).get("params") or [] if isinstance(k, str)]


def stage_params(raw: Mapping[str, Any], stage: str) -> dict[str, Any]:
    """``{key: value}`` for each of :func:`stage_param_keys` ``(stage)`` in the params mapping ``raw``
    (a dotted key is looked up section by section; ``None`` where absent). Stages record this
    (``stage_params``) so that the report can check their records against the params it logs."""
    out: dict[str, Any] = {}
    for key in stage_param_keys(stage):
        node: Any = raw
        for part in key.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        out[key] = json.loads(json.dumps(node, default=str))  # as the JSON record will hold it
    return out


def first_difference(mine: Any, theirs: Any) -> tuple[str, Any, Any] | None:
    """The first of :func:`differences` ``(mine, theirs)``, or ``None`` when the values are equal."""
    d = differences(mine, theirs)
    return d[0] if d else None


def parse_spec(
    raw: Mapping[str, Any], path: Path | str = "params.yaml", text: str | None = None, root: Path | None = None
) -> RunSpec:
    """Check and parse a params mapping (see :func:`load_spec`). ``root``: the working tree whose
    ``kernels/`` and git history the kernel comes from (default: this one)."""
    from kernelcamp.targets import check_target_section

    if not isinstance(raw, Mapping):
        raise KernelcampError(f"{path} is not a mapping: regenerate it with `make params`")
    for name in ("variant", "kernel", "target", "workload"):
        if name not in raw:
            raise KernelcampError(f"params.yaml has no `{name}` section: check conf/config.yaml's defaults list")
    sections = {}
    for name, cls in SECTIONS.items():
        sections[name] = _build(cls, raw[name] if name in raw else {}, name)
    # `launcher` is how `kernelcamp sweep` runs jobs, never what a stage does: checked by
    # kernelcamp.launcher when a sweep starts, not here, so no launcher setting can stop a run.
    known = set(SECTIONS) | {"variant", "baseline", "target", "launcher"}
    extra = [k for k in raw if k not in known]
    if "local" in extra:  # conf/local/default.yaml without its header lands under `local:`
        raise KernelcampError(
            "params.yaml has a section 'local': conf/local/default.yaml needs `# @package _global_` as its first "
            "line, so that its keys (e.g. server.port) set the run's own sections"
        )
    if extra:
        raise KernelcampError(f"params.yaml has an unknown section {extra[0]!r}: known sections are {sorted(known)}")
    _check_across_keys(sections)
    variant = parse_variant(raw["variant"], "variant")
    baseline = parse_variant(raw["baseline"], "baseline") if raw.get("baseline") else None
    target = check_target_section(raw["target"])
    _check_against_target(variant, "variant", target)
    _check_against_workload(variant, "variant", sections["workload"])
    if baseline is not None:
        _check_against_target(baseline, "baseline", target)
        _check_against_workload(baseline, "baseline", sections["workload"])
    kspec: KernelSpec = sections["kernel"]
    kfile = check_kernel_file(kspec.module, root)  # what the stages call on it, as for baseline.kernel_rev's file
    ksha = kernel_source_hash({"module": kspec.module}, root)  # as deploy and the server hash it
    flags = server_flags(raw.get("server"))
    text = text if text is not None else yaml.safe_dump(dict(raw), sort_keys=True)
    out = dict(raw)
    brev, bsha = None, ksha
    if baseline is not None and baseline.kernel_rev is not None:
        brev = resolve_kernel_rev(baseline.kernel_rev, kspec.module, root)  # a rev naming no commit: said first
        _check_serving_with_kernel_rev(baseline.kernel_rev, sections["benchmark"])
        baseline, bsha = dataclasses.replace(baseline, kernel_rev=brev.sha), brev.source_hash
        out["baseline"] = {**raw["baseline"], "kernel_rev": brev.sha}  # the commit, never a branch name
    return RunSpec(
        path=Path(path),
        raw=out,
        params_sha256=sha256_text(text),
        variant=variant,
        baseline=baseline,
        target=target,
        kernel_file=kfile,
        kernel_source_hash=ksha,
        variant_hash=variant_hash(variant, ksha, flags),
        baseline_hash=variant_hash(baseline, bsha, flags) if baseline is not None else None,
        baseline_kernel=brev,
        root=root,
        **sections,
    )


def _check_serving_with_kernel_rev(rev: str, bench: BenchmarkSpec) -> None:
    """The serving A/B's baseline server runs the working tree's kernel (the embedded server takes one
    kernel module, ``kernel.module``): with ``baseline.kernel_rev`` it would measure the wrong baseline."""
    if bench.serving.enabled and bench.serving.measure_baseline:
        raise KernelcampError(
            f"baseline.kernel_rev = {rev!r} with benchmark.serving.enabled: the serving A/B's baseline server "
            "can only run the working tree's kernel, not the file at that commit; set -S benchmark.serving.enabled"
            "=false (kernel A/B only) or -S benchmark.serving.measure_baseline=false (serving: candidate only)"
        )


def _check_across_keys(sections: Mapping[str, Any]) -> None:
    """Checks that involve two keys or more than a type and a range: a minimum never above its maximum,
    then :func:`_check_server`, :func:`_check_ports`, :func:`_check_embedded_server`, :func:`_check_targets`,
    :func:`_check_deploy`, :func:`_check_tracking` and :func:`check_workload`. Each raises
    ``KernelcampError`` naming the key."""
    bk, sv = sections["benchmark"].kernel, sections["benchmark"].serving
    for where, lo, hi, hi_name in (
        ("benchmark.kernel.min_rounds", bk.min_rounds, bk.rounds, "benchmark.kernel.rounds"),
        ("benchmark.serving.min_repeats", sv.min_repeats, sv.repeats, "benchmark.serving.repeats"),
    ):
        if lo > hi:
            raise KernelcampError(f"{where} = {lo}: must be <= {hi_name} ({hi}), the maximum")
    _check_server(sections["server"])
    _check_ports(sections["server"])
    _check_embedded_server(sections)
    _check_targets(sections["build"], sections["benchmark"])
    _check_deploy(sections["deploy"])
    _check_tracking(sections["tracking"])
    check_workload(sections["workload"])


def _check_server(server: ServerSpec) -> None:
    """``server.env``: shell variable names, values a string or a number (exported as text on this
    machine and on the ssh host, logged as MLflow params); ``server.args``: none of the options the deploy sets
    (:func:`kernelcamp.serve.options.check_server_args`; the embedded server's are checked whole by
    :func:`_check_embedded_server`)."""
    from kernelcamp.serve.options import check_server_args

    for key, value in server.env.items():
        if not isinstance(key, str) or not ENV_NAME_RE.fullmatch(key):
            raise KernelcampError(
                f"server.env key {key!r}: an environment variable name is letters, digits and _, "
                "not starting with a digit (e.g. NCCL_DEBUG)"
            )
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise KernelcampError(
                f"server.env.{key} = {as_written(value)}: give a string or a number; quote a flag "
                "('1', 'true'), since YAML reads yes/no/true as booleans and null as nothing"
            )
        _check_control_chars(f"server.env.{key}", value)
    check_server_args(server.args, embedded=False)


def _check_ports(server: ServerSpec) -> None:
    """The ports this run may use (``server.port`` up to ``PORT_STRIDE - 1`` above it, a sweep worker's
    the same above its own base: :mod:`kernelcamp.ports`) all exist, i.e. are <= 65535."""
    top = worker_port(server.port) + PORT_STRIDE - 1
    if top > 65535:
        whose = "this sweep worker's base port" if top - server.port >= PORT_STRIDE else "it"
        raise KernelcampError(
            f"server.port = {server.port}: this run may use ports up to {top} (the server's fallbacks and the "
            f"serving baseline's, up to {PORT_STRIDE - 1} above {whose}), beyond 65535; "
            f"use at most {65535 - (top - server.port)}"
        )


def _check_embedded_server(sections: Mapping[str, Any]) -> None:
    """With the embedded server, ``server.host``, ``server.device`` and ``server.args`` are what the deploy's
    ``kernelcamp serve`` command line takes (:func:`kernelcamp.serve.options.check_serve_settings`, the check the
    deploy makes again before it stops a running server: a host this machine cannot listen on, ``device:
    bogus`` or ``args: [--workers=4]`` failed only there, after the good server was stopped), every
    ``max_tokens`` plus the load generator's prompt fits ``server.max_context_tokens`` (the server refuses a
    request that does not: every request of a level would fail with HTTP 400 after the deploy succeeded), and
    ``server.max_connections`` is above every concurrency level the benchmark and verify open (past it the
    server answers 503)."""
    if sections["deploy"].kind != "embedded":
        return  # another server's host, device, options, context and connection limit are its own
    from kernelcamp.serve.options import check_serve_settings

    server = sections["server"]
    check_serve_settings(server.host, server.device, server.args)
    sv, vs = sections["benchmark"].serving, sections["verify"].serving
    cap = sections["server"].max_connections
    for where, levels in (
        ("benchmark.serving.concurrency", sv.concurrency),
        ("benchmark.serving.cpu_concurrency", sv.cpu_concurrency),
        ("verify.serving.concurrency", [vs.concurrency or 0]),
    ):
        if max(levels) + CONNECTION_HEADROOM > cap:
            raise KernelcampError(
                f"{where} = {as_written(levels if len(levels) > 1 else levels[0])}: a level of {max(levels)} "
                f"needs server.max_connections >= {max(levels) + CONNECTION_HEADROOM} (the level's requests and "
                f"{CONNECTION_HEADROOM} for the probes), it is {cap}; raise it"
            )
    from kernelcamp.serve.client import DEFAULT_PROMPT_WORDS

    ctx = sections["server"].max_context_tokens
    for where, n in (
        ("benchmark.serving.max_tokens", sv.max_tokens),
        ("benchmark.serving.cpu_max_tokens", sv.cpu_max_tokens),
        ("verify.serving.max_tokens", vs.max_tokens),
    ):
        if n + DEFAULT_PROMPT_WORDS > ctx:
            raise KernelcampError(
                f"{where} = {n}: with the {DEFAULT_PROMPT_WORDS}-token prompts it exceeds server.max_context_tokens "
                f"({ctx}); use at most {ctx - DEFAULT_PROMPT_WORDS} or raise server.max_context_tokens"
            )


def _check_targets(build: BuildSpec, bench: BenchmarkSpec) -> None:
    """``build.also_targets`` and ``benchmark.run_as_target`` name files of ``conf/target/``."""
    from kernelcamp.targets import named_targets

    known = named_targets()
    names = [(f"build.also_targets.{i}", t) for i, t in enumerate(build.also_targets)]
    if bench.run_as_target is not None:
        names.append(("benchmark.run_as_target", bench.run_as_target))
    for where, name in names:
        if name not in known:
            raise KernelcampError(f"{where} = {name!r}: not a target of conf/target/; choose one of {known}")


def _check_deploy(deploy: DeploySpec) -> None:
    """For ``deploy.kind: ssh``: host, user and ``remote_dir`` as the ssh deploy checks them when it runs
    (``kernelcamp.deploy.ssh.check_ssh_args``: no option-like values, a plain remote path)."""
    if deploy.kind != "ssh":
        return
    from kernelcamp.deploy.ssh import check_ssh_args

    check_ssh_args(deploy.host, deploy.user, deploy.remote_dir, prefix="deploy.")


def _check_tracking(tracking: TrackingSpec) -> None:
    """``tracking.uri``: :func:`check_tracking_uri`."""
    if tracking.uri:
        check_tracking_uri(tracking.uri)


def check_tracking_uri(uri: str, where: str = "tracking.uri") -> None:
    """A local MLflow store must be a SQLite file named by an absolute path (``sqlite:////abs/mlflow.db``): a queued
    experiment runs in a temporary copy that DVC deletes, so a relative store would go with it (and MLflow refuses
    some relative forms with errors of its own); and MLflow's file store (a bare path, ``file:``) refuses to open
    (MLflow 3.17, the version pinned) ("The filesystem tracking backend ... is in maintenance mode",
    mlflow.store.tracking.file_store) unless ``MLFLOW_ALLOW_FILE_STORE=true`` is set, in which case an absolute one
    passes. Servers (``http:`` ...) pass. ``where`` names the setting in the message
    (``kernelcamp.tracking.tracking_uri`` checks ``MLFLOW_TRACKING_URI`` with it too). A local store must also be
    outside the pipeline's output folders, a SQLite one in a folder that exists (:func:`_check_store_place`). Raises
    ``KernelcampError``."""
    import os

    scheme, sep, rest = uri.partition(":")
    if not sep:  # a bare path
        path = uri
    elif scheme == "sqlite":
        path = rest[3:] if rest.startswith("///") else None
        if path is None:
            raise KernelcampError(f"{where} = {uri!r}: a SQLite store is sqlite:////absolute/path/mlflow.db")
    elif scheme == "file":
        path = rest[2:] if rest.startswith("//") else rest
    else:
        return  # a server (http, https, databricks, ...)
    if scheme != "sqlite" and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("true", "1"):
        raise KernelcampError(
            f"{where} = {uri!r}: MLflow's file store (a folder) is in maintenance mode and refuses to open (MLflow "
            "3.17); give a SQLite store, sqlite:////absolute/path/mlflow.db, or leave tracking.uri null for "
            "$DVC_ROOT/mlflow.db"
        )
    if not path.startswith("/"):
        raise KernelcampError(
            f"{where} = {uri!r}: a relative store path would resolve in the run's working folder (a queued "
            "experiment's is a temporary copy); give an absolute path, sqlite:////absolute/path/mlflow.db, or "
            "leave tracking.uri null for $DVC_ROOT/mlflow.db"
        )
    _check_store_place(uri, Path(path), scheme == "sqlite", where)


def _check_store_place(uri: str, path: Path, sqlite: bool, where: str) -> None:
    """A local store (``path``: the SQLite file, or a file store's folder) outside the pipeline's output folders
    (:func:`output_dirs`), with its artifacts (a SQLite store's go to ``mlartifacts/`` beside it,
    ``kernelcamp.tracking.ensure_store``): the report stage logs every file of reports/ as an artifact, so a store
    there was copied mid-write into its own runs, and its files showed up beside the committed outputs. A SQLite
    store's folder must exist: SQLite does not make it, and kernelcamp made it anywhere (``sqlite:////nonexistent/dir``
    made /nonexistent). Raises ``KernelcampError``."""
    import os

    from kernelcamp.provenance import dvc_root

    places = [(path, "the store")]
    if sqlite:
        places.append((path.parent / "mlartifacts", "its artifacts (mlartifacts/ beside it)"))
    for place, what in places:
        for root, out in output_dirs():
            inside = os.path.realpath(place)
            if inside == out or inside.startswith(out.rstrip(os.sep) + os.sep):
                rel = Path(os.path.relpath(out, root)).as_posix()
                raise KernelcampError(
                    f"{where} = {uri!r}: {what} would be inside {rel}/, an output folder of the pipeline (dvc.yaml), "
                    "whose files the report stage logs as artifacts and git commits with each experiment; put the "
                    f"store outside the outputs, e.g. sqlite:///{dvc_root() / 'mlflow.db'}, or leave tracking.uri "
                    "null for $DVC_ROOT/mlflow.db"
                )
    if sqlite and not path.parent.is_dir():
        raise KernelcampError(
            f"{where} = {uri!r}: the folder {path.parent} does not exist, and SQLite makes no folders; create it "
            "first, give a store in a folder that exists, or leave tracking.uri null for $DVC_ROOT/mlflow.db"
        )


def output_dirs() -> list[tuple[str, str]]:
    """``(tree, folder)`` for every folder of pipeline outputs of this tree and of the workspace (``$DVC_ROOT``,
    where a queued experiment's store lives): each output's folder (``reports``) and each output that is a folder
    (``reports/plots``), from dvc.yaml's ``outs``, ``metrics`` and ``plots`` (:func:`kernelcamp.provenance.
    pipeline_outputs`), as real paths, outermost first; never the tree itself (an output at its top level)."""
    import os

    from kernelcamp.provenance import dvc_root, pipeline_outputs

    found: list[tuple[str, str]] = []
    for root in dict.fromkeys(os.path.realpath(r) for r in (project_root(), dvc_root())):
        for entry in pipeline_outputs(root):
            for rel in (entry, os.path.dirname(entry.rstrip("/"))):
                out = os.path.realpath(os.path.join(root, rel))
                if rel not in ("", ".") and out != root and (root, out) not in found:
                    found.append((root, out))
    return sorted(found, key=lambda f: (len(f[1]), f))  # outermost first: a message names reports/, not reports/plots/


def check_workload(wl: WorkloadSpec) -> None:
    """Each workload shape (the GPU's, ``workload``, and the CPU's, ``workload.cpu``) can be built:
    ``num_cache_tokens`` whole pages of ``page_size``, and ``topk`` distinct tokens of the cache (the
    kernel's ``make_inputs`` refused both only in the benchmark stage, with a traceback)."""
    for where, shape in (("workload", wl), ("workload.cpu", wl.cpu)):
        if shape.num_cache_tokens % shape.page_size:
            raise KernelcampError(
                f"{where}.num_cache_tokens = {shape.num_cache_tokens}: must be a multiple of {where}.page_size "
                f"({shape.page_size}), whole pages"
            )
        if shape.topk > shape.num_cache_tokens:
            raise KernelcampError(
                f"{where}.topk = {shape.topk}: must be <= {where}.num_cache_tokens ({shape.num_cache_tokens}), "
                "top-k distinct cache tokens"
            )


def _check_against_target(v: Variant, section: str, target: Any) -> None:
    """num_warps within the target's threads per block (1024 on every arch kernelcamp supports)."""
    max_threads = int(getattr(target, "max_threads_per_block", None) or 1024)
    for i, c in enumerate(v.configs):
        where = f"{section}.num_warps" if not v.is_list else f"{section}.configs.{i}.num_warps"
        if c.num_warps * 32 > max_threads:
            raise KernelcampError(
                f"{where} = {c.num_warps}: {c.num_warps * 32} threads per block is beyond {target.name}'s "
                f"{max_threads}; use at most {max_threads // 32}"
            )
        if c.num_stages > 64:
            s = f"{section}.num_stages" if not v.is_list else f"{section}.configs.{i}.num_stages"
            raise KernelcampError(f"{s} = {c.num_stages}: must be <= 64 (software pipelining depth)")


def _check_against_workload(v: Variant, section: str, wl: WorkloadSpec) -> None:
    """Each config's tiles within the shapes it runs (the GPU's ``workload`` and the CPU's
    ``workload.cpu``, the larger of each): ``BLOCK_H`` at most the power of two that holds the heads, ``BLOCK_T`` at
    most the one that holds the top-k tokens (a larger tile only computes masked rows, and its compile in the build
    stage ran for many minutes without an end: BLOCK_T = 4096 at top-k 512 had not finished after 14 minutes,
    helper-59). ``KernelcampError`` naming the key, the bound and where it comes from."""
    heads, topk = max(wl.num_heads, wl.cpu.num_heads), max(wl.topk, wl.cpu.topk)
    for i, c in enumerate(v.configs):
        at = section if not v.is_list else f"{section}.configs.{i}"
        for name, value, size, what, keys in (
            ("BLOCK_H", c.BLOCK_H, heads, "heads", "workload.num_heads, workload.cpu.num_heads"),
            ("BLOCK_T", c.BLOCK_T, topk, "top-k tokens", "workload.topk, workload.cpu.topk"),
        ):
            most = max(16, 1 << (size - 1).bit_length())  # the power of two that holds `size`; tiles start at 16
            if value > most:
                raise KernelcampError(
                    f"{at}.{name} = {value}: larger than the workload's {size} {what} ({keys}) need: a tile "
                    f"beyond {most} only computes masked rows and can take many minutes to compile; use at most {most}"
                )


def load_spec(path: str | Path = "params.yaml") -> RunSpec:
    """Load and check params.yaml; the one entry point of every stage.

    Raises ``KernelcampError`` (one line naming the key) for a missing, unreadable or non-YAML file,
    an unknown key, a value of the wrong type or out of range, a bad variant, or a kernel module
    that is not a file of this tree's ``kernels/``.
    """
    from kernelcamp.io import read_params

    text, raw = read_params(path)
    return parse_spec(raw, Path(path), text)


def spec_summary(spec: RunSpec) -> dict[str, Any]:
    """The parsed spec as JSON-ready data (what ``stages/spec.py`` writes). It holds no timestamp and
    no hash of the whole params.yaml, so it changes only when the variant, baseline, kernel or
    server flags do (build depends on it)."""
    return {
        **{k: v for k, v in spec.hashes().items() if k != "target"},  # build has the target as a param
        "variant": spec.variant.as_dict(),
        "baseline": spec.baseline.as_dict() if spec.baseline else None,
        "kernel_file": str(spec.kernel_file.relative_to(spec.root or project_root())),
    }


def dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, default=str)


def before_outputs(stage: str, params_path: str | Path = "params.yaml") -> None:
    """What every stage does just before it writes its first output: raise ``KernelcampError`` when params.yaml
    (``params_path``) no longer has the sha256 this pipeline run claimed the tree with
    (:func:`kernelcamp.runlock.check_params_unchanged`), so that a stage stopped by a rewritten params.yaml writes
    nothing (the README's "a stage writes only when it succeeds"). ``tracked_stage`` checks again once the stage has
    returned, so that DVC locks no output with params other than the ones it was made from; this earlier check kept
    the failed stage's outputs from replacing the last finished run's records (helper-64). A stage run by hand, or
    one whose run released its claim, checks nothing."""
    from kernelcamp.runlock import check_params_unchanged

    check_params_unchanged(project_root(), stage, params_path)


def stage_spec(stage: str, params_path: str | Path = "params.yaml") -> RunSpec:
    """What every stage does first: refuse a second run of this tree before params.yaml is read (and put that file
    back as the first run's: :func:`kernelcamp.runlock.refuse_if_another_run`), read and parse it as :func:`load_spec`
    does, then claim this tree's run for ``stage`` (:func:`kernelcamp.runlock.claim_run`: refused while another
    ``dvc`` run holds it, or when params.yaml changed since an earlier stage of this run read it)."""
    from kernelcamp.io import read_params
    from kernelcamp.runlock import claim_run, refuse_if_another_run

    # before params.yaml is read: a second `dvc exp run` has rewritten it, and its values may not even parse
    refuse_if_another_run(project_root(), params_path)
    text, raw = read_params(params_path)  # load_spec's read, kept: the claim holds the text its sha256 is of
    spec = parse_spec(raw, Path(params_path), text)
    claim_run(
        project_root(),
        stage,
        spec.params_sha256,
        params=dict(spec.raw),
        params_text=text,
        tree_tags=lambda: tree_tags(dict(spec.raw)),
    )
    return spec

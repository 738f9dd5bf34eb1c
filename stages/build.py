"""DVC stage `build`: compile every config of the variant and the baseline for the target GPU.

    python -m stages.build --params params.yaml --out reports/build.json --metrics reports/build_metrics.json

Reads params sections variant, baseline, target, workload, kernel and (optional) build.also_targets
(extra target names reported beside the target). Writes one row per config x kernel x target with
its role (variant/baseline), per role and target n_configs, n_fit, pruned, will_run, and the kernel
source hash, variant hash and Triton version. The baseline compiles its own kernel module: the file
at ``baseline.kernel_rev`` when set (kernelcamp.kernel_rev), whose rev and source hash each role's
summary and the record's ``baseline_kernel_rev`` / ``baseline_kernel_source_hash`` name. Exits 2 with
one line when no config of the variant fits the target, writing nothing (the last finished run's
records stay); names every dead config on stderr ("PRUNED on sm120: ..."). Runs without a GPU.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

# Cross-compiling needs Triton's compiler: interpreter mode (read when triton is imported) cannot compile.
# Only when run as the stage: an importer (a test session on the interpreter) keeps its environment.
if __name__ == "__main__":
    os.environ.pop("TRITON_INTERPRET", None)

from kernelcamp.errors import KernelcampError
from kernelcamp.inspect import compile as kc
from kernelcamp.inspect import fit as kf
from kernelcamp.io import stage_main, write_json_atomic
from kernelcamp.kernel_rev import module_source
from kernelcamp.metrics import nest, segment
from kernelcamp.spec import BUILD_KEYS, before_outputs, stage_spec
from kernelcamp.targets import load_target
from kernelcamp.tracking import tracked_stage
from kernelcamp.variant import Variant


def build_report(variants: dict[str, Variant], target: Any, also: list[Any], specs_for, progress=None) -> dict:
    """Rows and per-role summaries for ``variants`` ({role: Variant}) on the target and ``also``;
    ``specs_for``: one ``config -> kernel specs`` function, or one per role ({role: function})."""
    targets = [target] + [t for t in also if t.name != target.name]
    rows, summaries = [], {}
    for role, variant in variants.items():
        role_specs = specs_for[role] if isinstance(specs_for, dict) else specs_for
        role_rows = kf.inspect_configs(
            variant.configs, targets, role_specs, is_list=variant.is_list and not variant.is_table, progress=progress
        )
        rows += [{"role": role, "variant": variant.name, **r} for r in role_rows]
        summaries[role] = {
            "name": variant.name,
            "config_hash": variant.config_hash(),
            "targets": {t.name: kf.summarize(variant, role_rows, t.name) for t in targets},
        }
        summaries[role].update({k: summaries[role]["targets"][target.name][k] for k in ("n_configs", "n_fit")})
        summaries[role]["pruned"] = summaries[role]["targets"][target.name]["pruned"]
        summaries[role]["will_run"] = summaries[role]["targets"][target.name]["will_run"]
    return {"target": target.name, "also_targets": [t.name for t in targets[1:]], "roles": summaries, "rows": rows}


def metrics(report: dict) -> dict[str, Any]:
    """build_metrics.json, nested keys of the one naming scheme (kernelcamp.metrics; the role
    ``variant`` is named ``candidate`` there, as everywhere else in the metrics). On the target:
    ``build.<role>.{n_configs,n_fit,shared_bytes_max,registers_max,spill_bytes_max}`` (bytes,
    registers per thread); on every inspected target: ``build.<role>.<target>.{n_fit,n_pruned}``."""
    out: dict[str, Any] = {}
    for role, s in report["roles"].items():
        r_ = f"build.{'candidate' if role == 'variant' else role}."
        mine = [r for r in report["rows"] if r["role"] == role and r["target"] == report["target"]]
        out[f"{r_}n_configs"], out[f"{r_}n_fit"] = s["n_configs"], s["n_fit"]
        for fig in ("shared_bytes", "registers", "spill_bytes"):
            vals = [r[fig] for r in mine if r[fig] is not None]
            out[f"{r_}{fig}_max"] = max(vals) if vals else None
        for t, ts in (s.get("targets") or {}).items():
            out[f"{r_}{segment(t)}.n_fit"] = ts.get("n_fit")
            out[f"{r_}{segment(t)}.n_pruned"] = len(ts.get("pruned") or [])
    return nest(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--out", default="reports/build.json")
    ap.add_argument("--metrics", default="reports/build_metrics.json")
    args = ap.parse_args()

    spec = stage_spec("build", args.params)
    params = spec.raw
    variants = {"variant": spec.variant}
    if spec.baseline is not None:
        variants["baseline"] = spec.baseline
    target = spec.target
    also_names = list(spec.build.also_targets)
    run_as = spec.benchmark.run_as_target
    if run_as and run_as not in also_names:
        also_names.append(run_as)  # benchmark restricts the variants to what this target keeps
    also = [load_target(name) for name in also_names]
    modules = {role: kf.check_compile_specs(spec.kernel_module(role)) for role in variants}
    specs_for = {
        r: kf.specs_for_workload(m, params["workload"], spec.kernel.dot_dtype, variants[r]) for r, m in modules.items()
    }
    report = build_report(variants, target, also, specs_for, progress=lambda m: print(m, file=sys.stderr))
    hashes = spec.hashes()
    for role, s in report["roles"].items():  # the kernel each role compiled: its rev and source hash
        ran = module_source(modules[role])
        s.update(kernel_module=ran["module"], kernel_rev=ran["kernel_rev"], kernel_source_hash=ran["source_hash"])
        want = hashes["baseline_kernel_source_hash" if role == "baseline" else "kernel_source_hash"]
        if s["kernel_source_hash"] != want:
            raise KernelcampError(
                f"the {role}'s kernel ({s['kernel_module']}) has source {s['kernel_source_hash']} but params.yaml "
                f"gives {want}: the kernel file changed during the build; rerun it"
            )
    report.update(
        kernel=spec.kernel.name,
        **{k: hashes[k] for k in BUILD_KEYS},
        stage_params=spec.stage_params("build"),  # what the report checks against the params it logs
        triton=kc.triton_version(),
        workload=spec.workload.name,
    )
    for role, s in report["roles"].items():
        for name, t in s["targets"].items():
            for p in t["pruned"]:
                print(f"PRUNED on {name} ({role} {s['name']}): {p['config']}: {p['reason']}", file=sys.stderr)
    v = report["roles"]["variant"]
    if v["n_fit"] == 0:
        raise KernelcampError(
            f"variant {v['name']!r}: none of its {v['n_configs']} config(s) fits {target.name}: "
            + "; ".join(f"{p['config']}: {p['reason']}" for p in v["pruned"])
        )
    if run_as:  # the benchmark would run only what run_as keeps: refuse here, before deploying
        for role, s in report["roles"].items():
            t = s["targets"].get(run_as) or {}
            if t.get("n_fit") == 0:
                raise KernelcampError(
                    f"benchmark.run_as_target={run_as}: none of {role} {s['name']!r}'s {s['n_configs']} config(s) "
                    f"fits {run_as}, so nothing would run as it: "
                    + "; ".join(f"{p['config']}: {p['reason']}" for p in t.get("pruned") or [])
                )
    # Written only now: a failed build keeps the last finished run's records (the outputs are persist).
    build_metrics = metrics(report)
    before_outputs("build", args.params)
    write_json_atomic(args.out, report)
    write_json_atomic(args.metrics, build_metrics)
    print(f"build: variant {v['name']} {v['n_fit']}/{v['n_configs']} configs fit {target.name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    stage_main(tracked_stage("build")(main))

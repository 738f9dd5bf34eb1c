"""The campaign report: validated inputs -> PNG plots + markdown, and the figures MLflow logs.

Inputs are the stage records in reports/ (build.json, deploy.json, benchmark.json, verify.json).
``load_inputs`` checks them all before anything is written or logged, so a run is never marked
finished with half its figures. CPU timings (``device == "cpu"``: Triton interpreter, perf_counter)
are labelled as such on every plot, table and metric name (``cpu.kernel.*``: kernelcamp.metrics), never
as GPU results. :func:`headline_metrics` is the run's headline: reports/metrics.json and the MLflow
run's headline metrics, the same keys.
"""

from __future__ import annotations

import contextlib
import json
import os
import traceback
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from kernelcamp.errors import KernelcampError
from kernelcamp.io import read_json
from kernelcamp.stats import DECISION_CODES, decision, resolution_text

REQUIRED = {
    "build": ("target", "roles", "rows"),
    "benchmark": ("measured_at", "host", "device", "deploy_id", "kernel", "variants"),
    "verify": ("passed", "measured_at", "deploy_id"),
    "deploy": (),
}


#: The containers the report walks in each stage record: dotted path -> JSON type. A path whose parent is absent is
#: not checked (a skipped serving A/B has no ``ab``); a present one must have its type. A hand-edited benchmark.json
#: with ``kernel: "x"`` gave a traceback, and one with ``serving.levels: null`` a report of no serving levels.
SHAPES: dict[str, tuple[tuple[str, type], ...]] = {
    "benchmark": (
        ("kernel", dict),
        ("kernel.batch", dict),
        ("kernel.overall", dict),
        ("variants", dict),
        ("variants.candidate", dict),
        ("variants.baseline", dict),
        ("serving", dict),
        ("serving.levels", list),
        ("serving.ab", dict),
        ("serving.ab.per_level", list),
        ("serving.ab.overall", dict),
        ("profile", dict),
    ),
    "build": (("roles", dict), ("rows", list)),
}

_JSON_TYPE = {dict: "an object", list: "an array"}


def _check_shape(name: str, path: str | os.PathLike, rec: Mapping[str, Any]) -> None:
    for dotted, want in SHAPES.get(name, ()):
        node: Any = rec
        *parents, last = dotted.split(".")
        for key in parents:
            node = node.get(key) if isinstance(node, Mapping) else None
        if not isinstance(node, Mapping) or last not in node:
            continue
        if not isinstance(node[last], want):
            got = json.dumps(node[last])
            got = got if len(got) <= 40 else got[:37] + "..."
            raise KernelcampError(
                f"{name} record at {path}: {dotted} is {got}, expected {_JSON_TYPE[want]} (not as the {name} stage "
                f"writes it): rerun `dvc repro {name}` instead of editing it"
            )


def load_inputs(paths: Mapping[str, str | os.PathLike]) -> dict[str, Any]:
    """Read and check the stage records named in ``paths`` (keys of ``REQUIRED``): each a JSON object with the keys
    ``REQUIRED`` names and the containers ``SHAPES`` names of their types.

    Raises ``KernelcampError`` naming the first missing file or key, or the first container of another type.
    """
    data = {}
    for name, keys in REQUIRED.items():
        rec = read_json(paths[name], f"{name} record")
        if not isinstance(rec, dict):
            raise KernelcampError(f"{name} record at {paths[name]} is not a JSON object: rerun `dvc repro {name}`")
        missing = [k for k in keys if k not in rec]
        if missing:
            raise KernelcampError(f"{name} record at {paths[name]} lacks {missing}: rerun `dvc repro {name}`")
        _check_shape(name, paths[name], rec)
        data[name] = rec
    kb = data["benchmark"]["kernel"]
    if not kb.get("batch") or "overall" not in kb:
        raise KernelcampError(f"benchmark record at {paths['benchmark']} has no kernel results: rerun the benchmark")
    return data


@contextlib.contextmanager
def reading_records(paths: Mapping[str, str | os.PathLike]) -> Iterator[None]:
    """Turn an error of a record's contents while the report is rendered from the records (a value of another
    type or a missing key deeper than :func:`load_inputs` checks: ``kernel.overall.ratio = "fast"``) into one
    ``KernelcampError`` naming the records, the error and where the report met it, instead of a traceback. The
    rendering opens no MLflow run and writes only into a temporary folder, so nothing is left half-done.

    Raises ``KernelcampError`` from ``KeyError``, ``TypeError``, ``AttributeError``, ``IndexError`` and ``ValueError``
    (a ``KernelcampError`` passes unchanged)."""
    try:
        yield
    except KernelcampError:
        raise
    except (KeyError, TypeError, AttributeError, IndexError, ValueError) as e:
        frame = traceback.extract_tb(e.__traceback__)[-1]
        where = f"{Path(frame.filename).name}:{frame.lineno}"
        names = ", ".join(str(p) for p in paths.values())
        raise KernelcampError(
            f"the stage records ({names}) are not as their stages write them: {type(e).__name__}: {e} (at {where}); "
            "rerun the pipeline (dvc exp run) instead of editing them (if they are untouched, this is a kernelcamp "
            "bug: report it with this line)"
        ) from None


def is_cpu(bench: Mapping[str, Any]) -> bool:
    return bench.get("device") != "cuda"


def level_valid(level: Mapping[str, Any]) -> bool:
    """A serving level counts only with no failed and no incomplete request (DESIGN.md)."""
    if "valid" in level:
        return bool(level["valid"])
    return not (level.get("requests_failed") or level.get("requests_incomplete") or level.get("incomplete"))


SERVING_IMPLS = ("baseline", "candidate")


def serving_levels(sv: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per concurrency level (ascending): ``{concurrency, valid, baseline, candidate, ratio, ci_lo,
    ci_hi, n_pairs, note}`` with each impl's figures (mean over repeats, counts summed) or None.

    From the A/B summary (``serving.ab.per_level``) when the record has one; an older record with
    only the candidate's ``levels`` gives candidate-only entries."""
    ab = sv.get("ab") or {}
    if ab.get("per_level"):
        out = [dict(e) for e in ab["per_level"]]
    else:
        out = []
        for lv in sv.get("levels") or []:
            if lv.get("impl", "candidate") != "candidate":
                continue
            out.append(
                {
                    "concurrency": lv.get("concurrency"),
                    "valid": level_valid(lv),
                    "baseline": None,
                    "candidate": dict(lv),
                    "ratio": None,
                    "ci_lo": None,
                    "ci_hi": None,
                    "n_pairs": 0,
                    "note": "baseline not measured (record has the candidate only)",
                }
            )
    return sorted(out, key=lambda e: e.get("concurrency") or 0)


def serving_step_models(sv: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``{impl: step model}``; an older record's single ``step_model`` is the candidate's."""
    sms = dict(sv.get("step_models") or {})
    if "candidate" not in sms and sv.get("step_model"):
        sms["candidate"] = sv["step_model"]
    return {i: sms[i] for i in SERVING_IMPLS if isinstance(sms.get(i), Mapping)}


# ------------------------------------------------------------------------------------------- plots


def _save_plot(fig, ax, out_dir: Path, name: str, made: dict[str, str], legend_fontsize: float | None = None) -> None:
    """The finish every plot shares: grid, legend, tight layout, ``out_dir/<name>.png`` at 110 dpi,
    the figure closed, and ``made[name]`` set to the file name."""
    import matplotlib.pyplot as plt

    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_fontsize)
    fig.tight_layout()
    fig.savefig(out_dir / f"{name}.png", dpi=110)
    plt.close(fig)
    made[name] = f"{name}.png"


def make_plots(data: Mapping[str, Any], out_dir: str | os.PathLike, threshold: float | None = None) -> dict[str, str]:
    """Write PNGs into ``out_dir``; returns ``{plot name: file name}``. ``threshold``: the report's
    (``report.threshold``), which the serving ratio plot's dashed lines and per-level decisions use
    (None: the one the benchmark recorded, else 2%)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    bench = data["benchmark"]
    cpu = is_cpu(bench)
    # the serving plots are a CPU's also when a GPU machine measured a server on a CPU (-S server.device=cpu)
    serving_cpu = cpu or bool((bench.get("serving") or {}).get("scaled_for_cpu"))
    names = {n: bench["variants"][n]["name"] for n in ("baseline", "candidate")}
    made: dict[str, str] = {}

    batches = sorted(bench["kernel"]["batch"], key=int)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for impl, color in (("baseline", "tab:gray"), ("candidate", "tab:blue")):
        xs = [int(b) for b in batches]
        p50 = [bench["kernel"]["batch"][b][impl]["latency_us_p50"] for b in batches]
        lo = [p - bench["kernel"]["batch"][b][impl]["latency_us_p20"] for b, p in zip(batches, p50, strict=True)]
        hi = [bench["kernel"]["batch"][b][impl]["latency_us_p80"] - p for b, p in zip(batches, p50, strict=True)]
        ax.errorbar(xs, p50, yerr=[lo, hi], marker="o", capsize=3, color=color, label=f"{impl}: {names[impl]}")
    ax.set_xlabel("batch size (decode requests)")
    ax.set_ylabel("latency (us, p50; bars p20-p80)")
    where = "CPU, Triton interpreter: NOT GPU timings" if cpu else f"{bench.get('gpu')}"
    ax.set_title(f"Kernel latency per batch size ({where})", fontsize=10)
    _save_plot(fig, ax, out_dir, "kernel_latency", made)

    sv = bench.get("serving") or {}
    levels = serving_levels(sv)
    if levels:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        marked = False
        for impl, color in (("baseline", "tab:gray"), ("candidate", "tab:blue")):
            pts = [(e["concurrency"], e[impl].get("output_tok_s"), e) for e in levels if e.get(impl)]
            pts = [p for p in pts if p[1] is not None]
            if not pts:
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=color, label=f"{impl}: {names[impl]}")
            bad = [(x, y) for x, y, e in pts if not e.get("valid")]
            if bad:
                ax.scatter(
                    *zip(*bad, strict=True),
                    marker="x",
                    s=120,
                    color="red",
                    label=None if marked else "INVALID level (failed/incomplete requests)",
                )
                marked = True
        ax.set_xlabel("concurrency (requests in flight)")
        ax.set_ylabel("output tok/s (ok requests; mean over repeats)")
        ax.set_title("Serving throughput per concurrency" + (" (CPU)" if serving_cpu else ""), fontsize=10)
        _save_plot(fig, ax, out_dir, "serving_throughput", made)

    with_ci = [e for e in levels if e.get("ci_lo") is not None and e.get("ratio") is not None]
    if with_ci:
        if threshold is None:
            threshold = float(((sv.get("ab") or {}).get("overall") or {}).get("threshold") or 0.02)
        fig, ax = plt.subplots(figsize=(7, 4.2))
        xs = list(range(len(with_ci)))
        r = [e["ratio"] for e in with_ci]
        ax.errorbar(
            xs,
            r,
            yerr=[
                [x - e["ci_lo"] for x, e in zip(r, with_ci, strict=True)],
                [e["ci_hi"] - x for x, e in zip(r, with_ci, strict=True)],
            ],
            fmt="o",
            capsize=4,
            color="tab:blue",
            label="candidate/baseline steady tok/s, interval",
        )
        for x, e in zip(xs, with_ci, strict=True):
            ax.annotate(
                str(serving_decision(e, threshold, sv)),
                (x, e["ci_hi"]),
                textcoords="offset points",
                xytext=(0, 6),
                ha="center",
                fontsize=8,
            )
        ax.axhline(1.0, color="black", linewidth=0.8)
        for y in (1 - threshold, 1 + threshold):
            ax.axhline(y, color="tab:gray", linestyle="--", linewidth=0.8)
        ax.set_xticks(xs, [str(e["concurrency"]) for e in with_ci])
        ax.set_xlabel("concurrency (requests in flight)")
        ax.set_ylabel("throughput ratio candidate/baseline (higher is faster)")
        ax.set_title(
            f"Serving A/B per level (dashed: 1 +- threshold {threshold:.1%})" + (" (CPU)" if serving_cpu else ""),
            fontsize=10,
        )
        _save_plot(fig, ax, out_dir, "serving_ratio", made, legend_fontsize=8)

    sms = {i: m for i, m in serving_step_models(sv).items() if m.get("a_ms") is not None}
    if sms:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for impl, color in (("baseline", "tab:gray"), ("candidate", "tab:blue")):
            sm = sms.get(impl)
            if not sm:
                continue
            pts = sm.get("points") or [
                {"batch": int(b), "step_ms": v.get("step_ms_median")} for b, v in (sm.get("by_batch") or {}).items()
            ]
            xs = [p["batch"] for p in pts] or [1]
            ax.scatter(xs, [p["step_ms"] for p in pts], color=color, label=f"{impl}: decode steps (median per batch)")
            grid = [0, max(xs)]
            ax.plot(
                grid,
                [sm["a_ms"] + sm["b_ms_per_req"] * x for x in grid],
                color=color,
                linestyle="--",
                label=f"{impl} fit {sm['a_ms']:.2f} + {sm['b_ms_per_req']:.3f}*batch ms (R2 {_f(sm.get('r2'), '.3f')})",
            )
        ax.set_ylim(bottom=0)  # a step never takes negative time (the fit holds a_ms >= 0: stats.fit_step_model)
        ax.set_xlabel("batch (running requests)")
        ax.set_ylabel("decode step (ms)")
        ax.set_title("Step-time model" + (" (CPU)" if serving_cpu else ""), fontsize=10)
        _save_plot(fig, ax, out_dir, "step_model", made, legend_fontsize=8)
    return made


# ---------------------------------------------------------------------------------------- markdown


CPU_DECISION_NOTE = (
    " (CPU interpreter timings decide nothing: in the Triton interpreter the launch parameters have no "
    "effect, so the figures below test the pipeline, not the variant)"
)


def _f(x: Any, fmt: str = ".3g") -> str:
    if isinstance(x, bool):
        return "yes" if x else "no"
    return "n/a" if x is None else format(x, fmt) if isinstance(x, (int, float)) else str(x)


def headline(data: Mapping[str, Any], threshold: float) -> dict[str, Any]:
    """The decision on the overall kernel A/B (ratio candidate/baseline latency, lower is faster).

    The decision the benchmark's sequential rounds stopped on (``overall.decision``, at the per-look
    confidence) when the record has one and was made at ``threshold``; otherwise (an older record,
    or another threshold) :func:`kernelcamp.stats.decision` of the recorded interval. Adds
    ``half_width`` (ratio units), ``n_rounds``, ``stop_reason`` and ``confidence_per_look``.
    """
    o = data["benchmark"]["kernel"]["overall"]
    cpu = is_cpu(data["benchmark"])
    recorded = o.get("decision") if o.get("threshold") == threshold else None
    # Interpreter timings on a CPU do not depend on the launch parameters (num_warps, num_stages, ...):
    # whatever interval they give, they decide nothing about the kernel on a GPU.
    dec = "inconclusive" if cpu else recorded or decision(o["ratio"], o["ci_lo"], o["ci_hi"], threshold)
    return {
        "decision": dec,
        "ratio": o["ratio"],
        "ci_lo": o["ci_lo"],
        "ci_hi": o["ci_hi"],
        "half_width": o.get("half_width", (o["ci_hi"] - o["ci_lo"]) / 2),
        "threshold": threshold,
        "confidence": o.get("confidence"),
        "confidence_per_look": o.get("confidence_per_look", o.get("confidence")),
        "n_rounds": o.get("n_rounds"),
        "max_rounds": o.get("max_rounds"),
        "stop_reason": o.get("stop_reason"),
        "cpu": cpu,
    }


def headline_metrics(data: Mapping[str, Any], threshold: float) -> dict[str, float | int]:
    """The headline figures of a run, flat keys of the one naming scheme (:mod:`kernelcamp.metrics`).

    ``reports/metrics.json`` (the only metrics file ``dvc exp show`` lists) holds exactly these, and
    the MLflow run logs these (beside the benchmark's detail). ``p`` is ``cpu.`` for a run timed on a CPU, else empty:

    * ``{p}kernel.decision`` / ``.ratio`` / ``.ci_lo`` / ``.ci_hi`` / ``.resolution``: the overall
      kernel A/B as :func:`headline` decides it (latency ratio candidate/baseline, lower is faster;
      decision code of ``kernelcamp.stats.DECISION_CODES``; resolution = the interval's half-width,
      ratio units). On a CPU the decision is always inconclusive (0).
    * ``{p}kernel.candidate.latency_us_p50`` at ``{p}kernel.candidate.batch``: the candidate's median
      kernel latency (us) at the largest batch size measured.
    * ``{p}serving.decision`` / ``.ratio`` / ``.ci_lo`` / ``.ci_hi`` / ``.resolution``: the overall
      serving A/B (ratio of ``steady_output_tok_s`` candidate/baseline, higher is faster); absent when
      no serving interval was measured.
    * ``{p}serving.candidate.output_tok_s`` at ``{p}serving.candidate.concurrency``: the candidate's
      ``output_tok_s`` (ok tokens / wall s, mean over repeats) at the highest *valid* concurrency level
      (no failed or incomplete request); absent when no level is valid.
    * ``verify.passed``: 1 or 0.

    Figures the records lack are left out (never logged as 0). Raises ``KeyError`` only on records
    that :func:`load_inputs` would have refused.
    """
    from kernelcamp.metrics import is_number, serving_prefix, timed_prefix

    bench = data["benchmark"]
    p = timed_prefix(bench.get("device"))
    h = headline(data, threshold)
    m: dict[str, Any] = {
        f"{p}kernel.decision": DECISION_CODES[h["decision"]],
        f"{p}kernel.ratio": h["ratio"],
        f"{p}kernel.ci_lo": h["ci_lo"],
        f"{p}kernel.ci_hi": h["ci_hi"],
        f"{p}kernel.resolution": h["half_width"],
    }
    b_max = max(bench["kernel"]["batch"], key=int)
    m[f"{p}kernel.candidate.latency_us_p50"] = bench["kernel"]["batch"][b_max]["candidate"].get("latency_us_p50")
    m[f"{p}kernel.candidate.batch"] = int(b_max)
    sv = bench.get("serving") or {}
    p = serving_prefix(bench.get("device"), sv)  # a CPU server's figures are CPU figures on a GPU machine too
    o = (sv.get("ab") or {}).get("overall") or {}
    if o.get("ci_lo") is not None and o.get("ratio") is not None:
        m[f"{p}serving.decision"] = DECISION_CODES[serving_decision(o, threshold, sv)]
        m[f"{p}serving.ratio"] = o["ratio"]
        m[f"{p}serving.ci_lo"] = o["ci_lo"]
        m[f"{p}serving.ci_hi"] = o["ci_hi"]
        m[f"{p}serving.resolution"] = o.get("half_width", (o["ci_hi"] - o["ci_lo"]) / 2)
    valid = [
        e for e in serving_levels(sv) if e.get("valid") and is_number((e.get("candidate") or {}).get("output_tok_s"))
    ]
    if valid:
        top = max(valid, key=lambda e: int(e["concurrency"]))
        m[f"{p}serving.candidate.output_tok_s"] = top["candidate"]["output_tok_s"]
        m[f"{p}serving.candidate.concurrency"] = int(top["concurrency"])
    m["verify.passed"] = int(bool(data["verify"]["passed"]))
    return {k: v for k, v in m.items() if is_number(v)}


def decision_line(d: Mapping[str, Any], what: str, unit_rounds: str = "rounds", note: str = "") -> str:
    """One sentence: the decision (then ``note``) with ratio, interval (and its confidence), threshold,
    resolution, rounds used of the maximum and why the rounds stopped."""
    if d.get("ratio") is None or d.get("ci_lo") is None:
        return f"**{d.get('decision') or 'no decision'}**: no interval"
    conf = d.get("confidence_per_look") or d.get("confidence") or 0.95
    hw = d.get("half_width")
    if hw is None:
        hw = (d["ci_hi"] - d["ci_lo"]) / 2
    used = d.get("n_rounds", d.get("n_repeats"))
    mx = d.get("max_rounds") or d.get("max_repeats")
    of = f" of at most {mx}" if mx else ""
    why = f", stopped: {d['stop_reason']}" if d.get("stop_reason") else ""
    return (
        f"**{d.get('decision')}**{note}: {what} {d['ratio']:.4f}, {conf:.2%} CI [{d['ci_lo']:.4f}, {d['ci_hi']:.4f}]; "
        f"threshold {d.get('threshold', 0.02):.1%}; {resolution_text(hw)}; {used} {unit_rounds} used{of}{why}"
    )


def build_table(build: Mapping[str, Any]) -> list[str]:
    """Markdown lines: one row per role x target x config (all kernels), pruned configs named loudly."""
    lines = [
        "| role | target | config | kernel | shared B | regs | spill B | warps/SM | CTAs/SM | fits |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    pruned = []
    for r in build["rows"]:
        fits = "yes" if r.get("fits") else "**NO**"
        lines.append(
            f"| {r.get('role')} | {r.get('target')} | {r.get('config')} | {r.get('kernel')} | "
            f"{_f(r.get('shared_bytes'), 'd')} | {_f(r.get('registers'), 'd')} | "
            f"{_f(r.get('spill_bytes'), 'd')} | {_f(r.get('warps_per_sm'), 'd')} | "
            f"{_f(r.get('ctas_per_sm'), 'd')} | {fits} |"
        )
        if not r.get("fits"):
            pruned.append(
                f"- **PRUNED on {r.get('target')}** ({r.get('role')} {r.get('variant')}): "
                f"`{r.get('config')}`: {r.get('reason')}"
            )
    if pruned:
        lines += ["", "Configs a target would prune (Triton's autotuner drops these without a word):", ""]
        lines += sorted(set(pruned))
    return lines


def _impl_cells(a: Mapping[str, Any] | None, valid: bool) -> str:
    if not a:
        return "n/a | n/a | n/a | n/a | n/a | n/a | n/a | n/a | n/a"
    tput = _f(a.get("output_tok_s")) if valid else f"~~{_f(a.get('output_tok_s'))}~~ INVALID"
    steady = _f(a.get("steady_output_tok_s")) if valid else f"~~{_f(a.get('steady_output_tok_s'))}~~"
    counts = (
        f"{a.get('requests_ok')} / {a.get('requests_failed')} / {a.get('requests_incomplete', a.get('incomplete', 0))}"
    )
    return (
        f"{counts} | {tput} | {steady} | {_f(a.get('per_request_tok_s'))} | {_f(a.get('ttft_ms_p50'))} | "
        f"{_f(a.get('tpot_ms_p50'))} | {_f(a.get('itl_ms_p50'))} | {_f(a.get('e2e_ms_p50'))} | {a.get('n_repeats', 1)}"
    )


def serving_markdown(sv: Mapping[str, Any], plots: Mapping[str, str], plots_rel: str, threshold: float) -> list[str]:
    """The serving section (per level: baseline and candidate, ratio with CI) and the step models."""
    out = ["## Serving", ""]
    levels = serving_levels(sv)
    ab = sv.get("ab") or {}
    if not levels:
        out += [f"Not measured: {sv.get('skipped') or 'no levels'}.", ""]
    else:
        if "serving_throughput" in plots:
            out += [f"![serving throughput]({plots_rel}/{plots['serving_throughput']})", ""]
        o = ab.get("overall") or {}
        if "serving_ratio" in plots:
            out += [f"![serving ratio per level]({plots_rel}/{plots['serving_ratio']})", ""]
        if o.get("ratio") is not None:
            metric = ab.get("metric") or "output_tok_s"
            od = {**o, "decision": serving_decision(o, threshold, sv), "threshold": threshold}
            unserved = serving_unserved(sv)
            out += [
                "**Serving A/B:** "
                + decision_line(od, f"{metric} candidate/baseline", "repeats", f" ({unserved})" if unserved else "")
                + (
                    f" ({o.get('n_pairs')} (level, repeat) pairs over {o['n_levels']} valid levels, each level "
                    "weighted equally, the noise taken within levels; higher is faster)."
                    if o.get("n_levels") is not None
                    else f" ({o.get('n_pairs')} (level, repeat) pairs of the valid levels pooled; higher is faster)."
                ),
                "",
            ]
        elif sv.get("baseline_measured") is False or not ab:
            why = sv.get("baseline_not_measured_reason") or "the record has the candidate only"
            out += [f"**Baseline not measured** ({why}): candidate figures only, no serving A/B.", ""]
        else:
            out += [f"Serving A/B: no ratio ({o.get('note')}).", ""]
        if any(e.get("ci_lo") is not None for e in levels):
            out += serving_decisions_table(levels, threshold, sv)
        out += [
            "| concurrency | impl | valid | ok / failed / incomplete | output tok/s | steady tok/s | "
            "per-request tok/s | TTFT p50 ms | TPOT p50 ms | ITL p50 ms | e2e p50 ms | repeats | "
            "ratio cand./base. (steady tok/s) | CI |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for e in levels:
            ok = bool(e.get("valid"))
            if e.get("ratio") is not None:
                ratio = _f(e["ratio"], ".4f")
                ci = (
                    f"[{_f(e['ci_lo'], '.4f')}, {_f(e['ci_hi'], '.4f')}]"
                    if e.get("ci_lo") is not None
                    else f"n/a: {e.get('note')}"
                )
            else:
                ratio, ci = "n/a", (e.get("note") or "n/a")
            for i, impl in enumerate(SERVING_IMPLS):
                out.append(
                    f"| {e.get('concurrency')} | {impl} | {'yes' if ok else '**NO**'} | "
                    f"{_impl_cells(e.get(impl), ok)} | {ratio if i else ''} | {ci if i else ''} |"
                )
        out += [
            "",
            "Figures per impl are means over the repeats (counts summed); a level with any failed or incomplete "
            "run is INVALID and kept out of every ratio. output tok/s: ok tokens over the whole run of the level, "
            "warm-up and drain included (DESIGN.md); steady tok/s: tokens that arrived in the measured window over "
            "its length, the figure the ratio compares: the ratio is the geometric mean of the repeats' paired "
            "candidate/baseline ratios of it, so it can differ from the ratio of the two means shown.",
            "",
        ]
        b = sv.get("baseline") or {}
        if b:
            out += [
                f"Baseline `{b.get('variant_name')}` (variant hash {b.get('variant_hash')}) ran on a temporary "
                f"server at {b.get('url')} (pid {b.get('pid')}, ready in {_f(b.get('seconds_to_ready'))} s, "
                "stopped after the run) beside the deployed candidate.",
                "",
            ]
        out += attention_share_markdown(sv.get("attention_share"))
        if sv.get("scaled_for_cpu"):
            out += ["Serving ran on the CPU with the model scaled down (`scaled_for_cpu`): not GPU figures.", ""]
    out += ["## Step-time model", ""]
    sms = serving_step_models(sv)
    fitted = {i: m for i, m in sms.items() if m.get("a_ms") is not None}
    if fitted:
        if "step_model" in plots:
            out += [f"![step model]({plots_rel}/{plots['step_model']})", ""]
        for impl in SERVING_IMPLS:
            sm = sms.get(impl)
            if sm and sm.get("a_ms") is not None:
                fitted_b = sm.get("batch_sizes_fitted") or sorted(int(b) for b in (sm.get("by_batch") or {}))
                left = sm.get("batch_sizes_left_out") or []
                out.append(
                    f"- {impl}: `step_ms = {sm['a_ms']:.3f} + {sm['b_ms_per_req']:.4f} * batch` "
                    f"(R^2 {_f(sm.get('r2'), '.4f')} over the per-batch medians"
                    + (f", {_f(sm.get('r2_all_steps'), '.4f')} against every step" if "r2_all_steps" in sm else "")
                    + f"; {sm.get('n_points')} decode steps; batch sizes fitted {fitted_b or 'n/a'}"
                    + (f", left out (seen < 5 times) {left}" if left else "")
                    + (
                        "; intercept held at 0: the unconstrained fit's was negative"
                        if sm.get("intercept_clamped")
                        else ""
                    )
                    + ")"
                )
            else:
                why = (sm or {}).get("skipped") or "not measured"
                out.append(f"- {impl}: not fitted ({why})")
        out.append("")
    else:
        out += ["Not fitted (no serving measurements).", ""]
    return out


def serving_decisions_table(levels: list[dict[str, Any]], threshold: float, sv: Mapping[str, Any]) -> list[str]:
    """Per concurrency level: the throughput ratio, its interval, decision at ``threshold``
    (:func:`serving_decision`; ``sv``, the serving record, says whether the servers ran the variants'
    kernels) and resolution."""
    out = [
        "| concurrency | ratio cand./base. (steady tok/s) | CI | decision | resolution | pairs |",
        "|---|---|---|---|---|---|",
    ]
    for e in levels:
        if e.get("ci_lo") is None:
            why = e.get("note") or "no interval"
            out.append(
                f"| {e.get('concurrency')} | {_f(e.get('ratio'), '.4f')} | n/a | n/a: {why} | n/a | "
                f"{e.get('n_pairs', 0)} |"
            )
            continue
        conf = e.get("confidence_per_look") or 0.95
        out.append(
            f"| {e.get('concurrency')} | {e['ratio']:.4f} | [{e['ci_lo']:.4f}, {e['ci_hi']:.4f}] ({conf:.2%}) | "
            f"{serving_decision(e, threshold, sv)} | "
            f"+-{100 * e.get('half_width', (e['ci_hi'] - e['ci_lo']) / 2):.1f}% | {e.get('n_pairs')} |"
        )
    return out + [""]


def attention_share_markdown(share: Any) -> list[str]:
    """Attention's measured share of a decode step: the live figure and the calibration, with the method."""
    if not isinstance(share, Mapping):
        return (
            [f"Attention's measured share of a decode step: {share:.1%}.", ""]
            if isinstance(share, (int, float))
            else []
        )
    out = []
    live, cal = share.get("live"), share.get("calibration") or {}
    how = share.get("method") or "eager steps, attention timed against the whole step"
    if live is not None:
        out.append(
            f"Attention's measured share of a decode step (live, served steps): **{live:.1%}**: the server's "
            "per-step attention time over its step time, summed over its recent eager decode steps (CPU timer; "
            "graph-replayed GPU steps carry no per-step attention time, so on a GPU with CUDA graphs this "
            "figure is absent)."
        )
    if cal:
        parts = ", ".join(
            f"batch {b}: {_f(c.get('attention_share'), '.1%')} ({_f(c.get('attn_ms'))} of {_f(c.get('step_ms'))} ms)"
            for b, c in sorted(cal.items(), key=lambda kv: int(kv[0]))
            if isinstance(c, Mapping)
        )
        out.append(
            f"Attention's measured share at server start (calibration; method: {how}; CUDA events on a GPU, "
            f"perf_counter on a CPU): {parts}."
        )
    return out + [""] if out else []


def profile_markdown(prof: Mapping[str, Any], top: int = 12) -> list[str]:
    """The per-kernel time table per impl (top ``top`` by device time) with each row's share of step time."""
    out = [
        f"Source: **{prof.get('source') or 'not profiled'}**: {prof.get('what') or ''}".rstrip(": ") + ".",
        "",
    ]
    if prof.get("fallback_reason"):
        out += [f"Decode steps of the servers were not profiled: {prof['fallback_reason']}.", ""]
    for impl in SERVING_IMPLS:
        m = (prof.get("impls") or {}).get(impl)
        if not isinstance(m, Mapping):
            continue
        if not m.get("kernels"):
            out += [f"**{impl}**: no table ({m.get('skipped') or 'no rows'}).", ""]
            continue
        bs = m.get("batch_sizes") or []
        cpu = m.get("time_kind") == "cpu_op_self_time"
        unit = "CPU op self time" if cpu else "device time"
        out += [
            f"**{impl}**: {m.get('steps')} {'decode steps' if m.get('source') == 'server_decode_steps' else 'launches'}"
            f" at batch sizes {bs}, mode `{m.get('mode')}`, device {m.get('device')}"
            + (f", {_f(m.get('step_ms_total'))} ms of step time" if m.get("step_ms_total") is not None else "")
            + (" (CPU: rows are CPU ops, not GPU kernels)" if cpu else "")
            + f"; top {min(top, len(m['kernels']))} of {m.get('kernel_rows', len(m['kernels']))} by {unit}; "
            f"share = of {m.get('share_pct_of') or 'the profiled time'}.",
            "",
            f"| kernel | calls | {unit} total us | mean us | share of step time |",
            "|---|---|---|---|---|",
        ]
        for r in m["kernels"][:top]:
            name = str(r.get("name")).replace("|", "\\|")
            if len(name) > 90:
                name = name[:87] + "..."
            out.append(
                f"| `{name}` | {r.get('calls')} | {_f(r.get('device_time_us_total'), '.1f')} | "
                f"{_f(r.get('device_time_us_mean'), '.2f')} | "
                f"{_f(r.get('share_pct'), '.1f')}{'' if r.get('share_pct') is None else '%'} |"
            )
        if m.get("note"):
            out.append(f"\n{m['note']}")
        out.append("")
    return out


def measured_line(bench: Mapping[str, Any]) -> str:
    """The sentence naming what the kernel A/B ran, read from ``bench`` (benchmark.json), not from params: its shape,
    the dtype of the kernel's dots and its rounds. A CPU run's differ from the params' GPU settings (the interpreter
    cannot do bf16 dots, and runs small shapes), and a report that never named the dtype hid that (helper audit R6)."""
    k = bench["kernel"]
    shape = k.get("shape") or {}
    dims = ", ".join(f"{name} {shape[key]}" for key, name in (("num_heads", "H"), ("topk", "top-k"), (
        "page_size", "page size"), ("num_cache_tokens", "cache tokens")) if key in shape)  # fmt: skip
    rounds = (k.get("overall") or {}).get("n_rounds")
    sms = {r[side].get("num_sms") for r in (k.get("batch") or {}).values() for side in ("baseline", "candidate")}
    sms.discard(None)
    splits = (
        f' The splits column is split-K as launched ("auto" resolved for {", ".join(map(str, sorted(sms)))} SMs).'
        if sms
        else ""
    )
    cpu = " (CPU: the interpreter runs fp16 dots at these small shapes, whatever kernel.dot_dtype says)"
    return (
        f"Measured: {shape.get('layout', 'shape')} ({dims or 'shape not recorded'}), the kernel's dots in "
        f"{k.get('dot_dtype') or 'an unrecorded dtype'}, {rounds if rounds is not None else 'an unrecorded number of'} "
        f"rounds{cpu if is_cpu(bench) else ''}.{splits}"
    )


def _detail_note(bench: Mapping[str, Any]) -> str:
    """The sentence on the per-batch-size and per-level decisions, with this run's counts of them."""
    n_batch = len(bench.get("kernel", {}).get("batch") or {})
    n_level = sum(1 for e in serving_levels(bench.get("serving") or {}) if e.get("decision"))
    parts = [f"{n_batch} batch size{'s' if n_batch != 1 else ''}"] if n_batch else []
    if n_level:
        parts.append(f"{n_level} serving level{'s' if n_level != 1 else ''}")
    n = n_batch + n_level
    if n < 2:
        return "The decision per batch size (and per serving level) uses the same per-look level."
    return (
        "The decisions per batch size and per serving level use the same per-look level each and are not "
        f"corrected for how many there are: with {' and '.join(parts)} here, one of them may be called faster "
        f"or slower by chance up to about {n} times as often as the headline; read them as detail, the "
        "headline decides."
    )


def reused_note(bench: Mapping[str, Any], earlier: list[str]) -> str:
    """The report's line for a report-only rerun: ``bench`` (benchmark.json) was already logged by the MLflow runs
    ``earlier`` (ids, newest first), so this run is not a new measurement."""
    ids = ", ".join(f"`{r}`" for r in earlier[:5]) + (f" and {len(earlier) - 5} more" if len(earlier) > 5 else "")
    return (
        f"> **Measurement reused.** This measurement (benchmark.json of {bench.get('measured_at')}, deploy "
        f"`{bench.get('deploy_id')}`) was logged before by MLflow run(s) {ids}: this report re-renders it, it is no "
        "new measurement (MLflow tag `measurement_reused`)."
    )


def render_markdown(
    data: Mapping[str, Any], plots: Mapping[str, str], threshold: float, plots_rel: str = "plots"
) -> str:
    bench, verify, build, deploy = data["benchmark"], data["verify"], data["build"], data["deploy"]
    cpu = is_cpu(bench)
    h = headline(data, threshold)
    v = bench["variants"]
    out = [f"# kernelcamp report: {_who(v['candidate'])} vs {_who(v['baseline'])}", ""]
    if cpu:
        out += [
            "> **CPU run.** Kernel timings come from the Triton interpreter on a CPU (time.perf_counter) at "
            "small shapes; they test the pipeline, not the kernel, and are never GPU results.",
            "",
        ]
    out += [
        "## Decision",
        "",
        decision_line(h, "latency ratio candidate/baseline", note=CPU_DECISION_NOTE if cpu else "") + ".",
        "",
        "Per round, the geometric mean over batch sizes of each side's latency, paired and interleaved. "
        f"Faster / slower: the whole interval below {1 - threshold:.3f} / above {1 + threshold:.3f} "
        f"(`report.threshold` {threshold:.1%}); equivalent: the whole interval inside "
        f"[{1 - threshold:.3f}, {1 + threshold:.3f}] (two one-sided tests); inconclusive otherwise. The rounds "
        "stop at the first planned look that decides; each look's interval is at the overall confidence "
        f"({int(round(100 * (h['confidence'] or 0.95)))}%) split over the planned looks (Bonferroni), so the "
        "error rates hold whichever look the run stops at (kernelcamp.stats). " + _detail_note(bench),
        "",
    ]
    out += ["## Kernel latency per batch size", ""]
    if "kernel_latency" in plots:
        out += [f"![kernel latency]({plots_rel}/{plots['kernel_latency']})", ""]
    out += [
        "| batch | device | baseline p50 us | candidate p50 us | ratio | CI | decision | resolution | "
        "cand. TFLOP/s | cand. GB/s | cand. roofline % | splits (base/cand.) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for b in sorted(bench["kernel"]["batch"], key=int):
        r = bench["kernel"]["batch"][b]
        ab = r.get("ab") or {}
        dec = "n/a (CPU)" if cpu else _decision_of(ab, threshold) if ab else "n/a"
        hw = ab.get("half_width", (ab["ci_hi"] - ab["ci_lo"]) / 2) if ab else None
        c = r["candidate"]
        out.append(
            f"| {b} | {bench['device']} | {_f(r['baseline']['latency_us_p50'])} | "
            f"{_f(c['latency_us_p50'])} | {_f(ab.get('ratio'), '.4f')} | "
            f"[{_f(ab.get('ci_lo'), '.4f')}, {_f(ab.get('ci_hi'), '.4f')}] | {dec} | "
            f"{'n/a' if hw is None else f'+-{100 * hw:.1f}%'} | {_f(c.get('tflops'))} | "
            f"{_f(c.get('gbps'))} | {_f(c.get('roofline_pct'))} | "
            f"{_f(r['baseline'].get('num_splits_ran'), 'd')}/{_f(c.get('num_splits_ran'), 'd')} |"
        )
    out += ["", measured_line(bench)]
    roof = bench["kernel"].get("roofline")
    if roof and roof.get("gpu"):
        out += ["", roofline_note(roof)]
    out += ["", "Config lists that ran:", ""]
    for n in ("baseline", "candidate"):
        out.append(
            f"- {n} `{v[n]['name']}` (config hash {v[n].get('config_hash') or v[n].get('hash')}): "
            f"ran {v[n]['configs_ran']} of "
            f"{v[n]['configs']}: {v[n].get('config_list')}; {_kernel_of(bench, n)}"
        )
        out += [f"  - not measured by this run: {line}" for line in v[n].get("unmeasured_rows") or []]
    if bench.get("run_as_target"):
        out.append(
            f"- run as target **{bench['run_as_target']}** would run it: the configs that target prunes were dropped"
        )
    out += [""]
    sv = bench.get("serving") or {}
    out += serving_markdown(sv, plots, plots_rel, threshold)
    out += [
        "## Build: resources per target",
        "",
        f"Target `{build['target']}`; also inspected: {', '.join(build.get('also_targets') or []) or 'none'}.",
        "",
    ]
    out += build_table(build) + [""]
    out += [
        "## Verify",
        "",
        f"passed: **{verify['passed']}**; kernel cases {verify.get('kernel_cases')} "
        f"(failed {verify.get('kernel_cases_failed')}); capture: {_f(verify.get('capture_passed'))}; "
        f"serving 1 vs N: {_f(verify.get('serving_passed'))}.",
    ]
    for k, why in (verify.get("skipped") or {}).items():
        out.append(f"- {k} skipped: {why}")
    prof = bench.get("profile") or {}
    out += [
        "",
        "## Profile",
        "",
        f"Kineto trace `{prof.get('trace')}`"
        + (f" (baseline: `{prof['trace_baseline']}`)" if prof.get("trace_baseline") else "")
        + f" (open in chrome://tracing or Perfetto); full per-kernel table `{prof.get('kernel_table')}`.",
        "",
    ]
    out += profile_markdown(prof)
    out += ["## Provenance", "", "| what | value |", "|---|---|"]
    prov = [
        ("benchmark measured_at", bench.get("measured_at")),
        ("verify measured_at", verify.get("measured_at")),
        ("host", bench.get("host")),
        ("device", bench.get("device")),
        ("GPU", bench.get("gpu") or "none (CPU)"),
        ("driver", bench.get("driver")),
        ("SM clock during the kernel rounds, MHz (min / p50 / max)", _clock(bench)),
        ("torch", bench.get("torch")),
        ("triton", bench.get("triton")),
        ("git commit", bench.get("git_commit")),
        ("git dirty", bench.get("git_dirty")),
        ("deploy id (benchmark)", bench.get("deploy_id")),
        ("deploy id (verify)", verify.get("deploy_id")),
        ("deploy url", deploy.get("url")),
        # a deploy that found the same server running reused it: the server then started before this run (R8)
        ("candidate server", _server_origin(deploy)),
        ("kernel source hash (candidate: the working tree's file)", bench.get("kernel_source_hash")),
        ("baseline kernel rev (null: the working tree's file)", bench.get("baseline_kernel_rev")),
        ("baseline kernel source hash", bench.get("baseline_kernel_source_hash")),
        ("timing method", bench.get("timing")),
    ]
    out += [f"| {k} | {_f(val)} |" for k, val in prov]
    if verify.get("deploy_id") != bench.get("deploy_id"):
        out += ["", "**Warning: benchmark and verify measured different deploys.**"]
    return "\n".join(out) + "\n"


def _server_origin(deploy: Mapping[str, Any]) -> str:
    """Whether the deploy started the candidate's server or reused one already running (deploy.json's ``reused``),
    with the server's start time where its info gives one."""
    started = (deploy.get("server_info") or {}).get("started_at")  # the server's time.time() at its start
    if isinstance(started, (int, float)) and not isinstance(started, bool):
        import datetime

        started = datetime.datetime.fromtimestamp(started, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    since = f", running since {started}" if started else ""
    if deploy.get("reused") is True:
        return f"reused: an earlier deploy's server with the same variant and flags{since}"
    if deploy.get("reused") is False:
        return f"started by this run's deploy{since}"
    return "not recorded"


def roofline_note(roof: dict) -> str:
    """One sentence on what the report's roofline % is measured against (benchmark.json's
    ``kernel.roofline``, :func:`kernelcamp.bench.kernel.roofline_basis`)."""
    if not roof.get("target"):
        return f"Roofline %: not computed on {roof['gpu']}: {roof.get('why')}."
    s = (
        f"Roofline %: against the peaks of {roof['gpu']}, the GPU that ran (conf/target `{roof['target']}`: "
        f"{roof['peak_gbps']:,.0f} GB/s, {roof['peak_bf16_tflops']:,.0f} TFLOP/s bf16)"
    )
    if roof.get("params_target_gpu") and roof["params_target_gpu"] != roof["gpu"]:
        s += f"; params.yaml's target `{roof.get('params_target')}` describes {roof['params_target_gpu']}"
    return s + "."


def _decision_of(ab: Mapping[str, Any], threshold: float, higher_is_better: bool = False) -> str | None:
    """The recorded decision when the record says it was made at ``threshold``, else computed from the
    interval (a record without its threshold is never taken as made at this one: the serving levels
    of records before the twenty-first session carried none, and their 2% decisions were shown beside
    a report at another ``report.threshold``)."""
    if ab.get("ci_lo") is None:
        return None
    if ab.get("decision") and ab.get("threshold") == threshold:
        return ab["decision"]
    return decision(ab["ratio"], ab["ci_lo"], ab["ci_hi"], threshold, higher_is_better)


def serving_unserved(sv: Mapping[str, Any]) -> str | None:
    """Why a serving A/B decides nothing about the variants, or None: the servers did not run the
    variants' kernel (``attention_impl`` other than ``"triton"``, e.g. ``torch_reference_cpu`` on a
    machine without a GPU). Baseline and candidate servers differ only in the variant, so both then run
    the same attention code, and an interval between them measures noise, as CPU kernel timings do."""
    impl = sv.get("attention_impl")
    if impl in (None, "triton"):
        return None
    return f"both servers ran the {impl} attention, not the variants' kernels"


def serving_decision(e: Mapping[str, Any], threshold: float, sv: Mapping[str, Any]) -> str | None:
    """The decision on a serving ratio (a level's or the overall, throughput: higher is faster) at
    ``threshold``: ``inconclusive`` where :func:`serving_unserved` gives a reason, else
    :func:`_decision_of`; None without an interval."""
    dec = _decision_of(e, threshold, True)
    return "inconclusive" if dec is not None and serving_unserved(sv) else dec


def _who(note: Mapping[str, Any]) -> str:
    """A variant as the title names it: its name and its config, or how many (``bt16_w4
    [T16_H16_w8_s2_kauto]``, ``story_autotune [3 configs]``), so that an override of the variant file
    (``-S variant.num_warps=8``) shows in the title; a baseline at ``baseline.kernel_rev`` gets
    ``@ kernel <sha, 12 hex>``."""
    cfgs = note.get("configs") or []
    table = "batch table" in str(note.get("config_list", ""))
    what = cfgs[0] if len(cfgs) == 1 else f"table of {len(cfgs)}" if table else f"{len(cfgs)} configs" if cfgs else None
    who = f"{note['name']} [{what}]" if what else str(note["name"])
    return who + (f" @ kernel {note['kernel_rev'][:12]}" if note.get("kernel_rev") else "")


def _kernel_of(bench: Mapping[str, Any], impl: str) -> str:
    """Which kernel file side ``impl`` ran, from benchmark.json: ``kernel at <sha> (source <sha256>)`` for
    a baseline at ``baseline.kernel_rev``, else the working tree's (records before kernel_rev: unnamed)."""
    note = (bench.get("variants") or {}).get(impl) or {}
    src = note.get("kernel_source_hash")
    if src is None:
        return "kernel: the working tree's (not recorded)"
    rev = note.get("kernel_rev")
    where = f"kernel at commit {rev}" if rev else "the working tree's kernel"
    return f"{where} (source sha256 {src[:16]})"


def _clock(bench: Mapping[str, Any]) -> str | None:
    c = (bench.get("kernel") or {}).get("sm_clock_during_rounds") or {}
    if not c:
        return None
    return f"{c['sm_clock_mhz_min']} / {c['sm_clock_mhz_p50']} / {c['sm_clock_mhz_max']} ({c['samples']} samples)"

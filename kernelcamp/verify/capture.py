"""CUDA-graph capture safety of a sparse MLA decode launcher.

A server captures its decode step in a CUDA graph. If the kernel launch compiles or runs Triton's
autotune benchmarking while the graph is being captured, the capture fails (benchmarking syncs the
device) or, worse, records a half-tuned launch (DESIGN.md, the story). ``check_capture_safety``
captures one launch, replays it, compares with an eager launch and raises ``KernelcampError`` if
anything was compiled or benchmarked during the capture.
"""

from __future__ import annotations

from typing import Any

from kernelcamp.errors import KernelcampError


def _call(launcher: Any, inputs: dict[str, Any]) -> Any:
    return launcher(
        inputs["q"],
        inputs["kv_cache"],
        inputs["indices"],
        inputs["layout"],
        inputs["page_size"],
        inputs.get("sm_scale"),
        check_indices=False,
    )


def _max_abs_diff(a: Any, b: Any) -> float:
    import torch

    a, b = a.float(), b.float()
    same_inf = torch.isinf(a) & torch.isinf(b) & (torch.sign(a) == torch.sign(b))
    d = torch.where(same_inf, torch.zeros_like(a), (a - b).abs())
    d = torch.nan_to_num(d, nan=float("inf"))
    return float(d.max()) if d.numel() else 0.0


def check_capture_safety(
    launcher: Any, inputs: dict[str, Any], *, warmup_inputs: dict[str, Any] | None = None, atol: float = 0.0
) -> dict[str, Any]:
    """Capture ``launcher(**inputs)`` in a CUDA graph, replay it and compare with an eager launch.

    launcher: a ``kernels.sparse_mla_decode.SparseMLADecode`` (uses its ``compile_count`` and
    ``autotune_bench_runs`` counters). inputs: ``make_inputs`` dict. warmup_inputs: if given, launched
    eagerly before the capture (a server's warm-up pass; pass the same shapes to model a warmed
    server, a different batch size to model the DESIGN.md story). Nothing else is warmed: a cold
    launcher compiles, and a cold autotune list benchmarks, inside the capture and is caught.

    Returns ``{captured, replay_matches_eager, max_abs_diff, compiles_during_capture,
    autotune_runs_during_capture, config}``. Raises ``KernelcampError`` when anything was compiled
    or benchmarked during capture, when the capture failed, or when the replay differs from eager by
    more than ``atol`` (the kernel is deterministic, so the default is exact).
    """
    import torch

    if not torch.cuda.is_available():
        raise KernelcampError("check_capture_safety needs a CUDA GPU and none is visible")
    if warmup_inputs is not None:
        _call(launcher, warmup_inputs)
        torch.cuda.synchronize()
    compiles0, runs0 = launcher.compile_count, launcher.autotune_bench_runs
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    error: BaseException | None = None
    result = None
    with torch.cuda.stream(stream):
        graph.capture_begin()
        try:
            result = _call(launcher, inputs)
        except Exception as e:  # noqa: BLE001 - any failure inside capture is reported below
            error = e
        finally:
            try:
                graph.capture_end()
            except Exception as e:  # noqa: BLE001
                error = error or e
    torch.cuda.current_stream().wait_stream(stream)
    compiles = launcher.compile_count - compiles0
    runs = launcher.autotune_bench_runs - runs0
    report: dict[str, Any] = {
        "captured": error is None,
        "replay_matches_eager": None,
        "max_abs_diff": None,
        "compiles_during_capture": compiles,
        "autotune_runs_during_capture": runs,
        "config": launcher.last_config.label() if launcher.last_config else None,
    }
    name = getattr(getattr(launcher, "variant", None), "name", "?")
    if compiles or runs:
        msg = (
            f"variant {name!r} is not capture-safe: {runs} autotune benchmark run(s) and {compiles} compile(s) "
            "happened during CUDA-graph capture; warm the launcher up at every captured shape before capture, "
            "or use a single-config variant"
        )
        if error is not None:
            msg += f" (the capture failed: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})"
        err = KernelcampError(msg)
        err.report = report  # type: ignore[attr-defined]
        raise err
    if error is not None:
        raise KernelcampError(
            f"variant {name!r}: CUDA-graph capture failed: {type(error).__name__}: {error}"
        ) from error
    graph.replay()
    torch.cuda.synchronize()
    out_g, lse_g = result
    out_e, lse_e = _call(launcher, inputs)
    torch.cuda.synchronize()
    diff = max(_max_abs_diff(out_g, out_e), _max_abs_diff(lse_g, lse_e))
    report.update(replay_matches_eager=diff <= atol, max_abs_diff=diff)
    if diff > atol:
        raise KernelcampError(
            f"variant {name!r}: the graph replay differs from the eager launch by {diff} (allowed {atol})"
        )
    return report

"""Host cost of one decode step's input load (``DecoderModel._load``), alone and beside a busy Python thread.

Issue 12: under serving load the decode step's ``load_ms`` moved 2.1-3.2 ms between runs while the same
``_load`` alone took 0.20 ms. The model thread shares the GIL with the HTTP event loop; every call that
releases the GIL (most torch calls do) lets the other thread take it, and getting it back can take up
to the switch interval (``sys.getswitchinterval()``, 5 ms by default). This script measures that:

1. ``alone``: ``_load`` of a ``--batch`` of requests (``--pages`` pages each, padded to the bucket the
   server would pad to) timed ``--iters`` times, the same requests in the same rows every step (the
   steady state); ``alone_shift``: every step's rows shifted by one request against the previous
   step's (as after a request finishes), so every row's page table changes;
2. ``busy``, ``busy_shift``: the same with one pure-Python thread spinning beside it (as the event loop
   thread does while it writes 64 SSE streams);
3. ``busy_slow_switch``: ``busy_shift`` with the switch interval raised to ``--switch-ms`` (default
   20 ms): each GIL hand-over then costs about one interval, so ``mean / switch`` is about the number
   of times per ``_load`` that the other thread got the GIL (``gil_handovers_est``; a release the
   loading thread wins back at once is not counted).

``--what decode`` times whole ``decode`` steps instead (CUDA graphs as params.yaml's ``server.cuda_graphs``
says; the step's bucket is captured during the warm-up) and adds the p50 of the step's own ``last_timing``
parts per mode: how many hand-overs are left in the whole step (events, replay, ``.tolist()``). Meant
for a GPU with graphs: on a CPU a step is the eager forward, hundreds of torch calls, seconds per step
with the busy thread.

Runs on a CPU (``--device cpu``: the small CPU model, figures are CPU figures) or a GPU (``--device
cuda:0``: the workload's model; the GPU is synchronized between loads, outside the timed part, as
``decode``'s ``.tolist()`` does). It calls only ``_load(tokens, positions, pages, nb)`` (or ``decode``),
so it runs unchanged on trees before and after the staging-buffer change, for an A/B::

    python benchmarks/load_gil_check.py --device cuda:0 [--params params.yaml] [--batch 64] [--pages 8]

Prints one JSON object on stdout (times in ms: mean, p50, p90, max per mode) and a digest on stderr.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


from benchmarks.serving_noise_summary import spread  # noqa: E402


def _spread(xs: list[float]) -> dict[str, float]:
    return {**spread(xs), "max": round(max(xs), 4)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=64, help="requests in the step")
    ap.add_argument("--pages", type=int, default=8, help="pages per request (at most max_context/page_size)")
    ap.add_argument("--iters", type=int, default=200, help="timed loads per mode")
    ap.add_argument("--switch-ms", type=float, default=20.0, help="switch interval of the third mode")
    ap.add_argument("--what", choices=["load", "decode"], default="load", help="time _load, or whole decode steps")
    args = ap.parse_args()
    for name, low in (("batch", 1), ("pages", 1), ("iters", 2)):
        if getattr(args, name) < low:
            ap.error(f"--{name} {getattr(args, name)}: must be >= {low}")
    if not args.switch_ms > 0:
        ap.error(f"--switch-ms {args.switch_ms}: must be > 0")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
        ap.error(f"--device {args.device}: expected cpu, cuda or cuda:N")

    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: no CUDA GPU here (use --device cpu)")

    from kernelcamp.hashes import server_flags
    from kernelcamp.io import load_params
    from kernelcamp.serve.model import DecoderModel, ModelConfig
    from kernelcamp.variant import parse_variant

    params = load_params(Path(args.params))
    on_gpu = args.device.startswith("cuda")
    if on_gpu:
        torch.cuda.set_device(torch.device(args.device))
    flags = server_flags(params.get("server") or {})
    cfg = ModelConfig.from_params(params, args.device)
    model = DecoderModel(
        cfg,
        parse_variant(params.get("variant") or {}),
        params.get("kernel"),
        args.device,
        # _load does not need the graphs (the buckets, for the padding, are kept); decode uses them if on
        cuda_graphs=flags["cuda_graphs"] and args.what == "decode",
        graph_batch_buckets=flags["graph_batch_buckets"],
    )
    b, npg = args.batch, min(args.pages, model.max_pages)
    if b > model.buckets[-1]:
        ap.error(f"--batch {b}: more than the server's largest batch bucket {model.buckets[-1]}")
    nb = model.bucket_for(b)
    tokens = [7 + i for i in range(b)]
    positions = [npg * cfg.page_size - 1 - i % cfg.page_size for i in range(b)]
    pages = [[1 + (i * npg + j) % (model.num_pages - 1) for j in range(npg)] for i in range(b + 1)]
    same = [(tokens, positions, pages[:b])]
    shift = [(tokens, positions, pages[:b]), (tokens, positions, pages[1:])]

    def synced() -> None:
        """What decode's ``.tolist()`` does between two loads: wait for the GPU (so the staging rows are free
        again; a tree without them has no ``_staging_pending``), releasing the GIL while it waits, so each
        load starts with the GIL just taken back, as in the server (a forced switch then comes only after
        a whole switch interval, far longer than one load)."""
        if on_gpu:
            torch.cuda.synchronize()
        time.sleep(0)  # releases the GIL, as the GPU wait does on a GPU
        if hasattr(model, "_staging_pending"):
            model._staging_pending = False

    parts: dict[str, list[float]] = {}

    def timed(n: int, steps: list) -> list[float]:
        out = []
        parts.clear()
        with torch.inference_mode():
            for k in range(n):
                synced()
                tok, pos, pg = steps[k % len(steps)]
                t0 = time.perf_counter()
                if args.what == "decode":
                    model.decode(tok, pos, pg)
                else:
                    model._load(tok, pos, pg, nb)
                out.append((time.perf_counter() - t0) * 1e3)
                for key, v in (model.last_timing if args.what == "decode" else {}).items():
                    if v is not None:
                        parts.setdefault(key, []).append(v)
        synced()
        return out

    def parts_p50() -> dict[str, float]:
        return {k: round(statistics.median(v), 4) for k, v in parts.items()}

    timed(20, shift)  # warm-up: first-call allocations, pinned-memory setup
    res: dict = {
        "what": args.what,
        "device": str(model.device),
        "cuda_graphs": model.cuda_graphs,
        "batch": b,
        "bucket": nb,
        "pages_per_request": npg,
        "max_pages": model.max_pages,
        "iters": args.iters,
        "torch": torch.__version__,
    }
    res["alone"] = _spread(timed(args.iters, same))
    res["alone_shift"] = _spread(timed(args.iters, shift))
    if args.what == "decode":
        res["alone_shift_parts_p50"] = parts_p50()

    stop = threading.Event()

    def spin() -> None:
        x = 0
        while not stop.is_set():
            for _ in range(1000):
                x += 1

    default_switch = sys.getswitchinterval()
    th = threading.Thread(target=spin, daemon=True)
    th.start()
    try:
        time.sleep(0.05)
        res["busy"] = _spread(timed(args.iters, same))
        res["busy_shift"] = _spread(timed(args.iters, shift))
        if args.what == "decode":
            res["busy_shift_parts_p50"] = parts_p50()
        res["switch_ms_default"] = default_switch * 1e3
        sys.setswitchinterval(args.switch_ms / 1e3)
        slow = timed(max(10, args.iters // 10), shift)
        res["busy_slow_switch"] = _spread(slow)
        res["switch_ms"] = args.switch_ms
        res["gil_handovers_est"] = round(statistics.fmean(slow) / args.switch_ms, 2)
    finally:
        sys.setswitchinterval(default_switch)
        stop.set()
        th.join()
    print(json.dumps(res))
    print(
        f"{args.what} b={b} nb={nb} pages={npg} on {res['device']}: alone p50 {res['alone']['p50']:.3f} ms "
        f"(rows shifted {res['alone_shift']['p50']:.3f}); busy thread p50 {res['busy']['p50']:.3f} ms "
        f"p90 {res['busy']['p90']:.3f} (rows shifted p50 {res['busy_shift']['p50']:.3f} "
        f"p90 {res['busy_shift']['p90']:.3f}); ~{res['gil_handovers_est']} GIL hand-overs per call "
        f"(switch {args.switch_ms:g} ms)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

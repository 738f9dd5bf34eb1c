"""``kernelcamp loadgen``: load any OpenAI-compatible server and report vLLM ``bench serve``'s metrics.

    kernelcamp loadgen --url http://127.0.0.1:8765 --concurrency 1 8 32 --num-requests 64 --max-tokens 128
    kernelcamp loadgen --url http://127.0.0.1:8000 --concurrency 16 --chat --model my-model --json | jq .

For each concurrency level C (in the order given) ``--num-requests`` streamed requests (default 2*C)
from kernelcamp's fixed prompt set are sent by C concurrent workers, each asking for ``--max-tokens``
tokens at temperature 0, against ``/v1/completions`` (``/v1/chat/completions`` with ``--chat``). The
client, its token counting and its metrics are :mod:`kernelcamp.serving.loadgen`'s (the benchmark
stage's own): :func:`~kernelcamp.serving.loadgen.run_level` and
:func:`~kernelcamp.serving.loadgen.level_metrics`.

Metrics per level, as vLLM's ``bench serve`` reports them (its labels in the human output), with
DESIGN.md's names as keys in ``--json``: successful / failed / incomplete requests
(``requests_ok``, ``requests_failed``, ``incomplete``; a failed or incomplete request never counts
toward throughput, and marks the level ``valid: false``), benchmark duration (``wall_s``, s), request
throughput (``request_throughput``, ok requests / s), output token throughput (``output_tok_s``),
and TTFT, TPOT (first token excluded), ITL and end-to-end latency (``ttft_ms``, ``tpot_ms``,
``itl_ms``, ``e2e_ms``; vLLM's E2EL) as ``_mean``, ``_p50`` (vLLM's "Median"), ``_p90`` and ``_p99``,
all in ms.

Output: a progress bar per level on stderr (rich). Without ``--json``, one result block per level on
stdout as vLLM prints it. With ``--json``, one JSON object per level on stdout (JSON Lines, each
printed as its level ends, so ``jq`` or a pipe sees results while later levels run), and one summary
line per level on stderr.

Exit status: 0 when every level is valid; 1 when some level had a failed or incomplete request (its
results are still printed); 2 for bad input: a URL that is not ``http(s)://host[:port]``, a count
that is not a positive integer, a server that cannot be reached or refuses the API key (one
``error:`` line on stderr, no traceback); 130 on Ctrl-C.

``--url`` is the server's base URL; a trailing ``/v1`` is accepted and dropped. ``--model``: the
model name sent (default: the first id of ``/v1/models``, else ``default``). ``--api-key``: sent as
``Authorization: Bearer`` (default ``$KERNELCAMP_API_KEY``; prefer the variable, a command line is
visible in ``ps``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from kernelcamp.errors import KernelcampError

PROG = "kernelcamp loadgen"


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one ``error: ...`` line on stderr and exit status 2."""

    def error(self, message: str):  # noqa: D102 - argparse's hook
        print(f"error: {message} (see `{PROG} --help`)", file=sys.stderr, flush=True)
        raise SystemExit(2)


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{v} is not positive (expected an integer >= 1)")
    return v


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a positive, finite number of seconds")
    return v


def build_parser() -> argparse.ArgumentParser:
    """The ``kernelcamp loadgen`` argument parser (usage errors exit 2 with one ``error:`` line)."""
    ap = _Parser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True, help="the server's base URL, http://host:port (a trailing /v1 is dropped)")
    ap.add_argument(
        "--concurrency",
        type=_positive_int,
        nargs="+",
        default=[1],
        metavar="N",
        help="concurrency levels, run in this order (default: 1)",
    )
    ap.add_argument(
        "--num-requests", type=_positive_int, default=None, metavar="N", help="requests per level (default: 2 x level)"
    )
    ap.add_argument("--max-tokens", type=_positive_int, default=256, metavar="N", help="tokens per request (256)")
    ap.add_argument(
        "--timeout-s", type=_positive_float, default=300.0, metavar="S", help="per-request time limit in s (300)"
    )
    ap.add_argument("--chat", action="store_true", help="use /v1/chat/completions instead of /v1/completions")
    ap.add_argument("--model", default=None, help="model name to send (default: the first of /v1/models)")
    ap.add_argument("--api-key", default=None, help="Bearer key (default: $KERNELCAMP_API_KEY)")
    ap.add_argument("--json", action="store_true", help="one JSON object per level on stdout (JSON Lines)")
    return ap


def base_url(url: str) -> str:
    """``url`` as the load generator's base: ``http(s)://host[:port][/prefix]`` without a trailing ``/``
    or ``/v1``. Raises ``KernelcampError`` for another scheme, no host, or a bad port."""
    u = urlsplit(url.strip())
    if u.scheme not in ("http", "https") or not u.netloc:
        raise KernelcampError(f"--url {url!r}: expected http://host:port or https://host:port")
    try:
        if u.hostname is None:
            raise ValueError("no host")
        u.port  # noqa: B018 - raises ValueError for a port outside 0..65535 or not a number
    except ValueError as e:
        raise KernelcampError(f"--url {url!r}: {e}") from None
    if u.query or u.fragment:
        raise KernelcampError(f"--url {url!r}: give the server's base URL, without a query or fragment")
    path = u.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return f"{u.scheme}://{u.netloc}{path}"


def probe_server(base: str, api_key: str | None, timeout_s: float = 10.0) -> str | None:
    """Check that ``base`` answers HTTP before any load (``GET /v1/models``); returns the first model id
    it lists, or None when it lists none (any HTTP answer but 401/403 counts as reachable).

    Raises ``KernelcampError`` when the server cannot be reached within ``timeout_s`` seconds, or
    refuses the API key (401/403)."""
    import httpx

    from kernelcamp.serving.client import auth_headers

    try:
        r = httpx.get(base + "/v1/models", headers=auth_headers(api_key), timeout=timeout_s)
    except httpx.HTTPError as e:
        why = " ".join(str(e).split()) or type(e).__name__
        raise KernelcampError(f"cannot reach {base}: {why[:200]}") from None
    if r.status_code in (401, 403):
        raise KernelcampError(
            f"{base} refuses the request ({r.status_code}): pass its key with --api-key or $KERNELCAMP_API_KEY"
        )
    try:
        return str(r.json()["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        return None


def json_row(row: dict[str, Any], url: str, model: str | None, chat: bool) -> dict[str, Any]:
    """One level's ``--json`` object: the loadgen metrics row plus ``request_throughput`` (ok requests
    per second of ``wall_s``; None when the level took no time), ``url``, ``model`` and ``endpoint``."""
    wall = row.get("wall_s") or 0.0
    return {
        "url": url,
        "endpoint": "/v1/chat/completions" if chat else "/v1/completions",
        "model": model,
        **row,
        "request_throughput": row["requests_ok"] / wall if wall > 0 else None,
    }


def result_block(obj: dict[str, Any]) -> str:
    """A level's result as vLLM's ``bench serve`` prints it (its labels; Median = p50), plus the
    incomplete count and whether the level is valid."""

    def num(v: Any, spec: str = ".2f") -> str:
        return "-" if v is None else format(v, spec)

    def line(label: str, value: Any) -> str:
        return f"{label:<40} {value}"

    out = [
        "{s:{c}^50}".format(s=f" Serving Benchmark Result (concurrency {obj['concurrency']}) ", c="="),
        line("Endpoint:", obj["url"] + obj["endpoint"]),
        line("Maximum request concurrency:", obj["concurrency"]),
        line("Successful requests:", obj["requests_ok"]),
        line("Failed requests:", obj["requests_failed"]),
        line("Incomplete requests:", obj["incomplete"]),
        line("Benchmark duration (s):", num(obj["wall_s"])),
        line("Total generated tokens:", num(obj["output_tokens"], "g")),
        line("Request throughput (req/s):", num(obj["request_throughput"])),
        line("Output token throughput (tok/s):", num(obj["output_tok_s"])),
        line("Per-request output tok/s (mean):", num(obj["per_request_tok_s"])),
    ]
    for key, name, title in (
        ("ttft", "TTFT", "Time to First Token"),
        ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
        ("itl", "ITL", "Inter-token Latency"),
        ("e2e", "E2EL", "End-to-end Latency"),
    ):
        out.append("{s:{c}^50}".format(s=title, c="-"))
        for stat, label in (("mean", "Mean"), ("p50", "Median"), ("p90", "P90"), ("p99", "P99")):
            out.append(line(f"{label} {name} (ms):", num(obj[f"{key}_ms_{stat}"])))
    valid = "yes" if obj["valid"] else f"NO {obj['failure_reasons'] or 'no successful request'}"
    out += [line("Valid level:", valid), "=" * 50]
    return "\n".join(out)


async def _run(args: argparse.Namespace, base: str, model: str | None) -> list[dict[str, Any]]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from kernelcamp.serving.loadgen import default_prompts, progress_line, run_level

    prompts = default_prompts()
    rows = []
    console = Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    for c in args.concurrency:
        n = args.num_requests if args.num_requests is not None else 2 * c
        with Progress(*columns, console=console) as bar:
            task = bar.add_task(f"concurrency {c}", total=n)
            row, _ = await run_level(
                base,
                prompts,
                c,
                max_tokens=args.max_tokens,
                num_requests=n,
                timeout_s=args.timeout_s,
                chat=args.chat,
                model=model,
                api_key=args.api_key,
                on_result=lambda _r, task=task, bar=bar: bar.advance(task),
            )
        obj = json_row(row, base, model, args.chat)
        rows.append(obj)
        if args.json:
            print(json.dumps(obj), flush=True)
            print(progress_line(row), file=sys.stderr, flush=True)
        else:
            print(result_block(obj), flush=True)
    return rows


def cli_main(argv: Sequence[str] | None = None) -> int:
    """``kernelcamp loadgen``: returns 0 (every level valid), 1 (some level invalid) or 2 (bad input,
    one ``error:`` line on stderr); 130 on Ctrl-C. See the module docstring."""
    args = build_parser().parse_args(argv)
    try:
        base = base_url(args.url)
        if args.api_key is not None and not args.api_key.strip():
            raise KernelcampError("--api-key: empty; pass a key or leave the option out")
        listed = probe_server(base, args.api_key)
        model = args.model or listed
        rows = asyncio.run(_run(args, base, model))
    except KernelcampError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        print("loadgen: interrupted", file=sys.stderr, flush=True)
        return 130
    return 0 if all(r["valid"] for r in rows) else 1

"""``kernelcamp`` command line: a thin dispatcher; each subcommand lives with its library module.

kernelcamp inspect ...   compile-inspect a variant for one or more targets (kernelcamp.inspect)
kernelcamp serve ...     run the embedded OpenAI-compatible decode server (kernelcamp.serving.server)
kernelcamp loadgen ...   load any OpenAI-compatible server, vLLM bench serve's metrics (kernelcamp.serving.loadgen_cli)
kernelcamp sweep ...     queued sweep with one DVC experiment worker per GPU (kernelcamp.sweep)
"""

from __future__ import annotations

import importlib
import sys

SUBCOMMANDS = {
    "inspect": (
        "kernelcamp.inspect",
        "compile every config of a variant for target GPUs; shared memory, "
        "registers, spills, occupancy, which configs the target prunes",
    ),
    "serve": ("kernelcamp.serving.server", "run the embedded OpenAI-compatible decode server"),
    "loadgen": (
        "kernelcamp.serving.loadgen_cli",
        "load an OpenAI-compatible server at concurrency levels: TTFT, TPOT, ITL, e2e, tok/s",
    ),
    "sweep": ("kernelcamp.sweep", "run queued DVC experiments with one worker pinned to each GPU"),
}


def _usage() -> str:
    lines = ["usage: kernelcamp <command> [options]", "", "commands:"]
    lines += [f"  {name:<9} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    lines += ["", "`kernelcamp <command> --help` shows a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Dispatch to ``<module>.cli_main(argv)``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:  # a missing command is a usage error, as argparse treats one
        print(_usage(), file=sys.stderr)
        return 2
    if argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd not in SUBCOMMANDS:
        print(f"error: unknown command {cmd!r}; choose one of {', '.join(SUBCOMMANDS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[cmd][0])
    return int(module.cli_main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())

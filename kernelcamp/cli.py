"""``kernelcamp`` command line: the one entry point; each command's options live with its module.

    kernelcamp inspect ...    compile-inspect a variant for one or more targets   (kernelcamp.inspect.cli)
    kernelcamp serve ...      the embedded OpenAI-compatible decode server         (kernelcamp.serve.server)
    kernelcamp loadgen ...    load any OpenAI-compatible server, vLLM's metrics    (kernelcamp.loadgen)
    kernelcamp sweep ...      queued sweep, one DVC experiment worker per GPU      (kernelcamp.sweep)
                              or submitit jobs on this machine or SLURM            (kernelcamp.launcher)
    kernelcamp compose ...    recompose params.yaml from conf/ as dvc exp run does (kernelcamp.compose)
    kernelcamp campaign ...   collect a finished experiment into a campaign folder (kernelcamp.campaign)

A command's module has ``build_parser(sub)``, which adds its subparser to ``sub`` and sets
``main``, and ``main(args) -> int``. Only the module of the command given is imported (``kernelcamp
serve`` needs torch and fastapi, ``kernelcamp compose`` neither). Every usage error, of every
command, is one ``error: ...`` line on stderr and exit status 2. ``python -m kernelcamp.cli`` is the
same entry point for a tree that is not installed (the DVC stages' own copy, a GPU machine).
The DVC stages are scripts of their own (``python -m stages.<name>``, dvc.yaml), not commands.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

#: command -> (module, one-line help). The order is the order of ``kernelcamp --help``.
COMMANDS = {
    "inspect": (
        "kernelcamp.inspect.cli",
        "compile every config of a variant for target GPUs; shared memory, "
        "registers, spills, occupancy, which configs the target prunes",
    ),
    "serve": ("kernelcamp.serve.server", "run the embedded OpenAI-compatible decode server"),
    "loadgen": (
        "kernelcamp.loadgen",
        "load an OpenAI-compatible server at concurrency levels: TTFT, TPOT, ITL, e2e, tok/s",
    ),
    "sweep": (
        "kernelcamp.sweep",
        "run queued DVC experiments: one worker pinned to each GPU, or submitit jobs (--launcher local|slurm)",
    ),
    "compose": ("kernelcamp.compose", "recompose params.yaml from conf/ exactly as dvc exp run does"),
    "campaign": ("kernelcamp.campaign", "collect a finished experiment's params, lock and reports"),
}


class UsageParser(argparse.ArgumentParser):
    """argparse whose usage errors are one ``error: ...`` line on stderr and exit status 2."""

    #: The help to point to: the command's (``kernelcamp inspect --help``) where the top parser reports an error of
    #: the command's arguments (an unknown option is reported by it); else this parser's own.
    help_hint: str | None = None

    def error(self, message: str):  # noqa: D102 - argparse's hook
        print(f"error: {message} (see `{self.help_hint or self.prog + ' --help'}`)", file=sys.stderr, flush=True)
        raise SystemExit(2)


def _usage() -> str:
    lines = ["usage: kernelcamp <command> [options]", "", "commands:"]
    lines += [f"  {name:<9} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "`kernelcamp <command> --help` shows a command's options."]
    return "\n".join(lines)


def build_parser(command: str) -> argparse.ArgumentParser:
    """The ``kernelcamp`` parser with ``command``'s subparser (its module imported, no other)."""
    ap = UsageParser(prog="kernelcamp")
    ap.help_hint = f"kernelcamp {command} --help"
    sub = ap.add_subparsers(dest="command", metavar="<command>", required=True)
    importlib.import_module(COMMANDS[command][0]).build_parser(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``) and run the command's ``main``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:  # a missing command is a usage error, as argparse treats one
        print(_usage(), file=sys.stderr)
        print("error: no command given (see `kernelcamp --help`)", file=sys.stderr)
        return 2
    if argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv[0] == "--version":
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"kernelcamp {version('kernelcamp')}")
        except PackageNotFoundError:  # a tree run with python -m kernelcamp.cli, not installed
            print("kernelcamp (not installed: no version)")
        return 0
    if argv[0] not in COMMANDS:
        print(f"error: unknown command {argv[0]!r}; choose one of {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    args = build_parser(argv[0]).parse_args(argv)
    try:
        return int(args.main(args) or 0)
    except OSError as e:  # a path given on the command line the system refused (too long, a file for a folder, ...)
        if e.filename is None or isinstance(e, BrokenPipeError):
            raise
        # a program the command runs (git, dvc) that is not installed fails the same way, named without a folder
        hint = "check the paths given" if os.sep in str(e.filename) else "a path given, or a program not installed"
        print(f"error: {_path_shown(e.filename)}: {e.strerror or e}; {hint}", file=sys.stderr)
        return 2


def _path_shown(path: object, limit: int = 120) -> str:
    """``path`` for a one-line message: a path longer than ``limit`` characters keeps its start and end."""
    text = str(path)
    return text if len(text) <= limit else f"{text[: limit // 2]}...{text[-(limit // 3) :]} ({len(text)} characters)"


def run() -> None:
    """The console script: :func:`main`, and a reader that closed the pipe (``kernelcamp --help | head``)
    ends the output quietly instead of with a ``BrokenPipeError`` traceback."""
    try:
        rc = main()
        if sys.stdout is not None:  # None when started with stdout closed (`kernelcamp loadgen ... >&-`)
            sys.stdout.flush()
    except BrokenPipeError:
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's advice for SIGPIPE
        rc = 1
    sys.exit(rc)


if __name__ == "__main__":
    run()

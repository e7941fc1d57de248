"""The ``hydrax`` command (also ``python -m hydrax``): one parser, with a module per subcommand.

``hydrax info``, ``hydrax demo``, ``hydrax shards build|index|verify|inspect``, ``hydrax show``,
``hydrax stat``, ``hydrax bench``, ``hydrax serve`` and ``hydrax monitor``; ``hydrax COMMAND --help``
explains each, with an example.
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: Subcommand modules in ``hydrax.commands``: top-level ones, then those under ``hydrax shards``.
TOP_LEVEL = ("info", "demo", "show", "stat", "bench", "serve", "monitor")
SHARD_COMMANDS = ("build", "index", "verify", "inspect")


def _register(subparsers, names) -> None:
    for name in names:
        importlib.import_module(f".commands.{name}", __package__).register(subparsers)


def parser() -> argparse.ArgumentParser:
    """The whole command line."""
    from . import __version__

    top = argparse.ArgumentParser(prog="hydrax", description="hydrax: a zero-copy multiprocess data loader for JAX")
    top.add_argument("--version", action="version", version=f"hydrax {__version__}")
    commands = top.add_subparsers(dest="command", metavar="COMMAND")
    shards = commands.add_parser("shards", help="build, index, verify and inspect WebDataset-style tar shards",
                                 description="Work with WebDataset-style tar shards, on disk or in S3.")
    _register(shards.add_subparsers(dest="shards_command", metavar="COMMAND", required=True), SHARD_COMMANDS)
    _register(commands, TOP_LEVEL)
    return top


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``hydrax`` console script."""
    top = parser()
    args = top.parse_args(argv)
    if args.command is None:
        top.print_help()
        return 2
    from .errors import WorkerError

    try:
        return args.run(args)
    except WorkerError as exc:  # a KeyboardInterrupt (as in hydrax 0.2.2), but a failure, not the user's Ctrl+C
        print(f"hydrax {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("hydrax: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""The ``hydrax`` command.

This version has ``hydrax info`` (what hydrax sees on this machine) and ``hydrax demo``; the shard
subcommands (build, index, verify, show, bench) arrive with the shard backend.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys


def _info(_args: argparse.Namespace) -> int:
    import numpy

    from . import __version__
    from .workers import start_method

    before_jax = start_method()
    print(f"hydrax {__version__} (Python {platform.python_version()}, numpy {numpy.__version__})")
    try:
        import jax

        print(f"jax {jax.__version__}: default backend {jax.default_backend()}, devices {jax.devices()}")
    except Exception as exc:  # a broken JAX install should still let the rest print
        print(f"jax unavailable: {exc}")
    print(f"cpu cores available: {len(os.sched_getaffinity(0))}")
    forced = os.environ.get("HYDRAX_START_METHOD")
    print(f"workers start by: {before_jax} before JAX initialises, {start_method()} after" + (f" (forced by HYDRAX_START_METHOD={forced})" if forced else ""))
    print(f"shared memory: memfd ({'supported' if hasattr(os, 'memfd_create') else 'NOT supported'})")
    return 0


def _demo(_args: argparse.Namespace) -> int:
    from .demo import main as demo_main

    demo_main()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``hydrax`` console script."""
    from . import __version__

    parser = argparse.ArgumentParser(prog="hydrax", description="hydrax: a zero-copy multiprocess data loader for JAX")
    parser.add_argument("--version", action="version", version=f"hydrax {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser("info", help="show versions, the JAX backend and how workers would start").set_defaults(run=_info)
    commands.add_parser("demo", help="train a small JAX model from hydrax batches").set_defaults(run=_demo)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())

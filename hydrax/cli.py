"""The ``hydrax`` command.

This version has ``hydrax info`` (what hydrax sees on this machine), ``hydrax demo`` and
``hydrax shards index``; the other shard subcommands (build, verify, show, bench) come later.
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


def _shards_index(args: argparse.Namespace) -> int:
    from .shards import ShardFormatError, build_index, expand_urls, index_path

    try:
        shards = expand_urls(args.shards)
    except (FileNotFoundError, NotImplementedError, ValueError) as exc:
        print(f"hydrax shards index: {exc}", file=sys.stderr)
        return 1
    progress = _progress(len(shards), "indexing", args.quiet)
    failed = samples = 0
    for shard in shards:
        path = index_path(shard)
        try:
            if args.force or not os.path.exists(path):
                index = build_index(shard)
                index.save(path)
                samples += len(index)
        except (OSError, ShardFormatError) as exc:
            failed += 1
            print(f"hydrax shards index: {exc}", file=sys.stderr)
        progress.update(1)
    progress.close()
    if not args.quiet:
        print(f"indexed {len(shards) - failed} of {len(shards)} shards ({samples} samples newly indexed)")
    return 1 if failed else 0


def _progress(total: int, description: str, quiet: bool):
    """A tqdm bar when tqdm is installed and output is wanted, else a silent stand-in."""
    try:
        from tqdm import tqdm

        return tqdm(total=total, desc=description, unit="shard", disable=quiet)
    except ImportError:
        class Silent:
            def update(self, _n):
                pass

            def close(self):
                pass

        return Silent()


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
    shards = commands.add_parser("shards", help="work with WebDataset-style tar shards")
    shard_commands = shards.add_subparsers(dest="shards_command", metavar="COMMAND", required=True)
    index = shard_commands.add_parser("index", help="write a <shard>.hidx index beside each shard")
    index.add_argument("shards", nargs="+", help="shard paths, globs or brace patterns (train-{0000..0099}.tar)")
    index.add_argument("--force", action="store_true", help="rebuild indexes that exist")
    index.add_argument("--quiet", "-q", action="store_true", help="no progress bar or summary")
    index.set_defaults(run=_shards_index)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())

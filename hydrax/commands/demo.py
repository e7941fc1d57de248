"""``hydrax demo``: train a digit classifier from the repository's shards, then resume and compare.

Several loader processes decode the PNG digits of ``shards/`` into batch slots; it prints the
validation accuracy of every epoch and the loader's throughput, then resumes from a checkpoint
taken mid-run and checks that the final parameters are bit-identical.
"""

from __future__ import annotations

import argparse


def register(commands) -> None:
    parser = commands.add_parser("demo", help="train a small JAX classifier from the bundled digit shards",
                                 description=__doc__, epilog="example: hydrax demo --workers 4")
    parser.add_argument("--shards", help="folder with digits-{train,val}-*.tar (default: the repository's shards/)")
    parser.add_argument("--epochs", type=int, default=8, help="training epochs (default 8)")
    parser.add_argument("--workers", type=int, default=2, help="loader processes (default 2)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..demo import main as demo_main

    argv = ["--epochs", str(args.epochs), "--workers", str(args.workers)] + (["--shards", args.shards] if args.shards else [])
    try:
        demo_main(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0

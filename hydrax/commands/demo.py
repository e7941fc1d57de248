"""``hydrax demo``: train a digit classifier from tar shards of handwritten digits, then resume and compare.

Several loader processes decode the PNG digits into batch slots; it prints the validation
accuracy of every epoch and the loader's throughput, then resumes from a checkpoint taken
mid-run and checks that the final parameters are bit-identical. The shards are the repository's
``shards/`` in a checkout; an installed hydrax builds the same shards on first use from the
digits it ships, and keeps them in its cache ($HYDRAX_CACHE, else ~/.cache/hydrax, under demo/).
"""

from __future__ import annotations

import argparse
import sys

from ._common import positive_int


def register(commands) -> None:
    parser = commands.add_parser("demo", help="train a small JAX classifier on the digits shipped with hydrax",
                                 description=__doc__, epilog="example: hydrax demo --workers 4 (hydrax demo --epochs 1: a quick check)")
    parser.add_argument("--shards", help="folder with digits-{train,val}-*.tar (default: the repository's shards/, "
                        "else those built from the digits shipped with hydrax)")
    parser.add_argument("--epochs", type=positive_int, default=8, help="training epochs (default 8; 1 takes a few seconds)")
    parser.add_argument("--workers", type=positive_int, default=2, help="loader processes (default 2)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..demo import main as demo_main

    argv = ["--epochs", str(args.epochs), "--workers", str(args.workers)] + (["--shards", args.shards] if args.shards else [])
    try:
        demo_main(argv)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)  # what the demo says went wrong (the interpreter prints it for python -m hydrax.demo)
        return 1
    return 0

"""``hydrax demo``: train a small JAX model from hydrax batches, then resume and compare."""

from __future__ import annotations

import argparse


def register(commands) -> None:
    parser = commands.add_parser("demo", help="train a small JAX model from hydrax batches", description=__doc__,
                                 epilog="example: hydrax demo")
    parser.set_defaults(run=run)


def run(_args: argparse.Namespace) -> int:
    from ..demo import main as demo_main

    demo_main()
    return 0

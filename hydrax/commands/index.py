"""``hydrax shards index``: write a ``<shard>.hidx`` index beside each local shard, ahead of training."""

from __future__ import annotations

import argparse
import os

from ._common import progress, report


def register(shard_commands) -> None:
    parser = shard_commands.add_parser(
        "index", help="write a <shard>.hidx index beside each shard", description=__doc__,
        epilog="example: hydrax shards index 'data/train-{0000..0099}.tar'",
    )
    parser.add_argument("shards", nargs="+", help="shard paths, globs or brace patterns (train-{0000..0099}.tar)")
    parser.add_argument("--force", action="store_true", help="rebuild indexes that exist")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress bar or summary")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..shards import ShardFormatError, build_index, expand_urls, index_path

    try:
        shards = expand_urls(args.shards)
    except (FileNotFoundError, NotImplementedError, ValueError) as exc:
        report("shards index", exc)
        return 1
    bar = progress(len(shards), "indexing", "shard", args.quiet)
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
            report("shards index", exc)
        bar.update(1)
    bar.close()
    if not args.quiet:
        print(f"indexed {len(shards) - failed} of {len(shards)} shards ({samples} samples newly indexed)")
    return 1 if failed else 0

"""``hydrax shards index``: write a ``<shard>.hidx`` index beside each local shard, ahead of training."""

from __future__ import annotations

import argparse
import functools
import os

from ._common import count, progress, report


def register(shard_commands) -> None:
    parser = shard_commands.add_parser(
        "index", help="write a <shard>.hidx index beside each shard", description=__doc__,
        epilog="example: hydrax shards index --workers 4 'data/train-{0000..0099}.tar'",
    )
    parser.add_argument("shards", nargs="+", help="shard paths, globs or brace patterns (train-{0000..0099}.tar)")
    parser.add_argument("--force", action="store_true", help="rebuild indexes that exist")
    parser.add_argument("--workers", "-j", type=count, default=1, metavar="N",
                        help="index N shards at a time in worker processes (default 1: in this process)")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress bar or summary")
    parser.set_defaults(run=run)


def index_shard(shard: str, force: bool) -> tuple[int, str | None]:
    """Index ``shard`` unless it has an index (or ``force``): (samples newly indexed, the problem
    in words or None). Runs in worker processes, so it returns the problem rather than raising."""
    from ..shards import ShardFormatError, build_index, index_path

    path = index_path(shard)
    try:
        if force or not os.path.exists(path):
            index = build_index(shard)
            index.save(path)
            return len(index), None
        return 0, None
    except (OSError, ShardFormatError) as exc:
        return 0, str(exc)


def run(args: argparse.Namespace) -> int:
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    from ..shards import expand_urls

    try:
        shards = expand_urls(args.shards)
    except (FileNotFoundError, NotImplementedError, ValueError) as exc:
        report("shards index", exc)
        return 1
    work = functools.partial(index_shard, force=args.force)
    workers = min(args.workers, len(shards))
    pool = None
    if workers > 1:
        import multiprocessing

        from ..workers import start_method

        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(start_method()))
    failed = samples = done = 0
    bar = None
    try:
        # Chunks of shards per task keep the pool's overhead small next to a small shard's index;
        # map submits every task (and forks the workers) before the bar starts its monitor thread.
        outcomes = map(work, shards) if pool is None else pool.map(work, shards, chunksize=max(1, len(shards) // (16 * workers)))
        bar = progress(len(shards), "indexing", "shard", args.quiet)
        for new, problem in outcomes:
            done += 1
            samples += new
            if problem is not None:
                failed += 1
                report("shards index", problem)
            bar.update(1)
    except BrokenProcessPool:
        failed += len(shards) - done
        report("shards index", f"a worker process died; {len(shards) - done} shards were not indexed (try --workers 1)")
    finally:
        if bar is not None:
            bar.close()
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    if not args.quiet:
        print(f"indexed {len(shards) - failed} of {len(shards)} shards ({samples} samples newly indexed)")
    return 1 if failed else 0

"""``hydrax shards index``: write a ``<shard>.hidx`` index beside each shard, ahead of training.

Local shards get an index file beside them; remote ones (``s3://``, ``gs://``) an index object
beside them in the bucket, so a ShardSet over them sets up without reading the data.
``--manifest`` also writes a dataset manifest (a wids descriptor with sizes and ETags) that makes
set-up one request."""

from __future__ import annotations

import argparse
import functools
import os

from ._common import add_s3_options, count, progress, report, store_options


def register(shard_commands) -> None:
    parser = shard_commands.add_parser(
        "index", help="write a <shard>.hidx index beside each shard", description=__doc__,
        epilog="example: hydrax shards index --workers 4 'data/train-{0000..0099}.tar'\n"
               "more:\n"
               "  hydrax shards index 's3://bucket/train/train-*.tar' --manifest s3://bucket/train/train.json\n"
               "  hydrax shards index --endpoint-url http://127.0.0.1:9000 's3://bucket/train-{0000..0999}.tar'",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("shards", nargs="+", help="shard paths, globs, brace patterns (train-{0000..0099}.tar) or s3://, gs://, http(s):// or hf://datasets/ORG/NAME[@REV]/ URLs")
    parser.add_argument("--force", action="store_true",
                        help="rebuild every index (without it, only missing, stale and damaged ones are built)")
    parser.add_argument("--workers", "-j", type=count, default=1, metavar="N",
                        help="index N shards at a time in worker processes (default 1: in this process)")
    parser.add_argument("--manifest", metavar="PATH_OR_URL",
                        help="also write a dataset manifest (wids descriptor) listing the shards, their sizes and sample counts")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress bar or summary")
    add_s3_options(parser)
    parser.set_defaults(run=run)


def index_shard(shard: str, force: bool) -> tuple[int, str | None, str | None]:
    """Index ``shard`` unless it has a current index (or ``force``): (samples newly indexed, the
    problem in words or None, why an existing index was rebuilt or None). Runs in worker
    processes, so it returns the problem rather than raising."""
    from ..shards import ShardFormatError, build_index, index_path

    path = index_path(shard)
    try:
        needed, why = (True, None) if force else _needs_index(shard, path)
        if needed:
            index = build_index(shard)
            index.save(path)
            return len(index), None, why
        return 0, None, None
    except (OSError, ShardFormatError) as exc:
        return 0, str(exc), None


def _needs_index(shard: str, path: str) -> tuple[bool, str | None]:
    """Whether ``shard`` needs its index ``path`` built, and why an existing one will not do. An
    index will do when it reads and was built for the shard's present size and modification
    time, as loaders demand (they rescan, or refuse, any other)."""
    from ..shards import ShardFormatError, ShardIndex

    try:
        index = ShardIndex.load(path)
    except FileNotFoundError:
        return True, None
    except ShardFormatError as exc:
        return True, f"its index was damaged ({str(exc).removeprefix(f'{path}: ')})"
    stat = os.stat(shard)
    if (index.shard_size, index.shard_mtime_ns) == (stat.st_size, stat.st_mtime_ns):
        return False, None
    return True, (f"its index was stale (built for a shard of {index.shard_size} bytes modified at {index.shard_mtime_ns} ns; "
                  f"the shard has {stat.st_size} bytes, modified at {stat.st_mtime_ns} ns)")


def run(args: argparse.Namespace) -> int:
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    from ..errors import HydraxError
    from ..shards import expand_urls
    from ..shards.store import is_remote

    options = store_options(args)
    try:
        shards = expand_urls(args.shards, options)
    except (OSError, HydraxError, NotImplementedError, ValueError) as exc:
        report("shards index", exc)
        return 1
    if any(is_remote(url) for url in shards):
        return _run_remote(args, shards, options)
    work = functools.partial(index_shard, force=args.force)
    workers = min(args.workers, len(shards))
    pool = None
    if workers > 1:
        import multiprocessing

        from ..processes import start_method

        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(start_method()))
    failed = samples = done = 0
    problems: list[str] = []  # reported once the progress bar is gone, so it does not tear them up
    rebuilt: list[str] = []
    bar = None
    try:
        # Chunks of shards per task keep the pool's overhead small next to a small shard's index;
        # map submits every task (and forks the workers) before the bar starts its monitor thread.
        outcomes = map(work, shards) if pool is None else pool.map(work, shards, chunksize=max(1, len(shards) // (16 * workers)))
        bar = progress(len(shards), "indexing", "shard", args.quiet)
        for shard, (new, problem, why) in zip(shards, outcomes):
            done += 1
            samples += new
            if problem is not None:
                failed += 1
                problems.append(problem)
            if why is not None:
                rebuilt.append(f"{shard}: {why}: rebuilt it")
            bar.update(1)
    except BrokenProcessPool:
        failed += len(shards) - done
        problems.append(f"a worker process died; {len(shards) - done} shards were not indexed (try --workers 1)")
    finally:
        if bar is not None:
            bar.close()
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    for message in problems + ([] if args.quiet else rebuilt):
        report("shards index", message)
    if not failed and args.manifest:
        failed = _write_manifest(args, shards, options)
    if not args.quiet:
        again = f"; rebuilt {len(rebuilt)} stale or damaged {'index' if len(rebuilt) == 1 else 'indexes'}" if rebuilt else ""
        print(f"indexed {len(shards) - failed} of {len(shards)} shards ({samples} samples newly indexed{again})")
    return 1 if failed else 0


def _run_remote(args: argparse.Namespace, shards: list[str], options) -> int:
    """Index objects beside remote shards, many requests at once."""
    import time

    from ..errors import HydraxError
    from ..shards.catalog import publish_indexes

    started = time.perf_counter()
    bar = progress(len(shards), "indexing", "shard", args.quiet)
    try:
        entries = publish_indexes(shards, options, force=args.force, on_done=lambda _entry: bar.update(1))
    except (OSError, HydraxError, ValueError) as exc:
        bar.close()
        report("shards index", exc)
        return 1
    bar.close()
    failed = _write_manifest(args, entries, options) if args.manifest else 0
    if not args.quiet:
        samples = sum(e.samples or 0 for e in entries)
        print(f"indexed {len(entries)} shards ({samples} samples) in {time.perf_counter() - started:.2f} s: "
              f"an index object beside each{f'; manifest {args.manifest}' if args.manifest and not failed else ''}")
    return 1 if failed else 0


def _write_manifest(args: argparse.Namespace, shards, options) -> int:
    from ..errors import HydraxError
    from ..shards.catalog import resolve, write_manifest

    try:
        entries = shards if shards and not isinstance(shards[0], str) else resolve(shards, options, "", False)
        write_manifest(entries, args.manifest, options)
    except (OSError, HydraxError, ValueError) as exc:
        report("shards index", exc)
        return 1
    return 0

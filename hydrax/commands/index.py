"""``hydrax shards index``: write a ``<shard>.hidx`` index beside each shard, ahead of training.

Local shards get an index file beside them; remote ones (``s3://``, ``gs://``) an index object
beside them in the bucket, so a ShardSet over them sets up without reading the data.
``--manifest`` also writes a dataset manifest (a wids descriptor with sizes and ETags) that makes
set-up one request. ``--sizes FIELD`` also records every sample's image width and height for that
field (JPEG, PNG, WebP or GIF, told by their bytes; 0x0 for a sample without the field or whose
header cannot be read), which ShardSet.image_sizes gives without reading the images again; an
index without them, or with another field's, gets them without --force."""

from __future__ import annotations

import argparse
import functools

from ._common import RAY_HELP, add_s3_options, connect_ray, count, field_name, progress, report, sizes_summary, store_options


def register(shard_commands) -> None:
    parser = shard_commands.add_parser(
        "index", help="write a <shard>.hidx index beside each shard", description=__doc__,
        epilog="example: hydrax shards index --workers 4 'data/train-{0000..0099}.tar'\n"
               "more:\n"
               "  hydrax shards index 's3://bucket/train/train-*.tar' --manifest s3://bucket/train/train.json\n"
               "  hydrax shards index --sizes jpg 'data/train-{0000..0099}.tar'\n"
               "  hydrax shards index --endpoint-url http://127.0.0.1:9000 's3://bucket/train-{0000..0999}.tar'\n"
               "  hydrax shards index 's3://bucket/train/train-*.tar' --ray ray-head:6379",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("shards", nargs="+", help="shard paths, globs, brace patterns (train-{0000..0099}.tar) or s3://, gs://, http(s):// or hf://datasets/ORG/NAME[@REV]/ URLs")
    parser.add_argument("--force", action="store_true",
                        help="rebuild every index (without it, only missing, stale and damaged ones are built)")
    parser.add_argument("--workers", "-j", type=count, default=1, metavar="N",
                        help="index N shards at a time in worker processes (default 1: in this process)")
    parser.add_argument("--manifest", metavar="PATH_OR_URL",
                        help="also write a dataset manifest (wids descriptor) listing the shards, their sizes and sample counts")
    parser.add_argument("--sizes", type=field_name, metavar="FIELD",
                        help="also record every sample's image width and height for FIELD (e.g. jpg): JPEG, PNG, WebP "
                        "or GIF, read from their headers; 0x0 where a sample lacks FIELD or its header cannot be read")
    parser.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                        help=f"index {RAY_HELP}, many shards per task: local shards must be on a file system every node "
                        "mounts at the same path")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress bar or summary")
    add_s3_options(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    from ..errors import HydraxError
    from ..shards import expand_urls, index_file
    from ..shards.sizecolumn import SizeCounts
    from ..shards.store import is_remote

    options = store_options(args)
    try:
        shards = expand_urls(args.shards, options)
    except (OSError, HydraxError, NotImplementedError, ValueError) as exc:
        report("shards index", exc)
        return 1
    if args.ray is not None and args.workers > 1:
        report("shards index", "--workers does not apply with --ray (Ray's CPUs do the work)")
        return 2
    if any(is_remote(url) for url in shards):
        return _run_remote(args, shards, options)
    work = functools.partial(index_file, force=args.force, sizes=args.sizes)
    workers = min(args.workers, len(shards))
    pool = None
    if workers > 1:
        import multiprocessing

        from ..procs.processes import start_method

        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(start_method()))
    failed = samples = done = added = 0
    sized = SizeCounts()
    problems: list[str] = []  # reported once the progress bar is gone, so it does not tear them up
    rebuilt: list[str] = []
    bar = None
    try:
        # Chunks of shards per task keep the pool's overhead small next to a small shard's index;
        # map submits every task (and forks the workers) before the bar starts its monitor thread.
        if args.ray is None:
            outcomes = map(work, shards) if pool is None else pool.map(work, shards, chunksize=max(1, len(shards) // (16 * workers)))
        bar = progress(len(shards), "indexing", "shard", args.quiet)
        step = 1
        if args.ray is not None:  # the bar moves as Ray's tasks end, before the results are read
            outcomes, step = connect_ray(args.ray).index_files_on_ray(shards, force=args.force, sizes=args.sizes,
                                                                      progress=bar.update), 0
        for shard, (new, problem, why, counts, sizes_added) in zip(shards, outcomes):
            done += 1
            samples += new
            sized, added = sized + counts, added + sizes_added
            if problem is not None:
                failed += 1
                problems.append(problem)
            if why is not None:
                rebuilt.append(f"{shard}: {why}: rebuilt it")
            bar.update(step)
    except BrokenProcessPool:
        failed += len(shards) - done
        problems.append(f"a worker process died; {len(shards) - done} shards were not indexed (try --workers 1)")
    except (ImportError, HydraxError, OSError) as exc:  # Ray not installed, a task Ray could not run
        failed += len(shards) - done
        problems.append(str(exc))
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
        more = f"; image sizes added to {added} current {'index' if added == 1 else 'indexes'}" if added else ""
        print(f"indexed {len(shards) - failed} of {len(shards)} shards ({samples} samples newly indexed{again}{more})")
        if args.sizes:
            print(sizes_summary(args.sizes, sized))
    return 1 if failed else 0


def _run_remote(args: argparse.Namespace, shards: list[str], options) -> int:
    """Index objects beside remote shards, many requests at once."""
    import time

    from ..errors import HydraxError
    from ..shards.publish import publish_indexes
    from ..shards.sizecolumn import SizeCounts

    started = time.perf_counter()
    bar = progress(len(shards), "indexing", "shard", args.quiet)
    try:
        if args.ray is not None:
            entries = connect_ray(args.ray).publish_indexes_on_ray(shards, options, force=args.force, sizes=args.sizes,
                                                                   progress=bar.update)
        else:
            entries = publish_indexes(shards, options, force=args.force, sizes=args.sizes, on_done=lambda _entry: bar.update(1))
    except (OSError, HydraxError, ValueError, ImportError) as exc:
        bar.close()
        report("shards index", exc)
        return 1
    bar.close()
    failed = _write_manifest(args, entries, options) if args.manifest else 0
    if not args.quiet:
        samples = sum(e.samples or 0 for e in entries)
        print(f"indexed {len(entries)} shards ({samples} samples) in {time.perf_counter() - started:.2f} s: "
              f"an index object beside each{f'; manifest {args.manifest}' if args.manifest and not failed else ''}")
        if args.sizes:
            print(sizes_summary(args.sizes, sum((e.size_counts or SizeCounts() for e in entries), SizeCounts())))
    return 1 if failed else 0


def _write_manifest(args: argparse.Namespace, shards, options) -> int:
    from ..errors import HydraxError
    from ..shards.catalog import resolve
    from ..shards.manifest import write_manifest

    try:
        entries = shards if shards and not isinstance(shards[0], str) else resolve(shards, options, "", False)
        write_manifest(entries, args.manifest, options)
    except (OSError, HydraxError, ValueError) as exc:
        report("shards index", exc)
        return 1
    return 0

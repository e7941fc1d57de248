"""``hydrax shards verify``: check shards end to end: the tar headers (checksums, truncation), the
WebDataset sample grouping, the index beside each shard (present, fresh and in agreement with the
shard), and with --decode every image field. Each problem is named on stderr with the shard, byte
offset and sample key; a table sums up; the exit status is 1 when anything is wrong."""

from __future__ import annotations

import argparse
import json

from ._common import add_s3_options, count, progress, report, store_options, table


def register(shard_commands) -> None:
    parser = shard_commands.add_parser(
        "verify", help="check shards: tar integrity, samples, index agreement, and (--decode) images",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Images are fields ending .jpg .jpeg .png .webp .ppm .bmp .gif .tif or .tiff; --decode\n"
               "decodes each through hydrax.image.decode_into (the loader's path, ICC profiles included).\n"
               "Exit status: 0 when every shard is sound, 1 otherwise, 2 for a usage error.\n\n"
               "examples:\n  hydrax shards verify 'data/train-{0000..0099}.tar'\n"
               "  hydrax shards verify --decode --workers 4 'data/train-*.tar'\n"
               "  hydrax shards verify --endpoint-url http://localhost:9000 's3://bucket/train-*.tar'",
    )
    parser.add_argument("shards", nargs="+", help="shard paths, globs, brace patterns (train-{0000..0099}.tar) or s3://, gs://, http(s):// or hf://datasets/ORG/NAME[@REV]/ URLs")
    parser.add_argument("--decode", action="store_true", help="also decode every image field")
    parser.add_argument("--workers", "-j", type=count, default=1, metavar="N",
                        help="verify N shards at a time in worker processes (default 1: in this process)")
    parser.add_argument("--json", action="store_true", help="print the reports as JSON instead of a table")
    parser.add_argument("--quiet", "-q", action="store_true",
                        help="no progress bar or table: only the problems and the exit status")
    add_s3_options(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..shards import expand_urls

    options = store_options(args)
    try:
        urls = expand_urls(args.shards, options)
    except (OSError, NotImplementedError, ValueError, ImportError) as exc:
        report("shards verify", exc)
        return 1
    reports = _verify_all(urls, args.decode, options, args.workers, args.quiet or args.json)
    for shard in reports:
        for message in shard.messages():
            report("shards verify", message)
    if args.json:
        print(json.dumps([shard.to_json() for shard in reports], indent=2))
    elif not args.quiet:
        _print_summary(reports, args.decode)
    return 0 if all(shard.ok for shard in reports) else 1


def _verify_all(urls: list[str], decode: bool, options, workers: int, quiet: bool) -> list:
    from ..shards.verify import verify_shard

    if workers <= 1 or len(urls) == 1:
        reports = []
        with progress(len(urls), "verifying", "shard", quiet) as bar:
            for url in urls:
                reports.append(verify_shard(url, decode=decode, s3=options))
                bar.update(1)
        return reports
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from ..procs.processes import start_method

    context = multiprocessing.get_context(start_method())
    results: list = [None] * len(urls)
    with ProcessPoolExecutor(min(workers, len(urls)), mp_context=context) as pool:
        # Submitting first forks the workers before the progress bar starts its monitor thread.
        pending = {pool.submit(verify_shard, url, decode=decode, s3=options): n for n, url in enumerate(urls)}
        with progress(len(urls), "verifying", "shard", quiet) as bar:
            for done in as_completed(pending):
                results[pending[done]] = done.result()
                bar.update(1)
    return results


def _print_summary(reports: list, decode: bool) -> None:
    headers = ("shard", "samples") + (("images",) if decode else ()) + ("index", "status")
    rows = [[shard.url, f"{shard.samples:,}"] + ([f"{shard.images:,}"] if decode else []) + [shard.index, _shorten(shard.status)]
            for shard in reports]
    print(table(headers, rows, right=(1, 2) if decode else (1,)))
    good = sum(shard.ok for shard in reports)
    samples = sum(shard.samples for shard in reports)
    images = f", {sum(shard.images for shard in reports):,} images decoded" if decode else ""
    print(f"\n{len(reports)} shards, {samples:,} samples{images}: {good} ok, {len(reports) - good} with problems")


def _shorten(text: str, width: int = 100) -> str:
    """``text`` cut to ``width`` characters (the full problems are on stderr)."""
    return text if len(text) <= width else text[: width - 3] + "..."

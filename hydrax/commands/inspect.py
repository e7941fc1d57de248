"""``hydrax shards inspect``: what one shard holds: its samples, their fields, and the fields' sizes."""

from __future__ import annotations

import argparse
import json

from ._common import CommandError, add_s3_options, count, report, store_options, table


class _Usage(CommandError):
    """A command line that asks for what inspect does not do (exit status 2)."""


def register(shard_commands) -> None:
    parser = shard_commands.add_parser(
        "inspect", help="list a shard's samples, fields and sizes", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="The shard's index is used when there is a fresh one beside it (none is written).\n\n"
               "examples:\n  hydrax shards inspect data/train-0000.tar\n"
               "  hydrax shards inspect --limit 3 --json s3://bucket/train-0000.tar",
    )
    parser.add_argument("shard", help="a shard path or s3:// URL")
    parser.add_argument("--limit", "-n", type=count, default=10, metavar="N", help="list the first N samples (default 10)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    add_s3_options(parser)
    parser.set_defaults(run=run)


def field_rows(fields: dict) -> list[list[object]]:
    """Table rows (field, count, min, mean, max, total) from :class:`hydrax.shards.stats.SizeSummary` s."""
    return [[name, f"{s.count:,}", f"{s.min:,}", f"{s.mean:,.1f}", f"{s.max:,}", f"{s.total:,}"] for name, s in fields.items()]


FIELD_HEADERS = ("field", "samples", "min B", "mean B", "max B", "total B")


def run(args: argparse.Namespace) -> int:
    try:
        summary = summarize_shard(args.shard, args.limit, store_options(args))
    except _Usage as exc:
        report("shards inspect", exc)
        return 2
    except CommandError as exc:
        report("shards inspect", exc)
        return 1
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    from ..shards.stats import SizeSummary

    print(f"shard: {summary['url']}")
    print(f"samples: {summary['samples']:,}")
    fields = {name: SizeSummary(**s) for name, s in summary["fields"].items()}
    print(table(FIELD_HEADERS, field_rows(fields), right=range(1, 6)))
    listed = summary["first"]
    if listed:
        print(f"\nfirst {len(listed)} samples:")
        rows = [[s["key"], ", ".join(f"{f} {n:,} B" for f, n in s["fields"].items())] for s in listed]
        print(table(("key", "fields"), rows))
    return 0


def summarize_shard(url: str, limit: int, options) -> dict:
    """The shard ``url``'s sample count, per-field sizes and first ``limit`` samples, as JSON-ready data."""
    from ..shards import ShardFormatError, ShardSet, expand_urls
    from ..shards.stats import summarize_sizes

    try:
        urls = expand_urls(url, options)
        if len(urls) != 1:
            raise _Usage(f"{url!r} names {len(urls)} shards; inspect takes one (hydrax stat summarises many)")
        shards = ShardSet(urls, write_index=False, s3=options.s3, gcs=options.gcs)
    except (OSError, ShardFormatError, ValueError, NotImplementedError, ImportError) as exc:
        raise CommandError(exc) from None
    sizes: dict[str, list[int]] = {}
    first = []
    for number, sample in enumerate(shards):
        fields = sample.fields
        for name, (_, size) in fields.items():
            sizes.setdefault(name, []).append(size)
        if number < limit:
            first.append({"key": sample.key, "fields": {name: size for name, (_, size) in fields.items()},
                          "offsets": {name: offset for name, (offset, _) in fields.items()}})
    return {
        "url": shards.urls[0],
        "samples": len(shards),
        "fields": {name: summarize_sizes(values).to_json() for name, values in sizes.items()},
        "first": first,
    }

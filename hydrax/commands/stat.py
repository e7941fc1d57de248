"""``hydrax stat``: statistics of a dataset of shards: the sample count, per-field counts and sizes,
image sizes, per-channel pixel mean and standard deviation, and the label histogram."""

from __future__ import annotations

import argparse
import json

from ._common import add_s3_options, count, progress, report, shard_options, table
from .inspect import FIELD_HEADERS, field_rows


def register(commands) -> None:
    parser = commands.add_parser(
        "stat", help="count samples and summarise field sizes, image sizes, pixel mean/std and labels",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Images (fields ending .jpg .png .webp ...) are decoded to sRGB RGB and scaled to [0, 1];\n"
               "the mean and (population) std are over all their pixels. Labels are the first line of the\n"
               "cls (else label) field, or of --label-field. Shard indexes are used but never written.\n"
               "Exit status: 1 when a shard cannot be read or an image cannot be decoded.\n\n"
               "examples:\n  hydrax stat 'data/train-{0000..0099}.tar'\n"
               "  hydrax stat --limit 1000 --json 'data/train-*.tar'\n"
               "  hydrax stat --endpoint-url http://localhost:9000 's3://bucket/train-*.tar'",
    )
    parser.add_argument("shards", nargs="+", help="shard paths, globs, brace patterns (train-{0000..0099}.tar) or s3:// URLs")
    parser.add_argument("--limit", "-n", type=count, metavar="N",
                        help="only N samples, spread evenly over the dataset (default: all)")
    parser.add_argument("--label-field", metavar="FIELD", help="the field holding the label (default: cls, else label)")
    parser.add_argument("--no-pixels", action="store_true",
                        help="skip the pixel mean/std: read image sizes from their headers, decode nothing")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    add_s3_options(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from ..shards import ShardFormatError, ShardSet
    from ..shards.stats import LABEL_FIELDS, DatasetStats

    try:
        shards = ShardSet(args.shards, write_index=False, **shard_options(args))
    except (OSError, ShardFormatError, ValueError, NotImplementedError, ImportError) as exc:
        report("stat", exc)
        return 1
    total = len(shards)
    if args.limit is not None and args.limit < total:
        # evenly spaced, so every shard of a large set is represented and the choice is repeatable
        chosen = np.unique(np.linspace(0, total - 1, args.limit).round().astype(np.int64)).tolist() if args.limit else []
    else:
        chosen = range(total)
    stats = DatasetStats(label_fields=(args.label_field,) if args.label_field else LABEL_FIELDS, pixels=not args.no_pixels)
    problems: list[str] = []  # reported once the progress bar is gone, so it does not tear them up
    aborted = False
    with progress(len(chosen), "reading", "sample", args.quiet or args.json) as bar:
        for position in chosen:
            sample = shards[position]
            try:
                failures = stats.add(sample)
            except (OSError, ShardFormatError) as exc:  # a shard that changed, or a store that went away
                problems.append(str(exc))
                aborted = True
                break
            problems += [f"{sample.url}: sample {sample.key!r} field {field!r}: {message}" for field, message in failures]
            bar.update(1)
    for message in problems:
        report("stat", message)
    if aborted:
        return 1
    summary = {"shards": len(shards.urls), "total_samples": total, **stats.to_json()}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print_summary(summary, stats)
    return 1 if problems else 0


def _print_summary(summary: dict, stats) -> None:
    measured = summary["samples"]
    over = "" if measured == summary["total_samples"] else f" (statistics over {measured:,}, evenly spaced)"
    print(f"shards: {summary['shards']:,}  samples: {summary['total_samples']:,}{over}")
    print()
    print(table(FIELD_HEADERS, field_rows(stats.field_sizes()), right=range(1, 6)))
    for name, image in summary["images"].items():
        failed = f", {image['failed']:,} unreadable" if image["failed"] else ""
        print(f"\nimages ({name}): {image['count']:,} read{failed}")
        if not image["count"]:
            continue
        for side in ("width", "height"):
            values = image[side]
            print(f"  {side:<6}  min {values['min']:,}  median {values['median']:g}  max {values['max']:,}")
        print("  commonest sizes: " + ", ".join(f"{size} ({n:,})" for size, n in list(image["sizes"].items())[:5]))
        if image.get("mean"):
            rows = [[name] + [f"{v:.4f}" for v in image[name]] for name in ("mean", "std")]
            print(_indent(table(("pixels", "R", "G", "B"), rows, right=(1, 2, 3))))
            print(f"  (over {image['pixels']:,} pixels, sRGB scaled to [0, 1])")
    labels = summary["labels"]["counts"]
    if labels:
        fields = ", ".join(summary["labels"]["fields"])
        counted = sum(labels.values())
        print(f"\nlabels ({fields}): {len(labels):,} distinct over {counted:,} samples")
        rows = [[label, f"{n:,}", f"{100 * n / counted:.1f}%"] for label, n in labels.items()]
        print(table(("label", "samples", "share"), rows, right=(1, 2)))


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())

"""``hydrax stat``: statistics of a dataset of shards: the sample count, per-field counts and sizes,
image sizes, per-channel pixel mean and standard deviation, and the label histogram. Or, from a
ZeroMQ URL, statistics of the arrays of the batches received (tensorcom's tensorstat)."""

from __future__ import annotations

import argparse
import json

from ._common import CommandError, add_s3_options, count, progress, report, shard_options, table
from .inspect import FIELD_HEADERS, field_rows
from .monitor import add_stream_options, batch_size, open_stream


def register(commands) -> None:
    parser = commands.add_parser(
        "stat", help="count samples and summarise field sizes, image sizes, pixel mean/std and labels",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Images (fields ending .jpg .png .webp ...) are decoded to sRGB RGB and scaled to [0, 1];\n"
               "the mean and (population) std are over all their pixels. Labels are the first line of the\n"
               "cls (else label) field, or of --label-field. Shard indexes are used but never written.\n"
               "Exit status: 1 when a shard cannot be read or an image cannot be decoded.\n\n"
               "From a ZeroMQ URL (zsub://, zpull://, zrpull://, zrsub://) it receives --count batches (fewer\n"
               "when a hydrax stream ends first) and prints, for each array position: the batches it was\n"
               "in, its minimum, maximum, mean and (population) std over all elements, the element count,\n"
               "and each dtype and shape seen. Exit status 1 when nothing comes for --timeout seconds.\n\n"
               "examples:\n  hydrax stat 'data/train-{0000..0099}.tar'\n"
               "  hydrax stat --limit 1000 --json 'data/train-*.tar'\n"
               "  hydrax stat --endpoint-url http://localhost:9000 's3://bucket/train-*.tar'\n"
               "  hydrax stat zsub://127.0.0.1:7880 --count 50",
    )
    parser.add_argument("shards", nargs="+", metavar="SHARDS|URL",
                        help="shard paths, globs, brace patterns (train-{0000..0099}.tar) or s3://, gs://, http(s):// or hf://datasets/ORG/NAME[@REV]/ URLs; or a ZeroMQ URL to receive from")
    parser.add_argument("--limit", "-n", type=count, metavar="N",
                        help="only N samples, spread evenly over the dataset (default: all)")
    parser.add_argument("--label-field", metavar="FIELD", help="the field holding the label (default: cls, else label)")
    parser.add_argument("--no-pixels", action="store_true",
                        help="skip the pixel mean/std: read image sizes from their headers, decode nothing")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    parser.add_argument("--count", "-c", type=count, default=20, metavar="N", help="from a stream: how many batches (default 20)")
    add_stream_options(parser, "ZeroMQ streams")
    add_s3_options(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..serve.urls import is_zmq_url

    if any(is_zmq_url(text) for text in args.shards):
        return _run_stream(args)
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


# -- from a ZeroMQ stream ------------------------------------------------------------------------


class ArrayStats:
    """Running statistics of the arrays at one position of a stream's messages (tensorstat's).

    The mean and standard deviation are over every element of every array, in float64, merged
    chunk by chunk (Chan et al.), so that neither precision nor memory suffers on big batches.
    """

    CHUNK = 1 << 20

    def __init__(self) -> None:
        self.count = 0
        self.elements = 0
        self.lo = self.hi = None
        self.mean = 0.0
        self.m2 = 0.0
        self.names: list[str] = []
        self.seen: dict[tuple[str, tuple[int, ...]], int] = {}

    def add(self, array, name: str = "") -> None:
        """Count one array."""
        import numpy as np

        self.count += 1
        key = (str(array.dtype), tuple(int(d) for d in array.shape))
        self.seen[key] = self.seen.get(key, 0) + 1
        if name and name not in self.names:
            self.names.append(name)
        flat = np.asarray(array).reshape(-1)
        if not flat.size:
            return
        lo, hi = flat.min(), flat.max()
        lo, hi = (int(lo), int(hi)) if flat.dtype.kind in "iub" else (float(lo), float(hi))
        self.lo = lo if self.lo is None else min(self.lo, lo)
        self.hi = hi if self.hi is None else max(self.hi, hi)
        for start in range(0, flat.size, self.CHUNK):
            chunk = flat[start:start + self.CHUNK].astype(np.float64)
            n, mean = chunk.size, float(chunk.mean())
            m2 = float(np.square(chunk - mean).sum())
            total = self.elements + n
            delta = mean - self.mean
            self.mean += delta * n / total
            self.m2 += m2 + delta * delta * self.elements * n / total
            self.elements = total

    @property
    def std(self) -> float | None:
        """The population standard deviation, None before any element."""
        return (self.m2 / self.elements) ** 0.5 if self.elements else None

    def to_json(self, position: int) -> dict:
        """A JSON-ready summary, as ``--json`` prints it."""
        return {"position": position, "names": self.names, "count": self.count, "elements": self.elements,
                "min": _finite(self.lo), "max": _finite(self.hi), "mean": _finite(self.mean if self.elements else None),
                "std": _finite(self.std),
                "seen": [{"dtype": dtype, "shape": list(shape), "count": n} for (dtype, shape), n in self.seen.items()]}


def _finite(value):
    """``value``, or None for NaN and infinities (which JSON cannot hold)."""
    import math

    if value is None or isinstance(value, int):
        return value
    return value if math.isfinite(value) else None


def _run_stream(args: argparse.Namespace) -> int:
    """``hydrax stat URL``: statistics of the arrays of ``--count`` received batches."""
    import time

    from ..serve import ServeError
    from ..serve.urls import is_zmq_url

    if not all(is_zmq_url(text) for text in args.shards):
        report("stat", "give shards or ZeroMQ URLs, not both")
        return 2
    if args.count < 1:
        report("stat", "--count must be at least 1")
        return 2
    try:
        connection = open_stream(args.shards, args)
    except CommandError as exc:
        report("stat", exc)
        return 1
    where = [e.url for e in connection.endpoints]
    stats: list[ArrayStats] = []
    batches = samples = size = 0
    ended = False
    start = time.monotonic()
    status = 0
    try:
        with connection, progress(args.count, "receiving", "batch", args.quiet or args.json) as bar:
            for message in connection.messages():
                if message.kind != "data":
                    continue
                if batches == 0:
                    start = time.monotonic()
                arrays = message.arrays
                while len(stats) < len(arrays):
                    stats.append(ArrayStats())
                for i, a in enumerate(arrays):
                    stats[i].add(a, message.infos[i] if i < len(message.infos) else "")
                batches, samples, size = batches + 1, samples + batch_size(arrays), size + sum(a.nbytes for a in arrays)
                bar.update(1)
                if batches >= args.count:
                    break
            else:
                ended = True
    except ServeError as exc:
        report("stat", exc)
        if not batches:
            return 1
        status = 1
    except KeyboardInterrupt:
        report("stat", "interrupted")
        if not batches:
            return 130
        status = 130
    if not batches:
        report("stat", f"{', '.join(where)}: the stream ended before any batch came")
        return 1
    seconds = time.monotonic() - start
    summary = {"urls": where, "batches": batches, "samples": samples, "bytes": size, "seconds": round(seconds, 3),
               "ended": ended, "arrays": [s.to_json(i) for i, s in enumerate(stats)]}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print_stream_summary(summary)
    return status


def _print_stream_summary(summary: dict) -> None:
    ended = " (the stream ended)" if summary["ended"] else ""
    print(f"source: {', '.join(summary['urls'])}: {summary['batches']:,} batches, {summary['samples']:,} samples, "
          f"{summary['bytes'] / 1e6:,.1f} MB{ended}")
    for array in summary["arrays"]:
        name = f" ({', '.join(array['names'])})" if array["names"] else ""
        print(f"\n=== array {array['position']}{name} ===")
        if not array["elements"]:
            print(f"count {array['count']:,}  no elements")
        else:
            print(f"count {array['count']:,}  min {_g(array['min'])}  max {_g(array['max'])}  mean {_g(array['mean'])}  "
                  f"std {_g(array['std'])}  elements {array['elements']:,}")
        print("seen: " + ", ".join(f"{seen['dtype']} {tuple(seen['shape'])} x{seen['count']:,}" for seen in array["seen"]))


def _g(value) -> str:
    return "nan" if value is None else f"{value:.6g}"

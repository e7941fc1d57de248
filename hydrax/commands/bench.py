"""``hydrax bench``: measure a Dataloader over shards before a long run.

Runs a Dataloader over the shards with the decode a training script would use (each sample's
image decoded into a square uint8 slot with ``hydrax.image.decode_into``, or ``--decode bytes``:
every field read, nothing decoded), shows items/s, MB/s, batches/s and the share of time the
consumer waited, live, then prints a summary. It stops after --seconds, whatever the loader is
doing then.

The image of a sample is its first image field (jpg, png, webp, ...), so shards that mix image
types (as `hydrax shards build` writes from a folder of JPEGs and PNGs) work; --field names the
one field every sample must have (a sample without it ends the run, named with the fields it
has). Items that fail (a damaged image) drop their batch and are counted in the summary; a run
in which every batch fails, a dead loader process, or unreadable shards end it with status 1.
"""

from __future__ import annotations

import argparse
import functools
import threading
import time
from typing import NamedTuple

import numpy as np

from ..errors import ShardFormatError, WorkerError
from ._common import CommandError, add_s3_options, first_samples, positive_float, positive_int, progress, report, shard_options


class MissingFieldError(ShardFormatError):
    """A sample lacks the field ``--field`` names: the shards do not hold what the command was
    asked to read. Like any :class:`ShardFormatError` raised in a worker, it ends the run at once,
    rather than dropping every batch that holds such a sample."""


def register(commands) -> None:
    parser = commands.add_parser(
        "bench", help="measure a Dataloader over shards: items/s, MB/s, batches/s, time waited",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example: hydrax bench 'data/train-{0000..0099}.tar' --workers 8 --size 224 --seconds 30",
    )
    parser.add_argument("shards", nargs="+", help="shard paths, globs, brace patterns or s3://, gs://, http(s):// or hf://datasets/ORG/NAME[@REV]/ URLs")
    parser.add_argument("--decode", choices=("image", "bytes"), default="image",
                        help="decode an image field into the batch (default), or only read every field")
    parser.add_argument("--field", help="the image field, which every sample must have (default: each sample's first image field)")
    parser.add_argument("--size", type=positive_int, default=224, help="side of the square image slot (default 224)")
    parser.add_argument("--batch-size", type=positive_int, default=64)
    parser.add_argument("--workers", type=positive_int, default=2, help="loader processes (default 2)")
    parser.add_argument("--depth", type=positive_int, default=4, help="batch slots (default 4)")
    parser.add_argument("--seconds", type=positive_float, default=10.0,
                        help="how long to run, from the start of the loader; the run ends then even while batches are failing (default 10)")
    parser.add_argument("--shuffle", choices=("shardwise", "itemwise", "none"), default="shardwise",
                        help="item order (default shardwise)")
    parser.add_argument("--quiet", "-q", action="store_true", help="no live bar, only the summary")
    add_s3_options(parser)
    parser.set_defaults(run=run)


def image_field(sample) -> str:
    """The field holding ``sample``'s image: its first field that names an image type."""
    from ..shards.tarindex import is_image_field

    fields = sample.fields
    for name in fields:
        if is_image_field(name):
            return name
    raise ValueError(f"sample {sample.key!r} of {sample.url} has no image field (it has {sorted(fields)}); "
                     "name one with --field, or use --decode bytes")


def load_image(field: str | None, size: int, sample, arrays, seed) -> None:
    """Decode the sample's image (``sample[field]``, or without ``field`` its own first image
    field) into the image slot, with a random crop and flip from the seed."""
    from ..image import decode_into

    if field is None:
        name = image_field(sample)
    elif field in sample.fields:
        name = field
    else:
        raise MissingFieldError(f"sample {sample.key!r} has no field {field!r} (it has {sorted(sample.fields)}), "
                                f"but --field {field} asks every sample for it", url=sample.url, key=sample.key, field=field)
    data = sample[name]
    decode_into(data, arrays["image"], crop="random", flip=True, seed=seed)
    arrays["bytes"][...] = len(data)


def load_bytes(sample, arrays, seed) -> None:
    """Read every field of the sample, decode nothing."""
    arrays["bytes"][...] = sum(len(sample[field]) for field in sample)


def run(args: argparse.Namespace) -> int:
    if not args.seconds > 0:
        report("bench", f"--seconds must be more than 0, got {args.seconds}")
        return 2
    try:
        dataset = _open_shards(args)
    except CommandError as exc:
        report("bench", exc)
        return 1
    loader_func, group = _plan(args, dataset)
    bar = progress(None, "bench", "item", args.quiet)
    try:
        measured = _measure(args, loader_func, group, bar)
    except (Exception, WorkerError) as exc:
        # A failing loader ends the measurement with its reason; a loader process that died is
        # a failure too, not the user's Ctrl+C (WorkerError is a KeyboardInterrupt).
        bar.close()
        report("bench", exc)
        return 1
    bar.close()
    status = _summarize(args, measured)
    budget = dataset.readahead_budget
    if budget is not None:
        stats = dataset.readahead_stats
        print(f"{budget.describe()}; read {stats['bytes'] / 1e6:,.1f} MB in {stats['requests']:,} requests, "
              f"held at most {stats['held_peak'] / 1e6:,.1f} MB")
    return status


def _open_shards(args: argparse.Namespace):
    """The ShardSet of ``args.shards``, once its first samples show that there is something to
    measure; :class:`CommandError` when the shards cannot be read, hold no samples, or (decoding
    images) hold no image field to decode."""
    from ..shards import ShardSet
    from ..shards.tarindex import is_image_field

    try:
        dataset = ShardSet(args.shards, **shard_options(args))
        first = first_samples(dataset)
        probed = [sample.fields for sample in first]
    except (OSError, ShardFormatError, ValueError, NotImplementedError) as exc:
        raise CommandError(exc) from None
    if len(dataset) == 0:
        raise CommandError(f"the shards {args.shards} hold no samples")
    if args.decode == "image":
        if args.field is not None and args.field not in probed[0]:
            raise CommandError(f"no image field {args.field} in sample {first[0].key!r} of {first[0].url} "
                               f"(it has {sorted(probed[0])}); name one every sample has with --field, or use --decode bytes")
        if args.field is None and not any(is_image_field(name) for fields in probed for name in fields):
            raise CommandError(f"no image field in the first {len(first)} samples (sample {first[0].key!r} of {first[0].url} "
                               f"has {sorted(probed[0])}); name one with --field, or use --decode bytes")
    return dataset


def _plan(args: argparse.Namespace, dataset):
    """The loader function and DataGroup the options ask for, announced unless ``--quiet``."""
    # JAX loads only once the shards are known to be readable: a bad shard fails at once
    import jax.numpy as jnp

    from ..run.group import DataGroup

    arrays = {"bytes": ((), np.int64, jnp.int64)}
    if args.decode == "image":
        arrays["image"] = ((args.size, args.size, 3), np.uint8, jnp.uint8)
        loader_func = functools.partial(load_image, args.field, args.size)
        what = (f"decoding {args.field!r}" if args.field else "decoding each sample's image field") + f" into {args.size}x{args.size}"
    else:
        loader_func, what = load_bytes, "reading every field"
    shuffle = {"shardwise": "shardwise", "itemwise": "itemwise", "none": "repeat"}[args.shuffle]
    group = DataGroup(min(args.batch_size, len(dataset)), dataset, loader_arrays=arrays, shuffle_later=shuffle)
    if not args.quiet:
        print(f"{len(dataset):,} samples in {len(dataset.urls)} shards; {what}; batch {group.batch_size}, {args.workers} loader processes")
    return loader_func, group


class _Measured(NamedTuple):
    """What a run measured. The counts start after the first batch (the steady state), which
    came ``first_batch`` seconds after the start (None if none came)."""

    items: int
    batches: int
    size: int  # bytes
    waited: int  # microseconds the consumer waited for a batch
    first_batch: float | None
    elapsed: float  # seconds from the first batch to the last
    stats: dict
    dropped: int
    failed: int


def _measure(args: argparse.Namespace, loader_func, group, bar) -> _Measured:
    """Run the Dataloader for ``--seconds``, showing the rates on ``bar`` as they come."""
    from ..run.loader import Dataloader

    items = batches = size = 0
    waited = 0
    first_batch = None
    started = time.perf_counter()
    measured = ended = started
    last_shown = started
    timer = None
    try:
        # No batch may come for a long time (every one failing, a slow store): --seconds is
        # enforced by a timer, not by the loop, which only runs when a batch comes.
        patience = max(20, int(2 * args.seconds))
        with Dataloader(loader_func, group, loader_count=args.workers, depth=args.depth, timeout_sec=patience) as loader:
            timer = threading.Timer(max(0.0, args.seconds - (time.perf_counter() - started)), _interrupt, (loader,))
            timer.daemon = True
            timer.start()
            for batch in loader:
                now = time.perf_counter()
                if first_batch is None:
                    first_batch = now - started
                    measured = now  # steady state: from the first batch on
                    loader.idle_usec()
                else:
                    items += len(batch)
                    batches += 1
                    size += int(np.asarray(batch.arrays["bytes"]).sum())
                    waited += loader.idle_usec()
                ended = now
                bar.update(len(batch))
                del batch
                if now - last_shown > 0.5 and items:
                    elapsed = now - measured
                    bar.set_postfix_str(f"{items / elapsed:,.0f} items/s, {size / elapsed / 1e6:,.1f} MB/s, waited {waited / 1e6 / elapsed:.0%}")
                    last_shown = now
                if now - started >= args.seconds:
                    break
            stats = loader.transfer_stats
            dropped, failed = loader.dropped_batches, loader.failed_items
    finally:
        if timer is not None:
            timer.cancel()
    return _Measured(items, batches, size, waited, first_batch, ended - measured, stats, dropped, failed)


def _summarize(args: argparse.Namespace, m: _Measured) -> int:
    """Print the summary of a run, or why there is none; the exit status."""
    if not m.items or m.elapsed <= 0:
        why = "no batch came" if m.first_batch is None else "only one batch came"
        if m.failed:
            report("bench", f"{why} in {args.seconds:g} s: failed items {m.failed:,}, dropped batches {m.dropped:,} "
                            "(their errors are above)")
        else:
            report("bench", f"{why} in {args.seconds:g} s: the first batches took longer to load; raise --seconds")
        return 1
    elapsed = m.elapsed
    print(f"items/s {m.items / elapsed:,.0f}  MB/s {m.size / elapsed / 1e6:,.1f}  batches/s {m.batches / elapsed:,.1f}  "
          f"waited {m.waited / 1e6 / elapsed:.0%}  first batch {m.first_batch:.3f} s  "
          f"({m.items:,} items in {elapsed:.1f} s after the first batch; {m.stats['aliased_batches']} batches without a copy)")
    if m.dropped or m.failed:
        print(f"failed items {m.failed:,}, dropped batches {m.dropped:,} (their errors are above)")
    return 0


def _interrupt(loader) -> None:
    """End ``loader``'s iteration (from the timer thread) when --seconds are up."""
    try:
        loader.interrupt()
    except RuntimeError:  # the run has already ended
        pass

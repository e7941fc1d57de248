"""``hydrax bench``: measure a Dataloader over shards before a long run.

Runs a Dataloader over the shards with the decode a training script would use (an image field
decoded into a square uint8 slot with ``hydrax.image.decode_into``, or ``--decode bytes``: every
field read, nothing decoded), shows items/s, MB/s, batches/s and the share of time the consumer
waited, live, then prints a summary.
"""

from __future__ import annotations

import argparse
import functools
import time

import numpy as np

from ._common import add_s3_options, progress, report, shard_options

def register(commands) -> None:
    parser = commands.add_parser(
        "bench", help="measure a Dataloader over shards: items/s, MB/s, batches/s, time waited",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example: hydrax bench 'data/train-{0000..0099}.tar' --workers 8 --size 224 --seconds 30",
    )
    parser.add_argument("shards", nargs="+", help="shard paths, globs, brace patterns or s3:// URLs")
    parser.add_argument("--decode", choices=("image", "bytes"), default="image",
                        help="decode an image field into the batch (default), or only read every field")
    parser.add_argument("--field", help="the image field (default: the first image field of the first sample)")
    parser.add_argument("--size", type=int, default=224, help="side of the square image slot (default 224)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2, help="loader processes (default 2)")
    parser.add_argument("--depth", type=int, default=4, help="batch slots (default 4)")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long to measure (default 10)")
    parser.add_argument("--shuffle", choices=("shardwise", "itemwise", "none"), default="shardwise",
                        help="item order (default shardwise)")
    parser.add_argument("--quiet", "-q", action="store_true", help="no live bar, only the summary")
    add_s3_options(parser)
    parser.set_defaults(run=run)


def load_image(field: str, size: int, sample, arrays, seed) -> None:
    """Decode ``sample[field]`` into the image slot (random crop and flip from the seed)."""
    from ..image import decode_into

    data = sample[field]
    decode_into(data, arrays["image"], crop="random", flip=True, seed=seed)
    arrays["bytes"][...] = len(data)


def load_bytes(sample, arrays, seed) -> None:
    """Read every field of the sample, decode nothing."""
    arrays["bytes"][...] = sum(len(sample[field]) for field in sample)


def run(args: argparse.Namespace) -> int:
    from ..shards import ShardFormatError, ShardSet
    from ..shards.tarindex import is_image_field

    try:
        dataset = ShardSet(args.shards, **shard_options(args))
        first_fields = dataset[0].fields if len(dataset) else {}  # loads the first index now, if it loads lazily
    except (OSError, ShardFormatError, ValueError, NotImplementedError) as exc:
        report("bench", exc)
        return 1
    if len(dataset) == 0:
        report("bench", f"the shards {args.shards} hold no samples")
        return 1
    # JAX loads only once the shards are known to be readable: a bad shard fails at once
    import jax.numpy as jnp

    from ..group import DataGroup
    from ..loader import Dataloader

    arrays = {"bytes": ((), np.int64, jnp.int64)}
    if args.decode == "image":
        field = args.field or next((f for f in first_fields if is_image_field(f)), None)
        if field is None or field not in first_fields:
            report("bench", f"no image field {args.field or ''} in sample {dataset[0].key!r} of {dataset[0].url} "
                            f"(it has {sorted(first_fields)}); name one with --field, or use --decode bytes")
            return 1
        arrays["image"] = ((args.size, args.size, 3), np.uint8, jnp.uint8)
        loader_func = functools.partial(load_image, field, args.size)
    else:
        field, loader_func = None, load_bytes
    shuffle = {"shardwise": "shardwise", "itemwise": "itemwise", "none": "repeat"}[args.shuffle]
    group = DataGroup(min(args.batch_size, len(dataset)), dataset, loader_arrays=arrays, shuffle_later=shuffle)
    what = f"decoding {field!r} into {args.size}x{args.size}" if field else "reading every field"
    if not args.quiet:
        print(f"{len(dataset):,} samples in {len(dataset.urls)} shards; {what}; batch {group.batch_size}, {args.workers} loader processes")
    bar = progress(None, "bench", "item", args.quiet)
    items = batches = size = 0
    waited = 0
    first = None
    started = time.perf_counter()
    last_shown = started
    try:
        # A bounded wait: when every batch fails to load, none ever comes.
        patience = max(20, int(2 * args.seconds))
        with Dataloader(loader_func, group, loader_count=args.workers, depth=args.depth, timeout_sec=patience) as loader:
            for batch in loader:
                now = time.perf_counter()
                if first is None:
                    first = now - started
                    measured = now  # steady state: from the first batch on
                    loader.idle_usec()
                else:
                    items += len(batch)
                    batches += 1
                    size += int(np.asarray(batch.arrays["bytes"]).sum())
                    waited += loader.idle_usec()
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
    except Exception as exc:  # a failing loader ends the measurement with its reason
        bar.close()
        report("bench", exc)
        return 1
    bar.close()
    elapsed = time.perf_counter() - measured if first is not None else 0.0
    if not items or elapsed <= 0:
        report("bench", "no batches came in time: every batch failed to load (see the messages above), or --seconds is too short")
        return 1
    print(f"items/s {items / elapsed:,.0f}  MB/s {size / elapsed / 1e6:,.1f}  batches/s {batches / elapsed:,.1f}  "
          f"waited {waited / 1e6 / elapsed:.0%}  first batch {first:.3f} s  "
          f"({items:,} items in {elapsed:.1f} s after the first batch; {stats['aliased_batches']} batches without a copy)")
    if dropped or failed:
        print(f"failed items {failed:,}, dropped batches {dropped:,} (their errors are above)")
    return 0

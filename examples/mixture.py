"""Read a weighted mixture of three sources through one DataGroup, measure what each batch holds,
and resume the mixture exactly in the middle.

The sources, mixed 0.7 / 0.2 / 0.1 by default (``--weights``):

0. the digit shards (``hydrax.shards.ShardSet``), decoded as they are;
1. the same shards again, augmented: scaled up and cropped at a random place drawn from the
   item's seed (a different crop every epoch, the same one in every run);
2. a plain Python list of synthetic digits, drawn as seven-segment figures with noise.

``hydrax.Mixture`` makes the three one sequence for a ``DataGroup``: every epoch holds the
weighted share of each, each source is reshuffled whenever it has been read through, and
``batch.sources`` says which source each item of a batch came from. ``--batching random``
(default) shuffles positions across a few batches, so one batch's make-up varies around the
weights; ``--batching stratified`` gives every batch its exact share (up to rounding).

The order of a mixture, like every hydrax order, is a pure function of (seed, epoch, position),
so ``start_at=loader.state()`` in a new Dataloader delivers exactly the batches the first run
delivered after that point: the example checks that it does, batch by batch and byte for byte.

    python examples/mixture.py --batching stratified
    python examples/mixture.py --tiny          # what CI runs
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import sys
from collections.abc import Sequence
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from hydrax import DataGroup, Dataloader, Mixture
from hydrax.demo import cached_shards, default_shards
from hydrax.image import decode_into
from hydrax.shards import ShardSet

SIDE = 8
ARRAYS = {"image": ((SIDE, SIDE, 3), np.float32, jnp.float32), "label": ((), np.int32, jnp.int32)}
NAMES = ("digits", "augmented digits", "synthetic")


class Augment(NamedTuple):
    """An item of :class:`Augmented`: a shard sample the loader function is to augment."""

    sample: object


class Augmented(Sequence):
    """Another view of a source: the same items, each wrapped in :class:`Augment` so that the
    loader function knows to augment it. (The loader sees each source's own items, not which
    source they came from; wrapping them is how a source says something about its items.)"""

    def __init__(self, source: Sequence):
        self.source = source

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index):
        return Augment(self.source[index])


class Synthetic(NamedTuple):
    """An item of the synthetic source: draw this digit."""

    label: int


# Which of the seven segments (top, top right, bottom right, bottom, bottom left, top left,
# middle) each digit lights, and where each segment lies in an 8x8 image (rows, columns).
SEGMENTS = ("abcdef", "bc", "abdeg", "abcdg", "bcfg", "acdfg", "acdefg", "abc", "abcdefg", "abcdfg")
PLACES = {"a": (0, slice(2, 6)), "b": (slice(1, 4), 6), "c": (slice(4, 7), 6), "d": (7, slice(2, 6)),
          "e": (slice(4, 7), 1), "f": (slice(1, 4), 1), "g": (slice(3, 5), slice(2, 6))}


def load(item, arrays, seed):
    """The loader function, for the items of all three sources. ``seed`` differs for every item
    and epoch (and is the same in every run): draw all randomness from it."""
    if isinstance(item, Synthetic):
        rng = np.random.default_rng(seed)
        image = rng.uniform(0.0, 0.2, (SIDE, SIDE)).astype(np.float32)
        for segment in SEGMENTS[item.label]:
            image[PLACES[segment]] = rng.uniform(0.7, 1.0)
        arrays["image"][...] = image[:, :, None]  # grey to RGB
        arrays["label"][...] = item.label
        return
    if isinstance(item, Augment):
        item = item.sample
        # scale the 8x8 digit to 10x10 and take a random 8x8 window of it
        decode_into(item["png"], arrays["image"], size=10, crop="random", seed=seed)
    else:
        decode_into(item["png"], arrays["image"])
    arrays["label"][...] = int(bytes(item["cls"]))


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batching", choices=("random", "stratified"), default="random")
    parser.add_argument("--weights", type=float, nargs=3, default=(0.7, 0.2, 0.1), metavar=("DIGITS", "AUGMENTED", "SYNTHETIC"))
    parser.add_argument("--batches", type=int, help="batches to read (default 300; --tiny: 12)")
    parser.add_argument("--batch-size", type=int, help="items per batch (default 50; --tiny: 20)")
    parser.add_argument("--loaders", type=int, help="loader processes (default 2; --tiny: 1)")
    parser.add_argument("--shards", help="folder with digits-train-*.tar (default: the repository's shards/, or shards built "
                        "from the digits shipped with hydrax)")
    parser.add_argument("--tiny", action="store_true", help="a few small batches with one loader (what CI runs)")
    args = parser.parse_args(argv)
    defaults = dict(batches=12, batch_size=20, loaders=1) if args.tiny else dict(batches=300, batch_size=50, loaders=2)
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.batch_size < 1 or args.loaders < 1 or args.batches < 2:
        parser.error("--batch-size and --loaders must be at least 1, --batches at least 2")
    return args


def describe(batch) -> str:
    """A digest of everything a batch holds: which items, from which sources, and their bytes."""
    digest = hashlib.sha256()
    for part in (np.asarray(batch.indices), batch.sources, np.asarray(batch.arrays["image"]), np.asarray(batch.arrays["label"])):
        digest.update(np.ascontiguousarray(part).tobytes())
    return digest.hexdigest()


def main(argv=None) -> int:
    args = parse_args(argv)
    folder = args.shards or default_shards()
    with contextlib.nullcontext(folder) if folder else cached_shards() as folder:
        return run(args, folder)


def run(args: argparse.Namespace, folder: str) -> int:
    digits = ShardSet(os.path.join(folder, "digits-train-*.tar"), write_index=False)
    synthetic = [Synthetic(label) for label in range(10) for _ in range(20)]
    # One epoch is as long as the digit shards; the small synthetic source is read through (and
    # reshuffled) several times an epoch, the shards about 0.7 and 0.2 times.
    mixture = Mixture([digits, Augmented(digits), synthetic], weights=args.weights, epoch_size=len(digits),
                      batching=args.batching)
    # "shardwise": a source that knows its shards (the ShardSet) is read shard by shard within each
    # pass, which keeps reads local for remote shards; the other two are read in a permuted order.
    group = DataGroup(args.batch_size, mixture, loader_arrays=ARRAYS, seed=7, shuffle_later="shardwise")
    settings = dict(loader_count=args.loaders, end_at=("batch", args.batches))
    print(f"[mixture] {mixture!r}: {group.batch_count} batches of {args.batch_size} per epoch; reading {args.batches}", flush=True)

    middle = args.batches // 2
    per_batch, digests = [], []
    with Dataloader(load, group, **settings) as loader:
        for batch in loader:
            per_batch.append(np.bincount(batch.sources, minlength=len(NAMES)))
            digests.append(describe(batch))
            del batch
            if len(digests) == middle:
                saved = loader.state()  # where a checkpoint taken now would resume: the next batch

    counts = np.array(per_batch)
    total = counts.sum()
    for source, name in enumerate(NAMES):
        column = counts[:, source]
        print(f"[mixture] source {source} ({name}): {column.sum() / total:.1%} of {total} items (weight "
              f"{mixture.proportions[source]:.1%}); {column.min()}-{column.max()} per batch", flush=True)

    # A new Dataloader from the saved position: the rest of the run, exactly.
    with Dataloader(load, group, start_at=saved, **settings) as loader:
        resumed = []
        for batch in loader:
            resumed.append(describe(batch))
            del batch
    same = resumed == digests[middle:]
    print(f"[mixture] resumed at epoch {saved.epoch}, batch {saved.batch}: the {len(resumed)} batches after it are "
          f"identical to the first run's: {same}", flush=True)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

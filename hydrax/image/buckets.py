"""Aspect-ratio buckets: which slot shape each image of a data set is trained at, and in what batches.

Models trained on photos of every shape (image generators, taggers) group them by aspect ratio:
each batch has one shape, different batches have different shapes, and an image is cropped only
as much as the gap between its aspect and its bucket's. :func:`plan_buckets` makes that plan from
the images' sizes alone (:meth:`hydrax.shards.ShardSet.image_sizes`, or
:func:`hydrax.image.image_sizes`, read from headers without decoding):

1. **Resolutions**: an explicit list, or every ``step``-multiple width and height whose area fits
   a pixel budget (:func:`bucket_resolutions`, as kohya-ss' sd-scripts and the SDXL list make them).
2. **Nearest aspect**: each image goes to the bucket whose aspect ratio is nearest its own on a
   log scale (ties to the narrower bucket). The comparison is in integers (is ``w/h`` below the
   geometric mean of two neighbouring buckets' aspects?), so every host computes the same plan.
3. **Batch sizes**: one for all buckets, or per bucket to keep the pixels of a batch constant,
   rounded down to a multiple of ``multiple_of`` (devices times hosts, say).
4. **Merging**: a bucket with fewer images than ``min_batches`` of its batches is dropped, the
   smallest first, and its images go to the nearest bucket left, until every bucket is full enough.
5. **Remainders** (``remainder="spill"``): working from both ends of the aspect range towards the
   bucket with the most images, each bucket passes the images that do not fill a whole batch (its
   images nearest the neighbour's aspect) to the neighbour. Every bucket but that central one then
   holds whole batches, so an epoch leaves out fewer than one batch of images in all, where
   dropping each bucket's remainder (``remainder="drop"``) leaves out up to a batch per bucket.

:class:`BucketPlan` holds the outcome and :meth:`BucketPlan.summary` reports every decision in a
table. :func:`hydrax.bucket_groups` turns a plan into one DataGroup per bucket; the Dataloader
interleaves them so that they progress together. See docs/buckets.rst.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import numpy as np

log = logging.getLogger(__name__)

#: The widest aspect ratio (long side over short side) :func:`bucket_resolutions` makes by default.
DEFAULT_MAX_RATIO = 4.0
#: Images are compared in 64-bit integers: sides up to this many pixels (a JPEG's limit); larger
#: sizes (a PNG's can be) are scaled down to it, keeping their aspect.
MAX_IMAGE_SIDE = 65535
#: Bucket sides up to this many pixels keep those products within 64 bits.
MAX_BUCKET_SIDE = 1 << 14
REMAINDERS = ("spill", "drop")


def bucket_resolutions(pixels: int, step: int = 64, *, max_ratio: float = DEFAULT_MAX_RATIO) -> list[tuple[int, int]]:
    """Every ``(width, height)`` of multiples of ``step`` whose area is at most ``pixels`` and
    whose height is the largest that allows for its width, and their transposes, with long side
    over short side at most ``max_ratio``; in order of aspect ratio (portrait first). For ``pixels=1024 * 1024`` and
    ``step=64`` that is 1024x1024, 1088x960, 1152x896, 1216x832, ..., and their transposes."""
    if isinstance(pixels, bool) or not isinstance(pixels, (int, np.integer)) or pixels < 1:
        raise ValueError(f"pixels must be a positive int (the area of a bucket's slot), got {pixels!r}")
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or not 1 <= step <= math.isqrt(int(pixels)):
        raise ValueError(f"step must be a positive int whose square fits in pixels={pixels}, got {step!r}")
    if not max_ratio >= 1:
        raise ValueError(f"max_ratio must be at least 1, got {max_ratio!r}")
    found: dict[tuple[int, int], tuple[int, int]] = {}
    for width in range(step, pixels // step + 1, step):
        height = pixels // width // step * step
        if height < step or max(width, height) > max_ratio * min(width, height):
            continue
        if max(width, height) > MAX_BUCKET_SIDE:
            continue
        for pair in ((width, height), (height, width)):  # both orientations, so the list is symmetric
            shape = (pair[0] // math.gcd(*pair), pair[1] // math.gcd(*pair))
            if shape not in found or pair[0] * pair[1] > found[shape][0] * found[shape][1]:
                found[shape] = pair
    return sorted(found.values(), key=lambda wh: (wh[0] / wh[1], wh))


@dataclass(frozen=True)
class Bucket:
    """One bucket of a :class:`BucketPlan`: its slot's ``width`` x ``height``, its
    ``batch_size``, and its ``items`` (indices into the sizes the plan was made from, increasing)."""

    width: int
    height: int
    batch_size: int
    items: np.ndarray = field(repr=False)
    #: Images whose nearest bucket (after merging) this is.
    nearest: int = 0
    #: Resolutions merged into this one, ``(width, height)`` each.
    merged: tuple[tuple[int, int], ...] = ()
    #: Images passed in from a neighbour, and passed out to one, to make whole batches.
    moved_in: int = 0
    moved_out: int = 0

    @property
    def aspect(self) -> float:
        """Width over height."""
        return self.width / self.height

    @property
    def batch_count(self) -> int:
        """Whole batches per epoch."""
        return len(self.items) // self.batch_size


@dataclass(frozen=True)
class BucketPlan:
    """The outcome of :func:`plan_buckets`: the buckets in order of aspect ratio, and for every
    image the bucket it is in."""

    buckets: tuple[Bucket, ...]
    #: The bucket of each image (int32; -1 for an image without a size).
    assignment: np.ndarray = field(repr=False)
    #: The nearest bucket of each image among those kept, before remainders moved (-1: no size).
    nearest: np.ndarray = field(repr=False)
    #: Resolutions dropped for too few images, in the order they were: ``((width, height), images,
    #: (((width, height), images it received), ...))``.
    merges: tuple = ()
    #: Images without a size (0 x 0: unreadable or missing), in no bucket.
    unsized: int = 0
    remainder: str = "spill"
    #: Resolutions no image was nearest, left out.
    unused: int = 0

    def __len__(self) -> int:
        return len(self.buckets)

    @property
    def images(self) -> int:
        """Images in some bucket."""
        return sum(len(bucket.items) for bucket in self.buckets)

    @property
    def left_out_per_epoch(self) -> int:
        """Images of the buckets an epoch leaves out: the remainders the batches do not fill
        (which ones changes with each epoch's shuffle)."""
        return sum(len(bucket.items) % bucket.batch_size for bucket in self.buckets)

    def summary(self) -> str:
        """A table of every bucket (slot size, aspect, batch size, images, whole batches, images
        nearest it, moved in and out, merged resolutions) and what was merged, left out and why."""
        lines = [f"{'bucket':>11} {'aspect':>6} {'batch':>5} {'images':>9} {'batches':>7} {'nearest':>9} "
                 f"{'moved in':>8} {'out':>5} {'left/ep':>7}  merged"]
        for bucket in self.buckets:
            merged = ", ".join(f"{w}x{h}" for w, h in bucket.merged)
            lines.append(f"{bucket.width:>5}x{bucket.height:<5} {bucket.aspect:6.3f} {bucket.batch_size:5d} "
                         f"{len(bucket.items):9,d} {bucket.batch_count:7,d} {bucket.nearest:9,d} {bucket.moved_in:8,d} "
                         f"{bucket.moved_out:5,d} {len(bucket.items) % bucket.batch_size:7,d}  {merged}".rstrip())
        lines.append(f"{len(self.buckets)} buckets, {self.images:,d} images, "
                     f"{sum(b.batch_count for b in self.buckets):,d} batches per epoch; "
                     f"{self.left_out_per_epoch:,d} images left out per epoch (remainder={self.remainder!r})")
        for (w, h), count, went in self.merges:
            into = ", ".join(f"{iw}x{ih} ({n:,d})" for (iw, ih), n in went)
            lines.append(f"merged {w}x{h} ({count:,d} images, fewer than its minimum) into the nearest left: {into}")
        if self.unused:
            lines.append(f"{self.unused} resolution(s) no image is nearest were left out")
        if self.unsized:
            lines.append(f"{self.unsized:,d} images without a size (unreadable header, or no image field) are in no bucket")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


def plan_buckets(widths, heights, *, resolutions=None, pixels: int | None = None, step: int = 64,
                 max_ratio: float = DEFAULT_MAX_RATIO, batch_size: int | None = None,
                 pixels_per_batch: int | None = None, multiple_of: int = 1, min_batches: int = 1,
                 remainder: str = "spill") -> BucketPlan:
    """Assign every image to an aspect-ratio bucket (see the module's docstring for the steps).

    :param widths: each image's upright width (an array or sequence; 0 for an image without a
        size), as :meth:`hydrax.shards.ShardSet.image_sizes` gives them.
    :param heights: each image's upright height, as ``widths``.
    :param resolutions: the buckets' ``(width, height)`` slot sizes; or, instead,
    :param pixels: a pixel budget: the resolutions of :func:`bucket_resolutions` (``pixels``,
        ``step``, ``max_ratio``).
    :param batch_size: every bucket's batch size; or, instead,
    :param pixels_per_batch: each bucket's batch size is the most images of its size within this
        many pixels (at least ``multiple_of``).
    :param multiple_of: batch sizes are multiples of this (the devices a batch is split over,
        times the hosts, times ``shard_partitions``).
    :param min_batches: a bucket with fewer images than this many of its batches is merged into
        the nearest bucket left.
    :param remainder: ``"spill"`` (default): pass each bucket's remainder on to its neighbour, so
        that an epoch leaves out fewer than one batch in all; ``"drop"``: every bucket keeps its
        images, and each epoch leaves out each bucket's remainder, as a DataGroup does.
    :raises ValueError: for arguments that do not go together, or too few images for one batch.
    """
    widths, heights = _sizes(widths, heights)
    shapes = _resolutions(resolutions, pixels, step, max_ratio)
    batches = _batch_sizes(shapes, batch_size, pixels_per_batch, multiple_of)
    if isinstance(min_batches, bool) or not isinstance(min_batches, (int, np.integer)) or min_batches < 1:
        raise ValueError(f"min_batches must be a positive int, got {min_batches!r}")
    if remainder not in REMAINDERS:
        raise ValueError(f"remainder must be 'spill' or 'drop', got {remainder!r}")
    sized = (widths > 0) & (heights > 0)
    # the merging works on the distinct sizes (a data set has few), each with its count
    keys = widths.astype(np.int64) << 32 | heights.astype(np.int64)
    distinct, inverse, counts = np.unique(keys[sized], return_inverse=True, return_counts=True)
    distinct_w, distinct_h = distinct >> 32, distinct & 0xFFFFFFFF
    kept = list(range(len(shapes)))
    merges: list[tuple[tuple[int, int], int, tuple[tuple[tuple[int, int], int], ...]]] = []
    nearest_distinct = nearest_bucket(distinct_w, distinct_h, shapes)
    # resolutions no image is nearest go first, quietly: removing them moves no image
    used = np.bincount(nearest_distinct, minlength=len(shapes)) > 0
    unused = len(shapes) - int(used.sum())
    if unused and used.any():
        kept = [k for k in kept if used[k]]
        nearest_distinct = nearest_bucket(distinct_w, distinct_h, [shapes[k] for k in kept])
    while True:
        held = np.bincount(nearest_distinct, weights=counts, minlength=len(kept)).astype(np.int64)
        short = [(int(held[i]), i) for i in range(len(kept)) if held[i] < min_batches * batches[kept[i]]]
        if not short:
            break
        if len(kept) == 1:
            raise ValueError(f"{int(counts.sum())} images with a size are too few for {min_batches} batch(es) of "
                             f"{batches[kept[0]]} in any bucket: lower batch_size/pixels_per_batch or min_batches")
        count, victim = min(short)  # the smallest first (ties: the narrower)
        leaving = nearest_distinct == victim
        victim_shape = shapes[kept.pop(victim)]
        nearest_distinct = nearest_bucket(distinct_w, distinct_h, [shapes[k] for k in kept])
        went = np.bincount(nearest_distinct[leaving], weights=counts[leaving], minlength=len(kept))
        merges.append((victim_shape, count, tuple((shapes[kept[i]], int(n)) for i, n in enumerate(went) if n)))
    nearest = np.full(len(widths), -1, np.int32)
    nearest[sized] = nearest_distinct[inverse]
    assignment = nearest.copy()
    moved_in, moved_out = [0] * len(kept), [0] * len(kept)
    if remainder == "spill":
        _spill(assignment, widths, heights, [batches[k] for k in kept], moved_in, moved_out)
    members = _members(assignment, len(kept))
    merged_into: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for victim, _, went in merges:  # a bucket merged away passes on what was merged into it
        passed = [victim, *merged_into.pop(victim, [])]
        for into, _ in went:
            merged_into.setdefault(into, []).extend(passed)
    nearest_counts = np.bincount(nearest[nearest >= 0], minlength=len(kept))
    buckets = tuple(Bucket(shapes[k][0], shapes[k][1], batches[k], members[i], int(nearest_counts[i]),
                           tuple(merged_into.get(shapes[k], ())), moved_in[i], moved_out[i]) for i, k in enumerate(kept))
    plan = BucketPlan(buckets, assignment, nearest, tuple(merges), int((~sized).sum()), remainder, unused)
    log.info("[hydrax] aspect-ratio buckets:\n%s", plan.summary())
    return plan


def nearest_bucket(widths: np.ndarray, heights: np.ndarray, shapes: list[tuple[int, int]]) -> np.ndarray:
    """For each ``widths[i]`` x ``heights[i]`` (positive), the index of the ``shapes`` (width,
    height; in increasing aspect order) whose aspect is nearest on a log scale, ties to the lower
    index: exact integer comparisons with the geometric means of neighbouring aspects."""
    w2 = widths.astype(np.int64) ** 2
    h2 = heights.astype(np.int64) ** 2
    found = np.zeros(len(widths), np.int32)
    for (aw, ah), (bw, bh) in zip(shapes, shapes[1:]):
        # w/h beyond sqrt(a * b): w^2 * ah * bh > h^2 * aw * bw (within 64 bits: sides <= 2^16 and 2^14)
        found += w2 * (ah * bh) > h2 * (aw * bw)
    return found


def _sizes(widths, heights) -> tuple[np.ndarray, np.ndarray]:
    widths, heights = np.asarray(widths), np.asarray(heights)
    if widths.shape != heights.shape or widths.ndim != 1:
        raise ValueError(f"widths and heights must be 1-d and of one length, got shapes {widths.shape} and {heights.shape}")
    if len(widths) and not (np.issubdtype(widths.dtype, np.integer) and np.issubdtype(heights.dtype, np.integer)):
        raise ValueError(f"widths and heights must be integers, got {widths.dtype} and {heights.dtype}")
    widths, heights = widths.astype(np.int64), heights.astype(np.int64)
    for name, values in (("widths", widths), ("heights", heights)):
        if len(values) and values.min() < 0:
            bad = int(np.flatnonzero(values < 0)[0])
            raise ValueError(f"{name}[{bad}] is {int(values[bad])}: a size is a number of pixels (0: unknown)")
    large = np.maximum(widths, heights) > MAX_IMAGE_SIDE
    if large.any():
        # a PNG can be 2**31 pixels wide: shrink those sizes, both sides by one whole factor, so the
        # comparisons stay within 64 bits (the aspect moves by less than a part in 65,535)
        factor = -(-np.maximum(widths[large], heights[large]) // MAX_IMAGE_SIDE)
        widths[large] = np.maximum(1, (widths[large] + factor // 2) // factor)
        heights[large] = np.maximum(1, (heights[large] + factor // 2) // factor)
    return widths, heights


def _resolutions(resolutions, pixels, step, max_ratio) -> list[tuple[int, int]]:
    if (resolutions is None) == (pixels is None):
        raise ValueError("give either resolutions (a list of (width, height)) or pixels (a budget per image)")
    if resolutions is None:
        return bucket_resolutions(pixels, step, max_ratio=max_ratio)
    shapes = []
    for pair in resolutions:
        try:
            width, height = (int(v) for v in pair)
        except (TypeError, ValueError):
            raise ValueError(f"resolutions must be (width, height) pairs of ints, got {pair!r}") from None
        if not (0 < width <= MAX_BUCKET_SIDE and 0 < height <= MAX_BUCKET_SIDE):
            raise ValueError(f"a bucket is 1 to {MAX_BUCKET_SIDE} pixels a side, not {width}x{height}")
        shapes.append((width, height))
    if not shapes:
        raise ValueError("resolutions is empty")
    shapes.sort(key=lambda wh: (wh[0] / wh[1], wh))
    for a, b in zip(shapes, shapes[1:]):
        if a[0] * b[1] == b[0] * a[1]:
            raise ValueError(f"resolutions {a[0]}x{a[1]} and {b[0]}x{b[1]} have the same aspect ratio: keep one")
    return shapes


def _batch_sizes(shapes, batch_size, pixels_per_batch, multiple_of) -> list[int]:
    if isinstance(multiple_of, bool) or not isinstance(multiple_of, (int, np.integer)) or multiple_of < 1:
        raise ValueError(f"multiple_of must be a positive int, got {multiple_of!r}")
    if (batch_size is None) == (pixels_per_batch is None):
        raise ValueError("give either batch_size (the same for every bucket) or pixels_per_batch")
    if batch_size is not None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if batch_size % multiple_of:
            raise ValueError(f"batch_size={batch_size} must be a multiple of multiple_of={multiple_of}")
        return [int(batch_size)] * len(shapes)
    if isinstance(pixels_per_batch, bool) or not isinstance(pixels_per_batch, (int, np.integer)) or pixels_per_batch < 1:
        raise ValueError(f"pixels_per_batch must be a positive int, got {pixels_per_batch!r}")
    return [max(multiple_of, pixels_per_batch // (w * h) // multiple_of * multiple_of) for w, h in shapes]


def _spill(assignment: np.ndarray, widths: np.ndarray, heights: np.ndarray, batches: list[int],
           moved_in: list[int], moved_out: list[int]) -> None:
    """Pass each bucket's remainder to its neighbour towards the bucket with the most images:
    the images whose aspect is nearest the neighbour's go (ties: the later image), in place."""
    counts = np.bincount(assignment[assignment >= 0], minlength=len(batches))
    centre = int(np.argmax(counts))
    aspect = np.divide(widths, heights, out=np.zeros(len(widths)), where=heights > 0)
    order = range(centre), range(len(batches) - 1, centre, -1)
    for direction, buckets in zip((1, -1), order):
        for b in buckets:
            mine = np.flatnonzero(assignment == b)
            extra = len(mine) % batches[b]
            if not extra:
                continue
            # towards a wider neighbour: the widest go first; towards a narrower one, the narrowest
            ranked = mine[np.lexsort((mine, aspect[mine] * direction))]
            assignment[ranked[-extra:]] = b + direction
            moved_out[b] += extra
            moved_in[b + direction] += extra


def _members(assignment: np.ndarray, count: int) -> list[np.ndarray]:
    """The images of each bucket, increasing."""
    order = np.argsort(assignment, kind="stable")
    bounds = np.searchsorted(assignment[order], np.arange(-1, count + 1))
    return [order[bounds[b + 1]:bounds[b + 2]].astype(np.int64) for b in range(count)]


__all__ = ["DEFAULT_MAX_RATIO", "MAX_BUCKET_SIDE", "MAX_IMAGE_SIDE", "REMAINDERS", "Bucket", "BucketPlan",
           "bucket_resolutions", "nearest_bucket", "plan_buckets"]

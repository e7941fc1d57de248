"""The image sizes column of a shard index: every sample's upright width and height for one field.

``hydrax shards index --sizes FIELD`` and ``hydrax shards build --sizes FIELD`` record, in each
shard's index (:mod:`hydrax.shards.indexfile`, format v3), the width and height of every sample's
``FIELD`` image, read from the image's header where it lies in the shard (:func:`measure`: one
call of :func:`hydrax.image.sizes.image_sizes_in` per shard, which reads only each image's first
bytes, without the GIL). The format is told by the bytes, not the field's name: JPEG (with its
EXIF orientation: a quarter-turned image has its upright size), PNG, WebP and GIF. A sample
without the field, or whose header cannot be read (another format, truncated, damaged), is
recorded as 0 x 0; :class:`SizeCounts` tells the two apart.

Widths and heights are stored as little-endian int32, one of each per sample (8 bytes a
sample): every size those formats can hold fits (a PNG's is at most 2**31 - 1), so there is no
escape for large images, arrays read from a file are views of it with nothing to decode, and
signed values make ``widths - heights`` safe. A valid column has no negative value, and a width
of 0 exactly where the height is 0 (:func:`first_bad`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

#: The type of each of the two arrays, in files and in memory.
DTYPE = "<i4"


class SizeColumn(NamedTuple):
    """The image sizes of a shard's (or a set's) samples: the ``field`` they were read from, and
    ``widths`` and ``heights`` (int32, one per sample, 0 x 0 where there is none)."""

    field: str
    widths: np.ndarray
    heights: np.ndarray


class SizeCounts(NamedTuple):
    """How a size column came out: samples with a size, samples without the field, and samples
    whose field's header could not be read (both recorded as 0 x 0)."""

    sized: int = 0
    lacking: int = 0
    unreadable: int = 0

    def __add__(self, other) -> SizeCounts:  # a tuple's + would concatenate
        return SizeCounts(*(a + b for a, b in zip(self, other)))


def field_number(names, field: str) -> int:
    """The number of ``field`` among the index's field ``names``, or -1 when the shard has none."""
    try:
        return list(names).index(field)
    except ValueError:
        return -1


def field_entries(sample_ends: np.ndarray, entry_field: np.ndarray, number: int) -> tuple[np.ndarray, np.ndarray]:
    """``(samples, entries)``: the samples that have field ``number`` and, for each, its entry
    (an index loaded or built has each field at most once per sample)."""
    entries = np.flatnonzero(entry_field == number)
    # the sample of an entry is the first whose run of entries ends after it
    return np.searchsorted(sample_ends, entries, side="right"), entries


def measure(data, sample_ends: np.ndarray, entry_field: np.ndarray, entry_offset: np.ndarray, entry_size: np.ndarray,
            number: int) -> tuple[np.ndarray, np.ndarray]:
    """``(widths, heights)`` of field ``number`` of every sample of the index whose arrays these
    are, read from ``data``, the shard's bytes (0 x 0 for a sample without it, or whose header
    cannot be read)."""
    from ..image.sizes import image_sizes_in

    count = len(sample_ends)
    widths, heights = np.zeros(count, np.int32), np.zeros(count, np.int32)
    if number >= 0 and count:
        samples, entries = field_entries(sample_ends, entry_field, number)
        found = image_sizes_in(data, entry_offset[entries], entry_size[entries])
        widths[samples], heights[samples] = found.widths, found.heights
    return widths, heights


def counts(sample_ends: np.ndarray, entry_field: np.ndarray, number: int, widths: np.ndarray) -> SizeCounts:
    """The :class:`SizeCounts` of a column of ``widths`` read from field ``number``."""
    having = int(np.count_nonzero(entry_field == number)) if number >= 0 else 0
    sized = int(np.count_nonzero(widths))
    return SizeCounts(sized, len(sample_ends) - having, having - sized)


def first_bad(widths: np.ndarray, heights: np.ndarray) -> int | None:
    """The first sample whose width or height cannot be (negative, or one of them 0 but not
    both), or None when every one can."""
    bad = np.flatnonzero((widths < 0) | (heights < 0) | ((widths == 0) != (heights == 0)))
    return int(bad[0]) if len(bad) else None


__all__ = ["DTYPE", "SizeColumn", "SizeCounts", "counts", "field_entries", "field_number", "first_bad", "measure"]

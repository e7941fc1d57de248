"""Image sizes without decoding: the width and height an encoded image's header gives.

This module owns reading an image's size from its first bytes, for JPEG, PNG, WebP and GIF, as
it will be seen: a JPEG's EXIF orientation 5-8 (a quarter turn, possibly mirrored) swaps width
and height, as :func:`hydrax.image.decode_into` and Pillow's ``ImageOps.exif_transpose`` turn
it. The bytes are read by the ``_imagesize.pxi`` kernels of :mod:`hydrax._core`; this module
decides what their statuses mean and words the errors.

- :func:`image_size` gives one image's upright ``(width, height)`` or raises
  :class:`~hydrax.image.ImageError`; :func:`image_header` also gives the format, the size as
  stored and the orientation.
- :func:`image_sizes` reads many buffers and :func:`image_sizes_in` many images lying in one
  buffer (a shard's members, by offset and length, without the GIL): an :class:`ImageSizes` of
  widths, heights and a :class:`SizeStatus` per image, never an exception for a damaged one.

What is read: a JPEG's marker segments up to its first frame header (SOF0-3, 5-7, 9-11, 13-15),
skipped by their lengths, with the orientation from the first APP1 ``Exif`` block's IFD0; a PNG's
IHDR chunk; the first chunk of a WebP file (VP8, VP8L or VP8X, whose canvas size counts); a GIF's
logical screen. Nothing else is checked, so a file whose header is sound but whose pixels are
damaged still has a size here and fails only when decoded.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, NamedTuple, Sequence

import numpy as np

from .. import _core
from ..errors import ImageError

#: The formats the kernel tells apart, by its numbers.
FORMAT_NAMES = {0: "unknown", 1: "JPEG", 2: "PNG", 3: "WebP", 4: "GIF"}
#: EXIF orientations that turn the image a quarter (and may mirror it): width and height swap.
TRANSPOSED_ORIENTATIONS = (5, 6, 7, 8)


class SizeStatus(enum.IntEnum):
    """Why an image has no size, per image of :func:`image_sizes` (``OK`` when it has one)."""

    OK = 0
    #: no JPEG, PNG, WebP or GIF signature
    UNKNOWN_FORMAT = 1
    #: the data ends before the size
    TRUNCATED = 2
    #: a JPEG marker missing where one must be, or one that cannot be there
    BAD_MARKER = 3
    #: a segment or chunk length that cannot be right
    BAD_LENGTH = 4
    #: no size where it must be: a JPEG's scan or end before a frame header, a PNG or WebP whose first chunk is another
    NO_SIZE = 5
    #: a WebP VP8 start code, or VP8L signature or version, that is wrong
    BAD_SIGNATURE = 6
    #: a width or height of 0 (or a PNG's over 2**31 - 1)
    BAD_SIZE = 7
    #: :func:`image_sizes_in` only: the span is not inside the buffer
    OUTSIDE_DATA = 8


@dataclass(frozen=True)
class ImageHeader:
    """What an image's header says: its ``format`` (``"JPEG"``, ``"PNG"``, ``"WebP"``, ``"GIF"``),
    ``width`` and ``height`` as stored, and its EXIF ``orientation`` (1-8; 1 where there is none,
    and for the formats other than JPEG)."""

    format: str
    width: int
    height: int
    orientation: int = 1

    @property
    def upright_size(self) -> tuple[int, int]:
        """``(width, height)`` once the orientation is applied: swapped for orientations 5-8."""
        if self.orientation in TRANSPOSED_ORIENTATIONS:
            return self.height, self.width
        return self.width, self.height


class ImageSizes(NamedTuple):
    """The upright sizes of a batch of images: ``widths`` and ``heights`` (int32, 0 where there
    is none) and ``statuses`` (uint8 :class:`SizeStatus` codes, 0 where the size was read)."""

    widths: np.ndarray
    heights: np.ndarray
    statuses: np.ndarray


def _byte_view(data: Any):
    """``data`` as something the kernel reads: a one-dimensional C-contiguous run of bytes."""
    if isinstance(data, bytes):
        return data
    view = memoryview(data)
    if not view.c_contiguous:
        view = memoryview(view.tobytes())
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def _problem(status: int, fmt: str, offset: int, length: int) -> str:
    """Words for a status of the kernel, with the byte offset it is about."""
    if status == SizeStatus.UNKNOWN_FORMAT:
        return "no data" if length == 0 else "not a JPEG, PNG, WebP or GIF (no signature of one at byte offset 0)"
    what = {
        SizeStatus.TRUNCATED: f"truncated {fmt}: the data ends before the image's size (the structure at byte offset "
                              f"{offset} runs past the end)",
        SizeStatus.BAD_MARKER: f"damaged JPEG: no marker, or a marker that cannot be there, at byte offset {offset}",
        SizeStatus.BAD_LENGTH: f"damaged {fmt}: the {'segment' if fmt == 'JPEG' else 'chunk'} at byte offset {offset} "
                               "has a length that cannot be right",
        SizeStatus.NO_SIZE: {
            "JPEG": f"damaged JPEG: its scan or end (marker at byte offset {offset}) comes before any frame header",
            "PNG": f"damaged PNG: its first chunk, at byte offset {offset}, is not IHDR",
        }.get(fmt, f"damaged WebP: its first chunk, at byte offset {offset}, is not VP8, VP8L or VP8X"),
        SizeStatus.BAD_SIGNATURE: f"damaged WebP: the frame's signature at byte offset {offset} is wrong",
        SizeStatus.BAD_SIZE: f"damaged {fmt}: the header at byte offset {offset} gives a width or height of 0"
                             + (" or over 2**31 - 1" if fmt == "PNG" else ""),
    }
    return what[SizeStatus(status)]


def image_header(data: Any) -> ImageHeader:
    """The format, stored size and EXIF orientation of the encoded image in ``data`` (``bytes``, a
    ``memoryview``, a uint8 numpy array: any buffer), read from its header, never decoded.

    :raises ImageError: for data that is not a JPEG, PNG, WebP or GIF, or whose header is cut
        short or damaged (a zero width or height included); the message says what is wrong and
        at which byte offset.
    """
    view = _byte_view(data)
    status, fmt, width, height, orientation, offset = _core.read_image_header(view)
    if status != SizeStatus.OK:
        length = len(view)
        raise ImageError(f"bytes of length {length}: {_problem(status, FORMAT_NAMES[fmt], offset, length)}")
    return ImageHeader(FORMAT_NAMES[fmt], width, height, orientation)


def image_size(data: Any) -> tuple[int, int]:
    """The upright ``(width, height)`` of the encoded image in ``data``: its header's size, with
    width and height swapped where a JPEG's EXIF orientation is 5-8. Raises
    :class:`~hydrax.image.ImageError` as :func:`image_header` does."""
    return image_header(data).upright_size


def _upright(widths: np.ndarray, heights: np.ndarray, orientations: np.ndarray, statuses: np.ndarray) -> ImageSizes:
    turned = orientations >= TRANSPOSED_ORIENTATIONS[0]
    return ImageSizes(np.where(turned, heights, widths), np.where(turned, widths, heights), statuses)


def image_sizes(buffers: Sequence[Any]) -> ImageSizes:
    """The upright sizes of the encoded images ``buffers`` (each as :func:`image_size` takes it),
    with a :class:`SizeStatus` per image instead of an exception: an image without a size has
    width and height 0."""
    count = len(buffers)
    statuses = np.zeros(count, np.uint8)
    widths, heights = np.zeros(count, np.int32), np.zeros(count, np.int32)
    orientations = np.zeros(count, np.uint8)
    read = _core.read_image_header
    for i, data in enumerate(buffers):
        statuses[i], _, widths[i], heights[i], orientations[i], _ = read(_byte_view(data))
    return _upright(widths, heights, orientations, statuses)


def image_sizes_in(data: Any, offsets: Any, lengths: Any) -> ImageSizes:
    """The upright sizes of the images ``data[offsets[i] : offsets[i] + lengths[i]]`` (a shard's
    members, say), read in one kernel call without the GIL; as :func:`image_sizes`, with status
    ``OUTSIDE_DATA`` for a span that is not inside ``data``."""
    starts = np.ascontiguousarray(offsets, np.int64).reshape(-1)
    spans = np.ascontiguousarray(lengths, np.int64).reshape(-1)
    if len(starts) != len(spans):
        raise ValueError(f"offsets and lengths differ in length ({len(starts)} and {len(spans)})")
    count = len(starts)
    statuses, formats, orientations = (np.zeros(count, np.uint8) for _ in range(3))
    widths, heights = np.zeros(count, np.int32), np.zeros(count, np.int32)
    _core.read_image_headers(_byte_view(data), starts, spans, statuses, formats, widths, heights, orientations,
                             np.zeros(count, np.int64))
    return _upright(widths, heights, orientations, statuses)


__all__ = ["FORMAT_NAMES", "TRANSPOSED_ORIENTATIONS", "ImageHeader", "ImageSizes", "SizeStatus", "image_header",
           "image_size", "image_sizes", "image_sizes_in"]

"""Decoded pixels resized, cropped and converted into a batch slot in one kernel call.

From RGB pixels (:func:`resize_into`) the arithmetic is Pillow's (see ``hydrax/_resample.pxi``),
so a slot filled here holds what ``Image.resize(size, filter, box)`` followed by hydrax's colour
conversion gives, bit for bit. From a JPEG's planes (:func:`resize_planes_into`) the same
filters act on each plane, in finer fixed point and rounded once, so the result is within
rounding of that (``hydrax/_planes.pxi``). The filter weights of an axis depend only on its sizes and the crop's span, and a data set's
images come in few sizes, so they are computed once and kept (a random crop's spans vary more;
the cache then saves less; an entry for a 224-pixel axis holds about 30 kB).
"""

from __future__ import annotations

from array import array
from functools import lru_cache

import numpy as np

from .. import _core

#: Pillow's resampling filters this path computes, by Pillow's numbers (nearest is not one: it
#: is a lookup, not a filter, and stays with Pillow).
FILTERS = {1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}
#: Axes of weights kept per process.
TAPS_CACHE_SIZE = 256


@lru_cache(maxsize=TAPS_CACHE_SIZE)
def taps(in_size: int, start: float, stop: float, out_size: int, kind: int, chroma: int = 0) -> _core.Taps:
    """The weights that take the span ``start``..``stop`` of an axis of ``in_size`` pixels to
    ``out_size`` pixels with Pillow's filter ``kind`` (cached; the span as float32, as Pillow
    reads it). With ``chroma``, they read the ``chroma`` samples of a JPEG's chroma plane of half
    the resolution instead, as libjpeg's upsampling would make them into ``in_size`` pixels."""
    return _core.Taps(in_size, start, stop, out_size, kind, chroma)


def resize_into(pixels: np.ndarray, box: tuple[float, float, float, float], out: np.ndarray, *, chw: bool, flip: bool,
                kind: int, colour: tuple | None) -> None:
    """Resize the ``box`` (left, top, right, bottom) of ``pixels`` (H, W, C uint8, any strides)
    into ``out`` (C-contiguous uint8 or float32, HWC or with ``chw`` CHW), mirrored with ``flip``,
    through ``colour`` (``convert_pixels``'s tables from ``lin`` to ``offset``; None stores the
    8-bit values as they are)."""
    out_h, out_w = (out.shape[1], out.shape[2]) if chw else (out.shape[0], out.shape[1])
    left, top, right, bottom = array("f", box).tolist()  # as Pillow reads the box
    columns = taps(pixels.shape[1], left, right, out_w, kind)
    rows = taps(pixels.shape[0], top, bottom, out_h, kind)
    _core.resample_into(pixels, out, chw, flip, columns, rows, colour)


def resize_planes_into(planes: tuple[np.ndarray, np.ndarray, np.ndarray], subsampling: tuple[int, int],
                       box: tuple[float, float, float, float], out: np.ndarray, *, chw: bool, flip: bool, kind: int,
                       colour: tuple | None) -> None:
    """As :func:`resize_into`, from a JPEG's Y, Cb and Cr ``planes`` (uint8, rows contiguous),
    chroma at 1/``subsampling`` (horizontal, vertical; 1 or 2) of luma's resolution, converted
    to RGB after resizing. ``box`` is in luma pixels. Chroma is weighed as if libjpeg had
    upsampled it first (see :func:`taps`), so the slot holds, up to rounding, what decoding to
    RGB and resizing gives."""
    out_h, out_w = (out.shape[1], out.shape[2]) if chw else (out.shape[0], out.shape[1])
    luma, blue, red = planes
    left, top, right, bottom = array("f", box).tolist()  # as Pillow reads the box
    height, width = luma.shape
    across, down = subsampling
    columns, rows = taps(width, left, right, out_w, kind), taps(height, top, bottom, out_h, kind)
    _core.resample_planes_into(luma, blue, red, out, chw, flip, columns, rows,
                               taps(width, left, right, out_w, kind, blue.shape[1]) if across == 2 else columns,
                               taps(height, top, bottom, out_h, kind, blue.shape[0]) if down == 2 else rows, colour)


def plane_rows_read(height: int, top: float, bottom: float, out_h: int, kind: int, down: int, chroma_rows: int) -> int:
    """How many of the top luma rows of a JPEG ``height`` rows high :func:`resize_planes_into`
    reads to fill ``out_h`` rows from the box's ``top``..``bottom``, chroma at 1/``down`` (1 or 2)
    of luma's vertical resolution, ``chroma_rows`` rows high: the rows the plane decoder must
    decode (the same cached taps as the resize, so asking costs nothing more)."""
    top, bottom = array("f", (top, bottom)).tolist()
    needed = taps(height, top, bottom, out_h, kind).last
    if down == 2:
        needed = max(needed, 2 * taps(height, top, bottom, out_h, kind, chroma_rows).last)
    return min(height, needed)


def plane_rows_first(height: int, top: float, bottom: float, out_h: int, kind: int, down: int, chroma_rows: int) -> int:
    """The first luma row of a JPEG ``height`` rows high that :func:`resize_planes_into` reads,
    or whose iMCU row holds a chroma row it reads, to fill ``out_h`` rows from the box's
    ``top``..``bottom`` (arguments as for :func:`plane_rows_read`): the rows above need no
    inverse DCT (see :meth:`hydrax._core.JpegLibrary.decode_planes`)."""
    top, bottom = array("f", (top, bottom)).tolist()
    first = taps(height, top, bottom, out_h, kind).first
    if down == 2:
        first = min(first, 2 * taps(height, top, bottom, out_h, kind, chroma_rows).first)
    return first


def pixels_read(width: int, height: int, box: tuple[float, float, float, float], out_w: int, out_h: int,
                kind: int) -> tuple[int, int, int, int]:
    """The pixels ``(left, top, right, bottom)`` of a ``width`` x ``height`` image that
    :func:`resize_into` reads to fill ``out_w`` x ``out_h`` pixels from ``box``: the part a
    decoder must make (the same cached taps as the resize, so asking costs nothing more)."""
    left, top, right, bottom = array("f", box).tolist()  # as Pillow reads the box
    columns, rows = taps(width, left, right, out_w, kind), taps(height, top, bottom, out_h, kind)
    return columns.first, rows.first, columns.last, rows.last


__all__ = ["FILTERS", "pixels_read", "plane_rows_first", "plane_rows_read", "resize_into", "resize_planes_into", "taps"]

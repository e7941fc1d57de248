"""Decoded pixels resized, cropped and converted into a batch slot in one kernel call.

The arithmetic is Pillow's (see ``hydrax/_resample.pxi``), so a slot filled here holds what
``Image.resize(size, filter, box)`` followed by hydrax's colour conversion gives, bit for bit.
The filter weights of an axis depend only on its sizes and the crop's span, and a data set's
images come in few sizes, so they are computed once and kept (a random crop's spans vary more;
the cache then saves less; an entry for a 224-pixel axis holds about 30 kB).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from .. import _core

#: Pillow's resampling filters this path computes, by Pillow's numbers (nearest is not one: it
#: is a lookup, not a filter, and stays with Pillow).
FILTERS = {1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}
#: Axes of weights kept per process.
TAPS_CACHE_SIZE = 256


@lru_cache(maxsize=TAPS_CACHE_SIZE)
def taps(in_size: int, start: float, stop: float, out_size: int, kind: int) -> _core.Taps:
    """The weights that take the span ``start``..``stop`` of an axis of ``in_size`` pixels to
    ``out_size`` pixels with Pillow's filter ``kind`` (cached; the span as float32, as Pillow
    reads it)."""
    return _core.Taps(in_size, start, stop, out_size, kind)


def resize_into(pixels: np.ndarray, box: tuple[float, float, float, float], out: np.ndarray, *, chw: bool, flip: bool,
                kind: int, colour: tuple | None) -> None:
    """Resize the ``box`` (left, top, right, bottom) of ``pixels`` (H, W, C uint8, any strides)
    into ``out`` (C-contiguous uint8 or float32, HWC or with ``chw`` CHW), mirrored with ``flip``,
    through ``colour`` (``convert_pixels``'s tables from ``lin`` to ``offset``; None stores the
    8-bit values as they are)."""
    out_h, out_w = (out.shape[1], out.shape[2]) if chw else (out.shape[0], out.shape[1])
    left, top, right, bottom = (float(np.float32(v)) for v in box)
    columns = taps(pixels.shape[1], left, right, out_w, kind)
    rows = taps(pixels.shape[0], top, bottom, out_h, kind)
    _core.resample_into(pixels, out, chw, flip, columns, rows, colour)


__all__ = ["FILTERS", "resize_into", "taps"]

"""Crop boxes drawn from an item's seed: the random choices :func:`hydrax.image.decode_into` makes.

Every random choice is a pure function of the loader's item seed (and the image's size), so a
crop can be checked and replayed without decoding anything: :func:`random_resized_box` here, the
crop position and flip in :mod:`hydrax.image.decode`.
"""

from __future__ import annotations

import math
from numbers import Real

from .. import _core

#: The default range of a random resized crop's area, as a fraction of the image's.
DEFAULT_SCALE = (0.08, 1.0)
#: The default range of a random resized crop's aspect ratio (width / height).
DEFAULT_RATIO = (3 / 4, 4 / 3)
#: Draws of area and aspect before the centred fallback (the number torchvision documents).
TRIES = 10
#: The sides a box is drawn for are less than this (no image format has larger ones).
MAX_SIDE = 1 << 31
# The stream of mix_seed that keys a random resized crop's draws (1-3 are the crop position and flip).
_RESIZED_STREAM = 4
_SEED_MASK = (1 << 64) - 1


def mix_seed(seed: int, stream: int) -> int:
    """64 well-mixed bits from (seed, stream): SplitMix64's finaliser, so item seeds in sequence
    give unrelated crops and flips."""
    z = (seed * 0x9E3779B97F4A7C15 + stream * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)


def check_range(name: str, value) -> tuple[float, float]:
    """``value`` as a ``(low, high)`` pair of positive finite floats with low <= high; else a
    ValueError naming the argument ``name``."""
    try:
        low, high = value
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a (low, high) pair of positive numbers, got {value!r}") from None
    if not (_positive(low) and _positive(high)):
        raise ValueError(f"{name} must be a (low, high) pair of positive finite numbers, got {value!r}")
    if low > high:
        raise ValueError(f"{name} must be (low, high) with low <= high, got {value!r}")
    return float(low), float(high)


def _positive(value) -> bool:
    """Whether ``value`` is a positive finite real number (not a bool)."""
    if type(value) is not float and type(value) is not int:  # the common types first: the ABC check is slow
        if not isinstance(value, Real) or isinstance(value, bool):
            return False
    return math.isfinite(value) and value > 0


def random_resized_box(width: int, height: int, seed: int, scale=DEFAULT_SCALE,
                       ratio=DEFAULT_RATIO) -> tuple[int, int, int, int]:
    """The box ``(left, top, right, bottom)``, in whole pixels, of an Inception-style random
    resized crop of an upright ``width`` x ``height`` image, drawn from the item's ``seed``.

    The algorithm is the one torchvision documents for ``RandomResizedCrop``: up to
    :data:`TRIES` times, draw an area uniformly from ``scale`` times the image's area and an
    aspect ratio (width / height) log-uniformly from ``ratio``; the box of that area and aspect,
    its sides rounded to whole pixels, is taken when it fits in the image, at a position drawn
    uniformly from those where it fits. When no draw fits, the box is the centred crop whose
    aspect is the image's clamped into ``ratio`` (the whole image where that is inside).

    The draws are SplitMix64's finaliser (:func:`mix_seed`) of a key drawn from ``seed`` and the
    draw's number (a counter-based generator, run by the kernel ``_core.random_resized_draws``
    in under a microsecond, where seeding a numpy generator took tens; its readable twin is
    ``hydrax._fallback.random_resized_draws``), so a box is a pure function of its arguments,
    reproducible anywhere, and neighbouring seeds give unrelated boxes. Raises ValueError for a
    ``scale`` or ``ratio`` that is not a (low, high) pair of positive finite numbers with
    low <= high, or an image without pixels or with :data:`MAX_SIDE` or more a side.
    """
    low_scale, high_scale = scale if scale is DEFAULT_SCALE else check_range("scale", scale)
    low_ratio, high_ratio = ratio if ratio is DEFAULT_RATIO else check_range("ratio", ratio)
    width, height = int(width), int(height)
    if width < 1 or height < 1:
        raise ValueError(f"the image must have pixels, got {width}x{height}")
    if width >= MAX_SIDE or height >= MAX_SIDE:
        raise ValueError(f"the image must be less than 2**31 pixels a side, got {width}x{height}")
    box = _core.random_resized_draws(int(seed) & _SEED_MASK, _RESIZED_STREAM, TRIES, width, height, low_scale, high_scale,
                                     low_ratio, high_ratio)
    return centre_box(width, height, low_ratio, high_ratio) if box is None else box


def centre_box(width: int, height: int, low_ratio: float, high_ratio: float) -> tuple[int, int, int, int]:
    """The fallback of :func:`random_resized_box`: the centred box whose aspect is the image's
    clamped into ``low_ratio``..``high_ratio`` (at least one pixel a side)."""
    aspect = width / height
    w, h = width, height
    if aspect < low_ratio:
        h = max(1, min(height, round(width / low_ratio)))
    elif aspect > high_ratio:
        w = max(1, min(width, round(height * high_ratio)))
    left, top = (width - w) // 2, (height - h) // 2
    return left, top, left + w, top + h


__all__ = ["DEFAULT_RATIO", "DEFAULT_SCALE", "TRIES", "centre_box", "check_range", "mix_seed", "random_resized_box"]

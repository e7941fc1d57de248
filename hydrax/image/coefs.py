"""Per-channel coefficients that map 8-bit image data to the numbers a model sees, and back.

A :class:`Coefs` holds two rows with one column per channel (or one column for every channel):
row 0 is a divisor ``c0`` and row 1 a subtrahend ``c1``. The forward transform, used by
:func:`write_hwc` and :func:`write_chw`, is ``y = x / c0 - c1``; the inverse, used by
:func:`from_srgb_hwc`, is ``x = (y + c1) * c0``.
"""

from __future__ import annotations

import operator
import warnings
from functools import lru_cache
from typing import TYPE_CHECKING, ClassVar, final

import numpy as np
from PIL import Image

if TYPE_CHECKING:
    # Only for annotations, so that the docs show the alias name rather than its expansion.
    from numpy.typing import ArrayLike, DTypeLike


@final
class Coefs:
    """Representation coefficients, independent of the dtype they are applied in.

    ``coefs[dtype]`` gives the coefficients as a read-only ``(2, channels)`` numpy array of that
    dtype, converted once and then cached, so a loader function can index it for every image
    without cost.

    Ready-made sets: :attr:`FRACTIONAL`, :attr:`IMAGENET_SRGB`, :attr:`IMAGENET_SRGB_ALPHA` and
    :meth:`balanced`.

    :param coefs: a 2-row array-like: the divisors, then the subtrahends, with one column per
        channel or a single column shared by all channels. It is copied, so changing it
        afterwards has no effect. A flat pair ``[c0, c1]`` is taken as a single column.
    :raises ValueError: if ``coefs`` does not have that shape.
    :raises TypeError: if ``coefs`` is not numeric.
    """

    __slots__ = ("_by_dtype", "_source")

    FRACTIONAL: ClassVar[Coefs]
    """Maps ``[0, 255]`` to ``[0.0, 1.0]`` on every channel (alpha included)."""

    IMAGENET_SRGB: ClassVar[Coefs]
    """ImageNet standardisation of 3-channel sRGB data in ``[0, 255]``: ``(x - mean) / std`` with
    the usual ImageNet per-channel mean and standard deviation (scaled to 0..255)."""

    IMAGENET_SRGB_ALPHA: ClassVar[Coefs]
    """:attr:`IMAGENET_SRGB` for 4-channel sRGBA data; alpha is mapped to ``[0.0, 1.0]``."""

    def __init__(self, coefs: ArrayLike) -> None:
        source = np.array(coefs)
        if source.dtype.kind not in "biuf":
            raise TypeError(f"coefficients must be real numbers, not {source.dtype}")
        if source.shape == (2,):
            source = source.reshape(2, 1)
        if source.ndim != 2 or source.shape[0] != 2 or source.shape[1] == 0:
            raise ValueError(
                "coefficients must have 2 rows (divisors, subtrahends) and at least 1 column, "
                f"not shape {source.shape}"
            )
        source.setflags(write=False)
        self._source = source
        self._by_dtype: dict[np.dtype, np.ndarray] = {}

    def __getitem__(self, dtype: DTypeLike) -> np.ndarray:
        """The coefficients as a read-only ``(2, channels)`` array of ``dtype``."""
        dtype = np.dtype(dtype)
        cached = self._by_dtype.get(dtype)
        if cached is None:
            cached = np.array(self._source, dtype=dtype)
            cached.setflags(write=False)
            self._by_dtype[dtype] = cached
        return cached

    def __repr__(self) -> str:
        return f"Coefs({self._source.tolist()!r})"

    def __reduce__(self) -> tuple[type[Coefs], tuple[np.ndarray]]:
        # Rebuild through __init__ when sent to a worker process: numpy would otherwise restore
        # the cached arrays writeable.
        return Coefs, (self._source,)

    @property
    def columns(self) -> int:
        """The number of columns: 1 (shared by every channel) or the number of channels."""
        return self._source.shape[1]

    def affine(self, channels: int) -> tuple[np.ndarray, np.ndarray]:
        """The forward transform as a multiply-add: float64 ``(scale, offset)`` of length
        ``channels`` with ``x * scale + offset == x / c0 - c1`` (up to rounding).

        A single column is repeated for every channel.

        :param channels: the number of channels of the image it will be applied to.
        :raises ValueError: if the coefficients have neither 1 nor ``channels`` columns.
        """
        channels = operator.index(channels)
        self._check_channels(channels)
        divisor, subtrahend = self[np.float64]
        scale = np.broadcast_to(1.0 / divisor, (channels,)).copy()
        offset = np.broadcast_to(-subtrahend, (channels,)).copy()
        return scale, offset

    def _check_channels(self, channels: int) -> None:
        if self.columns not in (1, channels):
            raise ValueError(
                f"coefficients with {self.columns} columns cannot be applied to {channels} channels "
                f"(they need 1 column or {channels})"
            )

    @staticmethod
    @lru_cache(maxsize=8)
    def balanced(scale: float = 1.0, *, alpha: bool = False) -> Coefs:
        """Coefficients that map colour channels from ``[0, 255]`` to ``[-scale, scale]``.

        Calls with the same arguments return the same (cached) object.

        :param scale: half the width of the output range.
        :param alpha: add a 4th column that maps an alpha channel to ``[0.0, 1.0]``.
        """
        divisor = 127.5 / scale
        rows = [[divisor] * 3, [scale] * 3]
        if alpha:
            rows[0].append(255.0)
            rows[1].append(0.0)
        return Coefs(rows)


# ImageNet channel statistics on the 0..255 scale; the subtrahend is mean / std because the
# division comes first.
_IMAGENET_STD = (58.395, 57.12, 57.375)
_IMAGENET_MEAN = (123.675, 116.28, 103.53)

Coefs.FRACTIONAL = Coefs([[255.0], [0.0]])
Coefs.IMAGENET_SRGB = Coefs([list(_IMAGENET_STD), [m / s for m, s in zip(_IMAGENET_MEAN, _IMAGENET_STD)]])
Coefs.IMAGENET_SRGB_ALPHA = Coefs(
    [[*_IMAGENET_STD, 255.0], [*(m / s for m, s in zip(_IMAGENET_MEAN, _IMAGENET_STD)), 0.0]]
)


def _channels(array: np.ndarray, axis: int) -> int:
    # A 2-D HWC array is a single-channel (greyscale) image.
    return array.shape[axis] if array.ndim >= 3 else 1


def write_hwc(image: ArrayLike, array: np.ndarray, coefs: Coefs | None = None) -> None:
    """Write an image (a PIL image or an ``(H, W, C)`` array) into ``array``, channels last.

    The pixels are copied with ``casting="safe"``, so for example float data cannot be written
    into a ``uint8`` array. Then, if ``coefs`` is given, ``array`` is transformed in place with
    ``array / c0 - c1`` per channel, computed in ``array``'s dtype.

    HWC (channels last) is the usual layout in JAX and Pillow.

    :param image: the source pixels; anything ``numpy.asarray`` accepts, such as a PIL image.
    :param array: the destination, of the same shape (usually a loader array view).
    :param coefs: the representation to convert to. Without it the values stay as they are
        (``[0, 255]`` for a PIL image).
    :raises TypeError: if the pixels cannot be cast safely to ``array``'s dtype.
    :raises ValueError: if the shapes do not match, or ``coefs`` has the wrong number of columns.
    """
    if coefs is not None:
        coefs._check_channels(_channels(array, -1))
    np.copyto(array, np.asarray(image), casting="safe")
    if coefs is not None:
        divisor, subtrahend = coefs[array.dtype]
        array /= divisor
        array -= subtrahend


def write_chw(image: ArrayLike, array: np.ndarray, coefs: Coefs | None = None) -> None:
    """Write an image (a PIL image or an ``(H, W, C)`` array) into ``array``, channels first.

    The same as :func:`write_hwc`, except that ``array`` has shape ``(C, H, W)``: the source is
    transposed while it is copied. CHW (channels first) is the usual layout in PyTorch.

    :param image: the source pixels, channels last; anything ``numpy.asarray`` accepts.
    :param array: the ``(C, H, W)`` destination.
    :param coefs: the representation to convert to, or None to copy the values unchanged.
    :raises TypeError: if the pixels cannot be cast safely to ``array``'s dtype.
    :raises ValueError: if the shapes do not match, or ``coefs`` has the wrong number of columns.
    """
    if coefs is not None:
        coefs._check_channels(_channels(array, -3))
    np.copyto(array, np.asarray(image).transpose((2, 0, 1)), casting="safe")
    if coefs is not None:
        divisor, subtrahend = coefs[array.dtype]
        array /= divisor[:, None, None]
        array -= subtrahend[:, None, None]


def from_srgb_hwc(image: ArrayLike, coefs: Coefs, *, mode: str | None = None, copy: bool = False) -> Image.Image:
    """Turn HWC sRGB data in the representation of ``coefs`` back into an 8-bit PIL image.

    Applies the inverse transform ``(y + c1) * c0``, rounds half to even, clips to ``[0, 255]``
    and converts to ``uint8``. NaN values give a ``RuntimeWarning`` and become 0.

    .. caution::
        Unless ``copy`` is true, the work is done in ``image`` itself, which is therefore
        overwritten. With NumPy 2, ``copy=False`` raises ``ValueError`` when ``image`` cannot be
        used directly (for example a list, or an array that is not C-contiguous).

    :param image: ``(H, W, C)`` or ``(H, W)`` pixel data.
    :param coefs: the coefficients the data was written with (the same ones given to
        :func:`write_hwc`; this function inverts them).
    :param mode: the PIL mode, such as ``"RGB"``, ``"RGBA"`` or ``"RGBa"``; by default Pillow
        infers it from the shape.
    :param copy: work on a copy and leave ``image`` unchanged.
    """
    pixels = np.array(image, copy=copy, order="C")
    divisor, subtrahend = coefs[pixels.dtype]
    pixels += subtrahend
    pixels *= divisor
    np.round(pixels, out=pixels)
    np.clip(pixels, 0, 255, out=pixels)
    nan = np.isnan(pixels) if pixels.dtype.kind in "fc" else None
    if nan is not None and nan.any():
        # Spelled out so NaN becomes 0 on every platform, not only where the cast happens to.
        warnings.warn("from_srgb_hwc: NaN pixel values were written as 0", RuntimeWarning, stacklevel=2)
        with np.errstate(invalid="ignore"):
            data = pixels.astype(np.uint8)
        data[nan] = 0
    else:
        data = pixels.astype(np.uint8)
    return Image.fromarray(data) if mode is None else Image.fromarray(data, mode=mode)

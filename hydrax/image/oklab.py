"""Colour-space conversions for float image data: sRGB <-> `Oklab`_, and fractional <-> balanced.

The ``convert_*`` functions work in place on float arrays with channels last (``_hwc``) or
channels first (``_chw``), with any number of leading batch dimensions. They change only the
first 3 channels, so an alpha channel passes through untouched. Fractional means sRGB in
``[0.0, 1.0]``, as written by :func:`~hydrax.image.write_hwc` with
:attr:`Coefs.FRACTIONAL <hydrax.image.Coefs.FRACTIONAL>`.

The other functions are the float64 reference definitions (channels last, returning new arrays)
that the in-place conversions follow. The matrices are Björn Ottosson's, applied to column
vectors, so sRGB white ``(1, 1, 1)`` is Oklab ``(1, 0, 0)``.

.. note::
    hydrax 0.2.2 applied the two matrices transposed (white came out as about
    ``(2.476, -1.347, -0.235)``) and failed on CHW or 4-channel arrays. The results here are
    true Oklab and differ from 0.2.2's.

.. _Oklab: https://bottosson.github.io/posts/oklab/
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    # Only for annotations, so that the docs show the alias name rather than its expansion.
    from numpy.typing import ArrayLike


def _frozen(matrix: ArrayLike) -> np.ndarray:
    array = np.array(matrix, dtype=np.float64)
    array.setflags(write=False)
    return array


M1 = _frozen(
    [
        [0.4122214708, 0.5363325363, 0.0514459929],
        [0.2119034982, 0.6806995451, 0.1073969566],
        [0.0883024619, 0.2817188376, 0.6299787005],
    ]
)
"""Linear sRGB to LMS (Ottosson's combined sRGB matrix), for column vectors: ``lms = M1 @ rgb``."""

M2 = _frozen(
    [
        [0.2104542553, 0.7936177850, -0.0040720468],
        [1.9779984951, -2.4285922050, 0.4505937099],
        [0.0259040371, 0.7827717662, -0.8086757660],
    ]
)
"""Cube-rooted LMS to Oklab, for column vectors: ``lab = M2 @ cbrt(lms)``."""

# The exact inverses (rather than the rounded ones printed with the matrices), so that a round
# trip through Oklab is exact to float64 rounding.
M1_INV = _frozen(np.linalg.inv(M1))
"""The inverse of :data:`M1`: LMS to linear sRGB."""

M2_INV = _frozen(np.linalg.inv(M2))
"""The inverse of :data:`M2`: Oklab to cube-rooted LMS."""

# The sRGB transfer function: the encoded-value threshold of the linear segment, its slope,
# and the parameters of the power segment.
_EOTF_KNEE = 0.04045
_OETF_KNEE = 0.0031308
_SLOPE = 12.92
_GAMMA = 2.4
_A = 0.055


def _eotf(x: np.ndarray) -> np.ndarray:
    # Clamping the power branch's input keeps np.where from warning about values it discards.
    curve = ((np.maximum(x, _EOTF_KNEE) + _A) / (1 + _A)) ** _GAMMA
    return np.where(x <= _EOTF_KNEE, x / _SLOPE, curve)


def _oetf(x: np.ndarray) -> np.ndarray:
    curve = (1 + _A) * np.maximum(x, _OETF_KNEE) ** (1 / _GAMMA) - _A
    return np.where(x <= _OETF_KNEE, x * _SLOPE, curve)


def _to_oklab(rgb: np.ndarray) -> np.ndarray:
    # Channels are last, so each pixel is a row vector: M @ v becomes v @ M.T.
    dtype = rgb.dtype
    return np.cbrt(rgb @ M1.T.astype(dtype)) @ M2.T.astype(dtype)


def _from_oklab(lab: np.ndarray) -> np.ndarray:
    dtype = lab.dtype
    return (lab @ M2_INV.T.astype(dtype)) ** 3 @ M1_INV.T.astype(dtype)


def _reference(x: ArrayLike, *, pixels: bool) -> np.ndarray:
    array = np.array(x, dtype=np.float64)
    if pixels and (array.ndim == 0 or array.shape[-1] != 3):
        raise ValueError(f"expected 3 channels in the last axis, not shape {array.shape}")
    return array


def srgb_eotf(x: ArrayLike) -> np.ndarray:
    """The sRGB electro-optical transfer function: encoded sRGB values to linear light.

    ``x / 12.92`` up to 0.04045, ``((x + 0.055) / 1.055) ** 2.4`` above. Element-wise; returns
    a new float64 array.
    """
    return _eotf(_reference(x, pixels=False))


def srgb_oetf(x: ArrayLike) -> np.ndarray:
    """The inverse of :func:`srgb_eotf`: linear light to encoded sRGB values.

    ``12.92 * x`` up to 0.0031308, ``1.055 * x ** (1 / 2.4) - 0.055`` above. Element-wise;
    returns a new float64 array.
    """
    return _oetf(_reference(x, pixels=False))


def linear_srgb_to_oklab(rgb: ArrayLike) -> np.ndarray:
    """Linear sRGB to Oklab: ``M2 @ cbrt(M1 @ rgb)`` for each pixel.

    :param rgb: linear sRGB values, shape ``(..., 3)``.
    :returns: a new float64 array of the same shape.
    :raises ValueError: if the last axis does not have length 3.
    """
    return _to_oklab(_reference(rgb, pixels=True))


def oklab_to_linear_srgb(lab: ArrayLike) -> np.ndarray:
    """Oklab to linear sRGB, the inverse of :func:`linear_srgb_to_oklab`:
    ``M1_INV @ (M2_INV @ lab) ** 3`` for each pixel.

    :param lab: Oklab values, shape ``(..., 3)``.
    :returns: a new float64 array of the same shape.
    :raises ValueError: if the last axis does not have length 3.
    """
    return _from_oklab(_reference(lab, pixels=True))


def _colour_hwc(image: np.ndarray, name: str) -> np.ndarray:
    _check_float(image, name)
    if image.ndim < 1 or image.shape[-1] < 3:
        raise ValueError(f"{name} needs at least 3 channels in the last axis, not shape {image.shape}")
    return image[..., :3]


def _colour_chw(image: np.ndarray, name: str) -> np.ndarray:
    _check_float(image, name)
    if image.ndim < 3 or image.shape[-3] < 3:
        raise ValueError(f"{name} needs (..., C, H, W) data with at least 3 channels, not shape {image.shape}")
    return image[..., :3, :, :]


def _check_float(image: object, name: str) -> None:
    if not isinstance(image, np.ndarray):
        raise TypeError(f"{name} converts a numpy array in place, not {type(image).__name__}")
    if image.dtype.kind != "f":
        raise TypeError(f"{name} needs a floating-point array, not {image.dtype}")


def _transform_in_place(view: np.ndarray, function: Callable[[np.ndarray], np.ndarray]) -> None:
    # view is channels-last and may be strided (a channel slice, or a CHW array seen through
    # moveaxis); the result is computed separately and written back, so no numpy operation ever
    # writes into a non-contiguous output. float16 is computed in float32 for accuracy.
    work = np.promote_types(view.dtype, np.float32)
    view[...] = function(view.astype(work))


def convert_srgb_to_oklab_frac_hwc(image: np.ndarray) -> None:
    """Convert fractional sRGB to Oklab in place, channels last.

    :param image: float data in ``[0.0, 1.0]``, shape ``(..., H, W, C)`` with ``C >= 3``. Only
        the first 3 channels change.
    :raises TypeError: if ``image`` is not a floating-point numpy array.
    :raises ValueError: if it has fewer than 3 channels.
    """
    view = _colour_hwc(image, "convert_srgb_to_oklab_frac_hwc")
    _transform_in_place(view, lambda rgb: _to_oklab(_eotf(rgb)))


def convert_srgb_to_oklab_frac_chw(image: np.ndarray) -> None:
    """Convert fractional sRGB to Oklab in place, channels first.

    :param image: float data in ``[0.0, 1.0]``, shape ``(..., C, H, W)`` with ``C >= 3``. Only
        the first 3 channels change.
    :raises TypeError: if ``image`` is not a floating-point numpy array.
    :raises ValueError: if it has fewer than 3 channels.
    """
    view = _colour_chw(image, "convert_srgb_to_oklab_frac_chw")
    _transform_in_place(np.moveaxis(view, -3, -1), lambda rgb: _to_oklab(_eotf(rgb)))


def convert_oklab_to_srgb_frac_hwc(image: np.ndarray) -> None:
    """Convert Oklab to fractional sRGB in place, channels last; the inverse of
    :func:`convert_srgb_to_oklab_frac_hwc`. Out-of-gamut colours are not clipped.

    :param image: float Oklab data, shape ``(..., H, W, C)`` with ``C >= 3``. Only the first 3
        channels change.
    :raises TypeError: if ``image`` is not a floating-point numpy array.
    :raises ValueError: if it has fewer than 3 channels.
    """
    view = _colour_hwc(image, "convert_oklab_to_srgb_frac_hwc")
    _transform_in_place(view, lambda lab: _oetf(_from_oklab(lab)))


def convert_oklab_to_srgb_frac_chw(image: np.ndarray) -> None:
    """Convert Oklab to fractional sRGB in place, channels first; the inverse of
    :func:`convert_srgb_to_oklab_frac_chw`. Out-of-gamut colours are not clipped.

    :param image: float Oklab data, shape ``(..., C, H, W)`` with ``C >= 3``. Only the first 3
        channels change.
    :raises TypeError: if ``image`` is not a floating-point numpy array.
    :raises ValueError: if it has fewer than 3 channels.
    """
    view = _colour_chw(image, "convert_oklab_to_srgb_frac_chw")
    _transform_in_place(np.moveaxis(view, -3, -1), lambda lab: _oetf(_from_oklab(lab)))


# The balanced conversions keep 0.2.2's exact sequence of in-place operations, so their results
# are bit-identical to it.


def convert_frac_to_balanced_hwc(image: np.ndarray, scale: float = 1.0) -> None:
    """Map the colour channels from ``[0.0, 1.0]`` to ``[-scale, scale]`` in place, channels last:
    ``(x - 0.5) * 2 * scale``.

    :param image: float data, shape ``(..., H, W, C)`` with ``C >= 3``. Only the first 3
        channels change.
    :param scale: half the width of the output range.
    :raises TypeError: if ``image`` is not a floating-point numpy array.
    :raises ValueError: if it has fewer than 3 channels.
    """
    view = _colour_hwc(image, "convert_frac_to_balanced_hwc")
    view -= 0.5
    view *= scale * 2.0


def convert_frac_to_balanced_chw(image: np.ndarray, scale: float = 1.0) -> None:
    """Map the colour channels from ``[0.0, 1.0]`` to ``[-scale, scale]`` in place, channels
    first: ``(x - 0.5) * 2 * scale``.

    :param image: float data, shape ``(..., C, H, W)`` with ``C >= 3``. Only the first 3
        channels change.
    :param scale: half the width of the output range.
    :raises TypeError: if ``image`` is not a floating-point numpy array.
    :raises ValueError: if it has fewer than 3 channels.
    """
    view = _colour_chw(image, "convert_frac_to_balanced_chw")
    view -= 0.5
    view *= scale * 2.0


def convert_balanced_to_frac_hwc(image: np.ndarray, scale: float = 1.0) -> None:
    """Map the colour channels from ``[-scale, scale]`` back to ``[0.0, 1.0]`` in place, channels
    last: ``x / (2 * scale) + 0.5``.

    :param image: float data, shape ``(..., H, W, C)`` with ``C >= 3``. Only the first 3
        channels change.
    :param scale: half the width of the input range.
    :raises TypeError: if ``image`` is not a floating-point numpy array.
    :raises ValueError: if it has fewer than 3 channels.
    """
    view = _colour_hwc(image, "convert_balanced_to_frac_hwc")
    view /= scale * 2.0
    view += 0.5


def convert_balanced_to_frac_chw(image: np.ndarray, scale: float = 1.0) -> None:
    """Map the colour channels from ``[-scale, scale]`` back to ``[0.0, 1.0]`` in place, channels
    first: ``x / (2 * scale) + 0.5``.

    :param image: float data, shape ``(..., C, H, W)`` with ``C >= 3``. Only the first 3
        channels change.
    :param scale: half the width of the input range.
    :raises TypeError: if ``image`` is not a floating-point numpy array.
    :raises ValueError: if it has fewer than 3 channels.
    """
    view = _colour_chw(image, "convert_balanced_to_frac_chw")
    view /= scale * 2.0
    view += 0.5

"""Colour transforms from an image's embedded profile to the output space, built once per profile.

A :class:`PixelTransform` is what the one-pass kernel (``hydrax._core.convert_pixels``) needs:
per-channel tables to linear light, one matrix to the output space, and the output encoding.
For sRGB sources (no profile, or one that agrees with sRGB to half a level everywhere) the tables
are the sRGB curve and the matrix is the identity, so an sRGB image to sRGB output is no transform
at all. Matrix/TRC profiles compose their colorants with the inverse of LittleCMS's own sRGB
colorants, as LittleCMS does for relative colorimetric and (for these profiles) perceptual intent.
Everything else (gray, CMYK, lookup-table profiles, a black point that compensation would move)
is converted to sRGB by LittleCMS through Pillow first, with the transform cached.
"""

from __future__ import annotations

import threading
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from . import icc
from .icc import ProfileError
from .srgb import read_embedded_profile, srgb_profile
from .oklab import M1 as _M1
from .oklab import M2 as _M2
from .oklab import srgb_eotf, srgb_oetf

#: Output colour spaces: sRGB-encoded, linear-light sRGB, Oklab.
SPACES = ("srgb", "linear", "oklab")
_ENCODE = {"srgb": 0, "linear": 1, "oklab": 2}
#: Intervals of the sRGB encoding table (interpolated): error under 2e-5.
_CURVE_INTERVALS = 4096
#: Steps of the table from linear light straight to 8-bit sRGB codes.
_BYTE_STEPS = 16383
#: Transforms kept per process (one per distinct profile, mode and space).
CACHE_SIZE = 64

@lru_cache(maxsize=1)
def _xyz_to_srgb() -> np.ndarray:
    """The inverse of LittleCMS's sRGB colorants (D50 XYZ), read from the very profile it converts to."""
    model = icc.parse(srgb_profile().tobytes())
    assert model is not None
    return np.linalg.inv(model.matrix)


@lru_cache(maxsize=1)
def _srgb_tables() -> np.ndarray:
    codes = np.arange(256, dtype=np.float64) / 255.0
    table = srgb_eotf(codes).astype(np.float32)
    return np.stack([table, table, table])


@lru_cache(maxsize=1)
def _encode_curve() -> np.ndarray:
    return srgb_oetf(np.linspace(0.0, 1.0, _CURVE_INTERVALS + 1)).astype(np.float32)


@lru_cache(maxsize=1)
def _byte_curve() -> np.ndarray:
    """Final 8-bit sRGB codes of clipped linear light at 16383 steps (0.2 levels at worst, near black)."""
    return np.floor(srgb_oetf(np.linspace(0.0, 1.0, _BYTE_STEPS + 1)) * 255 + 0.5).astype(np.uint8)


@dataclass(frozen=True)
class PixelTransform:
    """Parameters of ``hydrax._core.convert_pixels`` for one source profile and output space.

    ``lcms``: LittleCMS converts the pixels to sRGB first, as :func:`hydrax.image.open_srgb`
    does. ``identity`` is True when the source is sRGB (after LittleCMS, if it was needed) and
    the output sRGB-encoded: the pixels are
    already right, and the kernel only rescales them (``space`` is then ``"linear"``: no curve).
    """

    space: str
    lin: np.ndarray
    matrix: np.ndarray
    encode: int
    curve: np.ndarray
    byte_curve: np.ndarray
    second: np.ndarray
    identity: bool
    lcms: bool = False


def _for_srgb(space: str, lcms: bool = False) -> PixelTransform:
    if space == "srgb":
        # The pixels are already the answer: codes to fractions, exactly, and nothing else.
        codes = np.arange(256, dtype=np.float32) / np.float32(255.0)
        return _kernel("linear", np.stack([codes, codes, codes]), np.eye(3), True, lcms)
    return _kernel(space, _srgb_tables(), _M1 if space == "oklab" else np.eye(3), False, lcms)


def _kernel(space: str, lin, matrix, identity: bool, lcms: bool = False) -> PixelTransform:
    empty = np.zeros((3, 3), np.float32)
    return PixelTransform(
        space=space,
        lin=np.ascontiguousarray(lin, np.float32),
        matrix=np.ascontiguousarray(matrix, np.float32),
        encode=_ENCODE[space],
        curve=_encode_curve(),
        byte_curve=_byte_curve() if space == "srgb" else np.zeros(0, np.uint8),
        second=np.ascontiguousarray(_M2, np.float32) if space == "oklab" else empty,
        identity=identity,
        lcms=lcms,
    )


def _is_srgb(model: icc.MatrixTRC, to_srgb: np.ndarray) -> bool:
    """True when ``model`` (whose colorants take linear RGB to linear sRGB by ``to_srgb``) is sRGB
    up to the precision profiles are written with.

    Its curves must agree with sRGB's to half a level at every code, and its colorants with
    LittleCMS's sRGB colorants to 0.2%: profiles named sRGB differ from each other by about 0.04%,
    which moves an 8-bit value by at most one level near black (LittleCMS's own output moves
    as much between them).
    """
    levels = np.arange(256, dtype=np.float64) / 255.0
    for curve in model.curves:
        if np.abs(srgb_oetf(np.clip(curve(levels), 0.0, 1.0)) - levels).max() * 255 >= 0.5:
            return False
    return bool(np.abs(to_srgb - np.eye(3)).max() < 2e-3)


def _build(profile: bytes | None, mode: str, space: str) -> PixelTransform:
    if not profile:
        return _for_srgb(space)
    model = None
    if mode in ("RGB", "RGBA", "RGBX"):
        model = icc.parse(profile)
    else:
        icc.tag_table(profile)  # a damaged profile is reported the same way for every mode
    if model is not None:
        tables = model.linear_tables()
        if not (np.isfinite(tables).all() and np.isfinite(model.matrix).all()):
            # One absurd curve parameter (a huge negative gamma, say) is enough; such a profile
            # would otherwise even pass for sRGB, NaN comparing false everywhere.
            raise ProfileError("the profile's tone curves or colorants give infinite or NaN values (it is damaged)")
        black = [float(curve(np.zeros(1))[0]) for curve in model.curves]
        if max(black) == 0.0:
            to_srgb = _xyz_to_srgb() @ model.matrix
            if _is_srgb(model, to_srgb):
                return _for_srgb(space)
            matrix = _M1 @ to_srgb if space == "oklab" else to_srgb
            return _kernel(space, tables, matrix, False)
    read_embedded_profile(profile)  # a profile LittleCMS cannot read is reported here, once
    return _for_srgb(space, lcms=True)


_cache: OrderedDict = OrderedDict()
_lock = threading.Lock()


def transform_for(profile: bytes | None, mode: str, space: str = "srgb", *, bad_profile: str = "raise") -> PixelTransform:
    """The transform for pixels of Pillow ``mode`` with embedded ``profile`` into ``space``.

    Cached by profile bytes, so a data set's few distinct profiles are each built once per
    process. ``bad_profile="warn"`` treats a damaged profile as sRGB, with a warning, instead of
    raising :class:`ProfileError`.
    """
    if space not in SPACES:
        raise ValueError(f"space must be one of {', '.join(SPACES)}, got {space!r}")
    key = (profile or b"", mode, space)
    with _lock:
        found = _cache.get(key)
        if found is not None:
            _cache.move_to_end(key)
            return found
    try:
        found = _build(profile, mode, space)
    except ProfileError as exc:
        if bad_profile != "warn":
            raise
        warnings.warn(f"ignoring a damaged ICC profile ({exc}); treating the image as sRGB", RuntimeWarning, stacklevel=3)
        return _for_srgb(space)  # not cached: a later call may ask for the error
    with _lock:
        _cache[key] = found
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return found

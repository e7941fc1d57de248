"""ICC profiles: reading the matrix/TRC model of an RGB profile, and telling when one is sRGB.

Most RGB photos carry a matrix/TRC profile (Adobe RGB, Display P3, ProPhoto, sRGB): a tone curve
per channel (``rTRC``/``gTRC``/``bTRC``, a ``curv`` table or gamma, or a ``para`` parametric
curve) and the colorants (``rXYZ``/``gXYZ``/``bXYZ``) that take linear RGB to the D50 profile
connection space. That model is all a colorimetric transform needs, so hydrax applies it with its
own kernel. Profiles with lookup tables (``A2B*``), and gray or CMYK profiles, are left to
LittleCMS (:func:`parse` returns None for them).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from ..errors import ProfileError

#: The most entries hydrax reads from an ICC ``curv`` table. The count is a 32-bit field, so a
#: profile of a few MB could otherwise ask for millions of samples (each a Python float); more
#: samples than 16-bit codes say nothing more, and LittleCMS reads no more than 32767.
MAX_CURVE_ENTRIES = 65536
#: The most tags a profile's tag table may list: LittleCMS refuses a profile of more (so Pillow's
#: path does), and a hostile table of a million entries would cost seconds and tens of MB here.
MAX_TAGS = 100


@dataclass(frozen=True)
class Curve:
    """One ICC tone curve: encoded value in [0, 1] to linear light.

    ``kind`` is ``"table"`` (``values``: samples at equal steps, 0..1), ``"gamma"`` (``values``:
    the exponent) or ``"para"`` (``function``: the ICC parametric type 0-4, ``values``: its
    parameters g, a, b, c, d, e, f as far as the type has them).
    """

    kind: str
    values: tuple[float, ...]
    function: int = 0

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """The curve at ``x`` (float64 array in [0, 1])."""
        x = np.asarray(x, np.float64)
        if self.kind == "gamma":
            return np.power(x, self.values[0])
        if self.kind == "table":
            table = np.asarray(self.values, np.float64)
            if len(table) == 0:
                return x.copy()
            return np.interp(x * (len(table) - 1), np.arange(len(table)), table)
        g, a, b, c, d, e, f = (self.values + (0.0,) * 7)[:7]
        if self.function == 0:
            return np.power(x, g)
        if self.function in (1, 2):
            base = a * x + b
            powered = np.power(np.maximum(base, 0.0), g)
            low = 0.0 if self.function == 1 else c
            return np.where(x >= -b / a, powered + (c if self.function == 2 else 0.0), low)
        # types 3 and 4: a power segment above d, a straight one below it
        powered = np.power(np.maximum(a * x + b, 0.0), g)
        if self.function == 3:
            return np.where(x >= d, powered, c * x)
        return np.where(x >= d, powered + e, c * x + f)


@dataclass(frozen=True)
class MatrixTRC:
    """The matrix/TRC model of an RGB profile: ``curves`` (R, G, B) and ``matrix`` (3x3; its
    columns are the red, green and blue colorants in D50 XYZ)."""

    curves: tuple[Curve, Curve, Curve]
    matrix: np.ndarray

    def linear_tables(self) -> np.ndarray:
        """(3, 256) float32: linear light of every 8-bit code, per channel."""
        codes = np.arange(256, dtype=np.float64) / 255.0
        return np.stack([np.clip(curve(codes), 0.0, None) for curve in self.curves]).astype(np.float32)


_PARA_COUNTS = {0: 1, 1: 3, 2: 4, 3: 5, 4: 7}


def _s15f16(data: bytes, offset: int, count: int) -> tuple[float, ...]:
    return tuple(v / 65536.0 for v in struct.unpack_from(f">{count}i", data, offset))


def tag_table(data: bytes) -> dict[bytes, tuple[int, int]]:
    """The profile's tags, signature -> (offset, size), each checked to lie inside ``data``;
    :class:`ProfileError` names what is wrong with a damaged header or table."""
    if len(data) < 132:
        raise ProfileError(f"the ICC profile is {len(data)} bytes, shorter than its 132-byte header")
    declared = struct.unpack_from(">I", data, 0)[0]
    if declared > len(data):
        raise ProfileError(f"the ICC profile declares {declared} bytes but has {len(data)} (truncated?)")
    if data[36:40] != b"acsp":
        raise ProfileError("not an ICC profile: the 'acsp' signature at byte 36 is missing")
    count = struct.unpack_from(">I", data, 128)[0]
    if count > MAX_TAGS:
        # before the table is read: the same refusal as LittleCMS's, on either path
        raise ProfileError(f"the ICC profile ({len(data)} bytes) lists {count} tags, more than the {MAX_TAGS} LittleCMS and hydrax "
                           "read: the profile is damaged or hostile. Re-save the image without it or with a usable one, or "
                           "decode with bad_profile='warn' to treat the image as sRGB")
    if 132 + 12 * count > len(data):
        raise ProfileError(f"the ICC profile's tag table ({count} tags) runs past its end")
    tags = {}
    for i in range(count):
        signature, offset, size = struct.unpack_from(">4sII", data, 132 + 12 * i)
        if offset + size > len(data) or size < 8:
            raise ProfileError(f"ICC tag {signature!r} at bytes {offset}..{offset + size} lies outside the {len(data)}-byte profile")
        tags[signature] = (offset, size)
    return tags


def _xyz(data: bytes, tags: dict, name: bytes) -> tuple[float, float, float]:
    offset, size = tags[name]
    if data[offset : offset + 4] != b"XYZ " or size < 20:
        raise ProfileError(f"ICC tag {name.decode()} is not an XYZ value")
    return _s15f16(data, offset + 8, 3)


def _named(data: bytes) -> str:
    """How errors name the profile ``data``: its description (see :func:`description`) and size."""
    return f"{description(data)!r} ({len(data)} bytes)"


def _curve(data: bytes, tags: dict, name: bytes) -> Curve:
    offset, size = tags[name]
    kind = data[offset : offset + 4]
    if kind == b"curv":
        count = struct.unpack_from(">I", data, offset + 8)[0]
        if 12 + 2 * count > size:
            raise ProfileError(f"ICC curve {name.decode()} declares {count} entries but its tag holds fewer")
        if count > MAX_CURVE_ENTRIES:
            # refused before anything is built from it: no other check bounds the table's memory
            profile = _named(data)
            raise ProfileError(
                f"the ICC profile {profile} has a tone curve {name.decode()} of {count} entries, more than the "
                f"{MAX_CURVE_ENTRIES} hydrax reads (LittleCMS reads at most 32767): the profile is damaged or "
                "hostile. Re-save the image without it or with a usable one, or decode with bad_profile='warn' "
                "to treat the image as sRGB", profile=profile, tag=name.decode())
        if count == 0:
            return Curve("table", ())
        if count == 1:
            return Curve("gamma", (struct.unpack_from(">H", data, offset + 12)[0] / 256.0,))
        table = np.frombuffer(data, ">u2", count, offset + 12).astype(np.float64) / 65535.0
        return Curve("table", tuple(table.tolist()))
    if kind == b"para":
        function = struct.unpack_from(">H", data, offset + 8)[0]
        if function not in _PARA_COUNTS:
            raise ProfileError(f"ICC curve {name.decode()} has unknown parametric type {function}")
        params = _PARA_COUNTS[function]
        if 12 + 4 * params > size:
            raise ProfileError(f"ICC curve {name.decode()} (parametric type {function}) is truncated")
        values = _s15f16(data, offset + 12, params)
        if function in (1, 2, 3, 4) and values[1] == 0:
            raise ProfileError(f"ICC curve {name.decode()} has a zero slope parameter")
        return Curve("para", values, function)
    raise ProfileError(f"ICC curve {name.decode()} has unknown type {kind!r}")


def parse(data: bytes) -> MatrixTRC | None:
    """The matrix/TRC model of the profile ``data``, or None when LittleCMS should handle it.

    None means: not an RGB profile with an XYZ connection space, or one whose lookup tables
    (``A2B0``/``A2B1``/``A2B2``) LittleCMS would prefer over its matrix. Raises
    :class:`ProfileError` for a damaged profile.
    """
    tags = tag_table(data)
    if data[16:20] != b"RGB " or data[20:24] != b"XYZ ":
        return None
    if any(name in tags for name in (b"A2B0", b"A2B1", b"A2B2")):
        return None
    needed = (b"rXYZ", b"gXYZ", b"bXYZ", b"rTRC", b"gTRC", b"bTRC")
    missing = [name.decode() for name in needed if name not in tags]
    if missing:
        raise ProfileError(f"the RGB ICC profile has neither lookup tables nor the matrix/TRC tags {', '.join(missing)}")
    matrix = np.array([_xyz(data, tags, name) for name in needed[:3]], np.float64).T
    if abs(np.linalg.det(matrix)) < 1e-6:
        raise ProfileError("the ICC profile's colorants are degenerate (their matrix has no inverse)")
    curves = tuple(_curve(data, tags, name) for name in needed[3:])
    return MatrixTRC(curves, matrix)  # type: ignore[arg-type]


def description(data: bytes) -> str:
    """A short human name for the profile (its ``desc`` tag), or ``"unnamed"``."""
    try:
        tags = tag_table(data)
        offset, size = tags[b"desc"]
    except (ProfileError, KeyError):
        return "unnamed"
    kind = data[offset : offset + 4]
    if kind == b"desc":
        length = struct.unpack_from(">I", data, offset + 8)[0]
        text = data[offset + 12 : offset + 12 + max(0, length - 1)]
        return text.decode("latin-1", "replace") or "unnamed"
    if kind == b"mluc":
        records = struct.unpack_from(">I", data, offset + 8)[0]
        if records:
            length, start = struct.unpack_from(">II", data, offset + 20)
            return data[offset + start : offset + start + length].decode("utf-16-be", "replace") or "unnamed"
    return "unnamed"

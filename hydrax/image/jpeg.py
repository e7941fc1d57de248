"""JPEG files without Pillow: their markers read here, their pixels decoded by libjpeg-turbo.

This is the first half of :func:`hydrax.image.decode_into`'s fast path. :func:`read_header` walks
the marker segments up to the first scan and returns a :class:`JpegHeader` for the files that
path handles: 8-bit Huffman-coded JPEGs (baseline, extended or progressive) with one or three
components, their EXIF orientation and their ICC profile (APP2 chunks, joined as Pillow joins
them). For anything else, and for anything it cannot read cleanly, it returns None and
``decode_into`` takes Pillow's path, so an unusual or damaged file behaves exactly as it did
before this path existed.

Three decoders follow. :func:`decode_planes` has libjpeg-turbo decode a YCbCr file's Y, Cb and Cr
planes as they are stored, without upsampling the chroma or converting colour (that work is done
later, for the output's pixels only): the quickest way from a JPEG to a small slot. The library
is the libjpeg-turbo that Pillow's wheels carry, opened at run time (:func:`library`), so
nothing more is installed or built against. :func:`decode_region` has the same library decode
only a box of the image, to RGB or gray, at a DCT scale: the rows above it entropy-decoded and
skipped, the columns beside it not transformed, nothing below it read (a random resized crop's
box). :func:`decode` gives all of the image as RGB or gray pixels, through simplejpeg (whose
wheels carry libjpeg-turbo too), scaled in the DCT domain by the factor Pillow's ``draft`` would
choose, so both paths see the same pixels. Each decodes into a buffer its thread keeps.
"""

from __future__ import annotations

import glob
import logging
import os
import struct
import threading
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .. import _core
from .sizes import TRANSPOSED_ORIENTATIONS

try:
    import simplejpeg
except ImportError:  # the image extra brings it; without it every JPEG takes Pillow's path
    simplejpeg = None

#: The decode buffer a thread keeps between images (bigger images get one of their own).
KEEP_BUFFER_BYTES = 64 << 20
#: Where decode buffers start: a multiple of this many bytes (the plane kernels want 16).
BUFFER_ALIGN = 64
_ORIENTATION_TAG = 0x0112
_SHORT = 3
#: Where Pillow's wheels keep the libraries they bring, relative to the PIL package: manylinux
#: and musllinux wheels, macOS wheels.
_PILLOW_LIBRARIES = ("../pillow.libs/libjpeg*.so*", ".dylibs/libjpeg*.dylib")
#: Set to the path of a libjpeg-turbo (ABI 6.2) to use that one for planes, or to an empty string
#: to decode every JPEG through :func:`decode` instead.
LIBJPEG_ENV = "HYDRAX_LIBJPEG"
#: libjpeg-turbo upsamples a chroma plane of half the width by interpolating ("fancy"
#: upsampling, which the plane path models) only when the plane is wider than this many
#: samples (jdsample.c); narrower planes are replicated, so their files take the RGB path.
MIN_FANCY_WIDTH = 2

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JpegHeader:
    """What the fast path needs from a JPEG's markers.

    ``width`` and ``height`` are as stored (before the EXIF ``orientation``, 1-8, is applied);
    ``components`` is 1 (gray) or 3; ``icc_profile`` is the embedded profile or None;
    ``sampling`` is each component's (horizontal, vertical) sampling factor, 1-4.
    """

    width: int
    height: int
    components: int
    orientation: int
    icc_profile: bytes | None
    sampling: tuple[tuple[int, int], ...] = ((1, 1),)


def read_header(data: memoryview, max_pixels: int | None = None) -> JpegHeader | None:
    """The header of the JPEG in ``data``, or None where the fast path should not take it: not a
    JPEG, another coding or precision, CMYK, more pixels than ``max_pixels``, several EXIF
    blocks, an orientation only XMP gives, a multi-picture file, or any segment that does not
    parse. Reads the markers only (the kernel ``_core.scan_jpeg_markers``), never the
    entropy-coded data."""
    if not (isinstance(data, memoryview) and data.format == "B" and data.ndim == 1 and data.c_contiguous):
        data = memoryview(bytes(data))
    found = _core.scan_jpeg_markers(data)
    if found is None:
        return None
    width, height, sampling, exif, icc = found
    if max_pixels and width * height > max_pixels:
        return None  # Pillow's path warns or refuses, as it always has
    orientation = 1 if exif is None else _orientation(data[exif[0] : exif[1]])
    if orientation is None:
        return None
    profile = _join_profile([bytes(data[start:stop]) for start, stop in icc]) if icc else None
    return JpegHeader(width, height, len(sampling), orientation, profile, sampling)


def _join_profile(chunks: list[bytes]) -> bytes | None:
    """The ICC profile from its APP2 chunks (each at least 14 bytes) as Pillow joins them: in
    order of sequence number, and None unless the first chunk's count is right."""
    if not chunks:
        return None
    chunks = sorted(chunks)
    if chunks[0][13] != len(chunks):
        return None
    return b"".join(chunk[14:] for chunk in chunks)


def _orientation(exif: memoryview) -> int | None:
    """The orientation tag of IFD0 of an EXIF block (1 where it has none), or None where the
    block does not parse cleanly or the value is not 1-8 (Pillow's path then decides)."""
    if len(exif) < 8:
        return None
    order = bytes(exif[:2])
    if order not in (b"II", b"MM"):
        return None
    prefix = "<" if order == b"II" else ">"
    magic, ifd = struct.unpack_from(prefix + "HI", exif, 2)
    if magic != 42 or ifd < 8 or ifd + 2 > len(exif):
        return None
    (count,) = struct.unpack_from(prefix + "H", exif, ifd)
    if ifd + 2 + 12 * count > len(exif):
        return None
    for entry in range(ifd + 2, ifd + 2 + 12 * count, 12):
        tag, kind, number = struct.unpack_from(prefix + "HHI", exif, entry)
        if tag == _ORIENTATION_TAG:
            if kind != _SHORT or number != 1:
                return None
            (value,) = struct.unpack_from(prefix + "H", exif, entry + 8)
            return value if 1 <= value <= 8 else None
    return 1


def draft_factor(header: JpegHeader, wanted_width: int, wanted_height: int) -> int:
    """The DCT scaling Pillow's ``draft`` picks for a decoded size of at least ``wanted_width``
    x ``wanted_height`` (as stored): 1, 2, 4 or 8."""
    scale = min(header.width // max(1, wanted_width), header.height // max(1, wanted_height))
    return next(factor for factor in (8, 4, 2, 1) if scale >= factor)


_local = threading.local()


def _buffer(size: int) -> np.ndarray:
    """At least ``size`` bytes to decode into, starting 64-byte aligned: this thread's buffer,
    grown as needed."""
    buffer = getattr(_local, "buffer", None)
    if buffer is not None and buffer.nbytes >= size:
        return buffer
    block = np.empty(size + BUFFER_ALIGN, np.uint8)
    buffer = block[-block.__array_interface__["data"][0] % BUFFER_ALIGN:][:size]
    if size <= KEEP_BUFFER_BYTES:
        _local.buffer = buffer
    return buffer


def decode(data: memoryview, header: JpegHeader, factor: int = 1) -> np.ndarray | None:
    """The pixels of the JPEG in ``data``, scaled by 1/``factor`` in the DCT domain: (H, W, 1 or
    3) uint8, as stored (not turned upright), in this thread's buffer, so valid until the next
    call. None where libjpeg-turbo reports anything at all, a warning included: Pillow's path
    then decodes or words the error as it always has."""
    if simplejpeg is None:
        return None
    height, width = -(-header.height // factor), -(-header.width // factor)
    channels = 1 if header.components == 1 else 3
    try:
        pixels = simplejpeg.decode_jpeg(data, colorspace="GRAY" if channels == 1 else "RGB", min_factor=factor,
                                        min_height=height, min_width=width, buffer=_buffer(height * width * channels),
                                        strict=True)
    except (ValueError, TypeError, RuntimeError, OverflowError):
        return None
    if pixels.shape != (height, width, channels):  # another scaling than Pillow's: leave it to Pillow
        return None
    return pixels


@lru_cache(maxsize=1)
def library() -> _core.JpegLibrary | None:
    """The libjpeg-turbo :func:`decode_planes` uses: ``$HYDRAX_LIBJPEG`` where that is set
    (empty: none), else the copy Pillow's wheel brings; None where there is none that decodes a
    test image correctly (a Pillow built against another libjpeg, another ABI, a 32-bit
    platform). Found once per process. A library ``$HYDRAX_LIBJPEG`` names that cannot be used
    (no such file, not a libjpeg, another ABI) is logged as a WARNING, once per process; the
    copy beside Pillow quietly (DEBUG), since nobody asked for it."""
    chosen = os.environ.get(LIBJPEG_ENV)
    if chosen is not None:
        candidates = [chosen] if chosen else []
    else:
        import PIL

        base = os.path.dirname(PIL.__file__)
        candidates = sorted(path for pattern in _PILLOW_LIBRARIES for path in glob.glob(os.path.join(base, pattern)))
    for path in candidates:
        try:
            found = _core.JpegLibrary(path)
        except (OSError, ValueError) as exc:  # ValueError: a name the file system cannot take (not UTF-8)
            missing = os.sep in path and not os.path.exists(path)  # a bare name is looked for as dlopen looks
            _unusable(path, chosen is not None, "there is no such file" if missing else str(exc))
            continue
        if _decodes_correctly(found):
            return found
        _unusable(path, chosen is not None, "it does not decode planes as libjpeg-turbo 6.2 does")
    return None


_warned: set[str] = set()
_warned_lock = threading.Lock()


def _unusable(path: str, asked: bool, reason: str) -> None:
    """Say that the libjpeg at ``path`` cannot decode planes: a WARNING, once per process and
    path, where ``$HYDRAX_LIBJPEG`` asked for it (the plane path is then off, which the user
    should hear of); at DEBUG where it was only a candidate found beside Pillow."""
    if not asked:
        log.debug("%s cannot decode JPEG planes (%s); JPEGs are decoded to RGB", path, reason)
        return
    with _warned_lock:
        if path in _warned:
            return
        _warned.add(path)
    log.warning("%s=%r cannot be used to decode JPEG planes: %s. JPEGs are decoded to RGB instead (slower); set %s "
                "to a libjpeg-turbo of libjpeg's 6.2 ABI, unset it to use the one Pillow brings, or set it empty to "
                "decode to RGB without this warning", LIBJPEG_ENV, path, reason, LIBJPEG_ENV)


def _decodes_correctly(found: _core.JpegLibrary) -> bool:
    """Whether ``found`` decodes a small 4:2:0 JPEG's planes to what Pillow sees in them."""
    import io

    from PIL import Image

    rows, columns = np.mgrid[0:24, 0:40]
    image = Image.fromarray(np.stack([rows * 10, columns * 6, (rows + columns) * 4], axis=2).astype(np.uint8))
    encoded = io.BytesIO()
    image.save(encoded, "JPEG", quality=95, subsampling=2)
    data = encoded.getvalue()
    header = read_header(memoryview(data))
    planes = None if header is None else _planes_of(found, memoryview(data), header)
    if planes is None:
        return False
    expected = Image.open(io.BytesIO(data))
    expected.draft("YCbCr", expected.size)  # libjpeg's own luma, untouched by colour conversion
    return bool(np.array_equal(planes[0], np.asarray(expected)[:, :, 0]))


def planar(header: JpegHeader) -> bool:
    """Whether :func:`decode_planes` takes a file of this header: three components, luma sampled
    most, both chroma planes alike, at half or full luma resolution on each axis, and a chroma
    plane of half the width more than :data:`MIN_FANCY_WIDTH` samples wide."""
    if header.components != 3:
        return False
    (h, v), chroma, other = header.sampling
    if not (chroma == other and h in (1, 2) and v in (1, 2) and h % chroma[0] == 0 and v % chroma[1] == 0):
        return False
    # The plane kernels weigh half-width chroma as libjpeg's triangle ("fancy") upsampling makes
    # it. libjpeg-turbo only does that for a plane wider than 2 samples: a narrower one it
    # replicates, on both axes for 4:2:0, so an image 1-4 pixels wide came out up to 25 levels
    # off. Such images are tiny: the RGB path decodes them, to Pillow's bit, at no cost worth
    # saving.
    across = h // chroma[0]
    return across == 1 or -(-header.width // across) > MIN_FANCY_WIDTH


def decode_planes(data: memoryview, header: JpegHeader, stop: int | None = None,
                  start: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The Y, Cb and Cr planes of the JPEG in ``data`` as stored (chroma at its own resolution,
    ``header.sampling`` says which), uint8, in this thread's buffer, so valid until the next call.
    With ``stop``, libjpeg-turbo stops after the iMCU row that holds luma row ``stop - 1`` (and
    the chroma rows decoded with it): the rows below are left as the buffer held them, unread by
    anything that only reads rows above ``stop``, and damage there goes unnoticed. With
    ``start``, the iMCU rows above the one holding luma row ``start`` are read through but not
    transformed, so their rows are left as the buffer held them too (a caller reading chroma
    row r of a plane at 1/k of luma's height gives a ``start`` of at most k * r). None where the file is not :func:`planar`, there is no :func:`library`, or libjpeg-turbo
    reports anything at all (the caller then takes another path, which words any error)."""
    found = library()
    if found is None or not planar(header):
        return None
    stop = header.height if stop is None else max(1, min(int(stop), header.height))
    return _planes_of(found, data, header, stop, max(0, min(int(start), stop - 1)))


def _planes_of(found: _core.JpegLibrary, data: memoryview, header: JpegHeader, stop: int = -1, start: int = 0):
    size, views = _plane_views(header.width, header.height, header.sampling)
    if found.decode_planes(data, header.width, header.height, header.sampling, _buffer(size), stop, start) != 0:
        return None
    return views


def _plane_views(width: int, height: int, sampling: tuple) -> tuple[int, tuple[np.ndarray, ...]]:
    """The bytes the planes of a JPEG of this size and sampling need, and their views of this
    thread's buffer (made once for the last size asked: a data set's photos come in few sizes,
    and making three views cost more than a tenth of the Python an image takes)."""
    key, size, views, of = getattr(_local, "views", (None, 0, (), None))
    if key == (width, height, sampling) and _buffer(size) is of:
        return size, views
    layout, size = _core.jpeg_plane_layout(width, height, sampling)
    buffer = _buffer(size)
    views = tuple(buffer[offset:offset + rows * stride].reshape(rows, stride)[:height, :width]
                  for offset, rows, stride, height, width in layout)
    _local.views = ((width, height, sampling), size, views, buffer)
    return size, views


#: The samplings (h, v of each component) :func:`decode_region` takes: gray, 4:4:4, 4:2:2 and
#: 4:2:0, each tested against a full decode. Others (4:4:0, 4:1:1, odd factors) decode whole.
REGION_SAMPLINGS = frozenset({((1, 1),), ((1, 1), (1, 1), (1, 1)), ((2, 1), (1, 1), (1, 1)), ((2, 2), (1, 1), (1, 1))})


def decode_region(data: memoryview, header: JpegHeader, factor: int, box: tuple[int, int, int, int]) -> np.ndarray | None:
    """The JPEG in ``data`` scaled by 1/``factor`` in the DCT domain, as :func:`decode` gives it,
    but with only the pixels in ``box`` (left, top, right, bottom of the scaled image) decoded:
    libjpeg-turbo entropy-decodes the rows above the box without transforming them, transforms
    only the box's columns (and a margin), and stops below the box. (H, W, 1 or 3) uint8 as
    stored, in this thread's buffer: valid until the next call, and outside the box it holds
    whatever the buffer held. None where the file's sampling is not one of
    :data:`REGION_SAMPLINGS`, the :func:`region_library` is missing, or libjpeg-turbo reports
    anything (damage below the box goes unseen)."""
    found = region_library()
    if found is None or header.sampling not in REGION_SAMPLINGS:
        return None
    height, width = -(-header.height // factor), -(-header.width // factor)
    left, top, right, bottom = box
    if not (0 <= left < right <= width and 0 <= top < bottom <= height):
        raise ValueError(f"the box {box} is not inside the {width}x{height} image")
    channels = header.components
    buffer = _buffer(height * width * channels)
    # a column of margin either side: libjpeg upsamples a crop's edge columns as it does the image's
    status, _ = found.decode_region(data, header.width, header.height, channels, factor, max(0, left - 1), top,
                                    min(width, right + 1), bottom, buffer)
    if status != 0:
        return None
    return buffer[:height * width * channels].reshape(height, width, channels)


def region_library() -> _core.JpegLibrary | None:
    """The :func:`library`, where it has the scanline calls :func:`decode_region` needs and
    crops and skips as a full decode makes the pixels (a small 4:2:0 image, at two scales,
    checked once per library); else None (every JPEG is then decoded whole)."""
    found = library()
    return found if found is not None and found.scanlines and _crops_correctly(found) else None


@lru_cache(maxsize=2)
def _crops_correctly(found: _core.JpegLibrary) -> bool:
    """Whether ``found`` decodes a region of a small 4:2:0 JPEG as Pillow decodes all of it."""
    import io

    from PIL import Image

    rows, columns = np.mgrid[0:45, 0:61]
    image = Image.fromarray(np.stack([rows * 5, columns * 4, (rows * columns) % 251], axis=2).astype(np.uint8))
    encoded = io.BytesIO()
    image.save(encoded, "JPEG", quality=90, subsampling=2)
    data = encoded.getvalue()
    for factor, (left, top, right, bottom) in ((1, (21, 19, 50, 40)), (2, (5, 9, 27, 20))):
        expected = Image.open(io.BytesIO(data))
        expected.draft("RGB", (61 // factor, 45 // factor))
        height, width = -(-45 // factor), -(-61 // factor)
        buffer = np.zeros(height * width * 3, np.uint8)
        status, _ = found.decode_region(data, 61, 45, 3, factor, left - 1, top, right + 1, bottom, buffer)
        got = buffer.reshape(height, width, 3)[top:bottom, left:right]
        if status != 0 or not np.array_equal(got, np.asarray(expected)[top:bottom, left:right]):
            log.debug("%s does not crop and skip scanlines as it decodes them; JPEGs are decoded whole", found.path)
            return False
    return True


def upright(pixels: np.ndarray, orientation: int) -> np.ndarray:
    """A view of stored ``pixels`` as EXIF ``orientation`` says they are seen (what Pillow's
    ``ImageOps.exif_transpose`` makes, without a copy)."""
    if orientation in TRANSPOSED_ORIENTATIONS:
        pixels = pixels.transpose(1, 0, 2)
    if orientation in (2, 3, 6, 7):
        pixels = pixels[:, ::-1]
    if orientation in (3, 4, 7, 8):
        pixels = pixels[::-1]
    return pixels


__all__ = ["LIBJPEG_ENV", "REGION_SAMPLINGS", "JpegHeader", "decode", "decode_planes", "decode_region", "draft_factor",
           "library", "planar", "read_header", "region_library", "upright"]

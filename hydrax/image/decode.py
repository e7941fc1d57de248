"""decode_into: encoded image bytes to finished, colour-managed pixels in a batch slot.

One call per item in a loader function::

    def load(sample, arrays, seed):
        decode_into(sample["jpg"], arrays["image"], crop="random", flip=True, seed=seed,
                    space="srgb", coefs=Coefs.IMAGENET_SRGB, layout="chw")

The image is decoded (JPEGs larger than twice the target are scaled down in the DCT domain as they
decode), EXIF orientation is applied, the image is resized by the smallest scale at which it
covers the slot (an image of the slot's size stays 1:1; ``size`` sets the shorter side instead)
and the crop taken in one resampling step, and the few output pixels are converted from the
embedded profile to the requested space, encoding, dtype and layout, straight into ``out``.
Colour work therefore scales with the output, not the photo.

Three paths do this. Common JPEGs (8-bit, gray or YCbCr, Huffman-coded, read from bytes) take a
fast one: their markers are read by :mod:`hydrax.image.jpeg` and libjpeg-turbo decodes them into
a buffer the thread keeps. Upright YCbCr files that need no DCT scaling are decoded as their own
Y, Cb and Cr planes, which one kernel call resizes and turns into RGB for the slot's pixels only
(the plane path: within rounding of Pillow's result, see docs/images.rst); the others are decoded
to RGB and resized with Pillow's arithmetic to the bit (:mod:`hydrax.image.resample`). For a
random resized crop of an upright JPEG, only the pixels the box's resize reads are decoded to
RGB (:func:`hydrax.image.jpeg.decode_region`), at any DCT scale, unless the box is large enough
at full scale that the plane path is quicker (:data:`REGION_SHARE`). Everything
else (PNG, WebP, GIF, CMYK or 12-bit or arithmetic-coded JPEGs, damaged files, file objects,
profiles only LittleCMS can apply, the nearest-neighbour filter) goes through Pillow as before,
and so does any JPEG the fast paths cannot decode cleanly: its errors are Pillow's, worded as ever.
"""

from __future__ import annotations

import io
import os
import re
import struct
import warnings
import zlib
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from .. import _core
from ..errors import ImageError, ProfileError
from . import jpeg
from .boxes import DEFAULT_RATIO, DEFAULT_SCALE, check_range, mix_seed, random_resized_box
from .resample import FILTERS, pixels_read, plane_rows_first, plane_rows_read, resize_into, resize_planes_into
from .sizes import TRANSPOSED_ORIENTATIONS
from .srgb import convert_to_srgb, intent_and_flags
from .transform import PixelTransform, transform_for

_LAYOUTS = ("hwc", "chw")
#: A random resized crop's box at full scale is decoded alone (RGB, :func:`hydrax.image.jpeg.decode_region`)
#: where it has fewer pixels than this share of the rows down to its bottom, which the plane path
#: transforms whole; else as planes. Measured (docs/images.rst): the quicker of the two within a few %.
REGION_SHARE = 0.4
_CROPS = ("center", "random", "random_resized")
_ORIENTATION_TAG = 0x0112
# What Pillow's format plugins raise for damaged data: besides OSError, each raises what its parser
# trips over (a short struct, a bad zlib stream, an index past a table...).
_DAMAGED = (OSError, SyntaxError, ValueError, EOFError, IndexError, KeyError, TypeError, ZeroDivisionError,
            OverflowError, struct.error, zlib.error)
#: What Pillow raises for image data it cannot read, each worded by :func:`pillow_error_message`:
#: ``UnidentifiedImageError`` (an OSError) for data no format recognises, ``DecompressionBombError``
#: for an image over the pixel limit, and for damaged data OSError or whatever else the format's
#: parser trips over.
PILLOW_ERRORS = (Image.DecompressionBombError, *_DAMAGED)
# Pillow names the file object it read in its messages, which says nothing to the reader.
_OBJECT_REPR = re.compile(r" ?<[\w.]+ object at 0x[0-9a-fA-F]+>")


def _describe(data: Any) -> str:
    """How errors name the image ``data``: an open file's path, else its length in bytes."""
    name = getattr(data, "name", None)
    if isinstance(name, (str, bytes, os.PathLike)):
        return os.fsdecode(name)
    if isinstance(data, io.BytesIO):
        with data.getbuffer() as view:  # released at once: a live view would stop the file from growing
            return f"bytes of length {view.nbytes}"
    if hasattr(data, "read"):
        return f"a {type(data).__name__} file object"
    try:
        with memoryview(data) as view:
            return f"bytes of length {view.nbytes}"
    except TypeError:
        return f"a {type(data).__name__}"


def _pillow_reason(exc: BaseException) -> str:
    """Pillow's words for ``exc`` without the object reprs it puts in them, and its type when the
    words alone say little."""
    text = _OBJECT_REPR.sub("", str(exc)).strip()
    if not text or not isinstance(exc, (OSError, ValueError, SyntaxError)):
        text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text


def pillow_error_message(exc: BaseException, *, damaged: str = "truncated or corrupt image",
                         formats: list[str] | tuple[str, ...] | None = None, unidentified_reason: bool = True) -> str:
    """hydrax's words for ``exc``, one of :data:`PILLOW_ERRORS`, which Pillow raised reading an image.

    Data no format recognises is "not an image Pillow can read" (``as FORMATS`` when only
    ``formats`` were tried), followed by Pillow's reason unless ``unidentified_reason`` is false;
    an image over the pixel limit is Pillow's message and how to raise the limit; anything else is
    damaged data: ``damaged``, then Pillow's reason. The image is not named: callers put its name
    (if any) first.
    """
    if isinstance(exc, UnidentifiedImageError):
        words = f"not an image Pillow can read{'' if formats is None else f' as {formats}'}"
        return f"{words}: {_pillow_reason(exc)}" if unidentified_reason else words
    if isinstance(exc, Image.DecompressionBombError):
        return f"{exc} (raise the limit with hydrax.image.set_max_image_pixels)"
    return f"{damaged}: {_pillow_reason(exc)}"


def scale_for(width: int, height: int, out_height: int, out_width: int, size: int | None = None) -> float:
    """The factor a ``width`` x ``height`` image is resized by to fill an ``out_height`` x
    ``out_width`` output.

    Without ``size``: the smallest factor at which the image covers the output (both sides at
    least the output's), so an image of the output's size is kept at 1:1 and one of another aspect
    ratio loses only what sticks out on one axis. With ``size``: the shorter side becomes ``size``,
    or more where that would not cover the output (the image is never stretched, nor the slot
    left partly empty).
    """
    cover = max(out_width / width, out_height / height)
    if size is None:
        return cover
    size = int(size)
    if size < 1:
        raise ValueError(f"size must be a positive number of pixels, got {size}")
    return max(size / min(width, height), cover)


def crop_box(width: int, height: int, out_height: int, out_width: int, size: int | None, crop: str,
             seed: int | None) -> tuple[float, float, float, float]:
    """The region of a ``width`` x ``height`` image that becomes the ``out_height`` x ``out_width``
    output: the image resized by :func:`scale_for` (default: the smallest scale that covers the
    output; with ``size``, the shorter side scaled to ``size``), then a centred or (from ``seed``)
    random crop. A pure function, so crops can be checked and replayed.
    """
    scale = scale_for(width, height, out_height, out_width, size)
    # the scale covers the output, so a side that rounding leaves a pixel short is the output's
    scaled_w, scaled_h = max(out_width, round(width * scale)), max(out_height, round(height * scale))
    if crop == "center":
        left, top = (scaled_w - out_width) // 2, (scaled_h - out_height) // 2
    else:
        left = mix_seed(seed, 1) % (scaled_w - out_width + 1)
        top = mix_seed(seed, 2) % (scaled_h - out_height + 1)
    sx, sy = width / scaled_w, height / scaled_h
    return left * sx, top * sy, (left + out_width) * sx, (top + out_height) * sy


def flips(seed: int) -> bool:
    """Whether the item with ``seed`` is mirrored when ``flip=True`` (half of all seeds are)."""
    return bool(mix_seed(seed, 3) & 1)


def _open(data: Any, formats, name: str):
    source = data if hasattr(data, "read") else io.BytesIO(data)
    try:
        image = Image.open(source, formats=formats)
    except PILLOW_ERRORS as exc:  # no format recognised, too large, or recognised and then its header did not parse
        raise ImageError(f"{name}: {pillow_error_message(exc, formats=formats)}") from None
    if min(image.size) < 1:
        raise ImageError(f"{name}: the {image.format} image has no pixels (its size is {image.size[0]}x{image.size[1]})")
    return image


def _load(image, name: str) -> None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image.load()
    except Image.DecompressionBombWarning:
        pass  # the warning threshold: decode anyway, as Pillow itself does
    except _DAMAGED as exc:
        raise ImageError(f"{name}: truncated or corrupt {image.format or ''} image: {_pillow_reason(exc)}".replace("  ", " ")) from None


def _to_8bit(image):
    """The image in a mode the kernel reads (L, LA, RGB, RGBA), with its ICC profile kept."""
    mode = image.mode
    if mode in ("L", "LA", "RGB", "RGBA"):
        return image
    profile = image.info.get("icc_profile")
    if mode in ("I;16", "I;16B", "I;16L", "I"):  # 16-bit gray: keep the top 8 bits, rounded
        values = np.asarray(image, dtype=np.float64)
        top = 65535.0 if mode != "I" or values.max(initial=0) > 255 else 255.0
        converted = _from_array(np.clip(np.rint(values * (255.0 / top)), 0, 255).astype(np.uint8))
    elif mode == "P" or mode == "PA":
        converted = image.convert("RGBA" if "transparency" in image.info or mode == "PA" else "RGB")
    elif mode == "CMYK" and profile:
        return image  # LittleCMS converts it with its profile
    elif mode == "1":
        converted = image.convert("L")
    elif mode == "F":
        converted = _from_array(np.clip(np.rint(np.asarray(image) * 255.0), 0, 255).astype(np.uint8))
    else:  # CMYK without a profile, YCbCr, LAB, HSV, RGBX, RGBa, La ...
        converted = image.convert("RGBA" if "A" in mode or "a" in mode else "RGB")
    if profile:
        converted.info["icc_profile"] = profile
    return converted


def _from_array(array: np.ndarray):
    return Image.fromarray(array)


def decode_into(
    data: Any,
    out: np.ndarray,
    *,
    layout: str = "hwc",
    size: int | None = None,
    crop: str = "center",
    flip: bool = False,
    seed: int | None = None,
    scale: tuple[float, float] | None = None,
    ratio: tuple[float, float] | None = None,
    space: str = "srgb",
    coefs=None,
    convert: tuple = (1, 0x2400),
    resample: int | None = None,
    formats: list[str] | tuple[str, ...] | None = None,
    bad_profile: str = "raise",
) -> None:
    """Decode ``data`` (bytes, a memoryview, or a binary file) into ``out``, colour-managed.

    :param out: the item's array in the batch: (H, W, C) or, with ``layout="chw"``, (C, H, W), C
        3 (RGB) or 4 (RGBA; alpha 255 where the image has none), dtype uint8, float16 or float32.
    :param size: the shorter side after resizing, in pixels (default None: the image is resized
        by the smallest scale at which it covers ``out``, so an image of ``out``'s size is copied
        pixel for pixel, and one of another shape keeps all of the side that fits and loses only
        what sticks out of the other). A ``size`` too small to cover ``out`` is raised to the
        covering scale: images are never stretched. See :func:`scale_for` and :func:`crop_box`.
    :param crop: ``"center"``, ``"random"`` (a position drawn from ``seed``, reproducibly), or
        ``"random_resized"``: an Inception-style random resized crop, the box of
        :func:`hydrax.image.random_resized_box` drawn from ``seed`` and resized to the whole of
        ``out`` (its aspect changes; ``size`` does not apply). See docs/images.rst.
    :param scale: with ``crop="random_resized"``, the range of the box's area as a fraction of
        the image's (default ``(0.08, 1.0)``).
    :param ratio: with ``crop="random_resized"``, the range of the box's aspect ratio, width /
        height (default ``(3/4, 4/3)``), drawn log-uniformly.
    :param flip: mirror left-right when ``seed`` says so (see :func:`flips`).
    :param seed: the loader's item seed; needed for a random crop (of either kind) or flip.
    :param space: ``"srgb"``, ``"linear"`` (linear-light sRGB) or ``"oklab"``.
    :param coefs: a :class:`hydrax.image.Coefs` applied to colour values on the 0-255 scale (and
        to alpha), as ``write_hwc`` does; without it float outputs are fractions (sRGB, linear)
        or Oklab L, a, b. Not for Oklab.
    :param convert: ``(intent, flags)``: :data:`hydrax.image.CONVERT_RELATIVE` (default) or
        :data:`hydrax.image.CONVERT_PERCEPTUAL`, for profiles LittleCMS handles; for matrix/TRC
        profiles both give the colorimetric result, as LittleCMS's do.
    :param resample: a Pillow resampling filter (default bilinear).
    :param formats: the formats Pillow may try (default: all).
    :param bad_profile: ``"raise"`` (default) raises :class:`hydrax.image.ProfileError` for a
        damaged embedded profile; ``"warn"`` warns and treats the image as sRGB.
    :raises ImageError: for data that is not a readable image, or too large (see
        :func:`hydrax.image.set_max_image_pixels`); the message starts with ``data``'s path, or ``bytes of length N``.
    """
    chw, channels, out_h, out_w, intent, flags = _check_arguments(out, layout, size, crop, flip, seed, space, coefs,
                                                                  convert, bad_profile)
    resized = _check_resized(crop, size, seed, scale, ratio)
    filter_ = Image.Resampling.BILINEAR if resample is None else resample
    # (anything else given as the filter goes to Pillow, which words the error)
    if (formats is None or "JPEG" in formats) and isinstance(filter_, int) and filter_ in FILTERS:
        header_and_view = _plain_jpeg(data)
        if header_and_view is not None and _jpeg_into(*header_and_view, out, chw=chw, size=size, crop=crop,
                                                      flip=flip and flips(seed), seed=seed, space=space, coefs=coefs,
                                                      kind=int(filter_), bad_profile=bad_profile, resized=resized):
            return
    image, box = _open_upright(data, formats, out_h, out_w, size, resized)
    if box is None:
        box = crop_box(image.width, image.height, out_h, out_w, size, crop, seed)
    profile = image.info.get("icc_profile")
    image = image.resize((out_w, out_h), filter_, box=box)
    if flip and flips(seed):
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    transform = transform_for(profile, image.mode, space, bad_profile=bad_profile)
    if transform.lcms:
        image = _littlecms(image, profile, intent, flags, bad_profile)
    _write(image, transform, out, chw, channels, coefs)


def _plain_jpeg(data: Any) -> tuple[jpeg.JpegHeader, memoryview] | None:
    """``data``'s JPEG header and its bytes, where ``data`` is bytes-like and a JPEG the fast
    path takes (see :func:`hydrax.image.jpeg.read_header`); else None."""
    if hasattr(data, "read"):
        return None
    try:
        view = memoryview(data)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
    except (TypeError, ValueError):
        return None
    header = jpeg.read_header(view, Image.MAX_IMAGE_PIXELS)
    return None if header is None else (header, view)


def _jpeg_into(header: jpeg.JpegHeader, view: memoryview, out: np.ndarray, *, chw: bool, size: int | None, crop: str,
               flip: bool, seed: int | None, space: str, coefs, kind: int, bad_profile: str,
               resized: tuple | None = None) -> bool:
    """The fast paths: decode (as planes where the file allows it, see the module's docstring),
    turn upright, resize, crop, mirror and convert into ``out``; False (nothing written) where
    they leave the image to Pillow's path. ``resized``: ``(seed, scale, ratio)`` of a random
    resized crop, else None."""
    out_h, out_w = (out.shape[1], out.shape[2]) if chw else (out.shape[0], out.shape[1])
    transposed = header.orientation in TRANSPOSED_ORIENTATIONS
    width, height = (header.height, header.width) if transposed else (header.width, header.height)
    region = None if resized is None else random_resized_box(width, height, *resized)
    draft = _draft_size(width, height, _draft_scale(width, height, out_h, out_w, size, region), transposed)
    factor = 1 if draft is None else jpeg.draft_factor(header, *draft)
    planes = pixels = None
    (luma_h, luma_v), (chroma_h, chroma_v) = header.sampling[:2] if header.components == 3 else ((1, 1), (1, 1))
    subsampling = (luma_h // chroma_h, luma_v // chroma_v)
    if region is not None and header.orientation == 1:
        pixels = _region_pixels(view, header, region, factor, out_h, out_w, kind)
    # planes where resizing makes the RGB rounding moot: a JPEG of the slot's own size is copied as libjpeg decodes it
    if pixels is None and draft is None and header.orientation == 1 and (header.width, header.height) != (out_w, out_h):
        # a random resized box needs the rows from its top down to its bottom only: libjpeg stops
        # below, and reads the rows above without transforming them
        stop, start = None, 0
        if region is not None and jpeg.planar(header):
            rows = (header.height, region[1], region[3], out_h, kind, subsampling[1], -(-header.height * chroma_v // luma_v))
            stop, start = plane_rows_read(*rows), plane_rows_first(*rows)
        planes = jpeg.decode_planes(view, header, stop, start)
    if planes is None and pixels is None:
        pixels = jpeg.decode(view, header, factor)
        if pixels is None:
            return False
    # the profile only now: damaged data with a damaged profile fails as damaged data, as on Pillow's path
    transform = transform_for(header.icc_profile, "L" if header.components == 1 else "RGB", space, bad_profile=bad_profile)
    if transform.lcms:
        return False
    channels = out.shape[0] if chw else out.shape[2]
    colour = None
    if not (transform.identity and coefs is None and out.dtype == np.uint8 and header.components == channels):
        colour = _colour_tables(transform, out.dtype, channels, coefs)
    target = _kernel_target(out)
    if planes is not None:
        box = region or crop_box(header.width, header.height, out_h, out_w, size, crop, seed)
        resize_planes_into(planes, subsampling, box, target, chw=chw, flip=flip, kind=kind, colour=colour)
    else:
        pixels = jpeg.upright(pixels, header.orientation)
        if region is None:
            box = crop_box(pixels.shape[1], pixels.shape[0], out_h, out_w, size, crop, seed)
        else:
            box = _scaled_box(region, factor, width, height, header.orientation)
        resize_into(pixels, box, target, chw=chw, flip=flip, kind=kind, colour=colour)
    if target is not out:
        out[...] = target
    return True


def _region_pixels(view: memoryview, header: jpeg.JpegHeader, region: tuple[int, int, int, int], factor: int,
                   out_h: int, out_w: int, kind: int) -> np.ndarray | None:
    """An upright JPEG decoded at 1/``factor`` with only the pixels that resizing the random
    resized crop's ``region`` reads (:func:`hydrax.image.jpeg.decode_region`); None where the
    plane path is quicker (see :data:`REGION_SHARE`) or the region decoder declines the file."""
    left, top, right, bottom = region
    if factor == 1 and (right - left) * (bottom - top) >= REGION_SHARE * header.width * bottom and jpeg.planar(header):
        return None
    scaled_w, scaled_h = -(-header.width // factor), -(-header.height // factor)
    read = pixels_read(scaled_w, scaled_h, _scaled_box(region, factor, header.width, header.height, 1), out_w, out_h,
                       kind)
    if not (read[0] < read[2] and read[1] < read[3]):  # (the taps always read a pixel; nothing to decode otherwise)
        return None
    return jpeg.decode_region(view, header, factor, read)


def _check_arguments(out: np.ndarray, layout: str, size: int | None, crop: str, flip: bool, seed: int | None, space: str,
                     coefs, convert: tuple, bad_profile: str) -> tuple[bool, int, int, int, int, int]:
    """Refuse :func:`decode_into`'s arguments before any decoding when they do not go together;
    else ``(chw, channels, out_h, out_w, intent, flags)``."""
    if layout not in _LAYOUTS:
        raise ValueError(f"layout must be 'hwc' or 'chw', got {layout!r}")
    if bad_profile not in ("raise", "warn"):
        raise ValueError(f"bad_profile must be 'raise' or 'warn', got {bad_profile!r}")
    intent, flags = intent_and_flags(convert)
    if crop not in _CROPS:
        raise ValueError(f"crop must be 'center', 'random' or 'random_resized', got {crop!r}")
    if size is not None and int(size) < 1:
        raise ValueError(f"size must be a positive number of pixels, got {size!r}")
    if (crop == "random" or flip) and seed is None:
        raise ValueError("a random crop or flip needs the item's seed (validation items have none: use crop='center', flip=False)")
    if not isinstance(out, np.ndarray) or out.ndim != 3:
        raise ValueError(f"out must be a 3-d numpy array, got {getattr(out, 'shape', type(out).__name__)}")
    chw = layout == "chw"
    channels, out_h, out_w = (out.shape if chw else (out.shape[2], out.shape[0], out.shape[1]))
    if channels not in (3, 4):
        raise ValueError(f"out must have 3 or 4 channels ({layout}), got shape {out.shape}")
    if out.dtype not in (np.uint8, np.float16, np.float32):
        raise TypeError(f"out must be uint8, float16 or float32, got {out.dtype}")
    if space == "oklab" and (out.dtype == np.uint8 or coefs is not None):
        raise ValueError("Oklab output must be float16 or float32, without coefs")
    return chw, channels, out_h, out_w, intent, flags


def _open_upright(data: Any, formats, out_h: int, out_w: int, size: int | None, resized: tuple | None = None):
    """``(image, box)``: ``data`` decoded, turned as its EXIF orientation says, in a mode the kernel
    reads (its ICC profile kept), and for a random resized crop (``resized``: its seed, scale and
    ratio) the box in that image, else None. A JPEG at least twice the size needed is scaled down
    in the DCT domain as it decodes."""
    name = _describe(data)
    image = _open(data, formats, name)
    orientation = _orientation(image)
    width, height = image.size
    if orientation in TRANSPOSED_ORIENTATIONS:
        width, height = height, width
    region = None if resized is None else random_resized_box(width, height, *resized)
    draft = _draft_size(width, height, _draft_scale(width, height, out_h, out_w, size, region), orientation in TRANSPOSED_ORIENTATIONS)
    factor, stored_width = 1, image.size[0]
    if image.format == "JPEG" and draft is not None:
        drafted = image.draft(image.mode, draft)
        if drafted is not None and drafted[1] is not None:  # Pillow's box: the stored size over its factor
            factor = max(1, round(stored_width / drafted[1][2]))
    _load(image, name)
    if orientation not in (None, 1):
        from PIL import ImageOps

        profile = image.info.get("icc_profile")
        try:
            image = ImageOps.exif_transpose(image)
        except _DAMAGED as exc:
            raise ImageError(f"{name}: its EXIF orientation {orientation!r} cannot be applied: {_pillow_reason(exc)}") from None
        if profile:
            image.info["icc_profile"] = profile
    box = None if region is None else _scaled_box(region, factor, width, height, orientation or 1)
    return _to_8bit(image), box


def _orientation(image) -> int | None:
    try:
        return image.getexif().get(_ORIENTATION_TAG)
    except Exception:  # a damaged EXIF block is not worth losing the image for
        return None


def _littlecms(image, profile: bytes, intent: int, flags: int, bad_profile: str):
    """``image`` converted to sRGB by LittleCMS (gray, CMYK and lookup-table profiles)."""
    mode = "RGBA" if image.mode in ("LA", "RGBA", "PA") else "RGB"
    try:
        return convert_to_srgb(image, bytes(profile), mode, intent, flags)
    except ProfileError as exc:
        if bad_profile != "warn":
            raise
        warnings.warn(f"ignoring an unusable ICC profile ({exc}); treating the image as sRGB", RuntimeWarning, stacklevel=3)
        return image.convert(mode)


def _write(image, transform: PixelTransform, out: np.ndarray, chw: bool, channels: int, coefs) -> None:
    pixels = np.asarray(image)
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    if (transform.identity and coefs is None and out.dtype == np.uint8 and not chw
            and pixels.shape[2] == channels):
        np.copyto(out, pixels)  # an sRGB image into an sRGB slot: the decoded pixels are the result
        return
    target = _kernel_target(out)
    _core.convert_pixels(np.ascontiguousarray(pixels), target, chw, *_colour_tables(transform, out.dtype, channels, coefs))
    if target is not out:
        out[...] = target


def _check_resized(crop: str, size: int | None, seed: int | None, scale, ratio) -> tuple | None:
    """``(seed, scale, ratio)`` for a random resized crop (defaults filled in, each range checked),
    None for another crop; ValueError for ``scale`` or ``ratio`` given without one."""
    if crop != "random_resized":
        for name, value in (("scale", scale), ("ratio", ratio)):
            if value is not None:
                raise ValueError(f"{name} is for crop='random_resized' only, got {name}={value!r} with crop={crop!r}")
        return None
    if seed is None:
        raise ValueError("crop='random_resized' needs the item's seed (validation items have none: use crop='center')")
    if size is not None:
        raise ValueError(f"size does not apply to crop='random_resized' (its box is resized to the whole slot), got size={size!r}")
    scale = DEFAULT_SCALE if scale is None else check_range("scale", scale)
    ratio = DEFAULT_RATIO if ratio is None else check_range("ratio", ratio)
    return seed, scale, ratio


def _draft_scale(width: int, height: int, out_h: int, out_w: int, size: int | None, region) -> float:
    """The factor the image is resized by: :func:`scale_for`'s, or for a random resized crop's
    ``region`` the larger of the box's two (so DCT scaling keeps the box at least the slot's size)."""
    if region is None:
        return scale_for(width, height, out_h, out_w, size)
    left, top, right, bottom = region
    return max(out_w / (right - left), out_h / (bottom - top))


def _scaled_box(region, factor: int, width: int, height: int, orientation: int) -> tuple[float, float, float, float]:
    """``region`` of the upright ``width`` x ``height`` image in the image decoded at 1/``factor``
    (each stored side rounded up, as libjpeg-turbo does) and then turned upright: a mirrored
    axis is measured from its far edge, where the rounding left a fraction of a pixel."""
    left, top, right, bottom = region
    if factor == 1:
        return float(left), float(top), float(right), float(bottom)
    scaled_w, scaled_h = -(-width // factor), -(-height // factor)
    if orientation in (2, 3, 6, 7):  # upright columns run the other way from stored ones
        left, right = width - right, width - left
        left, right = scaled_w - right / factor, scaled_w - left / factor
    else:
        left, right = left / factor, right / factor
    if orientation in (3, 4, 7, 8):
        top, bottom = height - bottom, height - top
        top, bottom = scaled_h - bottom / factor, scaled_h - top / factor
    else:
        top, bottom = top / factor, bottom / factor
    return left, top, right, bottom


def _draft_size(width: int, height: int, scale: float, transposed: bool) -> tuple[int, int] | None:
    """The size (as stored) a JPEG that is ``width`` x ``height`` upright is asked to decode at,
    for a resize by ``scale``; None where the scale is over a half (no DCT scaling). Both paths
    ask the same, so they decode the same pixels."""
    if scale > 0.5:
        return None
    wanted = (int(width * scale) + 1, int(height * scale) + 1)
    return wanted[::-1] if transposed else wanted


def _kernel_target(out: np.ndarray) -> np.ndarray:
    """Where the kernels write for ``out``: ``out`` itself, or, for float16 or a slot that is not
    C-contiguous (a view), an array of the kernels' dtype that is copied into ``out`` after."""
    if out.flags.c_contiguous and out.dtype != np.float16:
        return out
    return np.empty(out.shape, np.uint8 if out.dtype == np.uint8 else np.float32)


def _colour_tables(transform: PixelTransform, dtype: np.dtype, channels: int, coefs) -> tuple:
    """The kernels' colour arguments, ``lin`` to ``offset``, for ``transform`` into ``dtype``."""
    scale, offset = _affine(dtype, channels, coefs)
    return (transform.lin, transform.matrix, transform.encode, transform.curve, transform.byte_curve, transform.second,
            scale, offset)


def _affine(dtype: np.dtype, channels: int, coefs) -> tuple[np.ndarray, np.ndarray]:
    if coefs is None:
        full = 255.0 if dtype == np.uint8 else 1.0
        return np.full(4, full, np.float32), np.zeros(4, np.float32)
    scale, offset = coefs.affine(channels)
    # the kernel's values are fractions; Coefs act on the 0-255 scale
    return (np.asarray(scale, np.float64) * 255.0).astype(np.float32), np.asarray(offset, np.float32)


__all__ = ["PILLOW_ERRORS", "ImageError", "ProfileError", "crop_box", "decode_into", "flips", "pillow_error_message",
           "random_resized_box", "scale_for"]

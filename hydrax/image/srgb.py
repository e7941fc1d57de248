"""Open images with Pillow and bring them into the sRGB colour space.

:func:`open_srgb` converts an image with an embedded ICC profile to sRGB with LittleCMS (through
``PIL.ImageCms``), and takes an image without one to be sRGB already. The colour transforms are
cached, so a data set whose images share a profile builds it once per process.
"""

from __future__ import annotations

import functools
import io
import operator
import os
import warnings
from typing import IO, Literal

from PIL import Image, ImageCms

from .icc import ProfileError

CONVERT_PERCEPTUAL = (ImageCms.Intent.PERCEPTUAL, 0x0400)
"""Perceptual conversion (``Intent.PERCEPTUAL``) with the ``HIGHRESPRECALC`` flag (``0x0400``)."""

CONVERT_RELATIVE = (ImageCms.Intent.RELATIVE_COLORIMETRIC, 0x2400)
"""Relative colorimetric conversion (``Intent.RELATIVE_COLORIMETRIC``) with the ``HIGHRESPRECALC``
and ``BLACKPOINTCOMPENSATION`` flags (``0x2400``); the default of :func:`open_srgb`."""

_BLACK_POINT_COMPENSATION = 0x2000
# The range Pillow accepts. Older Pillow releases have no Flags enum; their own check then applies.
_ALL_FLAGS = functools.reduce(operator.or_, getattr(ImageCms, "Flags", ()), 0) or None

# Distinct (profile, modes, intent) combinations in one data set are few; this bounds the memory
# held by the cache when they are not.
_TRANSFORM_CACHE_SIZE = 16

# The output modes LittleCMS can write for an RGB (sRGB) output profile. Other requested modes
# are reached from one of these with Image.convert.
_CMS_OUTPUT_MODES = frozenset({"RGB", "RGBA", "RGBX"})
_ALPHA_MODES = frozenset({"RGBA", "RGBa", "LA", "La", "PA"})


def set_max_image_pixels(threshold: int | None) -> None:
    """Set Pillow's decompression-bomb limit for every image opened afterwards in this process.

    Opening an image with more than ``threshold`` pixels raises
    ``PIL.Image.DecompressionBombError``, and one with more than half that many warns with
    ``PIL.Image.DecompressionBombWarning``. This sets the global ``PIL.Image.MAX_IMAGE_PIXELS``
    to ``(threshold + 1) // 2`` (Pillow errors at twice that value).

    :param threshold: the pixel count that is an error, or None to turn the check off.
    """
    Image.MAX_IMAGE_PIXELS = None if threshold is None else (threshold + 1) // 2


@functools.cache
def srgb_profile() -> ImageCms.ImageCmsProfile:
    """LittleCMS's built-in sRGB profile, the output of every conversion here; built once per process."""
    return ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB"))


def _describe(profile: ImageCms.ImageCmsProfile) -> str:
    try:
        core = profile.profile
        return f"{core.profile_description.strip() or 'unnamed'!r} for {core.xcolor_space.strip()} data"
    except Exception:  # noqa: BLE001 - only used to word an error message
        return "unnamed"


@functools.lru_cache(maxsize=_TRANSFORM_CACHE_SIZE)
def read_embedded_profile(icc: bytes) -> ImageCms.ImageCmsProfile:
    """The profile whose ICC data an image embeds, as LittleCMS reads it (cached per distinct ``icc``).

    :raises ProfileError: if LittleCMS cannot read it.
    """
    try:
        return ImageCms.ImageCmsProfile(io.BytesIO(icc))
    except (OSError, ImageCms.PyCMSError) as exc:
        raise ProfileError(f"the embedded ICC profile ({len(icc)} bytes) cannot be read: {exc}") from exc


def _resolve_intent(profile: ImageCms.ImageCmsProfile, intent: int, flags: int) -> tuple[int, int]:
    """The intent and flags to use with ``profile`` as the input profile.

    An intent the profile does not support gives way to its default intent, and black-point
    compensation is dropped unless that default is relative colorimetric.
    """
    # isIntentSupported returns 1 or -1 (both truthy), so compare with 1.
    if ImageCms.isIntentSupported(profile, intent, ImageCms.Direction.INPUT) == 1:
        return intent, flags
    intent = ImageCms.getDefaultIntent(profile)
    if intent != ImageCms.Intent.RELATIVE_COLORIMETRIC:
        flags &= ~_BLACK_POINT_COMPENSATION
    return intent, flags


@functools.lru_cache(maxsize=_TRANSFORM_CACHE_SIZE)
def _to_srgb_transform(icc: bytes, mode_in: str, mode_out: str, intent: int, flags: int) -> ImageCms.ImageCmsTransform:
    profile = read_embedded_profile(icc)
    intent, flags = _resolve_intent(profile, intent, flags)
    try:
        return ImageCms.buildTransform(profile, srgb_profile(), mode_in, mode_out, intent, flags)
    except ImageCms.PyCMSError as exc:
        # The output side is always a supported RGB mode and the intent and flags were checked,
        # so the embedded profile is what does not fit: malformed, or for other data.
        raise ProfileError(
            f"the embedded ICC profile ({_describe(profile)}) cannot convert a mode {mode_in!r} image to sRGB: {exc}"
        ) from exc


def intent_and_flags(convert: tuple[ImageCms.Intent, int]) -> tuple[int, int]:
    """The rendering intent and LittleCMS flags of ``convert`` (such as :data:`CONVERT_RELATIVE`), as ints.

    :raises ValueError: if the intent is not a ``PIL.ImageCms.Intent`` or the flags are not LittleCMS flags.
    :raises TypeError: if the flags are not an integer.
    """
    intent, flags = convert
    intent = ImageCms.Intent(intent)
    flags = operator.index(flags)
    if flags < 0 or (_ALL_FLAGS is not None and flags > _ALL_FLAGS):
        raise ValueError(f"conversion flags {flags:#x} are not valid LittleCMS flags")
    return int(intent), flags


def _cms_input(img: Image.Image, profile: ImageCms.ImageCmsProfile) -> tuple[Image.Image, Image.Image | None]:
    """The image LittleCMS should transform, and the alpha band taken off it (or None)."""
    # Palette entries are colours in the profile's space: expand them so LittleCMS sees pixels.
    if img.mode in ("P", "PA"):
        alpha = img.mode == "PA" or "transparency" in img.info
        grey = profile.profile.xcolor_space.strip() == "GRAY"
        img = img.convert(("LA" if alpha else "L") if grey else ("RGBA" if alpha else "RGB"))
    # Pillow hands grey+alpha pixels to LittleCMS in a layout it misreads (and the alpha band
    # is not carried over), so the grey band is transformed alone and the alpha put back after.
    if img.mode in ("LA", "La"):
        return img.convert("L"), img.getchannel("A")
    return img, None


def _cms_output_mode(source_mode: str, mode: str) -> str:
    if mode in _CMS_OUTPUT_MODES:
        # LittleCMS leaves alpha at 0 when the source has none; go through RGB and let
        # Image.convert make it opaque.
        if mode == "RGBA" and source_mode not in _ALPHA_MODES:
            return "RGB"
        return mode
    return "RGBA" if mode in _ALPHA_MODES and source_mode in _ALPHA_MODES else "RGB"


def convert_to_srgb(img: Image.Image, icc: bytes, mode: str, intent: int, flags: int) -> Image.Image:
    """``img``, whose pixels are in the ICC profile ``icc``, converted by LittleCMS to sRGB in mode ``mode``.

    The transform is cached. ``intent`` and ``flags`` are as :func:`intent_and_flags` returns them;
    an intent the profile does not support gives way to its default (see :func:`open_srgb`).

    :raises ProfileError: if the profile is malformed or does not fit the image.
    """
    source, alpha = _cms_input(img, read_embedded_profile(icc))
    cms_mode = _cms_output_mode(source.mode, mode)
    transform = _to_srgb_transform(icc, source.mode, cms_mode, intent, flags)
    if source.mode == cms_mode:
        transform.apply_in_place(source)
        result = source
    else:
        result = transform.apply(source)
    if alpha is not None and mode in _ALPHA_MODES:
        result = result.convert("RGBA")
        result.putalpha(alpha)
    return _to_mode(result, mode)


def _to_mode(img: Image.Image, mode: str) -> Image.Image:
    if img.mode == mode:
        return img
    try:
        return img.convert(mode)
    except ValueError:
        # Pillow lacks a few direct conversions (L to RGBa, for one); RGBA bridges them.
        if img.mode == "RGBA" or mode not in _ALPHA_MODES:
            raise
        return img.convert("RGBA").convert(mode)


def open_srgb(
    fp: str | bytes | os.PathLike | IO[bytes],
    *,
    mode: str = "RGB",
    convert: tuple[ImageCms.Intent, int] = CONVERT_RELATIVE,
    formats: list[str] | tuple[str, ...] | None = None,
    bad_profile: Literal["raise", "warn"] = "raise",
) -> Image.Image:
    """Open an image with Pillow and return it in the sRGB colour space, in mode ``mode``.

    If the image embeds an ICC profile, its pixels are converted from that profile to sRGB. When
    the image is already in mode ``mode`` the conversion happens in place on the opened image;
    otherwise a new image is returned (Pillow then keeps only the new ``icc_profile`` in
    ``info``). An image without a profile is taken to be sRGB and only converted to ``mode`` if
    needed (an opened image already in ``mode`` is returned as it is, not yet loaded).

    If the profile does not support the requested intent as an input profile, its default
    intent is used instead, without black-point compensation unless that default is relative
    colorimetric.

    Any mode Pillow can reach from RGB(A) can be requested, with or without a profile, and
    palette and greyscale(+alpha) images with profiles work too; an alpha channel is kept, and
    is opaque when the file has none. (hydrax 0.2.2 failed with a profile for modes other than
    RGB, RGBA and RGBX, and for palette images, and gave greyscale images zero alpha.)

    After opening, :func:`~hydrax.image.write_hwc` or :func:`~hydrax.image.write_chw` writes
    the image into a loader array.

    :param fp: a path or a binary file object, as for ``PIL.Image.open``.
    :param mode: the mode to return, such as ``"RGB"`` (the default), ``"RGBA"`` or ``"RGBa"``.
    :param convert: the rendering intent and LittleCMS flags for the conversion to sRGB:
        :data:`CONVERT_RELATIVE` (the default) or :data:`CONVERT_PERCEPTUAL`, or any
        ``(PIL.ImageCms.Intent, int)`` pair.
    :param formats: the formats to try, as for ``PIL.Image.open``; None tries all.
    :param bad_profile: what to do when the embedded profile cannot be used (see
        :class:`ProfileError`): ``"raise"`` (the default) raises ProfileError; ``"warn"`` warns
        and treats the image as sRGB, dropping the profile from ``info``.
    :raises ProfileError: if the embedded profile is malformed or does not fit the image.
    :raises PIL.UnidentifiedImageError: if Pillow cannot read the file.
    :raises ValueError: if ``convert`` or ``bad_profile`` is not valid.

    .. seealso:: :func:`set_max_image_pixels`, which limits the image size Pillow accepts.
    """
    if bad_profile not in ("raise", "warn"):
        raise ValueError(f"bad_profile must be 'raise' or 'warn', not {bad_profile!r}")
    intent, flags = intent_and_flags(convert)
    img = Image.open(fp, formats=formats)
    icc = img.info.get("icc_profile")
    if icc:
        try:
            return convert_to_srgb(img, bytes(icc), mode, intent, flags)
        except ProfileError as exc:
            if bad_profile == "raise":
                raise
            name = getattr(img, "filename", "") or "image"
            warnings.warn(f"{name}: {exc}; treating it as sRGB", UserWarning, stacklevel=2)
            del img.info["icc_profile"]
    return _to_mode(img, mode)

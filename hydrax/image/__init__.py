"""Image helpers for loader functions: colour-managed opening with `Pillow <https://python-pillow.org/>`_,
writing pixels into loader arrays, and colour-space conversions.

A typical loader function::

    from hydrax.image import Coefs, open_srgb, write_hwc

    def load(path, arrays, seed):
        write_hwc(open_srgb(path), arrays["image"], Coefs.IMAGENET_SRGB)

- :func:`image_size` reads an encoded image's upright width and height from its header, without
  decoding it; :func:`image_sizes` does so for many, with a status per image (see
  :mod:`hydrax.image.sizes`).
- :func:`plan_buckets` assigns images to aspect-ratio buckets from their sizes, and
  :func:`hydrax.bucket_groups` makes a DataGroup of each (see :mod:`hydrax.image.buckets`).
- :func:`open_srgb` opens an image and converts it to sRGB using its embedded ICC profile.
- :func:`write_hwc` / :func:`write_chw` copy it into a loader array and map ``[0, 255]`` to the
  model's representation with a :class:`Coefs`; :func:`from_srgb_hwc` goes back to a PIL image.
- The ``convert_*`` functions change float arrays in place between fractional sRGB, Oklab and a
  balanced ``[-scale, scale]`` range.

This module needs Pillow (``pip install 'hydrax[image]'``); ``import hydrax`` does not.
"""

from __future__ import annotations

try:
    import PIL.Image as _pil_image
    import PIL.ImageCms as _pil_imagecms
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "hydrax.image needs the Pillow package, built with LittleCMS: pip install 'hydrax[image]'"
    ) from _exc

del _pil_image, _pil_imagecms

from .coefs import Coefs, from_srgb_hwc, write_chw, write_hwc
from .oklab import (
    M1,
    M1_INV,
    M2,
    M2_INV,
    convert_balanced_to_frac_chw,
    convert_balanced_to_frac_hwc,
    convert_frac_to_balanced_chw,
    convert_frac_to_balanced_hwc,
    convert_oklab_to_srgb_frac_chw,
    convert_oklab_to_srgb_frac_hwc,
    convert_srgb_to_oklab_frac_chw,
    convert_srgb_to_oklab_frac_hwc,
    linear_srgb_to_oklab,
    oklab_to_linear_srgb,
    srgb_eotf,
    srgb_oetf,
)
from .boxes import random_resized_box
from .buckets import Bucket, BucketPlan, bucket_resolutions, plan_buckets
from .decode import ImageError, decode_into
from .icc import ProfileError
from .sizes import ImageHeader, ImageSizes, SizeStatus, image_header, image_size, image_sizes, image_sizes_in
from .srgb import CONVERT_PERCEPTUAL, CONVERT_RELATIVE, open_srgb, set_max_image_pixels

# hydrax 0.2.2's public names, plus decode_into and its errors, the random resized crop's box,
# the image sizes, the Oklab matrices and the reference functions.
__all__ = [
    "ImageError",
    "decode_into",
    "random_resized_box",
    "Bucket",
    "BucketPlan",
    "bucket_resolutions",
    "plan_buckets",
    "ImageHeader",
    "ImageSizes",
    "SizeStatus",
    "image_header",
    "image_size",
    "image_sizes",
    "image_sizes_in",
    "CONVERT_PERCEPTUAL",
    "CONVERT_RELATIVE",
    "M1",
    "M1_INV",
    "M2",
    "M2_INV",
    "Coefs",
    "ProfileError",
    "convert_balanced_to_frac_chw",
    "convert_balanced_to_frac_hwc",
    "convert_frac_to_balanced_chw",
    "convert_frac_to_balanced_hwc",
    "convert_oklab_to_srgb_frac_chw",
    "convert_oklab_to_srgb_frac_hwc",
    "convert_srgb_to_oklab_frac_chw",
    "convert_srgb_to_oklab_frac_hwc",
    "from_srgb_hwc",
    "linear_srgb_to_oklab",
    "oklab_to_linear_srgb",
    "open_srgb",
    "set_max_image_pixels",
    "srgb_eotf",
    "srgb_oetf",
    "write_chw",
    "write_hwc",
]

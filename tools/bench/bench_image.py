"""Benchmark: colour-managed decoding into a batch slot, against the plain decode and Pillow's ImageCms.

    python tools/bench/bench_image.py [--images 64] [--repeat 5] [--width 500 --height 375] [--out 224]

Generates ``--images`` photo-like JPEGs (q90) three times: without a profile, with the sRGB
profile embedded and with Adobe RGB (1998) embedded (profiles from ../shared/testdata/icc). Each
is decoded into a ``--out`` square uint8 HWC slot (shorter side resized to ``out * 8 / 7``, centre
crop) by:

- ``hydrax.image.decode_into`` (plain, sRGB, Adobe RGB; and float32 CHW with ImageNet coefs);
- Pillow with ImageCms and a transform built once and reused (decode, convert the decoded image,
  resize into the slot): the usual way to colour-manage with Pillow;
- Pillow with the transform rebuilt for every image (``ImageCms.profileToProfile``), as hydrax
  0.2.2's ``open_srgb`` does.

Runs are interleaved; each figure is the median over ``--repeat`` passes of ms per image, and the
ratio is to the plain decode of the same run.
"""

from __future__ import annotations

import argparse
import io
import statistics
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageCms

from hydrax.image import Coefs, decode_into
from hydrax.image.decode import crop_box

ICC = Path(__file__).resolve().parents[2] / "tests" / "data" / "icc"


def photos(count: int, width: int, height: int, profile: bytes | None) -> list[bytes]:
    rng = np.random.default_rng(0)
    out = []
    for _ in range(count):
        coarse = rng.integers(0, 256, (height // 24, width // 24, 3), dtype=np.uint8)
        image = Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC)
        noisy = np.clip(np.asarray(image, np.int16) + rng.integers(-12, 13, (height, width, 3)), 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        params = {"icc_profile": profile} if profile else {}
        Image.fromarray(noisy).save(buffer, "JPEG", quality=90, **params)
        out.append(buffer.getvalue())
    return out


def pillow_into(data: bytes, out: np.ndarray, size: int, transform_for) -> None:
    """Decode with Pillow (DCT scaling as decode_into does), colour-convert, resize into the slot."""
    image = Image.open(io.BytesIO(data))
    scale = size / min(image.size)
    if scale <= 0.5:
        image.draft("RGB", (int(image.width * scale) + 1, int(image.height * scale) + 1))
    image.load()
    image = transform_for(image)
    box = crop_box(image.width, image.height, out.shape[0], out.shape[1], size, "center", None)
    out[...] = np.asarray(image.resize((out.shape[1], out.shape[0]), Image.Resampling.BILINEAR, box=box))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--width", type=int, default=500)
    parser.add_argument("--height", type=int, default=375)
    parser.add_argument("--out", type=int, default=224)
    args = parser.parse_args()
    size = args.out * 8 // 7
    srgb_icc, adobe_icc = (ICC / "sRGB.icc").read_bytes(), (ICC / "AdobeRGB1998.icc").read_bytes()
    plain, srgb, adobe = (photos(args.images, args.width, args.height, p) for p in (None, srgb_icc, adobe_icc))
    slot = np.empty((args.out, args.out, 3), np.uint8)
    chw = np.empty((3, args.out, args.out), np.float32)
    srgb_profile = ImageCms.createProfile("sRGB")
    cached = ImageCms.buildTransform(ImageCms.ImageCmsProfile(io.BytesIO(adobe_icc)), srgb_profile, "RGB", "RGB",
                                     ImageCms.Intent.RELATIVE_COLORIMETRIC, 0x2400)

    def rebuilt(image):
        profile = ImageCms.ImageCmsProfile(io.BytesIO(image.info["icc_profile"]))
        return ImageCms.profileToProfile(image, profile, srgb_profile, renderingIntent=ImageCms.Intent.RELATIVE_COLORIMETRIC,
                                         outputMode="RGB", flags=0x2400)

    runs = {
        "hydrax decode_into, no profile (plain)": lambda d: decode_into(d, slot, size=size),
        "hydrax decode_into, sRGB profile": lambda d: decode_into(d, slot, size=size),
        "hydrax decode_into, Adobe RGB profile": lambda d: decode_into(d, slot, size=size),
        "Pillow, no profile": lambda d: pillow_into(d, slot, size, lambda image: image),
        "Pillow + ImageCms cached, Adobe RGB": lambda d: pillow_into(d, slot, size, lambda image: ImageCms.applyTransform(image, cached)),
        "Pillow + ImageCms rebuilt, Adobe RGB": lambda d: pillow_into(d, slot, size, rebuilt),
        "hydrax, float32 CHW ImageNet, no profile": lambda d: decode_into(d, chw, size=size, layout="chw", coefs=Coefs.IMAGENET_SRGB),
        "hydrax, float32 CHW ImageNet, Adobe RGB": lambda d: decode_into(d, chw, size=size, layout="chw", coefs=Coefs.IMAGENET_SRGB),
    }
    inputs = {name: (adobe if "Adobe" in name else srgb if "sRGB profile" in name else plain) for name in runs}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for name, run in runs.items():  # warm: caches, transforms
        run(inputs[name][0])
    for _ in range(args.repeat):
        for name, run in runs.items():
            started = time.perf_counter()
            for data in inputs[name]:
                run(data)
            times[name].append((time.perf_counter() - started) / len(inputs[name]) * 1e3)
    base = statistics.median(times["hydrax decode_into, no profile (plain)"])
    pillow_base = statistics.median(times["Pillow, no profile"])
    print(f"{args.images} JPEGs {args.width}x{args.height} q90 into a {args.out}x{args.out} slot; medians of {args.repeat} interleaved passes")
    print(f"{'path':44} {'ms/image':>9} {'images/s':>9} {'vs plain':>9}")
    for name, runs_ms in times.items():
        ms = statistics.median(runs_ms)
        reference = pillow_base if name.startswith("Pillow") else base
        print(f"{name:44} {ms:9.3f} {1e3 / ms:9,.0f} {ms / reference:8.2f}x")
    print("(Pillow rows are relative to 'Pillow, no profile'; hydrax rows to hydrax's plain decode)")


if __name__ == "__main__":
    main()

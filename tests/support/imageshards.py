"""Shards of real images of every format the header scan reads, with Pillow's sizes to check against."""

from __future__ import annotations

import io

import numpy as np

#: What each sample's ``img`` field holds, by key: (format, stored width, stored height, extra save options).
KINDS = (
    ("JPEG", 37, 23, {}),
    ("JPEG", 40, 30, {"exif": 6}),  # EXIF orientation 6: a quarter turn, upright 30 x 40
    ("PNG", 17, 9, {}),
    ("WEBP", 33, 21, {}),
    ("WEBP", 12, 34, {"lossless": True}),
    ("GIF", 25, 14, {}),
    ("JPEG", 640, 480, {"exif": 8}),
)


def encode(kind: str, width: int, height: int, options: dict, seed: int = 0) -> bytes:
    """An image of ``kind`` (a Pillow format name) and that stored size."""
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), np.uint8)
    options = dict(options)
    if "exif" in options:
        exif = Image.Exif()
        exif[0x0112] = options["exif"]
        options["exif"] = exif
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, kind, **options)
    return buffer.getvalue()


def pillow_size(data: bytes) -> tuple[int, int]:
    """The upright size Pillow gives (EXIF orientation applied), or (0, 0) for what it cannot open."""
    from PIL import Image, ImageOps

    try:
        with Image.open(io.BytesIO(data)) as image:
            return ImageOps.exif_transpose(image).size
    except Exception:  # noqa: BLE001  (Pillow raises several kinds for data that is not an image)
        return 0, 0


def image_samples(count: int, field: str = "img") -> list[dict]:
    """``count`` samples cycling through :data:`KINDS`, then a sample without ``field``, one whose
    ``field`` is not an image and one whose JPEG is cut before its frame header, in turn."""
    samples = []
    for i in range(count):
        sample = {"__key__": f"k{i:04d}", "cls": str(i % 3)}
        turn = i % (len(KINDS) + 3)
        if turn < len(KINDS):
            kind, width, height, options = KINDS[turn]
            sample[field] = encode(kind, width + i % 5, height, options, i)
        elif turn == len(KINDS) + 1:
            sample[field] = b"not an image at all"
        elif turn == len(KINDS) + 2:
            sample[field] = encode("JPEG", 20, 20, {}, i)[:12]
        samples.append(sample)
    return samples


def write_image_shards(folder, count: int = 25, per_shard: int = 10, field: str = "img", **writer_options) -> tuple[list[str], list[dict]]:
    """Shards of :func:`image_samples` under ``folder``; returns their paths and the samples."""
    from hydrax.shards import ShardWriter

    samples = image_samples(count, field)
    with ShardWriter(str(folder / "s-%03d.tar"), maxcount=per_shard, **writer_options) as writer:
        for sample in samples:
            writer.write(sample)
    return writer.paths, samples


def expected_sizes(samples: list[dict], field: str = "img") -> tuple[list[int], list[int]]:
    """Pillow's widths and heights of ``samples``' ``field`` (0 x 0 where there is none)."""
    sizes = [pillow_size(s[field]) if field in s else (0, 0) for s in samples]
    return [w for w, _ in sizes], [h for _, h in sizes]

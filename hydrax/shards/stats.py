"""Statistics over the samples of a dataset: field sizes, image sizes, per-channel pixel mean and
standard deviation, and a label histogram.

:class:`DatasetStats` takes samples one at a time (any mapping of field names to bytes, such as a
:class:`~hydrax.shards.SampleRef`) and keeps only what the summary needs: per-field size lists,
image widths and heights, and per channel the count, sum and sum of squares of the 8-bit values.
Those sums are exact integers, so the mean and standard deviation carry no accumulated rounding
and statistics of parts of a dataset could be added together. The summaries are computed with
numpy at the end. Pixels are the decoded image in sRGB (an embedded ICC profile applied, as the
loader's :func:`hydrax.image.open_srgb` does), as RGB, scaled to [0, 1]; the standard deviation is
the population one, over all pixels of all images (so large images weigh more).
"""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .tarindex import is_image_field

#: The fields a label is read from by default, in order of preference.
LABEL_FIELDS = ("cls", "label")


@dataclass(frozen=True)
class SizeSummary:
    """count, total, min, mean and max of a set of sizes (bytes or pixels)."""

    count: int
    total: int
    min: int
    mean: float
    max: int

    def to_json(self) -> dict:
        """The summary as JSON-ready data."""
        return asdict(self)


def summarize_sizes(sizes: Iterable[int]) -> SizeSummary:
    """The :class:`SizeSummary` of ``sizes`` (all zero when there are none)."""
    values = np.asarray(list(sizes) if not isinstance(sizes, np.ndarray) else sizes, np.int64)
    if values.size == 0:
        return SizeSummary(0, 0, 0, 0.0, 0)
    return SizeSummary(int(values.size), int(values.sum()), int(values.min()), float(values.mean()), int(values.max()))


def open_rgb(data: Any, *, orient: bool = False):
    """Decode the image ``data`` (bytes-like) to an RGB PIL image in sRGB, loaded.

    :param orient: turn it upright as its EXIF orientation says (for display).
    :raises hydrax.image.ImageError: for data that is not a readable image, or whose embedded
        ICC profile cannot be used.
    """
    from PIL import ImageOps

    from ..image import ImageError, ProfileError, open_srgb
    from ..image.decode import PILLOW_ERRORS, pillow_error_message

    try:
        image = open_srgb(io.BytesIO(bytes(data)), mode="RGB")
        image.load()
        if orient:
            image = ImageOps.exif_transpose(image).convert("RGB")
    except ProfileError as exc:  # a ValueError, which PILLOW_ERRORS holds: first
        raise ImageError(f"its ICC profile cannot be used: {exc}") from None
    except PILLOW_ERRORS as exc:
        raise ImageError(pillow_error_message(exc, unidentified_reason=False)) from None
    return image


def image_size(data: Any) -> tuple[int, int]:
    """(width, height) of the image ``data`` from its header, without decoding the pixels.

    :raises hydrax.image.ImageError: for data that is not an image Pillow can read.
    """
    from PIL import Image

    from ..image import ImageError
    from ..image.decode import PILLOW_ERRORS, pillow_error_message

    try:
        with Image.open(io.BytesIO(bytes(data))) as image:
            return image.size
    except PILLOW_ERRORS as exc:
        raise ImageError(pillow_error_message(exc, damaged="unreadable image header", unidentified_reason=False)) from None


class ChannelMoments:
    """Per-channel mean and standard deviation of 8-bit pixels, from exact integer sums."""

    # Squares of every 8-bit value: indexing with the pixels squares them in 2 bytes per value.
    _SQUARES = (np.arange(256, dtype=np.uint32) ** 2).astype(np.uint16)

    def __init__(self, channels: int = 3) -> None:
        self.channels = channels
        self.count = 0
        self._sum = np.zeros(channels, np.uint64)
        self._squares = np.zeros(channels, np.uint64)

    def add(self, pixels: np.ndarray) -> None:
        """Count the (H, W, C) uint8 array ``pixels``."""
        if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != self.channels:
            raise ValueError(f"pixels must be (H, W, {self.channels}) uint8, got {pixels.shape} {pixels.dtype}")
        flat = pixels.reshape(-1, self.channels)
        self.count += flat.shape[0]
        self._sum += flat.sum(axis=0, dtype=np.uint64)
        self._squares += self._SQUARES[flat].sum(axis=0, dtype=np.uint64)

    def mean(self) -> np.ndarray:
        """The mean of each channel, on the [0, 1] scale (NaN before any pixel)."""
        if not self.count:
            return np.full(self.channels, np.nan)
        return np.array([int(s) / self.count / 255.0 for s in self._sum])

    def std(self) -> np.ndarray:
        """The population standard deviation of each channel, on the [0, 1] scale."""
        if not self.count:
            return np.full(self.channels, np.nan)
        n = self.count
        # N * sum(x^2) - sum(x)^2 in Python integers: exact, so no cancellation for flat images
        spread = [n * int(q) - int(s) ** 2 for s, q in zip(self._sum, self._squares)]
        return np.sqrt(np.array(spread, np.float64)) / n / 255.0


class ImageStats:
    """Sizes (and optionally pixel moments) of the images of one field."""

    def __init__(self, pixels: bool = True) -> None:
        self.widths: list[int] = []
        self.heights: list[int] = []
        self.failed = 0
        self.moments = ChannelMoments(3) if pixels else None

    def add(self, data: Any) -> None:
        """Count the encoded image ``data``; raises :class:`hydrax.image.ImageError` if it is not one."""
        try:
            if self.moments is None:
                width, height = image_size(data)
            else:
                image = open_rgb(data)
                width, height = image.size
                self.moments.add(np.asarray(image))
        except Exception:
            self.failed += 1
            raise
        self.widths.append(width)
        self.heights.append(height)

    def to_json(self, top: int = 10) -> dict:
        """count, width and height (min, median, max), the ``top`` commonest sizes, and with
        pixels the per-channel ``mean`` and ``std``."""
        widths, heights = np.asarray(self.widths, np.int64), np.asarray(self.heights, np.int64)
        summary: dict[str, Any] = {"count": int(widths.size), "failed": self.failed}
        if widths.size:
            for name, values in (("width", widths), ("height", heights)):
                summary[name] = {"min": int(values.min()), "median": float(np.median(values)), "max": int(values.max())}
            pairs, counts = np.unique(np.stack([widths, heights], axis=1), axis=0, return_counts=True)
            order = np.lexsort((pairs[:, 1], pairs[:, 0], -counts))[:top]
            summary["sizes"] = {f"{w}x{h}": int(c) for (w, h), c in zip(pairs[order].tolist(), counts[order].tolist())}
        if self.moments is not None:
            summary["pixels"] = self.moments.count
            summary["mean"] = [round(float(v), 6) for v in self.moments.mean()] if self.moments.count else None
            summary["std"] = [round(float(v), 6) for v in self.moments.std()] if self.moments.count else None
        return summary


def _label_order(label: str) -> tuple:
    try:
        return (0, float(label), label)
    except ValueError:
        return (1, 0.0, label)


class DatasetStats:
    """Statistics accumulated over samples; :meth:`add` each, then :meth:`to_json`.

    :param label_fields: the fields a sample's label is read from, the first present one winning
        (default :data:`LABEL_FIELDS`).
    :param pixels: decode images for the per-channel mean and std (else only their headers are read).
    """

    def __init__(self, *, label_fields: Iterable[str] = LABEL_FIELDS, pixels: bool = True) -> None:
        self.label_fields = tuple(label_fields)
        self.pixels = pixels
        self.samples = 0
        self._sizes: dict[str, list[int]] = {}
        self.images: dict[str, ImageStats] = {}
        self.labels: Counter[str] = Counter()
        self.label_sources: Counter[str] = Counter()

    def add(self, sample: Mapping[str, Any]) -> list[tuple[str, str]]:
        """Count one sample; returns ``(field, message)`` for each image that could not be read."""
        from ..image import ImageError

        self.samples += 1
        located = getattr(sample, "fields", None)  # a SampleRef knows its sizes without reading them
        failures = []
        for name in sample:
            if name.startswith("__"):
                continue
            if located is not None:
                size = located[name][1]
            else:
                size = memoryview(sample[name]).nbytes
            self._sizes.setdefault(name, []).append(size)
            if is_image_field(name):
                stats = self.images.setdefault(name, ImageStats(self.pixels))
                try:
                    stats.add(sample[name])
                except ImageError as exc:
                    failures.append((name, str(exc)))
        for name in self.label_fields:
            if name in sample:
                self.labels[_label_text(sample[name])] += 1
                self.label_sources[name] += 1
                break
        return failures

    def field_sizes(self) -> dict[str, SizeSummary]:
        """Per field (in the order first seen): how many samples have it, and its sizes in bytes."""
        return {name: summarize_sizes(sizes) for name, sizes in self._sizes.items()}

    def label_histogram(self) -> list[tuple[str, int]]:
        """(label, count) pairs, numeric labels in numeric order, then the others alphabetically."""
        return sorted(self.labels.items(), key=lambda item: _label_order(item[0]))

    def to_json(self) -> dict:
        """Everything as JSON-ready data."""
        return {
            "samples": self.samples,
            "fields": {name: summary.to_json() for name, summary in self.field_sizes().items()},
            "images": {name: stats.to_json() for name, stats in self.images.items()},
            "labels": {"fields": dict(self.label_sources), "counts": dict(self.label_histogram())},
        }


def _label_text(data: Any) -> str:
    """A label field's value as text: its first line, stripped (or a note for non-text bytes)."""
    raw = bytes(data)
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        return f"<{len(raw)} bytes, not text>"
    return text.splitlines()[0] if text else ""

"""A build split into parts, which :func:`hydrax.ray.build_shards_on_ray` runs as Ray tasks.

A split build is the whole build's output, shard for shard: first every sample is read (and
checked) to learn its payload (:func:`probe_samples`), then the shard boundaries
:class:`~hydrax.shards.ShardWriter` would choose are computed in one place
(:func:`shard_bounds`), then each part writes whole shards from its first number on
(:func:`write_shard_range`). Nothing but the samples' order and sizes decides a boundary, so the
parts agree with one writer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from .output import BuildOutput, parse_pattern, refuse_existing
from .reading import load_sample
from .sources import BuildError, SourceSample
from ..shardtable import ShardEntry
from ..options import S3Options, StoreOptions
from ..sizecolumn import SizeCounts
from ..writer import ShardWriter


def payload_size(loaded: Mapping[str, Any]) -> int:
    """The bytes :meth:`ShardWriter.write <hydrax.shards.ShardWriter.write>` counts against
    ``maxsize`` for a sample: its fields' bytes (text as UTF-8), names starting with ``_`` aside."""
    return sum(len(value.encode("utf-8")) if isinstance(value, str) else len(value)
               for name, value in loaded.items() if not name.startswith("_"))


def probe_samples(samples: Sequence[SourceSample], check_images: bool) -> list[int | str]:
    """Read (and with ``check_images`` decode) each sample: its payload size, or why it cannot
    be written (a :class:`BuildError`'s words)."""
    out: list[int | str] = []
    for sample in samples:
        loaded = load_sample(sample, check_images)
        out.append(str(loaded) if isinstance(loaded, BuildError) else payload_size(loaded))
    return out


def shard_bounds(sizes: Sequence[int], maxcount: int, maxsize: float) -> list[tuple[int, int]]:
    """``(first, end)`` of each shard one :class:`~hydrax.shards.ShardWriter` writes for samples
    of these payload sizes, in order: a shard ends once it holds ``maxcount`` samples or
    ``maxsize`` bytes."""
    bounds: list[tuple[int, int]] = []
    first = count = payload = 0
    for number, size in enumerate(sizes):
        if number and (count >= maxcount or payload >= maxsize):
            bounds.append((first, number))
            first, count, payload = number, 0, 0
        count += 1
        payload += size
    if sizes:
        bounds.append((first, len(sizes)))
    return bounds


@dataclass
class PartReport:
    """What :func:`write_shard_range` wrote: the shards' paths or URLs, their index entries
    (remote), field bytes and shard bytes, and how the image sizes came out (with ``sizes``)."""

    shards: list[str]
    entries: list[ShardEntry]
    payload_bytes: int
    shard_bytes: int
    size_counts: SizeCounts = SizeCounts()


def check_output(pattern: str, s3_options: S3Options | StoreOptions | None, force: bool) -> list[str]:
    """The files of ``pattern`` that exist; :class:`BuildError` if any do and not ``force``."""
    parse_pattern(pattern)
    output = BuildOutput(pattern, s3_options)
    try:
        return refuse_existing(output, force)
    finally:
        output.abort()


def write_shard_range(samples: Sequence[SourceSample], pattern: str, first_shard: int, shards: int, *, maxcount: int,
                      maxsize: float, s3_options: S3Options | StoreOptions | None = None, sizes: str | None = None) -> PartReport:
    """Write ``samples`` as the ``shards`` shards numbered from ``first_shard`` on, exactly as a
    whole build writes them when its shard ``first_shard`` starts with ``samples[0]`` (with
    ``sizes``, as :func:`~hydrax.shards.build.build_shards` takes it, in their indexes); no folder
    summary (see :func:`write_folder_summary`). A part that fails removes what it wrote; one whose
    files no longer give the planned shards (changed since they were probed) is a :class:`BuildError`."""
    output = BuildOutput(pattern, s3_options)
    writer = None
    try:
        writer = ShardWriter(output.temp_pattern, maxcount, maxsize, start_shard=first_shard, post=output.publish, sizes=sizes)
        payload = 0
        for sample in samples:
            loaded = load_sample(sample, False)
            if isinstance(loaded, BuildError):
                raise loaded
            payload += writer.write(loaded)
        writer.close()
        if writer.shard - first_shard != shards:
            raise BuildError(f"the samples of shards {first_shard}..{first_shard + shards - 1} of {pattern} make "
                             f"{writer.shard - first_shard} shards now, not {shards}: their files changed during the build")
        output.finish(summary=False)
    except BaseException:
        if writer is not None:
            writer.abort()
        output.abort()
        raise
    return PartReport(list(output.published), list(output.entries), payload, output.sizes, writer.size_counts)


def write_folder_summary(pattern: str, entries: Sequence[ShardEntry], s3_options: S3Options | StoreOptions | None = None) -> None:
    """Add the shards of ``entries`` to the folder summary beside a remote ``pattern`` (what a
    whole build does at its end); nothing for a local pattern."""
    output = BuildOutput(pattern, s3_options)
    try:
        output.write_summary(entries)
    finally:
        output.close()


def remove_shards(pattern: str, numbers: Iterable[int], s3_options: S3Options | StoreOptions | None = None) -> None:
    """Delete the shards of ``pattern`` with these numbers, and their indexes (a failed split build)."""
    output = BuildOutput(pattern, s3_options)
    try:
        output.remove(numbers)
    finally:
        output.close()

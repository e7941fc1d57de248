"""Building shards from files: an image folder, a manifest, or a list of files.

Building takes two steps. A *source* function turns the input into an ordered list of
:class:`SourceSample` s (a key, the files whose bytes become fields, and text fields) without
reading any file, so every naming problem is found before anything is written.
:func:`build_shards` then reads the files (in parallel, but in order), optionally checks that
images decode, and writes the samples with :class:`~hydrax.shards.ShardWriter`. The same samples
and options always give byte-identical shards.

This package's opening module holds :func:`build_shards` and keeps every name of a build
importable from here; the steps have a module each: the sources and keys in :mod:`~hydrax.shards.build.sources`, reading the
files (and the worker processes) in :mod:`~hydrax.shards.build.reading`, naming and publishing
shards in :mod:`~hydrax.shards.build.output`, and a build split into parts (what
:func:`hydrax.ray.build_shards_on_ray` runs) in :mod:`~hydrax.shards.build.parts`.

.. rubric:: How each source becomes samples

**An image folder** (:func:`samples_from_folder`): ``ROOT/<class>/.../<name>.<ext>``. Every
subfolder of ``ROOT`` is a class, numbered from 0 in sorted name order (by code point, so
``"10"`` sorts before ``"2"``); every file below a class folder, at any depth, is one sample:

- ``__key__``: the path relative to ``ROOT`` without its last extension, each ``.`` left in the
  file name replaced by ``_`` (``cat/img.001.JPG`` gives ``cat/img_001``);
- ``<ext>``: the file's bytes as they are, never re-encoded; the field is the file's extension,
  lower-cased and otherwise unchanged (``.JPG`` gives ``jpg``, ``.jpeg`` stays ``jpeg``);
- ``cls``: the class index, as decimal text (``"0"``);
- ``label``: the class name (the subfolder's name).

Samples are sorted by path, compared folder by folder. Names starting with ``.`` are skipped;
symbolic links are followed. A file directly in ``ROOT`` has no label and is an error, and so
is a file whose extension is not in :data:`~hydrax.shards.tarindex.IMAGE_EXTENSIONS` (unless ``skip_bad``).

**A manifest** (:func:`samples_from_manifest`): a CSV or TSV file with a header row, a JSON Lines
file (one object per line, every object with the same keys), or a Parquet file. Each row is one
sample, in row order:

- *file columns* hold paths, relative to ``root`` (default: the manifest's folder) unless
  absolute; each file's bytes become a field named by the column's ``FIELD`` when given
  (``file_columns={"image": "jpg"}``), else by the file's extension, lower-cased. Without
  ``file_columns``, the file columns are those whose value in the first row is the path of an
  existing file that has an extension;
- ``__key__``: the key column's value (``key_column``, default the column ``__key__`` if there
  is one), as it is; else derived from the first file column's path relative to ``root``, as
  for an image folder (a path outside ``root`` cannot give a key, and is refused);
- every other column is a text field named by the column name, lower-cased (readers lower-case
  field names anyway): CSV cells as they are; JSON strings as they are, other JSON values as
  compact JSON (``3``, ``true``, ``[1,2]``); Parquet strings and bytes as they are, other values
  as JSON, or their ``str()``.

An empty cell (an empty string, a JSON ``null``, a missing key, a Parquet null or NaN) is an
error naming the row and column, and so is a JSON column holding text in one row and a number
in another.

**A list of files** (:func:`samples_from_files`, :func:`samples_from_list`): WebDataset's own
rule. A file's key is its path relative to ``root`` up to the first ``.`` of its name, the field
is the rest, lower-cased; files sharing a key form one sample (``a/1.jpg`` and ``a/1.seg.png``
give the sample ``a/1`` with fields ``jpg`` and ``seg.png``). Samples come in the order of
their first file. In a list file, relative paths are relative to ``root`` (default: the list's
folder); blank lines and lines starting with ``#`` are skipped.

.. rubric:: Keys

Derived keys that coincide (``a.b.jpg`` and ``a_b.jpg``; ``x.jpg`` and ``x.png`` in an image
folder; one file named by two manifest rows) are made unique: the first keeps its key, each
later one gets ``-2``, ``-3``, ... (the first such suffix no other key has). Keys given in a key
column must be unique already. Every key is refused, naming it, when extracting the shard would
write outside the output folder or readers would misread it: an absolute key, a ``..``, ``.``
or empty path part, a backslash, a ``.`` in its last part (readers cut the key there), or a
first part like ``__name__`` (readers skip those members as metadata).

.. rubric:: Output

A local ``pattern`` such as ``out/train-%06d.tar``: each shard is written under a temporary name
in a hidden folder beside the shards, with its ``.hidx`` index, and both are renamed into place
once complete. An ``s3://bucket/prefix/train-%06d.tar`` pattern: each shard is written to a local
temporary folder and uploaded once complete, followed by its index object (the shard's URL
plus ``.hidx``, tied to the version just written); when the build ends, the folder summary
(``hydrax-index.json``) is updated with the new shards, so a :class:`~hydrax.shards.ShardSet`
over that folder sets up with one request and reads no shard to index it. Either way, a build that fails or is interrupted removes what it has written, so no
partial shard is ever left under a final name, and a build refuses to start when any file of the
pattern exists, unless ``force``.
"""

from __future__ import annotations

import math
import time
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from .output import BuildOutput, parse_pattern, refuse_existing, warn_stale
from .parts import (PartReport, check_output, payload_size, probe_samples, remove_shards, shard_bounds,
                         write_folder_summary, write_shard_range)
from .reading import load_samples
from .sources import (MANIFEST_SUFFIXES, BuildError, SourceSample, check_key, samples_from_files, samples_from_folder,
                           samples_from_list, samples_from_manifest, warner)
from ..options import S3Options, StoreOptions
from ..sizecolumn import SizeCounts
from ..writer import ShardWriter

__all__ = [
    "MANIFEST_SUFFIXES", "BuildError", "BuildReport", "PartReport", "SourceSample", "build_shards", "check_key", "check_output",
    "payload_size", "probe_samples", "remove_shards", "samples_from_files", "samples_from_folder", "samples_from_list",
    "samples_from_manifest", "shard_bounds", "shuffled", "warn_stale", "write_folder_summary", "write_shard_range",
]


@dataclass
class BuildReport:
    """What :func:`build_shards` wrote.

    :param shards: the shards' final paths or URLs, in order.
    :param samples: samples written.
    :param payload_bytes: bytes of field data written.
    :param shard_bytes: bytes of the shards themselves (tar headers and padding included).
    :param seconds: wall time of the build.
    :param skipped: one message per sample skipped with ``skip_bad``.
    :param size_counts: with ``sizes``, how the image sizes recorded in the indexes came out.
    """

    shards: list[str]
    samples: int
    payload_bytes: int
    shard_bytes: int
    seconds: float
    skipped: list[str] = field(default_factory=list)
    size_counts: SizeCounts = SizeCounts()

    @property
    def rate(self) -> float:
        """Samples written per second."""
        return self.samples / self.seconds if self.seconds > 0 else math.inf


def shuffled(samples: Sequence[SourceSample], seed: int) -> list[SourceSample]:
    """``samples`` permuted by ``numpy.random.Generator(PCG64(seed)).permutation``."""
    order = np.random.Generator(np.random.PCG64(seed)).permutation(len(samples))
    return [samples[i] for i in order.tolist()]


def _write_samples(writer: ShardWriter, samples: Sequence[SourceSample], workers: int, check_images: bool, skip_bad: bool,
                   progress: Callable[[int], Any] | None, warn: Callable[[str], Any]) -> tuple[int, int, list[str]]:
    """Read and write every sample, in order: (samples written, their field bytes, why each
    skipped sample was skipped)."""
    written = payload = 0
    skipped: list[str] = []
    # closing(): the worker processes stop before the caller's cleanup, not whenever the
    # generator is collected.
    with closing(load_samples(samples, workers, check_images)) as loaded_samples:
        for sample, loaded in loaded_samples:
            if isinstance(loaded, BuildError):
                if not skip_bad:
                    raise loaded
                skipped.append(str(loaded))
                warn(f"skipping sample {sample.key!r}: {loaded}")
            else:
                payload += writer.write(loaded)
                written += 1
            if progress is not None:
                progress(1)
    return written, payload, skipped


def build_shards(samples: Sequence[SourceSample], pattern: str, *, maxcount: int = 100_000, maxsize: float = 3e9,
                 shuffle_seed: int | None = None, workers: int = 1, check_images: bool = False,
                 skip_bad: bool = False, force: bool = False, s3_options: S3Options | StoreOptions | None = None,
                 progress: Callable[[int], Any] | None = None,
                 warn: Callable[[str], Any] | None = None, sizes: str | None = None) -> BuildReport:
    """Write ``samples`` into shards named by ``pattern`` (see the module docs for the output).

    :param pattern: ``out/train-%06d.tar`` or ``s3://bucket/prefix/train-%06d.tar``: one number
        field (``%d`` or ``%0Nd``) in the file name, which ends in ``.tar``.
    :param maxcount: samples per shard at most.
    :param maxsize: field bytes per shard before a new one starts (as :class:`ShardWriter` counts).
    :param shuffle_seed: write the samples in the order :func:`shuffled` gives for this seed
        (default: as given).
    :param workers: with more than 1, that many processes read (and check) the files ahead of
        the writer, which then reads them again from the page cache; with 1, this process does it
        all. Worth it when checking images, or when reading is slow (a network file system).
    :param check_images: decode every file whose field is an image extension, with Pillow.
    :param skip_bad: skip samples whose files cannot be read or decoded, with a warning, instead
        of failing.
    :param force: overwrite existing files of the pattern (by default the build refuses to start).
    :param s3_options: endpoint, region and credentials for an ``s3://`` pattern (or a
        :class:`~hydrax.shards.StoreOptions` for any remote pattern).
    :param progress: called with the number of samples done, as they are done.
    :param warn: called with each warning (default :func:`warnings.warn`).
    :param sizes: a field name: every shard's index records the image size of that field of
        each sample (see :mod:`~hydrax.shards.sizecolumn`), read from the headers of the shard
        just written.
    """
    started = time.perf_counter()
    warn = warner(warn)
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if not samples:
        raise BuildError("no samples to write")
    parse_pattern(pattern)
    output = BuildOutput(pattern, s3_options)
    writer = None
    try:
        existing = refuse_existing(output, force)
        if shuffle_seed is not None:
            samples = shuffled(samples, shuffle_seed)
        writer = ShardWriter(output.temp_pattern, maxcount, maxsize, post=output.publish, sizes=sizes)
        written, payload, skipped = _write_samples(writer, samples, workers, check_images, skip_bad, progress, warn)
        if not written:
            raise BuildError(f"every sample was skipped; nothing written to {pattern}")
        writer.close()
        output.finish()
    except BaseException:
        if writer is not None:
            writer.abort()
        output.abort()
        raise
    warn_stale(existing, output.published, warn)
    return BuildReport(list(output.published), written, payload, output.sizes, time.perf_counter() - started, skipped,
                       writer.size_counts)

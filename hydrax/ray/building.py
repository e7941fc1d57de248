"""A shard build split over Ray tasks: :func:`build_shards_on_ray`.

The build runs in two rounds of tasks, and its output is the local build's, shard for shard:

1. *probe*: tasks read (and check) chunks of the samples and return each one's payload size, or
   why it cannot be written;
2. the driver refuses the first bad sample (or, with ``skip_bad``, drops the bad ones with a
   warning each, in sample order) and computes where one writer would end each shard
   (:func:`hydrax.shards.build.shard_bounds`);
3. *write*: tasks write runs of whole shards, each from its planned first number
   (:func:`hydrax.shards.build.write_shard_range`), renamed into place or uploaded with their
   index objects; the driver then updates a remote folder's summary once.

A task is retried when its worker dies or its store did not answer (:mod:`.tasks`); a task that
fails otherwise (a file that cannot be read any more, a store that refuses) fails the build,
which then removes every shard it planned, as a local build removes what it wrote. The files
must be readable at the same paths on every node (a shared file system), and a local output
folder must be shared too.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from ..shards.build import BuildReport, shuffled
from ..shards.sizecolumn import SizeCounts
from ..shards.build.output import warn_stale
from ..shards.build.parts import check_output, probe_samples, remove_shards, shard_bounds, write_folder_summary, write_shard_range
from ..shards.build.sources import BuildError, SourceSample, warner
from ..shards.options import S3Options, StoreOptions
from .runtime import connect
from .tasks import gather, remote, task_ranges


def _plan(samples: Sequence[SourceSample], verdicts: list, skip_bad: bool, warn: Callable[[str], Any]) -> tuple[list, list, list[str]]:
    """The samples to write and their sizes; the bad ones refused or skipped as a local build does."""
    kept, sizes, skipped = [], [], []
    for sample, verdict in zip(samples, verdicts):
        if isinstance(verdict, str):
            if not skip_bad:
                raise BuildError(verdict)
            skipped.append(verdict)
            warn(f"skipping sample {sample.key!r}: {verdict}")
        else:
            kept.append(sample)
            sizes.append(verdict)
    return kept, sizes, skipped


def build_shards_on_ray(samples: Sequence[SourceSample], pattern: str, *, maxcount: int = 100_000, maxsize: float = 3e9,
                        shuffle_seed: int | None = None, check_images: bool = False, skip_bad: bool = False, force: bool = False,
                        s3_options: S3Options | StoreOptions | None = None, progress: Callable[[int], Any] | None = None,
                        probed: Callable[[int], Any] | None = None, warn: Callable[[str], Any] | None = None,
                        chunk: int | None = None, sizes: str | None = None) -> BuildReport:
    """:func:`hydrax.shards.build.build_shards`, with the reading, checking and writing done by Ray
    tasks: the same shards, byte for byte, and the same indexes and folder summary.

    Call it where Ray is initialised (it calls ``ray.init()`` otherwise). The arguments are
    :func:`~hydrax.shards.build.build_shards`' (``workers`` aside: Ray's CPUs do the work), and:

    :param probed: called with a number of samples as the first round reads them (``progress``
        counts the samples written, in the second).
    :param chunk: samples per task (default: about four tasks per CPU of the cluster, at least 64).
    """
    started = time.perf_counter()
    warn = warner(warn)
    if not samples:
        raise BuildError("no samples to write")
    existing = check_output(pattern, s3_options, force)
    connect()
    if shuffle_seed is not None:
        samples = shuffled(samples, shuffle_seed)
    ranges = task_ranges(len(samples), chunk, 64)
    size = ranges[0][1] - ranges[0][0]
    probe = remote(probe_samples)
    verdicts = [v for part in gather([probe.remote(samples[a:b], check_images) for a, b in ranges], [b - a for a, b in ranges], probed)
                for v in part]
    kept, payloads, skipped = _plan(samples, verdicts, skip_bad, warn)
    if not kept:
        raise BuildError(f"every sample was skipped; nothing written to {pattern}")
    bounds = shard_bounds(payloads, maxcount, maxsize)
    # runs of whole shards of about ``size`` samples each
    parts: list[tuple[int, int]] = []  # (first shard, end shard)
    for number, (first, _end) in enumerate(bounds):
        if not parts or first - bounds[parts[-1][0]][0] >= size:
            parts.append((number, number + 1))
        else:
            parts[-1] = (parts[-1][0], number + 1)
    write = remote(write_shard_range)
    refs = [write.remote(kept[bounds[a][0]:bounds[b - 1][1]], pattern, a, b - a, maxcount=maxcount, maxsize=maxsize, s3_options=s3_options,
                         sizes=sizes) for a, b in parts]
    try:
        reports = gather(refs, [bounds[b - 1][1] - bounds[a][0] for a, b in parts], progress)
        write_folder_summary(pattern, [entry for report in reports for entry in report.entries], s3_options)
    except BaseException:
        remove_shards(pattern, range(len(bounds)), s3_options)
        raise
    published = [shard for report in reports for shard in report.shards]
    warn_stale(existing, published, warn)
    return BuildReport(published, len(kept), sum(r.payload_bytes for r in reports), sum(r.shard_bytes for r in reports),
                       time.perf_counter() - started, skipped, sum((r.size_counts for r in reports), SizeCounts()))

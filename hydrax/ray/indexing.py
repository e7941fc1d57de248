"""Shard indexes written by Ray tasks: :func:`index_files_on_ray` and :func:`publish_indexes_on_ray`.

Indexing reads every tar header of every shard, so on one machine it takes about as long as
reading the dataset's headers from its disks or its bucket. Split over a cluster, each task
indexes a run of shards and the driver only gathers what they did:

- local shards (on a file system every node mounts at the same path): each task writes
  ``<shard>.hidx`` beside its shards (:func:`hydrax.shards.index_file`) and returns a result per
  shard, so one unreadable shard is reported and the others are indexed;
- shards in object storage: each task writes its shards' index objects
  (:func:`hydrax.shards.publish_indexes` without the folder summary), and the driver writes each
  folder's summary once at the end, where tasks writing it at once would overwrite each other.

The index files and objects are the ones the local command writes.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..shards import IndexResult, ShardEntry, index_file, publish_indexes, write_summaries
from ..shards.options import StoreOptions
from .runtime import connect
from .tasks import gather, remote, task_ranges


def _index_files(shards: Sequence[str], force: bool, sizes: str | None = None) -> list[IndexResult]:
    return [index_file(shard, force, sizes) for shard in shards]


def _publish(urls: Sequence[str], options: StoreOptions | None, force: bool, sizes: str | None = None) -> list[ShardEntry]:
    entries = publish_indexes(list(urls), options, force=force, summary=False, sizes=sizes)
    for entry in entries:
        entry.index = None  # the driver needs the counts, not 10^8 samples' offsets
    return entries


def index_files_on_ray(shards: Sequence[str], *, force: bool = False, progress: Callable[[int], Any] | None = None,
                       chunk: int | None = None, sizes: str | None = None) -> list[IndexResult]:
    """Index the local ``shards`` (paths every Ray node can read and write) in Ray tasks: each
    one's :class:`~hydrax.shards.IndexResult`, in order.

    Call it where Ray is initialised (it calls ``ray.init()`` otherwise).

    :param force: rebuild every index (default: only missing, stale and damaged ones).
    :param progress: called with a number of shards as tasks finish.
    :param chunk: shards per task (default: about four tasks per CPU of the cluster).
    :param sizes: record the image sizes of this field in every index (see :func:`hydrax.shards.index_file`).
    """
    connect()
    task = remote(_index_files)
    runs = task_ranges(len(shards), chunk, 1)
    parts = gather([task.remote(list(shards[a:b]), force, sizes) for a, b in runs], [b - a for a, b in runs], progress)
    return [result for part in parts for result in part]


def publish_indexes_on_ray(urls: Sequence[str], options: StoreOptions | None = None, *, force: bool = False,
                           progress: Callable[[int], Any] | None = None, chunk: int | None = None,
                           sizes: str | None = None) -> list[ShardEntry]:
    """:func:`hydrax.shards.publish_indexes` for the remote shards ``urls`` (expanded: no
    patterns), in Ray tasks; then each folder's summary, once. Returns the shards' entries with
    their sizes, versions and sample counts (not their indexes).

    :param progress: called with a number of shards as tasks finish.
    :param chunk: shards per task (default: about four tasks per CPU of the cluster).
    :param sizes: record the image sizes of this field in every index (see :func:`hydrax.shards.publish_indexes`).
    :raises: the first task's error that retries did not cure (a
        :class:`~hydrax.errors.StoreError`, a :class:`~hydrax.shards.ShardFormatError`); the
        index objects already written stay, and are current.
    """
    connect()
    task = remote(_publish)
    runs = task_ranges(len(urls), chunk, 1)
    parts = gather([task.remote(list(urls[a:b]), options, force, sizes) for a, b in runs], [b - a for a, b in runs], progress)
    entries = [entry for part in parts for entry in part]
    write_summaries(entries, options)
    return entries

"""What the user asks of the read-ahead (:class:`~hydrax.shards.ReadAhead`), and how many fetch
processes that makes on a host (:func:`fetch_process_count`).

The options are a leaf of the read-ahead: the budget, the fetcher and the fetch processes all
read them, so they sit apart from each of those. The number of fetch processes is worked out
here, next to the ``fetch_processes`` option it reads and the defaults that option documents.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

#: Usable cores per fetch process when ``ReadAhead(fetch_processes=None)``. A fetch process spends
#: about 2 s of CPU per GB it moves, a loader decoding 100 kB photos about 11.5 s per GB it
#: decodes: the storage guide's model of a host ("Throughput per host") balances them at one
#: fetch process per 7 cores; loaders that only copy bytes would want more.
CORES_PER_FETCH_PROCESS = 8
#: The most fetch processes chosen by default (a 224-core host gets 28).
MAX_FETCH_PROCESSES = 32
#: The fetch processes' default ``os.nice`` increment (``ReadAhead(fetch_nice=...)``): the
#: training process's priority. 19 let a fixed training step beside a remote epoch on 2 busy cores
#: take 1.03-1.06x its mean beside a local one (1.17x at 0), but a fetch process that yields is
#: starved by anything else that keeps the cores busy: with two CPU-bound processes beside a test
#: run, workers read their samples themselves and the run fetched 1.5x its data. See the storage
#: guide, "The fetch processes' priority".
FETCH_NICE = 0


@dataclass(frozen=True)
class ReadAhead:
    """How remote shards are read ahead (``ShardSet(..., readahead=ReadAhead(...))``).

    :param max_bytes: the most bytes held read ahead (and cached) at once; None (the default):
        sized for the run and the host (:func:`~hydrax.shards.readahead.budget.choose_budget`; the choice is
        :attr:`ShardSet.readahead_budget <hydrax.shards.ShardSet.readahead_budget>`).
    :param cache_dir: a directory that keeps what was read across epochs and runs (size-capped
        by ``max_bytes``, least recently used evicted); None: a private temporary directory,
        removed when the ShardSet is.
    :param requests: ranged requests in flight at once.
    :param streams: chunk requests in flight at once (in each fetch process).
    :param enabled: False reads every sample with its own request when a worker needs it.
    :param fetch_processes: how many fetch processes share the shards (each fetches its own
        shards, with its share of the budget, ``requests`` and ``streams``); None (the default):
        one per :data:`CORES_PER_FETCH_PROCESS` usable cores, at most :data:`MAX_FETCH_PROCESSES`
        and at most one per shard (:func:`fetch_process_count`). A persistent ``cache_dir`` is
        always read ahead by one.
    :param fetch_nice: the fetch processes' ``os.nice`` increment, 0 (the default,
        :data:`FETCH_NICE`: the training process's priority) to 19; above 0 they also run under
        Linux's ``SCHED_BATCH`` policy (they do not preempt the training process when data
        arrives), so that where the host's cores are short the training step, which the
        accelerators wait for, goes first. Where something else keeps the cores busy too, a fetch
        process that yields falls behind, and workers read their samples themselves.
    """

    max_bytes: int | None = None
    cache_dir: str | None = None
    requests: int = 32
    streams: int = 8
    enabled: bool = True
    fetch_processes: int | None = None
    fetch_nice: int = FETCH_NICE

    def __post_init__(self) -> None:
        nice = self.fetch_nice
        if not isinstance(nice, int) or isinstance(nice, bool) or not 0 <= nice <= 19:
            raise ValueError(f"ReadAhead(fetch_nice=...) must be an int from 0 to 19, got {nice!r}")
        for name in ("max_bytes", "requests", "streams", "fetch_processes"):
            value = getattr(self, name)
            if name in ("max_bytes", "fetch_processes") and value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                optional = " or None" if name in ("max_bytes", "fetch_processes") else ""
                raise ValueError(f"ReadAhead({name}=...) must be a positive int{optional}, got {value!r}")


def fetch_process_count(options: ReadAhead, shards: int, cores: int | None = None) -> int:
    """How many fetch processes read ahead ``shards`` remote shards with ``options`` (see
    ``ReadAhead(fetch_processes=...)``) on a host with ``cores`` usable cores (default: this one's)."""
    if options.cache_dir is not None:
        return 1  # one process keeps a persistent cache's accounting of what it holds
    if options.fetch_processes is not None:
        wanted = options.fetch_processes
    else:
        cores = cores if cores is not None else len(os.sched_getaffinity(0))
        wanted = min(MAX_FETCH_PROCESSES, max(1, cores // CORES_PER_FETCH_PROCESS))
    return max(1, min(wanted, shards))

"""Set-up's reads kept for the read-ahead: chunk files cut from shards read whole to index them.

A shard without an index object is read whole at set-up to be indexed; while those bytes are in
memory, a :class:`ChunkSeeder` writes them as the chunk files the fetcher would have fetched (in
the layout of :mod:`hydrax.shards.readahead.folders`), within the budget, so the first epoch
reads them from there instead of fetching them again. Set-up's indexing processes each seed
their own share (:mod:`hydrax.shards.indexpool`); the fetcher counts what they wrote as held
from its start.
"""

from __future__ import annotations

import logging
import os

import numpy as np

from .folders import ShardLayout, chunk_name, part_name

log = logging.getLogger(__name__)


class ChunkSeeder:
    """Chunk files cut from shards read whole for another reason (set-up reads a shard that has no
    index object whole, to index it), written while ``room`` bytes allow: the same files, in the
    same folders, that the :class:`~hydrax.shards.readahead.fetcher.Fetcher` would write, so a run need not fetch those bytes again.

    :attr:`held` (path -> size, in the order written) is what the Fetcher then counts as held
    (``Fetcher(..., held=...)``): the budget applies to it, and it is evicted like any file of an
    earlier run. A failure to write stops the seeding (logged once); reads are unaffected.
    """

    def __init__(self, root: str, room: int) -> None:
        self.root = root
        self.room = room
        self.bytes = 0
        self.held: dict[str, int] = {}
        self.urls: dict[str, str] = {}  # shard folder -> the URL of its shard (fetch processes split the files by it)
        self._failed = False

    def add(self, url: str, version: str | None, starts: np.ndarray, ends: np.ndarray, data) -> int:
        """Write the chunks of the shard ``url`` (read at ``version``, its samples spanning
        ``[starts[i], ends[i])``) from its bytes ``data``, each while the room allows (a chunk
        that is there already is left as it is); returns the bytes written."""
        if self._failed or not len(starts):
            return 0
        layout = ShardLayout(url, version, starts, ends, self.root)
        view = memoryview(data).cast("B")
        written = 0
        part = None
        try:
            for chunk in range(len(layout.chunks)):
                start, end = layout.chunk_span(chunk)
                path = os.path.join(layout.directory, chunk_name(chunk))
                if end - start > self.room - self.bytes or path in self.held or os.path.exists(path):
                    continue
                os.makedirs(layout.directory, exist_ok=True)
                # Under the temporary name, renamed once whole, as the fetcher writes: a worker
                # never maps part of a chunk. Each file is closed at once (thousands of shards).
                part = os.path.join(layout.directory, part_name(chunk_name(chunk)))
                with open(part, "wb") as f:
                    f.write(view[start:end])
                os.replace(part, path)
                part = None
                self.held[path] = end - start
                self.urls[layout.directory] = url
                self.bytes += end - start
                written += end - start
        except OSError as exc:
            self._failed = True
            log.warning("keeping the bytes read to index shards for read-ahead stopped (the first epoch fetches the rest "
                        "again): %s", exc)
            if part is not None:
                try:
                    os.unlink(part)
                except OSError:
                    pass
        return written

    def adopt(self, held: dict[str, int], url: str) -> None:
        """Count as this seeder's the files ``held`` (path -> size) of shard ``url`` that another
        process's seeder wrote under the same root (set-up's indexing processes, each with a share of the room)."""
        for path, size in held.items():
            if path not in self.held:
                self.held[path] = size
                self.urls[os.path.dirname(path)] = url
                self.bytes += size

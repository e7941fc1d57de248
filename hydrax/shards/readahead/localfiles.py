"""The workers' side of the read-ahead: how a worker finds a sample that was fetched for it.

A worker never asks the fetcher: it computes where a sample's file would be (the layout of
:mod:`hydrax.shards.readahead.folders`) and looks. A complete chunk file is mapped and the sample
read from the mapping without a copy; a sample file is read; a file still being written (its
temporary name exists) is waited for, up to :data:`WAIT_S`, while its writer lives (checked
every :data:`WRITER_CHECK_S`); anything else the worker reads itself, with one ranged request, so
read-ahead never blocks progress.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict

from .folders import ShardLayout, chunk_name, part_name, sample_name, writer_alive

log = logging.getLogger(__name__)

#: How long a worker waits for a file being written before reading the sample itself.
WAIT_S = 15.0
#: How often a waiting worker checks that the writer lives.
WRITER_CHECK_S = 0.1


class LocalFiles:
    """A worker's view of the read-ahead directory: finds a sample's bytes, waiting for a file
    being written, and keeps a bounded number of chunk mappings open."""

    def __init__(self, max_open: int = 64) -> None:
        self.max_open = max_open
        self._maps: OrderedDict[str, memoryview] = OrderedDict()

    def find(self, layout: ShardLayout, sample: int):
        """``(buffer, byte offset of the buffer in the shard)`` holding ``sample``, or None when it
        was not read ahead (the caller then reads it itself)."""
        chunk = layout.chunk_of(sample)
        chunk_file = os.path.join(layout.directory, chunk_name(chunk))
        sample_file = os.path.join(layout.directory, sample_name(sample))
        deadline = None
        last_look = False
        while True:
            view = self._maps.get(chunk_file)
            if view is not None:
                self._maps.move_to_end(chunk_file)
                return view, layout.chunk_span(chunk)[0]
            mapped = self._map(chunk_file)
            if mapped is not None:
                return mapped, layout.chunk_span(chunk)[0]
            try:
                with open(sample_file, "rb") as f:
                    return f.read(), int(layout.starts[sample])
            except FileNotFoundError:
                pass
            if last_look:
                return None
            if not (os.path.exists(os.path.join(layout.directory, part_name(chunk_name(chunk))))
                    or os.path.exists(os.path.join(layout.directory, part_name(sample_name(sample))))):
                # No file being written either: unless one was finished (renamed into place)
                # between the two looks, which one more look finds.
                last_look = True
                continue
            now = time.monotonic()
            if deadline is None:
                deadline, check = now + WAIT_S, now + WRITER_CHECK_S
            elif now > deadline:
                log.warning("waited %.0f s for read-ahead of %s sample %d; reading it directly", WAIT_S, layout.url, sample)
                return None
            elif now > check:
                # A fetch process killed mid-write leaves its temporary files: no one finishes them.
                if not writer_alive(layout.directory):
                    return None
                check = now + WRITER_CHECK_S
            time.sleep(0.002)

    def _map(self, path: str) -> memoryview | None:
        import mmap

        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            size = os.fstat(fd).st_size
            mapping = mmap.mmap(fd, size, access=mmap.ACCESS_READ) if size else b""
        finally:
            os.close(fd)  # the mapping keeps the file; no descriptor stays open
        view = memoryview(mapping)
        self._maps[path] = view
        while len(self._maps) > self.max_open:
            self._maps.popitem(last=False)
        return view

    def clear(self) -> None:
        self._maps.clear()

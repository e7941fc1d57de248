"""The threads that write a run's batch files (:class:`CacheWriter`), and the paths in flight.

Writing a batch file (an ``fsync`` included) should not hold up the pipeline, so it runs on
background threads; and a path being loaded for the cache or written must never be read (hydrax
0.2.2 did, and unpickled half a file), so the writer also keeps the set of paths in flight.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Callable

# The name the cache's messages have always had, whichever of its modules logs them.
log = logging.getLogger("hydrax.cache")


class CacheWriter:
    """Writes batch files on ``threads`` background threads, and knows which paths are in flight.

    A path is claimed (:meth:`claim`) before its batch is loaded for the cache or handed to a
    writer, and released once the file is complete or abandoned; while it is claimed no one reads
    it or writes it again. At most ``depth`` writes wait at once: :meth:`submit` blocks beyond.
    After :meth:`close`, writes run on the calling thread.
    """

    def __init__(self, threads: int, depth: int) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._room = threading.BoundedSemaphore(max(1, depth))
        self._lock = threading.Lock()
        self._inflight: set[str] = set()
        self._closed = False
        #: Files written, and writes that failed (each logged), so far.
        self.written = 0
        self.failed = 0
        self._threads = [threading.Thread(target=self._run, name=f"hydrax-cacher-{i}", daemon=True) for i in range(threads)]
        for thread in self._threads:
            thread.start()

    def claim(self, path: str) -> bool:
        """Mark ``path`` as in flight; False if it already is."""
        with self._lock:
            if path in self._inflight:
                return False
            self._inflight.add(path)
            return True

    def in_flight(self, path: str) -> bool:
        """Whether ``path`` is being loaded for the cache or written."""
        with self._lock:
            return path in self._inflight

    def release(self, path: str) -> None:
        """``path`` is no longer in flight (written, or abandoned)."""
        with self._lock:
            self._inflight.discard(path)

    def submit(self, path: str, write: Callable[[], None]) -> None:
        """Run ``write()`` (which writes the claimed ``path``) on a writer thread, then release ``path``."""
        if self._closed or not self._threads:
            self._write(path, write)
            return
        self._room.acquire()
        self._queue.put((path, write))

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                self._write(*job)
            finally:
                # A direct-mode job holds views of a batch slot: drop them before waiting again.
                job = None
                self._room.release()

    def _write(self, path: str, write: Callable[[], None]) -> None:
        try:
            write()
            self.written += 1
        except Exception:
            self.failed += 1
            log.warning("[hydrax] could not write cache file %s; the batch will be loaded again when needed:", path, exc_info=True)
        finally:
            self.release(path)

    @property
    def pending(self) -> int:
        """Paths in flight now."""
        with self._lock:
            return len(self._inflight)

    def close(self) -> None:
        """Finish the queued writes and stop the threads."""
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join()

"""The read-ahead of remote shards in a fetch process of its own (see :mod:`hydrax.shards.readahead`).

A :class:`~hydrax.shards.readahead.fetcher.Fetcher` thread in the training process spent about
2 s of CPU per GB fetched there, and its Python work held the GIL the training loop needs (the
slowest steps of a pure-Python loop took 2-3x as long). A :class:`FetchProcess` runs the Fetcher in a
child started from the fork server (obstore forbids forking a process that used it), against
its own copy of the ShardSet (a pickled ShardSet is compact and rebuilds its per-process state),
with the same folder, options and files held. The training process only sends announcements
and releases (a few small arrays per batch, handed to a sending thread: it never waits for the
child) and asks for the statistics; no byte fetched passes through it.

A fetch process that dies is started again (up to :data:`MAX_RESTARTS` times) with the batches
still announced; the new one counts what the dead one wrote whole (in the shard folders that
name it their writer) and removes what it left half-written. After that, a thread of the
training process takes over the read-ahead the same way. Workers waiting for a file being
written check that its writer is alive (see
:func:`~hydrax.shards.readahead.folders.writer_alive`), so a dead fetch process never makes them
wait :data:`~hydrax.shards.readahead.localfiles.WAIT_S` per sample.

A :class:`FetchPool` runs several fetch processes, each reading ahead the shards a hash of their
URL gives it (:func:`shard_owners`) with its share of the budget (:func:`budget_shares`), so the
read-ahead grows with the host (how many:
:func:`~hydrax.shards.readahead.options.fetch_process_count`). :func:`make_fetcher` chooses
between the pool, the process and the thread, in one place.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import multiprocessing as mp
import os
import pickle
import queue
import signal
import threading
import time
import zlib
from typing import Any, Callable, Sequence

import numpy as np

from ..procs.processes import (adopt_environment, die_with_parent, environment_snapshot, helpers_allowed, release_fork_server,
                               run_behind, warm_forkserver)
from .readahead.budget import MIN_BUDGET
from .readahead.fetcher import EMPTY_STATS, Fetcher
from .readahead.folders import held_files
from .readahead.options import ReadAhead

log = logging.getLogger(__name__)

#: How many times a fetch process that died is started again before a thread of the training
#: process takes over the read-ahead (as where no fetch process can start).
MAX_RESTARTS = 3
#: How often (seconds) the training process checks, as it announces, that the fetch process lives.
CHECK_S = 0.2
#: A fetch process with nothing announced for this long (seconds) ends; the next announcement starts another.
IDLE_S = 2.0
#: How long starting a fetch process waits for it to be ready (typically a few tenths of a second).
READY_WAIT_S = 10.0
#: What the fork server imports besides hydrax's worker code when remote shards start it (a
#: ShardSet, a fetch process): the fetch process and the workers then find the shards package and
#: obstore there rather than import them each, on the first batch's way (55-105 ms on the 2-core
#: development machine). Importing obstore starts no thread: the server still forks safely.
SERVER_MODULES = ("hydrax.shards.fetchproc", "obstore.store")
#: The fetch process's answer once it has planned the first batch announced to it.
READY = "ready"
#: How long a statistics request waits for the fetch process's answer.
STATS_WAIT_S = 10.0
#: How long :meth:`FetchProcess.close` waits for the fetch process to end before killing it.
CLOSE_WAIT_S = 5.0
#: The messages the sending thread gathers into one (see :meth:`Fetcher.update <hydrax.shards.readahead.fetcher.Fetcher.update>`).
UPDATES = ("announce", "release")
#: The most shards whose indexes the training process loads before its first fetch process starts
#: (:func:`load_first_indexes`): a fully shuffled first batch reads one shard per sample.
FIRST_INDEXES = 64
#: How long the training process gives those indexes before it starts the fetch process anyway.
FIRST_INDEXES_WAIT_S = 2.0


ThreadFetcher = Callable[[ReadAhead, "dict[str, int] | None"], Fetcher]


def make_fetcher(shards: Any, options: ReadAhead, root: str, held: dict[str, int] | None,
                 thread_fetcher: ThreadFetcher, count: int = 1, sizes: np.ndarray | None = None,
                 held_urls: dict[str, str] | None = None, first: Sequence[int] = ()) -> Any:
    """The read-ahead of ``shards`` (a ShardSet, whose pickle each fetch process gets): a
    :class:`FetchProcess`, or a :class:`FetchPool` of ``count`` of them (``sizes``: the shards'
    bytes; ``held_urls``: the shard URL of each folder of the files ``held``), where
    :func:`~hydrax.procs.processes.helpers_allowed` allows it and they start; else the Fetcher thread
    ``thread_fetcher(options, held)`` makes (which also takes over from a fetch process that
    keeps dying, given the files it held). The indexes of the shards ``first`` (those of the
    first batch announced) are loaded before, see :func:`load_first_indexes`."""
    if helpers_allowed():
        load_first_indexes(shards, first)
        try:
            if count > 1:
                return FetchPool(shards, options, root, held, thread_fetcher, count, sizes, held_urls or {})
            return FetchProcess(shards, options, root, held, thread_fetcher)  # (not waited for: see wait_ready)
        except Exception as exc:  # noqa: BLE001  (any failure to start: the thread still reads ahead)
            log.warning("[hydrax] read-ahead runs in the training process (its fetch process did not start: %s)", exc)
    return thread_fetcher(options, held)


def load_first_indexes(shards: Any, first: Sequence[int]) -> None:
    """Load the indexes of the shards ``first`` (at most :data:`FIRST_INDEXES`) here, all at once
    from an event loop in a thread of its own, so that they are in the local index cache when the
    fetch process and the workers start: each would otherwise load them before the first batch's
    reads. The training process reads only these index objects, no sample, while it waits for
    the fork server anyway. One that fails to load is left to the processes that need it, which
    report why."""
    wanted = [int(s) for s in first[:FIRST_INDEXES]]
    if not wanted:
        return

    async def load() -> None:
        try:  # a store that does not answer at once is left to the processes that retry it
            await asyncio.wait_for(asyncio.gather(*(shards.layout_async(s) for s in wanted), return_exceptions=True),
                                   FIRST_INDEXES_WAIT_S)
        except asyncio.TimeoutError:
            log.debug("[hydrax] the first batch's indexes took over %.0f s; the fetch process loads them", FIRST_INDEXES_WAIT_S)

    loader = threading.Thread(target=asyncio.run, args=(load(),), name="hydrax-first-indexes", daemon=True)
    loader.start()
    loader.join()


def shard_owner(url: str, count: int) -> int:
    """Which of ``count`` fetch processes reads ahead the shard ``url``: by a hash of the URL, so
    that a shard named twice has one writer, and its folder one :data:`~hydrax.shards.readahead.folders.WRITER_FILE`."""
    return zlib.crc32(url.encode()) % count


def shard_owners(urls: list[str], count: int) -> np.ndarray:
    """:func:`shard_owner` of each of ``urls``."""
    return np.fromiter((shard_owner(url, count) for url in urls), np.int64, len(urls))


def budget_shares(total: int, owners: np.ndarray, sizes: np.ndarray | None, count: int) -> list[int]:
    """Each fetch process's share of the budget ``total``: in proportion to the bytes of the
    shards it reads ahead (a budget that holds the data holds each one's part of it), at least
    :data:`~hydrax.shards.readahead.budget.MIN_BUDGET` // ``count``."""
    weights = np.bincount(owners, weights=None if sizes is None else np.maximum(sizes, 1).astype(np.float64),
                          minlength=count).astype(np.float64)
    weights /= max(weights.sum(), 1.0)
    return [max(MIN_BUDGET // count, int(total * w)) for w in weights]


def rescanned(root: str, seeded: dict[str, int], writers: set[int]) -> dict[str, int]:
    """The files a fetch process started again (or the thread taking over) holds from the start:
    those set-up kept for its shards that are still there, and the complete files of the folders
    its earlier processes (``writers``) wrote to, whose half-written files are removed."""
    held = {path: size for path, size in seeded.items() if os.path.exists(path)}
    held.update(held_files(root, 0.0, writers))
    return held


class FetchProcess:
    """A :class:`~hydrax.shards.readahead.fetcher.Fetcher` in a child process, with the Fetcher's interface
    (:meth:`announce`, :meth:`release`, :meth:`close`, :attr:`stats`).

    The child ends once nothing has been announced for :data:`IDLE_S` (a run ended: its ShardSet
    may live on, held by a DataGroup until the garbage collector frees both), and a new one starts
    with the next announcement, using what the folder holds.
    """

    def __init__(self, shards: Any, options: ReadAhead, root: str, held: dict[str, int] | None,
                 fallback: ThreadFetcher | None = None, payload: bytes | None = None) -> None:
        self.options = options
        self._fallback = fallback  # makes the thread that reads ahead once fetch processes keep dying
        self._thread: Fetcher | None = None
        self.root = root
        self._payload = payload or pickle.dumps(shards, protocol=pickle.HIGHEST_PROTOCOL)
        self._seeded = dict(held or {})  # what set-up kept of its shards: held from the start
        self._writers: set[int] = set()  # this read-ahead's earlier fetch processes
        self._announced: dict[Any, tuple] = {}  # announced, not released: handed to a new process
        self._restarts = 0
        self._base = dict(EMPTY_STATS)  # what earlier processes counted
        self._last = dict(EMPTY_STATS)
        self._checked = 0.0
        self._closed = False  # no more fetch processes start (closing, or a thread took over)
        self._ending = False
        self._lock = threading.Lock()  # between announcing and the sending thread's idle end
        self._stats_lock = threading.Lock()
        self._serial = itertools.count(1)
        self._process = None
        self._start()

    def _start(self) -> None:
        """Start a fetch process and its sending thread, without waiting: the sending thread
        launches it (the fork server may still be importing), and what is announced meanwhile
        waits in its outbox, to go as one message."""
        warm_forkserver(main_imports=False, modules=SERVER_MODULES)
        ctx = mp.get_context("forkserver")
        commands_r, commands_w = ctx.Pipe(duplex=False)
        replies_r, replies_w = ctx.Pipe(duplex=False)
        process = ctx.Process(target=fetch_main, name="hydrax-fetch", daemon=True,
                              args=(self._payload, self.options, self.root, self._seeded, set(self._writers),
                                    commands_r, replies_w, environment_snapshot()))
        self._process, self._replies, self._ready = process, replies_r, False
        self._launched, self._launch_error = threading.Event(), None
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._broken = self._idle = False
        self._sender = threading.Thread(target=self._send_loop, args=(self._outbox, commands_w, (commands_r, replies_w)),
                                        name="hydrax-fetch-send", daemon=True)
        self._sender.start()

    def _launch(self, child_ends: tuple) -> bool:
        """Start the process (on the sending thread); False when it could not start."""
        try:
            self._process.start()
            self._writers.add(self._process.pid)
            return True
        except Exception as exc:  # noqa: BLE001  (the fork server is gone, say)
            self._launch_error = exc
            return False
        finally:
            for end in child_ends:
                end.close()
            self._launched.set()

    def _started(self) -> bool:
        """Whether the process was launched (waiting for the launch to end, at most
        :data:`READY_WAIT_S`): one that failed, or never ended, has no process to join."""
        return self._launched.wait(READY_WAIT_S) and self._launch_error is None

    def wait_ready(self) -> None:
        """Wait until the fetch process has planned the first batch announced to it (its reads
        have begun): workers that start before would read its samples themselves, and the fetch
        process would fetch them again. Returns at once when nothing was announced to it."""
        if self._ready or self._process is None or not self._announced:
            return
        self._ready = True
        deadline = time.monotonic() + READY_WAIT_S
        if not self._launched.wait(READY_WAIT_S) or self._launch_error is not None:
            return  # (a launch that failed: the next check starts another)
        try:
            while self._replies.poll(max(0.0, deadline - time.monotonic())):
                answer, stats = self._replies.recv()
                self._last = stats if stats is not None else self._last
                if answer == READY:
                    return
        except (EOFError, OSError):
            return  # it died at once: the next check starts another
        log.warning("[hydrax] the read-ahead fetch process took more than %.0f s to start; going on", READY_WAIT_S)

    def _send_loop(self, outbox: queue.SimpleQueue, connection, child_ends: tuple) -> None:
        """The sending thread: launches the fetch process, then sends what is announced (the
        training process never waits for the fetch process to read). Ends the fetch process once
        nothing is announced for :data:`IDLE_S`."""
        if not self._launch(child_ends):
            self._broken = True  # the next check starts another (or gives up)
            connection.close()
            return
        while True:
            try:
                message = outbox.get(timeout=IDLE_S)
            except queue.Empty:
                with self._lock:
                    if self._announced or not outbox.empty():
                        continue
                    self._idle = True  # from now on, the next announcement starts a new process
                message = ("close",)
            # Announcements and releases waiting together go as one message: a run's start
            # announces hundreds of batches at once, which one by one kept the fetch process's
            # loop from its first batch's requests (and cost a pickle and a write each here).
            updates = []
            while message and message[0] in UPDATES:
                updates.append(message)
                try:
                    message = outbox.get_nowait()
                except queue.Empty:
                    message = ()
            try:
                if updates:
                    connection.send(("updates", updates))
                if message:
                    connection.send(message)
            except (OSError, ValueError):  # the fetch process died: the next check restarts it
                self._broken = True
                break
            if message is None or (message and message[0] == "close"):
                break
        try:
            connection.close()
        except OSError:
            pass

    def _send(self, message: tuple) -> None:
        with self._lock:
            if not self._closed and not self._check():
                self._outbox.put(message)

    def _check(self) -> bool:
        """Start the fetch process again if it died, or ended idle (checked at most every
        :data:`CHECK_S` unless it ended); True when it did (with every batch still announced)."""
        now = time.monotonic()
        ended = self._broken or self._idle
        if not ended and now - self._checked < CHECK_S:
            return False
        self._checked = now
        if not ended and (self._process is None or not self._launched.is_set() or self._process.is_alive()):
            return False
        died = not self._idle
        if self._process is not None:
            self._retire()
        if died:
            if self._restarts >= MAX_RESTARTS:
                self._closed = True
                self._take_over()
                return True
            self._restarts += 1
            if self._launch_error is not None:
                log.warning("[hydrax] the read-ahead fetch process did not start (%s); starting it again", self._launch_error)
            else:
                log.warning("[hydrax] the read-ahead fetch process died (exit code %s); starting it again", self._exitcode)
        try:
            self._start()
        except Exception as exc:  # noqa: BLE001  (the fork server is gone, say)
            log.warning("[hydrax] the read-ahead fetch process could not start again: %s", exc)
            self._closed = True
            self._take_over()
            return True
        for key, (shards, samples, order) in self._announced.items():
            self._outbox.put(("announce", key, shards, samples, order))
        return True

    def _take_over(self) -> None:
        """Read ahead in a thread of this process from now on (fetch processes keep dying, or
        cannot start), with every batch still announced; without a thread to make, workers read
        what they need themselves."""
        how = "a thread of the training process reads ahead" if self._fallback else "workers read what they need themselves"
        log.warning("[hydrax] the read-ahead fetch process died or did not start %d times; %s", self._restarts + 1, how)
        if self._fallback is None:
            return
        try:
            self._thread = self._fallback(self.options, rescanned(self.root, self._seeded, self._writers))
            for key, (shards, samples, order) in self._announced.items():
                self._thread.announce(key, shards, samples, order)
        except Exception:  # noqa: BLE001  (read-ahead is an optimisation: workers still read)
            log.warning("[hydrax] read-ahead stopped; workers read what they need themselves", exc_info=True)
            self._thread = None

    def _retire(self) -> None:
        """Keep the ended process's last statistics and let go of it, its pipes and its sending thread."""
        self._outbox.put(None)
        self._sender.join(CLOSE_WAIT_S)
        if self._started():
            self._process.join(CLOSE_WAIT_S)
            if self._process.exitcode is None:
                self._process.kill()
                self._process.join(CLOSE_WAIT_S)
        self._exitcode = self._process.exitcode
        try:
            while self._replies.poll(0):  # a process that ended idle sent its final statistics
                answer, stats = self._replies.recv()
                self._last = stats if stats is not None else self._last
        except (OSError, EOFError):
            pass
        self._replies.close()
        for name, value in self._last.items():
            self._base[name] = max(self._base[name], value) if name == "held_peak" else self._base[name] + value
        self._last = dict(EMPTY_STATS)
        self._process = None

    def announce(self, key: Any, shards: np.ndarray, samples: np.ndarray, order: str) -> None:
        """As :meth:`Fetcher.announce <hydrax.shards.readahead.fetcher.Fetcher.announce>`; never waits."""
        self._announced[key] = (shards, samples, order)
        if self._thread is not None:
            self._thread.announce(key, shards, samples, order)
        else:
            self._send(("announce", key, shards, samples, order))

    def release(self, key: Any) -> None:
        """As :meth:`Fetcher.release <hydrax.shards.readahead.fetcher.Fetcher.release>`; never waits."""
        self._announced.pop(key, None)
        if self._thread is not None:
            self._thread.release(key)
        else:
            self._send(("release", key))

    @property
    def stats(self) -> dict[str, int]:
        """The fetch processes' statistics (one round trip; the last known if the process does not answer)."""
        with self._stats_lock:
            with self._lock:
                if self._process is not None and self._idle:
                    self._retire()  # ended idle: its final statistics are in; the next announcement starts another
                if (self._closed or self._process is None or self._broken or not self._launched.is_set()
                        or not self._process.is_alive()):
                    return self._combined()  # a process that died counts what it last said
                serial = next(self._serial)
                self._outbox.put(("stats", serial))
            deadline = time.monotonic() + STATS_WAIT_S
            try:
                while self._replies.poll(max(0.0, deadline - time.monotonic())):
                    answer, stats = self._replies.recv()
                    self._last = stats if stats is not None else self._last
                    self._ready |= answer == READY  # (not to be waited for again)
                    if answer == serial:
                        break
                else:
                    log.debug("read-ahead: the fetch process did not answer for its statistics")
            except (OSError, EOFError):
                pass
            return self._combined()

    def _combined(self) -> dict[str, int]:
        last = self._thread.stats if self._thread is not None else self._last
        return {name: max(self._base[name], last.get(name, 0)) if name == "held_peak"
                else self._base[name] + last.get(name, 0) for name in self._base}

    def close(self) -> None:
        """Stop the fetch process (waits up to :data:`CLOSE_WAIT_S`, then kills it), or the thread
        that took over from it."""
        self.begin_close()
        with self._lock:
            if self._process is not None:
                self._retire()

    def begin_close(self) -> None:
        """Tell the fetch process to end, without waiting (:meth:`close` then waits): a pool's end together."""
        with self._lock:
            if self._ending:
                return
            self._ending = self._closed = True
            if self._thread is not None:
                self._thread.close()
            if self._process is not None:
                self._outbox.put(("close",))


class FetchPool:
    """``count`` :class:`FetchProcess` es that split the shards between them (:func:`shard_owners`),
    each with its share of the budget (:func:`budget_shares`) and its own ``requests`` and
    ``streams``: the read-ahead's CPU and its requests in flight grow with the host. The training
    process sends each announcement's samples to the processes whose shards they are in, and the
    release to those same processes; statistics are summed (``held_peak``: the sum of the peaks).
    """

    def __init__(self, shards: Any, options: ReadAhead, root: str, held: dict[str, int] | None,
                 fallback: ThreadFetcher | None, count: int, sizes: np.ndarray | None, held_urls: dict[str, str]) -> None:
        self._owners = shard_owners(list(shards.urls), count)
        budgets = budget_shares(options.max_bytes, self._owners, sizes, count)
        seeded: list[dict[str, int]] = [{} for _ in range(count)]
        for path, size in (held or {}).items():
            url = held_urls.get(os.path.dirname(path))
            seeded[shard_owner(url, count) if url is not None else 0][path] = size
        payload = pickle.dumps(shards, protocol=pickle.HIGHEST_PROTOCOL)
        self._routes: dict[Any, list[int]] = {}  # announced key -> the processes it was sent to
        self._children: list[FetchProcess] = []
        try:
            for i in range(count):
                share = dataclasses.replace(options, max_bytes=budgets[i])
                self._children.append(FetchProcess(shards, share, root, seeded[i], fallback, payload))
        except BaseException:
            self.close()
            raise

    def announce(self, key: Any, shards: np.ndarray, samples: np.ndarray, order: str) -> None:
        """As :meth:`Fetcher.announce <hydrax.shards.readahead.fetcher.Fetcher.announce>`, to the fetch
        processes of ``shards``; never waits."""
        owners = self._owners[shards]
        route = np.unique(owners).tolist()
        self._routes[key] = route
        if len(route) == 1:
            self._children[route[0]].announce(key, shards, samples, order)
            return
        for i in route:
            mine = owners == i
            self._children[i].announce(key, shards[mine], samples[mine], order)

    def release(self, key: Any) -> None:
        """As :meth:`Fetcher.release <hydrax.shards.readahead.fetcher.Fetcher.release>`; never waits."""
        for i in self._routes.pop(key, ()):
            self._children[i].release(key)

    def wait_ready(self) -> None:
        """:meth:`FetchProcess.wait_ready` of each fetch process, started together (the fork server
        starts one after another), waited for together."""
        for child in self._children:
            child.wait_ready()

    @property
    def stats(self) -> dict[str, int]:
        """The fetch processes' statistics, summed."""
        total = dict(EMPTY_STATS)
        for child in self._children:
            for name, value in child.stats.items():
                total[name] = total.get(name, 0) + value
        return total

    def close(self) -> None:
        """Stop every fetch process (see :meth:`FetchProcess.close`)."""
        for child in self._children:
            child.begin_close()
        for child in self._children:
            child.close()


def fetch_main(payload: bytes, options: ReadAhead, root: str, seeded: dict[str, int], writers: set[int],
               commands, replies, environ: dict[str, str]) -> None:
    """Body of the fetch process: a Fetcher for its copy of the ShardSet, fed by ``commands``
    until ``("close",)`` or the training process goes."""
    run_behind(options.fetch_nice)  # first: the threads the fetcher starts inherit it
    adopt_environment(environ)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the training process's to handle
    die_with_parent()
    release_fork_server()
    from .router import store_for

    shards = pickle.loads(payload)
    # Started again after another ended (idle, or dead): what it wrote whole is kept and counted,
    # what it left half-written goes.
    held = rescanned(root, seeded, writers) if writers else seeded
    sending = threading.Lock()  # the fetcher's thread says it is ready, this one answers the rest

    def reply(message: tuple) -> None:
        with sending:
            try:
                replies.send(message)
            except (OSError, ValueError):  # the training process is gone
                pass

    # Ready once the first batch is planned: the training process starts its workers then.
    fetcher = Fetcher(options, root, shards.layout, shards.layout_async,
                      lambda s: store_for(shards.urls[s], shards.options), held, planned=lambda: reply((READY, None)))
    try:
        while True:
            try:
                message = commands.recv()
            except (EOFError, OSError):
                break
            kind = message[0]
            if kind == "updates":
                fetcher.update(message[1])
            elif kind == "stats":
                reply((message[1], dict(fetcher.stats)))
            else:
                break
    finally:
        fetcher.close()
        reply((0, dict(fetcher.stats)))  # the final count, read when the process has ended

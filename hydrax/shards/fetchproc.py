"""The read-ahead of remote shards in a fetch process of its own (see :mod:`hydrax.shards.readahead`).

A :class:`~hydrax.shards.readahead.Fetcher` thread in the training process spent about 2 s of CPU
per GB fetched there, and its Python work held the GIL the training loop needs (the slowest
steps of a pure-Python loop took 2-3x as long). A :class:`FetchProcess` runs the Fetcher in a
child started from the fork server (obstore forbids forking a process that used it), against
its own copy of the ShardSet (a pickled ShardSet is compact and rebuilds its per-process state),
with the same folder, options and files held. The training process only sends announcements
and releases (a few small arrays per batch, handed to a sending thread: it never waits for the
child) and asks for the statistics; no byte fetched passes through it.

A fetch process that dies is started again (up to :data:`MAX_RESTARTS` times) with the batches
still announced; the new one counts what the folder holds and removes what the dead one left
half-written. After that, a thread of the training process takes over the read-ahead the same way. Workers waiting for a file being written check that its writer is alive (see
:func:`~hydrax.shards.readahead.writer_alive`), so a dead fetch process never makes them wait
:data:`~hydrax.shards.readahead.WAIT_S` per sample. :func:`make_fetcher` chooses between the
process and the thread, in one place.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing as mp
import pickle
import queue
import signal
import threading
import time
from typing import Any, Callable

import numpy as np

from ..processes import (adopt_environment, die_with_parent, environment_snapshot, helpers_allowed, release_fork_server,
                         warm_forkserver)
from .readahead import EMPTY_STATS, Fetcher, ReadAhead, held_files

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
#: How long a statistics request waits for the fetch process's answer.
STATS_WAIT_S = 10.0
#: How long :meth:`FetchProcess.close` waits for the fetch process to end before killing it.
CLOSE_WAIT_S = 5.0


def make_fetcher(shards: Any, options: ReadAhead, root: str, held: dict[str, int] | None,
                 thread_fetcher: Callable[[dict[str, int] | None], Fetcher]) -> Any:
    """The read-ahead of ``shards`` (a ShardSet, whose pickle the fetch process gets): a
    :class:`FetchProcess` where :func:`~hydrax.processes.helpers_allowed` allows it and it starts, else the
    Fetcher thread ``thread_fetcher(held)`` makes (which also takes over from fetch processes
    that keep dying, given the files the folder holds then)."""
    if helpers_allowed():
        try:
            return FetchProcess(shards, options, root, held, thread_fetcher)
        except Exception as exc:  # noqa: BLE001  (any failure to start: the thread still reads ahead)
            log.warning("[hydrax] read-ahead runs in the training process (its fetch process did not start: %s)", exc)
    return thread_fetcher(held)


class FetchProcess:
    """A :class:`~hydrax.shards.readahead.Fetcher` in a child process, with the Fetcher's interface
    (:meth:`announce`, :meth:`release`, :meth:`close`, :attr:`stats`).

    The child ends once nothing has been announced for :data:`IDLE_S` (a run ended: its ShardSet
    may live on, held by a DataGroup until the garbage collector frees both), and a new one starts
    with the next announcement, using what the folder holds.
    """

    def __init__(self, shards: Any, options: ReadAhead, root: str, held: dict[str, int] | None,
                 fallback: Callable[[dict[str, int] | None], Fetcher] | None = None) -> None:
        self.options = options
        self._fallback = fallback  # makes the thread that reads ahead once fetch processes keep dying
        self._thread: Fetcher | None = None
        self.root = root
        self._payload = pickle.dumps(shards, protocol=pickle.HIGHEST_PROTOCOL)
        self._announced: dict[Any, tuple] = {}  # announced, not released: handed to a new process
        self._restarts = 0
        self._base = dict(EMPTY_STATS)  # what earlier processes counted
        self._last = dict(EMPTY_STATS)
        self._checked = 0.0
        self._closed = False
        self._lock = threading.Lock()  # between announcing and the sending thread's idle end
        self._stats_lock = threading.Lock()
        self._serial = itertools.count(1)
        self._process = None
        self._start(held, rescan=False)

    def _start(self, held: dict[str, int] | None, rescan: bool) -> None:
        """Start a fetch process and its sending thread."""
        warm_forkserver(main_imports=False)
        ctx = mp.get_context("forkserver")
        commands_r, commands_w = ctx.Pipe(duplex=False)
        replies_r, replies_w = ctx.Pipe(duplex=False)
        process = ctx.Process(target=fetch_main, name="hydrax-fetch", daemon=True,
                              args=(self._payload, self.options, self.root, held, rescan, commands_r, replies_w,
                                    environment_snapshot()))
        process.start()
        commands_r.close()
        replies_w.close()
        # Wait until it is ready: workers that start before it would read the first batches'
        # samples themselves, and it would fetch their chunks again.
        try:
            if replies_r.poll(READY_WAIT_S):
                replies_r.recv()
            else:
                log.warning("[hydrax] the read-ahead fetch process took more than %.0f s to start; going on", READY_WAIT_S)
        except (EOFError, OSError):
            pass  # it died at once: the first check starts another
        self._process, self._replies = process, replies_r
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._broken = self._idle = False
        self._sender = threading.Thread(target=self._send_loop, args=(self._outbox, commands_w), name="hydrax-fetch-send", daemon=True)
        self._sender.start()

    def _send_loop(self, outbox: queue.SimpleQueue, connection) -> None:
        """The sending thread: the training process never waits for the fetch process to read.
        Ends the fetch process once nothing is announced for :data:`IDLE_S`."""
        while True:
            try:
                message = outbox.get(timeout=IDLE_S)
            except queue.Empty:
                with self._lock:
                    if self._announced or not outbox.empty():
                        continue
                    self._idle = True  # from now on, the next announcement starts a new process
                message = ("close",)
            if message is None:
                break
            try:
                connection.send(message)
            except (OSError, ValueError):  # the fetch process died: the next check restarts it
                self._broken = True
                break
            if message[0] == "close":
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
        if not ended and (self._process is None or self._process.is_alive()):
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
            log.warning("[hydrax] the read-ahead fetch process died (exit code %s); starting it again", self._exitcode)
        try:
            self._start(None, rescan=True)
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
        log.warning("[hydrax] the read-ahead fetch process died %d times; %s", self._restarts + 1, how)
        if self._fallback is None:
            return
        try:
            self._thread = self._fallback(held_files(self.root))  # what the dead ones wrote whole
            for key, (shards, samples, order) in self._announced.items():
                self._thread.announce(key, shards, samples, order)
        except Exception:  # noqa: BLE001  (read-ahead is an optimisation: workers still read)
            log.warning("[hydrax] read-ahead stopped; workers read what they need themselves", exc_info=True)
            self._thread = None

    def _retire(self) -> None:
        """Keep the ended process's last statistics and let go of it, its pipes and its sending thread."""
        self._outbox.put(None)
        self._sender.join(CLOSE_WAIT_S)
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
        """As :meth:`Fetcher.announce <hydrax.shards.readahead.Fetcher.announce>`; never waits."""
        self._announced[key] = (shards, samples, order)
        if self._thread is not None:
            self._thread.announce(key, shards, samples, order)
        else:
            self._send(("announce", key, shards, samples, order))

    def release(self, key: Any) -> None:
        """As :meth:`Fetcher.release <hydrax.shards.readahead.Fetcher.release>`; never waits."""
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
                if self._closed or self._process is None or self._broken or not self._process.is_alive():
                    return self._combined()  # a process that died counts what it last said
                serial = next(self._serial)
                self._outbox.put(("stats", serial))
            deadline = time.monotonic() + STATS_WAIT_S
            try:
                while self._replies.poll(max(0.0, deadline - time.monotonic())):
                    answer, stats = self._replies.recv()
                    self._last = stats if stats is not None else self._last
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
        with self._lock:
            self._closed = True
            if self._thread is not None:
                self._thread.close()
            if self._process is None:
                return
            self._outbox.put(("close",))
            self._retire()


def fetch_main(payload: bytes, options: ReadAhead, root: str, held: dict[str, int] | None, rescan: bool,
               commands, replies, environ: dict[str, str]) -> None:
    """Body of the fetch process: a Fetcher for its copy of the ShardSet, fed by ``commands``
    until ``("close",)`` or the training process goes."""
    adopt_environment(environ)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the training process's to handle
    die_with_parent()
    release_fork_server()
    from .store import store_for

    shards = pickle.loads(payload)
    if rescan:
        # Started again after a fetch process died: what it wrote whole is kept and counted,
        # what it left half-written goes.
        held = held_files(root)
    fetcher = Fetcher(options, root, shards.layout, shards.layout_async,
                      lambda s: store_for(shards.urls[s], shards.options), held)
    replies.send((0, None))  # ready: the training process starts its workers once this is here
    try:
        while True:
            try:
                message = commands.recv()
            except (EOFError, OSError):
                break
            kind = message[0]
            if kind == "announce":
                fetcher.announce(*message[1:])
            elif kind == "release":
                fetcher.release(message[1])
            elif kind == "stats":
                replies.send((message[1], dict(fetcher.stats)))
            else:
                break
    finally:
        fetcher.close()
        try:
            replies.send((0, dict(fetcher.stats)))  # the final count, read when the process has ended
        except (OSError, ValueError):
            pass

"""The fetcher: turns the announced batches into requests, in the order they are needed.

A :class:`Fetcher` runs an event loop in a thread of its own (in a fetch process,
:mod:`hydrax.shards.fetchproc`, or where none can start, in the training process). Each
announced batch is planned against what is held: a shard that the announced, unloaded batches
read a good part of (:data:`STREAM_FRACTION`, :data:`RANDOM_STREAM_FRACTION` in a shuffled
order) has its chunks queued by the first batch that needs each, and ``streams`` fetchers take
them in that order, one ranged request for a run of consecutive queued chunks (up to
:data:`SPAN_BYTES`); the samples of other shards are read with ranged requests, neighbours
coalesced (:data:`COALESCE_GAP`), one file each. When a run starts, its first batches' samples
whose chunks are not there yet are also read singly (:data:`URGENT_BYTES`), so the first batch
waits for one round trip rather than for chunks.

What is held and the room left are kept by a :class:`~hydrax.shards.readahead.holdings.Holdings`
(evicting files of loaded batches, least recently used first); where the files go, by the
layout of :mod:`hydrax.shards.readahead.folders`.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import threading
from typing import Any, Callable, Sequence

import numpy as np

from .folders import ShardLayout, chunk_name, sample_name
from .holdings import Holdings, Unit
from .options import ReadAhead

log = logging.getLogger(__name__)

#: Ranged reads of samples closer than this are merged into one request.
COALESCE_GAP = 256 << 10
#: The most bytes one coalesced ranged request covers.
COALESCE_MAX = 8 << 20
#: A shard's chunks are fetched once the announced, unloaded batches read this share of its samples.
STREAM_FRACTION = 0.1
#: The same in any other order.
RANDOM_STREAM_FRACTION = 0.5
#: The most bytes of consecutive queued chunks one request brings.
SPAN_BYTES = 32 << 20
#: When a run starts, the samples of its first batches whose chunks are not there yet are also
#: read singly, up to this many bytes: the first batch then waits for one round trip, not for
#: its chunks (a shuffled batch touches a chunk of nearly every shard).
URGENT_BYTES = 16 << 20
#: ... and of at most this many batches,
URGENT_BATCHES = 4
#: ... in chunks at least this large (a smaller chunk comes as fast as its samples would: those
#: batches fetch it whole instead, charged to :data:`URGENT_BYTES`).
URGENT_CHUNK = 1 << 20
#: Orders in which a group reads whole shards (worth fetching by chunks early).
STREAMING_ORDERS = ("sequential", "shardwise")
#: How long announcements gather before they are planned together (a run's first batch's too:
#: the rest of its burst is counted meanwhile, see :class:`HeldBurst`).
FLUSH_S = 0.002
#: The longest the fetcher waits for the first batch's reads to begin before it says the batch
#: is planned (:class:`Fetcher`'s ``planned``): a read waiting for room in the budget.
BEGIN_WAIT_S = 0.05
#: Announcements planned between two turns of the loop while the rest of a run's first burst is
#: planned (after its first batch's reads went out).
DEFERRED_SLICE = 32
#: A :class:`Fetcher`'s statistics before it has done anything (see ``ShardSet.readahead_stats``).
EMPTY_STATS = {"requests": 0, "bytes": 0, "evicted": 0, "failed": 0, "held_peak": 0, "reused": 0}


class HeldBurst:
    """The rest of a run's first burst of announcements (its whole look-ahead: planning it took
    the loop 20-60 ms), held back until the first batch's reads are out; what arrives meanwhile
    joins it, in order. How many of each shard's samples it reads counts as it arrives, so that
    the first batch is planned (whole chunks, or samples alone?) with all of the burst that
    came before its plan, however the training process's sending thread split it."""

    def __init__(self) -> None:
        self.messages: list[tuple] | None = None
        self._draining = False

    def hold(self, messages: Sequence[tuple], outstanding: dict[int, int]) -> None:
        """Hold ``messages`` after those held already, adding their announced samples to
        ``outstanding`` (shard -> count)."""
        if self.messages is None:
            self.messages = []
        self.messages.extend(messages)
        announced = [m for m in messages if m[0] == "announce"]
        if announced:
            shards, counts = np.unique(np.concatenate([m[2] for m in announced]), return_counts=True)
            for shard, n in zip(shards.tolist(), counts.tolist()):
                outstanding[shard] = outstanding.get(shard, 0) + n

    def release(self, loop: asyncio.AbstractEventLoop, apply: Callable[[tuple, bool], None]) -> None:
        """Hand what is held to ``apply(message, counted=True)`` (its samples were counted when it
        was held) from a task on ``loop`` (one task, however often this is called before it ends)."""
        if self.messages is not None and not self._draining:
            self._draining = True
            loop.create_task(self._release_to(apply))

    async def _release_to(self, apply: Callable[[tuple, bool], None]) -> None:
        """:data:`DEFERRED_SLICE` messages between two turns of the loop, so that the first
        batch's reads go on meanwhile."""
        done = 0
        while done < len(self.messages):  # (which what arrives meanwhile extends)
            part = self.messages[done : done + DEFERRED_SLICE]
            done += len(part)
            for message in part:
                apply(message, True)
            await asyncio.sleep(0)
        self.messages, self._draining = None, False


class Fetcher:
    """The read-ahead thread of one ShardSet (see :mod:`hydrax.shards.readahead`), in a fetch process
    (:class:`~hydrax.shards.fetchproc.FetchProcess`) or, where none can start, in the main process.

    ``layout(shard)`` returns the :class:`~hydrax.shards.readahead.folders.ShardLayout` of a
    shard (loading its index if needed); ``store(shard)`` its :class:`~hydrax.shards.store.Store`.
    ``held`` (path -> size): files already written under ``root`` for it (by a
    :class:`~hydrax.shards.readahead.seeder.ChunkSeeder`), counted as held from the start and
    used as they are (its :class:`~hydrax.shards.readahead.holdings.Holdings` keeps them, with
    every file it writes, within the budget). ``planned`` is called once, on the fetcher's
    thread, when the first batch announced has been planned: its reads have begun (workers
    that need its samples now wait for them rather than read them too).
    """

    def __init__(self, options: ReadAhead, root: str, layout: Callable[[int], ShardLayout],
                 layout_async: Callable[[int], Any], store: Callable[[int], Any], held: dict[str, int] | None = None,
                 planned: Callable[[], None] | None = None) -> None:
        self.options = options
        self.root = root
        self._layout = layout
        self._layout_async = layout_async
        self._store = store
        self._batches: dict[Any, list[Unit]] = {}
        self._outstanding: dict[int, int] = {}  # shard -> samples announced, not yet released
        self._counts: dict[Any, dict[int, int]] = {}
        self._pending: list[tuple] = []
        self._burst = HeldBurst()  # the rest of a run's first burst, while its first batch is planned
        self._unplanned: set[Any] = set()
        self._flush_scheduled = False
        self._planned = planned
        self._rank = 0  # announcements so far: the order batches are needed in
        self._ranks: dict[Any, int] = {}
        self._queue: list[tuple[int, int, int]] = []  # heap of (rank of the first batch needing it, shard, chunk)
        self._urgent_left = 0
        self._urgent_until = 0
        self.stats = dict(EMPTY_STATS)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._work: asyncio.Condition | None = None
        self._requests: asyncio.Semaphore | None = None
        self._closed = False
        self._holdings = Holdings(options.max_bytes, root, layout, self.stats)  # the files held, and the room left
        if options.cache_dir is not None:
            self._holdings.adopt_existing()
        if held:
            self._holdings.adopt_held(held)
        self._thread = threading.Thread(target=self._run, name="hydrax-readahead", daemon=True)
        self._thread.start()
        self._ready.wait()

    # -- thread and loop ---------------------------------------------------------------------
    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._holdings.room = asyncio.Condition()
        self._work = asyncio.Condition()
        self._requests = asyncio.Semaphore(self.options.requests)
        for _ in range(self.options.streams):
            self._loop.create_task(self._fetch_chunks())
        self._ready.set()
        self._loop.run_forever()
        pending = asyncio.all_tasks(self._loop)
        for task in pending:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self._loop.close()

    def _call(self, function, *args) -> None:
        if not self._closed:
            self._loop.call_soon_threadsafe(function, *args)

    def close(self) -> None:
        """Stop fetching (files already written stay until the directory is removed)."""
        if self._closed:
            return
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    # -- announcements (any thread) ----------------------------------------------------------
    def announce(self, key: Any, shards: np.ndarray, samples: np.ndarray, order: str) -> None:
        """Batch ``key`` will read ``samples`` of ``shards`` (parallel arrays), in ``order``;
        batches are announced in the order they are needed."""
        self._call(self._announce, key, shards, samples, order)

    def release(self, key: Any) -> None:
        """Batch ``key`` is loaded: what it needed may be evicted."""
        self._call(self._release, key)

    def update(self, messages: Sequence[tuple]) -> None:
        """:meth:`announce` (``("announce", key, shards, samples, order)``) and :meth:`release`
        (``("release", key)``) of each of ``messages`` in turn, in one call on the loop."""
        self._call(self._update, messages)

    # -- on the loop -------------------------------------------------------------------------
    def _update(self, messages: Sequence[tuple]) -> None:
        if self._burst.messages is not None:  # a run's first burst is held back: these come after it
            self._burst.hold(messages, self._outstanding)
            return
        for position, message in enumerate(messages):
            starting = message[0] == "announce" and not self._counts
            self._apply(message)
            if starting:  # (the rest of the burst may come in later messages: it is held too)
                self._burst.hold(messages[position + 1 :], self._outstanding)
                return

    def _apply(self, message: tuple, counted: bool = False) -> None:
        if message[0] == "announce":
            self._announce(*message[1:], counted=counted)
        else:
            self._release(message[1])

    def _announce(self, key: Any, shards: np.ndarray, samples: np.ndarray, order: str, counted: bool = False) -> None:
        if not self._counts:
            # Nothing announced is waiting: a run starts (or resumes). Its first batches cannot
            # wait for chunks: their samples are also read singly, up to URGENT_BYTES.
            self._urgent_left = min(URGENT_BYTES, self.options.max_bytes // 4)
            self._urgent_until = self._rank + URGENT_BATCHES
        # Announcements come in bursts (a whole look-ahead at the start of a run): plan them
        # together, so the choice between fetching a shard's chunks and reading its samples sees them all.
        counts = dict(zip(*(a.tolist() for a in np.unique(shards, return_counts=True))))
        if not counted:  # (a held burst's samples were counted as it was held)
            for shard, n in counts.items():
                self._outstanding[shard] = self._outstanding.get(shard, 0) + n
        self._counts[key] = counts
        self._rank += 1
        self._ranks[key] = self._rank
        self._pending.append((key, shards, samples, order))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_later(FLUSH_S, lambda: self._loop.create_task(self._flush()))

    async def _limited(self, function, *args):
        async with self._requests:
            return await function(*args)

    async def _flush(self) -> None:
        self._flush_scheduled = False
        pending, self._pending = self._pending, []
        # The burst is planned in slices of 1, 2, 4, ... batches, each once the indexes it needs
        # are loaded (many at once): the first batch's reads start after one round of index
        # loads, not after the whole look-ahead's.
        first = 0
        try:
            while first < len(pending):
                part = pending[first : 2 * first + 1]
                first += len(part)
                unindexed = await load_layouts(part, lambda s: self._limited(self._layout_async, s))
                # Ranged reads of a slice are coalesced together (neighbours are often announced by
                # different batches), and sent in the order of the first batch that needs each.
                random_wanted: dict[int, dict[int, int]] = {}
                for item in part:
                    rank = self._ranks.get(item[0], self._rank)
                    for shard, samples in self._plan(*item, unindexed).items():
                        wanted = random_wanted.setdefault(shard, {})
                        for sample in samples:
                            wanted.setdefault(sample, rank)
                runs = [(min(wanted[s] for s in run), shard, run) for shard, wanted in random_wanted.items()
                        for run in _coalesce(self._layout(shard), sorted(wanted))]
                for _, shard, run in sorted(runs, key=lambda r: r[:2]):
                    self._loop.create_task(self._read_run(shard, run))
                if self._queue:
                    async with self._work:
                        self._work.notify_all()
                self._tell_planned([item[0] for item in part])
        finally:  # whatever became of the first batch, the rest of the burst is planned
            self._tell_planned([])
            self._burst.release(self._loop, self._apply)

    def _tell_planned(self, keys: list) -> None:
        planned, self._planned = self._planned, None  # (once: for a run's first batch)
        if planned is not None:
            units = [unit for key in keys for unit in self._batches.get(key, ())]
            self._loop.create_task(when_begun(units, self._requests, planned))

    def _plan(self, key: Any, shards: np.ndarray, samples: np.ndarray, order: str, unindexed: set[int]) -> dict[int, list[int]]:
        """Refer batch ``key`` to the files it needs and queue the chunks to fetch; returns the
        samples to read with ranged requests, by shard. The ``unindexed`` shards' indexes just
        failed to load: they are left to the workers' own reads, which report why (loading again
        here would block the event loop for a second failure)."""
        if key in self._unplanned:
            self._unplanned.discard(key)
            return {}
        rank = self._ranks.get(key, self._rank)
        needed: list[Unit] = []
        random_wanted: dict[int, list[int]] = {}
        for shard in np.unique(shards).tolist():
            if shard in unindexed:
                continue
            try:
                layout = self._layout(shard)
            except Exception as exc:  # the worker's own read will report it
                log.debug("read-ahead: no layout for shard %d: %s", shard, exc)
                continue
            # Fetch a shard's chunks when the batches announced and not yet loaded read a good
            # part of it (in a shuffled order, most of it: the look-ahead then covers much of the
            # epoch); a few items of a shard (items spilled from another partition, say) are read alone.
            fraction = STREAM_FRACTION if order in STREAMING_ORDERS else RANDOM_STREAM_FRACTION
            by_chunk = self._outstanding.get(shard, 0) >= fraction * len(layout.starts)
            chosen = samples[shards == shard]
            chunks = np.searchsorted(layout.chunks, chosen, side="right") - 1
            for chunk in np.unique(chunks).tolist():
                unit = self._holdings.unit(shard, chunk_name(chunk), _span_size(layout, chunk))
                # A run's first batches fetch a small chunk whole whatever the counts say: it
                # comes as fast as its samples, and the counts may not have all of the run's
                # first burst yet (the training process sends it in parts).
                urgent = self._urgent_left > 0 and rank <= self._urgent_until
                singly = not by_chunk and not (urgent and unit.size < URGENT_CHUNK) and unit.state == "absent"
                if not singly:
                    needed.append(unit)
                    if unit.state == "absent":
                        unit.state = "queued"
                        heapq.heappush(self._queue, (rank, shard, chunk))
                        if not by_chunk:
                            self._urgent_left -= unit.size
                    if unit.state == "present" or not urgent or unit.size < URGENT_CHUNK:
                        continue
                for sample in chosen[chunks == chunk].tolist():
                    s_unit = self._holdings.unit(shard, sample_name(sample), int(layout.ends[sample] - layout.starts[sample]))
                    needed.append(s_unit)
                    if s_unit.state == "absent":
                        s_unit.state = "queued"
                        random_wanted.setdefault(shard, []).append(sample)
                        if not singly:
                            self._urgent_left -= s_unit.size
        for unit in needed:
            unit.refs += 1
        self._batches[key] = needed
        return random_wanted

    def _release(self, key: Any) -> None:
        self._ranks.pop(key, None)
        if key not in self._batches:  # loaded before it was planned: plan nothing for it
            self._unplanned.add(key)
            self._outstanding_drop(key)
            return
        for unit in self._batches.pop(key, ()):
            unit.refs -= 1
            if unit.refs <= 0 and unit.state == "absent":
                self._holdings.forget(unit)
        self._outstanding_drop(key)
        self._loop.create_task(self._holdings.notify())

    def _outstanding_drop(self, key: Any) -> None:
        for shard, n in self._counts.pop(key, {}).items():
            self._outstanding[shard] -= n

    async def _next_span(self) -> tuple[int, int, list[int]]:
        """``(rank, shard, chunks)``: the queued chunk the earliest batch needs, with the queued
        chunks that follow it in its shard (one request brings up to :data:`SPAN_BYTES`); waits
        while none is queued. Chunks no announced batch needs any more are dropped."""
        async with self._work:
            while True:
                while self._queue:
                    rank, shard, chunk = heapq.heappop(self._queue)
                    unit = self._holdings.units.get((shard, chunk_name(chunk)))
                    if unit is None or unit.state != "queued":
                        continue
                    if unit.refs <= 0:
                        unit.state = "absent"
                        self._holdings.forget(unit)
                        continue
                    span = [chunk]
                    layout = self._layout(shard)
                    size = unit.size
                    while span[-1] + 1 < len(layout.chunks) and size < SPAN_BYTES:
                        follower = self._holdings.units.get((shard, chunk_name(span[-1] + 1)))
                        if follower is None or follower.state != "queued" or follower.refs <= 0:
                            break
                        span.append(span[-1] + 1)
                        size += follower.size
                    for c in span:
                        self._holdings.units[(shard, chunk_name(c))].state = "claimed"
                    return rank, shard, span
                await self._work.wait()

    async def _fetch_chunks(self) -> None:
        """One of ``streams`` fetchers: takes spans of queued chunks, most urgent first."""
        while True:
            rank, shard, span = await self._next_span()
            try:
                await self._fetch_span(rank, shard, span)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.stats["failed"] += 1
                log.warning("read-ahead of %s stopped (workers read its samples themselves): %s", self._layout(shard).url, exc)
            finally:
                for chunk in span:  # what was not written goes back to absent: needed again, it is queued again
                    unit = self._holdings.units.get((shard, chunk_name(chunk)))
                    if unit is not None and unit.state == "claimed":
                        unit.state = "absent"

    async def _fetch_span(self, rank: int, shard: int, span: list[int]) -> None:
        """One ranged request for the consecutive chunks ``span`` of ``shard``, writing each chunk
        file as it fills (workers map a chunk as soon as it is renamed into place)."""
        layout = self._layout(shard)
        units = [self._holdings.units[(shard, chunk_name(c))] for c in span]
        # Room for the chunks before the request is sent (waiting for the first only; the span
        # ends where the budget has no room now): a fetcher waiting for room holds no response
        # open, and fetches nothing its batches stopped needing meanwhile.
        if not await self._holdings.reserve_needed(units[0]):
            return
        count = 1
        while count < len(units) and await self._holdings.reserve_needed(units[count], wait=False):
            count += 1
        for chunk, unit in zip(span[count:], units[count:]):  # back in the queue, as they were
            if unit.refs > 0:
                unit.state = "queued"
                heapq.heappush(self._queue, (rank, shard, chunk))
        span, units = span[:count], units[:count]
        parts: list[str] = []
        index = 0
        f = None
        try:
            # Workers that need these chunks wait for them from now on rather than read their samples.
            for unit in units:
                parts.append(self._holdings.begin(unit, layout.directory))
            start, end = layout.chunk_span(span[0])[0], layout.chunk_span(span[-1])[1]
            self.stats["requests"] += 1
            position = start
            async for piece in self._store(shard).stream_async(layout.url, start, end, version=layout.version):
                view = memoryview(piece)
                self.stats["bytes"] += len(view)
                while len(view) and index < len(span):
                    chunk_start, chunk_end = layout.chunk_span(span[index])
                    gap = chunk_start - position  # bytes between chunks (tar headers)
                    if gap > 0:
                        step = min(gap, len(view))
                        view, position = view[step:], position + step
                        continue
                    if f is None:
                        f = open(parts[index], "wb")
                    take = min(chunk_end - position, len(view))
                    f.write(view[:take])
                    view, position = view[take:], position + take
                    if position == chunk_end:
                        f.close()
                        f = None
                        self._holdings.finish(units[index], layout.directory, parts[index])
                        index += 1
        finally:
            if f is not None:
                f.close()
            for i in range(index, len(units)):
                if i < len(parts):
                    self._holdings.abandon(units[i], parts[i])
                else:  # reserved, never begun
                    units[i].state = "absent"
                    self._holdings.bytes -= units[i].size

    async def _read_run(self, shard: int, run: Sequence[int]) -> None:
        """One ranged request for the consecutive-ish samples ``run``, written one file each."""
        layout = self._layout(shard)
        units = [self._holdings.units.get((shard, sample_name(s))) for s in run]
        reserved = 0
        parts: list[str] = []
        try:
            for unit in units:
                if unit is None or not await self._holdings.reserve(unit):
                    for held in units[:reserved]:  # give back what was reserved; workers read these themselves
                        held.state = "absent"
                        self._holdings.bytes -= held.size
                    for rest in units[reserved:]:
                        if rest is not None and rest.state == "queued":
                            rest.state = "absent"
                    return
                reserved += 1
            async with self._requests:
                # Samples whose batches were loaded while this waited its turn (their workers read
                # them) are not read again.
                while units and units[0].refs <= 0:
                    self._holdings.give_back(units.pop(0))
                    run = run[1:]
                while units and units[-1].refs <= 0:
                    self._holdings.give_back(units.pop())
                    run = run[:-1]
                if not units:
                    return
                start, end = int(layout.starts[run[0]]), int(layout.ends[run[-1]])
                # Workers that need these samples wait for them from now on rather than read them
                # too (not before: while the request waits its turn, a worker's own read is sooner).
                parts = [self._holdings.begin(unit, layout.directory) for unit in units]
                self.stats["requests"] += 1
                data = memoryview(await self._store(shard).read_async(layout.url, start, end - start, version=layout.version))
            self.stats["bytes"] += len(data)
            for sample, unit, part in zip(run, units, parts):
                with open(part, "wb") as f:
                    f.write(data[int(layout.starts[sample]) - start : int(layout.ends[sample]) - start])
                self._holdings.finish(unit, layout.directory, part)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.stats["failed"] += 1
            log.warning("read-ahead of %d samples of %s failed (workers read them themselves): %s", len(run), layout.url, exc)
            for i, unit in enumerate(units):
                if unit is not None and unit.state != "present":
                    self._holdings.abandon(unit, parts[i] if i < len(parts) else None)
                    if i >= len(parts) and i < reserved:
                        self._holdings.bytes -= unit.size


async def load_layouts(pending: list[tuple], load: Callable[[int], Any]) -> set[int]:
    """Load the indexes of the shards ``pending`` announcements read (those a manifest gave only
    counts for) with ``load(shard)``, many at once; returns the shards whose index failed to load."""
    shards = sorted({s for _, shards, _, _ in pending for s in np.unique(shards).tolist()})
    results = await asyncio.gather(*(load(s) for s in shards), return_exceptions=True)
    unindexed = set()
    for shard, result in zip(shards, results):
        if isinstance(result, BaseException):
            log.debug("read-ahead: no index for shard %d: %s", shard, result)
            unindexed.add(shard)
    return unindexed


async def when_begun(units: Sequence[Unit], requests: asyncio.Semaphore, then: Callable[[], None]) -> None:
    """Call ``then`` once the reads of ``units`` have begun their files (a worker that looks then
    finds them), or wait: for one of the ``requests`` slots, or for room in the budget (at most
    :data:`BEGIN_WAIT_S`)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + BEGIN_WAIT_S
    while any(unit.state in ("queued", "claimed") for unit in units) and not requests.locked() and loop.time() < deadline:
        await asyncio.sleep(0.001)
    then()


def _span_size(layout: ShardLayout, chunk: int) -> int:
    start, end = layout.chunk_span(chunk)
    return end - start


def _coalesce(layout: ShardLayout, samples: Sequence[int]) -> list[list[int]]:
    """Group sorted ``samples`` of one shard into runs that one ranged request serves."""
    runs: list[list[int]] = []
    for sample in samples:
        if runs:
            run = runs[-1]
            gap = int(layout.starts[sample]) - int(layout.ends[run[-1]])
            if 0 <= gap <= COALESCE_GAP and int(layout.ends[sample]) - int(layout.starts[run[0]]) <= COALESCE_MAX:
                run.append(sample)
                continue
        runs.append([sample])
    return runs

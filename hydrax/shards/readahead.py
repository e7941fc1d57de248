"""Read-ahead for remote shards: fetch what the schedule will read before the workers ask for it.

The schedule is a pure function of (seed, epoch), so the main process knows long in advance which
samples each batch holds. The Dataloader announces upcoming batches to their data
(``data.prefetch(key, indices, order)``, in the order they will be loaded, then
``data.release(key)`` once the batch is loaded); for a :class:`~hydrax.shards.ShardSet` with
remote shards, a :class:`Fetcher` thread turns those announcements into requests, many in flight
at once, and writes what arrives as files under one directory that every worker of the host reads.
The thread runs in a fetch process of its own (:mod:`hydrax.shards.fetchproc`), so the training
process spends no CPU, and holds no GIL, per byte fetched; a larger host runs a pool of them,
each with the shards a hash of their URL gives it (:func:`fetch_process_count`); where no such
process can start, in the main process.

- each shard is cut into sample-aligned chunks of about :data:`CHUNK_BYTES` (``c000012``), so a
  sample never spans two files and a worker reads it zero-copy from a mapping. When the announced
  batches read a good part of a shard (most of it, in a shuffled order), the chunks they need
  are queued by the first batch that needs each, and ``streams`` fetchers take them in that
  order, one ranged request for a run of consecutive queued chunks (up to :data:`SPAN_BYTES`);
  a chunk is visible to workers as soon as it is complete;
- otherwise (a few samples of a shard: a budget far below the data, in a shuffled order) the
  announced samples are read with ranged requests, neighbours coalesced into one request, and
  written one file per sample (``s00000042``);
- when a run starts, its first batches' samples whose chunks are not there yet are also read
  singly (up to :data:`URGENT_BYTES`), so the first batch waits for one round trip rather than
  for chunks; a shuffled batch touches a chunk of nearly every shard.

A file is written under a temporary name (``.c000012.part``, made when its request is sent) and
renamed when complete; a worker that needs a sample whose file is on its way waits for it, and
one whose sample was not read ahead reads it itself (one ranged request), so read-ahead never
blocks progress; nor does a writer that died (:data:`WRITER_FILE` in each shard's folder names
it, and waiting workers check it lives). Reads are pinned to the version (ETag) each shard was
indexed at.

Memory is bounded by a budget (:class:`Budget`): ``ReadAhead(max_bytes=...)`` when given, else
sized for the run by :func:`choose_budget`: the remote data itself when the host can hold it (an
epoch is then read once, and later epochs read nothing), else a share of the host's available
memory (or, for a persistent ``cache_dir``, of its disk). Files of batches that are loaded are
evicted, least recently used first, to make room; when everything held is still needed, the
fetcher waits. By default the directory is private to the process, in memory (``/dev/shm``)
where that has room, and removed when the ShardSet goes away (and swept on a later start if the
process was killed); with ``cache_dir`` it persists, so later epochs and runs skip downloads of
what it still holds.

Set-up may fill the read-ahead before any run: a shard without an index object is read whole to
index it, and a :class:`ChunkSeeder` cuts those bytes into the same chunk files, while the budget
has room; the Fetcher counts them as held from its start (``Fetcher(..., held=...)``) and fetches
only what they lack.
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import logging
import os
import re
import shutil
import tempfile
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..procs.liveness import process_alive
from ..procs.processes import at_server_exit

log = logging.getLogger(__name__)

#: Usable cores per fetch process when ``ReadAhead(fetch_processes=None)``. A fetch process spends
#: about 2 s of CPU per GB it moves, a loader decoding 100 kB photos about 11.5 s per GB it
#: decodes: the storage guide's model of a host ("Throughput per host") balances them at one
#: fetch process per 7 cores; loaders that only copy bytes would want more.
CORES_PER_FETCH_PROCESS = 8
#: The most fetch processes chosen by default (a 224-core host gets 28).
MAX_FETCH_PROCESSES = 32
#: Target size of a streamed chunk file; chunks end on sample boundaries, so one sample larger
#: than this is a chunk of its own.
CHUNK_BYTES = 8 << 20
#: Ranged reads of samples closer than this are merged into one request.
COALESCE_GAP = 256 << 10
#: The most bytes one coalesced ranged request covers.
COALESCE_MAX = 8 << 20
#: How long a worker waits for a file being written before reading the sample itself.
WAIT_S = 15.0
#: A temporary file in a persistent cache untouched this long was left by a killed process.
STALE_PART_S = 600
_PRIVATE_PREFIX = "hydrax-readahead-"
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
#: ... in chunks at least this large (a smaller chunk comes as fast as its samples would).
URGENT_CHUNK = 1 << 20
#: Orders in which a group reads whole shards (worth fetching by chunks early).
STREAMING_ORDERS = ("sequential", "shardwise")
#: The least budget :func:`choose_budget` picks: a few chunks for each stream.
MIN_BUDGET = 64 << 20
#: The share of the host's available memory a self-sized budget may take (the workers, the
#: trainer and the page cache need the rest).
MEMORY_SHARE = 0.25
#: The share of free disk space it may take (of a persistent ``cache_dir``, or of a small
#: temporary file system).
DISK_SHARE = 0.5


@dataclass(frozen=True)
class ReadAhead:
    """How remote shards are read ahead (``ShardSet(..., readahead=ReadAhead(...))``).

    :param max_bytes: the most bytes held read ahead (and cached) at once; None (the default):
        sized for the run and the host (:func:`choose_budget`; the choice is
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
    """

    max_bytes: int | None = None
    cache_dir: str | None = None
    requests: int = 32
    streams: int = 8
    enabled: bool = True
    fetch_processes: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_bytes", "requests", "streams", "fetch_processes"):
            value = getattr(self, name)
            if name in ("max_bytes", "fetch_processes") and value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                optional = " or None" if name in ("max_bytes", "fetch_processes") else ""
                raise ValueError(f"ReadAhead({name}=...) must be a positive int{optional}, got {value!r}")


@dataclass(frozen=True)
class Budget:
    """The read-ahead budget of a ShardSet, and where it came from.

    :param bytes: the most bytes held read ahead at once.
    :param data_bytes: the bytes of the set's remote shards (all that could ever be worth holding).
    :param cap: the most the host allowed (None when ``max_bytes`` was given).
    :param source: ``"given"`` (``ReadAhead(max_bytes=...)``), ``"data"`` (the data fits: every
        byte is read once), ``"memory"`` or ``"disk"`` (the host's share was the limit).
    """

    bytes: int
    data_bytes: int
    cap: int | None
    source: str

    @property
    def holds_data(self) -> bool:
        """Whether the budget holds every remote byte of the set (a whole epoch read ahead)."""
        return self.bytes >= self.data_bytes

    def describe(self) -> str:
        """The budget in words, for a log line or ``hydrax bench``."""
        gb = lambda n: f"{n / 1e9:,.2f} GB"  # noqa: E731
        why = {"given": "given as ReadAhead(max_bytes=...)", "data": f"the data's {gb(self.data_bytes)} and room to spare",
               "memory": f"{MEMORY_SHARE:.0%} of available memory", "disk": f"{DISK_SHARE:.0%} of free disk space"}[self.source]
        held = "holds all" if self.holds_data else f"holds {self.bytes / max(1, self.data_bytes):.0%}"
        return f"read-ahead budget {gb(self.bytes)} ({why}; {held} of the remote data)"


def data_budget(data_bytes: int) -> int:
    """The budget that holds ``data_bytes`` of remote data whole: the data, an eighth more for
    samples read singly before their chunks, and :data:`MIN_BUDGET`."""
    return data_bytes + data_bytes // 8 + MIN_BUDGET


def choose_budget(max_bytes: int | None, data_bytes: int, available_memory: int, free_disk: int, persistent: bool) -> Budget:
    """The read-ahead budget for ``data_bytes`` of remote shards on a host with ``available_memory``
    bytes free and ``free_disk`` bytes free where the files go (a pure function).

    ``max_bytes``, when given, is the budget. Otherwise the data itself, with an eighth more for
    samples read singly before their shard's stream (and :data:`MIN_BUDGET`), when the host can
    hold it: :data:`MEMORY_SHARE` of its available memory for a private folder, :data:`DISK_SHARE`
    of the free space of a persistent ``cache_dir`` (or of a temporary file system smaller than
    that); else that share. Never less than :data:`MIN_BUDGET`.
    """
    if max_bytes is not None:
        return Budget(int(max_bytes), data_bytes, None, "given")
    cap, source = int(DISK_SHARE * free_disk), "disk"
    if not persistent and int(MEMORY_SHARE * available_memory) <= cap:
        cap, source = int(MEMORY_SHARE * available_memory), "memory"
    cap = max(MIN_BUDGET, cap)
    wanted = data_budget(data_bytes)
    if wanted <= cap:
        return Budget(wanted, data_bytes, cap, "data")
    return Budget(cap, data_bytes, cap, source)


def _cgroup_room() -> int | None:
    """What the memory limit of this process's cgroup leaves, where one is set (a container)."""
    for limit_path, used_path in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                  ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit_path) as f:
                limit = f.read().strip()
            with open(used_path) as f:
                used = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 1 << 60:  # "max", or v1's "no limit", is no limit
            return max(0, int(limit) - used)
    return None


def host_room(folder: str) -> tuple[int, int]:
    """``(available memory, free disk space in folder)`` in bytes, as :func:`choose_budget` takes
    them: the kernel's ``MemAvailable``, or less under a cgroup memory limit."""
    available = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if not available:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    room = _cgroup_room()
    if room is not None:
        available = min(available, room)
    try:
        stat = os.statvfs(folder)
        free = stat.f_bavail * stat.f_frsize
    except OSError:
        free = available
    return available, free


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


def chunk_starts(starts: np.ndarray, ends: np.ndarray, target: int = CHUNK_BYTES) -> np.ndarray:
    """The first sample of every chunk of a shard whose samples span ``[starts[i], ends[i])``.

    A chunk takes samples until it holds at least ``target`` bytes; the result starts with 0.
    Pure and deterministic, so workers find the chunk of a sample without asking.
    """
    firsts = [0]
    chunk_start = int(starts[0]) if len(starts) else 0
    for i in range(1, len(starts)):
        if int(ends[i - 1]) - chunk_start >= target:
            firsts.append(i)
            chunk_start = int(starts[i])
    return np.asarray(firsts, np.int64)


def object_dir(root: str, url: str, version: str | None) -> str:
    """The directory of one object version under ``root``."""
    digest = hashlib.sha256(f"{url}\n{version}".encode()).hexdigest()[:32]
    return os.path.join(root, digest)


def chunk_name(chunk: int) -> str:
    return f"c{chunk:06d}"


def sample_name(sample: int) -> str:
    return f"s{sample:08d}"


def part_name(name: str) -> str:
    return f".{name}.part"


#: Where a private read-ahead folder goes when it fits: memory, like the budget it holds (a disk
#: file system would add its writeback to every byte the fetcher writes).
MEMORY_FOLDER = "/dev/shm"


def private_bases() -> list[str]:
    """The folders private read-ahead folders are made in (and swept from)."""
    bases = [tempfile.gettempdir()]
    if os.path.isdir(MEMORY_FOLDER) and os.access(MEMORY_FOLDER, os.W_OK | os.X_OK):
        bases.insert(0, MEMORY_FOLDER)
    return bases


def private_base(wanted: int) -> str:
    """Where a new private read-ahead folder for a budget of up to ``wanted`` bytes goes:
    :data:`MEMORY_FOLDER` when its free space leaves the budget as large as memory would (not a
    container's 64 MiB one), else the temporary directory."""
    bases = private_bases()
    if bases[0] == MEMORY_FOLDER and memory_folder_fits(wanted, *host_room(MEMORY_FOLDER)):
        return MEMORY_FOLDER
    return bases[-1]


def memory_folder_fits(wanted: int, available: int, free: int) -> bool:
    """Whether a memory folder with ``free`` bytes free leaves a budget of up to ``wanted`` bytes
    as large as ``available`` memory would (:func:`choose_budget`'s shares; a pure function)."""
    return DISK_SHARE * free >= min(wanted, MEMORY_SHARE * available)


def private_root(wanted: int = 0) -> str:
    """A new private read-ahead directory, for a budget of up to ``wanted`` bytes (see
    :func:`private_base`); directories of dead processes are swept first."""
    sweep_dead_roots()
    return tempfile.mkdtemp(prefix=f"{_PRIVATE_PREFIX}{os.getpid()}-", dir=private_base(wanted))


def sweep_dead_roots() -> None:
    """Remove the private read-ahead directories of processes that are gone (killed: a live one
    removes its own)."""
    pattern = re.compile(re.escape(_PRIVATE_PREFIX) + r"(\d+)-")
    for base in private_bases():
        try:
            entries = os.listdir(base)
        except OSError:
            entries = []
        for entry in entries:
            match = pattern.match(entry)
            if match and not process_alive(int(match.group(1))):
                shutil.rmtree(os.path.join(base, entry), ignore_errors=True)


# A fork server outlives a killed main process by a moment: it sweeps that process's folder (in
# /dev/shm, where it held memory) as it exits, rather than leave it to a later hydrax process.
at_server_exit(sweep_dead_roots)


#: A :class:`Fetcher`'s statistics before it has done anything (see ``ShardSet.readahead_stats``).
EMPTY_STATS = {"requests": 0, "bytes": 0, "evicted": 0, "failed": 0, "held_peak": 0, "reused": 0}
#: The file in a shard's read-ahead folder that names the process writing its files (its pid), so
#: that a worker waiting for a file being written stops waiting when that process is gone.
WRITER_FILE = ".writer"
#: How often a waiting worker checks that the writer lives.
WRITER_CHECK_S = 0.1


def claim_writer(folder: str) -> None:
    """Record this process as the writer of the files in the shard folder ``folder`` (see
    :data:`WRITER_FILE`): one process writes each folder's files (a pool of fetch processes
    splits the shards between them)."""
    os.makedirs(folder, exist_ok=True)
    temporary = os.path.join(folder, f"{WRITER_FILE}.{os.getpid()}")
    with open(temporary, "w") as f:
        f.write(str(os.getpid()))
    os.replace(temporary, os.path.join(folder, WRITER_FILE))


def folder_writer(folder: str) -> int | None:
    """The pid :data:`WRITER_FILE` names in ``folder``, or None."""
    try:
        with open(os.path.join(folder, WRITER_FILE)) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def writer_alive(folder: str) -> bool:
    """Whether the process that writes the files in ``folder`` lives (True when none is named)."""
    pid = folder_writer(folder)
    return pid is None or process_alive(pid)


def held_files(root: str, stale_s: float = 0.0, writers: set[int] | None = None) -> dict[str, int]:
    """``path -> size`` of the complete files under ``root``, oldest first; the temporary files
    there older than ``stale_s`` seconds are removed. With 0, all of them: a fetch process started
    again after another ended keeps what that one wrote whole, and drops what it left half-written.
    A persistent cache passes :data:`STALE_PART_S`, as another live process may be writing there.
    With ``writers`` (pids), only the folders one of them wrote to (see :func:`claim_writer`) are
    looked at: those of one fetch process of a pool, whose siblings are writing the others."""
    found = []
    for folder in os.scandir(root) if os.path.isdir(root) else ():
        if not folder.is_dir() or (writers is not None and folder_writer(folder.path) not in writers):
            continue
        for entry in os.scandir(folder.path):
            try:
                if entry.name == WRITER_FILE:
                    continue
                stat = entry.stat()
                if not entry.name.startswith("."):
                    found.append((stat.st_mtime_ns, entry.path, stat.st_size))
                elif time.time() - stat.st_mtime >= stale_s:
                    os.unlink(entry.path)
            except OSError:
                pass
    return {path: size for _, path, size in sorted(found)}


def remove_private_root(root: str, owner: int) -> None:
    """Remove ``root`` if this process made it (a forked copy of its owner must not)."""
    if os.getpid() == owner:
        shutil.rmtree(root, ignore_errors=True)


class ShardLayout:
    """What the fetcher and the workers need to know of one shard: where it is, its version, and
    where its samples and chunks are."""

    __slots__ = ("url", "version", "starts", "ends", "chunks", "directory")

    def __init__(self, url: str, version: str | None, starts: np.ndarray, ends: np.ndarray, root: str) -> None:
        self.url = url
        self.version = version
        self.starts = starts
        self.ends = ends
        self.chunks = chunk_starts(starts, ends)
        self.directory = object_dir(root, url, version)

    def chunk_of(self, sample: int) -> int:
        return int(np.searchsorted(self.chunks, sample, side="right")) - 1

    def chunk_span(self, chunk: int) -> tuple[int, int]:
        """Byte range ``[start, end)`` of chunk ``chunk`` in the shard."""
        first = int(self.chunks[chunk])
        last = int(self.chunks[chunk + 1]) - 1 if chunk + 1 < len(self.chunks) else len(self.starts) - 1
        return int(self.starts[first]), int(self.ends[last])


class ChunkSeeder:
    """Chunk files cut from shards read whole for another reason (set-up reads a shard that has no
    index object whole, to index it), written while ``room`` bytes allow: the same files, in the
    same folders, that the :class:`Fetcher` would write, so a run need not fetch those bytes again.

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


class _Unit:
    """One file the fetcher manages: a chunk or a sample of a shard."""

    __slots__ = ("shard", "name", "size", "refs", "state")

    def __init__(self, shard: int, name: str, size: int) -> None:
        self.shard = shard
        self.name = name
        self.size = size
        self.refs = 0
        self.state = "absent"  # absent -> queued -> writing -> present (-> absent when evicted)


class Fetcher:
    """The read-ahead thread of one ShardSet (see the module docstring), in a fetch process
    (:class:`~hydrax.shards.fetchproc.FetchProcess`) or, where none can start, in the main process.

    ``layout(shard)`` returns the :class:`ShardLayout` of a shard (loading its index if needed);
    ``store(shard)`` its :class:`~hydrax.shards.store.Store`. ``held`` (path -> size): files
    already written under ``root`` for it (by a :class:`ChunkSeeder`), counted as held from the
    start and used as they are.
    """

    def __init__(self, options: ReadAhead, root: str, layout: Callable[[int], ShardLayout],
                 layout_async: Callable[[int], Any], store: Callable[[int], Any], held: dict[str, int] | None = None) -> None:
        self.options = options
        self.root = root
        self._layout = layout
        self._layout_async = layout_async
        self._store = store
        self._units: OrderedDict[tuple[int, str], _Unit] = OrderedDict()  # least recently used first
        self._batches: dict[Any, list[_Unit]] = {}
        self._bytes = 0
        self._outstanding: dict[int, int] = {}  # shard -> samples announced, not yet released
        self._counts: dict[Any, dict[int, int]] = {}
        self._pending: list[tuple] = []
        self._unplanned: set[Any] = set()
        self._flush_scheduled = False
        self._rank = 0  # announcements so far: the order batches are needed in
        self._ranks: dict[Any, int] = {}
        self._queue: list[tuple[int, int, int]] = []  # heap of (rank of the first batch needing it, shard, chunk)
        self._urgent_left = 0
        self._urgent_until = 0
        self.stats = dict(EMPTY_STATS)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._room: asyncio.Condition | None = None
        self._work: asyncio.Condition | None = None
        self._requests: asyncio.Semaphore | None = None
        self._closed = False
        self._foreign: OrderedDict[str, int] | None = None  # files of earlier runs in a persistent cache
        if options.cache_dir is not None:
            self._adopt_existing()
        if held:
            self._adopt_held(held)
        self._claimed: set[str] = set()  # the shard folders this process has named itself the writer of
        self._thread = threading.Thread(target=self._run, name="hydrax-readahead", daemon=True)
        self._thread.start()
        self._ready.wait()

    # -- thread and loop ---------------------------------------------------------------------
    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._room = asyncio.Condition()
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
        for message in messages:
            if message[0] == "announce":
                self._announce(*message[1:])
            else:
                self._release(message[1])

    def _unit(self, shard: int, name: str, size: int) -> _Unit:
        key = (shard, name)
        unit = self._units.get(key)
        if unit is None:
            unit = self._units[key] = _Unit(shard, name, size)
            if self._foreign is not None:
                # A persistent cache may hold the file from an earlier run: use it as it is.
                path = os.path.join(self._layout(shard).directory, name)
                if self._foreign.pop(path, None) is not None:
                    unit.state = "present"
                    self.stats["reused"] += size
        else:
            self._units.move_to_end(key)
        return unit

    def _announce(self, key: Any, shards: np.ndarray, samples: np.ndarray, order: str) -> None:
        if not self._counts:
            # Nothing announced is waiting: a run starts (or resumes). Its first batches cannot
            # wait for chunks: their samples are also read singly, up to URGENT_BYTES.
            self._urgent_left = min(URGENT_BYTES, self.options.max_bytes // 4)
            self._urgent_until = self._rank + URGENT_BATCHES
        # Announcements come in bursts (a whole look-ahead at the start of a run): plan them
        # together, so the choice between fetching a shard's chunks and reading its samples sees them all.
        counts = dict(zip(*(a.tolist() for a in np.unique(shards, return_counts=True))))
        for shard, n in counts.items():
            self._outstanding[shard] = self._outstanding.get(shard, 0) + n
        self._counts[key] = counts
        self._rank += 1
        self._ranks[key] = self._rank
        self._pending.append((key, shards, samples, order))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_later(0.002, lambda: self._loop.create_task(self._flush()))

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
        while first < len(pending):
            part = pending[first : 2 * first + 1]
            first += len(part)
            unindexed = await self._load_layouts(part)
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

    async def _load_layouts(self, pending: list[tuple]) -> set[int]:
        """Load the indexes of the shards ``pending`` batches read (those a manifest gave only
        counts for), many at once; returns the shards whose index failed to load."""
        shards = sorted({s for _, shards, _, _ in pending for s in np.unique(shards).tolist()})
        results = await asyncio.gather(*(self._limited(self._layout_async, s) for s in shards), return_exceptions=True)
        unindexed = set()
        for shard, result in zip(shards, results):
            if isinstance(result, BaseException):
                log.debug("read-ahead: no index for shard %d: %s", shard, result)
                unindexed.add(shard)
        return unindexed

    def _plan(self, key: Any, shards: np.ndarray, samples: np.ndarray, order: str, unindexed: set[int]) -> dict[int, list[int]]:
        """Refer batch ``key`` to the files it needs and queue the chunks to fetch; returns the
        samples to read with ranged requests, by shard. The ``unindexed`` shards' indexes just
        failed to load: they are left to the workers' own reads, which report why (loading again
        here would block the event loop for a second failure)."""
        if key in self._unplanned:
            self._unplanned.discard(key)
            return {}
        rank = self._ranks.get(key, self._rank)
        needed: list[_Unit] = []
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
                unit = self._unit(shard, chunk_name(chunk), _span_size(layout, chunk))
                singly = not by_chunk and unit.state == "absent"
                if not singly:
                    needed.append(unit)
                    if unit.state == "absent":
                        unit.state = "queued"
                        heapq.heappush(self._queue, (rank, shard, chunk))
                    if unit.state == "present" or self._urgent_left <= 0 or rank > self._urgent_until or unit.size < URGENT_CHUNK:
                        continue
                for sample in chosen[chunks == chunk].tolist():
                    s_unit = self._unit(shard, sample_name(sample), int(layout.ends[sample] - layout.starts[sample]))
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
                self._forget(unit)
        self._outstanding_drop(key)
        self._loop.create_task(self._notify())

    def _forget(self, unit: _Unit) -> None:
        """Drop an absent unit no batch needs: the units held stay within what is read ahead,
        whatever the dataset's size."""
        key = (unit.shard, unit.name)
        if self._units.get(key) is unit:
            del self._units[key]

    def _outstanding_drop(self, key: Any) -> None:
        for shard, n in self._counts.pop(key, {}).items():
            self._outstanding[shard] -= n

    async def _notify(self) -> None:
        async with self._room:
            self._room.notify_all()

    async def _reserve(self, unit: _Unit, wait: bool = True) -> bool:
        """Make room for ``unit``, waiting while everything held is still needed (unless not
        ``wait``); False when it is larger than the whole budget (workers then read its samples
        themselves), or there is no room and no waiting."""
        async with self._room:
            while self._bytes + unit.size > self.options.max_bytes:
                if not self._evict(self._bytes + unit.size - self.options.max_bytes):
                    if unit.size > self.options.max_bytes or not wait:
                        return False
                    await self._room.wait()
            self._bytes += unit.size
            self.stats["held_peak"] = max(self.stats["held_peak"], self._bytes)
            return True

    async def _reserve_needed(self, unit: _Unit, wait: bool = True) -> bool:
        """:meth:`_reserve` for a chunk some announced batch still needs once there is room;
        False (the chunk left absent) when it is needed no more or larger than the budget (or,
        without ``wait``, when there is no room now)."""
        if unit.refs > 0 and await self._reserve(unit, wait):
            if unit.refs > 0:
                return True
            async with self._room:
                self._bytes -= unit.size
                self._room.notify_all()
        unit.state = "absent"
        if unit.refs <= 0:
            self._forget(unit)
        return False

    def _give_back(self, unit: _Unit) -> None:
        """Return the room reserved for ``unit``, which will not be written."""
        unit.state = "absent"
        self._bytes -= unit.size
        self._forget(unit)

    def _evict(self, wanted: int) -> bool:
        """Remove present, unreferenced files, least recently used first (files of earlier runs
        before all others), until ``wanted`` bytes are free."""
        freed = self._trim_foreign(wanted) if self._foreign else 0
        for key, unit in list(self._units.items()):
            if freed >= wanted:
                break
            if unit.state != "present" or unit.refs > 0:
                continue
            try:
                os.unlink(os.path.join(self._layout(unit.shard).directory, unit.name))
            except OSError:
                pass
            unit.state = "absent"
            self._bytes -= unit.size
            freed += unit.size
            self.stats["evicted"] += 1
            del self._units[key]
        return freed >= wanted

    def _begin(self, unit: _Unit, directory: str) -> str:
        """Mark ``unit`` as being written: workers that need it wait for it from now on."""
        if directory not in self._claimed:
            claim_writer(directory)
            self._claimed.add(directory)
        unit.state = "writing"
        part = os.path.join(directory, part_name(unit.name))
        open(part, "wb").close()
        return part

    def _finish(self, unit: _Unit, directory: str, part: str) -> None:
        os.replace(part, os.path.join(directory, unit.name))
        unit.state = "present"

    def _abandon(self, unit: _Unit, part: str | None) -> None:
        if part is not None:
            try:
                os.unlink(part)
            except OSError:
                pass
        if unit.state in ("writing", "queued"):
            unit.state = "absent"
            self._bytes -= unit.size if part is not None else 0

    async def _next_span(self) -> tuple[int, int, list[int]]:
        """``(rank, shard, chunks)``: the queued chunk the earliest batch needs, with the queued
        chunks that follow it in its shard (one request brings up to :data:`SPAN_BYTES`); waits
        while none is queued. Chunks no announced batch needs any more are dropped."""
        async with self._work:
            while True:
                while self._queue:
                    rank, shard, chunk = heapq.heappop(self._queue)
                    unit = self._units.get((shard, chunk_name(chunk)))
                    if unit is None or unit.state != "queued":
                        continue
                    if unit.refs <= 0:
                        unit.state = "absent"
                        self._forget(unit)
                        continue
                    span = [chunk]
                    layout = self._layout(shard)
                    size = unit.size
                    while span[-1] + 1 < len(layout.chunks) and size < SPAN_BYTES:
                        follower = self._units.get((shard, chunk_name(span[-1] + 1)))
                        if follower is None or follower.state != "queued" or follower.refs <= 0:
                            break
                        span.append(span[-1] + 1)
                        size += follower.size
                    for c in span:
                        self._units[(shard, chunk_name(c))].state = "claimed"
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
                    unit = self._units.get((shard, chunk_name(chunk)))
                    if unit is not None and unit.state == "claimed":
                        unit.state = "absent"

    async def _fetch_span(self, rank: int, shard: int, span: list[int]) -> None:
        """One ranged request for the consecutive chunks ``span`` of ``shard``, writing each chunk
        file as it fills (workers map a chunk as soon as it is renamed into place)."""
        layout = self._layout(shard)
        units = [self._units[(shard, chunk_name(c))] for c in span]
        # Room for the chunks before the request is sent (waiting for the first only; the span
        # ends where the budget has no room now): a fetcher waiting for room holds no response
        # open, and fetches nothing its batches stopped needing meanwhile.
        if not await self._reserve_needed(units[0]):
            return
        count = 1
        while count < len(units) and await self._reserve_needed(units[count], wait=False):
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
                parts.append(self._begin(unit, layout.directory))
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
                        self._finish(units[index], layout.directory, parts[index])
                        index += 1
        finally:
            if f is not None:
                f.close()
            for i in range(index, len(units)):
                if i < len(parts):
                    self._abandon(units[i], parts[i])
                else:  # reserved, never begun
                    units[i].state = "absent"
                    self._bytes -= units[i].size

    async def _read_run(self, shard: int, run: Sequence[int]) -> None:
        """One ranged request for the consecutive-ish samples ``run``, written one file each."""
        layout = self._layout(shard)
        units = [self._units.get((shard, sample_name(s))) for s in run]
        reserved = 0
        parts: list[str] = []
        try:
            for unit in units:
                if unit is None or not await self._reserve(unit):
                    for held in units[:reserved]:  # give back what was reserved; workers read these themselves
                        held.state = "absent"
                        self._bytes -= held.size
                    for rest in units[reserved:]:
                        if rest is not None and rest.state == "queued":
                            rest.state = "absent"
                    return
                reserved += 1
            async with self._requests:
                # Samples whose batches were loaded while this waited its turn (their workers read
                # them) are not read again.
                while units and units[0].refs <= 0:
                    self._give_back(units.pop(0))
                    run = run[1:]
                while units and units[-1].refs <= 0:
                    self._give_back(units.pop())
                    run = run[:-1]
                if not units:
                    return
                start, end = int(layout.starts[run[0]]), int(layout.ends[run[-1]])
                # Workers that need these samples wait for them from now on rather than read them
                # too (not before: while the request waits its turn, a worker's own read is sooner).
                parts = [self._begin(unit, layout.directory) for unit in units]
                self.stats["requests"] += 1
                data = memoryview(await self._store(shard).read_async(layout.url, start, end - start, version=layout.version))
            self.stats["bytes"] += len(data)
            for sample, unit, part in zip(run, units, parts):
                with open(part, "wb") as f:
                    f.write(data[int(layout.starts[sample]) - start : int(layout.ends[sample]) - start])
                self._finish(unit, layout.directory, part)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.stats["failed"] += 1
            log.warning("read-ahead of %d samples of %s failed (workers read them themselves): %s", len(run), layout.url, exc)
            for i, unit in enumerate(units):
                if unit is not None and unit.state != "present":
                    self._abandon(unit, parts[i] if i < len(parts) else None)
                    if i >= len(parts) and i < reserved:
                        self._bytes -= unit.size

    def _adopt_existing(self) -> None:
        """Count what a persistent cache already holds (oldest first), so the cap applies to it."""
        self._foreign = OrderedDict(held_files(self.root, STALE_PART_S))  # stale parts: left by a killed process
        self._bytes = sum(self._foreign.values())
        if self._bytes > self.options.max_bytes:
            self._trim_foreign(self._bytes - self.options.max_bytes)

    def _adopt_held(self, held: dict[str, int]) -> None:
        """Count the files ``held`` (written for this fetcher before it started) as files of an
        earlier run: used as they are when first needed, evicted first, within the budget."""
        if self._foreign is None:
            self._foreign = OrderedDict()
        for path, size in held.items():
            if path not in self._foreign:  # a persistent cache's scan found it already
                self._foreign[path] = size
                self._bytes += size
        if self._bytes > self.options.max_bytes:
            self._trim_foreign(self._bytes - self.options.max_bytes)
        self.stats["held_peak"] = max(self.stats["held_peak"], self._bytes)

    def _trim_foreign(self, wanted: int) -> int:
        freed = 0
        while freed < wanted and self._foreign:
            path, size = self._foreign.popitem(last=False)
            try:
                os.unlink(path)
            except OSError:
                pass
            freed += size
            self._bytes -= size
        return freed


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
            if not (os.path.exists(os.path.join(layout.directory, part_name(chunk_name(chunk))))
                    or os.path.exists(os.path.join(layout.directory, part_name(sample_name(sample))))):
                return None
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


def finalizer(owner: Any, root: str) -> None:
    """Remove the private directory ``root`` when ``owner`` is collected or the process exits."""
    weakref.finalize(owner, remove_private_root, root, os.getpid())

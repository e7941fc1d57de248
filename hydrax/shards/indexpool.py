"""Set-up's indexing of remote shards that have no index, in processes of its own.

A remote shard with no index object (and none cached) is read whole to be indexed (see
:mod:`hydrax.shards.indexsource`). Done in the training process, that costs its CPU and GIL for every
byte of the bucket before the first batch, on one core. Once the shards to read hold at least
:data:`POOL_MIN_BYTES`, :func:`index_in_processes` gives them to up to :data:`MAX_PROCESSES`
children started from the fork server (one per core; obstore forbids forking a process that used
it), each reading its share :data:`~hydrax.shards.indexsource.BUILD_REQUESTS` at a time, indexing it,
and cutting it into read-ahead chunk files (a :class:`~hydrax.shards.readahead.seeder.ChunkSeeder` with
its share of the room) while its bytes are in memory. Only indexes (a few bytes per sample) and
the names of the files kept come back.

A child that fails with an error sends it, and set-up raises it as if it had read the shard
itself; a child that dies leaves its shards to be indexed in the training process, with a
warning.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import signal
from typing import Any

from ..errors import StoreError
from ..procs.processes import (adopt_environment, die_with_parent, environment_snapshot, helpers_allowed, release_fork_server,
                         warm_forkserver)
from .indexfile import ShardIndex
from .indexsource import BUILD_REQUESTS, build_index_async
from .options import StoreOptions
from .readahead.seeder import ChunkSeeder
from .router import store_for
from .shardtable import ShardEntry
from .store import gather_limited, run_async

log = logging.getLogger(__name__)

#: Set-up indexes in processes of its own once the shards it must read whole hold this many bytes
#: (below, starting them costs more than they save).
POOL_MIN_BYTES = 64 << 20
#: The most indexing processes (each reads :data:`~hydrax.shards.indexsource.BUILD_REQUESTS` shards at a time).
MAX_PROCESSES = 16


def pool_size(entries: list[ShardEntry]) -> int:
    """How many processes index ``entries``: none (index them here) when they hold less than
    :data:`POOL_MIN_BYTES` or no helper may start, else one per core, at most one per shard."""
    total = sum(max(0, entry.size or 0) for entry in entries)
    if total < POOL_MIN_BYTES or not helpers_allowed():
        return 0
    return max(1, min(len(entries), os.cpu_count() or 1, MAX_PROCESSES))


def index_in_processes(entries: list[ShardEntry], options: StoreOptions, seeder: ChunkSeeder | None,
                       processes: int) -> list[ShardIndex | None]:
    """The indexes of ``entries``, read and built by ``processes`` children (shard ``i`` by
    child ``i % processes``), in order; None for a shard whose child died before sending it.

    Each child keeps chunk files within an equal share of ``seeder``'s room left, and ``seeder``
    then counts them as its own (:meth:`~hydrax.shards.readahead.seeder.ChunkSeeder.adopt`). An error a
    child sends is raised here, once every child has ended.
    """
    warm_forkserver(main_imports=False)
    ctx = mp.get_context("forkserver")
    room = (seeder.room - seeder.bytes) // processes if seeder is not None else 0
    root = seeder.root if seeder is not None else None
    environ = environment_snapshot()
    children = []
    for number in range(processes):
        share = [(i, entries[i]) for i in range(number, len(entries), processes)]
        receive, send = ctx.Pipe(duplex=False)
        child = ctx.Process(target=index_main, name=f"hydrax-index-{number}", daemon=True,
                            args=(share, options, root, room, send, environ))
        child.start()
        send.close()
        children.append((child, receive))
    indexes: list[ShardIndex | None] = [None] * len(entries)
    failure: BaseException | None = None
    try:
        failure = _collect(children, entries, indexes, seeder)
    finally:
        for child, receive in children:
            if failure is not None and child.is_alive():
                child.kill()
            child.join()
            receive.close()
    if failure is not None:
        raise failure
    return indexes


def _collect(children: list, entries: list[ShardEntry], indexes: list, seeder: ChunkSeeder | None) -> BaseException | None:
    """Read the children's messages until each has ended; the first error one sent (or None)."""
    waiting = {receive: child for child, receive in children}
    failure = None
    while waiting:
        for receive in mp.connection.wait(list(waiting)):
            try:
                kind, *body = receive.recv()
            except (EOFError, OSError):
                child = waiting.pop(receive)
                child.join()
                if child.exitcode and failure is None:  # not one set-up killed for another's error
                    log.warning("[hydrax] an indexing process died (exit code %s); set-up indexes its shards itself",
                                child.exitcode)
                continue
            if kind == "index":
                position, data, kept = body
                indexes[position] = ShardIndex.from_bytes(data, entries[position].url)
                if seeder is not None:
                    seeder.adopt(kept, entries[position].url)
            elif kind == "error":
                failure = failure or _unpickled(body[0])
                if failure is not None:
                    for child in waiting.values():
                        child.kill()  # the set-up fails: the others' work is of no use
    return failure


def _unpickled(payload: bytes) -> BaseException:
    try:
        return pickle.loads(payload)
    except Exception as exc:  # noqa: BLE001  (an error that does not survive pickling still fails set-up)
        return StoreError(f"an indexing process failed, and its error could not be read: {exc}")


def index_main(share: list[tuple[int, ShardEntry]], options: StoreOptions, root: str | None, room: int,
               connection, environ: dict[str, str]) -> None:
    """Body of an indexing process: read each shard of ``share`` whole, index it, keep its chunk
    files within ``room`` under ``root``, and send each index, with the files kept of its shard, to the parent."""
    adopt_environment(environ)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the training process's to handle
    die_with_parent()
    release_fork_server()
    seeder = ChunkSeeder(root, room) if root is not None else None
    kept: dict[str, dict[str, int]] = {}  # url -> the chunk files kept of it, sent with its index

    def sink(entry: ShardEntry, data, index: ShardIndex) -> None:
        before = len(seeder.held)
        seeder.add(entry.url, entry.version or index.etag, *index.sample_spans(), data)
        # the files just added, the last of held (read from its end: thousands of shards per child)
        added = list(itertools.islice(reversed(seeder.held.items()), len(seeder.held) - before))
        kept[entry.url] = dict(reversed(added))  # in the order written: the oldest is evicted first

    async def one(position: int, entry: ShardEntry) -> None:
        index = await build_index_async(entry, store_for(entry.url, options), sink if seeder is not None else None)
        # with the files kept of it: a child that dies later leaves none uncounted
        connection.send(("index", position, index.to_bytes(), kept.pop(entry.url, {})))

    async def every() -> Any:
        return await gather_limited([lambda p=p, e=e: one(p, e) for p, e in share], BUILD_REQUESTS)

    try:
        run_async(every())
    except BaseException as exc:  # noqa: BLE001  (sent to the parent, which raises it)
        try:
            payload = pickle.dumps(exc)
        except Exception:  # noqa: BLE001
            payload = pickle.dumps(StoreError(str(exc)))
        connection.send(("error", payload))
    finally:
        connection.close()

"""Read-ahead for remote shards: fetch what the schedule will read before the workers ask for it.

The schedule is a pure function of (seed, epoch), so the main process knows long in advance which
samples each batch holds. The Dataloader announces upcoming batches to their data
(``data.prefetch(key, indices, order)``, in the order they will be loaded, then
``data.release(key)`` once the batch is loaded); for a :class:`~hydrax.shards.ShardSet` with
remote shards, a :class:`~hydrax.shards.readahead.fetcher.Fetcher` thread turns those
announcements into requests, many in flight at once, and writes what arrives as files under one
directory that every worker of the host reads. The thread runs in a fetch process of its own
(:mod:`hydrax.shards.fetchproc`), so the training process spends no CPU, and holds no GIL, per
byte fetched; a larger host runs a pool of them, each with the shards a hash of their URL gives
it (:func:`~hydrax.shards.readahead.options.fetch_process_count`); where no such process can
start, in the main process.

- each shard is cut into sample-aligned chunks of about
  :data:`~hydrax.shards.readahead.folders.CHUNK_BYTES` (``c000012``), so a sample never spans
  two files and a worker reads it zero-copy from a mapping. When the announced batches read a
  good part of a shard (most of it, in a shuffled order), the chunks they need are queued by the
  first batch that needs each, and ``streams`` fetchers take them in that order, one ranged
  request for a run of consecutive queued chunks (up to
  :data:`~hydrax.shards.readahead.fetcher.SPAN_BYTES`); a chunk is visible to workers as soon
  as it is complete;
- otherwise (a few samples of a shard: a budget far below the data, in a shuffled order) the
  announced samples are read with ranged requests, neighbours coalesced into one request, and
  written one file per sample (``s00000042``);
- when a run starts, its first batches' samples whose chunks are not there yet are also read
  singly (up to :data:`~hydrax.shards.readahead.fetcher.URGENT_BYTES`), so the first batch
  waits for one round trip rather than for chunks; a shuffled batch touches a chunk of nearly
  every shard.

A file is written under a temporary name (``.c000012.part``, made when its request is sent) and
renamed when complete; a worker that needs a sample whose file is on its way waits for it, and
one whose sample was not read ahead reads it itself (one ranged request), so read-ahead never
blocks progress; nor does a writer that died (:data:`~hydrax.shards.readahead.folders.WRITER_FILE`
in each shard's folder names it, and waiting workers check it lives). Reads are pinned to the
version (ETag) each shard was indexed at.

Memory is bounded by a budget (:class:`~hydrax.shards.readahead.budget.Budget`):
``ReadAhead(max_bytes=...)`` when given, else sized for the run by
:func:`~hydrax.shards.readahead.budget.choose_budget`: the remote data itself when the host can
hold it (an epoch is then read once, and later epochs read nothing), else a share of the host's
available memory (or, for a persistent ``cache_dir``, of its disk). Files of batches that are
loaded are evicted, least recently used first, to make room; when everything held is still
needed, the fetcher waits. By default the directory is private to the process, in memory
(``/dev/shm``) where that has room, and removed when the ShardSet goes away (and swept on a
later start if the process was killed); with ``cache_dir`` it persists, so later epochs and runs
skip downloads of what it still holds.

Set-up may fill the read-ahead before any run: a shard without an index object is read whole to
index it, and a :class:`~hydrax.shards.readahead.seeder.ChunkSeeder` cuts those bytes into the
same chunk files, while the budget has room; the Fetcher counts them as held from its start
(``Fetcher(..., held=...)``) and fetches only what they lack.

The read-ahead is a package, one concern a module (this docstring tells the whole story; each
module's own says what it owns):

- :mod:`~hydrax.shards.readahead.options`: :class:`~hydrax.shards.ReadAhead`, what the user
  asks for, and how many fetch processes that makes;
- :mod:`~hydrax.shards.readahead.budget`: the budget, chosen for the data and the host;
- :mod:`~hydrax.shards.readahead.folders`: the files on disk, their names and their writers,
  and the private folders they go in;
- :mod:`~hydrax.shards.readahead.seeder`: chunk files cut from set-up's reads;
- :mod:`~hydrax.shards.readahead.fetcher`: the fetcher, planning in need order and downloading;
- :mod:`~hydrax.shards.readahead.holdings`: what the fetcher holds within the budget, and
  eviction;
- :mod:`~hydrax.shards.readahead.localfiles`: how a worker finds a fetched sample.

The fetch processes the fetcher runs in are :mod:`hydrax.shards.fetchproc`. The names imported
below are re-exported because the API reference documented them at this path; code in the
package imports each from the module that owns it (never from here: that would be a loop).
"""

from .budget import Budget, choose_budget, data_budget, host_room
from .fetcher import Fetcher
from .folders import ShardLayout, chunk_starts, memory_folder_fits, object_dir, private_base, private_root
from .localfiles import LocalFiles
from .options import ReadAhead

__all__ = ["Budget", "Fetcher", "LocalFiles", "ReadAhead", "ShardLayout", "choose_budget", "chunk_starts", "data_budget",
           "host_room", "memory_folder_fits", "object_dir", "private_base", "private_root"]

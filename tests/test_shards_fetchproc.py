"""hydrax.shards.fetchproc: read-ahead in a fetch process of its own, through real runs against a
real S3 server behind the fault proxy."""

import os
import time

import numpy as np
import pytest

from hydrax import Dataloader, DataGroup
from hydrax.shards import ShardSet
from support.timing import slack, slack_int
from test_shards_remote import ARRAYS, load_sample, run_epochs, write_shards


def fetch_processes() -> list:
    """The read-ahead fetch processes of this (training) process that are running."""
    import multiprocessing as mp

    return [p for p in mp.active_children() if p.name == "hydrax-fetch"]


def test_remote_reads_come_from_a_fetch_process_not_the_training_process(proxied, tmp_path, monkeypatch):
    """The training process only announces: no store of its own reads a byte during the epoch,
    while a fetch process (a child from the fork server) reads ahead; every sample comes once.
    With the ShardSet gone, neither the process nor the private folder is left."""
    import gc

    from hydrax.shards import shardset as shardset_module

    options, proxy, client = proxied
    urls = write_shards(tmp_path, client, count=6, options=options)
    dataset = ShardSet(urls, s3=options, cache_dir=str(tmp_path / "cache"))
    total = sum(e.size for e in map(dataset.shard_entry, range(6)))
    used_here: list[str] = []
    real_store_for = shardset_module.store_for
    monkeypatch.setattr(shardset_module, "store_for", lambda url, opts: used_here.append(url) or real_store_for(url, opts))
    proxy.clear()
    seen, fetchers = [], set()
    groups = DataGroup(10, dataset, loader_arrays=ARRAYS, shuffle_first=True)
    with Dataloader(load_sample, groups, loader_count=2, end_at=("epoch", 1), timeout_sec=slack_int(60)) as loader:
        for batch in loader:
            fetchers.update(p.pid for p in fetch_processes())
            seen.extend(np.asarray(batch.arrays["cls"]).tolist())
            del batch
    assert sorted(seen) == list(range(120))
    assert fetchers and os.getpid() not in fetchers
    assert used_here == []  # the training process made no store, so no request, of its own
    stats = dataset.readahead_stats
    assert stats["requests"] > 0 and 0.8 * total < stats["bytes"] <= proxy.stats()["body_bytes_down"]
    # A run that ended leaves no fetch process behind, even while its ShardSet lives on.
    deadline = time.monotonic() + slack(10)
    while fetch_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not fetch_processes() and dataset.readahead_stats["bytes"] == stats["bytes"]
    root = dataset._root
    del dataset, groups, loader
    gc.collect()
    assert not os.path.exists(root) and not fetch_processes()


def scheduling(pid: int) -> set[tuple[int, int]]:
    """{(nice, policy)} over the threads of process ``pid`` (from ``/proc``; empty once it is gone)."""
    found = set()
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found.add((int(fields[16]), int(fields[38])))  # stat's fields 19 (nice) and 41 (policy)
    return found


@pytest.mark.parametrize("fetch_nice", [None, 0, 7, 19])
def test_fetch_processes_yield_the_cpu_to_the_training_process(proxied, tmp_path, fetch_nice):
    """ReadAhead(fetch_nice=N): every thread of a fetch process runs at nice N under SCHED_BATCH
    (it does not preempt the training process when its data arrives); by default, and with 0, at
    the training process's priority and policy. The loaders and the training process keep theirs
    (loader_nice is the loaders' own setting)."""
    from hydrax.shards.readahead import ReadAhead

    options, proxy, client = proxied
    urls = write_shards(tmp_path, client, count=4, per_shard=40, options=options)
    readahead = ReadAhead() if fetch_nice is None else ReadAhead(fetch_nice=fetch_nice)
    dataset = ShardSet(urls, s3=options, cache_dir=str(tmp_path / "cache"), readahead=readahead)
    proxy.delay = 0.05  # the run lasts long enough to look at the processes in it
    here = scheduling(os.getpid())
    fetchers, loaders, seen = set(), set(), []
    groups = DataGroup(10, dataset, loader_arrays=ARRAYS, shuffle_first=True)
    with Dataloader(load_sample, groups, loader_count=2, end_at=("epoch", 1), timeout_sec=slack_int(60)) as loader:
        for batch in loader:
            import multiprocessing as mp

            for child in mp.active_children():
                (fetchers if child.name == "hydrax-fetch" else loaders).update(scheduling(child.pid))
            seen.extend(np.asarray(batch.arrays["cls"]).tolist())
            del batch
    dataset.close()
    assert sorted(seen) == list(range(160))
    expected = {(0, 0)} if not fetch_nice else {(fetch_nice, 3)}  # 3: SCHED_BATCH
    assert fetchers == expected
    assert loaders == {(0, 0)} and scheduling(os.getpid()) == here == {(0, 0)}


def run_killing_the_fetch_process(dataset, on_kill=lambda: None, only_one: bool = False) -> tuple[list, list, float]:
    """One shuffled epoch of ``dataset`` (10-sample batches, 2 loaders) in which the fetch process
    (or, ``only_one``, one of a pool's) is SIGKILLed after the first batch that finds it running
    (``on_kill`` is then called); (the samples' classes delivered, the pids killed, the seconds
    from the kill to the run's end)."""
    import signal

    seen, killed, after = [], [], time.monotonic()
    groups = DataGroup(10, dataset, loader_arrays=ARRAYS, shuffle_first=True)
    with Dataloader(load_sample, groups, loader_count=2, end_at=("epoch", 1), timeout_sec=slack_int(60)) as loader:
        for batch in loader:
            seen.extend(np.asarray(batch.arrays["cls"]).tolist())
            del batch
            if not killed and (found := fetch_processes()):
                killed = [p.pid for p in found][: 1 if only_one else None]
                for pid in killed:
                    os.kill(pid, signal.SIGKILL)
                after = time.monotonic()
                on_kill()
    return seen, killed, time.monotonic() - after


@pytest.mark.parametrize("processes", [1, 3])
def test_a_killed_fetch_process_is_replaced_and_every_sample_still_comes_once(proxied, tmp_path, caplog, processes):
    """SIGKILL to the fetch process (to one of a pool of 3) mid-run: a new one takes over its
    announced batches; workers waiting for a file the dead one was writing read the sample
    themselves at once (they check the shard folder's writer lives), so the run neither hangs nor
    waits WAIT_S per sample."""
    from hydrax.shards.readahead import ReadAhead
    from hydrax.shards.readahead.localfiles import WAIT_S

    options, proxy, client = proxied
    urls = write_shards(tmp_path, client, count=6, per_shard=40, options=options)
    dataset = ShardSet(urls, s3=options, cache_dir=str(tmp_path / "cache"), readahead=ReadAhead(fetch_processes=processes))
    proxy.delay = 0.2  # requests in flight (their files half-written) when the process is killed
    with caplog.at_level("WARNING", logger="hydrax.shards.fetchproc"):
        seen, killed, took = run_killing_the_fetch_process(dataset, only_one=processes > 1)
    assert killed and sorted(seen) == list(range(240))
    assert took < slack(WAIT_S / 2), f"{took:.1f} s after the kill"
    assert "fetch process died" in caplog.text
    # The new process fetched what was missing, or found it whole (the dead one's requests, never
    # reported, are not counted; it may have written everything before it was killed).
    stats = dataset.readahead_stats
    assert stats["requests"] + stats["reused"] > 0
    dataset.close()
    assert not fetch_processes()


def test_a_pool_of_fetch_processes_splits_the_shards_each_folder_with_one_writer(proxied, tmp_path):
    """ReadAhead(fetch_processes=3): three fetch processes read ahead together, each the shards
    its hash gives it (each shard folder names one writer, the one the hash chose), within its
    share of the budget; every sample comes once, each chunk is fetched once, and the training
    process reads nothing itself."""
    import zlib

    from hydrax.shards.readahead import ReadAhead, ShardLayout
    from hydrax.shards.readahead.folders import folder_writer

    options, proxy, client = proxied
    urls = write_shards(tmp_path, client, count=8, per_shard=40, options=options)
    dataset = ShardSet(urls, s3=options, cache_dir=str(tmp_path / "cache"), readahead=ReadAhead(fetch_processes=3))
    total = sum(e.size for e in map(dataset.shard_entry, range(8)))
    proxy.clear()
    seen, pids = [], set()
    groups = DataGroup(10, dataset, loader_arrays=ARRAYS, shuffle_later="shardwise")
    with Dataloader(load_sample, groups, loader_count=2, end_at=("epoch", 1), timeout_sec=slack_int(60)) as loader:
        for batch in loader:
            pids.update(p.pid for p in fetch_processes())
            seen.extend(np.asarray(batch.arrays["cls"]).tolist())
            del batch
        writers = {}
        for shard, url in enumerate(dataset.urls):
            layout = dataset.layout(shard)
            writers[shard] = folder_writer(ShardLayout(url, layout.version, layout.starts, layout.ends, dataset._root).directory)
    assert sorted(seen) == list(range(320))
    assert len(pids) == 3
    owner_pid = {}
    for shard, url in enumerate(dataset.urls):  # one writer per owner, and a different one for each owner
        assert writers[shard] in pids
        assert owner_pid.setdefault(zlib.crc32(url.encode()) % 3, writers[shard]) == writers[shard]
    assert len(set(owner_pid.values())) == len(owner_pid)
    stats = dataset.readahead_stats
    assert stats["bytes"] <= proxy.stats()["body_bytes_down"] and stats["bytes"] < 1.2 * total
    dataset.close()
    assert not fetch_processes()


def test_the_pool_size_grows_with_the_host_and_its_budget_splits_by_bytes():
    """One fetch process per CORES_PER_FETCH_PROCESS cores, at most MAX_FETCH_PROCESSES and one
    per shard; one for a persistent cache; shares of the budget follow the bytes of each's shards."""
    from hydrax.shards.fetchproc import budget_shares, shard_owners
    from hydrax.shards.readahead.budget import MIN_BUDGET
    from hydrax.shards.readahead.options import CORES_PER_FETCH_PROCESS, MAX_FETCH_PROCESSES, ReadAhead, fetch_process_count

    assert (CORES_PER_FETCH_PROCESS, MAX_FETCH_PROCESSES) == (8, 32)  # what the storage guide states
    assert [fetch_process_count(ReadAhead(), 1000, cores) for cores in (2, 15, 16, 64, 224, 512)] == [1, 1, 2, 8, 28, 32]
    assert fetch_process_count(ReadAhead(), 3, 224) == 3
    assert fetch_process_count(ReadAhead(fetch_processes=5), 1000, 2) == 5
    assert fetch_process_count(ReadAhead(fetch_processes=5, cache_dir="/tmp/x"), 1000, 224) == 1
    with pytest.raises(ValueError, match="fetch_processes"):
        ReadAhead(fetch_processes=0)
    urls = [f"s3://b/{i}.tar" for i in range(1000)]
    owners = shard_owners(urls, 4)
    assert np.array_equal(owners, shard_owners(list(reversed(urls)), 4)[::-1])  # by URL, not position
    assert all(150 < n < 350 for n in np.bincount(owners, minlength=4))
    sizes = np.where(owners == 0, 3_000_000, 1_000_000)
    shares = budget_shares(6_000_000_000, owners, sizes, 4)
    held = [int(sizes[owners == i].sum()) for i in range(4)]
    for share, part in zip(shares, held):
        assert abs(share / 6e9 - part / sizes.sum()) < 1e-6
    assert min(budget_shares(100, owners, sizes, 4)) == MIN_BUDGET // 4


def test_with_fork_started_workers_read_ahead_stays_a_thread(monkeypatch, tmp_path):
    """Where workers are forked (no fork server), read-ahead runs as a thread, as before."""
    from hydrax.procs.processes import helpers_allowed
    from hydrax.shards.fetchproc import make_fetcher
    from hydrax.shards.readahead import ReadAhead

    monkeypatch.setenv("HYDRAX_START_METHOD", "fork")
    assert not helpers_allowed()
    assert make_fetcher(None, ReadAhead(), str(tmp_path), {"x": 1}, lambda options, held: ("thread", held)) == ("thread", {"x": 1})
    monkeypatch.setenv("HYDRAX_START_METHOD", "forkserver")
    assert helpers_allowed()


def test_a_thread_takes_over_from_fetch_processes_that_keep_dying(proxied, tmp_path, caplog, monkeypatch):
    """Past MAX_RESTARTS deaths, read-ahead goes on in a thread of the training process with the
    batches still announced (not a ranged request per sample): every sample comes once."""
    from hydrax.shards import fetchproc

    monkeypatch.setattr(fetchproc, "MAX_RESTARTS", 0)
    options, proxy, client = proxied
    urls = write_shards(tmp_path, client, count=6, per_shard=40, options=options)
    dataset = ShardSet(urls, s3=options, cache_dir=str(tmp_path / "cache"))
    proxy.delay = 0.05
    with caplog.at_level("WARNING", logger="hydrax.shards.fetchproc"):
        seen, killed, _ = run_killing_the_fetch_process(dataset, proxy.clear)
    assert killed and sorted(seen) == list(range(240))
    assert "a thread of the training process reads ahead" in caplog.text
    assert not fetch_processes()  # none was started again
    ranged = proxy.requests_matching(r"\.tar$", method="GET", ranged=True)
    assert ranged and len(ranged) < 240 / 4  # chunks and coalesced runs, not a request per sample
    dataset.close()


def test_fetch_processes_that_cannot_start_are_tried_again_then_a_thread_reads_ahead(proxied, tmp_path, caplog, monkeypatch):
    """A fetch process starts on the training process's sending thread, without holding up the
    announcements: one that cannot start (the fork server refuses it) is tried again up to
    MAX_RESTARTS times, each failure logged, then a thread reads ahead; the run is not held up
    waiting for it, and every sample comes once."""
    import multiprocessing as mp

    from hydrax.shards import fetchproc

    real_start = mp.process.BaseProcess.start
    tried = []

    def refuse_fetch_processes(process):
        if process.name == "hydrax-fetch":
            tried.append(process.name)
            raise OSError("the fork server is gone")
        return real_start(process)

    monkeypatch.setattr(mp.process.BaseProcess, "start", refuse_fetch_processes)
    monkeypatch.setattr(fetchproc, "CHECK_S", 0.0)
    options, proxy, client = proxied
    dataset = ShardSet(write_shards(tmp_path, client, count=6, per_shard=40, options=options), s3=options,
                       cache_dir=str(tmp_path / "cache"))
    with caplog.at_level("WARNING", logger="hydrax.shards.fetchproc"):
        started = time.monotonic()
        seen = run_epochs(dataset, shuffle_first=True)
    dataset.close()
    assert sorted(c for _, _, cls in seen for c in cls) == list(range(240))
    assert time.monotonic() - started < slack(30)
    assert len(tried) == fetchproc.MAX_RESTARTS + 1
    assert caplog.text.count("did not start (the fork server is gone)") == fetchproc.MAX_RESTARTS
    assert "a thread of the training process reads ahead" in caplog.text


def watched_fetcher(dataset, root: str, events: list):
    """A read-ahead Fetcher thread for ``dataset`` that appends ``("announce", key)`` as it plans
    each batch, ``("samples", shard)`` as it reads samples singly and ``("chunks", shard)`` as it
    fetches whole chunks to ``events``."""
    from hydrax.shards.readahead import Fetcher, ReadAhead
    from hydrax.shards.router import store_for

    class Watched(Fetcher):
        def _announce(self, key, *rest, **options):
            events.append(("announce", key))
            super()._announce(key, *rest, **options)

        async def _read_run(self, shard, run):
            events.append(("samples", shard))
            await super()._read_run(shard, run)

        async def _fetch_span(self, rank, shard, span):
            events.append(("chunks", shard))
            await super()._fetch_span(rank, shard, span)

    os.makedirs(root)
    return Watched(ReadAhead(max_bytes=64 << 20), root, dataset.layout, dataset.layout_async,
                   lambda s: store_for(dataset.urls[s], dataset.options))


def announcements(dataset, batch: int) -> list[tuple]:
    """The announcements of one sequential epoch of ``dataset`` in batches of ``batch``."""
    items = np.arange(len(dataset))
    return [("announce", key, *dataset.locate(items[first : first + batch]), "random")
            for key, first in enumerate(range(0, len(items), batch), start=1)]


def wait_for(condition, seconds: float) -> None:
    deadline = time.monotonic() + slack(seconds)
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.fixture
def watched_burst(proxied, tmp_path):
    """``(dataset, fetcher, events, burst)``: 4 shards of 40 samples behind the proxy, a
    :func:`watched_fetcher` of them, and one epoch's announcements in batches of 10."""
    options, proxy, client = proxied
    dataset = ShardSet(write_shards(tmp_path, client, count=4, per_shard=40, options=options), s3=options,
                       cache_dir=str(tmp_path / "cache"))
    events = []
    fetcher = watched_fetcher(dataset, str(tmp_path / "readahead"), events)
    try:
        yield dataset, fetcher, events, announcements(dataset, 10)
    finally:
        fetcher.close()
        dataset.close()


def test_a_runs_first_batch_is_read_before_the_rest_of_its_burst_is_planned(watched_burst):
    """A run's first message to the fetcher announces its whole look-ahead (hundreds of batches,
    20-60 ms of planning): the first batch's reads start before the second batch is even
    announced to the planner, and every announced batch is still planned, in order. (The burst's
    samples are counted before the first batch is planned: the tests of bytes fetched once, in
    test_shards_remote and test_shards_indexpool, fail otherwise.)"""
    dataset, fetcher, events, burst = watched_burst
    fetcher.update(burst)
    wait_for(lambda: len([e for e in events if e[0] == "announce"]) == len(burst), 10)
    announced = [key for kind, key in events if kind == "announce"]
    assert announced == list(range(1, len(burst) + 1))
    first_read = next(i for i, e in enumerate(events) if e[0] != "announce")
    assert first_read < events.index(("announce", 2)), events[:5]


def test_a_burst_that_comes_in_parts_fetches_each_small_shard_once(watched_burst):
    """The training process's sending thread may send a run's first announcement alone, and the
    rest of its burst after the first batch was planned (a busy machine: it failed CI so). The
    first batches fetch a small shard's chunk whole, as the burst would have decided: each shard
    comes once, none of its samples alone besides."""
    dataset, fetcher, events, burst = watched_burst
    fetcher.update(burst[:1])
    wait_for(lambda: any(e[0] != "announce" for e in events), 10)
    fetcher.update(burst[1:])
    wait_for(lambda: fetcher.stats["bytes"] >= sum(dataset.shard_entry(s).size for s in range(4)) * 0.9, 10)
    reads = [e for e in events if e[0] != "announce"]
    assert sorted(reads) == [("chunks", s) for s in range(4)], reads


@pytest.mark.parametrize("processes", [1, 2])
def test_workers_started_after_wait_prefetch_find_the_first_batch_on_its_way(proxied, tmp_path, processes):
    """The Dataloader starts a run's workers once its data's wait_prefetch returns. The fetch
    processes start as the first batch is announced, without holding up the announcements, and
    wait_prefetch returns once they have planned their first batch: every sample of the first
    batch is then found read ahead (written, or being written), none left to a worker's own
    request, and the data is read from the store once."""
    from hydrax.shards import ReadAhead
    from hydrax.shards.readahead.localfiles import LocalFiles

    options, proxy, client = proxied
    urls = write_shards(tmp_path, client, count=4, per_shard=40, options=options)
    dataset = ShardSet(urls, s3=options, cache_dir=str(tmp_path / "cache"), readahead=ReadAhead(fetch_processes=processes))
    proxy.clear()
    items = np.random.default_rng(5).permutation(len(dataset))
    batches = [items[first : first + 10] for first in range(0, len(items), 10)]
    try:
        for key, batch in enumerate(batches, start=1):
            dataset.prefetch(key, batch.tolist(), "random")
        dataset.wait_prefetch()
        files = LocalFiles()
        shards, samples = dataset.locate(batches[0])
        missing = [(s, i) for s, i in zip(shards.tolist(), samples.tolist()) if files.find(dataset.layout(s), i) is None]
        assert missing == []
        total = sum(dataset.shard_entry(s).size for s in range(4))
        wait_for(lambda: dataset.readahead_stats["bytes"] >= total * 0.9, 10)
        assert dataset.readahead_stats["bytes"] <= proxy.stats()["body_bytes_down"] < 1.1 * total
    finally:
        dataset.close()


def test_the_first_batchs_indexes_are_loaded_once_before_the_fetch_process_starts(proxied, tmp_path):
    """load_first_indexes: the training process loads the indexes of the first batch's shards
    (while it waits for the fork server) into the local index cache, where the fetch process and
    the workers find them: each index object is read from the store once in the whole run; a
    shard whose index cannot load is left to the processes that need it."""
    from hydrax.shards.fetchproc import load_first_indexes

    options, proxy, client = proxied
    urls = write_shards(tmp_path, client, count=6, per_shard=40, options=options)
    dataset = ShardSet(urls, s3=options, cache_dir=str(tmp_path / "cache"))
    proxy.clear()
    load_first_indexes(dataset, [0, 1, 10**6])  # 10**6: no such shard, ignored
    assert len(proxy.requests_matching(r"\.hidx$", method="GET")) == 2
    assert {0, 1} <= set(dataset._layouts)
    proxy.clear()
    seen = run_epochs(dataset, shuffle_first=True)
    dataset.close()
    assert sorted(c for _, _, cls in seen for c in cls) == list(range(240))
    index_reads = [r.path for r in proxy.requests_matching(r"\.hidx$", method="GET")]
    assert len(index_reads) == len(set(index_reads)) <= 4, index_reads  # shards 0 and 1 were loaded before


def test_a_store_slow_to_give_the_first_indexes_does_not_hold_up_the_run(proxied, tmp_path):
    """The training process gives the first batch's indexes FIRST_INDEXES_WAIT_S: an index object
    that does not come is left to the fetch process and the workers, and the run still delivers
    every sample."""
    import time as clock

    from hydrax.shards.fetchproc import FIRST_INDEXES_WAIT_S, load_first_indexes

    options, proxy, client = proxied
    urls = write_shards(tmp_path, client, count=3, per_shard=40, options=options)
    dataset = ShardSet(urls, s3=options, cache_dir=str(tmp_path / "cache"))
    proxy.stall_next(1, seconds=FIRST_INDEXES_WAIT_S + 3, match=r"w-000\.tar\.hidx$", method="GET")
    started = clock.monotonic()
    load_first_indexes(dataset, [0, 1])
    took = clock.monotonic() - started
    assert FIRST_INDEXES_WAIT_S - 0.1 < took < slack(FIRST_INDEXES_WAIT_S + 1.5), took
    assert proxy.fired and 0 not in dataset._layouts and 1 in dataset._layouts
    seen = run_epochs(dataset, shuffle_first=True)
    dataset.close()
    assert sorted(c for _, _, cls in seen for c in cls) == list(range(120))

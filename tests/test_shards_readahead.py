"""hydrax.shards.readahead's budget: chosen for the data and the host (pure functions), and
measured from this host. Read-ahead through real runs is in tests/test_shards_remote.py."""

import os

import pytest

from hydrax.shards.readahead import Budget, LocalFiles, ReadAhead, ShardLayout, choose_budget, host_room, memory_folder_fits
from hydrax.shards.readahead.budget import DISK_SHARE, MEMORY_SHARE, MIN_BUDGET

GB = 10**9


def test_data_the_host_can_hold_is_held_whole():
    budget = choose_budget(None, 2 * GB, available_memory=24 * GB, free_disk=50 * GB, persistent=False)
    assert budget.source == "data" and budget.holds_data
    assert budget.bytes == 2 * GB + 2 * GB // 8 + MIN_BUDGET and budget.cap == int(MEMORY_SHARE * 24 * GB)


def test_data_larger_than_the_hosts_share_gets_the_share():
    memory = choose_budget(None, 1600 * GB, available_memory=512 * GB, free_disk=4000 * GB, persistent=False)
    assert (memory.source, memory.bytes, memory.holds_data) == ("memory", int(MEMORY_SHARE * 512 * GB), False)
    # a small temporary file system limits a private folder, whatever the memory
    small_tmp = choose_budget(None, 1600 * GB, available_memory=512 * GB, free_disk=10 * GB, persistent=False)
    assert (small_tmp.source, small_tmp.bytes) == ("disk", int(DISK_SHARE * 10 * GB))
    # a persistent cache is a disk cache: its free space, not the memory, is the limit
    disk = choose_budget(None, 1600 * GB, available_memory=16 * GB, free_disk=2000 * GB, persistent=True)
    assert (disk.source, disk.bytes) == ("disk", int(DISK_SHARE * 2000 * GB))


def test_a_given_budget_is_kept_and_a_starved_host_still_gets_the_floor():
    given = choose_budget(256 << 10, 1600 * GB, available_memory=512 * GB, free_disk=4000 * GB, persistent=False)
    assert (given.bytes, given.source, given.cap) == (256 << 10, "given", None)
    starved = choose_budget(None, 10 * GB, available_memory=1 << 20, free_disk=1 << 20, persistent=False)
    assert starved.bytes == MIN_BUDGET and not starved.holds_data
    assert "read-ahead budget" in starved.describe() and "of the remote data" in starved.describe()


def test_private_folders_go_to_memory_only_where_it_has_room():
    # a host's /dev/shm (half its memory) holds what the memory share allows
    assert memory_folder_fits(2 * GB, available=24 * GB, free=12 * GB)
    assert memory_folder_fits(1600 * GB, available=24 * GB, free=12 * GB)
    # a container's 64 MiB /dev/shm does not: the temporary directory is used instead
    assert not memory_folder_fits(2 * GB, available=24 * GB, free=64 << 20)
    assert memory_folder_fits(10 << 20, available=24 * GB, free=64 << 20)


def test_the_host_room_is_measured(tmp_path):
    available, free = host_room(str(tmp_path))
    assert 0 < available <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    stat = os.statvfs(tmp_path)
    assert 0 < free <= stat.f_blocks * stat.f_frsize


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "1G"])
def test_a_bad_budget_is_refused_by_name(value):
    with pytest.raises(ValueError, match=r"ReadAhead\(max_bytes=...\) must be a positive int or None"):
        ReadAhead(max_bytes=value)
    assert ReadAhead().max_bytes is None and isinstance(choose_budget(None, 1, GB, GB, False), Budget)


def shard_bytes(tmp_path, name: str, samples: int) -> bytes:
    from hydrax.shards import ShardWriter

    with ShardWriter(str(tmp_path / f"{name}-%03d.tar"), maxcount=samples, index=False) as writer:
        for i in range(samples):
            writer.write({"__key__": f"k{i:04d}", "bin": bytes([i % 251]) * (100 + i)})
    with open(writer.paths[0], "rb") as f:
        return f.read()


def test_bytes_read_to_index_a_shard_become_the_chunk_files_workers_find_within_the_room(tmp_path):
    """What set-up read whole to index a shard is cut into the chunk files the fetcher would
    write (same folder for that version, same names), which a worker's LocalFiles finds; no more
    than the room is written, a chunk already there is left alone, and no file stays open (many
    shards under a low descriptor limit)."""
    import resource

    from hydrax.shards.indexfile import index_from_bytes
    from hydrax.shards.readahead.seeder import ChunkSeeder

    data = shard_bytes(tmp_path, "a", 40)
    index = index_from_bytes(data, "s3://b/a.tar", len(data), 0, '"v1"')
    starts, ends = index.sample_spans()
    root = str(tmp_path / "root")
    seeder = ChunkSeeder(root, room=int(ends[-1] - starts[0]) + 10)
    assert seeder.add("s3://b/a.tar", '"v1"', starts, ends, data) == seeder.bytes == int(ends[-1] - starts[0])
    layout = ShardLayout("s3://b/a.tar", '"v1"', starts, ends, root)
    assert list(seeder.held) == [os.path.join(layout.directory, "c000000")] and sorted(os.listdir(layout.directory)) == ["c000000"]
    files = LocalFiles()
    for sample in (0, 17, 39):
        buffer, offset = files.find(layout, sample)
        assert bytes(buffer[starts[sample] - offset : ends[sample] - offset]) == data[starts[sample] : ends[sample]]
    # another version of the shard is another folder; no room is left for it, and none is written
    assert seeder.add("s3://b/a.tar", '"v2"', starts, ends, data) == 0
    assert files.find(ShardLayout("s3://b/a.tar", '"v2"', starts, ends, root), 0) is None
    # a chunk already there (another process's, or the same shard named twice) is not counted again
    again = ChunkSeeder(root, room=1 << 30)
    assert again.add("s3://b/a.tar", '"v1"', starts, ends, data) == 0 and again.held == {}
    # thousands of shards with a few descriptors to spare: each file is closed once written
    small = shard_bytes(tmp_path, "b", 2)
    small_index = index_from_bytes(small, "s3://b/b.tar", len(small), 0, '"v1"')
    spans = small_index.sample_spans()
    many = ChunkSeeder(str(tmp_path / "many"), room=1 << 30)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 8, hard))
    try:
        for n in range(2000):
            many.add(f"s3://b/s{n:04d}.tar", '"v1"', *spans, small)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert len(many.held) == 2000 and many.bytes == 2000 * int(spans[1][-1] - spans[0][0])


def test_a_worker_stops_waiting_for_a_file_whose_writer_died_and_a_new_writer_clears_it(tmp_path):
    """A fetch process killed mid-write leaves a temporary file no one will finish: a worker that
    needs it reads the sample itself at once (the shard's folder names its writer, which is dead),
    not after WAIT_S; the fetch process started next keeps the complete files and removes the
    rest, in the folders its predecessor wrote only: a sibling of a pool writes the others."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    import numpy as np

    from hydrax.shards.readahead.folders import WRITER_FILE, chunk_name, claim_writer, held_files, part_name, writer_alive
    from support.timing import slack

    root = tmp_path / "readahead"
    layout = ShardLayout("s3://b/x.tar", "v1", np.array([0, 10_000_000]), np.array([9_000_000, 18_000_000]), str(root))
    sibling = ShardLayout("s3://b/y.tar", "v1", np.array([0]), np.array([100]), str(root))
    claim_writer(layout.directory)
    claim_writer(sibling.directory)
    (Path(layout.directory) / part_name(chunk_name(1))).write_bytes(b"")
    (Path(layout.directory) / chunk_name(0)).write_bytes(b"x" * 9_000_000)
    (Path(sibling.directory) / part_name(chunk_name(0))).write_bytes(b"")  # a live sibling's file on its way
    assert writer_alive(layout.directory)  # this process
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (Path(layout.directory) / WRITER_FILE).write_text(str(dead.pid))
    assert not writer_alive(layout.directory) and writer_alive(sibling.directory)
    started = time.monotonic()
    assert LocalFiles().find(layout, 1) is None
    assert time.monotonic() - started < slack(2)
    assert LocalFiles().find(layout, 0)[1] == 0  # a complete chunk is found as ever
    held = held_files(str(root), writers={dead.pid})
    assert held == {os.path.join(layout.directory, chunk_name(0)): 9_000_000}
    assert os.path.exists(os.path.join(sibling.directory, part_name(chunk_name(0))))
    assert not os.path.exists(os.path.join(layout.directory, part_name(chunk_name(1))))


def test_a_file_finished_while_a_worker_looks_is_found_not_read_again(tmp_path, monkeypatch):
    """A worker looks for a sample's finished file, then for the file being written: a chunk
    renamed into place between the two looks is still found (one more look), not left to the
    worker's own request; a chunk neither written nor finished is."""
    import numpy as np

    from hydrax.shards.readahead import localfiles
    from hydrax.shards.readahead.folders import chunk_name, part_name

    layout = ShardLayout("s3://b/x.tar", "v1", np.array([0, 100]), np.array([100, 200]), str(tmp_path))
    os.makedirs(layout.directory)
    part = os.path.join(layout.directory, part_name(chunk_name(0)))
    with open(part, "wb") as f:
        f.write(b"x" * 200)
    files = LocalFiles()
    real_map = files._map

    def map_then_finish(path):  # the writer renames the chunk just after the worker's first look
        found = real_map(path)
        if os.path.exists(part):
            os.rename(part, path)
        return found

    monkeypatch.setattr(files, "_map", map_then_finish)
    monkeypatch.setattr(localfiles, "WAIT_S", 0.0)
    view, offset = files.find(layout, 1)
    assert offset == 0 and bytes(view[100:200]) == b"x" * 100
    assert LocalFiles().find(ShardLayout("s3://b/y.tar", "v1", np.array([0]), np.array([10]), str(tmp_path)), 0) is None

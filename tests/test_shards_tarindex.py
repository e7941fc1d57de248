"""The tar index: header scanning (kernel against its Python twin and tarfile) and sample grouping."""

import io
import random
import tarfile

import numpy as np
import pytest

from hydrax import _core, _fallback
from hydrax.shards import Member, ShardFormatError, group_samples, scan_members

LONG_DIR = "deep/" + "/".join(f"level{i:02d}" for i in range(14))  # over 100 bytes, with slashes


def archive(fmt, entries):
    """A tar archive in ``fmt`` from (name, payload | "dir" | "symlink") entries."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tar:
        for name, payload in entries:
            info = tarfile.TarInfo(name)
            if payload == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif payload == "symlink":
                info.type = tarfile.SYMTYPE
                info.linkname = "elsewhere.jpg"
                tar.addfile(info)
            else:
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


def entries_for(fmt):
    entries = [
        ("a/", "dir"),
        ("a/0001.jpg", b"J" * 1000),
        ("a/0001.cls", b"7"),
        ("a/0002.jpg", b""),
        ("a/0002.cls", b"3"),
        ("a/link.jpg", "symlink"),
        (f"{LONG_DIR}/sample.json", b'{"x": 1}'),
    ]
    if fmt != tarfile.USTAR_FORMAT:
        entries.append(("n" * 150 + ".txt", b"long name without a slash"))
    if fmt == tarfile.PAX_FORMAT:
        entries.append(("unicodé/ключ.txt", "naïve".encode()))
    return entries


def reference(data):
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return [Member(m.name, m.offset_data, m.size) for m in tar.getmembers() if m.isreg()]


def both_scans(data, capacity=None):
    capacity = len(data) // 512 + 1 if capacity is None else capacity
    fast, slow = np.zeros((capacity, 7), np.int64), np.zeros((capacity, 7), np.int64)
    got_fast = _core.scan_tar(memoryview(data), fast)
    got_slow = _fallback.scan_tar(data, slow)
    return got_fast, fast[: got_fast[0]].tolist(), got_slow, slow[: got_slow[0]].tolist()


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT], ids=["ustar", "gnu", "pax"])
def test_members_match_tarfile_in_every_format(fmt):
    data = archive(fmt, entries_for(fmt))
    assert scan_members(data) == reference(data)
    fast, fast_rows, slow, slow_rows = both_scans(data)
    assert fast == slow and fast_rows == slow_rows and fast[1] == 0


def test_ustar_long_paths_use_the_prefix_field():
    data = archive(tarfile.USTAR_FORMAT, [(f"{LONG_DIR}/x.jpg", b"1")])
    _, rows, _, _ = both_scans(data)
    assert rows[0][3] == 345 and rows[0][4] > 0  # prefix offset and length within the first header
    assert scan_members(data)[0].name == f"{LONG_DIR}/x.jpg"


def test_scanning_reads_headers_only():
    payload = bytearray(b"\xff" * 4096)  # payload bytes that are no valid header at all
    data = archive(tarfile.GNU_FORMAT, [("big.bin", bytes(payload)), ("small.txt", b"s")])
    assert [m.name for m in scan_members(data)] == ["big.bin", "small.txt"]


def test_gnu_base256_sizes_are_read():
    data = bytearray(archive(tarfile.GNU_FORMAT, [("x.bin", b"abc")]))
    field = bytearray(12)
    field[0] = 0x80
    field[-1] = 3
    data[124:136] = field
    data[148:156] = b" " * 8
    data[148:156] = b"%06o\0 " % sum(data[:512])
    assert scan_members(bytes(data)) == [Member("x.bin", 512, 3)]


def test_a_bad_checksum_names_the_header_offset():
    data = bytearray(archive(tarfile.GNU_FORMAT, [("a.jpg", b"1" * 600), ("b.jpg", b"2")]))
    second = 512 + 1024
    data[second + 10] ^= 0x01
    with pytest.raises(ShardFormatError, match=rf"shard.tar: at byte offset {second}: bad header checksum"):
        scan_members(bytes(data), "shard.tar")


@pytest.mark.parametrize("cut", [700, 1536, 2048 + 512])
def test_a_truncated_shard_is_reported_with_its_offset(cut):
    data = archive(tarfile.GNU_FORMAT, [("a.jpg", b"1" * 600), ("b.jpg", b"2")])[:cut]
    with pytest.raises(ShardFormatError, match=r"at byte offset \d+: .*truncated"):
        scan_members(data, "shard.tar")


def _fix_checksum(data: bytearray, header: int) -> None:
    data[header + 148 : header + 156] = b" " * 8
    data[header + 148 : header + 156] = b"%06o\0 " % sum(data[header : header + 512])


def test_kernel_and_twin_agree_on_damaged_archives():
    rng = random.Random(1234)
    bases = [archive(fmt, entries_for(fmt)) for fmt in (tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT)]
    bases.append(archive(tarfile.PAX_FORMAT, [("p" * 120 + ".txt", b"x"), ("q.txt", b"y")]))  # a pax record first
    statuses = set()
    for attempt in range(600):
        data = bytearray(rng.choice(bases))
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(min(len(data), 4096))
            data[at] = rng.choice([rng.randrange(256), ord(rng.choice("0123456789 =\nx"))])
            if rng.random() < 0.6:  # a damaged header that still passes its checksum
                _fix_checksum(data, at - at % 512)
        if rng.random() < 0.3:
            del data[rng.randrange(len(data)) :]
        fast, fast_rows, slow, slow_rows = both_scans(bytes(data), capacity=rng.choice([1, 3, 64]))
        assert (fast, fast_rows) == (slow, slow_rows), f"attempt {attempt}"
        statuses.add(fast[1])
    assert statuses == {0, 1, 2, 3, 4, 5}  # every outcome was exercised


def test_grouping_follows_the_webdataset_rules():
    names = [
        "dir/a.seg.png", "dir/a.JPG",  # one sample, two fields, lower-cased
        "dir.v1/b.jpg",  # dots in directories are fine
        "x/y/z.tar.gz",
        ".hidden", "noext", "dir/.x.jpg",  # skipped, skipped, key "dir/"
        "__index__/meta.json", "__meta__",  # metadata members
        "c.jpg", "d.jpg", "c.cls",  # c again, not adjacent: a second sample
    ]
    members = [Member(name, 512 * i, i) for i, name in enumerate(names)]
    samples = group_samples(members)
    assert [(s.key, sorted(s.fields)) for s in samples] == [
        ("dir/a", ["jpg", "seg.png"]),
        ("dir.v1/b", ["jpg"]),
        ("x/y/z", ["tar.gz"]),
        ("dir/", ["x.jpg"]),
        ("c", ["jpg"]),
        ("d", ["jpg"]),
        ("c", ["cls"]),
    ]
    assert samples[0].fields["jpg"] == (512, 1)


def test_a_malformed_pax_record_is_reported():
    data = bytearray(archive(tarfile.PAX_FORMAT, [("p" * 120 + ".txt", b"x")]))
    at = data.index(b" path=")
    data[at] = ord("!")
    with pytest.raises(ShardFormatError, match=r"at byte offset 0: a pax extended header record is malformed"):
        scan_members(bytes(data))


def test_a_duplicate_field_names_the_sample_and_offset():
    members = [Member("k.jpg", 512, 1), Member("k.JPG", 1536, 1)]
    with pytest.raises(ShardFormatError, match=r"s.tar: at byte offset 1536: sample 'k' has field 'jpg' twice"):
        group_samples(members, "s.tar")


def test_shards_written_by_webdataset_group_like_webdataset_reads_them(tmp_path):
    wds = pytest.importorskip("webdataset")
    path = tmp_path / "shard-000000.tar"
    with wds.TarWriter(str(path)) as sink:
        for i in range(20):
            sink.write({"__key__": f"s{i:04d}", "jpg": bytes([i]) * (100 + i), "cls": str(i % 3).encode(), "json": b'{"i": %d}' % i})
    data = path.read_bytes()
    ours = {s.key: {f: data[o : o + n] for f, (o, n) in s.fields.items()} for s in group_samples(scan_members(data))}
    theirs = {
        sample["__key__"]: {k: v for k, v in sample.items() if not k.startswith("__")}
        for sample in wds.WebDataset(str(path), shardshuffle=False)
    }
    assert ours == theirs and len(ours) == 20

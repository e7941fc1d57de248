"""The tar index: header scanning (kernel against its Python twin and tarfile) and sample grouping."""

import io
import random
import tarfile

import numpy as np
import pytest

from hydrax import _core, _fallback
from hydrax.shards import Member, ShardFormatError, ShardIndex, group_samples, scan_members
from hydrax.shards.indexfile import index_from_bytes

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


def _header(kind: bytes, size_field: bytes, name: bytes = b"a.txt") -> bytearray:
    """One checksum-valid header of type ``kind`` whose size field holds ``size_field`` verbatim."""
    block = bytearray(512)
    block[: len(name)] = name
    block[100:108] = b"0000644\0"
    block[124:136] = size_field
    block[156:157] = kind
    block[257:263] = b"ustar\0"
    _fix_checksum(block, 0)
    return block


def _pax_member(records: bytes) -> bytes:
    payload = records + bytes(-len(records) % 512)
    return bytes(_header(b"x", b"%011o\0" % len(records))) + payload


@pytest.mark.parametrize("case", ["pax record length of 20 digits", "base-256 size that overflows", "negative base-256 size on a global header",
                                  "negative pax size", "pax size of 20 digits"])
def test_hostile_number_fields_are_format_errors_never_crashes_or_hangs(case):
    # issue 11: checksum-valid headers that once crashed the scanner, hung it inside nogil, or put
    # a field of -100,000,000 bytes into an index
    member = bytes(_header(b"0", b"%011o\0" % 3)) + b"abc".ljust(512, b"\0")
    end = bytes(1024)
    if case == "pax record length of 20 digits":
        data = _pax_member(b"99999999999999999999 path=x\n") + member + end
    elif case == "base-256 size that overflows":
        data = bytes(_header(b"0", b"\x80" + b"\xff" * 11)) + member + end
    elif case == "negative base-256 size on a global header":
        data = bytes(_header(b"g", b"\xff" * 12)) + member + end
    elif case == "negative pax size":
        data = _pax_member(b"20 size=-100000000\n") + member + end
    else:
        data = _pax_member(b"32 size=99999999999999999999\n") + member + end
    fast, fast_rows, slow, slow_rows = both_scans(data)
    assert (fast, fast_rows) == (slow, slow_rows)
    with pytest.raises(ShardFormatError) as caught:
        scan_members(data, "hostile.tar")
    assert caught.value.url == "hostile.tar" and caught.value.offset is not None
    with pytest.raises(ShardFormatError):
        index_from_bytes(data, "hostile.tar")


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
    assert statuses == {0, 1, 2, 3, 4, 5, 8}  # every outcome was exercised


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


# -- the index_tar kernel: headers and grouping in one pass ---------------------------------------

def kernel_and_twin(data):
    """index_tar's result from the kernel, after checking that its Python twin gives the same."""
    fast, slow = _core.index_tar(data), _fallback.index_tar(data)
    assert fast[:3] == slow[:3]
    for a, b in zip(fast[3:], slow[3:]):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    return fast


def reference_index(data):
    """The index group_samples gives, as index_tar's arrays, or the ShardFormatError it raises."""
    try:
        samples = group_samples(scan_members(data))
    except ShardFormatError as exc:
        return exc
    index = ShardIndex.from_samples(samples, len(data), 0)
    return ([f.encode("utf-8", "surrogateescape") for f in index.field_names], index._key_bytes, index._key_ends, index._sample_ends,
            index._entry_field, index._entry_offset, index._entry_size)


def assert_same_as_reference(data):
    status, offset, *arrays = kernel_and_twin(data)
    expected = reference_index(data)
    if status == 7:  # a field that is not ASCII: Python's rules decide
        return status
    if isinstance(expected, ShardFormatError):
        assert status in (1, 2, 3, 4, 6, 8) and f"at byte offset {offset}:" in str(expected)
    else:
        assert status == 0 and arrays[0] == expected[0]
        assert all(np.array_equal(a, b) for a, b in zip(arrays[1:], expected[1:]))
    return status


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT], ids=["ustar", "gnu", "pax"])
def test_the_index_kernel_groups_like_the_python_rules_in_every_format(fmt):
    data = archive(fmt, entries_for(fmt) + [("a/0003.JPG", b"x"), ("a/0003.Seg.PNG", b"y"), ("__meta__/x.json", b"{}")])
    assert assert_same_as_reference(data) == 0
    status, _offset, fields, *_ = kernel_and_twin(data)
    assert b"jpg" in fields and b"seg.png" in fields and b"JPG" not in fields
    index = index_from_bytes(data, "s.tar")
    last = len(index) - 1
    assert index.key(last) == "a/0003" and sorted(index.fields(last)) == ["jpg", "seg.png"]
    offset, size = index.fields(last)["seg.png"]
    assert data[offset : offset + size] == b"y"


TRICKY_NAMES = [
    "dir/a.seg.png", "dir/a.JPG", "dir.v1/b.jpg", "x/y/z.tar.gz", ".hidden", "noext", "dir/noext",
    "dir/.x.jpg", "a.b/.x.jpg", "a//.x", "p/q/.r", "x\n.jpg", "k.jpg\n", "k.", ".", "..", "a/.",
    "__index__/meta.json", "__meta__", "___/a.jpg", "____.jpg", "__ab__.jpg", "__a/b.jpg", "__ab__x/b.jpg",
    "c.jpg", "d.jpg", "c.cls", "C.jpg", "c.JPG", "z.A.b.C", "sp ace.t x t", "tab\t.jpg",
]


def test_tricky_names_group_like_the_python_rules():
    for first in range(len(TRICKY_NAMES)):  # every name at the start of a sample, and after every other
        names = TRICKY_NAMES[first:] + TRICKY_NAMES[:first]
        for fmt in (tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
            data = archive(fmt, [(name, name.encode()) for name in names])
            assert assert_same_as_reference(data) in (0, 6)


def test_keys_that_are_not_utf8_are_kept_byte_for_byte():
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT, encoding="utf-8", errors="surrogateescape") as tar:
        for name in ("caf\udce9/\udcff1.jpg", "caf\udce9/\udcff1.cls", "ключ.jpg"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    data = buffer.getvalue()
    assert assert_same_as_reference(data) == 0
    index = index_from_bytes(data)
    assert [index.key(i) for i in range(len(index))] == ["caf\udce9/\udcff1", "ключ"]


def test_fields_that_are_not_ascii_are_left_to_python():
    data = archive(tarfile.PAX_FORMAT, [("k.jpg", b"1"), ("k.ÉTÉ", b"2"), ("k.Straße", b"3")])
    status, offset, *_ = kernel_and_twin(data)
    assert (status, offset) == (7, 2560)  # after k.jpg, then a pax header for the non-ASCII name
    index = index_from_bytes(data, "s.tar")
    assert index.field_names == ("jpg", "été", "straße") and index.fields(0)["été"][1] == 1
    assert index.same_samples(ShardIndex.from_samples(group_samples(scan_members(data)), len(data), 0))


def test_a_duplicate_field_is_found_by_the_kernel_and_worded_by_the_python_rules():
    data = archive(tarfile.GNU_FORMAT, [("k.jpg", b"1"), ("k.cls", b"2"), ("k.JPG", b"3"), ("m.jpg", b"4")])
    status, offset, *_ = kernel_and_twin(data)
    assert (status, offset) == (6, 2560)
    with pytest.raises(ShardFormatError, match=r"s.tar: at byte offset 2560: sample 'k' has field 'jpg' twice") as raised:
        index_from_bytes(data, "s.tar")
    assert (raised.value.url, raised.value.offset) == ("s.tar", 2560)
    damaged = bytearray(data)
    damaged[3072 + 10] ^= 1  # "m.jpg"'s header: a header error after the duplicate wins, as it does in Python
    damaged = bytes(damaged)
    assert kernel_and_twin(damaged)[:2] == (1, 3072) and assert_same_as_reference(damaged) == 1


def test_many_distinct_fields_grow_the_kernels_table():
    entries = [(f"s{i // 100:03d}.f{i:04d}", b"") for i in range(700)] + [(f"s9.F{i:04d}", b"") for i in range(0, 700, 7)]
    data = archive(tarfile.GNU_FORMAT, entries)
    assert assert_same_as_reference(data) == 0
    assert len(kernel_and_twin(data)[2]) == 700


def test_number_fields_too_large_read_as_truncation_and_never_loop():
    # A directory whose base-256 size would wrap to -1024: a kernel that wrapped would step back
    # one block for ever. Then pax records with 30-digit lengths and sizes.
    data = bytearray(archive(tarfile.GNU_FORMAT, [("d", "dir"), ("x.jpg", b"1")]))
    data[124:136] = b"\x80\0\0\0" + (-1024).to_bytes(8, "big", signed=True)
    _fix_checksum(data, 0)
    assert kernel_and_twin(bytes(data))[:2] == (2, 0)
    assert both_scans(bytes(data))[0] == (0, 2, 0)
    huge_size = b"40 size=" + b"1" + b"0" * 30 + b"\n"  # a well-formed record
    for record, outcome in ((huge_size, (2, 1024)), (b"9" * 30 + b" path=x\n", (4, 0))):
        pax = bytearray(archive(tarfile.PAX_FORMAT, [("p" * 120 + ".txt", b"x")]))
        pax[512:1024] = record.ljust(512, b"\0")
        pax[124:136] = b"%011o\0" % len(record)
        _fix_checksum(pax, 0)
        assert kernel_and_twin(bytes(pax))[:2] == outcome
        fast, _, slow, _ = both_scans(bytes(pax))
        assert fast == slow == (0, *outcome)


def damaged_archives(rng, count):
    """``count`` random archives, most of them damaged: bytes changed (often in header fields,
    with the checksum then fixed), pax records broken, cut short."""
    pool = TRICKY_NAMES + [f"{LONG_DIR}/s{i}.jpg" for i in range(3)] + ["k.ÉTÉ", "n" * 150 + ".txt"]
    for _ in range(count):
        fmt = rng.choice([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
        names = [rng.choice(pool) for _ in range(rng.randint(1, 8))]
        if fmt == tarfile.USTAR_FORMAT:
            names = [n for n in names if n.isascii() and len(n.rsplit("/", 1)[-1]) < 100] or ["u.jpg"]
        data = bytearray(archive(fmt, [(n, bytes(rng.randrange(3)) * rng.randrange(700)) for n in names]))
        for _ in range(rng.randint(0, 4)):
            block = rng.randrange(len(data) // 512) * 512
            spot = rng.choice([124, 125, 130, 135, 148, 155, 156, 257, 262, 345, 0, 60, rng.randrange(512), 512 + rng.randrange(64)])
            if block + spot < len(data):
                data[block + spot] = rng.choice([rng.randrange(256), ord(rng.choice("0123456789 =\nx./_-+o")), 0x80, 0xFF, 0])
                if rng.random() < 0.7:
                    _fix_checksum(data, block + spot - (block + spot) % 512)
        if rng.random() < 0.2:
            del data[rng.randrange(len(data)) :]
        yield bytes(data)


def test_index_kernel_twin_and_python_rules_agree_on_damaged_archives():
    rng = random.Random(20240611)
    statuses = set()
    for data in damaged_archives(rng, 2500):
        statuses.add(assert_same_as_reference(data))
    assert statuses == {0, 1, 2, 3, 4, 6, 7, 8}  # every outcome was exercised


def test_index_from_bytes_reports_what_scan_members_reports():
    good = archive(tarfile.GNU_FORMAT, [("a.jpg", b"1" * 600), ("b.jpg", b"2")])
    for data in (good[:700], good[:1536], bytes(good[:10]) + b"!" + good[11:]):
        with pytest.raises(ShardFormatError) as expected:
            scan_members(data, "s.tar")
        with pytest.raises(ShardFormatError) as got:
            index_from_bytes(data, "s.tar")
        assert str(got.value) == str(expected.value) and got.value.offset == expected.value.offset
    with pytest.raises(ShardFormatError, match="s.tar: at byte offset 0: the shard is empty"):
        index_from_bytes(b"", "s.tar")

"""Mutation fuzzing of index files (``.hidx``, every format: v1, v2, v3 with image sizes) and wids dataset descriptors.

Valid files are mutated: bits flipped, cut, bytes inserted, deleted, overwritten or zeroed, 8-byte
numbers swapped or rewritten, header counts changed, and (to get past the checksums) arrays and
meta data changed and written out again, or the v2 checksum fixed up after raw damage. For every
mutant the outcome must be one of:

- an index that holds together with its shard: every field inside the shard it claims (and, through
  ``open_index``, inside the real one), in the order of a tar, and as many samples as the header
  says; ``hydrax shards verify`` agrees with it;
- a ``ShardFormatError`` naming the index file (``.url``) and, where it gives one, a byte
  ``.offset`` inside the file; ``verify_shard`` reports it as an unreadable index, never raising.

Descriptors must give a ShardSet whose shards load, or a ``ShardFormatError`` naming the
descriptor, or (for a shard URL mutated into another name) ``ObjectNotFoundError`` naming it.

``HYDRAX_FUZZ`` and ``HYDRAX_FUZZ_SEED`` set the mutants per test and the seed (see
``tests/support/fuzzing.py``); every mutant's rng is derived from (seed, test, number), and a failure
names all three. These run in the test's process: the only compiled code they reach is
``_core.check_index``, which reads nothing beyond the arrays it is given.
"""

from __future__ import annotations

import io
import json
import os
import random
import struct
import tarfile

import numpy as np
import pytest

from support.fuzzing import MUTANTS, SEED

from hydrax.errors import ObjectNotFoundError, ShardFormatError
from hydrax.shards import ShardIndex, ShardSet, build_index, index_path, indexfile, open_index
from hydrax.shards.manifest import manifest_json
from hydrax.shards.shardtable import ShardEntry
from hydrax.shards.indexfile import HEADER_SIZE, _to_v1_bytes, count_samples
from hydrax.shards.sizecolumn import SizeColumn, first_bad
from hydrax.shards.verify import verify_shard

ARRAYS = ("key_bytes", "key_ends", "sample_ends", "entry_field", "entry_offset", "entry_size")
# numbers that sit on the edges of the checks
EDGES = (0, 1, -1, 511, 512, 513, 2**31, 2**62, 2**63 - 1, -(2**63), -(2**62))


def write_shard(path: str, samples: int = 7) -> str:
    """A small shard: samples of two or three fields, one key that is not ASCII, one empty field."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for i in range(samples):
            key = f"s{i:03d}" if i != 3 else "clé-3"
            fields = {"jpg": bytes([i]) * (300 + 97 * i), "cls": str(i).encode()}
            if i % 3 == 0:
                fields["json"] = b"" if i == 0 else b'{"n": %d}' % i
            for field, data in fields.items():
                info = tarfile.TarInfo(f"{key}.{field}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture(scope="module")
def shard(tmp_path_factory) -> str:
    return write_shard(str(tmp_path_factory.mktemp("fuzz_index") / "train-0000.tar"))


def reseal(data: bytearray) -> None:
    """Fix up a v2 file's checksum, so the damage reaches the checks behind it."""
    if len(data) >= HEADER_SIZE and data[:16] == indexfile.MAGIC:
        data[48:52] = struct.pack("<I", indexfile._crc(bytes(data)))


def _interesting(rng: random.Random, near: int) -> int:
    """An int64 on an edge, next to ``near``, or anywhere."""
    value = rng.choice(EDGES + (near + rng.choice((-1, 1, -512, 512, 1024)), rng.randrange(-(2**63), 2**63)))
    return (value + 2**63) % 2**64 - 2**63


def mutate_bytes(original: bytes, rng: random.Random) -> bytes:
    """Raw damage to a file (either format)."""
    data = bytearray(original)
    op = rng.randrange(9)
    if op == 0:  # bit flips
        for _ in range(rng.randint(1, 8)):
            at = rng.randrange(len(data))
            data[at] ^= 1 << rng.randrange(8)
    elif op == 1:  # truncation
        del data[rng.randrange(len(data)) :]
    elif op == 2:  # bytes inserted
        at = rng.randrange(len(data) + 1)
        data[at:at] = rng.randbytes(rng.randint(1, 64))
    elif op == 3:  # bytes deleted
        at = rng.randrange(len(data))
        del data[at : at + rng.randint(1, 64)]
    elif op == 4:  # random bytes over a range
        at, span = rng.randrange(len(data)), rng.randint(1, 64)
        data[at : at + span] = rng.randbytes(len(data[at : at + span]))
    elif op == 5:  # a zeroed range
        at = rng.randrange(len(data))
        span = rng.randint(1, 256)
        data[at : at + span] = bytes(len(data[at : at + span]))
    elif op == 6:  # two 8-byte numbers swapped
        words = (len(data) - HEADER_SIZE) // 8
        if words > 1:
            a, b = (HEADER_SIZE + 8 * rng.randrange(words) for _ in range(2))
            data[a : a + 8], data[b : b + 8] = data[b : b + 8], data[a : a + 8]
    elif op == 7:  # an 8-byte number rewritten
        words = (len(data) - HEADER_SIZE) // 8
        if words:
            at = HEADER_SIZE + 8 * rng.randrange(words)
            data[at : at + 8] = struct.pack("<q", _interesting(rng, struct.unpack_from("<q", data, at)[0]))
    else:  # a header count (meta length, samples, entries, key bytes) rewritten
        if len(data) >= HEADER_SIZE:
            at, fmt = rng.choice(((20, "<I"), (24, "<q"), (32, "<q"), (40, "<q")))
            value = _interesting(rng, struct.unpack_from(fmt, data, at)[0])
            struct.pack_into(fmt, data, at, value % 2**32 if fmt == "<I" else value)
    if rng.random() < 0.5:
        reseal(data)
    return bytes(data)


def mutate_index(index: ShardIndex, rng: random.Random) -> ShardIndex:
    """A copy of ``index`` with one of its arrays or its meta data changed: files written from it
    are sealed, so only the consistency checks stand in the way."""
    arrays = {name: getattr(index, "_" + name).copy() for name in ARRAYS}
    size, mtime, fields, etag = index.shard_size, index.shard_mtime_ns, list(index.field_names), index.etag
    name = rng.choice(ARRAYS)
    array = arrays[name]
    op = rng.randrange(8)
    if op == 0 and len(array):  # one value rewritten
        at = rng.randrange(len(array))
        info = np.iinfo(array.dtype)
        array[at] = min(max(_interesting(rng, int(array[at])), info.min), info.max)
    elif op == 1 and len(array) > 1:  # two values swapped
        a, b = rng.sample(range(len(array)), 2)
        array[a], array[b] = array[b], array[a]
    elif op == 2 and len(array):  # one value dropped
        arrays[name] = np.delete(array, rng.randrange(len(array)))
    elif op == 3:  # one value repeated
        at = rng.randrange(len(array)) if len(array) else 0
        arrays[name] = np.insert(array, at, array[at] if len(array) else 0)
    elif op == 4 and len(array):  # a value nudged by a little
        at = rng.randrange(len(array))
        array[at] += rng.choice((-512, -1, 1, 512)) if array.dtype != np.uint8 else 1
    elif op == 5:  # the shard size the index claims
        size = max(0, size + rng.choice((-index.shard_size, -1, -512, 1, 512, 2**40)))
    elif op == 6:  # the field names
        fields = rng.choice((fields[:-1], fields + [fields[0]], fields + ["new"], [], ["\udcff", *fields[1:]]))
    else:  # time and etag: harmless to the arrays, which must then load
        mtime, etag = rng.choice((0, -1, mtime + 1)), rng.choice((None, "", "v2", "\x00"))
    changed = ShardIndex(size, mtime, fields, *(arrays[n] for n in ARRAYS), etag=etag)
    if index.sizes is not None:
        changed.sizes = mutate_sizes(index.sizes, rng) if rng.random() < 0.5 else index.sizes
    return changed


def mutate_sizes(sizes: SizeColumn, rng: random.Random) -> SizeColumn:
    """A copy of an image sizes column with one value rewritten, one dropped, or a field name changed."""
    widths, heights = sizes.widths.copy(), sizes.heights.copy()
    array = rng.choice((widths, heights))
    op = rng.randrange(3)
    if op == 0 and len(array):
        array[rng.randrange(len(array))] = rng.choice((0, -1, -(2**31), 2**31 - 1, 1))
    elif op == 1 and len(array):
        if array is widths:
            widths = np.delete(widths, rng.randrange(len(widths)))
        else:
            heights = np.delete(heights, rng.randrange(len(heights)))
    else:
        return SizeColumn(rng.choice(("", "png", "\udcff")), widths, heights)
    return SizeColumn(sizes.field, widths, heights)


def with_sizes(index: ShardIndex) -> ShardIndex:
    """``index`` with a sizes column of assorted valid sizes (0 x 0 for every third sample)."""
    sized = ShardIndex.from_bytes(index.to_bytes())
    widths = np.array([0 if i % 3 == 0 else 17 * i + 1 for i in range(len(index))], np.int32)
    sized.sizes = SizeColumn("jpg", widths, np.where(widths > 0, widths * 3 + 2, 0).astype(np.int32))
    return sized


def mutant(case: int, index: ShardIndex, v2: bytes, v1: bytes) -> tuple[str, bytes]:
    """Mutant number ``case``: what was done, and the file."""
    rng = random.Random(f"{SEED}/index/{case}")
    kind = rng.randrange(6)
    if kind == 0:
        return "v2 bytes", mutate_bytes(v2, rng)
    if kind == 1:
        return "v1 bytes", mutate_bytes(v1, rng)
    if kind == 4:
        return "v3 bytes", mutate_bytes(with_sizes(index).to_bytes(), rng)
    if kind == 5:
        return "v3 arrays", mutate_index(with_sizes(index), rng).to_bytes()
    changed = mutate_index(index, rng)
    if kind == 2:
        return "v2 arrays", changed.to_bytes()
    return "v1 arrays", _to_v1_bytes(changed)


def assert_tar_shaped(index: ShardIndex, shard_size: int) -> None:
    """Every field inside ``shard_size`` bytes, in archive order, each after a 512-byte header."""
    offsets, sizes = index._entry_offset.astype(np.int64), index._entry_size.astype(np.int64)
    assert ((offsets >= 512) & (sizes >= 0) & (offsets + sizes <= shard_size) & (offsets % 512 == 0)).all()
    ends = -(-(offsets + sizes) // 512) * 512
    assert (offsets[1:] >= ends[:-1] + 512).all()
    for i in range(len(index)):
        assert isinstance(index.key(i), str)
        assert all(index.field_names.count(f) == 1 for f in index.fields(i))


def lists_the_same(index: ShardIndex, other: ShardIndex) -> bool:
    """Whether both list the same keys and fields (unused field names aside)."""
    return len(index) == len(other) and all(
        index.key(i) == other.key(i) and index.fields(i) == other.fields(i) for i in range(len(index)))


def check_index_file(shard: str, data: bytes, truth: ShardIndex) -> None:
    """The outcomes the module docstring allows, for the index file ``data`` beside ``shard``."""
    path = index_path(shard)
    with open(path, "wb") as f:
        f.write(data)
    try:
        loaded = ShardIndex.load(path)
    except ShardFormatError as exc:
        loaded = None
        assert exc.url == path and str(exc).startswith(f"{path}: not a readable hydrax index ("), str(exc)
        assert exc.offset is None or 0 <= exc.offset <= len(data), exc.offset
    else:
        assert_tar_shaped(loaded, loaded.shard_size)
        if loaded.sizes is not None:  # one width and height per sample, none negative, zeros in pairs
            assert len(loaded.sizes.widths) == len(loaded.sizes.heights) == len(loaded)
            assert first_bad(loaded.sizes.widths, loaded.sizes.heights) is None and isinstance(loaded.sizes.field, str)
        if data[:16] == indexfile.MAGIC:
            assert count_samples(path) == len(loaded)
    try:
        opened = open_index(shard, write=False)
    except ShardFormatError as exc:
        assert exc.url == path, str(exc)
    else:
        assert loaded is not None and opened.shard_size == truth.shard_size
        assert_tar_shaped(opened, truth.shard_size)
    report = verify_shard(shard)  # never raises
    if loaded is None:
        assert report.index == "unreadable" and [p.kind for p in report.problems] == ["index"], report.problems
    elif loaded.shard_size == truth.shard_size and lists_the_same(loaded, truth):
        assert report.ok, report.problems
    else:
        assert report.index in ("stale", "differs") and not report.ok, report


def test_the_valid_files_load(shard):
    truth = build_index(shard)
    for data in (truth.to_bytes(), _to_v1_bytes(truth), with_sizes(truth).to_bytes()):
        check_index_file(shard, data, truth)
        assert open_index(shard, write=False).same_samples(truth)
    assert open_index(shard, write=False).sizes.widths[1] == 18


@pytest.mark.fuzz
def test_damaged_index_files_load_consistently_or_are_format_errors(shard):
    truth = build_index(shard)
    v2, v1 = truth.to_bytes(), _to_v1_bytes(truth)
    for case in range(MUTANTS):
        what, data = mutant(case, truth, v2, v1)
        try:
            check_index_file(shard, data, truth)
        except Exception as exc:  # anything: the case must be named to be replayed
            raise AssertionError(f"seed {SEED}, index mutant {case} ({what}): {type(exc).__name__}: {exc}") from exc
    os.unlink(index_path(shard))


# -- wids descriptors ---------------------------------------------------------------------------

def _random_value(rng: random.Random):
    return rng.choice([None, True, False, 0, -1, 2.5, 10**30, "", "/", "nosuch.tar", "\x00", "a.tar/", [], [1], {}, {"url": 1},
                       float("nan"), "x" * 300])


def _nodes(value, path=()):
    """Every place in parsed JSON: (path of keys and positions, value)."""
    yield path, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _nodes(item, path + (key,))
    elif isinstance(value, list):
        for number, item in enumerate(value):
            yield from _nodes(item, path + (number,))


def mutate_descriptor(text: str, rng: random.Random) -> bytes:
    if rng.random() < 0.4:
        return mutate_bytes(text.encode(), rng)
    descriptor = json.loads(text)
    places = list(_nodes(descriptor))
    path, _value = rng.choice(places)
    op = rng.randrange(3)
    if not path:
        descriptor = _random_value(rng) if op == 0 else descriptor
    else:
        parent = descriptor
        for step in path[:-1]:
            parent = parent[step]
        if op == 0:
            parent[path[-1]] = _random_value(rng)
        elif op == 1:
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[rng.choice(["base", "shardlist", "url", "nsamples", "filesize", "etag", "junk"])] = _random_value(rng)
        else:
            parent.insert(path[-1], _random_value(rng))
    return json.dumps(descriptor).encode()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz_wids")
    shards = [write_shard(str(folder / f"part-{n}.tar"), samples=3 + n) for n in range(2)]
    entries = [ShardEntry(path, os.path.getsize(path), None, len(build_index(path))) for path in shards]
    return str(folder), manifest_json(entries, "fuzz", str(folder))


def check_descriptor(path: str) -> None:
    named = {path}  # what an error may be about: the descriptor, a shard it lists, or that shard's index
    try:
        shards = ShardSet(path, write_index=False)
        named |= set(shards.urls) | {index_path(url) for url in shards.urls}
        for number in range(len(shards.urls)):
            shards.index(number)
    except ShardFormatError as exc:
        assert exc.url in named and str(exc).startswith(f"{exc.url}: "), str(exc)
    except ObjectNotFoundError as exc:
        assert exc.url in named and exc.url in str(exc) and not os.path.exists(exc.url), str(exc)


@pytest.mark.fuzz
def test_damaged_descriptors_are_format_errors_naming_them(dataset):
    folder, text = dataset
    path = os.path.join(folder, "fuzz.json")
    for case in range(MUTANTS):
        data = mutate_descriptor(text, random.Random(f"{SEED}/wids/{case}"))
        with open(path, "wb") as f:
            f.write(data)
        try:
            check_descriptor(path)
        except Exception as exc:
            raise AssertionError(f"seed {SEED}, descriptor mutant {case}: {type(exc).__name__}: {exc}\n{data[:300]!r}") from exc

"""The image sizes column of shard indexes: read from real images' headers, written as v3, checked when loaded."""

import json
import os
import struct

import numpy as np
import pytest
from support.imageshards import expected_sizes, write_image_shards

from hydrax.shards import ShardFormatError, ShardIndex, ShardWriter, build_index, index_file, index_path, indexfile, open_index
from hydrax.shards.indexfile import HEADER_SIZE, count_samples, index_from_bytes
from hydrax.shards.sizecolumn import SizeCounts, first_bad

pytest.importorskip("PIL")


@pytest.fixture
def images(tmp_path):
    return write_image_shards(tmp_path, count=25, per_shard=25)


def reseal(data: bytearray) -> bytes:
    data[48:52] = struct.pack("<I", indexfile._crc(bytes(data)))
    return bytes(data)


def column_places(data: bytes) -> tuple[int, int]:
    """Where the width and height arrays of a v3 file start."""
    samples = struct.unpack_from("<q", data, 24)[0]
    return len(data) - 4 * samples - (-(4 * samples) % 64) - 4 * samples, len(data) - 4 * samples


def test_sizes_are_pillows_upright_sizes_for_every_format_and_0x0_where_there_is_none(images):
    (path,), samples = images
    index = build_index(path, sizes="img")
    widths, heights = expected_sizes(samples)
    assert index.sizes.field == "img" and index.sizes.widths.dtype == index.sizes.heights.dtype == np.int32
    assert index.sizes.widths.tolist() == widths and index.sizes.heights.tolist() == heights
    assert (widths[1], heights[1]) == (30, 41)  # orientation 6 turns the stored 41 x 30 upright
    assert (widths[6], heights[6]) == (480, 641)
    assert [(w, h) for w, h in zip(widths, heights)][7:10] == [(0, 0)] * 3  # no field, not an image, cut short
    # 25 samples: 2 full turns of 10 and 5 more; each turn has one sample without the field and two unreadable
    assert index.size_counts() == SizeCounts(sized=19, lacking=2, unreadable=4)
    with open(path, "rb") as f:
        assert index_from_bytes(f.read(), sizes="img").sizes.widths.tolist() == widths


def test_a_field_no_sample_has_gives_0x0_for_every_sample(images):
    (path,), samples = images
    index = build_index(path, sizes="png")
    assert index.sizes.field == "png" and not index.sizes.widths.any() and not index.sizes.heights.any()
    assert index.size_counts() == SizeCounts(0, 25, 0)


def test_a_v3_file_round_trips_with_views_of_its_bytes_and_an_index_without_sizes_stays_v2(images):
    (path,), _ = images
    plain, sized = build_index(path), build_index(path, sizes="img")
    data = sized.to_bytes()
    assert struct.unpack_from("<I", data, 16)[0] == 3 and json.loads(data[64:64 + struct.unpack_from("<I", data, 20)[0]]) == {
        "format": "hydrax-tar-index-v3", "shard_size": plain.shard_size, "shard_mtime_ns": plain.shard_mtime_ns, "etag": None,
        "fields": list(plain.field_names), "sizes_field": "img"}
    back = ShardIndex.from_bytes(data, "x.hidx")
    assert back.same_samples(plain) and back.sizes.field == "img"
    assert np.array_equal(back.sizes.widths, sized.sizes.widths) and np.array_equal(back.sizes.heights, sized.sizes.heights)
    assert np.shares_memory(back.sizes.widths, np.frombuffer(data, np.uint8)) and not back.sizes.widths.flags.writeable
    width_at, height_at = column_places(data)
    assert width_at % 64 == 0 and height_at % 64 == 0 and len(data) == height_at + 4 * len(plain)
    assert back.to_bytes() == data and count_samples(data) == len(plain) == 25
    # without sizes: version 2, byte for byte what it was, and 8 bytes a sample (padded) smaller
    old = plain.to_bytes()
    assert struct.unpack_from("<I", old, 16)[0] == 2 and ShardIndex.from_bytes(old).sizes is None
    sized.sizes = None
    assert sized.to_bytes() == old and len(old) < len(data) - 8 * 25


def test_v2_files_still_load_and_gain_sizes_from_index_file(images):
    (path,), samples = images
    build_index(path).save(index_path(path))
    assert ShardIndex.load(index_path(path)).sizes is None and open_index(path).sizes is None
    result = index_file(path, sizes="img")
    assert result.samples == 0 and result.sizes_added and result.sizes == SizeCounts(19, 2, 4) and result.rebuilt is None
    assert open_index(path).sizes.widths.tolist() == expected_sizes(samples)[0]
    again = index_file(path, sizes="img")  # current, with sizes of that field: nothing to do
    assert (again.samples, again.sizes_added, again.sizes) == (0, False, SizeCounts(19, 2, 4))
    other = index_file(path, sizes="cls")  # another field's
    assert other.sizes_added and open_index(path).sizes.field == "cls" and other.sizes == SizeCounts(0, 0, 25)
    assert index_file(path).sizes == SizeCounts() and open_index(path).sizes.field == "cls"  # kept when not asked about
    forced = index_file(path, force=True, sizes="img")
    assert forced.samples == 25 and not forced.sizes_added and open_index(path).sizes.field == "img"


def test_a_shard_with_only_a_new_time_keeps_its_sizes(images):
    (path,), samples = images
    index_file(path, sizes="img")
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    refreshed = open_index(path)
    assert refreshed.shard_mtime_ns == 1_000_000_000 and refreshed.sizes.widths.tolist() == expected_sizes(samples)[0]
    assert ShardIndex.load(index_path(path)).sizes.field == "img"


def test_the_writer_records_sizes_of_the_shards_it_writes(tmp_path):
    paths, samples = write_image_shards(tmp_path, count=23, per_shard=10, sizes="img")
    assert len(paths) == 3
    widths = np.concatenate([ShardIndex.load(index_path(p)).sizes.widths for p in paths])
    assert widths.tolist() == expected_sizes(samples)[0]
    with ShardWriter(str(tmp_path / "t-%d.tar"), sizes="img") as writer:
        for sample in samples[:5]:
            writer.write(sample)
    assert writer.size_counts == SizeCounts(5, 0, 0)


def test_a_damaged_sizes_column_is_a_format_error_naming_the_file(images):
    (path,), _ = images
    data = build_index(path, sizes="img").to_bytes()
    width_at, height_at = column_places(data)
    flipped = bytearray(data)
    flipped[height_at + 5] ^= 0x40
    cases = [(bytes(flipped), "checksum mismatch", None), (data[:-4], "checksum mismatch|bytes, but its header describes", None)]
    for at, value, offset in ((width_at + 4, -3, width_at + 4), (height_at + 8, -1, height_at + 8), (height_at + 28, 9, width_at + 28),
                              (width_at + 4, 0, width_at + 4)):
        changed = bytearray(data)
        struct.pack_into("<i", changed, at, value)
        cases.append((reseal(changed), "has an image size of .* which cannot be", offset))
    meta_length = struct.unpack_from("<I", data, 20)[0]
    meta = json.loads(data[64:64 + meta_length])
    meta["sizes_field"] = 7
    text = json.dumps(meta).encode()
    changed = bytearray(data[:64] + text + data[64 + meta_length:])
    struct.pack_into("<I", changed, 20, len(text))
    cases.append((reseal(changed), "bytes, but its header describes|is not a field name", None))
    meta["sizes_field"], meta["format"] = "img", "hydrax-tar-index-v2"
    text = json.dumps(meta).encode().ljust(meta_length)
    cases.append((reseal(bytearray(data[:64] + text + data[64 + meta_length:])), "is not of format 'hydrax-tar-index-v3'", None))
    for number, (damaged, pattern, offset) in enumerate(cases):
        with pytest.raises(ShardFormatError, match=rf"case{number}.hidx: not a readable hydrax index \(.*({pattern})") as caught:
            ShardIndex.from_bytes(damaged, f"case{number}.hidx")
        assert caught.value.url == f"case{number}.hidx"
        if offset is not None:
            assert caught.value.offset == offset, number
    assert HEADER_SIZE == 64


def test_a_valid_column_has_no_negative_size_and_zeros_only_in_pairs():
    assert first_bad(np.array([0, 5, 3], np.int32), np.array([0, 6, 2], np.int32)) is None
    assert first_bad(np.array([0, 5, 0], np.int32), np.array([0, 6, 2], np.int32)) == 2
    assert first_bad(np.array([1, -5], np.int32), np.array([1, 6], np.int32)) == 1
    assert SizeCounts(1, 2, 3) + SizeCounts(10, 20, 30) == SizeCounts(11, 22, 33)


def test_sizes_are_not_read_from_a_shard_of_another_size_than_its_index(images, tmp_path):
    from hydrax.errors import ObjectChangedError
    from hydrax.shards.indexfile import measure_local_sizes

    (path,), _ = images
    index = build_index(path)
    (tmp_path / "other").mkdir()
    other, _ = write_image_shards(tmp_path / "other", count=3)
    with pytest.raises(ObjectChangedError, match=f"{other[0]}: the shard has .* bytes, its index was built for {index.shard_size}"):
        measure_local_sizes(index, other[0], "img")
    assert index.sizes is None

"""hydrax.shards.verify and ``hydrax shards verify``, on shards written here and then damaged."""

import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.timing import slack

from hydrax.shards import ShardFormatError, ShardIndex, ShardWriter, group_samples, index_path, scan_members
from hydrax.shards.tarindex import is_image_field
from hydrax.shards.verify import verify_shard

pytest.importorskip("PIL")


def hydrax(*args):
    return subprocess.run([sys.executable, "-m", "hydrax", *args], check=False, capture_output=True, text=True, timeout=slack(120))


def encode(pixels, kind):
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, kind)
    return buffer.getvalue()


@pytest.fixture
def shards(tmp_path):
    """Three indexed shards of 6 samples: a PNG, a JPEG on every other sample, and a cls label."""
    rng = np.random.default_rng(3)
    with ShardWriter(str(tmp_path / "good-%02d.tar"), maxcount=6) as writer:
        for i in range(18):
            pixels = rng.integers(0, 256, (6 + i % 3, 7, 3), np.uint8)
            sample = {"__key__": f"s{i:03d}", "png": encode(pixels, "PNG"), "cls": str(i % 3)}
            if i % 2:
                sample["jpg"] = encode(pixels, "JPEG")
            writer.write(sample)
    return writer.paths


def members_of(path):
    with open(path, "rb") as f:
        return scan_members(f.read(), path)


def test_sound_shards_pass(shards):
    report = verify_shard(shards[0], decode=True)
    assert report.ok and report.status == "ok" and report.problems == []
    assert (report.samples, report.members, report.images, report.index) == (6, 6 * 2 + 3, 6 + 3, "ok")
    assert report.size == os.path.getsize(shards[0])
    assert verify_shard(f"file://{shards[1]}").ok
    os.unlink(index_path(shards[2]))
    assert verify_shard(shards[2]).index == "none" and verify_shard(shards[2]).ok
    assert is_image_field("jpg") and is_image_field("seg.PNG") and not is_image_field("cls") and not is_image_field("png.txt")


def test_truncation_and_bad_checksums_are_located(shards, tmp_path):
    data = Path(shards[0]).read_bytes()
    truncated = tmp_path / "truncated.tar"
    truncated.write_bytes(data[:2000])
    report = verify_shard(str(truncated))
    assert not report.ok and [p.kind for p in report.problems] == ["tar"]
    assert "truncated" in report.problems[0].detail and report.problems[0].offset is not None
    assert report.messages()[0].startswith(f"{truncated}: at byte offset {report.problems[0].offset}: ")

    third = members_of(shards[0])[2]
    header = third.offset - 512
    damaged = bytearray(data)
    damaged[header + 3] ^= 0x20  # a letter of the member's name: the checksum no longer holds
    corrupt = tmp_path / "corrupt.tar"
    corrupt.write_bytes(bytes(damaged))
    (problem,) = verify_shard(str(corrupt)).problems
    assert (problem.kind, problem.offset) == ("tar", header) and "bad header checksum" in problem.detail

    (tmp_path / "empty.tar").write_bytes(b"")
    assert verify_shard(str(tmp_path / "empty.tar")).problems[0].detail.startswith("the shard is empty")
    missing = verify_shard(str(tmp_path / "absent.tar"))
    assert [p.kind for p in missing.problems] == ["missing"] and "absent.tar: the shard does not exist" in missing.messages()[0]


def test_a_header_zeroed_mid_shard_is_damage_not_the_end(shards, tmp_path):
    # tar readers (tarfile, and so webdataset) stop at the first zero block: half the samples
    # would vanish and verify said ok
    data = bytearray(Path(shards[0]).read_bytes())
    fourth = members_of(shards[0])[3]
    header = fourth.offset - 512
    data[header : header + 512] = bytes(512)
    damaged = tmp_path / "zeroed.tar"
    damaged.write_bytes(bytes(data))
    report = verify_shard(str(damaged))
    assert not report.ok
    (problem,) = report.problems
    assert (problem.kind, problem.offset) == ("tar", header) and "zeroed block" in problem.detail
    with pytest.raises(ShardFormatError) as caught:
        members_of(str(damaged))
    assert caught.value.offset == header
    # the real end of an archive (two zero blocks, then padding) is still the end
    assert len(members_of(shards[0])) > 4


def test_stale_and_disagreeing_indexes_are_found(shards):
    stat = os.stat(shards[0])
    os.utime(shards[0], ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # touched after indexing
    report = verify_shard(shards[0])
    assert report.index == "ok" and not report.problems  # a new time alone: loaders check and refresh it
    with open(shards[0], "ab") as f:
        f.write(bytes(1024))  # more end-of-archive blocks: another size
    report = verify_shard(shards[0])
    assert report.index == "stale" and [p.kind for p in report.problems] == ["stale index"]
    assert "hydrax shards index --force" in report.problems[0].detail

    # an index of the right size and time whose fourth sample is listed under another key
    with open(shards[1], "rb") as f:
        samples = group_samples(scan_members(f.read(), shards[1]), shards[1])
    samples[3].key = "renamed"
    stat = os.stat(shards[1])
    ShardIndex.from_samples(samples, stat.st_size, stat.st_mtime_ns).save(index_path(shards[1]))
    (problem,) = verify_shard(shards[1]).problems
    assert (problem.kind, problem.key, problem.offset) == ("index", "s009", min(o for o, _ in samples[3].fields.values()))
    assert "'renamed'" in problem.detail and verify_shard(shards[1]).index == "differs"

    shutil.copy(index_path(shards[2]), index_path(shards[1]))  # another shard's index
    report = verify_shard(shards[1])
    assert [p.kind for p in report.problems] == ["index"] and report.index == "differs"
    with open(index_path(shards[2]), "wb") as f:
        f.write(b"garbage")
    assert verify_shard(shards[2]).index == "unreadable"


def test_undecodable_images_are_named_only_with_decode(tmp_path):
    with ShardWriter(str(tmp_path / "img-%02d.tar"), maxcount=10) as writer:
        writer.write({"__key__": "fine", "jpg": encode(np.zeros((4, 4, 3), np.uint8), "JPEG")})
        writer.write({"__key__": "bad", "png": b"this is not a picture", "cls": "1"})
        writer.write({"__key__": "cut", "jpg": encode(np.full((32, 32, 3), 9, np.uint8), "JPEG")[:200]})
    path = writer.paths[0]
    assert verify_shard(path).ok
    report = verify_shard(path, decode=True)
    assert [(p.kind, p.key, p.field) for p in report.problems] == [("image", "bad", "png"), ("image", "cut", "jpg")]
    offsets = {m.name: m.offset for m in members_of(path)}
    assert report.problems[0].offset == offsets["bad.png"] and report.images == 1
    assert report.messages()[0] == (f"{path}: at byte offset {offsets['bad.png']}: sample 'bad' field 'png': "
                                    "not an image Pillow can read: cannot identify image file")


def test_sample_grouping_problems(tmp_path):
    with ShardWriter(str(tmp_path / "split-%02d.tar"), maxcount=10) as writer:
        for key in ("a", "b", "a"):  # the second 'a' is not consecutive with the first
            writer.write({"__key__": key, "cls": key})
    (problem,) = verify_shard(writer.paths[0]).problems
    assert (problem.kind, problem.key) == ("samples", "a") and "not consecutive" in problem.detail
    # a field twice in one sample: tests/test_errors.py checks that report to the letter


@pytest.mark.slow
def test_the_command_sums_up_and_names_every_problem(shards, tmp_path):
    result = hydrax("shards", "verify", "--decode", str(tmp_path / "good-{00..02}.tar"))
    assert result.returncode == 0, result.stderr
    assert "3 shards, 18 samples, 27 images decoded: 3 ok, 0 with problems" in result.stdout
    assert re.search(rf"^{re.escape(shards[0])} +6 +9 +ok +ok$", result.stdout, re.MULTILINE)

    data = Path(shards[0]).read_bytes()
    (tmp_path / "bad-truncated.tar").write_bytes(data[:3000])
    with ShardWriter(str(tmp_path / "bad-image-%02d.tar"), maxcount=10) as writer:
        writer.write({"__key__": "k1", "png": b"nope"})
    with open(shards[1], "ab") as f:
        f.write(bytes(1024))  # another size than the index was built for
    result = hydrax("shards", "verify", "--decode", "-j", "2", str(tmp_path / "*.tar"), str(tmp_path / "gone.tar"))
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.startswith("hydrax shards verify: ")]
    assert any(f"{tmp_path}/bad-image-00.tar: at byte offset 512: sample 'k1' field 'png': not an image" in line for line in lines)
    assert any(f"{tmp_path}/bad-truncated.tar: at byte offset" in line and "truncated" in line for line in lines)
    assert any(f"{shards[1]}: the shard changed after it was indexed (the index {shards[1]}.hidx was built for" in line for line in lines)
    assert any(f"{tmp_path}/gone.tar: the shard does not exist" in line for line in lines)
    assert len(lines) == 4
    assert "6 shards, 19 samples, 27 images decoded: 2 ok, 4 with problems" in result.stdout
    assert "stale index: the shard changed after it was indexed\n" in result.stdout and "missing: the shard does not exist" in result.stdout

    serial = hydrax("shards", "verify", "--json", "--decode", str(tmp_path / "*.tar"))
    parallel = hydrax("shards", "verify", "--json", "--decode", "--workers", "3", str(tmp_path / "*.tar"))
    assert serial.returncode == parallel.returncode == 1 and json.loads(serial.stdout) == json.loads(parallel.stdout)
    image = next(r for r in json.loads(serial.stdout) if r["url"].endswith("bad-image-00.tar"))
    assert image["problems"] == [{"kind": "image", "detail": "not an image Pillow can read: cannot identify image file",
                                  "offset": 512, "key": "k1", "field": "png"}]

    quiet = hydrax("shards", "verify", "-q", shards[0])
    assert (quiet.returncode, quiet.stdout) == (0, "")
    assert hydrax("shards", "verify", str(tmp_path / "none-*.tar")).returncode == 1
    assert hydrax("shards", "verify", "--workers", "x", shards[0]).returncode == 2


def test_help_explains_with_an_example():
    result = hydrax("shards", "verify", "--help")
    assert result.returncode == 0 and "examples:" in result.stdout and "hydrax shards verify --decode" in result.stdout
    assert "--endpoint-url" in result.stdout and "Exit status" in result.stdout

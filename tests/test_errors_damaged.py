"""Damaged shards, index files, dataset descriptors and images, and data in a read-only folder.

Each kind of damage is hydrax's own error naming the file (``.url``) and, where there is one, the
byte offset (``.offset``), and saying what to do; the commands print it on one line and exit 1;
``hydrax shards verify`` reports it without raising. ``hydrax shards index`` rebuilds a stale or
damaged index, and a ShardSet over a folder it cannot write indexes its shards in memory.
"""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from support.timing import slack

from hydrax.cli import main
from hydrax.errors import ShardFormatError
from hydrax.shards import ShardIndex, ShardSet, build_index, index_path, indexfile, open_index
from hydrax.shards.indexfile import _to_v1_bytes
from hydrax.shards.verify import verify_shard

ROOT = Path(__file__).resolve().parents[1]


def png(seed: int) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (12, 16, 3), np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def write_shard(path, samples: int = 4) -> str:
    """``samples`` samples of a PNG and a label, in a ustar shard."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(samples):
            for field, data in (("png", png(i)), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"k{i:03d}.{field}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return str(path)


def headers(path: str) -> list[int]:
    with tarfile.open(path) as tar:
        return [member.offset for member in tar.getmembers()]


def reseal(data: bytearray) -> bytes:
    data[48:52] = struct.pack("<I", indexfile._crc(bytes(data)))
    return bytes(data)


# -- damaged shards: ShardSet and the commands ----------------------------------------------------

def damage(path: str, how: str) -> int:
    """Damage the shard at ``path``; returns the byte offset the error must name."""
    data = bytearray(Path(path).read_bytes())
    third = headers(path)[2]
    if how == "checksum":
        data[third + 5] ^= 0x20  # a letter of the name: the header's checksum no longer holds
    elif how == "number":
        data[third + 124 : third + 136] = b"0000000009x\0"  # the size field, checksum fixed up
        data[third + 148 : third + 156] = b" " * 8
        data[third + 148 : third + 156] = b"%06o\0 " % sum(data[third : third + 512])
    else:  # cut inside the third member's payload
        del data[third + 600 :]
    Path(path).write_bytes(bytes(data))
    return third


HOW = ("checksum", "number", "truncated")
WORDS = {"checksum": "bad header checksum", "number": "not octal", "truncated": "truncated"}


@pytest.mark.parametrize("how", HOW)
def test_a_damaged_shard_is_a_format_error_at_its_offset_not_a_buffer_error(tmp_path, how):
    path = write_shard(tmp_path / "bad.tar")
    offset = damage(path, how)
    with pytest.raises(ShardFormatError) as caught:
        ShardSet(path)
    assert caught.value.url == path and caught.value.offset == offset
    assert str(caught.value).startswith(f"{path}: at byte offset {offset}: ") and WORDS[how] in str(caught.value)
    chained, seen = caught.value, []
    while chained is not None:
        seen.append(type(chained))
        chained = chained.__cause__ or chained.__context__
    assert BufferError not in seen
    assert not os.path.exists(index_path(path))


COMMANDS = {
    "index": ["shards", "index"],
    "inspect": ["shards", "inspect"],
    "stat": ["stat"],
    "show": ["show", "--out", "{tmp}/grid.png"],
    "bench": ["bench", "--seconds", "1"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_names_a_damaged_shard_in_one_line_and_fails(tmp_path, capsys, command):
    path = write_shard(tmp_path / "bad.tar")
    offset = damage(path, "checksum")
    argv = [a.format(tmp=tmp_path) for a in COMMANDS[command]] + [path]
    assert main(argv) == 1
    err = capsys.readouterr().err
    name = " ".join(COMMANDS[command][:2]) if command in ("index", "inspect") else command
    lines = [line for line in err.splitlines() if line.startswith("hydrax ")]
    assert lines == [(f"hydrax {name}: {path}: at byte offset {offset}: bad header checksum "
                      "(the shard is corrupt; rewrite or re-download it)")], err
    assert "Traceback" not in err and "BufferError" not in err


# -- damaged index files ---------------------------------------------------------------------------

def array_places(data: bytes) -> dict[str, int]:
    """Where each array of a v2 index file starts, by the format's rules (not the reader's code)."""
    meta_length, samples, entries, keys = struct.unpack_from("<Iqqq", data, 20)
    at, places = 64 + meta_length, {}
    for name, size, count in (("key_bytes", 1, keys), ("key_ends", 8, samples), ("sample_ends", 8, samples),
                              ("entry_field", 4, entries), ("entry_offset", 8, entries), ("entry_size", 8, entries)):
        at = -(-at // 64) * 64
        places[name] = at
        at += size * count
    return places


def with_arrays(index: ShardIndex, **arrays) -> ShardIndex:
    """``index`` with some arrays replaced (the writers write whatever an index holds)."""
    values = {name: arrays.get(name, getattr(index, "_" + name)) for name in
              ("key_bytes", "key_ends", "sample_ends", "entry_field", "entry_offset", "entry_size")}
    return ShardIndex(index.shard_size, index.shard_mtime_ns, index.field_names, *values.values())


def npz_with_raw_member(index: ShardIndex) -> bytes:
    """A v1 index whose ``entry_size`` member is raw bytes instead of a .npy array."""
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(_to_v1_bytes(index))) as old, zipfile.ZipFile(buffer, "w") as new:
        for item in old.infolist():
            new.writestr(item, b"not an array" if item.filename == "entry_size.npy" else old.read(item))
    return buffer.getvalue()


def damaged_indexes(index: ShardIndex) -> dict[str, bytes]:
    offsets, sizes = index._entry_offset, index._entry_size
    swapped = offsets.copy()
    swapped[[2, 3]] = swapped[[3, 2]]
    grown = sizes.copy()
    grown[0] += 1024  # the first field runs over the next member's header
    return {
        "v1 member that is not an array": npz_with_raw_member(index),
        "fields swapped": with_arrays(index, entry_offset=swapped).to_bytes(),
        "a field over the next header": with_arrays(index, entry_size=grown).to_bytes(),
        "a field not after a header": with_arrays(index, entry_offset=np.r_[100, offsets[1:]]).to_bytes(),
        "v1 fields swapped": _to_v1_bytes(with_arrays(index, entry_offset=swapped)),
        "v1 cut short": _to_v1_bytes(index)[:-40],
        "v2 cut short": index.to_bytes()[:-40],
    }


def test_damaged_index_files_are_format_errors_naming_the_file(tmp_path):
    shard = write_shard(tmp_path / "a.tar")
    path = index_path(shard)
    for what, data in damaged_indexes(build_index(shard)).items():
        Path(path).write_bytes(data)
        for load in (lambda: ShardIndex.load(path), lambda: open_index(shard), lambda: ShardSet(shard)):
            with pytest.raises(ShardFormatError) as caught:
                load()
            assert caught.value.url == path, what
            assert str(caught.value).startswith(f"{path}: not a readable hydrax index ("), what
            assert "hydrax shards index" in str(caught.value), what


def test_an_index_error_names_the_byte_of_the_file_at_fault(tmp_path):
    shard = write_shard(tmp_path / "a.tar")
    index = build_index(shard)
    fields = index._entry_field.copy()
    fields[5] = 9
    offsets = index._entry_offset.copy()
    offsets[4] = offsets[3]
    for data, array, item in ((with_arrays(index, entry_field=fields).to_bytes(), "entry_field", 5),
                              (with_arrays(index, entry_offset=offsets).to_bytes(), "entry_offset", 4)):
        with pytest.raises(ShardFormatError) as caught:
            ShardIndex.from_bytes(data, "x.hidx")
        width = 4 if array == "entry_field" else 8
        assert caught.value.offset == array_places(data)[array] + item * width
        assert f"at byte offset {caught.value.offset} of the index" in str(caught.value)
    data = bytearray(index.to_bytes())
    data[64] = ord("[")  # the meta data's JSON opens a list, and breaks where a key would end
    meta_length = struct.unpack_from("<I", data, 20)[0]
    with pytest.raises(json.JSONDecodeError) as broken:
        json.loads(bytes(data[64 : 64 + meta_length]))
    with pytest.raises(ShardFormatError, match="meta data is not JSON") as caught:
        ShardIndex.from_bytes(reseal(data), "x.hidx")
    assert caught.value.offset == 64 + broken.value.pos and caught.value.url == "x.hidx"


def test_verify_reports_damaged_indexes_and_never_raises(tmp_path):
    shard = write_shard(tmp_path / "a.tar")
    path = index_path(shard)
    for what, data in damaged_indexes(build_index(shard)).items():
        Path(path).write_bytes(data)
        report = verify_shard(shard)
        assert report.index == "unreadable" and [p.kind for p in report.problems] == ["index"], what
        assert f"(index {path})" in report.problems[0].detail
    result = main(["shards", "verify", "-q", shard])
    assert result == 1


def test_a_stale_index_error_names_the_index(tmp_path):
    shard = write_shard(tmp_path / "a.tar")
    open_index(shard)
    write_shard(shard, samples=5)
    with pytest.raises(ShardFormatError, match="was built for a shard of") as caught:
        open_index(shard)
    assert caught.value.url == index_path(shard)


# -- wids descriptors --------------------------------------------------------------------------------

GOOD = {"__kind__": "wids-shard-index-v1", "wids_version": 1, "shardlist": [{"url": "a.tar", "nsamples": 4}]}
MALFORMED = [
    ([1, 2], "not a wids-shard-index-v1 descriptor"),
    ({**GOOD, "shardlist": 5}, "its shardlist is int 5, not a list"),
    ({**GOOD, "shardlist": [{"url": "a.tar", "nsamples": 4}, 7]}, r"shardlist entry 1 needs 'url' and 'nsamples' \(it is 7\)"),
    ({**GOOD, "shardlist": [{"url": 3, "nsamples": 4}]}, "shardlist entry 0 has url 3, not the URL or path of a shard"),
    ({**GOOD, "shardlist": [{"url": "a.tar", "nsamples": "4"}]}, r"shardlist entry 0 \(a.tar\) has nsamples '4'"),
    ({**GOOD, "shardlist": [{"url": "a.tar", "nsamples": None}]}, "has nsamples None, not a whole number"),
    ({**GOOD, "shardlist": [{"url": "a.tar", "nsamples": -1}]}, "has nsamples -1, not a whole number"),
    ({**GOOD, "shardlist": [{"url": "a.tar", "nsamples": 10**30}]}, "not a whole number"),
    ({**GOOD, "base": 5}, "its base 5 is not a URL or folder"),
    ({**GOOD, "shardlist": [{"url": "a\0.tar", "nsamples": 4}]}, "not the URL or path of a shard"),
]


@pytest.mark.parametrize("descriptor, words", MALFORMED)
def test_a_malformed_descriptor_is_a_format_error_naming_it_and_the_entry(tmp_path, descriptor, words):
    write_shard(tmp_path / "a.tar")
    path = str(tmp_path / "train.json")
    Path(path).write_text(json.dumps(descriptor))
    with pytest.raises(ShardFormatError, match=words) as caught:
        ShardSet(path)
    assert caught.value.url == path and str(caught.value).startswith(f"{path}: ")


def test_a_shard_a_descriptor_lists_that_is_missing_is_named(tmp_path):
    from hydrax.errors import ObjectNotFoundError

    write_shard(tmp_path / "a.tar")
    path = str(tmp_path / "train.json")
    Path(path).write_text(json.dumps({**GOOD, "shardlist": [*GOOD["shardlist"], {"url": "gone.tar", "nsamples": 2}]}))
    shards = ShardSet(path)
    assert len(shards) == 6
    with pytest.raises(ObjectNotFoundError, match="gone.tar'?, listed in the manifest, does not exist"):
        _ = shards[5].key  # the shard's index loads when it is first read


# -- images ----------------------------------------------------------------------------------------------

def encoded(fmt: str, **options) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (24, 32, 3), np.uint8)).save(buffer, fmt, **options)
    return buffer.getvalue()


def test_truncated_and_corrupt_images_are_image_errors_naming_the_bytes():
    pytest.importorskip("PIL")
    from hydrax.image import ImageError, decode_into

    out = np.empty((8, 8, 3), np.uint8)
    webp, jpeg, png_ = encoded("WEBP"), encoded("JPEG"), encoded("PNG")
    cases = [webp[:40], encoded("WEBP", lossless=True)[:30], jpeg[:150], png_[: len(png_) // 2], b"not an image at all"]
    damaged = bytearray(png_)
    damaged[40:60] = bytes(20)
    cases.append(bytes(damaged))
    for data in cases:
        with pytest.raises(ImageError) as caught:
            decode_into(data, out)
        message = str(caught.value)
        assert message.startswith(f"bytes of length {len(data)}: "), message
        assert "object at 0x" not in message, message
    with pytest.raises(ImageError, match=r"^bytes of length 19: not an image Pillow can read: cannot identify image file$"):
        decode_into(b"not an image at all", out)


def test_an_image_error_names_the_file_it_was_read_from(tmp_path):
    pytest.importorskip("PIL")
    from hydrax.image import ImageError, decode_into

    path = tmp_path / "cut.webp"
    path.write_bytes(encoded("WEBP")[:40])
    with open(path, "rb") as f, pytest.raises(ImageError, match=rf"^{path}: truncated or corrupt"):
        decode_into(f, np.empty((8, 8, 3), np.uint8))
    with pytest.raises(ImageError, match=r"^bytes of length 40: truncated or corrupt"):
        decode_into(io.BytesIO(path.read_bytes()), np.empty((8, 8, 3), np.uint8))


# -- hydrax shards index over stale and damaged indexes ---------------------------------------------------

def test_index_rebuilds_a_stale_or_damaged_index_and_says_so(tmp_path, capsys):
    shard = write_shard(tmp_path / "a.tar")
    assert main(["shards", "index", "-q", shard]) == 0
    write_shard(shard, samples=6)  # the shard changed: another size and time
    assert main(["shards", "index", shard]) == 0
    out, err = capsys.readouterr()
    assert "indexed 1 of 1 shards (6 samples newly indexed; rebuilt 1 stale or damaged index)" in out
    assert f"hydrax shards index: {shard}: its index was stale (built for a shard of" in err and "rebuilt it" in err
    assert len(open_index(shard, write=False)) == 6 and ShardIndex.load(index_path(shard)).shard_size == os.path.getsize(shard)

    assert main(["shards", "index", shard]) == 0  # current: left alone
    out, err = capsys.readouterr()
    assert "indexed 1 of 1 shards (0 samples newly indexed)" in out and "rebuilt" not in err

    Path(index_path(shard)).write_bytes(b"garbage")
    assert main(["shards", "index", shard]) == 0
    out, err = capsys.readouterr()
    assert f"{shard}: its index was damaged (not a readable hydrax index" in err and "rebuilt 1" in out
    assert len(ShardIndex.load(index_path(shard))) == 6


# -- a folder that cannot be written ------------------------------------------------------------------------

READ_ONLY_CHECK = """
import json, logging, os, sys
logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
from hydrax.shards import ShardSet
shards = ShardSet(sys.argv[1] + "/*.tar")
print(json.dumps({"samples": len(shards), "first": bytes(shards[0]["cls"]).decode(),
                  "written": sorted(n for n in os.listdir(sys.argv[1]) if n.endswith(".hidx"))}))
"""


def _without_override() -> None:
    """In the child, before it runs Python: give up root's power to write where the permissions
    forbid it (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER), as a user without it would be."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2, 3):
        if libc.prctl(24, capability, 0, 0, 0):  # PR_CAPBSET_DROP: gone from the next program
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_a_read_only_folder_is_indexed_in_memory_with_a_warning(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    write_shard(folder / "a.tar")
    write_shard(folder / "b.tar", samples=3)
    folder.chmod(0o555)
    try:
        try:
            done = subprocess.run([sys.executable, "-c", READ_ONLY_CHECK, str(folder)], capture_output=True, text=True,
                                  check=False, timeout=slack(120), env=dict(os.environ, PYTHONPATH=str(ROOT)),
                                  preexec_fn=_without_override if os.geteuid() == 0 else None)
        except subprocess.SubprocessError as exc:  # a container that cannot drop capabilities
            pytest.skip(f"running as root, and cannot drop CAP_DAC_OVERRIDE for the check: {exc}")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {"samples": 7, "first": "0", "written": []}
        assert done.stderr.count("hydrax.shards.indexfile: could not write the index") == 2, done.stderr
        assert f"{folder}/a.tar.hidx" in done.stderr and "in memory" in done.stderr
    finally:
        folder.chmod(0o755)

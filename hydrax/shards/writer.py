"""ShardWriter: write samples into numbered tar shards, each with its index beside it.

The layout is webdataset's: members named ``key.field`` with the fields of a sample in sorted
order, ustar headers with mode 0444 and owner ``bigdata`` (pax records only where ustar cannot
hold a value: long or non-ASCII names, fractional times), the archive padded to a 10240-byte
record. Unlike webdataset's writer, the modification time defaults to 0, so identical input gives
byte-identical shards, and no empty shard is left behind by a writer that wrote nothing.
"""

from __future__ import annotations

import io
import os
import tarfile
from typing import Any, Callable, Mapping

from .indexfile import ShardIndex, index_path, measure_local_sizes
from .sizecolumn import SizeCounts
from .tarindex import Sample


class ShardWriter:
    """Write samples to shards named by ``pattern`` (printf-style, e.g. ``"out-%06d.tar"``).

    :param maxcount: start a new shard once the current one holds this many samples.
    :param maxsize: ... or this many payload bytes (headers not counted, so a shard can pass it by
        one sample), as webdataset counts.
    :param mtime: the modification time written into every header.
    :param start_shard: the number of the first shard.
    :param post: called with each finished shard's path (after its index is written).
    :param index: write ``<shard>.hidx`` beside each shard.
    :param sizes: a field name: each index records the image size of that field of every sample
        (see :mod:`~hydrax.shards.sizecolumn`), read from the finished shard's headers;
        :attr:`size_counts` adds up how they came out.
    """

    def __init__(self, pattern: str, maxcount: int = 100_000, maxsize: float = 3e9, *, mtime: float = 0,
                 start_shard: int = 0, post: Callable[[str], Any] | None = None, index: bool = True,
                 sizes: str | None = None) -> None:
        try:
            pattern % start_shard
        except TypeError:
            raise ValueError(f"pattern must hold one printf-style number such as %06d, got {pattern!r}") from None
        if maxcount < 1 or maxsize <= 0:
            raise ValueError(f"maxcount must be at least 1 and maxsize positive, got {maxcount} and {maxsize}")
        self.pattern = pattern
        self.maxcount = maxcount
        self.maxsize = maxsize
        self.mtime = mtime
        self.post = post
        self.write_index = index
        self.sizes = sizes
        self.size_counts = SizeCounts()
        self.shard = start_shard
        self.paths: list[str] = []
        self._tar: tarfile.TarFile | None = None
        self._path = ""
        self._samples: list[Sample] = []
        self._payload = 0
        self._last_key: str | None = None

    def write(self, sample: Mapping[str, Any]) -> int:
        """Write one sample (``__key__`` plus fields of bytes or str); returns its payload bytes."""
        key = sample.get("__key__")
        if not isinstance(key, str) or not key:
            raise ValueError(f"a sample needs a non-empty str '__key__', got {key!r}")
        if "." in key.rsplit("/", 1)[-1]:
            raise ValueError(f"key {key!r} has a '.' after its last '/': readers would split the key there")
        fields = {}
        for name, value in sample.items():
            if name.startswith("_"):
                continue
            if isinstance(value, str):
                value = value.encode("utf-8")
            if not isinstance(value, (bytes, bytearray, memoryview)):
                raise TypeError(f"sample {key!r}: field {name!r} is {type(value).__name__}; encode it to bytes first")
            fields[name] = bytes(value)
        if not fields:
            raise ValueError(f"sample {key!r} has no fields to write")
        if len({name.lower() for name in fields}) != len(fields):
            raise ValueError(f"sample {key!r}: fields {sorted(fields)} differ only in case; readers lower-case them")
        if self._tar is None or len(self._samples) >= self.maxcount or self._payload >= self.maxsize:
            self._next_shard()
        elif key == self._last_key:
            raise ValueError(f"sample {key!r} follows a sample with the same key: readers would merge them into one")
        entry = Sample(key)
        size = 0
        for name in sorted(fields):
            info = tarfile.TarInfo(f"{key}.{name}")
            info.size = len(fields[name])
            info.mtime = self.mtime
            info.mode = 0o444
            info.uname = info.gname = "bigdata"
            self._tar.addfile(info, io.BytesIO(fields[name]))
            # the payload ends the bytes just written, padded to whole blocks
            entry.fields[name.lower()] = (self._tar.offset - -(-info.size // 512) * 512, info.size)
            size += info.size
        self._samples.append(entry)
        self._payload += size
        self._last_key = key
        return size

    def _next_shard(self) -> None:
        self._finish()
        self._path = self.pattern % self.shard
        self.shard += 1
        self._tar = tarfile.open(self._path, "w", format=tarfile.PAX_FORMAT)
        self._samples, self._payload, self._last_key = [], 0, None

    def _finish(self) -> None:
        if self._tar is None:
            return
        self._tar.close()
        self._tar = None
        if self.write_index:
            stat = os.stat(self._path)
            index = ShardIndex.from_samples(self._samples, stat.st_size, stat.st_mtime_ns)
            if self.sizes is not None:
                measure_local_sizes(index, self._path, self.sizes)
                self.size_counts += index.size_counts()
            index.save(index_path(self._path))
        self.paths.append(self._path)
        if self.post is not None:
            self.post(self._path)

    def close(self) -> None:
        """Finish the current shard (and its index)."""
        self._finish()

    def abort(self) -> None:
        """Stop without finishing the current shard: close and delete it, with no index and no
        ``post`` call (for a caller that is failing; shards already finished stay)."""
        if self._tar is None:
            return
        tar, self._tar = self._tar, None
        # TarFile.close() would write the end-of-archive blocks; only the file is closed here.
        tar.fileobj.close()
        tar.closed = True
        try:
            os.unlink(self._path)
        except FileNotFoundError:
            pass

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

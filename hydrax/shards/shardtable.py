"""What is known of a set's shards before their indexes are read, held compactly.

:class:`ShardEntry` is one shard (URL, size, version, sample count, index). A set of many
thousand shards is held without a Python object per shard: URLs as a :class:`UrlList` (one byte
array), sizes, sample counts and versions as a :class:`ShardTable` (arrays), which makes
:class:`ShardEntry` objects on demand. The names of what hydrax keeps beside shards (index objects,
:data:`SUMMARY_NAME`) are here too, since a table's counts name the summary they came from.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Sequence

import numpy as np

from .indexfile import ShardIndex
from .sizecolumn import SizeCounts

#: Index objects and files sit beside their shard under this suffix.
INDEX_SUFFIX = ".hidx"
#: The folder summary ``hydrax shards index`` writes beside remote shards: a manifest of every
#: indexed shard of the folder, so set-up needs one request per folder instead of one per shard.
SUMMARY_NAME = "hydrax-index.json"


@dataclass
class ShardEntry:
    """One shard: its URL, size, version (ETag; None for local files), sample count and index.

    ``index`` is None until loaded (a manifest gives counts first); ``size`` and ``version`` may
    be None too until then.
    """

    url: str
    size: int | None = None
    version: str | None = None
    samples: int | None = None
    index: ShardIndex | None = None
    #: The manifest or folder summary that gave ``samples`` (named when the shard's index disagrees);
    #: where a count came from does not make two entries different.
    counted_by: str | None = field(default=None, compare=False)
    #: How the image sizes came out, for a shard whose index was just given them
    #: (``hydrax shards index --sizes``), else None.
    size_counts: SizeCounts | None = field(default=None, compare=False)


class UrlList(Sequence[str]):
    """A list of strings (shard URLs or paths, ETags) held compactly, and read like a list of str.

    All of it is one uint8 array: the count (int64), the ends of the strings (int64, count + 1,
    the first 0), then the strings, UTF-8 (``surrogateescape``, so any path goes through). Pickled
    it is that array: at a megabyte or more, workers started from the fork server map it from
    shared memory (see :mod:`hydrax.procs.pickling`) instead of each holding a Python list of strings.
    ``urls[i]`` gives a new str; a slice, a list of them. It compares equal to a list (or tuple)
    of the same strings, and to a :class:`UrlList` of them.
    """

    __slots__ = ("_data", "_count", "_ends", "_text")

    def __init__(self, strings: Iterable[str] = ()) -> None:
        strings = strings if isinstance(strings, (list, tuple)) else list(strings)
        text = "".join(strings).encode("utf-8", "surrogateescape")
        lengths = list(map(len, strings))
        if len(text) != sum(lengths):  # not a byte per character: encode each
            lengths = [len(s.encode("utf-8", "surrogateescape")) for s in strings]
        count = len(lengths)
        head = 8 * (count + 2)
        data = np.empty(head + len(text), np.uint8)
        numbers = data[:head].view(np.int64)
        numbers[:2] = (count, 0)
        np.cumsum(np.array(lengths, np.int64), out=numbers[2:])
        data[head:] = np.frombuffer(text, np.uint8)
        self._bind(data)

    def _bind(self, data: np.ndarray) -> None:
        self._data = data
        self._count = int(data[:8].view(np.int64)[0])
        head = 8 * (self._count + 2)
        self._ends = data[8:head].view(np.int64)
        self._text = memoryview(data[head:])

    @property
    def nbytes(self) -> int:
        """The size of the list's array in bytes."""
        return self._data.nbytes

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index):
        if isinstance(index, slice):
            start, stop, step = index.indices(self._count)
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            return list(self._strings(start, max(start, stop)))
        n = operator.index(index)
        if n < 0:
            n += self._count
        if not 0 <= n < self._count:
            raise IndexError(f"string {index} is out of range for {self._count} strings")
        return str(self._text[self._ends.item(n) : self._ends.item(n + 1)], "utf-8", "surrogateescape")

    def may_contain(self, text: str) -> bool:
        """False when no string contains ``text`` (True may also mean that two adjacent ones
        make it up): a quick test before looking at every string."""
        return text.encode("utf-8", "surrogateescape") in self._text.tobytes()

    def _strings(self, start: int, stop: int) -> Iterator[str]:
        ends, text = self._ends[start : stop + 1].tolist(), self._text
        for a, b in zip(ends, ends[1:]):
            yield str(text[a:b], "utf-8", "surrogateescape")

    def __iter__(self) -> Iterator[str]:
        return self._strings(0, self._count)

    def __eq__(self, other) -> bool:
        if isinstance(other, UrlList):
            return self._count == other._count and np.array_equal(self._data, other._data)
        if isinstance(other, (list, tuple)):
            return len(other) == self._count and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # like a list

    def __getstate__(self):
        return {"data": self._data}

    def __setstate__(self, state) -> None:
        self._bind(state["data"])

    def __repr__(self) -> str:
        if self._count <= 4:
            return f"UrlList({list(self)!r})"
        return f"UrlList([{self[0]!r}, {self[1]!r}, ..., {self[-1]!r}], {self._count} strings, {self.nbytes} bytes)"


class ShardTable:
    """What is known of each shard of a set before its index is loaded, compactly (no Python
    object per shard): :attr:`urls` and :attr:`versions` (ETags; None when no shard has one) as
    :class:`UrlList` s, and one int64 array of the sample counts (as their running sums,
    :attr:`starts`) and the sizes (:attr:`sizes`). A missing size is -1, a missing version ``""``.

    :meth:`entry` makes the :class:`ShardEntry` of one shard, on demand.
    """

    def __init__(self, urls: Sequence[str], sizes: Sequence[int], versions: Sequence[str], samples: Sequence[int],
                 counted_by: str | None = None) -> None:
        #: The manifest or folder summary whose counts these are; None: each remote shard's
        #: folder summary (a set of remote shards whose counts came from their folders' summaries).
        self.counted_by = counted_by
        self.urls = urls if isinstance(urls, UrlList) else UrlList(urls)
        count = len(self.urls)
        if not len(sizes) == len(versions) == len(samples) == count:
            raise ValueError(f"{count} URLs, {len(sizes)} sizes, {len(versions)} versions and {len(samples)} counts")
        numbers = np.empty((2, count + 1), np.int64)  # one array: pickled out of band from ~65,000 shards
        numbers[0, 0] = 0
        np.cumsum(np.asarray(samples, np.int64), out=numbers[0, 1:])
        numbers[1, :count] = np.asarray(sizes, np.int64)
        numbers[1, count] = -1
        self._numbers = numbers
        self.versions = UrlList(versions) if any(versions) else None

    @classmethod
    def from_entries(cls, entries: Sequence[ShardEntry]) -> ShardTable:
        """The table of ``entries`` (each with its sample count)."""
        return cls([e.url for e in entries], [-1 if e.size is None else e.size for e in entries],
                   [e.version or "" for e in entries], [e.samples for e in entries])

    def __len__(self) -> int:
        return len(self.urls)

    @property
    def starts(self) -> np.ndarray:
        """Where each shard's samples begin in the set, and the total (int64, shards + 1)."""
        return self._numbers[0]

    @property
    def sizes(self) -> np.ndarray:
        """Each shard's size in bytes, -1 where unknown (int64)."""
        return self._numbers[1, :-1]

    def version(self, shard: int) -> str | None:
        """The version (ETag) of shard number ``shard``, or None."""
        return None if self.versions is None else self.versions[shard] or None

    def entry(self, shard: int) -> ShardEntry:
        """A new :class:`ShardEntry` of shard number ``shard`` (without its index)."""
        size = self._numbers.item(1, shard)
        url = self.urls[shard]
        return ShardEntry(url, None if size < 0 else size, self.version(shard),
                          self._numbers.item(0, shard + 1) - self._numbers.item(0, shard),
                          counted_by=self.counted_by or summary_url(url))

    def entries(self) -> list[ShardEntry]:
        """Every shard's :class:`ShardEntry`."""
        return [self.entry(n) for n in range(len(self))]


def summary_url(url: str) -> str:
    """The folder summary (:data:`SUMMARY_NAME`) of the folder that holds ``url``."""
    return url.rsplit("/", 1)[0] + "/" + SUMMARY_NAME


def listing_kind(url: str) -> str:
    """What lists shards at ``url``: ``"folder summary"`` (:data:`SUMMARY_NAME`) or ``"manifest"``."""
    return "folder summary" if url.endswith("/" + SUMMARY_NAME) else "manifest"

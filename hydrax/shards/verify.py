"""Checking a shard end to end: its tar structure, its samples, its index, and (optionally) its images.

:func:`verify_shard` reads one shard (a local file, mapped; an ``s3://`` object, fetched whole,
since every header has to be read anyway) and returns a :class:`ShardReport` listing each
:class:`Problem` with the byte offset and sample key it concerns:

- the tar headers scan cleanly: every header checksum holds, number fields are octal, and the
  archive neither ends inside a member nor lacks its end-of-archive block;
- the members group into samples by the WebDataset rules (see :mod:`hydrax.shards.tarindex`),
  no field repeats within a sample, and no key returns after other keys (its members would be
  read as two samples);
- the ``<shard>.hidx`` index beside a local shard, if there is one, is readable, is not stale
  (it was built for the shard's present size and modification time, as :func:`open_index`
  demands) and lists exactly the samples, fields, offsets and sizes of the scan. Indexes of
  ``s3://`` shards live in a local cache and are rebuilt when the object changes, so they are
  not checked;
- with ``decode=True``, every image field (:data:`~hydrax.shards.tarindex.IMAGE_EXTENSIONS`) decodes through
  :func:`hydrax.image.decode_into` into a small array. That is the loader's own path, so it
  catches what training would trip over, damaged ICC profiles included, and it is cheaper than a
  full ``Image.load()`` because JPEGs are decoded scaled down in the DCT domain (all of the
  entropy-coded data is still read, so truncated or corrupt files are still caught).
"""

from __future__ import annotations

import mmap
import os
import re
from dataclasses import dataclass, field

from ..errors import LocatedError
from .indexfile import ShardIndex, index_path
from .options import S3Options, StoreOptions
from .router import store_for
from .shardtable import INDEX_SUFFIX
from .store import is_remote
from .tarindex import Sample, ShardFormatError, group_samples, is_image_field, scan_members

#: Field extensions (the part after the last dot of the field) that :func:`verify_shard` decodes.

# The edge of the array images are decoded into: small, so decoding is mostly the reading of the data.
_DECODE_EDGE = 16
# Pillow names the in-memory file it was given, which says nothing to the reader.
_BUFFER_NAME = re.compile(r" ?<_io\.BytesIO object at 0x[0-9a-fA-F]+>")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a shard.

    ``kind`` is one of ``"missing"``, ``"unreadable"``, ``"tar"``, ``"samples"``, ``"index"``,
    ``"stale index"`` and ``"image"``; ``offset``, ``key`` and ``field`` locate it where that
    makes sense (``offset`` is a byte offset in the shard).
    """

    kind: str
    detail: str
    offset: int | None = None
    key: str | None = None
    field: str | None = None

    def where(self) -> str:
        """``at byte offset N: sample 'k' field 'f'``, as far as the problem is located."""
        parts = []
        if self.offset is not None:
            parts.append(f"at byte offset {self.offset}")
        if self.key is not None:
            parts.append(f"sample {self.key!r}" + (f" field {self.field!r}" if self.field is not None else ""))
        return ": ".join(parts)

    def __str__(self) -> str:
        where = self.where()
        return f"{where}: {self.detail}" if where else self.detail


@dataclass
class ShardReport:
    """What :func:`verify_shard` found in one shard.

    ``samples`` and ``members`` are 0 when the tar could not be scanned; ``images`` counts the
    image fields decoded; ``index`` is ``"ok"``, ``"none"`` (no index beside the shard),
    ``"stale"``, ``"differs"`` or ``"unreadable"`` (for a remote shard, of its index object).
    """

    url: str
    size: int = 0
    members: int = 0
    samples: int = 0
    images: int = 0
    index: str = "none"
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether nothing is wrong."""
        return not self.problems

    @property
    def status(self) -> str:
        """``"ok"``, or the first problem in short: its kind, where it is, and its detail up to any
        parenthesised advice (plus how many more problems there are)."""
        if not self.problems:
            return "ok"
        first = self.problems[0]
        more = f" (+{len(self.problems) - 1} more)" if len(self.problems) > 1 else ""
        where = first.where()
        return f"{first.kind}{' ' + where if where else ''}: {first.detail.split(' (', 1)[0]}{more}"

    def messages(self) -> list[str]:
        """One line per problem, each starting with the shard's URL."""
        return [f"{self.url}: {problem}" for problem in self.problems]

    def to_json(self) -> dict:
        """The report as JSON-ready data."""
        return {
            "url": self.url, "ok": self.ok, "size": self.size, "members": self.members, "samples": self.samples,
            "images": self.images, "index": self.index,
            "problems": [{"kind": p.kind, "detail": p.detail, "offset": p.offset, "key": p.key, "field": p.field}
                         for p in self.problems],
        }


def verify_shard(url: str, *, decode: bool = False, s3: S3Options | StoreOptions | None = None) -> ShardReport:
    """Check the shard at ``url`` (a local path, ``file://``, ``s3://``, ``gs://`` or ``http(s)://``
    URL); see the module docs.

    Never raises for a bad shard: missing or unreadable shards, unreachable stores and every
    kind of damage become :class:`Problem` s in the report.
    """
    url = os.fspath(url)
    path = url.removeprefix("file://")
    report = ShardReport(url)
    if is_remote(path):
        _verify_remote(path, report, decode, s3 if isinstance(s3, StoreOptions) else StoreOptions(s3=s3 or S3Options()))
    else:
        _verify_local(path, report, decode)
    return report


def _verify_local(path: str, report: ShardReport, decode: bool) -> None:
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        report.problems.append(Problem("missing", "the shard does not exist (check the path or pattern)"))
        return
    except OSError as exc:
        report.problems.append(Problem("unreadable", f"cannot open the shard: {exc.strerror or exc}"))
        return
    with f:
        stat = os.fstat(f.fileno())
        report.size = stat.st_size
        if stat.st_size == 0:
            report.problems.append(Problem("tar", "the shard is empty (re-download or rewrite it)", offset=0))
            return
        try:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:  # a directory, a pipe, a file that cannot be mapped
            report.problems.append(Problem("unreadable", f"cannot read the shard: {exc}"))
            return
        # The checks keep no reference into the mapping once they return, so it can be closed.
        with mapped:
            samples = _check_structure(mapped, report)
            if samples is not None:
                _check_index(path, samples, stat.st_size, stat.st_mtime_ns, report)
                if decode:
                    _check_images(mapped, samples, report)


def _verify_remote(url: str, report: ShardReport, decode: bool, options: StoreOptions) -> None:
    try:
        store = store_for(url, options)
        data = store.read(url)
    except FileNotFoundError as exc:
        report.problems.append(Problem("missing", _detail(exc)))
        return
    except (OSError, ImportError, ValueError) as exc:  # unreachable store, refused credentials, bad URL
        report.problems.append(Problem("unreadable", _detail(exc)))
        return
    report.size = len(data)
    if not data:
        report.problems.append(Problem("tar", "the shard is empty (re-upload or rewrite it)", offset=0))
        return
    samples = _check_structure(data, report)
    if samples is not None:
        _check_remote_index(store, url, len(data), samples, report)
        if decode:
            _check_images(data, samples, report)


def _check_remote_index(store, url: str, size: int, samples: list[Sample], report: ShardReport) -> None:
    """The index object beside a remote shard, against the shard as scanned (``size`` bytes):
    what loaders trust there must hold as it does for a local ``.hidx``."""
    where = url + INDEX_SUFFIX
    try:
        index = ShardIndex.from_bytes(store.read(where), where)
        version = store.stat(url).version  # the ETag the loaders compare the index's with
    except FileNotFoundError:
        report.index = "none"
        return
    except (OSError, ValueError) as exc:  # ShardFormatError is a ValueError
        report.index = "unreadable"
        report.problems.append(Problem("index", _detail(exc) + f" (index {where})"))
        return
    stale = None
    if (index.shard_size, index.etag) != (size, version):
        stale = (f"the shard changed after it was indexed (the index {where} was built for a shard of {index.shard_size} "
                 f"bytes with ETag {index.etag}, but the shard has {size} bytes and ETag {version}; "
                 "loaders build a new index instead: rebuild it with `hydrax shards index --force`)")
    _compare_index(index, where, samples, stale, report)


def _detail(exc: BaseException) -> str:
    """What ``exc`` says is wrong, without the object it names (the report names the shard already)."""
    return exc.detail if isinstance(exc, LocatedError) else str(exc)


def _format_problem(kind: str, exc: ShardFormatError) -> Problem:
    """A Problem from a :class:`ShardFormatError` of the shard's scan: its detail, at its byte offset.

    Its key and field, which the detail names in words ("sample 'k' has field 'jpg' twice"), are
    not repeated as the problem's place."""
    return Problem(kind, exc.detail, offset=exc.offset)


def _check_structure(data, report: ShardReport) -> list[Sample] | None:
    """The shard's samples, or None (with a problem reported) when its headers do not scan."""
    url = report.url
    try:
        members = scan_members(data, url)
    except ShardFormatError as exc:
        report.problems.append(_format_problem("tar", exc))
        return None
    report.members = len(members)
    try:
        samples = group_samples(members, url)
    except ShardFormatError as exc:
        report.problems.append(_format_problem("samples", exc))
        return None
    report.samples = len(samples)
    seen: set[str] = set()
    for sample in samples:
        if sample.key in seen:
            first = min(offset for offset, _ in sample.fields.values())
            report.problems.append(Problem(
                "samples", "this key also names an earlier sample: its members are not consecutive, so readers "
                "see two samples with one key (rewrite the shard with each sample's members together)",
                offset=first, key=sample.key))
        seen.add(sample.key)
    return samples


def _check_index(path: str, samples: list[Sample], size: int, mtime_ns: int, report: ShardReport) -> None:
    where = index_path(path)
    try:
        index = ShardIndex.load(where)
    except FileNotFoundError:
        report.index = "none"
        return
    except (OSError, ShardFormatError) as exc:
        report.index = "unreadable"
        report.problems.append(Problem("index", _detail(exc) + f" (index {where})"))
        return
    # A new modification time alone (a copy, a checkout) is fine: loaders check the headers
    # against the index and refresh it. Another size, or other contents, is not.
    stale = None
    if index.shard_size != size:
        stale = (f"the shard changed after it was indexed (the index {where} was built for a shard of {index.shard_size} "
                 f"bytes modified at {index.shard_mtime_ns} ns, but the shard has {size} bytes, modified at {mtime_ns} ns; "
                 "loaders refuse it: rebuild it with `hydrax shards index --force`)")
    _compare_index(index, where, samples, stale, report)


def _compare_index(index: ShardIndex, where: str, samples: list[Sample], stale: str | None, report: ShardReport) -> None:
    """Report the index at ``where`` as ok, stale (``stale`` says why) or differing from ``samples``."""
    report.index = "ok"
    if stale is not None:
        report.index = "stale"
        report.problems.append(Problem("stale index", stale))
    difference = _index_difference(index, samples)
    if difference is not None:
        report.index = "differs" if report.index == "ok" else report.index
        offset, key, detail = difference
        report.problems.append(Problem("index", f"the index disagrees with the shard ({detail}; index {where}; rebuild it "
                                       "with `hydrax shards index --force`)", offset=offset, key=key))


def _index_difference(index: ShardIndex, samples: list[Sample]) -> tuple[int | None, str | None, str] | None:
    """(offset, key, what differs) at the first sample where ``index`` and the scan disagree, or None."""
    for i, sample in enumerate(samples[: len(index)]):
        first = min(offset for offset, _ in sample.fields.values())
        key = index.key(i)
        if key != sample.key:
            return first, sample.key, f"sample {i} has key {key!r} in the index"
        listed = index.fields(i)
        if listed != sample.fields:
            changed = sorted(set(listed) ^ set(sample.fields)) or sorted(f for f in listed if listed[f] != sample.fields[f])
            return first, sample.key, (f"fields {changed} differ (index: {dict(sorted(listed.items()))}, "
                                       f"shard: {dict(sorted(sample.fields.items()))}; as (offset, size))")
    if len(index) != len(samples):
        extra = samples[len(index)] if len(samples) > len(index) else None
        offset = min(o for o, _ in extra.fields.values()) if extra is not None else None
        return offset, extra.key if extra else None, f"the index lists {len(index)} samples, the shard has {len(samples)}"
    return None


def decode_check(data: bytes, out=None) -> None:
    """Decode the image ``data`` as ``verify --decode`` does (hydrax's decoder, its embedded
    colour profile applied, to a small image): raises what is wrong with it. ``hydrax shards build``
    checks images with this too, so that the two accept the same images."""
    import numpy as np

    from ..image import decode_into

    decode_into(data, np.empty((_DECODE_EDGE, _DECODE_EDGE, 3), np.uint8) if out is None else out)


def _check_images(data, samples: list[Sample], report: ShardReport) -> None:
    import numpy as np

    from ..image import ImageError

    out = np.empty((_DECODE_EDGE, _DECODE_EDGE, 3), np.uint8)
    for sample in samples:
        for name, (offset, size) in sample.fields.items():
            if not is_image_field(name):
                continue
            try:
                # a copy of the bytes, so no view into a mapping outlives the check
                decode_check(bytes(data[offset : offset + size]), out)
            except ImageError as exc:
                # the problem names the sample and field already, not only the bytes' length
                detail = _BUFFER_NAME.sub("", str(exc)).removeprefix(f"bytes of length {size}: ")
                report.problems.append(Problem("image", detail, offset=offset, key=sample.key, field=name))
            except Exception as exc:  # Pillow's plugins raise many kinds (ProfileError too); each is this image's fault
                detail = _BUFFER_NAME.sub("", f"{type(exc).__name__}: {exc}")
                report.problems.append(Problem("image", detail, offset=offset, key=sample.key, field=name))
            else:
                report.images += 1

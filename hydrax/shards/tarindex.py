"""The index of one tar shard: its regular members, and the samples they form.

:func:`scan_members` reads only the 512-byte headers (through the ``scan_tar`` kernel of
``_core.pyx``), understanding ustar ``prefix`` names, GNU ``L`` long names and pax ``path`` (and
``size``) records, and verifying every header checksum. :func:`group_samples` applies the
WebDataset rules: the key is the member path up to the first dot of its basename, the field is the
rest, lower-cased; consecutive members with one key form a sample; metadata members (``__…__``)
are skipped; a field may appear once per sample.

These two are the readable reference. Indexes are built faster by the ``index_tar`` kernel, which
applies the same rules during the header scan without a Python object per member (see
:func:`hydrax.shards.indexfile.index_from_bytes`); it leaves the rare shard it cannot group
itself (a field name with a non-ASCII byte, a field twice in a sample) to these functions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from .. import _core
from ..errors import ShardFormatError

_MESSAGES = {
    1: "bad header checksum (the shard is corrupt; rewrite or re-download it)",
    2: "the shard ends inside a member or has no end-of-archive block (it is truncated; re-download or rewrite it)",
    3: "a header number field is not octal (the shard is corrupt; rewrite or re-download it)",
    4: "a pax extended header record is malformed (the shard is corrupt; rewrite it)",
    8: "a zeroed block where a header should be, with data after it (the end of an archive is two zero blocks: "
       "the shard is damaged, and the members after this point would be lost; rewrite or re-download it)",
}
# WebDataset's split of a member path: a key (directory part plus a run of non-dots) and the rest.
_KEY_FIELD = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$", re.DOTALL)


__all__ = ["IMAGE_EXTENSIONS", "Member", "Sample", "ShardFormatError", "group_samples", "is_image_field", "scan_error", "scan_members"]


@dataclass(frozen=True)
class Member:
    """A regular file in a shard: its path and where its bytes are."""

    name: str
    offset: int
    size: int


@dataclass
class Sample:
    """Consecutive members sharing a key: ``fields`` maps each field to (offset, size)."""

    key: str
    fields: dict[str, tuple[int, int]] = field(default_factory=dict)


def scan_error(url: str, status: int, offset: int) -> ShardFormatError:
    """The error for a status of the ``scan_tar`` / ``index_tar`` kernels at byte ``offset``."""
    return ShardFormatError(_MESSAGES.get(status, f"scan error {status}"), url=url, offset=offset)


def scan_members(data, url: str = "<buffer>") -> list[Member]:
    """The regular members of the tar archive in ``data`` (bytes, mmap, memoryview), in order."""
    # The views are released before anything is raised: a traceback that kept one alive would
    # stop the caller from closing its mapping.
    members = []
    with memoryview(data) as raw, raw.cast("B") as view:
        rows = np.empty((len(view) // 512 + 1, 7), np.int64)
        count, status, offset = _core.scan_tar(view, rows)
        if not status:
            for _header, payload, size, prefix_at, prefix_len, name_at, name_len in rows[:count].tolist():
                name = bytes(view[name_at : name_at + name_len])
                if prefix_len:
                    name = bytes(view[prefix_at : prefix_at + prefix_len]) + b"/" + name
                members.append(Member(name.decode("utf-8", "surrogateescape"), payload, size))
    if status:
        raise scan_error(url, status, offset)
    return members


def _is_metadata(name: str) -> bool:
    first = name.split("/", 1)[0]
    return len(first) > 4 and first.startswith("__") and first.endswith("__")


def group_samples(members: list[Member], url: str = "<buffer>") -> list[Sample]:
    """Group members into samples by the WebDataset rules (see the module docstring)."""
    samples: list[Sample] = []
    for member in members:
        if _is_metadata(member.name):
            continue
        match = _KEY_FIELD.match(member.name)
        if match is None:
            continue
        key, suffix = match.group(1), match.group(2).lower()
        if not samples or samples[-1].key != key:
            samples.append(Sample(key))
        sample = samples[-1]
        if suffix in sample.fields:
            raise ShardFormatError(
                f"sample {key!r} has field {suffix!r} twice (members of one sample must have distinct extensions; "
                "rename or rewrite the shard)", url=url, offset=member.offset, key=key, field=suffix,
            )
        sample.fields[suffix] = (member.offset, member.size)
    return samples


#: Field names (last extension, lower-cased) that hold encoded images, as WebDataset names them.
IMAGE_EXTENSIONS = frozenset({
    "jpg", "jpeg", "jpe", "jfif", "png", "apng", "gif", "bmp", "dib", "webp", "tif", "tiff", "ppm",
    "pgm", "pbm", "pnm", "jp2", "j2k", "jpx", "avif", "heic", "heif", "jxl", "tga", "ico", "qoi",
})


def is_image_field(name: str) -> bool:
    """Whether the field ``name`` (``"jpg"``, ``"seg.png"``) holds an image, by its last extension."""
    return name.rsplit(".", 1)[-1].lower() in IMAGE_EXTENSIONS

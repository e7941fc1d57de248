"""Where a build's finished shards go: the output pattern, and publishing each shard whole.

A local shard is written under a temporary name in a hidden folder beside the final ones and
renamed into place with its index; a remote one is uploaded from a local temporary folder,
followed by its index object and, once the build ends, the folder summary. :class:`BuildOutput`
does both, and removes what it wrote when a build fails, so no partial shard is ever left under a
final name. Kept apart from the sources and the reading: it knows files of the pattern, not samples.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterable, Sequence

from ...errors import ObjectNotFoundError
from .sources import BuildError
from ..publish import write_summaries
from ..shardtable import INDEX_SUFFIX, ShardEntry
from ..indexfile import ShardIndex, index_path
from ..router import store_for
from ..options import S3Options, StoreOptions
from ..store import is_remote

_CONVERSION = re.compile(r"%(?:%|(0\d+)?d)?")


def parse_pattern(pattern: str) -> tuple[str, str]:
    """(the text before the number, the text after it), or :class:`BuildError`."""
    fields = []
    for match in _CONVERSION.finditer(pattern):
        if match.group(0) == "%%":
            continue
        if not match.group(0).endswith("d"):
            fields = []
            break
        fields.append(match)
    hint = "; write it like out/train-%06d.tar"
    if len(fields) != 1:
        raise BuildError(f"output pattern {pattern!r} must hold exactly one number field such as %06d{hint}")
    head, tail = pattern[: fields[0].start()], pattern[fields[0].end():]
    if "/" in tail:
        raise BuildError(f"output pattern {pattern!r}: the number must be in the file name, not a folder{hint}")
    if not tail.endswith(".tar"):
        raise BuildError(f"output pattern {pattern!r} must end in .tar (shards are uncompressed tar files){hint}")
    return head.replace("%%", "%"), tail.replace("%%", "%")


class BuildOutput:
    """Where finished shards go: renamed into place (local) or uploaded with an index object
    beside each (remote)."""

    def __init__(self, pattern: str, options: S3Options | StoreOptions | None) -> None:
        if pattern[:7].lower() == "file://":
            pattern = pattern[7:]
        self.pattern = pattern
        self.remote = is_remote(pattern)
        head, tail = parse_pattern(pattern)
        self.options = options if isinstance(options, StoreOptions) else StoreOptions(s3=options or S3Options())
        if not self.remote and "://" in pattern:
            store_for(pattern, self.options)  # ftp:// and the like: StoreError, not a folder named "ftp:"
        self.matches = re.compile(re.escape(head.rpartition("/")[2]) + r"\d+" + re.escape(tail) + r"(\.hidx)?")
        self.published: list[str] = []
        self.entries: list[ShardEntry] = []  # uploaded shards, for the folder summary
        self.sizes = 0
        self._uploads: deque[Future] = deque()
        self._uploader: ThreadPoolExecutor | None = None
        self._created: str | None = None
        if self.remote:
            self.folder = pattern.rpartition("/")[0]
            self.store = store_for(pattern, self.options)
            self.temp = tempfile.mkdtemp(prefix="hydrax-build-")
        else:
            self.folder = os.path.dirname(pattern) or "."
            # Parts of one build written at once (Ray tasks on one host) each make the folder if it
            # is missing: whichever makes it owns its removal; the others find it there.
            try:
                os.makedirs(self.folder)
                self._created = self.folder
            except FileExistsError:
                if not os.path.isdir(self.folder):
                    raise
            # In the output folder, so the rename onto the final name never crosses filesystems.
            self.temp = tempfile.mkdtemp(prefix=".hydrax-build-", dir=self.folder)
        self.temp_pattern = os.path.join(self.temp, os.path.basename(pattern))

    def existing(self) -> list[str]:
        """The files (or objects) of the pattern that exist already."""
        if not self.remote:
            return sorted(os.path.join(self.folder, n) for n in os.listdir(self.folder) if self.matches.fullmatch(n))
        prefix = self.folder + "/"
        try:
            found = self.store.list(prefix)
        except ObjectNotFoundError as exc:
            raise exc._replace(url=prefix, subject=exc.lead()) from exc
        names = [info.url[len(prefix):] for info in found]
        return [prefix + name for name in names if "/" not in name and self.matches.fullmatch(name)]

    def publish(self, temporary: str) -> None:
        """Move the finished shard ``temporary`` to its final name (ShardWriter's ``post``)."""
        name = os.path.basename(temporary)
        self.sizes += os.path.getsize(temporary)
        if not self.remote:
            final = os.path.join(self.folder, name)
            # The shard first: a final name then only ever holds a complete shard, and an index is
            # rebuilt from its shard if a crash separates them.
            os.replace(temporary, final)
            self.published.append(final)
            if os.path.exists(index_path(temporary)):
                os.replace(index_path(temporary), index_path(final))
            return
        # Upload in the background while the next shard is written; at most two shards wait on
        # local disk.
        if self._uploader is None:
            self._uploader = ThreadPoolExecutor(1, thread_name_prefix="hydrax-upload")
        while len(self._uploads) >= 2:
            self._uploads.popleft().result()
        self._uploads.append(self._uploader.submit(self._upload, temporary, f"{self.folder}/{name}"))

    def _upload(self, temporary: str, url: str) -> None:
        info = self.store.upload(url, temporary)
        self.published.append(url)
        # The index object beside it, tied to the version just written: ShardSet then sets up
        # without reading the shard.
        index = ShardIndex.load(index_path(temporary))
        index.etag = info.version
        self.store.write(url + INDEX_SUFFIX, index.to_bytes())
        self.entries.append(ShardEntry(url, info.size, info.version, len(index)))
        os.unlink(temporary)
        os.unlink(index_path(temporary))

    def finish(self, summary: bool = True) -> None:
        """Wait for uploads (then, with ``summary``, write the folder summary), and remove the
        temporary folder."""
        while self._uploads:
            self._uploads.popleft().result()
        if summary:
            self.write_summary(self.entries)
        self.close()

    def write_summary(self, entries: Sequence[ShardEntry]) -> None:
        """Add ``entries`` to the folder summary of a remote pattern (nothing for a local one)."""
        if self.remote and entries:
            write_summaries(entries, self.options)

    def remove(self, numbers: Iterable[int]) -> None:
        """Delete the shards of these numbers and their indexes, where they exist."""
        for number in numbers:
            final = self.pattern % number
            for path in (final, index_path(final) if not self.remote else final + INDEX_SUFFIX):
                try:
                    if self.remote:
                        self.store.delete(path)
                    elif os.path.exists(path):
                        os.unlink(path)
                except Exception:  # noqa: BLE001 - best effort: the failure being cleaned up matters more
                    pass

    def abort(self) -> None:
        """Remove everything this build wrote: temporary files and finished shards."""
        for upload in self._uploads:
            upload.cancel()
        if self._uploader is not None:
            self._uploader.shutdown(wait=True)
        for final in self.published:
            try:
                if self.remote:
                    self.store.delete(final)
                    self.store.delete(final + INDEX_SUFFIX)
                else:
                    for path in (final, index_path(final)):
                        if os.path.exists(path):
                            os.unlink(path)
            except Exception:
                pass  # best effort: the original failure is what gets reported
        self.published = []
        self.close()
        if self._created is not None:
            try:
                os.rmdir(self._created)
            except OSError:
                pass

    def close(self) -> None:
        """Stop the uploader and remove the temporary folder (what :meth:`finish` and :meth:`abort`
        end with; alone, when the output only wrote a summary or removed shards)."""
        if self._uploader is not None:
            self._uploader.shutdown(wait=True)
            self._uploader = None
        shutil.rmtree(self.temp, ignore_errors=True)


def refuse_existing(output: BuildOutput, force: bool) -> list[str]:
    """The files of ``output``'s pattern that exist; :class:`BuildError` if any do and not ``force``."""
    existing = output.existing()
    if existing and not force:
        raise BuildError(f"{existing[0]}: exists{f' (and {len(existing) - 1} more files of the pattern)' if len(existing) > 1 else ''}; "
                         "the build would overwrite it (--force overwrites)")
    return existing


def warn_stale(existing: Sequence[str], published: Sequence[str], warn: Callable[[str], Any]) -> None:
    """Warn about files of the pattern from before the build that it did not overwrite."""
    stale = sorted(set(existing) - {p for f in published for p in (f, index_path(f), f + INDEX_SUFFIX)})
    if stale:
        warn(f"{len(stale)} files of the pattern from before remain ({stale[0]}, ...): delete them, or "
             "readers of the pattern will read them too")

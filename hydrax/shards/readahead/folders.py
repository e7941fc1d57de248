"""The read-ahead area on disk: where its folders are and what the files in them are called.

Both sides read this one layout: the fetch processes that write the files and the workers that
read them, so each finds a sample's file without asking the other. Under a root (private to
the ShardSet, or a persistent ``cache_dir``) each shard version has a folder
(:func:`object_dir`); a shard is cut into sample-aligned chunks of about :data:`CHUNK_BYTES`
(:func:`chunk_starts`, :class:`ShardLayout`), written as ``c000012``, and samples read singly
as ``s00000042``; a file is written under a temporary name (:func:`part_name`) and renamed when
complete. :data:`WRITER_FILE` in a folder names the process writing it (:func:`claim_writer`),
so a worker waiting for a file stops when its writer is gone, and a fetch process started again
finds what its predecessors wrote whole (:func:`held_files`).

A private root goes in memory (:data:`MEMORY_FOLDER`) where that has room for the budget, and
is removed when its owner goes (:func:`finalizer`), or swept by a later process when the owner
was killed (:func:`sweep_dead_roots`).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import time
import weakref
from typing import Any

import numpy as np

from ...procs.liveness import process_alive
from ...procs.processes import at_server_exit
from .budget import DISK_SHARE, MEMORY_SHARE, host_room

#: Target size of a streamed chunk file; chunks end on sample boundaries, so one sample larger
#: than this is a chunk of its own.
CHUNK_BYTES = 8 << 20
#: A temporary file in a persistent cache untouched this long was left by a killed process.
STALE_PART_S = 600
_PRIVATE_PREFIX = "hydrax-readahead-"


def chunk_starts(starts: np.ndarray, ends: np.ndarray, target: int = CHUNK_BYTES) -> np.ndarray:
    """The first sample of every chunk of a shard whose samples span ``[starts[i], ends[i])``.

    A chunk takes samples until it holds at least ``target`` bytes; the result starts with 0.
    Pure and deterministic, so workers find the chunk of a sample without asking.
    """
    firsts = [0]
    chunk_start = int(starts[0]) if len(starts) else 0
    for i in range(1, len(starts)):
        if int(ends[i - 1]) - chunk_start >= target:
            firsts.append(i)
            chunk_start = int(starts[i])
    return np.asarray(firsts, np.int64)


def object_dir(root: str, url: str, version: str | None) -> str:
    """The directory of one object version under ``root``."""
    digest = hashlib.sha256(f"{url}\n{version}".encode()).hexdigest()[:32]
    return os.path.join(root, digest)


def chunk_name(chunk: int) -> str:
    return f"c{chunk:06d}"


def sample_name(sample: int) -> str:
    return f"s{sample:08d}"


def part_name(name: str) -> str:
    return f".{name}.part"


#: Where a private read-ahead folder goes when it fits: memory, like the budget it holds (a disk
#: file system would add its writeback to every byte the fetcher writes).
MEMORY_FOLDER = "/dev/shm"


def private_bases() -> list[str]:
    """The folders private read-ahead folders are made in (and swept from)."""
    bases = [tempfile.gettempdir()]
    if os.path.isdir(MEMORY_FOLDER) and os.access(MEMORY_FOLDER, os.W_OK | os.X_OK):
        bases.insert(0, MEMORY_FOLDER)
    return bases


def private_base(wanted: int) -> str:
    """Where a new private read-ahead folder for a budget of up to ``wanted`` bytes goes:
    :data:`MEMORY_FOLDER` when its free space leaves the budget as large as memory would (not a
    container's 64 MiB one), else the temporary directory."""
    bases = private_bases()
    if bases[0] == MEMORY_FOLDER and memory_folder_fits(wanted, *host_room(MEMORY_FOLDER)):
        return MEMORY_FOLDER
    return bases[-1]


def memory_folder_fits(wanted: int, available: int, free: int) -> bool:
    """Whether a memory folder with ``free`` bytes free leaves a budget of up to ``wanted`` bytes
    as large as ``available`` memory would (the shares of
    :func:`~hydrax.shards.readahead.budget.choose_budget`; a pure function)."""
    return DISK_SHARE * free >= min(wanted, MEMORY_SHARE * available)


def private_root(wanted: int = 0) -> str:
    """A new private read-ahead directory, for a budget of up to ``wanted`` bytes (see
    :func:`private_base`); directories of dead processes are swept first."""
    sweep_dead_roots()
    return tempfile.mkdtemp(prefix=f"{_PRIVATE_PREFIX}{os.getpid()}-", dir=private_base(wanted))


def sweep_dead_roots() -> None:
    """Remove the private read-ahead directories of processes that are gone (killed: a live one
    removes its own)."""
    pattern = re.compile(re.escape(_PRIVATE_PREFIX) + r"(\d+)-")
    for base in private_bases():
        try:
            entries = os.listdir(base)
        except OSError:
            entries = []
        for entry in entries:
            match = pattern.match(entry)
            if match and not process_alive(int(match.group(1))):
                shutil.rmtree(os.path.join(base, entry), ignore_errors=True)


# A fork server outlives a killed main process by a moment: it sweeps that process's folder (in
# /dev/shm, where it held memory) as it exits, rather than leave it to a later hydrax process.
at_server_exit(sweep_dead_roots)

#: The file in a shard's read-ahead folder that names the process writing its files (its pid), so
#: that a worker waiting for a file being written stops waiting when that process is gone.
WRITER_FILE = ".writer"


def claim_writer(folder: str) -> None:
    """Record this process as the writer of the files in the shard folder ``folder`` (see
    :data:`WRITER_FILE`): one process writes each folder's files (a pool of fetch processes
    splits the shards between them)."""
    os.makedirs(folder, exist_ok=True)
    temporary = os.path.join(folder, f"{WRITER_FILE}.{os.getpid()}")
    with open(temporary, "w") as f:
        f.write(str(os.getpid()))
    os.replace(temporary, os.path.join(folder, WRITER_FILE))


def folder_writer(folder: str) -> int | None:
    """The pid :data:`WRITER_FILE` names in ``folder``, or None."""
    try:
        with open(os.path.join(folder, WRITER_FILE)) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def writer_alive(folder: str) -> bool:
    """Whether the process that writes the files in ``folder`` lives (True when none is named)."""
    pid = folder_writer(folder)
    return pid is None or process_alive(pid)


def held_files(root: str, stale_s: float = 0.0, writers: set[int] | None = None) -> dict[str, int]:
    """``path -> size`` of the complete files under ``root``, oldest first; the temporary files
    there older than ``stale_s`` seconds are removed. With 0, all of them: a fetch process started
    again after another ended keeps what that one wrote whole, and drops what it left half-written.
    A persistent cache passes :data:`STALE_PART_S`, as another live process may be writing there.
    With ``writers`` (pids), only the folders one of them wrote to (see :func:`claim_writer`) are
    looked at: those of one fetch process of a pool, whose siblings are writing the others."""
    found = []
    for folder in os.scandir(root) if os.path.isdir(root) else ():
        if not folder.is_dir() or (writers is not None and folder_writer(folder.path) not in writers):
            continue
        for entry in os.scandir(folder.path):
            try:
                if entry.name == WRITER_FILE:
                    continue
                stat = entry.stat()
                if not entry.name.startswith("."):
                    found.append((stat.st_mtime_ns, entry.path, stat.st_size))
                elif time.time() - stat.st_mtime >= stale_s:
                    os.unlink(entry.path)
            except OSError:
                pass
    return {path: size for _, path, size in sorted(found)}


def remove_private_root(root: str, owner: int) -> None:
    """Remove ``root`` if this process made it (a forked copy of its owner must not)."""
    if os.getpid() == owner:
        shutil.rmtree(root, ignore_errors=True)


class ShardLayout:
    """What the fetcher and the workers need to know of one shard: where it is, its version, and
    where its samples and chunks are."""

    __slots__ = ("url", "version", "starts", "ends", "chunks", "directory")

    def __init__(self, url: str, version: str | None, starts: np.ndarray, ends: np.ndarray, root: str) -> None:
        self.url = url
        self.version = version
        self.starts = starts
        self.ends = ends
        self.chunks = chunk_starts(starts, ends)
        self.directory = object_dir(root, url, version)

    def chunk_of(self, sample: int) -> int:
        return int(np.searchsorted(self.chunks, sample, side="right")) - 1

    def chunk_span(self, chunk: int) -> tuple[int, int]:
        """Byte range ``[start, end)`` of chunk ``chunk`` in the shard."""
        first = int(self.chunks[chunk])
        last = int(self.chunks[chunk + 1]) - 1 if chunk + 1 < len(self.chunks) else len(self.starts) - 1
        return int(self.starts[first]), int(self.ends[last])


def finalizer(owner: Any, root: str) -> None:
    """Remove the private directory ``root`` when ``owner`` is collected or the process exits."""
    weakref.finalize(owner, remove_private_root, root, os.getpid())

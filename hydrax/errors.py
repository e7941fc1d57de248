"""The exceptions hydrax raises, in one hierarchy.

Every error of hydrax's own derives from :class:`HydraxError` and carries what it is about as
attributes (``.url``, ``.offset``) as well as in words. Where a standard exception type already
says what kind of failure it is, hydrax's error derives from it too, so ``except
FileNotFoundError`` or ``except PermissionError`` keeps working.
"""

from __future__ import annotations


class HydraxError(Exception):
    """Base of hydrax's own errors."""


class BatchTimeoutError(HydraxError, TimeoutError):
    """No batch arrived within the Dataloader's ``timeout_sec``; the message says what each worker was doing."""


class WorkerError(KeyboardInterrupt):
    """A loader process died or froze; the message names it and the item it was loading.

    It derives from KeyboardInterrupt because hydrax 0.2.2 surfaced a dead loader process as a
    KeyboardInterrupt, and programs written for it catch that to save a checkpoint.
    """


class BatchFailedError(HydraxError, RuntimeError):
    """A batch of a run that must not drop batches could not be loaded or placed.

    Runs that split batches over several processes, or that build global arrays with
    ``sharding``, never drop a batch: a lost share would pair one process's step with another's
    next step. So every process raises this at the same batch. ``batch`` describes it
    (``"batch 12 (epoch 0)"``), ``process_index`` is the process that failed, and ``reason`` is
    what went wrong there; on that process the original exception is the ``__cause__``.
    """

    def __init__(self, message: str, *, batch: str = "", process_index: int = 0, reason: str = "") -> None:
        super().__init__(message)
        self.batch = batch
        self.process_index = process_index
        self.reason = reason

    def __reduce__(self):
        return (_rebuild_batch_failed, (str(self), self.batch, self.process_index, self.reason))


def _rebuild_batch_failed(message, batch, process_index, reason):
    return BatchFailedError(message, batch=batch, process_index=process_index, reason=reason)


class LocatedError(HydraxError):
    """An error about a place in a file or object: ``url`` names it, ``offset`` the byte offset
    when known (None otherwise)."""

    def __init__(self, message: str, *, url: str | None = None, offset: int | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.offset = offset

    def __reduce__(self):
        # Exception pickling keeps only the message; workers send these to the main process.
        return _rebuild, (type(self), str(self), self.url, self.offset)


def _rebuild(kind, message, url, offset):
    return kind(message, url=url, offset=offset)


class ShardFormatError(LocatedError, ValueError):
    """A shard, index or manifest that is not valid, or breaks the WebDataset sample rules."""


class StoreError(LocatedError, OSError):
    """A read or write on a shard store (local disk, S3, GCS, HTTP) that failed for good.

    ``url`` names the object, ``offset`` the byte offset of the read (None for whole objects and
    listings). Transient failures are retried before this is raised, so a ``StoreError`` met
    while loading ends the run rather than silently dropping the data.
    """


class ObjectNotFoundError(StoreError, FileNotFoundError):
    """The object, bucket or file does not exist."""


class AccessDeniedError(StoreError, PermissionError):
    """The store refused the credentials, or they lack a permission the message names."""


class ObjectChangedError(StoreError):
    """The object was replaced after it was indexed (another ETag or modification time).

    Reads are pinned to the indexed version, so a replaced shard is never read as if it were the
    old one; rebuild its index (``hydrax shards index``) and restart.
    """


class StoreUnavailableError(StoreError, ConnectionError):
    """The store could not be reached, or kept failing, after the configured retries."""


class ImageError(HydraxError, ValueError):
    """An image that cannot be decoded: truncated, corrupt, of an unknown format, or too large.

    The message starts with what was decoded: the file's path, or ``bytes of length N``.
    """


class ProfileError(ImageError):
    """An image's embedded ICC profile cannot be used: it is malformed, or it does not describe
    the image's kind of data (for example a greyscale profile in an RGB image).

    :func:`hydrax.image.open_srgb` and :func:`hydrax.image.decode_into` raise it unless called
    with ``bad_profile="warn"``.
    """

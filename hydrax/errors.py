"""The exceptions hydrax raises, in one hierarchy.

Every error of hydrax's own derives from :class:`HydraxError` and carries what it is about as
attributes as well as in words: ``.url``, ``.offset``, ``.key`` and ``.field`` of a
:class:`LocatedError` (whose message is built from them), ``.batch``, ``.process_index`` and
``.reason`` of a :class:`BatchFailedError`, ``.process_name``, ``.pid``, ``.exitcode``, ``.signal``,
``.item``, ``.batch`` and ``.traceback`` of a :class:`WorkerError`. Where a standard exception type
already says what kind of failure it is, hydrax's error derives from it too, so ``except
FileNotFoundError`` or ``except PermissionError`` keeps working. The one exception to the rule is
:class:`WorkerError`: a ``KeyboardInterrupt``, as hydrax 0.2.2 raised, so that ``except
Exception`` does not swallow a dead worker.

hydrax's diagnostics (a failed item, a dead worker, a run shutting down) go to the ``"hydrax"``
logger and its children (``hydrax.run.loader``, ``hydrax.run.pipeline``, ``hydrax.procs.workers``,
``hydrax.shards.*``), with hydrax 0.2.2's words (``[hydrax]: dataloader failed``, ``[hydrax]
exception while loading data item: ...`` with its traceback). A program that configures no
logging sees the warnings and errors among them on stderr, as 0.2.2 printed them: that is
Python's own last resort (:data:`logging.lastResort`), which hydrax leaves in place: it adds no
handler of its own, not even a ``NullHandler``. Workers forked from the main process inherit its
logging set-up; workers started from the fork server (once JAX is live) start from a fresh
interpreter, so theirs is Python's default: warnings and errors on stderr.
"""

from __future__ import annotations


class HydraxError(Exception):
    """Base of hydrax's own errors."""

    #: The keyword arguments of its constructor, kept as attributes of the same names, that a
    #: pickled copy (a worker's error reaching the training process) is built again with.
    fields: tuple[str, ...] = ()

    def __reduce__(self):
        if not self.fields:
            return super().__reduce__()
        return (_rebuild_with_fields, (type(self), str(self), {name: getattr(self, name) for name in self.fields}))


def _rebuild_with_fields(kind, message, fields):
    return kind(message, **fields)


class BatchTimeoutError(HydraxError, TimeoutError):
    """No batch arrived within the Dataloader's ``timeout_sec``; the message says what each worker was doing."""


class WorkerError(KeyboardInterrupt):
    """A loader process died or froze; the message names it and the item it was loading.

    It derives from KeyboardInterrupt because hydrax 0.2.2 surfaced a dead loader process as a
    KeyboardInterrupt, and programs written for it catch that to save a checkpoint. (So it is not
    a :class:`HydraxError`, which is an ``Exception``.)

    Fields, each None where it is not known:

    - ``process_name`` and ``pid``: the loader process (``"hydrax-loader-3"``);
    - ``exitcode``: its exit status (negative: killed by a signal); None while it is still alive
      (a frozen worker) or when it is not known;
    - ``signal``: the name of the signal that killed it (``"SIGKILL"``), or None;
    - ``item``: the repr of the data item it was loading (shortened past 200 characters);
    - ``batch``: the batch that item belongs to, in words (``"batch 7 (epoch 1)"``);
    - ``traceback``: the worker's traceback text, when it sent one (a worker that could not start
      sends why before it exits).
    """

    def __init__(self, message: str = "", *, process_name: str | None = None, pid: int | None = None,
                 exitcode: int | None = None, signal: str | None = None, item: str | None = None,
                 batch: str | None = None, traceback: str | None = None) -> None:
        super().__init__(message)
        self.process_name = process_name
        self.pid = pid
        self.exitcode = exitcode
        self.signal = signal
        self.item = item
        self.batch = batch
        self.traceback = traceback

    # BaseException pickles ``args`` and ``__dict__``: the fields travel with the message.


class BatchFailedError(HydraxError, RuntimeError):
    """A batch of a run that must not drop batches could not be loaded or placed.

    Runs that split batches over several processes, or that build global arrays with
    ``sharding``, never drop a batch: a lost share would pair one process's step with another's
    next step. So every process raises this at the same batch. ``batch`` describes it
    (``"batch 12 (epoch 0)"``), ``process_index`` is the process that failed, and ``reason`` is
    what went wrong there; on that process the original exception is the ``__cause__``.
    """

    fields = ("batch", "process_index", "reason")

    def __init__(self, message: str, *, batch: str = "", process_index: int = 0, reason: str = "") -> None:
        super().__init__(message)
        self.batch = batch
        self.process_index = process_index
        self.reason = reason


class LocatedError(HydraxError):
    """An error about a place in a file or object, with the place as fields.

    - ``url``: the file or object (None when not known);
    - ``offset``: the byte offset in it, when known (None otherwise);
    - ``key`` and ``field``: the sample and the field of the sample it concerns, when it concerns
      one (None otherwise);
    - ``detail``: what is wrong, in words: the message without the place it starts with (after a
      ``subject``, all that follows it, which may start with ``at byte offset N:``).

    The message is built from them: ``"<url>: at byte offset <offset>: <detail>"``, leaving out
    what is not known (``"shard.tar: at byte offset 1536: sample 'k' has field 'jpg' twice
    (...)"``). Where the words name the place otherwise (``"shard 's3://b/k' does not exist"``),
    ``subject`` gives the words that come before ``detail`` (``"shard 's3://b/k' "``), and the
    message is ``subject + detail``.
    """

    def __init__(self, detail: str, *, url: str | None = None, offset: int | None = None, key: str | None = None,
                 field: str | None = None, subject: str | None = None) -> None:
        self.detail = detail
        self.url = url
        self.offset = offset
        self.key = key
        self.field = field
        self.subject = subject
        super().__init__(self._message())

    def _message(self) -> str:
        return self.lead() + self.detail

    def lead(self) -> str:
        """The words of the message before ``detail``."""
        if self.subject is not None:
            return self.subject
        place = [part for part in (self.url, None if self.offset is None else f"at byte offset {self.offset}") if part]
        return "".join(part + ": " for part in place)

    def _replace(self, **changes) -> LocatedError:
        """An error of the same type and fields, but for those in ``changes``."""
        fields = {name: getattr(self, name) for name in ("detail", "url", "offset", "key", "field", "subject")}
        fields.update(changes)
        return type(self)(fields.pop("detail"), **fields)

    def __reduce__(self):
        # Exception pickling would keep only the message; workers send these to the main process.
        return _rebuild, (type(self), self.detail, self.url, self.offset, self.key, self.field, self.subject)


def _rebuild(kind, detail, url, offset, key=None, field=None, subject=None):
    return kind(detail, url=url, offset=offset, key=key, field=field, subject=subject)


class ShardFormatError(LocatedError, ValueError):
    """A shard, index or manifest that is not valid, or breaks the WebDataset sample rules."""


class SizesNotRecordedError(LocatedError, LookupError):
    """Image sizes asked of shards whose indexes do not record them, where they cannot be read
    here (:meth:`ShardSet.image_sizes <hydrax.shards.ShardSet.image_sizes>` of remote shards, or
    with no field named and none recorded): ``url`` names the first such shard and ``field`` the
    field; the message gives the ``hydrax shards index --sizes`` command that records them."""


class StoreError(LocatedError, OSError):
    """A read or write on a shard store (local disk, S3, GCS, HTTP) that failed for good.

    ``url`` names the object, ``offset`` the byte offset of the read (None for whole objects and
    listings); the message usually names the object as ``shard '<url>'`` (its ``subject``). Transient failures are retried before this is raised, so a ``StoreError`` met
    while loading ends the run rather than silently dropping the data.
    """


class ObjectNotFoundError(StoreError, FileNotFoundError):
    """The object, bucket or file does not exist."""


class AccessDeniedError(StoreError, PermissionError):
    """The store refused the credentials, or they lack a permission the message names."""


class MissingPermissionError(AccessDeniedError):
    """The store accepted the credentials but refused the request: they lack the permission
    ``permission`` names (``"s3:ListBucket"``, ``"s3:GetObject"``, ``"storage.objects.list"``).

    Set-up tells it apart from credentials the store refused outright (an
    :class:`AccessDeniedError` of its own): a refused listing of shards named explicitly is then
    made up for with a HEAD per shard, where wrong keys would fail every request alike.
    """

    def __init__(self, detail: str, *, permission: str | None = None, **place) -> None:
        self.permission = permission
        super().__init__(detail, **place)

    def _replace(self, **changes) -> LocatedError:
        fields = {name: getattr(self, name) for name in ("detail", "url", "offset", "key", "field", "subject", "permission")}
        fields.update(changes)
        return type(self)(fields.pop("detail"), **fields)

    def __reduce__(self):
        return _rebuild_missing, (self.detail, self.url, self.offset, self.key, self.field, self.subject, self.permission)


def _rebuild_missing(detail, url, offset, key, field, subject, permission):
    return MissingPermissionError(detail, url=url, offset=offset, key=key, field=field, subject=subject, permission=permission)


class ObjectChangedError(StoreError):
    """The object was replaced after it was indexed (another ETag or modification time).

    Reads are pinned to the indexed version, so a replaced shard is never read as if it were the
    old one; rebuild its index (``hydrax shards index``) and restart.
    """


class RevisionMovedError(ObjectChangedError):
    """A branch (or tag) of a Hugging Face Hub repository now points at another commit than the
    one the cached indexes of its ``hf://`` shards were built from.

    ``ShardSet("hf://datasets/org/name/...")`` reads the commit its revision (``"main"`` unless
    ``revision=`` says otherwise) points at when it is set up, and records that commit beside the
    indexes it caches. A later set-up that finds the branch moved raises this instead of quietly
    training on other data. Fields, besides ``url`` (the shards as given):

    - ``revision``: the branch or tag (``"main"``);
    - ``expected``: the commit the cached indexes were built from;
    - ``actual``: the commit the branch points at now;
    - ``record``: the file that recorded ``expected`` (delete it to set up from ``actual``).

    Pass ``revision=expected`` to keep reading the data the cache was built from.
    """

    def __init__(self, detail: str, *, revision: str | None = None, expected: str | None = None, actual: str | None = None,
                 record: str | None = None, **place) -> None:
        self.revision = revision
        self.expected = expected
        self.actual = actual
        self.record = record
        super().__init__(detail, **place)

    def _replace(self, **changes) -> LocatedError:
        fields = {name: getattr(self, name) for name in ("detail", "url", "offset", "key", "field", "subject", "revision", "expected",
                                                         "actual", "record")}
        fields.update(changes)
        return type(self)(fields.pop("detail"), **fields)

    def __reduce__(self):
        return _rebuild_moved, (self.detail, self.url, self.offset, self.key, self.field, self.subject, self.revision, self.expected,
                                self.actual, self.record)


def _rebuild_moved(detail, url, offset, key, field, subject, revision, expected, actual, record):
    return RevisionMovedError(detail, url=url, offset=offset, key=key, field=field, subject=subject, revision=revision,
                              expected=expected, actual=actual, record=record)


class StoreUnavailableError(StoreError, ConnectionError):
    """The store could not be reached, or kept failing, after the configured retries."""


class StoreConfigError(StoreError, ValueError):
    """The store is set up wrongly, so no request to it can succeed: an endpoint URL that is not
    one, an ``http://`` endpoint obstore was not allowed to use, no credentials to be found, an
    option obstore rejects, a bucket or key that makes no valid request URL.

    It is raised at the first attempt, never retried. The message names the setting to fix and
    where it came from (``endpoint_url=`` / ``--endpoint-url``, ``AWS_ENDPOINT_URL_S3``,
    ``AWS_ENDPOINT_URL``, ...); ``url`` is the object or listing that was being reached.
    """


class CacheFileError(LocatedError, ValueError):
    """A batch file of the on-disk cache (``e{epoch}-b{index}.dat``) that cannot be used: shorter
    than the cache layouts need, or extras that are not what hydrax writes there.

    ``url`` (also ``path``) names the file and ``offset`` the byte offset of what is wrong (the
    end of the array bytes, for a short file or bad extras). The Dataloader does not raise it: it
    logs it as a warning and loads that batch through the loaders instead, as hydrax 0.2.2 did.
    """

    @property
    def path(self) -> str | None:
        """The batch file (same as ``url``)."""
        return self.url


class CacheMismatchError(HydraxError, RuntimeError):
    """A cache descriptor (``cache.json``) that does not describe this DataGroup's cache.

    The message is hydrax 0.2.2's, ``cache descriptor "<path>" does not match configuration``;
    ``path`` names the descriptor, ``expected`` holds the text this group would write and
    ``found`` the text on disk. A ``RuntimeError``, as 0.2.2 raised.
    """

    def __init__(self, path: str, expected: str, found: str) -> None:
        super().__init__(f'cache descriptor "{path}" does not match configuration')
        self.path = path
        self.expected = expected
        self.found = found

    def __reduce__(self):
        return (type(self), (self.path, self.expected, self.found))


class CacheNotFoundError(HydraxError, FileNotFoundError):
    """A read-only cache (``cache_readonly=True``, or a cache-only group) whose descriptor does
    not exist: the location is wrong, or the cache was never written. A ``FileNotFoundError``, as
    hydrax 0.2.2 raised; ``path`` names the missing descriptor."""

    fields = ("path",)

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path
        self.filename = path

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class CacheLocationError(HydraxError, OSError):
    """A writable cache's location cannot be created or written (a read-only file system, no
    permission, a file in the way). An ``OSError`` with its ``errno``; ``path`` is the location."""

    fields = ("path", "errno")

    def __init__(self, message: str, *, path: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.filename = path
        self.errno = errno

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ArenaMemoryError(HydraxError, MemoryError):
    """The batch slots a run needs (``depth`` slots of its largest batch) are more than the
    machine's memory: refused before anything is allocated. ``needed`` and ``available`` are in
    bytes; the message names the group and array that take the most."""

    fields = ("needed", "available")

    def __init__(self, message: str, *, needed: int, available: int) -> None:
        super().__init__(message)
        self.needed = needed
        self.available = available


class ConfigPicklingError(HydraxError, TypeError):
    """What a worker runs cannot be pickled for a worker started from the fork server.

    Raised on entering the Dataloader's ``with`` block once JAX is live (workers then start from
    a fork server and receive ``loader_func``, ``startup_func`` and the groups' data pickled); the
    message names the part that cannot be pickled (``loader_func's closure variable 'guard'``)
    and what to do. A ``TypeError``, as pickling's own errors are.
    """


class StartMethodError(HydraxError, RuntimeError):
    """``HYDRAX_START_METHOD=fork`` for a run whose data reads remote shards, in a process that
    already runs threads a forked worker does not inherit (obstore's request threads, once remote
    shards were read here): its workers would hang on their first request. Refused as the run
    starts, before any worker is forked. ``hazards`` names those threads; ``group`` is the index
    of the first group whose data reads remote shards."""

    fields = ("hazards", "group")

    def __init__(self, message: str, *, hazards: tuple[str, ...], group: int) -> None:
        super().__init__(message)
        self.hazards = hazards
        self.group = group


class MainImportError(HydraxError, ImportError):
    """The real main module was needed in a helper process, and importing it there failed.

    A process started from hydrax's fork server that looks up a name in the main module imports
    it then, as multiprocessing's spawn would; this is what it raises when that import fails.
    """


class ForkServerImportError(HydraxError, ImportError):
    """The loader fork server would import another copy of hydrax than the main process did.

    A folder named ``hydrax`` in the working directory (a clone, a stale copy) can come first on
    a new process's module path where the environment cannot keep it out (Python 3.10, or
    ``python -E``), or ``sys.path`` changed after hydrax was imported; the message names both
    copies and what to do. Raised when the fork server would start, before any worker runs.
    """


class ImageError(HydraxError, ValueError):
    """An image that cannot be decoded: truncated, corrupt, of an unknown format, or too large.

    The message starts with what was decoded: the file's path, or ``bytes of length N``.
    """


class ProfileError(ImageError):
    """An image's embedded ICC profile cannot be used: it is malformed, or it does not describe
    the image's kind of data (for example a greyscale profile in an RGB image).

    :func:`hydrax.image.open_srgb` and :func:`hydrax.image.decode_into` raise it unless called
    with ``bad_profile="warn"``. Where known, ``profile`` names the profile (its description and
    size) and ``tag`` the ICC tag at fault (such as ``"rTRC"``); else they are None.
    """

    fields = ("profile", "tag")

    def __init__(self, message: str = "", *, profile: str | None = None, tag: str | None = None) -> None:
        super().__init__(message)
        self.profile = profile
        self.tag = tag


class FieldNotFoundError(HydraxError, KeyError):
    """A sample has no field of the name asked for (``sample["jpg"]`` on a sample without a
    ``.jpg`` member). A ``KeyError``, as a missing key of a mapping is; ``url``, ``key`` and
    ``field`` say which shard, sample and field."""

    fields = ("url", "key", "field")

    def __init__(self, message: str, *, url: str | None = None, key: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.key = key
        self.field = field

    def __str__(self) -> str:  # KeyError would show the message quoted, as a key
        return str(self.args[0]) if self.args else ""


class TenbinError(LocatedError, ValueError):
    """tenbin data (a ``.ten`` file, a buffer, or the frames of one ZeroMQ message) that is not valid.

    ``url`` names the file (None for a buffer or a message), ``offset`` the byte offset of the
    chunk in a buffer or file (None for message frames), and ``detail`` says which array or frame
    and what is wrong with it. Also raised for arrays that tenbin cannot carry (complex, object,
    more than 32 dimensions).
    """


class ServeError(HydraxError):
    """A failure of batch serving over ZeroMQ (:mod:`hydrax.serve`); ``url`` names the endpoint.

    :param url: the endpoint, as the user wrote it (``"zpull://127.0.0.1:7880"``), or None.
    """

    fields = ("url",)

    def __init__(self, message: str, *, url: str | None = None) -> None:
        super().__init__(message)
        self.url = url


class MessageError(ServeError, ValueError):
    """A message that cannot be decoded: malformed frames, an unknown envelope, more bytes than
    ``max_message_bytes``, or arrays that do not match the schema the consumer expects. The
    consumer survives it: the message is counted and, unless ``on_bad_message="raise"``, skipped.
    """


class PeerTimeoutError(ServeError, TimeoutError):
    """A peer went silent: no message (data, marker or heartbeat) reached a consumer within its
    ``timeout``, or no consumer took a producer's batch within the producer's ``timeout``. The
    message names the endpoints and what was last seen from them."""


class SchemaError(ServeError, ValueError):
    """A producer's arrays are not what the consumer expects (its ``schema``): the message names
    the array and the difference (name, dtype or shape). Raised on the producer's announcement,
    before any of its batches is handed out."""


class ServeArgumentError(ServeError, ValueError):
    """An argument of a serving call (:func:`hydrax.ray.serve_on_ray`) that cannot be used,
    refused before anything starts. A ``ValueError``: a value out of range.

    - ``argument``: its name (``"producers"``);
    - ``value``: what was given;
    - ``limit``: the most it may be here (None where the value is too small or of the wrong type).
    """

    fields = ("argument", "value", "limit", "url")

    def __init__(self, message: str, *, argument: str, value: object = None, limit: int | None = None,
                 url: str | None = None) -> None:
        super().__init__(message, url=url)
        self.argument = argument
        self.value = value
        self.limit = limit


class ServeArgumentTypeError(ServeArgumentError, TypeError):
    """A :class:`ServeArgumentError` for a value of the wrong type (``producers=True``,
    ``producers=2.0``): also a ``TypeError``, as Python's own errors for a wrong type are."""


class CheckpointMismatchError(HydraxError, ValueError):
    """A saved loader position (:class:`hydrax.checkpoint.LoaderState`) that belongs to another
    dataset than the Dataloader asked to resume from it: resuming would not give the batches the
    interrupted run would have given.

    - ``expected``: the dataset fingerprint recorded in the checkpoint (what the resumed run
      should have);
    - ``actual``: this Dataloader's :attr:`~hydrax.Dataloader.dataset_fingerprint`;
    - ``differences``: what differs, one phrase each (``"training group 0: batch_size is 32 in
      the checkpoint, 64 here"``), as far as the checkpoint's summary of the dataset tells.

    A ``ValueError``: the ``start_at`` argument does not fit the other arguments.
    """

    fields = ("expected", "actual", "differences")

    def __init__(self, message: str, *, expected: str, actual: str, differences: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.expected = expected
        self.actual = actual
        self.differences = tuple(differences)


class CheckpointFormatError(HydraxError, ValueError):
    """A saved loader position this hydrax cannot read: written by a newer hydrax (a format
    ``version`` above the ``supported`` one), or not a hydrax loader state at all (``version``
    None). ``path`` names the file when it came from one."""

    fields = ("version", "supported", "path")

    def __init__(self, message: str, *, version: int | None, supported: int, path: str | None = None) -> None:
        super().__init__(message)
        self.version = version
        self.supported = supported
        self.path = path


class MixtureRangeError(HydraxError, ValueError):
    """A :class:`hydrax.Mixture` whose numbers its schedule cannot count: weights whose ratios a
    float cannot hold, or an epoch whose positions pass the 64-bit integers the schedule counts
    in (every position of epoch ``e`` is below ``(e + 1) * epoch_size``, which must not exceed
    ``2**63 - 1``). Refused where the number is given, rather than giving wrong batches.

    - ``argument``: what to change: ``"weights"``, ``"epoch_size"``, ``"start_at"``, or
      ``"end_at"`` (also for a run without an end that reached the last epoch);
    - ``epoch_size``: the mixture's positions per epoch (None for ``weights``);
    - ``epoch``: the epoch that does not fit (None for ``weights``);
    - ``last_epoch``: the last epoch that fits (-1: none; None for ``weights``).

    A ``ValueError``: an argument out of range.
    """

    fields = ("argument", "epoch_size", "epoch", "last_epoch")

    def __init__(self, message: str, *, argument: str, epoch_size: int | None = None, epoch: int | None = None,
                 last_epoch: int | None = None) -> None:
        super().__init__(message)
        self.argument = argument
        self.epoch_size = epoch_size
        self.epoch = epoch
        self.last_epoch = last_epoch

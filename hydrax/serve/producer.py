"""``serve``: publish a Dataloader's batches over ZeroMQ, straight from its batch slots.

Each batch's arrays go out as zero-copy frames of the slot they were loaded into: ZeroMQ holds
a reference to them until they are on the wire, and the slot returns to the loaders as soon as
it lets go (the Dataloader's own rule: a slot is free once nothing refers to its memory). With
the hydrax protocol every message says its epoch, batch and item indices, training and
validation batches go to their own topics, and each epoch and the stream end with a marker.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from ..run.batch import Batch
from ..order.schedule import stream_positions
from .connection import Connection
from .envelope import EPOCH_END
from .reliable import ShareSender
from .security import Curve

log = logging.getLogger(__name__)


@dataclass
class ServeReport:
    """What :func:`serve` sent: batches, bytes and seconds."""

    batches: int = 0
    bytes: int = 0
    seconds: float = 0.0
    #: False when the run was interrupted before its end (a share is then left open)
    complete: bool = True
    #: batches whose data went through a shared memory ring rather than the socket
    shared_batches: int = 0

    @property
    def mb_per_second(self) -> float:
        """Megabytes (10^6 bytes) per second."""
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0


def batch_arrays(batch: Batch, names: Iterable[str] | None = None) -> tuple[list[np.ndarray], list[str]]:
    """The batch's arrays as numpy views of its slot (no copy on CPU), in ``names`` order (default: layout order)."""
    names = list(batch.layouts) if names is None else list(names)
    missing = [n for n in names if n not in batch.arrays]
    if missing:
        raise KeyError(f"the batch has no array {missing[0]!r}; it has {', '.join(batch.arrays)}")
    return [np.asarray(batch.arrays[n]) for n in names], names


def batch_fields(batch: Batch, items: bool = True) -> dict[str, Any]:
    """The envelope fields that say which batch this is (and its item indices)."""
    if batch.is_training:
        fields = {"epoch": batch.epoch, "batch": batch.epoch_batch, "batch_num": batch.batch_num, "group": batch.group_index}
    else:
        fields = {"epoch": batch.validation_epoch, "batch": batch.validation_epoch_batch,
                  "batch_num": batch.validation_batch_num, "group": batch.group_index, "validation": True}
    if items:
        fields["items"] = [int(i) for i in batch.indices]
    return fields


def _run_key(batch: Batch) -> tuple[bool, int]:
    return (True, batch.epoch) if batch.is_training else (False, batch.validation_epoch)


def serve(dataloader: Any, url: str | Iterable[str], *, arrays: Iterable[str] | None = None, protocol: str = "hydrax",
          topic: str = "train", validation_topic: str = "validation", items: bool = True, timeout: float | None = 60.0,
          hwm: int = 4, subscribers: int = 0, curve: Curve | None = None, report: float = 0.0, noexpand: bool = False,
          share: tuple[int, int] | None = None, max_queued_bytes: int | None = None, fingerprint: str = "",
          shared_memory: int | bool | None = None) -> ServeReport:
    """Run ``dataloader`` and send every batch it delivers to ``url``; returns what was sent.

    :param dataloader: a :class:`hydrax.Dataloader` (not yet entered: ``serve`` enters and
        leaves it), or any iterable of batches.
    :param url: where to send (``zpub://0.0.0.0:7880``, ``zpush://trainer:7880``, ...).
    :param arrays: the array names to send, in order (default: every array, in layout order).
        They travel as the tenbin infos.
    :param protocol: ``"hydrax"`` (envelopes, topics, markers) or ``"tensorcom"`` (what
        tensorcom's consumers read: bare arrays, nothing else).
    :param topic: the topic of training batches; ``validation_topic`` that of validation batches.
    :param items: send each batch's item indices in its envelope.
    :param timeout: seconds a send may wait for a consumer (see :class:`Connection`).
    :param hwm: messages queued per peer before sending blocks.
    :param max_queued_bytes: the producer's memory budget for batches ZeroMQ still holds (see
        :class:`Connection`).
    :param subscribers: on pub/sub, wait for this many subscribers before the first batch.
    :param shared_memory: consumers on this host: batch data goes through a shared memory ring
        instead of the socket (see :class:`Connection`; hydrax protocol, zpush/zrpush only). With
        ``share``, the ring is used only when the collector says it is on this host (True, or the
        ring's size in bytes; default: the socket).
    :param curve: CURVE encryption (:class:`~hydrax.serve.Curve`).
    :param report: log the rate every this many seconds (0: never).
    :param share: ``(index, count)``: reliable mode. This producer serves share ``index`` of
        ``count`` of the run's stream to a :class:`~hydrax.serve.Collector` (``url`` is then a
        ``zpush``/``zrpush`` URL), which gets every batch exactly once, in order; a producer
        restarted after a crash resumes where its share stopped. ``dataloader`` must be a
        :class:`hydrax.Dataloader`, the same run (arguments) for every share. The collector
        refuses a share whose schedule differs from the others' (the Dataloader's
        :attr:`~hydrax.Dataloader.schedule_fingerprint`), or whose ``fingerprint`` does: give there
        what the schedule cannot see, such as the data's names (the shard URLs) and image size.
        A share stopped by Ctrl+C (the Dataloader interrupted) sends no end marker: restarted,
        it resumes where it stopped (the report's ``complete`` is False).
    """
    if share is not None:
        return _serve_share(dataloader, url, share, arrays=arrays, items=items, timeout=timeout, noexpand=noexpand, curve=curve,
                            fingerprint=fingerprint, shared_memory=shared_memory)
    connection = Connection(url, protocol=protocol, topic=topic, timeout=timeout, hwm=hwm, subscribers=subscribers,
                            curve=curve, noexpand=noexpand, max_queued_bytes=max_queued_bytes, shared_memory=shared_memory)
    return _serve_plain(dataloader, connection, arrays=arrays, hydrax=protocol == "hydrax", topic=topic,
                        validation_topic=validation_topic, items=items, report=report)


def _serve_plain(dataloader: Any, connection: Connection, *, arrays: Iterable[str] | None, hydrax: bool, topic: str,
                 validation_topic: str, items: bool, report: float) -> ServeReport:
    """:func:`serve` without ``share``: every batch to ``connection``, with the epoch markers of
    the hydrax protocol when ``hydrax``."""
    enter = getattr(dataloader, "__enter__", None)
    result = ServeReport()
    start = last_report = time.monotonic()
    try:
        with connection:
            context = dataloader if enter is not None else contextlib.nullcontext(dataloader)
            with context as batches:
                run = None
                for batch in batches:
                    key = _run_key(batch)
                    if hydrax and run is not None and key != run:
                        _end_run(connection, run, topic, validation_topic)
                    run = key
                    views, names = batch_arrays(batch, arrays)
                    fields = batch_fields(batch, items) if hydrax else {}
                    connection.send(views, allow64=True, topic=topic if batch.is_training else validation_topic,
                                    infos=names, **fields)
                    del views, batch  # ZeroMQ holds the frames; the slot frees when it lets go
                    result.batches += 1
                    result.bytes = connection.stats.total
                    result.shared_batches = connection.shared_batches
                    if report and time.monotonic() - last_report >= report:
                        last_report = time.monotonic()
                        log.info("[hydrax] served %d batches, %s", result.batches, connection.stats.summary())
                if hydrax and run is not None and not getattr(dataloader, "interrupted", False):
                    # an interrupted run stopped inside its epoch: no epoch end to announce
                    _end_run(connection, run, topic, validation_topic)
    finally:
        result.seconds = time.monotonic() - start
    return result


def _serve_share(dataloader: Any, url: str | Iterable[str], share: tuple[int, int], *, arrays, items: bool, timeout: float | None,
                 noexpand: bool, curve: Curve | None, fingerprint: str, shared_memory: int | bool | None) -> ServeReport:
    index, count = share
    # Shares of different runs must not mix: the schedule's own fingerprint (groups, sizes, seeds,
    # shuffles, start and end), and the caller's words for what the schedule cannot see (the data).
    fingerprint = dataloader.schedule_fingerprint + (f" {fingerprint}" if fingerprint else "")
    sender = ShareSender(url, index, count, fingerprint, timeout=timeout, noexpand=noexpand, curve=curve, shared_memory=shared_memory)
    first = sender.start()
    dataloader.select_stream(index, count, first)
    positions = stream_positions(index, count, first)
    result = ServeReport()
    start = time.monotonic()
    interrupted = lambda: getattr(dataloader, "interrupted", False)  # a Ctrl+C
    try:
        with dataloader:
            for batch in dataloader:
                views, names = batch_arrays(batch, arrays)
                if not sender.put(next(positions), views, names, batch_fields(batch, items), cancelled=interrupted):
                    break  # interrupted while waiting for credit
                result.batches += 1
                result.bytes += sum(v.nbytes for v in views)
                del views, batch  # the sender thread holds the frames until ZeroMQ lets go
    except KeyboardInterrupt:
        sender.abandon()  # as a crash: a restart resumes the share
        raise
    except BaseException as exc:
        try:
            sender.fail(next(positions), f"{type(exc).__name__}: {exc}")
        except Exception:  # noqa: BLE001 (the original error matters more)
            log.debug("could not send share %d's failure", index, exc_info=True)
        raise
    result.seconds = time.monotonic() - start
    if interrupted():
        # Stopped inside the share: leave it open, as a crash would, for a restart to resume.
        sender.abandon()
        result.complete = False
        return result
    sender.end(next(positions))
    result.shared_batches = sender.shared_batches
    return result


def _end_run(connection: Connection, run: tuple[bool, int], topic: str, validation_topic: str) -> None:
    training, number = run
    connection.mark(EPOCH_END, topic if training else validation_topic, epoch=number, validation=not training)

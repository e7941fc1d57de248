"""Progress bars for hydrax runs, drawn with `tqdm <https://tqdm.github.io/>`_.

:func:`tbatches` is the one-line way to get them::

    from hydrax.tqdm import tbatches

    for batch in tbatches(dataloader, report_interval=1000):
        ...
        del batch

It enters the dataloader's ``with`` block itself and shows one bar for training (numbered by
global batch, so a resumed run starts where it left off) and, while a validation run is in
progress, a second bar below it. :class:`ProgressMonitor` is the same machinery for a loop that
manages the dataloader itself.

This module needs tqdm (``pip install 'hydrax[tqdm]'``); ``import hydrax`` does not.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any, TypeVar

try:
    from tqdm import tqdm as _tqdm
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise ImportError("hydrax.tqdm needs the tqdm package: pip install 'hydrax[tqdm]'") from _exc

from .run.batch import Batch, TrainingBatch, ValidationBatch
from .run.loader import Dataloader

D = TypeVar("D")

_NOT_DETERMINISTIC = "dataloader is not deterministic"


class ProgressMonitor:
    """Training and validation progress bars for a :class:`~hydrax.Dataloader`.

    Call :meth:`begin_batch` when a batch arrives and :meth:`end_batch` when the loop is done
    with it; :meth:`close` (or leaving the ``with`` block) closes the bars::

        with dataloader, ProgressMonitor(dataloader) as monitor:
            for batch in dataloader:
                monitor.begin_batch(batch)
                ...
                monitor.end_batch(batch)
                del batch

    The training bar counts global batch numbers: it starts at
    :attr:`~hydrax.Dataloader.first_batch` and its total is :attr:`~hydrax.Dataloader.last_batch`
    (no total for a run without an end). Batches the dataloader dropped because an item failed to
    load still move the bar, and are counted as dropped.

    :param dataloader: the dataloader to monitor. It must be deterministic, because the bars
        follow batch numbers in order.
    :param report_interval: every this many batches, print how long the loop waited for batches
        (``[hydrax]: running behind by Nms/batch``) and how many batches were dropped, when either
        is non-zero. 0 (the default) never reports.
    :param description: the label of the training bar.
    :param kwargs: passed on to both ``tqdm`` bars (for example ``mininterval`` or ``file``).
    :raises ValueError: if the dataloader is not deterministic.
    """

    def __init__(self, dataloader: Dataloader[D], report_interval: int = 0, description: str = "train", **kwargs: Any) -> None:
        if not dataloader.deterministic:
            raise ValueError(_NOT_DETERMINISTIC)
        self._dataloader = dataloader
        self._report_interval = int(report_interval)
        self._kwargs = kwargs
        self._validation_bar: _tqdm | None = None
        self._validation_epoch: int | None = None
        self._previous_batch_num = dataloader.first_batch - 1
        self._previous_validation_batch = -1
        self._since_report = 0
        self._dropped = 0
        self._training_bar: _tqdm | None = _tqdm(
            initial=dataloader.first_batch,
            total=dataloader.last_batch,
            unit="batch",
            desc=description,
            leave=True,
            **kwargs,
        )

    def __enter__(self) -> ProgressMonitor:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()

    @property
    def dropped(self) -> int:
        """Batches dropped since the last report (all of them when ``report_interval`` is 0)."""
        return self._dropped

    def begin_batch(self, batch: Batch[D]) -> None:
        """Note that ``batch`` has arrived: opens the validation bar when a validation run starts,
        and closes it when training resumes.

        :param batch: the batch the dataloader just returned.
        """
        if isinstance(batch, ValidationBatch):
            if self._validation_bar is not None and batch.validation_epoch != self._validation_epoch:
                self._close_validation()  # two validation runs back to back
            if self._validation_bar is None:
                self._validation_bar = _tqdm(
                    total=self._dataloader.batches_per_validation,
                    unit="batch",
                    desc="validation",
                    leave=False,
                    **self._kwargs,
                )
                self._validation_epoch = batch.validation_epoch
                self._previous_validation_batch = -1
        elif self._validation_bar is not None:
            self._close_validation()
            if self._training_bar is not None:
                self._training_bar.unpause()

    def end_batch(self, batch: Batch[D]) -> None:
        """Note that the loop is done with ``batch``: advances its bar, and reports every
        ``report_interval`` batches.

        :param batch: the batch passed to the matching :meth:`begin_batch`.
        """
        if isinstance(batch, TrainingBatch):
            delta = batch.batch_num - self._previous_batch_num
            assert delta > 0, f"training batch {batch.batch_num} after {self._previous_batch_num}"
            self._previous_batch_num = batch.batch_num
            bar = self._training_bar
        else:
            delta = batch.validation_epoch_batch - self._previous_validation_batch
            assert delta > 0, f"validation batch {batch.validation_epoch_batch} after {self._previous_validation_batch}"
            self._previous_validation_batch = batch.validation_epoch_batch
            bar = self._validation_bar
        self._dropped += delta - 1
        if bar is not None:
            bar.update(delta)
        self._since_report += 1
        if self._report_interval > 0 and self._since_report >= self._report_interval:
            self._report()

    def _report(self) -> None:
        batches, dropped = self._since_report, self._dropped
        self._since_report = self._dropped = 0
        idle_ms = round(self._dataloader.idle_usec() / 1000 / batches)
        if idle_ms > 0:
            self._write(f"[hydrax]: running behind by {idle_ms:d}ms/batch")
        if dropped > 0:
            percent = dropped * 100 / (dropped + batches)
            self._write(f"[hydrax]: dropped {dropped} batch(es) ({percent:.0f}%)")

    def _write(self, message: str) -> None:
        _tqdm.write(message, file=self._kwargs.get("file") or sys.stderr)

    def _close_validation(self) -> None:
        if self._validation_bar is not None:
            self._validation_bar.close()
            self._validation_bar = None
            self._validation_epoch = None

    def close(self) -> None:
        """Close both bars. Calling it again does nothing."""
        self._close_validation()
        if self._training_bar is not None:
            self._training_bar.close()
            self._training_bar = None


def tbatches(dataloader: Dataloader[D], report_interval: int = 0, description: str = "train", **kwargs: Any) -> Iterator[Batch[D]]:
    """Iterate over a dataloader's batches with progress bars.

    This enters the dataloader's ``with`` block itself, so the dataloader must not be entered
    already. The block is left when the batches run out, when the loop stops early (``break``
    closes the generator) and when the loop body raises. As with the dataloader itself, end the
    loop body with ``del batch``::

        for batch in tbatches(dataloader, report_interval=1000, mininterval=1.0):
            train_step(batch.arrays["x"])
            del batch

    :param dataloader: a deterministic dataloader that has not been entered.
    :param report_interval: see :class:`ProgressMonitor`.
    :param description: the label of the training bar.
    :param kwargs: passed on to ``tqdm``.
    :return: an iterator over the batches.
    :raises ValueError: if the dataloader is not deterministic (raised by this call, before any
        worker starts).
    """
    if not dataloader.deterministic:
        raise ValueError(_NOT_DETERMINISTIC)
    return _tbatches(dataloader, report_interval, description, kwargs)


def _tbatches(dataloader: Dataloader[D], report_interval: int, description: str, kwargs: dict[str, Any]) -> Iterator[Batch[D]]:
    with dataloader:
        with ProgressMonitor(dataloader, report_interval, description, **kwargs) as monitor:
            try:
                for batch in dataloader:
                    try:
                        monitor.begin_batch(batch)
                        yield batch
                        monitor.end_batch(batch)
                    finally:
                        del batch
            except GeneratorExit:
                # The consumer stopped early (break, or dropped the iterator): a normal way to end
                # a run, so leave the with blocks as after the last batch, without an exception.
                return

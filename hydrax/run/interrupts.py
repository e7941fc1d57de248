"""What stops ``Dataloader.__next__`` waiting: Ctrl+C, ``interrupt()``, and the timeout.

Ctrl+C is answered as hydrax 0.2.2 answers it: the first press interrupts, the second aborts,
the third terminates.

- **Interrupt**: the iteration ends at the next batch, as :meth:`hydrax.Dataloader.interrupt`
  and leaving the ``with`` block early do; the run's workers are stopped as the block is left.
- **Abort**: the next ``__next__`` raises ``KeyboardInterrupt`` at once.
- **Terminate**: the process exits with status 1 there and then (``os._exit``), after flushing
  the log handlers, because a loop stuck outside hydrax would never see the first two.

The handler is installed only when the run is entered on the main thread (signals reach no other
thread) and the previous one is put back as the run is left. No batch for ``timeout_sec`` raises
:class:`~hydrax.errors.BatchTimeoutError`, with what every worker is doing. The wait goes in
slices of a tenth of a second so that an interrupt is seen at once; its time counts in
``Dataloader.idle_usec`` from the second batch on.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import sys
import threading
import time
from typing import Any, Callable

from ..errors import BatchTimeoutError

log = logging.getLogger(__name__)

_UNSET = object()
#: How long one wait for the pipeline's output lasts before the interrupts are looked at again.
WAIT_SLICE_S = 0.1


class Interrupts:
    """Whether a run was asked to stop, and how many Ctrl+C it has had."""

    def __init__(self) -> None:
        #: Set by a first Ctrl+C, by ``Dataloader.interrupt()`` and by leaving the block early.
        self.interrupted = False
        self.presses = 0
        #: Nanoseconds spent waiting for the pipeline since ``Dataloader.idle_usec`` last read it.
        self.idle_ns = 0
        self._previous: Any = _UNSET

    @property
    def aborting(self) -> bool:
        """A second Ctrl+C came: the next ``__next__`` raises ``KeyboardInterrupt``."""
        return self.presses >= 2

    def next_output(self, output: queue.SimpleQueue, timeout_s: float, describe: Callable[[], str], idle: bool) -> Any:
        """The pipeline's next output. Raises ``KeyboardInterrupt`` once aborting,
        ``StopIteration`` once interrupted, and :class:`~hydrax.errors.BatchTimeoutError` (with
        ``describe()``'s state of the run) after ``timeout_s`` without one; ``idle``: count the
        wait in :attr:`idle_ns`."""
        self._check_abort()
        try:
            return output.get_nowait()
        except queue.Empty:
            pass
        started = time.monotonic_ns()
        try:
            while True:
                self._check_abort()
                if self.interrupted:
                    raise StopIteration
                try:
                    return output.get(timeout=WAIT_SLICE_S)
                except queue.Empty:
                    pass
                if time.monotonic_ns() - started >= timeout_s * 1_000_000_000:
                    raise BatchTimeoutError(f"no batches have been produced in {timeout_s} seconds; the state of the run:\n" + describe())
        finally:
            if idle:
                self.idle_ns += time.monotonic_ns() - started

    def _check_abort(self) -> None:
        if self.aborting:
            raise KeyboardInterrupt

    def install(self) -> None:
        """Take Ctrl+C over from here on, on the main thread only."""
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)

    def restore(self) -> None:
        """Put back the handler :meth:`install` replaced."""
        if self._previous is not _UNSET and threading.current_thread() is threading.main_thread():
            # None means a handler installed outside Python; the default is the closest we can restore
            signal.signal(signal.SIGINT, signal.SIG_DFL if self._previous is None else self._previous)
            self._previous = _UNSET

    def _on_sigint(self, signum, frame) -> None:
        self.presses += 1
        # WARNING, so that a program that configured no logging sees them on stderr, as in 0.2.2
        if self.presses == 1:
            log.warning("[hydrax] KeyboardInterrupt: interrupting, repeat to abort")
            self.interrupted = True
        elif self.presses == 2:
            log.warning("[hydrax] KeyboardInterrupt: aborting, repeat to terminate")
        else:
            log.warning("[hydrax] KeyboardInterrupt: terminating")
            _flush_logs()
            os._exit(1)


def _flush_logs() -> None:
    """Flush every handler of the ``hydrax`` loggers' chain (and stderr) before ``os._exit``."""
    logger: logging.Logger | None = log
    while logger is not None:
        for handler in logger.handlers:
            try:
                handler.flush()
            except Exception:
                pass
        logger = logger.parent if logger.propagate else None
    for stream in (sys.stderr, sys.stdout):
        try:
            stream.flush()
        except Exception:
            pass

"""The exceptions hydrax raises to the training loop."""

from __future__ import annotations


class BatchTimeoutError(TimeoutError):
    """No batch arrived within the Dataloader's ``timeout_sec``; the message says what each worker was doing."""


class WorkerError(KeyboardInterrupt):
    """A loader process died or froze; the message names it and the item it was loading.

    It derives from KeyboardInterrupt because hydrax 0.2.2 surfaced a dead loader process as a
    KeyboardInterrupt, and programs written for it catch that to save a checkpoint.
    """

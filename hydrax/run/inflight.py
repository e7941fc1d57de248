"""A batch between the moment it is given a slot and the moment it is handed out.

The pipeline keeps one :class:`InFlight` record per batch it has submitted; the workers'
completions fill it in, and the collaborators that finish a batch (placement, the failure
budget, the worker diagnosis) read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..cache.runcache import CacheEntry
from .plan import GroupRun
from ..order.schedule import Step, describe_step


@dataclass
class InFlight:
    """One batch of the run, from submission to delivery."""

    #: Its place in the run's schedule (validation batches included), the same on every process.
    seq: int
    step: Step
    group: GroupRun
    slot: int
    #: The indices of the items this process loads, in slot order.
    indices: Sequence[int]
    #: Tasks of the batch not completed yet.
    remaining: int
    #: The key its read-ahead announcement was made under (see :mod:`hydrax.run.announce`).
    prefetch_key: int | None = None
    #: Position -> the extras ``loader_func`` returned for that item.
    extras: dict[int, dict] = field(default_factory=dict)
    #: Why the batch failed (the first failed item), or None.
    error: str | None = None
    #: Position -> why, for items zero-filled under ``on_item_error="skip_item"``.
    skipped: dict[int, str] = field(default_factory=dict)
    #: Its file in its group's cache, and what becomes of it; None without a cache.
    cache: CacheEntry | None = None

    @property
    def failed(self) -> bool:
        """Dropped, or every item skipped: the batch counts against the failure budget."""
        return self.error is not None or len(self.skipped) == len(self.indices)

    def words(self) -> str:
        """The batch in words, e.g. ``"batch 7 (epoch 1)"``."""
        return describe_step(self.step)

    def take_completion(self, first: int, ok: bool, extras: list | None, error: str | None,
                        skipped: list[tuple[int, str]] | None) -> None:
        """Record a task's completion: its positions start at ``first``."""
        self.remaining -= 1
        if not ok and self.error is None:
            self.error = error
        if skipped:
            self.skipped.update(skipped)
        if extras:
            for k, value in enumerate(extras, first):
                if value:
                    self.extras[k] = value

    def additional(self) -> dict[str, list]:
        """The extras as ``key -> list`` with one value per item (None where an item returned none),
        built in item order, so that they pickle the same every time."""
        additional: dict[str, list] = {}
        size = len(self.indices)
        for position in sorted(self.extras):
            for key, value in self.extras[position].items():
                additional.setdefault(key, [None] * size)[position] = value
        return additional

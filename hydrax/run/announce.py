"""Read-ahead announcements: telling data that reads ahead which batches come next.

The schedule is known in advance, so data objects that read ahead (those with ``prefetch`` and
``release`` methods, as :class:`hydrax.shards.ShardSet` has) hear of each batch's items some
batches before it is loaded, and of its end once it is. :class:`Announcer` walks the schedule
for the pipeline, keeping a queue of the next steps: each step is announced when it enters the
queue, and the pipeline takes steps from its front to load them.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Callable, Iterable, Iterator, Sequence

from .inflight import InFlight
from .plan import GroupRun, RunGroups
from ..order.schedule import Step

log = logging.getLogger("hydrax.run.pipeline")

#: The most batches announced to data that reads ahead, beyond those being loaded.
MAX_LOOKAHEAD = 512


def reads_ahead(data: object) -> bool:
    """Whether ``data`` wants to hear of upcoming batches: it has ``prefetch`` and ``release``,
    and its ``prefetch_items``, where it says, is not 0 (a ShardSet of local files, a Mixture
    whose sources all are: announcing would cost every batch's items once more for nothing)."""
    if not (callable(getattr(data, "prefetch", None)) and callable(getattr(data, "release", None))):
        return False
    wanted = getattr(data, "prefetch_items", None)
    return wanted is None or int(wanted) > 0


def batches_ahead(groups: RunGroups, depth: int) -> int:
    """How many steps beyond those being loaded the run announces: none without data that reads
    ahead, else enough for half its read-ahead memory, at least ``depth``, at most :data:`MAX_LOOKAHEAD`."""
    wanted = [-(-int(getattr(run.group.data, "prefetch_items", 0) or 0) // max(1, run.plan.local_batch_size))
              for run in groups if reads_ahead(run.group.data)]
    return max(depth, min(MAX_LOOKAHEAD, max(wanted))) if wanted else 0


class Announcer:
    """The next steps of the schedule, each announced to its group's data when it is queued.

    Announcing starts only with :meth:`start`: read-ahead may start threads, and a worker forked
    after that must not inherit them. Steps taken before are announced then.

    :param depth: the run's slots: at least that many batches are announced ahead.
    :param items: the items of a step's batch (default :meth:`hydrax.run.plan.GroupRun.items`; the
        pipeline passes :meth:`hydrax.order.orderbook.RunOrders.items`, which keeps the orders).
    """

    def __init__(self, steps: Iterator[Step], groups: RunGroups, depth: int,
                 items: Callable[[GroupRun, Step], Sequence[int]] | None = None) -> None:
        self._steps = steps
        self._groups = groups
        self._items = items or (lambda run, step: run.items(step))
        self._readers = {run.index: run.group.data for run in groups if reads_ahead(run.group.data)}
        self._ahead: deque[tuple[Step, int | None]] = deque()
        self._lookahead = batches_ahead(groups, depth)
        self._announcing = False
        self._last_key = 0
        self._announced: dict[int, int] = {}  # prefetch key -> group index

    def take(self) -> tuple[Step, int | None] | None:
        """The next step of the schedule and its announcement's key (None when not announced), or
        None at the end of the run."""
        if not self._ahead and not self._queue_next():
            return None
        return self._ahead.popleft()

    def top_up(self) -> None:
        """Announce more steps once a quarter of the look-ahead has been taken: in bursts, so that
        read-ahead can coalesce the samples of many batches into one request."""
        if self._announcing and len(self._ahead) <= self._lookahead - max(1, self._lookahead // 4):
            while len(self._ahead) < self._lookahead and self._queue_next():
                pass

    def start(self, taken: Iterable[InFlight]) -> None:
        """Start announcing: first the batches ``taken`` before (loading already), then the queue
        (again: nothing more)."""
        if not self._readers:
            return
        self._announcing = True
        for record in taken:
            if record.prefetch_key is None:
                record.prefetch_key = self._announce(record.step)
        self._ahead = deque((step, key if key is not None else self._announce(step)) for step, key in self._ahead)
        self.top_up()

    def wait_started(self) -> None:
        """Wait until the data told so far is at work on it (``wait_prefetch``, where the data has
        it: a :class:`~hydrax.shards.ShardSet`'s fetch processes), before the workers start."""
        for data in self._readers.values():
            wait = getattr(data, "wait_prefetch", None)
            if callable(wait):
                try:
                    wait()
                except Exception:  # read-ahead is an optimisation: the workers still read what they need
                    log.warning("[hydrax] read-ahead failed to start; loading goes on:", exc_info=True)

    def release(self, key: int | None) -> None:
        """The batch announced under ``key`` is loaded (or will not be): its data may let go of it."""
        group = self._announced.pop(key, None) if key is not None else None
        if group is not None:
            try:
                self._readers[group].release(key)
            except Exception:
                log.warning("[hydrax] read-ahead failed to release batch %d; loading goes on:", key, exc_info=True)

    def close(self) -> None:
        """Release every batch still announced."""
        for key in list(self._announced):
            self.release(key)

    def _queue_next(self) -> bool:
        try:
            step = next(self._steps)
        except StopIteration:
            return False
        self._ahead.append((step, self._announce(step)))
        return True

    def _announce(self, step: Step) -> int | None:
        if not self._announcing:
            return None
        run = self._groups.of(step)
        data = self._readers.get(run.index)
        if data is None:
            return None
        self._last_key += 1
        key = self._last_key
        try:
            data.prefetch(key, self._items(run, step), run.read_order(step))
        except Exception:  # read-ahead is an optimisation: the workers still read what they need
            log.warning("[hydrax] read-ahead failed; loading goes on without it:", exc_info=True)
            return None
        self._announced[key] = run.index
        return key

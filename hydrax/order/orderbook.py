"""The order book: a run's stored (``"numpy"``) item orders, once per host, ahead of need.

A ``"numpy"`` order (hydrax 0.2.2's ``Generator(PCG64).permutation``) cannot be computed a
position at a time, so it is computed whole, once, by the main process, which lists each batch's
items for the workers in the arena (see :mod:`hydrax.procs.arena`): the workers never hold an order.
Of each epoch's order only this process's share of every batch is kept, as ``int32`` when the
group has under 2**31 items: ``4 * N / P`` bytes for ``P`` processes.

An order that changes every epoch (``itemwise``, ``shardwise``) has a ring of buffers, two when
an epoch is longer than the look-ahead: while epoch ``e`` is read from one, epoch ``e + 1`` is
computed into the other on a background thread, starting once every batch of epoch ``e - 1``
is done (``ahead`` batches into epoch ``e``), so the pause at the boundary is gone and no more
than two epochs are ever held. An order fixed for the run has one buffer.

Each buffer opens with a tag: the epoch it holds, plus one (0 while it is being written), so
that a buffer reused too early is an error, never a silently wrong batch.
"""

from __future__ import annotations

import logging
import mmap
import queue
import threading
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .orders import EpochOrders, IdentityOrder, ItemOrder, ShareOrder, epoch_order, group_item_order
from .schedule import GroupPlan, order_changes, order_seed, share_positions

log = logging.getLogger(__name__)

PAGE = 4096
#: Bytes before each buffer's items: the tag word, then padding to a cache line.
HEADER = 64


def stored_epoch(plan: GroupPlan, epoch: int, training: bool) -> int | None:
    """The epoch whose stored order a batch of ``epoch`` reads (0 for an order fixed for the
    run), or None when the batch's order is the identity (nothing stored)."""
    if training and plan.shuffle_later == "shardwise":
        return epoch
    if order_seed(plan, epoch, training) is None:
        return None
    return epoch if order_changes(plan, training) else 0


def needs_book(plan: GroupPlan, training: bool) -> bool:
    """Whether the group has a stored order in some epoch: ``"numpy"`` and shuffled (a mixture's is always computed)."""
    if plan.permutation != "numpy" or plan.mixture is not None:
        return False
    return (training and plan.shuffle_later in ("shardwise", "itemwise")) or plan.shuffle_first


@dataclass(frozen=True)
class Shelf:
    """Where one group's buffers are in the book: ``ring`` buffers of ``rows x columns`` items."""

    offsets: tuple[int, ...]
    rows: int
    columns: int
    dtype: str

    @property
    def ring(self) -> int:
        return len(self.offsets)

    def views(self, buffer) -> list[tuple[np.ndarray, np.ndarray]]:
        """``(tag, rows)`` arrays of every buffer, over the mapping ``buffer``."""
        out = []
        for offset in self.offsets:
            tag = np.frombuffer(buffer, np.int64, 1, offset)
            rows = np.frombuffer(buffer, self.dtype, self.rows * self.columns, offset + HEADER).reshape(self.rows, self.columns)
            out.append((tag, rows))
        return out


@dataclass(frozen=True)
class BookSpec:
    """Where the book's buffers are: its size and every group's shelf (by group index)."""

    size: int
    shelves: dict[int, Shelf]


class OrderBook:
    """The main process's side of the book: computes the orders into it, ahead of need.

    :param groups: ``(group index, plan, training)`` of the run's groups; those that need no
        stored order (lazy or unshuffled) are left out.
    :param ahead: batches the pipeline may still be loading or announcing behind the one it asks
        for: epoch ``e + 1`` is computed in the background once epoch ``e`` is that far in.
    """

    def __init__(self, groups: Sequence[tuple[int, GroupPlan, bool]], ahead: int) -> None:
        self._plans = {index: (plan, training) for index, plan, training in groups if needs_book(plan, training)}
        self._ahead = max(1, int(ahead))
        shelves, size = {}, 0
        for index, (plan, training) in self._plans.items():
            ring = 1
            if order_changes(plan, training):
                ring = 2 + -(-self._ahead // plan.batch_count) if plan.batch_count <= self._ahead else 2
            dtype = "<i4" if plan.size < 2**31 else "<i8"
            nbytes = HEADER + plan.batch_count * plan.local_batch_size * np.dtype(dtype).itemsize
            stride = -(-nbytes // PAGE) * PAGE
            shelves[index] = Shelf(tuple(size + i * stride for i in range(ring)), plan.batch_count, plan.local_batch_size, dtype)
            size += ring * stride
        self.spec = BookSpec(max(size, PAGE), shelves)
        self._views: dict[int, list] = {}
        self._state: dict[tuple[int, int], threading.Event] = {}  # (group, stored epoch) -> computed
        self._errors: dict[tuple[int, int], BaseException] = {}
        self._lock = threading.Lock()
        # One thread computes every background order: a thread per epoch would leave each its own
        # malloc arena full of the freed temporaries of an O(N) computation.
        self._jobs: queue.SimpleQueue | None = None
        if shelves:
            self._buffer = _book_pages(self.spec.size)
            self._views = {group: shelf.views(self._buffer) for group, shelf in shelves.items()}

    def __bool__(self) -> bool:
        return bool(self._views)

    def __contains__(self, group: int) -> bool:
        return group in self._views

    def order(self, group: int, epoch: int, epoch_batch: int = 0) -> ItemOrder:
        """The order of ``group`` in ``epoch`` (computed now if it is not ready), for a batch
        ``epoch_batch`` batches into the epoch; far enough in, the next epoch's is started."""
        plan, training = self._plans[group]
        key = stored_epoch(plan, epoch, training)
        if key is not None:
            self._start(group, key, background=False)
        if order_changes(plan, training) and epoch_batch >= self._ahead:
            # after this epoch's: two O(N) computations at once would double the peak memory
            self._start(group, epoch + 1, background=True)
        if key is None:
            return IdentityOrder()
        error = self._errors.get((group, key))
        if error is not None:
            raise error
        views = self._views[group]
        tag, rows = views[key % len(views)]

        def check() -> None:
            if int(tag[0]) != key + 1:
                raise RuntimeError(f"the stored order of group {group} for epoch {key} is not in the order book "
                                   f"(it holds epoch {int(tag[0]) - 1}); this is a hydrax bug, please report it")

        check()
        return ShareOrder(rows, check)

    def _start(self, group: int, key: int, background: bool) -> None:
        """Compute the stored order of epoch ``key`` (on a thread when ``background``), once."""
        with self._lock:
            done = self._state.get((group, key))
            if done is None:
                plan, training = self._plans[group]
                if stored_epoch(plan, key, training) is None:
                    return  # the identity: nothing to store
                done = self._state[(group, key)] = threading.Event()
                ring = len(self._views[group])
                for old in [k for k in self._state if k[0] == group and k[1] <= key - ring]:
                    del self._state[old]  # that buffer is about to be reused
                if background:
                    if self._jobs is None:
                        self._jobs = queue.SimpleQueue()
                        threading.Thread(target=self._background, args=(self._jobs,), name="hydrax-orders", daemon=True).start()
                    self._jobs.put((group, key, done))
                    return
                self._compute(group, key, done)
        if not background:
            done.wait()  # it may be on its way in the background

    def close(self) -> None:
        """Stop the background thread (after the order it may be computing)."""
        if self._jobs is not None:
            self._jobs.put(None)
            self._jobs = None

    def _background(self, jobs: queue.SimpleQueue) -> None:
        while (job := jobs.get()) is not None:
            self._compute(*job)

    def _compute(self, group: int, key: int, done: threading.Event) -> None:
        plan, training = self._plans[group]
        tag, rows = self._views[group][key % len(self._views[group])]
        try:
            tag[0] = 0
            _fill(rows, plan, key, training)
            tag[0] = key + 1
        except BaseException as exc:  # raised where the order is asked for
            log.exception("[hydrax] computing the item order of group %d for epoch %d failed:", group, key)
            self._errors[(group, key)] = exc
        finally:
            done.set()


def _book_pages(size: int) -> mmap.mmap:
    """``size`` zeroed bytes, shared and anonymous: the kernel provides the pages as they are first
    written (an order fixed for the run takes one buffer's memory, not its whole ring's), and a
    worker forked after an order was written shares its pages instead of keeping them when the
    main process rewrites them, as it would keep private copy-on-write pages (up to a whole book
    per worker). The workers never read it; nothing is left in /dev/shm."""
    return mmap.mmap(-1, size, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)


class RunOrders:
    """The item orders of a run's groups in the main process: the book's for stored ones, else
    computed (lazy or unshuffled) and kept for two epochs per group.

    :param groups: the run's groups (see :class:`hydrax.run.plan.RunGroups`).
    :param ahead: see :class:`OrderBook`.
    """

    def __init__(self, groups, ahead: int) -> None:
        self._groups = groups
        self.book = OrderBook([(run.index, run.plan, run.training) for run in groups], ahead)
        self._computed = EpochOrders(lambda group, epoch: epoch_order(groups[group].plan, epoch, groups[group].training))

    def items(self, run, step) -> Sequence[int]:
        """The indices of the items of this process's share of ``step``'s batch of ``run``."""
        epoch = run.epoch_of(step)
        if run.index in self.book:
            order = self.book.order(run.index, epoch, step.epoch_batch if run.training else 0)
        else:
            order = self._computed.get(run.index, epoch)
        return order.local(run.plan, step.group_index)

    def close(self) -> None:
        """The run is over: stop computing orders ahead."""
        self.book.close()


#: Items of an arange written at once (so that filling a buffer needs no temporary of its size).
_CHUNK = 1 << 20


def _fill(rows: np.ndarray, plan: GroupPlan, key: int, training: bool) -> None:
    """Write this process's share of every batch of the order of epoch ``key`` into ``rows``.

    A plain permutation is ``Generator.shuffle`` of an arange, whose draws depend only on the
    length, so it is shuffled in the book's own dtype (``int32``: half the memory), and straight
    in the book when this process loads whole batches and no item is left over.
    """
    seed = None if training and plan.shuffle_later == "shardwise" else order_seed(plan, key, training)
    used = plan.batch_count * plan.batch_size
    if seed is not None and not plan.share and plan.size == used:
        _shuffled_arange(rows.reshape(-1), seed)
        return
    if seed is not None:
        full = np.empty(plan.size, rows.dtype)
        _shuffled_arange(full, seed)
    else:
        full = group_item_order(plan, key, training)
    batches = full[:used].reshape(plan.batch_count, plan.batch_size)
    positions = share_positions(plan)
    columns = slice(positions.start, positions.stop) if isinstance(positions, range) else list(positions)
    rows[:] = batches[:, columns]


def _shuffled_arange(out: np.ndarray, seed: int) -> None:
    """``out`` := ``Generator(PCG64(seed)).permutation(len(out))``, computed in place."""
    for start in range(0, len(out), _CHUNK):
        stop = min(start + _CHUNK, len(out))
        out[start:stop] = np.arange(start, stop, dtype=out.dtype)
    np.random.Generator(np.random.PCG64(int(seed))).shuffle(out)

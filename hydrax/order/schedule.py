"""The batch schedule, as pure functions of (seed, epoch, position).

Everything about *which* batch comes next, which positions of its epoch it holds, which share
of it each process loads and which seeds its items get lives here, with no processes and no I/O,
so it can be tested exhaustively and so worker processes can compute positions and seeds
themselves from a few integers, with the permutations the orders are made of. Which item sits at
a position is :mod:`hydrax.order.orders`' (it builds on these). The rules are those of hydrax 0.2.2
(see ``hydrax-api.md`` section 4), with its schedule defects fixed: every validation run yields its
batches, ``interleave_groups`` really interleaves, and an end point at or before the start point
ends the run at once.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Iterator, NamedTuple, Sequence

import numpy as np

from .mixing import MixturePlan, check_epoch, last_epoch
from .permute import LazyPermutation

#: The resolved shuffle modes (``"default"`` resolves to one of these).
SHUFFLE_MODES = ("repeat", "reseed", "itemwise", "batchwise", "shardwise")
#: How a group's orders are made: ``"numpy"`` (0.2.2's ``Generator(PCG64).permutation``, stored)
#: or ``"lazy"`` (computed position by position, see :mod:`hydrax.order.orders`).
PERMUTATIONS = ("numpy", "lazy")
#: Words that keep the lazy orders of different things apart (see :func:`hydrax.order.permute.round_keys`).
LAZY_ITEMS, LAZY_BATCHES, LAZY_SHARDS, LAZY_WINDOW, LAZY_MIX, LAZY_SOURCE = 1, 2, 3, 4, 5, 6


@dataclass(frozen=True)
class GroupPlan:
    """What the schedule needs to know about one DataGroup: a few integers and two flags."""

    size: int
    batch_size: int
    batch_count: int
    seed: int
    shuffle_first: bool
    shuffle_later: str
    #: ``shardwise`` only: samples per shard, and how many consecutive shards mix their items.
    shard_sizes: tuple[int, ...] = ()
    shard_window: int = 4
    #: The share of every batch this process loads, as ``(start, stop)`` ranges of positions in
    #: the global batch, ascending and disjoint (see :func:`host_positions` and
    #: :func:`share_ranges`); empty means the whole batch.
    share: tuple[tuple[int, int], ...] = ()
    #: ``shardwise`` only: canonical partitions of every global batch (see :func:`~hydrax.order.shardwise.shardwise_order`).
    shard_partitions: int = 1
    #: How the orders are made: one of :data:`PERMUTATIONS`.
    permutation: str = "numpy"
    #: A :class:`hydrax.Mixture`'s sources and weights (``size`` is then its epoch size, and the
    #: order is always computed: see :class:`hydrax.order.orders.MixtureOrder`); None for other data.
    mixture: MixturePlan | None = None

    @property
    def local_batch_size(self) -> int:
        """Items this process loads of every batch."""
        return sum(stop - start for start, stop in self.share) if self.share else self.batch_size

    @property
    def share_first(self) -> int:
        """The global position of the first item this process loads."""
        return self.share[0][0] if self.share else 0


def permutation(seed: int, n: int) -> np.ndarray:
    """``Generator(PCG64(seed)).permutation(n)``, read-only: the RNG of every ``"numpy"`` order.

    Not cached here: an order of N items is 8N bytes, so its owner keeps it for as long as it is
    needed and no longer (see :mod:`hydrax.order.orderbook`).
    """
    perm = np.random.Generator(np.random.PCG64(int(seed))).permutation(int(n))
    perm.setflags(write=False)
    return perm


def lazy_permutation(seed: int, n: int, what: int) -> LazyPermutation:
    """The ``"lazy"`` counterpart of :func:`permutation`: the same role, computed on demand.
    ``what`` (one of the ``LAZY_*`` words) keeps the orders of items, batches and shards apart."""
    return LazyPermutation(int(n), int(seed), int(n), what)


def order_seed(plan: GroupPlan, epoch: int, training: bool = True) -> int | None:
    """The seed of the item permutation a (not shardwise) group uses in ``epoch``, or None for
    the identity. Training: ``seed + epoch`` on later epochs of ``itemwise``, else ``seed`` with
    ``shuffle_first``; validation groups are only ever shuffled once, by ``shuffle_first``."""
    if training and plan.shuffle_later == "itemwise" and epoch > 0:
        return plan.seed + epoch
    return plan.seed if plan.shuffle_first else None


def order_changes(plan: GroupPlan, training: bool = True) -> bool:
    """Whether the group's item order changes from epoch to epoch (else it is fixed for the run)."""
    return training and plan.shuffle_later in ("itemwise", "shardwise")


def batch_order(plan: GroupPlan, epoch: int) -> Sequence[int] | None:
    """The order in which a training group's batches are taken in ``epoch`` (None: identity):
    an array, or with ``permutation="lazy"`` a :class:`~hydrax.order.permute.LazyPermutation`."""
    if plan.shuffle_later == "batchwise" and epoch > 0:
        if plan.permutation == "lazy":
            return lazy_permutation(plan.seed + epoch, plan.batch_count, LAZY_BATCHES)
        return permutation(plan.seed + epoch, plan.batch_count)
    return None


def read_order(plan: GroupPlan, epoch: int, training: bool = True) -> str:
    """How a group's batches read its items in ``epoch``, as read-ahead needs to know it:
    ``"shardwise"``, ``"sequential"`` (items and batches in index order), or ``"random"``.
    Decided from the plan alone: no order is computed. A mixture reads its sources shardwise
    or at random, as its group says."""
    if plan.mixture is not None:
        return "shardwise" if plan.shuffle_later == "shardwise" else "random"
    if training and plan.shuffle_later == "shardwise":
        return "shardwise"
    batches_move = training and plan.shuffle_later == "batchwise" and epoch > 0
    if order_seed(plan, epoch, training) is None and not batches_move:
        return "sequential"
    return "random"


def batch_seed(plan: GroupPlan, epoch: int, group_index: int) -> int:
    """Seed of item 0 of training batch ``group_index``; item k gets ``batch_seed + k``.

    ``reseed``, ``itemwise`` and ``shardwise`` move the seeds on every epoch; ``repeat`` and
    ``batchwise`` tie them to the batch identity.
    """
    bs = plan.batch_size
    if plan.shuffle_later in ("reseed", "itemwise", "shardwise"):
        return plan.seed + epoch * plan.batch_count * bs + group_index * bs
    return plan.seed + group_index * bs


def host_positions(batch_size: int, process_index: int, process_count: int) -> range:
    """The positions of a global batch that process ``process_index`` of ``process_count`` loads.

    Every process gets an equal, contiguous share of every global batch, so all processes run
    out of batches together however uneven the shards are, and the global sequence of items does
    not depend on the number of processes.
    """
    if process_count < 1 or not 0 <= process_index < process_count:
        raise ValueError(f"process_index must be in [0, {process_count}), got {process_index}")
    if batch_size % process_count:
        raise ValueError(f"the global batch size {batch_size} must be a multiple of the process count {process_count}")
    share = batch_size // process_count
    return range(process_index * share, (process_index + 1) * share)


def host_share(plan: GroupPlan, process_index: int, process_count: int) -> GroupPlan:
    """``plan`` for process ``process_index`` of ``process_count``: it loads its share of every batch."""
    positions = host_positions(plan.batch_size, process_index, process_count)
    return share_ranges(plan, [(positions.start, positions.stop)])


def share_ranges(plan: GroupPlan, ranges: Sequence[tuple[int, int]]) -> GroupPlan:
    """``plan`` for a process that loads the positions in ``ranges`` of every global batch.

    The ranges are sorted and touching ones merged; together they must be a non-empty part of
    ``[0, batch_size)``. A process whose devices hold non-adjacent blocks of the batch (a mesh
    that interleaves the hosts) loads several ranges.
    """
    merged: list[list[int]] = []
    for start, stop in sorted((int(a), int(b)) for a, b in ranges):
        if not 0 <= start < stop <= plan.batch_size:
            raise ValueError(f"share range [{start}, {stop}) is not a non-empty part of a batch of {plan.batch_size}")
        if merged and start < merged[-1][1]:
            raise ValueError(f"share ranges overlap at position {start}")
        if merged and start == merged[-1][1]:
            merged[-1][1] = stop
        else:
            merged.append([start, stop])
    if not merged:
        raise ValueError("a share needs at least one range of positions")
    share = tuple((a, b) for a, b in merged)
    return replace(plan, share=() if share == ((0, plan.batch_size),) else share)


def share_positions(plan: GroupPlan) -> Sequence[int]:
    """The global batch position of each item this process loads, in local order."""
    if not plan.share:
        return range(plan.batch_size)
    if len(plan.share) == 1:
        return range(*plan.share[0])
    return [p for start, stop in plan.share for p in range(start, stop)]


def batch_items(order: np.ndarray | None, batch_size: int, group_index: int, first: int = 0,
                count: int | None = None) -> Sequence[int]:
    """The item indices (Python ints) of batch ``group_index`` under the item ``order``: all of
    them, or ``count`` from position ``first``."""
    start = group_index * batch_size + first
    stop = start + (batch_size - first if count is None else count)
    if order is None:
        return range(start, stop)
    return order[start:stop].tolist()


def local_items(plan: GroupPlan, order: np.ndarray | None, group_index: int) -> Sequence[int]:
    """The item indices of this process's share of batch ``group_index`` under the item ``order``."""
    if len(plan.share) <= 1:
        return batch_items(order, plan.batch_size, group_index, plan.share_first, plan.local_batch_size)
    items: list[int] = []
    for start, stop in plan.share:
        items.extend(batch_items(order, plan.batch_size, group_index, start, stop - start))
    return items


def local_seeds(plan: GroupPlan, epoch: int, group_index: int) -> Sequence[int]:
    """The seed of every item of this process's share of a training batch: the seed its global
    position has, so the seeds do not depend on the number of processes or on the mesh."""
    first = batch_seed(plan, epoch, group_index)
    positions = share_positions(plan)
    if isinstance(positions, range):
        return range(first + positions.start, first + positions.stop)
    return [first + p for p in positions]


class TrainingStep(NamedTuple):
    """One training batch of the schedule."""

    batch_num: int
    epoch: int
    epoch_batch: int
    group: int
    group_index: int


class ValidationStep(NamedTuple):
    """One validation batch of the schedule (``group`` indexes the validation groups)."""

    validation_epoch: int
    validation_epoch_batch: int
    validation_batch_num: int
    group: int
    group_index: int


Step = TrainingStep | ValidationStep


@dataclass(frozen=True)
class Plan:
    """A whole run: its groups, where it starts and ends, and when it validates.

    ``start`` must already be normalised (see :func:`normalise_start`).
    """

    training: tuple[GroupPlan, ...]
    validation: tuple[GroupPlan, ...] = ()
    validation_mode: str | None = None
    validation_interval: int = 1
    start: tuple[int, int] = (0, 0)
    end: tuple[str, int] | None = None
    interleave: bool = True
    #: ``(index, count, first)``: only stream positions ``p >= first`` with ``p % count == index``
    #: (see :func:`stream_positions`); None: every batch.
    stream: tuple[int, int, int] | None = None

    @property
    def batches_per_epoch(self) -> int:
        return sum(g.batch_count for g in self.training)

    @property
    def batches_per_validation(self) -> int:
        return sum(g.batch_count for g in self.validation) if self.validation_mode else 0

    @property
    def first_batch(self) -> int:
        return self.start[0] * self.batches_per_epoch + self.start[1]

    @property
    def last_batch(self) -> int | None:
        if self.end is None:
            return None
        kind, n = self.end
        return n if kind == "batch" else n * self.batches_per_epoch


def plan_fingerprint(plan: Plan) -> str:
    """A short digest of everything that decides a run's batches (groups, sizes, seeds, shuffles,
    validation, start and end), not of which share of it is loaded: equal for the producers that
    serve shares of one run, different for another run."""
    whole = replace(plan, stream=None)
    return hashlib.sha256(repr(whole).encode()).hexdigest()[:16]


def normalise_start(start_at: tuple[int, int], batches_per_epoch: int) -> tuple[int, int]:
    """``(epoch, offset)`` with the offset folded into ``[0, batches_per_epoch)``."""
    epoch, offset = start_at
    carry, offset = divmod(offset, batches_per_epoch)
    epoch += carry
    if epoch < 0:
        raise ValueError("start_at must not be negative")
    return epoch, offset


def epoch_limit(plan: Plan) -> tuple[int, int] | None:
    """``(epoch_size, last epoch)`` of the training mixture whose positions run out first (see
    :func:`hydrax.order.mixing.last_epoch`), or None for a run without one: the schedule ends after
    that epoch, whatever its end point."""
    sizes = [g.size for g in plan.training if g.mixture is not None]
    if not sizes:
        return None
    size = max(sizes)
    return size, last_epoch(size)


def check_epochs(plan: Plan) -> None:
    """Refuse a run whose start or end lies past the last epoch its training mixtures can count
    (:class:`~hydrax.errors.MixtureRangeError`, naming the epoch size and the epoch)."""
    limit = epoch_limit(plan)
    if limit is None:
        return
    size = limit[0]
    check_epoch(size, plan.start[0], "start_at")
    last = plan.last_batch
    if last is not None and last > plan.first_batch:
        check_epoch(size, (last - 1) // plan.batches_per_epoch, "end_at")


def check_epoch_reached(plan: Plan) -> None:
    """Raise :class:`~hydrax.errors.MixtureRangeError` for a run whose schedule ended because
    its training mixtures can count no further epochs (a run without an end point: one with an
    end past that epoch is refused by :func:`check_epochs`); nothing for a run with an end point, which ended there."""
    limit = epoch_limit(plan)
    if limit is not None and plan.end is None:
        size, last = limit
        check_epoch(size, last + 1, "end_at")


def epoch_group_sequence(plan: Plan) -> list[tuple[int, int]]:
    """``(group, cursor position)`` for every batch of one epoch, in delivery order.

    Sequential mode drains the groups in list order. Interleaved mode picks, before every batch,
    the group with the smallest consumed fraction (ties go to the lowest index), compared exactly.
    The sequence is the same for every epoch. A whole list: the run itself walks
    :func:`epoch_sequence`, which holds nothing of the epoch's size.
    """
    return list(epoch_sequence([g.batch_count for g in plan.training], plan.interleave))


def epoch_sequence(counts: Sequence[int], interleave: bool = True, first: int = 0) -> Iterator[tuple[int, int]]:
    """The ``(group, cursor)`` pairs of :func:`epoch_group_sequence` from position ``first`` of the
    epoch on, for groups of ``counts`` batches: the cursors at ``first`` are computed, not walked
    to, so a run resumes mid-epoch at once however long the epoch is."""
    counts = [int(n) for n in counts]
    total = sum(counts)
    if not interleave or len(counts) == 1:
        done = 0
        for g, n in enumerate(counts):
            for c in range(max(0, first - done), n):
                yield g, c
            done += n
        return
    cursors = interleaved_cursors(counts, first)
    for _ in range(first, total):
        best = -1
        for g, n in enumerate(counts):
            if cursors[g] == n:
                continue
            # cursors[g] / n < cursors[best] / counts[best], without floating point
            if best < 0 or cursors[g] * counts[best] < cursors[best] * n:
                best = g
        yield best, cursors[best]
        cursors[best] += 1


def interleaved_cursors(counts: Sequence[int], first: int) -> list[int]:
    """How many batches of each group the interleaved order has taken before position ``first``.

    Batch ``c`` of group ``g`` is taken in the order of ``(c / counts[g], g)``; its rank (how many
    batches come before it) is a sum over the groups, so the cursors follow by bisection.
    """
    def rank(c: int, g: int) -> int:
        n_g = counts[g]
        before = 0
        for h, n_h in enumerate(counts):
            if h == g:
                before += c
                continue
            product = c * n_h
            before += -(-product // n_g)  # batches c' of h with c' / n_h < c / n_g
            if h < g and product % n_g == 0:
                before += 1  # and the tie, which goes to the lower index
        return before

    cursors = []
    for g, n in enumerate(counts):
        low, high = 0, n  # the number of batches of g whose rank is below first
        while low < high:
            mid = (low + high) // 2
            if rank(mid, g) < first:
                low = mid + 1
            else:
                high = mid
        cursors.append(low)
    return cursors


def stream_positions(index: int, count: int, first: int = 0) -> Iterator[int]:
    """The positions one of ``count`` producers serves, from ``first`` on: ``index``, ``index + count``, ...

    A run's *stream* is its batches, training and validation, in schedule order, numbered from 0
    at ``start_at``. Producers that split a stream this way serve disjoint batches whose union
    is the whole run, and a consumer that knows the rule puts them back in order.
    """
    position = first + (index - first) % count
    while True:
        yield position
        position += count


def iter_steps(plan: Plan) -> Iterator[Step]:
    """The run's batches in schedule order, or only those of ``plan.stream`` (see :func:`stream_positions`)."""
    steps = _schedule_steps(plan)
    if plan.stream is None:
        return steps
    index, count, first = plan.stream
    return (step for position, step in enumerate(steps) if position >= first and position % count == index)


def _schedule_steps(plan: Plan) -> Iterator[Step]:
    """Yield the batches of a run in schedule order (forever when the plan has no end).

    Numbering, permutations and seeds are those of an uninterrupted run from epoch 0: where
    ``plan.start`` falls is computed (see :func:`epoch_sequence`), not walked to, so resuming
    costs the same at any point. A validation run belongs to the run that trained the batch or
    epoch it follows, so that a run stopped by ``end_at`` and resumed from the matching
    ``start_at`` validates exactly as often, and at the same points, as an uninterrupted run:

    - it comes after the ``interval``-th training batch or epoch, as in hydrax 0.2.2, and before
      the end point is checked, so a run that stops on a boundary still validates there;
    - a run stopped by a batch end point at an epoch end still runs that epoch's validation
      (0.2.2 lost it: the resumed run starts with the next epoch);
    - a resumed run never starts with the validation of a boundary it resumes on (0.2.2 ran it
      again there, in batch mode).

    A run over a mixture ends after the last epoch whose positions it can count
    (:func:`epoch_limit`), as after an end point: past it they would overflow int64. The
    Dataloader refuses a start or end beyond it (:func:`check_epochs`), and says why a run
    without an end stopped there (:func:`check_epoch_reached`).
    """
    bpe = plan.batches_per_epoch
    limit = epoch_limit(plan)
    final_epoch = limit[1] if limit is not None else None
    last = plan.last_batch
    if last is not None and plan.first_batch >= last:
        return
    end_epoch = plan.end[1] if plan.end is not None and plan.end[0] == "epoch" else None
    epoch, seek = plan.start
    batch = epoch * bpe + seek
    counts = [g.batch_count for g in plan.training]
    validation_run = 0
    validation_batch_num = 0

    def validation() -> Iterator[ValidationStep]:
        nonlocal validation_run, validation_batch_num
        epoch_batch = 0
        for g, vplan in enumerate(plan.validation):
            for c in range(vplan.batch_count):
                yield ValidationStep(validation_run, epoch_batch, validation_batch_num, g, c)
                epoch_batch += 1
                validation_batch_num += 1
        validation_run += 1

    def epoch_validation_due(completed_epochs: int) -> bool:
        return plan.validation_mode == "epoch" and completed_epochs % plan.validation_interval == 0

    while True:
        if final_epoch is not None and epoch > final_epoch:
            return
        orders = [batch_order(g, epoch) for g in plan.training]
        trained = False  # whether this run trained the batch just passed
        for epoch_batch, (g, cursor) in enumerate(epoch_sequence(counts, plan.interleave, seek), seek):
            order = orders[g]
            group_index = cursor if order is None else int(order[cursor])
            yield TrainingStep(batch, epoch, epoch_batch, g, group_index)
            trained = True
            batch += 1
            if trained and plan.validation_mode == "batch" and batch % plan.validation_interval == 0:
                yield from validation()
            if last is not None and plan.end[0] == "batch" and batch >= last:
                if trained and batch % bpe == 0 and epoch_validation_due(batch // bpe):
                    yield from validation()
                return
        epoch += 1
        seek = 0
        if trained and epoch_validation_due(epoch):
            yield from validation()
        if end_epoch is not None and epoch >= end_epoch:
            return


def describe_step(step: Step) -> str:
    """A batch of the schedule in words: ``"batch 7 (epoch 1)"`` or ``"validation batch 3 (run 0)"``."""
    if isinstance(step, TrainingStep):
        return f"batch {step.batch_num} (epoch {step.epoch})"
    return f"validation batch {step.validation_batch_num} (run {step.validation_epoch})"

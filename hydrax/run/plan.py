"""What a run is made of, settled once when the :class:`~hydrax.Dataloader` is built.

- :class:`RunPolicy`: the run's settings (slots, loaders, failure handling, processes), frozen.
- :class:`GroupRun`: one group as this process runs it: the :class:`~hydrax.DataGroup`, the
  share of every batch this process loads (its :class:`~hydrax.order.schedule.GroupPlan`), where that
  share lives in a slot, its device shards, and its cache. :class:`RunGroups` holds them all,
  training first, and finds the one a schedule step or a task names.
- :func:`plan_run` builds them, with the schedule's :class:`~hydrax.order.schedule.Plan`, and opens
  each group's on-disk cache (:func:`open_group_cache`, from what the group says of it).

Everything here is decided before any process or thread starts; the pipeline only reads it.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Iterator, Mapping, Sequence

from ..cache.descriptor import descriptor_text, prepare_location
from ..cache.files import GroupCache, share_directory
from .group import DataGroup
from ..layout import ArrayLayout, SlotLayout, compute_layouts, slot_layout
from ..procs.messages import TASK_BYTES
from ..order.orders import epoch_order
from ..order.schedule import GroupPlan, Plan, Step, TrainingStep, host_share, normalise_start, read_order, share_ranges
from .sharding import GroupSharding, as_shardings, plan_group

#: Bytes of task records that may sit in the task pipe at once (below the 64 KiB pipe buffer).
TASK_PIPE_BUDGET = 48 * 1024


@dataclass(frozen=True)
class RunPolicy:
    """A run's settings, checked (see :class:`~hydrax.Dataloader` for each argument)."""

    depth: int = 3
    loader_count: int = 1
    loader_nice: int = 0
    #: Threads writing cache files; 0 when every cache is read-only.
    cacher_count: int = 1
    deterministic: bool = True
    timeout_s: int = 60
    zero_copy: bool | None = None
    on_item_error: str = "drop_batch"
    max_consecutive_failures: int | None = 10
    process_index: int = 0
    process_count: int = 1
    #: A failed batch ends the run instead of being dropped: batches span processes or devices,
    #: or the run serves one share of a stream (see :meth:`hydrax.Dataloader.select_stream`).
    never_drop: bool = False

    @property
    def tasks_per_batch(self) -> int:
        """The most tasks one batch is split into: about two per worker (the pipeline uses fewer
        for cheap items), and never more task records than the task pipe holds."""
        return max(1, min(2 * self.loader_count, TASK_PIPE_BUDGET // (TASK_BYTES * self.depth)))


@dataclass(frozen=True)
class GroupRun:
    """One group as this process runs it."""

    #: The group's place among the run's groups, training first: the group a task names.
    index: int
    #: ``"training"`` or ``"validation"``.
    kind: str
    #: The group's place among the groups of its kind: the group a schedule step names.
    number: int
    group: DataGroup
    #: The schedule of the share of every batch this process loads.
    plan: GroupPlan
    #: Where that share lives in a slot.
    layout: SlotLayout
    #: Its device shards, when the run builds global arrays.
    sharding: GroupSharding | None = None
    #: Its cache on disk, opened for this process's share.
    cache: GroupCache | None = None

    @property
    def training(self) -> bool:
        """Whether this is a training group (its items have seeds, its order changes by epoch)."""
        return self.kind == "training"

    @property
    def cache_layouts(self) -> MappingProxyType[str, ArrayLayout] | None:
        """What :meth:`hydrax.Batch.cache` checks against: the cache's layouts of this process's
        rows, or the group's (a group with cache arrays but no location caches in memory only)."""
        return self.cache.layouts if self.cache is not None else self.group.cache_layouts

    def epoch_of(self, step: Step) -> int:
        """The epoch whose order ``step`` takes its items from (0 for validation, whose order never changes)."""
        return step.epoch if isinstance(step, TrainingStep) else 0

    def items(self, step: Step) -> Sequence[int]:
        """The indices of the items of this process's share of ``step``'s batch, computed from
        scratch (a whole ``"numpy"`` order each time: the pipeline asks
        :class:`hydrax.order.orderbook.RunOrders`, which keeps them)."""
        return epoch_order(self.plan, self.epoch_of(step), self.training).local(self.plan, step.group_index)

    def read_order(self, step: Step) -> str:
        """How ``step``'s items are spread over the data (see :func:`hydrax.order.schedule.read_order`)."""
        return read_order(self.plan, self.epoch_of(step), self.training)

    def __str__(self) -> str:
        return f"{self.kind} group {self.number}"


@dataclass(frozen=True)
class RunGroups:
    """The run's groups, training first."""

    training: tuple[GroupRun, ...]
    validation: tuple[GroupRun, ...] = ()

    def __iter__(self) -> Iterator[GroupRun]:
        yield from self.training
        yield from self.validation

    def __len__(self) -> int:
        return len(self.training) + len(self.validation)

    def __getitem__(self, index: int) -> GroupRun:
        """The group a task names (see :attr:`GroupRun.index`)."""
        count = len(self.training)
        return self.training[index] if index < count else self.validation[index - count]

    def of(self, step: Step) -> GroupRun:
        """The group ``step`` takes a batch of."""
        return self.training[step.group] if isinstance(step, TrainingStep) else self.validation[step.group]


def plan_run(
    training: Sequence[DataGroup],
    validation: Sequence[DataGroup],
    policy: RunPolicy,
    *,
    validation_mode: str | None,
    validation_interval: int,
    start_at: tuple[int, int],
    end_at: tuple[str, int] | None,
    interleave: bool,
    sharding: Any = None,
) -> tuple[Plan, RunGroups]:
    """The schedule of a run and its groups as this process runs them.

    Each group's plan is narrowed to the rows this process loads (its share of every batch, or
    with ``sharding`` the rows of its devices); its cache is checked or created (a descriptor
    that does not match raises here, as in hydrax 0.2.2).
    """
    shares = [_share(g, "training", i, policy, sharding) for i, g in enumerate(training)]
    shares += [_share(g, "validation", i, policy, sharding) for i, g in enumerate(validation)]
    plans = [plan for plan, _ in shares]
    count = len(training)
    bpe = sum(p.batch_count for p in plans[:count])
    plan = Plan(
        training=tuple(plans[:count]),
        validation=tuple(plans[count:]),
        validation_mode=validation_mode,
        validation_interval=validation_interval,
        start=normalise_start(start_at, bpe),
        end=end_at,
        interleave=interleave and count > 1,
    )
    groups = [*training, *validation]
    if sharding is not None and any(g.cache_settings.location is not None for g in groups):
        raise ValueError("a group with an on-disk cache (cache_location) cannot be placed with sharding; "
                         "use process_index/process_count (each process caches its share) or placement_func")
    runs = [
        GroupRun(index=i, kind="training" if i < count else "validation", number=i if i < count else i - count, group=group,
                 plan=share, layout=share_layout(group, share, sharded), sharding=sharded,
                 cache=open_group_cache(group, share, policy.process_index, policy.process_count))
        for i, (group, (share, sharded)) in enumerate(zip(groups, shares))
    ]
    return plan, RunGroups(tuple(runs[:count]), tuple(runs[count:]))


def _share(group: DataGroup, kind: str, number: int, policy: RunPolicy, sharding: Any) -> tuple[GroupPlan, GroupSharding | None]:
    """The plan of the rows of every batch of ``group`` this process loads, and its device shards."""
    count = policy.process_count
    what = f"{kind} group {number}"
    if group.batch_size % count:
        raise ValueError(
            f"{what} has batch_size {group.batch_size}, which {count} processes cannot split evenly "
            f"(process_count={count}): make every batch size a multiple of the process count"
        )
    if sharding is None:
        sharded = None
        plan = host_share(group.plan, policy.process_index, count)
    else:
        item_shapes = {name: layout.shape[1:] for name, layout in group.loader_layouts.items()}
        sharded = plan_group(as_shardings(sharding, list(item_shapes)), group.batch_size, item_shapes, what)
        plan = share_ranges(group.plan, sharded.ranges)
    if kind == "training" and group.shard_partitions > 1:
        _check_partitions(group, plan, what, count, sharding is not None)
    return plan, sharded


def _check_partitions(group: DataGroup, plan: GroupPlan, what: str, count: int, sharded: bool) -> None:
    # Each process must load whole partitions, or it reads other processes' shards.
    partitions = group.shard_partitions
    block = group.batch_size // partitions
    if not sharded and partitions % count:
        raise ValueError(
            f"{what} has shard_partitions={partitions}, which process_count={count} does not divide: "
            f"each process must load whole partitions to read only its own shards; use a process count that "
            f"divides {partitions}, or shard_partitions a multiple of {count}"
        )
    if any(start % block or stop % block for start, stop in plan.share):
        raise ValueError(
            f"{what} has shard_partitions={partitions}, but the sharding gives this process positions "
            f"{list(plan.share)} of every batch, which cut through partitions (blocks of {block} positions): "
            f"each process must load whole partitions to read only its own shards; use shard_partitions that "
            f"divide the sharding's blocks of rows"
        )


def share_layout(group: DataGroup, plan: GroupPlan, sharding: GroupSharding | None = None) -> SlotLayout:
    """The slot layout of this process's share of ``group``'s batches: one block of
    ``plan.local_batch_size`` rows, or with a sharding one block per device block."""
    specs = {name: (layout.shape[1:], layout.dtype, layout.jax_dtype) for name, layout in (group.loader_layouts or {}).items()}
    if sharding is None:
        layout = slot_layout((plan.local_batch_size,), specs)
    else:
        layout = slot_layout(sharding.block_rows, specs, sharding.device_starts)
    if layout.arrays == group.loader_layouts:
        # the same object, so that ``batch.layouts is group.loader_layouts`` as in 0.2.2
        layout = replace(layout, arrays=group.loader_layouts)
    return layout


def with_cachers(policy: RunPolicy, groups: RunGroups) -> RunPolicy:
    """``policy`` with as many cache writer threads as the caches need: none when every cache
    is read-only, at most ``depth`` (a warning says so)."""
    if not any(g.cache is not None and not g.cache.readonly for g in groups):
        return replace(policy, cacher_count=0)
    if policy.cacher_count < 1:
        raise ValueError("cachers are required, cannot provision none")
    if policy.cacher_count > policy.depth:
        warnings.warn(f"ignoring cacher_count ({policy.cacher_count}) in excess of depth ({policy.depth})", ResourceWarning, stacklevel=3)
        return replace(policy, cacher_count=policy.depth)
    return policy


def group_descriptor(group: DataGroup, layouts: Mapping[str, ArrayLayout], extra: Mapping[str, Any] | None = None) -> str:
    """The descriptor of ``group``'s cache with the arrays at ``layouts`` (see :func:`~hydrax.cache.descriptor_text`)."""
    extra = dict(extra or {})
    if group.shuffle_later == "shardwise":
        # Not part of 0.2.2's descriptor, but they decide a shardwise batch's items.
        extra.update(shard_window=group.shard_window, shard_partitions=group.shard_partitions)
    return descriptor_text(
        data_len=len(group), batch_size=group.batch_size, seed=group.seed, shuffle_first=group.shuffle_first,
        shuffle_later=group.shuffle_later, layouts=[(lay.offset, lay.dtype, lay.count) for lay in layouts.values()], extra=extra,
    )


def open_group_cache(group: DataGroup, plan: GroupPlan, process_index: int = 0, process_count: int = 1) -> GroupCache | None:
    """Check or create ``group``'s cache for a run that loads ``plan``'s share of each batch; None
    when the group has no cache on disk.

    Raises what :func:`~hydrax.cache.prepare_location` raises (a mismatching descriptor, a
    missing read-only cache). With several processes, each keeps its share of every batch in a
    share directory of the cache (see :func:`~hydrax.cache.share_directory`), with its own descriptor.
    """
    settings = group.cache_settings
    if settings.location is None or group.cache_layouts is None:
        return None
    prepare_location(settings.location, group_descriptor(group, group.cache_layouts), settings.readonly)
    location, layouts, size, rows = settings.location, group.cache_layouts, group.cache_size, group.batch_size
    if process_count > 1:
        rows = plan.local_batch_size
        shared, size = compute_layouts(rows, settings.arrays, natural=True)
        layouts = MappingProxyType(shared)
        location = share_directory(settings.location, process_index, process_count)
        share = {"process_count": process_count, "share": [list(r) for r in plan.share]}
        prepare_location(location, group_descriptor(group, layouts, share), settings.readonly)
    return GroupCache(location, layouts, int(size), rows, group.shuffle_later, settings.readonly, settings.direct,
                      group.loader_layouts is None)

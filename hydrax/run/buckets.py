"""One DataGroup per aspect-ratio bucket of a :class:`hydrax.image.BucketPlan`.

The plan (made from image sizes alone, :mod:`hydrax.image.buckets`) says which images go in which
bucket, and each bucket's slot size and batch size. Here each bucket becomes a DataGroup over a
:class:`~hydrax.shards.subset.Subset` of the data (a ShardSet's subset keeps its shards, so
``shuffle_later="shardwise"`` and remote read-ahead work as for the whole set), with loader arrays
of the bucket's shape. The Dataloader interleaves the groups, least consumed first, so at every
step each bucket has delivered the same share of its batches to within one batch; groups share the
loaders' memory, which is sized for the largest batch (with ``pixels_per_batch``, all are about
equal). Everything is a pure function of the plan, so every host builds the same groups.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .group import DataGroup


def bucket_groups(plan: Any, data: Sequence, loader_arrays: Callable[[int, int], Mapping[str, Any]], *,
                  seed: int = 0, **options: Any) -> list[DataGroup]:
    """A DataGroup per bucket of ``plan`` (a :class:`hydrax.image.BucketPlan`), in its order.

    :param plan: the buckets, made by :func:`hydrax.image.plan_buckets` from the sizes of ``data``'s
        items (so ``plan``'s image ``i`` is ``data[i]``).
    :param data: the items the sizes were read from: a :class:`hydrax.shards.ShardSet` or any sequence.
    :param loader_arrays: ``(height, width) -> {name: (item_shape, numpy_dtype, jax_dtype)}``, the
        loader arrays of a bucket of that slot size (e.g. ``{"image": ((height, width, 3), np.uint8,
        jnp.uint8)}``); the loader function fills them (``decode_into`` covers and crops to the
        slot's shape).
    :param seed: bucket ``b``'s group seed is ``seed`` plus the images of the buckets before it, so
        no two buckets draw the same item seeds in an epoch.
    :param options: any other :class:`hydrax.DataGroup` arguments, the same for every bucket
        (``shuffle_later="shardwise"``, ``permutation="lazy"``, ``shard_partitions``, ...).
    :raises ValueError: where ``plan`` was made from another number of images than ``data`` holds.
    """
    if len(plan.assignment) != len(data):
        raise ValueError(f"the plan was made from {len(plan.assignment)} images' sizes, but data holds {len(data)} items: "
                         "make the plan from this data's sizes (ShardSet.image_sizes)")
    for name in ("batch_size", "data", "loader_arrays"):
        if name in options:
            raise TypeError(f"bucket_groups sets each group's {name} itself (from the plan); do not pass {name}=")
    # imported here: ``import hydrax`` (which offers this function) must not import hydrax.shards
    from ..shards.subset import Subset

    groups = []
    offset = int(seed)
    for bucket in plan.buckets:
        groups.append(DataGroup(bucket.batch_size, Subset(data, bucket.items),
                                loader_arrays=loader_arrays(bucket.height, bucket.width), seed=offset, **options))
        offset += len(bucket.items)
    return groups


__all__ = ["bucket_groups"]

"""DataGroup: arguments, clamping, Sequence behaviour and 64-byte aligned layouts."""

import numpy as np
import pytest
import jax.numpy as jnp

from hydrax import DataGroup

ARRAYS = {"x": ((1,), "int32", jnp.int32), "s": ((1,), "int64", jnp.int32)}


def test_layouts_are_64_byte_aligned_in_insertion_order():
    g = DataGroup(3, range(10), loader_arrays=ARRAYS)
    x, s = g.loader_layouts["x"], g.loader_layouts["s"]
    assert x == ((3, 1), np.dtype("int32"), jnp.dtype("int32"), 0, 3)
    assert s[:3] == ((3, 1), np.dtype("int64"), jnp.dtype("int32")) and s[3] == 64 and s[4] == 3
    assert g.loader_size == 64 + 24
    assert list(g.loader_layouts) == ["x", "s"]
    with pytest.raises(TypeError):
        g.loader_layouts["y"] = None


def test_batch_size_is_clamped_and_the_remainder_dropped():
    g = DataGroup(8, range(5), loader_arrays=ARRAYS)
    assert (g.batch_size, g.batch_count) == (5, 1)
    g = DataGroup(4, range(10), loader_arrays=ARRAYS)
    assert (g.batch_size, g.batch_count, len(g)) == (4, 2, 10)


def test_group_is_its_data():
    data = ["a", "b", "c", "d"]
    g = DataGroup(2, data, loader_arrays=ARRAYS)
    assert g.data is data and g[1] == "b" and g[1:3] == ["b", "c"] and list(g) == data
    assert "c" in g and g.index("d") == 3 and g.count("a") == 1
    assert DataGroup(2, (i * i for i in range(4)), loader_arrays=ARRAYS).data == [0, 1, 4, 9]


def test_default_shuffle_resolves_to_itemwise_without_a_cache():
    assert DataGroup(2, range(4), loader_arrays=ARRAYS).shuffle_later == "itemwise"
    assert DataGroup(2, range(4), loader_arrays=ARRAYS, shuffle_later="repeat").shuffle_later == "repeat"


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"batch_size": 0}, ValueError, "batch size must be at least 1"),
        ({"batch_size": -1}, ValueError, "batch size must be at least 1"),
        ({"data": []}, ValueError, "batch size must be at least 1"),
        ({"data": 5}, TypeError, "is not a sequence or iterable"),
        ({"shuffle_later": "random"}, ValueError, "shuffle_later must be 'default', 'repeat', 'reseed', 'itemwise', or 'batchwise'"),
        ({"loader_arrays": None}, ValueError, "either loader_arrays or cache_arrays must be specified"),
        ({"loader_arrays": {"x": ((0,), "f4", jnp.float32)}}, ValueError, r"invalid shape for array 'x': \(2, 0\)"),
        ({"loader_arrays": {"x": ((2,), "f4")}}, TypeError, "must be \\(item_shape, numpy_dtype, jax_dtype\\)"),
        ({"loader_arrays": {"x": ((2,), object, jnp.float32)}}, TypeError, "cannot live in shared memory"),
        ({"loader_arrays": None, "cache_arrays": ARRAYS}, ValueError, "cache_location is required if no loader_arrays are specified"),
        ({"seed": -1}, ValueError, "seed must be a non-negative int"),
        ({"batch_size": 2.5}, TypeError, "batch_size must be an int"),
    ],
)
def test_bad_arguments_say_what_is_wrong(kwargs, error, message):
    args = {"batch_size": 2, "data": range(4), "loader_arrays": ARRAYS, **kwargs}
    with pytest.raises(error, match=message):
        DataGroup(args.pop("batch_size"), args.pop("data"), **args)


def test_subclassing_warns_but_works():
    class Mine(DataGroup):
        pass

    with pytest.warns(SyntaxWarning, match="Mine derives from hydrax.DataGroup. This is not supported."):
        g = Mine(2, range(4), loader_arrays=ARRAYS)
    assert g.batch_count == 2


def test_scalar_items_are_allowed():
    g = DataGroup(4, range(8), loader_arrays={"y": ((), np.float32, jnp.float32)})
    assert g.loader_layouts["y"][0] == (4,)


class Sharded(list):
    """A sequence that knows its shards, as a hydrax.shards.ShardSet does."""

    def shard_sizes(self):
        return [5, 3, 8]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"shard_partitions": 0}, "shard_partitions must be a positive int, got 0"),
        ({"shard_partitions": 2.0}, r"shard_partitions must be a positive int, got 2\.0"),
        ({"shard_partitions": True}, "shard_partitions must be a positive int, got True"),
        ({"shard_partitions": 2, "shuffle_later": "itemwise"}, "shard_partitions=2 needs shuffle_later='shardwise' \\(got 'itemwise'\\)"),
        ({"shard_partitions": 4, "batch_size": 6}, "batch_size 6 is not a multiple of shard_partitions=4"),
        ({"shard_partitions": 3, "batch_size": 20}, r"batch_size 16 \(batch_size 20 clamped to the 16 items\) is not a multiple of shard_partitions=3"),
    ],
)
def test_shard_partitions_are_checked(kwargs, message):
    args = {"batch_size": 4, "shuffle_later": "shardwise", **kwargs}
    with pytest.raises(ValueError, match=message):
        DataGroup(args.pop("batch_size"), Sharded(range(16)), loader_arrays=ARRAYS, **args)


def test_shard_partitions_reach_the_plan():
    g = DataGroup(4, Sharded(range(16)), loader_arrays=ARRAYS, shuffle_later="shardwise", shard_partitions=2)
    assert g.shard_partitions == 2 and g.plan.shard_partitions == 2
    assert g.plan.shard_sizes == (5, 3, 8)
    assert DataGroup(4, range(16), loader_arrays=ARRAYS).shard_partitions == 1
    assert DataGroup(4, range(16), loader_arrays=ARRAYS, shard_partitions=1).plan.shard_partitions == 1

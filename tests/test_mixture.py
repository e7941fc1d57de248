"""hydrax.Mixture as a DataGroup's data: the API, what is refused, and real runs (loaders, hosts, resume, shards)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from support.timing import slack_int

from hydrax import Dataloader, DataGroup, Mixture
from hydrax.shards import ShardSet

ARRAYS = {"value": ((), np.int64, jnp.int64), "seed": ((), np.int64, jnp.int64)}
A, B, C = list(range(1000, 1700)), range(2000, 2200), np.arange(3000, 3100)


def load_value(item, arrays, seed):
    arrays["value"][...] = int(item)
    arrays["seed"][...] = seed


def group_of(mixture, batch_size=20, **kwargs):
    return DataGroup(batch_size, mixture, loader_arrays=ARRAYS, seed=7, **kwargs)


def run(group, **kwargs):
    """Every batch of a run: (epoch, epoch_batch, item indices, sources, values, seeds)."""
    kwargs.setdefault("end_at", ("epoch", 3))
    kwargs.setdefault("loader_count", 2)
    out = []
    with Dataloader(load_value, group, timeout_sec=slack_int(60), **kwargs) as loader:
        for batch in loader:
            out.append((batch.epoch, batch.epoch_batch, list(batch.indices), batch.sources.tolist(),
                        np.asarray(batch.arrays["value"]).tolist(), np.asarray(batch.arrays["seed"]).tolist()))
            del batch
    return out


def test_a_mixture_is_the_sequence_of_its_sources_items():
    mixture = Mixture([A, B, C], weights=[7, 2, 1], epoch_size=500, batching="stratified")
    assert len(mixture) == 1000 and mixture.epoch_size == 500
    assert mixture.offsets.tolist() == [0, 700, 900, 1000]
    assert mixture[0] == 1000 and mixture[700] == 2000 and mixture[999] == 3099 and mixture[-1] == 3099
    assert mixture[698:702] == [1698, 1699, 2000, 2001]
    assert mixture.locate(905) == (2, 5)
    assert mixture.source_of([0, 699, 700, 999]).tolist() == [0, 0, 1, 2]
    assert mixture.proportions == pytest.approx((0.7, 0.2, 0.1))
    assert "stratified" in repr(mixture) and "list[700] x 0.7" in repr(mixture)
    with pytest.raises(IndexError, match="out of range for a Mixture of 1000 items"):
        mixture[1000]
    assert Mixture([A, B], weights=[1, 1]).epoch_size == 900  # default: every source's length


def test_take_reads_each_item_from_its_source_when_reached():
    reads = []

    class Logged(list):
        def __getitem__(self, i):
            reads.append(i)
            return super().__getitem__(i)

    mixture = Mixture([A, Logged(B), C], weights=[1, 1, 1])
    indices = np.array([999, 0, 700, 701, 699, 905], np.int64)
    items = mixture.take(indices)
    assert reads == []  # nothing read before it is asked for
    assert next(items) == 3099 and reads == []
    assert next(items) == 1000 and next(items) == 2000 and reads == [0]
    assert list(items) == [2001, 1699, 3005] and reads == [0, 1]
    assert list(mixture.take([3, 950])) == [mixture[3], mixture[950]] and list(mixture.take([])) == []
    for bad, words in (([0, 1000], "item 1000 \\(at 1\\)"), ([-1], "item -1 \\(at 0\\)")):
        with pytest.raises(IndexError, match=words + " is out of range for a Mixture of 1000 items"):
            mixture.take(bad)
    with pytest.raises(IndexError, match="item 1000"):
        mixture.source_of([5, 1000])
    assert mixture.source_of([[0, 999], [700, 5]]).tolist() == [[0, 2], [1, 0]]


@pytest.mark.parametrize("sources,kwargs,error,message", [
    ([], {"weights": []}, ValueError, "at least one source"),
    ([A, []], {"weights": [1, 1]}, ValueError, r"sources\[1\] is empty"),
    ([A, "abc"], {"weights": [1, 1]}, TypeError, r"sources\[1\] must be a sequence"),
    ([A, B], {"weights": [1]}, ValueError, "2 sources, 1 weights"),
    ([A, B], {"weights": [1, 0]}, ValueError, r"weights\[1\] must be positive"),
    ([A, B], {"weights": [1, 1], "batching": "even"}, ValueError, "batching must be 'random' or 'stratified'"),
    ([A, B], {"weights": [1, 1], "epoch_size": 0}, ValueError, "epoch_size must be a positive int"),
])
def test_bad_mixtures_are_refused_with_the_argument_named(sources, kwargs, error, message):
    with pytest.raises(error, match=message):
        Mixture(sources, **kwargs)


def test_a_mixture_inside_a_mixture_is_refused():
    inner = Mixture([A, B], weights=[1, 1])
    with pytest.raises(TypeError, match="is a Mixture"):
        Mixture([inner, C], weights=[1, 1])


@pytest.mark.parametrize("kwargs,message", [
    ({"shuffle_later": "batchwise"}, "does not apply to a Mixture"),
    ({"shuffle_later": "repeat"}, "does not apply to a Mixture"),
    ({"shuffle_first": True}, "shuffle_first does not apply"),
    ({"shuffle_later": "shardwise"}, "at least one source that knows its shards"),
])
def test_group_settings_that_do_not_apply_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        group_of(Mixture([A, B], weights=[1, 1]), **kwargs)


def test_a_group_of_a_mixture_counts_batches_by_its_epoch_size():
    group = group_of(Mixture([A, B, C], weights=[7, 2, 1], epoch_size=510), batch_size=20)
    assert len(group) == 1000 and group.batch_count == 25
    assert group.shuffle_later == "itemwise" and group.permutation == "lazy"
    assert group.plan.size == 510 and group.plan.mixture.source_sizes == (700, 200, 100)


def test_weights_beyond_a_float_sum_are_normalised_exactly_or_refused_naming_them():
    """Issue 38 row 8: weights [1e308, 1e308] gave proportions (0.0, 0.0); [10**400, 1] an OverflowError."""
    from hydrax.errors import MixtureRangeError

    huge = Mixture([A, B], weights=[1e308, 1e308])
    assert huge.proportions == (0.5, 0.5) and huge.weights == (1e308, 1e308)
    assert "x 0.5" in repr(huge)
    assert group_of(huge).plan.mixture.weights == (1e308, 1e308)
    exact = Mixture([A, B], weights=[10**400, 10**399])  # ints beyond a float: divided by the largest, exactly
    assert exact.weights == (1.0, 0.1) and exact.proportions == pytest.approx((10 / 11, 1 / 11))
    with pytest.raises(MixtureRangeError, match=r"weights\[1\] \(1\) is too small next to weights\[0\] \(an int of about "
                                                r"2\*\*1328\) for a float to hold their ratio") as caught:
        Mixture([A, B], weights=[10**400, 1])
    assert caught.value.argument == "weights" and isinstance(caught.value, ValueError)
    with pytest.raises(ValueError, match=r"weights\[0\] must be positive and finite, got an int of about 2\*\*1328"):
        Mixture([A, B], weights=[-(10**400), 1])


@pytest.mark.parametrize("epoch_size", [2**63, 2**64])
def test_an_epoch_size_past_int64_is_refused_when_the_mixture_is_made(epoch_size):
    """Issue 38 row 8: epoch_size 2**63 and 2**64 were taken, and failed in int64 once the run started."""
    import pickle

    from hydrax.errors import MixtureRangeError

    with pytest.raises(MixtureRangeError, match=f"epoch_size: epoch 0 of a Mixture with epoch_size {epoch_size} has positions "
                                                "past 2\\*\\*63 - 1") as caught:
        Mixture([A, B], weights=[1, 1], epoch_size=epoch_size)
    error = caught.value
    assert (error.argument, error.epoch_size, error.epoch, error.last_epoch) == ("epoch_size", epoch_size, 0, -1)
    again = pickle.loads(pickle.dumps(error))
    assert (type(again), str(again), vars(again)) == (MixtureRangeError, str(error), vars(error))
    assert Mixture([A, B], weights=[1, 1], epoch_size=2**63 - 1).epoch_size == 2**63 - 1


def test_epochs_past_int64_are_refused_at_start_at_and_end_at_and_where_the_run_reaches_them():
    """Issue 38 row 8: epoch_size 2**61 at epoch 8 overflowed the positions silently. Its last
    epoch is 2: (2 + 1) * 2**61 <= 2**63 - 1 < 4 * 2**61."""
    from hydrax.errors import MixtureRangeError

    group = group_of(Mixture([A, B, C], weights=[0.5, 0.3, 0.2], epoch_size=2**61))
    for kwargs, argument, epoch in [({"start_at": (8, 0)}, "start_at", 8), ({"start_at": (3, 0)}, "start_at", 3),
                                    ({"start_at": (2, group.batch_count)}, "start_at", 3),
                                    ({"start_at": (2, 5), "end_at": ("epoch", 4)}, "end_at", 3),
                                    ({"end_at": ("batch", 3 * group.batch_count + 1)}, "end_at", 3)]:
        with pytest.raises(MixtureRangeError, match=f"{argument}: epoch {epoch} of a Mixture with epoch_size {2**61}") as caught:
            Dataloader(load_value, group, **kwargs)
        assert (caught.value.argument, caught.value.epoch_size, caught.value.epoch, caught.value.last_epoch) == (argument, 2**61, epoch, 2)
    Dataloader(load_value, group, start_at=(2, 5), end_at=("epoch", 3))  # ends with epoch 2: fine
    # a run without an end delivers the last epoch whole, then says why it stops
    tail = (2, group.batch_count - 2)
    with pytest.raises(MixtureRangeError, match="end_at: epoch 3 of a Mixture") as caught:
        run(group, start_at=tail, end_at=None)
    assert caught.value.last_epoch == 2
    got = []
    loader = Dataloader(load_value, group, start_at=tail, loader_count=1, timeout_sec=slack_int(60))
    with pytest.raises(MixtureRangeError), loader:
        for batch in loader:
            got.append((batch.epoch, batch.epoch_batch, list(batch.indices)))
            del batch
    assert [b[:2] for b in got] == [tail, (2, group.batch_count - 1)]
    assert got == [b[:3] for b in run(group, start_at=tail, end_at=("epoch", 3))]
    assert all(0 <= i < len(group) for b in got for i in b[2])


@pytest.mark.parametrize("batching", ["random", "stratified"])
def test_batches_hold_each_sources_own_items_and_say_which_source(batching):
    mixture = Mixture([A, B, C], weights=[0.7, 0.2, 0.1], batching=batching)
    batches = run(group_of(mixture))
    assert len(batches) == 3 * 50
    counts = np.zeros(3, np.int64)
    for _epoch, _number, indices, sources, values, _seeds in batches:
        assert values == [mixture[i] for i in indices]  # the loader got each source's own item
        assert sources == mixture.source_of(indices).tolist()
        assert [v // 1000 - 1 for v in values] == sources
        counts += np.bincount(sources, minlength=3)
        if batching == "stratified":
            assert np.bincount(sources, minlength=3).tolist() == [14, 4, 2]
    assert counts.tolist() == [2100, 600, 300]
    seeds = [s for b in batches for s in b[5]]
    assert seeds == list(range(7, 7 + 3000))  # item seeds as for any itemwise group


@pytest.mark.slow
def test_loader_counts_hosts_and_resume_do_not_change_the_batches():
    mixture = Mixture([A, B, C], weights=[0.5, 0.3, 0.2], epoch_size=480)
    reference = run(group_of(mixture, batch_size=24), loader_count=1)
    assert run(group_of(mixture, batch_size=24), loader_count=3) == reference
    resumed = run(group_of(mixture, batch_size=24), start_at=(1, 5))
    assert resumed == reference[20 + 5:]
    for processes in (2, 4):
        shares = [run(group_of(mixture, batch_size=24), process_index=p, process_count=processes) for p in range(processes)]
        merged = [tuple([*parts[0][:2]] + [sum((part[k] for part in parts), []) for k in range(2, 6)]) for parts in zip(*shares)]
        assert merged == reference
    # a share resumes exactly too: host 1 of 2, from the middle of epoch 2
    tail = run(group_of(mixture, batch_size=24), process_index=1, process_count=2, start_at=(2, 3))
    assert [b[2] for b in tail] == [b[2][12:] for b in reference[43:]]
    # and a run of 2 hosts goes on with 3 from where it stopped: 2 epochs, then the third
    first = [run(group_of(mixture, batch_size=24), process_index=p, process_count=2, end_at=("epoch", 2)) for p in range(2)]
    then = [run(group_of(mixture, batch_size=24), process_index=p, process_count=3, start_at=(2, 0)) for p in range(3)]
    joined = [sum((part[2] for part in parts), []) for parts in zip(*first)] + [sum((part[2] for part in parts), []) for parts in zip(*then)]
    assert joined == [b[2] for b in reference]


def write_shards(folder, prefix: str, counts) -> str:
    wds = pytest.importorskip("webdataset")
    for s, count in enumerate(counts):
        with wds.TarWriter(str(folder / f"{prefix}-{s:02d}.tar")) as sink:
            for i in range(count):
                sink.write({"__key__": f"{prefix}{s}_{i:03d}", "value.txt": f"{s * 1000 + i}".encode()})
    return f"{folder}/{prefix}-{{00..{len(counts) - 1:02d}}}.tar"


def load_sample(sample, arrays, seed):
    arrays["value"][...] = int(bytes(sample["value.txt"])) if not isinstance(sample, int) else -sample
    arrays["seed"][...] = seed


def test_shardsets_mix_with_plain_sources_and_are_read_shard_by_shard(tmp_path):
    web = ShardSet(write_shards(tmp_path, "web", [30] * 20))
    curated = ShardSet(write_shards(tmp_path, "cur", [25] * 4))
    mixture = Mixture([web, curated, list(range(1, 41))], weights=[0.6, 0.3, 0.1], epoch_size=400, batching="stratified")
    group = DataGroup(20, mixture, loader_arrays=ARRAYS, seed=3, shuffle_later="shardwise", shard_window=2)
    seen = {0: [], 1: [], 2: []}
    with Dataloader(load_sample, group, loader_count=2, end_at=("epoch", 3), timeout_sec=slack_int(60)) as loader:
        for batch in loader:
            values = np.asarray(batch.arrays["value"])
            for source, value in zip(batch.sources.tolist(), values.tolist()):
                seen[source].append(value)
            web_shards = {v // 1000 for v, s in zip(values.tolist(), batch.sources.tolist()) if s == 0}
            assert len(web_shards) <= 3  # 12 web items a batch, from one window of 2 shards (or where two meet)
            del batch
    # 3 epochs of 400: 720 web items (600 = one whole pass, then 120 of the next), 360 curated
    # (3 whole passes and 60), 120 of the plain list (3 whole passes)
    web_values = sorted(seen[0][:600])
    assert web_values == sorted(s * 1000 + i for s in range(20) for i in range(30))
    assert sorted(seen[1][:300]) == sorted([s * 1000 + i for s in range(4) for i in range(25)] * 3)
    assert sorted(seen[2]) == sorted([-v for v in range(1, 41)] * 3)


@pytest.mark.slow
def test_remote_shards_in_a_mixture_are_read_ahead(http_store, tmp_path):
    base, folder = http_store
    write_shards(folder, "r", [16] * 6)
    remote = ShardSet(f"{base}/r-{{00..05}}.tar", cache_dir=str(tmp_path / "cache"))
    mixture = Mixture([remote, list(range(1, 33))], weights=[3, 1], epoch_size=96)
    assert mixture.prefetch_items == int(remote.prefetch_items / 0.75)
    local = ShardSet(write_shards(tmp_path, "l", [8, 8]))  # reads nothing ahead: it does not limit the look-ahead
    assert Mixture([local, remote], weights=[1, 1]).prefetch_items == int(remote.prefetch_items / 0.5)
    assert Mixture([local, [1, 2]], weights=[1, 1]).prefetch_items == 0
    group = DataGroup(8, mixture, loader_arrays=ARRAYS, seed=1)
    values = []
    with Dataloader(load_sample, group, loader_count=2, end_at=("epoch", 2), timeout_sec=slack_int(60)) as loader:
        for batch in loader:
            values.extend(np.asarray(batch.arrays["value"]).tolist())
            del batch
    # the announcements reached the remote ShardSet: it fetched, or found the chunks set-up kept
    assert remote.readahead_stats["requests"] + remote.readahead_stats["reused"] > 0
    remote_values = [v for v in values if v >= 0]
    # 2 epochs of 72 remote items: one whole pass of the 96 samples, and 48 of the next pass
    times = np.unique(remote_values, return_counts=True)
    assert len(remote_values) == 144 and times[0].tolist() == sorted(s * 1000 + i for s in range(6) for i in range(16))
    assert (times[1] == 2).sum() == 48 and times[1].max() == 2

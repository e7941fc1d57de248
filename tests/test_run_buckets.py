"""hydrax.bucket_groups over real shards: 20,000 JPEGs in 12 aspect ratios, each epoch delivering
every bucketed sample once, buckets progressing together, exact resume with other loader and host
counts, and slots of each bucket's shape filled by decode_into."""

from __future__ import annotations

import io

import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image
from support.timing import slack_int

import hydrax
from hydrax import Dataloader
from hydrax.image import decode_into, image_sizes, plan_buckets
from hydrax.shards import ShardSet
from hydrax.shards.subset import Subset
from hydrax.shards.writer import ShardWriter

ASPECTS = [(9, 16), (2, 3), (3, 4), (4, 5), (1, 1), (5, 4), (4, 3), (3, 2), (16, 10), (16, 9), (2, 1), (21, 9)]
WEIGHTS = np.array([6, 10, 12, 5, 20, 5, 16, 12, 4, 6, 2, 2], float)
SAMPLES = 20_000
KEY = {"key": ((), np.int64, jnp.int64)}


def sizes_of(shards: ShardSet) -> tuple[np.ndarray, np.ndarray]:
    """The samples' image sizes (the shards' indexes do not record them: read from the headers)."""
    return shards.image_sizes("jpg")


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """20 shards of 1,000 small JPEGs in 12 aspects at 3 scales each; each key's number is its index."""
    folder = tmp_path_factory.mktemp("buckets")
    rng = np.random.default_rng(0)
    encoded = {}
    with ShardWriter(str(folder / "photos-%02d.tar"), maxcount=1000) as sink:
        for i in range(SAMPLES):
            aspect = ASPECTS[rng.choice(len(ASPECTS), p=WEIGHTS / WEIGHTS.sum())]
            scale = int(rng.integers(4, 7))
            size = (aspect[0] * scale, aspect[1] * scale)
            if size not in encoded:
                buffer = io.BytesIO()
                Image.new("RGB", size, (i % 256, 90, 200)).save(buffer, "JPEG", quality=80)
                encoded[size] = buffer.getvalue()
            sink.write({"__key__": f"{i:06d}", "jpg": encoded[size]})
    return f"{folder}/photos-{{00..19}}.tar"


def load_key(sample, arrays, seed):
    arrays["key"][...] = int(sample["__key__"])


def groups_for(shards, **options):
    widths, heights = sizes_of(shards)
    plan = plan_buckets(widths, heights, resolutions=[(a * 8, b * 8) for a, b in ASPECTS], batch_size=20,
                        multiple_of=2)
    return plan, hydrax.bucket_groups(plan, shards, lambda height, width: KEY, seed=11, **options)


def run(groups, **kwargs):
    """Every batch: (epoch, epoch_batch, group's batch_size, the items' keys)."""
    kwargs.setdefault("end_at", ("epoch", 2))
    kwargs.setdefault("loader_count", 2)
    out = []
    with Dataloader(load_key, groups, timeout_sec=slack_int(120), **kwargs) as loader:
        for batch in loader:
            out.append((batch.epoch, batch.epoch_batch, len(batch.indices), np.asarray(batch.arrays["key"]).tolist()))
            del batch
    return out


@pytest.mark.slow
@pytest.mark.parametrize("order", ["itemwise", "shardwise"])
def test_each_epoch_delivers_every_bucketed_sample_once_and_buckets_progress_together(photos, order):
    shards = ShardSet(photos)
    options = {"shuffle_later": order, "shard_window": 2} if order == "shardwise" else {"permutation": "lazy"}
    plan, groups = groups_for(shards, **options)
    assert len(groups) >= 10 and sum(len(g) for g in groups) == SAMPLES
    bucket_of = {int(k): b for b, bucket in enumerate(plan.buckets) for k in bucket.items}
    batches = run(groups, end_at=("epoch", 2))
    for epoch in (0, 1):
        keys = [k for e, _, _, ks in batches if e == epoch for k in ks]
        assert len(keys) == len(set(keys)) == SAMPLES - plan.left_out_per_epoch
        # every batch is one bucket's
        for e, _, _, ks in batches:
            if e == epoch:
                assert len({bucket_of[k] for k in ks}) == 1
        # consumed shares stay within one batch of each other at every step
        done = np.zeros(len(plan.buckets))
        counts = np.array([b.batch_count for b in plan.buckets], float)
        for e, _, _, ks in batches:
            if e != epoch:
                continue
            done[bucket_of[ks[0]]] += 1
            shares = done / counts
            assert all(shares[b] - shares.min() <= 1 / counts[b] + 1e-12 for b in range(len(counts)))


@pytest.mark.slow
def test_resume_is_exact_at_ten_stop_points_with_other_loader_and_host_counts(photos):
    shards = ShardSet(photos)
    _, groups = groups_for(shards, shuffle_later="shardwise")
    reference = run(groups, loader_count=1)
    total = len(reference)
    stops = np.linspace(1, total - 3, 10).astype(int)
    for n, stop in enumerate(stops.tolist()):
        epoch, batch = reference[stop][:2]
        end = ("batch", stop + 3) if n % 2 else ("epoch", 2)
        resumed = run(groups, loader_count=3, start_at=(epoch, batch), end_at=end)
        assert resumed == reference[stop:stop + len(resumed)] and len(resumed) >= 3
        halves = [run(groups, loader_count=1, start_at=(epoch, batch), end_at=("batch", stop + 3),
                      process_index=p, process_count=2) for p in range(2)]
        joined = [a[3] + b[3] for a, b in zip(*halves)]
        assert joined == [b[3] for b in reference[stop:stop + 3]]


def test_a_subset_keeps_the_parents_shards_and_refuses_bad_items(photos):
    shards = ShardSet(photos)
    items = np.arange(500, 3500, 3)
    subset = Subset(shards, items)
    assert len(subset) == len(items) and subset[7]["__key__"] == f"{items[7]:06d}"
    assert [s["__key__"] for s in subset[:2]] == ["000500", "000503"]
    # shard s holds keys 1000 s .. 1000 s + 999; shards without any of the items are not the subset's
    assert subset.shard_sizes() == [int(n) for n in np.bincount(items // 1000) if n] == [167, 333, 334, 166]
    assert subset.prefetch_items == 0  # local shards: nothing to read ahead
    with pytest.raises(ValueError, match="increasing"):
        Subset(shards, [5, 3])
    with pytest.raises(ValueError, match="indices of the source's 20000 items"):
        Subset(shards, [19_999, 20_000])
    with pytest.raises(ValueError, match="has no shards"):
        Subset(list(range(10)), [1, 2]).shard_sizes()


def test_each_bucket_fills_slots_of_its_own_shape(photos):
    shards = ShardSet(photos)
    widths, heights = sizes_of(shards)
    plan = plan_buckets(widths, heights, resolutions=[(64, 64), (96, 64), (64, 96)], batch_size=50)
    groups = hydrax.bucket_groups(plan, shards, lambda h, w: {"image": ((h, w, 3), np.uint8, jnp.uint8),
                                                              "key": ((), np.int64, jnp.int64)})

    def load(sample, arrays, seed):
        decode_into(sample["jpg"], arrays["image"])
        arrays["key"][...] = int(sample["__key__"])

    seen = {}
    with Dataloader(load, groups, loader_count=2, end_at=("batch", 30), timeout_sec=slack_int(120)) as loader:
        for batch in loader:
            image = np.asarray(batch.arrays["image"])
            keys = np.asarray(batch.arrays["key"]).tolist()
            seen[image.shape[1:3]] = seen.get(image.shape[1:3], 0) + 1
            bucket = plan.buckets[int(plan.assignment[keys[0]])]
            assert image.shape == (50, bucket.height, bucket.width, 3)
            assert (image[:, :, :, 1].astype(int) - 90 <= 3).all()  # the green the photos were made with
            del batch
    assert set(seen) == {(64, 64), (64, 96), (96, 64)}


def test_a_plan_of_other_data_is_refused(photos):
    shards = ShardSet(photos)
    plan = plan_buckets([64] * 10, [64] * 10, resolutions=[(64, 64)], batch_size=2)
    with pytest.raises(ValueError, match="made from 10 images' sizes, but data holds 20000"):
        hydrax.bucket_groups(plan, shards, lambda h, w: KEY)
    with pytest.raises(TypeError, match="batch_size"):
        hydrax.bucket_groups(plan, list(range(10)), lambda h, w: KEY, batch_size=4)


@pytest.mark.slow
def test_buckets_of_remote_shards_are_read_ahead_through_their_shared_set(http_store, tmp_path):
    base, folder = http_store
    rng = np.random.default_rng(1)
    with ShardWriter(str(folder / "r-%02d.tar"), maxcount=100) as sink:
        for i in range(600):
            aspect = ASPECTS[i % 4 * 3]  # 4 aspects
            buffer = io.BytesIO()
            Image.new("RGB", (aspect[0] * 5, aspect[1] * 5), (int(rng.integers(0, 256)), 90, 9)).save(buffer, "JPEG")
            sink.write({"__key__": f"{i:06d}", "jpg": buffer.getvalue()})
    remote = ShardSet(f"{base}/r-{{00..05}}.tar", cache_dir=str(tmp_path / "cache"))
    found = image_sizes([bytes(sample["jpg"]) for sample in remote])
    plan = plan_buckets(found.widths, found.heights, resolutions=[(a * 8, b * 8) for a, b in ASPECTS], batch_size=10)
    assert len(plan.buckets) == 4 and plan.left_out_per_epoch == 0
    groups = hydrax.bucket_groups(plan, remote, lambda h, w: KEY, shuffle_later="shardwise")
    assert all(group.data.prefetch_items == remote.prefetch_items > 0 for group in groups)
    batches = run(groups, end_at=("epoch", 2))
    for epoch in (0, 1):
        assert sorted(k for e, _, _, ks in batches if e == epoch for k in ks) == list(range(600))
    stats = remote.readahead_stats
    assert stats["requests"] + stats["reused"] > 0  # the buckets' announcements reached the one set

"""hydrax.image.buckets: resolutions, nearest-aspect assignment against a plain reference, merging,
batch sizes, remainders, the summary, and the same plan in another process."""

from __future__ import annotations

import hashlib
import math
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest

from hydrax.image import bucket_resolutions, plan_buckets
from hydrax.image.buckets import nearest_bucket

#: 12 aspect ratios of photos (width, height), and how often each comes (the last ones rare)
ASPECTS = [(9, 16), (2, 3), (3, 4), (4, 5), (1, 1), (5, 4), (4, 3), (3, 2), (16, 10), (16, 9), (2, 1), (21, 9)]
WEIGHTS = np.array([6, 10, 12, 5, 20, 5, 16, 12, 4, 6, 2, 2], float)


def synthetic_sizes(count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Photo sizes in 12 aspects (with a few pixels of jitter, as real crops have) at many scales."""
    rng = np.random.default_rng(seed)
    kinds = rng.choice(len(ASPECTS), count, p=WEIGHTS / WEIGHTS.sum())
    scale = rng.integers(20, 200, count)
    widths = np.array([ASPECTS[k][0] for k in kinds]) * scale + rng.integers(-3, 4, count)
    heights = np.array([ASPECTS[k][1] for k in kinds]) * scale + rng.integers(-3, 4, count)
    return np.maximum(widths, 1), np.maximum(heights, 1)


def reference_nearest(width: int, height: int, shapes) -> int:
    """Plainly: the bucket whose aspect is the fewest times off the image's (exact fractions), first wins."""
    aspect = Fraction(width, height)
    best, best_index = None, -1
    for i, (w, h) in enumerate(shapes):
        ratio = aspect / Fraction(w, h)
        off = max(ratio, 1 / ratio)
        if best is None or off < best:
            best, best_index = off, i
    return best_index


def test_resolutions_fit_the_budget_on_the_step_and_come_in_both_orientations():
    shapes = bucket_resolutions(1024 * 1024, 64)
    for width, height in shapes:
        assert width * height <= 1024 * 1024 and width % 64 == 0 and height % 64 == 0
        assert max(width, height) <= 4 * min(width, height)
        assert (height, width) in shapes
        # the largest height for the width (or width for the height) on the step
        assert (height + 64) * width > 1024 * 1024 or (width + 64) * height > 1024 * 1024
    for known in [(1024, 1024), (1152, 896), (1216, 832), (1344, 768), (1536, 640), (896, 1152)]:
        assert known in shapes  # SDXL's list
    aspects = [w / h for w, h in shapes]
    assert aspects == sorted(aspects) and len(set(aspects)) == len(aspects)
    assert bucket_resolutions(512 * 512, 64, max_ratio=1.0) == [(512, 512)]


def test_every_image_goes_to_the_bucket_of_nearest_aspect_as_a_plain_reference_says():
    widths, heights = synthetic_sizes(20_000)
    shapes = bucket_resolutions(512 * 512, 32)
    found = nearest_bucket(widths, heights, shapes)
    # the reference per distinct size (exact fractions are slow)
    for w, h in set(zip(widths.tolist(), heights.tolist())):
        expected = reference_nearest(w, h, shapes)
        assert found[(widths == w) & (heights == h)].tolist()[0] == expected, (w, h)


def test_an_image_exactly_between_two_buckets_goes_to_the_narrower():
    shapes = [(100, 400), (400, 100)]  # aspects 1/4 and 4: the geometric mean is 1
    assert nearest_bucket(np.array([500, 499, 501]), np.array([500, 500, 500]), shapes).tolist() == [0, 0, 1]
    shapes = [(200, 100), (800, 100)]  # 2 and 8: exactly 4 between
    assert nearest_bucket(np.array([400, 4001]), np.array([100, 1000]), shapes).tolist() == [0, 1]


def test_a_plan_puts_every_sized_image_in_one_bucket_and_reports_it():
    widths, heights = synthetic_sizes(20_000)
    widths[[5, 77]] = 0  # unreadable
    plan = plan_buckets(widths, heights, pixels=256 * 256, step=32, batch_size=16, remainder="drop")
    assert plan.unsized == 2 and plan.assignment[[5, 77]].tolist() == [-1, -1]
    assert (plan.assignment == plan.nearest).all()
    kept = [(b.width, b.height) for b in plan.buckets]
    for w, h in set(zip(widths.tolist(), heights.tolist())) - {(0, heights[5]), (0, heights[77])}:
        if w:
            assert plan.nearest[(widths == w) & (heights == h)][0] == reference_nearest(w, h, kept)
    members = np.concatenate([b.items for b in plan.buckets])
    assert len(members) == 20_000 - 2 and len(np.unique(members)) == len(members)
    for i, bucket in enumerate(plan.buckets):
        assert (plan.assignment[bucket.items] == i).all() and (np.diff(bucket.items) > 0).all()
        assert len(bucket.items) >= bucket.batch_size
    summary = plan.summary()
    assert f"{len(plan.buckets)} buckets, 19,998 images" in summary and "2 images without a size" in summary
    assert f"{plan.buckets[0].width}x{plan.buckets[0].height}" in summary


def test_buckets_too_small_for_a_batch_are_merged_into_the_nearest_left_and_reported():
    widths, heights = synthetic_sizes(4_000)
    plan = plan_buckets(widths, heights, pixels=256 * 256, step=32, batch_size=64, min_batches=2, remainder="drop")
    assert plan.merges, "the rare aspects must be merged at this batch size"
    kept = [(b.width, b.height) for b in plan.buckets]
    for bucket in plan.buckets:
        assert len(bucket.items) >= 2 * 64
    for (w, h), count, went in plan.merges:
        assert (w, h) not in kept and count < 2 * 64 and sum(n for _, n in went) == count
    # after merging, each image is in the nearest bucket of those left
    for w, h in set(zip(widths.tolist(), heights.tolist())):
        assert plan.nearest[(widths == w) & (heights == h)][0] == reference_nearest(w, h, kept)
    summary = plan.summary()
    first = plan.merges[0]
    assert f"merged {first[0][0]}x{first[0][1]} ({first[1]:,d} images" in summary
    assert sum(len(b.merged) for b in plan.buckets) >= len(plan.merges)


def test_spilled_remainders_make_whole_batches_and_move_only_to_a_neighbour():
    widths, heights = synthetic_sizes(20_000, seed=3)
    plan = plan_buckets(widths, heights, resolutions=[(w * 32, h * 32) for w, h in ASPECTS], batch_size=24)
    counts = [len(b.items) for b in plan.buckets]
    centre = int(np.argmax([b.nearest for b in plan.buckets]))
    for i, bucket in enumerate(plan.buckets):
        assert len(bucket.items) % bucket.batch_size == 0 or i == centre
    assert plan.left_out_per_epoch == counts[centre] % 24 < 24
    moved = plan.assignment != plan.nearest
    assert (np.abs(plan.assignment[moved] - plan.nearest[moved]) == 1).all()
    assert sum(b.moved_out for b in plan.buckets) == int(moved.sum()) == sum(b.moved_in for b in plan.buckets)
    # each bucket passes on fewer than a batch of its own, and the images nearest the neighbour go
    for i, bucket in enumerate(plan.buckets):
        assert bucket.moved_out < bucket.batch_size
        gone = np.flatnonzero((plan.nearest == i) & moved)
        stayed = np.flatnonzero((plan.nearest == i) & ~moved)
        if len(gone):
            aspect = widths / heights
            if i < centre:
                assert aspect[gone].min() >= aspect[stayed].max()
            else:
                assert aspect[gone].max() <= aspect[stayed].min()
    assert sum(counts) == 20_000


def test_batch_sizes_keep_the_pixels_of_a_batch_within_the_budget():
    widths, heights = synthetic_sizes(20_000)
    plan = plan_buckets(widths, heights, resolutions=[(256, 256), (384, 256), (512, 128), (128, 512)],
                        pixels_per_batch=64 * 256 * 256, multiple_of=8)
    for bucket in plan.buckets:
        assert bucket.batch_size % 8 == 0 and bucket.batch_size * bucket.width * bucket.height <= 64 * 256 * 256
        assert (bucket.batch_size + 8) * bucket.width * bucket.height > 64 * 256 * 256
    assert {b.batch_size for b in plan.buckets} == {64, 40}


def test_the_same_sizes_give_the_same_plan_in_another_process():
    widths, heights = synthetic_sizes(20_000, seed=5)
    plan = plan_buckets(widths, heights, pixels=512 * 512, step=64, pixels_per_batch=16 * 512 * 512, multiple_of=4)
    digest = hashlib.sha256(plan.assignment.tobytes() + plan.summary().encode()).hexdigest()
    code = ("import hashlib, sys; sys.path.insert(0, 'tests'); from test_image_buckets import synthetic_sizes; "
            "from hydrax.image import plan_buckets; w, h = synthetic_sizes(20_000, seed=5); "
            "p = plan_buckets(w, h, pixels=512 * 512, step=64, pixels_per_batch=16 * 512 * 512, multiple_of=4); "
            "print(hashlib.sha256(p.assignment.tobytes() + p.summary().encode()).hexdigest())")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert other.stdout.strip() == digest


@pytest.mark.parametrize("kwargs, message", [
    ({"pixels": 1 << 16, "resolutions": [(256, 256)], "batch_size": 4}, "either resolutions"),
    ({"batch_size": 4}, "either resolutions"),
    ({"pixels": 1 << 16}, "either batch_size"),
    ({"pixels": 1 << 16, "batch_size": 4, "pixels_per_batch": 1 << 20}, "either batch_size"),
    ({"pixels": 1 << 16, "batch_size": 6, "multiple_of": 4}, "multiple of multiple_of=4"),
    ({"pixels": 1 << 16, "batch_size": 4, "remainder": "pad"}, "remainder must be"),
    ({"pixels": 1 << 16, "batch_size": 4, "min_batches": 0}, "min_batches"),
    ({"resolutions": [(256, 128), (512, 256)], "batch_size": 4}, "same aspect ratio"),
    ({"resolutions": [(0, 256)], "batch_size": 4}, "pixels a side"),
    ({"resolutions": ["big"], "batch_size": 4}, "(width, height) pairs"),
    ({"pixels": 1 << 16, "step": 0, "batch_size": 4}, "step must be"),
    ({"pixels": 1 << 16, "batch_size": 100_000}, "too few for 1 batch"),
])
def test_bad_arguments_are_refused_naming_them(kwargs, message):
    widths, heights = synthetic_sizes(1_000)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan_buckets(widths, heights, **kwargs)


def test_bad_sizes_are_refused_naming_the_image():
    with pytest.raises(ValueError, match=r"widths\[1\] is -4: a size is a number of pixels"):
        plan_buckets([10, -4], [10, 10], pixels=1 << 16, batch_size=1)
    with pytest.raises(ValueError, match="one length"):
        plan_buckets([10, 4], [10], pixels=1 << 16, batch_size=1)
    with pytest.raises(ValueError, match="integers"):
        plan_buckets([10.5], [10.0], pixels=1 << 16, batch_size=1)


def test_images_larger_than_a_jpeg_go_to_the_bucket_of_their_aspect():
    widths = np.array([100_000, 2**31 - 1, 70_000, 64], np.int32)
    heights = np.array([50_000, 2**30, 140_000, 64], np.int32)
    shapes = [(512, 1024), (1024, 1024), (1024, 512)]
    plan = plan_buckets(widths, heights, resolutions=shapes, batch_size=1, remainder="drop")
    assert plan.assignment.tolist() == [2, 2, 0, 1]
    assert [reference_nearest(int(w), int(h), shapes) for w, h in zip(widths, heights)] == [2, 2, 0, 1]


def test_a_million_images_plan_in_seconds():
    widths, heights = synthetic_sizes(1_000_000, seed=9)
    plan = plan_buckets(widths, heights, pixels=1024 * 1024, step=64, batch_size=32)
    assert plan.images == 1_000_000 and math.isclose(sum(b.nearest for b in plan.buckets), 1_000_000)

"""decode_into's Inception-style random resized crop: the box (hydrax.image.boxes) against the
algorithm torchvision documents, and the slot on each decoding path against Pillow."""

import io
import math
import random

import numpy as np
import pytest

Image = pytest.importorskip("PIL.Image")

from hydrax.image import Coefs, decode_into, jpeg, random_resized_box  # noqa: E402
from hydrax.image.boxes import centre_box  # noqa: E402
from hydrax.image.decode import _scaled_box, flips  # noqa: E402

SEEDS = 100_000
# torchvision itself is no test dependency (torch's wheels are large, and its CPU index is not
# among the registries CI reaches): the reference is the algorithm as its documentation gives it.


def reference_box(width, height, rng: random.Random, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """The algorithm as torchvision's documentation words it, with Python's own generator."""
    area = width * height
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1])))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            top, left = rng.randint(0, height - h), rng.randint(0, width - w)
            return left, top, left + w, top + h
    if width / height < min(ratio):
        w, h = width, round(width / min(ratio))
    elif width / height > max(ratio):
        w, h = round(height * max(ratio)), height
    else:
        w, h = width, height
    left, top = (width - w) // 2, (height - h) // 2
    return left, top, left + w, top + h


def _moments(boxes, width, height):
    boxes = np.asarray(boxes, np.float64)
    w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    return (w * h).mean() / (width * height), (w / h).mean()


@pytest.mark.parametrize(("width", "height", "count"), [(500, 375, SEEDS), (180, 640, SEEDS // 5)])
def test_the_box_distribution_is_the_documented_algorithms(width, height, count):
    ours = [random_resized_box(width, height, seed) for seed in range(count)]
    rng = random.Random(1234)
    theirs = [reference_box(width, height, rng) for _ in range(count)]
    (area, aspect), (ref_area, ref_aspect) = _moments(ours, width, height), _moments(theirs, width, height)
    tolerance = 0.01 if count == SEEDS else 0.02
    assert abs(area / ref_area - 1) < tolerance, (area, ref_area)
    assert abs(aspect / ref_aspect - 1) < tolerance, (aspect, ref_aspect)


@pytest.mark.parametrize(("width", "height"), [(500, 375), (1, 1), (1, 300), (300, 1), (2, 3), (4000, 37), (640, 640)])
def test_the_box_lies_inside_the_image_and_replays_from_its_seed(width, height):
    boxes = set()
    for seed in range(2000):
        box = random_resized_box(width, height, seed)
        left, top, right, bottom = box
        assert all(isinstance(v, int) for v in box)
        assert 0 <= left < right <= width and 0 <= top < bottom <= height, (seed, box)
        assert random_resized_box(width, height, seed) == box
        boxes.add(box)
    if min(width, height) >= 30 and 0.5 < width / height < 2:
        assert len(boxes) > 1000  # seeds give different boxes (elsewhere no draw fits: the centred fallback)
    assert random_resized_box(width, height, 2**70 + 5) == random_resized_box(width, height, 2**70 + 5)


def test_the_kernel_draws_the_boxes_of_its_readable_twin():
    """_core.random_resized_draws against hydrax._fallback.random_resized_draws, draw for draw:
    10^5 boxes over image sizes, seeds (negative, past 64 bits), scales and ratios, edges included;
    random_resized_box takes the centred box where no draw fits."""
    from hydrax import _core, _fallback
    from hydrax.image.boxes import TRIES

    rng = random.Random(41)
    sizes = [(500, 375), (1600, 1200), (1, 1), (3, 1000), (1000, 3), (2**31 - 1, 7)]
    fallbacks = 0
    for n in range(SEEDS):
        width, height = sizes[n % len(sizes)] if n % 2 else (rng.randint(1, 5000), rng.randint(1, 5000))
        seed = rng.choice([rng.getrandbits(64), n, -rng.getrandbits(40), rng.getrandbits(80)]) & (2**64 - 1)
        scale = rng.choice([(0.08, 1.0), (0.5, 0.5), (1.0, 1.0), (0.01, 3.0), (rng.uniform(0.01, 1), 1.0), (2.0, 3.0)])
        ratio = rng.choice([(3 / 4, 4 / 3), (1.0, 1.0), (0.1, 10.0), (2.0, 5.0)])
        drawn = _core.random_resized_draws(seed, 4, TRIES, width, height, *scale, *ratio)
        assert drawn == _fallback.random_resized_draws(seed, 4, TRIES, width, height, *scale, *ratio), (
            width, height, seed, scale, ratio)
        fallbacks += drawn is None
        assert random_resized_box(width, height, seed, scale, ratio) == (
            centre_box(width, height, *ratio) if drawn is None else drawn)
    assert fallbacks > 1000  # the ranges above make every draw miss often enough to test the fallback
    with pytest.raises(ValueError, match="2\\*\\*31"):
        random_resized_box(2**31, 10, 1)
    with pytest.raises(OverflowError):  # an area past a double's range rounds to infinity, as in Python
        random_resized_box(2**31 - 1, 2**31 - 1, 1, scale=(1e300, 1e300))
    with pytest.raises(OverflowError):
        _fallback.random_resized_draws(1, 4, TRIES, 2**31 - 1, 2**31 - 1, 1e300, 1e300, 3 / 4, 4 / 3)


def test_the_fallback_is_the_centred_box_of_the_clamped_aspect():
    # an area over the image's never fits: every draw fails and the fallback decides
    assert random_resized_box(500, 375, 7, scale=(2.0, 3.0)) == (0, 0, 500, 375)  # 4:3 is inside the range
    assert random_resized_box(1000, 100, 7, scale=(2.0, 3.0)) == (433, 0, 566, 100)  # 10:1 clamped to 4:3
    assert random_resized_box(100, 1000, 7, scale=(2.0, 3.0)) == (0, 433, 100, 566)  # 1:10 clamped to 3:4
    assert random_resized_box(100, 1000, 7, scale=(2.0, 3.0), ratio=(0.5, 0.5)) == (0, 400, 100, 600)
    assert centre_box(1, 1000, 2.0, 3.0) == (0, 499, 1, 500)


def test_arguments_are_checked_and_named():
    for bad in [(0.5, 0.1), (0, 1), (-1, 1), (float("nan"), 1), (0.1, float("inf")), 0.5, (1, 2, 3), ("a", 1), (True, 1)]:
        with pytest.raises(ValueError, match="^scale"):
            random_resized_box(100, 100, 1, scale=bad)
        with pytest.raises(ValueError, match="^ratio"):
            random_resized_box(100, 100, 1, ratio=bad)
    out = np.zeros((8, 8, 3), np.uint8)
    data = _jpeg(64, 48)
    with pytest.raises(ValueError, match="scale"):
        decode_into(data, out, crop="random_resized", seed=1, scale=(1.0, 0.5))
    with pytest.raises(ValueError, match="ratio"):
        decode_into(data, out, crop="random_resized", seed=1, ratio=(0, 1))
    with pytest.raises(ValueError, match="scale is for crop='random_resized'"):
        decode_into(data, out, crop="random", seed=1, scale=(0.5, 1.0))
    with pytest.raises(ValueError, match="ratio is for crop='random_resized'"):
        decode_into(data, out, ratio=(0.5, 1.0))
    with pytest.raises(ValueError, match="seed"):
        decode_into(data, out, crop="random_resized")
    with pytest.raises(ValueError, match="size"):
        decode_into(data, out, crop="random_resized", seed=1, size=64)
    with pytest.raises(ValueError, match="random_resized"):
        decode_into(data, out, crop="resized")


def _jpeg(width, height, *, orientation=1, low=0, high=256, **options) -> bytes:
    """A photo-like JPEG: smooth colour at a coarse scale, colours in ``low``..``high``."""
    rng = np.random.default_rng(width * 7 + height)
    coarse = rng.integers(low, high, (height // 20 + 2, width // 20 + 2, 3), np.uint8)
    image = Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC)
    if orientation != 1:
        exif = Image.Exif()
        exif[0x0112] = orientation
        options["exif"] = exif.tobytes()
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=90, **options)
    return buffer.getvalue()


def _pillow_box(data: bytes, out_shape, seed, **options) -> np.ndarray:
    """Pillow alone: the full-size image, upright, its random resized box resized (bilinear)."""
    from PIL import ImageOps

    image = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")
    box = random_resized_box(image.width, image.height, seed, **options)
    return np.asarray(image.resize((out_shape[1], out_shape[0]), Image.Resampling.BILINEAR, box=box))


@pytest.mark.parametrize("fmt", ["PNG", "WEBP"])
def test_pillows_path_resizes_the_same_box(fmt):
    rng = np.random.default_rng(3)
    pixels = np.asarray(Image.fromarray(rng.integers(0, 256, (20, 26, 3), np.uint8)).resize((260, 200), Image.Resampling.BICUBIC))
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, fmt, **({"lossless": True} if fmt == "WEBP" else {}))
    out = np.zeros((96, 128, 3), np.uint8)
    for seed in range(20):
        decode_into(buffer.getvalue(), out, crop="random_resized", seed=seed, scale=(0.2, 0.9), ratio=(0.5, 2.0))
        expected = _pillow_box(buffer.getvalue(), out.shape, seed, scale=(0.2, 0.9), ratio=(0.5, 2.0))
        assert np.abs(out.astype(int) - expected).max() <= 1, seed


@pytest.mark.parametrize(("width", "height", "orientation"), [(500, 375, 1), (375, 500, 6), (333, 251, 3), (640, 480, 8)])
def test_jpegs_without_dct_scaling_match_pillow_resizing_the_box(width, height, orientation):
    """Pillow's path (a file object) is Image.resize of the box within 1 level; the fast path (bytes:
    planes where upright, RGB where turned) is within rounding of it (1 level but for 0.2% of values)."""
    data = _jpeg(width, height, orientation=orientation, low=40, high=216)
    out, pillows = np.zeros((224, 224, 3), np.uint8), np.zeros((224, 224, 3), np.uint8)
    diffs = []
    for seed in range(30):
        left, top, right, bottom = random_resized_box(*((height, width) if orientation in (6, 8) else (width, height)), seed)
        if right - left >= 2 * 224 and bottom - top >= 2 * 224:
            continue  # DCT-scaled: see below
        decode_into(data, out, crop="random_resized", seed=seed)
        decode_into(io.BytesIO(data), pillows, crop="random_resized", seed=seed)
        assert np.abs(pillows.astype(int) - _pillow_box(data, out.shape, seed)).max() <= 1, seed
        diffs.append(np.abs(out.astype(int) - pillows))
    diff = np.stack(diffs)
    if orientation != 1:  # decoded to RGB: Pillow's arithmetic to the bit
        assert diff.max() == 0
    assert diff.max() <= 2 and (diff > 1).mean() < 0.002 and diff.mean() < 0.5, (diff.max(), (diff > 1).mean(), diff.mean())


@pytest.mark.parametrize(("width", "height", "orientation"), [(1600, 1200, 1), (1601, 1203, 3), (1203, 1601, 6), (1203, 1601, 7)])
def test_dct_scaled_jpegs_fill_the_slot_as_pillows_path(width, height, orientation):
    """Boxes at least twice the slot decode at 1/2, 1/4 or 1/8 on both paths, with the box scaled
    alike: the fast path is Pillow's path to the bit, and both near Pillow's full-size resize."""
    data = _jpeg(width, height, orientation=orientation)
    out, pillows = np.zeros((224, 224, 3), np.uint8), np.zeros((224, 224, 3), np.uint8)
    for seed in range(12):
        decode_into(data, out, crop="random_resized", seed=seed)
        decode_into(io.BytesIO(data), pillows, crop="random_resized", seed=seed)
        np.testing.assert_array_equal(out, pillows, err_msg=str(seed))
        assert np.abs(out.astype(int) - _pillow_box(data, out.shape, seed)).mean() < 1.5, seed


def test_the_box_scales_with_the_dct_factor_from_the_far_edge_of_a_mirrored_axis():
    assert _scaled_box((0, 0, 800, 600), 1, 1601, 1203, 3) == (0.0, 0.0, 800.0, 600.0)
    assert _scaled_box((8, 16, 808, 616), 8, 1601, 1203, 1) == (1.0, 2.0, 101.0, 77.0)
    # stored 1601 wide at 1/8 is 201 wide: upright column 0 is stored column 1600, at 200.125
    left, top, right, bottom = _scaled_box((0, 0, 800, 600), 8, 1601, 1203, 3)
    assert (left, right) == (201 - 1601 / 8, 201 - 801 / 8) and (top, bottom) == (151 - 1203 / 8, 151 - 603 / 8)


def test_flip_and_float_chw_with_coefs():
    data = _jpeg(500, 375)
    plain = np.zeros((224, 224, 3), np.uint8)
    flipped = np.zeros_like(plain)
    for seed in range(8):
        decode_into(data, plain, crop="random_resized", seed=seed)
        decode_into(data, flipped, crop="random_resized", seed=seed, flip=True)
        np.testing.assert_array_equal(flipped, plain[:, ::-1] if flips(seed) else plain)
    chw = np.zeros((3, 160, 200), np.float32)
    hwc = np.zeros((160, 200, 3), np.uint8)
    decode_into(data, chw, layout="chw", crop="random_resized", seed=5, coefs=Coefs.IMAGENET_SRGB)
    decode_into(data, hwc, crop="random_resized", seed=5)
    scale, offset = Coefs.IMAGENET_SRGB.affine(3)
    expected = hwc.astype(np.float32).transpose(2, 0, 1) * np.asarray(scale)[:3, None, None] + np.asarray(offset)[:3, None, None]
    assert np.abs(chw - expected).max() <= 1.01 * float(np.max(scale)), np.abs(chw - expected).max()


@pytest.mark.parametrize("subsampling", [0, 1, 2], ids=["4:4:4", "4:2:2", "4:2:0"])
def test_the_plane_decoder_stops_below_the_box(subsampling, monkeypatch):
    """Only the iMCU rows down to the box's last are decoded, and the slot is what a full decode
    gives."""
    from hydrax.image import decode as decode_module

    data = _jpeg(500, 375, subsampling=subsampling)
    header = jpeg.read_header(memoryview(data))
    full = [plane.copy() for plane in jpeg.decode_planes(memoryview(data), header)]
    top = jpeg.decode_planes(memoryview(data), header, stop=100)
    rows = 16 if subsampling == 2 else 8
    for plane, whole, down in zip(top, full, (1, 1 + (subsampling == 2), 1 + (subsampling == 2))):
        kept = -(-100 // rows) * rows // down  # whole iMCU rows
        np.testing.assert_array_equal(plane[:kept], whole[:kept])
    stops = []
    original = decode_module.plane_rows_read
    monkeypatch.setattr(decode_module, "REGION_SHARE", 0.0)  # every box through the plane path
    monkeypatch.setattr(decode_module, "plane_rows_read", lambda *a: stops.append(original(*a)) or stops[-1])
    early, whole = np.zeros((224, 224, 3), np.uint8), np.zeros((224, 224, 3), np.uint8)
    for seed in range(40):
        box = random_resized_box(500, 375, seed)
        decode_into(data, early, crop="random_resized", seed=seed)
        monkeypatch.setattr(decode_module, "plane_rows_read", lambda *a: 375)
        decode_into(data, whole, crop="random_resized", seed=seed)
        monkeypatch.setattr(decode_module, "plane_rows_read", lambda *a: stops.append(original(*a)) or stops[-1])
        np.testing.assert_array_equal(early, whole, err_msg=str(seed))
        assert box[3] <= stops[-1] <= min(375, box[3] + 4), (box, stops[-1])
    assert min(stops) < 300  # some boxes end well above the bottom


@pytest.mark.parametrize(("subsampling", "progressive"), [(0, False), (1, False), (2, False), (2, True)],
                         ids=["4:4:4", "4:2:2", "4:2:0", "4:2:0 progressive"])
def test_the_plane_decoder_leaves_the_rows_above_the_box_untransformed(subsampling, progressive, monkeypatch):
    """The iMCU rows above the box's first are read through but not transformed: their rows keep
    what the buffer held, the rows from there on are a full decode's, and the slot is what
    transforming every row gives, for boxes anywhere."""
    from hydrax.image import decode as decode_module

    data = _jpeg(500, 375, subsampling=subsampling, progressive=progressive)
    header = jpeg.read_header(memoryview(data))
    full = [plane.copy() for plane in jpeg.decode_planes(memoryview(data), header)]
    rows = 16 if subsampling == 2 else 8
    down = 2 if subsampling == 2 else 1
    jpeg._buffer(1)[:] = 0x5A  # the thread's buffer, poisoned: rows left untransformed keep this
    part = jpeg.decode_planes(memoryview(data), header, stop=300, start=150)
    first = 150 // rows * rows
    for plane, whole, factor in zip(part, full, (1, down, down)):
        np.testing.assert_array_equal(plane[first // factor : 300 // factor], whole[first // factor : 300 // factor])
        assert (plane[: first // factor] == 0x5A).all()
    firsts = []
    original = decode_module.plane_rows_first
    monkeypatch.setattr(decode_module, "REGION_SHARE", 0.0)  # every box through the plane path
    skipped, whole = np.zeros((224, 224, 3), np.uint8), np.zeros((224, 224, 3), np.uint8)
    for seed in range(60):
        box = random_resized_box(500, 375, seed)
        monkeypatch.setattr(decode_module, "plane_rows_first", lambda *a: firsts.append(original(*a)) or firsts[-1])
        jpeg._buffer(1)[:] = 0x5A
        decode_into(data, skipped, crop="random_resized", seed=seed)
        monkeypatch.setattr(decode_module, "plane_rows_first", lambda *a: 0)
        decode_into(data, whole, crop="random_resized", seed=seed)
        np.testing.assert_array_equal(skipped, whole, err_msg=str(seed))
        assert max(0, box[1] - 4) <= firsts[-1] <= box[1], (box, firsts[-1])
    assert max(firsts) > 100  # some boxes start well below the top

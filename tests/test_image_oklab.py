"""hydrax.image colour conversions: true Oklab, and the balanced mapping bit-identical to 0.2.2.

hydrax 0.2.2 got Oklab wrong (its matrices were applied transposed) and crashed on CHW or
4-channel arrays (hydrax-api.md section 15, defect 5). These tests check the correct values
instead, and use the fixture recorded from 0.2.2 (``tools/compat/record_image_fixtures.py``)
only to pin down what 0.2.2 did and that the balanced conversions still match it exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PIL", reason="hydrax.image needs Pillow")

from hydrax import image
from hydrax.image import oklab

FIXTURE = Path(__file__).parent / "fixtures" / "image_022.npz"

# sRGB primaries in Oklab, as published (e.g. CSS Color 4 / Ottosson's reference code output).
PUBLISHED = {
    (1.0, 0.0, 0.0): (0.627955, 0.224863, 0.125846),
    (0.0, 1.0, 0.0): (0.866440, -0.233888, 0.179498),
    (0.0, 0.0, 1.0): (0.452014, -0.032457, -0.311528),
}

# The rounded inverses printed in Ottosson's post, next to M1 and M2.
PUBLISHED_M1_INV = [[4.0767416621, -3.3077115913, 0.2309699292],
                    [-1.2684380046, 2.6097574011, -0.3413193965],
                    [-0.0041960863, -0.7034186147, 1.7076147010]]
PUBLISHED_M2_INV = [[1.0, 0.3963377774, 0.2158037573],
                    [1.0, -0.1055613458, -0.0638541728],
                    [1.0, -0.0894841775, -1.2914855480]]
# Ottosson's XYZ (D65) to LMS matrix, to derive the sRGB matrix independently.
XYZ_TO_LMS = [[0.8189330101, 0.3618667424, -0.1288597137],
              [0.0329845436, 0.9293118715, 0.0361456387],
              [0.0482003018, 0.2643662691, 0.6338517070]]

IN_PLACE = [
    image.convert_srgb_to_oklab_frac_hwc, image.convert_srgb_to_oklab_frac_chw,
    image.convert_oklab_to_srgb_frac_hwc, image.convert_oklab_to_srgb_frac_chw,
    image.convert_frac_to_balanced_hwc, image.convert_frac_to_balanced_chw,
    image.convert_balanced_to_frac_hwc, image.convert_balanced_to_frac_chw,
]


@pytest.fixture(scope="module")
def fixture():
    with np.load(FIXTURE, allow_pickle=False) as data:
        arrays = {name: data[name] for name in data.files}
    return arrays, json.loads(str(arrays.pop("meta")))


def to_oklab(srgb):
    """The reference: fractional sRGB to Oklab, channels last, float64."""
    return oklab.linear_srgb_to_oklab(oklab.srgb_eotf(srgb))


def random_srgb(shape, seed=0):
    return np.random.default_rng(seed).uniform(0.0, 1.0, shape)


# -- reference definitions ---------------------------------------------------------------------


def test_matrices_are_read_only_float64_and_inverses():
    for matrix in (oklab.M1, oklab.M2, oklab.M1_INV, oklab.M2_INV):
        assert matrix.dtype == np.float64 and matrix.shape == (3, 3) and not matrix.flags.writeable
    assert np.allclose(oklab.M1 @ oklab.M1_INV, np.eye(3), atol=1e-14)
    assert np.allclose(oklab.M2 @ oklab.M2_INV, np.eye(3), atol=1e-14)
    assert np.allclose(oklab.M1_INV, PUBLISHED_M1_INV, atol=1e-7)
    assert np.allclose(oklab.M2_INV, PUBLISHED_M2_INV, atol=1e-7)


def test_m1_is_srgb_to_xyz_then_ottossons_xyz_to_lms():
    # linear sRGB -> XYZ from the sRGB primaries and D65 white point.
    def xyz(x, y):
        return np.array([x / y, 1.0, (1 - x - y) / y])

    primaries = np.stack([xyz(0.64, 0.33), xyz(0.30, 0.60), xyz(0.15, 0.06)], axis=1)
    srgb_to_xyz = primaries * np.linalg.solve(primaries, xyz(0.3127, 0.3290))
    assert np.allclose(np.array(XYZ_TO_LMS) @ srgb_to_xyz, oklab.M1, atol=1e-3)
    # Each row of M1 sums to 1 (white has equal LMS), which a transposed M1 would not.
    assert np.allclose(oklab.M1.sum(axis=1), 1.0, atol=1e-9)


def test_white_black_and_primaries_have_their_published_oklab_values():
    assert np.allclose(to_oklab([1.0, 1.0, 1.0]), [1.0, 0.0, 0.0], atol=1e-4)
    assert np.array_equal(to_oklab([0.0, 0.0, 0.0]), [0.0, 0.0, 0.0])
    for rgb, lab in PUBLISHED.items():
        assert np.allclose(to_oklab(rgb), lab, atol=1e-4), rgb
    greys = to_oklab(np.linspace(0, 1, 11)[:, None].repeat(3, axis=1))
    assert np.allclose(greys[:, 1:], 0.0, atol=1e-6) and (np.diff(greys[:, 0]) > 0).all()


def test_transfer_functions():
    x = np.linspace(-0.5, 1.5, 2001)
    assert np.allclose(oklab.srgb_oetf(oklab.srgb_eotf(x)), x, atol=1e-12)
    assert np.isclose(oklab.srgb_eotf(0.04045), 0.04045 / 12.92)
    assert np.isclose(oklab.srgb_eotf(0.5), ((0.5 + 0.055) / 1.055) ** 2.4)
    assert oklab.srgb_eotf(1.0) == pytest.approx(1.0) and oklab.srgb_eotf(0.0) == 0.0
    assert np.isclose(oklab.srgb_oetf(0.0031308), 0.0031308 * 12.92)
    assert (np.diff(oklab.srgb_eotf(x)) > 0).all()
    # The two pieces meet: no visible step at the knee.
    assert abs(oklab.srgb_eotf(0.04045 + 1e-12) - oklab.srgb_eotf(0.04045)) < 1e-6


def test_reference_functions_return_new_float64_arrays_and_round_trip():
    rgb = random_srgb((4, 5, 3)).astype(np.float32)
    lab = oklab.linear_srgb_to_oklab(rgb)
    assert lab.dtype == np.float64 and lab.shape == rgb.shape and lab is not rgb
    assert np.allclose(oklab.oklab_to_linear_srgb(lab), rgb, atol=1e-12)
    assert oklab.srgb_eotf([0, 1]).dtype == np.float64
    with pytest.raises(ValueError, match="3 channels"):
        oklab.linear_srgb_to_oklab(np.zeros((2, 4)))


# -- in-place conversions ----------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(3,), (5, 4, 3), (2, 3, 5, 4, 3)])
def test_hwc_to_oklab_matches_the_reference_with_any_batch_dims(shape):
    data = random_srgb(shape)
    expected = to_oklab(data)
    image.convert_srgb_to_oklab_frac_hwc(data)
    assert np.allclose(data, expected, atol=1e-12)
    image.convert_oklab_to_srgb_frac_hwc(data)
    assert np.allclose(data, random_srgb(shape), atol=1e-12)


def test_chw_and_four_channels_work_and_leave_alpha_alone():
    # 0.2.2 raised "output array is not acceptable" for both.
    rgba = random_srgb((2, 5, 6, 4), seed=3)
    hwc = rgba.copy()
    image.convert_srgb_to_oklab_frac_hwc(hwc)
    assert np.allclose(hwc[..., :3], to_oklab(rgba[..., :3]), atol=1e-12)
    assert np.array_equal(hwc[..., 3], rgba[..., 3])

    chw = np.ascontiguousarray(np.moveaxis(rgba, -1, -3))
    image.convert_srgb_to_oklab_frac_chw(chw)
    assert np.allclose(np.moveaxis(chw, -3, -1), hwc, atol=1e-12)
    assert np.array_equal(chw[..., 3, :, :], rgba[..., 3])

    image.convert_oklab_to_srgb_frac_chw(chw)
    assert np.allclose(np.moveaxis(chw, -3, -1), rgba, atol=1e-12)


def test_works_on_a_strided_view_and_writes_through_to_its_base():
    base = random_srgb((6, 8, 3), seed=4)
    original = base.copy()
    view = base[::2, 1::3]
    image.convert_srgb_to_oklab_frac_hwc(view)
    assert np.allclose(base[::2, 1::3], to_oklab(original[::2, 1::3]), atol=1e-12)
    untouched = np.ones(base.shape[:2], bool)
    untouched[::2, 1::3] = False
    assert np.array_equal(base[untouched], original[untouched])


@pytest.mark.parametrize("dtype, atol", [(np.float64, 1e-6), (np.float32, 1e-5), (np.float16, 5e-3)])
@pytest.mark.parametrize("layout", ["hwc", "chw"])
def test_round_trip(dtype, atol, layout):
    rgb = random_srgb((2, 7, 9, 3), seed=5)
    if layout == "chw":
        rgb = np.ascontiguousarray(np.moveaxis(rgb, -1, -3))
    data = rgb.astype(dtype)
    getattr(image, f"convert_srgb_to_oklab_frac_{layout}")(data)
    assert data.dtype == dtype
    getattr(image, f"convert_oklab_to_srgb_frac_{layout}")(data)
    assert np.abs(data.astype(np.float64) - rgb.astype(dtype)).max() < atol


def test_float32_follows_the_float64_reference():
    rgb = random_srgb((16, 16, 3), seed=6).astype(np.float32)
    data = rgb.copy()
    image.convert_srgb_to_oklab_frac_hwc(data)
    assert np.abs(data - to_oklab(rgb)).max() < 1e-6


@pytest.mark.parametrize("convert", IN_PLACE, ids=lambda f: f.__name__)
def test_non_float_input_is_a_type_error_naming_the_dtype(convert):
    with pytest.raises(TypeError, match="uint8"):
        convert(np.zeros((3, 4, 4), np.uint8))
    with pytest.raises(TypeError, match="list"):
        convert([[[0.0, 0.0, 0.0]]])


@pytest.mark.parametrize("convert", IN_PLACE, ids=lambda f: f.__name__)
def test_fewer_than_three_channels_is_a_value_error(convert):
    shape = (4, 4, 2) if convert.__name__.endswith("hwc") else (2, 4, 4)
    with pytest.raises(ValueError, match="3 channels"):
        convert(np.zeros(shape))


# -- against 0.2.2 -----------------------------------------------------------------------------


def test_022_oklab_was_the_transposed_matrices(fixture):
    arrays, _ = fixture
    data = arrays["oklab_in/hwc3"]
    recorded = arrays["oklab/to_oklab/hwc3"]
    # 0.2.2 multiplied row vectors by M1 and M2 untransposed; with our constants and transfer
    # function that reproduces it, which confirms both agree with 0.2.2's.
    assert np.allclose(np.cbrt(oklab.srgb_eotf(data) @ oklab.M1) @ oklab.M2, recorded, atol=1e-12)
    assert np.allclose(recorded[0, 0], [2.476, -1.347, -0.235], atol=1e-3), "0.2.2's white"
    ours = data.copy()
    image.convert_srgb_to_oklab_frac_hwc(ours)
    assert np.allclose(ours[0, 0], [1.0, 0.0, 0.0], atol=1e-4)
    assert not np.allclose(ours, recorded, atol=1e-2)
    # 0.2.2's round trip was self-consistent, and so is ours.
    assert np.abs(arrays["oklab/round_trip/hwc3"] - data).max() < 0.25 / 255
    image.convert_oklab_to_srgb_frac_hwc(ours)
    assert np.allclose(ours, data, atol=1e-12)


def test_022_crashed_where_we_convert(fixture):
    _, meta = fixture
    for name in ("oklab/to_oklab/chw3", "oklab/to_oklab/hwc4", "oklab/to_srgb/chw3"):
        assert meta["arrays"][name].startswith("ValueError"), name
    data = random_srgb((1, 16, 3), seed=7)
    chw = np.ascontiguousarray(np.moveaxis(data, -1, -3))
    image.convert_srgb_to_oklab_frac_chw(chw)
    assert np.allclose(np.moveaxis(chw, -3, -1), to_oklab(data), atol=1e-12)


def test_balanced_conversions_match_022_exactly(fixture):
    arrays, meta = fixture
    names = sorted(name for name in meta["arrays"] if name.startswith("balanced/"))
    assert names
    for name in names:
        assert meta["arrays"][name] == "ok", name
        _, direction, layout, dtype, scale = name.split("/")
        data = arrays[f"balanced_in/{layout}/{dtype}"].copy()
        convert = getattr(image, f"convert_frac_to_balanced_{layout}" if direction == "to_balanced"
                          else f"convert_balanced_to_frac_{layout}")
        convert(data, float(scale))
        assert data.dtype == arrays[name].dtype and np.array_equal(data, arrays[name]), name


@pytest.mark.parametrize("layout", ["hwc", "chw"])
def test_balanced_maps_the_range_and_round_trips(layout):
    pixel = np.array([0.0, 0.5, 1.0, 0.25])  # the 4th channel is alpha
    data = pixel[None, None, :] if layout == "hwc" else pixel[:, None, None]
    data = np.repeat(data.copy(), 2, axis=0 if layout == "hwc" else 1)
    original = data.copy()
    getattr(image, f"convert_frac_to_balanced_{layout}")(data, 2.0)
    colours = data[..., :3] if layout == "hwc" else np.moveaxis(data[:3], 0, -1)
    assert np.allclose(colours, [-2.0, 0.0, 2.0])
    alpha = data[..., 3] if layout == "hwc" else data[3]
    assert (alpha == 0.25).all()
    getattr(image, f"convert_balanced_to_frac_{layout}")(data, 2.0)
    assert np.allclose(data, original)

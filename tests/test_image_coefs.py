"""hydrax.image Coefs, write_hwc, write_chw and from_srgb_hwc, against the spec and hydrax 0.2.2.

The differential cases replay ``tests/fixtures/image_022.npz``, recorded from the real 0.2.2 by
``tools/compat/record_image_fixtures.py``; our results must be bit-identical.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PIL", reason="hydrax.image needs Pillow")

from hydrax.image import Coefs, from_srgb_hwc, write_chw, write_hwc

FIXTURE = Path(__file__).parent / "fixtures" / "image_022.npz"

SETS = {
    "FRACTIONAL": lambda: Coefs.FRACTIONAL,
    "IMAGENET_SRGB": lambda: Coefs.IMAGENET_SRGB,
    "IMAGENET_SRGB_ALPHA": lambda: Coefs.IMAGENET_SRGB_ALPHA,
    "balanced_1": lambda: Coefs.balanced(),
    "balanced_2.5_alpha": lambda: Coefs.balanced(2.5, alpha=True),
    "balanced_0.5": lambda: Coefs.balanced(0.5),
    "custom_1col": lambda: Coefs([[2.0], [-1.0]]),
    "identity": lambda: Coefs([[1.0], [0.0]]),
    "none": lambda: None,
}


@pytest.fixture(scope="module")
def fixture():
    with np.load(FIXTURE, allow_pickle=False) as data:
        arrays = {name: data[name] for name in data.files}
    return arrays, json.loads(str(arrays.pop("meta")))


def recorded(fixture, prefix):
    arrays, meta = fixture
    names = sorted(name for name in meta["arrays"] if name.startswith(prefix))
    assert names, f"no {prefix} cases in the fixture"
    return [(name, meta["arrays"][name], arrays.get(name)) for name in names]


# -- Coefs ---------------------------------------------------------------------------------


def test_predefined_coefs_match_022(fixture):
    for name, _status, expected in recorded(fixture, "coefs/"):
        _, set_name, dtype = name.split("/")
        got = SETS[set_name]()[dtype]
        assert got.dtype == expected.dtype and np.array_equal(got, expected), name


def test_imagenet_maps_255_to_published_values():
    assert np.allclose(255 / Coefs.IMAGENET_SRGB[np.float64][0] - Coefs.IMAGENET_SRGB[np.float64][1], [2.2489, 2.4286, 2.64], atol=1e-4)
    assert np.allclose(Coefs.IMAGENET_SRGB_ALPHA[np.float64][:, 3], [255, 0])


def test_getitem_is_cached_read_only_and_in_the_requested_dtype():
    coefs = Coefs([[255.0, 2.0], [0.0, 1.0]])
    first = coefs[np.float32]
    assert first is coefs["float32"] is coefs[np.dtype(np.float32)]
    assert first.dtype == np.float32 and first.shape == (2, 2)
    assert not first.flags.writeable
    with pytest.raises(ValueError):
        first[0, 0] = 1.0
    assert coefs[np.float16].dtype == np.float16


def test_pickles_with_read_only_arrays():
    import pickle

    coefs = Coefs.IMAGENET_SRGB
    coefs[np.float32]
    copy = pickle.loads(pickle.dumps(coefs))
    assert np.array_equal(copy[np.float32], coefs[np.float32])
    assert not copy[np.float32].flags.writeable and not copy[np.float64].flags.writeable


def test_constructor_copies_its_input():
    rows = [[255.0], [0.0]]
    source = np.array(rows)
    coefs = Coefs(source)
    source[0, 0] = 1.0
    rows[0][0] = 1.0
    assert coefs[np.float64][0, 0] == 255.0


def test_constructor_validates_shape_and_type():
    assert Coefs([2.0, 1.0])[np.float64].shape == (2, 1), "a flat pair is one shared column"
    for bad in ([[1.0, 2.0]], [[1.0], [2.0], [3.0]], np.zeros((2, 0)), np.zeros((2, 2, 2)), 3.0):
        with pytest.raises(ValueError, match="2 rows"):
            Coefs(bad)
    with pytest.raises(TypeError):
        Coefs([["a"], ["b"]])


def test_balanced_is_cached_and_maps_to_plus_minus_scale():
    assert Coefs.balanced(2.0) is Coefs.balanced(2.0)
    assert Coefs.balanced(2.0, alpha=True) is not Coefs.balanced(2.0)
    for scale in (1.0, 0.5, 3.0):
        divisor, subtrahend = Coefs.balanced(scale)[np.float64]
        assert np.allclose(np.array([[0.0], [255.0]]) / divisor - subtrahend, [[-scale] * 3, [scale] * 3])
    with_alpha = Coefs.balanced(3.0, alpha=True)[np.float64]
    assert with_alpha.shape == (2, 4) and list(with_alpha[:, 3]) == [255.0, 0.0]


def test_class_attributes_are_coefs():
    for name in ("FRACTIONAL", "IMAGENET_SRGB", "IMAGENET_SRGB_ALPHA"):
        assert isinstance(getattr(Coefs, name), Coefs)
    assert Coefs.FRACTIONAL.columns == 1 and Coefs.IMAGENET_SRGB_ALPHA.columns == 4


# -- Coefs.affine ----------------------------------------------------------------------------


@pytest.mark.parametrize("set_name, channels", [("FRACTIONAL", 1), ("FRACTIONAL", 4), ("IMAGENET_SRGB", 3),
                                                ("IMAGENET_SRGB_ALPHA", 4), ("balanced_2.5_alpha", 4)])
def test_affine_equals_the_forward_transform(set_name, channels):
    coefs = SETS[set_name]()
    scale, offset = coefs.affine(channels)
    assert scale.dtype == offset.dtype == np.float64 and scale.shape == offset.shape == (channels,)
    x = np.arange(256, dtype=np.float64)[:, None].repeat(channels, axis=1)
    expected = np.zeros_like(x)
    write_hwc(x[None], expected[None], coefs)
    assert np.allclose(x * scale + offset, expected, rtol=1e-13, atol=1e-13)


def test_affine_rejects_a_channel_count_it_cannot_cover():
    with pytest.raises(ValueError, match=r"3 columns.*4 channels"):
        Coefs.IMAGENET_SRGB.affine(4)


# -- write_hwc / write_chw -------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["hwc", "chw"])
def test_write_matches_022(fixture, layout):
    arrays, _ = fixture
    write = {"hwc": write_hwc, "chw": write_chw}[layout]
    cases = recorded(fixture, f"write_{layout}/")
    for name, status, expected in cases:
        _, src_name, set_name, *_ = name.split("/")
        src = arrays[f"src/{src_name}"]
        if set_name.startswith("cast_"):
            # 0.2.2 refused these unsafe casts with numpy's TypeError; so must we.
            _, from_dtype, _, to_dtype = set_name.split("_")
            assert status.startswith(("TypeError", "UFuncTypeError", "_UFuncOutputCastingError")), status
            shape = src.shape if layout == "hwc" else src.shape[2:] + src.shape[:2]
            with pytest.raises(TypeError):
                write(src.astype(from_dtype), np.zeros(shape, to_dtype))
            continue
        assert status == "ok", name
        out = np.full(expected.shape, np.nan, expected.dtype)
        write(src, out, SETS[set_name]())
        assert np.array_equal(out, expected), name


def test_write_chw_transposes_and_broadcasts_per_channel():
    src = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    out = np.zeros((3, 2, 3), np.float64)
    write_chw(src, out, Coefs([[1.0, 2.0, 4.0], [0.0, 1.0, 2.0]]))
    assert np.allclose(out, src.transpose(2, 0, 1) / np.array([1.0, 2.0, 4.0])[:, None, None] - np.array([0.0, 1.0, 2.0])[:, None, None])


def test_write_accepts_a_pil_image():
    from PIL import Image

    src = np.random.default_rng(1).integers(0, 256, (4, 5, 3), dtype=np.uint8)
    out = np.zeros((4, 5, 3), np.float32)
    write_hwc(Image.fromarray(src), out, Coefs.FRACTIONAL)
    assert np.array_equal(out, src.astype(np.float32) / np.float32(255))


def test_write_with_wrong_column_count_raises_before_writing():
    out = np.full((2, 2, 4), 7.0)
    with pytest.raises(ValueError, match="3 columns"):
        write_hwc(np.zeros((2, 2, 4), np.uint8), out, Coefs.IMAGENET_SRGB)
    assert (out == 7.0).all()
    out = np.full((4, 2, 2), 7.0)
    with pytest.raises(ValueError, match="3 columns"):
        write_chw(np.zeros((2, 2, 4), np.uint8), out, Coefs.IMAGENET_SRGB)
    assert (out == 7.0).all()


# -- from_srgb_hwc -----------------------------------------------------------------------------


def test_from_srgb_matches_022(fixture):
    arrays, meta = fixture
    assert meta["from_srgb"]
    for case in meta["from_srgb"]:
        key = case["name"]
        given = arrays[f"{key}/in"].copy()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            image = from_srgb_hwc(given, SETS[case["coefs"]](), mode=case["mode"], copy=case["copy"])
        assert case["status"] == "ok", key
        assert image.mode == case["out_mode"], key
        assert np.array_equal(np.asarray(image), arrays[f"{key}/out"]), key
        # copy=False works in place, exactly as 0.2.2 did; copy=True leaves the input alone.
        assert np.array_equal(given, arrays[f"{key}/in_after"], equal_nan=True), key
        assert sorted({w.category.__name__ for w in caught}) == case["warnings"], key


def test_from_srgb_rounds_half_to_even_and_clips():
    image = from_srgb_hwc(np.array([[[0.0, 0.5, 1.2]]]), Coefs.FRACTIONAL)
    assert image.mode == "RGB" and image.getpixel((0, 0)) == (0, 128, 255)
    halves = np.array([[[0.5, 1.5, 2.5], [253.5, -1.0, 1e9]]])
    assert np.asarray(from_srgb_hwc(halves, Coefs([[1.0], [0.0]]))).tolist() == [[[0, 2, 2], [254, 0, 255]]]


def test_from_srgb_nan_warns_and_becomes_zero():
    with pytest.warns(RuntimeWarning):
        image = from_srgb_hwc(np.array([[[np.nan, 1.0, 0.5]]]), Coefs.FRACTIONAL)
    assert image.getpixel((0, 0)) == (0, 255, 128)


def test_from_srgb_modifies_its_input_unless_copy():
    data = np.full((1, 1, 3), 0.5)
    from_srgb_hwc(data, Coefs.FRACTIONAL, copy=True)
    assert (data == 0.5).all()
    from_srgb_hwc(data, Coefs.FRACTIONAL)
    assert (data == 128.0).all()


@pytest.mark.skipif(np.lib.NumpyVersion(np.__version__) < "2.0.0", reason="NumPy 1 copies silently")
def test_from_srgb_without_copy_refuses_input_that_needs_one():
    with pytest.raises(ValueError):
        from_srgb_hwc([[[0.5, 0.5, 0.5]]], Coefs.FRACTIONAL)
    assert from_srgb_hwc([[[0.5, 0.5, 0.5]]], Coefs.FRACTIONAL, copy=True).getpixel((0, 0)) == (128, 128, 128)


def test_write_then_from_srgb_round_trips():
    src = np.random.default_rng(2).integers(0, 256, (6, 7, 4), dtype=np.uint8)
    for coefs in (Coefs.FRACTIONAL, Coefs.IMAGENET_SRGB_ALPHA, Coefs.balanced(2.0, alpha=True)):
        out = np.zeros(src.shape, np.float32)
        write_hwc(src, out, coefs)
        assert np.array_equal(np.asarray(from_srgb_hwc(out, coefs, mode="RGBA")), src)

"""hydrax.image open_srgb, set_max_image_pixels and the CONVERT_* constants.

Decoded pixels are compared with the fixture recorded from the real hydrax 0.2.2
(``tools/compat/record_image_fixtures.py``, which embeds the ICC profiles of
``shared/testdata/icc`` in small PNG and JPEG files stored in the fixture). They must be identical
wherever 0.2.2 worked; where it raised (RGBa or L output, or a palette image, with a profile) or
got alpha wrong (a greyscale image read as RGBA), the correct result is checked instead.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from support.timing import slack

pytest.importorskip("PIL", reason="hydrax.image needs Pillow")

from PIL import Image, ImageCms

from hydrax import image
from hydrax.image import CONVERT_PERCEPTUAL, CONVERT_RELATIVE, ProfileError, open_srgb
from hydrax.image import srgb as srgb_module

FIXTURE = Path(__file__).parent / "fixtures" / "image_022.npz"
ICC_DIR = Path(__file__).resolve().parent / "data" / "icc"
CONVERTS = {"relative": CONVERT_RELATIVE, "perceptual": CONVERT_PERCEPTUAL}


@pytest.fixture(scope="module")
def fixture():
    with np.load(FIXTURE, allow_pickle=False) as data:
        arrays = {name: data[name] for name in data.files}
    return arrays, json.loads(str(arrays.pop("meta")))


def icc(name: str) -> bytes:
    path = ICC_DIR / f"{name}.icc"
    if not path.exists():
        pytest.skip(f"ICC test profile {path} is missing (tests/data/icc)")
    return path.read_bytes()


def encode(picture: Image.Image, fmt: str = "PNG", profile: bytes | None = None) -> io.BytesIO:
    buffer = io.BytesIO()
    options = {"icc_profile": profile} if profile is not None else {}
    picture.save(buffer, fmt, **options)
    buffer.seek(0)
    return buffer


def rgb_picture(seed: int = 0, channels: int = 3) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (6, 7, channels), dtype=np.uint8))


def srgb_profile_bytes() -> bytes:
    return without_dates(ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes())


def without_dates(profile: bytes) -> bytes:
    """The profile without its creation time (bytes 24-35) and ID (84-99), which LittleCMS
    stamps whenever it writes one out."""
    return profile[:24] + profile[36:84] + profile[100:]


@pytest.fixture
def restore_max_pixels(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", Image.MAX_IMAGE_PIXELS)


# -- constants and set_max_image_pixels ----------------------------------------------------------


def test_convert_constants():
    assert CONVERT_PERCEPTUAL == (ImageCms.Intent.PERCEPTUAL, 1024)
    assert CONVERT_RELATIVE == (ImageCms.Intent.RELATIVE_COLORIMETRIC, 9216)


def test_set_max_image_pixels_matches_022(fixture, restore_max_pixels):
    _, meta = fixture
    for threshold, expected in meta["max_image_pixels"]:
        image.set_max_image_pixels(threshold)
        assert Image.MAX_IMAGE_PIXELS == expected, threshold


def test_set_max_image_pixels_errors_above_threshold_and_warns_above_half(restore_max_pixels):
    image.set_max_image_pixels(100)
    with pytest.raises(Image.DecompressionBombError):
        open_srgb(encode(Image.new("RGB", (11, 10))))
    with pytest.warns(Image.DecompressionBombWarning):
        open_srgb(encode(Image.new("RGB", (6, 10))))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        open_srgb(encode(Image.new("RGB", (5, 10))))
    image.set_max_image_pixels(None)
    assert Image.MAX_IMAGE_PIXELS is None


# -- against 0.2.2 -------------------------------------------------------------------------------


def fixture_cases(fixture):
    arrays, meta = fixture
    assert meta["open_srgb"]
    for case in meta["open_srgb"]:
        data = arrays[f"image/{case['image']}"].tobytes()
        ours = open_srgb(io.BytesIO(data), mode=case["mode"], convert=CONVERTS[case["convert"]])
        yield case, data, ours, arrays.get(case.get("result"))


def test_open_srgb_matches_022_where_it_worked(fixture):
    checked = 0
    for case, _, ours, recorded in fixture_cases(fixture):
        if case["status"] != "ok":
            continue
        label = f"{case['image']} {case['mode']} {case['convert']}"
        assert ours.mode == case["out_mode"], label
        pixels = np.asarray(ours)
        if case["image"] == "l_png_gray" and case["mode"] == "RGBA":
            # 0.2.2 (LittleCMS through Pillow) left alpha at 0, i.e. fully transparent.
            assert (recorded[..., 3] == 0).all()
            assert np.array_equal(pixels[..., :3], recorded[..., :3]) and (pixels[..., 3] == 255).all(), label
        else:
            assert np.array_equal(pixels, recorded), label
        checked += 1
    assert checked >= 30


def test_open_srgb_works_where_022_raised(fixture):
    """RGBa and L output with a profile, palette images with a profile, and L to RGBa."""
    fixed = 0
    for case, data, ours, _ in fixture_cases(fixture):
        if case["status"] == "ok":
            continue
        assert case["status"].startswith(("PyCMSError", "ValueError")), case
        assert ours.mode == case["mode"]
        # The expected result: the colour-managed RGB(A) image, converted by Pillow.
        source = Image.open(io.BytesIO(data))
        has_alpha = source.mode in ("RGBA", "LA", "PA") or "transparency" in source.info
        via = "RGBA" if case["mode"] in ("RGBA", "RGBa") and has_alpha else "RGB"
        if source.info.get("icc_profile"):
            source = source.convert("RGBA" if has_alpha else "RGB") if source.mode == "P" else source
            profile = ImageCms.ImageCmsProfile(io.BytesIO(source.info["icc_profile"]))
            intent, flags = CONVERTS[case["convert"]]
            expected = ImageCms.profileToProfile(source, profile, ImageCms.createProfile("sRGB"),
                                                 renderingIntent=intent, outputMode=via, flags=flags)
        else:
            expected = source.convert(via)
        expected = expected.convert("RGBA").convert(case["mode"]) if case["mode"] == "RGBa" else expected.convert(case["mode"])
        assert np.array_equal(np.asarray(ours), np.asarray(expected)), case
        fixed += 1
    assert fixed >= 10


# -- behaviour -----------------------------------------------------------------------------------


def test_in_place_when_the_mode_matches_otherwise_a_new_image():
    data = encode(rgb_picture(), "JPEG", icc("AdobeRGB1998")).getvalue()
    same = open_srgb(io.BytesIO(data), mode="RGB")
    # Converted in place: still the opened JPEG (format and info kept), now tagged as sRGB.
    assert same.format == "JPEG" and "jfif" in same.info
    assert without_dates(same.info["icc_profile"]) == srgb_profile_bytes()
    other = open_srgb(io.BytesIO(data), mode="RGBA")
    assert other.format is None and without_dates(other.info["icc_profile"]) == srgb_profile_bytes()
    assert np.array_equal(np.asarray(other)[..., :3], np.asarray(same))
    assert (np.asarray(other)[..., 3] == 255).all()


def test_without_profile_the_image_is_taken_as_srgb():
    picture = rgb_picture(1)
    opened = open_srgb(encode(picture))
    assert opened.format == "PNG" and np.array_equal(np.asarray(opened), np.asarray(picture))
    assert np.array_equal(np.asarray(open_srgb(encode(picture), mode="RGBA"))[..., :3], np.asarray(picture))


def test_profiles_change_colours_as_expected():
    picture = rgb_picture(2)
    near = np.asarray(open_srgb(encode(picture, profile=icc("sRGB"))), dtype=int)
    assert np.abs(near - np.asarray(picture)).max() <= 2, "an sRGB profile is (nearly) the identity"
    # Grey stays grey (both spaces share the D65 white), while Adobe RGB's more saturated green
    # primary comes out as a stronger sRGB green.
    grey = open_srgb(encode(Image.new("RGB", (2, 2), (128, 128, 128)), profile=icc("AdobeRGB1998")))
    r, g, b = grey.getpixel((0, 0))
    assert max(r, g, b) - min(r, g, b) <= 1
    green = open_srgb(encode(Image.new("RGB", (2, 2), (0, 160, 0)), profile=icc("AdobeRGB1998")))
    assert green.getpixel((0, 0))[1] > 160


def test_alpha_passes_through_a_profile_conversion():
    rgba = rgb_picture(3, channels=4)
    opened = open_srgb(encode(rgba, profile=icc("AdobeRGB1998")), mode="RGBA")
    assert np.array_equal(np.asarray(opened)[..., 3], np.asarray(rgba)[..., 3])
    grey_alpha = rgba.convert("LA")
    opened = open_srgb(encode(grey_alpha, profile=icc("Gray")), mode="RGBA")
    pixels = np.asarray(opened)
    assert np.array_equal(pixels[..., 3], np.asarray(grey_alpha)[..., 1])
    grey_only = np.asarray(open_srgb(encode(grey_alpha.convert("L"), profile=icc("Gray"))))
    assert np.array_equal(pixels[..., :3], grey_only)
    assert (pixels[..., 0] == pixels[..., 1]).all() and (pixels[..., 1] == pixels[..., 2]).all()


def test_transforms_are_cached(monkeypatch):
    built = []
    real = ImageCms.buildTransform

    def counting(*args, **kwargs):
        built.append(args[2:])
        return real(*args, **kwargs)

    monkeypatch.setattr(ImageCms, "buildTransform", counting)
    srgb_module._to_srgb_transform.cache_clear()
    adobe = encode(rgb_picture(4), profile=icc("AdobeRGB1998")).getvalue()
    other_pixels = encode(rgb_picture(5), profile=icc("AdobeRGB1998")).getvalue()
    for data in (adobe, other_pixels, adobe):
        open_srgb(io.BytesIO(data))
    assert len(built) == 1, "one profile, mode and intent: one transform"
    open_srgb(io.BytesIO(adobe), convert=CONVERT_PERCEPTUAL)
    open_srgb(io.BytesIO(encode(rgb_picture(4), profile=icc("ProPhotoRGB")).getvalue()))
    assert len(built) == 3, "another intent, another profile: a transform each"
    assert srgb_module._to_srgb_transform.cache_info().maxsize is not None, "the cache is bounded"


def test_srgb_profile_is_built_once(monkeypatch):
    open_srgb(encode(rgb_picture(), profile=icc("AdobeRGB1998")))
    created = []
    monkeypatch.setattr(ImageCms, "createProfile", lambda *a, **k: created.append(a))
    srgb_module._to_srgb_transform.cache_clear()
    open_srgb(encode(rgb_picture(), profile=icc("ProPhotoRGB")))
    assert created == []


def test_unsupported_intent_falls_back_to_the_default_without_black_point_compensation():
    lab = ImageCms.ImageCmsProfile(ImageCms.createProfile("LAB"))
    # A built-in Lab profile supports only the perceptual intent as an input profile.
    assert ImageCms.isIntentSupported(lab, ImageCms.Intent.RELATIVE_COLORIMETRIC, ImageCms.Direction.INPUT) == -1
    assert srgb_module._resolve_intent(lab, *CONVERT_RELATIVE) == (ImageCms.Intent.PERCEPTUAL, 0x0400)
    assert srgb_module._resolve_intent(lab, ImageCms.Intent.PERCEPTUAL, 0x2400) == (ImageCms.Intent.PERCEPTUAL, 0x2400)
    adobe = ImageCms.ImageCmsProfile(io.BytesIO(icc("AdobeRGB1998")))
    assert srgb_module._resolve_intent(adobe, *CONVERT_RELATIVE) == CONVERT_RELATIVE
    # End to end: a Lab TIFF carrying that profile opens with the default CONVERT_RELATIVE.
    lab_picture = Image.frombytes("LAB", (4, 3), bytes(range(36)))
    opened = open_srgb(encode(lab_picture, "TIFF", lab.tobytes()))
    assert opened.mode == "RGB" and opened.size == (4, 3)


@pytest.mark.parametrize("bad, reason", [(b"not an icc profile" * 10, "cannot be read"), ("truncated", "cannot convert")])
def test_malformed_profile_raises_profile_error(bad, reason):
    if bad == "truncated":
        bad = icc("AdobeRGB1998")[:1000]
    with pytest.raises(ProfileError, match=reason) as caught:
        open_srgb(encode(rgb_picture(), profile=bad))
    assert isinstance(caught.value, ValueError) and "ICC profile" in str(caught.value)


def test_profile_for_other_data_raises_profile_error():
    with pytest.raises(ProfileError, match="GRAY"):
        open_srgb(encode(rgb_picture(), profile=icc("Gray")))


def test_bad_profile_warn_treats_the_image_as_srgb():
    picture = rgb_picture(6)
    with pytest.warns(UserWarning, match="cannot be read.*treating it as sRGB"):
        opened = open_srgb(encode(picture, profile=b"garbage" * 40), mode="RGBA", bad_profile="warn")
    assert "icc_profile" not in opened.info
    assert np.array_equal(np.asarray(opened), np.asarray(picture.convert("RGBA")))
    with pytest.warns(UserWarning, match="GRAY"):
        opened = open_srgb(encode(picture, profile=icc("Gray")), bad_profile="warn")
    assert np.array_equal(np.asarray(opened), np.asarray(picture))


def test_argument_checks():
    data = encode(rgb_picture()).getvalue()
    with pytest.raises(ValueError, match="bad_profile"):
        open_srgb(io.BytesIO(data), bad_profile="ignore")
    with pytest.raises(ValueError):
        open_srgb(io.BytesIO(data), convert=(7, 0))
    with pytest.raises(ValueError, match="flags"):
        open_srgb(io.BytesIO(data), convert=(ImageCms.Intent.PERCEPTUAL, -1))


def test_formats_and_paths_are_passed_to_pillow(tmp_path):
    path = tmp_path / "picture.png"
    path.write_bytes(encode(rgb_picture(7), profile=icc("AdobeRGB1998")).getvalue())
    assert open_srgb(path).size == (7, 6)
    assert open_srgb(str(path), formats=["PNG"]).mode == "RGB"
    with pytest.raises(Image.UnidentifiedImageError):
        open_srgb(path, formats=["JPEG"])


# -- optional dependency -------------------------------------------------------------------------


def test_import_hydrax_does_not_import_pillow():
    code = "import sys, hydrax; assert 'PIL' not in sys.modules, 'PIL imported'"
    result = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=slack(60))
    assert result.returncode == 0, result.stderr


def test_missing_pillow_gives_install_hint():
    code = (
        "import sys; sys.modules['PIL'] = None\n"
        "try:\n    import hydrax.image\nexcept ImportError as exc:\n    print(exc)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=slack(60))
    assert "pip install 'hydrax[image]'" in result.stdout, result.stdout + result.stderr

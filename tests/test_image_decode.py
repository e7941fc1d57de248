"""decode_into: colour judged against LittleCMS on the same pixels, and geometry, modes and bad input."""

import io
import itertools
import math
from pathlib import Path

import numpy as np
import pytest

Image = pytest.importorskip("PIL.Image")
ImageCms = pytest.importorskip("PIL.ImageCms")

from hydrax.image import Coefs, ImageError, ProfileError, decode_into, linear_srgb_to_oklab, set_max_image_pixels, srgb_eotf  # noqa: E402
from hydrax.image.decode import crop_box, flips  # noqa: E402

ICC = Path(__file__).resolve().parent / "data" / "icc"
PROFILES = sorted(ICC.glob("*.icc")) if ICC.is_dir() else []
RGB_PROFILES = [p for p in PROFILES if "Gray" not in p.name]
INTENTS = {"relative": (ImageCms.Intent.RELATIVE_COLORIMETRIC, 0x2400), "perceptual": (ImageCms.Intent.PERCEPTUAL, 0x0400)}
needs_profiles = pytest.mark.skipif(not PROFILES, reason=f"the ICC test profiles are not in {ICC}")


def sample_pixels():
    """64x64 RGB: every level of each primary and of gray, and random colours."""
    rng = np.random.default_rng(7)
    levels = np.arange(256, dtype=np.uint8)
    zero = np.zeros(256, np.uint8)
    rows = [np.stack([levels, levels, levels], 1), np.stack([levels, zero, zero], 1), np.stack([zero, levels, zero], 1),
            np.stack([zero, zero, levels], 1), rng.integers(0, 256, (64 * 64 - 4 * 256, 3), dtype=np.uint8)]
    return np.concatenate(rows).reshape(64, 64, 3)


def encode(pixels, fmt="PNG", profile=None, **params):
    buffer = io.BytesIO()
    if profile is not None:
        params["icc_profile"] = profile
    Image.fromarray(pixels).save(buffer, fmt, **params)
    return buffer.getvalue()


def lcms(pixels, profile, intent, mode="RGB"):
    transform = ImageCms.buildTransform(ImageCms.ImageCmsProfile(io.BytesIO(profile)), ImageCms.createProfile("sRGB"),
                                        mode, "RGB", *intent)
    return np.asarray(ImageCms.applyTransform(Image.fromarray(pixels), transform))


@needs_profiles
@pytest.mark.parametrize("intent", INTENTS)
@pytest.mark.parametrize("path", RGB_PROFILES, ids=lambda p: p.stem)
def test_rgb_profiles_match_littlecms_within_one_level(path, intent):
    pixels = sample_pixels()
    profile = path.read_bytes()
    out = np.empty((64, 64, 3), np.uint8)
    decode_into(encode(pixels, profile=profile), out, convert=INTENTS[intent])
    reference = lcms(pixels, profile, INTENTS[intent])
    assert np.abs(out.astype(int) - reference).max() <= 1
    if "sRGB" not in path.name:
        assert np.abs(out.astype(int) - pixels).max() > 10  # the profile really changed the colours


@needs_profiles
@pytest.mark.parametrize("intent", INTENTS)
def test_a_gray_profile_goes_through_littlecms(intent):
    gray = sample_pixels()[..., 1].copy()
    profile = (ICC / "Gray.icc").read_bytes()
    out = np.empty((64, 64, 3), np.uint8)
    decode_into(encode(gray, profile=profile), out, convert=INTENTS[intent])
    assert np.abs(out.astype(int) - lcms(gray, profile, INTENTS[intent], "L")).max() <= 1


def test_srgb_and_unprofiled_images_are_left_alone():
    pixels = sample_pixels()
    out = np.empty((64, 64, 3), np.uint8)
    decode_into(encode(pixels), out)
    assert (out == pixels).all()
    if (ICC / "sRGB.icc").exists():
        decode_into(encode(pixels, profile=(ICC / "sRGB.icc").read_bytes()), out)
        assert (out == pixels).all()


def test_linear_and_oklab_follow_the_reference_formulas():
    pixels = sample_pixels()
    data = encode(pixels)
    linear = np.empty((64, 64, 3), np.float32)
    decode_into(data, linear, space="linear")
    assert np.abs(linear - srgb_eotf(pixels / 255.0)).max() < 1e-6
    lab = np.empty((64, 64, 3), np.float32)
    decode_into(data, lab, space="oklab")
    assert np.abs(lab - linear_srgb_to_oklab(srgb_eotf(pixels / 255.0))).max() < 1e-4
    white = np.empty((1, 1, 3), np.float32)
    decode_into(encode(np.full((1, 1, 3), 255, np.uint8)), white, space="oklab")
    assert np.abs(white[0, 0] - [1, 0, 0]).max() < 1e-4


@needs_profiles
def test_wide_gamut_oklab_keeps_colours_outside_srgb():
    # Adobe RGB's pure green lies outside sRGB: linear sRGB clips it, Oklab keeps it
    green = np.zeros((1, 1, 3), np.uint8)
    green[..., 1] = 255
    data = encode(green, profile=(ICC / "AdobeRGB1998.icc").read_bytes())
    linear, lab = np.empty((1, 1, 3), np.float32), np.empty((1, 1, 3), np.float32)
    decode_into(data, linear, space="linear")
    decode_into(data, lab, space="oklab")
    assert linear.min() == 0.0 and linear.max() == 1.0
    assert np.linalg.norm(lab[0, 0, 1:]) > np.linalg.norm(linear_srgb_to_oklab(linear.astype(np.float64))[0, 0, 1:]) + 0.01


def test_layouts_dtypes_and_coefs_agree():
    pixels = sample_pixels()
    data = encode(pixels)
    hwc = np.empty((64, 64, 3), np.uint8)
    chw = np.empty((3, 64, 64), np.uint8)
    decode_into(data, hwc)
    decode_into(data, chw, layout="chw")
    assert (chw == hwc.transpose(2, 0, 1)).all()
    for dtype, tolerance in ((np.float32, 1e-5), (np.float16, 2e-3)):
        normalised = np.empty((3, 64, 64), dtype)
        decode_into(data, normalised, layout="chw", coefs=Coefs.IMAGENET_SRGB)
        mean, std = np.array([123.675, 116.28, 103.53]), np.array([58.395, 57.12, 57.375])
        expected = ((pixels - mean) / std).transpose(2, 0, 1)
        assert np.abs(normalised.astype(np.float64) - expected).max() < tolerance * max(1, np.abs(expected).max())
    fractions = np.empty((64, 64, 3), np.float32)
    decode_into(data, fractions)
    assert np.abs(fractions - pixels / 255.0).max() < 1e-6


def test_alpha_is_kept_in_four_channels_and_dropped_in_three():
    pixels = sample_pixels()
    rgba = np.concatenate([pixels, pixels[..., :1]], 2)
    data = encode(rgba)
    four = np.empty((64, 64, 4), np.uint8)
    decode_into(data, four)
    assert (four == rgba).all()
    three = np.empty((64, 64, 3), np.uint8)
    decode_into(data, three)
    assert (three == pixels).all()
    opaque = np.empty((4, 64, 64), np.float32)
    decode_into(encode(pixels), opaque, layout="chw")
    assert (opaque[3] == 1.0).all()


def test_gray_palette_16_bit_and_cmyk_sources():
    pixels = sample_pixels()
    out = np.empty((64, 64, 3), np.uint8)
    gray = pixels[..., 0].copy()
    decode_into(encode(gray), out)
    assert (out == gray[..., None]).all()
    wide = (gray.astype(np.uint16) * 257)
    decode_into(encode(wide), out)  # a 16-bit gray PNG
    assert (out == gray[..., None]).all()
    palette = Image.fromarray(pixels).quantize(64)
    buffer = io.BytesIO()
    palette.save(buffer, "PNG")
    decode_into(buffer.getvalue(), out)
    assert (out == np.asarray(palette.convert("RGB"))).all()
    cmyk = Image.fromarray(pixels).convert("CMYK")
    buffer = io.BytesIO()
    cmyk.save(buffer, "JPEG", quality=95)
    decode_into(buffer.getvalue(), out)
    assert np.abs(out.astype(int) - pixels).mean() < 6  # JPEG loss only


def test_exif_orientation_is_applied():
    pixels = np.zeros((40, 60, 3), np.uint8)
    pixels[:10, :20] = 255  # a white block at the top left
    image = Image.fromarray(pixels)
    exif = image.getexif()
    exif[0x0112] = 6  # stored rotated: displays turned 90 degrees clockwise
    buffer = io.BytesIO()
    image.save(buffer, "PNG", exif=exif)
    out = np.empty((60, 40, 3), np.uint8)
    decode_into(buffer.getvalue(), out, size=40)
    from PIL import ImageOps

    assert (out == np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(buffer.getvalue()))))).all()
    assert out[:20, -10:].min() == 255 and out[:, :10].max() == 0


def test_resize_crop_and_flip_are_reproducible_from_the_seed():
    rng = np.random.default_rng(3)
    pixels = rng.integers(0, 256, (300, 400, 3), dtype=np.uint8)
    data = encode(pixels)
    out = np.empty((64, 64, 3), np.uint8)

    def decode(**kwargs):
        decode_into(data, out, size=100, **kwargs)
        return out.copy()

    center = decode()
    expected = np.asarray(Image.fromarray(pixels).resize((133, 100), Image.Resampling.BILINEAR).crop((34, 18, 98, 82)))
    assert np.abs(center.astype(int) - expected).mean() < 2  # one resampling step vs resize-then-crop
    crops = {s: decode(crop="random", seed=s) for s in range(40)}
    assert all((decode(crop="random", seed=s) == crops[s]).all() for s in (0, 5, 39))
    assert len({crops[s].tobytes() for s in crops}) > 20
    boxes = [crop_box(400, 300, 64, 64, 100, "random", s) for s in range(200)]
    assert all(0 <= b[0] and b[2] <= 400 + 1e-9 and 0 <= b[1] and b[3] <= 300 + 1e-9 for b in boxes)
    flipped = [s for s in range(40) if flips(s)]
    assert 10 < len(flipped) < 30
    s = flipped[0]
    assert (decode(crop="random", seed=s, flip=True) == crops[s][:, ::-1]).all()
    s = next(s for s in range(40) if not flips(s))
    assert (decode(crop="random", seed=s, flip=True) == crops[s]).all()


def test_large_jpegs_decode_in_the_dct_domain_with_the_same_result():
    rng = np.random.default_rng(5)
    small = rng.integers(0, 255, (24, 32, 3), dtype=np.uint8)
    photo = np.asarray(Image.fromarray(small).resize((1280, 960), Image.Resampling.BICUBIC))
    data = encode(photo, "JPEG", quality=92)
    out = np.empty((112, 112, 3), np.uint8)
    decode_into(data, out, size=128)
    full = Image.open(io.BytesIO(data)).convert("RGB")
    reference = np.asarray(full.resize((112, 112), Image.Resampling.BILINEAR, box=crop_box(1280, 960, 112, 112, 128, "center", None)))
    assert np.abs(out.astype(int) - reference).mean() < 2.5


def test_bad_input_names_the_reason():
    pixels = sample_pixels()
    out = np.empty((64, 64, 3), np.uint8)
    jpeg = encode(pixels, "JPEG")
    with pytest.raises(ImageError, match="truncated or corrupt JPEG image"):
        decode_into(jpeg[: len(jpeg) // 2], out)
    with pytest.raises(ImageError, match="not an image Pillow can read"):
        decode_into(b"this is not an image at all", out)
    set_max_image_pixels(1000)
    try:
        with pytest.raises(ImageError, match="set_max_image_pixels"):
            decode_into(jpeg, out)
    finally:
        set_max_image_pixels(None)
        Image.MAX_IMAGE_PIXELS = int(1024 * 1024 * 1024 // 4 // 3)  # Pillow's default
    with pytest.raises(ValueError, match="needs the item's seed"):
        decode_into(jpeg, out, crop="random")
    with pytest.raises(ValueError, match="3 or 4 channels"):
        decode_into(jpeg, np.empty((64, 64, 2), np.uint8))
    with pytest.raises(TypeError, match="uint8, float16 or float32"):
        decode_into(jpeg, np.empty((64, 64, 3), np.int32))
    with pytest.raises(ValueError, match="Oklab output must be float"):
        decode_into(jpeg, out, space="oklab")
    with pytest.raises(ValueError, match="bad_profile must be"):
        decode_into(jpeg, out, bad_profile="ignore")
    with pytest.raises(ValueError):
        decode_into(jpeg, out, convert=(9, 0))  # no such intent


@needs_profiles
def test_a_damaged_profile_raises_or_is_ignored_with_a_warning():
    pixels = sample_pixels()
    damaged = bytearray((ICC / "AdobeRGB1998.icc").read_bytes())
    damaged[36:40] = b"xxxx"  # no 'acsp' signature
    data = encode(pixels, profile=bytes(damaged))
    out = np.empty((64, 64, 3), np.uint8)
    with pytest.raises(ProfileError, match="acsp"):
        decode_into(data, out)
    with pytest.warns(RuntimeWarning, match="treating the image as sRGB"):
        decode_into(data, out, bad_profile="warn")
    assert (out == pixels).all()


def with_curves(profile: bytes, curve: bytes) -> bytes:
    """``profile`` with all three TRC tags replaced by the tag data ``curve`` (appended at the end)."""
    import struct

    data = bytearray(profile)
    data += b"\0" * (-len(data) % 4)
    offset = len(data)
    data += curve
    count = struct.unpack_from(">I", data, 128)[0]
    for i in range(count):
        if data[132 + 12 * i : 136 + 12 * i] in (b"rTRC", b"gTRC", b"bTRC"):
            struct.pack_into(">II", data, 136 + 12 * i, offset, len(curve))
    struct.pack_into(">I", data, 0, len(data))
    data[84:100] = bytes(16)  # the profile ID would no longer match
    return bytes(data)


def curv(values) -> bytes:
    import struct

    table = np.clip(np.rint(np.asarray(values) * 65535), 0, 65535).astype(">u2")
    return b"curv" + bytes(4) + struct.pack(">I", len(table)) + table.tobytes()


def para(function: int, *params: float) -> bytes:
    import struct

    return b"para" + bytes(4) + struct.pack(">HH", function, 0) + b"".join(struct.pack(">i", round(p * 65536)) for p in params)


CURVES = {
    "table-1024": curv(np.linspace(0, 1, 1024) ** 2.2 * 0.9 + np.linspace(0, 1, 1024) * 0.1),
    "table-17": curv(np.linspace(0, 1, 17) ** 1.8),
    "gamma": b"curv" + bytes(4) + (1).to_bytes(4, "big") + round(2.6 * 256).to_bytes(2, "big"),
    "para-0": para(0, 2.2),
    "para-1": para(1, 2.4, 1.1, -0.1),
    "para-2": para(2, 2.4, 1.1, -0.1, 0.0),
    "para-3": para(3, 2.4, 1 / 1.055, 0.055 / 1.055, 1 / 12.92, 0.04045),
    "para-4": para(4, 2.4, 1 / 1.055, 0.055 / 1.055, 1 / 12.92, 0.04045, 0.0, 0.0),
    "para-4-raised-black": para(4, 2.4, 1 / 1.055, 0.055 / 1.055, 1 / 12.92, 0.04045, 0.02, 0.02),
}


@needs_profiles
@pytest.mark.parametrize("name", CURVES)
def test_every_kind_of_tone_curve_matches_littlecms(name):
    pixels = sample_pixels()
    profile = with_curves((ICC / "compatibleWithAdobeRGB1998.icc").read_bytes(), CURVES[name])
    out = np.empty((64, 64, 3), np.uint8)
    for intent in INTENTS.values():
        decode_into(encode(pixels, profile=profile), out, convert=intent)
        assert np.abs(out.astype(int) - lcms(pixels, profile, intent)).max() <= 1, intent


@needs_profiles
@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_a_tone_curve_that_gives_nan_is_a_damaged_profile(dtype):
    # one huge negative gamma: the curve is NaN or infinite; the uint8 kernel crashed on it, and
    # float32 output was silently NaN
    pixels = sample_pixels()
    profile = with_curves((ICC / "compatibleWithAdobeRGB1998.icc").read_bytes(), para(1, -32000.0, 1.0, 0.0))
    out = np.zeros((64, 64, 3), dtype)
    with pytest.raises(ProfileError, match="NaN"):
        decode_into(encode(pixels, profile=profile), out)
    with pytest.warns(RuntimeWarning, match="treating the image as sRGB"):
        decode_into(encode(pixels, profile=profile), out, bad_profile="warn")
    assert np.isfinite(out).all()


def test_gray_with_alpha_keeps_its_alpha():
    gray = sample_pixels()[..., 0]
    la = np.stack([gray, 255 - gray], 2)
    out = np.empty((64, 64, 4), np.uint8)
    decode_into(encode(la), out)
    assert (out[..., :3] == gray[..., None]).all() and (out[..., 3] == 255 - gray).all()
    profile = (ICC / "Gray.icc").read_bytes()
    decode_into(encode(la, profile=profile), out)
    expected = lcms(np.ascontiguousarray(gray), profile, INTENTS["relative"], "L")
    assert np.abs(out[..., :3].astype(int) - expected).max() <= 1 and (out[..., 3] == 255 - gray).all()


def load_photo(sample, arrays, seed):
    decode_into(sample["png"], arrays["image"], layout="chw", crop="random", flip=True, seed=seed, coefs=Coefs.IMAGENET_SRGB)


@needs_profiles
def test_decoding_in_loader_workers_drops_only_the_batch_with_a_broken_image(tmp_path):
    import jax.numpy as jnp

    from hydrax import DataGroup, Dataloader
    from hydrax.shards import ShardSet, ShardWriter

    rng = np.random.default_rng(11)
    profile = (ICC / "AdobeRGB1998.icc").read_bytes()
    images = [rng.integers(0, 256, (40, 48, 3), dtype=np.uint8) for _ in range(12)]
    with ShardWriter(str(tmp_path / "photos-%02d.tar"), maxcount=6) as writer:
        for i, pixels in enumerate(images):
            data = encode(pixels, profile=profile)
            writer.write({"__key__": f"p{i:02d}", "png": data[: len(data) // 3] if i == 7 else data})
    group = DataGroup(4, ShardSet(str(tmp_path / "photos-*.tar")), loader_arrays={"image": ((3, 32, 32), np.float32, jnp.float32)}, seed=3)
    seen = {}
    with Dataloader(load_photo, group, loader_count=2, end_at=("epoch", 1)) as loader:
        for batch in loader:
            seen[batch.group_index] = (list(batch.indices), list(batch.seeds), np.asarray(batch.arrays["image"]))
            del batch
    assert sorted(seen) == [0, 2]  # batch 1 held the broken image (item 7) and was dropped
    for indices, seeds, arrays in seen.values():
        for k, (index, seed) in enumerate(zip(indices, seeds)):
            expected = np.empty((3, 32, 32), np.float32)
            decode_into(encode(images[index], profile=profile), expected, layout="chw", crop="random", flip=True, seed=seed,
                        coefs=Coefs.IMAGENET_SRGB)
            assert np.array_equal(arrays[k], expected)  # the same pixels as in this process: reproducible


@needs_profiles
def test_webp_with_a_profile_is_colour_managed():
    from PIL import features

    if not features.check("webp"):
        pytest.skip("this Pillow has no WebP support")
    pixels = sample_pixels()
    profile = (ICC / "ProPhotoRGB.icc").read_bytes()
    out = np.empty((64, 64, 3), np.uint8)
    decode_into(encode(pixels, "WEBP", profile=profile, lossless=True), out)
    assert np.abs(out.astype(int) - lcms(pixels, profile, INTENTS["relative"])).max() <= 1


@needs_profiles
def test_a_profile_for_other_data_is_refused():
    data = encode(sample_pixels(), profile=(ICC / "Gray.icc").read_bytes())  # a gray profile in an RGB image
    with pytest.raises(ProfileError, match="cannot convert a mode 'RGB' image"):
        decode_into(data, np.empty((64, 64, 3), np.uint8))


def test_an_image_of_the_slots_size_is_copied_pixel_for_pixel():
    """The default scale is the smallest that covers the slot: 1 for an image of the slot's size,
    whatever its aspect ratio, so nothing is resampled (HWC and CHW, uint8 and float32, PNG and
    JPEG, centre and random crops)."""
    rng = np.random.default_rng(11)
    for height, width in ((160, 200), (200, 160), (7, 300), (300, 7), (33, 50), (64, 64)):
        pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        jpeg = encode(pixels, "JPEG", quality=90)
        for data, expected in ((encode(pixels), pixels), (jpeg, np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB")))):
            for layout in ("hwc", "chw"):
                want = expected if layout == "hwc" else expected.transpose(2, 0, 1)
                for crop in ("center", "random"):
                    out = np.empty(want.shape, np.uint8)
                    decode_into(data, out, layout=layout, crop=crop, seed=3)
                    assert np.array_equal(out, want), (height, width, layout, crop)
                wide = np.empty(want.shape, np.float32)
                decode_into(data, wide, layout=layout)
                assert np.abs(wide * 255 - want).max() < 1e-3, (height, width, layout)
        rgba = np.concatenate([pixels, rng.integers(0, 256, (height, width, 1), dtype=np.uint8)], axis=2)
        out = np.empty((4, height, width), np.uint8)
        decode_into(encode(rgba), out, layout="chw")
        assert np.array_equal(out, rgba.transpose(2, 0, 1)), (height, width)
        assert crop_box(width, height, height, width, None, "random", 9) == (0.0, 0.0, float(width), float(height))


def test_other_sizes_are_covered_then_cropped_on_one_axis_without_stretching():
    rng = np.random.default_rng(12)
    # exactly twice a 50x80 (H x W) slot: scaled by 1/2 as a whole, nothing cropped
    pixels = rng.integers(0, 256, (100, 160, 3), dtype=np.uint8)
    out = np.empty((50, 80, 3), np.uint8)
    decode_into(encode(pixels), out)
    assert np.array_equal(out, np.asarray(Image.fromarray(pixels).resize((80, 50), Image.Resampling.BILINEAR)))
    # wider than the slot: scaled by 1/2 to 200x50, the height fills the slot and 60 columns go on each side
    pixels = rng.integers(0, 256, (100, 400, 3), dtype=np.uint8)
    data = encode(pixels)
    assert crop_box(400, 100, 50, 80, None, "center", None) == (120.0, 0.0, 280.0, 100.0)
    decode_into(data, out)
    reference = np.asarray(Image.fromarray(pixels).resize((200, 50), Image.Resampling.BILINEAR).crop((60, 0, 140, 50)))
    assert np.abs(out.astype(int) - reference).mean() < 2  # one resampling step vs resize-then-crop
    chw = np.empty((3, 50, 80), np.uint8)
    decode_into(data, chw, layout="chw")
    assert np.array_equal(chw, out.transpose(2, 0, 1))
    # random crops move along the axis that sticks out only
    boxes = {crop_box(400, 100, 50, 80, None, "random", s) for s in range(50)}
    assert len(boxes) > 20 and all(b[1] == 0 and b[3] == 100 and b[2] - b[0] == 160 and 0 <= b[0] <= 240 for b in boxes)
    # a size too small to cover the slot is raised to the covering scale (it used to stretch the image)
    assert crop_box(400, 100, 50, 80, 20, "center", None) == (120.0, 0.0, 280.0, 100.0)
    # a larger size zooms in, keeping the aspect ratio
    assert crop_box(400, 100, 50, 80, 100, "center", None) == (160.0, 25.0, 240.0, 75.0)
    # any shapes: the box keeps the slot's aspect ratio, lies in the image, and spans one whole side
    for _ in range(300):
        width, height, out_w, out_h = (int(v) for v in rng.integers(1, 600, 4))
        for size in (None, int(rng.integers(1, 400))):
            left, top, right, bottom = crop_box(width, height, out_h, out_w, size, "random", int(rng.integers(1 << 30)))
            assert -1e-9 <= left < right <= width + 1e-9 and -1e-9 <= top < bottom <= height + 1e-9
            if size is None:
                assert math.isclose(right - left, width) or math.isclose(bottom - top, height)
            sides = (right - left) / out_w, (bottom - top) / out_h  # image pixels per output pixel, each axis
            assert abs(sides[0] - sides[1]) <= 1.01 * max(sides) / min(out_w, out_h) + 1e-9, (width, height, out_w, out_h, size)
    with pytest.raises(ValueError, match="size must be a positive"):
        decode_into(data, out, size=0)


# The fast JPEG path (hydrax.image.jpeg + hydrax.image.resample) against Pillow's: bytes may take
# the fast path, a file object always takes Pillow's, so the two can be compared directly.

def _jpeg(width, height, *, orientation=1, profile=None, mode="RGB", **options) -> bytes:
    from PIL import Image as _Image

    rng = np.random.default_rng(width * 7 + height)
    coarse = rng.integers(0, 256, (height // 8 + 1, width // 8 + 1, 3), np.uint8)
    image = _Image.fromarray(coarse).resize((width, height), _Image.Resampling.BICUBIC).convert(mode)
    if orientation != 1:
        exif = _Image.Exif()
        exif[0x0112] = orientation
        options["exif"] = exif.tobytes()
    if profile:
        options["icc_profile"] = profile
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=90, **options)
    return buffer.getvalue()


@pytest.mark.parametrize(("width", "height", "orientation", "profile"), [
    (500, 375, 1, None), (375, 500, 6, "AdobeRGB1998.icc"), (1200, 900, 8, "sRGB.icc"), (64, 48, 3, None),
    (224, 224, 5, "AdobeRGB1998.icc"), (31, 700, 7, None),
])
def test_the_fast_jpeg_path_fills_the_slot_as_pillows_path(width, height, orientation, profile):
    """Exactly, where libjpeg decodes to RGB (turned or DCT-scaled files); where it decodes planes
    (upright, resized without DCT scaling), within rounding of it, and with the colour conversion
    of its own 8-bit RGB exactly."""
    icc = (ICC / profile).read_bytes() if profile else None
    data = _jpeg(width, height, orientation=orientation, profile=icc, progressive=orientation == 7)
    slots = [((224, 224, 3), np.uint8, "hwc"), ((3, 224, 224), np.float32, "chw"), ((96, 128, 4), np.uint8, "hwc"),
             ((3, 64, 80), np.float16, "chw")]
    options = [{}, {"size": 256}, {"crop": "random", "flip": True, "seed": 11}, {"space": "linear"},
               {"coefs": Coefs.IMAGENET_SRGB}, {"resample": 1}, {"resample": 4}, {"space": "oklab"}]
    for (shape, dtype, layout), extra in itertools.product(slots, options):
        if (extra.get("space") == "oklab" and dtype == np.uint8) or ("coefs" in extra and 4 in shape):
            continue
        fast, pillow = np.zeros(shape, dtype), np.zeros(shape, dtype)
        decode_into(data, fast, layout=layout, **extra)
        decode_into(io.BytesIO(data), pillow, layout=layout, **extra)
        if orientation != 1 or max(width, height) > 1000:
            np.testing.assert_array_equal(fast, pillow, err_msg=f"{shape} {dtype} {extra}")
            continue
        rgb_shape = (shape[1], shape[2], 3) if layout == "chw" else shape[:2] + (3,)
        rgb, rgb_pillow = np.zeros(rgb_shape, np.uint8), np.zeros(rgb_shape, np.uint8)
        plain = {key: value for key, value in extra.items() if key not in ("space", "coefs")}
        decode_into(data, rgb, **plain)
        decode_into(io.BytesIO(data), rgb_pillow, **plain)
        _assert_within_rounding(rgb, rgb_pillow, f"{shape} {extra}")
        # the rest of the way is the same conversion: as if from a PNG of those 8-bit pixels
        png = io.BytesIO()
        Image.fromarray(rgb).save(png, "PNG", icc_profile=icc)
        again = np.zeros(shape, dtype)
        decode_into(png.getvalue(), again, layout=layout, **{k: v for k, v in extra.items() if k in ("space", "coefs")})
        np.testing.assert_array_equal(fast, again, err_msg=f"{shape} {dtype} {extra}")


def _assert_within_rounding(ours: np.ndarray, pillows: np.ndarray, what: str) -> None:
    """8-bit results of the plane path against Pillow's path: rounded once instead of four times,
    and clamped once at the end instead of after each step (saturated colours and the overshoot of
    Lanczos or bicubic at edges differ more)."""
    diff = np.abs(ours.astype(np.int32) - pillows)
    assert diff.mean() < 0.5 and (diff > 1).mean() < 0.02 and diff.max() <= 10, (what, diff.mean(), (diff > 1).mean(), diff.max())


@pytest.mark.parametrize("subsampling", [0, 1, 2], ids=["4:4:4", "4:2:2", "4:2:0"])
@pytest.mark.parametrize(("width", "height", "out"), [(500, 375, (224, 224)), (333, 251, (300, 117)), (97, 61, (150, 200))])
def test_every_chroma_subsampling_and_odd_size_takes_the_plane_path_within_rounding(subsampling, width, height, out,
                                                                                   monkeypatch):
    from hydrax.image import jpeg as jpeg_module

    data = _jpeg(width, height, subsampling=subsampling)
    header = jpeg_module.read_header(memoryview(data))
    assert jpeg_module.planar(header) and jpeg_module.decode_planes(memoryview(data), header) is not None
    for resample in (1, 2, 3):  # Lanczos, bilinear, bicubic: reducing and enlarging
        ours, pillows = np.zeros(out + (3,), np.uint8), np.zeros(out + (3,), np.uint8)
        decode_into(data, ours, resample=resample)
        decode_into(io.BytesIO(data), pillows, resample=resample)
        _assert_within_rounding(ours, pillows, f"{subsampling} {resample}")


def _tiny_jpeg(width: int, height: int, subsampling: str) -> bytes:
    """A ``width`` x ``height`` JPEG (1-8 a side) whose colours change along both axes, within RGB's
    range everywhere (so clamping plays no part), chroma ``subsampling`` "420", "422" or "440"
    (Pillow writes no 4:4:0: simplejpeg encodes)."""
    simplejpeg = pytest.importorskip("simplejpeg")
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([60 + 18 * x + 4 * y, 190 - 14 * x + 3 * y, 70 + 15 * y + 5 * x + 6 * (x * y % 3)], axis=2)
    return simplejpeg.encode_jpeg(np.ascontiguousarray(pixels.astype(np.uint8)), 90, colorspace="RGB",
                                  colorsubsampling=subsampling)


@pytest.mark.parametrize("subsampling", ["420", "422", "440"])
def test_jpegs_1_to_8_pixels_a_side_fill_the_slot_as_pillows_path(subsampling):
    """Issue 38, row 6. libjpeg-turbo interpolates half-width chroma (its "fancy" upsampling,
    which the plane path folds into its chroma filter) only for a chroma plane wider than 2
    samples; it replicates a narrower one (on both axes for 4:2:0). Images 1-4 pixels wide with
    chroma at half width therefore match Pillow's path to the bit (they take the RGB path); all
    others, in every slot form the plane path serves, are within 1 level of it but for its
    rounding: Pillow's path rounds the upsampled chroma, the RGB values and each resize pass, and
    is up to 1.4 levels from the exact result, where the plane path rounds once (within 0.5), so
    a value may be 2 levels apart, rarely."""
    from hydrax.image import jpeg as jpeg_module

    filters = (2, 1, 3, 4, 5)  # bilinear (the default), Lanczos, bicubic, box, Hamming
    wrong = []
    for width, height in itertools.product(range(1, 9), repeat=2):
        data = _tiny_jpeg(width, height, subsampling)
        header = jpeg_module.read_header(memoryview(data))
        assert header is not None and header.sampling[1:] == ((1, 1), (1, 1))
        replicated = subsampling != "440" and -(-width // 2) <= 2
        assert jpeg_module.planar(header) != replicated  # the others take the plane path
        # slots larger and smaller than the image on either axis (none of its own size, which the
        # RGB path fills); each form the plane path writes
        outs = [out for out in ((8, 8), (3, 5), (height + 1, width + 2), (max(1, height - 1), width), (height, width + 1))
                if out != (height, width)]
        diffs = []
        for index, (out, kind) in enumerate(itertools.product(outs, filters)):
            form = (index + index // len(filters)) % 5  # each form meets every filter
            extra = {"resample": kind}
            if form == 1:
                extra.update(crop="random", flip=True, seed=index)
            channels, dtype, layout = (4 if form == 2 else 3), (np.float32 if form == 3 else np.uint8), ("chw" if form == 4 else "hwc")
            shape = (channels,) + out if layout == "chw" else out + (channels,)
            ours, pillows = np.zeros(shape, dtype), np.zeros(shape, dtype)
            decode_into(data, ours, layout=layout, **extra)
            decode_into(io.BytesIO(data), pillows, layout=layout, **extra)
            scale = 255.0 if dtype == np.float32 else 1.0
            diffs.append(np.abs(ours.astype(np.float64) * scale - pillows.astype(np.float64) * scale).ravel())
        diff = np.concatenate(diffs)
        what = f"{width}x{height} {subsampling}: {diff.max():.2f} levels at most, {(diff > 1.001).mean():.1%} over 1"
        if not (diff.max() <= 2.001 and (diff > 1.001).mean() <= 0.05) or (replicated and diff.max() >= 1e-3):
            wrong.append((round(float(diff.max())), what))
    assert not wrong, [what for _, what in sorted(wrong, reverse=True)]


def test_without_libjpeg_the_rgb_path_gives_pillows_pixels_exactly(monkeypatch):
    from hydrax.image import jpeg as jpeg_module

    data = _jpeg(500, 375)
    monkeypatch.setenv(jpeg_module.LIBJPEG_ENV, "")
    jpeg_module.library.cache_clear()
    try:
        assert jpeg_module.library() is None
        ours, pillows = np.zeros((224, 224, 3), np.uint8), np.zeros((224, 224, 3), np.uint8)
        decode_into(data, ours)
        decode_into(io.BytesIO(data), pillows)
        np.testing.assert_array_equal(ours, pillows)
        monkeypatch.setenv(jpeg_module.LIBJPEG_ENV, "/nonexistent/libjpeg.so.62")
        jpeg_module.library.cache_clear()
        assert jpeg_module.library() is None
    finally:
        monkeypatch.delenv(jpeg_module.LIBJPEG_ENV)
        jpeg_module.library.cache_clear()
    assert jpeg_module.library() is not None


def test_plain_jpegs_take_the_fast_path_and_others_pillows(monkeypatch):
    from hydrax.image import decode as decode_module

    plain, gray = _jpeg(500, 375), _jpeg(60, 40, mode="L")
    cmyk = _jpeg(60, 40, mode="CMYK")
    slot = np.zeros((224, 224, 3), np.uint8)

    def no_pillow(*args, **kwargs):
        raise AssertionError("Pillow's path was taken")

    monkeypatch.setattr(decode_module, "_open_upright", no_pillow)
    decode_into(plain, slot)
    decode_into(memoryview(gray), slot[:40, :60])  # a view of a slot: not contiguous, converted through a copy
    with pytest.raises(AssertionError, match="Pillow's path"):
        decode_into(cmyk, slot)
    with pytest.raises(AssertionError, match="Pillow's path"):
        decode_into(plain, slot, resample=0)  # nearest stays with Pillow


def test_a_damaged_jpeg_fails_as_it_did_through_pillow():
    data = _jpeg(200, 150)
    slot = np.zeros((64, 64, 3), np.uint8)
    for damaged in (data[: len(data) // 2], data[:300]):
        messages = []
        for source in (damaged, io.BytesIO(damaged)):
            with pytest.raises(ImageError) as caught:
                decode_into(source, slot)
            messages.append(str(caught.value))
        assert messages[0] == messages[1]
        assert messages[0].startswith(f"bytes of length {len(damaged)}: ")


def test_an_unknown_filter_is_refused_in_pillows_words_for_jpegs_too():
    data = _jpeg(60, 40)
    for filter_ in (99, "bilinear"):
        with pytest.raises((ValueError, TypeError), match="resampl|filter"):
            decode_into(data, np.zeros((20, 20, 3), np.uint8), resample=filter_)


def test_any_image_decodes_into_a_view_of_a_slot():
    """A slot that is a view (not C-contiguous) is filled through a copy on both paths: a PNG
    (Pillow's path) as a JPEG (the fast path)."""
    from PIL import Image as _Image

    rng = np.random.default_rng(9)
    buffer = io.BytesIO()
    _Image.fromarray(rng.integers(0, 256, (40, 60, 3), np.uint8)).save(buffer, "PNG")
    for data in (buffer.getvalue(), _jpeg(60, 40)):
        for dtype in (np.uint8, np.float32, np.float16):
            whole, alone = np.zeros((32, 48, 3), dtype), np.zeros((20, 30, 3), dtype)
            decode_into(data, whole[:20, :30], coefs=Coefs.IMAGENET_SRGB)
            decode_into(data, alone, coefs=Coefs.IMAGENET_SRGB)
            np.testing.assert_array_equal(whole[:20, :30], alone)
            assert not whole[20:].any() and not whole[:, 30:].any()

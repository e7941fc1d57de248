"""Record differential-test fixtures for ``hydrax.image`` from the real hydrax 0.2.2.

Runs 0.2.2's image helpers (Coefs, write_hwc, write_chw, from_srgb_hwc, set_max_image_pixels,
the balanced and Oklab conversions, open_srgb) on fixed inputs and saves inputs and results to
``tests/fixtures/image_022.npz``, which ``tests/test_image_*.py`` replay against our
``hydrax.image``. Where 0.2.2 raises, the exception is recorded instead of a result.

How to rerun (from the repository root)::

    /work/venv-hydrax022/bin/pip install hydrax==0.2.2 numpy Pillow
    /work/venv-hydrax022/bin/python tools/compat/record_image_fixtures.py tests/fixtures/image_022.npz

An optional second argument is the folder of ICC profiles (default: the repository's
``tests/data/icc``, whose README names each profile's origin). The encoded test images, with those
profiles embedded, are stored in the fixture, so the tests do not need the profiles or the same
encoder.

Fixture format: an npz of arrays, plus ``meta``, a JSON string::

    {"hydrax_version", "pillow_version", "numpy_version",
     "arrays": {name: "ok" | "<ExceptionName>: <message>"},   # every case, by result name
     "max_image_pixels": [[threshold or null, value or null], ...],
     "images": {name: {"format", "mode", "profile"}},
     "open_srgb": [{"image", "mode", "convert", "result", "out_mode", "status"}, ...],
     "from_srgb": [{"name", "coefs", "dtype", "mode", "copy", "warnings", "status"}, ...]}

Array names: ``coefs/<set>/<dtype>``; ``write_{hwc,chw}/<src>/<set>/<dtype>`` with sources
``src/<src>``; ``from_srgb/<name>/{in,out,in_after}``; ``balanced/<dir>/<layout>/<dtype>/<scale>``
with inputs ``balanced_in/<layout>/<dtype>``; ``oklab/<dir>/hwc3`` with input ``oklab_in/hwc3``;
``open_srgb/<n>`` (the pixels of case n) and ``image/<name>`` (encoded bytes).
"""

from __future__ import annotations

import importlib.metadata
import io
import json
import sys
import warnings
from pathlib import Path

import numpy as np


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class Recorder:
    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}
        self.status: dict[str, str] = {}

    def put(self, name: str, value) -> None:
        self.arrays[name] = np.asarray(value)
        self.status.setdefault(name, "ok")

    def attempt(self, name: str, function) -> None:
        """Record function()'s array result under name, or its exception."""
        try:
            self.put(name, function())
        except Exception as exc:  # noqa: BLE001 - the exception is the recorded result
            self.status[name] = _error(exc)


def coef_sets(image):
    Coefs = image.Coefs
    return {
        "FRACTIONAL": Coefs.FRACTIONAL,
        "IMAGENET_SRGB": Coefs.IMAGENET_SRGB,
        "IMAGENET_SRGB_ALPHA": Coefs.IMAGENET_SRGB_ALPHA,
        "balanced_1": Coefs.balanced(),
        "balanced_2.5_alpha": Coefs.balanced(2.5, alpha=True),
        "balanced_0.5": Coefs.balanced(0.5),
        "custom_1col": Coefs([[2.0], [-1.0]]),
    }


# Which coefficient sets apply to which source (by channel count).
SETS_FOR = {3: ["FRACTIONAL", "IMAGENET_SRGB", "balanced_1", "balanced_0.5", "custom_1col"],
            4: ["FRACTIONAL", "IMAGENET_SRGB_ALPHA", "balanced_2.5_alpha", "custom_1col"]}


def record_coefs(rec: Recorder, image) -> None:
    for name, coefs in coef_sets(image).items():
        for dtype in ("float16", "float32", "float64"):
            rec.put(f"coefs/{name}/{dtype}", coefs[dtype])


def record_write(rec: Recorder, image, rng) -> None:
    sources = {
        "rgb": rng.integers(0, 256, (5, 4, 3), dtype=np.uint8),
        "rgba": rng.integers(0, 256, (5, 4, 4), dtype=np.uint8),
    }
    sets = coef_sets(image)
    for src_name, src in sources.items():
        rec.put(f"src/{src_name}", src)
        h, w, c = src.shape
        for layout, write, shape in (("hwc", image.write_hwc, (h, w, c)), ("chw", image.write_chw, (c, h, w))):
            for dtype in ("float32", "float64"):
                for set_name in ["none", *SETS_FOR[c]]:
                    coefs = None if set_name == "none" else sets[set_name]

                    def run(write=write, shape=shape, dtype=dtype, coefs=coefs, src=src):
                        out = np.zeros(shape, dtype)
                        write(src, out, coefs)
                        return out

                    rec.attempt(f"write_{layout}/{src_name}/{set_name}/{dtype}", run)

            # Casting is "safe": these must fail.
            for bad_src, bad_dtype in (("float64", "float32"), ("float32", "uint8"), ("uint8", "int8")):
                def run_bad(write=write, shape=shape, bad_src=bad_src, bad_dtype=bad_dtype, src=src):
                    out = np.zeros(shape, bad_dtype)
                    write(src.astype(bad_src), out)
                    return out

                rec.attempt(f"write_{layout}/{src_name}/cast_{bad_src}_to_{bad_dtype}", run_bad)


def record_from_srgb(rec: Recorder, image, rng) -> list[dict]:
    sets = coef_sets(image)
    cases = []
    halves = np.array([[[0.5, 1.5, 2.5], [-3.0, 300.0, 254.5], [255.5, 127.49, 127.51]]])
    inputs = {
        # exact halves through the identity-like custom coefficients: round half to even
        "halves": (halves, "identity", None),
        "frac_rgb": (rng.uniform(-0.1, 1.1, (4, 3, 3)), "FRACTIONAL", None),
        "frac_rgba_mode": (rng.uniform(0.0, 1.0, (4, 3, 4)), "FRACTIONAL", "RGBA"),
        "frac_rgba_premul": (rng.uniform(0.0, 1.0, (4, 3, 4)), "FRACTIONAL", "RGBa"),
        "imagenet": (rng.normal(0.0, 1.5, (3, 5, 3)), "IMAGENET_SRGB", "RGB"),
        "balanced": (rng.uniform(-1.2, 1.2, (3, 5, 4)), "balanced_2.5_alpha", None),
        "grey": (rng.uniform(0.0, 1.0, (3, 5)), "FRACTIONAL", "L"),
        "nan": (np.array([[[np.nan, 0.25, 1.0], [0.5, np.nan, -np.inf]]]), "FRACTIONAL", None),
    }
    identity = image.Coefs([[1.0], [0.0]])
    for name, (data, set_name, mode) in inputs.items():
        coefs = identity if set_name == "identity" else sets[set_name]
        for dtype in ("float32", "float64"):
            for copy in (False, True):
                key = f"from_srgb/{name}/{dtype}/copy{int(copy)}"
                given = np.array(data, dtype=dtype)
                rec.put(f"{key}/in", given.copy())
                case = {"name": key, "coefs": set_name, "dtype": dtype, "mode": mode, "copy": copy}
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    try:
                        out = image.from_srgb_hwc(given, coefs, mode=mode, copy=copy)
                    except Exception as exc:  # noqa: BLE001
                        case["status"] = _error(exc)
                    else:
                        case["status"] = "ok"
                        case["out_mode"] = out.mode
                        rec.put(f"{key}/out", np.asarray(out))
                        rec.put(f"{key}/in_after", given)
                case["warnings"] = sorted({w.category.__name__ for w in caught})
                cases.append(case)
    return cases


def record_max_pixels(image) -> list:
    from PIL import Image

    before = Image.MAX_IMAGE_PIXELS
    found = []
    for threshold in (1000, 1001, 2, 1, 0, 178956970, None):
        image.set_max_image_pixels(threshold)
        found.append([threshold, Image.MAX_IMAGE_PIXELS])
    Image.MAX_IMAGE_PIXELS = before
    return found


def record_balanced(rec: Recorder, image, rng) -> None:
    shapes = {"hwc": (2, 4, 5, 4), "chw": (2, 4, 5, 3)}
    for layout, shape in shapes.items():
        for dtype in ("float32", "float64"):
            data = rng.uniform(-0.2, 1.2, shape).astype(dtype)
            rec.put(f"balanced_in/{layout}/{dtype}", data)
            for scale in (1.0, 2.5):
                to_bal = getattr(image, f"convert_frac_to_balanced_{layout}")
                to_frac = getattr(image, f"convert_balanced_to_frac_{layout}")

                def forward(data=data, to_bal=to_bal, scale=scale):
                    out = data.copy()
                    to_bal(out, scale)
                    return out

                def backward(data=data, to_frac=to_frac, scale=scale):
                    out = data.copy()
                    to_frac(out, scale)
                    return out

                rec.attempt(f"balanced/to_balanced/{layout}/{dtype}/{scale}", forward)
                rec.attempt(f"balanced/to_frac/{layout}/{dtype}/{scale}", backward)


def record_oklab(rec: Recorder, image, rng) -> None:
    # White, black, the primaries, a grey, then random colours; as one (1, N, 3) HWC image.
    fixed = np.array([[1, 1, 1], [0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1], [0.5, 0.5, 0.5]], dtype=np.float64)
    data = np.concatenate([fixed, rng.uniform(0, 1, (10, 3))])[None]
    rec.put("oklab_in/hwc3", data)

    def forward():
        out = data.copy()
        image.convert_srgb_to_oklab_frac_hwc(out)
        return out

    def round_trip():
        out = data.copy()
        image.convert_srgb_to_oklab_frac_hwc(out)
        image.convert_oklab_to_srgb_frac_hwc(out)
        return out

    rec.attempt("oklab/to_oklab/hwc3", forward)
    rec.attempt("oklab/round_trip/hwc3", round_trip)

    # 0.2.2 cannot do these (defect 5): the outcome is the recorded exception.
    def chw():
        out = np.ascontiguousarray(np.moveaxis(data, -1, -3))
        image.convert_srgb_to_oklab_frac_chw(out)
        return out

    def hwc4():
        out = np.concatenate([data, np.full(data.shape[:-1] + (1,), 0.75)], axis=-1)
        image.convert_srgb_to_oklab_frac_hwc(out)
        return out

    def back_chw():
        out = np.ascontiguousarray(np.moveaxis(data, -1, -3))
        image.convert_oklab_to_srgb_frac_chw(out)
        return out

    rec.attempt("oklab/to_oklab/chw3", chw)
    rec.attempt("oklab/to_oklab/hwc4", hwc4)
    rec.attempt("oklab/to_srgb/chw3", back_chw)


def make_images(rng, icc_dir: Path) -> tuple[dict[str, bytes], dict[str, dict]]:
    from PIL import Image

    # A smooth ramp plus noise, so that every profile's curves are exercised across the range.
    h, w = 6, 8
    ramp = np.linspace(0, 255, h * w).reshape(h, w)
    rgb = np.stack([ramp, ramp[::-1], ramp.T.reshape(h, w)], axis=-1)
    rgb = np.clip(rgb + rng.integers(-30, 31, rgb.shape), 0, 255).astype(np.uint8)
    alpha = rng.integers(0, 256, (h, w, 1), dtype=np.uint8)
    pictures = {
        "RGB": Image.fromarray(rgb),
        "RGBA": Image.fromarray(np.concatenate([rgb, alpha], axis=-1)),
        "L": Image.fromarray(rgb[..., 1]),
    }
    pictures["P"] = pictures["RGB"].quantize(16)
    plan = [
        ("rgb_png_adobe", "RGB", "PNG", "AdobeRGB1998"),
        ("rgb_png_prophoto", "RGB", "PNG", "ProPhotoRGB"),
        ("rgb_png_srgb", "RGB", "PNG", "sRGB"),
        ("rgb_png_compat_adobe", "RGB", "PNG", "compatibleWithAdobeRGB1998"),
        ("rgb_jpeg_adobe", "RGB", "JPEG", "AdobeRGB1998"),
        ("rgb_jpeg_prophoto", "RGB", "JPEG", "ProPhotoRGB"),
        ("rgba_png_adobe", "RGBA", "PNG", "AdobeRGB1998"),
        ("l_png_gray", "L", "PNG", "Gray"),
        ("p_png_adobe", "P", "PNG", "AdobeRGB1998"),
        ("rgb_png_none", "RGB", "PNG", None),
        ("rgba_png_none", "RGBA", "PNG", None),
        ("l_png_none", "L", "PNG", None),
    ]
    encoded, described = {}, {}
    for name, mode, fmt, profile in plan:
        options = {"quality": 95} if fmt == "JPEG" else {}
        if profile is not None:
            options["icc_profile"] = (icc_dir / f"{profile}.icc").read_bytes()
        buffer = io.BytesIO()
        pictures[mode].save(buffer, fmt, **options)
        encoded[name] = buffer.getvalue()
        described[name] = {"format": fmt, "mode": mode, "profile": profile}
    return encoded, described


def record_open_srgb(rec: Recorder, image, encoded: dict[str, bytes]) -> list[dict]:
    converts = {"relative": image.CONVERT_RELATIVE, "perceptual": image.CONVERT_PERCEPTUAL}
    cases = []
    for name, data in encoded.items():
        rec.put(f"image/{name}", np.frombuffer(data, dtype=np.uint8))
        for mode in ("RGB", "RGBA", "RGBa", "L"):
            for convert_name, convert in converts.items():
                if convert_name == "perceptual" and mode != "RGB":
                    continue
                case = {"image": name, "mode": mode, "convert": convert_name}
                try:
                    out = image.open_srgb(io.BytesIO(data), mode=mode, convert=convert)
                except Exception as exc:  # noqa: BLE001
                    case["status"] = _error(exc)
                else:
                    case["status"] = "ok"
                    case["out_mode"] = out.mode
                    case["result"] = f"open_srgb/{len(cases)}"
                    rec.put(case["result"], np.asarray(out))
                cases.append(case)
    return cases


def main(argv: list[str]) -> int:
    from hydrax import image

    version = importlib.metadata.version("hydrax")
    if version != "0.2.2" or "site-packages" not in image.__file__:
        print(f"this must run hydrax 0.2.2 from a virtual environment, not {version} at {image.__file__}", file=sys.stderr)
        return 2
    out_path = Path(argv[1]) if len(argv) > 1 else Path("tests/fixtures/image_022.npz")
    icc_dir = Path(argv[2]) if len(argv) > 2 else Path(__file__).resolve().parents[2] / "tests" / "data" / "icc"

    rng = np.random.default_rng(20240324)
    rec = Recorder()
    record_coefs(rec, image)
    record_write(rec, image, rng)
    from_srgb = record_from_srgb(rec, image, rng)
    max_pixels = record_max_pixels(image)
    record_balanced(rec, image, rng)
    record_oklab(rec, image, rng)
    encoded, described = make_images(rng, icc_dir)
    opened = record_open_srgb(rec, image, encoded)

    import PIL

    meta = {
        "hydrax_version": version,
        "pillow_version": PIL.__version__,
        "numpy_version": np.__version__,
        "arrays": rec.status,
        "max_image_pixels": max_pixels,
        "images": described,
        "open_srgb": opened,
        "from_srgb": from_srgb,
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out_path, meta=np.array(json.dumps(meta, sort_keys=True)), **rec.arrays)
    failed = sorted(k for k, v in rec.status.items() if v != "ok")
    print(f"wrote {out_path} ({out_path.stat().st_size} bytes, {len(rec.arrays)} arrays); 0.2.2 raised for: {failed}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""Benchmark: JPEG bytes to a finished batch slot, per core, against the usual alternatives.

    PYTHONPATH=. python tools/bench/bench_image.py [--images 200] [--repeat 7] [--width 500 --height 375] [--out 224]

(``PYTHONPATH=.`` from the checkout's root: a script's own folder comes first on ``sys.path``,
so without it the hydrax installed in the environment is measured, not the checkout's.)

Needs ``opencv-python-headless`` besides hydrax's image extra (Pillow, simplejpeg). Generates
``--images`` photo-like JPEGs (q90, about 60 kB at 500x375: coarse colour structure with fine
grain), once without a profile and once with Adobe RGB (1998) embedded, pins itself to one
core, and fills a ``--out`` square slot from each (resized by the smallest scale that covers
the slot, centre crop) by:

- ``decode_into`` from bytes: the plane path (libjpeg-turbo's Y, Cb and Cr planes, then one
  kernel call), for uint8 HWC, float32 CHW with ``Coefs.IMAGENET_SRGB``, Adobe RGB input, and a
  random crop with flip;
- ``decode_into`` from a file object: Pillow's path, which every JPEG took before (for the record);
- simplejpeg decode + ``cv2.resize`` (bilinear, not antialiased) + crop, and OpenCV's own
  ``imdecode`` + ``cv2.resize``: what a user writes by hand;
- the decode alone, by Pillow and by simplejpeg (no resize): the floor.

With ``--random-resized``, it measures an Inception-style random resized crop instead, for
500x375 and 1600x1200 photos side by side (``--images`` of each): ``decode_into(...,
crop="random_resized")``; simplejpeg's full decode, a numpy crop of the same box and
``cv2.resize``; Pillow's full decode, crop and resize (bilinear); torchvision's
``RandomResizedCrop`` on the Pillow image where torchvision imports. The others get their boxes
computed beforehand (hydrax draws its own, inside the timing).

Runs are interleaved; each figure is the median over ``--repeat`` passes of CPU ms per image
(``time.process_time``, so a busy machine moves it less than wall time), and ratios are to
Pillow's path in the same run. PSNR (uint8 rows) is against a reference made in float from the
full-size decode with a Lanczos filter over the same crop.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import time
from pathlib import Path

import numpy as np
from PIL import Image

from hydrax.image import Coefs, decode_into, random_resized_box
from hydrax.image.decode import crop_box

ICC = Path(__file__).resolve().parents[2] / "tests" / "data" / "icc"


def photos(count: int, width: int, height: int, profile: bytes | None) -> list[bytes]:
    """Photo-like JPEGs: smooth colour structure at two scales plus a fine grain, q90."""
    rng = np.random.default_rng(0)
    out = []
    for _ in range(count):
        coarse = rng.integers(0, 256, (height // 24, width // 24, 3), dtype=np.uint8)
        image = Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC)
        noisy = np.clip(np.asarray(image, np.int16) + rng.integers(-12, 13, (height, width, 3)), 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        params = {"icc_profile": profile} if profile else {}
        Image.fromarray(noisy).save(buffer, "JPEG", quality=90, **params)
        out.append(buffer.getvalue())
    return out


def psnr(result: np.ndarray, reference: np.ndarray) -> float:
    error = np.mean((result.astype(np.float64) - reference) ** 2)
    return float("inf") if error == 0 else 10 * np.log10(255.0**2 / error)


def lanczos_reference(data: bytes, out: int) -> np.ndarray:
    """The slot as a float reference: full decode, Lanczos over the same box, per channel in float."""
    image = Image.open(io.BytesIO(data)).convert("RGB")
    box = crop_box(image.width, image.height, out, out, None, "center", None)
    planes = [np.asarray(Image.fromarray(np.asarray(image, np.float32)[:, :, c], "F").resize((out, out), Image.Resampling.LANCZOS, box=box))
              for c in range(3)]
    return np.clip(np.stack(planes, axis=2), 0, 255)


def runs_for(out: int):
    import cv2
    import simplejpeg

    cv2.setNumThreads(1)
    slot = np.empty((out, out, 3), np.uint8)
    chw = np.empty((3, out, out), np.float32)
    decoded = np.empty(4000 * 4000 * 3, np.uint8)

    def crop_to_slot(image: np.ndarray) -> np.ndarray:
        height, width = image.shape[:2]
        scale = out / min(height, width)
        resized = cv2.resize(image, (max(out, round(width * scale)), max(out, round(height * scale))), interpolation=cv2.INTER_LINEAR)
        top, left = (resized.shape[0] - out) // 2, (resized.shape[1] - out) // 2
        slot[...] = resized[top : top + out, left : left + out]
        return slot

    def pillow_alone(data):
        Image.open(io.BytesIO(data)).load()

    return slot, chw, {
        # the new path's slot forms next to each other, so the ratios between them see the same machine
        "decode_into (new), uint8 HWC": ("plain", lambda d: decode_into(d, slot)),
        "decode_into (new), float32 CHW + Coefs": ("plain", lambda d: decode_into(d, chw, layout="chw", coefs=Coefs.IMAGENET_SRGB)),
        "decode_into (new), Adobe RGB, uint8 HWC": ("adobe", lambda d: decode_into(d, slot)),
        "decode_into (new), random crop + flip": ("plain", lambda d: decode_into(d, slot, crop="random", flip=True, seed=len(d))),
        "decode_into (Pillow's path), uint8 HWC": ("plain", lambda d: decode_into(io.BytesIO(d), slot)),
        "simplejpeg + cv2.resize, uint8 HWC": ("plain", lambda d: crop_to_slot(simplejpeg.decode_jpeg(d, buffer=decoded))),
        "OpenCV imdecode + cv2.resize, uint8 HWC": ("plain", lambda d: crop_to_slot(cv2.cvtColor(cv2.imdecode(np.frombuffer(d, np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB))),
        "Pillow decode alone": ("plain", pillow_alone),
        "simplejpeg decode alone": ("plain", lambda d: simplejpeg.decode_jpeg(d, buffer=decoded)),
        "decode_into (Pillow's path), float32 CHW": ("plain", lambda d: decode_into(io.BytesIO(d), chw, layout="chw", coefs=Coefs.IMAGENET_SRGB)),
        "decode_into (Pillow's path), Adobe RGB": ("adobe", lambda d: decode_into(io.BytesIO(d), slot)),
    }


def random_resized_runs(out: int, inputs: list[bytes]):
    """The random resized crop contenders for ``inputs``; the item's seed is its index."""
    import cv2
    import simplejpeg

    cv2.setNumThreads(1)
    slot = np.empty((out, out, 3), np.uint8)
    decoded = np.empty(4000 * 4000 * 3, np.uint8)
    boxes = [random_resized_box(*Image.open(io.BytesIO(data)).size, seed) for seed, data in enumerate(inputs)]

    def hydrax_run(seed, data):
        decode_into(data, slot, crop="random_resized", seed=seed)

    def simplejpeg_run(seed, data):
        left, top, right, bottom = boxes[seed]
        pixels = simplejpeg.decode_jpeg(data, buffer=decoded)
        slot[...] = cv2.resize(pixels[top:bottom, left:right], (out, out), interpolation=cv2.INTER_LINEAR)

    def pillow_run(seed, data):
        image = Image.open(io.BytesIO(data)).convert("RGB")
        slot[...] = np.asarray(image.crop(boxes[seed]).resize((out, out), Image.Resampling.BILINEAR))

    runs = {"hydrax decode_into, random_resized": hydrax_run, "simplejpeg + numpy crop + cv2.resize": simplejpeg_run,
            "Pillow decode + crop + resize": pillow_run}
    try:
        from torchvision.transforms import functional
    except ImportError:
        return runs

    def torchvision_run(seed, data):
        image = Image.open(io.BytesIO(data)).convert("RGB")
        left, top, right, bottom = boxes[seed]
        crop = functional.resized_crop(image, top, left, bottom - top, right - left, [out, out], antialias=True)
        slot[...] = np.asarray(crop)

    runs["torchvision resized_crop (PIL)"] = torchvision_run
    return runs


def bench_random_resized(args) -> None:
    """Images per CPU second of each random resized crop contender, 500x375 and 1600x1200 side by side."""
    core = min(os.sched_getaffinity(0))
    print(f"random resized crop into {args.out}x{args.out}, uint8 HWC, bilinear; core {core} only; "
          f"medians of {args.repeat} interleaved passes over {args.images} photos q90 of each size")
    print(f"{'photos':10} {'path':40} {'CPU ms/img':>10} {'img/s/core':>10}")
    for width, height in ((500, 375), (1600, 1200)):
        inputs = photos(args.images, width, height, None)
        runs = random_resized_runs(args.out, inputs)
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.repeat):
            for name, run in runs.items():
                started = time.process_time()
                for seed, data in enumerate(inputs):
                    run(seed, data)
                times[name].append((time.process_time() - started) / len(inputs) * 1e3)
        medians = {name: statistics.median(values) for name, values in times.items()}
        for name, ms in medians.items():
            print(f"{width}x{height:<6} {name:40} {ms:10.3f} {1e3 / ms:10,.0f}")
        ours = medians.pop("hydrax decode_into, random_resized")
        best = min(medians, key=medians.get)
        print(f"{width}x{height:<6} hydrax / best other ({best}): {medians[best] / ours:.2f}x; "
              f"load average {os.getloadavg()[0]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--width", type=int, default=500)
    parser.add_argument("--height", type=int, default=375)
    parser.add_argument("--out", type=int, default=224)
    parser.add_argument("--psnr-images", type=int, default=40, help="images the PSNR is averaged over")
    parser.add_argument("--random-resized", action="store_true", help="bench the random resized crop instead")
    args = parser.parse_args()
    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    if args.random_resized:
        bench_random_resized(args)
        return
    inputs = {"plain": photos(args.images, args.width, args.height, None),
              "adobe": photos(args.images, args.width, args.height, (ICC / "AdobeRGB1998.icc").read_bytes())}
    slot, _, runs = runs_for(args.out)
    quality = {}
    references = [lanczos_reference(data, args.out) for data in inputs["plain"][: args.psnr_images]]
    for name, (kind, run) in runs.items():
        if kind == "plain" and "uint8" in name and "random" not in name:
            scores = []
            for data, reference in zip(inputs["plain"], references):
                run(data)  # every uint8 row fills `slot`
                scores.append(psnr(slot, reference))
            quality[name] = statistics.mean(scores)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeat):
        for name, (kind, run) in runs.items():
            started = time.process_time()
            for data in inputs[kind]:
                run(data)
            times[name].append((time.process_time() - started) / args.images * 1e3)
    medians = {name: statistics.median(values) for name, values in times.items()}
    base = medians["decode_into (Pillow's path), uint8 HWC"]
    load = os.getloadavg()[0]
    print(f"{args.images} JPEGs {args.width}x{args.height} q90 (mean {np.mean([len(d) for d in inputs['plain']]) / 1e3:.0f} kB) "
          f"into a {args.out}x{args.out} slot; core {core} only; medians of {args.repeat} interleaved passes; load average {load:.2f}")
    print(f"{'path':44} {'CPU ms/img':>10} {'img/s/core':>10} {'vs Pillow path':>14} {'PSNR dB':>8}")
    for name, ms in medians.items():
        score = f"{quality[name]:8.1f}" if name in quality else f"{'-':>8}"
        print(f"{name:44} {ms:10.3f} {1e3 / ms:10,.0f} {base / ms:13.2f}x {score}")
    new = medians["decode_into (new), uint8 HWC"]
    print(f"new vs simplejpeg + cv2.resize: {medians['simplejpeg + cv2.resize, uint8 HWC'] / new:.2f}x; "
          f"float32 CHW / uint8: {medians['decode_into (new), float32 CHW + Coefs'] / new:.2f}; "
          f"Adobe RGB / uint8: {medians['decode_into (new), Adobe RGB, uint8 HWC'] / new:.2f}")


if __name__ == "__main__":
    main()

"""Benchmark: a loader that decodes JPEG shards into 224x224 slots, end to end.

    python tools/bench/bench_decode_loader.py [--images 2000] [--processes 2] [--epochs 3] [--repeat 3]

Writes ``--images`` photo-like 500x375 q90 JPEGs (the generator of ``bench_image.py``) into
WebDataset shards once (cached under ``--cache-dir``), then reads a whole epoch of them with a
``Dataloader`` of ``--processes`` loaders over a ``ShardSet``, batch 64, uint8 (224, 224, 3), each
item filled by:

- ``new``: ``decode_into(sample["jpg"], slot)``: the bytes, so the fast JPEG path;
- ``pillow``: ``decode_into(io.BytesIO(sample["jpg"]), slot)``: Pillow's path, which every JPEG
  took before;
- ``cv2``: simplejpeg + ``cv2.resize`` + crop, written by hand (only if OpenCV is installed).

Each run is a fresh subprocess over ``--epochs`` epochs; runs are interleaved and the table shows
medians of images/s after the first batch. Next to every round of loader runs, the same files are
decoded by tight ``decode_into`` loops pinned to one core each (fresh subprocesses, no loader): one
loop alone, which is the single-core rate, and ``--processes`` loops at once, which is what this
machine's cores give together. The loader's rate is set against ``processes x`` the single-core
rate of the same round, and against the loops at once; the medians of those ratios are shown,
so a host that changes speed between rounds moves both sides of each ratio.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_image import photos  # noqa: E402

BATCH = 64
PINNED_SECONDS = 3.0
SIDE = 224


def make_shards(folder: Path, count: int) -> list[str]:
    from hydrax.shards.writer import ShardWriter

    done = folder / "done"
    if not done.exists():
        folder.mkdir(parents=True, exist_ok=True)
        with ShardWriter(str(folder / "photos-%04d.tar"), maxcount=500) as writer:
            for number, data in enumerate(photos(count, 500, 375, None)):
                writer.write({"__key__": f"{number:07d}", "jpg": data, "cls": str(number % 10)})
        done.write_text(str(count))
    return sorted(str(path) for path in folder.glob("photos-*.tar"))


def loader_function(mode: str):
    from hydrax.image import decode_into

    if mode == "new":
        def load(sample, arrays, seed):
            decode_into(sample["jpg"], arrays["image"])
    elif mode == "pillow":
        def load(sample, arrays, seed):
            decode_into(io.BytesIO(sample["jpg"]), arrays["image"])
    else:
        import cv2
        import simplejpeg

        cv2.setNumThreads(1)

        def load(sample, arrays, seed):
            image = simplejpeg.decode_jpeg(sample["jpg"])
            height, width = image.shape[:2]
            scale = SIDE / min(height, width)
            resized = cv2.resize(image, (max(SIDE, round(width * scale)), max(SIDE, round(height * scale))),
                                 interpolation=cv2.INTER_LINEAR)
            top, left = (resized.shape[0] - SIDE) // 2, (resized.shape[1] - SIDE) // 2
            arrays["image"][:] = resized[top : top + SIDE, left : left + SIDE]
    return load


def child(mode: str, urls: list[str], processes: int, epochs: int) -> dict:
    import jax.numpy as jnp

    from hydrax import DataGroup, Dataloader
    from hydrax.shards import ShardSet

    group = DataGroup(BATCH, ShardSet(urls), loader_arrays={"image": ((SIDE, SIDE, 3), np.uint8, jnp.uint8)})
    import resource

    first = None
    images = 0
    with Dataloader(loader_function(mode), group, loader_count=processes, end_at=("epoch", epochs)) as loader:
        for batch in loader:
            batch.arrays["image"].block_until_ready()
            if first is None:
                first = time.perf_counter()
                cpu = resource.getrusage(resource.RUSAGE_SELF)
                cpu_first = cpu.ru_utime + cpu.ru_stime
            else:
                images += BATCH
            del batch
        elapsed = time.perf_counter() - first
        cpu = resource.getrusage(resource.RUSAGE_SELF)
    return {"images_per_s": images / elapsed, "main_cpu": (cpu.ru_utime + cpu.ru_stime - cpu_first) / elapsed}


def pinned_loop(urls: list[str], core: int, start: float, seconds: float, limit: int = 300) -> float:
    """decode_into's images/s on ``core`` alone, from wall-clock time ``start`` for ``seconds``.

    Loops started together with the same ``start`` overlap for the whole measurement, whatever
    their import times were.
    """
    from hydrax.image import decode_into
    from hydrax.shards import ShardSet

    samples = ShardSet(urls)
    data = [bytes(samples[i]["jpg"]) for i in range(min(limit, len(samples)))]
    slot = np.empty((SIDE, SIDE, 3), np.uint8)
    os.sched_setaffinity(0, {core})
    for item in data[:20]:
        decode_into(item, slot)
    while time.time() < start:
        time.sleep(0.005)
    done = 0
    began = time.perf_counter()
    while time.perf_counter() - began < seconds:
        for item in data:
            decode_into(item, slot)
        done += len(data)
    return done / (time.perf_counter() - began)


def pinned_loops(args: argparse.Namespace, count: int) -> list[float]:
    """Rates of ``count`` pinned loops run at once, each in its own fresh process and core."""
    start = time.time() + 4.0
    cores = sorted(os.sched_getaffinity(0))
    commands = [[sys.executable, __file__, "--child", f"pinned:{cores[k % len(cores)]}:{start}", *common(args)] for k in range(count)]
    running = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for command in commands]
    outputs = [process.communicate()[0] for process in running]
    if any(process.returncode for process in running):
        raise SystemExit("a pinned decode loop failed")
    return [json.loads(output.strip().splitlines()[-1])["images_per_s"] for output in outputs]


def common(args: argparse.Namespace) -> list[str]:
    return ["--images", str(args.images), "--processes", str(args.processes), "--epochs", str(args.epochs),
            "--cache-dir", str(args.cache_dir)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cache-dir", type=Path, default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hydrax-bench")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    urls = make_shards(args.cache_dir / f"photos-{args.images}", args.images)
    if args.child and args.child.startswith("pinned:"):
        _, core, start = args.child.split(":")
        print(json.dumps({"images_per_s": pinned_loop(urls, int(core), float(start), PINNED_SECONDS)}))
        return
    if args.child:
        print(json.dumps(child(args.child, urls, args.processes, args.epochs)))
        return
    modes = ["new", "pillow"]
    try:
        import cv2  # noqa: F401

        modes.append("cv2")
    except ImportError:
        pass
    rates: dict[str, list[float]] = {mode: [] for mode in modes}
    main_cpu: dict[str, list[float]] = {mode: [] for mode in modes}
    versus_single: dict[str, list[float]] = {mode: [] for mode in modes}
    versus_together: dict[str, list[float]] = {mode: [] for mode in modes}
    singles, togethers = [], []
    for _ in range(args.repeat):
        single = pinned_loops(args, 1)[0]
        together = sum(pinned_loops(args, args.processes))
        for mode in modes:
            result = subprocess.run([sys.executable, __file__, "--child", mode, *common(args)], capture_output=True, text=True, check=True)
            figures = json.loads(result.stdout.strip().splitlines()[-1])
            rates[mode].append(figures["images_per_s"])
            main_cpu[mode].append(figures["main_cpu"])
        # the loops again after the loaders, so each round's reference brackets its loader runs
        single = (single + pinned_loops(args, 1)[0]) / 2
        together = (together + sum(pinned_loops(args, args.processes))) / 2
        singles.append(single)
        togethers.append(together)
        for mode in modes:
            versus_single[mode].append(rates[mode][-1] / (args.processes * single))
            versus_together[mode].append(rates[mode][-1] / together)
    print(f"{args.images} JPEGs 500x375 q90 in {len(urls)} shards x {args.epochs} epochs, {args.processes} loaders, batch {BATCH}, "
          f"uint8 {SIDE}x{SIDE}x3; medians of {args.repeat} interleaved rounds; load average {os.getloadavg()[0]:.2f}")
    print(f"{'loader function':16} {'images/s':>9} {'vs pillow':>10} {f'vs {args.processes} x single-core':>22} "
          f"{f'vs {args.processes} loops at once':>22} {'main process CPU':>17}")
    for mode in modes:
        rate = statistics.median(rates[mode])
        print(f"{mode:16} {rate:9,.0f} {rate / statistics.median(rates['pillow']):9.2f}x {statistics.median(versus_single[mode]):22.2f} "
              f"{statistics.median(versus_together[mode]):22.2f} {statistics.median(main_cpu[mode]):16.0%}")
    print(f"decode_into (new) in a pinned loop: {statistics.median(singles):,.0f} images/s on one core; "
          f"{statistics.median(togethers):,.0f} with {args.processes} loops at once, one per core "
          f"(rounds: {', '.join(f'{one:,.0f}/{both:,.0f}' for one, both in zip(singles, togethers))})")
    print(f"new, each round: vs {args.processes} x single-core {', '.join(f'{r:.2f}' for r in versus_single['new'])}; "
          f"vs {args.processes} loops at once {', '.join(f'{r:.2f}' for r in versus_together['new'])}")


if __name__ == "__main__":
    main()

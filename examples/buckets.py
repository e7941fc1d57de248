"""Train a Flax (nnx) + optax image tagger on photos of every shape, in aspect-ratio buckets.

Image generators and taggers train on photos as they come (portrait, square, panorama), each
batch of one shape and different batches of different shapes. What it shows:

- the photos' sizes read from the JPEG headers without decoding (``ShardSet.image_sizes``), and
  a plan made from them alone (``hydrax.image.plan_buckets``): a slot size per aspect ratio within
  a pixel budget, each photo in the bucket nearest its aspect, batch sizes that keep the pixels of
  a batch about constant and are multiples of the device count, small buckets merged, remainders
  passed to a neighbour; ``plan.summary()`` prints every decision;
- one ``DataGroup`` per bucket (``hydrax.bucket_groups``), read shard-aware
  (``shuffle_later="shardwise"``); the Dataloader interleaves them so they progress together;
- a loader function that decodes each photo straight into its bucket's slot
  (``decode_into``: cover the slot, crop at a random place, mirror half of them);
- global batches over every local device (``sharding=``), each bucket's batch one ``jax.Array``
  of its own shape; the model (convolutions and global average pooling) takes any height and
  width, and the jitted step compiles once per bucket shape, then reuses it.

The photos are synthetic and made once (several thousand JPEGs of many aspect ratios, with
``--tiny`` a few hundred), kept in tar shards under hydrax's cache or ``--data``. Each has some of
four tags, which the tagger learns to predict: ``warm`` (red and orange rather than blue and
green), ``stripes``, ``disc`` (a bright disc) and ``spots`` (small dark spots)::

    python examples/buckets.py
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python examples/buckets.py --tiny   # 8 CPU devices

``pip install 'hydrax[examples]'``.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import io
import os
import shutil
import sys
import tempfile
import time
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from PIL import Image

import hydrax
from hydrax import Dataloader
from hydrax.image import decode_into, plan_buckets
from hydrax.shards import ShardSet
from hydrax.shards.catalog import default_cache_dir
from hydrax.shards.writer import ShardWriter

TAGS = ("warm", "stripes", "disc", "spots")
# Photos' usual aspect ratios (width:height); a third of the photos have one drawn between them.
ASPECTS = ((2, 3), (3, 4), (1, 1), (4, 3), (3, 2), (16, 9), (9, 16), (2, 1))
SHARDS = 8
#: Part of the default data folder's name: changes whenever what write_photos writes does.
LAYOUT = "v1"
WARM = np.array([(205, 90, 45), (225, 150, 60), (185, 60, 60), (235, 185, 115)], float)
COOL = np.array([(45, 90, 200), (60, 150, 125), (70, 110, 165), (120, 170, 215)], float)


def draw_photo(rng: np.random.Generator, width: int, height: int, tags: set[str]) -> np.ndarray:
    """A width x height RGB photo (uint8) with the given tags: a two-colour gradient and noise,
    with stripes, a bright disc and dark spots where tagged. Lengths are in short sides, so a photo
    looks the same at every size and aspect."""
    short = min(width, height)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32) / short
    palette = WARM if "warm" in tags else COOL
    a, b = (palette[rng.integers(len(palette), size=2)] + rng.normal(0, 12, (2, 3))).astype(np.float32)
    angle = rng.uniform(0, 2 * np.pi)
    t = x * np.cos(angle) + y * np.sin(angle)
    t = (t - t.min()) / max(float(np.ptp(t)), 1e-6)
    image = a + (b - a) * t[..., None]
    if "stripes" in tags:
        turn, period = rng.uniform(0, np.pi), rng.uniform(0.08, 0.14)
        image += rng.uniform(30, 50) * np.sin(2 * np.pi * (x * np.cos(turn) + y * np.sin(turn)) / period)[..., None]
    if "disc" in tags:
        radius = rng.uniform(0.15, 0.25)
        cx, cy = rng.uniform(0.3, width / short - 0.3), rng.uniform(0.3, height / short - 0.3)
        inside = np.clip((radius - np.hypot(x - cx, y - cy)) * short / 2, 0, 1)[..., None]  # a soft edge
        image = image * (1 - inside) + np.array([245, 240, 225], np.float32) * inside
    if "spots" in tags:
        radius = max(1, round(0.035 * short))
        for cx, cy in rng.uniform(0, 1, (int(rng.integers(12, 20)), 2)) * (width, height):
            # only the square around the spot: the rest of the photo is left as it is
            rows = slice(max(0, int(cy) - radius), min(height, int(cy) + radius + 1))
            columns = slice(max(0, int(cx) - radius), min(width, int(cx) + radius + 1))
            yy, xx = np.ogrid[rows, columns]
            image[rows, columns][(yy - cy) ** 2 + (xx - cx) ** 2 < radius * radius] *= 0.25
    image += 5 * rng.standard_normal(image.shape, dtype=np.float32)
    return np.clip(image, 0, 255).astype(np.uint8)


def write_photos(folder: str, count: int, side: int, seed: int = 0) -> None:
    """``count`` photos in 8 shards ``photos-NN.tar`` in ``folder`` (fields ``jpg`` and ``tags``, the
    tags' names separated by spaces). Each photo's area is 1 to 2.5 times ``side`` squared; two
    thirds have a common aspect ratio, the others one drawn log-uniformly from 1:2.5 to 2.5:1."""
    rng = np.random.default_rng(seed)
    with ShardWriter(os.path.join(folder, "photos-%02d.tar"), maxcount=-(-count // SHARDS)) as sink:
        for i in range(count):
            if rng.uniform() < 2 / 3:
                w, h = ASPECTS[rng.integers(len(ASPECTS))]
                aspect = w / h
            else:
                aspect = float(np.exp(rng.uniform(-np.log(2.5), np.log(2.5))))
            area = side * side * rng.uniform(1, 2.5)
            width, height = max(8, round((area * aspect) ** 0.5)), max(8, round((area / aspect) ** 0.5))
            tags = {tag for tag in TAGS if rng.uniform() < 0.5}
            encoded = io.BytesIO()
            Image.fromarray(draw_photo(rng, width, height, tags)).save(encoded, "JPEG", quality=85)
            sink.write({"__key__": f"photo{i:05d}", "jpg": encoded.getvalue(), "tags": " ".join(sorted(tags))})


def photo_shards(folder: str, count: int, side: int) -> str:
    """The shards' pattern in ``folder``, written there first unless it holds them: into a
    temporary folder beside it, renamed when complete, so that a folder of that name is always whole."""
    pattern = os.path.join(folder, "photos-*.tar")
    if os.path.isdir(folder):
        if not glob.glob(os.path.join(folder, "photos-*.tar")):
            sys.exit(f"{folder} holds no photos-*.tar: name a folder that does not exist yet (the photos are made there) or "
                     "one an earlier run made")
        return pattern
    started = time.perf_counter()
    parent = os.path.dirname(os.path.abspath(folder))
    os.makedirs(parent, exist_ok=True)
    building = tempfile.mkdtemp(prefix=".photos-", dir=parent)
    try:
        write_photos(building, count, side)
        try:
            os.rename(building, folder)
        except OSError:
            if not os.path.isdir(folder):  # not another run that finished first
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    print(f"[buckets] wrote {count} photos into {folder} in {time.perf_counter() - started:.1f} s", flush=True)
    return pattern


def image_sizes_of(shards: ShardSet) -> tuple[np.ndarray, np.ndarray]:
    """The photos' upright widths and heights, read from their JPEG headers (none is decoded; an
    index made with ``hydrax shards index --sizes jpg`` would hold them already)."""
    return shards.image_sizes("jpg")


def load_photo(sample, arrays, seed):
    """Runs in a loader process, once per item, into a slot of its bucket's shape: the photo is
    resized to cover the slot, cropped at a place drawn from ``seed`` and mirrored for half of the
    seeds (none of which changes its tags)."""
    decode_into(sample["jpg"], arrays["image"], crop="random", flip=True, seed=seed)
    present = bytes(sample["tags"]).decode().split()
    arrays["tags"][...] = [tag in present for tag in TAGS]


def bucket_arrays(height: int, width: int) -> dict:
    """The loader arrays of a bucket whose slot is ``width`` x ``height``: uint8 pixels (a quarter
    of float32's bytes in the loaders' memory and on the way to the devices) and the tags."""
    return {"image": ((height, width, 3), np.uint8, jnp.uint8), "tags": ((len(TAGS),), np.float32, jnp.float32)}


class Tagger(nnx.Module):
    """Strided convolutions, then the average over every position: any height and width give
    one vector per image, so the same parameters serve every bucket."""

    def __init__(self, *, rngs: nnx.Rngs):
        self.stem = nnx.Conv(3, 32, kernel_size=(4, 4), strides=(4, 4), rngs=rngs)
        self.conv1 = nnx.Conv(32, 48, kernel_size=(3, 3), strides=(2, 2), rngs=rngs)
        self.conv2 = nnx.Conv(48, 64, kernel_size=(3, 3), rngs=rngs)
        self.head = nnx.Linear(64, len(TAGS), rngs=rngs)

    def __call__(self, images):
        x = images.astype(jnp.float32) / 127.5 - 1
        x = nnx.relu(self.stem(x))
        x = nnx.relu(self.conv1(x))
        x = nnx.relu(self.conv2(x))
        return self.head(x.mean(axis=(1, 2)))  # global average pooling: (batch, height, width, 64) -> (batch, 64)


#: The shape of every batch the train step was traced (so compiled) for. The function's Python
#: body runs only when jax traces it: once per new input shape, never for a shape seen before.
COMPILED: list[tuple[int, ...]] = []


@nnx.jit
def train_step(model: Tagger, optimizer: nnx.Optimizer, images, tags):
    COMPILED.append(images.shape)

    def loss_fn(model):
        logits = model(images)
        return optax.sigmoid_binary_cross_entropy(logits, tags).mean(), logits

    (loss, logits), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
    optimizer.update(model, grads)
    return loss, jnp.sum((logits > 0) == (tags > 0.5))  # tags right, judged before this step's update


def parameter_digest(model: nnx.Module) -> str:
    """sha256 of every parameter's bytes, in a fixed order: equal digests, identical models."""
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(nnx.state(model, nnx.Param)):
        digest.update(np.asarray(leaf).tobytes())
    return digest.hexdigest()


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--photos", type=int, help="photos to make (default 4000; --tiny: 400)")
    parser.add_argument("--side", type=int, help="a bucket's slot has about side x side pixels, its sides multiples of "
                        "side / 8 (default 128; --tiny: 64)")
    parser.add_argument("--batch-size", type=int, help="photos per batch in the square bucket; the other buckets' batches "
                        "have about as many pixels (default 32; --tiny: 16)")
    parser.add_argument("--epochs", type=int, help="epochs to train (default 4; --tiny: 2)")
    parser.add_argument("--every", type=int, help="print the loss every this many steps (default 50; --tiny: 10)")
    parser.add_argument("--loaders", type=int, help="loader processes (default 2; --tiny: 1)")
    parser.add_argument("--data", help="folder of the photo shards, made there on first use (default: under hydrax's "
                        "cache, $HYDRAX_CACHE or ~/.cache/hydrax, examples/buckets-...)")
    parser.add_argument("--tiny", action="store_true", help="a few hundred small photos, two epochs, one loader (what CI runs)")
    args = parser.parse_args(argv)
    if args.tiny:
        defaults = dict(photos=400, side=64, batch_size=16, epochs=2, every=10, loaders=1)
    else:
        defaults = dict(photos=4000, side=128, batch_size=32, epochs=4, every=50, loaders=2)
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if min(args.photos, args.batch_size, args.epochs, args.every, args.loaders) < 1 or args.side < 16:
        parser.error("--photos, --batch-size, --epochs, --every and --loaders must be at least 1, --side at least 16")
    if args.data is None:
        args.data = os.path.join(default_cache_dir(), "examples", f"buckets-{LAYOUT}-{args.photos}-{args.side}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    # One mesh axis over this host's devices: each batch is split along it, the model replicated.
    mesh = Mesh(np.array(jax.local_devices()), ("data",))
    batch_sharding, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())

    shards = ShardSet(photo_shards(args.data, args.photos, args.side))
    widths, heights = image_sizes_of(shards)
    # Batch sizes are multiples of the device count, so that every device gets an equal part of
    # each batch (on several hosts: times jax.process_count()).
    plan = plan_buckets(widths, heights, pixels=args.side ** 2, step=args.side // 8,
                        pixels_per_batch=args.batch_size * args.side ** 2, multiple_of=mesh.size, min_batches=3)
    print(f"[buckets] {len(shards)} photos in {len(shards.shard_sizes())} shards, {len(set(zip(widths, heights)))} sizes; "
          f"{mesh.size} device(s), {args.loaders} loader process(es), {args.epochs} epochs; the plan:", flush=True)
    print("\n".join("    " + line for line in plan.summary().splitlines()), flush=True)
    groups = hydrax.bucket_groups(plan, shards, bucket_arrays, seed=2024, shuffle_later="shardwise")
    bucket_of = {id(group): b for b, group in enumerate(groups)}

    model = Tagger(rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(3e-3), wrt=nnx.Param)
    nnx.update((model, optimizer), jax.device_put(nnx.state((model, optimizer)), replicated))

    started, step, delivered, shapes_of = time.perf_counter(), 0, Counter(), {b: set() for b in range(len(groups))}
    losses, right, seen = [], 0, 0
    with Dataloader(load_photo, groups, loader_count=args.loaders, end_at=("epoch", args.epochs),
                    sharding=batch_sharding) as loader:
        for batch in loader:
            images, tags = batch.arrays["image"], batch.arrays["tags"]  # (B, H, W, 3): B, H and W are the bucket's
            loss, correct = train_step(model, optimizer, images, tags)
            step += 1
            bucket = bucket_of[id(batch.group)]
            delivered[bucket] += 1
            shapes_of[bucket].add(images.shape)
            losses.append(loss)
            right, seen = right + correct, seen + tags.size
            if step % args.every == 0:
                size, height, width = images.shape[:3]
                print(f"[buckets] step {step}: loss {float(loss):.4f} (a batch of {size} at {width}x{height})", flush=True)
            if batch.epoch_batch == loader.batches_per_epoch - 1:
                print(f"[buckets] epoch {batch.epoch}: mean loss {float(jnp.mean(jnp.stack(losses))):.4f}, "
                      f"tags right {int(right) / seen:.1%}", flush=True)
                losses, right, seen = [], 0, 0
            del batch, images, tags  # hand the batch slot back to the loaders
    print(f"[buckets] trained {step} steps in {time.perf_counter() - started:.1f} s", flush=True)
    for b, bucket in enumerate(plan.buckets):
        shapes = ", ".join(map(str, sorted(shapes_of[b])))
        print(f"[buckets] bucket {bucket.width}x{bucket.height}: {delivered[b]} batches ({bucket.batch_count} per epoch) "
              f"of shape {shapes}", flush=True)
    shapes = ", ".join(map(str, COMPILED))
    print(f"[buckets] the train step was compiled for {len(COMPILED)} batch shapes (batch, height, width, channels), "
          f"{len(set(COMPILED))} distinct: {shapes}", flush=True)
    print(f"[buckets] digest {parameter_digest(model)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

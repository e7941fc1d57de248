"""Train a Flax (nnx) + optax image classifier the ImageNet way: random resized crops for
training, a resize and centre crop for validation, both made by the decoder.

What it shows:

- training items decoded with ``decode_into(crop="random_resized", flip=True, seed=seed,
  coefs=Coefs.IMAGENET_SRGB)``: the Inception-style crop torchvision calls ``RandomResizedCrop``
  (a box of 8% to 100% of the photo's area and an aspect ratio from 3:4 to 4:3, drawn from the
  item's seed), resized to the whole slot, mirrored for half of the seeds, and standardised with
  ImageNet's channel means and deviations, straight into a float32 slot. Only the box is resized:
  a JPEG whose box is at least twice the slot is scaled down in the DCT domain as it decodes;
- validation items decoded as ImageNet evaluation does: the shorter side resized to 256/224 of
  the slot (``size=``), then the centre crop (``crop="center"``);
- a training ``DataGroup`` over a ``ShardSet`` read shard-aware (``shuffle_later="shardwise"``), a
  validation group after every epoch, and batches split over every local device (``sharding=``).

Every crop is a pure function of the item's seed, which is a function of the run's seed, the
epoch and the item: each epoch sees new crops of every photo, and two runs see the same ones.

The photos are synthetic and made once, into tar shards under hydrax's cache or ``--data``:
JPEGs of 300 to 600 pixels a side (``--tiny``: 160 to 320, with a 64x64 slot) of six classes,
told apart by their texture only (horizontal, vertical or diagonal stripes, checks, dots, none)
under random colours, gradients and blobs::

    python examples/random_resized_crop.py
    python examples/random_resized_crop.py --tiny     # what CI runs

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

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from PIL import Image

from hydrax import DataGroup, Dataloader
from hydrax.image import Coefs, decode_into
from hydrax.shards import ShardSet
from hydrax.shards.catalog import default_cache_dir
from hydrax.shards.writer import ShardWriter

CLASSES = ("horizontal stripes", "vertical stripes", "diagonal stripes", "checks", "dots", "plain")
#: Part of the default data folder's name: changes whenever what write_photos writes does.
LAYOUT = "v1"
#: ImageNet evaluation resizes the shorter side to 256 and takes the centre 224x224.
EVAL_RESIZE = 256 / 224


def draw_photo(rng: np.random.Generator, width: int, height: int, label: int) -> np.ndarray:
    """A width x height RGB photo (uint8) of class ``label``: a gradient between two random
    colours, a few soft blobs of others, the class's texture at a random scale and contrast
    (none for "plain"), and noise. Only the texture tells the classes apart."""
    short = min(width, height)
    # The smooth part (gradient and blobs) is drawn at 1/8 of the size and enlarged: much faster.
    low_w, low_h = -(-width // 8), -(-height // 8)
    y, x = np.mgrid[0:low_h, 0:low_w].astype(np.float32) * 8 / short  # in short sides, so the look is size-free
    a, b = rng.uniform(30, 225, (2, 3)).astype(np.float32)
    angle = rng.uniform(0, 2 * np.pi)
    t = x * np.cos(angle) + y * np.sin(angle)
    t = (t - t.min()) / max(float(np.ptp(t)), 1e-6)
    smooth = a + (b - a) * t[..., None]
    for _ in range(int(rng.integers(2, 5))):
        cx, cy = rng.uniform(0, width / short), rng.uniform(0, height / short)
        blob = np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * rng.uniform(0.05, 0.2) ** 2))[..., None]
        smooth += blob * (rng.uniform(20, 235, 3).astype(np.float32) - smooth) * rng.uniform(0.4, 0.8)
    smooth = Image.fromarray(np.clip(smooth, 0, 255).astype(np.uint8)).resize((width, height), Image.Resampling.BILINEAR)
    period, contrast = rng.uniform(0.07, 0.13) * short, rng.uniform(25, 50)
    rows, columns = np.arange(height, dtype=np.float32)[:, None], np.arange(width, dtype=np.float32)[None, :]
    wave_y, wave_x = np.sin(2 * np.pi * rows / period), np.sin(2 * np.pi * columns / period)
    name = CLASSES[label]
    if name == "diagonal stripes":  # either way: a mirrored photo stays in its class
        texture = np.sin(2 * np.pi * (rows + rng.choice((-1, 1)) * columns) / (period * 2 ** 0.5))
    elif name == "checks":
        texture = np.sign(wave_y * wave_x)
    elif name == "dots":
        texture = np.where(wave_y + wave_x > 1.2, np.float32(1.5), np.float32(-0.5))
    else:
        texture = {"horizontal stripes": wave_y, "vertical stripes": wave_x}.get(name, 0) + np.zeros((height, width), np.float32)
    image = np.asarray(smooth, np.float32) + contrast * texture[..., None]
    image += rng.integers(-8, 9, image.shape, dtype=np.int8)  # (uniform noise: a third of the time of normal noise)
    return np.clip(image, 0, 255).astype(np.uint8)


def write_photos(folder: str, counts: dict[str, int], sides: tuple[int, int], seed: int = 0) -> None:
    """``counts[split]`` photos of each split (``train``, ``val``) in 4 shards ``SPLIT-NN.tar``
    each, in ``folder``: fields ``jpg`` and ``cls`` (the class's number), keys ``SPLIT/photoNNNNN``.
    Classes take turns; widths and heights are drawn independently from ``sides`` (inclusive)."""
    rng = np.random.default_rng(seed)
    for split, count in counts.items():
        with ShardWriter(os.path.join(folder, f"{split}-%02d.tar"), maxcount=-(-count // 4)) as sink:
            for i in range(count):
                label = i % len(CLASSES)
                width, height = (int(side) for side in rng.integers(sides[0], sides[1] + 1, 2))
                encoded = io.BytesIO()
                Image.fromarray(draw_photo(rng, width, height, label)).save(encoded, "JPEG", quality=85)
                sink.write({"__key__": f"{split}/photo{i:05d}", "jpg": encoded.getvalue(), "cls": str(label)})


def photo_shards(folder: str, counts: dict[str, int], sides: tuple[int, int]) -> str:
    """``folder``, with the photos written there first unless it holds them: into a temporary
    folder beside it, renamed when complete, so that a folder of that name is always whole."""
    if os.path.isdir(folder):
        if not glob.glob(os.path.join(folder, "train-*.tar")):
            sys.exit(f"{folder} holds no train-*.tar: name a folder that does not exist yet (the photos are made there) or "
                     "one an earlier run made")
        return folder
    started = time.perf_counter()
    parent = os.path.dirname(os.path.abspath(folder))
    os.makedirs(parent, exist_ok=True)
    building = tempfile.mkdtemp(prefix=".photos-", dir=parent)
    try:
        write_photos(building, counts, sides)
        try:
            os.rename(building, folder)
        except OSError:
            if not os.path.isdir(folder):  # not another run that finished first
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    print(f"[rrc] wrote {sum(counts.values())} photos into {folder} in {time.perf_counter() - started:.1f} s", flush=True)
    return folder


def load_photo(sample, arrays, seed):
    """Runs in a loader process, once per item, for both groups (the key says which split the
    item is from). Everything random is drawn from ``seed``: the same crop in every run."""
    if sample["__key__"].startswith("val/"):
        side = arrays["image"].shape[0]
        decode_into(sample["jpg"], arrays["image"], crop="center", size=round(side * EVAL_RESIZE), coefs=Coefs.IMAGENET_SRGB)
    else:
        decode_into(sample["jpg"], arrays["image"], crop="random_resized", scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3),
                    flip=True, seed=seed, coefs=Coefs.IMAGENET_SRGB)
    arrays["label"][...] = int(bytes(sample["cls"]))


class Classifier(nnx.Module):
    """A strided stem (8x8 patches), two strided convolutions, the average over every position
    and a linear head: small enough to train on a CPU, for a slot of any size."""

    def __init__(self, *, rngs: nnx.Rngs):
        self.stem = nnx.Conv(3, 32, kernel_size=(8, 8), strides=(8, 8), rngs=rngs)
        self.conv1 = nnx.Conv(32, 64, kernel_size=(3, 3), strides=(2, 2), rngs=rngs)
        self.conv2 = nnx.Conv(64, 64, kernel_size=(3, 3), strides=(2, 2), rngs=rngs)
        self.head = nnx.Linear(64, len(CLASSES), rngs=rngs)

    def __call__(self, x):
        x = nnx.relu(self.stem(x))
        x = nnx.relu(self.conv1(x))
        x = nnx.relu(self.conv2(x))
        return self.head(x.mean(axis=(1, 2)))


@nnx.jit
def train_step(model: Classifier, optimizer: nnx.Optimizer, images, labels):
    def loss_fn(model):
        return optax.softmax_cross_entropy_with_integer_labels(model(images), labels).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)  # updates the model's parameters in place
    return loss


@nnx.jit
def count_correct(model: Classifier, images, labels):
    return jnp.sum(jnp.argmax(model(images), axis=-1) == labels)


def parameter_digest(model: nnx.Module) -> str:
    """sha256 of every parameter's bytes, in a fixed order: equal digests, identical models."""
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(nnx.state(model, nnx.Param)):
        digest.update(np.asarray(leaf).tobytes())
    return digest.hexdigest()


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, help="epochs to train (default 4; --tiny: 5)")
    parser.add_argument("--side", type=int, help="the slot's side in pixels (default 224; --tiny: 64)")
    parser.add_argument("--batch-size", type=int, help="global batch size, a multiple of the device count (default 32; --tiny: 16)")
    parser.add_argument("--loaders", type=int, help="loader processes (default 2; --tiny: 1)")
    parser.add_argument("--data", help="folder of the photo shards, made there on first use (default: under hydrax's "
                        "cache, $HYDRAX_CACHE or ~/.cache/hydrax, examples/rrc-...)")
    parser.add_argument("--tiny", action="store_true", help="a few hundred smaller photos, 64x64 slots, one loader (what CI runs)")
    args = parser.parse_args(argv)
    if args.tiny:
        defaults = dict(epochs=5, side=64, batch_size=16, loaders=1)
        args.counts, args.sides = {"train": 256, "val": 64}, (160, 320)
    else:
        defaults = dict(epochs=4, side=224, batch_size=32, loaders=2)
        args.counts, args.sides = {"train": 1920, "val": 384}, (300, 600)
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if min(args.epochs, args.batch_size, args.loaders) < 1 or args.side < 16:
        parser.error("--epochs, --batch-size and --loaders must be at least 1, --side at least 16")
    if args.data is None:
        name = f"rrc-{LAYOUT}-{args.counts['train']}-{args.counts['val']}-{args.sides[0]}-{args.sides[1]}"
        args.data = os.path.join(default_cache_dir(), "examples", name)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    # One mesh axis over this host's devices: batches are split along it, the model replicated.
    mesh = Mesh(np.array(jax.local_devices()), ("data",))
    batch_sharding, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    model = Classifier(rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(2e-3), wrt=nnx.Param)
    nnx.update((model, optimizer), jax.device_put(nnx.state((model, optimizer)), replicated))

    folder = photo_shards(args.data, args.counts, args.sides)
    train_set = ShardSet(os.path.join(folder, "train-*.tar"))
    val_set = ShardSet(os.path.join(folder, "val-*.tar"))
    arrays = {"image": ((args.side, args.side, 3), np.float32, jnp.float32), "label": ((), np.int32, jnp.int32)}
    train_group = DataGroup(args.batch_size, train_set, loader_arrays=arrays, seed=2024, shuffle_later="shardwise")
    val_group = DataGroup(args.batch_size, val_set, loader_arrays=arrays)
    print(f"[rrc] {len(train_set)} training and {len(val_set)} validation photos, {args.sides[0]}-{args.sides[1]} px a side, "
          f"{len(CLASSES)} classes; training: random resized crops to {args.side}x{args.side}, validation: shorter side "
          f"{round(args.side * EVAL_RESIZE)}, centre {args.side}x{args.side}; {mesh.size} device(s), global batch "
          f"{args.batch_size}, {args.loaders} loader process(es), {args.epochs} epochs", flush=True)

    started, step, losses, right, seen = time.perf_counter(), 0, [], 0, 0
    with Dataloader(load_photo, train_group, validation=("epoch", 1, val_group), loader_count=args.loaders,
                    end_at=("epoch", args.epochs), sharding=batch_sharding) as loader:
        for batch in loader:
            images, labels = batch.arrays["image"], batch.arrays["label"]  # global arrays, split over the mesh
            if batch.is_validation:
                right, seen = right + count_correct(model, images, labels), seen + len(labels)
                if batch.validation_epoch_batch == loader.batches_per_validation - 1:
                    # the validation run follows each epoch's last training batch
                    print(f"[rrc] epoch {step // loader.batches_per_epoch - 1}: training loss "
                          f"{float(jnp.mean(jnp.stack(losses))):.4f}, validation accuracy {int(right) / seen:.1%}", flush=True)
                    losses, right, seen = [], 0, 0
            else:
                losses.append(train_step(model, optimizer, images, labels))
                step += 1
            del batch, images, labels  # hand the batch slot back to the loaders
    print(f"[rrc] trained {step} steps in {time.perf_counter() - started:.1f} s", flush=True)
    print(f"[rrc] digest {parameter_digest(model)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Train a Flax (nnx) + optax digit classifier from PNG tar shards, with Orbax checkpoints and
exact resume after a kill.

What it shows:

- a loader function that decodes each PNG straight into its place in the batch
  (``hydrax.image.decode_into``), run by ``--loaders`` worker processes;
- a ``DataGroup`` over a ``hydrax.shards.ShardSet`` read shard-aware (``shuffle_later="shardwise"``),
  and a validation run after every epoch;
- global batches over every local device (``sharding=``): each batch arrives as one ``jax.Array``
  split along the batch axis of a 1-d mesh, the model replicated over it (try
  ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` on a CPU);
- an Orbax ``CheckpointManager`` saving the model, the optimizer *and the loader's position*
  every ``--every`` steps; run it again with the same ``--checkpoint-dir`` (after a crash, a
  kill, a pre-empted job) and it continues from the last checkpoint, with exactly the batches
  the uninterrupted run would have had, so it ends with bit-identical parameters. The last line
  prints a digest of them to compare runs::

      python examples/flax_classifier.py --checkpoint-dir /tmp/ckpt   # stop it: kill -9, or Ctrl+C (which saves first)
      python examples/flax_classifier.py --checkpoint-dir /tmp/ckpt   # ...and run it again: it goes on where it stopped

The digits come from the repository's ``shards/`` folder, or, from an installed hydrax, are built
once from the digits shipped inside it (as ``hydrax demo`` does). ``pip install 'hydrax[examples]'``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import hydrax.checkpoint
from hydrax import DataGroup, Dataloader
from hydrax.demo import cached_shards, default_shards
from hydrax.image import decode_into
from hydrax.shards import ShardSet

SIDE, CLASSES = 8, 10
# name -> (item shape, numpy dtype in the batch slot, JAX dtype of the batch array)
ARRAYS = {"image": ((SIDE, SIDE, 3), np.float32, jnp.float32), "label": ((), np.int32, jnp.int32)}


def load_digit(sample, arrays, seed):
    """Runs in a loader process, once per item: ``sample`` is a shard sample (its fields as
    bytes), ``arrays`` the item's writable place in the batch. Nothing is returned or copied."""
    decode_into(sample["png"], arrays["image"])  # grey PNG -> RGB fractions in [0, 1]
    arrays["label"][...] = int(bytes(sample["cls"]))


class CNN(nnx.Module):
    """Two convolutions and a linear head: small enough to train in seconds on a CPU."""

    def __init__(self, *, rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(3, 16, kernel_size=(3, 3), rngs=rngs)
        self.conv2 = nnx.Conv(16, 32, kernel_size=(3, 3), strides=(2, 2), rngs=rngs)
        self.head = nnx.Linear(32 * (SIDE // 2) ** 2, CLASSES, rngs=rngs)

    def __call__(self, x):
        x = nnx.relu(self.conv1(x))
        x = nnx.relu(self.conv2(x))
        return self.head(x.reshape(x.shape[0], -1))


@nnx.jit
def train_step(model: CNN, optimizer: nnx.Optimizer, images, labels):
    def loss_fn(model):
        logits = model(images)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)  # updates the model's parameters in place
    return loss


@nnx.jit
def count_correct(model: CNN, images, labels):
    return jnp.sum(jnp.argmax(model(images), axis=-1) == labels)


def parameter_digest(model: nnx.Module) -> str:
    """sha256 of every parameter's bytes, in a fixed order: equal digests, identical models."""
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(nnx.state(model, nnx.Param)):
        digest.update(np.asarray(leaf).tobytes())
    return digest.hexdigest()


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, help="training steps in all (default 460, about 10 epochs; --tiny: 24)")
    parser.add_argument("--checkpoint-dir", help="where Orbax keeps the checkpoints; a run finding one there resumes from it "
                        "(default /tmp/hydrax-flax-classifier, with --tiny /tmp/hydrax-flax-classifier-tiny)")
    parser.add_argument("--every", type=int, help="save a checkpoint every this many steps (default 100; --tiny: 6)")
    parser.add_argument("--batch-size", type=int, help="global batch size, a multiple of the device count (default 32; --tiny: 16)")
    parser.add_argument("--loaders", type=int, help="loader processes (default 2; --tiny: 1)")
    parser.add_argument("--shards", help="folder with digits-{train,val}-*.tar (default: the repository's shards/, or shards "
                        "built from the digits shipped with hydrax)")
    parser.add_argument("--tiny", action="store_true", help="a few steps on a small batch with one loader (what CI runs)")
    args = parser.parse_args(argv)
    if args.tiny:
        defaults = dict(steps=24, every=6, batch_size=16, loaders=1, checkpoint_dir="/tmp/hydrax-flax-classifier-tiny")
    else:
        defaults = dict(steps=460, every=100, batch_size=32, loaders=2, checkpoint_dir="/tmp/hydrax-flax-classifier")
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if min(args.steps, args.every, args.batch_size, args.loaders) < 1:
        parser.error("--steps, --every, --batch-size and --loaders must be at least 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    folder = args.shards or default_shards()
    with contextlib.nullcontext(folder) if folder else cached_shards() as folder:
        return train(args, folder)


def checkpointed(model: CNN, optimizer: nnx.Optimizer) -> dict:
    """What a checkpoint holds of the training: every variable of the model and of the optimizer."""
    return {"model": nnx.state(model), "optimizer": nnx.state(optimizer)}


def save(manager: ocp.CheckpointManager, step: int, model: CNN, optimizer: nnx.Optimizer, loader: Dataloader) -> None:
    """Save the training and the loader's position as one checkpoint. Call it after the step that
    used the last batch: ``LoaderSave`` takes the position now (the next batch not yet trained
    on), and Orbax writes everything in the background while training goes on."""
    manager.save(step, args=ocp.args.Composite(train_state=ocp.args.StandardSave(checkpointed(model, optimizer)),
                                               loader=hydrax.checkpoint.LoaderSave(loader)))


def restore(manager: ocp.CheckpointManager, model: CNN, optimizer: nnx.Optimizer):
    """Restore the newest checkpoint into ``model`` and ``optimizer``; returns its step and the
    loader's position (a ``hydrax.checkpoint.LoaderState``, for ``start_at``)."""
    step = manager.latest_step()
    # The current state is the target: Orbax restores into its shapes, dtypes and shardings.
    restored = manager.restore(step, args=ocp.args.Composite(train_state=ocp.args.StandardRestore(checkpointed(model, optimizer)),
                                                             loader=hydrax.checkpoint.LoaderRestore()))
    nnx.update(model, restored.train_state["model"])
    nnx.update(optimizer, restored.train_state["optimizer"])
    return step, restored.loader


def train(args: argparse.Namespace, folder: str) -> int:
    # One mesh axis over this host's devices: batches are split along it, the model replicated.
    mesh = Mesh(np.array(jax.local_devices()), ("data",))
    batch_sharding, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())

    # The same seed on every run: a resumed run rebuilds the same model, then restores into it.
    model = CNN(rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    nnx.update((model, optimizer), jax.device_put(nnx.state((model, optimizer)), replicated))

    # Every run opens the same directory: the first starts afresh, later ones resume from the
    # newest complete checkpoint (Orbax writes each under a temporary name and renames it when
    # done, so a kill mid-save leaves the one before it as the newest).
    options = ocp.CheckpointManagerOptions(max_to_keep=2, cleanup_tmp_directories=True)
    manager = ocp.CheckpointManager(os.path.abspath(args.checkpoint_dir), options=options)
    step, start_at = 0, (0, 0)
    if manager.latest_step() is not None:
        step, start_at = restore(manager, model, optimizer)
        print(f"[classifier] resumed from the checkpoint of step {step} in {args.checkpoint_dir}: the loader starts at "
              f"epoch {start_at.epoch}, batch {start_at.batch}", flush=True)

    # write_index=False: a fresh checkout gives the shards new times; their indexes are checked, not rewritten.
    train_set = ShardSet(os.path.join(folder, "digits-train-*.tar"), write_index=False)
    val_set = ShardSet(os.path.join(folder, "digits-val-*.tar"), write_index=False)
    # The shards were shuffled when they were built; "shardwise" reads each epoch's shards in a new
    # order and mixes the items of neighbouring shards, so reads stay local (it matters for remote shards).
    train_group = DataGroup(args.batch_size, train_set, loader_arrays=ARRAYS, seed=2024, shuffle_later="shardwise")
    val_group = DataGroup(args.batch_size, val_set, loader_arrays=ARRAYS)
    print(f"[classifier] {len(train_set)} training and {len(val_set)} validation digits; {mesh.size} device(s), "
          f"global batch {args.batch_size}, {args.loaders} loader process(es); steps {step} to {args.steps}", flush=True)

    started, right, seen = time.perf_counter(), 0, 0
    # end_at counts batches from the start of training, so a resumed run ends where the first would have.
    with Dataloader(load_digit, train_group, validation=("epoch", 1, val_group), loader_count=args.loaders,
                    start_at=start_at, end_at=("batch", args.steps), sharding=batch_sharding) as loader:
        for batch in loader:
            images, labels = batch.arrays["image"], batch.arrays["label"]  # global arrays, split over the mesh
            if batch.is_validation:
                right, seen = right + count_correct(model, images, labels), seen + len(labels)
                if batch.validation_epoch_batch == loader.batches_per_validation - 1:
                    # validation runs follow an epoch's last step (batch.validation_epoch counts them in this run only)
                    epoch = step // loader.batches_per_epoch - 1
                    print(f"[classifier] epoch {epoch}: validation accuracy {int(right) / seen:.1%}", flush=True)
                    right, seen = 0, 0
                del batch, images, labels
                continue
            loss = train_step(model, optimizer, images, labels)
            step += 1
            del batch, images, labels  # hand the batch slot back to the loaders
            if step % args.every == 0 or step == args.steps:
                save(manager, step, model, optimizer, loader)
                print(f"[classifier] step {step}: loss {float(loss):.4f} (checkpoint saved)", flush=True)
        if loader.interrupted and step not in manager.all_steps():
            # Ctrl+C: the loader stopped handing out batches; keep what was trained since the last checkpoint
            save(manager, step, model, optimizer, loader)
    manager.wait_until_finished()
    manager.close()
    if loader.interrupted:
        print(f"[classifier] interrupted at step {step}, saved: run again with the same --checkpoint-dir to go on", flush=True)
        return 130
    print(f"[classifier] trained to step {step} in {time.perf_counter() - started:.1f} s", flush=True)
    print(f"[classifier] digest {parameter_digest(model)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

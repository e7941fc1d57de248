"""hydrax end to end: ``python -m hydrax.demo`` (what ``make demo`` and ``hydrax demo`` run).

It trains a small JAX classifier on the UCI handwritten digits, read from the PNG tar shards in
the repository's ``shards/`` folder (built by ``tools/make_digits_shards.py`` with ``hydrax shards
build``): several loader processes decode each PNG straight into its batch slot with
``hydrax.image.decode_into``, the training set is shuffled shard-aware, a validation run follows
every epoch, and a tqdm bar shows progress. It prints the validation accuracy of every epoch and
the loader's throughput, then resumes from a checkpoint taken mid-run with ``start_at`` and shows
that the resumed run ends with bit-identical parameters.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

SIDE = 8
CLASSES = 10
HIDDEN = 64


def default_shards() -> str:
    """``shards/`` of the working directory if it has the digits, else the repository's."""
    here = Path("shards")
    if list(here.glob("digits-train-*.tar")):
        return str(here)
    return str(Path(__file__).resolve().parents[1] / "shards")


def load_digit(sample, arrays, seed) -> None:
    """Decode the sample's PNG into its slot (fractions in [0, 1]) and write its label."""
    from hydrax.image import decode_into

    decode_into(sample["png"], arrays["image"])
    arrays["label"][...] = int(bytes(sample["cls"]))


def _init(seed: int):
    import jax
    import jax.numpy as jnp

    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    inputs = SIDE * SIDE * 3
    return {
        "w1": jax.random.normal(k1, (inputs, HIDDEN)) * jnp.sqrt(2.0 / inputs),
        "b1": jnp.zeros(HIDDEN),
        "w2": jax.random.normal(k2, (HIDDEN, CLASSES)) * jnp.sqrt(1.0 / HIDDEN),
        "b2": jnp.zeros(CLASSES),
    }


def _logits(params, images):
    import jax
    import jax.numpy as jnp

    x = jnp.reshape(images, (images.shape[0], -1))
    hidden = jax.nn.relu(x @ params["w1"] + params["b1"])
    return hidden @ params["w2"] + params["b2"]


def _functions():
    import jax
    import jax.numpy as jnp

    def loss(params, images, labels):
        logits = _logits(params, images)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1))

    @jax.jit
    def step(state, images, labels):
        """One Adam step (written out, so the demo needs nothing beyond JAX)."""
        params, m, v, t = state
        grads = jax.grad(loss)(params, images, labels)
        t = t + 1
        m = jax.tree_util.tree_map(lambda a, g: 0.9 * a + 0.1 * g, m, grads)
        v = jax.tree_util.tree_map(lambda a, g: 0.999 * a + 0.001 * g * g, v, grads)
        scale = 0.01 * jnp.sqrt(1 - 0.999**t) / (1 - 0.9**t)
        params = jax.tree_util.tree_map(lambda p, a, b: p - scale * a / (jnp.sqrt(b) + 1e-8), params, m, v)
        return params, m, v, t

    @jax.jit
    def correct(params, images, labels):
        return jnp.sum(jnp.argmax(_logits(params, images), axis=1) == labels)

    return step, correct


def _fresh_state():
    import jax
    import jax.numpy as jnp

    params = _init(0)
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    return params, zeros, zeros, jnp.zeros((), jnp.int32)


def _snapshot(state):
    import jax

    return jax.tree_util.tree_map(lambda a: np.array(a, copy=True), state)


def _run(loader_args: dict, state, start_at, step, correct, *, checkpoint_at=None, quiet=False):
    """Train (and validate) through one Dataloader run; returns (state, accuracies, checkpoint, stats)."""
    import jax

    from tqdm import tqdm

    from hydrax import Dataloader
    from hydrax.tqdm import tbatches

    loader = Dataloader(load_digit, start_at=start_at, **loader_args)
    accuracies: list[float] = []
    right = total = 0
    checkpoint = None
    items = 0
    started = time.perf_counter()
    waited = 0
    for batch in tbatches(loader, disable=quiet):
        images, labels = batch.arrays["image"], batch.arrays["label"]
        if batch.is_training:
            state = step(state, images, labels)
            items += len(batch)
            if batch.batch_num == checkpoint_at:
                checkpoint = (batch.epoch, batch.epoch_batch + 1, _snapshot(state))
        else:
            right += int(correct(state[0], images, labels))
            total += len(batch)
            if batch.validation_epoch_batch == loader.batches_per_validation - 1:
                accuracies.append(right / total)
                if not quiet:  # above the progress bars
                    tqdm.write(f"[demo] epoch {len(accuracies) - 1 + start_at[0]}: validation accuracy {right / total:.1%}")
                right = total = 0
        waited += loader.idle_usec()
        del batch
    jax.block_until_ready(state)
    elapsed = time.perf_counter() - started
    return state, accuracies, checkpoint, (items, elapsed, waited / 1e6)


def main(argv: list[str] | None = None) -> None:
    """Run the demo; exits non-zero when accuracy or the resume check falls short."""
    parser = argparse.ArgumentParser(prog="python -m hydrax.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", default=None, help="folder with digits-{train,val}-*.tar (default: the repository's shards/)")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2, help="loader processes")
    args = parser.parse_args(argv)

    import jax.numpy as jnp

    from hydrax import DataGroup
    from hydrax.shards import ShardSet

    folder = args.shards or default_shards()
    try:
        # write_index=False: a checkout gives the shards new times; the indexes are checked, not rewritten
        train_set = ShardSet(os.path.join(folder, "digits-train-*.tar"), write_index=False)
        val_set = ShardSet(os.path.join(folder, "digits-val-*.tar"), write_index=False)
    except FileNotFoundError as exc:
        raise SystemExit(f"[demo] {exc}: run it from the repository, or pass --shards (tools/make_digits_shards.py rebuilds them)")
    arrays = {"image": ((SIDE, SIDE, 3), np.float32, jnp.float32), "label": ((), np.int32, jnp.int32)}
    train = DataGroup(32, train_set, loader_arrays=arrays, seed=2024, shuffle_later="shardwise")
    valid = DataGroup(100, val_set, loader_arrays=arrays)
    loader_args = dict(training=train, validation=("epoch", 1, valid), end_at=("epoch", args.epochs), loader_count=args.workers)
    print(f"[demo] {len(train_set)} training and {len(val_set)} validation digits in {len(train_set.urls) + len(val_set.urls)} shards "
          f"({folder}); {args.workers} loader processes")
    step, correct = _functions()

    middle = (args.epochs // 2) * train.batch_count + train.batch_count // 3
    state, accuracies, checkpoint, (items, elapsed, waited) = _run(loader_args, _fresh_state(), (0, 0), step, correct, checkpoint_at=middle)
    print(f"[demo] loader: {items} training items in {elapsed:.2f} s ({items / elapsed:,.0f} items/s, with validation), "
          f"the training loop waited {waited / elapsed:.0%} of the time")
    epoch, offset, saved = checkpoint
    resumed, _, _, _ = _run(loader_args, saved, (epoch, offset), step, correct, quiet=True)
    same = all(np.array_equal(a, b) for a, b in zip(_leaves(state), _leaves(resumed)))
    print(f"[demo] resumed from the checkpoint after batch {middle} (start_at=({epoch}, {offset})): "
          f"final parameters bit-identical to the uninterrupted run: {same}")
    final = accuracies[-1]
    if not same or final < 0.95:
        print(f"[demo] FAILED (final accuracy {final:.1%}, identical {same})")
        sys.exit(1)
    print(f"[demo] OK: final validation accuracy {final:.1%}")


def _leaves(state):
    import jax

    return [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(state)]


if __name__ == "__main__":
    main()

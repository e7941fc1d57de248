"""hydrax end to end: ``python -m hydrax.demo`` (what ``make demo`` and ``hydrax demo`` run).

It trains a small JAX classifier on the UCI handwritten digits, read from PNG tar shards: those in
the repository's ``shards/`` folder when hydrax runs from a checkout, else shards built on first
use from the digits shipped inside the package (``demo_digits.npz``, 45 kB) and kept in hydrax's
cache (``$HYDRAX_CACHE``, else ``~/.cache/hydrax``, under ``demo/``), so the demo works from an
installed wheel too. Both are the same shards: :func:`write_digits_shards` builds them the way
``tools/make_digits_shards.py`` does, with hydrax's shard builder. Several loader processes decode
each PNG straight into its batch slot with ``hydrax.image.decode_into``, the training set is
shuffled shard-aware, a validation run follows every epoch, and a tqdm bar shows progress. It
prints the validation accuracy of every epoch and the loader's throughput, then resumes from a
checkpoint taken mid-run with ``start_at`` and shows that the resumed run ends with bit-identical
parameters.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

SIDE = 8
CLASSES = 10
HIDDEN = 64


#: The 1,797 digits of scikit-learn's ``load_digits()`` (``images``: 8x8 uint8, values 0-16) and
#: their ``labels``, in its order; saved with ``numpy.savez_compressed``. Source: E. Alpaydin and
#: C. Kaynak, "Optical Recognition of Handwritten Digits", UCI Machine Learning Repository, 1998,
#: https://doi.org/10.24432/C50P49, CC BY 4.0.
DIGITS = Path(__file__).with_name("demo_digits.npz")
#: The shards' names in a demo folder.
TRAIN_PATTERN, VAL_PATTERN = "digits-train-%02d.tar", "digits-val-%02d.tar"
#: Part of the cached shards' folder name: changes whenever what write_digits_shards writes does.
_LAYOUT = "v1"


def default_shards() -> str | None:
    """``shards/`` of the working directory if it has the digits, else the repository's when hydrax
    runs from a checkout; None for an installed hydrax (see :func:`cached_shards`)."""
    for folder in (Path("shards"), Path(__file__).resolve().parents[1] / "shards"):
        if list(folder.glob("digits-train-*.tar")) and list(folder.glob("digits-val-*.tar")):
            return str(folder)
    return None


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """The digits shipped with hydrax: ``(images, labels)``, (1797, 8, 8) values 0-16 and (1797,)."""
    with np.load(DIGITS, allow_pickle=False) as data:
        return data["images"], data["labels"]


def write_digits_shards(folder: str | os.PathLike, images: np.ndarray | None = None, labels: np.ndarray | None = None) -> list[str]:
    """Write the demo's shards, each with its index, into ``folder``; returns their paths.

    Each digit becomes an 8-bit grayscale PNG (value * 255 // 16) in a class-per-subfolder tree,
    every 6th (300) under ``val/`` and the rest (1,497) under ``train/``, and each tree becomes
    shards of at most 400 samples (``digits-train-00.tar`` ..., ``digits-val-00.tar``; fields
    ``png``, ``cls``, ``label``; keys ``<label>/digit<NNNN>``) by hydrax's shard builder, shuffled
    with seed 0, as ``hydrax shards build`` writes them. ``images`` and ``labels`` default to
    :func:`load_digits`.
    """
    from PIL import Image

    from .shards.build import build_shards
    from .shards.build.sources import samples_from_folder

    if images is None or labels is None:
        images, labels = load_digits()
    pixels = (np.asarray(images).astype(np.int64) * 255 // 16).astype(np.uint8)
    written = []
    with tempfile.TemporaryDirectory(prefix="hydrax-digits-") as tree:
        for i, (image, label) in enumerate(zip(pixels, labels)):
            path = os.path.join(tree, "val" if i % 6 == 0 else "train", str(int(label)))
            os.makedirs(path, exist_ok=True)
            Image.fromarray(image, "L").save(os.path.join(path, f"digit{i:04d}.png"), optimize=True)
        for split, pattern in (("train", TRAIN_PATTERN), ("val", VAL_PATTERN)):
            report = build_shards(samples_from_folder(os.path.join(tree, split)), os.path.join(os.fspath(folder), pattern),
                                  maxcount=400, shuffle_seed=0, check_images=True, force=True)
            written += report.shards
    return written


def _cache_root() -> str:
    from .shards.catalog import default_cache_dir

    return default_cache_dir()


@contextlib.contextmanager
def cached_shards(announce=print) -> Iterator[str]:
    """The folder of the demo's shards in hydrax's cache, built there by :func:`write_digits_shards`
    on first use (under a temporary name, renamed when complete, so a folder of that name is
    always whole). Where the cache cannot be written, a temporary folder that is removed on exit."""
    digest = hashlib.sha256(DIGITS.read_bytes()).hexdigest()[:12]
    root = os.path.join(_cache_root(), "demo")
    final = os.path.join(root, f"digits-{_LAYOUT}-{digest}")
    if os.path.isdir(final):
        yield final
        return
    started = time.perf_counter()
    try:
        os.makedirs(root, exist_ok=True)
        building = tempfile.mkdtemp(prefix=".digits-", dir=root)
    except OSError as exc:
        with tempfile.TemporaryDirectory(prefix="hydrax-demo-") as temporary:
            announce(f"[demo] the cache {root} cannot be written ({exc.strerror or exc}); building the shards in {temporary}")
            write_digits_shards(temporary)
            yield temporary
        return
    try:
        write_digits_shards(building)
        try:
            os.rename(building, final)
        except OSError:
            if not os.path.isdir(final):  # not another demo that finished first
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    announce(f"[demo] built the digit shards from the digits shipped with hydrax into {final} "
             f"in {time.perf_counter() - started:.2f} s")
    yield final


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
    parser.add_argument("--shards", default=None, help="folder with digits-{train,val}-*.tar (default: the repository's "
                        "shards/, else shards built from the digits shipped with hydrax, kept in its cache)")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2, help="loader processes")
    args = parser.parse_args(argv)
    if args.epochs < 1 or args.workers < 1:
        parser.error("--epochs and --workers must be at least 1")
    folder = args.shards or default_shards()
    with contextlib.nullcontext(folder) if folder else cached_shards() as folder:
        _demo(args, folder)


def _demo(args: argparse.Namespace, folder: str) -> None:
    import jax.numpy as jnp

    from hydrax import DataGroup
    from hydrax.shards import ShardSet

    try:
        # write_index=False: a checkout gives the shards new times; the indexes are checked, not rewritten
        train_set = ShardSet(os.path.join(folder, "digits-train-*.tar"), write_index=False)
        val_set = ShardSet(os.path.join(folder, "digits-val-*.tar"), write_index=False)
    except FileNotFoundError as exc:
        raise SystemExit(f"[demo] {exc}: pass --shards a folder with digits-{{train,val}}-*.tar, or leave it out "
                         "to use the digits shipped with hydrax") from None
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

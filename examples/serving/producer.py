"""Serve batches of the digit shards over ZeroMQ to ``trainer.py``.

A Dataloader decodes the PNGs into uint8 NHWC images and int32 labels (tensorcom's convention),
and :func:`hydrax.serve.serve` sends each batch straight from its batch slot, without a copy, as
tenbin frames (tensorcom's format). Producer ``--share K`` of ``--shares N`` sends every N-th
batch of the run, starting at the K-th, to the trainer listening on ``--connect HOST:PORT``, whose
:class:`hydrax.serve.Collector` puts the shares back in order and hands out each batch exactly
once, even if a producer is killed and started again (the restarted one resumes where its share
stopped). Every producer must build the same run: give them all the same flags but ``--share``.

::

    python examples/serving/trainer.py --listen 0.0.0.0:7880 --producers 2     # on the trainer
    python examples/serving/producer.py --connect trainer:7880 --share 0 --shares 2
    python examples/serving/producer.py --connect trainer:7880 --share 1 --shares 2
"""

from __future__ import annotations

import argparse
import contextlib
import os

import jax.numpy as jnp
import numpy as np

from hydrax import DataGroup, Dataloader
from hydrax.demo import cached_shards, default_shards
from hydrax.image import decode_into
from hydrax.serve import serve
from hydrax.shards import ShardSet

SIDE = 8
ARRAYS = {"image": ((SIDE, SIDE, 3), np.uint8, jnp.uint8), "label": ((), np.int32, jnp.int32)}


def load_digit(sample, arrays, seed):
    decode_into(sample["png"], arrays["image"])  # uint8 RGB, values 0-255
    arrays["label"][...] = int(bytes(sample["cls"]))


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connect", default="127.0.0.1:7880", help="HOST:PORT the trainer listens on")
    parser.add_argument("--share", type=int, default=0, help="which share of the run this producer serves (0 ... shares-1)")
    parser.add_argument("--shares", type=int, default=1, help="how many producers split the run")
    parser.add_argument("--batches", type=int, help="batches in the whole run, all shares together (default 460; --tiny: 20)")
    parser.add_argument("--batch-size", type=int, help="items per batch (default 32; --tiny: 16)")
    parser.add_argument("--loaders", type=int, help="loader processes (default 2; --tiny: 1)")
    parser.add_argument("--shards", help="folder with digits-train-*.tar (default: the repository's shards/, or shards built "
                        "from the digits shipped with hydrax)")
    parser.add_argument("--tiny", action="store_true", help="a few small batches with one loader (what CI runs)")
    args = parser.parse_args(argv)
    defaults = dict(batches=20, batch_size=16, loaders=1) if args.tiny else dict(batches=460, batch_size=32, loaders=2)
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if not 0 <= args.share < args.shares:
        parser.error("--share must be in [0, --shares)")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    folder = args.shards or default_shards()
    with contextlib.nullcontext(folder) if folder else cached_shards() as folder:
        train_set = ShardSet(os.path.join(folder, "digits-train-*.tar"), write_index=False)
        group = DataGroup(args.batch_size, train_set, loader_arrays=ARRAYS, seed=2024, shuffle_later="shardwise")
        # end_at counts every batch of the run: each share serves its part of those
        loader = Dataloader(load_digit, group, loader_count=args.loaders, end_at=("batch", args.batches))
        url = f"zpush://{args.connect}"
        name = f"producer {args.share}/{args.shares}"
        print(f"[{name}] serving its share of {args.batches} batches of {args.batch_size} digits to {url}", flush=True)
        # serve() enters and leaves the Dataloader. The collector checks that every share serves the
        # same run (same groups, seeds, start and end); fingerprint adds what the schedule cannot
        # show: the data behind it.
        report = serve(loader, url, arrays=["image", "label"], share=(args.share, args.shares),
                       fingerprint=f"digits {SIDE}x{SIDE} uint8 {len(train_set)}")
        print(f"[{name}] served {report.batches} batches ({report.bytes / 1e6:.2f} MB) in {report.seconds:.1f} s", flush=True)


if __name__ == "__main__":
    main()

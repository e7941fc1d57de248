"""Train a small JAX + optax classifier on digit batches served over ZeroMQ by ``producer.py``.

The trainer binds ``--listen HOST:PORT`` and the producers connect to it, so they can start in
any order and on any machines. ``--producers N`` producers each serve a share of one run, and a
:class:`hydrax.serve.Collector` yields every batch exactly once, in the order a local Dataloader
would have, ending when every share has ended; a producer that dies can be started again and
resumes its share. The trainer needs no data, no loader processes and no Dataloader.

``--tiny`` (what CI runs) starts two small producers itself, on 127.0.0.1 and a free port, and
ends by itself::

    python examples/serving/trainer.py --tiny

Across machines, start it with ``--listen 0.0.0.0:7880 --producers 2`` and see ``producer.py``.
"""

from __future__ import annotations

import argparse
import hashlib
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from hydrax.serve import Collector

PRODUCER = Path(__file__).with_name("producer.py")
SIDE, CLASSES, HIDDEN = 8, 10, 64
# What the producers must send: the collector refuses other arrays, naming the difference.
SCHEMA = [("image", "uint8", (None, SIDE, SIDE, 3)), ("label", "int32", (None,))]


def init_params(key):
    k1, k2 = jax.random.split(key)
    inputs = SIDE * SIDE * 3
    return {"w1": jax.random.normal(k1, (inputs, HIDDEN)) * jnp.sqrt(2 / inputs), "b1": jnp.zeros(HIDDEN),
            "w2": jax.random.normal(k2, (HIDDEN, CLASSES)) * jnp.sqrt(1 / HIDDEN), "b2": jnp.zeros(CLASSES)}


def logits_of(params, images):
    x = images.reshape(images.shape[0], -1).astype(jnp.float32) / 255  # uint8 on the wire, scaled here
    return jax.nn.relu(x @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"]


optimizer = optax.adam(1e-2)


@jax.jit
def train_step(params, opt_state, images, labels):
    def loss_fn(params):
        return optax.softmax_cross_entropy_with_integer_labels(logits_of(params, images), labels).mean()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", default="127.0.0.1:7880", help="HOST:PORT to bind (0.0.0.0 for producers on other machines)")
    parser.add_argument("--producers", type=int, default=2, help="how many producers split the run")
    parser.add_argument("--spawn", action="store_true", help="start the producers here, as subprocesses (implied by --tiny)")
    parser.add_argument("--tiny", action="store_true", help="start small producers on 127.0.0.1 and a free port, train on "
                        "their few batches, end (what CI runs)")
    args = parser.parse_args(argv)
    if args.producers < 1:
        parser.error("--producers must be at least 1")
    if args.tiny:
        args.spawn = True
        args.listen = f"127.0.0.1:{free_port()}"
    return args


def free_port() -> int:
    """A TCP port nothing listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_producers(args) -> list[subprocess.Popen]:
    """The producers, as this machine's subprocesses, with the flags that make them one run."""
    common = [sys.executable, str(PRODUCER), "--connect", args.listen] + (["--tiny"] if args.tiny else [])
    return [subprocess.Popen(common + ["--share", str(k), "--shares", str(args.producers)]) for k in range(args.producers)]


def train(collector: Collector) -> tuple[dict, int, bool]:
    """Train on every batch the collector hands out; returns the parameters, the batch count and
    whether the batches came in the run's order (the Collector's promise)."""
    params = init_params(jax.random.PRNGKey(0))
    opt_state = optimizer.init(params)
    batches, in_order, started = 0, True, time.perf_counter()
    for message in collector.messages():
        images, labels = message.arrays  # numpy arrays viewing ZeroMQ's buffers
        in_order = in_order and message.seq == batches  # seq: the batch's place in the served run
        params, opt_state, loss = train_step(params, opt_state, images, labels)
        batches += 1
        if batches == 1 or batches % 10 == 0:
            print(f"[trainer] batch {batches} (epoch {message.fields['epoch']}, batch {message.fields['batch']}): "
                  f"loss {float(loss):.4f}", flush=True)
    print(f"[trainer] trained on {batches} batches in {time.perf_counter() - started:.1f} s", flush=True)
    return params, batches, in_order


def main(argv=None) -> int:
    args = parse_args(argv)
    url = f"zpull://{args.listen}"
    # Bound first, then the producers: they connect (and reconnect) on their own, in any order.
    with Collector(url, shares=args.producers, schema=SCHEMA) as collector:
        print(f"[trainer] receiving on {url} from {args.producers} producer(s)", flush=True)
        producers = start_producers(args) if args.spawn else []
        try:
            params, batches, in_order = train(collector)
            failed = [p.args for p in producers if p.wait(timeout=60) != 0]
        finally:
            for producer in producers:  # on an error here, do not leave them waiting for the trainer
                if producer.poll() is None:
                    producer.terminate()
                    producer.wait()
    digest = hashlib.sha256(b"".join(np.asarray(leaf).tobytes() for leaf in jax.tree.leaves(params))).hexdigest()
    print(f"[trainer] every batch once, in order: {in_order}; producers failed: {len(failed)}", flush=True)
    print(f"[trainer] digest {digest}", flush=True)
    return 0 if batches and in_order and not failed else 1


if __name__ == "__main__":
    sys.exit(main())

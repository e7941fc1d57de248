"""``hydrax serve``: send batches of images and labels from shards over ZeroMQ, as tensorcom's servers do.

The standard image pipeline of `hydrax bench`: each sample's image (its first image field, or
--field) decoded into a square uint8 slot with a random crop and flip, and its label (the integer in
its cls field, else label, or --label-field). Each message holds two arrays, tensorcom's
convention: images (N, S, S, 3) uint8 (NHWC) and labels (N,) int32, named "image" and "label".

The ZeroMQ URL is the argument whose scheme is a ZeroMQ one (write it last: SHARDS... URL), or
--url. zpub://0.0.0.0:PORT publishes to any number of zsub:// consumers (tensormon's default),
zrpush://0.0.0.0:PORT gives each batch to one of the zrpull:// consumers that connect, and
zpush://HOST:PORT sends into one consumer that binds zpull://.

--protocol tensorcom (the default) sends bare tenbin messages, which tensorcom's Connection,
tensormon and hydrax read; --protocol hydrax adds an envelope (topic, epoch, batch, item indices)
and epoch and end-of-stream markers, so a hydrax consumer (`hydrax monitor`, hydrax.serve.Connection)
ends when the stream does. It serves until --epochs are sent (default: forever, as tensorcom's
servers do). Ctrl+C stops after the batch being sent (with the hydrax protocol, consumers are told
the stream ended); a second Ctrl+C stops at once.

Exit status: 0 when the epochs were sent, 1 on a failure (a consumer that takes nothing for
--timeout seconds, unreadable shards, an address in use), 130 after Ctrl+C.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import sys
import threading

import numpy as np

from ..errors import ShardFormatError, WorkerError
from ._common import add_s3_options, report, shard_options
from .bench import _PROBE, MissingFieldError, load_image

#: The names the two arrays travel under (tenbin infos).
ARRAYS = ("image", "label")


def register(commands) -> None:
    parser = commands.add_parser(
        "serve", help="send batches of images and labels from shards over ZeroMQ, for tensorcom or hydrax consumers",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s [options] SHARDS... URL",
        epilog="examples:\n"
               "  hydrax serve 'data/train-{0000..0099}.tar' zpub://0.0.0.0:7880 --batch-size 64 --size 224\n"
               "  tensormon zsub://127.0.0.1:7880              # or: hydrax monitor zsub://127.0.0.1:7880\n"
               "  hydrax serve 'data/val-*.tar' zrpush://0.0.0.0:7881 --epochs 1 --protocol hydrax --shuffle none",
    )
    parser.add_argument("inputs", nargs="+", metavar="SHARDS... URL",
                        help="shard paths, globs, brace patterns or s3:// URLs, then the ZeroMQ URL to serve on "
                             "(zpub://, zrpush://, zpush://, zrpub://; brace ranges make several endpoints)")
    parser.add_argument("--url", action="append", default=[], metavar="URL", help="the ZeroMQ URL, instead of the last argument")
    parser.add_argument("--batch-size", "-b", type=int, default=64, metavar="N", help="images per batch (default 64)")
    parser.add_argument("--size", type=int, default=224, metavar="PX", help="side of the square images (default 224)")
    parser.add_argument("--field", help="the image field, which every sample must have (default: each sample's first image field)")
    parser.add_argument("--label-field", metavar="FIELD", help="the field holding the integer label (default: cls, else label)")
    parser.add_argument("--workers", type=int, default=2, help="loader processes (default 2)")
    parser.add_argument("--depth", type=int, default=4, help="batch slots (default 4)")
    parser.add_argument("--epochs", type=int, default=0, metavar="N", help="send N epochs, then end (default 0: forever)")
    parser.add_argument("--shuffle", choices=("shardwise", "itemwise", "none"), default="shardwise",
                        help="item order (default shardwise); none: the shards' order, every epoch")
    parser.add_argument("--seed", type=int, default=0, help="the seed of the shuffle and the crops (default 0)")
    parser.add_argument("--protocol", choices=("tensorcom", "hydrax"), default="tensorcom",
                        help="tensorcom: bare arrays (default); hydrax: with topics, batch numbers and end markers")
    parser.add_argument("--topic", default="train", help="the hydrax protocol's topic (default train)")
    parser.add_argument("--subscribers", type=int, default=0, metavar="N",
                        help="on zpub/zrpub, wait for N subscribers before the first batch, so none misses it (default 0)")
    parser.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                        help="fail when no consumer takes a batch for this long (default 60; 0 waits forever)")
    parser.add_argument("--hwm", type=int, default=4, metavar="N", help="batches queued per consumer (default 4)")
    parser.add_argument("--report", type=float, default=10.0, metavar="SECONDS",
                        help="print the rate every SECONDS (default 10; 0: only the summary at the end)")
    add_s3_options(parser)
    parser.set_defaults(run=run)


def split_inputs(inputs: list[str], urls: list[str]) -> tuple[list[str], list[str]]:
    """(shards, ZeroMQ URLs) of the positional arguments and ``--url`` values.

    A positional argument is a ZeroMQ URL when its scheme is one (``zpub``, ``zpush+ipc``, ...).
    Without any, the last argument is taken as the URL when it names another scheme (so that
    ``tcp://host:1`` is refused naming it, rather than read as a shard); raises ``ValueError``.
    """
    from ..serve.urls import is_zmq_url, parse_url

    found = [text for text in inputs if is_zmq_url(text)]
    shards = [text for text in inputs if not is_zmq_url(text)]
    found += urls
    if not found:
        last = inputs[-1]
        scheme = last.split("://", 1)[0] if "://" in last else None
        if scheme is not None and scheme not in ("s3", "gs", "http", "https", "file"):
            parse_url(last)  # raises, naming it
        raise ValueError("no ZeroMQ URL to serve on: give one after the shards (zpub://0.0.0.0:7880, zrpush://0.0.0.0:7880, "
                         "zpush://HOST:PORT) or with --url")
    if not shards:
        raise ValueError("no shards to serve: give them before the URL")
    return shards, found


def sample_label(sample, fields: tuple[str, ...]) -> int:
    """The integer label of ``sample``: the first line of its first field among ``fields``."""
    for name in fields:
        if name in sample.fields:
            text = bytes(sample[name]).decode("utf-8", "replace").strip()
            try:
                return int(text.splitlines()[0] if text else "")
            except ValueError:
                raise ShardFormatError(f"sample {sample.key!r} field {name!r} is {text[:40]!r}, not an integer label",
                                       url=sample.url, key=sample.key, field=name) from None
    raise MissingFieldError(f"sample {sample.key!r} has no label field {' or '.join(fields)} (it has {sorted(sample.fields)})",
                            url=sample.url, key=sample.key, field=fields[0])


def load_image_label(field: str | None, size: int, label_fields: tuple[str, ...], sample, arrays, seed) -> None:
    """bench's :func:`~hydrax.commands.bench.load_image` (random crop and flip), and the sample's
    integer label into ``arrays["label"]``."""
    arrays["label"][...] = sample_label(sample, label_fields)
    load_image(field, size, sample, {"image": arrays["image"], "bytes": np.empty((), np.int64)}, seed)


class _Stoppable:
    """The Dataloader as :func:`hydrax.serve.serve` enters it, with hydrax serve's Ctrl+C: the first
    ends the iteration (so the stream ends properly), the second raises ``KeyboardInterrupt``."""

    def __init__(self, loader) -> None:
        self.loader = loader
        self.stopped = False
        self._previous = None

    def __enter__(self):
        batches = self.loader.__enter__()
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        return batches

    def __exit__(self, exc_type, exc, tb):
        from ..serve import ServeError

        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)  # the loader's, which it restores in turn
            self._previous = None
        if exc_type is not None and issubclass(exc_type, (ServeError, KeyboardInterrupt)) and not issubclass(exc_type, WorkerError):
            exc_type = exc = tb = None  # the command reports these itself, in one line: no "shutting down due to"
        return self.loader.__exit__(exc_type, exc, tb)

    def _on_sigint(self, signum, frame) -> None:
        if self.stopped:
            raise KeyboardInterrupt
        self.stopped = True
        report("serve", "interrupted: ending after the batch being sent (Ctrl+C again to stop at once)")
        try:
            self.loader.interrupt()
        except RuntimeError:  # not running any more
            pass


def run(args: argparse.Namespace) -> int:
    from ..serve.urls import parse_urls
    from ..shards import ShardSet
    from ..shards.stats import LABEL_FIELDS
    from ..shards.tarindex import is_image_field

    for name in ("batch_size", "size", "workers", "depth", "hwm"):
        if getattr(args, name) < 1:
            report("serve", f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
            return 2
    if args.epochs < 0 or args.subscribers < 0 or args.timeout < 0 or args.report < 0:
        report("serve", "--epochs, --subscribers, --timeout and --report cannot be negative")
        return 2
    try:
        shards, urls = split_inputs(args.inputs, args.url)
        endpoints = parse_urls(urls)
    except ValueError as exc:
        report("serve", exc)
        return 1
    if not endpoints[0].sends:
        report("serve", f"{endpoints[0].url} receives: to send, use zpub://, zrpush://, zpush:// or zrpub://")
        return 1
    label_fields = (args.label_field,) if args.label_field else LABEL_FIELDS
    try:
        dataset = ShardSet(shards, **shard_options(args))
        first = [dataset[i] for i in range(min(_PROBE, len(dataset)))]
    except (OSError, ShardFormatError, ValueError, NotImplementedError, ImportError) as exc:
        report("serve", exc)
        return 1
    if not first:
        report("serve", f"the shards {' '.join(shards)} hold no samples")
        return 1
    sample = first[0]
    if args.field is not None and args.field not in sample.fields:
        report("serve", f"{sample.url}: sample {sample.key!r} has no field {args.field!r} (it has {sorted(sample.fields)})")
        return 1
    if args.field is None and not any(is_image_field(name) for s in first for name in s.fields):
        report("serve", f"no image field in the first {len(first)} samples ({sample.url}: sample {sample.key!r} has "
                        f"{sorted(sample.fields)}); name one with --field")
        return 1
    if not any(name in sample.fields for name in label_fields):
        report("serve", f"{sample.url}: sample {sample.key!r} has no label field {' or '.join(label_fields)} "
                        f"(it has {sorted(sample.fields)}); name one with --label-field")
        return 1
    try:
        for sample in first:  # labels that are words, not class numbers, fail here rather than in a worker
            sample_label(sample, label_fields)
    except ShardFormatError as exc:
        report("serve", exc)
        return 1
    # JAX loads only once the shards are known to be readable: a bad shard fails at once
    import jax.numpy as jnp

    from ..group import DataGroup
    from ..loader import Dataloader
    from ..serve import serve

    arrays = {"image": ((args.size, args.size, 3), np.uint8, jnp.uint8), "label": ((), np.int32, jnp.int32)}
    shuffle = {"shardwise": "shardwise", "itemwise": "itemwise", "none": "repeat"}[args.shuffle]
    group = DataGroup(min(args.batch_size, len(dataset)), dataset, loader_arrays=arrays, seed=args.seed,
                      shuffle_first=args.shuffle == "itemwise", shuffle_later=shuffle)
    loader = Dataloader(functools.partial(load_image_label, args.field, args.size, label_fields), group,
                        loader_count=args.workers, depth=args.depth, end_at=("epoch", args.epochs) if args.epochs else None)
    batch = group.batch_size
    epochs = f"{args.epochs} epoch{'s' * (args.epochs != 1)}" if args.epochs else "epochs"
    until = "" if args.epochs else " until Ctrl+C"
    print(f"serving {len(dataset):,} samples of {len(dataset.urls)} shards on {', '.join(e.url for e in endpoints)} "
          f"({args.protocol} protocol): {epochs} of {loader.batches_per_epoch:,} batches{until}, "
          f"image uint8 ({batch}, {args.size}, {args.size}, 3), label int32 ({batch},)", flush=True)
    _no_fork_server()
    stoppable = _Stoppable(loader)
    handler = _report_handler() if args.report else None
    try:
        result = serve(stoppable, urls, arrays=ARRAYS, protocol=args.protocol, topic=args.topic, timeout=args.timeout or None,
                       hwm=args.hwm, subscribers=args.subscribers, report=args.report)
    except (Exception, WorkerError) as exc:  # a dead loader process is a failure, not the user's Ctrl+C
        report("serve", exc)
        return 1
    except KeyboardInterrupt:
        report("serve", "interrupted")
        return 130
    finally:
        if handler is not None:
            logging.getLogger("hydrax.serve.producer").removeHandler(handler)
    rate = result.batches / result.seconds if result.seconds > 0 else 0.0
    print(f"served {result.batches:,} batches ({result.bytes / 1e6:,.1f} MB) in {result.seconds:.1f} s: "
          f"{rate:,.1f} batches/s, {result.mb_per_second:,.1f} MB/s", flush=True)
    return 130 if stoppable.stopped else 0


def _no_fork_server() -> None:
    """Keep hydrax from starting its fork server when JAX initialises (at the first batch).

    The one run of this command starts its workers by fork, before JAX initialises, when that is
    safe (no object-store threads yet); the fork server, which would import JAX for runs to come,
    is then only a few seconds of CPU taken from the loaders (and a traceback at Ctrl+C).
    """
    from ..workers import start_method

    if "HYDRAX_START_METHOD" not in os.environ and start_method() == "fork":
        os.environ["HYDRAX_START_METHOD"] = "fork"


def _report_handler() -> logging.Handler:
    """Print :func:`hydrax.serve.serve`'s rate reports on stdout."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("hydrax.serve.producer")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return handler

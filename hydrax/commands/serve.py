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
the stream ended); a second Ctrl+C stops at once. (With --share, the first stops at once: see below.)

Reliable mode (--share K/N): N processes, on one machine or several, each serve one share of the
same run to one hydrax Collector (hydrax.serve.Collector, or `hydrax monitor --shares N`), which
gets every batch exactly once, in the run's order. Share K sends the run's batches K, K+N, K+2N, ...
Every share must be started with the same shards, options and --seed (only --share differs): they
split one run, and the collector refuses a share whose run has another length. The URL is
zpush://COLLECTOR:PORT (every share connects to the collector's zpull://) or zrpush://0.0.0.0:PORT
(each share binds its own port, and the collector connects to all). A share process that dies, is
killed, or is stopped with Ctrl+C can be started again with the same arguments: it resumes where its
share stopped, and nothing is lost or repeated (the collector waits for it up to its own timeout).
Reliable mode has its own protocol: --protocol, --topic, --subscribers and --hwm do not apply.
With --epochs 0 (forever) the collector receives until it is stopped.

Exit status: 0 when the epochs were sent, 1 on a failure (a consumer that takes nothing for
--timeout seconds, unreadable shards, an address in use, a collector that refuses the share), 2 for
options that do not go together, 130 after Ctrl+C.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import logging
import os
import signal
import sys
import threading
import time

import numpy as np

from ..errors import ShardFormatError, WorkerError
from ._common import CommandError, UsageError, add_s3_options, first_samples, positive_int, report, shard_options
from .bench import MissingFieldError, load_image

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
               "  hydrax serve 'data/val-*.tar' zrpush://0.0.0.0:7881 --epochs 1 --protocol hydrax --shuffle none\n"
               "\n"
               "  # reliable mode: two machines each serve half of one run to a collector on 'trainer'\n"
               "  hydrax monitor zpull://0.0.0.0:7882 --shares 2    # on trainer (or hydrax.serve.Collector)\n"
               "  hydrax serve 'data/train-{0000..0099}.tar' zpush://trainer:7882 --epochs 1 --share 0/2   # on machine A\n"
               "  hydrax serve 'data/train-{0000..0099}.tar' zpush://trainer:7882 --epochs 1 --share 1/2   # on machine B",
    )
    parser.add_argument("inputs", nargs="+", metavar="SHARDS... URL",
                        help="shard paths, globs, brace patterns or s3://, gs://, http(s):// or hf://datasets/ORG/NAME[@REV]/ URLs, then the ZeroMQ URL to serve on "
                             "(zpub://, zrpush://, zpush://, zrpub://; brace ranges make several endpoints)")
    parser.add_argument("--url", action="append", default=[], metavar="URL", help="the ZeroMQ URL, instead of the last argument")
    parser.add_argument("--batch-size", "-b", type=positive_int, default=64, metavar="N", help="images per batch (default 64)")
    parser.add_argument("--size", type=positive_int, default=224, metavar="PX", help="side of the square images (default 224)")
    parser.add_argument("--field", help="the image field, which every sample must have (default: each sample's first image field)")
    parser.add_argument("--label-field", metavar="FIELD", help="the field holding the integer label (default: cls, else label)")
    parser.add_argument("--workers", type=positive_int, default=2, help="loader processes (default 2)")
    parser.add_argument("--depth", type=positive_int, default=4, help="batch slots (default 4)")
    parser.add_argument("--epochs", type=int, default=0, metavar="N", help="send N epochs, then end (default 0: forever)")
    parser.add_argument("--shuffle", choices=("shardwise", "itemwise", "none"), default="shardwise",
                        help="item order (default shardwise); none: the shards' order, every epoch")
    parser.add_argument("--seed", type=int, default=0, help="the seed of the shuffle and the crops (default 0)")
    parser.add_argument("--share", type=share_arg, metavar="K/N",
                        help="reliable mode: serve share K of N of the run to a hydrax Collector (zpush:// or zrpush:// "
                             "URL); run K = 0 .. N-1 with the same shards, options and --seed")
    parser.add_argument("--protocol", choices=("tensorcom", "hydrax"),
                        help="tensorcom: bare arrays (default); hydrax: with topics, batch numbers and end markers "
                             "(not with --share)")
    parser.add_argument("--topic", help="the hydrax protocol's topic (default train; not with --share)")
    parser.add_argument("--subscribers", type=int, metavar="N",
                        help="on zpub/zrpub, wait for N subscribers before the first batch, so none misses it "
                             "(default 0; not with --share)")
    parser.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                        help="fail when no consumer takes a batch for this long (default 60; 0 waits forever)")
    parser.add_argument("--hwm", type=int, metavar="N", help="batches queued per consumer (default 4; not with --share)")
    parser.add_argument("--shared-memory", type=float, nargs="?", const=0.0, metavar="MB",
                        help="consumers on this host: batch data goes through a shared memory ring of MB megabytes "
                             "(default: sized from the batch) instead of the socket; with --protocol hydrax and a "
                             "zpush/zrpush URL, or with --share (then only when the collector is on this host)")
    parser.add_argument("--report", type=float, default=10.0, metavar="SECONDS",
                        help="print the rate every SECONDS (default 10; 0: only the summary at the end)")
    add_s3_options(parser)
    parser.set_defaults(run=run)


def share_arg(text: str) -> tuple[int, int]:
    """An argparse type: ``"K/N"`` as ``(K, N)``, share K of N (``0 <= K < N``)."""
    index, slash, count = text.partition("/")
    try:
        share = (int(index), int(count)) if slash else None
    except ValueError:
        share = None
    if share is None or share[1] < 1 or not 0 <= share[0] < share[1]:
        raise argparse.ArgumentTypeError(f"expected K/N with 0 <= K < N, as in 0/2 (share 0 of 2), got {text!r}")
    return share


#: The options of the plain (unreliable) mode, and their defaults: reliable mode refuses them.
PLAIN_OPTIONS = {"protocol": "tensorcom", "topic": "train", "subscribers": 0, "hwm": 4}


def check_mode(args: argparse.Namespace, endpoints) -> tuple[str, int] | None:
    """Check ``--share`` against the other options and the URL, and fill in the plain mode's
    defaults; ``(message, exit status)`` when they do not go together, else None."""
    import zmq

    given = [name for name in PLAIN_OPTIONS if getattr(args, name) is not None]
    if args.shared_memory is None:
        args.shared_memory = False
    elif args.shared_memory < 0:
        return f"--shared-memory must be a size in megabytes, got {args.shared_memory:g}", 2
    else:
        args.shared_memory = int(args.shared_memory * 1e6) or True
    if args.share is None:
        for name, default in PLAIN_OPTIONS.items():
            if getattr(args, name) is None:
                setattr(args, name, default)
        if args.subscribers < 0:
            return "--subscribers cannot be negative", 2
        if args.hwm < 1:
            return f"--hwm must be at least 1, got {args.hwm}", 2
        if args.shared_memory is not False and (args.protocol != "hydrax" or endpoints[0].socket_type != zmq.PUSH):
            return ("--shared-memory needs --protocol hydrax and a zpush:// or zrpush:// URL (its consumers, "
                    f"on this host, read hydrax messages), not {args.protocol} on {endpoints[0].url}"), 2
        return None
    if given:
        options = " and ".join(f"--{name.replace('_', '-')}" for name in given)
        return (f"{options} do{'es' * (len(given) == 1)} not apply with --share: reliable mode has its own protocol "
                "(read it with hydrax.serve.Collector or hydrax monitor --shares N)"), 2
    if endpoints[0].socket_type != zmq.PUSH:
        return (f"--share serves a Collector: use a zpush://COLLECTOR:PORT or zrpush://0.0.0.0:PORT URL, "
                f"not {endpoints[0].url}"), 1
    return None


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
    ends the iteration (so the stream ends properly), the second raises ``KeyboardInterrupt``.

    With ``share`` (reliable mode) the first Ctrl+C ends the process at once instead, without
    ending the share: the collector keeps its place, and a process started again with the same
    arguments resumes there (ending the iteration would tell the collector that the share is
    complete). Every ``report`` seconds it prints the share's progress; other attributes are the
    Dataloader's, which reliable mode reads (``select_stream``, ``batches_per_epoch``, ...).
    """

    def __init__(self, loader, share: tuple[int, int] | None = None, report: float = 0.0) -> None:
        self.loader = loader
        self.share = share
        self.report = report
        self.stopped = False
        self._previous = None

    def __getattr__(self, name: str):
        if name == "loader":  # not set yet: no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __iter__(self):
        """The loader's batches (reliable mode iterates this), with the progress reports."""
        started = last = time.monotonic()
        batches = 0
        for batch in self.loader:
            yield batch
            batches += 1
            now = time.monotonic()
            if self.report and now - last >= self.report:
                last = now
                print(f"[hydrax] share {self.share[0]}/{self.share[1]}: served {batches:,} batches, "
                      f"{batches / (now - started):,.1f} batches/s", flush=True)

    def __enter__(self):
        batches = self.loader.__enter__()
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        return batches

    def __exit__(self, exc_type, exc, tb):
        from ..serve import ServeError

        if self._previous is not None and self.share is None:
            signal.signal(signal.SIGINT, self._previous)  # the loader's, which it restores in turn
        # A share keeps its own while the loader shuts down (the loader's would wait for it): the
        # loader then restores the one it found, the share's own again.
        self._previous = None
        if exc_type is not None and issubclass(exc_type, (ServeError, KeyboardInterrupt)) and not issubclass(exc_type, WorkerError):
            exc_type = exc = tb = None  # the command reports these itself, in one line: no "shutting down due to"
        return self.loader.__exit__(exc_type, exc, tb)

    def _on_sigint(self, signum, frame) -> None:
        if self.stopped:
            raise KeyboardInterrupt
        self.stopped = True
        if self.share is not None:
            # A crash, as far as the collector knows: the batches in flight were never counted as
            # received, and the loader processes die with this one (PR_SET_PDEATHSIG, memfd arena).
            report("serve", f"interrupted: share {self.share[0]}/{self.share[1]} stopped without ending; start it again "
                            "with the same arguments to resume where it stopped")
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(130)
        report("serve", "interrupted: ending after the batch being sent (Ctrl+C again to stop at once)")
        try:
            self.loader.interrupt()
        except RuntimeError:  # not running any more
            pass


def run(args: argparse.Namespace) -> int:
    try:
        shards, urls, endpoints = _check_arguments(args)
        dataset, label_fields = _open_shards(args, shards)
    except CommandError as exc:  # UsageError included
        report("serve", exc)
        return exc.status
    loader, batch = _make_loader(args, dataset, label_fields)
    mode, options = _mode(args, dataset)
    epochs = f"{args.epochs} epoch{'s' * (args.epochs != 1)}" if args.epochs else "epochs"
    until = "" if args.epochs else " until Ctrl+C"
    print(f"serving {len(dataset):,} samples of {len(dataset.urls)} shards on {', '.join(e.url for e in endpoints)} "
          f"({mode}): {epochs} of {loader.batches_per_epoch:,} batches{until}, "
          f"image uint8 ({batch}, {args.size}, {args.size}, 3), label int32 ({batch},)", flush=True)
    return _serve(args, loader, urls, options)


def _check_arguments(args: argparse.Namespace) -> tuple[list[str], list[str], list]:
    """The shards, the ZeroMQ URLs and their endpoints; :class:`UsageError` for numbers out of
    range and options that do not go together, :class:`CommandError` for URLs that cannot serve."""
    from ..serve.urls import parse_urls

    for name in ("batch_size", "size", "workers", "depth"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.epochs < 0 or args.timeout < 0 or args.report < 0:
        raise UsageError("--epochs, --timeout and --report cannot be negative")
    try:
        shards, urls = split_inputs(args.inputs, args.url)
        endpoints = parse_urls(urls)
    except ValueError as exc:
        raise CommandError(exc) from None
    if not endpoints[0].sends:
        raise CommandError(f"{endpoints[0].url} receives: to send, use zpub://, zrpush://, zpush:// or zrpub://")
    problem = check_mode(args, endpoints)
    if problem is not None:
        message, status = problem
        raise UsageError(message) if status == 2 else CommandError(message)
    return shards, urls, endpoints


def _open_shards(args: argparse.Namespace, shards: list[str]):
    """The ShardSet of ``shards`` and the label fields to read, once its first samples show that
    they hold what will be served; :class:`CommandError` when they cannot be read, hold no
    samples, or lack the image or label fields (or a label is not a class number)."""
    from ..shards import ShardSet
    from ..shards.stats import LABEL_FIELDS
    from ..shards.tarindex import is_image_field

    label_fields = (args.label_field,) if args.label_field else LABEL_FIELDS
    try:
        dataset = ShardSet(shards, **shard_options(args))
        first = first_samples(dataset)
    except (OSError, ShardFormatError, ValueError, NotImplementedError, ImportError) as exc:
        raise CommandError(exc) from None
    if not first:
        raise CommandError(f"the shards {' '.join(shards)} hold no samples")
    sample = first[0]
    if args.field is not None and args.field not in sample.fields:
        raise CommandError(f"{sample.url}: sample {sample.key!r} has no field {args.field!r} (it has {sorted(sample.fields)})")
    if args.field is None and not any(is_image_field(name) for s in first for name in s.fields):
        raise CommandError(f"no image field in the first {len(first)} samples ({sample.url}: sample {sample.key!r} has "
                           f"{sorted(sample.fields)}); name one with --field")
    if not any(name in sample.fields for name in label_fields):
        raise CommandError(f"{sample.url}: sample {sample.key!r} has no label field {' or '.join(label_fields)} "
                           f"(it has {sorted(sample.fields)}); name one with --label-field")
    try:
        for sample in first:  # labels that are words, not class numbers, fail here rather than in a worker
            sample_label(sample, label_fields)
    except ShardFormatError as exc:
        raise CommandError(exc) from None
    return dataset, label_fields


def _make_loader(args: argparse.Namespace, dataset, label_fields: tuple[str, ...]):
    """The Dataloader of the run, and its batch size."""
    # JAX loads only once the shards are known to be readable: a bad shard fails at once
    import jax.numpy as jnp

    from ..run.group import DataGroup
    from ..run.loader import Dataloader

    arrays = {"image": ((args.size, args.size, 3), np.uint8, jnp.uint8), "label": ((), np.int32, jnp.int32)}
    shuffle = {"shardwise": "shardwise", "itemwise": "itemwise", "none": "repeat"}[args.shuffle]
    group = DataGroup(min(args.batch_size, len(dataset)), dataset, loader_arrays=arrays, seed=args.seed,
                      shuffle_first=args.shuffle == "itemwise", shuffle_later=shuffle)
    loader = Dataloader(functools.partial(load_image_label, args.field, args.size, label_fields), group,
                        loader_count=args.workers, depth=args.depth, end_at=("epoch", args.epochs) if args.epochs else None)
    return loader, group.batch_size


def _mode(args: argparse.Namespace, dataset) -> tuple[str, dict]:
    """The mode of the run in words, and :func:`hydrax.serve.serve`'s keywords for it."""
    if args.share is None:
        return f"{args.protocol} protocol", {"protocol": args.protocol, "topic": args.topic, "hwm": args.hwm,
                                             "subscribers": args.subscribers, "report": args.report,
                                             "shared_memory": args.shared_memory or None}
    index, count = args.share
    # what the schedule cannot see: which data, and how each sample becomes arrays
    data = hashlib.sha256("\n".join(dataset.urls).encode()).hexdigest()[:12]
    fingerprint = f"data {data} size {args.size} field {args.field} label {args.label_field}"
    mode = f"reliable mode, share {index}/{count}"
    if count > 1:
        mode += f": batches {index}, {index + count}, {index + 2 * count}, ... of the run"
    return mode, {"share": args.share, "fingerprint": fingerprint, "shared_memory": args.shared_memory or None}


def _serve(args: argparse.Namespace, loader, urls: list[str], options: dict) -> int:
    """Serve the loader's batches until the epochs are sent, a failure or Ctrl+C; the exit status."""
    from ..serve import serve

    _no_fork_server()
    stoppable = _Stoppable(loader, share=args.share, report=args.report)
    handler = _report_handler() if args.report and args.share is None else None
    # A share's Ctrl+C stops it without ending it from the start (waiting for the collector's
    # welcome) to the end (the last batches wait in the sender after the loader is done).
    previous = signal.signal(signal.SIGINT, stoppable._on_sigint) if args.share is not None else None
    try:
        result = serve(stoppable, urls, arrays=ARRAYS, timeout=args.timeout or None, **options)
    except (Exception, WorkerError) as exc:  # a dead loader process is a failure, not the user's Ctrl+C
        report("serve", exc)
        return 1
    except KeyboardInterrupt:
        report("serve", "interrupted")
        return 130
    finally:
        if handler is not None:
            logging.getLogger("hydrax.serve.producer").removeHandler(handler)
        if args.share is not None:
            signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)
    rate = result.batches / result.seconds if result.seconds > 0 else 0.0
    of_share = "" if args.share is None else f" of share {args.share[0]}/{args.share[1]}"
    print(f"served {result.batches:,} batches{of_share} ({result.bytes / 1e6:,.1f} MB) in {result.seconds:.1f} s: "
          f"{rate:,.1f} batches/s, {result.mb_per_second:,.1f} MB/s", flush=True)
    return 130 if stoppable.stopped else 0


def _no_fork_server() -> None:
    """Keep hydrax from starting its fork server when JAX initialises (at the first batch).

    The one run of this command starts its workers by fork, before JAX initialises, when that is
    safe (no object-store threads yet); the fork server, which would import JAX for runs to come,
    is then only a few seconds of CPU taken from the loaders (and a traceback at Ctrl+C).
    """
    from ..procs.processes import start_method

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

"""``hydrax monitor``: receive batches over ZeroMQ and print the rate, as tensorcom's tensormon does.

Every --report batches it prints the batch count, batches/s, samples/s and MB/s since the last
line, the batch size (the first dimension of the first array) and each array's name, dtype and
shape. It reads tensorcom's messages and hydrax's alike; with hydrax's protocol it also prints
the end of each epoch, and it ends when the producers (--producers of them) end the stream.
Otherwise it ends after --count batches, or fails when nothing comes for --timeout seconds.

With --shares N it receives in reliable mode, as a hydrax Collector: from the N processes of
`hydrax serve --share K/N` (or hydrax.serve.serve(..., share=(K, N))), each batch exactly once and
in the run's order (--unordered: as they come), across share processes that are restarted. The URL
is zpull://0.0.0.0:PORT (the shares connect with zpush://) or zrpull://HOST:PORT (it connects to
shares that bind zrpush://; brace ranges reach several). It ends when every share has ended, and
prints the stream position it reached (every batch before it received once, when ordered) and how
many batches it dropped as duplicates (those a restarted share had already sent). --timeout is how
long a share may stay silent (a stopped share can be restarted within it); --topic and --producers
do not apply.

Exit status: 0 when the stream ended or --count batches came, 1 on a failure (nothing came for
--timeout seconds, a producer that failed, a URL that cannot be used), 2 for options that do not
go together, 130 after Ctrl+C.
"""

from __future__ import annotations

import argparse
import time

from ._common import CommandError, count, positive_int, report

#: The URL kinds that receive.
RECEIVING = "zpull://, zsub://, zrpull:// or zrsub://"


def register(commands) -> None:
    parser = commands.add_parser(
        "monitor", help="receive batches over ZeroMQ and print batches/s, samples/s, MB/s and shapes (tensormon)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  hydrax monitor zsub://127.0.0.1:7880                # a zpub:// server (hydrax serve, serve-imagenet-shards)\n"
               "  hydrax monitor zrpull://trainer:7881 --report 100 --count 1000\n"
               "  hydrax monitor 'zsub://127.0.0.1:788{0..3}' --timeout 0\n"
               "  hydrax monitor zpull://0.0.0.0:7882 --shares 2    # reliable mode: hydrax serve ... zpush://HOST:7882 --share 0/2 (and 1/2)",
    )
    parser.add_argument("urls", nargs="+", metavar="URL", help="where to receive from (brace ranges make several endpoints)")
    parser.add_argument("--report", "-r", type=count, default=10, metavar="N", help="print a line every N batches (default 10)")
    parser.add_argument("--count", "-c", type=count, default=0, metavar="N", help="stop after N batches (default 0: at the end of the stream)")
    add_stream_options(parser)
    parser.add_argument("--shares", type=positive_int, metavar="N",
                        help="reliable mode: receive a run served in N shares (hydrax serve --share K/N), each batch once, in order")
    parser.add_argument("--unordered", action="store_true", help="with --shares: take the batches as they come, not in the run's order")
    parser.set_defaults(run=run)


def add_stream_options(parser: argparse.ArgumentParser, group_title: str | None = None) -> None:
    """``--timeout``, ``--topic`` and ``--producers``, for the commands that receive over ZeroMQ."""
    group = parser.add_argument_group(group_title) if group_title else parser
    group.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                       help="fail when nothing comes for this long (default 60; 0 waits forever)")
    group.add_argument("--topic", help="receive only this topic of a hydrax stream (default: all)")
    group.add_argument("--producers", type=positive_int, default=1, metavar="N",
                       help="a hydrax stream ends when N producers have ended it (default 1)")


def open_stream(urls: list[str], args: argparse.Namespace):
    """A :class:`hydrax.serve.Connection` receiving from ``urls`` with the stream options of ``args``;
    :class:`~hydrax.commands._common.CommandError` naming the URL when it cannot be made."""
    from ..serve import Connection, ServeError
    from ..serve.urls import parse_urls

    if args.timeout < 0 or args.producers < 1:
        raise CommandError(f"--timeout cannot be negative and --producers must be at least 1, got {args.timeout:g} and {args.producers}")
    try:
        endpoints = parse_urls(urls)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    if endpoints[0].sends:
        raise CommandError(f"{endpoints[0].url} sends: to receive, use {RECEIVING}")
    try:
        return Connection(urls, protocol="hydrax", topic=args.topic, timeout=args.timeout or None, producers=args.producers)
    except ServeError as exc:
        raise CommandError(str(exc)) from None


def open_collector(urls: list[str], args: argparse.Namespace):
    """A :class:`hydrax.serve.Collector` receiving the ``args.shares`` shares of a reliable stream
    from ``urls``; :class:`~hydrax.commands._common.CommandError` naming the URL when it cannot be made."""
    import zmq

    from ..serve import Collector, ServeError
    from ..serve.urls import parse_urls

    if args.timeout < 0:
        raise CommandError(f"--timeout cannot be negative, got {args.timeout:g}")
    try:
        endpoints = parse_urls(urls)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    if endpoints[0].socket_type != zmq.PULL:
        raise CommandError(f"--shares receives as a Collector: use a zpull://0.0.0.0:PORT or zrpull://HOST:PORT URL, "
                           f"not {endpoints[0].url}")
    try:
        return Collector(urls, args.shares, ordered=not args.unordered, timeout=args.timeout or None)
    except (ServeError, ValueError) as exc:
        raise CommandError(str(exc)) from None


def check_reliable_options(args: argparse.Namespace) -> str | None:
    """Why ``--shares``, ``--unordered``, ``--topic`` and ``--producers`` do not go together, or None."""
    if args.shares is None:
        return "--unordered needs --shares N (reliable mode)" if args.unordered else None
    if args.shares < 1:
        return f"--shares must be at least 1, got {args.shares}"
    given = [option for option, used in (("--topic", args.topic is not None), ("--producers", args.producers != 1)) if used]
    if given:
        return (f"{' and '.join(given)} do{'es' * (len(given) == 1)} not apply with --shares: "
                "a reliable stream has no topics, and its shares end it")
    return None


def describe(arrays, infos) -> str:
    """``"image uint8 (8, 32, 32, 3), label int32 (8,)"``: each array's name (when sent), dtype and shape."""
    parts = []
    for i, a in enumerate(arrays):
        name = infos[i] if i < len(infos) and infos[i] else f"[{i}]"
        parts.append(f"{name} {a.dtype} {tuple(a.shape)}")
    return ", ".join(parts)


def batch_size(arrays) -> int:
    """The batch size of a message: the first dimension of its first array (1 for a scalar or none)."""
    return int(arrays[0].shape[0]) if arrays and arrays[0].ndim else 1


def run(args: argparse.Namespace) -> int:
    from ..serve import ServeError

    problem = check_reliable_options(args)
    if problem is not None:
        report("monitor", problem)
        return 2
    try:
        connection = open_stream(args.urls, args) if args.shares is None else open_collector(args.urls, args)
    except CommandError as exc:
        report("monitor", exc)
        return 1
    where = ", ".join(e.url for e in connection.endpoints)
    if args.shares is None:
        print(f"receiving from {where}", flush=True)
    else:
        order = "as they come" if args.unordered else "in order"
        print(f"receiving from {where}: {args.shares} share{'s' * (args.shares != 1)} (reliable mode, {order})", flush=True)
    highest = -1  # the highest stream position received (reliable mode)
    batches = samples = size = 0
    window = [0, 0, 0]  # batches, samples, bytes since the last line (or the first batch)
    first_size = (0, 0)  # the first batch's samples and bytes, which came at the start of the clock
    first = last = latest = time.monotonic()
    status, ended = 0, "stopped"
    try:
        with connection:
            for message in connection.messages():
                if message.kind != "data":
                    what = "validation run" if message.fields.get("validation") else "epoch"
                    print(f"end of {what} {message.epoch} (topic {message.topic!r})", flush=True)
                    continue
                arrays = message.arrays
                if args.shares is not None:
                    highest = max(highest, message.seq)
                n, nbytes = batch_size(arrays), sum(a.nbytes for a in arrays)
                latest = time.monotonic()
                batches, samples, size = batches + 1, samples + n, size + nbytes
                if batches == 1:  # rates count from the first batch's arrival
                    first = last = latest
                    first_size = (n, nbytes)
                    print(f"first batch: {describe(arrays, message.infos)}", flush=True)
                else:
                    window = [window[0] + 1, window[1] + n, window[2] + nbytes]
                if args.report and batches % args.report == 0 and window[0]:
                    elapsed = max(latest - last, 1e-9)
                    print(f"{batches:12d} {window[0] / elapsed:9.2f} batches/s {window[1] / elapsed:11.1f} samples/s "
                          f"{window[2] / elapsed / 1e6:9.2f} MB/s  batch {n}  {describe(arrays, message.infos)}", flush=True)
                    window, last = [0, 0, 0], latest
                if args.count and batches >= args.count:
                    break
            else:
                ended = "the stream ended"
    except ServeError as exc:  # a timeout, a producer that failed
        report("monitor", exc)
        status = 1
    except KeyboardInterrupt:
        report("monitor", "interrupted")
        status, ended = 130, "interrupted"
    if batches or status != 1:
        elapsed = latest - first
        rates = ""
        if batches > 1 and elapsed > 0:
            rates = (f" ({(batches - 1) / elapsed:,.2f} batches/s, {(samples - first_size[0]) / elapsed:,.1f} samples/s, "
                     f"{(size - first_size[1]) / elapsed / 1e6:,.2f} MB/s)")
        print(f"{ended}: {batches:,} batches, {samples:,} samples, {size / 1e6:,.1f} MB{rates}", flush=True)
        if args.shares is not None:
            print(stream_position(connection, highest, batches), flush=True)
    return status


def stream_position(collector, highest: int, batches: int) -> str:
    """The last line of reliable mode: where in the stream the collector stopped, and the duplicates it dropped."""
    duplicates = f"{collector.duplicates:,} duplicate{'s' * (collector.duplicates != 1)} dropped"
    if collector.ordered:
        return f"stream position {collector.position:,} (every batch before it received once), {duplicates}"
    if highest < 0:
        return f"no stream position received, {duplicates}"
    return f"stream positions up to {highest:,} ({batches:,} received, each once), {duplicates}"

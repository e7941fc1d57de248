"""Benchmark: serving batches over ZeroMQ: hydrax's Connection against tensorcom 0.1.0 and raw pyzmq.

What is measured
----------------
One producer process sends ``--warmup`` + ``--batches`` batches of ``[uint8 (64, 224, 224, 3),
int32 (64,)]`` (9.6 MB) to one consumer process, PUSH to PULL, over TCP on 127.0.0.1 (or
``--transport ipc``). Both ends use the same library:

``raw pyzmq zero-copy`` (the floor)
    ``send_multipart([hdr, img, hdr, lbl], copy=False)`` with tenbin-style header frames made
    once, and ``recv_multipart(copy=False)`` + ``np.frombuffer`` of the known shapes: tenbin's
    framing with no other work. ZeroMQ's default options (HWM 1000).
``tensorcom 0.1.0``
    ``tensorcom.zcom.Connection("zpush://...").send([img, lbl])`` to
    ``Connection("zpull://...").recv()``, defaults (it copies every frame on both ends).
``hydrax``
    ``hydrax.serve.Connection("zpush://...").send([img, lbl])`` to ``Connection("zpull://...")``,
    iterated; default options.
``hydrax aligned=True``
    the same, the consumer receiving data frames into 64-byte-aligned memory (one copy).
``hydrax protocol=hydrax``
    the same with hydrax envelopes (``protocol="hydrax"`` at both ends).
``hydrax shared_memory``
    the same, the producer made with ``shared_memory=True``: the data goes through a shared
    memory ring (one copy, in the producer) and only envelope and headers through the socket; a
    transport for producer and consumer on one host, which is what this benchmark runs.

The producer makes the image once (seeded) and a fresh label array per batch holding the batch's
number, so zero-copy senders never see their queued memory change. The consumer, identically for
every contender, reads the first and last element of both arrays and checks that the label is
the batch number; it checks the whole label and a corner of the image against the expected
content on the first batch, the first measured one and the last one, so a broken path cannot
look fast.

Per run:

* **MB/s**: at the consumer, ``--batches`` x the batch's bytes over the wall time from receiving
  the last warm-up batch to receiving the last batch (MB = 10^6 bytes).
* **consumer ms CPU/batch**: the consumer process's user+system CPU time
  (``getrusage(RUSAGE_SELF)``) over the measured batches, divided by their number. It counts every
  thread of the process, libzmq's I/O thread included (which reads the socket and allocates each
  message): that is the library's real cost, and the same rule for all.
* **producer ms CPU/batch**: the producer process's user+system CPU from just before its first
  send to the moment the consumer has received everything (so its I/O thread's work on the last
  batches is in), divided by all the batches it sent, warm-up included.
* **of which main thread**: the consumer's Python thread alone (``time.thread_time``): the
  library's own per-message work (poll, receive calls, decoding; for tensorcom and
  ``aligned=True`` also the copy of the data). The rest is libzmq's I/O thread reading the socket.
* **faults/batch**: the consumer's minor page faults per measured batch: a handful means freed
  message buffers are reused; about 2,350 would mean every 9.6 MB batch faults in fresh pages.

Note that on a 2-CPU machine the producer and consumer share the CPUs (4 busy threads), so a
contender's MB/s depends on both ends' CPU per batch and on the scheduler; the CPU columns are
much steadier than MB/s, and the verdict lines also give each repeat's interleaved ratio.

Every run starts a fresh consumer and a fresh producer process (this file, ``--child``); runs
are interleaved (raw, tensorcom, hydrax, ..., raw, ...) ``--repeats`` times and the table shows
medians, because the machine may be shared and noisy. The ratios are of medians; the targets
(the serving issue's acceptance criterion) are judged on every hydrax row: the default
``hydrax`` row (batches through the socket) and ``hydrax shared_memory`` (through shared memory,
for producer and consumer on one host, as here)::

    hydrax MB/s >= 0.8 x raw pyzmq,  >= 1.5 x tensorcom;  consumer CPU/batch <= 0.6 x tensorcom's

Over a socket no library can pass the kernel's two copies of every byte, so raw pyzmq bounds the
socket rows; on a 2-core machine raw pyzmq itself reaches only 1.2-1.7x tensorcom.

``--also 'hwm=64,aligned=true'`` adds a hydrax row with those Connection options; ``--shape 64,8,8,3``
(12 KB batches, with ``--batches 20000``) measures per-message overhead instead of bandwidth;
``--pin`` pins the producer and the consumer to one CPU each.
``--profile`` adds, after the table, one more run of each hydrax contender with the consumer
under cProfile (wall clock, then the main thread's CPU clock), printing where its time goes.

    python tools/bench/bench_serve.py [--batches 300] [--repeats 3] [--transport tcp|ipc] [--quick]
                                [--json FILE] [--profile] [--also OPTIONS] [--shape DIMS] [--pin]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

IMAGE_SHAPE = (64, 224, 224, 3)
LABEL_SHAPE = (64,)
SEED = 1234

#: key -> (label in the table, library, Connection options)
CONTENDERS = {
    "raw": ("raw pyzmq zero-copy", "raw", {}),
    "tensorcom": ("tensorcom 0.1.0", "tensorcom", {}),
    "hydrax": ("hydrax", "hydrax", {}),
    "hydrax-aligned": ("hydrax aligned=True", "hydrax", {"aligned": True}),
    "hydrax-protocol": ("hydrax protocol=hydrax", "hydrax", {"protocol": "hydrax"}),
    "hydrax-shm": ("hydrax shared_memory", "hydrax", {"protocol": "hydrax", "shared_memory": True}),
}
# options that belong to one end only (the other end does not get them)
CONSUMER_ONLY = ("aligned",)
PRODUCER_ONLY = ("shared_memory",)
TARGETS = {"raw": 0.8, "tensorcom": 1.5, "cpu": 0.6}


# -- the two ends (run in child processes) --------------------------------------------------------

def set_shape(image_shape) -> None:
    """Use another image shape (``--shape``) in this process; the label has one int32 per image."""
    global IMAGE_SHAPE, LABEL_SHAPE
    IMAGE_SHAPE, LABEL_SHAPE = tuple(image_shape), (image_shape[0],)


def make_image() -> np.ndarray:
    return np.random.default_rng(SEED).integers(0, 256, IMAGE_SHAPE, dtype=np.uint8)


def cpu_seconds() -> tuple[float, int]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime, usage.ru_minflt


def raw_headers() -> tuple[bytes, bytes]:
    """tenbin headers of the two arrays, as any tenbin writer makes them (code, info, ndim, dims)."""
    def header(code: bytes, shape) -> bytes:
        return np.array([int.from_bytes(code.ljust(8, b"\0"), "little"), 0, len(shape), *shape], "<i8").tobytes()

    return header(b"u1", IMAGE_SHAPE), header(b"i4", LABEL_SHAPE)


def open_end(spec: dict, sending: bool):
    """``(send(list) or recv() -> list, close())`` for the contender's library."""
    library, options = spec["library"], spec["options"]
    url = spec["push_url"] if sending else spec["pull_url"]
    if library == "raw":
        import zmq

        context = zmq.Context()
        sock = context.socket(zmq.PUSH if sending else zmq.PULL)
        sock.setsockopt(zmq.LINGER, 60_000)
        if sending:
            sock.connect(spec["address"])
            headers = raw_headers()

            def send(arrays):
                sock.send_multipart([headers[0], arrays[0], headers[1], arrays[1]], copy=False)
        else:
            sock.bind(spec["address"])

            def recv():
                frames = sock.recv_multipart(copy=False)
                return [np.frombuffer(frames[1].buffer, np.uint8).reshape(IMAGE_SHAPE),
                        np.frombuffer(frames[3].buffer, np.int32).reshape(LABEL_SHAPE)]

        def close():
            sock.close()
            context.term()

        return (send if sending else recv), close
    if library == "tensorcom":
        from tensorcom.zcom import Connection

        connection = Connection(url)
        return (connection.send if sending else connection.recv), connection.close
    from hydrax.serve import Connection

    if sending:
        options = {k: v for k, v in options.items() if k not in CONSUMER_ONLY}
        connection = Connection(url, **options)
        return connection.send, connection.close
    connection = Connection(url, **{k: v for k, v in options.items() if k not in PRODUCER_ONLY})
    iterator = iter(connection)
    return (lambda: next(iterator)), connection.close


def producer(spec: dict) -> dict:
    send, close = open_end(spec, sending=True)
    image = make_image()
    total = spec["warmup"] + spec["batches"]
    labels = [np.full(LABEL_SHAPE, i, np.int32) for i in range(total)]
    cpu0, _ = cpu_seconds()
    started = time.perf_counter()
    for i in range(total):
        send([image, labels[i]])
    sent = time.perf_counter() - started
    print("SENT", flush=True)
    sys.stdin.readline()  # the consumer has everything: the I/O thread's work is done
    cpu1, _ = cpu_seconds()
    close()
    return {"cpu_per_batch": (cpu1 - cpu0) / total, "send_seconds": sent}


def consumer(spec: dict) -> dict:
    recv, close = open_end(spec, sending=False)
    expected_image = make_image()
    corner = expected_image[0, :8, :8].copy(), expected_image[-1, -8:, -8:].copy()
    warmup, batches = spec["warmup"], spec["batches"]
    nbytes = expected_image.nbytes + 4 * LABEL_SHAPE[0]

    def verify(arrays, i):
        image, label = arrays
        if image.shape != IMAGE_SHAPE or image.dtype != np.uint8 or label.shape != LABEL_SHAPE or label.dtype != np.int32:
            raise AssertionError(f"batch {i}: got {image.dtype}{image.shape}, {label.dtype}{label.shape}")
        if not (label == i).all():
            raise AssertionError(f"batch {i}: labels {label[:4]}... are not {i}")
        if not (np.array_equal(image[0, :8, :8], corner[0]) and np.array_equal(image[-1, -8:, -8:], corner[1])):
            raise AssertionError(f"batch {i}: the image is not what was sent")

    profiler = None
    if spec.get("profile"):
        import cProfile

        profiler = cProfile.Profile(time.thread_time) if spec["profile"] == "cpu" else cProfile.Profile()
    print("READY", flush=True)
    sink = 0
    bad = 0
    for i in range(warmup):
        arrays = recv()
        if i == 0:
            verify(arrays, i)
        sink += int(arrays[0].flat[0]) + int(arrays[0].flat[-1]) + int(arrays[1][-1])
        bad += int(arrays[1][0]) != i
        del arrays
    cpu0, faults0 = cpu_seconds()
    thread0 = time.thread_time()
    started = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    last = warmup + batches - 1
    for i in range(warmup, warmup + batches):
        arrays = recv()
        # the same minimal touch for every contender: one element at each end of each array
        sink += int(arrays[0].flat[0]) + int(arrays[0].flat[-1]) + int(arrays[1][-1])
        bad += int(arrays[1][0]) != i
        if i == warmup or i == last:
            verify(arrays, i)
        del arrays
    if profiler is not None:
        profiler.disable()
    elapsed = time.perf_counter() - started
    thread1 = time.thread_time()
    cpu1, faults1 = cpu_seconds()
    if bad:
        raise AssertionError(f"{bad} batches came with the wrong number in their label")
    result = {"mb_per_s": batches * nbytes / elapsed / 1e6, "cpu_per_batch": (cpu1 - cpu0) / batches,
              "thread_cpu_per_batch": (thread1 - thread0) / batches,
              "faults_per_batch": (faults1 - faults0) / batches, "seconds": elapsed, "sink": sink}
    if profiler is not None:
        import io
        import pstats

        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats("tottime").print_stats(22)
        result["profile"] = text.getvalue()
    print("RESULT " + json.dumps(result), flush=True)
    sys.stdin.readline()  # stay connected until the producer has closed (its end marker, its linger)
    close()
    return result


def child(spec: dict) -> None:
    set_shape(spec["shape"])
    if spec.get("pin"):
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[(0 if spec["role"] == "producer" else 1) % len(cpus)]})
    if spec["role"] == "producer":
        print("RESULT " + json.dumps(producer(spec)), flush=True)
    else:
        consumer(spec)


# -- the driver -----------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def endpoints(transport: str, folder: str, trial: int) -> dict:
    if transport == "tcp":
        where = f"127.0.0.1:{free_port()}"
        return {"address": f"tcp://{where}", "push_url": f"zpush://{where}", "pull_url": f"zpull://{where}"}
    path = os.path.join(folder, f"s{trial}")
    return {"address": f"ipc://{path}", "push_url": f"zpush+ipc://{path}", "pull_url": f"zpull+ipc://{path}"}


class Child:
    """One child process speaking line by line on its stdin and stdout."""

    def __init__(self, spec: dict, folder: str) -> None:
        self.role = spec["role"]
        self.log = tempfile.TemporaryFile("w+", dir=folder)
        self.process = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True)

    def tail(self) -> str:
        self.log.seek(0)
        return self.log.read()[-3000:]

    def expect(self, word: str) -> str:
        line = self.process.stdout.readline()
        if not line.startswith(word):
            self.process.kill()
            self.process.wait()
            raise RuntimeError(f"the {self.role} said {line.strip()!r}, not {word}:\n{self.tail()}")
        return line[len(word):].strip()

    def tell(self) -> None:
        self.process.stdin.write("go\n")
        self.process.stdin.flush()

    def finish(self, timeout: float = 120) -> None:
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise RuntimeError(f"the {self.role} did not exit within {timeout:g} s") from None
        if self.process.returncode:
            raise RuntimeError(f"the {self.role} exited with {self.process.returncode}:\n{self.tail()}")


def trial(contender: str, args, folder: str, number: int, profile: str | None = None) -> dict:
    spec = dict(library=CONTENDERS[contender][1], options=CONTENDERS[contender][2], warmup=args.warmup, batches=args.batches,
                profile=profile, shape=args.shape, pin=args.pin, **endpoints(args.transport, folder, number))
    consumer_process = Child(dict(spec, role="consumer"), folder)
    producer_process = None
    watchdog = threading.Timer(args.trial_timeout, lambda: [c.process.kill() for c in (consumer_process, producer_process) if c])
    watchdog.start()
    try:
        consumer_process.expect("READY")
        producer_process = Child(dict(spec, role="producer"), folder)

        def reap(producer=producer_process) -> None:  # a producer that fails leaves the consumer waiting: end it
            if producer.process.wait():
                consumer_process.process.kill()

        threading.Thread(target=reap, daemon=True).start()
        try:
            received = json.loads(consumer_process.expect("RESULT"))
        except RuntimeError:
            if producer_process.process.poll():
                raise RuntimeError(f"the producer exited with {producer_process.process.returncode}:\n{producer_process.tail()}") from None
            raise
        producer_process.expect("SENT")
        producer_process.tell()
        sent = json.loads(producer_process.expect("RESULT"))
        producer_process.finish()
        consumer_process.tell()
        consumer_process.finish()
    finally:
        watchdog.cancel()
        for c in (consumer_process, producer_process):
            if c is not None and c.process.poll() is None:
                c.process.kill()
                c.process.wait()
    return {"mb_per_s": received["mb_per_s"], "consumer_ms": 1000 * received["cpu_per_batch"],
            "consumer_main_ms": 1000 * received["thread_cpu_per_batch"],
            "producer_ms": 1000 * sent["cpu_per_batch"], "faults": received["faults_per_batch"],
            "profile": received.get("profile")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, help="measured batches per run (default 300, 2.9 GB; --quick: 30)")
    parser.add_argument("--warmup", type=int, help="batches received before measuring (default 10; --quick: 3)")
    parser.add_argument("--repeats", type=int, help="runs of each contender, interleaved (default 3; --quick: 1)")
    parser.add_argument("--transport", choices=("tcp", "ipc"), default="tcp")
    parser.add_argument("--shape", default="64,224,224,3",
                        help="the uint8 image batch's shape (default 64,224,224,3); a small one measures per-message overhead")
    parser.add_argument("--contenders", nargs="+", choices=list(CONTENDERS), default=list(CONTENDERS))
    parser.add_argument("--also", metavar="OPTIONS", action="append", default=[],
                        help="one more hydrax row with these Connection options, as 'hwm=1000,aligned=true' (repeatable)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: one repeat of 30 batches after 3 (unless given)")
    parser.add_argument("--pin", action="store_true", help="pin the producer to one CPU and the consumer to another")
    parser.add_argument("--json", metavar="FILE", help="write every run, the medians and the verdicts to FILE")
    parser.add_argument("--profile", action="store_true", help="also profile each hydrax consumer (cProfile, after the table)")
    parser.add_argument("--trial-timeout", type=float, default=600, help=argparse.SUPPRESS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    for name, full, quick in (("batches", 300, 30), ("warmup", 10, 3), ("repeats", 3, 1)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    args.shape = [int(d) for d in args.shape.split(",")]
    for text in args.also:
        options = {}
        for pair in text.split(","):
            name, _, value = pair.partition("=")
            try:
                options[name.strip()] = json.loads(value)
            except ValueError:
                options[name.strip()] = value
        CONTENDERS[f"hydrax {text}"] = (f"hydrax {text}", "hydrax", options)
        args.contenders.append(f"hydrax {text}")
    set_shape(args.shape)

    import zmq

    nbytes = int(np.prod(IMAGE_SHAPE)) + 4 * LABEL_SHAPE[0]
    print(f"batch: uint8{IMAGE_SHAPE} + int32{LABEL_SHAPE} = {nbytes / 1e6:.2f} MB; {args.transport}"
          f"{' over 127.0.0.1' if args.transport == 'tcp' else ''}; {args.warmup} warm-up + {args.batches} measured batches "
          f"per run; medians of {args.repeats}; pyzmq {zmq.__version__}, libzmq {zmq.zmq_version()}; {os.cpu_count()} CPUs")
    folder = tempfile.mkdtemp(prefix="hydrax-bench-serve-")
    runs: dict[str, list[dict]] = {key: [] for key in args.contenders}
    try:
        number = 0
        for repeat in range(args.repeats):
            for key in args.contenders:
                number += 1
                result = trial(key, args, folder, number)
                runs[key].append(result)
                print(f"  run {repeat + 1}: {CONTENDERS[key][0]:24} {result['mb_per_s']:8.0f} MB/s  consumer {result['consumer_ms']:6.2f} ms"
                      f"  producer {result['producer_ms']:6.2f} ms CPU/batch", flush=True)
        profiles = {}
        if args.profile:
            for key in args.contenders:
                if CONTENDERS[key][1] == "hydrax":
                    for clock in ("wall", "cpu"):
                        number += 1
                        profiles[f"{key} ({clock})"] = trial(key, args, folder, number, profile=clock)["profile"]
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    medians = {key: {field: statistics.median(r[field] for r in results) for field in ("mb_per_s", "consumer_ms", "consumer_main_ms", "producer_ms", "faults")}
               for key, results in runs.items()}
    raw, tensorcom = medians.get("raw"), medians.get("tensorcom")

    def ratio(a: float, b: dict | None, field: str) -> str:
        return f"{a / b[field]:.2f}x" if b else "-"

    print()
    print("| contender | MB/s | consumer ms CPU/batch | of which main thread | producer ms CPU/batch | consumer faults/batch "
          "| MB/s vs raw | MB/s vs tensorcom | consumer CPU vs tensorcom | MB/s runs |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for key, m in medians.items():
        values = ", ".join(f"{r['mb_per_s']:,.0f}" for r in runs[key])
        print(f"| {CONTENDERS[key][0]} | {m['mb_per_s']:,.0f} | {m['consumer_ms']:.2f} | {m['consumer_main_ms']:.2f} | {m['producer_ms']:.2f} | {m['faults']:,.0f} "
              f"| {ratio(m['mb_per_s'], raw, 'mb_per_s')} | {ratio(m['mb_per_s'], tensorcom, 'mb_per_s')} "
              f"| {ratio(m['consumer_ms'], tensorcom, 'consumer_ms')} | {values} |")
    verdicts = {}
    print()
    for key in (k for k in medians if CONTENDERS[k][1] == "hydrax"):
        m = medians[key]
        checks = []  # (name, ratio of medians, passes, the ratios of each repeat's interleaved runs)
        for base, field, limit, name in (("raw", "mb_per_s", TARGETS["raw"], "MB/s >= 0.8x raw pyzmq"),
                                         ("tensorcom", "mb_per_s", TARGETS["tensorcom"], "MB/s >= 1.5x tensorcom"),
                                         ("tensorcom", "consumer_ms", TARGETS["cpu"], "consumer CPU/batch <= 0.6x tensorcom")):
            if base not in medians:
                continue
            value = m[field] / medians[base][field]
            ok = value <= limit if field == "consumer_ms" else value >= limit
            paired = [r[field] / b[field] for r, b in zip(runs[key], runs[base])]
            checks.append((name, value, ok, paired))
        verdicts[key] = {name: {"ratio": value, "pass": ok, "per_repeat": paired} for name, value, ok, paired in checks}
        target = {"hydrax": " (through the socket)", "hydrax-shm": " (one host)"}.get(key, "")
        print(f"{CONTENDERS[key][0]}{target}: " + "; ".join(
            f"{name}: {value:.3f}x {'PASS' if ok else 'FAIL'} (per repeat {', '.join(f'{p:.2f}' for p in paired)})"
            for name, value, ok, paired in checks))
    for name, text in profiles.items():
        print(f"\n== consumer profile: {name}, {args.batches} batches ==\n{text}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items() if k != "child"}, "batch_bytes": nbytes,
                       "runs": {k: [{f: v for f, v in r.items() if f != "profile"} for r in rs] for k, rs in runs.items()},
                       "medians": medians, "verdicts": verdicts, "profiles": profiles}, f, indent=1)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()

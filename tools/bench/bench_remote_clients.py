"""Benchmark: which client should hydrax use for remote shards (S3, and GCS and HTTP(S))?

    python tools/bench/bench_remote_clients.py [--repeat 3] [--small 1000] [--ranges 600] [--sequential 50]
                                               [--only perf,checks,fork,gcs,http]

Candidates: boto3 with a thread pool (what hydrax's remote shards used when this was written),
fsspec's s3fs (aiobotocore under an asyncio loop in a background thread), and obstore (Rust
``object_store`` under a tokio runtime), driven from asyncio and from a thread pool. hydrax has
used obstore since, chosen from these measurements (``hydrax/shards/store.py``; the figures are in
``docs/object-storage.rst``); boto3 is left only in the tests and benchmarks, which fill moto's buckets with it.

Starts moto's S3 server in its own process, and ``tests/support/netproxy.py`` in another with three ports
in front of it: no delay (for the fault checks), 20 ms and 50 ms per request (plus as much again
for the first request of each new connection: a TCP handshake). Moto's server closes every
connection after each answer; the proxy keeps the client's connections alive, as a real store
would. Then it measures, interleaved (each repeat runs every case, every endpoint, every client,
the client order rotating), medians of ``--repeat``:

0. ``sequential``: ``--sequential`` (50) ranged reads of 40 KB one after the other, as a
   loader worker reading sample by sample does: the time per read shows each client's own
   overhead on top of the latency (and whether it keeps its connection);
1. ``small``: ``--small`` objects of 20 KB (like index files) fetched whole, 64 in flight;
2. ``ranges``: ``--ranges`` random 40 KB ranges of 8 objects of 10 MB, 32 in flight (moto
   copies the whole object for every ranged GET, about 5 ms each here: the ``direct`` column is
   moto's own ceiling; the brief's 2,000 ranges take ``--ranges 2000`` and three times longer);
3. ``stream``: the 8 objects of 10 MB read whole, one stream each, 4 at a time;
4. ``list``: LIST of the 1,000 small objects, with sizes and ETags;

reporting wall time (and throughput), CPU time of this process (``getrusage``: every thread,
the clients' own runtimes included) per object or range, and the requests each op cost (from
the proxy's counters: HEADs and extra GETs show there).

Then functional checks: conditional reads (If-Match on GET and ranged GET, version pinning)
against moto, the exceptions for a missing object, access denied (a canned S3 403 from the
proxy), a truncated body, a reset connection, a 503 SlowDown and a dead server (the proxy's
faults), and whether each client retries them; fork safety (a client used in the parent, then
used, or made anew, in a child forked with ``os.fork`` semantics); and whether obstore and gcsfs
talk to ``gcp-storage-emulator`` and obstore and fsspec to a plain HTTP server with Range support.
Prints markdown tables. Takes about eight minutes on two cores with the defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import http.server
import json
import multiprocessing
import os
import random
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
from pathlib import Path
from typing import Any, Callable

# the delaying proxy is a test helper, tests/support/netproxy.py (spawned children get this sys.path too)
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

KEYS = {"access_key_id": "testing", "secret_access_key": "testing", "region": "us-east-1"}
BUCKET = "data"
SMALL_SIZE = 20_000
BIG_SIZE = 10 * 1024 * 1024
BIG_COUNT = 8
RANGE_SIZE = 40 * 1024
SMALL_INFLIGHT = 64
RANGE_INFLIGHT = 32
STREAMS = 4
CHUNK = 1024 * 1024
DELAYS = {"fault": 0.0, "20 ms": 0.02, "50 ms": 0.05}


# ---------------------------------------------------------------------------------------------
# servers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@contextlib.contextmanager
def server_process(argv: list[str], port: int):
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _proxy_child(upstream_port: int, delays: list[float], conn) -> None:
    """Runs in its own process: one netproxy.Proxy per delay, driven over ``conn``."""
    from support.netproxy import Proxy, s3_error

    proxies = [Proxy("127.0.0.1", upstream_port, d, connect_delay=d) for d in delays]
    conn.send([p.start() for p in proxies])
    while True:
        message = conn.recv()
        if message is None:
            break
        index, method, args, kwargs = message
        try:
            if method == "s3_error":
                proxies[index].respond_next(args[0], s3_error(*args[1:]), **kwargs)
                conn.send(None)
            elif method == "fired":
                conn.send(dict(proxies[index].fired))
            else:
                conn.send(getattr(proxies[index], method)(*args, **kwargs))
        except Exception as exc:  # noqa: BLE001 - handed back
            conn.send(exc)
    for p in proxies:
        p.stop()


class Proxies:
    """tests/support/netproxy.py proxies in a process of their own (their CPU is not ours)."""

    def __init__(self, upstream_port: int, delays: dict[str, float]):
        self.names = list(delays)
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_proxy_child, args=(upstream_port, list(delays.values()), child),
                                       daemon=True)
        self.process.start()
        self.ports = dict(zip(self.names, self.conn.recv()))

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def call(self, name: str, method: str, *args, **kwargs) -> Any:
        self.conn.send((self.names.index(name), method, args, kwargs))
        reply = self.conn.recv()
        if isinstance(reply, Exception):
            raise reply
        return reply

    def close(self) -> None:
        self.conn.send(None)
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


def s3_endpoints(proxies: Proxies, moto_url: str) -> dict[str, str]:
    return {"20 ms": proxies.url("20 ms"), "50 ms": proxies.url("50 ms"), "direct": moto_url}


# ---------------------------------------------------------------------------------------------
# the clients, each as the same four operations


class Boto3Client:
    name = "boto3 + threads"

    def __init__(self, endpoint: str, pool: int = SMALL_INFLIGHT, attempts: int = 5):
        import boto3
        from botocore.config import Config

        self.client = boto3.client("s3", endpoint_url=endpoint, region_name=KEYS["region"],
                                   aws_access_key_id=KEYS["access_key_id"],
                                   aws_secret_access_key=KEYS["secret_access_key"],
                                   config=Config(max_pool_connections=pool,
                                                 retries={"total_max_attempts": attempts, "mode": "standard"}))
        self.threads = concurrent.futures.ThreadPoolExecutor(pool)

    def get(self, key: str, **extra) -> bytes:
        body = self.client.get_object(Bucket=BUCKET, Key=key, **extra)["Body"]
        try:
            return body.read()
        finally:
            body.close()

    def small(self, keys: list[str]) -> list[bytes]:
        return list(self.threads.map(self.get, keys))

    def ranges(self, ranges: list[tuple[str, int, int]]) -> list[bytes]:
        with concurrent.futures.ThreadPoolExecutor(RANGE_INFLIGHT) as pool:
            return list(pool.map(lambda r: self.get(r[0], Range=f"bytes={r[1]}-{r[1] + r[2] - 1}"), ranges))

    def sequential(self, ranges: list[tuple[str, int, int]]) -> list[bytes]:
        return [self.get(k, Range=f"bytes={s}-{s + n - 1}") for k, s, n in ranges]

    def _stream(self, key: str) -> int:
        body = self.client.get_object(Bucket=BUCKET, Key=key)["Body"]
        return sum(len(piece) for piece in body.iter_chunks(CHUNK))

    def stream(self, keys: list[str]) -> int:
        with concurrent.futures.ThreadPoolExecutor(STREAMS) as pool:
            return sum(pool.map(self._stream, keys))

    def listing(self, prefix: str) -> list[tuple[str, int, str]]:
        found = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
            found += [(o["Key"], o["Size"], o["ETag"]) for o in page.get("Contents", [])]
        return found

    def close(self) -> None:
        self.threads.shutdown()


class S3fsClient:
    name = "s3fs (fsspec)"

    def __init__(self, endpoint: str, pool: int = SMALL_INFLIGHT, **extra):
        import s3fs

        options = {"key": KEYS["access_key_id"], "secret": KEYS["secret_access_key"], "endpoint_url": endpoint,
                   "client_kwargs": {"region_name": KEYS["region"]},
                   "config_kwargs": {"max_pool_connections": pool},
                   # max_concurrency=1: else cat_file of a whole object HEADs it first
                   "max_concurrency": 1, "skip_instance_cache": True, "use_listings_cache": False}
        retries = extra.pop("retries", None)
        options.update(extra)
        self.fs = s3fs.S3FileSystem(**options)
        if retries is not None:
            self.fs.retries = retries  # s3fs's own retry loop (a class attribute, 5 by default)

    def get(self, key: str) -> bytes:
        return self.fs.cat_file(f"{BUCKET}/{key}")

    def small(self, keys: list[str]) -> list[bytes]:
        paths = [f"{BUCKET}/{k}" for k in keys]
        found = self.fs.cat(paths, batch_size=SMALL_INFLIGHT)
        return [found[p] for p in paths]

    def ranges(self, ranges: list[tuple[str, int, int]]) -> list[bytes]:
        return self.fs.cat_ranges([f"{BUCKET}/{k}" for k, _, _ in ranges], [s for _, s, _ in ranges],
                                  [s + n for _, s, n in ranges], batch_size=RANGE_INFLIGHT, on_error="raise")

    def sequential(self, ranges: list[tuple[str, int, int]]) -> list[bytes]:
        return [self.fs.cat_file(f"{BUCKET}/{k}", start=s, end=s + n) for k, s, n in ranges]

    def _stream(self, key: str) -> int:
        total = 0
        with self.fs.open(f"{BUCKET}/{key}", "rb", block_size=8 * CHUNK) as f:
            while piece := f.read(CHUNK):
                total += len(piece)
        return total

    def stream(self, keys: list[str]) -> int:
        with concurrent.futures.ThreadPoolExecutor(STREAMS) as pool:
            return sum(pool.map(self._stream, keys))

    def listing(self, prefix: str) -> list[tuple[str, int, str]]:
        found = self.fs.ls(f"{BUCKET}/{prefix.rstrip('/')}", detail=True, refresh=True)
        return [(o["Key"].split("/", 1)[1], o["size"], o["ETag"]) for o in found]

    def close(self) -> None:
        pass


def obstore_s3(endpoint: str, bucket: str = BUCKET, **extra):
    from obstore.store import S3Store

    options = dict(endpoint=endpoint, region=KEYS["region"], access_key_id=KEYS["access_key_id"],
                   secret_access_key=KEYS["secret_access_key"], virtual_hosted_style_request=False,
                   client_options={"allow_http": True})
    options.update(extra)
    return S3Store(bucket, **options)


class ObstoreAsyncClient:
    name = "obstore + asyncio"

    def __init__(self, endpoint: str, **extra):
        self.store = obstore_s3(endpoint, **extra)
        self.loop = asyncio.new_event_loop()

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def get(self, key: str, **options) -> bytes:
        import obstore as obs

        return bytes(obs.get(self.store, key, options=options or None).bytes())

    async def _bounded(self, jobs: list[Callable], limit: int) -> list:
        gate = asyncio.Semaphore(limit)

        async def one(job):
            async with gate:
                return await job()

        return await asyncio.gather(*(one(j) for j in jobs))

    def small(self, keys: list[str]) -> list:
        import obstore as obs

        async def fetch(key):
            return await (await obs.get_async(self.store, key)).bytes_async()

        return self.run(self._bounded([lambda k=k: fetch(k) for k in keys], SMALL_INFLIGHT))

    def ranges(self, ranges: list[tuple[str, int, int]]) -> list:
        import obstore as obs

        return self.run(self._bounded([lambda r=r: obs.get_range_async(self.store, r[0], start=r[1], length=r[2])
                                       for r in ranges], RANGE_INFLIGHT))

    def sequential(self, ranges: list[tuple[str, int, int]]) -> list:
        import obstore as obs

        async def one_by_one():
            return [await obs.get_range_async(self.store, k, start=s, length=n) for k, s, n in ranges]

        return self.run(one_by_one())

    def ranges_coalesced(self, ranges: list[tuple[str, int, int]]) -> list:
        """One get_ranges per object (obstore merges ranges under 1 MB apart), the objects at once."""
        import obstore as obs

        by_key: dict[str, list[int]] = {}
        for i, (k, _, _) in enumerate(ranges):
            by_key.setdefault(k, []).append(i)

        async def per_key(key, indices):
            return indices, await obs.get_ranges_async(self.store, key, starts=[ranges[i][1] for i in indices],
                                                       lengths=[ranges[i][2] for i in indices])

        async def all_keys():
            return await asyncio.gather(*(per_key(k, v) for k, v in by_key.items()))

        out: list = [None] * len(ranges)
        for indices, pieces in self.run(all_keys()):
            for i, piece in zip(indices, pieces):
                out[i] = piece
        return out

    def stream(self, keys: list[str]) -> int:
        import obstore as obs

        async def one(key):
            total = 0
            async for piece in (await obs.get_async(self.store, key)).stream(min_chunk_size=CHUNK):
                total += len(piece)
            return total

        return sum(self.run(self._bounded([lambda k=k: one(k) for k in keys], STREAMS)))

    def listing(self, prefix: str) -> list[tuple[str, int, str]]:
        import obstore as obs

        found = []
        for chunk in obs.list(self.store, prefix=prefix, chunk_size=1000):
            found += [(o["path"], o["size"], o["e_tag"]) for o in chunk]
        return found

    def close(self) -> None:
        self.loop.close()


class ObstoreThreadsClient(ObstoreAsyncClient):
    name = "obstore + threads"

    def __init__(self, endpoint: str, **extra):
        super().__init__(endpoint, **extra)
        self.threads = concurrent.futures.ThreadPoolExecutor(SMALL_INFLIGHT)

    def small(self, keys: list[str]) -> list:
        import obstore as obs

        return list(self.threads.map(lambda k: obs.get(self.store, k).bytes(), keys))

    def ranges(self, ranges: list[tuple[str, int, int]]) -> list:
        import obstore as obs

        with concurrent.futures.ThreadPoolExecutor(RANGE_INFLIGHT) as pool:
            return list(pool.map(lambda r: obs.get_range(self.store, r[0], start=r[1], length=r[2]), ranges))

    def sequential(self, ranges: list[tuple[str, int, int]]) -> list:
        import obstore as obs

        return [obs.get_range(self.store, k, start=s, length=n) for k, s, n in ranges]

    def stream(self, keys: list[str]) -> int:
        import obstore as obs

        def one(key):
            return sum(len(piece) for piece in obs.get(self.store, key).stream(min_chunk_size=CHUNK))

        with concurrent.futures.ThreadPoolExecutor(STREAMS) as pool:
            return sum(pool.map(one, keys))

    def close(self) -> None:
        self.threads.shutdown()
        super().close()


CLIENTS = [Boto3Client, S3fsClient, ObstoreAsyncClient, ObstoreThreadsClient]


# ---------------------------------------------------------------------------------------------
# data


def fill_bucket(moto_url: str, small: int) -> tuple[dict[str, bytes], dict[str, bytes]]:
    import boto3
    from botocore.config import Config

    client = boto3.client("s3", endpoint_url=moto_url, region_name=KEYS["region"],
                          aws_access_key_id=KEYS["access_key_id"], aws_secret_access_key=KEYS["secret_access_key"],
                          config=Config(max_pool_connections=16))
    client.create_bucket(Bucket=BUCKET)
    rng = random.Random(1)
    smalls = {f"small/{i:05d}.idx": rng.randbytes(SMALL_SIZE) for i in range(small)}
    bigs = {f"big/{i}.tar": rng.randbytes(BIG_SIZE) for i in range(BIG_COUNT)}
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda kv: client.put_object(Bucket=BUCKET, Key=kv[0], Body=kv[1]),
                      list(smalls.items()) + list(bigs.items())))
    return smalls, bigs


# ---------------------------------------------------------------------------------------------
# performance


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(run: Callable[[], Any]) -> tuple[float, float, Any]:
    cpu, wall = cpu_seconds(), time.perf_counter()
    out = run()
    return time.perf_counter() - wall, cpu_seconds() - cpu, out


def run_perf(args, proxies: Proxies, moto_url: str, smalls: dict[str, bytes], bigs: dict[str, bytes]) -> str:
    endpoints = s3_endpoints(proxies, moto_url)
    rng = random.Random(2)
    small_keys = sorted(smalls)
    big_keys = sorted(bigs)
    ranges = [(k, rng.randrange(0, BIG_SIZE - RANGE_SIZE), RANGE_SIZE)
              for k in (rng.choice(big_keys) for _ in range(args.ranges))]

    clients = {(cls.name, where): cls(url) for cls in CLIENTS for where, url in endpoints.items()}
    for client in clients.values():  # warm: credentials, connection pools, imports
        client.get(small_keys[0])

    sequential = ranges[:args.sequential]
    cases: list[tuple[str, int, Callable]] = [
        ("sequential", len(sequential), lambda c: c.sequential(sequential)),
        ("small", len(small_keys), lambda c: c.small(small_keys)),
        ("ranges", len(ranges), lambda c: c.ranges(ranges)),
        ("stream", len(big_keys), lambda c: c.stream(big_keys)),
        ("list", 1, lambda c: c.listing("small/")),
    ]
    extra_rows = [("obstore + asyncio", "ranges (get_ranges, coalesced)", len(ranges),
                   lambda c: c.ranges_coalesced(ranges))]

    def check(case: str, out: Any) -> None:
        if case == "small":
            assert all(bytes(a) == smalls[k] for a, k in zip(out, small_keys)), "small: wrong bytes"
        elif case.startswith("ranges") or case == "sequential":
            assert all(bytes(a) == bigs[k][s:s + n] for a, (k, s, n) in zip(out, ranges)), f"{case}: wrong bytes"
        elif case == "stream":
            assert out == BIG_SIZE * len(big_keys), "stream: wrong size"
        elif case == "list":
            assert sorted((k, n) for k, n, _ in out) == sorted((k, len(v)) for k, v in smalls.items())
            assert all(e for _, _, e in out), "list: no ETags"

    results: dict[tuple[str, str, str], list[tuple[float, float, float | None, float | None]]] = {}
    started = time.monotonic()
    for rep in range(args.repeat):
        for case, ops, work in cases + [(c, n, w) for _, c, n, w in extra_rows]:
            names = [n for n, c, _, _ in extra_rows if c == case] or [cls.name for cls in CLIENTS]
            names = names[rep % len(names):] + names[:rep % len(names)]
            for where in endpoints:
                for name in names:
                    proxied = where != "direct"
                    if proxied:
                        proxies.call(where, "clear")
                    wall, cpu, out = measure(lambda work=work, name=name, where=where: work(clients[name, where]))
                    check(case, out)
                    requests = body = None
                    if proxied:
                        stats = proxies.call(where, "stats")
                        requests, body = stats["requests"] / ops, stats["body_bytes_down"] / ops
                    results.setdefault((name, case, where), []).append((wall, cpu / ops, requests, body))
        print(f"  repeat {rep + 1}/{args.repeat} done ({time.monotonic() - started:.0f} s)", file=sys.stderr)
    for client in clients.values():
        client.close()

    def cell(name: str, case: str, where: str) -> str:
        rows = results.get((name, case, where))
        if not rows:
            return ""
        wall = statistics.median(r[0] for r in rows)
        ops = dict((c, n) for c, n, _ in cases).get(case, len(ranges))
        if case == "sequential":
            return f"{wall / ops * 1000:.1f} ms/range"
        if case == "stream":
            return f"{wall:.2f} s ({BIG_SIZE * ops / wall / 1e6:.0f} MB/s)"
        if case == "list":
            return f"{wall * 1000:.0f} ms"
        return f"{wall:.2f} s ({ops / wall:.0f}/s)"

    def cpu_cell(name: str, case: str) -> str:
        return " / ".join(f"{statistics.median(r[1] for r in results[name, case, w]) * 1000:.2f}"
                          for w in endpoints)

    def requests_cell(name: str, case: str) -> str:
        rows = results[name, case, "20 ms"]
        req = statistics.median(r[2] for r in rows)
        body = statistics.median(r[3] for r in rows)
        return f"{req:.2f} ({body / 1e3:.0f} KB)"

    lines = [f"Medians of {args.repeat}; {len(sequential)} ranges of {RANGE_SIZE // 1024} KiB one after the other "
             f"(one in flight, as a loader worker reading sample by sample), "
             f"{len(small_keys)} small objects of {SMALL_SIZE // 1000} KB "
             f"({SMALL_INFLIGHT} in flight), {len(ranges)} ranges of {RANGE_SIZE // 1024} KiB from {BIG_COUNT} "
             f"objects of {BIG_SIZE >> 20} MiB ({RANGE_INFLIGHT} in flight), {BIG_COUNT} streams of "
             f"{BIG_SIZE >> 20} MiB ({STREAMS} at a time), LIST of {len(small_keys)}. Cells: wall time (rate). "
             f"CPU: this process's CPU ms per object/range/stream/list (20 ms / 50 ms / direct). Requests: per op "
             f"through the 20 ms proxy (body bytes per op).", "",
             "| client | case | 20 ms | 50 ms | direct | CPU ms/op | requests/op |",
             "|---|---|---|---|---|---|---|"]
    for case, _, _ in cases + [(c, n, w) for _, c, n, w in extra_rows]:
        names = [n for n, c, _, _ in extra_rows if c == case] or [cls.name for cls in CLIENTS]
        for name in names:
            lines.append(f"| {name} | {case} | {cell(name, case, '20 ms')} | {cell(name, case, '50 ms')} | "
                         f"{cell(name, case, 'direct')} | {cpu_cell(name, case)} | {requests_cell(name, case)} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# functional checks


def describe(exc: BaseException) -> str:
    """``module.Type`` of an exception, with the S3 error code or status where there is one."""
    kind = f"{type(exc).__module__}.{type(exc).__qualname__}".replace("builtins.", "")
    response = getattr(exc, "response", None)
    if isinstance(response, dict) and response.get("Error"):
        kind += f" [{response['Error'].get('Code')}, HTTP {response.get('ResponseMetadata', {}).get('HTTPStatusCode')}]"
    builtin = [b for b in (FileNotFoundError, PermissionError, ConnectionError, TimeoutError, OSError)
               if isinstance(exc, b) and type(exc) is not b]
    if builtin:
        kind += f" (is {builtin[0].__name__})"
    message = " ".join(str(exc).split())
    return f"{kind} :: {message[:300]}" if message else kind


def brief(run: Callable[[], Any], expect: Any = None) -> str:
    return short(attempt(run, expect), 160)


def short(text: str, limit: int = 110) -> str:
    """``attempt``'s answer with its message cut short, for a table cell."""
    text = text.replace(" :: ", ": ")
    return text if len(text) <= limit else text[:limit] + "..."


def attempt(run: Callable[[], Any], expect: Any = None) -> str:
    try:
        out = run()
    except Exception as exc:  # noqa: BLE001 - the point is to see it
        return "raises " + describe(exc)
    if expect is not None and bytes(out) != expect:
        return f"WRONG DATA ({len(out)} bytes)"
    return "ok"


def run_checks(proxies: Proxies, moto_url: str) -> str:
    import boto3

    admin = boto3.client("s3", endpoint_url=moto_url, region_name=KEYS["region"],
                         aws_access_key_id=KEYS["access_key_id"], aws_secret_access_key=KEYS["secret_access_key"])
    payload = bytes(range(256)) * 800  # 200 KB
    admin.put_object(Bucket=BUCKET, Key="check/obj", Body=payload)
    etag = admin.head_object(Bucket=BUCKET, Key="check/obj")["ETag"]
    admin.create_bucket(Bucket="versioned")
    admin.put_bucket_versioning(Bucket="versioned", VersioningConfiguration={"Status": "Enabled"})
    v1 = admin.put_object(Bucket="versioned", Key="obj", Body=b"version one")["VersionId"]
    admin.put_object(Bucket="versioned", Key="obj", Body=b"version two")
    url = proxies.url("fault")
    bad = '"0123456789abcdef0123456789abcdef"'
    rows: dict[str, dict[str, str]] = {}

    def with_fault(method: str, *fargs, **fkw):
        def wrap(run):
            proxies.call("fault", "clear")
            proxies.call("fault", "disarm")
            proxies.call("fault", method, *fargs, **fkw)
            result = attempt(run, payload)
            stats = proxies.call("fault", "stats")
            gets = [r.range or "whole" for r in proxies.call("fault", "requests_matching", None, "GET")]
            proxies.call("fault", "disarm")
            fired = sum(stats["fired"].values())
            head, _, message = result.partition(" :: ")
            return (f"{head} ({len(gets)} GETs: {', '.join(gets)}; fault fired {fired}x)"
                    + (f" :: {message}" if message else ""))
        return wrap

    def failure_rows(get) -> dict[str, str]:
        """What ``get`` (a client's whole-object read) does on each failure the proxy can make."""
        found = {
            "missing object": attempt(lambda: get("check/missing")),
            "access denied (403)": with_fault("s3_error", 1, "AccessDenied")(lambda: get("check/obj")),
            "truncated body": with_fault("truncate_next", 1, 1000)(lambda: get("check/obj")),
            "reset connection": with_fault("reset_next", 1)(lambda: get("check/obj")),
            "503 SlowDown": with_fault("s3_error", 1, "SlowDown")(lambda: get("check/obj")),
        }
        proxies.call("fault", "down")
        found["server down (refused)"] = attempt(lambda: get("check/obj"))
        proxies.call("fault", "up")
        return found

    # boto3 -----------------------------------------------------------------------------------
    b = Boto3Client(url, pool=4, attempts=3)
    rows["boto3"] = {
        "If-Match, right ETag": attempt(lambda: b.get("check/obj", IfMatch=etag), payload),
        "If-Match, wrong ETag": attempt(lambda: b.get("check/obj", IfMatch=bad)),
        "ranged GET + If-Match, wrong": attempt(lambda: b.get("check/obj", IfMatch=bad, Range="bytes=0-99")),
        "version pinning": attempt(lambda: b.client.get_object(Bucket="versioned", Key="obj", VersionId=v1)["Body"].read(),
                                   b"version one"),
        **failure_rows(b.get),
    }
    b.close()

    # s3fs -------------------------------------------------------------------------------------
    s = S3fsClient(url, pool=4, retries=3)
    sv = S3fsClient(moto_url, pool=4, version_aware=True)

    def s3fs_pinned_open():
        # s3fs pins the ETag seen when a file is opened (If-Match on every read); change it after
        with s.fs.open(f"{BUCKET}/check/pinned", "rb", block_size=1024) as f:
            first = f.read(10)
            admin.put_object(Bucket=BUCKET, Key="check/pinned", Body=b"changed" * 1000)
            return first + f.read()

    admin.put_object(Bucket=BUCKET, Key="check/pinned", Body=payload)
    rows["s3fs"] = {
        "If-Match, right ETag": "no per-call option (only S3FileSystem(s3_additional_kwargs=...), for every call)",
        "If-Match, wrong ETag": "n/a; open() sends If-Match with the ETag its HEAD saw; object changed after open: "
                                + attempt(s3fs_pinned_open),
        "ranged GET + If-Match, wrong": "as above (open() reads are ranged)",
        "version pinning": attempt(lambda: sv.fs.cat_file("versioned/obj", version_id=v1), b"version one")
                           + " (needs version_aware=True)",
        **failure_rows(s.get),
    }

    # obstore ----------------------------------------------------------------------------------
    from datetime import timedelta

    o = ObstoreAsyncClient(url, retry_config={"max_retries": 2, "backoff": {"init_backoff": timedelta(milliseconds=50)}})
    ov = ObstoreAsyncClient(moto_url)
    ov.store = obstore_s3(moto_url, bucket="versioned")
    rows["obstore"] = {
        "If-Match, right ETag": attempt(lambda: o.get("check/obj", if_match=etag), payload),
        "If-Match, wrong ETag": attempt(lambda: o.get("check/obj", if_match=bad)),
        "ranged GET + If-Match, wrong": attempt(lambda: o.get("check/obj", if_match=bad, range=(0, 100))),
        "version pinning": attempt(lambda: ov.get("obj", version=v1), b"version one"),
        **failure_rows(o.get),
    }
    o.close()
    ov.close()

    # s3fs's default (max_concurrency=10) HEADs before a whole-object cat_file
    proxies.call("fault", "clear")
    S3fsClient(url, max_concurrency=10).get("check/obj")
    head_note = proxies.call("fault", "stats")["methods"]

    lines = ["| check | " + " | ".join(rows) + " |", "|---|" + "---|" * len(rows)]
    for check in rows["boto3"]:
        lines.append(f"| {check} | " + " | ".join(rows[c].get(check, "").split(" :: ")[0] for c in rows) + " |")
    lines += ["", f"s3fs with its default max_concurrency=10, one cat_file of a whole object: requests {head_note}",
              "", "The messages:", ""]
    for client, checks in rows.items():
        for check, text in checks.items():
            if " :: " in text:
                lines.append(f"- {client}, {check}: {text.split(' :: ', 1)[1]}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# fork


FORK_TIMEOUT = 8.0
FORK_CLIENTS = {cls.name: cls for cls in (Boto3Client, S3fsClient, ObstoreAsyncClient, ObstoreThreadsClient)}


def _with_timeout(run: Callable[[], str], timeout: float) -> str:
    """``run()`` in a thread; "HANGS" if it has not finished after ``timeout`` seconds."""
    box: list[str] = []
    thread = threading.Thread(target=lambda: box.append(run()), daemon=True)
    thread.start()
    thread.join(timeout)
    return box[0] if box else f"HANGS (no answer in {timeout:.0f} s)"


def fork_scenario(client_name: str, moto_url: str, child_mode: str, parent_uses: bool) -> None:
    """Runs in a fresh process: prints one JSON line per step (a step that never prints hung)."""

    def report(step: str, result: str) -> None:
        print(json.dumps({step: result}), flush=True)

    cls = FORK_CLIENTS[client_name]
    client = cls(moto_url)
    if parent_uses:  # the parent used it, concurrently, so its pools and runtimes are warm
        report("parent before", attempt(lambda: client.small([f"small/{i:05d}.idx" for i in range(64)]) and b"x"))
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)

    def child() -> None:
        if child_mode == "idle":
            send.send("(does not use it)")
            return
        made = cls(moto_url) if child_mode == "new" else client
        send.send(attempt(lambda: made.get("small/00001.idx")))

    process = context.Process(target=child)
    process.start()
    report("child pid", str(process.pid))
    process.join(FORK_TIMEOUT)
    if process.is_alive():
        process.kill()
        process.join()
        report("child", f"HANGS (killed after {FORK_TIMEOUT:.0f} s)")
    elif receive.poll():
        report("child", receive.recv())
    else:
        report("child", f"CRASHES (exit code {process.exitcode})")
    report("parent after", _with_timeout(lambda: attempt(lambda: client.get("small/00002.idx")), FORK_TIMEOUT))
    sys.stdout.flush()
    os._exit(0)  # a hung client thread must not hold up the exit


def run_fork(moto_url: str) -> str:
    rows = []
    scenarios = [(name, "inherited", True) for name in FORK_CLIENTS] + [(name, "new", True) for name in FORK_CLIENTS]
    scenarios += [("obstore + threads", "idle", True), ("obstore + asyncio", "inherited", False),
                  ("obstore + asyncio", "new", False)]
    says = {"inherited": "uses the parent's client", "new": "makes a new client", "idle": "does not use it"}
    for name, mode, used in scenarios:
        argv = [sys.executable, __file__, "--fork-scenario", name, "--endpoint", moto_url, "--child", mode]
        argv += [] if used else ["--parent-idle"]
        # output to a file, not a pipe: an orphaned, hung child would hold a pipe open
        with open(os.devnull, "wb") as null, tempfile.TemporaryFile("w+") as out:
            process = subprocess.Popen(argv, stdout=out, stderr=null)
            try:
                code = process.wait(4 * FORK_TIMEOUT)
                fate = f"CRASHES (the parent process died: signal {-code})" if code < 0 else "(no answer)"
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                fate = "HANGS (the parent process did not finish)"
            out.seek(0)
            steps: dict[str, str] = {}
            for line in out.read().splitlines():
                with contextlib.suppress(ValueError):
                    steps.update(json.loads(line))
        with contextlib.suppress(KeyError, ValueError, ProcessLookupError):
            os.kill(int(steps["child pid"]), 9)  # a hung child outlives a parent that crashed
        steps = {k: v for k, v in steps.items() if k != "child pid"}
        for step in ("parent before", "child", "parent after"):
            steps.setdefault(step, fate)
        rows.append((name, says[mode], short(steps["parent before"]) if used else "(made, not used)",
                     short(steps["child"]), short(steps["parent after"])))
    lines = ["| client | child | parent before the fork | child's GET | parent's GET after the fork |",
             "|---|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} | {e} |" for a, b, c, d, e in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# GCS (gcp-storage-emulator) and plain HTTP


def run_gcs() -> str:
    port = free_port()
    argv = [sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1", "--port", str(port),
            "--in-memory", "--default-bucket", BUCKET, "--quiet"]
    base = f"http://127.0.0.1:{port}"
    payload = bytes(range(256)) * 400
    out = []
    with server_process(argv, port):
        request = urllib.request.Request(f"{base}/upload/storage/v1/b/{BUCKET}/o?uploadType=media&name=dir/obj.bin",
                                         data=payload, method="POST", headers={"Content-Type": "application/octet-stream"})
        urllib.request.urlopen(request).read()
        try:
            import obstore as obs
            from obstore.store import GCSStore

            store = GCSStore(BUCKET, base_url=base, skip_signature=True, client_options={"allow_http": True})
            out.append("obstore `GCSStore(bucket, base_url=URL, skip_signature=True, client_options={'allow_http': True})`: "
                       + ", ".join([
                           "get " + brief(lambda: obs.get(store, "dir/obj.bin").bytes(), payload),
                           "get_range " + brief(lambda: obs.get_range(store, "dir/obj.bin", start=10, length=100),
                                                  payload[10:110]),
                           "head " + brief(lambda: obs.head(store, "dir/obj.bin")["size"] == len(payload) or 1/0),
                           "list " + brief(lambda: [m["path"] for c in obs.list(store, prefix="dir/") for m in c]
                                             == ["dir/obj.bin"] or 1/0),
                           "missing " + brief(lambda: obs.get(store, "dir/none").bytes()),
                       ]))
        except Exception:  # noqa: BLE001
            out.append("obstore GCS: " + traceback.format_exc().splitlines()[-1])
        try:
            # else gcsfs asks the store for the bucket's type over gRPC+TLS first: 60 s to time out, per bucket
            os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
            import gcsfs

            fs = gcsfs.GCSFileSystem(endpoint_url=base, token="anon", skip_instance_cache=True)
            began = time.perf_counter()
            out.append("gcsfs `GCSFileSystem(endpoint_url=URL, token='anon')` (and GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false "
                       "in the environment before importing gcsfs): " + ", ".join([
                "cat_file " + brief(lambda: fs.cat_file(f"{BUCKET}/dir/obj.bin"), payload),
                "ranged cat_file " + brief(lambda: fs.cat_file(f"{BUCKET}/dir/obj.bin", start=10, end=110),
                                              payload[10:110]),
                "ls " + brief(lambda: [o["name"] for o in fs.ls(f"{BUCKET}/dir", detail=True)] == [f"{BUCKET}/dir/obj.bin"] or 1/0),
                "missing " + brief(lambda: fs.cat_file(f"{BUCKET}/dir/none")),
            ]) + f" ({time.perf_counter() - began:.1f} s for the four)")
        except Exception:  # noqa: BLE001
            out.append("gcsfs: " + traceback.format_exc().splitlines()[-1])
    out.append("(gcp-storage-emulator serves the JSON API and a bare XML-style download; object_store's GCS client "
               "uses the XML API: HEAD and ?list-type=2 answer 501, downloads lack the Last-Modified it requires.)")
    return "\n".join(f"- {short(line, 2000)}" for line in out)


class RangeHandler(http.server.BaseHTTPRequestHandler):
    """GET and HEAD of in-memory files, honouring single ``Range: bytes=a-b`` requests."""

    protocol_version = "HTTP/1.1"
    files: dict[str, bytes] = {}

    def log_message(self, *args):
        pass

    def _answer(self, body: bool) -> None:
        data = self.files.get(self.path.split("?")[0])
        if data is None:
            self.send_error(404)
            return
        status, start, end = 200, 0, len(data)
        wanted = self.headers.get("Range")
        if wanted and wanted.startswith("bytes="):
            first, _, last = wanted[6:].partition("-")
            if first == "":
                start = max(0, len(data) - int(last))
            else:
                start, end = int(first), min(len(data), int(last) + 1 if last else len(data))
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206
        self.send_response(status)
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{hash(data) & 0xffffffff:08x}"')
        self.send_header("Last-Modified", self.date_time_string(0))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        self.end_headers()
        if body:
            self.wfile.write(data[start:end])

    def do_GET(self):
        self._answer(True)

    def do_HEAD(self):
        self._answer(False)


def run_http() -> str:
    payload = bytes(range(256)) * 400
    RangeHandler.files = {"/shards/a.tar": payload}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RangeHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    out = []
    try:
        import obstore as obs
        from obstore.store import HTTPStore

        store = HTTPStore.from_url(f"{base}/shards", client_options={"allow_http": True})  # no trailing /
        out.append("obstore `HTTPStore.from_url('http://host:port/shards', client_options={'allow_http': True})`: " + ", ".join([
            "get " + brief(lambda: obs.get(store, "a.tar").bytes(), payload),
            "get_range " + brief(lambda: obs.get_range(store, "a.tar", start=10, length=100), payload[10:110]),
            "head " + brief(lambda: obs.head(store, "a.tar")["size"] == len(payload) or 1/0),
            "list " + brief(lambda: list(obs.list(store))),
            "missing " + brief(lambda: obs.get(store, "none.tar").bytes()),
        ]))
        import fsspec

        fs = fsspec.filesystem("http", skip_instance_cache=True)
        out.append("fsspec `filesystem('http')`: " + ", ".join([
            "cat_file " + brief(lambda: fs.cat_file(f"{base}/shards/a.tar"), payload),
            "ranged cat_file " + brief(lambda: fs.cat_file(f"{base}/shards/a.tar", start=10, end=110), payload[10:110]),
            "size " + brief(lambda: fs.size(f"{base}/shards/a.tar") == len(payload) or 1/0),
            "missing " + brief(lambda: fs.cat_file(f"{base}/shards/none.tar")),
        ]))
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    return "\n".join(f"- {short(line, 2000)}" for line in out)


# ---------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--small", type=int, default=1000)
    parser.add_argument("--ranges", type=int, default=600)
    parser.add_argument("--sequential", type=int, default=50)
    parser.add_argument("--only", default="perf,checks,fork,gcs,http")
    parser.add_argument("--fork-scenario", help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    parser.add_argument("--child", default="inherited", help=argparse.SUPPRESS)
    parser.add_argument("--parent-idle", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fork_scenario:
        fork_scenario(args.fork_scenario, args.endpoint, args.child, not args.parent_idle)
        return
    parts = set(args.only.split(","))

    moto_port = free_port()
    moto_url = f"http://127.0.0.1:{moto_port}"
    started = time.monotonic()
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for package in ("boto3", "botocore", "s3fs", "aiobotocore", "fsspec", "obstore", "gcsfs", "moto"):
        with contextlib.suppress(PackageNotFoundError):
            found.append(f"{package} {version(package)}")
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start; "
          + ", ".join(found) + "\n", flush=True)
    with server_process([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(moto_port)], moto_port):
        proxies = Proxies(moto_port, DELAYS)
        try:
            if parts & {"perf", "checks", "fork"}:
                smalls, bigs = fill_bucket(moto_url, args.small)
                print(f"  bucket filled ({time.monotonic() - started:.0f} s)", file=sys.stderr)
            if "perf" in parts:
                print("## Performance\n\n" + run_perf(args, proxies, moto_url, smalls, bigs) + "\n", flush=True)
            if "checks" in parts:
                print("## Conditional reads and errors (through the proxy, no delay)\n\n"
                      + run_checks(proxies, moto_url) + "\n", flush=True)
            if "fork" in parts:
                print("## Fork safety (multiprocessing fork context)\n\n" + run_fork(moto_url) + "\n", flush=True)
        finally:
            proxies.close()
    if "gcs" in parts:
        print("## GCS (gcp-storage-emulator)\n\n" + run_gcs() + "\n", flush=True)
    if "http" in parts:
        print("## Plain HTTP server with Range\n\n" + run_http() + "\n", flush=True)
    print(f"Load average {os.getloadavg()[0]:.1f} at the end; {time.monotonic() - started:.0f} s in all.", flush=True)


if __name__ == "__main__":
    main()

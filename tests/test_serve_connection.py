"""hydrax.serve over real sockets between real processes: against tensorcom 0.1.0, and hydrax to hydrax.

The other side of each exchange runs in a *peer*: a spawned child process that runs commands
(send with tensorcom, send or receive with hydrax, ...) in threads, each with its own sockets,
while the test drives its side in this process. Every wait is bounded: Connections get a
``timeout``, tensorcom sockets ``RCVTIMEO``, and processes are joined with a timeout.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pytest
import zmq
from support.timing import slack, slack_int

from hydrax import tenbin
from hydrax.errors import MessageError, PeerTimeoutError, ServeError
from hydrax.serve import Connection, Curve, Statistics, curve_keypair
from hydrax.serve.envelope import DATA, EPOCH_END

TESTS = os.path.dirname(os.path.abspath(__file__))
PAIRS = [("zpush", "zpull"), ("zrpush", "zrpull"), ("zpub", "zsub"), ("zrpub", "zrsub")]
WARMUP = -1  # the producer id of tensorcom's warm-up batches (its publishers drop for late joiners)


# -- data ----------------------------------------------------------------------------------------

def batch(producer: int, i: int, n: int = 3) -> list[np.ndarray]:
    """An NHWC uint8 image batch and int32 labels ``[producer, i, ...]`` that identify it."""
    images = ((np.arange(n * 4 * 5 * 3).reshape(n, 4, 5, 3) * 7 + i * 13 + producer * 101) % 256).astype(np.uint8)
    labels = np.array([producer, i] + [producer * 1000 + i] * (n - 2), np.int32)
    return [images, labels]


def ident(arrays) -> tuple[int, int]:
    labels = np.asarray(arrays[1])
    return int(labels[0]), int(labels[1])


def assert_batch(arrays, producer: int, i: int) -> None:
    expected = batch(producer, i)
    assert len(arrays) == 2
    for got, want in zip(arrays, expected):
        got = np.asarray(got)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def consecutive_ports() -> int:
    """A port p such that p and p + 1 are both free now."""
    for _ in range(50):
        p = free_port()
        if p >= 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p + 1))
            except OSError:
                continue
            return p
    raise RuntimeError("no two consecutive free ports")


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


# -- the peer process ----------------------------------------------------------------------------
# Commands run in the child, each in a thread; ``inbox`` gets the test's signals to that command.

def _signal(inbox: queue.Queue, timeout: float):
    try:
        return inbox.get(timeout=timeout)
    except queue.Empty:
        return None


def _cmd_tc_send(inbox, url, batches, multipart=True, warmup=False):
    """Send with tensorcom; with ``warmup``, send warm-up batches until the test says ``seen``."""
    from tensorcom import zcom

    c = zcom.Connection(url, multipart=multipart)
    try:
        if warmup:  # tensorcom's PUB drops everything sent before a subscriber has joined
            deadline = time.monotonic() + slack(20)
            while True:
                try:
                    if inbox.get_nowait() == "seen":
                        break
                except queue.Empty:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError("no subscriber saw a warm-up batch")
                c.send(batch(WARMUP, 0))
                time.sleep(0.02)
        for b in batches:
            c.send(b)
        # tensorcom's LINGER=0 drops what is still queued at close: wait until the test has it all
        if _signal(inbox, slack(30)) != "done":
            raise TimeoutError("the test never said done")
    finally:
        c.close()
    return len(batches)


def _cmd_hx_send(inbox, url, steps, kwargs):
    """Send with hydrax: steps are ("send", arrays, send kwargs), ("mark", kind, kwargs), ("sleep", s)."""
    with Connection(url, **kwargs) as c:
        for step in steps:
            if step[0] == "send":
                c.send(step[1], **step[2])
            elif step[0] == "mark":
                c.mark(step[1], **step[2])
            elif step[0] == "sleep":
                time.sleep(step[1])
    return len(steps)


def _cmd_hx_recv(inbox, url, kwargs, delay=0.0, limit=None):
    """Receive with hydrax until the stream ends (or ``limit`` data messages); summaries of the messages."""
    out = []
    with Connection(url, **kwargs) as c:
        for m in c.messages():
            out.append({"kind": m.kind, "topic": m.topic, "producer": m.producer, "seq": m.seq, "fields": dict(m.fields),
                        "arrays": [np.array(a) for a in m.arrays], "infos": list(m.infos)})
            if delay:
                time.sleep(delay)
            if limit is not None and sum(x["kind"] == DATA for x in out) >= limit:
                break
        out.append({"kind": "stats", "bad": c.bad_messages, "count": c.count})
    return out


def _cmd_flood(inbox, url, megabytes, kwargs):
    """Send fresh ``megabytes`` batches until a send times out; what was sent and how long the last send blocked."""
    c = Connection(url, **kwargs)
    sent = 0
    try:
        while True:
            a = np.full(megabytes << 20, sent % 251, np.uint8)  # new memory each time: queued batches cost RSS
            start = time.monotonic()
            c.send([a])
            sent += 1
            del a
    except PeerTimeoutError as exc:
        return {"sent": sent, "blocked": time.monotonic() - start, "error": str(exc)}
    finally:
        c.close(linger=0)


def _cmd_trickle(inbox, url, kwargs):
    """Send a batch every 20 ms for up to 30 s (until the process is killed)."""
    with Connection(url, **kwargs) as c:
        for i in range(1500):
            c.send(batch(0, i))
            time.sleep(0.02)


COMMANDS = {"tc_send": _cmd_tc_send, "hx_send": _cmd_hx_send, "hx_recv": _cmd_hx_recv, "flood": _cmd_flood,
            "trickle": _cmd_trickle}


def _peer_main(pipe) -> None:
    lock = threading.Lock()
    inboxes: dict[int, queue.Queue] = {}
    threads = []
    pipe.send((0, "ok", "ready"))  # everything is imported: the test may take its baseline now

    def run(cid, name, args, inbox):
        try:
            reply = (cid, "ok", COMMANDS[name](inbox, *args))
        except BaseException as exc:  # noqa: BLE001 (reported to the test)
            reply = (cid, "error", f"{type(exc).__name__}: {exc}")
        with lock:
            pipe.send(reply)

    while True:
        message = pipe.recv()
        if message is None:
            break
        cid, name, args = message
        if name == "signal":
            inboxes[cid].put(args)
            continue
        inboxes[cid] = queue.Queue()
        thread = threading.Thread(target=run, args=(cid, name, args, inboxes[cid]), daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join(30)


class Peer:
    """A spawned child process that runs commands for a test (see ``COMMANDS``)."""

    def __init__(self) -> None:
        context = mp.get_context("spawn")
        self.pipe, child = context.Pipe()
        self.process = context.Process(target=_peer_main, args=(child,), daemon=True)
        self.process.start()
        child.close()
        self._next = 0
        self._replies: dict[int, tuple] = {}

    @property
    def pid(self) -> int:
        return self.process.pid

    def start(self, name: str, *args) -> int:
        self._next += 1
        self.pipe.send((self._next, name, args))
        return self._next

    def signal(self, cid: int, what: str) -> None:
        self.pipe.send((cid, "signal", what))

    def reply(self, cid: int, timeout: float | None = None) -> tuple[str, object]:
        timeout = slack(30) if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while cid not in self._replies:
            left = deadline - time.monotonic()
            if left <= 0 or not self.pipe.poll(left):
                raise TimeoutError(f"the peer did not finish command {cid} in {timeout:.0f} s")
            got = self.pipe.recv()
            self._replies[got[0]] = got[1:]
        return self._replies.pop(cid)

    def result(self, cid: int, timeout: float | None = None):
        status, value = self.reply(cid, timeout)
        assert status == "ok", f"the peer's command failed: {value}"
        return value

    def close(self) -> None:
        if self.process.is_alive():
            try:
                self.pipe.send(None)
            except OSError:
                pass
            self.process.join(30)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(10)
        self.pipe.close()


@pytest.fixture
def peers():
    """``peers(n)``: n started peers, closed after the test."""
    made: list[Peer] = []

    def make(n: int = 1) -> list[Peer]:
        new = [Peer() for _ in range(n)]
        made.extend(new)
        for p in new:
            assert p.result(0) == "ready"
        return new

    yield make
    for p in made:
        p.close()


@pytest.fixture
def ipc_dir():
    # a short path: ipc addresses are limited to about 100 characters
    path = tempfile.mkdtemp(prefix="hxs", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def endpoint(kind: str, transport: str, where) -> str:
    return f"{kind}://127.0.0.1:{where}" if transport == "tcp" else f"{kind}+ipc://{where}"


def places(transport: str, ipc_dir: str, name: str):
    return free_port() if transport == "tcp" else os.path.join(ipc_dir, name)


# -- 1. tensorcom <-> hydrax, every URL kind, both framings --------------------------------------

@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_tensorcom_sends_and_hydrax_receives_every_url_kind(peers, ipc_dir, transport):
    pytest.importorskip("tensorcom.zcom")
    (peer,) = peers(1)
    n = 6
    for send_kind, recv_kind in PAIRS:
        for multipart in (True, False):
            where = places(transport, ipc_dir, f"{send_kind}{int(multipart)}")
            pubsub = "pub" in send_kind
            with Connection(endpoint(recv_kind, transport, where), timeout=slack(10)) as consumer:
                cid = peer.start("tc_send", endpoint(send_kind, transport, where), [batch(0, i) for i in range(n)], multipart, pubsub)
                got, signalled = [], False
                while len(got) < n:
                    arrays = consumer.recv()
                    if ident(arrays)[0] == WARMUP:
                        if not signalled:
                            peer.signal(cid, "seen")
                            signalled = True
                        continue
                    got.append(arrays)
                peer.signal(cid, "done")
                assert peer.result(cid) == n
            for i, arrays in enumerate(got):
                assert_batch(arrays, 0, i)


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_hydrax_sends_and_tensorcom_receives_every_url_kind(peers, ipc_dir, transport):
    zcom = pytest.importorskip("tensorcom.zcom")
    (peer,) = peers(1)
    n = 6
    for send_kind, recv_kind in PAIRS:
        for multipart in (True, False):
            where = places(transport, ipc_dir, f"{send_kind}{int(multipart)}")
            steps = [("send", batch(0, i), {}) for i in range(n)]
            kwargs = {"multipart": multipart, "timeout": slack(10), "subscribers": 1 if "pub" in send_kind else 0}
            tc = zcom.Connection(endpoint(recv_kind, transport, where), multipart=multipart)
            try:
                tc.socket.setsockopt(zmq.RCVTIMEO, int(slack(10) * 1000))  # tensorcom itself waits forever
                cid = peer.start("hx_send", endpoint(send_kind, transport, where), steps, kwargs)
                got = [tc.recv() for _ in range(n)]
                assert peer.result(cid) == n
            finally:
                tc.close()
            for i, arrays in enumerate(got):
                assert_batch(arrays, 0, i)


# -- 2. brace ranges: one socket, several endpoints -----------------------------------------------

@pytest.mark.parametrize("sender", ["hydrax", "tensorcom"])
def test_a_brace_range_binds_every_port_and_takes_batches_from_both(peers, sender):
    if sender == "tensorcom":
        pytest.importorskip("tensorcom.zcom")
    p = consecutive_ports()
    n = 8
    with Connection(f"zpull://127.0.0.1:{{{p}..{p + 1}}}", timeout=slack(10)) as consumer:
        assert [e.address for e in consumer.endpoints] == [f"tcp://127.0.0.1:{p}", f"tcp://127.0.0.1:{p + 1}"]
        producers = peers(2)
        cids = []
        for k, peer in enumerate(producers):
            url = f"zpush://127.0.0.1:{p + k}"
            batches = [batch(k, i) for i in range(n)]
            if sender == "hydrax":
                cids.append(peer.start("hx_send", url, [("send", b, {}) for b in batches], {"timeout": slack(10)}))
            else:
                cids.append(peer.start("tc_send", url, batches))
        got = [consumer.recv() for _ in range(2 * n)]
        for peer, cid in zip(producers, cids):
            if sender == "tensorcom":
                peer.signal(cid, "done")
            assert peer.result(cid) == n
        assert consumer.socket.poll(200) == 0  # nothing more
    seen = sorted(ident(a) for a in got)
    assert seen == [(k, i) for k in range(2) for i in range(n)]
    for arrays in got:
        assert_batch(arrays, *ident(arrays))


# -- 3. two hydrax producers, one consumer that ends -----------------------------------------------

def test_a_hydrax_consumer_ends_after_both_producers_end_markers(peers):
    port = free_port()
    n = 10
    with Connection(f"zpull://127.0.0.1:{port}", protocol="hydrax", producers=2, timeout=slack(10)) as consumer:
        producers = peers(2)
        cids = [peer.start("hx_send", f"zpush://127.0.0.1:{port}", [("send", batch(k, i), {}) for i in range(n)],
                           {"protocol": "hydrax", "timeout": slack(10)})
                for k, peer in enumerate(producers)]
        messages = list(consumer.messages())
        for peer, cid in zip(producers, cids):
            assert peer.result(cid) == n
        assert consumer.recv_message() is None  # still ended
        with pytest.raises(ServeError, match="ended"):
            consumer.recv()
    assert all(m.kind == DATA for m in messages)
    assert sorted(ident(m.arrays) for m in messages) == [(k, i) for k in range(2) for i in range(n)]
    assert len({m.producer for m in messages}) == 2
    for k in range(2):  # each producer's batches in its own order
        mine = [ident(m.arrays)[1] for m in messages if ident(m.arrays)[0] == k]
        assert mine == list(range(n))


def test_a_producer_that_fails_tells_its_consumer_why(peers):
    (peer,) = peers(1)
    port = free_port()
    with Connection(f"zpull://127.0.0.1:{port}", timeout=slack(10)) as consumer:
        steps = [("send", batch(0, 0), {}), ("send", [np.arange(3, dtype=np.int64)], {})]  # 64-bit without allow64
        cid = peer.start("hx_send", f"zpush://127.0.0.1:{port}", steps, {"protocol": "hydrax", "timeout": slack(10)})
        assert_batch(consumer.recv(), 0, 0)
        with pytest.raises(ServeError, match="failed: TypeError: array 0 is int64") as caught:
            consumer.recv()
        assert not isinstance(caught.value, PeerTimeoutError)
        status, value = peer.reply(cid)
        assert status == "error" and "TypeError" in value
        assert consumer.recv_message() is None  # that producer has ended

def test_a_push_fan_out_ends_every_consumer_even_a_slow_one(peers):
    """zrpush to two zrpull consumers: PUSH gives each message to one consumer with room, so end
    markers are offered until each consumer has hung up; both end, and each batch arrives once."""
    port = free_port()
    n = 40
    consumers = peers(2)
    cids = [peer.start("hx_recv", f"zrpull://127.0.0.1:{port}", {"timeout": slack(10), "hwm": 2}, delay)
            for peer, delay in zip(consumers, (0.0, 0.02))]
    started = time.monotonic()
    with Connection(f"zrpush://127.0.0.1:{port}", protocol="hydrax", hwm=2, timeout=slack(10)) as producer:
        deadline = time.monotonic() + slack(10)
        while producer.peers < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        for i in range(n):
            producer.send(batch(0, i))
    got = [peer.result(cid) for peer, cid in zip(consumers, cids)]
    assert time.monotonic() - started < slack(9)  # ended by the markers, not by the consumers' timeout
    data = [ident(m["arrays"]) for g in got for m in g if m["kind"] == DATA]
    assert sorted(data) == [(0, i) for i in range(n)]
    assert all(len([m for m in g if m["kind"] == DATA]) > 0 for g in got)


# -- 4. pub/sub: every subscriber gets everything; topics -----------------------------------------

def test_every_subscriber_gets_every_batch_in_order_and_ends(peers):
    port = free_port()
    n = 40
    subscribers = peers(2)
    # the second subscriber is slow: a PUB would drop for it; hydrax's publisher waits instead
    cids = [peer.start("hx_recv", f"zsub://127.0.0.1:{port}", {"timeout": slack(10), "hwm": 2}, delay)
            for peer, delay in zip(subscribers, (0.0, 0.01))]
    with Connection(f"zpub://127.0.0.1:{port}", protocol="hydrax", subscribers=2, hwm=2, timeout=slack(10)) as publisher:
        for i in range(n):
            publisher.send(batch(0, i), epoch=0, batch=i)
        publisher.mark(EPOCH_END, epoch=0)
    for peer, cid in zip(subscribers, cids):
        got = peer.result(cid)
        data = [m for m in got if m["kind"] == DATA]
        assert [ident(m["arrays"]) for m in data] == [(0, i) for i in range(n)]
        assert [m["fields"]["batch"] for m in data] == list(range(n))
        for i, m in enumerate(data):
            assert_batch(m["arrays"], 0, i)
        assert [m["kind"] for m in got[n:]] == [EPOCH_END, "stats"]
        assert [m["seq"] for m in got[:-1]] == list(range(2, n + 3))  # seq 1 was the schema announcement


def test_a_subscriber_of_one_topic_gets_only_that_topic_and_ends(peers):
    port = free_port()
    n = 10
    (peer,) = peers(1)
    url = f"zsub://127.0.0.1:{port}"
    cids = [peer.start("hx_recv", url, {"timeout": slack(10), "topic": "validation"}),
            peer.start("hx_recv", url + "#validation", {"timeout": slack(10)}),
            peer.start("hx_recv", url, {"timeout": slack(10)})]
    with Connection(f"zpub://127.0.0.1:{port}", protocol="hydrax", topic="train", subscribers=3, timeout=slack(10)) as publisher:
        for i in range(n):
            publisher.send(batch(0, i), topic="validation" if i % 3 == 0 else None)
    validation = [i for i in range(n) if i % 3 == 0]
    for cid in cids[:2]:
        got = peer.result(cid)
        assert [m["topic"] for m in got[:-1]] == ["validation"] * len(validation)
        assert [ident(m["arrays"]) for m in got[:-1]] == [(0, i) for i in validation]
    everything = peer.result(cids[2])
    assert [ident(m["arrays"]) for m in everything[:-1]] == [(0, i) for i in range(n)]
    assert [m["topic"] for m in everything[:-1]] == ["validation" if i % 3 == 0 else "train" for i in range(n)]


# -- 5. nothing is lost when a producer exits ------------------------------------------------------

PRODUCER_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from test_serve_connection import batch
from hydrax.serve import Connection
connection = Connection({url!r}, protocol={protocol!r}, timeout={timeout})
for i in range(20):
    connection.send(batch(0, i))
{ending}
"""


@pytest.mark.parametrize("ending", ["connection.close()", "# no close: the atexit hook delivers"])
def test_a_producer_that_exits_right_after_sending_loses_nothing(ending):
    port = free_port()
    protocol = "tensorcom" if "close()" in ending else "hydrax"
    with Connection(f"zpull://127.0.0.1:{port}", protocol=protocol, timeout=slack(10)) as consumer:
        script = PRODUCER_SCRIPT.format(tests=TESTS, url=f"zpush://127.0.0.1:{port}", protocol=protocol, ending=ending, timeout=slack(20))
        proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE)
        try:
            _, err = proc.communicate(timeout=slack(30))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, err.decode()
        # read only now that the producer is gone: everything must already be on this side
        if protocol == "hydrax":
            got = list(consumer)
        else:
            got = [consumer.recv() for _ in range(20)]
            assert consumer.socket.poll(100) == 0
    assert [ident(a) for a in got] == [(0, i) for i in range(20)]


CONSUMER_SCRIPT = """
import sys, time
sys.path.insert(0, {tests!r})
from test_serve_connection import ident
from hydrax.serve import Connection
with Connection({url!r}, protocol="hydrax", hwm=2, timeout={timeout}) as consumer:
    print("ready", flush=True)
    time.sleep({pause})  # its queue fills, and heartbeats would come due meanwhile
    print([ident(a) for a in consumer], flush=True)
"""


def test_a_consumer_slower_than_its_producer_gets_everything_and_does_not_abort():
    """libzmq 4.3 aborts a receiver (``Assertion failed: !_io_error``), or drops what it has
    queued, when a ZMTP heartbeat falls due while its queue is full: a consumer sends none."""
    port = free_port()
    consumer = subprocess.Popen([sys.executable, "-c", CONSUMER_SCRIPT.format(tests=TESTS, url=f"zpull://127.0.0.1:{port}",
                                                                               timeout=slack(20), pause=3)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    producer = None
    try:
        assert consumer.stdout.readline().strip() == "ready"
        script = PRODUCER_SCRIPT.format(tests=TESTS, url=f"zpush://127.0.0.1:{port}", protocol="hydrax", ending="connection.close()",
                                        timeout=slack(20))
        producer = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
        out, err = consumer.communicate(timeout=slack(60))
        assert consumer.returncode == 0, err
        assert out.strip() == str([(0, i) for i in range(20)])
        assert producer.wait(timeout=slack(30)) == 0, producer.stderr.read()
    finally:
        for proc in (consumer, producer):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


# -- 6. bounded memory, and a producer that times out ---------------------------------------------

def flood_a_stalled_consumer(peer, port: int, megabytes: int, consumer_hwm: int, options: dict):
    """``peer`` floods ``port`` with fresh batches; this consumer takes one, then stops reading.
    The batch taken, the producer's peak RSS growth (kB) until its send failed, and its result."""
    with Connection(f"zpull://127.0.0.1:{port}", hwm=consumer_hwm, timeout=slack(10)) as consumer:
        baseline = rss_kb(peer.pid)
        cid = peer.start("flood", f"zpush://127.0.0.1:{port}", megabytes, options)
        first = consumer.recv()  # connected and flowing; now this consumer stops reading
        peak = baseline
        while True:
            peak = max(peak, rss_kb(peer.pid))
            if peer.pipe.poll(0.05):
                break
        return first, peak - baseline, peer.result(cid)


@pytest.mark.slow
def test_a_producer_to_a_stalled_consumer_blocks_in_bounded_memory_then_times_out(peers):
    port = free_port()
    hwm, megabytes = 4, 10
    (peer,) = peers(1)
    first, growth, result = flood_a_stalled_consumer(peer, port, megabytes, hwm, {"hwm": hwm, "timeout": 3})
    assert first[0].nbytes == megabytes << 20
    limit = (2 * hwm + 4) * megabytes * 1024
    assert growth < limit, f"the producer grew by {growth // 1024} MB"
    assert result["sent"] < 40
    assert 2.9 <= result["blocked"] < 3 + slack(2)  # its 3 s timeout, and no more
    assert f"zpush://127.0.0.1:{port}" in result["error"]


@pytest.mark.slow
def test_a_memory_budget_bounds_the_producer_whatever_the_hwm(peers):
    """hwm=1000 would let 10 GB of 10 MB batches queue up; max_queued_bytes=30 MB holds the
    producer to three batches that ZeroMQ has not written out yet."""
    port = free_port()
    megabytes = 10
    (peer,) = peers(1)
    _, growth, result = flood_a_stalled_consumer(peer, port, megabytes, 2, {"hwm": 1000, "timeout": 3, "max_queued_bytes": 30 << 20})
    assert growth < 6 * megabytes * 1024, f"the producer grew by {growth // 1024} MB"
    assert result["sent"] < 20
    assert "queued batches" in result["error"] and 2.9 <= result["blocked"] < 3 + slack(2)


# -- 7. timeouts -----------------------------------------------------------------------------------

def test_a_consumer_with_no_producer_times_out_naming_the_url():
    url = f"zpull://127.0.0.1:{free_port()}"
    with Connection(url, timeout=1) as consumer:
        start = time.monotonic()
        with pytest.raises(PeerTimeoutError, match=re.escape(url)) as caught:
            consumer.recv()
        elapsed = time.monotonic() - start
    assert 0.9 <= elapsed < 1 + slack(2)  # its 1 s timeout, and no more
    assert caught.value.url == url
    assert isinstance(caught.value, TimeoutError)
    Connection(url, timeout=7200).close()  # hours are a valid timeout (libzmq caps its heartbeat TTL)


@pytest.mark.slow
def test_a_consumer_of_a_killed_producer_times_out_instead_of_hanging(peers):
    port = free_port()
    (peer,) = peers(1)
    timeout = slack(2)  # the first five batches must come within it on a busy machine too
    with Connection(f"zpull://127.0.0.1:{port}", timeout=timeout) as consumer:
        peer.start("trickle", f"zpush://127.0.0.1:{port}", {"timeout": slack(10)})
        for i in range(5):
            assert ident(consumer.recv()) == (0, i)
        os.kill(peer.pid, signal.SIGKILL)
        killed = time.monotonic()
        with pytest.raises(PeerTimeoutError):
            while True:
                consumer.recv()
        assert time.monotonic() - killed < timeout + slack(1.5)
    peer.process.join(10)


# -- 8. malformed and oversize messages -------------------------------------------------------------

def _frames(i: int) -> list[bytes]:
    return [bytes(f) for f in tenbin.encode_list(batch(0, i))]


def _bad_messages():
    good = _frames(0)
    bad_code = bytearray(good[0])
    bad_code[:8] = b"zz".ljust(8, b"\0")
    big = np.zeros(200_000, np.uint8)
    huge = bytearray(tenbin.encode_list([np.zeros(10, np.uint8)])[0])
    huge[24:32] = (1 << 33).to_bytes(8, sys.byteorder)  # its one dim: 8 GiB, for a 10-byte frame
    return [
        ("one frame of junk", [b"junk"]),
        ("an odd frame count", good[:3]),
        ("an unknown dtype code", [bytes(bad_code), *good[1:]]),
        ("truncated data", [good[0], good[1][:-5], *good[2:]]),
        ("a header that claims 8 GiB", [bytes(huge), bytes(10)]),
        ("junk data that claims to be a buffer", [b"~TenBin~" + b"\x07" * 20]),
        ("a bad ~hx~ envelope", [b"~hx~train\0{not json", *good]),
        ("an envelope nesting 5,000 arrays", [b'~hx~\0{"k":"data","x":' + b"[" * 5000 + b"]" * 5000 + b"}", *good]),
        ("an envelope nesting 33 objects", [b'~hx~\0{"k":"data","x":' + b'{"a":' * 32 + b"1" + b"}" * 32 + b"}", *good]),
        ("a data envelope with no tenbin frames", [b'~hx~\0{"k":"data"}']),
        ("frames over max_message_bytes together", [bytes(f) for f in tenbin.encode_list([big, big])]),
        ("one frame over max_message_bytes", [bytes(400_000)]),
        ("a data frame over max_message_bytes", [bytes(f) for f in tenbin.encode_list([np.zeros(400_000, np.uint8)])]),
    ]


@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("on_bad_message", ["skip", "raise"])
def test_malformed_and_oversize_messages_are_skipped_or_raised_and_the_stream_goes_on(caplog, on_bad_message, aligned):
    port = free_port()
    bad = _bad_messages()
    context = zmq.Context()
    push = context.socket(zmq.PUSH)
    try:
        with Connection(f"zpull://127.0.0.1:{port}", timeout=slack(5), max_message_bytes=300_000, on_bad_message=on_bad_message,
                        aligned=aligned) as consumer:
            push.setsockopt(zmq.LINGER, 0)
            push.connect(f"tcp://127.0.0.1:{port}")
            plan = []
            for i, (what, frames) in enumerate(bad):
                plan.append(("good", i))
                push.send_multipart(_frames(i))
                plan.append((what, None))
                push.send_multipart(frames)
            push.send_multipart([b'~hx~\0{"k":"from-a-later-hydrax"}'])  # ignored, not bad
            plan.append(("good", len(bad)))
            push.send_multipart(_frames(len(bad)))
            with caplog.at_level(logging.WARNING, logger="hydrax.serve"):
                for _what, i in plan:
                    if i is not None:
                        got = consumer.recv()
                        assert_batch(got, 0, i)
                        assert not aligned or all(a.ctypes.data % 64 == 0 for a in got)
                    elif on_bad_message == "raise":
                        with pytest.raises(MessageError):
                            consumer.recv()
            assert consumer.bad_messages == len(bad)
            assert consumer.socket.poll(100) == 0
    finally:
        push.close()
        context.term()
    if on_bad_message == "skip":
        warnings = [r for r in caplog.records if "skipped a message" in r.getMessage()]
        assert len(warnings) == len(bad)


@pytest.mark.parametrize("aligned", [False, True])
def test_a_message_over_max_message_bytes_is_counted_as_bad_and_its_peer_stays(caplog, aligned):
    # ZeroMQ's own limit was max_message_bytes: it dropped the peer of a frame over it, and the
    # message was never counted in bad_messages, as the guide says it is.
    port = free_port()
    context = zmq.Context()
    push = context.socket(zmq.PUSH)
    try:
        with Connection(f"zpull://127.0.0.1:{port}", timeout=slack(5), max_message_bytes=300_000, aligned=aligned) as consumer:
            push.setsockopt(zmq.LINGER, 0)
            push.connect(f"tcp://127.0.0.1:{port}")
            push.send_multipart(_frames(0))
            push.send(np.zeros(400_000, np.uint8))  # one frame over the limit
            push.send_multipart([bytes(f) for f in tenbin.encode_list([np.zeros(400_000, np.uint8)])])  # a data frame over it
            push.send_multipart(_frames(1))  # from the same peer, still connected
            with caplog.at_level(logging.WARNING, logger="hydrax.serve"):
                assert_batch(consumer.recv(), 0, 0)
                assert_batch(consumer.recv(), 0, 1)
            assert consumer.bad_messages == 2
            assert consumer.peers == 1
    finally:
        push.close()
        context.term()
    skipped = [r.getMessage() for r in caplog.records if "skipped a message" in r.getMessage()]
    assert len(skipped) == 2 and all("over max_message_bytes (300000)" in m for m in skipped)


# -- 9. fork ---------------------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # the child touches only the Connection, and has a deadline
def test_a_connection_used_in_a_forked_child_raises_and_closing_it_there_spares_the_parent():
    port = free_port()
    with Connection(f"zpull://127.0.0.1:{port}", timeout=slack(5)) as consumer:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report, and leave without any cleanup
            code = 1
            try:
                outcomes = []
                for attempt in (lambda: consumer.recv(), lambda: consumer.send(batch(0, 0))):
                    try:
                        attempt()
                        outcomes.append("nothing")
                    except ServeError as exc:
                        outcomes.append("ServeError" if "fork" in str(exc) else f"other ServeError: {exc}")
                    except BaseException as exc:  # noqa: BLE001
                        outcomes.append(type(exc).__name__)
                consumer.close()
                outcomes.append("closed")
                os.write(write, ",".join(outcomes).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        deadline = time.monotonic() + slack(20)
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail("the forked child hung")
            time.sleep(0.02)
        report = os.read(read, 1000).decode()
        os.close(read)
        assert os.waitstatus_to_exitcode(status) == 0
        assert report == "ServeError,ServeError,closed"
        # the parent's socket is untouched
        assert consumer.socket is not None
        context = zmq.Context()
        push = context.socket(zmq.PUSH)
        push.connect(f"tcp://127.0.0.1:{port}")
        push.send_multipart(_frames(3))
        assert_batch(consumer.recv(), 0, 3)
        push.close()
        context.term()


# -- 10. CURVE -------------------------------------------------------------------------------------

@pytest.mark.slow
def test_curve_encrypts_and_only_admits_clients_with_the_right_keys(peers):
    server_public, server_secret = curve_keypair()
    client_public, client_secret = curve_keypair()
    other_public, other_secret = curve_keypair()
    (peer,) = peers(1)
    n = 5
    steps = [("send", batch(0, i), {}) for i in range(n)]

    # any client that knows the server's key
    port = free_port()
    cid = peer.start("hx_send", f"zrpush://127.0.0.1:{port}", steps,
                     {"timeout": slack(10), "curve": Curve(server_public, server_secret)})
    client = Curve(client_public, client_secret, server_key=server_public)
    with Connection(f"zrpull://127.0.0.1:{port}", timeout=slack(10), curve=client) as consumer:
        got = [consumer.recv() for _ in range(n)]
    assert [ident(a) for a in got] == [(0, i) for i in range(n)]
    assert peer.result(cid) == n

    # a client with a wrong server key gets nothing
    port = free_port()
    cid = peer.start("hx_send", f"zrpush://127.0.0.1:{port}", steps[:1],
                     {"timeout": 1.5, "linger": 0, "curve": Curve(server_public, server_secret)})
    wrong = Curve(client_public, client_secret, server_key=other_public)
    with Connection(f"zrpull://127.0.0.1:{port}", timeout=1.5, curve=wrong) as consumer:
        with pytest.raises(PeerTimeoutError):
            consumer.recv()
    status, value = peer.reply(cid)
    assert status == "error" and "PeerTimeoutError" in value

    # with authorized keys, only those clients get batches
    port = free_port()
    cid = peer.start("hx_send", f"zrpush://127.0.0.1:{port}", steps,
                     {"timeout": slack(10), "curve": Curve(server_public, server_secret, authorized=[client_public])})
    stranger = Curve(other_public, other_secret, server_key=server_public)
    with Connection(f"zrpull://127.0.0.1:{port}", timeout=1.5, curve=stranger) as outsider, \
            Connection(f"zrpull://127.0.0.1:{port}", timeout=slack(10), curve=client) as insider:
        got = [insider.recv() for _ in range(n)]
        with pytest.raises(PeerTimeoutError):
            outsider.recv()
    assert [ident(a) for a in got] == [(0, i) for i in range(n)]
    assert peer.result(cid) == n


# -- 11. serve(dataloader) -------------------------------------------------------------------------

def _load(item, arrays, seed):
    arrays["item"][...] = item
    arrays["vec"][:] = (item, item + 0.5, -item)


def _arrays_spec():
    import jax.numpy as jnp

    return {"item": ((), np.int32, jnp.int32), "vec": ((3,), np.float32, jnp.float32)}


def test_serve_sends_a_dataloaders_batches_with_epochs_markers_and_an_end(peers):
    from hydrax import DataGroup, Dataloader
    from hydrax.serve import serve

    port = free_port()
    (peer,) = peers(1)
    cid = peer.start("hx_recv", f"zpull://127.0.0.1:{port}", {"timeout": slack(20)})
    train = DataGroup(4, list(range(100, 112)), loader_arrays=_arrays_spec(), seed=5)
    valid = DataGroup(4, list(range(500, 508)), loader_arrays=_arrays_spec())
    dataloader = Dataloader(_load, train, validation=("epoch", 1, valid), end_at=("epoch", 2), loader_count=1, timeout_sec=slack_int(30))
    report = serve(dataloader, f"zpush://127.0.0.1:{port}", timeout=slack(20))
    got = peer.result(cid)
    assert got[-1]["kind"] == "stats" and got[-1]["bad"] == 0
    messages = got[:-1]
    data = [m for m in messages if m["kind"] == DATA]
    assert report.batches == len(data) and report.bytes > 0
    runs: list[tuple] = []  # (topic, epoch) in the order they were sent
    current = None
    for m in messages:
        key = (m["topic"], m["fields"]["epoch"])
        if m["kind"] == DATA:
            if current != key:
                assert current is None, f"run {current} did not end with a marker before {key}"
                current = key
                runs.append(key)
                expected_batch = 0
            assert m["infos"] == ["item", "vec"]
            assert m["fields"]["batch"] == expected_batch
            expected_batch += 1
            base = 100 if m["topic"] == "train" else 500
            items = m["fields"]["items"]
            np.testing.assert_array_equal(m["arrays"][0], np.array(items) + base)
            np.testing.assert_array_equal(m["arrays"][1][:, 1], np.array(items) + base + 0.5)
            assert m["fields"].get("validation", False) == (m["topic"] == "validation")
        else:
            assert m["kind"] == EPOCH_END and key == current, f"a marker for {key} in run {current}"
            assert m["fields"]["validation"] == (m["topic"] == "validation")
            current = None
    assert current is None
    train_runs = [r for r in runs if r[0] == "train"]
    assert len(train_runs) == 2 and len({r[1] for r in train_runs}) == 2
    assert any(r[0] == "validation" for r in runs)
    for run in runs:  # every item of a run exactly once
        items = sorted(i for m in data if (m["topic"], m["fields"]["epoch"]) == run for i in m["fields"]["items"])
        assert items == list(range(12 if run[0] == "train" else 8))


def _load_image(item, arrays, seed):
    arrays["img"][...] = item % 251
    arrays["img"][0, :8] = np.arange(8) + item  # each row's bytes differ too


@pytest.mark.cpu_only
def test_serve_sends_from_the_slots_and_never_sends_a_reused_slot():
    """Frames over pyzmq's copy threshold go out zero-copy from the slots: with 2 slots, a queue
    of 1 and a slow consumer, a slot reused while ZeroMQ still held it would show another item."""
    import jax.numpy as jnp

    from hydrax import DataGroup, Dataloader
    from hydrax.serve import serve

    port = free_port()
    peer = Peer()
    try:
        assert peer.result(0) == "ready"
        cid = peer.start("hx_recv", f"zpull://127.0.0.1:{port}", {"timeout": slack(20), "hwm": 1}, 0.02)
        spec = {"img": ((128, 160), np.uint8, jnp.uint8)}  # 80 KB a row, 320 KB a batch
        group = DataGroup(4, list(range(40)), loader_arrays=spec)
        dataloader = Dataloader(_load_image, group, end_at=("epoch", 1), depth=2, loader_count=1, timeout_sec=slack_int(30))
        serve(dataloader, f"zpush://127.0.0.1:{port}", hwm=1, timeout=slack(20))
        got = peer.result(cid)
    finally:
        peer.close()
    assert dataloader.transfer_stats["aliased_batches"] > 0
    data = [m for m in got if m["kind"] == DATA]
    assert len(data) == 10
    for m in data:
        (img,) = m["arrays"]
        for row, item in zip(img, m["fields"]["items"]):
            expected = np.full((128, 160), item % 251, np.uint8)
            expected[0, :8] = np.arange(8) + item
            np.testing.assert_array_equal(row, expected)

@pytest.mark.cpu_only
def test_batch_arrays_are_views_of_the_slot_memory():
    from hydrax import DataGroup, Dataloader
    from hydrax.serve.producer import batch_arrays, batch_fields

    group = DataGroup(4, list(range(8)), loader_arrays=_arrays_spec())
    with Dataloader(_load, group, end_at=("epoch", 1), loader_count=1, timeout_sec=slack_int(30)) as dataloader:
        for b in dataloader:
            views, names = batch_arrays(b)
            assert names == ["item", "vec"]
            for view, name in zip(views, names):
                assert view.ctypes.data == b.arrays[name].unsafe_buffer_pointer()
            assert batch_fields(b)["items"] == list(b.indices)
            del views, b


# -- 12. aligned receive, jax output, zero-copy default --------------------------------------------

def _every_dtype() -> list[np.ndarray]:
    arrays = [np.arange(7, dtype=d) for d in ("f2", "f4", "f8", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8")]
    arrays += [
        np.array([True, False, True]),
        np.array(3.5, np.float32),  # 0-d
        np.zeros((0, 3), np.int16),
        np.arange(12, dtype=">i4").reshape(3, 4),  # big-endian
        np.arange(20, dtype=np.float32).reshape(4, 5)[:, ::2],  # strided
    ]
    return arrays


def _owner(a: np.ndarray):
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    return a.obj if isinstance(a, memoryview) else a


def test_default_receive_views_zeromq_frames_and_aligned_receive_starts_on_64_bytes(peers):
    (peer,) = peers(1)
    arrays = _every_dtype()
    for aligned in (False, True):
        port = free_port()
        with Connection(f"zpull://127.0.0.1:{port}", timeout=slack(10), aligned=aligned) as consumer:
            cid = peer.start("hx_send", f"zpush://127.0.0.1:{port}", [("send", arrays, {"allow64": True})] * 2,
                             {"timeout": slack(10)})
            for _ in range(2):
                got = consumer.recv()
                assert len(got) == len(arrays)
                for g, a in zip(got, arrays):
                    assert g.dtype == a.dtype.newbyteorder("=") and g.shape == a.shape
                    np.testing.assert_array_equal(g, a)
                    if aligned and g.size:
                        assert g.ctypes.data % 64 == 0
                    if not aligned:
                        assert isinstance(_owner(g), zmq.Frame), "not a view of the ZeroMQ frame"
            assert peer.result(cid) == 2


def test_jax_output_gives_equal_jax_arrays(peers):
    import jax

    (peer,) = peers(1)
    port = free_port()
    with Connection(f"zpull://127.0.0.1:{port}", timeout=slack(10), output="jax") as consumer:
        assert consumer.aligned
        cid = peer.start("hx_send", f"zpush://127.0.0.1:{port}", [("send", batch(0, i), {}) for i in range(3)], {"timeout": slack(10)})
        for i in range(3):
            got = consumer.recv()
            assert all(isinstance(g, jax.Array) for g in got)
            assert_batch([np.asarray(g) for g in got], 0, i)
        assert peer.result(cid) == 3


# -- 13. total, statistics -------------------------------------------------------------------------

def test_total_stops_iteration_and_statistics_summarise(peers):
    (peer,) = peers(1)
    port = free_port()
    with Connection(f"zpull://127.0.0.1:{port}", timeout=slack(10), total=7) as consumer:
        cid = peer.start("hx_send", f"zpush://127.0.0.1:{port}", [("send", batch(0, i), {}) for i in range(5)], {"timeout": slack(10)})
        got = list(consumer)
        assert [ident(a) for a in got] == [(0, 0), (0, 1), (0, 2)]  # 3 samples each: 9 >= 7
        assert consumer.count == 9 and consumer.batch_size == 3
        assert peer.result(cid) == 5
        summary = consumer.stats.summary()
    assert re.fullmatch(r"rate \d+\.\d+ msg/s throughput \d\.\d\de[+-]\d+ bytes/s", summary), summary
    stats = Statistics()
    stats.add(10)
    stats.add(20)
    assert stats.count == 2 and stats.total == 30 and stats.rate() >= 0 and stats.recent_throughput() >= 0


def test_tensorcoms_statistics_summary_raises_name_error_and_ours_does_not():
    zcom = pytest.importorskip("tensorcom.zcom")
    theirs = zcom.Statistics()
    theirs.add(1)
    time.sleep(0.01)
    theirs.add(2)
    with pytest.raises(NameError):
        theirs.summary()
    ours = Statistics()
    ours.add(1)
    time.sleep(0.01)
    ours.add(2)
    assert ours.summary().startswith("rate ")

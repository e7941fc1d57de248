"""Same-host shared memory for serving (hydrax.serve.sharedmem), alone and through Connections
between real processes."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import zmq
from support.timing import slack

from hydrax import tenbin
from hydrax.errors import MessageError, ServeError
from hydrax.serve import Connection, envelope
from hydrax.serve.sharedmem import ALIGN, MIN_DEFAULT_BYTES, Mappings, Ring, check_size, ring_bytes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def batch(i: int, size: int = 96) -> list[np.ndarray]:
    """A batch whose every byte depends on ``i`` (so an overwritten entry shows)."""
    images = ((np.arange(size * 50, dtype=np.int64) * 7 + i * 31) % 251).astype(np.uint8).reshape(size, 50)
    return [images, np.full(4, i, np.int32)]


def assert_batch(arrays, i: int) -> None:
    for got, want in zip(arrays, batch(i, len(arrays[0]))):
        np.testing.assert_array_equal(got, want)


# -- the ring alone (this process maps its own ring, as a consumer on the host would) ------------

def payloads(sizes) -> list[np.ndarray]:
    return [np.full(n, k + 1, np.uint8) for k, n in enumerate(sizes)]


def receive(mappings: Mappings, field: dict, sizes) -> list[np.ndarray]:
    return mappings.buffers(field, list(sizes), "here")


def test_entries_are_aligned_reused_after_release_and_wrap_around():
    ring = Ring(1024, entries=8)
    mappings = Mappings()
    try:
        held = []
        for _ in range(3):
            field = ring.place(payloads([100, 150]))
            assert field is not None and all(o % ALIGN == 0 for o in field["o"])
            held.append(receive(mappings, field, [100, 150]))
        assert [h[0][0] for h in held] == [1, 1, 1] and all(len(h[1]) == 150 for h in held)
        assert ring.place(payloads([300])) is None  # 3 x 320 bytes taken: no room for 320 more
        assert ring.unreceived == 0
        del held[0]
        gc.collect()
        field = ring.place(payloads([300]))  # the first entry's bytes are free again: wraps to 0
        assert field is not None and field["o"] == [0]
        assert ring.place(payloads([10])) is None  # wrapped: only [320, 320) is free
        view = receive(mappings, field, [300])[0]
        np.testing.assert_array_equal(view, np.ones(300, np.uint8))
        assert not view.flags.writeable
    finally:
        ring.close()


def test_an_entry_stays_held_while_any_view_of_its_arrays_lives():
    ring = Ring(4096, entries=4)
    mappings = Mappings()
    try:
        field = ring.place([np.arange(1000, dtype=np.uint8)])
        arrays = tenbin.decode_list([tenbin.encode_list([np.zeros(1000, np.uint8)])[0], receive(mappings, field, [1000])[0]])
        corner = arrays[0][10:20]  # a view of a view
        del arrays
        gc.collect()
        ring._reclaim()
        assert ring.place([np.zeros(4000, np.uint8)]) is None  # the first entry is still held
        del corner
        gc.collect()
        assert ring.place([np.zeros(4000, np.uint8)]) is not None
    finally:
        ring.close()


def test_too_many_entries_or_a_batch_larger_than_the_ring_is_declined(caplog):
    ring = Ring(1 << 16, entries=2)
    mappings = Mappings()
    try:
        kept = [receive(mappings, ring.place(payloads([8])), [8]) for _ in range(2)]
        assert ring.place(payloads([8])) is None  # entries, not bytes, ran out
        assert ring.place(payloads([1 << 17])) is None
        assert "does not fit" in caplog.text
        del kept
    finally:
        ring.close()


@pytest.mark.parametrize("value", [0, -1, 10, 1.5, "big", False])
def test_shared_memory_sizes_are_checked(value):
    with pytest.raises(ValueError, match="shared_memory"):
        check_size(value)


def test_a_default_ring_holds_the_batches_in_flight():
    assert ring_bytes(True, 1000, 11) == MIN_DEFAULT_BYTES
    assert ring_bytes(True, 10_000_000, 11) >= 11 * 10_000_000
    assert ring_bytes(5000, 10_000_000, 11) == 5000


def test_bad_fields_are_value_errors_and_a_ring_that_cannot_be_mapped_is_a_serve_error():
    ring = Ring(4096)
    mappings = Mappings()
    try:
        good = ring.place(payloads([64]))
        for bad in [None, [], dict(good, o=[4096]), dict(good, o=[1]), dict(good, o=[0, 64]), dict(good, e=10**6),
                    dict(good, g=-1), dict(good, g=1 << 64), dict(good, o=[-64]), dict(good, t="zz"), dict(good, t="zz" * 16),
                    dict(good, pid="1")]:
            with pytest.raises(ValueError):
                receive(mappings, bad, [64])
        with pytest.raises(ServeError, match="is not the producer.s shared memory ring"):
            receive(mappings, dict(good, t="ab" * 16), [64])  # another ring's token: not this one
        with pytest.raises(ServeError, match="one host, in one PID namespace"):
            receive(Mappings(), dict(good, fd=9999), [64])
        with open(__file__, "rb") as other:  # an open file that is not a ring is never opened again
            with pytest.raises(ServeError, match=f"/proc/{os.getpid()}/fd/{other.fileno()} is not a hydrax shared memory ring"):
                receive(Mappings(), dict(good, fd=other.fileno()), [64])
    finally:
        ring.close()


# -- through Connections between processes ------------------------------------------------------

def _produce(url: str, count: int, options: dict, shared) -> None:
    consumers = options.pop("consumers", 1)
    with Connection(url, protocol="hydrax", timeout=slack(30), **options) as connection:
        deadline = time.monotonic() + slack(30)
        while connection.peers < consumers and time.monotonic() < deadline:  # PUSH gives one that joins late nothing
            time.sleep(0.01)
        for i in range(count):
            connection.send(batch(i), epoch=0, batch=i)
        shared.send(connection.shared_batches)


def producer(url: str, count: int, **options):
    """A producer process, and the end of a pipe that says how many batches went through the ring
    (a pipe, not a ``multiprocessing.Value``, whose lock would be a file in /dev/shm)."""
    context = mp.get_context("spawn")
    reader, writer = context.Pipe(duplex=False)
    process = context.Process(target=_produce, args=(url, count, options, writer))
    process.start()
    writer.close()
    return process, reader


def shared_sent(reader) -> int | None:
    return reader.recv() if reader.poll(slack(10)) else None


def test_batches_go_through_shared_memory_zero_copy_and_arrive_in_order():
    url = f"zpush://127.0.0.1:{free_port()}"
    process, shared = producer(url, 40, shared_memory=1 << 20)
    try:
        with Connection(url.replace("zpush", "zpull"), timeout=slack(30)) as consumer:
            messages = []
            for message in iter(consumer.recv_message, None):
                arrays = message.arrays
                assert_batch(arrays, message.batch)
                assert not arrays[0].flags.writeable  # a view of the ring, not a copy
                assert all(a.ctypes.data % ALIGN == 0 for a in arrays)
                assert "m" not in message.fields
                messages.append(message.batch)
        assert messages == list(range(40))
    finally:
        process.join(slack(30))
    assert process.exitcode == 0
    assert shared_sent(shared) == 40  # every batch went through the ring


def test_a_consumer_that_keeps_every_batch_never_blocks_its_producer():
    # 40 batches of 4.8 KB through a 16 KB ring: once it is full, batches take the socket
    url = f"zpush://127.0.0.1:{free_port()}"
    process, shared = producer(url, 40, shared_memory=16 << 10)
    try:
        with Connection(url.replace("zpush", "zpull"), timeout=slack(30), protocol="hydrax") as consumer:
            kept = list(consumer)
        assert len(kept) == 40
        for i, arrays in enumerate(kept):  # nothing that was kept got overwritten
            assert_batch(arrays, i)
    finally:
        process.join(slack(30))
    assert process.exitcode == 0
    assert 1 <= shared_sent(shared) < 40


PRODUCER_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from test_serve_sharedmem import batch
from hydrax.serve import Connection
connection = Connection({url!r}, protocol="hydrax", timeout={timeout}, linger={linger}, shared_memory=1 << 20)
for i in range(20):
    connection.send(batch(i), epoch=0, batch=i)
# no close(): the atexit hook sends the end marker and lets go of the ring only when it may
"""


def run_producer(url: str, linger: float):
    script = PRODUCER_SCRIPT.format(tests=os.path.dirname(os.path.abspath(__file__)), url=url, linger=linger, timeout=slack(30))
    return subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)


def test_a_producer_that_exits_right_after_sending_loses_nothing():
    url = f"zpush://127.0.0.1:{free_port()}"
    with Connection(url.replace("zpush", "zpull"), timeout=slack(30), hwm=1000) as consumer:
        process = run_producer(url, slack(30))
        try:
            first = consumer.recv()  # maps the ring
            _, err = process.communicate(timeout=slack(30))  # gone before the rest is read
            assert process.returncode == 0, err
            rest = list(consumer)
        finally:
            process.kill()
    got = [first] + rest
    assert len(got) == 20
    for i, arrays in enumerate(got):
        assert_batch(arrays, i)


def test_batches_left_unread_after_the_producer_is_gone_raise_not_vanish():
    url = f"zpush://127.0.0.1:{free_port()}"
    with Connection(url.replace("zpush", "zpull"), timeout=slack(30), hwm=1000) as consumer:
        process = run_producer(url, 1)
        try:
            _, err = process.communicate(timeout=slack(30))  # it waits 1 s (linger) for this consumer to read
            assert process.returncode == 0, err
            assert "were not received before closing" in err
            with pytest.raises(ServeError, match="cannot map"):
                consumer.recv()
        finally:
            process.kill()


def test_shared_memory_needs_the_hydrax_protocol_and_a_push_socket():
    with pytest.raises(ValueError, match="protocol='hydrax'"):
        Connection(f"zpush://127.0.0.1:{free_port()}", shared_memory=True)
    with pytest.raises(ValueError, match="PUSH producers"):
        Connection(f"zpub://127.0.0.1:{free_port()}", protocol="hydrax", shared_memory=True)


@pytest.mark.parametrize("on_bad_message", ["skip", "raise"])
def test_a_forged_shared_memory_message_is_a_message_error_and_an_unmappable_ring_raises(on_bad_message):
    port = free_port()
    context = zmq.Context()
    sender = context.socket(zmq.PUSH)
    sender.bind(f"tcp://127.0.0.1:{port}")
    headers = tenbin.encode_list(batch(0))[0::2]
    ring = Ring(1 << 16)
    try:
        good = ring.place(tenbin.encode_list(batch(0))[1::2])
        with Connection(f"zrpull://127.0.0.1:{port}", timeout=slack(10), on_bad_message=on_bad_message) as consumer:
            sender.send_multipart([envelope.pack("data", "", p="x", s=1, m=dict(good, o=[1 << 20, 0]))] + headers)
            sender.send_multipart([envelope.pack("data", "", p="x", s=2, m=good)] + headers)
            if on_bad_message == "raise":
                with pytest.raises(MessageError, match="outside"):
                    consumer.recv()
            assert_batch(consumer.recv(), 0)
            assert consumer.bad_messages == 1
            sender.send_multipart([envelope.pack("data", "", p="x", s=3, m=dict(good, t="cd" * 16, pid=os.getpid() + 10**6))] + headers)
            with pytest.raises(ServeError, match="cannot map") as caught:
                consumer.recv()
            assert caught.value.url == f"zrpull://127.0.0.1:{port}"
    finally:
        ring.close()
        sender.close(0)
        context.term()


def every_dtype() -> list[np.ndarray]:
    arrays = [np.arange(7, dtype=d) for d in ("f2", "f4", "f8", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8")]
    return arrays + [
        np.array([True, False, True]),
        np.array(3.5, np.float32),  # 0-d
        np.zeros((0, 3), np.int16),
        np.arange(12, dtype=">i4").reshape(3, 4),  # big-endian
        np.arange(20, dtype=np.float32).reshape(4, 5)[:, ::2],  # strided
    ]


@pytest.mark.parametrize("output", ["numpy", "jax"])
def test_every_dtype_and_layout_goes_through_shared_memory(output):
    port = free_port()
    arrays = every_dtype()
    if output == "jax":  # without x64, JAX makes 64-bit arrays 32-bit
        arrays = [a for a in arrays if a.dtype.itemsize < 8]
    with Connection(f"zpull://127.0.0.1:{port}", timeout=slack(10), output=output) as consumer, \
            Connection(f"zpush://127.0.0.1:{port}", protocol="hydrax", timeout=slack(10), shared_memory=1 << 20) as producer:
        for _ in range(3):
            producer.send(arrays, allow64=True)
        for _ in range(3):
            got = consumer.recv()
            assert len(got) == len(arrays)
            for g, a in zip(got, arrays):
                g = np.asarray(g)
                assert g.dtype == a.dtype.newbyteorder("=") and g.shape == a.shape
                np.testing.assert_array_equal(g, a)
        assert producer.shared_batches == 3


def test_two_consumers_share_the_batches_of_one_producer():
    url = f"zrpush://127.0.0.1:{free_port()}"
    process, shared = producer(url, 60, shared_memory=1 << 20, consumers=2)
    got = {}
    try:
        with Connection(url.replace("zrpush", "zrpull"), timeout=slack(30)) as first, \
                Connection(url.replace("zrpush", "zrpull"), timeout=slack(30)) as second:
            ended = set()
            deadline = time.monotonic() + slack(60)
            while len(ended) < 2:
                assert time.monotonic() < deadline, f"ended {ended}, got {sorted(got)}"
                for name, consumer in (("first", first), ("second", second)):
                    if name in ended or not consumer.socket.poll(10):
                        continue
                    message = consumer.recv_message()
                    if message is None:
                        ended.add(name)
                        continue
                    assert message.batch not in got
                    assert_batch(message.arrays, message.batch)
                    got[message.batch] = name
    finally:
        process.join(slack(30))
    assert sorted(got) == list(range(60))
    assert set(got.values()) == {"first", "second"}
    assert process.exitcode == 0 and shared_sent(shared) == 60


def test_random_shared_memory_fields_only_ever_raise_value_or_serve_errors():
    # what a hostile or broken producer could put in the envelope's "m" field
    rng = np.random.default_rng(7)
    ring = Ring(1 << 16, entries=8)
    mappings = Mappings()
    good = ring.place(payloads([64, 128]))
    values = [None, True, -1, 0, 1, 63, 64, 1 << 16, 1 << 62, -(1 << 62), 1 << 70, 2.5, "x", "ab" * 16, "zz" * 16, "AB" * 16, [], [0], [0, 64], {}, os.getpid()]
    try:
        accepted = 0
        for _ in range(400):
            field = dict(good)
            for key in rng.choice(["t", "pid", "fd", "e", "g", "o"], size=rng.integers(1, 4), replace=False):
                field[str(key)] = values[rng.integers(len(values))]
            try:
                buffers = receive(mappings, field, [64, 128])
            except (ValueError, ServeError):
                continue
            accepted += 1  # a field that still points inside the ring: its views stay inside it
            assert [len(b) for b in buffers] == [64, 128]
        assert accepted > 0
    finally:
        ring.close()

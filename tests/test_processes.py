"""How workers start and stay tied to the main process: start method, fork hazards, liveness,
and which hydrax the fork server and its workers import."""

import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hydrax.procs.processes import is_worker, start_method


def child_is_worker(queue):
    queue.put(is_worker())


def run_python(code: str, cwd=None, env=None, stderr: list | None = None) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120, cwd=cwd,
                          env={**{k: v for k, v in os.environ.items() if k != "HYDRAX_START_METHOD"}, **(env or {})})
    assert done.returncode == 0, done.stderr
    if stderr is not None:
        stderr.append(done.stderr)
    return done.stdout.strip()


@pytest.mark.slow
def test_fork_while_no_jax_backend_or_other_hazard_is_live_then_the_fork_server():
    out = run_python("""
        from hydrax.procs.processes import note_fork_hazard, start_method
        import jax
        first = start_method()
        note_fork_hazard("obstore's request threads")
        print(first, start_method())
    """)
    assert out == "fork forkserver"
    assert run_python("""
        import jax, jax.numpy as jnp
        from hydrax.procs.processes import start_method
        jnp.zeros(1).block_until_ready()
        print(start_method())
    """) == "forkserver"


def test_fork_forced_where_forked_workers_would_hang_is_warned_of_once_naming_the_hazard():
    """Remote shards read in this process (obstore's threads) and HYDRAX_START_METHOD=fork: a
    worker that makes requests would hang, so the choice is logged as a warning, once."""
    out = run_python("""
        import logging, os
        from hydrax.procs.processes import note_fork_hazard, start_method
        logging.basicConfig(format="%(levelname)s %(message)s")
        os.environ["HYDRAX_START_METHOD"] = "fork"
        print(start_method(), flush=True)
        note_fork_hazard("obstore's request threads")
        print(start_method(), start_method(), flush=True)
    """, stderr=(said := []))
    assert out.splitlines() == ["fork", "fork fork"]
    warnings = [line for line in said[0].splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1 and "obstore's request threads" in warnings[0] and "forkserver" in warnings[0]


@pytest.mark.slow
def test_jax_started_by_a_running_loader_leaves_the_fork_server_to_the_next_run():
    # The server imports JAX and the rest for seconds: started while the first run loads, it
    # took a fifth of a 2-core host's CPU from that run's workers. JAX started outside any run
    # still warms it at once.
    out = run_python("""
        import multiprocessing.forkserver as fs
        import numpy as np, jax.numpy as jnp
        from hydrax import DataGroup, Dataloader
        from hydrax.procs.processes import jax_backend_live

        def server():
            return fs._forkserver._forkserver_pid

        def load(item, arrays, seed):
            arrays["x"][...] = item

        def epoch():
            group = DataGroup(4, range(16), loader_arrays={"x": ((), np.int32, jnp.int32)})
            with Dataloader(load, group, loader_count=2, end_at=("epoch", 1)) as dl:
                seen = [(int(batch.arrays["x"].sum()), server()) for batch in dl]
            return dl.start_method, seen

        live = jax_backend_live()
        first, seen = epoch()
        print(live, first, jax_backend_live(), sorted({pid for _, pid in seen} | {server()}, key=str))
        second, seen = epoch()
        print(second, sum(total for total, _ in seen), server() is not None)
    """)
    lines = out.splitlines()
    assert lines[0] == "False fork True [None]"
    assert lines[1] == f"forkserver {sum(range(16))} True"
    code = """
        import multiprocessing.forkserver as fs
        import jax.numpy as jnp
        import hydrax
        jnp.zeros(1).block_until_ready()
        print(fs._forkserver._forkserver_pid is not None)
    """
    assert run_python(code) == "True"
    # In a Ray worker (a shard build's task imports hydrax) no server: each task's worker started one
    assert run_python(code, env={"RAY_RAYLET_PID": "1"}) == "False"


@pytest.mark.slow
def test_loaders_from_the_fork_server_see_the_environment_as_the_dataloader_starts_not_as_jax_started():
    # A notebook sets os.environ["HF_TOKEN"] after its imports; the fork server started with JAX,
    # before that. Its loaders must see what a forked one (and hydrax 0.2.2's) sees: the main
    # process's environment as the Dataloader starts, additions and deletions alike.
    out = run_python("""
        import os
        import multiprocessing.forkserver as fs
        import numpy as np, jax.numpy as jnp
        from hydrax import DataGroup, Dataloader

        jnp.zeros(1).block_until_ready()
        early = fs._forkserver._forkserver_pid is not None
        os.environ["HX_PROBE"] = "x"
        del os.environ["HX_GONE"]

        def load(item, arrays, seed):
            arrays["probe"][...] = {None: 0, "x": 1}.get(os.environ.get("HX_PROBE"), 2)
            arrays["gone"][...] = {None: 0, "set at start": 1}.get(os.environ.get("HX_GONE"), 2)

        group = DataGroup(4, range(8), loader_arrays={"probe": ((), np.int8, jnp.int8), "gone": ((), np.int8, jnp.int8)})
        with Dataloader(load, group, loader_count=2, end_at=("epoch", 1)) as dl:
            seen = {(int(p), int(g)) for batch in dl for p, g in zip(np.asarray(batch.arrays["probe"]), np.asarray(batch.arrays["gone"]))}
        print(early, dl.start_method, sorted(seen), os.environ.get("HX_PROBE"), os.environ.get("HX_GONE"))
    """, env={"HX_GONE": "set at start"})
    # (1, 0): HX_PROBE is "x" and HX_GONE is unset in every loader, as in the main process
    assert out == "True forkserver [(1, 0)] x None"


def test_the_environment_forces_a_method_and_refuses_others(monkeypatch):
    monkeypatch.setenv("HYDRAX_START_METHOD", "forkserver")
    assert start_method() == "forkserver"
    monkeypatch.setenv("HYDRAX_START_METHOD", "spawn")
    with pytest.raises(ValueError, match="HYDRAX_START_METHOD must be 'fork' or 'forkserver', got 'spawn'"):
        start_method()


def test_is_worker_is_true_only_in_a_child():
    assert not is_worker()
    context = mp.get_context("spawn")  # JAX may be live in this process: no plain fork
    queue = context.Queue()
    child = context.Process(target=child_is_worker, args=(queue,))
    child.start()
    try:
        assert queue.get(timeout=30) is True
    finally:
        child.join(30)
        queue.close()
        queue.join_thread()


# -- issue 20: a folder named hydrax in the working directory ------------------------------------
SCRIPTS = Path(__file__).parent / "scripts"
ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "hydrax"

#: hydrax found by an import hook, as ``pip install -e`` installs it, not by an entry of
#: sys.path: a namespace package of that name on sys.path then hides it from the path search.
EDITABLE_INSTALL = f"""
import importlib.util
import sys


class EditableHydrax:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "hydrax":
            return None
        return importlib.util.spec_from_file_location(name, {str(PACKAGE / "__init__.py")!r}, submodule_search_locations=[{str(PACKAGE)!r}])


sys.meta_path.append(EditableHydrax)
"""

#: What a folder named hydrax in the working directory may hold.
FOLDERS = {
    "empty": {},  # an empty folder: a namespace package on sys.path
    "stale": {"__init__.py": "__version__ = '0.1.0'\n"},  # a clone of an old hydrax, without today's modules
    "raising": {"__init__.py": "raise RuntimeError('a broken clone of hydrax')\n"},
}


def folder_with_hydrax(root: Path, kind: str) -> Path:
    work = root / "work"
    (work / "hydrax").mkdir(parents=True)
    for name, text in FOLDERS[kind].items():
        (work / "hydrax" / name).write_text(text)
    return work


def run_training_script(script: Path, cwd: Path, pythonpath: Path, *flags: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRAX_START_METHOD", "PYTHONPATH", "PYTHONSAFEPATH")}
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(pythonpath))
    return subprocess.run([sys.executable, *flags, str(script)], cwd=cwd, env=env, capture_output=True, text=True, timeout=180)


def assert_workers_import_the_parents_hydrax(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["method"] == "forkserver" and out["values"] == [2 * i for i in range(8)], result.stderr[-4000:]
    assert out["main"]["hydrax"] == str(PACKAGE / "__init__.py")
    main, worker = out["main"], out["worker"]
    assert worker["hydrax"] == main["hydrax"] and worker["shardset"] == main["shardset"]
    # imported by the fork server, not again by each worker: workers still start without imports
    assert worker["preloaded"] is True
    # the settings that start the server with the parent's path do not reach the workers
    assert worker["environ"] == main["environ"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(FOLDERS))
def test_workers_import_the_parents_hydrax_whatever_folder_named_hydrax_the_working_directory_holds(tmp_path, kind):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(EDITABLE_INSTALL)
    work = folder_with_hydrax(tmp_path, kind)
    assert_workers_import_the_parents_hydrax(run_training_script(SCRIPTS / "forkserver_path_script.py", work, site))


@pytest.mark.slow
def test_a_script_next_to_a_folder_named_hydrax_still_has_its_imports_preloaded(tmp_path):
    # The script's folder is first on the path of the main process, the server and the workers:
    # its own module is found there, and hydrax (a plain sys.path entry) past the empty folder.
    work = folder_with_hydrax(tmp_path, "empty")
    for name in ("forkserver_path_script.py", "forkserver_path_loaders.py"):
        shutil.copy(SCRIPTS / name, work / name)
    assert_workers_import_the_parents_hydrax(run_training_script(work / "forkserver_path_script.py", work, ROOT))


@pytest.mark.slow
def test_a_fork_server_that_would_import_a_stale_clone_is_refused_with_both_copies_named(tmp_path):
    # python -E: the server ignores PYTHONPATH and PYTHONSAFEPATH, so the working directory
    # comes first on its path (as on Python 3.10); the run must fail clearly, not run the clone.
    probe = subprocess.run([sys.executable, "-E", "-c", "import hydrax; print(hydrax.__file__)"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
    if probe.stdout.strip() != str(PACKAGE / "__init__.py"):
        pytest.skip("hydrax of this tree is not installed in this interpreter (python -E ignores PYTHONPATH)")
    work = folder_with_hydrax(tmp_path, "stale")
    result = run_training_script(SCRIPTS / "forkserver_path_script.py", work, tmp_path, "-E")
    assert result.returncode != 0
    assert (f"ForkServerImportError: hydrax's loader fork server would import hydrax from {work / 'hydrax'}, not from {PACKAGE} "
            "where this process imported it") in result.stderr, result.stderr[-4000:]
    assert "run the script from another directory, or rename that folder" in result.stderr


def test_a_fork_server_is_refused_when_sys_path_now_finds_another_hydrax_first(tmp_path):
    stale = folder_with_hydrax(tmp_path, "stale")
    out = run_python(f"""
        import sys
        from hydrax.errors import ForkServerImportError
        from hydrax.procs.processes import warm_forkserver
        sys.path.insert(0, {str(stale)!r})
        try:
            warm_forkserver()
        except ForkServerImportError as exc:
            print(exc)
        else:
            print("started")
    """, cwd=tmp_path)
    assert out.startswith(f"hydrax's loader fork server would import hydrax from {stale / 'hydrax'}, not from {PACKAGE} where "), out
    if sys.version_info >= (3, 11):
        assert out.endswith("that folder comes first on this process's sys.path, which changed after hydrax was imported")

"""Record the on-disk cache fixtures from the real hydrax 0.2.2.

For each scenario of ``tests/support/cache_scenario.py`` this runs, under the *original*
hydrax 0.2.2 (installed from PyPI in its own virtual environment):

1. ``write``: a run over an empty cache directory; the files 0.2.2 wrote are copied to
   ``tests/fixtures/cache_022/<scenario>/`` (``train/`` and ``valid/``, each with ``cache.json``
   and ``e{epoch}-b{index}.dat`` files);
   In direct mode each batch's memory is kept until its file is complete (see
   ``cache_scenario.place_holding``: 0.2.2 otherwise leaves files without extras);
2. ``read`` (and ``only``): runs over that complete cache, recording what 0.2.2 yields from it
   and how often its loader function ran;
3. ``ours``: our hydrax (the repository's ``.venv``, in a subprocess) writes the same cache into
   a fresh directory, and 0.2.2 reads it (``read``). Recorded: what 0.2.2 yielded and its loader
   calls, and whether our files were byte-identical to 0.2.2's.

Everything goes to ``tests/fixtures/cache_022.json``; the tests use only these committed files
(CI has no 0.2.2). How to rerun (from the repository root)::

    python3.11 -m venv /work/venv-hydrax022
    /work/venv-hydrax022/bin/pip install hydrax==0.2.2 jax jaxlib numpy
    /work/venv-hydrax022/bin/python tools/compat/record_cache_fixtures.py

Options: ``--ours PYTHON`` (default ``.venv/bin/python``), and scenario names to record only those.

Fixture format::

    {"hydrax_version": "0.2.2", "scenarios": [
        {<the scenario, as cache_scenario.scenarios() gives it>,
         "results": {"write": PHASE, "read": PHASE, ["only": PHASE]},
         "ours_read_by_022": PHASE, "ours_identical": true}]}
    PHASE = {"batches": [BATCH...], "loader_calls": int}   (BATCH: cache_scenario.record_batch)
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
TESTS = os.path.join(ROOT, "tests")

# The scenario runner shared with tests/test_cache_compat.py, in tests/support/. Only tests/ goes on
# the path, never the repository root: hydrax must come from the 0.2.2 venv. 0.2.2's spawned
# workers get this sys.path too, to unpickle the runner's loader.
sys.path.insert(0, TESTS)
from support.cache_scenario import cache_files, place, place_holding, run_phase, scenarios  # noqa: E402

_OURS_WRITE = """
import json, sys
sys.path.insert(0, {tests!r})
import hydrax
from support import cache_scenario
assert hydrax.__file__.startswith({root!r}), hydrax.__file__
sc = [s for s in cache_scenario.scenarios() if s["name"] == {name!r}][0]
print(json.dumps(cache_scenario.run_phase(hydrax, sc, {location!r}, "write")["loader_calls"]))
"""


def write_with_ours(python: str, name: str, location: str) -> None:
    code = _OURS_WRITE.format(tests=TESTS, root=ROOT, name=name, location=location)
    subprocess.run([python, "-c", code], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)


def main(argv):
    import hydrax
    from importlib.metadata import version

    hv = version("hydrax")
    if os.path.abspath(hydrax.__file__).startswith(ROOT + os.sep):
        print(f"refusing to record: imported hydrax from the repository ({hydrax.__file__}), not the installed 0.2.2",
              file=sys.stderr)
        return 2
    print(f"[record] using hydrax {hv} from {hydrax.__file__}", file=sys.stderr)
    ours = os.path.join(ROOT, ".venv", "bin", "python")
    if argv[1:2] == ["--ours"]:
        ours, argv = argv[2], argv[:1] + argv[3:]
    only = set(argv[1:])
    out_dir = os.path.join(FIXTURES, "cache_022")
    recorded, failed = [], []
    for sc in scenarios():
        if only and sc["name"] not in only:
            continue
        print(f"[record] {sc['name']}", file=sys.stderr, flush=True)
        try:
            sc = dict(sc)
            with tempfile.TemporaryDirectory() as scratch:
                theirs = os.path.join(scratch, "theirs")
                os.makedirs(theirs)
                results = {"write": run_phase(hydrax, sc, theirs, "write",
                                              placement_func=place_holding if sc["mode"] == "direct" else place)}
                target = os.path.join(out_dir, sc["name"])
                shutil.rmtree(target, ignore_errors=True)
                for relative, data in cache_files(theirs).items():
                    path = os.path.join(target, relative)
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    with open(path, "wb") as f:
                        f.write(data)
                for phase in sc["phases"][1:]:
                    results[phase] = run_phase(hydrax, sc, theirs, phase, placement_func=place)
                sc["results"] = results
                mine = os.path.join(scratch, "ours")
                os.makedirs(mine)
                write_with_ours(ours, sc["name"], mine)
                sc["ours_identical"] = cache_files(mine) == cache_files(target)
                sc["ours_read_by_022"] = run_phase(hydrax, sc, mine, "read", placement_func=place)
        except Exception as e:  # noqa: BLE001 - reported and excluded
            traceback.print_exc()
            failed.append((sc["name"], f"{type(e).__name__}: {e}"))
            continue
        recorded.append(sc)
    out_path = os.path.join(FIXTURES, "cache_022.json")
    previous = []
    if only and os.path.exists(out_path):
        with open(out_path) as f:
            previous = [s for s in json.load(f)["scenarios"] if s["name"] not in only]
    with open(out_path, "w") as f:
        json.dump({"hydrax_version": hv, "scenarios": previous + recorded}, f, indent=1)
        f.write("\n")
    print(f"[record] wrote {len(recorded)} scenarios to {out_path}", file=sys.stderr)
    for name, why in failed:
        print(f"[record] FAILED {name}: {why}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

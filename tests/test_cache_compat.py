"""Differential tests of the on-disk cache against the real hydrax 0.2.2, both directions.

``tests/fixtures/cache_022/<scenario>/`` holds cache directories that hydrax 0.2.2 wrote, and
``tests/fixtures/cache_022.json`` what 0.2.2 yielded while writing and reading them, and what it
yielded reading a cache that *our* hydrax wrote (recorded by
``tools/compat/record_cache_fixtures.py``, whose docstring gives the format; the scenarios are in
``tests/support/cache_scenario.py``). Here, with committed files only:

* ours reads 0.2.2's caches and yields exactly what 0.2.2 yields from them, without calling the
  loader function;
* ours writes, for the same configuration, the same files byte for byte (descriptor text, array
  bytes at 0.2.2's offsets, the pickled extras), and yields what 0.2.2 yielded while writing;
* 0.2.2 read the cache ours wrote (at recording time) without calling its loader, and yielded
  what it yields from its own.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import hydrax
from support import cache_scenario  # worker processes import it too: tests/ is on their sys.path

FIXTURES = Path(__file__).parent / "fixtures"
RECORDED = json.loads((FIXTURES / "cache_022.json").read_text())
SCENARIOS = {sc["name"]: sc for sc in RECORDED["scenarios"]}


def test_the_fixture_covers_every_scenario_and_was_recorded_by_0_2_2():
    assert RECORDED["hydrax_version"] == "0.2.2"
    assert sorted(SCENARIOS) == sorted(sc["name"] for sc in cache_scenario.scenarios())
    for name, sc in SCENARIOS.items():
        assert (FIXTURES / "cache_022" / name / "train" / "cache.json").is_file()
        assert sc["results"]["read"]["loader_calls"] == 0  # 0.2.2 read its whole cache back


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_ours_reads_a_cache_written_by_0_2_2(tmp_path, name):
    sc = SCENARIOS[name]
    shutil.copytree(FIXTURES / "cache_022" / name, tmp_path, dirs_exist_ok=True)
    for phase in sc["phases"][1:]:
        got = cache_scenario.run_phase(hydrax, sc, str(tmp_path), phase)
        assert got == sc["results"][phase], phase
        assert got["loader_calls"] == 0
    # reading changed nothing
    assert cache_scenario.cache_files(str(tmp_path)) == cache_scenario.cache_files(str(FIXTURES / "cache_022" / name))


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_ours_writes_the_files_0_2_2_writes(tmp_path, name):
    sc = SCENARIOS[name]
    got = cache_scenario.run_phase(hydrax, sc, str(tmp_path), "write")
    assert got == sc["results"]["write"]
    ours = cache_scenario.cache_files(str(tmp_path))
    theirs = cache_scenario.cache_files(str(FIXTURES / "cache_022" / name))
    assert sorted(ours) == sorted(theirs)
    for path in theirs:
        assert ours[path] == theirs[path], path


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_0_2_2_read_the_cache_ours_wrote(name):
    sc = SCENARIOS[name]
    assert sc["ours_identical"] is True
    assert sc["ours_read_by_022"]["loader_calls"] == 0
    assert sc["ours_read_by_022"] == sc["results"]["read"]

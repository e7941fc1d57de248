"""Every public import path of hydrax stays where it was when the code moved into subpackages.

``tests/fixtures/public_names.json`` holds each public module's names as they were before
(recorded by ``tools/compat/record_public_names.py``): each must still import from the same
module, as the same kind of thing.
"""

import importlib
import json
from pathlib import Path

import pytest

RECORDED = json.loads((Path(__file__).parent / "fixtures" / "public_names.json").read_text())["modules"]


@pytest.mark.parametrize("module", sorted(RECORDED))
def test_every_public_name_imports_from_where_it_did(module):
    if module == "hydrax.ray":
        pytest.importorskip("ray")
    imported = importlib.import_module(module)
    assert [name for name in RECORDED[module] if not hasattr(imported, name)] == []


def test_the_package_exports_what_0_2_2_programs_import():
    import hydrax

    assert {"Dataloader", "DataGroup", "TrainingBatch", "ValidationBatch", "is_worker"} <= set(hydrax.__all__)
    assert callable(importlib.import_module("hydrax.tqdm").tbatches)


def test_names_come_on_first_use_so_the_fork_server_imports_no_more_than_workers_need():
    """``import hydrax`` imports the errors and the process helpers only; every exported name, and
    every subpackage as an attribute, comes on first use. So the loader fork server, which imports
    the workers' code and the read-ahead (on the first batch's way: every millisecond of its
    start-up is one of the first batch), loads no part of the training process's loader."""
    import subprocess
    import sys

    probe = ("import sys, hydrax, hydrax.procs.workers, hydrax.shards.fetchproc; "
             "print(sorted({m.split('.')[1] for m in sys.modules if m.startswith('hydrax.')}))")
    loaded = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout
    assert loaded.strip() == "['_core', 'errors', 'order', 'procs', 'shards']"
    import hydrax

    assert all(getattr(hydrax, name) is not None for name in hydrax.__all__)
    assert hydrax.image.Coefs is importlib.import_module("hydrax.image").Coefs
    assert "Dataloader" in dir(hydrax)
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        hydrax.not_a_name  # noqa: B018

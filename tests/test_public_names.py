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

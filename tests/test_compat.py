"""Differential test against the real hydrax 0.2.2.

``tests/fixtures/compat_022.json`` holds what hydrax 0.2.2 yielded for a list of small,
deterministic scenarios (recorded by ``tools/compat/record_fixtures.py``; its docstring describes
the format; both sides run them through ``tests/support/compat_scenario.py``). Each scenario is
replayed here on our Dataloader, and everything it yields must be the same: batches, item indices,
seeds, the values the loader wrote, the seeds it was given, the extras it returned, and the loader
metadata.

The exceptions are the upstream defects we fix (``hydrax-api.md`` section 15), where the fixture
records 0.2.2's wrong behaviour and the test asserts ours instead:

* defect 1: 0.2.2 yields validation batches only in the first validation run; ours yields a full
  run at every interval.
* defect 2: ``interleave_groups=True`` is sequential in 0.2.2; ours picks, before every batch, the
  group with the lowest consumed fraction (ties to the lowest index).
* defect 13: an end point at or before the start point never stops in 0.2.2; ours yields nothing.
* a run in which every batch fails ends quietly in 0.2.2; ours raises ``BatchFailedError`` (and
  gives 0.2.2's empty result with ``max_consecutive_failures=None``).
* exactly-once validation across stop and resume: a run resumed on a batch-mode validation
  boundary does not start with that validation (the run that stopped there ran it), and a run
  stopped by a batch end point at an epoch end runs that epoch's validation.
* a validation group with ``shuffle_first=True`` whose ``shuffle_later`` resolves to ``"itemwise"``
  comes out unshuffled in 0.2.2 when the run starts at epoch > 0; ours always applies the
  ``shuffle_first`` permutation to validation groups.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import hydrax

# The scenario runner shared with the fixture recorder. Worker processes import it to unpickle its
# loader and start-up hook: tests/ is on their sys.path too (fork workers inherit it, forkserver
# workers get this process's).
from support import compat_scenario

FIXTURE_PATH = Path(__file__).parent / "fixtures" / "compat_022.json"
FIXTURE = json.loads(FIXTURE_PATH.read_text())
SCENARIOS = {sc["name"]: sc for sc in FIXTURE["scenarios"]}

DTYPE = FIXTURE["dtype"]
NP_DTYPE = np.dtype(DTYPE)

#: Defects of 0.2.2 this test knows how to check our fixed behaviour for.
KNOWN_DEFECTS = {1, 2, 13}

# --------------------------------------------------------------------------------------------
# Running a scenario on ours. This module imports neither JAX nor pytest at module level, and the
# tests are parametrized by ``pytest_generate_tests``: the module is cheap to import.


_X64_BEFORE: list[bool] = []


def setup_module(module):
    """The fixture's arrays are int64: enable JAX x64 for this module only (see teardown_module).

    Flipping the flag at import time would leak into every other test module of the session,
    because pytest imports all modules before running any test.
    """
    import jax

    previous = bool(jax.config.read("jax_enable_x64"))
    _X64_BEFORE.append(previous)
    jax.config.update("jax_enable_x64", NP_DTYPE.itemsize == 8 or previous)


def teardown_module(module):
    import jax

    jax.config.update("jax_enable_x64", _X64_BEFORE.pop())


def run_ours(sc: dict, *, loader_count: int | None = None, depth: int | None = None, deterministic: bool = True, **extra) -> dict:
    """Replay scenario ``sc`` on our Dataloader (default placement); the result has the fixture's ``result`` format."""
    return compat_scenario.run_scenario(
        hydrax, sc, loader_count=loader_count, depth=depth, deterministic=deterministic, dtype=DTYPE, extra=extra
    )


# --------------------------------------------------------------------------------------------
# What we expect, derived from the fixture


def _perm(seed: int, n: int) -> list[int]:
    return [int(x) for x in np.random.Generator(np.random.PCG64(seed)).permutation(n)]


def _start_epoch(sc: dict) -> int:
    bpe = sc["result"]["batches_per_epoch"]
    epoch, offset = sc["kwargs"]["start_at"]
    return epoch + offset // bpe


def unshuffled_validation_groups(sc: dict) -> set[int]:
    """Validation groups that 0.2.2 leaves unshuffled although ``shuffle_first`` is set.

    0.2.2 skips the shuffle_first permutation of an itemwise group (``"default"`` resolves to
    itemwise without a cache) when the run starts at epoch > 0, also for validation groups,
    which never get an itemwise reshuffle. Ours always applies it.
    """
    if sc["validation"] is None or _start_epoch(sc) == 0:
        return set()
    return {
        i
        for i, g in enumerate(sc["validation"]["groups"])
        if g["shuffle_first"] and g["shuffle_later"] in ("default", "itemwise")
    }


def _fix_validation_shuffle(sc: dict, batches: list[dict]) -> list[dict]:
    """The fixture's batches with the validation shuffle_first quirk corrected."""
    quirky = unshuffled_validation_groups(sc)
    if not quirky:
        return batches
    fail = set(sc["fail_items"])
    out = []
    for b in batches:
        if b["kind"] == "V" and b["group"] in quirky:
            spec = sc["validation"]["groups"][b["group"]]
            n, base = spec["n"], spec["base"]
            bs = min(spec["batch_size"], n)
            assert not any(base <= f < base + n for f in fail), "quirk correction assumes no failing items in the group"
            gi = b["group_index"]
            # Confirm the quirk really is in the fixture (unshuffled), then shuffle as ours does.
            assert b["indices"] == list(range(gi * bs, (gi + 1) * bs)), f"{sc['name']}: fixture is not unshuffled: {b}"
            indices = _perm(spec["seed"], n)[gi * bs : (gi + 1) * bs]
            items = [base + i for i in indices]
            b = dict(b, indices=indices, items=items, additional_d=items, item_seeds=[-1] * bs)
        out.append(b)
    return out


def _validation_boundary(sc: dict, t: dict) -> bool:
    """Whether a validation run follows training batch ``t`` (hydrax-api.md section 4.1)."""
    v = sc["validation"]
    if v["mode"] == "batch":
        return (t["batch_num"] + 1) % v["interval"] == 0
    bpe = sc["result"]["batches_per_epoch"]
    return t["epoch_batch"] == bpe - 1 and (t["epoch"] + 1) % v["interval"] == 0


def _expand_validation_runs(sc: dict, batches: list[dict]) -> list[dict]:
    """Defect 1: insert the validation runs 0.2.2 left empty, as copies of its first run."""
    assert not sc["fail_items"], "the validation run expansion assumes no dropped batches"
    first_run = [b for b in batches if b["kind"] == "V"]
    assert first_run, f"{sc['name']}: the fixture has no validation run"
    assert {b["validation_epoch"] for b in first_run} == {0}
    bpv = sc["result"]["batches_per_validation"]
    assert len(first_run) == bpv
    assert [b["validation_batch_num"] for b in first_run] == list(range(bpv))
    last_v = max(i for i, b in enumerate(batches) if b["kind"] == "V")
    out = list(batches[: last_v + 1])
    run = 1
    for t in batches[last_v + 1 :]:
        assert t["kind"] == "T"
        out.append(t)
        if _validation_boundary(sc, t):
            for b in first_run:
                out.append(
                    dict(
                        b,
                        validation_epoch=run,
                        validation_batch_num=run * bpv + b["validation_batch_num"],
                    )
                )
            run += 1
    assert run > 1, f"{sc['name']}: tagged with defect 1 but no later validation run is due"
    return out


def expected_result(sc: dict) -> dict:
    """Our documented output for ``sc`` (not for defect 2, which has its own check)."""
    defects = set(sc["upstream_defects"])
    expected = dict(sc["result"])
    batches = _fix_validation_shuffle(sc, sc["result"]["batches"])
    if 13 in defects:
        # An end point at or before the start point: nothing at all, and a natural end.
        first, last = sc["result"]["first_batch"], sc["result"]["last_batch"]
        assert last is not None and last <= first
        batches = []
        expected["interrupted"] = False
    if 1 in defects:
        batches = _expand_validation_runs(sc, batches)
    expected["batches"] = _validate_once(sc, batches)
    return expected


def _validate_once(sc: dict, batches: list[dict]) -> list[dict]:
    """0.2.2 starts a run resumed on a batch-mode boundary with that boundary's validation run,
    which the run that stopped there already ran; ours does not (the later runs move up)."""
    leading = 0
    while leading < len(batches) and batches[leading]["kind"] == "V":
        leading += 1
    if not leading:
        return batches
    assert sc["validation"]["mode"] == "batch", f"{sc['name']}: a leading validation run outside batch mode"
    out = []
    for b in batches[leading:]:
        if b["kind"] == "V":
            b = dict(b, validation_epoch=b["validation_epoch"] - 1, validation_batch_num=b["validation_batch_num"] - leading)
        out.append(b)
    return out


def interleaved_group_order(counts: list[int]) -> list[int]:
    """Group of every batch of one epoch: lowest consumed fraction first, ties to the lowest index."""
    cursors = [0] * len(counts)
    order = []
    for _ in range(sum(counts)):
        live = [g for g in range(len(counts)) if cursors[g] < counts[g]]
        g = min(live, key=lambda g: (Fraction(cursors[g], counts[g]), g))
        order.append(g)
        cursors[g] += 1
    return order


def _batch_count(spec: dict) -> int:
    return spec["n"] // min(spec["batch_size"], spec["n"])


def check_interleaved(sc: dict, ours: dict) -> None:
    """Defect 2: the same batches per epoch as 0.2.2, in least-consumed-first order."""
    ref = sc["result"]
    assert sc["validation"] is None and not sc["fail_items"] and sc["max_batches"] is None
    assert sc["kwargs"]["start_at"] == [0, 0] and sc["kwargs"]["end_at"][0] == "epoch"
    assert sc["kwargs"]["interleave_groups"] is True
    for key in ("batches_per_epoch", "batches_per_validation", "first_batch", "last_batch", "interrupted"):
        assert ours[key] == ref[key], key
    bpe = ref["batches_per_epoch"]
    order = interleaved_group_order([_batch_count(g) for g in sc["training"]])
    assert len(order) == bpe
    position_keys = ("epoch_batch", "batch_num")

    def strip(b):
        return {k: v for k, v in b.items() if k not in position_keys}

    epochs = sorted({b["epoch"] for b in ref["batches"]})
    assert len(ours["batches"]) == len(ref["batches"])
    assert all(b["kind"] == "T" for b in ours["batches"])
    assert sorted({b["epoch"] for b in ours["batches"]}) == epochs
    for e in epochs:
        ref_e = [b for b in ref["batches"] if b["epoch"] == e]
        ours_e = [b for b in ours["batches"] if b["epoch"] == e]
        # The multiset of batches (groups, indices, seeds, loaded values) is 0.2.2's.
        key = lambda b: json.dumps(strip(b), sort_keys=True)  # noqa: E731
        assert sorted(map(key, ours_e)) == sorted(map(key, ref_e)), f"epoch {e}: different batches"
        # The group order follows the least-consumed rule ...
        assert [b["group"] for b in ours_e] == order, f"epoch {e}: group order"
        # ... each group's batches keep their cursor order (0.2.2 drains each group in order) ...
        for g in range(len(sc["training"])):
            assert [strip(b) for b in ours_e if b["group"] == g] == [strip(b) for b in ref_e if b["group"] == g]
        # ... and the numbering follows the delivery position.
        assert [b["epoch_batch"] for b in ours_e] == list(range(bpe))
        assert [b["batch_num"] for b in ours_e] == [e * bpe + i for i in range(bpe)]


def assert_same_result(ours: dict, expected: dict) -> None:
    for key in ("batches_per_epoch", "batches_per_validation", "first_batch", "last_batch", "interrupted"):
        assert ours[key] == expected[key], f"{key}: ours {ours[key]!r}, expected {expected[key]!r}"
    ob, eb = ours["batches"], expected["batches"]
    for i, (o, e) in enumerate(zip(ob, eb)):
        assert o == e, f"batch {i} differs:\n  ours     {o}\n  expected {e}"
    assert len(ob) == len(eb), (
        f"ours yielded {len(ob)} batches, expected {len(eb)}; extra/missing: "
        f"{ob[len(eb):] if len(ob) > len(eb) else eb[len(ob):]}"
    )


# --------------------------------------------------------------------------------------------
# Tests


def pytest_generate_tests(metafunc):
    """Parametrize each test over its scenario names (the test ids are the names)."""
    names = {
        "test_compat_022": list(SCENARIOS),
        "test_result_independent_of_loader_count_and_depth": INDEPENDENCE_SCENARIOS,
        "test_nondeterministic_yields_same_batches": NONDETERMINISTIC_SCENARIOS,
    }.get(metafunc.function.__name__)
    if names is not None:
        metafunc.parametrize("name", names, ids=names)


def test_fixture_is_from_hydrax_022():
    assert FIXTURE["hydrax_version"] == "0.2.2"
    assert len(SCENARIOS) == len(FIXTURE["scenarios"]) > 0
    for sc in FIXTURE["scenarios"]:
        assert set(sc["upstream_defects"]) <= KNOWN_DEFECTS, f"{sc['name']}: unknown defect tag"


def test_compat_022(name):
    sc = SCENARIOS[name]
    expected = sc["result"]
    if expected["batches_per_epoch"] and sc["fail_items"] and not expected["batches"]:
        # Every batch failed: 0.2.2 ended the run quietly with nothing; ours raises, unless the
        # failure budget is switched off, which gives 0.2.2's (empty) result.
        with pytest.raises(hydrax.BatchFailedError, match="failed to load"):
            run_ours(sc)
        ours = run_ours(sc, max_consecutive_failures=None)
        assert_same_result(ours, expected_result(sc))
        return
    ours = run_ours(sc)
    if 2 in sc["upstream_defects"]:
        check_interleaved(sc, ours)
    else:
        assert_same_result(ours, expected_result(sc))


#: A few scenarios that cover validation, several groups, failures, resume and an early break.
INDEPENDENCE_SCENARIOS = [
    "val_batch3_resume_0_3",
    "val_epoch1_resume_1_0_single_run",
    "two_groups_interleave_true_defect2",
    "three_groups_sequential",
    "fail_item_repeat_two_epochs",
    "fail_validation_item",
    "start_1_2_batchwise_sf1",
    "end_none_max_batches_7",
]


def test_result_independent_of_loader_count_and_depth(name):
    sc = SCENARIOS[name]
    reference = run_ours(sc)
    single = run_ours(sc, loader_count=1, depth=1)
    assert_same_result(single, reference)


#: Scenarios that end on their own (a break after max_batches would pick an arbitrary prefix).
NONDETERMINISTIC_SCENARIOS = [
    "val_epoch2_two_groups",
    "two_groups_interleave_true_defect2",
    "three_groups_sequential",
    "fail_item_repeat_two_epochs",
    "fail_validation_item",
    "start_1_1_itemwise_sf1",
]


def test_nondeterministic_yields_same_batches(name):
    sc = SCENARIOS[name]
    assert sc["max_batches"] is None
    reference = run_ours(sc)
    unordered = run_ours(sc, deterministic=False)
    key = lambda b: json.dumps(b, sort_keys=True)  # noqa: E731
    assert sorted(map(key, unordered["batches"])) == sorted(map(key, reference["batches"]))
    for k in ("batches_per_epoch", "batches_per_validation", "first_batch", "last_batch", "interrupted"):
        assert unordered[k] == reference[k], k

"""Record differential-test fixtures from the real hydrax 0.2.2.

This script runs a fixed list of small, deterministic Dataloader scenarios under the
*original* hydrax 0.2.2 (installed from PyPI in a separate virtual environment, not
our re-implementation) and writes everything each scenario yields to a JSON file.
Our own tests replay the same scenarios against the re-implementation and compare
(see ``tests/fixtures/compat_022.json`` for the committed output, and ``tests/test_compat.py``).

What this needs is hydrax 0.2.2 itself, from PyPI, in a virtual environment of its own (the
repository's ``.venv`` holds ours); the behaviour it records is whatever that release does. Each
scenario's ``upstream_defects`` lists the numbers of the 0.2.2 defects it runs into, whose wrong
output the fixture keeps and ``tests/test_compat.py`` (its docstring says what each one is)
replaces with ours:

- 1: validation runs after the first yield no batches;
- 2: ``interleave_groups=True`` takes the groups one after the other;
- 13: an ``end_at`` at or before ``start_at`` never stops the run.

How to rerun (from the repository root; the venv may be anywhere outside the checkout)::

    python3.11 -m venv /work/venv-hydrax022
    /work/venv-hydrax022/bin/pip install hydrax==0.2.2 jax jaxlib numpy
    /work/venv-hydrax022/bin/python tools/compat/record_fixtures.py tests/fixtures/compat_022.json

Optional extra arguments are scenario names, to run (and write) only those.

Notes:
- The placement function *copies* the batch (``np.array(v, copy=True)``), because
  0.2.2's default placement can alias shared memory on the CPU backend and stall
  (0.2.2's defect 9: about half the runs of a small job stalled with its default placement).
- Every scenario uses ``deterministic=True`` and ends through ``end_at`` or through the
  consumer breaking out after ``max_batches``, so the output is reproducible: running
  the script twice gives byte-identical JSON.
- The scenarios are run by ``tests/support/compat_scenario.py``, which
  ``tests/test_compat.py`` uses too: it builds the groups, runs the Dataloader and records
  each batch. Its loader function and fail-item start-up hook are module-level because
  0.2.2 spawns its worker processes; all driving code here is under
  ``if __name__ == "__main__"`` (JAX x64 is enabled in ``main``).
- Scenarios that raise or stall under 0.2.2 are reported on stderr and left out of the
  output; the exit status is then 1.

Fixture format::

    {"hydrax_version": "0.2.2", "dtype": "int64", "scenarios": [
        {"name", "training": [GROUP...], "validation": null | {"mode", "interval", "groups"},
         "kwargs": {"start_at", "end_at", "interleave_groups", "depth", "loader_count"},
         "fail_items", "max_batches", "upstream_defects",
         "result": {"batches_per_epoch", "batches_per_validation", "first_batch",
                    "last_batch", "interrupted", "batches": [BATCH...]}}]}

    GROUP = {"n", "batch_size", "seed", "shuffle_first", "shuffle_later", "base"}
    (data = list(range(base, base + n)); loader_arrays = {"item": ((1,), int64, int64),
     "seed": ((1,), int64, int64)})
"""

import json
import os
import sys
import traceback

import numpy as np

# The scenario runner shared with tests/test_compat.py, in tests/support/. Only tests/ goes on the
# path, never the repository root: hydrax must come from the 0.2.2 venv. 0.2.2's spawned workers
# get this sys.path too, to unpickle the runner's loader.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tests"))
from support.compat_scenario import DTYPE, run_scenario  # noqa: E402


def place(arrays, layouts, additional, group):
    import jax.numpy as jnp

    return {
        k: jnp.asarray(np.array(v, copy=True), dtype=layouts[k][2])
        for k, v in arrays.items()
    }


# --------------------------------------------------------------------------------------
# Scenario definitions


def G(n, batch_size, seed=0, shuffle_first=False, shuffle_later="default", base=0):
    return {
        "n": n,
        "batch_size": batch_size,
        "seed": seed,
        "shuffle_first": shuffle_first,
        "shuffle_later": shuffle_later,
        "base": base,
    }


def S(
    name,
    training,
    *,
    validation=None,
    start_at=(0, 0),
    end_at=None,
    interleave_groups=False,
    depth=3,
    loader_count=2,
    fail_items=(),
    max_batches=None,
    defects=(),
):
    if isinstance(training, dict):
        training = [training]
    if validation is not None:
        mode, interval, groups = validation
        if isinstance(groups, dict):
            groups = [groups]
        validation = {"mode": mode, "interval": interval, "groups": list(groups)}
    return {
        "name": name,
        "training": list(training),
        "validation": validation,
        "kwargs": {
            "start_at": list(start_at),
            "end_at": None if end_at is None else list(end_at),
            "interleave_groups": interleave_groups,
            "depth": depth,
            "loader_count": loader_count,
        },
        "fail_items": list(fail_items),
        "max_batches": max_batches,
        "upstream_defects": sorted(defects),
    }


V0 = 500000  # base of the first validation group
V1 = 600000  # base of the second validation group


def scenarios():
    out = []
    ep3 = ("epoch", 3)

    # Each shuffle_later mode x shuffle_first, seed 5. sf=False: 8 items bs 2;
    # sf=True: 9 items bs 2 (a remainder item dropped each epoch).
    for mode in ("default", "repeat", "reseed", "itemwise", "batchwise"):
        out.append(S(f"mode_{mode}_sf0_n8_bs2", G(8, 2, 5, False, mode), end_at=ep3))
        out.append(S(f"mode_{mode}_sf1_n9_bs2", G(9, 2, 5, True, mode), end_at=ep3))
    # bs 3 with a remainder, both itemwise and batchwise
    out.append(S("itemwise_sf0_n8_bs3", G(8, 3, 5, False, "itemwise"), end_at=ep3))
    out.append(S("batchwise_sf1_n8_bs3", G(8, 3, 5, True, "batchwise"), end_at=ep3))

    # Batch size clamp, dropped remainder
    out.append(S("clamp_bs8_n5", G(5, 8, 1, False, "itemwise"), end_at=ep3))
    out.append(S("clamp_bs8_n5_sf1_repeat", G(5, 8, 1, True, "repeat"), end_at=("epoch", 2)))
    out.append(S("remainder_n11_bs4_batchwise", G(11, 4, 3, False, "batchwise"), end_at=ep3))

    # start_at (8 items bs 2 -> bpe 4)
    iw = G(8, 2, 5, False, "itemwise")
    bw = G(8, 2, 5, False, "batchwise")
    out.append(S("start_0_0_itemwise", iw, start_at=(0, 0), end_at=ep3))
    out.append(S("start_1_1_itemwise", iw, start_at=(1, 1), end_at=ep3))
    out.append(S("start_0_5_normalised_itemwise", iw, start_at=(0, 5), end_at=ep3))
    out.append(S("start_2_0_itemwise", iw, start_at=(2, 0), end_at=ep3))
    out.append(S("start_1_3_batchwise", bw, start_at=(1, 3), end_at=ep3))
    out.append(S("start_2_0_batchwise", bw, start_at=(2, 0), end_at=ep3))
    out.append(S("start_1_1_itemwise_sf1", G(8, 2, 5, True, "itemwise"), start_at=(1, 1), end_at=ep3))
    out.append(S("start_2_0_itemwise_sf1_n9", G(9, 2, 5, True, "itemwise"), start_at=(2, 0), end_at=ep3))
    out.append(S("start_1_2_batchwise_sf1", G(8, 2, 5, True, "batchwise"), start_at=(1, 2), end_at=ep3))
    out.append(S("start_1_0_reseed_sf1", G(8, 2, 5, True, "reseed"), start_at=(1, 0), end_at=ep3))

    # end_at variants
    out.append(S("end_batch_7", iw, end_at=("batch", 7)))
    out.append(S("end_batch_10_from_1_1", iw, start_at=(1, 1), end_at=("batch", 10)))
    out.append(S("end_epoch_1", iw, end_at=("epoch", 1)))
    out.append(S("end_none_max_batches_7", iw, end_at=None, max_batches=7))
    out.append(S("end_never_max_batches_5", bw, end_at=("never", 0), max_batches=5))
    out.append(
        S("end_before_start_defect13", iw, start_at=(2, 0), end_at=("epoch", 1),
          max_batches=6, defects=(13,))
    )

    # Validation
    v5 = G(5, 2, 0, False, "default", V0)
    v6sf = G(6, 3, 7, True, "default", V1)
    out.append(S("val_epoch1_one_group", iw, validation=("epoch", 1, v5), end_at=ep3, defects=(1,)))
    out.append(S("val_epoch2_one_group_single_run", iw, validation=("epoch", 2, v5), end_at=ep3))
    out.append(
        S("val_epoch2_two_groups", iw, validation=("epoch", 2, [v5, v6sf]), end_at=("epoch", 4),
          defects=(1,))
    )
    out.append(S("val_batch3_one_group", iw, validation=("batch", 3, v5), end_at=("batch", 9), defects=(1,)))
    out.append(
        S("val_batch3_two_groups_single_run", iw, validation=("batch", 3, [v5, v6sf]),
          end_at=("batch", 5))
    )
    out.append(
        S("val_batch3_resume_0_3", iw, validation=("batch", 3, [v5, v6sf]), start_at=(0, 3),
          end_at=("batch", 7), defects=(1,))
    )
    out.append(
        S("val_batch3_resume_0_3_single_run", iw, validation=("batch", 3, v5), start_at=(0, 3),
          end_at=("batch", 5))
    )
    out.append(
        S("val_epoch1_resume_1_0", iw, validation=("epoch", 1, v5), start_at=(1, 0), end_at=ep3,
          defects=(1,))
    )
    out.append(
        S("val_epoch1_resume_1_0_single_run", iw, validation=("epoch", 1, [v5, v6sf]),
          start_at=(1, 0), end_at=("epoch", 2))
    )

    # A shuffle_first validation group is only shuffled on resume (start epoch > 0) when its
    # mode is not itemwise ("default" resolves to itemwise without a cache): compare with
    # val_epoch1_resume_1_0_single_run, whose second validation group stays unshuffled.
    out.append(
        S("val_sf_repeat_resume_1_0", iw,
          validation=("epoch", 1, [v5, G(6, 3, 7, True, "repeat", V1)]),
          start_at=(1, 0), end_at=("epoch", 2))
    )

    # Multiple training groups
    g0 = G(8, 2, 5, False, "itemwise", 0)
    g1 = G(6, 3, 5, False, "repeat", 1000)
    g2 = G(5, 1, 2, True, "batchwise", 2000)
    out.append(S("two_groups_sequential", [g0, g1], end_at=("epoch", 2)))
    out.append(S("three_groups_sequential", [g0, g1, g2], end_at=("epoch", 2)))
    out.append(
        S("two_groups_interleave_true_defect2", [g0, g1], interleave_groups=True,
          end_at=("epoch", 2), defects=(2,))
    )
    out.append(S("two_groups_resume_1_5", [g0, g1], start_at=(1, 5), end_at=ep3))
    out.append(
        S("two_groups_with_validation", [g0, g1], validation=("epoch", 1, v5),
          end_at=("epoch", 1))
    )

    # Failing items
    out.append(S("fail_item_epoch0", iw, fail_items=(3,), end_at=("epoch", 1)))
    out.append(S("fail_item_repeat_two_epochs", G(8, 2, 5, False, "repeat"), fail_items=(3,),
                 end_at=("epoch", 2)))
    out.append(
        S("fail_validation_item", iw, validation=("epoch", 1, v5), fail_items=(V0 + 2,),
          end_at=("epoch", 1))
    )
    out.append(S("fail_all_batches", G(2, 2, 0, False, "repeat"), fail_items=(0,), end_at=("epoch", 2)))

    # depth / loader_count variations
    out.append(S("depth2_loaders1", iw, depth=2, loader_count=1, end_at=("epoch", 2)))

    # the trace verified by hand on 0.2.2: 10 items of 3, validation every epoch (5 items of 2),
    # three epochs; validation yields batches after epoch 0 only (defect 1)
    out.append(
        S("api_section6_trace", G(10, 3, 0, False, "default"),
          validation=("epoch", 1, G(5, 2, 0, False, "default", V0)), end_at=ep3, defects=(1,))
    )
    return out


def main(argv):
    import jax

    # The fixture's arrays are int64.
    jax.config.update("jax_enable_x64", True)

    import hydrax
    from importlib.metadata import version

    hv = version("hydrax")
    repo_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if os.path.abspath(hydrax.__file__).startswith(repo_root + os.sep):
        print(f"refusing to record: imported hydrax from the repository ({hydrax.__file__}), "
              "not the installed 0.2.2; run the script by path with the 0.2.2 venv's python",
              file=sys.stderr)
        return 2
    print(f"[record] using hydrax {hv} from {hydrax.__file__}", file=sys.stderr)
    if hv != "0.2.2":
        print(f"warning: running against hydrax {hv}, not 0.2.2", file=sys.stderr)
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    out_path = argv[1]
    only = set(argv[2:])
    all_sc = scenarios()
    names = [s["name"] for s in all_sc]
    assert len(names) == len(set(names)), "duplicate scenario names"
    unknown = only - set(names)
    if unknown:
        print(f"unknown scenarios: {sorted(unknown)}", file=sys.stderr)
        return 2

    recorded = []
    failed = []
    for sc in all_sc:
        if only and sc["name"] not in only:
            continue
        print(f"[record] {sc['name']}", file=sys.stderr, flush=True)
        try:
            sc = dict(sc)
            sc["result"] = run_scenario(hydrax, sc, placement_func=place)
        except BaseException as e:  # noqa: BLE001 - we report and exclude
            if isinstance(e, (SystemExit,)):
                raise
            traceback.print_exc()
            failed.append((sc["name"], f"{type(e).__name__}: {e}"))
            continue
        recorded.append(sc)

    doc = {"hydrax_version": hv, "dtype": DTYPE, "scenarios": recorded}
    with open(out_path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"[record] wrote {len(recorded)} scenarios to {out_path}", file=sys.stderr)
    if failed:
        print("[record] FAILED (excluded):", file=sys.stderr)
        for name, why in failed:
            print(f"  {name}: {why}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

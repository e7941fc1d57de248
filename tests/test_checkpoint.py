"""Saving the loader's position with the model checkpoint (``hydrax.checkpoint``), and resuming
from it exactly: in one process, through Orbax, after a SIGKILL, and under ``jax.distributed``.

The jobs that run in child processes (a training job, one process of a two-process job) are
functions of this module, run with ``python -c`` (see :func:`run_child`), so that their loader
functions are importable by name in the fork server's workers.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from support.timing import slack, slack_int

from hydrax import Dataloader, DataGroup
from hydrax.checkpoint import FORMAT_VERSION, LoaderState, dataset_fingerprint, read_state, write_state
from hydrax.errors import CheckpointFormatError, CheckpointMismatchError, HydraxError

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
FEATURES = 4


def arrays_spec():
    import jax.numpy as jnp

    return {"item": ((), np.int32, jnp.int32), "seed": ((), np.int64, jnp.int32), "x": ((FEATURES,), np.float32, jnp.float32)}


def load(item, arrays, seed):
    """Deterministic in (item, seed): the seed moves the values, as an augmentation would."""
    arrays["item"][...] = item
    arrays["seed"][...] = -1 if seed is None else seed
    arrays["x"][:] = np.random.default_rng([item, 0 if seed is None else seed + 1]).standard_normal(FEATURES)


def load_failing(item, arrays, seed):
    if item in (5, 13):
        raise ValueError("planned failure")
    load(item, arrays, seed)


def describe(batch) -> tuple:
    """A batch as plain data: where it is in the schedule, its items, seeds and array bytes.
    (A validation batch's ``validation_epoch`` counts the validation runs of one Dataloader
    run, so a resumed run counts afresh: it is left out.)"""
    arrays = tuple(np.asarray(batch.arrays[name]).tobytes().hex() for name in ("item", "seed", "x"))
    if batch.is_training:
        return ("T", batch.batch_num, batch.epoch, batch.epoch_batch, batch.group_index, tuple(batch.seeds), tuple(batch.indices), arrays)
    return ("V", batch.validation_epoch_batch, batch.group_index, tuple(batch.indices), arrays)


def groups(seed=3, size=12, batch_size=4, shuffle_later="itemwise"):
    train = DataGroup(batch_size, range(size), loader_arrays=arrays_spec(), seed=seed, shuffle_first=True, shuffle_later=shuffle_later)
    valid = DataGroup(2, range(100, 104), loader_arrays=arrays_spec(), seed=9, shuffle_first=True)
    return train, valid


def every_state(loader_func, training, **kwargs):
    """Every batch of an uninterrupted run, and the loader's state before each batch and after the last."""
    kwargs.setdefault("loader_count", 1)
    kwargs.setdefault("depth", 3)
    kwargs.setdefault("timeout_sec", slack_int(30))
    batches, states = [], []
    with Dataloader(loader_func, training, **kwargs) as dl:
        states.append(dl.state())
        for batch in dl:
            batches.append(describe(batch))
            del batch
            states.append(dl.state())
    return batches, states


def resumed(loader_func, training, state, **kwargs):
    kwargs.setdefault("loader_count", 1)
    kwargs.setdefault("timeout_sec", slack_int(30))
    with Dataloader(loader_func, training, start_at=state, **kwargs) as dl:
        got = [describe(batch) for batch in dl]
    return got


def check_every_resume(loader_func, training, **kwargs):
    """Stopping after any batch and resuming from the state (through its JSON) gives the rest of
    the uninterrupted run, bit for bit."""
    full, states = every_state(loader_func, training, **kwargs)
    assert len(states) == len(full) + 1
    for k, state in enumerate(states):
        again = LoaderState.from_json(state.to_json())
        assert again == state
        assert resumed(loader_func, training, again, **{k: v for k, v in kwargs.items() if k != "depth"}) == full[k:], (k, state)
    return full, states


# -- exact resume in one process -----------------------------------------------------------------


def test_resume_after_any_batch_with_batch_validation_is_exact():
    train, valid = groups()
    full, states = check_every_resume(load, train, validation=("batch", 2, valid), end_at=("epoch", 3))
    kinds = "".join(b[0] for b in full)
    assert kinds == "TTVVTTVVTTVVTTVVT"  # validation after every 2nd batch, across epoch ends (3 a epoch)
    positions = [(s.epoch, s.batch, s.validation_batch) for s in states]
    # after a training batch that a validation run follows, the state says that run comes first
    assert positions[:6] == [(0, 0, None), (0, 1, None), (0, 2, 0), (0, 2, 1), (0, 2, None), (1, 0, None)]
    assert positions[-1] == (3, 0, None)


def test_resume_with_epoch_validation_and_interleaved_batchwise_groups_is_exact():
    a = DataGroup(2, range(8), loader_arrays=arrays_spec(), seed=5, shuffle_later="batchwise")
    b = DataGroup(2, range(1000, 1006), loader_arrays=arrays_spec(), seed=7, shuffle_later="reseed")
    _, valid = groups()
    full, states = check_every_resume(load, [a, b], validation=("epoch", 1, valid), end_at=("epoch", 2), depth=2)
    assert "".join(b[0] for b in full) == "TTTTTTTVVTTTTTTTVV"
    assert (states[7].epoch, states[7].batch, states[7].validation_batch) == (1, 0, 0)  # the epoch's validation is due


def test_resume_skips_nothing_and_repeats_nothing_around_dropped_batches():
    """Batches dropped by on_item_error="drop_batch" are not delivered: a state taken after the
    validation run that follows a dropped training batch still resumes inside that run."""
    train = DataGroup(4, range(16), loader_arrays=arrays_spec(), seed=1, shuffle_later="repeat")  # batch 1 holds item 5
    _, valid = groups()
    full, states = check_every_resume(load_failing, train, validation=("batch", 2, valid), end_at=("epoch", 2))
    numbers = [b[1] for b in full if b[0] == "T"]
    assert numbers == [0, 2, 4, 6]  # 1, 3, 5, 7 hold item 5 or 13
    assert "".join(b[0] for b in full) == "TVVTVVTVVTVV"
    assert (states[1].epoch, states[1].batch, states[1].validation_batch) == (0, 1, None)
    assert (states[2].epoch, states[2].batch, states[2].validation_batch) == (0, 2, 1)


def test_state_before_the_run_is_its_start_and_after_it_its_end():
    train, valid = groups()
    kwargs = dict(validation=("batch", 2, valid), loader_count=1, timeout_sec=slack_int(30))
    loader = Dataloader(load, train, start_at=(1, 1), end_at=("batch", 6), **kwargs)
    state = loader.state()
    assert (state.epoch, state.batch, state.validation_batch, state.process_index, state.process_count) == (1, 1, None, 0, 1)
    assert state.format == FORMAT_VERSION and state.fingerprint == loader.dataset_fingerprint
    with loader:
        got = [describe(b) for b in loader]
    assert [b[:2] for b in got] == [("T", 4), ("T", 5), ("V", 0), ("V", 1)]  # the validation after batch 5 comes before the end
    end = loader.state()
    assert (end.epoch, end.batch, end.validation_batch) == (2, 0, None)
    # a Dataloader runs once; the next one starts where it stopped
    full, _ = every_state(load, train, end_at=("epoch", 3), **kwargs)
    assert resumed(load, train, end, end_at=("epoch", 3), **kwargs) == full[[b[:2] for b in full].index(("T", 6)):]
    # a state inside a validation run is passed on unchanged until a batch comes
    inside = Dataloader(load, train, start_at=dataclasses.replace(end, validation_batch=1), **kwargs)
    assert inside.state() == dataclasses.replace(end, validation_batch=1) and inside.first_batch == 6


def test_start_at_takes_the_state_as_a_dict_and_states_round_trip_through_json():
    train, valid = groups()
    full, states = every_state(load, train, validation=("batch", 2, valid), end_at=("epoch", 2))
    state = states[3]
    data = json.loads(state.to_json())
    assert data["kind"] == "hydrax.LoaderState" and data["format"] == FORMAT_VERSION and data["validation_batch"] == 1
    assert data["dataset"]["training"][0]["batch_size"] == 4 and data["dataset"]["validation_mode"] == "batch"
    assert LoaderState.from_dict(data) == state and state.start_at == (0, 2)
    assert resumed(load, train, data, validation=("batch", 2, valid), end_at=("epoch", 2)) == full[3:]
    assert "validation batch 1" in str(state) and state.fingerprint in str(state)


# -- the fingerprint and what is refused ---------------------------------------------------------


def test_the_dataset_fingerprint_ignores_where_the_run_starts_and_who_loads_it():
    train, valid = groups()
    base = Dataloader(load, train, validation=("batch", 2, valid))
    same = [
        Dataloader(load, train, validation=("batch", 2, valid), start_at=(2, 1), end_at=("epoch", 9)),
        Dataloader(load, train, validation=("batch", 2, valid), process_index=1, process_count=2),
        Dataloader(load, groups()[0], validation=("batch", 2, groups()[1]), cacher_count=2, depth=5, loader_count=2),
    ]
    streamed = Dataloader(load, train, validation=("batch", 2, valid))
    streamed.select_stream(1, 3)
    for other in [*same, streamed]:
        assert other.dataset_fingerprint == base.dataset_fingerprint
    assert same[0].schedule_fingerprint != base.schedule_fingerprint  # that one does see start_at
    different = [
        Dataloader(load, groups(seed=4)[0], validation=("batch", 2, valid)),
        Dataloader(load, groups(size=13)[0], validation=("batch", 2, valid)),
        Dataloader(load, groups(batch_size=2)[0], validation=("batch", 2, valid)),
        Dataloader(load, groups(shuffle_later="reseed")[0], validation=("batch", 2, valid)),
        Dataloader(load, train, validation=("batch", 3, valid)),
        Dataloader(load, train, validation=("epoch", 2, valid)),
        Dataloader(load, train),
        Dataloader(load, [train, valid]),
    ]
    prints = [d.dataset_fingerprint for d in different]
    assert base.dataset_fingerprint not in prints and len(set(prints)) == len(prints)
    assert dataset_fingerprint(base._plan) == base.dataset_fingerprint


@pytest.mark.parametrize("change, words", [
    ({"seed": 4}, "training group 0: seed is 3 in the checkpoint, 4 here"),
    ({"size": 16}, "training group 0: size is 12 in the checkpoint, 16 here"),
    ({"batch_size": 6}, "training group 0: batch_size is 4 in the checkpoint, 6 here"),
    ({"shuffle_later": "repeat"}, "training group 0: shuffle_later is 'itemwise' in the checkpoint, 'repeat' here"),
])
def test_a_state_saved_for_another_dataset_is_refused_saying_what_differs(change, words):
    train, valid = groups()
    state = Dataloader(load, train, validation=("batch", 2, valid), start_at=(1, 2)).state()
    other = groups(**change)[0]
    with pytest.raises(CheckpointMismatchError) as caught:
        Dataloader(load, other, validation=("batch", 2, valid), start_at=state)
    error = caught.value
    assert isinstance(error, HydraxError) and isinstance(error, ValueError)
    assert error.expected == state.fingerprint
    assert error.actual == Dataloader(load, other, validation=("batch", 2, valid)).dataset_fingerprint != error.expected
    assert words in error.differences and words in str(error)
    assert "start_at=(1, 2)" in str(error)  # what to do to start there anyway
    import pickle

    again = pickle.loads(pickle.dumps(error))
    assert (again.expected, again.actual, again.differences, str(again)) == (error.expected, error.actual, error.differences, str(error))


def test_validation_and_group_changes_are_refused_too():
    train, valid = groups()
    state = Dataloader(load, train, validation=("batch", 2, valid)).state()
    with pytest.raises(CheckpointMismatchError, match="validation_interval is 2 in the checkpoint, 3 here"):
        Dataloader(load, train, validation=("batch", 3, valid), start_at=state)
    with pytest.raises(CheckpointMismatchError, match="1 validation groups in the checkpoint, 0 here"):
        Dataloader(load, train, start_at=state)
    with pytest.raises(CheckpointMismatchError, match="1 training groups in the checkpoint, 2 here"):
        Dataloader(load, [train, valid], validation=("batch", 2, valid), start_at=state)
    # a state without its summary is still refused, with the fingerprints
    bare = LoaderState(epoch=0, batch=1, fingerprint="0123456789abcdef")
    with pytest.raises(CheckpointMismatchError, match="does not say what") as caught:
        Dataloader(load, train, start_at=bare)
    assert caught.value.expected == "0123456789abcdef" and caught.value.differences == ()


def test_a_newer_format_or_something_else_is_refused_clearly():
    train, _ = groups()
    data = Dataloader(load, train).state().to_dict()
    with pytest.raises(CheckpointFormatError, match=f"format {FORMAT_VERSION + 1}, newer than this hydrax reads") as caught:
        Dataloader(load, train, start_at={**data, "format": FORMAT_VERSION + 1})
    assert (caught.value.version, caught.value.supported) == (FORMAT_VERSION + 1, FORMAT_VERSION)
    with pytest.raises(CheckpointFormatError, match="not a hydrax loader state") as caught:
        Dataloader(load, train, start_at={"epoch": 1, "batch": 0})
    assert caught.value.version is None
    with pytest.raises(CheckpointFormatError, match="cannot be read: a LoaderState's batch must be a non-negative int"):
        LoaderState.from_dict({**data, "batch": -1})
    with pytest.raises(CheckpointFormatError, match="not JSON"):
        LoaderState.from_json("{", path="x.json")
    with pytest.raises(TypeError, match=r"start_at must be \(epoch, batch\) ints or a hydrax.checkpoint.LoaderState"):
        Dataloader(load, train, start_at="state.json")
    newer = dataclasses.replace(LoaderState.from_dict(data), format=FORMAT_VERSION + 1)
    with pytest.raises(CheckpointFormatError, match="newer than this hydrax reads"):
        Dataloader(load, train, start_at=newer)


def test_another_process_count_resumes_the_same_global_batches():
    """A state saved by one process resumes two processes (process counts by hand): together
    they load the batches the single process would have."""
    train, valid = groups()
    kwargs = dict(validation=("batch", 2, valid), end_at=("epoch", 2))
    full, states = every_state(load, train, **kwargs)
    state = states[3]  # inside a validation run
    halves = [resumed(load, train, state, process_index=p, process_count=2, **kwargs) for p in range(2)]
    assert len(halves[0]) == len(halves[1]) == len(full) - 3
    for whole, first, second in zip(full[3:], *halves):
        assert whole[0] == first[0] == second[0]
        indices = -2 if whole[0] == "T" else 3
        assert whole[indices] == first[indices] + second[indices]


def test_state_refuses_out_of_order_delivery_and_stream_shares():
    train, _ = groups()
    with pytest.raises(RuntimeError, match="needs deterministic=True"):
        Dataloader(load, train, deterministic=False).state()
    shared = Dataloader(load, train)
    shared.select_stream(0, 2)
    with pytest.raises(RuntimeError, match="share of a stream"):
        shared.state()


def test_producers_resumed_inside_a_validation_run_serve_the_rest_of_it():
    """select_stream numbers positions from the resumed point, past the batches the resume skips."""
    train, valid = groups()
    kwargs = dict(validation=("batch", 2, valid), end_at=("epoch", 2), loader_count=1, timeout_sec=slack_int(30))
    full, states = every_state(load, train, **kwargs)
    state = states[3]
    shares, prints = [], set()
    for index in range(2):
        loader = Dataloader(load, train, start_at=state, **kwargs)
        loader.select_stream(index, 2)
        prints.add(loader.schedule_fingerprint)
        with loader:
            shares.append([describe(b) for b in loader])
    merged = [batch for pair in zip(shares[0], shares[1] + [None]) for batch in pair if batch is not None]
    assert merged == full[3:]
    # the producers agree on the schedule, which is not that of a plain start at the same batch
    assert len(prints) == 1 and Dataloader(load, train, start_at=state.start_at, **kwargs).schedule_fingerprint not in prints


# -- state files ---------------------------------------------------------------------------------


def test_state_files_are_per_process_and_another_count_reads_process_0(tmp_path, caplog):
    train, _ = groups()
    # the processes of one save stand at the same position (files of different positions are refused, see below)
    states = [Dataloader(load, train, start_at=(1, 1), process_index=p, process_count=2).state() for p in range(2)]
    paths = [write_state(tmp_path, s) for s in states]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["process_0-of-2.json", "process_1-of-2.json"]
    assert [read_state(tmp_path, p, 2) for p in range(2)] == states
    caplog.set_level("INFO", "hydrax")
    assert read_state(tmp_path, 0, 3) == read_state(tmp_path) == states[0]
    assert "saved by 2 processes" in caplog.text
    assert LoaderState.from_json(paths[1].read_text()) == states[1]
    with pytest.raises(FileNotFoundError, match="no hydrax loader state"):
        read_state(tmp_path / "missing")
    with pytest.raises(ValueError, match="go together"):
        read_state(tmp_path, 1)
    (tmp_path / "process_0-of-2.json").write_text(json.dumps({**states[0].to_dict(), "format": 99}))
    with pytest.raises(CheckpointFormatError, match="process_0-of-2.json: this loader state has format 99") as caught:
        read_state(tmp_path, 0, 2)
    assert caught.value.path.endswith("process_0-of-2.json")


def save_of(train, position, count, tmp_path, **kwargs):
    """The state files of one save by ``count`` processes at ``position``, written into ``tmp_path``."""
    states = [Dataloader(load, train, start_at=position, process_index=p, process_count=count).state() for p in range(count)]
    return [write_state(tmp_path, state, **kwargs) for state in states], states


def test_a_directory_holding_files_of_two_saves_is_refused_naming_both(tmp_path):
    """Issue 38 row 9: four processes saved at (0, 1), then two at (1, 0) into the same directory:
    the four must not resume at the stale position, nor the two at theirs without a word."""
    train, _ = groups()
    save_of(train, (0, 1), 4, tmp_path)
    save_of(train, (1, 0), 2, tmp_path)
    for index, count in [(0, 4), (3, 4), (0, 2), (1, 2), (0, 1)]:
        with pytest.raises(CheckpointFormatError, match="holds loader states of different saves") as caught:
            read_state(tmp_path, index, count)
        error = caught.value
        assert error.path == str(tmp_path)
        assert re.search(r"process_\d-of-2\.json \(epoch 1, batch 0, save [0-9a-f]{16}\)", str(error))
        assert re.search(r"process_\d-of-4\.json \(epoch 0, batch 1, save [0-9a-f]{16}\)", str(error))
        assert "delete the files of the save not to resume from" in str(error)
    # once the stale save is gone, every process count reads the current one
    for p in range(4):
        (tmp_path / f"process_{p}-of-4.json").unlink()
    assert read_state(tmp_path, 3, 4).start_at == read_state(tmp_path, 1, 2).start_at == (1, 0)


def test_a_save_that_stopped_halfway_over_an_earlier_one_is_refused(tmp_path):
    train, _ = groups()
    save_of(train, (0, 1), 2, tmp_path)
    save_of(train, (1, 2), 1, tmp_path / "next")
    paths, _ = save_of(train, (1, 2), 2, tmp_path / "next")
    paths[0].replace(tmp_path / paths[0].name)  # process 0 of the new save wrote its file, process 1 did not
    with pytest.raises(CheckpointFormatError, match="process_1-of-2.json \\(epoch 0, batch 1, save [0-9a-f]+\\) and "
                                                    "process_0-of-2.json \\(epoch 1, batch 2"):
        read_state(tmp_path, 1, 2)


def test_files_of_one_save_agree_whatever_wrote_them(tmp_path):
    train, valid = groups()
    kwargs = dict(validation=("batch", 2, valid))
    # saves at one position by two process counts resume at the same place: they agree
    states = [Dataloader(load, train, start_at=(1, 1), process_index=p, process_count=c, **kwargs).state()
              for c in (1, 2) for p in range(c)]
    for state in states:
        write_state(tmp_path / "mixed", state)
    assert read_state(tmp_path / "mixed", 1, 2) == states[2] and read_state(tmp_path / "mixed", 0, 1) == states[0]
    # files written before saves were recorded (no "save") are read, and checked by their positions
    for state in states[1:]:
        (tmp_path / "old").mkdir(exist_ok=True)
        (tmp_path / "old" / f"process_{state.process_index}-of-2.json").write_text(state.to_json())
    assert "save" not in json.loads((tmp_path / "old" / "process_1-of-2.json").read_text())
    assert read_state(tmp_path / "old", 1, 2) == states[2]
    stale = dataclasses.replace(states[1], batch=0)
    (tmp_path / "old" / "process_0-of-2.json").write_text(stale.to_json())
    with pytest.raises(CheckpointFormatError, match="different saves"):
        read_state(tmp_path / "old", 1, 2)
    # a save named by the caller (the training step) is compared by that name
    for state in states[1:]:
        write_state(tmp_path / "named", state, save=1000)
    assert json.loads((tmp_path / "named" / "process_0-of-2.json").read_text())["save"] == "1000"
    write_state(tmp_path / "named", states[1], save=2000)
    with pytest.raises(CheckpointFormatError, match="save 1000\\) and process_0-of-2.json .*save 2000"):
        read_state(tmp_path / "named", 1, 2)
    with pytest.raises(TypeError, match="save must be a str or an int"):
        write_state(tmp_path / "named", states[1], save=1.5)


def test_a_state_past_the_end_of_its_epoch_is_refused():
    """Issue 38 row 10: a state at batch >= batches_per_epoch (changed by hand, or damaged) would
    resume silently at (epoch + 1, batch - batches_per_epoch)."""
    train, valid = groups()  # 3 batches an epoch
    kwargs = dict(validation=("batch", 2, valid))
    state = Dataloader(load, train, start_at=(1, 2), **kwargs).state()
    assert Dataloader(load, train, start_at=state, **kwargs).first_batch == 5
    for bad in (dataclasses.replace(state, batch=3), dataclasses.replace(state, batch=7).to_dict(),
                dataclasses.replace(state, batch=3, validation_batch=0)):
        with pytest.raises(CheckpointFormatError, match="at batch [37] of epoch 1, but this Dataloader's epochs have 3 "
                                                        "batches \\(0 to 2\\): the state was changed by hand") as caught:
            Dataloader(load, train, start_at=bad, **kwargs)
        assert caught.value.version == FORMAT_VERSION and "start_at=(1, " in str(caught.value)
    # a plain (epoch, batch) still counts on into the following epochs, as documented
    assert Dataloader(load, train, start_at=(1, 3), **kwargs).first_batch == 6


@pytest.mark.parametrize("text, words", [
    ("[" * 200_000 + "]" * 200_000, "nested more than 64 deep"),
    ('{"a": ' * 200_000 + "1" + "}" * 200_000, "nested more than 64 deep"),
    ("[" * 65 + "]" * 65, "nested more than 64 deep"),
    (" " * (16 << 20) + "{}", "it is larger than 16777216 bytes"),
    (b"\xff\xfe\x00", "not text"),
])
def test_a_state_file_too_deep_or_too_large_is_refused_naming_it(tmp_path, text, words):
    """Issue 38 row 11: a state file nested 200,000 deep raised RecursionError."""
    path = tmp_path / "process_0-of-1.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(CheckpointFormatError, match=f"process_0-of-1.json: this is not a hydrax loader state \\({words}") as caught:
        read_state(tmp_path, 0, 1)
    assert caught.value.path == str(path) and caught.value.version is None
    with pytest.raises(CheckpointFormatError, match=words):
        LoaderState.from_json(text, path="x.json")


def test_brackets_inside_strings_do_not_count_as_nesting():
    state = LoaderState(epoch=1, batch=2, fingerprint="f", dataset={"note": "[" * 1000 + '\\"{' * 100, "deep": [[[[1]]]]})
    assert LoaderState.from_json(state.to_json()) == state
    assert LoaderState.from_json(state.to_json().encode()) == state  # bytes too


def test_importing_hydrax_does_not_import_orbax_and_without_it_the_state_still_works():
    code = (
        "import sys; sys.modules['orbax'] = None; sys.modules['orbax.checkpoint'] = None\n"
        "import hydrax, hydrax.checkpoint as hc\n"
        "assert 'orbax' not in [m.split('.')[0] for m in sys.modules if sys.modules[m] is not None]\n"
        "state = hc.LoaderState(epoch=1, batch=2, fingerprint='f')\n"
        "assert hc.LoaderState.from_json(state.to_json()) == state\n"
        "from hydrax.checkpoint import *\n"
        "try:\n    hc.LoaderSave\nexcept ImportError as exc:\n    print(exc)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=slack(120), cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert "pip install 'hydrax[orbax]'" in result.stdout and "LoaderSave" in result.stdout
    plain = subprocess.run([sys.executable, "-c", "import sys, hydrax, hydrax.checkpoint; assert 'orbax' not in sys.modules"],
                           capture_output=True, text=True, timeout=slack(120), cwd=ROOT)
    assert plain.returncode == 0, plain.stderr


# -- Orbax ---------------------------------------------------------------------------------------


def test_orbax_saves_the_loader_with_the_model_and_restores_its_state(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    import jax.numpy as jnp

    import hydrax.checkpoint as hc

    train, valid = groups()
    kwargs = dict(validation=("batch", 2, valid), end_at=("epoch", 2), loader_count=1, timeout_sec=slack_int(30))
    full, _ = every_state(load, train, **kwargs)
    params = {"w": jnp.arange(4.0)}
    with ocp.CheckpointManager(tmp_path / "ckpt") as manager, Dataloader(load, train, **kwargs) as loader:
        for step, batch in enumerate(loader, 1):
            del batch
            if step == 3:
                manager.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(params), loader=hc.LoaderSave(loader)))
                saved = loader.state()
                break
        manager.wait_until_finished()
    assert sorted(p.name for p in (tmp_path / "ckpt" / "3" / "loader").iterdir() if p.suffix == ".json") == ["process_0-of-1.json"]
    with ocp.CheckpointManager(tmp_path / "ckpt") as manager:
        restored = manager.restore(manager.latest_step(),
                                   args=ocp.args.Composite(params=ocp.args.StandardRestore(params), loader=hc.LoaderRestore()))
    assert isinstance(restored.loader, LoaderState) and restored.loader == saved
    np.testing.assert_array_equal(restored.params["w"], params["w"])
    assert resumed(load, train, restored.loader, **kwargs) == full[3:]
    # a state passed as such (not a Dataloader) is saved as it is
    assert hc.LoaderSave(saved).state is saved
    assert issubclass(hc.LoaderCheckpointHandler, ocp.CheckpointHandler)
    assert ocp.args.get_registered_handler_cls(hc.LoaderRestore) is hc.LoaderCheckpointHandler


# -- in other processes: a killed training job, two processes under jax.distributed --------------


def run_child(function: str, config: dict, log, **popen) -> subprocess.Popen:
    """Start ``function(config)`` of this module in a new process (session) of its own."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(TESTS)]), JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    code = f"import json, sys, test_checkpoint; test_checkpoint.{function}(json.loads(sys.argv[1]))"
    return subprocess.Popen([sys.executable, "-c", code, json.dumps(config)], stdout=subprocess.PIPE, stderr=log, text=True,
                            env=env, cwd=ROOT, start_new_session=True, **popen)


def finish(proc: subprocess.Popen, log, deadline: float) -> dict:
    """The JSON report on the child's last line, once it has exited."""
    try:
        out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    log.seek(0)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, f"status {proc.returncode}:\n{out[-2000:]}\n{log.read()[-6000:]}"
    return json.loads(lines[-1])


def training_groups():
    train = DataGroup(8, range(48), loader_arrays=arrays_spec(), seed=11, shuffle_first=True, shuffle_later="itemwise")
    valid = DataGroup(8, range(1000, 1016), loader_arrays=arrays_spec(), seed=12, shuffle_first=True)
    return train, valid


def train_job(config: dict) -> None:
    """A training job: a linear model learns from the batches with SGD, and a CheckpointManager
    saves the model and the loader every ``save_every`` steps. With ``block_at``, after the
    checkpoint of step ``wait_for`` is complete, the job trains on to step ``block_at``, says so
    on stdout and waits to be killed. With ``resume``, it starts from the latest checkpoint. It
    reports every batch it saw (and each validation loss) and the final parameters."""
    import jax
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    import hydrax.checkpoint as hc

    @jax.jit
    def sgd(params, x, seed):
        target = jnp.sin(x.sum(axis=1)) + (seed % 7).astype(jnp.float32) / 7
        grads = jax.grad(lambda p: jnp.mean((x @ p["w"] + p["b"] - target) ** 2))(params)
        return jax.tree_util.tree_map(lambda p, g: p - 0.05 * g, params, grads)

    @jax.jit
    def loss(params, x):
        return jnp.mean((x @ params["w"] + params["b"] - jnp.sin(x.sum(axis=1))) ** 2)

    params = {"w": jnp.zeros(FEATURES, jnp.float32), "b": jnp.zeros((), jnp.float32)}
    options = ocp.CheckpointManagerOptions(save_interval_steps=config["save_every"], max_to_keep=2)
    manager = ocp.CheckpointManager(config["directory"], options=options)
    step, start_at = 0, (0, 0)
    if config.get("resume"):
        step = manager.latest_step()
        restored = manager.restore(step, args=ocp.args.Composite(params=ocp.args.StandardRestore(params), loader=hc.LoaderRestore()))
        params, start_at = restored.params, restored.loader
    train, valid = training_groups()
    seen = []
    with Dataloader(load, train, validation=("batch", 3, valid), end_at=("epoch", 3), start_at=start_at, loader_count=1,
                    timeout_sec=120) as loader:
        for batch in loader:
            if batch.is_training:
                params = sgd(params, batch.arrays["x"], batch.arrays["seed"])
                step += 1
                seen.append(describe(batch))
                manager.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(params), loader=hc.LoaderSave(loader)))
                if step == config.get("wait_for"):
                    manager.wait_until_finished()
                    print(json.dumps({"saved": step}), flush=True)
                if step == config.get("block_at"):
                    print("blocking", flush=True)
                    while True:
                        time.sleep(3600)
            else:
                seen.append(describe(batch) + (np.asarray(loss(params, batch.arrays["x"])).tobytes().hex(),))
            del batch
    manager.wait_until_finished()
    manager.close()
    final = {name: np.asarray(value).tobytes().hex() for name, value in params.items()}
    print(json.dumps({"started": list(start_at.start_at) if config.get("resume") else [0, 0], "seen": seen, "params": final,
                      "state": start_at.to_dict() if config.get("resume") else None}), flush=True)


@pytest.mark.slow
def test_a_killed_training_job_resumes_from_its_orbax_checkpoint_bit_identically(tmp_path):
    pytest.importorskip("orbax.checkpoint")
    deadline = time.monotonic() + slack(300)
    logs = [tempfile.TemporaryFile("w+") for _ in range(3)]
    try:
        full = run_child("train_job", {"directory": str(tmp_path / "full"), "save_every": 3}, logs[0])
        killed = run_child("train_job", {"directory": str(tmp_path / "run"), "save_every": 3, "wait_for": 6, "block_at": 8}, logs[1])
        try:
            lines = []
            for line in killed.stdout:
                lines.append(line)
                if line.startswith("blocking"):
                    break
            if not (lines and lines[-1].startswith("blocking")):
                logs[1].seek(0)
                raise AssertionError("the job ended before it blocked:\n" + "".join(lines) + logs[1].read()[-6000:])
            assert json.loads(lines[-2]) == {"saved": 6}
        finally:
            os.killpg(killed.pid, signal.SIGKILL)  # the job, its loader workers, its fork server
            killed.wait()
            killed.stdout.close()
        assert killed.returncode == -signal.SIGKILL
        assert sorted(p.name for p in (tmp_path / "run").iterdir() if p.name.isdigit()) == ["3", "6"]
        again = run_child("train_job", {"directory": str(tmp_path / "run"), "save_every": 3, "resume": True}, logs[2])
        reference, resumed_run = finish(full, logs[0], deadline), finish(again, logs[2], deadline)
    finally:
        for log in logs:
            log.close()
    seen = [tuple(map(_tuples, b)) for b in reference["seen"]]
    after = [i for i, b in enumerate(seen) if b[0] == "T"][5] + 1  # right after the 6th training batch
    assert seen[after][0] == "V"  # the checkpoint came just before a validation run: it must not be lost
    assert resumed_run["state"]["validation_batch"] == 0 and resumed_run["started"] == [1, 0]
    assert [tuple(map(_tuples, b)) for b in resumed_run["seen"]] == seen[after:]
    assert resumed_run["params"] == reference["params"]


def _tuples(value):
    return tuple(map(_tuples, value)) if isinstance(value, list) else value


def distributed_job(config: dict) -> None:
    """One of two processes under jax.distributed: it takes ``stop`` batches, saves the loader
    with Orbax, then restores the state into a new Dataloader and takes the rest of the run."""
    import jax

    jax.distributed.initialize(f"127.0.0.1:{config['port']}", 2, config["process_id"], initialization_timeout=120)
    import orbax.checkpoint as ocp

    import hydrax.checkpoint as hc

    train, valid = groups()
    kwargs = dict(validation=("batch", 2, valid), end_at=("epoch", 2), loader_count=1, timeout_sec=120)
    manager = ocp.CheckpointManager(config["directory"])
    with Dataloader(load, train, **kwargs) as loader:
        before = []
        for batch in loader:
            before.append(describe(batch))
            del batch
            if len(before) == config["stop"]:
                break
        manager.save(len(before), args=ocp.args.Composite(loader=hc.LoaderSave(loader)))
        manager.wait_until_finished()
    restored = manager.restore(manager.latest_step(), args=ocp.args.Composite(loader=hc.LoaderRestore()))
    manager.close()
    with Dataloader(load, train, start_at=restored.loader, **kwargs) as loader:
        after = [describe(batch) for batch in loader]
    print(json.dumps({"state": restored.loader.to_dict(), "before": before, "after": after}), flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_save_and_restore_their_own_states_and_one_process_resumes_from_them(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    import hydrax.checkpoint as hc

    deadline = time.monotonic() + slack(300)
    port = _free_port()
    logs = [tempfile.TemporaryFile("w+") for _ in range(2)]
    try:
        procs = [run_child("distributed_job", {"port": port, "process_id": p, "directory": str(tmp_path / "ckpt"), "stop": 3},
                           logs[p]) for p in range(2)]
        reports = [finish(proc, log, deadline) for proc, log in zip(procs, logs)]
    finally:
        for log in logs:
            log.close()
    train, valid = groups()
    kwargs = dict(validation=("batch", 2, valid), end_at=("epoch", 2))
    full, states = every_state(load, train, **kwargs)
    files = sorted(p.name for p in (tmp_path / "ckpt" / "3" / "loader").iterdir() if p.suffix == ".json")
    assert files == ["process_0-of-2.json", "process_1-of-2.json"]
    for p, report in enumerate(reports):
        state = LoaderState.from_dict(report["state"])
        assert (state.process_index, state.process_count) == (p, 2)
        assert (state.epoch, state.batch, state.validation_batch, state.fingerprint) == (0, 2, 1, states[3].fingerprint)
    # each process had its half of every batch, before and after the restore
    for whole, first, second in zip(full, *(r["before"] + r["after"] for r in reports)):
        indices = -2 if whole[0] == "T" else 3
        assert whole[0] == first[0] == second[0] and list(whole[indices]) == first[indices] + second[indices]
    # one process resumes from the two processes' checkpoint: at process 0's position, whole batches
    with ocp.CheckpointManager(tmp_path / "ckpt") as manager:
        state = manager.restore(3, args=ocp.args.Composite(loader=hc.LoaderRestore())).loader
    assert state.process_count == 2 and state.process_index == 0
    assert resumed(load, train, state, **kwargs) == full[3:]

"""hydrax.tqdm: progress bars over real Dataloader runs (worker processes, JAX placement)."""

from __future__ import annotations

import io
import multiprocessing
import os
import re
import signal
import time

import numpy as np
import pytest
import tqdm as tqdm_package
from support.leftovers import new_shm_entries
from support.shmwatch import SHM
from support.timing import slack_int

from hydrax import DataGroup, Dataloader, TrainingBatch, ValidationBatch
from hydrax.tqdm import ProgressMonitor, tbatches

# The loader functions below are imported by every worker process: keeping jax out of this
# module's imports keeps worker start-up short (the jax dtype may be given as a numpy dtype).
SPEC = {"x": ((1,), np.int32, np.int32)}


def load_item(item, arrays, seed):
    arrays["x"][...] = item
    return {"item": item}


def load_slow(item, arrays, seed):
    time.sleep(0.03)
    arrays["x"][...] = item


def load_failing(item, arrays, seed):
    if item == 5:
        raise ValueError("item 5 cannot be loaded")
    arrays["x"][...] = item


def make_loader(loader=load_item, items=12, batch_size=3, validation=None, **kwargs):
    group = DataGroup(batch_size, list(range(items)), loader_arrays=SPEC)
    if validation is not None:
        mode, interval, count = validation
        validation = (mode, interval, DataGroup(2, list(range(100, 100 + count)), loader_arrays=SPEC))
    kwargs.setdefault("timeout_sec", slack_int(20))
    return Dataloader(loader, group, validation=validation, loader_count=2, **kwargs)


def bar_states(text: str, description: str) -> list[str]:
    """Every counter a bar called ``description`` displayed, in order (``"5/12"`` or ``"7"``)."""
    return re.findall(rf"{description}:[^\r\n]*?(\d+(?:/\d+)?)(?:batch)? ?\[", text)


@pytest.fixture
def clean_process():
    """Checks that a test leaves no child processes, none of its own /dev/shm entries (other
    xdist workers' loaders make and remove theirs meanwhile) and the SIGINT handler as it was."""
    before = set(os.listdir(SHM))
    handler = signal.getsignal(signal.SIGINT)
    yield
    assert multiprocessing.active_children() == []
    assert new_shm_entries(before) == set()
    assert signal.getsignal(signal.SIGINT) is handler


def test_tbatches_totals_and_initial_value(clean_process):
    out = io.StringIO()
    loader = make_loader(start_at=(1, 1), end_at=("epoch", 3))  # 4 batches per epoch: batches 5..11
    assert (loader.first_batch, loader.last_batch) == (5, 12)
    seen = []
    for batch in tbatches(loader, file=out, mininterval=0, miniters=1, ascii=True):
        assert isinstance(batch, TrainingBatch)
        seen.append(batch.batch_num)
        del batch
    assert seen == list(range(5, 12))
    states = bar_states(out.getvalue(), "train")
    assert states[0] == "5/12"
    assert states[-1] == "12/12"
    assert "train: 100%" in out.getvalue()
    assert not loader.interrupted


def test_monitor_without_end_has_no_total(clean_process):
    out = io.StringIO()
    loader = make_loader(start_at=(0, 2))
    assert loader.last_batch is None
    with loader, ProgressMonitor(loader, description="endless", file=out, mininterval=0, miniters=1) as monitor:
        for batch in loader:
            monitor.begin_batch(batch)
            monitor.end_batch(batch)
            if batch.batch_num == 6:
                loader.interrupt()
            del batch
    states = bar_states(out.getvalue(), "endless")
    assert states[0] == "2"
    assert states[-1] == "7"
    assert all("/" not in s for s in states)


def test_validation_bar_opens_and_closes(clean_process):
    out = io.StringIO()
    # 4 training batches per epoch, validation (3 batches of 2) after every epoch, 2 epochs.
    loader = make_loader(validation=("epoch", 1, 6), end_at=("epoch", 2))
    kinds = []
    live_bars = []
    with loader, ProgressMonitor(loader, file=out, mininterval=0, miniters=1, ascii=True) as monitor:
        for batch in loader:
            monitor.begin_batch(batch)
            kinds.append("V" if isinstance(batch, ValidationBatch) else "T")
            live_bars.append(len(tqdm_package.tqdm._instances))
            monitor.end_batch(batch)
            del batch
    assert kinds == list("TTTTVVVTTTTVVV")
    # The nested bar exists during validation only; a training batch closes it.
    assert live_bars == [1, 1, 1, 1, 2, 2, 2, 1, 1, 1, 1, 2, 2, 2]
    assert len(tqdm_package.tqdm._instances) == 0
    text = out.getvalue()
    assert bar_states(text, "validation")[-1] == "3/3"
    assert bar_states(text, "train")[-1] == "8/8"


def test_tbatches_shows_nested_validation_bar(clean_process):
    out = io.StringIO()
    loader = make_loader(validation=("batch", 2, 4), end_at=("batch", 4))
    kinds = [type(batch).__name__[0] for batch in tbatches(loader, file=out, mininterval=0, miniters=1)]
    assert kinds == list("TTVVTTVV")
    text = out.getvalue()
    assert "validation:" in text
    assert bar_states(text, "validation")[-1] == "2/2"
    assert bar_states(text, "train")[-1] == "4/4"
    assert len(tqdm_package.tqdm._instances) == 0


def test_report_interval_reports_running_behind(clean_process):
    out = io.StringIO()
    loader = make_loader(load_slow, items=12, batch_size=2, end_at=("epoch", 1))
    count = 0
    for batch in tbatches(loader, report_interval=2, file=out):
        count += 1
        del batch
    assert count == 6
    reports = re.findall(r"\[hydrax\]: running behind by (\d+)ms/batch", out.getvalue())
    assert reports, out.getvalue()
    assert all(int(ms) > 0 for ms in reports)


def test_dropped_batches_move_the_bar_and_are_reported(clean_process):
    out = io.StringIO()
    # Batch 1 holds items 3, 4, 5 (epoch 0 is not shuffled); item 5 fails, so batch 1 is dropped.
    loader = make_loader(load_failing, end_at=("epoch", 1))
    nums = [batch.batch_num for batch in tbatches(loader, report_interval=3, file=out, mininterval=0, miniters=1)]
    assert nums == [0, 2, 3]
    text = out.getvalue()
    assert "[hydrax]: dropped 1 batch(es) (25%)" in text
    assert bar_states(text, "train")[-1] == "4/4"


def test_monitor_counts_dropped_batches(clean_process):
    loader = make_loader(load_failing, end_at=("epoch", 1))
    with loader, ProgressMonitor(loader, file=io.StringIO()) as monitor:
        for batch in loader:
            monitor.begin_batch(batch)
            monitor.end_batch(batch)
            del batch
        assert monitor.dropped == 1


def test_tbatches_leaves_loader_on_early_break(clean_process):
    out = io.StringIO()
    loader = make_loader(end_at=("epoch", 10))
    for batch in tbatches(loader, file=out):
        stop = batch.batch_num == 2
        del batch
        if stop:
            break
    assert loader.interrupted
    with pytest.raises(RuntimeError, match="not running"):
        next(loader)
    assert len(tqdm_package.tqdm._instances) == 0


def test_tbatches_leaves_loader_on_explicit_close(clean_process):
    loader = make_loader(end_at=("epoch", 10))
    batches = tbatches(loader, file=io.StringIO())
    first = next(batches)
    assert first.batch_num == 0
    del first
    batches.close()
    assert loader.interrupted
    with pytest.raises(StopIteration):
        next(batches)


def test_tbatches_leaves_loader_on_consumer_exception(clean_process):
    loader = make_loader(end_at=("epoch", 10))
    with pytest.raises(ZeroDivisionError):
        for batch in tbatches(loader, file=io.StringIO()):
            if batch.batch_num == 1:
                _ = 1 / 0
            del batch
    assert loader.interrupted
    with pytest.raises(RuntimeError, match="not running"):
        next(loader)


def test_exception_thrown_into_tbatches_runs_exit_path(clean_process, caplog):
    loader = make_loader(end_at=("epoch", 10))
    batches = tbatches(loader, file=io.StringIO())
    next(batches)
    with pytest.raises(KeyError):
        batches.throw(KeyError("stop"))
    # logged to "hydrax.run.loader" (on stderr when a program sets up no logging; captured here)
    assert "[hydrax]: shutting down due to KeyError" in [r.getMessage() for r in caplog.records]
    assert loader.interrupted


def test_rejects_non_deterministic_loader(clean_process):
    loader = make_loader(deterministic=False)
    with pytest.raises(ValueError, match="^dataloader is not deterministic$"):
        ProgressMonitor(loader, file=io.StringIO())
    with pytest.raises(ValueError, match="^dataloader is not deterministic$"):
        tbatches(loader, file=io.StringIO())
    assert len(tqdm_package.tqdm._instances) == 0


"""Messages between the main process and its workers: fixed-size task records, named replies."""

import os
import pickle
import select
import struct

import pytest

from hydrax.procs.messages import TASK_BYTES, Completion, StartupReport, Task


def test_a_task_is_one_fixed_size_record_that_round_trips():
    task = Task(task_id=2**40, slot=3, group=1, epoch=2**33, group_index=7, first=5, end=9)
    record = task.pack()
    assert len(record) == TASK_BYTES <= select.PIPE_BUF  # a pipe write of it is atomic
    assert Task.unpack(record) == task and Task.unpack(record).epoch == 2**33


def test_records_interleave_whole_through_one_pipe():
    """Tasks from one writer reach readers whole: what lets every worker read one shared pipe."""
    read, write = os.pipe()
    try:
        tasks = [Task(i, i % 3, 0, 0, i, 0, 4) for i in range(200)]
        for task in tasks:
            os.write(write, task.pack())
        got = [Task.unpack(os.read(read, TASK_BYTES)) for _ in tasks]
    finally:
        os.close(read)
        os.close(write)
    assert got == tasks


def test_a_record_of_the_wrong_size_is_refused():
    with pytest.raises(struct.error):
        Task.unpack(b"\0" * (TASK_BYTES - 1))


def test_replies_are_named_tuples_that_pickle_by_name():
    done = Completion(4, True, [{"a": 1}, None], elapsed_ns=10, skipped=[(1, "why")])
    again = pickle.loads(pickle.dumps(done))
    assert again == done and again.task_id == 4 and again.extras == [{"a": 1}, None] and again.fatal is None
    failed = Completion(5, False, error="ValueError: x (item 3: 3)")
    assert (failed.ok, failed.extras, failed.skipped, failed.elapsed_ns) == (False, None, None, 0)
    report = pickle.loads(pickle.dumps(StartupReport("startup_func", "ValueError: no", "Traceback ...")))
    assert isinstance(report, StartupReport) and not isinstance(done, StartupReport)
    assert (report.stage, report.line, report.traceback) == ("startup_func", "ValueError: no", "Traceback ...")

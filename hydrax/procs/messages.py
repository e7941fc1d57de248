"""What the main process and its workers say to each other, as named tuples.

Three messages cross the process boundary in a run:

- :class:`Task` goes to the workers, packed into a fixed-size record (:data:`TASK_BYTES`) on one
  pipe that every worker reads: records that size are written and read whole (below
  ``PIPE_BUF``), so workers take tasks from the pipe without a lock and nothing is pickled.
- :class:`Completion` comes back, one per task, on the worker's own completion pipe.
- :class:`StartupReport` comes back instead when a worker cannot start.

Fields are read by name everywhere; a field added here is added in one place.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

_TASK = struct.Struct("<qiiqqii")
#: Bytes of one packed :class:`Task`.
TASK_BYTES = _TASK.size


class Task(NamedTuple):
    """Load positions ``[first, end)`` of batch ``group_index`` of group ``group`` in ``epoch``
    into slot ``slot``.

    ``group`` counts the run's groups, training first; a worker works out the items' indices and
    seeds from the group's plan itself.
    """

    task_id: int
    slot: int
    group: int
    epoch: int
    group_index: int
    first: int
    end: int

    def pack(self) -> bytes:
        """The task as a :data:`TASK_BYTES` record."""
        return _TASK.pack(*self)

    @classmethod
    def unpack(cls, record: bytes) -> Task:
        """The task of a record made by :meth:`pack`."""
        return cls._make(_TASK.unpack(record))


class Completion(NamedTuple):
    """What a worker reports when it has done a task.

    ``ok`` is False when an item failed and the batch must be dropped (``error`` says why, with
    the item; ``fatal`` holds the exception when the data cannot be read at all, which ends the
    run). ``extras`` holds, per position of the task, what ``loader_func`` returned (None where
    it returned nothing); ``skipped`` the ``(position, why)`` of items zero-filled under
    ``on_item_error="skip_item"``; ``elapsed_ns`` the time the task's items took.
    """

    task_id: int
    ok: bool
    extras: list[dict | None] | None = None
    error: str | None = None
    elapsed_ns: int = 0
    fatal: BaseException | None = None
    skipped: list[tuple[int, str]] | None = None


class StartupReport(NamedTuple):
    """Why a worker could not start, sent before it exits.

    ``stage`` is ``"unpickle"`` (what it was sent could not be unpickled) or ``"startup_func"``
    (the user's start-up hook raised); ``line`` is the last line of the error, ``traceback`` the
    whole of it.
    """

    stage: str
    line: str
    traceback: str


"""Telling what the workers are doing, and why one stopped: the words of worker errors.

Every worker keeps a heartbeat and the item it is loading in its line of the arena's status
page (see :mod:`hydrax.procs.arena`). From those, :class:`WorkerDiagnosis` finds a frozen worker,
says what each worker is loading (for :class:`~hydrax.BatchTimeoutError`), and builds the
:class:`~hydrax.WorkerError` of a worker that died, froze or could not start, naming the
process, the item and what to do.

A stale heartbeat alone proves nothing on a busy machine: a worker that is runnable but not
scheduled (other jobs hold the cores, a cgroup's CPU quota is spent) beats late. The heartbeat
thread runs without the GIL, so its beat stops only when the whole process stops running; the
kernel says which: :func:`process_activity` reads the worker's threads' states and CPU time from
``/proc``. A worker is frozen when it is stopped (SIGSTOP, a debugger, a frozen cgroup) and its
beat is :data:`HEARTBEAT_STALE_S` old, or, in any state but runnable, when it has used no CPU
time while its beat aged :data:`SILENT_LIMIT_S`. A runnable worker is never frozen.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Callable

from ..procs.forkserver import MAIN_IMPORT_FAILED
from ..procs.arena import Arena
from ..errors import WorkerError
from .inflight import InFlight
from ..procs.messages import StartupReport
from ..procs.workers import WorkerPool

#: A stopped worker whose heartbeat is older than this is frozen (its heartbeat thread runs
#: without the GIL, every ``workers.HEARTBEAT_PERIOD_US``).
HEARTBEAT_STALE_S = 0.75
#: A worker that is neither stopped nor runnable is frozen once its heartbeat is this old and it
#: used no CPU time meanwhile (a process that /proc cannot describe: once its beat is this old).
SILENT_LIMIT_S = 30.0
#: Thread states in /proc: running or runnable; stopped by a signal or by a tracer.
_RUNNABLE_STATES = frozenset("R")
_STOPPED_STATES = frozenset("Tt")


@dataclass(frozen=True)
class Activity:
    """What the kernel says of a process: whether any thread is running or waiting for a CPU,
    whether every thread is stopped, and its CPU time so far (clock ticks, all threads)."""

    runnable: bool
    stopped: bool
    cpu_ticks: int


def process_activity(pid: int) -> Activity | None:
    """The :class:`Activity` of process ``pid`` from ``/proc``, or None when it cannot be read
    (the process is gone, or this is not Linux)."""
    try:
        states = set()
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                states.add(_stat_fields(f"/proc/{pid}/task/{task}/stat")[0])
            except OSError:
                continue  # a thread that ended meanwhile
        fields = _stat_fields(f"/proc/{pid}/stat")
    except (OSError, IndexError, ValueError):
        return None
    # fields[0] is the state (field 3 of proc(5)); utime and stime are fields 14 and 15
    return Activity(bool(states & _RUNNABLE_STATES), bool(states) and states <= _STOPPED_STATES,
                    int(fields[11]) + int(fields[12]))


def _stat_fields(path: str) -> list[str]:
    with open(path) as f:
        # the command name (in parentheses) may hold spaces and parentheses: split after its end
        return f.read().rsplit(")", 1)[1].split()


class _Silence:
    """One worker's stale heartbeat ``beat``, and its CPU time ``cpu_ticks`` as last seen to
    change, at ``since`` (monotonic ns)."""

    def __init__(self, beat: int, cpu_ticks: int | None, since: int) -> None:
        self.beat = beat
        self.cpu_ticks = cpu_ticks
        self.since = since


@dataclass
class Loading:
    """What a worker is loading: item ``index`` (``item`` is its repr) at ``position`` of ``batch``."""

    index: int
    item: str
    kind: str  # "training" or "validation"
    group: int
    position: int
    batch: str  # describe_step of its batch
    seconds: float

    def words(self) -> str:
        """What the worker is loading, in words (for errors and timeouts)."""
        return (f"item {self.index} ({self.item}) of {self.kind} group {self.group}, position {self.position} of "
                f"{self.batch}, for {self.seconds:.1f} s")


class WorkerDiagnosis:
    """Reads the workers' status lines and completion pipes to say what they are doing.

    :param locate: the batch a task id belongs to (None once it is done).
    """

    def __init__(self, arena: Arena, pool: WorkerPool, locate: Callable[[int], InFlight | None]) -> None:
        self._arena = arena
        self._pool = pool
        self._locate = locate
        self._silences: dict[int, _Silence] = {}

    def frozen_worker(self) -> tuple[int, float, str] | None:
        """A frozen worker: its number, how many seconds its heartbeat is old, and why it is
        judged frozen (words); or None. Only stale heartbeats lead to a look at /proc."""
        now = time.monotonic_ns()
        for i, process in enumerate(self._pool.processes):
            beat = self._arena.heartbeat(i)
            if not beat or now - beat <= HEARTBEAT_STALE_S * 1e9 or not process.is_alive():
                self._silences.pop(i, None)
                continue
            why = self._judge(i, beat, (now - beat) / 1e9, process_activity(process.pid))
            if why is not None:
                return i, (now - beat) / 1e9, why
        return None

    def _judge(self, worker: int, beat: int, stale_s: float, activity: Activity | None) -> str | None:
        """Why worker ``worker``, whose heartbeat ``beat`` is ``stale_s`` old, is frozen, or None
        while it may still be alive."""
        now = time.monotonic_ns()
        ticks = None if activity is None else activity.cpu_ticks
        silence = self._silences.get(worker)
        if silence is None or silence.beat != beat or silence.cpu_ticks != ticks:
            # a new silence, or CPU time used since the last look: it ran, so count from now
            silence = self._silences[worker] = _Silence(beat, ticks, now)
        if activity is not None and activity.runnable:
            return None  # waiting for a CPU, or using one: late, not frozen
        if activity is not None and activity.stopped:
            return "it is stopped (by a signal or a debugger)"
        if activity is None:
            return "the system cannot say what it is doing" if stale_s > SILENT_LIMIT_S else None
        if now - silence.since > SILENT_LIMIT_S * 1e9:
            return f"it used no CPU time for {(now - silence.since) / 1e9:.1f} s"
        return None

    def current_item(self, worker: int) -> Loading | None:
        """What worker ``worker`` is loading, or None when it is idle."""
        task, position, started = self._arena.current_item(worker)
        record = self._locate(task)
        if record is None or position < 0:
            return None
        index = record.indices[position]
        try:
            item = repr(record.group.group[index])
        except Exception as exc:
            item = f"<unavailable: {exc!r}>"
        if len(item) > 200:
            item = item[:197] + "..."
        seconds = (time.monotonic_ns() - started) / 1e9
        return Loading(index, item, record.group.kind, record.group.number, position, record.words(), seconds)

    def describe_workers(self, all_slots_held: bool = False) -> str:
        """One line per worker: alive or not, and what it is loading; and, with ``all_slots_held``,
        that the training loop holds every slot."""
        lines = []
        if all_slots_held:
            lines.append(
                f"  all {self._arena.depth} batch slots are held by batches still referenced "
                "(hydrax.debug_batch_references() shows by what); release batches, or raise depth"
            )
        for i, process in enumerate(self._pool.processes):
            loading = self.current_item(i)
            doing = "idle" if loading is None else loading.words()
            state = "alive" if process.is_alive() else f"exited ({process.exitcode})"
            lines.append(f"  {process.name} (pid {process.pid}, {state}): {doing}")
        return "\n".join(lines)

    def startup_report(self, worker: int) -> StartupReport | None:
        """The report of a worker that could not start, if it sent one (it does before it exits)."""
        connection = self._pool.connections[worker]
        try:
            while connection.poll(0):
                message = connection.recv()
                if isinstance(message, StartupReport):
                    return message
        except (EOFError, OSError):
            pass
        return None

    def worker_error(self, worker: int, what: str, report: StartupReport | None = None) -> WorkerError:
        """The error that ends the run because worker ``worker`` ``what`` (exited, failed, stopped
        responding): how it ended, and what it was doing then."""
        process = self._pool.processes[worker]
        process.join(0.05)
        code = process.exitcode
        how, killed_by = _how_it_ended(code, what)
        if report is None:
            report = self.startup_report(worker)
        loading = self.current_item(worker)
        if report is not None:
            where = "during start-up: " + startup_failure_words(report)
        elif loading is not None:
            where = f"while loading {loading.words()}"
        elif not self._arena.heartbeat(worker):
            where = "during start-up, before it could say why (its output, if any, is above)"
        else:
            where = "while idle"
        return WorkerError(
            f"loader process {process.name} (pid {process.pid}) {how} {where}",
            process_name=process.name, pid=process.pid, exitcode=code, signal=killed_by,
            item=None if loading is None else loading.item, batch=None if loading is None else loading.batch,
            traceback=None if report is None else report.traceback,
        )


def _how_it_ended(code: int | None, what: str) -> tuple[str, str | None]:
    """How a process with exit code ``code`` ended, in words, and the name of the signal that killed it."""
    if code is None:
        return what, None
    if code >= 0:
        return f"exited with status {code}", None
    try:
        name = signal.Signals(-code).name
    except ValueError:
        return f"was killed by signal {-code}", None
    return f"was killed by {name}", name


def startup_failure_words(report: StartupReport) -> str:
    """What a worker's start-up failure report says, with what to do about it, and its traceback."""
    if report.stage == "startup_func":
        words = f"startup_func raised {report.line}"
    else:
        words = f"it could not unpickle what it runs (loader_func, startup_func and the groups' data): {report.line}"
        if MAIN_IMPORT_FAILED in report.traceback:
            words += (
                ". Something it was sent refers to the main module by name, so the worker imported that module, "
                "and its top level failed there: keep the training code under `if __name__ == \"__main__\":`"
            )
        elif any(kind in report.line for kind in ("ModuleNotFoundError", "ImportError", "AttributeError")):
            words += (
                ". A worker started from the fork server (JAX is already initialised here) receives functions and "
                "classes of the main script by value, but those of other modules by name: such a module must be "
                "importable in a new process with this process's sys.path (a module loaded from a file path is not); "
                "move the function into an importable module or into the main script"
            )
    indented = "\n".join("    " + row for row in report.traceback.rstrip().splitlines())
    return f"{words}\n  the worker's traceback:\n{indented}"

"""Workers without a pipeline: a real arena and worker pool driven by hand with task records.

``test_workers.py`` and ``test_diagnosis.py`` use it to test the worker protocol (tasks in,
completions and start-up reports out) and the diagnosis of workers, without the Dataloader.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Callable

import jax.numpy as jnp
import numpy as np

from hydrax import DataGroup
from hydrax.procs.arena import Arena
from hydrax.run.inflight import InFlight
from hydrax.procs.messages import Task
from hydrax.procs.processes import start_method
from hydrax.run.plan import RunGroups, RunPolicy, plan_run
from hydrax.order.schedule import Plan, iter_steps
from hydrax.procs.workers import GroupSpec, WorkerConfig, WorkerPool

ARRAYS = {"item": ((), np.int32, jnp.int32), "seed": ((), np.int32, jnp.int32)}


def plan_training(group: DataGroup, *, epochs: int = 1, policy: RunPolicy | None = None) -> tuple[Plan, RunGroups]:
    """The schedule and groups of a run of ``epochs`` epochs over the one training ``group``."""
    return plan_run([group], [], policy or RunPolicy(), validation_mode=None, validation_interval=1, start_at=(0, 0),
                    end_at=("epoch", epochs), interleave=True)


@dataclass
class Bench:
    arena: Arena
    pool: WorkerPool
    groups: RunGroups
    steps: list

    def task(self, task_id: int, step: int = 0, slot: int = 0, first: int = 0, end: int | None = None) -> Task:
        """The task of positions ``[first, end)`` of the ``step``-th batch of the schedule, its
        batch's items listed for ``slot`` as the pipeline lists them."""
        s = self.steps[step]
        run = self.groups.of(s)
        end = run.plan.local_batch_size if end is None else end
        self.arena.write_items(slot, run.items(s))
        return Task(task_id, slot, run.index, run.epoch_of(s), s.group_index, first, end)

    def record(self, task_id: int, step: int = 0, slot: int = 0) -> InFlight:
        s = self.steps[step]
        run = self.groups.of(s)
        return InFlight(task_id, s, run, slot, run.items(s), 1)

    def slot(self, slot: int = 0) -> dict[str, np.ndarray]:
        """The arrays of the first training group's batch in ``slot``, as they are now."""
        layout = self.groups.training[0].layout
        start = self.arena.slot_offsets[slot]
        return {name: np.frombuffer(self.arena.map, dtype=lay.dtype, count=lay.count, offset=start + lay.offset).copy()
                for name, lay in layout.arrays.items()}

    def receive(self, worker: int = 0, timeout: float = 30.0) -> Any:
        """The next message worker ``worker`` sends (a Completion or a StartupReport)."""
        connection = self.pool.connections[worker]
        if not connection.poll(timeout):
            raise TimeoutError(f"no message from worker {worker} in {timeout} s")
        return connection.recv()


@contextlib.contextmanager
def workbench(loader: Callable, *, workers: int = 1, method: str | None = None, startup: Callable | None = None,
              skip_failed_items: bool = False, data: Any = range(8), batch_size: int = 4, queued: int = 0):
    """A started pool of ``workers`` over one training group of ``data``; ``queued`` tasks (of the
    first batches, one each) are queued before the workers start. ``method``: how the workers
    start (default: as a run would, see :func:`hydrax.procs.processes.start_method`)."""
    group = DataGroup(batch_size, data, loader_arrays=ARRAYS, seed=7)
    schedule, groups = plan_training(group, epochs=2)
    arena = Arena(2, groups.training[0].layout.size, workers, items=batch_size)
    config = WorkerConfig(loader, startup, 0, [GroupSpec(run.group.data, run.plan, run.layout.item_places(), run.training)
                                               for run in groups], arena.spec(), skip_failed_items=skip_failed_items)
    pool = WorkerPool(method or start_method())
    bench = Bench(arena, pool, groups, list(iter_steps(schedule)))
    try:
        for i in range(queued):
            pool.submit(bench.task(i + 1, step=i, slot=i % 2))
        pool.start(workers, config, arena.handle())
        arena.close_fd()
        yield bench
    finally:
        arena.stop_workers(len(pool.processes))
        pool.close(grace=0.5)
        arena.close()


def wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the condition did not come true in time")
        time.sleep(0.01)


def make_engine(loader: Callable, policy=None, *, data: Any = range(8), batch_size: int = 2, epochs: int = 1, **group: Any):
    """An :class:`~hydrax.run.engine.Engine` (not started) over one training group of ``data``."""
    from hydrax.run.engine import Engine, RunFunctions
    from hydrax.run.plan import with_cachers

    policy = policy or RunPolicy(loader_count=2)
    schedule, groups = plan_training(DataGroup(batch_size, data, loader_arrays=ARRAYS, **group), epochs=epochs, policy=policy)
    return Engine(schedule, groups, with_cachers(policy, groups), RunFunctions(loader))


def drain(engine, timeout: float = 30.0) -> list:
    """Everything the engine's pipeline queues until its end or first failure, with batches
    (placed if they came :class:`~hydrax.run.pipeline.Ready`) as their ``item`` lists."""
    from hydrax.run.pipeline import End, Failure, Ready

    out = []
    while True:
        item = engine.pipeline.output.get(timeout=timeout)
        if isinstance(item, (End, Failure)):
            return out + [item]
        batch = engine.pipeline.place(item) if isinstance(item, Ready) else item
        out.append(np.asarray(batch.arrays["item"]).tolist())
        del batch

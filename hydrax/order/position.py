"""Where the training loop stands in a run, worked out from the last batch it received.

A :class:`~hydrax.checkpoint.LoaderState` records the next training batch the loop has not had
and the validation batch it stopped inside, if any. The Dataloader notes each batch it hands out
(one assignment); the position is worked out from the schedule only when a state is asked for,
so following the loop costs nothing per batch. Pure: a function of the plan and the batches
delivered, tested without processes.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

from .schedule import Plan, Step, TrainingStep, ValidationStep, iter_steps


class LoopPosition:
    """Where the training loop stands in a run: after the last batch the Dataloader handed it.

    :meth:`delivered` is all the Dataloader does per batch (it notes which batch it was);
    :meth:`current` works out the position from the schedule when asked. After a training batch
    that is the next one, and whether the validation run after it is due; after a validation
    batch, the training batch before its run is found by walking the schedule (batches dropped
    by ``on_item_error="drop_batch"`` are in the schedule, but never delivered), from where the
    last walk stopped, so the walks of a whole run add up to one pass over it.

    :param plan: the run's plan (its ``stream`` is ignored).
    :param pending: the validation batch a resumed run starts with, or None.
    """

    def __init__(self, plan: Plan, pending: int | None = None) -> None:
        self._plan = dataclasses.replace(plan, stream=None)
        self._start = (plan.first_batch + (pending is not None), pending)
        self._last: tuple[int, ...] | None = None
        self._known: tuple[tuple[int, ...] | None, tuple[int, int | None]] = (None, self._start)
        self._walk: Iterator[Step] | None = None
        self._ahead: list[Step] = []
        self._walked = -1  # the last training batch the walk passed

    def delivered(self, batch: Any) -> None:
        """The loop has received ``batch`` (a :class:`~hydrax.Batch`)."""
        self._last = (batch.batch_num,) if batch.is_training else (batch.validation_epoch, batch.validation_epoch_batch)

    def current(self) -> tuple[int, int | None]:
        """``(number of the next training batch, validation batch pending or None)``."""
        last = self._last
        if self._known[0] != last:
            if len(last) == 1:
                position = (last[0] + 1, 0 if self._validation_follows(last[0]) else None)
            else:
                position = self._after_validation(*last)
            self._known = (last, position)
        return self._known[1]

    def _validation_follows(self, batch_num: int) -> bool:
        plan = self._plan
        if not plan.validation_mode:
            return False
        bpe = plan.batches_per_epoch
        steps = iter_steps(dataclasses.replace(plan, start=(batch_num // bpe, batch_num % bpe)))
        next(steps, None)  # the training batch itself
        return isinstance(next(steps, None), ValidationStep)

    def _after_validation(self, run: int, batch: int) -> tuple[int, int | None]:
        if self._walk is None:
            self._walk = iter_steps(self._plan)
        while True:
            step = self._step()
            if step is None:
                raise RuntimeError(f"hydrax: validation batch {batch} of run {run} is not in the run's schedule")
            if isinstance(step, TrainingStep):
                self._walked = step.batch_num
            elif (step.validation_epoch, step.validation_epoch_batch) == (run, batch):
                break
        following = self._step()
        if following is not None:
            self._ahead.append(following)
        same_run = isinstance(following, ValidationStep) and following.validation_epoch == run
        return self._walked + 1, following.validation_epoch_batch if same_run else None

    def _step(self) -> Step | None:
        if self._ahead:
            return self._ahead.pop()
        return next(self._walk, None)

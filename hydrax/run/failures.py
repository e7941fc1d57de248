"""What a run loses, and when losing ends it: the failure budget.

An item whose ``loader_func`` raises fails its batch (``on_item_error="drop_batch"``, the
default, as in hydrax 0.2.2), is zero-filled (``"skip_item"``), or ends the run (``"raise"``).
:class:`FailureBudget` counts the dropped batches and failed items, and turns a loss into a
:class:`~hydrax.BatchFailedError` when the run must not go on: when it never drops a batch
(several processes, a sharding, a stream share), after ``max_consecutive_failures`` failed
batches in a row, or when not one batch of the run came through. Whatever fails every item (a
wrong field name, a store that is down, revoked access) would otherwise end the run quietly.
"""

from __future__ import annotations

from ..errors import BatchFailedError
from .hosts import HostAgreement
from .inflight import InFlight
from ..procs.messages import Completion
from .plan import RunPolicy


class FailureBudget:
    """Counts what a run lost and decides when that ends it.

    :param agreement: the other processes of a multi-process run, told of a failure at once.
    """

    def __init__(self, policy: RunPolicy, agreement: HostAgreement | None = None) -> None:
        self._policy = policy
        self._agreement = agreement
        self._in_a_row = 0
        #: Batches dropped because an item failed, and items whose loading failed, so far.
        self.dropped_batches = 0
        self.failed_items = 0
        #: The last item error, in words.
        self.last_error: str | None = None

    def count_items(self, completion: Completion) -> None:
        """Count the failed and skipped items of a task."""
        if not completion.ok:
            self.failed_items += 1
            self.last_error = completion.error
        if completion.skipped:
            self.failed_items += len(completion.skipped)

    def drop(self, record: InFlight) -> BatchFailedError | None:
        """Count ``record``'s batch as dropped; the error that ends the run instead, when dropping is not allowed."""
        self.dropped_batches += 1
        if self._policy.never_drop or self._policy.on_item_error == "raise":
            return self.failure(record, record.error)
        return None

    def judge(self, record: InFlight, ending: bool = False) -> BatchFailedError | None:
        """Count ``record``'s batch in delivery order; the error that ends the run when it is one
        failed batch too many in a row (None when the batch ends the run anyway: ``ending``)."""
        failed = record.failed
        self._in_a_row = self._in_a_row + 1 if failed else 0
        budget = self._policy.max_consecutive_failures
        if ending or not failed or budget is None or self._in_a_row < budget:
            return None
        reason = record.error or next(iter(record.skipped.values()))
        return self.failure(
            record, f"{self._in_a_row} batches in a row failed to load (max_consecutive_failures="
            f"{budget}); the last error: {reason}. Whatever fails every item (a wrong field name, a store "
            "that is down, revoked access) would otherwise drop the whole run quietly",
        )

    def every_batch_failed(self, batches: int) -> BatchFailedError | None:
        """At the end of a run of ``batches`` batches: the error to raise when every one of them was
        dropped (too short a run for the budget, and not one batch came through)."""
        if self._policy.max_consecutive_failures is None or not self.dropped_batches or self.dropped_batches != batches:
            return None
        return BatchFailedError(
            f"every one of the {self.dropped_batches} batches of the run failed to load; the last error: "
            f"{self.last_error}", batch="every batch", process_index=self._policy.process_index, reason=self.last_error or "",
        )

    def failure(self, record: InFlight, reason: str, cause: BaseException | None = None) -> BatchFailedError:
        """The error that ends the run at ``record``'s batch; the other processes hear of it."""
        batch = record.words()
        if self._agreement is not None:
            self._agreement.fail(record.seq, batch, reason)
        why = (". A run whose batches are split over processes or placed with a sharding never drops a batch, so it "
               "stops here") if self._policy.never_drop else ""
        index = self._policy.process_index
        error = BatchFailedError(f"{batch} could not be loaded or placed on process {index}: {reason}{why}",
                                 batch=batch, process_index=index, reason=reason)
        error.__cause__ = cause
        return error

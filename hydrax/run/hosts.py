"""Agreement between the processes of a multi-process run: no process hands out a batch that
another cannot deliver.

When several processes split every batch, process ``p``'s step ``k`` only makes sense next to
every other process's step ``k``. If one process fails to load its share, the others must not go
on with that step, or pair it with the next (which a dropped batch would do), or wait forever in
a collective. So every process publishes, through the key-value store of ``jax.distributed``,
how many batches it has loaded (in schedule order) and any failure; before handing out batch
``k`` a process checks that every other process has loaded it too. Progress is published and
read by one background thread, so a run whose processes keep up never waits on a round trip.

In a run with an explicit-mode cache, each count carries which of the last batches were handed
out cached: a group with both loader and cache arrays hands out a batch either loaded (uncached,
for the loop to transform and ``cache``) or cached, and a step that is cached on one process but
not on another would send the processes down different code paths, into different collectives.
That is refused, like a failure.

Without ``jax.distributed`` (process counts given by hand) there is nothing to agree through:
each process still raises instead of dropping, and the others notice at their next collective.

Which process this is, and of how many, comes from JAX (:func:`jax_process_split`).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from typing import Any, Callable

from ..errors import BatchFailedError, BatchTimeoutError
from ..procs.processes import jax_backend_live

log = logging.getLogger("hydrax.run.hosts")

#: How often the progress of the other processes is read while this one waits for them, and
#: while it does not (seconds).
_POLL_WAITING_S = 0.002
_POLL_IDLE_S = 0.05
_PREFIX = "hydrax/agreement"
#: How many of its latest batches' forms (cached or loaded) a process publishes with its count:
#: far more than any process can be ahead of another (its depth, plus one).
FORM_WINDOW = 1024

_runs = 0
_runs_lock = threading.Lock()


def distributed_client() -> Any | None:
    """The ``jax.distributed`` client of this process, or None when it has not been initialised."""
    if "jax" not in sys.modules:
        return None
    try:
        from jax._src import distributed
    except ImportError:  # pragma: no cover - a JAX without that module
        return None
    return getattr(distributed.global_state, "client", None)


def jax_process_split() -> tuple[int, int]:
    """``(process_index, process_count)`` of this JAX process, without starting a JAX backend.

    From JAX when a backend is live or ``jax.distributed.initialize`` has run; otherwise
    ``(0, 1)``. Starting a backend here would cost the loader its fast fork start.
    """
    jax = sys.modules.get("jax")
    if jax is None:
        return 0, 1
    if jax_backend_live():
        return jax.process_index(), jax.process_count()
    client = distributed_client()
    if client is None:
        return 0, 1
    from jax._src import distributed

    state = distributed.global_state
    return int(state.process_id), int(state.num_processes)


def _next_run() -> int:
    # Every process creates its multi-process Dataloaders in the same order (the program is the
    # same everywhere), so the n-th one agrees with the other processes' n-th one.
    global _runs
    with _runs_lock:
        _runs += 1
        return _runs


class HostAgreement:
    """One Dataloader run's agreement with the other ``process_count - 1`` processes.

    Batches are numbered by their place in the run's schedule (``seq``, validation included),
    which is the same on every process.

    :param client: the ``jax.distributed`` client (see :func:`distributed_client`).
    :param compare_forms: also check that every process hands each batch out in the same form
        (cached or not): for runs with an explicit-mode cache.
    """

    def __init__(self, client: Any, process_index: int, process_count: int, compare_forms: bool = False) -> None:
        self.client = client
        self.process_index = process_index
        self.process_count = process_count
        self.prefix = f"{_PREFIX}/{_next_run()}"
        self._loaded = 0  # batches this process has loaded, in order
        # (start, forms): "1" (from the cache) or "0" for each batch from seq ``start`` on; one
        # attribute, so that the publishing thread reads both at once
        self._form_window: tuple[int, str] = (0, "")
        self._compare_forms = compare_forms
        self._published = -1
        self._peers = {p: 0 for p in range(process_count) if p != process_index}
        self._peer_forms: dict[int, tuple[int, str]] = {}
        self._failures: dict[int, dict] = {}
        self._waiting = threading.Event()
        self._wake = threading.Event()
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="hydrax-agreement", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Publish the final progress and end the thread."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()
        try:
            self._publish()
        except Exception as exc:  # the coordination service may be gone with a failed peer
            log.debug("final progress not published: %r", exc)

    # -- this process ----------------------------------------------------------------------
    def loaded(self, count: int, cached: bool = False) -> None:
        """This process has loaded its share of the first ``count`` batches, the last of them from
        an on-disk cache if ``cached`` (called in order, from one thread)."""
        if self._compare_forms:
            start, forms = self._form_window
            forms += "1" if cached else "0"
            if len(forms) > FORM_WINDOW:
                start, forms = start + len(forms) - FORM_WINDOW, forms[-FORM_WINDOW:]
            self._form_window = (start, forms)
        self._loaded = count
        self._wake.set()  # another process may be waiting for exactly this batch

    def fail(self, seq: int, batch: str, reason: str) -> None:
        """This process cannot deliver batch ``seq`` (``batch`` in words): tell the others at once."""
        record = json.dumps({"seq": seq, "batch": batch, "reason": reason})
        try:
            self.client.key_value_set(f"{self.prefix}/failed/{self.process_index}", record, allow_overwrite=True)
        except Exception as exc:
            log.warning("could not tell the other processes of the failure: %r", exc)

    # -- the others ------------------------------------------------------------------------
    def wait_for(self, seq: int, batch: Callable[[], str], timeout: float) -> None:
        """Return once every other process has loaded batch ``seq`` (``batch()`` says it in words); raise
        :class:`BatchFailedError` when one failed at or before it, and :class:`BatchTimeoutError`
        after ``timeout`` seconds."""
        if self._ready(seq):
            return
        deadline = time.monotonic() + timeout
        self._waiting.set()
        self._wake.set()
        try:
            with self._changed:
                while not self._ready(seq):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        behind = {p: n for p, n in self._peers.items() if n <= seq}
                        raise BatchTimeoutError(
                            f"{batch()} is loaded here (process {self.process_index}), but after {timeout:.0f} s "
                            + ", ".join(f"process {p} has loaded only {n} batches" for p, n in sorted(behind.items()))
                            + ": it may have died or be stuck (see its own output); this process stops rather than "
                            "wait forever"
                        )
                    self._changed.wait(min(left, 0.1))
        finally:
            self._waiting.clear()

    def _ready(self, seq: int) -> bool:
        if self._error is not None:
            raise self._error
        for process, failure in sorted(self._failures.items()):
            if failure["seq"] <= seq:
                raise BatchFailedError(
                    f"process {process} could not deliver {failure['batch']}: {failure['reason']}. Every process "
                    "stops at this batch, so that no step pairs different batches",
                    batch=failure["batch"], process_index=process, reason=failure["reason"],
                )
        if not all(n > seq for n in self._peers.values()):
            return False
        mine = self._form(*self._form_window, seq)
        for process, (start, forms) in sorted(self._peer_forms.items()):
            theirs = self._form(start, forms, seq)
            if mine is not None and theirs is not None and theirs != mine:
                cached, loaded = (process, self.process_index) if theirs else (self.process_index, process)
                reason = (f"process {cached} has it in its share of the on-disk cache and process {loaded} does not, so "
                          "one would hand it out cached and the other uncached. Every process must hold the same "
                          "batches in its share (share-<i>-of-<n>/): one stopped before writing them all, or files were "
                          "removed; remove the shares (or the whole cache) to fill it afresh")
                raise BatchFailedError(f"the processes disagree on batch {seq} of the run (counting validation batches): "
                                       + reason, batch=f"batch {seq} of the run", process_index=loaded, reason=reason)
        return True

    @staticmethod
    def _form(start: int, forms: str, seq: int) -> bool | None:
        """Whether batch ``seq`` came from the cache, if ``forms`` (from ``start``) still says."""
        return forms[seq - start] == "1" if start <= seq < start + len(forms) else None

    # -- the thread ------------------------------------------------------------------------
    def _publish(self) -> None:
        loaded = self._loaded
        start, forms = self._form_window  # read after the count: it covers every batch counted
        if loaded != self._published:
            progress = {"n": loaded}
            if self._compare_forms:
                progress.update(start=start, forms=forms[: max(0, loaded - start)])
            value = json.dumps(progress)
            self.client.key_value_set(f"{self.prefix}/loaded/{self.process_index}", value, allow_overwrite=True)
            self._published = loaded

    def _read(self) -> None:
        peers, failures, forms = dict(self._peers), dict(self._failures), dict(self._peer_forms)
        for key, value in self.client.key_value_dir_get(self.prefix + "/"):
            kind, _, process = key[len(self.prefix) + 1 :].partition("/")
            p = int(process)
            if p == self.process_index:
                continue
            if kind == "loaded":
                progress = json.loads(value)
                if progress["n"] >= peers.get(p, 0):
                    peers[p] = progress["n"]
                    if "forms" in progress:
                        forms[p] = (progress["start"], progress["forms"])
            elif kind == "failed":
                failures[p] = json.loads(value)
        with self._changed:
            self._peers, self._failures, self._peer_forms = peers, failures, forms
            self._changed.notify_all()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._wake.clear()
                self._publish()
                self._read()
                self._wake.wait(_POLL_WAITING_S if self._waiting.is_set() else _POLL_IDLE_S)
        except Exception as exc:
            self._error = BatchFailedError(
                f"lost contact with the other processes through jax.distributed: {exc!r}", process_index=self.process_index, reason=repr(exc)
            )
            with self._changed:
                self._changed.notify_all()

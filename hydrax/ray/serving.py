"""Producers on a Ray cluster feeding one trainer: :func:`serve_on_ray`.

Each producer is a Ray actor that builds its own :class:`hydrax.Dataloader` from the user's
``make_loader`` and serves one share of the run in reliable mode (:func:`hydrax.serve.serve` with
``share=(k, n)``). The trainer's :class:`Source` is a :class:`hydrax.serve.Collector` bound on the
trainer's node, at a port the system chooses; the producers learn its address from their
constructor arguments, so no port is ever written down.

Failures are Ray's to repair and the collector's to make invisible: an actor that dies is
restarted by Ray (``max_restarts``), which runs its ``run`` task again (``max_task_retries``); the
new producer says hello, is welcomed at the first batch of its share the collector lacks, and
the trainer sees every batch once, in the local run's order. Producers on the trainer's node send
through shared memory (``shared_memory``), found out by the collector, not by Ray's placement.
An actor Ray cannot restart, or a
producer whose loader fails, ends the trainer's iteration with a :class:`~hydrax.errors.ServeError`
naming the share, within about a second.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, Iterator

from ..run.arguments import LOADERS_PER_CPU, MIN_LOADER_LIMIT
from ..errors import ServeArgumentError, ServeArgumentTypeError, ServeError
from ..serve import Collector, Message, ServeReport, serve
from .runtime import import_ray

log = logging.getLogger(__name__)

#: How often (seconds) a waiting trainer asks Ray whether a producer has ended.
WATCH_SECONDS = 0.5


def _set_niceness(nice: int | None) -> None:
    """Run this thread (and the threads and loader processes it starts) at ``nice``.

    Ray starts its workers at niceness 15 (``RAY_worker_niceness``), so producers on the
    trainer's node got the CPU only when the trainer left it: 0.81x the MB/s of the same
    producers started as plain processes, in tools/bench/bench_ray.py on 2 cores.
    """
    if nice is None:
        return
    current = os.getpriority(os.PRIO_PROCESS, 0)
    if current == nice:
        return
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)  # Linux: this thread; what it starts inherits it
    except OSError as exc:
        log.warning("[hydrax] a producer stays at Ray's niceness %d, not %d (%s): start Ray with RAY_worker_niceness=%d, "
                    "or give serve_on_ray nice=None to accept it", current, nice, exc.strerror or exc, nice)


class Producer:
    """One share's producer; :func:`serve_on_ray` runs it as a Ray actor.

    Its state is only its arguments, so that a restarted actor (Ray calls the constructor again
    with them) serves the same share: the collector tells it where to resume.
    """

    def __init__(self, make_loader: Callable[..., Any], url: str, share: tuple[int, int], start_at: tuple[int, int] | None,
                 options: dict[str, Any]) -> None:
        self.make_loader = make_loader
        self.url = url
        self.share = share
        self.start_at = start_at
        self.options = options

    def run(self) -> ServeReport:
        """Build the Dataloader and serve this share to its end."""
        options = dict(self.options)
        _set_niceness(options.pop("nice", None))
        loader = self.make_loader() if self.start_at is None else self.make_loader(start_at=self.start_at)
        return serve(loader, self.url, share=self.share, **options)


class Source:
    """The trainer's end of :func:`serve_on_ray`: iterate it for the run's batches, each once.

    Iterating yields :class:`hydrax.serve.Message` objects in the local run's order: ``arrays``
    (numpy arrays over the received frames, in ``infos`` order), ``epoch``, ``batch``, ``items``
    and, for a validation batch, ``fields["validation"]``. Use it as a context manager (or call
    :meth:`close`): leaving stops the producers' actors.
    """

    def __init__(self, collector: Collector, actors: list, runs: list, start_at: tuple[int, int] | None) -> None:
        self.collector = collector
        #: the producers' actor handles, by share
        self.actors = actors
        self._runs = runs
        self._checked = 0.0
        self._reports: list[ServeReport] | None = None
        #: ``(epoch, batch)`` of the training batch after the last one handed out: give it to
        #: :func:`serve_on_ray` as ``start_at`` to resume there
        self.next_start = start_at if start_at is not None else (0, 0)
        collector.watch = self._watch

    @property
    def restarts(self) -> int:
        """How many times a share's producer was replaced (an actor Ray restarted) and resumed."""
        return self.collector.rejoined

    def _watch(self) -> None:
        now = time.monotonic()
        if now - self._checked < WATCH_SECONDS:
            return
        self._checked = now
        ray = import_ray()
        done, _ = ray.wait(self._runs, num_returns=len(self._runs), timeout=0)
        for ref in done:
            share = self._runs.index(ref)
            try:
                ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - Ray's errors, and the producer's own, come here
                raise ServeError(f"the producer of share {share} of {len(self._runs)} on Ray failed and was not restarted: "
                                 f"{type(exc).__name__}: {exc}", url=self.collector.addresses[0]) from exc

    def __iter__(self) -> Iterator[Message]:
        for message in self.collector.messages():
            if not message.fields.get("validation") and message.batch is not None:
                self.next_start = (message.epoch, message.batch + 1)
            yield message
        self._reports = import_ray().get(self._runs)

    @property
    def reports(self) -> list[ServeReport] | None:
        """Each share's :class:`~hydrax.serve.ServeReport` once the run has ended, else None."""
        return self._reports

    def close(self) -> None:
        """Stop the producers' actors (for good) and close the collector."""
        ray = import_ray()
        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - an actor already gone
                log.debug("could not kill a producer actor", exc_info=True)
        self.collector.close()

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_producer_type(producers: Any) -> None:
    """Refuse a ``producers`` that is not an int (a bool, a float) before Ray is touched."""
    if isinstance(producers, bool) or not hasattr(producers, "__index__"):
        raise ServeArgumentTypeError(f"producers must be an int (how many producer actors), got {producers!r}",
                                     argument="producers", value=producers)


def check_producers(producers: Any, cluster_cpus: float) -> int:
    """``producers`` as an int, refused unless it is from 1 to what a cluster of ``cluster_cpus``
    CPUs can run.

    Every actor handle is made before :func:`serve_on_ray` returns, so a number no cluster can
    run (``10**6``) would hold the call for minutes, out of reach of ``timeout``, which only the
    returned :class:`Source` applies. The bound is the one a Dataloader's ``loader_count`` has on
    one machine (:data:`hydrax.run.arguments.LOADERS_PER_CPU` per CPU, at least
    :data:`hydrax.run.arguments.MIN_LOADER_LIMIT`): producers waiting on storage may outnumber the
    CPUs, but not by more than that.
    """
    check_producer_type(producers)
    count = int(producers)
    if count < 1:
        raise ServeArgumentError(f"producers must be at least 1 (how many producer actors), got {count}",
                                 argument="producers", value=producers)
    cpus = int(cluster_cpus)
    limit = max(MIN_LOADER_LIMIT, LOADERS_PER_CPU * cpus)
    if count > limit:
        raise ServeArgumentError(
            f"producers is {count}, more producer actors than this Ray cluster can run: at most {limit} ({LOADERS_PER_CPU} "
            f"per CPU of the cluster, {cpus} now, and never fewer than {MIN_LOADER_LIMIT}); a few per CPU is usually "
            "enough, and each producer's Dataloader can use several loader processes (loader_count)",
            argument="producers", value=producers, limit=limit)
    return count


def serve_on_ray(make_loader: Callable[..., Any], url: str | None = None, *, producers: int, num_cpus: float = 1,
                 resources: dict[str, float] | None = None, max_restarts: int = -1, start_at: tuple[int, int] | None = None,
                 fingerprint: str = "", timeout: float | None = 60.0, credit: int = 4, arrays: list[str] | None = None,
                 items: bool = True, nice: int | None = 0, shared_memory: int | bool | None = True) -> Source:
    """Start ``producers`` Ray actors that serve one run to this process; returns its :class:`Source`.

    Call it on the trainer, after ``ray.init(...)`` (it calls ``ray.init()`` itself when Ray is
    not initialised).

    :param make_loader: a picklable function that returns the run's :class:`hydrax.Dataloader`,
        not entered; called in each actor, as ``make_loader()`` or, with ``start_at``, as
        ``make_loader(start_at=(epoch, batch))``. Every producer must build the same run: the
        collector refuses a share whose schedule differs.
    :param url: where the trainer's collector binds, ``zpull://HOST:PORT``; default: this node's
        address with a port the system chooses. A ``0.0.0.0`` or ``*`` host is given to the
        producers as this node's address.
    :param producers: how many actors (shares): at most 8 per CPU of the Ray cluster as it is
        when called (and at least 64 are allowed), the bound a Dataloader's ``loader_count`` has
        on one machine; more is refused at once with
        :class:`~hydrax.errors.ServeArgumentError`.
    :param num_cpus: CPUs Ray reserves for each actor. Its loader processes are not counted by
        Ray: reserve what the Dataloader's ``loader_count`` will use.
    :param resources: other Ray resources per actor (``{"data_node": 1}`` to place them).
    :param max_restarts: how many times Ray restarts a dead actor (-1: always).
    :param start_at: ``(epoch, batch)`` to resume at (:attr:`Source.next_start` of an earlier run).
    :param fingerprint: what the producers' schedule cannot see (shard URLs, image size): a
        producer built from other data is refused.
    :param timeout: seconds the collector waits for a silent share, and a producer for the collector.
    :param credit: batches each producer may have in flight.
    :param arrays: the array names to send, in order (default: all, in layout order).
    :param items: send each batch's item indices.
    :param nice: the niceness producers run at. Ray starts its workers at 15, which leaves
        producers on a busy node (the trainer's) only the CPU nothing else wants; 0 runs them as
        a plain ``serve`` process would. Raising a priority needs the right to (root, or
        ``RLIMIT_NICE``): without it they stay at Ray's, with a warning. None: leave Ray's.
    :param shared_memory: producers on the trainer's node send through a shared memory ring
        instead of TCP (the collector tells each whether it shares its host); True sizes the
        ring from the first batch, an int gives its bytes; None: TCP for all.
    """
    check_producer_type(producers)
    ray = import_ray()
    if not ray.is_initialized():
        ray.init()
    producers = check_producers(producers, ray.cluster_resources().get("CPU", 0))
    host = ray.util.get_node_ip_address()
    collector = Collector(url or f"zpull://{host}:*", producers, credit=credit, timeout=timeout)
    try:
        if not collector.addresses:
            raise ValueError(f"the collector must bind (a zpull:// URL), not {url!r}")
        bound = collector.addresses[0]
        for wildcard in ("//0.0.0.0:", "//*:", "//[::]:"):
            bound = bound.replace(wildcard, f"//{host}:")
        target = "zpush://" + bound.split("://", 1)[1]
        options = {"fingerprint": fingerprint, "timeout": timeout, "arrays": arrays, "items": items, "nice": nice,
                   "shared_memory": shared_memory}
        remote = ray.remote(Producer).options(num_cpus=num_cpus, resources=resources or {}, max_restarts=max_restarts,
                                             max_task_retries=-1 if max_restarts != 0 else 0)
        actors = [remote.remote(make_loader, target, (k, producers), start_at, options) for k in range(producers)]
        runs = [actor.run.remote() for actor in actors]
    except BaseException:
        collector.close()
        raise
    log.info("[hydrax] %d producers on Ray serve to %s", producers, target)
    return Source(collector, actors, runs, start_at)

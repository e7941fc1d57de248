"""Reading a build's samples: each one's files into the fields :class:`~hydrax.shards.ShardWriter`
takes, optionally checking that images decode, in this process or ahead of the writer in worker
processes.

A sample that cannot be read (or decoded) is returned as the :class:`BuildError` that says why,
not raised, so the caller decides whether to fail or skip it (``skip_bad``).
"""

from __future__ import annotations

import multiprocessing
import signal
from collections import deque
from typing import Any, Iterator, Sequence

from .sources import BuildError, SourceSample
from ..tarindex import IMAGE_EXTENSIONS
from ..verify import decode_check


def _check_image(path: str, data: bytes, where: str) -> None:
    try:
        import PIL  # noqa: F401
    except ImportError:
        raise ImportError("checking images needs Pillow: pip install Pillow (or do not check images: --no-check-images)") from None
    try:
        # What verify --decode and the loaders do (an embedded profile for other data is refused
        # too), to a small image: a reduced JPEG decode still reads every byte of the
        # entropy-coded data, so it finds truncation and corruption at a fraction of the cost.
        decode_check(data)
    except Exception as exc:  # ImageError, ProfileError, or any of Pillow's plugins' errors
        raise BuildError(f"{path}{where}: not a readable image ({exc})") from None


def load_sample(sample: SourceSample, check_images: bool) -> dict[str, Any] | BuildError:
    """The sample as ShardWriter takes it, or the :class:`BuildError` that describes its fault."""
    loaded: dict[str, Any] = {"__key__": sample.key, **sample.values}
    try:
        for name, path in sample.files.items():
            where = f" ({sample.origin})" if sample.origin != path else ""
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError as exc:
                raise BuildError(f"cannot read {path}{where}: {exc.strerror or exc}") from None
            if check_images and name.rsplit(".", 1)[-1] in IMAGE_EXTENSIONS:
                _check_image(path, data, where)
            loaded[name] = data
    except BuildError as exc:
        return exc
    return loaded


def _probe(chunk: Sequence[SourceSample], check_images: bool) -> list[BuildError | None]:
    """What is wrong with each sample of ``chunk``, if anything (run in a worker process)."""
    verdicts = []
    for sample in chunk:
        loaded = load_sample(sample, check_images)
        verdicts.append(loaded if isinstance(loaded, BuildError) else None)
    return verdicts


def _start_worker() -> None:
    from ...procs.processes import die_with_parent

    # Ctrl+C reaches the whole process group: the parent cleans up and stops the pool (with
    # SIGTERM), so the workers should neither die mid-task nor print tracebacks of their own; a
    # SIGTERM handler inherited through fork would do the latter. A parent killed outright takes
    # them along instead of leaving them blocked on a file.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    die_with_parent()


def load_samples(samples: Sequence[SourceSample], workers: int, check_images: bool) -> Iterator[tuple[SourceSample, Any]]:
    """Each sample with its :func:`load_sample` result, in order; ``workers`` processes work ahead."""
    if workers <= 1:
        for sample in samples:
            yield sample, load_sample(sample, check_images)
        return
    # The workers read (and check) each sample ahead of the writer, and return only a verdict;
    # this process then reads the bytes again, from the page cache. Shipping the bytes back
    # through a pipe would cost this process more than reading them, and this process (the tar
    # writer) is the bottleneck. Processes rather than threads, because Pillow's parsing and the
    # writer both hold the GIL much of the time. Chunks amortise the pool's cost per task; the
    # window bounds how far ahead the workers run.
    from ...procs.processes import start_method

    chunk = 64
    window: deque[tuple[Sequence[SourceSample], Any]] = deque()
    pool = multiprocessing.get_context(start_method()).Pool(workers, initializer=_start_worker)
    try:
        for start in range(0, len(samples), chunk):
            part = samples[start : start + chunk]
            window.append((part, pool.apply_async(_probe, (part, check_images))))
            while len(window) >= 2 * workers or (window and start + chunk >= len(samples)):
                part, verdicts = window.popleft()
                for sample, verdict in zip(part, verdicts.get()):
                    yield sample, verdict or load_sample(sample, False)
    except BaseException:
        # Failing, interrupted, or closed early by the writer's failure: a worker may be stuck on
        # a file that never answers (a hung network mount), so stop them rather than wait.
        pool.terminate()
        raise
    else:
        pool.close()
    finally:
        pool.join()

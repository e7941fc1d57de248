"""hydrax: a zero-copy multiprocess data loader for JAX.

``from hydrax import Dataloader, DataGroup, TrainingBatch, ValidationBatch`` is all a training
program needs; the API is a drop-in for hydrax 0.2.2.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from . import errors as errors  # (hydrax.errors.X after import hydrax, as before)
from .errors import BatchFailedError, BatchTimeoutError, CheckpointMismatchError, WorkerError
from .procs.processes import is_worker, watch_jax_start as _watch_jax_start

__version__ = "0.3.0.dev0"

#: Where each name of the package is defined: imported on first use, so that a process that
#: needs only part of hydrax (the loader fork server and the workers it forks) does not import
#: the rest.
_NAMES = {
    "Batch": "run.batch", "TrainingBatch": "run.batch", "ValidationBatch": "run.batch",
    "bucket_groups": "run.buckets", "debug_batch_references": "debug",
    "DataGroup": "run.group", "ArrayLayout": "layout", "ArraySpec": "layout", "Dataloader": "run.loader",
    "Mixture": "order.mixture", "LoaderFunc": "types", "PlacementFunc": "types", "StartupFunc": "types",
}

__all__ = [
    "ArrayLayout", "ArraySpec", "Batch", "BatchFailedError", "BatchTimeoutError", "CheckpointMismatchError", "DataGroup", "Dataloader", "LoaderFunc",
    "Mixture", "PlacementFunc", "StartupFunc", "TrainingBatch", "ValidationBatch", "WorkerError", "bucket_groups", "debug_batch_references",
    "is_worker",
]


def __getattr__(name: str):
    where = _NAMES.get(name)
    if where is None:
        try:  # a subpackage or module (hydrax.image, hydrax.shards, ...) on first use
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(f"{__name__}.{where}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_NAMES))


if TYPE_CHECKING:
    from .debug import debug_batch_references
    from .layout import ArrayLayout, ArraySpec
    from .order.mixture import Mixture
    from .run.batch import Batch, TrainingBatch, ValidationBatch
    from .run.buckets import bucket_groups
    from .run.group import DataGroup
    from .run.loader import Dataloader
    from .types import LoaderFunc, PlacementFunc, StartupFunc

_watch_jax_start()

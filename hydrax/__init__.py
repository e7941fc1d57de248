"""hydrax: a zero-copy multiprocess data loader for JAX.

``from hydrax import Dataloader, DataGroup, TrainingBatch, ValidationBatch`` is all a training
program needs; the API is a drop-in for hydrax 0.2.2.
"""

from .run.batch import Batch, TrainingBatch, ValidationBatch
from .run.buckets import bucket_groups
from .debug import debug_batch_references
from .errors import BatchFailedError, BatchTimeoutError, CheckpointMismatchError, WorkerError
from .run.group import DataGroup
from .layout import ArrayLayout, ArraySpec
from .run.loader import Dataloader
from .order.mixture import Mixture
from .procs.processes import is_worker
from .types import LoaderFunc, PlacementFunc, StartupFunc

__version__ = "0.3.0.dev0"

__all__ = [
    "ArrayLayout", "ArraySpec", "Batch", "BatchFailedError", "BatchTimeoutError", "CheckpointMismatchError", "DataGroup", "Dataloader", "LoaderFunc",
    "Mixture", "PlacementFunc", "StartupFunc", "TrainingBatch", "ValidationBatch", "WorkerError", "bucket_groups", "debug_batch_references",
    "is_worker",
]

from .procs.processes import watch_jax_start as _watch_jax_start

_watch_jax_start()

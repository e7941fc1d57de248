"""Loaders for tests/test_ray.py's Ray actors (imported there by name, so the module must be on
their path): the run of ``serve_share_job``, optionally slowed down or broken."""

import os

import jax.numpy as jnp
import numpy as np

from hydrax import DataGroup, Dataloader
from support import serve_share_job


def make_loader(start_at=(0, 0), delay: float = 0.0):
    """serve_share_job's run, ``delay`` seconds per item."""
    serve_share_job.DELAY = delay
    return serve_share_job.make_loader(start_at)


def broken_loader(start_at=(0, 0)):
    raise RuntimeError("no shards here")


def report_niceness(item, arrays, seed):
    arrays["nice"][...] = os.getpriority(os.PRIO_PROCESS, 0)


def make_niceness_loader(start_at=(0, 0)):
    """A run of 4 batches whose items hold the niceness of the loader process that loaded them."""
    group = DataGroup(2, range(8), loader_arrays={"nice": ((), np.int32, jnp.int32)})
    return Dataloader(report_niceness, group, start_at=start_at, end_at=("epoch", 1), loader_count=1)

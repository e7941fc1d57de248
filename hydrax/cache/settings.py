"""A group's ``cache_*`` arguments as hydrax 0.2.2 resolves them (:class:`CacheSettings`).

Resolved once, when the group is made, so a run only asks the settings (where, read-only or not,
direct mode, which arrays) and never re-applies 0.2.2's rules.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from ..layout import ArraySpec


@dataclass(frozen=True)
class CacheSettings:
    """A group's ``cache_*`` arguments as hydrax 0.2.2 resolves them (see :class:`hydrax.DataGroup`)."""

    #: The cache directory; None: no cache on disk (with ``cache_arrays``, :meth:`hydrax.Batch.cache`
    #: still turns batches into their cached form, in memory only).
    location: str | None
    #: The cache is read, never written: asked for, or forced by a missing location or loader arrays.
    readonly: bool
    #: "Direct" mode: no ``cache_arrays`` and a writable location, so the loader arrays are
    #: written to the cache as they are loaded.
    direct: bool
    #: The arrays of a cached batch: ``cache_arrays``, or the loader arrays in direct mode.
    arrays: Mapping[str, ArraySpec] | None

    @classmethod
    def resolve(cls, loader_arrays: Mapping[str, ArraySpec] | None, cache_arrays: Mapping[str, ArraySpec] | None,
                cache_location: str | os.PathLike | None, cache_readonly: bool) -> CacheSettings:
        """Apply 0.2.2's rules, with its messages for the combinations it refuses."""
        if loader_arrays is None and cache_arrays is None:
            raise ValueError("either loader_arrays or cache_arrays must be specified")
        readonly = bool(cache_readonly)
        if loader_arrays is None:
            if cache_location is None:
                raise ValueError("cache_location is required if no loader_arrays are specified")
            readonly = True
        direct = False
        if cache_location is None:
            readonly = True
        elif cache_arrays is None:
            cache_arrays = loader_arrays
            direct = not readonly
        location = None if cache_location is None else os.fspath(cache_location)
        return cls(location, readonly, direct, None if cache_arrays is None else dict(cache_arrays))

    @property
    def default_shuffle(self) -> str:
        """What ``shuffle_later="default"`` means: ``"batchwise"`` with a cache location (a cached
        batch keeps its items), else ``"itemwise"``."""
        return "batchwise" if self.location is not None else "itemwise"

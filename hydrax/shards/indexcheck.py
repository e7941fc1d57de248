"""The consistency rules of a shard index's arrays that the ``check_index`` kernel leaves to Python.

:func:`hydrax.shards.indexfile.ShardIndex.from_bytes` runs ``_core.check_index`` over a loaded
index (keys and samples ending in order, field numbers in range, fields inside the shard), then
:func:`check_order` (every field on a tar block, after its header, in shard order); once either
finds a problem, :func:`fault` finds the array and item at fault, so the error names the byte of
the file. :data:`INDEX_PROBLEMS` words each problem.
"""

from __future__ import annotations

import numpy as np

OUT_OF_ORDER = 6  # found by check_order, after check_index
TAR_BLOCK = 512
_SMALL = 40  # entries up to which check_order runs in Python
INDEX_PROBLEMS = {  # what _core.check_index finds
    1: "its keys do not end in order inside the key bytes",
    2: "its samples do not end in order, each after at least one field",
    3: "field numbers outside the {fields} fields it names",
    4: "a field lies outside the shard of {shard_size} bytes",
    5: "its arrays of samples, or of fields, differ in length",
    OUT_OF_ORDER: "fields overlap, or are not in the order of the shard, each after its 512-byte tar header",
}


def check_order(entry_offset: np.ndarray, entry_size: np.ndarray) -> int:
    """:data:`OUT_OF_ORDER` unless every field's bytes start on a tar block after a header (so at
    512 or later) and after the blocks of the field before: how any tar lays out its members."""
    if not len(entry_offset):
        return 0
    if len(entry_offset) <= _SMALL:
        # the same rule in plain Python, which beats numpy's cost per call on small shards
        end = 0  # where the blocks of the field before end (no field: its header needs the first block)
        for offset, size in zip(entry_offset.tolist(), entry_size.tolist()):
            if offset % TAR_BLOCK or offset < end + TAR_BLOCK:
                return OUT_OF_ORDER
            end = -(-(offset + size) // TAR_BLOCK) * TAR_BLOCK
        return 0
    # check_index bounded every field by the shard's size (< 2**62), so these sums cannot overflow
    blocks_end = -(-(entry_offset + entry_size) // TAR_BLOCK) * TAR_BLOCK
    if entry_offset[0] < TAR_BLOCK or (entry_offset % TAR_BLOCK).any() or (entry_offset[1:] < blocks_end[:-1] + TAR_BLOCK).any():
        return OUT_OF_ORDER
    return 0


def _first(bad: np.ndarray) -> int | None:
    found = np.flatnonzero(bad)
    return int(found[0]) if len(found) else None


def fault(problem: int, arrays: list[np.ndarray], fields: int, shard_size: int) -> tuple[int, int] | None:
    """(array number in file order, item) at which the arrays show ``problem``, or None when no one
    item is at fault; only called once a problem is found, so it may take its time."""
    _keys, key_ends, sample_ends, entry_field, entry_offset, entry_size = (a.astype(np.int64) for a in arrays)
    if problem in (1, 2):  # an end that falls back (or, for samples, stands still), else the last, which is not the total
        ends = key_ends if problem == 1 else sample_ends
        steps = np.diff(ends, prepend=0)
        fell = _first(steps < 0 if problem == 1 else steps <= 0)
        found = (problem, fell if fell is not None else len(ends) - 1) if len(ends) else None
    elif problem == 3:
        found = (3, _first((entry_field < 0) | (entry_field >= fields)))
    elif problem == 4:
        negative = _first(entry_offset < 0)
        # with no negative offset, shard_size - entry_offset cannot overflow
        found = (4, negative) if negative is not None else (5, _first((entry_size < 0) | (entry_size > shard_size - entry_offset)))
    elif problem == OUT_OF_ORDER and len(entry_offset):
        blocks_end = -(-(entry_offset + entry_size) // TAR_BLOCK) * TAR_BLOCK
        early = np.r_[entry_offset[0] < TAR_BLOCK, entry_offset[1:] < blocks_end[:-1] + TAR_BLOCK]
        found = (4, _first(early | (entry_offset % TAR_BLOCK != 0)))
    else:
        found = None
    return found if found is not None and found[1] is not None else None

"""debug_batch_references: who still holds batch memory that hydrax is waiting to recycle."""

from __future__ import annotations

import gc
import sys
import types

from . import _core

_MAX_DEPTH = 12
_MAX_NODES = 60  # each step scans every object the collector tracks: keep the tree small


def _describe(obj: object) -> str:
    text = ""
    try:
        text = repr(obj)
    except Exception:
        pass
    if not text or len(text) > 120 or "\n" in text:
        kind = type(obj)
        text = f"<{kind.__module__}.{kind.__qualname__} object at {id(obj):#x}>"
    return text


def _print_referrers(obj: object, depth: int, seen: set[int], ignore: set[int], out) -> None:
    if depth > _MAX_DEPTH or len(seen) > _MAX_NODES:
        return
    referrers = gc.get_referrers(obj)
    ignore.add(id(referrers))  # this very list refers to what it holds: not part of the answer
    shown = 0
    for referrer in referrers:
        if id(referrer) in ignore or isinstance(referrer, types.FrameType):
            continue
        shown += 1
        indent = "  " * depth
        if id(referrer) in seen:
            print(f"{indent}⮤ {_describe(referrer)} ...", file=out)
            continue
        seen.add(id(referrer))
        print(f"{indent}⮤ {_describe(referrer)}", file=out)
        if isinstance(referrer, dict) and "__name__" in referrer and "__builtins__" in referrer:
            continue  # a module's globals: the name above is the answer
        _print_referrers(referrer, depth + 1, seen, ignore, out)
    if not shown and isinstance(obj, memoryview):
        print(f"{'  ' * depth}⮤ (held outside Python objects, e.g. by a jax.Array that aliases this memory)", file=out)


def debug_batch_references(file=None) -> None:
    """Print, for every batch slot still in use, a tree of the objects that refer to its memory.

    A slot is recycled only when nothing made from it is alive: numpy views handed to a custom
    ``placement_func``, and ``jax.Array`` s that alias host memory on the CPU backend. Call this
    when loading stalls to find the reference that keeps a slot busy.
    """
    out = sys.stderr if file is None else file
    gc.collect()
    leases = [o for o in gc.get_objects() if isinstance(o, _core.SlotLease) and not o.released and o.exports]
    ignore = {id(leases)}
    for lease in leases:
        print(f"[hydrax] remaining references to batch slot {lease.slot} ({lease.exports} buffer exports):", file=out)
        frame_ignore = ignore | {id(sys._getframe())}
        _print_referrers(lease, 1, {id(lease)}, frame_ignore, out)

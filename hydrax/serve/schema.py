"""What a stream's messages hold: array names, dtypes and shapes, announced and checked.

A hydrax producer announces its schema (``[[name, dtype, shape], ...]``) in a ``schema``
envelope before its first batch, again whenever it changes, and on pub/sub whenever a new
subscriber joins, so that a consumer expecting something else fails at once, naming the
difference, instead of training on the wrong arrays. A consumer's expected schema may leave a
name, a dtype or a dimension as None: anything goes there.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np

#: One array: (name or None, dtype name or None, shape with None for any size, or None).
ArraySchema = tuple[str | None, str | None, tuple[int | None, ...] | None]


def describe(arrays: Sequence[np.ndarray], names: Sequence[str] | None) -> list[list]:
    """The schema of a list of arrays, as JSON values."""
    names = list(names) if names is not None else [""] * len(arrays)
    return [[names[i] if i < len(names) else "", arrays[i].dtype.name, list(arrays[i].shape)] for i in range(len(arrays))]


def parse_schema(spec: Iterable[Any] | None) -> list[ArraySchema] | None:
    """Normalise an expected schema: ``[(name, dtype, shape), ...]``; ``ValueError`` saying what is wrong."""
    if spec is None:
        return None
    out: list[ArraySchema] = []
    for i, entry in enumerate(spec):
        try:
            name, dtype, shape = entry
        except (TypeError, ValueError):
            raise ValueError(f"schema entry {i} must be (name, dtype, shape), got {entry!r}") from None
        dtype_name = None if dtype is None else np.dtype(dtype).name if not (isinstance(dtype, str) and dtype == "bfloat16") else dtype
        if shape is not None:
            shape = tuple(None if d is None else int(d) for d in shape)
        out.append((name, dtype_name, shape))
    return out


def mismatch(expected: list[ArraySchema], actual: Sequence[Sequence[Any]]) -> str | None:
    """Words for the first difference between an expected schema and an actual one, or None."""
    if len(expected) != len(actual):
        return f"{len(actual)} arrays, not {len(expected)}"
    for i, ((name, dtype, shape), (a_name, a_dtype, a_shape)) in enumerate(zip(expected, actual)):
        a_shape = tuple(a_shape)
        if name is not None and name != a_name:
            return f"array {i} is named {a_name!r}, not {name!r}"
        if dtype is not None and dtype != a_dtype:
            return f"array {i} ({a_name!r}) is {a_dtype}, not {dtype}"
        if shape is not None and (len(shape) != len(a_shape) or any(e is not None and e != d for e, d in zip(shape, a_shape))):
            wanted = "(" + ", ".join("*" if d is None else str(d) for d in shape) + ")"
            return f"array {i} ({a_name!r}) has shape {a_shape}, not {wanted}"
    return None

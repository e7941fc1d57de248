"""Use a pandas DataFrame as the data of a :class:`~hydrax.DataGroup`, one item per row.

::

    from hydrax.pandas import RowData

    group = DataGroup(64, RowData(frame), loader_arrays=...)

The loader function then receives each row as a ``pandas.Series`` indexed by column name. The
frame is not copied or materialised; it is sent to each worker process once.

This module needs pandas (``pip install 'hydrax[pandas]'``); ``import hydrax`` does not.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, overload

try:
    import pandas as _pd
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise ImportError("hydrax.pandas needs the pandas package: pip install 'hydrax[pandas]'") from _exc


class RowData(Sequence):
    """A read-only ``Sequence[pandas.Series]`` over the rows of a DataFrame.

    ``rows[i]`` is the row at position ``i`` (``dataframe.iloc[i]``; negative positions count
    from the end, and numpy integers work as well as Python ints), ``rows[a:b]`` is a
    :class:`RowData` over those rows, and ``len(rows)`` is the number of rows. Row positions are
    used, never index labels, so any index works.

    :param dataframe: the frame to wrap. It is kept by reference: do not modify it afterwards.
    :raises TypeError: if ``dataframe`` is not a ``pandas.DataFrame``.
    """

    __slots__ = ("_dataframe",)

    def __init__(self, dataframe: _pd.DataFrame) -> None:
        if not isinstance(dataframe, _pd.DataFrame):
            raise TypeError(f"RowData needs a pandas.DataFrame, got {type(dataframe).__name__}")
        self._dataframe = dataframe

    @property
    def dataframe(self) -> _pd.DataFrame:
        """The wrapped DataFrame."""
        return self._dataframe

    def __len__(self) -> int:
        return len(self._dataframe)

    @overload
    def __getitem__(self, key: int) -> _pd.Series: ...

    @overload
    def __getitem__(self, key: slice) -> RowData: ...

    def __getitem__(self, key: Any) -> _pd.Series | RowData:
        """The row at position ``key``, or a :class:`RowData` over a slice of rows.

        :raises TypeError: for a key that is neither an integer nor a slice.
        :raises IndexError: for a position out of range.
        """
        if isinstance(key, slice):
            return RowData(self._dataframe.iloc[key])
        if not hasattr(type(key), "__index__"):
            raise TypeError(f"invalid key type: {type(key)}")
        return self._dataframe.iloc[operator.index(key)]

    def __repr__(self) -> str:
        rows, columns = self._dataframe.shape
        return f"<RowData of {rows} rows x {columns} columns>"

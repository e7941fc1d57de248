"""hydrax.pandas.RowData: positional row access, and a DataFrame driving a real Dataloader."""

from __future__ import annotations

import multiprocessing
import pickle

import numpy as np
import pandas as pd
import pytest
from support.timing import slack_int

from hydrax import DataGroup, Dataloader
from hydrax.pandas import RowData

# Keep jax out of this module's imports: every worker process imports it to find load_row.
SPECS = {
    "features": ((2,), np.float32, np.float32),
    "label": ((1,), np.int32, np.int32),
}


def load_row(row, arrays, seed):
    """Reads one row (a pandas Series) into the item's arrays."""
    arrays["features"][:] = (row["width"], row["height"])
    arrays["label"][:] = row["label"]
    return {"name": row["name"]}


def make_frame(rows: int = 10) -> pd.DataFrame:
    # A shuffled integer index: position and label differ, so a label lookup would be caught.
    index = np.random.default_rng(1).permutation(np.arange(100, 100 + rows))
    return pd.DataFrame(
        {
            "name": [f"item{i}" for i in range(rows)],
            "width": np.arange(rows, dtype=np.float64) * 1.5,
            "height": np.arange(rows, dtype=np.float64) + 0.25,
            "label": np.arange(rows) % 3,
        },
        index=index,
    )


def test_int_keys_return_positional_rows():
    frame = make_frame()
    rows = RowData(frame)
    assert len(rows) == 10
    assert rows.dataframe is frame
    row = rows[3]
    assert isinstance(row, pd.Series)
    assert row["name"] == "item3"
    assert row.name == frame.index[3]
    assert rows[np.int64(4)]["name"] == "item4"
    assert rows[np.int32(5)]["name"] == "item5"
    assert rows[np.uint8(6)]["name"] == "item6"
    assert rows[-1]["name"] == "item9"
    assert rows[np.int64(-10)]["name"] == "item0"


def test_int_column_labels_still_give_rows():
    # In hydrax 0.2.2 rows[k] was a column lookup, which "worked" wrongly for int column labels.
    frame = pd.DataFrame([[1, 2], [3, 4], [5, 6]])
    rows = RowData(frame)
    assert list(rows[0]) == [1, 2]
    assert list(rows[1]) == [3, 4]


def test_out_of_range_raises_index_error():
    rows = RowData(make_frame(3))
    with pytest.raises(IndexError):
        rows[3]
    with pytest.raises(IndexError):
        rows[-4]


def test_slices_return_row_data():
    frame = make_frame()
    rows = RowData(frame)
    part = rows[2:8:2]
    assert isinstance(part, RowData)
    assert len(part) == 3
    assert [r["name"] for r in part] == ["item2", "item4", "item6"]
    assert part[-1]["name"] == "item6"
    assert len(rows[20:]) == 0
    assert [r["name"] for r in rows[::-1]][:2] == ["item9", "item8"]


@pytest.mark.parametrize("key", ["name", 1.0, None, (1,), [1, 2], np.float64(2.0)])
def test_other_keys_raise_type_error(key):
    rows = RowData(make_frame())
    with pytest.raises(TypeError, match=r"^invalid key type: "):
        rows[key]
    try:
        rows[key]
    except TypeError as exc:
        assert str(exc) == f"invalid key type: {type(key)}"


def test_sequence_protocol_and_pickling():
    rows = RowData(make_frame(4))
    assert [r["name"] for r in rows] == ["item0", "item1", "item2", "item3"]
    clone = pickle.loads(pickle.dumps(rows))
    assert isinstance(clone, RowData)
    assert clone.dataframe.equals(rows.dataframe)


def test_rejects_non_dataframes():
    with pytest.raises(TypeError):
        RowData([1, 2, 3])


def test_row_data_drives_a_dataloader():
    frame = make_frame(10)
    group = DataGroup(4, RowData(frame), loader_arrays=SPECS)  # 2 batches, 2 rows dropped per epoch
    assert group.batch_count == 2
    seen = []
    with Dataloader(load_row, group, loader_count=2, end_at=("epoch", 2), timeout_sec=slack_int(20)) as loader:
        for batch in loader:
            positions = list(batch.indices)
            expected = frame.iloc[positions]
            features = np.asarray(batch.arrays["features"])
            labels = np.asarray(batch.arrays["label"])
            assert features.shape == (4, 2) and labels.shape == (4, 1)
            np.testing.assert_array_equal(features[:, 0], expected["width"].to_numpy(np.float32))
            np.testing.assert_array_equal(features[:, 1], expected["height"].to_numpy(np.float32))
            np.testing.assert_array_equal(labels[:, 0], expected["label"].to_numpy(np.int32))
            assert batch.additional["name"] == list(expected["name"])
            assert [row["name"] for row in batch.data] == list(expected["name"])
            seen.append((batch.epoch, positions))
            del batch, features, labels
    assert [epoch for epoch, _ in seen] == [0, 0, 1, 1]
    assert seen[0][1] == [0, 1, 2, 3] and seen[1][1] == [4, 5, 6, 7]
    assert not loader.interrupted
    assert multiprocessing.active_children() == []


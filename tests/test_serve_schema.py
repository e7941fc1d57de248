"""The schema handshake: hydrax producers announce their arrays; consumers that expect others fail at once."""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

from hydrax.errors import SchemaError
from hydrax.serve import Connection
from hydrax.serve.schema import describe, mismatch, parse_schema

IMAGES = np.zeros((4, 8, 8, 3), np.uint8)
LABELS = np.arange(4, dtype=np.int32)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def produce(url: str, batches: list, **options) -> threading.Thread:
    def run():
        with Connection(url, protocol="hydrax", timeout=10, **options) as out:
            for arrays in batches:
                out.send(arrays, infos=["image", "label"])

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_describe_and_mismatch_words():
    expected = parse_schema([("image", np.uint8, (None, 8, 8, 3)), ("label", "int32", (None,))])
    assert mismatch(expected, describe([IMAGES, LABELS], ["image", "label"])) is None
    assert mismatch(expected, describe([IMAGES, LABELS.astype(np.int64)], ["image", "label"])) == "array 1 ('label') is int64, not int32"
    assert "shape (4, 8, 8, 4), not (*, 8, 8, 3)" in mismatch(expected, describe([np.zeros((4, 8, 8, 4), np.uint8), LABELS], ["image", "label"]))
    assert mismatch(expected, describe([IMAGES], ["image"])) == "1 arrays, not 2"
    assert mismatch(parse_schema([(None, None, None), ("lbl", None, None)]), describe([IMAGES, LABELS], ["image", "label"])) == \
        "array 1 is named 'label', not 'lbl'"
    with pytest.raises(ValueError, match="schema entry 0"):
        parse_schema(["image"])


def test_a_matching_schema_passes_and_is_recorded():
    port = free_port()
    schema = [("image", "uint8", (None, 8, 8, 3)), ("label", "int32", (None,))]
    with Connection(f"zpull://127.0.0.1:{port}", protocol="hydrax", timeout=10, schema=schema) as inbox:
        thread = produce(f"zpush://127.0.0.1:{port}", [[IMAGES, LABELS]] * 3)
        got = list(inbox)
        thread.join(10)
        assert len(got) == 3
        assert list(inbox.schemas.values()) == [[["image", "uint8", [4, 8, 8, 3]], ["label", "int32", [4]]]]


def test_the_announcement_fails_the_consumer_before_any_batch():
    port = free_port()
    with Connection(f"zpull://127.0.0.1:{port}", protocol="hydrax", timeout=10, schema=[("image", "float32", None), (None, None, None)]) as inbox:
        thread = produce(f"zpush://127.0.0.1:{port}", [[IMAGES, LABELS]] * 2)
        with pytest.raises(SchemaError, match=r"announces other arrays .*array 0 \('image'\) is uint8, not float32") as caught:
            inbox.recv()
        assert caught.value.url == f"zpull://127.0.0.1:{port}"
        assert inbox.stats.count == 0  # no batch was handed out
    thread.join(10)


def test_a_tensorcom_producer_is_checked_batch_by_batch():
    port = free_port()
    with Connection(f"zpull://127.0.0.1:{port}", timeout=10, schema=[(None, "uint8", None), (None, "int16", None)]) as inbox:
        def run():
            with Connection(f"zpush://127.0.0.1:{port}", timeout=10) as out:  # tensorcom framing: no announcement
                out.send([IMAGES, LABELS])

        threading.Thread(target=run, daemon=True).start()
        with pytest.raises(SchemaError, match="a batch holds .*array 1 .* is int32, not int16"):
            inbox.recv()


def test_a_late_subscriber_hears_the_schema():
    port = free_port()
    url = f"zpub://127.0.0.1:{port}"
    first = Connection(f"zsub://127.0.0.1:{port}", protocol="hydrax", timeout=10)
    with Connection(url, protocol="hydrax", timeout=10, subscribers=1) as out:
        out.send([IMAGES, LABELS], infos=["image", "label"])
        assert first.recv_message() is not None and len(first.schemas) == 1
        second = Connection(f"zsub://127.0.0.1:{port}", protocol="hydrax", timeout=10)
        out.wait_for_subscribers(2)
        out.send([IMAGES, LABELS], infos=["image", "label"])
        message = second.recv_message()
        assert message.kind == "data"
        assert list(second.schemas.values()) == [[["image", "uint8", [4, 8, 8, 3]], ["label", "int32", [4]]]]
    first.close()
    second.close()

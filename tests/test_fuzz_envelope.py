"""Mutation fuzzing of hydrax's message envelopes (``hydrax.serve.envelope.unpack``).

Valid envelopes (each kind, with the fields producers send) are mutated: bytes flipped, cut,
inserted and deleted, and their JSON rewritten with deep nesting (arrays and objects past
:data:`~hydrax.serve.envelope.MAX_DEPTH`, and thousands deep), long strings and numbers, and
fields of the wrong type. ``unpack`` must return an :class:`~hydrax.serve.envelope.Envelope`
whose JSON nests no deeper than the limit, or raise ``ValueError`` (which a Connection turns into
a skipped, counted ``MessageError``): never ``RecursionError`` or anything else.

``HYDRAX_FUZZ`` sets the mutants (see ``tests/support/fuzzing.py``); a failure names the seed
and the mutant.
"""

from __future__ import annotations

import json
import random

import pytest

from support.fuzzing import MUTANTS, SEED

from hydrax.serve import envelope

pytestmark = pytest.mark.fuzz

VALID = [
    envelope.pack(envelope.DATA, "train", p="producer-1", s=7, m={"ring": "x", "slot": 3}),
    envelope.pack(envelope.SCHEMA, "", p="p", arrays=[["x", "float32", [2, 3]], ["y", "int32", [2]]]),
    envelope.pack(envelope.END, "val", p="p", error="boom"),
    envelope.pack(envelope.EPOCH_END, "train", p="p", epoch=3),
]


def nested(rng: random.Random) -> bytes:
    depth = rng.choice([envelope.MAX_DEPTH, envelope.MAX_DEPTH + 1, 100, 999, 1000, 5000, 50_000])
    if rng.random() < 0.5:
        inner = b"[" * depth + b"]" * depth
    else:
        inner = b'{"a":' * depth + b"0" + b"}" * depth
    return b'~hx~t\0{"k":"data","x":' + inner + b"}"


def mutate(original: bytes, rng: random.Random) -> bytes:
    data = bytearray(original)
    how = rng.randrange(7)
    if how == 0:
        return nested(rng)
    if how == 1:
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
    elif how == 2:
        del data[rng.randrange(len(data)):]
    elif how == 3:
        at = rng.randrange(len(data))
        data[at:at] = rng.choice([b"[", b"{", b'"', b"\\", b"\0", b"\xff", b"9" * 5000, b"[" * 3000])
    elif how == 4:
        at = rng.randrange(len(data))
        del data[at:at + rng.randint(1, 20)]
    elif how == 5:
        head, _, body = original.partition(b"\0")
        fields = json.loads(body)
        fields[rng.choice(list(fields))] = rng.choice([None, 1e308, -1, "x" * 10_000, [[[]]], {"k": {}}, True])
        return head + b"\0" + json.dumps(fields).encode()
    else:
        data = bytearray(b"~hx~") + bytearray(rng.randbytes(rng.randint(0, 200)))
    return bytes(data)


def depth(value) -> int:
    """How deep containers nest (the test's own count; what unpack returned nests little)."""
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    return 0


def test_valid_envelopes_unpack():
    for frame in VALID:
        assert envelope.unpack(frame).kind in (envelope.DATA, envelope.SCHEMA, envelope.END, envelope.EPOCH_END)


def test_mutated_envelopes_unpack_or_are_value_errors():
    for case in range(MUTANTS):
        rng = random.Random(f"{SEED}-envelope-{case}")
        frame = mutate(rng.choice(VALID), rng)
        try:
            got = envelope.unpack(frame)
        except ValueError:
            continue
        except Exception as exc:  # noqa: BLE001 - the point: nothing else may escape
            raise AssertionError(f"seed {SEED}, mutant {case}: {type(exc).__name__}: {exc}") from None
        assert isinstance(got.fields, dict) and isinstance(got.kind, str)
        assert depth(got.fields) <= envelope.MAX_DEPTH, (SEED, case)

"""Weighted mixtures of sources, as pure functions of (seed, epoch, position).

A mixture's epoch of ``N`` positions (``G`` full batches of ``B``) holds a fixed number of items
of each source, ``n_s``: the epoch's used positions ``U = G * B`` apportioned to the weights by
largest remainders, so the proportions are exact to an item per epoch. Each source is read as a
stream of passes (a pass is every item of the source once, in a fresh order); epoch ``e`` reads
positions ``[e * n_s, (e + 1) * n_s)`` of source ``s``'s stream, so a small source makes several
passes in an epoch and a large one carries its pass over into the next epoch. Nothing here
depends on anything but these few integers: any process computes the items of any batch of any
epoch, and a run resumes exactly wherever it stopped, with any number of loaders or hosts.

Within the epoch the positions of source ``s`` are laid out *stratified*: every batch holds
``floor(w_s * B)`` of its items, and the ``r`` slots that leaves in each batch go to the sources'
remainders in rotation (the ``x_s = n_s - G * floor(w_s * B)`` extra items of source ``s`` go to
``x_s`` consecutive batches, counted cyclically, one each). Every count is closed-form, so the
items of source ``s`` before batch ``b`` cost O(1) to know, and a batch's items of a source are a
contiguous stretch of its stream (a shard-local source stays shard-local).

The ``"stratified"`` batching shuffles the positions within each batch (so hosts that split a
batch all see every source); ``"random"`` shuffles them within runs of :data:`RANDOM_RUN` batches,
so a batch's composition varies as random draws do, while every run of batches holds its
sources' exact shares and still reads each source from one short stretch of its stream.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

import numpy as np

from ..errors import MixtureRangeError

#: The ways positions are spread over a mixture's batches (see the module's docstring).
BATCHINGS = ("random", "stratified")
#: Batches whose positions ``"random"`` shuffles together: enough for a batch's composition to
#: vary as independent draws would (64 batches of any size are a large population), few enough
#: that each source is read from a short stretch of its stream at a time.
RANDOM_RUN = 64
#: The largest number a mixture's schedule counts to: its kernels and stream positions are int64.
INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class MixturePlan:
    """What the schedule knows of a mixture: its sources' lengths, their weights, how batches
    are filled, and (for ``shardwise`` reading) each source's shard sizes (``()`` for a source
    that has none or is read item by item)."""

    source_sizes: tuple[int, ...]
    weights: tuple[float, ...]
    batching: str = "random"
    source_shards: tuple[tuple[int, ...], ...] = ()

    @property
    def offsets(self) -> np.ndarray:
        """Where each source's items start among the mixture's items, and their total, last."""
        return np.concatenate(([0], np.cumsum(self.source_sizes, dtype=np.int64)))


def check_weights(weights: Sequence, count: int) -> tuple[float, ...]:
    """``weights`` as floats, one per source, each positive and finite; ValueError naming the bad one.

    Only the ratios count, so the sum is never taken in floats (weights of ``1e308`` are fine).
    An int too large for a float (``10**400``) is kept exact: then every weight is divided by
    the largest, exactly, and each ratio must be a float above 0
    (:class:`~hydrax.errors.MixtureRangeError` naming the weight otherwise). Weights that are
    floats already are returned as given."""
    values = tuple(weights)
    if len(values) != count:
        raise ValueError(f"weights must hold one number per source: {count} sources, {len(values)} weights")
    out: list[float | None] = []
    for i, w in enumerate(values):
        if isinstance(w, bool) or not isinstance(w, (int, float, np.integer, np.floating)):
            raise TypeError(f"weights[{i}] must be a number, got {type(w).__name__}")
        try:
            value: float | None = float(w)
        except OverflowError:  # an int beyond a float's range: its ratio to the others may still be a float
            value = None
        if (w <= 0) if value is None else (not math.isfinite(value) or value <= 0):
            raise ValueError(f"weights[{i}] must be positive and finite, got {_shown(w)}")
        out.append(value)
    if None not in out:
        return tuple(out)
    exact = [Fraction(int(w)) if isinstance(w, (int, np.integer)) else Fraction(float(w)) for w in values]
    largest = max(range(count), key=exact.__getitem__)
    scaled = []
    for i, w in enumerate(exact):
        ratio = float(w / exact[largest])
        if ratio == 0.0:
            raise MixtureRangeError(
                f"weights[{i}] ({_shown(values[i])}) is too small next to weights[{largest}] ({_shown(values[largest])}) "
                "for a float to hold their ratio: only the weights' ratios count, so give weights whose ratios are "
                "floats (above about 5e-324)", argument="weights")
        scaled.append(ratio)
    return tuple(scaled)


def _shown(weight) -> str:
    """A weight in words, short: a huge int as a power of two (its digits could be thousands,
    more than Python turns into a string)."""
    if isinstance(weight, int) and weight.bit_length() > 64:
        return f"an int of about 2**{weight.bit_length() - 1}"
    return repr(weight)


def proportions(weights: Sequence[float]) -> tuple[float, ...]:
    """``weights`` normalised to sum to 1, computed in exact fractions: a float sum of large
    weights would overflow (``1e308 + 1e308``), and every process agrees on the exact result."""
    exact = [Fraction(w) for w in weights]
    total = sum(exact)
    return tuple(float(w / total) for w in exact)


def last_epoch(epoch_size: int) -> int:
    """The last epoch whose positions a mixture of ``epoch_size`` positions per epoch can count:
    its schedule counts in int64 (the kernels, the stream positions of its sources), and every
    position of epoch ``e`` is below ``(e + 1) * epoch_size``, which must not exceed
    :data:`INT64_MAX`. -1 when not even epoch 0 fits."""
    return INT64_MAX // epoch_size - 1


def check_epoch(epoch_size: int, epoch: int, argument: str) -> None:
    """Raise :class:`~hydrax.errors.MixtureRangeError` when ``epoch`` of a mixture of
    ``epoch_size`` positions per epoch is past :func:`last_epoch`; ``argument`` is what sets
    that epoch (``"epoch_size"``, ``"start_at"`` or ``"end_at"``), named with what to do."""
    last = last_epoch(epoch_size)
    if epoch <= last:
        return
    if argument == "epoch_size":
        advice = f"use an epoch_size up to 2**63 - 1 ({INT64_MAX})"
    elif argument == "start_at":
        advice = f"start at epoch {last} or before, or use a smaller epoch_size" if last >= 0 else "use a smaller epoch_size"
    else:
        advice = f"end the run after epoch {last} (end_at=('epoch', {last + 1})), or use a smaller epoch_size"
    raise MixtureRangeError(
        f"{argument}: epoch {epoch} of a Mixture with epoch_size {epoch_size} has positions past 2**63 - 1, which its "
        f"schedule counts in int64 ((epoch + 1) * epoch_size must not exceed 2**63 - 1, so its last epoch is {last}): "
        f"{advice}", argument=argument, epoch_size=epoch_size, epoch=epoch, last_epoch=last)


def epoch_totals(weights: Sequence[float], used: int) -> np.ndarray:
    """Items of each source in an epoch of ``used`` positions: the quotas ``used * w / sum(w)``
    rounded down, then one more for the largest remainders (ties to the lower index), computed
    in exact fractions so every process and platform agrees."""
    exact = [Fraction(w) for w in weights]
    total = sum(exact)
    quotas = [used * w / total for w in exact]
    counts = [math.floor(q) for q in quotas]
    short = used - sum(counts)
    by_remainder = sorted(range(len(quotas)), key=lambda s: (-(quotas[s] - counts[s]), s))
    for s in by_remainder[:short]:
        counts[s] += 1
    return np.array(counts, np.int64)


@dataclass(frozen=True)
class Layout:
    """The stratified layout of one epoch's batches (see the module's docstring): per source, the
    items every batch holds (``base``), the extra items it spreads over the batches (``extra``),
    where its run of extras starts (``first_extra``), and its epoch total."""

    batch_size: int
    batch_count: int
    totals: np.ndarray
    base: np.ndarray
    extra: np.ndarray
    first_extra: np.ndarray

    @classmethod
    def of(cls, weights: Sequence[float], batch_size: int, batch_count: int) -> Layout:
        totals = epoch_totals(weights, batch_size * batch_count)
        exact = [Fraction(w) for w in weights]
        total = sum(exact)
        base = np.array([math.floor(batch_size * w / total) for w in exact], np.int64)
        extra = totals - batch_count * base
        # 0 <= extra <= batch_count: each source has at most one extra item per batch
        assert (extra >= 0).all() and (extra <= batch_count).all(), (totals, base, batch_count)
        first_extra = np.concatenate(([0], np.cumsum(extra)[:-1])).astype(np.int64)
        return cls(batch_size, batch_count, totals, base, extra, first_extra)

    def counts(self, batches: np.ndarray) -> np.ndarray:
        """Items of each source in each of ``batches``: shape ``(sources, len(batches))``."""
        start = (self.first_extra % self.batch_count)[:, None]
        return self.base[:, None] + ((batches[None, :] - start) % self.batch_count < self.extra[:, None])

    def before(self, batches: np.ndarray) -> np.ndarray:
        """Items of each source in the epoch's batches before each of ``batches``."""
        g = self.batch_count
        start = (self.first_extra % g)[:, None]
        extra = self.extra[:, None]
        b = batches[None, :]
        end = start + extra
        # the run of extras covers the residues [start, end) mod g, wrapping at most once
        plain = np.clip(b - start, 0, extra)
        wrapped = np.clip(b - start, 0, g - start) + np.minimum(b, np.maximum(end - g, 0))
        extras = np.where(end <= g, plain, wrapped)
        return self.base[:, None] * b + extras

    def place(self, batches: np.ndarray, slots: np.ndarray, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """Source and stream position of slot ``slots[i]`` of batch ``batches[i]`` in ``epoch``:
        a batch's slots hold source 0's items, then source 1's, and so on."""
        counts = self.counts(batches)
        ends = np.cumsum(counts, axis=0)
        source = (slots[None, :] >= ends).sum(axis=0)
        columns = np.arange(len(slots))
        rank = slots - (ends[source, columns] - counts[source, columns])
        stream = epoch * self.totals[source] + self.before(batches)[source, columns] + rank
        return source, stream


def run_length(batching: str) -> int:
    """Batches whose positions are shuffled together."""
    return RANDOM_RUN if batching == "random" else 1


__all__ = ["BATCHINGS", "INT64_MAX", "RANDOM_RUN", "Layout", "MixturePlan", "check_epoch", "check_weights", "epoch_totals",
           "last_epoch", "proportions", "run_length"]

"""The order book (hydrax.order.orderbook): "numpy" orders stored once per host, ahead of need, two epochs at most."""

from __future__ import annotations

import threading
from dataclasses import replace

import numpy as np
import pytest
from support.timing import slack

from hydrax.order.orderbook import OrderBook, needs_book, stored_epoch
from hydrax.order.orders import ShareOrder
from hydrax.order.schedule import GroupPlan, host_share, local_items, share_ranges
from hydrax.order.orders import group_item_order


def plan_of(size=4000, batch_size=40, shuffle_later="itemwise", shuffle_first=True, seed=7, **kw) -> GroupPlan:
    return GroupPlan(size=size, batch_size=batch_size, batch_count=size // batch_size, seed=seed, shuffle_first=shuffle_first,
                     shuffle_later=shuffle_later, **kw)


@pytest.mark.parametrize("share", [None, (1, 4), ((0, 10), (30, 40))])
@pytest.mark.parametrize("mode", ["itemwise", "repeat", "batchwise", "shardwise"])
def test_the_book_holds_numpy_orders_bit_for_bit(share, mode):
    kw = {"shard_sizes": tuple([37, 3, 100, 0, 55] * 10), "shard_partitions": 2} if mode == "shardwise" else {}
    size = sum(kw["shard_sizes"]) if kw else 4000
    plan = plan_of(size=size, shuffle_later=mode, **kw)
    if isinstance(share, tuple) and isinstance(share[0], int):
        plan = host_share(plan, *share)
    elif share is not None:
        plan = share_ranges(plan, share)
    book = OrderBook([(0, plan, True)], ahead=3)
    try:
        for epoch in (0, 1, 2, 5):
            want = group_item_order(plan, epoch)
            stored = book.order(0, epoch)
            for b in (0, 3, plan.batch_count - 1):
                assert list(stored.local(plan, b)) == list(local_items(plan, want, b))
    finally:
        book.close()


def test_only_shuffled_numpy_groups_are_stored():
    assert needs_book(plan_of(), True)
    assert not needs_book(plan_of(permutation="lazy"), True)
    assert not needs_book(plan_of(shuffle_first=False, shuffle_later="repeat"), True)
    assert needs_book(plan_of(shuffle_first=False), True)  # itemwise: epochs after the first
    assert not needs_book(plan_of(shuffle_first=False), False)  # a validation group never reshuffles
    assert stored_epoch(plan_of(shuffle_first=False), 0, True) is None
    assert stored_epoch(plan_of(shuffle_later="repeat"), 9, True) == 0
    assert not OrderBook([(0, plan_of(permutation="lazy"), True)], 3)


def test_an_order_takes_4_bytes_per_item_of_the_share_and_two_epochs_at_most():
    plan = host_share(plan_of(size=100_000, batch_size=100), 1, 4)
    book = OrderBook([(0, plan, True), (1, replace(plan, shuffle_later="repeat"), False)], ahead=8)
    shelf, fixed = book.spec.shelves[0], book.spec.shelves[1]
    assert (shelf.ring, shelf.rows, shelf.columns, shelf.dtype) == (2, 1000, 25, "<i4")
    assert fixed.ring == 1
    assert book.spec.size <= 3 * (4 * 25_000 + 4096 + 64)
    # an epoch shorter than the look-ahead gets enough buffers for every epoch in flight
    short = OrderBook([(0, plan_of(size=400, batch_size=40), True)], ahead=25)
    assert short.spec.shelves[0].ring == 2 + 3


def test_the_next_epoch_is_computed_in_the_background_ahead_of_the_boundary():
    plan = plan_of(size=2_000_000, batch_size=1000)
    book = OrderBook([(0, plan, True)], ahead=4)
    # which thread computes which epoch, rather than how long the boundary takes (that timing
    # failed on a busy machine)
    computed = []
    compute = book._compute

    def recording(group, key, done):
        computed.append((group, key, threading.current_thread().name))
        compute(group, key, done)

    book._compute = recording
    try:
        book.order(0, 0, 0)
        assert (0, 1) not in book._state  # not before every batch of the previous epoch is done
        book.order(0, 0, 4)
        assert (0, 1) in book._state
        assert book._state[(0, 1)].wait(slack(60))
        order = book.order(0, 1, 0)  # the boundary: ready, nothing left to compute
        assert computed == [(0, 0, threading.current_thread().name), (0, 1, "hydrax-orders")]
        assert list(order.local(plan, 5)) == list(local_items(plan, group_item_order(plan, 1), 5))
    finally:
        book.close()


def test_an_order_whose_buffer_was_reused_is_never_read():
    plan = plan_of(size=400, batch_size=40)
    book = OrderBook([(0, plan, True)], ahead=1)
    book.close()
    old = book.order(0, 0, 0)
    old.local(plan, 0)
    book.order(0, 1, 5)
    book.order(0, 2, 5)  # reuses epoch 0's buffer
    with pytest.raises(RuntimeError, match="holds epoch 2"):
        old.local(plan, 0)


def test_a_failed_order_raises_where_it_is_asked_for():
    plan = plan_of(size=400, batch_size=40, shuffle_later="shardwise", shard_sizes=(200, 100), shard_partitions=1)
    broken = replace(plan, shard_sizes=(200, "x"))
    book = OrderBook([(0, broken, True)], ahead=1)
    with pytest.raises((TypeError, ValueError)):
        book.order(0, 0, 0)
    book.close()


def test_a_stored_order_views_the_book_rather_than_copying_it():
    plan = plan_of()
    book = OrderBook([(0, plan, True)], ahead=1)
    order = book.order(0, 0)
    assert isinstance(order, ShareOrder) and not order.rows.flags.owndata
    assert np.shares_memory(order.rows, book._views[0][0][1])
    book.close()

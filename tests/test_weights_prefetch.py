"""runtime/loading/weights.py's prefetched(): the loader's host work on worker threads, in order, a bounded window ahead."""

from __future__ import annotations

import threading

import pytest

from ember.runtime.loading.prefetch import prefetched


def test_results_come_in_order_and_never_more_than_the_window_ahead():
    started, consumed, lock = [], [], threading.Lock()

    def work(i):
        with lock:
            started.append(i)
            assert len(started) - len(consumed) <= 3 + 1  # the item being consumed, then `workers` ahead
        return i * i

    for i, value in enumerate(prefetched(work, range(20), workers=3)):
        assert value == i * i
        consumed.append(i)
    assert sorted(started) == list(range(20)) and consumed == list(range(20))


def test_an_error_reaches_the_consumer_at_its_item():
    def work(i):
        if i == 4:
            raise ValueError("bad part 4")
        return i

    got = []
    with pytest.raises(ValueError, match="bad part 4"):
        for value in prefetched(work, range(10), workers=2):
            got.append(value)
    assert got == [0, 1, 2, 3]


def test_fewer_items_than_workers_and_none():
    assert list(prefetched(lambda i: -i, range(2), workers=4)) == [0, -1]
    assert list(prefetched(lambda i: i, [], workers=4)) == []

"""Host work of a load run ahead of the device placements, on a few threads (runtime/loading/weights.py)."""

from __future__ import annotations

import collections
import itertools
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

# parts (a global weight, or a layer's weights) built on the host ahead of the one being placed: the host side
# of a load is per-part numpy work, so it scales with cores; each part in flight holds its host arrays
LOAD_WORKERS = max(1, min(4, os.cpu_count() or 1))


def prefetched(fn: Callable[[Any], Any], items: Iterable, workers: int) -> Iterator:
    """fn(item) for each item, in order, computed on `workers` threads at most `workers` items ahead of the
    one being consumed (an exception reaches the consumer at its item)."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        items = iter(items)
        pending = collections.deque(pool.submit(fn, item) for item in itertools.islice(items, workers))
        try:
            while pending:
                result = pending.popleft().result()
                pending.extend(pool.submit(fn, item) for item in itertools.islice(items, 1))  # refill one
                yield result
        finally:
            for future in pending:
                future.cancel()

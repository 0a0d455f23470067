"""The q/k/v split kernel (compiler/kernels/split_columns/kernel.py) in Triton's CPU interpreter against np.split:
every output bit-equal, nothing written past its end."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from interpreter import HostBuffer

from ember.compiler.kernels.split_columns.kernel import BLOCK, split_columns_kernel

pytestmark = pytest.mark.interpret

# (rows, sizes, dtype name): the 8B's q/k/v (4096, 1024, 1024), sizes that are not multiples of the tile,
# and the 1.5B's (1536, 256, 256) at several rows
CASES = [
    (1, (4096, 1024, 1024), "bfloat16"),
    (3, (1536, 256, 256), "bfloat16"),
    (2, (100, 30, 1000), "float32"),
    (5, (7, 1030, 5), "bfloat16"),
]


@pytest.mark.parametrize(
    "seed, rows, sizes, dtype_name",
    [(seed, *case) for seed, case in enumerate(CASES)],
    ids=[f"rows{rows}-{'x'.join(map(str, sizes))}-{dtype}" for rows, sizes, dtype in CASES],
)
def test_split_columns_kernel_matches_np_split(seed, rows, sizes, dtype_name):
    dtype = ml_dtypes.bfloat16 if dtype_name == "bfloat16" else np.float32
    y = np.random.default_rng(seed).standard_normal((rows, sum(sizes))).astype(dtype)
    # each output is a flat buffer [rows * size] with a NaN guard of one tile behind it: a store past it lands there
    outs = [HostBuffer(np.full(rows * size + BLOCK, np.nan, dtype)) for size in sizes]
    grid = (rows, -(-sum(sizes) // BLOCK))
    split_columns_kernel[grid](HostBuffer(y), *outs, S0=sizes[0], S1=sizes[1], S2=sizes[2], BLOCK=BLOCK)
    want = np.split(y, np.cumsum(sizes)[:-1], axis=1)
    for name, out, ref, size in zip("qkv", outs, want, sizes):
        got = out.array[: rows * size].reshape(rows, size)
        unequal = int((got.astype(np.float32) != ref.astype(np.float32)).sum())
        assert np.array_equal(got, ref), f"{name} [{rows}, {size}]: {unequal} of {got.size} elements unequal"
        past = int((~np.isnan(out.array[rows * size :].astype(np.float32))).sum())
        assert past == 0, f"{name} [{rows}, {size}]: {past} elements written past its end"

"""Check the q/k/v split kernel (compiler/kernels/split_columns/kernel.py) without a GPU (needs only triton==3.6.0).

python -m ember.tools.dev.check_split_kernels interpret   run it in Triton's CPU interpreter against np.split on
                                                      CASES: every output bit-equal, nothing written past its end
"""

from __future__ import annotations

import os
import sys

import numpy as np

# (rows, sizes, dtype name): the 8B's q/k/v (4096, 1024, 1024), sizes that are not multiples of the tile,
# and the 1.5B's (1536, 256, 256) at several rows
CASES = [
    (1, (4096, 1024, 1024), "bfloat16"),
    (3, (1536, 256, 256), "bfloat16"),
    (2, (100, 30, 1000), "float32"),
    (5, (7, 1030, 5), "bfloat16"),
]


def interpret() -> int:
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernel is decorated
    from ember.tools.dev.check_quant_kernels import HostBuffer, patch_interpreter

    patch_interpreter()
    import ml_dtypes

    from ember.compiler.kernels.split_columns.kernel import BLOCK, split_columns_kernel

    rng = np.random.default_rng(0)
    failures = 0
    for rows, sizes, dtype_name in CASES:
        dtype = ml_dtypes.bfloat16 if dtype_name == "bfloat16" else np.float32
        y = rng.standard_normal((rows, sum(sizes))).astype(dtype)
        # each output is a flat buffer with a NaN guard of one tile behind it: a store past it lands there
        outs = [HostBuffer(np.full(rows * size + BLOCK, np.nan, dtype)) for size in sizes]
        grid = (rows, -(-sum(sizes) // BLOCK))
        split_columns_kernel[grid](HostBuffer(y), *outs, S0=sizes[0], S1=sizes[1], S2=sizes[2], BLOCK=BLOCK)
        want = np.split(y, np.cumsum(sizes)[:-1], axis=1)
        equal = all(
            np.array_equal(o.array[: rows * size].reshape(rows, size), w)
            and np.isnan(o.array[rows * size :].astype(np.float32)).all()
            for o, w, size in zip(outs, want, sizes)
        )
        failures += not equal
        print(f"{'ok ' if equal else 'BAD'} rows={rows} sizes={sizes} {dtype_name}", flush=True)
    print(f"{len(CASES) - failures}/{len(CASES)} passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(interpret() if sys.argv[1:] == ["interpret"] else 2)

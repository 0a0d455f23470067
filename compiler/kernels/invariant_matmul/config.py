"""Launch configuration of the batch-invariant matmul (kernel.py): what decides a row's arithmetic, and what may
vary with the number of rows.

A row's result depends only on (K, k_split, block_k) and the MMA instruction the tiles lower to: the K range is
cut into splits of `k_split` elements (a function of the weight's shape, never of the rows), each split is a
sequential walk of `block_k`-wide dots into a zeroed fp32 accumulator, and the splits' sums are added in split
order. Whether those splits run in separate programs (partials summed afterwards, for few rows: parallelism
along K) or one after another inside one program (many rows: no partials written) does not change a bit.

`block_m` / `num_warps` stay fixed so every tile lowers to the same wgmma shape (m64 per warpgroup); `block_n`
is fixed per weight too. Both are part of `InvariantMatmulConfig` and never depend on the row count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# programs wanted on the device for a decode-sized call (132 SMs on the H200, ~2 waves)
TARGET_PROGRAMS = 264
# the largest row count that still runs splits as separate programs; above it one program walks every split
SPLIT_PROGRAM_MAX_ROWS = 256


@dataclass(frozen=True)
class InvariantMatmulConfig:
    block_m: int = 64  # one warpgroup's wgmma m64 per 4 warps
    block_n: int = 64
    block_k: int = 64
    k_split: int = 512  # elements of K per split (a multiple of block_k)
    num_warps: int = 4
    num_stages: int = 4

    def splits(self, k: int) -> int:
        return math.ceil(k / self.k_split)


def pick_config(n: int, k: int) -> InvariantMatmulConfig:
    """The config of a weight [n, k]: block_n and k_split from the weight's shape only, so that a one-row call
    spreads over about TARGET_PROGRAMS programs (column tiles x splits) and no call's rows change a result."""
    block_n = 128 if n >= 8192 else 64
    tiles = math.ceil(n / block_n)
    k_split = 64 * math.ceil(k / 64)  # one split: the whole of K
    for smaller in (4096, 2048, 1024, 512, 256):  # shrink while a one-row call has too few programs
        if smaller >= k_split or tiles * math.ceil(k / k_split) >= TARGET_PROGRAMS:
            continue
        k_split = smaller
    return InvariantMatmulConfig(block_n=block_n, k_split=k_split)


def split_programs(rows: int) -> bool:
    """Whether a call of `rows` rows runs its splits as separate programs (results are the same bits either way)."""
    return rows <= SPLIT_PROGRAM_MAX_ROWS


def launch(
    config: InvariantMatmulConfig, rows: int, n: int, k: int, as_programs: bool, ieee: bool, fmt: str = "dense"
) -> dict:
    """The kernel's grid and constants for one call (kernel.py's parameters after the pointers); fmt: the weight's
    form, "dense" or the GGUF format of its packed planes."""
    splits = config.splits(k)
    return {
        "grid": (math.ceil(rows / config.block_m), math.ceil(n / config.block_n), splits if as_programs else 1),
        "meta": dict(
            M=rows,
            N=n,
            K=k,
            K_SPLIT=config.k_split,
            SPLITS=splits,
            BLOCK_M=config.block_m,
            BLOCK_N=config.block_n,
            BLOCK_K=config.block_k,
            SPLIT_PROGRAMS=as_programs,
            FMT=fmt,
            IEEE=ieee,
        ),
    }

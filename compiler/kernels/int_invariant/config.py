"""What fixes a row's arithmetic in the integer-sum invariant matmul, and what may vary with the number of rows.

A row's result is fixed by `IntInvariantConfig` alone, a function of the weight's shape: K is cut into splits of
`k_split` elements (whole 256-element super-blocks), each split's 32-element blocks are added in increasing order
into an fp32 accumulator that starts at +0, and the splits' sums are added in split order (README.md,
"Arithmetic"). Everything else is a launch choice that moves no bit: the GEMV's rows per program (R) and column
tile, the GEMM's tile sizes, warps and stages, whether splits run as programs (partials summed afterwards) or one
after another in one program, and which of the two kernels runs (`GEMV_MAX_ROWS`). The integer block sums are
exact whatever instruction computes them (dp4a, an int8 MMA of any shape), and each float operation is one IEEE
operation on operands that do not depend on the tile (README.md, "Why the bits agree").

The launch tables below are first guesses, to be measured (tools/dev/bench_int_invariant.py): no GPU has run them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SUPER_BLOCK = 256  # K-quant super-block: a split never cuts one
BLOCK = 32  # activation block: one int8 scale, one integer sum per weight block (Q6_K: two halves of 16)
FORMATS = ("q4_k", "q6_k")

# programs wanted for a one-row GEMV (132 SMs on the H100 / H200, ~2 waves), the heuristic behind k_split
TARGET_PROGRAMS = 264
# column tile the k_split heuristic assumes (the GEMV's default block_n); the heuristic only reads the weight's shape
HEURISTIC_BLOCK_N = 32
# the largest row count the GEMV takes; the GEMM above (the same bits: a speed choice, unmeasured)
GEMV_MAX_ROWS = 16


@dataclass(frozen=True)
class IntInvariantConfig:
    """A row's arithmetic: K split every `k_split` elements (a multiple of 256), splits added in order."""

    k_split: int

    def splits(self, k: int) -> int:
        return math.ceil(k / self.k_split)

    def bounds(self, k: int) -> list[tuple[int, int]]:
        """[(start, stop)] of each split along K, in the order their sums are added."""
        return [(start, min(start + self.k_split, k)) for start in range(0, k, self.k_split)]


def pick_config(n: int, k: int) -> IntInvariantConfig:
    """The config of a weight [n, k] (k a multiple of 256): the whole of K in one split, shrunk while a one-row
    GEMV would have fewer than TARGET_PROGRAMS programs (column tiles x splits). The weight's shape only: never the
    rows, so a decode row and a prompt token add the same splits."""
    if k % SUPER_BLOCK:
        raise ValueError(f"int_invariant: K = {k} is not a multiple of {SUPER_BLOCK}")
    tiles = math.ceil(n / HEURISTIC_BLOCK_N)
    k_split = k
    for smaller in (4096, 2048, 1024, 512, 256):
        if smaller >= k_split or tiles * math.ceil(k / k_split) >= TARGET_PROGRAMS:
            continue
        k_split = smaller
    return IntInvariantConfig(k_split=k_split)


@dataclass(frozen=True)
class GemvLaunch:
    """The GEMV's launch (gemv_kernel.py): R activation rows per program (a power of two <= 8), block_n columns."""

    rows_per_program: int = 4
    block_n: int = HEURISTIC_BLOCK_N
    num_warps: int = 4
    num_stages: int = 1


@dataclass(frozen=True)
class GemmLaunch:
    """The GEMM's launch (gemm_kernel.py): a block_m x block_n output tile per program (>= 16 each: tl.dot)."""

    block_m: int = 64
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3


def pick_gemv_launch(rows: int) -> GemvLaunch:
    return GemvLaunch(rows_per_program=min(8, 1 << max(rows - 1, 0).bit_length()))


def pick_gemm_launch(rows: int) -> GemmLaunch:
    """No spills in ptxas for sm_90 (tools/dev/ptxas.py: Q4_K 168 / 178 registers, Q6_K 223 / 235); a 128 x 128
    tile with 8 warps spills (the int32 dot result, the fp32 term and the accumulator are each a tile of registers).
    Speed unmeasured."""
    if rows <= 64:
        return GemmLaunch(block_m=64, block_n=64, num_warps=4)
    return GemmLaunch(block_m=128, block_n=64, num_warps=8)


def gemv_plan(fmt: str, config: IntInvariantConfig, rows: int, n: int, k: int, launch: GemvLaunch, asm: bool) -> dict:
    """Grid and constants of one GEMV call: grid (row groups, column tiles, splits); out [splits, rows, n] fp32."""
    check(fmt, n, k, config)
    r = launch.rows_per_program
    splits = config.splits(k)
    return {
        "grid": (math.ceil(rows / r), math.ceil(n / launch.block_n), splits),
        "out_shape": (splits, rows, n),
        "meta": dict(M=rows, N=n, K=k, K_SPLIT=config.k_split, R=r, BLOCK_N=launch.block_n, Q6=fmt == "q6_k", ASM=asm),
    }


def gemm_plan(fmt: str, config: IntInvariantConfig, rows: int, n: int, k: int, launch: GemmLaunch, asm: bool) -> dict:
    """Grid and constants of one GEMM call: grid (row tiles, column tiles); each program walks every split."""
    check(fmt, n, k, config)
    if min(launch.block_m, launch.block_n) < 16:
        raise ValueError("int_invariant GEMM: block_m and block_n must be >= 16 (tl.dot)")
    return {
        "grid": (math.ceil(rows / launch.block_m), math.ceil(n / launch.block_n), 1),
        "out_shape": (rows, n),
        "meta": dict(
            M=rows,
            N=n,
            K=k,
            K_SPLIT=config.k_split,
            SPLITS=config.splits(k),
            BLOCK_M=launch.block_m,
            BLOCK_N=launch.block_n,
            Q6=fmt == "q6_k",
            ASM=asm,
        ),
    }


def check(fmt: str, n: int, k: int, config: IntInvariantConfig) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"int_invariant takes {' / '.join(FORMATS)} weights, got {fmt}")
    if k % SUPER_BLOCK or config.k_split % SUPER_BLOCK or config.k_split < SUPER_BLOCK:
        raise ValueError(f"int_invariant: K = {k} and k_split = {config.k_split} must be multiples of {SUPER_BLOCK}")

"""Tuned launch configurations of the quantized GEMV kernels, per format and shape class.

A table of rules, first match wins; `tools/dev/bench_quant_matmul.py --sweep` measures candidate
configurations on the GPU and prints the best per shape, which is what the table should say.
The starting values follow the decode roofline: enough programs to cover the 132 SMs of an H200
several times (split-K when `out` is small and `in` is long), and enough bytes in flight per SM.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ember.compiler.targets.policy import kernel_policy

# Decode (m <= 4) picks the "rows" kernels (gguf_gemv/rows_*.py) while the policy's quant_gemv.rows_for_decode,
# the "split" kernels otherwise (read at every pick_config call). One activation row on the projection shapes
# of the benchmark models takes MEASURED_M1 (the H200 sweep's best); the other shapes and m = 2..4 take the
# rows rules below, sized by register count, not measured.
DP4A_FORMATS = ("q4_k", "q6_k")  # the formats the integer-dot kernel (dp4a.py) has


def rows_for_decode() -> bool:
    return kernel_policy().quant_gemv.rows_for_decode


def dp4a_for(fmt: str) -> bool:
    """Whether decode GEMVs of `fmt` weights take the integer-dot kernel (policy quant_gemv.dp4a_formats)."""
    return fmt in DP4A_FORMATS and fmt in kernel_policy().quant_gemv.dp4a_formats


@dataclass(frozen=True)
class QuantMatmulConfig:
    block_n: int = 64  # output rows per program (a power of two; split: >= 16, rows: 4..512)
    split_k: int = 1  # programs along `in`; their fp32 partial sums are added by XLA (both variants)
    num_warps: int = 4
    num_stages: int = 3  # software-pipelining depth of the block loop
    blocks_per_step: int = 8  # Q8_0 only: 32-element blocks per loop iteration (unrolled)
    use_dot: bool | None = None  # tensor-core tl.dot; None: only when m > 1
    variant: str = "split"  # "split": gguf_gemv/split_kernel.py; "rows": gguf_gemv/rows_*.py (m <= 4); "dp4a": Q4_K
    # on int8 activations (gguf_gemv/dp4a_kernel.py, the rows fields below apply)
    sb_per_step: int = 2  # "rows" only: super-blocks per loop step, loaded together (a power of two
    # <= 16; Q8_0: 8 blocks of 32 per super-block, the same elements per step)
    prefetch: bool = True  # "rows" only: issue the next step's loads before this step's math

    def dot_for(self, m: int) -> bool:
        return self.use_dot if self.use_dot is not None else m > 1


@dataclass(frozen=True)
class ConfigRule:
    """Applies to `format` (or "*") when m <= max_m and out/in fall in [min, max)."""

    format: str
    config: QuantMatmulConfig
    max_m: int = 1 << 30
    min_out: int = 0
    max_out: int = 1 << 62
    min_in: int = 0
    max_in: int = 1 << 62

    def matches(self, fmt: str, m: int, out: int, inner: int) -> bool:
        return (
            self.format in ("*", fmt)
            and m <= self.max_m
            and self.min_out <= out < self.max_out
            and self.min_in <= inner < self.max_in
        )


def _rows(block_n: int, split_k: int, sb_per_step: int, num_warps: int) -> QuantMatmulConfig:
    # num_stages=1: the rows kernels double-buffer their loads in registers themselves (PREFETCH)
    return QuantMatmulConfig(
        variant="rows", block_n=block_n, split_k=split_k, sb_per_step=sb_per_step, num_warps=num_warps, num_stages=1
    )


# Decode, rows kernels (used while rows_for_decode()). Sizing: a program keeps S x block_n x 128 B of Q4_K
# codes in flight (twice with PREFETCH) and S x block_n / num_warps words plus m times as many fp32
# accumulators per thread, so m = 4 halves the tile; enough programs (>= ~4 per SM of 132) come from
# small tiles and split-K where `out` is small.
ROWS_RULES: tuple[ConfigRule, ...] = (
    # Q8_0: 8 blocks per sb_per_step and 32 one-byte codes per row and block: 4x Q4_K's accumulators per word
    ConfigRule("q8_0", _rows(8, 4, 1, 4), max_m=4, max_out=8192),
    ConfigRule("q8_0", _rows(16, 1, 1, 4), max_m=1),
    ConfigRule("q8_0", _rows(8, 1, 1, 4), max_m=4),
    # Q5_0: the same frame and accumulators as Q8_0 (its tiles, not timed on the GPU yet)
    ConfigRule("q5_0", _rows(8, 4, 1, 4), max_m=4, max_out=8192),
    ConfigRule("q5_0", _rows(16, 1, 1, 4), max_m=1),
    ConfigRule("q5_0", _rows(8, 1, 1, 4), max_m=4),
    ConfigRule("*", _rows(8, 4, 1, 2), max_m=4, max_out=1024),  # k/v-sized outputs
    ConfigRule("*", _rows(16, 8, 1, 4), max_m=4, max_out=8192, min_in=8192),  # long `in` (down)
    ConfigRule("*", _rows(16, 4, 2, 4), max_m=1, max_out=8192),  # out ~ in
    ConfigRule("*", _rows(16, 4, 1, 4), max_m=4, max_out=8192),
    ConfigRule("*", _rows(32, 1, 2, 4), max_m=1),  # long out (gate/up, head)
    ConfigRule("*", _rows(32, 1, 1, 4), max_m=4),
)

# (format, out, in) -> the fastest rows config at m = 1 on the H200, each kernel timed inside a CUDA graph as
# a decode step runs it (tools/dev/tune_gemv_graphs.py, 75-160 candidates per shape, the split-K sum included):
# Q4_K (its sub-block-per-vector kernel; docs/results/h200_gemv_graphs_q4k_88ebc20.json),
# Q6_K (docs/results/h200_gemv_graphs_76642d9.json). An earlier sweep timed XLA executables of
# back-to-back custom calls, whose ~10 us dispatch per call hid the kernels' own differences.
MEASURED_M1: dict[tuple[str, int, int], QuantMatmulConfig] = {
    # d 1536, ffn 8960, 2 kv heads: q+k, q+k+v, o, gate+up, down; v, down (Q6_K layers), tied head
    ("q4_k", 1792, 1536): _rows(4, 1, 2, 1),
    ("q4_k", 2048, 1536): _rows(4, 1, 2, 1),
    ("q4_k", 1536, 1536): _rows(4, 1, 4, 2),
    ("q4_k", 17920, 1536): _rows(16, 1, 2, 4),
    ("q4_k", 1536, 8960): _rows(8, 4, 2, 4),
    ("q6_k", 256, 1536): _rows(4, 1, 4, 2),
    ("q6_k", 1536, 8960): _rows(8, 4, 2, 2),
    ("q6_k", 151936, 1536): _rows(64, 1, 1, 4),
    # d 4096, ffn 14336, 8 kv heads: q+k, q+k+v, o, gate+up, down; v, down (Q6_K layers), head
    ("q4_k", 5120, 4096): _rows(8, 1, 2, 4),
    ("q4_k", 6144, 4096): _rows(8, 1, 2, 4),
    ("q4_k", 4096, 4096): _rows(8, 1, 2, 4),
    ("q4_k", 28672, 4096): _rows(16, 3, 1, 2),
    ("q4_k", 4096, 14336): _rows(16, 8, 1, 2),
    ("q6_k", 1024, 4096): _rows(32, 8, 2, 8),
    ("q6_k", 4096, 14336): _rows(64, 8, 1, 8),
    ("q6_k", 128256, 4096): _rows(32, 1, 2, 4),
}


def _dp4a(block_n: int, split_k: int, sb_per_step: int, num_warps: int) -> QuantMatmulConfig:
    return dataclasses.replace(_rows(block_n, split_k, sb_per_step, num_warps), variant="dp4a")


# The dp4a kernel keeps one fp32 accumulator per sub-block (not per word) and row: a quarter of the rows
# kernel's, so its tiles follow the one-row rules up to 8 rows (not measured yet).
DP4A_RULES: tuple[ConfigRule, ...] = (
    ConfigRule("*", _dp4a(8, 4, 1, 2), max_out=1024),
    ConfigRule("*", _dp4a(16, 8, 1, 4), max_out=8192, min_in=8192),
    ConfigRule("*", _dp4a(16, 4, 2, 4), max_out=8192),
    ConfigRule("*", _dp4a(32, 1, 2, 4)),
)
# (format, out, in) -> the fastest dp4a config at m = 1 on the H200, graph-timed by tools/dev/tune_gemv_graphs.py
# --variant dp4a (docs/results/h200_gemv_graphs_dp4a_b4cbc10.json; 106-161 candidates per
# shape; the float rows kernel's pick beside it: 3.78 -> 3.49 us on 1792 x 1536, 12.70 -> 9.20 on 17920 x 1536,
# 10.58 -> 8.65 on 1536 x 8960, 40.30 -> 27.55 on 28672 x 4096, 24.56 -> 18.25 on 4096 x 14336).
# 5120 x 4096 was not timed: it takes 6144 x 4096's.
DP4A_M1: dict[tuple[str, int, int], QuantMatmulConfig] = {
    ("q4_k", 1792, 1536): _dp4a(4, 1, 4, 1),
    ("q4_k", 2048, 1536): _dp4a(4, 1, 4, 1),
    ("q4_k", 1536, 1536): _dp4a(4, 1, 4, 1),
    ("q4_k", 17920, 1536): _dp4a(8, 1, 1, 2),
    ("q4_k", 1536, 8960): _dp4a(8, 8, 2, 4),
    ("q4_k", 5120, 4096): _dp4a(8, 1, 4, 1),
    ("q4_k", 6144, 4096): _dp4a(8, 1, 4, 1),
    ("q4_k", 4096, 4096): _dp4a(8, 1, 4, 1),
    ("q4_k", 28672, 4096): _dp4a(8, 1, 1, 2),
    ("q4_k", 4096, 14336): _dp4a(16, 8, 1, 2),
    # Q6_K: the tuner (docs/results/h200_gemv_graphs_dp4a_q6k_f842b9c.json, 31-149 candidates
    # per shape) against the float rows kernel's tiles, split-K sum included: 12.14 -> 9.13 us on 1536 x 8960,
    # 6.73 -> 5.43 on 1024 x 4096 (one split: the pair launch applies), 92.09 -> 73.68 on 151936 x 1536,
    # 29.99 -> 21.00 on 4096 x 14336, 219.48 -> 132.82 on 128256 x 4096. Inside the plan (profile_step,
    # docs/results/h200_plan_alone_*) the first two held (1536 x 8960: 7.35 -> 6.34 us) but the last
    # three did not (51.0 vs 50.2, 15.6 vs 14.4, 123.7 vs 112.7 us): those keep the rows tiles. 256 x 1536
    # kept its tile, the tuner's fastest.
    ("q6_k", 256, 1536): _dp4a(4, 1, 4, 2),
    ("q6_k", 1536, 8960): _dp4a(4, 8, 1, 2),
    ("q6_k", 1024, 4096): _dp4a(4, 1, 4, 1),
    **{
        key: dataclasses.replace(config, variant="dp4a")
        for key, config in MEASURED_M1.items()
        if key in (("q6_k", 151936, 1536), ("q6_k", 4096, 14336), ("q6_k", 128256, 4096))
    },
}

# Shape classes: tiny out (k/v projections), out ~ in (q/o, down), long out (gate/up, LM head).
CONFIG_TABLE: tuple[ConfigRule, ...] = ROWS_RULES + (
    # few output rows: small tiles and split-K so that a few hundred programs exist
    ConfigRule("*", QuantMatmulConfig(block_n=16, split_k=4), max_out=1024),
    # out ~ 1.5-4k with a long `in` (down projections): split-K
    ConfigRule("*", QuantMatmulConfig(block_n=32, split_k=4), max_out=8192, min_in=8192),
    ConfigRule("*", QuantMatmulConfig(block_n=32, split_k=2), max_out=2048, min_in=1024),
    ConfigRule("*", QuantMatmulConfig(block_n=32), max_out=8192),
    # long out (gate/up, LM head): plenty of programs already
    ConfigRule("*", QuantMatmulConfig(block_n=64)),
)


def pick_config(
    fmt: str, m: int, out: int, inner: int, table: tuple[ConfigRule, ...] = CONFIG_TABLE
) -> QuantMatmulConfig:
    """MEASURED_M1's config for one row on a measured shape, else the first matching rule's config; the rows
    variant is skipped unless rows_for_decode(). Formats that take the integer-dot kernel (dp4a_for): DP4A_M1 /
    DP4A_RULES."""
    if dp4a_for(fmt) and table is CONFIG_TABLE:
        if m == 1 and (fmt, out, inner) in DP4A_M1:
            return DP4A_M1[(fmt, out, inner)]
        for rule in DP4A_RULES:
            if rule.matches(fmt, m, out, inner):
                return rule.config
    if rows_for_decode() and m == 1 and table is CONFIG_TABLE and (fmt, out, inner) in MEASURED_M1:
        return MEASURED_M1[(fmt, out, inner)]
    for rule in table:
        if rule.config.variant == "rows" and not rows_for_decode():
            continue
        if rule.matches(fmt, m, out, inner):
            return rule.config
    return QuantMatmulConfig()

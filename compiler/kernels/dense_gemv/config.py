"""The FP8 decode GEMV's configuration (compiler/kernels/dense_gemv/kernel.py): its tile config, the measured rules
that pick one per shape, and the static launch plan of a call. Pure Python, testable on any machine."""

from __future__ import annotations

from dataclasses import dataclass

from ember.compiler.kernels.config_override import overridden
from ember.compiler.kernels.dense_gemv.fp8 import BLOCK  # MAX_ROWS: fp8_linear's dispatch bound
from ember.compiler.kernels.dense_gemv.fp8 import GEMV_MAX_ROWS as MAX_ROWS
from ember.compiler.targets.policy import kernel_policy

DOT_BLOCK_M = 16  # tl.dot needs >= 16 rows: activations are padded (masked) to 16


@dataclass(frozen=True)
class Fp8GemvConfig:
    block_n: int = 32  # output rows per program (power of two <= 256; use_dot: >= 16)
    block_k: int = 256  # `in` columns per loop step (power of two 16..1024): block_k bytes per row per step
    split_k: int = 1  # programs along `in`; > 1: fp32 partials summed by XLA (clamped: no empty split)
    num_warps: int = 4
    num_stages: int = 1  # software-pipelining depth (cp.async stages; only the use_dot loop gets them)
    use_dot: bool = False  # tensor-core tl.dot on x padded to 16 rows; False: CUDA-core FMAs
    prefetch: bool = True  # CUDA cores: load the next step's tile before this step's math
    step_reduce: bool = False  # CUDA cores: sum each step's products per 16-column chunk (small accumulator)
    words: bool = False  # CUDA cores on 4-byte words (_word_sum; needs in % 4 == 0): ~3x fewer instructions


@dataclass(frozen=True)
class Fp8Rule:
    """Applies when m <= max_m, min_out <= out < max_out and min_in <= inner < max_in, and the word loop only
    where `in` is a multiple of 4 (first match wins). config None (dense_gemv.DENSE_RULES): the shape keeps
    XLA's GEMM."""

    config: Fp8GemvConfig | None
    max_m: int = MAX_ROWS
    max_out: int = 1 << 62
    min_in: int = 0
    max_in: int = 1 << 62
    min_out: int = 0

    def matches(self, m: int, out: int, inner: int) -> bool:
        return (
            m <= self.max_m
            and self.min_out <= out < self.max_out
            and self.min_in <= inner < self.max_in
            and not (self.config is not None and self.config.words and inner % 4)
        )


_C = Fp8GemvConfig
# Sizing (H200: 132 SMs, ~30 KB of loads in flight per SM to cover HBM latency): a step's tile is
# block_n x block_k bytes (8 KB at 16 x 512), twice that with the prefetch, and several programs per SM
# (ptxas: ~126 registers per thread at 16 x 512 with step_reduce, m <= 2: 4 programs of 4 warps per SM);
# the grid should hold >= ~4 programs per SM, so short `out` with long `in` splits K. The full-width
# CUDA-core accumulator (step_reduce False) costs m_pow2 x block_n x block_k / (32 num_warps) registers per
# thread and spills at m = 4, so 3+ rows take the tensor cores (cp.async stages, ~55 registers). Best guesses
# from the register counts where `tools/dev/bench_fp8_gemv.py --sweep` has not measured them (m > 1).
FP8_RULES: tuple[Fp8Rule, ...] = (
    # 1 row, `in` a multiple of 4: the word loop, 1.05-1.17x the byte loop alone and 3.03 -> 2.81 ms for the 8B
    # step (docs/results/h200_fp8_gemv_words_69b267c.json, h200_plan_alone_fp8_cdca500.json); 8 x 1024 tiles
    # were best at 6144x4096, 4 x 1024 at 4096x4096 and 28672x4096 (4096x14336: 21.4 vs 22.1 us, within noise)
    Fp8Rule(_C(block_n=8, block_k=1024, words=True), max_m=1, max_out=8192, max_in=8192),
    Fp8Rule(_C(block_n=4, block_k=1024, words=True), max_m=1),
    # 1 row, the byte loop (`in` not a multiple of 4; policy fp8_gemv.words off): the H200 sweep's best at 28672x4096,
    # 4096x14336 and 6144x4096 (3-14% ahead of 16 x 512 split-K)
    Fp8Rule(_C(block_n=8, block_k=1024, step_reduce=True), max_m=1),
    # 2 rows: CUDA cores, each weight tile reused by both rows (not measured yet)
    Fp8Rule(_C(block_n=16, block_k=512, split_k=4, step_reduce=True), max_m=2, max_out=8192, min_in=8192),
    Fp8Rule(_C(block_n=16, block_k=512, split_k=2, step_reduce=True), max_m=2, max_out=8192),
    Fp8Rule(_C(block_n=16, block_k=512, step_reduce=True), max_m=2),
    # 3-16 rows: tensor cores (x padded to 16 rows)
    Fp8Rule(_C(block_n=32, block_k=256, split_k=4, use_dot=True, num_stages=3), max_out=8192),
    Fp8Rule(_C(block_n=64, block_k=256, use_dot=True, num_stages=3)),
)


def pick_fp8_config(
    m: int, out: int, inner: int, *, blocked: bool = False, rules: tuple[Fp8Rule, ...] = FP8_RULES
) -> Fp8GemvConfig:
    """The first matching rule's config (block scales take the same tiles for now). For side-by-side
    measurements (the kernel policy, read at trace time): fp8_gemv.words off skips the word loop's rules;
    fp8_gemv.config ({"block_n": 8, "prefetch": 0}) overrides fields of the one-row config."""
    del blocked  # same table for now; kept so a measured table can tell the layouts apart
    policy = kernel_policy().fp8_gemv
    words = policy.words
    for rule in rules:
        if rule.config.words and not words:
            continue
        if rule.matches(m, out, inner):
            return overridden(rule.config, policy.config, "fp8_gemv.config") if m == 1 else rule.config
    return Fp8GemvConfig()


def launch_plan(m: int, out: int, inner: int, config: Fp8GemvConfig, *, blocked: bool, gate_up: bool = False) -> dict:
    """The static launch parameters of one call (grid, split count, kernel constexprs); pure, testable on CPU.
    gate_up: the weight packs gate and up (out = 2 ffn rows) and the call writes silu(gate) * up [m, ffn]:
    per-channel scales, one K split, an even block_n (each program's rows half gate, half up)."""
    if not 1 <= m <= MAX_ROWS:
        raise ValueError(f"the FP8 GEMV takes 1..{MAX_ROWS} activation rows, got {m}")
    if out < 1 or inner < 1:
        raise ValueError(f"empty weight {out}x{inner}")
    if out * inner >= 2**31:
        raise ValueError(f"a {out}x{inner} weight has >= 2**31 elements; int32 offsets overflow")
    bn, bk = config.block_n, config.block_k
    if bn < 1 or bn & (bn - 1) or bn > 256:
        raise ValueError(f"block_n must be a power of two <= 256, got {bn}")
    if bk < 16 or bk & (bk - 1) or bk > 1024:  # a power of two: divides 128 or is a multiple of it
        raise ValueError(f"block_k must be a power of two in [16, 1024], got {bk}")
    if config.use_dot and bn < 16:
        raise ValueError(f"use_dot needs block_n >= 16, got {bn}")
    if blocked and bn > BLOCK:  # a tile's rows must share one scale row
        raise ValueError(f"block scales need block_n <= {BLOCK}, got {bn}")
    if config.split_k < 1:
        raise ValueError(f"split_k must be >= 1, got {config.split_k}")
    if gate_up and not gate_up_fits(out, config, blocked=blocked):
        raise ValueError(
            f"the gate/up epilogue needs per-channel scales, split_k 1, block_n >= 2 and an even "
            f"row count, got blocked={blocked}, split_k={config.split_k}, block_n={bn}, out={out}"
        )
    if config.words and (config.use_dot or inner % 4):
        raise ValueError(
            f"words is a CUDA-core loop over 4-byte words: needs use_dot off and in % 4 == 0, got "
            f"use_dot={config.use_dot}, in={inner}"
        )
    steps = -(-inner // bk)
    split_k = min(config.split_k, steps)
    per_split = -(-steps // split_k)
    split_k = -(-steps // per_split)  # no empty splits
    block_m = DOT_BLOCK_M if config.use_dot else 1 << (m - 1).bit_length()
    ks = min(bk, BLOCK) if blocked and config.use_dot else bk
    meta = dict(
        M=m,
        N=out,
        K=inner,
        BLOCK_M=block_m,
        BLOCK_N=bn,
        BLOCK_K=bk,
        KS=ks,
        K_PER_SPLIT=per_split * bk,
        BLOCKED=blocked,
        USE_DOT=config.use_dot,
        PREFETCH=config.prefetch and per_split > 1,
        STEP_REDUCE=config.step_reduce,
        WORDS=config.words,
        GATE_UP=gate_up,
    )
    return {"grid": (-(-out // bn), split_k, 1), "split_k": split_k, "meta": meta}


def gate_up_fits(out: int, config: Fp8GemvConfig, *, blocked: bool) -> bool:
    """Whether a gate/up weight of `out` rows can take the silu(gate) * up epilogue (launch_plan's gate_up):
    per-channel scales, one K split, an even block_n of at least 2 rows, an even row count."""
    return not blocked and config.split_k == 1 and config.block_n >= 2 and out % 2 == 0

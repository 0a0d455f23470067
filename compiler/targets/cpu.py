"""The cpu target: XLA CPU in fp32, every op its `jnp` reference except the projections of GGUF weights, which stay
codes + block scales (their exact values) multiplied by a native kernel (compiler/kernels/cpu_gemv/):
CPU_NIBBLE_BLOCKS (Q4_K's codes two per byte, the other formats' int8), the default since the kernel decodes ~2x
faster than the fp32 weights and the nibbles ~9% faster than int8 codes (docs/cpu_target.md).
`--precision exact` dequantizes every weight to fp32 at load (agrees with HF to 1e-4)."""

import dataclasses

from . import Target
from .policy import (
    AttentionPolicy,
    DenseGemvPolicy,
    DeterministicPolicy,
    Fp8GemvPolicy,
    GatedDeltaPolicy,
    KernelPolicy,
    MoePolicy,
    NormPolicy,
    QuantGemvPolicy,
    SplitPolicy,
    WeightPolicy,
)

_K = "ember.compiler.kernels"

# The default: GGUF weights kept as int8 codes + block scales (cpu_gemv/layout.py), ~1.25 bytes per weight instead
# of fp32's 4 (XLA fuses no dequantization into its dot, so the native kernel multiplies them:
# docs/results/cpu_matmul_probe.json). On the 2-core AVX2 development machine the 1.5B Q4_K_M decodes ~2x faster
# with it than with fp32 weights, at a quarter of the memory (docs/cpu_target.md; docs/results/cpu_kernel_ab.json).
# Where no C++ compiler can build the kernel its jnp form runs (correct, several times slower).
CPU_INT8_BLOCKS = WeightPolicy(quantized_formats=("q4_k", "q6_k", "q8_0", "q5_0"), kept_layout="int8_blocks")
# ...with Q4_K's codes (0..15) two per byte: 0.75 instead of 1.25 bytes per Q4_K weight, the same outputs bit for
# bit (the kernel unpacks them to the same int16 codes); batch-1 decode 8.33 against 7.61 tok/s (median, the 1.5B
# Q4_K_M, interleaved in one process: docs/results/cpu_nibble_ab.json)
CPU_NIBBLE_BLOCKS = dataclasses.replace(CPU_INT8_BLOCKS, kept_layout="nibble_blocks")
# every weight fp32 (what `--precision exact` gives; `--kernel-policy` with these weights fields also selects it)
CPU_FP32_WEIGHTS = WeightPolicy(quantized_formats=(), dense_copies=False)

CPU = Target(
    name="cpu",
    description="XLA CPU, fp32 reference ops, GGUF weights as int8 / nibble blocks (native kernel)",
    kernels={
        "embedding": f"{_K}.cpu_gemv.linear:embedding",
        "scale": f"{_K}.embedding:scale",
        "select_rows": f"{_K}.embedding:select_rows",
        "add": f"{_K}.embedding:add",
        "rms_norm": f"{_K}.norm.reference:rms_norm",
        "add_rms_norm": f"{_K}.norm.reference:add_rms_norm",
        "linear": f"{_K}.cpu_gemv.linear:linear",
        "linear_split": f"{_K}.cpu_gemv.linear:linear_split",
        "split_heads": f"{_K}.dense_gemv.reference:split_heads",
        "gated_act": f"{_K}.activation:gated_act",
        "gated_act_packed": f"{_K}.activation:gated_act_packed",
        "rope_apply": f"{_K}.rope.reference:rope",
        # reads only the chunks of the table the step's contexts reach (the reference reads max_model_len)
        "attention": f"{_K}.attention.chunked:paged_attention_chunked",
        "split_at": f"{_K}.activation:split_at",
        "sigmoid_gate": f"{_K}.activation:sigmoid_gate",
        "gated_rms_norm": f"{_K}.gated_delta.op:gated_rms_norm_heads",
        "gated_delta": f"{_K}.gated_delta.op:gated_delta",
        "moe": f"{_K}.moe.op:moe",
    },
    # the deterministic variant's batch-invariant kernels (docs/kernel_policy.md, "Batch invariance")
    deterministic_kernels={
        # the int8-block kernel at every row count (batch-invariant); XLA's GEMM for float weights (from 2 rows)
        "linear": f"{_K}.cpu_gemv.linear:linear_invariant",
        "linear_split": f"{_K}.cpu_gemv.linear:linear_split_invariant",
        "attention": f"{_K}.attention.blockwise:paged_attention_blockwise",
        "rms_norm": f"{_K}.norm.reference:rms_norm_invariant",
        "add_rms_norm": f"{_K}.norm.reference:add_rms_norm_invariant",
        # Gated DeltaNet's output norm with its sum in a fixed order (its scan is per token already)
        "gated_rms_norm": f"{_K}.gated_delta.op:gated_rms_norm_heads_invariant",
        # the router's softmax and the experts' weighted combine in fixed orders
        "moe": f"{_K}.moe.op:moe_invariant",
    },
    activation_dtype="float32",
    # Few buckets: on CPU a decode step costs what its weights cost to read whatever the row count,
    # and every bucket is one more XLA compile (~10-20 s for a 1.5B model on 2 cores).
    decode_buckets=(1, 4, 16, 64),
    prefill_buckets=(32, 128, 512),
    # a one-row decode and prompts of up to 32 and 128 tokens (a chat turn with its template) before ready,
    # the rest after: each fp32 1.5B shape is a ~10-30 s XLA compile cold on 2 cores, and a short prompt padded
    # to 128 tokens prefills ~4x slower than in its own 32 (docs/cpu_target.md, "Startup")
    ready_shapes=((1, 0), (0, 32), (0, 128)),
    # no Triton kernel, nothing fused; GGUF weights int8 blocks, through the native kernel up to gemv_max_rows
    # rows; above (the 512-token prefill chunks), dequantized per call for XLA's GEMM. On the Zen 4 machine the
    # kernel beats dequantize + GEMM up to 128 rows (prefill of 128 tokens 43.7 against 31.1 tok/s through
    # `ember bench`) and loses at 512 (1,024 tokens 42.5 against 55.9): docs/cpu_target_zen4.md
    policy=KernelPolicy(
        quant_gemv=QuantGemvPolicy(
            backend="reference",
            gemv_max_rows=128,
            rows_for_decode=False,
            dp4a_formats=(),
            pair_launch=False,
            split_k_partials=False,
        ),
        fp8_gemv=Fp8GemvPolicy(enabled=False),
        dense_gemv=DenseGemvPolicy(enabled=False),
        attention=AttentionPolicy(fused_rope=False, fused_rope_decode=False, fused_combine_quant=False),
        norms=NormPolicy(triton=False, fused_quant=False),
        split=SplitPolicy(triton=False),
        gated_delta=GatedDeltaPolicy(triton=False),
        moe=MoePolicy(triton=False),
        weights=CPU_NIBBLE_BLOCKS,
        # the int8-block kernel computes a row the same way at any row count; the blockwise attention (its
        # q/k/v behind a barrier) and the sampler's row reductions are batch-invariant by construction; a
        # one-row float matmul, which XLA CPU runs as a GEMV rounding unlike its GEMM, gets a zero second row
        # (linear_invariant; tests/test_deterministic_cpu.py): deterministic steps take the default buckets
        deterministic=DeterministicPolicy(bucketed=True, min_rows=1, run_ahead=True),
    ),
)

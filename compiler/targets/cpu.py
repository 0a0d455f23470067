"""The cpu target: every op runs its `jnp` reference under XLA CPU, in fp32 (exact against HF)."""

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
)

_K = "ember.compiler.kernels"

CPU = Target(
    name="cpu",
    description="XLA CPU, fp32 reference ops",
    kernels={
        "embedding": f"{_K}.embedding:embedding",
        "scale": f"{_K}.embedding:scale",
        "select_rows": f"{_K}.embedding:select_rows",
        "add": f"{_K}.embedding:add",
        "rms_norm": f"{_K}.norm.reference:rms_norm",
        "add_rms_norm": f"{_K}.norm.reference:add_rms_norm",
        "linear": f"{_K}.dense_gemv.reference:linear",
        "linear_split": f"{_K}.dense_gemv.reference:linear_split",
        "split_heads": f"{_K}.dense_gemv.reference:split_heads",
        "gated_act": f"{_K}.activation:gated_act",
        "gated_act_packed": f"{_K}.activation:gated_act_packed",
        "rope_apply": f"{_K}.rope.reference:rope",
        "attention": f"{_K}.attention.reference:paged_attention",
        "split_at": f"{_K}.activation:split_at",
        "sigmoid_gate": f"{_K}.activation:sigmoid_gate",
        "gated_rms_norm": f"{_K}.gated_delta.op:gated_rms_norm_heads",
        "gated_delta": f"{_K}.gated_delta.op:gated_delta",
        "moe": f"{_K}.moe.op:moe",
    },
    # the deterministic variant's batch-invariant kernels (docs/kernel_policy.md, "Batch invariance")
    deterministic_kernels={
        "attention": f"{_K}.attention.blockwise:paged_attention_blockwise",
        "rms_norm": f"{_K}.norm.reference:rms_norm_invariant",
        "add_rms_norm": f"{_K}.norm.reference:add_rms_norm_invariant",
    },
    activation_dtype="float32",
    # Few buckets: on CPU a decode step costs what its weights cost to read whatever the row count,
    # and every bucket is one more XLA compile (~10-20 s for a 1.5B model on 2 cores).
    decode_buckets=(1, 4, 16, 64),
    prefill_buckets=(32, 128, 512),
    # every op its reference: no Triton kernel, nothing fused, every weight dequantized at load
    policy=KernelPolicy(
        quant_gemv=QuantGemvPolicy(
            backend="reference", rows_for_decode=False, dp4a_formats=(), pair_launch=False, split_k_partials=False
        ),
        fp8_gemv=Fp8GemvPolicy(enabled=False),
        dense_gemv=DenseGemvPolicy(enabled=False),
        attention=AttentionPolicy(fused_rope=False, fused_rope_decode=False, fused_combine_quant=False),
        norms=NormPolicy(triton=False, fused_quant=False),
        split=SplitPolicy(triton=False),
        gated_delta=GatedDeltaPolicy(triton=False),
        moe=MoePolicy(triton=False),
        # XLA CPU runs a one-row matmul as a GEMV whose sums round unlike its GEMM's; from two rows up the
        # GEMM's row results do not depend on how many rows there are (tests/test_deterministic_cpu.py
        # checks both), the blockwise attention is batch-invariant by construction, the sampler's row
        # reductions too: deterministic steps take the default buckets, never a one-row matmul
        deterministic=DeterministicPolicy(bucketed=True, min_rows=2),
    ),
)

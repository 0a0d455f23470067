"""The h200 target (NVIDIA H200, sm_90): bf16 activations and weights, the decode buckets of a GPU
batch (1 … 256), and kernel choices per op.

Today every op still runs its `jnp` reference under XLA GPU — what the first H200 measurements ran
(README: 194 tok/s batch-1 bf16 decode at the default model's shape). The fused kernels measured so far
(`compiler/ops/quant/`: GGUF GEMV with dequantization inside) are not selected here yet: a jax-triton
launch costs ~9 µs inside a step (tools/results/h200_launch_overhead.json), so they go in per layer,
not per projection.
"""

from .cpu import CPU
from . import Target

H200 = Target(
    name="h200",
    description="NVIDIA H200 (sm_90), XLA GPU, bf16 reference ops",
    kernels={**CPU.kernels,
             # split-K decode and flash prefill over the paged pool, Triton through jax-triton
             "attention": "ember.compiler.ops.attention_gpu.paged:paged_attention"},
    deterministic_kernels=dict(CPU.deterministic_kernels),
    activation_dtype="bfloat16",
    decode_buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
    prefill_buckets=(16, 64, 256, 512, 1024, 2048, 4096),
    # 8 steps per call: the batch-1 engine went from 282 to 444 tok/s, device-bound (profile_step, b5407f0+)
    decode_steps=8,
)

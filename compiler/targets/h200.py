"""The h200 target (NVIDIA H200, sm_90): bf16 activations and weights, the decode buckets of a GPU
batch (1 … 256), and kernel choices per op.

- attention: Triton kernels over the paged KV pool (compiler/kernels/attention/): split-K decode
  (flash-decoding, its partials merged by a combine kernel that can also write the o projection's int8
  activations, on by default: policy attention.fused_combine_quant) and a flash-attention prefill chunk; the
  deterministic variant runs every row through the prefill kernel in one fixed tiling with splits at absolute
  KV positions (attention/invariant.py: batch-invariant).
- projections and the embedding: compiler/kernels/gguf_gemv/linear.py, which runs plain (bf16) weights through the
  reference ops and weights kept GGUF-quantized (Q4_K / Q6_K / Q8_0 / Q5_0) through the Triton GEMVs for
  decode steps of 1-2 rows (Q4_K / Q6_K on int8 activations with dp4a: compiler/kernels/gguf_gemv/dp4a.py), their
  bf16 copies' XLA matmul above; FP8 weights (HF FP8 checkpoints, synthetic `-fp8` models) through
  dense_gemv/fp8.py (one decode row: the word loop of dense_gemv/words.py; packed q/k/v written as three outputs;
  silu(gate) * up in the gate/up GEMV's epilogue, the gated_mlp op of the fuse_gated_mlp pass); bf16 weights
  at one decode row through the same kernels where dense_gemv.DENSE_RULES measured them faster than XLA. Which
  weights stay quantized is `quantized_formats` (FP8, and GGUF
  blocks with a bf16 copy beside them for steps of many rows: `dense_copies`, policy.weights); GGUF expert
  stacks are dequantized at load (kept packed, compiler/kernels/moe/packed.py, with `packed_experts`: opt-in).
- RoPE and the step's K/V write: one Triton kernel (compiler/kernels/rope/kv_write.py, the
  fuse_rope_attention pass) where XLA ran ~5 per layer; on steps whose rows all decode, inside the split
  partials kernel instead (decode.rope_decode_attention; policy attention.fused_rope_decode).
- RMSNorm and residual add + RMSNorm: one Triton kernel each (compiler/kernels/norm/kernel.py) where XLA ran three;
  a norm read by one projection may also write that projection's int8 activations (norm/quant_kernel.py, the
  fuse_norm_into_projection pass; policy norms.fused_quant).
- decode GEMV epilogues / prologues: packed q/k/v written apart with their bias (dp4a parts kernel; a Q4_K q+k
  beside a Q6_K v in one pair launch on one Q4_K packing of the activations), silu(gate) * up made by the down
  projection's activation quantizer (gated_linear, fuse_gated_linear), and the down projection's split-K
  partials summed by the next layer's norm kernel (carry_split_k_partials; policy
  quant_gemv.split_k_partials).
- Gated DeltaNet (compiler/kernels/gated_delta/gpu.py): one fused recurrent Triton kernel per step (conv window,
  L2 norms, beta and g, the delta rule, each request's state in place in its slot) and the gated RMSNorm kernel;
  MoE (compiler/kernels/moe/gpu.py): at decode the fused router and the expert GEMVs, above a grouped GEMM over
  the pairs sorted by expert (policy gated_delta, moe).
- the rest (activations, sampler; RoPE in the deterministic plans) are the `jnp` references, fused by XLA.
- 8 decode steps per device call when the engine can run ahead (runtime/scheduling/lookahead.py).
Triton kernels launch as native XLA kernels (compiler/kernels/triton/launch.py): ~4.5 µs for a small kernel
inside a step, XLA's own fusions ~2.4 µs (docs/results/h200_launch_overhead_xla_triton.json), so a kernel
pays where it does more than the ops it replaces, or replaces several.
"""

from . import Target
from .cpu import CPU
from .policy import DeterministicPolicy, KernelPolicy, WeightPolicy

# GGUF Q4_K / Q6_K / Q8_0 weights stay packed for the decode GEMVs, with a bf16 copy beside each for steps of
# more rows (dense_copies; quant_gemv.dense_copy_gemv_max_rows): on the 1.5B Q4_K_M shape the packed weights
# decoded 707.7 tok/s at batch 1 vs 610.6 for bf16 weights, but 8,173 vs 17,147 at 32 streams (same H200 call;
# compiler/kernels/gguf_gemv/README.md). HF FP8 checkpoints stay FP8 (compiler/kernels/dense_gemv/fp8.py: the Triton GEMV at one row, XLA's
# GEMM fusion of the fp8 operand above). Q5_0 (GGUF's rows that are not whole super-blocks) since its GPU test
# passed (docs/results/h200_gpu_tests_aa12851.json); its speed: docs/results/h200_q5_0_gemv_0130688.json.
# NVFP4 (ModelOpt checkpoints) stays packed too, dequantized inside compiler/kernels/nvfp4/'s Triton matmul (Hopper has
# no FP4 tensor cores: the win is bytes); not yet timed on the GPU.
H200_WEIGHTS = WeightPolicy(
    quantized_formats=("fp8", "q4_k", "q6_k", "q8_0", "q5_0", "nvfp4"),
    dense_copies=True,
    # GGUF expert stacks kept packed (compiler/kernels/moe/packed.py) is an opt-in until its GPU test and bench
    # have run: {"weights.packed_experts": ["q4_k", "q6_k", "q8_0", "q5_0"]}; steps above moe.gemv_max_rows
    # take the packed grouped GEMM (moe/packed_grouped_kernels.py: run in the interpreter, not yet on a GPU)
    packed_experts=(),
)

H200 = Target(
    name="h200",
    description="NVIDIA H200 (sm_90): Triton attention and quantized GEMV kernels, XLA for the rest, bf16",
    kernels={
        **CPU.kernels,
        # split-K decode and flash prefill over the paged pool (Triton kernels, native XLA launches)
        "attention": "ember.compiler.kernels.attention.paged:paged_attention",
        # RoPE on q and k and the K/V write in one kernel, then the same attention kernels
        "rope_attention": "ember.compiler.kernels.attention.paged:rope_paged_attention",
        # the same, its combine also writing the int8 activations of the projection reading it
        # (fuse_norm_into_projection)
        "rope_attention_to_proj": "ember.compiler.kernels.attention.paged:rope_paged_attention_to_proj",
        # weights kept GGUF-quantized: fused dequant GEMV for decode rows, dequant + XLA matmul above
        "linear": "ember.compiler.kernels.gguf_gemv.linear:linear",
        "linear_split": "ember.compiler.kernels.gguf_gemv.linear:linear_split",
        "embedding": "ember.compiler.kernels.gguf_gemv.linear:embedding",
        # act(gate) * up made inside the down projection's activation quantizer (fuse_gated_linear)
        "gated_linear": "ember.compiler.kernels.gguf_gemv.linear:gated_linear",
        # the gate/up projection and the gated down projection as one op (fuse_gated_mlp): FP8 weights
        # make act(gate) * up in the gate/up GEMV's epilogue; other weights run the two ops as before
        "gated_mlp": "ember.compiler.kernels.gguf_gemv.linear:gated_mlp",
        # one program per row where XLA runs the add, the reduce and the scale as three kernels
        "rms_norm": "ember.compiler.kernels.norm.kernel:rms_norm",
        "add_rms_norm": "ember.compiler.kernels.norm.kernel:add_rms_norm",
        # the same, also writing the int8 activations of the one projection reading them
        # (fuse_norm_into_projection)
        "rms_norm_to_proj": "ember.compiler.kernels.norm.quant_kernel:rms_norm_to_proj",
        "add_rms_norm_to_proj": "ember.compiler.kernels.norm.quant_kernel:add_rms_norm_to_proj",
        # Gated DeltaNet: conv, L2 norms, gates and the delta rule in one launch per step, each request's
        # state updated in place in its slot; its output norm with the silu(z) gate in one kernel
        "gated_delta": "ember.compiler.kernels.gated_delta.gpu:gated_delta",
        "gated_rms_norm": "ember.compiler.kernels.gated_delta.gpu:gated_rms_norm_heads",
        # routed experts: at decode (policy moe.gemv_max_rows) the fused router and GEMVs reading only the chosen
        # experts, combined in a fixed order (batch-invariant); more rows: the grouped GEMM (ragged groups)
        "moe": "ember.compiler.kernels.moe.gpu:moe",
    },
    # the deterministic variant: the fixed-tile attention, norms of one program per row (batch-invariant by
    # construction) and every projection through the batch-invariant matmul (its dense copies; split sizes from
    # the weight's shape)
    deterministic_kernels={
        **CPU.deterministic_kernels,
        "attention": "ember.compiler.kernels.attention.invariant:paged_attention_invariant",
        # the Triton norms (one program per row: a row's bits follow its length alone, as the fixed-order
        # reference's do; norms.triton off: that reference)
        "rms_norm": "ember.compiler.kernels.norm.kernel:rms_norm_invariant",
        "add_rms_norm": "ember.compiler.kernels.norm.kernel:add_rms_norm_invariant",
        "linear": "ember.compiler.kernels.invariant_matmul.linear:linear",
        "linear_split": "ember.compiler.kernels.invariant_matmul.linear:linear_split",
        # prompt tokens with a decode row's arithmetic: the recurrent Gated DeltaNet kernel for every token, the
        # MoE decode kernels (per-row router and GEMVs) at every row count
        "gated_delta": "ember.compiler.kernels.gated_delta.gpu:gated_delta_invariant",
        "gated_rms_norm": "ember.compiler.kernels.gated_delta.gpu:gated_rms_norm_heads",  # one program per row
        "moe": "ember.compiler.kernels.moe.gpu:moe_invariant",
    },
    activation_dtype="bfloat16",
    # every kernel family at its GPU default (policy.py's fields name the measurement behind each);
    # deterministic steps take the default buckets: the bucketed engine test gave the same bits alone, beside
    # 7 and 31 requests, in 64-token chunks, on a prefix hit and on a second turn, greedy and sampled, on an
    # H100 at 1b2d820 (docs/kernel_policy.md, "Batch invariance"; docs/results/h100_gpu_tests_1b2d820.json)
    policy=KernelPolicy(weights=H200_WEIGHTS, deterministic=DeterministicPolicy(bucketed=True, run_ahead=True)),
    decode_buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
    prefill_buckets=(16, 64, 256, 512, 1024, 2048, 4096),
    # up to 8 short prompts (<= 512 tokens each) prefilled in one step: at 128-256 concurrent requests one
    # chunk per step admitted request k at step k, so the batch never filled
    prefill_segments=(1, 4, 8),
    # 8 steps per call: the batch-1 engine went from 282 to 444 tok/s, device-bound (profile_step)
    decode_steps=8,
    host_tier_ratio=2.0,  # a 16k-token prompt restored in 0.079 s against 0.208 s recomputed (an H100, e21b80f)
)

"""Attention kernels of the GPU targets, over the paged KV pool of compiler/kernels/attention/reference.py.

decode_kernel.py  Triton split-K decode kernels (imports only triton: the CPU interpreter runs them), on
                  decode_split.py (one program's split: visible range, K/V tiles, online softmax)
decode.py         paged_decode_attention: launch plan, Triton launch, partial combine, jnp emulation
paged.py          paged_attention: the h200 op entry (the reference's signature); prefill plugs in there
                  (attend_prefill_chunk)
prefill*.py       the prefill chunk's flash-attention kernel and its jnp emulation
"""

from ember.compiler.kernels.attention.decode import (
    DecodeAttentionConfig,
    combine_partials,
    decode_launch_plan,
    paged_decode_attention,
    split_k_partials_jnp,
)
from ember.compiler.kernels.attention.paged import paged_attention, paged_attention_emulated

__all__ = [
    "DecodeAttentionConfig",
    "combine_partials",
    "decode_launch_plan",
    "paged_attention",
    "paged_attention_emulated",
    "paged_decode_attention",
    "split_k_partials_jnp",
]

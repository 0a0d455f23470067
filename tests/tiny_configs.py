"""The tiny llama-shaped model config the loading tests build synthetic checkpoints from (small enough for CPU,
with GQA: 4 query heads over 2 KV heads)."""

from __future__ import annotations

TINY_LLAMA = {
    "hidden_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 512,
    "vocab_size": 320,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 512,
}

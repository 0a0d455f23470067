"""Rotary position embedding: frequencies (computed once per layer at load) and their application.

Frequencies follow HF transformers' fp32 arithmetic so the cpu target matches it bit for bit on angles.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np


def inv_frequencies(
    *, theta: float, head_dim: int, scaling: Mapping[str, Any] | None = None, divisors: np.ndarray | None = None
) -> np.ndarray:
    """[head_dim // 2] float32 inverse frequencies, with the checkpoint's rope scaling applied."""
    head_dim = int(head_dim)  # a partial rotary dimension (head_dim * factor) may come as a float
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv = (np.float32(1.0) / (np.float32(theta) ** exponents)).astype(np.float32)
    rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default")) or "default"
    if rope_type == "default":
        pass
    elif rope_type == "linear":
        inv = (inv / np.float32(scaling["factor"])).astype(np.float32)
    elif rope_type == "llama3":
        inv = _llama3(inv, scaling)
    else:
        raise ValueError(f"rope scaling type {rope_type!r} is not supported (supported: default, linear, llama3)")
    if divisors is not None:  # GGUF stores llama3 scaling as per-frequency divisors
        inv = (inv / np.asarray(divisors, dtype=np.float32)).astype(np.float32)
    return inv


def _llama3(inv: np.ndarray, scaling: Mapping[str, Any]) -> np.ndarray:
    factor = float(scaling["factor"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_context = float(scaling["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_context / low, old_context / high
    wavelen = np.float32(2 * math.pi) / inv
    scaled = np.where(wavelen > low_wavelen, inv / np.float32(factor), inv).astype(np.float32)
    smooth = ((old_context / wavelen - low) / (high - low)).astype(np.float32)
    smoothed = ((1 - smooth) * scaled / np.float32(factor) + smooth * scaled).astype(np.float32)
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def rope(q, k, positions, inv_freq, *, style: str):
    # q [N, hq, dh], k [N, hkv, dh], positions [N], inv_freq [r // 2] -> rotated (q, k): the first r of each
    # head's dims rotate (r = dh: all of them; r < dh: partial rotary, the rest pass through)
    rotary = 2 * inv_freq.shape[-1]
    if rotary < q.shape[-1]:
        q_rot, k_rot = rope(q[..., :rotary], k[..., :rotary], positions, inv_freq, style=style)
        return (
            jnp.concatenate([q_rot, q[..., rotary:]], axis=-1),
            jnp.concatenate([k_rot, k[..., rotary:]], axis=-1),
        )
    angles = positions.astype(jnp.float32)[:, None] * inv_freq[None, :].astype(jnp.float32)  # [N, dh/2]
    if style == "neox":  # halves rotate together: (x[:h], x[h:])
        cos = jnp.concatenate([jnp.cos(angles)] * 2, axis=-1)[:, None, :]
        sin = jnp.concatenate([jnp.sin(angles)] * 2, axis=-1)[:, None, :]
        return _rotate_halves(q, cos, sin), _rotate_halves(k, cos, sin)
    if style == "interleaved":  # pairs (x[2i], x[2i+1]) rotate together
        cos, sin = jnp.cos(angles)[:, None, :], jnp.sin(angles)[:, None, :]
        return _rotate_pairs(q, cos, sin), _rotate_pairs(k, cos, sin)
    raise ValueError(f"unknown rope style {style!r}")


def _rotate_halves(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return (x.astype(jnp.float32) * cos + rotated.astype(jnp.float32) * sin).astype(x.dtype)


def _rotate_pairs(x, cos, sin):
    even, odd = x[..., 0::2].astype(jnp.float32), x[..., 1::2].astype(jnp.float32)
    out = jnp.stack([even * cos - odd * sin, even * sin + odd * cos], axis=-1)
    return out.reshape(x.shape).astype(x.dtype)

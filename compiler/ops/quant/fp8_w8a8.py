"""W8A8 for the FP8 decode GEMV (an A/B, off by default): the activation row quantized to e4m3 with a dynamic
per-row scale, so the GEMV's tensor-core loop multiplies e4m3 by e4m3 with no conversion of the weights.

Why measure it: the one-row FP8 GEMV (fp8_gemv_words.py) is bound by converting every weight to f32 on the CUDA
cores (2.4-3.5 TB/s in the 8B step), and converting FP8 tiles to bf16 for a bf16 `mma` was slower still
(tools/results/h200_fp8_gemv_dot_0130688.json). FP8 x FP8 `mma` reads the weights as they are, as vLLM's W8A8
path for FP8-dynamic checkpoints does. It changes the numerics (x rounded to 3 mantissa bits), so it is not
the default; EMBER_FP8_W8A8=1 (read at trace time) turns it on for one-row calls with per-channel scales.

Operands: x [1, in] -> x8 = e4m3(x / sx) with sx = max|x| / 448 (1 for a zero row); the weight's per-channel
scale becomes scale[o] * sx, so the kernel's epilogue (one scale per output) applies both.
"""

from __future__ import annotations

import os

import jax.numpy as jnp

from ..env_config import overridden
from .fp8 import FP8, FP8_MAX, Fp8Weight
from .fp8_gemv_config import Fp8GemvConfig

W8A8_CONFIG = Fp8GemvConfig(block_n=32, block_k=256, use_dot=True, num_stages=4)  # a guess until measured


def use_w8a8(x, w: Fp8Weight, config: Fp8GemvConfig | None) -> bool:
    """EMBER_FP8_W8A8=1, one activation row, per-channel scales and no config forced by the caller."""
    return (os.environ.get("EMBER_FP8_W8A8", "0") == "1" and config is None and x.ndim == 2 and x.shape[0] == 1
            and not w.blocked)


def w8a8_config() -> Fp8GemvConfig:
    """W8A8_CONFIG with EMBER_FP8_GEMV_CONFIG's fields over it (tensor cores whatever the override says)."""
    config = overridden(W8A8_CONFIG, "EMBER_FP8_GEMV_CONFIG")
    return Fp8GemvConfig(**{**config.__dict__, "use_dot": True, "words": False})


def w8a8_operands(x, w: Fp8Weight):
    """(x8 [1, in] e4m3, the GemvWeight whose per-channel scale carries x's scale too)."""
    from .fp8_gemv import GemvWeight

    amax = jnp.max(jnp.abs(x.astype(jnp.float32)))
    sx = jnp.where(amax > 0, amax / FP8_MAX, 1.0)
    x8 = (x.astype(jnp.float32) / sx).astype(FP8)
    return x8, GemvWeight(w.values, w.scale.astype(jnp.float32) * sx, False)

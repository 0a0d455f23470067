"""The KV pools' element types (EngineConfig.kv_cache_dtype, `--kv-cache-dtype`), without importing JAX (the CLI
lists them).

"auto" keeps the plan's activation dtype. "fp8" (alias "fp8_e4m3") stores K and V rounded to float8 e4m3 with
no scale, as vLLM's fp8 cache without calibrated scales: half a bf16 pool's bytes, so twice the tokens in a KV
budget and half the KV bytes a decode step reads; writes saturate at +-448 (compiler/kernels/attention/reference.py
to_pool_dtype) and every attention op widens what it reads exactly (the h200 decode kernel to fp16 for its dots).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

# the fixed ones; "auto" is the plan's activation dtype
_FIXED = {
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float32": np.dtype(np.float32),
    "fp8": np.dtype(ml_dtypes.float8_e4m3fn),
    "fp8_e4m3": np.dtype(ml_dtypes.float8_e4m3fn),
}
KV_CACHE_DTYPES = ("auto", *_FIXED)


def checked_kv_cache_dtype(name: str) -> str:
    """name, if it is one of KV_CACHE_DTYPES; else a ValueError listing them."""
    if name not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype {name!r}: expected one of {', '.join(KV_CACHE_DTYPES)}")
    return name


def is_fp8(kv_cache_dtype: str) -> bool:
    return _FIXED.get(kv_cache_dtype) == np.dtype(ml_dtypes.float8_e4m3fn)


def kv_dtype(activation_dtype, kv_cache_dtype: str = "auto") -> np.dtype:
    """The pools' dtype for a kv_cache_dtype name, given the plan's activation dtype."""
    if checked_kv_cache_dtype(kv_cache_dtype) == "auto":
        return np.dtype(activation_dtype)
    return _FIXED[kv_cache_dtype]

"""Plain Q4_K and Q6_K quantizers (numpy) for the K-quant test fixture.

gguf-py can dequantize K-quants but not write them, and llama.cpp's llama-quantize is C++. These
are simple (no error search like llama.cpp's), derived from the block layouts that gguf-py's
dequantizers read; make_kquant_gguf.py checks every tensor round-trips through gguf-py's
`dequantize` and uses those dequantized values as the model's weights, so the reference is exact
for the file whatever the quantizer's rounding quality.

Super-block: 256 values (QK_K). Rows must be multiples of 256.
  Q4_K, 144 bytes: d f16, dmin f16, 12 bytes of 6-bit (scale, min) for 8 sub-blocks of 32,
                   128 bytes of 4-bit q; x = d * sc * q - dmin * m.
  Q6_K, 210 bytes: 128 bytes low nibbles, 64 bytes 2-bit high parts, 16 int8 scales (one per 16
                   values), d f16; x = d * scale * (q - 32).
"""

from __future__ import annotations

import numpy as np

QK_K = 256


def _blocks(values: np.ndarray) -> np.ndarray:
    flat = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
    assert flat.size % QK_K == 0, "K-quant rows must be multiples of 256"
    return flat.reshape(-1, QK_K)


def _f16(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16)


def quantize_q4_k(values: np.ndarray) -> np.ndarray:
    """float32 [..., k*256] -> uint8 [n_blocks, 144] in Q4_K layout."""
    x = _blocks(values).reshape(-1, 8, 32)  # [n, sub-block, 32]
    low = np.minimum(x.min(axis=-1), 0.0)  # the offset keeps every q >= 0
    spread = x.max(axis=-1) - low
    sub_scale, sub_min = spread / 15.0, -low  # [n, 8]
    d = _f16(sub_scale.max(axis=-1) / 63.0)  # [n]
    dmin = _f16(sub_min.max(axis=-1) / 63.0)
    d32, dmin32 = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    sc = np.clip(np.rint(np.divide(sub_scale, d32, out=np.zeros_like(sub_scale), where=d32 > 0)), 0, 63)
    mn = np.clip(np.rint(np.divide(sub_min, dmin32, out=np.zeros_like(sub_min), where=dmin32 > 0)), 0, 63)
    step = (d32 * sc)[..., None]  # [n, 8, 1]
    shifted = x + (dmin32 * mn)[..., None]
    q = np.clip(np.rint(np.divide(shifted, step, out=np.zeros_like(shifted), where=step > 0)), 0, 15)
    q = q.astype(np.uint8)
    sc, mn = sc.astype(np.uint8), mn.astype(np.uint8)
    # 6-bit packing: bytes 0-3 scales 0-3 (+ top bits of scales 4-7), 4-7 mins 0-3 (+ top bits of
    # mins 4-7), 8-11 low nibbles of scales 4-7 | low nibbles of mins 4-7 << 4.
    packed = np.empty((x.shape[0], 12), dtype=np.uint8)
    packed[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    packed[:, 4:8] = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    packed[:, 8:12] = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)
    # 32-byte chunk i: sub-block 2i in the low nibbles, sub-block 2i+1 in the high nibbles.
    qs = (q[:, 0::2, :] | (q[:, 1::2, :] << 4)).reshape(-1, 128)
    return np.concatenate([d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2), packed, qs], axis=1)


def quantize_q6_k(values: np.ndarray) -> np.ndarray:
    """float32 [..., k*256] -> uint8 [n_blocks, 210] in Q6_K layout."""
    x = _blocks(values)
    n = x.shape[0]
    groups = x.reshape(n, 16, 16)
    group_scale = np.abs(groups).max(axis=-1) / 31.0  # [n, 16]
    d = _f16(group_scale.max(axis=-1) / 127.0)
    d32 = d.astype(np.float32)[:, None]
    scales = np.clip(np.rint(np.divide(group_scale, d32, out=np.zeros_like(group_scale), where=d32 > 0)), 0, 127)
    step = (d32 * scales)[..., None]
    q = np.clip(np.rint(np.divide(groups, step, out=np.zeros_like(groups), where=step > 0)), -32, 31)
    q = (q.astype(np.int16) + 32).astype(np.uint8).reshape(n, 2, 128)  # [n, half, 128]
    low, high = q & 0x0F, q >> 4
    # Per 128-value half h: byte b of its 64 low-nibble bytes holds values b (low) and 64 + b (high);
    # byte c of its 32 high-bit bytes holds bits of values c, 32 + c, 64 + c, 96 + c (2 bits each).
    ql = (low[:, :, :64] | (low[:, :, 64:] << 4)).reshape(n, 128)
    hb = high.reshape(n, 2, 4, 32)
    qh = (hb[:, :, 0] | (hb[:, :, 1] << 2) | (hb[:, :, 2] << 4) | (hb[:, :, 3] << 6)).reshape(n, 64)
    return np.concatenate([ql, qh, scales.astype(np.int8).view(np.uint8), d.view(np.uint8).reshape(-1, 2)], axis=1)


QUANTIZERS = {"Q4_K": quantize_q4_k, "Q6_K": quantize_q6_k}

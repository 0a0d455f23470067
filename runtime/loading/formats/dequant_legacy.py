"""Block decoders for ggml's 32-element quant formats: Q8_0, Q4_0, Q5_0.

Each function takes uint8 blocks [n_blocks, bytes_per_block] and returns
float32 [n_blocks, 32]: the fp16 scale widened to float32 times the integer
code, one rounding, the same as ggml and `gguf.quants` (bit for bit).
"""

from __future__ import annotations

import numpy as np

BLOCK = 32  # elements per block


def fp16_scale(blocks: np.ndarray, start: int) -> np.ndarray:
    """The little-endian fp16 at bytes [start, start+2) of each block, as float32 [n_blocks, 1]."""
    return blocks[:, start : start + 2].view("<f2").astype(np.float32)


def split_nibbles(packed: np.ndarray) -> np.ndarray:
    """uint8 [n, 16] -> uint8 [n, 32]: low nibbles are elements 0..15, high nibbles 16..31."""
    return np.concatenate([packed & np.uint8(0x0F), packed >> np.uint8(4)], axis=1)


def dequantize_q8_0(blocks: np.ndarray) -> np.ndarray:
    """Q8_0, 34 bytes per block.

    bytes 0..1   d   fp16 scale
    bytes 2..33  qs  int8[32], element i = qs[i]
    y[i] = qs[i] * d
    """
    d = fp16_scale(blocks, 0)
    q = blocks[:, 2:34].view(np.int8).astype(np.float32)
    return q * d


def dequantize_q4_0(blocks: np.ndarray) -> np.ndarray:
    """Q4_0, 18 bytes per block.

    bytes 0..1   d   fp16 scale
    bytes 2..17  qs  16 bytes of 4-bit codes: element i (i < 16) is the low nibble
                     of qs[i], element i + 16 the high nibble of qs[i]
    y[i] = d * (code[i] - 8)
    """
    d = fp16_scale(blocks, 0)
    codes = split_nibbles(blocks[:, 2:18])
    q = codes.astype(np.int8) - np.int8(8)
    return d * q.astype(np.float32)


def dequantize_q5_0(blocks: np.ndarray) -> np.ndarray:
    """Q5_0, 22 bytes per block.

    bytes 0..1   d   fp16 scale
    bytes 2..5   qh  32 high bits, a little-endian uint32: bit i is bit 4 of element i
    bytes 6..21  qs  low 4 bits, nibble-packed as in Q4_0
    y[i] = d * (code[i] - 16), code = low | high << 4
    """
    d = fp16_scale(blocks, 0)
    high = np.unpackbits(blocks[:, 2:6], axis=1, bitorder="little")  # [n, 32], bit i of the uint32
    low = split_nibbles(blocks[:, 6:22])
    q = (low | (high << np.uint8(4))).astype(np.int8) - np.int8(16)
    return d * q.astype(np.float32)

"""Block decoders for ggml's K-quants: Q4_K, Q5_K, Q6_K (256-element super-blocks).

Each function takes uint8 blocks [n_blocks, bytes_per_block] and returns
float32 [n_blocks, 256]. A super-block is split into sub-blocks that each have
their own scale (and, for Q4_K/Q5_K, their own minimum). As in ggml, the
sub-block scale is formed first in float32 (`d * sc`), then applied
(`scale * q - dmin * m`). Products of an fp16 value and these small
integers are exact in float32 (Q4_K/Q5_K: 11 + 6 + 5 bits <= 24; Q6_K's
d * scale is exact and only its product with q rounds), so each output is the
exact value rounded once: a float32 kernel matches bit for bit whatever its
evaluation order, with or without FMA.
"""

from __future__ import annotations

import numpy as np

from ember.runtime.loading.formats.dequant_legacy import fp16_scale

QK_K = 256  # elements per super-block

_Q6_HIGH_SHIFTS = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)


def unpack_k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 scale bytes -> (scales, mins), each uint8 [n, 8] of 6-bit values.

    byte 0..3   scale j (j < 4) in bits 0..5; bits 6..7 are bits 4..5 of scale j + 4
    byte 4..7   min j   (j < 4) in bits 0..5; bits 6..7 are bits 4..5 of min j + 4
    byte 8..11  low nibble: bits 0..3 of scale j + 4; high nibble: bits 0..3 of min j + 4
    """
    first = packed[:, 0:4]
    second = packed[:, 4:8]
    third = packed[:, 8:12]
    scales = np.concatenate(
        [first & np.uint8(0x3F), (third & np.uint8(0x0F)) | ((first >> np.uint8(6)) << np.uint8(4))], axis=1
    )
    mins = np.concatenate(
        [second & np.uint8(0x3F), (third >> np.uint8(4)) | ((second >> np.uint8(6)) << np.uint8(4))], axis=1
    )
    return scales, mins


def _low_nibbles_by_subblock(qs: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K's 128 code bytes -> uint8 [n, 8, 32] 4-bit codes per sub-block.

    The bytes come in 4 runs of 32; run r holds sub-block 2r in its low nibbles
    and sub-block 2r + 1 in its high nibbles.
    """
    runs = qs.reshape(qs.shape[0], 4, 1, 32)
    return np.concatenate([runs & np.uint8(0x0F), runs >> np.uint8(4)], axis=2).reshape(qs.shape[0], 8, 32)


def _apply_scale_and_min(blocks: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Shared tail of Q4_K and Q5_K: codes uint8 [n, 8, 32] -> float32 [n, 256]."""
    n = blocks.shape[0]
    d = fp16_scale(blocks, 0)  # [n, 1] super-block scale
    dmin = fp16_scale(blocks, 2)  # [n, 1] super-block scale of the minimums
    sc, m = unpack_k_scales(blocks[:, 4:16])
    scale = (d * sc.astype(np.float32)).reshape(n, 8, 1)
    minimum = (dmin * m.astype(np.float32)).reshape(n, 8, 1)
    return (scale * codes.astype(np.float32) - minimum).reshape(n, QK_K)


def dequantize_q4_k(blocks: np.ndarray) -> np.ndarray:
    """Q4_K, 144 bytes per super-block of 8 sub-blocks x 32 elements.

    bytes 0..1     d       fp16 super-block scale
    bytes 2..3     dmin    fp16 super-block scale of the minimums
    bytes 4..15    scales  8 x (6-bit scale, 6-bit min), see unpack_k_scales
    bytes 16..143  qs      4-bit codes, see _low_nibbles_by_subblock
    y[s, l] = (d * sc[s]) * q[s, l] - (dmin * m[s])
    """
    return _apply_scale_and_min(blocks, _low_nibbles_by_subblock(blocks[:, 16:144]))


def dequantize_q5_k(blocks: np.ndarray) -> np.ndarray:
    """Q5_K, 176 bytes per super-block of 8 sub-blocks x 32 elements.

    bytes 0..1     d       fp16 super-block scale
    bytes 2..3     dmin    fp16 super-block scale of the minimums
    bytes 4..15    scales  as Q4_K
    bytes 16..47   qh      32 bytes: bit s of qh[l] is bit 4 of element l of sub-block s
    bytes 48..175  qs      low 4 bits, laid out as Q4_K's codes
    y[s, l] = (d * sc[s]) * (low | high << 4) - (dmin * m[s])
    """
    n = blocks.shape[0]
    low = _low_nibbles_by_subblock(blocks[:, 48:176])
    high_bits = np.unpackbits(blocks[:, 16:48].reshape(n, 32, 1), axis=2, bitorder="little")  # [n, l, s]
    high = high_bits.transpose(0, 2, 1)  # [n, s, l]
    return _apply_scale_and_min(blocks, low | (high << np.uint8(4)))


def dequantize_q6_k(blocks: np.ndarray) -> np.ndarray:
    """Q6_K, 210 bytes per super-block of 16 sub-blocks x 16 elements.

    bytes 0..127    ql      low 4 bits of the codes
    bytes 128..191  qh      high 2 bits of the codes
    bytes 192..207  scales  int8 per 16-element sub-block
    bytes 208..209  d       fp16 super-block scale
    The super-block is two halves of 128 elements; half h uses ql[64h : 64h+64]
    and qh[32h : 32h+32]. Element 32k + l of a half (k < 4, l < 32) takes
      low  = ql[l] & 15, ql[l+32] & 15, ql[l] >> 4, ql[l+32] >> 4   for k = 0, 1, 2, 3
      high = (qh[l] >> 2k) & 3
    y[i] = (d * scales[i // 16]) * ((low | high << 4) - 32)
    """
    n = blocks.shape[0]
    ql = blocks[:, 0:128].reshape(n, 2, 2, 32)  # [n, half, run of 32 bytes, l]
    low = np.concatenate([ql & np.uint8(0x0F), ql >> np.uint8(4)], axis=2)  # [n, half, k, l]
    qh = blocks[:, 128:192].reshape(n, 2, 1, 32)  # [n, half, 1, l]
    high = (qh >> _Q6_HIGH_SHIFTS) & np.uint8(0x03)  # [n, half, k, l]
    q = ((low | (high << np.uint8(4))).astype(np.int8) - np.int8(32)).reshape(n, 16, 16)
    d = fp16_scale(blocks, 208)  # [n, 1]
    scale = (d * blocks[:, 192:208].view(np.int8).astype(np.float32)).reshape(n, 16, 1)
    return (scale * q.astype(np.float32)).reshape(n, QK_K)

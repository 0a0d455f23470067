"""Activations quantized to int8 for the integer-dot GEMV (gguf_gemv/dp4a_kernel.py), and that GEMV's jnp reference.

Why: the float rows kernel (gguf_gemv/rows_kernel.py) spends ~7.5 sm_90 instructions per Q4_K weight (decode a nibble
into a float, one FMA per activation row), so at batch 1 it runs at 0.3-1.7 TB/s where HBM gives ~4.
With the activations as int8, one `dp4a` multiplies 4 codes by 4 activations and adds them into an int32
(sm_90 SASS of the 1.5B gate+up loop: ~3 instructions per weight, addressing included). ggml's CUDA decode
path (mmvq) does the same.

Quantization (per activation row, per block of 32 consecutive elements of `in`, like ggml's q8_1):
  dx = max |x| / 127, q = rint(x * (127 / max |x|)) in [-127, 127] (q = 0 where the block is all zeros;
  gguf_gemv/act_quant_kernel.py computes the same bits in one kernel, what the GEMV's caller runs on the GPU),
  sx = sum(x) in fp32, exact input (not dx * sum q): it multiplies the Q4_K minimums, so that term keeps
  no activation rounding at all.
Packing (what the kernel loads): block b's 32 int8 go into 8 int32 words qa[m, 8b + 4h + q], in the order
  the weight format's code words sit (PACKINGS). Q4_K (layout.py: word q of a sub-block holds element
  4i + q at nibble i): `word & 0x0F0F0F0F` is elements q, q + 8, q + 16, q + 24 (h = 0) and
  `(word >> 4) & 0x0F0F0F0F` is q + 4, q + 12, q + 20, q + 28 (h = 1), one byte each, so qa's word (h, q)
  holds those elements from low byte to high. Q6_K (ql word q of block n: nibble 2j + h = element
  16h + 4j + q) keeps each half h inside one 16-element sub-block: word (h, q) = elements 16h + 4j + q.

Terms (the policy's quant_gemv.act_terms, read at trace time by every producer; act_terms): with 2, a second int8 term rounds
the first one's residual, r = x - dx q (fp32, the product rounded once), per block the same way:
x ~ dx q + dx' q', |error| <= dx' / 2 <= dx / 254. Its words follow the first term's in the row (qa
[m, 2 k/4], term t at words t k/4 ...) and its factors the first's in the block (da [m, k/32, 8]: dx, sx,
s0, s1, then dx', 0, s0', s1'); sx stays the exact sum of x, so the Q4_K minimum term is taken once. The GEMV
adds one dp4a per word and term (gguf_gemv/dp4a_kernel.py). Why: on real weights the one-term rounding moves the
logits about as much as five bfloat16 roundings would (tools/check_agreement.py --int8-activations; the
H200 figures in tests/test_gpu_engine_real_weights.py), the two-term one as little as the float kernels.

Then for a Q4_K sub-block n (32 weights, w = d sc c - dmin m) and its activation block:
  sum_j w_j x_j ~= (d sc) dx sum_j c_j q_j - (dmin m) sx,
  and for a Q6_K sub-block t = (block b, half h) (16 weights, w = d sc (c - 32)):
  sum_j w_j x_j ~= (d sc) dx_b (sum_j c_j q_j - 32 s_h),
  where the integer sums are exact: |c q| <= 63 * 127, 32 of them < 2**18.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ember.compiler.kernels.gguf_gemv.layout import Q4_K, Q6_K, QuantizedWeight
from ember.compiler.kernels.gguf_gemv.reference import q4_k_parts, q6_k_parts
from ember.compiler.targets.policy import kernel_policy

ACT_BLOCK = 32  # activation elements per scale
FACTORS = 4  # da entries per block and term: dx, sx (the first term's only), s0, s1


def act_terms() -> int:
    """How many int8 terms the producers write (policy quant_gemv.act_terms, read at trace time; 1 or 2)."""
    terms = kernel_policy().quant_gemv.act_terms
    if terms not in (1, 2):
        raise ValueError(f"kernel policy: quant_gemv.act_terms must be 1 or 2, got {terms!r}")
    return terms


def packed_shapes(m: int, k: int, terms: int | None = None) -> tuple[jax.ShapeDtypeStruct, jax.ShapeDtypeStruct]:
    """What a producer of x [m, k]'s int8 activations writes: qa int32 [m, terms k/4], da float32
    [m, k/32, 4 terms]."""
    terms = terms or act_terms()
    return (
        jax.ShapeDtypeStruct((m, terms * k // 4), jnp.int32),
        jax.ShapeDtypeStruct((m, k // ACT_BLOCK, FACTORS * terms), jnp.float32),
    )


def quantize_blocks(x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """x [m, k] -> (q int8 [m, k/32, 32] in element order, dx float32 [m, k/32], sx float32 [m, k/32])."""
    m, k = x.shape
    if k % ACT_BLOCK:
        raise ValueError(f"activation length {k} is not a multiple of {ACT_BLOCK}")
    blocks = x.astype(jnp.float32).reshape(m, k // ACT_BLOCK, ACT_BLOCK)
    amax = jnp.max(jnp.abs(blocks), axis=-1)
    inv = jnp.where(amax > 0, 127.0 / jnp.where(amax > 0, amax, 1.0), 0.0)
    q = jnp.clip(jnp.round(blocks * inv[..., None]), -127, 127).astype(jnp.int8)  # round: ties to even
    return q, amax / 127.0, jnp.sum(blocks, axis=-1)


def quantize_terms(x: jax.Array, terms: int) -> tuple[list[tuple[jax.Array, jax.Array]], jax.Array]:
    """x [m, k] -> ([(q int8 [m, k/32, 32], dx [m, k/32]) per term], sx [m, k/32]): term t + 1 quantizes
    what term t left, x - sum of the earlier terms' dx q (each product and difference rounded in fp32)."""
    m, k = x.shape
    rest, terms_out, sx = x.astype(jnp.float32), [], None
    for _ in range(terms):
        q, dx, total = quantize_blocks(rest)
        sx = total if sx is None else sx
        terms_out.append((q, dx))
        rest = rest - (q.astype(jnp.float32) * dx[..., None]).reshape(m, k)
    return terms_out, sx


# packing order per weight format: where element (h, q, byte j) of a block sits, as [m, block, 32] -> lanes
PACKINGS = {
    # Q4_K (word q of a sub-block: nibble i = element 4i + q): bytes j of word (h, q) = elements 8j + 4h + q
    "q4_k": ((4, 2, 4), (0, 1, 3, 4, 2)),
    # Q6_K (ql word q of block n: nibble 2j + h = element 16h + 4j + q): bytes j of word (h, q) = 16h + 4j + q
    "q6_k": ((2, 4, 4), (0, 1, 2, 4, 3)),
}


def reads_packing(fmt: str, order: str) -> bool:
    """Whether a `fmt` weight's dp4a GEMV reads activations packed in `order`: its own format's, or Q4_K's
    for a Q6_K weight (the kernel permutes the bytes: triton_gemv_dp4a_body.q4_words_as_q6)."""
    return order == fmt or (order, fmt) == ("q4_k", "q6_k")


def quantize_activations(x: jax.Array, order: str = "q4_k", terms: int | None = None) -> tuple[jax.Array, jax.Array]:
    """x [m, k] -> (qa int32 [m, terms k/4] packed for the `order` format's code words, da float32
    [m, k/32, 4 terms] = per term (dx, sx, s0, s1) with s0 / s1 the sums of q over elements 0..15 / 16..31 of
    the block (exact integers; Q6_K's codes carry an offset of 32 that the kernel removes as 32 * s_h per
    sub-block); sx, the exact sum of x, in the first term only (0 in the second)."""
    m, k = x.shape
    parts, sx = quantize_terms(x, terms or act_terms())
    dims, axes = PACKINGS[order]
    words, factors = [], []
    for t, (q, dx) in enumerate(parts):
        lanes = jnp.transpose(q.reshape(m, k // ACT_BLOCK, *dims), axes)  # [m, block, h, q, byte j]
        words.append(jax.lax.bitcast_convert_type(lanes, jnp.int32).reshape(m, k // 4))
        halves = jnp.sum(q.reshape(m, k // ACT_BLOCK, 2, 16).astype(jnp.int32), axis=-1).astype(jnp.float32)
        total = sx if t == 0 else jnp.zeros_like(sx)
        factors.append(jnp.concatenate([dx[..., None], total[..., None], halves], axis=-1))
    return jnp.concatenate(words, axis=-1), jnp.concatenate(factors, axis=-1)


def dp4a_matmul_ref(x: jax.Array, w: QuantizedWeight, terms: int | None = None) -> jax.Array:
    """What the integer-dot GEMV computes, in jnp: x [m, in] -> float32 [m, out], the integer sums exact;
    with `terms` int8 terms (default: act_terms()), the Q4_K minimum term once, on the exact sx."""
    if w.format not in (Q4_K, Q6_K):
        raise ValueError(f"the integer-dot GEMV takes Q4_K or Q6_K weights, got {w.format}")
    parts, sx = quantize_terms(x, terms or act_terms())
    return sum(_term_ref(q, dx, sx if t == 0 else None, w) for t, (q, dx) in enumerate(parts))


def _term_ref(q: jax.Array, dx: jax.Array, sx: jax.Array | None, w: QuantizedWeight) -> jax.Array:
    """One term's sum: q [m, blocks, 32] int8, dx [m, blocks]; sx (the first term's) brings the Q4_K minimums."""
    m = q.shape[0]
    if w.format == Q6_K:
        codes, scale = q6_k_parts(w)  # [sb, out, 16, 16] (0..63), [sb, out, 16]
        nsb = scale.shape[0]
        q = q.reshape(m, nsb, 16, 16).astype(jnp.int32)  # sub-block t = 2 (block) + half
        dots = jnp.einsum("mste,sote->msot", q, codes.astype(jnp.int32)) - 32 * jnp.sum(q, -1)[:, :, None]
        dx = jnp.repeat(dx.reshape(m, nsb, 1, 8), 2, axis=-1)
        return jnp.sum(scale[None] * (dx * dots.astype(jnp.float32)), axis=(1, 3))
    codes, scale, minimum = q4_k_parts(w)  # [sb, out, 8, 32], [sb, out, 8]
    nsb = scale.shape[0]
    q = q.reshape(m, nsb, 8, 32).astype(jnp.int32)
    dots = jnp.einsum("msnj,sonj->mson", q, codes.astype(jnp.int32))  # exact int32
    dx = dx.reshape(m, nsb, 1, 8)
    terms = scale[None] * (dx * dots.astype(jnp.float32))
    if sx is not None:
        terms = terms - minimum[None] * sx.reshape(m, nsb, 1, 8)
    return jnp.sum(terms, axis=(1, 3))

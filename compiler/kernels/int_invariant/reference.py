"""The integer-sum invariant matmul's arithmetic in plain jnp: what the GEMV and the GEMM compute bit for bit
(README.md, "Arithmetic"), and what a plan runs where no GPU traces it.

1. Activations, per row and per block of 32 elements (ggml's q8_1 with an exact-input sum):
   q = rint(x * (127 / max|x|)) in [-127, 127] (gguf_gemv/act_quant.py's quantize_blocks, an IEEE division),
   dx = max|x| * RECIP_127 (fp32(1/127): XLA:CPU rewrites max|x| / 127 into this multiply, which rounds otherwise
   than the division in ~5% of blocks, so the multiply is the definition, spelled out in both forms),
   sx = the block's 32 values summed in fp32 as `fixed_order_sum`'s tree (element e + 16 first, then e + 8, ...),
   never in an order XLA or Triton would pick.
2. Integer block sums, exact in int32 whatever order computes them:
   Q4_K block b (sub-block n of super-block s):  isum = sum_j code_j q_j             (|isum| <= 15*127*32 < 2**16)
   Q6_K block b: per half h, sum_j (code_j - 32) q_j; isum = sc_2n * half_0 + sc_2n+1 * half_1
                                                                              (|isum| <= 32*128*127*32 < 2**24)
   so float(isum) is exact too.
3. One fp32 term per block (each operation one IEEE rounding, in this order):
   Q4_K: ((d sc) * dx) * float(isum)  -  (dmin m) * sx        (d sc and dmin m exact products of fp16 and 6 bits)
   Q6_K: (d * dx) * float(isum)
4. Per split, acc = +0, then acc = acc + term(b) for its blocks in increasing order; the splits' sums added in
   split order (p0 + p1) + p2 ... (`fixed_order_partials_sum`, as the batch-invariant matmul adds its partials).

XLA:CPU contracts a multiply feeding an add into an FMA inside a fusion (docs/kernel_policy.md), which would round
differently from the kernels' separate operations: every product that meets an add here passes an optimization
barrier first, so it is rounded on its own.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ember.compiler.kernels.fixed_order import fixed_order_sum
from ember.compiler.kernels.gguf_gemv.act_quant import PACKINGS, quantize_blocks
from ember.compiler.kernels.gguf_gemv.layout import Q4_K, Q6_K, QuantizedWeight
from ember.compiler.kernels.gguf_gemv.reference import q4_k_parts, q6_k_parts
from ember.compiler.kernels.invariant_matmul.reference import fixed_order_partials_sum

from .config import BLOCK, IntInvariantConfig, check

RECIP_127 = float(np.float32(1 / 127))  # the activation scale's factor (module docstring, 1.)


def quantize_rows(x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """x [m, k] -> (q int8 [m, k/32, 32] in element order, dx float32 [m, k/32], sx float32 [m, k/32])."""
    q, _, _ = quantize_blocks(x)
    m, k = x.shape
    blocks = x.astype(jnp.float32).reshape(m, k // BLOCK, BLOCK)
    dx = jnp.max(jnp.abs(blocks), axis=-1) * np.float32(RECIP_127)
    return q, dx, fixed_order_sum(blocks, axis=-1)


def pack_words(q: jax.Array) -> jax.Array:
    """q int8 [m, k/32, 32] -> int32 [m, k/4], the kernels' form (act_quant.PACKINGS["q4_k"]): word 4h + c of a
    block holds elements c + 4h, c + 4h + 8, c + 4h + 16, c + 4h + 24 from low byte to high. The same bytes read as
    int8 [m, k] are the GEMM's activation tiles: byte 16h + 4c + j of a block is element 8j + 4h + c."""
    m, blocks, _ = q.shape
    dims, axes = PACKINGS["q4_k"]
    lanes = jnp.transpose(q.reshape(m, blocks, *dims), axes)  # [m, block, h, c, byte j]
    return jax.lax.bitcast_convert_type(lanes, jnp.int32).reshape(m, blocks * 8)


def weight_blocks(w: QuantizedWeight) -> dict[str, jax.Array]:
    """Per 32-element block b = 8 s + n of K (leading axis, k/32 of them), for every output column:
    Q4_K: codes int32 [nb, N, 32] (0..15, element order), scale = d sc and minimum = dmin m float32 [nb, N];
    Q6_K: codes int32 [nb, N, 2, 16] (code - 32 per half), sc int32 [nb, N, 2], d float32 [nb, N]."""
    if w.format == Q4_K:
        codes, scale, minimum = q4_k_parts(w)  # [sb, N, 8, 32], [sb, N, 8]
        sb, n = scale.shape[:2]
        blocks = lambda a: jnp.swapaxes(a, 1, 2).reshape(sb * 8, n, *a.shape[3:])  # noqa: E731
        return {"codes": blocks(codes.astype(jnp.int32)), "scale": blocks(scale), "minimum": blocks(minimum)}
    codes, _ = q6_k_parts(w)  # [sb, N, 16, 16] unsigned
    sb, n = codes.shape[:2]
    codes = (codes.astype(jnp.int32) - 32).reshape(sb, n, 8, 2, 16)
    sc = w.planes["scales"].astype(jnp.int32).reshape(sb, n, 8, 2)
    d = jnp.broadcast_to(w.planes["d"].astype(jnp.float32)[:, None, :], (sb, 8, n))
    return {
        "codes": jnp.swapaxes(codes, 1, 2).reshape(sb * 8, n, 2, 16),
        "sc": jnp.swapaxes(sc, 1, 2).reshape(sb * 8, n, 2),
        "d": d.reshape(sb * 8, n),
    }


def block_term(fmt: str, q, dx, sx, weight: dict) -> jax.Array:
    """Block b's fp32 term for every (row, column): q int8 [m, 32], dx / sx [m], weight: weight_blocks' entries
    of the block -> [m, N]. The integer sum is exact; the float operations are README.md's, in its order."""
    if fmt == Q4_K:
        isum = jnp.einsum("mj,nj->mn", q.astype(jnp.int32), weight["codes"], preferred_element_type=jnp.int32)
        scaled = (weight["scale"][None, :] * dx[:, None]) * isum.astype(jnp.float32)
        shift = weight["minimum"][None, :] * sx[:, None]
        scaled, shift = jax.lax.optimization_barrier((scaled, shift))  # two products, each rounded on its own
        return scaled - shift
    halves = jnp.einsum(
        "mhe,nhe->mnh", q.astype(jnp.int32).reshape(-1, 2, 16), weight["codes"], preferred_element_type=jnp.int32
    )
    isum = halves[..., 0] * weight["sc"][None, :, 0] + halves[..., 1] * weight["sc"][None, :, 1]
    return (weight["d"][None, :] * dx[:, None]) * isum.astype(jnp.float32)


def split_sum(fmt: str, q, dx, sx, weight: dict) -> jax.Array:
    """One split's sum: acc = +0, acc = acc + term(b) for its blocks b in order (leading axis of every operand:
    q [nb, m, 32], dx / sx [nb, m], weight [nb, N, ...]) -> float32 [m, N]."""

    def step(acc, block):
        q_b, dx_b, sx_b, weight_b = block
        term = jax.lax.optimization_barrier(block_term(fmt, q_b, dx_b, sx_b, weight_b))  # no FMA into the add
        return acc + term, None

    acc = jnp.zeros((q.shape[1], next(iter(weight.values())).shape[1]), jnp.float32)
    return jax.lax.scan(step, acc, (q, dx, sx, weight))[0]


def matmul_quantized(quantized, w: QuantizedWeight, config: IntInvariantConfig) -> jax.Array:
    """(q, dx, sx) of quantize_rows, w [N, K] -> float32 [m, N]: the splits' sums added in split order."""
    q, dx, sx = quantized
    k = q.shape[1] * BLOCK
    check(w.format, w.shape[0], k, config)
    weight = weight_blocks(w)
    by_block = lambda a: jnp.swapaxes(a, 0, 1)  # noqa: E731  [m, nb, ...] -> [nb, m, ...]
    q, dx, sx = by_block(q), by_block(dx), by_block(sx)
    partials = []
    for start, stop in config.bounds(k):
        a, b = start // BLOCK, stop // BLOCK
        partials.append(split_sum(w.format, q[a:b], dx[a:b], sx[a:b], {key: v[a:b] for key, v in weight.items()}))
    return fixed_order_partials_sum(jnp.stack(partials))


def int_invariant_reference(x: jax.Array, w: QuantizedWeight, config: IntInvariantConfig, out_dtype=None):
    # x [m, K] (any float dtype), w a Q4_K / Q6_K QuantizedWeight [N, K] -> [m, N] in out_dtype (x's by default)
    if w.format not in (Q4_K, Q6_K):
        raise ValueError(f"int_invariant takes Q4_K / Q6_K weights, got {w.format}")
    return matmul_quantized(quantize_rows(x), w, config).astype(out_dtype or x.dtype)

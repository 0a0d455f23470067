"""quant_matmul: x [m, in] @ W.T for a quantized W [out, in], by a static backend.

backend="reference"  the plain jnp reference (dequantize, then an fp32 matmul); runs anywhere
backend="triton"     the Triton GEMV kernels, native XLA kernels; NVIDIA GPUs only: variant "split"
                     (gguf_gemv/split_kernel.py, any m), "rows" (gguf_gemv/rows_*.py, m <= 4) or "dp4a" (Q4_K / Q6_K on
                     int8 activations: dp4a.py, any m in groups of <= 8)
backend="mosaic"     reserved for a Pallas Mosaic GPU kernel (not written yet: raises)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ember.compiler.kernels.gguf_gemv.config import QuantMatmulConfig, pick_config
from ember.compiler.kernels.gguf_gemv.layout import FORMATS, QuantizedWeight
from ember.compiler.kernels.gguf_gemv.reference import quant_matmul_ref
from ember.compiler.targets.policy import kernel_policy

BACKENDS = ("reference", "triton", "mosaic")
DOT_BLOCK_M = 16  # tl.dot needs >= 16 rows: activations are padded (masked) to 16 per program
DOT_MAX_BLOCK_M = 64  # up to 64 activation rows per program: each program reads its weight tile once for them


def dot_block_m(m: int) -> int:
    """Activation rows per program of the tensor-core path: m rounded up to a power of two in [16, 64], so that
    up to 64 rows read each weight tile once (more rows: several row blocks, each reading the weights)."""
    return min(DOT_MAX_BLOCK_M, max(DOT_BLOCK_M, 1 << (m - 1).bit_length()))


def quant_matmul(
    x: jax.Array,
    w: QuantizedWeight,
    *,
    backend: str = "reference",
    config: QuantMatmulConfig | None = None,
    activations: tuple | None = None,
) -> jax.Array:
    """x [m, in] (bf16 or f32) @ dequant(W).T -> [m, out] in x's dtype, accumulated in fp32. activations:
    x's int8 activations made by x's producer, (qa, da, order) as act_quant.quantize_activations(x, order)
    packs them (order: w's format, or "q4_k" for a Q6_K w), which a dp4a launch reads instead of quantizing
    x; every other path ignores them."""
    if x.ndim != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"x {x.shape} does not match a weight of shape {w.shape}")
    if backend == "reference":
        return quant_matmul_ref(x, w)
    if backend == "triton":
        return triton_quant_matmul(x, w, config or pick_config(w.format, x.shape[0], *w.shape), activations)
    if backend == "mosaic":
        raise NotImplementedError("quant_matmul: the Pallas Mosaic GPU kernel is not written yet; use 'triton'")
    raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")


def quant_matmul_parts(
    x: jax.Array,
    w: QuantizedWeight,
    bias: jax.Array | None,
    sizes: tuple[int, ...],
    *,
    bias_offset: int = 0,
    backend: str = "reference",
    activations: tuple | None = None,
) -> tuple[jax.Array, ...]:
    """x @ W.T + bias[bias_offset : bias_offset + out] split into the projections W packs (`sizes` along
    `out`): one [m, size] array each, in x's dtype (bias: None, or a longer vector whose run W's rows take).
    Where the pick is a one-split dp4a GEMV, one launch writes the outputs apart with the bias added
    (dp4a.dp4a_parts_call: no slice kernels after it); otherwise quant_matmul, the bias, then slices."""
    picked = _dp4a_pick(x, w, backend) if x.ndim == 2 and x.shape[1] == w.shape[1] else None
    if picked is not None:
        from ember.compiler.kernels.gguf_gemv.dp4a import dp4a_parts_call, parts_plan

        config, plan = picked
        if parts_plan(plan, tuple(sizes), w.shape[0]) is not None:
            return dp4a_parts_call(x, w, bias, config, plan, tuple(sizes), bias_offset, activations)
    y = quant_matmul(x, w, backend=backend, activations=activations)
    if bias is not None:
        y = y + bias[bias_offset : bias_offset + w.shape[0]].astype(y.dtype)
    return split_columns(y, sizes)


def quant_matmul_pair_parts(
    x: jax.Array,
    weights: tuple[QuantizedWeight, QuantizedWeight],
    bias: jax.Array | None,
    runs: tuple[tuple[int, ...], tuple[int, ...]],
    *,
    backend: str = "reference",
    activations: tuple | None = None,
) -> tuple[jax.Array, ...] | None:
    """The projections of a two-part weight group (a Q4_K part holding runs[0], one or two projections, then
    a Q4_K / Q6_K part holding runs[1], one: a Q4_K_M q+k beside a Q6_K v) with the group's bias, in one dp4a
    launch (dp4a.dp4a_pair_parts_call); None where that launch does not apply (then each part runs alone).
    The policy's quant_gemv.pair_launch off keeps one launch per part."""
    if not kernel_policy().quant_gemv.pair_launch or x.ndim != 2:
        return None
    from ember.compiler.kernels.gguf_gemv.dp4a import dp4a_pair_parts_call, pair_fits

    picks = [_dp4a_pick(x, w, backend) if x.shape[1] == w.shape[1] else None for w in weights]
    if None in picks or not pair_fits(weights, (picks[0][1], picks[1][1]), runs):
        return None
    return dp4a_pair_parts_call(x, weights, bias, (picks[0][1], picks[1][1]), runs, picks[0][0].num_warps, activations)


def quant_matmul_silu_gated(
    gate_up: jax.Array, w: QuantizedWeight, *, backend: str = "reference", partials: bool = False
):
    """silu(gate) * up @ W.T for a packed gate/up output gate_up [m, 2 in] -> [m, out] in its dtype. On a
    dp4a pick the activation is made inside the activation quantizer (no kernel of its own); otherwise
    activation.py's reference, then quant_matmul. partials: a split-K pick returns its unsummed partials
    (split_k.SplitKPartials)."""
    from ember.compiler.kernels.activation import gated_act_packed

    if gate_up.ndim != 2 or gate_up.shape[1] != 2 * w.shape[1]:
        raise ValueError(f"gate_up {gate_up.shape} does not match a weight of shape {w.shape}")
    picked = _dp4a_pick(gate_up, w, backend)
    if picked is not None:
        from ember.compiler.kernels.gguf_gemv.dp4a import dp4a_call

        return dp4a_call(gate_up, w, *picked, silu_gated=True, partials=partials)
    return quant_matmul(gated_act_packed(gate_up, act="silu"), w, backend=backend)


def _dp4a_pick(x: jax.Array, w: QuantizedWeight, backend: str) -> tuple[QuantMatmulConfig, dict] | None:
    """(config, launch plan) where the triton backend picks the dp4a kernel for x's rows (operands checked),
    else None."""
    if backend != "triton":
        return None
    m = x.shape[0]
    config = pick_config(w.format, m, *w.shape)
    if config.variant != "dp4a":
        return None
    _check_triton_operands(x, w)
    return config, launch_plan(w.format, m, *w.shape, config)


def column_bounds(sizes) -> list[int]:
    """Where each of the projections `sizes` (side by side along the last axis) ends, but the last."""
    return [sum(sizes[: i + 1]) for i in range(len(sizes) - 1)]


def split_columns(y: jax.Array, sizes) -> tuple[jax.Array, ...]:
    """y [..., sum(sizes)] -> one [..., size] array per projection."""
    return tuple(jnp.split(y, column_bounds(sizes), axis=-1))


def launch_plan(fmt: str, m: int, out: int, inner: int, config: QuantMatmulConfig) -> dict:
    """The static launch parameters (grid and kernel constexprs) for one call; pure, testable on CPU."""
    block, _, _ = FORMATS[fmt]
    if config.variant == "rows":
        return _rows_plan(fmt, m, out, inner, config)
    if config.variant == "dp4a":
        from ember.compiler.kernels.gguf_gemv.dp4a import dp4a_plan

        return dp4a_plan(fmt, m, out, inner, config)
    if config.variant != "split":
        raise ValueError(f"unknown kernel variant {config.variant!r}")
    use_dot = config.dot_for(m)
    block_m = dot_block_m(m) if use_dot else 1
    if not use_dot and m != 1:
        raise ValueError("the CUDA-core path (use_dot=False) takes exactly one activation row")
    if config.block_n < 16 or config.block_n & (config.block_n - 1):
        raise ValueError(f"block_n must be a power of two >= 16, got {config.block_n}")
    blocks = inner // block
    per_step = 1
    if block == 32:  # Q8_0 / Q5_0: the largest power of two <= blocks_per_step that divides the block count
        per_step = max(p for p in (1, 2, 4, 8, 16, 32) if p <= config.blocks_per_step and blocks % p == 0)
    steps = blocks // per_step
    split_k = max(1, min(config.split_k, steps))
    steps_per_split = -(-steps // split_k)
    split_k = -(-steps // steps_per_split)  # no empty splits
    meta = dict(
        M=m, N=out, K=inner, BLOCK_M=block_m, BLOCK_N=config.block_n, STEPS_PER_SPLIT=steps_per_split, USE_DOT=use_dot
    )
    if block == 32:
        meta["BLOCKS_PER_STEP"] = per_step
    grid = (-(-out // config.block_n), split_k, -(-m // block_m))
    return {"grid": grid, "split_k": split_k, "meta": meta}


ROWS_BLOCK_N = (4, 512)  # the rows variant's row tile: a power of two in this range
ROWS_MAX_SB_PER_STEP = 16
ROWS_MAX_M = 4  # activation rows of the rows kernels (one accumulator each)
ROWS_UNIT = {"q4_k": 256, "q6_k": 256, "q8_0": 32, "q5_0": 32}  # elements of `in` per split/step unit
# (gguf_gemv/rows_*.py)


def whole_steps(units: int, per_split: int, split_k: int, s: int) -> bool:
    """Every split of `per_split` units (the last holds the rest) is whole steps of `s` units."""
    return per_split % s == 0 and (units - (split_k - 1) * per_split) % s == 0


def _rows_plan(fmt: str, m: int, out: int, inner: int, config: QuantMatmulConfig) -> dict:
    """Grid (cdiv(out, block_n), split_k) over `units` along `in` (super-blocks; Q8_0 / Q5_0: 32-element blocks,
    8 per sb_per_step so that a step spans the same elements). Each split takes units_per_split units,
    a multiple of the step's S units when it spans more than one step (only the last split's last step
    is partly masked); S shrinks to the range when one step covers it; no split is empty."""
    if fmt not in ROWS_UNIT:
        raise ValueError(f"the rows variant has no {fmt} kernel")
    if not 1 <= m <= ROWS_MAX_M:
        raise ValueError(f"the rows variant takes 1..{ROWS_MAX_M} activation rows, got {m}")
    low, high = ROWS_BLOCK_N
    if not low <= config.block_n <= high or config.block_n & (config.block_n - 1):
        raise ValueError(f"rows: block_n must be a power of two in [{low}, {high}], got {config.block_n}")
    sb = config.sb_per_step
    if not 1 <= sb <= ROWS_MAX_SB_PER_STEP or sb & (sb - 1):
        raise ValueError(f"rows: sb_per_step must be a power of two in [1, {ROWS_MAX_SB_PER_STEP}], got {sb}")
    if config.split_k < 1:
        raise ValueError(f"split_k must be >= 1, got {config.split_k}")
    unit = ROWS_UNIT[fmt]
    if inner % unit:
        raise ValueError(f"{fmt}: `in` = {inner} is not a multiple of {unit}")
    units = inner // unit
    s = sb * 256 // unit  # units per step
    split_k = min(config.split_k, units)
    per_split = -(-units // split_k)
    if per_split > s:
        per_split = -(-per_split // s) * s  # whole steps per split
    else:
        s = 1 << (per_split - 1).bit_length()  # one step covers the split: the smallest power of two
    split_k = -(-units // per_split)  # no empty splits
    steps = -(-per_split // s)
    meta = dict(
        M=m,
        N=out,
        K=inner,
        BLOCK_N=config.block_n,
        S=s,
        UNITS_PER_SPLIT=per_split,
        PREFETCH=bool(config.prefetch and steps > 1),
    )
    if fmt == "q4_k":  # every split (the last, shorter one too) is whole steps: the kernel needs no masks
        meta["EXACT"] = whole_steps(units, per_split, split_k, s)
    return {"grid": (-(-out // config.block_n), split_k, 1), "split_k": split_k, "meta": meta}


def _check_triton_operands(x: jax.Array, w: QuantizedWeight) -> None:
    if x.dtype not in (jnp.bfloat16, jnp.float32, jnp.float16):
        raise ValueError(f"activations must be bf16, f16 or f32, got {x.dtype}")
    for name, plane in w.planes.items():  # every kernel variant reads every plane
        if plane.size >= 2**31:
            raise ValueError(f"{w.format} plane {name!r} has {plane.size} elements; int32 offsets overflow")


def triton_quant_matmul(
    x: jax.Array, w: QuantizedWeight, config: QuantMatmulConfig, activations: tuple | None = None
) -> jax.Array:
    from ember.compiler.kernels.gguf_gemv.split_kernel import KERNELS
    from ember.compiler.kernels.triton.launch import (
        triton_call,  # Triton itself is imported on use (GPU-only dependency)
    )

    _check_triton_operands(x, w)
    m = x.shape[0]
    out, inner = w.shape
    plan = launch_plan(w.format, m, out, inner, config)
    if config.variant == "dp4a":
        from ember.compiler.kernels.gguf_gemv.dp4a import dp4a_call

        return dp4a_call(x, w, config, plan, activations=activations)
    if config.variant == "rows":
        from ember.compiler.kernels.gguf_gemv.rows_kernel import ROWS_KERNELS

        kernel, plane_names = ROWS_KERNELS[w.format]
    else:
        kernel, plane_names = KERNELS[w.format]
    split_k = plan["split_k"]
    out_dtype = x.dtype if split_k == 1 else jnp.float32
    # the rows kernels write [split_k, m, out] too (split_k == 1: x's dtype, one launch and nothing after it)
    constants = dict(plan["meta"]) if config.variant == "rows" else dict(plan["meta"], IEEE=x.dtype == jnp.float32)
    y = triton_call(
        x,
        *(w.planes[name] for name in plane_names),
        kernel=kernel,
        out_shape=jax.ShapeDtypeStruct((split_k, m, out), out_dtype),
        grid=plan["grid"],
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        **constants,
    )
    if split_k == 1:
        return y[0]
    return jnp.sum(y, axis=0).astype(x.dtype)

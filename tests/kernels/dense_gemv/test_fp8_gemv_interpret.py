"""The decode GEMV kernels (compiler/kernels/dense_gemv/kernel.py) in Triton's CPU interpreter: on FP8 weights
against the float64 reference (fp8_reference_matmul) and the jnp path (fp8_linear_xla), their fused gate/up and
q/k/v-parts forms, and the same kernels on plain bf16 weights (compiler/kernels/dense_gemv/dispatch.py).

The interpreter's numpy buffers have no float8 type here, so the e4m3 bytes go in as uint8 and the kernel
reinterprets them (W_BITCAST: `w.to(tl.float8e4nv, bitcast=True)`); on the GPU the float8_e4m3fn array is passed
as it is. The kernels convert e4m3 only to wider types (exact), so the interpreter's fp8 rounding patch
(tests/kernels/interpreter.py) does not enter; its fp32 -> bf16 rounding to nearest even does, in every bf16
output, as on the GPU."""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from interpreter import HostBuffer

from ember.compiler.kernels.activation import gated_act_packed
from ember.compiler.kernels.dense_gemv.fp8 import fp8_linear_xla, fp8_reference_matmul, quantize_fp8
from ember.compiler.kernels.dense_gemv.kernel import Fp8GemvConfig, fp8_gemv_kernel, fp8_gemv_parts_kernel, launch_plan

pytestmark = pytest.mark.interpret

BF16 = ml_dtypes.bfloat16
DTYPES = {"float32": np.float32, "bfloat16": BF16}
# f32: accumulation order only; bf16: the output's rounding (2**-9 relative) at the largest outputs
TOL = {"float32": 1e-5, "bfloat16": 2.0**-7}
GATE_UP_TOL = 2.0**-6  # the product's and the activation's bf16 roundings, each within an ulp
# tl.sigmoid(g) = 1 / (1 + exp(-g)): numpy warns where exp overflows (g < -88), which gives 0 as on the GPU
EXP_OVERFLOW = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")

# (out, in, blocked, config kwargs, [(m, dtype name), ...]). Together: per-channel and block scales, m in
# {1, 3, 8, 16}, out not a multiple of block_n (masked rows) nor of 128 (a partial scale block), in not a
# multiple of block_k (masked columns) nor of 128, split_k 1 and > 1 (clamped, the last split shorter),
# block_k below, at and above 128 (a tile over two scale blocks; tl.dot: 128-wide sub-tiles), CUDA cores (with
# and without the register prefetch) and tl.dot, bf16 and f32.
CASES = [
    (200, 400, False, dict(block_n=32, block_k=128), [(1, "bfloat16"), (3, "float32")]),
    (200, 400, True, dict(block_n=32, block_k=256, split_k=2), [(1, "float32"), (3, "bfloat16")]),
    (136, 300, True, dict(block_n=16, block_k=64, split_k=3), [(8, "bfloat16"), (1, "float32")]),
    (136, 300, False, dict(block_n=16, block_k=512, split_k=4), [(1, "bfloat16")]),
    (136, 300, True, dict(block_n=16, block_k=64, split_k=2, prefetch=False), [(2, "bfloat16")]),
    (136, 300, True, dict(block_n=16, block_k=256, split_k=2, step_reduce=True), [(1, "bfloat16"), (4, "float32")]),
    (200, 400, False, dict(block_n=32, block_k=128, step_reduce=True), [(1, "float32")]),
    (200, 400, False, dict(block_n=32, block_k=128, split_k=2, use_dot=True), [(16, "bfloat16"), (8, "float32")]),
    (200, 400, True, dict(block_n=16, block_k=256, use_dot=True), [(16, "float32"), (3, "bfloat16")]),
    (72, 160, True, dict(block_n=8, block_k=32, split_k=8), [(16, "bfloat16")]),
    (72, 160, True, dict(block_n=16, block_k=64, split_k=2, use_dot=True), [(5, "bfloat16")]),
    # 4-byte words (bf16 activations only): in a multiple of 4 but not of 16 nor block_k (a partial last
    # step), split-K, m = 2, with and without the prefetch
    (200, 420, False, dict(block_n=8, block_k=256, words=True), [(1, "bfloat16"), (2, "bfloat16")]),
    (136, 300, True, dict(block_n=16, block_k=64, split_k=2, words=True), [(1, "bfloat16"), (2, "bfloat16")]),
    (72, 160, True, dict(block_n=8, block_k=32, split_k=3, words=True, prefetch=False), [(1, "bfloat16")]),
]
RUNS = [(out, inner, blocked, kwargs, m, dtype) for out, inner, blocked, kwargs, runs in CASES for m, dtype in runs]

# the fused forms: (ffn, in, config kwargs, m): a packed gate/up weight [2 ffn, in] whose epilogue writes
# silu(gate) * up [m, ffn] (ffn not a multiple of block_n / 2: masked pairs), and (sizes, in, blocked, config
# kwargs, m): three projections' outputs from one launch (sizes: row-tile multiples)
GATE_UP_CASES = [
    (36, 300, dict(block_n=8, block_k=64, words=True), 1),
    (40, 160, dict(block_n=4, block_k=32, words=True, prefetch=False), 2),
    (24, 200, dict(block_n=16, block_k=64, step_reduce=True), 1),
]
PARTS_CASES = [
    ((64, 16, 24), 200, False, dict(block_n=8, block_k=64, words=True), 1),
    ((32, 32, 8), 160, True, dict(block_n=8, block_k=32, words=True, prefetch=False), 2),
]

# the same kernels on plain bf16 weights (SCALED off): (form, out or sizes, in, config kwargs, m, activation
# dtype): masked rows and columns, the prefetch on and off, split-K, f32 x
DENSE_CASES = [
    ("plain", 200, 420, dict(block_n=4, block_k=64, step_reduce=True), 1, "bfloat16"),
    ("plain", 136, 300, dict(block_n=8, block_k=128, split_k=2, step_reduce=True), 2, "float32"),
    ("plain", 72, 160, dict(block_n=4, block_k=32, step_reduce=True, prefetch=False), 1, "bfloat16"),
    ("gate_up", 36, 300, dict(block_n=4, block_k=64, step_reduce=True), 1, "bfloat16"),
    ("parts", (64, 16, 24), 200, dict(block_n=8, block_k=64, step_reduce=True), 1, "bfloat16"),
]


def _config_id(kwargs: dict) -> str:
    """dict(block_n=16, block_k=64, split_k=2, words=True, prefetch=False) -> 'bn16-bk64-split2-words-noprefetch'."""
    parts = [f"bn{kwargs['block_n']}", f"bk{kwargs['block_k']}"]
    parts += [f"split{kwargs['split_k']}"] if "split_k" in kwargs else []
    parts += [name for name in ("use_dot", "step_reduce", "words") if kwargs.get(name)]
    return "-".join(parts + (["noprefetch"] if kwargs.get("prefetch") is False else []))


def _weight(rng, out: int, inner: int, blocked: bool):
    """An Fp8Weight [out, in] of rows at scales spread over 0.01..3 (per-channel or 128 x 128 block scales)."""
    w = rng.standard_normal((out, inner)) * rng.uniform(0.01, 3.0, (out, 1))
    return quantize_fp8(w.astype(np.float32), blocked=blocked)


def _weight_buffers(w) -> tuple[HostBuffer, HostBuffer]:
    """The kernel's weight operands: the e4m3 bytes as uint8 (W_BITCAST), the scales as fp32."""
    return HostBuffer(np.asarray(w.values).view(np.uint8)), HostBuffer(np.asarray(w.scale, np.float32))


def _rel_err(got: np.ndarray, exact: np.ndarray) -> float:
    """max |got - exact| / max |exact|: NaN (an unwritten row, split or part) fails every `<` bound."""
    return float(np.abs(got - exact).max() / np.abs(exact).max())


def _partials(m: int, out: int, splits: int, dtype) -> HostBuffer:
    """The output [splits, m, out]: x's dtype at one split, else the fp32 partials; NaN until written."""
    return HostBuffer(np.full((splits, m, out), np.nan, dtype if splits == 1 else np.float32))


@pytest.mark.parametrize(
    "seed, out, inner, blocked, kwargs, m, dtype_name",
    [(seed, *run) for seed, run in enumerate(RUNS)],
    ids=[
        f"{out}x{inner}-{'block' if blocked else 'chan'}-{_config_id(kwargs)}-m{m}-{dtype}"
        for out, inner, blocked, kwargs, m, dtype in RUNS
    ],
)
def test_fp8_gemv_kernel_matches_references(seed, out, inner, blocked, kwargs, m, dtype_name):
    rng = np.random.default_rng(seed)
    w = _weight(rng, out, inner, blocked)
    x = rng.standard_normal((m, inner)).astype(DTYPES[dtype_name])
    plan = launch_plan(m, out, inner, Fp8GemvConfig(**kwargs), blocked=blocked)
    y = _partials(m, out, plan["split_k"], x.dtype)
    fp8_gemv_kernel[plan["grid"]](
        HostBuffer(x),
        *_weight_buffers(w),
        y,
        IEEE=dtype_name == "float32",
        W_BITCAST=True,
        SCALED=True,
        **plan["meta"],
    )
    got = y.array.astype(np.float32).sum(axis=0)
    exact = fp8_reference_matmul(np.asarray(x, np.float32), w)
    jnp_path = np.asarray(fp8_linear_xla(jnp.asarray(x), w), np.float32)
    err, err_jnp = _rel_err(got, exact), _rel_err(got, jnp_path)
    where = f"grid={plan['grid'][:2]} split={plan['split_k']} prefetch={int(plan['meta']['PREFETCH'])}"
    assert err < TOL[dtype_name], f"against the float64 reference: rel_err {err:.1e} ({where})"
    assert err_jnp < TOL[dtype_name], f"against fp8_linear_xla: rel_err {err_jnp:.1e} ({where})"


@EXP_OVERFLOW
@pytest.mark.parametrize(
    "seed, ffn, inner, kwargs, m",
    [(seed, *case) for seed, case in enumerate(GATE_UP_CASES)],
    ids=[f"{2 * ffn}x{inner}-{_config_id(kwargs)}-m{m}" for ffn, inner, kwargs, m in GATE_UP_CASES],
)
def test_fp8_gate_up_kernel_matches_reference(seed, ffn, inner, kwargs, m):
    rng = np.random.default_rng(seed)
    w = _weight(rng, 2 * ffn, inner, False)
    x = rng.standard_normal((m, inner)).astype(BF16)
    plan = launch_plan(m, 2 * ffn, inner, Fp8GemvConfig(**kwargs), blocked=False, gate_up=True)
    y = HostBuffer(np.full((m, ffn), np.nan, BF16))
    fp8_gemv_kernel[plan["grid"]](
        HostBuffer(x), *_weight_buffers(w), y, IEEE=False, W_BITCAST=True, SCALED=True, **plan["meta"]
    )
    product = fp8_reference_matmul(np.asarray(x, np.float32), w).astype(BF16)
    exact = np.asarray(gated_act_packed(jnp.asarray(product), act="silu"), np.float32)
    err = _rel_err(y.array.astype(np.float32), exact)
    assert err < GATE_UP_TOL, f"silu(gate) * up [{m}, {ffn}] against the float64 reference: rel_err {err:.1e}"


@pytest.mark.parametrize(
    "seed, sizes, inner, blocked, kwargs, m",
    [(seed, *case) for seed, case in enumerate(PARTS_CASES)],
    ids=[
        f"{'+'.join(map(str, sizes))}x{inner}-{'block' if blocked else 'chan'}-{_config_id(kwargs)}-m{m}"
        for sizes, inner, blocked, kwargs, m in PARTS_CASES
    ],
)
def test_fp8_parts_kernel_matches_reference(seed, sizes, inner, blocked, kwargs, m):
    rng = np.random.default_rng(seed)
    out = sum(sizes)
    w = _weight(rng, out, inner, blocked)
    x = rng.standard_normal((m, inner)).astype(BF16)
    plan = launch_plan(m, out, inner, Fp8GemvConfig(**kwargs), blocked=blocked)
    outs = [HostBuffer(np.full((m, size), np.nan, BF16)) for size in sizes]
    fp8_gemv_parts_kernel[plan["grid"]](
        HostBuffer(x),
        *_weight_buffers(w),
        *outs,
        IEEE=False,
        W_BITCAST=True,
        SCALED=True,
        N1=sizes[0],
        N2=sizes[0] + sizes[1],
        **plan["meta"],
    )
    exact = fp8_reference_matmul(np.asarray(x, np.float32), w)
    got = np.concatenate([o.array.astype(np.float32) for o in outs], axis=1)
    err = _rel_err(got, exact)
    assert err < TOL["bfloat16"], f"the parts {sizes} against the float64 reference: rel_err {err:.1e}"


@EXP_OVERFLOW
@pytest.mark.parametrize(
    "seed, form, size, inner, kwargs, m, dtype_name",
    [(seed, *case) for seed, case in enumerate(DENSE_CASES)],
    ids=[
        f"{form}-{'+'.join(map(str, size)) if form == 'parts' else size}x{inner}-{_config_id(kwargs)}-m{m}-{dtype}"
        for form, size, inner, kwargs, m, dtype in DENSE_CASES
    ],
)
def test_dense_gemv_kernels_match_reference(seed, form, size, inner, kwargs, m, dtype_name):
    """The same kernels on a plain bf16 weight [out, in] (SCALED off, no scale operand read)."""
    rng = np.random.default_rng(seed)
    out = 2 * size if form == "gate_up" else sum(size) if form == "parts" else size
    w = (rng.standard_normal((out, inner)) * rng.uniform(0.01, 3.0, (out, 1))).astype(BF16)
    dtype = DTYPES[dtype_name]
    x = rng.standard_normal((m, inner)).astype(dtype)
    exact = np.asarray(x, np.float64) @ np.asarray(w, np.float64).T
    plan = launch_plan(m, out, inner, Fp8GemvConfig(**kwargs), blocked=False, gate_up=form == "gate_up")
    args = (HostBuffer(x), HostBuffer(w), HostBuffer(np.zeros(1, np.float32)))
    flags = dict(IEEE=dtype_name == "float32", W_BITCAST=False, SCALED=False, **plan["meta"])
    tol = TOL[dtype_name]
    if form == "parts":
        outs = [HostBuffer(np.full((m, part), np.nan, dtype)) for part in size]
        fp8_gemv_parts_kernel[plan["grid"]](*args, *outs, N1=size[0], N2=size[0] + size[1], **flags)
        got = np.concatenate([o.array.astype(np.float32) for o in outs], axis=1)
    elif form == "gate_up":
        y = HostBuffer(np.full((m, size), np.nan, dtype))
        fp8_gemv_kernel[plan["grid"]](*args, y, **flags)
        got = y.array.astype(np.float32)
        exact = np.asarray(gated_act_packed(jnp.asarray(exact.astype(dtype)), act="silu"), np.float32)
        tol = GATE_UP_TOL
    else:
        y = _partials(m, out, plan["split_k"], dtype)
        fp8_gemv_kernel[plan["grid"]](*args, y, **flags)
        got = y.array.astype(np.float32).sum(axis=0)
    err = _rel_err(got, exact)
    assert err < tol, f"{form} against the float64 reference: rel_err {err:.1e} (split={plan['split_k']})"

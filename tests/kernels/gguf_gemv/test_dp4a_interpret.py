"""The integer-dot Q4_K / Q6_K GEMVs (compiler/kernels/gguf_gemv/dp4a_kernel.py) run by Triton's CPU interpreter
(ASM=False: dp4a emulated with shifts and multiplies) against act_quant.dp4a_matmul_ref: the GEMV, its parts
kernel (q / k / v written apart, with their bias) and its pair kernel (a Q4_K part then a Q6_K or Q4_K part,
one launch). Each with 1 and 2 int8 activation terms (policy quant_gemv.act_terms). The activation quantizer
itself: test_act_quant_interpret.py; the plans: test_act_quant.py."""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
import pytest
from interpreter import HostBuffer

from ember.compiler.kernels.gguf_gemv import QuantMatmulConfig, launch_plan, pack, random_gguf_bytes
from ember.compiler.kernels.gguf_gemv.act_quant import FACTORS, dp4a_matmul_ref, quantize_activations
from ember.compiler.kernels.gguf_gemv.dp4a import pad_rows, parts_plan

pytestmark = pytest.mark.interpret

# (out, in), (block_n, split_k, sb_per_step, prefetch), activation rows. Together: R = 1..8 and two groups
# (m = 11: 2 x 6, one padding row), split-K with a short last split, masked row tiles (out not a multiple
# of block_n), a last step partly outside the split (not EXACT), EXACT, PREFETCH off, one super-block.
CASES = [
    ((40, 1536), (16, 1, 4, True), [1, 3]),
    ((40, 1536), (8, 4, 1, True), [2, 8]),
    ((20, 1280), (4, 2, 2, True), [1, 5]),
    ((24, 1280), (16, 1, 2, False), [4]),
    ((12, 256), (8, 3, 2, True), [7]),
    ((44, 2048), (16, 2, 2, True), [1, 11]),  # EXACT: 2 splits of 2 steps
]
# (weight format, activation packing): a Q6_K weight also reads Q4_K-packed words (ACT_Q4)
GEMV_CASES = [
    pytest.param(fmt, order, shape, tiling, m, id=f"{fmt}-act_{order}-{shape[0]}x{shape[1]}-bn{tiling[0]}-m{m}")
    for fmt, order in (("q4_k", "q4_k"), ("q6_k", "q6_k"), ("q6_k", "q4_k"))
    for shape, tiling, ms in CASES
    for m in ms
]
# (sizes of the packed projections, bias offset or None, dp4a config, rows): 3, 2 and 1 parts, parts that
# split a row tile, a bias read at an offset (a group's later part), two row groups
PARTS_CASES = [
    ((24, 8, 8), 0, (8, 1, 2, True), [1, 3]),
    ((28, 12), 5, (16, 1, 4, True), [2]),
    ((16, 16, 8), None, (8, 1, 2, False), [11]),
    ((24,), 7, (8, 1, 2, True), [1]),
]
PARTS = [
    pytest.param(fmt, sizes, offset, tiling, m, id=f"{fmt}-sizes{'_'.join(map(str, sizes))}-bias{offset}-m{m}")
    for fmt in ("q4_k", "q6_k")
    for sizes, offset, tiling, ms in PARTS_CASES
    for m in ms
]
# (A's projections, B's format and rows, A's and B's (block_n, sb_per_step), activation rows)
PAIR_CASES = [
    ((24, 8), ("q6_k", 8), ((8, 2), (4, 4)), [1, 3]),
    ((20,), ("q4_k", 12), ((16, 4), (8, 1)), [2, 11]),
]
PAIRS = [
    pytest.param(run_a, b, tiles, m, id=f"q4_k{'_'.join(map(str, run_a))}-{b[0]}{b[1]}-m{m}")
    for run_a, b, tiles, ms in PAIR_CASES
    for m in ms
]
INNER = 1536  # the parts and pair kernels' K


@pytest.fixture(params=[1, 2], ids=lambda terms: f"terms{terms}")
def terms(request, kernel_overrides) -> int:
    """How many int8 terms the activations carry (quant_gemv.act_terms) for the rest of the test."""
    kernel_overrides({"quant_gemv.act_terms": request.param})
    return request.param


@functools.cache
def weight(fmt: str, shape: tuple[int, int], seed: int = 3):
    """A packed [out, in] weight of realistic GGUF blocks."""
    return pack(random_gguf_bytes(np.random.default_rng(seed), fmt, shape, realistic=True), fmt, shape)


def activations(x: np.ndarray, order: str, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """x's int8 activations packed for `order`'s weights (qa int32 [rows, T k/4], da float32 [rows, k/32, 4 T]),
    padded with zero rows to a plan's M_PAD."""
    return tuple(np.asarray(a) for a in pad_rows(*quantize_activations(jnp.asarray(x), order), rows))


def check(got: np.ndarray, expected: np.ndarray, label: str) -> None:
    """Relative error below 1e-5 of the largest output (NaN: an element no program wrote, fails too)."""
    err = float(np.abs(got - expected).max() / np.abs(expected).max())
    assert err < 1e-5, f"{label}: rel_err={err:.1e} (tolerance 1e-5)"


@pytest.mark.parametrize("fmt, order, shape, tiling, m", GEMV_CASES)
def test_dp4a_gemv_matches_the_reference(fmt, order, shape, tiling, m, terms):
    from ember.compiler.kernels.gguf_gemv.dp4a_kernel import DP4A_PLANES, dp4a_gemv_kernel

    (out, inner), (block_n, split_k, sb, prefetch) = shape, tiling
    w = weight(fmt, shape)
    x = np.random.default_rng(m).standard_normal((m, inner)).astype(np.float32)
    x[0, :32] = 0.0  # an all-zero activation block (dx = 0)
    expected = np.asarray(dp4a_matmul_ref(jnp.asarray(x), w))
    config = QuantMatmulConfig(variant="dp4a", block_n=block_n, split_k=split_k, sb_per_step=sb, prefetch=prefetch)
    plan = launch_plan(fmt, m, out, inner, config)
    meta = dict(plan["meta"], ASM=False, ACT_Q4=order != fmt)
    qa, da = activations(x, order, meta["M_PAD"])
    meta["TERMS"] = da.shape[-1] // FACTORS
    assert meta["TERMS"] == terms
    y = HostBuffer(np.full((plan["split_k"], meta["M_PAD"], out), np.nan, np.float32))  # [split_k, M_PAD, out]
    dp4a_gemv_kernel[plan["grid"]](
        HostBuffer(qa), HostBuffer(da), *(HostBuffer(w.planes[n]) for n in DP4A_PLANES[fmt]), y, **meta
    )
    check(
        y.array.sum(axis=0)[:m],
        expected,
        f"dp4a {fmt} (activations {order}) {out}x{inner} m={m} R={meta['R']} block_n={block_n} "
        f"grid={plan['grid']} S={meta['S']} exact={meta['EXACT']} prefetch={meta['PREFETCH']}",
    )


@pytest.mark.parametrize("fmt, sizes, offset, tiling, m", PARTS)
def test_dp4a_parts_kernel_matches_the_reference(fmt, sizes, offset, tiling, m, terms):
    """dp4a_gemv_parts_kernel against dp4a_matmul_ref + the bias, split into the projections."""
    from ember.compiler.kernels.gguf_gemv.dp4a_kernel import DP4A_PLANES, dp4a_gemv_parts_kernel

    out, (block_n, split_k, sb, prefetch) = sum(sizes), tiling
    w = weight(fmt, (out, INNER), seed=6)
    rng = np.random.default_rng(m)
    bias = None if offset is None else rng.standard_normal(offset + out + 3).astype(np.float32)
    x = rng.standard_normal((m, INNER)).astype(np.float32)
    expected = np.asarray(dp4a_matmul_ref(jnp.asarray(x), w))
    if bias is not None:
        expected = expected + bias[offset : offset + out]
    config = QuantMatmulConfig(variant="dp4a", block_n=block_n, split_k=split_k, sb_per_step=sb, prefetch=prefetch)
    plan = launch_plan(fmt, m, out, INNER, config)
    meta = dict(
        plan["meta"], ASM=False, HAS_BIAS=bias is not None, BIAS_OFFSET=offset or 0, **parts_plan(plan, sizes, out)
    )
    qa, da = activations(x, fmt, meta["M_PAD"])
    meta["TERMS"] = da.shape[-1] // FACTORS
    assert meta["TERMS"] == terms
    # one [M_PAD, size] output per projection (unused ones [M_PAD, 1])
    outs = [HostBuffer(np.full((meta["M_PAD"], width), np.nan, np.float32)) for width in (*sizes, 1, 1)[:3]]
    dp4a_gemv_parts_kernel[plan["grid"]](
        HostBuffer(qa),
        HostBuffer(da),
        *(HostBuffer(w.planes[n]) for n in DP4A_PLANES[fmt]),
        HostBuffer(np.zeros(1, np.float32) if bias is None else bias),
        *outs,
        **meta,
    )
    check(
        np.concatenate([o.array[:m] for o in outs[: len(sizes)]], axis=1),
        expected,
        f"dp4a parts {fmt} sizes={sizes} bias_offset={offset} m={m} R={meta['R']} block_n={block_n}",
    )


@pytest.mark.parametrize("run_a, part_b, tiles, m", PAIRS)
def test_dp4a_pair_kernel_matches_the_reference(run_a, part_b, tiles, m, terms):
    """dp4a_gemv_pair_kernel (a Q4_K part of one or two projections, then a Q6_K or Q4_K part of one, one
    launch reading Q4_K-packed activations) against dp4a_matmul_ref of each part plus the bias."""
    from ember.compiler.kernels.gguf_gemv.dp4a_kernel import DP4A_PLANES, dp4a_gemv_pair_kernel

    (fmt_b, out_b), out_a = part_b, sum(run_a)
    wa, wb = weight("q4_k", (out_a, INNER), seed=8), weight(fmt_b, (out_b, INNER), seed=9)
    rng = np.random.default_rng(m)
    bias = rng.standard_normal(out_a + out_b).astype(np.float32)
    x = rng.standard_normal((m, INNER)).astype(np.float32)
    expected = np.concatenate([np.asarray(dp4a_matmul_ref(jnp.asarray(x), w)) for w in (wa, wb)], axis=1) + bias
    pa, pb = (
        launch_plan(f, m, o, INNER, QuantMatmulConfig(variant="dp4a", block_n=bn, sb_per_step=sb))
        for f, o, (bn, sb) in (("q4_k", out_a, tiles[0]), (fmt_b, out_b, tiles[1]))
    )
    ma, mb = pa["meta"], pb["meta"]
    qa, da = activations(x, "q4_k", ma["M_PAD"])
    assert da.shape[-1] // FACTORS == terms
    # outputs [M_PAD, width]: A's first projection, its second (or an unused [M_PAD, 1]), B
    widths = (run_a[0], run_a[1] if len(run_a) == 2 else 1, out_b)
    outs = [HostBuffer(np.full((ma["M_PAD"], width), np.nan, np.float32)) for width in widths]
    dp4a_gemv_pair_kernel[(pa["grid"][0] + pb["grid"][0], 1, 1)](
        HostBuffer(qa),
        HostBuffer(da),
        *(HostBuffer(wa.planes[n]) for n in DP4A_PLANES["q4_k"]),
        *(HostBuffer(wb.planes[n]) for n in DP4A_PLANES[fmt_b]),
        HostBuffer(bias),
        *outs,
        M_PAD=ma["M_PAD"],
        K=INNER,
        R=ma["R"],
        NA=out_a,
        N1=run_a[0],
        NB=out_b,
        TILES_A=pa["grid"][0] // (ma["M_PAD"] // ma["R"]),
        BLOCK_N_A=ma["BLOCK_N"],
        S_A=ma["S"],
        PREFETCH_A=ma["PREFETCH"],
        EXACT_A=ma["EXACT"],
        BLOCK_N_B=mb["BLOCK_N"],
        S_B=mb["S"],
        PREFETCH_B=mb["PREFETCH"],
        EXACT_B=mb["EXACT"],
        Q6_B=fmt_b == "q6_k",
        ASM=False,
        HAS_BIAS=True,
        BIAS_OFFSET=0,
        TERMS=terms,
    )
    kept = [outs[0].array[:m]] + ([outs[1].array[:m]] if len(run_a) == 2 else []) + [outs[2].array[:m]]
    check(np.concatenate(kept, axis=1), expected, f"dp4a pair q4_k {run_a} + {fmt_b} ({out_b},) m={m} R={ma['R']}")

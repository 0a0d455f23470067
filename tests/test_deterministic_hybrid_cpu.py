"""Deterministic mode on the cpu target for the hybrid families: Gated DeltaNet's scan (one token per
iteration, so a token's arithmetic has fixed shapes) and the deterministic variant's gated output norm compute
a token's bits the same way whatever else the step holds (docs/kernel_policy.md, "Batch invariance"). The
default gated norm does not: with it the engine's logprobs on the tiny Qwen3.5 moved in the last bits beside 7
other requests."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ember.compiler.batch import StepBatch
from ember.compiler.kernels.gated_delta import op

HK, HV, DK, DV, WIDTH = 2, 4, 32, 32, 4
CHANNELS = 2 * HK * DK + HV * DV
SLOTS = 10


def _inputs(rng, rows: int):
    """The probe token (slot 0, position 9) first, then rows - 1 tokens of other slots."""
    f32 = np.float32
    return dict(
        qkv=jnp.asarray(rng.standard_normal((rows, CHANNELS)).astype(f32)),
        b=jnp.asarray(rng.standard_normal((rows, HV)).astype(f32)),
        a=jnp.asarray(rng.standard_normal((rows, HV)).astype(f32)),
        slots=jnp.asarray(np.arange(rows, dtype=np.int32)[None]),
        positions=jnp.asarray(np.r_[9, rng.integers(1, 50, rows - 1)].astype(np.int32)),
    )


def _run(fn, inputs, weights):
    batch = StepBatch(
        tokens=jnp.zeros(inputs["positions"].shape, jnp.int32),
        positions=inputs["positions"],
        slots=None,
        dec_block_tables=None,
        dec_ctx_lens=None,
        pre_block_table=None,
        logit_rows=None,
        state_slots=inputs["slots"],
    )
    out, conv, delta = jax.jit(
        lambda qkv, b, a: fn(
            qkv,
            b,
            a,
            0,
            weights["conv"],
            weights["a_neg"],
            weights["dt_bias"],
            weights["conv_state"],
            weights["delta_state"],
            batch,
            hk=HK,
            hv=HV,
            dk=DK,
            dv=DV,
            kernel=WIDTH,
        )  # fmt: skip
    )(inputs["qkv"], inputs["b"], inputs["a"])
    return np.asarray(out[0]), np.asarray(conv[0]), np.asarray(delta[0])


@pytest.fixture(scope="module")
def weights():
    rng = np.random.default_rng(0)
    f32 = np.float32
    return dict(
        conv=jnp.asarray(rng.standard_normal((CHANNELS, WIDTH)).astype(f32) * 0.5),
        a_neg=jnp.asarray(-rng.uniform(0.5, 2.0, HV).astype(f32)),
        dt_bias=jnp.asarray(rng.standard_normal(HV).astype(f32)),
        conv_state=jnp.asarray(rng.standard_normal((SLOTS, WIDTH - 1, CHANNELS)).astype(f32)),
        delta_state=jnp.asarray(rng.standard_normal((SLOTS, HV, DK, DV)).astype(f32) * 0.1),
    )


def test_a_tokens_gated_delta_bits_do_not_depend_on_the_tokens_beside_it(weights):
    full = _inputs(np.random.default_rng(1), 8)
    alone = _run(op.gated_delta, {k: v[..., :1] if k == "slots" else v[:1] for k, v in full.items()}, weights)
    for rows in (2, 5, 8):
        part = {k: v[..., :rows] if k == "slots" else v[:rows] for k, v in full.items()}
        got = _run(op.gated_delta, part, weights)
        for name, x, y in zip(("out", "conv window", "delta state"), alone, got):
            assert np.array_equal(x, y), f"{name} beside {rows - 1} tokens"


def test_the_gated_norms_row_bits_do_not_depend_on_the_row_count():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((70, HV * DV)).astype(np.float32)
    gate = rng.standard_normal((70, HV * DV)).astype(np.float32)
    w = jnp.asarray(rng.uniform(0.5, 1.5, DV).astype(np.float32))
    f = jax.jit(lambda a, g: op.gated_rms_norm_heads_invariant(a, g, w, eps=1e-6, heads=HV))
    alone = np.asarray(f(x[:1], gate[:1]))[0]
    for m in (2, 17, 70):
        assert np.array_equal(np.asarray(f(x[:m], gate[:m]))[0], alone), f"{m} rows"
    reference = np.asarray(op.gated_rms_norm_heads(jnp.asarray(x), jnp.asarray(gate), w, eps=1e-6, heads=HV))
    np.testing.assert_allclose(np.asarray(f(x, gate)), reference, rtol=1e-5, atol=1e-6)


def _row_bits_by_count(fn, x, counts=(2, 3, 8, 16, 17, 33, 40)):
    """The row counts at which rows 0 and 1 of fn(x[:m]) differ from fn(x[:2])'s."""
    f = jax.jit(fn)
    first = np.asarray(f(x[:2]))[:2]
    return [m for m in counts if not np.array_equal(np.asarray(f(x[:m]))[:2], first)]


def test_a_tokens_moe_bits_do_not_depend_on_the_tokens_beside_it():
    """The deterministic `moe` (router and experts as fixed-shape GEMMs, sums in a fixed order) against the
    default one, whose ragged matmul rounds a token by the number of token-expert pairs: both measured, so
    the test shows the difference it guards."""
    from ember.compiler.kernels.moe import op as moe_op

    rng = np.random.default_rng(4)
    d, experts, f, top_k = 256, 4, 128, 2
    x = rng.standard_normal((40, d)).astype(np.float32)
    router = jnp.asarray(rng.standard_normal((experts, d)).astype(np.float32) * 0.1)
    gate, up = (jnp.asarray(rng.standard_normal((experts, f, d)).astype(np.float32) * 0.05) for _ in range(2))
    down = jnp.asarray(rng.standard_normal((experts, d, f)).astype(np.float32) * 0.05)

    def run(fn):
        return lambda a: fn(a, router, gate, up, down, top_k=top_k, normalize=True)

    assert _row_bits_by_count(run(moe_op.moe_invariant), x) == []
    assert _row_bits_by_count(run(moe_op.moe), x) != []  # what the deterministic form is for
    np.testing.assert_allclose(
        np.asarray(run(moe_op.moe_invariant)(x)), np.asarray(run(moe_op.moe)(x)), rtol=1e-5, atol=1e-6
    )

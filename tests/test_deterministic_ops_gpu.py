"""Which op of a deterministic h200 step rounds a row by the number of rows beside it (on an NVIDIA GPU).

The deterministic engine test passes in fixed tiles but not at the default buckets (docs/h200_log.md,
2026-12-06): some op's row result depends on the step's row count. Each op here runs jitted on one probe row
placed among 1, 2, 8, 32 and 256 rows of other data (at several indices); the probe's output must be the same
bits every time. Shapes: the Qwen2.5-1.5B layer (d 1,536, 12/2 heads of 128, ffn 8,960, vocab 151,936).

  JAX_PLATFORMS=cuda python -m pytest -q -m gpu tests/test_deterministic_ops_gpu.py
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

if jax.default_backend() != "gpu":
    pytest.skip("needs an NVIDIA GPU (JAX_PLATFORMS=cuda)", allow_module_level=True)

from ember.compiler.kernels.activation import gated_act_packed  # noqa: E402
from ember.compiler.kernels.norm.kernel import add_rms_norm_triton, rms_norm_triton  # noqa: E402
from ember.compiler.kernels.norm.reference import add_rms_norm_invariant, rms_norm_invariant  # noqa: E402
from ember.compiler.kernels.rope.reference import rope  # noqa: E402

pytestmark = pytest.mark.gpu
D, HQ, HKV, DH, FFN, VOCAB = 1536, 12, 2, 128, 8960, 151936
ROWS = (1, 2, 8, 32, 256)


def _norm(x):
    return rms_norm_invariant(x, jnp.linspace(0.5, 1.5, D, dtype=jnp.bfloat16), eps=1e-6)


def _add_norm(x):
    return add_rms_norm_invariant(x, x * 0.5, jnp.linspace(0.5, 1.5, D, dtype=jnp.bfloat16), eps=1e-6)[1]


def _rope(x):  # x [N, (HQ + HKV) * DH]: q and k of one row; positions from the row's first value
    q, k = x[:, : HQ * DH].reshape(-1, HQ, DH), x[:, HQ * DH :].reshape(-1, HKV, DH)
    positions = (jnp.abs(x[:, 0].astype(jnp.float32)) * 1000).astype(jnp.int32)
    inv_freq = 1.0 / (1e6 ** (jnp.arange(0, DH, 2, dtype=jnp.float32) / DH))
    q, k = rope(q, k, positions, inv_freq, style="neox")
    return jnp.concatenate([q.reshape(q.shape[0], -1), k.reshape(k.shape[0], -1)], axis=-1)


def _norm_triton(x):  # the Triton kernel: one program per row (a candidate for the deterministic plans)
    return rms_norm_triton(x, jnp.linspace(0.5, 1.5, D, dtype=jnp.bfloat16), eps=1e-6)


def _add_norm_triton(x):
    return add_rms_norm_triton(x, x * 0.5, jnp.linspace(0.5, 1.5, D, dtype=jnp.bfloat16), eps=1e-6)[1]


def _gated(x):
    return gated_act_packed(x, act="silu")


def _log_softmax(x):  # the sampler's logprobs (compiler/kernels/sampling.py)
    return jax.nn.log_softmax(x.astype(jnp.float32), axis=-1)


def _logsumexp(x):
    return jax.nn.logsumexp(x.astype(jnp.float32), axis=-1)


OPS = {  # name -> (fn, row width)
    "rms_norm_invariant": (_norm, D),
    "add_rms_norm_invariant": (_add_norm, D),
    "rms_norm_triton": (_norm_triton, D),
    "add_rms_norm_triton": (_add_norm_triton, D),
    "rope": (_rope, (HQ + HKV) * DH),
    "gated_act_packed": (_gated, 2 * FFN),
    "log_softmax": (_log_softmax, VOCAB),
    "logsumexp": (_logsumexp, VOCAB),
}


@pytest.mark.parametrize("name", OPS)
def test_a_rows_bits_do_not_depend_on_the_rows_beside_it(name):
    fn, width = OPS[name]
    run = jax.jit(fn)
    rng = np.random.default_rng(0)
    probe = rng.standard_normal(width).astype(np.float32)
    alone = np.asarray(run(jnp.asarray(probe[None], jnp.bfloat16)))[0]
    differs = []
    for rows in ROWS[1:]:
        for index in sorted({0, rows // 2, rows - 1}):
            x = rng.standard_normal((rows, width)).astype(np.float32)
            x[index] = probe
            got = np.asarray(run(jnp.asarray(x, jnp.bfloat16)))[index]
            if not np.array_equal(got, alone):
                differs.append((rows, index))
    assert not differs, f"{name}: the probe's bits change at (rows, index) {differs}"


@functools.cache
def _matmul_weight():
    rng = np.random.default_rng(1)
    return jnp.asarray(rng.standard_normal((D, D)) * 0.02, jnp.bfloat16), jnp.asarray(
        rng.standard_normal(D), jnp.bfloat16
    )


def test_the_invariant_linear_with_bias():
    from ember.compiler.kernels.invariant_matmul.linear import linear

    weight, bias = _matmul_weight()
    run = jax.jit(lambda x: linear(x, weight, bias))
    rng = np.random.default_rng(2)
    probe = rng.standard_normal(D).astype(np.float32)
    alone = np.asarray(run(jnp.asarray(probe[None], jnp.bfloat16)))[0]
    for rows in ROWS[1:]:
        x = rng.standard_normal((rows, D)).astype(np.float32)
        x[rows // 2] = probe
        assert np.array_equal(np.asarray(run(jnp.asarray(x, jnp.bfloat16)))[rows // 2], alone), rows


def _sampling_batch(rows: int, probe_at: int, rng):
    """rows of mixed settings (greedy, top-p, top-k) with the probe's at `probe_at`: temperature 0.8, top-p 0.9,
    seed 5, step 3 (the engine test's sampled request)."""
    from ember.runtime.sampling.params import _inert_batch

    batch = _inert_batch(rows, 1, 1, 1, (VOCAB + 31) // 32)
    batch.temperature[:] = rng.choice([0.0, 0.7, 1.0], rows)
    batch.top_p[:] = rng.choice([1.0, 0.8, 0.95], rows)
    batch.top_k[:] = rng.choice([0, 40], rows)
    batch.seed[:] = rng.integers(0, 1000, rows)
    batch.step[:] = rng.integers(0, 50, rows)
    batch.temperature[probe_at], batch.top_p[probe_at], batch.top_k[probe_at] = 0.8, 0.9, 0
    batch.seed[probe_at], batch.step[probe_at] = 5, 3
    return jax.tree.map(jnp.asarray, batch)


def test_the_deterministic_sampler_draws_a_rows_token_whatever_the_rows_beside_it():
    """sample(fixed_order=True) on the probe row's logits (peaked like a model's: a nucleus of a few hundred
    tokens) among 1-256 rows: the same token, logprob and top logprobs, and the same filtered logits and
    noise inside it (which part differs, if one does)."""
    from ember.compiler.kernels import sampling

    def parts(logits, params):
        result = sampling.sample(logits, params, 3, fixed_order=True)
        scaled = logits / jnp.where(params.temperature > 0, params.temperature, 1.0)[:, None]
        filtered = sampling.filter_logits(scaled, params, fixed_order=True)
        noise = jax.vmap(sampling._row_gumbel, in_axes=(0, 0, None))(params.seed, params.step, VOCAB)
        return result, filtered, noise

    run = jax.jit(parts)
    rng = np.random.default_rng(3)
    probe = (rng.standard_normal(VOCAB) * 2.5).astype(np.float32)
    alone = jax.tree.map(lambda a: np.asarray(a)[0], run(jnp.asarray(probe[None]), _sampling_batch(1, 0, rng)))
    differs = []
    for rows in ROWS[1:]:
        for index in sorted({0, rows // 2, rows - 1}):
            logits = (rng.standard_normal((rows, VOCAB)) * 2.5).astype(np.float32)
            logits[index] = probe
            got = jax.tree.map(
                lambda a: np.asarray(a)[index], run(jnp.asarray(logits), _sampling_batch(rows, index, rng))
            )
            (result, filtered, noise), (want, want_filtered, want_noise) = got, alone
            parts_differing = [name for name, a, b in zip(result._fields, result, want) if not np.array_equal(a, b)]
            parts_differing += ["filtered"] * (not np.array_equal(filtered, want_filtered))
            parts_differing += ["noise"] * (not np.array_equal(noise, want_noise))
            if parts_differing:
                differs.append((rows, index, parts_differing))
    assert not differs, f"the probe row's sampling changes at (rows, index, parts) {differs}"

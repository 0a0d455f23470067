"""Deterministic mode on the cpu target is the bucketed fast path (no fixed tiles): the facts its kernel
policy rests on, and a row's logits bitwise unchanged by what else its step holds (drawn batch compositions).
docs/kernel_policy.md, "Batch invariance"."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fixture_data import tiny_fixture
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_configs import TINY_LLAMA

from ember.compiler.batch import StepBatch
from ember.compiler.kernels.dense_gemv.reference import linear
from ember.compiler.kernels.fixed_order import fixed_order_sum
from ember.compiler.kernels.norm.reference import rms_norm_invariant
from ember.compiler.targets import get_target
from ember.runtime.loading.model import load_model

BLOCK = 16
WIDTH = 8  # table blocks


@pytest.mark.parametrize("k, n", [(64, 256), (1536, 256), (8960, 1536)])
def test_xla_cpu_matmul_rows_do_not_depend_on_the_row_count_from_two_rows(k, n):
    """Why linear_invariant gives a one-row float matmul a second row (XLA runs one row as a GEMV)."""
    rng = np.random.default_rng(k)
    w = jnp.asarray(rng.standard_normal((n, k)).astype(np.float32))
    x = rng.standard_normal((70, k)).astype(np.float32)
    f = jax.jit(linear)
    first = np.asarray(f(jnp.asarray(x[:2]), w))
    for m in (3, 16, 33, 70):
        got = np.asarray(f(jnp.asarray(x[:m]), w))[:2]
        assert np.array_equal(got, first), f"{m} rows"


def test_a_one_row_float_projection_has_the_bits_of_the_same_row_beside_others():
    from ember.compiler.kernels.cpu_gemv.linear import linear_invariant

    rng = np.random.default_rng(5)
    w = jnp.asarray(rng.standard_normal((256, 1536)).astype(np.float32))
    x = rng.standard_normal((9, 1536)).astype(np.float32)
    f = jax.jit(linear_invariant)
    alone = np.asarray(f(jnp.asarray(x[:1]), w))[0]
    for m in (2, 5, 9):
        assert np.array_equal(np.asarray(f(jnp.asarray(x[:m]), w))[0], alone), f"{m} rows"


def test_invariant_rms_norm_rows_do_not_depend_on_rows_or_heads():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((130, 12, 128)).astype(np.float32)
    w = jnp.asarray(rng.uniform(0.5, 1.5, 128).astype(np.float32))
    f = jax.jit(lambda a: rms_norm_invariant(a, w, eps=1e-6))
    alone = np.asarray(f(jnp.asarray(x[:1])))[0]
    for m in (2, 10, 40, 130):
        assert np.array_equal(np.asarray(f(jnp.asarray(x[:m])))[0], alone), f"{m} rows"
    want = x[0] / np.sqrt((x[0].astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * np.asarray(w)
    np.testing.assert_allclose(alone, want, rtol=1e-5)


def test_fixed_order_sum_is_the_sum_over_any_axis():
    x = np.random.default_rng(1).standard_normal((5, 7, 3)).astype(np.float32)
    for axis in (0, 1, -1):
        np.testing.assert_allclose(np.asarray(fixed_order_sum(jnp.asarray(x), axis)), x.sum(axis), rtol=1e-5)


def test_sampler_logprobs_do_not_depend_on_the_row_count():
    """A deterministic step's logprobs are the same bits whatever the step's row count: the sampler's
    log-softmax sums in a fixed order there (fixed_order; XLA CPU's own reduction over V rounds differently
    from ~16 rows, so default steps, which keep XLA's parallel reduction for the GPU, may differ)."""
    from ember.compiler.kernels.sampling import sample
    from ember.runtime.execution.engine_step import SUPPRESS_SLOTS
    from ember.runtime.sampling.params import RowState, SamplingParams, pack_batch

    vocab = 256
    logits = np.random.default_rng(2).standard_normal((40, vocab)).astype(np.float32) * 3
    f = jax.jit(functools.partial(sample, fixed_order=True), static_argnums=2)

    def row0(n):
        rows = [RowState(SamplingParams(temperature=0.0, logprobs=2), 0, (1, 2), ())] * n
        batch = pack_batch(rows, vocab_size=vocab, history_bucket=1, suppress_slots=SUPPRESS_SLOTS)
        result = f(jnp.asarray(logits[:n]), jax.tree.map(jnp.asarray, batch), 2)
        return float(result.logprob[0]), np.asarray(result.top_logprobs[0]).tolist()

    alone = row0(1)
    assert all(row0(n) == alone for n in (2, 16, 40))


def test_the_cpu_target_runs_deterministic_steps_at_the_default_buckets(qwen3):
    from ember.runtime.engine.config import EngineConfig, prefill_shapes
    from ember.runtime.execution.step_executor import StepExecutor

    policy = get_target("cpu").policy.deterministic
    assert policy.bucketed and policy.min_rows == 1
    config = EngineConfig(num_blocks=16, max_model_len=128, max_num_seqs=8, max_batched_tokens=64, deterministic=True)
    prefill = prefill_shapes(qwen3.plan.manifest["entries"]["forward"], config)
    executor = StepExecutor(qwen3, config, prefill)
    shapes = executor.shapes()
    assert executor.tiles is None and min(s.decode_rows for s in shapes if not s.prefill_tokens) == 1
    assert len(shapes) > 1


# dims whose rows are whole Q4_K / Q6_K super-blocks; mixed formats in one packed q/k/v
TINY_GGUF = {**TINY_LLAMA, "tie_word_embeddings": True}


def _tiny_gguf(path):
    """A tiny Qwen2 GGUF whose matrices the cpu target keeps as int8 blocks (Q4_K, Q6_K, Q8_0)."""
    import gguf
    from gguf_test_data import write_gguf

    from ember.compiler.spec import spec_for_arch
    from ember.runtime.loading.synthetic_gguf import synthetic_gguf_checkpoint

    spec = spec_for_arch("qwen2")
    ckpt = synthetic_gguf_checkpoint(spec, TINY_GGUF, seed=3, types={"blk.0.ffn_up.weight": "Q8_0"})
    kinds = {str: gguf.GGUFValueType.STRING, int: gguf.GGUFValueType.UINT32, float: gguf.GGUFValueType.FLOAT32}
    metadata = {k: (v, kinds[type(v)]) for k, v in ckpt.metadata.items() if k != "general.architecture"}
    tensors = {name: (info.ggml_type, ckpt.raw(name), info.shape) for name, info in ckpt._gguf.tensors.items()}
    return write_gguf(path, tensors, metadata, arch=spec.gguf_architecture)


# the tiny HF Qwen3 (float weights: XLA's GEMM) and, slow (~4 min on 2 shared cores), a tiny GGUF through the int8-block
# kernel (cpu_gemv; tests/kernels/cpu_gemv checks its batch invariance in CI)
@pytest.fixture(scope="module", params=["hf", pytest.param("gguf", marks=pytest.mark.slow)])
def qwen3(request, tmp_path_factory):
    if request.param == "gguf":
        from ember.compiler.kernels.cpu_gemv.layout import BlockQ8Weight

        model = load_model(_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf"))
        assert any(isinstance(w, BlockQ8Weight) for w in model.params.layers[0].values())
        return model
    path, _ = tiny_fixture("qwen3")
    return load_model(path)


@pytest.fixture(scope="module")
def forward(qwen3):
    plan = qwen3.deterministic_plan()
    return jax.jit(qwen3.traced(plan.module.forward), static_argnums=0)


def _prefilled(model, forward, prompt):
    """A pool holding the target's prompt (blocks 1..3), prefilled alone as one segment."""
    kv = model.new_kv(64, BLOCK)
    table = np.zeros(WIDTH, np.int32)
    table[:3] = [1, 2, 3]
    n, length = 64, len(prompt)
    tokens, positions, slots = np.zeros(n, np.int32), np.zeros(n, np.int32), np.zeros((1, n), np.int32)
    tokens[:length], positions[:length] = prompt, np.arange(length)
    slots[0, :length] = table[np.arange(length) // BLOCK] * BLOCK + np.arange(length) % BLOCK
    batch = StepBatch(
        *map(jnp.asarray, (tokens, positions, slots)),
        jnp.zeros((1, 0, WIDTH), jnp.int32),
        jnp.zeros((0,), jnp.int32),
        jnp.asarray(table[None, None]),
        jnp.asarray([length - 1, 0], jnp.int32),
    )
    return forward(model.dims, model.params, kv, batch)[1], table


def _decode_row_logits(model, forward, kv, table, position, neighbours, decode_rows, chunk):
    """The target's decode row (row `neighbours`, after other decode rows of random contexts) in a step of
    `decode_rows` padded decode rows and, if chunk > 0, one other sequence's chunk of `chunk` tokens padded
    to a prefill bucket: the target's logits."""
    rng = np.random.default_rng(decode_rows * 131 + chunk)
    pad = next(b for b in (16, 32, 64) if b >= chunk) if chunk else 0
    n = decode_rows + pad
    tokens, positions, slots = np.zeros(n, np.int32), np.zeros(n, np.int32), np.zeros((1, n), np.int32)
    tables, ctx = np.zeros((1, decode_rows, WIDTH), np.int32), np.ones(decode_rows, np.int32)
    for r in range(neighbours):  # other sequences in blocks 20.., random contexts (their KV: whatever is there)
        tables[0, r, :2] = [20 + 2 * r, 21 + 2 * r]
        positions[r] = rng.integers(0, 2 * BLOCK)
        tokens[r], ctx[r] = rng.integers(3, 250), positions[r] + 1
        slots[0, r] = tables[0, r, positions[r] // BLOCK] * BLOCK + positions[r] % BLOCK
    t = neighbours
    tokens[t], positions[t], ctx[t], tables[0, t] = 7, position, position + 1, table
    slots[0, t] = table[position // BLOCK] * BLOCK + position % BLOCK
    pre = np.zeros((1, 1, WIDTH), np.int32)
    if chunk:
        pre[0, 0, :4] = [50, 51, 52, 53]
        lo = decode_rows
        tokens[lo : lo + chunk] = rng.integers(3, 250, chunk)
        positions[lo : lo + chunk] = np.arange(chunk)
        slots[0, lo : lo + chunk] = pre[0, 0, np.arange(chunk) // BLOCK] * BLOCK + np.arange(chunk) % BLOCK
    rows = [t] + ([decode_rows + chunk - 1] if chunk else [])
    batch = StepBatch(*map(jnp.asarray, (tokens, positions, slots, tables, ctx, pre)), jnp.asarray(rows, jnp.int32))
    logits, _ = forward(model.dims, model.params, kv, batch)
    return np.asarray(logits)[0]


@settings(max_examples=8, deadline=None)
@given(
    neighbours=st.integers(0, 7),
    extra_rows=st.sampled_from([0, 1, 6]),
    chunk=st.sampled_from([0, 3, 16, 30, 64]),
)
def test_a_rows_logits_are_bitwise_unchanged_by_the_rest_of_its_step(qwen3, forward, neighbours, extra_rows, chunk):
    prompt = np.arange(5, 42, dtype=np.int32)
    kv, table = _prefilled(qwen3, forward, prompt)
    alone = _decode_row_logits(qwen3, forward, kv, table, len(prompt), 0, 1, 0)  # one row: a one-row step
    kv, table = _prefilled(qwen3, forward, prompt)
    decode_rows = neighbours + 1 + extra_rows
    crowded = _decode_row_logits(qwen3, forward, kv, table, len(prompt), neighbours, decode_rows, chunk)
    assert np.array_equal(alone, crowded), np.abs(alone - crowded).max()

"""Several prefill chunks in one step (P segments of L tokens, compiler/batch.py): the step layout the runtime
builds, the attention ops over it (each segment attends only to its own sequence, exactly as one chunk per
call would), and the engine admitting a burst of short prompts in one step with unchanged outputs."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fixture_data import tiny_fixture

from ember.compiler.batch import StepBatch
from ember.compiler.kernels.attention import paged_attention_emulated
from ember.compiler.kernels.attention.blockwise import paged_attention_blockwise
from ember.compiler.kernels.attention.reference import paged_attention
from ember.runtime.engine import engine as engine_module
from ember.runtime.engine.engine import Engine, EngineConfig
from ember.runtime.execution.step_inputs import StepShape, all_step_shapes, build_step_batch, step_shape
from ember.runtime.loading.model import load_model
from ember.runtime.sampling.params import SamplingParams
from ember.runtime.scheduling.scheduled_step import DecodeRow, PrefillChunk, PrefillShapes, ScheduledStep

BS = 4  # tokens per KV block


def _chunk(rid: str, start: int, n: int, table: tuple[int, ...], completes=True) -> PrefillChunk:
    slots = tuple((table[p // BS] * BS + p % BS,) for p in range(start, start + n))
    return PrefillChunk(rid, start, tuple(range(100 + start, 100 + start + n)), slots, completes)


def test_prefill_shapes_bound_a_step_by_the_largest_bucket():
    shapes = PrefillShapes((16, 64, 256), (1, 2, 4), segment_max_tokens=64)
    assert shapes.fits(1, 256) and not shapes.fits(1, 300)
    assert shapes.fits(4, 64) and shapes.fits(3, 50)  # 4 x 64 = 256
    assert not shapes.fits(2, 65) and not shapes.fits(5, 10)  # a segment over 64 tokens; more than 4 chunks
    assert shapes.layouts() == [(1, 16), (1, 64), (1, 256), (2, 16), (2, 64), (4, 16), (4, 64)]
    assert len(all_step_shapes((1, 8), shapes, 10)) == 2 + 2 * 7
    assert PrefillShapes((16, 64)).layouts() == [(1, 16), (1, 64)]  # one chunk per step


def test_step_batch_lays_each_chunk_out_in_its_own_segment():
    tables = {"d": ((1, 2),), "a": ((3, 4),), "b": ((5,),), "c": ((6, 7, 8),)}
    plan = ScheduledStep(
        decodes=(DecodeRow("d", 9, 5, (2 * BS + 1,)),),
        prefills=(
            _chunk("a", 0, 6, tables["a"][0]),
            _chunk("b", 0, 3, tables["b"][0]),
            _chunk("c", 4, 7, tables["c"][0], completes=False),
        ),
        block_tables=tables,
    )
    assert plan.logit_rows == (0, 6, 9) and plan.logit_request_ids == ("d", "a", "b")
    shape = step_shape(plan, (1, 2), PrefillShapes((8, 32), (1, 2, 4), 8), table_blocks=4)
    assert shape == StepShape(2, 4 * 8, 4, 1, 4)  # a mixed step: decode rows padded to the largest bucket
    batch = build_step_batch(plan, shape)
    assert batch.pre_block_table.shape == (1, 4, 4) and batch.num_segments == 4
    assert batch.pre_block_table[0, :, :3].tolist() == [[3, 4, 0], [5, 0, 0], [6, 7, 8], [0, 0, 0]]
    assert batch.tokens[:2].tolist() == [9, 0] and batch.positions[:2].tolist() == [5, 0]
    seg = lambda a, s: a[2 + 8 * s : 2 + 8 * (s + 1)].tolist()  # noqa: E731
    assert seg(batch.positions, 0) == [0, 1, 2, 3, 4, 5, 0, 0] and seg(batch.tokens, 1) == [100, 101, 102] + [0] * 5
    assert seg(batch.positions, 2) == [4, 5, 6, 7, 8, 9, 10, 0] and seg(batch.tokens, 3) == [0] * 8
    assert seg(batch.slots[0], 2) == [7 * BS, 7 * BS + 1, 7 * BS + 2, 7 * BS + 3, 8 * BS, 8 * BS + 1, 8 * BS + 2, 0]
    assert batch.logit_rows.tolist() == [0, 2 + 5, 2 + 8 + 2, 0, 0, 0]  # B + P rows; c does not complete
    with pytest.raises(ValueError, match="no compiled layout"):  # 3 chunks where only one per step compiles
        step_shape(plan, (1, 2), PrefillShapes((8, 16)), table_blocks=4)


def _segmented_case(seed: int, dtype, window: int):
    """3 decode rows and 3 segments of 8 tokens (a chunk after a 13-token prefix, a prompt from 0, padding)
    over one pool of random values; K/V of the step's tokens are inputs, written by the op."""
    rng = np.random.default_rng(seed)
    hq, hkv, dh, width, blocks = 8, 2, 16, 8, 48
    pool = lambda: jnp.asarray(rng.standard_normal((blocks, BS, hkv, dh)), dtype)  # noqa: E731
    k_pool, v_pool = pool(), pool()
    owned = rng.permutation(np.arange(1, blocks))
    tables = [owned[i * width : (i + 1) * width].astype(np.int32) for i in range(5)]  # 3 decode + 2 chunk seqs
    dec_pos = [20, 3, 9]
    chunks = [(3, 13, 5), (4, 0, 8)]  # (sequence, start, tokens)
    positions = dec_pos + [0] * 24
    slots = [int(tables[i][p // BS]) * BS + p % BS for i, p in enumerate(dec_pos)] + [0] * 24
    for s, (seq, start, n) in enumerate(chunks):
        for i in range(n):
            positions[3 + 8 * s + i] = start + i
            slots[3 + 8 * s + i] = int(tables[seq][(start + i) // BS]) * BS + (start + i) % BS
    n = len(positions)
    batch = StepBatch(
        tokens=jnp.zeros(n, jnp.int32),
        positions=jnp.asarray(positions, jnp.int32),
        slots=jnp.asarray([slots], jnp.int32),
        dec_block_tables=jnp.asarray(np.stack(tables[:3])[None]),
        dec_ctx_lens=jnp.asarray([p + 1 for p in dec_pos], jnp.int32),
        pre_block_table=jnp.asarray(np.stack([tables[3], tables[4], np.zeros(width, np.int32)])[None]),
        logit_rows=jnp.zeros(6, jnp.int32),
    )
    q = jnp.asarray(rng.standard_normal((n, hq, dh)), dtype)
    kv = lambda: jnp.asarray(rng.standard_normal((n, hkv, dh)), dtype)  # noqa: E731
    return (q, kv(), kv(), jnp.int32(window), jnp.int32(0), k_pool, v_pool, batch), chunks


def _one_segment(args, s: int, chunk_len: int = 8):
    """The same step with only segment s's chunk (and no decode rows): what one chunk per step computes."""
    q, k, v, window, state, k_pool, v_pool, batch = args
    rows = slice(3 + chunk_len * s, 3 + chunk_len * (s + 1))
    one = StepBatch(
        tokens=batch.tokens[rows],
        positions=batch.positions[rows],
        slots=batch.slots[:, rows],
        dec_block_tables=batch.dec_block_tables[:, :0],
        dec_ctx_lens=batch.dec_ctx_lens[:0],
        pre_block_table=batch.pre_block_table[:, s : s + 1],
        logit_rows=batch.logit_rows[:1],
    )
    return q[rows], k[rows], v[rows], window, state, k_pool, v_pool, one


@pytest.mark.parametrize("window", [0, 6])
def test_each_segment_attends_to_its_own_sequence(window):
    args, chunks = _segmented_case(3, jnp.float32, window)
    ops = {
        name: jax.jit(functools.partial(fn, scale=0.25))
        for name, fn in (
            ("reference", paged_attention),
            ("blockwise", paged_attention_blockwise),
            ("h200", paged_attention_emulated),
        )
    }
    want, want_k, _ = ops["reference"](*args)
    valid = np.r_[0:3, 3 : 3 + chunks[0][2], 11 : 11 + chunks[1][2]]  # padding rows' outputs are unspecified
    for name, op in ops.items():
        got, got_k, _ = op(*args)
        np.testing.assert_allclose(np.asarray(got)[valid], np.asarray(want)[valid], rtol=2e-5, atol=2e-5, err_msg=name)
        np.testing.assert_array_equal(np.asarray(got_k), np.asarray(want_k))  # every row's K written once
        for s, (_, _, n) in enumerate(chunks):
            alone, _, _ = op(*_one_segment(args, s))
            rows = slice(3 + 8 * s, 3 + 8 * s + n)
            np.testing.assert_allclose(
                np.asarray(got[rows]), np.asarray(alone[:n]), rtol=2e-5, atol=2e-5, err_msg=f"{name} segment {s}"
            )


def test_segments_in_bf16_through_the_h200_path():
    args, chunks = _segmented_case(5, jnp.bfloat16, 0)
    got = jax.jit(functools.partial(paged_attention_emulated, scale=0.25))(*args)[0].astype(jnp.float32)
    f32 = [a.astype(jnp.float32) if isinstance(a, jax.Array) and a.dtype == jnp.bfloat16 else a for a in args]
    want = jax.jit(functools.partial(paged_attention, scale=0.25))(*f32)[0]
    valid = np.r_[0:3, 3 : 3 + chunks[0][2], 11 : 11 + chunks[1][2]]
    np.testing.assert_allclose(np.asarray(got)[valid], np.asarray(want)[valid], rtol=2e-2, atol=2e-2)


def test_the_engine_prefills_a_burst_of_prompts_together_with_unchanged_outputs(monkeypatch):
    from test_engine import GREEDY, ByteTokenizer, _alone

    path, _ = tiny_fixture("qwen3")
    model = load_model(path)
    layouts = PrefillShapes((32, 128), (1, 2, 4), segment_max_tokens=32)
    monkeypatch.setattr(engine_module, "prefill_shapes", lambda entry, config, tiled=False: layouts)
    engine = Engine(
        model, ByteTokenizer(), EngineConfig(num_blocks=96, max_model_len=128, max_num_seqs=8, max_batched_tokens=128)
    )
    chunk_counts = []
    launch = engine.executor.launch

    def counting_launch(step, rows, steps, **kwargs):
        chunk_counts.append(len(step.prefills))
        return launch(step, rows, steps, **kwargs)

    engine.executor.launch = counting_launch
    rng = np.random.default_rng(4)
    cases = [(rng.integers(3, 250, size=n).tolist(), m) for n, m in ((5, 6), (12, 4), (30, 7), (9, 3), (17, 5))]
    try:
        streams = [engine.submit(p, SamplingParams(max_tokens=m, **GREEDY)) for p, m in cases]
        results = [[t for o in s.collect()[0] for t in o.token_ids] for s in streams]
    finally:
        engine.close()
    assert max(chunk_counts) >= 2  # some step carried several prompts
    assert results == [_alone(model, p, m) for p, m in cases]
    assert engine.pool.free_blocks == engine.pool.num_usable_blocks

"""EngineConfig.kv_cache_dtype: FP8 (e4m3) KV pools end to end on CPU — the write's rounding, the pools' bytes,
the engine against one request alone on the same pools, the h200 plans (their jnp twins here) against the cpu
plans, and the serve flag. The GPU kernels on FP8 pools: tests/kernels/attention/test_attention_gpu.py, tests/kernels/rope/test_rope_write_gpu.py."""

import argparse

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from fixture_data import tiny_fixture
from test_engine import GREEDY, ByteTokenizer, _alone, _tokens
from test_h200_target import _log_softmax

from ember.compiler.kernels.attention.reference import to_pool_dtype
from ember.runtime.engine.engine import Engine, EngineConfig, kv_bytes_per_block, sized_config
from ember.runtime.execution.sequence_runner import SequenceRunner
from ember.runtime.loading.model import load_model
from ember.runtime.sampling.params import SamplingParams

FP8 = np.dtype(jnp.float8_e4m3fn)


@pytest.fixture(scope="module")
def qwen3():
    path, _ = tiny_fixture("qwen3")
    return load_model(path)


def test_the_write_rounds_to_nearest_and_saturates():
    x = jnp.asarray([0.1, -3.3, 447.0, 460.0, 1e4, -1e9, 2.0**-9], jnp.float32)
    got = np.asarray(to_pool_dtype(x, jnp.float8_e4m3fn))
    assert got.dtype == FP8
    want = np.asarray(x).astype(ml_dtypes.float8_e4m3fn)[:3]  # in range: round to nearest even
    np.testing.assert_array_equal(got[:3].astype(np.float32), want.astype(np.float32))
    assert got[3:6].astype(np.float32).tolist() == [448.0, 448.0, -448.0]  # never NaN, as the GPU's satfinite
    assert np.asarray(to_pool_dtype(x, jnp.bfloat16)).dtype == jnp.bfloat16


def test_fp8_pools_take_a_quarter_of_float32_bytes(qwen3):
    d = qwen3.dims
    assert kv_bytes_per_block(qwen3, 16, kv_cache_dtype="fp8") == 2 * d.layers * 16 * d.hkv * d.dh
    assert kv_bytes_per_block(qwen3, 16) == 4 * kv_bytes_per_block(qwen3, 16, kv_cache_dtype="fp8_e4m3")
    budget = kv_bytes_per_block(qwen3, 16) * 10
    assert sized_config(qwen3, kv_memory_bytes=budget, kv_cache_dtype="fp8").num_blocks == 41  # + block 0
    with pytest.raises(ValueError, match="kv_cache_dtype 'int4'"):
        EngineConfig(kv_cache_dtype="int4")


def test_engine_on_fp8_pools_matches_each_request_alone(qwen3):
    rng = np.random.default_rng(3)
    cases = [(rng.integers(3, 250, size=n).tolist(), m) for n, m in ((5, 9), (40, 6), (77, 12))]
    engine = Engine(
        qwen3,
        ByteTokenizer(),
        EngineConfig(num_blocks=64, max_model_len=256, max_num_seqs=4, max_batched_tokens=48, kv_cache_dtype="fp8"),
    )
    try:
        assert all(k.dtype == FP8 and v.dtype == FP8 for k, v in engine.executor.kv)
        streams = [engine.submit(p, SamplingParams(max_tokens=m, **GREEDY)) for p, m in cases]
        results = [_tokens(s)[0][0] for s in streams]
        assert engine.snapshot()["free_kv_blocks"] == engine.snapshot()["total_kv_blocks"]
    finally:
        engine.close()
    assert results == [_alone(qwen3, p, m, FP8) for p, m in cases]


@pytest.mark.parametrize("target", ["cpu", "h200"])
def test_fp8_pools_change_the_logits_by_fp8_rounding_only(target):
    # each target on FP8 pools against itself on pools of its activation dtype: not equal (the pools really hold
    # FP8), close (K and V carry e4m3's ~3% rounding); the h200 plans run their kernels' jnp twins here
    path, ref = tiny_fixture("llama")
    model = load_model(path, target=target)
    tokens = ref["input_ids"].tolist()
    wide = SequenceRunner(model, 64).prefill(tokens, all_logits=True).astype(np.float32)
    fp8 = SequenceRunner(model, 64, kv_dtype=FP8).prefill(tokens, all_logits=True).astype(np.float32)
    p_wide, p_fp8 = _log_softmax(wide), _log_softmax(fp8)
    kl = (np.exp(p_wide) * (p_wide - p_fp8)).sum(-1)
    assert not np.array_equal(wide, fp8)
    assert kl.mean() <= 1e-2, kl.mean()  # 2.3e-3 .. 3.4e-3 on the tiny checkpoints (flat random logits)
    assert (wide.argmax(-1) == fp8.argmax(-1)).mean() >= 0.8


@pytest.mark.parametrize("op", ["reference", "h200_emulated", "blockwise"])
def test_attention_over_an_fp8_pool_is_attention_over_its_rounded_values(op):
    # the same step on an FP8 pool and on a float32 pool written with the FP8-rounded K / V: the outputs equal
    # (a read widens exactly) and the pools hold the same values
    import jax
    from test_attention_decode import _step_batch

    from ember.compiler.kernels.attention import paged_attention_emulated
    from ember.compiler.kernels.attention.blockwise import paged_attention_blockwise
    from ember.compiler.kernels.attention.reference import paged_attention

    fn = {
        "reference": paged_attention,
        "h200_emulated": paged_attention_emulated,
        "blockwise": paged_attention_blockwise,
    }[op]
    hq, hkv, dh, block_size, width = 8, 2, 32, 16, 8
    rng = np.random.default_rng(5)
    batch, n, num_blocks = _step_batch(rng, [70, 1, 33], (21, 9), block_size, width, kinds=1, state=0, window=0)
    q = jnp.asarray(rng.standard_normal((n, hq, dh)) * 3, jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((n, hkv, dh)) * 3, jnp.float32) for _ in range(2))
    history = [rng.standard_normal((num_blocks, block_size, hkv, dh)) * 3 for _ in range(2)]
    fp8_pools = [to_pool_dtype(jnp.asarray(h), jnp.float8_e4m3fn) for h in history]
    wide_pools = [p.astype(jnp.float32) for p in fp8_pools]
    step = jax.jit(fn, static_argnames="scale")
    got, got_k, got_v = step(q, k, v, jnp.int32(0), jnp.int32(0), *fp8_pools, batch, scale=0.2)
    want, want_k, want_v = step(
        q,
        to_pool_dtype(k, jnp.float8_e4m3fn).astype(jnp.float32),
        to_pool_dtype(v, jnp.float8_e4m3fn).astype(jnp.float32),
        jnp.int32(0),
        jnp.int32(0),
        *wide_pools,
        batch,
        scale=0.2,
    )
    assert got_k.dtype == FP8
    if op == "h200_emulated":  # an FP8 pool's decode tiles hold twice the tokens: fp32 sums in another order
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    else:
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    np.testing.assert_array_equal(np.asarray(got_k, np.float32), np.asarray(want_k))
    np.testing.assert_array_equal(np.asarray(got_v, np.float32), np.asarray(want_v))


def test_serve_flag_and_environment_choose_the_kv_dtype():
    from ember.server.config import add_serve_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    h200 = ["--target", "h200"]
    assert config_from_args(parser.parse_args(["--kv-cache-dtype", "fp8", *h200]), environ={}).kv_cache_dtype == "fp8"
    assert (
        config_from_args(parser.parse_args(h200), environ={"EMBER_KV_CACHE_DTYPE": "fp8_e4m3"}).kv_cache_dtype
        == "fp8_e4m3"
    )
    assert config_from_args(parser.parse_args([]), environ={}).kv_cache_dtype == "auto"
    assert (
        config_from_args(parser.parse_args(["--kv-cache-dtype", "bfloat16"]), environ={}).kv_cache_dtype == "bfloat16"
    )
    with pytest.raises(SystemExit):
        parser.parse_args(["--kv-cache-dtype", "int4"])
    # FP8 pools only where the kernels write them (XLA's scatter converts a whole FP8 pool per write)
    with pytest.raises(SystemExit, match="needs a GPU target"):
        config_from_args(parser.parse_args(["--kv-cache-dtype", "fp8"]), environ={})
    with pytest.raises(SystemExit, match="not available with --deterministic"):
        config_from_args(parser.parse_args(["--kv-cache-dtype", "fp8", "--deterministic", *h200]), environ={})

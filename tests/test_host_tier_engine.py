"""The prefix cache's host tier in the engine (tiny checkpoints, CPU): a prompt whose blocks the device pool evicted
is served from host memory with the cold run's tokens and logprobs, bit for bit those of a device-cache hit,
`cached_tokens` counting the restored prefix; the counters reach /metrics and the startup line; plans the tier does
not serve say why (hybrid plans it serves: tests/test_hybrid_host_tier.py); the flag and its EMBER_ mirror parse."""

from __future__ import annotations

import argparse
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
from engine_support import ByteTokenizer
from fixture_data import tiny_fixture
from host_tier_support import device_hit, served

from ember.runtime.engine.config import capacity_line, host_tier_refusal, kv_bytes_per_block
from ember.runtime.engine.engine import Engine, EngineConfig
from ember.runtime.execution.sequence_runner import SequenceRunner
from ember.runtime.loading.model import load_model
from ember.runtime.state.kinds import PagedKind
from ember.server.config import add_serve_arguments, config_from_args
from ember.server.metrics import ServerMetrics

BASE = {"block_size": 4, "max_model_len": 64, "max_num_seqs": 2, "max_batched_tokens": 32}


@pytest.fixture(scope="module")
def qwen3():
    path, _ = tiny_fixture("qwen3")
    return load_model(path)


def _cold(model, prompt, max_tokens=5):
    runner = SequenceRunner(model, 64)
    logits, tokens, logprobs = runner.prefill(prompt), [], []
    for _ in range(max_tokens):
        z = np.asarray(logits, np.float64)
        z = z - z.max() - np.log(np.exp(z - z.max()).sum())
        tokens.append(int(np.argmax(z)))
        logprobs.append(z[tokens[-1]])
        if len(tokens) < max_tokens:
            logits = runner.decode(tokens[-1])
    return tokens, logprobs


def test_an_evicted_prompt_comes_back_from_the_host_as_computed(qwen3):
    rng = np.random.default_rng(3)
    prompt = rng.integers(3, 250, size=30).tolist()  # 7 full blocks; a hit resumes at 28
    others = [rng.integers(3, 250, size=30).tolist() for _ in range(3)]
    per_block = kv_bytes_per_block(qwen3, 4)
    config = EngineConfig(num_blocks=20, prefix_cache_host_bytes=64 * per_block, **BASE)
    engine = Engine(qwen3, ByteTokenizer(), config)
    try:
        tier = engine.host_tier
        cold = served(engine, prompt)
        for other in others:  # 19 usable blocks: each of these takes 9, so `prompt`'s go
            served(engine, other)
        assert engine.kv.primary.find_prefix(prompt) == [] and tier.counters().offloaded_blocks >= 7
        again = served(engine, prompt)
        counters = tier.counters()
        snapshot = engine.snapshot()
        metrics = ServerMetrics(SimpleNamespace(engine=engine, model_name="m")).render().decode()
    finally:
        engine.close()
    assert cold[2] == 0 and again[2] == 28  # cached_tokens: the restored prefix
    assert counters.restored_blocks == 7 and counters.restored_tokens == 28
    assert engine.kv.all_free() and not tier.has_pending and counters.used_bytes <= 64 * per_block
    assert snapshot["host_tier"] == counters
    assert f'ember:prefix_cache_host_restored_tokens_total{{model_name="m"}} {float(28)}' in metrics
    assert f'ember:prefix_cache_host_bytes_capacity{{model_name="m"}} {float(64 * per_block)}' in metrics

    want_tokens, want_logprobs = _cold(qwen3, prompt)
    assert cold[0] == again[0] == want_tokens
    np.testing.assert_allclose([lp for lp, _ in again[1]], want_logprobs, atol=1e-5)
    # the same hit from the device cache (no eviction): bit for bit what the host brought back gives
    hit = device_hit(qwen3, prompt, EngineConfig(num_blocks=40, **BASE))
    assert hit[2] == 28 and hit[:2] == again[:2]


def test_precompile_covers_the_tiers_copies(qwen3, monkeypatch):
    per_block = kv_bytes_per_block(qwen3, 4)
    engine = Engine(qwen3, ByteTokenizer(), EngineConfig(num_blocks=20, prefix_cache_host_bytes=64 * per_block, **BASE))
    try:
        calls = []
        monkeypatch.setattr(engine.executor, "shapes", lambda: [])  # the step shapes are another test's
        monkeypatch.setattr(engine.executor.block_copier, "precompile", lambda kv, *sizes: calls.append(sizes))
        engine.precompile()
    finally:
        engine.close()
    assert calls == [(19,)]  # copies of up to the 19 usable blocks (the tier holds 64)


def test_the_startup_line_and_plans_without_a_tier(qwen3):
    per_block = kv_bytes_per_block(qwen3, 4)
    config = EngineConfig(num_blocks=20, prefix_cache_host_bytes=64 * per_block, **BASE)
    assert host_tier_refusal(qwen3, config) is None
    assert "prefix-cache host tier" in capacity_line(qwen3, config) and "(256 tokens)" in capacity_line(qwen3, config)
    assert "host tier" not in capacity_line(qwen3, EngineConfig(num_blocks=20, **BASE))
    small = EngineConfig(num_blocks=20, prefix_cache_host_bytes=per_block - 1, **BASE)
    assert host_tier_refusal(qwen3, small) == "the host budget holds no KV block"
    off = EngineConfig(num_blocks=20, prefix_cache_host_bytes=per_block, enable_prefix_caching=False, **BASE)
    assert "host tier off: the prefix cache is off" in capacity_line(qwen3, off)
    engine = Engine(qwen3, ByteTokenizer(), off)
    try:
        assert engine.host_tier is None and engine.kv.host_tier is None and engine.snapshot()["host_tier"] is None
        metrics = ServerMetrics(SimpleNamespace(engine=engine, model_name="m")).render().decode()
    finally:
        engine.close()
    assert 'ember:prefix_cache_host_restored_blocks_total{model_name="m"} 0.0' in metrics  # zero without a tier
    # a hybrid plan (one full-attention kind, slot kinds) is tiered with its snapshots; a sliding window is not
    hybrid = load_model(tiny_fixture("qwen3_5")[0])
    tiered = EngineConfig(num_blocks=20, prefix_cache_host_bytes=2**20, **BASE)
    assert host_tier_refusal(hybrid, tiered) is None
    assert "or 62 recurrent-state snapshots" in capacity_line(hybrid, tiered)  # 2**20 // 16,896 bytes each
    unsnapshotted = replace(tiered, num_snapshot_slots=0)
    assert "keeps no snapshots of it" in host_tier_refusal(hybrid, unsnapshotted)
    smaller = replace(tiered, prefix_cache_host_bytes=hybrid.slot_bytes() - 1)
    assert host_tier_refusal(hybrid, smaller) == "the host budget holds no recurrent-state snapshot"
    sliding = SimpleNamespace(paged_kinds=(PagedKind("kv", 0), PagedKind("kv_8", 8)), slot_kinds=())
    assert "sliding-window" in host_tier_refusal(sliding, tiered)


@pytest.mark.parametrize(
    "argv, environ, want",
    [
        ([], {}, None),
        (["--prefix-cache-host-gib", "0"], {}, 0.0),
        (["--prefix-cache-host-gib", "1.5"], {"EMBER_PREFIX_CACHE_HOST_GIB": "3"}, 1.5),
        ([], {"EMBER_PREFIX_CACHE_HOST_GIB": "3"}, 3.0),
    ],
)
def test_the_flag_and_its_environment_mirror(argv, environ, want):
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    assert config_from_args(parser.parse_args(argv), environ).prefix_cache_host_gib == want


def test_the_default_size_is_the_targets():
    """Unset, the tier is off on the cpu target (its device memory is the host's) and on a GPU target twice the KV
    pool, at most a quarter of the host's available memory; a size given (0 included) is kept; a process group
    keeps no tier by default (it cannot yet)."""
    from ember.server.config import ServeConfig

    gib = 2**30
    assert ServeConfig(target="cpu").host_tier_bytes(2 * gib, available_bytes=64 * gib) == 0
    assert ServeConfig(target="h200").host_tier_bytes(2 * gib, available_bytes=64 * gib) == 4 * gib
    assert ServeConfig(target="h200").host_tier_bytes(2 * gib, available_bytes=8 * gib) == 2 * gib
    assert ServeConfig(target="h200", prefix_cache_host_gib=0.0).host_tier_bytes(2 * gib) == 0
    assert ServeConfig(target="cpu", prefix_cache_host_gib=1.5).host_tier_bytes(2 * gib) == int(1.5 * gib)
    grouped = ServeConfig(target="h200", coordinator="127.0.0.1:9", num_processes=2, process_id=0)
    assert grouped.host_tier_bytes(2 * gib, available_bytes=64 * gib) == 0
    from ember.server.config import _available_host_bytes

    assert 0 < _available_host_bytes() < 2**50  # this host's MemAvailable


def test_a_negative_size_is_refused():
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    with pytest.raises(SystemExit):
        config_from_args(parser.parse_args([]), {"EMBER_PREFIX_CACHE_HOST_GIB": "-1"})

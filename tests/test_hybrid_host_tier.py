"""The prefix cache's host tier on a tiny hybrid checkpoint (Gated DeltaNet layers with recurrent slot state, CPU):
with a device pool and snapshot slots too small to keep a prompt, its KV blocks and its recurrent-state snapshot
spill to host memory and come back on the next hit, which gives the tokens and logprobs of its first run and of a
device-cache hit bit for bit; the counters reach the engine's stats and /metrics; a request aborted while its
restore is queued or under way leaks nothing (its copies still land, and the next hit uses them); and a soak of
random arrivals and aborts leaves the store and the tier consistent with everything given back."""

from __future__ import annotations

import random
import time
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
from engine_support import ByteTokenizer
from fixture_data import tiny_fixture
from host_tier_support import device_hit, served

from ember.runtime.engine.config import kv_bytes_per_block
from ember.runtime.engine.engine import Engine, EngineConfig
from ember.runtime.loading.model import load_model
from ember.runtime.sampling.params import SamplingParams
from ember.runtime.scheduling.prefix_snapshots import prefix_hash
from ember.runtime.state.host_tier import SNAPSHOTS
from ember.server.metrics import ServerMetrics

BS = 4
BASE = {"block_size": BS, "max_model_len": 64, "max_num_seqs": 2, "max_batched_tokens": 32}


@pytest.fixture(scope="module")
def hybrid():
    return load_model(tiny_fixture("qwen3_5")[0])


def tiered_config(model, **overrides) -> EngineConfig:
    """19 usable blocks and 2 snapshot slots: three other 30-token prompts push a 30-token prompt's 7 cached blocks
    and its snapshot out; the host holds 64 blocks and 4 snapshots' worth."""
    host = 64 * kv_bytes_per_block(model, BS) + 4 * model.slot_bytes()
    return EngineConfig(num_blocks=20, num_snapshot_slots=2, prefix_cache_host_bytes=host, **{**BASE, **overrides})


def _prompts(seed: int, count: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, 250, size=30).tolist() for _ in range(count)]  # 7 full blocks: a hit resumes at 28


def _check_drained(engine) -> None:
    """Every block, slot and snapshot reservation given back; the pools, the store and the tier consistent."""
    with engine._lock:
        planner = engine.scheduler.snapshots
        engine.kv.check_consistency()
        planner.check_consistency(engine.kv)
        assert engine.kv.all_free() and planner.store.all_free()
        assert engine.scheduler.extra_state["recurrent"].all_free()


def test_an_evicted_prompt_and_its_snapshot_come_back_from_the_host_bit_for_bit(hybrid):
    prompt, *others = _prompts(11, 4)
    engine = Engine(hybrid, ByteTokenizer(), tiered_config(hybrid))
    try:
        tier, store = engine.host_tier, engine.scheduler.snapshots.store
        cold = served(engine, prompt)
        for other in others:
            served(engine, other)
        chain = prefix_hash(prompt, 7, BS)
        assert engine.kv.primary.find_prefix(prompt) == [] and chain in tier  # its blocks on the host
        assert store.lookup(chain) is None and tier.holds(chain, SNAPSHOTS)  # and its snapshot
        again = served(engine, prompt)
        counters = tier.counters()
        snapshot = engine.snapshot()
        metrics = ServerMetrics(SimpleNamespace(engine=engine, model_name="m")).render().decode()
        _check_drained(engine)
        assert store.lookup(chain) is not None and not tier.holds(chain, SNAPSHOTS)  # back on the device, once
    finally:
        engine.close()
    assert (cold[2], again[2]) == (0, 28)  # cached_tokens: the restored prefix
    assert again[:2] == cold[:2]  # tokens and logprobs, bit for bit
    assert counters.restored_snapshots == 1 and counters.restored_blocks == 7 and counters.offloaded_snapshots >= 3
    assert counters.restored_bytes == 7 * tier.block_bytes + hybrid.slot_bytes()
    assert snapshot["host_tier"] == counters and not tier.has_pending
    assert 'ember:prefix_cache_host_restored_snapshots_total{model_name="m"} 1.0' in metrics
    assert f'ember:prefix_cache_host_snapshot_bytes_used{{model_name="m"}} {float(counters.snapshot_bytes)}' in metrics
    # the same hit from the device cache (nothing evicted): bit for bit what the host brought back gives
    hit = device_hit(hybrid, prompt, EngineConfig(num_blocks=64, **BASE))
    assert hit[2] == 28 and hit[:2] == again[:2]


def test_precompile_covers_the_snapshot_copies(hybrid, monkeypatch):
    engine = Engine(hybrid, ByteTokenizer(), tiered_config(hybrid))
    try:
        calls = []
        monkeypatch.setattr(engine.executor, "shapes", lambda: [])  # the step shapes are another test's
        monkeypatch.setattr(engine.executor.block_copier, "precompile", lambda kv, n: calls.append(("blocks", n)))
        monkeypatch.setattr(engine.executor.snapshot_copier, "precompile", lambda kv, n: calls.append(("slots", n)))
        engine.precompile()
    finally:
        engine.close()
    assert calls == [("blocks", 19), ("slots", 2)]  # up to the usable blocks, and the snapshot slots (the host: 4+)


@pytest.mark.parametrize("when", ["queued", "under_way"])
def test_a_request_aborted_mid_restore_leaks_nothing(hybrid, monkeypatch, when):
    """The request whose step carries the restores of its blocks and snapshot is aborted as the step is launched:
    before its copies are dispatched, or just after (on a GPU they are still crossing). The step runs, its copies
    land in places still registered, and the next request with that prompt resumes from them on the device."""
    prompt, *others = _prompts(13, 4)
    engine = Engine(hybrid, ByteTokenizer(), tiered_config(hybrid))
    try:
        tier = engine.host_tier
        cold = served(engine, prompt)
        for other in others:
            served(engine, other)
        launch, aborted = engine.executor.launch, []

        def launch_and_abort(step, rows, steps, *, after=None):
            target = "victim" in step.block_tables and tier.pending_restores(SNAPSHOTS)
            if target and when == "queued":
                aborted.append(engine.abort("victim"))
            in_flight = launch(step, rows, steps, after=after)
            if target and when == "under_way":
                aborted.append(engine.abort("victim"))
            return in_flight

        monkeypatch.setattr(engine.executor, "launch", launch_and_abort)
        out = engine.submit(prompt, SamplingParams(max_tokens=5, temperature=0.0), request_id="victim").collect()
        assert aborted == [True] and out[0][-1].finish_reason == "abort"
        served(engine, [5, 6, 7])  # the loop has applied the aborted step by the time this one is served
        _check_drained(engine)
        restored = tier.counters()
        again = served(engine, prompt)
        _check_drained(engine)
        counters = tier.counters()
    finally:
        engine.close()
    assert restored.restored_snapshots == 1 and restored.restored_blocks == 7
    assert again[2] == 28 and again[:2] == cold[:2]  # from the device: what the aborted request's copies wrote
    assert counters.restored_snapshots == 1 and counters.restored_blocks == 7


def test_soak_of_arrivals_and_aborts_keeps_the_store_and_tier_consistent(hybrid):
    """Requests sharing prefixes arrive in bursts beside aborts (queued, mid-prefill, mid-decode) over a device
    pool, snapshot slots and a host tier all too small; at the end everything is given back and consistent, and
    the host brought snapshots and blocks back along the way."""
    rng = random.Random(5)
    bases = _prompts(17, 4)
    config = tiered_config(hybrid, snapshot_interval_blocks=2)
    config = replace(config, prefix_cache_host_bytes=config.prefix_cache_host_bytes // 2)  # drops too
    engine = Engine(hybrid, ByteTokenizer(), config)
    try:
        streams = {}  # request id -> its stream, until collected
        for i in range(40):
            base = rng.choice(bases)
            prompt = base[: rng.randint(9, 30)] + [rng.randint(3, 250) for _ in range(rng.randint(0, 6))]
            params = SamplingParams(max_tokens=rng.randint(1, 6), temperature=0.0, ignore_eos=True)
            streams[f"s{i}"] = engine.submit(prompt, params, request_id=f"s{i}")
            if rng.random() < 0.25:
                time.sleep(rng.random() * 0.02)
                engine.abort(rng.choice(list(streams)))
            if rng.random() < 0.3:  # a burst ends: let some of it run
                streams.pop(f"s{i}").collect()
        for stream in streams.values():
            stream.collect()
        _check_drained(engine)
        counters = engine.host_tier.counters()
    finally:
        engine.close()
    assert counters.restored_snapshots > 0 and counters.restored_blocks > 0, counters
    assert counters.offloaded_snapshots > counters.restored_snapshots and counters.dropped_blocks > 0, counters

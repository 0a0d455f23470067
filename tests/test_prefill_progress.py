"""Prefill progress: the engine reports how much of each prompt is in the KV cache while it prefills
(Engine.prefill_progress), streams turn a heartbeat into `: prefill done/total` meanwhile, and
/v1/capacity lists the prompts still prefilling."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import httpx
import numpy as np
import pytest
from engine_support import ByteTokenizer
from fixture_data import tiny_fixture

from ember.runtime.engine.engine import Engine, EngineConfig
from ember.runtime.loading.model import load_model
from ember.runtime.sampling.params import SamplingParams
from ember.server.generation import Generation
from ember.server.sse import HEARTBEAT_COMMENT

CHUNK = 16


@pytest.fixture(scope="module")
def engine():
    path, _ = tiny_fixture("qwen3")
    config = EngineConfig(num_blocks=64, max_model_len=256, max_num_seqs=2, max_batched_tokens=CHUNK)
    engine = Engine(load_model(path), ByteTokenizer(), config)
    yield engine
    engine.close()


def test_engine_reports_prefill_progress_chunk_by_chunk(engine):
    prompt = np.random.default_rng(3).integers(3, 250, size=130).tolist()
    seen: list[tuple[int, int]] = []
    stream = engine.submit(prompt, SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True), request_id="long")
    done = threading.Event()
    threading.Thread(target=lambda: (stream.collect(), done.set()), daemon=True).start()
    while not done.is_set():
        progress = engine.prefill_progress().get("long")
        if progress is not None and (not seen or seen[-1] != progress):
            seen.append(progress)
        time.sleep(0.001)
    assert seen, "the prefill was never seen in progress"
    assert all(total == 130 and 0 <= k < 130 and k % CHUNK == 0 for k, total in seen), seen
    assert [k for k, _ in seen] == sorted(k for k, _ in seen)  # it only moves forward
    assert engine.prefill_progress() == {}  # nothing left to prefill once it answered


def test_heartbeat_carries_the_progress():
    generation = Generation.__new__(Generation)
    generation.request_id = "r1"
    progress: dict = {"r1": (512, 4096)}
    generation.service = SimpleNamespace(engine=SimpleNamespace(prefill_progress=lambda: progress))
    assert generation.heartbeat_comment() == ": prefill 512/4096\n\n"
    progress.clear()  # prefilled: a plain ping again
    assert generation.heartbeat_comment() == HEARTBEAT_COMMENT


def test_anthropic_heartbeat_carries_the_progress_before_its_ping():
    from ember.server.anthropic import heartbeat_events

    generation = Generation.__new__(Generation)
    generation.request_id = "r1"
    progress: dict = {"r1": (100, 900)}
    generation.service = SimpleNamespace(engine=SimpleNamespace(prefill_progress=lambda: progress))
    sent = heartbeat_events(generation)
    assert sent.startswith(": prefill 100/900\n\nevent: ping\n") and sent.endswith("\n\n"), sent
    progress.clear()
    assert heartbeat_events(generation).startswith("event: ping")


def test_capacity_lists_prefilling_prompts(server):
    capacity = httpx.get(server.url + "/v1/capacity", timeout=30).json()
    assert capacity["prefilling"] == [] and capacity["active"] >= 0

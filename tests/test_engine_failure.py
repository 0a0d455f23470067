"""An internal error in the engine thread (a bug, not a failed device call) ends every request it held with
that error, the engine refuses new work with EngineFailedError, and the server answers 503 and reports it."""

from __future__ import annotations

import types

import pytest
from fixture_data import tiny_fixture
from test_engine import ByteTokenizer

from ember.runtime.engine.engine import Engine, EngineConfig, EngineFailedError
from ember.runtime.loading.model import load_model
from ember.runtime.sampling.params import SamplingParams
from ember.server.config import ServeConfig
from ember.server.errors import ApiError
from ember.server.service import ModelService


def test_a_dead_engine_thread_ends_its_requests_and_refuses_new_ones(monkeypatch):
    path, _ = tiny_fixture("qwen3")
    engine = Engine(
        load_model(path),
        ByteTokenizer(),
        EngineConfig(num_blocks=64, max_model_len=256, max_num_seqs=4, max_batched_tokens=48),
    )
    schedule, calls = engine.scheduler.schedule, []

    def broken_schedule():
        calls.append(1)
        if len(calls) == 4:  # a few steps in: the request is mid-decode
            raise AssertionError("scheduler invariant broken")
        return schedule()

    monkeypatch.setattr(engine.scheduler, "schedule", broken_schedule)
    try:
        params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=50)
        outputs = list(engine.submit(list(range(20, 40)), params))  # ends; does not hang
        assert outputs[-1].error and "scheduler invariant broken" in outputs[-1].error
        assert engine.failure and "AssertionError" in engine.failure
        with pytest.raises(EngineFailedError, match="internal error"):
            engine.submit([1, 2, 3], params)
    finally:
        engine.close()


def test_the_service_answers_503_once_its_engine_failed():
    service = ModelService(ServeConfig())
    service.state = "ready"
    service.engine = types.SimpleNamespace(failure="AssertionError: scheduler invariant broken")
    assert not service.is_ready
    with pytest.raises(ApiError) as raised:
        service.require_ready()
    assert raised.value.status == 503 and "restart the server" in str(raised.value)

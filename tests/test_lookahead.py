"""Several decode steps per device call (runtime/scheduling/lookahead.py): the same tokens and logprobs as one step
per call, requests that stop inside a call end there, and every KV block comes back."""

import numpy as np
import pytest
from fixture_data import tiny_fixture
from test_engine import ByteTokenizer, _tokens

from ember.runtime.engine.engine import Engine, EngineConfig
from ember.runtime.loading.model import load_model
from ember.runtime.sampling.params import RowState, SamplingParams
from ember.runtime.scheduling.lookahead import lookahead_steps, row_can_run_ahead
from ember.runtime.scheduling.scheduled_step import DecodeRow, PrefillChunk, ScheduledStep

STEPS = 4


@pytest.fixture(scope="module")
def qwen3():
    path, _ = tiny_fixture("qwen3")
    return load_model(path)


def _run(model, decode_steps, cases):
    config = EngineConfig(
        num_blocks=64, max_model_len=256, max_num_seqs=4, max_batched_tokens=48, decode_steps=decode_steps
    )
    engine = Engine(model, ByteTokenizer(), config, stop_token_ids=frozenset({7}))
    try:
        streams = [engine.submit(prompt, params) for prompt, params in cases]
        results = [_tokens(stream) for stream in streams]
        snapshot = engine.snapshot()
        return results, engine.counters, snapshot
    finally:
        engine.close()


def _logprobs(outputs):
    return [(lp.token_id, lp.logprob) for outs in outputs.values() for o in outs for lp in (o.logprobs or ())]


def test_runs_ahead_give_the_tokens_and_logprobs_of_single_steps(qwen3):
    rng = np.random.default_rng(3)
    prompts = [rng.integers(8, 250, size=n).tolist() for n in (5, 33, 12, 60)]
    cases = [  # greedy and seeded sampled rows, max_tokens not a multiple of STEPS, eos-stopping, logprobs
        (prompts[0], SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=23, logprobs=2)),
        (prompts[1], SamplingParams(temperature=0.9, top_p=0.8, seed=5, ignore_eos=True, max_tokens=17)),
        (prompts[2], SamplingParams(temperature=1.2, top_k=20, seed=9, max_tokens=30, logprobs=0)),
        (prompts[3], SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=9)),
    ]
    single, single_counters, _ = _run(qwen3, 1, cases)
    ahead, ahead_counters, snapshot = _run(qwen3, STEPS, cases)
    for (tokens_1, outs_1), (tokens_n, outs_n) in zip(single, ahead, strict=True):
        assert tokens_n == tokens_1
        got, want = _logprobs(outs_n), _logprobs(outs_1)
        assert [t for t, _ in got] == [t for t, _ in want]
        np.testing.assert_allclose([lp for _, lp in got], [lp for _, lp in want], rtol=1e-5, atol=1e-5)
    # a call may compute a few steps past a request's end (discarded): never fewer steps than one at a time
    assert ahead_counters.steps >= single_counters.steps
    assert ahead_counters.device_calls < single_counters.device_calls  # it did run ahead
    assert snapshot["free_kv_blocks"] == snapshot["total_kv_blocks"]  # nothing leaked


def test_requests_ending_one_step_apart_still_run_ahead(qwen3):
    # a batch filled over time ends one request per step: every call has a row with < STEPS tokens left
    rng = np.random.default_rng(5)
    cases = [
        (rng.integers(8, 250, size=10).tolist(), SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=m))
        for m in (13, 14, 15, 16)
    ]
    single, _, _ = _run(qwen3, 1, cases)
    ahead, counters, snapshot = _run(qwen3, STEPS, cases)
    assert [t for t, _ in ahead] == [t for t, _ in single]
    assert [len(t[0]) for t, _ in ahead] == [13, 14, 15, 16]
    decode_steps = 16 - 1  # the longest request's decode steps (its first token comes from its prefill)
    assert counters.device_calls <= 4 + -(-decode_steps // STEPS) + 1  # prefills, then STEPS per call
    assert snapshot["free_kv_blocks"] == snapshot["total_kv_blocks"]


def test_slots_past_a_table_write_block_zero():
    plan = ScheduledStep((DecodeRow("a", 3, 14, (5 * 8 + 6,)),), (), {"a": ((4, 5),)})
    slots = plan.decode_slots_ahead(4, 8)  # positions 14, 15 in block 5; 16, 17 past the table
    assert slots[:, 0, 0].tolist() == [5 * 8 + 6, 5 * 8 + 7, 0, 1]


def test_a_request_stopping_inside_a_call_ends_there(qwen3):
    prompt = list(range(20, 40))
    params = SamplingParams(temperature=0.0, max_tokens=40, stop_token_ids=[], ignore_eos=True)
    alone, _, _ = _run(qwen3, 1, [(prompt, params)])
    stop_at = alone[0][0][0][5]  # the 6th greedy token: stop on it
    stopping = SamplingParams(temperature=0.0, max_tokens=40, stop_token_ids=[stop_at], ignore_eos=True)
    ((tokens, outs),) = _run(qwen3, STEPS, [(prompt, stopping)])[0]
    first = alone[0][0][0].index(stop_at)
    assert tokens[0] == alone[0][0][0][: first + 1]
    assert outs[0][-1].finish_reason == "stop"


def _row(**params) -> RowState:
    return RowState(SamplingParams(**params), seed=0, prompt_ids=[1, 2], output_ids=[3])


def test_what_may_run_ahead():
    decode = ScheduledStep((DecodeRow("a", 3, 2, (34,)),), (), {"a": ((2,),)})
    plain = _row(temperature=0.0)
    assert lookahead_steps(decode, [plain], steps=8, waiting=0) == 8
    assert lookahead_steps(decode, [plain], steps=8, waiting=1) == 1  # someone waits to be admitted
    assert lookahead_steps(decode, [plain], steps=1, waiting=0) == 1
    chunk = ScheduledStep((), (PrefillChunk("b", 0, (1, 2), ((33,), (34,)), True),), {"b": ((2,),)})
    assert lookahead_steps(chunk, [plain], steps=8, waiting=0) == 1
    for blocked in (
        dict(repetition_penalty=1.1),
        dict(presence_penalty=0.5),
        dict(frequency_penalty=0.2),
        dict(min_tokens=5),
        dict(forced_token_ids=[4, 5, 6]),
    ):
        assert not row_can_run_ahead(_row(**blocked)), blocked
    assert row_can_run_ahead(_row(temperature=0.7, top_p=0.9, logit_bias={5: 2.0}, min_tokens=1))


def test_chained_calls_give_the_tokens_of_single_steps_and_free_every_block(qwen3):
    # long requests: each run-ahead call is followed by the next before its tokens are read
    rng = np.random.default_rng(11)
    cases = [
        (rng.integers(8, 250, size=7).tolist(), SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=41)),
        (
            rng.integers(8, 250, size=19).tolist(),
            SamplingParams(temperature=0.8, top_k=30, seed=3, ignore_eos=True, max_tokens=38, logprobs=1),
        ),
        (rng.integers(8, 250, size=3).tolist(), SamplingParams(temperature=0.0, max_tokens=45)),  # may hit eos 7
    ]
    single, _, _ = _run(qwen3, 1, cases)
    ahead, counters, snapshot = _run(qwen3, STEPS, cases)
    assert counters.chained_calls >= 3
    for (tokens_1, outs_1), (tokens_n, outs_n) in zip(single, ahead, strict=True):
        assert tokens_n == tokens_1
        np.testing.assert_allclose(
            [lp for _, lp in _logprobs(outs_n)], [lp for _, lp in _logprobs(outs_1)], rtol=1e-5, atol=1e-5
        )
    assert snapshot["free_kv_blocks"] == snapshot["total_kv_blocks"]


def test_a_stop_inside_a_chained_call_ends_the_request_there(qwen3):
    prompt = list(range(40, 70))
    params = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    alone, _, _ = _run(qwen3, 1, [(prompt, params)])
    greedy = alone[0][0][0]
    stop_at = greedy[17]  # past the first calls: inside a chained one
    first = greedy.index(stop_at)
    stopping = SamplingParams(temperature=0.0, max_tokens=60, stop_token_ids=[stop_at], ignore_eos=True)
    ((tokens, outs),), counters, snapshot = _run(qwen3, STEPS, [(prompt, stopping)])
    assert tokens[0] == greedy[: first + 1] and outs[0][-1].finish_reason == "stop"
    assert snapshot["free_kv_blocks"] == snapshot["total_kv_blocks"]


def test_a_failed_call_with_a_chained_call_behind_it_ends_its_requests(qwen3, monkeypatch):
    config = EngineConfig(num_blocks=64, max_model_len=256, max_num_seqs=4, max_batched_tokens=48, decode_steps=STEPS)
    engine = Engine(qwen3, ByteTokenizer(), config)
    collect, calls = engine.executor.collect, []

    def failing_third_run_ahead(in_flight):
        per_step = collect(in_flight)
        calls.append(in_flight.steps)
        if in_flight.steps > 1 and calls.count(in_flight.steps) == 3:
            raise RuntimeError("device lost")
        return per_step

    monkeypatch.setattr(engine.executor, "collect", failing_third_run_ahead)
    try:
        params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=60)
        outputs = list(engine.submit(list(range(30, 50)), params))
        assert outputs[-1].error and "device lost" in outputs[-1].error
        assert engine.counters.chained_calls >= 2
        monkeypatch.setattr(engine.executor, "collect", collect)  # the engine goes on serving
        again = [o for o in engine.submit(list(range(30, 50)), SamplingParams(temperature=0.0, max_tokens=5))]
        assert again[-1].finish_reason is not None and not again[-1].error
        snapshot = engine.snapshot()
        assert snapshot["free_kv_blocks"] == snapshot["total_kv_blocks"]
    finally:
        engine.close()


def test_aborts_and_arrivals_while_calls_are_chained_lose_nothing(qwen3):
    # requests arrive and are aborted from another thread while run-ahead calls are chained: every stream
    # ends exactly once, finished ones carry their tokens, and every KV block comes back
    import random
    import threading
    import time

    config = EngineConfig(num_blocks=96, max_model_len=256, max_num_seqs=6, max_batched_tokens=48, decode_steps=STEPS)
    engine = Engine(qwen3, ByteTokenizer(), config, stop_token_ids=frozenset({7}))
    rng = random.Random(17)
    ids = [f"r{i}" for i in range(24)] + ["long0", "long1"]  # the last two are never aborted: calls chain
    streams, finals, lock = {}, {}, threading.Lock()

    def read(rid, stream):
        outs = list(stream)
        with lock:
            finals[rid] = outs

    threads = []
    try:
        for rid in ids:
            long = rid.startswith("long")
            params = SamplingParams(
                temperature=rng.choice([0.0, 0.9]),
                seed=rng.randrange(100),
                ignore_eos=long or rng.random() < 0.5,
                max_tokens=50 if long else rng.randrange(5, 60),
            )
            streams[rid] = engine.submit(
                [rng.randrange(8, 250) for _ in range(rng.randrange(3, 40))], params, request_id=rid
            )
            thread = threading.Thread(target=read, args=(rid, streams[rid]))
            thread.start()
            threads.append(thread)
            time.sleep(rng.random() * 0.02)
            if rng.random() < 0.3 and not long:
                engine.abort(rng.choice(ids[: len(streams)]))
        for thread in threads:
            thread.join(timeout=120)
        assert sorted(finals) == sorted(ids)
        for rid, outs in finals.items():
            ends = [o for o in outs if o.finish_reason is not None]
            assert len(ends) == 1 and outs[-1] is ends[0], rid  # one end, and nothing after it
            assert not outs[-1].error
        snapshot = engine.snapshot()
        assert snapshot["running"] == snapshot["waiting"] == 0
        assert snapshot["free_kv_blocks"] == snapshot["total_kv_blocks"]
        assert engine.counters.chained_calls > 0
    finally:
        engine.close()


def test_the_first_decode_call_is_chained_behind_the_prefill(qwen3):
    # one request (batch 1): its first run-ahead call is dispatched behind the prefill step, before the
    # prefill's token is read; same tokens and logprobs as one step per call, every block back
    prompt = np.random.default_rng(4).integers(8, 250, size=21).tolist()
    cases = [(prompt, SamplingParams(temperature=0.7, seed=2, ignore_eos=True, max_tokens=1 + 3 * STEPS, logprobs=1))]
    single, _, _ = _run(qwen3, 1, cases)
    ahead, counters, snapshot = _run(qwen3, STEPS, cases)
    assert ahead[0][0] == single[0][0]
    np.testing.assert_allclose(
        [lp for _, lp in _logprobs(ahead[0][1])], [lp for _, lp in _logprobs(single[0][1])], rtol=1e-5, atol=1e-5
    )
    assert counters.device_calls == 1 + 3 and counters.chained_calls == 3  # every decode call chained
    assert snapshot["free_kv_blocks"] == snapshot["total_kv_blocks"]
    # max_tokens 1: nothing to chain behind the prefill; the request still ends after its one token
    ((tokens, _),) = _run(qwen3, STEPS, [(prompt, SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=1))])[0]
    assert len(tokens) == 1

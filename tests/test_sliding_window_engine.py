"""The engine on the tiny gemma3 checkpoint (sliding window 8 on 5 of 6 layers): the sliding layers'
KV kind keeps only its window, in a pool sized to the window, and the tokens and logprobs are those of
the untrimmed single-sequence reference and of transformers — default and deterministic mode."""

import math

import numpy as np
import pytest
from fixture_data import tiny_fixture

from ember.runtime.engine.engine import Engine, EngineConfig, kv_bytes_per_block, sized_config
from ember.runtime.execution.sequence_runner import SequenceRunner
from ember.runtime.loading.model import load_model
from ember.runtime.sampling.params import SamplingParams
from ember.runtime.state.block_pool import RESERVED_BLOCK

BS = 4  # small blocks: a window of 8 tokens is 2-3 blocks, prompts span many windows
GREEDY = dict(temperature=0.0, ignore_eos=True, logprobs=1)


class ByteTokenizer:
    eos_token_ids = ()

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(65 + int(t) % 58) for t in ids)


@pytest.fixture(scope="module")
def gemma3():
    path, ref = tiny_fixture("gemma3")
    return load_model(path), ref


def _log_softmax(logits):
    logits = np.asarray(logits, np.float64)
    m = logits.max()
    return logits - m - np.log(np.exp(logits - m).sum())


def _alone(model, prompt, max_tokens):
    """Greedy tokens and their logprobs from the untrimmed reference runner."""
    runner = SequenceRunner(model, len(prompt) + max_tokens, block_size=BS)
    logits, out = runner.prefill(prompt), []
    for _ in range(max_tokens):
        token = int(np.argmax(logits))
        out.append((token, float(_log_softmax(logits)[token])))
        if len(out) < max_tokens:
            logits = runner.decode(token)
    return out


def _run(model, cases, **config):
    config = EngineConfig(
        **{
            "num_blocks": 64,
            "block_size": BS,
            "max_model_len": 128,
            "max_num_seqs": 4,
            "max_batched_tokens": 24,
            **config,
        }
    )
    engine = Engine(model, ByteTokenizer(), config)
    window = {k.name: k.window for k in engine.kv.kinds}["kv_window"]
    peak = {"held": 0, "used": 0}
    commit = engine.kv.commit

    def watched_commit(state, token_ids, num_computed):  # after each step: what each request still holds
        commit(state, token_ids, num_computed)
        held = sum(1 for b in state["kv_window"].block_table if b != RESERVED_BLOCK)
        peak["held"] = max(peak["held"], held)
        peak["used"] = max(peak["used"], engine.kv.pools["kv_window"].used_blocks)
        assert held <= math.ceil(window / BS) + 1

    engine.kv.commit = watched_commit
    try:
        streams = [engine.submit(p, SamplingParams(max_tokens=m, **GREEDY)) for p, m in cases]
        outs = [s.collect()[0] for s in streams]
    finally:
        engine.close()
    results = [[(lp.token_id, lp.logprob) for o in out for lp in o.logprobs] for out in outs]
    assert engine.kv.all_free()  # every block of every kind came back
    return results, engine, peak


@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
def test_sliding_pool_holds_only_the_window_and_tokens_match_the_reference(gemma3, deterministic):
    model, ref = gemma3
    assert [(k.name, k.window) for k in model.paged_kinds] == [("kv", 0), ("kv_window", 8)]
    rng = np.random.default_rng(5)
    cases = [(ref["input_ids"].tolist(), 17)]  # transformers' greedy run: prefill 40 + 16 decode steps
    cases += [(rng.integers(3, 250, size=n).tolist(), m) for n, m in ((57, 20), (23, 30), (70, 9), (9, 40))]
    results, engine, peak = _run(model, cases, deterministic=deterministic)
    for (prompt, m), got in zip(cases, results):
        want = _alone(model, prompt, m)
        assert [t for t, _ in got] == [t for t, _ in want]
        np.testing.assert_allclose([lp for _, lp in got], [lp for _, lp in want], atol=1e-5)
    # transformers' own greedy tokens and logprobs for the fixture prompt
    hf_logits = [ref["prefill_logits"][-1]] + list(ref["decode_logits"])
    hf = [(int(np.argmax(l)), float(_log_softmax(l).max())) for l in hf_logits]
    assert (
        [t for t, _ in results[0]]
        == [t for t, _ in hf]
        == [int(ref["prefill_logits"][-1].argmax())] + ref["decode_ids"].tolist()
    )
    np.testing.assert_allclose([lp for _, lp in results[0]], [lp for _, lp in hf], atol=1e-4)
    # the sliding kind's pool is sized to the window (4 seqs * (2 + 1) + 24 / 4 = 18 usable blocks), not
    # to the context; requests held at most ceil(8 / 4) + 1 = 3 blocks of it between steps
    sliding, full = engine.kv.pools["kv_window"], engine.kv.pools["kv"]
    assert sliding.num_usable_blocks == 4 * 3 + 6 < full.num_usable_blocks == 63
    assert peak["held"] == 3 and peak["used"] <= sliding.num_usable_blocks
    assert sliding.counters().allocations > sliding.num_usable_blocks  # blocks were handed back and reused


def test_prefix_hit_with_a_sliding_kind_matches_the_uncached_run(gemma3):
    model, _ = gemma3
    shared = np.random.default_rng(8).integers(3, 250, size=45).tolist()
    cases = [(shared + [7, 8], 6)]
    first, _, _ = _run(model, cases)
    config = EngineConfig(num_blocks=64, block_size=BS, max_model_len=128, max_num_seqs=4, max_batched_tokens=24)
    engine2 = Engine(model, ByteTokenizer(), config)
    try:
        a = engine2.submit(shared + [7, 8], SamplingParams(max_tokens=6, **GREEDY)).collect()[0]
        b = engine2.submit(shared + [9], SamplingParams(max_tokens=6, **GREEDY)).collect()[0]
    finally:
        engine2.close()
    assert b[-1].usage.cached_tokens == 44  # 11 full blocks: the window before position 44 was still cached
    want = _alone(model, shared + [9], 6)
    got = [(lp.token_id, lp.logprob) for o in b for lp in o.logprobs]
    assert [t for t, _ in got] == [t for t, _ in want]
    np.testing.assert_allclose([lp for _, lp in got], [lp for _, lp in want], atol=1e-5)
    assert [lp.token_id for o in a for lp in o.logprobs] == [t for t, _ in first[0]]
    assert engine2.kv.all_free()


def test_kv_sizing_accounts_per_kind(gemma3):
    model, _ = gemma3
    d = model.dims
    per_layer = 2 * BS * d.hkv * d.dh * 4
    assert kv_bytes_per_block(model, BS, "kv") == 1 * per_layer  # 1 full layer of 6
    assert kv_bytes_per_block(model, BS, "kv_window") == 5 * per_layer
    assert kv_bytes_per_block(model, BS) == 6 * per_layer
    overrides = dict(block_size=BS, max_num_seqs=4, max_batched_tokens=24)
    window_blocks = 4 * 3 + 6
    budget = per_layer * (1 * 1000 + 5 * window_blocks)  # 1000 full blocks beside a rule-sized sliding pool
    assert sized_config(model, kv_memory_bytes=budget, **overrides).num_blocks == 1001
    assert sized_config(model, kv_memory_bytes=budget - 1, **overrides).num_blocks == 1000
    small = per_layer * 6 * 10  # less than the rule: both pools get the same count
    assert sized_config(model, kv_memory_bytes=small, **overrides).num_blocks == 11

"""The prefix cache on a tiny hybrid checkpoint (Gated DeltaNet layers with recurrent slot state): a request that
resumes from a recurrent-state snapshot gives the same tokens and top logprobs as the cold single-sequence
reference (the same prompt again, a second chat turn), a KV hit without a snapshot recomputes, and every slot and
snapshot reservation comes back."""

import numpy as np
from fixture_data import tiny_fixture
from test_hybrid_engine import ByteTokenizer

from ember.runtime.engine.engine import Engine, EngineConfig
from ember.runtime.execution.sequence_runner import SequenceRunner
from ember.runtime.loading.model import load_model
from ember.runtime.sampling.params import SamplingParams

TOP = 4


def _log_softmax(logits):
    logits = np.asarray(logits, np.float64)
    return logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())


def _cold(model, prompt, max_tokens):
    """Greedy tokens and each step's top-TOP logprobs of the single-sequence reference runner."""
    runner = SequenceRunner(model, 96)  # one capacity for every run: its steps compile once
    logits, tokens, tops = runner.prefill(prompt), [], []
    for _ in range(max_tokens):
        logprobs = _log_softmax(logits)
        tokens.append(int(np.argmax(logprobs)))
        tops.append(np.sort(logprobs)[::-1][:TOP])
        if len(tokens) < max_tokens:
            logits = runner.decode(tokens[-1])
    return tokens, np.asarray(tops)


def _served(engine, prompt, max_tokens):
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=TOP)
    out = engine.submit(prompt, params).collect()[0]
    steps = [lp for o in out for lp in o.logprobs]
    tops = np.asarray([[p for _, p in lp.top] for lp in steps])
    return [lp.token_id for lp in steps], tops, out[-1].usage.cached_tokens


def test_snapshot_hits_equal_the_cold_run():
    path, _ = tiny_fixture("qwen3_5")
    model = load_model(path)
    config = EngineConfig(num_blocks=64, block_size=4, max_model_len=96, max_num_seqs=2, max_batched_tokens=32)
    engine = Engine(model, ByteTokenizer(), config)
    rng = np.random.default_rng(5)
    prompt = rng.integers(3, 250, size=30).tolist()
    try:
        assert engine.scheduler.prefix_caching
        store = engine.scheduler.snapshots.store
        first = _served(engine, prompt, 6)
        again = _served(engine, prompt, 6)  # resumes at 28: the last block boundary before its last token
        turn2 = prompt + first[0] + rng.integers(3, 250, size=7).tolist()
        second = _served(engine, turn2, 5)  # resumes at 28, the end of turn 1's last full block
        forked = prompt[:22] + rng.integers(3, 250, size=9).tolist()
        fork = _served(engine, forked, 4)  # 5 blocks of KV cached, no snapshot before 28: recomputed
        assert engine.kv.primary.find_prefix(forked)[:5] and fork[2] == 0
    finally:
        engine.close()
    assert (first[2], again[2], second[2]) == (0, 28, 28)
    for (tokens, tops, _), (want_prompt, n) in zip(
        (first, again, second, fork), ((prompt, 6), (prompt, 6), (turn2, 5), (forked, 4))
    ):
        want_tokens, want_tops = _cold(model, want_prompt, n)
        assert tokens == want_tokens
        np.testing.assert_allclose(tops, want_tops, atol=1e-5)
    assert store.restores == 2 and store.all_free()
    store.check_consistency()
    assert engine.kv.all_free() and engine.scheduler.extra_state["recurrent"].all_free()

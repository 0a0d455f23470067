"""The engine on the tiny hybrid checkpoints (Gated DeltaNet layers with recurrent slot state beside gated
full-attention layers): requests run concurrently, prefill chunks (not multiples of the delta-rule chunk) beside
decode rows in one step, each in its own slot; tokens and logprobs are transformers' greedy run and those of the
single-sequence reference; every block and slot comes back. With the prefix cache off, nothing is reused (its
recurrent-state snapshots: tests/test_hybrid_prefix_cache.py)."""

import numpy as np
import pytest
from fixture_data import tiny_fixture

from ember.runtime.engine.config import capacity_line
from ember.runtime.engine.engine import Engine, EngineConfig, kv_bytes_per_block, sized_config
from ember.runtime.execution.sequence_runner import SequenceRunner
from ember.runtime.loading.model import load_model
from ember.runtime.sampling.params import SamplingParams
from ember.runtime.state.kinds import engine_snapshot_slots

GREEDY = dict(temperature=0.0, ignore_eos=True, logprobs=1)


class ByteTokenizer:
    eos_token_ids = ()

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(65 + int(t) % 58) for t in ids)


def _log_softmax(logits):
    logits = np.asarray(logits, np.float64)
    return logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())


def _alone(model, prompt, max_tokens):
    runner = SequenceRunner(model, len(prompt) + max_tokens)
    logits, out = runner.prefill(prompt), []
    for _ in range(max_tokens):
        token = int(np.argmax(logits))
        out.append((token, float(_log_softmax(logits)[token])))
        if len(out) < max_tokens:
            logits = runner.decode(token)
    return out


@pytest.mark.parametrize("arch", ["qwen3_5", pytest.param("qwen3_next", marks=pytest.mark.slow)])
def test_concurrent_requests_match_transformers_and_give_back_their_slots(arch):
    path, ref = tiny_fixture(arch)
    model = load_model(path)
    # 11 tokens a step: a decode row beside a 7- or 10-token chunk (blocks of 1 token: chunks end anywhere)
    config = EngineConfig(
        num_blocks=200,
        block_size=1,
        max_model_len=96,
        max_num_seqs=2,
        max_batched_tokens=11,
        enable_prefix_caching=False,
    )
    engine = Engine(model, ByteTokenizer(), config)
    steps = []
    try:
        assert not engine.scheduler.prefix_caching
        slots = engine.scheduler.extra_state["recurrent"]
        assert slots.num_slots == 2
        original = engine.scheduler.schedule

        def watched():
            step = original()
            steps.append((step.num_decode, [c.num_tokens for c in step.prefills]))
            return step

        engine.scheduler.schedule = watched
        other = np.random.default_rng(3).integers(3, 250, size=25).tolist()
        streams = [
            engine.submit(other, SamplingParams(max_tokens=12, **GREEDY)),
            engine.submit(ref["input_ids"].tolist(), SamplingParams(max_tokens=17, **GREEDY)),
        ]
        outs = [s.collect()[0] for s in streams]
        again = engine.submit(other, SamplingParams(max_tokens=4, **GREEDY)).collect()[0]
    finally:
        engine.close()
    got = [[(lp.token_id, lp.logprob) for o in out for lp in o.logprobs] for out in outs]
    # one request prefilled while the other decoded, in chunks that are not multiples of 64
    assert any(decodes and chunks for decodes, chunks in steps)
    assert {n for _, chunks in steps for n in chunks} - {0} <= set(range(1, 12))
    hf_logits = [ref["prefill_logits"][-1]] + list(ref["decode_logits"])
    hf = [(int(np.argmax(l)), float(_log_softmax(l).max())) for l in hf_logits]
    assert [t for t, _ in got[1]] == [t for t, _ in hf]
    np.testing.assert_allclose([lp for _, lp in got[1]], [lp for _, lp in hf], atol=1e-4)
    want = _alone(model, other, 12)
    assert [t for t, _ in got[0]] == [t for t, _ in want]
    np.testing.assert_allclose([lp for _, lp in got[0]], [lp for _, lp in want], atol=1e-5)
    assert again[-1].usage.cached_tokens == 0  # the prefix cache is off
    assert [lp.token_id for o in again for lp in o.logprobs] == [t for t, _ in want[:4]]
    assert engine.kv.all_free() and slots.all_free()


def test_memory_budget_buys_recurrent_slots_then_kv():
    path, _ = tiny_fixture("qwen3_next")
    model = load_model(path)
    d = model.dims
    per_layer = ((d.lin_conv - 1) * d.lin_qkv + d.lin_hv * d.lin_dk * d.lin_dv) * 4  # conv window + delta matrix, fp32
    assert model.slot_bytes() == 3 * per_layer  # three Gated DeltaNet layers of four
    budget = dict(kv_memory_bytes=10 * model.slot_bytes(), max_num_seqs=8, block_size=4)
    config = sized_config(model, enable_prefix_caching=False, **budget)
    assert config.num_slots == 5  # at most half of the budget: 5 of the 10 sequences' worth
    kv_left = 5 * model.slot_bytes()
    assert (config.num_blocks - 1) * kv_bytes_per_block(model, 4) <= kv_left
    assert "recurrent state for 5 sequences" in capacity_line(model, config)
    cached = sized_config(model, **budget)  # each live slot beside a prefix-cache snapshot: 2 + 2 of 5
    assert cached.num_slots == 2 and engine_snapshot_slots(cached) == 2
    assert (cached.num_blocks - 1) * kv_bytes_per_block(model, 4) <= 6 * model.slot_bytes()
    assert "recurrent state for 2 sequences" in capacity_line(model, cached)
    assert "and 2 prefix-cache snapshots" in capacity_line(model, cached)
    roomy = sized_config(model, kv_memory_bytes=1000 * model.slot_bytes(), max_num_seqs=8, block_size=4)
    assert roomy.num_slots == 8  # one per running request

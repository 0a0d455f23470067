"""Speculative decoding on hybrid plans (recurrent Gated DeltaNet layers + attention; tiny qwen3_5 in CI,
qwen3_next `slow`; CPU): a
rejected draft's recurrent state rolls back (runtime/scheduling/recurrent_rollback.py), so greedy speculation
gives exactly plain decoding's tokens whether every draft is accepted (an exact Predicted Output), none is
(drafts always wrong) or some are (lookup drafts); every block and slot comes back after aborts."""

import numpy as np
import pytest
from engine_support import GREEDY, ByteTokenizer
from fixture_data import tiny_fixture

from ember.runtime.engine.engine import Engine, EngineConfig
from ember.runtime.engine.speculation import PlainDrafts, make_drafter
from ember.runtime.loading.model import load_model
from ember.runtime.sampling.params import SamplingParams
from ember.runtime.speculative.config import SpeculativeConfig

BASE = {"num_blocks": 64, "max_model_len": 256, "max_num_seqs": 3, "max_batched_tokens": 48, "decode_steps": 1}


def _engine(model, method="ngram", k=3, **kw):
    spec = SpeculativeConfig(method, num_speculative_tokens=k, adaptive=False, **kw) if k else None
    return Engine(model, ByteTokenizer(), EngineConfig(**BASE, speculative=spec))


def _run(engine, jobs):
    streams = [engine.submit(p, SamplingParams(max_tokens=12, **GREEDY), prediction_ids=pred) for p, pred in jobs]
    return [[t for o in s.collect()[0] for t in o.token_ids] for s in streams]


def _stats(engine):
    s = engine.counters.speculation
    return s.num_draft_tokens, s.num_accepted_tokens


def _idle(engine):
    assert engine.pool.free_blocks == engine.pool.num_usable_blocks
    engine.kv.check_consistency()
    assert all(pool.all_free() for pool in engine.scheduler.extra_state.values())


@pytest.fixture(scope="module", params=["qwen3_5", pytest.param("qwen3_next", marks=pytest.mark.slow)])
def hybrid(request):
    path, _ = tiny_fixture(request.param)
    return load_model(path)  # with its MTP module (seeded random weights)


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(4)
    base = [rng.integers(3, 250, size=n).tolist() for n in (5, 8)]
    return [b * 3 for b in base] + [rng.integers(3, 250, size=9).tolist()]


def _with_source(engine, source, jobs):
    saved, engine.scheduler.draft_source = engine.scheduler.draft_source, source
    before = _stats(engine)
    try:
        out = _run(engine, jobs)
    finally:
        engine.scheduler.draft_source = saved
    return out, tuple(a - b for a, b in zip(_stats(engine), before))


@pytest.fixture(scope="module")
def engine(hybrid):
    engine = _engine(hybrid)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def plain(engine, prompts):
    """Plain greedy decoding, by the same engine (its executables compile once) with a source that never drafts."""
    return _with_source(engine, lambda request, k: (), [(p, ()) for p in prompts])[0]


def test_rejected_drafts_roll_the_recurrent_state_back(engine, prompts, plain):
    """Drafts always wrong: every verify step rolls back; the tokens are still plain decoding's. An exact
    prediction: every draft accepted, nothing rolls back."""

    def wrong_drafts(request, k):  # never the target's next token
        expected = plain[prompts.index(list(request.prompt_token_ids))][len(request.output_token_ids)]
        return [(expected + 1 + i) % int(engine.model.dims.vocab) for i in range(k)]

    out, (drafted, accepted) = _with_source(engine, wrong_drafts, [(p, ()) for p in prompts])  # three rows
    assert out == plain and drafted > 0 and accepted == 0
    out, (drafted, accepted) = _run_stats(engine, [(prompts[0], tuple(plain[0]))])
    assert out == [plain[0]] and drafted > 0 and accepted == drafted
    _idle(engine)


@pytest.mark.slow  # more rows and aborts: more shapes to compile (a minute or two on a shared CPU)
def test_lookup_drafts_on_several_rows_and_aborts(engine, prompts, plain):
    assert _run(engine, [(p, ()) for p in prompts]) == plain  # lookup drafts, three rows at a time
    rng = np.random.default_rng(5)
    streams = []
    for i in range(5):
        streams.append(engine.submit(prompts[i % 3], SamplingParams(max_tokens=16, **GREEDY)))
        if rng.random() < 0.6:
            engine.abort(streams[-1].request_id)
    for s in streams:
        s.collect()
    _idle(engine)


def test_mtp_drafts_give_plain_decodings_tokens(hybrid, engine, prompts, plain):
    """The MTP module as the drafter (`--speculative mtp`): its greedy drafts (random MTP weights: mostly
    rejected, so its state rolls back) leave the tokens plain decoding's; its per-request state goes back."""
    drafter = make_drafter(SpeculativeConfig("mtp", 3, adaptive=False), hybrid, engine.config)
    source, release = engine.scheduler.draft_source, engine.scheduler.on_release
    engine.scheduler.draft_source, engine.scheduler.on_release = PlainDrafts(drafter), drafter.release
    try:
        out, (drafted, accepted) = _run_stats(engine, [(prompts[2], ())])
    finally:
        engine.scheduler.draft_source, engine.scheduler.on_release = source, release
    assert out == plain[2:] and drafted > 0, (drafted, accepted)
    assert drafter.sequences == {} and drafter.hidden_states.runs == {}
    _idle(engine)


def test_mtp_drafts_sampled_rows_with_their_q_and_a_seed_reproduces(hybrid, engine, prompts):
    drafter = make_drafter(SpeculativeConfig("mtp", 3, adaptive=False), hybrid, engine.config)
    source = PlainDrafts(drafter)
    source.row_state = engine.requests.row_state  # (the engine's wiring)
    proposals = []
    propose = drafter.propose
    drafter.propose = lambda context, k: proposals.append(propose(context, k)) or proposals[-1]
    saved, release = engine.scheduler.draft_source, engine.scheduler.on_release
    engine.scheduler.draft_source, engine.scheduler.on_release = source, drafter.release
    params = SamplingParams(max_tokens=8, temperature=0.8, seed=3, ignore_eos=True)
    try:
        runs = [[t for o in engine.submit(prompts[2], params).collect()[0] for t in o.token_ids] for _ in range(2)]
    finally:
        engine.scheduler.draft_source, engine.scheduler.on_release = saved, release
    assert runs[0] == runs[1] and len(runs[0]) == 8
    drafted = [p for p in proposals if len(p)]
    assert drafted and all(p.probs is not None and p.probs.shape[0] == len(p) for p in drafted)
    for p in drafted:
        np.testing.assert_allclose(p.probs.sum(-1), 1.0, rtol=1e-5)
        assert (p.probs[np.arange(len(p)), list(p.token_ids)] > 0).all()
    _idle(engine)


def test_mtp_is_refused_without_an_mtp_module():
    path, _ = tiny_fixture("qwen3_5")
    with pytest.raises(ValueError, match="multi-token-prediction"):
        _engine(load_model(path, with_mtp=False), "mtp")


def _run_stats(engine, jobs):
    return _with_source(engine, engine.scheduler.draft_source, jobs)

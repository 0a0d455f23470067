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
from ember.runtime.loading.model import load_model
from ember.runtime.sampling.params import SamplingParams
from ember.runtime.speculative.config import SpeculativeConfig

BASE = {"num_blocks": 64, "max_model_len": 256, "max_num_seqs": 3, "max_batched_tokens": 48, "decode_steps": 1}


def _engine(model, method="ngram", k=3, **config):
    spec = SpeculativeConfig(method, num_speculative_tokens=k, adaptive=False) if k else None
    return Engine(model, ByteTokenizer(), EngineConfig(**{**BASE, **config}, speculative=spec))


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


@pytest.fixture(scope="module")
def mtp_engine(hybrid):
    """`--speculative mtp`: its steps return their rows' hidden states, which the MTP drafter reads."""
    # no prefix cache: a prompt it served would have no target hidden states for its cached part, the drafts
    # (and so a seeded row's draws) would depend on what ran before (step_hidden_states.py)
    engine = _engine(hybrid, "mtp", enable_prefix_caching=False)
    yield engine
    engine.close()


def _count_target_calls(engine):
    """Wrap the executor's target executables and launches: [device calls, launches, verify launches]."""
    executor, counts = engine.executor, [0, 0, 0]

    def counted(fn, index):
        def call(*args):
            counts[index] += 1
            return fn(*args)

        return call

    executor.step_fn, executor.verify_fn = counted(executor.step_fn, 0), counted(executor.verify_fn, 0)
    launch = executor._launch

    def counted_launch(step, rows, steps, **kw):
        counts[1] += 1
        counts[2] += bool(step.verifies)
        return launch(step, rows, steps, **kw)

    executor._launch = counted_launch
    return counts


def test_mtp_drafts_from_the_steps_hidden_states(mtp_engine, prompts, plain, monkeypatch):
    """The MTP module as the drafter: its greedy drafts (random MTP weights: mostly rejected, so the recurrent
    state rolls back) leave the tokens plain decoding's, and it drafts from the hidden states the engine's own
    steps return: one target call per step (verify steps included), no other target pass (a SequenceRunner,
    what a hidden-state pass runs, fails here); its per-request state goes back with the request."""
    from ember.runtime.execution.sequence_runner import SequenceRunner
    from ember.runtime.speculative.step_hidden_states import StepHiddenStates

    def no_pass(*args, **kw):
        raise AssertionError("an extra target pass")

    monkeypatch.setattr(SequenceRunner, "prefill", no_pass)
    drafter = mtp_engine.drafter
    assert isinstance(drafter.hidden_states, StepHiddenStates)
    assert mtp_engine.executor.hidden_sink == drafter.hidden_states.record
    counts = _count_target_calls(mtp_engine)
    out, (drafted, accepted) = _run_stats(mtp_engine, [(prompts[2], ())])
    calls, launches, verifies = counts
    assert out == plain[2:] and drafted > 0, (drafted, accepted)
    assert calls == launches and verifies > 0  # one target forward per step, each verify step one call
    assert calls <= 1 + len(out[0])  # a prefill step, then at most one call per emitted token
    assert drafter.sequences == {} and drafter.hidden_states.rows == {}
    _idle(mtp_engine)


def test_step_hidden_states_are_the_targets(hybrid, mtp_engine, prompts):
    """What the steps hand the drafter equals the target's own hidden states (the embedding pass's) at the
    request's computed positions (a prefill chunk's rows, decode and verify rows)."""
    from ember.runtime.execution.hidden_states import Embedder

    executor, store, seen = mtp_engine.executor, mtp_engine.drafter.hidden_states, {}
    record = executor.hidden_sink
    executor.hidden_sink = lambda step, shape, hidden: (record(step, shape, hidden), seen.update(store.rows))
    try:
        outputs = mtp_engine.submit(prompts[0], SamplingParams(max_tokens=6, **GREEDY)).collect()[0]
    finally:
        executor.hidden_sink = record
    tokens = [t for o in outputs for t in o.token_ids]
    sequence = list(prompts[0]) + tokens[:-1]  # every token the target computed
    want = Embedder(hybrid).hidden_states(sequence)
    np.testing.assert_allclose(seen[next(iter(seen))][: len(sequence)], want, atol=2e-5, rtol=1e-4)


def test_hidden_state_store_by_position():
    """Positions are overwritten where computed again; positions never computed (a prefix-cache hit) read 0."""
    from ember.runtime.speculative.step_hidden_states import StepHiddenStates

    store = StepHiddenStates(2)
    store._write("r", 3, np.ones((2, 2), np.float32))
    store._write("r", 4, np.full((30, 2), 2.0, np.float32))
    got = store("r", range(40))
    assert (got[:3] == 0).all() and (got[3] == 1).all() and (got[4:34] == 2).all() and (got[34:] == 0).all()
    store.release("r")
    assert store.rows == {}


def test_mtp_drafts_sampled_rows_with_their_q_and_a_seed_reproduces(mtp_engine, prompts):
    drafter = mtp_engine.drafter
    proposals = []
    propose = drafter.propose
    drafter.propose = lambda context, k: proposals.append(propose(context, k)) or proposals[-1]
    params = SamplingParams(max_tokens=8, temperature=0.8, seed=3, ignore_eos=True)
    try:
        runs = [[t for o in mtp_engine.submit(prompts[2], params).collect()[0] for t in o.token_ids] for _ in range(2)]
    finally:
        del drafter.propose
    assert runs[0] == runs[1] and len(runs[0]) == 8
    drafted = [p for p in proposals if len(p)]
    assert drafted and all(p.probs is not None and p.probs.shape[0] == len(p) for p in drafted)
    for p in drafted:
        np.testing.assert_allclose(p.probs.sum(-1), 1.0, rtol=1e-5)
        assert (p.probs[np.arange(len(p)), list(p.token_ids)] > 0).all()
    _idle(mtp_engine)


def test_mtp_is_refused_without_an_mtp_module():
    path, _ = tiny_fixture("qwen3_5")
    with pytest.raises(ValueError, match="multi-token-prediction"):
        _engine(load_model(path, with_mtp=False), "mtp")


def _run_stats(engine, jobs):
    return _with_source(engine, engine.scheduler.draft_source, jobs)

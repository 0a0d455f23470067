"""The MTP module of the hybrid Qwen families (runtime/loading/mtp.py, runtime/speculative/mtp_forward.py,
runtime/speculative/mtp_drafter.py) on the tiny fixtures, against the independent jnp reference of
tests/mtp_reference.py fed the target's own final-norm hidden states: the weights load from safetensors and from
llama.cpp's GGUF alike, one pass and a chunked pass give the reference's logits, k autoregressive steps give k
drafts equal to the reference's greedy chain, and the drafter keeps and rolls back its cache correctly."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from fixture_data import tiny_fixture, tiny_gguf
from mtp_reference import MtpReference

from ember.runtime.execution.hidden_states import Embedder
from ember.runtime.loading.model import load_model
from ember.runtime.speculative.drafter import DraftContext, Drafter
from ember.runtime.speculative.mtp_drafter import IncrementalHiddenStates, MtpDrafter, RecomputedHiddenStates
from ember.runtime.speculative.mtp_forward import MtpSequence
from ember.tools.dev.spec_acceptance import mtp_drafter, replay

# qwen3_next's MTP layer is the same body as qwen3_5_moe's (full attention + MoE): slow, to keep CI short
ARCHS = (pytest.param("qwen3_next", marks=pytest.mark.slow), "qwen3_5", "qwen3_5_moe")
TOLERANCE = 1e-4
PROMPT = 17  # tokens of the fixture's prompt used: 16 MTP rows (one row bucket, shared by the chunks below)


@functools.cache
def _loaded(arch):
    """(arch, model, reference, tokens [PROMPT], the target's final-norm hidden states of tokens[:-1], the
    Embedder that computed them): one model per family for the whole module (one compile of each step)."""
    path, ref = tiny_fixture(arch)
    model = load_model(path)
    tokens = [int(t) for t in ref["input_ids"][:PROMPT]]
    embedder = Embedder(model)
    hidden = embedder.hidden_states(tokens[:-1])
    return arch, model, MtpReference(path), tokens, hidden, embedder


@pytest.fixture(scope="module", params=ARCHS)
def setup(request):
    return _loaded(request.param)


def test_weights_load_with_a_flag():
    path, _ = tiny_fixture("qwen3_next")
    model = load_model(path)
    assert model.has_mtp and model.mtp_layers == 1
    assert model.mtp.bodies == ("full_attention+moe",)
    assert not load_model(tiny_fixture("qwen3_moe")[0]).has_mtp  # a family without MTP tensors
    assert load_model(tiny_fixture("qwen3_5")[0]).mtp.bodies == ("full_attention+dense",)
    assert not load_model(path, with_mtp=False).has_mtp


def test_one_pass_and_chunks_match_the_reference(setup):
    _, model, reference, tokens, hidden, _ = setup
    want, want_hidden = reference(tokens[1:], hidden)  # row p: (h_p, t_{p+1}) at position p
    whole = MtpSequence(model, 64)
    logits, out = whole.run(tokens[1:], 0, hidden)
    assert np.abs(logits - np.asarray(want)).max() <= TOLERANCE
    assert np.abs(out - np.asarray(want_hidden)).max() <= TOLERANCE
    chunked = MtpSequence(model, 64)
    parts, start = [], 0
    for size in (1, 1, 14):  # 16 rows: a chunk continues the cache the chunks before it wrote
        parts.append(chunked.run(tokens[1 + start : 1 + start + size], start, hidden[start : start + size])[0])
        start += size
    assert np.abs(np.concatenate(parts) - np.asarray(want)).max() <= TOLERANCE


def _reference_chain(reference, tokens, hidden, k):
    """k greedy drafts of the reference, each step re-run causally over all rows so far."""
    inputs, states, drafts = list(tokens[1:]), list(hidden), []
    for _ in range(k):
        logits, out = reference(inputs, np.stack(states))
        drafts.append(int(np.argmax(logits[-1])))
        inputs.append(drafts[-1])
        states.append(np.asarray(out[-1]))
    return drafts


def test_k_autoregressive_steps_give_the_references_drafts(setup):
    arch, model, reference, tokens, hidden, embedder = setup
    drafter = MtpDrafter(model, RecomputedHiddenStates(model, embedder), max_model_len=64)
    assert isinstance(drafter, Drafter)
    context = DraftContext("r", tokens[:12], tokens[12:])  # asks for the hidden states computed above (no compile)
    draft = drafter.propose(context, 4)
    assert len(draft) == 4 and draft.probs is None
    assert list(draft.token_ids) == _reference_chain(reference, tokens, hidden, 4), arch


def _causal_hidden(width):
    """A stand-in for the target's hidden states that, like them, depends on the tokens up to each position
    only (the cache tests need causality, not the target: its forward is tested above)."""

    def hidden(request_id, tokens):
        rows = [np.random.default_rng(list(tokens[: p + 1])).standard_normal(width) for p in range(len(tokens))]
        return np.stack(rows).astype(np.float32)

    return hidden


@pytest.fixture(scope="module")
def dense():
    _, model, _, tokens, _, _ = _loaded("qwen3_5")
    return model, tokens


def test_cache_is_reused_and_rolled_back(dense):
    """Proposing again after the target accepted some drafts (or rejected them all) gives what a fresh drafter
    gives on the same context: kept positions are valid, positions written by drafts are recomputed."""
    model, tokens = dense
    source = _causal_hidden(model.dims.d)
    drafter = MtpDrafter(model, source, max_model_len=64)
    first = drafter.propose(DraftContext("r", tokens[:10], ()), 3)
    accepted = [*tokens[:10], first.token_ids[0], 7]  # one draft accepted, then the target's own token
    rejected = [*tokens[:10], (first.token_ids[0] + 1) % 256]
    for continued in (accepted, rejected):
        again = drafter.propose(DraftContext("r", continued[:10], continued[10:]), 3)
        fresh = MtpDrafter(model, source, max_model_len=64).propose(
            DraftContext("x", continued[:10], continued[10:]), 3
        )
        assert again.token_ids == fresh.token_ids
    drafter.release("r")
    assert "r" not in drafter.sequences


def test_sampled_drafts_carry_their_distributions(dense):
    model, tokens = dense
    drafter = MtpDrafter(model, _causal_hidden(model.dims.d), max_model_len=64, temperature=0.8, seed=1)
    draft = drafter.propose(DraftContext("r", tokens[:12], ()), 3)
    assert draft.probs.shape == (3, model.dims.vocab)
    np.testing.assert_allclose(draft.probs.sum(axis=1), 1.0, atol=1e-5)
    assert all(draft.probs[i, t] > 0 for i, t in enumerate(draft.token_ids))


def test_gguf_mtp_equals_safetensors():
    path, _ = tiny_fixture("qwen3_next")
    gguf, _ = tiny_gguf("qwen3_next")
    hf_model, gguf_model = load_model(path), load_model(gguf)
    assert gguf_model.has_mtp and gguf_model.mtp_layers == 1
    for name, value in hf_model.mtp.globals.items():
        np.testing.assert_allclose(np.asarray(gguf_model.mtp.globals[name]), np.asarray(value), atol=1e-6, err_msg=name)
    for name, value in hf_model.mtp.layers[0].items():
        np.testing.assert_allclose(
            np.asarray(gguf_model.mtp.layers[0][name]), np.asarray(value), atol=1e-6, err_msg=name
        )


def test_short_contexts_and_no_mtp(dense):
    model, _ = dense
    drafter = MtpDrafter(model, _causal_hidden(model.dims.d), max_model_len=16)
    assert len(drafter.propose(DraftContext("r", [5], ()), 3)) == 0  # no computed token yet: nothing to draft from
    assert len(drafter.propose(DraftContext("r", list(range(1, 16)), ()), 3)) == 0  # would pass max_model_len
    with pytest.raises(ValueError, match="no MTP"):
        MtpDrafter(load_model(tiny_fixture("qwen3_moe")[0]))


def test_incremental_hidden_states_equal_the_whole_pass():
    """Asked for a growing prefix, the incremental source runs only the new tokens and returns the whole pass's
    hidden states; a request whose tokens differ starts again; release drops it."""
    _, model, _, tokens, hidden, embedder = _loaded("qwen3_5")
    source = IncrementalHiddenStates(model, embedder, max_model_len=64)
    np.testing.assert_allclose(source("r", tokens[:8]), hidden[:8], atol=1e-5)
    np.testing.assert_allclose(source("r", tokens[:16]), hidden, atol=1e-5)
    assert source.runs["r"][0].length == 16  # 8 then 8 tokens run, not 8 + 16
    changed = [tokens[0] + 1, *tokens[1:8]]
    assert not np.allclose(source("r", changed)[0], hidden[0], atol=1e-3)
    assert source.runs["r"][0].length == 8
    drafter = MtpDrafter(model, source, max_model_len=64)
    drafter.propose(DraftContext("r", tokens[:6], ()), 2)
    drafter.release("r")
    assert "r" not in source.runs


def test_acceptance_replay_with_the_mtp_drafter():
    """tools/dev/spec_acceptance.py's `mtp` drafter: replayed over an output that is its own greedy chain, every
    draft is accepted; its per-request state (MTP cache, hidden-state pass) is released after the prompt."""
    _, model, _, tokens, _, _ = _loaded("qwen3_5")
    drafter = mtp_drafter(model, 64)
    prompt = tokens[:8]
    chain = list(mtp_drafter(model, 64).propose(DraftContext("c", prompt, ()), 3).token_ids)
    stats = replay(drafter, "r", prompt, [*chain, 0], k=3)
    assert (stats.steps, stats.num_accepted_tokens) == (1, 3)
    assert not drafter.sequences and not drafter.hidden_states.runs

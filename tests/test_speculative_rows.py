"""Each verify position's sampling state (ember.runtime.speculative.rows): packed as plain decoding would pack
it after emitting the drafts before it, so greedy verification with penalties emits plain decoding's tokens,
and a draft the grammar refuses ends the draft."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_guided import tiny_tokenizer

from ember.compiler.kernels.sampling import sample
from ember.compiler.kernels.speculative.reference import verify
from ember.runtime.sampling.guided import GrammarTokenizer, GuidedDecoding
from ember.runtime.sampling.params import RowState, SamplingParams, pack_batch
from ember.runtime.speculative.rows import verify_row_states

V, WIDTH = 128, 4  # vocabulary (>= the tiny tokenizer's 101 ids), K + 1
SLOTS = dict(vocab_size=V, history_bucket=32, bias_slots=2, suppress_slots=2)
VERIFY = jax.jit(verify, static_argnames=("num_top_logprobs", "all_greedy"))
SAMPLE = jax.jit(sample, static_argnames=("num_top_logprobs", "candidate_window", "all_greedy"))


def test_positions_see_the_drafts_before_them_as_emitted():
    row = RowState(SamplingParams(temperature=0.5, min_tokens=4), seed=9, prompt_ids=[1, 2], output_ids=[5, 6])
    states, kept = verify_row_states(row, [7, 8, 9, 10], WIDTH)
    assert kept == (7, 8, 9)  # at most WIDTH - 1
    assert [list(s.output_ids) for s in states] == [[5, 6], [5, 6, 7], [5, 6, 7, 8], [5, 6, 7, 8, 9]]
    assert [s.token_index for s in states] == [2, 3, 4, 5]
    assert [s.min_tokens_in_force for s in states] == [True, True, False, False]
    short, kept = verify_row_states(row, [7], WIDTH)
    assert kept == (7,) and short[2:] == [short[1], short[1]]  # padding repeats the last real position
    forced = RowState(SamplingParams(forced_token_ids=(3, 4, 5)), seed=0, prompt_ids=[1], output_ids=[])
    assert verify_row_states(forced, [3, 4], WIDTH)[1] == ()
    with pytest.raises(ValueError, match="width"):
        verify_row_states(row, [], 0)


def test_greedy_verify_with_penalties_emits_plain_decodings_tokens():
    rng = np.random.default_rng(4)
    logits = rng.normal(0, 1.5, (1, WIDTH, V)).astype(np.float32)
    params = SamplingParams(temperature=0.0, repetition_penalty=1.5, frequency_penalty=1.0, presence_penalty=0.5)
    row = RowState(params, seed=1, prompt_ids=[3, 4], output_ids=[int(logits[0, 0].argmax())])
    # plain decoding, one token at a time over the same per-position logits
    plain, output = [], list(row.output_ids)
    for i in range(WIDTH):
        state = RowState(params, seed=1, prompt_ids=[3, 4], output_ids=list(output))
        token = int(
            SAMPLE(jnp.asarray(logits[:, i]), jax.tree.map(jnp.asarray, pack_batch([state], **SLOTS))).tokens[0]
        )
        plain.append(token)
        output.append(token)
    # the penalties change the picks (else this test would not test them)
    assert plain != [int(t) for t in logits[0].argmax(-1)]
    for accepted in range(WIDTH):  # drafts matching plain decoding for `accepted` tokens, then a wrong one
        drafts = plain[:accepted] + [(plain[accepted] + 1) % V] if accepted < WIDTH - 1 else plain[: WIDTH - 1]
        states, kept = verify_row_states(row, drafts, WIDTH)
        batch = jax.tree.map(jnp.asarray, pack_batch(states, **SLOTS))
        padded = np.full((1, WIDTH - 1), -1, np.int32)
        padded[0, : len(kept)] = kept
        result = VERIFY(logits, batch, padded, np.array([len(kept)], np.int32), all_greedy=True)
        a = min(accepted, WIDTH - 1)
        assert int(result.num_accepted[0]) == a
        assert np.asarray(result.tokens[0, : a + 1]).tolist() == plain[: a + 1]


def test_a_draft_the_grammar_refuses_ends_the_draft_and_masks_follow_the_drafts():
    tokenizer = tiny_tokenizer()
    grammar = GrammarTokenizer(tokenizer, V, tokenizer.eos_token_ids)
    guided = GuidedDecoding("regex", "ab+c")
    row = RowState(SamplingParams(temperature=0.0, guided=guided), seed=0, prompt_ids=[1], output_ids=[])
    row = RowState(row.params, 0, [1], [], matcher=grammar.matcher(guided))
    a, b, c, x = (tokenizer.token_to_id(ch) for ch in "abcx")
    states, kept = verify_row_states(row, [a, b, x, c], WIDTH)
    assert kept == (a, b)  # "x" is refused: the draft ends before it
    masks = pack_batch(states, **SLOTS).allowed_mask
    allowed = [{t for t in (a, b, c, x) if masks[i, t // 32] >> (t % 32) & 1} for i in range(WIDTH)]
    assert allowed[:3] == [{a}, {b}, {b, c}]  # before "a", after "a", after "ab"
    assert allowed[3] == {a, b, c, x}  # padding: unconstrained
    assert row.matcher.accept(a) is None  # the row's own matcher was not advanced

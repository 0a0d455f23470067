"""Speculation under a grammar (tiny checkpoint, a tiny byte-level tokenizer): a draft the grammar refuses
ends the draft before the step, and greedy guided output is exactly plain guided decoding's."""

import json

import jsonschema
import pytest
from fixture_data import tiny_fixture
from test_guided import SCHEMA, tiny_tokenizer

from ember.runtime.engine.engine import Engine, EngineConfig
from ember.runtime.loading.model import load_model
from ember.runtime.sampling.guided import GuidedDecoding
from ember.runtime.sampling.params import SamplingParams
from ember.runtime.speculative.config import SpeculativeConfig


def _guided_run(model, tokenizer, prompt, speculative, prediction=()):
    config = EngineConfig(
        num_blocks=96, max_model_len=256, max_num_seqs=2, max_batched_tokens=64, speculative=speculative
    )
    engine = Engine(model, tokenizer, config, stop_token_ids=frozenset(tokenizer.eos_token_ids))
    try:
        params = SamplingParams(max_tokens=120, temperature=0.0, guided=GuidedDecoding.json_schema(SCHEMA))
        outs = engine.submit(prompt, params, prediction_ids=prediction).collect()[0]
        stats = engine.speculation_stats()
    finally:
        engine.close()
    return [t for o in outs for t in o.token_ids], "".join(o.text for o in outs), stats


@pytest.mark.slow  # two engines to compile (~30 s on a shared CPU)
def test_grammar_refused_drafts_never_change_guided_output():
    model, tokenizer = load_model(tiny_fixture("qwen2")[0]), tiny_tokenizer()
    prompt = tokenizer.encode("Give me a color and a count as JSON:")
    plain, text, _ = _guided_run(model, tokenizer, prompt, None)
    # the exact output as a prediction, with ids the grammar masks (past the tokenizer) spliced in
    prediction = tuple(plain[:5]) + (200, 201) + tuple(plain[5:])
    spec = SpeculativeConfig("ngram", 4, adaptive=False)
    tokens, spec_text, stats = _guided_run(model, tokenizer, prompt, spec, prediction)
    assert tokens == plain and spec_text == text
    jsonschema.validate(json.loads(text), SCHEMA)
    assert stats.num_accepted_tokens > 0

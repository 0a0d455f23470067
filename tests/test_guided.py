"""Constrained decoding (ember.runtime.sampling.guided + the engine) and teacher-forced scoring, on the tiny random
qwen2 checkpoint (CPU): random weights still give schema-valid JSON, because the grammar's mask decides
what may be sampled. Also server/structured.py's translation of response_format / Ollama format."""

from __future__ import annotations

import json
import time

import jsonschema
import numpy as np
import pytest
from fixture_data import tiny_fixture
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as BackendTokenizer

from ember.runtime.engine.engine import Engine, EngineConfig
from ember.runtime.loading.model import load_model
from ember.runtime.loading.text.tokenizer import SpecialIds, Tokenizer
from ember.runtime.sampling.guided import GrammarTokenizer, GuidedDecoding, GuidedMatcher, fill_masks
from ember.runtime.sampling.params import SamplingParams
from ember.server.structured import (
    StructuredOutputError,
    guided_from_lark,
    guided_from_ollama_format,
    guided_from_response_format,
)

SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["count", "color"],
    "properties": {
        "count": {"type": "integer", "minimum": 0, "maximum": 999},
        "color": {"enum": ["red", "green", "blue"]},
    },
}


def _byte_to_char() -> dict[int, str]:
    """GPT-2's byte-level alphabet (what Qwen's tokenizer uses): every byte as one printable character."""
    visible = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = dict(zip(visible, map(chr, visible)))
    extra = (b for b in range(256) if b not in chars)
    chars.update((b, chr(256 + n)) for n, b in enumerate(extra))
    return chars


def tiny_tokenizer() -> Tokenizer:
    """A byte-level BPE tokenizer of 101 ids (printable ASCII, newline, 4 merges, <|endoftext|>): it fits
    the tiny checkpoints' 256-row vocabulary, and ids 101..255 exist only in the model (masked out)."""
    b2c = _byte_to_char()
    vocab = {b2c[b]: i for i, b in enumerate([*range(0x20, 0x7F), 0x0A])}
    merges = [(b2c[ord(a)], b2c[ord(b)]) for a, b in ('{"', '":', '"}', ' "')]
    vocab.update((a + b, len(vocab) + i) for i, (a, b) in enumerate(merges))
    backend = BackendTokenizer(models.BPE(vocab, merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    eos = backend.token_to_id("<|endoftext|>")
    return Tokenizer(backend, SpecialIds(None, eos, (eos,), False), chat_template=None, source="tiny-bpe")


@pytest.fixture(scope="module")
def qwen2():
    return load_model(tiny_fixture("qwen2")[0])


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def _engine(model, tokenizer, **kw):
    config = EngineConfig(**{"num_blocks": 96, "max_model_len": 256, "max_num_seqs": 4, "max_batched_tokens": 64, **kw})
    return Engine(model, tokenizer, config, stop_token_ids=frozenset(tokenizer.eos_token_ids))


def _text(outputs):
    return "".join(o.text for o in outputs), [t for o in outputs for t in o.token_ids]


def test_json_schema_output_is_valid_json_from_random_weights(qwen2, tokenizer):
    prompt = tokenizer.encode("Give me a color and a count as JSON:")
    guided = GuidedDecoding.json_schema(SCHEMA)
    engine = _engine(qwen2, tokenizer)
    try:
        sampled = engine.submit(prompt, SamplingParams(max_tokens=160, temperature=1.0, seed=5, n=3, guided=guided))
        greedy = engine.submit(prompt, SamplingParams(max_tokens=160, temperature=0.0, guided=guided, logprobs=2))
        outputs = {**{("sampled", i): o for i, o in sampled.collect().items()}, ("greedy", 0): greedy.collect()[0]}
    finally:
        engine.close()
    for key, outs in outputs.items():
        text, ids = _text(outs)
        assert outs[-1].finish_reason == "stop", (key, text)
        assert max(ids) < tokenizer.vocab_size  # ids past the tokenizer (101..255) were masked out
        jsonschema.validate(json.loads(text), SCHEMA)
    texts = {_text(outs)[0] for outs in outputs.values()}
    assert len(texts) > 1  # the choices sampled differently: the mask constrains, it does not decide
    assert engine.pool.free_blocks == engine.pool.num_usable_blocks


def test_regex_and_lark_grammars(qwen2, tokenizer):
    lark = (
        'start: "call " %json {"type": "object", "properties": {"ok": {"type": "boolean"}}, '
        '"required": ["ok"], "additionalProperties": false}'
    )
    engine = _engine(qwen2, tokenizer)
    try:
        regex = engine.submit(
            [5, 6, 7],
            SamplingParams(max_tokens=40, temperature=1.0, seed=1, guided=GuidedDecoding.regex(r"(yes|no), [0-9]{2}")),
        )
        tool = engine.submit(
            [5, 6, 7], SamplingParams(max_tokens=80, temperature=0.0, guided=GuidedDecoding.lark(lark))
        )
        regex_outs, tool_outs = regex.collect()[0], tool.collect()[0]
    finally:
        engine.close()
    text, _ = _text(regex_outs)
    assert regex_outs[-1].finish_reason == "stop" and text[:4] in ("yes,", "no, ") and text[-2:].isdigit()
    text, _ = _text(tool_outs)
    assert tool_outs[-1].finish_reason == "stop" and text.startswith("call ")
    assert isinstance(json.loads(text[5:])["ok"], bool)


def test_an_invalid_grammar_is_a_value_error_and_the_engine_goes_on(qwen2, tokenizer):
    bad = [
        GuidedDecoding.json_schema({"type": "foo"}),
        GuidedDecoding.json_schema("{not json"),
        GuidedDecoding.json_schema({"type": "integer", "minimum": 5, "maximum": 2}),
        GuidedDecoding.lark("start: undefined_rule"),
        GuidedDecoding.regex("(unclosed"),
        GuidedDecoding("yaml", "x"),
    ]
    for guided in bad:
        with pytest.raises(ValueError, match=r"^guided\.(spec|kind):"):
            SamplingParams(guided=guided).validate(256)
    with pytest.raises(ValueError, match="^guided:"):
        SamplingParams(guided=GuidedDecoding.json_object(), forced_token_ids=(1,)).validate(256)
    engine = _engine(qwen2, tokenizer)
    try:
        with pytest.raises(ValueError, match="guided.spec"):
            engine.submit([5, 6], SamplingParams(max_tokens=4, guided=bad[0]))
        outs = engine.submit([5, 6], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)).collect()[0]
        assert outs[-1].finish_reason == "length"
    finally:
        engine.close()


def test_a_grammar_error_ends_only_its_choice(qwen2, tokenizer, monkeypatch):
    accept = GuidedMatcher.accept

    def failing_accept(self, token_id):  # the grammar breaks on the third token of one request
        self.seen = getattr(self, "seen", 0) + 1
        if getattr(self, "doomed", False) and self.seen == 3:
            raise RuntimeError("matcher exploded")
        return accept(self, token_id)

    monkeypatch.setattr(GuidedMatcher, "accept", failing_accept)
    engine = _engine(qwen2, tokenizer)
    try:
        doomed = engine.submit(
            [5, 6, 7], SamplingParams(max_tokens=100, temperature=0.0, guided=GuidedDecoding.json_schema(SCHEMA))
        )
        engine.requests.groups[doomed.request_id].choices[0].matcher.doomed = True  # before its first step ends
        fine = engine.submit(
            [8, 9], SamplingParams(max_tokens=100, temperature=0.0, guided=GuidedDecoding.json_schema(SCHEMA))
        )
        doomed_outs, fine_outs = doomed.collect()[0], fine.collect()[0]
    finally:
        engine.close()
    assert doomed_outs[-1].finish_reason == "abort" and "matcher exploded" in doomed_outs[-1].error
    assert len(_text(doomed_outs)[1]) == 2  # the refused token never reached the stream
    assert fine_outs[-1].finish_reason == "stop" and fine_outs[-1].error is None
    jsonschema.validate(json.loads(_text(fine_outs)[0]), SCHEMA)
    assert engine.pool.free_blocks == engine.pool.num_usable_blocks


@pytest.mark.parametrize(
    "params",
    [
        dict(temperature=0.0),
        dict(temperature=0.9, seed=11, repetition_penalty=1.3, frequency_penalty=0.5, logit_bias={7: 2.0}),
    ],
)
def test_forced_tokens_rescore_a_generation_bit_for_bit(qwen2, tokenizer, params):
    """Teacher-forced scoring of prompt + a generated completion reports the very logprobs generation
    reported (deterministic mode: the scoring request's batch does not matter)."""
    prompt = list(range(3, 40))
    engine = _engine(qwen2, tokenizer, deterministic=True)
    try:
        generated = engine.submit(prompt, SamplingParams(max_tokens=12, logprobs=4, ignore_eos=True, **params))
        gen = generated.collect()[0]
        tokens = [t for o in gen for t in o.token_ids]
        other = engine.submit(list(range(50, 90)), SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))
        scored = engine.submit(
            prompt, SamplingParams(logprobs=4, forced_token_ids=tuple(tokens), stop=("A",), **params)
        ).collect()[0]
        other.collect()
    finally:
        engine.close()
    assert [t for o in scored for t in o.token_ids] == tokens
    assert scored[-1].finish_reason == "length" and scored[-1].usage.completion_tokens == len(tokens)
    lps = lambda outs: [(lp.token_id, lp.logprob, lp.top) for o in outs for lp in o.logprobs]
    assert lps(scored) == lps(gen)  # exact float equality


def test_forced_tokens_ignore_eos_and_stop_ids(qwen2, tokenizer):
    eos = tokenizer.eos_token_id
    engine = _engine(qwen2, tokenizer)
    try:
        outs = engine.submit(
            [5, 6], SamplingParams(forced_token_ids=(10, eos, 11), stop_token_ids=(11,), logprobs=0)
        ).collect()[0]
    finally:
        engine.close()
    assert [t for o in outs for t in o.token_ids] == [10, eos, 11] and outs[-1].finish_reason == "length"
    assert all(lp.logprob <= 0 for o in outs for lp in o.logprobs)


def test_fill_masks_clears_ids_past_the_tokenizer(tokenizer):
    grammar_tokenizer = GrammarTokenizer(tokenizer, 256, tokenizer.eos_token_ids)
    matcher = grammar_tokenizer.matcher(GuidedDecoding.json_object())
    mask = np.full((3, 8), -1, np.int32)
    fill_masks([(matcher, 1)], mask, 256)
    allowed = np.unpackbits(mask[1].view(np.uint8), bitorder="little").astype(bool)
    assert np.all(mask[[0, 2]] == -1)  # unguided rows keep all ones
    assert set(np.flatnonzero(allowed)) <= {tokenizer.token_to_id(t) for t in ("{", '{"', "Ġ", "Ċ")}
    assert not allowed[tokenizer.vocab_size :].any()


def test_mask_cost_is_small(tokenizer):
    """Mask computation stays far below a step (CPU steps of the tiny model take milliseconds)."""
    grammar_tokenizer = GrammarTokenizer(tokenizer, 256, tokenizer.eos_token_ids)
    matchers = [grammar_tokenizer.matcher(GuidedDecoding.json_schema(SCHEMA)) for _ in range(8)]
    mask = np.full((8, 8), -1, np.int32)
    fill_masks([(m, r) for r, m in enumerate(matchers)], mask, 256)  # warm
    start = time.perf_counter()
    for _ in range(20):
        fill_masks([(m, r) for r, m in enumerate(matchers)], mask, 256)
    assert (time.perf_counter() - start) / 20 < 0.05


# --- server/structured.py ---------------------------------------------------------------------------------
def test_response_format_translation():
    assert guided_from_response_format(None) is None and guided_from_response_format({"type": "text"}) is None
    assert guided_from_response_format({"type": "json_object"}) == GuidedDecoding.json_object()
    strict = guided_from_response_format(
        {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}
    )
    assert strict.kind == "json_schema" and json.loads(strict.spec) == SCHEMA and not strict.lenient
    loose = guided_from_response_format({"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}})
    assert loose.lenient
    assert guided_from_response_format({"type": "json_schema", "json_schema": {"name": "x"}}).kind == "json_object"
    assert guided_from_ollama_format("json") == GuidedDecoding.json_object()
    assert guided_from_ollama_format(SCHEMA).kind == "json_schema" and guided_from_ollama_format("") is None
    assert guided_from_lark('start: "a" | "b"', "tools").kind == "lark"
    # a keyword llguidance cannot enforce: refused when strict, ignored otherwise (OpenAI's best effort)
    unenforceable = {"type": "object", "properties": {"a": {"not": {"type": "string"}}}}
    assert guided_from_response_format({"type": "json_schema", "json_schema": {"schema": unenforceable}}).lenient
    with pytest.raises(StructuredOutputError, match="Unimplemented keys"):
        guided_from_response_format({"type": "json_schema", "json_schema": {"schema": unenforceable, "strict": True}})


@pytest.mark.parametrize(
    "body, param",
    [
        ({"type": "xml"}, "response_format.type"),
        ("json", "response_format"),
        ({"type": "json_schema"}, "response_format.json_schema"),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "strict": "yes", "schema": SCHEMA}},
            "response_format.json_schema.strict",
        ),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": []}}, "response_format.json_schema.schema"),
        (
            {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "foo"}}}},
            },
            "response_format.json_schema.schema.properties.a.type",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "required": "a"}}},
            "response_format.json_schema.schema.required",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/$defs/missing"}}},
            "response_format.json_schema.schema",
        ),
        (
            {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "string", "minLength": 5, "maxLength": 2}},
            },
            "response_format.json_schema.schema",
        ),
    ],
)
def test_invalid_response_formats_name_the_param(body, param):
    with pytest.raises(StructuredOutputError) as info:
        guided_from_response_format(body)
    assert info.value.param == param and str(info.value).startswith(param + ": ")
    assert isinstance(info.value, ValueError)


def test_invalid_ollama_format_and_lark():
    with pytest.raises(StructuredOutputError, match="^format:"):
        guided_from_ollama_format("yaml")
    with pytest.raises(StructuredOutputError, match="^format.properties.a.type:"):
        guided_from_ollama_format({"type": "object", "properties": {"a": {"type": 3}}})
    with pytest.raises(StructuredOutputError, match="^tool_choice:"):
        guided_from_lark("start: nothing_here", "tool_choice")

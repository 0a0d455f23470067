"""Grammars for XML-form tool calls (Qwen3-Coder / Qwen3.5), token by token on a tiny tokenizer: which
calls they accept, where the turn may end, and that every turn they let a model write parses back as
valid calls."""

from __future__ import annotations

import random
import re

import llguidance
import numpy as np
import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from ember.server.tool_format import XML_TOOL_CALLS
from ember.server.tool_xml import parse_xml_tool_calls
from ember.server.tools import ToolChoice, parse_openai_tools

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "unit": {"type": "string", "enum": ["C", "F"]},
        "code": {"type": "string", "minLength": 2, "maxLength": 3},
        "metric": {"type": "boolean"},
        "where": {"type": "object", "properties": {"lat": {"type": "number"}}, "required": ["lat"]},
    },
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = parse_openai_tools(
    [
        {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
        {"type": "function", "function": {"name": "get-time"}},
    ]
)
TAGS = ["<tool_call>", "</tool_call>", "<think>", "</think>"]


def xml_call(name: str, *parameters: tuple[str, str]) -> str:
    params = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in parameters)
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


PARIS = xml_call("get_weather", ("city", "Paris"))
FULL = xml_call(
    "get_weather",
    ("city", "New\nYork <5>"),
    ("days", "3"),
    ("unit", "F"),
    ("metric", "True"),
    ("where", '{"lat": 40.5}'),
)
TIME = xml_call("get-time")


@pytest.fixture(scope="module", params=["tags-as-text", "tags-as-tokens"])
def ll_tokenizer(request):
    """A tiny byte-level BPE trained here on calls; the Qwen tags as added tokens or spelled out."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|im_end|>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator([PARIS, FULL, TIME, "hello world, <think>hmm</think>"] * 10, trainer)
    if request.param == "tags-as-tokens":
        backend.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in TAGS])
    tokenizer = llguidance.LLTokenizer(backend.to_str(), eos_token=backend.token_to_id("<|im_end|>"))
    return backend, tokenizer


def matcher_for(tokenizer, choice: ToolChoice, **kwargs) -> llguidance.LLMatcher:
    grammar = XML_TOOL_CALLS.grammar(TOOLS, choice, tokenizer=tokenizer, **kwargs)
    matcher = llguidance.LLMatcher(tokenizer, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    return matcher


def accepts(ll_tokenizer, choice: ToolChoice, text: str, **kwargs) -> bool:
    backend, tokenizer = ll_tokenizer
    matcher = matcher_for(tokenizer, choice, **kwargs)
    ids = backend.encode(text).ids
    return matcher.validate_tokens(ids) == len(ids) and matcher.consume_tokens(ids) and matcher.is_accepting()


@pytest.mark.parametrize(
    ("choice", "text", "ok"),
    [
        (ToolChoice("required"), PARIS, True),
        (ToolChoice("required"), FULL, True),  # a value with a line break and "<", every type
        (ToolChoice("required"), PARIS + "\n" + TIME, True),
        (ToolChoice("required", parallel=False), PARIS + "\n" + TIME, False),
        (ToolChoice("required"), "Sure. " + PARIS, False),  # no text in forced mode
        (ToolChoice("required"), xml_call("get_wether", ("city", "Paris")), False),  # not a declared tool
        (ToolChoice("required"), xml_call("get_weather", ("town", "Paris")), False),  # not a property
        (ToolChoice("required"), xml_call("get_weather", ("days", "3")), False),  # the required city missing
        (ToolChoice("required"), xml_call("get_weather", ("city", "A"), ("city", "B")), False),  # twice
        (ToolChoice("required"), xml_call("get_weather", ("city", "A"), ("days", "three")), False),
        (ToolChoice("required"), xml_call("get_weather", ("city", "A"), ("unit", "K")), False),  # not in the enum
        (ToolChoice("required"), xml_call("get_weather", ("city", "A"), ("where", '{"lon": 1}')), False),
        (ToolChoice("required"), xml_call("get_weather", ("city", "a</parameter>b")), False),
        (ToolChoice("required"), xml_call("get_weather", ("city", "a</tool_call>b")), False),
        (ToolChoice("required"), xml_call("get_weather", ("city", "A"), ("code", "F\nR")), True),
        (ToolChoice("required"), xml_call("get_weather", ("city", "A"), ("code", "FRAN")), False),  # maxLength
        (ToolChoice("required"), xml_call("get_weather", ("city", "A"), ("code", "F")), False),  # minLength
        (ToolChoice("required"), PARIS.replace("\n</parameter>", "</parameter>"), False),  # not the layout
        (ToolChoice("function", "get-time"), TIME, True),
        (ToolChoice("function", "get-time"), PARIS, False),
        (ToolChoice("auto"), "Just text, no call.", True),
        (ToolChoice("auto"), "Let me look.\n\n" + FULL + "\n" + TIME, True),
        (ToolChoice("auto"), "Let me look. " + xml_call("nope"), False),  # after the tag, calls are forced
    ],
)
def test_grammar_accepts_valid_calls_and_refuses_others(ll_tokenizer, choice, text, ok):
    assert accepts(ll_tokenizer, choice, text) is ok
    if ok and "<tool_call>" in text:
        assert parse_xml_tool_calls(text, TOOLS).calls


def test_grammar_lets_reasoning_come_first(ll_tokenizer):
    required = ToolChoice("required")
    assert accepts(ll_tokenizer, required, "hmm</think>\n\n" + PARIS, starts_in_reasoning=True)
    assert not accepts(ll_tokenizer, required, PARIS, starts_in_reasoning=True)
    assert accepts(ll_tokenizer, required, "<think>hmm</think>\n\n" + PARIS, reasoning=True)


def turn_may_end(text: str, choice: ToolChoice) -> bool:
    """Outside calls (auto); after a closed block and a few blanks; after `</function>` of an open
    block and a few blanks. Never inside a call."""
    _, tag, block = text.rpartition("<tool_call>")
    if not tag:
        return choice.mode == "auto"
    body, closed, after = block.partition("</tool_call>")
    if closed:
        return choice.mode == "auto" or re.fullmatch(r"[ \t\r\n]{0,8}", after) is not None
    return re.fullmatch(r"\n<function=.*</function>[ \t\r\n]{0,8}", body, re.S) is not None


@pytest.mark.parametrize(
    ("choice", "text"),
    [
        (ToolChoice("required"), PARIS + "\n"),
        (ToolChoice("required"), FULL + "\n" + TIME + "\n\n"),
        (ToolChoice("function", "get-time"), TIME + " \n"),
        (ToolChoice("auto"), "Let me look.\n" + PARIS + "\nDone."),
        (ToolChoice("required"), PARIS.removesuffix("\n</tool_call>") + "\n"),  # end of turn before the close tag
    ],
)
def test_end_of_turn_allowed_exactly_where_the_template_allows_it(ll_tokenizer, choice, text):
    backend, tokenizer = ll_tokenizer
    matcher = matcher_for(tokenizer, choice)
    eos = backend.token_to_id("<|im_end|>")
    ids = backend.encode(text).ids
    allowed = []
    for i in range(len(ids) + 1):
        allowed.append(matcher.validate_tokens([eos]) == 1)
        if i < len(ids):
            assert matcher.consume_token(ids[i]), matcher.get_error()
    expected = [turn_may_end(backend.decode(ids[:i], skip_special_tokens=False), choice) for i in range(len(ids) + 1)]
    assert allowed == expected
    assert allowed[-1]


def allowed_tokens(matcher: llguidance.LLMatcher, vocab: int) -> np.ndarray:
    words = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint32)
    bits = np.unpackbits(words.view(np.uint8), bitorder="little")[:vocab]
    return np.flatnonzero(bits)


@pytest.mark.parametrize("choice", [ToolChoice("required"), ToolChoice("function", "get_weather"), ToolChoice("auto")])
def test_every_turn_the_grammar_allows_parses_as_valid_calls(ll_tokenizer, choice):
    """Random walks through the grammar: random allowed tokens (mostly ones calls are made of), and now
    and then a closing piece of a call written whole where the grammar allows it, so walks finish.
    Each finished turn's calls parse back valid, and a forced turn holds nothing else."""
    backend, tokenizer = ll_tokenizer
    vocab = backend.get_vocab_size(with_added_tokens=True)
    eos = backend.token_to_id("<|im_end|>")
    steer = set(backend.encode(PARIS + FULL + TIME).ids)
    closers = [backend.encode(text).ids for text in ["\n</parameter>\n", "</function>", "\n</tool_call>"]] + [[eos]]
    rng = random.Random(0)
    texts = []
    for _ in range(12):
        matcher = matcher_for(tokenizer, choice)
        ids: list[int] = []
        while len(ids) < 400 and not (ids and ids[-1] == eos):
            if rng.random() < 0.3:
                fitting = [seq for seq in closers if matcher.validate_tokens(seq) == len(seq)]
                if fitting:
                    seq = rng.choice(fitting)
                    assert matcher.consume_tokens(seq)
                    ids += seq
                    continue
            allowed = [int(t) for t in allowed_tokens(matcher, vocab)]
            steered = [t for t in allowed if t in steer]
            token = rng.choice(steered if steered and rng.random() < 0.9 else allowed)
            assert matcher.consume_token(token)
            ids.append(token)
        if ids[-1] == eos:
            texts.append(backend.decode(ids[:-1], skip_special_tokens=False))
    assert len(texts) >= 6
    for text in texts:
        reply = parse_xml_tool_calls(text, TOOLS)
        if choice.forces_call:
            assert reply.calls and reply.content == "", text
        elif "<tool_call>" in text:
            assert reply.calls, text
        by_name = {spec.name: spec for spec in TOOLS}
        assert all(by_name[call.name].argument_errors(call.arguments_object()) is None for call in reply.calls)


def test_grammar_with_the_real_qwen_tokenizer(qwen_gguf):
    """On a real Qwen vocabulary `<tool_call>` is one added token: the XML grammar takes it as that token,
    and the model's end-of-turn ids end the turn right after a whole call."""
    from ember.runtime.loading.formats.gguf_reader import GGUFFile
    from ember.runtime.loading.text.prompting import end_of_generation_ids
    from ember.runtime.loading.text.tokenizer import Tokenizer as EmberTokenizer

    tokenizer = EmberTokenizer.from_gguf_metadata(GGUFFile(qwen_gguf).metadata, str(qwen_gguf))
    eos_ids = sorted(end_of_generation_ids(tokenizer, {}))
    ll = llguidance.LLTokenizer(tokenizer.backend.to_str(), eos_token=eos_ids)
    for choice, text, ok in [
        (ToolChoice("required"), FULL + "\n", True),
        (ToolChoice("auto"), "Let me see. " + PARIS, True),
        (ToolChoice("auto"), "Let me see. " + xml_call("nope"), False),
        (ToolChoice("function", "get-time"), PARIS, False),
    ]:
        matcher = matcher_for(ll, choice)
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.token_to_id("<tool_call>") in ids
        assert (matcher.validate_tokens(ids) == len(ids)) is ok, text
        if ok:
            assert matcher.consume_tokens(ids)
            assert all(matcher.validate_tokens([eos]) == 1 for eos in eos_ids)

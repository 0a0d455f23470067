"""Tool-call grammars (llguidance): they compile, accept valid calls and refuse others, also with the
real Qwen tokenizer; and the tool turns of a conversation as the chat template receives them."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import llguidance
import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from ember.runtime.loader.chat_template import ChatTemplate
from ember.server.tool_grammar import tool_call_grammar
from ember.server.tool_messages import anthropic_messages_to_openai, messages_for_template
from ember.server.tool_stream import parse_tool_calls
from ember.server.tools import ToolCall, ToolChoice, ToolError, parse_openai_tools

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
           "required": ["city"], "additionalProperties": False}
RAW_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather {for} a city",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get-time"}},  # no parameters: takes nothing
]
TOOLS = parse_openai_tools(RAW_TOOLS)


def call_text(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


PARIS = call_text("get_weather", '{"city": "Paris"}')


def counter_ids():
    numbers = itertools.count()
    return lambda: f"call_{next(numbers):024d}"


# ---- grammar -----------------------------------------------------------------------------------


TAGS = ["<tool_call>", "</tool_call>", "<think>", "</think>"]


@pytest.fixture(scope="module", params=["tags-as-text", "tags-as-tokens"])
def ll_tokenizer(request):
    """A tiny byte-level BPE (every string is encodable), trained here in milliseconds; either
    with the tags as added tokens (like Qwen's vocabulary) or spelled out in pieces."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|im_end|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator([PARIS, call_text("get-time", "{}"), "hello world, <think>hmm</think>"] * 10,
                                trainer)
    if request.param == "tags-as-tokens":
        backend.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in TAGS])
    tokenizer = llguidance.LLTokenizer(backend.to_str(), eos_token=backend.token_to_id("<|im_end|>"))
    assert all(len(backend.encode(tag).ids) == 1 for tag in TAGS) == (request.param == "tags-as-tokens")
    return backend, tokenizer


def accepts(ll_tokenizer, choice: ToolChoice, text: str, **kwargs) -> bool:
    backend, tokenizer = ll_tokenizer
    grammar = tool_call_grammar(TOOLS, choice, tokenizer=tokenizer, **kwargs)
    matcher = llguidance.LLMatcher(tokenizer, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    ids = backend.encode(text).ids
    return matcher.validate_tokens(ids) == len(ids) and matcher.consume_tokens(ids) and matcher.is_accepting()


@pytest.mark.parametrize("choice", [ToolChoice("auto"), ToolChoice("required"), ToolChoice("required", parallel=False),
                                    ToolChoice("function", "get-time")])
@pytest.mark.parametrize("reasoning", [{}, {"reasoning": True}, {"starts_in_reasoning": True}])
def test_grammars_compile(choice, reasoning):
    grammar = llguidance.LLMatcher.grammar_from_lark(tool_call_grammar(TOOLS, choice, **reasoning))
    assert llguidance.LLMatcher.validate_grammar(grammar) == ""


def test_no_grammar_without_tools_or_for_none():
    assert tool_call_grammar(TOOLS, ToolChoice("none")) is None
    assert tool_call_grammar((), ToolChoice("auto")) is None


TIME = call_text("get-time", "{}")


@pytest.mark.parametrize(("choice", "text", "ok"), [
    (ToolChoice("required"), PARIS, True),
    (ToolChoice("required"), PARIS + "\n" + TIME, True),
    (ToolChoice("required"), call_text("get_weather", '{"city": "Paris", "days": 3}'), True),
    (ToolChoice("required"), "Sure. " + PARIS, False),                          # no text in forced mode
    (ToolChoice("required"), call_text("get_wether", '{"city": "Paris"}'), False),
    (ToolChoice("required"), call_text("get_weather", '{"town": "Paris"}'), False),
    (ToolChoice("required"), call_text("get_weather", '{"city":"Paris"}'), False),  # not the template's spacing
    (ToolChoice("required"), call_text("get_weather", '{"city": "Paris"}').replace("\n", "", 1), False),
    (ToolChoice("required"), "hello", False),
    (ToolChoice("required", parallel=False), PARIS + "\n" + TIME, False),
    (ToolChoice("function", "get-time"), TIME, True),
    (ToolChoice("function", "get-time"), PARIS, False),
    (ToolChoice("auto"), "Just text, no call.", True),
    (ToolChoice("auto"), "Let me look. " + PARIS + "\n" + TIME, True),
    (ToolChoice("auto"), "Let me look. " + call_text("nope", "{}"), False),   # after the tag, calls are forced
])
def test_grammar_accepts_valid_calls_and_rejects_others(ll_tokenizer, choice, text, ok):
    assert accepts(ll_tokenizer, choice, text) is ok
    if ok:  # what the grammar lets through, the parser reads back as calls
        assert all(e.name for e in parse_tool_calls(text, TOOLS).calls) and (
            "<tool_call>" not in text or parse_tool_calls(text, TOOLS).calls)


def test_grammar_lets_reasoning_come_first(ll_tokenizer):
    required = ToolChoice("required")
    assert accepts(ll_tokenizer, required, "<think>hmm</think>\n\n" + PARIS, reasoning=True)
    assert accepts(ll_tokenizer, required, PARIS, reasoning=True)
    assert accepts(ll_tokenizer, required, "hmm</think>\n" + PARIS, starts_in_reasoning=True)
    assert not accepts(ll_tokenizer, required, PARIS, starts_in_reasoning=True)
    assert accepts(ll_tokenizer, ToolChoice("auto"), "<think>hmm</think>\n\nhello", reasoning=True)


def test_grammar_with_the_real_qwen_tokenizer(qwen_gguf):
    """Qwen's <tool_call> is one added token: the grammar must let the model write it as that token."""
    from ember.runtime.loader.gguf_reader import GGUFFile
    from ember.runtime.loader.tokenizer import Tokenizer as EmberTokenizer

    tokenizer = EmberTokenizer.from_gguf_metadata(GGUFFile(qwen_gguf).metadata, str(qwen_gguf))
    ll = llguidance.LLTokenizer(tokenizer.backend.to_str(), eos_token=list(tokenizer.eos_token_ids))
    for choice, text, ok in [(ToolChoice("required"), PARIS, True), (ToolChoice("auto"), "Let me see. " + PARIS, True),
                             (ToolChoice("auto"), "Let me see. " + call_text("nope", "{}"), False),
                             (ToolChoice("function", "get-time"), PARIS, False)]:
        grammar = llguidance.LLMatcher.grammar_from_lark(tool_call_grammar(TOOLS, choice, tokenizer=ll))
        matcher = llguidance.LLMatcher(ll, grammar, log_level=0)
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.token_to_id("<tool_call>") in ids
        assert (matcher.validate_tokens(ids) == len(ids)) is ok, text


# ---- conversation history for the template ------------------------------------------------------

QWEN_TEMPLATE = json.loads((Path(__file__).parent / "fixtures" / "tokenizer" / "qwen2.5-coder-1.5b-instruct.json")
                           .read_text(encoding="utf-8"))["chat"]["template"]


def test_openai_history_renders_calls_as_the_model_writes_them():
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "22C"},
    ]
    normalised = messages_for_template(messages)
    assert normalised[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert normalised[2]["name"] == "get_weather" and messages[1]["tool_calls"][0]["function"]["arguments"] == \
        '{"city": "Paris"}'  # the caller's messages are left alone
    template = ChatTemplate(QWEN_TEMPLATE, bos_token=None, eos_token="<|im_end|>", origin="qwen")
    prompt = template.render(normalised, tools=[spec.to_openai() for spec in TOOLS])
    assert "<|im_start|>assistant\n" + PARIS + "<|im_end|>" in prompt
    assert "<tool_response>\n22C\n</tool_response>" in prompt
    assert json.dumps(TOOLS[0].to_openai(), ensure_ascii=False) in prompt


def test_ollama_history_and_bad_arguments():
    normalised = messages_for_template([
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get-time", "arguments": {}}}]},
        {"role": "tool", "content": "noon"}])
    assert normalised[0]["tool_calls"] == [{"type": "function", "function": {"name": "get-time", "arguments": {}}}]
    assert normalised[1]["name"] == "get-time"
    with pytest.raises(ToolError) as caught:
        messages_for_template([{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}])
    assert caught.value.param == "messages[1].tool_calls[0].function.arguments"


def test_anthropic_history_becomes_openai_messages():
    messages = anthropic_messages_to_openai([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "use the tool", "signature": "s"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "22C"}]},
            {"type": "text", "text": "Thanks"}]},
    ], system=[{"type": "text", "text": "Be brief."}])
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "use the tool", "tool_calls": [
            {"id": "toolu_1", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "22C"},
        {"role": "user", "content": "Thanks"},
    ]
    assert messages_for_template(messages)[3]["name"] == "get_weather"
    with pytest.raises(ToolError) as caught:
        anthropic_messages_to_openai([{"role": "user", "content": [{"type": "image", "source": {}}]}])
    assert caught.value.param == "messages[0].content[0].type"


def test_tool_call_dataclass_decodes_arguments():
    assert ToolCall("call_x", "f", '{"a": [1]}').arguments_object() == {"a": [1]}

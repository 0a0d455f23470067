"""Tool-call grammars (llguidance): they compile, accept valid calls and refuse others, also with the
real Qwen tokenizer; and the tool turns of a conversation as the chat template receives them."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import llguidance
import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from ember.runtime.loading.text.chat_template import ChatTemplate
from ember.server.tool_fences import parse_call_body
from ember.server.tool_grammar import tool_call_grammar
from ember.server.tool_messages import anthropic_messages_to_openai, messages_for_template
from ember.server.tool_parse import parse_tool_calls
from ember.server.tools import ToolCall, ToolChoice, ToolError, parse_openai_tools

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"],
    "additionalProperties": False,
}
RAW_TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather {for} a city", "parameters": WEATHER},
    },
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
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|im_end|>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator([PARIS, call_text("get-time", "{}"), "hello world, <think>hmm</think>"] * 10, trainer)
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


@pytest.mark.parametrize(
    "choice",
    [
        ToolChoice("auto"),
        ToolChoice("required"),
        ToolChoice("required", parallel=False),
        ToolChoice("function", "get-time"),
    ],
)
@pytest.mark.parametrize("reasoning", [{}, {"reasoning": True}, {"starts_in_reasoning": True}])
def test_grammars_compile(choice, reasoning):
    grammar = llguidance.LLMatcher.grammar_from_lark(tool_call_grammar(TOOLS, choice, **reasoning))
    assert llguidance.LLMatcher.validate_grammar(grammar) == ""


def test_no_grammar_without_tools_or_for_none():
    assert tool_call_grammar(TOOLS, ToolChoice("none")) is None
    assert tool_call_grammar((), ToolChoice("auto")) is None


TIME = call_text("get-time", "{}")


@pytest.mark.parametrize(
    ("choice", "text", "ok"),
    [
        (ToolChoice("required"), PARIS, True),
        (ToolChoice("required"), PARIS + "\n" + TIME, True),
        (ToolChoice("required"), call_text("get_weather", '{"city": "Paris", "days": 3}'), True),
        (ToolChoice("required"), "Sure. " + PARIS, False),  # no text in forced mode
        (ToolChoice("required"), call_text("get_wether", '{"city": "Paris"}'), False),
        (ToolChoice("required"), call_text("get_weather", '{"town": "Paris"}'), False),
        (ToolChoice("required"), call_text("get_weather", '{"city":"Paris"}'), False),  # not the template's spacing
        (ToolChoice("required"), call_text("get_weather", '{"city": "Paris"}').replace("\n", "", 1), False),
        (ToolChoice("required"), "hello", False),
        (ToolChoice("required", parallel=False), PARIS + "\n" + TIME, False),
        (ToolChoice("required"), PARIS.replace("\n</tool_call>", "\n" + TIME.split("\n")[1] + "\n</tool_call>"), True),
        (
            ToolChoice("required", parallel=False),
            PARIS.replace("\n</tool_call>", "\n" + TIME.split("\n")[1] + "\n</tool_call>"),
            False,
        ),
        (
            ToolChoice("function", "get-time"),
            TIME.replace("\n</tool_call>", "\n" + TIME.split("\n")[1] + "\n</tool_call>"),
            False,
        ),
        (ToolChoice("function", "get-time"), TIME, True),
        (ToolChoice("function", "get-time"), PARIS, False),
        (ToolChoice("auto"), "Just text, no call.", True),
        (ToolChoice("auto"), "Let me look. " + PARIS + "\n" + TIME, True),
        (ToolChoice("auto"), "Let me look. " + call_text("nope", "{}"), False),  # after the tag, calls are forced
    ],
)
def test_grammar_accepts_valid_calls_and_rejects_others(ll_tokenizer, choice, text, ok):
    assert accepts(ll_tokenizer, choice, text) is ok
    if ok:  # what the grammar lets through, the parser reads back as calls
        assert all(e.name for e in parse_tool_calls(text, TOOLS).calls) and (
            "<tool_call>" not in text or parse_tool_calls(text, TOOLS).calls
        )


def test_grammar_lets_reasoning_come_first(ll_tokenizer):
    required = ToolChoice("required")
    assert accepts(ll_tokenizer, required, "<think>hmm</think>\n\n" + PARIS, reasoning=True)
    assert accepts(ll_tokenizer, required, PARIS, reasoning=True)
    assert accepts(ll_tokenizer, required, "hmm</think>\n" + PARIS, starts_in_reasoning=True)
    assert not accepts(ll_tokenizer, required, PARIS, starts_in_reasoning=True)
    assert accepts(ll_tokenizer, ToolChoice("auto"), "<think>hmm</think>\n\nhello", reasoning=True)


def test_grammar_with_the_real_qwen_tokenizer(qwen_gguf):
    """Qwen's <tool_call> is one added token: the grammar must let the model write it as that token."""
    from ember.runtime.loading.formats.gguf_reader import GGUFFile
    from ember.runtime.loading.text.tokenizer import Tokenizer as EmberTokenizer

    tokenizer = EmberTokenizer.from_gguf_metadata(GGUFFile(qwen_gguf).metadata, str(qwen_gguf))
    ll = llguidance.LLTokenizer(tokenizer.backend.to_str(), eos_token=list(tokenizer.eos_token_ids))
    for choice, text, ok in [
        (ToolChoice("required"), PARIS, True),
        (ToolChoice("auto"), "Let me see. " + PARIS, True),
        (ToolChoice("auto"), "Let me see. " + call_text("nope", "{}"), False),
        (ToolChoice("function", "get-time"), PARIS, False),
    ]:
        grammar = llguidance.LLMatcher.grammar_from_lark(tool_call_grammar(TOOLS, choice, tokenizer=ll))
        matcher = llguidance.LLMatcher(ll, grammar, log_level=0)
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.token_to_id("<tool_call>") in ids
        assert (matcher.validate_tokens(ids) == len(ids)) is ok, text


def eos_allowed_at_each_prefix(tokenizer, grammar: str, ids: list[int], eos_ids: list[int]) -> list[bool]:
    """For each prefix ids[:i] (i = 0 … len(ids)), whether every EOS id may come next; asserts that the
    EOS ids agree with each other (all allowed or none)."""
    matcher = llguidance.LLMatcher(tokenizer, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
    allowed = []
    for i in range(len(ids) + 1):
        each = {eos: matcher.validate_tokens([eos]) == 1 for eos in eos_ids}
        assert len(set(each.values())) == 1, (i, each)
        allowed.append(next(iter(each.values())))
        if i < len(ids):
            assert matcher.consume_token(ids[i]), matcher.get_error()
    return allowed


def turn_may_end(text: str, choice: ToolChoice) -> bool:
    """Where a turn may end: outside calls (auto) or after a forced turn's last closed block and a few
    blanks, and in an open block after whole call objects and a few blanks (every mode)."""
    _, tag, block = text.rpartition("<tool_call>")
    if not tag:
        return choice.mode == "auto"
    body, closed, after = block.partition("</tool_call>")
    if closed:
        return choice.mode == "auto" or re.fullmatch(r"[ \t\r\n]{0,8}", after) is not None
    return (
        parse_call_body(body, {spec.name: spec for spec in TOOLS}) is not None
        and re.fullmatch(r"\n.*\}[ \t\r\n]{0,8}", body, re.S) is not None
    )


END_OF_TURN_CASES = [
    (ToolChoice("required"), PARIS + "\n"),  # the reported case: "\n" then end of turn
    (ToolChoice("required"), PARIS + "\n" + TIME + "\n\n"),
    (ToolChoice("required", parallel=False), PARIS + "\n"),
    (ToolChoice("function", "get-time"), TIME + " \n"),
    (ToolChoice("auto"), "Let me look.\n" + PARIS + "\nDone."),
    (ToolChoice("auto", parallel=False), PARIS + "\n"),
    (ToolChoice("required"), PARIS.removesuffix("\n</tool_call>") + "\n"),  # the end of turn before the close tag
    (ToolChoice("required"), PARIS.replace("\n</tool_call>", "\n" + TIME.split("\n")[1])),
]


@pytest.mark.parametrize(("choice", "text"), END_OF_TURN_CASES)
def test_end_of_turn_allowed_exactly_where_the_template_allows_it(ll_tokenizer, choice, text):
    backend, tokenizer = ll_tokenizer
    grammar = tool_call_grammar(TOOLS, choice, tokenizer=tokenizer)
    ids = backend.encode(text).ids
    allowed = eos_allowed_at_each_prefix(tokenizer, grammar, ids, [backend.token_to_id("<|im_end|>")])
    expected = [turn_may_end(backend.decode(ids[:i], skip_special_tokens=False), choice) for i in range(len(ids) + 1)]
    assert allowed == expected
    assert allowed[-1]  # the whole text, trailing whitespace included, may end the turn


def test_another_call_only_when_parallel_calls_are_allowed(ll_tokenizer):
    """After a call and a line break, a parallel grammar allows both the end of the turn and another
    `<tool_call>`; a single-call grammar allows only the end (and bounded whitespace)."""
    backend, tokenizer = ll_tokenizer
    ids = backend.encode(PARIS + "\n").ids
    for choice, more in [
        (ToolChoice("required"), True),
        (ToolChoice("required", parallel=False), False),
        (ToolChoice("auto", parallel=False), False),
    ]:
        assert accepts(ll_tokenizer, choice, PARIS + "\n" + TIME) is more
        matcher = llguidance.LLMatcher(
            tokenizer,
            llguidance.LLMatcher.grammar_from_lark(tool_call_grammar(TOOLS, choice, tokenizer=tokenizer)),
            log_level=0,
        )
        assert matcher.consume_tokens(ids)
        assert matcher.validate_tokens([backend.token_to_id("<|im_end|>")]) == 1
    forced = llguidance.LLMatcher(
        tokenizer,
        llguidance.LLMatcher.grammar_from_lark(
            tool_call_grammar(TOOLS, ToolChoice("required", parallel=False), tokenizer=tokenizer)
        ),
        log_level=0,
    )
    assert not forced.consume_tokens(backend.encode(PARIS + "\n" * 9).ids)  # whitespace is bounded


def test_real_qwen_eos_ids_end_the_turn_exactly_after_complete_calls(qwen_gguf):
    """Token level, on the default model's own vocabulary: both of its end-of-turn ids (`<|im_end|>` and
    `<|endoftext|>`) are allowed after a call and the whitespace after it, and nowhere inside a call."""
    from ember.runtime.loading.formats.gguf_reader import GGUFFile
    from ember.runtime.loading.text.prompting import end_of_generation_ids
    from ember.runtime.loading.text.tokenizer import Tokenizer as EmberTokenizer

    tokenizer = EmberTokenizer.from_gguf_metadata(GGUFFile(qwen_gguf).metadata, str(qwen_gguf))
    eos_ids = sorted(end_of_generation_ids(tokenizer, {}))
    assert {tokenizer.token_to_id("<|im_end|>"), tokenizer.token_to_id("<|endoftext|>")} <= set(eos_ids)
    ll = llguidance.LLTokenizer(tokenizer.backend.to_str(), eos_token=eos_ids)
    for choice, text in END_OF_TURN_CASES:
        ids = tokenizer.encode(text, add_special_tokens=False)
        allowed = eos_allowed_at_each_prefix(ll, tool_call_grammar(TOOLS, choice, tokenizer=ll), ids, eos_ids)
        expected = [
            turn_may_end(tokenizer.decode(ids[:i], skip_special_tokens=False), choice) for i in range(len(ids) + 1)
        ]
        assert allowed == expected, text


# ---- conversation history for the template ------------------------------------------------------

QWEN_TEMPLATE = json.loads(
    (Path(__file__).parent / "fixtures" / "tokenizer" / "qwen2.5-coder-1.5b-instruct.json").read_text(encoding="utf-8")
)["chat"]["template"]


def test_openai_history_renders_calls_as_the_model_writes_them():
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "22C"},
    ]
    normalised = messages_for_template(messages)
    assert normalised[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert (
        normalised[2]["name"] == "get_weather"
        and messages[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
    )  # the caller's messages are left alone
    template = ChatTemplate(QWEN_TEMPLATE, bos_token=None, eos_token="<|im_end|>", origin="qwen")
    prompt = template.render(normalised, tools=[spec.to_openai() for spec in TOOLS])
    assert "<|im_start|>assistant\n" + PARIS + "<|im_end|>" in prompt
    assert "<tool_response>\n22C\n</tool_response>" in prompt
    assert json.dumps(TOOLS[0].to_openai(), ensure_ascii=False) in prompt


def test_ollama_history_and_bad_arguments():
    normalised = messages_for_template(
        [
            {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get-time", "arguments": {}}}]},
            {"role": "tool", "content": "noon"},
        ]
    )
    assert normalised[0]["tool_calls"] == [{"type": "function", "function": {"name": "get-time", "arguments": {}}}]
    assert normalised[1]["name"] == "get-time"
    with pytest.raises(ToolError) as caught:
        messages_for_template(
            [
                {"role": "user", "content": "x"},
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}],
                },
            ]
        )
    assert caught.value.param == "messages[1].tool_calls[0].function.arguments"


def test_anthropic_history_becomes_openai_messages():
    messages = anthropic_messages_to_openai(
        [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "use the tool", "signature": "s"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "22C"}]},
                    {"type": "text", "text": "Thanks"},
                ],
            },
        ],
        system=[{"type": "text", "text": "Be brief."}],
    )
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "use the tool",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "22C"},
        {"role": "user", "content": "Thanks"},
    ]
    assert messages_for_template(messages)[3]["name"] == "get_weather"
    with pytest.raises(ToolError) as caught:
        anthropic_messages_to_openai([{"role": "user", "content": [{"type": "image", "source": {}}]}])
    assert caught.value.param == "messages[0].content[0].type"


def test_tool_call_dataclass_decodes_arguments():
    assert ToolCall("call_x", "f", '{"a": [1]}').arguments_object() == {"a": [1]}

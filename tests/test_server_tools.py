"""Tool calling: definitions and tool_choice from each protocol, parsing `<tool_call>` blocks
(whole and streamed, which must agree for every way of cutting the text). Grammars and history:
test_server_tool_grammar.py."""

from __future__ import annotations

import itertools
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.server.chat_output import chat_finish_reason, parse_chat_output
from ember.server.tool_parse import parse_tool_calls
from ember.server.tool_stream import (
    ContentDelta,
    StreamingToolParser,
    ToolCallArgs,
    ToolCallEnd,
    ToolCallStart,
    anthropic_input_json_delta,
    anthropic_tool_use_start,
    openai_deltas,
)
from ember.server.tools import (
    ToolChoice,
    ToolError,
    anthropic_tool_use,
    new_tool_call_id,
    ollama_tool_calls,
    openai_tool_calls,
    parse_anthropic_tool_choice,
    parse_anthropic_tools,
    parse_ollama_tools,
    parse_openai_tool_choice,
    parse_openai_tools,
)

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


# ---- definitions and tool_choice --------------------------------------------------------------


def test_openai_tools_become_specs_and_render_back():
    assert [spec.name for spec in TOOLS] == ["get_weather", "get-time"]
    assert TOOLS[0].to_openai() == RAW_TOOLS[0]
    assert TOOLS[1].to_openai()["function"]["parameters"] == {"type": "object", "properties": {}}
    assert parse_openai_tools(None) == ()
    assert parse_ollama_tools([{"function": RAW_TOOLS[0]["function"]}])[0].name == "get_weather"


@pytest.mark.parametrize(
    ("tools", "param"),
    [
        ({"type": "function"}, "tools"),
        (["x"], "tools[0]"),
        ([RAW_TOOLS[0], {"type": "retrieval"}], "tools[1].type"),
        ([{"type": "function"}], "tools[0].function"),
        ([{"type": "function", "function": {"name": "has space"}}], "tools[0].function.name"),
        ([{"type": "function", "function": {"name": "x" * 65}}], "tools[0].function.name"),
        ([{"type": "function", "function": {"name": "f", "description": 3}}], "tools[0].function.description"),
        (
            [RAW_TOOLS[0], {"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}],
            "tools[1].function.parameters",
        ),
        (
            [{"type": "function", "function": {"name": "f", "parameters": {"properties": {"a": {"minLength": -1}}}}}],
            "tools[0].function.parameters",
        ),
        ([{"type": "function", "function": {"name": "f", "parameters": "object"}}], "tools[0].function.parameters"),
        ([RAW_TOOLS[0], RAW_TOOLS[0]], "tools[1].function.name"),
    ],
)
def test_bad_openai_tools_name_the_field(tools, param):
    with pytest.raises(ToolError) as caught:
        parse_openai_tools(tools)
    assert caught.value.param == param and caught.value.status == 400


def test_openai_tool_choice():
    assert parse_openai_tool_choice(None, TOOLS) == ToolChoice("auto")
    assert parse_openai_tool_choice(None, ()) == ToolChoice("none")
    assert parse_openai_tool_choice("auto", ()) == ToolChoice("none")
    assert parse_openai_tool_choice("none", TOOLS) == ToolChoice("none")
    assert parse_openai_tool_choice("required", TOOLS, parallel_tool_calls=False) == ToolChoice(
        "required", parallel=False
    )
    named = parse_openai_tool_choice({"type": "function", "function": {"name": "get-time"}}, TOOLS)
    assert named == ToolChoice("function", "get-time", parallel=False) and named.forces_call


@pytest.mark.parametrize(
    ("choice", "kwargs", "param"),
    [
        ("sometimes", {}, "tool_choice"),
        ({"type": "function", "function": {"name": "nope"}}, {}, "tool_choice.function.name"),
        ({"type": "function", "function": {}}, {}, "tool_choice.function.name"),
        ({"type": "tool", "name": "get-time"}, {}, "tool_choice"),
        ("auto", {"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ],
)
def test_bad_openai_tool_choice_names_the_field(choice, kwargs, param):
    with pytest.raises(ToolError) as caught:
        parse_openai_tool_choice(choice, TOOLS, **kwargs)
    assert caught.value.param == param


def test_required_without_tools_is_an_error():
    with pytest.raises(ToolError):
        parse_openai_tool_choice("required", ())


def test_anthropic_tools_and_tool_choice():
    tools = parse_anthropic_tools(
        [
            {"name": "get_weather", "description": "d", "input_schema": WEATHER},
            {"type": "custom", "name": "noop", "input_schema": {"type": "object"}},
        ]
    )
    assert tools[0].to_openai()["function"] == {"name": "get_weather", "description": "d", "parameters": WEATHER}
    assert parse_anthropic_tool_choice(None, tools) == ToolChoice("auto")
    assert parse_anthropic_tool_choice({"type": "any", "disable_parallel_tool_use": True}, tools) == ToolChoice(
        "required", parallel=False
    )
    assert parse_anthropic_tool_choice({"type": "tool", "name": "noop"}, tools) == ToolChoice(
        "function", "noop", parallel=False
    )
    assert parse_anthropic_tool_choice({"type": "none"}, tools).mode == "none"


@pytest.mark.parametrize(
    ("tools", "choice", "param"),
    [
        ([{"name": "f"}], None, "tools[0].input_schema"),
        ([{"name": "f", "input_schema": {"type": 5}}], None, "tools[0].input_schema"),
        ([{"type": "web_search_20250305", "name": "web_search"}], None, "tools[0].type"),
        ([{"name": "bad name", "input_schema": {}}], None, "tools[0].name"),
        ([{"name": "f", "input_schema": {}}], {"type": "tool", "name": "g"}, "tool_choice.name"),
        ([{"name": "f", "input_schema": {}}], {"type": "sometimes"}, "tool_choice.type"),
        ([{"name": "f", "input_schema": {}}], "auto", "tool_choice"),
    ],
)
def test_bad_anthropic_tools_name_the_field(tools, choice, param):
    with pytest.raises(ToolError) as caught:
        parse_anthropic_tool_choice(choice, parse_anthropic_tools(tools))
    assert caught.value.param == param


# ---- parsing whole replies ----------------------------------------------------------------------


def calls_of(reply) -> list[tuple[str, str]]:
    return [(c.name, c.arguments) for c in reply.calls]


def test_one_call_keeps_arguments_as_written_and_gets_an_openai_id():
    reply = parse_tool_calls(call_text("get_weather", '{"city":"Paris",  "days": 2}'), TOOLS)
    assert reply.content == "" and calls_of(reply) == [("get_weather", '{"city":"Paris",  "days": 2}')]
    assert re.fullmatch(r"call_[A-Za-z0-9]{24}", reply.calls[0].id)
    assert len({new_tool_call_id() for _ in range(50)}) == 50


def test_text_before_and_parallel_calls():
    text = "Let me check.\n\n" + PARIS + "\n" + call_text("get-time", "{}") + "\n"
    reply = parse_tool_calls(text, TOOLS)
    assert reply.content == "Let me check."
    assert calls_of(reply) == [("get_weather", '{"city": "Paris"}'), ("get-time", "{}")]


TWO_IN_ONE_BLOCK = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tokyo"}}\n'
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)


def test_several_call_objects_in_one_block_are_parallel_calls():
    reply = parse_tool_calls("Sure.\n" + TWO_IN_ONE_BLOCK, TOOLS)
    assert reply.content == "Sure." and calls_of(reply) == [
        ("get_weather", '{"city": "Tokyo"}'),
        ("get_weather", '{"city": "Paris"}'),
    ]


@pytest.mark.parametrize(
    "block",
    [
        TWO_IN_ONE_BLOCK.replace('"Paris"', "1"),  # one object of the block is no valid call
        TWO_IN_ONE_BLOCK.replace('\n{"name"', ' x {"name"'),
        call_text("get_weather", '{"city": "Paris"'),  # malformed JSON
        call_text("get_wether", '{"city": "Paris"}'),  # unknown tool
        call_text("get_weather", '{"town": "Paris"}'),  # against the schema
        call_text("get_weather", '{"city": "Paris", "days": "2"}'),
        call_text("get_weather", '"Paris"'),  # arguments not an object
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": NaN}}\n</tool_call>',
        "<tool_call>\nnot json at all",  # unclosed and invalid
    ],
)
def test_rejected_blocks_stay_in_the_content_verbatim(block):
    text = "Hi. " + block + " Bye."
    reply = parse_tool_calls(text, TOOLS)
    assert reply.calls == () and reply.content == text


def test_an_unclosed_valid_block_at_the_end_is_a_call():
    reply = parse_tool_calls("ok " + PARIS.removesuffix("\n</tool_call>"), TOOLS)
    assert reply.content == "ok" and calls_of(reply) == [("get_weather", '{"city": "Paris"}')]


def test_other_key_orders_and_missing_arguments():
    reply = parse_tool_calls(
        '<tool_call>{"arguments": {"city": "Nice"}, "name": "get_weather"}</tool_call>'
        '<tool_call>{"name": "get-time"}</tool_call>',
        TOOLS,
    )
    assert calls_of(reply) == [("get_weather", '{"city": "Nice"}'), ("get-time", "{}")]


def test_protocol_renderings_of_calls():
    calls = parse_tool_calls(PARIS, TOOLS, id_factory=lambda: "call_abc").calls
    assert openai_tool_calls(calls) == [
        {"id": "call_abc", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    ]
    assert anthropic_tool_use(calls[0]) == {
        "type": "tool_use",
        "id": "toolu_abc",
        "name": "get_weather",
        "input": {"city": "Paris"},
    }
    assert ollama_tool_calls(calls) == [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]


# ---- calls in fenced code blocks -----------------------------------------------------------------

# What Qwen2.5-Coder-1.5B-Instruct (greedy) answers "What is the weather in Paris right now?" with.
FENCED_PARIS = '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris"\n  }\n}\n```'
FENCED_PARIS_ARGS = '{\n    "city": "Paris"\n  }'


def fenced(body: str, language: str = "json") -> str:
    return f"```{language}\n{body}\n```"


@pytest.mark.parametrize("tail", ["", "\n"])
def test_the_default_models_fenced_reply_is_a_call(tail):
    reply = parse_tool_calls(FENCED_PARIS + tail, TOOLS)
    assert reply.content == "" and calls_of(reply) == [("get_weather", FENCED_PARIS_ARGS)]
    output = parse_chat_output(FENCED_PARIS + tail, tools=TOOLS, reasoning=None)
    assert output.content is None and [json.loads(c["function"]["arguments"]) for c in output.tool_calls] == [
        {"city": "Paris"}
    ]


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        (fenced('{"name": "get-time", "arguments": {}}', ""), "", [("get-time", "{}")]),
        (fenced('{"name": "get-time"}', "tool_call"), "", [("get-time", "{}")]),
        (
            fenced('{"name": "get_weather", "parameters": {"city": "Rome"}}', " JSON "),
            "",
            [("get_weather", '{"city": "Rome"}')],
        ),
        (fenced('{"arguments": {"city": "Nice"}, "name": "get_weather"}'), "", [("get_weather", '{"city": "Nice"}')]),
        (
            fenced('[{"name": "get-time", "arguments": {}},\n {"name": "get_weather", "arguments": {"city":"Oslo"}}]'),
            "",
            [("get-time", "{}"), ("get_weather", '{"city": "Oslo"}')],
        ),
        ("Let me check.\n\n" + FENCED_PARIS + "\n\nDone.", "Let me check.Done.", [("get_weather", FENCED_PARIS_ARGS)]),
        ('  ```json\n  {"name": "get-time"}\n  ```', "", [("get-time", "{}")]),  # indented fences
        (FENCED_PARIS.removesuffix("\n```"), "", [("get_weather", FENCED_PARIS_ARGS)]),  # cut off: still a call
        (fenced('{"name": "get-time"}') + "\n" + PARIS, "", [("get-time", "{}"), ("get_weather", '{"city": "Paris"}')]),
        (
            "```python\nprint(1)\n```\nThen:\n" + fenced('{"name": "get-time"}'),
            "```python\nprint(1)\n```\nThen:",
            [("get-time", "{}")],
        ),
        ("```xml\n" + PARIS + "\n```", "```xml```", [("get_weather", '{"city": "Paris"}')]),  # tags in a code block
    ],
)
def test_fenced_calls(text, content, calls):
    reply = parse_tool_calls(text, TOOLS)
    assert (reply.content, calls_of(reply)) == (content, calls)


@pytest.mark.parametrize(
    "text",
    [
        fenced('{"name": "nope", "arguments": {}}'),  # unknown tool
        fenced('{"a": [1, 2]}'),  # JSON that is not a call
        fenced('{"name": "get_weather", "arguments": {"town": "Paris"}}'),  # against the schema
        fenced('{"name": "get_weather", "arguments": {"city": "Paris"}'),  # malformed
        fenced('{"name": "get-time"} and more'),
        fenced("[]"),
        fenced('[{"name": "get-time"}, {"name": "nope"}]'),
        fenced('{"name": "get-time"}', "python"),
        fenced('{"name": "get-time"}', "jsonc"),
        fenced("print('hi')", "python"),
        fenced("hello"),
        "```json",
        "```json\n",
        "```\n\n```",
        'Use ```json\n{"name": "get-time"}\n``` like this.',  # not at the start of a line
        "```\n" + fenced('{"name": "get-time"}'),  # that fence closes an ordinary block
        "```text\n" + fenced('{"name": "get-time"}', ""),
    ],
)
def test_fences_that_are_not_calls_stay_content_verbatim(text):
    for framed in (text, "Hi.\n" + text + "\nBye."):
        reply = parse_tool_calls(framed, TOOLS)
        assert reply.calls == () and reply.content == framed


def feed_by_char(text: str, **kwargs) -> list[list]:
    parser = StreamingToolParser(TOOLS, id_factory=counter_ids(), **kwargs)
    return [parser.feed(ch) for ch in text] + [parser.finish()]


def content_by_step(steps: list[list]) -> list[str]:
    """The content emitted so far, after each fed character."""
    out, so_far = [], ""
    for events in steps:
        so_far += "".join(e.text for e in events if isinstance(e, ContentDelta))
        out.append(so_far)
    return out


@pytest.mark.parametrize("incremental", [False, True])
def test_a_fenced_call_streams_without_leaking_the_fence(incremental):
    text = "Sure:\n" + FENCED_PARIS + "\n"
    steps = feed_by_char(text, incremental=incremental)
    assert set(content_by_step(steps)[4:]) == {"Sure:"}
    assert summary([e for step in steps for e in step]) == ("Sure:", [("get_weather", FENCED_PARIS_ARGS)])
    start = next(i for i, step in enumerate(steps) if any(isinstance(e, ToolCallStart) for e in step))
    # fences are always buffered (no grammar covers them): announced when the fence closes
    assert text[start] == "`" and start == len(text) - 2


@pytest.mark.parametrize(
    ("text", "released"),
    [
        ("```python\nprint(1)\n```\n", "```p"),  # another language: known at its first letter
        ("```\nplain words\n```\n", "```\np"),  # the body does not start a JSON value
        ('```json\n{"a": 1}\nmore\n```\n', '```json\n{"a": 1}'),  # the JSON value ended and is no call
        ('```json\n{"name": "get-time"} x\n```\n', '```json\n{"name": "get-time"} x'),  # a call, then more
    ],
)
def test_code_blocks_are_released_as_soon_as_they_cannot_be_calls(text, released):
    steps = feed_by_char(text)
    so_far = content_by_step(steps)
    assert so_far[len(released) - 2] == "" and so_far[len(released) - 1] != ""
    assert released.startswith(so_far[len(released) - 1])
    assert so_far[-1] == text and not any(isinstance(e, ToolCallStart) for step in steps for e in step)


def test_code_after_a_release_streams_at_once():  # only blanks (a call may follow) and fences are held
    text = "```python\nprint(1)\nx = 2\n```\nok"
    so_far = content_by_step(feed_by_char(text))
    assert all(so_far[i] == text[: i + 1] for i in range(len("```python"), len(text)) if text[i] not in " \n`")


# ---- streaming -------------------------------------------------------------------------------------

VALID_BLOCKS = [
    PARIS,
    call_text("get-time", "{}"),
    call_text("get_weather", '{"city":"Oslo","days":3}'),
    call_text("get_weather", '{"city": "a}\\"</tool_"}'),
    TWO_IN_ONE_BLOCK,
    '<tool_call>{"arguments": {"city": "Rome"}, "name": "get_weather"}</tool_call>',
    FENCED_PARIS,
    fenced('{"name": "get-time", "arguments": {}}', ""),
    fenced('{"name": "get_weather", "parameters": {"city": "a\\n```"}}', "tool_call"),
    fenced('[{"name": "get-time"}, {"name": "get_weather", "arguments": {"city": "Oslo"}}]'),
    '  ```JSON \n  {"arguments": {"city": "Nice"}, "name": "get_weather"}\n  ```',
]
INVALID_BLOCKS = [
    call_text("nope", "{}"),
    call_text("get_weather", '{"city": 1}'),
    '<tool_call>\n{"name": ',
    call_text("get_weather", '{"city": "x"'),
    "</tool_call>",
    "<tool_",
    "<tool_call",
    fenced('{"name": "nope", "arguments": {}}'),
    fenced('{"a": [1, "```"]}'),
    fenced("[]"),
    fenced('{"name": "get-time"} x'),
    fenced("print('```')", "python"),
    fenced("a\n  b", ""),
    fenced('{"name": "get_weather", "arguments": {"city": 1}}'),
    FENCED_PARIS.removesuffix("```"),
    "```",
    "``",
    "```js",
    "```json\n",
    "```\n{",
    '```json\n{"name": "get-time"',
]
TEXT = st.text(alphabet='ab {}[]"<>/_\n`', max_size=10)
SPACE = st.sampled_from(["", " ", "\n", "\n\n"])
PIECES = st.lists(st.one_of(TEXT, SPACE, st.sampled_from(VALID_BLOCKS), st.sampled_from(INVALID_BLOCKS)), max_size=6)


def stream(text: str, cuts: list[int], *, cut: bool = False, **kwargs) -> list:
    parser = StreamingToolParser(TOOLS, id_factory=counter_ids(), **kwargs)
    bounds = [0, *sorted(c % (len(text) + 1) for c in cuts), len(text)]
    events = []
    for a, b in itertools.pairwise(bounds):
        events += parser.feed(text[a:b])
    events += parser.finish(cut=cut)
    assert parser.has_tool_calls() == any(isinstance(e, ToolCallEnd) for e in events)
    assert [(c.name, c.arguments) for c in parser.calls] == [
        (e.call.name, e.call.arguments) for e in events if isinstance(e, ToolCallEnd)
    ]
    return events


def summary(events: list) -> tuple[str, list[tuple[str, str]]]:
    """Content and calls of a stream, checking the event contract on the way."""
    content, calls, open_index = "", [], None
    for event in events:
        if isinstance(event, ContentDelta):
            assert event.text and open_index is None
            content += event.text
        elif isinstance(event, ToolCallStart):
            assert open_index is None and event.index == len(calls)
            open_index = event.index
            calls.append([event.name, ""])
        elif isinstance(event, ToolCallArgs):
            assert event.index == open_index and event.fragment
            calls[-1][1] += event.fragment
        else:
            assert event.index == open_index and (event.call.name, event.call.arguments) == tuple(calls[-1])
            open_index = None
    assert open_index is None
    return content, [tuple(c) for c in calls]


@settings(max_examples=300, deadline=None)
@given(PIECES, st.lists(st.integers(0, 10_000), max_size=12))
def test_buffered_stream_equals_whole_parse_for_every_split(pieces, cuts):
    text = "".join(pieces)
    reply = parse_tool_calls(text, TOOLS)
    assert summary(stream(text, cuts)) == (reply.content, calls_of(reply))


@settings(max_examples=200, deadline=None)
@given(PIECES, st.lists(st.integers(0, 10_000), max_size=12))
def test_output_cut_by_max_tokens_streams_as_it_parses_whole(pieces, cuts):
    text = "".join(pieces)
    reply = parse_tool_calls(text, TOOLS, cut=True)
    assert summary(stream(text, cuts, cut=True)) == (reply.content, calls_of(reply))


@pytest.mark.parametrize("incremental", [False, True])
def test_a_call_cut_mid_arguments_is_neither_a_call_nor_content(incremental):
    text = "Checking.\n" + PARIS + "\n" + call_text("get_weather", '{"city": "To')[: -len("}\n</tool_call>")]
    whole = parse_tool_calls(text, TOOLS, cut=True)
    assert whole.content == "Checking." and calls_of(whole) == [("get_weather", '{"city": "Paris"}')]
    parsed = parse_chat_output(text, tools=TOOLS, reasoning=None, finish_reason="length")
    assert parsed.content == "Checking." and len(parsed.tool_calls) == 1
    content, calls = summary(stream(text, [7, 30, 70], cut=True, incremental=incremental))
    assert content == "Checking." and "<tool_call>" not in content
    # announced before the cut, an incremental call cannot be taken back: its arguments end where the model stopped
    assert calls[0] == ("get_weather", '{"city": "Paris"}') and len(calls) == (2 if incremental else 1)
    # without the cut (the model ended the turn there), the unfinished block stays visible as content
    assert "<tool_call>" in parse_tool_calls(text, TOOLS).content


@pytest.mark.parametrize(
    ("engine", "calls", "expected"),
    [
        ("stop", True, "tool_calls"),
        ("stop", False, "stop"),
        ("length", True, "length"),
        ("length", False, "length"),
        ("abort", False, "abort"),
    ],
)
def test_finish_reason_tool_calls_only_when_the_turn_ended_after_calls(engine, calls, expected):
    assert chat_finish_reason(engine, calls) == expected


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(st.text(alphabet='ab {}[]"/_\n`', max_size=10), SPACE, st.sampled_from(VALID_BLOCKS)), max_size=6
    ),
    st.lists(st.integers(0, 10_000), max_size=12),
)
def test_incremental_stream_equals_whole_parse_for_valid_calls(pieces, cuts):
    text = "".join(pieces)
    reply = parse_tool_calls(text, TOOLS)
    assert summary(stream(text, cuts, incremental=True)) == (reply.content, calls_of(reply))


@settings(max_examples=200, deadline=None)
@given(PIECES, st.lists(st.integers(0, 10_000), max_size=12))
def test_incremental_stream_does_not_depend_on_the_split(pieces, cuts):
    text = "".join(pieces)
    assert summary(stream(text, cuts, incremental=True)) == summary(stream(text, [], incremental=True))


def test_no_part_of_a_tag_reaches_the_content_and_arguments_stream_as_they_come():
    text = "Sure \n" + PARIS + "\n" + call_text("get-time", "{}")
    parser = StreamingToolParser(TOOLS, incremental=True)
    per_char = [parser.feed(ch) for ch in text] + [parser.finish()]
    contents = [e.text for events in per_char for e in events if isinstance(e, ContentDelta)]
    assert "".join(contents) == "Sure" and not any("<" in c or c.isspace() for c in contents)
    arg_events = [e for events in per_char for e in events if isinstance(e, ToolCallArgs) and e.index == 0]
    assert len(arg_events) == len('{"city": "Paris"}')  # one character at a time: nothing waited for the end


def test_buffered_stream_emits_a_call_when_its_block_closes():
    parser = StreamingToolParser(TOOLS)
    assert parser.feed(PARIS[:-3]) == []
    events = parser.feed(PARIS[-3:])
    assert [type(e) for e in events] == [ToolCallStart, ToolCallArgs, ToolCallEnd] and parser.has_tool_calls()


def accumulate_openai(deltas: list[dict]) -> list[dict]:
    """What the OpenAI SDK does with streamed tool_calls deltas."""
    calls: dict[int, dict] = {}
    for delta in deltas:
        for entry in delta.get("tool_calls", []):
            if entry["index"] not in calls:
                assert set(entry) == {"index", "id", "type", "function"} and set(entry["function"]) == {
                    "name",
                    "arguments",
                }
                calls[entry["index"]] = {
                    "id": entry["id"],
                    "type": "function",
                    "function": {"name": entry["function"]["name"], "arguments": ""},
                }
            else:
                assert set(entry) == {"index", "function"} and set(entry["function"]) == {"arguments"}
            calls[entry["index"]]["function"]["arguments"] += entry["function"]["arguments"]
    return [calls[i] for i in sorted(calls)]


@pytest.mark.parametrize("incremental", [False, True])
@pytest.mark.parametrize(
    "calls",
    [
        PARIS + "\n" + call_text("get_weather", '{"city": "Oslo", "days": 2}'),
        "\n"
        + FENCED_PARIS
        + "\n"
        + fenced('[{"name": "get-time"},\n {"name": "get_weather", "arguments": {"days": 2, "city": "Oslo"}}]'),
    ],
)
def test_openai_deltas_follow_the_streaming_contract(incremental, calls):
    text = "Checking. " + calls
    ids = counter_ids()
    parser = StreamingToolParser(TOOLS, incremental=incremental, id_factory=ids)
    deltas = []
    for i in range(0, len(text), 7):
        deltas += openai_deltas(parser.feed(text[i : i + 7]))
    deltas += openai_deltas(parser.finish())
    assert "".join(d.get("content", "") for d in deltas) == "Checking."
    assert accumulate_openai(deltas) == openai_tool_calls(parse_tool_calls(text, TOOLS, id_factory=counter_ids()).calls)


def test_anthropic_stream_pieces():
    start = ToolCallStart(0, "call_xyz", "get_weather")
    assert anthropic_tool_use_start(start) == {
        "type": "tool_use",
        "id": "toolu_xyz",
        "name": "get_weather",
        "input": {},
    }
    assert anthropic_input_json_delta(ToolCallArgs(0, '{"ci')) == {"type": "input_json_delta", "partial_json": '{"ci'}

"""Tool calls in the XML form (Qwen3-Coder / Qwen3.5): which templates use it, parameter values as JSON
by the tool's schema, whole replies, and streams that equal the whole parse however they are split."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.runtime.loading.text.chat_template import ChatTemplate
from ember.server.chat_output import ChatOutputParser, parse_chat_output
from ember.server.reasoning import ReasoningParser
from ember.server.tool_events import ContentDelta, ToolCallArgs, ToolCallEnd, ToolCallStart, openai_deltas
from ember.server.tool_format import JSON_TOOL_CALLS, XML_TOOL_CALLS, tool_call_format_for_template
from ember.server.tool_xml import parameter_value, parse_xml_tool_calls
from ember.server.tool_xml_stream import StreamingXmlToolParser
from ember.server.tools import parse_openai_tools

TEMPLATES = Path(__file__).parent / "fixtures" / "templates"
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "scale": {"type": "number"},
        "metric": {"type": "boolean"},
        "where": {"type": "object", "properties": {"lat": {"type": "number"}, "tags": {"type": "array"}}},
        "note": {"type": ["string", "null"]},
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


def xml_call(name: str, **parameters: str) -> str:
    """A call as the template renders it (values given as the model writes their text)."""
    params = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in parameters.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


PARIS = xml_call("get_weather", city="Paris")
RICH = xml_call(
    "get_weather",
    city="New York\n<b>downtown</b> & 5 < 6",
    days="3",
    scale="-2.5e1",
    metric="True",
    where='{"lat": 40.7, "tags": ["a", {"b": null}]}',
)
TIME = xml_call("get-time")


def counter_ids():
    numbers = itertools.count()
    return lambda: f"call_{next(numbers):024d}"


def calls_of(reply) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in reply.calls]


# ---- which form a template uses -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "form"),
    [
        ("Qwen3-Coder.jinja", XML_TOOL_CALLS),
        ("Qwen3.5-4B.jinja", XML_TOOL_CALLS),
        ("Qwen-Qwen3-0.6B.jinja", JSON_TOOL_CALLS),
    ],
)
def test_the_template_decides_the_form(template, form):
    assert tool_call_format_for_template((TEMPLATES / template).read_text()) is form
    assert tool_call_format_for_template(None) is JSON_TOOL_CALLS
    # another outer tag (Seed-OSS) is not this XML form
    assert tool_call_format_for_template("<seed:tool_call>\n<function=f>\n<parameter=p>") is JSON_TOOL_CALLS


# ---- values -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "schema", "value"),
    [
        ("3", {"type": "string"}, "3"),  # a string stays a string, whatever it looks like
        ("null", {"type": "string"}, "null"),
        ("null", {"type": ["string", "null"]}, None),
        ("3", {"type": "integer"}, 3),
        ("-2.5e1", {"type": "number"}, -25.0),
        ("4", {"type": "number"}, 4),
        ("True", {"type": "boolean"}, True),  # the template's `| string` of a Python bool
        ("false", {"type": "boolean"}, False),
        ('{"a": [1, {"b": null}]}', {"type": "object"}, {"a": [1, {"b": None}]}),
        ("[1, 2]", {"type": "array"}, [1, 2]),
        ("three", {"type": "integer"}, "three"),  # not a number: left as text, the schema refuses it
        ("2.5", {"type": "integer"}, "2.5"),
        ("NaN", {"type": "number"}, "NaN"),
        ("[1]", {}, [1]),  # no type: JSON where the text is JSON, else text
        ("hello", None, "hello"),
    ],
)
def test_parameter_values_follow_the_schema(text, schema, value):
    assert parameter_value(text, schema) == value


# ---- whole replies -------------------------------------------------------------------------------------


def test_values_become_json_arguments_by_their_types():
    reply = parse_xml_tool_calls("Let me look.\n\n" + RICH, TOOLS)
    assert reply.content == "Let me look."
    assert calls_of(reply) == [
        (
            "get_weather",
            {
                "city": "New York\n<b>downtown</b> & 5 < 6",
                "days": 3,
                "scale": -25.0,
                "metric": True,
                "where": {"lat": 40.7, "tags": ["a", {"b": None}]},
            },
        )
    ]
    assert reply.calls[0].id.startswith("call_") and len(reply.calls[0].id) == 29


def test_only_the_layout_line_breaks_around_a_value_are_trimmed():
    text = "<tool_call>\n<function=get_weather>\n<parameter=city>\n\nA\n\n</parameter>\n</function>\n</tool_call>"
    assert calls_of(parse_xml_tool_calls(text, TOOLS)) == [("get_weather", {"city": "\nA\n"})]
    compact = "<tool_call><function=get_weather><parameter=city>Paris</parameter></function></tool_call>"
    assert calls_of(parse_xml_tool_calls(compact, TOOLS)) == [("get_weather", {"city": "Paris"})]


def test_parallel_calls_and_a_tool_without_parameters():
    reply = parse_xml_tool_calls(PARIS + "\n" + TIME + "\n", TOOLS, id_factory=counter_ids())
    assert calls_of(reply) == [("get_weather", {"city": "Paris"}), ("get-time", {})]
    assert [c.id for c in reply.calls] == ["call_" + "0" * 24, "call_" + "0" * 23 + "1"]
    assert reply.content == ""


@pytest.mark.parametrize(
    "block",
    [
        xml_call("nope", city="Paris"),  # unknown tool
        xml_call("get_weather", town="Paris"),  # not a property (additionalProperties false)
        xml_call("get_weather", days="3"),  # the required city is missing
        xml_call("get_weather", city="Paris", days="soon"),  # not an integer
        PARIS.replace("</parameter>\n</function>", "</parameter>\n<parameter=city>\nRome\n</parameter>\n</function>"),
        PARIS.replace("</function>\n", ""),  # no </function>
        PARIS.replace("</parameter>", ""),  # an unclosed value
        PARIS.replace("</function>", "</function>\nmore"),  # text after the function in the block
        "<tool_call>\n{}\n</tool_call>",
    ],
)
def test_blocks_that_are_not_calls_stay_in_the_content_verbatim(block):
    reply = parse_xml_tool_calls("Hi " + block + " bye", TOOLS)
    assert reply.calls == () and reply.content == "Hi " + block + " bye"


def test_cut_output_drops_a_half_written_call_and_keeps_whole_ones():
    half = PARIS[: PARIS.index("Paris") + 3]
    assert parse_xml_tool_calls("Text " + half, TOOLS, cut=True).content == "Text"
    assert parse_xml_tool_calls("Text " + half, TOOLS).content == "Text " + half
    unclosed = PARIS.removesuffix("\n</tool_call>")  # a whole function without the closing tag
    assert calls_of(parse_xml_tool_calls(unclosed, TOOLS, cut=True)) == [("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize("template", ["Qwen3-Coder.jinja", "Qwen3.5-4B.jinja"])
def test_calls_the_template_renders_parse_back_to_their_arguments(template):
    """What the real template shows the model as a past call is what the parser reads back."""
    arguments = {"city": "Paris <north>\nside", "days": 3, "metric": False, "where": {"lat": 1.5, "tags": ["x"]}}
    messages = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": arguments}}],
        },
        {"role": "tool", "content": "sunny"},
    ]
    chat = ChatTemplate((TEMPLATES / template).read_text(), bos_token=None, eos_token="<|im_end|>", origin=template)
    prompt = chat.render(messages, tools=[spec.to_openai() for spec in TOOLS])
    turn = re.search(r"<\|im_start\|>assistant\n(.*?)<\|im_end\|>", prompt, re.S).group(1)
    reply = parse_chat_output(
        turn, tools=TOOLS, reasoning=ReasoningParser(), tool_format=tool_call_format_for_template(chat.source)
    )
    assert reply.content is None and [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in reply.tool_calls
    ] == [("get_weather", arguments)]


# ---- streams ----------------------------------------------------------------------------------------------


def stream(text: str, cuts: list[int], *, cut: bool = False, **kwargs) -> list:
    parser = StreamingXmlToolParser(TOOLS, id_factory=counter_ids(), **kwargs)
    bounds = [0, *sorted(set(cuts)), len(text)]
    events = []
    for a, b in itertools.pairwise(bounds):
        events += parser.feed(text[a:b])
    return events + parser.finish(cut=cut)


def summary(events: list) -> tuple[str, list[tuple[str, str]]]:
    """(content, [(name, arguments)]), checking that each call's fragments add up to its arguments."""
    content, fragments, calls = "", {}, []
    for event in events:
        if isinstance(event, ContentDelta):
            content += event.text
        elif isinstance(event, ToolCallStart):
            fragments[event.index] = ""
        elif isinstance(event, ToolCallArgs):
            fragments[event.index] += event.fragment
        elif isinstance(event, ToolCallEnd):
            assert fragments[event.index] == event.call.arguments
            calls.append((event.call.name, event.call.arguments))
    return content, calls


PIECES = ["Sure. ", RICH, "\n", PARIS, "\n\n", TIME, " after ", xml_call("nope"), "  ", "x <tool_ca", "ll>"]
SPLITS = st.lists(st.integers(min_value=0, max_value=2000), max_size=25)


def whole(text: str, *, cut: bool = False) -> tuple[str, list[tuple[str, str]]]:
    reply = parse_xml_tool_calls(text, TOOLS, cut=cut)
    return reply.content, [(c.name, c.arguments) for c in reply.calls]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=6), SPLITS, st.booleans())
def test_buffered_stream_equals_whole_parse_for_every_split(pieces, cuts, cut):
    text = "".join(pieces)
    assert summary(stream(text, [c % (len(text) + 1) for c in cuts], cut=cut)) == whole(text, cut=cut)


VALID = ["Sure. ", RICH, "\n", PARIS, "\n\n", TIME, " then text "]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(VALID), max_size=6), SPLITS)
def test_incremental_stream_equals_whole_parse_for_valid_calls(pieces, cuts):
    text = "".join(pieces)
    assert summary(stream(text, [c % (len(text) + 1) for c in cuts], incremental=True)) == whole(text)


def test_arguments_stream_as_written_and_no_tag_reaches_the_content():
    parser = StreamingXmlToolParser(TOOLS, incremental=True, id_factory=counter_ids())
    head = "Hm. " + RICH[: RICH.index("downtown")]
    events = [e for ch in head for e in parser.feed(ch)]
    assert [e.text for e in events if isinstance(e, ContentDelta)] and "".join(
        e.text for e in events if isinstance(e, ContentDelta)
    ) == "Hm."
    start = next(e for e in events if isinstance(e, ToolCallStart))
    assert start.name == "get_weather"
    assert "".join(e.fragment for e in events if isinstance(e, ToolCallArgs)) == '{"city": "New York\\n<b>'
    rest = [e for ch in RICH[len(head) - 4 :] for e in parser.feed(ch)] + parser.finish()
    assert not any(isinstance(e, ContentDelta) for e in rest)
    deltas = openai_deltas(events + rest)
    first = deltas[1]["tool_calls"][0]
    assert first["id"] == start.id and first["type"] == "function" and first["function"]["name"] == "get_weather"
    arguments = "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas if "tool_calls" in d)
    assert json.loads(arguments)["where"] == {"lat": 40.7, "tags": ["a", {"b": None}]}
    assert all("id" not in d["tool_calls"][0] for d in deltas[2:])


def test_buffered_stream_holds_a_call_until_its_block_closes():
    parser = StreamingXmlToolParser(TOOLS)
    events = parser.feed(PARIS[:-3])
    assert events == [] and not parser.has_tool_calls()
    events = parser.feed(PARIS[-3:])
    assert [type(e) for e in events] == [ToolCallStart, ToolCallArgs, ToolCallEnd]


def test_chat_output_splits_reasoning_before_xml_calls():
    """Qwen3.5's prompt opens <think>: the output starts inside it, with no opening tag."""
    reasoning = ReasoningParser().for_prompt("<|im_start|>assistant\n<think>\n")
    text = "The user wants weather.\n</think>\n\n" + PARIS
    whole_reply = parse_chat_output(text, tools=TOOLS, reasoning=reasoning, tool_format=XML_TOOL_CALLS)
    assert whole_reply.reasoning == "The user wants weather." and whole_reply.content is None
    assert json.loads(whole_reply.tool_calls[0]["function"]["arguments"]) == {"city": "Paris"}
    parser = ChatOutputParser(tools=TOOLS, reasoning=reasoning, incremental=True, tool_format=XML_TOOL_CALLS)
    deltas = [d for ch in text for d in parser.feed(ch)] + parser.finish("stop")
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "The user wants weather."
    assert not any(d.get("content") for d in deltas) and parser.has_tool_calls


@pytest.mark.parametrize("incremental", [False, True])
def test_a_call_cut_mid_value_is_neither_a_call_nor_content(incremental):
    text = "Checking.\n" + PARIS + "\n" + RICH[: RICH.index("downtown")]
    whole_reply = parse_xml_tool_calls(text, TOOLS, cut=True)
    assert whole_reply.content == "Checking." and calls_of(whole_reply) == [("get_weather", {"city": "Paris"})]
    parsed = parse_chat_output(text, tools=TOOLS, reasoning=None, finish_reason="length", tool_format=XML_TOOL_CALLS)
    assert parsed.content == "Checking." and len(parsed.tool_calls) == 1
    content, calls = summary(stream(text, [7, 30, 70], cut=True, incremental=incremental))
    assert content == "Checking." and "<tool_call>" not in content
    # announced before the cut, an incremental call cannot be taken back: its arguments end where the model stopped
    assert calls[0] == ("get_weather", '{"city": "Paris"}') and len(calls) == (2 if incremental else 1)
    if incremental:
        assert calls[1] == ("get_weather", '{"city": "New York\\n<b>')
    assert "<tool_call>" in parse_xml_tool_calls(text, TOOLS).content  # not cut: the model ended its turn there

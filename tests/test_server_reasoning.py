"""Reasoning split: `<think>...</think>` apart from the answer, the same whole and streamed."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.server.reasoning import ReasoningParser, ReasoningSplit, prompt_opens_reasoning

PARSER = ReasoningParser()
INSIDE = ReasoningParser(starts_in_reasoning=True)


class Vocabulary:
    def __init__(self, *tokens: str):
        self.tokens = tokens

    def token_to_id(self, token: str) -> int | None:
        return self.tokens.index(token) if token in self.tokens else None


def test_only_models_with_think_tokens_get_a_parser():
    assert ReasoningParser.for_tokenizer(Vocabulary("<think>", "</think>")) == ReasoningParser()
    assert ReasoningParser.for_tokenizer(Vocabulary("<think>")) is None
    assert ReasoningParser.for_tokenizer(Vocabulary("<tool_call>")) is None


@pytest.mark.parametrize(
    ("parser", "text", "reasoning", "content"),
    [
        (PARSER, "<think>\nLet me see.\n</think>\n\nParis.", "Let me see.", "Paris."),
        (PARSER, "  <think>a</think>b", "a", "b"),
        (PARSER, "Paris.", "", "Paris."),
        (PARSER, " Paris <think>x</think>", "", " Paris <think>x</think>"),  # only a leading block is reasoning
        (PARSER, "<think>cut off by max_tokens\n", "cut off by max_tokens", ""),
        (PARSER, "<think>\n\n</think>\n\nHi", "", "Hi"),
        (PARSER, "<think>a</think>b</think>c", "a", "b</think>c"),
        (INSIDE, "Let me see.\n</think>\n\nParis.", "Let me see.", "Paris."),
        (INSIDE, "no end tag", "no end tag", ""),
        (INSIDE, "</think>Paris", "", "Paris"),
    ],
)
def test_split(parser, text, reasoning, content):
    assert parser.split(text) == ReasoningSplit(reasoning, content)


def test_prompt_decides_whether_output_starts_inside_reasoning():
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n")
    assert PARSER.for_prompt("...assistant\n<think>\n").starts_in_reasoning
    assert not INSIDE.for_prompt("...assistant\n").starts_in_reasoning


def stream(parser: ReasoningParser, text: str, cuts: list[int]) -> list[ReasoningSplit]:
    splitter = parser.stream()
    bounds = [0, *sorted(c % (len(text) + 1) for c in cuts), len(text)]
    return [splitter.feed(text[a:b]) for a, b in itertools.pairwise(bounds)] + [splitter.finish()]


PIECES = st.lists(
    st.one_of(
        st.text(alphabet="ab <>/\n", max_size=6),
        st.sampled_from(["<think>", "</think>", "<thi", "</thin", "\n\n", " "]),
    ),
    max_size=8,
)


@settings(max_examples=400, deadline=None)
@given(PIECES, st.lists(st.integers(0, 10_000), max_size=10), st.booleans())
def test_stream_equals_split_for_every_cut(pieces, cuts, inside):
    parser = ReasoningParser(starts_in_reasoning=inside)
    text = "".join(pieces)
    total = ReasoningSplit("", "")
    for part in stream(parser, text, cuts):
        total += part
    assert total == parser.split(text)


def test_no_part_of_a_tag_is_emitted_and_text_flows_before_the_end():
    splitter = PARSER.stream()
    parts = [splitter.feed(ch) for ch in "<think>\nab </think>\n\ncd"] + [splitter.finish()]
    reasoning = [p.reasoning for p in parts if p.reasoning]
    content = [p.content for p in parts if p.content]
    assert reasoning == ["a", "b"] and content == ["c", "d"]
    assert not splitter.in_reasoning


def test_stream_reports_whether_it_is_inside_reasoning():
    splitter = INSIDE.stream()
    assert splitter.in_reasoning
    assert splitter.feed("thinking </thi") == ReasoningSplit("thinking", "")
    assert splitter.feed("nk> answer") == ReasoningSplit("", "answer")
    assert not splitter.in_reasoning


def test_a_prompt_that_closed_an_empty_block_expects_no_reasoning():
    from ember.server.reasoning import prompt_closes_reasoning

    assert prompt_closes_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_closes_reasoning("<|im_start|>assistant\n<think>\n")
    assert not prompt_closes_reasoning("<|im_start|>assistant\n")


@pytest.mark.parametrize(
    ("effort", "thinking"),
    [(None, None), ("none", False), ("minimal", False), ("low", True), ("medium", True), ("high", True)],
)
def test_reasoning_effort_switches_the_templates_thinking(effort, thinking):
    from ember.server.chat_request import thinking_for_effort

    assert thinking_for_effort({} if effort is None else {"reasoning_effort": effort}) is thinking


def test_an_unknown_reasoning_effort_is_a_400_naming_the_field():
    from ember.server.chat_request import thinking_for_effort
    from ember.server.errors import ApiError

    with pytest.raises(ApiError) as error:
        thinking_for_effort({"reasoning_effort": "extreme"})
    assert error.value.status == 400 and error.value.param == "reasoning_effort"

"""The text of tool calls: the JSON of one call (inside `<tool_call>` tags or a fenced code block)
and the Markdown code fences some models put their calls in instead of the template's tags:

    ```json
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    ```

The rules these helpers implement are written down in `tool_stream.py`, which uses them for both the
whole-reply and the streaming parser.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from ember.server.tools import ToolSpec

FENCE = "```"
# Info strings (the text after the opening backticks, case and surrounding blanks ignored) of the
# fences that may hold a call: none, ```json, ```tool_call.
FENCE_LANGUAGES = ("", "json", "tool_call")
_BLANKS = " \t"  # what may stand before a fence on its line
# Between two call objects of one `<tool_call>` block: the first one's closing brace, up to the second's opening one.
NEXT_CALL_OBJECT = re.compile(r"\s*\}\s*(?=\{)")
# The start of a call in the template's order, up to the first character of the arguments value.
CANONICAL_PREFIX = re.compile(r'\s*\{\s*"name"\s*:\s*"([a-zA-Z0-9_-]{1,64})"\s*,\s*"(arguments|parameters)"\s*:\s*')
_DECODER = json.JSONDecoder()

Call = tuple[str, str]  # (name, arguments JSON text)


# ---- one call's JSON -----------------------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _loads(text: str) -> Any:
    return json.loads(text, parse_constant=_reject_constant)  # NaN and Infinity are not JSON


def _call_of(value: Any, tools: Mapping[str, ToolSpec], body: str | None = None) -> Call | None:
    """The call `value` (a decoded JSON object) names, or None. With `body`, the text `value` was
    decoded from, the arguments keep the model's spelling when the body starts in the template's order."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    spec = tools.get(value["name"])
    key = "arguments" if "arguments" in value or "parameters" not in value else "parameters"
    arguments = value.get(key, {})  # a call of a function without parameters may leave it out
    if spec is None or spec.argument_errors(arguments) is not None:
        return None
    match = CANONICAL_PREFIX.match(body) if body is not None else None
    if match and match.group(1) == spec.name and match.group(2) == key:
        _, end = _DECODER.raw_decode(body, match.end())
        return spec.name, body[match.end() : end]
    return spec.name, json.dumps(arguments, ensure_ascii=False)


def parse_call_body(body: str, tools: Mapping[str, ToolSpec]) -> list[Call] | None:
    """The calls of a `<tool_call>` block's body (between the tags): one call object, or several one
    after another separated by whitespace (how Qwen2.5-Coder writes parallel calls in one block), every
    one valid. None when the body is anything else."""
    calls, pos = [], 0
    while True:
        start = pos + len(body[pos:]) - len(body[pos:].lstrip())
        if start == len(body) and calls:
            return calls
        try:
            value, end = _DECODER.raw_decode(body, start)
            _loads(body[start:end])  # refuses NaN / Infinity, as every call's JSON must be plain JSON
        except ValueError:
            return None
        call = _call_of(value, tools, body[start:end])
        if call is None:
            return None
        calls.append(call)
        pos = end


def parse_fence_body(body: str, tools: Mapping[str, ToolSpec]) -> list[Call] | None:
    """The calls of a fenced block's body: one call object, or a non-empty array of them (parallel
    calls), every one valid. None when the body is anything else."""
    try:
        value = _loads(body)
    except ValueError:
        return None
    if not isinstance(value, list):
        call = _call_of(value, tools, body)
        return None if call is None else [call]
    calls = [_call_of(item, tools) for item in value]
    return calls if calls and all(c is not None for c in calls) else None


class JsonEndScanner:
    """Finds where a JSON object or array ends in text that arrives in pieces (strings and escapes
    aware; brackets are only counted, so a mismatched bracket ends it early: such text is no JSON)."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.end: int | None = None  # index just past the closing bracket, once seen

    def scan(self, text: str, start: int, stop: int) -> None:
        for i in range(start, stop):
            ch = text[i]
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.end = i + 1
                    return


# ---- fences ----------------------------------------------------------------------------------------
# `line_blank` says whether the text before `start` (or before the text) ends in a line that holds
# only spaces and tabs so far (true at the very start of the reply).


def _at_line_start(text: str, i: int, start: int, line_blank: bool) -> bool:
    j = i
    while j > start and text[j - 1] in _BLANKS:
        j -= 1
    return text[j - 1] == "\n" if j > start else line_blank


def find_fence(text: str, start: int, line_blank: bool) -> int:
    """Index of the first ``` at or after `start` that begins a line (blanks before it allowed), or -1."""
    i = text.find(FENCE, start)
    while i >= 0 and not _at_line_start(text, i, start, line_blank):
        i = text.find(FENCE, i + 1)
    return i


def partial_fence_length(text: str, line_blank: bool) -> int:
    """How many backticks at the end of `text` may be the start of a fence (0, 1 or 2)."""
    k = len(text) - len(text.rstrip("`"))
    return k if 0 < k < len(FENCE) and _at_line_start(text, len(text) - k, 0, line_blank) else 0


def line_blank_after(line_blank: bool, text: str) -> bool:
    """The line state after `text` follows a position whose state is `line_blank`."""
    newline = text.rfind("\n")
    if newline >= 0:
        line_blank, text = True, text[newline + 1 :]
    return line_blank and not text.strip(_BLANKS)


def line_blank_at(text: str, pos: int) -> bool:
    """The line state at `pos` of a whole reply."""
    return not text[text.rfind("\n", 0, pos) + 1 : pos].strip(_BLANKS)


def is_call_language(info: str) -> bool:
    """Whether a complete info string (the rest of the opening fence's line) may hold a call."""
    core = info.strip()
    return core.isascii() and core.lower() in FENCE_LANGUAGES


def may_be_call_language(info: str) -> bool:
    """Whether an info string still being written may end up passing `is_call_language`."""
    started = info.lstrip()
    core = started.rstrip()
    if not core.isascii():
        return False
    if len(core) < len(started):  # blanks after the word: the word is complete
        return core.lower() in FENCE_LANGUAGES
    return any(language.startswith(core.lower()) for language in FENCE_LANGUAGES)


def fence_body_start(text: str, fence: int) -> int | None:
    """For the fence opening at `fence` in a whole reply: where its body starts when it may hold a
    call (an accepted info string on a complete line, and the body's first non-blank character is
    `{` or `[`), else None: then it is an ordinary code block."""
    newline = text.find("\n", fence + len(FENCE))
    if newline < 0 or not is_call_language(text[fence + len(FENCE) : newline]):
        return None
    body = text[newline + 1 :]
    stripped = body.lstrip()
    return newline + 1 if stripped[:1] in ("{", "[") else None

"""Grammars (llguidance's Lark dialect) that make the model write valid tool calls.

The shape is exactly what Qwen2.5's chat template shows the model and renders for past calls:

    <tool_call>\n{"name": "<name>", "arguments": <arguments object>}\n</tool_call>

with calls separated by "\n". Where parallel calls are allowed, a block may also hold several call
objects, a line each: asked for two cities, Qwen2.5-Coder-1.5B closes the first object and, with
`</tool_call>` all but certain otherwise, writes `{"` for a second one (its top logprobs, measured). The arguments object is an inline `%json { schema }`, with the
separators of the template's `tojson` (", " and ": ", no other whitespace) so the forced text looks
like what the model saw in training and cannot wander into runs of whitespace.

- `required`: one call (or, when parallel calls are allowed, one or more), nothing else.
- `function`: exactly one call to that function.
- `auto`: free text, but once the model writes `<tool_call>` the rest of that block is forced to
  be a valid call (a "lazy" grammar, as llama.cpp does for tool calls); any number of calls when
  parallel calls are allowed, else at most one.
- `none`, or no tools: no grammar.

Where the turn may end: after every complete call object, with or without the block's `</tool_call>`,
and after a little whitespace following it (the template ends a turn right after `</tool_call>`; a model
often writes "\n" first, or ends the turn straight after the object's `}`). That whitespace is not a
commitment to another call: the model's end-of-turn tokens (the matcher's EOS ids) stay allowed through
it, and another call comes only if the model itself writes `<tool_call>` (or, parallel calls allowed,
another call object). Inside a call the turn cannot end. The whitespace is bounded (`BLANKS`), so a
model cannot pad a forced turn forever.

Tags that are added tokens of the model's vocabulary (Qwen's `<tool_call>`, `</tool_call>`,
`<think>`, `</think>`) must be referenced as tokens, `<tool_call>` unquoted: llguidance treats
every added token as a special token whose bytes no string literal matches, so a quoted tag would
forbid the very token the model was trained to write. Pass the `llguidance.LLTokenizer` the
matcher will use and this is decided per tag.

Reasoning models: `starts_in_reasoning` (the prompt opened `<think>`) lets free text up to
`</think>` come first; `reasoning` allows an optional `<think>...</think>` block first.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ember.server.tools import ToolChoice, ToolSpec


class _LLTokenizer(Protocol):  # the parts of llguidance.LLTokenizer used here
    def tokenize_str(self, text: str, *, parse_special: bool = False) -> list[int]: ...

    def is_special_token(self, token: int) -> bool: ...


# Whitespace a forced turn may hold between and after its calls: up to two line breaks' worth.
BLANKS = r"/[ \t\r\n]{1,8}/"

# JSON text as Python's json.dumps (and so jinja's tojson) writes it: what the template renders.
_TEMPLATE_JSON_STYLE = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}


def lark_string(text: str) -> str:
    """A Lark string literal; JSON's escapes are the ones Lark understands."""
    return json.dumps(text)


def text_without(tag: str) -> str:
    """A terminal for any text that does not contain `tag` (llguidance's regex `&` and `~`)."""
    return "/(?s:.*)/ & ~/(?s:.*)" + tag.replace("/", "\\/") + "(?s:.*)/"


def styled_schema(schema: Any) -> dict[str, Any]:
    schema = dict(schema)
    # A client's own x-guidance options win; ours only fill in the template's separators.
    schema["x-guidance"] = {**_TEMPLATE_JSON_STYLE, **dict(schema.get("x-guidance") or {})}
    return schema


class GrammarTags:
    """How each tag is written in the grammar: as a token reference or as a string literal."""

    def __init__(self, tokenizer: _LLTokenizer | None):
        self._tokenizer = tokenizer

    def is_token(self, tag: str) -> bool:
        if self._tokenizer is None:
            return False
        ids = self._tokenizer.tokenize_str(tag, parse_special=True)
        return len(ids) == 1 and self._tokenizer.is_special_token(ids[0])

    def __getitem__(self, tag: str) -> str:
        return tag if self.is_token(tag) else lark_string(tag)


# The rules of one tool-call form: `call_body` and `last_call_body` (everything after `<tool_call>`) for
# these tools, given how tags are written and whether parallel calls are allowed.
CallRules = Callable[[Sequence[ToolSpec], "GrammarTags", bool], list[str]]


def json_call_rules(tools: Sequence[ToolSpec], tags: GrammarTags, parallel: bool) -> list[str]:
    """`call_body`: everything after `<tool_call>` up to and including `</tool_call>`: one call object, or
    with parallel calls one or more, a line each (Qwen2.5-Coder writes a second call so).
    `last_call_body`: the same for the turn's last block, which may also end the turn right after its
    last call object (and a few blanks) without the closing tag: the model's end-of-turn token there is
    a finished turn (its top choice after the last `}`, measured), and the parser takes such a block."""
    objects = 'call_object ("\\n" call_object)*' if parallel else "call_object"
    rules = [
        f'call_body: "\\n" {objects} "\\n" ' + tags["</tool_call>"],
        f'last_call_body: "\\n" {objects} (BLANKS | "\\n" {tags["</tool_call>"]} BLANKS?)?',
        f"BLANKS: {BLANKS}",
        "call_object: "
        + lark_string('{"name": ')
        + " ("
        + " | ".join(f"fn_{i}" for i in range(len(tools)))
        + ") "
        + lark_string("}"),
    ]
    for i, spec in enumerate(tools):
        # Rules are named by position: tool names may hold characters Lark names cannot ("-").
        rules.append(f"fn_{i}: " + lark_string(f'"{spec.name}", "arguments": ') + f" args_{i}")
        rules.append(f"args_{i}: %json " + json.dumps(styled_schema(spec.parameters)))
    return rules


def _reasoning_rules(reasoning: bool, starts_in_reasoning: bool, tags: GrammarTags) -> tuple[str, list[str]]:
    if not (reasoning or starts_in_reasoning):
        return "", []
    if tags.is_token("</think>"):  # text cannot contain the token: a plain terminal stops before it
        rules = ["think_body: THINK_TEXT </think>", "THINK_TEXT: /(?s:.*)/"]
    else:  # lazy: end at the first "</think>" (a greedy terminal would also try to run past it)
        rules = ["think_body[lazy]: /(?s:.*)<\\/think>/"]
    if starts_in_reasoning:
        return "think ", ["think: think_body /\\s*/", *rules]
    return "think? ", [f"think: {tags['<think>']} think_body /\\s*/", *rules]


def tool_call_grammar(
    tools: Sequence[ToolSpec],
    choice: ToolChoice,
    *,
    tokenizer: _LLTokenizer | None = None,
    reasoning: bool = False,
    starts_in_reasoning: bool = False,
    call_rules: CallRules = json_call_rules,
) -> str | None:
    """The Lark grammar for llguidance (`LLMatcher.grammar_from_lark(text)`) that enforces `choice`,
    or None when nothing is enforced (tool_choice none, or no tools). `tokenizer`, the matcher's
    `llguidance.LLTokenizer`, says which tags are special tokens; without it tags are plain text.
    `call_rules` writes the calls themselves: the JSON form here, or the XML form
    (`tool_xml_grammar.xml_call_rules`); the text around them and where the turn may end are shared."""
    if choice.mode == "none" or not tools:
        return None
    if choice.mode == "function":
        tools = [spec for spec in tools if spec.name == choice.name]
        if not tools:
            raise ValueError(f"tool_choice names {choice.name!r}, which is not among the tools")
    tags = GrammarTags(tokenizer)
    prefix, rules = _reasoning_rules(reasoning, starts_in_reasoning, tags)
    parallel = choice.parallel and choice.mode != "function"
    if choice.mode == "auto":
        rules.append(f"TEXT: {text_without('<tool_call>')}")
        if tags.is_token("<tool_call>"):
            if parallel:
                start = f"start: {prefix}TEXT (<tool_call> call_body TEXT)* (<tool_call> last_call_body)?"
            else:
                start = f"start: {prefix}TEXT (<tool_call> (call_body TEXT | last_call_body))?"
        else:  # lazy: the free text ends at the first "<tool_call>", after which a call is forced
            if parallel:
                start = f"start: {prefix}(text_then_call call_body)* (TEXT | text_then_call last_call_body)"
            else:
                start = f"start: {prefix}(TEXT | text_then_call (call_body TEXT | last_call_body))"
            rules.append('text_then_call[lazy]: TEXT "<tool_call>"')
    else:
        # Blanks between blocks; the turn may end after any whole call object of the last block.
        start = f"start: {prefix}" + ("(call BLANKS?)* " if parallel else "") + "last_call"
        rules.append(f"call: {tags['<tool_call>']} call_body")
        rules.append(f"last_call: {tags['<tool_call>']} last_call_body")
    return "\n".join([start, *rules, *call_rules(tools, tags, parallel)]) + "\n"

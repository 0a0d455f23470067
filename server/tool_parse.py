"""Finding tool calls in generated text. The chat template (Hermes/Qwen2.5 style) shows the model

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

blocks, possibly several, possibly after some text. Some models write the same JSON in a Markdown code
fence instead (```json, ``` or ```tool_call), which llama.cpp's Hermes parser also takes for a call.
`parse_tool_calls` reads a whole reply, `StreamingToolParser` reads text deltas split anywhere and
gives the same result.

Rules (the same in both, so a streamed reply equals the non-streamed one):
- A tag block runs from `<tool_call>` to the first `</tool_call>`, or to the end of the text when the
  close tag never came (generation stopped right after the JSON). It holds calls when its body is a
  JSON object whose "name" is a declared tool and whose "arguments" object ("parameters" is accepted
  too, as llama.cpp does) satisfies that tool's schema, or several such objects one after another
  (Qwen2.5-Coder writes parallel calls so, one per line in one block). When max_tokens cut the output
  (`cut`), an unclosed block that holds no whole call is dropped: it is neither a call nor content.
- A fence is ``` at the start of a line (spaces and tabs may come before it) outside a tag block.
  A fence opens a block that may be a call when the rest of its line (the info string) is empty,
  `json` or `tool_call` (case and surrounding blanks ignored), that line is complete, and the first
  non-blank character after it is `{` or `[`. The block runs to the next fence (its three backticks;
  the rest of that line is text again) or to the end of the text (a call cut off before its
  closing fence still counts). It is a call when its body is
  one call object as in a tag block, or several when the body is a non-empty array of them, all valid.
- Every other fence opens or closes an ordinary code block, in turn (inside one, the next fence
  closes it whatever follows on its line), and is content, as is the code. `<tool_call>` blocks are
  still found inside ordinary code blocks; nothing is searched for in a rejected fenced block.
- A block that is not a call (unknown tool, bad JSON, arguments against the schema) stays in the
  content verbatim, tags or fences included, as vLLM does: the client sees what the model wrote
  instead of a call the tool cannot run.
- Whitespace between content and a call, and between calls, is dropped (it is the template's
  separator, not something the model says).
- `arguments` is the raw text of the arguments object as the model wrote it when the body is an
  object that starts `{"name": ..., "arguments": ...` (what the template shows the model; or
  "parameters"); otherwise (other key orders, arrays) it is the object re-serialised.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ember.server.tool_fences import (
    FENCE,
    fence_body_start,
    find_fence,
    line_blank_at,
    parse_call_body,
    parse_fence_body,
)
from ember.server.tools import ToolCall, ToolSpec, new_tool_call_id

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"


@dataclass(frozen=True)
class ParsedReply:
    content: str
    calls: tuple[ToolCall, ...]


def parse_tool_calls(
    text: str, tools: Sequence[ToolSpec], *, cut: bool = False, id_factory: Callable[[], str] = new_tool_call_id
) -> ParsedReply:
    """Split a whole generated reply into content text and tool calls. `cut`: generation was stopped
    by max_tokens, so a `<tool_call>` block left open that is not a whole call is dropped."""
    by_name = {spec.name: spec for spec in tools}
    pieces: list[str | ToolCall] = []
    pos, in_code = 0, False
    while True:
        tag = text.find(OPEN_TAG, pos)
        fence = find_fence(text, pos, line_blank_at(text, pos))
        if tag >= 0 and (fence < 0 or tag < fence):
            pieces.append(text[pos:tag])
            close = text.find(CLOSE_TAG, tag + len(OPEN_TAG))
            end = len(text) if close < 0 else close + len(CLOSE_TAG)
            calls = parse_call_body(text[tag + len(OPEN_TAG) : close if close >= 0 else len(text)], by_name)
            if calls:
                pieces.extend(ToolCall(id_factory(), *call) for call in calls)
            elif cut and close < 0:  # half-written when max_tokens stopped it: dropped, the blanks before it too
                pieces[-1] = pieces[-1].rstrip()
            else:
                pieces.append(text[tag:end])
        elif fence >= 0 and not in_code and (body := fence_body_start(text, fence)) is not None:
            pieces.append(text[pos:fence])
            close = find_fence(text, body, True)
            end = len(text) if close < 0 else close + len(FENCE)
            calls = parse_fence_body(text[body : close if close >= 0 else len(text)], by_name)
            pieces.extend([ToolCall(id_factory(), *call) for call in calls] if calls else [text[fence:end]])
        elif fence >= 0:  # an ordinary code block opens or closes: the fence is content
            end = fence + len(FENCE)
            pieces.append(text[pos:end])
            in_code = not in_code
        else:
            break
        pos = end
    pieces.append(text[pos:])
    return assemble_reply(pieces)


def assemble_reply(pieces: Sequence[str | ToolCall]) -> ParsedReply:
    """Content and calls from the pieces of a reply in order: text joins its neighbours, and the
    whitespace between content and a call, or between calls, is dropped."""
    merged: list[str | ToolCall] = []
    for piece in pieces:  # a rejected block is text: join it with its neighbours
        if isinstance(piece, str) and merged and isinstance(merged[-1], str):
            merged[-1] += piece
        else:
            merged.append(piece)
    content = []
    for i, piece in enumerate(merged):
        if isinstance(piece, str):
            if i > 0:  # after a call
                piece = piece.lstrip()
            if i + 1 < len(merged):  # before a call
                piece = piece.rstrip()
            content.append(piece)
    return ParsedReply("".join(content), tuple(p for p in merged if isinstance(p, ToolCall)))

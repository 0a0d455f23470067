"""Tool calls in the XML form of Qwen3-Coder and Qwen3.5 templates, read from a whole reply:

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

Parameter values are raw text; the tool's JSON Schema says what each becomes in the JSON arguments
(`parameter_value`). The rules around the blocks are the JSON form's (`tool_parse.py`): a block runs
from `<tool_call>` to the first `</tool_call>` or to the end of the text; it is a call when its body
is one `<function=NAME>...</function>` element (blanks around it) naming a declared tool, whose
parameters, each `<parameter=P>value</parameter>` (blanks between them), are named once each and
make arguments that satisfy the tool's schema. A block that is not a call stays in the content
verbatim, except an unclosed one when max_tokens cut the output (`cut`): it is dropped. Whitespace
between content and calls, and between calls, is dropped.

A value runs to the first `</parameter>`; one line break right after `<parameter=P>` and one right
before `</parameter>` are the template's layout and are not part of the value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ember.server.tool_parse import CLOSE_TAG, OPEN_TAG, ParsedReply, assemble_reply
from ember.server.tools import ToolCall, ToolSpec, new_tool_call_id

FUNCTION_OPEN = re.compile(r"\s*<function=([a-zA-Z0-9_-]{1,64})>")
PARAMETER_OPEN = re.compile(r"\s*<parameter=([^>\s]{1,128})>")
FUNCTION_CLOSE = "</function>"
PARAMETER_CLOSE = "</parameter>"
_JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def schema_types(schema: Any) -> frozenset[str] | None:
    """The JSON types a parameter's schema names with `type`, or None when it names none."""
    if not isinstance(schema, Mapping):
        return None
    kind = schema.get("type")
    if isinstance(kind, str):
        return frozenset({kind})
    if isinstance(kind, list) and all(isinstance(k, str) for k in kind):
        return frozenset(kind)
    return None


def is_plain_string(schema: Any) -> bool:
    """Whether a parameter is text whatever it says (type "string", no other): its value streams as written."""
    return schema_types(schema) == frozenset({"string"})


def trim_value(raw: str) -> str:
    """The value without the template's line break after the opening tag and before the closing one."""
    if raw.startswith("\n"):
        raw = raw[1:]
    return raw[:-1] if raw.endswith("\n") else raw


def parameter_value(text: str, schema: Any) -> Any:
    """A parameter's (trimmed) text as a JSON value. A string parameter keeps the text as it is (a
    nullable one reads "null" as null); for other types the text is read as JSON (Python's True /
    False, which the template's `| string` writes, as booleans) and kept when it is of an allowed type;
    otherwise, and for schemas without a type, the text is a string unless it reads as JSON. What the
    value becomes is then checked against the whole schema with the other arguments."""
    types = schema_types(schema)
    if types is not None and "string" in types:
        return None if text == "null" and "null" in types else text
    candidate = text.strip()
    if types is not None and "boolean" in types and candidate in ("True", "False"):
        candidate = candidate.lower()
    try:
        value = json.loads(candidate, parse_constant=_reject_constant)
    except ValueError:
        return text
    if types is None:
        return value
    kind = _JSON_TYPES.get(type(value), "number")
    if kind in types or (kind == "number" and "integer" in types and float(value).is_integer()):
        return value
    return text


def parameter_schema(spec: ToolSpec, name: str) -> Any:
    properties = spec.parameters.get("properties")
    return properties.get(name) if isinstance(properties, Mapping) else None


def parse_function(body: str, tools: Mapping[str, ToolSpec]) -> tuple[str, str] | None:
    """(name, arguments JSON text) of a block body holding one valid function element, else None."""
    match = FUNCTION_OPEN.match(body)
    if match is None or match.group(1) not in tools:
        return None
    spec = tools[match.group(1)]
    arguments: dict[str, Any] = {}
    pos = match.end()
    while True:
        parameter = PARAMETER_OPEN.match(body, pos)
        if parameter is None:
            break
        end = body.find(PARAMETER_CLOSE, parameter.end())
        name = parameter.group(1)
        if end < 0 or name in arguments:
            return None
        arguments[name] = parameter_value(trim_value(body[parameter.end() : end]), parameter_schema(spec, name))
        pos = end + len(PARAMETER_CLOSE)
    rest = body[pos:].lstrip()
    if not rest.startswith(FUNCTION_CLOSE) or rest[len(FUNCTION_CLOSE) :].strip():
        return None
    if spec.argument_errors(arguments) is not None:
        return None
    return spec.name, json.dumps(arguments, ensure_ascii=False)


def parse_xml_tool_calls(
    text: str, tools: Sequence[ToolSpec], *, cut: bool = False, id_factory: Callable[[], str] = new_tool_call_id
) -> ParsedReply:
    """Split a whole reply into content and XML-form tool calls (the rules of the module docstring)."""
    by_name = {spec.name: spec for spec in tools}
    pieces: list[str | ToolCall] = []
    pos = 0
    while (tag := text.find(OPEN_TAG, pos)) >= 0:
        pieces.append(text[pos:tag])
        close = text.find(CLOSE_TAG, tag + len(OPEN_TAG))
        end = len(text) if close < 0 else close + len(CLOSE_TAG)
        call = parse_function(text[tag + len(OPEN_TAG) : close if close >= 0 else len(text)], by_name)
        if call is not None:
            pieces.append(ToolCall(id_factory(), *call))
        elif cut and close < 0:  # half-written when max_tokens stopped it: dropped, the blanks before it too
            pieces[-1] = pieces[-1].rstrip()
        else:
            pieces.append(text[tag:end])
        pos = end
    pieces.append(text[pos:])
    return assemble_reply(pieces)

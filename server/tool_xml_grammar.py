"""Grammar rules (llguidance Lark) for tool calls in the XML form, exactly as Qwen3-Coder and Qwen3.5
templates render past calls:

    <tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n...</function>\\n</tool_call>

`xml_call_rules` is the XML counterpart of `tool_grammar.json_call_rules`: `tool_call_grammar` puts it
into the same start rules (text before a call for `auto`, calls only for `required` / a named
function, parallel calls as further `<tool_call>` blocks) and the same places where the turn may end
(after `</function>`, with or without `</tool_call>`, and a few blanks after it).

- Function names are the declared tools'; parameters are the tool's properties, in the schema's
  order (the order the template lists them in the tools section), each required one present and
  each optional one at most once.
- Values follow the parameter's type: a string is any text without `</parameter>` or `</tool_call>`
  (where the parser ends a value and a block; the values of an `enum` of strings are those strings;
  `minLength` / `maxLength` bound it);
  integer, number and boolean values are their literals
  (booleans also as Python's True / False, which the template's `| string` writes); objects and
  arrays are `%json` of the parameter's schema in the template's `tojson` style. Other schemas (no
  type, several types, anyOf) take any text, which the parser reads as JSON where it can. A string
  inside an object or array value is not kept from holding `</parameter>` or `</tool_call>` (`%json`
  has no such exclusion); the parser would end the value or block there.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ember.server.tool_grammar import BLANKS, GrammarTags, lark_string, styled_schema
from ember.server.tool_xml import schema_types
from ember.server.tools import ToolSpec

_VALUE_END = lark_string("\n</parameter>")
_INTEGER = r"/-?(0|[1-9][0-9]*)/"
_NUMBER = r"/-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/"
_BOOLEAN = r"/(true|false|True|False)/"
# Text holding either tag where the parser ends a value ("</parameter>") or a block ("</tool_call>").
_CLOSING_TAGS = r"(?s:.*)<\/(parameter|tool_call)>(?s:.*)"


def _value_rule(name: str, schema: Any) -> str:
    """The rule `name`: one parameter's value and the `\\n</parameter>` that ends it."""
    types = schema_types(schema)
    enum = schema.get("enum") if isinstance(schema, Mapping) else None
    if types == frozenset({"string"}) and isinstance(enum, list) and enum and all(isinstance(e, str) for e in enum):
        return f"{name}: (" + " | ".join(lark_string(e) for e in enum) + f") {_VALUE_END}"
    single = next(iter(types)) if types is not None and len(types) == 1 else None
    if single in ("object", "array"):
        return f"{name}: %json {json.dumps(styled_schema(schema))} {_VALUE_END}"
    literal = {"integer": _INTEGER, "number": _NUMBER, "boolean": _BOOLEAN}.get(single)
    if literal is not None:
        return f"{name}: {literal} {_VALUE_END}"
    if types == frozenset({"string"}) and isinstance(schema.get("maxLength"), int):
        # Bounded text: a value that runs past maxLength would fail the schema (and never end).
        low = schema.get("minLength") if isinstance(schema.get("minLength"), int) else 0
        terminal = name.upper()
        text = f"/(?s:.{{{low},{schema['maxLength']}}})/ & ~/{_CLOSING_TAGS}/"
        return f"{terminal}: {text}\n{name}[lazy]: {terminal} {_VALUE_END}"
    # Text up to the first "</parameter>", which must follow a line break (lazy: ends at the first one).
    return f"{name}[lazy]: VALUE_TEXT {_VALUE_END}"


def _properties(spec: ToolSpec) -> list[tuple[str, Any]]:
    properties = spec.parameters.get("properties")
    return list(properties.items()) if isinstance(properties, Mapping) else []


def xml_call_rules(tools: Sequence[ToolSpec], tags: GrammarTags, parallel: bool) -> list[str]:
    """`call_body` / `last_call_body` after `<tool_call>`: one function element (parallel calls are
    further blocks, written by the start rules), the closing tag, or the turn's end, after it."""
    rules = [
        f'call_body: "\\n" function "\\n" {tags["</tool_call>"]}',
        f'last_call_body: "\\n" function (BLANKS | "\\n" {tags["</tool_call>"]} BLANKS?)?',
        f"BLANKS: {BLANKS}",
        f"VALUE_TEXT: /(?s:.*)/ & ~/{_CLOSING_TAGS}/",
        'function: "<function=" (' + " | ".join(f"fn_{i}" for i in range(len(tools))) + ")",
    ]
    for i, spec in enumerate(tools):
        required = spec.parameters.get("required")
        required = set(required) if isinstance(required, list) else set()
        parts = []
        # Rules are named by position: tool and parameter names may hold characters Lark names cannot.
        for j, (name, schema) in enumerate(_properties(spec)):
            rules.append(f"p_{i}_{j}: " + lark_string(f"<parameter={name}>\n") + f' v_{i}_{j} "\\n"')
            rules.append(_value_rule(f"v_{i}_{j}", schema))
            parts.append(f"p_{i}_{j}" + ("" if name in required else "?"))
        rules.append(f"fn_{i}: " + " ".join([lark_string(f"{spec.name}>\n"), *parts, lark_string("</function>")]))
    return rules

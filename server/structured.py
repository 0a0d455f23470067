"""Structured output: each protocol's way of asking for JSON (or a grammar) → a `GuidedDecoding` grammar.

The output is enforced by constrained decoding in the engine (`ember.runtime.sampling.guided`): never by retrying.
Everything invalid is refused here, before a request is queued, with a `StructuredOutputError` (a
ValueError) that names the offending parameter (`response_format.json_schema.schema.properties.age.type`),
which the server answers with a 400.

- OpenAI `response_format`: `{"type": "text"}` (no grammar), `{"type": "json_object"}` (any JSON object),
  `{"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}`. `strict: true`
  refuses a schema keyword llguidance cannot enforce; otherwise such keywords are ignored (OpenAI's
  non-strict mode is best effort too). A json_schema without a `schema` means any JSON object.
- Ollama `format`: `"json"` (any JSON object) or a JSON schema object.
- A Lark grammar (tool calling with tool_choice "required" or a named function; `%json {...}` embeds a
  schema): `guided_from_lark`.

A schema is checked twice: against its JSON Schema meta-schema (`jsonschema`, the draft its `$schema`
names, 2020-12 by default), then by compiling it with llguidance.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jsonschema

from ember.runtime.sampling.guided import GuidedDecoding

RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema")


class StructuredOutputError(ValueError):
    """An invalid structured-output request; `param` is the path of the offending field."""

    def __init__(self, param: str, detail: str):
        super().__init__(f"{param}: {detail}")
        self.param = param
        self.detail = detail


def guided_from_response_format(response_format: Any, param: str = "response_format") -> GuidedDecoding | None:
    """OpenAI's `response_format` → the grammar it asks for (None for text or an absent field)."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise StructuredOutputError(param, "must be an object")
    kind = response_format.get("type")
    if kind not in RESPONSE_FORMAT_TYPES:
        raise StructuredOutputError(f"{param}.type", f"must be one of {', '.join(RESPONSE_FORMAT_TYPES)}, got {kind!r}")
    if kind == "text":
        return None
    if kind == "json_object":
        return GuidedDecoding.json_object()
    spec = response_format.get("json_schema")
    spec_param = f"{param}.json_schema"
    if not isinstance(spec, dict):
        raise StructuredOutputError(spec_param, "must be an object with the schema (json_schema.schema)")
    name = spec.get("name")
    if name is not None and not (isinstance(name, str) and name):
        raise StructuredOutputError(f"{spec_param}.name", "must be a non-empty string")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise StructuredOutputError(f"{spec_param}.strict", "must be a boolean")
    schema = spec.get("schema")
    if schema is None:
        return GuidedDecoding.json_object()
    return guided_from_json_schema(schema, f"{spec_param}.schema", strict=bool(strict))


def guided_from_ollama_format(format_: Any, param: str = "format") -> GuidedDecoding | None:
    """Ollama's `format`: "json" → any JSON object, a schema object → that schema, ""/absent → None."""
    if format_ is None or format_ == "":
        return None
    if format_ == "json":
        return GuidedDecoding.json_object()
    if isinstance(format_, dict):
        return guided_from_json_schema(format_, param, strict=False)
    raise StructuredOutputError(param, f'must be "json" or a JSON schema object, got {format_!r}')


def guided_from_json_schema(schema: Any, param: str, *, strict: bool = False) -> GuidedDecoding:
    """A validated JSON-schema grammar; `param` names the schema in errors."""
    if not isinstance(schema, dict):
        raise StructuredOutputError(param, f"a JSON schema must be an object, got {_json_type(schema)}")
    check_json_schema(schema, param)
    guided = GuidedDecoding.json_schema(schema, lenient=not strict)
    _compile(guided, param)
    return guided


def guided_from_lark(grammar: Any, param: str) -> GuidedDecoding:
    """A validated Lark grammar (llguidance's dialect)."""
    if not isinstance(grammar, str) or not grammar.strip():
        raise StructuredOutputError(param, "must be a non-empty grammar string")
    guided = GuidedDecoding.lark(grammar)
    _compile(guided, param)
    return guided


def check_json_schema(schema: dict, param: str) -> None:
    """Raise StructuredOutputError unless `schema` is valid under its meta-schema (the path names the
    keyword at fault, e.g. `<param>.properties.age.type`)."""
    try:
        validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        validator.check_schema(schema)
    except jsonschema.SchemaError as error:
        raise StructuredOutputError(_path(param, error.path), error.message) from None
    except (
        jsonschema.exceptions.UnknownType,
        jsonschema.exceptions.RefResolutionError,
        TypeError,
        ValueError,
    ) as error:  # odd `$schema` values and the like: still the client's schema
        raise StructuredOutputError(param, str(error).split("\n", 1)[0]) from None


def _compile(guided: GuidedDecoding, param: str) -> None:
    try:
        guided.validate()
    except ValueError as error:
        detail = str(error).removeprefix("guided.spec: ")
        raise StructuredOutputError(param, detail) from None


def _path(param: str, parts: Iterable[Any]) -> str:
    out = param
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _json_type(value: Any) -> str:
    names = {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "an array",
        type(None): "null",
    }
    return names.get(type(value), type(value).__name__)

"""Function tools: the request side (tool definitions and tool_choice, from the OpenAI, Anthropic
and Ollama shapes into one `ToolSpec` / `ToolChoice`) and the parsed result (`ToolCall`, and its
rendering for each protocol).

Parsing the model's `<tool_call>` blocks and the grammar that forces them depend on the form the
model writes (JSON or XML): `tool_format.py` picks it from the chat template. The translation of tool
turns in the conversation history for the chat template lives in `tool_messages.py`.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import jsonschema
from jsonschema.exceptions import SchemaError
from jsonschema.protocols import Validator

from ember.server.errors import ApiError

NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_ID_ALPHABET = string.ascii_letters + string.digits
EMPTY_PARAMETERS: Mapping[str, Any] = {"type": "object", "properties": {}}


class ToolError(ApiError):
    """A malformed tool definition or tool_choice: a 400 whose `param` names the field,
    e.g. `tools[1].function.parameters` (the app renders it in each protocol's error shape)."""

    def __init__(self, message: str, param: str):
        super().__init__(400, message, param)


@dataclass(frozen=True)
class ToolSpec:
    """One callable function, whatever protocol declared it."""

    name: str
    description: str | None
    parameters: Mapping[str, Any]  # a JSON Schema for the arguments object
    # The schema compiled once: arguments of every call are checked against it.
    validator: Validator = field(repr=False, compare=False)

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI shape, which is what chat templates render inside `<tools></tools>`."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = dict(self.parameters)
        return {"type": "function", "function": function}

    def argument_errors(self, arguments: Any) -> str | None:
        """Why `arguments` (already decoded JSON) do not fit the schema, or None when they do."""
        if not isinstance(arguments, dict):
            return "arguments must be a JSON object"
        error = jsonschema.exceptions.best_match(self.validator.iter_errors(arguments))
        return None if error is None else error.message


def make_tool_spec(name: Any, description: Any, parameters: Any, where: str, *, schema_key: str) -> ToolSpec:
    """Check one definition's fields; `where` is the field path of the tool (`tools[1].function`)."""
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise ToolError("tool name must match ^[a-zA-Z0-9_-]{1,64}$", f"{where}.name")
    if description is not None and not isinstance(description, str):
        raise ToolError("tool description must be a string", f"{where}.description")
    if parameters is None:
        parameters = EMPTY_PARAMETERS  # OpenAI: omitting parameters means a function with no arguments
    if not isinstance(parameters, dict):
        raise ToolError("parameters must be a JSON Schema object", f"{where}.{schema_key}")
    validator_class = jsonschema.validators.validator_for(parameters, default=jsonschema.Draft202012Validator)
    try:
        validator_class.check_schema(parameters)
    except SchemaError as error:
        path = "".join(f"[{p!r}]" if isinstance(p, str) else f"[{p}]" for p in error.path)
        raise ToolError(
            f"invalid JSON Schema{' at ' + path if path else ''}: {error.message}", f"{where}.{schema_key}"
        ) from None
    return ToolSpec(name, description, parameters, validator_class(parameters))


def _check_unique(specs: Sequence[ToolSpec], name_param: str) -> tuple[ToolSpec, ...]:
    seen: set[str] = set()
    for i, spec in enumerate(specs):
        if spec.name in seen:  # two tools of one name would make a call ambiguous
            raise ToolError(f"duplicate tool name {spec.name!r}", name_param.format(i=i))
        seen.add(spec.name)
    return tuple(specs)


# ---- OpenAI (and Ollama) ---------------------------------------------------------------------


def parse_openai_tools(raw: Any, *, param: str = "tools", require_type: bool = True) -> tuple[ToolSpec, ...]:
    """OpenAI `tools`: `[{"type": "function", "function": {name, description?, parameters?}}]`.
    None gives no tools. `require_type=False` accepts items without `type` (Ollama clients)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ToolError("tools must be an array", param)
    specs = []
    for i, item in enumerate(raw):
        where = f"{param}[{i}]"
        if not isinstance(item, dict):
            raise ToolError("each tool must be an object", where)
        kind = item.get("type", None if require_type else "function")
        if kind != "function":
            raise ToolError("only tools of type 'function' are supported", f"{where}.type")
        function = item.get("function")
        if not isinstance(function, dict):
            raise ToolError("a function tool needs a function object", f"{where}.function")
        specs.append(
            make_tool_spec(
                function.get("name"),
                function.get("description"),
                function.get("parameters"),
                f"{where}.function",
                schema_key="parameters",
            )
        )
    return _check_unique(specs, param + "[{i}].function.name")


def parse_ollama_tools(raw: Any) -> tuple[ToolSpec, ...]:
    """Ollama's `tools` have the OpenAI shape; some clients leave out `type`."""
    return parse_openai_tools(raw, require_type=False)


@dataclass(frozen=True)
class ToolChoice:
    """What the model may or must do with the tools.

    auto: text or calls; none: text only (tools are still shown to the template, like OpenAI);
    required: at least one call; function: exactly one call to `name`.
    `parallel`: whether one reply may hold several calls."""

    mode: Literal["auto", "none", "required", "function"]
    name: str | None = None
    parallel: bool = True

    @property
    def forces_call(self) -> bool:
        return self.mode in ("required", "function")


def parse_openai_tool_choice(
    raw: Any, tools: Sequence[ToolSpec], *, parallel_tool_calls: Any = None, param: str = "tool_choice"
) -> ToolChoice:
    """OpenAI `tool_choice` ("auto" | "none" | "required" | {"type": "function", "function": {"name"}})
    plus `parallel_tool_calls`. Absent: "auto" with tools, "none" without (OpenAI's defaults)."""
    if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
        raise ToolError("parallel_tool_calls must be a boolean", "parallel_tool_calls")
    parallel = True if parallel_tool_calls is None else parallel_tool_calls
    if raw is None:
        return ToolChoice("auto" if tools else "none", parallel=parallel)
    if isinstance(raw, str):
        if raw not in ("auto", "none", "required"):
            raise ToolError("tool_choice must be 'auto', 'none', 'required' or a function object", param)
        if raw == "required" and not tools:
            raise ToolError("tool_choice 'required' needs tools", param)
        mode = "none" if raw == "auto" and not tools else raw
        return ToolChoice(mode, parallel=parallel)
    if not isinstance(raw, dict) or raw.get("type") != "function":
        raise ToolError("tool_choice must be 'auto', 'none', 'required' or a function object", param)
    function = raw.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise ToolError("tool_choice.function.name must be a string", f"{param}.function.name")
    return ToolChoice("function", _known_name(name, tools, f"{param}.function.name"), parallel=False)


def _known_name(name: str, tools: Sequence[ToolSpec], param: str) -> str:
    if all(spec.name != name for spec in tools):
        raise ToolError(f"tool_choice names {name!r}, which is not among the tools", param)
    return name


# ---- Anthropic -------------------------------------------------------------------------------


def parse_anthropic_tools(raw: Any, *, param: str = "tools") -> tuple[ToolSpec, ...]:
    """Anthropic `tools`: `[{"name", "description"?, "input_schema"}]` (`type` absent or "custom").
    Anthropic's server tools (web search, bash, ...) are refused: there is nothing here to run them."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ToolError("tools must be an array", param)
    specs = []
    for i, item in enumerate(raw):
        where = f"{param}[{i}]"
        if not isinstance(item, dict):
            raise ToolError("each tool must be an object", where)
        if item.get("type", "custom") != "custom":
            raise ToolError(f"tool type {item.get('type')!r} is not supported; only custom tools are", f"{where}.type")
        if "input_schema" not in item:
            raise ToolError("a tool needs an input_schema", f"{where}.input_schema")
        schema = item["input_schema"]
        if schema is None:
            raise ToolError("input_schema must be a JSON Schema object", f"{where}.input_schema")
        specs.append(
            make_tool_spec(item.get("name"), item.get("description"), schema, where, schema_key="input_schema")
        )
    return _check_unique(specs, param + "[{i}].name")


def parse_anthropic_tool_choice(raw: Any, tools: Sequence[ToolSpec], *, param: str = "tool_choice") -> ToolChoice:
    """Anthropic `tool_choice`: {"type": "auto"|"any"|"tool"|"none", "name"?, "disable_parallel_tool_use"?}.
    Absent means auto (none without tools)."""
    if raw is None:
        return ToolChoice("auto" if tools else "none")
    if not isinstance(raw, dict):
        raise ToolError("tool_choice must be an object", param)
    kind = raw.get("type")
    disable_parallel = raw.get("disable_parallel_tool_use", False)
    if not isinstance(disable_parallel, bool):
        raise ToolError("disable_parallel_tool_use must be a boolean", f"{param}.disable_parallel_tool_use")
    parallel = not disable_parallel
    if kind == "none" or (kind == "auto" and not tools):
        return ToolChoice("none", parallel=parallel)
    if kind == "auto":
        return ToolChoice("auto", parallel=parallel)
    if kind == "any":
        if not tools:
            raise ToolError("tool_choice 'any' needs tools", f"{param}.type")
        return ToolChoice("required", parallel=parallel)
    if kind == "tool":
        name = raw.get("name")
        if not isinstance(name, str):
            raise ToolError("tool_choice of type 'tool' needs a name", f"{param}.name")
        return ToolChoice("function", _known_name(name, tools, f"{param}.name"), parallel=False)
    raise ToolError("tool_choice.type must be 'auto', 'any', 'tool' or 'none'", f"{param}.type")


# ---- parsed calls and their rendering per protocol ---------------------------------------------


def new_tool_call_id(prefix: str = "call_") -> str:
    """`call_` + 24 random letters and digits, the shape OpenAI's ids have."""
    return prefix + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # the arguments object as JSON text (OpenAI sends it as a string)

    def arguments_object(self) -> dict[str, Any]:
        return json.loads(self.arguments)


def openai_tool_calls(calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    """`choices[i].message.tool_calls` of a non-streamed chat completion."""
    return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


def anthropic_tool_use_id(call_id: str) -> str:
    """Anthropic ids look like `toolu_...`: reuse the random part so both ids name the same call."""
    return "toolu_" + call_id.removeprefix("call_")


def anthropic_tool_use(call: ToolCall) -> dict[str, Any]:
    """A `tool_use` content block of an Anthropic message."""
    return {
        "type": "tool_use",
        "id": anthropic_tool_use_id(call.id),
        "name": call.name,
        "input": call.arguments_object(),
    }


def ollama_tool_calls(calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    """`message.tool_calls` of an Ollama chat reply: arguments as an object, no id."""
    return [{"function": {"name": c.name, "arguments": c.arguments_object()}} for c in calls]

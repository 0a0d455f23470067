"""Render a model's chat template (Jinja2) into a prompt, inside a sandbox.

A chat template comes with the checkpoint, so it is code from whoever published the model.
It runs in Jinja2's `ImmutableSandboxedEnvironment` (no private attributes, no mutating
built-in containers, sandboxed `str.format`), tightened so that touching an unsafe attribute
fails at once instead of rendering as an empty string, and so that `*` / `**` cannot build
gigantic strings or numbers. Everything a template may see is rebuilt from plain JSON types.

Within those limits the environment matches HF transformers' `apply_chat_template`, so a
template renders the same text it renders there: `trim_blocks` / `lstrip_blocks`, the
`loopcontrols` extension, a `{% generation %}` block tag, `tojson` without HTML escaping
(`ensure_ascii=False`, `indent`, `separators`, `sort_keys`), and the globals
`raise_exception`, `strftime_now`, a `dict` constructor and a `namespace` that refuses names
starting with "_".
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

MAX_REPEAT = 1_000_000  # longest string or list `*` may build
MAX_EXPONENT = 1_024  # largest exponent `**` may raise a number above 1 to
# A message's reasoning, under the names clients use for it; templates read `reasoning_content`
# (and gpt-oss's `thinking`). HF fills both the same way.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(Exception):
    """The template does not compile, raised an error itself (`raise_exception`), failed while
    rendering, or tried something the sandbox forbids. The message starts with the origin."""

    def __init__(self, origin: str, problem: str):
        self.origin, self.problem = origin, problem
        super().__init__(f"{origin}: {problem}")


class ChatTemplate:
    """One compiled chat template. `origin` says where it came from, for error messages."""

    def __init__(
        self,
        source: str,
        *,
        bos_token: str | None,
        eos_token: str | None,
        origin: str,
        clock: Callable[[], datetime] = datetime.now,
    ):
        self.source, self.origin = source, origin
        self.bos_token, self.eos_token = bos_token, eos_token
        env = _TemplateSandbox(
            trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, _GenerationBlock]
        )
        env.filters["tojson"] = _tojson
        env.globals.update(
            raise_exception=_raise_exception,
            strftime_now=lambda fmt: clock().strftime(fmt),
            dict=_DictMaker(),
            namespace=_TemplateNamespace,
        )
        try:
            self._template = env.from_string(source)
        except TemplateSyntaxError as error:
            raise ChatTemplateError(origin, f"syntax error on line {error.lineno}: {error.message}") from error

    def render(
        self,
        messages: list[dict],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
        **template_kwargs: Any,
    ) -> str:
        """The prompt text for `messages` (OpenAI-style dicts). Keys whose value is None are dropped,
        as HF does: templates test for a key's presence, and many print a None as "None"."""
        chat = [
            _with_reasoning_aliases(_plain(message, self.origin, "messages"))
            for message in _checked_messages(messages, self.origin)
        ]
        variables = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "documents": None,
            **_plain(template_kwargs, self.origin, "template_kwargs"),
        }
        try:
            return self._template.render(
                messages=chat,
                tools=_plain(tools, self.origin, "tools"),
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
        except SecurityError as error:
            raise ChatTemplateError(self.origin, f"the template broke the sandbox: {error}") from error
        except _TemplateRaisedError as error:
            raise ChatTemplateError(self.origin, str(error)) from error
        except TemplateError as error:
            raise ChatTemplateError(self.origin, f"rendering failed: {error}") from error
        except Exception as error:  # TypeError, ZeroDivisionError, ... from the template's own code
            raise ChatTemplateError(self.origin, f"rendering failed: {type(error).__name__}: {error}") from error

    def __repr__(self) -> str:
        return f"ChatTemplate(origin={self.origin!r}, {len(self.source)} chars)"


# ---- the sandbox ----------------------------------------------------------------------------------


class _TemplateSandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**"})

    def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
        # Jinja returns an Undefined that only fails when used, so `{{ x.__class__ }}` would
        # print "". A template reaching for internals is hostile: stop it right there.
        raise SecurityError(f"access to attribute {attribute!r} of a {type(obj).__name__!r} object is unsafe")

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for seq, count in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(count, int) and len(seq) * count > MAX_REPEAT:
                    raise SecurityError(f"'*' would build a sequence of {len(seq) * count} items")
        elif (
            isinstance(left, (int, float))
            and isinstance(right, (int, float))
            and abs(left) > 1
            and right > MAX_EXPONENT
        ):
            raise SecurityError(f"'**' with exponent {right} is too large")
        return super().call_binop(context, operator, left, right)


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks the assistant's text in HF training
    templates; for inference it renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Callable[[], str]) -> str:
        return caller()


class _TemplateRaisedError(TemplateError):
    """The template's own `raise_exception(message)`."""


def _raise_exception(message: str) -> None:
    raise _TemplateRaisedError(str(message))


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson escapes <, >, & and ' for HTML; prompts want the JSON as written.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _DictMaker:
    """The template's `dict`: builds dicts, and nothing else of the type is reachable."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, keys: Any, value: Any = None) -> dict:
        return dict.fromkeys(keys, value)


class _TemplateNamespace(Namespace):
    """`namespace(...)` that refuses attribute names starting with "_" (no dunder smuggling)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 -- Namespace's own signature trick
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _TemplateNamespace._check(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check(name)
        Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"a namespace attribute may not start with '_' (got {name!r})")


# ---- what the template sees ---------------------------------------------------------------------


def _checked_messages(messages: Any, origin: str) -> list[Mapping[str, Any]]:
    if not isinstance(messages, (list, tuple)):
        raise ChatTemplateError(origin, f"messages must be a list of dicts, got {type(messages).__name__}")
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ChatTemplateError(origin, f"message #{index} is a {type(message).__name__}, not a dict")
    return [{key: value for key, value in message.items() if value is not None} for message in messages]


def _with_reasoning_aliases(message: dict) -> dict:
    reasoning = next((message[key] for key in _REASONING_FIELDS if message.get(key) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


def _plain(value: Any, origin: str, where: str) -> Any:
    """A copy made of JSON types only (str, int, float, bool, None, dict, list, tuple), so no
    object with methods of its own reaches the template."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k, origin, where): _plain(v, origin, where) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(item, origin, where) for item in value]
    if isinstance(value, tuple):
        return tuple(_plain(item, origin, where) for item in value)
    raise ChatTemplateError(origin, f"{where} hold a {type(value).__name__}, which is not plain JSON data")

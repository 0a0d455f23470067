"""Ember's sandboxed chat-template renderer.

The real templates (Qwen2.5-Coder's from its GGUF, Gemma 3's instruct template) must render
exactly what HF transformers' apply_chat_template renders (fixtures from
tools/dev/make_tokenizer_fixtures.py; the template text is in the fixture, so no model file is
needed). Hostile templates must fail with ChatTemplateError instead of reaching Python internals.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from ember.runtime.loading.text.chat_template import ChatTemplate, ChatTemplateError

FIXTURES = Path(__file__).parent / "fixtures" / "tokenizer"
REAL_MODELS = ("qwen2.5-coder-1.5b-instruct", "gemma-3-270m")


def render(source: str, messages=({"role": "user", "content": "hi"},), **kwargs) -> str:
    template = ChatTemplate(source, bos_token="<s>", eos_token="</s>", origin="inline")
    return template.render(list(messages), **kwargs)


def real_cases() -> list[tuple[str, dict]]:
    cases = []
    for model in REAL_MODELS:
        fixture = json.loads((FIXTURES / f"{model}.json").read_text(encoding="utf-8"))
        for case in fixture["chat"]["renders"]:
            cases.append(pytest.param(fixture, case, id=f"{model}-{case['name']}"))
    return cases


@pytest.mark.parametrize(("fixture", "case"), real_cases())
def test_real_templates_render_like_hf(fixture, case):
    special = fixture["special"]
    template = ChatTemplate(
        fixture["chat"]["template"],
        bos_token=special["bos_token"],
        eos_token=special["eos_token"],
        origin=fixture["header"]["chat_template_origin"],
    )
    messages, tools = json.loads(case["messages_json"]), json.loads(case["tools_json"])
    if "error" in case:  # the template's own raise_exception
        with pytest.raises(ChatTemplateError) as caught:
            template.render(messages, tools=tools, add_generation_prompt=case["add_generation_prompt"])
        assert caught.value.problem == case["error"]
    else:
        rendered = template.render(messages, tools=tools, add_generation_prompt=case["add_generation_prompt"])
        assert rendered == case["rendered"]
        assert messages == json.loads(case["messages_json"])  # the caller's messages are untouched


# ---- the environment matches HF's --------------------------------------------------------------


def test_blocks_are_trimmed_like_hf():
    source = "{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}"
    assert render(source, [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]) == "[a]\n[b]\n"


def test_loop_controls_and_generation_blocks_work():
    source = (
        "{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}"
        "{{ i }}{% endfor %}|{% generation %}{{ messages[0].content }}{% endgeneration %}"
    )
    assert render(source) == "02|hi"


def test_tojson_writes_unicode_and_markup_as_is_with_indent_and_key_order():
    value = {"z": "<b>Zürich & 你好</b>", "a": [1, None, True]}
    assert render("{{ tools[0] | tojson }}", tools=[value]) == json.dumps(value, ensure_ascii=False)
    assert render("{{ tools[0] | tojson(indent=2) }}", tools=[value]) == json.dumps(value, ensure_ascii=False, indent=2)
    assert render("{{ tools[0] | tojson(sort_keys=true) }}", tools=[value]).startswith('{"a": [1, null, true]')


def test_special_tokens_generation_prompt_and_template_kwargs_reach_the_template():
    source = "{{ bos_token }}{{ messages[0].content }}{% if add_generation_prompt %}>{% endif %}{{ eos_token }}"
    assert render(source) == "<s>hi></s>"
    assert render(source, add_generation_prompt=False) == "<s>hi</s>"
    assert render("{{ 'on' if enable_thinking else 'off' }}", enable_thinking=True) == "on"
    assert render("{{ bos_token }}", bos_token="[B]") == "[B]"  # kwargs win, as in HF
    assert render("{{ tools is none }}{{ documents is none }}") == "TrueTrue"


def test_none_valued_keys_are_dropped_and_reasoning_is_aliased():
    source = "{{ messages[0].tool_calls is defined }} {{ messages[0].reasoning_content }} {{ messages[0].thinking }}"
    message = {"role": "assistant", "content": "x", "tool_calls": None, "reasoning": "because"}
    assert render(source, [message]) == "False because because"


def test_strftime_now_uses_the_clock():
    template = ChatTemplate(
        "{{ strftime_now('%d %b %Y') }}",
        bos_token=None,
        eos_token=None,
        origin="o",
        clock=lambda: datetime(2025, 3, 9, 12, 0),
    )
    assert template.render([]) == "09 Mar 2025"


def test_namespace_and_dict_globals_work():
    source = (
        "{% set ns = namespace(count=0) %}{% for m in messages %}{% set ns.count = ns.count + 1 %}{% endfor %}"
        "{{ ns.count }} {{ dict(a=1) | tojson }} {{ dict.fromkeys(['x'], 0) | tojson }}"
    )
    assert render(source, [{"role": "user", "content": "a"}] * 3) == '3 {"a": 1} {"x": 0}'


def test_raise_exception_becomes_chat_template_error_with_the_message():
    with pytest.raises(ChatTemplateError) as caught:
        render("{{ raise_exception('Only user and assistant roles are supported') }}")
    assert caught.value.problem == "Only user and assistant roles are supported"
    assert str(caught.value) == "inline: Only user and assistant roles are supported"


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("{% for m in messages %}", "syntax error on line 1"),
        ("{{ messages[0].content + 1 }}", "TypeError"),
        ("{{ 1 / 0 }}", "ZeroDivisionError"),
        ("{{ messages | no_such_filter }}", "syntax error"),
        ("{{ undefined_thing.attr }}", "rendering failed"),
    ],
)
def test_broken_templates_raise_chat_template_error(source, problem):
    with pytest.raises(ChatTemplateError, match=problem):
        render(source)


def test_messages_must_be_plain_data():
    with pytest.raises(ChatTemplateError, match="not plain JSON data"):
        render("{{ messages }}", [{"role": "user", "content": object()}])
    with pytest.raises(ChatTemplateError, match="not a dict"):
        render("{{ messages }}", ["hello"])


# ---- the sandbox -------------------------------------------------------------------------------

HOSTILE = [
    "{{ ''.__class__.__mro__ }}",
    "{{ ''.__class__ }}",  # plain Jinja would print "" here; Ember refuses at once
    "{{ cycler.__init__.__globals__ }}",
    "{{ joiner.__init__.__globals__.os }}",
    "{{ lipsum.__globals__['os'] }}",
    "{{ ().__class__.__base__.__subclasses__() }}",
    "{{ messages.__class__.__subclasses__() }}",
    "{{ raise_exception.__globals__ }}",
    "{{ strftime_now.__globals__ }}",
    "{{ namespace.__init__.__globals__ }}",
    "{{ dict.__class__ }}",
    "{{ messages[0]['__class__'] }}",
    "{{ '{0.__class__.__mro__}'.format(messages) }}",
    "{{ messages.append({'role': 'x'}) }}",
    "{{ messages[0].update({'role': 'x'}) }}",
    "{% set ns = namespace() %}{% set ns.__dict__ = 1 %}",
    "{% set ns = namespace(__class__=1) %}",
    "{{ 'x' * 100000000 }}",
    "{{ [0] * 100000000 }}",
    "{{ 9 ** 99999999 }}",
    "{{ range(10**9) | list }}",
    "{{ messages | attr('__class__') }}",
    "{{ messages | map(attribute='__class__') | list }}",
    "{{ (messages | first).__class__ }}",
]


@pytest.mark.parametrize("source", HOSTILE)
def test_hostile_templates_raise_chat_template_error(source):
    with pytest.raises(ChatTemplateError, match="sandbox"):
        render(source)


def test_sandbox_leaves_ordinary_container_reads_alone():
    source = "{{ messages[0].get('content') }} {{ messages[0].items() | list | length }} {{ 'a,b'.split(',') }}"
    assert render(source) == "hi 2 ['a', 'b']"

"""Write HF transformers' tokenizer and chat-template output for the real GGUF models as fixtures.

Run in the Python 3.11 env that has torch and transformers (Ember's own env has neither):

    /work/venv311/bin/python tools/dev/make_tokenizer_fixtures.py [--models-dir DIR] [--out DIR]

For each model it loads HF's reference tokenizer straight from the GGUF file
(`AutoTokenizer.from_pretrained(folder, gguf_file=name)`), encodes a corpus of awkward text
(CJK, emoji with ZWJ sequences, code, whitespace runs, numbers, special tokens written in the
text), decodes the ids back, and renders the chat template for a few conversations. The output,
tests/fixtures/tokenizer/<model>.json, is what tests/test_tokenizer.py and
tests/test_chat_template.py hold Ember's tokenizer and template renderer to. Output is
deterministic (sorted keys, fixed corpus): running the script again gives the same bytes.

This file imports nothing from Ember: Ember needs Python 3.12, this env is 3.11.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path

import tokenizers
import transformers
from synthetic_tokenizer_fixture import synthetic_fixture  # sibling script (run by path)
from transformers import AutoTokenizer

REPO = Path(__file__).resolve().parents[2]
FIXTURE_DIR = REPO / "tests" / "fixtures" / "tokenizer"

# fixture name -> the GGUF file name Ember's known_models assembles under <cache>/models/.
MODELS = {
    "qwen2.5-coder-1.5b-instruct": "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    "gemma-3-270m": "gemma-3-270m-q4_k_m.gguf",
}

CORPUS = [
    "",
    " ",
    "Hello, world!",
    "Hello world  <start_of_turn>user\n你好 🧑‍💻 <|im_start|>",
    "Ünïcödé façade naïve café — “quotes” and ‘single’ … €100 ±5% ½ ¿qué? Straße ﬁn",
    "e\u0301 vs é (combining acute, not NFC), zero\u200bwidth, nbsp\u00a0here, soft\u00adhyphen",
    "你好，世界！这是一个测试。我们在测试分词器。",
    "日本語のテキスト、カタカナとひらがな。한국어 문장입니다. Ελληνικά Русский текст",
    "مرحبا بالعالم • नमस्ते दुनिया • สวัสดีชาวโลก • 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛",
    "I ❤️ 🦀 and 🐍 👍🏽 👩🏿‍🔬",
    "👨‍👩‍👧‍👦 family, 🧑‍💻 coder, 🏳️‍🌈 flag, 🇯🇵🇫🇷 flags, 😀😃😄😁",
    "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * 0x1F;\n}\n",
    '{"key": [1, 2.5, null, true], "nested": {"a": "b\\n"}}',
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
    "a  b   c    d     e",
    "\t\ttabs\tand  spaces\t \t",
    "line1\nline2\n\n\nline5\n",
    "\n\n\n",
    "   leading and trailing   ",
    "\r\nwindows\r\nline endings\r\n",
    "        deeply\n            indented\n                code",
    "3.14159 2718281828 1,000,000 -42 1e-9 2024-01-31 12:30:45 v1.2.3 100% 007",
    "I'm sure they'll say it's fine; we've done what you'd've DONE'T SHOUT",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more text<|endoftext|>",
    "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n",
    "<bos>Starts with bos<eos>",
    '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
    "not special: <|im_start |> < bos> <end_of_turn",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Mixed: café 你好 🧑‍💻 <|im_end|> x=1\n\n\tdone",
]

QWEN_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name, e.g. Zürich"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web.",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        },
    },
]

SYSTEM = {"role": "system", "content": "You are a concise assistant. Réponds en français si besoin."}
ONE_TURN = [SYSTEM, {"role": "user", "content": "What is 2 + 2? 你好 🧑‍💻"}]
MULTI_TURN = [
    SYSTEM,
    {"role": "user", "content": "Write a haiku about rust."},
    {"role": "assistant", "content": "Iron slowly wakes\nred blooms on forgotten gates\ntime's patient teeth bite"},
    {"role": "user", "content": "  Now one about Python.\n"},
]
NO_SYSTEM = [{"role": "user", "content": "Hi!"}]
TOOL_TURNS = [
    SYSTEM,
    {"role": "user", "content": "What's the weather in Zürich?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}},
            }
        ],
    },
    {"role": "tool", "name": "get_weather", "content": '{"temperature": 21, "sky": "☀️"}'},
]
NOT_ALTERNATING = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]

# The Gemma 3 270M base GGUF carries no chat template. To test Ember's renderer on a real Gemma
# template too, the fixture renders the Gemma 3 instruct template, as published in the
# tokenizer_config.json of Google's gemma-3 "-it" checkpoints.
GEMMA3_IT_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    '    {%- set first_user_prefix = "" -%}\n'
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    '        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}\n'
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    '        {%- set role = "model" -%}\n'
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    '        {{ raise_exception("Invalid content type") }}\n'
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\\n'}}\n"
    "{%- endif -%}\n"
)
GEMMA_PARTS = [SYSTEM, {"role": "user", "content": [{"type": "text", "text": " Describe this: "}, {"type": "image"}]}]


def conversations(model: str) -> list[dict]:
    """(name, messages, tools, add_generation_prompt) cases rendered for `model`'s template."""
    cases = [
        {"name": "one_turn", "messages": ONE_TURN},
        {"name": "multi_turn", "messages": MULTI_TURN},
        {"name": "multi_turn_no_generation_prompt", "messages": MULTI_TURN, "add_generation_prompt": False},
    ]
    if model.startswith("qwen"):
        cases += [
            {"name": "no_system", "messages": NO_SYSTEM},
            {"name": "tools", "messages": ONE_TURN, "tools": QWEN_TOOLS},
            {"name": "tool_call_and_result", "messages": TOOL_TURNS, "tools": QWEN_TOOLS},
        ]
    else:
        cases += [
            {"name": "content_parts", "messages": GEMMA_PARTS},
            {"name": "roles_not_alternating", "messages": NOT_ALTERNATING},
        ]
    for case in cases:
        case.setdefault("add_generation_prompt", True)
        case.setdefault("tools", None)
    return cases


def encode_cases(tok) -> list[dict]:
    cases = []
    for text in CORPUS:
        ids = tok.encode(text, add_special_tokens=True)
        plain = tok.encode(text, add_special_tokens=False)
        # Half of the ids: often ends inside a character, so decode must write U+FFFD like HF.
        head = plain[: len(plain) // 2 + 1] if plain else []
        cases.append(
            {
                "text": text,
                "ids": ids,
                "ids_no_special": plain,
                "decoded": tok.decode(ids),
                "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
                "head_ids": head,
                "head_decoded": tok.decode(head),
            }
        )
    return cases


def render_cases(tok, model: str, template: str) -> list[dict]:
    renders = []
    for case in conversations(model):
        # Messages and tools go in as JSON text: the fixture's keys are sorted, and the order of
        # keys inside a tool schema shows in the rendered prompt.
        entry = {
            "name": case["name"],
            "add_generation_prompt": case["add_generation_prompt"],
            "messages_json": json.dumps(case["messages"], ensure_ascii=False),
            "tools_json": json.dumps(case["tools"], ensure_ascii=False),
        }
        try:
            text = tok.apply_chat_template(
                case["messages"],
                tools=case["tools"],
                chat_template=template,
                add_generation_prompt=case["add_generation_prompt"],
                tokenize=False,
            )
        except Exception as error:  # the template's raise_exception
            entry["error"] = str(error)
        else:
            entry["rendered"] = text
            entry["ids"] = tok.encode(text, add_special_tokens=False)
        renders.append(entry)
    return renders


def fixture_for(model: str, gguf_name: str, models_dir: Path) -> dict:
    tok = AutoTokenizer.from_pretrained(str(models_dir), gguf_file=gguf_name)
    template, origin = tok.chat_template, f"{gguf_name}: tokenizer.chat_template"
    if template is None:
        template, origin = GEMMA3_IT_TEMPLATE, "Gemma 3 instruct template (google gemma-3 -it tokenizer_config.json)"
    vocab_size = len(tok)
    return {
        "header": {
            "model": model,
            "gguf_file": gguf_name,
            "reference": (
                f"transformers {transformers.__version__} (tokenizers {tokenizers.__version__}): "
                f"AutoTokenizer.from_pretrained(<models dir>, gguf_file={gguf_name!r}), "
                "the tokenizer HF builds from the GGUF metadata"
            ),
            "chat_template_origin": origin,
            "generated_by": "tools/dev/make_tokenizer_fixtures.py",
        },
        "special": {
            "bos_token": tok.bos_token,
            "bos_token_id": tok.bos_token_id,
            "eos_token": tok.eos_token,
            "eos_token_id": tok.eos_token_id,
            "add_bos": bool(getattr(tok, "add_bos_token", False)),
            "vocab_size": vocab_size,
            "gguf_has_chat_template": tok.chat_template is not None,
        },
        "encode": encode_cases(tok),
        "chat": {"template": template, "renders": render_cases(tok, model, template)},
    }


# ---- tiny synthetic vocabularies: HF's GGUF converter on metadata small enough to commit ----------


def dumps(fixture: dict) -> str:
    """Sorted, indented JSON with lists of ids kept on one line, so the file stays short."""
    text = json.dumps(fixture, ensure_ascii=False, indent=1, sort_keys=True)
    return (
        re.sub(r"\[\s*(-?\d+(?:,\s*-?\d+)*)\s*\]", lambda m: "[" + ", ".join(re.split(r",\s*", m.group(1))) + "]", text)
        + "\n"
    )


def main() -> None:
    default_dir = Path(os.environ.get("EMBER_CACHE_DIR", Path.home() / ".cache" / "ember")).expanduser() / "models"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models-dir", type=Path, default=default_dir)
    parser.add_argument("--out", type=Path, default=FIXTURE_DIR)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    outputs = {"synthetic": synthetic_fixture}
    outputs.update(
        {
            model: (lambda m=model, g=gguf_name: fixture_for(m, g, args.models_dir))
            for model, gguf_name in MODELS.items()
        }
    )
    for name, make in outputs.items():
        path = args.out / f"{name}.json"
        path.write_text(dumps(make()), encoding="utf-8")
        print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()

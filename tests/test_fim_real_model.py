"""Fill-in-the-middle on the real default model (Qwen2.5-Coder-1.5B-Instruct, CPU): a function body with a
hole, filled greedily, must make the file parse as Python with the code around it. CI runs the one short
OpenAI case; the Ollama and llama-server (`/infill` with another file as context) cases are `slow`:
`./tools/test -m slow tests/test_fim_real_model.py`."""

from __future__ import annotations

import ast

import httpx
import ollama
import openai
import pytest

pytestmark = pytest.mark.real_model

MODEL = "qwen2.5-coder-1.5b-instruct"
PREFIX = 'def fibonacci(n):\n    """The n-th Fibonacci number."""\n    if n < 2:\n        return n\n    '
SUFFIX = "\n\n\nprint(fibonacci(10))\n"


@pytest.fixture(scope="module")
def real_server(qwen_gguf):
    from server_support import LiveServer

    live = LiveServer(
        qwen_gguf,
        "--served-model-name",
        MODEL,
        "--max-num-seqs",
        "1",
        "--max-batched-tokens",
        "128",
        "--ctx",
        "1024",
        ready_timeout=900,
    )
    yield live
    live.stop()


def assert_fills_the_hole(middle: str, prefix: str = PREFIX, suffix: str = SUFFIX) -> None:
    assert middle.strip(), "the model wrote nothing in the hole"
    source = prefix + middle + suffix
    try:
        ast.parse(source)
    except SyntaxError as error:
        pytest.fail(f"the filled file does not parse ({error}):\n{source}")


def test_openai_suffix_fills_a_function_body(real_server):
    client = openai.OpenAI(base_url=real_server.url + "/v1", api_key="unused", max_retries=0, timeout=600)
    reply = client.completions.create(model=MODEL, prompt=PREFIX, suffix=SUFFIX, max_tokens=24, temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", choice.text  # the model closed the hole itself
    assert_fills_the_hole(choice.text)
    assert "fibonacci(n - 1)" in choice.text.replace("n-1", "n - 1")


@pytest.mark.slow
def test_ollama_suffix_fills_a_function_body(real_server):
    client = ollama.Client(host=real_server.url, timeout=600)
    reply = client.generate(model=MODEL, prompt=PREFIX, suffix=SUFFIX, options={"num_predict": 24, "temperature": 0})
    assert reply.done_reason == "stop"
    assert_fills_the_hole(reply.response)


@pytest.mark.slow
def test_infill_uses_another_file_as_context(real_server):
    """The helper lives in another file (input_extra); the hole calls it."""
    prefix = "from geometry import circle_area\n\n\ndef total_area(radii):\n    "
    suffix = "\n\n\nprint(total_area([1, 2]))\n"
    extra = [{"filename": "geometry.py", "text": "import math\n\n\ndef circle_area(r):\n    return math.pi * r * r\n"}]
    body = {"input_prefix": prefix, "input_suffix": suffix, "input_extra": extra, "n_predict": 24, "temperature": 0}
    reply = httpx.post(real_server.url + "/infill", json=body, timeout=600).json()
    # this instruct model may run on into the suffix's first line instead of ending the middle (24 tokens
    # stop it): what an editor inserts is the text before that line
    middle = reply["content"].split("\n\n\nprint(")[0]
    assert_fills_the_hole(middle, prefix, suffix)
    assert "circle_area(" in middle

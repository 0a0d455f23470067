"""Fill-in-the-middle over every protocol that has it (OpenAI `/v1/completions` with `suffix`, Ollama
`/api/generate` with `suffix`, llama-server's `/infill`), against the tiny random-weight Qwen2 server whose
tokenizer is Qwen2.5-Coder's (it has the FIM markers), and a copy of it whose tokenizer lacks them (each
protocol answers 400 in its own error shape). The tiny model's text is random: these check the prompt the
server built (its token count, the exact ids in the unit tests) and the reply shapes."""

from __future__ import annotations

import json
import shutil

import httpx
import ollama
import openai
import pytest

from ember.runtime.loading.text.tokenizer import Tokenizer
from ember.server.errors import ApiError, error_body
from ember.server.fim import ExtraFile, detect_fim_tokens, fim_prompt_ids, require_fim

PREFIX = "def add(a, b):\n    "
SUFFIX = "\n\nprint(add(1, 2))\n"
FIM_NAMES = ("<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")


@pytest.fixture(scope="module")
def tokenizer(tiny_chat_model) -> Tokenizer:
    return Tokenizer.from_hf_dir(tiny_chat_model)


def test_detects_qwen_coder_fim_tokens(tokenizer):
    fim = detect_fim_tokens(tokenizer)
    assert fim is not None
    ids = {name: tokenizer.token_to_id(name) for name in FIM_NAMES}
    assert (fim.prefix, fim.middle, fim.suffix, fim.pad) == (
        ids["<|fim_prefix|>"],
        ids["<|fim_middle|>"],
        ids["<|fim_suffix|>"],
        ids["<|fim_pad|>"],
    )
    assert (fim.repo_name, fim.file_sep) == (ids["<|repo_name|>"], ids["<|file_sep|>"])
    assert fim.file_sep in fim.stop_ids and fim.pad in fim.stop_ids


@pytest.fixture(scope="module")
def no_fim_model(tiny_chat_model, tmp_path_factory):
    """The tiny model with its FIM markers renamed out of the tokenizer (ids kept, as padding entries)."""
    folder = tmp_path_factory.mktemp("no-fim") / "tiny-no-fim"
    shutil.copytree(tiny_chat_model, folder)
    backend = json.loads((folder / "tokenizer.json").read_text())
    vocab = backend["model"]["vocab"]
    for token in backend["added_tokens"]:
        if token["content"] in FIM_NAMES:
            vocab.pop(token["content"], None)
            token["content"] = f"[PAD{token['id']}]"
            vocab[token["content"]] = token["id"]
    (folder / "tokenizer.json").write_text(json.dumps(backend))
    return folder


def test_tokenizer_without_markers_has_no_fim(no_fim_model):
    tokenizer = Tokenizer.from_hf_dir(no_fim_model)
    assert tokenizer.token_to_id("<|fim_prefix|>") is None
    assert detect_fim_tokens(tokenizer) is None


def test_fim_prompt_layout(tokenizer):
    fim = detect_fim_tokens(tokenizer)

    def enc(text):
        return tokenizer.encode(text, add_special_tokens=False)

    ids = fim_prompt_ids(tokenizer, fim, PREFIX, SUFFIX, middle_start="return")
    assert ids == [fim.prefix, *enc(PREFIX), fim.suffix, *enc(SUFFIX), fim.middle, *enc("return")]
    assert tokenizer.decode(ids) == f"<|fim_prefix|>{PREFIX}<|fim_suffix|>{SUFFIX}<|fim_middle|>return"
    extra = [ExtraFile("util.py", "X = 1"), ExtraFile("b.py", "")]
    repo = fim_prompt_ids(tokenizer, fim, PREFIX, SUFFIX, extra_files=extra, repo_name="proj")
    assert tokenizer.decode(repo) == (
        "<|repo_name|>proj\n<|file_sep|>util.py\nX = 1\n<|file_sep|>b.py\n\n<|file_sep|>\n"
        f"<|fim_prefix|>{PREFIX}<|fim_suffix|>{SUFFIX}<|fim_middle|>"
    )


def test_markers_typed_in_code_stay_text(tokenizer):
    """A marker spelled inside the user's code is text for the FIM layout: the three marker ids appear once."""
    fim = detect_fim_tokens(tokenizer)
    ids = fim_prompt_ids(tokenizer, fim, "x = 1  # prefix\n", "y = 2\n")
    assert [ids.count(t) for t in (fim.prefix, fim.suffix, fim.middle)] == [1, 1, 1]


class _NoFimService:
    """What the FIM paths ask of a ready service whose model has no FIM markers."""

    model_name = "plain"
    fim_tokens = None

    def require_ready(self):
        return None

    def check_model(self, requested, param="model"):
        return None


def test_model_without_fim_is_a_clear_400_in_each_route():
    """Each protocol's request path refuses before building a prompt; the error renders in its own shape
    (the live check of the same is `slow`: a second server costs ~30 s to start on CPU)."""
    from ember.server.llamacpp_infill import prepare_infill
    from ember.server.ollama_generate import _generate_prompt
    from ember.server.openai_completions import prepare_completion

    calls = {
        "openai": lambda s: prepare_completion(s, {"prompt": PREFIX, "suffix": SUFFIX}),
        "ollama": lambda s: _generate_prompt(s, {"prompt": PREFIX, "suffix": SUFFIX}, "plain"),
        "infill": lambda s: prepare_infill(s, {"input_prefix": PREFIX, "input_suffix": SUFFIX}),
    }
    for name, call in calls.items():
        with pytest.raises(ApiError) as caught:
            call(_NoFimService())
        assert caught.value.status == 400 and "fill-in-the-middle" in caught.value.message, name
    assert error_body("ollama", caught.value) == {"error": caught.value.message}
    openai_shape = error_body("openai", caught.value)["error"]
    assert openai_shape["type"] == "invalid_request_error" and openai_shape["param"] == "input_prefix"
    with pytest.raises(ApiError):
        require_fim(_NoFimService(), "suffix")


# ---- live servers ---------------------------------------------------------------------------------


def expected_prompt_tokens(tokenizer, prefix=PREFIX, suffix=SUFFIX, **kwargs) -> int:
    return len(fim_prompt_ids(tokenizer, detect_fim_tokens(tokenizer), prefix, suffix, **kwargs))


def test_openai_completions_with_suffix(server, tokenizer):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    reply = client.completions.create(model=model, prompt=PREFIX, suffix=SUFFIX, max_tokens=3, temperature=0, echo=True)
    assert reply.usage.prompt_tokens == expected_prompt_tokens(tokenizer)
    assert reply.usage.completion_tokens <= 3
    assert reply.choices[0].text.startswith(PREFIX)  # echo gives back the prompt (the prefix) only
    assert reply.choices[0].finish_reason in ("stop", "length")
    chunks = list(
        client.completions.create(model=model, prompt=PREFIX, suffix=SUFFIX, max_tokens=3, temperature=0, stream=True)
    )
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert streamed == reply.choices[0].text[len(PREFIX) :]
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=model, prompt=[1, 2, 3], suffix=SUFFIX, max_tokens=1)
    assert caught.value.body["param"] == "prompt"


def test_ollama_generate_with_suffix(server, tokenizer):
    client = ollama.Client(host=server.url, timeout=300)
    name = client.list().models[0].model
    reply = client.generate(model=name, prompt=PREFIX, suffix=SUFFIX, options={"num_predict": 3, "temperature": 0})
    assert reply.prompt_eval_count == expected_prompt_tokens(tokenizer)
    assert 1 <= reply.eval_count <= 3
    assert reply.context[: reply.prompt_eval_count] == fim_prompt_ids(
        tokenizer, detect_fim_tokens(tokenizer), PREFIX, SUFFIX
    )


def test_llamacpp_infill(server, tokenizer):
    extra = [{"filename": "util.py", "text": "def helper():\n    return 1\n"}]
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": extra, "prompt": "ret", "n_predict": 3}
    reply = httpx.post(server.url + "/infill", json={**body, "temperature": 0}, timeout=300)
    assert reply.status_code == 200, reply.text
    result = reply.json()
    files = [ExtraFile("util.py", extra[0]["text"])]
    expected = expected_prompt_tokens(tokenizer, extra_files=files, middle_start="ret")
    assert result["tokens_evaluated"] == expected
    assert result["stop"] is True and 1 <= result["tokens_predicted"] <= 3
    assert result["stop_type"] in ("eos", "limit")
    with httpx.stream("POST", server.url + "/infill", json={**body, "temperature": 0, "stream": True}) as streamed:
        events = [json.loads(line[6:]) for line in streamed.iter_lines() if line.startswith("data: ")]
    assert events[-1]["stop"] is True and all(e["stop"] is False for e in events[:-1])
    assert "".join(e["content"] for e in events) == result["content"]
    bad = httpx.post(server.url + "/infill", json={"input_prefix": "x", "input_extra": [{"text": 3}]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input_extra[0]"


@pytest.fixture(scope="module")
def no_fim_server(no_fim_model):
    from server_support import SERVER_ARGS, LiveServer

    live = LiveServer(no_fim_model, *SERVER_ARGS)
    yield live
    live.stop()


@pytest.mark.slow
def test_model_without_fim_tokens_answers_400_per_protocol(no_fim_server):
    url = no_fim_server.url
    model = httpx.get(url + "/api/tags").json()["models"][0]["model"]
    completion = httpx.post(
        url + "/v1/completions", json={"prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 1}, timeout=120
    )
    assert completion.status_code == 400
    error = completion.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "suffix"
    assert "fill-in-the-middle" in error["message"]
    generate = httpx.post(url + "/api/generate", json={"model": model, "prompt": PREFIX, "suffix": SUFFIX}, timeout=120)
    assert generate.status_code == 400 and "fill-in-the-middle" in generate.json()["error"]
    infill = httpx.post(url + "/infill", json={"input_prefix": PREFIX, "input_suffix": SUFFIX}, timeout=120)
    assert infill.status_code == 400 and "fill-in-the-middle" in infill.json()["error"]["message"]
    plain = httpx.post(url + "/v1/completions", json={"prompt": PREFIX, "max_tokens": 1}, timeout=120)
    assert plain.status_code == 200  # only FIM is refused

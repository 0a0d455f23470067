"""Ember's tokenizer against HF transformers' (fixtures from tools/dev/make_tokenizer_fixtures.py).

Fast tests use tiny synthetic GGUF vocabularies (tests/fixtures/tokenizer/synthetic.json, with
HF's converter output for them); `real_model` tests build the tokenizers of the two real GGUF
files from their metadata and compare with HF's tokenizer for the same files.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from ember.runtime.loading.formats.errors import CheckpointError
from ember.runtime.loading.text.tokenizer import IncrementalDetokenizer, Tokenizer
from ember.runtime.loading.text.tokenizer_gguf import byte_alphabet, derive_merges

FIXTURES = Path(__file__).parent / "fixtures" / "tokenizer"
REAL_MODELS = ("qwen2.5-coder-1.5b-instruct", "gemma-3-270m")
REPLACEMENT_CHAR = "\ufffd"


@cache
def load_fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))


def synthetic(name: str) -> tuple[Tokenizer, dict]:
    case = load_fixture("synthetic")["cases"][name]
    return Tokenizer.from_gguf_metadata(case["metadata"], f"<synthetic {name}>"), case


def stream(tokenizer: Tokenizer, ids: list[int], prompt_ids: list[int] = (), skip: bool = False) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, skip_special_tokens=skip)
    return [detok.push(i) for i in ids] + [detok.flush()]


# ---- synthetic vocabularies: every GGUF tokenizer family against HF's converter -----------------

SYNTHETIC = ("gpt2_qwen2", "gemma3_spm", "llama_spm")


@pytest.mark.parametrize("name", SYNTHETIC)
def test_synthetic_vocabularies_encode_and_decode_like_hf(name):
    tokenizer, case = synthetic(name)
    for entry in case["encode"]:
        ids = tokenizer.encode(entry["text"], add_special_tokens=False)
        assert ids == entry["ids_no_special"], entry["text"]
        assert tokenizer.decode(ids) == entry["decoded"], entry["text"]
        assert tokenizer.decode(ids, skip_special_tokens=True) == entry["decoded_skip_special"], entry["text"]


def test_byte_level_bpe_merges_words_and_keeps_special_tokens_whole():
    tokenizer, _ = synthetic("gpt2_qwen2")
    tid = tokenizer.token_to_id
    assert tokenizer.encode("hello world") == [tid("hello"), tid("Ġworld")]
    ids = tokenizer.encode("<|im_start|>user\n<tool_call>hello<|im_end|>")
    assert ids[0] == tid("<|im_start|>") and ids[-1] == tid("<|im_end|>") and tid("<tool_call>") in ids
    # CONTROL tokens are special and get skipped; USER_DEFINED ones (<tool_call>) are text.
    assert tokenizer.decode(ids, skip_special_tokens=True) == "user\n<tool_call>hello"
    assert not tokenizer.add_bos and tokenizer.encode("hello") == tokenizer.encode("hello", add_special_tokens=False)
    assert (tokenizer.bos_token, tokenizer.eos_token) == ("<|endoftext|>", "<|im_end|>")
    # EOS first, then <|endoftext|> found by name, like llama.cpp's end-of-generation set.
    assert tokenizer.eos_token_ids == (tid("<|im_end|>"), tid("<|endoftext|>"))


@pytest.mark.parametrize(
    "text",
    [
        "",
        "hello world",
        "  x\t\ty\n\n\n",
        "你好 🧑‍💻 👨‍👩‍👧‍👦 €",
        "<|endoftext|>a<|im_end|>",
    ],
)
def test_byte_level_bpe_round_trips_any_text(text):
    tokenizer, _ = synthetic("gpt2_qwen2")
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_gemma_style_sentencepiece_has_no_prefix_space_and_adds_bos():
    tokenizer, _ = synthetic("gemma3_spm")
    tid = tokenizer.token_to_id
    assert tokenizer.add_bos and tokenizer.bos_token == "<bos>"
    assert tokenizer.encode("hello world") == [tid("<bos>"), tid("hello"), tid("▁world")]
    assert tokenizer.encode("hello world", add_special_tokens=False) == [tid("hello"), tid("▁world")]
    # "€" has no token: it falls back to its three UTF-8 bytes, and decodes back.
    assert tokenizer.encode("€", add_special_tokens=False) == [tid("<0xE2>"), tid("<0x82>"), tid("<0xAC>")]
    assert tokenizer.decode(tokenizer.encode("a € b")) == "<bos>a € b"
    assert tokenizer.decode(tokenizer.encode("a € b"), skip_special_tokens=True) == "a € b"


def test_llama_style_sentencepiece_prefixes_a_space_only_at_the_start():
    tokenizer, _ = synthetic("llama_spm")
    tid = tokenizer.token_to_id
    assert tokenizer.encode("hello world", add_special_tokens=False) == [tid("▁hello"), tid("▁world")]
    assert tokenizer.encode("hello") == [tid("<s>"), tid("▁hello")]  # BOS by llama.cpp's default
    assert tokenizer.decode(tokenizer.encode("hello world"), skip_special_tokens=True) == "hello world"


def test_derived_merges_go_best_rank_first_then_longer_left_part():
    tokens = ["a", "b", "c", "ab", "bc", "abc", "ca"]
    ranks = [0, 0, 0, -1, -1, -2, -1]
    # "ab", "bc" and "ca" tie on rank: file order. "abc" splits as ab+c and a+bc: longer left first.
    assert derive_merges(tokens, ranks) == [("a", "b"), ("b", "c"), ("c", "a"), ("ab", "c"), ("a", "bc")]


def test_byte_alphabet_is_gpt2s():
    alphabet = byte_alphabet()
    assert len(set(alphabet.values())) == 256
    assert (alphabet[ord("A")], alphabet[ord(" ")], alphabet[ord("\n")], alphabet[0]) == ("A", "Ġ", "Ċ", "Ā")


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"tokenizer.ggml.model": None}, "no tokenizer"),
        ({"tokenizer.ggml.model": "rwkv"}, "unsupported tokenizer.ggml.model"),
        ({"tokenizer.ggml.pre": "made-up"}, "unsupported tokenizer.ggml.pre"),
        ({"tokenizer.ggml.merges": None}, "needs tokenizer.ggml.merges"),
        ({"tokenizer.ggml.eos_token_id": 10**6}, "outside the vocabulary"),
        ({"tokenizer.ggml.token_type": [1, 1]}, "entries for"),
        ({"tokenizer.ggml.merges": ["h e l"]}, "not two tokens"),
        ({"tokenizer.ggml.merges": ["h zz"]}, "cannot build the tokenizer"),
    ],
)
def test_bad_gguf_metadata_raises_checkpoint_error_naming_the_file(change, problem):
    metadata = {**load_fixture("synthetic")["cases"]["gpt2_qwen2"]["metadata"], **change}
    metadata = {k: v for k, v in metadata.items() if v is not None}
    with pytest.raises(CheckpointError, match=problem) as caught:
        Tokenizer.from_gguf_metadata(metadata, "bad.gguf")
    assert str(caught.value).startswith("bad.gguf: ")


def test_with_extra_eos_adds_ids_once_and_rejects_unknown_ones():
    tokenizer, _ = synthetic("gemma3_spm")
    extra = tokenizer.with_extra_eos([tokenizer.token_to_id("<end_of_turn>"), tokenizer.eos_token_id])
    assert extra.eos_token_ids == (tokenizer.eos_token_id, tokenizer.token_to_id("<end_of_turn>"))
    assert tokenizer.eos_token_ids == (tokenizer.eos_token_id,) + tokenizer.eos_token_ids[1:]
    with pytest.raises(CheckpointError, match="outside the vocabulary"):
        tokenizer.with_extra_eos([10**7])


def test_from_hf_dir_reads_special_tokens_bos_setting_and_chat_template(tmp_path):
    source, _ = synthetic("gpt2_qwen2")
    source.backend.save(str(tmp_path / "tokenizer.json"))
    config = {
        "bos_token": {"content": "<|endoftext|>"},
        "eos_token": "<|im_end|>",
        "add_bos_token": True,
        "chat_template": [{"name": "default", "template": "{{ messages }}"}, {"name": "rag", "template": "x"}],
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = Tokenizer.from_hf_dir(tmp_path)
    tid = tokenizer.token_to_id
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (tid("<|endoftext|>"), tid("<|im_end|>"))
    assert tokenizer.add_bos and tokenizer.encode("hello") == [tid("<|endoftext|>"), tid("hello")]
    assert tokenizer.encode("hello", add_special_tokens=False) == [tid("hello")]
    assert tokenizer.eos_token_ids == (tid("<|im_end|>"), tid("<|endoftext|>"))
    assert tokenizer.chat_template == "{{ messages }}"
    (tmp_path / "chat_template.jinja").write_text("{{ bos_token }}")  # newer HF folders: this file wins
    assert Tokenizer.from_hf_dir(tmp_path).chat_template == "{{ bos_token }}"
    assert tokenizer.vocab_size == source.vocab_size


def test_from_hf_dir_without_tokenizer_json_is_a_checkpoint_error(tmp_path):
    with pytest.raises(CheckpointError, match="no tokenizer.json"):
        Tokenizer.from_hf_dir(tmp_path)


# ---- incremental detokenization -----------------------------------------------------------------


@pytest.mark.parametrize("name", SYNTHETIC)
def test_streaming_gives_decode_of_all_ids_and_never_half_a_character(name):
    tokenizer, case = synthetic(name)
    for entry in case["encode"]:
        ids = entry["ids_no_special"]
        chunks = stream(tokenizer, ids)
        assert "".join(chunks) == tokenizer.decode(ids), entry["text"]
        assert not any(REPLACEMENT_CHAR in chunk for chunk in chunks), entry["text"]


def test_streaming_holds_back_bytes_until_the_character_is_complete():
    tokenizer, _ = synthetic("gemma3_spm")
    bytes_of_euro = tokenizer.encode("€", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer)
    assert [detok.push(i) for i in [tokenizer.token_to_id("hello"), *bytes_of_euro]] == ["hello", "", "", "€"]
    detok.push(bytes_of_euro[0])  # a stream cut off mid-character: the rest is one U+FFFD
    assert detok.flush() == REPLACEMENT_CHAR


def test_streaming_writes_invalid_bytes_as_replacement_characters_once_text_follows():
    tokenizer, _ = synthetic("gemma3_spm")
    ids = [tokenizer.token_to_id(t) for t in ("hello", "<0xFF>", "▁world")]
    assert stream(tokenizer, ids) == ["hello", "", REPLACEMENT_CHAR + " world", ""]
    assert tokenizer.decode(ids) == "hello" + REPLACEMENT_CHAR + " world"


def test_streaming_after_a_prompt_keeps_the_space_before_the_first_word():
    tokenizer, _ = synthetic("llama_spm")
    prompt = tokenizer.encode("hello")
    world = tokenizer.token_to_id("▁world")
    assert stream(tokenizer, [world], prompt) == [" world", ""]
    assert stream(tokenizer, [world]) == ["world", ""]  # at the very start the decoder drops it


def test_streaming_can_skip_special_tokens():
    tokenizer, _ = synthetic("gpt2_qwen2")
    ids = tokenizer.encode("<|im_start|>hello<|im_end|>")
    assert "".join(stream(tokenizer, ids, skip=True)) == "hello"
    assert "".join(stream(tokenizer, ids)) == "<|im_start|>hello<|im_end|>"


# ---- the real GGUF files against HF's tokenizer for them ------------------------------------------


@cache
def real_tokenizer(model: str) -> Tokenizer:
    from ember.runtime.loading.formats.gguf_reader import GGUFFile
    from ember.runtime.loading.known_models import resolve_model

    path = resolve_model(model, progress=False)
    with GGUFFile(path, require_supported=False) as gguf:
        return Tokenizer.from_gguf_metadata(gguf.metadata, str(path))


@pytest.mark.real_model
@pytest.mark.parametrize("model", REAL_MODELS)
def test_real_gguf_tokenizer_encodes_and_decodes_like_hf(model):
    tokenizer, fixture = real_tokenizer(model), load_fixture(model)
    for entry in fixture["encode"]:
        text = entry["text"]
        assert tokenizer.encode(text) == entry["ids"], text
        assert tokenizer.encode(text, add_special_tokens=False) == entry["ids_no_special"], text
        assert tokenizer.decode(entry["ids"]) == entry["decoded"], text
        assert tokenizer.decode(entry["ids"], skip_special_tokens=True) == entry["decoded_skip_special"], text
        assert tokenizer.decode(entry["head_ids"]) == entry["head_decoded"], text
    for render in fixture["chat"]["renders"]:
        if "rendered" in render:
            assert tokenizer.encode(render["rendered"], add_special_tokens=False) == render["ids"], render["name"]


@pytest.mark.real_model
@pytest.mark.parametrize(
    ("model", "stop_tokens"),
    [
        ("qwen2.5-coder-1.5b-instruct", ("<|im_end|>", "<|endoftext|>")),
        ("gemma-3-270m", ("<eos>", "<end_of_turn>")),
    ],
)
def test_real_gguf_special_tokens_match_hf(model, stop_tokens):
    tokenizer, special = real_tokenizer(model), load_fixture(model)["special"]
    assert (tokenizer.bos_token, tokenizer.bos_token_id) == (special["bos_token"], special["bos_token_id"])
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == (special["eos_token"], special["eos_token_id"])
    assert (tokenizer.add_bos, tokenizer.vocab_size) == (special["add_bos"], special["vocab_size"])
    assert tokenizer.eos_token_ids == tuple(tokenizer.token_to_id(t) for t in stop_tokens)
    if special["gguf_has_chat_template"]:
        assert tokenizer.chat_template == load_fixture(model)["chat"]["template"]
    else:
        assert tokenizer.chat_template is None


@pytest.mark.real_model
@pytest.mark.parametrize("model", REAL_MODELS)
def test_real_gguf_streaming_matches_decode(model):
    tokenizer = real_tokenizer(model)
    for entry in load_fixture(model)["encode"]:
        for skip in (False, True):
            chunks = stream(tokenizer, entry["ids"], skip=skip)
            assert "".join(chunks) == tokenizer.decode(entry["ids"], skip_special_tokens=skip), entry["text"]
            assert not any(REPLACEMENT_CHAR in chunk for chunk in chunks), entry["text"]


@pytest.mark.real_model
def test_draft_model_tokenizer_is_the_default_models():
    """The 0.5B draft model verifies against the default model token by token: same vocabulary, same ids,
    same specials, and the same logit width (its lm head has as many rows)."""
    from ember.runtime.loading.formats.gguf_reader import GGUFFile
    from ember.runtime.loading.known_models import DEFAULT_MODEL, resolve_model

    draft, target = real_tokenizer("qwen2.5-coder-0.5b-instruct"), real_tokenizer(DEFAULT_MODEL)
    metadata, rows = {}, {}
    for name in ("qwen2.5-coder-0.5b-instruct", DEFAULT_MODEL):
        with GGUFFile(resolve_model(name, progress=False), require_supported=False) as gguf:
            metadata[name] = {k: v for k, v in gguf.metadata.items() if k.startswith("tokenizer.ggml.")}
            rows[name] = gguf.tensors["output.weight"].shape[0]
    assert metadata["qwen2.5-coder-0.5b-instruct"] == metadata[DEFAULT_MODEL]  # tokens, merges, types, specials
    assert rows["qwen2.5-coder-0.5b-instruct"] == rows[DEFAULT_MODEL] == draft.vocab_size == target.vocab_size
    assert (draft.eos_token_ids, draft.bos_token_id, draft.add_bos) == (
        target.eos_token_ids,
        target.bos_token_id,
        target.add_bos,
    )
    text = (FIXTURES.parent / "real" / "passage.txt").read_text(encoding="utf-8")
    text += "\n<|im_start|>user\ndef naïve_sum(xs: list[int]) -> int:  # ½ 日本語 🙂\n<|im_end|>"
    ids = target.encode(text)
    assert draft.encode(text) == ids and len(ids) > 500
    assert draft.decode(ids) == target.decode(ids) == text

"""runtime/loading/text/tokenizer_cache.py: a GGUF tokenizer's pipeline kept for the next start reads back as
the one built from the vocabulary; a changed checkpoint builds it again; a damaged file is rebuilt and
rewritten; a folder that cannot be written only costs the build (the tiny synthetic vocabularies of
tests/fixtures/tokenizer/synthetic.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ember.runtime.loading.text.tokenizer import Tokenizer
from ember.runtime.loading.text.tokenizer_cache import cached_backend

FIXTURE = Path(__file__).parent / "fixtures" / "tokenizer" / "synthetic.json"
TEXT = "Hello world,  <|im_end|> spaces   and ünïcode"


def _metadata(name: str) -> dict:
    return json.loads(FIXTURE.read_text(encoding="utf-8"))["cases"][name]["metadata"]


def _load(checkpoint: Path, root: Path, name: str, builds: list) -> Tokenizer:
    def cache(build):
        def counted():
            builds.append(1)
            return build()

        return cached_backend(checkpoint, root, counted)

    return Tokenizer.from_gguf_metadata(_metadata(name), str(checkpoint), cache=cache)


@pytest.mark.parametrize("name", ["gpt2_qwen2", "gemma3_spm"])
def test_a_kept_pipeline_reads_back_as_the_built_one(tmp_path, name):
    checkpoint = tmp_path / "model.gguf"
    checkpoint.write_bytes(b"GGUF one")
    built = Tokenizer.from_gguf_metadata(_metadata(name), "x")
    builds: list = []
    first = _load(checkpoint, tmp_path / "cache", name, builds)
    second = _load(checkpoint, tmp_path / "cache", name, builds)
    assert len(builds) == 1 and len(list((tmp_path / "cache").glob("*.json"))) == 1
    assert second.backend.to_str() == built.backend.to_str() == first.backend.to_str()
    assert second.encode(TEXT) == built.encode(TEXT)


def test_a_changed_checkpoint_builds_it_again(tmp_path):
    checkpoint = tmp_path / "model.gguf"
    checkpoint.write_bytes(b"GGUF one")
    builds: list = []
    _load(checkpoint, tmp_path / "cache", "gpt2_qwen2", builds)
    checkpoint.write_bytes(b"GGUF two")
    _load(checkpoint, tmp_path / "cache", "gpt2_qwen2", builds)
    assert len(builds) == 2


def test_a_damaged_file_is_rebuilt_and_rewritten(tmp_path, capsys):
    checkpoint = tmp_path / "model.gguf"
    checkpoint.write_bytes(b"GGUF one")
    builds: list = []
    _load(checkpoint, tmp_path / "cache", "gpt2_qwen2", builds)
    (kept,) = (tmp_path / "cache").glob("*.json")
    kept.write_text(kept.read_text()[:100])
    tokenizer = _load(checkpoint, tmp_path / "cache", "gpt2_qwen2", builds)
    assert "unreadable" in capsys.readouterr().err and len(builds) == 2
    assert tokenizer.encode(TEXT) == Tokenizer.from_gguf_metadata(_metadata("gpt2_qwen2"), "x").encode(TEXT)
    _load(checkpoint, tmp_path / "cache", "gpt2_qwen2", builds)
    assert len(builds) == 2  # the rewritten file read back


def test_an_unwritable_folder_only_costs_the_build(tmp_path, capsys):
    checkpoint = tmp_path / "model.gguf"
    checkpoint.write_bytes(b"GGUF one")
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    builds: list = []
    tokenizer = _load(checkpoint, blocker / "cache", "gpt2_qwen2", builds)
    assert "tokenizer not cached" in capsys.readouterr().err and len(builds) == 1
    assert tokenizer.encode(TEXT) == Tokenizer.from_gguf_metadata(_metadata("gpt2_qwen2"), "x").encode(TEXT)

"""The `ember` command's contract: text on stdout, summary on stderr, one-line errors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fixture_data import real_reference

from ember.tools.cli import main

ROOT = Path(__file__).resolve().parent.parent


def _ember(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ember.tools.cli", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


def test_compile_writes_plan_and_manifest(tmp_path, capsys):
    assert main(["compile", "--spec", str(ROOT / "specs/qwen3.toml"), "--target", "cpu", "--out", str(tmp_path)]) == 0
    manifest = json.loads((tmp_path / "cpu/qwen3/manifest.json").read_text())
    assert manifest["arch"] == "qwen3" and manifest["target"] == "cpu"
    assert "def forward(dims, params, state, batch):" in (tmp_path / "cpu/qwen3/plan.py").read_text()


def test_unknown_target_is_one_line_error(tmp_path, capsys):
    assert main(["compile", "--spec", str(ROOT / "specs/qwen3.toml"), "--target", "tpu9", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("ember: error:") and "unknown target 'tpu9'" in err and "\n" not in err


def test_missing_model_is_one_line_error(tmp_path, capsys):
    assert main(["generate", "--model", str(tmp_path / "nope.gguf"), "--prompt", "hi"]) == 1
    err = capsys.readouterr().err.strip()
    assert "not a known model" in err and "\n" not in err


def test_corrupt_gguf_is_one_line_error(tmp_path, capsys):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 8)
    assert main(["generate", "--model", str(bad), "--prompt", "hi"]) == 1
    err = capsys.readouterr().err.strip()
    assert str(bad) in err and "\n" not in err


def test_bad_arguments_exit_2():
    result = _ember("generate", "--prompt", "x", "--max-tokens", "0")
    assert result.returncode == 2 and "must be a positive integer" in result.stderr


@pytest.mark.real_model
def test_generate_prints_only_text_on_stdout(gemma_gguf):
    case = real_reference("gemma-3-270m")["greedy"][0]  # "The capital of France is"
    result = _ember(
        "generate", "--model", "gemma-3-270m", "--prompt", case["text"], "--max-tokens", "8", "--temperature", "0"
    )
    assert result.returncode == 0, result.stderr
    # Greedy text equals transformers' continuation (first 8 tokens), and nothing else is on stdout.
    from ember.runtime.loading.formats.gguf_reader import GGUFFile
    from ember.runtime.loading.text.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_gguf_metadata(GGUFFile(gemma_gguf).metadata, source=str(gemma_gguf))
    expected = tokenizer.decode(case["out_ids"][:8].tolist(), skip_special_tokens=True)
    assert result.stdout == expected + "\n"
    summary = result.stderr.strip().splitlines()[-1]
    assert "prompt tokens: " in summary and "generated tokens: 8" in summary and "tok/s" in summary

"""Write a stand-in HF tokenizer folder for the synthetic benchmark models (the device machine's `.gpu/tok`).

Random weights sample arbitrary ids, so a benchmark only needs a tokenizer that detokenizes every id of the
largest synthetic vocabulary (Qwen2.5's 151,936 rows; Llama-3's 128,256): a word-level vocabulary
`<t0> … <tN>` plus an end-of-sequence token. No real model's vocabulary is needed, nor any download.

    python -m ember.tools.dev.make_bench_tokenizer .gpu/tok
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers

VOCAB_SIZE = 152_064  # >= every synthetic shape's vocab (tools/bench_models.py SYNTHETIC_SHAPES)
EOS = "<eos>"


def write(folder: Path, vocab_size: int = VOCAB_SIZE) -> Path:
    vocab = {f"<t{i}>": i for i in range(vocab_size - 1)}
    vocab[EOS] = vocab_size - 1
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=EOS))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOS, "bos_token": None}))
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    write(parser.parse_args().folder)


if __name__ == "__main__":
    main()

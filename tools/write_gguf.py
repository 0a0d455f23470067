"""Write a synthetic checkpoint (`synthetic:<shape>[-q4_k_m]`, random weights at real shapes) to a GGUF file
that llama.cpp loads, so that llama.cpp and Ember are measured on the same tensors' layouts and types
(tools/dev/llamacpp_bench.py).

The file holds the checkpoint's metadata and tensors (runtime/loading/synthetic_gguf.py: llama.cpp's Q4_K_M
per-tensor types, or BF16 for a plain shape) and a GPT-2-style BPE vocabulary from an HF tokenizer.json,
fitted to the model's vocab size: cut (with the merges whose parts it lost) or padded with unused
tokens. llama.cpp's benches feed random token ids, so the vocabulary only has to load.

  python -m ember.tools.write_gguf synthetic:llama3-8b-q4_k_m --tokenizer DIR --out model.gguf
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFWriter
from gguf.constants import GGMLQuantizationType, TokenType


def synthetic_checkpoint(model_name: str, seed: int = 0):
    """(checkpoint, vocab size) of `synthetic:<shape>[-q4_k_m]`: the shape's bf16 layout when no format is named."""
    from ..compiler.spec import spec_for_arch
    from ..runtime.loading.synthetic_gguf import synthetic_gguf_checkpoint
    from .bench_models import SYNTHETIC_SHAPES, parse_synthetic

    shape, fmt = parse_synthetic(model_name)
    arch, config = SYNTHETIC_SHAPES[shape]
    checkpoint = synthetic_gguf_checkpoint(spec_for_arch(arch), config, scheme=fmt or "bf16", seed=seed)
    return checkpoint, int(config["vocab_size"])


def bpe_vocabulary(tokenizer_dir: Path, vocab_size: int) -> tuple[list[str], list[int], list[str]]:
    """(tokens by id, their GGUF token types, merges) from tokenizer.json, fitted to vocab_size ids."""
    data = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    model = data["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"{tokenizer_dir}: a BPE tokenizer.json is needed, not {model.get('type')!r}")
    by_id = {int(i): t for t, i in model["vocab"].items()}
    special = {int(t["id"]): t["content"] for t in data.get("added_tokens", ())}
    by_id.update(special)
    tokens, types = [], []
    for i in range(vocab_size):
        token = by_id.get(i, f"[PAD{i}]")
        tokens.append(token)
        types.append(
            int(TokenType.CONTROL if i in special else TokenType.USER_DEFINED if i not in by_id else TokenType.NORMAL)
        )
    return tokens, types, kept_merges(model.get("merges", ()), tokens)


def kept_merges(merges, tokens) -> list[str]:
    """The merges ("left right" strings or [left, right] pairs) whose two parts and result are all among
    `tokens`, as "left right" strings: what a vocabulary cut to `tokens` can still apply."""
    kept, out = set(tokens), []
    for merge in merges:
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        if left in kept and right in kept and left + right in kept:
            out.append(f"{left} {right}")
    return out


def write_gguf(checkpoint, tokenizer_dir: Path, vocab_size: int, path: Path) -> int:
    """Write the file; returns its size in bytes."""
    source = checkpoint._gguf  # runtime/synthetic_gguf._SyntheticGGUF: metadata, tensor infos, raw bytes
    arch = source.metadata["general.architecture"]
    writer = GGUFWriter(str(path), arch)
    for key, value in source.metadata.items():
        if key == "general.architecture":
            continue
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, float) or (isinstance(value, np.floating)):
            writer.add_float32(key, float(value))
        else:
            writer.add_uint32(key, int(value))
    tokens, types, merges = bpe_vocabulary(tokenizer_dir, vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_eos_token_id(vocab_size - 1)
    for name, info in source.tensors.items():
        # bytes shaped [*rows, row bytes]: gguf-py derives the element shape from the type's block size
        raw = source.raw(name).reshape(*(int(n) for n in info.shape[:-1]), -1)
        writer.add_tensor(name, raw, raw_dtype=GGMLQuantizationType(info.ggml_type))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.stat().st_size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="synthetic:<shape>[-q4_k_m]")
    parser.add_argument("--tokenizer", required=True, type=Path, help="an HF tokenizer folder (tokenizer.json)")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    checkpoint, vocab = synthetic_checkpoint(args.model, args.seed)
    size = write_gguf(checkpoint, args.tokenizer, vocab, args.out)
    print(json.dumps({"model": args.model, "path": str(args.out), "bytes": size}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Cut a real GGUF checkpoint down to its first layers and its first vocabulary ids, keeping every kept tensor's
bytes (and so its quantization) unchanged. The result is a small real-weight model that can travel to the GPU
machine (its working tree is capped at 64 MiB), where the engine agreement test runs the h200 target against
the cpu target on real weights: random weights put the top two logits within a bf16 step of each other at many
positions, real ones rarely do.

The model it makes computes what the whole checkpoint's first `layers` blocks compute, followed by the final
norm and the head restricted to ids below `vocab`; token ids at or above `vocab` cannot be fed to it.

  python -m ember.tools.dev.truncate_gguf MODEL.gguf --layers 1 --vocab 8192 --out small.gguf
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from ..write_gguf import kept_merges

_BLOCK = re.compile(r"^blk\.(\d+)\.")
# tensors whose leading (row) dimension is the vocabulary
_VOCAB_ROWS = ("token_embd.weight", "output.weight")
# per-token tokenizer arrays, cut with the vocabulary
_PER_TOKEN = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores")
_TOKEN_IDS = re.compile(r"^tokenizer\.ggml\.\w+_token_id$")


def _field_value(field):
    """The field's Python value and, for arrays, the element type (gguf-py's own decoding)."""
    kind = field.types[0]
    return field.contents(), kind, (field.types[-1] if kind == GGUFValueType.ARRAY else None)


def truncate_gguf(source: Path, out: Path, *, layers: int, vocab: int) -> dict:
    """Write the cut file; returns what was kept. Raises ValueError if the checkpoint has fewer layers or ids."""
    reader = GGUFReader(str(source))
    arch = reader.fields["general.architecture"].contents()
    block_key = f"{arch}.block_count"
    total_layers = int(reader.fields[block_key].contents())
    embedding = next(t for t in reader.tensors if t.name == "token_embd.weight")
    total_vocab = int(embedding.shape[-1])  # gguf-py lists shapes innermost first: [d_model, vocab]
    if not 1 <= layers <= total_layers:
        raise ValueError(f"{source}: it has {total_layers} layers; cannot keep {layers}")
    if not 1 <= vocab <= total_vocab:
        raise ValueError(f"{source}: its vocabulary has {total_vocab} ids; cannot keep {vocab}")

    writer = GGUFWriter(str(out), arch)
    tokens = None
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value, kind, sub_kind = _field_value(field)
        if key == block_key:
            value = layers
        elif key in _PER_TOKEN:
            value = value[:vocab]
            if key == "tokenizer.ggml.tokens":
                tokens = value
        elif key == "tokenizer.ggml.merges":
            continue  # written after the token list is known
        elif _TOKEN_IDS.match(key) and int(value) >= vocab:
            continue  # a special token that was cut away
        elif key.endswith(".vocab_size"):
            value = vocab
        writer.add_key_value(key, value, kind, sub_type=sub_kind)
    if "tokenizer.ggml.merges" in reader.fields:
        merges = kept_merges(reader.fields["tokenizer.ggml.merges"].contents(), tokens or ())
        writer.add_key_value("tokenizer.ggml.merges", merges, GGUFValueType.ARRAY, sub_type=GGUFValueType.STRING)

    kept_names = []
    for tensor in reader.tensors:
        block = _BLOCK.match(tensor.name)
        if block and int(block.group(1)) >= layers:
            continue
        raw = np.asarray(tensor.data)
        if tensor.name in _VOCAB_ROWS:
            raw = raw[:vocab]  # one row per vocabulary id, whatever the row's quantized byte length
        # gguf-py takes quantized data as bytes shaped [*rows, row bytes] and float data as elements
        writer.add_tensor(tensor.name, raw, raw_dtype=tensor.tensor_type)
        kept_names.append(tensor.name)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {
        "source": str(source),
        "path": str(out),
        "bytes": out.stat().st_size,
        "layers": layers,
        "of_layers": total_layers,
        "vocab": vocab,
        "of_vocab": total_vocab,
        "tensors": len(kept_names),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path, help="a GGUF checkpoint")
    parser.add_argument("--layers", type=int, required=True, help="how many leading blocks to keep")
    parser.add_argument("--vocab", type=int, required=True, help="how many leading vocabulary ids to keep")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        print(json.dumps(truncate_gguf(args.source, args.out, layers=args.layers, vocab=args.vocab)))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The synthetic tokenizers' fixture (a GPT-2 style byte-level BPE and SentencePiece-style vocabularies built in
memory, as GGUF metadata describes them), for tools/dev/make_tokenizer_fixtures.py; like that script it imports
nothing from Ember (it runs in the Python 3.11 env with transformers)."""

from __future__ import annotations

import tokenizers
import transformers

SYNTHETIC_CORPUS = [
    "",
    " ",
    "hello world",
    "  hello  world  ",
    "the hello, the world!",
    "你好 world\n\nthe end",
    "<|im_start|>user\nhello<|im_end|>\n",
    "<start_of_turn>user\nhello<end_of_turn>\n<s>the</s>",
    "<tool_call>the</tool_call>",
    "emoji 🧑‍💻 and € fall back to bytes",
    "tabs\tand\nnewlines\n\n\n end",
]


def gpt2_alphabet() -> dict[int, str]:
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    table.update({b: chr(0x100 + i) for i, b in enumerate(b for b in range(256) if b not in table)})
    return dict(sorted(table.items()))


def synthetic_gpt2() -> dict:
    alphabet = gpt2_alphabet()
    spell = lambda text: "".join(alphabet[b] for b in text.encode("utf-8"))  # noqa: E731
    pairs = [
        ("Ġ", "Ġ"),
        ("h", "e"),
        ("l", "l"),
        ("he", "ll"),
        ("hell", "o"),
        ("Ġ", "w"),
        ("o", "r"),
        ("Ġw", "or"),
        ("l", "d"),
        ("Ġwor", "ld"),
        ("Ċ", "Ċ"),
        ("t", "he"),
        ("Ġ", "the"),
        ("Ġ", "hello"),
        (spell("你")[:1], spell("你")[1:2]),
        (spell("你")[:2], spell("你")[2:]),
    ]
    merged = [left + right for left, right in pairs]
    specials = [
        ("<|endoftext|>", 3),
        ("<|im_start|>", 3),
        ("<|im_end|>", 3),
        ("<tool_call>", 4),
        ("</tool_call>", 4),
        ("[PAD300]", 5),
    ]
    tokens = list(alphabet.values()) + merged + [t for t, _ in specials]
    return {
        "general.architecture": "qwen2",
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [1] * (len(tokens) - len(specials)) + [k for _, k in specials],
        "tokenizer.ggml.merges": [f"{left} {right}" for left, right in pairs],
        "tokenizer.ggml.bos_token_id": tokens.index("<|endoftext|>"),
        "tokenizer.ggml.eos_token_id": tokens.index("<|im_end|>"),
        "tokenizer.ggml.padding_token_id": tokens.index("<|endoftext|>"),
        "tokenizer.ggml.add_bos_token": False,
    }


def synthetic_sentencepiece(architecture: str) -> dict:
    """Gemma-style (no space prefix, runs of spaces spelled with spaces) or Llama-style."""
    if architecture == "gemma3":
        head = [
            ("<pad>", 3),
            ("<eos>", 3),
            ("<bos>", 3),
            ("<unk>", 3),
            ("<start_of_turn>", 3),
            ("<end_of_turn>", 3),
            ("\n", 4),
            ("\n\n", 4),
            ("  ", 4),
            ("   ", 4),
            ("\t", 4),
        ]
    else:
        head = [("<unk>", 2), ("<s>", 3), ("</s>", 3)]
    pieces = [
        "▁",
        "h",
        "e",
        "l",
        "o",
        "w",
        "r",
        "d",
        "t",
        ",",
        "!",
        "你",
        "好",
        "he",
        "ll",
        "hell",
        "hello",
        "▁w",
        "or",
        "▁wor",
        "ld",
        "▁world",
        "▁t",
        "▁the",
        "▁h",
        "ello",
        "▁hello",
        "th",
        "the",
    ]
    tokens = [t for t, _ in head] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    types = [k for _, k in head] + [6] * 256 + [1] * len(pieces)
    # Scores with ties, so tie-breaking between merges shows; Gemma's converter ignores them.
    scores = [0.0] * (len(head) + 256) + [-float(i // 3) for i in range(len(pieces))]
    metadata = {
        "general.architecture": architecture,
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.bos_token_id": tokens.index("<bos>" if architecture == "gemma3" else "<s>"),
        "tokenizer.ggml.eos_token_id": tokens.index("<eos>" if architecture == "gemma3" else "</s>"),
        "tokenizer.ggml.unknown_token_id": tokens.index("<unk>"),
    }
    if architecture == "gemma3":
        metadata["tokenizer.ggml.add_space_prefix"] = False
    return metadata


def synthetic_fixture() -> dict:
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer

    cases = {}
    for name, metadata in (
        ("gpt2_qwen2", synthetic_gpt2()),
        ("gemma3_spm", synthetic_sentencepiece("gemma3")),
        ("llama_spm", synthetic_sentencepiece("llama")),
    ):
        # What HF's get_gguf_tokenizer hands the converter: the tokenizer keys, renamed.
        tokenizer_dict = {
            new: metadata[f"tokenizer.{old}"]
            for old, new in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
            if f"tokenizer.{old}" in metadata
        }
        backend, _ = convert_gguf_tokenizer(metadata["general.architecture"], tokenizer_dict)
        encodes = []
        for text in SYNTHETIC_CORPUS:
            ids = backend.encode(text, add_special_tokens=False).ids
            encodes.append(
                {
                    "text": text,
                    "ids_no_special": ids,
                    "decoded": backend.decode(ids, skip_special_tokens=False),
                    "decoded_skip_special": backend.decode(ids, skip_special_tokens=True),
                }
            )
        cases[name] = {"metadata": metadata, "encode": encodes}
    return {
        "header": {
            "reference": (
                f"transformers {transformers.__version__} (tokenizers {tokenizers.__version__}): "
                "convert_gguf_tokenizer(architecture, <the metadata's tokenizer keys>), the converter "
                "AutoTokenizer uses for GGUF files, without its BOS/EOS post-processing"
            ),
            "generated_by": "tools/dev/make_tokenizer_fixtures.py",
        },
        "cases": cases,
    }

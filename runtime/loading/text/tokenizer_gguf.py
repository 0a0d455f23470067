"""Build a `tokenizers.Tokenizer` from the vocabulary a GGUF file stores in its metadata.

A GGUF has no `tokenizer.json`: llama.cpp keeps the vocabulary under `tokenizer.ggml.*` keys.
Two families are rebuilt here, matching what HF transformers builds from the same file (its
reference output is in tests/fixtures/tokenizer/) and what llama.cpp does when it runs it:

- `gpt2`: byte-level BPE. Text is split by the regex named in `tokenizer.ggml.pre` (Qwen2's,
  Llama 3's, or GPT-2's own), each piece is spelled in GPT-2's 256-character byte alphabet and
  merged with the file's merge list.
- `llama`: SentencePiece-style BPE. Spaces become "▁", pieces merge by rank, and characters with
  no token fall back to `<0xXX>` byte tokens. The file carries no merges, so they are derived from
  the vocabulary: every split of a token into two tokens is a merge, the better ranked token
  merging first. Rank is the token's score, except for Gemma, whose scores do not follow its
  merge order while its token order does.

Token types (`tokenizer.ggml.token_type`) decide what is matched whole in raw text: CONTROL
tokens (`<|im_end|>`, `<end_of_turn>`) become special added tokens, USER_DEFINED ones (`<tool_call>`,
Gemma's runs of newlines and tabs) plain added tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers.models import BPE

from ember.runtime.loading.formats.errors import CheckpointError

# llama.cpp's llama_token_type values, as stored in tokenizer.ggml.token_type.
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

SPACE_MARK = "\u2581"  # "▁": SentencePiece's spelling of a space

# Pre-tokenizer regexes (named by `tokenizer.ggml.pre`) that split text before byte-level BPE.
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLIT_BY_PRE = {
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
}
# These mean "GPT-2's own split", which ByteLevel applies when asked to use its regex.
_GPT2_PRES = (None, "default", "gpt2", "gpt-2")

# Architectures whose SentencePiece vocabulary ranks merges by token order and writes runs of
# spaces with real spaces (HF's Gemma conversion; llama.cpp matches those runs as user tokens).
_GEMMA_ARCHITECTURES = ("gemma", "gemma2", "gemma3", "gemma3n")


@dataclass(frozen=True)
class GGUFVocab:
    """The tokenizer part of a GGUF's metadata, checked and with llama.cpp's defaults applied."""

    source: str  # the file, for error messages
    architecture: str  # general.architecture
    model: str  # tokenizer.ggml.model: "gpt2" or "llama"
    pre: str | None  # tokenizer.ggml.pre
    tokens: tuple[str, ...]  # token text by id
    token_types: tuple[int, ...]  # llama.cpp token type by id (NORMAL when the file has none)
    merges: tuple[str, ...] | None  # "left right" strings, best first (gpt2 only)
    scores: tuple[float, ...] | None  # SentencePiece scores by id (llama only)
    bos_id: int | None
    eos_id: int | None
    eot_id: int | None  # end of turn (tokenizer.ggml.eot_token_id)
    eom_id: int | None  # end of message (tokenizer.ggml.eom_token_id)
    unk_id: int | None
    pad_id: int | None
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool  # SentencePiece: prepend "▁" to the text (not Gemma)
    chat_template: str | None


def read_gguf_vocab(metadata: Mapping[str, Any], source: str) -> GGUFVocab:
    """Validate the `tokenizer.*` keys of `metadata`; raise CheckpointError naming `source`."""

    def fail(problem: str) -> CheckpointError:
        return CheckpointError(source, problem)

    def get(key: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
        value = metadata.get(key, default)
        if value is not None and not isinstance(value, kind):
            raise fail(f"metadata {key} should be {kind}, got {type(value).__name__}")
        return value

    model = get("tokenizer.ggml.model", str)
    if model is None:
        raise fail("no tokenizer in the GGUF metadata (tokenizer.ggml.model is missing)")
    if model not in ("gpt2", "llama"):
        raise fail(f"unsupported tokenizer.ggml.model {model!r} (supported: 'gpt2', 'llama')")
    tokens = get("tokenizer.ggml.tokens", list)
    if not tokens or not all(isinstance(t, str) for t in tokens):
        raise fail("tokenizer.ggml.tokens is missing, empty or not a list of strings")
    n = len(tokens)
    token_types = get("tokenizer.ggml.token_type", list) or [NORMAL] * n
    merges = get("tokenizer.ggml.merges", list)
    scores = get("tokenizer.ggml.scores", list)
    for key, values in (("token_type", token_types), ("scores", scores)):
        if values is not None and len(values) != n:
            raise fail(f"tokenizer.ggml.{key} has {len(values)} entries for {n} tokens")
    if model == "gpt2" and merges is None:
        raise fail("a gpt2 (byte-level BPE) tokenizer needs tokenizer.ggml.merges")
    if model == "llama" and scores is None:
        raise fail("a llama (SentencePiece) tokenizer needs tokenizer.ggml.scores")

    def token_id(name: str) -> int | None:
        value = get(f"tokenizer.ggml.{name}_token_id", int)
        if value is not None and not 0 <= value < n:
            raise fail(f"tokenizer.ggml.{name}_token_id {value} is outside the vocabulary of {n} tokens")
        return value

    architecture = get("general.architecture", str, "")
    # llama.cpp adds BOS to a SentencePiece vocabulary that does not say otherwise, not to BPE ones.
    add_bos = get("tokenizer.ggml.add_bos_token", bool, model == "llama")
    return GGUFVocab(
        source=source,
        architecture=architecture,
        model=model,
        pre=get("tokenizer.ggml.pre", str),
        tokens=tuple(tokens),
        token_types=tuple(int(t) for t in token_types),
        merges=tuple(merges) if merges is not None else None,
        scores=tuple(float(s) for s in scores) if scores is not None else None,
        bos_id=token_id("bos"),
        eos_id=token_id("eos"),
        eot_id=token_id("eot"),
        eom_id=token_id("eom"),
        unk_id=token_id("unknown"),
        pad_id=token_id("padding"),
        add_bos=add_bos,
        add_eos=get("tokenizer.ggml.add_eos_token", bool, False),
        add_space_prefix=get("tokenizer.ggml.add_space_prefix", bool, architecture not in _GEMMA_ARCHITECTURES),
        chat_template=get("tokenizer.chat_template", str),
    )


def build_backend(vocab: GGUFVocab) -> BackendTokenizer:
    """The `tokenizers` pipeline the vocabulary describes, with BOS/EOS added as the file says."""
    try:
        backend = _byte_level_bpe(vocab) if vocab.model == "gpt2" else _sentencepiece_bpe(vocab)
        _add_whole_tokens(backend, vocab)
        backend.post_processor = _bos_eos_processor(vocab)
    except Exception as error:  # tokenizers raises plain Exceptions for bad vocabularies
        if isinstance(error, CheckpointError):
            raise
        raise CheckpointError(vocab.source, f"cannot build the tokenizer: {error}") from error
    return backend


# ---- byte-level BPE (tokenizer.ggml.model = "gpt2") ---------------------------------------------


def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> character table: printable Latin-1 bytes stand for themselves, the other
    68 (controls, space, soft hyphen...) take the characters from U+0100 up, in byte order."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    shifted = (b for b in range(256) if b not in table)
    table.update({b: chr(0x100 + i) for i, b in enumerate(shifted)})
    return dict(sorted(table.items()))


def _byte_level_bpe(vocab: GGUFVocab) -> BackendTokenizer:
    alphabet = byte_alphabet()
    letters = set(alphabet.values())

    def spelled(token: str) -> str:
        # Byte-level tokens are written in the byte alphabet; a token that is not (a mislabelled
        # special token with a real space, say) is respelled from its UTF-8 bytes.
        if set(token) <= letters:
            return token
        return "".join(alphabet[b] for b in token.encode("utf-8", "surrogateescape"))

    ids = {spelled(token): i for i, token in enumerate(vocab.tokens)}
    merges = []
    for rank, merge in enumerate(vocab.merges or ()):
        parts = merge.split(" ")
        if len(parts) != 2:
            raise CheckpointError(vocab.source, f"merge #{rank} {merge!r} is not two tokens separated by a space")
        merges.append((parts[0], parts[1]))
    backend = BackendTokenizer(
        BPE(
            vocab=ids,
            merges=merges,
            dropout=None,
            unk_token=None,
            fuse_unk=False,
            byte_fallback=False,
            continuing_subword_prefix="",
            end_of_word_suffix="",
        )
    )
    if vocab.pre in _SPLIT_BY_PRE:
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_SPLIT_BY_PRE[vocab.pre]), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    elif vocab.pre in _GPT2_PRES:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        known = ", ".join(sorted(_SPLIT_BY_PRE) + [p for p in _GPT2_PRES if p])
        raise CheckpointError(vocab.source, f"unsupported tokenizer.ggml.pre {vocab.pre!r} (supported: {known})")
    backend.decoder = decoders.ByteLevel()
    return backend


# ---- SentencePiece-style BPE (tokenizer.ggml.model = "llama") -----------------------------------


def _sentencepiece_bpe(vocab: GGUFVocab) -> BackendTokenizer:
    gemma = vocab.architecture in _GEMMA_ARCHITECTURES
    tokens = list(vocab.tokens)
    if gemma:
        # Gemma stores its tokens for runs of spaces with real spaces; the model sees "▁▁...".
        tokens = [SPACE_MARK * len(t) if " " in t and not t.strip() else t for t in tokens]
    ranks = [-i for i in range(len(tokens))] if gemma else list(vocab.scores or ())
    ids = {token: i for i, token in enumerate(tokens)}
    unk = tokens[vocab.unk_id] if vocab.unk_id is not None else ("<unk>" if "<unk>" in ids else None)
    backend = BackendTokenizer(
        BPE(
            vocab=ids,
            merges=derive_merges(tokens, ranks),
            dropout=None,
            unk_token=unk,
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    steps = [decoders.Replace(SPACE_MARK, " "), decoders.ByteFallback(), decoders.Fuse()]
    if vocab.add_space_prefix:
        # Llama-style: "▁" before the text (not after each special token), and the decoder
        # drops that one space again.
        backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE_MARK, prepend_scheme="first", split=False)
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    else:
        backend.normalizer = normalizers.Replace(" ", SPACE_MARK)
    backend.decoder = decoders.Sequence(steps)
    return backend


def derive_merges(tokens: Sequence[str], ranks: Sequence[float]) -> list[tuple[str, str]]:
    """Merges implied by a vocabulary: each split of a token into two tokens, best rank first.

    Ties (equal rank) go to the split with the longer left part, then the longer right part,
    then to the token listed first -- the order HF's converter produces, so both derive the
    same merge list.
    """
    ids: dict[str, int] = {}
    for i, token in enumerate(tokens):
        ids.setdefault(token, i)
    rank_of = {token: ranks[i] for i, token in enumerate(tokens)}  # a repeated token keeps its last rank
    found = []  # (-rank, -len(left), -len(right), order found, left, right): sorts best first
    for token in ids:
        size, rank = len(token), -rank_of[token]
        for cut in range(1, size):
            left, right = token[:cut], token[cut:]
            if left in ids and right in ids:
                found.append((rank, -cut, cut - size, len(found), left, right))
    found.sort()
    return [(found_merge[4], found_merge[5]) for found_merge in found]


# ---- pieces both families share -----------------------------------------------------------------


def _add_whole_tokens(backend: BackendTokenizer, vocab: GGUFVocab) -> None:
    """Match CONTROL tokens whole as special tokens and USER_DEFINED ones as plain added tokens,
    on the raw text (before "▁" or byte spelling) -- otherwise they would be cut into pieces."""
    known = backend.get_vocab()
    letters = set(byte_alphabet().values()) if vocab.model == "gpt2" else None
    control, user = [], []
    for token, kind in zip(vocab.tokens, vocab.token_types, strict=True):
        if kind == CONTROL and (letters is None or set(token) <= letters):
            control.append(AddedToken(token, special=True, normalized=False))
        elif kind == USER_DEFINED and token in known:
            user.append(AddedToken(token, special=False, normalized=False))
    backend.add_special_tokens(control)
    backend.add_tokens(user)


def _bos_eos_processor(vocab: GGUFVocab) -> processors.TemplateProcessing:
    bos = vocab.tokens[vocab.bos_id] if vocab.add_bos and vocab.bos_id is not None else None
    eos = vocab.tokens[vocab.eos_id] if vocab.add_eos and vocab.eos_id is not None else None
    single = " ".join(filter(None, [bos and f"{bos}:0", "$A:0", eos and f"{eos}:0"]))
    pair = " ".join(filter(None, [single, bos and f"{bos}:1", "$B:1", eos and f"{eos}:1"]))
    specials = [(t, i) for t, i in ((bos, vocab.bos_id), (eos, vocab.eos_id)) if t is not None]
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)

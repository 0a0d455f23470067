"""Ember's tokenizer: text <-> token ids, built from a HF folder or from a GGUF's metadata.

The work is done by the `tokenizers` library (Rust); this class adds what the engine needs
around it: which ids end generation, whether a prompt starts with BOS, the special token
strings and the chat template the model ships with.

`IncrementalDetokenizer` turns a stream of generated ids into text pieces for streaming
responses, never emitting half a UTF-8 character.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, processors
from tokenizers import Tokenizer as BackendTokenizer

from ember.runtime.loading.formats.errors import CheckpointError
from ember.runtime.loading.text.tokenizer_gguf import CONTROL, build_backend, read_gguf_vocab

# Tokens that end a turn in common chat formats. Like llama.cpp, a vocabulary that has one of
# these as a special token stops generation on it too, besides the declared EOS: an instruct
# Qwen says EOS is <|im_end|> but may also end with <|endoftext|>, Gemma ends turns with
# <end_of_turn> while its EOS is <eos>.
END_OF_GENERATION_NAMES = frozenset(
    {
        "<|im_end|>",
        "<|endoftext|>",
        "<end_of_turn>",
        "<|eot_id|>",
        "<|eom_id|>",
        "<|end|>",
        "<|end_of_text|>",
        "<EOT>",
        "<|return|>",
    }
)

REPLACEMENT_CHAR = "\ufffd"  # what a decoder writes for bytes that are not (yet) a whole character


@dataclass(frozen=True)
class SpecialIds:
    bos_token_id: int | None
    eos_token_id: int | None  # the model's own EOS; its text is `eos_token` in chat templates
    eos_token_ids: tuple[int, ...]  # every id that ends generation, EOS first
    add_bos: bool  # encode(add_special_tokens=True) starts with BOS


class Tokenizer:
    """Encode and decode with a model's tokenizer. Build it with `from_hf_dir` or `from_gguf_metadata`."""

    def __init__(self, backend: BackendTokenizer, special: SpecialIds, *, chat_template: str | None, source: str):
        self._backend = backend
        self.special = special
        self.chat_template = chat_template
        self.source = source

    # ---- construction ------------------------------------------------------------------------

    @classmethod
    def from_gguf_metadata(
        cls, metadata: Mapping[str, Any], source: str, cache: Callable[[Callable], BackendTokenizer] | None = None
    ) -> Tokenizer:
        """The tokenizer a GGUF describes (`metadata` as GGUFFile(path).metadata gives it); cache(build) gives
        the `tokenizers` pipeline build() makes, or one it kept (tokenizer_cache.py)."""
        vocab = read_gguf_vocab(metadata, source)
        backend = build_backend(vocab) if cache is None else cache(lambda: build_backend(vocab))
        declared = [i for i in (vocab.eos_id, vocab.eot_id, vocab.eom_id) if i is not None]
        by_name = [
            i
            for i, (token, kind) in enumerate(zip(vocab.tokens, vocab.token_types, strict=True))
            if kind == CONTROL and token in END_OF_GENERATION_NAMES
        ]
        special = SpecialIds(
            bos_token_id=vocab.bos_id,
            eos_token_id=vocab.eos_id,
            eos_token_ids=_unique(declared + by_name),
            add_bos=vocab.add_bos and vocab.bos_id is not None,
        )
        return cls(backend, special, chat_template=vocab.chat_template, source=source)

    @classmethod
    def from_hf_dir(cls, path: str | Path) -> Tokenizer:
        """A HF tokenizer folder: tokenizer.json, plus tokenizer_config.json (special tokens, BOS,
        chat template) and chat_template.jinja / chat_template.json where present."""
        folder = Path(path)
        tokenizer_file = folder / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise CheckpointError(folder, "no tokenizer.json in the folder")
        try:
            backend = BackendTokenizer.from_file(str(tokenizer_file))
        except Exception as error:  # tokenizers raises plain Exceptions for unreadable files
            raise CheckpointError(tokenizer_file, f"cannot read the tokenizer: {error}") from error
        config = _read_json(folder / "tokenizer_config.json") or {}
        _add_config_added_tokens(backend, config)
        bos = _token_text(config.get("bos_token"))
        eos = _token_text(config.get("eos_token"))
        if bos is None or eos is None:  # older folders keep them in special_tokens_map.json
            special_map = _read_json(folder / "special_tokens_map.json") or {}
            bos = bos if bos is not None else _token_text(special_map.get("bos_token"))
            eos = eos if eos is not None else _token_text(special_map.get("eos_token"))
        bos_id = backend.token_to_id(bos) if bos is not None else None
        eos_id = backend.token_to_id(eos) if eos is not None else None
        add_bos = _settle_bos_eos(backend, config, bos, bos_id, eos, eos_id)
        added = backend.get_added_tokens_decoder()
        by_name = sorted(i for i, t in added.items() if t.special and t.content in END_OF_GENERATION_NAMES)
        special = SpecialIds(
            bos_token_id=bos_id,
            eos_token_id=eos_id,
            eos_token_ids=_unique(([eos_id] if eos_id is not None else []) + by_name),
            add_bos=add_bos,
        )
        return cls(backend, special, chat_template=_hf_chat_template(folder, config), source=str(folder))

    def with_extra_eos(self, ids: Iterable[int]) -> Tokenizer:
        """A copy that also stops on `ids` (e.g. generation_config.json's eos_token_id list)."""
        extra = [int(i) for i in ids]
        bad = [i for i in extra if not 0 <= i < self.vocab_size]
        if bad:
            raise CheckpointError(self.source, f"end-of-generation ids {bad} are outside the vocabulary")
        special = replace(self.special, eos_token_ids=_unique([*self.special.eos_token_ids, *extra]))
        return Tokenizer(self._backend, special, chat_template=self.chat_template, source=self.source)

    # ---- the API the engine and server use ---------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`. Special tokens written in the text (`<|im_start|>`) become their
        ids; `add_special_tokens` adds BOS/EOS where the model asks for them."""
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of `ids`; bytes that do not form whole UTF-8 characters come out as U+FFFD."""
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self._backend.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    @property
    def vocab_size(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def bos_token_id(self) -> int | None:
        return self.special.bos_token_id

    @property
    def eos_token_id(self) -> int | None:
        return self.special.eos_token_id

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.special.eos_token_ids

    @property
    def add_bos(self) -> bool:
        return self.special.add_bos

    @property
    def bos_token(self) -> str | None:
        return self._text_of(self.special.bos_token_id)

    @property
    def eos_token(self) -> str | None:
        return self._text_of(self.special.eos_token_id)

    @property
    def backend(self) -> BackendTokenizer:
        """The underlying `tokenizers.Tokenizer` (read it; do not change it)."""
        return self._backend

    def _text_of(self, token_id: int | None) -> str | None:
        return None if token_id is None else self._backend.id_to_token(token_id)

    def __repr__(self) -> str:
        return f"Tokenizer({self.source!r}, vocab_size={self.vocab_size}, eos={self.eos_token_ids})"


class IncrementalDetokenizer:
    """Streams the text of generated ids: `push` each id, get the text that is now final.

    It decodes a short window of recent ids twice -- up to the last clean point, and up to the
    new id -- and emits the difference. Decoding a window (not each id alone) keeps what decoders
    do across tokens right: one character's bytes split over several byte-level or `<0xXX>`
    tokens, or a SentencePiece decoder that drops the space before the first word. A trailing
    run of U+FFFD is held back, since the next id may complete the character; the text before
    it is final and goes out at once.
    """

    # Prompt ids kept as context, so the first generated token decodes as it would mid-text.
    PROMPT_CONTEXT = 6

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int] = (), *, skip_special_tokens: bool = False):
        self._decode = tokenizer.decode
        self._skip = skip_special_tokens
        self._ids = [int(i) for i in list(prompt_ids)[-self.PROMPT_CONTEXT :]]
        self._prefix = 0  # window start: an id boundary where the text ended cleanly
        self._read = len(self._ids)  # the latest clean boundary: text up to here is emitted
        self._ahead = 0  # characters emitted beyond the text up to `_read`

    def push(self, token_id: int) -> str:
        self._ids.append(int(token_id))
        pending = self._pending_text()
        if pending.endswith(REPLACEMENT_CHAR):  # a character may still be incomplete
            stable = len(pending.rstrip(REPLACEMENT_CHAR))
            if stable <= self._ahead:
                return ""
            out, self._ahead = pending[self._ahead : stable], stable
            return out
        if len(pending) < self._ahead:
            return ""
        out = pending[self._ahead :]
        if not out:  # e.g. a skipped special token: keep the window, so the next word keeps its space
            return ""
        self._prefix, self._read, self._ahead = self._read, len(self._ids), 0
        return out

    def flush(self) -> str:
        """All text not emitted yet (an incomplete character becomes U+FFFD), at the end of a stream."""
        out = self._pending_text()[self._ahead :]
        self._prefix = self._read = len(self._ids)
        self._ahead = 0
        return out

    def _pending_text(self) -> str:
        """Text of the ids after the last clean point, decoded with the window before it as context."""
        window = self._ids[self._prefix :]
        done = self._decode(window[: self._read - self._prefix], self._skip)
        text = self._decode(window, self._skip)
        if text.startswith(done):
            return text[len(done) :]
        # The decoder rewrote text already emitted: byte tokens that only now turn out not to be
        # UTF-8 (ByteFallback then writes U+FFFD for every byte of the run). Emitted text stays;
        # judge the new ids alone.
        return self._decode(self._ids[self._read :], self._skip)


# ---- helpers --------------------------------------------------------------------------------------


def _unique(ids: Iterable[int]) -> tuple[int, ...]:
    return tuple(dict.fromkeys(ids))


def _read_json(path: Path) -> Any:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(path, f"not readable JSON: {error}") from error


def _token_text(value: Any) -> str | None:
    """tokenizer_config.json writes a token as a string or as {"content": ...}."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _add_config_added_tokens(backend: BackendTokenizer, config: Mapping[str, Any]) -> None:
    """tokenizer_config.json's added_tokens_decoder, for tokens tokenizer.json lacks."""
    known = backend.get_added_tokens_decoder()
    for index, entry in sorted((config.get("added_tokens_decoder") or {}).items(), key=lambda kv: int(kv[0])):
        content = _token_text(entry)
        if content is None or int(index) in known or backend.token_to_id(content) != int(index):
            continue  # already there, or would get another id than the config says: leave it
        token = AddedToken(
            content,
            special=bool(entry.get("special", False)),
            normalized=bool(entry.get("normalized", not entry.get("special", False))),
            lstrip=bool(entry.get("lstrip", False)),
            rstrip=bool(entry.get("rstrip", False)),
            single_word=bool(entry.get("single_word", False)),
        )
        (backend.add_special_tokens if token.special else backend.add_tokens)([token])


def _settle_bos_eos(
    backend: BackendTokenizer,
    config: Mapping[str, Any],
    bos: str | None,
    bos_id: int | None,
    eos: str | None,
    eos_id: int | None,
) -> bool:
    """Whether encode adds BOS. tokenizer.json's post-processor decides, unless tokenizer_config.json
    sets add_bos_token / add_eos_token explicitly (as HF's Llama and Gemma tokenizers honour)."""
    adds_bos_now = _post_processor_adds_bos(backend, bos_id)
    want_bos, want_eos = config.get("add_bos_token"), config.get("add_eos_token")
    if want_bos is None and want_eos is None:
        return adds_bos_now
    add_bos = bool(want_bos if want_bos is not None else adds_bos_now) and bos_id is not None
    add_eos = bool(want_eos) and eos_id is not None
    single = " ".join(filter(None, [add_bos and f"{bos}:0", "$A:0", add_eos and f"{eos}:0"]))
    pair = " ".join(filter(None, [single, add_bos and f"{bos}:1", "$B:1", add_eos and f"{eos}:1"]))
    specials = ([(bos, bos_id)] if add_bos else []) + ([(eos, eos_id)] if add_eos else [])
    backend.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)
    return add_bos


def _post_processor_adds_bos(backend: BackendTokenizer, bos_id: int | None) -> bool:
    if bos_id is None:
        return False
    ids = backend.encode("a", add_special_tokens=True).ids
    return bool(ids) and ids[0] == bos_id and backend.encode("a", add_special_tokens=False).ids[:1] != [bos_id]


def _hf_chat_template(folder: Path, config: Mapping[str, Any]) -> str | None:
    """chat_template.jinja, else chat_template.json, else tokenizer_config.json's chat_template
    (a string, or a list of named templates of which "default" is the one to use)."""
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = (_read_json(folder / "chat_template.json") or {}).get("chat_template") or config.get("chat_template")
    if isinstance(template, list):
        named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, Mapping)}
        template = named.get("default")
    return template if isinstance(template, str) else None

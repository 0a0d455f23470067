"""Guided (constrained) decoding: a grammar per choice, turned into an allowed-token bitmask before each step.

`GuidedDecoding` is what a request asks for (part of `SamplingParams`): a JSON object, a JSON schema, a
Lark grammar (llguidance's dialect, where `%json {...}` embeds a schema: tool calling uses that) or a
regex. The grammar library is llguidance: it compiles the grammar once per request, and per step it
computes the mask of tokens that keep the output inside the grammar (tens of microseconds for a 150k
vocabulary) in its native format, a packed int32 bitmask [ceil(V/32)] — which the on-device sampler
unpacks (`ember.compiler.kernels.sampling`). Nothing is ever retried after the fact.

Per engine, `GrammarTokenizer` is llguidance's view of the tokenizer (built once, ~1 s for a 150k
vocabulary). Per choice, `GuidedMatcher` tracks where the output is in the grammar: the engine fills its
row of the step's mask before the step (`fill_masks`) and feeds it the sampled token after (`accept`);
when it is `finished` the choice ends with "stop".
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import llguidance
import llguidance.numpy
import numpy as np

GUIDED_KINDS = ("json_object", "json_schema", "lark", "regex")
# Whitespace JSON output may hold between tokens: one space, or a line break and up to 32 characters of
# indentation (llama.cpp's rule). llguidance's default is unbounded, which lets a model pad forever.
# A schema's own "x-guidance" options override it.
JSON_DEFAULTS = {"whitespace_flexible": True, "whitespace_pattern": r"(?:\x20|\r?\n[\x20\x09]{0,32})"}


@dataclass(frozen=True)
class GuidedDecoding:
    """The grammar a request's output must follow.

    kind: "json_object" (any JSON object; spec unused), "json_schema" (spec: the schema as JSON text),
    "lark" (spec: a llguidance Lark grammar), "regex" (spec: the pattern the whole output must match).
    lenient (json_schema): ignore schema keywords llguidance does not implement instead of refusing them.
    Build it with the class methods; `validate()` raises ValueError naming the field.
    """

    kind: str
    spec: str = ""
    lenient: bool = False

    @classmethod
    def json_object(cls) -> GuidedDecoding:
        return cls("json_object")

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any] | str, *, lenient: bool = False) -> GuidedDecoding:
        # key order is kept: llguidance emits properties in the order the schema lists them
        text = schema if isinstance(schema, str) else json.dumps(schema, ensure_ascii=False)
        return cls("json_schema", text, lenient)

    @classmethod
    def lark(cls, grammar: str) -> GuidedDecoding:
        return cls("lark", grammar)

    @classmethod
    def regex(cls, pattern: str) -> GuidedDecoding:
        return cls("regex", pattern)

    def grammar(self) -> str:
        """llguidance's grammar text for this request (compiled once per distinct spec). Raises ValueError."""
        return _compile(self.kind, self.spec, self.lenient)

    def validate(self) -> None:
        self.grammar()


@functools.lru_cache(maxsize=256)
def _compile(kind: str, spec: str, lenient: bool) -> str:
    if kind not in GUIDED_KINDS:
        raise ValueError(f"guided.kind: must be one of {', '.join(GUIDED_KINDS)}, got {kind!r}")
    if not isinstance(spec, str):
        raise ValueError(f"guided.spec: must be a string, got {type(spec).__name__}")
    if kind in ("json_object", "json_schema"):
        schema: Any = {"type": "object"}
        if kind == "json_schema":
            try:
                schema = json.loads(spec)
            except json.JSONDecodeError as error:
                raise ValueError(f"guided.spec: the schema is not valid JSON: {error}") from None
            if not isinstance(schema, dict):
                raise ValueError(f"guided.spec: a JSON schema must be an object, got {type(schema).__name__}")
        overrides = {"lenient": True} if lenient else None
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_DEFAULTS, overrides=overrides)
    elif kind == "lark":
        grammar = llguidance.LLMatcher.grammar_from_lark(spec)
    else:
        grammar = llguidance.LLMatcher.grammar_from_regex(spec)
    error = llguidance.LLMatcher.validate_grammar(grammar)
    if error:
        raise ValueError(f"guided.spec: invalid {kind.replace('_', ' ')}: {error.strip()}")
    return grammar


class GuidedMatcher:
    """One choice's position in its grammar. Used by the engine thread only."""

    def __init__(self, matcher: llguidance.LLMatcher, n_vocab: int):
        self.matcher = matcher
        self.n_vocab = n_vocab  # llguidance's vocabulary: its masks are ceil(n_vocab / 32) words

    def accept(self, token_id: int) -> str | None:
        """Advance past the sampled token; returns an error message if the grammar refuses it."""
        if self.matcher.consume_token(int(token_id)):
            return None
        return self.matcher.get_error().split("\n", 1)[0] or f"the grammar refused token {token_id}"

    @property
    def finished(self) -> bool:
        """The output is complete: the grammar accepts it and allows nothing more (except EOS)."""
        return self.matcher.is_stopped()

    def copy(self) -> GuidedMatcher:
        return GuidedMatcher(self.matcher.deep_copy(), self.n_vocab)


class GrammarTokenizer:
    """llguidance's view of a tokenizer, for a model whose logits are `vocab_size` wide.

    Ids past the tokenizer's vocabulary (a model's padded embedding rows) are never allowed. Building it
    walks the whole vocabulary (~1 s for 150k tokens): do it once per engine.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int] = ()):
        backend = getattr(tokenizer, "backend", None)
        if backend is None or not hasattr(backend, "to_str"):
            raise ValueError("guided: this model's tokenizer cannot drive a grammar (no tokenizers backend)")
        self.vocab_size = int(vocab_size)
        n_vocab = max(self.vocab_size, int(backend.get_vocab_size(with_added_tokens=True)))
        eos = [int(t) for t in eos_token_ids] or None
        self.lltokenizer = llguidance.LLTokenizer(backend.to_str(), n_vocab=n_vocab, eos_token=eos)

    def matcher(self, guided: GuidedDecoding) -> GuidedMatcher:
        """A fresh matcher for the request's grammar. Raises ValueError for a grammar this tokenizer refuses."""
        matcher = llguidance.LLMatcher(self.lltokenizer, guided.grammar(), log_level=0)
        if matcher.is_error():
            raise ValueError(f"guided.spec: {matcher.get_error().strip()}")
        return GuidedMatcher(matcher, self.lltokenizer.vocab_size)


_executor_lock = threading.Lock()
_executor: llguidance.LLExecutor | None = None


def _shared_executor() -> llguidance.LLExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = llguidance.LLExecutor()  # a thread pool: rows' masks are computed in parallel
        return _executor


def mask_words(vocab_size: int) -> int:
    return (int(vocab_size) + 31) // 32


def fill_masks(rows: Sequence[tuple[GuidedMatcher, int]], out: np.ndarray, vocab_size: int) -> None:
    """Write each (matcher, row) pair's allowed-token bitmask into out[row]; out is int32 [R, ceil(V/32)].

    Rows not listed keep what they hold (all ones: unconstrained). Bits of ids >= vocab_size are cleared.
    """
    if not rows:
        return
    width = mask_words(rows[0][0].n_vocab)
    if out.shape[1] == width and out.flags["C_CONTIGUOUS"]:
        target = out
    else:  # the tokenizer is wider than the model: compute at its width, keep the model's part
        target = np.empty((out.shape[0], width), np.int32)
    llguidance.numpy.fill_next_token_bitmask_par(_shared_executor(), [(m.matcher, r) for m, r in rows], target)
    indices = [r for _, r in rows]
    if target is not out:
        out[indices] = target[indices, : out.shape[1]]
    tail = vocab_size % 32
    if tail:  # the last word's bits past the vocabulary
        out[indices, -1] &= np.int32((1 << tail) - 1)

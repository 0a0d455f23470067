"""Separating a model's reasoning (`<think>...</think>`, Qwen3 / DeepSeek-R1 style) from its answer.

Rules, the same for whole texts (`ReasoningParser.split`) and for streams (`ReasoningStream`),
so a streamed reply equals the non-streamed one however the text is cut into deltas:
- Reasoning starts either because the prompt already opened it (the template ended the prompt
  with `<think>\\n`: `starts_in_reasoning`, see `prompt_opens_reasoning`) or because the output
  begins, after optional whitespace, with `<think>`. Otherwise the whole output is content.
- Reasoning ends at the first `</think>`; with no `</think>` (generation cut off) everything is
  reasoning.
- Reasoning is stripped of surrounding whitespace; content after `</think>` of its leading
  whitespace (the template's "\\n\\n" separator).
Streams hold back text that may be the start of a tag, and whitespace that may turn out to be
trailing, until they know.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

from .text_holdback import partial_tag_length


class _Vocabulary(Protocol):
    def token_to_id(self, token: str) -> int | None: ...


@dataclass(frozen=True)
class ReasoningSplit:
    reasoning: str
    content: str

    def __add__(self, other: ReasoningSplit) -> ReasoningSplit:
        return ReasoningSplit(self.reasoning + other.reasoning, self.content + other.content)


EMPTY = ReasoningSplit("", "")


@dataclass(frozen=True)
class ReasoningParser:
    """How one model marks reasoning. Make one per model, then `split` or `stream()` per choice."""

    start_tag: str = "<think>"
    end_tag: str = "</think>"
    starts_in_reasoning: bool = False

    @classmethod
    def for_tokenizer(cls, tokenizer: _Vocabulary) -> ReasoningParser | None:
        """A parser when the vocabulary has both think tokens (so the model was trained to reason
        with them), else None: text of other models is never split."""
        if tokenizer.token_to_id(cls.start_tag) is None or tokenizer.token_to_id(cls.end_tag) is None:
            return None
        return cls()

    def for_prompt(self, prompt: str) -> ReasoningParser:
        """This parser, told whether the rendered `prompt` already opened the reasoning block."""
        return replace(self, starts_in_reasoning=prompt_opens_reasoning(prompt, self.start_tag))

    def split(self, text: str) -> ReasoningSplit:
        """Reasoning and content of a whole reply."""
        if not self.starts_in_reasoning:
            body = text.lstrip()
            if not body.startswith(self.start_tag):
                return ReasoningSplit("", text)
            text = body[len(self.start_tag) :]
        end = text.find(self.end_tag)
        if end < 0:
            return ReasoningSplit(text.strip(), "")
        return ReasoningSplit(text[:end].strip(), text[end + len(self.end_tag) :].lstrip())

    def stream(self) -> ReasoningStream:
        """A fresh streaming splitter (one per choice)."""
        return ReasoningStream(self)


def prompt_opens_reasoning(prompt: str, start_tag: str = "<think>") -> bool:
    """Whether the rendered prompt ends inside an open reasoning block, e.g. `...assistant\\n<think>\\n`
    (Qwen3 templates with thinking on, DeepSeek-R1). A closed empty block (`<think>\\n\\n</think>`,
    thinking switched off) does not count."""
    return prompt.rstrip().endswith(start_tag)


def prompt_closes_reasoning(prompt: str, end_tag: str = "</think>") -> bool:
    """Whether the rendered prompt ends right after a reasoning block the template wrote itself, e.g.
    `...assistant\n<think>\n\n</think>\n\n` (Qwen3 / Qwen3.5 with thinking switched off): the answer
    follows, so no reasoning block is expected in the output."""
    return prompt.rstrip().endswith(end_tag)


class ReasoningStream:
    """Feed text deltas of one choice; get (reasoning, content) deltas back."""

    _BEFORE, _REASONING, _CONTENT = "before", "reasoning", "content"

    def __init__(self, parser: ReasoningParser):
        self._start, self._end = parser.start_tag, parser.end_tag
        self._state = self._REASONING if parser.starts_in_reasoning else self._BEFORE
        self._buffer = ""  # text received and not yet emitted
        self._reasoning_started = False  # leading whitespace of reasoning is dropped until then
        self._content_started = False  # likewise for content after the end tag

    @property
    def in_reasoning(self) -> bool:
        return self._state == self._REASONING

    def feed(self, delta: str) -> ReasoningSplit:
        self._buffer += delta
        out = EMPTY
        while True:
            if self._state == self._BEFORE:
                body = self._buffer.lstrip()
                if body.startswith(self._start):
                    self._state, self._buffer = self._REASONING, body[len(self._start) :]
                elif self._start.startswith(body):
                    return out  # only whitespace or a part of the start tag so far
                else:
                    self._state = self._CONTENT
                    self._content_started = True  # no reasoning: the text is content as it is
            elif self._state == self._REASONING:
                end = self._buffer.find(self._end)
                if end >= 0:
                    out += ReasoningSplit(self._reasoning_text(self._buffer[:end].rstrip()), "")
                    self._state, self._buffer = self._CONTENT, self._buffer[end + len(self._end) :]
                    continue
                held = len(self._buffer) - partial_tag_length(self._buffer, self._end)
                ready = self._buffer[:held].rstrip()  # trailing whitespace may precede the end tag
                out += ReasoningSplit(self._reasoning_text(ready), "")
                self._buffer = self._buffer[len(ready) :]
                return out
            else:
                text = self._buffer
                if not self._content_started:
                    text = text.lstrip()
                    self._content_started = bool(text)
                self._buffer = ""
                return out + ReasoningSplit("", text)

    def finish(self) -> ReasoningSplit:
        """Flush held text at the end of generation."""
        text, self._buffer = self._buffer, ""
        if self._state == self._BEFORE:
            return ReasoningSplit("", text)  # never became reasoning: what was held is content
        if self._state == self._REASONING:
            return ReasoningSplit(self._reasoning_text(text.rstrip()), "")
        return EMPTY  # content is never held back

    def _reasoning_text(self, text: str) -> str:
        if not self._reasoning_started:
            text = text.lstrip()
            self._reasoning_started = bool(text)
        return text

"""Turns one sequence's sampled token ids into what a client streams: text deltas, stop and length endings.

The engine thread calls `OutputProcessor.push` once per sampled token and streams the `Delta` it returns;
`finish` ends a sequence from outside (the engine's own length limit, an abort). Semantics follow vLLM:

- An EOS id stops unless `ignore_eos`; a `stop_token_ids` id always stops. The stop token's text is not
  part of the output (stop_reason: the id, or None for EOS), but the id is (it was generated: it counts
  against max_tokens and usage, and its logprob is reported).
- A stop string ends generation at the first point of the text where one is complete (the earliest end;
  among stop strings completed at the same character, the longest, i.e. the one starting first). The text
  is cut right before it, or right after it with `include_stop_str_in_output`.
- A stop string never reaches a stream, not even in part: text that ends with a proper prefix of a stop
  string is held back until the next tokens show whether the stop string completes. Token ids (and their
  logprobs) are held with their text, so a client never sees a token before the text it ends with.
- Before `min_tokens` tokens were generated, stop ids do not stop (the sampler suppresses them, see
  `suppressed_token_ids`) and stop strings are not looked for; the first token that may stop is number
  min_tokens + 1, and a stop string must end in the text of such a token.
- The token that brings the count to `max_tokens` ends with "length" (unless it stops the sequence).

Concatenating every delta's text gives exactly `tokenizer.decode(generated ids without the stop token,
skip_special_tokens)` cut at the stop string (the incremental text comes from `IncrementalDetokenizer`,
which never emits half a UTF-8 character). Finding stop strings looks only at the new text plus the last
max(len(stop)) - 1 characters before it, so a step costs O(new text + longest stop string), not O(output).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from ember.runtime.loading.text.tokenizer import IncrementalDetokenizer, Tokenizer

FINISH_STOP, FINISH_LENGTH, FINISH_ABORT = "stop", "length", "abort"


@dataclass(frozen=True)
class Delta:
    """What one step adds to one sequence's output."""

    text: str  # newly final text (may be "")
    token_ids: tuple[int, ...]  # the ids whose text is now emitted (all the rest, in a final delta)
    logprobs: tuple[Any, ...] | None  # the sampler's objects for `token_ids`, aligned; None if none were given
    finish_reason: str | None  # None, "stop" (eos / stop token / stop string), "length", "abort"
    stop_reason: str | int | None  # the matched stop string or stop token id; None otherwise (and for EOS)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


def merge_deltas(deltas: list[Delta]) -> Delta:
    """Several consecutive deltas of one sequence as one (the last may finish it)."""
    if len(deltas) == 1:
        return deltas[0]
    logprobs = [lp for d in deltas if d.logprobs is not None for lp in d.logprobs]
    last = deltas[-1]
    return Delta(
        "".join(d.text for d in deltas),
        tuple(t for d in deltas for t in d.token_ids),
        tuple(logprobs) if any(d.logprobs is not None for d in deltas) else None,
        last.finish_reason,
        last.stop_reason,
    )


@dataclass(frozen=True)
class _StopMatch:
    start: int  # where the stop string starts, in the coordinates of the searched text
    end: int
    stop: str


class OutputProcessor:
    """The output of one sequence: push each sampled id, stream the deltas, read the totals at the end."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_ids: Sequence[int],
        *,
        stop: Sequence[str] = (),
        stop_token_ids: Collection[int] = (),
        eos_token_ids: Collection[int] = (),
        ignore_eos: bool = False,
        min_tokens: int = 0,
        max_tokens: int,
        include_stop_str_in_output: bool = False,
        skip_special_tokens: bool = True,
    ):
        if isinstance(stop, str):
            stop = (stop,)  # one stop string, not one per character
        if any(not isinstance(s, str) or not s for s in stop):
            raise ValueError(f"stop strings must be non-empty strings, got {list(stop)!r}")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if not 0 <= min_tokens <= max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens={max_tokens}], got {min_tokens}")
        self._stops = tuple(dict.fromkeys(stop))
        self._stop_token_ids = frozenset(int(t) for t in stop_token_ids)
        self._eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self._ignore_eos = ignore_eos
        self._min_tokens, self._max_tokens = min_tokens, max_tokens
        self._include_stop = include_stop_str_in_output
        # While fewer than min_tokens were generated the sampler must not pick these (vLLM's order: stop ids, eos).
        self._suppressed = tuple(
            dict.fromkeys([*(int(t) for t in stop_token_ids), *(() if ignore_eos else (int(t) for t in eos_token_ids))])
        )
        self._detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids, skip_special_tokens=skip_special_tokens)

        longest = max((len(s) for s in self._stops), default=0)
        self._context = max(longest - 1, 0)  # characters before the new text a stop string may start in
        # Every proper prefix of a stop string: an output ending with one is held back. Not needed when the
        # stop string goes out anyway (include_stop_str_in_output): then nothing is ever held.
        self._stop_prefixes = (
            frozenset() if self._include_stop else frozenset(s[:k] for s in self._stops for k in range(1, len(s)))
        )

        self._output_ids: list[int] = []
        self._emitted_parts: list[str] = []
        self._emitted_chars = 0
        self._seen_chars = 0  # text the detokenizer gave (stop token text excluded), emitted or held
        self._seen_tail = ""  # its last `_context` characters: where a stop string may begin
        self._held = ""  # seen, not emitted: a suffix that is a proper prefix of a stop string
        # Ids not emitted yet, with their logprob and the text length once they were decoded: an id goes out
        # when the text up to that length has gone out (so never before the text it ends with).
        self._unreleased: deque[tuple[int, Any, int]] = deque()
        self._textless: list[tuple[int, Any]] = []  # the latest ids, which have not given any text yet
        self._finish_reason: str | None = None
        self._stop_reason: str | int | None = None

    # ---- the engine's calls ---------------------------------------------------------------------

    def push(self, token_id: int, logprob: Any = None) -> Delta:
        """Take one sampled token; return the text (and ids) that became final with it."""
        if self.done:
            raise RuntimeError(f"push after the sequence finished ({self._finish_reason})")
        token_id = int(token_id)
        self._output_ids.append(token_id)
        generated = len(self._output_ids)
        may_stop = generated > self._min_tokens  # this token is number min_tokens + 1 or later
        if may_stop and self._is_stop_token(token_id):
            # The stop token's text is not output; the text before it is now complete, incomplete bytes and all.
            # That text is the previous token's, so it may end a stop string only if that token could stop.
            self._textless.append((token_id, logprob))
            reason = token_id if token_id in self._stop_token_ids else None
            return self._final_delta(self._detokenizer.flush(), generated - 1 > self._min_tokens, FINISH_STOP, reason)
        new_text = self._detokenizer.push(token_id)
        self._textless.append((token_id, logprob))
        if new_text:  # ids that gave no text yet (bytes of a character) go out with the text that completes them
            end = self._seen_chars + len(new_text)
            self._unreleased.extend((t, lp, end) for t, lp in self._textless)
            self._textless.clear()
        if generated >= self._max_tokens:
            return self._final_delta(new_text + self._detokenizer.flush(), may_stop, FINISH_LENGTH, None)
        match = self._find_stop(new_text) if may_stop else None
        if match is not None:
            return self._stop_string_delta(new_text, match)
        return self._streaming_delta(new_text)

    def finish(self, reason: str) -> Delta:
        """End the sequence from outside. "length" (the engine's own limit, e.g. the context length): the
        held text is final now and goes out (a stop string completed by the last incomplete character still
        stops it). "abort": no more text goes out -- what was final has been streamed already, and held text
        is a possible start of a stop string or half a character. Either way the remaining ids go out.
        "stop" (a grammar the output follows is complete): as "length", with finish reason "stop"."""
        if reason not in (FINISH_LENGTH, FINISH_ABORT, FINISH_STOP):
            raise ValueError(
                f"finish reason must be {FINISH_LENGTH!r}, {FINISH_ABORT!r} or {FINISH_STOP!r}, got {reason!r}"
            )
        if self.done:
            raise RuntimeError(f"finish({reason!r}) after the sequence finished ({self._finish_reason})")
        if reason == FINISH_ABORT:
            self._held = ""
            return self._close("", FINISH_ABORT, None)
        may_stop = len(self._output_ids) > self._min_tokens
        return self._final_delta(self._detokenizer.flush(), may_stop, reason, None)

    def suppressed_token_ids(self) -> tuple[int, ...]:
        """Ids the sampler must forbid for the next token: stop ids and eos (unless ignore_eos) while fewer
        than min_tokens tokens were generated, else none."""
        return self._suppressed if len(self._output_ids) < self._min_tokens else ()

    # ---- what the caller reads ------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return self._finish_reason is not None

    @property
    def finish_reason(self) -> str | None:
        return self._finish_reason

    @property
    def stop_reason(self) -> str | int | None:
        return self._stop_reason

    @property
    def text(self) -> str:
        """All text emitted so far (the whole output once done)."""
        if len(self._emitted_parts) > 1:
            self._emitted_parts[:] = ["".join(self._emitted_parts)]
        return self._emitted_parts[0] if self._emitted_parts else ""

    @property
    def output_token_ids(self) -> tuple[int, ...]:
        """Every id pushed, the stop token included (it was generated: usage counts it)."""
        return tuple(self._output_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self._output_ids)

    # ---- internals ------------------------------------------------------------------------------

    def _is_stop_token(self, token_id: int) -> bool:
        return token_id in self._stop_token_ids or (not self._ignore_eos and token_id in self._eos_token_ids)

    def _find_stop(self, new_text: str) -> _StopMatch | None:
        """The stop string that completes earliest inside `new_text`, searched in the seen tail + new text
        (coordinates of that concatenation). A match must end in the new text: one that ended before was
        looked for then (or fell before min_tokens, where vLLM does not look either)."""
        if not self._stops or not new_text:
            return None
        window = self._seen_tail + new_text
        before = len(self._seen_tail)
        best: _StopMatch | None = None
        for stop in self._stops:
            start = window.find(stop, max(0, before - len(stop) + 1))
            if start < 0:
                continue
            end = start + len(stop)
            if best is None or (end, start) < (best.end, best.start):
                best = _StopMatch(start, end, stop)
        return best

    def _stop_string_delta(self, new_text: str, match: _StopMatch) -> Delta:
        """Cut the text at the stop string and end the sequence."""
        pending = self._held + new_text  # a suffix of `window`, which begins len(window) - len(pending) earlier
        offset = len(self._seen_tail) + len(new_text) - len(pending)
        cut = (match.end if self._include_stop else match.start) - offset
        # Held text always covers any start of a stop string (that is why it is held), so the cut is never
        # inside text already emitted.
        assert cut >= 0, (match, offset)
        self._held = ""
        return self._close(pending[:cut], FINISH_STOP, match.stop)

    def _streaming_delta(self, new_text: str) -> Delta:
        """Emit the new text except a suffix that may be the start of a stop string."""
        pending = self._held + new_text
        hold = self._held_suffix_length(pending)
        out, self._held = pending[: len(pending) - hold], pending[len(pending) - hold :]
        self._see(new_text)
        self._emit(out)
        return Delta(out, *self._release(everything=False), None, None)

    def _final_delta(self, new_text: str, may_stop: bool, reason: str, stop_reason: str | int | None) -> Delta:
        """The last text: cut at a stop string if it completes one, else all of it, held text included."""
        match = self._find_stop(new_text) if may_stop else None
        if match is not None:
            return self._stop_string_delta(new_text, match)
        out, self._held = self._held + new_text, ""
        return self._close(out, reason, stop_reason)

    def _close(self, out: str, reason: str, stop_reason: str | int | None) -> Delta:
        self._emit(out)
        self._finish_reason, self._stop_reason = reason, stop_reason
        return Delta(out, *self._release(everything=True), reason, stop_reason)

    def _held_suffix_length(self, pending: str) -> int:
        """Length of the longest suffix of `pending` that is a proper prefix of a stop string."""
        if not self._stop_prefixes:
            return 0
        for length in range(min(self._context, len(pending)), 0, -1):
            if pending[-length:] in self._stop_prefixes:
                return length
        return 0

    def _see(self, new_text: str) -> None:
        self._seen_chars += len(new_text)
        if self._context:
            self._seen_tail = (self._seen_tail + new_text)[-self._context :]

    def _emit(self, out: str) -> None:
        if out:
            self._emitted_parts.append(out)
            self._emitted_chars += len(out)

    def _release(self, *, everything: bool) -> tuple[tuple[int, ...], tuple[Any, ...] | None]:
        """Ids (and logprobs) whose text has been emitted; all of them when the sequence ends."""
        ids, logprobs = [], []
        while self._unreleased and (everything or self._unreleased[0][2] <= self._emitted_chars):
            token_id, logprob, _ = self._unreleased.popleft()
            ids.append(token_id)
            logprobs.append(logprob)
        if everything:
            ids.extend(t for t, _ in self._textless)
            logprobs.extend(lp for _, lp in self._textless)
            self._textless.clear()
        has_logprobs = any(lp is not None for lp in logprobs)
        return tuple(ids), (tuple(logprobs) if has_logprobs else None)

"""Prompt lookup (n-gram) drafting, and OpenAI Predicted Outputs as a draft source: no weights, numpy only.

Prompt lookup: the sequence's last n tokens (n from max_match down to min_match) are searched for earlier in
its prompt + output; the tokens that followed the match are the draft. Input-grounded work (code editing,
summaries quoting their source, answers that repeat the question) copies long runs, which this catches.
Of the candidates, the longest match wins, and among those the most recent (later text is likelier what is
being copied now).

Predicted Outputs (`prediction: {"type": "content", "content": ...}`): the request says what it expects the
output to be, usually the file being edited. While the output so far is a prefix of the prediction, the draft
is the prediction's next tokens. Once they diverge (the model changed something), the output's last tokens are
looked up in the prediction (as above) and the draft resumes after the match; among equally long matches the
one nearest the output's own position wins, since an edit shifts the text by a little, not a lot. When the
prediction gives nothing, prompt lookup runs as usual.

Cost: one vectorised pass over the searched tokens for the candidates ending in the last token, then at most
max_match comparisons per candidate; no per-request state.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ember.runtime.speculative.drafter import Draft, DraftContext


@dataclass(frozen=True)
class NgramConfig:
    min_match: int = 2  # shortest suffix n-gram that may select a continuation
    max_match: int = 4  # longest suffix n-gram compared (longer matches are treated as this long)
    max_drafts: int = 8  # cap on k, whatever the caller asks for
    use_prediction: bool = True  # draft from the request's Predicted Output when it has one

    def __post_init__(self) -> None:
        if not 1 <= self.min_match <= self.max_match:
            raise ValueError(f"need 1 <= min_match <= max_match, got {self.min_match} and {self.max_match}")
        if self.max_drafts < 0:
            raise ValueError(f"max_drafts must be >= 0, got {self.max_drafts}")


def match_lengths(corpus: np.ndarray, ends: np.ndarray, tail: np.ndarray, limit: int) -> np.ndarray:
    """For each end index e of corpus, how many trailing tokens of corpus[: e + 1] equal those of tail (<= limit)."""
    lengths = np.zeros(len(ends), dtype=np.int64)
    alive = np.ones(len(ends), dtype=bool)
    for j in range(min(limit, len(tail))):
        position = ends - j
        ok = alive & (position >= 0)
        ok[ok] = corpus[position[ok]] == tail[len(tail) - 1 - j]
        lengths += ok
        alive = ok
        if not alive.any():
            break
    return lengths


def lookup_continuation(
    corpus: np.ndarray, tail: np.ndarray, config: NgramConfig, k: int, *, prefer_near: int | None = None
) -> np.ndarray:
    """Up to k tokens that follow the best earlier match of tail's last tokens in corpus (i64 [<= k]).

    A match may end anywhere before corpus's last index (so at least one token follows it); when corpus is
    tail itself, that excludes the trivial match of the suffix with itself. Best = longest (>= min_match),
    then most recent, or with prefer_near the one whose next token is nearest that index.
    """
    if k <= 0 or len(tail) < config.min_match or len(corpus) < 2:
        return np.zeros(0, dtype=np.int64)
    ends = np.flatnonzero(corpus[:-1] == tail[-1])
    if len(ends) == 0:
        return np.zeros(0, dtype=np.int64)
    lengths = match_lengths(corpus, ends, tail, config.max_match)
    best = lengths.max()
    if best < config.min_match:
        return np.zeros(0, dtype=np.int64)
    chosen = ends[lengths == best]
    if prefer_near is None:
        end = chosen[-1]
    else:
        end = chosen[np.argmin(np.abs(chosen + 1 - prefer_near))]  # argmin: the earlier one on a tie
    return corpus[end + 1 : end + 1 + k]


def prediction_continuation(context: DraftContext, config: NgramConfig, k: int) -> np.ndarray:
    """The next k tokens of the request's prediction, aligned with what it has emitted (i64 [<= k])."""
    prediction = np.asarray(context.prediction_ids, dtype=np.int64)
    output = np.asarray(context.output_ids, dtype=np.int64)
    emitted = len(output)
    if emitted < len(prediction) and np.array_equal(prediction[:emitted], output):
        return prediction[emitted : emitted + k]
    # diverged: realign on the last tokens of the sequence (the prompt's tail counts while the output is short)
    return lookup_continuation(prediction, context.tokens, config, k, prefer_near=emitted)


class NgramDrafter:
    """Drafts by prompt lookup, or from the request's Predicted Output first when it carries one."""

    def __init__(self, config: NgramConfig | None = None) -> None:
        self.config = config or NgramConfig()

    def propose(self, context: DraftContext, k: int) -> Draft:
        k = min(k, self.config.max_drafts)
        if k <= 0:
            return Draft()
        if self.config.use_prediction and len(context.prediction_ids) > 0:
            predicted = prediction_continuation(context, self.config, k)
            if len(predicted) > 0:
                return Draft(tuple(int(t) for t in predicted))
        tokens = context.tokens
        return Draft(tuple(int(t) for t in lookup_continuation(tokens, tokens, self.config, k)))

    def release(self, request_id: str) -> None:
        return None  # stateless

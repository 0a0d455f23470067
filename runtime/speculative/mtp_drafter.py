"""The `mtp` drafter: the target checkpoint's own multi-token-prediction module, run k times autoregressively
(docs/speculative.md, "The MTP drafter").

For a sequence t_0 .. t_{n-1} (t_{n-1}: the last token the target emitted, not yet computed by it) the MTP
needs the target's final-norm hidden states h_0 .. h_{n-2}. MTP position p takes (h_p, t_{p+1}); position
n - 2 gives d_0, then position n - 2 + i takes (the MTP's own hidden state of the step before, d_{i-1}) and
gives d_i. Per request the drafter keeps an `MtpSequence` (its MTP cache) and the tokens its positions were
computed from; shown a context again it keeps the positions whose inputs are unchanged (the target's hidden
states of accepted tokens do not change) and recomputes the rest, so draft positions never outlive a step.

Hidden states come from a `TargetHiddenStates` source. In the engine it is `StepHiddenStates`
(step_hidden_states.py): the states the engine's own steps returned beside their logits, no target pass of
its own. Without an engine, `RecomputedHiddenStates` runs the target's plan with its head swapped for the
identity over the whole sequence, and `IncrementalHiddenStates` keeps that pass per request and runs only the
new tokens (exact, but an extra target forward per token: the offline acceptance replay).

A row the engine shows with its sampling state (`DraftContext.row`, a sampled request) is drafted as it samples:
each draft drawn from q = the MTP's logits through the request's pipeline at the draft's step and seed
(`row_draws.draw_as_row`), q handed to the verifier. Otherwise drafts are greedy point masses (probs None), or,
with the drafter's own `temperature` (the offline tools), samples from the MTP's softmax with those rows as probs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ..execution.hidden_states import Embedder, hidden_state_model
from ..execution.sequence_runner import SequenceRunner
from ..loading.model import Model
from .drafter import Draft, DraftContext
from .mtp_forward import MtpSequence
from .row_draws import draw_as_row, samples

# (request_id, tokens) -> float32 [len(tokens), d]: the target's final-norm hidden state at each token
TargetHiddenStates = Callable[[str, Sequence[int]], np.ndarray]


class RecomputedHiddenStates:
    """A TargetHiddenStates that runs the target over the tokens (the reference source, no engine needed)."""

    def __init__(self, model: Model, embedder: Embedder | None = None):
        self.embedder = embedder or Embedder(model)  # one Embedder: one compiled hidden-state plan

    def __call__(self, request_id: str, tokens: Sequence[int]) -> np.ndarray:
        return self.embedder.hidden_states([int(t) for t in tokens])


class IncrementalHiddenStates:
    """A TargetHiddenStates that keeps, per request, the target's hidden-state pass over the tokens it was asked
    for and runs only the new ones (one extra target forward per accepted token, not per proposal). The tokens
    asked for are the request's emitted ones, which never change, so its state only moves forward; a request
    whose tokens do differ (a reused id) starts again. `release` drops a request."""

    def __init__(self, model: Model, embedder: Embedder | None = None, max_model_len: int = 4096):
        # an Embedder's hidden-state model when given: its compiled steps are shared
        self.model = embedder.model if embedder is not None else hidden_state_model(model)
        self.max_model_len = max_model_len
        self.runs: dict[str, tuple[SequenceRunner, list[int], list[np.ndarray]]] = {}

    def __call__(self, request_id: str, tokens: Sequence[int]) -> np.ndarray:
        tokens = [int(t) for t in tokens]
        run = self.runs.get(request_id)
        if run is None or run[1] != tokens[: len(run[1])]:
            run = self.runs[request_id] = (SequenceRunner(self.model, self.max_model_len), [], [])
        runner, done, hidden = run
        if len(tokens) > len(done):
            hidden.append(np.asarray(runner.prefill(tokens[len(done) :], all_logits=True), np.float32))
            done.extend(tokens[len(done) :])
        return np.concatenate(hidden)[: len(tokens)]

    def release(self, request_id: str) -> None:
        self.runs.pop(request_id, None)


@dataclass
class _Sequence:
    cache: MtpSequence
    inputs: list[int] = field(default_factory=list)  # the tokens t_0 .. t_m its positions 0 .. m - 1 read


class MtpDrafter:
    def __init__(
        self,
        model: Model,
        hidden_states: TargetHiddenStates | None = None,
        *,
        max_model_len: int = 4096,
        temperature: float = 0.0,
        seed: int = 0,
    ):
        if not model.has_mtp:
            raise ValueError(f"--speculative mtp: {model.checkpoint.path} carries no MTP module")
        self.model = model
        self.hidden_states = hidden_states or RecomputedHiddenStates(model)
        self.max_model_len = max_model_len
        self.temperature = temperature
        self.rng = np.random.default_rng(seed)
        self.sequences: dict[str, _Sequence] = {}

    def propose(self, context: DraftContext, k: int) -> Draft:
        tokens = [int(t) for t in context.tokens]
        n = len(tokens)
        if k <= 0 or n < 2 or n - 1 + k > self.max_model_len:
            return Draft()
        seq = self.sequences.get(context.request_id)
        if seq is None:
            seq = self.sequences[context.request_id] = _Sequence(MtpSequence(self.model, self.max_model_len))
        keep = self._kept_positions(seq, tokens)
        # positions keep .. n - 2 from the target's hidden states; the last one's logits give d_0
        hidden = self.hidden_states(context.request_id, tokens[: n - 1])[keep:]
        logits, out = seq.cache.run(tokens[keep + 1 : n], keep, hidden)
        seq.inputs = tokens[:n]
        drafts, probs = [], []
        row, sampled = context.row, samples(context.row)
        for i in range(k):
            if sampled:  # as the request samples, at its step + i (seeded by it: reproducible)
                at = replace(row, output_ids=(*row.output_ids, *drafts), step=row.token_index + i)
                token, q = draw_as_row(logits[-1], at)
            else:
                token, q = self._pick(logits[-1])
            drafts.append(token)
            probs.append(q)
            if i + 1 < k:  # position n - 1 + i reads (the MTP's hidden state of the step before, the draft)
                logits, out = seq.cache.run([token], n - 1 + i, out[-1:])
        return Draft(tuple(drafts), np.stack(probs) if sampled or self.temperature != 0 else None)

    def release(self, request_id: str) -> None:
        self.sequences.pop(request_id, None)
        release = getattr(self.hidden_states, "release", None)
        if release is not None:
            release(request_id)

    @staticmethod
    def _kept_positions(seq: _Sequence, tokens: list[int]) -> int:
        """MTP positions still valid: position p read t_0 .. t_{p+1}, so it stands while those are unchanged;
        at least the last position (n - 2) is recomputed (it gives d_0; its predecessor may have been a draft)."""
        same = 0
        limit = min(len(seq.inputs), len(tokens))
        while same < limit and seq.inputs[same] == tokens[same]:
            same += 1
        return max(0, min(same - 1, len(tokens) - 2))

    def _pick(self, logits: np.ndarray) -> tuple[int, np.ndarray | None]:
        if self.temperature == 0:
            return int(np.argmax(logits)), None
        z = logits.astype(np.float64) / self.temperature
        q = np.exp(z - z.max())
        q /= q.sum()
        return int(self.rng.choice(len(q), p=q)), q.astype(np.float32)

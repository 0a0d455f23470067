"""Acceptance statistics of speculative decoding, counted as vLLM's spec-decode metrics are.

Per verify step of a row that drafted (n >= 1 tokens proposed, a of them accepted): one draft, n draft tokens,
a accepted tokens, and accepted_per_position[i] += 1 for i < a. Steps without a draft decode one token plainly
and count only as steps. The engine's metrics (`ember:spec_decode_*`) and the offline measurement
(tools/dev/spec_acceptance.py) both fill one of these.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class AcceptanceStats:
    steps: int = 0  # verify steps, drafted or not
    emitted_tokens: int = 0  # tokens those steps emitted (accepted + 1 each)
    num_drafts: int = 0  # steps that drafted at least one token
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    drafted_per_position: list[int] = field(default_factory=list)  # [i]: drafts with more than i tokens
    accepted_per_position: list[int] = field(default_factory=list)  # [i]: drafts whose first i + 1 were accepted
    reached_per_position: list[int] = field(default_factory=list)  # [i]: drafts with a token i and 0..i-1 accepted

    def record(self, num_drafted: int, num_accepted: int) -> None:
        if not 0 <= num_accepted <= num_drafted:
            raise ValueError(f"accepted {num_accepted} of {num_drafted} drafted tokens")
        self.steps += 1
        self.emitted_tokens += num_accepted + 1
        if num_drafted == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_drafted
        self.num_accepted_tokens += num_accepted
        reached = min(num_accepted + 1, num_drafted)
        for counts, upto in (
            (self.drafted_per_position, num_drafted),
            (self.accepted_per_position, num_accepted),
            (self.reached_per_position, reached),
        ):
            counts.extend([0] * (upto - len(counts)))
            for i in range(upto):
                counts[i] += 1

    def merge(self, other: AcceptanceStats) -> None:
        for name in ("steps", "emitted_tokens", "num_drafts", "num_draft_tokens", "num_accepted_tokens"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("drafted_per_position", "accepted_per_position", "reached_per_position"):
            mine, theirs = getattr(self, name), getattr(other, name)
            mine.extend([0] * (len(theirs) - len(mine)))
            for i, count in enumerate(theirs):
                mine[i] += count

    @property
    def mean_tokens_per_step(self) -> float:
        """Tokens per verify step (1 = no gain): the upper bound of the speedup if a verify cost a decode."""
        return self.emitted_tokens / self.steps if self.steps else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Accepted + 1 per step that drafted (vLLM's "mean acceptance length")."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0

    @property
    def draft_acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    def acceptance_rate_per_position(self) -> list[float]:
        """[i]: P(draft token i is accepted | it was drafted and every token before it was accepted)."""
        accepted = self.accepted_per_position + [0] * (len(self.reached_per_position) - len(self.accepted_per_position))
        return [a / r if r else 0.0 for a, r in zip(accepted, self.reached_per_position)]

    def to_dict(self) -> dict:
        return {
            "steps": self.steps,
            "emitted_tokens": self.emitted_tokens,
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "drafted_per_position": list(self.drafted_per_position),
            "accepted_per_position": list(self.accepted_per_position),
            "reached_per_position": list(self.reached_per_position),
            "mean_tokens_per_step": round(self.mean_tokens_per_step, 4),
            "mean_acceptance_length": round(self.mean_acceptance_length, 4),
            "draft_acceptance_rate": round(self.draft_acceptance_rate, 4),
            "acceptance_rate_per_position": [round(r, 4) for r in self.acceptance_rate_per_position()],
        }
